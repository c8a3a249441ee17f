//! `smc-softroce`: a software RoCEv2 RNIC.
//!
//! An InfiniBand reliable-connected (RC) transport in userspace, carried in
//! UDP datagrams to port 4791 exactly as RoCEv2 specifies, so that Linux
//! `rdma_rxe` and hardware RNICs can talk to it. It implements the
//! [`smc_verbs`] provider traits; users see the usual `Device`, `Pd`, `Mr`,
//! `Cq` and `Qp` handles.
//!
//! * [`wire`]: packet formats (BTH, RETH, AETH, ImmDt, AtomicETH,
//!   AtomicAckETH), typed views and `Repr`s; parsing never panics.
//! * [`icrc`]: the invariant CRC over the masked IP/UDP/BTH headers.
//! * `qp`: RC queue pairs, after Linux rxe: `qp::req` (requester:
//!   segmentation, PSNs, retransmission), `qp::comp` (completer: ACK/NAK,
//!   READ and atomic responses into completions), `qp::resp` (responder:
//!   execution in PSN order, duplicates), `qp::reply` (responses owed, in
//!   PSN order) and `qp::wqe` (posting and scatter/gather copies).
//! * `verbs`: the user-visible handles (device, PD, MR, CQ, QP).
//! * `engine`: the QPN table, the receive path and the per-device progress
//!   engine thread; `device`: the state QPs and CQs share (attributes,
//!   socket, MR table, counters, the engine's doorbell).
//! * `tx`, `rx`, `net`: batched sendmmsg/recvmmsg with UDP GSO/GRO, the
//!   ICRC check on receive, sockets and netdev facts.
//! * `cq`, `mr`, `thread`: completion queues, memory regions and keys, which
//!   thread may run completion handlers.
//! * `resident`: the receive and transmit batches and every region a peer
//!   writes into are faulted in up front (as `ibv_reg_mr` pins pages), so
//!   that receiving never waits for a page fault there.
//! * `fault`: a seeded loss/reorder/duplicate injector on the send path.
//!
//! Modules only use the ones listed after them (`verbs` → `engine` → `qp`
//! → `tx`/`rx` → `device` → `cq`/`mr`/`thread` → `resident`): no import
//! cycles.
//!
//! Configuration comes from [`Config`] (or the environment for
//! [`SoftRoce::global`], see [`config`]): `SMC_RS_SOFTROCE_FAULTS`,
//! `SMC_RS_SOFTROCE_MTU`, `SMC_RS_SOFTROCE_PORT`, `SMC_RS_SOFTROCE_PEER_PORT`,
//! and `SMC_RS_SOFTROCE_GSO=0` (UDP GSO/GRO for trains of packets, IPv4, on
//! by default where the kernel has them; 0 turns them off).
//!
//! Limits: RC only (no UD, SRQ, memory windows, SEND with invalidate, APM);
//! at most 8 SGEs and 256 bytes of inline data per work request; messages
//! of at most 2 GiB and 2^22 packets at the path MTU; at most 16 READ/atomic
//! requests in progress per QP each way (`max_qp_rd_atom`); one device per
//! local address per process.
//!
//! Against peers: only a QP's connected peer address reaches it (others'
//! packets are dropped and counted, `Stats::rx_foreign`); responses leave in
//! PSN order; `max_dest_rd_atomic` is enforced; deregistering a region ends
//! every access to it at once; regions are known by a random I/O virtual
//! address (`Mr::addr`), never by their process address; each QP sends from
//! a UDP source port of its own (ECMP entropy, as rxe). The `fuzzing`
//! feature exports `harness`, an engine-less device for the
//! `roce_responder` fuzz target.
//!
//! ```no_run
//! use smc_softroce::{open_device, Config};
//! let dev = open_device("127.0.0.1".parse().unwrap(), &Config::default()).unwrap();
//! let pd = dev.alloc_pd().unwrap();
//! ```

pub mod config;
mod cq;
mod device;
mod engine;
mod fault;
#[cfg(any(test, feature = "fuzzing"))]
pub mod harness;
pub mod icrc;
mod mr;
mod net;
mod qp;
mod resident;
mod rx;
mod share;
mod thread;
mod tx;
mod verbs;
pub mod wire;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

pub use config::{Config, FaultConfig};
pub use device::Stats;
pub use share::{ShareError, ENV_SHARE};
pub use verbs::stats;

/// The software RoCEv2 RNIC provider (implements [`smc_verbs::Provider`]).
pub struct SoftRoce {
    config: Config,
    devices: Mutex<HashMap<IpAddr, smc_verbs::Device>>,
}

impl SoftRoce {
    /// A provider whose devices use `config`.
    pub fn new(config: Config) -> Arc<SoftRoce> {
        Arc::new(SoftRoce {
            config,
            devices: Mutex::new(HashMap::new()),
        })
    }

    /// Process-wide default instance ([`Config::from_env`]); a forked child gets its
    /// own (its devices' threads are not in the child, [`smc_verbs::process`]).
    pub fn global() -> Arc<SoftRoce> {
        static G: smc_verbs::process::PerProcess<Arc<SoftRoce>> =
            smc_verbs::process::PerProcess::new();
        G.get_or_init(|| SoftRoce::new(Config::from_env())).clone()
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }
}

impl smc_verbs::Provider for SoftRoce {
    fn name(&self) -> &str {
        "softroce"
    }

    /// Opens "sroceN" bound to `local:4791` on first use.
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
}

/// Convenience: one device bound to `local` with `config` (not shared with
/// any provider instance).
pub fn open_device(local: IpAddr, config: &Config) -> smc_verbs::Result<smc_verbs::Device> {
    verbs::open(local, config)
}
