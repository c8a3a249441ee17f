//! A condition variable that knows whether anyone waits on it.
//!
//! `std::sync::Condvar::notify_all` makes a futex system call whether or not a thread
//! sleeps on it. A connection's readers and writers are woken on every CDC message,
//! completion and close, and most of those times nobody sleeps on the condition variable
//! (the reader is driving the RNIC, spinning, or not reading at all): a connection over
//! the software RNIC paid about ten such calls for nothing, and the request/response path
//! one per message (issue 15). Here a waiter counts itself in under the mutex before it
//! sleeps, so a notifier that changed the state under the same mutex sees it, and calls
//! the kernel only when someone is there.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, MutexGuard};
use std::time::Duration;

/// A [`Condvar`] with a count of its sleepers. Every wait and every state change it
/// signals must be under the same mutex (as with a `Condvar` used correctly).
#[derive(Default)]
pub(crate) struct Cond {
    cv: Condvar,
    /// Threads between counting themselves in (holding the mutex) and waking up.
    waiters: AtomicU32,
}

impl Cond {
    pub(crate) fn new() -> Cond {
        Cond::default()
    }

    /// Sleeps until notified (or spuriously woken); a poisoned lock is taken as is, as
    /// every caller here did with the `Condvar`.
    pub(crate) fn wait<'a, T>(&self, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        // Counted while the mutex is held: a notifier that takes the mutex after this
        // thread released it (inside `wait`) sees the count. Relaxed suffices, the
        // mutex orders it.
        self.waiters.fetch_add(1, Ordering::Relaxed);
        let g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        self.waiters.fetch_sub(1, Ordering::Relaxed);
        g
    }

    /// Sleeps until notified or `dur` has passed; true if it timed out.
    pub(crate) fn wait_timeout<'a, T>(
        &self,
        g: MutexGuard<'a, T>,
        dur: Duration,
    ) -> (MutexGuard<'a, T>, bool) {
        self.waiters.fetch_add(1, Ordering::Relaxed);
        let (g, r) = self
            .cv
            .wait_timeout(g, dur)
            .unwrap_or_else(|p| p.into_inner());
        self.waiters.fetch_sub(1, Ordering::Relaxed);
        (g, r.timed_out())
    }

    /// Wakes every sleeper, if there is one. Call it after changing the state under the
    /// mutex (holding it or not any more): a waiter that came later saw the change.
    pub(crate) fn notify_all(&self) {
        if self.waiters.load(Ordering::Relaxed) != 0 {
            self.cv.notify_all();
        }
    }

    /// Sleepers right now (tests).
    #[cfg(test)]
    fn sleepers(&self) -> u32 {
        self.waiters.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    #[test]
    fn notify_wakes_a_sleeper_and_counts_it_out() {
        let m = Arc::new((Mutex::new(false), Cond::new()));
        let m2 = m.clone();
        let t = std::thread::spawn(move || {
            let mut g = m2.0.lock().unwrap();
            while !*g {
                g = m2.1.wait(g);
            }
        });
        // Wait until the thread sleeps, so that the notify must reach it.
        let t0 = Instant::now();
        while m.1.sleepers() == 0 {
            assert!(t0.elapsed() < Duration::from_secs(10), "never slept");
            std::thread::yield_now();
        }
        *m.0.lock().unwrap() = true;
        m.1.notify_all();
        t.join().unwrap();
        assert_eq!(m.1.sleepers(), 0);
    }

    #[test]
    fn timeout_reports_and_counts_out() {
        let m = Mutex::new(());
        let c = Cond::new();
        c.notify_all(); // nobody there: no effect
        let (_g, timed_out) = c.wait_timeout(m.lock().unwrap(), Duration::from_millis(5));
        assert!(timed_out);
        assert_eq!(c.sleepers(), 0);
    }

    #[test]
    fn no_lost_wakeup_under_races() {
        // Many rounds of a flag set and notified while the other thread goes to sleep
        // on it: a lost wake-up hangs a round (caught by the timeout).
        let m = Arc::new((Mutex::new(0u32), Cond::new()));
        let m2 = m.clone();
        let t = std::thread::spawn(move || {
            for round in 1..=2000u32 {
                let mut g = m2.0.lock().unwrap();
                while *g < round {
                    let (g2, timed_out) = m2.1.wait_timeout(g, Duration::from_secs(10));
                    assert!(!timed_out, "round {round}: wake-up lost");
                    g = g2;
                }
            }
        });
        for _ in 1..=2000u32 {
            *m.0.lock().unwrap() += 1;
            m.1.notify_all();
            std::thread::yield_now();
        }
        t.join().unwrap();
    }
}
