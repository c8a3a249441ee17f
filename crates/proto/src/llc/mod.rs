//! The SMC-R link-group machine: LLC flows, timers and the RToken set, sans I/O.
//!
//! One [`LinkGroup`] per SMC-R link group (RFC 7609 §2.2). It knows the links (number,
//! state, both sides' MAC/GID/QPN/PSN/MTU, link user IDs, symmetric or asymmetric), the
//! RToken set of every RMB in both directions ([`RToken`], §3.5.5.2), and runs every LLC
//! exchange of §3.5 with its reply timer (Appendix C.7) and the serialization and
//! collision rules of §3.5.5.3. It does no I/O and reads no clock: its driver feeds it
//! received LLC messages, send completions, QP events, local requests and time, and
//! executes what [`LinkGroup::poll_output`] returns. In a stack the driver is the
//! [`Endpoint`](crate::endpoint::Endpoint) (`endpoint/llc_glue.rs`), which has the `smc`
//! runtime create and connect QPs; below, "the runtime" means whoever drives the machine.
//! `docs/llc.md` is the how-to for the driver; this page says what the machine does and
//! why.
//!
//! # Versions and dialects
//!
//! [`LlcConfig`] fixes, per link group, the SMC-R version ([`Version::V1`] = RFC 7609,
//! [`Version::V2`] = Linux SMC-Rv2 with type codes 0x21..0x29), the wire format
//! ([`LlcFormat`]: RFC 7609 figure or Linux layout, and the host byte order x86 Linux
//! writes the v2 length fields in), the RMBE layout (CONFIRM LINK flag 0x03 "no RMBE eye
//! catcher"), `max_links`/`max_conns` (v2.1), and `linux_compat`, which selects Linux's
//! behaviour wherever the RFC and Linux differ (list in [`LlcConfig::linux_compat`]).
//! Messages are `smc-wire` values ([`LlcOut`] owns the v2 lists).
//!
//! # Flows (RFC 7609 §3.5, CHECKLIST §B)
//!
//! * **First link** (§3.5.1.5, B.3, B.4): the server sends CONFIRM LINK on link 1 when the
//!   machine is created and waits for the response; the client waits for the request,
//!   validates it against the values learned in CLC (MAC in v1, GID, QPN, eye-catcher
//!   flag, `max_links`) and answers. [`Event::ConfirmLinkSent`], [`Event::FirstLinkUp`],
//!   [`Event::PointOfNoReturn`], [`Event::FirstContactDone`] and
//!   [`Event::FirstLinkFailed`] (with the Decline code Linux would use and whether a
//!   Decline is still allowed, C.2/C.3) are the milestones the CLC machine needs
//!   (`clc::LinkEvent` one to one). `max_links` becomes `min(server, client)`; a client value above
//!   the server's, or below 2 in v1, is a protocol error (CL-4).
//! * **Second link** (§3.5.1.6, B.5, C.3, C.8): with `max_links > 1` the server adds a link
//!   right after first contact — on another device if it has one, else on the same device
//!   (asymmetric attempt, SL-S1; Linux does the same). The client accepts with an unused
//!   device, or with its only device when the server offered a new one, and rejects "no
//!   alternate path" (v1: Z + reason 1; v2: Linux's echo of the request with flags 0xC0)
//!   when both would reuse their device; a reserved MTU is rejected with reason 2.
//!   Accepting takes a new QP from the runtime ([`Output::CreateLink`],
//!   [`Output::ConnectLink`]); the RTokens of every RMB travel in ADD LINK CONTINUATION
//!   (v1, the algorithm of §3.5.5.2.3 / B.13.3, on the carrying link) or in the ADD LINK v2
//!   extension, and CONFIRM LINK runs on the new link. [`Event::FirstContactDone`] says the
//!   attempt is over, so connection data may flow (§3.5.1.6, S11/C9). A failed attempt
//!   arms the C.8 retry timer; a client ADD LINK (v1 "FYI", §3.5.5.1.2), a REQUEST ADD
//!   LINK (v2) or a new local device retries at once.
//! * **DELETE LINK** (§3.5.5.1.3/4, §3.5.4, B.8, B.11, B.12): the server deletes a link
//!   with a request/response exchange over another link and frees the QP only after the
//!   response (SDL-4); the client asks by sending its own request and waits for the
//!   server's (CDL-3), answering a server request positively, or with reason "no link"
//!   (0x00100000, AMB-26) for an unknown link. DELETE LINK with A (all) ends the link group
//!   at once in either direction ([`Event::Terminated`]). [`LinkGroup::terminate`] and the
//!   idle linger ([`LinkGroup::set_idle`], §3.5.4) send it (orderly, reason
//!   PROG_INIT_TERM for the linger, as Linux).
//! * **RKeys** (§3.5.5.2, A.3.5–A.3.7, B.13): [`LinkGroup::add_rmb`] announces a new RMB
//!   with CONFIRM RKEY (this link's token plus up to two others; v1 adds CONFIRM RKEY
//!   CONTINUATION for more — never in `linux_compat`, Linux does not answer it);
//!   [`LinkGroup::delete_rmb`] sends DELETE RKEY (v1: up to 8 with an error mask; v2: a
//!   count of invalid keys, at most 9 per message so it stays 44 bytes — Linux copies only
//!   44 bytes of it). Both directions run concurrently (§3.5.5.3: not a collision). A
//!   negative CONFIRM RKEY with the retry flag is retried automatically after the current
//!   configuration change (A.3.5); without it [`Event::RmbConfirmFailed`] reports it.
//! * **TEST LINK** (§4.5.3, A.3.8, B.22): answered immediately on the same link in every
//!   state; sent when a link has received nothing for the keepalive interval
//!   ([`LinkGroup::on_link_activity`] reports receive activity); no reply within the reply
//!   timer, or different user data, takes the link down.
//!
//! # Serialization and collisions (§3.5.5.3, CHECKLIST B.14)
//!
//! At most one configuration exchange (ADD LINK with its CONTINUATION and CONFIRM LINK, or
//! a server DELETE LINK) runs at a time, and no local RKey exchange runs beside it; local
//! requests wait in a queue. Peer messages that collide are handled per the B.14 table:
//! TEST LINK answered at once; a client ADD LINK that crosses the server's is ignored; a
//! client DELETE LINK for one link, and a client ADD LINK during a DELETE LINK or RKey
//! exchange, are queued and processed afterwards; DELETE LINK (all) cleans up at once; a
//! client CONFIRM RKEY during ADD/DELETE LINK gets a negative response with the retry flag
//! (in `linux_compat` it is accepted: a Linux client parks the server's ADD LINK until its
//! CONFIRM RKEY is answered and fails the connection on a negative answer, and then
//! includes the new RMB in its ADD LINK response). A client whose own RKey exchange is in
//! flight defers the server's ADD LINK until the answer arrives (that is what Linux does;
//! the RFC lets it process the ADD LINK at once — deferring keeps the RMB set stable while
//! the new link's RTokens are exchanged). Server commands on a link the client has sent
//! DELETE LINK for are ignored (C.7.1 crossing messages).
//!
//! Linux runs one local and one remote flow per link group and **drops** requests it cannot
//! take (`smc_llc_flow_parallel`, linux-smc.md §2.5). The machine never gives it reason to:
//! it never pipelines two configuration exchanges, never sends a second SMC-Rv2 message
//! larger than 44 bytes before the first was answered (one receive slot for them in Linux,
//! linux-smc.md H8), and answers every request at once (H9).
//!
//! # Timers and recovery (Appendix C.7, C.7.1; CHECKLIST B.15)
//!
//! Every request that expects a reply starts the reply timer when it is emitted (2 s like
//! Linux's `SMC_LLC_WAIT_TIME`; first CONFIRM LINK: server 2 s, client 4 s; CONFIRM LINK on
//! an added link 5 s; [`LlcTimers`]). A send completion error counts as a timeout (LT-1).
//! Expiry runs the C.7.1 recovery: first link → [`Event::FirstLinkFailed`]; ADD LINK or
//! CONTINUATION → the new link is cleaned up and the carrying link treated as failed, and
//! on first contact the link group ends (`linux_compat`: only the new link is cleaned up
//! and the group carries on with one link, as Linux does, AMB-20); CONFIRM LINK on a new
//! link → DELETE LINK for it and the C.8 retry; DELETE LINK, CONFIRM/DELETE RKEY, TEST
//! LINK → the carrying link failed; the client's wait for the server's DELETE LINK →
//! the link that carried the request failed (CDL-5).
//!
//! A failed link is reported with [`Event::LinkDown`] (its connections must leave it: a
//! driver with failover moves them to another link, §4.6, as the endpoint does), then deleted with a DELETE LINK exchange over a surviving link; when no link
//! is left the link group ends with [`Event::Terminated`] (the driver resets the
//! connections). LLC exchanges that failed with a link are not replayed on another link
//! (§2.3); the machine retries queued work once the configuration is stable.
//!
//! # Bad input (A.3, C.7.1, CHECKLIST B.16)
//!
//! Unknown optional opcodes (0x80..0xBF) are discarded; any other unknown opcode, a
//! malformed message, a v1-only message in a v2 link group (or the reverse) or a message
//! that is unambiguously out of sync takes the link down with
//! [`LinkDownReason::ProtocolViolation`]. Responses nobody waits for are dropped (late
//! answers after a timeout; Linux drops them too), except a TEST LINK response, which can
//! only be out of sync (TC-LGM-24). Nothing a peer sends can panic the machine or make it
//! allocate without bound (deferred requests are capped).

mod add;
mod config;
mod delete;
mod event;
mod first;
mod input;
mod internals;
mod keepalive;
mod link;
mod msg;
mod rkey;
mod rtoken;
#[cfg(any(test, feature = "testing"))]
pub mod sim;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use smc_wire::common::{Gid, Mac};
use smc_wire::decline::DeclineCode;
use smc_wire::error::{Action, Layer};
use smc_wire::llc::{DeleteLinkReason, LlcMessage};
use tracing::{debug, trace, warn};

pub use link::{LinkInfo, LinkState, PeerQp, QpInfo};
pub use msg::LlcOut;
pub use rtoken::RToken;
pub use smc_wire::llc::{Dialect, LlcFormat};

pub use crate::ids::{DeviceId, LinkId, RmbId, Role, Version};
use add::{CliAdd, SrvAdd};
pub use config::{ConfigError, LlcConfig, LlcTimers};
use delete::{ClientDelete, SrvDel};
pub use event::{
    ApiError, Event, FirstLinkFailure, FirstLinkFailureKind, LinkDownReason, Output,
    TerminateReason, Transmit,
};
use link::Link;
use rkey::{RemoteRkey, RkeyFlow};
use rtoken::{LocalState, Rtokens};

/// One of the peer's RMBs, named by the machine.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct PeerRmbId(pub u32);

/// A posted LLC SEND, so that its completion can be reported back.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct SendId(pub u64);

/// A local device the link group may use for links (same LAN / VLAN as the peer).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Device {
    /// Runtime's name for it.
    pub id: DeviceId,
    /// RoCE MAC.
    pub mac: Mac,
    /// RoCE GID (RoCEv2: the IPv4-mapped address).
    pub gid: Gid,
}

/// What a posted send is for, beyond "an error means the link failed".
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Purpose {
    Plain,
    /// Server: the first CONFIRM LINK request; its success is `ConfirmLinkSent`.
    FirstConfirmReq,
    /// Client: the first CONFIRM LINK response; its success is `FirstLinkUp`.
    FirstConfirmResp,
    /// First contact: the ADD LINK request (server) or a positive answer (client); its
    /// success is the C.3 point of no return.
    SecondLinkMilestone,
    /// DELETE LINK (all): the link group ends once it went out (LGT-4).
    DeleteAll,
    /// Client: response to the server's DELETE LINK; the link goes once it is out (SDL-5).
    DeleteResp(LinkId),
    /// A TEST LINK response (counted per link while in flight).
    Echo,
}

/// Progress of first contact.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum First {
    /// Server: CONFIRM LINK sent.
    ServerConfirm {
        deadline: Instant,
    },
    /// Client: waiting for CONFIRM LINK.
    ClientConfirm {
        deadline: Instant,
    },
    /// Client: response posted, waiting for its completion.
    ClientRespSent,
    /// The second-link attempt is running (client: `deadline` until the ADD LINK came).
    Second {
        deadline: Option<Instant>,
    },
    Done,
}

/// A local request waiting for the configuration to be free (§3.5.5.3).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    /// Server: try to add a link (`replace`: the client has a new RNIC, INV-9).
    AddLink {
        replace: bool,
    },
    /// Server: delete a link with a DELETE LINK exchange.
    DeleteLink {
        link: LinkId,
        reason: DeleteLinkReason,
        orderly: bool,
    },
    ConfirmRmb(RmbId),
    DeleteRmb(RmbId),
}

/// The configuration exchange in progress (group 2 of §3.5.5.3 minus RKeys).
#[derive(Clone, Debug)]
enum Config {
    SrvAdd(SrvAdd),
    CliAdd(CliAdd),
    SrvDel(SrvDel),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Term {
    Running,
    /// DELETE LINK (all) sent; ends at its completion (server) or the server's answer
    /// (client), or at `deadline`.
    Ending {
        deadline: Instant,
        reason: TerminateReason,
        orderly: bool,
    },
    Done,
}

/// The link-group machine. See the [module documentation](self).
#[derive(Debug)]
pub struct LinkGroup {
    cfg: LlcConfig,
    devices: Vec<Device>,
    links: Vec<Link>,
    next_link_id: u32,
    /// Server: next link number to hand out (RFC 7609 §2.2.4: not reused until the space
    /// is exhausted).
    next_link_num: u8,
    /// Recently removed link numbers (a late DELETE LINK for one is a timing window).
    gone_nums: VecDeque<u8>,
    max_links: u8,
    first: First,
    rt: Rtokens,
    config: Option<Config>,
    rkey: Option<RkeyFlow>,
    remote_rkey: Option<RemoteRkey>,
    client_dels: Vec<ClientDelete>,
    /// Client v2: REQUEST ADD LINK outstanding until this deadline.
    req_add: Option<Instant>,
    /// Client: the server's ADD LINK request arrived (first contact's second link).
    add_seen: bool,
    /// First contact milestones reported: `ConfirmLinkSent`, `PointOfNoReturn`.
    confirm_sent: bool,
    ponr: bool,
    ops: VecDeque<Op>,
    /// No CONFIRM RKEY before this (after a negative answer with the retry flag).
    rkey_hold: Option<Instant>,
    deferred: VecDeque<(LinkId, LlcOut)>,
    add_retry_at: Option<Instant>,
    idle_since: Option<Instant>,
    term: Term,
    out: VecDeque<Output>,
    sends: HashMap<SendId, (LinkId, Purpose)>,
    next_send: u64,
    test_seq: u64,
    /// Peer requests dropped as a flood (TEST LINK beyond the echoes in flight).
    dropped_requests: u64,
}

/// What the link group is created with (first contact, after CLC Accept/Confirm).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct FirstLink {
    /// Our device of link 1.
    pub device: DeviceId,
    /// Our QP of link 1 (server: at RTS; client: at RTR or RTS).
    pub local: QpInfo,
    /// The peer's values from CLC (path MTU already the minimum).
    pub peer: PeerQp,
    /// Our first RMB (announced in CLC).
    pub local_rmb: RmbId,
    /// Its RToken on link 1.
    pub local_token: RToken,
    /// The peer's first RMB's RToken on link 1 (from CLC).
    pub peer_token: RToken,
}

impl LinkGroup {
    /// Creates the link group with its first link. The server's CONFIRM LINK is the first
    /// output; the client starts waiting for it.
    pub fn new(
        cfg: LlcConfig,
        devices: Vec<Device>,
        first: FirstLink,
        now: Instant,
    ) -> Result<LinkGroup, ConfigError> {
        cfg.validate()?;
        if !devices.iter().any(|d| d.id == first.device) {
            return Err(ConfigError::UnknownDevice(first.device));
        }
        // Linux: at most 2 symmetric links (`SMC_LINKS_ADD_LNK_MAX`). SMC-Rv2 has no
        // CONFIRM RKEY CONTINUATION, so one CONFIRM RKEY must name every other link: at
        // most 2 symmetric + 1 asymmetric.
        let mut max_links = cfg.max_links;
        if cfg.linux_compat || cfg.version == Version::V2 {
            max_links = max_links.min(2);
        }
        let mut lg = LinkGroup {
            devices,
            links: Vec::new(),
            next_link_id: 1,
            next_link_num: 2,
            gone_nums: VecDeque::new(),
            max_links,
            first: First::Done,
            rt: Rtokens::default(),
            config: None,
            rkey: None,
            remote_rkey: None,
            client_dels: Vec::new(),
            req_add: None,
            add_seen: false,
            confirm_sent: false,
            ponr: false,
            ops: VecDeque::new(),
            rkey_hold: None,
            deferred: VecDeque::new(),
            add_retry_at: None,
            idle_since: None,
            term: Term::Running,
            out: VecDeque::new(),
            sends: HashMap::new(),
            next_send: 1,
            test_seq: 0,
            dropped_requests: 0,
            cfg,
        };
        let mut l = Link::new(LinkId::FIRST, 0, first.device, now);
        l.state = LinkState::Confirming;
        l.local = Some(first.local);
        l.peer = Some(first.peer);
        let mut local = BTreeMap::new();
        local.insert(LinkId::FIRST, first.local_token);
        lg.rt.local.insert(
            first.local_rmb,
            rtoken::LocalRmb {
                tokens: local,
                state: LocalState::Confirmed,
                retries: 0,
            },
        );
        let mut peer = BTreeMap::new();
        peer.insert(LinkId::FIRST, first.peer_token);
        lg.rt.add_peer(peer);
        lg.links.push(l);
        lg.start_first(now);
        Ok(lg)
    }

    // ----------------------------------------------------------------------------------
    // Queries

    /// The configuration.
    pub fn config(&self) -> &LlcConfig {
        &self.cfg
    }

    /// Our role.
    pub fn role(&self) -> Role {
        self.cfg.role
    }

    /// Negotiated `max_links` (before first contact: ours).
    pub fn max_links(&self) -> u8 {
        self.max_links
    }

    /// Every link the machine knows, in creation order.
    pub fn links(&self) -> impl Iterator<Item = LinkInfo> + '_ {
        self.links.iter().map(Link::info)
    }

    /// One link.
    pub fn link(&self, id: LinkId) -> Option<LinkInfo> {
        self.find(id).map(Link::info)
    }

    /// An active link to put a connection (or an LLC request) on, if any.
    pub fn active_link(&self) -> Option<LinkId> {
        self.links.iter().find(|l| l.is_active()).map(|l| l.id)
    }

    /// The peer RMB whose RKey on `link` is `rkey` (CLC names RMBs this way).
    pub fn peer_rmb_by_rkey(&self, link: LinkId, rkey: u32) -> Option<PeerRmbId> {
        self.rt.find_peer(link, rkey)
    }

    /// The peer RMB's RToken on a link (what to RDMA-write to after failover, §4.6).
    pub fn peer_token(&self, rmb: PeerRmbId, link: LinkId) -> Option<RToken> {
        self.rt.peer.get(&rmb)?.tokens.get(&link).copied()
    }

    /// Every RToken of a peer RMB.
    pub fn peer_tokens(&self, rmb: PeerRmbId) -> Vec<(LinkId, RToken)> {
        self.rt
            .peer
            .get(&rmb)
            .map(|p| p.tokens.iter().map(|(l, t)| (*l, *t)).collect())
            .unwrap_or_default()
    }

    /// Every peer RMB.
    pub fn peer_rmbs(&self) -> impl Iterator<Item = PeerRmbId> + '_ {
        self.rt.peer.keys().copied()
    }

    /// Our RMB's RToken on a link.
    pub fn local_token(&self, rmb: RmbId, link: LinkId) -> Option<RToken> {
        self.rt.local.get(&rmb)?.tokens.get(&link).copied()
    }

    /// Our RMBs the machine knows (any state), for [`LinkGroup::on_link_created`].
    pub fn local_rmbs(&self) -> impl Iterator<Item = RmbId> + '_ {
        self.rt.local.keys().copied()
    }

    /// Whether the peer has our RMB's RTokens on every link.
    pub fn rmb_confirmed(&self, rmb: RmbId) -> bool {
        self.rt
            .local
            .get(&rmb)
            .is_some_and(|r| r.state == LocalState::Confirmed)
    }

    /// Links with a QP (created and not destroyed): [`LinkGroup::add_rmb`] needs a token
    /// for each.
    pub fn links_with_qp(&self) -> impl Iterator<Item = LinkId> + '_ {
        self.links
            .iter()
            .filter(|l| l.local.is_some())
            .map(|l| l.id)
    }

    /// Peer requests dropped as a flood so far (TEST LINK requests beyond a few answers
    /// in flight per link).
    pub fn dropped_requests(&self) -> u64 {
        self.dropped_requests
    }

    /// The link group has ended (after [`Event::Terminated`]).
    pub fn is_terminated(&self) -> bool {
        self.term == Term::Done
    }

    /// No LLC exchange is in progress or queued (keepalive, retry and linger timers may
    /// still be armed): the link set and the RToken sets are stable.
    pub fn is_quiet(&self) -> bool {
        self.term == Term::Done
            || (self.term == Term::Running
                && self.first == First::Done
                && self.config.is_none()
                && self.rkey.is_none()
                && self.remote_rkey.is_none()
                && self.client_dels.is_empty()
                && self.ops.is_empty()
                && self.deferred.is_empty()
                && self.req_add.is_none()
                && self.links.iter().all(|l| l.test.is_none()))
    }

    // ----------------------------------------------------------------------------------
    // Outputs and time

    /// The next thing to do. Call until `None` after every input.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// When [`LinkGroup::on_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.term == Term::Done {
            return None;
        }
        let mut t: Option<Instant> = None;
        let mut at = |d: Option<Instant>| {
            if let Some(d) = d {
                t = Some(t.map_or(d, |x| x.min(d)));
            }
        };
        match self.first {
            First::ServerConfirm { deadline } | First::ClientConfirm { deadline } => {
                at(Some(deadline))
            }
            First::Second { deadline } if !self.add_seen => at(deadline),
            _ => {}
        }
        at(self.config.as_ref().and_then(Config::deadline));
        at(self.rkey.as_ref().map(|r| r.deadline));
        at(self.remote_rkey.as_ref().map(|r| r.deadline));
        for c in &self.client_dels {
            at(Some(c.deadline));
        }
        at(self.req_add);
        if let Term::Ending { deadline, .. } = self.term {
            at(Some(deadline));
        }
        at(self.add_retry_at);
        if self.ops.iter().any(|o| matches!(o, Op::ConfirmRmb(_))) {
            at(self.rkey_hold);
        }
        if let (Some(since), Some(linger)) = (self.idle_since, self.cfg.timers.linger) {
            at(Some(since + linger));
        }
        at(self.keepalive_deadline());
        t
    }

    /// Runs every timer due at `now`.
    pub fn on_timeout(&mut self, now: Instant) {
        if self.term == Term::Done {
            return;
        }
        self.first_timeout(now);
        if let Some(d) = self.config.as_ref().and_then(Config::deadline) {
            if d <= now {
                self.config_timeout(now);
            }
        }
        if self.rkey.as_ref().is_some_and(|r| r.deadline <= now) {
            self.rkey_timeout(now);
        }
        if self.remote_rkey.as_ref().is_some_and(|r| r.deadline <= now) {
            // The peer never sent the rest of its CONFIRM RKEY CONTINUATIONs.
            let r = self.remote_rkey.take();
            if let Some(r) = r {
                self.link_failed(
                    now,
                    r.link,
                    LinkDownReason::ReplyTimeout("CONFIRM RKEY CONTINUATION"),
                );
            }
        }
        self.client_delete_timeouts(now);
        if self.req_add.is_some_and(|d| d <= now) {
            // The server may ignore a request it cannot serve (§3.5.5.1.2, CAL-5).
            self.req_add = None;
        }
        if let Term::Ending {
            deadline, reason, ..
        } = self.term
        {
            if deadline <= now {
                self.finish(reason);
            }
        }
        if self.rkey_hold.is_some_and(|d| d <= now) {
            self.rkey_hold = None;
        }
        if self.add_retry_at.is_some_and(|d| d <= now) {
            self.add_retry_at = None;
            self.queue_add_link(false);
        }
        if let (Some(since), Some(linger)) = (self.idle_since, self.cfg.timers.linger) {
            if since + linger <= now && self.term == Term::Running {
                self.idle_since = None;
                debug!("link group idle for {linger:?}: terminating");
                self.start_terminate(now, TerminateReason::Idle, true);
            }
        }
        self.keepalive_timeout(now);
        self.pump(now);
    }
}
