//! One simulated host: an [`Endpoint`], its [`Host`] glue (QPs, registered memory,
//! tokens), its connections' `Conn` machines and the applications using them.

use ::core::net::IpAddr;
use std::collections::BTreeMap;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::SeedableRng;
use smc_wire::common::{Gid, Mac, PeerId, QpMtu, U24};

use super::fabric::{node_of_qpn, Post, Wr};
use super::{eligible, World, DEVICE, MTU};
use crate::clc::{LgrId, V2Route};
use crate::conn::{CdcRepr, Conn, ConnConfig, ConnError, Events, State};
use crate::endpoint::tokens::{Route, TokenTable};
use crate::endpoint::{
    ConnAction, DeviceInfo, Endpoint, EndpointConfig, FailoverTarget, Host, HostError, Output,
    RendezvousOutcome, TcpId,
};
use crate::llc::{self, DeviceId, QpInfo, RToken, SendId};

const WR_LLC: u64 = 1 << 63;
/// A failover validation CDC (consumes no sequence number; its completion means nothing
/// to the connection).
const WR_VALIDATION: u64 = 1 << 62;

/// What an application does on its connection.
#[derive(Clone, Debug)]
pub enum App {
    /// Send `data`, shut down writing, read to the end, close. `half_close_first`: shut
    /// down writing at once, before sending anything (`data` must be empty).
    Client {
        /// What to send.
        data: Vec<u8>,
        /// Shut down writing as soon as the connection is up.
        half_close_first: bool,
    },
    /// Echo everything; shut down writing after the peer did; close.
    Echo,
}

/// How an application's connection went.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppResult {
    /// SMC-R (true) or TCP fallback (false), once the rendezvous ended; `None` while it
    /// runs or after a reset.
    pub smc: Option<bool>,
    /// The rendezvous ended in a reset.
    pub reset: bool,
    /// Bytes read.
    pub received: Vec<u8>,
    /// The connection ended with this error.
    pub error: Option<ConnError>,
    /// Read to the end and closed.
    pub done: bool,
}

struct AppSlot {
    app: App,
    res: AppResult,
    /// Bytes of `data` committed (or sent over TCP on fallback).
    sent: usize,
    shut: bool,
    /// Echo: read, not yet written back.
    pending: Vec<u8>,
}

/// What a node asks the world to do.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    /// (tcp, data, fin, rst).
    pub tcp: Vec<(TcpId, Vec<u8>, bool, bool)>,
    pub posts: Vec<Post>,
    /// Run the node again soon (applications have work).
    pub wake: bool,
}

struct SimQp {
    lgr: LgrId,
    link: llc::LinkId,
    peer: Option<u32>,
    dead: bool,
}

struct SimMr {
    lgr: LgrId,
    rmb: u32,
    base: u64,
}

struct SimConn {
    conn: Conn,
    lgr: LgrId,
    link: llc::LinkId,
    rmb: u32,
    sndbuf: Vec<u8>,
    peer_rkey: u32,
    peer_base: u64,
    tcp: TcpId,
    app: usize,
    closed_by_app: bool,
    tcp_fin_sent: bool,
    /// CDCs posted and not completed, by QP.
    outstanding: BTreeMap<u32, usize>,
    /// Moving to another link: the old link's QP, whose CDCs must all complete first
    /// (RFC 7609 §2.3); nothing is transmitted meanwhile.
    failover_from: Option<u32>,
}

/// The host side of one node.
struct SimHost {
    id: usize,
    qps: BTreeMap<u32, SimQp>,
    by_link: BTreeMap<(LgrId, llc::LinkId), u32>,
    rmbs: BTreeMap<(LgrId, u32), Vec<u8>>,
    mrs: BTreeMap<u32, SimMr>,
    next_qpn: u32,
    next_rkey: u32,
    tokens: TokenTable<u32>,
    rng: StdRng,
    conns: BTreeMap<u32, SimConn>,
    /// Memory-safety violations seen (writes outside registered memory): must stay 0.
    violations: u64,
    /// First links connect to nothing: what is sent on them fails at once.
    unreachable_first_link: bool,
}

/// A rendezvous' inbound TCP bytes.
#[derive(Default)]
struct TcpIn {
    buf: Vec<u8>,
    fin: bool,
    rst: bool,
    /// `fin`/`rst` were handed to the rendezvous.
    told: bool,
    /// The client application (None: a server connection, served by the echo app).
    app: Option<usize>,
    /// After a fallback, the application's connection.
    fallback_app: Option<usize>,
}

/// A simulated host.
pub struct Node {
    /// Index in the world.
    pub id: usize,
    /// Its address.
    pub ip: IpAddr,
    /// The endpoint under test.
    pub ep: Endpoint,
    hs: SimHost,
    conn_cfg: ConnConfig,
    peer_id: PeerId,
    gid: Gid,
    mac: Mac,
    apps: Vec<AppSlot>,
    tcps: BTreeMap<TcpId, TcpIn>,
    /// Established connections by TCP id.
    tcp_conn: BTreeMap<TcpId, u32>,
    out: Outbox,
    /// FINs handed to a running rendezvous (the race was reached).
    pub fins_in_rendezvous: u64,
}

impl Node {
    pub(crate) fn new(
        id: usize,
        ip: IpAddr,
        cfg: EndpointConfig,
        conn: ConnConfig,
        seed: u64,
        devices: u8,
    ) -> Node {
        let mut ep = Endpoint::new(cfg);
        let v4 = match ip {
            IpAddr::V4(a) => a,
            IpAddr::V6(_) => unreachable!("the simulator uses IPv4"),
        };
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&v4.octets());
        let gid = Gid(g);
        let mac = Mac([0x02, 0, 0, 0, 0, id as u8 + 1]);
        ep.add_device(DeviceInfo {
            id: DEVICE,
            gid,
            mac,
            mtu: MTU,
        });
        let mut node = Node {
            id,
            ip,
            ep,
            hs: SimHost {
                id,
                qps: BTreeMap::new(),
                by_link: BTreeMap::new(),
                rmbs: BTreeMap::new(),
                mrs: BTreeMap::new(),
                next_qpn: 1,
                next_rkey: 1,
                tokens: TokenTable::default(),
                rng: StdRng::seed_from_u64(seed),
                conns: BTreeMap::new(),
                violations: 0,
                unreachable_first_link: false,
            },
            conn_cfg: conn,
            peer_id: PeerId {
                instance: 0x100 + id as u16,
                mac,
            },
            gid,
            mac,
            apps: Vec::new(),
            tcps: BTreeMap::new(),
            tcp_conn: BTreeMap::new(),
            out: Outbox::default(),
            fins_in_rendezvous: 0,
        };
        if devices > 1 {
            // More RNICs, on 10.0.<d>.0/24: every device may carry links (RFC 7609
            // §2.2), so link groups get a second, symmetric link.
            let now = Instant::now();
            for d in 0..devices {
                let mut g = gid.0;
                g[14] = d;
                let dev = DeviceInfo {
                    id: DeviceId(u32::from(d)),
                    gid: Gid(g),
                    mac: Mac([0x02, d, 0, 0, 0, id as u8 + 1]),
                    mtu: MTU,
                };
                node.ep.add_link_device(now, &mut node.hs, dev);
            }
        }
        node
    }

    pub(crate) fn add_app(&mut self, app: App) -> usize {
        self.apps.push(AppSlot {
            app,
            res: AppResult::default(),
            sent: 0,
            shut: false,
            pending: Vec::new(),
        });
        self.apps.len() - 1
    }

    /// The results of this node's client applications, in the order they were added
    /// (server connections get an echo application each, appended as they come).
    pub fn results(&self) -> Vec<&AppResult> {
        self.apps.iter().map(|a| &a.res).collect()
    }

    /// From now on, the first link of every new link group cannot reach its peer: its
    /// sends (CONFIRM LINK) complete in error at once.
    pub fn unreachable_first_link(&mut self) {
        self.hs.unreachable_first_link = true;
    }

    /// Memory-safety violations seen by this node's simulated RNIC.
    pub fn violations(&self) -> u64 {
        self.hs.violations
    }

    /// Connections still alive.
    pub fn conns(&self) -> usize {
        self.hs.conns.len()
    }

    /// Alert tokens in use.
    pub fn tokens(&self) -> usize {
        self.hs.tokens.len()
    }

    /// The QP numbers of this node's links.
    pub fn qpns(&self) -> Vec<u32> {
        self.hs
            .qps
            .iter()
            .filter(|(_, q)| !q.dead)
            .map(|(n, _)| *n)
            .collect()
    }

    /// The QPs the connections' data goes on (their current links).
    pub fn conn_qps(&self) -> Vec<u32> {
        self.hs
            .conns
            .values()
            .filter_map(|c| self.hs.by_link.get(&(c.lgr, c.link)).copied())
            .collect()
    }

    /// Whether QP `qpn` belongs to a link the llc machine has active.
    pub fn qp_active(&self, qpn: u32) -> bool {
        self.hs.qps.get(&qpn).is_some_and(|q| {
            !q.dead
                && self.ep.link_groups().iter().any(|g| {
                    g.id == q.lgr
                        && g.links
                            .iter()
                            .any(|l| l.id == q.link && l.state == llc::LinkState::Active)
                })
        })
    }

    /// RMBs allocated.
    pub fn rmbs(&self) -> usize {
        self.hs.rmbs.len()
    }

    pub(crate) fn qp_peer(&self, qpn: u32) -> Option<u32> {
        let q = self.hs.qps.get(&qpn)?;
        if q.dead {
            None
        } else {
            q.peer
        }
    }

    /// Nothing to do but wait for timers.
    pub(crate) fn quiet(&self) -> bool {
        self.ep.rendezvous_count() == 0
            && self.hs.conns.is_empty()
            && self
                .apps
                .iter()
                .all(|a| a.res.done || a.res.reset || a.res.error.is_some())
    }

    pub(crate) fn next_timer(&self) -> Option<Instant> {
        let mut t = self.ep.poll_timeout();
        for c in self.hs.conns.values() {
            if let Some(x) = c.conn.poll_timeout() {
                t = Some(t.map_or(x, |y| y.min(x)));
            }
        }
        t
    }

    fn take(&mut self) -> Outbox {
        std::mem::take(&mut self.out)
    }

    // -----------------------------------------------------------------------------------
    // Inputs from the world

    pub(crate) fn accept(
        &mut self,
        now: Instant,
        tcp: TcpId,
        local: IpAddr,
        peer: IpAddr,
    ) -> Outbox {
        let app = self.add_app(App::Echo);
        self.tcps.insert(
            tcp,
            TcpIn {
                app: Some(app),
                ..TcpIn::default()
            },
        );
        let route = World::server_route(self.peer_id, self.ip);
        self.ep.accept(
            now,
            &mut self.hs,
            tcp,
            local,
            peer,
            route,
            eligible(),
            Some(DEVICE),
            crate::endpoint::BufSizes::default(),
        );
        self.settle(now);
        self.take()
    }

    pub(crate) fn connect(
        &mut self,
        now: Instant,
        tcp: TcpId,
        local: IpAddr,
        peer: IpAddr,
        app: usize,
    ) -> Outbox {
        self.tcps.insert(
            tcp,
            TcpIn {
                app: Some(app),
                ..TcpIn::default()
            },
        );
        let route = World::client_route(self.peer_id, self.gid, self.mac);
        self.ep.connect(
            now,
            &mut self.hs,
            tcp,
            local,
            peer,
            route,
            eligible(),
            Some(DEVICE),
            crate::endpoint::BufSizes::default(),
        );
        self.settle(now);
        self.take()
    }

    pub(crate) fn tcp_in(
        &mut self,
        now: Instant,
        tcp: TcpId,
        data: &[u8],
        fin: bool,
        rst: bool,
    ) -> Outbox {
        if let Some(&token) = self.tcp_conn.get(&tcp) {
            // The idle TCP connection of an established SMC-R connection.
            if rst {
                self.ep.conn_tcp_error(token);
            } else if fin {
                let closing = self.hs.conns.get(&token).is_some_and(|c| {
                    !matches!(c.conn.state(), State::Active | State::PeerCloseWait1)
                });
                self.ep.conn_tcp_fin(now, &mut self.hs, token, closing);
            }
        } else if let Some(t) = self.tcps.get_mut(&tcp) {
            t.buf.extend_from_slice(data);
            t.fin |= fin;
            t.rst |= rst;
        }
        self.settle(now);
        self.take()
    }

    pub(crate) fn deliver(&mut self, now: Instant, qpn: u32, wr: Wr) -> (Outbox, u64) {
        let mut early = 0;
        let Some(q) = self.hs.qps.get(&qpn) else {
            return (self.take(), 0);
        };
        if q.dead {
            return (self.take(), 0);
        }
        let (lgr, link) = (q.lgr, q.link);
        match wr {
            Wr::Write { rkey, addr, data } => {
                let ok = self.hs.mrs.get(&rkey).is_some_and(|m| {
                    m.lgr == lgr
                        && addr >= m.base
                        && self
                            .hs
                            .rmbs
                            .get(&(m.lgr, m.rmb))
                            .is_some_and(|b| (addr - m.base) as usize + data.len() <= b.len())
                });
                if ok {
                    let m = &self.hs.mrs[&rkey];
                    let off = (addr - m.base) as usize;
                    let key = (m.lgr, m.rmb);
                    if let Some(b) = self.hs.rmbs.get_mut(&key) {
                        b[off..off + data.len()].copy_from_slice(&data);
                    }
                } else {
                    self.hs.violations += 1;
                }
            }
            Wr::Send { bytes, .. } => {
                if bytes.first() == Some(&0xFE) {
                    if let Ok(msg) = CdcRepr::parse_bytes(&bytes) {
                        match self.hs.tokens.route(lgr, &msg) {
                            Route::Conn(token) => self.on_cdc(now, token, &msg),
                            Route::Kept => early += 1,
                            Route::Dropped(_) => {}
                        }
                    }
                } else {
                    self.ep.link_activity(now, lgr, link);
                    self.ep.handle_llc(now, &mut self.hs, lgr, link, &bytes);
                }
            }
        }
        self.settle(now);
        (self.take(), early)
    }

    pub(crate) fn complete(&mut self, now: Instant, qpn: u32, wr_id: u64, ok: bool) -> Outbox {
        let Some(q) = self.hs.qps.get(&qpn) else {
            return self.take();
        };
        // After a QP failed, everything outstanding completes with a flush error.
        let ok = ok && !q.dead;
        let (lgr, link) = (q.lgr, q.link);
        if wr_id & WR_LLC != 0 {
            self.ep
                .handle_llc_sent(now, &mut self.hs, lgr, link, SendId(wr_id & !WR_LLC), ok);
        } else if wr_id & WR_VALIDATION != 0 {
            if !ok {
                // The new link failed too: the endpoint moves the connection again.
                self.ep.handle_link_error(now, &mut self.hs, lgr, link);
            }
        } else {
            let token = (wr_id >> 16) as u32;
            let seq = wr_id as u16;
            if let Some(c) = self.hs.conns.get_mut(&token) {
                if let Some(n) = c.outstanding.get_mut(&qpn) {
                    *n = n.saturating_sub(1);
                }
                if ok {
                    c.conn.on_cdc_sent(seq);
                } else {
                    c.conn.on_cdc_send_failed(seq);
                }
                let drained = c.failover_from == Some(qpn)
                    && c.outstanding.get(&qpn).copied().unwrap_or(0) == 0;
                if drained {
                    self.finish_failover(now, token);
                }
                if !ok {
                    // The endpoint decides: failover to another link, or the end.
                    self.ep.handle_link_error(now, &mut self.hs, lgr, link);
                    self.settle(now);
                    if let Some(c) = self.hs.conns.get_mut(&token) {
                        if c.conn.needs_failover() && c.failover_from.is_none() {
                            c.conn.kill(crate::conn::AbortReason::LinkLost);
                        }
                    }
                }
                self.drive(now, token);
            }
        }
        self.settle(now);
        self.take()
    }

    pub(crate) fn qp_failed(&mut self, now: Instant, qpn: u32) -> Outbox {
        if let Some(q) = self.hs.qps.get_mut(&qpn) {
            if !q.dead {
                q.dead = true;
                let (lgr, link) = (q.lgr, q.link);
                self.ep.handle_link_error(now, &mut self.hs, lgr, link);
            }
        }
        self.settle(now);
        self.take()
    }

    pub(crate) fn wake(&mut self, now: Instant) -> Outbox {
        if self.ep.poll_timeout().is_some_and(|t| t <= now) {
            self.ep.handle_timeout(now, &mut self.hs);
        }
        let tokens: Vec<u32> = self.hs.conns.keys().copied().collect();
        for t in tokens {
            if let Some(c) = self.hs.conns.get_mut(&t) {
                if c.conn.poll_timeout().is_some_and(|x| x <= now) {
                    c.conn.on_timeout(now);
                }
            }
            self.drive(now, t);
        }
        self.settle(now);
        self.take()
    }

    // -----------------------------------------------------------------------------------
    // The glue

    /// Endpoint outputs, rendezvous reading, applications and releases, until nothing
    /// moves.
    fn settle(&mut self, now: Instant) {
        loop {
            let mut moved = false;
            while let Some(o) = self.ep.poll_output() {
                moved = true;
                self.apply(now, o);
            }
            moved |= self.pump_rendezvous(now);
            moved |= self.run_apps(now);
            moved |= self.reap(now);
            if !moved {
                return;
            }
        }
    }

    fn apply(&mut self, now: Instant, o: Output) {
        match o {
            Output::TcpSend { tcp, bytes } => self.out.tcp.push((tcp, bytes, false, false)),
            Output::Rendezvous { tcp, outcome } => self.finish(now, tcp, outcome),
            Output::LlcSend {
                lgr,
                link,
                id,
                bytes,
            } => match self.hs.by_link.get(&(lgr, link)) {
                Some(&qpn) => self.out.posts.push(Post {
                    qpn,
                    wr: Wr::Send {
                        wr_id: WR_LLC | id.0,
                        bytes,
                    },
                }),
                None => self
                    .ep
                    .handle_llc_sent(now, &mut self.hs, lgr, link, id, false),
            },
            Output::Conn { token, action } => {
                if let Some(c) = self.hs.conns.get_mut(&token) {
                    match action {
                        ConnAction::Kill(r) => c.conn.kill(r),
                        ConnAction::TcpReset => c.conn.on_tcp_reset(now),
                        ConnAction::Failover(t) => return self.start_failover(now, token, t),
                    }
                    self.drive(now, token);
                }
            }
        }
    }

    fn finish(&mut self, now: Instant, tcp: TcpId, outcome: RendezvousOutcome) {
        let Some(tin) = self.tcps.get_mut(&tcp) else {
            return;
        };
        let app = tin.app.take().expect("an application per connection");
        match outcome {
            RendezvousOutcome::Smc(nc) => {
                let conn = Conn::new(nc.params, self.conn_cfg.clone()).expect("valid parameters");
                // A FIN or RST that came during the rendezvous belongs to the connection.
                let (fin, rst) = (tin.fin, tin.rst);
                self.tcps.remove(&tcp);
                self.tcp_conn.insert(tcp, nc.token);
                self.hs.conns.insert(
                    nc.token,
                    SimConn {
                        conn,
                        lgr: nc.lgr,
                        link: nc.link,
                        rmb: nc.rmb.0,
                        sndbuf: vec![0; nc.params.sndbuf_len as usize],
                        peer_rkey: nc.peer_rkey,
                        peer_base: nc.peer_base,
                        tcp,
                        app,
                        closed_by_app: false,
                        tcp_fin_sent: false,
                        outstanding: BTreeMap::new(),
                        failover_from: None,
                    },
                );
                self.apps[app].res.smc = Some(true);
                for cdc in self.hs.tokens.attach(nc.token, nc.token) {
                    self.on_cdc(now, nc.token, &cdc);
                }
                self.drive(now, nc.token);
                if rst {
                    self.ep.conn_tcp_error(nc.token);
                } else if fin {
                    let closing = self.hs.conns.get(&nc.token).is_some_and(|c| {
                        !matches!(c.conn.state(), State::Active | State::PeerCloseWait1)
                    });
                    self.ep.conn_tcp_fin(now, &mut self.hs, nc.token, closing);
                }
            }
            RendezvousOutcome::SameHost(_) => {
                unreachable!("the simulator's hosts never take a same-host offer")
            }
            RendezvousOutcome::Fallback(_) => {
                self.apps[app].res.smc = Some(false);
                tin.fallback_app = Some(app);
            }
            RendezvousOutcome::Reset(_) => {
                self.apps[app].res.reset = true;
                self.tcps.remove(&tcp);
                self.out.tcp.push((tcp, Vec::new(), false, true));
            }
        }
    }

    /// RFC 7609 §4.6: the connection leaves its link. Its CDCs still outstanding there
    /// complete first (§2.3), then [`Node::finish_failover`].
    fn start_failover(&mut self, now: Instant, token: u32, t: FailoverTarget) {
        let Some(c) = self.hs.conns.get_mut(&token) else {
            return;
        };
        let old = c
            .failover_from
            .or(self.hs.by_link.get(&(c.lgr, c.link)).copied());
        c.link = t.link;
        c.peer_rkey = t.peer_rkey;
        c.peer_base = t.peer_base;
        let busy = old.is_some_and(|q| c.outstanding.get(&q).copied().unwrap_or(0) > 0);
        if busy {
            c.failover_from = old;
        } else {
            self.finish_failover(now, token);
        }
        self.drive(now, token);
    }

    /// The old link is drained: the validation CDC goes first on the new link, then the
    /// unconfirmed writes are replayed (the `Conn` machine's `prepare_failover`).
    fn finish_failover(&mut self, now: Instant, token: u32) {
        let Some(c) = self.hs.conns.get_mut(&token) else {
            return;
        };
        c.failover_from = None;
        let f = c.conn.prepare_failover();
        match (f, self.hs.by_link.get(&(c.lgr, c.link))) {
            (Some(f), Some(&qpn)) => self.out.posts.push(Post {
                qpn,
                wr: Wr::Send {
                    wr_id: WR_VALIDATION | u64::from(token),
                    bytes: f.to_bytes().to_vec(),
                },
            }),
            (Some(_), None) => c.conn.kill(crate::conn::AbortReason::LinkLost),
            (None, _) => {}
        }
        self.drive(now, token);
    }

    fn on_cdc(&mut self, now: Instant, token: u32, msg: &CdcRepr) {
        let Some(c) = self.hs.conns.get_mut(&token) else {
            return;
        };
        let rmb = self.hs.rmbs.get(&(c.lgr, c.rmb));
        c.conn.handle_cdc(msg, now, |off| {
            rmb.and_then(|b| b.get(off as usize)).copied().unwrap_or(0)
        });
        self.drive(now, token);
    }

    /// Posts what the connection wants sent; acts on its events.
    fn drive(&mut self, now: Instant, token: u32) {
        let Some(c) = self.hs.conns.get_mut(&token) else {
            return;
        };
        let qpn = self.hs.by_link.get(&(c.lgr, c.link)).copied();
        while c.failover_from.is_none() {
            let Some(t) = c.conn.poll_transmit(now) else {
                break;
            };
            let Some(qpn) = qpn else {
                c.conn.on_cdc_send_failed(t.cdc.seqno);
                continue;
            };
            for w in t.writes() {
                let src = w.src_off as usize;
                self.out.posts.push(Post {
                    qpn,
                    wr: Wr::Write {
                        rkey: c.peer_rkey,
                        addr: c.peer_base + u64::from(w.dst_off),
                        data: c.sndbuf[src..src + w.len as usize].to_vec(),
                    },
                });
            }
            *c.outstanding.entry(qpn).or_insert(0) += 1;
            self.out.posts.push(Post {
                qpn,
                wr: Wr::Send {
                    wr_id: (u64::from(token) << 16) | u64::from(t.cdc.seqno),
                    bytes: t.cdc.to_bytes().to_vec(),
                },
            });
        }
        let ev = c.conn.take_events();
        if ev.contains(Events::TCP_SHUTDOWN) && !c.tcp_fin_sent {
            c.tcp_fin_sent = true;
            self.out.tcp.push((c.tcp, Vec::new(), true, false));
        }
        if ev.contains(Events::TCP_RESET) {
            self.out.tcp.push((c.tcp, Vec::new(), false, true));
        }
        if ev.intersects(
            Events::READABLE
                | Events::WRITABLE
                | Events::ERROR
                | Events::PEER_DONE
                | Events::CLOSED,
        ) {
            self.out.wake = true;
        }
    }

    /// Feeds buffered TCP bytes to running rendezvous as far as they want them.
    fn pump_rendezvous(&mut self, now: Instant) -> bool {
        let mut moved = false;
        let ids: Vec<TcpId> = self.ep.rendezvous().collect();
        for tcp in ids {
            loop {
                let want = self.ep.bytes_wanted(tcp);
                let Some(t) = self.tcps.get_mut(&tcp) else {
                    break;
                };
                if want == 0 {
                    break;
                }
                if t.buf.is_empty() {
                    if !t.told && (t.rst || t.fin) {
                        t.told = true;
                        if t.rst {
                            self.ep.handle_tcp_error(now, &mut self.hs, tcp);
                        } else {
                            self.fins_in_rendezvous += 1;
                            self.ep.handle_tcp_fin(now, &mut self.hs, tcp);
                        }
                        moved = true;
                    }
                    break;
                }
                let n = want.min(t.buf.len());
                let bytes: Vec<u8> = t.buf.drain(..n).collect();
                let took = self.ep.handle_tcp_bytes(now, &mut self.hs, tcp, &bytes);
                assert_eq!(took, n, "the endpoint takes what it asked for");
                moved = true;
            }
        }
        moved
    }

    /// Runs every application one step. Returns whether anything moved.
    fn run_apps(&mut self, now: Instant) -> bool {
        let mut moved = false;
        let tokens: Vec<u32> = self.hs.conns.keys().copied().collect();
        for token in tokens {
            moved |= self.app_step_smc(now, token);
        }
        let tcps: Vec<TcpId> = self
            .tcps
            .iter()
            .filter(|(_, t)| t.fallback_app.is_some())
            .map(|(id, _)| *id)
            .collect();
        for tcp in tcps {
            moved |= self.app_step_tcp(tcp);
        }
        moved
    }

    fn app_step_smc(&mut self, now: Instant, token: u32) -> bool {
        let Some(c) = self.hs.conns.get_mut(&token) else {
            return false;
        };
        let a = &mut self.apps[c.app];
        if c.closed_by_app {
            return false;
        }
        let mut moved = false;
        if let Some(e) = c.conn.error() {
            a.res.error = Some(e);
            c.conn.close(now);
            c.closed_by_app = true;
            self.drive(now, token);
            return true;
        }
        // Read.
        let regions = c.conn.rx_available();
        let rmb = self.hs.rmbs.get(&(c.lgr, c.rmb));
        let mut n = 0u32;
        for r in regions.as_slice() {
            if let Some(b) = rmb {
                let bytes = &b[r.off as usize..(r.off + r.len) as usize];
                match a.app {
                    App::Echo => a.pending.extend_from_slice(bytes),
                    App::Client { .. } => a.res.received.extend_from_slice(bytes),
                }
            }
            n += r.len;
        }
        if n > 0 {
            c.conn.rx_consume(n).expect("consume what is available");
            moved = true;
        }
        // Write.
        let (data, shut_first): (&[u8], bool) = match &a.app {
            App::Client {
                data,
                half_close_first,
            } => (&data[a.sent..], *half_close_first),
            App::Echo => (&a.pending[..], false),
        };
        if shut_first && !a.shut {
            a.shut = true;
            let _ = c.conn.shutdown_write(now);
            moved = true;
        }
        if !data.is_empty() && !a.shut {
            if let Ok(space) = c.conn.tx_space() {
                let mut w = 0usize;
                for r in space.as_slice() {
                    let take = (r.len as usize).min(data.len() - w);
                    if take == 0 {
                        break;
                    }
                    c.sndbuf[r.off as usize..r.off as usize + take]
                        .copy_from_slice(&data[w..w + take]);
                    w += take;
                }
                if w > 0 {
                    c.conn
                        .tx_commit(w as u32, false)
                        .expect("commit what fitted");
                    match a.app {
                        App::Echo => {
                            a.pending.drain(..w);
                        }
                        App::Client { .. } => a.sent += w,
                    }
                    moved = true;
                }
            }
        }
        let all_sent = match &a.app {
            App::Client { data, .. } => a.sent == data.len(),
            App::Echo => a.pending.is_empty() && c.conn.rx_eof(),
        };
        if all_sent && !a.shut {
            a.shut = true;
            let _ = c.conn.shutdown_write(now);
            moved = true;
        }
        if a.shut && c.conn.rx_eof() && c.conn.rx_available().is_empty() {
            a.res.done = true;
            c.conn.close(now);
            c.closed_by_app = true;
            moved = true;
        }
        if moved {
            self.drive(now, token);
        }
        moved
    }

    /// A fallen-back connection: the same applications over the simulated TCP.
    fn app_step_tcp(&mut self, tcp: TcpId) -> bool {
        let Some(t) = self.tcps.get_mut(&tcp) else {
            return false;
        };
        let Some(ai) = t.fallback_app else {
            return false;
        };
        let a = &mut self.apps[ai];
        let mut moved = false;
        if !t.buf.is_empty() {
            let b: Vec<u8> = t.buf.drain(..).collect();
            match a.app {
                App::Echo => a.pending.extend_from_slice(&b),
                App::Client { .. } => a.res.received.extend_from_slice(&b),
            }
            moved = true;
        }
        let send: Vec<u8> = match &a.app {
            App::Client { data, .. } => data[a.sent..].to_vec(),
            App::Echo => std::mem::take(&mut a.pending),
        };
        if !send.is_empty() {
            if let App::Client { .. } = a.app {
                a.sent += send.len();
            }
            self.out.tcp.push((tcp, send, false, false));
            moved = true;
        }
        let all_sent = match &a.app {
            App::Client { data, .. } => a.sent == data.len(),
            App::Echo => t.fin,
        };
        if all_sent && !a.shut {
            a.shut = true;
            self.out.tcp.push((tcp, Vec::new(), true, false));
            moved = true;
        }
        if t.rst && !a.res.reset {
            // The peer reset the fallen-back connection: the application sees an error.
            a.res.reset = true;
            moved = true;
        }
        if (t.fin || t.rst) && a.shut && !a.res.done {
            a.res.done = true;
            moved = true;
        }
        moved
    }

    /// Connections that are CLOSED and closed by their application are released.
    fn reap(&mut self, now: Instant) -> bool {
        let done: Vec<u32> = self
            .hs
            .conns
            .iter()
            .filter(|(_, c)| c.closed_by_app && c.conn.state() == State::Closed)
            .map(|(t, _)| *t)
            .collect();
        for t in &done {
            if let Some(c) = self.hs.conns.remove(t) {
                self.tcp_conn.remove(&c.tcp);
            }
            self.ep.conn_released(now, &mut self.hs, *t);
        }
        !done.is_empty()
    }
}

impl Host for SimHost {
    fn create_link(
        &mut self,
        lgr: LgrId,
        link: llc::LinkId,
        _device: DeviceId,
    ) -> Result<QpInfo, HostError> {
        let qpn = ((self.id as u32 + 1) << 16) | self.next_qpn;
        self.next_qpn += 1;
        self.qps.insert(
            qpn,
            SimQp {
                lgr,
                link,
                peer: None,
                dead: false,
            },
        );
        self.by_link.insert((lgr, link), qpn);
        Ok(QpInfo {
            qpn: U24::wrapping(qpn),
            psn: U24::wrapping(qpn * 7),
            mtu: QpMtu::Mtu1024,
        })
    }

    fn connect_link(
        &mut self,
        lgr: LgrId,
        link: llc::LinkId,
        peer: &llc::PeerQp,
    ) -> Result<(), HostError> {
        let qpn = *self
            .by_link
            .get(&(lgr, link))
            .ok_or_else(|| HostError("no such link".into()))?;
        let q = self
            .qps
            .get_mut(&qpn)
            .ok_or_else(|| HostError("no QP".into()))?;
        let p = peer.qpn.get();
        if node_of_qpn(p) == self.id {
            return Err(HostError("a QP cannot connect to its own node".into()));
        }
        q.peer = (!(self.unreachable_first_link && link == llc::LinkId::FIRST)).then_some(p);
        Ok(())
    }

    fn destroy_link(&mut self, lgr: LgrId, link: llc::LinkId) {
        if let Some(qpn) = self.by_link.remove(&(lgr, link)) {
            if let Some(q) = self.qps.get_mut(&qpn) {
                q.dead = true;
            }
        }
    }

    fn create_rmb(&mut self, lgr: LgrId, rmb: llc::RmbId, size: usize) -> Result<(), HostError> {
        self.rmbs.insert((lgr, rmb.0), vec![0; size]);
        Ok(())
    }

    fn register_rmb(
        &mut self,
        lgr: LgrId,
        rmb: llc::RmbId,
        link: llc::LinkId,
    ) -> Result<RToken, HostError> {
        if !self.by_link.contains_key(&(lgr, link)) {
            return Err(HostError("no such link".into()));
        }
        let rkey = self.next_rkey;
        self.next_rkey += 1;
        let base = u64::from(rkey) << 32;
        self.mrs.insert(
            rkey,
            SimMr {
                lgr,
                rmb: rmb.0,
                base,
            },
        );
        Ok(RToken { rkey, vaddr: base })
    }

    fn clear_rmb(&mut self, lgr: LgrId, rmb: llc::RmbId) {
        if let Some(b) = self.rmbs.get_mut(&(lgr, rmb.0)) {
            b.fill(0);
        }
    }

    fn free_rmb(&mut self, lgr: LgrId, rmb: llc::RmbId) {
        self.rmbs.remove(&(lgr, rmb.0));
        self.mrs.retain(|_, m| !(m.lgr == lgr && m.rmb == rmb.0));
    }

    fn alloc_token(&mut self, lgr: LgrId) -> Option<u32> {
        self.tokens.alloc(lgr, &mut self.rng)
    }

    fn release_token(&mut self, token: u32) {
        self.tokens.release(token);
    }

    fn route_v2(&mut self, _local: IpAddr, _peer: IpAddr, _gid: Gid) -> Option<V2Route> {
        Some(V2Route {
            uses_gateway: false,
            nexthop_mac: Mac::default(),
        })
    }

    fn conn_may_write(&mut self, token: u32) -> bool {
        self.conns
            .get(&token)
            .is_some_and(|c| matches!(c.conn.state(), State::Active | State::AppCloseWait1))
    }
}
