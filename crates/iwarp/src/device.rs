//! A device: the local address QPs' TCP connections use, the STag table and counters. There
//! is no device-wide thread: each connected QP runs its own transmit and receive threads
//! on its TCP socket.

use std::any::Any;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use smc_verbs::{CqOps, DeviceAttr, DeviceOps, Gid, Mac, Mtu, PdOps, Result, VerbsError};

use crate::cq::{CqShared, IwCq};
use crate::mr::{random_u32, IwPd, MrTable};
use crate::Config;

/// Device counters.
#[derive(Default, Debug)]
pub struct Stats {
    /// FPDUs sent.
    pub tx_fpdus: AtomicU64,
    /// FPDUs received.
    pub rx_fpdus: AtomicU64,
    /// FPDUs whose CRC did not verify (the connection was terminated).
    pub rx_bad_crc: AtomicU64,
    /// Terminate messages sent.
    pub tx_terminates: AtomicU64,
    /// Terminate messages received.
    pub rx_terminates: AtomicU64,
    /// QPs currently open.
    pub qps_open: AtomicU64,
}

pub(crate) struct DevShared {
    pub(crate) attr: DeviceAttr,
    pub(crate) mrs: MrTable,
    pub(crate) config: Config,
    pub(crate) stats: Stats,
    next_qpn: AtomicU32,
    next_pd: AtomicU32,
    /// QPs by number (SMC-R link mode: the listener finds the QP an MPA Request names).
    pub(crate) qps: Mutex<HashMap<u32, Weak<crate::qp::QpShared>>>,
    /// SMC-R link mode: the device's listening socket (shut down with the device).
    listener: Option<std::net::TcpListener>,
}

impl Drop for DevShared {
    fn drop(&mut self) {
        if let Some(l) = &self.listener {
            // Wakes the accept thread, which then finds the device gone and exits.
            let _ = socket2::SockRef::from(l).shutdown(std::net::Shutdown::Both);
        }
    }
}

impl DevShared {
    pub(crate) fn alloc_qpn(&self) -> u32 {
        // 24-bit QP numbers; 0 and 1 are special in IBA and kept out here too.
        loop {
            let n = self.next_qpn.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
            if n >= 2 {
                return n;
            }
        }
    }
}

/// The device handle.
pub(crate) struct IwDevice {
    pub(crate) shared: Arc<DevShared>,
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
        qps: Mutex::new(HashMap::new()),
        listener,
    });
    if let Some(l) = accept {
        crate::smclink::spawn_listener(l, Arc::downgrade(&shared))?;
    }
    Ok(smc_verbs::Device(Arc::new(IwDevice { shared })))
}

/// The counters of a device opened by this provider (None for another provider's).
pub fn stats(dev: &smc_verbs::Device) -> Option<&Stats> {
    dev.0
        .as_any()
        .downcast_ref::<IwDevice>()
        .map(|d| &d.shared.stats)
}
