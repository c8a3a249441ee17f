//! Event fds: the readiness signal behind a CQ's completion channel
//! ([`crate::CqOps::event_fd`], ibverbs' `ibv_comp_channel`) and the wake-up
//! of threads that sleep in `poll` (a provider's progress engine, the SMC-R
//! runtime's event thread). One implementation for the workspace, on
//! `rustix` (no `unsafe`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::Duration;

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};

/// A Linux eventfd, non-blocking and close-on-exec: readable while its
/// counter is non-zero.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A new eventfd with counter 0.
    pub fn new() -> io::Result<EventFd> {
        let fd = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?;
        Ok(EventFd(crate::process::lift(fd)))
    }

    /// Adds one to the counter, making the fd readable (wakes a poller).
    /// Never blocks: at the (unreachable) counter maximum the write fails
    /// with EAGAIN and the fd is readable anyway.
    pub fn wake(&self) {
        let _ = rustix::io::write(&self.0, &1u64.to_ne_bytes());
    }

    /// Resets the counter to 0 (nothing to do when it already is).
    pub fn drain(&self) {
        let mut v = [0u8; 8];
        let _ = rustix::io::read(&self.0, &mut v);
    }

    /// The descriptor, for `poll` sets built from raw fds.
    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// The wake-up of one thread waiting inside [`crate::DeviceOps::drive`].
///
/// A driving thread receives for its device and sleeps on the device's
/// socket; the completion that ends its wait may nevertheless be produced
/// by another thread (the provider's engine, or another driving thread
/// that received the packet first). That thread has nothing to make the
/// sleeper's socket readable again, so the consumer registers the sleeper's
/// waker where its completion handler looks and calls [`DriveWaker::wake`]
/// after making `done()` true. One eventfd per thread, created on first
/// use; a wake-up from the owning thread itself is skipped (it checks
/// `done()` before it sleeps again).
#[derive(Clone, Debug)]
pub struct DriveWaker {
    efd: std::sync::Arc<EventFd>,
    owner: usize,
}

thread_local! {
    static DRIVE_WAKER: Option<DriveWaker> = EventFd::new().ok().map(|e| DriveWaker {
        efd: std::sync::Arc::new(e),
        owner: thread_tag(),
    });
    static THREAD_TAG: u8 = const { 0 };
}

/// A number unique to the calling thread among live threads (the address
/// of one of its thread-locals).
fn thread_tag() -> usize {
    THREAD_TAG.with(|t| t as *const u8 as usize)
}

impl DriveWaker {
    /// The calling thread's waker (`None` if no eventfd could be created:
    /// the caller then drives without early wake-ups, i.e. until `max`;
    /// a completion on its own socket still wakes it).
    pub fn current() -> Option<DriveWaker> {
        // `try_with`: also from a thread-local destructor (then `None`).
        DRIVE_WAKER.try_with(|w| w.clone()).ok().flatten()
    }

    /// Wakes the owning thread if it sleeps in `drive` (or makes its next
    /// sleep there return at once). A no-op on the owning thread.
    pub fn wake(&self) {
        if self.owner != thread_tag() {
            self.efd.wake();
        }
    }

    /// True if `self` and `other` wake the same thread.
    pub fn same(&self, other: &DriveWaker) -> bool {
        std::sync::Arc::ptr_eq(&self.efd, &other.efd)
    }

    /// Clears pending wake-ups (the owner, before it looks at `done()`).
    pub fn clear(&self) {
        self.efd.drain();
    }

    /// The descriptor to poll: readable after a [`DriveWaker::wake`].
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.efd.as_fd()
    }
}

/// `timeout` as a `poll` timeout (`None`: wait forever).
pub fn poll_timeout(timeout: Option<Duration>) -> Option<Timespec> {
    timeout.map(|t| Timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: t.subsec_nanos().into(),
    })
}

/// Waits until `fd` is readable or `timeout` passes (`ppoll`, nanosecond
/// precision); true if readable. EINTR counts as a wake-up.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> io::Result<bool> {
    let mut fds = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
    match poll(&mut fds, poll_timeout(timeout).as_ref()) {
        Ok(_) => Ok(!fds[0].revents().is_empty()),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakes_and_drains() {
        let e = EventFd::new().unwrap();
        assert!(!wait_readable(e.as_fd(), Some(Duration::ZERO)).unwrap());
        e.wake();
        e.wake();
        assert!(wait_readable(e.as_fd(), Some(Duration::ZERO)).unwrap());
        e.drain();
        assert!(!wait_readable(e.as_fd(), Some(Duration::ZERO)).unwrap());
        // Draining an empty counter is harmless (EAGAIN on a non-blocking fd).
        e.drain();
        assert!(!wait_readable(e.as_fd(), Some(Duration::from_millis(1))).unwrap());
    }

    #[test]
    fn drive_waker_wakes_its_thread_from_others_only() {
        let w = DriveWaker::current().unwrap();
        assert!(w.same(&DriveWaker::current().unwrap()));
        // From the owning thread: nothing to wake (it checks done() itself).
        w.wake();
        assert!(!wait_readable(w.fd(), Some(Duration::ZERO)).unwrap());
        let w2 = w.clone();
        std::thread::spawn(move || {
            let other = DriveWaker::current().unwrap();
            assert!(!other.same(&w2));
            w2.wake();
        })
        .join()
        .unwrap();
        assert!(wait_readable(w.fd(), Some(Duration::ZERO)).unwrap());
        w.clear();
        assert!(!wait_readable(w.fd(), Some(Duration::ZERO)).unwrap());
    }
}
