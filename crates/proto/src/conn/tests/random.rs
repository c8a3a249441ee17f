//! Seeded random runs of two connections (TC-FLOW-10 and the issue's "deterministic
//! tests ... replayable from a seed"): arbitrary interleavings of writes, reads, urgent
//! data, RDMA deliveries, CDC processing, send completions, time, link failures and
//! closes. Every failure message names the seed; `run_random(seed, ..)` replays it.

use super::*;
use crate::conn::sim::{run_random, RandomOpts, RandomReport, Rng};
use proptest::prelude::*;

/// Random but valid host parameters: small rings (so that both rings wrap often), both
/// RMBE layouts, both update policies, corking (auto and TCP_CORK), a small in-flight
/// table.
fn host(rng: &mut Rng, inline: bool) -> HostConfig {
    let off = if rng.chance(50) { 4 } else { 0 };
    let cap = 8 + rng.below(6000) as u32;
    let sndbuf = 1 + rng.below(8000) as u32;
    let mut h = HostConfig::new(RmbeGeometry::new(cap + off, off).unwrap(), sndbuf);
    h.conn.update_policy = if rng.chance(50) {
        UpdatePolicy::Rfc
    } else {
        UpdatePolicy::Linux {
            min_update: rng.below(3000) as u32,
        }
    };
    h.conn.cork = rng.chance(30);
    h.tcp_cork = rng.chance(25);
    h.conn.nodelay = rng.chance(20);
    h.conn.max_inflight = 1 + rng.below(16) as u16;
    h.conn.oob_inline = inline;
    h.conn.urgent_release = if rng.chance(50) {
        UrgentRelease::AtMark
    } else {
        UrgentRelease::PastMark
    };
    h
}

fn run(seed: u64, opts: &RandomOpts, inline: Option<bool>) -> RandomReport {
    let mut rng = Rng::new(seed ^ 0xC0FF_EE00);
    let ia = inline.unwrap_or_else(|| rng.chance(50));
    let ib = inline.unwrap_or_else(|| rng.chance(50));
    let a = host(&mut rng, ia);
    let b = host(&mut rng, ib);
    match run_random(seed, a.clone(), b.clone(), opts) {
        Ok(r) => r,
        Err(e) => panic!("{e}\nA: {a:?}\nB: {b:?}"),
    }
}

/// TC-FLOW-10 never_overwrite_unconsumed: random sizes and timing; the writer never
/// passes the reader's consumer cursor, bytes arrive exactly once and in order, both
/// sides close normally.
#[test]
fn tc_flow_10_never_overwrite_unconsumed() {
    let opts = RandomOpts::default();
    let mut bytes = 0;
    for seed in 0..150 {
        let r = run(seed, &opts, Some(false));
        bytes += r.a_to_b + r.b_to_a;
    }
    assert!(bytes > 1_000_000, "the runs moved data ({bytes} bytes)");
}

/// Urgent data (inline and out of band) under random interleavings.
#[test]
fn random_urgent_data() {
    let opts = RandomOpts {
        urgent: true,
        ..RandomOpts::default()
    };
    for seed in 1000..1150 {
        run(seed, &opts, None);
    }
}

/// Link failures at random moments (RFC 7609 §4.6): validation, replay, no loss, no
/// duplication.
#[test]
fn random_failover() {
    let opts = RandomOpts {
        failover: true,
        urgent: true,
        ..RandomOpts::default()
    };
    let mut failovers = 0;
    for seed in 2000..2150 {
        failovers += run(seed, &opts, None).failovers;
    }
    assert!(failovers > 50, "failovers were exercised ({failovers})");
}

/// An abort at a random moment: both sides still reach CLOSED, with errors, and what
/// was read is a prefix of what was sent.
#[test]
fn random_abort() {
    let opts = RandomOpts {
        abort: true,
        urgent: true,
        ..RandomOpts::default()
    };
    let mut aborted = 0;
    for seed in 3000..3100 {
        aborted += usize::from(run(seed, &opts, None).aborted);
    }
    assert!(aborted > 50, "aborts were exercised ({aborted})");
}

/// Writes placed straight into the peer's RMBE (the same-host path) mixed with writes
/// through the sndbuf, urgent data and aborts: bytes arrive exactly once and in order,
/// no unread byte is overwritten, and the placed ones are announced like written ones.
#[test]
fn random_placed_writes() {
    let mut placed = 0;
    for (i, seed) in (4000..4150).enumerate() {
        let opts = RandomOpts {
            place: true,
            urgent: i % 3 == 1,
            abort: i % 3 == 2,
            ..RandomOpts::default()
        };
        placed += run(seed, &opts, None).placed;
    }
    assert!(placed > 500_000, "placing was exercised ({placed} bytes)");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The same properties from proptest-chosen seeds, all features on.
    #[test]
    fn prop_random_runs(
        seed in any::<u64>(),
        urgent in any::<bool>(),
        failover in any::<bool>(),
        place in any::<bool>(),
    ) {
        // Placed bytes cannot be replayed: placing and failover exclude each other.
        let place = place && !failover;
        let opts = RandomOpts { urgent, failover, place, steps: 1500, ..RandomOpts::default() };
        run(seed, &opts, None);
    }
}

/// Same seed, same run: the simulator and the machine are deterministic.
#[test]
fn random_runs_replay_identically() {
    let opts = RandomOpts {
        urgent: true,
        failover: true,
        ..RandomOpts::default()
    };
    let a = run(77, &opts, None);
    let b = run(77, &opts, None);
    assert_eq!(
        (a.a_to_b, a.b_to_a, a.cdcs, a.failovers),
        (b.a_to_b, b.b_to_a, b.cdcs, b.failovers)
    );
}
