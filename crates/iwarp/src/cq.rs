//! Completion queues: a bounded FIFO plus ibverbs notification (arm once, fire on the next
//! completion: eventfd + handler). Completions are produced on the QP threads (and, for
//! receives posted to a QP in ERR, on the posting thread).

use std::any::Any;
use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex};

use smc_verbs::{CompletionHandler, CqOps, EventFd, WcStatus, WorkCompletion};

struct Inner {
    q: VecDeque<WorkCompletion>,
    armed: Option<bool>,
    overflow: bool,
}

/// Shared state of a CQ.
pub(crate) struct CqShared {
    inner: Mutex<Inner>,
    efd: EventFd,
    handler: Mutex<Option<CompletionHandler>>,
    cap: usize,
}

impl CqShared {
    pub(crate) fn new(cap: usize) -> std::io::Result<Arc<CqShared>> {
        Ok(Arc::new(CqShared {
            inner: Mutex::new(Inner {
                q: VecDeque::with_capacity(cap.min(4096)),
                armed: None,
                overflow: false,
            }),
            efd: EventFd::new()?,
            handler: Mutex::new(None),
            cap,
        }))
    }

    /// Adds a completion; `Ok(true)` when the CQ was armed for it (the caller then calls
    /// [`CqShared::fire`], outside its locks). `Err(())` on overflow (the completion is
    /// lost; the caller moves its QP to ERR, as IBA requires).
    pub(crate) fn push(&self, wc: WorkCompletion) -> Result<bool, ()> {
        let fire = {
            let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            if g.q.len() >= self.cap {
                g.overflow = true;
                return Err(());
            }
            g.q.push_back(wc);
            let fire = match g.armed {
                Some(sol) => !sol || wc.solicited || wc.status != WcStatus::Success,
                None => false,
            };
            if fire {
                g.armed = None;
            }
            fire
        };
        Ok(fire)
    }

    /// Makes the event fd readable and runs the handler.
    pub(crate) fn fire(&self) {
        self.efd.wake();
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

/// A CQ handle.
pub(crate) struct IwCq {
    pub(crate) shared: Arc<CqShared>,
}

impl CqOps for IwCq {
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
            g.armed = if waiting { None } else { Some(solicited_only) };
            waiting
        };
        if fire_now {
            // Only the event fd here: a handler that re-arms would recurse. The handler
            // contract (a provider thread calls it) is kept by the QP threads.
            self.shared.efd.wake();
        }
    }
    fn event_fd(&self) -> BorrowedFd<'_> {
        self.shared.efd.as_fd()
    }
    fn ack_events(&self) {
        self.shared.efd.drain();
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
    fn as_dyn(&self) -> &dyn CqOps {
        self
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
