//! `smc-ibverbs`: an [`smc_verbs::Provider`] for RDMA NICs (RoCE: ConnectX and the like,
//! and Linux's software `rdma_rxe`) through rdma-core's libibverbs.
//!
//! libibverbs is loaded at run time (dlopen of `libibverbs.so.1`, see [`ffi`]), so a
//! binary that contains this provider still starts on hosts without rdma-core; it then
//! simply finds no device. Discovery follows Linux SMC-R: the device and port whose
//! RoCEv2 GID is the connection's local address ([`sysfs::place`]); the GID index found
//! there is the source GID of every QP of that address; the path MTU limit is the port's
//! active MTU. Memory regions are registered at a random I/O virtual address
//! (`ibv_reg_mr_iova2`, as the software RNIC does; INLINE data is handed to libibverbs at
//! its process address), QPs are RC, CQs are armed through one
//! completion channel per device and an event thread that also takes async events (port
//! down, fatal device error → the device's QPs go to ERR, their SMC-R links fail) and
//! notices a device's removal (also from drivers such as rxe that report none, through
//! the kernel's uevent): a removed device is never handed out again, and the provider
//! keeps no reference to it, so that its context closes once the stack has dropped its
//! objects and the kernel can finish unregistering it; a device registered again under
//! the same name is opened anew.
//!
//! Differences from the software RNIC a user of `smc-verbs` can see: receive completions
//! do not report the solicited-event bit (`ibv_wc` has no such flag), and a batch of send
//! work requests that overflows the hardware send queue is posted up to the WR that did
//! not fit (the SMC-R core never posts beyond its QP's capacity).

pub mod device;
pub mod ffi;
pub mod sysfs;

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

use smc_verbs::{Device, Provider, Result, VerbsError};

pub use device::api;
pub use sysfs::{DeviceInfo, GidEntry, Placement, PortInfo};

/// The libibverbs provider.
pub struct IbVerbs {
    ib_root: PathBuf,
    net_root: PathBuf,
    /// Devices handed out, by address. Weak: the stack's references keep a device open;
    /// the provider's must not keep a removed one open (the kernel waits for its last
    /// user to close it).
    devices: Mutex<HashMap<IpAddr, Weak<dyn smc_verbs::DeviceOps>>>,
    contexts: Mutex<HashMap<String, Weak<device::Ctx>>>,
}

/// What [`IbVerbs::probe`] found: the devices sysfs lists and whether libibverbs loads.
#[derive(Debug)]
pub struct Probe {
    /// RDMA devices (sysfs).
    pub devices: Vec<DeviceInfo>,
    /// `Ok` when libibverbs loaded, else why not.
    pub library: std::result::Result<(), String>,
    /// Devices libibverbs can open (it has a user-space provider for them), by name.
    pub usable: Vec<String>,
}

fn v4_unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

impl IbVerbs {
    /// A provider reading the real sysfs.
    pub fn new() -> Arc<IbVerbs> {
        Self::with_sysfs(sysfs::SYSFS_INFINIBAND.into(), sysfs::SYSFS_NET.into())
    }

    /// A provider reading device information from other directories (tests).
    pub fn with_sysfs(ib_root: PathBuf, net_root: PathBuf) -> Arc<IbVerbs> {
        Arc::new(IbVerbs {
            ib_root,
            net_root,
            devices: Mutex::new(HashMap::new()),
            contexts: Mutex::new(HashMap::new()),
        })
    }

    /// The process-wide instance (a forked child gets its own, [`smc_verbs::process`]).
    pub fn global() -> Arc<IbVerbs> {
        static G: smc_verbs::process::PerProcess<Arc<IbVerbs>> =
            smc_verbs::process::PerProcess::new();
        G.get_or_init(IbVerbs::new).clone()
    }

    /// The RDMA devices in sysfs.
    pub fn scan(&self) -> Vec<DeviceInfo> {
        sysfs::scan(&self.ib_root)
    }

    /// Where `local` is served, if an active RoCE port has its RoCEv2 GID.
    pub fn placement(&self, local: IpAddr) -> Option<Placement> {
        sysfs::place(&self.scan(), v4_unmapped(local))
    }

    /// True when a device serves `local` and libibverbs loads (what `auto` selection
    /// asks).
    pub fn serves(&self, local: IpAddr) -> bool {
        self.placement(local).is_some() && api().is_ok()
    }

    /// Devices, library state and which devices libibverbs can open (`smc rdma devices`).
    pub fn probe(&self) -> Probe {
        let devices = self.scan();
        let (library, usable) = match api() {
            Err(e) => (Err(e.to_string()), Vec::new()),
            Ok(api) => (Ok(()), list_names(api)),
        };
        Probe {
            devices,
            library,
            usable,
        }
    }

    /// The active MTU of a device port, asked through libibverbs (opens the device).
    pub fn port_mtu(&self, device: &str, port: u8) -> Result<smc_verbs::Mtu> {
        let pa = self.context(device)?.query_port(port)?;
        smc_verbs::Mtu::from_enum(pa.active_mtu as u8).ok_or(VerbsError::InvalidArgument(
            "port reports no valid active MTU",
        ))
    }

    fn context(&self, name: &str) -> Result<Arc<device::Ctx>> {
        let mut m = self.contexts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = m.get(name).and_then(Weak::upgrade) {
            if !c.is_removed() {
                return Ok(c);
            }
        }
        let api = api().map_err(|e| VerbsError::DeviceGone(e.to_string()))?;
        let c = device::Ctx::open(api, name)?;
        m.insert(name.to_string(), Arc::downgrade(&c));
        Ok(c)
    }
}

/// Names of the devices libibverbs lists (those with a loaded user-space provider).
fn list_names(api: &ffi::Api) -> Vec<String> {
    let mut n = 0;
    // SAFETY: valid out-pointer; the list is freed below.
    let list = unsafe { (api.get_device_list)(&mut n) };
    if list.is_null() {
        return Vec::new();
    }
    let mut v = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: the list has `n` valid entries; names are NUL-terminated strings owned
        // by the devices.
        let name = unsafe { std::ffi::CStr::from_ptr((api.get_device_name)(*list.add(i))) };
        v.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: freeing the list obtained above.
    unsafe { (api.free_device_list)(list) };
    v
}

impl Provider for IbVerbs {
    fn name(&self) -> &str {
        "ibverbs"
    }

    fn device_for(&self, local: IpAddr) -> Result<Device> {
        let local = v4_unmapped(local);
        let mut m = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = m.get(&local).and_then(Weak::upgrade) {
            if d.is_active() && !d.is_removed() {
                return Ok(Device(d));
            }
        }
        m.retain(|_, d| d.strong_count() > 0);
        let place = self.placement(local).ok_or_else(|| {
            VerbsError::DeviceGone(format!(
                "no RDMA device has a RoCEv2 GID for {local} on an active port"
            ))
        })?;
        let ctx = self.context(&place.device)?;
        let ndev = place.gid.ndev.clone().unwrap_or_default();
        let mac = sysfs::netdev_mac(&self.net_root, &ndev).unwrap_or_default();
        let d = Device(Arc::new(device::DevInner::new(ctx, &place, local, mac)?));
        tracing::info!(
            device = %place.device, port = place.port, gid_index = place.gid.index,
            netdev = %ndev, %local, mtu = d.attr().active_mtu.bytes(),
            "ibverbs device opened"
        );
        m.insert(local, Arc::downgrade(&d.0));
        Ok(d)
    }

    fn devices(&self) -> Vec<Device> {
        self.devices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter_map(Weak::upgrade)
            .filter(|d| !d.is_removed())
            .map(Device)
            .collect()
    }
}
