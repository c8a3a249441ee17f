//! One SMC-R link's verbs objects: its own PD (RFC 7609 §2.1), one CQ for both
//! directions, the RC QP, the receive buffers, the send-slot accounting and the
//! completion handler that runs the receive side of the data path.
//!
//! Work-request ids tell the completion handler what completed: receive slots carry
//! their slot number, RDMA WRITEs [`WR_WRITE`], CDC SENDs the alert token and seqno of
//! their connection ([`wr_cdc`]), LLC SENDs the llc machine's `SendId`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use arrayvec::ArrayVec;
use smc_verbs::{
    AccessFlags, AddressHandle, Cq, Device, InitAttr, Mr, Mtu, Pd, Qp, QpCap, QpInitAttr,
    RdmaBuffer, RecvWr, RtrAttr, RtsAttr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus,
    WorkCompletion,
};
use smc_wire::cdc::CDC_TYPE;
use tracing::{debug, trace, warn};

use super::{Inbox, Inner};
use crate::clc::LgrId;
use crate::llc;

/// Send work requests per link (RDMA WRITEs, CDCs and LLC messages).
pub(crate) const SEND_WR: u32 = 512;
/// Receive work requests (and receive slots) per link.
pub(crate) const RECV_WR: u32 = 256;
/// Receive slot size: SMC-Rv2 LLC messages can be up to 8 KiB (Linux
/// `SMC_WR_BUF_V2_SIZE`); CDC and v1 LLC messages are 44 bytes.
pub(crate) const RECV_SLOT: usize = 8192;
/// Inline data we ask for (every 44-byte CDC and LLC message goes inline).
pub(crate) const MAX_INLINE: u32 = 64;
/// Staging slot for an inline message, and how many (far more than can be in the
/// act of being posted at once: inline data is copied when the WR is posted).
/// Local ACK timeout of link QPs, IBA encoding (4.096 µs × 2^15 ≈ 134 ms): Linux
/// `SMC_QP_TIMEOUT`, so that we retransmit at the kernel's pace. The IBA default of the
/// verbs layer (14, 67 ms) gave up (RetryExcErr after 7 retries, ~0.5 s) on a Linux peer
/// in a busy VM that stalled its receive path for over a second; Linux rxe counts
/// `retry_cnt` 7 as infinite and never gives up, the link being watched by TEST LINK.
const SMC_QP_TIMEOUT: u8 = 15;
const CTL_SLOT: usize = 64;
const CTL_SLOTS: usize = 4096;
/// Send slots a transmit needs at most: three RDMA WRITEs and the CDC.
pub(crate) const TX_SLOTS: i64 = 4;

/// Send slots connections leave free for LLC messages: a link carrying many busy
/// connections (all of a failed link's, after a failover) must still be able to send
/// its DELETE LINK, ADD LINK, CONFIRM RKEY and TEST LINK; an LLC message that finds no
/// slot counts as a failed send and takes the link down.
pub(crate) const LLC_RESERVE: i64 = 16;

/// Something waiting for send slots on a link (a connection whose CDC or RDMA WRITE did
/// not fit): kicked when slots come back or the link dies. A trait so that the link
/// does not import the connection that imports it.
pub(crate) trait SlotWaiter: Send + Sync {
    /// Slots are free again (or the link is dead): try again.
    fn kick(&self);
}
/// LLC messages of one link waiting for the event thread at most. A peer has a few LLC
/// exchanges in flight at a time (RFC 7609 §3.5.5.3 serializes them); a flood beyond this
/// is dropped on arrival, so it costs no memory and no event-thread time that other link
/// groups need (issue 10 item 9).
pub(crate) const MAX_LLC_QUEUED: usize = 32;

const KIND_SHIFT: u32 = 60;
const KIND_WRITE: u64 = 1;
const KIND_CDC: u64 = 2;
const KIND_LLC: u64 = 3;
const KIND_RECV: u64 = 4;
/// wr_id of an RDMA WRITE (only its slot matters).
pub(crate) const WR_WRITE: u64 = KIND_WRITE << KIND_SHIFT;

/// wr_id of a CDC SEND: the connection's alert token and the seqno, and how many send
/// slots the transmit used (its RDMA WRITEs are unsignalled: the CDC's completion
/// covers them, RC completes in order).
pub(crate) fn wr_cdc(token: u32, seq: u16, slots: u8) -> u64 {
    (KIND_CDC << KIND_SHIFT)
        | (u64::from(slots & 0x7) << 48)
        | (u64::from(token) << 16)
        | u64::from(seq)
}

fn wr_llc(id: llc::SendId) -> u64 {
    (KIND_LLC << KIND_SHIFT) | (id.0 & ((1 << KIND_SHIFT) - 1))
}

/// The peer's side of a link, in verbs terms.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerQpAttr {
    pub gid: smc_verbs::Gid,
    pub mac: smc_verbs::Mac,
    pub qpn: u32,
    pub psn: u32,
    pub mtu: Mtu,
}

/// Verbs objects and data-path state of one link.
pub(crate) struct LinkRes {
    pub lgr: LgrId,
    pub id: llc::LinkId,
    pub device: Device,
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
    /// Our initial send PSN.
    pub psn: u32,
    /// Largest MTU of the port.
    pub port_mtu: Mtu,
    recv_buf: Arc<RdmaBuffer>,
    recv_mr: Mr,
    /// Registered staging slots for inline CDC and LLC messages (the software RNIC
    /// copies inline data only out of registered memory of its device).
    ctl_buf: Arc<RdmaBuffer>,
    ctl_mr: Mr,
    ctl_next: std::sync::atomic::AtomicU32,
    /// Free send-queue slots (given back by the signalled WR that ends each batch).
    send_free: AtomicI64,
    /// Connections waiting for send slots.
    waiters: Mutex<VecDeque<Weak<dyn SlotWaiter>>>,
    /// A receive completion arrived since the event thread last looked (TEST LINK).
    pub activity: AtomicBool,
    /// LLC messages of this link in the event thread's inbox ([`MAX_LLC_QUEUED`]).
    pub llc_queued: AtomicUsize,
    /// Destroyed or failed: no more posting or reposting.
    pub dead: AtomicBool,
    /// The QP is (or is about to be) in the error state: connections post nothing more
    /// on it and wait for the endpoint to move them (RFC 7609 §4.6) or end them. A post
    /// on a QP in error completes at once, and on the RNIC's engine thread (a waiter
    /// kicked by this link's completion handler) that would run the handler inside
    /// itself.
    pub failed: AtomicBool,
    /// Ended in order but still acknowledging what the peer sends ([`LinkRes::linger`]):
    /// what arrives is dropped, nothing is posted.
    pub lingering: AtomicBool,
    /// Large LLC messages (SMC-Rv2) sent from registered memory until their completion.
    big_sends: Mutex<Vec<(u64, Mr)>>,
    handler_lock: Mutex<()>,
    /// The thread inside [`LinkRes::on_cq_event`] ([`this_thread`]; 0: none), so that a
    /// drain asked for further down its own stack does not wait for itself.
    handler_thread: AtomicUsize,
    /// Fault injection (`Stack::hold_link_completions`): completions stay in the CQ
    /// for everything but [`LinkRes::drain_completions`].
    held: AtomicBool,
    stack: Weak<Inner>,
}

/// A number unique to the calling thread while it lives (the address of one of its
/// thread-locals), never 0.
fn this_thread() -> usize {
    thread_local! {
        static ME: u8 = const { 0 };
    }
    ME.with(|m| m as *const u8 as usize)
}

impl std::fmt::Debug for LinkRes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkRes")
            .field("lgr", &self.lgr)
            .field("link", &self.id)
            .field("qpn", &self.qp.qpn())
            .finish()
    }
}

impl LinkRes {
    /// PD, CQ and QP in INIT with receive buffers posted (RFC 7609 §3.5.1.2).
    pub(crate) fn create(
        stack: &Arc<Inner>,
        device: &Device,
        lgr: LgrId,
        id: llc::LinkId,
    ) -> smc_verbs::Result<Arc<LinkRes>> {
        let pd = device.alloc_pd()?;
        let cq = device.create_cq(SEND_WR + RECV_WR + 16)?;
        let qp = pd.create_qp(&QpInitAttr {
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            cap: QpCap {
                max_send_wr: SEND_WR,
                max_recv_wr: RECV_WR,
                max_send_sge: 2,
                max_recv_sge: 1,
                max_inline_data: MAX_INLINE,
            },
            sq_sig_all: false,
        })?;
        qp.modify_to_init(&InitAttr {
            port_num: 1,
            pkey_index: 0,
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        })?;
        let recv_buf = RdmaBuffer::new(RECV_SLOT * RECV_WR as usize)?;
        let recv_mr = pd.reg_mr(&recv_buf, AccessFlags::LOCAL_WRITE)?;
        let ctl_buf = RdmaBuffer::new(CTL_SLOT * CTL_SLOTS)?;
        let ctl_mr = pd.reg_mr(&ctl_buf, AccessFlags::LOCAL_WRITE)?;
        let psn = rand::random::<u32>() & smc_verbs::PSN_MASK;
        let port_mtu = device.attr().active_mtu;
        let link = Arc::new(LinkRes {
            lgr,
            id,
            device: device.clone(),
            pd,
            cq,
            qp,
            psn,
            port_mtu,
            recv_buf,
            recv_mr,
            ctl_buf,
            ctl_mr,
            ctl_next: std::sync::atomic::AtomicU32::new(0),
            send_free: AtomicI64::new(i64::from(SEND_WR)),
            waiters: Mutex::new(VecDeque::new()),
            activity: AtomicBool::new(false),
            llc_queued: AtomicUsize::new(0),
            dead: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            lingering: AtomicBool::new(false),
            big_sends: Mutex::new(Vec::new()),
            handler_lock: Mutex::new(()),
            handler_thread: AtomicUsize::new(0),
            held: AtomicBool::new(false),
            stack: Arc::downgrade(stack),
        });
        for slot in 0..RECV_WR {
            link.post_recv(slot)?;
        }
        let weak = Arc::downgrade(&link);
        link.cq.set_handler(Some(Arc::new(move || {
            if let Some(l) = weak.upgrade() {
                l.on_cq_event(false);
            }
        })));
        link.cq.req_notify(false);
        debug!(?lgr, link = %id, qpn = link.qp.qpn(), "link QP created");
        Ok(link)
    }

    /// INIT → RTR → RTS towards the peer (RFC 7609 §3.5.1.3; Linux `smc_ib_ready_link`).
    pub(crate) fn connect(&self, peer: &PeerQpAttr) -> smc_verbs::Result<()> {
        let mut ah = AddressHandle::to_gid(peer.gid);
        ah.dmac = Some(peer.mac);
        self.qp.modify_to_rtr(&RtrAttr {
            path_mtu: peer.mtu.min(self.port_mtu),
            dest_qpn: peer.qpn,
            rq_psn: peer.psn,
            ah,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
        })?;
        self.qp.modify_to_rts(&RtsAttr {
            sq_psn: self.psn,
            timeout: SMC_QP_TIMEOUT,
            ..RtsAttr::default()
        })?;
        Ok(())
    }

    /// Marks the link failed and moves its QP to the error state (its outstanding work
    /// is flushed; the handler stays, so the flushes are seen).
    pub(crate) fn fail(&self) {
        self.failed.store(true, Ordering::SeqCst);
        if let Err(e) = self.qp.modify_to_err() {
            debug!(error = %e, "QP to ERR failed");
        }
    }

    /// The link ended in order (its link group terminated, or DELETE LINK) while healthy:
    /// its QP stays ready to acknowledge what the peer still sends for a while
    /// (`HostState::lingering`), and the connections and LLC flows are over, so that
    /// arrivals are dropped. A Linux peer sends abort CDCs for the connections it still
    /// holds once it processes our DELETE LINK (ALL), and waits in `close()` for their
    /// completion (`smc_cdc_wait_pend_tx_wr`); unacknowledged, rxe retransmits them for
    /// ever and that `close()` never returns (seen in kpeer-linux-client.sh, urg).
    pub(crate) fn linger(&self) {
        self.lingering.store(true, Ordering::SeqCst);
        self.activity.store(false, Ordering::Relaxed);
        self.wake_waiters();
    }

    /// Stops the link: QP to ERR (outstanding work is flushed), what its completion
    /// queue still holds processed, handler removed.
    ///
    /// RFC 7609 §2.3, §4.6: a CDC that reached this link before it went down was
    /// acknowledged to the peer by our RNIC, so the peer counts it delivered and will not
    /// send it again on another link. Dropping it with the handler would lose the peer's
    /// data or its consumer cursor update, and the connection would wait forever (seen in `tests/system/smc-failover.sh` when a DELETE LINK
    /// made us destroy a link whose queue still held the peer's last CDCs).
    pub(crate) fn destroy(self: &Arc<Self>) {
        if self.dead.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Err(e) = self.qp.modify_to_err() {
            debug!(error = %e, "QP to ERR failed");
        }
        self.on_cq_event(false);
        self.cq.set_handler(None);
        self.wake_waiters();
    }

    /// Stages a small message in registered memory for an inline send.
    fn ctl_sge(&self, bytes: &[u8]) -> Sge {
        let slot = self.ctl_next.fetch_add(1, Ordering::Relaxed) as usize % CTL_SLOTS;
        let len = bytes.len().min(CTL_SLOT);
        self.ctl_buf.write(slot * CTL_SLOT, &bytes[..len]);
        self.ctl_mr.sge(slot * CTL_SLOT, len as u32)
    }

    fn post_recv(&self, slot: u32) -> smc_verbs::Result<()> {
        let sge = [self
            .recv_mr
            .sge(slot as usize * RECV_SLOT, RECV_SLOT as u32)];
        self.qp.post_recv(&RecvWr {
            wr_id: (KIND_RECV << KIND_SHIFT) | u64::from(slot),
            sg_list: &sge,
        })
    }

    /// Takes `n` send slots for a connection's transmit if they are free beyond the
    /// [`LLC_RESERVE`].
    pub(crate) fn try_reserve_data(&self, n: i64) -> bool {
        self.reserve_above(n, LLC_RESERVE)
    }

    /// Takes `n` send slots if they are free.
    pub(crate) fn try_reserve(&self, n: i64) -> bool {
        self.reserve_above(n, 0)
    }

    /// Takes `n` send slots if at least `floor` stay free afterwards.
    fn reserve_above(&self, n: i64, floor: i64) -> bool {
        let mut cur = self.send_free.load(Ordering::SeqCst);
        loop {
            if cur - n < floor {
                return false;
            }
            match self.send_free.compare_exchange_weak(
                cur,
                cur - n,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return true,
                Err(v) => cur = v,
            }
        }
    }

    /// Gives `n` send slots back.
    pub(crate) fn release(&self, n: i64) {
        if n > 0 {
            self.send_free.fetch_add(n, Ordering::SeqCst);
        }
    }

    /// Free send slots (stats).
    pub(crate) fn free_slots(&self) -> i64 {
        self.send_free.load(Ordering::SeqCst)
    }

    /// Queue a connection to be driven when send slots come back.
    pub(crate) fn add_waiter<W: SlotWaiter + 'static>(&self, conn: &Arc<W>) {
        if let Ok(mut w) = self.waiters.lock() {
            let weak: Weak<dyn SlotWaiter> = Arc::downgrade(conn) as Weak<dyn SlotWaiter>;
            w.push_back(weak);
        }
    }

    fn wake_waiters(&self) {
        if self.dead.load(Ordering::SeqCst) {
            // Every waiter once: a dead link never gives slots back, so a connection
            // kicked here must not be popped again even if it queued itself anew (the
            // event thread would spin forever, stopping the whole stack).
            let all = match self.waiters.lock() {
                Ok(mut w) => std::mem::take(&mut *w),
                Err(_) => return,
            };
            for c in all {
                if let Some(c) = c.upgrade() {
                    c.kick();
                }
            }
            return;
        }
        loop {
            if self.free_slots() < TX_SLOTS + LLC_RESERVE {
                return;
            }
            let next = match self.waiters.lock() {
                Ok(mut w) => w.pop_front(),
                Err(_) => None,
            };
            match next {
                None => return,
                Some(c) => {
                    if let Some(c) = c.upgrade() {
                        c.kick();
                    }
                }
            }
        }
    }

    /// Posts an LLC message (RC SEND; inline when it fits).
    pub(crate) fn post_llc(&self, id: llc::SendId, bytes: &[u8]) -> smc_verbs::Result<()> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(smc_verbs::VerbsError::InvalidState(self.qp.state()));
        }
        if !self.try_reserve(1) {
            return Err(smc_verbs::VerbsError::QueueFull);
        }
        let res = if bytes.len() <= MAX_INLINE as usize {
            let sge = [self.ctl_sge(bytes)];
            self.qp.post_send(&SendWr {
                wr_id: wr_llc(id),
                op: SendOp::Send,
                sg_list: &sge,
                flags: SendFlags::SIGNALED | SendFlags::INLINE,
            })
        } else {
            // SMC-Rv2 ADD LINK with its RKey list can exceed the inline limit: send it
            // from registered memory kept until the completion.
            let r = RdmaBuffer::new(bytes.len())
                .map_err(smc_verbs::VerbsError::from)
                .and_then(|buf| {
                    buf.write(0, bytes);
                    let mr = self.pd.reg_mr(&buf, AccessFlags::empty())?;
                    let sge = [mr.sge(0, bytes.len() as u32)];
                    self.qp.post_send(&SendWr {
                        wr_id: wr_llc(id),
                        op: SendOp::Send,
                        sg_list: &sge,
                        flags: SendFlags::SIGNALED,
                    })?;
                    if let Ok(mut b) = self.big_sends.lock() {
                        b.push((wr_llc(id), mr));
                    }
                    Ok(())
                });
            r
        };
        if res.is_err() {
            self.release(1);
        }
        res
    }

    /// Posts the RDMA WRITEs and the CDC of one transmit, in order, as one batch.
    /// `slots` were reserved by the caller; unused ones are given back.
    pub(crate) fn post_transmit(
        &self,
        writes: &[(u64, u32, u32)],
        rkey: u32,
        sndbuf: &Mr,
        cdc: &[u8; 44],
        cdc_wr: u64,
        slots: i64,
    ) -> smc_verbs::Result<()> {
        let n = writes.len() as i64 + 1;
        if self.dead.load(Ordering::SeqCst) || self.failed.load(Ordering::SeqCst) {
            self.release(slots);
            return Err(smc_verbs::VerbsError::InvalidState(self.qp.state()));
        }
        let mut sges: [Sge; 4] = [Sge {
            addr: 0,
            length: 0,
            lkey: 0,
        }; 4];
        for (i, &(_, src_off, len)) in writes.iter().enumerate() {
            sges[i] = sndbuf.sge(src_off as usize, len);
        }
        sges[writes.len()] = self.ctl_sge(cdc);
        // On the stack: a transmit is at most three WRITEs and the CDC ([`TX_SLOTS`]).
        let mut wrs: ArrayVec<SendWr<'_>, { TX_SLOTS as usize }> = ArrayVec::new();
        for (i, &(remote, _, _)) in writes.iter().enumerate() {
            wrs.push(SendWr {
                wr_id: WR_WRITE,
                op: SendOp::RdmaWrite {
                    remote_addr: remote,
                    rkey,
                },
                sg_list: std::slice::from_ref(&sges[i]),
                flags: SendFlags::empty(),
            });
        }
        wrs.push(SendWr {
            wr_id: cdc_wr,
            op: SendOp::Send,
            sg_list: std::slice::from_ref(&sges[writes.len()]),
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
        });
        match self.qp.post_send_batch(&wrs) {
            Ok(()) => {
                self.release(slots - n);
                Ok(())
            }
            Err(e) => {
                self.release(slots);
                Err(e)
            }
        }
    }

    /// Processes every completion this link's CQ holds now, on the calling thread (after
    /// the handler's run in progress, if there is one): before a failover validation CDC
    /// that arrived on another link is checked (`Inner::on_cdc`, RFC 7609 §4.6.1). Our
    /// RNIC acknowledges a CDC once it is in the receive queue, which may be before a
    /// handler processed its completion (the engine receives in place of a stuck thread,
    /// or a completion lands while the CQ is disarmed during another thread's run; any
    /// hardware RNIC acknowledges long before the CQ is polled), so the peer may count it
    /// delivered (SS) while our SR does not have it yet. Nothing if the calling thread is
    /// already inside this link's handler further up its stack.
    pub(crate) fn drain_completions(self: &Arc<Self>) {
        if self.handler_thread.load(Ordering::SeqCst) == this_thread() {
            return;
        }
        self.on_cq_event(true);
    }

    /// Fault injection (tests): while `hold`, the completions of this link stay in its
    /// CQ, as if the thread that would run its handler had not got to them yet; only a
    /// failover validation's [`LinkRes::drain_completions`] takes them. Letting go
    /// processes what waits.
    pub(crate) fn hold_completions(self: &Arc<Self>, hold: bool) {
        self.held.store(hold, Ordering::SeqCst);
        if !hold {
            self.on_cq_event(false);
        }
    }

    /// The CQ fired (provider thread): poll everything, re-arm, poll again (ibverbs
    /// pattern, so completions racing with the re-arm are not lost).
    fn on_cq_event(self: &Arc<Self>, ignore_hold: bool) {
        if !ignore_hold && self.held.load(Ordering::SeqCst) {
            return;
        }
        let Ok(_g) = self.handler_lock.lock() else {
            return;
        };
        struct Owner<'a>(&'a AtomicUsize);
        impl Drop for Owner<'_> {
            fn drop(&mut self) {
                self.0.store(0, Ordering::SeqCst);
            }
        }
        self.handler_thread.store(this_thread(), Ordering::SeqCst);
        let _owner = Owner(&self.handler_thread);
        let Some(stack) = self.stack.upgrade() else {
            return;
        };
        let mut wcs = [WorkCompletion::default(); 32];
        loop {
            loop {
                let n = self.cq.poll(&mut wcs);
                if n == 0 {
                    break;
                }
                for wc in &wcs[..n] {
                    self.on_completion(&stack, wc);
                }
            }
            if self.dead.load(Ordering::SeqCst) {
                break;
            }
            self.cq.req_notify(false);
            if self.cq.pending() == 0 {
                break;
            }
        }
        self.wake_waiters();
    }

    fn on_completion(self: &Arc<Self>, stack: &Arc<Inner>, wc: &WorkCompletion) {
        let kind = wc.wr_id >> KIND_SHIFT;
        if kind == KIND_RECV {
            self.on_recv(stack, wc);
            return;
        }
        let ok = wc.status == WcStatus::Success;
        if !ok {
            self.failed.store(true, Ordering::SeqCst);
        }
        // Slots come back with the signalled WR that ends a batch: an LLC SEND (1) or a
        // CDC (its WRITEs + 1). A failed unsignalled WRITE still completes (IBA), but the
        // CDC behind it is flushed and gives the slots back.
        match kind {
            KIND_CDC => self.release(((wc.wr_id >> 48) & 0x7) as i64),
            KIND_LLC => self.release(1),
            _ => {}
        }
        if !ok && wc.status != WcStatus::WrFlushErr {
            warn!(lgr = ?self.lgr, link = %self.id, status = ?wc.status, "send failed");
        }
        match kind {
            KIND_CDC => {
                let token = ((wc.wr_id >> 16) & 0xFFFF_FFFF) as u32;
                let seq = (wc.wr_id & 0xFFFF) as u16;
                if let Some(c) = stack.conn_by_token(token, self.lgr) {
                    c.on_cdc_complete(seq, ok);
                }
            }
            KIND_LLC => {
                if let Ok(mut b) = self.big_sends.lock() {
                    b.retain(|(id, _)| *id != wc.wr_id);
                }
                stack.post(Inbox::LlcSent {
                    lgr: self.lgr,
                    link: self.id,
                    id: llc::SendId(wc.wr_id & ((1 << KIND_SHIFT) - 1)),
                    ok,
                });
            }
            _ => {}
        }
        if !ok && !self.dead.load(Ordering::SeqCst) {
            stack.post(Inbox::LinkError {
                lgr: self.lgr,
                link: self.id,
            });
        }
    }

    fn on_recv(self: &Arc<Self>, stack: &Arc<Inner>, wc: &WorkCompletion) {
        let slot = (wc.wr_id & 0xFFFF_FFFF) as u32;
        if wc.status != WcStatus::Success {
            self.failed.store(true, Ordering::SeqCst);
            // `destroy` marks the link dead before it moves the QP to ERR, so a flushed
            // receive on a live link means the QP went to ERR beneath us: after an error
            // of its own (whose completion comes too), or moved there by the provider on a
            // port or device error (an IBA asynchronous event; smc-ibverbs does that). On an
            // idle link nothing else would tell, as Linux's smcr_port_err() takes the
            // port's links down at once.
            if !self.dead.load(Ordering::SeqCst) && !self.lingering.load(Ordering::SeqCst) {
                if wc.status == WcStatus::WrFlushErr {
                    debug!(lgr = ?self.lgr, link = %self.id, "receive flushed: the QP is in error");
                } else {
                    warn!(lgr = ?self.lgr, link = %self.id, status = ?wc.status, "receive failed");
                }
                stack.post(Inbox::LinkError {
                    lgr: self.lgr,
                    link: self.id,
                });
            }
            return;
        }
        self.activity.store(true, Ordering::Relaxed);
        let len = (wc.byte_len as usize).min(RECV_SLOT);
        let mut msg = [0u8; 44];
        let off = slot as usize * RECV_SLOT;
        if wc.opcode == WcOpcode::Recv && len >= 1 {
            let mut first = [0u8; 1];
            self.recv_buf.read(off, &mut first);
            if first[0] == CDC_TYPE {
                if len >= 44 {
                    self.recv_buf.read(off, &mut msg);
                    stack.on_cdc(self, &msg, Instant::now());
                } else {
                    trace!(len, "short CDC dropped");
                }
            } else if self.dead.load(Ordering::SeqCst) || self.lingering.load(Ordering::SeqCst) {
                // Drained by `destroy`, or lingering: only CDCs must still be taken (the
                // peer counts them delivered); the link's LLC flows are over.
                trace!(lgr = ?self.lgr, link = %self.id, "LLC message on a destroyed link dropped");
            } else if self.llc_queued.fetch_add(1, Ordering::AcqRel) >= MAX_LLC_QUEUED {
                self.llc_queued.fetch_sub(1, Ordering::AcqRel);
                stack.counters.llc_dropped.fetch_add(1, Ordering::Relaxed);
                trace!(lgr = ?self.lgr, link = %self.id, "LLC flood: message dropped");
            } else {
                let mut v = vec![0u8; len];
                self.recv_buf.read(off, &mut v);
                stack.post(Inbox::LlcRecv {
                    lgr: self.lgr,
                    link: self.id,
                    bytes: v,
                });
            }
        }
        if !self.dead.load(Ordering::SeqCst) {
            if let Err(e) = self.post_recv(slot) {
                debug!(error = %e, "receive repost failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::mpsc;
    use std::time::Duration;

    use crate::{SmcListener, SmcStream, Stack, StackConfig};

    /// A loopback address private to this test process (as tests/common does).
    fn ip(host: u8) -> std::net::IpAddr {
        let pid = std::process::id();
        format!("127.{}.{}.{host}", 100 + pid % 100, (pid / 100) % 250)
            .parse()
            .unwrap()
    }

    fn stack(local: std::net::IpAddr) -> Stack {
        let mut c = StackConfig::with_provider(smc_softroce::SoftRoce::global());
        c.skip_tcp_option = format!("{}/24", ip(0)).parse().unwrap();
        c.local_addr = Some(local);
        Stack::new(c).unwrap()
    }

    /// A link destroyed while a connection waits for its send slots (a peer that stops
    /// acknowledging, or an LLC flood that filled the send queue, then the link is taken
    /// down): every waiter is woken once and `destroy` returns. It used to kick the
    /// same connection forever — the connection, finding no slot, queued itself again —
    /// and the event thread that destroys links stopped the whole stack.
    #[test]
    fn destroying_a_link_wakes_each_waiting_connection_once() {
        let (sip, cip) = (ip(60), ip(61));
        let (srv, cli) = (stack(sip), stack(cip));
        let l = SmcListener::bind_with(&srv, (sip, 0)).unwrap();
        let to = l.local_addr().unwrap();
        let c = SmcStream::connect_with(&cli, to).unwrap();
        let (_s, _) = l.accept().unwrap();
        assert!(c.mode().is_smc(), "{}", c.mode());
        let conns = cli.inner.lock_core().conns();
        assert_eq!(conns.len(), 1);
        let conn = conns[0].clone();
        let link = conn
            .lock()
            .rdma()
            .expect("an SMC-R connection")
            .link
            .clone();
        // Every send slot taken (as by work the peer never acknowledges), then data to
        // send: the connection registers as a waiter.
        let mut waiting = false;
        for _ in 0..100 {
            let free = link.free_slots();
            if free > 0 {
                let _ = link.try_reserve(free);
            }
            (&c).write_all(&[7u8; 1000]).unwrap();
            if conn.lock().waiting_slots {
                waiting = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(waiting, "the connection never waited for send slots");
        let (tx, rx) = mpsc::channel();
        let l2 = link.clone();
        std::thread::spawn(move || {
            l2.destroy();
            let _ = tx.send(());
        });
        assert!(
            rx.recv_timeout(Duration::from_secs(10)).is_ok(),
            "destroying the link never returned (its waiters were kicked in a loop)"
        );
        // Nobody waits on a dead link any more.
        assert!(link.waiters.lock().unwrap().is_empty());
        drop((c, conn, link));
    }
}
