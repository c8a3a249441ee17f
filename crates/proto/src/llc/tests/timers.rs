//! Timers and recovery (CHECKLIST B.15, TC-LLC-24..33), TEST LINK and keepalive (§E.12 KA,
//! TC-LLC-06..08), opcodes and invalid messages (TC-LLC-02..05, B.16).

use super::*;

fn pair(cfg: SimConfig, n: u32, seed: u64) -> Sim {
    let mut cfg = cfg;
    cfg.server_devices = n;
    cfg.client_devices = n;
    cfg.server.max_links = n.max(2) as u8;
    cfg.client.max_links = n.max(2) as u8;
    let mut sim = Sim::new(cfg, seed);
    settle(&mut sim);
    sim.check_consistent().unwrap();
    sim.trace.clear();
    sim
}

fn link_down(sim: &Sim, h: usize, link: LinkId) -> Option<LinkDownReason> {
    sim.hosts[h].events.iter().find_map(|e| match e {
        Event::LinkDown { link: l, reason } if *l == link => Some(*reason),
        _ => None,
    })
}

/// TC-LLC-02: optional opcodes (0x80..0xBF) are discarded; the link stays up.
#[test]
fn tc_llc_02_optional_opcode_discarded() {
    for t in [0x80u8, 0x9F, 0xBF] {
        let mut s = Solo::client_up(LlcConfig::rfc(Role::Client));
        s.take();
        let mut b = [0u8; 44];
        b[0] = t;
        b[1] = 44;
        s.rx_bytes(LinkId::FIRST, &b);
        assert!(s.sent.is_empty());
        assert_eq!(s.lg.link(LinkId::FIRST).unwrap().state, LinkState::Active);
    }
}

/// TC-LLC-03 / TC-LLC-04 / TC-LLC-05 (AMB-35): unknown mandatory opcodes, class 01 and a
/// length byte ≠ 44 take the link down.
#[test]
fn tc_llc_03_05_bad_messages_take_the_link_down() {
    let cases: [(u8, u8); 6] = [
        (0x05, 44),
        (0x0A, 44),
        (0x3F, 44),
        (0x40, 44),
        (0x07, 40),
        (0x23, 44),
    ];
    for (t, len) in cases {
        let mut sim = pair(rfc_pair(), 2, 70);
        let mut b = [0u8; 44];
        b[0] = t;
        b[1] = len;
        sim.inject_bytes(CLIENT, LinkId(1), &b);
        assert!(
            matches!(
                link_down(&sim, CLIENT, LinkId(1)),
                Some(LinkDownReason::ProtocolViolation(_))
            ),
            "type {t:#x} length {len}"
        );
        settle(&mut sim);
        sim.check_consistent().unwrap();
        assert_eq!(
            sim.hosts[SERVER].lg.links().count(),
            1,
            "deleted with the server"
        );
    }
}

/// TC-LLC-06 / TC-LLC-07: TEST LINK is echoed with R on the same link; a reply with other
/// data is a protocol error.
#[test]
fn tc_llc_06_07_test_link_echo_and_mismatch() {
    for (name, cfg) in all_pairs() {
        let mut sim = pair(cfg, 2, 71);
        let data = [0x5A; 16];
        sim.inject(
            SERVER,
            LinkId(1),
            &LlcMessage::TestLink(TestLink {
                v2: name == "linux-v2",
                response: false,
                user_data: data,
            }),
        );
        let w = &sim.trace[0];
        assert_eq!(w.link, LinkId(1));
        assert_eq!(
            w.msg.as_wire(),
            LlcMessage::TestLink(TestLink {
                v2: name == "linux-v2",
                response: true,
                user_data: data
            })
        );
    }
    let mut cfg = rfc_pair();
    cfg.server.timers.test_link_interval = Some(Duration::from_secs(5));
    let mut sim = pair(cfg, 2, 72);
    // The client answers the server's probe with other data.
    sim.intercept = Some(Box::new(|_w: &Wire| Verdict::Deliver));
    sim.run_until_sent(
        |w| is(w, SERVER, LlcType::TestLink, false),
        Duration::from_secs(10),
    );
    let probe = sim.trace.last().unwrap().clone();
    sim.intercept = Some(Box::new(|w: &Wire| {
        if w.msg.msg_type() == LlcType::TestLink {
            Verdict::Swallow
        } else {
            Verdict::Deliver
        }
    }));
    sim.run_for(Duration::from_millis(10));
    sim.inject(
        SERVER,
        probe.link,
        &LlcMessage::TestLink(TestLink {
            v2: false,
            response: true,
            user_data: [0xEE; 16],
        }),
    );
    assert!(matches!(
        link_down(&sim, SERVER, probe.link),
        Some(LinkDownReason::ProtocolViolation(_))
    ));
}

/// TC-LLC-08 / TC-KA-01 / TC-KA-03: an idle link gets TEST LINK after the interval; no
/// answer within 2 s → the link fails; with another link it is deleted, with none the
/// group ends (connections reset).
#[test]
fn tc_llc_08_ka_test_link_timeout() {
    let mut cfg = v2_pair();
    cfg.server.timers.test_link_interval = Some(Duration::from_secs(30));
    cfg.client.timers.test_link_interval = Some(Duration::from_secs(30));
    let mut sim = pair(cfg.clone(), 2, 73);
    sim.run_for(Duration::from_secs(29));
    assert!(sim.trace.is_empty());
    sim.run_for(Duration::from_secs(2));
    // KA-01: each link is probed (by whichever side's timer ran out first) and answered.
    for link in [LinkId::FIRST, LinkId(1)] {
        let on: Vec<bool> = sim
            .trace
            .iter()
            .filter(|w| w.link == link && w.msg.msg_type() == LlcType::TestLink)
            .map(|w| w.msg.is_response())
            .collect();
        assert_eq!(on, [false, true], "{link}");
    }
    sim.trace.clear();
    // The client's TEST LINK traffic on link 2 gets lost (ACKed, never processed).
    swallow(&mut sim, |w| {
        w.from == CLIENT && w.link == LinkId(1) && w.msg.msg_type() == LlcType::TestLink
    });
    sim.run_for(Duration::from_secs(33));
    assert!(
        [SERVER, CLIENT]
            .iter()
            .any(|h| link_down(&sim, *h, LinkId(1)) == Some(LinkDownReason::TestLinkTimeout)),
        "{}",
        sim.dump()
    );
    sim.intercept = None;
    settle(&mut sim);
    sim.check_consistent().unwrap();
    assert_eq!(sim.hosts[CLIENT].lg.links().count(), 1);

    // KA-03 single link: the group ends.
    let mut sim = pair(cfg, 1, 74);
    sim.break_link(SERVER, LinkId::FIRST);
    sim.run_for(Duration::from_secs(40));
    for h in [SERVER, CLIENT] {
        assert!(matches!(
            sim.hosts[h].terminated,
            Some(TerminateReason::NoLinks(_))
        ));
    }
}

/// TC-KA-02: receive activity on a link (CDCs) means no TEST LINK.
#[test]
fn tc_ka_02_active_link_no_probe() {
    let mut sim = pair(v2_pair(), 1, 75);
    for _ in 0..100 {
        sim.run_for(Duration::from_secs(1));
        for h in [SERVER, CLIENT] {
            sim.with(h, |x, now| x.lg.on_link_activity(now, LinkId::FIRST));
        }
    }
    assert_eq!(sim.sent(SERVER, LlcType::TestLink).len(), 0);
    assert_eq!(sim.sent(CLIENT, LlcType::TestLink).len(), 0);
}

/// A peer's FIN without its close flags (Endpoint::conn_tcp_fin): the link is probed
/// only if it hears nothing from the peer within `fin_probe_grace` after the latest such
/// FIN; a live peer's traffic in between spares the TEST LINK, a dead peer's link
/// fails after the grace and the reply timer.
#[test]
fn deferred_probe_waits_for_a_sign_of_life() {
    let grace = LlcTimers::linux(Role::Server).fin_probe_grace;
    // Traffic within the grace: no TEST LINK.
    let mut sim = pair(v2_pair(), 1, 76);
    sim.with(SERVER, |x, now| {
        x.lg.probe_link_deferred(now, LinkId::FIRST)
    });
    sim.run_for(grace / 2);
    sim.with(SERVER, |x, now| x.lg.on_link_activity(now, LinkId::FIRST));
    sim.run_for(grace * 3);
    assert_eq!(
        sim.sent(SERVER, LlcType::TestLink).len(),
        0,
        "{}",
        sim.dump()
    );

    // A second FIN after the traffic: the peer is looked at again, a grace after it.
    sim.with(SERVER, |x, now| {
        x.lg.probe_link_deferred(now, LinkId::FIRST)
    });
    sim.run_for(grace / 2);
    assert_eq!(sim.sent(SERVER, LlcType::TestLink).len(), 0);
    sim.run_for(grace);
    assert_eq!(
        sim.sent(SERVER, LlcType::TestLink).len(),
        1,
        "{}",
        sim.dump()
    );
    settle(&mut sim);
    assert_eq!(
        link_down(&sim, SERVER, LinkId::FIRST),
        None,
        "a live peer answers"
    );

    // FINs keep coming, nothing else does: one probe, a grace after the latest FIN.
    let mut sim = pair(v2_pair(), 1, 77);
    for _ in 0..3 {
        sim.with(SERVER, |x, now| {
            x.lg.probe_link_deferred(now, LinkId::FIRST)
        });
        sim.run_for(grace * 3 / 4);
    }
    assert_eq!(sim.sent(SERVER, LlcType::TestLink).len(), 0);
    sim.run_for(grace / 2);
    assert_eq!(
        sim.sent(SERVER, LlcType::TestLink).len(),
        1,
        "{}",
        sim.dump()
    );

    // A dead peer: nothing answers; the link fails by the reply timer.
    let mut sim = pair(v2_pair(), 1, 78);
    swallow(&mut sim, |w| w.from == CLIENT);
    sim.with(SERVER, |x, now| {
        x.lg.probe_link_deferred(now, LinkId::FIRST)
    });
    sim.run_for(grace + LlcTimers::linux(Role::Server).reply + Duration::from_millis(50));
    assert_eq!(
        link_down(&sim, SERVER, LinkId::FIRST),
        Some(LinkDownReason::TestLinkTimeout),
        "{}",
        sim.dump()
    );
}

/// TC-LLC-24 (§2.3, FO-9): a CONFIRM RKEY interrupted by its link's failure is not
/// replayed on the other link; it is started again, as a new exchange naming the links
/// that remain, once the link is deleted.
#[test]
fn tc_llc_24_llc_not_retried_on_failover() {
    let mut sim = pair(rfc_pair(), 2, 76);
    sim.break_link(SERVER, LinkId::FIRST);
    let r = sim.add_rmb(SERVER);
    settle(&mut sim);
    let reqs: Vec<&Wire> = sim
        .sent(SERVER, LlcType::ConfirmRkey)
        .into_iter()
        .filter(|w| !w.msg.is_response())
        .collect();
    assert_eq!(reqs.len(), 2, "{:?}", sim.labels());
    let LlcMessage::ConfirmRkey(a) = reqs[0].msg.as_wire() else {
        panic!()
    };
    let LlcMessage::ConfirmRkey(b) = reqs[1].msg.as_wire() else {
        panic!()
    };
    assert_eq!((reqs[0].link_num, a.num_tokens), (1, 1));
    assert_eq!((reqs[1].link_num, b.num_tokens), (2, 0));
    let labels = sim.labels();
    let del = labels
        .iter()
        .position(|l| l == "C: DELETE LINK rsp")
        .unwrap();
    assert!(labels.iter().rposition(|l| l == "S: CONFIRM RKEY").unwrap() > del);
    assert!(sim.hosts[SERVER].saw(|e| *e == Event::RmbConfirmed(r)));
    sim.check_consistent().unwrap();
}

/// TC-LLC-25 / AR-7: no CONFIRM RKEY answer → the carrying link failed.
#[test]
fn tc_llc_25_confirm_rkey_timeout() {
    let mut sim = pair(rfc_pair(), 2, 77);
    once(&mut sim, Verdict::Swallow, |w| {
        is(w, SERVER, LlcType::ConfirmRkey, true)
    });
    sim.add_rmb(CLIENT);
    sim.run_for(Duration::from_millis(1990));
    assert!(link_down(&sim, CLIENT, LinkId::FIRST).is_none());
    sim.run_for(Duration::from_millis(20));
    assert_eq!(
        link_down(&sim, CLIENT, LinkId::FIRST),
        Some(LinkDownReason::ReplyTimeout("CONFIRM RKEY"))
    );
    sim.intercept = None;
    settle(&mut sim);
    sim.check_consistent().unwrap();
}

/// TC-LLC-26 / CDL-5: the server never acts on the client's DELETE LINK: the client gives
/// up after its wait, and the link that carried the request is unusable too.
#[test]
fn tc_llc_26_client_delete_link_timeout() {
    let mut sim = pair(rfc_pair(), 3, 78);
    swallow(&mut sim, |w| is(w, CLIENT, LlcType::DeleteLink, false));
    sim.with(CLIENT, |h, now| {
        h.lg.delete_link(now, LinkId(2), true).unwrap()
    });
    let carrying = sim.trace[0].link;
    sim.run_for(Duration::from_millis(9990));
    assert!(link_down(&sim, CLIENT, carrying).is_none());
    sim.run_for(Duration::from_millis(20));
    assert_eq!(
        link_down(&sim, CLIENT, carrying),
        Some(LinkDownReason::ReplyTimeout("DELETE LINK"))
    );
}

/// TC-LLC-27 / SDL-6: the server's DELETE LINK is not answered and the carrying link was
/// the last one: the group ends, once the server has waited `delete_link_wait` (not the 2 s
/// reply timer: a client that lost the path queues our request behind its own DELETE LINK
/// exchange; Linux 6.12 answered after 2.9 s in tests/system/kpeer-linux-failover.sh, and
/// on the 2 s timer the surviving link went too, with every connection on it).
#[test]
fn tc_llc_27_server_delete_link_timeout_last_link() {
    let mut sim = pair(rfc_pair(), 2, 79);
    swallow(&mut sim, |w| is(w, CLIENT, LlcType::DeleteLink, true));
    sim.with(SERVER, |h, now| {
        h.lg.delete_link(now, LinkId(1), true).unwrap()
    });
    let carrying = sim.trace[0].link;
    sim.run_for(Duration::from_millis(3000));
    assert_eq!(sim.hosts[SERVER].terminated, None);
    assert!(link_down(&sim, SERVER, carrying).is_none());
    sim.run_for(Duration::from_millis(7010));
    assert_eq!(
        sim.hosts[SERVER].terminated,
        Some(TerminateReason::NoLinks(LinkDownReason::ReplyTimeout(
            "DELETE LINK"
        )))
    );
}

/// Hooks a crafted client into a server that has one confirmed link and one ADD LINK
/// request in flight (not first contact).
fn server_adding() -> Solo {
    let mut s = Solo::server_up(LlcConfig::rfc(Role::Server), 1);
    // First contact's asymmetric attempt: rejected.
    let last = s.last();
    let LlcMessage::AddLink(mut a) = last.as_wire() else {
        panic!()
    };
    a.response = true;
    a.reject = true;
    a.reject_reason = 1;
    s.rx(LinkId::FIRST, &LlcMessage::AddLink(a));
    assert!(s.saw(|e| *e == Event::FirstContactDone));
    s.take();
    s.lg.add_device(s.now, device(SERVER, 2));
    s.drain();
    assert!(matches!(s.last().as_wire(), LlcMessage::AddLink(a) if !a.response));
    s
}

/// TC-LLC-28 / TC-LLC-29: not first contact, the ADD LINK (or CONTINUATION) answer does
/// not come: the new link is cleaned up and the carrying link treated as failed (C.7.1).
#[test]
fn tc_llc_28_29_add_link_timeouts_not_first() {
    let mut s = server_adding();
    let new = *s.created.last().unwrap();
    s.advance(Duration::from_millis(2010));
    assert!(s.destroyed.contains(&new));
    assert!(s.lg.is_terminated(), "the carrying link was the only one");

    let mut s = server_adding();
    let new = *s.created.last().unwrap();
    let mut rsp = server_add_link(false, &device(CLIENT, 2), 2, 0x40);
    rsp.response = true;
    rsp.link_num = s.lg.link(new).unwrap().num;
    s.rx(LinkId::FIRST, &LlcMessage::AddLink(rsp));
    assert!(matches!(s.last().as_wire(), LlcMessage::AddLinkCont(_)));
    s.advance(Duration::from_millis(2010));
    assert!(s.destroyed.contains(&new));
    assert!(s.saw(|e| matches!(
        e,
        Event::LinkDown {
            reason: LinkDownReason::ReplyTimeout("ADD LINK"),
            ..
        }
    )));
}

/// TC-LLC-30: the client waits for a CONTINUATION the server owes (not first contact):
/// the carrying link is treated as failed.
#[test]
fn tc_llc_30_client_owed_cont_timeout_not_first() {
    let mut s = Solo::client_up(LlcConfig::rfc(Role::Client));
    let m = server_add_link(false, &device(SERVER, 1), 2, 0x30);
    s.rx(LinkId::FIRST, &LlcMessage::AddLink(m));
    assert!(s.saw(|e| *e == Event::FirstContactDone));
    s.lg.add_device(s.now, device(CLIENT, 2));
    s.drain();
    let m = server_add_link(false, &device(SERVER, 2), 3, 0x31);
    s.rx(LinkId::FIRST, &LlcMessage::AddLink(m));
    assert!(matches!(s.last().as_wire(), LlcMessage::AddLink(a) if a.response && !a.reject));
    // The server says 3 RMBs follow but sends only the first CONTINUATION.
    let c = AddLinkCont {
        response: false,
        link_num: 3,
        num_rkeys: 3,
        rtokens: [
            AddLinkRtoken {
                rmb_key: 0x200,
                rmb_key_new: 0x201,
                rmb_vaddr_new: 1,
            },
            AddLinkRtoken {
                rmb_key: 0x300,
                rmb_key_new: 0x301,
                rmb_vaddr_new: 1,
            },
        ],
    };
    s.lg.learn_peer_rmb(
        LinkId::FIRST,
        RToken {
            rkey: 0x300,
            vaddr: 0,
        },
    );
    s.rx(LinkId::FIRST, &LlcMessage::AddLinkCont(c));
    assert!(matches!(s.last().as_wire(), LlcMessage::AddLinkCont(r) if r.response));
    s.advance(Duration::from_millis(2010));
    assert!(
        s.lg.is_terminated(),
        "carrying link failed, it was the last one"
    );
    assert!(s.saw(|e| matches!(
        e,
        Event::LinkDown {
            reason: LinkDownReason::ReplyTimeout("ADD LINK CONTINUATION"),
            ..
        }
    )));
}

/// TC-LLC-31 / SL-S11: not first contact, no CONFIRM LINK answer on the new link: DELETE
/// LINK for it, and a retry later (C.8).
#[test]
fn tc_llc_31_confirm_link_timeout_not_first() {
    let mut cfg = rfc_pair();
    cfg.server.timers.add_link_retry = Some(Duration::from_secs(30));
    let mut sim = pair(cfg, 1, 80);
    let d = device(SERVER, 2);
    sim.hosts[SERVER].devices.push(d);
    swallow(&mut sim, |w| is(w, CLIENT, LlcType::ConfirmLink, true));
    sim.with(SERVER, |h, now| h.lg.add_device(now, d));
    sim.run_for(Duration::from_secs(6));
    let del = sim.sent(SERVER, LlcType::DeleteLink);
    assert_eq!(del.len(), 1, "{:?}", sim.labels());
    sim.intercept = None;
    sim.run_for(Duration::from_secs(31));
    settle(&mut sim);
    assert_eq!(sim.sent(SERVER, LlcType::AddLink).len(), 2, "retried");
    sim.check_consistent().unwrap();
    assert_eq!(sim.hosts[SERVER].lg.links().count(), 2);
}

/// TC-LLC-33 / LT-1: a send completion error counts as the timeout, at once.
#[test]
fn tc_llc_33_send_error_is_a_timeout() {
    let mut sim = pair(rfc_pair(), 2, 81);
    once(&mut sim, Verdict::Fail, |w| {
        is(w, CLIENT, LlcType::ConfirmRkey, false)
    });
    sim.add_rmb(CLIENT);
    sim.run_for(Duration::from_millis(300));
    assert_eq!(
        link_down(&sim, CLIENT, LinkId::FIRST),
        Some(LinkDownReason::SendFailed)
    );
    sim.intercept = None;
    settle(&mut sim);
    sim.check_consistent().unwrap();
}

/// B.16: every CONFIRM LINK check on an added link: a response naming another QP deletes
/// the new link; a request at the client likewise.
#[test]
fn b16_invalid_confirm_link_on_new_link() {
    let mut s = server_adding();
    let new = *s.created.last().unwrap();
    let num = s.lg.link(new).unwrap().num;
    let mut rsp = server_add_link(false, &device(CLIENT, 2), num, 0x40);
    rsp.response = true;
    s.rx(LinkId::FIRST, &LlcMessage::AddLink(rsp));
    s.rx(
        LinkId::FIRST,
        &LlcMessage::AddLinkCont(AddLinkCont {
            response: true,
            link_num: num,
            num_rkeys: 1,
            rtokens: [
                AddLinkRtoken {
                    rmb_key: 0x200,
                    rmb_key_new: 0x201,
                    rmb_vaddr_new: 1,
                },
                AddLinkRtoken::default(),
            ],
        }),
    );
    assert!(matches!(s.last().as_wire(), LlcMessage::ConfirmLink(_)));
    let mut c = s.peer_confirm_link(true, num);
    c.qpn = U24::new(0x99).unwrap();
    s.rx(new, &LlcMessage::ConfirmLink(c));
    assert!(matches!(s.last().as_wire(),
        LlcMessage::DeleteLink(d) if d.link_num == num && !d.response));
    assert!(!s.saw(|e| *e == Event::LinkUp(new)));
}

/// Nothing the peer sends makes the machine panic, hang or grow: random bytes and random
/// well-formed messages on random links, in every role and flavour.
#[test]
fn hostile_peer_never_panics() {
    use crate::llc::sim::Rng;
    use proptest::prelude::*;
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &(
                any::<u64>(),
                proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..120), 1..60),
            ),
            |(seed, msgs)| {
                let mut rng = Rng::new(seed);
                let (_, cfg) = all_pairs().swap_remove(rng.below(3) as usize);
                let mut sim = pair(cfg, 1 + rng.below(2) as u32, seed);
                for mut m in msgs {
                    let h = rng.below(2) as usize;
                    let links: Vec<LinkId> = sim.hosts[h].lg.links().map(|l| l.id).collect();
                    let link = links
                        .get(rng.below(links.len() as u64 + 1) as usize)
                        .copied()
                        .unwrap_or(LinkId(99));
                    // Make most of them parse: a known type byte and a plausible length.
                    if m.len() >= 4 && rng.chance(80) {
                        let types = [
                            1u8, 2, 3, 4, 6, 7, 8, 9, 0x21, 0x22, 0x24, 0x25, 0x26, 0x27, 0x29,
                        ];
                        m[0] = types[rng.below(types.len() as u64) as usize];
                        m.resize(44.max(m.len()), 0);
                        if m[0] & 0x20 != 0 {
                            let n = m.len() as u16;
                            m[1..3].copy_from_slice(&n.to_le_bytes());
                        } else {
                            m.truncate(44);
                            m[1] = 44;
                        }
                    }
                    sim.inject_bytes(h, link, &m);
                    sim.run_for(Duration::from_millis(rng.below(50)));
                }
                sim.run_for(Duration::from_secs(60));
                for h in &sim.hosts {
                    prop_assert!(h.lg.links().count() <= 8);
                }
                Ok(())
            },
        )
        .unwrap();
}

/// B.15 "ADD LINK reply (client, more RKeys owed)" and "ADD LINK CONT reply (client, first
/// contact, server owes more)": on first contact the client resets (RFC C.7.1).
#[test]
fn b15_client_owed_cont_first_contact() {
    for owes_after_first in [false, true] {
        let mut s = Solo::client_up(LlcConfig::rfc(Role::Client));
        s.lg.add_device(s.now, device(CLIENT, 2));
        s.drain();
        let m = server_add_link(false, &device(SERVER, 2), 2, 0x30);
        s.rx(LinkId::FIRST, &LlcMessage::AddLink(m));
        assert!(matches!(s.last().as_wire(), LlcMessage::AddLink(a) if !a.reject));
        if owes_after_first {
            s.lg.learn_peer_rmb(
                LinkId::FIRST,
                RToken {
                    rkey: 0x300,
                    vaddr: 0,
                },
            );
            let c = AddLinkCont {
                response: false,
                link_num: 2,
                num_rkeys: 4,
                rtokens: [
                    AddLinkRtoken {
                        rmb_key: 0x200,
                        rmb_key_new: 0x201,
                        rmb_vaddr_new: 1,
                    },
                    AddLinkRtoken {
                        rmb_key: 0x300,
                        rmb_key_new: 0x301,
                        rmb_vaddr_new: 1,
                    },
                ],
            };
            s.rx(LinkId::FIRST, &LlcMessage::AddLinkCont(c));
        }
        s.advance(Duration::from_millis(2010));
        assert_eq!(
            s.events.last(),
            Some(&Event::Terminated(TerminateReason::FirstContact(
                smc_wire::decline::DeclineCode::TIMEOUT_AL
            ))),
            "owes after first: {owes_after_first}"
        );
        assert!(!s.saw(|e| *e == Event::FirstContactDone));
    }
}

/// B.15 "ADD LINK / CONT reply (client, none owed, not first contact)": no CONFIRM LINK on
/// the new link → DELETE LINK for it; the carrying link is unaffected.
#[test]
fn b15_client_no_confirm_link_not_first_contact() {
    let mut s = Solo::client_up(LlcConfig::linux(Role::Client, Version::V2));
    s.advance(Duration::from_secs(3));
    assert!(s.saw(|e| *e == Event::FirstContactDone));
    s.lg.add_device(s.now, device(CLIENT, 2));
    s.drain();
    let m = server_add_link(true, &device(SERVER, 2), 2, 0x30);
    s.rx(LinkId::FIRST, &LlcMessage::AddLink(m));
    assert!(matches!(s.last().as_wire(), LlcMessage::AddLink(a) if a.response && !a.reject));
    s.take();
    s.advance(Duration::from_millis(5010));
    let LlcMessage::DeleteLink(d) = s.last().as_wire() else {
        panic!("{:?}", s.sent)
    };
    assert_eq!((d.link_num, d.all), (2, false));
    assert_eq!(s.lg.link(LinkId::FIRST).unwrap().state, LinkState::Active);
    assert!(!s.lg.is_terminated());
}

/// B.15 "DELETE LINK A = 1 (server)": if it cannot be delivered, the group is torn down
/// anyway (LGT-4, C.7.1).
#[test]
fn b15_delete_all_send_failure() {
    let mut sim = pair(v2_pair(), 1, 82);
    sim.break_link(SERVER, LinkId::FIRST);
    sim.with(SERVER, |h, now| h.lg.terminate(now));
    assert!(!sim.hosts[SERVER].lg.is_terminated());
    sim.run_for(Duration::from_secs(1));
    assert_eq!(
        sim.hosts[SERVER].terminated,
        Some(TerminateReason::Local(DeleteLinkReason::OP_INIT_TERM))
    );
}

/// Issue 10 item 9 (KA-4): a peer's TEST LINK flood gets a few answers in flight at most;
/// the rest is dropped, the link stays up, and answering resumes as the answers complete.
#[test]
fn test_link_flood_is_bounded_and_the_link_stays_up() {
    let mut s = Solo::server_up(LlcConfig::linux(Role::Server, Version::V2), 1);
    s.take();
    s.hold_sends = true;
    let req = |i: u8| {
        LlcMessage::TestLink(TestLink {
            v2: true,
            response: false,
            user_data: [i; 16],
        })
    };
    for i in 0..200u8 {
        s.rx(LinkId::FIRST, &req(i));
    }
    let answers = s.take();
    assert_eq!(answers.len(), 4, "answers in flight are bounded");
    assert!(answers
        .iter()
        .all(|(l, m)| *l == LinkId::FIRST && m.msg_type() == LlcType::TestLink));
    assert_eq!(s.lg.dropped_requests(), 196);
    assert!(!s.saw(|e| matches!(e, Event::LinkDown { .. } | Event::Terminated(_))));
    assert_eq!(s.lg.link(LinkId::FIRST).unwrap().state, LinkState::Active);
    // The answers complete: the next request is answered again.
    s.complete_held();
    s.rx(LinkId::FIRST, &req(201));
    assert_eq!(s.take().len(), 1);
    assert_eq!(s.lg.dropped_requests(), 196);
}
