//! The event thread: drives the [`Endpoint`] with what the sockets, the RNIC and the
//! clock say, and carries out what it decides. It owns the I/O of rendezvous (their TCP
//! sockets), listeners, the idle TCP sockets of established connections (FIN/RST), the
//! verbs objects and memory of link groups ([`HostState`]), and the release of closed
//! connections. Everything here runs under the stack's core lock, on the event thread,
//! except the `register_*` entry points and the listings, which take the lock briefly
//! from API threads.
//!
//! The protocol rules — which link group a connection joins, when a rendezvous may
//! read, what a failed link or a peer's FIN means — are the endpoint's
//! (`crate::endpoint`); this module only does I/O.

use std::collections::BTreeMap;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::epoll;
use smc_verbs::netdev::PathState;
use smc_verbs::{AccessFlags, RdmaBuffer};
use tracing::{debug, info, trace, warn};

use super::cond::Cond;
use super::conn::{ConnParts, ConnShared, ConnState, Kind, Path, RdmaPath};
use super::host::{HostCtx, HostState, SAME_HOST_LGR};
use super::link::LinkRes;
use super::routes::{client_route, eligibility, server_route};
use super::{
    sys, BufferSizes, ConnInfo, ConnectSlot, Established, Inbox, Inner, LinkGroupId, LinkGroupInfo,
    LinkListing, ListenerShared, Stats,
};
use crate::clc::{self, Eligibility};
use crate::conn::{AbortReason, Conn, State};
use crate::endpoint::{
    BufSizes, ConnAction, DeviceInfo, Endpoint, EndpointConfig, FailoverTarget, NewConn, Output,
    RendezvousOutcome, TcpId,
};

/// Longest single `poll()` sleep (guards against a missed wake-up).
const MAX_SLEEP: Duration = Duration::from_millis(500);
/// Longest sleep while a same-host connection's doorbell is left to an application
/// thread sleeping on it (see `run`).
const BELL_RECHECK: Duration = Duration::from_millis(10);

/// Ready idle TCP sockets taken from the epoll set per look (more wait for the next).
const EPOLL_BATCH: usize = 256;

/// Where a finished rendezvous goes.
enum Origin {
    Connect(Arc<ConnectSlot>),
    Accept(Arc<ListenerShared>),
}

/// A rendezvous' TCP connection.
struct RdvIo {
    tcp: TcpStream,
    out: Vec<u8>,
    local: SocketAddr,
    peer: SocketAddr,
    origin: Origin,
    /// Client: the nonce of our same-host offer (its token and memory are given back
    /// when the rendezvous ends another way).
    same_host_nonce: Option<u64>,
}

pub(crate) struct Core {
    ep: Endpoint,
    host: HostState,
    rdvs: BTreeMap<TcpId, RdvIo>,
    next_tcp: u64,
    listeners: BTreeMap<u64, Arc<ListenerShared>>,
    next_listener: u64,
    /// The idle TCP sockets of established connections (RFC 7609 §4.8: watched for FIN
    /// and RST), registered once with their alert token: the event thread's wake-ups
    /// then cost nothing per established connection.
    epoll: OwnedFd,
    /// Connections that reached CLOSED or were released since the last reap: the only
    /// ones that may have become releasable.
    reap_check: Vec<u32>,
    /// The same-host connections (also in `host.conns`): their doorbells are polled
    /// apart from the epoll set (see `run`).
    shm_conns: BTreeMap<u32, Arc<ConnShared>>,
    /// Send buffers of released same-host connections, for the next ones (at most
    /// `rmb_cache`): a fresh one is an `mmap`, page faults as it fills and an `munmap`
    /// (a TLB shootdown on every CPU the process runs on) per connection.
    shm_sndbufs: Vec<Arc<smc_verbs::RdmaBuffer>>,
    /// When the event thread's poll times out at the latest (set before each poll): a
    /// thread that made an earlier deadline while it slept wakes it
    /// ([`Core::wake_if_needed`]).
    sleep_until: Option<Instant>,
    /// A descriptor joined the event thread's own poll set (a same-host connection's
    /// doorbell) since it built the set: whoever did it outside the event thread wakes
    /// it ([`Core::wake_if_needed`]), or the doorbell would go unwatched.
    poll_set_changed: bool,
}

impl Core {
    /// The live connections (unit tests reach a connection's link through them;
    /// `Stack::dump_state`).
    pub(crate) fn conns(&self) -> Vec<Arc<super::conn::ConnShared>> {
        self.host.conns.values().cloned().collect()
    }

    pub(crate) fn new(cfg: EndpointConfig) -> io::Result<Core> {
        Ok(Core {
            ep: Endpoint::new(cfg),
            host: HostState::default(),
            rdvs: BTreeMap::new(),
            next_tcp: 0,
            listeners: BTreeMap::new(),
            next_listener: 0,
            epoll: smc_verbs::process::lift(epoll::create(epoll::CreateFlags::CLOEXEC)?),
            reap_check: Vec::new(),
            shm_conns: BTreeMap::new(),
            shm_sndbufs: Vec::new(),
            sleep_until: None,
            poll_set_changed: false,
        })
    }

    /// Stops watching a connection's idle TCP socket (before it is closed or once its
    /// FIN or RST was seen: level-triggered, it would stay ready).
    fn unwatch(&self, tcp: &TcpStream) {
        if let Err(e) = epoll::delete(&self.epoll, tcp) {
            trace!(error = %e, "epoll delete");
        }
    }

    /// Runs `f` on the endpoint with the host, then carries out its outputs.
    fn ep<R>(
        &mut self,
        inner: &Arc<Inner>,
        f: impl FnOnce(&mut Endpoint, &mut HostCtx<'_>) -> R,
    ) -> R {
        let r = {
            let mut h = HostCtx {
                inner,
                st: &mut self.host,
            };
            f(&mut self.ep, &mut h)
        };
        self.apply(inner);
        r
    }

    /// Opens the devices of `StackConfig::devices` and gives them to the endpoint as link
    /// devices (every link group may put links on them, RFC 7609 §2.2). An address
    /// without a device is skipped (logged).
    pub(crate) fn add_link_devices(&mut self, inner: &Arc<Inner>) {
        for ip in inner.cfg.devices.clone() {
            match self.host.device_for(inner, ip) {
                Some((d, _)) => {
                    debug!(%ip, device = ?d.id, "link device");
                    self.ep(inner, |ep, h| ep.add_link_device(Instant::now(), h, d));
                }
                None => warn!(%ip, "SMC_RS_DEVICES: no RDMA device for this address; skipped"),
            }
        }
    }

    /// The device serving `ip` (opened on first use and described to the endpoint).
    fn device(&mut self, inner: &Inner, ip: std::net::IpAddr) -> Option<DeviceInfo> {
        let (d, new) = self.host.device_for(inner, ip)?;
        if new {
            self.ep.add_device(d);
        }
        Some(d)
    }

    #[allow(clippy::too_many_arguments)]
    fn start_rendezvous(
        &mut self,
        inner: &Arc<Inner>,
        tcp: TcpStream,
        local: SocketAddr,
        peer: SocketAddr,
        elig: Eligibility,
        origin: Origin,
        bufs: BufSizes,
    ) -> TcpId {
        let dev = if matches!(elig, Eligibility::NotEligible { .. }) {
            None
        } else {
            self.device(inner, local.ip())
        };
        let id = TcpId(self.next_tcp);
        self.next_tcp += 1;
        let client = matches!(origin, Origin::Connect(_));
        let eligible = !matches!(elig, Eligibility::NotEligible { .. });
        let mut route = client.then(|| client_route(inner, dev.as_ref(), local.ip()));
        // The same-host offer (docs/samehost.md): only where CLC runs at all, with a
        // token of its own registered for the server's Unix-socket hello.
        let mut same_host_nonce = None;
        if let (Some(r), Some(sh), true) = (route.as_mut(), &inner.same_host, eligible) {
            if r.v1.is_some() || r.v2.is_some() {
                let token = inner
                    .tokens
                    .write()
                    .ok()
                    .and_then(|mut t| t.alloc(SAME_HOST_LGR, &mut rand::rng()));
                if let Some(token) = token {
                    r.same_host = sh.offer(token, peer);
                    match &r.same_host {
                        Some(o) => same_host_nonce = Some(o.nonce),
                        None => release_token(inner, token),
                    }
                }
            }
        }
        self.rdvs.insert(
            id,
            RdvIo {
                tcp,
                out: Vec::new(),
                local,
                peer,
                origin,
                same_host_nonce,
            },
        );
        let now = Instant::now();
        let (l, p, d) = (local.ip(), peer.ip(), dev.map(|d| d.id));
        if let Some(route) = route {
            self.ep(inner, |ep, h| {
                ep.connect(now, h, id, l, p, route, elig, d, bufs)
            });
        } else {
            let mut route = server_route(inner, dev.as_ref(), l);
            route.same_host = inner.same_host.is_some();
            self.ep(inner, |ep, h| {
                ep.accept(now, h, id, l, p, route, elig, d, bufs)
            });
        }
        id
    }

    // -----------------------------------------------------------------------------------
    // Outputs

    fn apply(&mut self, inner: &Arc<Inner>) {
        while let Some(o) = self.ep.poll_output() {
            match o {
                Output::TcpSend { tcp, bytes } => {
                    if let Some(r) = self.rdvs.get_mut(&tcp) {
                        r.out.extend_from_slice(&bytes);
                        flush_out(r);
                    }
                }
                Output::Rendezvous { tcp, outcome } => self.finish(inner, tcp, outcome),
                Output::LlcSend {
                    lgr,
                    link,
                    id,
                    bytes,
                } => {
                    let posted = match self.host.links.get(&(lgr, link)) {
                        Some(res) => res.post_llc(id, &bytes),
                        None => Err(smc_verbs::VerbsError::InvalidState(smc_verbs::QpState::Err)),
                    };
                    match posted {
                        Ok(()) => {
                            trace!(lgr = lgr.0, %link, "LLC sent");
                            inner.counters.llc_sent.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            debug!(error = %e, "LLC send failed");
                            let now = Instant::now();
                            let mut h = HostCtx {
                                inner,
                                st: &mut self.host,
                            };
                            self.ep.handle_llc_sent(now, &mut h, lgr, link, id, false);
                        }
                    }
                }
                Output::Conn { token, action } => {
                    if let Some(c) = self.host.conns.get(&token).cloned() {
                        let now = Instant::now();
                        if let ConnAction::Failover(t) = action {
                            self.fail_over(&c, t, now);
                            continue;
                        }
                        let mut st = c.lock();
                        match action {
                            ConnAction::Kill(reason) => st.conn.kill(reason),
                            ConnAction::TcpReset => st.conn.on_tcp_reset(now),
                            ConnAction::Failover(_) => {}
                        }
                        c.drive(&mut st, now);
                    }
                }
            }
        }
    }

    /// RFC 7609 §4.6: a connection moves to the link the endpoint chose. Its send buffer
    /// is registered on the new link's PD; without the link or the registration the
    /// connection ends.
    fn fail_over(&mut self, c: &Arc<ConnShared>, t: FailoverTarget, now: Instant) {
        // Only SMC-R connections are in a link group (the endpoint knows no other).
        let link = c
            .lgr()
            .and_then(|lgr| self.host.links.get(&(lgr, t.link)).cloned());
        let mr = link.as_ref().map(|l| {
            // Only read by the RNIC (RDMA WRITE source), as below.
            l.pd.reg_mr(&c.sndbuf, AccessFlags::empty())
                .map_err(|e| e.to_string())
        });
        let mut st = c.lock();
        match (link, mr) {
            (Some(link), Some(Ok(sndbuf_mr))) => {
                debug!(token = c.token, to = %t.link, "connection fails over");
                let path = RdmaPath {
                    link,
                    sndbuf_mr,
                    peer_base: t.peer_base,
                    peer_rkey: t.peer_rkey,
                };
                c.fail_over(&mut st, path, now);
            }
            (_, mr) => {
                let error = mr.and_then(|r| r.err());
                warn!(token = c.token, to = %t.link, ?error, "failover impossible: the connection ends");
                st.conn.kill(AbortReason::LinkLost);
                c.drive(&mut st, now);
            }
        }
    }

    /// A finished rendezvous: create the connection, or hand over the TCP socket.
    fn finish(&mut self, inner: &Arc<Inner>, id: TcpId, outcome: RendezvousOutcome) {
        let Some(mut r) = self.rdvs.remove(&id) else {
            return;
        };
        flush_out(&mut r);
        // The socket itself goes to the connection (or back to the application), not a
        // duplicate: two system calls less per connection (issue 15). Whatever is left
        // here at the end (a failure) is reset.
        let RdvIo {
            tcp,
            local,
            peer,
            origin,
            same_host_nonce,
            ..
        } = r;
        let mut tcp = Some(tcp);
        // The same-host memory of this rendezvous, if any: used below, or given back.
        let mut shm = match same_host_nonce {
            Some(n) => inner.same_host.as_ref().and_then(|s| s.take(n)),
            None => None,
        };
        let mut server_shm = self.host.same_host_ready.remove(&id);
        let result: io::Result<Established> = match outcome {
            RendezvousOutcome::SameHost(est) => {
                let setup = match est.role {
                    clc::Role::Client => shm.take().and_then(|(_, s)| s),
                    clc::Role::Server => server_shm.take(),
                };
                match setup
                    .ok_or_else(|| io::Error::other("same-host memory vanished"))
                    .and_then(|s| self.create_shm_conn(inner, &mut tcp, local, peer, s))
                {
                    Ok(c) => Ok(Established::Smc(c)),
                    Err(e) => {
                        warn!(%peer, error = %e, "cannot set up the same-host connection");
                        if let Some(t) = tcp.take() {
                            sys::reset_tcp(t);
                        }
                        Err(e)
                    }
                }
            }
            RendezvousOutcome::Smc(nc) => {
                match self.create_conn(inner, &mut tcp, local, peer, &nc) {
                    Ok(c) => Ok(Established::Smc(c)),
                    Err(e) => {
                        // Local failure after the point of no return: give back what the
                        // rendezvous allocated and reset the TCP connection (RFC 7609 C.1).
                        warn!(%peer, error = %e, "cannot set up the connection");
                        let now = Instant::now();
                        self.ep(inner, |ep, h| ep.conn_setup_failed(now, h, nc.token));
                        if let Some(t) = tcp.take() {
                            sys::reset_tcp(t);
                        }
                        Err(e)
                    }
                }
            }
            RendezvousOutcome::Fallback(reason) => tcp
                .take()
                .ok_or_else(|| io::Error::other("rendezvous socket gone"))
                .and_then(|t| {
                    t.set_nonblocking(false)?;
                    Ok(t)
                })
                .map(|t| {
                    let role = match origin {
                        Origin::Connect(_) => "client",
                        _ => "server",
                    };
                    crate::observe::record_fallback(&t, role, &reason);
                    Established::Fallback(t, reason)
                }),
            RendezvousOutcome::Reset(reason) => {
                if let Some(t) = tcp.take() {
                    sys::reset_tcp(t);
                }
                Err(io::Error::new(
                    ErrorKind::ConnectionReset,
                    format!("SMC-R rendezvous failed: {reason}"),
                ))
            }
        };
        if let Some((token, setup)) = shm {
            match setup {
                Some(s) => drop_shm_setup(inner, s),
                None => release_token(inner, token),
            }
        }
        if let Some(s) = server_shm {
            drop_shm_setup(inner, s);
        }
        match &origin {
            Origin::Connect(slot) => slot.complete(result),
            Origin::Accept(l) => match result {
                Ok(e) => l.push(e, peer),
                Err(e) => debug!(%peer, error = %e, "accepted connection dropped"),
            },
        }
    }

    /// A same-host connection over the memory its rendezvous set up (`shm`).
    fn create_shm_conn(
        &mut self,
        inner: &Arc<Inner>,
        tcp: &mut Option<TcpStream>,
        local: SocketAddr,
        peer: SocketAddr,
        setup: super::shm::ShmSetup,
    ) -> io::Result<Arc<ConnShared>> {
        let token = setup.local_token;
        let session = setup.session;
        let give_back = |own: super::shm::OwnMem| {
            // Our region goes back to the session as a connection's that did not end
            // cleanly: dropped, and the peer told to unmap it (and its live count
            // lowered), not left mapped on its side until the session ends.
            if let (Some(link), Some(sh)) = (session, &inner.same_host) {
                sh.give_back(link, own, false);
            }
        };
        let made = (|| -> io::Result<Arc<ConnShared>> {
            // The idle TCP connection carries the FIN and RST (moved in by new_conn only
            // once nothing can fail: else the caller resets it).
            let sndbuf = match self.shm_sndbufs.pop() {
                Some(b) => b,
                None => match smc_verbs::RdmaBuffer::new(inner.cfg.sndbuf_size) {
                    Ok(b) => b,
                    Err(e) => {
                        give_back(setup.rx);
                        return Err(e);
                    }
                },
            };
            let shared = super::shm::new_conn(inner, local, peer, tcp, setup, sndbuf)?;
            let mut st = shared.lock();
            if let Some(t) = &st.tcp {
                // Watched like an SMC-R connection's (RFC 7609 §4.8: FIN and RST).
                let added = epoll::add(
                    &self.epoll,
                    t,
                    epoll::EventData::new_u64(u64::from(token)),
                    epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
                );
                if let Err(e) = added {
                    if let Some(p) = shared.shm() {
                        give_back(p.own_mem(shared.rmb.clone()));
                    }
                    // Back to the caller, which resets it (a plain close would tell the
                    // peer we ended cleanly).
                    *tcp = st.tcp.take();
                    return Err(e.into());
                }
            }
            drop(st);
            Ok(shared)
        })();
        let shared = made.inspect_err(|_| {
            // The connection never existed: its alert token goes back.
            release_token(inner, token);
        })?;
        self.host.conns.insert(shared.token, shared.clone());
        self.shm_conns.insert(shared.token, shared.clone());
        // Its doorbell is one of the event thread's own descriptors.
        self.poll_set_changed = true;
        Ok(shared)
    }

    fn create_conn(
        &mut self,
        inner: &Arc<Inner>,
        tcp_slot: &mut Option<TcpStream>,
        local: SocketAddr,
        peer: SocketAddr,
        nc: &NewConn,
    ) -> io::Result<Arc<ConnShared>> {
        let err = |m: &str| io::Error::new(ErrorKind::ConnectionReset, m.to_string());
        let cfg = &inner.cfg;
        let link = self
            .host
            .links
            .get(&(nc.lgr, nc.link))
            .cloned()
            .ok_or_else(|| err("link vanished"))?;
        let rmb = self
            .host
            .rmbs
            .get(&(nc.lgr, nc.rmb.0))
            .map(|x| x.buf.clone())
            .ok_or_else(|| err("RMB vanished"))?;
        // The connection's own size (SO_SNDBUF, proto BufSizes) or the stack's.
        let want = nc.params.sndbuf_len as usize;
        let pooled = self.host.sndbufs.get_mut(&(nc.lgr, nc.link)).and_then(|v| {
            let i = v.iter().rposition(|(b, _)| b.len() == want)?;
            Some(v.swap_remove(i))
        });
        let (sndbuf, sndbuf_mr) = match pooled {
            Some(x) => x,
            None => {
                let b = RdmaBuffer::new(want)?;
                // Send buffers are only read by the local RNIC (RDMA WRITE source): no
                // write access, so a provider need not keep them resident
                // (smc-softroce populates only what it may write into).
                let mr = link
                    .pd
                    .reg_mr(&b, AccessFlags::empty())
                    .map_err(|e| io::Error::other(e.to_string()))?;
                (b, mr)
            }
        };
        let conn = Conn::new(nc.params, cfg.conn.clone()).map_err(|e| err(&e.to_string()))?;
        let tcp = tcp_slot
            .take()
            .ok_or_else(|| err("rendezvous socket gone"))?;
        if let Err(e) = epoll::add(
            &self.epoll,
            &tcp,
            epoll::EventData::new_u64(u64::from(nc.token)),
            epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
        ) {
            // Back to the caller, which resets it.
            *tcp_slot = Some(tcp);
            return Err(e.into());
        }
        let shared = ConnShared::new(
            ConnParts {
                token: nc.token,
                kind: Kind::SmcR(nc.lgr),
                rmb,
                sndbuf,
                local,
                peer,
                version: nc.version,
                first_contact: nc.contact.is_first(),
                state: ConnState::new(
                    conn,
                    Path::Rdma(RdmaPath {
                        link,
                        sndbuf_mr,
                        peer_base: nc.peer_base,
                        peer_rkey: nc.peer_rkey,
                    }),
                    Some(tcp),
                ),
            },
            inner,
        );
        if let Ok(mut t) = inner.tokens.write() {
            // Replayed under the table's lock so that no later CDC overtakes them.
            let now = Instant::now();
            for cdc in t.attach(nc.token, shared.clone()) {
                shared.on_cdc(&cdc, now);
            }
        }
        self.host.conns.insert(nc.token, shared.clone());
        Ok(shared)
    }

    // -----------------------------------------------------------------------------------
    // Inputs

    fn on_inbox(&mut self, inner: &Arc<Inner>, m: Inbox, now: Instant) {
        match m {
            Inbox::LlcRecv { lgr, link, bytes } => {
                if let Some(res) = self.host.links.get(&(lgr, link)) {
                    res.llc_queued.fetch_sub(1, Ordering::AcqRel);
                }
                trace!(lgr = lgr.0, %link, len = bytes.len(), "LLC received");
                self.ep(inner, |ep, h| ep.handle_llc(now, h, lgr, link, &bytes));
            }
            Inbox::LlcSent { lgr, link, id, ok } => {
                self.ep(inner, |ep, h| ep.handle_llc_sent(now, h, lgr, link, id, ok));
            }
            Inbox::LinkError { lgr, link } => {
                self.ep(inner, |ep, h| ep.handle_link_error(now, h, lgr, link));
            }
            Inbox::ResetTcp(t) => {
                if let Some(c) = self.host.conns.get(&t) {
                    let mut st = c.lock();
                    if let Some(tcp) = st.tcp.take() {
                        if !st.tcp_done {
                            self.unwatch(&tcp);
                        }
                        sys::reset_tcp(tcp);
                    }
                    st.tcp_done = true;
                }
            }
            Inbox::ConnClosed(t) | Inbox::Released(t) => self.reap_check.push(t),
            Inbox::SameHostDone { tcp, token, result } => {
                let waiting = self.rdvs.contains_key(&tcp);
                let stack_id = inner.same_host.as_ref().map(|s| s.stack_id);
                match (result.0, stack_id) {
                    (Ok(setup), Some(id)) if waiting => {
                        // Kept until the rendezvous finishes (used, or its token given
                        // back if it went on with SMC-R after its wait expired).
                        self.host.same_host_ready.insert(tcp, setup);
                        self.ep(inner, |ep, h| ep.same_host_done(now, h, tcp, Some(id)));
                    }
                    (Ok(setup), _) => {
                        // The rendezvous ended meanwhile: the memory goes unused.
                        drop_shm_setup(inner, setup);
                    }
                    (Err(e), _) => {
                        debug!(error = %e, "same-host offer not taken");
                        release_token(inner, token);
                        if waiting {
                            self.ep(inner, |ep, h| ep.same_host_done(now, h, tcp, None));
                        }
                    }
                }
            }
        }
    }

    fn check_activity(&mut self, now: Instant) {
        for ((lgr, link), res) in &self.host.links {
            if res.activity.swap(false, Ordering::Relaxed) {
                self.ep.link_activity(now, *lgr, *link);
            }
        }
    }

    fn on_listener(&mut self, inner: &Arc<Inner>, id: u64) {
        let Some(l) = self.listeners.get(&id).cloned() else {
            return;
        };
        loop {
            match l.sock.accept() {
                Ok((tcp, peer)) => {
                    // Held for the connection's life: numbered above the program's.
                    let tcp = smc_verbs::process::lift(tcp);
                    let _ = tcp.set_nodelay(true);
                    let Ok(local) = tcp.local_addr() else {
                        continue;
                    };
                    let elig = eligibility(inner, &tcp, peer);
                    if tcp.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let bufs = l.bufs;
                    self.start_rendezvous(
                        inner,
                        tcp,
                        local,
                        peer,
                        elig,
                        Origin::Accept(l.clone()),
                        bufs,
                    );
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

    fn on_rdv_io(&mut self, inner: &Arc<Inner>, id: TcpId, now: Instant, buf: &mut [u8]) {
        loop {
            let Some(r) = self.rdvs.get_mut(&id) else {
                return;
            };
            if !r.out.is_empty() {
                flush_out(r);
            }
            let want = self.ep.bytes_wanted(id).min(buf.len());
            if want == 0 {
                return;
            }
            let Some(r) = self.rdvs.get_mut(&id) else {
                return;
            };
            match r.tcp.read(&mut buf[..want]) {
                Ok(0) => {
                    self.ep(inner, |ep, h| ep.handle_tcp_fin(now, h, id));
                    return;
                }
                Ok(n) => {
                    let took = self.ep(inner, |ep, h| ep.handle_tcp_bytes(now, h, id, &buf[..n]));
                    if took < n {
                        // Cannot happen: we read at most bytes_wanted().
                        warn!(took, n, "rendezvous left bytes unread");
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    debug!(error = %e, "TCP error during the rendezvous");
                    self.ep(inner, |ep, h| ep.handle_tcp_error(now, h, id));
                    return;
                }
            }
        }
    }

    /// The idle TCP socket of an established connection is readable: FIN, RST, or
    /// (a peer error) data.
    fn on_conn_tcp(&mut self, inner: &Arc<Inner>, token: u32, now: Instant) {
        let Some(c) = self.host.conns.get(&token).cloned() else {
            return;
        };
        let mut b = [0u8; 256];
        loop {
            let mut st = c.lock();
            if st.tcp_done {
                return;
            }
            let r = match st.tcp.as_mut() {
                Some(t) => t.read(&mut b),
                None => return,
            };
            match r {
                Ok(0) => {
                    st.tcp_done = true;
                    if let Some(t) = &st.tcp {
                        self.unwatch(t);
                    }
                    if c.shm().is_some() {
                        drop(st);
                        c.shm_poll(now);
                        let mut st = c.lock();
                        // The peer's close flags are in the ring before its FIN leaves
                        // (it shuts TCP down after publishing them, and its ring
                        // writes need no retransmission): a FIN without them means
                        // its process is gone (SIGKILL) — no TEST LINK to wait for.
                        if matches!(st.conn.state(), State::Active | State::PeerCloseWait1) {
                            debug!(token, "same-host peer gone");
                            st.conn.kill(AbortReason::PeerGone);
                            c.drive(&mut st, now);
                        }
                        return;
                    }
                    let closing = !matches!(st.conn.state(), State::Active | State::PeerCloseWait1);
                    drop(st);
                    self.ep(inner, |ep, h| ep.conn_tcp_fin(now, h, token, closing));
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
                    if let Some(t) = &st.tcp {
                        self.unwatch(t);
                    }
                    if c.shm().is_some() {
                        // The endpoint knows no same-host connection: §4.8.2 here.
                        st.conn.on_tcp_reset(now);
                        c.drive(&mut st, now);
                        return;
                    }
                    drop(st);
                    self.ep.conn_tcp_error(token);
                    self.apply(inner);
                    return;
                }
            }
        }
    }

    fn on_timers(&mut self, inner: &Arc<Inner>, now: Instant) {
        if self.ep.poll_timeout().is_some_and(|t| t <= now) {
            self.ep(inner, |ep, h| ep.handle_timeout(now, h));
        }
        // Only the due entries of the timer queue (timers.rs), not every connection.
        while let Some((at, token)) = inner.timers.pop_due(now) {
            let Some(c) = self.host.conns.get(&token) else {
                continue; // released since
            };
            let mut st = c.lock();
            if st.queued != Some(at) {
                continue; // superseded by an earlier entry
            }
            st.queued = None;
            if st.armed.is_some_and(|t| t <= now) {
                st.armed = None;
                st.conn.on_timeout(now);
                c.drive(&mut st, now);
            } else {
                // The deadline moved later (or went away) since it was queued.
                c.schedule(&mut st);
            }
        }
    }

    /// Wakes the event thread if something made a deadline earlier than the one it
    /// sleeps towards, or gave it a descriptor to watch (a thread other than the event
    /// thread ran the endpoint).
    fn wake_if_needed(&self, inner: &Inner) {
        let sooner = self
            .next_deadline(inner)
            .is_some_and(|d| self.sleep_until.is_none_or(|s| d < s));
        if sooner || self.poll_set_changed {
            inner.wake();
        }
    }

    fn next_deadline(&self, inner: &Inner) -> Option<Instant> {
        [
            self.ep.poll_timeout(),
            inner.timers.next(),
            self.host.lingering_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Releases connections that are closed and no longer referenced by the application.
    /// Looks only at the connections that reached CLOSED or were released since the
    /// last time (`Inbox::ConnClosed`, `Inbox::Released`): one of the two is always
    /// the last step before a connection can go.
    fn reap(&mut self, inner: &Arc<Inner>, now: Instant, check: &mut Vec<u32>) {
        // Swapped, not taken: both vectors keep their capacity.
        std::mem::swap(&mut self.reap_check, check);
        for t in check.drain(..) {
            let done = self.host.conns.get(&t).is_some_and(|c| {
                let st = c.lock();
                st.released && st.conn.state() == State::Closed
            });
            if !done {
                continue;
            }
            let Some(c) = self.host.conns.remove(&t) else {
                continue;
            };
            let rdma = {
                let mut st = c.lock();
                if let Some(tcp) = st.tcp.take() {
                    if !st.tcp_done {
                        self.unwatch(&tcp);
                    }
                }
                st.rdma().map(|p| (p.link.clone(), p.sndbuf_mr.clone()))
            };
            let (Some(lgr), Some((link, mr))) = (c.lgr(), rdma) else {
                // Same host: the mappings and descriptors go with the last reference
                // (the application's handle is gone by now).
                self.shm_conns.remove(&t);
                // Our region back to the session with the peer's stack (reused by the
                // next connection with it) if the peer sent its last CDC; otherwise
                // dropped, and the peer told.
                if let (Some(p), Some(sh)) = (c.shm(), &inner.same_host) {
                    if let Some(link) = p.session {
                        let clean = c.lock().conn.peer_finished();
                        sh.give_back(link, p.own_mem(c.rmb.clone()), clean);
                    }
                }
                // Our own memory (never mapped by the peer): reused as it is, a new
                // connection sends only what its application writes into it.
                if self.shm_sndbufs.len() < inner.cfg.rmb_cache
                    && c.sndbuf.len() == inner.cfg.sndbuf_size
                {
                    self.shm_sndbufs.push(c.sndbuf.clone());
                }
                release_token(inner, t);
                debug!(token = t, "same-host connection released");
                continue;
            };
            // The send buffer is registered on the PD of the connection's last link.
            let pool = self.host.sndbufs.entry((lgr, link.id)).or_default();
            if pool.len() < inner.cfg.rmb_cache && !link.dead.load(Ordering::SeqCst) {
                pool.push((c.sndbuf.clone(), mr));
            }
            debug!(token = t, "connection released");
            self.ep(inner, |ep, h| ep.conn_released(now, h, t));
        }
        // Timer entries of released connections (timers.rs), once they outnumber the
        // live ones. The heap's lock is taken alone here (no connection lock inside it).
        if inner.timers.len() > 2 * (self.host.conns.len() + 64) {
            let conns = &self.host.conns;
            inner.timers.retain_tokens(|t| conns.contains_key(&t));
        }
        self.listeners
            .retain(|_, l| !l.closed.load(Ordering::SeqCst));
    }

    /// Process exit: terminate every link group and post what that sends. Returns
    /// whether there was anything to end.
    pub(crate) fn goodbye(&mut self, inner: &Arc<Inner>, now: Instant) -> bool {
        let any = self.ep.has_active_link_groups();
        if any {
            self.ep(inner, |ep, h| ep.terminate_all(now, h));
        }
        any
    }

    /// See `Stack::inject_link_failure`.
    pub(crate) fn inject_link_failure(&mut self, lgr: LinkGroupId, num: u8) -> bool {
        match self.link_by_num(lgr, num) {
            Some(l) => {
                warn!(lgr = lgr.0, num, "injected link failure: QP to ERR");
                l.fail();
                true
            }
            None => false,
        }
    }

    /// Link `num` of link group `lgr`, if it exists (`Stack::inject_link_failure`,
    /// `Stack::hold_link_completions`).
    pub(crate) fn link_by_num(&self, lgr: LinkGroupId, num: u8) -> Option<Arc<LinkRes>> {
        let id = clc::LgrId(lgr.0);
        self.ep
            .link_groups()
            .into_iter()
            .filter(|g| g.id == id)
            .flat_map(|g| g.links)
            .find(|l| l.num == num)
            .and_then(|l| self.host.links.get(&(id, l.id)).cloned())
    }

    /// After an interface or address change: a device whose address is gone or whose
    /// interface is down fails its links now (their connections fail over, RFC 7609
    /// §4.6, or end if no link is left), and gets no new link until it is back.
    pub(crate) fn check_paths(&mut self, inner: &Arc<Inner>) {
        for i in 0..self.host.devices.len() {
            let (ip, dev) = &self.host.devices[i];
            let (ip, Some(dev)) = (*ip, dev.clone()) else {
                continue;
            };
            match smc_verbs::netdev::path_state(ip) {
                PathState::Up => {
                    if self.host.paths_down.remove(&ip) {
                        info!(%ip, device = dev.name(), "device's path is up again: links may be added on it");
                    }
                }
                down => {
                    if !self.host.paths_down.insert(ip) {
                        continue;
                    }
                    let why = match down {
                        PathState::AddressGone => "address removed".to_string(),
                        PathState::InterfaceDown(n) => format!("interface {n} down"),
                        PathState::Up => unreachable!(),
                    };
                    inner.counters.paths_down.fetch_add(1, Ordering::Relaxed);
                    let links: Vec<_> = self
                        .host
                        .links
                        .values()
                        .filter(|l| l.device.same(&dev))
                        .cloned()
                        .collect();
                    warn!(%ip, device = dev.name(), reason = %why, links = links.len(),
                        "device's path lost: failing its links");
                    for l in links {
                        l.fail();
                    }
                }
            }
        }
    }

    /// Links that ended in order and still acknowledge the peer (`HostState::lingering`).
    pub(crate) fn lingering_links(&self) -> usize {
        self.host.lingering.len()
    }

    /// Destroys every lingering link now (process exit).
    pub(crate) fn end_lingering(&mut self) {
        self.host.expire_lingering(Instant::now(), true);
    }

    pub(crate) fn terminate_all(&mut self, inner: &Arc<Inner>, now: Instant) {
        self.ep(inner, |ep, h| ep.terminate_all(now, h));
    }

    fn shutdown(&mut self, inner: &Arc<Inner>) {
        let now = Instant::now();
        self.terminate_all(inner, now);
        for c in self.host.conns.values() {
            let mut st = c.lock();
            st.conn.kill(AbortReason::LinkLost);
            c.drive(&mut st, now);
            if let Some(tcp) = st.tcp.take() {
                if !st.tcp_done {
                    self.unwatch(&tcp);
                }
            }
        }
        for res in self.host.links.values() {
            res.destroy();
        }
        self.host.expire_lingering(now, true);
        for (_, r) in std::mem::take(&mut self.rdvs) {
            if let Origin::Connect(slot) = &r.origin {
                slot.complete(Err(io::Error::new(
                    ErrorKind::ConnectionAborted,
                    "SMC-R stack stopped",
                )));
            }
        }
        self.host.conns.clear();
        self.host.links.clear();
        self.listeners.clear();
    }

    // -----------------------------------------------------------------------------------
    // Listings

    pub(crate) fn link_group_infos(&self) -> Vec<LinkGroupInfo> {
        self.ep
            .link_groups()
            .into_iter()
            .map(|g| LinkGroupInfo {
                id: LinkGroupId(g.id.0),
                role: match g.role {
                    clc::Role::Server => "server",
                    clc::Role::Client => "client",
                },
                version: g.version.wire(),
                peer: g.peer.to_string(),
                links: g
                    .links
                    .iter()
                    .map(|l| LinkListing {
                        num: l.num,
                        state: format!("{:?}", l.state),
                        qpn: l.qpn,
                        peer_qpn: l.peer_qpn,
                        device: self.host.device_name(l.device),
                        gid: self.host.device_gid(l.device),
                        peer_gid: l.peer_gid.map(|p| p.to_string()),
                    })
                    .collect(),
                conns: g.conns,
                rmbs: g.rmbs,
                rmbs_in_use: g.rmbs_in_use,
                idle: g.idle,
            })
            .collect()
    }

    /// Sizes of the RMBs registered and of the send buffers (in use or pooled):
    /// size in bytes → how many.
    pub(crate) fn buffer_sizes(&self) -> BufferSizes {
        let mut b = BufferSizes::default();
        for r in self.host.rmbs.values() {
            *b.rmbs.entry(r.buf.len()).or_default() += 1;
        }
        for c in self.host.conns.values() {
            *b.sndbufs.entry(c.sndbuf.len()).or_default() += 1;
        }
        for (buf, _) in self.host.sndbufs.values().flatten() {
            *b.sndbufs.entry(buf.len()).or_default() += 1;
        }
        for buf in &self.shm_sndbufs {
            *b.sndbufs.entry(buf.len()).or_default() += 1;
        }
        b
    }

    pub(crate) fn listener_addrs(&self) -> Vec<SocketAddr> {
        self.listeners.values().map(|l| l.local).collect()
    }

    pub(crate) fn conn_infos(&self) -> Vec<ConnInfo> {
        let nums: BTreeMap<(clc::LgrId, crate::llc::LinkId), u8> = self
            .ep
            .link_groups()
            .into_iter()
            .flat_map(|g| g.links.into_iter().map(move |l| ((g.id, l.id), l.num)))
            .collect();
        let mut v: Vec<ConnInfo> = self
            .host
            .conns
            .values()
            .map(|c| {
                let st = c.lock();
                ConnInfo {
                    local: c.local,
                    peer: c.peer,
                    mode: match (c.lgr(), st.failovers) {
                        (None, _) => "same-host".into(),
                        (Some(_), 0) => format!("SMC-Rv{}", c.version),
                        (Some(_), n) => {
                            format!("SMC-Rv{} (moved to another link {n}x)", c.version)
                        }
                    },
                    failovers: st.failovers,
                    link: match (c.lgr(), st.rdma()) {
                        (Some(lgr), Some(p)) => nums.get(&(lgr, p.link.id)).copied(),
                        _ => None,
                    },
                    state: st.conn.state().to_string(),
                    lgr: c.lgr().map(|l| LinkGroupId(l.0)),
                    bytes_sent: c.bytes_sent.load(Ordering::Relaxed),
                    bytes_placed: c.bytes_placed.load(Ordering::Relaxed),
                    bytes_unacked: st.conn.tx_outstanding(),
                    bytes_received: c.bytes_received.load(Ordering::Relaxed),
                }
            })
            .collect();
        for r in self.rdvs.values() {
            v.push(ConnInfo {
                local: r.local,
                peer: r.peer,
                mode: "rendezvous".into(),
                state: "CLC".into(),
                lgr: None,
                bytes_sent: 0,
                bytes_placed: 0,
                bytes_unacked: 0,
                bytes_received: 0,
                failovers: 0,
                link: None,
            });
        }
        v
    }

    pub(crate) fn stats(&self) -> Stats {
        let links = self.host.links.len();
        let (rmbs, in_use) = self.ep.rmb_counts();
        let c = self.ep.counters();
        Stats {
            link_groups: self.ep.link_groups().len(),
            links,
            qps_open: links,
            rmbs,
            rmb_elements_in_use: in_use,
            smc_connections: self.host.conns.len(),
            same_host_connections: self.shm_conns.len(),
            same_host_total: c.same_host_total,
            handshakes: self.rdvs.len(),
            listeners: self.listeners.len(),
            smc_total: c.smc_total,
            first_contacts: c.first_contacts,
            fallbacks: c.fallbacks,
            resets: c.resets,
            rmbs_deleted: c.rmbs_deleted,
            lgrs_ended: c.lgrs_ended,
            links_failed: c.links_failed,
            failovers: c.failovers,
            llc_received: c.llc_received,
            llc_dropped: c.llc_dropped,
            ..Stats::default()
        }
    }
}

// ---------------------------------------------------------------------------------------
// Entry points from API threads

/// Client: start the rendezvous on a connected TCP socket; the event thread drives it
/// and completes `slot`.
pub(crate) fn register_client(
    inner: &Arc<Inner>,
    tcp: TcpStream,
    slot: Arc<ConnectSlot>,
    bufs: BufSizes,
    self_driven: bool,
) -> io::Result<Option<TcpId>> {
    let local = tcp.local_addr()?;
    let peer = tcp.peer_addr()?;
    // The allow/deny lists first (crate::policy): a kept-TCP connection sends nothing.
    let elig = match inner.cfg.policy.keeps_tcp(peer) {
        Some(reason) => crate::clc::Eligibility::NotEligible { reason },
        None => eligibility(inner, &tcp, peer),
    };
    tcp.set_nonblocking(true)?;
    let mut core = inner.lock_core();
    // The Proposal (or a not-eligible connection's end) goes out right here: one thread
    // hop less per connection.
    let id = core.start_rendezvous(inner, tcp, local, peer, elig, Origin::Connect(slot), bufs);
    // Unless it ended already (a connection kept on TCP).
    if self_driven && core.rdvs.contains_key(&id) {
        // The caller reads the reply itself (drive_client_rendezvous), and hands over
        // if it waits long: the event thread need not look at this socket or at the
        // rendezvous's timers (seconds away) before then.
        core.wake_if_needed(inner);
        Ok(Some(id))
    } else {
        drop(core);
        inner.wake();
        Ok(None)
    }
}

/// How long a client's thread waits for the server's next CLC message itself before it
/// hands the rendezvous to the event thread (whose poll then also watches the timers).
const SELF_DRIVE: Duration = Duration::from_millis(100);

/// The connecting thread takes the server's CLC replies off its socket and runs the
/// rendezvous on them itself, under the core's lock, as the event thread would: the
/// reply of a subsequent contact then finishes the connection on the thread that waits
/// for it, without two thread hand-offs (issue 15: about one in seven of a connection's
/// context switches). Returns once the rendezvous is done, waits for something other
/// than bytes on the socket (a first contact's CONFIRM LINK), or nothing came within
/// [`SELF_DRIVE`] or by `limit`: the event thread is then woken to take over. The event
/// thread may take the reply itself meanwhile (it polls every rendezvous socket when it
/// runs): whoever holds the lock first reads it, and `slot`'s completion wakes `waker`.
pub(crate) fn drive_client_rendezvous(
    inner: &Arc<Inner>,
    id: TcpId,
    slot: &ConnectSlot,
    waker: &smc_verbs::DriveWaker,
    limit: Instant,
) {
    let mut buf = [0u8; 4096];
    loop {
        if slot.is_complete() {
            return;
        }
        let fd = {
            let mut core = inner.lock_core();
            let wanted = core.ep.bytes_wanted(id);
            let Some(r) = core.rdvs.get_mut(&id) else {
                return;
            };
            if !r.out.is_empty() {
                flush_out(r);
            }
            if !r.out.is_empty() || wanted == 0 {
                break;
            }
            r.tcp.as_raw_fd()
        };
        let wait = limit
            .saturating_duration_since(Instant::now())
            .min(SELF_DRIVE);
        if wait.is_zero() {
            break;
        }
        // The socket may be closed once the lock is dropped (the event thread finished
        // the rendezvous): its number is only polled, never read, and that finish
        // completes `slot`, which rings `waker`.
        let mut fds = [
            pfd(fd, libc::POLLIN),
            pfd(waker.fd().as_raw_fd(), libc::POLLIN),
        ];
        let ms = wait.as_micros().div_ceil(1000) as i32;
        // SAFETY: `fds` is a valid array of pollfd for the duration of the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if rc < 0 && io::Error::last_os_error().kind() == ErrorKind::Interrupted {
            continue;
        }
        if rc <= 0 {
            // Nothing came in time, or poll failed: the event thread's business.
            break;
        }
        if fds[1].revents != 0 {
            waker.clear();
        }
        if fds[0].revents != 0 {
            let mut core = inner.lock_core();
            core.on_rdv_io(inner, id, Instant::now(), &mut buf);
            core.wake_if_needed(inner);
        }
    }
    if inner.lock_core().rdvs.contains_key(&id) {
        inner.wake();
    }
}

/// A listening socket the event thread accepts on.
pub(crate) fn register_listener(
    inner: &Arc<Inner>,
    sock: TcpListener,
    bufs: BufSizes,
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
        queue: Mutex::new(std::collections::VecDeque::new()),
        cond: Cond::new(),
        closed: Default::default(),
        nonblocking: Default::default(),
        waker: Mutex::new(None),
        bufs,
    });
    core.listeners.insert(id, l.clone());
    drop(core);
    inner.wake();
    Ok(l)
}

// ---------------------------------------------------------------------------------------
// The event loop

#[derive(Clone, Copy)]
enum Fd {
    Wake,
    Listener(u64),
    Rdv(TcpId),
    /// The epoll set of the established connections' idle TCP sockets.
    Conns,
    NetMon,
    /// A same-host connection's doorbell.
    Bell(u32),
    /// The same-host sessions' epoll set (something came on a session, or a peer stack
    /// ended its session).
    Sessions,
}

pub(crate) fn run(inner: Arc<Inner>) {
    debug!("event thread started");
    let mut buf = vec![0u8; 16 * 1024];
    // Kept across iterations (cleared, capacity reused): a wake-up in steady state
    // allocates nothing (tests/no_alloc.rs).
    let mut fds: Vec<libc::pollfd> = Vec::new();
    let mut what: Vec<Fd> = Vec::new();
    let mut msgs: Vec<Inbox> = Vec::new();
    let mut ready: Vec<epoll::Event> = Vec::with_capacity(EPOLL_BATCH);
    let mut reap_check: Vec<u32> = Vec::new();
    loop {
        if inner.stop.load(Ordering::SeqCst) {
            let mut core = inner.lock_core();
            core.shutdown(&inner);
            debug!("event thread stopped");
            return;
        }
        fds.clear();
        what.clear();
        let mut bell_skipped = false;
        let timeout = {
            let mut core = inner.lock_core();
            core.poll_set_changed = false;
            fds.push(pfd(inner.efd.fd(), libc::POLLIN));
            what.push(Fd::Wake);
            if let Some(m) = &inner.netmon {
                fds.push(pfd(m.as_raw_fd(), libc::POLLIN));
                what.push(Fd::NetMon);
            }
            for l in core.listeners.values() {
                fds.push(pfd(l.sock.as_raw_fd(), libc::POLLIN));
                what.push(Fd::Listener(l.id));
            }
            for (id, r) in &core.rdvs {
                let mut ev = 0;
                if core.ep.bytes_wanted(*id) > 0 {
                    ev |= libc::POLLIN;
                }
                if !r.out.is_empty() {
                    ev |= libc::POLLOUT;
                }
                if ev != 0 {
                    fds.push(pfd(r.tcp.as_raw_fd(), ev));
                    what.push(Fd::Rdv(*id));
                }
            }
            // The established connections' sockets: one fd, however many there are.
            fds.push(pfd(core.epoll.as_fd().as_raw_fd(), libc::POLLIN));
            what.push(Fd::Conns);
            if let Some(fd) = inner.same_host.as_ref().and_then(|s| s.sessions_fd()) {
                fds.push(pfd(fd.as_raw_fd(), libc::POLLIN));
                what.push(Fd::Sessions);
            }
            // Same-host doorbells, one fd per same-host connection (only those).
            for (t, c) in &core.shm_conns {
                let Some(p) = c.shm() else { continue };
                let st = c.lock();
                if st.conn.state() != State::Closed && !st.shm_bell_task {
                    if st.shm_rx_sleepers.is_empty() && st.shm_tx_sleepers.is_empty() {
                        fds.push(pfd(p.bell.fd(), libc::POLLIN));
                        what.push(Fd::Bell(*t));
                    } else {
                        // An application thread sleeps on this bell and takes the
                        // ring itself: waking this thread too would only compete
                        // for the CPU. Looked at again within BELL_RECHECK, for a
                        // CDC that comes after that thread left.
                        bell_skipped = true;
                    }
                }
            }
            let now = Instant::now();
            let timeout = core
                .next_deadline(&inner)
                .map(|d| d.saturating_duration_since(now))
                .unwrap_or(MAX_SLEEP)
                .min(if bell_skipped {
                    BELL_RECHECK
                } else {
                    MAX_SLEEP
                });
            // The connections' deadlines are looked at again under the queue's lock,
            // which also records the plan: a connection that queues an earlier one
            // from now on wakes this thread, a later one does not (timers.rs).
            let until = inner.timers.plan_sleep(now + timeout);
            core.sleep_until = Some(until);
            until.saturating_duration_since(now)
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
        // Only when it rang (`fds[0]`): a read of a quiet eventfd is a system call for
        // nothing, one per loop. A ring after poll returned keeps it readable, so the
        // next poll returns at once; the inbox is taken below either way.
        if fds[0].revents != 0 {
            inner.efd.drain();
        }
        if let Ok(mut i) = inner.inbox.lock() {
            // Swapped, not taken: both vectors keep their capacity.
            std::mem::swap(&mut *i, &mut msgs);
        }
        for m in msgs.drain(..) {
            core.on_inbox(&inner, m, now);
        }
        core.check_activity(now);
        for (p, w) in fds.iter().zip(what.iter()) {
            if p.revents == 0 {
                continue;
            }
            match *w {
                Fd::Wake => {}
                Fd::NetMon => {
                    if inner.netmon.as_ref().is_some_and(|m| m.drain(&mut buf)) {
                        core.check_paths(&inner);
                    }
                }
                Fd::Listener(id) => core.on_listener(&inner, id),
                Fd::Rdv(id) => core.on_rdv_io(&inner, id, now, &mut buf),
                Fd::Bell(t) => {
                    // The same-host peer put CDCs in our ring (or made room in its).
                    if let Some(c) = core.shm_conns.get(&t).cloned() {
                        if let Some(p) = c.shm() {
                            p.bell.drain();
                        }
                        c.shm_poll(now);
                    }
                }
                Fd::Sessions => {
                    if let Some(sh) = &inner.same_host {
                        sh.on_sessions();
                    }
                }
                Fd::Conns => {
                    ready.clear();
                    let zero = rustix::event::Timespec {
                        tv_sec: 0,
                        tv_nsec: 0,
                    };
                    match epoll::wait(
                        &core.epoll,
                        rustix::buffer::spare_capacity(&mut ready),
                        Some(&zero),
                    ) {
                        Ok(_) => {
                            for ev in ready.iter() {
                                let data = ev.data;
                                core.on_conn_tcp(&inner, data.u64() as u32, now);
                            }
                        }
                        Err(e) => debug!(error = %e, "epoll_wait failed"),
                    }
                }
            }
        }
        core.on_timers(&inner, now);
        core.host.expire_lingering(now, false);
        core.reap(&inner, now, &mut reap_check);
    }
}

fn pfd(fd: i32, events: i16) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

fn flush_out(r: &mut RdvIo) {
    while !r.out.is_empty() {
        match r.tcp.write(&r.out) {
            Ok(0) => return,
            Ok(n) => {
                r.out.drain(..n);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
    }
}

/// Same-host memory that no connection took (its rendezvous ended another way): its
/// token goes back, and its region to its session as not clean, so that the peer is
/// told to drop its mapping (and the session's count of live connections is right).
fn drop_shm_setup(inner: &Inner, setup: super::shm::ShmSetup) {
    release_token(inner, setup.local_token);
    if let (Some(link), Some(sh)) = (setup.session, inner.same_host.as_ref()) {
        sh.give_back(link, setup.rx, false);
    }
}

fn release_token(inner: &Inner, token: u32) {
    if let Ok(mut t) = inner.tokens.write() {
        t.release(token);
    }
}
