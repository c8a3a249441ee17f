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
//!
//! Modules, after Linux rxe: [`wqe`] validates and queues posted work
//! requests (and copies between messages and their scatter/gather lists),
//! [`req`] is the requester (segmentation, transmission, retransmission
//! timers), [`comp`] the completer (ACKs, NAKs and READ/atomic responses
//! retire send WQEs into completions), [`resp`] the responder (executes
//! requests in PSN order, duplicates) and [`reply`] sends what the
//! responder owes, in PSN order.

mod comp;
mod reply;
mod req;
mod resp;
#[cfg(test)]
mod tests;
mod wqe;

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrayvec::ArrayVec;
use smc_verbs::{
    AccessFlags, InitAttr, QpCap, QpState, RecvWr, Result, RtrAttr, RtsAttr, SendOp, SendWr,
    VerbsError, WcOpcode, WcStatus, PSN_MASK,
};

use crate::cq::CqShared;
use crate::device::DevShared;
use crate::fault::FaultState;
use crate::icrc::{IpInfo, IPV4_DF};
use crate::mr::MrEntry;
use crate::tx::{TxBatch, TxPath, TX};
use crate::wire::{Parsed, Syndrome};

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

/// Everything a QP is made of but its number (checked by the verbs layer).
pub(crate) struct QpConfig {
    pub(crate) dev: Arc<DevShared>,
    /// The QP's own sending socket (see [`crate::net::qp_socket`]), or
    /// `None` to send from the device's.
    pub(crate) tx_sock: Option<socket2::Socket>,
    /// UDP source port of its packets.
    pub(crate) sport: u16,
    pub(crate) pd: u32,
    pub(crate) send_cq: Arc<CqShared>,
    pub(crate) recv_cq: Arc<CqShared>,
    pub(crate) cap: QpCap,
    pub(crate) sig_all: bool,
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
    /// A QP in RESET numbered `qpn`.
    pub(crate) fn new(qpn: u32, c: QpConfig) -> QpShared {
        QpShared {
            qpn,
            dev: c.dev,
            tx_sock: c.tx_sock,
            sport: c.sport,
            pd: c.pd,
            send_cq: c.send_cq,
            recv_cq: c.recv_cq,
            cap: c.cap,
            sig_all: c.sig_all,
            inner: Mutex::new(QpInner::new(c.cap)),
            deadline: AtomicU64::new(0),
            work: AtomicBool::new(false),
        }
    }

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
        self.run_at(Instant::now(), f)
    }

    /// [`Self::run`] with the time read by the caller (one clock read for many
    /// packets: a received datagram's segments).
    pub(crate) fn run_at<R>(
        &self,
        now: Instant,
        f: impl FnOnce(&mut QpInner, &mut Ctx<'_>) -> R,
    ) -> R {
        let (r, fire_send, fire_recv, deadline, work) = TX.with(|cell| {
            let mut batch = cell.borrow_mut();
            let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            let mut ctx = Ctx {
                qp: self,
                tx: &mut batch,
                now,
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

    /// Handles one packet received at `now` (engine thread or a driving
    /// waiter); false if it was not from the QP's connected peer and was
    /// dropped unprocessed.
    pub(crate) fn on_packet(&self, now: Instant, p: &Parsed, pkt: &[u8], src: IpAddr) -> bool {
        self.run_at(now, |inner, ctx| inner.on_packet(ctx, p, pkt, src))
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
/// The verbs of a QP ([`smc_verbs::QpOps`], called by [`crate::verbs`]).
impl QpShared {
    pub(crate) fn state(&self) -> QpState {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).state
    }
    pub(crate) fn cap(&self) -> QpCap {
        self.cap
    }
    pub(crate) fn modify_to_init(&self, attr: &InitAttr) -> Result<()> {
        self.run(|i, ctx| {
            i.modify(ctx, QpState::Init)?;
            i.access = attr.access;
            Ok(())
        })
    }
    pub(crate) fn modify_to_rtr(&self, attr: &RtrAttr) -> Result<()> {
        if attr.dest_qpn > smc_verbs::QPN_MASK || attr.rq_psn > PSN_MASK {
            return Err(VerbsError::InvalidArgument("QPN or PSN exceeds 24 bits"));
        }
        if attr.max_dest_rd_atomic as usize > MAX_RD_ATOMIC {
            return Err(VerbsError::InvalidArgument(
                "max_dest_rd_atomic exceeds the device's max_qp_rd_atom",
            ));
        }
        let dev = &self.dev;
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
        let qpn = self.qpn;
        let faults = dev.config.faults.clone();
        self.run(|i, ctx| {
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
                sport: self.sport,
                dport: dev.peer_port,
            });
            i.fault = faults.as_ref().map(|f| FaultState::new(f, qpn));
            Ok(())
        })
    }
    pub(crate) fn modify_to_rts(&self, attr: &RtsAttr) -> Result<()> {
        if attr.sq_psn > PSN_MASK
            || attr.retry_cnt > 7
            || attr.rnr_retry > 7
            || attr.timeout > 31
            || attr.max_rd_atomic as usize > MAX_RD_ATOMIC
        {
            return Err(VerbsError::InvalidArgument("RTS attribute out of range"));
        }
        self.run(|i, ctx| {
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
    pub(crate) fn modify_to_err(&self) -> Result<()> {
        self.run(|i, ctx| i.modify(ctx, QpState::Err))
    }
    pub(crate) fn modify_to_reset(&self) -> Result<()> {
        self.run(|i, ctx| i.modify(ctx, QpState::Reset))
    }
    pub(crate) fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        self.run(|i, ctx| i.post_send(ctx, wrs))
    }
    pub(crate) fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        self.run(|i, ctx| i.post_recv(ctx, wrs))
    }
}
