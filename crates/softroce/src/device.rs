//! A device: one UDP socket bound to `local_ip:4791`, its QPN and key
//! tables, and the progress engine thread that receives packets (recvmmsg),
//! demultiplexes them by destination QPN and runs QP timers. Application
//! threads transmit directly (sendmmsg) under their QP's lock.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use smc_verbs::{CqOps, DeviceAttr, DeviceOps, Gid, Mac, Mtu, PdOps, Result, VerbsError};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::config::Config;
use crate::cq::{CqShared, SoftCq};
use crate::fault::{Fate, FaultState};
use crate::icrc::{self, IpInfo, IPV4_DF};
use crate::mr::{MrTable, SoftPd};
use crate::qp::QpShared;
use crate::wire::{PacketRepr, ICRC_LEN};

/// Largest UDP payload we build: 4096 payload + BTH + RETH + ImmDt + ICRC,
/// rounded up.
pub(crate) const SLOT: usize = 4096 + 128;
/// Packets per sendmmsg/recvmmsg call.
pub(crate) const BATCH: usize = 32;
/// Longest the engine sleeps when nothing is scheduled.
const IDLE_WAIT: Duration = Duration::from_millis(20);
/// While a thread blocked in [`crate::cq`]'s wait receives for the device
/// (and for this long after the last one left) the engine leaves the socket
/// to it and sleeps at most this long between looks at the socket.
const DRIVER_LINGER: Duration = Duration::from_millis(1);

thread_local! {
    /// Per-thread transmit batch (allocated once per thread).
    pub(crate) static TX: RefCell<TxBatch> = RefCell::new(TxBatch::new());
    static IS_ENGINE: Cell<bool> = const { Cell::new(false) };
    /// Set while a thread is inside `DeviceOps::drive`.
    static DRIVING: Cell<bool> = const { Cell::new(false) };
}

/// True on a device's engine thread.
pub(crate) fn on_engine_thread() -> bool {
    IS_ENGINE.with(|c| c.get())
}

/// True where completion handlers may run directly: the engine thread, or
/// a thread inside `DeviceOps::drive` (which the caller entered holding no
/// lock a handler takes).
pub(crate) fn runs_handlers() -> bool {
    on_engine_thread() || DRIVING.with(|c| c.get())
}

/// Device counters.
#[derive(Default, Debug)]
pub struct Stats {
    /// Packets sent (after fault injection).
    pub tx_packets: AtomicU64,
    /// Packets received and handed to their QP (from its peer).
    pub rx_packets: AtomicU64,
    /// Packets dropped because they did not parse.
    pub rx_malformed: AtomicU64,
    /// Packets dropped because their ICRC did not verify (CHECKLIST §C.2).
    pub rx_bad_icrc: AtomicU64,
    /// Packets whose ICRC verified only with a non-zero IPv4 ID recovered
    /// from the CRC (e.g. from Linux rxe).
    pub rx_icrc_id_recovered: AtomicU64,
    /// Packets for unknown QPs.
    pub rx_unknown_qp: AtomicU64,
    /// Packets for a QP from an address other than its connected peer's
    /// (or for a QP not connected yet): forged or stray, dropped unprocessed
    /// (a RoCEv2 source GID is the source address; the source port is free).
    pub rx_foreign: AtomicU64,
    /// Packets the fault injector dropped.
    pub fault_dropped: AtomicU64,
    /// sendmmsg failures (packets lost locally).
    pub tx_errors: AtomicU64,
    /// Packets received by application threads waiting in `Cq::wait`
    /// (the rest the engine thread received).
    pub rx_by_waiters: AtomicU64,
    /// QPs that could not get a socket (and UDP source port) of their own
    /// and send from the device's socket instead.
    pub qp_socket_errors: AtomicU64,
}

/// A batch of outgoing packets.
pub(crate) struct TxBatch {
    bufs: Box<[[u8; SLOT]]>,
    lens: [usize; BATCH],
    dsts: Vec<Option<SockAddr>>,
    /// The socket each packet leaves by (its QP's, see [`QpSocket`]).
    fds: [RawFd; BATCH],
    n: usize,
}

/// Where one packet goes: destination, IP header fields for the ICRC,
/// source and destination UDP ports, and the socket that sends it.
pub(crate) type TxPath<'a> = (&'a SockAddr, &'a IpInfo, u16, u16, RawFd);

impl TxBatch {
    fn new() -> TxBatch {
        TxBatch {
            bufs: vec![[0u8; SLOT]; BATCH].into_boxed_slice(),
            lens: [0; BATCH],
            dsts: (0..BATCH).map(|_| None).collect(),
            fds: [-1; BATCH],
            n: 0,
        }
    }

    fn next_slot(&mut self, dev: &DevShared) -> usize {
        if self.n == BATCH {
            self.flush(dev);
        }
        self.n
    }

    fn commit(&mut self, i: usize, len: usize, dst: &SockAddr, fd: RawFd) {
        self.lens[i] = len;
        self.fds[i] = fd;
        match &mut self.dsts[i] {
            Some(d) if d == dst => {}
            d => *d = Some(dst.clone()),
        }
        self.n = i + 1;
    }

    /// Queues a copy of an already built packet.
    pub(crate) fn push_raw(&mut self, pkt: &[u8], dst: &SockAddr, fd: RawFd, dev: &DevShared) {
        if pkt.len() > SLOT {
            return;
        }
        let i = self.next_slot(dev);
        self.bufs[i][..pkt.len()].copy_from_slice(pkt);
        self.commit(i, pkt.len(), dst, fd);
    }

    /// Builds one packet in place: headers from `repr`, `payload_len`
    /// payload bytes written by `fill`, zero pad, ICRC; then applies the
    /// fault injector. When `fill` returns false (the payload's memory was
    /// deregistered) nothing is queued and the result is false.
    pub(crate) fn packet(
        &mut self,
        dev: &DevShared,
        (dst, ip, sport, dport, fd): TxPath<'_>,
        fault: &mut Option<FaultState>,
        repr: &PacketRepr,
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> bool {
        let mut repr = *repr;
        let pad = crate::wire::pad_for(payload_len);
        repr.bth.pad_count = pad as u8;
        let total = repr.buffer_len(payload_len);
        if total > SLOT {
            tracing::error!(total, "packet larger than a transmit slot");
            return true;
        }
        let i = self.next_slot(dev);
        let buf = &mut self.bufs[i][..total];
        let Ok(off) = repr.emit(buf) else {
            return true;
        };
        if !fill(&mut buf[off..off + payload_len]) {
            return false;
        }
        buf[off + payload_len..total - ICRC_LEN].fill(0);
        icrc::fill(ip, sport, dport, buf);
        let fate = fault.as_mut().map(|f| f.decide()).unwrap_or(Fate::Send);
        match fate {
            Fate::Send => {
                self.commit(i, total, dst, fd);
                if let Some(held) = fault.as_mut().and_then(|f| f.held.take()) {
                    self.push_raw(&held, dst, fd, dev);
                }
            }
            Fate::Drop => {
                dev.stats.fault_dropped.fetch_add(1, Ordering::Relaxed);
            }
            Fate::Duplicate => {
                self.commit(i, total, dst, fd);
                let copy: Vec<u8> = self.bufs[i][..total].to_vec();
                self.push_raw(&copy, dst, fd, dev);
            }
            Fate::Hold => {
                if let Some(f) = fault.as_mut() {
                    f.held = Some(self.bufs[i][..total].to_vec());
                }
            }
        }
        true
    }

    /// Sends everything queued.
    pub(crate) fn flush(&mut self, dev: &DevShared) {
        let mut start = 0;
        while start < self.n {
            let mut iov: [libc::iovec; BATCH] = [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; BATCH];
            // SAFETY: mmsghdr is plain old data; all-zero is a valid value.
            let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
            let mut cmsgs = [[0u64; 4]; BATCH];
            let mut firsts = [0usize; BATCH];
            // One message per packet, or with UDP GSO one message per run of
            // equal-sized packets to the same peer (the last may be shorter).
            let mut m = 0;
            let mut i = start;
            // One sendmmsg per socket: packets of one QP leave by its own
            // socket (a batch normally holds one QP's packets).
            let fd = self.fds[start];
            while i < self.n && self.fds[i] == fd {
                let Some(dst) = self.dsts[i].as_ref() else {
                    i += 1;
                    continue;
                };
                let seg = self.lens[i];
                let mut j = i + 1;
                if dev.gso {
                    while j < self.n
                        && j - i < GSO_MAX_SEGS
                        && self.fds[j] == fd
                        && self.dsts[j].as_ref() == Some(dst)
                        && self.lens[j] <= seg
                        && (j - i + 1) * seg <= GSO_MAX_BYTES
                    {
                        let shorter = self.lens[j] < seg;
                        j += 1;
                        if shorter {
                            break;
                        }
                    }
                }
                for (k, idx) in (i..j).enumerate() {
                    if k > 0 {
                        // The kernel numbers GSO segments' IPv4 IDs from 0.
                        patch_icrc(&mut self.bufs[idx][..self.lens[idx]], k as u16);
                    }
                    iov[idx].iov_base = self.bufs[idx].as_mut_ptr() as *mut libc::c_void;
                    iov[idx].iov_len = self.lens[idx];
                }
                let h = &mut hdrs[m].msg_hdr;
                h.msg_name = dst.as_ptr() as *mut libc::c_void;
                h.msg_namelen = dst.len();
                h.msg_iov = &mut iov[i];
                h.msg_iovlen = j - i;
                if j - i > 1 {
                    let buf = &mut cmsgs[m];
                    h.msg_control = buf.as_mut_ptr() as *mut libc::c_void;
                    // SAFETY: CMSG_SPACE of a u16 (24 bytes) fits the 32-byte,
                    // 8-aligned buffer, so CMSG_FIRSTHDR is non-null; the
                    // header is written through the libc macros into it.
                    unsafe {
                        h.msg_controllen = libc::CMSG_SPACE(2) as usize;
                        let c = libc::CMSG_FIRSTHDR(h);
                        (*c).cmsg_level = SOL_UDP;
                        (*c).cmsg_type = UDP_SEGMENT;
                        (*c).cmsg_len = libc::CMSG_LEN(2) as usize;
                        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, seg as u16);
                    }
                }
                firsts[m] = j;
                m += 1;
                i = j;
            }
            if m == 0 {
                if i > start && i < self.n {
                    // Only unaddressed slots for this socket: next socket.
                    start = i;
                    continue;
                }
                break;
            }
            // SAFETY: `hdrs[..m]` point at live buffers, iovecs, control
            // buffers and socket addresses owned by `self`/this frame. `fd`
            // is the sending socket of the QP whose `run` queued these
            // packets (or the device's); `run` flushes before it returns,
            // while it borrows that QP, which owns the socket.
            let r = unsafe { libc::sendmmsg(fd, hdrs.as_mut_ptr(), m as u32, 0) };
            let sent = if r <= 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    // UDP: the message is lost; RC retransmission recovers.
                    dev.stats.tx_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::trace!(error = %e, "sendmmsg failed");
                    1
                } else {
                    0
                }
            } else {
                r as usize
            };
            let upto = if sent == 0 { start } else { firsts[sent - 1] };
            if r > 0 {
                dev.stats
                    .tx_packets
                    .fetch_add((upto - start) as u64, Ordering::Relaxed);
            }
            // Undo the ID patches of messages not sent (they are regrouped,
            // identically, on the next pass).
            let mut g = upto;
            for &end in &firsts[sent..m] {
                for (k, idx) in (g..end).enumerate() {
                    if k > 0 {
                        patch_icrc(&mut self.bufs[idx][..self.lens[idx]], k as u16);
                    }
                }
                g = end;
            }
            start = upto;
        }
        self.n = 0;
    }
}

const SOL_UDP: i32 = 17;
const UDP_SEGMENT: i32 = 103;
const UDP_GRO: i32 = 104;
/// Linux UDP_MAX_SEGMENTS is 64 (128 on newer kernels); 15 segments of
/// 4112 bytes stay below the 64 KiB datagram limit.
const GSO_MAX_SEGS: usize = 64;
const GSO_MAX_BYTES: usize = 65_000;

/// Rewrites the ICRC of a packet (computed for IPv4 ID 0) for ID `id`.
fn patch_icrc(pkt: &mut [u8], id: u16) {
    let n = pkt.len();
    if n < 4 {
        return;
    }
    let old = u32::from_le_bytes([pkt[n - 4], pkt[n - 3], pkt[n - 2], pkt[n - 1]]);
    let new = old ^ icrc::ipv4_id_delta(n, id);
    pkt[n - 4..].copy_from_slice(&new.to_le_bytes());
}

/// Engine-visible device state.
pub(crate) struct DevShared {
    pub(crate) attr: DeviceAttr,
    pub(crate) config: Config,
    pub(crate) local_port: u16,
    pub(crate) peer_port: u16,
    pub(crate) sock: Socket,
    pub(crate) mrs: MrTable,
    /// Send runs of equal-sized packets with UDP GSO (IPv4 only).
    gso: bool,
    qps: RwLock<HashMap<u32, Arc<QpShared>>>,
    next_qpn: AtomicU32,
    next_pd: AtomicU32,
    epoch: Instant,
    /// When the engine will next wake by itself (ns since epoch).
    engine_wake_ns: AtomicU64,
    wake_fd: OwnedFd,
    shutdown: AtomicBool,
    running: AtomicBool,
    deferred: Mutex<Vec<Arc<CqShared>>>,
    /// The receive path's buffers: whoever holds the lock (the engine or a
    /// thread waiting for a completion) reads the socket.
    rx: Mutex<RxState>,
    /// Threads blocked in a CQ wait that receive for the device themselves.
    drivers: AtomicU32,
    /// When the last such thread left (ns since epoch).
    driver_left_ns: AtomicU64,
    pub(crate) stats: Stats,
}

impl DevShared {
    pub(crate) fn ns_since_epoch(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a valid u64 to our eventfd.
        unsafe {
            libc::write(
                self.wake_fd.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
    }

    /// Wakes the engine if a new timer deadline (or work) needs it before
    /// its own planned wake-up. Called after every QP operation, so it must
    /// rarely cost a wake-up: a timer may fire up to its own duration late
    /// (IBA timers are minimums), which spares the engine one wake-up per
    /// posted message.
    pub(crate) fn wake_if_later(&self, deadline_ns: u64, work: bool) {
        if on_engine_thread() {
            return;
        }
        let planned = self.engine_wake_ns.load(Ordering::Acquire);
        if work {
            self.wake();
            return;
        }
        if deadline_ns == 0 || planned == 0 {
            return; // no timer, or the engine is awake and will look
        }
        let now = self.ns_since_epoch(Instant::now());
        let slack = deadline_ns.saturating_sub(now);
        if planned > deadline_ns.saturating_add(slack) {
            self.wake();
        }
    }

    /// Registers a thread that will wait for completions by reading the
    /// socket itself: a message then costs one wake-up (that thread's)
    /// instead of two (the engine's, then the waiter's). Dropping the guard
    /// unregisters it.
    pub(crate) fn enter_driver(self: &Arc<Self>) -> DriverGuard {
        self.drivers.fetch_add(1, Ordering::SeqCst);
        DriverGuard { dev: self.clone() }
    }

    /// Receives and processes everything queued on the socket (non-blocking).
    pub(crate) fn drain_rx(&self) {
        let mut g = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        let RxState { batch: rx, touched } = &mut *g;
        let waiter = !on_engine_thread();
        loop {
            let n = recv_batch(self, rx);
            if waiter && n.len > 0 {
                self.stats
                    .rx_by_waiters
                    .fetch_add(n.len as u64, Ordering::Relaxed);
            }
            for i in 0..n.len {
                let Some((src, sport)) = sockaddr_ip(&rx.addrs[i]) else {
                    continue;
                };
                let dgram = &rx.bufs[i * rx.slot..i * rx.slot + n.lens[i]];
                // With UDP GRO a datagram holds several packets of `seg`
                // bytes (the last may be shorter).
                let seg = if n.segs[i] == 0 {
                    dgram.len().max(1)
                } else {
                    n.segs[i]
                };
                for pkt in dgram.chunks(seg) {
                    handle_packet(self, pkt, src, sport, touched);
                }
            }
            for qp in touched.drain(..) {
                qp.after_batch();
            }
            if n.len < BATCH {
                break;
            }
        }
    }

    /// One pass of the engine's own work: QP timers and pending work (READ
    /// responses still to stream), then CQ handlers deferred to the engine.
    /// Returns the next timer deadline (ns since the epoch) and whether a
    /// QP still has work. `service`/`fire` are scratch vectors (empty).
    pub(crate) fn run_timers(
        &self,
        service: &mut Vec<Arc<QpShared>>,
        fire: &mut Vec<Arc<CqShared>>,
    ) -> (u64, bool) {
        let now_ns = self.ns_since_epoch(Instant::now());
        let mut next_ns = now_ns + IDLE_WAIT.as_nanos() as u64;
        let mut busy = false;
        {
            let qps = self.qps.read().unwrap_or_else(|e| e.into_inner());
            for qp in qps.values() {
                let d = qp.deadline.load(Ordering::Acquire);
                let w = qp.work.load(Ordering::Acquire);
                if w || (d != 0 && d <= now_ns) {
                    service.push(qp.clone());
                } else if d != 0 {
                    next_ns = next_ns.min(d);
                }
            }
        }
        for qp in service.drain(..) {
            qp.service();
            busy |= qp.work.load(Ordering::Acquire);
            let d = qp.deadline.load(Ordering::Acquire);
            if d != 0 {
                next_ns = next_ns.min(d);
            }
        }
        std::mem::swap(
            fire,
            &mut self.deferred.lock().unwrap_or_else(|e| e.into_inner()),
        );
        for cq in fire.drain(..) {
            cq.run_handler();
        }
        (next_ns, busy)
    }

    /// Runs a CQ's handler on the engine thread.
    pub(crate) fn defer_fire(&self, cq: Arc<CqShared>) {
        self.deferred
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(cq);
        self.wake();
    }

    pub(crate) fn add_qp(&self, make: impl FnOnce(u32) -> QpShared) -> Result<Arc<QpShared>> {
        let mut m = self.qps.write().unwrap_or_else(|e| e.into_inner());
        if m.len() >= self.attr.max_qp as usize {
            return Err(VerbsError::ResourceExhausted("queue pairs"));
        }
        let qpn = loop {
            let q = self.next_qpn.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
            // QPN 0 and 1 are special in IBA; rxe starts at 17.
            if q >= 17 && !m.contains_key(&q) {
                break q;
            }
        };
        let qp = Arc::new(make(qpn));
        m.insert(qpn, qp.clone());
        Ok(qp)
    }

    pub(crate) fn remove_qp(&self, qpn: u32) {
        self.qps
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&qpn);
    }

    fn qp(&self, qpn: u32) -> Option<Arc<QpShared>> {
        self.qps
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&qpn)
            .cloned()
    }
}

/// Keeps the engine running while any handle (device, PD, CQ, QP, MR) is
/// alive; the last drop stops it and closes the socket.
pub(crate) struct DevHandle {
    pub(crate) shared: Arc<DevShared>,
}

impl Drop for DevHandle {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.wake();
    }
}

/// The device object ([`DeviceOps`]).
pub(crate) struct SoftDevice {
    pub(crate) handle: Arc<DevHandle>,
}

impl DeviceOps for SoftDevice {
    fn attr(&self) -> &DeviceAttr {
        &self.handle.shared.attr
    }
    fn is_active(&self) -> bool {
        self.handle.shared.running.load(Ordering::Acquire)
    }
    fn alloc_pd(&self) -> Result<Arc<dyn PdOps>> {
        let id = self.handle.shared.next_pd.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(SoftPd {
            id,
            dev: self.handle.clone(),
        }))
    }
    fn drive(&self, done: &dyn Fn() -> bool, max: Duration) -> bool {
        let dev = &self.handle.shared;
        if runs_handlers() {
            // The engine (or a nested drive from a handler) must not wait here.
            return done();
        }
        let deadline = Instant::now() + max;
        let _driver = dev.enter_driver();
        DRIVING.with(|c| c.set(true));
        let r = loop {
            dev.drain_rx();
            if done() {
                break true;
            }
            let now = Instant::now();
            if now >= deadline {
                break false;
            }
            let rest = deadline - now;
            let ts = libc::timespec {
                tv_sec: rest.as_secs() as libc::time_t,
                tv_nsec: rest.subsec_nanos() as libc::c_long,
            };
            let mut pfd = libc::pollfd {
                fd: dev.sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd and a timespec, live for the call.
            unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
        };
        DRIVING.with(|c| c.set(false));
        r
    }
    fn create_cq(&self, cqe: u32) -> Result<Arc<dyn CqOps>> {
        let max = self.handle.shared.attr.max_cqe;
        if cqe == 0 || cqe > max {
            return Err(VerbsError::InvalidArgument("CQ size out of range"));
        }
        let shared = CqShared::new(cqe as usize, Arc::downgrade(&self.handle.shared))?;
        Ok(Arc::new(SoftCq {
            shared,
            _dev: self.handle.clone(),
        }))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The netdev carrying `ip`, with its MTU and MAC, from getifaddrs and
/// sysfs.
fn netdev_for(ip: IpAddr) -> Option<(String, usize, Option<Mac>)> {
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `ifap` with a list we free below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return None;
    }
    let mut found = None;
    let mut p = ifap;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list returned by getifaddrs.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points at a sockaddr of the
        // family it declares.
        let fam = unsafe { (*ifa.ifa_addr).sa_family } as i32;
        let addr = match fam {
            libc::AF_INET => {
                // SAFETY: family AF_INET means a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes())
            }
            libc::AF_INET6 => {
                // SAFETY: family AF_INET6 means a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                IpAddr::from(sin6.sin6_addr.s6_addr)
            }
            _ => continue,
        };
        // Loopback: 127.0.0.1/8 covers every 127.x address we may bind.
        let matches = addr == ip
            || (ip.is_loopback() && addr.is_loopback() && addr.is_ipv4() == ip.is_ipv4());
        if matches {
            // SAFETY: ifa_name is a NUL-terminated string from the kernel.
            let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
                .to_string_lossy()
                .into_owned();
            found = Some(name);
            if addr == ip {
                break;
            }
        }
    }
    // SAFETY: freeing the list getifaddrs allocated.
    unsafe { libc::freeifaddrs(ifap) };
    let name = found?;
    let mtu = std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1500);
    let mac = std::fs::read_to_string(format!("/sys/class/net/{name}/address"))
        .ok()
        .and_then(|s| {
            let b: Vec<u8> = s
                .trim()
                .split(':')
                .filter_map(|x| u8::from_str_radix(x, 16).ok())
                .collect();
            (b.len() == 6 && b.iter().any(|&x| x != 0))
                .then(|| Mac([b[0], b[1], b[2], b[3], b[4], b[5]]))
        });
    Some((name, mtu, mac))
}

/// A locally administered MAC derived from the address (for netdevs
/// without one, e.g. loopback).
fn derived_mac(ip: IpAddr) -> Mac {
    let g = Gid::from_ip(ip).0;
    Mac([0x02, 0x00, g[12], g[13], g[14], g[15]])
}

static DEV_INDEX: AtomicU32 = AtomicU32::new(0);

fn setsockopt_int(fd: i32, level: i32, name: i32, v: i32) -> bool {
    // SAFETY: passing a valid pointer to an int of the stated size.
    unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &v as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as u32,
        ) == 0
    }
}

/// A QP's own sending socket: UDP on `local`, an ephemeral source port
/// chosen by the kernel. Linux rxe gives each QP its own source port (a
/// hash of the QPN above 0xC000) so that ECMP spreads QPs over paths;
/// receivers take RoCEv2 by destination port 4791 whatever the source.
/// Unconnected and DF set like the device socket: Linux then sends IPv4 ID
/// 0, which our ICRC assumes (verifiers.md fact 6). Nothing is received on
/// it (peers send to 4791), so its receive buffer is minimal.
pub(crate) fn qp_socket(local: IpAddr) -> std::io::Result<(Socket, u16)> {
    let sock = udp_socket(local)?;
    setsockopt_int(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, 0);
    sock.bind(&SocketAddr::new(local, 0).into())?;
    let port = sock
        .local_addr()?
        .as_socket()
        .map(|a| a.port())
        .ok_or_else(|| std::io::Error::other("socket has no port"))?;
    Ok((sock, port))
}

/// A UDP socket for RoCEv2 on `local`'s family: DF set (IPv4 ID 0 on the
/// wire, verifiers.md fact 6), large buffers, not bound yet.
fn udp_socket(local: IpAddr) -> std::io::Result<Socket> {
    let domain = if local.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let sock = Socket::new(domain, Type::DGRAM.cloexec(), Some(Protocol::UDP))?;
    let fd = sock.as_raw_fd();
    if local.is_ipv4() {
        setsockopt_int(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        );
    } else {
        sock.set_only_v6(true)?;
        setsockopt_int(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        );
    }
    // Large buffers absorb bursts of a full send window; FORCE works as
    // root, else fall back to the capped variant.
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        let size = 8 << 20;
        if !setsockopt_int(fd, libc::SOL_SOCKET, force, size) {
            setsockopt_int(fd, libc::SOL_SOCKET, plain, size);
        }
    }
    Ok(sock)
}

/// The largest IBA path MTU whose biggest packet fits a netdev MTU of
/// `netdev_mtu` bytes (Mtu256 if none does).
fn active_mtu_for(netdev_mtu: usize, ipv4: bool) -> Mtu {
    // RoCEv2 overhead of the largest packet, a WRITE Only with immediate:
    // IP (20/40) + UDP 8 + BTH 12 + RETH 16 + ImmDt 4 + ICRC 4 (a full
    // payload needs no pad: every IBA MTU is a multiple of 4).
    let overhead = if ipv4 { 20 } else { 40 } + 8 + 12 + 16 + 4 + 4;
    Mtu::largest_fitting(netdev_mtu.saturating_sub(overhead)).unwrap_or(Mtu::Mtu256)
}

/// Opens a device bound to `local` and starts its engine.
pub(crate) fn open(local: IpAddr, config: &Config) -> Result<smc_verbs::Device> {
    open_inner(local, config, true).map(|(d, _)| d)
}

/// Opens a device; without `engine` nobody receives or runs timers unless
/// the caller does ([`crate::harness`], deterministic tests and fuzzing).
pub(crate) fn open_inner(
    local: IpAddr,
    config: &Config,
    engine: bool,
) -> Result<(smc_verbs::Device, Arc<DevShared>)> {
    let port = config.udp_port.unwrap_or(4791);
    let peer_port = config.peer_port.unwrap_or(4791);
    let sock = udp_socket(local)?;
    let fd = sock.as_raw_fd();
    sock.bind(&SocketAddr::new(local, port).into())?;
    // The port actually bound (port 0 asks the kernel for one): the ICRC
    // of received packets covers it.
    let port = sock
        .local_addr()?
        .as_socket()
        .map(|a| a.port())
        .unwrap_or(port);
    let gso =
        local.is_ipv4() && std::env::var(crate::config::ENV_GSO).is_ok_and(|v| v.trim() == "1");
    if gso {
        // Receive GSO trains whole (no per-segment trip through the stack).
        setsockopt_int(fd, SOL_UDP, UDP_GRO, 1);
    }
    let (netdev, mtu, mac) = match netdev_for(local) {
        Some((n, m, mac)) => (Some(n), m, mac),
        None => (None, 1500, None),
    };
    let mut active_mtu = active_mtu_for(mtu, local.is_ipv4());
    if let Some(cap) = config.max_mtu {
        active_mtu = active_mtu.min(cap);
    }
    // SAFETY: eventfd has no preconditions; checked below.
    let wfd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if wfd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let idx = DEV_INDEX.fetch_add(1, Ordering::Relaxed);
    let attr = DeviceAttr {
        name: format!("sroce{idx}"),
        provider: "softroce".into(),
        local_addr: local,
        gid: Gid::from_ip(local),
        mac: mac.unwrap_or_else(|| derived_mac(local)),
        netdev,
        active_mtu,
        max_qp: 4096,
        max_qp_wr: 16384,
        max_sge: crate::qp::MAX_SGE as u32,
        max_cqe: 1 << 20,
        max_mr: 1 << 16,
        max_inline_data: crate::qp::MAX_INLINE as u32,
        max_qp_rd_atom: crate::qp::MAX_RD_ATOMIC as u8,
    };
    let rx_slot = if gso { 65_536 } else { SLOT };
    let shared = Arc::new(DevShared {
        attr,
        config: config.clone(),
        local_port: port,
        peer_port,
        sock,
        mrs: MrTable::default(),
        gso,
        qps: RwLock::new(HashMap::new()),
        // A random first QPN per device instance: a peer that still holds a link to a
        // previous process on the same address (killed without tearing its QPs down) then
        // sends to a QPN nobody owns — dropped as unknown — instead of into the new
        // process's QP with a plausible PSN. rxe starts at 17; any value ≥ 17 is legal.
        next_qpn: AtomicU32::new(17 + crate::mr::random_u32() % 0x00f0_0000),
        next_pd: AtomicU32::new(1),
        epoch: Instant::now(),
        engine_wake_ns: AtomicU64::new(0),
        // SAFETY: `wfd` is a fresh descriptor we own.
        wake_fd: unsafe { OwnedFd::from_raw_fd(wfd) },
        shutdown: AtomicBool::new(false),
        running: AtomicBool::new(true),
        deferred: Mutex::new(Vec::with_capacity(64)),
        rx: Mutex::new(RxState {
            batch: RxBatch {
                bufs: vec![0u8; rx_slot * BATCH],
                slot: rx_slot,
                // SAFETY: sockaddr_storage is plain old data.
                addrs: Box::new(unsafe { std::mem::zeroed() }),
                ctrl: Box::new([[0u64; 4]; BATCH]),
            },
            touched: Vec::with_capacity(BATCH),
        }),
        drivers: AtomicU32::new(0),
        driver_left_ns: AtomicU64::new(0),
        stats: Stats::default(),
    });
    if engine {
        let eng = shared.clone();
        std::thread::Builder::new()
            .name(format!("{}-engine", shared.attr.name))
            .spawn(move || engine_main(eng))?;
    }
    tracing::info!(name = %shared.attr.name, %local, port, mtu = shared.attr.active_mtu.bytes(), "softroce device open");
    Ok((
        smc_verbs::Device(Arc::new(SoftDevice {
            handle: Arc::new(DevHandle {
                shared: shared.clone(),
            }),
        })),
        shared,
    ))
}

/// Device statistics of a softroce device handle.
pub fn stats(dev: &smc_verbs::Device) -> Option<&Stats> {
    dev.0
        .as_any()
        .downcast_ref::<SoftDevice>()
        .map(|d| &d.handle.shared.stats)
}

/// Receive buffers plus the QPs touched by the current batch.
struct RxState {
    batch: RxBatch,
    touched: Vec<Arc<QpShared>>,
}

/// A registered driver (see [`DevShared::enter_driver`]).
pub(crate) struct DriverGuard {
    dev: Arc<DevShared>,
}

impl Drop for DriverGuard {
    fn drop(&mut self) {
        let dev = &self.dev;
        let now = dev.ns_since_epoch(Instant::now()).max(1);
        dev.driver_left_ns.store(now, Ordering::Release);
        if dev.drivers.fetch_sub(1, Ordering::SeqCst) == 1 {
            // The engine may be asleep off the socket for longer than the
            // linger time (it slept while we drove): wake it to take over.
            let planned = dev.engine_wake_ns.load(Ordering::SeqCst);
            if planned != 0 && planned > now + DRIVER_LINGER.as_nanos() as u64 {
                dev.wake();
            }
        }
    }
}

struct RxBatch {
    /// BATCH slots of `slot` bytes (64 KiB with UDP GRO, else SLOT).
    bufs: Vec<u8>,
    slot: usize,
    addrs: Box<[libc::sockaddr_storage; BATCH]>,
    ctrl: Box<[[u64; 4]; BATCH]>,
}

fn sockaddr_ip(sa: &libc::sockaddr_storage) -> Option<(IpAddr, u16)> {
    match sa.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: family AF_INET means the storage holds a sockaddr_in.
            let sin = unsafe { &*(sa as *const _ as *const libc::sockaddr_in) };
            Some((
                IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes()),
                u16::from_be(sin.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: family AF_INET6 means a sockaddr_in6.
            let sin6 = unsafe { &*(sa as *const _ as *const libc::sockaddr_in6) };
            Some((
                IpAddr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
            ))
        }
        _ => None,
    }
}

fn engine_main(dev: Arc<DevShared>) {
    IS_ENGINE.with(|c| c.set(true));
    // Build this thread's transmit batch now: with waiters receiving, the
    // engine may send its first packet long after start-up, and the steady
    // state must not allocate.
    TX.with(|_| {});
    // Allocated up front: the steady state must not touch the heap even the
    // first time a timer or a deferred handler needs them.
    let mut service: Vec<Arc<QpShared>> = Vec::with_capacity(64);
    let mut fire: Vec<Arc<CqShared>> = Vec::with_capacity(64);
    while !dev.shutdown.load(Ordering::Acquire) {
        let (next_ns, busy) = dev.run_timers(&mut service, &mut fire);
        // Sleep until a packet, a wake-up or the next deadline.
        let timeout_ns = if busy {
            0
        } else {
            let now_ns = dev.ns_since_epoch(Instant::now());
            next_ns.saturating_sub(now_ns)
        };
        // Microsecond-precision sleep (delayed ACKs, short RNR timers).
        // Publish the planned wake-up before looking at the drivers (a
        // leaving driver reads it after unregistering: SeqCst on both sides
        // means one of us sees the other).
        dev.engine_wake_ns
            .store(if busy { 0 } else { next_ns }, Ordering::SeqCst);
        let now_ns = dev.ns_since_epoch(Instant::now());
        let linger = DRIVER_LINGER.as_nanos() as u64;
        let drivers = dev.drivers.load(Ordering::SeqCst);
        let left = dev.driver_left_ns.load(Ordering::Acquire);
        let recent = left != 0 && now_ns.saturating_sub(left) < linger;
        let delegated = drivers > 0 || recent;
        let mut timeout_ns = timeout_ns;
        if recent && !busy {
            // A driver may leave at any moment; look at the socket soon.
            timeout_ns = timeout_ns.min(linger);
            dev.engine_wake_ns
                .store(now_ns + timeout_ns, Ordering::SeqCst);
        }
        let ts = libc::timespec {
            tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
        };
        let mut pfd = [
            libc::pollfd {
                fd: dev.sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: dev.wake_fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // While drivers receive, the engine must not sleep on the socket
        // too (every packet would wake both): it watches only its eventfd.
        let (pfds, nfds) = if delegated {
            (pfd[1..].as_mut_ptr(), 1)
        } else {
            (pfd.as_mut_ptr(), 2)
        };
        // SAFETY: `nfds` valid pollfds and a timespec for the duration of the call.
        let r = unsafe { libc::ppoll(pfds, nfds, &ts, std::ptr::null()) };
        dev.engine_wake_ns.store(0, Ordering::Release);
        if r < 0 {
            continue;
        }
        if pfd[1].revents != 0 {
            let mut v: u64 = 0;
            // SAFETY: reading 8 bytes into a u64 from our eventfd.
            unsafe {
                libc::read(
                    dev.wake_fd.as_raw_fd(),
                    &mut v as *mut u64 as *mut libc::c_void,
                    8,
                )
            };
        }
        if pfd[0].revents == 0 && !delegated {
            continue;
        }
        // Delegated: packets may have arrived while no driver was waiting.
        dev.drain_rx();
    }
    dev.running.store(false, Ordering::Release);
    tracing::debug!(name = %dev.attr.name, "engine stopped");
}

struct RecvResult {
    len: usize,
    lens: [usize; BATCH],
    /// GRO segment size per datagram (0: one packet).
    segs: [usize; BATCH],
}

fn recv_batch(dev: &DevShared, rx: &mut RxBatch) -> RecvResult {
    let mut iov: [libc::iovec; BATCH] = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; BATCH];
    // SAFETY: mmsghdr is plain old data.
    let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
    let slot = rx.slot;
    for (i, (io, h)) in iov.iter_mut().zip(hdrs.iter_mut()).enumerate() {
        io.iov_base = rx.bufs[i * slot..].as_mut_ptr() as *mut libc::c_void;
        io.iov_len = slot;
        h.msg_hdr.msg_name = &mut rx.addrs[i] as *mut _ as *mut libc::c_void;
        h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
        h.msg_hdr.msg_iov = io;
        h.msg_hdr.msg_iovlen = 1;
        if dev.gso {
            h.msg_hdr.msg_control = rx.ctrl[i].as_mut_ptr() as *mut libc::c_void;
            h.msg_hdr.msg_controllen = std::mem::size_of::<[u64; 4]>();
        }
    }
    // SAFETY: every header points at buffers owned by `rx`/this frame.
    let r = unsafe {
        libc::recvmmsg(
            dev.sock.as_raw_fd(),
            hdrs.as_mut_ptr(),
            BATCH as u32,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    let mut out = RecvResult {
        len: 0,
        lens: [0; BATCH],
        segs: [0; BATCH],
    };
    if r > 0 {
        out.len = r as usize;
        for (i, h) in hdrs[..r as usize].iter().enumerate() {
            // A truncated datagram is larger than any valid packet.
            out.lens[i] = if h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                0
            } else {
                h.msg_len as usize
            };
            if dev.gso && h.msg_hdr.msg_controllen > 0 {
                // SAFETY: walking the control buffer the kernel filled,
                // with the libc macros, within msg_controllen; the i32 is
                // read only from a message long enough to hold it.
                unsafe {
                    let mut c = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                    while !c.is_null() {
                        if (*c).cmsg_level == SOL_UDP
                            && (*c).cmsg_type == UDP_GRO
                            && (*c).cmsg_len as usize >= libc::CMSG_LEN(4) as usize
                        {
                            let v = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const i32);
                            out.segs[i] = v.max(0) as usize;
                        }
                        c = libc::CMSG_NXTHDR(&h.msg_hdr, c);
                    }
                }
            }
        }
    }
    out
}

/// Checks the ICRC of a received packet (see [`crate::icrc`] for the IPv4
/// identification problem).
fn icrc_ok(dev: &DevShared, src: IpAddr, sport: u16, pkt: &[u8]) -> bool {
    let local = dev.attr.local_addr;
    match (src, local) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let ip = IpInfo::V4 {
                src: s,
                dst: d,
                id: 0,
                flags_frag: IPV4_DF,
            };
            // One CRC pass: ID 0 verifies directly, any other ID is
            // recovered from the syndrome.
            match icrc::recover_ipv4_id(&ip, sport, dev.local_port, pkt) {
                Some(0) => true,
                Some(_) => {
                    dev.stats
                        .rx_icrc_id_recovered
                        .fetch_add(1, Ordering::Relaxed);
                    true
                }
                // RoCE senders set DF, but the flags are covered unmasked:
                // accept a sender that does not.
                None => {
                    let no_df = IpInfo::V4 {
                        src: s,
                        dst: d,
                        id: 0,
                        flags_frag: 0,
                    };
                    icrc::recover_ipv4_id(&no_df, sport, dev.local_port, pkt).is_some()
                }
            }
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            icrc::verify(&IpInfo::V6 { src: s, dst: d }, sport, dev.local_port, pkt)
        }
        _ => false,
    }
}

pub(crate) fn handle_packet(
    dev: &DevShared,
    pkt: &[u8],
    src: IpAddr,
    sport: u16,
    touched: &mut Vec<Arc<QpShared>>,
) {
    let src = match src {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    };
    let parsed = match PacketRepr::parse(pkt) {
        Ok(p) => p,
        Err(e) => {
            dev.stats.rx_malformed.fetch_add(1, Ordering::Relaxed);
            tracing::trace!(error = %e, "dropping malformed packet");
            return;
        }
    };
    if !icrc_ok(dev, src, sport, pkt) {
        dev.stats.rx_bad_icrc.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(%src, "dropping packet with bad ICRC");
        return;
    }
    let Some(qp) = dev.qp(parsed.repr.bth.dest_qp) else {
        dev.stats.rx_unknown_qp.fetch_add(1, Ordering::Relaxed);
        return;
    };
    if !qp.on_packet(&parsed, pkt, src) {
        dev.stats.rx_foreign.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(%src, qpn = qp.qpn, "dropping a packet not from the QP's peer");
        return;
    }
    dev.stats.rx_packets.fetch_add(1, Ordering::Relaxed);
    if !touched.iter().any(|t| Arc::ptr_eq(t, &qp)) {
        touched.push(qp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{BthRepr, Opcode, RethRepr};

    /// The largest packet of each path MTU: a WRITE Only with immediate
    /// (BTH + RETH + ImmDt + a full payload + ICRC), in an IP packet.
    fn largest_packet(mtu: Mtu, ipv4: bool) -> usize {
        let repr = PacketRepr {
            bth: BthRepr {
                opcode: Opcode::WriteOnlyImm,
                se: false,
                mig_req: false,
                pad_count: 0,
                pkey: 0xffff,
                resv8a: 0,
                dest_qp: 17,
                ack_req: true,
                resv7: 0,
                psn: 0,
            },
            reth: Some(RethRepr {
                va: 0,
                rkey: 0,
                dma_len: 0,
            }),
            aeth: None,
            imm: Some(0),
            atomic: None,
            atomic_ack: None,
        };
        let ip = if ipv4 { 20 } else { 40 };
        ip + 8 + repr.buffer_len(mtu.bytes())
    }

    /// Item 8: every packet of the chosen path MTU fits the netdev MTU,
    /// including the 4-byte ImmDt (else sending fails with EMSGSIZE: the
    /// sockets set DF); the next MTU up does not.
    #[test]
    fn path_mtu_fits_the_largest_packet() {
        for ipv4 in [true, false] {
            for mtu in Mtu::ALL {
                let need = largest_packet(mtu, ipv4);
                assert_eq!(active_mtu_for(need, ipv4), mtu, "netdev MTU {need}");
                if mtu > Mtu::Mtu256 {
                    assert!(
                        active_mtu_for(need - 1, ipv4) < mtu,
                        "netdev MTU {} gives {mtu:?}, whose WRITE with immediate needs {need}",
                        need - 1
                    );
                }
            }
            assert_eq!(active_mtu_for(1500, ipv4), Mtu::Mtu1024);
            assert_eq!(active_mtu_for(65_536, ipv4), Mtu::Mtu4096);
        }
    }
}
