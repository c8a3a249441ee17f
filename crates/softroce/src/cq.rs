//! Completion queues: a bounded FIFO of work completions plus ibverbs-style
//! notification (arm once, fire on the next completion: eventfd + handler).

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex, Weak};

use smc_verbs::{CompletionHandler, EventFd, WcStatus, WorkCompletion};

use crate::thread::runs_handlers;

/// Where a CQ's handler runs when the thread that completed into it may not
/// run it (see [`crate::thread`]): the device's engine thread.
pub(crate) trait HandlerRunner: Send + Sync {
    /// Has the engine thread run `cq`'s handler soon.
    fn defer_fire(&self, cq: Arc<CqShared>);
}

struct CqInner {
    q: VecDeque<WorkCompletion>,
    /// `Some(solicited_only)` while armed.
    armed: Option<bool>,
    overflow: bool,
}

/// Shared state of a CQ (held by the QPs that complete into it).
pub(crate) struct CqShared {
    inner: Mutex<CqInner>,
    efd: EventFd,
    handler: Mutex<Option<CompletionHandler>>,
    cap: usize,
    dev: Weak<dyn HandlerRunner>,
}

impl CqShared {
    pub(crate) fn new(cap: usize, dev: Weak<dyn HandlerRunner>) -> std::io::Result<Arc<CqShared>> {
        Ok(Arc::new(CqShared {
            inner: Mutex::new(CqInner {
                q: VecDeque::with_capacity(cap),
                armed: None,
                overflow: false,
            }),
            efd: EventFd::new()?,
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
        self.fire_with(runs_handlers());
    }

    /// Like [`CqShared::fire`]; `direct` runs the handler on this thread
    /// (only ever on the engine thread).
    fn fire_with(self: &Arc<Self>, direct: bool) {
        self.efd.wake();
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
    pub(crate) fn disarm(&self) {
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

    /// Moves up to `out.len()` completions into `out` (ibv_poll_cq).
    pub(crate) fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let n = out.len().min(g.q.len());
        for (o, wc) in out.iter_mut().zip(g.q.drain(..n)) {
            *o = wc;
        }
        n
    }

    /// Completions queued.
    pub(crate) fn pending(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).q.len()
    }

    /// Most completions the CQ holds.
    pub(crate) fn capacity(&self) -> usize {
        self.cap
    }

    /// Arms the CQ (ibv_req_notify_cq): the next completion (solicited or
    /// failed, with `solicited_only`) fires; fires at once if one waits.
    pub(crate) fn req_notify(self: &Arc<Self>, solicited_only: bool) {
        let fire_now = {
            let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
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
            self.fire_with(false);
        }
    }

    /// The event fd, readable once the CQ fired.
    pub(crate) fn event_fd(&self) -> BorrowedFd<'_> {
        self.efd.as_fd()
    }

    /// Clears the event fd.
    pub(crate) fn ack_events(&self) {
        self.efd.drain();
    }

    /// Sets or clears the completion handler.
    pub(crate) fn set_handler(&self, handler: Option<CompletionHandler>) {
        *self.handler.lock().unwrap_or_else(|e| e.into_inner()) = handler;
    }

    /// True once a completion was lost to a full CQ.
    pub(crate) fn overflowed(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .overflow
    }
}
