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
//!
//! Modules, after Linux siw: [`tx`] is the transmit thread (siw_qp_tx.c),
//! [`rx`] the receive thread (siw_qp_rx.c), [`ops`] posting and state
//! changes (siw_verbs.c's QP verbs); this module holds the QP's state and its
//! completions and errors.

mod ops;
mod rx;
mod tx;

pub(crate) use tx::terminate_stream;

use std::collections::{HashMap, VecDeque};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use smc_verbs::{
    AccessFlags, QpCap, QpInitAttr, QpState, Result, Sge, VerbsError, WcOpcode, WcStatus,
    WorkCompletion,
};

use crate::cq::{CqShared, IwCq};
use crate::device::DevShared;
use crate::mr::MrEntry;
use crate::negotiate::Rtr;
use crate::wire::ddp::term;
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
    /// The table the QP is registered in (until destroyed).
    table: Arc<QpTable>,
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

/// A device's QPs by number (SMC-R link mode: the listener finds the QP an MPA Request
/// names).
#[derive(Default)]
pub(crate) struct QpTable(Mutex<HashMap<u32, Weak<QpShared>>>);

impl QpTable {
    /// The live QP numbered `qpn`.
    pub(crate) fn get(&self, qpn: u32) -> Option<Arc<QpShared>> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&qpn)
            .and_then(Weak::upgrade)
    }
    fn insert(&self, qp: &Arc<QpShared>) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(qp.qpn, Arc::downgrade(qp));
    }
    fn remove(&self, qpn: u32) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&qpn);
    }
}

/// Creates a QP of protection domain `pd` on `dev`, registered in `table`.
pub(crate) fn create(
    dev: &Arc<DevShared>,
    table: &Arc<QpTable>,
    pd: u32,
    attr: &QpInitAttr,
) -> Result<Arc<QpShared>> {
    let cq = |c: &smc_verbs::Cq| -> Result<Arc<CqShared>> {
        c.0.as_any()
            .downcast_ref::<IwCq>()
            .map(|c| c.shared.clone())
            .ok_or(VerbsError::WrongDevice)
    };
    let a = &dev.attr;
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
    if dev.stats.qps_open.load(Ordering::Relaxed) >= a.max_qp as u64 {
        return Err(VerbsError::ResourceExhausted("queue pairs"));
    }
    let shared = Arc::new(QpShared {
        qpn: dev.alloc_qpn(),
        pd,
        dev: dev.clone(),
        table: table.clone(),
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
    dev.stats.qps_open.fetch_add(1, Ordering::Relaxed);
    table.insert(&shared);
    Ok(shared)
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
        self.table.remove(self.qpn);
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
                    let _ = terminate_stream(&mut st, term::MPA_LOCAL_CATASTROPHIC, setup.crc);
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
}
