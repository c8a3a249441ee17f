//! First contact and the second link (CHECKLIST §E.3 FC, §E.4 SL, B.3–B.5).

use super::*;

/// A first contact that went well, in order.
const FIRST_OK: [Event; 4] = [
    Event::ConfirmLinkSent,
    Event::FirstLinkUp,
    Event::PointOfNoReturn,
    Event::FirstContactDone,
];

/// TC-FC-01 / TC-SL-03 / TC-SL-16: the whole first-contact ladder with one device each: the
/// server still attempts an (asymmetric) second link on its only device and the client
/// rejects it "no alternate path"; both say FirstLinkUp then FirstContactDone.
#[test]
fn tc_fc_01_happy_path_single_devices() {
    for (name, cfg) in all_pairs() {
        let mut sim = Sim::new(cfg, 1);
        settle(&mut sim);
        assert_eq!(
            sim.labels(),
            [
                "S: CONFIRM LINK",
                "C: CONFIRM LINK rsp",
                "S: ADD LINK",
                "C: ADD LINK rsp"
            ],
            "{name}"
        );
        for h in [SERVER, CLIENT] {
            assert_eq!(main_events(&sim, h), FIRST_OK, "{name} host {h}");
        }
        let add = sim.sent(SERVER, LlcType::AddLink)[0].msg.as_wire();
        let rsp = sim.sent(CLIENT, LlcType::AddLink)[0].msg.as_wire();
        let (LlcMessage::AddLink(add), LlcMessage::AddLink(rsp)) = (add, rsp) else {
            panic!()
        };
        // SL-S1: the same RNIC as link 1; SL-C2: rejected, reason 1 (v1) or Linux's echo (v2).
        assert_eq!(add.gid, device(SERVER, 1).gid, "{name}");
        assert!(rsp.reject && rsp.response, "{name}");
        if add.v2 {
            assert_eq!(rsp.reject_reason, 0);
            assert_eq!(sim.sent(CLIENT, LlcType::AddLink)[0].bytes.len(), 44);
            let a = &sim.sent(SERVER, LlcType::AddLink)[0].bytes;
            let r = &sim.sent(CLIENT, LlcType::AddLink)[0].bytes;
            assert_eq!(r[3], 0xC0);
            assert_eq!(&r[4..44], &a[4..44], "the reject echoes the request");
        } else {
            assert_eq!(rsp.reject_reason, ADD_LINK_RSN_NO_ALT_PATH, "{name}");
        }
        sim.check_consistent().unwrap();
        assert_eq!(sim.hosts[SERVER].lg.links().count(), 1);
    }
}

/// TC-FC-10: CONFIRM LINK flows on the new QP with the values CLC announced; the link
/// numbers are echoed and both link user IDs exchanged; Linux's flag 0x03 and max_conns.
#[test]
fn tc_fc_10_confirm_link_contents() {
    for (name, cfg) in all_pairs() {
        let mut sim = Sim::new(cfg, 2);
        settle(&mut sim);
        let req = &sim.sent(SERVER, LlcType::ConfirmLink)[0];
        let rsp = &sim.sent(CLIENT, LlcType::ConfirmLink)[0];
        let (LlcMessage::ConfirmLink(q), LlcMessage::ConfirmLink(r)) =
            (req.msg.as_wire(), rsp.msg.as_wire())
        else {
            panic!()
        };
        assert_eq!((req.link, rsp.link), (LinkId::FIRST, LinkId::FIRST));
        assert_eq!(
            (q.gid, q.mac),
            (device(SERVER, 1).gid, device(SERVER, 1).mac)
        );
        assert_eq!(
            (r.gid, r.mac),
            (device(CLIENT, 1).gid, device(CLIENT, 1).mac)
        );
        assert_eq!((q.qpn.get(), r.qpn.get()), (0x11, 0x11));
        assert_eq!((q.link_num, r.link_num), (1, 1), "{name}");
        assert_eq!((q.link_uid, r.link_uid), (0x101, 0x101));
        let s = sim.hosts[SERVER].lg.link(LinkId::FIRST).unwrap();
        let c = sim.hosts[CLIENT].lg.link(LinkId::FIRST).unwrap();
        assert_eq!((s.peer_uid, c.peer_uid), (0x101, 0x101));
        let linux = name != "rfc";
        assert_eq!(q.no_rmbe_eyecatcher, linux, "{name}");
        assert_eq!(req.bytes[3] & 0x03 == 0x03, linux, "{name}");
        if name == "linux-v2" {
            assert_eq!((q.max_links, q.max_conns, r.max_conns), (2, 255, 255));
        }
        assert_eq!(req.bytes.len(), 44);
    }
}

/// TC-FC-11: a CONFIRM LINK naming another QP is a protocol error; on first contact the
/// client declines (C.7.1).
#[test]
fn tc_fc_11_confirm_link_wrong_qpn() {
    let mut s = Solo::new(LlcConfig::rfc(Role::Client), 1);
    let mut m = s.peer_confirm_link(false, 1);
    m.qpn = U24::new(0x99).unwrap();
    s.rx(LinkId::FIRST, &LlcMessage::ConfirmLink(m));
    assert_eq!(
        s.events,
        [
            Event::FirstLinkFailed(FirstLinkFailure {
                kind: FirstLinkFailureKind::InvalidMessage,
                code: smc_wire::decline::DeclineCode::CNFERR,
                may_decline: true
            }),
            Event::Terminated(TerminateReason::FirstContact(
                smc_wire::decline::DeclineCode::CNFERR
            ))
        ]
    );
    assert!(s.sent.is_empty(), "no response");
    assert_eq!(s.destroyed, [LinkId::FIRST]);
    // A Linux peer insists on the eye-catcher flag.
    let mut s = Solo::new(LlcConfig::linux(Role::Client, Version::V2), 1);
    let mut m = s.peer_confirm_link(false, 1);
    m.no_rmbe_eyecatcher = false;
    s.rx(LinkId::FIRST, &LlcMessage::ConfirmLink(m));
    assert!(s.saw(|e| matches!(e, Event::FirstLinkFailed(f)
        if f.code == smc_wire::decline::DeclineCode::RMBE_EC)));
}

/// TC-FC-13: no CONFIRM LINK and no Decline: the client resets at its timer (4 s like
/// Linux), no Decline.
#[test]
fn tc_fc_13_client_confirm_timer_expiry() {
    let mut sim = Sim::with_intercept(
        rfc_pair(),
        1,
        Some(Box::new(|w: &Wire| {
            if is(w, SERVER, LlcType::ConfirmLink, false) {
                Verdict::Swallow
            } else {
                Verdict::Deliver
            }
        })),
    );
    sim.run_for(Duration::from_millis(3990));
    assert!(sim.hosts[CLIENT].events.is_empty());
    sim.run_for(Duration::from_millis(20));
    assert_eq!(
        sim.hosts[CLIENT].events[0],
        Event::FirstLinkFailed(FirstLinkFailure {
            kind: FirstLinkFailureKind::Timeout,
            code: smc_wire::decline::DeclineCode::TIMEOUT_CL,
            may_decline: false
        })
    );
    assert!(sim.hosts[CLIENT].lg.is_terminated());
}

/// TC-FC-14: a send error on the server's CONFIRM LINK → Decline (C.7).
#[test]
fn tc_fc_14_server_confirm_link_send_error() {
    let mut sim = Sim::new(rfc_pair(), 1);
    // The first message has been posted at creation; break the QP so it fails.
    sim.break_link(SERVER, LinkId::FIRST);
    sim.run_for(Duration::from_millis(500));
    assert_eq!(
        sim.hosts[SERVER].events[0],
        Event::FirstLinkFailed(FirstLinkFailure {
            kind: FirstLinkFailureKind::SendFailed,
            code: smc_wire::decline::DeclineCode::TIMEOUT_CL,
            may_decline: true
        })
    );
}

/// TC-FC-15: a send error on the client's CONFIRM LINK response → Decline (Fig 42), and
/// never FirstLinkUp.
#[test]
fn tc_fc_15_client_confirm_link_rsp_send_error() {
    let mut sim = Sim::new(rfc_pair(), 1);
    fail(&mut sim, |w| is(w, CLIENT, LlcType::ConfirmLink, true));
    sim.run_for(Duration::from_secs(1));
    let ev = &sim.hosts[CLIENT].events;
    assert!(
        matches!(ev[0], Event::FirstLinkFailed(f) if f.may_decline),
        "{ev:?}"
    );
    assert!(!ev.contains(&Event::FirstLinkUp));
}

/// TC-FC-16: the client's response never arrives: the server resets after 2 s.
#[test]
fn tc_fc_16_server_confirm_link_rsp_timeout() {
    let mut sim = Sim::new(rfc_pair(), 1);
    swallow(&mut sim, |w| is(w, CLIENT, LlcType::ConfirmLink, true));
    sim.run_for(Duration::from_millis(1990));
    assert_eq!(sim.hosts[SERVER].events, [Event::ConfirmLinkSent]);
    sim.run_for(Duration::from_millis(20));
    assert_eq!(
        sim.hosts[SERVER].events[1],
        Event::FirstLinkFailed(FirstLinkFailure {
            kind: FirstLinkFailureKind::Timeout,
            code: smc_wire::decline::DeclineCode::TIMEOUT_CL,
            may_decline: false
        })
    );
}

/// TC-FC-17: connection data waits for the second-link attempt: FirstContactDone comes
/// only after the ADD LINK exchange (and its CONFIRM LINK) is over.
#[test]
fn tc_fc_17_no_data_before_second_link_attempt() {
    let mut cfg = rfc_pair();
    cfg.server_devices = 2;
    cfg.client_devices = 2;
    let mut sim = Sim::new(cfg, 3);
    settle(&mut sim);
    for h in [SERVER, CLIENT] {
        assert_eq!(
            main_events(&sim, h),
            [
                Event::ConfirmLinkSent,
                Event::FirstLinkUp,
                Event::PointOfNoReturn,
                Event::LinkUp(LinkId(1)),
                Event::FirstContactDone
            ],
            "host {h}"
        );
    }
}

/// TC-FC-18: max links: server 8 / client none (0) → 8; 4/2 → 2; 3/5 and a v1 server's 1
/// are protocol errors.
#[test]
fn tc_fc_18_maxlinks_negotiation() {
    let mut cfg = LlcConfig::rfc(Role::Server);
    cfg.max_links = 8;
    let mut s = Solo::new(cfg.clone(), 1);
    let mut r = s.peer_confirm_link(true, 1);
    r.max_links = 0;
    s.rx(LinkId::FIRST, &LlcMessage::ConfirmLink(r));
    assert_eq!(s.lg.max_links(), 8);
    assert_eq!(s.events[..2], [Event::ConfirmLinkSent, Event::FirstLinkUp]);

    cfg.max_links = 4;
    let mut s = Solo::new(cfg.clone(), 1);
    r.max_links = 2;
    s.rx(LinkId::FIRST, &LlcMessage::ConfirmLink(r));
    assert_eq!(s.lg.max_links(), 2);

    cfg.max_links = 3;
    let mut s = Solo::new(cfg.clone(), 1);
    r.max_links = 5;
    s.rx(LinkId::FIRST, &LlcMessage::ConfirmLink(r));
    assert!(s.saw(|e| matches!(e, Event::FirstLinkFailed(f)
        if f.code == smc_wire::decline::DeclineCode::MAXLINKERR)));

    // The client answers with the smaller value and refuses a v1 server's 1.
    let mut c = LlcConfig::rfc(Role::Client);
    c.max_links = 2;
    let mut s = Solo::new(c.clone(), 1);
    let mut q = s.peer_confirm_link(false, 1);
    q.max_links = 8;
    s.rx(LinkId::FIRST, &LlcMessage::ConfirmLink(q));
    let last_msg = s.last();
    let LlcMessage::ConfirmLink(rsp) = last_msg.as_wire() else {
        panic!()
    };
    assert_eq!(rsp.max_links, 2);
    let mut s = Solo::new(c, 1);
    q.max_links = 1;
    s.rx(LinkId::FIRST, &LlcMessage::ConfirmLink(q));
    assert!(s.saw(|e| matches!(e, Event::FirstLinkFailed(_))));

    // v2.1 may negotiate 1: no second link, done at once, no ADD LINK wait.
    let mut c = LlcConfig::linux(Role::Client, Version::V2);
    c.max_links = 1;
    let mut s = Solo::new(c, 1);
    let q = s.peer_confirm_link(false, 1);
    s.rx(LinkId::FIRST, &LlcMessage::ConfirmLink(q));
    assert_eq!(s.events, FIRST_OK);
}

/// TC-FC-23: after its CONFIRM LINK response the client waits for the server's ADD LINK;
/// none in time → reset (RFC C.7.1), or carry on with one link (Linux, linux-smc.md H4).
#[test]
fn tc_fc_23_client_waits_add_link_timeout() {
    let mut s = Solo::client_up(LlcConfig::rfc(Role::Client));
    assert_eq!(s.events, [Event::ConfirmLinkSent, Event::FirstLinkUp]);
    s.advance(Duration::from_millis(1990));
    assert_eq!(s.events, [Event::ConfirmLinkSent, Event::FirstLinkUp]);
    s.advance(Duration::from_millis(20));
    assert_eq!(
        s.events[2],
        Event::Terminated(TerminateReason::FirstContact(
            smc_wire::decline::DeclineCode::TIMEOUT_AL
        ))
    );
    let mut s = Solo::client_up(LlcConfig::linux(Role::Client, Version::V2));
    s.advance(Duration::from_millis(2010));
    assert_eq!(s.events, FIRST_OK);
    assert!(!s.lg.is_terminated());
}

/// TC-SL-01 / TC-SL-14 / TC-RK-14: two RNICs on each side: symmetric second link with ADD
/// LINK, one CONTINUATION pair on link 1, CONFIRM LINK on link 2 (Fig 9).
#[test]
fn tc_sl_01_symmetric_second_link_fig9() {
    let mut cfg = rfc_pair();
    cfg.server_devices = 2;
    cfg.client_devices = 2;
    let mut sim = Sim::new(cfg, 4);
    settle(&mut sim);
    assert_eq!(
        sim.labels(),
        [
            "S: CONFIRM LINK",
            "C: CONFIRM LINK rsp",
            "S: ADD LINK",
            "C: ADD LINK rsp",
            "S: ADD LINK CONT",
            "C: ADD LINK CONT rsp",
            "S: CONFIRM LINK",
            "C: CONFIRM LINK rsp"
        ]
    );
    // CONT on the carrying link, CONFIRM LINK on the new one; S = K = 1.
    for w in &sim.trace[2..6] {
        assert_eq!(w.link_num, 1);
    }
    for w in &sim.trace[6..] {
        assert_eq!(w.link_num, 2);
    }
    for w in &sim.trace[4..6] {
        let LlcMessage::AddLinkCont(c) = w.msg.as_wire() else {
            panic!()
        };
        assert_eq!((c.link_num, c.num_rkeys), (2, 1));
    }
    sim.check_consistent().unwrap();
    for h in [SERVER, CLIENT] {
        let l = sim.hosts[h].lg.link(LinkId(1)).unwrap();
        assert!(!l.asymmetric);
        assert_eq!(l.device, DeviceId(2));
    }
}

/// TC-SL-02 / TC-SL-04: one side has a single RNIC: the link is added asymmetrically.
#[test]
fn tc_sl_02_asymmetric_links() {
    for (sd, cd) in [(1, 2), (2, 1)] {
        for (name, mut cfg) in all_pairs() {
            cfg.server_devices = sd;
            cfg.client_devices = cd;
            let mut sim = Sim::new(cfg, 5);
            settle(&mut sim);
            sim.check_consistent().unwrap();
            for h in [SERVER, CLIENT] {
                let l = sim.hosts[h].lg.link(LinkId(1));
                assert!(l.is_some_and(|l| l.asymmetric), "{name} {sd}/{cd} host {h}");
            }
        }
    }
}

/// TC-SL-05: a reserved MTU in ADD LINK → negative reply with reason 2.
#[test]
fn tc_sl_05_add_link_bad_mtu() {
    let mut s = Solo::client_up(LlcConfig::rfc(Role::Client));
    let mut m = server_add_link(false, &device(SERVER, 2), 2, 0x30);
    m.qp_mtu = 7;
    s.rx(LinkId::FIRST, &LlcMessage::AddLink(m));
    let last_msg = s.last();
    let LlcMessage::AddLink(r) = last_msg.as_wire() else {
        panic!()
    };
    assert!(r.response && r.reject);
    assert_eq!(r.reject_reason, ADD_LINK_RSN_INVALID_MTU);
    assert!(s.created.is_empty());
    assert_eq!(s.events, FIRST_OK);
}

/// TC-SL-06: a client answer that would make a parallel link (the same RNIC on both sides
/// as link 1) → DELETE LINK for it over another link (C.7.1).
#[test]
fn tc_sl_06_add_link_rsp_parallel() {
    // One server device: the asymmetric attempt reuses it; the crafted answer names the
    // client RNIC of link 1.
    let mut s = Solo::server_up(LlcConfig::rfc(Role::Server), 1);
    let last_msg = s.last();
    let LlcMessage::AddLink(req) = last_msg.as_wire() else {
        panic!()
    };
    assert_eq!(req.gid, device(SERVER, 1).gid);
    let mut par = server_add_link(false, &device(CLIENT, 1), req.link_num, 0x42);
    par.response = true;
    s.take();
    s.rx(LinkId::FIRST, &LlcMessage::AddLink(par));
    let sent = s.take();
    assert!(
        sent.iter().any(|(l, m)| *l == LinkId::FIRST
            && matches!(m.as_wire(), LlcMessage::DeleteLink(d)
                if d.link_num == req.link_num && !d.all && !d.response)),
        "{sent:?}"
    );
    assert!(!sent
        .iter()
        .any(|(_, m)| m.msg_type() == LlcType::AddLinkCont));
    // The client's answer ends it; the link is gone on our side.
    let new = s.link_by_num(req.link_num).unwrap();
    let rsp = DeleteLink {
        v2: false,
        response: true,
        all: false,
        orderly: false,
        link_num: req.link_num,
        reason: DeleteLinkReason(0),
    };
    s.rx(LinkId::FIRST, &LlcMessage::DeleteLink(rsp));
    assert!(s.destroyed.contains(&new));
    assert_eq!(s.lg.links().count(), 1);
    assert!(s.saw(|e| *e == Event::FirstContactDone));
}

/// TC-SL-07: the CONFIRM LINK on link 2 gets no answer: DELETE LINK over link 1, and the
/// connection data waits until it is answered.
#[test]
fn tc_sl_07_second_confirm_link_fails() {
    let mut cfg = rfc_pair();
    cfg.server_devices = 2;
    cfg.client_devices = 2;
    let mut sim = Sim::new(cfg, 6);
    swallow(&mut sim, |w| {
        is(w, CLIENT, LlcType::ConfirmLink, true) && w.link_num == 2
    });
    sim.run_for(Duration::from_secs(4));
    assert!(!sim.hosts[SERVER].saw(|e| *e == Event::FirstContactDone));
    sim.run_for(Duration::from_secs(2));
    let del = sim.sent(SERVER, LlcType::DeleteLink);
    assert_eq!(del.len(), 1, "{}", sim.dump());
    assert_eq!(del[0].link_num, 1);
    let LlcMessage::DeleteLink(d) = del[0].msg.as_wire() else {
        panic!()
    };
    assert_eq!((d.link_num, d.all), (2, false));
    settle(&mut sim);
    // The client had confirmed link 2; the server's DELETE LINK removes it there too.
    let ev = main_events(&sim, SERVER);
    assert_eq!(ev, FIRST_OK);
    sim.check_consistent().unwrap();
    assert_eq!(sim.hosts[SERVER].lg.links().count(), 1);
}

/// TC-SL-08 (AMB-20): no ADD LINK reply on first contact: RFC C.7.1 resets; Linux carries
/// on with one link.
#[test]
fn tc_sl_08_add_link_reply_timeout_first_contact() {
    let mut sim = Sim::new(rfc_pair(), 7);
    swallow(&mut sim, |w| is(w, CLIENT, LlcType::AddLink, true));
    sim.run_for(Duration::from_secs(3));
    assert_eq!(
        sim.hosts[SERVER].terminated,
        Some(TerminateReason::FirstContact(
            smc_wire::decline::DeclineCode::TIMEOUT_AL
        ))
    );
    assert!(sim.hosts[SERVER].saw(|e| *e == Event::FirstLinkUp));
    let mut sim = Sim::new(v2_pair(), 7);
    swallow(&mut sim, |w| is(w, CLIENT, LlcType::AddLink, true));
    sim.run_for(Duration::from_secs(3));
    assert!(sim.hosts[SERVER].terminated.is_none());
    assert!(sim.hosts[SERVER].saw(|e| *e == Event::FirstContactDone));
}

/// TC-SL-09: the client gets no CONFIRM LINK on the new link: it asks the server to delete
/// it, and first contact completes only after the server's DELETE LINK and our reply.
#[test]
fn tc_sl_09_client_no_confirm_link_on_new_link() {
    let mut s = Solo::client_up(LlcConfig::rfc(Role::Client));
    s.lg.add_device(s.now, device(CLIENT, 2));
    s.drain();
    let m = server_add_link(false, &device(SERVER, 2), 2, 0x30);
    s.rx(LinkId::FIRST, &LlcMessage::AddLink(m));
    let last_msg = s.last();
    let LlcMessage::AddLink(rsp) = last_msg.as_wire() else {
        panic!()
    };
    assert!(!rsp.reject);
    let cont = AddLinkCont {
        response: false,
        link_num: 2,
        num_rkeys: 1,
        rtokens: [
            AddLinkRtoken {
                rmb_key: 0x200,
                rmb_key_new: 0x201,
                rmb_vaddr_new: 0x1,
            },
            AddLinkRtoken::default(),
        ],
    };
    s.rx(LinkId::FIRST, &LlcMessage::AddLinkCont(cont));
    s.take();
    s.advance(Duration::from_secs(5) + Duration::from_millis(10));
    let last_msg = s.last();
    let LlcMessage::DeleteLink(d) = last_msg.as_wire() else {
        panic!("{:?}", s.sent)
    };
    assert_eq!((d.link_num, d.all, d.response), (2, false, false));
    assert!(!s.saw(|e| *e == Event::FirstContactDone));
    let srv = DeleteLink {
        v2: false,
        response: false,
        all: false,
        orderly: false,
        link_num: 2,
        reason: DeleteLinkReason::LOST_PATH,
    };
    s.rx(LinkId::FIRST, &LlcMessage::DeleteLink(srv));
    let last_msg = s.last();
    let LlcMessage::DeleteLink(r) = last_msg.as_wire() else {
        panic!()
    };
    assert!(r.response && r.link_num == 2);
    assert!(s.saw(|e| *e == Event::FirstContactDone));
    assert_eq!(s.lg.links().count(), 1);
}

/// TC-SL-11 / TC-SL-10: after the reject (or the ADD LINK going out) nothing declines any
/// more: failures are resets (`Terminated`), never `FirstLinkFailed`.
#[test]
fn tc_sl_11_no_decline_after_add_link_milestones() {
    let mut sim = Sim::new(v2_pair(), 8);
    settle(&mut sim);
    sim.break_link(SERVER, LinkId::FIRST);
    sim.run_for(Duration::from_secs(120));
    for h in [SERVER, CLIENT] {
        assert!(!sim.hosts[h].saw(|e| matches!(e, Event::FirstLinkFailed(_))));
        assert!(
            sim.hosts[h].lg.is_terminated(),
            "keepalive found the dead link"
        );
    }
}

/// TC-SL-12 (C.8): after a failed attempt the server retries (a) when its timer expires,
/// (b) at once on a new server RNIC, (c) at once on a client ADD LINK request.
#[test]
fn tc_sl_12_c8_retry_triggers() {
    let mut cfg = rfc_pair();
    cfg.server.timers.add_link_retry = Some(Duration::from_secs(60));
    let mut sim = Sim::new(cfg.clone(), 9);
    settle(&mut sim);
    let adds = |sim: &Sim| sim.sent(SERVER, LlcType::AddLink).len();
    assert_eq!(adds(&sim), 1);
    sim.run_for(Duration::from_secs(59));
    assert_eq!(adds(&sim), 1);
    sim.run_for(Duration::from_secs(2));
    assert_eq!(adds(&sim), 2, "(a) the retry timer");

    let mut sim = Sim::new(cfg.clone(), 9);
    settle(&mut sim);
    let d = device(SERVER, 2);
    sim.hosts[SERVER].devices.push(d);
    sim.with(SERVER, |h, now| h.lg.add_device(now, d));
    settle(&mut sim);
    assert_eq!(adds(&sim), 2, "(b) a new server RNIC");
    sim.check_consistent().unwrap();
    assert_eq!(sim.hosts[SERVER].lg.links().count(), 2);

    let mut sim = Sim::new(cfg, 9);
    settle(&mut sim);
    let d = device(CLIENT, 2);
    sim.hosts[CLIENT].devices.push(d);
    sim.with(CLIENT, |h, now| h.lg.add_device(now, d));
    settle(&mut sim);
    let labels = sim.labels();
    assert_eq!(
        &labels[4..6],
        ["C: ADD LINK", "S: ADD LINK"],
        "(c) {labels:?}"
    );
    sim.check_consistent().unwrap();
    assert_eq!(sim.hosts[CLIENT].lg.links().count(), 2);
}

/// TC-SL-13 / TC-RK-21: an RMB has a different RToken on each link, and both sides map
/// them to the same RMB.
#[test]
fn tc_sl_13_distinct_rtoken_per_link() {
    let mut cfg = v2_pair();
    cfg.server_devices = 2;
    cfg.client_devices = 2;
    let mut sim = Sim::new(cfg, 10);
    settle(&mut sim);
    let r = sim.add_rmb(SERVER);
    settle(&mut sim);
    let s = &sim.hosts[SERVER].lg;
    let c = &sim.hosts[CLIENT].lg;
    let t1 = s.local_token(r, LinkId::FIRST).unwrap();
    let t2 = s.local_token(r, LinkId(1)).unwrap();
    assert_ne!(t1, t2);
    let p = c.peer_rmb_by_rkey(LinkId::FIRST, t1.rkey).unwrap();
    assert_eq!(c.peer_rmb_by_rkey(LinkId(1), t2.rkey), Some(p));
    assert_eq!(c.peer_token(p, LinkId(1)), Some(t2));
    sim.check_consistent().unwrap();
}

/// C.2 / AMB-19: once our CONFIRM LINK went out, a first-link failure is a reset, not a
/// Decline; before, a send error is a Decline.
#[test]
fn tc_fc_21_no_decline_after_own_confirm_link() {
    let mut s = Solo::new(LlcConfig::rfc(Role::Server), 1);
    assert_eq!(s.events, [Event::ConfirmLinkSent]);
    s.lg.on_link_error(s.now, LinkId::FIRST);
    s.drain();
    assert_eq!(
        s.events[1],
        Event::FirstLinkFailed(FirstLinkFailure {
            kind: FirstLinkFailureKind::SendFailed,
            code: smc_wire::decline::DeclineCode::TIMEOUT_CL,
            may_decline: false
        })
    );
    let mut s2 = Solo::new(LlcConfig::rfc(Role::Client), 1);
    s2.fail_sends = true;
    let m = s2.peer_confirm_link(false, 1);
    s2.rx(LinkId::FIRST, &LlcMessage::ConfirmLink(m));
    assert!(matches!(s2.events[0], Event::FirstLinkFailed(f)
        if f.may_decline && f.kind == FirstLinkFailureKind::SendFailed));
}
