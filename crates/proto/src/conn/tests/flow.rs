//! CDC validation and flow control: CHECKLIST §E.9 (TC-CDC-*, TC-FLOW-*), B.18, B.19.

use std::time::{Duration, Instant};

use super::*;
use crate::conn::sim::TOKEN_B;

const LOCAL: u32 = 0x1111;
const PEER: u32 = 0x2222;

/// A lone connection (RFC layout, 10,000-byte RMBEs) to feed hand-made CDCs to.
fn lone(cfg: ConnConfig) -> Conn {
    let g = RmbeGeometry::rfc(10_000).unwrap();
    Conn::new(ConnParams::new(g, g, 32 * 1024, LOCAL, PEER), cfg).unwrap()
}

fn cdc(seq: u16, prod: (u16, u32), cons: (u16, u32), pf: ProducerFlags) -> CdcRepr {
    CdcRepr {
        seqno: seq,
        token: LOCAL,
        prod: Cursor::new(prod.0, prod.1),
        cons: Cursor::new(cons.0, cons.1),
        prod_flags: pf,
        conn_flags: ConnStateFlags::empty(),
    }
}

fn t0() -> Instant {
    Instant::now()
}

fn no_byte(_: u32) -> u8 {
    0
}

/// Commit `n` bytes (contents do not matter to the machine).
fn commit(c: &mut Conn, n: u32) {
    assert!(c.tx_space().unwrap().total() >= u64::from(n));
    c.tx_commit(n, false).unwrap();
}

/// TC-CDC-02 seq_start_and_wrap: the first CDC is 1, 65535 is followed by 0, and the
/// receiver keeps accepting across the wrap (TC-CDC-04 at connection level).
#[test]
fn tc_cdc_02_seq_start_and_wrap() {
    let v = Variant::all()[0];
    let mut sim = v.sim(1024);
    let mut expect: u16 = 1;
    for i in 0..65_540u32 {
        assert_eq!(sim.write(Side::A, 1, false), 1);
        sim.post(Side::A);
        let t = sim.take_trace();
        assert_eq!(t.len(), 1, "one CDC per small write (i = {i})");
        assert_eq!(t[0].cdc.seqno, expect);
        expect = expect.wrapping_add(1);
        sim.deliver(Side::A);
        assert_eq!(sim.process(Side::B), Some(CdcOutcome::Accepted));
        sim.complete(Side::A);
        sim.read(Side::B, 1);
        sim.flush();
        sim.take_trace();
    }
    assert_eq!(sim.a.conn.snapshot().tx_seq, 65_540u32 as u16);
    assert_eq!(sim.b.inband, sim.a.stream(65_540));
}

/// TC-CDC-03 stale_seq_discarded: an older CDC replayed later changes nothing.
#[test]
fn tc_cdc_03_stale_seq_discarded() {
    let mut c = lone(ConnConfig::default());
    let now = t0();
    let old = cdc(5, (0, 1004), (0, 4), pf_none());
    let new = cdc(6, (0, 2004), (0, 4), pf_none());
    assert_eq!(c.handle_cdc(&old, now, no_byte), CdcOutcome::Accepted);
    assert_eq!(c.handle_cdc(&new, now, no_byte), CdcOutcome::Accepted);
    assert_eq!(c.handle_cdc(&old, now, no_byte), CdcOutcome::Stale);
    assert_eq!(c.snapshot().rx_prod, Cursor::new(0, 2004));
    // Equal seqno: processed idempotently (failover replay, AMB-38).
    assert_eq!(c.handle_cdc(&new, now, no_byte), CdcOutcome::Accepted);
    assert_eq!(c.rx_available().total(), 2000);
    // A newer CDC with a cursor that went backwards: cursor ignored (WIN-12).
    let back = cdc(7, (0, 1500), (0, 4), pf_none());
    assert_eq!(c.handle_cdc(&back, now, no_byte), CdcOutcome::Accepted);
    assert_eq!(c.snapshot().rx_prod, Cursor::new(0, 2004));
    assert!(c.error().is_none());
}

/// TC-CDC-05 unknown_alert_token: dropped, the connection is unaffected.
#[test]
fn tc_cdc_05_unknown_alert_token() {
    let mut c = lone(ConnConfig::default());
    let mut m = cdc(1, (0, 1004), (0, 4), pf_none());
    m.token = 0xDEAD_BEEF;
    assert_eq!(c.handle_cdc(&m, t0(), no_byte), CdcOutcome::WrongToken);
    assert_eq!(c.rx_available().total(), 0);
    assert_eq!(c.state(), State::Active);
    assert!(c.take_events().is_empty());
}

/// TC-CDC-06 producer_overrun: more than Cap unread bytes → the connection is reset.
#[test]
fn tc_cdc_06_producer_overrun() {
    let mut c = lone(ConnConfig::default());
    let now = t0();
    // 9,000 bytes, then a producer that claims 2,000 more without any consumer update.
    assert_eq!(
        c.handle_cdc(&cdc(1, (0, 9004), (0, 4), pf_none()), now, no_byte),
        CdcOutcome::Accepted
    );
    let r = c.handle_cdc(&cdc(2, (1, 1008), (0, 4), pf_none()), now, no_byte);
    let want = AbortReason::Violation(Violation::ProducerOverrun);
    assert_eq!(r, CdcOutcome::Aborted(want));
    assert_eq!(c.error(), Some(ConnError::Aborted(want)));
    assert_eq!(c.state(), State::PeerAbortWait);
    let ev = c.take_events();
    assert!(ev.contains(Events::TCP_RESET | Events::ERROR));
    // The abort indicator goes out (§4.8.2 1A), nothing else.
    let t = c.poll_transmit(now).unwrap();
    assert_eq!(t.cdc.conn_flags, ConnStateFlags::PEER_CONN_ABORT);
    assert!(t.writes().is_empty());
    assert!(c.poll_transmit(now).is_none());
    // Unread data was purged.
    assert_eq!(c.rx_available().total(), 0);
}

/// TC-CDC-07 cursor_out_of_range: offsets below the data area or at/after the end.
#[test]
fn tc_cdc_07_cursor_out_of_range() {
    for (prod, cons, v) in [
        ((0, 2), (0, 4), Violation::ProducerOutOfRange),
        ((0, 10_000), (0, 4), Violation::ProducerOutOfRange),
        ((0, 4), (0, 3), Violation::ConsumerOutOfRange),
        ((0, 4), (0, 10_000), Violation::ConsumerOutOfRange),
        // A consumer cursor ahead of anything we produced.
        ((0, 4), (0, 5), Violation::ConsumerAhead),
    ] {
        let mut c = lone(ConnConfig::default());
        let r = c.handle_cdc(&cdc(1, prod, cons, pf_none()), t0(), no_byte);
        assert_eq!(
            r,
            CdcOutcome::Aborted(AbortReason::Violation(v)),
            "{prod:?} {cons:?}"
        );
    }
    // Linux layout: offset 0 is valid, 9,996 is not.
    let g = RmbeGeometry::linux(9_996).unwrap();
    let mut c = Conn::new(
        ConnParams::new(g, g, 4096, LOCAL, PEER),
        ConnConfig::default(),
    )
    .unwrap();
    assert_eq!(
        c.handle_cdc(&cdc(1, (0, 0), (0, 0), pf_none()), t0(), no_byte),
        CdcOutcome::Accepted
    );
    assert!(matches!(
        c.handle_cdc(&cdc(2, (0, 9_996), (0, 0), pf_none()), t0(), no_byte),
        CdcOutcome::Aborted(_)
    ));
}

/// TC-CDC-09 every_cdc_carries_consumer: whatever the reason for a CDC, it carries the
/// sender's current consumer cursor.
#[test]
fn tc_cdc_09_every_cdc_carries_consumer() {
    let v = Variant::all()[0];
    let mut sim = v.sim(4096);
    for round in 0..200u64 {
        let side = if round % 3 == 0 { Side::B } else { Side::A };
        sim.write(side, 1 + round * 37 % 900, round % 11 == 0);
        sim.read(side.peer(), 1 + round * 53 % 1200);
        sim.read(side, 1 + round * 29 % 700);
        for s in [Side::A, Side::B] {
            let before = sim.trace.len();
            sim.post(s);
            let cons = sim.host(s).conn.snapshot().rx_cons;
            for t in &sim.trace[before..] {
                assert_eq!(t.cdc.cons, cons, "round {round}");
            }
        }
        sim.flush();
    }
}

/// TC-CDC-10 cdc_reserved_ignored: reserved flag bits from the peer have no effect.
#[test]
fn tc_cdc_10_cdc_reserved_ignored() {
    let mut c = lone(ConnConfig::default());
    let mut m = cdc(1, (0, 104), (0, 4), ProducerFlags::from_bits_retain(0x07));
    m.conn_flags = ConnStateFlags::from_bits_retain(0x1F);
    assert_eq!(c.handle_cdc(&m, t0(), no_byte), CdcOutcome::Accepted);
    assert_eq!(c.state(), State::Active);
    assert!(!c.rx_eof());
    assert_eq!(c.rx_available().total(), 100);
    assert!(!c.urgent_pending());
}

/// TC-FLOW-04 update_rule_examples_abc: RFC 7609 §4.5.1 examples with a 64 KiB buffer.
#[test]
fn tc_flow_04_update_rule_examples_abc() {
    const K: u64 = 1024;
    let g = RmbeGeometry::rfc(64 * 1024 + 4).unwrap();
    // (bytes the writer has outstanding, bytes the receiver then consumes, update?)
    for (case, outstanding, consumed, update) in [
        ("a", 14 * K, 14 * K, false), // writer window 50K: plenty of space
        ("b", 34 * K, K, false),      // writer window 30K, gain 1K < 6.4K
        ("c", 34 * K, 34 * K, true),  // writer window 30K, gain 34K
    ] {
        let mut a = HostConfig::new(g, 128 * 1024);
        a.conn.update_policy = UpdatePolicy::Rfc;
        let mut sim = Sim::new(a.clone(), a);
        sim.write(Side::A, outstanding, false);
        sim.flush();
        assert_eq!(sim.read(Side::B, consumed), consumed);
        let posted = sim.post(Side::B);
        assert_eq!(posted == 1, update, "case ({case})");
    }
}

/// TC-FLOW-07 wrap_split_writes: a write that crosses both the sndbuf end and the RMBE
/// end becomes three RDMA WRITEs, none crossing an end or touching the eye catcher.
#[test]
fn tc_flow_07_wrap_split_writes() {
    let g = RmbeGeometry::rfc(1004).unwrap(); // cap 1000
    let mut h = HostConfig::new(g, 700);
    h.conn.update_policy = UpdatePolicy::Rfc;
    let mut sim = Sim::new(h.clone(), h);
    // Move both rings off zero: 600 bytes, consumed.
    sim.write(Side::A, 600, false);
    sim.flush();
    sim.read(Side::B, 600);
    sim.flush();
    sim.take_trace();
    // 650 bytes: sndbuf 600..700 then 0..550; RMBE 604..1004 then 4..254.
    assert_eq!(sim.write(Side::A, 650, false), 650);
    sim.post(Side::A);
    let t = sim.take_trace();
    let w: Vec<(u32, u32, u32)> = t[0]
        .writes
        .iter()
        .map(|w| (w.src_off, w.len, w.dst_off))
        .collect();
    assert_eq!(w, vec![(600, 100, 604), (0, 300, 704), (300, 250, 4)]);
    for w in &t[0].writes {
        assert!(w.dst_off >= 4 && w.dst_off + w.len <= 1004);
        assert!(w.src_off + w.len <= 700);
    }
    sim.flush();
    sim.read(Side::B, 1000);
    assert_eq!(sim.b.inband, sim.a.stream(1250));
    assert!(sim.b.eye_catcher_intact());
}

/// TC-FLOW-08 bbit_every_consumption: with B set by the peer, every read sends an
/// update, until a CDC with B = 0 arrives.
#[test]
fn tc_flow_08_bbit_every_consumption() {
    for policy in [UpdatePolicy::Rfc, UpdatePolicy::linux()] {
        let g = RmbeGeometry::rfc(10_004).unwrap(); // cap 10,000
        let mut h = HostConfig::new(g, 32 * 1024);
        h.conn.update_policy = policy;
        let mut sim = Sim::new(h.clone(), h);
        sim.write(Side::A, 20_000, false);
        let t = send_and_receive(&mut sim, Side::A);
        assert!(t[0].cdc.prod_flags.contains(ProducerFlags::WRITE_BLOCKED));
        let step = match policy {
            UpdatePolicy::Rfc => 10,
            // Linux needs more than max(cap/10, 2304) unacknowledged bytes.
            UpdatePolicy::Linux { .. } => 2305,
        };
        // Small reads: each one produces an update while B is set.
        for _ in 0..3 {
            sim.read(Side::B, step);
            let t = send_and_receive(&mut sim, Side::B);
            assert_eq!(t.len(), 1, "{policy:?}");
            assert_eq!(t[0].cdc.cons, sim.b.conn.snapshot().rx_cons);
            // A may now write again: its next CDC keeps B while data is left over.
            let t = send_and_receive(&mut sim, Side::A);
            assert_eq!(t.len(), 1);
            assert!(t[0].cdc.prod_flags.contains(ProducerFlags::WRITE_BLOCKED));
        }
        // Drain: A sends the rest with B = 0; small reads no longer produce updates.
        sim.read(Side::B, 10_000);
        send_and_receive(&mut sim, Side::B);
        let t = send_and_receive(&mut sim, Side::A);
        assert!(!t
            .last()
            .unwrap()
            .cdc
            .prod_flags
            .contains(ProducerFlags::WRITE_BLOCKED));
        sim.read(Side::B, 10);
        assert_eq!(sim.post(Side::B), 0, "{policy:?}");
    }
}

/// TC-FLOW-09 rbit_immediate_update: R from the writer forces an update on every
/// consumption, and at once when consumed bytes were not yet advertised.
#[test]
fn tc_flow_09_rbit_immediate_update() {
    let mut c = lone(ConnConfig::default());
    let now = t0();
    c.handle_cdc(&cdc(1, (0, 1004), (0, 4), pf_none()), now, no_byte);
    c.rx_consume(100).unwrap();
    assert!(c.poll_transmit(now).is_none(), "no update without R");
    // R arrives while 100 consumed bytes are unadvertised: update at once.
    c.handle_cdc(
        &cdc(2, (0, 1004), (0, 4), ProducerFlags::CONS_UPDATE_REQ),
        now,
        no_byte,
    );
    let t = c.poll_transmit(now).unwrap();
    assert_eq!(t.cdc.cons, Cursor::new(0, 104));
    c.on_cdc_sent(t.cdc.seqno);
    // Every further consumption is reported while R stays set.
    for k in 1..=3u32 {
        c.rx_consume(1).unwrap();
        let t = c.poll_transmit(now).expect("update on consumption");
        assert_eq!(t.cdc.cons, Cursor::new(0, 104 + k));
        c.on_cdc_sent(t.cdc.seqno);
    }
    // R cleared: back to the window rule.
    c.handle_cdc(&cdc(3, (0, 1004), (0, 4), pf_none()), now, no_byte);
    c.rx_consume(1).unwrap();
    assert!(c.poll_transmit(now).is_none());
}

/// A writer that fills the window exactly (B = 0) and then gets more data tells the
/// reader with a data-less B CDC; a reader that consumed everything unannounced
/// answers at once (otherwise both would wait forever).
#[test]
fn blocked_signal_and_immediate_answer() {
    let v = Variant::all()[0];
    let mut sim = v.sim(32 * 1024);
    sim.write(Side::A, 9996, false);
    let t = send_and_receive(&mut sim, Side::A);
    assert_eq!(t[0].cdc.prod_flags, pf_none(), "nothing left over: B = 0");
    // The reader consumes most of it; window rule says: update (gain ≥ 10 %).
    // Make it consume only 900 bytes (< 10 %): no update.
    sim.read(Side::B, 900);
    assert_eq!(sim.post(Side::B), 0);
    sim.write(Side::A, 100, false);
    let t = send_and_receive(&mut sim, Side::A);
    assert_eq!(t.len(), 1);
    assert!(t[0].writes.is_empty());
    assert_eq!(t[0].cdc.prod_flags, ProducerFlags::WRITE_BLOCKED);
    // B answers at once with its consumer cursor.
    let t = send_and_receive(&mut sim, Side::B);
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].cdc.cons, v.cursor(0, 904));
    // A writes into the reopened window.
    let t = send_and_receive(&mut sim, Side::A);
    assert_eq!(t[0].writes.iter().map(|w| w.len).sum::<u32>(), 100);
}

/// TC-FLOW-11 small_send_immediate: one byte with an open window goes out at once.
#[test]
fn tc_flow_11_small_send_immediate() {
    let mut c = lone(ConnConfig::default());
    commit(&mut c, 1);
    let t = c.poll_transmit(t0()).expect("immediate");
    assert_eq!(t.writes().len(), 1);
    assert_eq!(t.data_len(), 1);
    assert_eq!(t.cdc.prod, Cursor::new(0, 5));
    // Even with another CDC in flight (no corking by default).
    commit(&mut c, 1);
    assert!(c.poll_transmit(t0()).is_some());
}

/// TC-FLOW-12 coalescing_timer_and_nodelay: with corking, small writes wait while a CDC
/// is in flight and go out with its completion; TCP_NODELAY turns corking off.
#[test]
fn tc_flow_12_coalescing_timer_and_nodelay() {
    let cfg = ConnConfig {
        cork: true,
        ..ConnConfig::default()
    };
    let mut c = lone(cfg);
    let now = t0();
    commit(&mut c, 10);
    let first = c.poll_transmit(now).expect("nothing in flight: sent");
    commit(&mut c, 10);
    commit(&mut c, 10);
    c.take_events();
    assert!(
        c.poll_transmit(now).is_none(),
        "corked behind the in-flight CDC"
    );
    // The completion is the flush timer: data is always eventually sent (SS-2).
    c.on_cdc_sent(first.cdc.seqno);
    assert!(c.take_events().contains(Events::TRANSMIT));
    let t = c.poll_transmit(now).expect("flushed");
    assert_eq!(t.data_len(), 20, "coalesced into one write");
    // TCP_NODELAY: stored, and no corking any more.
    commit(&mut c, 10);
    assert!(c.poll_transmit(now).is_none());
    c.set_nodelay(true);
    assert!(c.config().nodelay);
    assert!(c.take_events().contains(Events::TRANSMIT));
    assert_eq!(c.poll_transmit(now).unwrap().data_len(), 10);
}

/// TCP_CORK (tcp(7), Linux SMC's `smc_tx_should_cork`): small writes wait while corked
/// and go out together when the cork is removed.
#[test]
fn tcp_cork_holds_until_uncorked() {
    let mut c = lone(ConnConfig::default());
    let now = t0();
    c.set_cork(true);
    assert!(c.corked());
    commit(&mut c, 10);
    assert!(c.poll_transmit(now).is_none(), "held by the cork");
    assert_eq!(c.poll_timeout(), Some(now + CORK_MAX_HOLD));
    commit(&mut c, 10);
    assert!(c.poll_transmit(now).is_none());
    c.take_events();
    c.set_cork(false);
    assert!(c.take_events().contains(Events::TRANSMIT));
    assert_eq!(c.poll_transmit(now).expect("uncorked").data_len(), 20);
    assert_eq!(c.poll_timeout(), None);
}

/// TCP_CORK holds data at most 200 ms from the first held byte; the timer sends it.
#[test]
fn tcp_cork_holds_at_most_its_ceiling() {
    let mut c = lone(ConnConfig::default());
    let now = t0();
    c.set_cork(true);
    commit(&mut c, 10);
    assert!(c.poll_transmit(now).is_none());
    let later = now + CORK_MAX_HOLD - Duration::from_millis(1);
    commit(&mut c, 5);
    assert!(
        c.poll_transmit(later).is_none(),
        "the deadline is the first byte's"
    );
    let due = c.poll_timeout().expect("the cork's deadline");
    assert_eq!(due, now + CORK_MAX_HOLD);
    c.take_events();
    c.on_timeout(due);
    assert!(c.take_events().contains(Events::TRANSMIT));
    assert_eq!(
        c.poll_timeout(),
        None,
        "no past deadline left to re-arm the timer"
    );
    assert_eq!(
        c.poll_transmit(due).expect("ceiling reached").data_len(),
        15
    );
    // Still corked: the next small write is held again, with a fresh deadline.
    commit(&mut c, 1);
    assert!(c.poll_transmit(due).is_none());
    assert_eq!(c.poll_timeout(), Some(due + CORK_MAX_HOLD));
}

/// Corked data written while nothing can be posted (the in-flight table is full) arms
/// no cork timer until it could go; from then on it is held at most the ceiling, after
/// which no timer is left armed in the past (it would fire again at once).
#[test]
fn tcp_cork_ceiling_while_nothing_can_be_posted() {
    let mut c = lone(ConnConfig {
        max_inflight: 1,
        ..ConnConfig::default()
    });
    let now = t0();
    commit(&mut c, 10);
    let first = c.poll_transmit(now).expect("uncorked: sent");
    c.set_cork(true);
    commit(&mut c, 10);
    assert!(
        c.poll_transmit(now).is_none(),
        "the in-flight table is full"
    );
    // Not held by the cork yet (nothing could be posted anyway): no cork deadline.
    assert_eq!(c.poll_timeout(), None);
    c.on_cdc_sent(first.cdc.seqno);
    assert!(c.poll_transmit(now).is_none(), "held by the cork");
    let due = c.poll_timeout().expect("the cork's deadline");
    c.on_timeout(due);
    assert_eq!(c.poll_timeout(), None);
    assert_eq!(c.poll_transmit(due).expect("ceiling").data_len(), 10);
}

/// What TCP_CORK never holds: more than the peer's window takes now (a full "segment"),
/// the urgent byte, the close, and data flushed by TCP_NODELAY (once).
#[test]
fn tcp_cork_sends_full_windows_urgent_close_and_nodelay() {
    let now = t0();
    // More than the window (the RMB is 10,000 bytes): a full window goes at once.
    let mut c = lone(ConnConfig::default());
    c.set_cork(true);
    commit(&mut c, 12_000);
    let t = c.poll_transmit(now).expect("window-limited: sent");
    assert!(t.data_len() < 12_000);
    // Urgent data flushes what precedes it.
    let mut c = lone(ConnConfig::default());
    c.set_cork(true);
    commit(&mut c, 10);
    assert!(c.poll_transmit(now).is_none());
    c.tx_commit(1, true).unwrap();
    assert_eq!(c.poll_transmit(now).expect("urgent").data_len(), 11);
    // Closing flushes.
    let mut c = lone(ConnConfig::default());
    c.set_cork(true);
    commit(&mut c, 10);
    assert!(c.poll_transmit(now).is_none());
    c.shutdown_write(now).unwrap();
    assert_eq!(c.poll_transmit(now).expect("shutdown").data_len(), 10);
    // TCP_NODELAY flushes what is held, once; the cork stays.
    let mut c = lone(ConnConfig::default());
    c.set_cork(true);
    commit(&mut c, 10);
    assert!(c.poll_transmit(now).is_none());
    c.set_nodelay(true);
    assert_eq!(c.poll_transmit(now).expect("nodelay").data_len(), 10);
    commit(&mut c, 10);
    assert!(c.poll_transmit(now).is_none(), "still corked");
}

/// TC-FLOW-15 no_eyecatcher_mode_interop: Linux layout, cursors and writes from 0.
#[test]
fn tc_flow_15_no_eyecatcher_mode_interop() {
    let g = RmbeGeometry::linux(16 * 1024).unwrap();
    let mut sim = Sim::new(HostConfig::new(g, 16 * 1024), HostConfig::new(g, 16 * 1024));
    sim.write(Side::A, 1000, false);
    let t = send_and_receive(&mut sim, Side::A);
    assert_eq!(t[0].writes[0].dst_off, 0);
    assert_eq!(t[0].cdc.prod, Cursor::new(0, 1000));
    assert_eq!(t[0].cdc.cons, Cursor::new(0, 0));
    assert_eq!(t[0].cdc.token, TOKEN_B);
    // A full wrap lands on (1, x) with data starting at offset 0 again.
    sim.read(Side::B, 1000);
    sim.flush();
    sim.write(Side::A, 16 * 1024, false);
    settle(&mut sim);
    assert_eq!(sim.b.inband, sim.a.stream(1000 + 16 * 1024));
    assert_eq!(sim.a.conn.snapshot().tx_prod, Cursor::new(1, 1000));
}

/// TC-FLOW-16 eye_catcher_never_written: many wraps of a small RFC-layout RMBE never
/// touch bytes 0..3.
#[test]
fn tc_flow_16_eye_catcher_never_written() {
    let g = RmbeGeometry::rfc(64).unwrap();
    let mut sim = Sim::new(HostConfig::new(g, 50), HostConfig::new(g, 50));
    for i in 0..500u64 {
        sim.write(Side::A, 1 + i % 47, false);
        sim.write(Side::B, 1 + i % 31, false);
        sim.flush();
        sim.read(Side::A, 1 + i % 13);
        sim.read(Side::B, 1 + i % 17);
        sim.flush();
    }
    assert!(sim.a.eye_catcher_intact() && sim.b.eye_catcher_intact());
    assert!(sim.faults.is_empty(), "{:?}", sim.faults);
    for t in &sim.trace {
        for w in &t.writes {
            assert!(w.dst_off >= 4, "{w:?}");
        }
    }
}

/// The stall probe: a writer blocked with no consumer progress asks for an update
/// with R once (RFC 7609 §4.5.1 diagnostics), keeps R until unblocked.
#[test]
fn stall_probe_requests_update() {
    let v = Variant::all()[0];
    let mut sim = v.sim(32 * 1024);
    sim.write(Side::A, 12_000, false);
    sim.flush();
    assert!(
        sim.a.conn.poll_timeout().is_some(),
        "blocked writer arms the probe"
    );
    sim.take_trace();
    sim.advance(Duration::from_secs(1));
    sim.post(Side::A);
    let t = sim.take_trace();
    assert_eq!(t.len(), 1);
    assert!(t[0].cdc.prod_flags.contains(ProducerFlags::CONS_UPDATE_REQ));
    assert!(t[0].writes.is_empty());
    // Exactly one probe per stall.
    sim.advance(Duration::from_secs(5));
    assert_eq!(sim.post(Side::A), 0);
    // The reader consumes: R makes it answer at once; the writer resumes without R.
    sim.flush();
    sim.read(Side::B, 10);
    let t = send_and_receive(&mut sim, Side::B);
    assert_eq!(t.len(), 1);
    sim.read(Side::B, 20_000);
    sim.flush();
    sim.read(Side::B, 20_000);
    sim.flush();
    assert_eq!(sim.b.inband, sim.a.stream(12_000));
    assert!(!sim
        .trace
        .last()
        .unwrap()
        .cdc
        .prod_flags
        .contains(ProducerFlags::CONS_UPDATE_REQ));
}
