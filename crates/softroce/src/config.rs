//! Provider configuration (programmatic or from the environment).

use smc_verbs::Mtu;

/// Configuration of a [`crate::SoftRoce`] provider and the devices it opens.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// UDP port to bind locally (default 4791, the RoCEv2 port).
    pub udp_port: Option<u16>,
    /// Destination UDP port of the peers (default 4791; tests only).
    pub peer_port: Option<u16>,
    /// Path MTU cap (default: from the netdev MTU, at most 4096).
    pub max_mtu: Option<Mtu>,
    /// Deterministic seeded fault injector on the send path.
    pub faults: Option<FaultConfig>,
    /// UDP GSO for trains of packets and UDP GRO on receive (IPv4 only,
    /// where the kernel has them). `None`: [`ENV_GSO`], else on. A capture
    /// taken before the kernel segments (on lo, on a veth or bridge) then
    /// shows GSO super-packets; `Some(false)` (`SMC_RS_SOFTROCE_GSO=0`)
    /// puts every packet in a datagram of its own.
    pub gso: Option<bool>,
}

/// Seeded, deterministic fault injection applied to every packet a device
/// sends: each packet is independently dropped, held back behind the next
/// one (reordered) or sent twice (duplicated) with the given probabilities.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultConfig {
    /// RNG seed; the same seed and traffic give the same faults per QP.
    pub seed: u64,
    /// Probability of dropping a packet (0.0..=1.0).
    pub loss: f64,
    /// Probability of delaying a packet behind the next one.
    pub reorder: f64,
    /// Probability of sending a packet twice.
    pub duplicate: f64,
}

/// Environment variable holding the fault injector settings
/// (`seed=1,loss=0.05,reorder=0.02,dup=0.01`).
pub const ENV_FAULTS: &str = "SMC_RS_SOFTROCE_FAULTS";
/// Environment variable: local UDP port.
pub const ENV_PORT: &str = "SMC_RS_SOFTROCE_PORT";
/// Environment variable: peer UDP port.
pub const ENV_PEER_PORT: &str = "SMC_RS_SOFTROCE_PEER_PORT";
/// Environment variable: `0` turns UDP GSO/GRO off (one datagram per
/// packet, e.g. for a per-packet capture on lo or a veth), `1` on (the
/// default: fewer trips through the kernel's IP stack; IPv4 only).
pub const ENV_GSO: &str = "SMC_RS_SOFTROCE_GSO";
/// Environment variable: path MTU cap in bytes (256..4096).
pub const ENV_MTU: &str = "SMC_RS_SOFTROCE_MTU";

impl Config {
    /// Reads `SMC_RS_SOFTROCE_{FAULTS,PORT,PEER_PORT,MTU,GSO}`. Malformed values
    /// are logged and ignored.
    pub fn from_env() -> Config {
        let mut c = Config::default();
        if let Some(v) = smc_verbs::process::config_var(ENV_FAULTS) {
            match FaultConfig::parse(&v) {
                Some(f) => c.faults = Some(f),
                None => tracing::warn!(value = %v, "ignoring malformed {ENV_FAULTS}"),
            }
        }
        let port = |name: &str| -> Option<u16> {
            let v = smc_verbs::process::config_var(name)?;
            let p = v.trim().parse().ok();
            if p.is_none() {
                tracing::warn!(value = %v, "ignoring malformed {name}");
            }
            p
        };
        c.udp_port = port(ENV_PORT);
        c.peer_port = port(ENV_PEER_PORT);
        c.gso = gso_from_env();
        if let Some(v) = smc_verbs::process::config_var(ENV_MTU) {
            c.max_mtu = v.trim().parse().ok().and_then(Mtu::from_bytes);
            if c.max_mtu.is_none() {
                tracing::warn!(value = %v, "ignoring malformed {ENV_MTU}");
            }
        }
        c
    }
}

/// [`ENV_GSO`]: `Some(false)` for `0`, `Some(true)` for `1`, else `None`
/// (a malformed value is logged and ignored).
pub(crate) fn gso_from_env() -> Option<bool> {
    let v = smc_verbs::process::config_var(ENV_GSO)?;
    match v.trim() {
        "0" => Some(false),
        "1" => Some(true),
        _ => {
            tracing::warn!(value = %v, "ignoring malformed {ENV_GSO}");
            None
        }
    }
}

impl FaultConfig {
    /// Parses `seed=N,loss=P,reorder=P,dup=P` (any subset, any order;
    /// `duplicate` is accepted for `dup`). Probabilities must lie in 0..=1.
    pub fn parse(s: &str) -> Option<FaultConfig> {
        let mut f = FaultConfig {
            seed: 1,
            loss: 0.0,
            reorder: 0.0,
            duplicate: 0.0,
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=')?;
            let prob = || -> Option<f64> {
                let p: f64 = v.trim().parse().ok()?;
                (0.0..=1.0).contains(&p).then_some(p)
            };
            match k.trim() {
                "seed" => f.seed = v.trim().parse().ok()?,
                "loss" => f.loss = prob()?,
                "reorder" => f.reorder = prob()?,
                "dup" | "duplicate" => f.duplicate = prob()?,
                _ => return None,
            }
        }
        Some(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fault_spec() {
        let f = FaultConfig::parse("seed=7, loss=0.05,reorder=0.02,dup=0.01").unwrap();
        assert_eq!(
            f,
            FaultConfig {
                seed: 7,
                loss: 0.05,
                reorder: 0.02,
                duplicate: 0.01
            }
        );
        assert!(FaultConfig::parse("loss=2").is_none());
        assert!(FaultConfig::parse("bogus=1").is_none());
        assert!(FaultConfig::parse("loss").is_none());
    }
}
