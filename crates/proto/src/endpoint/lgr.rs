//! One link group as the endpoint keeps it: identity, the llc machine, its links' QPs,
//! and the accounting of its RMBs (RFC 7609 §2.1, §3.5.5.2, §4.1).

use ::core::net::IpAddr;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

use smc_wire::common::{Eid, Gid, PeerId};
use tracing::debug;

use super::{EndpointConfig, Host, TcpId};
use crate::clc::{self, LgrId, PeerQp, PeerRmb, Version};
use crate::llc::{self, DeviceId, LinkGroup, LlcConfig, QpInfo, RToken};

/// One RMB (one element per RMB, index 1, like Linux).
pub(super) struct Rmb {
    /// Its size in bytes: a freed RMB is reused only for a connection of that size
    /// (sizes differ per connection, BufSizes).
    pub size: usize,
    /// Its RToken on every link it is registered on.
    pub tokens: BTreeMap<llc::LinkId, RToken>,
    /// The alert token of the connection using it.
    pub token: Option<u32>,
    pub in_use: bool,
    /// The llc machine knows it (first RMB, or add_rmb called).
    pub announced: bool,
    pub deleting: bool,
}

pub(super) struct Lgr {
    pub id: LgrId,
    pub role: clc::Role,
    pub version: Version,
    pub peer_id: PeerId,
    pub peer_gid: Gid,
    pub eid: Option<Eid>,
    pub max_conns: usize,
    /// The device of the first link.
    pub device: DeviceId,
    /// Links with a QP, and their local side.
    pub links: BTreeMap<llc::LinkId, QpInfo>,
    pub llc: Option<LinkGroup>,
    pub llc_cfg: LlcConfig,
    pub eyecatcher: bool,
    /// The rendezvous that created it (first-contact milestones go there).
    pub first_rdv: Option<TcpId>,
    pub first_done: bool,
    /// Counted in `Endpoint::server_first_pending` under this peer address.
    pub counted_pending: Option<IpAddr>,
    pub first_rmb: Option<u32>,
    pub first_peer: Option<PeerRmb>,
    pub client_peer_qp: Option<PeerQp>,
    pub rmbs: BTreeMap<u32, Rmb>,
    pub next_rmb: u32,
    pub free_rmbs: Vec<u32>,
    /// Connections (alert tokens).
    pub conns: BTreeSet<u32>,
    /// The peer's RMB elements in use by our connections: (rkey, index) → token.
    pub peer_rmbes: HashMap<(u32, u8), u32>,
    /// CONFIRM RKEY exchanges and the rendezvous waiting for them.
    pub rkey_waiters: HashMap<u32, TcpId>,
    /// Rendezvous in progress using this link group.
    pub rendezvous: usize,
    pub idle: bool,
    pub terminated: bool,
}

/// One link, for listings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkListing {
    /// The endpoint's name of it.
    pub id: llc::LinkId,
    /// Wire link number.
    pub num: u8,
    /// State (llc machine).
    pub state: llc::LinkState,
    /// Our device.
    pub device: DeviceId,
    /// Our QP number.
    pub qpn: u32,
    /// The peer's QP number.
    pub peer_qpn: Option<u32>,
    /// The peer's GID.
    pub peer_gid: Option<Gid>,
}

/// One link group, for listings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LgrListing {
    /// Its id.
    pub id: LgrId,
    /// Our role.
    pub role: clc::Role,
    /// SMC-R version.
    pub version: Version,
    /// The peer's Peer ID.
    pub peer: PeerId,
    /// Links.
    pub links: Vec<LinkListing>,
    /// Connections using it.
    pub conns: usize,
    /// RMBs registered (in use or cached).
    pub rmbs: usize,
    /// RMB elements in use.
    pub rmbs_in_use: usize,
    /// No connection for now (the idle timer runs).
    pub idle: bool,
}

impl Lgr {
    pub fn active(&self) -> bool {
        !self.terminated && self.llc.as_ref().is_some_and(|l| !l.is_terminated())
    }

    pub fn in_use(&self) -> usize {
        self.rmbs.values().filter(|r| r.in_use).count()
    }

    pub fn listing(&self) -> LgrListing {
        LgrListing {
            id: self.id,
            role: self.role,
            version: self.version,
            peer: self.peer_id,
            links: self
                .llc
                .as_ref()
                .map(|l| {
                    l.links()
                        .map(|i| LinkListing {
                            id: i.id,
                            num: i.num,
                            state: i.state,
                            device: i.device,
                            qpn: i.local.map(|q| q.qpn.get()).unwrap_or(0),
                            peer_qpn: i.peer.map(|p| p.qpn.get()),
                            peer_gid: i.peer.map(|p| p.gid),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            conns: self.conns.len(),
            rmbs: self.rmbs.len(),
            rmbs_in_use: self.in_use(),
            idle: self.idle,
        }
    }

    /// An RMB element is no longer used: keep the RMB for reuse, or delete it (DELETE
    /// RKEY first when the peer knows it, RFC 7609 §3.5.5.2.2). `from_rendezvous`: it
    /// was never used by a connection (a failed rendezvous gives it back).
    pub fn release_rmb(
        &mut self,
        host: &mut dyn Host,
        cfg: &EndpointConfig,
        id: u32,
        now: Instant,
        from_rendezvous: bool,
    ) {
        let lgr = self.id;
        let Some(rmb) = self.rmbs.get_mut(&id) else {
            return;
        };
        if let Some(t) = rmb.token.take() {
            host.release_token(t);
        }
        rmb.in_use = false;
        let known = rmb.announced;
        let confirmed = self
            .llc
            .as_ref()
            .is_some_and(|l| l.rmb_confirmed(llc::RmbId(id)));
        if self.terminated || self.llc.as_ref().is_none_or(|l| l.is_terminated()) {
            self.rmbs.remove(&id);
            host.free_rmb(lgr, llc::RmbId(id));
            return;
        }
        if !known {
            // Never announced to the peer: nothing to tell it.
            if from_rendezvous || self.free_rmbs.len() >= cfg.rmb_cache {
                self.rmbs.remove(&id);
                host.free_rmb(lgr, llc::RmbId(id));
            } else {
                self.free_rmbs.push(id);
            }
            return;
        }
        if confirmed && self.free_rmbs.len() < cfg.rmb_cache {
            self.free_rmbs.push(id);
            return;
        }
        // RFC 7609 §3.5.5.2.2: the peer forgets the RKeys before the memory goes.
        rmb.deleting = true;
        if let Some(l) = self.llc.as_mut() {
            if let Err(e) = l.delete_rmb(now, llc::RmbId(id)) {
                debug!(error = %e, "DELETE RKEY not possible; freeing the RMB");
                self.rmbs.remove(&id);
                host.free_rmb(lgr, llc::RmbId(id));
            }
        }
    }
}
