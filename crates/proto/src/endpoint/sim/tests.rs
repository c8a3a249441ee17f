//! The races that used to be reachable only by threaded end-to-end tests, replayed from
//! seeds (issue 11). Each scenario runs over many seeds; a failure names its seed, and
//! `SMC_SIM_SEED=<seed>` runs just that one. `SMC_SIM_SEEDS=<n>` runs more (default 64;
//! CI keeps the default).

use std::time::Duration;

use super::*;
use crate::conn::ConnConfig;

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("SMC_SIM_SEED") {
        return vec![s.parse().expect("SMC_SIM_SEED is a number")];
    }
    let n = std::env::var("SMC_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64u64);
    (0..n).collect()
}

/// Runs `f` for every seed; a panic names the seed and the one-line reproduction.
/// Returns on how many seeds `f` said the race under test was reached.
fn each_seed(name: &str, f: impl Fn(u64) -> bool + std::panic::RefUnwindSafe) -> usize {
    let mut reached = 0;
    let seeds = seeds();
    let n = seeds.len();
    for seed in seeds {
        match std::panic::catch_unwind(|| f(seed)) {
            Ok(r) => reached += usize::from(r),
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!(
                    "{name} failed with seed {seed}: {msg}\n  reproduce: SMC_SIM_SEED={seed} cargo test -p smc-proto --lib endpoint::sim::tests::{name}"
                );
            }
        }
    }
    eprintln!("{name}: the race was reached with {reached} of {n} seeds");
    reached
}

/// A race the scenario is about was reached by some seed (unless one seed was asked for).
fn assert_reached(name: &str, reached: usize) {
    assert!(
        reached > 0 || std::env::var("SMC_SIM_SEED").is_ok(),
        "{name}: no seed reached the race"
    );
}

fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn world(seed: u64) -> (World, NodeId, NodeId) {
    let mut w = World::new(seed);
    let s = w.add_node(config(), ConnConfig::default());
    let c = w.add_node(config(), ConnConfig::default());
    (w, s, c)
}

/// Every client application ended well: SMC-R, its data echoed back exactly.
fn check_clients(w: &World, node: NodeId, sent: &[Vec<u8>]) {
    let res = w.nodes[node].results();
    assert_eq!(res.len(), sent.len());
    for (r, data) in res.iter().zip(sent) {
        assert_eq!(r.smc, Some(true), "SMC-R: {r:?}");
        assert!(r.error.is_none(), "no error: {:?}", r.error);
        assert!(r.done, "read to the end and closed");
        assert!(
            r.received == *data,
            "echo intact ({} of {} bytes)",
            r.received.len(),
            data.len()
        );
    }
}

/// Nothing left behind: connections released, tokens and RMB elements given back.
fn check_clean(w: &World) {
    for n in &w.nodes {
        assert_eq!(
            n.violations(),
            0,
            "node {}: writes outside registered memory",
            n.id
        );
        assert_eq!(n.conns(), 0, "node {}: connections left", n.id);
        assert_eq!(n.tokens(), 0, "node {}: alert tokens left", n.id);
        let (_, in_use) = n.ep.rmb_counts();
        assert_eq!(in_use, 0, "node {}: RMB elements in use", n.id);
        assert_eq!(n.ep.rendezvous_count(), 0, "node {}: rendezvous left", n.id);
    }
}

/// First contacts from one address are serialized on the server (Linux
/// `smc_server_lgr_pending`): five
/// connections opened at once from one client share one link group.
#[test]
fn first_contact_serialization() {
    each_seed("first_contact_serialization", |seed| {
        let (mut w, s, c) = world(seed);
        let mut sent = Vec::new();
        for i in 0..5 {
            let data = payload(seed * 10 + i, 3000 + 997 * i as usize);
            sent.push(data.clone());
            let at = w.delay((0, 300));
            w.connect_at(
                at,
                c,
                s,
                App::Client {
                    data,
                    half_close_first: false,
                },
            );
        }
        w.run(Duration::from_secs(60));
        check_clients(&w, c, &sent);
        assert_eq!(
            w.nodes[s].ep.link_groups().len(),
            1,
            "one server link group"
        );
        assert_eq!(
            w.nodes[c].ep.link_groups().len(),
            1,
            "one client link group"
        );
        assert_eq!(w.nodes[c].ep.counters().first_contacts, 1);
        check_clean(&w);
        true
    });
}

/// On subsequent contact the client writes as soon as its Confirm is out; its CDCs can
/// overtake the Confirm (RoCE faster than TCP): the server keeps them with the token and
/// replays them once the connection exists. Some seeds must reach the race.
#[test]
fn early_cdc() {
    let reached = each_seed("early_cdc", |seed| {
        let (mut w, s, c) = world(seed);
        w.delays.tcp = (200, 3000);
        w.delays.roce = (1, 50);
        let first = payload(seed, 100);
        w.connect_at(
            Duration::ZERO,
            c,
            s,
            App::Client {
                data: first.clone(),
                half_close_first: false,
            },
        );
        let second = payload(seed + 1, 40_000);
        w.connect_at(
            Duration::from_secs(5),
            c,
            s,
            App::Client {
                data: second.clone(),
                half_close_first: false,
            },
        );
        w.run(Duration::from_secs(60));
        check_clients(&w, c, &[first, second]);
        assert_eq!(w.nodes[c].ep.counters().first_contacts, 1);
        check_clean(&w);
        w.early_cdcs > 0
    });
    assert_reached("early_cdc", reached);
}

/// Issue 10 item 2: a client that shuts down writing at once sends its FIN right after
/// the CLC Confirm, while CONFIRM LINK is in flight. Neither rendezvous may fail.
#[test]
fn fin_right_after_confirm() {
    let reached = each_seed("fin_right_after_confirm", |seed| {
        let (mut w, s, c) = world(seed);
        // TCP fast, the server's event thread slow to see LLC messages: the FIN overtakes
        // the CONFIRM LINK response (which the client's RNIC already saw acknowledged).
        w.delays.tcp = (1, 30);
        w.delays.llc_hop = (0, 3000);
        w.connect_at(
            Duration::ZERO,
            c,
            s,
            App::Client {
                data: Vec::new(),
                half_close_first: true,
            },
        );
        w.run(Duration::from_secs(60));
        check_clients(&w, c, &[Vec::new()]);
        assert_eq!(
            w.nodes[s].ep.counters().resets,
            0,
            "the server reset nothing"
        );
        check_clean(&w);
        w.nodes[s].fins_in_rendezvous > 0
    });
    assert_reached("fin_right_after_confirm", reached);
}

/// A Decline during first contact: the server's CONFIRM LINK cannot be sent (its first
/// QP cannot reach the client), so the server declines while it still may (RFC 7609
/// C.2); the client takes the Decline in its wait for CONFIRM LINK; both fall back to
/// TCP, the data goes over TCP, and both link groups are gone.
#[test]
fn decline_during_first_contact() {
    let reached = each_seed("decline_during_first_contact", |seed| {
        let (mut w, s, c) = world(seed);
        let data = payload(seed, 5000);
        w.connect_at(
            Duration::ZERO,
            c,
            s,
            App::Client {
                data: data.clone(),
                half_close_first: false,
            },
        );
        w.nodes[s].unreachable_first_link();
        w.run(Duration::from_secs(60));
        let r = w.nodes[c].results();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].smc, Some(false), "{:?}", r[0]);
        assert!(r[0].received == data, "the data went over TCP");
        assert_eq!(w.nodes[s].ep.counters().fallbacks, 1);
        check_clean(&w);
        assert_eq!(w.nodes[s].ep.link_groups().len(), 0);
        assert_eq!(w.nodes[c].ep.link_groups().len(), 0);
        r[0].smc == Some(false)
    });
    assert_reached("decline_during_first_contact", reached);
}

/// A link goes down in the middle of a transfer: with one link there is nowhere to fail
/// over to, so the connections on it end with an error at both ends (RFC 7609 §4.8.3);
/// no hang, no write outside memory, everything freed.
#[test]
fn link_down_mid_transfer() {
    let reached = each_seed("link_down_mid_transfer", |seed| {
        let (mut w, s, c) = world(seed);
        let data = payload(seed, 2_000_000);
        w.connect_at(
            Duration::ZERO,
            c,
            s,
            App::Client {
                data,
                half_close_first: false,
            },
        );
        w.run(Duration::from_millis(40));
        let qpns = w.nodes[c].qpns();
        assert_eq!(qpns.len(), 1, "one link");
        let at = w.delay((0, 2000));
        w.fail_link_at(at, c, qpns[0]);
        w.run(Duration::from_secs(60));
        let r = w.nodes[c].results();
        assert!(r[0].error.is_some() || r[0].done, "{:?}", r[0]);
        if let Some(e) = r[0].error {
            assert_eq!(e.io_kind(), std::io::ErrorKind::ConnectionAborted, "{e:?}");
        }
        check_clean(&w);
        assert_eq!(w.nodes[c].ep.counters().links_failed, 1);
        r[0].error.is_some()
    });
    assert_reached("link_down_mid_transfer", reached);
}

fn world2(seed: u64) -> (World, NodeId, NodeId) {
    let mut w = World::new(seed);
    let s = w.add_node_with_devices(config(), ConnConfig::default(), 2);
    let c = w.add_node_with_devices(config(), ConnConfig::default(), 2);
    (w, s, c)
}

/// Active links of a node's only link group.
fn active_links(w: &World, node: NodeId) -> usize {
    w.nodes[node]
        .ep
        .link_groups()
        .iter()
        .map(|g| {
            g.links
                .iter()
                .filter(|l| l.state == llc::LinkState::Active)
                .count()
        })
        .sum()
}

/// RFC 7609 §4.6: both nodes have two devices, so the link group gets a second link
/// after first contact; one link fails in the middle of a 2 MB echo. The connection
/// moves to the surviving link (validation CDC, unconfirmed writes replayed) and the
/// echo is exact; the link group is down to one link, and the server adds the second
/// one again after the C.8 retry time.
#[test]
fn failover_mid_transfer() {
    let reached = each_seed("failover_mid_transfer", |seed| {
        let (mut w, s, c) = world2(seed);
        let data = payload(seed, 2_000_000);
        w.connect_at(
            Duration::ZERO,
            c,
            s,
            App::Client {
                data: data.clone(),
                half_close_first: false,
            },
        );
        w.run(Duration::from_millis(40));
        assert_eq!(active_links(&w, c), 2, "two links on the client");
        assert_eq!(active_links(&w, s), 2, "two links on the server");
        let qpns = w.nodes[c].qpns();
        assert_eq!(qpns.len(), 2, "two QPs");
        let pick = w.delay((0, 1)).as_micros() as usize;
        let at = w.delay((0, 2000));
        w.fail_link_at(at, c, qpns[pick]);
        w.run(Duration::from_secs(60));
        check_clients(&w, c, &[data]);
        check_clean(&w);
        for n in [s, c] {
            assert_eq!(w.nodes[n].ep.counters().links_failed, 1, "node {n}");
            assert_eq!(active_links(&w, n), 1, "node {n}: one link left");
        }
        let moved = w.nodes[c].ep.counters().failovers + w.nodes[s].ep.counters().failovers;
        // C.8: the server adds the lost link again.
        w.run_for(Duration::from_secs(90));
        for n in [s, c] {
            assert_eq!(active_links(&w, n), 2, "node {n}: the link is back");
        }
        moved > 0
    });
    assert_reached("failover_mid_transfer", reached);
}

/// Both links of a two-link group fail one after the other during a 2 MB echo: the
/// connection moves to the second link, then has nowhere to go and ends with
/// `ConnectionAborted` (unless it had finished); the link group ends; nothing leaks.
#[test]
fn failover_then_last_link_fails() {
    let reached = each_seed("failover_then_last_link_fails", |seed| {
        let (mut w, s, c) = world2(seed);
        let data = payload(seed, 2_000_000);
        w.connect_at(
            Duration::ZERO,
            c,
            s,
            App::Client {
                data,
                half_close_first: false,
            },
        );
        w.run(Duration::from_millis(40));
        let qpns = w.nodes[c].qpns();
        assert_eq!(qpns.len(), 2, "two links");
        let a = w.delay((0, 1000));
        let b = a + w.delay((0, 3000));
        w.fail_link_at(a, c, qpns[0]);
        w.fail_link_at(b, c, qpns[1]);
        w.run(Duration::from_secs(60));
        let r = w.nodes[c].results();
        assert!(r[0].error.is_some() || r[0].done, "{:?}", r[0]);
        if let Some(e) = r[0].error {
            assert_eq!(e.io_kind(), std::io::ErrorKind::ConnectionAborted, "{e:?}");
        }
        check_clean(&w);
        for n in [s, c] {
            assert_eq!(
                w.nodes[n].ep.link_groups().len(),
                0,
                "node {n}: link group ended"
            );
        }
        r[0].error.is_some() && w.nodes[c].ep.counters().failovers > 0
    });
    assert_reached("failover_then_last_link_fails", reached);
}

/// A link fails while the server is still adding the second one on first contact (ADD
/// LINK, its continuation or CONFIRM LINK on the new link in flight; RFC 7609 C.7.1):
/// the connection either completes its echo exactly on the link that is left, or ends
/// with an error; nothing hangs or leaks.
#[test]
fn link_fails_during_add_link() {
    let reached = each_seed("link_fails_during_add_link", |seed| {
        let (mut w, s, c) = world2(seed);
        let data = payload(seed, 300_000);
        w.connect_at(
            Duration::ZERO,
            c,
            s,
            App::Client {
                data: data.clone(),
                half_close_first: false,
            },
        );
        // Step until the server has created the second link's QP but it is not active.
        let mut during = false;
        for i in 1..=400 {
            w.run(Duration::from_micros(50 * i));
            if w.nodes[s].qpns().len() == 2 && active_links(&w, s) < 2 {
                during = true;
                break;
            }
        }
        let qpns = w.nodes[s].qpns();
        let pick = w.delay((0, 1)).as_micros() as usize % qpns.len().max(1);
        if let Some(&q) = qpns.get(pick) {
            w.fail_link_at(Duration::ZERO, s, q);
        }
        w.run(Duration::from_secs(120));
        let r = w.nodes[c].results();
        assert!(
            r[0].error.is_some() || r[0].done || r[0].reset,
            "{:?}",
            r[0]
        );
        if r[0].done && r[0].error.is_none() && !r[0].reset {
            let first_diff = r[0].received.iter().zip(&data).position(|(a, b)| a != b);
            assert!(
                r[0].received == data,
                "echo intact ({} of {} bytes, first difference at {first_diff:?})",
                r[0].received.len(),
                data.len(),
            );
        }
        check_clean(&w);
        during
    });
    assert_reached("link_fails_during_add_link", reached);
}

/// Some RMB of `node` is not yet confirmed on every link (its CONFIRM RKEY is in flight,
/// RFC 7609 §3.5.5.1.3).
fn rkey_outstanding(w: &World, node: NodeId) -> bool {
    w.nodes[node].ep.lgrs.values().any(|g| {
        g.llc
            .as_ref()
            .is_some_and(|l| l.local_rmbs().any(|r| !l.rmb_confirmed(r)))
    })
}

/// The echo either completed exactly or ended in an error or reset; never a hang.
fn check_echo_or_error(w: &World, node: NodeId, sent: &[Vec<u8>]) {
    for (r, data) in w.nodes[node].results().iter().zip(sent) {
        assert!(r.error.is_some() || r.done || r.reset, "{r:?}");
        if r.done && r.error.is_none() && !r.reset {
            assert!(
                r.received == *data,
                "echo intact ({} of {} bytes)",
                r.received.len(),
                data.len()
            );
        }
    }
}

/// The server re-adds a lost link (C.8) while the surviving link fails too, on either
/// node, a random moment later: the DELETE LINK for the survivor crosses the ADD LINK
/// (or its CONFIRM LINK) for the new one (RFC 7609 §3.5.5.3 collisions). A connection
/// opened meanwhile completes its echo exactly on whatever link is left, or ends with an
/// error; the link group ends or keeps working; nothing hangs or leaks.
#[test]
fn add_link_crosses_delete_link() {
    let reached = each_seed("add_link_crosses_delete_link", |seed| {
        let (mut w, s, c) = world2(seed);
        let first = payload(seed, 50_000);
        w.connect_at(
            Duration::ZERO,
            c,
            s,
            App::Client {
                data: first.clone(),
                half_close_first: false,
            },
        );
        w.run(Duration::from_millis(40));
        let qpns = w.nodes[c].qpns();
        assert_eq!(qpns.len(), 2, "two links");
        // Lose one link; the server adds it again after add_link_retry (60 s).
        w.fail_link_at(Duration::ZERO, c, qpns[0]);
        w.run_for(Duration::from_secs(1));
        assert_eq!(active_links(&w, s), 1);
        // Step until the server has created the new link's QP, not yet active (the
        // retry timer runs from the failure: fine steps from a little before it).
        w.run_for(Duration::from_secs(58));
        let mut during = false;
        for _ in 0..200_000 {
            w.run_for(Duration::from_micros(50));
            if w.nodes[s].qpns().len() == 2 {
                during = active_links(&w, s) < 2;
                break;
            }
        }
        if !during {
            // The exchange finished within one step (or never began): not this race.
            w.run_for(Duration::from_secs(300));
            check_echo_or_error(&w, c, &[first]);
            check_clean(&w);
            return false;
        }
        // The survivor fails on one node, 0-300 µs into the ADD LINK exchange, while a
        // new connection starts.
        let survivor_node = if w.delay((0, 1)).is_zero() { s } else { c };
        let survivors: Vec<u32> = {
            let all = w.nodes[survivor_node].qpns();
            let n = &w.nodes[survivor_node];
            all.into_iter().filter(|q| n.qp_active(*q)).collect()
        };
        let at = w.delay((0, 300));
        for q in survivors {
            w.fail_link_at(at, survivor_node, q);
        }
        let second = payload(seed + 1, 80_000);
        let start = w.delay((0, 300));
        w.connect_at(
            start,
            c,
            s,
            App::Client {
                data: second.clone(),
                half_close_first: false,
            },
        );
        w.run_for(Duration::from_secs(300));
        check_echo_or_error(&w, c, &[first, second]);
        check_clean(&w);
        for n in [s, c] {
            assert!(active_links(&w, n) <= 2, "node {n}");
        }
        during
    });
    assert_reached("add_link_crosses_delete_link", reached);
}

/// A link fails while a CONFIRM RKEY for a new RMB is outstanding (a subsequent contact
/// just created one on a two-link group; RFC 7609 §3.5.5.1.3, §4.6): the connections
/// complete their echoes exactly on the link that is left (or end with an error), the
/// RMB is usable or deleted, nothing leaks.
#[test]
fn link_fails_while_confirm_rkey_outstanding() {
    let reached = each_seed("link_fails_while_confirm_rkey_outstanding", |seed| {
        let (mut w, s, c) = world2(seed);
        let first = payload(seed, 8_000_000);
        w.connect_at(
            Duration::ZERO,
            c,
            s,
            App::Client {
                data: first.clone(),
                half_close_first: false,
            },
        );
        w.run(Duration::from_millis(40));
        assert_eq!(active_links(&w, s), 2, "two links");
        // The first echo still runs, so its RMB is in use and the second connection's
        // is new (not one from the reuse cache).
        assert!(!w.nodes[c].results()[0].done, "first echo still running");
        // A second connection (subsequent contact: new RMBs on both sides, each with
        // a CONFIRM RKEY), and a link failure at a random moment of its rendezvous.
        let second = payload(seed + 7, 200_000);
        w.connect_at(
            Duration::ZERO,
            c,
            s,
            App::Client {
                data: second.clone(),
                half_close_first: false,
            },
        );
        // Step to the moment a CONFIRM RKEY is in flight (on either node), or until the
        // rendezvous is over; then one link fails on a random node.
        let mut outstanding = false;
        for _ in 0..2_000 {
            w.run_for(Duration::from_micros(10));
            if rkey_outstanding(&w, s) || rkey_outstanding(&w, c) {
                outstanding = true;
                // A random moment of the exchange: now or a little later.
                let later = w.delay((0, 200));
                w.run_for(later);
                break;
            }
        }
        let node = if w.delay((0, 1)).is_zero() { s } else { c };
        let qpns = w.nodes[node].qpns();
        let pick = w.delay((0, 1)).as_micros() as usize % qpns.len().max(1);
        if let Some(&q) = qpns.get(pick) {
            w.fail_link_at(Duration::ZERO, node, q);
        }
        w.run(Duration::from_secs(300));
        check_echo_or_error(&w, c, &[first, second]);
        check_clean(&w);
        outstanding
    });
    assert_reached("link_fails_while_confirm_rkey_outstanding", reached);
}

/// Both nodes lose the same link at nearly the same moment (a path gone, seen by both
/// ends: interface down on both sides of a cable), mid-transfer, twice: the first time
/// on the connection's link, the second time (after the C.8 re-add) on the link it moved
/// to. Their DELETE LINKs and validation CDCs cross. The echo is exact, nothing leaks.
#[test]
fn both_nodes_lose_the_link_twice() {
    let reached = each_seed("both_nodes_lose_the_link_twice", |seed| {
        // A quick C.8 re-add, so that the second cut comes mid-transfer too.
        let mut w = World::new(seed);
        let mut cfg = config();
        cfg.add_link_retry = Duration::from_millis(20);
        let s = w.add_node_with_devices(cfg.clone(), ConnConfig::default(), 2);
        let c = w.add_node_with_devices(cfg, ConnConfig::default(), 2);
        let data = payload(seed, 6_000_000);
        w.connect_at(
            Duration::ZERO,
            c,
            s,
            App::Client {
                data: data.clone(),
                half_close_first: false,
            },
        );
        w.run(Duration::from_millis(40));
        assert_eq!(active_links(&w, c), 2, "two links");
        let mut cuts = 0;
        for round in 0..2 {
            // The client's QP of the connection's link, and the server's at its other end.
            let Some(cq) = w.nodes[c].conn_qps().first().copied() else {
                break;
            };
            let Some(sq) = w.nodes[c].qp_peer(cq) else {
                break;
            };
            let a = w.delay((0, 500));
            let b = w.delay((0, 500));
            w.fail_link_at(a, c, cq);
            w.fail_link_at(b, s, sq);
            cuts += 1;
            if round == 0 {
                // The cut happens, then the server adds the link again (C.8 retry).
                w.run_for(Duration::from_millis(2));
                for _ in 0..2000 {
                    if active_links(&w, s) == 2 && active_links(&w, c) == 2 {
                        break;
                    }
                    w.run_for(Duration::from_micros(200));
                }
                if active_links(&w, s) < 2 || active_links(&w, c) < 2 {
                    break;
                }
            }
        }
        w.run(Duration::from_secs(600));
        let r = w.nodes[c].results();
        assert!(
            r[0].done,
            "echo did not finish: {} bytes back, {:?}",
            r[0].received.len(),
            r[0].error
        );
        assert!(r[0].error.is_none(), "{:?}", r[0].error);
        assert!(r[0].received == data, "echo intact");
        check_clean(&w);
        cuts == 2 && w.nodes[c].ep.counters().failovers >= 2
    });
    assert_reached("both_nodes_lose_the_link_twice", reached);
}
