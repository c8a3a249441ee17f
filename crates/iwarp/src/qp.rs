//! RC queue pairs over one TCP connection each: RDMAP (RFC 5040) over DDP (RFC 5041) over
//! MPA FPDUs (RFC 5044).
//!
//! A connected QP runs two threads. The transmit thread takes, in this order, a pending
//! Terminate, RDMA Read Responses owed to the peer, and send-queue work requests, builds
//! their FPDUs and writes them to the socket (blocking is fine there). The receive thread
//! reads FPDUs, checks CRC, DDP and RDMAP headers, places data (tagged: STag/TO checked
//! against the region's PD, bounds and access; untagged: into the posted receive of the
//! message's MSN) and queues Read Responses. Neither holds the QP lock while doing socket
//! I/O, and read responses never wait behind the send queue, so two peers reading from each
//! other cannot deadlock on full TCP buffers.
//!
//! Send-queue completions are delivered in posting order (a WRITE posted after a READ
//! completes after it). Errors: a protocol or protection error in received data sends a
//! Terminate (RFC 5040 §4.8) and moves the QP to ERR; a Terminate received, a broken or
//! closed TCP connection, or a CQ overflow move it to ERR too; in ERR every outstanding
//! and later work request completes with `WrFlushErr`.

use std::any::Any;
use std::collections::VecDeque;
use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use smc_verbs::{
    AccessFlags, InitAttr, QpCap, QpInitAttr, QpOps, QpState, RecvWr, Result, RtrAttr, RtsAttr,
    SendFlags, SendOp, SendWr, Sge, VerbsError, WcOpcode, WcStatus, WorkCompletion,
};

use crate::cq::{CqShared, IwCq};
use crate::device::DevShared;
use crate::mr::{IwPd, MrEntry};
use crate::negotiate::Rtr;
use crate::wire::ddp::{
    qn, term, DdpRepr, Opcode, Placement, ReadRequest, TerminateRepr, READ_REQ_LEN, TAGGED_HDR_LEN,
    UNTAGGED_HDR_LEN,
};
use crate::wire::mpa::{fpdu_crc, fpdu_len, pad_len, FPDU_CRC_LEN, FPDU_LEN_FIELD};
use crate::wire::WireError;

/// What the connection manager hands a QP when it goes to RTS.
#[derive(Clone, Debug)]
pub(crate) struct ConnSetup {
    /// CRC32c on FPDUs (negotiated with the MPA C bits).
    pub crc: bool,
    /// Largest ULPDU per FPDU.
    pub mulpdu: usize,
    /// Local IRD: inbound RDMA Reads served at once.
    pub ird: u16,
    /// Local ORD: outbound RDMA Reads in flight at once.
    pub ord: u16,
    /// Responder: what must arrive before it may transmit.
    pub fence: Fence,
    /// Initiator in peer-to-peer mode: the RTR to send before anything else (RT-2).
    pub send_rtr: Option<Rtr>,
}

/// What a responder waits for before it transmits anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fence {
    /// Nothing (initiator, or fence lifted).
    None,
    /// Client-server model: the initiator's first FPDU (RFC 5044 §7.1.2: the initiator
    /// sends first).
    FirstFpdu,
    /// Peer-to-peer model: the RTR (RFC 6581 §3 MPA fencing, CHECKLIST RT-3).
    Rtr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SqKind {
    Send { se: bool },
    Write { raddr: u64, rkey: u32 },
    Read { raddr: u64, rkey: u32 },
    Rtr(Rtr),
}

#[derive(Debug)]
struct SqWqe {
    seq: u64,
    kind: SqKind,
    sges: Vec<Sge>,
    inline: Option<Vec<u8>>,
    fence: bool,
}

#[derive(Debug)]
struct Inflight {
    seq: u64,
    wr_id: u64,
    opcode: WcOpcode,
    byte_len: u32,
    signaled: bool,
    internal: bool,
    done: Option<WcStatus>,
}

#[derive(Debug)]
struct RqWqe {
    wr_id: u64,
    sges: Vec<Sge>,
}

/// An outbound RDMA Read waiting for its response.
struct OutRead {
    seq: u64,
    sink_stag: u32,
    sink_to: u64,
    size: u64,
    received: u64,
}

/// A Read Response owed to the peer.
struct ReadResp {
    src: Option<(Arc<MrEntry>, usize)>,
    len: u64,
    sink_stag: u32,
    sink_to: u64,
}

struct CurRecv {
    wqe: RqWqe,
    got: u64,
}

pub(crate) struct Inner {
    pub(crate) state: QpState,
    access: AccessFlags,
    conn: Option<ConnSetup>,
    sq: VecDeque<SqWqe>,
    inflight: VecDeque<Inflight>,
    rq: VecDeque<RqWqe>,
    resp_q: VecDeque<ReadResp>,
    reads: VecDeque<OutRead>,
    inbound_reads: u32,
    next_seq: u64,
    tx_msn: [u32; 3],
    rx_send_msn: u32,
    rx_rreq_msn: u32,
    rx_term_msn: u32,
    cur_recv: Option<CurRecv>,
    fence: Fence,
    term_out: Option<TermOut>,
    closing: bool,
    tx_alive: bool,
    /// Set once a Terminate went out or the connection broke: the receive side only drains.
    rx_drain: bool,
    /// Why the QP entered ERR, for `error_reason`.
    error: Option<String>,
    /// The send WR the transmit thread is writing to TCP: its completion is the transmit
    /// thread's (success once TCP took all of it), not the flush of a concurrent ERR.
    tx_current: Option<u64>,
    /// Next outbox number (see [`Outbox`]).
    next_ticket: u64,
    /// SMC-R link mode: the peer QP this QP is connected to.
    pub(crate) link_peer: Option<(std::net::IpAddr, u32)>,
    /// SMC-R link mode: the listener is accepting a connection onto this QP.
    pub(crate) link_claimed: bool,
}

#[derive(Clone, Copy, Debug)]
struct TermOut {
    layer: u8,
    etype: u8,
    code: u8,
}

/// Shared QP state (the handle, the two threads and the connection manager hold it).
pub(crate) struct QpShared {
    pub(crate) qpn: u32,
    pd: u32,
    pub(crate) dev: Arc<DevShared>,
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
    cap: QpCap,
    sq_sig_all: bool,
    st: Mutex<Inner>,
    pub(crate) cv: Condvar,
    sock: Mutex<Option<TcpStream>>,
    /// Number of the next outbox to deliver, and its condition variable.
    delivered: Mutex<u64>,
    delivered_cv: Condvar,
}

/// Completions to deliver once the QP lock is released. Outboxes are numbered (under the
/// QP lock) when they get their first completion and delivered in that order, so that the
/// completions of concurrent threads (transmit, receive, application) reach the CQ in the
/// order they were made.
#[derive(Default)]
struct Outbox {
    send: Vec<WorkCompletion>,
    recv: Vec<WorkCompletion>,
    ticket: Option<u64>,
}

impl Outbox {
    fn push(&mut self, g: &mut Inner, send: bool, wc: WorkCompletion) {
        if self.ticket.is_none() {
            self.ticket = Some(g.next_ticket);
            g.next_ticket += 1;
        }
        if send {
            self.send.push(wc)
        } else {
            self.recv.push(wc)
        }
    }
}

/// The QP handle.
pub(crate) struct IwQp {
    pub(crate) shared: Arc<QpShared>,
}

impl Drop for IwQp {
    fn drop(&mut self) {
        self.shared.destroy();
    }
}

pub(crate) fn create(pd: &IwPd, attr: &QpInitAttr) -> Result<Arc<dyn QpOps>> {
    let cq = |c: &smc_verbs::Cq| -> Result<Arc<CqShared>> {
        c.0.as_any()
            .downcast_ref::<IwCq>()
            .map(|c| c.shared.clone())
            .ok_or(VerbsError::WrongDevice)
    };
    let a = &pd.dev.attr;
    let cap = attr.cap;
    if cap.max_send_wr == 0
        || cap.max_send_wr > a.max_qp_wr
        || cap.max_recv_wr > a.max_qp_wr
        || cap.max_send_sge > a.max_sge
        || cap.max_recv_sge > a.max_sge
        || cap.max_inline_data > a.max_inline_data
    {
        return Err(VerbsError::InvalidArgument(
            "QP capacities beyond the device limits",
        ));
    }
    if pd.dev.stats.qps_open.load(Ordering::Relaxed) >= a.max_qp as u64 {
        return Err(VerbsError::ResourceExhausted("queue pairs"));
    }
    let shared = Arc::new(QpShared {
        qpn: pd.dev.alloc_qpn(),
        pd: pd.id,
        dev: pd.dev.clone(),
        send_cq: cq(&attr.send_cq)?,
        recv_cq: cq(&attr.recv_cq)?,
        cap,
        sq_sig_all: attr.sq_sig_all,
        st: Mutex::new(Inner {
            state: QpState::Reset,
            access: AccessFlags::empty(),
            conn: None,
            sq: VecDeque::new(),
            inflight: VecDeque::new(),
            rq: VecDeque::new(),
            resp_q: VecDeque::new(),
            reads: VecDeque::new(),
            inbound_reads: 0,
            next_seq: 0,
            tx_msn: [1, 1, 1],
            rx_send_msn: 1,
            rx_rreq_msn: 1,
            rx_term_msn: 1,
            cur_recv: None,
            fence: Fence::None,
            term_out: None,
            closing: false,
            tx_alive: false,
            rx_drain: false,
            error: None,
            link_peer: None,
            link_claimed: false,
            tx_current: None,
            next_ticket: 0,
        }),
        delivered: Mutex::new(0),
        delivered_cv: Condvar::new(),
        cv: Condvar::new(),
        sock: Mutex::new(None),
    });
    pd.dev.stats.qps_open.fetch_add(1, Ordering::Relaxed);
    pd.dev
        .qps
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(shared.qpn, Arc::downgrade(&shared));
    Ok(Arc::new(IwQp { shared }))
}

fn wire_err(e: WireError) -> (u8, u8, u8) {
    use crate::wire::ddp::field;
    match e {
        WireError::Invalid { field: f, .. } if f == field::DDP_VERSION => {
            (term::LAYER_DDP, term::DDP_UNTAGGED, term::UNTAGGED_VERSION)
        }
        WireError::Invalid { field: f, .. } if f == field::RDMAP_VERSION => (
            term::LAYER_RDMAP,
            term::RDMAP_REMOTE_OP,
            term::OP_INVALID_VERSION,
        ),
        WireError::Invalid { field: f, .. } if f == field::OPCODE => (
            term::LAYER_RDMAP,
            term::RDMAP_REMOTE_OP,
            term::OP_UNEXPECTED_OPCODE,
        ),
        _ => (
            term::LAYER_RDMAP,
            term::RDMAP_REMOTE_OP,
            term::OP_CATASTROPHIC_STREAM,
        ),
    }
}

impl QpShared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn deliver(&self, out: Outbox) {
        let Some(ticket) = out.ticket else { return };
        let (mut fire_send, mut fire_recv, mut overflow) = (false, false, false);
        {
            // Wait for the outboxes numbered before this one (their threads are between
            // the QP lock and here; nothing else holds this lock), then queue without
            // calling handlers, which run after, outside every lock.
            let mut d = self.delivered.lock().unwrap_or_else(|e| e.into_inner());
            while *d != ticket {
                d = self.delivered_cv.wait(d).unwrap_or_else(|e| e.into_inner());
            }
            for wc in out.send {
                match self.send_cq.push(wc) {
                    Ok(f) => fire_send |= f,
                    Err(()) => overflow = true,
                }
            }
            for wc in out.recv {
                match self.recv_cq.push(wc) {
                    Ok(f) => fire_recv |= f,
                    Err(()) => overflow = true,
                }
            }
            *d += 1;
            self.delivered_cv.notify_all();
        }
        if fire_send {
            self.send_cq.fire();
        }
        if fire_recv && !(fire_send && Arc::ptr_eq(&self.send_cq, &self.recv_cq)) {
            self.recv_cq.fire();
        }
        if overflow {
            self.fail("completion queue overflow", None);
        }
    }

    fn wc(&self, wr_id: u64, status: WcStatus, opcode: WcOpcode, byte_len: u32) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len,
            imm_data: None,
            qp_num: self.qpn,
            src_qp: 0,
            solicited: false,
        }
    }

    /// Moves completed send WRs at the head of the in-flight list to the outbox (send-queue
    /// completions leave in posting order).
    fn reap(&self, g: &mut Inner, out: &mut Outbox) {
        while let Some(h) = g.inflight.front() {
            let Some(status) = h.done else { break };
            let h = g.inflight.pop_front().expect("front exists");
            if !h.internal && (h.signaled || status != WcStatus::Success) {
                out.push(g, true, self.wc(h.wr_id, status, h.opcode, h.byte_len));
            }
        }
    }

    fn finish(&self, g: &mut Inner, seq: u64, status: WcStatus, out: &mut Outbox) {
        if let Some(f) = g.inflight.iter_mut().find(|f| f.seq == seq) {
            if f.done.is_none() {
                f.done = Some(status);
            }
        }
        self.reap(g, out);
    }

    /// Moves the QP to ERR and flushes everything (IBA §10.3.1 / RFC 5040 §6: after a
    /// Terminate or a broken stream no more work is processed). `term`: a Terminate to send
    /// first. Completes the oldest outstanding RDMA Read with `read_status` when given.
    fn fail_locked(
        &self,
        g: &mut Inner,
        why: &str,
        term: Option<TermOut>,
        read_status: Option<WcStatus>,
        out: &mut Outbox,
    ) {
        if g.state == QpState::Err {
            return;
        }
        tracing::debug!(qpn = self.qpn, why, "QP to ERR");
        g.state = QpState::Err;
        g.error = Some(why.to_string());
        if let (Some(st), Some(r)) = (read_status, g.reads.front()) {
            let seq = r.seq;
            if let Some(f) = g.inflight.iter_mut().find(|f| f.seq == seq) {
                f.done = Some(st);
            }
        }
        g.reads.clear();
        g.resp_q.clear();
        let current = g.tx_current;
        for f in g.inflight.iter_mut() {
            if f.done.is_none() && Some(f.seq) != current {
                f.done = Some(WcStatus::WrFlushErr);
            }
        }
        self.reap(g, out);
        self.flush_queues(g, out);
        if term.is_some() && g.conn.is_some() && g.tx_alive {
            g.term_out = term;
        } else {
            self.shutdown(Shutdown::Both);
        }
        g.rx_drain = true;
        self.cv.notify_all();
    }

    fn flush_queues(&self, g: &mut Inner, out: &mut Outbox) {
        // In-flight entries that are not done yet belong to the transmit thread, which
        // finishes them (as flushed) when it sees ERR.
        self.reap(g, out);
        while let Some(w) = g.sq.pop_front() {
            if let Some(f) = g.inflight.iter_mut().find(|f| f.seq == w.seq) {
                f.done = Some(WcStatus::WrFlushErr);
            }
        }
        self.reap(g, out);
        if let Some(c) = g.cur_recv.take() {
            out.push(
                g,
                false,
                self.wc(c.wqe.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0),
            );
        }
        while let Some(r) = g.rq.pop_front() {
            out.push(
                g,
                false,
                self.wc(r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0),
            );
        }
    }

    pub(crate) fn fail(&self, why: &str, term: Option<(u8, u8, u8)>) {
        let mut out = Outbox::default();
        {
            let mut g = self.lock();
            let t = term.map(|(layer, etype, code)| TermOut { layer, etype, code });
            self.fail_locked(&mut g, why, t, None, &mut out);
        }
        self.deliver(out);
    }

    fn shutdown(&self, how: Shutdown) {
        if let Some(s) = self.sock.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            let _ = s.shutdown(how);
        }
    }

    fn destroy(self: &Arc<Self>) {
        let mut out = Outbox::default();
        {
            let mut g = self.lock();
            g.closing = true;
            if g.state != QpState::Err && g.state != QpState::Reset {
                self.fail_locked(&mut g, "QP destroyed", None, None, &mut out);
            }
            self.cv.notify_all();
        }
        self.shutdown(Shutdown::Both);
        self.deliver(out);
        self.dev.stats.qps_open.fetch_sub(1, Ordering::Relaxed);
        self.dev
            .qps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.qpn);
    }

    /// The reason the QP is in ERR (for logs and tools).
    pub(crate) fn error_reason(&self) -> Option<String> {
        self.lock().error.clone()
    }

    /// Binds the QP to its connected TCP stream and moves it to RTS (the connection
    /// manager calls this after the MPA exchange). With an initiator RTR, returns once the
    /// RTR has been handed to TCP, so no later FPDU can precede it (RFC 6581 §5, RT-2).
    pub(crate) fn attach(self: &Arc<Self>, stream: TcpStream, setup: ConnSetup) -> Result<()> {
        let reader = stream.try_clone()?;
        let writer = stream.try_clone()?;
        let _ = stream.set_nodelay(true);
        let _ = stream.set_read_timeout(None);
        let _ = stream.set_write_timeout(None);
        let rtr_seq;
        {
            let mut g = self.lock();
            match g.state {
                QpState::Init | QpState::Rtr => {}
                s => {
                    // RFC 6581 §9.3: a local error with no code of its own ends the
                    // establishment with Terminate 2/0/5 ("local catastrophic") before
                    // the connection is reset (here: the application moved or destroyed
                    // the QP while the MPA exchange was in flight).
                    drop(g);
                    let mut st = stream;
                    let _ =
                        crate::cm::send_terminate(&mut st, term::MPA_LOCAL_CATASTROPHIC, setup.crc);
                    return Err(VerbsError::InvalidState(s));
                }
            }
            *self.sock.lock().unwrap_or_else(|e| e.into_inner()) = Some(stream);
            g.fence = setup.fence;
            rtr_seq = setup.send_rtr.map(|r| {
                let seq = g.next_seq;
                g.next_seq += 1;
                g.sq.push_front(SqWqe {
                    seq,
                    kind: SqKind::Rtr(r),
                    sges: Vec::new(),
                    inline: None,
                    fence: false,
                });
                g.inflight.push_front(Inflight {
                    seq,
                    wr_id: 0,
                    opcode: WcOpcode::Send,
                    byte_len: 0,
                    signaled: false,
                    internal: true,
                    done: None,
                });
                seq
            });
            g.conn = Some(setup);
            g.state = QpState::Rts;
            g.tx_alive = true;
        }
        let me = self.clone();
        std::thread::Builder::new()
            .name(format!("iw-tx-{}", self.qpn))
            .spawn(move || me.tx_loop(writer))?;
        let me = self.clone();
        std::thread::Builder::new()
            .name(format!("iw-rx-{}", self.qpn))
            .spawn(move || me.rx_loop(reader))?;
        if let Some(seq) = rtr_seq {
            let mut g = self.lock();
            while g.state == QpState::Rts && g.sq.iter().any(|w| w.seq == seq) && !g.closing {
                g = self
                    .cv
                    .wait_timeout(g, Duration::from_millis(100))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            if g.state != QpState::Rts {
                return Err(VerbsError::DeviceGone(
                    g.error.clone().unwrap_or_else(|| "connection lost".into()),
                ));
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------------ transmit

    fn tx_loop(self: Arc<Self>, mut w: TcpStream) {
        let mut fb = FrameBuf::new();
        loop {
            enum Job {
                Term(TermOut, u32),
                Resp(ReadResp),
                Wqe(SqWqe, bool, usize),
                Stop,
            }
            let (job, crc) = {
                let mut g = self.lock();
                loop {
                    if let Some(t) = g.term_out.take() {
                        let msn = g.tx_msn[qn::TERMINATE as usize];
                        g.tx_msn[qn::TERMINATE as usize] = msn.wrapping_add(1);
                        break (Job::Term(t, msn), g.conn.as_ref().is_some_and(|c| c.crc));
                    }
                    if g.closing || g.state == QpState::Err {
                        // Work requests posted while in ERR are flushed here, on a
                        // provider thread.
                        let mut out = Outbox::default();
                        self.flush_queues(&mut g, &mut out);
                        if g.closing || !out.send.is_empty() || !out.recv.is_empty() {
                            drop(g);
                            self.deliver(out);
                            g = self.lock();
                            if g.closing {
                                g.tx_alive = false;
                                break (Job::Stop, false);
                            }
                            continue;
                        }
                        g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
                        continue;
                    }
                    let crc = g.conn.as_ref().is_some_and(|c| c.crc);
                    let mulpdu = g.conn.as_ref().map_or(1024, |c| c.mulpdu);
                    let ord = g.conn.as_ref().map_or(1, |c| c.ord.max(1)) as usize;
                    if g.fence == Fence::None {
                        if let Some(r) = g.resp_q.pop_front() {
                            break (Job::Resp(r), crc);
                        }
                        if let Some(h) = g.sq.front() {
                            let is_read = matches!(h.kind, SqKind::Read { .. })
                                || h.kind == SqKind::Rtr(Rtr::Read);
                            // ORD strictly limits outbound Reads in flight (RFC 6581
                            // §4.1, IO-12); a fenced WR waits for earlier Reads.
                            let blocked = (is_read && g.reads.len() >= ord)
                                || (h.fence && !g.reads.is_empty());
                            if !blocked {
                                let wqe = g.sq.pop_front().expect("front exists");
                                if !matches!(wqe.kind, SqKind::Read { .. } | SqKind::Rtr(Rtr::Read))
                                {
                                    g.tx_current = Some(wqe.seq);
                                }
                                break (Job::Wqe(wqe, crc, mulpdu), crc);
                            }
                        }
                    }
                    g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
                }
            };
            let r = match job {
                Job::Stop => return,
                Job::Term(t, msn) => {
                    let res = self.send_terminate(&mut w, &mut fb, t, msn, crc);
                    self.dev.stats.tx_terminates.fetch_add(1, Ordering::Relaxed);
                    // RFC 5040 §5.3: after a Terminate the stream is closed; keep reading
                    // (and discarding) until the peer closes, so the Terminate is not lost
                    // to a reset.
                    let _ = w.flush();
                    let _ = w.shutdown(Shutdown::Write);
                    if let Err(e) = res {
                        tracing::debug!(qpn = self.qpn, error = %e, "sending Terminate failed");
                    }
                    continue;
                }
                Job::Resp(r) => self.send_read_response(&mut w, &mut fb, &r, crc),
                Job::Wqe(wqe, crc, mulpdu) => {
                    let seq = wqe.seq;
                    let r = self.send_wqe(&mut w, &mut fb, wqe, crc, mulpdu);
                    let mut out = Outbox::default();
                    {
                        let mut g = self.lock();
                        if g.tx_current == Some(seq) {
                            g.tx_current = None;
                            if r.is_err() {
                                self.finish(&mut g, seq, WcStatus::WrFlushErr, &mut out);
                            }
                        }
                    }
                    self.deliver(out);
                    r
                }
            };
            if let Err(e) = r {
                self.fail(&format!("TCP send failed: {e}"), None);
            }
        }
    }

    fn send_terminate(
        &self,
        w: &mut TcpStream,
        fb: &mut FrameBuf,
        t: TermOut,
        msn: u32,
        crc: bool,
    ) -> std::io::Result<()> {
        let tr = TerminateRepr::new(t.layer, t.etype, t.code);
        let mut body = [0u8; 64];
        let n = tr.emit(&mut body).map_err(std::io::Error::other)?;
        let hdr = DdpRepr {
            last: true,
            opcode: Opcode::Terminate,
            placement: Placement::Untagged {
                inv_stag: 0,
                qn: qn::TERMINATE,
                msn,
                mo: 0,
            },
        };
        fb.build(&hdr, n, crc, |p| p.copy_from_slice(&body[..n]));
        self.dev.stats.tx_fpdus.fetch_add(1, Ordering::Relaxed);
        w.write_all(fb.bytes())
    }

    /// Gathers `[off, off+dst.len())` of a WR's data into `dst`.
    fn gather(
        &self,
        wqe: &SqWqe,
        srcs: &[(Arc<MrEntry>, usize, usize)],
        off: usize,
        dst: &mut [u8],
    ) {
        if let Some(d) = &wqe.inline {
            dst.copy_from_slice(&d[off..off + dst.len()]);
            return;
        }
        let mut pos = 0usize; // start of the current SGE in the message
        let mut done = 0usize;
        for (mr, moff, len) in srcs {
            let (s, e) = (pos, pos + len);
            pos = e;
            let want_s = off + done;
            if want_s >= e || done == dst.len() {
                continue;
            }
            let from = want_s - s;
            let n = (len - from).min(dst.len() - done);
            mr.fetch(moff + from, &mut dst[done..done + n]);
            done += n;
        }
    }

    /// Resolves a gather/scatter list against the region table: each SGE must lie in a
    /// region of this QP's PD named by its lkey (with `need` access).
    fn resolve(
        &self,
        sges: &[Sge],
        need: AccessFlags,
    ) -> Option<Vec<(Arc<MrEntry>, usize, usize)>> {
        let mut v = Vec::with_capacity(sges.len());
        for s in sges {
            if s.length == 0 {
                continue;
            }
            let mr = self.dev.mrs.lookup(s.lkey)?;
            if mr.pd != self.pd || !mr.access.contains(need) {
                return None;
            }
            let off = mr.offset_of(s.addr, s.length as u64)?;
            v.push((mr, off, s.length as usize));
        }
        Some(v)
    }

    fn send_wqe(
        &self,
        w: &mut TcpStream,
        fb: &mut FrameBuf,
        wqe: SqWqe,
        crc: bool,
        mulpdu: usize,
    ) -> std::io::Result<()> {
        let total: usize = match &wqe.inline {
            Some(d) => d.len(),
            None => wqe.sges.iter().map(|s| s.length as usize).sum(),
        };
        let srcs = if wqe.inline.is_some() {
            Some(Vec::new())
        } else {
            let need = if matches!(wqe.kind, SqKind::Read { .. }) {
                AccessFlags::LOCAL_WRITE
            } else {
                AccessFlags::empty()
            };
            self.resolve(&wqe.sges, need)
        };
        let Some(srcs) = srcs else {
            // Local protection error: the WR fails and the QP goes to ERR (IBA C10-95
            // semantics, as the RoCE provider does).
            let mut out = Outbox::default();
            {
                let mut g = self.lock();
                self.finish(&mut g, wqe.seq, WcStatus::LocProtErr, &mut out);
                self.fail_locked(&mut g, "local protection error", None, None, &mut out);
            }
            self.deliver(out);
            return Ok(());
        };
        match wqe.kind {
            SqKind::Send { se } => {
                let msn = {
                    let mut g = self.lock();
                    let m = g.tx_msn[0];
                    g.tx_msn[0] = m.wrapping_add(1);
                    m
                };
                let op = if se { Opcode::SendSe } else { Opcode::Send };
                let room = mulpdu - UNTAGGED_HDR_LEN;
                let mut off = 0usize;
                loop {
                    let n = (total - off).min(room);
                    let last = off + n == total;
                    let hdr = DdpRepr {
                        last,
                        opcode: op,
                        placement: Placement::Untagged {
                            inv_stag: 0,
                            qn: qn::SEND,
                            msn,
                            mo: off as u32,
                        },
                    };
                    fb.build(&hdr, n, crc, |p| self.gather(&wqe, &srcs, off, p));
                    w.write_all(fb.bytes())?;
                    self.dev.stats.tx_fpdus.fetch_add(1, Ordering::Relaxed);
                    off += n;
                    if last {
                        break;
                    }
                }
            }
            SqKind::Write { raddr, rkey } => {
                let room = mulpdu - TAGGED_HDR_LEN;
                let mut off = 0usize;
                loop {
                    let n = (total - off).min(room);
                    let last = off + n == total;
                    let hdr = DdpRepr {
                        last,
                        opcode: Opcode::Write,
                        placement: Placement::Tagged {
                            stag: rkey,
                            to: raddr.wrapping_add(off as u64),
                        },
                    };
                    fb.build(&hdr, n, crc, |p| self.gather(&wqe, &srcs, off, p));
                    w.write_all(fb.bytes())?;
                    self.dev.stats.tx_fpdus.fetch_add(1, Ordering::Relaxed);
                    off += n;
                    if last {
                        break;
                    }
                }
            }
            SqKind::Read { raddr, rkey } => {
                let (sink_stag, sink_to) = wqe
                    .sges
                    .first()
                    .filter(|s| s.length > 0)
                    .map_or((0, 0), |s| (s.lkey, s.addr));
                return self.send_read_request(
                    w,
                    fb,
                    wqe.seq,
                    sink_stag,
                    sink_to,
                    total as u64,
                    rkey,
                    raddr,
                    crc,
                );
            }
            SqKind::Rtr(Rtr::Write) => {
                // RFC 6581 §9.2: zero-length RDMA Write, STag 0 / TO 0 (AMB-M4).
                let hdr = DdpRepr {
                    last: true,
                    opcode: Opcode::Write,
                    placement: Placement::Tagged { stag: 0, to: 0 },
                };
                fb.build(&hdr, 0, crc, |_| {});
                w.write_all(fb.bytes())?;
                self.dev.stats.tx_fpdus.fetch_add(1, Ordering::Relaxed);
            }
            SqKind::Rtr(Rtr::Send) => {
                let msn = {
                    let mut g = self.lock();
                    let m = g.tx_msn[0];
                    g.tx_msn[0] = m.wrapping_add(1);
                    m
                };
                let hdr = DdpRepr {
                    last: true,
                    opcode: Opcode::Send,
                    placement: Placement::Untagged {
                        inv_stag: 0,
                        qn: qn::SEND,
                        msn,
                        mo: 0,
                    },
                };
                fb.build(&hdr, 0, crc, |_| {});
                w.write_all(fb.bytes())?;
                self.dev.stats.tx_fpdus.fetch_add(1, Ordering::Relaxed);
            }
            SqKind::Rtr(Rtr::Read) => {
                // Zero-length RDMA Read; its (zero-length) response completes it inside
                // the provider.
                return self.send_read_request(w, fb, wqe.seq, 0, 0, 0, 0, 0, crc);
            }
        }
        let mut out = Outbox::default();
        {
            let mut g = self.lock();
            self.finish(&mut g, wqe.seq, WcStatus::Success, &mut out);
            self.cv.notify_all();
        }
        self.deliver(out);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn send_read_request(
        &self,
        w: &mut TcpStream,
        fb: &mut FrameBuf,
        seq: u64,
        sink_stag: u32,
        sink_to: u64,
        size: u64,
        src_stag: u32,
        src_to: u64,
        crc: bool,
    ) -> std::io::Result<()> {
        let msn = {
            let mut g = self.lock();
            if g.state != QpState::Rts {
                return Ok(());
            }
            let m = g.tx_msn[qn::READ_REQ as usize];
            g.tx_msn[qn::READ_REQ as usize] = m.wrapping_add(1);
            // Registered before the request leaves, so the response finds it.
            g.reads.push_back(OutRead {
                seq,
                sink_stag,
                sink_to,
                size,
                received: 0,
            });
            self.cv.notify_all();
            m
        };
        let rr = ReadRequest {
            sink_stag,
            sink_to,
            size: size as u32,
            src_stag,
            src_to,
        };
        let hdr = DdpRepr {
            last: true,
            opcode: Opcode::ReadRequest,
            placement: Placement::Untagged {
                inv_stag: 0,
                qn: qn::READ_REQ,
                msn,
                mo: 0,
            },
        };
        fb.build(&hdr, READ_REQ_LEN, crc, |p| {
            let _ = rr.emit(p);
        });
        self.dev.stats.tx_fpdus.fetch_add(1, Ordering::Relaxed);
        w.write_all(fb.bytes())
    }

    fn send_read_response(
        &self,
        w: &mut TcpStream,
        fb: &mut FrameBuf,
        r: &ReadResp,
        crc: bool,
    ) -> std::io::Result<()> {
        let mulpdu = self.lock().conn.as_ref().map_or(1024, |c| c.mulpdu);
        let room = mulpdu - TAGGED_HDR_LEN;
        let total = r.len as usize;
        let mut off = 0usize;
        loop {
            let n = (total - off).min(room);
            let last = off + n == total;
            let hdr = DdpRepr {
                last,
                opcode: Opcode::ReadResponse,
                placement: Placement::Tagged {
                    stag: r.sink_stag,
                    to: r.sink_to.wrapping_add(off as u64),
                },
            };
            fb.build(&hdr, n, crc, |p| {
                if let Some((mr, moff)) = &r.src {
                    mr.fetch(moff + off, p);
                }
            });
            w.write_all(fb.bytes())?;
            self.dev.stats.tx_fpdus.fetch_add(1, Ordering::Relaxed);
            off += n;
            if last {
                break;
            }
        }
        let mut g = self.lock();
        g.inbound_reads = g.inbound_reads.saturating_sub(1);
        Ok(())
    }

    // ------------------------------------------------------------------ receive

    fn rx_loop(self: Arc<Self>, r: TcpStream) {
        let mut rd = BufReader::with_capacity(256 * 1024, r);
        let mut buf = vec![0u8; 70_000];
        loop {
            let mut lenb = [0u8; 2];
            if let Err(e) = rd.read_exact(&mut lenb) {
                self.rx_closed(&e);
                return;
            }
            let ulen = u16::from_be_bytes(lenb) as usize;
            let total = fpdu_len(ulen);
            buf[..2].copy_from_slice(&lenb);
            if let Err(e) = rd.read_exact(&mut buf[2..total]) {
                self.rx_closed(&e);
                return;
            }
            let (crc, drain) = {
                let g = self.lock();
                (g.conn.as_ref().is_some_and(|c| c.crc), g.rx_drain)
            };
            if drain {
                continue;
            }
            self.dev.stats.rx_fpdus.fetch_add(1, Ordering::Relaxed);
            if crc {
                let body = total - FPDU_CRC_LEN;
                let want = fpdu_crc(&buf[..body]);
                let got =
                    u32::from_le_bytes([buf[body], buf[body + 1], buf[body + 2], buf[body + 3]]);
                if want != got {
                    self.dev.stats.rx_bad_crc.fetch_add(1, Ordering::Relaxed);
                    self.fail(
                        "MPA CRC error",
                        Some((term::LAYER_LLP, term::LLP_MPA, term::MPA_CRC)),
                    );
                    continue;
                }
            }
            let ulpdu = &buf[FPDU_LEN_FIELD..FPDU_LEN_FIELD + ulen];
            match DdpRepr::parse(ulpdu) {
                Ok((hdr, payload)) => {
                    if let Err((why, t)) = self.rx_segment(&hdr, payload) {
                        self.fail(why, Some(t));
                    }
                }
                Err(e) => {
                    let t = wire_err(e);
                    self.fail(&format!("bad DDP/RDMAP header: {e}"), Some(t));
                }
            }
        }
    }

    fn rx_closed(&self, e: &std::io::Error) {
        let clean = e.kind() == std::io::ErrorKind::UnexpectedEof;
        let mut g = self.lock();
        if g.state == QpState::Rts {
            let mut out = Outbox::default();
            let why = if clean {
                "TCP connection closed by the peer".to_string()
            } else {
                format!("TCP connection lost: {e}")
            };
            self.fail_locked(&mut g, &why, None, None, &mut out);
            drop(g);
            self.deliver(out);
        } else {
            drop(g);
            self.shutdown(Shutdown::Both);
        }
    }

    /// Processes one DDP segment. `Err((why, terminate))` makes the caller send that
    /// Terminate and move the QP to ERR.
    fn rx_segment(
        &self,
        hdr: &DdpRepr,
        payload: &[u8],
    ) -> std::result::Result<(), (&'static str, (u8, u8, u8))> {
        let mut out = Outbox::default();
        let r = {
            let mut g = self.lock();
            if g.state != QpState::Rts {
                return Ok(());
            }
            let r = self.rx_segment_locked(&mut g, hdr, payload, &mut out);
            if r.is_ok() && g.fence == Fence::FirstFpdu {
                g.fence = Fence::None;
            }
            if r.is_ok() {
                self.cv.notify_all();
            }
            r
        };
        self.deliver(out);
        r
    }

    fn rx_segment_locked(
        &self,
        g: &mut Inner,
        hdr: &DdpRepr,
        payload: &[u8],
        out: &mut Outbox,
    ) -> std::result::Result<(), (&'static str, (u8, u8, u8))> {
        const PROT: u8 = term::RDMAP_REMOTE_PROT;
        match (hdr.opcode, hdr.placement) {
            (Opcode::Write, Placement::Tagged { stag, to }) => {
                if payload.is_empty() {
                    // Zero-length Write: no STag check (AMB-M4); the RTR when awaited.
                    if hdr.last && g.fence != Fence::None {
                        g.fence = Fence::None;
                    }
                    return Ok(());
                }
                if g.fence == Fence::Rtr {
                    return Err((
                        "data before the RTR",
                        (
                            term::LAYER_RDMAP,
                            term::RDMAP_REMOTE_OP,
                            term::OP_UNEXPECTED_OPCODE,
                        ),
                    ));
                }
                let mr = self.dev.mrs.lookup(stag).ok_or((
                    "RDMA Write: invalid STag",
                    (term::LAYER_RDMAP, PROT, term::PROT_INVALID_STAG),
                ))?;
                if mr.pd != self.pd {
                    return Err((
                        "RDMA Write: STag of another PD",
                        (term::LAYER_RDMAP, PROT, term::PROT_STAG_STREAM),
                    ));
                }
                if !mr.access.contains(AccessFlags::REMOTE_WRITE)
                    || !g.access.contains(AccessFlags::REMOTE_WRITE)
                {
                    return Err((
                        "RDMA Write: no remote write access",
                        (term::LAYER_RDMAP, PROT, term::PROT_ACCESS),
                    ));
                }
                let off = mr.offset_of(to, payload.len() as u64).ok_or((
                    "RDMA Write: base or bounds violation",
                    (term::LAYER_RDMAP, PROT, term::PROT_BOUNDS),
                ))?;
                mr.place(off, payload);
                Ok(())
            }
            (Opcode::ReadResponse, Placement::Tagged { stag, to }) => {
                let Some(rd) = g.reads.front_mut() else {
                    return Err((
                        "Read Response without a Read Request",
                        (
                            term::LAYER_RDMAP,
                            term::RDMAP_REMOTE_OP,
                            term::OP_UNEXPECTED_OPCODE,
                        ),
                    ));
                };
                if !payload.is_empty() {
                    if stag != rd.sink_stag {
                        return Err((
                            "Read Response: wrong STag",
                            (term::LAYER_DDP, term::DDP_TAGGED, term::TAGGED_INVALID_STAG),
                        ));
                    }
                    let exp = rd.sink_to.wrapping_add(rd.received);
                    if to != exp || rd.received + payload.len() as u64 > rd.size {
                        return Err((
                            "Read Response: bad offset or length",
                            (term::LAYER_DDP, term::DDP_TAGGED, term::TAGGED_BOUNDS),
                        ));
                    }
                    let mr = self
                        .dev
                        .mrs
                        .lookup(stag)
                        .filter(|m| m.pd == self.pd)
                        .ok_or((
                            "Read Response: sink region gone",
                            (term::LAYER_DDP, term::DDP_TAGGED, term::TAGGED_INVALID_STAG),
                        ))?;
                    let off = mr.offset_of(to, payload.len() as u64).ok_or((
                        "Read Response: outside the sink region",
                        (term::LAYER_DDP, term::DDP_TAGGED, term::TAGGED_BOUNDS),
                    ))?;
                    mr.place(off, payload);
                    rd.received += payload.len() as u64;
                }
                if hdr.last {
                    if rd.received != rd.size {
                        return Err((
                            "Read Response shorter than requested",
                            (term::LAYER_DDP, term::DDP_TAGGED, term::TAGGED_BOUNDS),
                        ));
                    }
                    let rd = g.reads.pop_front().expect("front exists");
                    if let Some(f) = g.inflight.iter_mut().find(|f| f.seq == rd.seq) {
                        f.byte_len = rd.size as u32;
                    }
                    self.finish(g, rd.seq, WcStatus::Success, out);
                }
                Ok(())
            }
            (
                op,
                Placement::Untagged {
                    inv_stag,
                    qn: q,
                    msn,
                    mo,
                },
            ) if op.is_send() => {
                if q != qn::SEND {
                    return Err((
                        "Send on a queue other than 0",
                        (
                            term::LAYER_DDP,
                            term::DDP_UNTAGGED,
                            term::UNTAGGED_INVALID_QN,
                        ),
                    ));
                }
                if msn != g.rx_send_msn {
                    return Err((
                        "Send: unexpected MSN",
                        (
                            term::LAYER_DDP,
                            term::DDP_UNTAGGED,
                            term::UNTAGGED_MSN_RANGE,
                        ),
                    ));
                }
                if matches!(op, Opcode::SendInvalidate | Opcode::SendSeInvalidate) {
                    // RFC 5040 §6.10: our STags are memory regions, which cannot be
                    // invalidated remotely.
                    let _ = inv_stag;
                    return Err((
                        "Send with Invalidate: STag cannot be invalidated",
                        (
                            term::LAYER_RDMAP,
                            term::RDMAP_REMOTE_OP,
                            term::PROT_CANNOT_INVALIDATE,
                        ),
                    ));
                }
                if g.fence == Fence::Rtr && msn == 1 && mo == 0 && payload.is_empty() && hdr.last {
                    // The zero-length Send RTR is consumed by the provider (AMB-M5).
                    g.fence = Fence::None;
                    g.rx_send_msn = 2;
                    return Ok(());
                }
                if g.fence == Fence::Rtr {
                    return Err((
                        "data before the RTR",
                        (
                            term::LAYER_RDMAP,
                            term::RDMAP_REMOTE_OP,
                            term::OP_UNEXPECTED_OPCODE,
                        ),
                    ));
                }
                if g.cur_recv.is_none() {
                    if mo != 0 {
                        return Err((
                            "Send: first segment with MO != 0",
                            (
                                term::LAYER_DDP,
                                term::DDP_UNTAGGED,
                                term::UNTAGGED_INVALID_MO,
                            ),
                        ));
                    }
                    let Some(wqe) = g.rq.pop_front() else {
                        return Err((
                            "Send: no receive posted",
                            (
                                term::LAYER_DDP,
                                term::DDP_UNTAGGED,
                                term::UNTAGGED_NO_BUFFER,
                            ),
                        ));
                    };
                    g.cur_recv = Some(CurRecv { wqe, got: 0 });
                }
                let cur = g.cur_recv.as_mut().expect("set above");
                if mo as u64 != cur.got {
                    return Err((
                        "Send: invalid MO",
                        (
                            term::LAYER_DDP,
                            term::DDP_UNTAGGED,
                            term::UNTAGGED_INVALID_MO,
                        ),
                    ));
                }
                if !payload.is_empty() {
                    let cap: u64 = cur.wqe.sges.iter().map(|s| s.length as u64).sum();
                    if cur.got + payload.len() as u64 > cap {
                        return Err((
                            "Send: longer than the receive buffer",
                            (term::LAYER_DDP, term::DDP_UNTAGGED, term::UNTAGGED_TOO_LONG),
                        ));
                    }
                    // Scatter into the receive's SGEs from offset `got`.
                    let mut done = 0usize;
                    let mut pos = 0u64;
                    for s in &cur.wqe.sges {
                        let (a, b) = (pos, pos + s.length as u64);
                        pos = b;
                        let at = cur.got + done as u64;
                        if at >= b || done == payload.len() {
                            continue;
                        }
                        let from = at - a;
                        let n = ((s.length as u64 - from) as usize).min(payload.len() - done);
                        let mr = self.dev.mrs.lookup(s.lkey).filter(|m| {
                            m.pd == self.pd && m.access.contains(AccessFlags::LOCAL_WRITE)
                        });
                        let off = mr
                            .as_ref()
                            .and_then(|m| m.offset_of(s.addr + from, n as u64));
                        match (mr, off) {
                            (Some(m), Some(o)) => m.place(o, &payload[done..done + n]),
                            _ => {
                                // The receive's own SGE is bad: a local protection error
                                // on our side (IBA), reported in its completion.
                                let c = g.cur_recv.take().expect("set above");
                                out.push(
                                    g,
                                    false,
                                    self.wc(c.wqe.wr_id, WcStatus::LocProtErr, WcOpcode::Recv, 0),
                                );
                                return Err((
                                    "receive buffer not accessible",
                                    (term::LAYER_DDP, term::DDP_CATASTROPHIC, 0),
                                ));
                            }
                        }
                        done += n;
                    }
                    cur.got += payload.len() as u64;
                }
                if hdr.last {
                    let c = g.cur_recv.take().expect("set above");
                    g.rx_send_msn = g.rx_send_msn.wrapping_add(1);
                    let mut wc =
                        self.wc(c.wqe.wr_id, WcStatus::Success, WcOpcode::Recv, c.got as u32);
                    wc.solicited = matches!(op, Opcode::SendSe | Opcode::SendSeInvalidate);
                    out.push(g, false, wc);
                }
                Ok(())
            }
            (Opcode::ReadRequest, Placement::Untagged { qn: q, msn, .. }) => {
                if q != qn::READ_REQ {
                    return Err((
                        "Read Request on a queue other than 1",
                        (
                            term::LAYER_DDP,
                            term::DDP_UNTAGGED,
                            term::UNTAGGED_INVALID_QN,
                        ),
                    ));
                }
                if msn != g.rx_rreq_msn {
                    return Err((
                        "Read Request: unexpected MSN",
                        (
                            term::LAYER_DDP,
                            term::DDP_UNTAGGED,
                            term::UNTAGGED_MSN_RANGE,
                        ),
                    ));
                }
                let rr = ReadRequest::parse(payload).map_err(|_| {
                    (
                        "Read Request: truncated",
                        (
                            term::LAYER_RDMAP,
                            term::RDMAP_REMOTE_OP,
                            term::OP_CATASTROPHIC_STREAM,
                        ),
                    )
                })?;
                g.rx_rreq_msn = g.rx_rreq_msn.wrapping_add(1);
                let ird = g.conn.as_ref().map_or(0, |c| c.ird) as u32;
                if rr.size == 0 {
                    if g.fence != Fence::None {
                        // The zero-length Read RTR: answered with a zero-length response.
                        g.fence = Fence::None;
                    }
                    g.resp_q.push_back(ReadResp {
                        src: None,
                        len: 0,
                        sink_stag: rr.sink_stag,
                        sink_to: rr.sink_to,
                    });
                    g.inbound_reads += 1;
                    return Ok(());
                }
                if g.fence == Fence::Rtr {
                    return Err((
                        "data before the RTR",
                        (
                            term::LAYER_RDMAP,
                            term::RDMAP_REMOTE_OP,
                            term::OP_UNEXPECTED_OPCODE,
                        ),
                    ));
                }
                if g.inbound_reads >= ird.max(1) && ird != crate::wire::mpa::IRD_ORD_NO_LIMIT as u32
                {
                    // More Reads than our IRD: the peer overran the negotiated queue.
                    return Err((
                        "Read Request beyond IRD",
                        (
                            term::LAYER_DDP,
                            term::DDP_UNTAGGED,
                            term::UNTAGGED_MSN_RANGE,
                        ),
                    ));
                }
                let mr = self.dev.mrs.lookup(rr.src_stag).ok_or((
                    "Read Request: invalid source STag",
                    (term::LAYER_RDMAP, PROT, term::PROT_INVALID_STAG),
                ))?;
                if mr.pd != self.pd {
                    return Err((
                        "Read Request: STag of another PD",
                        (term::LAYER_RDMAP, PROT, term::PROT_STAG_STREAM),
                    ));
                }
                if !mr.access.contains(AccessFlags::REMOTE_READ)
                    || !g.access.contains(AccessFlags::REMOTE_READ)
                {
                    return Err((
                        "Read Request: no remote read access",
                        (term::LAYER_RDMAP, PROT, term::PROT_ACCESS),
                    ));
                }
                let off = mr.offset_of(rr.src_to, rr.size as u64).ok_or((
                    "Read Request: base or bounds violation",
                    (term::LAYER_RDMAP, PROT, term::PROT_BOUNDS),
                ))?;
                g.resp_q.push_back(ReadResp {
                    src: Some((mr, off)),
                    len: rr.size as u64,
                    sink_stag: rr.sink_stag,
                    sink_to: rr.sink_to,
                });
                g.inbound_reads += 1;
                Ok(())
            }
            (Opcode::Terminate, Placement::Untagged { qn: q, msn, .. }) => {
                self.dev.stats.rx_terminates.fetch_add(1, Ordering::Relaxed);
                let _ = (q, msn, g.rx_term_msn);
                let desc = TerminateRepr::parse(payload)
                    .map(|t| t.describe())
                    .unwrap_or_else(|_| "malformed Terminate".into());
                let t = TerminateRepr::parse(payload).ok();
                let read_status = t.map(|t| match (t.layer, t.etype) {
                    (term::LAYER_RDMAP, term::RDMAP_REMOTE_PROT) => WcStatus::RemAccessErr,
                    (term::LAYER_DDP, term::DDP_TAGGED) => WcStatus::RemAccessErr,
                    (term::LAYER_RDMAP, term::RDMAP_REMOTE_OP) => WcStatus::RemOpErr,
                    _ => WcStatus::RemOpErr,
                });
                tracing::debug!(qpn = self.qpn, "Terminate received: {desc}");
                self.fail_locked(
                    g,
                    &format!("peer terminated: {desc}"),
                    None,
                    read_status,
                    out,
                );
                Ok(())
            }
            _ => Err((
                "unexpected RDMAP message",
                (
                    term::LAYER_RDMAP,
                    term::RDMAP_REMOTE_OP,
                    term::OP_UNEXPECTED_OPCODE,
                ),
            )),
        }
    }
}

/// One reusable FPDU buffer of the transmit thread.
struct FrameBuf {
    buf: Vec<u8>,
    len: usize,
}

impl FrameBuf {
    fn new() -> FrameBuf {
        FrameBuf {
            buf: vec![0u8; 70_000],
            len: 0,
        }
    }
    /// Builds `len | hdr | payload (filled by fill) | pad | crc`.
    fn build(
        &mut self,
        hdr: &DdpRepr,
        payload_len: usize,
        crc: bool,
        fill: impl FnOnce(&mut [u8]),
    ) {
        let h = hdr.header_len();
        let ulen = h + payload_len;
        let total = fpdu_len(ulen);
        self.buf[..2].copy_from_slice(&(ulen as u16).to_be_bytes());
        let _ = hdr.emit(&mut self.buf[2..2 + h]);
        fill(&mut self.buf[2 + h..2 + ulen]);
        let body = 2 + ulen + pad_len(ulen);
        self.buf[2 + ulen..body].fill(0);
        let c = if crc { fpdu_crc(&self.buf[..body]) } else { 0 };
        self.buf[body..total].copy_from_slice(&c.to_le_bytes());
        self.len = total;
    }
    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl QpOps for IwQp {
    fn qpn(&self) -> u32 {
        self.shared.qpn
    }
    fn state(&self) -> QpState {
        self.shared.lock().state
    }
    fn cap(&self) -> QpCap {
        self.shared.cap
    }
    fn modify_to_init(&self, attr: &InitAttr) -> Result<()> {
        let mut g = self.shared.lock();
        if !g.state.can_transition(QpState::Init) {
            return Err(VerbsError::InvalidTransition {
                from: g.state,
                to: QpState::Init,
            });
        }
        g.state = QpState::Init;
        g.access = attr.access;
        Ok(())
    }
    fn modify_to_rtr(&self, attr: &RtrAttr) -> Result<()> {
        if !self.shared.dev.config.smc_links {
            return Err(VerbsError::InvalidArgument(
                "iWARP QPs are connected by the connection manager (smc_iwarp::cm), not RTR attributes",
            ));
        }
        crate::smclink::modify_to_rtr(&self.shared, attr)
    }
    fn modify_to_rts(&self, _attr: &RtsAttr) -> Result<()> {
        // SMC-R link mode: modify_to_rtr connected the QP (it is in RTS already).
        let st = self.shared.lock().state;
        if self.shared.dev.config.smc_links && st == QpState::Rts {
            return Ok(());
        }
        Err(VerbsError::InvalidArgument(
            "iWARP QPs are connected by the connection manager (smc_iwarp::cm), not RTS attributes",
        ))
    }
    fn modify_to_err(&self) -> Result<()> {
        self.shared.fail("moved to ERR by the application", None);
        Ok(())
    }
    fn modify_to_reset(&self) -> Result<()> {
        let mut g = self.shared.lock();
        if g.conn.is_some() && g.state != QpState::Err {
            return Err(VerbsError::InvalidTransition {
                from: g.state,
                to: QpState::Reset,
            });
        }
        if g.conn.is_some() {
            // A QP that was bound to a connection stays bound to it (iWARP); reset is only
            // meaningful before connecting.
            return Err(VerbsError::InvalidArgument(
                "an iWARP QP that was connected cannot be reused; create a new one",
            ));
        }
        g.state = QpState::Reset;
        g.rq.clear();
        Ok(())
    }
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        let s = &self.shared;
        let mut g = s.lock();
        if g.state != QpState::Rts && g.state != QpState::Err {
            return Err(VerbsError::InvalidState(g.state));
        }
        // Every posted, not yet completed WR is in `inflight` (queued ones too).
        if g.inflight.len() + wrs.len() > s.cap.max_send_wr as usize {
            return Err(VerbsError::QueueFull);
        }
        for wr in wrs {
            if wr.sg_list.len() > s.cap.max_send_sge as usize {
                return Err(VerbsError::InvalidArgument("too many SGEs"));
            }
            let len: u64 = wr.sg_list.iter().map(|x| x.length as u64).sum();
            if len > u32::MAX as u64 {
                return Err(VerbsError::InvalidArgument("message longer than 4 GiB"));
            }
            match wr.op {
                SendOp::Send | SendOp::RdmaWrite { .. } => {}
                SendOp::RdmaRead { .. } => {
                    if wr.sg_list.len() > 1 || wr.flags.contains(SendFlags::INLINE) {
                        // RFC 5040 §4.4: a Read Request names one data sink STag/TO.
                        return Err(VerbsError::InvalidArgument(
                            "iWARP RDMA Read takes one SGE (one data sink STag)",
                        ));
                    }
                }
                _ => {
                    return Err(VerbsError::InvalidArgument(
                        "iWARP (RFC 5040) has no immediate data or atomics",
                    ))
                }
            }
            if wr.flags.contains(SendFlags::INLINE) && len > s.cap.max_inline_data as u64 {
                return Err(VerbsError::InlineTooLarge {
                    len: len as usize,
                    max: s.cap.max_inline_data as usize,
                });
            }
        }
        for wr in wrs {
            let seq = g.next_seq;
            g.next_seq += 1;
            let len: u64 = wr.sg_list.iter().map(|x| x.length as u64).sum();
            let (kind, opcode) = match wr.op {
                SendOp::Send => (
                    SqKind::Send {
                        se: wr.flags.contains(SendFlags::SOLICITED),
                    },
                    WcOpcode::Send,
                ),
                SendOp::RdmaWrite { remote_addr, rkey } => (
                    SqKind::Write {
                        raddr: remote_addr,
                        rkey,
                    },
                    WcOpcode::RdmaWrite,
                ),
                SendOp::RdmaRead { remote_addr, rkey } => (
                    SqKind::Read {
                        raddr: remote_addr,
                        rkey,
                    },
                    WcOpcode::RdmaRead,
                ),
                _ => unreachable!("checked above"),
            };
            let inline = if wr.flags.contains(SendFlags::INLINE) {
                // INLINE: the data is copied now and lkeys are not checked; it must lie
                // in some registered region of this device (we cannot read arbitrary
                // process memory soundly).
                let mut d = vec![0u8; len as usize];
                let mut at = 0usize;
                for sge in wr.sg_list {
                    let n = sge.length as usize;
                    let mr = s
                        .dev
                        .mrs
                        .lookup(sge.lkey)
                        .and_then(|m| m.offset_of(sge.addr, n as u64).map(|o| (m, o)));
                    match mr {
                        Some((m, o)) => m.fetch(o, &mut d[at..at + n]),
                        None => {
                            return Err(VerbsError::InvalidArgument(
                                "inline data outside a registered region",
                            ))
                        }
                    }
                    at += n;
                }
                Some(d)
            } else {
                None
            };
            g.inflight.push_back(Inflight {
                seq,
                wr_id: wr.wr_id,
                opcode,
                byte_len: if opcode == WcOpcode::RdmaRead {
                    0
                } else {
                    len as u32
                },
                signaled: s.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED),
                internal: false,
                done: None,
            });
            g.sq.push_back(SqWqe {
                seq,
                kind,
                sges: wr.sg_list.to_vec(),
                inline,
                fence: wr.flags.contains(SendFlags::FENCE),
            });
        }
        s.cv.notify_all();
        Ok(())
    }
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let s = &self.shared;
        let mut out = Outbox::default();
        {
            let mut g = s.lock();
            if g.state == QpState::Reset {
                return Err(VerbsError::InvalidState(g.state));
            }
            if g.rq.len() + wrs.len() > s.cap.max_recv_wr as usize {
                return Err(VerbsError::QueueFull);
            }
            if wrs
                .iter()
                .any(|w| w.sg_list.len() > s.cap.max_recv_sge as usize)
            {
                return Err(VerbsError::InvalidArgument("too many SGEs"));
            }
            for w in wrs {
                if g.state == QpState::Err {
                    out.push(
                        &mut g,
                        false,
                        s.wc(w.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0),
                    );
                } else {
                    g.rq.push_back(RqWqe {
                        wr_id: w.wr_id,
                        sges: w.sg_list.to_vec(),
                    });
                }
            }
        }
        s.deliver(out);
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
