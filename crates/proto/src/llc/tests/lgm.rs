//! Link-group management: adding, deleting, ending (CHECKLIST §E.6 LGM, B.8–B.12, B.16).

use super::*;

fn two_by_two(cfg: SimConfig) -> SimConfig {
    SimConfig {
        server_devices: 2,
        client_devices: 2,
        ..cfg
    }
}

fn del(response: bool, all: bool, orderly: bool, num: u8, reason: DeleteLinkReason) -> DeleteLink {
    DeleteLink {
        v2: false,
        response,
        all,
        orderly,
        link_num: num,
        reason,
    }
}

/// TC-LGM-02 / TC-LGM-03: the server adds links while devices allow, up to max_links
/// symmetric ones, and never a second asymmetric one.
#[test]
fn tc_lgm_02_no_add_beyond_max() {
    let mut cfg = rfc_pair();
    cfg.server.max_links = 2;
    cfg.client.max_links = 2;
    cfg.server_devices = 3;
    cfg.client_devices = 3;
    let mut sim = Sim::new(cfg, 20);
    settle(&mut sim);
    assert_eq!(sim.sent(SERVER, LlcType::AddLink).len(), 1);
    assert_eq!(sim.hosts[SERVER].lg.links().count(), 2);
    sim.run_for(Duration::from_secs(120));
    assert_eq!(
        sim.sent(SERVER, LlcType::AddLink).len(),
        1,
        "no retry at the maximum"
    );

    // Max 4 with 3 devices: three symmetric links, then no asymmetric fourth.
    let mut cfg = rfc_pair();
    cfg.server_devices = 3;
    cfg.client_devices = 3;
    let mut sim = Sim::new(cfg, 21);
    settle(&mut sim);
    sim.check_consistent().unwrap();
    let links: Vec<LinkInfo> = sim.hosts[SERVER].lg.links().collect();
    assert_eq!(links.len(), 3);
    assert!(links.iter().all(|l| !l.asymmetric));
    assert_eq!(sim.sent(SERVER, LlcType::AddLink).len(), 2);
}

/// TC-LGM-04: the asymmetric link does not count towards max_links.
#[test]
fn tc_lgm_04_asymmetric_not_counted() {
    let mut cfg = rfc_pair();
    cfg.server.max_links = 2;
    cfg.client.max_links = 2;
    cfg.server_devices = 1;
    cfg.client_devices = 2;
    let mut sim = Sim::new(cfg, 22);
    settle(&mut sim);
    // Link 2 is asymmetric (the server's only RNIC); a new server RNIC still gets a
    // symmetric link, and then the asymmetric one goes (INV-9, TC-LGM-08).
    let d = device(SERVER, 2);
    sim.hosts[SERVER].devices.push(d);
    sim.with(SERVER, |h, now| h.lg.add_device(now, d));
    settle(&mut sim);
    sim.check_consistent().unwrap();
    let links: Vec<LinkInfo> = sim.hosts[SERVER].lg.links().collect();
    assert_eq!(links.len(), 2, "{links:?}");
    assert!(links.iter().all(|l| !l.asymmetric), "{links:?}");
}

/// TC-LGM-08 / INV-9: asymmetric → symmetric: add the symmetric link first, then DELETE
/// LINK the asymmetric one with reason 0x00050000.
#[test]
fn tc_lgm_08_asym_to_sym_transition() {
    for (name, mut cfg) in all_pairs() {
        cfg.server_devices = 1;
        cfg.client_devices = 2;
        let mut sim = Sim::new(cfg, 23);
        settle(&mut sim);
        assert!(
            sim.hosts[SERVER].lg.link(LinkId(1)).unwrap().asymmetric,
            "{name}"
        );
        let d = device(SERVER, 2);
        sim.hosts[SERVER].devices.push(d);
        sim.with(SERVER, |h, now| h.lg.add_device(now, d));
        settle(&mut sim);
        let dels = sim.sent(SERVER, LlcType::DeleteLink);
        assert_eq!(dels.len(), 1, "{name}: {:?}", sim.labels());
        let LlcMessage::DeleteLink(d) = dels[0].msg.as_wire() else {
            panic!()
        };
        assert_eq!(
            (d.link_num, d.reason, d.orderly),
            (2, DeleteLinkReason::NO_ASYM_NEEDED, true)
        );
        let ups = sim.hosts[SERVER]
            .events
            .iter()
            .position(|e| *e == Event::LinkUp(LinkId(2)))
            .unwrap();
        let down = sim.hosts[SERVER]
            .events
            .iter()
            .position(|e| {
                matches!(
                    e,
                    Event::LinkDown {
                        link: LinkId(1),
                        ..
                    }
                )
            })
            .unwrap();
        assert!(ups < down, "{name}: symmetric link first");
        sim.check_consistent().unwrap();
        assert_eq!(sim.hosts[CLIENT].lg.links().count(), 2);
    }
}

/// TC-LGM-05 / TC-LGM-07: a single-link group; the client gets a second RNIC and tells the
/// server (v1 ADD LINK, v2 REQUEST ADD LINK); the server adds a link. The client expects
/// no answer to the v1 notification.
#[test]
fn tc_lgm_05_client_add_link_no_redundancy() {
    for (name, cfg) in all_pairs() {
        let mut sim = Sim::new(cfg, 24);
        settle(&mut sim);
        let d = device(CLIENT, 2);
        sim.hosts[CLIENT].devices.push(d);
        sim.with(CLIENT, |h, now| h.lg.add_device(now, d));
        settle(&mut sim);
        let labels = sim.labels();
        let ask = if name == "linux-v2" {
            "C: REQ ADD LINK"
        } else {
            "C: ADD LINK"
        };
        assert_eq!(labels[4], ask, "{name}");
        assert_eq!(labels[5], "S: ADD LINK", "{name}");
        sim.check_consistent().unwrap();
        assert_eq!(sim.hosts[SERVER].lg.links().count(), 2, "{name}");
        assert!(sim.hosts[CLIENT].lg.is_quiet());
    }
}

/// TC-LGM-06: at the maximum the server ignores the client's ADD LINK; v2: it answers the
/// REQUEST ADD LINK with Linux's empty echo.
#[test]
fn tc_lgm_06_client_add_link_at_max_ignored() {
    let mut cfg = LlcConfig::rfc(Role::Server);
    cfg.max_links = 2;
    let mut s = Solo::server_up(cfg, 2);
    // Accept link 2 from the crafted client.
    let added = s.link_by_num(2).unwrap();
    let mut rsp = server_add_link(false, &device(CLIENT, 2), 2, 0x40);
    rsp.response = true;
    s.rx(LinkId::FIRST, &LlcMessage::AddLink(rsp));
    let cont = AddLinkCont {
        response: true,
        link_num: 2,
        num_rkeys: 1,
        rtokens: [
            AddLinkRtoken {
                rmb_key: 0x200,
                rmb_key_new: 0x201,
                rmb_vaddr_new: 1,
            },
            AddLinkRtoken::default(),
        ],
    };
    s.rx(LinkId::FIRST, &LlcMessage::AddLinkCont(cont));
    let mut c = s.peer_confirm_link(true, 2);
    c.gid = device(CLIENT, 2).gid;
    c.mac = device(CLIENT, 2).mac;
    c.qpn = U24::new(0x40).unwrap();
    s.rx(added, &LlcMessage::ConfirmLink(c));
    assert!(s.saw(|e| *e == Event::LinkUp(added)));
    s.take();
    let fyi = AddLink {
        link_num: 0,
        qp_mtu: 0,
        ..server_add_link(false, &device(CLIENT, 3), 0, 0)
    };
    s.rx(LinkId::FIRST, &LlcMessage::AddLink(fyi));
    assert!(s.sent.is_empty() && s.created.len() == 1, "ignored");

    let mut s = Solo::server_up(LlcConfig::linux(Role::Server, Version::V2), 1);
    // The asymmetric attempt is pending: reject it, then ask again with REQUEST ADD LINK.
    let rej = s.last();
    let LlcMessage::AddLink(mut r) = rej.as_wire() else {
        panic!()
    };
    r.response = true;
    r.reject = true;
    r.ext = None;
    s.rx(LinkId::FIRST, &LlcMessage::AddLink(r));
    s.take();
    let mut req = ReqAddLink::default();
    req.gids.push(device(CLIENT, 1).gid);
    s.rx(LinkId::FIRST, &LlcMessage::ReqAddLink(req));
    // One server device, one asymmetric attempt allowed: it tries again.
    assert!(matches!(s.last().as_wire(), LlcMessage::AddLink(a) if !a.response));
}

/// TC-LGM-09 / TC-LGM-10 / TC-LGM-23: the server deletes one link: LinkDown first, DELETE
/// LINK over the other link, the client always answers (on the same link), and the QP
/// goes only after the answer (SDL-4).
#[test]
fn tc_lgm_09_server_delete_link_single() {
    for (name, cfg) in all_pairs() {
        let mut sim = Sim::new(two_by_two(cfg), 25);
        settle(&mut sim);
        sim.with(SERVER, |h, now| {
            h.lg.delete_link(now, LinkId(1), true).unwrap()
        });
        assert!(
            sim.hosts[SERVER].lg.link(LinkId(1)).is_some(),
            "kept until the answer"
        );
        assert_eq!(
            sim.hosts[SERVER].lg.link(LinkId(1)).unwrap().state,
            LinkState::Deleting
        );
        settle(&mut sim);
        let req = sim.sent(SERVER, LlcType::DeleteLink);
        let rsp = sim.sent(CLIENT, LlcType::DeleteLink);
        assert_eq!((req.len(), rsp.len()), (1, 1), "{name}");
        assert_eq!(
            (req[0].link_num, rsp[0].link_num),
            (1, 1),
            "over link 1, answered there"
        );
        let LlcMessage::DeleteLink(r) = rsp[0].msg.as_wire() else {
            panic!()
        };
        assert!(r.response && r.link_num == 2);
        for h in [SERVER, CLIENT] {
            assert!(sim.hosts[h].saw(|e| matches!(
                e,
                Event::LinkDown {
                    link: LinkId(1),
                    ..
                }
            )));
            assert!(sim.hosts[h].lg.link(LinkId(1)).is_none());
        }
        sim.check_consistent().unwrap();
    }
}

/// TC-LGM-11 / B.16: DELETE LINK from the server for an unknown link → reply "no link"
/// (0x00100000, AMB-26); from the client → the same unless the link is being cleaned up.
#[test]
fn tc_lgm_11_delete_unknown_link() {
    let mut s = Solo::client_up(LlcConfig::rfc(Role::Client));
    s.rx(
        LinkId::FIRST,
        &LlcMessage::DeleteLink(del(false, false, false, 9, DeleteLinkReason::LOST_PATH)),
    );
    let LlcMessage::DeleteLink(r) = s.last().as_wire() else {
        panic!()
    };
    assert!(r.response && r.link_num == 9 && r.reason == DeleteLinkReason::NOLNK);
    assert!(!s.lg.is_terminated());

    let mut s = Solo::server_up(LlcConfig::rfc(Role::Server), 1);
    // Let the pending ADD LINK attempt end first (rejected).
    let last = s.last();
    let LlcMessage::AddLink(mut a) = last.as_wire() else {
        panic!()
    };
    a.response = true;
    a.reject = true;
    a.reject_reason = 1;
    s.rx(LinkId::FIRST, &LlcMessage::AddLink(a));
    s.take();
    s.rx(
        LinkId::FIRST,
        &LlcMessage::DeleteLink(del(false, false, false, 9, DeleteLinkReason::LOST_PATH)),
    );
    let LlcMessage::DeleteLink(r) = s.last().as_wire() else {
        panic!()
    };
    assert!(r.response && r.reason == DeleteLinkReason::NOLNK);
    // TC-LGM-14: link 2 (the rejected attempt) was just cleaned up: a timing window,
    // ignored.
    s.take();
    s.rx(
        LinkId::FIRST,
        &LlcMessage::DeleteLink(del(false, false, false, 2, DeleteLinkReason::LOST_PATH)),
    );
    assert!(s.sent.is_empty());
}

/// TC-LGM-12 / TC-LGM-13: the client asks (orderly or not); the server runs its own DELETE
/// LINK exchange at once; the client's request is not answered directly (CDL-3).
#[test]
fn tc_lgm_12_client_delete() {
    for orderly in [false, true] {
        let mut sim = Sim::new(two_by_two(rfc_pair()), 26);
        settle(&mut sim);
        sim.trace.clear();
        sim.with(CLIENT, |h, now| {
            h.lg.delete_link(now, LinkId(1), orderly).unwrap()
        });
        settle(&mut sim);
        assert_eq!(
            sim.labels(),
            ["C: DELETE LINK", "S: DELETE LINK", "C: DELETE LINK rsp"]
        );
        let LlcMessage::DeleteLink(c) = sim.trace[0].msg.as_wire() else {
            panic!()
        };
        assert_eq!((c.orderly, c.link_num), (orderly, 2));
        sim.check_consistent().unwrap();
        assert_eq!(sim.hosts[SERVER].lg.links().count(), 1);
    }
}

/// TC-LGM-15 / TC-LGM-17: DELETE LINK (all) from the server: the client ends at once, with
/// no reply, whatever link number it carries; the server ends once it went out.
#[test]
fn tc_lgm_15_server_delete_lg_all() {
    for (name, cfg) in all_pairs() {
        let mut sim = Sim::new(two_by_two(cfg), 27);
        settle(&mut sim);
        sim.trace.clear();
        sim.with(SERVER, |h, now| h.lg.terminate(now));
        assert!(
            !sim.hosts[SERVER].lg.is_terminated(),
            "waits for the send completion"
        );
        sim.run_for(Duration::from_millis(100));
        assert_eq!(sim.labels(), ["S: DELETE LINK"], "{name}");
        let LlcMessage::DeleteLink(d) = sim.trace[0].msg.as_wire() else {
            panic!()
        };
        assert!(d.all && d.orderly && d.reason == DeleteLinkReason::OP_INIT_TERM);
        assert_eq!(
            sim.hosts[CLIENT].terminated,
            Some(TerminateReason::PeerDeleted(DeleteLinkReason::OP_INIT_TERM))
        );
        assert!(sim.hosts[SERVER].lg.is_terminated());
        sim.check_consistent().unwrap();
    }
    let mut s = Solo::client_up(LlcConfig::rfc(Role::Client));
    s.rx(
        LinkId::FIRST,
        &LlcMessage::DeleteLink(del(false, true, false, 7, DeleteLinkReason::LOST_PATH)),
    );
    assert!(s.lg.is_terminated());
    assert_eq!(s.sent.len(), 1, "only the CONFIRM LINK response");
}

/// TC-LGM-16: the client asks for the whole group; the server complies with its own
/// DELETE LINK (all); both end.
#[test]
fn tc_lgm_16_client_requests_lg_delete() {
    let mut sim = Sim::new(two_by_two(v2_pair()), 28);
    settle(&mut sim);
    sim.trace.clear();
    sim.with(CLIENT, |h, now| h.lg.terminate(now));
    settle(&mut sim);
    assert_eq!(sim.labels(), ["C: DELETE LINK", "S: DELETE LINK"]);
    assert_eq!(
        sim.hosts[SERVER].terminated,
        Some(TerminateReason::PeerDeleted(DeleteLinkReason::OP_INIT_TERM))
    );
    assert_eq!(
        sim.hosts[CLIENT].terminated,
        Some(TerminateReason::Local(DeleteLinkReason::OP_INIT_TERM))
    );
}

/// TC-LGM-18 (AMB-27): an unsolicited DELETE LINK (all) response is harmless.
#[test]
fn tc_lgm_18_tolerate_delete_all_response() {
    for role in [Role::Server, Role::Client] {
        let mut s = match role {
            Role::Server => Solo::server_up(LlcConfig::rfc(role), 1),
            Role::Client => Solo::client_up(LlcConfig::rfc(role)),
        };
        s.take();
        s.rx(
            LinkId::FIRST,
            &LlcMessage::DeleteLink(del(true, true, false, 0, DeleteLinkReason(0))),
        );
        assert!(!s.lg.is_terminated());
        assert!(s.sent.is_empty());
    }
}

/// TC-LGM-19 / TC-FC-19: link numbers are ≥ 1, unique, echoed, and not reused while
/// unused numbers remain (§2.2.4).
#[test]
fn tc_lgm_19_link_number_no_reuse() {
    let mut sim = Sim::new(two_by_two(rfc_pair()), 29);
    settle(&mut sim);
    let mut seen = vec![1u8, 2];
    for _ in 0..5 {
        let l = sim.hosts[SERVER]
            .lg
            .links()
            .find(|l| l.num != 1)
            .map(|l| l.id)
            .unwrap();
        sim.with(SERVER, |h, now| h.lg.delete_link(now, l, true).unwrap());
        settle(&mut sim);
        // Re-add it (the C.8 retry would; here a "new" device does it at once).
        sim.with(SERVER, |h, now| {
            h.lg.add_device(now, device(SERVER, 9));
            h.lg.remove_device(now, DeviceId(9));
        });
        sim.run_for(Duration::from_secs(61));
        settle(&mut sim);
        let nums: Vec<u8> = sim.hosts[SERVER].lg.links().map(|l| l.num).collect();
        assert_eq!(nums.len(), 2, "{}", sim.dump());
        let n = nums[1];
        assert!(!seen.contains(&n), "{n} reused ({seen:?})");
        seen.push(n);
        sim.check_consistent().unwrap();
    }
    assert_eq!(seen, [1, 2, 3, 4, 5, 6, 7]);
}

/// TC-LGM-20: after the last connection the group lingers, then the server ends it with
/// DELETE LINK (all), orderly, PROG_INIT_TERM (Linux: 600 s); activity in between resets
/// the linger.
#[test]
fn tc_lgm_20_lg_idle_linger() {
    let mut cfg = v2_pair();
    cfg.server.timers.linger = Some(Duration::from_secs(600));
    cfg.client.timers.linger = Some(Duration::from_secs(610));
    let mut sim = Sim::new(cfg, 30);
    settle(&mut sim);
    for h in [SERVER, CLIENT] {
        sim.with(h, |x, now| x.lg.set_idle(now, true));
    }
    sim.run_for(Duration::from_secs(300));
    // A connection came and went on the server: its linger starts again.
    sim.with(SERVER, |x, now| x.lg.set_idle(now, false));
    sim.with(SERVER, |x, now| x.lg.set_idle(now, true));
    sim.run_for(Duration::from_secs(305));
    assert!(!sim.hosts[CLIENT].lg.is_terminated());
    sim.run_for(Duration::from_secs(10));
    // The client's linger (610 s) ran out first: it asks, the server complies.
    assert_eq!(sim.hosts[CLIENT].terminated, Some(TerminateReason::Idle));
    let d = sim.sent(CLIENT, LlcType::DeleteLink);
    let LlcMessage::DeleteLink(d) = d[0].msg.as_wire() else {
        panic!()
    };
    assert!(d.all && d.orderly && d.reason == DeleteLinkReason::PROG_INIT_TERM);
    assert_eq!(
        sim.hosts[SERVER].terminated,
        Some(TerminateReason::PeerDeleted(
            DeleteLinkReason::PROG_INIT_TERM
        ))
    );

    // Server first.
    let mut sim = Sim::new(v2_pair(), 31);
    settle(&mut sim);
    for h in [SERVER, CLIENT] {
        sim.with(h, |x, now| x.lg.set_idle(now, true));
    }
    sim.run_for(Duration::from_secs(599));
    assert!(!sim.hosts[SERVER].lg.is_terminated());
    sim.run_for(Duration::from_secs(2));
    assert_eq!(sim.hosts[SERVER].terminated, Some(TerminateReason::Idle));
    assert_eq!(
        sim.hosts[CLIENT].terminated,
        Some(TerminateReason::PeerDeleted(
            DeleteLinkReason::PROG_INIT_TERM
        ))
    );
}

/// B.16 crossing row / TC-LLC-23: after the client sent DELETE LINK for link 2, server
/// commands on link 2 are ignored.
#[test]
fn tc_llc_23_ignore_cmds_on_link_client_deleted() {
    let mut sim = Sim::new(two_by_two(rfc_pair()), 32);
    settle(&mut sim);
    sim.with(CLIENT, |h, now| {
        h.lg.delete_link(now, LinkId(1), false).unwrap()
    });
    sim.trace.clear();
    let c = ConfirmRkey {
        num_tokens: 1,
        rkey: 0x777,
        vaddr: 1,
        others: [
            OtherLinkRkey {
                link_num: 1,
                rkey: 0x778,
                vaddr: 2,
            },
            OtherLinkRkey::default(),
        ],
        ..Default::default()
    };
    sim.inject(CLIENT, LinkId(1), &LlcMessage::ConfirmRkey(c));
    assert!(sim.trace.is_empty(), "no answer");
    assert!(sim.hosts[CLIENT]
        .lg
        .peer_rmb_by_rkey(LinkId(1), 0x777)
        .is_none());
}
