//! Threads blocked in `Cq::wait` receive for their device themselves while
//! the engine stays off the socket: the hand-over in both directions, several
//! waiters at once, handlers of other CQs still running, and a driving
//! thread woken through its `DriveWaker`.

mod common;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use smc_softroce::Config;
use smc_verbs::*;

fn send(side: &Side, wr_id: u64, flags: SendFlags) {
    side.qp
        .post_send(&SendWr {
            wr_id,
            op: SendOp::Send,
            sg_list: &[],
            flags,
        })
        .unwrap();
}

fn recv(side: &Side, wr_id: u64) {
    side.qp
        .post_recv(&RecvWr {
            wr_id,
            sg_list: &[],
        })
        .unwrap();
}

/// Polls without ever calling `wait` (so only the engine can receive).
fn poll_only(cq: &Cq, timeout: Duration) -> WorkCompletion {
    let deadline = Instant::now() + timeout;
    let mut wc = [WorkCompletion::default()];
    loop {
        if cq.poll(&mut wc) == 1 {
            return wc[0];
        }
        assert!(Instant::now() < deadline, "no completion without a waiter");
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[test]
fn waiter_receives_and_engine_takes_the_socket_back() {
    let o = Opts::default();
    let (a, b) = pair(38, &Config::default(), &o);
    for i in 0..100 {
        recv(&b, i);
    }
    // Ping-pong-free stream of SENDs while B waits: B's thread receives.
    for i in 0..50 {
        send(&a, i, SendFlags::empty());
        let wc = wait_wc(&b.rcq, T);
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
    }
    let stats = smc_softroce::stats(&b.dev).unwrap();
    let by_waiters = stats.rx_by_waiters.load(Ordering::Relaxed);
    assert!(by_waiters > 0, "no packet received by the waiting thread");
    // Nobody waits any more, neither right after the waiter left (within
    // the engine's linger time) nor long after: the engine must receive.
    for (i, pause) in [(50u64, 0u64), (51, 30), (52, 100)] {
        std::thread::sleep(Duration::from_millis(pause));
        send(&a, i, SendFlags::empty());
        let wc = poll_only(&b.rcq, Duration::from_secs(2));
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
    }
    assert_eq!(
        stats.rx_by_waiters.load(Ordering::Relaxed),
        by_waiters,
        "a thread that does not wait received packets"
    );
}

#[test]
fn two_waiters_on_one_device() {
    let o = Opts::default();
    let (a, b) = pair(39, &Config::default(), &o);
    let rounds = 200u64;
    for i in 0..rounds {
        recv(&b, i);
        recv(&a, i);
    }
    // B echoes every message; A waits for its send completions on one thread
    // and for the echoes on another, both receiving for the same device.
    let echo = {
        let (qp, rcq) = (b.qp.clone(), b.rcq.clone());
        std::thread::spawn(move || {
            for i in 0..rounds {
                let wc = wait_wc(&rcq, T);
                assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
                qp.post_send(&SendWr {
                    wr_id: i,
                    op: SendOp::Send,
                    sg_list: &[],
                    flags: SendFlags::empty(),
                })
                .unwrap();
            }
        })
    };
    let sends = {
        let scq = a.scq.clone();
        std::thread::spawn(move || {
            for i in 0..rounds {
                let wc = wait_wc(&scq, T);
                assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
            }
        })
    };
    for i in 0..rounds {
        send(&a, i, SendFlags::SIGNALED);
        let wc = wait_wc(&a.rcq, T);
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
    }
    echo.join().unwrap();
    sends.join().unwrap();
}

#[test]
fn handler_of_another_cq_runs_while_a_thread_waits() {
    let o = Opts::default();
    let (a, b) = pair(43, &Config::default(), &o);
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    b.rcq.set_handler(Some(Arc::new(move || {
        h.fetch_add(1, Ordering::SeqCst);
    })));
    b.rcq.req_notify(false);
    recv(&b, 7);
    // A thread of B waits on its (empty) send CQ and so receives A's SEND.
    let waiter = {
        let scq = b.scq.clone();
        std::thread::spawn(move || scq.wait(Some(Duration::from_millis(300))).unwrap())
    };
    std::thread::sleep(Duration::from_millis(20));
    send(&a, 1, SendFlags::empty());
    let deadline = Instant::now() + T;
    while hits.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "handler not called");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!waiter.join().unwrap(), "send CQ got a completion");
    let wc = poll_only(&b.rcq, T);
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success));
}

/// A thread inside `DeviceOps::drive` whose `done()` turns true on another
/// thread (which received its completion, or any other event) returns when
/// that thread wakes its `DriveWaker`, not when its `max` runs out: nothing
/// arrives on the socket to wake it.
#[test]
fn drive_returns_when_its_waker_is_woken() {
    let o = Opts::default();
    let (a, _b) = pair(39, &Config::default(), &o);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let waker = DriveWaker::current().expect("eventfd");
    let (d2, w2) = (done.clone(), waker.clone());
    let t = std::thread::spawn(move || {
        // Let the driver reach its sleep (if it is not there yet, the wake-up
        // still ends the sleep it is about to start).
        std::thread::sleep(Duration::from_millis(50));
        d2.store(true, Ordering::SeqCst);
        w2.wake();
    });
    let max = Duration::from_secs(120);
    let t0 = Instant::now();
    let r = a.dev.0.drive(
        &|| done.load(Ordering::SeqCst),
        Some(&waker),
        max,
        Duration::ZERO,
    );
    let took = t0.elapsed();
    t.join().unwrap();
    assert!(r);
    // Not a speed check: without the wake-up the call lasts `max`.
    assert!(took < max, "drive slept through its waker ({took:?})");
    // A stale wake-up is harmless: the next drive only looks once more.
    waker.wake();
    assert!(!a.dev.0.drive(
        &|| false,
        Some(&waker),
        Duration::from_millis(20),
        Duration::ZERO
    ));
}

/// For the first `spin` of a drive the thread does not sleep: a `done()` that turns
/// true then is seen at once, with no packet and no waker to end a sleep (which the
/// drive above, without a spin, would sleep through until `max`).
#[test]
fn a_spinning_drive_sees_done_without_a_wake_up() {
    let o = Opts::default();
    let (a, _b) = pair(46, &Config::default(), &o);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d2 = done.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        d2.store(true, Ordering::SeqCst);
    });
    let (max, spin) = (Duration::from_secs(20), Duration::from_secs(10));
    let t0 = Instant::now();
    let r = a
        .dev
        .0
        .drive(&|| done.load(Ordering::SeqCst), None, max, spin);
    let took = t0.elapsed();
    t.join().unwrap();
    assert!(r);
    // Not a speed check: asleep, the call would last `max`.
    assert!(took < spin, "the drive slept ({took:?})");
}

/// After its spin a drive sleeps: with nothing to receive and `done()` never true, a
/// drive of 1 s whose first 20 ms spin takes far less than 1 s of this thread's CPU.
#[test]
fn a_drive_sleeps_after_its_spin() {
    fn thread_cpu() -> Duration {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
        Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
    }
    let o = Opts::default();
    let (a, _b) = pair(47, &Config::default(), &o);
    let (max, spin) = (Duration::from_secs(1), Duration::from_millis(20));
    let cpu0 = thread_cpu();
    let t0 = Instant::now();
    assert!(!a.dev.0.drive(&|| false, None, max, spin));
    let (wall, cpu) = (t0.elapsed(), thread_cpu() - cpu0);
    assert!(wall >= max, "the drive ended early ({wall:?})");
    // A drive that spun all along would have used most of the second (more than 300
    // ms even with half a CPU), asleep after 20 ms it uses about that.
    assert!(
        cpu < Duration::from_millis(300),
        "the drive spun past its spin ({cpu:?})"
    );
}

/// Options for the two tests below: A's local ACK timeout 67 ms, so that a
/// B that stops acknowledging fails A's SENDs with RetryExcErr after its
/// 7 retries (about half a second, CHECKLIST RTY-1).
fn opts_with_short_retries() -> Opts {
    let mut o = Opts::default();
    o.rts.timeout = 14;
    o.rts.retry_cnt = 7;
    o
}

/// A's signaled SENDs 1..=n must all complete successfully: B received
/// and acknowledged them.
fn sends_complete(a: &Side, b: &Side, n: u64) {
    for i in 1..=n {
        send(a, i, SendFlags::SIGNALED);
        let wc = wait_wc(&a.scq, T);
        assert_eq!(
            (wc.wr_id, wc.status),
            (i, WcStatus::Success),
            "B stopped acknowledging"
        );
        let wc = poll_only(&b.rcq, T);
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
    }
}

/// A thread registered to receive for B's device (inside
/// `DeviceOps::drive`) that stops receiving without leaving (here its
/// `done` check blocks) must not stop the device: the engine receives the
/// packets that wait for it in vain, and B goes on acknowledging A.
#[test]
fn a_registered_driver_that_stops_receiving_does_not_stop_the_device() {
    let o = opts_with_short_retries();
    let (a, b) = pair(44, &Config::default(), &o);
    for i in 1..=20 {
        recv(&b, i);
    }
    let gate = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let driver = {
        let (dev, gate) = (b.dev.clone(), gate.clone());
        std::thread::spawn(move || {
            dev.0.drive(
                &|| {
                    let _ = entered_tx.send(());
                    let (m, c) = &*gate;
                    let g = m.lock().unwrap();
                    let g = c.wait_timeout_while(g, T, |open| !*open).unwrap().0;
                    *g
                },
                None,
                T,
                Duration::ZERO,
            )
        })
    };
    entered.recv_timeout(T).unwrap();
    sends_complete(&a, &b, 20);
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
    assert!(driver.join().unwrap());
    let stats = smc_softroce::stats(&b.dev).unwrap();
    assert!(stats.rx_engine_takeovers.load(Ordering::Relaxed) > 0);
}

/// The flake of `hundred_connections_fail_over_at_once` (crates/smc/tests/
/// multilink.rs), made deterministic: a completion handler that blocks
/// (there, an SMC-R handler waiting for the process's mmap lock in an
/// allocation while the test started a hundred threads) on the thread that
/// received its completion, which holds the device's receive path while it
/// runs it. Before, the engine left the socket to that registered thread:
/// nothing reached B's QP, no ACK left, and A's QP failed with RetryExcErr
/// after its retries. Now the engine receives with buffers of its own once
/// packets wait in vain for a lease, and never waits for the handler the
/// stuck thread is in (that thread runs it once more when it is free):
/// every SEND is acknowledged while the handler is still blocked.
#[test]
fn a_handler_blocked_on_the_receiving_thread_does_not_stop_the_device() {
    let o = opts_with_short_retries();
    let (a, b) = pair(45, &Config::default(), &o);
    for i in 0..=20 {
        recv(&b, i);
    }
    let gate = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let (entered_tx, entered) = std::sync::mpsc::channel();
    {
        let (gate, runs, rcq) = (gate.clone(), runs.clone(), b.rcq.clone());
        let entered_tx = std::sync::Mutex::new(entered_tx);
        // Every run re-arms the CQ, as consumers do (with a completion
        // waiting, that asks the engine for another run at once), and
        // blocks until the test opens the gate.
        b.rcq.set_handler(Some(Arc::new(move || {
            rcq.req_notify(false);
            runs.fetch_add(1, Ordering::SeqCst);
            let _ = entered_tx.lock().unwrap().send(std::thread::current().id());
            let (m, c) = &*gate;
            let g = m.lock().unwrap();
            drop(c.wait_timeout_while(g, T, |open| !*open).unwrap());
        })));
    }
    b.rcq.req_notify(false);
    // A thread of B's application receives for the device while it waits
    // (as SMC-R's blocking reads and writes do), so it runs the handler.
    let driver = {
        let (dev, gate) = (b.dev.clone(), gate.clone());
        std::thread::spawn(move || {
            let id = std::thread::current().id();
            let open = || *gate.0.lock().unwrap();
            let r = dev.0.drive(&open, None, T, Duration::ZERO);
            (id, r)
        })
    };
    // Let it get to its wait, then SEND 0: the driver receives it and
    // runs the handler, which blocks.
    std::thread::sleep(Duration::from_millis(50));
    send(&a, 0, SendFlags::SIGNALED);
    let runner = entered.recv_timeout(T).expect("handler run");
    let wc = wait_wc(&a.scq, T);
    assert_eq!((wc.wr_id, wc.status), (0, WcStatus::Success));
    let wc = poll_only(&b.rcq, T);
    assert_eq!((wc.wr_id, wc.status), (0, WcStatus::Success));
    sends_complete(&a, &b, 20);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "a second run while blocked");
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
    let (driver_id, r) = driver.join().unwrap();
    assert!(r);
    assert_eq!(runner, driver_id, "the receiving thread ran the handler");
    // The completions that came meanwhile got their run, by the thread
    // that was running the handler.
    assert_eq!(entered.recv_timeout(T).unwrap(), driver_id);
}
