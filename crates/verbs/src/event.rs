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
        Ok(EventFd(eventfd(
            0,
            EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC,
        )?))
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
}
