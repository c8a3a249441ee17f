//! RFC 7609 §4.7 data-flow scenarios 1–6 as golden traces (CHECKLIST B.21), with the
//! corrected values of AMB-40, on the RFC and the Linux RMBE layouts and under both
//! consumer-update policies.

use super::*;

/// TC-FLOW-01 / B.21 Scenario 1 (Fig 16): one write, producer 1004, no consumer CDC.
#[test]
fn tc_flow_01_scenario1_trace() {
    for v in Variant::all() {
        let mut sim = v.sim(32 * 1024);
        assert_eq!(sim.write(Side::A, 1000, false), 1000);
        let t = send_and_receive(&mut sim, Side::A);
        assert_eq!(t.len(), 1, "{v:?}");
        check(
            &t[0],
            Expect {
                from: Side::A,
                writes: vec![(0, 1000, v.off(4))],
                seq: 1,
                prod: v.cursor(0, 1004),
                cons: v.cursor(0, 4),
                pf: pf_none(),
                cf: cf_none(),
            },
        );
        assert!(sim.b.events.contains(Events::READABLE));
        assert_eq!(sim.read(Side::B, 10_000), 1000);
        assert_eq!(sim.b.inband, sim.a.stream(1000));
        // Window 8,996 > cap/2: no consumer update.
        assert_eq!(sim.post(Side::B), 0, "{v:?}");
        let s = sim.b.conn.snapshot();
        assert_eq!(s.rx_cons, v.cursor(0, 1004));
        assert_eq!(s.rx_cons_sent, v.cursor(0, 4));
        // The send completion reclaims A's sndbuf.
        assert_eq!(sim.a.conn.tx_outstanding(), 1000);
        assert!(sim.complete(Side::A));
        assert_eq!(sim.a.conn.tx_outstanding(), 0);
    }
}

/// TC-FLOW-02 / B.21 Scenario 2 (Fig 17): the consumer cursor rides on B's data CDC.
#[test]
fn tc_flow_02_scenario2_piggyback() {
    for v in Variant::all() {
        let mut sim = v.sim(32 * 1024);
        sim.write(Side::A, 1000, false);
        send_and_receive(&mut sim, Side::A);
        sim.read(Side::B, 10_000);
        assert_eq!(sim.post(Side::B), 0);
        sim.write(Side::B, 500, false);
        let t = send_and_receive(&mut sim, Side::B);
        assert_eq!(t.len(), 1);
        check(
            &t[0],
            Expect {
                from: Side::B,
                writes: vec![(0, 500, v.off(4))],
                seq: 1,
                prod: v.cursor(0, 504),
                cons: v.cursor(0, 1004),
                pf: pf_none(),
                cf: cf_none(),
            },
        );
        assert_eq!(sim.b.conn.snapshot().rx_cons_sent, v.cursor(0, 1004));
        assert_eq!(sim.a.conn.snapshot().tx_peer_cons, v.cursor(0, 1004));
    }
}

/// TC-FLOW-03 / B.21 Scenario 3 (Fig 18): the update comes only after the second send.
#[test]
fn tc_flow_03_scenario3_constrained_update() {
    for v in Variant::all() {
        let mut sim = v.sim(32 * 1024);
        sim.write(Side::A, 3000, false);
        let t = send_and_receive(&mut sim, Side::A);
        check(
            &t[0],
            Expect {
                from: Side::A,
                writes: vec![(0, 3000, v.off(4))],
                seq: 1,
                prod: v.cursor(0, 3004),
                cons: v.cursor(0, 4),
                pf: pf_none(),
                cf: cf_none(),
            },
        );
        sim.read(Side::B, 10_000);
        assert_eq!(
            sim.post(Side::B),
            0,
            "window 6,996 is not constrained ({v:?})"
        );
        sim.write(Side::A, 4000, false);
        let t = send_and_receive(&mut sim, Side::A);
        check(
            &t[0],
            Expect {
                from: Side::A,
                writes: vec![(3000, 4000, v.off(3004))],
                seq: 2,
                prod: v.cursor(0, 7004),
                cons: v.cursor(0, 4),
                pf: pf_none(),
                cf: cf_none(),
            },
        );
        sim.read(Side::B, 10_000);
        let t = send_and_receive(&mut sim, Side::B);
        assert_eq!(
            t.len(),
            1,
            "window 2,996 < 4,998 and gain 7,000: update ({v:?})"
        );
        check(
            &t[0],
            Expect {
                from: Side::B,
                writes: vec![],
                seq: 1,
                prod: v.cursor(0, 4),
                cons: v.cursor(0, 7004),
                pf: pf_none(),
                cf: cf_none(),
            },
        );
        assert_eq!(sim.a.conn.snapshot().tx_peer_cons, v.cursor(0, 7004));
    }
}

/// TC-FLOW-05 / B.21 Scenario 4 (Fig 19): full-window writes split at the RMBE end,
/// wrap 1 → 2 → 3, B set while data is left, the receiver updates because of B, and
/// the final 8 bytes land at 1004..1011.
#[test]
fn tc_flow_05_scenario4_full_window() {
    for v in Variant::all() {
        let mut sim = v.sim_at(20_000, 1, 1004);
        assert_eq!(sim.write(Side::A, 20_000, false), 20_000);
        let t = send_and_receive(&mut sim, Side::A);
        assert_eq!(t.len(), 1);
        check(
            &t[0],
            Expect {
                from: Side::A,
                writes: vec![(0, 8996, v.off(1004)), (8996, 1000, v.off(4))],
                seq: 1,
                prod: v.cursor(2, 1004),
                cons: v.cursor(1, 1004),
                pf: ProducerFlags::WRITE_BLOCKED,
                cf: cf_none(),
            },
        );
        // Equal offsets, wraps one apart: a full window of data.
        assert_eq!(sim.b.conn.rx_available().total(), 9996);
        assert_eq!(sim.read(Side::B, 10_000), 9996);
        let t = send_and_receive(&mut sim, Side::B);
        check(
            &t[0],
            Expect {
                from: Side::B,
                writes: vec![],
                seq: 1,
                prod: v.cursor(1, 1004),
                cons: v.cursor(2, 1004),
                pf: pf_none(),
                cf: cf_none(),
            },
        );
        let t = send_and_receive(&mut sim, Side::A);
        check(
            &t[0],
            Expect {
                from: Side::A,
                writes: vec![(9996, 8996, v.off(1004)), (18_992, 1000, v.off(4))],
                seq: 2,
                prod: v.cursor(3, 1004),
                cons: v.cursor(1, 1004),
                pf: ProducerFlags::WRITE_BLOCKED,
                cf: cf_none(),
            },
        );
        assert_eq!(sim.read(Side::B, 10_000), 9996);
        let t = send_and_receive(&mut sim, Side::B);
        check(
            &t[0],
            Expect {
                from: Side::B,
                writes: vec![],
                seq: 2,
                prod: v.cursor(1, 1004),
                cons: v.cursor(3, 1004),
                pf: pf_none(),
                cf: cf_none(),
            },
        );
        let t = send_and_receive(&mut sim, Side::A);
        assert_eq!(t.len(), 1);
        check(
            &t[0],
            Expect {
                from: Side::A,
                writes: vec![(19_992, 8, v.off(1004))],
                seq: 3,
                prod: v.cursor(3, 1012),
                cons: v.cursor(1, 1004),
                pf: pf_none(),
                cf: cf_none(),
            },
        );
        sim.read(Side::B, 10_000);
        assert_eq!(sim.b.inband, sim.a.stream(20_000));
        // B = 0 now and the window is wide open: no further update.
        assert_eq!(sim.post(Side::B), 0);
        assert!(sim.a.eye_catcher_intact() && sim.b.eye_catcher_intact());
    }
}

/// TC-URG-01 / B.21 Scenario 5 (Fig 20): urgent data with the window open.
#[test]
fn tc_urg_01_scenario5_trace() {
    for v in Variant::all() {
        let mut sim = v.sim_at(32 * 1024, 1, 1000);
        assert_eq!(sim.write(Side::A, 500, true), 500);
        let t = send_and_receive(&mut sim, Side::A);
        assert_eq!(t.len(), 1);
        check(
            &t[0],
            Expect {
                from: Side::A,
                writes: vec![(0, 500, v.off(1000))],
                seq: 1,
                prod: v.cursor(1, 1500),
                cons: v.cursor(1, 1000),
                pf: ProducerFlags::URG_PENDING | ProducerFlags::URG_PRESENT,
                cf: cf_none(),
            },
        );
        // The application then sends 1,000 normal bytes: copied, not written yet.
        assert_eq!(sim.write(Side::A, 1000, false), 1000);
        assert_eq!(
            sim.post(Side::A),
            0,
            "no RDMA write before the urgent data is consumed"
        );
        // B: OOB notification, then it reads up to the mark and the urgent byte.
        assert!(sim.b.events.contains(Events::URGENT));
        assert!(sim.b.conn.urgent_pending());
        assert_eq!(sim.read(Side::B, 10_000), 499);
        assert!(sim.b.conn.at_mark());
        assert_eq!(sim.read_oob(Side::B), Ok(sim.a.stream_byte(499)));
        let t = send_and_receive(&mut sim, Side::B);
        assert_eq!(t.len(), 1, "mandatory update whatever the window ({v:?})");
        check(
            &t[0],
            Expect {
                from: Side::B,
                writes: vec![],
                seq: 1,
                prod: v.cursor(1, 1000),
                cons: v.cursor(1, 1500),
                pf: pf_none(),
                cf: cf_none(),
            },
        );
        let t = send_and_receive(&mut sim, Side::A);
        assert_eq!(t.len(), 1);
        check(
            &t[0],
            Expect {
                from: Side::A,
                writes: vec![(500, 1000, v.off(1500))],
                seq: 2,
                prod: v.cursor(1, 2500),
                cons: v.cursor(1, 1000),
                pf: pf_none(),
                cf: cf_none(),
            },
        );
        assert_eq!(sim.read(Side::B, 10_000), 1000);
        assert_eq!(sim.post(Side::B), 0, "window unconstrained: no update");
        let mut want = sim.a.stream(1500);
        want.remove(499);
        assert_eq!(sim.b.inband, want);
    }
}

/// TC-URG-02 / B.21 Scenario 6 (Fig 21): urgent data while the window is closed.
#[test]
fn tc_urg_02_scenario6_trace() {
    for v in Variant::all() {
        let mut sim = v.sim_at(32 * 1024, 1, 1000);
        // Fill B's receive buffer: A's producer (2, 1000), B's consumer (1, 1000).
        assert_eq!(sim.write(Side::A, 9996, false), 9996);
        let t = send_and_receive(&mut sim, Side::A);
        assert_eq!(t[0].cdc.prod, v.cursor(2, 1000));
        assert!(sim.complete(Side::A));
        // 1. 500 urgent bytes: no window, so a data-less CDC with P and B.
        assert_eq!(sim.write(Side::A, 500, true), 500);
        let t = send_and_receive(&mut sim, Side::A);
        assert_eq!(t.len(), 1);
        check(
            &t[0],
            Expect {
                from: Side::A,
                writes: vec![],
                seq: 2,
                prod: v.cursor(2, 1000),
                cons: v.cursor(1, 1000),
                pf: ProducerFlags::URG_PENDING | ProducerFlags::WRITE_BLOCKED,
                cf: cf_none(),
            },
        );
        assert_eq!(sim.write(Side::A, 1000, false), 1000);
        assert_eq!(sim.post(Side::A), 0);
        // 2. B is notified, has no urgent byte yet, drains the window and updates.
        assert!(sim.b.events.contains(Events::URGENT));
        assert_eq!(sim.read_oob(Side::B), Err(OobError::WouldBlock));
        assert_eq!(sim.read(Side::B, 20_000), 9996);
        let t = send_and_receive(&mut sim, Side::B);
        assert_eq!(t.len(), 1);
        check(
            &t[0],
            Expect {
                from: Side::B,
                writes: vec![],
                seq: 1,
                prod: v.cursor(1, 1000),
                cons: v.cursor(2, 1000),
                pf: pf_none(),
                cf: cf_none(),
            },
        );
        // 3./4. A writes the urgent data: U, P, B cleared.
        let t = send_and_receive(&mut sim, Side::A);
        assert_eq!(t.len(), 1);
        check(
            &t[0],
            Expect {
                from: Side::A,
                writes: vec![(9996, 500, v.off(1000))],
                seq: 3,
                prod: v.cursor(2, 1500),
                cons: v.cursor(1, 1000),
                pf: ProducerFlags::URG_PENDING | ProducerFlags::URG_PRESENT,
                cf: cf_none(),
            },
        );
        // 5. B consumes the urgent data and updates.
        assert_eq!(sim.read(Side::B, 20_000), 499);
        assert_eq!(sim.read_oob(Side::B), Ok(sim.a.stream_byte(10_495)));
        let t = send_and_receive(&mut sim, Side::B);
        assert_eq!(t.len(), 1);
        check(
            &t[0],
            Expect {
                from: Side::B,
                writes: vec![],
                seq: 2,
                prod: v.cursor(1, 1000),
                cons: v.cursor(2, 1500),
                pf: pf_none(),
                cf: cf_none(),
            },
        );
        // 6./7. Normal data, P and U cleared.
        let t = send_and_receive(&mut sim, Side::A);
        assert_eq!(t.len(), 1);
        check(
            &t[0],
            Expect {
                from: Side::A,
                writes: vec![(10_496, 1000, v.off(1500))],
                seq: 4,
                prod: v.cursor(2, 2500),
                cons: v.cursor(1, 1000),
                pf: pf_none(),
                cf: cf_none(),
            },
        );
        sim.read(Side::B, 20_000);
        let mut want = sim.a.stream(11_496);
        want.remove(10_495);
        assert_eq!(sim.b.inband, want);
    }
}
