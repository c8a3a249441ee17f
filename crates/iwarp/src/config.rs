//! Provider configuration (from code or the environment).

/// Provider configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Largest ULPDU (DDP segment incl. header) per FPDU; the connection's TCP MSS lowers it
    /// so that an FPDU fits one segment (RFC 5044 §5: MULPDU from the EMSS).
    pub max_ulpdu: usize,
    /// Largest IRD/ORD a QP accepts (device limit, `max_qp_rd_atom`).
    pub max_ird: u16,
    /// SMC-R link mode (see [`crate::smclink`]): each device listens on `local_ip:ephemeral`
    /// for the MPA connections of SMC-R links, advertises that port in its MAC, and
    /// `modify_to_rtr` connects a QP to the peer QP named by the RTR attributes.
    pub smc_links: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_ulpdu: 65_532,
            max_ird: 128,
            smc_links: false,
        }
    }
}

/// Environment variable: largest ULPDU per FPDU (bytes).
pub const ENV_MAX_ULPDU: &str = "SMC_RS_IWARP_MAX_ULPDU";

impl Config {
    /// Reads `SMC_RS_IWARP_MAX_ULPDU`; malformed values are logged and ignored.
    pub fn from_env() -> Config {
        let mut c = Config::default();
        if let Some(v) = smc_verbs::process::config_var(ENV_MAX_ULPDU) {
            match v.trim().parse::<usize>() {
                Ok(n) if (64..=65_532).contains(&n) => c.max_ulpdu = n,
                _ => tracing::warn!(value = %v, "ignoring malformed {ENV_MAX_ULPDU}"),
            }
        }
        c
    }
}
