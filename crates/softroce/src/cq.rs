//! Completion queues: a bounded FIFO of work completions plus ibverbs-style
//! notification (arm once, fire on the next completion: eventfd + handler).

use std::any::Any;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, Weak};

use std::time::{Duration, Instant};

use smc_verbs::{wait_on_event_fd, CompletionHandler, CqOps, WcStatus, WorkCompletion};

use crate::device::DevShared;

struct CqInner {
    q: VecDeque<WorkCompletion>,
    /// `Some(solicited_only)` while armed.
    armed: Option<bool>,
    overflow: bool,
}

/// Shared state of a CQ (held by the QPs that complete into it).
pub(crate) struct CqShared {
    inner: Mutex<CqInner>,
    efd: OwnedFd,
    handler: Mutex<Option<CompletionHandler>>,
    cap: usize,
    dev: Weak<DevShared>,
}

impl CqShared {
    pub(crate) fn new(cap: usize, dev: Weak<DevShared>) -> std::io::Result<Arc<CqShared>> {
        // SAFETY: eventfd has no memory-safety preconditions; the result is
        // checked before it is wrapped.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Arc::new(CqShared {
            inner: Mutex::new(CqInner {
                q: VecDeque::with_capacity(cap),
                armed: None,
                overflow: false,
            }),
            // SAFETY: `fd` is a fresh descriptor we own.
            efd: unsafe { OwnedFd::from_raw_fd(fd) },
            handler: Mutex::new(None),
            cap,
            dev,
        }))
    }

    /// Adds a completion. Returns `Err(())` when the CQ is full (overflow:
    /// the completion is lost and the caller moves its QP to ERR), else
    /// whether the CQ must fire (call [`CqShared::fire`] after releasing
    /// the QP lock).
    pub(crate) fn push(&self, wc: WorkCompletion) -> Result<bool, ()> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.q.len() >= self.cap {
            g.overflow = true;
            return Err(());
        }
        g.q.push_back(wc);
        let fire = match g.armed {
            Some(sol_only) => !sol_only || wc.solicited || wc.status != WcStatus::Success,
            None => false,
        };
        if fire {
            g.armed = None;
        }
        Ok(fire)
    }

    /// Makes the event fd readable and runs the handler. Handlers run on a
    /// provider thread: directly when called from the engine, else the
    /// engine is asked to do it.
    pub(crate) fn fire(self: &Arc<Self>) {
        self.fire_with(crate::device::on_engine_thread());
    }

    /// Like [`CqShared::fire`]; `direct` runs the handler on this thread
    /// (only ever on the engine thread).
    fn fire_with(self: &Arc<Self>, direct: bool) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a valid u64 to our eventfd.
        unsafe {
            libc::write(
                self.efd.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
        if direct {
            self.run_handler();
        } else if self.has_handler() {
            // Only wake the engine when there is a handler to run (a thread
            // receiving in `wait` fires on every completion it delivers).
            if let Some(dev) = self.dev.upgrade() {
                dev.defer_fire(self.clone());
            }
        }
    }

    /// Disarms, unless a handler relies on the arming (a CQ with a handler
    /// keeps ibverbs semantics exactly: the next completion fires).
    fn disarm(&self) {
        if !self.has_handler() {
            self.inner.lock().unwrap_or_else(|e| e.into_inner()).armed = None;
        }
    }

    fn has_handler(&self) -> bool {
        self.handler
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    pub(crate) fn run_handler(&self) {
        let h = self
            .handler
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(h) = h {
            h();
        }
    }
}

/// A CQ handle ([`CqOps`]).
pub(crate) struct SoftCq {
    pub(crate) shared: Arc<CqShared>,
    pub(crate) _dev: Arc<crate::device::DevHandle>,
}

impl CqOps for SoftCq {
    fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        let mut g = self.shared.inner.lock().unwrap_or_else(|e| e.into_inner());
        let n = out.len().min(g.q.len());
        for (o, wc) in out.iter_mut().zip(g.q.drain(..n)) {
            *o = wc;
        }
        n
    }
    fn pending(&self) -> usize {
        self.shared
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .q
            .len()
    }
    fn capacity(&self) -> usize {
        self.shared.cap
    }
    fn req_notify(&self, solicited_only: bool) {
        let fire_now = {
            let mut g = self.shared.inner.lock().unwrap_or_else(|e| e.into_inner());
            let waiting =
                g.q.iter()
                    .any(|wc| !solicited_only || wc.solicited || wc.status != WcStatus::Success);
            if waiting {
                g.armed = None;
            } else {
                g.armed = Some(solicited_only);
            }
            waiting
        };
        if fire_now {
            // Never call the handler from inside req_notify (a handler that
            // re-arms would recurse): the engine runs it.
            self.shared.fire_with(false);
        }
    }
    fn event_fd(&self) -> RawFd {
        self.shared.efd.as_raw_fd()
    }
    fn ack_events(&self) {
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a valid u64 from our non-blocking
        // eventfd; EAGAIN (nothing to clear) is fine.
        unsafe {
            libc::read(
                self.shared.efd.as_raw_fd(),
                &mut v as *mut u64 as *mut libc::c_void,
                8,
            )
        };
    }
    fn set_handler(&self, handler: Option<CompletionHandler>) {
        *self
            .shared
            .handler
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = handler;
    }
    fn overflowed(&self) -> bool {
        self.shared
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .overflow
    }
    /// Receives for the device on this thread while it waits, so a
    /// completion costs one wake-up (ours) instead of two (the engine's,
    /// then ours). The engine keeps the timers and stays off the socket
    /// while we are here (see `DevShared::enter_driver`).
    fn wait(&self, timeout: Option<Duration>) -> smc_verbs::Result<bool> {
        let dev = match self.shared.dev.upgrade() {
            // A handler that blocks (it must not) runs on the engine, which
            // may hold the receive path: keep the plain wait there.
            Some(d) if !crate::device::on_engine_thread() => d,
            _ => return wait_on_event_fd(self, timeout),
        };
        let deadline = timeout.map(|t| Instant::now() + t);
        let _driver = dev.enter_driver();
        loop {
            if self.pending() > 0 {
                return Ok(true);
            }
            // Armed while we sleep, so completions other threads add
            // (engine timers, another receiver) make the event fd readable.
            self.req_notify(false);
            if self.pending() > 0 {
                self.shared.disarm();
                return Ok(true);
            }
            let ts = match deadline {
                None => None,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        self.shared.disarm();
                        return Ok(false);
                    }
                    let rest = d - now;
                    Some(libc::timespec {
                        tv_sec: rest.as_secs() as libc::time_t,
                        tv_nsec: rest.subsec_nanos() as libc::c_long,
                    })
                }
            };
            let mut pfd = [
                libc::pollfd {
                    fd: dev.sock.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.shared.efd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let tsp = ts
                .as_ref()
                .map_or(std::ptr::null(), |t| t as *const libc::timespec);
            // SAFETY: two valid pollfds and an optional timespec, all live
            // for the duration of the call.
            let rc = unsafe { libc::ppoll(pfd.as_mut_ptr(), 2, tsp, std::ptr::null()) };
            if rc < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e.into());
                }
            }
            if pfd[1].revents != 0 {
                self.ack_events();
            }
            // Completions we deliver ourselves need no event (that would
            // cost an eventfd write now and a spurious wake-up next time).
            self.shared.disarm();
            if pfd[0].revents != 0 {
                dev.drain_rx();
            }
        }
    }
    fn as_dyn(&self) -> &dyn CqOps {
        self
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
