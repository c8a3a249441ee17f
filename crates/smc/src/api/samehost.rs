//! The blocking waits of same-host connections (docs/samehost.md "Waking"): a short
//! adaptive spin on the connection's ring, then a sleep on its doorbell.

use std::io::{self, ErrorKind};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use super::{Dir, SmcHandle};
use crate::runtime::conn::ConnState;

/// The sleepers of the same-host connection woken for `dir` (`ConnShared::on_events`).
fn sleepers(st: &mut ConnState, dir: Dir) -> &mut Vec<Arc<smc_verbs::EventFd>> {
    match dir {
        Dir::Read => &mut st.shm_rx_sleepers,
        Dir::Write => &mut st.shm_tx_sleepers,
    }
}

/// A thread inside a read or write call of a same-host connection (from its start to
/// its return, except while it sleeps): it counts as polling the connection's ring
/// (the ring's POLLING word), so the peer publishes its CDCs there without ringing our
/// doorbell, and the call takes them itself — at its start, in its waits, and when it
/// ends (this guard's drop: a CDC published while it was counted is taken before the
/// call returns, so none waits for a bell that was not rung). Why: a bulk reader is
/// mostly copying out, not waiting, and a peer that rang for every CDC then woke the
/// event thread about 100,000 times a second; on two CPUs each wake-up took a CPU from
/// one of the two copying threads (docs/samehost.md "Waking").
pub(super) struct Polling<'a> {
    handle: &'a SmcHandle,
    path: &'a crate::runtime::shm::ShmPath,
}

impl Drop for Polling<'_> {
    fn drop(&mut self) {
        crate::runtime::shm::region::RxRing::polling(&self.path.rx_ctrl, false);
        // After the count went down (with a fence): a CDC published before it did not
        // ring; one published after it rings. Not while unwinding: a second panic in
        // the drain would abort, and the count is right either way (the event thread
        // takes what comes next, on the bell).
        if self.path.rx_pending() && !std::thread::panicking() {
            self.handle.conn.shm_poll(Instant::now());
        }
    }
}

/// A counted thread's sleep ([`Polling`]): not counted from [`Paused::new`] until the
/// drop, so that the count comes back however the sleep ends (a panic in between would
/// otherwise leave the guard to take one more off, wrapping the count: the peer would
/// never ring again).
struct Paused<'a>(&'a crate::runtime::shm::ShmPath);

impl<'a> Paused<'a> {
    fn new(p: &'a crate::runtime::shm::ShmPath) -> Self {
        crate::runtime::shm::region::RxRing::polling(&p.rx_ctrl, false);
        Paused(p)
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        crate::runtime::shm::region::RxRing::polling(&self.0.rx_ctrl, true);
    }
}

impl SmcHandle {
    /// Counts this thread as polling the ring of a same-host connection until the guard
    /// drops ([`Polling`]); `None` on SMC-R.
    pub(super) fn polling(&self) -> Option<Polling<'_>> {
        let path = self.conn.shm()?;
        crate::runtime::shm::region::RxRing::polling(&path.rx_ctrl, true);
        Some(Polling { handle: self, path })
    }

    /// Same host: before sleeping, spin on the ring for the peer's CDC (adaptive, at most
    /// `StackConfig::same_host_spin`); the caller counts as polling ([`Polling`]), so the
    /// peer does not ring our eventfd. `Ok` when something happened for the waiter (its
    /// `rx_seq` or `tx_seq`, by `dir`, moved).
    #[allow(clippy::result_large_err)]
    pub(super) fn spin_same_host<'a>(
        &'a self,
        p: &crate::runtime::shm::ShmPath,
        st: MutexGuard<'a, ConnState>,
        dir: Dir,
    ) -> Result<MutexGuard<'a, ConnState>, MutexGuard<'a, ConnState>> {
        let budget = self.conn.spin.get();
        if budget.is_zero() {
            return Err(st);
        }
        let seq_of = self.seq(dir);
        let seq = seq_of.load(Ordering::Acquire);
        drop(st);
        let t0 = Instant::now();
        let mut spins = 0u32;
        let mut hit = false;
        loop {
            if p.rx_pending() {
                self.conn.shm_poll(Instant::now());
            }
            if seq_of.load(Ordering::Acquire) != seq {
                hit = true;
                break;
            }
            spins += 1;
            // The clock every 64 turns: reading it costs more than a look at the ring.
            // And a yield: with more runnable threads than CPUs the peer may be queued
            // behind this very spin.
            if spins.is_multiple_of(64) {
                if t0.elapsed() >= budget {
                    break;
                }
                std::thread::yield_now();
            }
            std::hint::spin_loop();
        }
        // A CDC published after the last look did not ring: take it now.
        if !hit && p.rx_pending() {
            self.conn.shm_poll(Instant::now());
            hit = seq_of.load(Ordering::Acquire) != seq;
        }
        let st = self.conn.lock();
        // Re-checked under the lock: the event thread may have taken the CDC and
        // notified between our last look and the lock (no condvar waiter yet then).
        hit |= seq_of.load(Ordering::Acquire) != seq;
        if hit {
            Ok(st)
        } else {
            Err(st)
        }
    }

    /// Same host, after the spin: sleep on the connection's doorbell itself (the peer
    /// rings it when no thread of ours polls: this one stops counting as polling for the
    /// sleep, [`Polling`]), so that the peer's CDC wakes this thread
    /// directly; local events (the event thread's timers and TCP watch, another
    /// thread's read or close) come through this thread's own eventfd, registered with
    /// the connection for `ConnShared::on_events` (one per thread: a shared one could be
    /// drained by a thread it was not meant for). The caller looks again after any
    /// wake-up.
    pub(super) fn sleep_same_host<'a>(
        &'a self,
        p: &crate::runtime::shm::ShmPath,
        mut st: MutexGuard<'a, ConnState>,
        deadline: Option<Instant>,
        dir: Dir,
    ) -> io::Result<MutexGuard<'a, ConnState>> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        thread_local! {
            static SLEEPER: Option<Arc<smc_verbs::EventFd>> =
                smc_verbs::EventFd::new().ok().map(Arc::new);
        }
        let timeout = match deadline {
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return Err(io::Error::new(ErrorKind::WouldBlock, "timed out"));
                }
                Some(d - now)
            }
            None => None,
        };
        let Some(me) = SLEEPER.with(|s| s.clone()) else {
            // No eventfd for this thread (out of descriptors): the condition variable,
            // woken by whoever takes the ring (the event thread, on the bell).
            let seq = self.seq(dir).load(Ordering::Acquire);
            let paused = Paused::new(p);
            self.conn.shm_take(&mut st);
            let st = if self.seq(dir).load(Ordering::Acquire) != seq {
                st
            } else {
                match timeout {
                    Some(t) => self.cond(dir).wait_timeout(st, t).0,
                    None => self.cond(dir).wait(st),
                }
            };
            drop(paused);
            return Ok(st);
        };
        let seq_of = self.seq(dir);
        let seq = seq_of.load(Ordering::Acquire);
        sleepers(&mut st, dir).push(me.clone());
        drop(st);
        // Not polling while asleep: from here on the peer rings.
        let paused = Paused::new(p);
        // Registered and not counted before this last look: a CDC published after it
        // rings the bell, and an event after it writes `me`.
        if !p.rx_pending() && seq_of.load(Ordering::Acquire) == seq {
            let mut fds = [
                PollFd::new(&p.bell, PollFlags::IN),
                PollFd::new(&*me, PollFlags::IN),
            ];
            let ts = timeout.map(|t| Timespec {
                tv_sec: t.as_secs() as i64,
                tv_nsec: i64::from(t.subsec_nanos()),
            });
            let _ = poll(&mut fds, ts.as_ref());
        }
        // Polling again before the drain below, which takes every CDC published until
        // then (those after it did not ring).
        drop(paused);
        p.bell.drain();
        me.drain();
        // Whoever drained the bell takes the ring (and wakes the other sleepers).
        self.conn.shm_poll(Instant::now());
        let mut st = self.conn.lock();
        let v = sleepers(&mut st, dir);
        if let Some(i) = v.iter().position(|x| Arc::ptr_eq(x, &me)) {
            v.swap_remove(i);
        }
        Ok(st)
    }
}
