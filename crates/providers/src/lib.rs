//! Which RDMA provider smc-rs uses: `SMC_RS_PROVIDER=auto|softroce|ibverbs`.
//!
//! - `softroce`: the software RoCEv2 RNIC (`smc-softroce`) for every address.
//! - `ibverbs`: RDMA NICs through libibverbs (`smc-ibverbs`); an address that no device
//!   serves gets no SMC-R (the connection falls back to TCP).
//! - `auto` (the default): per local address, the libibverbs device whose RoCEv2 GID is
//!   that address when there is one and libibverbs loads, else the software RNIC.
//!
//! This is the one place that maps the setting to a provider. The SMC-R runtime (`smc`)
//! links no provider: a program calls [`install_default`] once, and the `smc` command
//! also [`open_device`] for its `smc rdma` tools.

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use smc_ibverbs::IbVerbs;
use smc_softroce::SoftRoce;
use smc_verbs::{Device, Provider, Result};
use tracing::{info, warn};

/// The environment variable that selects the provider.
pub const ENV: &str = "SMC_RS_PROVIDER";

/// A provider choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Selection {
    /// libibverbs where a device serves the address, else the software RNIC.
    #[default]
    Auto,
    /// Always the software RoCEv2 RNIC.
    SoftRoce,
    /// Always libibverbs.
    IbVerbs,
}

impl FromStr for Selection {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(Selection::Auto),
            "softroce" => Ok(Selection::SoftRoce),
            "ibverbs" => Ok(Selection::IbVerbs),
            other => Err(format!("{ENV}={other}: expected auto, softroce or ibverbs")),
        }
    }
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Selection::Auto => "auto",
            Selection::SoftRoce => "softroce",
            Selection::IbVerbs => "ibverbs",
        })
    }
}

/// The selection in the environment; a bad value is an error.
pub fn selection_from_env() -> std::result::Result<Selection, String> {
    match smc_verbs::process::config_var(ENV) {
        Some(v) => v.parse(),
        None => Ok(Selection::Auto),
    }
}

/// The selection in the environment; a bad value is logged and `auto` used.
pub fn selection_or_auto() -> Selection {
    selection_from_env().unwrap_or_else(|e| {
        warn!("{e}; using auto");
        Selection::Auto
    })
}

/// The process-wide provider for `sel` (one instance per choice).
pub fn provider(sel: Selection) -> Arc<dyn Provider> {
    match sel {
        Selection::SoftRoce => SoftRoce::global(),
        Selection::IbVerbs => IbVerbs::global(),
        Selection::Auto => Auto::global(),
    }
}

/// The provider `SMC_RS_PROVIDER` names (default `auto`).
pub fn from_env() -> Arc<dyn Provider> {
    provider(selection_or_auto())
}

/// Makes [`from_env`] the RDMA provider of every stack built from
/// `smc::StackConfig::from_env` (hence of `smc::Stack::global`, behind
/// `SmcStream::connect`). Call once at start-up, before the first connection.
pub fn install_default() {
    smc::defaults::set_provider(from_env);
}

/// `auto`: libibverbs for the addresses a device serves, the software RNIC elsewhere.
pub struct Auto {
    ib: Arc<IbVerbs>,
    soft: Arc<SoftRoce>,
    told: Mutex<HashSet<IpAddr>>,
}

impl Auto {
    /// The process-wide instance (over [`IbVerbs::global`] and [`SoftRoce::global`]; a
    /// forked child gets its own, [`smc_verbs::process`]).
    pub fn global() -> Arc<Auto> {
        static G: smc_verbs::process::PerProcess<Arc<Auto>> = smc_verbs::process::PerProcess::new();
        G.get_or_init(|| Arc::new(Auto::new(IbVerbs::global(), SoftRoce::global())))
            .clone()
    }

    /// An instance over the given providers.
    pub fn new(ib: Arc<IbVerbs>, soft: Arc<SoftRoce>) -> Auto {
        Auto {
            ib,
            soft,
            told: Mutex::new(HashSet::new()),
        }
    }

    /// Which provider `auto` picks for `local`, and why.
    pub fn choose(ib: &IbVerbs, local: IpAddr) -> (Selection, String) {
        match ib.placement(local) {
            None => (
                Selection::SoftRoce,
                format!("no RDMA device found for {local}: using the software RNIC"),
            ),
            Some(p) => match smc_ibverbs::api() {
                Ok(_) => (
                    Selection::IbVerbs,
                    format!(
                        "{local} is served by {} port {} (GID index {}{})",
                        p.device,
                        p.port,
                        p.gid.index,
                        p.gid.ndev.map(|n| format!(", netdev {n}")).unwrap_or_default()
                    ),
                ),
                Err(e) => (
                    Selection::SoftRoce,
                    format!(
                        "{} serves {local} but libibverbs is unusable ({e}): using the software RNIC",
                        p.device
                    ),
                ),
            },
        }
    }

    fn tell_once(&self, local: IpAddr, msg: &str) {
        let mut t = self.told.lock().unwrap_or_else(|e| e.into_inner());
        if t.insert(local) {
            info!("provider auto: {msg}");
        }
    }
}

impl Provider for Auto {
    fn name(&self) -> &str {
        "auto"
    }

    fn device_for(&self, local: IpAddr) -> Result<Device> {
        let (sel, why) = Auto::choose(&self.ib, local);
        if sel == Selection::IbVerbs {
            match self.ib.device_for(local) {
                Ok(d) => {
                    self.tell_once(local, &why);
                    return Ok(d);
                }
                Err(e) => self.tell_once(
                    local,
                    &format!("{why}, but opening it failed ({e}): using the software RNIC"),
                ),
            }
        } else {
            self.tell_once(local, &why);
        }
        self.soft.device_for(local)
    }

    fn devices(&self) -> Vec<Device> {
        let mut v = self.ib.devices();
        v.extend(self.soft.devices());
        v
    }
}

/// One line saying which provider serves `local` under `sel` (for `smc bench`, `--stats`
/// and `smc rdma devices`), e.g. `auto: softroce (no RDMA device found for 127.0.0.1: ...)`.
pub fn describe(sel: Selection, local: IpAddr) -> String {
    match sel {
        Selection::Auto => {
            let (s, why) = Auto::choose(&IbVerbs::global(), local);
            format!("auto: {s} ({why})")
        }
        s => s.to_string(),
    }
}

/// A device for the `smc rdma` tools: as [`Provider::device_for`] of the selected
/// provider, except that the software RNIC opens a fresh device each call
/// (`smc_softroce::open_device`, configured from the environment), as those tools
/// always did.
pub fn open_device(sel: Selection, local: IpAddr) -> Result<Device> {
    let soft = || smc_softroce::open_device(local, &smc_softroce::Config::from_env());
    match sel {
        Selection::SoftRoce => soft(),
        Selection::IbVerbs => IbVerbs::global().device_for(local),
        Selection::Auto => {
            let ib = IbVerbs::global();
            match Auto::choose(&ib, local) {
                (Selection::IbVerbs, _) => ib.device_for(local),
                _ => soft(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_setting() {
        assert_eq!("auto".parse::<Selection>(), Ok(Selection::Auto));
        assert_eq!(" IBVERBS ".parse::<Selection>(), Ok(Selection::IbVerbs));
        assert_eq!("softroce".parse::<Selection>(), Ok(Selection::SoftRoce));
        assert_eq!("".parse::<Selection>(), Ok(Selection::Auto));
        let e = "rxe".parse::<Selection>().unwrap_err();
        assert!(e.contains("expected auto, softroce or ibverbs"), "{e}");
        assert_eq!(Selection::IbVerbs.to_string(), "ibverbs");
    }

    #[test]
    fn auto_uses_the_software_rnic_where_no_device_serves_the_address() {
        let dir = std::env::temp_dir().join(format!("smc-providers-{}", std::process::id()));
        let ib = IbVerbs::with_sysfs(dir.join("none"), dir.join("none"));
        let (sel, why) = Auto::choose(&ib, "127.0.0.1".parse().unwrap());
        assert_eq!(sel, Selection::SoftRoce);
        assert!(why.contains("no RDMA device found"), "{why}");
        let auto = Auto::new(ib, SoftRoce::new(smc_softroce::Config::default()));
        let d = auto.device_for("127.77.0.1".parse().unwrap()).unwrap();
        assert_eq!(d.attr().provider, "softroce");
        assert_eq!(auto.name(), "auto");
        assert_eq!(auto.devices().len(), 1);
    }
}
