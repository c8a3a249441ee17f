//! Handles and the traits providers implement.
//!
//! Each handle (`Device`, `Pd`, `Mr`, `Cq`, `Qp`) wraps a provider object
//! behind a trait. Dropping the last clone of a handle destroys the object
//! (deregisters the MR, destroys the QP or CQ), as the ibverbs `*_destroy`
//! calls do. Providers keep their own references to whatever their engine
//! needs after that (e.g. to flush or drain).

use std::any::Any;
use std::net::IpAddr;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::mem::RdmaBuffer;
use crate::qp::{InitAttr, QpCap, QpState, RtrAttr, RtsAttr};
use crate::types::{AccessFlags, Gid, Mac, Mtu};
use crate::wc::WorkCompletion;
use crate::wr::{RecvWr, SendWr};

/// Something that opens RDMA devices: the software RoCEv2 RNIC, later
/// libibverbs. The SMC-R core asks it for the device that serves the local
/// IP address of a TCP connection.
pub trait Provider: Send + Sync {
    /// Short provider name ("softroce", "ibverbs", ...).
    fn name(&self) -> &str;
    /// The device bound to `local`, opening it on first use. Several calls
    /// with the same address return the same device.
    fn device_for(&self, local: IpAddr) -> Result<Device>;
    /// Devices opened so far.
    fn devices(&self) -> Vec<Device>;
    /// `Some(name)` when this provider's devices speak a transport that only peers
    /// configured for the same private extension understand (e.g. SMC-R over iWARP, which
    /// RFC 7609 does not define): the SMC-R layer then never offers them on the strength
    /// of the TCP option alone, only to peers it was told opted in too. `None` (the
    /// default) for RoCE.
    fn private_transport(&self) -> Option<&str> {
        None
    }
}

/// Device attributes (ibverbs `ibv_device_attr` + port attributes, reduced
/// to what RoCEv2 RC needs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Device name, e.g. "sroce0".
    pub name: String,
    /// Provider name.
    pub provider: String,
    /// The local IP address the device is bound to.
    pub local_addr: IpAddr,
    /// GID index 0: the IPv4-mapped or IPv6 form of `local_addr`.
    pub gid: Gid,
    /// MAC of the port (the netdev's MAC; a locally administered MAC derived
    /// from the address when the netdev has none, e.g. loopback).
    pub mac: Mac,
    /// Network device carrying the traffic, if known.
    pub netdev: Option<String>,
    /// Largest path MTU the port supports (derived from the netdev MTU).
    pub active_mtu: Mtu,
    /// Maximum number of QPs.
    pub max_qp: u32,
    /// Maximum work requests per queue.
    pub max_qp_wr: u32,
    /// Maximum SGEs per work request.
    pub max_sge: u32,
    /// Maximum CQ entries.
    pub max_cqe: u32,
    /// Maximum number of memory regions.
    pub max_mr: u32,
    /// Maximum inline data per send work request.
    pub max_inline_data: u32,
    /// Maximum outstanding RDMA READ/atomics per QP (both directions).
    pub max_qp_rd_atom: u8,
}

/// Provider side of a device.
pub trait DeviceOps: Send + Sync {
    /// Attributes.
    fn attr(&self) -> &DeviceAttr;
    /// True while the port is up and the progress engine runs.
    fn is_active(&self) -> bool;
    /// True once the device was removed (unplugged, unregistered, fatal error): unlike
    /// a port that is down it never becomes active again, and its user should drop it
    /// and ask the provider anew (a device registered again is a new `Device`).
    fn is_removed(&self) -> bool {
        false
    }
    /// Allocates a protection domain.
    fn alloc_pd(&self) -> Result<Arc<dyn PdOps>>;
    /// Creates a completion queue with room for `cqe` completions.
    fn create_cq(&self, cqe: u32) -> Result<Arc<dyn CqOps>>;
    /// Makes progress on the calling thread until `done()` or `max` passed,
    /// for a consumer about to sleep until a completion handler wakes it:
    /// a provider that can (softroce) receives here and runs the handlers of
    /// the completions it produces on this thread, sparing a thread
    /// wake-up. Returns `done()`; the default does nothing (returns at
    /// once). The caller must hold no lock a handler may take.
    ///
    /// `waker` is the calling thread's [`crate::DriveWaker`] (see there):
    /// the consumer wakes it whenever `done()` may have turned true on
    /// another thread, and the provider returns then instead of sleeping
    /// until a packet or `max` (a completion another thread received has
    /// no packet left for this one to wake on). Without it the provider
    /// notices such a completion only at `max`.
    ///
    /// For the first `spin` of `max` a provider that receives here may look
    /// for packets without sleeping (softroce does, yielding the CPU now and
    /// then): an answer within it costs no wake-up of this thread.
    fn drive(
        &self,
        done: &dyn Fn() -> bool,
        waker: Option<&crate::DriveWaker>,
        max: Duration,
        spin: Duration,
    ) -> bool {
        let _ = (max, waker, spin);
        done()
    }
    /// For downcasting in providers.
    fn as_any(&self) -> &dyn Any;
}

/// An open RDMA device.
#[derive(Clone)]
pub struct Device(pub Arc<dyn DeviceOps>);

impl Device {
    /// The same open device (not merely equal attributes).
    pub fn same(&self, other: &Device) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.0), Arc::as_ptr(&other.0))
    }
    /// Attributes.
    pub fn attr(&self) -> &DeviceAttr {
        self.0.attr()
    }
    /// The port GID (index 0).
    pub fn gid(&self) -> Gid {
        self.0.attr().gid
    }
    /// The port MAC.
    pub fn mac(&self) -> Mac {
        self.0.attr().mac
    }
    /// Device name.
    pub fn name(&self) -> &str {
        &self.0.attr().name
    }
    /// True while usable.
    pub fn is_active(&self) -> bool {
        self.0.is_active()
    }
    /// True once the device was removed for good (see [`DeviceOps::is_removed`]).
    pub fn is_removed(&self) -> bool {
        self.0.is_removed()
    }
    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<Pd> {
        Ok(Pd(self.0.alloc_pd()?))
    }
    /// Creates a completion queue.
    pub fn create_cq(&self, cqe: u32) -> Result<Cq> {
        Ok(Cq(self.0.create_cq(cqe)?))
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.attr().name)
            .field("gid", &self.attr().gid)
            .finish()
    }
}

/// Provider side of a protection domain.
pub trait PdOps: Send + Sync {
    /// Registers `len` bytes of `buf` starting at `offset`. The provider
    /// chooses the region's I/O virtual address ([`MrOps::addr`]; as with
    /// `ibv_reg_mr_iova`), which must not be the buffer's address in the
    /// process and must keep `offset`'s alignment within a page (8-byte
    /// aligned atomic targets).
    fn reg_mr(
        &self,
        buf: Arc<RdmaBuffer>,
        offset: usize,
        len: usize,
        access: AccessFlags,
    ) -> Result<Box<dyn MrOps>>;
    /// Creates an RC queue pair in RESET.
    fn create_qp(&self, attr: &QpInitAttr) -> Result<Arc<dyn QpOps>>;
    /// For downcasting in providers.
    fn as_any(&self) -> &dyn Any;
}

/// A protection domain. RFC 7609 §2.1 requires one per SMC-R link so that
/// no other peer can reach a link group's RMBs.
#[derive(Clone)]
pub struct Pd(pub Arc<dyn PdOps>);

impl Pd {
    /// Registers a whole buffer.
    pub fn reg_mr(&self, buf: &Arc<RdmaBuffer>, access: AccessFlags) -> Result<Mr> {
        Ok(Mr(Arc::from(self.0.reg_mr(
            buf.clone(),
            0,
            buf.len(),
            access,
        )?)))
    }
    /// Registers part of a buffer.
    pub fn reg_mr_range(
        &self,
        buf: &Arc<RdmaBuffer>,
        offset: usize,
        len: usize,
        access: AccessFlags,
    ) -> Result<Mr> {
        Ok(Mr(Arc::from(self.0.reg_mr(
            buf.clone(),
            offset,
            len,
            access,
        )?)))
    }
    /// Creates an RC queue pair (state RESET).
    pub fn create_qp(&self, attr: &QpInitAttr) -> Result<Qp> {
        Ok(Qp(self.0.create_qp(attr)?))
    }
}

/// Provider side of a memory region. Dropping it deregisters the region:
/// afterwards its keys are invalid and later requests naming them fail with
/// a protection or remote access error.
pub trait MrOps: Send + Sync {
    /// Local key (for SGEs).
    fn lkey(&self) -> u32;
    /// Remote key (for peers' RDMA requests).
    fn rkey(&self) -> u32;
    /// I/O virtual address of the first byte: the address space of this
    /// region's SGEs and of peers' RDMA requests (not a process address).
    fn addr(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True for a zero-length region.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Access rights.
    fn access(&self) -> AccessFlags;
    /// The buffer the region lies in.
    fn buffer(&self) -> &Arc<RdmaBuffer>;
}

/// A registered memory region.
#[derive(Clone)]
pub struct Mr(pub Arc<dyn MrOps>);

impl Mr {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.0.lkey()
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.0.rkey()
    }
    /// I/O virtual address of the first byte: what local SGEs ([`Mr::sge`])
    /// and peers (RDMA WRITE/READ/atomic `remote_addr`, SMC-R's advertised
    /// RMB address) use. Chosen by the provider at registration, never the
    /// buffer's address in the process, so handing it to a peer reveals
    /// nothing of our address-space layout.
    pub fn addr(&self) -> u64 {
        self.0.addr()
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// True for an empty region.
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }
    /// Access rights.
    pub fn access(&self) -> AccessFlags {
        self.0.access()
    }
    /// The underlying buffer.
    pub fn buffer(&self) -> &Arc<RdmaBuffer> {
        self.0.buffer()
    }
    /// An SGE covering `len` bytes at `offset` inside this region.
    pub fn sge(&self, offset: usize, len: u32) -> crate::wr::Sge {
        crate::wr::Sge {
            addr: self.addr() + offset as u64,
            length: len,
            lkey: self.lkey(),
        }
    }
}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .finish()
    }
}

/// Called by the provider, from one of its own threads, when an armed CQ
/// fires. It must be short and must not block: typically it wakes a thread
/// or processes a few completions.
pub type CompletionHandler = Arc<dyn Fn() + Send + Sync>;

/// Provider side of a completion queue.
///
/// Notification follows ibverbs: [`CqOps::req_notify`] arms the CQ once;
/// the next completion added (only a solicited one, if asked) fires it,
/// which makes [`CqOps::event_fd`] readable and calls the handler, then
/// disarms. The consumer acknowledges with [`CqOps::ack_events`], re-arms
/// and polls again to catch completions that raced with the re-arm.
pub trait CqOps: Send + Sync {
    /// Moves up to `out.len()` completions into `out`; returns how many.
    fn poll(&self, out: &mut [WorkCompletion]) -> usize;
    /// Number of completions waiting to be polled.
    fn pending(&self) -> usize;
    /// Capacity in completions.
    fn capacity(&self) -> usize;
    /// Arms the CQ. If completions (solicited ones, with `solicited_only`)
    /// are already waiting it fires at once.
    fn req_notify(&self, solicited_only: bool);
    /// A file descriptor (eventfd) that is readable after the CQ fired and
    /// until [`CqOps::ack_events`].
    fn event_fd(&self) -> BorrowedFd<'_>;
    /// Clears the readable state of the event fd.
    fn ack_events(&self);
    /// Installs (or removes) the handler called when the CQ fires.
    fn set_handler(&self, handler: Option<CompletionHandler>);
    /// True if the CQ overflowed (a completion was lost); the QPs using it
    /// are then moved to the error state, as IBA requires.
    fn overflowed(&self) -> bool;
    /// Blocks until at least one completion is waiting or `timeout` passes;
    /// true if completions are waiting. The default arms the CQ and sleeps
    /// on [`CqOps::event_fd`]; a provider may instead make progress on the
    /// calling thread (e.g. receive packets itself) as long as the
    /// observable semantics stay the same.
    fn wait(&self, timeout: Option<Duration>) -> Result<bool> {
        wait_on_event_fd(self.as_dyn(), timeout)
    }
    /// `self` as a trait object (for the default [`CqOps::wait`]).
    fn as_dyn(&self) -> &dyn CqOps;
    /// For downcasting in providers.
    fn as_any(&self) -> &dyn Any;
}

/// A completion queue.
#[derive(Clone)]
pub struct Cq(pub Arc<dyn CqOps>);

impl Cq {
    /// Polls up to `out.len()` completions.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        self.0.poll(out)
    }
    /// Completions waiting.
    pub fn pending(&self) -> usize {
        self.0.pending()
    }
    /// Arms notification.
    pub fn req_notify(&self, solicited_only: bool) {
        self.0.req_notify(solicited_only)
    }
    /// The event fd (readable after the CQ fired).
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        self.0.event_fd()
    }
    /// Acknowledges fired events.
    pub fn ack_events(&self) {
        self.0.ack_events()
    }
    /// Installs the completion handler.
    pub fn set_handler(&self, handler: Option<CompletionHandler>) {
        self.0.set_handler(handler)
    }

    /// Blocks until at least one completion is waiting or `timeout` passes.
    /// Returns true if completions are waiting. Uses the event fd, so it
    /// must not be mixed with another consumer of the same CQ's events.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<bool> {
        self.0.wait(timeout)
    }
}

/// [`CqOps::wait`]'s default: arm, re-check, sleep on the event fd.
pub fn wait_on_event_fd(cq: &dyn CqOps, timeout: Option<Duration>) -> Result<bool> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        if cq.pending() > 0 {
            return Ok(true);
        }
        cq.req_notify(false);
        if cq.pending() > 0 {
            return Ok(true);
        }
        let rest = match deadline {
            None => None,
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return Ok(false);
                }
                Some(d - now)
            }
        };
        crate::event::wait_readable(cq.event_fd(), rest)?;
        cq.ack_events();
    }
}

/// Creation attributes of a reliable-connected QP.
#[derive(Clone)]
pub struct QpInitAttr {
    /// CQ for send completions.
    pub send_cq: Cq,
    /// CQ for receive completions.
    pub recv_cq: Cq,
    /// Queue capacities.
    pub cap: QpCap,
    /// Signal every send work request, regardless of `SIGNALED`.
    pub sq_sig_all: bool,
}

/// Provider side of an RC queue pair.
pub trait QpOps: Send + Sync {
    /// QP number (24 bits).
    fn qpn(&self) -> u32;
    /// Current state.
    fn state(&self) -> QpState;
    /// Capacities granted at creation.
    fn cap(&self) -> QpCap;
    /// RESET → INIT (or INIT → INIT).
    fn modify_to_init(&self, attr: &InitAttr) -> Result<()>;
    /// INIT → RTR.
    fn modify_to_rtr(&self, attr: &RtrAttr) -> Result<()>;
    /// RTR → RTS.
    fn modify_to_rts(&self, attr: &RtsAttr) -> Result<()>;
    /// Any → ERR: outstanding work requests are flushed.
    fn modify_to_err(&self) -> Result<()>;
    /// Any → RESET: queues are emptied without completions.
    fn modify_to_reset(&self) -> Result<()>;
    /// Posts send work requests, in order. Either all are accepted or an
    /// error is returned and none are.
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()>;
    /// Posts receive work requests, in order; all or none.
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()>;
    /// For downcasting in providers.
    fn as_any(&self) -> &dyn Any;
}

/// A reliable-connected queue pair.
#[derive(Clone)]
pub struct Qp(pub Arc<dyn QpOps>);

impl Qp {
    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.0.qpn()
    }
    /// Current state.
    pub fn state(&self) -> QpState {
        self.0.state()
    }
    /// Capacities.
    pub fn cap(&self) -> QpCap {
        self.0.cap()
    }
    /// RESET → INIT.
    pub fn modify_to_init(&self, attr: &InitAttr) -> Result<()> {
        self.0.modify_to_init(attr)
    }
    /// INIT → RTR.
    pub fn modify_to_rtr(&self, attr: &RtrAttr) -> Result<()> {
        self.0.modify_to_rtr(attr)
    }
    /// RTR → RTS.
    pub fn modify_to_rts(&self, attr: &RtsAttr) -> Result<()> {
        self.0.modify_to_rts(attr)
    }
    /// → ERR.
    pub fn modify_to_err(&self) -> Result<()> {
        self.0.modify_to_err()
    }
    /// → RESET.
    pub fn modify_to_reset(&self) -> Result<()> {
        self.0.modify_to_reset()
    }
    /// Posts one send work request.
    pub fn post_send(&self, wr: &SendWr<'_>) -> Result<()> {
        self.0.post_send(std::slice::from_ref(wr))
    }
    /// Posts several send work requests in order (all or none).
    pub fn post_send_batch(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        self.0.post_send(wrs)
    }
    /// Posts one receive work request.
    pub fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        self.0.post_recv(std::slice::from_ref(wr))
    }
    /// Posts several receive work requests (all or none).
    pub fn post_recv_batch(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        self.0.post_recv(wrs)
    }
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &format_args!("{:#x}", self.qpn()))
            .field("state", &self.state())
            .finish()
    }
}
