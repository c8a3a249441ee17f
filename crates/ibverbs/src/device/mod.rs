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
//! A removed device (`IBV_EVENT_DEVICE_FATAL`, or the kernel's `remove` uevent of its
//! uverbs node for drivers that send no event, see `uevent`) stays removed: the provider
//! no longer hands it out, and the context closes when the stack has dropped its objects.
//!
//! Split by object: this module holds the context ([`Ctx`]) and the device handle
//! ([`DevInner`]); `pd` protection domains and memory regions; `cq` completion queues and
//! the context's event thread; `qp` queue pairs.

mod cq;
mod pd;
mod qp;
mod uevent;

use std::any::Any;
use std::collections::HashMap;
use std::ffi::{c_int, CStr};
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;

use smc_verbs::{CqOps, DeviceAttr, DeviceOps, EventFd, PdOps, Result, VerbsError};

use cq::{CqInner, EventThread};
use pd::PdInner;
use qp::QpInner;

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
    /// True for good once the device was removed (fatal error or unregistered).
    removed: AtomicBool,
    /// Set by `Ctx::drop` when it runs on the event thread itself (the thread then
    /// closes the context as it exits instead of being joined).
    orphaned: AtomicBool,
    /// CQs by the id stored in their `cq_context`.
    cqs: Mutex<HashMap<u64, Weak<CqInner>>>,
    /// QPs by number.
    qps: Mutex<HashMap<u32, Weak<QpInner>>>,
    /// CQs whose handler the thread must run (armed while completions were waiting).
    deferred: Mutex<Vec<u64>>,
    next_cq: AtomicU64,
    /// Wakes the thread (deferred handlers) or stops it (`stop`).
    wake: EventFd,
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
        let mut uverbs = String::new();
        for i in 0..n.max(0) as usize {
            // SAFETY: `list` has `n` valid entries.
            let d = unsafe { *list.add(i) };
            // SAFETY: `d` is a device of the list; the name is a NUL-terminated string
            // owned by it.
            let dn = unsafe { CStr::from_ptr((api.get_device_name)(d)) };
            if dn.to_bytes() == name.as_bytes() {
                // SAFETY: `d` is valid until the list is freed; the context outlives it.
                ctx = unsafe { (api.open_device)(d) };
                // SAFETY: `dev_name` is a NUL-terminated array inside the device.
                uverbs = unsafe { CStr::from_ptr((*d).dev_name.as_ptr()) }
                    .to_string_lossy()
                    .into_owned();
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
        let wake = EventFd::new()?;
        if let Err(e) = set_nonblocking(cfd).and_then(|_| set_nonblocking(afd)) {
            // SAFETY: destroying what we created above.
            unsafe { (api.destroy_comp_channel)(channel) };
            let _ = fail("fcntl", 0);
            return Err(e.into());
        }
        let shared = Arc::new(Shared {
            active: AtomicBool::new(true),
            removed: AtomicBool::new(false),
            orphaned: AtomicBool::new(false),
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
        // Without the uevent socket a removal that the driver does not report as
        // DEVICE_FATAL goes unnoticed: say so, but the device works all the same.
        let uevents = match uevent::open() {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::warn!(device = %name, error = %e, "no kernel uevents: the device's removal cannot be seen");
                None
            }
        };
        let th = EventThread {
            api,
            ctx: ctx as usize,
            channel: channel as usize,
            shared,
            name: name.to_string(),
            uverbs,
            uevents,
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

    /// True once the device was removed: it never comes back (a device registered again
    /// under the same name is a new context).
    pub(crate) fn is_removed(&self) -> bool {
        self.shared.removed.load(Ordering::Acquire)
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(h) = lock(&self.thread).take() {
            if h.thread().id() == std::thread::current().id() {
                // The last reference went away inside a handler the event thread ran
                // (it cannot join itself): it closes the context when it returns.
                self.shared.orphaned.store(true, Ordering::Release);
                return;
            }
            self.shared.wake.wake();
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
    fn is_removed(&self) -> bool {
        self.ctx.is_removed()
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

/// The process's libibverbs, loaded on first use (`SMC_RS_IBVERBS_LIB` names another
/// library file; default `libibverbs.so.1`).
pub fn api() -> std::result::Result<&'static Api, ffi::LoadError> {
    static API: OnceLock<std::result::Result<Api, ffi::LoadError>> = OnceLock::new();
    API.get_or_init(|| {
        let lib = smc_verbs::process::config_var("SMC_RS_IBVERBS_LIB")
            .unwrap_or_else(|| "libibverbs.so.1".into());
        Api::load(&lib)
    })
    .as_ref()
    .map_err(Clone::clone)
}
