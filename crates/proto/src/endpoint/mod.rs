//! The SMC-R endpoint: one stack's protocol state above the per-connection data path, as
//! a sans-I/O machine (the quinn-proto `Endpoint`).
//!
//! It owns the link-group table (each with its [`LinkGroup`](crate::llc::LinkGroup)
//! machine), the running rendezvous (the [`clc`] machines), the accounting of
//! RMBs and their elements, and the choreography between those machines: first-contact
//! milestones from the llc machine to the rendezvous, CONFIRM RKEY before a subsequent
//! contact's Accept/Confirm, the serialization of first contacts from one peer address on
//! the server, and the rules that tie connections to links (a link going down moves the
//! connections on it to another link of the group, RFC 7609 §4.6, or ends them when
//! none is left; a peer's TCP FIN without its SMC-R close flags probes the link).
//! Each connection's own data path and termination are its [`Conn`](crate::conn::Conn)
//! machine, which the host keeps next to the connection's buffers; the endpoint knows
//! which link group, link and RMB element each connection uses.
//!
//! # How it is driven
//!
//! The endpoint reads no clock, opens no socket and starts no thread. Its host (the
//! runtime, or the simulator in tests):
//!
//! 1. registers its RDMA devices ([`Endpoint::add_device`]; [`Endpoint::add_link_device`]
//!    for those that may also carry additional links);
//! 2. starts a rendezvous per TCP connection ([`Endpoint::connect`],
//!    [`Endpoint::accept`]), reads at most [`Endpoint::bytes_wanted`] bytes from it when
//!    readable and passes them to [`Endpoint::handle_tcp_bytes`]; reports EOF
//!    ([`Endpoint::handle_tcp_fin`]) and errors ([`Endpoint::handle_tcp_error`]);
//! 3. reports what its RDMA links did: LLC messages received
//!    ([`Endpoint::handle_llc`]), LLC send completions ([`Endpoint::handle_llc_sent`]),
//!    QP errors ([`Endpoint::handle_link_error`]), receive activity
//!    ([`Endpoint::link_activity`]);
//! 4. reports what established connections' TCP sockets did
//!    ([`Endpoint::conn_tcp_fin`], [`Endpoint::conn_tcp_error`]) and when a connection is
//!    closed and no longer used ([`Endpoint::conn_released`]);
//! 5. calls [`Endpoint::handle_timeout`] at [`Endpoint::poll_timeout`];
//! 6. after every call, drains [`Endpoint::poll_output`] in order.
//!
//! Verbs objects are created synchronously through the [`Host`] trait (a QP's number and
//! an RMB's RKey are needed in the very CLC message being built); everything that goes
//! on a wire comes out as an [`Output`].

mod env;
mod lgr;
mod llc_glue;
mod rendezvous;
#[cfg(any(test, feature = "testing"))]
pub mod sim;
pub mod tokens;

use ::core::net::IpAddr;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use smc_wire::clc::SameHostOffer;
use smc_wire::common::{BufSize, Gid, Mac, QpMtu};

use crate::clc::{
    self, ClcConfig, ClientRoute, Contact, Eligibility, FallbackReason, LgrId, Rendezvous,
    ResetReason, ServerRoute, V2Route,
};
use crate::conn::{AbortReason, ConnParams};
use crate::llc::{self, DeviceId, QpInfo, RToken, SendId};

use self::lgr::Lgr;
use self::rendezvous::{Note, Rdv};

pub use self::lgr::{LgrListing, LinkListing};

/// A TCP connection, as the host names it (a rendezvous, then the connection it became).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TcpId(pub u64);

/// One connection's buffer sizes, where they differ from [`EndpointConfig::rmb_size`]
/// and [`EndpointConfig::sndbuf_size`]: what a socket's SO_RCVBUF and SO_SNDBUF ask
/// for (Linux sizes an SMC socket's RMB and send buffer from sk_rcvbuf and sk_sndbuf).
/// The RMB size is rounded up to the compressed notation (RFC 7609 A.2.3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BufSizes {
    /// RMB element bytes.
    pub rmb: Option<usize>,
    /// Send buffer bytes.
    pub sndbuf: Option<u32>,
}

/// What the endpoint is configured with.
#[derive(Clone, Debug)]
pub struct EndpointConfig {
    /// Rendezvous details (versions, UEIDs, timers, host name).
    pub clc: ClcConfig,
    /// Size of each connection's RMB element (rounded up to the compressed notation of
    /// RFC 7609 A.2.3: 16 KiB × 2^n, at most Linux's largest).
    pub rmb_size: usize,
    /// Size of each connection's send buffer.
    pub sndbuf_size: u32,
    /// Free RMBs kept per link group for reuse; beyond that a freed RMB is deleted with
    /// DELETE RKEY.
    pub rmb_cache: usize,
    /// A link group without connections lives this long (§3.5.4; the client 10 s more,
    /// so that the server ends it).
    pub lgr_idle_timeout: Duration,
    /// TEST LINK after this long without traffic on a link; `None`: no keepalive.
    pub keepalive: Option<Duration>,
    /// LLC reply timer.
    pub llc_reply_timeout: Duration,
    /// The server tries again this long after adding a link failed or a link was lost
    /// (RFC 7609 C.8; 60 s by default), so a path that came back carries a link again.
    pub add_link_retry: Duration,
    /// The host can move a connection to another link of its link group
    /// ([`ConnAction::Failover`], RFC 7609 §4.6). Without it, the connections on a lost
    /// link end ([`ConnAction::Kill`]) even when another link survives.
    pub failover: bool,
}

/// One of the host's RDMA devices (port), for links and CLC messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The host's name for it.
    pub id: DeviceId,
    /// GID (RoCEv2: the IPv4-mapped or IPv6 address).
    pub gid: Gid,
    /// The port's MAC.
    pub mac: Mac,
    /// Largest path MTU of the port.
    pub mtu: QpMtu,
}

/// Why the host could not do what the endpoint asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HostError(pub String);

/// What the endpoint needs done synchronously by its host: verbs objects, memory and
/// tokens (the answers go into the CLC message being built), and two lookups.
pub trait Host {
    /// A new link's QP on `device`: its own PD (RFC 7609 §2.1), receive buffers
    /// posted, state INIT. Returns its number, initial send PSN and path MTU.
    fn create_link(
        &mut self,
        lgr: LgrId,
        link: llc::LinkId,
        device: DeviceId,
    ) -> Result<QpInfo, HostError>;
    /// Moves the link's QP to RTR and RTS towards the peer (RFC 7609 §3.5.1.3).
    fn connect_link(
        &mut self,
        lgr: LgrId,
        link: llc::LinkId,
        peer: &llc::PeerQp,
    ) -> Result<(), HostError>;
    /// Destroys the link's QP and its memory registrations (flushing its work).
    fn destroy_link(&mut self, lgr: LgrId, link: llc::LinkId);
    /// Allocates an RMB of `size` bytes for link group `lgr` (zeroed).
    fn create_rmb(&mut self, lgr: LgrId, rmb: llc::RmbId, size: usize) -> Result<(), HostError>;
    /// Registers the RMB on a link's PD for remote writes; returns its RToken there.
    fn register_rmb(
        &mut self,
        lgr: LgrId,
        rmb: llc::RmbId,
        link: llc::LinkId,
    ) -> Result<RToken, HostError>;
    /// Zeroes an RMB element before it is used again (RFC 7609 §4.1, CHECKLIST RE-3).
    fn clear_rmb(&mut self, lgr: LgrId, rmb: llc::RmbId);
    /// Unregisters and frees an RMB.
    fn free_rmb(&mut self, lgr: LgrId, rmb: llc::RmbId);
    /// A fresh alert token for a connection of `lgr` (see [`tokens::TokenTable`]);
    /// `None` when none is left.
    fn alloc_token(&mut self, lgr: LgrId) -> Option<u32>;
    /// Gives an alert token back.
    fn release_token(&mut self, token: u32);
    /// How the peer's RoCEv2 GID is reached from `local` (Linux `smc_ib_find_route`);
    /// `None` without a direct route.
    fn route_v2(&mut self, local: IpAddr, peer: IpAddr, peer_gid: Gid) -> Option<V2Route>;
    /// The connection may still RDMA-write into its peer's RMB element (its state is
    /// Active or AppCloseWait1): for the RMBE conflict rule of RFC 7609 §4.4.2.
    fn conn_may_write(&mut self, token: u32) -> bool;
    /// Server: prove that the client behind `tcp` is an smc-rs stack on this host and
    /// set the connection's shared memory up with it (see
    /// [`clc::ClcEnv::server_same_host`]): taken now, later (the outcome then comes
    /// through [`Endpoint::same_host_done`]) or not. The default (hosts without the
    /// same-host path, the simulator) takes no offer.
    fn same_host_server(&mut self, _tcp: TcpId, _offer: &SameHostOffer) -> clc::ServerSameHost {
        clc::ServerSameHost::No
    }
    /// Client: is the shared memory of our offer `nonce` on `tcp`, taken by the server's
    /// stack `server_stack`, ready?
    fn same_host_client(&mut self, _tcp: TcpId, _nonce: u64, _server_stack: u64) -> bool {
        false
    }
}

/// Something for the host to do, in order.
#[derive(Debug)]
pub enum Output {
    /// Write these CLC bytes on the rendezvous' TCP connection.
    TcpSend {
        /// The connection.
        tcp: TcpId,
        /// The bytes (one CLC message).
        bytes: Vec<u8>,
    },
    /// The rendezvous on `tcp` is over.
    Rendezvous {
        /// The connection.
        tcp: TcpId,
        /// How it ended.
        outcome: RendezvousOutcome,
    },
    /// Post an LLC message (RC SEND) on a link; report the completion with
    /// [`Endpoint::handle_llc_sent`] (also when posting fails: `ok = false`).
    LlcSend {
        /// The link group.
        lgr: LgrId,
        /// The link.
        link: llc::LinkId,
        /// For the completion.
        id: SendId,
        /// The encoded message.
        bytes: Vec<u8>,
    },
    /// Something an established connection must do.
    Conn {
        /// The connection.
        token: u32,
        /// What.
        action: ConnAction,
    },
}

/// How a rendezvous ended.
#[derive(Debug)]
pub enum RendezvousOutcome {
    /// SMC-R: create the connection ([`NewConn`]).
    Smc(Box<NewConn>),
    /// Plain TCP on the same connection.
    Fallback(FallbackReason),
    /// Reset the TCP connection (RST).
    Reset(ResetReason),
    /// smc-rs's same-host path: create the connection over the shared memory the host
    /// prepared for this nonce ([`Host::same_host_server`] / [`Host::same_host_client`]).
    SameHost(clc::SameHostEstablished),
}

/// A connection that will use SMC-R: what the host needs to create its `Conn` machine
/// and its data path.
#[derive(Clone, Debug)]
pub struct NewConn {
    /// Our alert token: the connection's name from now on.
    pub token: u32,
    /// Its link group.
    pub lgr: LgrId,
    /// The link its data goes on.
    pub link: llc::LinkId,
    /// Our RMB (one element, index 1, like Linux).
    pub rmb: llc::RmbId,
    /// Parameters of the `Conn` machine.
    pub params: ConnParams,
    /// The peer's RMB element: RKey on `link`, and the address of the element's first
    /// byte (element i of the peer's RMB starts at vaddr + (i − 1)·size, AMB-10).
    pub peer_rkey: u32,
    /// See `peer_rkey`.
    pub peer_base: u64,
    /// SMC-R version (1 or 2).
    pub version: u8,
    /// First, parallel or subsequent contact.
    pub contact: Contact,
}

/// What an established connection must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnAction {
    /// End at once, no CDC possible or allowed (link lost; the peer reassigned its RMB
    /// element): `Conn::kill`.
    Kill(AbortReason),
    /// The peer reset the TCP connection (RFC 7609 §4.8.2): `Conn::on_tcp_reset`.
    TcpReset,
    /// The connection's link is gone and another link of the link group is active: move
    /// the connection there (RFC 7609 §4.6). Once every work request the connection
    /// posted on the old link has completed (successfully or in error, §2.3), call
    /// `Conn::prepare_failover`, send the validation CDC it returns first on the new link,
    /// then go on transmitting there, RDMA-writing with the new RKey and base. Stop
    /// transmitting on the old link at once.
    Failover(FailoverTarget),
}

/// Where a connection moves in a failover ([`ConnAction::Failover`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailoverTarget {
    /// The link the connection uses from now on.
    pub link: llc::LinkId,
    /// The peer's RMB element on that link: its RKey there.
    pub peer_rkey: u32,
    /// The element's first byte, in the peer's address space of that link.
    pub peer_base: u64,
}

/// Counters of an endpoint (ever since it started).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Rendezvous that ended in SMC-R.
    pub smc_total: u64,
    /// ... with a new link group.
    pub first_contacts: u64,
    /// Rendezvous that fell back to TCP.
    pub fallbacks: u64,
    /// Rendezvous that ended in a TCP reset.
    pub resets: u64,
    /// RMBs deleted with DELETE RKEY.
    pub rmbs_deleted: u64,
    /// Link groups ended.
    pub lgrs_ended: u64,
    /// Links that failed.
    pub links_failed: u64,
    /// Connections moved to another link because theirs went down (RFC 7609 §4.6).
    pub failovers: u64,
    /// LLC messages received.
    pub llc_received: u64,
    /// Peer LLC requests dropped as a flood.
    pub llc_dropped: u64,
    /// Rendezvous that ended on the same-host path.
    pub same_host_total: u64,
}

/// What the endpoint knows of an established connection.
#[derive(Clone, Copy, Debug)]
struct ConnEntry {
    lgr: LgrId,
    link: llc::LinkId,
    rmb: u32,
    first_contact: bool,
    /// The peer's RMB in the llc machine's RToken sets, to find its RKey on another link
    /// in a failover (`None`: unknown, the connection cannot move).
    peer_rmb: Option<llc::PeerRmbId>,
    /// Offset of the peer's RMB element in its RMB (AMB-10: (index − 1) · size).
    peer_off: u64,
}

/// A server first contact from `peer` counted in `Endpoint::server_first_pending`
/// settled (done or failed): rendezvous from that address may go on.
fn first_contact_settled(pending: &mut BTreeMap<IpAddr, usize>, peer: Option<IpAddr>) {
    let Some(ip) = peer else { return };
    if let Some(n) = pending.get_mut(&ip) {
        *n -= 1;
        if *n == 0 {
            pending.remove(&ip);
        }
    }
}

/// See the [module documentation](self).
pub struct Endpoint {
    cfg: EndpointConfig,
    rmb_size: BufSize,
    devices: Vec<DeviceInfo>,
    /// Devices that may carry additional links of every link group (RFC 7609 §2.2,
    /// §3.5.1.6); besides these a link group only knows the device of its first link.
    link_devices: Vec<llc::DeviceId>,
    lgrs: BTreeMap<LgrId, Lgr>,
    next_lgr: u64,
    rdvs: BTreeMap<TcpId, Rdv>,
    conns: BTreeMap<u32, ConnEntry>,
    /// Server link groups whose first contact is still running, by the peer's address:
    /// new rendezvous from that address wait (Linux `smc_server_lgr_pending`), so that
    /// concurrent connections from one peer share the link group instead of creating
    /// parallel ones. Only that address waits (Linux serializes every first contact
    /// behind one mutex): a peer that stalls its own first contact as long as the timers
    /// allow would otherwise delay other peers' rendezvous past their CLC timers, and
    /// they would be reset; a peer may only affect its own connections (issue 10).
    server_first_pending: BTreeMap<IpAddr, usize>,
    /// Link groups whose llc machine may have outputs.
    dirty: BTreeSet<LgrId>,
    /// Milestones for rendezvous, delivered after the current step.
    notes: VecDeque<(TcpId, Note)>,
    out: VecDeque<Output>,
    counters: Counters,
}

impl Endpoint {
    /// An endpoint with no device, link group or rendezvous yet.
    pub fn new(cfg: EndpointConfig) -> Endpoint {
        let rmb_size = BufSize::encode(cfg.rmb_size, BufSize::LINUX_MAX_CODE);
        Endpoint {
            cfg,
            rmb_size,
            devices: Vec::new(),
            link_devices: Vec::new(),
            lgrs: BTreeMap::new(),
            next_lgr: 0,
            rdvs: BTreeMap::new(),
            conns: BTreeMap::new(),
            server_first_pending: BTreeMap::new(),
            dirty: BTreeSet::new(),
            notes: VecDeque::new(),
            out: VecDeque::new(),
            counters: Counters::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EndpointConfig {
        &self.cfg
    }

    /// Registers a device (links and CLC messages use its GID, MAC and MTU). A device
    /// with an id already known replaces it.
    pub fn add_device(&mut self, dev: DeviceInfo) {
        match self.devices.iter_mut().find(|d| d.id == dev.id) {
            Some(d) => *d = dev,
            None => self.devices.push(dev),
        }
    }

    /// Registers a device (as [`Endpoint::add_device`]) that may also carry additional
    /// links: every link group's llc machine learns it, so the server adds a link over it
    /// (ADD LINK, RFC 7609 §3.5.1.6, §3.5.5.1.1) and the client accepts one on it. With
    /// two such devices on both sides, link groups get two symmetric links.
    pub fn add_link_device(&mut self, now: Instant, host: &mut dyn Host, dev: DeviceInfo) {
        self.add_device(dev);
        if self.link_devices.contains(&dev.id) {
            return;
        }
        self.link_devices.push(dev.id);
        let ids: Vec<LgrId> = self.lgrs.keys().copied().collect();
        for id in ids {
            if let Some(l) = self.lgrs.get_mut(&id).and_then(|g| g.llc.as_mut()) {
                l.add_device(
                    now,
                    llc::Device {
                        id: dev.id,
                        mac: dev.mac,
                        gid: dev.gid,
                    },
                );
                self.dirty.insert(id);
            }
        }
        self.settle(now, host);
    }

    /// The devices a new link group's llc machine knows: the first link's, then every
    /// link device.
    fn llc_devices(&self, first: DeviceId) -> Vec<llc::Device> {
        std::iter::once(first)
            .chain(self.link_devices.iter().copied().filter(|d| *d != first))
            .filter_map(|id| self.device(id))
            .map(|d| llc::Device {
                id: d.id,
                mac: d.mac,
                gid: d.gid,
            })
            .collect()
    }

    fn device(&self, id: DeviceId) -> Option<DeviceInfo> {
        self.devices.iter().find(|d| d.id == id).copied()
    }

    /// Client: the TCP connection `tcp` (from `local` to `peer`) is up; start the
    /// rendezvous (the Proposal goes out at once, or a not-eligible connection ends in
    /// a fallback). `device`: the RDMA device of the connection's route, if any.
    #[allow(clippy::too_many_arguments)]
    pub fn connect(
        &mut self,
        now: Instant,
        host: &mut dyn Host,
        tcp: TcpId,
        local: IpAddr,
        peer: IpAddr,
        route: ClientRoute,
        eligibility: Eligibility,
        device: Option<DeviceId>,
        bufs: BufSizes,
    ) {
        let m = Rendezvous::client(now, &self.cfg.clc, route, eligibility);
        self.rdvs
            .insert(tcp, Rdv::new(m, local, peer, device, true, bufs));
        self.step(now, host, tcp, |_, _| {});
        self.settle(now, host);
    }

    /// Server: a TCP connection `tcp` was accepted; start the rendezvous (wait for the
    /// Proposal, or end at once in a fallback when not eligible).
    #[allow(clippy::too_many_arguments)]
    pub fn accept(
        &mut self,
        now: Instant,
        host: &mut dyn Host,
        tcp: TcpId,
        local: IpAddr,
        peer: IpAddr,
        route: ServerRoute,
        eligibility: Eligibility,
        device: Option<DeviceId>,
        bufs: BufSizes,
    ) {
        let m = Rendezvous::server(now, &self.cfg.clc, route, eligibility);
        self.rdvs
            .insert(tcp, Rdv::new(m, local, peer, device, false, bufs));
        self.step(now, host, tcp, |_, _| {});
        self.settle(now, host);
    }

    /// How many bytes to read from `tcp` now and pass to [`Endpoint::handle_tcp_bytes`]:
    /// 0 while no CLC message is expected, and for a server rendezvous that has not
    /// started while another first contact runs (the bytes wait in the socket).
    pub fn bytes_wanted(&self, tcp: TcpId) -> usize {
        let Some(r) = self.rdvs.get(&tcp) else {
            return 0;
        };
        if self.gated(r) {
            return 0;
        }
        r.machine.bytes_wanted()
    }

    /// Server rendezvous wait for a running first contact from the same address before
    /// reading anything.
    fn gated(&self, r: &Rdv) -> bool {
        !r.started
            && r.machine.role() == clc::Role::Server
            && self.server_first_pending.contains_key(&r.peer)
    }

    /// The TCP connections of running rendezvous.
    pub fn rendezvous(&self) -> impl Iterator<Item = TcpId> + '_ {
        self.rdvs.keys().copied()
    }

    /// Bytes read from a rendezvous' TCP connection (at most [`Endpoint::bytes_wanted`]).
    /// Returns how many were taken.
    pub fn handle_tcp_bytes(
        &mut self,
        now: Instant,
        host: &mut dyn Host,
        tcp: TcpId,
        bytes: &[u8],
    ) -> usize {
        let mut took = 0;
        self.step(now, host, tcp, |r, env| {
            r.started = true;
            took = r.machine.handle_tcp_bytes(now, bytes, env);
        });
        self.settle(now, host);
        took
    }

    /// Server: the outcome of the same-host exchange the host ran elsewhere
    /// ([`clc::ServerSameHost::Later`]) for the rendezvous on `tcp`: `Some(our stack id)`
    /// when the offer is taken. A rendezvous that no longer waits for it (ended, or
    /// answered with SMC-R when its wait expired) ignores it: the host then gives back
    /// what the exchange set up.
    pub fn same_host_done(
        &mut self,
        now: Instant,
        host: &mut dyn Host,
        tcp: TcpId,
        taken: Option<u64>,
    ) {
        self.step(now, host, tcp, |r, env| {
            r.machine.handle_same_host(now, taken, env)
        });
        self.settle(now, host);
    }

    /// The peer's FIN on a rendezvous' TCP connection.
    pub fn handle_tcp_fin(&mut self, now: Instant, host: &mut dyn Host, tcp: TcpId) {
        self.step(now, host, tcp, |r, env| r.machine.handle_tcp_fin(now, env));
        self.settle(now, host);
    }

    /// A rendezvous' TCP connection failed (error or RST).
    pub fn handle_tcp_error(&mut self, now: Instant, host: &mut dyn Host, tcp: TcpId) {
        self.step(now, host, tcp, |r, env| {
            r.machine.handle_tcp_closed(now, env)
        });
        self.settle(now, host);
    }

    /// The host gives up on a rendezvous (its caller went away, or the host stops): it
    /// ends in a reset, and what it allocated is given back.
    pub fn abandon_rendezvous(&mut self, now: Instant, host: &mut dyn Host, tcp: TcpId) {
        self.handle_tcp_error(now, host, tcp);
    }

    /// An LLC message received on a link.
    pub fn handle_llc(
        &mut self,
        now: Instant,
        host: &mut dyn Host,
        lgr: LgrId,
        link: llc::LinkId,
        bytes: &[u8],
    ) {
        if let Some(l) = self.lgrs.get_mut(&lgr).and_then(|g| g.llc.as_mut()) {
            self.counters.llc_received += 1;
            let dropped = l.dropped_requests();
            l.on_link_activity(now, link);
            l.handle_llc_bytes(now, link, bytes);
            self.counters.llc_dropped += l.dropped_requests() - dropped;
            self.dirty.insert(lgr);
        }
        self.settle(now, host);
    }

    /// An LLC SEND completed (or could not be posted: `ok = false`).
    pub fn handle_llc_sent(
        &mut self,
        now: Instant,
        host: &mut dyn Host,
        lgr: LgrId,
        link: llc::LinkId,
        id: SendId,
        ok: bool,
    ) {
        if let Some(l) = self.lgrs.get_mut(&lgr).and_then(|g| g.llc.as_mut()) {
            l.on_send_complete(now, link, id, ok);
            self.dirty.insert(lgr);
        }
        self.settle(now, host);
    }

    /// A link's QP failed (a work request completed in error, an async event).
    pub fn handle_link_error(
        &mut self,
        now: Instant,
        host: &mut dyn Host,
        lgr: LgrId,
        link: llc::LinkId,
    ) {
        if let Some(l) = self.lgrs.get_mut(&lgr).and_then(|g| g.llc.as_mut()) {
            l.on_link_error(now, link);
            self.dirty.insert(lgr);
        }
        self.settle(now, host);
    }

    /// Something arrived on a link (keepalive: no TEST LINK while traffic flows).
    pub fn link_activity(&mut self, now: Instant, lgr: LgrId, link: llc::LinkId) {
        if let Some(l) = self.lgrs.get_mut(&lgr).and_then(|g| g.llc.as_mut()) {
            l.on_link_activity(now, link);
        }
    }

    /// The peer's TCP FIN on an established connection's TCP socket. `peer_closing`:
    /// the connection has seen the peer's SMC-R close or abort flags.
    ///
    /// RFC 7609 §4.8: the FIN follows the SMC-R close flows, but a live peer may shut
    /// its TCP socket before its last CDC arrives (Linux `smc_shutdown` shuts the TCP
    /// socket at once; a RoCE retransmission can delay the CDC by seconds), so a FIN
    /// without them ends nothing. A peer process that died sends nothing more either:
    /// its link is probed (TEST LINK) unless it hears from the peer within
    /// [`crate::llc::LlcTimers::fin_probe_grace`] (usually the very close flags the FIN
    /// overtook: most FINs of a live peer then cost no LLC exchange); if the probe fails,
    /// the link goes down with its connections.
    pub fn conn_tcp_fin(
        &mut self,
        now: Instant,
        host: &mut dyn Host,
        token: u32,
        peer_closing: bool,
    ) {
        if peer_closing {
            return;
        }
        let Some(c) = self.conns.get(&token).copied() else {
            return;
        };
        if let Some(l) = self.lgrs.get_mut(&c.lgr).and_then(|g| g.llc.as_mut()) {
            tracing::debug!(
                token,
                "peer's TCP FIN before its SMC-R close: the link is probed unless it hears from the peer"
            );
            l.probe_link_deferred(now, c.link);
            self.dirty.insert(c.lgr);
        }
        self.settle(now, host);
    }

    /// An established connection's TCP socket was reset by the peer (or failed): the
    /// connection aborts (RFC 7609 §4.8.2).
    pub fn conn_tcp_error(&mut self, token: u32) {
        if self.conns.contains_key(&token) {
            self.out.push_back(Output::Conn {
                token,
                action: ConnAction::TcpReset,
            });
        }
    }

    /// A connection is CLOSED and no longer used by the application: its RMB element
    /// and alert token are given back (the RMB is kept for reuse or deleted with DELETE
    /// RKEY), and its link group may go idle.
    pub fn conn_released(&mut self, now: Instant, host: &mut dyn Host, token: u32) {
        let Some(c) = self.conns.remove(&token) else {
            return;
        };
        self.forget_conn(now, host, token, c);
        self.settle(now, host);
    }

    /// The host could not create a connection the endpoint declared established (out of
    /// memory): everything is given back; the host resets the TCP connection (RFC 7609
    /// C.1, after the point of no return).
    pub fn conn_setup_failed(&mut self, now: Instant, host: &mut dyn Host, token: u32) {
        let Some(c) = self.conns.remove(&token) else {
            return;
        };
        self.counters.smc_total -= 1;
        if c.first_contact {
            self.counters.first_contacts -= 1;
        }
        self.counters.resets += 1;
        self.forget_conn(now, host, token, c);
        self.settle(now, host);
    }

    fn forget_conn(&mut self, now: Instant, host: &mut dyn Host, token: u32, c: ConnEntry) {
        match self.lgrs.get_mut(&c.lgr) {
            Some(g) => {
                g.conns.remove(&token);
                g.peer_rmbes.retain(|_, v| *v != token);
                g.release_rmb(host, &self.cfg, c.rmb, now, false);
                self.dirty.insert(c.lgr);
            }
            None => host.release_token(token),
        }
        self.update_idle(now, host, c.lgr);
    }

    /// When [`Endpoint::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut d: Option<Instant> = None;
        let mut upd = |t: Option<Instant>| {
            if let Some(t) = t {
                d = Some(d.map_or(t, |x| x.min(t)));
            }
        };
        for g in self.lgrs.values() {
            upd(g.llc.as_ref().and_then(|l| l.poll_timeout()));
        }
        for r in self.rdvs.values() {
            upd(r.machine.poll_timeout());
        }
        d
    }

    /// Runs the timers that are due.
    pub fn handle_timeout(&mut self, now: Instant, host: &mut dyn Host) {
        let due: Vec<LgrId> = self
            .lgrs
            .iter()
            .filter(|(_, g)| {
                g.llc
                    .as_ref()
                    .and_then(|l| l.poll_timeout())
                    .is_some_and(|t| t <= now)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            if let Some(l) = self.lgrs.get_mut(&id).and_then(|g| g.llc.as_mut()) {
                l.on_timeout(now);
                self.dirty.insert(id);
            }
        }
        let due: Vec<TcpId> = self
            .rdvs
            .iter()
            .filter(|(_, r)| r.machine.poll_timeout().is_some_and(|t| t <= now))
            .map(|(id, _)| *id)
            .collect();
        for tcp in due {
            self.step(now, host, tcp, |r, env| r.machine.on_timeout(now, env));
        }
        self.settle(now, host);
    }

    /// Ends every link group (DELETE LINK, orderly); their connections are killed.
    pub fn terminate_all(&mut self, now: Instant, host: &mut dyn Host) {
        let ids: Vec<LgrId> = self.lgrs.keys().copied().collect();
        for id in ids {
            if let Some(l) = self.lgrs.get_mut(&id).and_then(|g| g.llc.as_mut()) {
                l.terminate(now);
                self.dirty.insert(id);
            }
        }
        self.settle(now, host);
    }

    /// Some link group is still active (not terminated).
    pub fn has_active_link_groups(&self) -> bool {
        self.lgrs.values().any(|g| g.active())
    }

    /// The next thing for the host to do.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// Counters.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Running rendezvous.
    pub fn rendezvous_count(&self) -> usize {
        self.rdvs.len()
    }

    /// Link groups, for listings.
    pub fn link_groups(&self) -> Vec<LgrListing> {
        self.lgrs
            .values()
            .filter(|g| !g.terminated)
            .map(|g| g.listing())
            .collect()
    }

    /// RMBs registered, and elements in use, over all link groups.
    pub fn rmb_counts(&self) -> (usize, usize) {
        self.lgrs
            .values()
            .fold((0, 0), |(a, b), g| (a + g.rmbs.len(), b + g.in_use()))
    }

    /// Links (QPs) over all link groups.
    pub fn link_count(&self) -> usize {
        self.lgrs.values().map(|g| g.links.len()).sum()
    }

    /// Runs link-group outputs and rendezvous milestones until nothing is left.
    fn settle(&mut self, now: Instant, host: &mut dyn Host) {
        loop {
            if let Some(id) = self.dirty.pop_first() {
                self.process_lgr(now, host, id);
                continue;
            }
            if let Some((tcp, note)) = self.notes.pop_front() {
                self.step(now, host, tcp, |r, env| match note {
                    Note::Link(e) => r.machine.handle_link_event(now, e, env),
                    Note::Rkey(res) => r.machine.handle_rkey_confirmed(now, res, env),
                });
                continue;
            }
            break;
        }
    }

    fn update_idle(&mut self, now: Instant, host: &mut dyn Host, id: LgrId) {
        let Some(g) = self.lgrs.get_mut(&id) else {
            return;
        };
        let idle = g.conns.is_empty() && g.rendezvous == 0;
        if idle != g.idle {
            g.idle = idle;
            if let Some(l) = g.llc.as_mut() {
                l.set_idle(now, idle);
                self.dirty.insert(id);
            }
        }
        self.finish_lgr_if_gone(host, id);
    }

    /// Drops a terminated link group's verbs objects once nothing needs them.
    fn finish_lgr_if_gone(&mut self, host: &mut dyn Host, id: LgrId) {
        let Some(g) = self.lgrs.get_mut(&id) else {
            return;
        };
        let gone = g.terminated || g.llc.as_ref().is_some_and(|l| l.is_terminated());
        if !gone {
            return;
        }
        g.terminated = true;
        for link in std::mem::take(&mut g.links).into_keys() {
            host.destroy_link(id, link);
        }
        if g.conns.is_empty() && g.rendezvous == 0 {
            let pending = g.counted_pending.take();
            first_contact_settled(&mut self.server_first_pending, pending);
            for (rmb, r) in std::mem::take(&mut g.rmbs) {
                // An element a failed rendezvous still held (its link group is
                // abandoned as a whole) gives its alert token back here.
                if let Some(t) = r.token {
                    host.release_token(t);
                }
                host.free_rmb(id, llc::RmbId(rmb));
            }
            tracing::debug!(lgr = id.0, "link group freed");
            self.lgrs.remove(&id);
        }
    }

    /// The connections on `link` leave it (RFC 7609 §4.6): each moves to an active link of
    /// the link group on which the peer's RMB has an RToken ([`ConnAction::Failover`]);
    /// one that cannot move (no such link, or the host does not fail over) ends
    /// ([`ConnAction::Kill`]).
    fn fail_over_link(&mut self, lgr: LgrId, link: llc::LinkId) {
        let Some(g) = self.lgrs.get(&lgr) else { return };
        let on: Vec<u32> = g
            .conns
            .iter()
            .copied()
            .filter(|t| self.conns.get(t).is_some_and(|c| c.link == link))
            .collect();
        let total = on.len();
        let mut ended = 0;
        for token in on {
            if !self.fail_over_conn(lgr, token) {
                ended += 1;
            }
        }
        if ended > 0 {
            tracing::warn!(
                lgr = lgr.0,
                %link,
                ended,
                total,
                "connections of the lost link could not fail over (no usable link left)"
            );
        }
    }

    /// Moves one connection off its link (see [`Endpoint::fail_over_link`]); false when
    /// it could not move and ends.
    fn fail_over_conn(&mut self, lgr: LgrId, token: u32) -> bool {
        let target = self.failover_target(lgr, token);
        let action = match target {
            Some(t) => {
                if let Some(c) = self.conns.get_mut(&token) {
                    tracing::info!(
                        lgr = lgr.0,
                        token = format_args!("{token:#x}"),
                        from = %c.link,
                        to = %t.link,
                        "connection fails over"
                    );
                    c.link = t.link;
                }
                self.counters.failovers += 1;
                ConnAction::Failover(t)
            }
            None => {
                // §4.8.3: no active link on which the peer's RMB has an RToken.
                tracing::debug!(
                    lgr = lgr.0,
                    token = format_args!("{token:#x}"),
                    "connection cannot fail over: it ends"
                );
                ConnAction::Kill(AbortReason::LinkLost)
            }
        };
        let moved = matches!(action, ConnAction::Failover(_));
        self.out.push_back(Output::Conn { token, action });
        moved
    }

    fn failover_target(&self, lgr: LgrId, token: u32) -> Option<FailoverTarget> {
        if !self.cfg.failover {
            return None;
        }
        let c = self.conns.get(&token)?;
        let lg = self.lgrs.get(&lgr)?.llc.as_ref()?;
        let peer_rmb = c.peer_rmb?;
        lg.links()
            .filter(|i| i.state == llc::LinkState::Active && i.id != c.link)
            .find_map(|i| {
                let t = lg.peer_token(peer_rmb, i.id)?;
                Some(FailoverTarget {
                    link: i.id,
                    peer_rkey: t.rkey,
                    peer_base: t.vaddr.wrapping_add(c.peer_off),
                })
            })
    }

    /// Whether a connection may use `link` (it is active in its llc machine).
    fn link_active(&self, lgr: LgrId, link: llc::LinkId) -> bool {
        self.lgrs
            .get(&lgr)
            .and_then(|g| g.llc.as_ref())
            .and_then(|l| l.link(link))
            .is_some_and(|i| i.state == llc::LinkState::Active)
    }

    /// Kills (Output) every connection of a link group.
    fn kill_conns(&mut self, lgr: LgrId, reason: AbortReason) {
        let Some(g) = self.lgrs.get(&lgr) else { return };
        for t in &g.conns {
            if self.conns.contains_key(t) {
                self.out.push_back(Output::Conn {
                    token: *t,
                    action: ConnAction::Kill(reason),
                });
            }
        }
    }
}
