//! RKey management (CHECKLIST §E.7 RK, B.13).

use super::*;

fn links(n: u32, cfg: SimConfig) -> Sim {
    let mut cfg = cfg;
    cfg.server_devices = n;
    cfg.client_devices = n;
    cfg.server.max_links = n as u8;
    cfg.client.max_links = n as u8;
    let mut sim = Sim::new(cfg, u64::from(n));
    settle(&mut sim);
    assert_eq!(
        sim.hosts[SERVER].lg.links().count(),
        n as usize,
        "{}",
        sim.dump()
    );
    sim.check_consistent().unwrap();
    sim.trace.clear();
    sim
}

fn confirm_rkeys(sim: &Sim, from: usize) -> Vec<ConfirmRkey> {
    sim.trace
        .iter()
        .filter(|w| w.from == from)
        .filter_map(|w| match w.msg.as_wire() {
            LlcMessage::ConfirmRkey(c) => Some(c),
            _ => None,
        })
        .collect()
}

/// TC-RK-01 / TC-RK-02: two and three links: NumTkns = other links, one message, echoed
/// with R; both sides then map the RMB on every link.
#[test]
fn tc_rk_01_02_confirm_rkey_two_and_three_links() {
    for n in [2, 3] {
        let mut sim = links(n, rfc_pair());
        let r = sim.add_rmb(CLIENT);
        settle(&mut sim);
        assert_eq!(sim.labels(), ["C: CONFIRM RKEY", "S: CONFIRM RKEY rsp"]);
        let req = confirm_rkeys(&sim, CLIENT)[0];
        assert_eq!(u32::from(req.num_tokens), n - 1);
        let rsp = confirm_rkeys(&sim, SERVER)[0];
        assert_eq!(
            rsp,
            ConfirmRkey {
                response: true,
                ..req
            },
            "echo"
        );
        assert!(sim.hosts[CLIENT].saw(|e| *e == Event::RmbConfirmed(r)));
        sim.check_consistent().unwrap();
    }
}

/// TC-RK-03 / TC-RK-05: 4..8 links: CONFIRM RKEY CONTINUATIONs, NumTknsLeft counting down
/// by 3, each echoed; RmbConfirmed only after the last echo.
#[test]
fn tc_rk_03_confirm_rkey_cont_up_to_8_links() {
    for n in [4, 6, 8] {
        let mut sim = links(n, rfc_pair());
        let r = sim.add_rmb(SERVER);
        // Not confirmed before every echo is in.
        sim.run_for(Duration::from_micros(100));
        assert!(!sim.hosts[SERVER].saw(|e| *e == Event::RmbConfirmed(r)));
        settle(&mut sim);
        let labels = sim.labels();
        let conts = (n - 1 - 2).div_ceil(3) as usize;
        assert_eq!(labels.len(), 2 + 2 * conts, "{labels:?}");
        let lefts: Vec<u8> = sim
            .trace
            .iter()
            .filter(|w| w.from == SERVER)
            .filter_map(|w| match w.msg.as_wire() {
                LlcMessage::ConfirmRkeyCont(c) => Some(c.num_left),
                _ => None,
            })
            .collect();
        let expect: Vec<u8> = (0..conts).map(|i| (n - 3) as u8 - 3 * i as u8).collect();
        assert_eq!(lefts, expect);
        assert!(sim.hosts[SERVER].saw(|e| *e == Event::RmbConfirmed(r)));
        sim.check_consistent().unwrap();
    }
}

/// TC-RK-04 (C.7.1): a CONFIRM RKEY without a token for one of the links: that link has
/// failed.
#[test]
fn tc_rk_04_confirm_rkey_missing_link_token() {
    let mut sim = links(3, rfc_pair());
    let c = ConfirmRkey {
        num_tokens: 1,
        rkey: 0x999,
        vaddr: 0x9000,
        others: [
            OtherLinkRkey {
                link_num: 2,
                rkey: 0x998,
                vaddr: 0x9001,
            },
            OtherLinkRkey::default(),
        ],
        ..Default::default()
    };
    sim.inject(CLIENT, LinkId::FIRST, &LlcMessage::ConfirmRkey(c));
    let l3 = sim.hosts[CLIENT]
        .lg
        .links()
        .find(|l| l.num == 3)
        .unwrap()
        .id;
    assert!(sim.hosts[CLIENT].saw(|e| *e
        == Event::LinkDown {
            link: l3,
            reason: LinkDownReason::MissingRkey
        }));
    // The tokens it had are recorded, and the response went out first.
    assert_eq!(sim.labels()[0], "C: CONFIRM RKEY rsp");
    assert!(sim.hosts[CLIENT]
        .lg
        .peer_rmb_by_rkey(LinkId::FIRST, 0x999)
        .is_some());
}

/// TC-RK-06 / TC-RK-07 (CRK-3): a negative answer with C is retried after the current
/// change; without C it is reported and not retried.
#[test]
fn tc_rk_06_07_negative_confirm_rkey() {
    let mut s = Solo::client_up(LlcConfig::rfc(Role::Client));
    // Settle first contact: reject nothing, just let the wait for ADD LINK go by.
    let m = server_add_link(false, &device(SERVER, 1), 2, 0x30);
    s.rx(LinkId::FIRST, &LlcMessage::AddLink(m));
    s.take();
    for (retry, expect_retry) in [(true, true), (false, false)] {
        let rmb = RmbId(10 + u32::from(retry));
        s.lg.add_rmb(
            s.now,
            rmb,
            &[(
                LinkId::FIRST,
                RToken {
                    rkey: 0x500,
                    vaddr: 1,
                },
            )],
        )
        .unwrap();
        s.drain();
        let last = s.last();
        let LlcMessage::ConfirmRkey(mut r) = last.as_wire() else {
            panic!()
        };
        r.response = true;
        r.negative = true;
        r.retry = retry;
        s.take();
        s.rx(LinkId::FIRST, &LlcMessage::ConfirmRkey(r));
        // Not at once: the peer's configuration change gets a moment to finish.
        assert!(s.sent.is_empty());
        s.advance(Duration::from_millis(260));
        let again = s
            .sent
            .iter()
            .any(|(_, m)| m.msg_type() == LlcType::ConfirmRkey);
        assert_eq!(again, expect_retry, "retry {retry}");
        if expect_retry {
            r.negative = false;
            r.retry = false;
            s.rx(LinkId::FIRST, &LlcMessage::ConfirmRkey(r));
            assert!(s.saw(|e| *e == Event::RmbConfirmed(rmb)));
        } else {
            assert!(s.saw(|e| *e == Event::RmbConfirmFailed { rmb, retry: false }));
            assert!(s.lg.local_rmbs().all(|x| x != rmb), "forgotten");
        }
    }
}

/// TC-RK-08 / TC-LLC concurrency (§3.5.5.3): both sides add RMBs at once — concurrent
/// CONFIRM RKEY exchanges are not a collision; same for DELETE RKEY crossing (what Linux
/// does at every close, k612-pair frames 2331/2332).
#[test]
fn tc_rk_08_concurrent_rkey_both_sides() {
    for (name, cfg) in all_pairs() {
        let mut sim = links(2, cfg);
        let a = sim.add_rmb(SERVER);
        let b = sim.add_rmb(CLIENT);
        settle(&mut sim);
        assert_eq!(sim.labels().len(), 4, "{name}");
        assert!(sim.hosts[SERVER].saw(|e| *e == Event::RmbConfirmed(a)));
        assert!(sim.hosts[CLIENT].saw(|e| *e == Event::RmbConfirmed(b)));
        sim.check_consistent().unwrap();
        sim.delete_rmb(SERVER, a);
        sim.delete_rmb(CLIENT, b);
        settle(&mut sim);
        assert!(sim.hosts[SERVER].saw(|e| *e == Event::RmbDeleted(a)));
        assert!(sim.hosts[CLIENT].saw(|e| *e == Event::RmbDeleted(b)));
        sim.check_consistent().unwrap();
    }
}

/// TC-RK-09 / TC-RK-13 (DR-3): RmbDeleted only once the response arrived.
#[test]
fn tc_rk_09_delete_rkey_free_after_rsp() {
    let mut sim = links(2, v2_pair());
    let r = sim.add_rmb(CLIENT);
    settle(&mut sim);
    sim.delete_rmb(CLIENT, r);
    assert!(!sim.hosts[CLIENT].saw(|e| *e == Event::RmbDeleted(r)));
    let req = sim.sent(CLIENT, LlcType::DeleteRkey);
    assert_eq!(req[0].bytes.len(), 44, "Linux's 44-byte DELETE RKEY v2");
    settle(&mut sim);
    assert!(sim.hosts[CLIENT].saw(|e| *e == Event::RmbDeleted(r)));
    // Linux answers with the keys zeroed (k612-pair frame 42).
    let rsp = sim.sent(SERVER, LlcType::DeleteRkey);
    let LlcMessage::DeleteRkeyV2(d) = rsp[0].msg.as_wire() else {
        panic!()
    };
    assert!(d.response && !d.negative && d.rkeys.iter().eq([0]));
    sim.check_consistent().unwrap();
}

/// TC-RK-10 / TC-RK-11: 8 RKeys, the 2nd and 4th unknown → Z and mask 0x50; the sender
/// only logs (the RMBs are freed, no link action).
#[test]
fn tc_rk_10_11_delete_rkey_mask() {
    let mut s = Solo::client_up(LlcConfig::rfc(Role::Client));
    let mut keys = [0u32; 8];
    for (i, k) in keys.iter_mut().enumerate() {
        *k = 0x300 + i as u32;
        if i != 1 && i != 3 {
            s.lg.learn_peer_rmb(LinkId::FIRST, RToken { rkey: *k, vaddr: 0 });
        }
    }
    let d = DeleteRkey {
        response: false,
        negative: false,
        count: 8,
        err_mask: 0,
        rkeys: keys,
    };
    s.rx(LinkId::FIRST, &LlcMessage::DeleteRkey(d));
    let LlcMessage::DeleteRkey(r) = s.last().as_wire() else {
        panic!()
    };
    assert!(r.response && r.negative);
    assert_eq!(r.err_mask, 0b0101_0000);
    assert_eq!(r.rkeys, keys);

    // Our DELETE RKEY gets a negative answer: logged, RMB freed, links untouched.
    let mut s = Solo::client_up(LlcConfig::rfc(Role::Client));
    s.lg.delete_rmb(s.now, RmbId(1)).unwrap();
    s.drain();
    let LlcMessage::DeleteRkey(mut q) = s.last().as_wire() else {
        panic!()
    };
    q.response = true;
    q.negative = true;
    q.err_mask = 0x80;
    s.rx(LinkId::FIRST, &LlcMessage::DeleteRkey(q));
    assert!(s.saw(|e| *e == Event::RmbDeleted(RmbId(1))));
    assert!(!s.saw(|e| matches!(e, Event::LinkDown { .. })));
}

/// TC-RK-12 (AMB-52): count 0 or 9 → protocol error, the link goes down.
#[test]
fn tc_rk_12_delete_rkey_bad_count() {
    for count in [0u8, 9] {
        let mut s = Solo::client_up(LlcConfig::rfc(Role::Client));
        let mut b = [0u8; 44];
        b[0] = 0x09;
        b[1] = 44;
        b[4] = count;
        s.rx_bytes(LinkId::FIRST, &b);
        assert!(s.lg.is_terminated(), "the only link went down");
        assert!(s.saw(|e| matches!(
            e,
            Event::LinkDown {
                reason: LinkDownReason::ProtocolViolation(_),
                ..
            }
        )));
    }
}

/// TC-RK-14..17: the ADD LINK CONTINUATION algorithm for S server and K client RMBs:
/// `max(⌈S/2⌉, ⌈K/2⌉, 1)` round trips with the counts of B.13.3.
#[test]
fn tc_rk_14_17_cont_algorithm() {
    let cases: [(u32, u32, &[u8], &[u8]); 4] = [
        (1, 1, &[1], &[1]),
        (3, 4, &[3, 1], &[4, 2]),
        (5, 1, &[5, 3, 1], &[1, 0, 0]),
        (1, 5, &[1, 0, 0], &[5, 3, 1]),
    ];
    for (srmbs, crmbs, sreq, crsp) in cases {
        let mut cfg = rfc_pair();
        cfg.server.max_links = 2;
        cfg.client.max_links = 2;
        cfg.server_devices = 1;
        cfg.client_devices = 1;
        let mut sim = Sim::new(cfg, 40);
        settle(&mut sim);
        for _ in 1..srmbs {
            sim.add_rmb(SERVER);
        }
        for _ in 1..crmbs {
            sim.add_rmb(CLIENT);
        }
        settle(&mut sim);
        sim.trace.clear();
        let d = device(SERVER, 2);
        sim.hosts[SERVER].devices.push(d);
        sim.with(SERVER, |h, now| h.lg.add_device(now, d));
        settle(&mut sim);
        let counts = |from: usize| -> Vec<u8> {
            sim.trace
                .iter()
                .filter(|w| w.from == from)
                .filter_map(|w| match w.msg.as_wire() {
                    LlcMessage::AddLinkCont(c) => Some(c.num_rkeys),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(counts(SERVER), sreq, "S={srmbs} K={crmbs}");
        assert_eq!(counts(CLIENT), crsp, "S={srmbs} K={crmbs}");
        sim.check_consistent().unwrap();
    }
}

/// The server side of ADD LINK CONTINUATION against a crafted client, for the error rows.
fn server_in_cont(first_count: u8) -> (Solo, LinkId) {
    let mut cfg = LlcConfig::rfc(Role::Server);
    cfg.max_links = 2;
    let mut s = Solo::server_up(cfg, 2);
    let new = s.link_by_num(2).unwrap();
    let mut rsp = server_add_link(false, &device(CLIENT, 2), 2, 0x40);
    rsp.response = true;
    s.rx(LinkId::FIRST, &LlcMessage::AddLink(rsp));
    let LlcMessage::AddLinkCont(c) = s.last().as_wire() else {
        panic!()
    };
    assert_eq!((c.link_num, c.num_rkeys), (2, 1));
    let _ = first_count;
    (s, new)
}

fn cont(link_num: u8, num: u8, keys: &[u32]) -> AddLinkCont {
    let mut rtokens = [AddLinkRtoken::default(); 2];
    for (i, k) in keys.iter().enumerate() {
        rtokens[i] = AddLinkRtoken {
            rmb_key: *k,
            rmb_key_new: k + 1,
            rmb_vaddr_new: 0x10,
        };
    }
    AddLinkCont {
        response: true,
        link_num,
        num_rkeys: num,
        rtokens,
    }
}

/// TC-RK-18 / TC-RK-19 / TC-RK-20 (ALC-A6, C.7.1): a count that does not count down, an
/// unknown reference RKey, a wrong link number: protocol error, the carrying link fails.
#[test]
fn tc_rk_18_20_cont_errors() {
    // The client claims 4 RMBs, then jumps to 1.
    let (mut s, new) = server_in_cont(1);
    s.lg.learn_peer_rmb(
        LinkId::FIRST,
        RToken {
            rkey: 0x201,
            vaddr: 0,
        },
    );
    s.rx(
        LinkId::FIRST,
        &LlcMessage::AddLinkCont(cont(2, 4, &[0x200, 0x201])),
    );
    assert!(matches!(s.last().as_wire(), LlcMessage::AddLinkCont(c) if c.num_rkeys == 0));
    s.rx(
        LinkId::FIRST,
        &LlcMessage::AddLinkCont(cont(2, 1, &[0x200])),
    );
    assert!(s.lg.is_terminated(), "18: count mismatch takes link 1 down");
    assert!(s.destroyed.contains(&new));

    let (mut s, _) = server_in_cont(1);
    s.rx(
        LinkId::FIRST,
        &LlcMessage::AddLinkCont(cont(2, 1, &[0x7777])),
    );
    assert!(
        s.saw(|e| matches!(
            e,
            Event::LinkDown {
                reason: LinkDownReason::ProtocolViolation(_),
                ..
            }
        )),
        "19: unknown reference RKey"
    );

    let (mut s, _) = server_in_cont(1);
    s.rx(
        LinkId::FIRST,
        &LlcMessage::AddLinkCont(cont(5, 1, &[0x200])),
    );
    assert!(s.lg.is_terminated(), "20: wrong link number");
}

/// TC-RK-22 (AMB-30): a CONFIRM RKEY is accepted on any link.
#[test]
fn tc_rk_22_confirm_rkey_any_link() {
    let mut sim = links(2, rfc_pair());
    let c = ConfirmRkey {
        num_tokens: 1,
        rkey: 0x555,
        vaddr: 0x5000,
        others: [
            OtherLinkRkey {
                link_num: 1,
                rkey: 0x556,
                vaddr: 0x5001,
            },
            OtherLinkRkey::default(),
        ],
        ..Default::default()
    };
    sim.inject(SERVER, LinkId(1), &LlcMessage::ConfirmRkey(c));
    let lg = &sim.hosts[SERVER].lg;
    let p = lg.peer_rmb_by_rkey(LinkId(1), 0x555).unwrap();
    assert_eq!(
        lg.peer_token(p, LinkId::FIRST),
        Some(RToken {
            rkey: 0x556,
            vaddr: 0x5001
        })
    );
    assert_eq!(sim.trace[0].link, LinkId(1), "answered on the same link");
}

/// B.16 / TC-RK-23: the peer's CONFIRM RKEY with CONTINUATIONs (v1, > 3 links) is
/// assembled across messages, each echoed.
#[test]
fn b16_confirm_rkey_cont_received() {
    let mut sim = links(5, rfc_pair());
    let r = sim.add_rmb(CLIENT);
    settle(&mut sim);
    assert_eq!(
        sim.labels(),
        [
            "C: CONFIRM RKEY",
            "S: CONFIRM RKEY rsp",
            "C: CONFIRM RKEY CONT",
            "S: CONFIRM RKEY CONT rsp"
        ]
    );
    assert!(sim.hosts[CLIENT].saw(|e| *e == Event::RmbConfirmed(r)));
    sim.check_consistent().unwrap();
}

/// INV-14: a peer cannot make us track more than 255 of its RMBs.
#[test]
fn peer_rmbs_capped_at_255() {
    let mut s = Solo::client_up(LlcConfig::linux(Role::Client, Version::V2));
    for i in 0..300u32 {
        let c = ConfirmRkey {
            v2: true,
            rkey: 0x1000 + i,
            vaddr: u64::from(i),
            ..Default::default()
        };
        s.rx(LinkId::FIRST, &LlcMessage::ConfirmRkey(c));
        let LlcMessage::ConfirmRkey(r) = s.last().as_wire() else {
            panic!()
        };
        // The CLC-learned RMB is the first of the 255.
        assert_eq!(r.negative, i >= 254, "{i}");
    }
    assert_eq!(s.lg.peer_rmbs().count(), 255);
}
