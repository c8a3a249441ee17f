//! A deterministic simulator: a server and a client [`LinkGroup`] over a fake RoCE fabric,
//! with a fake runtime on each side and a fake clock.
//!
//! * Every LLC message is encoded with `smc-wire` in the sender's [`super::LlcFormat`] and parsed
//!   back on the other side ([`LinkGroup::handle_llc_bytes`]), so the codec is exercised.
//! * Links behave like RC QPs: each direction delivers in order after a seeded delay; the
//!   sender's completion is positive once the message arrived (the ACK) and negative when
//!   the QP pair is broken or the destination QP does not exist (retries exhausted).
//!   [`Sim::break_link`] breaks a QP pair; traffic in flight on it is lost.
//! * The fake runtime creates and connects QPs after a delay, registers every RMB on every
//!   QP (fresh RKey and virtual address per link), and follows the machine's RMB events.
//! * [`Sim::intercept`] lets a test hold, swallow (ACKed but never processed — the peer
//!   "should-not-occur" of RFC 7609 C.7) or fail chosen messages; [`Sim::inject`] hands a
//!   crafted message to a machine.
//! * [`run_random`] drives random RMB additions and deletions, device additions, link
//!   failures, deletions, terminations and time from a seed, then lets the group settle and
//!   checks both machines agree ([`Sim::check_consistent`]) or both terminated.
//!
//! Available to this crate's tests and, with the `testing` feature, to other crates.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use smc_wire::common::{Gid, Mac, QpMtu, U24};
use smc_wire::llc::{LlcMessage, LlcType};

pub use crate::conn::sim::Rng;

use super::{
    Device, DeviceId, Event, FirstLink, LinkGroup, LinkId, LinkState, LlcConfig, LlcOut, Output,
    PeerQp, QpInfo, RToken, RmbId, Role, TerminateReason,
};

/// Index of the server in [`Sim::hosts`].
pub const SERVER: usize = 0;
/// Index of the client in [`Sim::hosts`].
pub const CLIENT: usize = 1;

/// A device of a simulated host: MAC `02:00:00:00:<host>:<n>`, GID `::ffff:10.<host>.0.<n>`.
pub fn device(host: usize, n: u32) -> Device {
    let h = host as u8 + 1;
    Device {
        id: DeviceId(n),
        mac: Mac([2, 0, 0, 0, h, n as u8]),
        gid: Gid::from_ipv4(::core::net::Ipv4Addr::new(10, h, 0, n as u8)),
    }
}

/// What [`Sim::intercept`] decides for one message.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Verdict {
    /// Carry it.
    Deliver,
    /// ACK it but never hand it to the receiver (a peer that lost it).
    Swallow,
    /// Fail it: the QP pair breaks and the sender gets an error completion.
    Fail,
}

/// One message on the wire, as seen by the trace and by interceptors.
#[derive(Clone, Debug)]
pub struct Wire {
    /// Simulated time.
    pub at: Duration,
    /// Sending host.
    pub from: usize,
    /// Sender's link.
    pub link: LinkId,
    /// Link number on the sender's side.
    pub link_num: u8,
    /// The encoded message.
    pub bytes: Vec<u8>,
    /// The message.
    pub msg: LlcOut,
}

impl Wire {
    /// Type and flags, e.g. "ADD LINK rsp".
    pub fn label(&self) -> String {
        format!(
            "{}{}",
            self.msg.msg_type().name(),
            if self.msg.is_response() { " rsp" } else { "" }
        )
    }
}

/// Interceptor: called for every message sent.
pub type Interceptor = Box<dyn FnMut(&Wire) -> Verdict>;

#[derive(Clone, Debug)]
struct Qp {
    qpn: u32,
    psn: u32,
    mtu: QpMtu,
    created: bool,
    peer: Option<u32>,
    broken: bool,
    /// Last scheduled delivery of this direction (RC order).
    last: Instant,
}

/// A simulated host: its machine and the fake runtime around it.
pub struct Host {
    /// The machine.
    pub lg: LinkGroup,
    /// Devices the runtime has.
    pub devices: Vec<Device>,
    qps: BTreeMap<LinkId, Qp>,
    /// The runtime's RMB registrations: RToken per link.
    pub rmbs: BTreeMap<RmbId, BTreeMap<LinkId, RToken>>,
    /// Events from the machine, in order.
    pub events: Vec<Event>,
    /// Set once `Terminated` came.
    pub terminated: Option<TerminateReason>,
    next_rmb: u32,
    next_qpn: u32,
    next_rkey: u32,
    idx: usize,
}

impl Host {
    fn token(&mut self, rmb: RmbId, link: LinkId) -> RToken {
        self.next_rkey += 1;
        RToken {
            rkey: self.next_rkey | ((self.idx as u32 + 1) << 24),
            vaddr: (u64::from(rmb.0) << 32) | (u64::from(link.0) << 20) | 0x1000,
        }
    }

    /// Whether an event like this came.
    pub fn saw(&self, f: impl Fn(&Event) -> bool) -> bool {
        self.events.iter().any(f)
    }

    /// RMBs the runtime holds.
    pub fn rmb_ids(&self) -> Vec<RmbId> {
        self.rmbs.keys().copied().collect()
    }
}

#[derive(Clone, Debug)]
enum Ev {
    Deliver {
        from: usize,
        from_link: LinkId,
        from_qpn: u32,
        to_qpn: u32,
        id: super::SendId,
        bytes: Vec<u8>,
        swallow: bool,
    },
    Complete {
        host: usize,
        link: LinkId,
        id: super::SendId,
        ok: bool,
    },
    Created {
        host: usize,
        link: LinkId,
    },
    Connected {
        host: usize,
        link: LinkId,
    },
}

/// Simulator parameters.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Server's machine configuration.
    pub server: LlcConfig,
    /// Client's machine configuration.
    pub client: LlcConfig,
    /// Devices of the server (≥ 1).
    pub server_devices: u32,
    /// Devices of the client (≥ 1).
    pub client_devices: u32,
    /// Smallest one-way delay.
    pub min_delay: Duration,
    /// Largest one-way delay.
    pub max_delay: Duration,
    /// Time the runtime takes to create or connect a QP.
    pub setup_delay: Duration,
    /// Time until a send to a broken QP fails (RC retries).
    pub fail_delay: Duration,
    /// MTU of every QP.
    pub mtu: QpMtu,
}

impl SimConfig {
    /// Both sides with this configuration (roles set accordingly), one device each.
    pub fn pair(mut server: LlcConfig) -> SimConfig {
        server.role = Role::Server;
        let mut client = server.clone();
        client.role = Role::Client;
        client.timers = super::LlcTimers {
            linger: server.timers.linger.map(|d| d + Duration::from_secs(10)),
            ..server.timers.clone()
        };
        SimConfig {
            server,
            client,
            server_devices: 1,
            client_devices: 1,
            min_delay: Duration::from_micros(1),
            max_delay: Duration::from_millis(2),
            setup_delay: Duration::from_millis(1),
            fail_delay: Duration::from_millis(150),
            mtu: QpMtu::Mtu1024,
        }
    }
}

/// Two machines over a fake fabric. See the [module documentation](self).
pub struct Sim {
    /// Current simulated time.
    pub now: Instant,
    start: Instant,
    /// Server and client.
    pub hosts: [Host; 2],
    queue: BTreeMap<(Instant, u64), Ev>,
    seq: u64,
    /// Seeded randomness (delays).
    pub rng: Rng,
    /// Every message sent, in order.
    pub trace: Vec<Wire>,
    /// Decides per message (default: deliver everything).
    pub intercept: Option<Interceptor>,
    cfg: SimConfig,
}

impl Sim {
    /// First contact: both link 1 QPs exist and are connected (CLC is done); the server's
    /// machine has just sent CONFIRM LINK.
    pub fn new(cfg: SimConfig, seed: u64) -> Sim {
        Sim::with_intercept(cfg, seed, None)
    }

    /// Like [`Sim::new`], with an interceptor in place before the first message.
    pub fn with_intercept(cfg: SimConfig, seed: u64, intercept: Option<Interceptor>) -> Sim {
        let start = Instant::now();
        let mut rng = Rng::new(seed);
        let mk = |idx: usize, n: u32| (1..=n.max(1)).map(|i| device(idx, i)).collect::<Vec<_>>();
        let sdev = mk(SERVER, cfg.server_devices);
        let cdev = mk(CLIENT, cfg.client_devices);
        let sq = 0x11u32;
        let cq = 0x11u32;
        let spsn = (rng.next_u64() & 0xFF_FFFF) as u32;
        let cpsn = (rng.next_u64() & 0xFF_FFFF) as u32;
        let srmb = RmbId(1);
        let crmb = RmbId(1);
        let stok = RToken {
            rkey: 0x0100_0362,
            vaddr: 0xff22_f8b0_837a_0000,
        };
        let ctok = RToken {
            rkey: 0x0200_03ae,
            vaddr: 0xff27_713b_82b6_0000,
        };
        let peer_of = |d: &Device, qpn: u32, psn: u32| PeerQp {
            mac: d.mac,
            gid: d.gid,
            qpn: U24::new(qpn).unwrap_or_default(),
            psn: U24::new(psn).unwrap_or_default(),
            mtu: cfg.mtu,
        };
        let sfirst = FirstLink {
            device: sdev[0].id,
            local: QpInfo {
                qpn: U24::new(sq).unwrap_or_default(),
                psn: U24::new(spsn).unwrap_or_default(),
                mtu: cfg.mtu,
            },
            peer: peer_of(&cdev[0], cq, cpsn),
            local_rmb: srmb,
            local_token: stok,
            peer_token: ctok,
        };
        let cfirst = FirstLink {
            device: cdev[0].id,
            local: QpInfo {
                qpn: U24::new(cq).unwrap_or_default(),
                psn: U24::new(cpsn).unwrap_or_default(),
                mtu: cfg.mtu,
            },
            peer: peer_of(&sdev[0], sq, spsn),
            local_rmb: crmb,
            local_token: ctok,
            peer_token: stok,
        };
        let mk_host = |idx: usize, lg: LinkGroup, devices: Vec<Device>, qpn, psn, rmb, tok| {
            let mut qps = BTreeMap::new();
            qps.insert(
                LinkId::FIRST,
                Qp {
                    qpn,
                    psn,
                    mtu: cfg.mtu,
                    created: true,
                    peer: Some(0x11),
                    broken: false,
                    last: start,
                },
            );
            let mut rmbs = BTreeMap::new();
            let mut t = BTreeMap::new();
            t.insert(LinkId::FIRST, tok);
            rmbs.insert(rmb, t);
            Host {
                lg,
                devices,
                qps,
                rmbs,
                events: Vec::new(),
                terminated: None,
                next_rmb: 1,
                next_qpn: qpn,
                next_rkey: 0x400,
                idx,
            }
        };
        let slg = LinkGroup::new(cfg.server.clone(), sdev.clone(), sfirst, start)
            .expect("server configuration");
        let clg = LinkGroup::new(cfg.client.clone(), cdev.clone(), cfirst, start)
            .expect("client configuration");
        let mut sim = Sim {
            now: start,
            start,
            hosts: [
                mk_host(SERVER, slg, sdev, sq, spsn, srmb, stok),
                mk_host(CLIENT, clg, cdev, cq, cpsn, crmb, ctok),
            ],
            queue: BTreeMap::new(),
            seq: 0,
            rng,
            trace: Vec::new(),
            intercept,
            cfg,
        };
        sim.drain(SERVER);
        sim.drain(CLIENT);
        sim
    }

    /// Simulated time since the start.
    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    fn schedule(&mut self, at: Instant, ev: Ev) {
        self.seq += 1;
        self.queue.insert((at, self.seq), ev);
    }

    fn delay(&mut self) -> Duration {
        let min = self.cfg.min_delay.as_micros().max(1) as u64;
        let max = (self.cfg.max_delay.as_micros() as u64).max(min);
        Duration::from_micros(min + self.rng.below(max - min + 1))
    }

    /// Executes the machine's outputs like a runtime.
    fn drain(&mut self, h: usize) {
        while let Some(o) = self.hosts[h].lg.poll_output() {
            match o {
                Output::Send(t) => self.post(h, t),
                Output::CreateLink { link, device: _ } => {
                    let host = &mut self.hosts[h];
                    host.next_qpn += 1;
                    let qpn = host.next_qpn;
                    let psn = (self.rng.next_u64() & 0xFF_FFFF) as u32;
                    host.qps.insert(
                        link,
                        Qp {
                            qpn,
                            psn,
                            mtu: self.cfg.mtu,
                            created: false,
                            peer: None,
                            broken: false,
                            last: self.now,
                        },
                    );
                    let at = self.now + self.cfg.setup_delay;
                    self.schedule(at, Ev::Created { host: h, link });
                }
                Output::ConnectLink { link, peer } => {
                    if let Some(q) = self.hosts[h].qps.get_mut(&link) {
                        q.peer = Some(peer.qpn.get());
                    }
                    let at = self.now + self.cfg.setup_delay;
                    self.schedule(at, Ev::Connected { host: h, link });
                }
                Output::DestroyLink { link } => {
                    let host = &mut self.hosts[h];
                    host.qps.remove(&link);
                    for r in host.rmbs.values_mut() {
                        r.remove(&link);
                    }
                }
                Output::Event(e) => {
                    let host = &mut self.hosts[h];
                    match &e {
                        Event::RmbDeleted(r) | Event::RmbConfirmFailed { rmb: r, .. } => {
                            host.rmbs.remove(r);
                        }
                        Event::Terminated(why) => {
                            host.terminated = Some(*why);
                            host.qps.clear();
                        }
                        _ => {}
                    }
                    host.events.push(e);
                }
            }
        }
    }

    fn post(&mut self, h: usize, t: super::Transmit) {
        let fmt = self.hosts[h].lg.config().format;
        let bytes = t
            .msg
            .encode(fmt)
            .expect("the machine emits encodable messages");
        let num = self.hosts[h].lg.link(t.link).map_or(0, |l| l.num);
        let w = Wire {
            at: self.elapsed(),
            from: h,
            link: t.link,
            link_num: num,
            bytes: bytes.clone(),
            msg: t.msg,
        };
        let verdict = match self.intercept.as_mut() {
            Some(f) => f(&w),
            None => Verdict::Deliver,
        };
        self.trace.push(w);
        let fail_at = self.now + self.cfg.fail_delay;
        let Some(q) = self.hosts[h].qps.get(&t.link).cloned() else {
            self.schedule(
                fail_at,
                Ev::Complete {
                    host: h,
                    link: t.link,
                    id: t.id,
                    ok: false,
                },
            );
            return;
        };
        if verdict == Verdict::Fail {
            self.break_qp(h, t.link);
        }
        let q = self.hosts[h].qps.get(&t.link).cloned().unwrap_or(q);
        let (Some(peer), false) = (q.peer, q.broken) else {
            self.schedule(
                fail_at,
                Ev::Complete {
                    host: h,
                    link: t.link,
                    id: t.id,
                    ok: false,
                },
            );
            return;
        };
        let at = (self.now + self.delay()).max(q.last + Duration::from_nanos(1));
        if let Some(q) = self.hosts[h].qps.get_mut(&t.link) {
            q.last = at;
        }
        self.schedule(
            at,
            Ev::Deliver {
                from: h,
                from_link: t.link,
                from_qpn: q.qpn,
                to_qpn: peer,
                id: t.id,
                bytes,
                swallow: verdict == Verdict::Swallow,
            },
        );
    }

    fn break_qp(&mut self, h: usize, link: LinkId) {
        let Some(q) = self.hosts[h].qps.get_mut(&link) else {
            return;
        };
        q.broken = true;
        let (qpn, peer) = (q.qpn, q.peer);
        let other = 1 - h;
        for q in self.hosts[other].qps.values_mut() {
            if Some(q.qpn) == peer && q.peer == Some(qpn) {
                q.broken = true;
            }
        }
    }

    /// Breaks the QP pair of a link (cable pulled): traffic in flight is lost, later sends
    /// fail on both sides.
    pub fn break_link(&mut self, host: usize, link: LinkId) {
        self.break_qp(host, link);
    }

    /// Hands a crafted message to a host as if received on `link`.
    pub fn inject(&mut self, host: usize, link: LinkId, msg: &LlcMessage<'_>) {
        let fmt = self.hosts[host].lg.config().format;
        let bytes = LlcOut::new(msg).encode(fmt).expect("encodable message");
        self.inject_bytes(host, link, &bytes);
    }

    /// Hands raw bytes to a host as if received on `link`.
    pub fn inject_bytes(&mut self, host: usize, link: LinkId, bytes: &[u8]) {
        let now = self.now;
        self.hosts[host].lg.handle_llc_bytes(now, link, bytes);
        self.drain(host);
    }

    /// Lets the runtime call into a host's machine, then executes its outputs.
    pub fn with<R>(&mut self, host: usize, f: impl FnOnce(&mut Host, Instant) -> R) -> R {
        let now = self.now;
        let r = f(&mut self.hosts[host], now);
        self.drain(host);
        r
    }

    /// The runtime allocates and registers a new RMB on every QP and announces it.
    pub fn add_rmb(&mut self, host: usize) -> RmbId {
        let now = self.now;
        let h = &mut self.hosts[host];
        h.next_rmb += 1;
        let rmb = RmbId(h.next_rmb);
        let links: Vec<LinkId> = h
            .qps
            .iter()
            .filter(|(_, q)| q.created)
            .map(|(l, _)| *l)
            .collect();
        let mut toks = BTreeMap::new();
        for l in links {
            let t = h.token(rmb, l);
            toks.insert(l, t);
        }
        let list: Vec<(LinkId, RToken)> = toks.iter().map(|(l, t)| (*l, *t)).collect();
        h.rmbs.insert(rmb, toks);
        if h.lg.is_terminated() {
            return rmb;
        }
        h.lg.add_rmb(now, rmb, &list)
            .expect("tokens for every link with a QP");
        self.drain(host);
        rmb
    }

    /// The runtime deletes an RMB.
    pub fn delete_rmb(&mut self, host: usize, rmb: RmbId) {
        let now = self.now;
        let _ = self.hosts[host].lg.delete_rmb(now, rmb);
        self.drain(host);
    }

    /// Processes everything due up to `until` (messages, runtime replies, timers).
    pub fn run_until(&mut self, until: Instant) {
        for _ in 0..1_000_000 {
            let next_ev = self.queue.keys().next().map(|k| k.0);
            let next_t = [SERVER, CLIENT]
                .iter()
                .filter_map(|h| self.hosts[*h].lg.poll_timeout())
                .min();
            let next = match (next_ev, next_t) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) => a,
                (None, Some(b)) => b,
                (None, None) => break,
            };
            if next > until {
                break;
            }
            if next > self.now {
                self.now = next;
            }
            if next_ev == Some(next) {
                let Some((_, ev)) = self.queue.pop_first() else {
                    break;
                };
                self.process(ev);
            } else {
                for h in [SERVER, CLIENT] {
                    if self.hosts[h]
                        .lg
                        .poll_timeout()
                        .is_some_and(|t| t <= self.now)
                    {
                        let now = self.now;
                        self.hosts[h].lg.on_timeout(now);
                        self.drain(h);
                        // A timer that stays due after on_timeout would spin the runtime.
                        if let Some(t) = self.hosts[h].lg.poll_timeout() {
                            assert!(
                                t > now,
                                "host {h}: timer still due after on_timeout: {:#?}",
                                self.hosts[h].lg
                            );
                        }
                    }
                }
            }
        }
        if until > self.now {
            self.now = until;
        }
    }

    /// Runs for `d` of simulated time.
    pub fn run_for(&mut self, d: Duration) {
        let until = self.now + d;
        self.run_until(until);
    }

    /// Runs in small steps until a message matching `pick` has been sent (`true`), or
    /// `limit` passed.
    pub fn run_until_sent(&mut self, pick: impl Fn(&Wire) -> bool, limit: Duration) -> bool {
        let end = self.now + limit;
        let mut seen = self.trace.len();
        while self.now < end {
            self.run_for(Duration::from_micros(5));
            if self.trace[seen..].iter().any(&pick) {
                return true;
            }
            seen = self.trace.len();
        }
        false
    }

    /// Whether messages or runtime replies are still in flight.
    pub fn in_flight(&self) -> bool {
        !self.queue.is_empty()
    }

    fn process(&mut self, ev: Ev) {
        let now = self.now;
        match ev {
            Ev::Deliver {
                from,
                from_link,
                from_qpn,
                to_qpn,
                id,
                bytes,
                swallow,
            } => {
                let to = 1 - from;
                let dest = self.hosts[to]
                    .qps
                    .iter()
                    .find(|(_, q)| q.qpn == to_qpn && q.peer == Some(from_qpn) && !q.broken)
                    .map(|(l, _)| *l);
                let sender_ok = self.hosts[from]
                    .qps
                    .get(&from_link)
                    .is_some_and(|q| !q.broken);
                match dest {
                    Some(link) if sender_ok => {
                        if !swallow {
                            self.hosts[to].lg.handle_llc_bytes(now, link, &bytes);
                            self.drain(to);
                        }
                        let at = now + self.delay();
                        self.schedule(
                            at,
                            Ev::Complete {
                                host: from,
                                link: from_link,
                                id,
                                ok: true,
                            },
                        );
                    }
                    _ => {
                        let at = now + self.cfg.fail_delay;
                        self.schedule(
                            at,
                            Ev::Complete {
                                host: from,
                                link: from_link,
                                id,
                                ok: false,
                            },
                        );
                    }
                }
            }
            Ev::Complete { host, link, id, ok } => {
                self.hosts[host].lg.on_send_complete(now, link, id, ok);
                self.drain(host);
            }
            Ev::Created { host, link } => {
                let h = &mut self.hosts[host];
                let Some(q) = h.qps.get(&link).cloned() else {
                    return;
                };
                let rmbs: Vec<RmbId> = h.rmbs.keys().copied().collect();
                let mut list = Vec::new();
                for r in rmbs {
                    let t = h.token(r, link);
                    if let Some(m) = h.rmbs.get_mut(&r) {
                        m.insert(link, t);
                    }
                    list.push((r, t));
                }
                if let Some(q) = h.qps.get_mut(&link) {
                    q.created = true;
                }
                let info = QpInfo {
                    qpn: U24::new(q.qpn).unwrap_or_default(),
                    psn: U24::new(q.psn).unwrap_or_default(),
                    mtu: q.mtu,
                };
                if let Err(e) = h.lg.on_link_created(now, link, info, &list) {
                    assert!(
                        h.lg.is_terminated() || h.lg.link(link).is_none(),
                        "on_link_created: {e}"
                    );
                }
                self.drain(host);
            }
            Ev::Connected { host, link } => {
                let h = &mut self.hosts[host];
                if h.qps.contains_key(&link) {
                    if let Err(e) = h.lg.on_link_connected(now, link) {
                        assert!(
                            h.lg.is_terminated() || h.lg.link(link).is_none(),
                            "on_link_connected: {e}"
                        );
                    }
                }
                self.drain(host);
            }
        }
    }

    /// Runs until nothing is in flight and neither machine has an exchange in progress
    /// (keepalive and retry timers may still be armed), or `limit` passed.
    pub fn settle(&mut self, limit: Duration) -> bool {
        let end = self.now + limit;
        while self.now < end {
            let step = self.now + Duration::from_millis(50);
            self.run_until(step.min(end));
            if !self.in_flight() && self.hosts.iter().all(|h| h.lg.is_quiet()) {
                return true;
            }
        }
        false
    }

    /// The message labels of the trace, `"S: CONFIRM LINK"` / `"C: CONFIRM LINK rsp"`.
    pub fn labels(&self) -> Vec<String> {
        self.trace
            .iter()
            .map(|w| {
                format!(
                    "{}: {}",
                    if w.from == SERVER { "S" } else { "C" },
                    w.label()
                )
            })
            .collect()
    }

    /// Messages of a type sent by a host.
    pub fn sent(&self, host: usize, ty: LlcType) -> Vec<&Wire> {
        self.trace
            .iter()
            .filter(|w| w.from == host && w.msg.msg_type() == ty)
            .collect()
    }

    /// Checks that both machines agree: the same active links with matching QPs, and every
    /// confirmed RMB of one side known to the other with the same RToken on every link; or
    /// both terminated.
    pub fn check_consistent(&self) -> Result<(), String> {
        let (s, c) = (&self.hosts[SERVER], &self.hosts[CLIENT]);
        match (s.lg.is_terminated(), c.lg.is_terminated()) {
            (true, true) => return Ok(()),
            (false, false) => {}
            (st, ct) => {
                return Err(format!(
                    "asymmetric termination: server {st} ({:?}), client {ct} ({:?})",
                    s.terminated, c.terminated
                ))
            }
        }
        let links = |h: &Host| -> BTreeMap<u8, super::LinkInfo> {
            h.lg.links()
                .filter(|l| l.state == LinkState::Active)
                .map(|l| (l.num, l))
                .collect()
        };
        let (sl, cl) = (links(s), links(c));
        if sl.keys().collect::<Vec<_>>() != cl.keys().collect::<Vec<_>>() {
            return Err(format!(
                "active links differ: server {:?}, client {:?}",
                sl.keys().collect::<Vec<_>>(),
                cl.keys().collect::<Vec<_>>()
            ));
        }
        for h in [s, c] {
            if let Some(l) = h.lg.links().find(|l| l.state != LinkState::Active) {
                return Err(format!("host {} has a link in state {:?}", h.idx, l.state));
            }
        }
        for (num, a) in &sl {
            let b = &cl[num];
            let (Some(al), Some(ap), Some(bl), Some(bp)) = (a.local, a.peer, b.local, b.peer)
            else {
                return Err(format!("link {num} without QP values"));
            };
            if al.qpn != bp.qpn || bl.qpn != ap.qpn || al.psn != bp.psn || bl.psn != ap.psn {
                return Err(format!("link {num}: QP numbers or PSNs differ"));
            }
        }
        for (x, y, xl, yl) in [(s, c, &sl, &cl), (c, s, &cl, &sl)] {
            let mut seen = BTreeSet::new();
            for rmb in x.lg.local_rmbs() {
                if !x.lg.rmb_confirmed(rmb) {
                    return Err(format!("host {} RMB {rmb:?} not confirmed", x.idx));
                }
                let mut peer = None;
                for (num, l) in xl {
                    let Some(t) = x.lg.local_token(rmb, l.id) else {
                        return Err(format!("host {} RMB {rmb:?} no token on link {num}", x.idx));
                    };
                    let ylink = yl[num].id;
                    let Some(p) = y.lg.peer_rmb_by_rkey(ylink, t.rkey) else {
                        return Err(format!(
                            "host {} does not know RMB {rmb:?} of host {} on link {num}",
                            y.idx, x.idx
                        ));
                    };
                    if *peer.get_or_insert(p) != p || y.lg.peer_token(p, ylink) != Some(t) {
                        return Err(format!(
                            "RToken of host {} RMB {rmb:?} on link {num} differs",
                            x.idx
                        ));
                    }
                }
                if let Some(p) = peer {
                    seen.insert(p);
                }
            }
            let extra = y.lg.peer_rmbs().filter(|p| !seen.contains(p)).count();
            if extra > 0 {
                return Err(format!(
                    "host {} knows {extra} RMBs host {} does not have",
                    y.idx, x.idx
                ));
            }
        }
        Ok(())
    }

    /// The trace as text (for failure messages).
    pub fn dump(&self) -> String {
        let mut s = String::new();
        let start = self.trace.len().saturating_sub(60);
        for w in &self.trace[start..] {
            let _ = writeln!(
                s,
                "{:>10.3?} {} L{}#{} {:?}",
                w.at,
                if w.from == SERVER { "S→" } else { "C→" },
                w.link.0,
                w.link_num,
                w.msg.as_wire()
            );
        }
        for h in &self.hosts {
            let _ = writeln!(s, "host {} events: {:?}", h.idx, h.events);
            let _ = writeln!(
                s,
                "host {} links: {:?}",
                h.idx,
                h.lg.links().collect::<Vec<_>>()
            );
        }
        s
    }
}

/// What [`run_random`] exercises.
#[derive(Clone, Debug)]
pub struct RandomOpts {
    /// Random actions before the settle phase.
    pub steps: usize,
    /// Break links now and then.
    pub failures: bool,
    /// Terminate now and then.
    pub terminate: bool,
    /// Swallow (lose) an LLC message now and then (per-mille).
    pub swallow_permille: u64,
    /// Put the trace tail into the report.
    pub keep_trace: bool,
}

impl Default for RandomOpts {
    fn default() -> Self {
        RandomOpts {
            steps: 150,
            failures: true,
            terminate: true,
            swallow_permille: 0,
            keep_trace: false,
        }
    }
}

/// What a random run did.
#[derive(Clone, Debug, Default)]
pub struct RandomReport {
    /// Both ended terminated.
    pub terminated: bool,
    /// Links added (LinkUp events on the server).
    pub links_up: usize,
    /// RMBs confirmed on either side.
    pub rmbs_confirmed: usize,
    /// LLC messages sent.
    pub messages: usize,
    /// The trace tail ([`RandomOpts::keep_trace`]).
    pub trace: String,
    /// Messages sent per label ([`Wire::label`]).
    pub counts: BTreeMap<String, usize>,
}

/// One seeded random run; `Err` carries the seed, the configuration and the trace tail.
pub fn run_random(seed: u64, cfg: SimConfig, opts: &RandomOpts) -> Result<RandomReport, String> {
    let mut sim = Sim::new(cfg.clone(), seed);
    let mut rng = Rng::new(seed ^ 0x5EED_11C0);
    if opts.swallow_permille > 0 {
        let mut r = Rng::new(seed ^ 0xDEAD);
        let p = opts.swallow_permille;
        sim.intercept = Some(Box::new(move |_w: &Wire| {
            if r.below(1000) < p {
                Verdict::Swallow
            } else {
                Verdict::Deliver
            }
        }));
    }
    sim.run_for(Duration::from_millis(50));
    let mut next_dev = [cfg.server_devices + 1, cfg.client_devices + 1];
    for _ in 0..opts.steps {
        let h = rng.below(2) as usize;
        match rng.below(100) {
            0..=29 => {
                if sim.hosts[h].rmbs.len() < 12 && !sim.hosts[h].lg.is_terminated() {
                    sim.add_rmb(h);
                }
            }
            30..=49 => {
                let ids = sim.hosts[h].rmb_ids();
                if !ids.is_empty() {
                    let r = ids[rng.below(ids.len() as u64) as usize];
                    sim.delete_rmb(h, r);
                }
            }
            50..=55 => {
                if next_dev[h] < 5 {
                    let d = device(h, next_dev[h]);
                    next_dev[h] += 1;
                    sim.hosts[h].devices.push(d);
                    sim.with(h, |x, now| x.lg.add_device(now, d));
                }
            }
            56..=58 if opts.failures => {
                let links: Vec<LinkId> = sim.hosts[h].lg.links().map(|l| l.id).collect();
                // Mostly break a link of a group that has another one to fail over to.
                if links.len() > 1 || (!links.is_empty() && rng.chance(15)) {
                    let l = links[rng.below(links.len() as u64) as usize];
                    sim.break_link(h, l);
                    if rng.chance(50) {
                        sim.with(h, |x, now| x.lg.on_link_error(now, l));
                    }
                }
            }
            62..=65 => {
                let links: Vec<LinkId> = sim.hosts[h]
                    .lg
                    .links()
                    .filter(|l| l.state == LinkState::Active)
                    .map(|l| l.id)
                    .collect();
                // Two crossing deletions of the last two links legitimately end the group;
                // without failures keep one link out of reach.
                let min = if opts.failures { 2 } else { 3 };
                if links.len() >= min {
                    let l = links[rng.below(links.len() as u64) as usize];
                    let orderly = rng.chance(50);
                    sim.with(h, |x, now| {
                        let _ = x.lg.delete_link(now, l, orderly);
                    });
                }
            }
            66 if opts.terminate && seed.is_multiple_of(3) => {
                sim.with(h, |x, now| x.lg.terminate(now))
            }
            _ => {
                let ms = rng.below(3000);
                sim.run_for(Duration::from_millis(ms));
            }
        }
        let ms = rng.below(20);
        sim.run_for(Duration::from_millis(ms));
    }
    // Settle: long enough for keepalive to find broken links, deletions to run and the
    // C.8 retry to add links again.
    sim.intercept = None;
    let settled = sim.settle(Duration::from_secs(600));
    let mut report = RandomReport {
        terminated: sim.hosts.iter().all(|h| h.lg.is_terminated()),
        links_up: sim.hosts[SERVER]
            .events
            .iter()
            .filter(|e| matches!(e, Event::LinkUp(_)))
            .count(),
        rmbs_confirmed: sim
            .hosts
            .iter()
            .flat_map(|h| h.events.iter())
            .filter(|e| matches!(e, Event::RmbConfirmed(_)))
            .count(),
        messages: sim.trace.len(),
        trace: String::new(),
        counts: BTreeMap::new(),
    };
    for w in &sim.trace {
        *report.counts.entry(w.label()).or_default() += 1;
    }
    // Give keepalive a full round after the last exchange, then check.
    let iv = cfg
        .server
        .timers
        .test_link_interval
        .unwrap_or(Duration::from_secs(30));
    sim.run_for(iv * 3);
    let settled = settled && sim.settle(Duration::from_secs(120));
    report.terminated = sim.hosts.iter().all(|h| h.lg.is_terminated());
    if opts.keep_trace {
        report.trace = sim.dump();
    }
    let res = if settled {
        sim.check_consistent()
    } else {
        Err("did not settle".into())
    };
    res.map(|_| report)
        .map_err(|e| format!("seed {seed}: {e}\nconfig: {cfg:?}\n{}", sim.dump()))
}
