//! The runtime's side of the endpoint ([`Host`]): verbs objects and memory of link groups
//! (QPs, RMBs, send buffers), alert tokens, routes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use smc_verbs::{AccessFlags, Device, Mr, RdmaBuffer};
use smc_wire::common::{Gid, Mac, U24};
use tracing::{debug, info, warn};

use super::conn::ConnShared;
use super::link::{LinkRes, PeerQpAttr};
use super::{sys, Inner};
use crate::clc::{LgrId, ServerSameHost, V2Route};
use crate::conn::State;
use crate::endpoint::{DeviceInfo, Host, HostError};
use crate::llc::{self, DeviceId, QpInfo, RToken};

/// An RMB's memory and its registration on each link's PD.
pub(crate) struct RmbRes {
    pub buf: Arc<RdmaBuffer>,
    pub mrs: BTreeMap<llc::LinkId, Mr>,
}

/// A send buffer and its registration on its link's PD.
pub(crate) type Sndbuf = (Arc<RdmaBuffer>, Mr);

/// Verbs objects and memory the endpoint asked for, and the connections (for the RMBE
/// conflict rule).
#[derive(Default)]
pub(crate) struct HostState {
    /// Devices by local address; the index is the endpoint's `DeviceId`. `None`: the
    /// device was removed and dropped (the address gets a new one, under the same id,
    /// when a connection next asks for it).
    pub devices: Vec<(IpAddr, Option<Device>)>,
    /// Addresses whose interface is down or lost the address ([`Core::check_paths`]):
    /// no new link goes on their device.
    ///
    /// [`Core::check_paths`]: super::core::Core::check_paths
    pub paths_down: BTreeSet<IpAddr>,
    /// Addresses whose device could not be opened (warned once).
    pub device_errors: BTreeSet<IpAddr>,
    pub links: HashMap<(LgrId, llc::LinkId), Arc<LinkRes>>,
    pub rmbs: HashMap<(LgrId, u32), RmbRes>,
    /// Free send buffers per link (registered on that link's PD).
    pub sndbufs: HashMap<(LgrId, llc::LinkId), Vec<Sndbuf>>,
    pub conns: BTreeMap<u32, Arc<ConnShared>>,
    /// Server: the shared memory of same-host rendezvous, until they finish.
    pub same_host_ready: HashMap<crate::endpoint::TcpId, super::shm::ShmSetup>,
    /// Links that ended in order while healthy, still acknowledging the peer's
    /// transport until it has been quiet for [`LINGER_QUIET`] (at most [`LINGER_MAX`]):
    /// see [`LinkRes::linger`].
    pub lingering: Vec<Lingering>,
}

/// How long a lingering link must have received nothing before it is destroyed.
pub(crate) const LINGER_QUIET: Duration = Duration::from_millis(300);
/// How long a link lingers at most.
pub(crate) const LINGER_MAX: Duration = Duration::from_secs(3);

/// A link in [`HostState::lingering`].
pub(crate) struct Lingering {
    res: Arc<LinkRes>,
    since: Instant,
    /// The last time something arrived on it (or `since`).
    heard: Instant,
}

impl Lingering {
    fn deadline(&self) -> Instant {
        (self.heard + LINGER_QUIET).min(self.since + LINGER_MAX)
    }
}

/// The token table's name for same-host connections, which have no link group: their
/// tokens never match a CDC arriving on a link.
pub(crate) const SAME_HOST_LGR: LgrId = LgrId(u64::MAX);

/// [`HostState`] with the stack, for one endpoint call.
pub(crate) struct HostCtx<'a> {
    pub inner: &'a Arc<Inner>,
    pub st: &'a mut HostState,
}

fn herr(e: impl std::fmt::Display) -> HostError {
    HostError(e.to_string())
}

impl HostState {
    /// The device serving `ip`, opened on first use: its endpoint description, or
    /// `None` (every connection on this address falls back, NOSMCRDEV).
    pub(crate) fn device_for(&mut self, inner: &Inner, ip: IpAddr) -> Option<(DeviceInfo, bool)> {
        let slot = self.devices.iter().position(|(a, _)| *a == ip);
        if let Some(i) = slot {
            match &self.devices[i].1 {
                Some(d) if !d.is_removed() => return Some((describe(i, d), false)),
                _ => self.devices[i].1 = None,
            }
        }
        match inner.cfg.provider.device_for(ip) {
            Ok(d) => {
                let i = match slot {
                    Some(i) => {
                        info!(%ip, device = d.name(), "RDMA device for this address opened again");
                        self.devices[i].1 = Some(d.clone());
                        i
                    }
                    None => {
                        self.devices.push((ip, Some(d.clone())));
                        self.devices.len() - 1
                    }
                };
                self.device_errors.remove(&ip);
                Some((describe(i, &d), true))
            }
            Err(e) => {
                // Say why once per address.
                if self.device_errors.insert(ip) {
                    warn!(%ip, error = %e, "no RDMA device for this address: SMC-R unavailable");
                } else {
                    debug!(%ip, error = %e, "no RDMA device for this address");
                }
                None
            }
        }
    }

    pub(crate) fn device_gid(&self, id: DeviceId) -> String {
        self.devices
            .get(id.0 as usize)
            .and_then(|(_, d)| d.as_ref())
            .map(|d| d.gid().to_string())
            .unwrap_or_default()
    }

    pub(crate) fn device_name(&self, id: DeviceId) -> String {
        self.devices
            .get(id.0 as usize)
            .and_then(|(_, d)| d.as_ref())
            .map(|d| d.name().to_string())
            .unwrap_or_default()
    }

    /// Destroys the lingering links that have been quiet long enough, lingered
    /// [`LINGER_MAX`], failed, or whose device went away (`all`: every one, the stack
    /// stops).
    pub(crate) fn expire_lingering(&mut self, now: Instant, all: bool) {
        if self.lingering.is_empty() {
            return;
        }
        let before = self.lingering.len();
        self.lingering.retain_mut(|l| {
            if l.res.activity.swap(false, Ordering::Relaxed) {
                l.heard = now;
            }
            let done = all
                || now >= l.deadline()
                || l.res.failed.load(Ordering::SeqCst)
                || l.res.device.is_removed();
            if done {
                debug!(lgr = l.res.lgr.0, link = %l.res.id, lingered_ms = now.duration_since(l.since).as_millis() as u64,
                    "lingering link destroyed");
                l.res.destroy();
            }
            !done
        });
        if self.lingering.len() != before {
            self.drop_removed();
        }
    }

    /// When the next lingering link may be destroyed.
    pub(crate) fn lingering_deadline(&self) -> Option<Instant> {
        self.lingering.iter().map(Lingering::deadline).min()
    }

    /// Drops the devices that were removed: the provider can close one only when
    /// nothing refers to it any more (a kernel unregistering an RDMA device waits for
    /// that). Called when a link is destroyed, which is what a removal leads to.
    fn drop_removed(&mut self) {
        for (ip, d) in &mut self.devices {
            if d.as_ref().is_some_and(Device::is_removed) {
                info!(%ip, device = d.as_ref().map(Device::name).unwrap_or_default(),
                    "RDMA device removed: released");
                *d = None;
            }
        }
    }
}

fn describe(i: usize, d: &Device) -> DeviceInfo {
    DeviceInfo {
        id: DeviceId(i as u32),
        gid: d.gid(),
        mac: d.mac(),
        mtu: d.attr().active_mtu,
    }
}

impl Host for HostCtx<'_> {
    fn create_link(
        &mut self,
        lgr: LgrId,
        link: llc::LinkId,
        device: DeviceId,
    ) -> Result<QpInfo, HostError> {
        let (ip, dev) = self
            .st
            .devices
            .get(device.0 as usize)
            .and_then(|(ip, d)| Some((*ip, d.clone()?)))
            .ok_or_else(|| HostError(format!("no device {device:?}")))?;
        if self.st.paths_down.contains(&ip) {
            return Err(HostError(format!(
                "{ip}: interface down or address removed"
            )));
        }
        let res = LinkRes::create(self.inner, &dev, lgr, link).map_err(herr)?;
        let qp = QpInfo {
            qpn: U24::wrapping(res.qp.qpn()),
            psn: U24::wrapping(res.psn),
            mtu: res.port_mtu,
        };
        if let Some(old) = self.st.links.insert((lgr, link), res) {
            old.destroy();
        }
        Ok(qp)
    }

    fn connect_link(
        &mut self,
        lgr: LgrId,
        link: llc::LinkId,
        peer: &llc::PeerQp,
    ) -> Result<(), HostError> {
        let res = self
            .st
            .links
            .get(&(lgr, link))
            .ok_or_else(|| HostError(format!("no link {link}")))?;
        res.connect(&PeerQpAttr {
            gid: peer.gid,
            mac: peer.mac,
            qpn: peer.qpn.get(),
            psn: peer.psn.get(),
            mtu: peer.mtu,
        })
        .map_err(herr)
    }

    fn destroy_link(&mut self, lgr: LgrId, link: llc::LinkId) {
        if let Some(res) = self.st.links.remove(&(lgr, link)) {
            if res.failed.load(Ordering::SeqCst)
                || res.dead.load(Ordering::SeqCst)
                || res.device.is_removed()
            {
                debug!(lgr = lgr.0, %link, "link destroyed");
                res.destroy();
            } else {
                // Ended in order: the peer may still send (LinkRes::linger).
                debug!(lgr = lgr.0, %link, "link ended: lingering");
                res.linger();
                let now = Instant::now();
                self.st.lingering.push(Lingering {
                    res,
                    since: now,
                    heard: now,
                });
            }
        }
        for ((l, _), r) in self.st.rmbs.iter_mut() {
            if *l == lgr {
                r.mrs.remove(&link);
            }
        }
        self.st.sndbufs.remove(&(lgr, link));
        self.st.drop_removed();
    }

    fn create_rmb(&mut self, lgr: LgrId, rmb: llc::RmbId, size: usize) -> Result<(), HostError> {
        // Zeroed before each reuse (clear_rmb): its writes are tracked.
        let buf = RdmaBuffer::new_tracked(size).map_err(herr)?;
        self.st.rmbs.insert(
            (lgr, rmb.0),
            RmbRes {
                buf,
                mrs: BTreeMap::new(),
            },
        );
        Ok(())
    }

    fn register_rmb(
        &mut self,
        lgr: LgrId,
        rmb: llc::RmbId,
        link: llc::LinkId,
    ) -> Result<RToken, HostError> {
        let res = self
            .st
            .links
            .get(&(lgr, link))
            .ok_or_else(|| HostError(format!("no link {link}")))?;
        if res.dead.load(Ordering::SeqCst) {
            return Err(HostError(format!("link {link} is down")));
        }
        let r = self
            .st
            .rmbs
            .get_mut(&(lgr, rmb.0))
            .ok_or_else(|| HostError(format!("no RMB {rmb:?}")))?;
        // RMBs: remote write only (plus the local write RDMA placement needs).
        let mr = res
            .pd
            .reg_mr(&r.buf, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .map_err(herr)?;
        let t = RToken {
            rkey: mr.rkey(),
            vaddr: mr.addr(),
        };
        r.mrs.insert(link, mr);
        Ok(t)
    }

    fn clear_rmb(&mut self, lgr: LgrId, rmb: llc::RmbId) {
        if let Some(r) = self.st.rmbs.get(&(lgr, rmb.0)) {
            // All of it zero again, at the cost of what the last connection wrote
            // (RdmaBuffer::zero_written; the whole buffer if a NIC writes it).
            r.buf.zero_written();
        }
    }

    fn free_rmb(&mut self, lgr: LgrId, rmb: llc::RmbId) {
        self.st.rmbs.remove(&(lgr, rmb.0));
    }

    fn same_host_server(
        &mut self,
        tcp: crate::endpoint::TcpId,
        offer: &smc_wire::clc::SameHostOffer,
    ) -> ServerSameHost {
        let Some(sh) = self.inner.same_host.clone() else {
            return ServerSameHost::No;
        };
        let Some(token) = self.alloc_token(SAME_HOST_LGR) else {
            return ServerSameHost::No;
        };
        // Subsequent contact: the client's hello on our session with its stack, read and
        // answered without waiting.
        match sh.connect_by_session(offer, token) {
            Some(Ok(setup)) => {
                self.st.same_host_ready.insert(tcp, setup);
                return ServerSameHost::Taken(sh.stack_id);
            }
            Some(Err(e)) => {
                debug!(error = %e, "same-host offer not taken");
                self.release_token(token);
                return ServerSameHost::No;
            }
            None => {}
        }
        // The full exchange waits on the client's process: on the exchange thread, whose
        // outcome comes back to the event thread (Inbox::SameHostDone).
        let inner = Arc::downgrade(self.inner);
        let job = super::shm::ExchangeJob {
            offer: *offer,
            token,
            deadline: std::time::Instant::now() + self.inner.clc.same_host_timeout,
            done: Box::new(move |result| {
                if let Some(inner) = inner.upgrade() {
                    inner.post(super::Inbox::SameHostDone {
                        tcp,
                        token,
                        result: super::SameHostOutcome(result),
                    });
                }
            }),
        };
        match sh.connect_later(job) {
            Ok(()) => ServerSameHost::Later,
            Err(e) => {
                debug!(error = %e, "same-host offer not taken");
                self.release_token(token);
                ServerSameHost::No
            }
        }
    }

    fn same_host_client(
        &mut self,
        _tcp: crate::endpoint::TcpId,
        nonce: u64,
        server_stack: u64,
    ) -> bool {
        self.inner
            .same_host
            .as_ref()
            .is_some_and(|s| s.client_ready(nonce, server_stack))
    }

    fn alloc_token(&mut self, lgr: LgrId) -> Option<u32> {
        self.inner.tokens.write().ok()?.alloc(lgr, &mut rand::rng())
    }

    fn release_token(&mut self, token: u32) {
        if let Ok(mut t) = self.inner.tokens.write() {
            t.release(token);
        }
    }

    fn route_v2(&mut self, local: IpAddr, peer_ip: IpAddr, peer_gid: Gid) -> Option<V2Route> {
        let peer = peer_gid.to_ip();
        let i = sys::interface_of(local)?;
        let direct =
            sys::masked(peer, i.prefix_len) == sys::masked(local, i.prefix_len) || peer == peer_ip;
        direct.then_some(V2Route {
            uses_gateway: false,
            nexthop_mac: Mac::default(),
        })
    }

    fn conn_may_write(&mut self, token: u32) -> bool {
        self.st
            .conns
            .get(&token)
            .is_some_and(|c| matches!(c.lock().conn.state(), State::Active | State::AppCloseWait1))
    }
}
