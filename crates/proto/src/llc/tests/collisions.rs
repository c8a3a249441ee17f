//! Serialization and collisions: every row of the CHECKLIST B.14 table (RFC 7609
//! §3.5.5.3), named after the §E.8 tests.

use super::*;

/// A pair with `n` devices each and `max_links` n, settled, with slow enough messages that
/// a request can cross another one in flight.
fn crossing(cfg: SimConfig, n: u32, seed: u64) -> Sim {
    crossing3(cfg, n, n, n as u8, seed)
}

/// Like [`crossing`] with `s` server and `c` client devices and `max` links.
fn crossing3(cfg: SimConfig, s: u32, c: u32, max: u8, seed: u64) -> Sim {
    let mut cfg = cfg;
    cfg.server_devices = s;
    cfg.client_devices = c;
    cfg.server.max_links = max;
    cfg.client.max_links = max;
    cfg.min_delay = Duration::from_millis(1);
    cfg.max_delay = Duration::from_millis(1);
    let mut sim = Sim::new(cfg, seed);
    settle(&mut sim);
    sim.check_consistent().unwrap();
    sim.trace.clear();
    sim
}

/// Adds a server device so that the server starts an ADD LINK, and runs until it is sent.
fn start_server_add(sim: &mut Sim) {
    let n = sim.hosts[SERVER].devices.len() as u32 + 1;
    let d = device(SERVER, n);
    sim.hosts[SERVER].devices.push(d);
    sim.with(SERVER, |h, now| h.lg.add_device(now, d));
    assert!(sim.run_until_sent(
        |w| is(w, SERVER, LlcType::AddLink, false),
        Duration::from_secs(1)
    ));
}

fn client_device(sim: &mut Sim) {
    let n = sim.hosts[CLIENT].devices.len() as u32 + 1;
    let d = device(CLIENT, n);
    sim.hosts[CLIENT].devices.push(d);
    sim.with(CLIENT, |h, now| h.lg.add_device(now, d));
}

fn pos(labels: &[String], l: &str) -> usize {
    labels
        .iter()
        .position(|x| x == l)
        .unwrap_or_else(|| panic!("{l} not in {labels:?}"))
}

/// TC-LLC-09 / B.14 row 1: TEST LINK during ADD LINK is answered at once.
#[test]
fn tc_llc_09_test_link_during_add_link() {
    let mut s = Solo::client_up(LlcConfig::rfc(Role::Client));
    s.lg.add_device(s.now, device(CLIENT, 2));
    s.drain();
    let m = server_add_link(false, &device(SERVER, 2), 2, 0x30);
    s.rx(LinkId::FIRST, &LlcMessage::AddLink(m));
    s.take();
    let t = TestLink {
        v2: false,
        response: false,
        user_data: [7; 16],
    };
    s.rx(LinkId::FIRST, &LlcMessage::TestLink(t));
    let (l, m) = &s.sent[0];
    assert_eq!(*l, LinkId::FIRST);
    assert_eq!(
        m.as_wire(),
        LlcMessage::TestLink(TestLink {
            response: true,
            ..t
        })
    );
}

/// TC-LLC-10 / B.14 row 2: a client ADD LINK that crosses the server's is ignored; the
/// client takes the server's ADD LINK as the answer; one link is added.
#[test]
fn tc_llc_10_crossed_add_link() {
    let mut sim = crossing3(rfc_pair(), 1, 1, 2, 50);
    // The server's retry and the client's new RNIC at the same moment.
    let d = device(CLIENT, 2);
    sim.hosts[CLIENT].devices.push(d);
    start_server_add(&mut sim);
    sim.with(CLIENT, |h, now| h.lg.add_device(now, d));
    settle(&mut sim);
    let labels = sim.labels();
    assert_eq!(&labels[..2], ["S: ADD LINK", "C: ADD LINK"], "{labels:?}");
    assert_eq!(sim.sent(SERVER, LlcType::AddLink).len(), 1, "{labels:?}");
    sim.check_consistent().unwrap();
    assert_eq!(sim.hosts[SERVER].lg.links().count(), 2);
}

/// TC-LLC-11 / B.14 row 3: a client DELETE LINK for one link during ADD LINK is queued and
/// processed after the exchange.
#[test]
fn tc_llc_11_delete_specific_during_add() {
    // Links 1 and 2; the client has a third RNIC the server can use once it has one.
    let mut sim = crossing3(rfc_pair(), 2, 3, 3, 51);
    start_server_add(&mut sim);
    sim.with(CLIENT, |h, now| {
        h.lg.delete_link(now, LinkId(1), true).unwrap()
    });
    settle(&mut sim);
    let labels = sim.labels();
    let confirm = pos(&labels, "C: CONFIRM LINK rsp");
    let srv_del = pos(&labels, "S: DELETE LINK");
    assert!(
        confirm < srv_del,
        "deferred until the ADD LINK exchange ended: {labels:?}"
    );
    sim.check_consistent().unwrap();
    let nums: Vec<u8> = sim.hosts[SERVER].lg.links().map(|l| l.num).collect();
    assert_eq!(nums, [1, 3]);
}

/// TC-LLC-12 / B.14 row 4: DELETE LINK (all) during ADD LINK: the group ends at once.
#[test]
fn tc_llc_12_delete_all_during_add() {
    let mut sim = crossing3(rfc_pair(), 1, 1, 2, 52);
    start_server_add(&mut sim);
    sim.with(CLIENT, |h, now| h.lg.terminate(now));
    sim.run_for(Duration::from_millis(50));
    for h in [SERVER, CLIENT] {
        assert!(sim.hosts[h].lg.is_terminated(), "host {h}: {}", sim.dump());
    }
}

/// TC-LLC-13 / TC-LLC-18 / B.14 rows 5 and 13: a client CONFIRM RKEY crossing the server's
/// ADD LINK gets a negative answer with the retry flag; the client redoes it after the ADD
/// LINK, now with the new link's token. (Linux behaviour: answered positively, and the RMB
/// travels in the client's ADD LINK answer.)
#[test]
fn tc_llc_13_confirm_rkey_during_add() {
    for (name, cfg) in all_pairs() {
        // One link; the server's new RNIC gives an asymmetric link 2.
        let mut sim = crossing3(cfg, 1, 1, 2, 53);
        start_server_add(&mut sim);
        let r = sim.add_rmb(CLIENT);
        settle(&mut sim);
        let neg = sim.trace.iter().any(|w| {
            matches!(w.msg.as_wire(), LlcMessage::ConfirmRkey(c) if c.response && c.negative && c.retry)
        });
        assert_eq!(neg, name == "rfc", "{name}: {:?}", sim.labels());
        let reqs = sim
            .sent(CLIENT, LlcType::ConfirmRkey)
            .iter()
            .filter(|w| !w.msg.is_response())
            .count();
        assert_eq!(reqs, if name == "rfc" { 2 } else { 1 }, "{name}");
        assert!(sim.hosts[CLIENT].saw(|e| *e == Event::RmbConfirmed(r)));
        sim.check_consistent().unwrap();
        assert_eq!(sim.hosts[SERVER].lg.links().count(), 2, "{name}");
    }
}

/// TC-LLC-14 / B.14 row 7: a client ADD LINK during the server's DELETE LINK is queued and
/// processed after it.
#[test]
fn tc_llc_14_add_link_during_delete() {
    let mut sim = crossing3(rfc_pair(), 2, 2, 3, 54);
    sim.with(SERVER, |h, now| {
        h.lg.delete_link(now, LinkId(1), true).unwrap()
    });
    client_device(&mut sim);
    settle(&mut sim);
    let labels = sim.labels();
    assert!(
        pos(&labels, "C: DELETE LINK rsp") < pos(&labels, "S: ADD LINK"),
        "{labels:?}"
    );
    sim.check_consistent().unwrap();
    assert_eq!(sim.hosts[SERVER].lg.links().count(), 2);
}

/// TC-LLC-15 / B.14 row 8: a second DELETE LINK from the client during the server's is
/// queued.
#[test]
fn tc_llc_15_delete_during_delete() {
    let mut sim = crossing(rfc_pair(), 3, 55);
    sim.with(SERVER, |h, now| {
        h.lg.delete_link(now, LinkId(1), true).unwrap()
    });
    sim.with(CLIENT, |h, now| {
        h.lg.delete_link(now, LinkId(2), true).unwrap()
    });
    settle(&mut sim);
    let dels: Vec<u8> = sim
        .sent(SERVER, LlcType::DeleteLink)
        .iter()
        .filter_map(|w| match w.msg.as_wire() {
            LlcMessage::DeleteLink(d) => Some(d.link_num),
            _ => None,
        })
        .collect();
    assert_eq!(dels, [2, 3], "one after the other");
    sim.check_consistent().unwrap();
    assert_eq!(sim.hosts[CLIENT].lg.links().count(), 1);
}

/// TC-LLC-16 / B.14 row 10: a client CONFIRM RKEY during DELETE LINK → negative, retried
/// after.
#[test]
fn tc_llc_16_confirm_rkey_during_delete() {
    let mut sim = crossing(rfc_pair(), 2, 56);
    sim.with(SERVER, |h, now| {
        h.lg.delete_link(now, LinkId(1), true).unwrap()
    });
    let r = sim.add_rmb(CLIENT);
    settle(&mut sim);
    let labels = sim.labels();
    assert!(
        sim.trace.iter().any(|w| matches!(w.msg.as_wire(),
        LlcMessage::ConfirmRkey(c) if c.response && c.negative)),
        "{labels:?}"
    );
    assert!(sim.hosts[CLIENT].saw(|e| *e == Event::RmbConfirmed(r)));
    sim.check_consistent().unwrap();
}

/// TC-LLC-17 / B.14 row 12: a client ADD LINK during the server's CONFIRM RKEY is queued.
#[test]
fn tc_llc_17_add_link_during_confirm_rkey() {
    // Link 2 is asymmetric (the client has one RNIC); its second RNIC arrives while the
    // server's CONFIRM RKEY is in flight: the client's ADD LINK waits, then the server
    // replaces the asymmetric link with a symmetric one.
    let mut sim = crossing3(rfc_pair(), 2, 1, 3, 57);
    assert!(sim.hosts[SERVER].lg.link(LinkId(1)).unwrap().asymmetric);
    sim.add_rmb(SERVER);
    client_device(&mut sim);
    settle(&mut sim);
    let labels = sim.labels();
    assert_eq!(
        &labels[..2],
        ["S: CONFIRM RKEY", "C: ADD LINK"],
        "{labels:?}"
    );
    assert!(
        pos(&labels, "C: CONFIRM RKEY rsp") < pos(&labels, "S: ADD LINK"),
        "{labels:?}"
    );
    sim.check_consistent().unwrap();
    let links: Vec<LinkInfo> = sim.hosts[SERVER].lg.links().collect();
    assert_eq!(links.len(), 2);
    assert!(links.iter().all(|l| !l.asymmetric), "{links:?}");
}

/// TC-LLC-19 / B.14 row 14: the server's CONFIRM RKEY crosses a client DELETE LINK: the
/// server finishes the CONFIRM RKEY first.
#[test]
fn tc_llc_19_crossed_server_confirm_rkey_vs_client_delete() {
    let mut sim = crossing(rfc_pair(), 3, 58);
    let r = sim.add_rmb(SERVER);
    sim.with(CLIENT, |h, now| {
        h.lg.delete_link(now, LinkId(2), true).unwrap()
    });
    settle(&mut sim);
    let labels = sim.labels();
    assert!(
        pos(&labels, "C: CONFIRM RKEY rsp") < pos(&labels, "S: DELETE LINK"),
        "{labels:?}"
    );
    assert!(sim.hosts[SERVER].saw(|e| *e == Event::RmbConfirmed(r)));
    sim.check_consistent().unwrap();
}

/// TC-LLC-20 / B.14 row 15: the client's CONFIRM RKEY crosses the server's DELETE LINK:
/// the client processes the DELETE LINK, gets a negative CONFIRM RKEY and redoes it.
#[test]
fn tc_llc_20_crossed_client_confirm_rkey_vs_server_delete() {
    let mut sim = crossing(rfc_pair(), 3, 59);
    sim.with(SERVER, |h, now| {
        h.lg.delete_link(now, LinkId(2), true).unwrap()
    });
    let r = sim.add_rmb(CLIENT);
    settle(&mut sim);
    let labels = sim.labels();
    assert!(
        sim.trace.iter().any(|w| matches!(w.msg.as_wire(),
        LlcMessage::ConfirmRkey(c) if c.response && c.negative && c.retry)),
        "{labels:?}"
    );
    assert!(sim.hosts[CLIENT].saw(|e| *e == Event::RmbConfirmed(r)));
    sim.check_consistent().unwrap();
    assert_eq!(sim.hosts[CLIENT].lg.links().count(), 2);
}

/// TC-LLC-21 / B.14 row 16: DELETE LINK (all) during CONFIRM RKEY: immediate clean-up.
#[test]
fn tc_llc_21_delete_all_during_confirm_rkey() {
    let mut sim = crossing(rfc_pair(), 2, 60);
    let r = sim.add_rmb(CLIENT);
    sim.with(SERVER, |h, now| h.lg.terminate(now));
    sim.run_for(Duration::from_millis(50));
    for h in [SERVER, CLIENT] {
        assert!(sim.hosts[h].lg.is_terminated());
    }
    assert!(!sim.hosts[CLIENT].saw(|e| *e == Event::RmbConfirmed(r)));
}

/// B.14 row 17 (AMB-32): a CONFIRM LINK from the peer that did not start the exchange is
/// out of sync here (only the server sends CONFIRM LINK requests): the link goes down.
#[test]
fn b14_confirm_link_from_the_wrong_peer() {
    let mut s = Solo::server_up(LlcConfig::rfc(Role::Server), 1);
    let c = s.peer_confirm_link(false, 1);
    s.rx(LinkId::FIRST, &LlcMessage::ConfirmLink(c));
    assert!(s.lg.is_terminated());
}

/// TC-LLC-22: no side ever starts a second configuration or RKey exchange of its own
/// while one is unanswered (checked on the traces of random runs without failures).
#[test]
fn tc_llc_22_no_concurrent_group2_start() {
    use crate::llc::sim::Rng;
    for seed in 0..60u64 {
        let mut rng = Rng::new(seed);
        let mut cfg = match seed % 3 {
            0 => rfc_pair(),
            1 => v2_pair(),
            _ => SimConfig::pair(LlcConfig::linux(Role::Server, Version::V1)),
        };
        cfg.server_devices = 1 + rng.below(3) as u32;
        cfg.client_devices = 1 + rng.below(3) as u32;
        let mut sim = Sim::new(cfg, seed);
        settle(&mut sim);
        for _ in 0..30 {
            let h = rng.below(2) as usize;
            match rng.below(4) {
                0 | 1 => {
                    sim.add_rmb(h);
                }
                2 => {
                    let ids = sim.hosts[h].rmb_ids();
                    if !ids.is_empty() {
                        let r = ids[rng.below(ids.len() as u64) as usize];
                        sim.delete_rmb(h, r);
                    }
                }
                _ => sim.run_for(Duration::from_micros(rng.below(3000))),
            }
        }
        settle(&mut sim);
        check_group2(&sim).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", sim.dump()));
        sim.check_consistent().unwrap();
    }
}

/// Walks a trace: a side's own group-2 request (ADD LINK and DELETE LINK from the server,
/// CONFIRM/DELETE RKEY from either) must not start while its previous one is unanswered.
fn check_group2(sim: &Sim) -> Result<(), String> {
    // Open exchange per side: what closes it (answer type from the other side).
    let mut open: [Option<(LlcType, usize)>; 2] = [None, None];
    for (i, w) in sim.trace.iter().enumerate() {
        let other = 1 - w.from;
        let m = w.msg.as_wire();
        if w.msg.is_response() {
            // Closes the other side's exchange?
            if let Some((ty, left)) = open[other] {
                let closes = match (&m, ty) {
                    (LlcMessage::AddLink(a), LlcType::AddLink) => a.reject,
                    (LlcMessage::ConfirmLink(_), LlcType::AddLink) => true,
                    (LlcMessage::ConfirmRkey(c), LlcType::ConfirmRkey) => c.negative || left == 0,
                    (LlcMessage::ConfirmRkeyCont(_), LlcType::ConfirmRkey) => left == 0,
                    (m, ty) => m.msg_type() == ty && ty != LlcType::AddLink,
                };
                if closes {
                    open[other] = None;
                }
            }
            continue;
        }
        let (starts, left) = match &m {
            LlcMessage::AddLink(_) if w.from == SERVER => (Some(LlcType::AddLink), 0),
            LlcMessage::DeleteLink(d) if w.from == SERVER && !d.all => {
                (Some(LlcType::DeleteLink), 0)
            }
            LlcMessage::ConfirmRkey(c) => (
                Some(LlcType::ConfirmRkey),
                usize::from(c.num_tokens.saturating_sub(2)).div_ceil(3),
            ),
            LlcMessage::ConfirmRkeyCont(_) => {
                if let Some((LlcType::ConfirmRkey, l)) = open[w.from] {
                    open[w.from] = Some((LlcType::ConfirmRkey, l - 1));
                }
                (None, 0)
            }
            LlcMessage::DeleteRkey(_) | LlcMessage::DeleteRkeyV2(_) => {
                (Some(LlcType::DeleteRkey), 0)
            }
            _ => (None, 0),
        };
        if let Some(ty) = starts {
            if let Some((o, _)) = open[w.from] {
                return Err(format!(
                    "message {i}: host {} starts {} while its {} is open",
                    w.from,
                    ty.name(),
                    o.name()
                ));
            }
            open[w.from] = Some((ty, left));
        }
    }
    Ok(())
}
