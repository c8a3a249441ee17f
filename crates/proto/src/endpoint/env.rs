//! What a rendezvous asks of the endpoint ([`ClcEnv`]): link-group lookups and creation,
//! RMB elements and tokens, the peer's RMB, routes and cleanup.

use ::core::net::IpAddr;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use smc_wire::common::{BufSize, Gid, PeerId};
use smc_wire::decline::DeclineCode;
use tracing::{info, warn};

use super::lgr::{Lgr, Rmb};
use super::{Endpoint, Host, TcpId};
use crate::clc::{
    self, AcceptQuery, ClcEnv, ClientLgrRequest, ClientLookup, ConnRef, LgrId, LgrLookup, LgrQuery,
    LocalLink, PeerLinkId, PeerQp, PeerRmb, RmbAlloc, RmbId, ServerLgrRequest, V2Params, V2Route,
    Version,
};
use crate::llc::{self, DeviceId, LinkGroup, LlcConfig};

/// The environment of one rendezvous step.
pub(super) struct Env<'a> {
    ep: &'a mut Endpoint,
    host: &'a mut dyn Host,
    tcp: TcpId,
    device: Option<DeviceId>,
    local: IpAddr,
    peer: IpAddr,
    lgr_refs: &'a mut Vec<LgrId>,
    now: Instant,
    /// This connection's RMB size, if not the endpoint's.
    rmb_size: Option<BufSize>,
}

impl<'a> Env<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ep: &'a mut Endpoint,
        host: &'a mut dyn Host,
        tcp: TcpId,
        device: Option<DeviceId>,
        local: IpAddr,
        peer: IpAddr,
        lgr_refs: &'a mut Vec<LgrId>,
        now: Instant,
        rmb_size: Option<BufSize>,
    ) -> Env<'a> {
        Env {
            ep,
            host,
            tcp,
            device,
            local,
            peer,
            lgr_refs,
            now,
            rmb_size,
        }
    }

    /// Our side of a link of `g`, for CLC messages.
    fn local_link(&self, g: &Lgr, link: llc::LinkId) -> Option<LocalLink> {
        let qp = g.links.get(&link)?;
        let dev = g
            .llc
            .as_ref()
            .and_then(|l| l.link(link))
            .map(|i| i.device)
            .unwrap_or(g.device);
        let dev = self.ep.device(dev)?;
        Some(LocalLink {
            link,
            gid: dev.gid,
            mac: dev.mac,
            qpn: qp.qpn,
            psn: qp.psn,
            mtu: qp.mtu,
        })
    }

    fn new_lgr(
        &mut self,
        role: clc::Role,
        version: Version,
        peer_id: PeerId,
        peer_gid: Gid,
        v2: Option<V2Params>,
    ) -> Result<(LgrId, LocalLink), DeclineCode> {
        let Some(device) = self.device else {
            return Err(DeclineCode::NOSMCRDEV);
        };
        let id = LgrId(self.ep.next_lgr + 1);
        self.ep.next_lgr += 1;
        let qp = self
            .host
            .create_link(id, llc::LinkId::FIRST, device)
            .map_err(|e| {
                warn!(error = %e, "cannot create the first link's QP");
                DeclineCode::MEM
            })?;
        // Linux layout and behaviour between our stacks too: one code path that also
        // interoperates with Linux (SMC-Rv2 is configuration, not a rewrite).
        let mut cfg = LlcConfig::linux(role, version);
        cfg.lgr_id = (id.0 as u32) & 0x00FF_FFFF;
        if let Some(p) = v2 {
            cfg.max_conns = p.max_conns;
            cfg.max_links = p.max_links.clamp(1, 2);
        }
        let c = &self.ep.cfg;
        cfg.timers.linger = Some(match role {
            clc::Role::Server => c.lgr_idle_timeout,
            clc::Role::Client => c.lgr_idle_timeout + Duration::from_secs(10),
        });
        cfg.timers.test_link_interval = c.keepalive;
        cfg.timers.reply = c.llc_reply_timeout;
        cfg.timers.add_link_retry = Some(c.add_link_retry);
        let max_conns = v2.map(|p| usize::from(p.max_conns)).unwrap_or(255).max(1);
        let mut links = BTreeMap::new();
        links.insert(llc::LinkId::FIRST, qp);
        let g = Lgr {
            id,
            role,
            version,
            peer_id,
            peer_gid,
            eid: v2.map(|p| p.eid),
            max_conns,
            device,
            links,
            llc: None,
            eyecatcher: cfg.rmbe_eyecatcher,
            llc_cfg: cfg,
            first_rdv: Some(self.tcp),
            first_done: false,
            counted_pending: (role == clc::Role::Server).then_some(self.peer),
            first_rmb: None,
            first_peer: None,
            client_peer_qp: None,
            rmbs: BTreeMap::new(),
            next_rmb: 1,
            free_rmbs: Vec::new(),
            conns: BTreeSet::new(),
            peer_rmbes: HashMap::new(),
            rkey_waiters: HashMap::new(),
            rendezvous: 1,
            idle: false,
            terminated: false,
        };
        let local = self
            .local_link(&g, llc::LinkId::FIRST)
            .ok_or(DeclineCode::INTERR)?;
        self.ep.lgrs.insert(id, g);
        if role == clc::Role::Server {
            *self.ep.server_first_pending.entry(self.peer).or_insert(0) += 1;
        }
        self.lgr_refs.push(id);
        info!(lgr = id.0, ?role, ?version, "new link group");
        Ok((id, local))
    }

    /// This rendezvous uses an existing link group (it stays out of idle).
    fn join(&mut self, lgr: LgrId) {
        if self.lgr_refs.contains(&lgr) {
            return;
        }
        if let Some(g) = self.ep.lgrs.get_mut(&lgr) {
            g.rendezvous += 1;
            if g.idle {
                g.idle = false;
                if let Some(l) = g.llc.as_mut() {
                    l.set_idle(self.now, false);
                }
            }
            self.lgr_refs.push(lgr);
        }
    }

    /// Creates the llc machine of a first contact once both RMBs are known.
    fn start_llc(&mut self, lgr: LgrId) -> Result<(), DeclineCode> {
        let g = self.ep.lgrs.get(&lgr).ok_or(DeclineCode::INTERR)?;
        let local = *g
            .links
            .get(&llc::LinkId::FIRST)
            .ok_or(DeclineCode::INTERR)?;
        let peer = g.client_peer_qp.ok_or(DeclineCode::INTERR)?;
        let peer_rmb = g.first_peer.ok_or(DeclineCode::INTERR)?;
        let rmb_id = g.first_rmb.ok_or(DeclineCode::INTERR)?;
        let token = *g
            .rmbs
            .get(&rmb_id)
            .and_then(|r| r.tokens.get(&llc::LinkId::FIRST))
            .ok_or(DeclineCode::INTERR)?;
        let dev = self.ep.device(g.device).ok_or(DeclineCode::INTERR)?;
        let first = llc::FirstLink {
            device: g.device,
            local,
            // The path MTU: the smaller of both sides' (RFC 7609 A.2.3).
            peer: PeerQp {
                mtu: local.mtu.min(peer.mtu),
                ..peer
            },
            local_rmb: llc::RmbId(rmb_id),
            local_token: token,
            peer_token: llc::RToken {
                rkey: peer_rmb.rkey,
                vaddr: peer_rmb.vaddr,
            },
        };
        // The first link's device, and every device that may carry more links.
        let devices = self.ep.llc_devices(dev.id);
        let g = self.ep.lgrs.get_mut(&lgr).ok_or(DeclineCode::INTERR)?;
        let lg = LinkGroup::new(g.llc_cfg.clone(), devices, first, self.now).map_err(|e| {
            warn!(error = %e, "cannot start the link group machine");
            DeclineCode::INTERR
        })?;
        if let Some(r) = g.rmbs.get_mut(&rmb_id) {
            r.announced = true;
        }
        g.llc = Some(lg);
        self.ep.dirty.insert(lgr);
        Ok(())
    }

    fn connect_first_link(&mut self, lgr: LgrId, peer: &PeerQp) -> Result<(), DeclineCode> {
        let mtu = self
            .ep
            .lgrs
            .get(&lgr)
            .and_then(|g| g.links.get(&llc::LinkId::FIRST))
            .ok_or(DeclineCode::INTERR)?
            .mtu;
        let p = PeerQp {
            mtu: mtu.min(peer.mtu),
            ..*peer
        };
        self.host
            .connect_link(lgr, llc::LinkId::FIRST, &p)
            .map_err(|e| {
                warn!(error = %e, "cannot ready the first link's QP");
                DeclineCode::ERR_RDYLNK
            })
    }
}

impl ClcEnv for Env<'_> {
    fn server_same_host(&mut self, offer: &smc_wire::clc::SameHostOffer) -> clc::ServerSameHost {
        self.host.same_host_server(self.tcp, offer)
    }

    fn client_same_host(&mut self, nonce: u64, server_stack: u64) -> bool {
        self.host.same_host_client(self.tcp, nonce, server_stack)
    }

    fn server_find_lgr(&mut self, q: &LgrQuery) -> LgrLookup {
        let mut exists = false;
        let mut found = None;
        for g in self.ep.lgrs.values() {
            if g.role != clc::Role::Server || g.version != q.version || !g.active() {
                continue;
            }
            let same_peer = match q.version {
                Version::V1 => g.peer_id == q.peer_id,
                Version::V2 => g.peer_gid == q.peer_gid && g.eid == q.v2.as_ref().map(|p| p.eid),
            };
            if !same_peer {
                continue;
            }
            exists = true;
            if g.conns.len() + g.rendezvous >= g.max_conns.min(255) {
                continue;
            }
            let Some(lg) = g.llc.as_ref() else { continue };
            // Prefer the link whose peer is the client's preferred GID/MAC.
            let mut pick = None;
            for info in lg.links() {
                if info.state != llc::LinkState::Active {
                    continue;
                }
                let pref = info.peer.is_some_and(|p| p.gid == q.peer_gid);
                if pick.is_none() || pref {
                    pick = Some(info.id);
                }
            }
            if let Some(l) = pick.and_then(|l| self.local_link(g, l)) {
                found = Some((g.id, l));
                break;
            }
        }
        match found {
            Some((lgr, link)) => {
                self.join(lgr);
                LgrLookup::Join { lgr, link }
            }
            None if exists => LgrLookup::AllFull,
            None => LgrLookup::None,
        }
    }

    fn server_create_lgr(
        &mut self,
        req: &ServerLgrRequest,
    ) -> Result<(LgrId, LocalLink), DeclineCode> {
        self.new_lgr(
            clc::Role::Server,
            req.version,
            req.peer_id,
            req.peer_gid,
            req.v2,
        )
    }

    fn server_match_link(&mut self, lgr: LgrId, client: &PeerLinkId) -> Option<clc::LinkId> {
        let g = self.ep.lgrs.get(&lgr)?;
        let lg = g.llc.as_ref()?;
        lg.links()
            .find(|i| {
                i.state == llc::LinkState::Active
                    && i.peer.is_some_and(|p| {
                        p.qpn == client.qpn
                            && p.gid == client.gid
                            && (g.version == Version::V2 || p.mac == client.mac)
                    })
            })
            .map(|i| i.id)
    }

    fn server_start_first_link(
        &mut self,
        lgr: LgrId,
        link: clc::LinkId,
        _peer_id: PeerId,
        client: &PeerQp,
    ) -> Result<(), DeclineCode> {
        if link != llc::LinkId::FIRST {
            return Err(DeclineCode::INTERR);
        }
        self.connect_first_link(lgr, client)?;
        let g = self.ep.lgrs.get_mut(&lgr).ok_or(DeclineCode::INTERR)?;
        g.client_peer_qp = Some(*client);
        self.start_llc(lgr)
    }

    fn client_lookup(&mut self, q: &AcceptQuery) -> ClientLookup {
        let mut out = ClientLookup::default();
        for g in self.ep.lgrs.values() {
            if g.role != clc::Role::Client || g.peer_id != q.server.peer_id || !g.active() {
                continue;
            }
            out.lgr.get_or_insert(g.id);
            let Some(lg) = g.llc.as_ref() else { continue };
            for info in lg.links() {
                if info.state != llc::LinkState::Active {
                    continue;
                }
                if let Some(p) = info.peer {
                    if p.qpn == q.server.qpn
                        && p.gid == q.server.gid
                        && (q.version == Version::V2 || p.mac == q.server.mac)
                        && g.conns.len() + g.rendezvous < 255
                    {
                        if let Some(l) = self.local_link(g, info.id) {
                            out.link = Some((g.id, l));
                        }
                    }
                }
            }
        }
        if let Some((lgr, _)) = out.link {
            self.join(lgr);
        }
        out
    }

    fn client_create_lgr(
        &mut self,
        req: &ClientLgrRequest,
    ) -> Result<(LgrId, LocalLink), DeclineCode> {
        let (lgr, local) = self.new_lgr(
            clc::Role::Client,
            req.version,
            req.peer_id,
            req.server.gid,
            req.v2,
        )?;
        if let Some(g) = self.ep.lgrs.get_mut(&lgr) {
            g.client_peer_qp = Some(req.server);
        }
        // RTR to receive CONFIRM LINK, RTS to answer it (RFC 7609 §3.5.1.3).
        self.connect_first_link(lgr, &req.server)?;
        Ok((lgr, local))
    }

    fn alloc_rmb(
        &mut self,
        lgr: LgrId,
        link: clc::LinkId,
        first_contact: bool,
    ) -> Result<RmbAlloc, DeclineCode> {
        let size = self.rmb_size.unwrap_or(self.ep.rmb_size);
        let token = self.host.alloc_token(lgr).ok_or(DeclineCode::MEM)?;
        let res = self.rmb_for(lgr, link, size.bytes(), first_contact);
        let (id, needs_confirm, tok) = match res {
            Ok(x) => x,
            Err(code) => {
                self.host.release_token(token);
                return Err(code);
            }
        };
        let g = self.ep.lgrs.get_mut(&lgr).ok_or(DeclineCode::INTERR)?;
        let rmb = g.rmbs.get_mut(&id).ok_or(DeclineCode::INTERR)?;
        rmb.in_use = true;
        rmb.token = Some(token);
        if first_contact {
            g.first_rmb = Some(id);
        }
        Ok(RmbAlloc {
            rmb: RmbId(id),
            rkey: tok.rkey,
            vaddr: tok.vaddr,
            rmbe_idx: 1,
            size,
            alert_token: token,
            needs_confirm_rkey: needs_confirm,
        })
    }

    fn register_peer_rmb(
        &mut self,
        lgr: LgrId,
        _link: clc::LinkId,
        peer: &PeerRmb,
    ) -> Result<Option<ConnRef>, DeclineCode> {
        // RFC 7609 §4.4.2: only a connection that may still RDMA-write into that element
        // conflicts. The peer reuses an element as soon as its side is CLOSED, and its
        // Accept/Confirm (TCP) can overtake its last close CDC (RoCE); our old connection
        // has then sent D, C or A already and never writes data again (RFC 7609 §4.8,
        // TRM-2), so it simply finishes its close.
        let key = (peer.rkey, peer.rmbe_idx);
        let owner = self
            .ep
            .lgrs
            .get(&lgr)
            .ok_or(DeclineCode::INTERR)?
            .peer_rmbes
            .get(&key)
            .copied();
        let conflict = match owner {
            Some(t) if self.host.conn_may_write(t) => Some(ConnRef(u64::from(t))),
            Some(_) => {
                if let Some(g) = self.ep.lgrs.get_mut(&lgr) {
                    g.peer_rmbes.remove(&key);
                }
                None
            }
            None => None,
        };
        let g = self.ep.lgrs.get_mut(&lgr).ok_or(DeclineCode::INTERR)?;
        if g.llc.is_none() {
            g.first_peer = Some(*peer);
            if g.role == clc::Role::Client {
                // The client's llc machine waits for CONFIRM LINK from now on.
                self.start_llc(lgr)?;
            }
        }
        Ok(conflict)
    }

    fn route_v2(&mut self, peer_gid: Gid) -> Option<V2Route> {
        self.host.route_v2(self.local, self.peer, peer_gid)
    }

    fn free_rmb(&mut self, lgr: LgrId, rmb: RmbId) {
        let now = self.now;
        if let Some(g) = self.ep.lgrs.get_mut(&lgr) {
            g.release_rmb(self.host, &self.ep.cfg, rmb.0, now, true);
            self.ep.dirty.insert(lgr);
        }
    }

    fn abandon_lgr(&mut self, lgr: LgrId) {
        if let Some(g) = self.ep.lgrs.get_mut(&lgr) {
            info!(lgr = lgr.0, "link group abandoned (rendezvous failed)");
            match g.llc.as_mut() {
                Some(l) => l.abort(),
                None => g.terminated = true,
            }
            self.ep.dirty.insert(lgr);
        }
    }
}

impl Env<'_> {
    /// An RMB for a connection on `link` of `lgr`: a cached one, or a new one registered
    /// on every link with a QP. Returns its id, whether the peer must learn it with
    /// CONFIRM RKEY first (a new RMB after first contact), and its RToken on `link`.
    fn rmb_for(
        &mut self,
        lgr: LgrId,
        link: llc::LinkId,
        size: usize,
        first_contact: bool,
    ) -> Result<(u32, bool, llc::RToken), DeclineCode> {
        let g = self.ep.lgrs.get_mut(&lgr).ok_or(DeclineCode::INTERR)?;
        let reusable = g
            .free_rmbs
            .iter()
            .rposition(|id| g.rmbs.get(id).is_some_and(|r| r.size == size));
        if let Some(id) = reusable.map(|i| g.free_rmbs.remove(i)) {
            let tok = g.rmbs.get(&id).and_then(|r| r.tokens.get(&link)).copied();
            let Some(tok) = tok else {
                // Not on this link (cannot happen while every RMB is on every link).
                g.free_rmbs.push(id);
                return Err(DeclineCode::ERR_RTOK);
            };
            // RFC 7609 §4.1 / CHECKLIST RE-3: the element starts zeroed.
            self.host.clear_rmb(lgr, llc::RmbId(id));
            return Ok((id, false, tok));
        }
        if g.rmbs.len() >= 255 {
            return Err(DeclineCode::MEM);
        }
        let id = g.next_rmb;
        g.next_rmb += 1;
        let links: Vec<llc::LinkId> = g.links.keys().copied().collect();
        self.host
            .create_rmb(lgr, llc::RmbId(id), size)
            .map_err(|e| {
                warn!(error = %e, "RMB allocation failed");
                DeclineCode::MEM
            })?;
        let mut tokens = BTreeMap::new();
        for l in links {
            match self.host.register_rmb(lgr, llc::RmbId(id), l) {
                Ok(t) => {
                    tokens.insert(l, t);
                }
                Err(e) => {
                    warn!(error = %e, "RMB registration failed");
                    self.host.free_rmb(lgr, llc::RmbId(id));
                    return Err(DeclineCode::MEM);
                }
            }
        }
        let tok = *tokens.get(&link).ok_or_else(|| {
            self.host.free_rmb(lgr, llc::RmbId(id));
            DeclineCode::ERR_RTOK
        })?;
        let g = self.ep.lgrs.get_mut(&lgr).ok_or(DeclineCode::INTERR)?;
        g.rmbs.insert(
            id,
            Rmb {
                size,
                tokens,
                token: None,
                in_use: false,
                announced: false,
                deleting: false,
            },
        );
        Ok((id, !first_contact, tok))
    }
}
