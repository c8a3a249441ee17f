//! The server's rendezvous (RFC 7609 §3.5.1.2–§3.5.1.5 server steps, §3.5.2.1,
//! §3.5.2.3, §3.5.3; CHECKLIST B.3.1, B.6.1, B.7; Linux `smc_listen_work`).

use std::time::Instant;

use smc_wire::clc::{
    AcceptConfirmRepr, AcceptV2, ClcMessage, ClcType, FirstContactExt, ProposalBody, ProposalRepr,
    SameHostAcceptRepr, SameHostOffer, V1Area,
};
use smc_wire::common::{Gid, HostName};
use smc_wire::decline::DeclineCode;
use tracing::debug;

use super::config::ClcConfig;
use super::core::{wait_until, Core, Incoming, LinkWait};
use super::env::{
    ClcEnv, LgrId, LgrLookup, LgrQuery, LinkId, LocalLink, PeerLinkId, PeerQp, PeerRmb, RmbAlloc,
    ServerLgrRequest, ServerRoute, ServerSameHost, V2Params, V2Route,
};
use super::negotiate::{server_choose, server_confirm_check, Choice};
use super::{
    Contact, Eligibility, LinkEvent, Outcome, Output, ResetReason, Role, SameHostEstablished,
    SmcEstablished, V2Established, V2FirstContact, Version, Waiting,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Waiting for the Proposal (B.3.1 S2).
    WaitProposal,
    /// The runtime's same-host exchange for the client's offer runs elsewhere
    /// ([`ServerSameHost::Later`]); the Proposal waits in `Server::same_host_wait`.
    WaitSameHost,
    /// CONFIRM RKEY for a new RMB before the Accept (§3.5.2.1, SC-S3).
    WaitRkey,
    /// Accept sent (B.3.1 S7).
    WaitConfirm,
    /// First contact: CONFIRM LINK and the ADD LINK attempt (S9–S11).
    Link(LinkWait),
    Done,
}

/// What the Proposal settled, kept until the end.
#[derive(Clone, Debug)]
struct Chosen {
    version: Version,
    contact: Contact,
    lgr: LgrId,
    link: LocalLink,
    rmb: RmbAlloc,
    v2: Option<(V2Params, V2Route)>,
    /// Filled by the Confirm.
    client: Option<(PeerLinkId, LinkId, PeerRmb)>,
    client_v2: Option<(u8, HostName, Vec<Gid>, u16)>,
}

/// The server side of one rendezvous. See the [module docs](super) for how it is driven.
pub(super) struct Server {
    pub(super) core: Core,
    cfg: ClcConfig,
    route: ServerRoute,
    state: State,
    chosen: Option<Chosen>,
    /// In [`State::WaitSameHost`]: the offer and the Proposal it came in, for the SMC-R
    /// answer if the offer is not taken after all.
    same_host_wait: Option<(SameHostOffer, ProposalRepr)>,
}

impl Server {
    /// Starts the rendezvous on an accepted TCP connection. Not eligible: ends at once in
    /// a fallback (no CLC is expected). Otherwise waits for the Proposal.
    pub(super) fn new(
        now: Instant,
        cfg: &ClcConfig,
        route: ServerRoute,
        eligibility: Eligibility,
    ) -> Self {
        let mut m = Server {
            core: Core::new(Role::Server, route.peer_id, cfg.os_type),
            cfg: cfg.clone(),
            route,
            state: State::Done,
            chosen: None,
            same_host_wait: None,
        };
        match eligibility {
            Eligibility::NotEligible { reason } => m.core.not_eligible(reason),
            other => {
                if let Eligibility::PolicyOverride { pattern } = other {
                    debug!(%pattern, "CLC started by policy override (outside RFC 7609)");
                }
                m.core.deadline = Some(wait_until(now, m.cfg.clc_timeout));
                m.state = State::WaitProposal;
            }
        }
        m
    }

    /// The CLC message awaited now (a Decline is always accepted in its place).
    pub(super) fn expected(&self) -> Option<ClcType> {
        match self.state {
            State::WaitProposal => Some(ClcType::Proposal),
            State::WaitConfirm => Some(ClcType::Confirm),
            State::Link(_) => Some(ClcType::Decline),
            State::WaitSameHost | State::WaitRkey | State::Done => None,
        }
    }

    /// The outcome of a same-host exchange the environment ran elsewhere
    /// ([`ServerSameHost::Later`]): `Some(our stack id)` takes the offer, `None` answers
    /// the Proposal with SMC-R as if nothing had been offered. Ignored when no longer
    /// waiting (expired: the SMC-R answer went already).
    pub(super) fn handle_same_host<E: ClcEnv + ?Sized>(
        &mut self,
        now: Instant,
        taken: Option<u64>,
        env: &mut E,
    ) {
        if self.state != State::WaitSameHost {
            return;
        }
        let Some((offer, p)) = self.same_host_wait.take() else {
            return;
        };
        match taken {
            Some(stack_id) => self.take_same_host(offer, stack_id),
            None => self.answer_smcr(now, p, env),
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
            Ok(()) => self.send_accept(now),
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
        let single = self
            .chosen
            .as_ref()
            .and_then(|c| c.v2)
            .is_some_and(|(p, _)| p.release >= 1 && p.max_links == 1);
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
            State::WaitProposal => self.reset(ResetReason::Timeout(Waiting::Proposal), env),
            // The exchange did not finish in time: SMC-R, as if nothing had been offered.
            State::WaitSameHost => {
                debug!("same-host exchange not done in time: SMC-R");
                if let Some((_, p)) = self.same_host_wait.take() {
                    self.answer_smcr(now, p, env);
                }
            }
            // Still before the Accept: decline.
            State::WaitRkey => self.decline(DeclineCode::ERR_REGBUF, false, env),
            State::WaitConfirm => self.reset(ResetReason::Timeout(Waiting::Confirm), env),
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
            Incoming::Message(ClcType::Proposal, bytes) => {
                // Linux declines in the Proposal's version (smc_listen_decline).
                self.core.decline_version = if bytes[7] >> 4 >= 2 { 2 } else { 1 };
                match ProposalRepr::parse(&bytes) {
                    Ok(p) => self.on_proposal(now, p, env),
                    Err(e) => {
                        self.core.parse_failed("Proposal", e, env);
                        self.state = State::Done;
                    }
                }
            }
            Incoming::Message(_, bytes) => self.on_confirm_bytes(now, bytes, env),
        }
    }

    /// A Proposal (RFC 7609 §3.5.1.2, §3.5.2.1; CHECKLIST B.3.1 S3–S6, B.6.1).
    fn on_proposal<E: ClcEnv + ?Sized>(&mut self, now: Instant, p: ProposalRepr, env: &mut E) {
        if self.route.same_host {
            if let Some(offer) = same_host_offer(&p) {
                // smc-rs's same-host path (smc_wire::clc::samehost): taken only when the
                // runtime proved the client is on this host and mapped the memory;
                // otherwise the offer is ignored, as a Linux server ignores it.
                match env.server_same_host(&offer) {
                    ServerSameHost::Taken(stack_id) => return self.take_same_host(offer, stack_id),
                    ServerSameHost::Later => {
                        self.same_host_wait = Some((offer, p));
                        self.core.deadline = Some(wait_until(now, self.cfg.same_host_timeout));
                        self.state = State::WaitSameHost;
                        return;
                    }
                    ServerSameHost::No => {}
                }
            }
        }
        self.answer_smcr(now, p, env);
    }

    /// The same-host Accept: the offer is taken (the shared memory is set up).
    fn take_same_host(&mut self, offer: SameHostOffer, stack_id: u64) {
        self.core
            .send(ClcMessage::SameHostAccept(SameHostAcceptRepr {
                stack_id,
                nonce: offer.nonce,
            }));
        self.core.may_decline = false;
        self.core.finish_smc(Outcome::SameHost(SameHostEstablished {
            role: Role::Server,
            nonce: offer.nonce,
            peer_stack: offer.stack_id,
        }));
        self.state = State::Done;
    }

    /// The Proposal answered with SMC-R (or a Decline).
    fn answer_smcr<E: ClcEnv + ?Sized>(&mut self, now: Instant, p: ProposalRepr, env: &mut E) {
        let choice = match server_choose(&p, &self.cfg, &self.route, |g| env.route_v2(g)) {
            Ok(c) => c,
            Err(code) => return self.decline(code, false, env),
        };
        let (version, peer_gid, v2) = match choice {
            Choice::V1 => (Version::V1, p.gid, None),
            Choice::V2 {
                params,
                route,
                client_gid,
            } => (Version::V2, client_gid, Some((params, route))),
        };
        debug!(?version, "Proposal accepted");
        let query = LgrQuery {
            version,
            peer_id: p.peer_id,
            peer_gid,
            peer_mac: p.mac,
            v2: v2.map(|(p, _)| p),
        };
        let (contact, lgr, link) = match env.server_find_lgr(&query) {
            LgrLookup::Join { lgr, link } => {
                self.core.referenced_lgr = Some(lgr);
                (Contact::Subsequent, lgr, link)
            }
            found => {
                let contact = if found == LgrLookup::AllFull {
                    Contact::Parallel
                } else {
                    Contact::First
                };
                let req = ServerLgrRequest {
                    version,
                    peer_id: p.peer_id,
                    peer_gid,
                    peer_mac: p.mac,
                    v2: v2.map(|(p, _)| p),
                    route: v2.map(|(_, r)| r),
                };
                match env.server_create_lgr(&req) {
                    Ok((lgr, link)) => {
                        self.core.created_lgr = Some(lgr);
                        (contact, lgr, link)
                    }
                    Err(code) => return self.decline(code, false, env),
                }
            }
        };
        let rmb = match env.alloc_rmb(lgr, link.link, contact.is_first()) {
            Ok(r) => r,
            Err(code) => return self.decline(code, false, env),
        };
        self.core.rmb = Some((lgr, rmb));
        self.chosen = Some(Chosen {
            version,
            contact,
            lgr,
            link,
            rmb,
            v2,
            client: None,
            client_v2: None,
        });
        if !contact.is_first() && rmb.needs_confirm_rkey {
            // SC-S3: CONFIRM RKEY on all links completes before the Accept.
            self.core.push(Output::ConfirmRkey {
                lgr,
                link: link.link,
                rmb: rmb.rmb,
            });
            self.core.deadline = Some(wait_until(now, self.cfg.rkey_timeout));
            self.state = State::WaitRkey;
            return;
        }
        self.send_accept(now);
    }

    /// The Accept (RFC 7609 A.2.3; Linux `smcr_clc_prep_confirm_accept`).
    fn send_accept(&mut self, now: Instant) {
        let Some(c) = self.chosen.clone() else {
            return;
        };
        let first = c.contact.is_first();
        let v2 = c.v2.map(|(params, route)| AcceptV2 {
            eid: params.eid,
            fce: first.then_some(FirstContactExt {
                v2_direct: !route.uses_gateway,
                os_type: self.cfg.os_type & 0x0F,
                release: params.release,
                hostname: self.cfg.hostname,
                max_conns: if params.release >= 1 {
                    params.max_conns
                } else {
                    0
                },
                max_links: if params.release >= 1 {
                    params.max_links
                } else {
                    0
                },
                feature_mask: params.feature_mask,
                vendor_exp_options: 0,
            }),
            gid_list: None,
        });
        let accept = AcceptConfirmRepr {
            version: c.version.wire(),
            first_contact: first,
            peer_id: self.route.peer_id,
            gid: c.link.gid,
            mac: c.link.mac,
            qpn: c.link.qpn,
            rmb_rkey: c.rmb.rkey,
            rmbe_idx: c.rmb.rmbe_idx,
            rmbe_alert_token: c.rmb.alert_token,
            rmbe_size: c.rmb.size,
            qp_mtu: c.link.mtu.code(),
            rmb_vaddr: c.rmb.vaddr,
            psn: c.link.psn,
            v2,
        };
        self.core.send(ClcMessage::Accept(accept));
        if !first {
            // No chase (C.1, C.3): never a Decline after a subsequent-contact Accept.
            self.core.may_decline = false;
        }
        self.core.deadline = Some(wait_until(now, self.cfg.clc_timeout));
        self.state = State::WaitConfirm;
    }

    /// The Confirm (RFC 7609 §3.5.1.4, §3.5.2.3; CHECKLIST A.2.4, B.3.1 S7–S8, B.6.1 SC-S7).
    fn on_confirm_bytes<E: ClcEnv + ?Sized>(
        &mut self,
        now: Instant,
        mut bytes: Vec<u8>,
        env: &mut E,
    ) {
        let Some(mut c) = self.chosen.clone() else {
            return self.reset(ResetReason::Protocol("Confirm without Accept".into()), env);
        };
        let first = c.contact.is_first();
        // Bit 0x08 of a Confirm is reserved in RFC 7609 (A.2.4, TC-CLC-21): judge the
        // message by our own first-contact decision, so the MTU is validated exactly on
        // first contact (A.2.3).
        bytes[7] &= !0x08;
        let confirm = match ClcMessage::parse(&bytes) {
            Ok(ClcMessage::Confirm(x)) => x,
            Ok(other) => {
                return self.reset(
                    ResetReason::Protocol(format!(
                        "{} Confirm received for an SMC-R Accept",
                        if matches!(other, ClcMessage::OtherPath(_)) {
                            "an SMC-D"
                        } else {
                            "a non-SMC-R"
                        }
                    )),
                    env,
                )
            }
            Err(e) => {
                self.core.parse_failed("Confirm", e, env);
                self.state = State::Done;
                return;
            }
        };
        if (confirm.version >= 2) != (c.version == Version::V2) {
            return self.reset(
                ResetReason::Protocol(format!(
                    "Confirm version {} after an Accept of version {}",
                    confirm.version,
                    c.version.wire()
                )),
                env,
            );
        }
        let mtu = if first {
            match confirm.mtu() {
                Ok(m) => Some(m),
                // ENUM-DECL (C.6): a reserved QP MTU on first contact.
                Err(_) => return self.decline(DeclineCode::VERSMISMAT, false, env),
            }
        } else {
            None
        };
        if confirm.rmbe_size.code() > self.cfg.max_peer_rmbe_code {
            return self.decline(DeclineCode::VERSMISMAT, false, env);
        }
        if first {
            if let Some((params, route)) = c.v2 {
                let tail = confirm.v2.clone().unwrap_or_default();
                match server_confirm_check(tail.fce.as_ref(), &params) {
                    Ok(mask) => {
                        let f = tail.fce.unwrap_or_default();
                        let gids = tail.gid_list.map(|g| g.to_vec()).unwrap_or_default();
                        c.client_v2 = Some((f.os_type, f.hostname, gids, mask));
                        c.v2 = Some((
                            V2Params {
                                feature_mask: mask,
                                ..params
                            },
                            route,
                        ));
                    }
                    Err(code) => return self.decline(code, false, env),
                }
            }
        }
        let id = PeerLinkId {
            peer_id: confirm.peer_id,
            gid: confirm.gid,
            mac: confirm.mac,
            qpn: confirm.qpn,
        };
        let peer_link = if first {
            c.link.link
        } else {
            match env.server_match_link(c.lgr, &id) {
                Some(l) => l,
                // SC-S7 (b), AMB-18: no active link matches and a Decline is not allowed.
                None => {
                    return self.reset(
                        ResetReason::Protocol(
                            "the Confirm names no active link of the link group".into(),
                        ),
                        env,
                    )
                }
            }
        };
        let peer_rmb = PeerRmb {
            rkey: confirm.rmb_rkey,
            vaddr: confirm.rmb_vaddr,
            rmbe_idx: confirm.rmbe_idx,
            size: confirm.rmbe_size,
            alert_token: confirm.rmbe_alert_token,
        };
        match env.register_peer_rmb(c.lgr, peer_link, &peer_rmb) {
            Ok(Some(conn)) => self.core.push(Output::AbortConn { conn }),
            Ok(None) => {}
            Err(code) => return self.decline(code, false, env),
        }
        c.client = Some((id, peer_link, peer_rmb));
        self.chosen = Some(c.clone());
        if let (true, Some(mtu)) = (first, mtu) {
            let qp = PeerQp {
                mac: id.mac,
                gid: id.gid,
                qpn: id.qpn,
                psn: confirm.psn,
                mtu,
            };
            if let Err(code) = env.server_start_first_link(c.lgr, c.link.link, id.peer_id, &qp) {
                return self.decline(code, false, env);
            }
            // S9/S10: the llc sends CONFIRM LINK; wait for the response.
            self.core.deadline = Some(wait_until(now, self.cfg.server_confirm_link_timeout));
            self.state = State::Link(LinkWait::default());
            return;
        }
        self.complete();
    }

    fn complete(&mut self) {
        let Some(c) = self.chosen.take() else {
            return;
        };
        let Some((peer_link, peer_rmb_link, peer_rmb)) = c.client else {
            return;
        };
        let v2 = c.v2.map(|(params, route)| V2Established {
            eid: params.eid,
            first_contact: c.contact.is_first().then(|| {
                let (peer_os, peer_hostname, peer_gids, _) =
                    c.client_v2.clone().unwrap_or_default();
                V2FirstContact {
                    params,
                    peer_os,
                    peer_hostname,
                    peer_gids,
                    route,
                }
            }),
        });
        let est = SmcEstablished {
            role: Role::Server,
            version: c.version,
            contact: c.contact,
            lgr: c.lgr,
            link: c.link.link,
            local_rmb: c.rmb,
            peer_rmb_link,
            peer_link,
            peer_rmb,
            v2,
        };
        self.core.finish_smc(Outcome::Smc(Box::new(est)));
        self.state = State::Done;
    }
}

/// The same-host offer of a Proposal, if it carries one (Linux layout: the SMC-D/v2 area).
fn same_host_offer(p: &ProposalRepr) -> Option<SameHostOffer> {
    match &p.body {
        ProposalBody::V2 { smcd, .. }
        | ProposalBody::V1 {
            area: V1Area::Smcd(smcd),
            ..
        } => SameHostOffer::from_smcd_area(smcd),
        _ => None,
    }
}
