//! Termination: CHECKLIST §E.14 (TC-TERM-*, TC-ABRT-*), B.24 (Fig 22), B.25 (Fig 23),
//! AMB-44, and the RMBE reuse rules TC-RMBE-03/04.

use std::time::Duration;

use super::*;

fn sim() -> Sim {
    Variant::all()[0].sim(32 * 1024)
}

fn state(sim: &Sim, side: Side) -> State {
    sim.host(side).conn.state()
}

fn clear_events(sim: &mut Sim) {
    sim.a.events = Events::empty();
    sim.b.events = Events::empty();
}

fn close(sim: &mut Sim, side: Side) {
    let now = sim.now;
    sim.conn(side).close(now);
    sim.host_mut(side).collect();
}

fn shutdown(sim: &mut Sim, side: Side) {
    let now = sim.now;
    sim.conn(side).shutdown_write(now).unwrap();
    sim.host_mut(side).collect();
}

/// Post one side's CDCs, deliver and process them, and complete them.
fn exchange(sim: &mut Sim, from: Side) -> Vec<TraceItem> {
    let t = send_and_receive(sim, from);
    while sim.complete(from) {}
    t
}

/// TC-TERM-01 active_close_full (Fig 22: 3A, 4A, 4C, 3C): close → C → PeerCloseWait1;
/// the peer closes → C → both CLOSED; TCP FIN only after our C completed.
#[test]
fn tc_term_01_active_close_full() {
    let mut sim = sim();
    sim.write(Side::A, 100, false);
    sim.flush();
    sim.read(Side::B, 100);
    sim.take_trace();
    clear_events(&mut sim);
    close(&mut sim, Side::A);
    assert_eq!(state(&sim, Side::A), State::Active, "C not posted yet");
    let t = exchange(&mut sim, Side::A);
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].cdc.conn_flags, ConnStateFlags::PEER_CONN_CLOSED);
    assert!(t[0].writes.is_empty());
    assert_eq!(state(&sim, Side::A), State::PeerCloseWait1);
    assert!(sim.a.events.contains(Events::TCP_SHUTDOWN));
    assert_eq!(state(&sim, Side::B), State::AppCloseWait1);
    assert!(sim.b.events.contains(Events::PEER_DONE | Events::READABLE));
    assert!(sim.b.conn.rx_eof());
    assert!(!sim.b.events.contains(Events::CLOSED));
    // The passive side cannot write any more: the peer will not read.
    assert_eq!(sim.b.conn.tx_space(), Err(ConnError::PeerClosed));
    close(&mut sim, Side::B);
    let t = exchange(&mut sim, Side::B);
    assert_eq!(t[0].cdc.conn_flags, ConnStateFlags::PEER_CONN_CLOSED);
    assert_eq!(
        state(&sim, Side::B),
        State::Closed,
        "4C: the peer's C was already here"
    );
    assert_eq!(state(&sim, Side::A), State::Closed, "3C");
    for s in [Side::A, Side::B] {
        let h = sim.host(s);
        assert!(h.events.contains(Events::CLOSED));
        assert!(!h.events.contains(Events::TCP_RESET));
        assert!(h.conn.error().is_none());
        assert!(h.conn.poll_timeout().is_none());
    }
}

/// TC-TERM-02 shutdown_wr_path (3A with D, 4A, 4C, 3D, 4D).
#[test]
fn tc_term_02_shutdown_wr_path() {
    let mut sim = sim();
    shutdown(&mut sim, Side::A);
    let t = exchange(&mut sim, Side::A);
    assert_eq!(t[0].cdc.conn_flags, ConnStateFlags::PEER_DONE_WRITING);
    assert_eq!(state(&sim, Side::A), State::PeerCloseWait1);
    assert_eq!(state(&sim, Side::B), State::AppCloseWait1);
    assert!(sim.b.conn.rx_eof());
    assert_eq!(sim.a.conn.tx_space(), Err(ConnError::SendShutdown));
    close(&mut sim, Side::B);
    exchange(&mut sim, Side::B);
    assert_eq!(state(&sim, Side::B), State::PeerFinCloseWait);
    assert_eq!(state(&sim, Side::A), State::AppFinCloseWait, "3D");
    close(&mut sim, Side::A);
    let t = exchange(&mut sim, Side::A);
    assert_eq!(
        t[0].cdc.conn_flags,
        ConnStateFlags::PEER_DONE_WRITING | ConnStateFlags::PEER_CONN_CLOSED,
        "D stays set, as Linux sends 0xC0"
    );
    assert_eq!(state(&sim, Side::A), State::Closed);
    assert_eq!(state(&sim, Side::B), State::Closed, "4D");
}

/// TC-TERM-03 passive_path_4A_4D: D received → AppCloseWait1 → SHUT_WR → D
/// (AppCloseWait2) → close → C → PeerFinCloseWait → C → CLOSED; and with C received
/// first, the final close goes straight to CLOSED.
#[test]
fn tc_term_03_passive_path_4a_4d() {
    let mut sim = sim();
    shutdown(&mut sim, Side::A);
    exchange(&mut sim, Side::A);
    assert_eq!(state(&sim, Side::B), State::AppCloseWait1);
    shutdown(&mut sim, Side::B);
    exchange(&mut sim, Side::B);
    assert_eq!(state(&sim, Side::B), State::AppCloseWait2, "4B");
    assert_eq!(state(&sim, Side::A), State::PeerCloseWait2, "3B");
    close(&mut sim, Side::B);
    exchange(&mut sim, Side::B);
    assert_eq!(state(&sim, Side::B), State::PeerFinCloseWait, "4C");
    assert_eq!(state(&sim, Side::A), State::AppFinCloseWait, "3D");
    close(&mut sim, Side::A);
    exchange(&mut sim, Side::A);
    assert_eq!(state(&sim, Side::A), State::Closed);
    assert_eq!(state(&sim, Side::B), State::Closed, "4D");

    // Peer's C first: AppCloseWait1 → (D) AppCloseWait2 → (C) CLOSED.
    let mut sim = super::term::sim();
    close(&mut sim, Side::A);
    exchange(&mut sim, Side::A);
    shutdown(&mut sim, Side::B);
    exchange(&mut sim, Side::B);
    assert_eq!(state(&sim, Side::B), State::AppCloseWait2);
    assert_eq!(state(&sim, Side::A), State::PeerCloseWait2);
    close(&mut sim, Side::B);
    exchange(&mut sim, Side::B);
    assert_eq!(
        state(&sim, Side::B),
        State::Closed,
        "TRM-4: the peer's C was remembered"
    );
    assert_eq!(state(&sim, Side::A), State::Closed);
}

/// TC-TERM-04 close_with_unread_data_aborts (3A → Fig 23): A + TCP RST; the peer
/// reports a reset, answers with A; both CLOSED.
#[test]
fn tc_term_04_close_with_unread_data_aborts() {
    let mut sim = sim();
    sim.write(Side::A, 1000, false);
    sim.flush();
    sim.read(Side::B, 10);
    sim.take_trace();
    clear_events(&mut sim);
    close(&mut sim, Side::B);
    assert_eq!(state(&sim, Side::B), State::PeerAbortWait);
    assert!(sim.b.events.contains(Events::TCP_RESET));
    assert_eq!(
        sim.b.conn.error(),
        Some(ConnError::Aborted(AbortReason::UnreadDataOnClose))
    );
    let t = exchange(&mut sim, Side::B);
    assert_eq!(t[0].cdc.conn_flags, ConnStateFlags::PEER_CONN_ABORT);
    assert_eq!(state(&sim, Side::A), State::ProcessAbort);
    let e = sim.a.conn.error().unwrap();
    assert_eq!(e.io_kind(), std::io::ErrorKind::ConnectionReset);
    let t = exchange(&mut sim, Side::A);
    assert_eq!(t[0].cdc.conn_flags, ConnStateFlags::PEER_CONN_ABORT);
    assert_eq!(
        state(&sim, Side::A),
        State::Closed,
        "2B: after our A completed"
    );
    assert_eq!(state(&sim, Side::B), State::Closed, "1B");
}

/// An abort crossing the peer's C (B closes with unread data while A's C is on its
/// way): A's C arriving in PeerAbortWait ends B's wait, since no A follows a C (TRM-2).
/// B is CLOSED once its own A is confirmed — at once if it was, else through
/// ProcessAbort — and A takes B's A after its own C. Both CLOSED without a timer.
#[test]
fn an_abort_crossing_the_peers_close_ends_without_the_abort_timer() {
    // How far B's A got before A's C arrives: confirmed, posted only, not posted.
    for stage in 0..3 {
        let mut sim = sim();
        sim.write(Side::A, 1000, false);
        sim.flush();
        close(&mut sim, Side::A);
        sim.post(Side::A);
        close(&mut sim, Side::B);
        assert_eq!(state(&sim, Side::B), State::PeerAbortWait);
        sim.take_trace();
        if stage < 2 {
            assert_eq!(sim.post(Side::B), 1);
        }
        if stage == 0 {
            while sim.deliver(Side::B) {}
            while sim.complete(Side::B) {}
        }
        sim.deliver(Side::A);
        sim.process(Side::B);
        if stage == 0 {
            assert_eq!(state(&sim, Side::B), State::Closed, "A's C ends the wait");
        } else {
            // Until its A is confirmed (a failover would still replay it).
            assert_eq!(state(&sim, Side::B), State::ProcessAbort, "stage {stage}");
            sim.post(Side::B);
            while sim.deliver(Side::B) {}
            while sim.complete(Side::B) {}
            assert_eq!(
                state(&sim, Side::B),
                State::Closed,
                "once its A is confirmed"
            );
        }
        let t = sim.take_trace();
        let from_b: Vec<_> = t.iter().filter(|i| i.from == Side::B).collect();
        assert_eq!(from_b.len(), 1, "one A from B, nothing else");
        assert_eq!(from_b[0].cdc.conn_flags, ConnStateFlags::PEER_CONN_ABORT);
        while sim.process(Side::A).is_some() {}
        assert_eq!(state(&sim, Side::A), State::Closed);
        assert_eq!(sim.post(Side::A), 0, "nothing follows A's C");
    }
}

/// TC-TERM-05 pending_close: close() returns at once; C goes out only after all data
/// was written and every WRITE/CDC completed.
#[test]
fn tc_term_05_pending_close() {
    let mut sim = sim();
    sim.write(Side::A, 15_000, false);
    close(&mut sim, Side::A);
    assert_eq!(state(&sim, Side::A), State::Active);
    let t = send_and_receive(&mut sim, Side::A);
    assert_eq!(t.len(), 1, "data only");
    assert_eq!(t[0].cdc.conn_flags, ConnStateFlags::empty());
    sim.read(Side::B, 20_000);
    exchange(&mut sim, Side::B);
    // The rest of the data; C still waits for its completion.
    let t = send_and_receive(&mut sim, Side::A);
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].cdc.conn_flags, ConnStateFlags::empty());
    assert_eq!(sim.post(Side::A), 0, "writes not complete yet");
    while sim.complete(Side::A) {}
    let t = send_and_receive(&mut sim, Side::A);
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].cdc.conn_flags, ConnStateFlags::PEER_CONN_CLOSED);
    assert_eq!(state(&sim, Side::A), State::PeerCloseWait1);
    sim.read(Side::B, 20_000);
    assert_eq!(sim.b.inband, sim.a.stream(15_000));
    assert!(sim.b.conn.rx_eof());
}

/// TC-TERM-06 passive_c_with_pending_tx: the peer's C while we still have data to
/// send resets the connection (4A).
#[test]
fn tc_term_06_passive_c_with_pending_tx() {
    let mut sim = sim();
    close(&mut sim, Side::A);
    sim.post(Side::A);
    sim.write(Side::B, 500, false); // committed, not yet posted
    sim.deliver(Side::A);
    sim.process(Side::B);
    assert_eq!(
        sim.b.conn.error(),
        Some(ConnError::Aborted(AbortReason::PeerClosedWithPendingData))
    );
    assert!(sim.b.events.contains(Events::TCP_RESET));
    // The peer's C is in: no A will answer ours (TRM-2), so B does not wait for one.
    assert_eq!(state(&sim, Side::B), State::ProcessAbort);
    sim.take_trace();
    let t = exchange(&mut sim, Side::B);
    assert_eq!(t.len(), 1, "A only, the data is dropped");
    assert_eq!(t[0].cdc.conn_flags, ConnStateFlags::PEER_CONN_ABORT);
    assert!(t[0].writes.is_empty());
    // A already sent C: nothing more from A, CLOSED at once.
    assert_eq!(state(&sim, Side::A), State::Closed);
    assert_eq!(sim.post(Side::A), 0);
    // B is CLOSED once its A is confirmed, not after the 1B timer.
    assert_eq!(state(&sim, Side::B), State::Closed);
}

/// A close with unread data after the peer's C (AppCloseWait1): A goes out (3A), and the
/// connection is CLOSED once it is confirmed; no A from the peer is awaited (TRM-2:
/// nothing follows its C), so the RMBE is not held until the 1B timer.
#[test]
fn close_with_unread_data_after_the_peers_close_does_not_wait_for_an_abort() {
    let mut sim = sim();
    sim.write(Side::A, 1000, false);
    sim.flush();
    close(&mut sim, Side::A);
    sim.flush();
    assert_eq!(state(&sim, Side::B), State::AppCloseWait1);
    assert_eq!(state(&sim, Side::A), State::PeerCloseWait1);
    sim.take_trace();
    clear_events(&mut sim);
    close(&mut sim, Side::B);
    assert_eq!(
        sim.b.conn.error(),
        Some(ConnError::Aborted(AbortReason::UnreadDataOnClose))
    );
    assert_eq!(state(&sim, Side::B), State::ProcessAbort);
    let t = exchange(&mut sim, Side::B);
    assert_eq!(t[0].cdc.conn_flags, ConnStateFlags::PEER_CONN_ABORT);
    assert_eq!(state(&sim, Side::B), State::Closed);
    assert_eq!(state(&sim, Side::A), State::Closed);
    assert_eq!(sim.post(Side::A), 0, "nothing follows A's C");
}

/// TC-TERM-07 simultaneous_close: both take path 3 and end CLOSED.
#[test]
fn tc_term_07_simultaneous_close() {
    let mut sim = sim();
    close(&mut sim, Side::A);
    close(&mut sim, Side::B);
    sim.post_all();
    assert_eq!(state(&sim, Side::A), State::PeerCloseWait1);
    assert_eq!(state(&sim, Side::B), State::PeerCloseWait1);
    sim.flush();
    assert_eq!(state(&sim, Side::A), State::Closed);
    assert_eq!(state(&sim, Side::B), State::Closed);
    assert!(sim.a.conn.error().is_none() && sim.b.conn.error().is_none());
    // Simultaneous half-close, then close.
    let mut sim = super::term::sim();
    shutdown(&mut sim, Side::A);
    shutdown(&mut sim, Side::B);
    sim.flush();
    assert_eq!(state(&sim, Side::A), State::PeerCloseWait2);
    assert_eq!(state(&sim, Side::B), State::PeerCloseWait2);
    close(&mut sim, Side::A);
    close(&mut sim, Side::B);
    sim.flush();
    assert_eq!(state(&sim, Side::A), State::Closed);
    assert_eq!(state(&sim, Side::B), State::Closed);
}

/// TC-TERM-08 peerclosewait_timeout / TC-RMBE-04 reuse_after_timeout: the peer never
/// answers → TCP reset, no more writes, RMBE free.
#[test]
fn tc_term_08_peerclosewait_timeout() {
    let mut sim = sim();
    close(&mut sim, Side::A);
    sim.post(Side::A);
    sim.complete(Side::A); // nothing queued for completion yet: no-op
    sim.deliver(Side::A); // B's host is dead: never processes it
    sim.complete(Side::A);
    let deadline = sim.a.conn.poll_timeout().unwrap();
    assert_eq!(deadline, sim.now + Duration::from_secs(60));
    sim.advance(Duration::from_secs(59));
    assert_eq!(state(&sim, Side::A), State::PeerCloseWait1);
    clear_events(&mut sim);
    sim.advance(Duration::from_secs(1));
    assert_eq!(state(&sim, Side::A), State::Closed);
    assert!(sim.a.events.contains(Events::TCP_RESET | Events::CLOSED));
    assert_eq!(
        sim.a.conn.error().unwrap().io_kind(),
        std::io::ErrorKind::TimedOut
    );
    assert_eq!(sim.post(Side::A), 0);
    // The same for PeerFinCloseWait.
    let mut sim = super::term::sim();
    shutdown(&mut sim, Side::A);
    exchange(&mut sim, Side::A);
    close(&mut sim, Side::B);
    sim.post(Side::B);
    assert_eq!(state(&sim, Side::B), State::PeerFinCloseWait);
    sim.advance(Duration::from_secs(60));
    assert_eq!(state(&sim, Side::B), State::Closed);
}

/// Fuzz finding (`conn_cdc`): a pending close whose peer never opens its window again
/// used to wait forever (state ACTIVE, no timer). After the termination timer the
/// connection aborts: A, TCP reset, error `CloseTimeout`, then CLOSED.
#[test]
fn pending_close_gives_up_when_the_peer_never_reads() {
    let mut sim = sim();
    sim.write(Side::A, 15_000, false); // more than B's RMBE holds
    close(&mut sim, Side::A);
    exchange(&mut sim, Side::A);
    assert_eq!(state(&sim, Side::A), State::Active, "C waits for the data");
    let deadline = sim.now + Duration::from_secs(60);
    assert!(sim.a.conn.poll_timeout().is_some_and(|t| t <= deadline));
    // B's application never reads. The stall probe (R) is answered; nothing moves.
    sim.advance(Duration::from_secs(30));
    sim.flush();
    assert_eq!(state(&sim, Side::A), State::Active);
    clear_events(&mut sim);
    sim.advance(Duration::from_secs(30));
    assert_eq!(
        sim.a.conn.error(),
        Some(ConnError::Aborted(AbortReason::CloseTimeout))
    );
    assert!(sim.a.events.contains(Events::TCP_RESET));
    assert_eq!(state(&sim, Side::A), State::PeerAbortWait);
    let t = exchange(&mut sim, Side::A);
    assert_eq!(
        t.last().unwrap().cdc.conn_flags,
        ConnStateFlags::PEER_CONN_ABORT
    );
    // The peer learns of it (A), answers, and both end CLOSED.
    sim.flush();
    assert_eq!(state(&sim, Side::A), State::Closed);
    assert_eq!(
        sim.b.conn.error(),
        Some(ConnError::Aborted(AbortReason::PeerAbort))
    );
    // A peer that reads in time is not affected: the data and C go out (TC-TERM-05).
    let mut sim = super::term::sim();
    sim.write(Side::A, 15_000, false);
    close(&mut sim, Side::A);
    exchange(&mut sim, Side::A);
    sim.advance(Duration::from_secs(59));
    settle(&mut sim);
    assert_eq!(sim.b.inband, sim.a.stream(15_000));
    assert!(sim.a.conn.error().is_none());
    assert_ne!(state(&sim, Side::A), State::Active);
}

/// TC-TERM-09 recv_returns_zero: data sent before D is read first, then EOF.
#[test]
fn tc_term_09_recv_returns_zero() {
    let mut sim = sim();
    sim.write(Side::A, 300, false);
    shutdown(&mut sim, Side::A);
    sim.flush();
    assert!(!sim.b.conn.rx_eof(), "data first");
    assert_eq!(sim.read(Side::B, 1000), 300);
    assert!(sim.b.conn.rx_eof());
    assert_eq!(sim.read(Side::B, 1000), 0);
}

/// TC-TERM-10 shutdown_rd_silent: no CDC, reads return EOF.
#[test]
fn tc_term_10_shutdown_rd_silent() {
    let mut sim = sim();
    sim.b.conn.shutdown_read();
    assert_eq!(sim.post(Side::B), 0);
    assert!(sim.b.conn.rx_eof());
    assert_eq!(state(&sim, Side::B), State::Active);
    // Writing still works.
    assert_eq!(sim.write(Side::B, 10, false), 10);
    assert_eq!(sim.post(Side::B), 1);
}

/// TC-TERM-11 no_updates_after_c: once C is posted, data that still arrives is
/// readable but produces no consumer update, no CDC at all.
#[test]
fn tc_term_11_no_updates_after_c() {
    let mut sim = sim();
    sim.write(Side::B, 9000, false);
    sim.post(Side::B);
    close(&mut sim, Side::A);
    sim.post(Side::A);
    sim.deliver(Side::B);
    sim.process(Side::A);
    assert_eq!(sim.read(Side::A, 10_000), 9000);
    assert_eq!(sim.post(Side::A), 0, "no consumer update after C");
    sim.flush();
    assert!(sim.trace.iter().filter(|t| t.from == Side::A).count() == 1);
}

/// TC-TERM-12 smc_close_before_fin: the TCP FIN request follows the delivery of the
/// CDC carrying C (or D), never earlier.
#[test]
fn tc_term_12_smc_close_before_fin() {
    let mut sim = sim();
    clear_events(&mut sim);
    close(&mut sim, Side::A);
    assert!(!sim.a.events.contains(Events::TCP_SHUTDOWN));
    sim.post(Side::A);
    assert!(!sim.a.events.contains(Events::TCP_SHUTDOWN));
    sim.deliver(Side::A);
    sim.complete(Side::A);
    assert!(sim.a.events.contains(Events::TCP_SHUTDOWN));
    // Exactly once, even when C follows D.
    let mut sim = super::term::sim();
    shutdown(&mut sim, Side::A);
    exchange(&mut sim, Side::A);
    assert!(sim.a.events.contains(Events::TCP_SHUTDOWN));
    sim.a.events = Events::empty();
    close(&mut sim, Side::B);
    exchange(&mut sim, Side::B);
    close(&mut sim, Side::A);
    exchange(&mut sim, Side::A);
    assert!(!sim.a.events.contains(Events::TCP_SHUTDOWN));
}

/// TC-ABRT-01 active_abort: A + TCP RST; PeerAbortWait ignores incoming data; the
/// peer's A → CLOSED.
#[test]
fn tc_abrt_01_active_abort() {
    let mut sim = sim();
    sim.write(Side::A, 500, false);
    sim.flush();
    clear_events(&mut sim);
    let now = sim.now;
    sim.a.conn.abort(now);
    assert_eq!(state(&sim, Side::A), State::PeerAbortWait);
    let ev = sim.a.conn.take_events();
    assert!(ev.contains(Events::TCP_RESET | Events::ERROR));
    assert_eq!(
        sim.a.conn.tx_space().unwrap_err().io_kind(),
        std::io::ErrorKind::ConnectionAborted
    );
    // B's data in flight is ignored by A.
    sim.write(Side::B, 100, false);
    sim.post(Side::B);
    sim.take_trace();
    let t = send_and_receive(&mut sim, Side::A);
    assert_eq!(t[0].cdc.conn_flags, ConnStateFlags::PEER_CONN_ABORT);
    sim.deliver(Side::B);
    sim.process(Side::A);
    assert_eq!(sim.a.outcomes.last(), Some(&CdcOutcome::Ignored));
    assert_eq!(sim.a.conn.rx_available().total(), 0);
    // B: passive abort, answers with A.
    assert_eq!(state(&sim, Side::B), State::ProcessAbort);
    sim.flush();
    assert_eq!(state(&sim, Side::A), State::Closed);
    assert_eq!(state(&sim, Side::B), State::Closed);
}

/// TC-ABRT-02 passive_abort: ECONNRESET to the application, unread and unsent data
/// purged, A answered, CLOSED.
#[test]
fn tc_abrt_02_passive_abort() {
    let mut sim = super::term::sim();
    sim.write(Side::B, 500, false);
    sim.flush();
    sim.write(Side::A, 700, false); // unsent at A
    let now = sim.now;
    sim.b.conn.abort(now);
    sim.post(Side::B);
    sim.deliver(Side::B);
    sim.process(Side::A);
    let a = &sim.a.conn;
    assert_eq!(a.state(), State::ProcessAbort);
    assert_eq!(
        a.error().unwrap().io_kind(),
        std::io::ErrorKind::ConnectionReset
    );
    assert_eq!(a.rx_available().total(), 0, "unread data purged");
    assert!(!a.rx_eof(), "an error, not EOF");
    sim.take_trace();
    let t = send_and_receive(&mut sim, Side::A);
    assert_eq!(t.len(), 1);
    assert!(t[0].writes.is_empty(), "unsent data purged");
    assert_eq!(t[0].cdc.conn_flags, ConnStateFlags::PEER_CONN_ABORT);
    assert!(sim.complete(Side::A));
    assert_eq!(state(&sim, Side::A), State::Closed);
}

/// TC-ABRT-03 tcp_rst_triggers_abort: a TCP RST alone starts the abort with A.
#[test]
fn tc_abrt_03_tcp_rst_triggers_abort() {
    let mut sim = sim();
    let now = sim.now;
    sim.a.conn.on_tcp_reset(now);
    let ev = sim.a.conn.take_events();
    assert!(
        !ev.contains(Events::TCP_RESET),
        "the TCP connection is already reset"
    );
    assert_eq!(state(&sim, Side::A), State::PeerAbortWait);
    let t = send_and_receive(&mut sim, Side::A);
    assert_eq!(t[0].cdc.conn_flags, ConnStateFlags::PEER_CONN_ABORT);
    sim.flush();
    assert_eq!(state(&sim, Side::A), State::Closed);
    assert_eq!(state(&sim, Side::B), State::Closed);
    // A reset after the peer's A changes nothing.
    let mut sim = super::term::sim();
    let now = sim.now;
    sim.b.conn.abort(now);
    sim.post(Side::B);
    sim.deliver(Side::B);
    sim.process(Side::A);
    sim.a.conn.on_tcp_reset(now);
    assert_eq!(state(&sim, Side::A), State::ProcessAbort);
}

/// TC-ABRT-04 concurrent_aborts: both send A, both end CLOSED.
#[test]
fn tc_abrt_04_concurrent_aborts() {
    let mut sim = sim();
    let now = sim.now;
    sim.a.conn.abort(now);
    sim.b.conn.abort(now);
    sim.post_all();
    sim.flush();
    assert_eq!(state(&sim, Side::A), State::Closed);
    assert_eq!(state(&sim, Side::B), State::Closed);
    // Crossing: B's A arrives before A's own A was posted.
    let mut sim = super::term::sim();
    let now = sim.now;
    sim.b.conn.abort(now);
    sim.post(Side::B);
    sim.a.conn.abort(now);
    sim.deliver(Side::B);
    sim.process(Side::A);
    assert_eq!(
        state(&sim, Side::A),
        State::ProcessAbort,
        "our A still owed"
    );
    sim.flush();
    assert_eq!(state(&sim, Side::A), State::Closed);
    assert_eq!(state(&sim, Side::B), State::Closed);
}

/// TC-ABRT-05 abortwait_timeout: the peer never sends A → RMBE reclaimed.
#[test]
fn tc_abrt_05_abortwait_timeout() {
    let mut sim = sim();
    let now = sim.now;
    sim.a.conn.abort(now);
    sim.post(Side::A);
    assert_eq!(
        sim.a.conn.poll_timeout(),
        Some(now + Duration::from_secs(10))
    );
    clear_events(&mut sim);
    sim.advance(Duration::from_secs(10));
    assert_eq!(state(&sim, Side::A), State::Closed);
    assert!(sim.a.events.contains(Events::CLOSED));
}

/// TC-ABRT-06 rst_after_c_sent: after C only a plain TCP RST, no A (AMB-44).
#[test]
fn tc_abrt_06_rst_after_c_sent() {
    let mut sim = sim();
    close(&mut sim, Side::A);
    sim.post(Side::A);
    clear_events(&mut sim);
    let now = sim.now;
    sim.a.conn.abort(now);
    assert!(sim
        .a
        .conn
        .take_events()
        .contains(Events::TCP_RESET | Events::CLOSED));
    assert_eq!(state(&sim, Side::A), State::Closed);
    assert_eq!(sim.post(Side::A), 0);
}

/// TC-RMBE-03 reuse_only_after_bilateral_close: CLOSED (RMBE reusable) is reached only
/// once C went both ways.
#[test]
fn tc_rmbe_03_reuse_only_after_bilateral_close() {
    let mut sim = sim();
    close(&mut sim, Side::A);
    sim.flush();
    assert!(!sim.a.events.contains(Events::CLOSED));
    assert!(!sim.b.events.contains(Events::CLOSED));
    close(&mut sim, Side::B);
    sim.post(Side::B);
    assert!(sim.b.events.contains(Events::CLOSED), "B has both Cs");
    assert!(!sim.a.events.contains(Events::CLOSED));
    sim.flush();
    assert!(sim.a.events.contains(Events::CLOSED));
}

/// Kernel-peer §V4 (c) "srvhalf": the server sends 5000 B and shuts down writing; the
/// client reads EOF and keeps sending 2×10000 B after the peer's half close; then both
/// close. States: server ACTIVE → PEERCLOSEWAIT1 → PEERCLOSEWAIT2; final CDCs D|C.
#[test]
fn half_close_with_continued_receiving() {
    let g = RmbeGeometry::linux(16 * 1024).unwrap();
    let (c, s) = (Side::A, Side::B);
    let mut sim = Sim::new(HostConfig::new(g, 16 * 1024), HostConfig::new(g, 16 * 1024));
    sim.write(c, 10_000, false);
    settle(&mut sim);
    sim.write(s, 5000, false);
    shutdown(&mut sim, s);
    settle(&mut sim);
    assert_eq!(state(&sim, s), State::PeerCloseWait1);
    assert_eq!(state(&sim, c), State::AppCloseWait1);
    assert!(sim.host(c).conn.rx_eof());
    for _ in 0..2 {
        let mut left = 10_000;
        while left > 0 {
            left -= sim.write(c, left, false);
            settle(&mut sim);
        }
    }
    assert_eq!(sim.host(s).inband, sim.host(c).stream(30_000));
    shutdown(&mut sim, c);
    settle(&mut sim);
    assert_eq!(state(&sim, s), State::PeerCloseWait2);
    assert_eq!(state(&sim, c), State::AppCloseWait2);
    close(&mut sim, s);
    close(&mut sim, c);
    sim.take_trace();
    settle(&mut sim);
    for t in sim.take_trace() {
        assert_eq!(
            t.cdc.conn_flags,
            ConnStateFlags::PEER_DONE_WRITING | ConnStateFlags::PEER_CONN_CLOSED
        );
    }
    assert_eq!(state(&sim, s), State::Closed);
    assert_eq!(state(&sim, c), State::Closed);
    assert_eq!(sim.host(c).inband, sim.host(s).stream(5000));
}

/// The link group is gone (no link left, §4.8.3): CLOSED at once, TCP reset, no CDC.
#[test]
fn kill_when_no_link_is_left() {
    let mut sim = sim();
    sim.write(Side::A, 100, false);
    sim.a.conn.kill(AbortReason::LinkLost);
    let ev = sim.a.conn.take_events();
    assert!(ev.contains(Events::TCP_RESET | Events::CLOSED | Events::ERROR));
    assert_eq!(state(&sim, Side::A), State::Closed);
    assert_eq!(sim.post(Side::A), 0);
    assert_eq!(
        sim.a.conn.error().unwrap().io_kind(),
        std::io::ErrorKind::ConnectionAborted
    );
}

/// Display names and numbers follow Linux `smc_diag`.
#[test]
fn state_names_are_linux_names() {
    assert_eq!(State::PeerCloseWait1.to_string(), "PEERCLOSEWAIT1");
    assert_eq!(State::ProcessAbort.linux_code(), 27);
    assert_eq!(State::AppFinCloseWait.linux_code(), 24);
    assert_eq!(State::Active.linux_code(), 1);
    assert_eq!(State::Closed.linux_code(), 7);
}

/// The runtime holds a connection under a mutex and calls it from any thread.
#[test]
fn conn_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Conn>();
    check::<Transmit>();
}

/// Issue 10 item 1: `shutdown(SHUT_WR)` starts no termination timer. The half-closed side
/// keeps receiving for as long as the peer sends (here 80 s, past the 60 s close timer),
/// as TCP does; the timer starts only when the application closes.
#[test]
fn half_closed_connection_outlives_the_close_timer() {
    let (a, b) = (Side::A, Side::B);
    let mut sim = sim();
    shutdown(&mut sim, a);
    settle(&mut sim);
    assert_eq!(state(&sim, a), State::PeerCloseWait1);
    assert_eq!(sim.a.conn.poll_timeout(), None, "no timer after shutdown");
    let mut sent = 0u64;
    for _ in 0..80 {
        sim.advance(Duration::from_secs(1));
        let n = sim.write(b, 100, false);
        settle(&mut sim);
        sent += n;
        let got = sim.host(a).inband.len();
        assert_eq!(got as u64, sent, "every byte arrives");
        assert_eq!(state(&sim, a), State::PeerCloseWait1);
        // The reader consumes what arrived (the sim's host reads on delivery).
    }
    assert!(sim.a.conn.error().is_none());
    // The application closes: now the timer runs.
    close(&mut sim, a);
    let t = sim
        .a
        .conn
        .poll_timeout()
        .expect("close arms the termination timer");
    assert_eq!(t, sim.now + Duration::from_secs(60));
    // The peer closes too: both CLOSED, no reset.
    shutdown(&mut sim, b);
    close(&mut sim, b);
    settle(&mut sim);
    assert_eq!(state(&sim, a), State::Closed);
    assert_eq!(state(&sim, b), State::Closed);
    assert!(sim.a.conn.error().is_none());
}
