//! One SMC-R link as the attacker holds it: its own PD, CQ and RC QP on the attacker's
//! software RNIC, receive slots, a staging area for arbitrary SENDs, and a completion
//! handler that logs what the victim sends and answers the LLC requests a live peer must
//! answer (CONFIRM LINK, ADD LINK, TEST LINK, CONFIRM/DELETE RKEY) — each answer can be
//! switched off to play a peer that stops answering.
//!
//! Nothing here checks what the attacker sends: any bytes go out as a SEND, any address
//! and rkey as an RDMA WRITE.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use smc_verbs::{
    AccessFlags, AddressHandle, Cq, Device, InitAttr, Mr, Mtu, Pd, Qp, QpCap, QpInitAttr,
    RdmaBuffer, RecvWr, RtrAttr, RtsAttr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus,
    WorkCompletion,
};
use smc_wire::cdc::CDC_TYPE;
use smc_wire::common::{Gid, Mac, U24};
use smc_wire::llc::{AddLink, ConfirmLink, LlcFormat, LlcMessage};

/// Receive slots (and their size: the largest SMC-Rv2 LLC message).
pub const RECV_SLOTS: u32 = 256;
pub const RECV_SLOT: usize = 8192;
/// Sends in flight at most (each uses one staging slot until it completes).
pub const SEND_SLOTS: u32 = 1024;
/// Largest single SEND the attacker can post (bigger than any receive slot of the victim,
/// to try oversized messages).
pub const STAGE_SLOT: usize = 16384;

const KIND_SHIFT: u32 = 56;
const KIND_RECV: u64 = 1;
const KIND_SEND: u64 = 2;
const KIND_CDC: u64 = 3;
const KIND_WRITE: u64 = 4;

/// The LLC format every link group of the victim uses (Linux layout, x86 byte order).
pub const FMT: LlcFormat = LlcFormat::LINUX_X86;

/// Which LLC requests the completion handler answers on its own.
pub mod answer {
    pub const CONFIRM_LINK: u32 = 1;
    pub const ADD_LINK_REJECT: u32 = 2;
    pub const TEST_LINK: u32 = 4;
    pub const CONFIRM_RKEY: u32 = 8;
    pub const DELETE_RKEY: u32 = 16;
    pub const DELETE_LINK: u32 = 32;
    /// What a live, well-behaved single-link peer answers.
    pub const ALL: u32 = 63;
}

/// Something the victim sent on the link.
#[derive(Clone, Debug)]
pub enum Rx {
    Cdc([u8; 44]),
    Llc(Vec<u8>),
}

impl Rx {
    /// LLC type byte (CDC: 0xFE).
    pub fn type_byte(&self) -> u8 {
        match self {
            Rx::Cdc(_) => CDC_TYPE,
            Rx::Llc(b) => b.first().copied().unwrap_or(0),
        }
    }
    /// LLC response flag.
    pub fn is_response(&self) -> bool {
        matches!(self, Rx::Llc(b) if b.len() > 3 && b[3] & 0x80 != 0)
    }
}

/// The victim's side of the link.
#[derive(Clone, Copy, Debug)]
pub struct PeerQp {
    pub gid: Gid,
    pub mac: Mac,
    pub qpn: u32,
    pub psn: u32,
    pub mtu: Mtu,
}

/// Hooks a connection's data path installs (see `peer::DataPath`).
pub trait CdcSink: Send + Sync {
    /// A CDC arrived.
    fn on_cdc(&self, bytes: &[u8; 44]);
    /// A CDC posted with [`RawLink::post_transmit`] completed.
    fn on_cdc_sent(&self, seq: u16, ok: bool);
}

#[derive(Default)]
struct Log {
    rx: VecDeque<Rx>,
    dropped: u64,
}

/// Counters of one link.
#[derive(Default, Debug)]
pub struct LinkCounters {
    pub cdcs_in: AtomicU64,
    pub llcs_in: AtomicU64,
    pub sends_ok: AtomicU64,
    pub answers_sent: AtomicU64,
    pub answers_dropped: AtomicU64,
    pub send_errors: AtomicU64,
    pub recv_errors: AtomicU64,
}

/// Largest log kept (a flood's answers beyond it are only counted).
const LOG_MAX: usize = 8192;

pub struct RawLink {
    pub dev: Device,
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
    /// Our first send PSN.
    pub psn: u32,
    recv_buf: Arc<RdmaBuffer>,
    recv_mr: Mr,
    stage_buf: Arc<RdmaBuffer>,
    stage_mr: Mr,
    stage_next: AtomicUsize,
    outstanding: AtomicU32,
    /// Packets put on the wire by our requester so far (for PSN prediction).
    packets: AtomicU32,
    path_mtu: AtomicUsize,
    pub peer: Mutex<Option<PeerQp>>,
    /// The link number the victim gave link 1 (from its CONFIRM LINK).
    pub link_num: AtomicU32,
    /// The link group speaks SMC-Rv2 (seen in the victim's CONFIRM LINK).
    pub v2: AtomicBool,
    answers: AtomicU32,
    hold_recv: AtomicBool,
    held: Mutex<Vec<u32>>,
    log: Mutex<Log>,
    cond: Condvar,
    sink: Mutex<Option<Weak<dyn CdcSink>>>,
    /// A send or receive completed with an error (the victim broke the link, or we did).
    pub failed: AtomicBool,
    pub counters: LinkCounters,
    handler_lock: Mutex<()>,
}

impl std::fmt::Debug for RawLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawLink")
            .field("qpn", &self.qp.qpn())
            .field("psn", &self.psn)
            .finish()
    }
}

impl RawLink {
    /// PD, CQ and a QP in INIT with every receive slot posted.
    pub fn new(dev: &Device) -> Arc<RawLink> {
        let pd = dev.alloc_pd().expect("attacker PD");
        let cq = dev
            .create_cq(SEND_SLOTS + RECV_SLOTS + 64)
            .expect("attacker CQ");
        let qp = pd
            .create_qp(&QpInitAttr {
                send_cq: cq.clone(),
                recv_cq: cq.clone(),
                cap: QpCap {
                    max_send_wr: SEND_SLOTS + 16,
                    max_recv_wr: RECV_SLOTS,
                    max_send_sge: 2,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: true,
            })
            .expect("attacker QP");
        qp.modify_to_init(&InitAttr {
            port_num: 1,
            pkey_index: 0,
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        })
        .expect("QP to INIT");
        let recv_buf = RdmaBuffer::new(RECV_SLOT * RECV_SLOTS as usize).unwrap();
        let recv_mr = pd.reg_mr(&recv_buf, AccessFlags::LOCAL_WRITE).unwrap();
        let stage_buf = RdmaBuffer::new(STAGE_SLOT * SEND_SLOTS as usize).unwrap();
        let stage_mr = pd.reg_mr(&stage_buf, AccessFlags::LOCAL_WRITE).unwrap();
        let link = Arc::new(RawLink {
            dev: dev.clone(),
            pd,
            cq,
            qp,
            psn: rand::random::<u32>() & smc_verbs::PSN_MASK,
            recv_buf,
            recv_mr,
            stage_buf,
            stage_mr,
            stage_next: AtomicUsize::new(0),
            outstanding: AtomicU32::new(0),
            packets: AtomicU32::new(0),
            path_mtu: AtomicUsize::new(1024),
            peer: Mutex::new(None),
            link_num: AtomicU32::new(1),
            v2: AtomicBool::new(false),
            answers: AtomicU32::new(answer::ALL),
            hold_recv: AtomicBool::new(false),
            held: Mutex::new(Vec::new()),
            log: Mutex::new(Log::default()),
            cond: Condvar::new(),
            sink: Mutex::new(None),
            failed: AtomicBool::new(false),
            counters: LinkCounters::default(),
            handler_lock: Mutex::new(()),
        });
        for slot in 0..RECV_SLOTS {
            link.post_recv(slot);
        }
        let weak = Arc::downgrade(&link);
        link.cq.set_handler(Some(Arc::new(move || {
            if let Some(l) = weak.upgrade() {
                l.on_cq_event();
            }
        })));
        link.cq.req_notify(false);
        link
    }

    /// INIT → RTR → RTS towards the victim's QP.
    pub fn connect(&self, peer: PeerQp) {
        let mtu = peer.mtu.min(self.dev.attr().active_mtu);
        let mut ah = AddressHandle::to_gid(smc_verbs::Gid(peer.gid.0));
        ah.dmac = Some(smc_verbs::Mac(peer.mac.0));
        self.qp
            .modify_to_rtr(&RtrAttr {
                path_mtu: mtu,
                dest_qpn: peer.qpn,
                rq_psn: peer.psn,
                ah,
                max_dest_rd_atomic: 1,
                min_rnr_timer: 12,
            })
            .expect("QP to RTR");
        self.qp
            .modify_to_rts(&RtsAttr {
                sq_psn: self.psn,
                timeout: 14,
                ..RtsAttr::default()
            })
            .expect("QP to RTS");
        self.path_mtu.store(mtu.bytes(), Ordering::SeqCst);
        *self.peer.lock().unwrap() = Some(peer);
    }

    pub fn gid(&self) -> Gid {
        Gid(self.dev.gid().0)
    }
    pub fn mac(&self) -> Mac {
        Mac(self.dev.mac().0)
    }
    pub fn mtu(&self) -> Mtu {
        self.dev.attr().active_mtu
    }

    /// Which requests are answered ([`answer`] bits).
    pub fn set_answers(&self, bits: u32) {
        self.answers.store(bits, Ordering::SeqCst);
    }

    /// Stop (or resume) re-posting receive buffers: the victim's SENDs then meet RNR NAKs.
    pub fn hold_receives(&self, on: bool) {
        self.hold_recv.store(on, Ordering::SeqCst);
        if !on {
            let held = std::mem::take(&mut *self.held.lock().unwrap());
            for s in held {
                self.post_recv(s);
            }
        }
    }

    /// Goes silent: the QP moves to ERR, so nothing is sent or acknowledged any more.
    pub fn go_silent(&self) {
        self.set_answers(0);
        let _ = self.qp.modify_to_err();
    }

    pub fn set_sink(&self, sink: Weak<dyn CdcSink>) {
        *self.sink.lock().unwrap() = Some(sink);
    }

    fn post_recv(&self, slot: u32) {
        let sge = [self
            .recv_mr
            .sge(slot as usize * RECV_SLOT, RECV_SLOT as u32)];
        let _ = self.qp.post_recv(&RecvWr {
            wr_id: (KIND_RECV << KIND_SHIFT) | u64::from(slot),
            sg_list: &sge,
        });
    }

    fn packets_of(&self, len: usize) -> u32 {
        let mtu = self.path_mtu.load(Ordering::SeqCst).max(256);
        len.div_ceil(mtu).max(1) as u32
    }

    /// The PSN our next request packet will carry (valid once everything posted so far
    /// has been put on the wire; see [`Self::quiesce`]).
    pub fn next_psn(&self) -> u32 {
        smc_verbs::psn_add(self.psn, self.packets.load(Ordering::SeqCst))
    }

    /// Waits until every posted send completed.
    pub fn quiesce(&self, t: Duration) -> bool {
        let end = Instant::now() + t;
        while self.outstanding.load(Ordering::SeqCst) > 0 {
            if Instant::now() > end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    /// Takes a send slot, waiting up to `wait` for one.
    fn reserve(&self, wait: Option<Duration>) -> bool {
        let end = wait.map(|w| Instant::now() + w);
        loop {
            let cur = self.outstanding.load(Ordering::SeqCst);
            if cur < SEND_SLOTS
                && self
                    .outstanding
                    .compare_exchange(cur, cur + 1, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                return true;
            }
            if cur >= SEND_SLOTS {
                match end {
                    Some(e) if Instant::now() < e => std::thread::sleep(Duration::from_micros(50)),
                    _ => return false,
                }
            }
        }
    }

    fn stage(&self, bytes: &[u8]) -> Sge {
        assert!(
            bytes.len() <= STAGE_SLOT,
            "message too large for a stage slot"
        );
        let slot = self.stage_next.fetch_add(1, Ordering::SeqCst) % SEND_SLOTS as usize;
        self.stage_buf.write(slot * STAGE_SLOT, bytes);
        self.stage_mr.sge(slot * STAGE_SLOT, bytes.len() as u32)
    }

    fn post(&self, wr: &SendWr<'_>, len: usize) -> Result<(), smc_verbs::VerbsError> {
        let r = self.qp.post_send(wr);
        match r {
            Ok(()) => {
                self.packets
                    .fetch_add(self.packets_of(len), Ordering::SeqCst);
            }
            Err(_) => {
                self.outstanding.fetch_sub(1, Ordering::SeqCst);
            }
        }
        r
    }

    /// Posts `bytes` as one SEND (blocking while every send slot is in use, up to 5 s).
    pub fn send(&self, bytes: &[u8]) -> Result<(), smc_verbs::VerbsError> {
        if !self.reserve(Some(Duration::from_secs(5))) {
            return Err(smc_verbs::VerbsError::QueueFull);
        }
        let sge = [self.stage(bytes)];
        self.post(
            &SendWr {
                wr_id: KIND_SEND << KIND_SHIFT,
                op: SendOp::Send,
                sg_list: &sge,
                flags: SendFlags::SIGNALED,
            },
            bytes.len(),
        )
    }

    /// Like [`Self::send`] but gives up at once when no send slot is free (floods).
    pub fn try_send(&self, bytes: &[u8]) -> bool {
        if !self.reserve(None) {
            return false;
        }
        let sge = [self.stage(bytes)];
        self.post(
            &SendWr {
                wr_id: KIND_SEND << KIND_SHIFT,
                op: SendOp::Send,
                sg_list: &sge,
                flags: SendFlags::SIGNALED,
            },
            bytes.len(),
        )
        .is_ok()
    }

    /// Posts an LLC message.
    pub fn send_llc(&self, m: &LlcMessage<'_>) -> Result<(), smc_verbs::VerbsError> {
        let mut b = vec![0u8; m.buffer_len()];
        m.emit(&mut b, FMT).expect("LLC encodes");
        self.send(&b)
    }

    /// RDMA WRITE of `data` to any address with any rkey.
    pub fn rdma_write(
        &self,
        remote_addr: u64,
        rkey: u32,
        data: &[u8],
    ) -> Result<(), smc_verbs::VerbsError> {
        if !self.reserve(Some(Duration::from_secs(5))) {
            return Err(smc_verbs::VerbsError::QueueFull);
        }
        let sge = [self.stage(data)];
        self.post(
            &SendWr {
                wr_id: KIND_WRITE << KIND_SHIFT,
                op: SendOp::RdmaWrite { remote_addr, rkey },
                sg_list: &sge,
                flags: SendFlags::SIGNALED,
            },
            data.len(),
        )
    }

    /// The data path's transmit: RDMA WRITEs from `src` (registered on our PD) and the CDC.
    pub fn post_transmit(
        &self,
        writes: &[(u64, Sge)],
        rkey: u32,
        cdc: &[u8; 44],
        seq: u16,
    ) -> Result<(), smc_verbs::VerbsError> {
        for (remote_addr, sge) in writes {
            if !self.reserve(Some(Duration::from_secs(5))) {
                return Err(smc_verbs::VerbsError::QueueFull);
            }
            self.post(
                &SendWr {
                    wr_id: KIND_WRITE << KIND_SHIFT,
                    op: SendOp::RdmaWrite {
                        remote_addr: *remote_addr,
                        rkey,
                    },
                    sg_list: std::slice::from_ref(sge),
                    flags: SendFlags::SIGNALED,
                },
                sge.length as usize,
            )?;
        }
        if !self.reserve(Some(Duration::from_secs(5))) {
            return Err(smc_verbs::VerbsError::QueueFull);
        }
        let sge = [self.stage(cdc)];
        self.post(
            &SendWr {
                wr_id: (KIND_CDC << KIND_SHIFT) | u64::from(seq),
                op: SendOp::Send,
                sg_list: &sge,
                flags: SendFlags::SIGNALED,
            },
            44,
        )
    }

    // -----------------------------------------------------------------------------------
    // What the victim sent

    /// Waits for the first logged message matching `f` and takes it out of the log.
    pub fn wait_rx(&self, t: Duration, mut f: impl FnMut(&Rx) -> bool) -> Option<Rx> {
        let end = Instant::now() + t;
        let mut log = self.log.lock().unwrap();
        loop {
            if let Some(i) = log.rx.iter().position(&mut f) {
                return log.rx.remove(i);
            }
            let now = Instant::now();
            if now >= end {
                return None;
            }
            log = self.cond.wait_timeout(log, end - now).unwrap().0;
        }
    }

    /// Waits for an LLC message with this type byte (request or response as asked).
    pub fn wait_llc(&self, t: Duration, ty: u8, response: bool) -> Option<Vec<u8>> {
        match self.wait_rx(t, |r| {
            matches!(r, Rx::Llc(_)) && r.type_byte() == ty && r.is_response() == response
        }) {
            Some(Rx::Llc(b)) => Some(b),
            _ => None,
        }
    }

    /// Everything logged so far, removed from the log.
    pub fn drain_log(&self) -> Vec<Rx> {
        self.log.lock().unwrap().rx.drain(..).collect()
    }

    fn log(&self, rx: Rx) {
        let mut log = self.log.lock().unwrap();
        if log.rx.len() >= LOG_MAX {
            log.rx.pop_front();
            log.dropped += 1;
        }
        log.rx.push_back(rx);
        drop(log);
        self.cond.notify_all();
    }

    // -----------------------------------------------------------------------------------
    // Completion handler (the RNIC's thread)

    fn on_cq_event(self: &Arc<Self>) {
        let Ok(_g) = self.handler_lock.lock() else {
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
                    self.on_completion(wc);
                }
            }
            self.cq.req_notify(false);
            if self.cq.pending() == 0 {
                break;
            }
        }
    }

    fn on_completion(self: &Arc<Self>, wc: &WorkCompletion) {
        let kind = wc.wr_id >> KIND_SHIFT;
        if kind == KIND_RECV {
            self.on_recv(wc);
            return;
        }
        self.outstanding.fetch_sub(1, Ordering::SeqCst);
        let ok = wc.status == WcStatus::Success;
        if ok {
            self.counters.sends_ok.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters.send_errors.fetch_add(1, Ordering::Relaxed);
            self.failed.store(true, Ordering::SeqCst);
            self.cond.notify_all();
        }
        if kind == KIND_CDC {
            if let Some(s) = self.sink() {
                s.on_cdc_sent((wc.wr_id & 0xFFFF) as u16, ok);
            }
        }
    }

    fn sink(&self) -> Option<Arc<dyn CdcSink>> {
        self.sink.lock().unwrap().as_ref().and_then(|w| w.upgrade())
    }

    fn on_recv(self: &Arc<Self>, wc: &WorkCompletion) {
        let slot = (wc.wr_id & 0xFFFF_FFFF) as u32;
        if wc.status != WcStatus::Success {
            if wc.status != WcStatus::WrFlushErr {
                self.counters.recv_errors.fetch_add(1, Ordering::Relaxed);
            }
            self.failed.store(true, Ordering::SeqCst);
            self.cond.notify_all();
            return;
        }
        let len = (wc.byte_len as usize).min(RECV_SLOT);
        let mut b = vec![0u8; len];
        self.recv_buf.read(slot as usize * RECV_SLOT, &mut b);
        if self.hold_recv.load(Ordering::SeqCst) {
            self.held.lock().unwrap().push(slot);
        } else {
            self.post_recv(slot);
        }
        if wc.opcode != WcOpcode::Recv || b.is_empty() {
            return;
        }
        if b[0] == CDC_TYPE && b.len() >= 44 {
            self.counters.cdcs_in.fetch_add(1, Ordering::Relaxed);
            let mut c = [0u8; 44];
            c.copy_from_slice(&b[..44]);
            if let Some(s) = self.sink() {
                s.on_cdc(&c);
            }
            self.log(Rx::Cdc(c));
            return;
        }
        self.counters.llcs_in.fetch_add(1, Ordering::Relaxed);
        self.auto_answer(&b);
        self.log(Rx::Llc(b));
    }

    /// Answers what a live peer must answer, as far as switched on.
    fn auto_answer(&self, b: &[u8]) {
        let bits = self.answers.load(Ordering::SeqCst);
        if bits == 0 {
            return;
        }
        let Ok(m) = LlcMessage::parse(b, FMT) else {
            return;
        };
        if m.is_response() {
            return;
        }
        let reply: Option<LlcMessage<'_>> = match m {
            LlcMessage::TestLink(mut t) if bits & answer::TEST_LINK != 0 => {
                t.response = true;
                Some(LlcMessage::TestLink(t))
            }
            LlcMessage::ConfirmLink(c) if bits & answer::CONFIRM_LINK != 0 => {
                self.link_num.store(u32::from(c.link_num), Ordering::SeqCst);
                self.v2.store(c.v2, Ordering::SeqCst);
                Some(LlcMessage::ConfirmLink(ConfirmLink {
                    v2: c.v2,
                    response: true,
                    no_rmbe_eyecatcher: true,
                    mac: self.mac(),
                    gid: self.gid(),
                    qpn: U24::wrapping(self.qp.qpn()),
                    link_num: c.link_num,
                    link_uid: 0x00AA_0000 | u32::from(c.link_num),
                    max_links: c.max_links,
                    max_conns: c.max_conns,
                }))
            }
            LlcMessage::AddLink(a) if bits & answer::ADD_LINK_REJECT != 0 => {
                Some(LlcMessage::AddLink(AddLink {
                    response: true,
                    reject: true,
                    reject_reason: if a.v2 { 0 } else { 1 },
                    ext: None,
                    ..a
                }))
            }
            LlcMessage::ConfirmRkey(mut r) if bits & answer::CONFIRM_RKEY != 0 => {
                r.response = true;
                Some(LlcMessage::ConfirmRkey(r))
            }
            LlcMessage::DeleteRkey(mut r) if bits & answer::DELETE_RKEY != 0 => {
                r.response = true;
                Some(LlcMessage::DeleteRkey(r))
            }
            LlcMessage::DeleteLink(mut d) if bits & answer::DELETE_LINK != 0 => {
                d.response = true;
                Some(LlcMessage::DeleteLink(d))
            }
            _ => None,
        };
        if let Some(r) = reply {
            let mut out = vec![0u8; r.buffer_len()];
            if r.emit(&mut out, FMT).is_ok() && self.try_send(&out) {
                self.counters.answers_sent.fetch_add(1, Ordering::Relaxed);
            } else {
                self.counters
                    .answers_dropped
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for RawLink {
    fn drop(&mut self) {
        self.cq.set_handler(None);
        let _ = self.qp.modify_to_err();
    }
}
