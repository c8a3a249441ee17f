//! The verbs objects of a device (siw_verbs.c's job): the handles [`smc_verbs`] hands to
//! users — device, protection domain, memory region, queue pair — with the argument checks
//! of each verb, delegating to [`crate::mr`], [`crate::cq`], [`crate::qp`] and, in SMC-R
//! link mode, [`crate::smclink`].

use std::any::Any;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use smc_verbs::{
    AccessFlags, CqOps, DeviceAttr, DeviceOps, Gid, InitAttr, Mac, MrOps, Mtu, PdOps, QpCap,
    QpInitAttr, QpOps, QpState, RdmaBuffer, RecvWr, Result, RtrAttr, RtsAttr, SendWr, VerbsError,
};

use crate::config::Config;
use crate::cq::{CqShared, IwCq};
use crate::device::{DevShared, Stats};
use crate::mr::{random_u32, MrEntry, MrTable};
use crate::qp::{IwQp, QpTable};

/// The device handle.
pub(crate) struct IwDevice {
    pub(crate) shared: Arc<DevShared>,
    qps: Arc<QpTable>,
}

impl DeviceOps for IwDevice {
    fn attr(&self) -> &DeviceAttr {
        &self.shared.attr
    }
    fn is_active(&self) -> bool {
        true
    }
    fn alloc_pd(&self) -> Result<Arc<dyn PdOps>> {
        Ok(Arc::new(IwPd {
            id: self.shared.next_pd.fetch_add(1, Ordering::Relaxed),
            dev: self.shared.clone(),
            qps: self.qps.clone(),
        }))
    }
    fn create_cq(&self, cqe: u32) -> Result<Arc<dyn CqOps>> {
        if cqe == 0 || cqe > self.shared.attr.max_cqe {
            return Err(VerbsError::InvalidArgument("CQ size"));
        }
        Ok(Arc::new(IwCq {
            shared: CqShared::new(cqe as usize)?,
        }))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

static DEV_INDEX: AtomicU32 = AtomicU32::new(0);

/// Opens a device whose QPs connect from `local`; in SMC-R link mode it also listens on
/// `local:ephemeral` and advertises the port in its MAC ([`crate::smclink`]).
pub(crate) fn open(local: IpAddr, config: &Config) -> Result<smc_verbs::Device> {
    let idx = DEV_INDEX.fetch_add(1, Ordering::Relaxed);
    let gid = Gid::from_ip(local);
    let g = gid.0;
    let listener = if config.smc_links {
        Some(std::net::TcpListener::bind(std::net::SocketAddr::new(
            local, 0,
        ))?)
    } else {
        None
    };
    let mac = match &listener {
        Some(l) => crate::smclink::mac_for_port(l.local_addr()?.port()),
        // A locally administered MAC derived from the address (iWARP does not use it).
        None => Mac([0x02, 0x1a, g[12], g[13], g[14], g[15]]),
    };
    let attr = DeviceAttr {
        name: format!("iwrs{idx}"),
        provider: "iwarp".into(),
        local_addr: local,
        gid,
        mac,
        netdev: None,
        // No IBA path MTU on iWARP: TCP segments; reported as the largest.
        active_mtu: Mtu::Mtu4096,
        max_qp: 4096,
        max_qp_wr: 16384,
        max_sge: 8,
        max_cqe: 1 << 20,
        max_mr: 1 << 16,
        max_inline_data: 256,
        max_qp_rd_atom: config.max_ird.min(255) as u8,
    };
    let accept = listener.as_ref().map(|l| l.try_clone()).transpose()?;
    let shared = Arc::new(DevShared {
        attr,
        mrs: MrTable::default(),
        config: config.clone(),
        stats: Stats::default(),
        next_qpn: AtomicU32::new(17 + (random_u32() & 0xffff)),
        next_pd: AtomicU32::new(1),
        listener,
    });
    let qps = Arc::new(QpTable::default());
    if let Some(l) = accept {
        crate::smclink::spawn_listener(l, Arc::downgrade(&shared), qps.clone())?;
    }
    Ok(smc_verbs::Device(Arc::new(IwDevice { shared, qps })))
}

/// The counters of a device opened by this provider (None for another provider's).
pub fn stats(dev: &smc_verbs::Device) -> Option<&Stats> {
    dev.0
        .as_any()
        .downcast_ref::<IwDevice>()
        .map(|d| &d.shared.stats)
}

/// Protection domain.
pub(crate) struct IwPd {
    id: u32,
    dev: Arc<DevShared>,
    qps: Arc<QpTable>,
}

impl PdOps for IwPd {
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
        if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(VerbsError::InvalidArgument(
                "REMOTE_WRITE/REMOTE_ATOMIC need LOCAL_WRITE",
            ));
        }
        let entry = self.dev.mrs.register(
            buf,
            offset,
            len,
            access,
            self.id,
            self.dev.attr.max_mr as usize,
        )?;
        Ok(Box::new(IwMr {
            entry,
            dev: self.dev.clone(),
        }))
    }

    fn create_qp(&self, attr: &QpInitAttr) -> Result<Arc<dyn QpOps>> {
        let shared = crate::qp::create(&self.dev, &self.qps, self.id, attr)?;
        Ok(Arc::new(IwQp { shared }))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Memory region handle; dropping it deregisters the region.
pub(crate) struct IwMr {
    entry: Arc<MrEntry>,
    dev: Arc<DevShared>,
}

impl Drop for IwMr {
    fn drop(&mut self) {
        self.dev.mrs.remove(self.entry.key);
    }
}

impl MrOps for IwMr {
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
        self.entry.buffer()
    }
}

impl QpOps for IwQp {
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
        if !self.shared.dev.config.smc_links {
            return Err(VerbsError::InvalidArgument(
                "iWARP QPs are connected by the connection manager (smc_iwarp::cm), not RTR attributes",
            ));
        }
        crate::smclink::modify_to_rtr(&self.shared, attr)
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
