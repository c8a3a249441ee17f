//! A mutex whose whole state is its own word, for the library's tables.
//!
//! Why not `parking_lot`: its waiters queue in one process-wide hash table of pointers
//! into the waiting threads' stacks. A forked child inherits that table with the
//! parent's parked threads in it, threads the child does not have, whose stacks glibc
//! recycles for the child's own threads; the next lock or unlock in the child that
//! lands in the same bucket follows a stale pointer (the daemonizing-server test
//! crashed that way in the child's tokio workers). Here a waiter sleeps on the lock
//! word itself (futex(2)), so a child inherits nothing but the word, and the fork
//! handlers can still take the lock in one callback and release it in another
//! (`lock_api::Mutex::force_unlock`).

use std::sync::atomic::{AtomicU32, Ordering};

/// 0 free, 1 held, 2 held with (possible) sleepers.
pub(crate) struct RawForkMutex(AtomicU32);

/// Spins before sleeping: the tables are held for a lookup or an insert.
const SPINS: u32 = 100;

impl RawForkMutex {
    #[cold]
    fn lock_contended(&self) {
        for _ in 0..SPINS {
            if self.0.load(Ordering::Relaxed) == 0
                && self
                    .0
                    .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
            std::hint::spin_loop();
        }
        // From here on the word says 2, so the holder's unlock wakes a sleeper.
        while self.0.swap(2, Ordering::Acquire) != 0 {
            futex(&self.0, libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG, 2);
        }
    }
}

/// futex(2) on `word`: WAIT while it holds `val`, or WAKE one sleeper. The result is
/// not needed: a WAIT that returns early (EAGAIN, EINTR) is retried by the caller's
/// loop, and a WAKE with no sleeper does nothing.
fn futex(word: &AtomicU32, op: libc::c_int, val: u32) {
    // SAFETY: `word` is a live, aligned 32-bit atomic for the duration of the call; a
    // null timeout waits without limit; the remaining arguments are unused by WAIT and
    // WAKE.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op,
            val,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

// SAFETY: `lock`/`try_lock` succeed only on the 0 → 1 (or 0 → 2) transition made with
// Acquire by exactly one thread, and `unlock` releases with Release; so at most one
// guard exists at a time and the holder sees the previous holder's writes.
unsafe impl lock_api::RawMutex for RawForkMutex {
    #[allow(clippy::declare_interior_mutable_const)] // the initial value, copied per mutex
    const INIT: Self = RawForkMutex(AtomicU32::new(0));
    type GuardMarker = lock_api::GuardSend;

    fn lock(&self) {
        if self
            .0
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
    }

    fn try_lock(&self) -> bool {
        self.0
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    unsafe fn unlock(&self) {
        if self.0.swap(0, Ordering::Release) == 2 {
            futex(&self.0, libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, 1);
        }
    }

    fn is_locked(&self) -> bool {
        self.0.load(Ordering::Relaxed) != 0
    }
}

/// The library's mutex (`lock()` returns the guard: no poisoning, as a panic never
/// crosses into the program).
pub(crate) type Mutex<T> = lock_api::Mutex<RawForkMutex, T>;

#[cfg(test)]
mod tests {
    use super::Mutex;
    use std::sync::Arc;

    #[test]
    fn excludes_and_wakes_sleepers() {
        let m = Arc::new(Mutex::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let mut g = m.lock();
                        let v = *g;
                        // Widen the window in which another thread would interleave.
                        std::hint::black_box(v);
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*m.lock(), 80_000);
    }

    #[test]
    fn force_unlock_releases_a_forgotten_guard() {
        let m = Mutex::new(1u8);
        std::mem::forget(m.lock());
        assert!(m.is_locked());
        assert!(m.try_lock().is_none());
        // SAFETY: the guard was forgotten on this thread (as the fork handlers do).
        unsafe { m.force_unlock() };
        assert!(!m.is_locked());
        assert_eq!(*m.lock(), 1);
    }
}
