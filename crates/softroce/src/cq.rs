//! Completion queues: a bounded FIFO of work completions plus ibverbs-style
//! notification (arm once, fire on the next completion: eventfd + handler).

use std::cell::Cell;
use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
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
    /// Someone asked for [`CqShared::event_fd`] (a consumer that sleeps on it): only
    /// then does firing write the eventfd. A CQ used through its handler alone (the
    /// smc runtime's) saved a system call per firing, several per connection.
    fd_wanted: AtomicBool,
    /// Fired since the last [`CqShared::ack_events`]: the eventfd is written when it is
    /// first asked for, so that it reads as the verbs contract says.
    fired: AtomicBool,
    handler: Mutex<Option<CompletionHandler>>,
    /// Threads inside [`CqShared::run_handler`].
    running: AtomicU32,
    /// The handler must run once more: asked by a thread that would not
    /// wait for the threads running it ([`CqShared::run_unless_running`]).
    rerun: AtomicBool,
    cap: usize,
    dev: Weak<dyn HandlerRunner>,
}

thread_local! {
    /// The engine is receiving in place of a thread that holds the
    /// device's receive path and does not get on ([`taking_over`]).
    static TAKING_OVER: Cell<bool> = const { Cell::new(false) };
}

/// Runs `receive`, the engine's pass over the socket in place of a
/// receiving thread that is stuck, with the completion handlers it fires
/// run only where no other thread is running them
/// ([`CqShared::run_unless_running`]): the stuck thread is most likely
/// inside one of them, and the engine must go on receiving and
/// acknowledging for the device instead of waiting with it.
pub(crate) fn taking_over<R>(receive: impl FnOnce() -> R) -> R {
    struct Done;
    impl Drop for Done {
        fn drop(&mut self) {
            TAKING_OVER.with(|t| t.set(false));
        }
    }
    TAKING_OVER.with(|t| t.set(true));
    let _done = Done;
    receive()
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
            fd_wanted: AtomicBool::new(false),
            fired: AtomicBool::new(false),
            handler: Mutex::new(None),
            running: AtomicU32::new(0),
            rerun: AtomicBool::new(false),
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
        // SeqCst with `event_fd`'s pair: of a firing and a first ask racing, at least
        // one sees the other and writes the eventfd.
        self.fired.store(true, Ordering::SeqCst);
        if self.fd_wanted.load(Ordering::SeqCst) {
            self.efd.wake();
        }
        if direct && TAKING_OVER.with(|t| t.get()) {
            self.run_unless_running();
        } else if direct {
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

    /// Runs the handler on this thread (several threads may; a handler
    /// such as SMC-R's serialises itself), and once more for every request
    /// [`CqShared::run_unless_running`] left meanwhile.
    pub(crate) fn run_handler(&self) {
        // Not running any more even if the handler panics.
        struct Leave<'a>(&'a AtomicU32);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        loop {
            self.running.fetch_add(1, Ordering::SeqCst);
            {
                let _leave = Leave(&self.running);
                let h = self
                    .handler
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                if let Some(h) = h {
                    h();
                }
            }
            if !self.rerun.swap(false, Ordering::SeqCst) {
                return;
            }
        }
    }

    /// Runs the handler unless another thread is running it: then that
    /// thread runs it once more when it is done, and this one goes on.
    /// For the engine, which must never wait for a handler a stuck thread
    /// is in (the handler would see the new completions only on that
    /// thread's next run, so the run is asked for, never dropped: whoever
    /// leaves the handler last after the request runs it).
    pub(crate) fn run_unless_running(&self) {
        self.rerun.store(true, Ordering::SeqCst);
        if self.running.load(Ordering::SeqCst) == 0 && self.rerun.swap(false, Ordering::SeqCst) {
            self.run_handler();
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
        if !self.fd_wanted.swap(true, Ordering::SeqCst) && self.fired.load(Ordering::SeqCst) {
            // Fired before anyone asked: readable now, as it would have been.
            self.efd.wake();
        }
        self.efd.as_fd()
    }

    /// Clears the event fd.
    pub(crate) fn ack_events(&self) {
        self.fired.store(false, Ordering::SeqCst);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Liveness bound for the waits below (never reached when they pass).
    const T: Duration = Duration::from_secs(20);

    struct NoEngine;
    impl HandlerRunner for NoEngine {
        fn defer_fire(&self, _cq: Arc<CqShared>) {
            unreachable!("only direct runs here");
        }
    }

    fn cq() -> Arc<CqShared> {
        let dev: Weak<dyn HandlerRunner> = Weak::<NoEngine>::new();
        CqShared::new(16, dev).unwrap()
    }

    /// Readable, per `pollfd`, without waiting.
    fn readable(fd: BorrowedFd<'_>) -> bool {
        smc_verbs::event::wait_readable(fd, Some(Duration::ZERO)).unwrap()
    }

    /// The eventfd is written only once someone asked for it, and reads as the verbs
    /// contract says whenever it is looked at: readable after a firing, until acked.
    #[test]
    fn the_event_fd_is_written_only_for_those_who_asked() {
        let cq = cq();
        cq.fire_with(false);
        assert!(!readable(cq.efd.as_fd()), "nobody asked: no write");
        assert!(
            readable(cq.event_fd()),
            "fired before the ask: readable at the ask"
        );
        cq.ack_events();
        assert!(!readable(cq.event_fd()));
        cq.fire_with(false);
        assert!(readable(cq.event_fd()));
        cq.ack_events();
        // A CQ that never fired is not readable when first asked.
        let quiet = super::tests::cq();
        assert!(!readable(quiet.event_fd()));
    }

    /// The engine taking over for a stuck thread fires a CQ whose handler
    /// that thread is blocked in: it goes on at once, and the blocked
    /// thread runs the handler once more when it is free, so the completion
    /// is seen and nothing ran twice at once.
    #[test]
    fn taking_over_never_waits_for_a_handler_another_thread_is_in() {
        let cq = cq();
        let runs = Arc::new(AtomicUsize::new(0));
        let (entered_tx, entered) = mpsc::channel::<std::thread::ThreadId>();
        let (release, released) = mpsc::channel::<()>();
        let released = Mutex::new(released);
        let r = runs.clone();
        cq.set_handler(Some(Arc::new(move || {
            // Counted before the test hears of it: the test's next step may run the
            // handler before this thread gets on again.
            let first = r.fetch_add(1, Ordering::SeqCst) == 0;
            entered_tx.send(std::thread::current().id()).unwrap();
            if first {
                // The first run blocks until the test lets it go.
                released.lock().unwrap().recv_timeout(T).unwrap();
            }
        })));
        let stuck = {
            let cq = cq.clone();
            std::thread::spawn(move || cq.run_handler())
        };
        let stuck_id = entered.recv_timeout(T).expect("first run");
        let (done_tx, done) = mpsc::channel();
        let engine = {
            let cq = cq.clone();
            std::thread::spawn(move || {
                cq.push(WorkCompletion::default()).unwrap();
                taking_over(|| cq.fire_with(true));
                done_tx.send(()).unwrap();
            })
        };
        done.recv_timeout(T)
            .expect("the engine waited for the blocked handler");
        engine.join().unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 1, "ran beside the blocked run");
        release.send(()).unwrap();
        let again = entered.recv_timeout(T).expect("the asked-for run");
        stuck.join().unwrap();
        assert_eq!(again, stuck_id, "run by the thread that was in it");
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        // Nobody in it: the engine runs it itself.
        taking_over(|| cq.fire_with(true));
        assert_eq!(
            entered.recv_timeout(T).unwrap(),
            std::thread::current().id()
        );
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert_eq!(cq.running.load(Ordering::SeqCst), 0);
    }

    /// Outside a takeover a receiving thread runs the handler itself even
    /// while another thread is in it (SMC-R's handler serialises itself
    /// and sees this thread's completion before the thread acknowledges).
    #[test]
    fn a_receiving_thread_runs_the_handler_itself() {
        let cq = cq();
        let (entered_tx, entered) = mpsc::channel::<std::thread::ThreadId>();
        let (release, released) = mpsc::channel::<()>();
        let released = Mutex::new(released);
        let first = AtomicBool::new(true);
        cq.set_handler(Some(Arc::new(move || {
            // Taken before the test hears of it (it fires the next run at once).
            let blocks = first.swap(false, Ordering::SeqCst);
            entered_tx.send(std::thread::current().id()).unwrap();
            if blocks {
                released.lock().unwrap().recv_timeout(T).unwrap();
            }
        })));
        let other = {
            let cq = cq.clone();
            std::thread::spawn(move || cq.run_handler())
        };
        entered.recv_timeout(T).unwrap();
        cq.fire_with(true);
        assert_eq!(
            entered.recv_timeout(T).unwrap(),
            std::thread::current().id()
        );
        release.send(()).unwrap();
        other.join().unwrap();
        assert!(entered.try_recv().is_err(), "no extra run was asked for");
    }
}
