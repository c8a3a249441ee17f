//! Urgent data: CHECKLIST §E.10 (TC-URG-*), B.20, AMB-42, and the Linux behaviours of
//! the kernel-peer README §V4 (a).

use std::time::{Duration, Instant};

use super::*;

const LOCAL: u32 = 0x1111;
const PEER: u32 = 0x2222;

fn lone(cfg: ConnConfig) -> Conn {
    let g = RmbeGeometry::rfc(10_000).unwrap();
    Conn::new(ConnParams::new(g, g, 32 * 1024, LOCAL, PEER), cfg).unwrap()
}

/// A CDC from the peer that only moves its consumer cursor to `cons` bytes (RFC
/// layout, wrap 0).
fn cons_update(seq: u16, cons: u32) -> CdcRepr {
    CdcRepr {
        seqno: seq,
        token: LOCAL,
        prod: Cursor::new(0, 4),
        cons: Cursor::new(0, 4 + cons),
        prod_flags: ProducerFlags::empty(),
        conn_flags: ConnStateFlags::empty(),
    }
}

fn inline_sim(inline: bool) -> Sim {
    let v = Variant::all()[0];
    let mut a = v.host(32 * 1024);
    let mut b = v.host(32 * 1024);
    a.conn.oob_inline = inline;
    b.conn.oob_inline = inline;
    Sim::new(a, b)
}

/// TC-URG-03 writer_holds_after_urgent: no RDMA WRITE after the urgent data until the
/// peer's consumer cursor has reached it (AtMark, the default) or passed it (PastMark,
/// RFC 7609 §4.7.5 step 3 read literally).
#[test]
fn tc_urg_03_writer_holds_after_urgent() {
    for (release, point) in [(UrgentRelease::AtMark, 99), (UrgentRelease::PastMark, 100)] {
        let mut c = lone(ConnConfig {
            urgent_release: release,
            ..ConnConfig::default()
        });
        let now = Instant::now();
        c.tx_commit(100, true).unwrap();
        let t = c.poll_transmit(now).unwrap();
        assert_eq!(t.data_len(), 100);
        assert!(t.cdc.prod_flags.contains(ProducerFlags::URG_PRESENT));
        assert!(c.tx_urgent_outstanding());
        c.tx_commit(50, false).unwrap();
        assert!(c.poll_transmit(now).is_none());
        // Progress short of the release point keeps the hold.
        c.handle_cdc(&cons_update(1, point - 1), now, |_| 0);
        assert!(c.poll_transmit(now).is_none(), "{release:?}");
        c.handle_cdc(&cons_update(2, point), now, |_| 0);
        let t = c.poll_transmit(now).expect("released");
        assert_eq!(t.data_len(), 50);
        assert_eq!(
            t.cdc.prod_flags,
            ProducerFlags::empty(),
            "P and U cleared (UW-3)"
        );
        assert!(!c.tx_urgent_outstanding());
    }
}

/// TC-URG-04 receiver_oob_notification: P alone raises the exception condition; the
/// byte is not there yet.
#[test]
fn tc_urg_04_receiver_oob_notification() {
    let mut c = lone(ConnConfig::default());
    let now = Instant::now();
    let mut m = cons_update(1, 0);
    m.prod_flags = ProducerFlags::URG_PENDING | ProducerFlags::WRITE_BLOCKED;
    c.handle_cdc(&m, now, |_| 0);
    assert!(c.take_events().contains(Events::URGENT));
    assert!(c.urgent_pending());
    assert_eq!(c.read_oob(), Err(OobError::WouldBlock));
    // Repeated P does not notify again.
    let mut m2 = m;
    m2.seqno = 2;
    c.handle_cdc(&m2, now, |_| 0);
    assert!(!c.take_events().contains(Events::URGENT));
    // The byte arrives: last byte before the producer cursor.
    let m3 = CdcRepr {
        seqno: 3,
        prod: Cursor::new(0, 4 + 10),
        prod_flags: ProducerFlags::URG_PENDING | ProducerFlags::URG_PRESENT,
        ..m
    };
    c.handle_cdc(&m3, now, |off| if off == 4 + 9 { b'!' } else { b'.' });
    assert!(c.take_events().contains(Events::URGENT));
    assert_eq!(c.read_oob(), Ok(b'!'));
    assert_eq!(c.read_oob(), Err(OobError::NoUrgentData), "read once");
}

/// TC-URG-05 urgent_mark_position: the OOB byte is producer − 1 of the U CDC; reads stop
/// at the mark; SIOCATMARK is true exactly there. Without OOBINLINE the byte is not in
/// the stream; with it, it is.
#[test]
fn tc_urg_05_urgent_mark_position() {
    for inline in [false, true] {
        let mut sim = inline_sim(inline);
        sim.write(Side::A, 300, false);
        sim.write(Side::A, 200, true); // urgent byte = stream byte 499
        sim.write(Side::A, 100, false);
        sim.flush();
        assert!(sim.b.conn.urgent_pending());
        assert!(!sim.b.conn.at_mark());
        assert_eq!(
            sim.read(Side::B, 10_000),
            499,
            "read stops at the mark ({inline})"
        );
        assert!(sim.b.conn.at_mark());
        if inline {
            assert_eq!(sim.read_oob(Side::B), Err(OobError::Inline));
            assert_eq!(sim.read(Side::B, 1), 1);
            assert_eq!(*sim.b.inband.last().unwrap(), sim.a.stream_byte(499));
        } else {
            assert_eq!(sim.read_oob(Side::B), Ok(sim.a.stream_byte(499)));
            assert!(sim.b.conn.at_mark(), "reading OOB does not move the mark");
        }
        assert!(!sim.b.conn.urgent_pending());
        sim.flush();
        settle(&mut sim);
        assert!(!sim.b.conn.at_mark());
        let mut want = sim.a.stream(600);
        if !inline {
            want.remove(499);
        }
        assert_eq!(sim.b.inband, want, "inline {inline}");
    }
}

/// TC-URG-06 urgent_update_regardless_of_window: consuming the urgent byte always sends
/// an update, also inline, also with a nearly empty buffer.
#[test]
fn tc_urg_06_urgent_update_regardless_of_window() {
    for inline in [false, true] {
        let mut sim = inline_sim(inline);
        sim.write(Side::A, 1, true);
        send_and_receive(&mut sim, Side::A);
        let n = sim.read(Side::B, 10);
        assert_eq!(n, if inline { 1 } else { 0 });
        let t = send_and_receive(&mut sim, Side::B);
        assert_eq!(t.len(), 1, "inline {inline}");
        assert_eq!(t[0].cdc.cons, Cursor::new(0, 5));
    }
}

/// Kernel-peer §V4 (a), connection 3, with us as the sender: the Linux receiver read up
/// to the mark before the urgent CDC arrived, reads the byte out of band, and leaves
/// its consumer cursor *on* the urgent byte without sending an update. We probe with R
/// after the stall interval; Linux answers R with its cursor; the default release point
/// (AtMark) lets us continue. PastMark would wait forever.
#[test]
fn linux_receiver_leaving_cursor_on_urgent_byte_does_not_deadlock() {
    for (release, resumes) in [
        (UrgentRelease::AtMark, true),
        (UrgentRelease::PastMark, false),
    ] {
        let mut c = lone(ConnConfig {
            urgent_release: release,
            ..ConnConfig::default()
        });
        let now = Instant::now();
        c.tx_commit(1000, false).unwrap();
        let t = c.poll_transmit(now).unwrap();
        c.on_cdc_sent(t.cdc.seqno);
        c.tx_commit(1, true).unwrap();
        let t = c.poll_transmit(now).unwrap();
        assert_eq!(t.cdc.prod, Cursor::new(0, 1005));
        assert_eq!(
            t.cdc.prod_flags,
            ProducerFlags::URG_PENDING | ProducerFlags::URG_PRESENT
        );
        c.on_cdc_sent(t.cdc.seqno);
        c.tx_commit(2000, false).unwrap();
        assert!(c.poll_transmit(now).is_none(), "held");
        // Linux says nothing. After the stall interval we ask (R, no data, no P/U).
        let deadline = c.poll_timeout().expect("stall probe armed");
        assert_eq!(deadline, now + Duration::from_secs(1));
        c.on_timeout(deadline);
        let t = c.poll_transmit(deadline).expect("probe");
        assert_eq!(t.cdc.prod_flags, ProducerFlags::CONS_UPDATE_REQ);
        assert!(t.writes().is_empty());
        c.on_cdc_sent(t.cdc.seqno);
        // Linux answers with its cursor on the urgent byte (offset 1000 + 4).
        c.handle_cdc(&cons_update(1, 1000), deadline, |_| 0);
        match c.poll_transmit(deadline) {
            Some(t) => {
                assert!(resumes, "{release:?}");
                assert_eq!(t.data_len(), 2000);
                // R stays on until we are no longer blocked, so Linux keeps updating.
                assert!(t.cdc.prod_flags.contains(ProducerFlags::CONS_UPDATE_REQ));
            }
            None => assert!(!resumes, "{release:?}"),
        }
    }
}

/// The same ordering with us as the receiver: the reader already consumed everything
/// before the mark when U arrives; we step over the byte and tell the writer at once
/// (a Linux writer waits for its whole data to be consumed, `urg_tx_pend`).
#[test]
fn receiver_always_advances_past_the_urgent_byte() {
    for inline in [false, true] {
        let mut sim = inline_sim(inline);
        sim.write(Side::A, 1000, false);
        sim.flush();
        sim.read(Side::B, 1000);
        assert_eq!(sim.post(Side::B), 0);
        sim.write(Side::A, 1, true);
        send_and_receive(&mut sim, Side::A);
        if inline {
            assert!(sim.b.conn.at_mark());
            assert_eq!(sim.read(Side::B, 10), 1);
        } else {
            assert!(sim.b.conn.at_mark());
            assert_eq!(sim.b.conn.rx_consumed(), 1001, "skipped at arrival");
        }
        let t = send_and_receive(&mut sim, Side::B);
        assert_eq!(t.len(), 1, "inline {inline}");
        assert_eq!(t[0].cdc.cons, Cursor::new(0, 1005));
        assert!(!sim.a.conn.tx_urgent_outstanding());
    }
}

/// A second urgent byte committed before the first could be written supersedes it:
/// only the newest mark is announced, the older byte travels in-band (BSD semantics).
#[test]
fn newer_urgent_byte_supersedes_unsent_one() {
    let v = Variant::all()[0];
    let mut sim = v.sim_at(32 * 1024, 0, 4);
    // Close the window so that nothing is written yet.
    sim.write(Side::A, 9996, false);
    sim.flush();
    sim.take_trace();
    sim.write(Side::A, 10, true); // stream byte 10005
    sim.write(Side::A, 10, true); // stream byte 10015
    sim.read(Side::B, 9996);
    settle(&mut sim);
    let u: Vec<_> = sim
        .trace
        .iter()
        .filter(|t| t.cdc.prod_flags.contains(ProducerFlags::URG_PRESENT))
        .collect();
    assert_eq!(u.len(), 1);
    assert_eq!(u[0].cdc.prod, v.geom.cursor_at(10_016));
    let mut want = sim.a.stream(10_016);
    want.remove(10_015);
    assert_eq!(sim.b.inband, want);
}
