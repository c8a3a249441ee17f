//! Connection-level failover hooks: CHECKLIST §E.13 (TC-FO-*), B.23, RFC 7609 §4.6.
//! The link-level parts (new QP, RTokens of the new link, DELETE LINK) belong to the
//! runtime and the llc machine.

use std::time::Instant;

use super::*;

fn sim() -> Sim {
    Variant::all()[0].sim(32 * 1024)
}

/// Fail the link with everything posted by `from` lost on the wire and failed, then
/// move both sides; returns the F message `from` sent.
fn fail_all_lost(sim: &mut Sim, from: Side) -> CdcRepr {
    let mut lost = Vec::new();
    while let Some(seq) = sim.drop_in_flight(from) {
        lost.push(seq);
    }
    for seq in lost {
        sim.conn(from).on_cdc_send_failed(seq);
    }
    assert!(sim.conn(from).needs_failover());
    let f = sim.conn(from).prepare_failover().expect("F message");
    sim.host_mut(from).collect();
    f
}

/// Hand the F message to the peer (it travels first on the new link).
fn validate(sim: &mut Sim, to: Side, f: &CdcRepr) -> CdcOutcome {
    let now = sim.now;
    let h = sim.host_mut(to);
    let r = h.conn.handle_cdc(f, now, |_| 0);
    h.collect();
    r
}

/// TC-FO-02 validation_sr_ge_ok and TC-FO-04 f_message_no_seq_increment: nothing lost →
/// SR ≥ SS, the connection resumes; the F message reuses SS and the next CDC continues
/// the sequence without a gap.
#[test]
fn tc_fo_02_04_validation_ok_and_numbering() {
    let mut sim = sim();
    sim.write(Side::A, 1000, false);
    sim.flush();
    let ss = sim.a.conn.snapshot().ss;
    assert_eq!(ss, 1);
    let f = sim.a.conn.prepare_failover().unwrap();
    assert_eq!(f.seqno, ss);
    assert!(f.is_failover_validation());
    assert_eq!(f.prod_flags, ProducerFlags::FAILOVER_VALIDATION);
    assert_eq!(
        validate(&mut sim, Side::B, &f),
        CdcOutcome::FailoverValidated
    );
    assert!(sim.b.conn.error().is_none());
    sim.write(Side::A, 10, false);
    sim.take_trace();
    sim.post(Side::A);
    let t = sim.take_trace();
    assert_eq!(t[0].cdc.seqno, 2, "F consumed no seqno");
    assert_eq!(t[0].writes[0].len, 10, "nothing to replay");
    sim.flush();
    sim.read(Side::B, 2000);
    assert_eq!(sim.b.inband, sim.a.stream(1010));
}

/// TC-FO-03 validation_sr_lt_reset: the RNIC acknowledged a write that was never placed
/// (the sender saw success, the receiver never got the CDC): SR < seq → immediate reset.
#[test]
fn tc_fo_03_validation_sr_lt_reset() {
    let mut sim = sim();
    sim.write(Side::A, 1000, false);
    sim.flush();
    sim.write(Side::A, 500, false);
    sim.post(Side::A);
    let seq = sim.drop_in_flight(Side::A).unwrap();
    sim.a.conn.on_cdc_sent(seq); // "acknowledged" but not placed
    let f = sim.a.conn.prepare_failover().unwrap();
    assert_eq!(f.seqno, 2);
    assert_eq!(sim.b.conn.snapshot().sr, 1);
    let r = validate(&mut sim, Side::B, &f);
    assert_eq!(r, CdcOutcome::Aborted(AbortReason::FailoverDataLoss));
    assert!(sim.b.events.contains(Events::TCP_RESET));
    assert_eq!(sim.b.conn.state(), State::PeerAbortWait);
}

/// TC-FO-05 replay_as_is: a peer that replays with the original seqnos (§4.6.2 first
/// option) is handled idempotently: equal seqnos are processed, no byte is duplicated.
#[test]
fn tc_fo_05_replay_as_is() {
    let g = RmbeGeometry::rfc(10_000).unwrap();
    let mut c = Conn::new(ConnParams::new(g, g, 4096, 1, 2), ConnConfig::default()).unwrap();
    let now = Instant::now();
    let m1 = CdcRepr {
        seqno: 1,
        token: 1,
        prod: Cursor::new(0, 504),
        cons: Cursor::new(0, 4),
        ..CdcRepr::default()
    };
    let m2 = CdcRepr {
        seqno: 2,
        prod: Cursor::new(0, 904),
        ..m1
    };
    for m in [m1, m2, m1, m2] {
        c.handle_cdc(&m, now, |_| 0);
    }
    assert_eq!(c.rx_available().total(), 900);
    let f = CdcRepr {
        seqno: 2,
        prod_flags: ProducerFlags::FAILOVER_VALIDATION,
        ..m1
    };
    assert_eq!(c.handle_cdc(&f, now, |_| 0), CdcOutcome::FailoverValidated);
    assert_eq!(c.handle_cdc(&m2, now, |_| 0), CdcOutcome::Accepted);
    assert_eq!(c.rx_available().total(), 900);
}

/// TC-FO-06 replay_combined and TC-FO-07 no_new_data_before_replay: everything not
/// confirmed is rewritten from the last delivered position in one combined write with a
/// seqno above the failed ones, before (and together with) new data.
#[test]
fn tc_fo_06_07_replay_combined_before_new_data() {
    let mut sim = sim();
    sim.write(Side::A, 1000, false);
    sim.flush();
    sim.write(Side::A, 300, false);
    sim.post(Side::A); // seq 2
    sim.write(Side::A, 200, false);
    sim.post(Side::A); // seq 3
    let f = fail_all_lost(&mut sim, Side::A);
    assert_eq!(f.seqno, 1);
    assert_eq!(
        validate(&mut sim, Side::B, &f),
        CdcOutcome::FailoverValidated
    );
    sim.write(Side::A, 100, false); // new data
    sim.take_trace();
    sim.post(Side::A);
    let t = sim.take_trace();
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].cdc.seqno, 4, "above every failed seqno");
    assert_eq!(
        t[0].writes[0].dst_off,
        4 + 1000,
        "starts with the unconfirmed bytes"
    );
    assert_eq!(t[0].writes.iter().map(|w| w.len).sum::<u32>(), 600);
    sim.flush();
    sim.read(Side::B, 5000);
    assert_eq!(sim.b.inband, sim.a.stream(1600));
}

/// TC-FO-08: after a send failure nothing is transmitted until the connection is moved.
#[test]
fn tc_fo_08_no_transmit_until_moved() {
    let mut sim = sim();
    sim.write(Side::A, 100, false);
    sim.post(Side::A);
    sim.deliver(Side::A);
    let seq = sim.a.conn.snapshot().tx_seq;
    sim.a.conn.on_cdc_send_failed(seq);
    sim.write(Side::A, 100, false);
    assert_eq!(sim.post(Side::A), 0);
    let now = sim.now;
    sim.a.conn.close(now);
    assert_eq!(sim.post(Side::A), 0);
    // The data was delivered although its completion failed: SR ≥ SS, no loss, and
    // the replay rewrites the same bytes idempotently.
    sim.process(Side::B);
    let f = sim.a.conn.prepare_failover().unwrap();
    assert_eq!(
        validate(&mut sim, Side::B, &f),
        CdcOutcome::FailoverValidated
    );
    sim.flush();
    sim.read(Side::B, 1000);
    assert_eq!(sim.b.inband, sim.a.stream(200));
    assert!(sim.b.conn.rx_eof());
}

/// TC-FO-14 failover_with_urgent_pending: the CDC with U is lost; the replay carries U
/// again and the receiver gets the urgent byte with its mark.
#[test]
fn tc_fo_14_failover_with_urgent_pending() {
    let mut sim = sim();
    sim.write(Side::A, 100, false);
    sim.flush();
    sim.write(Side::A, 50, true);
    sim.post(Side::A);
    let f = fail_all_lost(&mut sim, Side::A);
    validate(&mut sim, Side::B, &f);
    sim.take_trace();
    sim.post(Side::A);
    let t = sim.take_trace();
    assert_eq!(
        t[0].cdc.prod_flags,
        ProducerFlags::URG_PENDING | ProducerFlags::URG_PRESENT
    );
    sim.flush();
    assert!(sim.b.conn.urgent_pending());
    assert_eq!(sim.read(Side::B, 1000), 149);
    assert_eq!(sim.read_oob(Side::B), Ok(sim.a.stream_byte(149)));
}

/// TC-FO-15 failover_with_close_pending: the CDC with C is lost; it is sent again on the
/// new link and the close completes.
#[test]
fn tc_fo_15_failover_with_close_pending() {
    let mut sim = sim();
    let now = sim.now;
    sim.a.conn.close(now);
    sim.post(Side::A);
    assert_eq!(sim.a.conn.state(), State::PeerCloseWait1);
    let f = fail_all_lost(&mut sim, Side::A);
    validate(&mut sim, Side::B, &f);
    sim.take_trace();
    sim.post(Side::A);
    let t = sim.take_trace();
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].cdc.conn_flags, ConnStateFlags::PEER_CONN_CLOSED);
    sim.flush();
    assert_eq!(sim.b.conn.state(), State::AppCloseWait1);
    sim.b.conn.close(now);
    sim.flush();
    assert_eq!(sim.a.conn.state(), State::Closed);
    assert_eq!(sim.b.conn.state(), State::Closed);
    // A side that is CLOSED and lost its final C sends it again too.
    let mut sim = super::failover::sim();
    sim.a.conn.close(now);
    sim.flush();
    sim.b.conn.close(now);
    sim.post(Side::B);
    assert_eq!(sim.b.conn.state(), State::Closed);
    let f = fail_all_lost(&mut sim, Side::B);
    validate(&mut sim, Side::A, &f);
    sim.flush();
    assert_eq!(sim.a.conn.state(), State::Closed);
    assert!(sim.a.conn.error().is_none());
}

/// A writer waiting for send-buffer space is told when a failover frees it: A fills its
/// send buffer, B gets the data and consumes it (its consumer cursor reaches A), but
/// A's send completions are lost with the link. `prepare_failover` then counts the bytes
/// B consumed as delivered — that space is WRITABLE news, or A's blocked writer sleeps for
/// ever once nothing else is in flight (each side of a busy echo stalled with exactly one
/// send buffer written in the multilink tests).
#[test]
fn failover_wakes_a_writer_whose_space_the_peer_consumed() {
    let mut sim = sim();
    let full = sim.write(Side::A, u64::MAX, false);
    assert!(full > 0);
    assert_eq!(sim.write(Side::A, 1, false), 0, "send buffer full");
    // Everything A writes is placed at B, B consumes it and tells A; A's completions
    // stay queued.
    let mut read = 0;
    for _ in 0..100 {
        if read == full {
            break;
        }
        sim.post(Side::A);
        while sim.deliver(Side::A) {}
        while sim.process(Side::B).is_some() {}
        read += sim.read(Side::B, u64::MAX);
        sim.post(Side::B);
        while sim.deliver(Side::B) {}
        while sim.process(Side::A).is_some() {}
    }
    assert_eq!(read, full);
    // B's next CDC carries its consumer cursor (CDC-5): all of it.
    sim.write(Side::B, 1, false);
    sim.post(Side::B);
    while sim.deliver(Side::B) {}
    while sim.process(Side::A).is_some() {}
    let s = sim.a.conn.snapshot();
    assert_eq!(s.tx_peer_cons, s.tx_prod, "B consumed everything");
    assert_eq!(s.tx_unacked, full, "no completion seen");
    // A's completions are lost with the link: its CDCs fail.
    assert!(!sim.fail_completions(Side::A).is_empty());
    assert!(sim.a.conn.needs_failover());
    sim.a.events = Events::empty();
    sim.a.conn.prepare_failover().expect("F message");
    sim.a.collect();
    assert!(
        sim.a.events.contains(Events::WRITABLE),
        "{:?}",
        sim.a.events
    );
    assert!(sim.write(Side::A, 1, false) > 0, "space again");
}
