//! Replays the real Linux 6.12 LLC conversation of `k612-pair.pcap` through the link-group
//! machine (`smc::llc`), once as the client and once as the server: every message Linux
//! sent in the role we play must come out of our machine byte for byte, at the same point
//! of the conversation.
//!
//! The peer's messages are fed to the machine at their capture time (CDCs count as receive
//! activity, for the TEST LINK keepalive); for the messages Linux sent in our role, the
//! test does what the runtime would have done at that moment (announce or delete an RMB,
//! give the machine a QP for the new link) and then pops the machine's next SEND of that
//! type. The harness ran TEST LINK every 5 s (README §5), and so does the replay.
//!
//! What Linux does and we deliberately do not: after the server's DELETE LINK (all) the
//! Linux client sends its own DELETE LINK (all) requests (16 retransmissions at the end of
//! the capture); RFC 7609 §3.5.4 / AMB-27 need no answer, so our client just ends.

use smc::llc::{
    Device, DeviceId, Event, FirstLink, LinkGroup, LinkId, LlcConfig, LlcFormat, LlcOut, Output,
    PeerQp, QpInfo, RToken, RmbId, Role, TerminateReason, Version,
};
use smc_cli::capture::Capture;
use smc_cli::extract::{Extractor, Found};
use smc_wire::clc::ClcMessage;
use smc_wire::common::QpMtu;
use smc_wire::llc::{DeleteLinkReason, LlcMessage, LlcType};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const FMT: LlcFormat = LlcFormat::LINUX_X86;

/// One SEND of the capture.
struct Msg {
    frame: u64,
    time: Duration,
    from_server: bool,
    bytes: Vec<u8>,
}

/// The first-contact values from the first connection's CLC Accept and Confirm, and every
/// RoCE SEND in order.
struct Conversation {
    accept: smc_wire::clc::AcceptConfirmRepr,
    confirm: smc_wire::clc::AcceptConfirmRepr,
    sends: Vec<Msg>,
}

fn load() -> Conversation {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/pcaps/k612-pair.pcap");
    let mut cap = Capture::open(&path).expect("capture");
    let mut ex = Extractor::new();
    let (mut accept, mut confirm, mut server_ip) = (None, None, None);
    let mut sends = Vec::new();
    while let Some(f) = cap.next_frame() {
        for found in ex.push(&f.expect("frame")) {
            match found {
                Found::Clc { origin, bytes } => match ClcMessage::parse(&bytes).expect("CLC") {
                    ClcMessage::Accept(a) if accept.is_none() => {
                        assert!(a.first_contact);
                        server_ip = Some(origin.src.ip());
                        accept = Some(a);
                    }
                    ClcMessage::Confirm(c) if confirm.is_none() => confirm = Some(c),
                    _ => {}
                },
                Found::Send {
                    origin, payload, ..
                } => sends.push(Msg {
                    frame: origin.frame,
                    time: origin.time,
                    from_server: Some(origin.src.ip()) == server_ip,
                    bytes: payload,
                }),
                _ => {}
            }
        }
    }
    Conversation {
        accept: accept.expect("an Accept"),
        confirm: confirm.expect("a Confirm"),
        sends,
    }
}

fn is_cdc(b: &[u8]) -> bool {
    b.first() == Some(&smc_wire::cdc::CDC_TYPE)
}

/// The machine for `role`, created as the runtime would after CLC.
fn machine(c: &Conversation, role: Role, start: Instant) -> LinkGroup {
    let (me, peer) = match role {
        Role::Server => (&c.accept, &c.confirm),
        Role::Client => (&c.confirm, &c.accept),
    };
    let dev = Device {
        id: DeviceId(1),
        mac: me.mac,
        gid: me.gid,
    };
    let mtu = QpMtu::from_code(c.accept.qp_mtu).expect("MTU");
    let first = FirstLink {
        device: dev.id,
        local: QpInfo {
            qpn: me.qpn,
            psn: me.psn,
            mtu,
        },
        peer: PeerQp {
            mac: peer.mac,
            gid: peer.gid,
            qpn: peer.qpn,
            psn: peer.psn,
            mtu,
        },
        local_rmb: RmbId(1),
        local_token: RToken {
            rkey: me.rmb_rkey,
            vaddr: me.rmb_vaddr,
        },
        peer_token: RToken {
            rkey: peer.rmb_rkey,
            vaddr: peer.rmb_vaddr,
        },
    };
    let mut cfg = LlcConfig::linux(role, Version::V2);
    // The harness's `smcr_testlink_time` (README §5); Linux numbers its first link group 1.
    cfg.timers.test_link_interval = Some(Duration::from_secs(5));
    cfg.timers.add_link_retry = None;
    cfg.lgr_id = 1;
    LinkGroup::new(cfg, vec![dev], first, start).expect("machine")
}

struct Replay {
    lg: LinkGroup,
    start: Instant,
    /// Our SENDs not yet matched with Linux's.
    sent: VecDeque<(LinkId, LlcOut)>,
    events: Vec<Event>,
    created: Vec<LinkId>,
    matched: usize,
}

impl Replay {
    fn drain(&mut self, now: Instant) {
        while let Some(o) = self.lg.poll_output() {
            match o {
                Output::Send(t) => {
                    self.lg.on_send_complete(now, t.link, t.id, true);
                    self.sent.push_back((t.link, t.msg));
                }
                Output::CreateLink { link, .. } => self.created.push(link),
                Output::Event(e) => self.events.push(e),
                Output::ConnectLink { .. } | Output::DestroyLink { .. } => {}
            }
        }
    }

    /// Our keepalive and Linux's do not fire at exactly the same moment (the capture's
    /// timers jitter by tens of milliseconds). A TEST LINK request of ours that Linux did
    /// not send within 50 ms is answered the way Linux answers every TEST LINK (H9: at
    /// once, the echo with R).
    fn answer_extra_test_links(&mut self, now: Instant, role: Role, rest: &[Msg], at: Duration) {
        let ours_from_server = role == Role::Server;
        let linux_sends_one = rest.iter().take_while(|m| m.time <= at + Duration::from_millis(50)).any(|m| {
            m.from_server == ours_from_server
                && matches!(LlcMessage::parse(&m.bytes, FMT), Ok(LlcMessage::TestLink(t)) if !t.response)
        });
        if linux_sends_one {
            return;
        }
        while let Some(pos) = self
            .sent
            .iter()
            .position(|(_, o)| o.msg_type() == LlcType::TestLink && !o.is_response())
        {
            let (link, q) = self.sent.remove(pos).expect("present");
            let LlcMessage::TestLink(mut t) = q.as_wire() else {
                unreachable!()
            };
            t.response = true;
            self.lg.handle_llc(now, link, &LlcMessage::TestLink(t));
            self.drain(now);
        }
    }

    /// Pops our next SEND of this kind; it must be exactly Linux's.
    fn expect(&mut self, m: &Msg) {
        let want = LlcMessage::parse(&m.bytes, FMT).expect("capture parses");
        let pos = self
            .sent
            .iter()
            .position(|(_, o)| {
                o.msg_type() == want.msg_type() && o.is_response() == want.is_response()
            })
            .unwrap_or_else(|| {
                panic!(
                    "frame {}: Linux sent {:?}; we have {:?}",
                    m.frame, want, self.sent
                )
            });
        let (link, ours) = self.sent.remove(pos).expect("present");
        assert_eq!(link, LinkId::FIRST, "frame {}", m.frame);
        let bytes = ours.encode(FMT).expect("encodes");
        assert_eq!(
            bytes,
            m.bytes,
            "frame {}: ours {:?}\nLinux {:?}",
            m.frame,
            ours.as_wire(),
            want
        );
        self.matched += 1;
    }
}

fn replay(role: Role) -> Replay {
    let c = load();
    let start = Instant::now();
    let mut r = Replay {
        lg: machine(&c, role, start),
        start,
        sent: VecDeque::new(),
        events: Vec::new(),
        created: Vec::new(),
        matched: 0,
    };
    r.drain(start);
    let mut ours_rmb_free = Vec::new();
    // Time 0 is the first SEND (the server's CONFIRM LINK, right after the CLC Confirm).
    let t0 = c.sends.first().expect("sends").time;
    for (i, m) in c.sends.iter().enumerate() {
        let now = r.start + (m.time - t0);
        r.lg.on_timeout(now);
        r.drain(now);
        r.answer_extra_test_links(now, role, &c.sends[i..], m.time);
        let from_peer = m.from_server != (role == Role::Server);
        if is_cdc(&m.bytes) {
            if from_peer {
                r.lg.on_link_activity(now, LinkId::FIRST);
            }
            continue;
        }
        if r.lg.is_terminated() {
            // The Linux client's own DELETE LINK (all) retransmissions (see the module doc).
            assert!(
                !from_peer || role == Role::Server,
                "frame {}: {:?}",
                m.frame,
                r.events
            );
            continue;
        }
        if from_peer {
            r.lg.handle_llc_bytes(now, LinkId::FIRST, &m.bytes);
            r.drain(now);
            continue;
        }
        // Linux in our role sent this: do what the runtime would have done, then compare.
        let msg = LlcMessage::parse(&m.bytes, FMT).expect("parses");
        match (&msg, msg.is_response()) {
            (LlcMessage::ConfirmRkey(k), false) => {
                // A new connection: its RMB announced (Linux re-announces the same one).
                let rmb = ours_rmb_free.pop().unwrap_or(RmbId(1));
                let token = RToken {
                    rkey: k.rkey,
                    vaddr: k.vaddr,
                };
                r.lg.add_rmb(now, rmb, &[(LinkId::FIRST, token)])
                    .expect("add_rmb");
            }
            (LlcMessage::DeleteRkeyV2(d), false) => {
                let key = d.rkeys.iter().next().expect("one rkey");
                let rmb =
                    r.lg.local_rmbs()
                        .find(|x| {
                            r.lg.local_token(*x, LinkId::FIRST)
                                .is_some_and(|t| t.rkey == key)
                        })
                        .expect("our RMB");
                r.lg.delete_rmb(now, rmb).expect("delete_rmb");
                ours_rmb_free.push(rmb);
            }
            (LlcMessage::AddLink(a), false) => {
                // The server's second link: the runtime's new QP and the RMB's RToken on
                // it, as Linux had them.
                let link = *r.created.last().expect("CreateLink before ADD LINK");
                let ext = a.ext.expect("v2 extension");
                let rt = ext.rtokens.iter().next().expect("one rtoken");
                let qp = QpInfo {
                    qpn: a.qpn,
                    psn: a.psn,
                    mtu: QpMtu::from_code(a.qp_mtu).expect("MTU"),
                };
                let tok = RToken {
                    rkey: rt.rmb_key_new,
                    vaddr: rt.rmb_vaddr_new,
                };
                r.lg.on_link_created(now, link, qp, &[(RmbId(1), tok)])
                    .expect("on_link_created");
            }
            (LlcMessage::DeleteLink(d), false) if d.all => {
                r.lg.terminate_with(now, d.reason, d.orderly);
            }
            _ => {}
        }
        r.drain(now);
        r.expect(m);
        // Linux's DELETE LINK (all) went out: ours is done once it completed.
        if let LlcMessage::DeleteLink(d) = msg {
            if d.all {
                r.drain(now);
            }
        }
    }
    r
}

/// Our client answers the Linux 6.12 server exactly like the Linux client did: CONFIRM
/// LINK response (flags 0x83, max_links 2, max_conns 255, link user ID 0x101), the reject
/// of the asymmetric ADD LINK as the 44-byte echo with 0xC0, CONFIRM RKEY / DELETE RKEY v2
/// in both directions (responses with the keys zeroed), TEST LINK both ways; and it ends
/// on the server's DELETE LINK (all).
#[test]
fn k612_replay_as_client() {
    let r = replay(Role::Client);
    // 1 CONFIRM LINK + 1 ADD LINK + 4+4 CONFIRM RKEY + 6+6 DELETE RKEY... our half of them.
    assert_eq!(r.matched, 15, "{:?}", r.events);
    assert!(r.sent.is_empty(), "nothing extra: {:?}", r.sent);
    assert_eq!(
        r.events[..4],
        [
            Event::ConfirmLinkSent,
            Event::FirstLinkUp,
            Event::PointOfNoReturn,
            Event::FirstContactDone
        ]
    );
    assert_eq!(
        r.events.last(),
        Some(&Event::Terminated(TerminateReason::PeerDeleted(
            DeleteLinkReason::OP_INIT_TERM
        )))
    );
    assert!(r.events.iter().any(|e| matches!(e, Event::RmbConfirmed(_))));
    assert!(r.events.iter().any(|e| matches!(e, Event::RmbDeleted(_))));
}

/// Our server drives the Linux 6.12 client exactly like the Linux server did: the same
/// CONFIRM LINK (flag 0x03), the same asymmetric ADD LINK v2 with its rtoken extension,
/// the same CONFIRM/DELETE RKEY and TEST LINK messages, and the DELETE LINK (all) of the
/// module unload.
#[test]
fn k612_replay_as_server() {
    let r = replay(Role::Server);
    assert_eq!(r.matched, 16, "{:?}", r.events);
    assert!(r.sent.is_empty(), "nothing extra: {:?}", r.sent);
    assert_eq!(
        r.events[..4],
        [
            Event::ConfirmLinkSent,
            Event::FirstLinkUp,
            Event::PointOfNoReturn,
            Event::FirstContactDone
        ]
    );
    assert_eq!(
        r.events.last(),
        Some(&Event::Terminated(TerminateReason::Local(
            DeleteLinkReason::OP_INIT_TERM
        )))
    );
    assert_eq!(r.created.len(), 1, "one ADD LINK attempt");
}
