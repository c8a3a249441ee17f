//! Devices, protection domains, memory regions, completion queues and RC queue pairs
//! over libibverbs, implementing the `smc-verbs` provider traits.
//!
//! One [`Ctx`] per RDMA device (an `ibv_context`) owns one completion channel shared by
//! all its CQs and one event thread. The thread sleeps in poll(2) on the channel, the
//! context's async-event fd and a stop eventfd, so nothing spins: a CQ fires when the
//! provider signals its completion channel (after `ibv_req_notify_cq`), and the thread
//! then makes the CQ's own eventfd readable and runs its handler, which is the
//! `smc-verbs` notification model. Async events feed failure handling: a port going down
//! or a fatal device error marks the device inactive and moves every QP to ERR, so their
//! work requests are flushed and the SMC-R link above sees the failure (as Linux SMC's
//! `smc_ib_global_event_handler` → `smcr_port_err` takes the links of the port down).

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void, CStr};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;

use smc_verbs::{
    AccessFlags, CompletionHandler, CqOps, DeviceAttr, DeviceOps, InitAttr, MrOps, PdOps, QpCap,
    QpInitAttr, QpOps, QpState, RdmaBuffer, RecvWr, Result, RtrAttr, RtsAttr, SendFlags, SendOp,
    SendWr, VerbsError, WcOpcode, WcStatus, WorkCompletion,
};
use tracing::{debug, error, info, warn};

use crate::ffi::{self, Api};
use crate::sysfs::Placement;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn errno_error(what: &'static str, rc: c_int) -> VerbsError {
    // libibverbs returns the errno as a positive value (post/modify) or sets errno
    // (creation calls returning NULL).
    let code = if rc > 0 {
        rc
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    };
    match code {
        libc::ENOMEM => VerbsError::QueueFull,
        libc::EINVAL => VerbsError::InvalidArgument(what),
        _ => VerbsError::Io(std::io::Error::other(format!(
            "{what}: {}",
            std::io::Error::from_raw_os_error(code)
        ))),
    }
}

fn new_eventfd() -> Result<OwnedFd> {
    // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: `fd` is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn signal(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a valid u64 to an eventfd.
    unsafe { libc::write(fd, &one as *const u64 as *const c_void, 8) };
}

fn drain(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a valid u64 from a non-blocking eventfd (EAGAIN is fine).
    unsafe { libc::read(fd, &mut v as *mut u64 as *mut c_void, 8) };
}

fn set_nonblocking(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor owned by libibverbs; only the O_NONBLOCK flag changes,
    // which rdma-core documents for the completion channel and async fds.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if fl < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// State the event thread shares with the objects of one context.
struct Shared {
    /// False after a port error or a fatal device error (until the port is active again).
    active: AtomicBool,
    /// CQs by the id stored in their `cq_context`.
    cqs: Mutex<HashMap<u64, Weak<CqInner>>>,
    /// QPs by number.
    qps: Mutex<HashMap<u32, Weak<QpInner>>>,
    /// CQs whose handler the thread must run (armed while completions were waiting).
    deferred: Mutex<Vec<u64>>,
    next_cq: AtomicU64,
    /// Wakes the thread (deferred handlers) or stops it (`stop`).
    wake: OwnedFd,
    stop: AtomicBool,
}

/// An open `ibv_context`.
pub(crate) struct Ctx {
    api: &'static Api,
    ctx: *mut ffi::ibv_context,
    channel: *mut ffi::ibv_comp_channel,
    pub(crate) name: String,
    pub(crate) dev_attr: ffi::ibv_device_attr,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

// SAFETY: libibverbs contexts and channels may be used from any thread (rdma-core
// documents every verb as thread-safe); the raw pointers stay valid until `Drop`.
unsafe impl Send for Ctx {}
// SAFETY: as above.
unsafe impl Sync for Ctx {}

impl Ctx {
    /// Opens the device named `name`.
    pub(crate) fn open(api: &'static Api, name: &str) -> Result<Arc<Ctx>> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the list is freed below.
        let list = unsafe { (api.get_device_list)(&mut n) };
        if list.is_null() {
            return Err(VerbsError::DeviceGone(format!(
                "ibv_get_device_list failed: {}",
                std::io::Error::last_os_error()
            )));
        }
        let mut ctx = std::ptr::null_mut();
        for i in 0..n.max(0) as usize {
            // SAFETY: `list` has `n` valid entries.
            let d = unsafe { *list.add(i) };
            // SAFETY: `d` is a device of the list; the name is a NUL-terminated string
            // owned by it.
            let dn = unsafe { CStr::from_ptr((api.get_device_name)(d)) };
            if dn.to_bytes() == name.as_bytes() {
                // SAFETY: `d` is valid until the list is freed; the context outlives it.
                ctx = unsafe { (api.open_device)(d) };
                break;
            }
        }
        // SAFETY: frees the list from ibv_get_device_list (opened contexts stay valid).
        unsafe { (api.free_device_list)(list) };
        if ctx.is_null() {
            return Err(VerbsError::DeviceGone(format!(
                "libibverbs cannot open {name} (no user-space provider for it, or no permission on /dev/infiniband)"
            )));
        }
        // SAFETY: `ibv_device_attr` is plain data; zero is a valid value.
        let mut dev_attr: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid context and out-pointer.
        let rc = unsafe { (api.query_device)(ctx, &mut dev_attr) };
        let fail = |what: &'static str, rc: c_int| {
            let e = errno_error(what, rc);
            // SAFETY: closing the context we opened above, nothing else uses it yet.
            unsafe { (api.close_device)(ctx) };
            e
        };
        if rc != 0 {
            return Err(fail("ibv_query_device", rc));
        }
        // SAFETY: valid context.
        let channel = unsafe { (api.create_comp_channel)(ctx) };
        if channel.is_null() {
            return Err(fail("ibv_create_comp_channel", 0));
        }
        // SAFETY: `channel` and `ctx` are valid; the fds belong to them.
        let (cfd, afd) = unsafe { ((*channel).fd, (*ctx).async_fd) };
        let wake = new_eventfd()?;
        if let Err(e) = set_nonblocking(cfd).and_then(|_| set_nonblocking(afd)) {
            // SAFETY: destroying what we created above.
            unsafe { (api.destroy_comp_channel)(channel) };
            let _ = fail("fcntl", 0);
            return Err(e.into());
        }
        let shared = Arc::new(Shared {
            active: AtomicBool::new(true),
            cqs: Mutex::new(HashMap::new()),
            qps: Mutex::new(HashMap::new()),
            deferred: Mutex::new(Vec::new()),
            next_cq: AtomicU64::new(1),
            wake,
            stop: AtomicBool::new(false),
        });
        let c = Arc::new(Ctx {
            api,
            ctx,
            channel,
            name: name.to_string(),
            dev_attr,
            shared: shared.clone(),
            thread: Mutex::new(None),
        });
        let th = EventThread {
            api,
            ctx: ctx as usize,
            channel: channel as usize,
            shared,
            name: name.to_string(),
        };
        let h = std::thread::Builder::new()
            .name(format!("ibv-{name}"))
            .spawn(move || th.run())
            .map_err(VerbsError::Io)?;
        *lock(&c.thread) = Some(h);
        Ok(c)
    }

    pub(crate) fn query_port(&self, port: u8) -> Result<ffi::ibv_port_attr> {
        let mut pa = ffi::ibv_port_attr::default();
        // SAFETY: valid context; `pa` is large enough for the compat struct the exported
        // ibv_query_port fills.
        let rc = unsafe { (self.api.query_port)(self.ctx, port, &mut pa) };
        if rc != 0 {
            return Err(errno_error("ibv_query_port", rc));
        }
        Ok(pa)
    }

    pub(crate) fn query_gid(&self, port: u8, index: u32) -> Result<[u8; 16]> {
        let mut g = [0u8; 16];
        // SAFETY: valid context, 16-byte out buffer (union ibv_gid).
        let rc = unsafe { (self.api.query_gid)(self.ctx, port, index as c_int, &mut g) };
        if rc != 0 {
            return Err(errno_error("ibv_query_gid", rc));
        }
        Ok(g)
    }

    fn is_active(&self) -> bool {
        self.shared.active.load(Ordering::Acquire)
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        signal(self.shared.wake.as_raw_fd());
        if let Some(h) = lock(&self.thread).take() {
            let _ = h.join();
        }
        // SAFETY: every CQ (they hold an Arc<Ctx>) is gone, so the channel is unused;
        // the thread that polled it has exited.
        unsafe {
            (self.api.destroy_comp_channel)(self.channel);
            (self.api.close_device)(self.ctx);
        }
    }
}

/// The per-context thread: completion channel, async events, deferred handlers.
struct EventThread {
    api: &'static Api,
    ctx: usize,
    channel: usize,
    shared: Arc<Shared>,
    name: String,
}

impl EventThread {
    fn run(self) {
        let ctx = self.ctx as *mut ffi::ibv_context;
        let channel = self.channel as *mut ffi::ibv_comp_channel;
        // SAFETY: both stay valid until Ctx::drop joined this thread.
        let (cfd, afd) = unsafe { ((*channel).fd, (*ctx).async_fd) };
        let wfd = self.shared.wake.as_raw_fd();
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: cfd,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: afd,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: wfd,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: three valid pollfds for the duration of the call.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), 3, -1) };
            if rc < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                error!(device = %self.name, error = %e, "poll failed; event thread stops");
                return;
            }
            if self.shared.stop.load(Ordering::Acquire) {
                return;
            }
            if fds[2].revents != 0 {
                drain(wfd);
                let ids = std::mem::take(&mut *lock(&self.shared.deferred));
                for id in ids {
                    self.fire(id);
                }
            }
            if fds[0].revents != 0 {
                self.completion_events(channel);
            }
            if fds[1].revents != 0 {
                self.async_events(ctx);
            }
        }
    }

    fn fire(&self, id: u64) {
        let cq = lock(&self.shared.cqs).get(&id).and_then(Weak::upgrade);
        if let Some(cq) = cq {
            cq.fire();
        }
    }

    fn completion_events(&self, channel: *mut ffi::ibv_comp_channel) {
        loop {
            let mut cq: *mut ffi::ibv_cq = std::ptr::null_mut();
            let mut cq_ctx: *mut c_void = std::ptr::null_mut();
            // SAFETY: valid channel (non-blocking), valid out-pointers.
            if unsafe { (self.api.get_cq_event)(channel, &mut cq, &mut cq_ctx) } != 0 {
                return; // EAGAIN: nothing more
            }
            // Acknowledge at once: ibv_destroy_cq waits for every event it reported to
            // be acknowledged, and the CQ stays valid until then.
            // SAFETY: `cq` came from ibv_get_cq_event and is valid until acknowledged.
            unsafe { (self.api.ack_cq_events)(cq, 1) };
            self.fire(cq_ctx as u64);
        }
    }

    fn async_events(&self, ctx: *mut ffi::ibv_context) {
        loop {
            let mut ev = ffi::ibv_async_event {
                element: std::ptr::null_mut(),
                event_type: 0,
            };
            // SAFETY: valid context (non-blocking async fd), valid out-pointer.
            if unsafe { (self.api.get_async_event)(ctx, &mut ev) } != 0 {
                return;
            }
            // SAFETY: libibverbs returns a static string for any event type.
            let what = unsafe { CStr::from_ptr((self.api.event_type_str)(ev.event_type)) }
                .to_string_lossy()
                .into_owned();
            let mut flush_all = false;
            match ev.event_type {
                ffi::IBV_EVENT_QP_FATAL
                | ffi::IBV_EVENT_QP_REQ_ERR
                | ffi::IBV_EVENT_QP_ACCESS_ERR => {
                    // SAFETY: for QP events `element` is the QP, valid until the event is
                    // acknowledged below.
                    let qpn = unsafe { (*(ev.element as *mut ffi::ibv_qp)).qp_num };
                    warn!(device = %self.name, qpn, event = %what, "QP error");
                    if let Some(qp) = lock(&self.shared.qps).get(&qpn).and_then(Weak::upgrade) {
                        *lock(&qp.state) = QpState::Err;
                    }
                }
                ffi::IBV_EVENT_CQ_ERR => {
                    // SAFETY: for CQ events `element` is the CQ, valid until acknowledged.
                    let id = unsafe { (*(ev.element as *mut ffi::ibv_cq)).cq_context } as u64;
                    error!(device = %self.name, event = %what, "CQ overrun: completions lost");
                    if let Some(cq) = lock(&self.shared.cqs).get(&id).and_then(Weak::upgrade) {
                        cq.overflowed.store(true, Ordering::Release);
                        cq.fire();
                    }
                }
                ffi::IBV_EVENT_PORT_ERR | ffi::IBV_EVENT_DEVICE_FATAL => {
                    error!(device = %self.name, event = %what, "device unusable: failing its QPs");
                    self.shared.active.store(false, Ordering::Release);
                    flush_all = true;
                }
                ffi::IBV_EVENT_PORT_ACTIVE => {
                    info!(device = %self.name, event = %what, "port active again");
                    self.shared.active.store(true, Ordering::Release);
                }
                _ => debug!(device = %self.name, event = %what, "async event"),
            }
            // SAFETY: acknowledging the event we got above, exactly once.
            unsafe { (self.api.ack_async_event)(&mut ev) };
            if flush_all {
                let qps: Vec<Arc<QpInner>> = lock(&self.shared.qps)
                    .values()
                    .filter_map(Weak::upgrade)
                    .collect();
                for qp in qps {
                    if let Err(e) = qp.modify_to_err() {
                        debug!(qpn = qp.qpn, error = %e, "QP to ERR after a device error");
                    }
                }
            }
        }
    }
}

/// An address served by a device port: what `Provider::device_for` returns.
pub(crate) struct DevInner {
    ctx: Arc<Ctx>,
    attr: DeviceAttr,
    port: u8,
    gid_index: u8,
}

impl DevInner {
    pub(crate) fn new(
        ctx: Arc<Ctx>,
        place: &Placement,
        local: IpAddr,
        mac: smc_verbs::Mac,
    ) -> Result<DevInner> {
        let pa = ctx.query_port(place.port)?;
        if pa.link_layer != ffi::IBV_LINK_LAYER_ETHERNET {
            return Err(VerbsError::DeviceGone(format!(
                "{} port {} is not RoCE (link layer {})",
                ctx.name, place.port, pa.link_layer
            )));
        }
        let gid_index = u8::try_from(place.gid.index)
            .map_err(|_| VerbsError::InvalidArgument("GID index above 255"))?;
        // The GID libibverbs reports must be the one sysfs named (a table change in
        // between would make every QP of this address send from a wrong source).
        let g = ctx.query_gid(place.port, place.gid.index)?;
        if g != place.gid.gid.0 {
            return Err(VerbsError::DeviceGone(format!(
                "{} GID {} changed while opening",
                ctx.name, place.gid.index
            )));
        }
        let active_mtu = smc_verbs::Mtu::from_enum(pa.active_mtu as u8).ok_or(
            VerbsError::InvalidArgument("port reports no valid active MTU"),
        )?;
        let da = &ctx.dev_attr;
        let clamp = |v: c_int| v.max(0) as u32;
        let attr = DeviceAttr {
            name: ctx.name.clone(),
            provider: "ibverbs".to_string(),
            local_addr: local,
            gid: smc_verbs::Gid::from_ip(local),
            mac,
            netdev: place.gid.ndev.clone(),
            active_mtu,
            max_qp: clamp(da.max_qp),
            max_qp_wr: clamp(da.max_qp_wr),
            max_sge: clamp(da.max_sge),
            max_cqe: clamp(da.max_cqe),
            max_mr: clamp(da.max_mr),
            max_inline_data: 0,
            max_qp_rd_atom: da.max_qp_rd_atom.clamp(0, 255) as u8,
        };
        let mut d = DevInner {
            ctx,
            attr,
            port: place.port,
            gid_index,
        };
        d.attr.max_inline_data = d.probe_inline();
        Ok(d)
    }

    /// libibverbs reports no inline limit in the device attributes; the largest value a
    /// QP can be created with is found by trying (rxe: several hundred bytes).
    fn probe_inline(&self) -> u32 {
        let Ok(pd) = PdInner::alloc(self) else {
            return 0;
        };
        let Ok(cq) = CqInner::create(&self.ctx, 4) else {
            return 0;
        };
        for want in [256u32, 128, 64, 32] {
            let mut ia = ffi::ibv_qp_init_attr {
                qp_context: std::ptr::null_mut(),
                send_cq: cq.cq,
                recv_cq: cq.cq,
                srq: std::ptr::null_mut(),
                cap: ffi::ibv_qp_cap {
                    max_send_wr: 1,
                    max_recv_wr: 1,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: want,
                },
                qp_type: ffi::IBV_QPT_RC,
                sq_sig_all: 0,
            };
            // SAFETY: valid PD and CQ, valid attributes.
            let qp = unsafe { (self.ctx.api.create_qp)(pd.pd, &mut ia) };
            if !qp.is_null() {
                // SAFETY: destroying the QP created just above.
                unsafe { (self.ctx.api.destroy_qp)(qp) };
                return want;
            }
        }
        0
    }
}

impl DeviceOps for DevInner {
    fn attr(&self) -> &DeviceAttr {
        &self.attr
    }
    fn is_active(&self) -> bool {
        self.ctx.is_active()
    }
    fn alloc_pd(&self) -> Result<Arc<dyn PdOps>> {
        if !self.ctx.is_active() {
            return Err(VerbsError::DeviceGone(format!("{} is down", self.ctx.name)));
        }
        Ok(Arc::new(PdInner::alloc(self)?))
    }
    fn create_cq(&self, cqe: u32) -> Result<Arc<dyn CqOps>> {
        Ok(CqInner::create(&self.ctx, cqe)?)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The `ibv_pd` itself, shared by the PD handle and every MR and QP in it: ibverbs
/// refuses to deallocate a PD that still has objects (EBUSY), whatever order the handles
/// are dropped in.
struct PdRaw {
    ctx: Arc<Ctx>,
    pd: *mut ffi::ibv_pd,
}

// SAFETY: ibv_pd may be used from any thread; the pointer is valid until Drop.
unsafe impl Send for PdRaw {}
// SAFETY: as above.
unsafe impl Sync for PdRaw {}

impl Drop for PdRaw {
    fn drop(&mut self) {
        // SAFETY: every MR and QP of this PD holds an Arc to it, so none is left.
        let rc = unsafe { (self.ctx.api.dealloc_pd)(self.pd) };
        if rc != 0 {
            warn!(rc, "ibv_dealloc_pd failed");
        }
    }
}

struct PdInner {
    raw: Arc<PdRaw>,
    ctx: Arc<Ctx>,
    pd: *mut ffi::ibv_pd,
    port: u8,
    gid_index: u8,
}

// SAFETY: as PdRaw.
unsafe impl Send for PdInner {}
// SAFETY: as PdRaw.
unsafe impl Sync for PdInner {}

impl PdInner {
    fn alloc(d: &DevInner) -> Result<PdInner> {
        // SAFETY: valid context.
        let pd = unsafe { (d.ctx.api.alloc_pd)(d.ctx.ctx) };
        if pd.is_null() {
            return Err(errno_error("ibv_alloc_pd", 0));
        }
        Ok(PdInner {
            raw: Arc::new(PdRaw {
                ctx: d.ctx.clone(),
                pd,
            }),
            ctx: d.ctx.clone(),
            pd,
            port: d.port,
            gid_index: d.gid_index,
        })
    }
}

fn access_bits(a: AccessFlags) -> c_int {
    // The smc-verbs flags have the IBV_ACCESS_* values (LOCAL_WRITE=1, REMOTE_WRITE=2,
    // REMOTE_READ=4, REMOTE_ATOMIC=8).
    a.bits() as c_int
}

impl PdOps for PdInner {
    fn reg_mr(
        &self,
        buf: Arc<RdmaBuffer>,
        offset: usize,
        len: usize,
        access: AccessFlags,
    ) -> Result<Box<dyn MrOps>> {
        if !buf.contains(offset, len) {
            return Err(VerbsError::InvalidArgument("MR range outside the buffer"));
        }
        // IBA §10.6.3.1 (as ibverbs): remote write/atomic need local write.
        if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(VerbsError::InvalidArgument(
                "REMOTE_WRITE/REMOTE_ATOMIC need LOCAL_WRITE",
            ));
        }
        // SAFETY: the range lies inside `buf`, which the MR keeps alive (Arc) until it
        // is deregistered; the I/O virtual address is the buffer address.
        let mr = unsafe {
            (self.ctx.api.reg_mr)(
                self.pd,
                buf.as_ptr().add(offset) as *mut c_void,
                len,
                access_bits(access),
            )
        };
        if mr.is_null() {
            return Err(errno_error("ibv_reg_mr", 0));
        }
        // SAFETY: `mr` is a valid MR returned above.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(Box::new(MrInner {
            _pd: self.raw.clone(),
            ctx: self.ctx.clone(),
            mr,
            lkey,
            rkey,
            addr: buf.addr() + offset as u64,
            len,
            access,
            buf,
        }))
    }

    fn create_qp(&self, attr: &QpInitAttr) -> Result<Arc<dyn QpOps>> {
        let scq = attr
            .send_cq
            .0
            .as_any()
            .downcast_ref::<CqInner>()
            .ok_or(VerbsError::WrongDevice)?;
        let rcq = attr
            .recv_cq
            .0
            .as_any()
            .downcast_ref::<CqInner>()
            .ok_or(VerbsError::WrongDevice)?;
        if !Arc::ptr_eq(&scq.ctx, &self.ctx) || !Arc::ptr_eq(&rcq.ctx, &self.ctx) {
            return Err(VerbsError::WrongDevice);
        }
        let mut ia = ffi::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: scq.cq,
            recv_cq: rcq.cq,
            srq: std::ptr::null_mut(),
            cap: ffi::ibv_qp_cap {
                max_send_wr: attr.cap.max_send_wr,
                max_recv_wr: attr.cap.max_recv_wr,
                max_send_sge: attr.cap.max_send_sge,
                max_recv_sge: attr.cap.max_recv_sge,
                max_inline_data: attr.cap.max_inline_data,
            },
            qp_type: ffi::IBV_QPT_RC,
            sq_sig_all: attr.sq_sig_all as c_int,
        };
        // SAFETY: valid PD and CQs of this context; `ia` is fully initialised.
        let qp = unsafe { (self.ctx.api.create_qp)(self.pd, &mut ia) };
        if qp.is_null() {
            return Err(match errno_error("ibv_create_qp", 0) {
                VerbsError::QueueFull => VerbsError::ResourceExhausted("QP"),
                e => e,
            });
        }
        // SAFETY: valid QP; the fast-path functions live in its context's ops table.
        let (qpn, ops) = unsafe { ((*qp).qp_num, &(*(*qp).context).ops) };
        let (Some(post_send), Some(post_recv)) = (ops.post_send, ops.post_recv) else {
            // SAFETY: destroying the QP created above.
            unsafe { (self.ctx.api.destroy_qp)(qp) };
            return Err(VerbsError::DeviceGone("provider has no post_send".into()));
        };
        let inner = Arc::new(QpInner {
            _pd: self.raw.clone(),
            ctx: self.ctx.clone(),
            qp,
            qpn,
            // ibv_create_qp writes the granted capacities back into `ia.cap`.
            cap: QpCap {
                max_send_wr: ia.cap.max_send_wr,
                max_recv_wr: ia.cap.max_recv_wr,
                max_send_sge: ia.cap.max_send_sge,
                max_recv_sge: ia.cap.max_recv_sge,
                max_inline_data: ia.cap.max_inline_data,
            },
            state: Mutex::new(QpState::Reset),
            post_send,
            post_recv,
            port: self.port,
            gid_index: self.gid_index,
            _cqs: (attr.send_cq.clone(), attr.recv_cq.clone()),
        });
        lock(&self.ctx.shared.qps).insert(qpn, Arc::downgrade(&inner));
        Ok(inner)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct MrInner {
    /// Dropped after the MR is deregistered (fields drop after `Drop::drop`).
    _pd: Arc<PdRaw>,
    ctx: Arc<Ctx>,
    mr: *mut ffi::ibv_mr,
    lkey: u32,
    rkey: u32,
    addr: u64,
    len: usize,
    access: AccessFlags,
    buf: Arc<RdmaBuffer>,
}

// SAFETY: ibv_mr may be used from any thread; the pointer is valid until Drop.
unsafe impl Send for MrInner {}
// SAFETY: as above.
unsafe impl Sync for MrInner {}

impl Drop for MrInner {
    fn drop(&mut self) {
        // SAFETY: deregistering the MR registered in `reg_mr`, once; the buffer is still
        // mapped (we hold an Arc to it).
        let rc = unsafe { (self.ctx.api.dereg_mr)(self.mr) };
        if rc != 0 {
            warn!(rc, "ibv_dereg_mr failed");
        }
    }
}

impl MrOps for MrInner {
    fn lkey(&self) -> u32 {
        self.lkey
    }
    fn rkey(&self) -> u32 {
        self.rkey
    }
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn access(&self) -> AccessFlags {
        self.access
    }
    fn buffer(&self) -> &Arc<RdmaBuffer> {
        &self.buf
    }
}

/// Completions polled from the hardware CQ per call.
const POLL_BATCH: usize = 16;

struct CqInner {
    ctx: Arc<Ctx>,
    cq: *mut ffi::ibv_cq,
    id: u64,
    cap: usize,
    poll_fn: ffi::PollCqFn,
    notify_fn: ffi::ReqNotifyCqFn,
    /// Completions taken from the hardware CQ by `pending` but not yet polled.
    buf: Mutex<VecDeque<WorkCompletion>>,
    efd: OwnedFd,
    handler: Mutex<Option<CompletionHandler>>,
    overflowed: AtomicBool,
}

// SAFETY: ibv_cq may be polled and armed from any thread (rdma-core providers lock
// internally); the pointer is valid until Drop.
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl CqInner {
    fn create(ctx: &Arc<Ctx>, cqe: u32) -> Result<Arc<CqInner>> {
        let id = ctx.shared.next_cq.fetch_add(1, Ordering::Relaxed);
        let want = cqe.clamp(1, i32::MAX as u32) as c_int;
        // SAFETY: valid context and channel; `id` is stored as the opaque cq_context.
        let cq = unsafe { (ctx.api.create_cq)(ctx.ctx, want, id as *mut c_void, ctx.channel, 0) };
        if cq.is_null() {
            return Err(match errno_error("ibv_create_cq", 0) {
                VerbsError::QueueFull => VerbsError::ResourceExhausted("CQ"),
                e => e,
            });
        }
        // SAFETY: valid CQ; the fast-path functions live in its context's ops table.
        let (cap, ops) = unsafe { ((*cq).cqe.max(0) as usize, &(*(*cq).context).ops) };
        let (Some(poll_fn), Some(notify_fn)) = (ops.poll_cq, ops.req_notify_cq) else {
            // SAFETY: destroying the CQ created above.
            unsafe { (ctx.api.destroy_cq)(cq) };
            return Err(VerbsError::DeviceGone("provider has no poll_cq".into()));
        };
        let efd = match new_eventfd() {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: destroying the CQ created above.
                unsafe { (ctx.api.destroy_cq)(cq) };
                return Err(e);
            }
        };
        let c = Arc::new(CqInner {
            ctx: ctx.clone(),
            cq,
            id,
            cap,
            poll_fn,
            notify_fn,
            buf: Mutex::new(VecDeque::with_capacity(POLL_BATCH)),
            efd,
            handler: Mutex::new(None),
            overflowed: AtomicBool::new(false),
        });
        lock(&ctx.shared.cqs).insert(id, Arc::downgrade(&c));
        Ok(c)
    }

    /// The CQ fired: the event fd becomes readable and the handler runs (event thread).
    fn fire(&self) {
        signal(self.efd.as_raw_fd());
        let h = lock(&self.handler).clone();
        if let Some(h) = h {
            h();
        }
    }

    /// Polls the hardware CQ into `out`; returns how many.
    fn poll_hw(&self, out: &mut [WorkCompletion]) -> usize {
        let mut raw = [ffi::ibv_wc::default(); POLL_BATCH];
        let want = out.len().min(POLL_BATCH);
        if want == 0 {
            return 0;
        }
        // SAFETY: valid CQ; `raw` has room for `want` entries.
        let n = unsafe { (self.poll_fn)(self.cq, want as c_int, raw.as_mut_ptr()) };
        if n < 0 {
            warn!(rc = n, "ibv_poll_cq failed");
            return 0;
        }
        let n = n as usize;
        for (o, w) in out.iter_mut().zip(&raw[..n]) {
            *o = convert_wc(w);
        }
        n
    }
}

impl Drop for CqInner {
    fn drop(&mut self) {
        lock(&self.ctx.shared.cqs).remove(&self.id);
        // SAFETY: every QP using this CQ holds a `Cq` clone, so none is left; the event
        // thread acknowledges each event it takes, which ibv_destroy_cq waits for.
        let rc = unsafe { (self.ctx.api.destroy_cq)(self.cq) };
        if rc != 0 {
            warn!(rc, "ibv_destroy_cq failed");
        }
    }
}

fn convert_status(s: u32) -> WcStatus {
    match s {
        ffi::IBV_WC_SUCCESS => WcStatus::Success,
        ffi::IBV_WC_LOC_LEN_ERR => WcStatus::LocLenErr,
        ffi::IBV_WC_LOC_QP_OP_ERR => WcStatus::LocQpOpErr,
        ffi::IBV_WC_LOC_PROT_ERR | ffi::IBV_WC_LOC_ACCESS_ERR => WcStatus::LocProtErr,
        ffi::IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushErr,
        ffi::IBV_WC_BAD_RESP_ERR => WcStatus::BadRespErr,
        ffi::IBV_WC_REM_INV_REQ_ERR => WcStatus::RemInvReqErr,
        ffi::IBV_WC_REM_ACCESS_ERR => WcStatus::RemAccessErr,
        ffi::IBV_WC_REM_OP_ERR => WcStatus::RemOpErr,
        ffi::IBV_WC_RETRY_EXC_ERR => WcStatus::RetryExcErr,
        ffi::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExcErr,
        _ => WcStatus::GeneralErr,
    }
}

fn convert_wc(w: &ffi::ibv_wc) -> WorkCompletion {
    let opcode = match w.opcode {
        ffi::IBV_WC_SEND => WcOpcode::Send,
        ffi::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        ffi::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        ffi::IBV_WC_COMP_SWAP => WcOpcode::CompSwap,
        ffi::IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
        ffi::IBV_WC_RECV => WcOpcode::Recv,
        ffi::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        // Only valid for successful completions (verbs.h); flushed ones keep Send.
        _ => WcOpcode::Send,
    };
    WorkCompletion {
        wr_id: w.wr_id,
        status: convert_status(w.status),
        opcode,
        byte_len: w.byte_len,
        // imm_data is in network byte order (verbs.h); smc-verbs carries host values.
        imm_data: (w.wc_flags & ffi::IBV_WC_WITH_IMM != 0).then(|| u32::from_be(w.imm_data)),
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        // ibv_wc does not report the solicited-event bit.
        solicited: false,
    }
}

impl CqOps for CqInner {
    fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        let mut n = 0;
        {
            let mut b = lock(&self.buf);
            while n < out.len() {
                match b.pop_front() {
                    Some(wc) => {
                        out[n] = wc;
                        n += 1;
                    }
                    None => break,
                }
            }
        }
        while n < out.len() {
            let k = self.poll_hw(&mut out[n..]);
            if k == 0 {
                break;
            }
            n += k;
        }
        n
    }

    fn pending(&self) -> usize {
        let mut b = lock(&self.buf);
        if b.is_empty() {
            let mut tmp = [WorkCompletion::default(); POLL_BATCH];
            let k = self.poll_hw(&mut tmp);
            b.extend(&tmp[..k]);
        }
        b.len()
    }

    fn capacity(&self) -> usize {
        self.cap
    }

    fn req_notify(&self, solicited_only: bool) {
        // SAFETY: valid CQ.
        let rc = unsafe { (self.notify_fn)(self.cq, solicited_only as c_int) };
        if rc != 0 {
            warn!(rc, "ibv_req_notify_cq failed");
        }
        // ibverbs only fires on completions added after the arm; smc-verbs also fires
        // when some are already waiting. Errors count as solicited (IBA §11.4.2.2).
        let waiting = {
            let _ = self.pending();
            lock(&self.buf)
                .iter()
                .any(|wc| !solicited_only || wc.solicited || !wc.status.is_ok())
        };
        if waiting {
            signal(self.efd.as_raw_fd());
            if lock(&self.handler).is_some() {
                // Never from inside req_notify (a handler that re-arms would recurse).
                lock(&self.ctx.shared.deferred).push(self.id);
                signal(self.ctx.shared.wake.as_raw_fd());
            }
        }
    }

    fn event_fd(&self) -> RawFd {
        self.efd.as_raw_fd()
    }

    fn ack_events(&self) {
        drain(self.efd.as_raw_fd());
    }

    fn set_handler(&self, handler: Option<CompletionHandler>) {
        *lock(&self.handler) = handler;
    }

    fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Acquire)
    }

    fn as_dyn(&self) -> &dyn CqOps {
        self
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct QpInner {
    /// Dropped after the QP is destroyed.
    _pd: Arc<PdRaw>,
    ctx: Arc<Ctx>,
    qp: *mut ffi::ibv_qp,
    qpn: u32,
    cap: QpCap,
    state: Mutex<QpState>,
    post_send: ffi::PostSendFn,
    post_recv: ffi::PostRecvFn,
    port: u8,
    gid_index: u8,
    /// The CQs must outlive the QP.
    _cqs: (smc_verbs::Cq, smc_verbs::Cq),
}

// SAFETY: ibv_qp may be used from any thread (providers lock their queues); the pointer
// is valid until Drop.
unsafe impl Send for QpInner {}
// SAFETY: as above.
unsafe impl Sync for QpInner {}

impl Drop for QpInner {
    fn drop(&mut self) {
        {
            let mut m = lock(&self.ctx.shared.qps);
            // Only our own entry (a new QP may already reuse the number).
            if m.get(&self.qpn).is_some_and(|w| w.strong_count() == 0) {
                m.remove(&self.qpn);
            }
        }
        // SAFETY: destroying the QP created in `create_qp`, once.
        let rc = unsafe { (self.ctx.api.destroy_qp)(self.qp) };
        if rc != 0 {
            warn!(rc, qpn = self.qpn, "ibv_destroy_qp failed");
        }
    }
}

fn to_ibv_state(s: QpState) -> u32 {
    match s {
        QpState::Reset => ffi::IBV_QPS_RESET,
        QpState::Init => ffi::IBV_QPS_INIT,
        QpState::Rtr => ffi::IBV_QPS_RTR,
        QpState::Rts => ffi::IBV_QPS_RTS,
        QpState::Sqd => ffi::IBV_QPS_SQD,
        QpState::Sqe => ffi::IBV_QPS_SQE,
        QpState::Err => ffi::IBV_QPS_ERR,
    }
}

fn from_ibv_state(s: u32) -> Option<QpState> {
    Some(match s {
        ffi::IBV_QPS_RESET => QpState::Reset,
        ffi::IBV_QPS_INIT => QpState::Init,
        ffi::IBV_QPS_RTR => QpState::Rtr,
        ffi::IBV_QPS_RTS => QpState::Rts,
        ffi::IBV_QPS_SQD => QpState::Sqd,
        ffi::IBV_QPS_SQE => QpState::Sqe,
        ffi::IBV_QPS_ERR => QpState::Err,
        _ => return None,
    })
}

/// Work requests converted per post on the stack; longer lists are posted from the heap.
const STACK_WRS: usize = 8;
const STACK_SGES: usize = 32;

impl QpInner {
    fn modify(&self, to: QpState, attr: &mut ffi::ibv_qp_attr, mask: c_int) -> Result<()> {
        let mut st = lock(&self.state);
        if !st.can_transition(to) {
            return Err(VerbsError::InvalidTransition { from: *st, to });
        }
        attr.qp_state = to_ibv_state(to);
        // SAFETY: valid QP, fully initialised attributes.
        let rc = unsafe { (self.ctx.api.modify_qp)(self.qp, attr, mask | ffi::IBV_QP_STATE) };
        if rc != 0 {
            return Err(errno_error("ibv_modify_qp", rc));
        }
        *st = to;
        Ok(())
    }

    fn check_psn(psn: u32) -> Result<()> {
        if psn > smc_verbs::PSN_MASK {
            return Err(VerbsError::InvalidArgument("PSN above 2^24"));
        }
        Ok(())
    }
}

impl QpOps for QpInner {
    fn qpn(&self) -> u32 {
        self.qpn
    }

    fn state(&self) -> QpState {
        // The hardware moves a QP to ERR by itself (failed work requests): ask it.
        let mut a = ffi::ibv_qp_attr::default();
        // SAFETY: `ibv_qp_init_attr` is plain data; zero is a valid value.
        let mut ia: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid QP and out-pointers.
        let rc = unsafe { (self.ctx.api.query_qp)(self.qp, &mut a, ffi::IBV_QP_STATE, &mut ia) };
        let mut st = lock(&self.state);
        if rc == 0 {
            if let Some(s) = from_ibv_state(a.qp_state) {
                *st = s;
            }
        }
        *st
    }

    fn cap(&self) -> QpCap {
        self.cap
    }

    fn modify_to_init(&self, attr: &InitAttr) -> Result<()> {
        let mut a = ffi::ibv_qp_attr {
            pkey_index: attr.pkey_index,
            // The port serving this address, whatever the caller's default says.
            port_num: self.port,
            qp_access_flags: access_bits(attr.access) as u32,
            ..Default::default()
        };
        self.modify(
            QpState::Init,
            &mut a,
            ffi::IBV_QP_PKEY_INDEX | ffi::IBV_QP_PORT | ffi::IBV_QP_ACCESS_FLAGS,
        )
    }

    fn modify_to_rtr(&self, attr: &RtrAttr) -> Result<()> {
        Self::check_psn(attr.rq_psn)?;
        if attr.dest_qpn > smc_verbs::QPN_MASK {
            return Err(VerbsError::InvalidArgument("QPN above 2^24"));
        }
        let mut a = ffi::ibv_qp_attr {
            path_mtu: attr.path_mtu as u32,
            dest_qp_num: attr.dest_qpn,
            rq_psn: attr.rq_psn,
            max_dest_rd_atomic: attr.max_dest_rd_atomic,
            min_rnr_timer: attr.min_rnr_timer,
            ah_attr: ffi::ibv_ah_attr {
                grh: ffi::ibv_global_route {
                    dgid: ffi::ibv_gid(attr.ah.dgid.0),
                    flow_label: attr.ah.flow_label,
                    // The RoCEv2 GID of this device's address (smc-verbs' "GID 0" is the
                    // address the device was opened for).
                    sgid_index: self.gid_index,
                    hop_limit: attr.ah.hop_limit,
                    traffic_class: attr.ah.traffic_class,
                },
                is_global: 1,
                port_num: self.port,
                ..Default::default()
            },
            ..Default::default()
        };
        self.modify(
            QpState::Rtr,
            &mut a,
            ffi::IBV_QP_AV
                | ffi::IBV_QP_PATH_MTU
                | ffi::IBV_QP_DEST_QPN
                | ffi::IBV_QP_RQ_PSN
                | ffi::IBV_QP_MAX_DEST_RD_ATOMIC
                | ffi::IBV_QP_MIN_RNR_TIMER,
        )
    }

    fn modify_to_rts(&self, attr: &RtsAttr) -> Result<()> {
        Self::check_psn(attr.sq_psn)?;
        if attr.retry_cnt > 7 || attr.rnr_retry > 7 || attr.timeout > 31 {
            return Err(VerbsError::InvalidArgument(
                "retry count or timeout out of range",
            ));
        }
        let mut a = ffi::ibv_qp_attr {
            sq_psn: attr.sq_psn,
            timeout: attr.timeout,
            retry_cnt: attr.retry_cnt,
            rnr_retry: attr.rnr_retry,
            max_rd_atomic: attr.max_rd_atomic,
            ..Default::default()
        };
        self.modify(
            QpState::Rts,
            &mut a,
            ffi::IBV_QP_SQ_PSN
                | ffi::IBV_QP_TIMEOUT
                | ffi::IBV_QP_RETRY_CNT
                | ffi::IBV_QP_RNR_RETRY
                | ffi::IBV_QP_MAX_QP_RD_ATOMIC,
        )
    }

    fn modify_to_err(&self) -> Result<()> {
        self.modify(QpState::Err, &mut ffi::ibv_qp_attr::default(), 0)
    }

    fn modify_to_reset(&self) -> Result<()> {
        self.modify(QpState::Reset, &mut ffi::ibv_qp_attr::default(), 0)
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        if wrs.is_empty() {
            return Ok(());
        }
        let st = *lock(&self.state);
        // IBA §10.8.3: sends may be posted in RTS (and SQD/SQE/ERR, where they flush).
        if matches!(st, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(VerbsError::InvalidState(st));
        }
        let nsge: usize = wrs.iter().map(|w| w.sg_list.len()).sum();
        for w in wrs {
            if w.sg_list.len() > self.cap.max_send_sge as usize {
                return Err(VerbsError::InvalidArgument("more SGEs than max_send_sge"));
            }
            if w.flags.contains(SendFlags::INLINE) {
                let len: usize = w.sg_list.iter().map(|s| s.length as usize).sum();
                if len > self.cap.max_inline_data as usize {
                    return Err(VerbsError::InlineTooLarge {
                        len,
                        max: self.cap.max_inline_data as usize,
                    });
                }
            }
            if matches!(
                w.op,
                SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. }
            ) && (w.sg_list.len() != 1 || w.sg_list[0].length != 8)
            {
                return Err(VerbsError::InvalidArgument("atomics need one 8-byte SGE"));
            }
        }
        if wrs.len() <= STACK_WRS && nsge <= STACK_SGES {
            let mut iw = [ffi::ibv_send_wr::default(); STACK_WRS];
            let mut is = [ffi::ibv_sge::default(); STACK_SGES];
            self.post_send_in(wrs, &mut iw[..wrs.len()], &mut is[..nsge])
        } else {
            let mut iw = vec![ffi::ibv_send_wr::default(); wrs.len()];
            let mut is = vec![ffi::ibv_sge::default(); nsge];
            self.post_send_in(wrs, &mut iw, &mut is)
        }
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        if wrs.is_empty() {
            return Ok(());
        }
        let st = *lock(&self.state);
        if st == QpState::Reset {
            return Err(VerbsError::InvalidState(st));
        }
        let nsge: usize = wrs.iter().map(|w| w.sg_list.len()).sum();
        if wrs
            .iter()
            .any(|w| w.sg_list.len() > self.cap.max_recv_sge as usize)
        {
            return Err(VerbsError::InvalidArgument("more SGEs than max_recv_sge"));
        }
        if wrs.len() <= STACK_WRS && nsge <= STACK_SGES {
            let mut iw = [ffi::ibv_recv_wr::default(); STACK_WRS];
            let mut is = [ffi::ibv_sge::default(); STACK_SGES];
            self.post_recv_in(wrs, &mut iw[..wrs.len()], &mut is[..nsge])
        } else {
            let mut iw = vec![ffi::ibv_recv_wr::default(); wrs.len()];
            let mut is = vec![ffi::ibv_sge::default(); nsge];
            self.post_recv_in(wrs, &mut iw, &mut is)
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl QpInner {
    fn post_send_in(
        &self,
        wrs: &[SendWr<'_>],
        iw: &mut [ffi::ibv_send_wr],
        is: &mut [ffi::ibv_sge],
    ) -> Result<()> {
        let mut k = 0;
        let n = wrs.len();
        let base = iw.as_mut_ptr();
        for (i, w) in wrs.iter().enumerate() {
            let first = k;
            for s in w.sg_list {
                is[k] = ffi::ibv_sge {
                    addr: s.addr,
                    length: s.length,
                    lkey: s.lkey,
                };
                k += 1;
            }
            let mut x = ffi::ibv_send_wr {
                wr_id: w.wr_id,
                num_sge: w.sg_list.len() as c_int,
                sg_list: if w.sg_list.is_empty() {
                    std::ptr::null_mut()
                } else {
                    // SAFETY: `first` < is.len(): this WR's SGEs were written there.
                    unsafe { is.as_mut_ptr().add(first) }
                },
                // SAFETY: i + 1 <= n = iw.len(): a pointer to the next element (unused
                // for the last one, which gets null).
                next: if i + 1 < n {
                    unsafe { base.add(i + 1) }
                } else {
                    std::ptr::null_mut()
                },
                ..Default::default()
            };
            let mut flags = 0;
            if w.flags.contains(SendFlags::SIGNALED) {
                flags |= ffi::IBV_SEND_SIGNALED;
            }
            if w.flags.contains(SendFlags::SOLICITED) {
                flags |= ffi::IBV_SEND_SOLICITED;
            }
            if w.flags.contains(SendFlags::INLINE) {
                flags |= ffi::IBV_SEND_INLINE;
            }
            if w.flags.contains(SendFlags::FENCE) {
                flags |= ffi::IBV_SEND_FENCE;
            }
            x.send_flags = flags;
            match w.op {
                SendOp::Send => x.opcode = ffi::IBV_WR_SEND,
                SendOp::SendWithImm { imm } => {
                    x.opcode = ffi::IBV_WR_SEND_WITH_IMM;
                    x.imm_data = imm.to_be();
                }
                SendOp::RdmaWrite { remote_addr, rkey } => {
                    x.opcode = ffi::IBV_WR_RDMA_WRITE;
                    x.wr.remote_addr = remote_addr;
                    x.wr.word1 = rkey as u64;
                }
                SendOp::RdmaWriteWithImm {
                    remote_addr,
                    rkey,
                    imm,
                } => {
                    x.opcode = ffi::IBV_WR_RDMA_WRITE_WITH_IMM;
                    x.wr.remote_addr = remote_addr;
                    x.wr.word1 = rkey as u64;
                    x.imm_data = imm.to_be();
                }
                SendOp::RdmaRead { remote_addr, rkey } => {
                    x.opcode = ffi::IBV_WR_RDMA_READ;
                    x.wr.remote_addr = remote_addr;
                    x.wr.word1 = rkey as u64;
                }
                SendOp::AtomicCmpSwap {
                    remote_addr,
                    rkey,
                    compare,
                    swap,
                } => {
                    x.opcode = ffi::IBV_WR_ATOMIC_CMP_AND_SWP;
                    x.wr.remote_addr = remote_addr;
                    x.wr.word1 = compare;
                    x.wr.swap = swap;
                    x.wr.atomic_rkey = rkey;
                }
                SendOp::AtomicFetchAdd {
                    remote_addr,
                    rkey,
                    add,
                } => {
                    x.opcode = ffi::IBV_WR_ATOMIC_FETCH_AND_ADD;
                    x.wr.remote_addr = remote_addr;
                    x.wr.word1 = add;
                    x.wr.atomic_rkey = rkey;
                }
            }
            iw[i] = x;
        }
        let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: valid QP; `iw` is a linked list of fully initialised WRs whose SGE
        // pointers point into `is`, both alive for the call; the provider copies them.
        let rc = unsafe { (self.post_send)(self.qp, base, &mut bad) };
        if rc != 0 {
            // The provider posts in order and stops at the first WR it cannot take;
            // every check that can fail for a valid WR list was done above, so this
            // is the hardware queue filling up (the caller posted beyond max_send_wr).
            // SAFETY: `bad` points into `iw` when set.
            let at = if bad.is_null() {
                0
            } else {
                unsafe { bad.offset_from(base) }
            };
            if at > 0 {
                warn!(qpn = self.qpn, at, "post_send stopped inside a batch");
            }
            return Err(errno_error("ibv_post_send", rc));
        }
        Ok(())
    }

    fn post_recv_in(
        &self,
        wrs: &[RecvWr<'_>],
        iw: &mut [ffi::ibv_recv_wr],
        is: &mut [ffi::ibv_sge],
    ) -> Result<()> {
        let mut k = 0;
        let n = wrs.len();
        let base = iw.as_mut_ptr();
        for (i, w) in wrs.iter().enumerate() {
            let first = k;
            for s in w.sg_list {
                is[k] = ffi::ibv_sge {
                    addr: s.addr,
                    length: s.length,
                    lkey: s.lkey,
                };
                k += 1;
            }
            iw[i] = ffi::ibv_recv_wr {
                wr_id: w.wr_id,
                num_sge: w.sg_list.len() as c_int,
                sg_list: if w.sg_list.is_empty() {
                    std::ptr::null_mut()
                } else {
                    // SAFETY: this WR's SGEs start at `first` < is.len().
                    unsafe { is.as_mut_ptr().add(first) }
                },
                next: if i + 1 < n {
                    // SAFETY: i + 1 < n = iw.len().
                    unsafe { base.add(i + 1) }
                } else {
                    std::ptr::null_mut()
                },
            };
        }
        let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: valid QP; a linked list of initialised WRs with SGEs in `is`.
        let rc = unsafe { (self.post_recv)(self.qp, base, &mut bad) };
        if rc != 0 {
            return Err(errno_error("ibv_post_recv", rc));
        }
        Ok(())
    }
}

/// The process's libibverbs, loaded on first use (`SMC_RS_IBVERBS_LIB` names another
/// library file; default `libibverbs.so.1`).
pub fn api() -> std::result::Result<&'static Api, ffi::LoadError> {
    static API: OnceLock<std::result::Result<Api, ffi::LoadError>> = OnceLock::new();
    API.get_or_init(|| {
        let lib = std::env::var("SMC_RS_IBVERBS_LIB").unwrap_or_else(|_| "libibverbs.so.1".into());
        Api::load(&lib)
    })
    .as_ref()
    .map_err(Clone::clone)
}
