//! The progress engine of a device: its QPN table, the receive path
//! (recvmmsg, ICRC check, demultiplexing by destination QPN, rxe_recv.c's
//! job) and the thread that receives packets and runs QP timers and
//! deferred CQ handlers. Application threads transmit directly (sendmmsg,
//! [`crate::tx`]) under their QP's lock; a thread waiting for a completion
//! may take over receiving for a while (see [`Engine::enter_driver`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use smc_verbs::{DeviceAttr, EventFd, Gid, Result, VerbsError};

use crate::config::Config;
use crate::cq::CqShared;
use crate::device::{DevShared, Stats};
use crate::mr::MrTable;
use crate::net::{active_mtu_for, derived_mac, netdev_for};
use crate::qp::QpShared;
use crate::rx::{enable_gro, has_udp_gso, icrc_ok, recv_batch, sockaddr_ip, RxBatch};
use crate::thread::{become_engine, on_engine_thread};
use crate::tx::{BATCH, SLOT, TX};
use crate::wire::PacketRepr;

/// Longest the engine sleeps when nothing is scheduled.
const IDLE_WAIT: Duration = Duration::from_millis(20);
/// While a thread blocked in a wait receives for the device, and for this
/// long after the last one left with what it waited for, the engine leaves
/// the socket to the drivers (a driver that got its completion normally
/// comes back within microseconds: taking the socket back and forth would
/// cost the engine a wake-up per message). Meanwhile it looks at the
/// socket at most this long apart. A driver that gives up waiting hands the
/// socket over at once ([`DriverGuard::hand_off`]), so nobody waiting for
/// a completion ever depends on this period.
const DRIVER_LINGER: Duration = Duration::from_millis(1);
/// While threads are registered to receive for the device, the engine
/// looks this often whether any of them gets on; when packets have waited
/// on the socket for a lease while the receive path made no progress (the
/// thread holding it is stuck: in a completion handler that waits for an
/// application lock or for the process's mmap lock, in a page fault), the
/// engine receives them itself ([`Engine::take_over`]).
const DRIVER_LEASE: Duration = Duration::from_millis(5);

static DEV_INDEX: AtomicU32 = AtomicU32::new(0);

/// A device's engine: what the QPs share ([`DevShared`]) plus the QPN
/// table, the receive path and the engine thread's controls.
pub(crate) struct Engine {
    pub(crate) dev: Arc<DevShared>,
    qps: RwLock<HashMap<u32, Arc<QpShared>>>,
    next_qpn: AtomicU32,
    /// This process's slot of a shared port (its QPNs' top bits), kept
    /// while the device lives.
    shared: Option<crate::share::SharedPort>,
    pub(crate) next_pd: AtomicU32,
    pub(crate) shutdown: AtomicBool,
    pub(crate) running: AtomicBool,
    /// The receive path's buffers: whoever holds the lock (the engine or a
    /// thread waiting for a completion) reads the socket.
    rx: Mutex<RxState>,
    /// Threads blocked in a CQ wait that receive for the device themselves.
    drivers: AtomicU32,
    /// When the last such thread left (ns since epoch).
    driver_left_ns: AtomicU64,
    /// Batches received through `rx` so far: the engine's evidence that the
    /// receive path gets on while it leaves the socket to drivers.
    progress: AtomicU64,
    /// The engine's own receive buffers for [`Engine::take_over`], made
    /// with the device (so that taking over allocates nothing).
    takeover_rx: Mutex<RxState>,
}

impl Engine {
    /// Registers a thread that will wait for completions by reading the
    /// socket itself: a message then costs one wake-up (that thread's)
    /// instead of two (the engine's, then the waiter's). Dropping the guard
    /// unregisters it.
    pub(crate) fn enter_driver(self: &Arc<Self>) -> DriverGuard {
        self.drivers.fetch_add(1, Ordering::SeqCst);
        DriverGuard {
            eng: self.clone(),
            hand_off: false,
        }
    }

    /// Receives and processes everything queued on the socket (non-blocking).
    pub(crate) fn drain_rx(&self) {
        let mut g = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        self.receive(&mut g, true);
    }

    /// The engine receives with buffers of its own although another thread
    /// holds the receive path: that thread made no progress for a lease
    /// while packets waited (see [`DRIVER_LEASE`]). A device must go on
    /// receiving and acknowledging while an application's thread is stuck,
    /// as an RNIC does: else every QP of the device stops, and after
    /// `retry_cnt` + 1 local ACK timeouts the peer's QPs fail with
    /// RetryExcErr although nothing was lost (CHECKLIST RTY-1). What the
    /// stuck thread had received already it processes when it gets on: by
    /// then a requester has sent it again (its PSN gap was NAKed), so it is
    /// a duplicate, or it is next in sequence and taken as usual.
    fn take_over(&self) {
        let mut g = self.takeover_rx.lock().unwrap_or_else(|e| e.into_inner());
        crate::cq::taking_over(|| self.receive(&mut g, false));
    }

    /// Receives and processes everything queued on the socket into `st`'s
    /// buffers; `progress`: count the batches (the shared receive path).
    fn receive(&self, st: &mut RxState, progress: bool) {
        let RxState { batch: rx, touched } = st;
        let waiter = !on_engine_thread();
        loop {
            let n = recv_batch(&self.dev, rx);
            if progress {
                self.progress.fetch_add(1, Ordering::Relaxed);
            }
            if waiter && n.len > 0 {
                self.dev
                    .stats
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
                // One clock read per datagram, not per packet (up to 64 of
                // them, tens of µs: timers are set in ms).
                let now = Instant::now();
                for pkt in dgram.chunks(seg) {
                    handle_packet(self, now, pkt, src, sport, touched);
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
        let now_ns = self.dev.ns_since_epoch(Instant::now());
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
            &mut self.dev.deferred.lock().unwrap_or_else(|e| e.into_inner()),
        );
        for cq in fire.drain(..) {
            // Never waiting for a handler that another thread runs (it may
            // be stuck there, and the engine must go on).
            cq.run_unless_running();
        }
        (next_ns, busy)
    }

    pub(crate) fn add_qp(&self, make: impl FnOnce(u32) -> QpShared) -> Result<Arc<QpShared>> {
        let mut m = self.qps.write().unwrap_or_else(|e| e.into_inner());
        if m.len() >= self.dev.attr.max_qp as usize {
            return Err(VerbsError::ResourceExhausted("queue pairs"));
        }
        let qpn = loop {
            let n = self.next_qpn.fetch_add(1, Ordering::Relaxed);
            let q = match &self.shared {
                Some(s) => {
                    (s.slot << crate::share::SLOT_SHIFT)
                        | (n & ((1 << crate::share::SLOT_SHIFT) - 1))
                }
                None => n & 0x00ff_ffff,
            };
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

impl Engine {
    /// Opens a device bound to `local`; with `thread`, starts its engine
    /// thread, else nobody receives or runs timers unless the caller does
    /// (`harness`: deterministic tests and fuzzing).
    pub(crate) fn open(local: IpAddr, config: &Config, thread: bool) -> Result<Arc<Engine>> {
        let port = config.udp_port.unwrap_or(4791);
        let peer_port = config.peer_port.unwrap_or(4791);
        // Shared with the other processes on the address where possible
        // (share.rs, docs/port-sharing.md): QPNs then carry our slot.
        let (sock, shared) = crate::share::bind_device(local, port)?;
        // The port actually bound (port 0 asks the kernel for one): the ICRC
        // of received packets covers it.
        let port = sock
            .local_addr()?
            .as_socket()
            .map(|a| a.port())
            .unwrap_or(port);
        // UDP GSO/GRO by default (IPv4, where the kernel has them): the
        // kernel's per-datagram cost bounds throughput. `Config::gso`, else
        // SMC_RS_SOFTROCE_GSO=0, turns it off (per-packet captures on lo).
        let want = local.is_ipv4()
            && config
                .gso
                .or_else(crate::config::gso_from_env)
                .unwrap_or(true);
        let gso = want && has_udp_gso(&sock);
        // Receive GSO trains whole (no per-segment trip through the stack).
        let gro = want && enable_gro(&sock);
        let (netdev, mtu, mac) = match netdev_for(local) {
            Some((n, m, mac)) => (Some(n), m, mac),
            None => (None, 1500, None),
        };
        let mut active_mtu = active_mtu_for(mtu, local.is_ipv4());
        if let Some(cap) = config.max_mtu {
            active_mtu = active_mtu.min(cap);
        }
        let wake_fd = EventFd::new()?;
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
        let rx_slot = if gro { 65_536 } else { SLOT };
        let dev = Arc::new(DevShared {
            attr,
            config: config.clone(),
            local_port: port,
            peer_port,
            sock,
            mrs: MrTable::default(),
            gso_tx: AtomicBool::new(gso),
            gro,
            epoch: Instant::now(),
            engine_wake_ns: AtomicU64::new(0),
            wake_fd,
            deferred: Mutex::new(Vec::with_capacity(64)),
            stats: Stats::default(),
        });
        let eng = Arc::new(Engine {
            dev,
            qps: RwLock::new(HashMap::new()),
            // A random first QPN per device instance: a peer that still holds a link to a
            // previous process on the same address (killed without tearing its QPs down) then
            // sends to a QPN nobody owns — dropped as unknown — instead of into the new
            // process's QP with a plausible PSN. rxe starts at 17; any value ≥ 17 is legal.
            next_qpn: AtomicU32::new(17 + crate::mr::random_u32() % 0x00f0_0000),
            shared,
            next_pd: AtomicU32::new(1),
            shutdown: AtomicBool::new(false),
            running: AtomicBool::new(true),
            rx: Mutex::new(RxState {
                batch: RxBatch::new(rx_slot),
                touched: Vec::with_capacity(BATCH),
            }),
            drivers: AtomicU32::new(0),
            driver_left_ns: AtomicU64::new(0),
            progress: AtomicU64::new(0),
            takeover_rx: Mutex::new(RxState {
                batch: RxBatch::new(rx_slot),
                touched: Vec::with_capacity(BATCH),
            }),
        });
        if thread {
            let e = eng.clone();
            std::thread::Builder::new()
                .name(format!("{}-engine", eng.dev.attr.name))
                .spawn(move || engine_main(e))?;
        }
        let slot = eng.shared.as_ref().map(|s| s.slot);
        tracing::info!(name = %eng.dev.attr.name, %local, port, ?slot, mtu = eng.dev.attr.active_mtu.bytes(), gso, gro, "softroce device open");
        Ok(eng)
    }

    /// Stops the engine thread (the last handle of the device is gone).
    pub(crate) fn stop(&self) {
        self.shutdown.store(true, Ordering::Release);
        self.dev.wake();
    }
}

/// Receive buffers plus the QPs touched by the current batch.
struct RxState {
    batch: RxBatch,
    touched: Vec<Arc<QpShared>>,
}

/// A registered driver (see [`Engine::enter_driver`]).
pub(crate) struct DriverGuard {
    eng: Arc<Engine>,
    hand_off: bool,
}

impl DriverGuard {
    /// The driver stops without what it waited for and will sleep
    /// elsewhere: if it is the last one, the engine takes the socket over
    /// at once instead of after [`DRIVER_LINGER`] (packets arriving in
    /// between would otherwise wait for the engine's next look, up to the
    /// linger: the reader's reply among them).
    pub(crate) fn hand_off(&mut self) {
        self.hand_off = true;
    }
}

impl Drop for DriverGuard {
    fn drop(&mut self) {
        let (eng, dev) = (&self.eng, &self.eng.dev);
        if self.hand_off {
            // Not "recent": the engine goes back to the socket (SeqCst with
            // the count below: the engine reads the count, then this).
            eng.driver_left_ns.store(0, Ordering::SeqCst);
            if eng.drivers.fetch_sub(1, Ordering::SeqCst) == 1 {
                dev.wake();
            }
            return;
        }
        let now = dev.ns_since_epoch(Instant::now()).max(1);
        eng.driver_left_ns.store(now, Ordering::SeqCst);
        if eng.drivers.fetch_sub(1, Ordering::SeqCst) == 1 {
            // The engine may be asleep off the socket for longer than the
            // linger time (it slept while we drove): wake it to take over.
            let planned = dev.engine_wake_ns.load(Ordering::SeqCst);
            if planned != 0 && planned > now + DRIVER_LINGER.as_nanos() as u64 {
                dev.wake();
            }
        }
    }
}

fn engine_main(eng: Arc<Engine>) {
    let dev = &eng.dev;
    become_engine();
    // Build this thread's transmit batch now: with waiters receiving, the
    // engine may send its first packet long after start-up, and the steady
    // state must not allocate.
    TX.with(|_| {});
    // Allocated up front: the steady state must not touch the heap even the
    // first time a timer or a deferred handler needs them.
    let mut service: Vec<Arc<QpShared>> = Vec::with_capacity(64);
    let mut fire: Vec<Arc<CqShared>> = Vec::with_capacity(64);
    let lease = DRIVER_LEASE.as_nanos() as u64;
    // The receive path's progress as last seen, and since when packets have
    // waited on the socket without it getting on.
    let mut seen = eng.progress.load(Ordering::Relaxed);
    let mut waiting_since: Option<u64> = None;
    while !eng.shutdown.load(Ordering::Acquire) {
        let (next_ns, busy) = eng.run_timers(&mut service, &mut fire);
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
        let drivers = eng.drivers.load(Ordering::SeqCst);
        let left = eng.driver_left_ns.load(Ordering::SeqCst);
        let recent = left != 0 && now_ns.saturating_sub(left) < linger;
        let delegated = drivers > 0 || recent;
        let mut timeout_ns = timeout_ns;
        if recent && !busy {
            // A driver may leave at any moment; look at the socket soon.
            timeout_ns = timeout_ns.min(linger);
            dev.engine_wake_ns
                .store(now_ns + timeout_ns, Ordering::SeqCst);
        } else if delegated && !busy && timeout_ns > lease {
            // Check on the drivers once per lease (below).
            timeout_ns = lease;
            dev.engine_wake_ns
                .store(now_ns + timeout_ns, Ordering::SeqCst);
        }
        let ts = Timespec {
            tv_sec: (timeout_ns / 1_000_000_000) as i64,
            tv_nsec: (timeout_ns % 1_000_000_000) as _,
        };
        let mut pfd = [
            PollFd::new(&dev.sock, PollFlags::IN),
            PollFd::new(&dev.wake_fd, PollFlags::IN),
        ];
        // While drivers receive, the engine must not sleep on the socket
        // too (every packet would wake both): it watches only its eventfd.
        let fds = if delegated {
            &mut pfd[1..]
        } else {
            &mut pfd[..]
        };
        // ppoll: microsecond timers need a nanosecond timeout.
        let r = rustix::event::poll(fds, Some(&ts));
        dev.engine_wake_ns.store(0, Ordering::Release);
        if r.is_err() {
            continue;
        }
        if !pfd[1].revents().is_empty() {
            dev.wake_fd.drain();
        }
        if pfd[0].revents().is_empty() && !delegated {
            continue;
        }
        // Delegated: packets may have arrived while no driver was waiting.
        // While one is (it may have come while we slept), the socket is
        // its: a registered driver receives before it looks at its
        // completion or sleeps, and receiving here would take that
        // completion from under it (it would then have to be woken for it,
        // a second wake-up for one message).
        if eng.drivers.load(Ordering::SeqCst) > 0 {
            // Unless the receive path has not got on for a whole lease while
            // packets wait: its holder is stuck, the engine receives.
            let p = eng.progress.load(Ordering::Relaxed);
            if p != seen {
                (seen, waiting_since) = (p, None);
            } else if socket_readable(dev) {
                let now_ns = dev.ns_since_epoch(Instant::now());
                match waiting_since {
                    None => waiting_since = Some(now_ns),
                    Some(t) if now_ns.saturating_sub(t) >= lease => {
                        dev.stats
                            .rx_engine_takeovers
                            .fetch_add(1, Ordering::Relaxed);
                        eng.take_over();
                        waiting_since = None;
                    }
                    Some(_) => {}
                }
            } else {
                waiting_since = None;
            }
            continue;
        }
        eng.drain_rx();
    }
    eng.running.store(false, Ordering::Release);
    tracing::debug!(name = %dev.attr.name, "engine stopped");
}

/// Whether a packet waits on the device's socket (without blocking).
fn socket_readable(dev: &DevShared) -> bool {
    let mut pfd = [PollFd::new(&dev.sock, PollFlags::IN)];
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(rustix::event::poll(&mut pfd, Some(&zero)), Ok(n) if n > 0)
}

/// One received packet: parse, ICRC, QP lookup, source check, then the
/// QP (which is added to `touched` for its after-batch pass).
pub(crate) fn handle_packet(
    eng: &Engine,
    now: Instant,
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
    let dev = &eng.dev;
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
    let Some(qp) = eng.qp(parsed.repr.bth.dest_qp) else {
        dev.stats.rx_unknown_qp.fetch_add(1, Ordering::Relaxed);
        return;
    };
    if !qp.on_packet(now, &parsed, pkt, src) {
        dev.stats.rx_foreign.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(%src, qpn = qp.qpn, "dropping a packet not from the QP's peer");
        return;
    }
    dev.stats.rx_packets.fetch_add(1, Ordering::Relaxed);
    if !touched.iter().any(|t| Arc::ptr_eq(t, &qp)) {
        touched.push(qp);
    }
}
