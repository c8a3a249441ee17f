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
    let r = a
        .dev
        .0
        .drive(&|| done.load(Ordering::SeqCst), Some(&waker), max);
    let took = t0.elapsed();
    t.join().unwrap();
    assert!(r);
    // Not a speed check: without the wake-up the call lasts `max`.
    assert!(took < max, "drive slept through its waker ({took:?})");
    // A stale wake-up is harmless: the next drive only looks once more.
    waker.wake();
    assert!(!a
        .dev
        .0
        .drive(&|| false, Some(&waker), Duration::from_millis(20)));
}
