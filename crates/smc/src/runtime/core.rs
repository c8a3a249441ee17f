//! The event thread: rendezvous I/O, link groups (the llc machines and their QPs and
//! RMBs), timers, TCP monitoring and the release of closed connections. Everything here
//! runs under the stack's core lock, on the event thread, except the `register_*`
//! entry points and the listings, which take the lock briefly from API threads.
//!
//! The choreography between the machines follows docs/core-design.md: the clc
//! machines call [`ClcEnv`] synchronously ([`Env`]), the llc machine's first-contact
//! milestones go back to the rendezvous as [`LinkEvent`]s, CONFIRM RKEY results as
//! `handle_rkey_confirmed`, and a finished rendezvous becomes a `conn` machine.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io::{self, ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use arrayvec::ArrayVec;
use smc_bpf::{ClcBasis, Decision, Outcome as OptOutcome};
use smc_verbs::{AccessFlags, Device, Mr, Mtu, RdmaBuffer};
use smc_wire::clc::Ipv6Prefix;
use smc_wire::common::{BufSize, Eid, Gid, Mac, PeerId, QpMtu, U24};
use smc_wire::decline::DeclineCode;
use smc_wire::llc::LlcFormat;
use tracing::{debug, info, trace, warn};

use super::conn::{ConnShared, ConnState};
use super::link::{LinkRes, PeerQpAttr};
use super::sys;
use super::{
    ConnInfo, ConnectSlot, Established, Inbox, Inner, LinkGroupId, LinkGroupInfo, LinkListing,
    ListenerShared, Stats,
};
use crate::clc::{
    self, AcceptQuery, ClcEnv, ClientLgrRequest, ClientLookup, ClientMachine, ClientRoute,
    ClientV2Route, ConnRef, Eligibility, LgrId, LgrLookup, LgrQuery, LinkEvent, LinkFailure,
    LocalDevice, LocalLink, LocalPrefix, Outcome, Output, PeerLinkId, PeerQp, PeerRmb, ProposalIp,
    RmbAlloc, RmbId, ServerLgrRequest, ServerMachine, ServerRoute, SmcVersion, V2Params, V2Route,
};
use crate::conn::{AbortReason, Conn, ConnParams, RmbeGeometry, State};
use crate::llc::{self, LinkGroup, LlcConfig, RToken};

/// Longest single `poll()` sleep (guards against a missed wake-up).
const MAX_SLEEP: Duration = Duration::from_millis(500);

// ---------------------------------------------------------------------------------------
// State

#[derive(Default)]
pub(crate) struct Core {
    lgrs: BTreeMap<LgrId, Lgr>,
    next_lgr: u64,
    handshakes: BTreeMap<u64, Handshake>,
    next_hs: u64,
    listeners: BTreeMap<u64, Arc<ListenerShared>>,
    next_listener: u64,
    conns: BTreeMap<u32, Arc<ConnShared>>,
    /// Devices by local address; the index is the llc `DeviceId`.
    devices: Vec<(IpAddr, Device)>,
    /// Server link groups whose first contact is still running: new rendezvous wait
    /// (Linux `smc_server_lgr_pending`), so that concurrent connections from one peer
    /// share the link group instead of creating parallel ones.
    server_first_pending: usize,
    dirty: BTreeSet<LgrId>,
    notes: VecDeque<(u64, Note)>,
    /// Addresses whose device could not be opened (warned once).
    device_errors: BTreeSet<IpAddr>,
}

enum Note {
    Link(LinkEvent),
    Rkey(Result<(), DeclineCode>),
    /// A newly accepted connection: drain the machine's first outputs (an immediate
    /// fallback when CLC is not allowed on it).
    Drain,
}

struct Rmb {
    buf: Arc<RdmaBuffer>,
    mrs: BTreeMap<llc::LinkId, Mr>,
    token: Option<u32>,
    in_use: bool,
    /// The llc machine knows it (first RMB, or add_rmb called).
    announced: bool,
    deleting: bool,
}

struct Lgr {
    id: LgrId,
    role: clc::Role,
    version: SmcVersion,
    peer_id: PeerId,
    peer_gid: Gid,
    eid: Option<Eid>,
    max_conns: usize,
    device_id: llc::DeviceId,
    device: Device,
    links: BTreeMap<llc::LinkId, Arc<LinkRes>>,
    llc: Option<LinkGroup>,
    llc_cfg: LlcConfig,
    eyecatcher: bool,
    /// The rendezvous that created it (first-contact events go there).
    first_hs: Option<u64>,
    first_done: bool,
    counted_pending: bool,
    first_rmb: Option<u32>,
    first_peer: Option<PeerRmb>,
    client_peer_qp: Option<PeerQp>,
    rmbs: BTreeMap<u32, Rmb>,
    next_rmb: u32,
    free_rmbs: Vec<u32>,
    /// Free send buffers, registered on one link's PD each (the link's own).
    sndbufs: Vec<(Arc<RdmaBuffer>, Mr, llc::LinkId)>,
    conns: BTreeSet<u32>,
    peer_rmbes: HashMap<(u32, u8), u32>,
    rkey_waiters: HashMap<u32, u64>,
    /// Rendezvous in progress using this link group.
    handshakes: usize,
    idle: bool,
    terminated: bool,
}

impl Lgr {
    fn active(&self) -> bool {
        !self.terminated && self.llc.as_ref().is_some_and(|l| !l.is_terminated())
    }

    fn local_link(&self, id: llc::LinkId) -> Option<LocalLink> {
        let res = self.links.get(&id)?;
        Some(local_link(res))
    }

    fn in_use(&self) -> usize {
        self.rmbs.values().filter(|r| r.in_use).count()
    }
}

fn wgid(g: smc_verbs::Gid) -> Gid {
    Gid(g.0)
}
fn vgid(g: Gid) -> smc_verbs::Gid {
    smc_verbs::Gid(g.0)
}
fn wmac(m: smc_verbs::Mac) -> Mac {
    Mac(m.0)
}
fn vmac(m: Mac) -> smc_verbs::Mac {
    smc_verbs::Mac(m.0)
}
fn qpmtu(m: Mtu) -> QpMtu {
    QpMtu::from_code(m as u8).unwrap_or(QpMtu::Mtu1024)
}
fn vmtu(m: QpMtu) -> Mtu {
    Mtu::from_enum(m.code()).unwrap_or(Mtu::Mtu1024)
}
fn clc_link(id: llc::LinkId) -> clc::LinkId {
    clc::LinkId(u64::from(id.0))
}
fn llc_link(id: clc::LinkId) -> llc::LinkId {
    llc::LinkId(id.0 as u32)
}

fn local_link(res: &LinkRes) -> LocalLink {
    LocalLink {
        link: clc_link(res.id),
        gid: wgid(res.device.gid()),
        mac: wmac(res.device.mac()),
        qpn: U24::wrapping(res.qp.qpn()),
        psn: U24::wrapping(res.psn),
        mtu: qpmtu(res.port_mtu),
    }
}

enum Machine {
    Client(Box<ClientMachine>),
    Server(Box<ServerMachine>),
}

enum Origin {
    Connect(Arc<ConnectSlot>),
    Accept(Arc<ListenerShared>),
}

pub(crate) struct Handshake {
    machine: Machine,
    tcp: TcpStream,
    out: Vec<u8>,
    local: SocketAddr,
    peer: SocketAddr,
    dev: Option<(llc::DeviceId, Device)>,
    origin: Origin,
    /// Server: bytes were fed to the machine (it is past the first-contact gate).
    started: bool,
    /// Link groups this rendezvous holds a reference on (for idle accounting).
    lgr_refs: Vec<LgrId>,
    done: bool,
}

impl Machine {
    fn poll_output(&mut self) -> Option<Output> {
        match self {
            Machine::Client(m) => m.poll_output(),
            Machine::Server(m) => m.poll_output(),
        }
    }
    fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Machine::Client(m) => m.poll_timeout(),
            Machine::Server(m) => m.poll_timeout(),
        }
    }
    fn bytes_wanted(&self) -> usize {
        match self {
            Machine::Client(m) => m.bytes_wanted(),
            Machine::Server(m) => m.bytes_wanted(),
        }
    }
    fn handle_tcp_bytes(&mut self, now: Instant, b: &[u8], env: &mut Env<'_>) -> usize {
        match self {
            Machine::Client(m) => m.handle_tcp_bytes(now, b, env),
            Machine::Server(m) => m.handle_tcp_bytes(now, b, env),
        }
    }
    fn handle_tcp_closed(&mut self, now: Instant, env: &mut Env<'_>) {
        match self {
            Machine::Client(m) => m.handle_tcp_closed(now, env),
            Machine::Server(m) => m.handle_tcp_closed(now, env),
        }
    }
    fn handle_tcp_fin(&mut self, now: Instant, env: &mut Env<'_>) {
        match self {
            Machine::Client(m) => m.handle_tcp_fin(now, env),
            Machine::Server(m) => m.handle_tcp_fin(now, env),
        }
    }
    fn handle_rkey_confirmed(
        &mut self,
        now: Instant,
        r: Result<(), DeclineCode>,
        env: &mut Env<'_>,
    ) {
        match self {
            Machine::Client(m) => m.handle_rkey_confirmed(now, r, env),
            Machine::Server(m) => m.handle_rkey_confirmed(now, r, env),
        }
    }
    fn handle_link_event(&mut self, now: Instant, e: LinkEvent, env: &mut Env<'_>) {
        match self {
            Machine::Client(m) => m.handle_link_event(now, e, env),
            Machine::Server(m) => m.handle_link_event(now, e, env),
        }
    }
    fn on_timeout(&mut self, now: Instant, env: &mut Env<'_>) {
        match self {
            Machine::Client(m) => m.on_timeout(now, env),
            Machine::Server(m) => m.on_timeout(now, env),
        }
    }
    fn is_server(&self) -> bool {
        matches!(self, Machine::Server(_))
    }
}

// ---------------------------------------------------------------------------------------
// Entry points from API threads

fn eligibility(inner: &Inner, sock: &TcpStream, peer: SocketAddr) -> Eligibility {
    let outcome = match &inner.bpf {
        Ok(o) => o.outcome(sock),
        Err(u) => OptOutcome::Unavailable { reason: u.clone() },
    };
    match inner.cfg.skip_tcp_option.decide(&outcome, peer) {
        // A private transport (SMC-R over iWARP, outside RFC 7609) is never offered on the
        // strength of the TCP option, which every SMC-R host sends: only to peers the
        // override policy names, i.e. that were configured for it too.
        Decision::Clc(ClcBasis::BothAnnounced) if inner.cfg.provider.private_transport().is_some() => {
            Eligibility::NotEligible {
                reason: format!(
                    "SMC-R over {} is a private extension: only with peers listed in SMC_RS_SKIP_TCP_OPTION",
                    inner.cfg.provider.private_transport().unwrap_or("a private transport")
                ),
            }
        }
        Decision::Clc(ClcBasis::BothAnnounced) => Eligibility::BothAnnounced,
        Decision::Clc(ClcBasis::PolicyOverride { pattern }) => {
            Eligibility::PolicyOverride { pattern }
        }
        Decision::Fallback { reason } => Eligibility::NotEligible { reason },
    }
}

fn device_for(core: &mut Core, inner: &Inner, ip: IpAddr) -> Option<(llc::DeviceId, Device)> {
    if let Some(i) = core.devices.iter().position(|(a, _)| *a == ip) {
        return Some((llc::DeviceId(i as u32), core.devices[i].1.clone()));
    }
    match inner.cfg.provider.device_for(ip) {
        Ok(d) => {
            core.devices.push((ip, d.clone()));
            Some((llc::DeviceId((core.devices.len() - 1) as u32), d))
        }
        Err(e) => {
            // Every connection on this address falls back (NOSMCDEV / NOSMCRDEV); say
            // why once per address.
            if core.device_errors.insert(ip) {
                warn!(%ip, error = %e, "no RDMA device for this address: SMC-R unavailable");
            } else {
                debug!(%ip, error = %e, "no RDMA device for this address");
            }
            None
        }
    }
}

fn client_route(
    inner: &Inner,
    dev: &Option<(llc::DeviceId, Device)>,
    local: IpAddr,
) -> ClientRoute {
    let mac = dev.as_ref().map(|(_, d)| wmac(d.mac())).unwrap_or_default();
    let peer_id = inner.peer_id(mac);
    let Some((_, d)) = dev else {
        return ClientRoute {
            peer_id,
            v1: None,
            v2: None,
        };
    };
    let ld = LocalDevice {
        gid: wgid(d.gid()),
        mac: wmac(d.mac()),
    };
    let ip = sys::interface_of(local).map(|i| match local {
        IpAddr::V4(_) => {
            let subnet = match sys::masked(local, i.prefix_len) {
                IpAddr::V4(a) => a,
                IpAddr::V6(_) => std::net::Ipv4Addr::UNSPECIFIED,
            };
            ProposalIp::V4 {
                subnet,
                prefix_len: i.prefix_len,
            }
        }
        IpAddr::V6(_) => {
            let mut prefixes: ArrayVec<Ipv6Prefix, 8> = ArrayVec::new();
            for a in sys::addrs_of(&i.name) {
                if let IpAddr::V6(v6) = a.addr {
                    if (v6.segments()[0] & 0xffc0) == 0xfe80 || prefixes.is_full() {
                        continue;
                    }
                    if let IpAddr::V6(p) = sys::masked(a.addr, a.prefix_len) {
                        prefixes.push(Ipv6Prefix {
                            prefix: p,
                            len: a.prefix_len,
                        });
                    }
                }
            }
            ProposalIp::V6 { prefixes }
        }
    });
    ClientRoute {
        peer_id,
        v1: ip.map(|ip| (ld, ip)),
        v2: local.is_ipv4().then(|| ClientV2Route {
            device: ld,
            gid_list: ArrayVec::new(),
        }),
    }
}

fn server_route(
    inner: &Inner,
    dev: &Option<(llc::DeviceId, Device)>,
    local: IpAddr,
) -> ServerRoute {
    let mac = dev.as_ref().map(|(_, d)| wmac(d.mac())).unwrap_or_default();
    let peer_id = inner.peer_id(mac);
    if dev.is_none() {
        return ServerRoute {
            peer_id,
            v1_prefixes: None,
            v2: false,
        };
    }
    let prefixes = sys::interface_of(local).map(|i| {
        let mut v: Vec<LocalPrefix> = sys::addrs_of(&i.name)
            .into_iter()
            .map(|a| LocalPrefix {
                addr: a.addr,
                prefix_len: a.prefix_len,
            })
            .collect();
        if !v.iter().any(|p| p.addr == local) {
            v.push(LocalPrefix {
                addr: local,
                prefix_len: i.prefix_len,
            });
        }
        v
    });
    ServerRoute {
        peer_id,
        v1_prefixes: prefixes,
        v2: local.is_ipv4(),
    }
}

/// Client: start the rendezvous on a connected TCP socket; the event thread drives it
/// and completes `slot`.
pub(crate) fn register_client(
    inner: &Arc<Inner>,
    tcp: TcpStream,
    slot: Arc<ConnectSlot>,
) -> io::Result<()> {
    let local = tcp.local_addr()?;
    let peer = tcp.peer_addr()?;
    let elig = eligibility(inner, &tcp, peer);
    tcp.set_nonblocking(true)?;
    let mut core = inner.lock_core();
    let dev = if matches!(elig, Eligibility::NotEligible { .. }) {
        None
    } else {
        device_for(&mut core, inner, local.ip())
    };
    let route = client_route(inner, &dev, local.ip());
    let m = ClientMachine::new(Instant::now(), &inner.clc, route, elig);
    let id = core.next_hs;
    core.next_hs += 1;
    core.handshakes.insert(
        id,
        Handshake {
            machine: Machine::Client(Box::new(m)),
            tcp,
            out: Vec::new(),
            local,
            peer,
            dev,
            origin: Origin::Connect(slot),
            started: true,
            lgr_refs: Vec::new(),
            done: false,
        },
    );
    // Send the Proposal (or finish a not-eligible connection) right here: one thread
    // hop less per connection.
    core.with_hs(inner, id, Instant::now(), |_, _| {});
    drop(core);
    inner.wake();
    Ok(())
}

/// A listening socket the event thread accepts on.
pub(crate) fn register_listener(
    inner: &Arc<Inner>,
    sock: TcpListener,
) -> io::Result<Arc<ListenerShared>> {
    sock.set_nonblocking(true)?;
    let local = sock.local_addr()?;
    let mut core = inner.lock_core();
    let id = core.next_listener;
    core.next_listener += 1;
    let l = Arc::new(ListenerShared {
        id,
        sock,
        local,
        queue: Mutex::new(VecDeque::new()),
        cond: Condvar::new(),
        closed: Default::default(),
        nonblocking: Default::default(),
        waker: Mutex::new(None),
    });
    core.listeners.insert(id, l.clone());
    drop(core);
    inner.wake();
    Ok(l)
}

// ---------------------------------------------------------------------------------------
// ClcEnv

struct Env<'a> {
    inner: &'a Arc<Inner>,
    core: &'a mut Core,
    hs: u64,
    dev: Option<(llc::DeviceId, Device)>,
    peer_ip: IpAddr,
    local_ip: IpAddr,
    lgr_refs: &'a mut Vec<LgrId>,
    now: Instant,
}

impl Env<'_> {
    fn new_lgr(
        &mut self,
        role: clc::Role,
        version: SmcVersion,
        peer_id: PeerId,
        peer_gid: Gid,
        v2: Option<V2Params>,
    ) -> Result<(LgrId, LocalLink), DeclineCode> {
        let Some((dev_id, device)) = self.dev.clone() else {
            return Err(DeclineCode::NOSMCRDEV);
        };
        let id = LgrId(self.core.next_lgr + 1);
        self.core.next_lgr += 1;
        let link = LinkRes::create(self.inner, &device, id, llc::LinkId::FIRST).map_err(|e| {
            warn!(error = %e, "cannot create the first link's QP");
            DeclineCode::MEM
        })?;
        let llc_role = match role {
            clc::Role::Server => llc::Role::Server,
            clc::Role::Client => llc::Role::Client,
        };
        let llc_version = match version {
            SmcVersion::V1 => llc::Version::V1,
            SmcVersion::V2 => llc::Version::V2,
        };
        // Linux layout and behaviour between our stacks too: one code path that also
        // interoperates with Linux (SMC-Rv2 is configuration, not a rewrite).
        let mut cfg = LlcConfig::linux(llc_role, llc_version);
        cfg.lgr_id = (id.0 as u32) & 0x00FF_FFFF;
        if let Some(p) = v2 {
            cfg.max_conns = p.max_conns;
            cfg.max_links = p.max_links.clamp(1, 2);
        }
        let c = &self.inner.cfg;
        cfg.timers.linger = Some(match role {
            clc::Role::Server => c.lgr_idle_timeout,
            clc::Role::Client => c.lgr_idle_timeout + Duration::from_secs(10),
        });
        cfg.timers.test_link_interval = c.keepalive;
        cfg.timers.reply = c.llc_reply_timeout;
        let local = local_link(&link);
        let mut links = BTreeMap::new();
        links.insert(llc::LinkId::FIRST, link);
        let max_conns = v2.map(|p| usize::from(p.max_conns)).unwrap_or(255).max(1);
        self.core.lgrs.insert(
            id,
            Lgr {
                id,
                role,
                version,
                peer_id,
                peer_gid,
                eid: v2.map(|p| p.eid),
                max_conns,
                device_id: dev_id,
                device,
                links,
                llc: None,
                eyecatcher: cfg.rmbe_eyecatcher,
                llc_cfg: cfg,
                first_hs: Some(self.hs),
                first_done: false,
                counted_pending: role == clc::Role::Server,
                first_rmb: None,
                first_peer: None,
                client_peer_qp: None,
                rmbs: BTreeMap::new(),
                next_rmb: 1,
                free_rmbs: Vec::new(),
                sndbufs: Vec::new(),
                conns: BTreeSet::new(),
                peer_rmbes: HashMap::new(),
                rkey_waiters: HashMap::new(),
                handshakes: 1,
                idle: false,
                terminated: false,
            },
        );
        if role == clc::Role::Server {
            self.core.server_first_pending += 1;
        }
        self.lgr_refs.push(id);
        info!(lgr = id.0, ?role, ?version, "new link group");
        Ok((id, local))
    }

    fn join(&mut self, lgr: LgrId) {
        if !self.lgr_refs.contains(&lgr) {
            if let Some(g) = self.core.lgrs.get_mut(&lgr) {
                g.handshakes += 1;
                if g.idle {
                    g.idle = false;
                    if let Some(l) = g.llc.as_mut() {
                        l.set_idle(self.now, false);
                    }
                }
                self.lgr_refs.push(lgr);
            }
        }
    }

    /// Creates the llc machine of a first contact once both RMBs are known.
    fn start_llc(&mut self, lgr: LgrId) -> Result<(), DeclineCode> {
        let g = self.core.lgrs.get_mut(&lgr).ok_or(DeclineCode::INTERR)?;
        let link = g
            .links
            .get(&llc::LinkId::FIRST)
            .ok_or(DeclineCode::INTERR)?
            .clone();
        let peer = g.client_peer_qp.ok_or(DeclineCode::INTERR)?;
        let peer_rmb = g.first_peer.ok_or(DeclineCode::INTERR)?;
        let rmb_id = g.first_rmb.ok_or(DeclineCode::INTERR)?;
        let rmb = g.rmbs.get_mut(&rmb_id).ok_or(DeclineCode::INTERR)?;
        let mr = rmb
            .mrs
            .get(&llc::LinkId::FIRST)
            .ok_or(DeclineCode::INTERR)?;
        rmb.announced = true;
        let first = llc::FirstLink {
            device: g.device_id,
            local: llc::QpInfo {
                qpn: U24::wrapping(link.qp.qpn()),
                psn: U24::wrapping(link.psn),
                mtu: qpmtu(link.port_mtu),
            },
            peer: llc::PeerQp {
                mac: peer.id.mac,
                gid: peer.id.gid,
                qpn: peer.id.qpn,
                psn: peer.psn,
                mtu: qpmtu(link.port_mtu).min(peer.mtu),
            },
            local_rmb: llc::RmbId(rmb_id),
            local_token: RToken {
                rkey: mr.rkey(),
                vaddr: mr.addr(),
            },
            peer_token: RToken {
                rkey: peer_rmb.rkey,
                vaddr: peer_rmb.vaddr,
            },
        };
        let devices = vec![llc::Device {
            id: g.device_id,
            mac: wmac(g.device.mac()),
            gid: wgid(g.device.gid()),
        }];
        let lg = LinkGroup::new(g.llc_cfg.clone(), devices, first, self.now).map_err(|e| {
            warn!(error = %e, "cannot start the link group machine");
            DeclineCode::INTERR
        })?;
        g.llc = Some(lg);
        self.core.dirty.insert(lgr);
        Ok(())
    }
}

impl ClcEnv for Env<'_> {
    fn server_find_lgr(&mut self, q: &LgrQuery) -> LgrLookup {
        let mut exists = false;
        let mut found = None;
        for g in self.core.lgrs.values() {
            if g.role != clc::Role::Server || g.version != q.version || !g.active() {
                continue;
            }
            let same_peer = match q.version {
                SmcVersion::V1 => g.peer_id == q.peer_id,
                SmcVersion::V2 => g.peer_gid == q.peer_gid && g.eid == q.v2.as_ref().map(|p| p.eid),
            };
            if !same_peer {
                continue;
            }
            exists = true;
            if g.conns.len() + g.handshakes >= g.max_conns.min(255) {
                continue;
            }
            let Some(lg) = g.llc.as_ref() else { continue };
            // Prefer the link whose peer is the client's preferred GID/MAC.
            let mut pick = None;
            for info in lg.links() {
                if info.state != llc::LinkState::Active {
                    continue;
                }
                let pref = info.peer.is_some_and(|p| p.gid == q.peer_gid);
                if pick.is_none() || pref {
                    pick = Some(info.id);
                }
            }
            if let Some(l) = pick.and_then(|l| g.local_link(l)) {
                found = Some((g.id, l));
                break;
            }
        }
        match found {
            Some((lgr, link)) => {
                self.join(lgr);
                LgrLookup::Join { lgr, link }
            }
            None if exists => LgrLookup::AllFull,
            None => LgrLookup::None,
        }
    }

    fn server_create_lgr(
        &mut self,
        req: &ServerLgrRequest,
    ) -> Result<(LgrId, LocalLink), DeclineCode> {
        self.new_lgr(
            clc::Role::Server,
            req.version,
            req.peer_id,
            req.peer_gid,
            req.v2,
        )
    }

    fn server_match_link(&mut self, lgr: LgrId, client: &PeerLinkId) -> Option<clc::LinkId> {
        let g = self.core.lgrs.get(&lgr)?;
        let lg = g.llc.as_ref()?;
        lg.links()
            .find(|i| {
                i.state == llc::LinkState::Active
                    && i.peer.is_some_and(|p| {
                        p.qpn == client.qpn
                            && p.gid == client.gid
                            && (g.version == SmcVersion::V2 || p.mac == client.mac)
                    })
            })
            .map(|i| clc_link(i.id))
    }

    fn server_start_first_link(
        &mut self,
        lgr: LgrId,
        link: clc::LinkId,
        client: &PeerQp,
    ) -> Result<(), DeclineCode> {
        let g = self.core.lgrs.get_mut(&lgr).ok_or(DeclineCode::INTERR)?;
        let res = g.links.get(&llc_link(link)).ok_or(DeclineCode::INTERR)?;
        res.connect(&PeerQpAttr {
            gid: vgid(client.id.gid),
            mac: vmac(client.id.mac),
            qpn: client.id.qpn.get(),
            psn: client.psn.get(),
            mtu: vmtu(client.mtu),
        })
        .map_err(|e| {
            warn!(error = %e, "cannot ready the first link's QP");
            DeclineCode::ERR_RDYLNK
        })?;
        g.client_peer_qp = Some(*client);
        self.start_llc(lgr)
    }

    fn client_lookup(&mut self, q: &AcceptQuery) -> ClientLookup {
        let mut out = ClientLookup::default();
        for g in self.core.lgrs.values() {
            if g.role != clc::Role::Client || g.peer_id != q.server.peer_id || !g.active() {
                continue;
            }
            out.lgr.get_or_insert(g.id);
            let Some(lg) = g.llc.as_ref() else { continue };
            for info in lg.links() {
                if info.state != llc::LinkState::Active {
                    continue;
                }
                if let Some(p) = info.peer {
                    if p.qpn == q.server.qpn
                        && p.gid == q.server.gid
                        && (q.version == SmcVersion::V2 || p.mac == q.server.mac)
                        && g.conns.len() + g.handshakes < 255
                    {
                        if let Some(l) = g.local_link(info.id) {
                            out.link = Some((g.id, l));
                        }
                    }
                }
            }
        }
        if let Some((lgr, _)) = out.link {
            self.join(lgr);
        }
        out
    }

    fn client_create_lgr(
        &mut self,
        req: &ClientLgrRequest,
    ) -> Result<(LgrId, LocalLink), DeclineCode> {
        let (lgr, local) = self.new_lgr(
            clc::Role::Client,
            req.version,
            req.server.id.peer_id,
            req.server.id.gid,
            req.v2,
        )?;
        let g = self.core.lgrs.get_mut(&lgr).ok_or(DeclineCode::INTERR)?;
        g.client_peer_qp = Some(req.server);
        let res = g
            .links
            .get(&llc::LinkId::FIRST)
            .ok_or(DeclineCode::INTERR)?;
        // RTR to receive CONFIRM LINK, RTS to answer it (RFC 7609 §3.5.1.3).
        res.connect(&PeerQpAttr {
            gid: vgid(req.server.id.gid),
            mac: vmac(req.server.id.mac),
            qpn: req.server.id.qpn.get(),
            psn: req.server.psn.get(),
            mtu: vmtu(req.server.mtu),
        })
        .map_err(|e| {
            warn!(error = %e, "cannot ready the first link's QP");
            DeclineCode::ERR_RDYLNK
        })?;
        Ok((lgr, local))
    }

    fn alloc_rmb(
        &mut self,
        lgr: LgrId,
        link: clc::LinkId,
        first_contact: bool,
    ) -> Result<RmbAlloc, DeclineCode> {
        let rmb_size = BufSize::encode(self.inner.cfg.rmb_size, BufSize::LINUX_MAX_CODE);
        let token = self
            .inner
            .tokens
            .write()
            .map_err(|_| DeclineCode::INTERR)?
            .alloc(lgr)
            .ok_or(DeclineCode::MEM)?;
        let g = self.core.lgrs.get_mut(&lgr).ok_or(DeclineCode::INTERR)?;
        let link = llc_link(link);
        let (id, needs_confirm) = if let Some(id) = g.free_rmbs.pop() {
            (id, false)
        } else {
            if g.rmbs.len() >= 255 {
                self.inner
                    .tokens
                    .write()
                    .map_err(|_| DeclineCode::INTERR)?
                    .release(token);
                return Err(DeclineCode::MEM);
            }
            let buf = match RdmaBuffer::new(rmb_size.bytes()) {
                Ok(b) => b,
                Err(e) => {
                    warn!(error = %e, "RMB allocation failed");
                    if let Ok(mut t) = self.inner.tokens.write() {
                        t.release(token);
                    }
                    return Err(DeclineCode::MEM);
                }
            };
            let mut mrs = BTreeMap::new();
            for (lid, res) in &g.links {
                if res.dead.load(Ordering::SeqCst) {
                    continue;
                }
                // RMBs: remote write only (plus the local write RDMA placement needs).
                match res
                    .pd
                    .reg_mr(&buf, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
                {
                    Ok(mr) => {
                        mrs.insert(*lid, mr);
                    }
                    Err(e) => {
                        warn!(error = %e, "RMB registration failed");
                        if let Ok(mut t) = self.inner.tokens.write() {
                            t.release(token);
                        }
                        return Err(DeclineCode::MEM);
                    }
                }
            }
            let id = g.next_rmb;
            g.next_rmb += 1;
            g.rmbs.insert(
                id,
                Rmb {
                    buf,
                    mrs,
                    token: None,
                    in_use: false,
                    announced: false,
                    deleting: false,
                },
            );
            (id, !first_contact)
        };
        let rmb = g.rmbs.get_mut(&id).ok_or(DeclineCode::INTERR)?;
        rmb.in_use = true;
        rmb.token = Some(token);
        // RFC 7609 §4.1 / CHECKLIST RE-3: the element starts zeroed.
        rmb.buf.fill(0, rmb.buf.len(), 0);
        let Some(mr) = rmb.mrs.get(&link) else {
            rmb.in_use = false;
            rmb.token = None;
            g.free_rmbs.push(id);
            if let Ok(mut t) = self.inner.tokens.write() {
                t.release(token);
            }
            return Err(DeclineCode::ERR_RTOK);
        };
        let alloc = RmbAlloc {
            rmb: RmbId(u64::from(id)),
            rkey: mr.rkey(),
            vaddr: mr.addr(),
            rmbe_idx: 1,
            size: rmb_size,
            alert_token: token,
            needs_confirm_rkey: needs_confirm,
        };
        if first_contact {
            g.first_rmb = Some(id);
        }
        Ok(alloc)
    }

    fn register_peer_rmb(
        &mut self,
        lgr: LgrId,
        _link: clc::LinkId,
        peer: &PeerRmb,
    ) -> Result<Option<ConnRef>, DeclineCode> {
        let g = self.core.lgrs.get_mut(&lgr).ok_or(DeclineCode::INTERR)?;
        // RFC 7609 §4.4.2: only a connection that may still RDMA-write into that element
        // conflicts. The peer reuses an element as soon as its side is CLOSED, and its
        // Accept/Confirm (TCP) can overtake its last close CDC (RoCE); our old connection
        // has then sent D, C or A already and never writes data again (RFC 7609 §4.8,
        // TRM-2), so it simply finishes its close.
        let key = (peer.rkey, peer.rmbe_idx);
        let conflict = match g.peer_rmbes.get(&key) {
            Some(t) => match self.core.conns.get(t) {
                Some(c)
                    if matches!(c.lock().conn.state(), State::Active | State::AppCloseWait1) =>
                {
                    Some(ConnRef(u64::from(*t)))
                }
                _ => {
                    g.peer_rmbes.remove(&key);
                    None
                }
            },
            None => None,
        };
        if g.llc.is_none() {
            g.first_peer = Some(*peer);
            if g.role == clc::Role::Client {
                // The client's llc machine waits for CONFIRM LINK from now on.
                self.start_llc(lgr)?;
            }
        }
        Ok(conflict)
    }

    fn route_v2(&mut self, peer_gid: Gid) -> Option<V2Route> {
        let peer = vgid(peer_gid).to_ip();
        let i = sys::interface_of(self.local_ip)?;
        let direct = sys::masked(peer, i.prefix_len) == sys::masked(self.local_ip, i.prefix_len)
            || peer == self.peer_ip;
        direct.then_some(V2Route {
            uses_gateway: false,
            nexthop_mac: Mac::default(),
        })
    }

    fn free_rmb(&mut self, lgr: LgrId, rmb: RmbId) {
        let now = self.now;
        if let Some(g) = self.core.lgrs.get_mut(&lgr) {
            release_rmb(self.inner, g, rmb.0 as u32, now, true);
            self.core.dirty.insert(lgr);
        }
    }

    fn abandon_lgr(&mut self, lgr: LgrId) {
        if let Some(g) = self.core.lgrs.get_mut(&lgr) {
            info!(lgr = lgr.0, "link group abandoned (rendezvous failed)");
            match g.llc.as_mut() {
                Some(l) => l.abort(),
                None => g.terminated = true,
            }
            self.core.dirty.insert(lgr);
        }
    }
}

/// An RMB element is no longer used: keep it for reuse, or delete it (DELETE RKEY).
fn release_rmb(inner: &Inner, g: &mut Lgr, id: u32, now: Instant, from_rendezvous: bool) {
    let cache = inner.cfg.rmb_cache;
    let Some(rmb) = g.rmbs.get_mut(&id) else {
        return;
    };
    if let Some(t) = rmb.token.take() {
        if let Ok(mut tk) = inner.tokens.write() {
            tk.release(t);
        }
    }
    rmb.in_use = false;
    let known = rmb.announced;
    let confirmed = g
        .llc
        .as_ref()
        .is_some_and(|l| l.rmb_confirmed(llc::RmbId(id)));
    if g.terminated || g.llc.as_ref().is_none_or(|l| l.is_terminated()) {
        g.rmbs.remove(&id);
        return;
    }
    if !known {
        // Never announced to the peer: nothing to tell it.
        if from_rendezvous || g.free_rmbs.len() >= cache {
            g.rmbs.remove(&id);
        } else {
            g.free_rmbs.push(id);
        }
        return;
    }
    if confirmed && g.free_rmbs.len() < cache {
        g.free_rmbs.push(id);
        return;
    }
    // RFC 7609 §3.5.5.2.2: the peer forgets the RKeys before the memory goes.
    rmb.deleting = true;
    if let Some(l) = g.llc.as_mut() {
        if let Err(e) = l.delete_rmb(now, llc::RmbId(id)) {
            debug!(error = %e, "DELETE RKEY not possible; freeing the RMB");
            g.rmbs.remove(&id);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The event loop

#[derive(Clone, Copy)]
enum Fd {
    Wake,
    Listener(u64),
    Hs(u64),
    Conn(u32),
}

pub(crate) fn run(inner: Arc<Inner>) {
    debug!("event thread started");
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if inner.stop.load(Ordering::SeqCst) {
            let mut core = inner.lock_core();
            core.shutdown(&inner);
            debug!("event thread stopped");
            return;
        }
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut what: Vec<Fd> = Vec::new();
        let timeout = {
            let core = inner.lock_core();
            fds.push(pfd(inner.efd.fd(), libc::POLLIN));
            what.push(Fd::Wake);
            for l in core.listeners.values() {
                fds.push(pfd(l.sock.as_raw_fd(), libc::POLLIN));
                what.push(Fd::Listener(l.id));
            }
            for (id, hs) in &core.handshakes {
                let mut ev = 0;
                let gated = hs.machine.is_server() && !hs.started && core.server_first_pending > 0;
                if hs.machine.bytes_wanted() > 0 && !gated {
                    ev |= libc::POLLIN;
                }
                if !hs.out.is_empty() {
                    ev |= libc::POLLOUT;
                }
                if ev != 0 {
                    fds.push(pfd(hs.tcp.as_raw_fd(), ev));
                    what.push(Fd::Hs(*id));
                }
            }
            for (t, c) in &core.conns {
                let st = c.lock();
                if let Some(tcp) = &st.tcp {
                    if !st.tcp_done {
                        fds.push(pfd(tcp.as_raw_fd(), libc::POLLIN | libc::POLLRDHUP));
                        what.push(Fd::Conn(*t));
                    }
                }
            }
            let now = Instant::now();
            core.next_deadline()
                .map(|d| d.saturating_duration_since(now))
                .unwrap_or(MAX_SLEEP)
                .min(MAX_SLEEP)
        };
        let ms = timeout.as_micros().div_ceil(1000) as i32;
        // SAFETY: `fds` is a valid array of pollfd for the duration of the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != ErrorKind::Interrupted {
                warn!(error = %e, "poll failed");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let now = Instant::now();
        let mut core = inner.lock_core();
        inner.efd.drain();
        let msgs = match inner.inbox.lock() {
            Ok(mut i) => std::mem::take(&mut *i),
            Err(_) => Vec::new(),
        };
        for m in msgs {
            core.on_inbox(&inner, m, now);
        }
        core.check_activity(now);
        for (p, w) in fds.iter().zip(what.iter()) {
            if p.revents == 0 {
                continue;
            }
            match *w {
                Fd::Wake => {}
                Fd::Listener(id) => core.on_listener(&inner, id, now),
                Fd::Hs(id) => core.on_hs_io(&inner, id, now, &mut buf),
                Fd::Conn(t) => core.on_conn_tcp(t, now),
            }
        }
        core.on_timers(&inner, now);
        core.settle(&inner, now);
        core.reap(&inner, now);
    }
}

fn pfd(fd: i32, events: i16) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

impl Core {
    fn next_deadline(&self) -> Option<Instant> {
        let mut d: Option<Instant> = None;
        let mut upd = |t: Option<Instant>| {
            if let Some(t) = t {
                d = Some(d.map_or(t, |x| x.min(t)));
            }
        };
        for g in self.lgrs.values() {
            upd(g.llc.as_ref().and_then(|l| l.poll_timeout()));
        }
        for hs in self.handshakes.values() {
            upd(hs.machine.poll_timeout());
        }
        for c in self.conns.values() {
            upd(c.lock().armed);
        }
        if !self.notes.is_empty() || !self.dirty.is_empty() {
            upd(Some(Instant::now()));
        }
        d
    }

    fn on_inbox(&mut self, inner: &Arc<Inner>, m: Inbox, now: Instant) {
        match m {
            Inbox::LlcRecv { lgr, link, bytes } => {
                let Some(g) = self.lgrs.get_mut(&lgr) else {
                    return;
                };
                if let Some(res) = g.links.get(&link) {
                    res.llc_queued.fetch_sub(1, Ordering::AcqRel);
                }
                if let Some(l) = g.llc.as_mut() {
                    trace!(lgr = lgr.0, %link, len = bytes.len(), "LLC received");
                    inner.counters.llc_received.fetch_add(1, Ordering::Relaxed);
                    let dropped = l.dropped_requests();
                    l.on_link_activity(now, link);
                    l.handle_llc_bytes(now, link, &bytes);
                    inner
                        .counters
                        .llc_dropped
                        .fetch_add(l.dropped_requests() - dropped, Ordering::Relaxed);
                    self.dirty.insert(lgr);
                }
            }
            Inbox::LlcSent { lgr, link, id, ok } => {
                if let Some(l) = self.lgrs.get_mut(&lgr).and_then(|g| g.llc.as_mut()) {
                    l.on_send_complete(now, link, id, ok);
                    self.dirty.insert(lgr);
                }
            }
            Inbox::LinkError { lgr, link } => {
                if let Some(l) = self.lgrs.get_mut(&lgr).and_then(|g| g.llc.as_mut()) {
                    l.on_link_error(now, link);
                    self.dirty.insert(lgr);
                }
            }
            Inbox::ResetTcp(t) => {
                if let Some(c) = self.conns.get(&t) {
                    let mut st = c.lock();
                    if let Some(tcp) = st.tcp.take() {
                        sys::reset_tcp(tcp);
                    }
                    st.tcp_done = true;
                }
            }
            Inbox::ConnClosed | Inbox::Released => {}
        }
    }

    fn check_activity(&mut self, now: Instant) {
        for g in self.lgrs.values_mut() {
            let Some(l) = g.llc.as_mut() else { continue };
            for (id, res) in &g.links {
                if res.activity.swap(false, Ordering::Relaxed) {
                    l.on_link_activity(now, *id);
                }
            }
        }
    }

    fn on_listener(&mut self, inner: &Arc<Inner>, id: u64, now: Instant) {
        let Some(l) = self.listeners.get(&id).cloned() else {
            return;
        };
        loop {
            match l.sock.accept() {
                Ok((tcp, peer)) => {
                    let _ = tcp.set_nodelay(true);
                    let local = match tcp.local_addr() {
                        Ok(a) => a,
                        Err(_) => continue,
                    };
                    let elig = eligibility(inner, &tcp, peer);
                    if tcp.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let dev = if matches!(elig, Eligibility::NotEligible { .. }) {
                        None
                    } else {
                        device_for(self, inner, local.ip())
                    };
                    let route = server_route(inner, &dev, local.ip());
                    let m = ServerMachine::new(now, &inner.clc, route, elig);
                    let hid = self.next_hs;
                    self.next_hs += 1;
                    self.handshakes.insert(
                        hid,
                        Handshake {
                            machine: Machine::Server(Box::new(m)),
                            tcp,
                            out: Vec::new(),
                            local,
                            peer,
                            dev,
                            origin: Origin::Accept(l.clone()),
                            started: false,
                            lgr_refs: Vec::new(),
                            done: false,
                        },
                    );
                    // Drain outputs now (a not-eligible connection is done at once).
                    self.notes.push_back((hid, Note::Drain));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    debug!(error = %e, "accept failed");
                    return;
                }
            }
        }
    }

    fn with_hs(
        &mut self,
        inner: &Arc<Inner>,
        id: u64,
        now: Instant,
        f: impl FnOnce(&mut Handshake, &mut Env<'_>),
    ) {
        let Some(mut hs) = self.handshakes.remove(&id) else {
            return;
        };
        let mut refs = std::mem::take(&mut hs.lgr_refs);
        {
            let mut env = Env {
                inner,
                core: self,
                hs: id,
                dev: hs.dev.clone(),
                peer_ip: hs.peer.ip(),
                local_ip: hs.local.ip(),
                lgr_refs: &mut refs,
                now,
            };
            f(&mut hs, &mut env);
        }
        hs.lgr_refs = refs;
        self.pump_hs(inner, id, &mut hs, now);
        if hs.done {
            for l in hs.lgr_refs.drain(..) {
                if let Some(g) = self.lgrs.get_mut(&l) {
                    g.handshakes = g.handshakes.saturating_sub(1);
                }
                self.update_idle(l, now);
            }
        } else {
            self.handshakes.insert(id, hs);
        }
    }

    fn on_hs_io(&mut self, inner: &Arc<Inner>, id: u64, now: Instant, buf: &mut [u8]) {
        self.with_hs(inner, id, now, |hs, env| {
            if !hs.out.is_empty() {
                flush_out(hs);
            }
            loop {
                if hs.done {
                    return;
                }
                let want = hs.machine.bytes_wanted().min(buf.len());
                if want == 0 {
                    return;
                }
                if hs.machine.is_server() && !hs.started && env.core.server_first_pending > 0 {
                    return;
                }
                match hs.tcp.read(&mut buf[..want]) {
                    Ok(0) => {
                        hs.machine.handle_tcp_fin(now, env);
                        return;
                    }
                    Ok(n) => {
                        hs.started = true;
                        let took = hs.machine.handle_tcp_bytes(now, &buf[..n], env);
                        if took < n {
                            // Cannot happen: we read at most bytes_wanted().
                            warn!(took, n, "rendezvous left bytes unread");
                        }
                        // Deliver the machine's messages before reading on.
                        drain_outputs(hs, env);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => {
                        debug!(error = %e, "TCP error during the rendezvous");
                        hs.machine.handle_tcp_closed(now, env);
                        return;
                    }
                }
            }
        });
    }

    /// Drains a rendezvous' outputs and finishes it when it is done.
    fn pump_hs(&mut self, inner: &Arc<Inner>, id: u64, hs: &mut Handshake, now: Instant) {
        let mut env = Env {
            inner,
            core: self,
            hs: id,
            dev: hs.dev.clone(),
            peer_ip: hs.peer.ip(),
            local_ip: hs.local.ip(),
            lgr_refs: &mut Vec::new(),
            now,
        };
        drain_outputs(hs, &mut env);
    }

    fn on_conn_tcp(&mut self, token: u32, now: Instant) {
        let Some(c) = self.conns.get(&token).cloned() else {
            return;
        };
        let mut st = c.lock();
        let mut b = [0u8; 256];
        loop {
            let r = match st.tcp.as_mut() {
                Some(t) => t.read(&mut b),
                None => return,
            };
            match r {
                Ok(0) => {
                    st.tcp_done = true;
                    if matches!(st.conn.state(), State::Active | State::PeerCloseWait1) {
                        // The peer's FIN without its SMC-R close flags (yet). A live peer
                        // may shut its TCP socket before its last CDC arrives (Linux
                        // `smc_shutdown`; a RoCE retransmission can delay that CDC by
                        // seconds), so the FIN alone ends nothing. A peer process that died
                        // sends nothing more either: ask its link at once (TEST LINK);
                        // if that fails, the link goes down with its connections.
                        debug!(
                            token,
                            "peer's TCP FIN before its SMC-R close: probing the link"
                        );
                        let (lgr, link) = (c.lgr, c.link.id);
                        drop(st);
                        if let Some(l) = self.lgrs.get_mut(&lgr).and_then(|g| g.llc.as_mut()) {
                            l.probe_link(now, link);
                            self.dirty.insert(lgr);
                        }
                    }
                    return;
                }
                Ok(n) => {
                    // RFC 7609 §4.8: the TCP connection stays idle; data is a peer error.
                    debug!(
                        token,
                        n, "unexpected data on the idle TCP connection dropped"
                    );
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    // RST (RFC 7609 §4.8.2): abort the SMC-R connection.
                    debug!(token, error = %e, "TCP connection reset");
                    st.tcp_done = true;
                    st.conn.on_tcp_reset(now);
                    c.drive(&mut st, now);
                    return;
                }
            }
        }
    }

    fn on_timers(&mut self, inner: &Arc<Inner>, now: Instant) {
        let lgrs: Vec<LgrId> = self
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
        for id in lgrs {
            if let Some(l) = self.lgrs.get_mut(&id).and_then(|g| g.llc.as_mut()) {
                l.on_timeout(now);
                self.dirty.insert(id);
            }
        }
        let hss: Vec<u64> = self
            .handshakes
            .iter()
            .filter(|(_, h)| h.machine.poll_timeout().is_some_and(|t| t <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in hss {
            self.with_hs(inner, id, now, |hs, env| hs.machine.on_timeout(now, env));
        }
        for c in self.conns.values() {
            let mut st = c.lock();
            if st.armed.is_some_and(|t| t <= now) {
                st.armed = None;
                st.conn.on_timeout(now);
                c.drive(&mut st, now);
            }
        }
    }

    /// Runs link-group outputs and rendezvous notes until nothing is left.
    fn settle(&mut self, inner: &Arc<Inner>, now: Instant) {
        loop {
            if let Some(id) = self.dirty.pop_first() {
                self.process_lgr(inner, id, now);
                continue;
            }
            if let Some((hs, note)) = self.notes.pop_front() {
                self.with_hs(inner, hs, now, |h, env| match note {
                    Note::Link(e) => h.machine.handle_link_event(now, e, env),
                    Note::Rkey(r) => h.machine.handle_rkey_confirmed(now, r, env),
                    Note::Drain => {}
                });
                continue;
            }
            break;
        }
    }

    fn note(&mut self, hs: Option<u64>, n: Note) {
        if let Some(h) = hs {
            self.notes.push_back((h, n));
        }
    }

    fn process_lgr(&mut self, inner: &Arc<Inner>, id: LgrId, now: Instant) {
        loop {
            let Some(g) = self.lgrs.get_mut(&id) else {
                return;
            };
            let Some(out) = g.llc.as_mut().and_then(|l| l.poll_output()) else {
                break;
            };
            match out {
                llc::Output::Send(t) => {
                    let fmt: LlcFormat = g.llc_cfg.format;
                    let res = g.links.get(&t.link).cloned();
                    let ok = match (t.msg.encode(fmt), res) {
                        (Ok(bytes), Some(res)) => match res.post_llc(t.id, &bytes) {
                            Ok(()) => {
                                trace!(lgr = id.0, link = %t.link, "LLC sent");
                                inner.counters.llc_sent.fetch_add(1, Ordering::Relaxed);
                                true
                            }
                            Err(e) => {
                                debug!(error = %e, "LLC send failed");
                                false
                            }
                        },
                        (Err(e), _) => {
                            warn!(error = %e, "LLC message does not encode");
                            false
                        }
                        (_, None) => false,
                    };
                    if !ok {
                        if let Some(l) = g.llc.as_mut() {
                            l.on_send_complete(now, t.link, t.id, false);
                        }
                    }
                }
                llc::Output::CreateLink { link, device } => {
                    let dev = self
                        .devices
                        .get(device.0 as usize)
                        .map(|(_, d)| d.clone())
                        .unwrap_or_else(|| g.device.clone());
                    let created = LinkRes::create(inner, &dev, id, link);
                    match created {
                        Ok(res) => {
                            let mut tokens = Vec::new();
                            let mut ok = true;
                            let rmb_ids: Vec<llc::RmbId> = g
                                .llc
                                .as_ref()
                                .map(|l| l.local_rmbs().collect())
                                .unwrap_or_default();
                            for rid in rmb_ids {
                                let Some(rmb) = g.rmbs.get_mut(&rid.0) else {
                                    continue;
                                };
                                match res.pd.reg_mr(
                                    &rmb.buf,
                                    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
                                ) {
                                    Ok(mr) => {
                                        tokens.push((
                                            rid,
                                            RToken {
                                                rkey: mr.rkey(),
                                                vaddr: mr.addr(),
                                            },
                                        ));
                                        rmb.mrs.insert(link, mr);
                                    }
                                    Err(e) => {
                                        warn!(error = %e, "RMB registration on a new link failed");
                                        ok = false;
                                    }
                                }
                            }
                            let info = llc::QpInfo {
                                qpn: U24::wrapping(res.qp.qpn()),
                                psn: U24::wrapping(res.psn),
                                mtu: qpmtu(res.port_mtu),
                            };
                            g.links.insert(link, res);
                            if let Some(l) = g.llc.as_mut() {
                                if ok {
                                    if let Err(e) = l.on_link_created(now, link, info, &tokens) {
                                        debug!(error = %e, "link creation not taken");
                                    }
                                } else {
                                    l.on_link_setup_failed(now, link);
                                }
                            }
                        }
                        Err(e) => {
                            warn!(error = %e, "cannot create a QP for a new link");
                            if let Some(l) = g.llc.as_mut() {
                                l.on_link_setup_failed(now, link);
                            }
                        }
                    }
                }
                llc::Output::ConnectLink { link, peer } => {
                    let r = g.links.get(&link).map(|res| {
                        res.connect(&PeerQpAttr {
                            gid: vgid(peer.gid),
                            mac: vmac(peer.mac),
                            qpn: peer.qpn.get(),
                            psn: peer.psn.get(),
                            mtu: vmtu(peer.mtu),
                        })
                    });
                    if let Some(l) = g.llc.as_mut() {
                        match r {
                            Some(Ok(())) => {
                                if let Err(e) = l.on_link_connected(now, link) {
                                    debug!(error = %e, "link connect not taken");
                                }
                            }
                            _ => l.on_link_setup_failed(now, link),
                        }
                    }
                }
                llc::Output::DestroyLink { link } => {
                    if let Some(res) = g.links.remove(&link) {
                        debug!(lgr = id.0, %link, "link destroyed");
                        res.destroy();
                        for rmb in g.rmbs.values_mut() {
                            rmb.mrs.remove(&link);
                        }
                        g.sndbufs.retain(|(_, _, l)| *l != link);
                    }
                }
                llc::Output::Event(e) => self.on_llc_event(inner, id, e, now),
            }
        }
        self.finish_lgr_if_gone(id);
    }

    fn on_llc_event(&mut self, inner: &Arc<Inner>, id: LgrId, e: llc::Event, now: Instant) {
        let Some(g) = self.lgrs.get_mut(&id) else {
            return;
        };
        let first_hs = if g.first_done { None } else { g.first_hs };
        match e {
            llc::Event::ConfirmLinkSent => {
                self.note(first_hs, Note::Link(LinkEvent::ConfirmLinkSent))
            }
            llc::Event::FirstLinkUp => {
                info!(lgr = id.0, "first link up");
                self.note(first_hs, Note::Link(LinkEvent::FirstLinkUp))
            }
            llc::Event::PointOfNoReturn => {
                self.note(first_hs, Note::Link(LinkEvent::PointOfNoReturn))
            }
            llc::Event::FirstContactDone => {
                g.first_done = true;
                if g.counted_pending {
                    g.counted_pending = false;
                    self.server_first_pending = self.server_first_pending.saturating_sub(1);
                }
                self.note(first_hs, Note::Link(LinkEvent::SecondLinkSettled));
            }
            llc::Event::FirstLinkFailed(f) => {
                let failure = match f.kind {
                    llc::FirstLinkFailureKind::SendFailed => LinkFailure::SendFailed,
                    llc::FirstLinkFailureKind::InvalidMessage => LinkFailure::InvalidMessage,
                    llc::FirstLinkFailureKind::Timeout => LinkFailure::Timeout,
                    llc::FirstLinkFailureKind::Other => LinkFailure::Other,
                };
                self.note(
                    first_hs,
                    Note::Link(LinkEvent::Failed {
                        failure,
                        code: f.code,
                    }),
                );
            }
            llc::Event::LinkUp(l) => info!(lgr = id.0, link = %l, "link up"),
            llc::Event::LinkDown { link, reason } => {
                warn!(lgr = id.0, %link, %reason, "link down");
                inner.counters.links_failed.fetch_add(1, Ordering::Relaxed);
                // No failover yet (single link): the connections on it end (§4.8.3).
                let tokens: Vec<u32> = g.conns.iter().copied().collect();
                for t in tokens {
                    if let Some(c) = self.conns.get(&t) {
                        if c.link.id == link {
                            let mut st = c.lock();
                            st.conn.kill(AbortReason::LinkLost);
                            c.drive(&mut st, now);
                        }
                    }
                }
            }
            llc::Event::RmbConfirmed(r) => {
                if let Some(rmb) = g.rmbs.get_mut(&r.0) {
                    rmb.announced = true;
                }
                let w = g.rkey_waiters.remove(&r.0);
                self.note(w, Note::Rkey(Ok(())));
            }
            llc::Event::RmbConfirmFailed { rmb, retry } => {
                debug!(lgr = id.0, ?rmb, retry, "CONFIRM RKEY failed");
                let w = g.rkey_waiters.remove(&rmb.0);
                self.note(w, Note::Rkey(Err(DeclineCode::ERR_RTOK)));
            }
            llc::Event::RmbDeleted(r) => {
                if g.rmbs.get(&r.0).is_some_and(|x| !x.in_use) {
                    g.rmbs.remove(&r.0);
                    inner.counters.rmbs_deleted.fetch_add(1, Ordering::Relaxed);
                }
            }
            llc::Event::PeerRmbAdded { .. }
            | llc::Event::PeerRmbToken { .. }
            | llc::Event::PeerRmbDeleted(_) => {}
            llc::Event::Terminated(reason) => {
                info!(lgr = id.0, %reason, "link group terminated");
                g.terminated = true;
                inner.counters.lgrs_ended.fetch_add(1, Ordering::Relaxed);
                let was_pending = std::mem::take(&mut g.counted_pending);
                let first_open = !g.first_done;
                g.first_done = true;
                let waiters: Vec<u64> = g.rkey_waiters.drain().map(|(_, h)| h).collect();
                let tokens: Vec<u32> = g.conns.iter().copied().collect();
                if was_pending {
                    self.server_first_pending = self.server_first_pending.saturating_sub(1);
                }
                if first_open {
                    // A Terminated before FirstContactDone resets the first connection
                    // (docs/llc.md); the machine ignores it after a FirstLinkFailed.
                    self.note(
                        first_hs,
                        Note::Link(LinkEvent::Failed {
                            failure: LinkFailure::Other,
                            code: DeclineCode::INTERR,
                        }),
                    );
                }
                for h in waiters {
                    self.notes
                        .push_back((h, Note::Rkey(Err(DeclineCode::ERR_RTOK))));
                }
                for t in tokens {
                    if let Some(c) = self.conns.get(&t) {
                        let mut st = c.lock();
                        st.conn.kill(AbortReason::LinkLost);
                        c.drive(&mut st, now);
                    }
                }
            }
        }
    }

    /// Drops a terminated link group's verbs objects once nothing needs them.
    fn finish_lgr_if_gone(&mut self, id: LgrId) {
        let Some(g) = self.lgrs.get_mut(&id) else {
            return;
        };
        let gone = g.terminated || g.llc.as_ref().is_some_and(|l| l.is_terminated());
        if !gone {
            return;
        }
        g.terminated = true;
        for res in g.links.values() {
            res.destroy();
        }
        if g.conns.is_empty() && g.handshakes == 0 {
            if g.counted_pending {
                self.server_first_pending = self.server_first_pending.saturating_sub(1);
            }
            debug!(lgr = id.0, "link group freed");
            self.lgrs.remove(&id);
        }
    }

    fn update_idle(&mut self, id: LgrId, now: Instant) {
        let Some(g) = self.lgrs.get_mut(&id) else {
            return;
        };
        let idle = g.conns.is_empty() && g.handshakes == 0;
        if idle != g.idle {
            g.idle = idle;
            if let Some(l) = g.llc.as_mut() {
                l.set_idle(now, idle);
            }
        }
        self.finish_lgr_if_gone(id);
    }

    /// Releases connections that are closed and no longer referenced by the application.
    fn reap(&mut self, inner: &Arc<Inner>, now: Instant) {
        let done: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                let st = c.lock();
                st.released && st.conn.state() == State::Closed
            })
            .map(|(t, _)| *t)
            .collect();
        for t in done {
            let Some(c) = self.conns.remove(&t) else {
                continue;
            };
            let tcp = c.lock().tcp.take();
            drop(tcp);
            let lgr = c.lgr;
            if let Some(g) = self.lgrs.get_mut(&lgr) {
                g.conns.remove(&t);
                g.peer_rmbes.retain(|_, v| *v != t);
                release_rmb(inner, g, c.rmb_id.0 as u32, now, false);
                if g.sndbufs.len() < inner.cfg.rmb_cache && !g.terminated {
                    g.sndbufs
                        .push((c.sndbuf.clone(), c.sndbuf_mr.clone(), c.link.id));
                }
                self.dirty.insert(lgr);
            } else if let Ok(mut tk) = inner.tokens.write() {
                tk.release(t);
            }
            debug!(token = t, "connection released");
            self.update_idle(lgr, now);
        }
        if !self.dirty.is_empty() {
            self.settle(inner, now);
        }
        let closed: Vec<u64> = self
            .listeners
            .iter()
            .filter(|(_, l)| l.closed.load(Ordering::SeqCst))
            .map(|(id, _)| *id)
            .collect();
        for id in closed {
            self.listeners.remove(&id);
        }
    }

    /// A finished rendezvous: create the connection, or hand over the TCP socket.
    fn finish(&mut self, inner: &Arc<Inner>, hs: &mut Handshake, outcome: Outcome, now: Instant) {
        hs.done = true;
        let result: io::Result<Established> = match outcome {
            Outcome::Smc(est) => match self.create_conn(inner, hs, &est, now) {
                Ok(c) => {
                    inner.counters.smc_total.fetch_add(1, Ordering::Relaxed);
                    if est.contact.is_first() {
                        inner
                            .counters
                            .first_contacts
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Established::Smc(c))
                }
                Err(e) => {
                    // Local failure after the point of no return: give back what the
                    // rendezvous allocated and reset the TCP connection (RFC 7609 C.1).
                    warn!(peer = %hs.peer, error = %e, "cannot set up the connection");
                    inner.counters.resets.fetch_add(1, Ordering::Relaxed);
                    if let Some(g) = self.lgrs.get_mut(&est.lgr) {
                        release_rmb(inner, g, est.local_rmb.rmb.0 as u32, now, false);
                        self.dirty.insert(est.lgr);
                    }
                    if let Ok(t) = hs.tcp.try_clone() {
                        sys::reset_tcp(t);
                    }
                    Err(e)
                }
            },
            Outcome::Fallback(reason) => {
                inner.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
                info!(peer = %hs.peer, %reason, "TCP fallback");
                match hs.tcp.try_clone().and_then(|t| {
                    t.set_nonblocking(false)?;
                    Ok(t)
                }) {
                    Ok(t) => Ok(Established::Fallback(t, reason)),
                    Err(e) => Err(e),
                }
            }
            Outcome::Reset(reason) => {
                inner.counters.resets.fetch_add(1, Ordering::Relaxed);
                info!(peer = %hs.peer, %reason, "rendezvous failed, TCP reset");
                if let Ok(t) = hs.tcp.try_clone() {
                    sys::reset_tcp(t);
                }
                Err(io::Error::new(
                    ErrorKind::ConnectionReset,
                    format!("SMC-R rendezvous failed: {reason}"),
                ))
            }
        };
        match &hs.origin {
            Origin::Connect(slot) => slot.complete(result),
            Origin::Accept(l) => match result {
                Ok(e) => l.push(e, hs.peer),
                Err(e) => debug!(peer = %hs.peer, error = %e, "accepted connection dropped"),
            },
        }
    }

    fn create_conn(
        &mut self,
        inner: &Arc<Inner>,
        hs: &mut Handshake,
        est: &clc::SmcEstablished,
        now: Instant,
    ) -> io::Result<Arc<ConnShared>> {
        let err = |m: &str| io::Error::new(ErrorKind::ConnectionReset, m.to_string());
        let cfg = &inner.cfg;
        let g = self
            .lgrs
            .get_mut(&est.lgr)
            .ok_or_else(|| err("link group vanished"))?;
        let link = g
            .links
            .get(&llc_link(est.link))
            .cloned()
            .ok_or_else(|| err("link vanished"))?;
        let rmb_id = est.local_rmb.rmb.0 as u32;
        let rmb = g.rmbs.get(&rmb_id).ok_or_else(|| err("RMB vanished"))?;
        let rmb_buf = rmb.buf.clone();
        let pooled = g.sndbufs.iter().position(|(_, _, l)| *l == link.id);
        let (sndbuf, sndbuf_mr) = match pooled.map(|i| g.sndbufs.swap_remove(i)) {
            Some((b, mr, _)) => (b, mr),
            None => {
                let b = RdmaBuffer::new(cfg.sndbuf_size)?;
                // Send buffers are only read by the local RNIC (RDMA WRITE source).
                let mr = link
                    .pd
                    .reg_mr(&b, AccessFlags::LOCAL_WRITE)
                    .map_err(|e| io::Error::other(e.to_string()))?;
                (b, mr)
            }
        };
        let geo = |len: usize| {
            let len = len as u32;
            if g.eyecatcher {
                RmbeGeometry::rfc(len)
            } else {
                RmbeGeometry::linux(len)
            }
        };
        let local = geo(est.local_rmb.size.bytes()).map_err(|e| err(&e.to_string()))?;
        let peer = geo(est.peer_rmb.size.bytes()).map_err(|e| err(&e.to_string()))?;
        let params = ConnParams::new(
            local,
            peer,
            sndbuf.len() as u32,
            est.local_rmb.alert_token,
            est.peer_rmb.alert_token,
        );
        let conn = Conn::new(params, cfg.conn.clone()).map_err(|e| err(&e.to_string()))?;
        // Element i of the peer's RMB starts at vaddr + (i-1)·size (CHECKLIST AMB-10);
        // peer values, so no arithmetic that can overflow.
        let peer_base = est.peer_rmb.vaddr.wrapping_add(
            u64::from(est.peer_rmb.rmbe_idx.saturating_sub(1))
                .wrapping_mul(est.peer_rmb.size.bytes() as u64),
        );
        let tcp = hs.tcp.try_clone()?;
        let token = est.local_rmb.alert_token;
        let shared = Arc::new_cyclic(|me| ConnShared {
            token,
            lgr: est.lgr,
            link,
            rmb_id: RmbId(u64::from(rmb_id)),
            rmb: rmb_buf,
            sndbuf,
            sndbuf_mr,
            peer_base,
            peer_rkey: est.peer_rmb.rkey,
            local: hs.local,
            peer: hs.peer,
            version: est.version.wire(),
            first_contact: est.contact.is_first(),
            state: Mutex::new(ConnState {
                conn,
                tcp: Some(tcp),
                tcp_fin_sent: false,
                tcp_done: false,
                armed: None,
                waiting_slots: false,
                released: false,
                read_timeout: None,
                write_timeout: None,
                nonblocking: false,
                rx_waker: None,
                tx_waker: None,
            }),
            cond: Condvar::new(),
            bytes_sent: Default::default(),
            bytes_received: Default::default(),
            wake_seq: Default::default(),
            stack: Arc::downgrade(inner),
            self_ref: me.clone(),
        });
        g.conns.insert(token);
        g.peer_rmbes
            .insert((est.peer_rmb.rkey, est.peer_rmb.rmbe_idx), token);
        if let Ok(mut t) = inner.tokens.write() {
            // Replayed under the registry lock so that no later CDC overtakes them.
            for cdc in &t.set(token, shared.clone()) {
                if let Some(m) = super::conn::from_wire(cdc) {
                    shared.on_cdc(&m, now);
                }
            }
        }
        self.conns.insert(token, shared.clone());
        info!(
            lgr = est.lgr.0,
            token = format_args!("{token:#x}"),
            contact = ?est.contact,
            version = ?est.version,
            peer = %hs.peer,
            "SMC-R connection established"
        );
        Ok(shared)
    }

    /// Process exit: terminate every link group and post what that sends. Returns
    /// whether there was anything to end.
    pub(crate) fn goodbye(&mut self, inner: &Arc<Inner>, now: Instant) -> bool {
        let any = self.lgrs.values().any(|g| g.active());
        if any {
            self.terminate_all(now);
            self.settle(inner, now);
        }
        any
    }

    pub(crate) fn terminate_all(&mut self, now: Instant) {
        let ids: Vec<LgrId> = self.lgrs.keys().copied().collect();
        for id in ids {
            if let Some(l) = self.lgrs.get_mut(&id).and_then(|g| g.llc.as_mut()) {
                l.terminate(now);
                self.dirty.insert(id);
            }
        }
    }

    fn shutdown(&mut self, inner: &Arc<Inner>) {
        let now = Instant::now();
        self.terminate_all(now);
        self.settle(inner, now);
        for c in self.conns.values() {
            let mut st = c.lock();
            st.conn.kill(AbortReason::LinkLost);
            c.drive(&mut st, now);
            st.tcp.take();
        }
        for g in self.lgrs.values() {
            for res in g.links.values() {
                res.destroy();
            }
        }
        for (_, hs) in std::mem::take(&mut self.handshakes) {
            if let Origin::Connect(slot) = &hs.origin {
                slot.complete(Err(io::Error::new(
                    ErrorKind::ConnectionAborted,
                    "SMC-R stack stopped",
                )));
            }
        }
        self.lgrs.clear();
        self.conns.clear();
        self.listeners.clear();
    }

    // -----------------------------------------------------------------------------------
    // Listings

    pub(crate) fn link_group_infos(&self) -> Vec<LinkGroupInfo> {
        self.lgrs
            .values()
            .filter(|g| !g.terminated)
            .map(|g| LinkGroupInfo {
                id: LinkGroupId(g.id.0),
                role: match g.role {
                    clc::Role::Server => "server",
                    clc::Role::Client => "client",
                },
                version: g.version.wire(),
                peer: g.peer_id.to_string(),
                links: g
                    .llc
                    .as_ref()
                    .map(|l| {
                        l.links()
                            .map(|i| LinkListing {
                                num: i.num,
                                state: format!("{:?}", i.state),
                                qpn: i.local.map(|q| q.qpn.get()).unwrap_or(0),
                                peer_qpn: i.peer.map(|p| p.qpn.get()),
                                device: g
                                    .links
                                    .get(&i.id)
                                    .map(|r| r.device.name().to_string())
                                    .unwrap_or_default(),
                                peer_gid: i.peer.map(|p| p.gid.to_string()),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                conns: g.conns.len(),
                rmbs: g.rmbs.len(),
                rmbs_in_use: g.in_use(),
                idle: g.idle,
            })
            .collect()
    }

    pub(crate) fn conn_infos(&self) -> Vec<ConnInfo> {
        let mut v: Vec<ConnInfo> = self
            .conns
            .values()
            .map(|c| {
                let st = c.lock();
                ConnInfo {
                    local: c.local,
                    peer: c.peer,
                    mode: format!("SMC-Rv{}", c.version),
                    state: st.conn.state().to_string(),
                    lgr: Some(LinkGroupId(c.lgr.0)),
                    bytes_sent: c.bytes_sent.load(Ordering::Relaxed),
                    bytes_received: c.bytes_received.load(Ordering::Relaxed),
                }
            })
            .collect();
        for hs in self.handshakes.values() {
            v.push(ConnInfo {
                local: hs.local,
                peer: hs.peer,
                mode: "rendezvous".into(),
                state: "CLC".into(),
                lgr: None,
                bytes_sent: 0,
                bytes_received: 0,
            });
        }
        v
    }

    pub(crate) fn stats(&self) -> Stats {
        let links: usize = self.lgrs.values().map(|g| g.links.len()).sum();
        Stats {
            link_groups: self.lgrs.values().filter(|g| !g.terminated).count(),
            links,
            qps_open: links,
            rmbs: self.lgrs.values().map(|g| g.rmbs.len()).sum(),
            rmb_elements_in_use: self.lgrs.values().map(|g| g.in_use()).sum(),
            smc_connections: self.conns.len(),
            handshakes: self.handshakes.len(),
            listeners: self.listeners.len(),
            ..Stats::default()
        }
    }
}

fn flush_out(hs: &mut Handshake) {
    while !hs.out.is_empty() {
        match hs.tcp.write(&hs.out) {
            Ok(0) => return,
            Ok(n) => {
                hs.out.drain(..n);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
    }
}

fn drain_outputs(hs: &mut Handshake, env: &mut Env<'_>) {
    while let Some(o) = hs.machine.poll_output() {
        match o {
            Output::Send(msg) => match msg.to_vec() {
                Ok(b) => {
                    hs.out.extend_from_slice(&b);
                    flush_out(hs);
                }
                Err(e) => warn!(error = %e, "CLC message does not encode"),
            },
            Output::ConfirmRkey { lgr, link: _, rmb } => {
                let now = env.now;
                let hs_id = env.hs;
                let res = env.core.lgrs.get_mut(&lgr).and_then(|g| {
                    let tokens: Vec<(llc::LinkId, RToken)> = g
                        .llc
                        .as_ref()?
                        .links_with_qp()
                        .filter_map(|l| {
                            let mr = g.rmbs.get(&(rmb.0 as u32))?.mrs.get(&l)?;
                            Some((
                                l,
                                RToken {
                                    rkey: mr.rkey(),
                                    vaddr: mr.addr(),
                                },
                            ))
                        })
                        .collect();
                    let r = g
                        .llc
                        .as_mut()?
                        .add_rmb(now, llc::RmbId(rmb.0 as u32), &tokens);
                    if r.is_ok() {
                        if let Some(x) = g.rmbs.get_mut(&(rmb.0 as u32)) {
                            x.announced = true;
                        }
                        g.rkey_waiters.insert(rmb.0 as u32, hs_id);
                    }
                    Some(r)
                });
                match res {
                    Some(Ok(())) => {
                        env.core.dirty.insert(lgr);
                    }
                    other => {
                        debug!(?other, "CONFIRM RKEY could not start");
                        env.core
                            .notes
                            .push_back((hs_id, Note::Rkey(Err(DeclineCode::ERR_RTOK))));
                    }
                }
            }
            Output::OutOfSync { lgr } => {
                // Only the link group this rendezvous referenced (RFC 7609 A.2.5, AMB-15).
                warn!(lgr = lgr.0, "link group out of sync: terminating");
                if let Some(l) = env.core.lgrs.get_mut(&lgr).and_then(|g| g.llc.as_mut()) {
                    l.terminate(env.now);
                    env.core.dirty.insert(lgr);
                }
            }
            Output::AbortConn { conn } => {
                let t = conn.0 as u32;
                if let Some(c) = env.core.conns.get(&t) {
                    warn!(
                        token = t,
                        "RMB element reassigned by the peer: aborting the old connection"
                    );
                    let mut st = c.lock();
                    st.conn.kill(AbortReason::PeerAbort);
                    c.drive(&mut st, env.now);
                }
            }
            Output::Done(outcome) => {
                let inner = env.inner.clone();
                let now = env.now;
                flush_out(hs);
                env.core.finish(&inner, hs, outcome, now);
            }
        }
    }
}
