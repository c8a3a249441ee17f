//! Completion queues, and the event thread of a context that fires them and handles
//! asynchronous events.

use std::any::Any;
use std::collections::VecDeque;
use std::ffi::{c_int, c_void, CStr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use smc_verbs::{
    CompletionHandler, CqOps, EventFd, QpOps, QpState, Result, VerbsError, WcOpcode, WcStatus,
    WorkCompletion,
};
use tracing::{debug, error, info, warn};

use super::qp::QpInner;
use super::{errno_error, lock, uevent, Ctx, Shared};
use crate::ffi::{self, Api};

/// Completions polled from the hardware CQ per call.
const POLL_BATCH: usize = 16;

pub(super) struct CqInner {
    pub(super) ctx: Arc<Ctx>,
    pub(super) cq: *mut ffi::ibv_cq,
    id: u64,
    cap: usize,
    poll_fn: ffi::PollCqFn,
    notify_fn: ffi::ReqNotifyCqFn,
    /// Completions taken from the hardware CQ by `pending` but not yet polled.
    buf: Mutex<VecDeque<WorkCompletion>>,
    efd: EventFd,
    handler: Mutex<Option<CompletionHandler>>,
    overflowed: AtomicBool,
}

// SAFETY: ibv_cq may be polled and armed from any thread (rdma-core providers lock
// internally); the pointer is valid until Drop.
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl CqInner {
    pub(super) fn create(ctx: &Arc<Ctx>, cqe: u32) -> Result<Arc<CqInner>> {
        let id = ctx.shared.next_cq.fetch_add(1, Ordering::Relaxed);
        let want = cqe.clamp(1, i32::MAX as u32) as c_int;
        // SAFETY: valid context and channel; `id` is stored as the opaque cq_context.
        let cq = unsafe { (ctx.api.create_cq)(ctx.ctx, want, id as *mut c_void, ctx.channel, 0) };
        if cq.is_null() {
            return Err(match errno_error("ibv_create_cq", 0) {
                VerbsError::QueueFull => VerbsError::ResourceExhausted("CQ"),
                e => e,
            });
        }
        // SAFETY: valid CQ; the fast-path functions live in its context's ops table.
        let (cap, ops) = unsafe { ((*cq).cqe.max(0) as usize, &(*(*cq).context).ops) };
        let (Some(poll_fn), Some(notify_fn)) = (ops.poll_cq, ops.req_notify_cq) else {
            // SAFETY: destroying the CQ created above.
            unsafe { (ctx.api.destroy_cq)(cq) };
            return Err(VerbsError::DeviceGone("provider has no poll_cq".into()));
        };
        let efd = match EventFd::new() {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: destroying the CQ created above.
                unsafe { (ctx.api.destroy_cq)(cq) };
                return Err(e.into());
            }
        };
        let c = Arc::new(CqInner {
            ctx: ctx.clone(),
            cq,
            id,
            cap,
            poll_fn,
            notify_fn,
            buf: Mutex::new(VecDeque::with_capacity(POLL_BATCH)),
            efd,
            handler: Mutex::new(None),
            overflowed: AtomicBool::new(false),
        });
        lock(&ctx.shared.cqs).insert(id, Arc::downgrade(&c));
        Ok(c)
    }

    /// The CQ fired: the event fd becomes readable and the handler runs (event thread).
    fn fire(&self) {
        self.efd.wake();
        let h = lock(&self.handler).clone();
        if let Some(h) = h {
            h();
        }
    }

    /// Polls the hardware CQ into `out`; returns how many.
    fn poll_hw(&self, out: &mut [WorkCompletion]) -> usize {
        let mut raw = [ffi::ibv_wc::default(); POLL_BATCH];
        let want = out.len().min(POLL_BATCH);
        if want == 0 {
            return 0;
        }
        // SAFETY: valid CQ; `raw` has room for `want` entries.
        let n = unsafe { (self.poll_fn)(self.cq, want as c_int, raw.as_mut_ptr()) };
        if n < 0 {
            warn!(rc = n, "ibv_poll_cq failed");
            return 0;
        }
        let n = n as usize;
        for (o, w) in out.iter_mut().zip(&raw[..n]) {
            *o = convert_wc(w);
        }
        n
    }
}

impl Drop for CqInner {
    fn drop(&mut self) {
        lock(&self.ctx.shared.cqs).remove(&self.id);
        // SAFETY: every QP using this CQ holds a `Cq` clone, so none is left; the event
        // thread acknowledges each event it takes, which ibv_destroy_cq waits for.
        let rc = unsafe { (self.ctx.api.destroy_cq)(self.cq) };
        if rc != 0 {
            warn!(rc, "ibv_destroy_cq failed");
        }
    }
}

fn convert_status(s: u32) -> WcStatus {
    match s {
        ffi::IBV_WC_SUCCESS => WcStatus::Success,
        ffi::IBV_WC_LOC_LEN_ERR => WcStatus::LocLenErr,
        ffi::IBV_WC_LOC_QP_OP_ERR => WcStatus::LocQpOpErr,
        ffi::IBV_WC_LOC_PROT_ERR | ffi::IBV_WC_LOC_ACCESS_ERR => WcStatus::LocProtErr,
        ffi::IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushErr,
        ffi::IBV_WC_BAD_RESP_ERR => WcStatus::BadRespErr,
        ffi::IBV_WC_REM_INV_REQ_ERR => WcStatus::RemInvReqErr,
        ffi::IBV_WC_REM_ACCESS_ERR => WcStatus::RemAccessErr,
        ffi::IBV_WC_REM_OP_ERR => WcStatus::RemOpErr,
        ffi::IBV_WC_RETRY_EXC_ERR => WcStatus::RetryExcErr,
        ffi::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExcErr,
        _ => WcStatus::GeneralErr,
    }
}

fn convert_wc(w: &ffi::ibv_wc) -> WorkCompletion {
    let opcode = match w.opcode {
        ffi::IBV_WC_SEND => WcOpcode::Send,
        ffi::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        ffi::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        ffi::IBV_WC_COMP_SWAP => WcOpcode::CompSwap,
        ffi::IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
        ffi::IBV_WC_RECV => WcOpcode::Recv,
        ffi::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        // Only valid for successful completions (verbs.h); flushed ones keep Send.
        _ => WcOpcode::Send,
    };
    WorkCompletion {
        wr_id: w.wr_id,
        status: convert_status(w.status),
        opcode,
        byte_len: w.byte_len,
        // imm_data is in network byte order (verbs.h); smc-verbs carries host values.
        imm_data: (w.wc_flags & ffi::IBV_WC_WITH_IMM != 0).then(|| u32::from_be(w.imm_data)),
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        // ibv_wc does not report the solicited-event bit.
        solicited: false,
    }
}

impl CqOps for CqInner {
    fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        let mut n = 0;
        {
            let mut b = lock(&self.buf);
            while n < out.len() {
                match b.pop_front() {
                    Some(wc) => {
                        out[n] = wc;
                        n += 1;
                    }
                    None => break,
                }
            }
        }
        while n < out.len() {
            let k = self.poll_hw(&mut out[n..]);
            if k == 0 {
                break;
            }
            n += k;
        }
        n
    }

    fn pending(&self) -> usize {
        let mut b = lock(&self.buf);
        if b.is_empty() {
            let mut tmp = [WorkCompletion::default(); POLL_BATCH];
            let k = self.poll_hw(&mut tmp);
            b.extend(&tmp[..k]);
        }
        b.len()
    }

    fn capacity(&self) -> usize {
        self.cap
    }

    fn req_notify(&self, solicited_only: bool) {
        // SAFETY: valid CQ.
        let rc = unsafe { (self.notify_fn)(self.cq, solicited_only as c_int) };
        if rc != 0 {
            warn!(rc, "ibv_req_notify_cq failed");
        }
        // ibverbs only fires on completions added after the arm; smc-verbs also fires
        // when some are already waiting. Errors count as solicited (IBA §11.4.2.2).
        let waiting = {
            let _ = self.pending();
            lock(&self.buf)
                .iter()
                .any(|wc| !solicited_only || wc.solicited || !wc.status.is_ok())
        };
        if waiting {
            self.efd.wake();
            if lock(&self.handler).is_some() {
                // Never from inside req_notify (a handler that re-arms would recurse).
                lock(&self.ctx.shared.deferred).push(self.id);
                self.ctx.shared.wake.wake();
            }
        }
    }

    fn event_fd(&self) -> BorrowedFd<'_> {
        self.efd.as_fd()
    }

    fn ack_events(&self) {
        self.efd.drain();
    }

    fn set_handler(&self, handler: Option<CompletionHandler>) {
        *lock(&self.handler) = handler;
    }

    fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Acquire)
    }

    fn as_dyn(&self) -> &dyn CqOps {
        self
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The per-context thread: completion channel, async events, deferred handlers.
pub(super) struct EventThread {
    pub(super) api: &'static Api,
    pub(super) ctx: usize,
    pub(super) channel: usize,
    pub(super) shared: Arc<Shared>,
    pub(super) name: String,
    /// The device's uverbs character device (`uverbs0`), whose removal uevent says that
    /// the device is gone.
    pub(super) uverbs: String,
    /// Kernel uevents (see `uevent`), when the socket could be opened.
    pub(super) uevents: Option<OwnedFd>,
}

impl EventThread {
    pub(super) fn run(self) {
        self.event_loop();
        if self.shared.orphaned.load(Ordering::Acquire) {
            // SAFETY: `Ctx::drop` ran on this thread and left the channel and context to
            // it: nothing else refers to them any more.
            unsafe {
                (self.api.destroy_comp_channel)(self.channel as *mut ffi::ibv_comp_channel);
                (self.api.close_device)(self.ctx as *mut ffi::ibv_context);
            }
        }
    }

    fn event_loop(&self) {
        let ctx = self.ctx as *mut ffi::ibv_context;
        let channel = self.channel as *mut ffi::ibv_comp_channel;
        // SAFETY: both stay valid until Ctx::drop joined this thread (or, when it ran on
        // this thread, until `run` closes them after this loop).
        let (cfd, afd) = unsafe { ((*channel).fd, (*ctx).async_fd) };
        let wfd = self.shared.wake.as_raw_fd();
        // poll(2) ignores entries with a negative fd
        let ufd = self.uevents.as_ref().map_or(-1, |f| f.as_raw_fd());
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: cfd,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: afd,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: wfd,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: ufd,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: four valid pollfds for the duration of the call.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
            if rc < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                error!(device = %self.name, error = %e, "poll failed; event thread stops");
                return;
            }
            if self.shared.stop.load(Ordering::Acquire) {
                return;
            }
            if fds[2].revents != 0 {
                self.shared.wake.drain();
                let ids = std::mem::take(&mut *lock(&self.shared.deferred));
                for id in ids {
                    self.fire(id);
                }
            }
            if fds[0].revents != 0 {
                self.completion_events(channel);
            }
            if fds[1].revents != 0 {
                self.async_events(ctx);
            }
            if let Some(u) = &self.uevents {
                if fds[3].revents != 0
                    && uevent::drain(u, &self.uverbs)
                    && !self.shared.removed.load(Ordering::Acquire)
                {
                    error!(device = %self.name, uverbs = %self.uverbs,
                        "device removed (uverbs node unregistered): failing its QPs");
                    self.removed();
                }
            }
            if self.shared.stop.load(Ordering::Acquire) {
                return;
            }
        }
    }

    /// The device is gone for good: inactive, removed, every QP to ERR (their work
    /// requests flush, the links above fail and free their objects, and the last one
    /// closes the context, which the kernel waits for to finish the removal).
    fn removed(&self) {
        self.shared.removed.store(true, Ordering::Release);
        self.shared.active.store(false, Ordering::Release);
        self.fail_qps();
    }

    fn fail_qps(&self) {
        let qps: Vec<Arc<QpInner>> = lock(&self.shared.qps)
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for qp in qps {
            if let Err(e) = qp.modify_to_err() {
                debug!(qpn = qp.qpn, error = %e, "QP to ERR after a device error");
            }
        }
    }

    fn fire(&self, id: u64) {
        let cq = lock(&self.shared.cqs).get(&id).and_then(Weak::upgrade);
        if let Some(cq) = cq {
            cq.fire();
        }
    }

    fn completion_events(&self, channel: *mut ffi::ibv_comp_channel) {
        loop {
            let mut cq: *mut ffi::ibv_cq = std::ptr::null_mut();
            let mut cq_ctx: *mut c_void = std::ptr::null_mut();
            // SAFETY: valid channel (non-blocking), valid out-pointers.
            if unsafe { (self.api.get_cq_event)(channel, &mut cq, &mut cq_ctx) } != 0 {
                return; // EAGAIN: nothing more
            }
            // Acknowledge at once: ibv_destroy_cq waits for every event it reported to
            // be acknowledged, and the CQ stays valid until then.
            // SAFETY: `cq` came from ibv_get_cq_event and is valid until acknowledged.
            unsafe { (self.api.ack_cq_events)(cq, 1) };
            self.fire(cq_ctx as u64);
        }
    }

    fn async_events(&self, ctx: *mut ffi::ibv_context) {
        loop {
            let mut ev = ffi::ibv_async_event {
                element: std::ptr::null_mut(),
                event_type: 0,
            };
            // SAFETY: valid context (non-blocking async fd), valid out-pointer.
            if unsafe { (self.api.get_async_event)(ctx, &mut ev) } != 0 {
                return;
            }
            // SAFETY: libibverbs returns a static string for any event type.
            let what = unsafe { CStr::from_ptr((self.api.event_type_str)(ev.event_type)) }
                .to_string_lossy()
                .into_owned();
            let mut flush_all = false;
            let mut removed = false;
            match ev.event_type {
                ffi::IBV_EVENT_QP_FATAL
                | ffi::IBV_EVENT_QP_REQ_ERR
                | ffi::IBV_EVENT_QP_ACCESS_ERR => {
                    // SAFETY: for QP events `element` is the QP, valid until the event is
                    // acknowledged below.
                    let qpn = unsafe { (*(ev.element as *mut ffi::ibv_qp)).qp_num };
                    warn!(device = %self.name, qpn, event = %what, "QP error");
                    if let Some(qp) = lock(&self.shared.qps).get(&qpn).and_then(Weak::upgrade) {
                        *lock(&qp.state) = QpState::Err;
                    }
                }
                ffi::IBV_EVENT_CQ_ERR => {
                    // SAFETY: for CQ events `element` is the CQ, valid until acknowledged.
                    let id = unsafe { (*(ev.element as *mut ffi::ibv_cq)).cq_context } as u64;
                    error!(device = %self.name, event = %what, "CQ overrun: completions lost");
                    if let Some(cq) = lock(&self.shared.cqs).get(&id).and_then(Weak::upgrade) {
                        cq.overflowed.store(true, Ordering::Release);
                        cq.fire();
                    }
                }
                ffi::IBV_EVENT_PORT_ERR => {
                    error!(device = %self.name, event = %what, "device unusable: failing its QPs");
                    self.shared.active.store(false, Ordering::Release);
                    flush_all = true;
                }
                ffi::IBV_EVENT_DEVICE_FATAL => {
                    // a driver that disassociates its contexts on removal reports it so
                    error!(device = %self.name, event = %what, "device removed: failing its QPs");
                    removed = true;
                }
                ffi::IBV_EVENT_PORT_ACTIVE if self.shared.removed.load(Ordering::Acquire) => {
                    debug!(device = %self.name, event = %what, "port event on a removed device");
                }
                ffi::IBV_EVENT_PORT_ACTIVE => {
                    info!(device = %self.name, event = %what, "port active again");
                    self.shared.active.store(true, Ordering::Release);
                }
                _ => debug!(device = %self.name, event = %what, "async event"),
            }
            // SAFETY: acknowledging the event we got above, exactly once.
            unsafe { (self.api.ack_async_event)(&mut ev) };
            if removed {
                self.removed();
            } else if flush_all {
                self.fail_qps();
            }
        }
    }
}
