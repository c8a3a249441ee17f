//! `smc-iwarp`: a software iWARP RNIC.
//!
//! RDMAP (RFC 5040) over DDP (RFC 5041) over MPA (RFC 5044) over a kernel TCP connection
//! per queue pair, with the RFC 6581 enhanced connection establishment (MPA revision 2:
//! IRD/ORD negotiation, peer-to-peer mode with a Ready-to-Receive message, MPA error
//! reporting), wire-compatible with Linux `siw`. It implements the [`smc_verbs`] provider
//! traits; because an iWARP QP is bound to a TCP connection, QPs are connected by the small
//! connection manager in [`cm`] (the role `iw_cm`/`rdma_cm` play on Linux) instead of the
//! RTR/RTS attributes of RoCE.
//!
//! * [`wire`]: MPA frames, FPDUs, DDP/RDMAP headers (typed views and `Repr`s).
//! * [`negotiate`]: the RFC 6581 §9 IRD/ORD and RTR rules as pure functions.
//! * [`cm`]: connect / listen / accept / reject over TCP, MPA Request/Reply.
//! * the provider: devices, protection domains, memory regions (STag = rkey), CQs and RC QPs
//!   whose transmit and receive run on two threads per QP.
pub mod cm;
mod config;
mod cq;
mod device;
mod mr;
pub mod negotiate;
mod qp;
pub mod smclink;
mod verbs;
pub mod wire;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

pub use config::{Config, ENV_MAX_ULPDU};
pub use device::Stats;
pub use verbs::stats;

/// The software iWARP provider (implements [`smc_verbs::Provider`]).
pub struct Iwarp {
    config: Config,
    devices: Mutex<HashMap<IpAddr, smc_verbs::Device>>,
}

impl Iwarp {
    /// A provider whose devices use `config`.
    pub fn new(config: Config) -> Arc<Iwarp> {
        Arc::new(Iwarp {
            config,
            devices: Mutex::new(HashMap::new()),
        })
    }
    /// Process-wide instance configured from the environment (a forked child gets its
    /// own, [`smc_verbs::process`]).
    pub fn global() -> Arc<Iwarp> {
        static G: smc_verbs::process::PerProcess<Arc<Iwarp>> =
            smc_verbs::process::PerProcess::new();
        G.get_or_init(|| Iwarp::new(Config::from_env())).clone()
    }
    /// A provider for an SMC-R stack: devices in SMC-R link mode ([`smclink`]).
    pub fn for_smc() -> Arc<Iwarp> {
        Iwarp::new(Config {
            smc_links: true,
            ..Config::from_env()
        })
    }
}

impl smc_verbs::Provider for Iwarp {
    fn name(&self) -> &str {
        "iwarp"
    }
    fn device_for(&self, local: IpAddr) -> smc_verbs::Result<smc_verbs::Device> {
        let local = match local {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(local),
            v4 => v4,
        };
        let mut m = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = m.get(&local) {
            return Ok(d.clone());
        }
        let d = verbs::open(local, &self.config)?;
        m.insert(local, d.clone());
        Ok(d)
    }
    fn devices(&self) -> Vec<smc_verbs::Device> {
        self.devices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }
    /// SMC-R over iWARP is outside RFC 7609 (CHECKLIST AMB-M9): only for peers that opted in.
    fn private_transport(&self) -> Option<&str> {
        Some("iWARP")
    }
}

/// One device whose QPs connect from `local` (not shared with a provider instance).
pub fn open_device(local: IpAddr, config: &Config) -> smc_verbs::Result<smc_verbs::Device> {
    verbs::open(local, config)
}

/// Why an iWARP QP is in ERR (the peer's Terminate, a lost TCP connection, a Terminate we
/// sent, ...); `None` for a QP of another provider or one that never failed.
pub fn qp_error(qp: &smc_verbs::Qp) -> Option<String> {
    qp.0.as_any()
        .downcast_ref::<qp::IwQp>()
        .and_then(|q| q.shared.error_reason())
}
