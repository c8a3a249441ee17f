//! The SMC-R runtime: everything that does I/O (docs/core-design.md "runtime").
//!
//! A [`Stack`] owns the configuration, the verbs [`Provider`], the Peer ID, the
//! protocol [`Endpoint`](crate::endpoint::Endpoint) with the QPs and RMBs it asked for
//! (`host.rs`), the alert-token table and one event thread. The event thread
//! (`core.rs`) drives the endpoint — which runs the rendezvous and link-group machines —
//! with the bytes of the rendezvous' TCP sockets, the LLC messages of the links and the
//! clock, carries out what it decides, runs the connections' timers, and watches the idle
//! TCP connection of every SMC-R connection for its FIN or RST (RFC 7609 §4.8). The data
//! path does not go through it: application threads post RDMA WRITE + CDC themselves and
//! the provider's completion thread processes received CDCs (`conn.rs`, `link.rs`).

pub(crate) mod cond;
pub(crate) mod conn;
mod core;
mod host;
pub(crate) mod link;
mod netmon;
mod routes;
pub(crate) mod shm;
pub(crate) mod spin;
mod sys;
mod timers;

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::task::Waker;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::tcp_option::{SkipOptionPolicy, TcpOption};
use cond::Cond;
use smc_verbs::Provider;
use smc_wire::common::{Mac, PeerId};
use tracing::{debug, trace, warn};

use crate::clc::{ClcConfig, FallbackReason, LgrId, UeidTable};
use crate::conn::{ConnConfig, UpdatePolicy};
use crate::endpoint::tokens::{Route, TokenTable};
use crate::endpoint::{BufSizes, EndpointConfig};
use crate::llc;

pub(crate) use self::conn::ConnShared;
use self::core::Core;
use self::sys::EventFd;

/// Configuration of a [`Stack`].
#[derive(Clone)]
pub struct StackConfig {
    /// The RDMA provider (`from_env`: the one installed with
    /// [`crate::defaults::set_provider`], e.g. by `smc_providers::install_default`).
    pub provider: Arc<dyn Provider>,
    /// Size of the RMB element of each connection (rounded up to the compressed
    /// notation of RFC 7609 A.2.3: 16 KiB × 2^n).
    pub rmb_size: usize,
    /// Size of each connection's send buffer.
    pub sndbuf_size: usize,
    /// User EIDs for SMC-Rv2 (an empty table: v1 only, as Linux).
    pub ueids: UeidTable,
    /// Offer / accept SMC-Rv1.
    pub v1: bool,
    /// Offer / accept SMC-Rv2 (needs a UEID).
    pub v2: bool,
    /// A link group without connections lives this long (RFC 7609 §3.5.4; Linux 600 s
    /// server / 610 s client — the client gets 10 s more so the server ends it).
    pub lgr_idle_timeout: Duration,
    /// Each CLC wait (RFC 7609 C.5; Linux 6 s).
    pub clc_timeout: Duration,
    /// TEST LINK after a link received nothing this long (RFC 7609 §4.5.3; Linux 30 s);
    /// `None` disables keepalive.
    pub keepalive: Option<Duration>,
    /// LLC reply timeout (Linux 2 s).
    pub llc_reply_timeout: Duration,
    /// A server link group that lost a link (or failed to add one) tries to add it again
    /// after this long (RFC 7609 C.8; 60 s; `SMC_RS_ADD_LINK_RETRY_MS`).
    pub add_link_retry: Duration,
    /// Which destinations try SMC-R (SMC_RS_ALLOW / SMC_RS_DENY, [`crate::policy`]).
    pub policy: crate::policy::SmcPolicy,
    /// Peers for which CLC is tried without the TCP option (outside RFC 7609; off by
    /// default; `SMC_RS_SKIP_TCP_OPTION`).
    pub skip_tcp_option: SkipOptionPolicy,
    /// Where the SMC-R TCP option (RFC 7609 §3.1) comes from (`from_env`: the source
    /// installed with [`crate::defaults::set_tcp_option`], e.g. the eBPF program of
    /// `smc_bpf::install_default`); `None`: never announced.
    pub tcp_option: Option<Arc<dyn TcpOption>>,
    /// Client sockets bind to this address before connecting (tests: 127.0.0.1 vs
    /// 127.0.0.2 in one process).
    pub local_addr: Option<IpAddr>,
    /// Local addresses whose RDMA devices may carry the links of every link group
    /// (`SMC_RS_DEVICES=IP[,IP...]`): with two here on both sides, link groups get a
    /// second, symmetric link after first contact (RFC 7609 §2.2, §3.5.1.6). Empty (the
    /// default): a link group uses the device of its TCP connection's local address only
    /// (and accepts a peer's asymmetric second link on it).
    pub devices: Vec<IpAddr>,
    /// Free RMBs (and send buffers) kept per link group for reuse; beyond that an RMB
    /// freed by a connection is deleted (DELETE RKEY) and unregistered.
    pub rmb_cache: usize,
    /// Blocking reads and writes poll this long for the peer's CDC before sleeping
    /// (like Linux `net.core.busy_poll`): saves the thread wake-up on request/response
    /// traffic at the cost of CPU. Zero disables it.
    pub busy_poll: Duration,
    /// Before sleeping, a blocking read or write lets its link's RNIC make progress on
    /// the calling thread this long (`DeviceOps::drive`; softroce receives and runs the
    /// completion handler there), so the peer's CDC wakes one thread instead of the
    /// RNIC's and then this one. Zero disables it.
    pub rnic_drive: Duration,
    /// The first part of [`StackConfig::rnic_drive`] spent looking for packets without
    /// sleeping (adaptive below it, per connection, like `same_host_spin`;
    /// `SMC_RS_RNIC_SPIN_US`, 0: sleep in `poll` at once). Saves the driving thread's
    /// wake-up when the peer answers within it.
    pub rnic_spin: Duration,
    /// Offer and take smc-rs's same-host path (shared memory between two smc-rs stacks
    /// on one host, docs/samehost.md). On in [`StackConfig::from_env`] (the process
    /// default: `Stack::global`, the `smc` command, `smc run`; `SMC_RS_SAME_HOST=0`
    /// turns it off); off in [`StackConfig::with_provider`], a bare configuration (the
    /// SMC-R loopback tests use two local stacks over RDMA).
    pub same_host: bool,
    /// Directory of the stacks' Unix sockets for the same-host handshake
    /// (`SMC_RS_SAME_HOST_DIR`; both ends must use the same one).
    pub same_host_dir: std::path::PathBuf,
    /// Longest spin of a blocking read or write of a same-host connection on its ring
    /// before it sleeps (adaptive below it; `SMC_RS_SAME_HOST_SPIN_US`, 0: never spin).
    pub same_host_spin: Duration,
    /// Size of the RMB of a same-host connection (`SMC_RS_SAME_HOST_RMB_SIZE`; one size
    /// per stack, so that a region left by one connection serves the next). Larger than
    /// an SMC-R RMB by default: it is ordinary shared memory, resident only as far as
    /// it is used, and a writer and a reader on two CPUs hand fewer, larger pieces to
    /// each other (docs/samehost.md, "Buffer size").
    pub same_host_rmb_size: usize,
    /// Connection policy knobs (update policy, close timers, ...).
    pub conn: ConnConfig,
    /// Rendezvous details (host name, layouts, LLC timers); versions, UEIDs and the CLC
    /// timeout above override the fields they name.
    pub clc: ClcConfig,
}

impl fmt::Debug for StackConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StackConfig")
            .field("provider", &self.provider.name())
            .field("rmb_size", &self.rmb_size)
            .field("sndbuf_size", &self.sndbuf_size)
            .field("same_host_rmb_size", &self.same_host_rmb_size)
            .field("v1", &self.v1)
            .field("v2", &self.v2)
            .field("ueids", &self.ueids.len())
            .field("lgr_idle_timeout", &self.lgr_idle_timeout)
            .field("clc_timeout", &self.clc_timeout)
            .field("keepalive", &self.keepalive)
            .field("local_addr", &self.local_addr)
            .field("devices", &self.devices)
            .finish()
    }
}

/// `SMC_RS_DEVICES`: addresses separated by commas (blanks allowed); the first entry
/// that is not an address is the error.
fn parse_devices(v: &str) -> Result<Vec<IpAddr>, String> {
    let mut out = Vec::new();
    for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let ip: IpAddr = part.parse().map_err(|_| part.to_string())?;
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    Ok(out)
}

/// Default busy-poll time of blocking calls.
const BUSY_POLL_US: u64 = 0;

impl StackConfig {
    /// Defaults with the given provider: v1 and v2 offered (v2 only with a UEID, like
    /// Linux), 256 KiB buffers, Linux timers, no TCP-option source and no override.
    pub fn with_provider(provider: Arc<dyn Provider>) -> StackConfig {
        StackConfig {
            provider,
            rmb_size: 256 * 1024,
            sndbuf_size: 256 * 1024,
            ueids: UeidTable::new(),
            v1: true,
            v2: true,
            lgr_idle_timeout: Duration::from_secs(600),
            clc_timeout: Duration::from_secs(6),
            keepalive: Some(Duration::from_secs(30)),
            llc_reply_timeout: Duration::from_secs(2),
            add_link_retry: Duration::from_secs(60),
            skip_tcp_option: SkipOptionPolicy::disabled(),
            policy: crate::policy::SmcPolicy::default(),
            tcp_option: None,
            local_addr: None,
            devices: Vec::new(),
            rmb_cache: 16,
            busy_poll: Duration::from_micros(BUSY_POLL_US),
            rnic_drive: Duration::from_millis(1),
            rnic_spin: Duration::from_micros(50),
            same_host: false,
            same_host_dir: shm::DEFAULT_DIR.into(),
            same_host_spin: Duration::from_micros(50),
            same_host_rmb_size: 1024 * 1024,
            conn: ConnConfig {
                update_policy: UpdatePolicy::linux(),
                ..ConnConfig::default()
            },
            clc: ClcConfig::default(),
        }
    }

    /// The process default: the provider and TCP-option source installed in
    /// [`crate::defaults`] (`smc_providers::install_default` picks the provider
    /// `SMC_RS_PROVIDER` selects; `smc_bpf::install_default` the eBPF option), UEIDs from `SMC_RS_UEID` /
    /// `/etc/smc-rs/ueid`, the override list from `SMC_RS_SKIP_TCP_OPTION`, buffer
    /// sizes from `SMC_RS_RMB_SIZE` / `SMC_RS_SNDBUF_SIZE` (bytes), the client source
    /// address from `SMC_RS_LOCAL_ADDR`, the link devices from `SMC_RS_DEVICES`
    /// (comma-separated addresses), `SMC_RS_ADD_LINK_RETRY_MS`, timers from `SMC_RS_LGR_IDLE_MS`,
    /// `SMC_RS_CLC_TIMEOUT_MS`, `SMC_RS_CLOSE_TIMEOUT_MS` (the termination timer after
    /// `close()`) and `SMC_RS_KEEPALIVE_MS` (0: off), the same-host path (on unless
    /// `SMC_RS_SAME_HOST=0`) with `SMC_RS_SAME_HOST_DIR`, `SMC_RS_SAME_HOST_SPIN_US` and
    /// `SMC_RS_SAME_HOST_RMB_SIZE`.
    /// Bad values are logged and ignored.
    pub fn from_env() -> StackConfig {
        let mut c = StackConfig::with_provider(crate::defaults::provider());
        c.tcp_option = Some(crate::defaults::tcp_option());
        match crate::ueid_file::from_env_or_file() {
            Ok(t) => c.ueids = t,
            Err(e) => warn!(error = %e, "UEIDs ignored"),
        }
        match SkipOptionPolicy::from_env() {
            Ok(p) => c.skip_tcp_option = p,
            Err(e) => warn!(error = %e, "SMC_RS_SKIP_TCP_OPTION ignored"),
        }
        match crate::policy::SmcPolicy::from_env() {
            Ok(p) => c.policy = p,
            Err(e) => {
                warn!(error = %e, "connection policy (policy file, SMC_RS_ALLOW, SMC_RS_DENY) ignored: every destination tries SMC-R")
            }
        }
        let size = |name: &str| -> Option<usize> {
            let v = smc_verbs::process::config_var(name)?;
            match v.trim().parse::<usize>() {
                Ok(n) if n > 0 => Some(n),
                _ => {
                    warn!(name, value = %v, "not a size in bytes; ignored");
                    None
                }
            }
        };
        if let Some(n) = size("SMC_RS_RMB_SIZE") {
            c.rmb_size = n;
        }
        if let Some(n) = size("SMC_RS_SNDBUF_SIZE") {
            c.sndbuf_size = n;
        }
        if let Some(n) = size("SMC_RS_SAME_HOST_RMB_SIZE") {
            c.same_host_rmb_size = n;
        }
        let millis = |name: &str| -> Option<Duration> {
            let v = smc_verbs::process::config_var(name)?;
            match v.trim().parse::<u64>() {
                Ok(n) => Some(Duration::from_millis(n)),
                Err(_) => {
                    warn!(name, value = %v, "not a number of milliseconds; ignored");
                    None
                }
            }
        };
        if let Some(d) = millis("SMC_RS_LGR_IDLE_MS") {
            c.lgr_idle_timeout = d;
        }
        if let Some(d) = millis("SMC_RS_CLC_TIMEOUT_MS") {
            c.clc_timeout = d;
        }
        if let Some(d) = millis("SMC_RS_CLOSE_TIMEOUT_MS") {
            c.conn.close_timeout = d;
        }
        if let Some(d) = millis("SMC_RS_ADD_LINK_RETRY_MS") {
            c.add_link_retry = d;
        }
        if let Some(d) = millis("SMC_RS_KEEPALIVE_MS") {
            // 0 disables TEST LINK keepalive.
            c.keepalive = (!d.is_zero()).then_some(d);
        }
        // Two smc-rs stacks on one host talk through shared memory (issue 14).
        c.same_host = true;
        if let Some(v) = smc_verbs::process::config_var("SMC_RS_SAME_HOST") {
            match v.trim() {
                "1" | "on" | "yes" | "true" => {}
                "0" | "off" | "no" | "false" => c.same_host = false,
                _ => {
                    warn!(value = %v, "SMC_RS_SAME_HOST is not 0 or 1; the same-host path stays on")
                }
            }
        }
        if let Some(v) = smc_verbs::process::config_var("SMC_RS_SAME_HOST_DIR") {
            if !v.trim().is_empty() {
                c.same_host_dir = v.trim().into();
            }
        }
        if let Some(v) = smc_verbs::process::config_var("SMC_RS_SAME_HOST_SPIN_US") {
            match v.trim().parse::<u64>() {
                Ok(n) => c.same_host_spin = Duration::from_micros(n),
                Err(_) => warn!(value = %v, "SMC_RS_SAME_HOST_SPIN_US is not a number; ignored"),
            }
        }
        if let Some(v) = smc_verbs::process::config_var("SMC_RS_RNIC_SPIN_US") {
            match v.trim().parse::<u64>() {
                Ok(n) => c.rnic_spin = Duration::from_micros(n),
                Err(_) => warn!(value = %v, "SMC_RS_RNIC_SPIN_US is not a number; ignored"),
            }
        }
        if let Some(v) = smc_verbs::process::config_var("SMC_RS_LOCAL_ADDR") {
            match v.trim().parse::<IpAddr>() {
                Ok(ip) => c.local_addr = Some(ip),
                Err(_) => warn!(value = %v, "SMC_RS_LOCAL_ADDR is not an IP address; ignored"),
            }
        }
        if let Some(v) = smc_verbs::process::config_var("SMC_RS_DEVICES") {
            match parse_devices(&v) {
                Ok(d) => c.devices = d,
                Err(bad) => {
                    warn!(value = %v, bad, "SMC_RS_DEVICES: not an IP address list; ignored")
                }
            }
        }
        c
    }

    fn endpoint_config(&self, clc: &ClcConfig) -> EndpointConfig {
        EndpointConfig {
            clc: clc.clone(),
            rmb_size: self.rmb_size,
            sndbuf_size: self.sndbuf_size.min(u32::MAX as usize) as u32,
            rmb_cache: self.rmb_cache,
            lgr_idle_timeout: self.lgr_idle_timeout,
            keepalive: self.keepalive,
            llc_reply_timeout: self.llc_reply_timeout,
            add_link_retry: self.add_link_retry,
            // A lost link's connections move to another link (`Core::fail_over`).
            failover: true,
        }
    }

    fn clc_config(&self) -> ClcConfig {
        let mut c = self.clc.clone();
        c.v1 = self.v1;
        c.v2 = self.v2;
        c.v2_config.ueids = self.ueids.clone();
        c.clc_timeout = self.clc_timeout;
        if c.hostname.0 == [0u8; 32] || c.hostname.0 == [b' '; 32] {
            if let Some(h) = host_name() {
                c.hostname = h;
            }
        }
        c
    }
}

fn host_name() -> Option<smc_wire::common::HostName> {
    // The node name of uname(2) is the host name (what gethostname returns on Linux).
    let uts = rustix::system::uname();
    let s = uts.nodename().to_str().ok()?;
    let s: String = s.chars().take(32).collect();
    smc_wire::common::Name32::new(&s)
}

/// A link group's name in listings and [`crate::Mode`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LinkGroupId(pub u64);

impl fmt::Display for LinkGroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lgr{}", self.0)
    }
}

/// One link of a link group, for listings.
#[derive(Clone, Debug)]
pub struct LinkListing {
    /// Wire link number.
    pub num: u8,
    /// State (llc machine).
    pub state: String,
    /// Our QP number.
    pub qpn: u32,
    /// The peer's QP number.
    pub peer_qpn: Option<u32>,
    /// Our device.
    pub device: String,
    /// Our GID (the device's port GID; RoCEv2: the IPv4-mapped or IPv6 address).
    pub gid: String,
    /// Peer GID.
    pub peer_gid: Option<String>,
}

/// One link group, for listings (`smc lgr`, like Linux `smcr linkgroup`).
#[derive(Clone, Debug)]
pub struct LinkGroupInfo {
    /// Its id.
    pub id: LinkGroupId,
    /// "server" or "client".
    pub role: &'static str,
    /// SMC-R version (1 or 2).
    pub version: u8,
    /// The peer's Peer ID.
    pub peer: String,
    /// The links.
    pub links: Vec<LinkListing>,
    /// Connections using it.
    pub conns: usize,
    /// RMBs registered (in use or cached).
    pub rmbs: usize,
    /// RMB elements in use.
    pub rmbs_in_use: usize,
    /// No connection for now (the idle timer runs).
    pub idle: bool,
}

/// One connection, for listings (`smc conns`, like `smcss`).
#[derive(Clone, Debug)]
pub struct ConnInfo {
    /// Local address.
    pub local: SocketAddr,
    /// Peer address.
    pub peer: SocketAddr,
    /// SMC-R (or a connection still in the rendezvous).
    pub mode: String,
    /// Termination state (Linux smc_diag names).
    pub state: String,
    /// The link group.
    pub lgr: Option<LinkGroupId>,
    /// Payload bytes written to the peer.
    pub bytes_sent: u64,
    /// Of `bytes_sent`, those copied straight from the application's buffer into the
    /// peer's RMB (the same-host path, one copy instead of two; docs/samehost.md).
    pub bytes_placed: u64,
    /// Bytes the application wrote that the peer's RNIC has not acknowledged yet
    /// (with the CDC that announced them): a failover replays them (RFC 7609 §4.6.2).
    pub bytes_unacked: u64,
    /// Payload bytes received.
    pub bytes_received: u64,
    /// Times the connection moved to another link (RFC 7609 §4.6).
    pub failovers: u32,
    /// The wire number of the link its data goes on (`None`: rendezvous).
    pub link: Option<u8>,
}

/// How many RMBs and send buffers of each size a stack holds (like the buffer-size
/// lines of Linux `smcr stats`): size in bytes → count.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BufferSizes {
    /// RMBs registered (in use or cached).
    pub rmbs: std::collections::BTreeMap<usize, usize>,
    /// Send buffers (in use or pooled).
    pub sndbufs: std::collections::BTreeMap<usize, usize>,
}

/// Counters and gauges of a stack.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Link groups alive.
    pub link_groups: usize,
    /// Links (QPs) alive.
    pub links: usize,
    /// QPs open (same as links; QPs being created included).
    pub qps_open: usize,
    /// RMBs registered.
    pub rmbs: usize,
    /// RMB elements in use by connections or rendezvous.
    pub rmb_elements_in_use: usize,
    /// Alert tokens allocated.
    pub alert_tokens: usize,
    /// SMC-R connections alive (not yet released).
    pub smc_connections: usize,
    /// Rendezvous in progress.
    pub handshakes: usize,
    /// Listeners.
    pub listeners: usize,
    /// Open file descriptors of the process.
    pub fds: usize,
    /// Connections that ended up in SMC-R, ever.
    pub smc_total: u64,
    /// ... with a new link group.
    pub first_contacts: u64,
    /// Connections that fell back to TCP.
    pub fallbacks: u64,
    /// Rendezvous that ended in a TCP reset.
    pub resets: u64,
    /// RMBs deleted with DELETE RKEY.
    pub rmbs_deleted: u64,
    /// Link groups ended.
    pub lgrs_ended: u64,
    /// TEST LINK-driven or other link failures.
    pub links_failed: u64,
    /// Connections moved to another link of their link group because theirs went down
    /// (RFC 7609 §4.6), ever.
    pub failovers: u64,
    /// Times a device's interface went down or lost the device's address, failing the
    /// device's links at once (rtnetlink), ever.
    pub paths_down: u64,
    /// LLC messages received (all link groups, ever; TEST LINK included).
    pub llc_received: u64,
    /// LLC messages sent.
    pub llc_sent: u64,
    /// LLC messages of peers dropped as floods (beyond the per-link inbox bound, or TEST
    /// LINK requests beyond the answers in flight).
    pub llc_dropped: u64,
    /// Same-host connections alive (not yet released; also counted in
    /// `smc_connections`).
    pub same_host_connections: usize,
    /// Connections that ended up on the same-host path, ever (not in `smc_total`).
    pub same_host_total: u64,
    /// Same-host connections ended because the peer broke the shared ring (indices out
    /// of range, a slot that is no CDC): a hostile or broken peer process.
    pub same_host_violations: u64,
}

/// Counters the runtime keeps itself (the endpoint counts the rest).
#[derive(Default)]
pub(crate) struct Counters {
    pub llc_sent: AtomicU64,
    /// Device addresses found unusable (interface down or address removed).
    pub paths_down: AtomicU64,
    /// LLC messages dropped on arrival (a link's inbox was full).
    pub llc_dropped: AtomicU64,
    /// `Stats::same_host_violations`.
    pub shm_violations: AtomicU64,
}

/// Messages to the event thread.
#[derive(Debug)]
pub(crate) enum Inbox {
    LlcRecv {
        lgr: LgrId,
        link: llc::LinkId,
        bytes: Vec<u8>,
    },
    LlcSent {
        lgr: LgrId,
        link: llc::LinkId,
        id: llc::SendId,
        ok: bool,
    },
    LinkError {
        lgr: LgrId,
        link: llc::LinkId,
    },
    ResetTcp(u32),
    /// A connection (its alert token) reached CLOSED (it may be released).
    ConnClosed(u32),
    /// The application dropped its last handle on a connection.
    Released(u32),
    /// Server: the exchange thread finished the same-host exchange of the rendezvous on
    /// `tcp` (`host.rs`, `same_host_server`); `token` is the one it was given.
    SameHostDone {
        tcp: crate::endpoint::TcpId,
        token: u32,
        result: SameHostOutcome,
    },
}

/// The outcome of a same-host exchange run on the exchange thread.
pub(crate) struct SameHostOutcome(pub io::Result<shm::ShmSetup>);

impl std::fmt::Debug for SameHostOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Ok(s) => write!(f, "Ok(token {:#x})", s.local_token),
            Err(e) => write!(f, "Err({e})"),
        }
    }
}

/// What a rendezvous hands to the API.
pub(crate) enum Established {
    Smc(Arc<ConnShared>),
    Fallback(TcpStream, FallbackReason),
}

/// A client's wait for its rendezvous.
#[derive(Default)]
pub(crate) struct ConnectSlot {
    pub result: Mutex<Option<io::Result<Established>>>,
    pub cond: Cond,
    /// The caller gave up (connect timeout): a late result is closed, not kept.
    pub abandoned: AtomicBool,
    /// Set once `result` is (for a look without the lock).
    done: AtomicBool,
    /// The waiting thread's, rung while it polls the rendezvous socket itself
    /// (`polling`, `core::drive_client_rendezvous`); not after, when it waits on `cond`
    /// (a stale ring would end its next wait in `drive` for nothing).
    waker: Option<smc_verbs::DriveWaker>,
    pub polling: AtomicBool,
}

impl ConnectSlot {
    /// A slot whose waiter also sleeps on `waker`'s descriptor.
    pub(crate) fn new(waker: Option<smc_verbs::DriveWaker>) -> ConnectSlot {
        ConnectSlot {
            waker,
            ..ConnectSlot::default()
        }
    }

    pub(crate) fn is_complete(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    pub(crate) fn complete(&self, r: io::Result<Established>) {
        if let Ok(mut g) = self.result.lock() {
            if self.abandoned.load(Ordering::SeqCst) {
                if let Ok(e) = r {
                    discard(e);
                }
                return;
            }
            *g = Some(r);
            self.done.store(true, Ordering::Release);
        }
        self.cond.notify_all();
        if let Some(w) = self
            .waker
            .as_ref()
            .filter(|_| self.polling.load(Ordering::SeqCst))
        {
            // A no-op on the waiting thread itself (it completed the rendezvous).
            w.wake();
        }
    }
}

/// Closes a finished rendezvous nobody will use (caller gone, accept queue full).
pub(crate) fn discard(e: Established) {
    if let Established::Smc(c) = e {
        let mut st = c.lock();
        st.conn.close(Instant::now());
        st.released = true;
        c.drive(&mut st, Instant::now());
        drop(st);
        if let Some(s) = c.stack.upgrade() {
            s.post(Inbox::Released(c.token));
        }
    }
}

/// Finished connections a listener keeps for `accept()` at most.
const MAX_ACCEPT_QUEUE: usize = 4096;

/// A listener's accepted, finished rendezvous.
pub(crate) struct ListenerShared {
    pub id: u64,
    pub sock: TcpListener,
    pub local: SocketAddr,
    pub queue: Mutex<VecDeque<(Established, SocketAddr)>>,
    pub cond: Cond,
    pub closed: AtomicBool,
    pub nonblocking: AtomicBool,
    pub waker: Mutex<Option<Waker>>,
    /// Buffer sizes of the connections it accepts (the listening socket's SO_RCVBUF /
    /// SO_SNDBUF, which TCP's accepted sockets inherit).
    pub bufs: BufSizes,
}

impl ListenerShared {
    pub(crate) fn push(&self, e: Established, peer: SocketAddr) {
        if let Ok(mut q) = self.queue.lock() {
            // Like a full TCP backlog: an application that does not accept does not
            // get to pin unbounded memory; the connection is closed.
            if q.len() >= MAX_ACCEPT_QUEUE {
                debug!(%peer, "accept queue full; connection dropped");
                discard(e);
                return;
            }
            q.push_back((e, peer));
        }
        self.cond.notify_all();
        if let Ok(mut w) = self.waker.lock() {
            if let Some(w) = w.take() {
                w.wake();
            }
        }
    }
}

pub(crate) struct Inner {
    pub cfg: StackConfig,
    pub clc: ClcConfig,
    instance: u16,
    peer_id: OnceLock<PeerId>,
    pub tcp_option: Arc<dyn TcpOption>,
    /// The same-host path (`None` when configured off).
    pub(crate) same_host: Option<Arc<shm::SameHost>>,
    core: Mutex<Core>,
    pub(crate) tokens: RwLock<TokenTable<Arc<ConnShared>>>,
    inbox: Mutex<Vec<Inbox>>,
    /// The connections' deadlines (`timers.rs`).
    pub(crate) timers: timers::TimerQueue,
    efd: EventFd,
    /// Interface and address notifications (`None`: no rtnetlink socket; links then fail
    /// only by QP errors and TEST LINK).
    netmon: Option<netmon::NetMon>,
    stop: AtomicBool,
    pub counters: Counters,
}

impl Inner {
    /// Our Peer ID (RFC 7609 A.2.1): a random instance number and the MAC of the first
    /// RoCE device this stack uses.
    pub(crate) fn peer_id(&self, mac: Mac) -> PeerId {
        *self.peer_id.get_or_init(|| PeerId {
            instance: self.instance,
            mac,
        })
    }

    pub(crate) fn wake(&self) {
        self.efd.wake();
    }

    pub(crate) fn post(&self, m: Inbox) {
        if let Ok(mut i) = self.inbox.lock() {
            i.push(m);
        }
        self.efd.wake();
    }

    /// The connection of `token` in link group `lgr` (CDC send completions).
    pub(crate) fn conn_by_token(&self, token: u32, lgr: LgrId) -> Option<Arc<ConnShared>> {
        self.tokens.read().ok()?.get(token, lgr).cloned()
    }

    /// A received CDC (completion thread): to the connection its alert token names, if
    /// it came on a link of that connection's link group; kept while the connection's
    /// rendezvous still runs here (`endpoint::tokens`).
    pub(crate) fn on_cdc(&self, link: &link::LinkRes, bytes: &[u8; 44], now: Instant) {
        let Ok(msg) = crate::conn::CdcRepr::parse_bytes(bytes) else {
            return;
        };
        let conn = match self.conn_by_token(msg.token, link.lgr) {
            Some(c) => Some(c),
            None => match self.tokens.write() {
                Ok(mut t) => match t.route(link.lgr, &msg) {
                    Route::Conn(c) => Some(c),
                    Route::Kept => None,
                    Route::Dropped(why) => {
                        trace!(token = msg.token, ?why, "CDC dropped");
                        None
                    }
                },
                Err(_) => None,
            },
        };
        if let Some(c) = conn {
            if msg.is_failover_validation() {
                // RFC 7609 §4.6.1: SR must count every CDC we received before the peer's
                // failover, some of which may still wait in another link's completion
                // queue (`LinkRes::drain_completions`): processed first.
                for l in c
                    .links_to_drain_before_validation(link)
                    .into_iter()
                    .flatten()
                {
                    l.drain_completions();
                }
            }
            c.on_cdc(&msg, now);
        }
    }

    pub(crate) fn lock_core(&self) -> std::sync::MutexGuard<'_, Core> {
        match self.core.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}

/// This process's stack: a forked child makes its own on first use (the parent's
/// event thread and devices are not in the child, [`smc_verbs::process`]).
static GLOBAL: smc_verbs::process::PerProcess<Stack> = smc_verbs::process::PerProcess::new();

/// Process exit with the global stack in use: end its link groups with DELETE LINK
/// (RFC 7609 §3.5.4) so that the peers free theirs at once instead of after a failed
/// TEST LINK. Best effort: skipped if the event thread holds the lock. A forked child
/// ends only the link groups of a stack it made itself: its copy of its parent's
/// shares the parent's sockets, not its threads, and a goodbye from it would end the
/// parent's link groups.
extern "C" fn global_at_exit() {
    // On a fresh thread: the exiting thread's thread-locals may already be gone, and
    // nothing may unwind out of an `extern "C"` function.
    let Some(stack) = GLOBAL.get() else { return };
    let t = std::thread::Builder::new()
        .name("smc-exit".into())
        .spawn(move || {
            let sent = match stack.inner.core.try_lock() {
                Ok(mut core) => core.goodbye(&stack.inner, Instant::now()),
                Err(_) => false,
            };
            if sent {
                // Give the RNIC's thread a moment to put the messages on the wire.
                std::thread::sleep(Duration::from_millis(20));
                // Then no link lingers (`Stack::terminate_link_groups` waits for that;
                // an exiting process cannot): their completion handlers must not run
                // while the process tears itself down.
                if let Ok(mut core) = stack.inner.core.try_lock() {
                    core.end_lingering();
                }
            }
        });
    if let Ok(t) = t {
        let _ = t.join();
    }
}

/// An SMC-R stack instance (see the module documentation).
pub struct Stack {
    pub(crate) inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for Stack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stack")
            .field("config", &self.inner.cfg)
            .finish()
    }
}

impl Stack {
    /// The process-wide stack ([`StackConfig::from_env`]), started on first use; a
    /// forked child starts its own on first use.
    pub fn global() -> &'static Stack {
        let s = GLOBAL.get_or_init(|| match Stack::new(StackConfig::from_env()) {
            Ok(s) => s,
            // Creating an eventfd and a thread only fails when the process is out of
            // resources; there is nothing sensible to return from a static accessor.
            Err(e) => panic!("cannot start the SMC-R stack: {e}"),
        });
        // Statics are never dropped: say goodbye to the peers at process exit. Once per
        // address space: a forked child inherits the registration, and the handler
        // finds the exiting process's own stack.
        static AT_EXIT: std::sync::Once = std::sync::Once::new();
        AT_EXIT.call_once(|| {
            // SAFETY: registers a plain `extern "C"` function with no arguments.
            if unsafe { libc::atexit(global_at_exit) } != 0 {
                debug!("atexit registration failed; peers notice our exit by TEST LINK");
            }
        });
        // Its sockets are listed by `smc ss` (crate::observe), per process.
        static PUBLISHED: smc_verbs::process::PerProcess<()> =
            smc_verbs::process::PerProcess::new();
        PUBLISHED.get_or_init(|| crate::observe::publish(s));
        s
    }

    /// This process's global stack, if it started one ([`Stack::global`]).
    pub fn global_if_started() -> Option<&'static Stack> {
        GLOBAL.get()
    }

    /// A new stack with its own Peer ID and event thread.
    pub fn new(config: StackConfig) -> io::Result<Stack> {
        let clc = config.clc_config();
        let ep_cfg = config.endpoint_config(&clc);
        let tcp_option = config.tcp_option.clone().unwrap_or_else(|| {
            Arc::new(crate::tcp_option::NoTcpOption::new(
                "SMC-R option disabled by configuration",
            ))
        });
        let inner = Arc::new(Inner {
            clc,
            instance: rand::random::<u16>(),
            peer_id: OnceLock::new(),
            tcp_option,
            same_host: config.same_host.then(|| {
                Arc::new(shm::SameHost::new(
                    config.same_host_dir.clone(),
                    config.same_host_rmb_size,
                ))
            }),
            core: Mutex::new(Core::new(ep_cfg)?),
            tokens: RwLock::new(TokenTable::default()),
            inbox: Mutex::new(Vec::new()),
            timers: Default::default(),
            efd: EventFd::new()?,
            netmon: netmon::NetMon::open()
                .map_err(|e| {
                    warn!(error = %e, "no rtnetlink socket: interface and address losses are \
                        noticed only when a link's QP gives up or TEST LINK goes unanswered");
                })
                .ok(),
            stop: AtomicBool::new(false),
            counters: Counters::default(),
            cfg: config,
        });
        if !inner.cfg.devices.is_empty() {
            inner.lock_core().add_link_devices(&inner);
        }
        let thread_inner = inner.clone();
        let thread = std::thread::Builder::new()
            .name("smc-event".into())
            .spawn(move || core::run(thread_inner))?;
        Ok(Stack {
            inner,
            thread: Some(thread),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &StackConfig {
        &self.inner.cfg
    }

    /// Link groups (id, role, version, peer, links, connections, RMBs).
    pub fn link_groups(&self) -> Vec<LinkGroupInfo> {
        self.inner.lock_core().link_group_infos()
    }

    /// Connections (addresses, mode, state, link group, bytes).
    pub fn connections(&self) -> Vec<ConnInfo> {
        self.inner.lock_core().conn_infos()
    }

    /// RMB and send buffer sizes ([`BufferSizes`]).
    pub fn buffer_sizes(&self) -> BufferSizes {
        self.inner.lock_core().buffer_sizes()
    }

    /// The local addresses of its listeners.
    pub fn listener_addrs(&self) -> Vec<SocketAddr> {
        self.inner.lock_core().listener_addrs()
    }

    /// Counters and gauges, including open QPs, RMB elements in use and fds.
    pub fn stats(&self) -> Stats {
        let mut s = self.inner.lock_core().stats();
        let c = &self.inner.counters;
        s.alert_tokens = self.inner.tokens.read().map(|t| t.len()).unwrap_or(0);
        s.fds = sys::count_fds();
        s.llc_sent = c.llc_sent.load(Ordering::Relaxed);
        s.paths_down = c.paths_down.load(Ordering::Relaxed);
        s.llc_dropped += c.llc_dropped.load(Ordering::Relaxed);
        s.same_host_violations = c.shm_violations.load(Ordering::Relaxed);
        s
    }

    /// Fault injection (tests, drills): moves our QP of link `num` of link group `lgr` to
    /// the error state, as a failed path or RNIC port would. Its outstanding work is
    /// flushed, the link goes down, and its connections move to another link of the
    /// group (RFC 7609 §4.6) or end when none is left. Returns whether the link exists.
    pub fn inject_link_failure(&self, lgr: LinkGroupId, num: u8) -> bool {
        self.inner.lock_core().inject_link_failure(lgr, num)
    }

    /// Fault injection (tests): while `hold`, the completions of our QP of link `num` of
    /// link group `lgr` stay in its completion queue, as if the thread that runs its
    /// handler had not got to them yet (our RNIC still acknowledges what arrives); only
    /// the check of a peer's failover validation takes them (RFC 7609 §4.6.1). Letting
    /// go processes what waits. Returns whether the link exists.
    #[doc(hidden)]
    pub fn hold_link_completions(&self, lgr: LinkGroupId, num: u8, hold: bool) -> bool {
        let link = self.inner.lock_core().link_by_num(lgr, num);
        match link {
            Some(l) => {
                l.hold_completions(hold);
                true
            }
            None => false,
        }
    }

    /// Diagnostics (tests, drills): logs every connection's protocol state at WARN
    /// (cursors, sequence numbers, flags in flight), its link and whether it waits for
    /// send slots, and each link's free slots — what a stalled transfer needs explained.
    #[doc(hidden)]
    pub fn dump_state(&self) {
        let core = self.inner.lock_core();
        let conns = core.conns();
        drop(core);
        for c in conns {
            let st = c.lock();
            let (link, free) = match &st.path {
                conn::Path::Rdma(p) => (Some(p.link.id), p.link.free_slots()),
                _ => (None, 0),
            };
            warn!(token = c.token, ?link, free_slots = free, waiting_slots = st.waiting_slots,
                validation = ?st.validation, failovers = st.failovers, conn = ?st.conn, "state dump");
        }
    }

    /// Ends every link group now (DELETE LINK, orderly) — their connections are reset —
    /// and returns once their links are gone. A link that ended while healthy keeps
    /// acknowledging what the peer still sends until the peer has been quiet for a moment
    /// (at most a few seconds): a process about to exit calls this so that the peer's last
    /// messages (a Linux peer's abort CDCs) complete instead of being retransmitted to a
    /// process that is gone.
    pub fn terminate_link_groups(&self) {
        let mut core = self.inner.lock_core();
        core.terminate_all(&self.inner, Instant::now());
        drop(core);
        self.inner.wake();
        let t = Instant::now();
        while t.elapsed() < host::LINGER_MAX + Duration::from_millis(200)
            && self.inner.lock_core().lingering_links() > 0
        {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        self.inner.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(s) = &self.inner.same_host {
            s.shutdown();
        }
    }
}

pub(crate) use self::core::{drive_client_rendezvous, register_client, register_listener};
pub(crate) use self::sys::bind_no_port;

#[cfg(test)]
mod tests {
    use super::parse_devices;

    #[test]
    fn smc_rs_devices_parses_an_address_list() {
        let ips = parse_devices(" 10.0.0.1, 10.0.1.1,,fd00::1 ,10.0.0.1").unwrap();
        let want: Vec<std::net::IpAddr> = ["10.0.0.1", "10.0.1.1", "fd00::1"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(ips, want);
        assert!(parse_devices("").unwrap().is_empty());
        assert_eq!(parse_devices("10.0.0.1,eth0").unwrap_err(), "eth0");
    }
}
