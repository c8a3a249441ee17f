//! The client's rendezvous (RFC 7609 §3.5.1.2–§3.5.1.5 client steps, §3.5.2.2, §3.5.3;
//! CHECKLIST B.3.2, B.6.2, B.6.3, B.7; Linux `__smc_connect`, `smc_connect_rdma`).

use std::time::Instant;

use arrayvec::ArrayVec;
use smc_wire::clc::{
    AcceptConfirmRepr, AcceptV2, ClcMessage, ClcType, Eyecatcher, FirstContactExt, IpArea,
    PathType, ProposalBody, ProposalRepr, ProposalV2Ext, SameHostAcceptRepr, SameHostOffer,
    SmcdArea, V1Area,
};
use smc_wire::common::{Eid, Gid, Mac, PeerId};
use smc_wire::decline::DeclineCode;
use tracing::debug;

use super::config::{ClcConfig, ProposalLayout};
use super::core::{wait_until, Core, Incoming, LinkWait, NoEnv};
use super::env::{
    AcceptQuery, ClcEnv, ClientLgrRequest, ClientRoute, LgrId, LocalLink, PeerLinkId, PeerQp,
    PeerRmb, ProposalIp, RmbAlloc, V2Params, V2Route,
};
use super::negotiate::{client_v2_limits, V2Offered};
use super::{
    Contact, Eligibility, LinkEvent, Outcome, Output, ResetReason, Role, SameHostEstablished,
    SmcEstablished, V2Established, V2FirstContact, Version, Waiting,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Proposal sent (RFC 7609 B.3.2 C3).
    WaitAccept,
    /// CONFIRM RKEY for a new RMB before the Confirm (§3.5.2.2, Fig 13).
    WaitRkey,
    /// First contact, Confirm sent (B.3.2 C5–C9).
    Link(LinkWait),
    Done,
}

/// What the Accept settled, kept until the Confirm is out.
#[derive(Clone, Debug)]
struct Accepted {
    version: Version,
    contact: Contact,
    lgr: LgrId,
    link: LocalLink,
    server: PeerLinkId,
    server_mtu: u8,
    peer_rmb: PeerRmb,
    rmb: RmbAlloc,
    eid: Option<Eid>,
    v2_first: Option<V2FirstContact>,
}

/// The client side of one rendezvous. See the [module docs](super) for how it is driven.
pub(super) struct Client {
    pub(super) core: Core,
    cfg: ClcConfig,
    route: ClientRoute,
    state: State,
    offered_v1: bool,
    offered_v2: Option<(V2Offered, ArrayVec<Eid, 8>)>,
    offered_same_host: Option<SameHostOffer>,
    accepted: Option<Accepted>,
}

impl Client {
    /// Starts the rendezvous after the TCP handshake completed.
    ///
    /// Not eligible: ends at once in a fallback, nothing is sent. Nothing to offer on
    /// this route (no device, or v2 without a UEID and v1 off): a Decline in place of the
    /// Proposal, then fallback (Linux `smc_find_proposal_devices` → NOSMCDEV). Otherwise
    /// the Proposal goes out and the Accept is awaited.
    pub(super) fn new(
        now: Instant,
        cfg: &ClcConfig,
        route: ClientRoute,
        eligibility: Eligibility,
    ) -> Self {
        let mut m = Client {
            core: Core::new(Role::Client, route.peer_id, cfg.os_type),
            cfg: cfg.clone(),
            route,
            state: State::Done,
            offered_v1: false,
            offered_v2: None,
            offered_same_host: None,
            accepted: None,
        };
        if let Eligibility::NotEligible { reason } = eligibility {
            m.core.not_eligible(reason);
            return m;
        }
        if let Eligibility::PolicyOverride { pattern } = &eligibility {
            debug!(%pattern, "CLC started by policy override (outside RFC 7609)");
        }
        match m.build_proposal() {
            Some(p) => {
                m.core.send(ClcMessage::Proposal(p));
                m.core.deadline = Some(wait_until(now, m.cfg.clc_timeout));
                m.state = State::WaitAccept;
            }
            None => {
                m.core.decline_version = 1;
                m.core.decline(DeclineCode::NOSMCDEV, false, &mut NoEnv);
            }
        }
        m
    }

    /// The Proposal (RFC 7609 A.2.2 / Linux `smc_clc_send_proposal`), or `None` when
    /// nothing can be offered. Commits no RoCE resources (PROP-1).
    fn build_proposal(&mut self) -> Option<ProposalRepr> {
        let v1 = match (&self.route.v1, self.cfg.v1) {
            // IPv6 without a usable prefix: Linux drops v1 (CNFERR).
            (Some((dev, ip)), true) => ip_area(ip).map(|area| (*dev, area)),
            _ => None,
        };
        let v2 = match (&self.route.v2, self.cfg.v2_usable()) {
            (Some(r), true) => {
                let v = &self.cfg.v2_config;
                let mut eids = ArrayVec::<Eid, 8>::new();
                for u in v.ueids.iter().take(8) {
                    eids.push(u.eid());
                }
                let offered = V2Offered {
                    release: v.release.min(15),
                    max_conns: v.max_conns,
                    max_links: v.max_links,
                    feature_mask: v.feature_mask,
                };
                Some((r.device.gid, offered, eids))
            }
            _ => None,
        };
        if v1.is_none() && v2.is_none() {
            return None;
        }
        self.offered_v1 = v1.is_some();
        self.offered_v2 = v2.as_ref().map(|(_, o, e)| (*o, e.clone()));
        // Linux fills the v1 identity fields only when v1 is offered (H3).
        let (peer_id, gid, mac) = match &v1 {
            Some((dev, _)) => (self.route.peer_id, dev.gid, dev.mac),
            None => (PeerId::default(), Gid::default(), Mac::default()),
        };
        let ext = v2.map(|(roce_gid, o, eids)| ProposalV2Ext {
            eids,
            release: o.release,
            seid: false,
            roce_gid,
            max_conns: o.max_conns,
            max_links: o.max_links,
            feature_mask: o.feature_mask,
            smcd: None,
        });
        let rfc = ext.is_none() && self.cfg.proposal_layout == ProposalLayout::Rfc7609;
        let p = if rfc {
            ProposalRepr {
                eyecatcher: Eyecatcher::Smcr,
                version: 1,
                typev1: PathType::R,
                typev2: PathType::R,
                peer_id,
                gid,
                mac,
                body: ProposalBody::V1 {
                    area: V1Area::None,
                    ip: v1.map(|(_, ip)| ip)?,
                },
            }
        } else {
            // smc-rs's same-host offer rides in the SMC-D/v2 area's vendor and reserved
            // bytes, which Linux zeroes and never reads (smc_wire::clc::samehost).
            let mut smcd = SmcdArea::default();
            if let Some(o) = &self.route.same_host {
                o.emit_into(&mut smcd);
                self.offered_same_host = Some(*o);
                self.core.same_host_offered = true;
            }
            ProposalRepr {
                eyecatcher: Eyecatcher::Smcr,
                version: 2,
                typev1: if v1.is_some() {
                    PathType::R
                } else {
                    PathType::N
                },
                typev2: if ext.is_some() {
                    PathType::R
                } else {
                    PathType::N
                },
                peer_id,
                gid,
                mac,
                body: ProposalBody::V2 {
                    smcd,
                    ip: v1.map(|(_, ip)| ip),
                    v2: ext,
                },
            }
        };
        Some(p)
    }

    /// The CLC message awaited now (a Decline is always accepted in its place).
    pub(super) fn expected(&self) -> Option<ClcType> {
        match self.state {
            State::WaitAccept => Some(ClcType::Accept),
            State::Link(_) => Some(ClcType::Decline),
            State::WaitRkey | State::Done => None,
        }
    }

    /// The CONFIRM RKEY asked for with [`Output::ConfirmRkey`] finished.
    pub(super) fn handle_rkey_confirmed<E: ClcEnv + ?Sized>(
        &mut self,
        now: Instant,
        result: Result<(), DeclineCode>,
        env: &mut E,
    ) {
        if self.state != State::WaitRkey {
            return;
        }
        match result {
            Ok(()) => self.send_confirm(now, env),
            Err(code) => self.decline(code, false, env),
        }
    }

    /// Progress of the first link (first contact only).
    pub(super) fn handle_link_event<E: ClcEnv + ?Sized>(
        &mut self,
        now: Instant,
        ev: LinkEvent,
        env: &mut E,
    ) {
        let State::Link(mut w) = self.state else {
            debug!(?ev, "link event outside the link wait ignored");
            return;
        };
        let single = self.single_link();
        let complete = self
            .core
            .link_event(&mut w, ev, now, &self.cfg, single, env);
        self.after_link_step(w, complete);
    }

    /// The timer from [`Self::poll_timeout`] fired (or any later time).
    pub(super) fn on_timeout<E: ClcEnv + ?Sized>(&mut self, now: Instant, env: &mut E) {
        match self.core.deadline {
            Some(d) if d <= now => {}
            _ => return,
        }
        self.core.deadline = None;
        match self.state {
            State::WaitAccept => self.reset(ResetReason::Timeout(Waiting::Accept), env),
            // Our own llc did not finish: still before the Confirm, so decline.
            State::WaitRkey => self.decline(DeclineCode::ERR_REGBUF, false, env),
            State::Link(mut w) => {
                let complete = self.core.link_timeout(&mut w, now, &self.cfg, env);
                self.after_link_step(w, complete);
            }
            State::Done => {}
        }
    }

    /// Waiting for the first link's CONFIRM LINK / ADD LINK outcome.
    pub(super) fn in_link_wait(&self) -> bool {
        matches!(self.state, State::Link(_))
    }

    /// The rendezvous ended (the core has the outcome).
    pub(super) fn set_done(&mut self) {
        self.state = State::Done;
    }

    fn after_link_step(&mut self, w: LinkWait, complete: bool) {
        if self.core.is_done() {
            self.state = State::Done;
        } else if complete {
            self.complete();
        } else {
            self.state = State::Link(w);
        }
    }

    fn single_link(&self) -> bool {
        self.accepted
            .as_ref()
            .and_then(|a| a.v2_first.as_ref())
            .is_some_and(|f| f.params.release >= 1 && f.params.max_links == 1)
    }

    fn reset<E: ClcEnv + ?Sized>(&mut self, r: ResetReason, env: &mut E) {
        self.core.reset(r, env);
        self.state = State::Done;
    }

    fn decline<E: ClcEnv + ?Sized>(&mut self, code: DeclineCode, sync: bool, env: &mut E) {
        self.core.decline(code, sync, env);
        self.state = State::Done;
    }

    pub(super) fn incoming<E: ClcEnv + ?Sized>(
        &mut self,
        now: Instant,
        inc: Incoming,
        env: &mut E,
    ) {
        match inc {
            Incoming::Protocol(why) => self.reset(ResetReason::Protocol(why), env),
            Incoming::Message(ClcType::Decline, bytes) => {
                let wait = match self.state {
                    State::Link(w) => Some(w),
                    _ => None,
                };
                self.core.decline_received(&bytes, wait.as_ref(), env);
                self.state = State::Done;
            }
            Incoming::Message(_, bytes) => {
                // Linux answers in the Accept's version (smc_connect_decline_fallback).
                self.core.decline_version = if bytes[7] >> 4 >= 2 { 2 } else { 1 };
                match ClcMessage::parse(&bytes) {
                    Ok(ClcMessage::Accept(a)) => self.on_accept(now, a, env),
                    Ok(ClcMessage::SameHostAccept(a)) => self.on_same_host_accept(a, env),
                    // An SMC-D Accept: we offered SMC-R only (Linux MODEUNSUPP).
                    Ok(ClcMessage::OtherPath(_)) => {
                        self.decline(DeclineCode::MODEUNSUPP, false, env)
                    }
                    Ok(other) => self.reset(
                        ResetReason::Protocol(format!(
                            "{} received while expecting Accept",
                            other.msg_type().name()
                        )),
                        env,
                    ),
                    Err(e) => {
                        self.core.parse_failed("Accept", e, env);
                        self.state = State::Done;
                    }
                }
            }
        }
    }

    /// An Accept (RFC 7609 §3.5.1.3, §3.5.2.2; CHECKLIST B.3.2 C3–C4, B.6.2, B.6.3).
    fn on_accept<E: ClcEnv + ?Sized>(&mut self, now: Instant, a: AcceptConfirmRepr, env: &mut E) {
        let version = if a.version >= 2 {
            Version::V2
        } else {
            Version::V1
        };
        // Linux `smc_connect_check_aclc`: the Accept must be in a version we offered.
        let offered = match version {
            Version::V1 => self.offered_v1,
            Version::V2 => self.offered_v2.is_some(),
        };
        if !offered {
            return self.decline(DeclineCode::MODEUNSUPP, false, env);
        }
        // Bsize above what we accept: a reserved enumerated value (AMB-09, C.6).
        if a.rmbe_size.code() > self.cfg.max_peer_rmbe_code {
            return self.decline(DeclineCode::VERSMISMAT, false, env);
        }
        let first = a.first_contact;
        let server = PeerLinkId {
            peer_id: a.peer_id,
            gid: a.gid,
            mac: a.mac,
            qpn: a.qpn,
        };
        let mut eid = None;
        let mut v2_first = None;
        if version == Version::V2 {
            let Some((offer, eids)) = &self.offered_v2 else {
                return self.decline(DeclineCode::MODEUNSUPP, false, env);
            };
            let tail = a.v2.clone().unwrap_or_default();
            // The negotiated EID must be one we offered.
            if !eids.contains(&tail.eid) {
                return self.decline(DeclineCode::NOUEID, false, env);
            }
            eid = Some(tail.eid);
            if first {
                let Some(fce) = tail.fce else {
                    return self.reset(
                        ResetReason::Protocol(
                            "first-contact v2 Accept without its first-contact extension".into(),
                        ),
                        env,
                    );
                };
                // Linux `smc_connect_rdma_v2_prepare`.
                let route = if fce.v2_direct {
                    V2Route {
                        uses_gateway: false,
                        nexthop_mac: a.mac,
                    }
                } else {
                    match env.route_v2(a.gid) {
                        None => return self.decline(DeclineCode::NOROUTE, false, env),
                        Some(r) if !r.uses_gateway => {
                            return self.decline(DeclineCode::NOINDIRECT, false, env)
                        }
                        Some(r) => r,
                    }
                };
                let (release, max_conns, max_links, feature_mask) =
                    match client_v2_limits(&fce, offer) {
                        Ok(v) => v,
                        Err(code) => return self.decline(code, false, env),
                    };
                v2_first = Some(V2FirstContact {
                    params: V2Params {
                        eid: tail.eid,
                        release,
                        max_conns,
                        max_links,
                        feature_mask,
                    },
                    peer_os: fce.os_type,
                    peer_hostname: fce.hostname,
                    peer_gids: Vec::new(),
                    route,
                });
            }
        }

        // Classify (B.6.3).
        let lookup = env.client_lookup(&AcceptQuery { version, server });
        let (contact, lgr, link) = if first {
            if lookup.link.is_some() {
                // F = 1 naming one of our active links: out of sync (AMB-14). The
                // server is told (S = 1); our link group stays: this Accept's claim to be
                // its peer is not proof (Peer ID, GID and MAC are not secrets), and a
                // link that really lost its peer fails its TEST LINK on its own.
                return self.decline(DeclineCode::SYNCERR, true, env);
            }
            let contact = if lookup.lgr.is_some() {
                Contact::Parallel
            } else {
                Contact::First
            };
            let Ok(mtu) = a.mtu() else {
                // Parsing validated it on first contact; a reserved value is ENUM-DECL.
                return self.decline(DeclineCode::VERSMISMAT, false, env);
            };
            let req = ClientLgrRequest {
                version,
                peer_id: server.peer_id,
                server: PeerQp {
                    mac: server.mac,
                    gid: server.gid,
                    qpn: server.qpn,
                    psn: a.psn,
                    mtu,
                },
                v2: v2_first.as_ref().map(|f| f.params),
                route: v2_first.as_ref().map(|f| f.route),
            };
            match env.client_create_lgr(&req) {
                Ok((lgr, link)) => {
                    self.core.created_lgr = Some(lgr);
                    (contact, lgr, link)
                }
                Err(code) => return self.decline(code, false, env),
            }
        } else {
            match (lookup.link, lookup.lgr) {
                (Some((lgr, link)), _) => {
                    self.core.referenced_lgr = Some(lgr);
                    (Contact::Subsequent, lgr, link)
                }
                (None, Some(lgr)) => {
                    // The link group exists but not that link (Linux NOSRVLINK).
                    self.core.referenced_lgr = Some(lgr);
                    return self.decline(DeclineCode::NOSRVLINK, false, env);
                }
                // C.4: the server reuses a link group we do not have.
                (None, None) => return self.decline(DeclineCode::SYNCERR, true, env),
            }
        };

        let rmb = match env.alloc_rmb(lgr, link.link, contact.is_first()) {
            Ok(r) => r,
            Err(code) => return self.decline(code, false, env),
        };
        self.core.rmb = Some((lgr, rmb));
        let peer_rmb = PeerRmb {
            rkey: a.rmb_rkey,
            vaddr: a.rmb_vaddr,
            rmbe_idx: a.rmbe_idx,
            size: a.rmbe_size,
            alert_token: a.rmbe_alert_token,
        };
        match env.register_peer_rmb(lgr, link.link, &peer_rmb) {
            Ok(Some(conn)) => self.core.push(Output::AbortConn { conn }),
            Ok(None) => {}
            Err(code) => return self.decline(code, false, env),
        }
        self.accepted = Some(Accepted {
            version,
            contact,
            lgr,
            link,
            server,
            server_mtu: a.qp_mtu,
            peer_rmb,
            rmb,
            eid,
            v2_first,
        });
        if !contact.is_first() && rmb.needs_confirm_rkey {
            // Fig 13: the new RMB is confirmed on every link before the Confirm.
            self.core.push(Output::ConfirmRkey {
                lgr,
                link: link.link,
                rmb: rmb.rmb,
            });
            self.core.deadline = Some(wait_until(now, self.cfg.rkey_timeout));
            self.state = State::WaitRkey;
            return;
        }
        self.send_confirm(now, env);
    }

    /// The Confirm (RFC 7609 A.2.4; Linux `smcr_clc_prep_confirm_accept`).
    fn send_confirm<E: ClcEnv + ?Sized>(&mut self, now: Instant, _env: &mut E) {
        let Some(acc) = self.accepted.clone() else {
            return;
        };
        let first = acc.contact.is_first();
        // Linux: min(path MTU, peer MTU); the peer's is only validated on first contact.
        let qp_mtu = if first {
            acc.link.mtu.code().min(acc.server_mtu)
        } else {
            acc.link.mtu.code()
        };
        let v2 = acc.eid.map(|eid| {
            let fce = acc.v2_first.as_ref().map(|f| FirstContactExt {
                v2_direct: !f.route.uses_gateway,
                os_type: self.cfg.os_type & 0x0F,
                release: f.params.release,
                hostname: self.cfg.hostname,
                max_conns: if f.params.release >= 1 {
                    f.params.max_conns
                } else {
                    0
                },
                max_links: if f.params.release >= 1 {
                    f.params.max_links
                } else {
                    0
                },
                feature_mask: f.params.feature_mask,
                vendor_exp_options: 0,
            });
            let gid_list = fce.map(|_| {
                let mut g: ArrayVec<Gid, { super::MAX_GID_LIST }> = ArrayVec::new();
                match &self.route.v2 {
                    Some(r) if !r.gid_list.is_empty() => g.extend(r.gid_list.iter().copied()),
                    _ => g.push(acc.link.gid),
                }
                g
            });
            AcceptV2 { eid, fce, gid_list }
        });
        let confirm = AcceptConfirmRepr {
            version: acc.version.wire(),
            first_contact: first,
            peer_id: self.route.peer_id,
            gid: acc.link.gid,
            mac: acc.link.mac,
            qpn: acc.link.qpn,
            rmb_rkey: acc.rmb.rkey,
            rmbe_idx: acc.rmb.rmbe_idx,
            rmbe_alert_token: acc.rmb.alert_token,
            rmbe_size: acc.rmb.size,
            qp_mtu,
            rmb_vaddr: acc.rmb.vaddr,
            psn: acc.link.psn,
            v2,
        };
        self.core.send(ClcMessage::Confirm(confirm));
        if first {
            // Wait for CONFIRM LINK; a Decline is still possible both ways (C.2).
            self.core.deadline = Some(wait_until(now, self.cfg.client_confirm_link_timeout));
            self.state = State::Link(LinkWait::default());
        } else {
            // C.1/C.3: committed to SMC-R once the Confirm is sent.
            self.core.may_decline = false;
            self.complete();
        }
    }

    /// The server took our same-host offer. Only a client that offered reads this type
    /// at all (`Core::read`); the nonce must be ours. The server is committed by now
    /// (its side of the shared memory is set up), so a failure here resets.
    fn on_same_host_accept<E: ClcEnv + ?Sized>(&mut self, a: SameHostAcceptRepr, env: &mut E) {
        let Some(o) = self.offered_same_host else {
            return self.reset(
                ResetReason::Protocol("same-host Accept without an offer".into()),
                env,
            );
        };
        if a.nonce != o.nonce {
            return self.reset(
                ResetReason::Protocol("same-host Accept for another nonce".into()),
                env,
            );
        }
        if !env.client_same_host(o.nonce, a.stack_id) {
            return self.reset(ResetReason::LocalFailure(DeclineCode::MEM), env);
        }
        debug!(peer_stack = a.stack_id, "same-host path accepted");
        self.core.finish_smc(Outcome::SameHost(SameHostEstablished {
            role: Role::Client,
            nonce: o.nonce,
            peer_stack: a.stack_id,
        }));
        self.state = State::Done;
    }

    fn complete(&mut self) {
        let Some(acc) = self.accepted.take() else {
            return;
        };
        let v2 = acc.eid.map(|eid| V2Established {
            eid,
            first_contact: acc.v2_first.clone(),
        });
        let est = SmcEstablished {
            role: Role::Client,
            version: acc.version,
            contact: acc.contact,
            lgr: acc.lgr,
            link: acc.link.link,
            local_rmb: acc.rmb,
            peer_rmb_link: acc.link.link,
            peer_link: acc.server,
            peer_rmb: acc.peer_rmb,
            v2,
        };
        self.core.finish_smc(Outcome::Smc(Box::new(est)));
        self.state = State::Done;
    }
}

fn ip_area(ip: &ProposalIp) -> Option<IpArea> {
    match ip {
        ProposalIp::V4 { subnet, prefix_len } if *prefix_len <= 32 => Some(IpArea {
            subnet: *subnet,
            prefix_len: *prefix_len,
            ipv6_prefixes: ArrayVec::new(),
        }),
        ProposalIp::V6 { prefixes }
            if !prefixes.is_empty() && prefixes.iter().all(|p| p.len <= 128) =>
        {
            Some(IpArea {
                subnet: ::core::net::Ipv4Addr::UNSPECIFIED,
                prefix_len: 0,
                ipv6_prefixes: prefixes.clone(),
            })
        }
        _ => None,
    }
}
