//! Process-wide instances that a forked child makes afresh.
//!
//! A provider's devices, a stack's event thread and a library's task runtime are
//! threads plus the state they own. `fork()` copies the state but not the threads: in
//! the child, a `OnceLock` instance looks alive and is dead (nothing answers its
//! queues, and a lock a parent's thread held stays locked). [`PerProcess`] is the
//! `OnceLock` that knows: each process (the original and every forked child) gets its
//! own instance on first use, and the parent's copy is left alone in the child —
//! leaked, never dropped, since dropping would join threads that do not exist there.
//! Its descriptors stay open in the child like every other inherited descriptor.
//!
//! Processes are told apart by a fork generation that a `pthread_atfork` child handler
//! advances, so the fast path is one atomic load, not a `getpid()`.
//!
//! A child's new instances are configured as its parent's were: [`config_var`] reads the
//! `SMC_*` environment as the process first saw it, since programs clear the
//! environment of the children they fork (nginx keeps only `TZ` for its workers).

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::Once;

/// Advanced in every forked child (before `fork()` returns there).
static GENERATION: AtomicU64 = AtomicU64::new(1);

extern "C" fn forked_child() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// This process's fork generation: it differs in a forked child from its parent's.
pub fn generation() -> u64 {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function that only touches an atomic.
        let r = unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
        assert_eq!(r, 0, "pthread_atfork: out of memory");
    });
    GENERATION.load(Ordering::Acquire)
}

/// The `SMC_*` variables of the environment when this address space first asked (a
/// forked child inherits the copy).
static SNAPSHOT: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();

/// A configuration variable (`SMC_*`): the environment's value, or if the environment
/// no longer has it, the value it had at the first call in this address space —
/// inherited by forked children whose environment the program cleared.
pub fn config_var(name: &str) -> Option<String> {
    let snapshot = SNAPSHOT.get_or_init(|| {
        // vars_os: a program's other variables need not be UTF-8 (vars() would panic).
        std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .filter(|(k, _)| k.starts_with("SMC_"))
            .collect()
    });
    std::env::var(name).ok().or_else(|| {
        snapshot
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    })
}

/// Where the stack's long-lived descriptors are numbered from (0: the lowest free
/// number, the kernel's rule). See [`set_fd_floor`].
static FD_FLOOR: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Numbers the stack's own long-lived descriptors (event and epoll fds, the RNIC's
/// sockets, the runtime's copies of TCP sockets, the `smc ss` socket) from `floor`.
/// An interposing library (smc-preload) sets it: an unmodified program sizes its tables
/// by the descriptors it expects to open (wrk: 10 + 3 per connection), so the stack
/// must not take the low numbers the program's own sockets would get.
pub fn set_fd_floor(floor: i32) {
    FD_FLOOR.store(floor, Ordering::Relaxed);
}

/// `fd` moved to a number from the [`set_fd_floor`] floor (close-on-exec), or `fd`
/// itself when no floor is set, it already is above, or no number is free there.
pub fn lift<T: From<std::os::fd::OwnedFd> + Into<std::os::fd::OwnedFd>>(fd: T) -> T {
    use std::os::fd::AsRawFd;
    let floor = FD_FLOOR.load(Ordering::Relaxed);
    if floor <= 0 {
        return fd;
    }
    let fd: std::os::fd::OwnedFd = fd.into();
    if fd.as_raw_fd() >= floor {
        return T::from(fd);
    }
    // The old number closes when `fd` drops.
    match rustix::io::fcntl_dupfd_cloexec(&fd, floor) {
        Ok(high) => T::from(high),
        Err(_) => T::from(fd),
    }
}

struct Slot<T> {
    generation: u64,
    value: T,
}

/// One `T` per process (see the module documentation).
pub struct PerProcess<T: 'static> {
    current: AtomicPtr<Slot<T>>,
    /// The generation of the process whose thread is making the instance (0: none). A
    /// holder of another generation is a parent's thread that did not come across
    /// `fork()`: its claim is void here.
    making: AtomicU64,
}

impl<T: Send + Sync + 'static> Default for PerProcess<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Send + Sync + 'static> PerProcess<T> {
    /// An empty cell (for a `static`).
    pub const fn new() -> PerProcess<T> {
        PerProcess {
            current: AtomicPtr::new(std::ptr::null_mut()),
            making: AtomicU64::new(0),
        }
    }

    /// This process's instance, if it made one.
    pub fn get(&self) -> Option<&'static T> {
        let g = generation();
        let p = self.current.load(Ordering::Acquire);
        // SAFETY: a non-null pointer came from `Box::leak` below and is never freed.
        let slot = unsafe { p.as_ref() }?;
        (slot.generation == g).then_some(&slot.value)
    }

    /// This process's instance, made by `make` on first use in this process. Threads
    /// of one process racing here wait for the first one's `make`.
    pub fn get_or_init(&self, make: impl FnOnce() -> T) -> &'static T {
        if let Some(v) = self.get() {
            return v;
        }
        let g = generation();
        loop {
            let holder = self.making.load(Ordering::Acquire);
            if holder != g
                && self
                    .making
                    .compare_exchange(holder, g, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                break;
            }
            std::thread::yield_now();
        }
        /// Releases the claim also when `make` panics (a caller may catch it and try
        /// again; the others must not wait forever).
        struct Release<'a>(&'a AtomicU64);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                self.0.store(0, Ordering::Release);
            }
        }
        let _release = Release(&self.making);
        // Another thread of this process may have finished while we waited.
        match self.get() {
            Some(v) => v,
            None => {
                let slot: &'static Slot<T> = Box::leak(Box::new(Slot {
                    generation: g,
                    value: make(),
                }));
                // The parent's slot, if any, is leaked: its threads are not here.
                self.current
                    .store((slot as *const Slot<T>).cast_mut(), Ordering::Release);
                &slot.value
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn a_panicking_make_does_not_block_the_next_caller() {
        static CELL: PerProcess<u32> = PerProcess::new();
        let r = std::panic::catch_unwind(|| CELL.get_or_init(|| panic!("out of resources")));
        assert!(r.is_err());
        assert_eq!(*CELL.get_or_init(|| 7), 7);
    }

    #[test]
    fn lift_moves_descriptors_above_the_floor() {
        let low = std::fs::File::open("/dev/null").unwrap();
        let n = low.as_raw_fd();
        // No floor: unchanged.
        let same = lift(std::os::fd::OwnedFd::from(low));
        assert_eq!(same.as_raw_fd(), n);
        set_fd_floor(600);
        let high = lift(same);
        set_fd_floor(0);
        assert!(high.as_raw_fd() >= 600, "{}", high.as_raw_fd());
        let flags = rustix::io::fcntl_getfd(&high).unwrap();
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
    }

    #[test]
    fn one_instance_per_process_and_a_fresh_one_in_a_child() {
        static MADE: AtomicUsize = AtomicUsize::new(0);
        static CELL: PerProcess<(u32, usize)> = PerProcess::new();
        assert!(CELL.get().is_none());
        let make = || (std::process::id(), MADE.fetch_add(1, Ordering::SeqCst));
        let threads: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(move || CELL.get_or_init(make) as *const _ as usize))
            .collect();
        let ptrs: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(ptrs.windows(2).all(|w| w[0] == w[1]), "one instance");
        assert_eq!(MADE.load(Ordering::SeqCst), 1);
        let parent = *CELL.get().unwrap();
        // SAFETY: fork in a test; the child only checks the cell and exits with _exit.
        match unsafe { libc::fork() } {
            0 => {
                let fresh = CELL.get().is_none();
                let child = *CELL.get_or_init(make);
                let ok = fresh && child.0 == std::process::id() && child.1 == 1;
                // SAFETY: leaves the child at once, without running the test harness.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) }
            }
            pid => {
                assert!(pid > 0, "fork failed");
                let mut status = 0;
                // SAFETY: waits for the child just forked.
                assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
                assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
                assert_eq!(*CELL.get().unwrap(), parent, "the parent keeps its own");
            }
        }
    }
}
