//! The verbs objects of a device (rxe_verbs.c's job): the handles
//! [`smc_verbs`] hands to users — device, protection domain, memory region,
//! completion queue and queue pair — with the argument checks of each verb.
//! They hold the engine ([`DevHandle`]) and delegate to the device's
//! modules: [`crate::mr`], [`crate::cq`], [`crate::qp`], [`crate::engine`].

use std::any::Any;
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use smc_verbs::event::poll_timeout;
use smc_verbs::{
    wait_on_event_fd, AccessFlags, CompletionHandler, CqOps, DeviceAttr, DeviceOps, DriveWaker,
    InitAttr, MrOps, PdOps, QpCap, QpInitAttr, QpOps, QpState, RdmaBuffer, RecvWr, Result, RtrAttr,
    RtsAttr, SendWr, VerbsError, WorkCompletion,
};

use crate::config::Config;
use crate::cq::{CqShared, HandlerRunner};
use crate::device::{DevShared, Stats};
use crate::engine::Engine;
use crate::mr::MrEntry;
use crate::qp::{QpConfig, QpShared, MAX_INLINE, MAX_SGE};
use crate::thread::{runs_handlers, set_driving};

/// Opens a device bound to `local` and starts its engine.
pub(crate) fn open(local: IpAddr, config: &Config) -> Result<smc_verbs::Device> {
    open_inner(local, config, true).map(|(d, _)| d)
}

/// Opens a device; without `engine` nobody receives or runs timers unless
/// the caller does (`harness`: deterministic tests and fuzzing).
pub(crate) fn open_inner(
    local: IpAddr,
    config: &Config,
    engine: bool,
) -> Result<(smc_verbs::Device, Arc<Engine>)> {
    let eng = Engine::open(local, config, engine)?;
    Ok((
        smc_verbs::Device(Arc::new(SoftDevice {
            handle: Arc::new(DevHandle { eng: eng.clone() }),
        })),
        eng,
    ))
}

/// Device statistics of a softroce device handle.
pub fn stats(dev: &smc_verbs::Device) -> Option<&Stats> {
    dev.0
        .as_any()
        .downcast_ref::<SoftDevice>()
        .map(|d| &d.handle.eng.dev.stats)
}

/// Keeps the engine running while any handle (device, PD, CQ, QP, MR) is
/// alive; the last drop stops it and closes the socket.
pub(crate) struct DevHandle {
    pub(crate) eng: Arc<Engine>,
}

impl DevHandle {
    fn dev(&self) -> &Arc<DevShared> {
        &self.eng.dev
    }
}

impl Drop for DevHandle {
    fn drop(&mut self) {
        self.eng.stop();
    }
}

/// The device object ([`DeviceOps`]).
pub(crate) struct SoftDevice {
    pub(crate) handle: Arc<DevHandle>,
}

impl DeviceOps for SoftDevice {
    fn attr(&self) -> &DeviceAttr {
        &self.handle.dev().attr
    }
    fn is_active(&self) -> bool {
        self.handle.eng.running.load(Ordering::Acquire)
    }
    fn alloc_pd(&self) -> Result<Arc<dyn PdOps>> {
        let id = self.handle.eng.next_pd.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(SoftPd {
            id,
            dev: self.handle.clone(),
        }))
    }
    fn drive(
        &self,
        done: &dyn Fn() -> bool,
        waker: Option<&DriveWaker>,
        max: Duration,
        spin: Duration,
    ) -> bool {
        let eng = &self.handle.eng;
        if runs_handlers() {
            // The engine (or a nested drive from a handler) must not wait here.
            return done();
        }
        let start = Instant::now();
        let deadline = start + max;
        let spin_until = start + spin.min(max);
        let mut driver = eng.enter_driver();
        set_driving(true);
        let mut spins = 0u32;
        let r = loop {
            eng.drain_rx();
            if done() {
                break true;
            }
            let now = Instant::now();
            if now >= deadline {
                break false;
            }
            if now < spin_until {
                // Each turn is a non-blocking receive (a system call), so the peer's
                // packet is taken within a microsecond or two of its arrival, without
                // this thread's wake-up (~30 µs on the 2-CPU development VM: the whole
                // round trip of `smc bench` was two of them). A yield now and then:
                // with more runnable threads than CPUs the peer may be queued behind
                // this very spin.
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(16) {
                    std::thread::yield_now();
                }
                std::hint::spin_loop();
                continue;
            }
            // The socket, and the waker: the completion we wait for may be
            // received by another thread (the engine's look at the socket
            // after a driver left, another driver), which leaves no packet
            // for us to wake on; the consumer's handler then wakes us.
            let mut pfd = [
                PollFd::new(&eng.dev.sock, PollFlags::IN),
                PollFd::from_borrowed_fd(
                    waker.map_or(eng.dev.sock.as_fd(), |w| w.fd()),
                    PollFlags::IN,
                ),
            ];
            let n = if waker.is_some() { 2 } else { 1 };
            let _ = rustix::event::poll(&mut pfd[..n], poll_timeout(Some(deadline - now)).as_ref());
            if n == 2 && !pfd[1].revents().is_empty() {
                // Cleared before done() is looked at again: a wake-up after
                // this makes the next poll return at once.
                if let Some(w) = waker {
                    w.clear();
                }
            }
        };
        set_driving(false);
        if !r {
            // The caller goes to sleep elsewhere: the engine takes the
            // socket over now, not after its linger.
            driver.hand_off();
        }
        r
    }
    fn create_cq(&self, cqe: u32) -> Result<Arc<dyn CqOps>> {
        let max = self.handle.dev().attr.max_cqe;
        if cqe == 0 || cqe > max {
            return Err(VerbsError::InvalidArgument("CQ size out of range"));
        }
        let runner: Weak<dyn HandlerRunner> = Arc::downgrade(self.handle.dev()) as Weak<DevShared>;
        let shared = CqShared::new(cqe as usize, runner)?;
        Ok(Arc::new(SoftCq {
            shared,
            dev: self.handle.clone(),
        }))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Protection domain ([`PdOps`]).
pub(crate) struct SoftPd {
    pub(crate) id: u32,
    pub(crate) dev: Arc<DevHandle>,
}

impl PdOps for SoftPd {
    fn reg_mr(
        &self,
        buf: Arc<RdmaBuffer>,
        offset: usize,
        len: usize,
        access: AccessFlags,
    ) -> Result<Box<dyn MrOps>> {
        if !buf.contains(offset, len) {
            return Err(VerbsError::InvalidArgument("region outside the buffer"));
        }
        // ibverbs: remote write/atomic access requires local write.
        if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(VerbsError::InvalidArgument(
                "REMOTE_WRITE/REMOTE_ATOMIC need LOCAL_WRITE",
            ));
        }
        // A region a peer writes into (REMOTE_WRITE: SMC-R's RMBs) is made
        // resident now, as ibv_reg_mr pins a region's pages (rxe:
        // ib_umem_get), so that placing a peer's data never waits in a page
        // fault (`crate::resident`). Other regions are left to fault in as
        // they are used: a send buffer is filled by the application first,
        // and a link's receive slots (2 MiB per SMC-R link, most of each
        // 8 KiB slot never used by a 44-byte CDC) would cost their full size
        // per link (`tests/system/smc-scale.sh` counts memory per connection).
        if access.contains(AccessFlags::REMOTE_WRITE) {
            crate::resident::populate(&buf, offset, len);
        }
        let dev = self.dev.dev();
        let entry =
            dev.mrs
                .register(buf, offset, len, access, self.id, dev.attr.max_mr as usize)?;
        Ok(Box::new(SoftMr {
            entry,
            dev: self.dev.clone(),
        }))
    }

    fn create_qp(&self, attr: &QpInitAttr) -> Result<Arc<dyn QpOps>> {
        let handle = &self.dev;
        let dev = handle.dev();
        let cq_of = |cq: &smc_verbs::Cq| -> Result<Arc<CqShared>> {
            let soft =
                cq.0.as_any()
                    .downcast_ref::<SoftCq>()
                    .ok_or(VerbsError::WrongDevice)?;
            if !Arc::ptr_eq(&soft.dev.eng, &handle.eng) {
                return Err(VerbsError::WrongDevice);
            }
            Ok(soft.shared.clone())
        };
        let send_cq = cq_of(&attr.send_cq)?;
        let recv_cq = cq_of(&attr.recv_cq)?;
        let a = &dev.attr;
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
        let (tx_sock, sport) = match crate::net::qp_socket(a.local_addr) {
            Ok((s, port)) => (Some(s), port),
            Err(e) => {
                // E.g. out of file descriptors: still a working QP, only
                // without its own ECMP entropy.
                tracing::warn!(error = %e, "no socket of its own for a QP; sending from the device port");
                dev.stats.qp_socket_errors.fetch_add(1, Ordering::Relaxed);
                (None, dev.local_port)
            }
        };
        let config = QpConfig {
            dev: dev.clone(),
            tx_sock,
            sport,
            pd: self.id,
            send_cq,
            recv_cq,
            cap,
            sig_all: attr.sq_sig_all,
        };
        let shared = handle.eng.add_qp(|qpn| QpShared::new(qpn, config))?;
        Ok(Arc::new(SoftQp {
            shared,
            dev: handle.clone(),
        }))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Memory region handle ([`MrOps`]); dropping it deregisters the region.
pub(crate) struct SoftMr {
    entry: Arc<MrEntry>,
    dev: Arc<DevHandle>,
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        self.dev.dev().mrs.deregister(&self.entry);
    }
}

impl MrOps for SoftMr {
    fn lkey(&self) -> u32 {
        self.entry.key
    }
    fn rkey(&self) -> u32 {
        self.entry.key
    }
    fn addr(&self) -> u64 {
        self.entry.iova
    }
    fn len(&self) -> usize {
        self.entry.len
    }
    fn access(&self) -> AccessFlags {
        self.entry.access
    }
    fn buffer(&self) -> &Arc<RdmaBuffer> {
        &self.entry.buf
    }
}

/// A CQ handle ([`CqOps`]).
pub(crate) struct SoftCq {
    pub(crate) shared: Arc<CqShared>,
    pub(crate) dev: Arc<DevHandle>,
}

impl CqOps for SoftCq {
    fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        self.shared.poll(out)
    }
    fn pending(&self) -> usize {
        self.shared.pending()
    }
    fn capacity(&self) -> usize {
        self.shared.capacity()
    }
    fn req_notify(&self, solicited_only: bool) {
        self.shared.req_notify(solicited_only)
    }
    fn event_fd(&self) -> BorrowedFd<'_> {
        self.shared.event_fd()
    }
    fn ack_events(&self) {
        self.shared.ack_events()
    }
    fn set_handler(&self, handler: Option<CompletionHandler>) {
        self.shared.set_handler(handler)
    }
    fn overflowed(&self) -> bool {
        self.shared.overflowed()
    }
    /// Receives for the device on this thread while it waits, so a
    /// completion costs one wake-up (ours) instead of two (the engine's,
    /// then ours). The engine keeps the timers and stays off the socket
    /// while we are here (see `Engine::enter_driver`).
    fn wait(&self, timeout: Option<Duration>) -> Result<bool> {
        if runs_handlers() {
            // A handler that blocks (it must not) runs on the engine, which
            // may hold the receive path: keep the plain wait there.
            return wait_on_event_fd(self, timeout);
        }
        let eng = &self.dev.eng;
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut driver = eng.enter_driver();
        loop {
            if self.pending() > 0 {
                return Ok(true);
            }
            // Armed while we sleep, so completions other threads add
            // (engine timers, another receiver) make the event fd readable.
            self.req_notify(false);
            if self.pending() > 0 {
                self.shared.disarm();
                return Ok(true);
            }
            let rest = match deadline {
                None => None,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        self.shared.disarm();
                        driver.hand_off();
                        return Ok(false);
                    }
                    Some(d - now)
                }
            };
            let mut pfd = [
                PollFd::new(&eng.dev.sock, PollFlags::IN),
                PollFd::from_borrowed_fd(self.shared.event_fd(), PollFlags::IN),
            ];
            match rustix::event::poll(&mut pfd, poll_timeout(rest).as_ref()) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(std::io::Error::from(e).into()),
            }
            let (sock_ready, event) = (!pfd[0].revents().is_empty(), !pfd[1].revents().is_empty());
            if event {
                self.ack_events();
            }
            // Completions we deliver ourselves need no event (that would
            // cost an eventfd write now and a spurious wake-up next time).
            self.shared.disarm();
            if sock_ready {
                eng.drain_rx();
            }
        }
    }
    fn as_dyn(&self) -> &dyn CqOps {
        self
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The QP handle ([`QpOps`]); dropping it destroys the QP.
pub(crate) struct SoftQp {
    shared: Arc<QpShared>,
    dev: Arc<DevHandle>,
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        self.dev.eng.remove_qp(self.shared.qpn);
    }
}

impl QpOps for SoftQp {
    fn qpn(&self) -> u32 {
        self.shared.qpn
    }
    fn state(&self) -> QpState {
        self.shared.state()
    }
    fn cap(&self) -> QpCap {
        self.shared.cap()
    }
    fn modify_to_init(&self, attr: &InitAttr) -> Result<()> {
        self.shared.modify_to_init(attr)
    }
    fn modify_to_rtr(&self, attr: &RtrAttr) -> Result<()> {
        self.shared.modify_to_rtr(attr)
    }
    fn modify_to_rts(&self, attr: &RtsAttr) -> Result<()> {
        self.shared.modify_to_rts(attr)
    }
    fn modify_to_err(&self) -> Result<()> {
        self.shared.modify_to_err()
    }
    fn modify_to_reset(&self) -> Result<()> {
        self.shared.modify_to_reset()
    }
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        self.shared.post_send(wrs)
    }
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        self.shared.post_recv(wrs)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
