//! Deterministic tests of the link-group machine. Test functions carry the CHECKLIST
//! conformance IDs (§E.3 FC, §E.4 SL, §E.6 LGM, §E.7 RK, §E.8 LLC, §E.12 KA) or the B.14,
//! B.15, B.16 rows they cover.
//!
//! Two harnesses: [`Sim`] (two machines over the simulated fabric) for end-to-end flows,
//! and [`Solo`] (one machine, the test plays the peer with crafted messages — the
//! CHECKLIST's conformance "Peer") for protocol errors and exact timings.

mod collisions;
mod first;
mod lgm;
mod random;
mod rkeys;
mod timers;

use std::time::{Duration, Instant};

use smc_wire::common::{QpMtu, U24};
use smc_wire::llc::*;

use super::sim::{device, Sim, SimConfig, Verdict, Wire, CLIENT, SERVER};
use super::*;

/// A Linux-style SMC-Rv2 pair.
pub(super) fn v2_pair() -> SimConfig {
    SimConfig::pair(LlcConfig::linux(Role::Server, Version::V2))
}

/// An RFC 7609 v1 pair.
pub(super) fn rfc_pair() -> SimConfig {
    SimConfig::pair(LlcConfig::rfc(Role::Server))
}

/// Every flavour the machine speaks: RFC v1, Linux v1, Linux v2.
pub(super) fn all_pairs() -> Vec<(&'static str, SimConfig)> {
    vec![
        ("rfc", rfc_pair()),
        (
            "linux-v1",
            SimConfig::pair(LlcConfig::linux(Role::Server, Version::V1)),
        ),
        ("linux-v2", v2_pair()),
    ]
}

pub(super) fn settle(sim: &mut Sim) {
    assert!(
        sim.settle(Duration::from_secs(30)),
        "did not settle:\n{}",
        sim.dump()
    );
}

/// Swallows (ACKs, never processes) the messages `pick` selects.
pub(super) fn swallow(sim: &mut Sim, pick: impl Fn(&Wire) -> bool + 'static) {
    sim.intercept = Some(Box::new(move |w| {
        if pick(w) {
            Verdict::Swallow
        } else {
            Verdict::Deliver
        }
    }));
}

/// Applies `verdict` to the first message `pick` selects, delivers the rest.
pub(super) fn once(sim: &mut Sim, verdict: Verdict, pick: impl Fn(&Wire) -> bool + 'static) {
    let mut done = false;
    sim.intercept = Some(Box::new(move |w| {
        if !done && pick(w) {
            done = true;
            verdict
        } else {
            Verdict::Deliver
        }
    }));
}

/// Fails (breaks the QP pair of) the messages `pick` selects.
pub(super) fn fail(sim: &mut Sim, pick: impl Fn(&Wire) -> bool + 'static) {
    sim.intercept = Some(Box::new(move |w| {
        if pick(w) {
            Verdict::Fail
        } else {
            Verdict::Deliver
        }
    }));
}

pub(super) fn is(w: &Wire, from: usize, ty: LlcType, response: bool) -> bool {
    w.from == from && w.msg.msg_type() == ty && w.msg.is_response() == response
}

/// The events of a host, without the RToken bookkeeping ones.
pub(super) fn main_events(sim: &Sim, h: usize) -> Vec<Event> {
    sim.hosts[h]
        .events
        .iter()
        .filter(|e| {
            !matches!(
                e,
                Event::PeerRmbAdded { .. } | Event::PeerRmbToken { .. } | Event::PeerRmbDeleted(_)
            )
        })
        .cloned()
        .collect()
}

/// One machine; the test is the peer. The runtime part answers QP creation and connection
/// at once (unless `manual`), the way [`Sim`]'s does.
pub(super) struct Solo {
    pub lg: LinkGroup,
    pub now: Instant,
    pub manual: bool,
    /// Everything the machine sent, with its link.
    pub sent: Vec<(LinkId, LlcOut)>,
    pub events: Vec<Event>,
    pub created: Vec<LinkId>,
    pub destroyed: Vec<LinkId>,
    /// Completions to report: every send succeeds unless listed here.
    pub fail_sends: bool,
    /// Keep send completions back (in `held`) instead of reporting them at once.
    pub hold_sends: bool,
    pub held: Vec<(LinkId, SendId)>,
    next_qpn: u32,
}

/// The peer's (test's) view of the first link in [`Solo`]: its device 1 of host 1 − role.
pub(super) fn solo_first(role: Role) -> (FirstLink, Device, Device) {
    let (me, peer) = match role {
        Role::Server => (device(SERVER, 1), device(CLIENT, 1)),
        Role::Client => (device(CLIENT, 1), device(SERVER, 1)),
    };
    let first = FirstLink {
        device: me.id,
        local: QpInfo {
            qpn: U24::new(0x11).unwrap(),
            psn: U24::new(0x1234).unwrap(),
            mtu: QpMtu::Mtu1024,
        },
        peer: PeerQp {
            mac: peer.mac,
            gid: peer.gid,
            qpn: U24::new(0x11).unwrap(),
            psn: U24::new(0x5678).unwrap(),
            mtu: QpMtu::Mtu1024,
        },
        local_rmb: RmbId(1),
        local_token: RToken {
            rkey: 0x100,
            vaddr: 0x1000_0000,
        },
        peer_token: RToken {
            rkey: 0x200,
            vaddr: 0x2000_0000,
        },
    };
    (first, me, peer)
}

impl Solo {
    pub fn new(cfg: LlcConfig, devices: u32) -> Solo {
        let role = cfg.role;
        let (first, _, _) = solo_first(role);
        let host = if role == Role::Server { SERVER } else { CLIENT };
        let devs = (1..=devices).map(|i| device(host, i)).collect();
        let start = Instant::now();
        let lg = LinkGroup::new(cfg, devs, first, start).unwrap();
        let mut s = Solo {
            lg,
            now: start,
            manual: false,
            sent: Vec::new(),
            events: Vec::new(),
            created: Vec::new(),
            destroyed: Vec::new(),
            fail_sends: false,
            hold_sends: false,
            held: Vec::new(),
            next_qpn: 0x20,
        };
        s.drain();
        s
    }

    /// A client whose first link is confirmed (the test answered nothing yet after the
    /// CONFIRM LINK response).
    pub fn client_up(cfg: LlcConfig) -> Solo {
        let mut s = Solo::new(cfg, 1);
        let m = s.peer_confirm_link(false, 1);
        s.rx(LinkId::FIRST, &LlcMessage::ConfirmLink(m));
        s
    }

    /// A server whose first link is confirmed.
    pub fn server_up(cfg: LlcConfig, devices: u32) -> Solo {
        let mut s = Solo::new(cfg, devices);
        let m = s.peer_confirm_link(true, 1);
        s.rx(LinkId::FIRST, &LlcMessage::ConfirmLink(m));
        s
    }

    /// The CONFIRM LINK the peer would send on link 1.
    pub fn peer_confirm_link(&self, response: bool, link_num: u8) -> ConfirmLink {
        let (first, _, _) = solo_first(self.lg.role());
        let cfg = self.lg.config();
        let linux = cfg.version == Version::V2 || cfg.format.dialect == Dialect::Linux;
        ConfirmLink {
            v2: cfg.version == Version::V2,
            response,
            no_rmbe_eyecatcher: linux && !cfg.rmbe_eyecatcher,
            mac: first.peer.mac,
            gid: first.peer.gid,
            qpn: first.peer.qpn,
            link_num,
            link_uid: 0xABCD,
            max_links: self.lg.config().max_links,
            max_conns: if linux { cfg.max_conns } else { 0 },
        }
    }

    pub fn drain(&mut self) {
        while let Some(o) = self.lg.poll_output() {
            match o {
                Output::Send(t) => {
                    // Every message must encode.
                    t.msg.encode(self.lg.config().format).unwrap();
                    let (link, id) = (t.link, t.id);
                    self.sent.push((t.link, t.msg));
                    if self.hold_sends {
                        self.held.push((link, id));
                    } else if !self.lg.is_terminated() {
                        let ok = !self.fail_sends;
                        self.lg.on_send_complete(self.now, link, id, ok);
                    }
                }
                Output::CreateLink { link, .. } => {
                    self.created.push(link);
                    if !self.manual {
                        self.next_qpn += 1;
                        let qp = QpInfo {
                            qpn: U24::new(self.next_qpn).unwrap(),
                            psn: U24::new(0x1000 + self.next_qpn).unwrap(),
                            mtu: QpMtu::Mtu1024,
                        };
                        let toks: Vec<(RmbId, RToken)> = self
                            .lg
                            .local_rmbs()
                            .map(|r| {
                                (
                                    r,
                                    RToken {
                                        rkey: (link.0 << 16) | r.0,
                                        vaddr: (u64::from(link.0) << 32) | u64::from(r.0),
                                    },
                                )
                            })
                            .collect();
                        self.lg.on_link_created(self.now, link, qp, &toks).unwrap();
                    }
                }
                Output::ConnectLink { link, .. } => {
                    if !self.manual {
                        self.lg.on_link_connected(self.now, link).unwrap();
                    }
                }
                Output::DestroyLink { link } => self.destroyed.push(link),
                Output::Event(e) => self.events.push(e),
            }
        }
    }

    pub fn rx(&mut self, link: LinkId, m: &LlcMessage<'_>) {
        let bytes = LlcOut::new(m).encode(self.lg.config().format).unwrap();
        self.rx_bytes(link, &bytes);
    }

    pub fn rx_bytes(&mut self, link: LinkId, bytes: &[u8]) {
        self.lg.handle_llc_bytes(self.now, link, bytes);
        self.drain();
    }

    pub fn advance(&mut self, d: Duration) {
        let end = self.now + d;
        while let Some(t) = self.lg.poll_timeout() {
            if t > end {
                break;
            }
            self.now = self.now.max(t);
            self.lg.on_timeout(self.now);
            self.drain();
            if let Some(t) = self.lg.poll_timeout() {
                assert!(t > self.now, "timer still due after on_timeout");
            }
        }
        self.now = end;
    }

    /// Messages sent so far (and forgets them).
    /// Reports the held send completions (successful).
    pub fn complete_held(&mut self) {
        for (link, id) in std::mem::take(&mut self.held) {
            self.lg.on_send_complete(self.now, link, id, true);
        }
        self.drain();
    }

    pub fn take(&mut self) -> Vec<(LinkId, LlcOut)> {
        std::mem::take(&mut self.sent)
    }

    /// The last message sent.
    pub fn last(&self) -> LlcOut {
        self.sent.last().expect("a message").1.clone()
    }

    pub fn saw(&self, f: impl Fn(&Event) -> bool) -> bool {
        self.events.iter().any(f)
    }

    pub fn link_by_num(&self, num: u8) -> Option<LinkId> {
        self.lg.links().find(|l| l.num == num).map(|l| l.id)
    }
}

/// The ADD LINK request a server would send for link `num` over its device `dev`.
pub(super) fn server_add_link(v2: bool, dev: &Device, num: u8, qpn: u32) -> AddLink<'static> {
    AddLink {
        v2,
        response: false,
        reject: false,
        reject_reason: 0,
        mac: dev.mac,
        gid: dev.gid,
        qpn: U24::new(qpn).unwrap(),
        link_num: num,
        qp_mtu: QpMtu::Mtu1024.code(),
        psn: U24::new(0x4242).unwrap(),
        ext: v2.then_some(AddLinkV2Ext {
            v2_direct: true,
            client_target_gid: dev.gid,
            rtokens: RtokenList::Slice(&[]),
        }),
    }
}
