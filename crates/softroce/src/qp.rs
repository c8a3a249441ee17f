//! Reliable-connected queue pairs: the IBA state machine, the requester
//! (segmentation, PSNs, retransmission, RNR back-off, completions) and the
//! responder (in-order execution, duplicates, NAKs, RDMA READ and atomic
//! responses). Rules cited as CHECKLIST §C.x ids (SEG-n, PSN-n, ACK-n,
//! RTY-n, RK-Cn, CQ-n).
//!
//! Threading: all state of a QP sits behind one mutex. Application threads
//! post and transmit directly under that lock (no thread hop); the device's
//! engine thread feeds received packets and timer expiries through the same
//! lock. Completion notifications fire after the lock is released.

use std::any::Any;
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrayvec::ArrayVec;
use smc_verbs::{
    psn_add, psn_diff, AccessFlags, InitAttr, QpCap, QpInitAttr, QpOps, QpState, RecvWr, Result,
    RtrAttr, RtsAttr, SendFlags, SendOp, SendWr, VerbsError, WcOpcode, WcStatus, WorkCompletion,
    PSN_MASK,
};

use crate::cq::{CqShared, SoftCq};
use crate::device::{DevHandle, DevShared, TxBatch, TxPath, TX};
use crate::fault::FaultState;
use crate::icrc::{IpInfo, IPV4_DF};
use crate::mr::{MrEntry, SoftPd};
use crate::wire::{
    AethRepr, AtomicEthRepr, BthRepr, Opcode, PacketRepr, Parsed, RethRepr, Syndrome,
};

/// Maximum SGEs per work request.
pub(crate) const MAX_SGE: usize = 8;
/// Maximum inline data per send work request.
pub(crate) const MAX_INLINE: usize = 256;
/// Most packets a requester keeps in flight before waiting for ACKs.
const WINDOW: i32 = 256;
/// Smallest congestion window. IBA has no congestion control, but with
/// go-back-N every loss costs a whole window of retransmissions, so the
/// window shrinks on loss (NAK sequence error, ACK timeout) and grows back
/// by one packet per acknowledged packet batch (AIMD).
const MIN_WINDOW: i32 = 8;
/// Most packets (PSNs) one message may span: half the 2^23 PSN comparison
/// window, leaving ample room for the send window (1 GiB at path MTU 256,
/// the whole 2 GiB IBA maximum from MTU 512 up).
const MAX_MSG_PKTS: u64 = 1 << 22;
/// Inside long messages, AckReq is set every this many packets (ACK-3).
const ACK_EVERY: u32 = 64;
/// Read response packets one service pass emits per QP.
const READ_CHUNK: u32 = 64;
/// Floor of the local ACK timeout, so that tiny IBA timeouts do not cause
/// spurious retransmissions on a loaded host.
const MIN_ACK_TIMEOUT: Duration = Duration::from_millis(1);

/// A contiguous piece of local memory named by an SGE (validated).
#[derive(Clone, Debug)]
struct LocalSeg {
    mr: Arc<MrEntry>,
    /// Offset inside `mr.buf`.
    boff: usize,
    len: usize,
}

/// Copies `out.len()` message bytes starting at message offset `off` out of
/// the gather list; false if a region of the list was deregistered.
fn gather(segs: &[LocalSeg], mut off: usize, out: &mut [u8]) -> bool {
    let mut done = 0;
    for s in segs {
        if done == out.len() {
            break;
        }
        if off >= s.len {
            off -= s.len;
            continue;
        }
        let n = (s.len - off).min(out.len() - done);
        let Some(m) = s.mr.enter() else { return false };
        m.read(s.boff + off, &mut out[done..done + n]);
        done += n;
        off = 0;
    }
    true
}

/// Copies `data` into the scatter list at message offset `off`. Fails with
/// `LocLenErr` if it does not fit, `LocProtErr` if a region of the list was
/// deregistered.
fn scatter(segs: &[LocalSeg], mut off: usize, data: &[u8]) -> std::result::Result<(), WcStatus> {
    let mut done = 0;
    for s in segs {
        if done == data.len() {
            break;
        }
        if off >= s.len {
            off -= s.len;
            continue;
        }
        let n = (s.len - off).min(data.len() - done);
        let Some(m) = s.mr.enter() else {
            return Err(WcStatus::LocProtErr);
        };
        m.write(s.boff + off, &data[done..done + n]);
        done += n;
        off = 0;
    }
    if done == data.len() {
        Ok(())
    } else {
        Err(WcStatus::LocLenErr)
    }
}

struct SendWqe {
    wr_id: u64,
    op: SendOp,
    signaled: bool,
    solicited: bool,
    fence: bool,
    segs: ArrayVec<LocalSeg, MAX_SGE>,
    inline: Option<ArrayVec<u8, MAX_INLINE>>,
    len: u32,
    local_err: Option<WcStatus>,
    first_psn: u32,
    npkts: u32,
    /// RDMA READ response packets placed so far (in order).
    read_got: u32,
}

impl SendWqe {
    fn rd_atomic(&self) -> bool {
        matches!(
            self.op,
            SendOp::RdmaRead { .. } | SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. }
        )
    }
    fn wc_opcode(&self) -> WcOpcode {
        wc_opcode(&self.op)
    }
}

fn wc_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendWithImm { .. } => WcOpcode::Send,
        SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
        SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
        SendOp::AtomicCmpSwap { .. } => WcOpcode::CompSwap,
        SendOp::AtomicFetchAdd { .. } => WcOpcode::FetchAdd,
    }
}

struct RecvWqe {
    wr_id: u64,
    segs: ArrayVec<LocalSeg, MAX_SGE>,
    local_err: Option<WcStatus>,
}

/// A multi-packet request in progress at the responder (SEG-8).
enum InProgress {
    Send {
        wqe: RecvWqe,
        written: usize,
    },
    Write {
        mr: Option<Arc<MrEntry>>,
        boff: usize,
        remaining: usize,
        total: u32,
    },
}

/// Saved RDMA READ / atomic request for duplicate replay (PSN-3). A READ
/// keeps its R_Key and address, not the region: a replay looks the key up
/// and checks it again (RK-C1), so a deregistered region is never read.
enum RdRes {
    Read {
        first_psn: u32,
        npkts: u32,
        rkey: u32,
        va: u64,
        len: usize,
    },
    Atomic {
        psn: u32,
        orig: u64,
    },
}

/// Read responses still to be sent.
struct PendingRead {
    first_psn: u32,
    next: u32,
    npkts: u32,
    mr: Option<Arc<MrEntry>>,
    boff: usize,
    len: usize,
    /// MSN carried by the responses (the READ's own, IBA AETH MSN).
    msn: u32,
}

/// A response the responder owes. The IBA RC responder answers requests
/// in their PSN order (IBA vol. 1 §9.7, "responses in PSN order"): while a
/// READ's responses still stream (at most READ_CHUNK packets per service
/// pass), the ACKs, NAKs and atomic ACKs of later requests wait behind it
/// here instead of overtaking it (a requester reads an ACK beyond an
/// unanswered READ as a lost response, ACK-2, and re-requests it).
enum Resp {
    Read(PendingRead),
    /// Coalesced ACK of everything up to `psn` (ACK-2).
    Ack {
        psn: u32,
        msn: u32,
    },
    AtomicAck {
        psn: u32,
        orig: u64,
        msn: u32,
    },
    /// A NAK; a `fatal` one moves the QP to ERR once it has been sent.
    Nak {
        psn: u32,
        syn: Syndrome,
        msn: u32,
        fatal: bool,
    },
}

/// Most responses a QP can owe: the READs and atomics within
/// `max_dest_rd_atomic` plus their replays, and one ACK or NAK between any
/// two of them (consecutive ACKs merge, repeated NAKs are not queued).
const MAX_RESPONSES: usize = 4 * MAX_RD_ATOMIC + 4;

/// Device limit of READ/atomic requests in progress per QP, both as
/// requester (`max_rd_atomic`) and responder (`max_dest_rd_atomic`).
pub(crate) const MAX_RD_ATOMIC: usize = 16;

/// Where packets of this QP go.
struct Path {
    dst: socket2::SockAddr,
    peer_ip: IpAddr,
    ip: IpInfo,
    sport: u16,
    dport: u16,
}

pub(crate) struct QpInner {
    state: QpState,
    access: AccessFlags,
    mtu: usize,
    dest_qpn: u32,
    path: Option<Path>,
    timeout: Option<Duration>,
    retry_cnt: u8,
    rnr_retry: u8,
    min_rnr_timer: u8,
    max_rd_atomic: u8,
    max_dest_rd_atomic: u8,
    fault: Option<FaultState>,
    // Requester.
    sq: VecDeque<SendWqe>,
    next_wqe: usize,
    next_pkt: u32,
    psn: u32,
    /// One past the highest PSN ever sent.
    max_psn: u32,
    una: u32,
    retry_left: u8,
    rnr_left: u8,
    cwnd: i32,
    timer: Option<Instant>,
    rnr_until: Option<Instant>,
    last_rewind: Option<u32>,
    // Responder.
    epsn: u32,
    msn: u32,
    rq: VecDeque<RecvWqe>,
    cur: Option<InProgress>,
    nak_sent: bool,
    ack_pending: bool,
    rd_res: VecDeque<RdRes>,
    /// Responses owed, in PSN order (see [`Resp`]).
    responses: VecDeque<Resp>,
    /// A fatal NAK waits in `responses`: requests are no longer executed.
    resp_fatal: bool,
}

/// Per-call context: the QP, the transmit batch and deferred notifications.
pub(crate) struct Ctx<'a> {
    qp: &'a QpShared,
    tx: &'a mut TxBatch,
    now: Instant,
    fire_send: bool,
    fire_recv: bool,
}

/// The shared part of a QP (in the device's QPN table).
pub(crate) struct QpShared {
    pub(crate) qpn: u32,
    pub(crate) dev: Arc<DevShared>,
    /// This QP's sending socket and its UDP source port (`None`: creating
    /// it failed, the device socket and port serve instead).
    tx_sock: Option<socket2::Socket>,
    sport: u16,
    pd: u32,
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
    cap: QpCap,
    sig_all: bool,
    inner: Mutex<QpInner>,
    /// Next timer deadline in ns since the device epoch (0 = none).
    pub(crate) deadline: AtomicU64,
    /// Set when the engine must give the QP a service pass.
    pub(crate) work: AtomicBool,
}

/// The QP handle ([`QpOps`]); dropping it destroys the QP.
pub(crate) struct SoftQp {
    shared: Arc<QpShared>,
    _dev: Arc<DevHandle>,
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        self.shared.dev.remove_qp(self.shared.qpn);
    }
}

pub(crate) fn create(pd: &SoftPd, attr: &QpInitAttr) -> Result<Arc<dyn QpOps>> {
    let dev = &pd.dev;
    let cq_of = |cq: &smc_verbs::Cq| -> Result<Arc<CqShared>> {
        let soft =
            cq.0.as_any()
                .downcast_ref::<SoftCq>()
                .ok_or(VerbsError::WrongDevice)?;
        if !Arc::ptr_eq(&soft._dev.shared, &dev.shared) {
            return Err(VerbsError::WrongDevice);
        }
        Ok(soft.shared.clone())
    };
    let send_cq = cq_of(&attr.send_cq)?;
    let recv_cq = cq_of(&attr.recv_cq)?;
    let a = &dev.shared.attr;
    let cap = attr.cap;
    if cap.max_send_wr == 0
        || cap.max_send_wr > a.max_qp_wr
        || cap.max_recv_wr > a.max_qp_wr
        || cap.max_send_sge as usize > MAX_SGE
        || cap.max_recv_sge as usize > MAX_SGE
        || cap.max_inline_data as usize > MAX_INLINE
    {
        return Err(VerbsError::InvalidArgument(
            "QP capabilities exceed the device limits",
        ));
    }
    // A source port of its own per QP, for ECMP (as rxe does).
    let (tx_sock, sport) = match crate::device::qp_socket(dev.shared.attr.local_addr) {
        Ok((s, port)) => (Some(s), port),
        Err(e) => {
            // E.g. out of file descriptors: still a working QP, only
            // without its own ECMP entropy.
            tracing::warn!(error = %e, "no socket of its own for a QP; sending from the device port");
            dev.shared
                .stats
                .qp_socket_errors
                .fetch_add(1, Ordering::Relaxed);
            (None, dev.shared.local_port)
        }
    };
    let shared = dev.shared.add_qp(|qpn| QpShared {
        qpn,
        dev: dev.shared.clone(),
        tx_sock,
        sport,
        pd: pd.id,
        send_cq,
        recv_cq,
        cap,
        sig_all: attr.sq_sig_all,
        inner: Mutex::new(QpInner::new(cap)),
        deadline: AtomicU64::new(0),
        work: AtomicBool::new(false),
    })?;
    Ok(Arc::new(SoftQp {
        shared,
        _dev: dev.clone(),
    }))
}

/// IBA RNR timer encoding (5 bits) to a duration (IBA Table 45, in ms).
pub(crate) fn rnr_timeout(code: u8) -> Duration {
    const US: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    Duration::from_micros(US[(code & 31) as usize] as u64)
}

impl QpShared {
    /// The socket this QP's packets leave by (open while `self` lives).
    pub(crate) fn tx_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        match &self.tx_sock {
            Some(s) => s.as_raw_fd(),
            None => self.dev.sock.as_raw_fd(),
        }
    }

    /// Runs `f` under the QP lock with a transmit context; sends what it
    /// queued, publishes timers, then fires CQ notifications unlocked.
    pub(crate) fn run<R>(&self, f: impl FnOnce(&mut QpInner, &mut Ctx<'_>) -> R) -> R {
        let (r, fire_send, fire_recv, deadline, work) = TX.with(|cell| {
            let mut batch = cell.borrow_mut();
            let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            let mut ctx = Ctx {
                qp: self,
                tx: &mut batch,
                now: Instant::now(),
                fire_send: false,
                fire_recv: false,
            };
            let r = f(&mut g, &mut ctx);
            let (fs, fr) = (ctx.fire_send, ctx.fire_recv);
            if let Some(fault) = g.fault.as_mut() {
                // A held (reordered) packet must not wait forever.
                if let (Some(held), Some(path)) = (fault.held.take(), g.path.as_ref()) {
                    batch.push_raw(&held, &path.dst, self.tx_fd(), &self.dev);
                }
            }
            batch.flush(&self.dev);
            (r, fs, fr, g.next_deadline(), g.has_work())
        });
        self.work.store(work, Ordering::Release);
        let ns = deadline
            .map(|d| self.dev.ns_since_epoch(d).max(1))
            .unwrap_or(0);
        self.deadline.store(ns, Ordering::Release);
        if ns != 0 || work {
            self.dev.wake_if_later(ns, work);
        }
        if fire_send {
            self.send_cq.fire();
        }
        if fire_recv {
            self.recv_cq.fire();
        }
        r
    }

    /// Handles one received packet (engine thread); false if it was not
    /// from the QP's connected peer and was dropped unprocessed.
    pub(crate) fn on_packet(&self, p: &Parsed, pkt: &[u8], src: IpAddr) -> bool {
        self.run(|inner, ctx| inner.on_packet(ctx, p, pkt, src))
    }

    /// Sends coalesced ACKs and continues transmission (engine, after a
    /// receive batch).
    pub(crate) fn after_batch(&self) {
        self.run(|inner, ctx| {
            inner.flush_ack(ctx);
            inner.pump(ctx);
        });
    }

    /// Timers and pending work (engine).
    pub(crate) fn service(&self) {
        self.run(|inner, ctx| inner.service(ctx));
    }
}

impl QpInner {
    fn new(cap: QpCap) -> QpInner {
        QpInner {
            state: QpState::Reset,
            access: AccessFlags::empty(),
            mtu: 1024,
            dest_qpn: 0,
            path: None,
            timeout: None,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            fault: None,
            sq: VecDeque::with_capacity(cap.max_send_wr as usize),
            next_wqe: 0,
            next_pkt: 0,
            psn: 0,
            max_psn: 0,
            una: 0,
            retry_left: 7,
            rnr_left: 7,
            cwnd: WINDOW,
            timer: None,
            rnr_until: None,
            last_rewind: None,
            epsn: 0,
            msn: 0,
            rq: VecDeque::with_capacity(cap.max_recv_wr as usize),
            cur: None,
            nak_sent: false,
            ack_pending: false,
            rd_res: VecDeque::with_capacity(MAX_RD_ATOMIC),
            responses: VecDeque::with_capacity(MAX_RESPONSES),
            resp_fatal: false,
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        match (self.timer, self.rnr_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Work the engine must do without a packet or timer to trigger it:
    /// only streaming READ responses (and what waits behind them). The send
    /// queue advances on ACKs and timers, which already run through the
    /// engine.
    fn has_work(&self) -> bool {
        !self.responses.is_empty()
    }

    // ----- completions and errors -------------------------------------

    fn complete_send(&mut self, ctx: &mut Ctx<'_>, w: &SendWqe, status: WcStatus) {
        if !(w.signaled || ctx.qp.sig_all || status != WcStatus::Success) {
            return;
        }
        let byte_len = match w.op {
            SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. } => 8,
            _ => w.len,
        };
        let wc = WorkCompletion {
            wr_id: w.wr_id,
            status,
            opcode: w.wc_opcode(),
            byte_len,
            imm_data: None,
            qp_num: ctx.qp.qpn,
            src_qp: self.dest_qpn,
            solicited: false,
        };
        match ctx.qp.send_cq.push(wc) {
            Ok(f) => ctx.fire_send |= f,
            Err(()) => self.enter_err(ctx),
        }
    }

    fn complete_recv(&mut self, ctx: &mut Ctx<'_>, wc: WorkCompletion) {
        match ctx.qp.recv_cq.push(wc) {
            Ok(f) => ctx.fire_recv |= f,
            Err(()) => self.enter_err(ctx),
        }
    }

    fn recv_wc(&self, ctx: &Ctx<'_>, wr_id: u64, status: WcStatus) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode: WcOpcode::Recv,
            byte_len: 0,
            imm_data: None,
            qp_num: ctx.qp.qpn,
            src_qp: self.dest_qpn,
            solicited: false,
        }
    }

    /// Any → ERR: every outstanding work request completes with
    /// WrFlushErr (CQ-3).
    fn enter_err(&mut self, ctx: &mut Ctx<'_>) {
        if self.state == QpState::Err {
            return;
        }
        tracing::debug!(qpn = ctx.qp.qpn, "QP enters the error state");
        self.state = QpState::Err;
        self.flush(ctx);
    }

    fn flush(&mut self, ctx: &mut Ctx<'_>) {
        self.timer = None;
        self.rnr_until = None;
        self.responses.clear();
        while let Some(w) = self.sq.pop_front() {
            self.complete_send(ctx, &w, WcStatus::WrFlushErr);
        }
        self.next_wqe = 0;
        self.next_pkt = 0;
        if let Some(InProgress::Send { wqe, .. }) = self.cur.take() {
            let wc = self.recv_wc(ctx, wqe.wr_id, WcStatus::WrFlushErr);
            self.complete_recv(ctx, wc);
        }
        while let Some(r) = self.rq.pop_front() {
            let wc = self.recv_wc(ctx, r.wr_id, WcStatus::WrFlushErr);
            self.complete_recv(ctx, wc);
        }
    }

    /// Completes the oldest send WQE with an error and moves to ERR (RTY-1..3).
    fn fail_front(&mut self, ctx: &mut Ctx<'_>, status: WcStatus) {
        if let Some(w) = self.sq.pop_front() {
            tracing::debug!(
                qpn = ctx.qp.qpn,
                wr_id = w.wr_id,
                ?status,
                "send WQE failed"
            );
            self.complete_send(ctx, &w, status);
        }
        self.next_wqe = self.next_wqe.saturating_sub(1);
        self.enter_err(ctx);
    }

    // ----- local memory ------------------------------------------------

    fn resolve(
        dev: &DevShared,
        pd: u32,
        sges: &[smc_verbs::Sge],
        need_write: bool,
    ) -> (ArrayVec<LocalSeg, MAX_SGE>, u64, Option<WcStatus>) {
        let mut segs = ArrayVec::new();
        let mut total = 0u64;
        for s in sges {
            total += s.length as u64;
            if s.length == 0 {
                continue;
            }
            let ok = dev.mrs.lookup(s.lkey).and_then(|mr| {
                if mr.pd != pd || (need_write && !mr.access.contains(AccessFlags::LOCAL_WRITE)) {
                    return None;
                }
                let boff = mr.range(s.addr, s.length as u64)?;
                Some(LocalSeg {
                    mr,
                    boff,
                    len: s.length as usize,
                })
            });
            match ok {
                Some(seg) => segs.push(seg),
                None => return (ArrayVec::new(), total, Some(WcStatus::LocProtErr)),
            }
        }
        (segs, total, None)
    }

    // ----- posting ----------------------------------------------------

    fn post_send(&mut self, ctx: &mut Ctx<'_>, wrs: &[SendWr<'_>]) -> Result<()> {
        match self.state {
            QpState::Rts | QpState::Sqd | QpState::Err => {}
            s => return Err(VerbsError::InvalidState(s)),
        }
        let cap = ctx.qp.cap;
        if self.sq.len() + wrs.len() > cap.max_send_wr as usize {
            return Err(VerbsError::QueueFull);
        }
        for wr in wrs {
            if wr.sg_list.len() > cap.max_send_sge as usize {
                return Err(VerbsError::InvalidArgument("too many SGEs"));
            }
            let len: u64 = wr.sg_list.iter().map(|s| s.length as u64).sum();
            if wr.flags.contains(SendFlags::INLINE) {
                let inline_ok = matches!(
                    wr.op,
                    SendOp::Send
                        | SendOp::SendWithImm { .. }
                        | SendOp::RdmaWrite { .. }
                        | SendOp::RdmaWriteWithImm { .. }
                );
                if !inline_ok {
                    return Err(VerbsError::InvalidArgument("inline only for SEND/WRITE"));
                }
                if len > cap.max_inline_data as u64 {
                    return Err(VerbsError::InlineTooLarge {
                        len: len as usize,
                        max: cap.max_inline_data as usize,
                    });
                }
            }
            if matches!(
                wr.op,
                SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. }
            ) && len != 8
            {
                return Err(VerbsError::InvalidArgument(
                    "atomics need an 8-byte scatter list",
                ));
            }
            if len > (1u64 << 31) {
                return Err(VerbsError::InvalidArgument("message longer than 2 GiB"));
            }
            // PSN-1: PSNs compare in a 2^23 window. A message's packets,
            // plus the send window before them, must fit in it, or a
            // retransmission (go-back-N to a PSN inside the message) could
            // not be placed and the QP would hang. IBA's 2 GiB maximum at
            // path MTU 256 is exactly 2^23 packets.
            if len.div_ceil(self.mtu as u64) > MAX_MSG_PKTS {
                return Err(VerbsError::InvalidArgument(
                    "message spans more than 2^22 packets at this path MTU",
                ));
            }
        }
        let dev = ctx.qp.dev.clone();
        for wr in wrs {
            let need_write = matches!(
                wr.op,
                SendOp::RdmaRead { .. }
                    | SendOp::AtomicCmpSwap { .. }
                    | SendOp::AtomicFetchAdd { .. }
            );
            let (segs, len, mut local_err, inline) = if wr.flags.contains(SendFlags::INLINE) {
                let mut data = ArrayVec::<u8, MAX_INLINE>::new();
                let mut err = None;
                for s in wr.sg_list {
                    if s.length == 0 {
                        continue;
                    }
                    // INLINE: lkeys are not checked, but the memory must be
                    // ours; read it through a region of this QP's PD that
                    // covers the address, else the request fails with a
                    // protection error rather than touching unknown memory.
                    match dev
                        .mrs
                        .find_covering(ctx.qp.pd, s.lkey, s.addr, s.length as u64)
                    {
                        Some((mr, boff)) => {
                            let start = data.len();
                            for _ in 0..s.length {
                                data.push(0);
                            }
                            match mr.enter() {
                                Some(m) => m.read(boff, &mut data[start..]),
                                None => err = Some(WcStatus::LocProtErr),
                            }
                        }
                        None => err = Some(WcStatus::LocProtErr),
                    }
                }
                let n = data.len() as u64;
                (ArrayVec::new(), n, err, Some(data))
            } else {
                let (s, l, e) = Self::resolve(&dev, ctx.qp.pd, wr.sg_list, need_write);
                (s, l, e, None)
            };
            if len > u32::MAX as u64 {
                local_err = Some(WcStatus::LocLenErr);
            }
            self.sq.push_back(SendWqe {
                wr_id: wr.wr_id,
                op: wr.op,
                signaled: wr.flags.contains(SendFlags::SIGNALED),
                solicited: wr.flags.contains(SendFlags::SOLICITED),
                fence: wr.flags.contains(SendFlags::FENCE),
                segs,
                inline,
                len: len as u32,
                local_err,
                first_psn: 0,
                npkts: 0,
                read_got: 0,
            });
        }
        if self.state == QpState::Err {
            self.flush(ctx);
        } else {
            self.pump(ctx);
        }
        Ok(())
    }

    fn post_recv(&mut self, ctx: &mut Ctx<'_>, wrs: &[RecvWr<'_>]) -> Result<()> {
        if self.state == QpState::Reset {
            return Err(VerbsError::InvalidState(self.state));
        }
        let cap = ctx.qp.cap;
        if self.rq.len() + wrs.len() > cap.max_recv_wr as usize {
            return Err(VerbsError::QueueFull);
        }
        if wrs
            .iter()
            .any(|w| w.sg_list.len() > cap.max_recv_sge as usize)
        {
            return Err(VerbsError::InvalidArgument("too many SGEs"));
        }
        let dev = ctx.qp.dev.clone();
        for wr in wrs {
            let (segs, _, local_err) = Self::resolve(&dev, ctx.qp.pd, wr.sg_list, true);
            self.rq.push_back(RecvWqe {
                wr_id: wr.wr_id,
                segs,
                local_err,
            });
        }
        if self.state == QpState::Err {
            self.flush(ctx);
        }
        Ok(())
    }

    // ----- requester: transmission ---------------------------------------

    fn npkts(&self, w: &SendWqe) -> u32 {
        match w.op {
            SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. } => 1,
            _ => (w.len as usize).div_ceil(self.mtu).max(1) as u32,
        }
    }

    /// Sends what the window, RNR wait and read/atomic limits allow.
    fn pump(&mut self, ctx: &mut Ctx<'_>) {
        if self.state != QpState::Rts || self.rnr_until.is_some() || self.path.is_none() {
            return;
        }
        while self.next_wqe < self.sq.len() && psn_diff(self.psn, self.una) < self.cwnd {
            let i = self.next_wqe;
            // A local error (found at post time, or a gather region
            // deregistered mid-message) completes the WQE with that error
            // once everything before it completed.
            if let Some(st) = self.sq[i].local_err {
                if i == 0 {
                    self.fail_front(ctx, st);
                    return;
                }
                break;
            }
            if self.next_pkt == 0 {
                let earlier_rd = self.sq.range(..i).filter(|w| w.rd_atomic()).count();
                if self.sq[i].rd_atomic() && earlier_rd >= self.max_rd_atomic.max(1) as usize {
                    break;
                }
                if self.sq[i].fence && earlier_rd > 0 {
                    break;
                }
                let n = self.npkts(&self.sq[i]);
                let w = &mut self.sq[i];
                w.first_psn = self.psn;
                w.npkts = n;
                w.read_got = 0;
            }
            if !self.send_next_packet(ctx, i) {
                self.sq[i].local_err = Some(WcStatus::LocProtErr);
                continue;
            }
            if self.timer.is_none() {
                self.timer = self.timeout.map(|t| ctx.now + t);
            }
        }
    }

    /// Sends the next packet of WQE `i`; false (nothing sent) when its
    /// gather list names a region deregistered since it was posted.
    fn send_next_packet(&mut self, ctx: &mut Ctx<'_>, i: usize) -> bool {
        let mtu = self.mtu;
        let k = self.next_pkt;
        let dest_qp = self.dest_qpn;
        let psn = self.psn;
        let w = &self.sq[i];
        let n = w.npkts;
        let first = k == 0;
        let last = k + 1 >= n;
        let mut bth = BthRepr {
            opcode: Opcode::SendOnly,
            se: last && w.solicited,
            mig_req: false, // rxe sends 0 (no APM)
            pad_count: 0,
            pkey: 0xffff,
            resv8a: 0,
            dest_qp,
            // ACK-3: on the last packet, periodically, and when the window
            // fills so that it opens again promptly.
            ack_req: last
                || (k + 1).is_multiple_of(ACK_EVERY)
                || psn_diff(psn_add(psn, 1), self.una) >= self.cwnd,
            resv7: 0,
            psn,
        };
        let mut repr = PacketRepr {
            bth,
            reth: None,
            aeth: None,
            imm: None,
            atomic: None,
            atomic_ack: None,
        };
        let off = k as usize * mtu;
        let seg_len = (w.len as usize).saturating_sub(off).min(mtu);
        let (opcode, payload_len, advance) = match w.op {
            SendOp::Send | SendOp::SendWithImm { .. } => {
                let imm = match w.op {
                    SendOp::SendWithImm { imm } => Some(imm),
                    _ => None,
                };
                let op = match (first, last, imm.is_some()) {
                    (true, true, false) => Opcode::SendOnly,
                    (true, true, true) => Opcode::SendOnlyImm,
                    (true, false, _) => Opcode::SendFirst,
                    (false, false, _) => Opcode::SendMiddle,
                    (false, true, false) => Opcode::SendLast,
                    (false, true, true) => Opcode::SendLastImm,
                };
                if last {
                    repr.imm = imm;
                }
                (op, seg_len, 1)
            }
            SendOp::RdmaWrite { remote_addr, rkey }
            | SendOp::RdmaWriteWithImm {
                remote_addr, rkey, ..
            } => {
                let imm = match w.op {
                    SendOp::RdmaWriteWithImm { imm, .. } => Some(imm),
                    _ => None,
                };
                let op = match (first, last, imm.is_some()) {
                    (true, true, false) => Opcode::WriteOnly,
                    (true, true, true) => Opcode::WriteOnlyImm,
                    (true, false, _) => Opcode::WriteFirst,
                    (false, false, _) => Opcode::WriteMiddle,
                    (false, true, false) => Opcode::WriteLast,
                    (false, true, true) => Opcode::WriteLastImm,
                };
                if first {
                    repr.reth = Some(RethRepr {
                        va: remote_addr,
                        rkey,
                        dma_len: w.len,
                    });
                }
                if last {
                    repr.imm = imm;
                }
                (op, seg_len, 1)
            }
            SendOp::RdmaRead { remote_addr, rkey } => {
                repr.reth = Some(RethRepr {
                    va: remote_addr.wrapping_add(off as u64),
                    rkey,
                    dma_len: w.len - (off.min(w.len as usize) as u32),
                });
                bth.ack_req = false;
                (Opcode::ReadRequest, 0, n - k)
            }
            SendOp::AtomicCmpSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                repr.atomic = Some(AtomicEthRepr {
                    va: remote_addr,
                    rkey,
                    swap_add: swap,
                    compare,
                });
                (Opcode::CompareSwap, 0, 1)
            }
            SendOp::AtomicFetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                repr.atomic = Some(AtomicEthRepr {
                    va: remote_addr,
                    rkey,
                    swap_add: add,
                    compare: 0,
                });
                (Opcode::FetchAdd, 0, 1)
            }
        };
        bth.opcode = opcode;
        if !matches!(opcode, Opcode::ReadRequest) {
            bth.ack_req = bth.ack_req || opcode.is_last() || !opcode.has_payload();
        }
        repr.bth = bth;
        let w = &self.sq[i];
        let (segs, inline) = (&w.segs, w.inline.as_deref());
        if let Some(path) = self.path.as_ref() {
            let sent = ctx.tx.packet(
                &ctx.qp.dev,
                path_parts(path, ctx.qp),
                &mut self.fault,
                &repr,
                payload_len,
                |buf| match inline {
                    Some(d) => {
                        buf.copy_from_slice(&d[off..off + payload_len]);
                        true
                    }
                    None => gather(segs, off, buf),
                },
            );
            if !sent {
                return false;
            }
        }
        self.psn = psn_add(self.psn, advance);
        if psn_diff(self.psn, self.max_psn) > 0 {
            self.max_psn = self.psn;
        }
        self.next_pkt += advance;
        if self.next_pkt >= n {
            self.next_wqe += 1;
            self.next_pkt = 0;
        }
        true
    }

    /// Repositions transmission so that the next packet sent is the one
    /// with PSN `p`: backwards for go-back-N (RTY-1, RTY-4), forwards when
    /// an ACK covers packets sent before an earlier rewind. PSN ranges of
    /// WQEs that were ever started stay valid (segmentation is
    /// deterministic).
    fn rewind(&mut self, p: u32) {
        for j in 0..self.sq.len() {
            let w = &self.sq[j];
            if w.npkts == 0 {
                // First never-started WQE: `p` is the high-water mark.
                if p == self.max_psn {
                    self.next_wqe = j;
                    self.next_pkt = 0;
                    self.psn = p;
                }
                return;
            }
            let d = psn_diff(p, w.first_psn);
            if d >= 0 && (d as u32) < w.npkts {
                let k = if w.rd_atomic() { w.read_got } else { d as u32 };
                self.next_wqe = j;
                self.next_pkt = k;
                self.psn = psn_add(w.first_psn, k);
                return;
            }
        }
        if p == self.max_psn {
            self.next_wqe = self.sq.len();
            self.next_pkt = 0;
            self.psn = p;
        }
    }

    fn update_una(&mut self, acked: Option<u32>) {
        self.una = match self.sq.front() {
            Some(w) if w.npkts > 0 => {
                if w.rd_atomic() {
                    psn_add(w.first_psn, w.read_got)
                } else {
                    match acked {
                        Some(p) if psn_diff(psn_add(p, 1), w.first_psn) > 0 => psn_add(p, 1),
                        _ => w.first_psn,
                    }
                }
            }
            _ => self.max_psn,
        };
    }

    fn outstanding(&self) -> bool {
        self.una != self.max_psn
    }

    fn progress(&mut self, ctx: &mut Ctx<'_>) {
        self.cwnd = (self.cwnd + 1).min(WINDOW);
        self.retry_left = self.retry_cnt;
        self.rnr_left = self.rnr_retry;
        self.last_rewind = None;
        self.timer = if self.outstanding() {
            self.timeout.map(|t| ctx.now + t)
        } else {
            None
        };
    }

    /// Cumulative acknowledgement of every PSN up to `p` (ACK-2). Returns
    /// whether anything new was acknowledged.
    fn ack_upto(&mut self, ctx: &mut Ctx<'_>, p: u32) -> bool {
        if psn_diff(p, self.una) < -1 || psn_diff(p, self.max_psn) >= 0 {
            return false;
        }
        let mut advanced = psn_diff(p, self.una) >= 0;
        let next = psn_add(p, 1);
        if psn_diff(next, self.psn) > 0 {
            // Acknowledged beyond what we are retransmitting: skip ahead.
            self.rewind(next);
        }
        while let Some(w) = self.sq.front() {
            if w.npkts == 0 || self.next_wqe == 0 {
                break;
            }
            let last = psn_add(w.first_psn, w.npkts.saturating_sub(1));
            if w.rd_atomic() {
                // An ACK beyond an unanswered READ/atomic means its response
                // was lost: ask again from the first missing response.
                let missing = psn_add(w.first_psn, w.read_got);
                if psn_diff(p, missing) >= 0 && self.last_rewind != Some(missing) {
                    self.last_rewind = Some(missing);
                    self.rewind(missing);
                }
                break;
            }
            if psn_diff(last, p) > 0 {
                break;
            }
            if let Some(w) = self.sq.pop_front() {
                self.next_wqe -= 1;
                self.complete_send(ctx, &w, WcStatus::Success);
                advanced = true;
            }
        }
        if advanced {
            self.update_una(Some(p));
            self.progress(ctx);
        }
        advanced
    }

    // ----- requester: responses -------------------------------------------

    fn on_response(&mut self, ctx: &mut Ctx<'_>, p: &Parsed, pkt: &[u8]) {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return;
        }
        let r = &p.repr;
        let psn = r.bth.psn;
        match r.bth.opcode {
            Opcode::Acknowledge => {
                let Some(aeth) = r.aeth else { return };
                match aeth.syndrome {
                    Syndrome::Ack { .. } => {
                        self.ack_upto(ctx, psn);
                    }
                    nak => self.on_nak(ctx, psn, nak),
                }
            }
            Opcode::AtomicAcknowledge => {
                let (Some(orig), Some(aeth)) = (r.atomic_ack, r.aeth) else {
                    return;
                };
                if !matches!(aeth.syndrome, Syndrome::Ack { .. }) {
                    return self.on_nak(ctx, psn, aeth.syndrome);
                }
                self.ack_upto(ctx, psn_add(psn, PSN_MASK));
                let Some(w) = self.sq.front() else { return };
                if w.npkts == 0
                    || !w.rd_atomic()
                    || matches!(w.op, SendOp::RdmaRead { .. })
                    || w.first_psn != psn
                {
                    return;
                }
                if let Err(st) = scatter(&w.segs, 0, &orig.to_ne_bytes()) {
                    return self.fail_front(ctx, st);
                }
                if psn_diff(psn_add(psn, 1), self.psn) > 0 {
                    self.rewind(psn_add(psn, 1));
                }
                if let Some(w) = self.sq.pop_front() {
                    self.next_wqe = self.next_wqe.saturating_sub(1);
                    self.complete_send(ctx, &w, WcStatus::Success);
                }
                self.update_una(None);
                self.progress(ctx);
            }
            Opcode::ReadResponseFirst
            | Opcode::ReadResponseMiddle
            | Opcode::ReadResponseLast
            | Opcode::ReadResponseOnly => {
                if let Some(aeth) = r.aeth {
                    if !matches!(aeth.syndrome, Syndrome::Ack { .. }) {
                        return self.on_nak(ctx, psn, aeth.syndrome);
                    }
                }
                self.on_read_response(ctx, p, pkt);
            }
            _ => {}
        }
    }

    fn on_read_response(&mut self, ctx: &mut Ctx<'_>, p: &Parsed, pkt: &[u8]) {
        let psn = p.repr.bth.psn;
        // Find the READ this response belongs to.
        let mut found = None;
        for j in 0..self.sq.len() {
            let w = &self.sq[j];
            if w.npkts == 0 {
                break;
            }
            let d = psn_diff(psn, w.first_psn);
            if matches!(w.op, SendOp::RdmaRead { .. }) && d >= 0 && (d as u32) < w.npkts {
                found = Some(j);
                break;
            }
        }
        let Some(j) = found else { return };
        let expected = psn_add(self.sq[j].first_psn, self.sq[j].read_got);
        let d = psn_diff(psn, expected);
        if d != 0 {
            if d > 0 && self.last_rewind != Some(expected) {
                // A gap in the responses: re-request from the first missing
                // one (the responder re-executes reads, PSN-3).
                self.last_rewind = Some(expected);
                self.rewind(expected);
                self.pump(ctx);
            }
            return;
        }
        // Responses implicitly acknowledge everything before them (ACK-2).
        if j > 0 {
            let read_first = self.sq[j].first_psn;
            self.ack_upto(ctx, psn_add(read_first, PSN_MASK));
            let at_front = self.sq.front().is_some_and(|w| {
                matches!(w.op, SendOp::RdmaRead { .. }) && w.first_psn == read_first
            });
            if !at_front {
                return;
            }
        }
        let w = &self.sq[0];
        let k = w.read_got;
        let n = w.npkts;
        let want = match (k == 0, k + 1 == n) {
            (true, true) => Opcode::ReadResponseOnly,
            (true, false) => Opcode::ReadResponseFirst,
            (false, true) => Opcode::ReadResponseLast,
            (false, false) => Opcode::ReadResponseMiddle,
        };
        let off = k as usize * self.mtu;
        let len = (w.len as usize).saturating_sub(off).min(self.mtu);
        if p.repr.bth.opcode != want || p.payload_len != len {
            // The expected response, but with the wrong opcode or length:
            // the responder is broken (IBA "bad response").
            tracing::debug!(qpn = ctx.qp.qpn, psn, "malformed read response");
            return self.fail_front(ctx, WcStatus::BadRespErr);
        }
        if let Err(st) = scatter(&w.segs, off, &pkt[p.payload_off..p.payload_off + len]) {
            return self.fail_front(ctx, st);
        }
        self.sq[0].read_got += 1;
        if psn_diff(psn_add(psn, 1), self.psn) > 0 {
            self.rewind(psn_add(psn, 1));
        }
        if self.sq[0].read_got == n {
            if let Some(w) = self.sq.pop_front() {
                self.next_wqe = self.next_wqe.saturating_sub(1);
                self.complete_send(ctx, &w, WcStatus::Success);
            }
        }
        self.update_una(None);
        self.progress(ctx);
        self.pump(ctx);
    }

    fn on_nak(&mut self, ctx: &mut Ctx<'_>, psn: u32, syn: Syndrome) {
        // Only NAKs for PSNs in flight count.
        if psn_diff(psn, self.una) < 0 || psn_diff(psn, self.max_psn) >= 0 {
            return;
        }
        self.ack_upto(ctx, psn_add(psn, PSN_MASK));
        if self.state != QpState::Rts {
            return;
        }
        match syn {
            Syndrome::NakPsnSeqError => {
                if self.rnr_until.is_some() || self.last_rewind == Some(psn) {
                    // Packets that followed an RNR-NAKed one (the RNR wait
                    // already rewound), or a duplicate of a NAK we acted on
                    // without progress since.
                    return;
                }
                self.last_rewind = Some(psn);
                // RTY-4: retransmit from the NAK'd PSN without using a retry.
                self.cwnd = (self.cwnd / 2).max(MIN_WINDOW);
                self.rewind(psn);
                self.timer = self.timeout.map(|t| ctx.now + t);
                self.pump(ctx);
            }
            Syndrome::RnrNak { timer } => {
                // RTY-2.
                if self.rnr_retry != 7 {
                    if self.rnr_left == 0 {
                        return self.fail_front(ctx, WcStatus::RnrRetryExcErr);
                    }
                    self.rnr_left -= 1;
                }
                self.rewind(psn);
                self.timer = None;
                self.rnr_until = Some(ctx.now + rnr_timeout(timer));
            }
            Syndrome::NakInvalidRequest | Syndrome::NakInvalidRdRequest => {
                self.fail_front(ctx, WcStatus::RemInvReqErr)
            }
            Syndrome::NakRemoteAccessError => self.fail_front(ctx, WcStatus::RemAccessErr),
            Syndrome::NakRemoteOperationalError => self.fail_front(ctx, WcStatus::RemOpErr),
            Syndrome::Ack { .. } | Syndrome::Reserved(_) => {}
        }
    }

    fn service(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now;
        if self.rnr_until.is_some_and(|t| t <= now) {
            self.rnr_until = None;
            self.timer = self.timeout.map(|t| now + t);
        }
        if self.timer.is_some_and(|t| t <= now) {
            self.timer = None;
            if self.state == QpState::Rts && self.outstanding() {
                // RTY-1: local ACK timeout.
                if self.retry_left == 0 {
                    return self.fail_front(ctx, WcStatus::RetryExcErr);
                }
                self.retry_left -= 1;
                self.cwnd = MIN_WINDOW;
                tracing::trace!(
                    qpn = ctx.qp.qpn,
                    psn = self.una,
                    "retransmit on ACK timeout"
                );
                self.rewind(self.una);
                self.timer = self.timeout.map(|t| now + t);
            }
        }
        self.pump_responses(ctx);
        self.pump(ctx);
    }

    // ----- responder ---------------------------------------------------

    /// A packet for this QP. Only its connected peer may speak to it: the
    /// source address must be the peer's (the RoCEv2 source GID; IBA checks
    /// the SGID of RC packets against the QP's path), else the packet is
    /// dropped before anything looks at its PSN or opcode, so a forger on
    /// another host can neither inject nor provoke NAKs.
    fn on_packet(&mut self, ctx: &mut Ctx<'_>, p: &Parsed, pkt: &[u8], src: IpAddr) -> bool {
        match &self.path {
            Some(path) if path.peer_ip == src => {}
            _ => return false,
        }
        if p.repr.bth.opcode.is_request() {
            self.on_request(ctx, p, pkt);
        } else {
            self.on_response(ctx, p, pkt);
        }
        true
    }

    /// A responder packet (ACK, atomic ACK, READ response) to the peer QP:
    /// everything but opcode, PSN and the AETH is fixed on this path.
    fn response(
        dest_qp: u32,
        msn: u32,
        opcode: Opcode,
        psn: u32,
        syndrome: Option<Syndrome>,
    ) -> PacketRepr {
        PacketRepr {
            bth: BthRepr {
                opcode,
                se: false,
                mig_req: false,
                pad_count: 0,
                pkey: 0xffff,
                resv8a: 0,
                dest_qp,
                ack_req: false,
                resv7: 0,
                psn,
            },
            reth: None,
            aeth: syndrome.map(|syndrome| AethRepr { syndrome, msn }),
            imm: None,
            atomic: None,
            atomic_ack: None,
        }
    }

    /// Sends a payload-less responder packet now (see [`Self::respond`]
    /// for the order).
    fn send_response(&mut self, ctx: &mut Ctx<'_>, repr: &PacketRepr) {
        if let Some(path) = self.path.as_ref() {
            ctx.tx.packet(
                &ctx.qp.dev,
                path_parts(path, ctx.qp),
                &mut self.fault,
                repr,
                0,
                |_| true,
            );
        }
    }

    /// Owes `r` after every response owed so far (a new request's answer).
    /// Sent at once when nothing is owed; consecutive ACKs merge into the
    /// last (cumulative), and a NAK identical to the last one owed (an RNR
    /// or sequence NAK for a retransmission) is not owed twice.
    fn respond(&mut self, ctx: &mut Ctx<'_>, r: Resp) {
        match (&r, self.responses.back_mut()) {
            (Resp::Ack { psn, msn }, Some(Resp::Ack { psn: p, msn: m })) => {
                (*p, *m) = (*psn, *msn);
                return;
            }
            (Resp::Nak { psn, syn, .. }, Some(Resp::Nak { psn: p, syn: y, .. }))
                if p == psn && y == syn =>
            {
                return
            }
            _ => {}
        }
        if self.responses.len() >= MAX_RESPONSES {
            // Cannot happen within the bounds above; never grow without limit.
            tracing::warn!(qpn = ctx.qp.qpn, "responder queue full, QP to ERR");
            return self.enter_err(ctx);
        }
        self.responses.push_back(r);
        self.pump_responses(ctx);
    }

    /// Owes `r` before everything owed so far: the answer to a duplicate,
    /// whose PSN precedes every queued response.
    fn respond_first(&mut self, ctx: &mut Ctx<'_>, r: Resp) {
        if self.responses.len() >= MAX_RESPONSES {
            tracing::warn!(qpn = ctx.qp.qpn, "responder queue full, QP to ERR");
            return self.enter_err(ctx);
        }
        self.responses.push_front(r);
        self.pump_responses(ctx);
    }

    fn send_nak(&mut self, ctx: &mut Ctx<'_>, psn: u32, syn: Syndrome) {
        let msn = self.msn;
        self.respond(
            ctx,
            Resp::Nak {
                psn,
                syn,
                msn,
                fatal: false,
            },
        );
    }

    fn flush_ack(&mut self, ctx: &mut Ctx<'_>) {
        if self.ack_pending {
            self.ack_pending = false;
            let (psn, msn) = (psn_add(self.epsn, PSN_MASK), self.msn);
            self.respond(ctx, Resp::Ack { psn, msn });
        }
    }

    /// A fatal responder error: NAK and move to ERR (RK-C1, SEG-7/8).
    fn responder_error(&mut self, ctx: &mut Ctx<'_>, syn: Syndrome) {
        self.responder_error_at(ctx, self.epsn, syn);
    }

    /// A fatal responder error reported at `psn` (the READ response or
    /// duplicate that failed rather than the expected PSN). The NAK leaves
    /// after the responses owed for earlier PSNs; from now on no request is
    /// executed, and the QP enters ERR once the NAK is sent.
    fn responder_error_at(&mut self, ctx: &mut Ctx<'_>, psn: u32, syn: Syndrome) {
        tracing::debug!(qpn = ctx.qp.qpn, psn, ?syn, "responder error");
        self.resp_fatal = true;
        let msn = self.msn;
        let nak = Resp::Nak {
            psn,
            syn,
            msn,
            fatal: true,
        };
        if psn_diff(psn, self.epsn) < 0 && !self.responses.is_empty() {
            // A duplicate's error: before the responses of later PSNs.
            self.respond_first(ctx, nak);
        } else {
            self.respond(ctx, nak);
        }
    }

    /// Sends owed responses from the front: READ responses up to
    /// READ_CHUNK packets (C.7, SEG-5), everything else as it comes up.
    fn pump_responses(&mut self, ctx: &mut Ctx<'_>) {
        let mut budget = READ_CHUNK;
        while budget > 0 {
            let Some(front) = self.responses.front_mut() else {
                return;
            };
            match front {
                Resp::Read(r) => {
                    let k = r.next;
                    let n = r.npkts;
                    let op = match (k == 0, k + 1 == n) {
                        (true, true) => Opcode::ReadResponseOnly,
                        (true, false) => Opcode::ReadResponseFirst,
                        (false, true) => Opcode::ReadResponseLast,
                        (false, false) => Opcode::ReadResponseMiddle,
                    };
                    let off = k as usize * self.mtu;
                    let len = r.len.saturating_sub(off).min(self.mtu);
                    let psn = psn_add(r.first_psn, k);
                    let repr = Self::response(
                        self.dest_qpn,
                        r.msn,
                        op,
                        psn,
                        op.has_aeth().then_some(Syndrome::ACK),
                    );
                    let (mr, boff) = (r.mr.clone(), r.boff + off);
                    r.next += 1;
                    if r.next >= n {
                        self.responses.pop_front();
                    }
                    budget -= 1;
                    let Some(path) = self.path.as_ref() else {
                        continue;
                    };
                    let sent = ctx.tx.packet(
                        &ctx.qp.dev,
                        path_parts(path, ctx.qp),
                        &mut self.fault,
                        &repr,
                        len,
                        |buf| match &mr {
                            Some(mr) => match mr.enter() {
                                Some(m) => {
                                    m.read(boff, buf);
                                    true
                                }
                                None => false,
                            },
                            None => true,
                        },
                    );
                    if !sent {
                        // Deregistered while its responses stream: not
                        // one more byte of it leaves (item 6); this NAK is
                        // the next response in PSN order.
                        tracing::debug!(qpn = ctx.qp.qpn, psn, "READ region deregistered");
                        let msn = self.msn;
                        self.responses.push_front(Resp::Nak {
                            psn,
                            syn: Syndrome::NakRemoteAccessError,
                            msn,
                            fatal: true,
                        });
                        self.resp_fatal = true;
                    }
                }
                Resp::Ack { psn, msn } => {
                    let repr = Self::response(
                        self.dest_qpn,
                        *msn,
                        Opcode::Acknowledge,
                        *psn,
                        Some(Syndrome::ACK),
                    );
                    self.responses.pop_front();
                    self.send_response(ctx, &repr);
                }
                Resp::AtomicAck { psn, orig, msn } => {
                    let repr = PacketRepr {
                        atomic_ack: Some(*orig),
                        ..Self::response(
                            self.dest_qpn,
                            *msn,
                            Opcode::AtomicAcknowledge,
                            *psn,
                            Some(Syndrome::ACK),
                        )
                    };
                    self.responses.pop_front();
                    self.send_response(ctx, &repr);
                }
                Resp::Nak {
                    psn,
                    syn,
                    msn,
                    fatal,
                } => {
                    let fatal = *fatal;
                    let repr =
                        Self::response(self.dest_qpn, *msn, Opcode::Acknowledge, *psn, Some(*syn));
                    self.responses.pop_front();
                    self.send_response(ctx, &repr);
                    if fatal {
                        return self.enter_err(ctx);
                    }
                }
            }
        }
    }

    /// RK-C1: the region named by `rkey`, if `[va, va+len)` lies in it with
    /// `need` access and the QP grants that access to its peer.
    fn check_remote(
        &self,
        ctx: &Ctx<'_>,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Option<(Arc<MrEntry>, usize)> {
        if !self.access.contains(need) {
            return None;
        }
        let mr = ctx.qp.dev.mrs.lookup(rkey)?;
        if mr.pd != ctx.qp.pd || !mr.access.contains(need) {
            return None;
        }
        let boff = mr.range(va, len)?;
        Some((mr, boff))
    }

    fn on_request(&mut self, ctx: &mut Ctx<'_>, p: &Parsed, pkt: &[u8]) {
        if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) || self.resp_fatal {
            // Not receiving, or a fatal NAK is owed: the QP is about to
            // enter ERR, nothing more is executed.
            return;
        }
        let bth = p.repr.bth;
        let d = psn_diff(bth.psn, self.epsn);
        if d < 0 {
            return self.on_duplicate(ctx, p);
        }
        if d > 0 {
            // PSN-4: NAK once, then drop until ePSN arrives.
            if !self.nak_sent {
                self.nak_sent = true;
                self.send_nak(ctx, self.epsn, Syndrome::NakPsnSeqError);
            }
            return;
        }
        let payload = &pkt[p.payload_off..p.payload_off + p.payload_len];
        let op = bth.opcode;
        if payload.len() > self.mtu {
            return self.responder_error(ctx, Syndrome::NakInvalidRequest);
        }
        match op {
            Opcode::SendFirst
            | Opcode::SendMiddle
            | Opcode::SendLast
            | Opcode::SendLastImm
            | Opcode::SendOnly
            | Opcode::SendOnlyImm => self.on_send(ctx, p, payload),
            Opcode::WriteFirst
            | Opcode::WriteMiddle
            | Opcode::WriteLast
            | Opcode::WriteLastImm
            | Opcode::WriteOnly
            | Opcode::WriteOnlyImm => self.on_write(ctx, p, payload),
            Opcode::ReadRequest => self.on_read_request(ctx, p),
            Opcode::CompareSwap | Opcode::FetchAdd => self.on_atomic(ctx, p),
            _ => {}
        }
    }

    fn accept(&mut self, bth: &BthRepr, advance: u32) {
        self.nak_sent = false;
        self.epsn = psn_add(self.epsn, advance);
        if bth.ack_req {
            self.ack_pending = true;
        }
    }

    fn on_send(&mut self, ctx: &mut Ctx<'_>, p: &Parsed, payload: &[u8]) {
        let bth = p.repr.bth;
        let op = bth.opcode;
        let first = op.is_first();
        let last = op.is_last();
        let in_send = matches!(self.cur, Some(InProgress::Send { .. }));
        if first == in_send || (!first && self.cur.is_none()) || (first && self.cur.is_some()) {
            return self.responder_error(ctx, Syndrome::NakInvalidRequest); // SEG-8
        }
        if !last && payload.len() != self.mtu {
            return self.responder_error(ctx, Syndrome::NakInvalidRequest); // SEG-7
        }
        if first {
            let Some(wqe) = self.rq.pop_front() else {
                // No receive posted: RNR NAK, the requester retries later.
                return self.send_nak(
                    ctx,
                    self.epsn,
                    Syndrome::RnrNak {
                        timer: self.min_rnr_timer,
                    },
                );
            };
            self.cur = Some(InProgress::Send { wqe, written: 0 });
        }
        let Some(InProgress::Send { wqe, written }) = self.cur.as_mut() else {
            return;
        };
        let wr_id = wqe.wr_id;
        let failure = if let Some(st) = wqe.local_err {
            Some((st, Syndrome::NakRemoteOperationalError))
        } else if let Err(st) = scatter(&wqe.segs, *written, payload) {
            // RC-4: message longer than the receive buffer (invalid
            // request), or the buffer's region was deregistered since the
            // receive was posted (the WQE is broken: operational error).
            let syn = if st == WcStatus::LocLenErr {
                Syndrome::NakInvalidRequest
            } else {
                Syndrome::NakRemoteOperationalError
            };
            Some((st, syn))
        } else {
            *written += payload.len();
            None
        };
        let written = *written;
        if let Some((st, syn)) = failure {
            let wc = self.recv_wc(ctx, wr_id, st);
            self.cur = None;
            self.complete_recv(ctx, wc);
            return self.responder_error(ctx, syn);
        }
        self.accept(&bth, 1);
        if last {
            if let Some(InProgress::Send { wqe, .. }) = self.cur.take() {
                self.msn = psn_add(self.msn, 1);
                let mut wc = self.recv_wc(ctx, wqe.wr_id, WcStatus::Success);
                wc.byte_len = written as u32;
                wc.imm_data = p.repr.imm;
                wc.solicited = bth.se;
                self.complete_recv(ctx, wc);
            }
        }
    }

    fn on_write(&mut self, ctx: &mut Ctx<'_>, p: &Parsed, payload: &[u8]) {
        let bth = p.repr.bth;
        let op = bth.opcode;
        let first = op.is_first();
        let last = op.is_last();
        if first {
            if self.cur.is_some() {
                return self.responder_error(ctx, Syndrome::NakInvalidRequest);
            }
            let Some(reth) = p.repr.reth else { return };
            let total = reth.dma_len as usize;
            let (mr, boff) = if total == 0 {
                (None, 0) // RK-C3: zero-length writes are not checked.
            } else {
                match self.check_remote(
                    ctx,
                    reth.rkey,
                    reth.va,
                    total as u64,
                    AccessFlags::REMOTE_WRITE,
                ) {
                    Some((mr, boff)) => (Some(mr), boff),
                    None => return self.responder_error(ctx, Syndrome::NakRemoteAccessError),
                }
            };
            let ok_len = if last {
                payload.len() == total
            } else {
                payload.len() == self.mtu && total > self.mtu
            };
            if !ok_len {
                return self.responder_error(ctx, Syndrome::NakInvalidRequest);
            }
            self.cur = Some(InProgress::Write {
                mr,
                boff,
                remaining: total,
                total: reth.dma_len,
            });
        } else {
            let Some(InProgress::Write { remaining, .. }) = self.cur.as_ref() else {
                return self.responder_error(ctx, Syndrome::NakInvalidRequest);
            };
            let ok_len = if last {
                payload.len() == *remaining
            } else {
                payload.len() == self.mtu && *remaining > self.mtu
            };
            if !ok_len {
                return self.responder_error(ctx, Syndrome::NakInvalidRequest);
            }
        }
        if last && op.has_imm() && self.rq.is_empty() {
            // The immediate needs a receive WQE; nothing of this packet is
            // placed yet, so the retry after the RNR wait starts here.
            if first {
                self.cur = None;
            }
            return self.send_nak(
                ctx,
                self.epsn,
                Syndrome::RnrNak {
                    timer: self.min_rnr_timer,
                },
            );
        }
        let Some(InProgress::Write {
            mr,
            boff,
            remaining,
            total,
        }) = self.cur.as_mut()
        else {
            return;
        };
        if let (Some(mr), false) = (mr.as_ref(), payload.is_empty()) {
            // The region may have been deregistered since the First packet
            // was checked: then nothing more is placed (item 6, RK-C1 (a)).
            let Some(m) = mr.enter() else {
                return self.responder_error(ctx, Syndrome::NakRemoteAccessError);
            };
            m.write(*boff, payload);
        }
        *boff += payload.len();
        *remaining -= payload.len();
        let total = *total;
        self.accept(&bth, 1);
        if last {
            self.cur = None;
            self.msn = psn_add(self.msn, 1);
            if op.has_imm() {
                if let Some(wqe) = self.rq.pop_front() {
                    let status = wqe.local_err.unwrap_or(WcStatus::Success);
                    let mut wc = self.recv_wc(ctx, wqe.wr_id, status);
                    wc.opcode = WcOpcode::RecvRdmaWithImm;
                    wc.byte_len = total;
                    wc.imm_data = p.repr.imm;
                    wc.solicited = bth.se;
                    self.complete_recv(ctx, wc);
                }
            }
        }
    }

    /// Saves a READ/atomic for duplicate replay. The last MAX_RD_ATOMIC
    /// are kept, at least `max_dest_rd_atomic`: a requester within its
    /// `max_rd_atomic` only ever retries one of those.
    fn rd_res_push(&mut self, r: RdRes) {
        if self.rd_res.len() >= MAX_RD_ATOMIC {
            self.rd_res.pop_front();
        }
        self.rd_res.push_back(r);
    }

    /// A new READ or atomic may start only while fewer than
    /// `max_dest_rd_atomic` are in progress, i.e. still owe responses
    /// (the responder resources; CHECKLIST C.7: NAK Invalid Request on
    /// overflow). This also bounds what a peer can make us queue.
    fn rd_atomic_allowed(&self) -> bool {
        let in_progress = self
            .responses
            .iter()
            .filter(|r| matches!(r, Resp::Read(_) | Resp::AtomicAck { .. }))
            .count();
        in_progress < self.max_dest_rd_atomic as usize
    }

    fn on_read_request(&mut self, ctx: &mut Ctx<'_>, p: &Parsed) {
        if self.cur.is_some() || !self.rd_atomic_allowed() {
            return self.responder_error(ctx, Syndrome::NakInvalidRequest);
        }
        let Some(reth) = p.repr.reth else { return };
        let len = reth.dma_len as usize;
        let (mr, boff) = if len == 0 {
            (None, 0)
        } else {
            match self.check_remote(
                ctx,
                reth.rkey,
                reth.va,
                len as u64,
                AccessFlags::REMOTE_READ,
            ) {
                Some((mr, boff)) => (Some(mr), boff),
                None => return self.responder_error(ctx, Syndrome::NakRemoteAccessError),
            }
        };
        let npkts = len.div_ceil(self.mtu).max(1) as u32;
        let psn = p.repr.bth.psn;
        self.rd_res_push(RdRes::Read {
            first_psn: psn,
            npkts,
            rkey: reth.rkey,
            va: reth.va,
            len,
        });
        self.nak_sent = false;
        self.epsn = psn_add(self.epsn, npkts);
        self.msn = psn_add(self.msn, 1);
        let msn = self.msn;
        self.respond(
            ctx,
            Resp::Read(PendingRead {
                first_psn: psn,
                next: 0,
                npkts,
                mr,
                boff,
                len,
                msn,
            }),
        );
    }

    fn on_atomic(&mut self, ctx: &mut Ctx<'_>, p: &Parsed) {
        if self.cur.is_some() || !self.rd_atomic_allowed() {
            return self.responder_error(ctx, Syndrome::NakInvalidRequest);
        }
        let Some(a) = p.repr.atomic else { return };
        if a.va % 8 != 0 {
            return self.responder_error(ctx, Syndrome::NakInvalidRequest); // RK-C1 (e)
        }
        let Some((mr, boff)) = self.check_remote(ctx, a.rkey, a.va, 8, AccessFlags::REMOTE_ATOMIC)
        else {
            return self.responder_error(ctx, Syndrome::NakRemoteAccessError);
        };
        // The provider's atomics and every copy into or out of the buffer
        // (ours and the application's) are accesses to the same aligned
        // 8-byte words (smc_verbs::mem), so they never race (C.8).
        let orig = {
            let Some(m) = mr.enter() else {
                return self.responder_error(ctx, Syndrome::NakRemoteAccessError);
            };
            let Some(cell) = m.atomic(boff) else {
                return self.responder_error(ctx, Syndrome::NakInvalidRequest);
            };
            match p.repr.bth.opcode {
                Opcode::CompareSwap => {
                    match cell.compare_exchange(
                        a.compare,
                        a.swap_add,
                        Ordering::SeqCst,
                        Ordering::SeqCst,
                    ) {
                        Ok(v) | Err(v) => v,
                    }
                }
                _ => cell.fetch_add(a.swap_add, Ordering::SeqCst),
            }
        };
        let psn = p.repr.bth.psn;
        self.rd_res_push(RdRes::Atomic { psn, orig });
        self.nak_sent = false;
        self.epsn = psn_add(self.epsn, 1);
        self.msn = psn_add(self.msn, 1);
        let msn = self.msn;
        self.respond(ctx, Resp::AtomicAck { psn, orig, msn });
    }

    /// PSN-3: duplicates are re-acknowledged, READs re-executed and atomics
    /// answered from the saved result.
    fn on_duplicate(&mut self, ctx: &mut Ctx<'_>, p: &Parsed) {
        let psn = p.repr.bth.psn;
        match p.repr.bth.opcode {
            Opcode::ReadRequest => {
                let saved = self.rd_res.iter().find_map(|r| match *r {
                    RdRes::Read {
                        first_psn,
                        npkts,
                        rkey,
                        va,
                        len,
                    } => {
                        let d = psn_diff(psn, first_psn);
                        (d >= 0 && (d as u32) < npkts)
                            .then_some((first_psn, d as u32, npkts, rkey, va, len))
                    }
                    RdRes::Atomic { .. } => None,
                });
                let Some((first_psn, next, npkts, rkey, va, len)) = saved else {
                    return self.unknown_duplicate(ctx, psn);
                };
                // Re-executed from memory (C.7), but only after the R_Key
                // is looked up and checked again for the part still to
                // send: the region may have been deregistered (item 6).
                let off = (next as usize * self.mtu).min(len);
                let (mr, boff) = if len == 0 {
                    (None, 0)
                } else {
                    match self.check_remote(
                        ctx,
                        rkey,
                        va.wrapping_add(off as u64),
                        (len - off) as u64,
                        AccessFlags::REMOTE_READ,
                    ) {
                        Some((mr, boff)) => (Some(mr), boff - off),
                        None => {
                            return self.responder_error_at(
                                ctx,
                                psn,
                                Syndrome::NakRemoteAccessError,
                            )
                        }
                    }
                };
                // Still owed (partly sent): resend from the PSN asked for.
                for r in self.responses.iter_mut() {
                    if let Resp::Read(q) = r {
                        if q.first_psn == first_psn {
                            q.next = q.next.min(next);
                            return;
                        }
                    }
                }
                let msn = self.msn;
                self.respond_first(
                    ctx,
                    Resp::Read(PendingRead {
                        first_psn,
                        next,
                        npkts,
                        mr,
                        boff,
                        len,
                        msn,
                    }),
                );
            }
            Opcode::CompareSwap | Opcode::FetchAdd => {
                let saved = self.rd_res.iter().find_map(|r| match r {
                    RdRes::Atomic { psn: q, orig } if *q == psn => Some(*orig),
                    _ => None,
                });
                let owed = self
                    .responses
                    .iter()
                    .any(|r| matches!(r, Resp::AtomicAck { psn: q, .. } if *q == psn));
                match (saved, owed) {
                    (Some(orig), false) => {
                        let msn = self.msn;
                        self.respond_first(ctx, Resp::AtomicAck { psn, orig, msn });
                    }
                    (None, _) => self.unknown_duplicate(ctx, psn),
                    (Some(_), true) => {}
                }
            }
            _ => self.ack_pending = true,
        }
    }

    /// A duplicate READ or atomic we keep no record of (older than the
    /// last MAX_RD_ATOMIC, so from a requester that exceeded our
    /// `max_dest_rd_atomic`, or a late network duplicate of a long
    /// completed request). Never executed again (PSN-3: an atomic must not
    /// run twice). rxe drops it silently (IBA class D), which leaves a
    /// requester that really waits for it retrying until its retry count
    /// runs out, forever with rxe's retry_cnt 7; we answer NAK Invalid
    /// Request at its PSN so that requester fails at once. Our QP stays up:
    /// a requester not waiting for that PSN ignores the NAK, and a stale
    /// duplicate must not kill a working connection.
    fn unknown_duplicate(&mut self, ctx: &mut Ctx<'_>, psn: u32) {
        tracing::debug!(
            qpn = ctx.qp.qpn,
            psn,
            "duplicate READ/atomic without a saved resource"
        );
        let msn = self.msn;
        self.respond_first(
            ctx,
            Resp::Nak {
                psn,
                syn: Syndrome::NakInvalidRequest,
                msn,
                fatal: false,
            },
        );
    }

    // ----- state machine -------------------------------------------------

    fn modify(&mut self, ctx: &mut Ctx<'_>, to: QpState) -> Result<()> {
        if !self.state.can_transition(to) {
            return Err(VerbsError::InvalidTransition {
                from: self.state,
                to,
            });
        }
        match to {
            QpState::Err => self.enter_err(ctx),
            QpState::Reset => {
                let cap = ctx.qp.cap;
                let fault = self.fault.take();
                *self = QpInner::new(cap);
                self.fault = fault;
            }
            s => self.state = s,
        }
        Ok(())
    }
}

fn path_parts<'a>(p: &'a Path, qp: &QpShared) -> TxPath<'a> {
    (&p.dst, &p.ip, p.sport, p.dport, qp.tx_fd())
}

impl QpOps for SoftQp {
    fn qpn(&self) -> u32 {
        self.shared.qpn
    }
    fn state(&self) -> QpState {
        self.shared
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .state
    }
    fn cap(&self) -> QpCap {
        self.shared.cap
    }
    fn modify_to_init(&self, attr: &InitAttr) -> Result<()> {
        self.shared.run(|i, ctx| {
            i.modify(ctx, QpState::Init)?;
            i.access = attr.access;
            Ok(())
        })
    }
    fn modify_to_rtr(&self, attr: &RtrAttr) -> Result<()> {
        if attr.dest_qpn > smc_verbs::QPN_MASK || attr.rq_psn > PSN_MASK {
            return Err(VerbsError::InvalidArgument("QPN or PSN exceeds 24 bits"));
        }
        if attr.max_dest_rd_atomic as usize > MAX_RD_ATOMIC {
            return Err(VerbsError::InvalidArgument(
                "max_dest_rd_atomic exceeds the device's max_qp_rd_atom",
            ));
        }
        let dev = &self.shared.dev;
        let local = dev.attr.local_addr;
        let peer_ip = attr.ah.dgid.to_ip();
        let ip = match (local, peer_ip) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => IpInfo::V4 {
                src,
                dst,
                id: 0,
                flags_frag: IPV4_DF,
            },
            (IpAddr::V6(src), IpAddr::V6(dst)) => IpInfo::V6 { src, dst },
            _ => {
                return Err(VerbsError::InvalidArgument(
                    "GID family differs from the device's",
                ))
            }
        };
        let mtu = attr.path_mtu.min(dev.attr.active_mtu).bytes();
        let qpn = self.shared.qpn;
        let faults = dev.config.faults.clone();
        self.shared.run(|i, ctx| {
            i.modify(ctx, QpState::Rtr)?;
            i.mtu = mtu;
            i.dest_qpn = attr.dest_qpn;
            i.epsn = attr.rq_psn;
            i.min_rnr_timer = attr.min_rnr_timer & 31;
            i.max_dest_rd_atomic = attr.max_dest_rd_atomic;
            i.path = Some(Path {
                dst: SocketAddr::new(peer_ip, dev.peer_port).into(),
                peer_ip,
                ip,
                sport: self.shared.sport,
                dport: dev.peer_port,
            });
            i.fault = faults.as_ref().map(|f| FaultState::new(f, qpn));
            Ok(())
        })
    }
    fn modify_to_rts(&self, attr: &RtsAttr) -> Result<()> {
        if attr.sq_psn > PSN_MASK
            || attr.retry_cnt > 7
            || attr.rnr_retry > 7
            || attr.timeout > 31
            || attr.max_rd_atomic as usize > MAX_RD_ATOMIC
        {
            return Err(VerbsError::InvalidArgument("RTS attribute out of range"));
        }
        self.shared.run(|i, ctx| {
            let from = i.state;
            i.modify(ctx, QpState::Rts)?;
            if from == QpState::Rtr {
                i.psn = attr.sq_psn;
                i.max_psn = attr.sq_psn;
                i.una = attr.sq_psn;
            }
            i.timeout = (attr.timeout != 0)
                .then(|| Duration::from_nanos(4096u64 << attr.timeout).max(MIN_ACK_TIMEOUT));
            i.retry_cnt = attr.retry_cnt;
            i.retry_left = attr.retry_cnt;
            i.rnr_retry = attr.rnr_retry;
            i.rnr_left = attr.rnr_retry;
            i.max_rd_atomic = attr.max_rd_atomic;
            i.pump(ctx);
            Ok(())
        })
    }
    fn modify_to_err(&self) -> Result<()> {
        self.shared.run(|i, ctx| i.modify(ctx, QpState::Err))
    }
    fn modify_to_reset(&self) -> Result<()> {
        self.shared.run(|i, ctx| i.modify(ctx, QpState::Reset))
    }
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        self.shared.run(|i, ctx| i.post_send(ctx, wrs))
    }
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        self.shared.run(|i, ctx| i.post_recv(ctx, wrs))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
