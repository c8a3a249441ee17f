//! The SMC-R link-group machine: LLC flows, timers and the RToken set, sans I/O.
//!
//! One [`LinkGroup`] per SMC-R link group (RFC 7609 §2.2). It knows the links (number,
//! state, both sides' MAC/GID/QPN/PSN/MTU, link user IDs, symmetric or asymmetric), the
//! RToken set of every RMB in both directions ([`RToken`], §3.5.5.2), and runs every LLC
//! exchange of §3.5 with its reply timer (Appendix C.7) and the serialization and
//! collision rules of §3.5.5.3. It does no I/O and reads no clock: the runtime feeds it
//! received LLC messages, send completions, QP events, local requests and time, and
//! executes what [`LinkGroup::poll_output`] returns. `docs/llc.md` is the how-to for the
//! runtime; this page says what the machine does and why.
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
//! A failed link is reported with [`Event::LinkDown`] (the runtime moves its connections,
//! §4.6), then deleted with a DELETE LINK exchange over a surviving link; when no link is
//! left the link group ends with [`Event::Terminated`] (the runtime resets the
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
mod delete;
mod first;
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
use std::fmt;
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

use add::{CliAdd, SrvAdd};
use delete::{ClientDelete, SrvDel};
use link::Link;
use rkey::{RemoteRkey, RkeyFlow};
use rtoken::{LocalState, Rtokens};

/// A link of the link group, as named by the machine (not the wire link number, which the
/// client learns only from CONFIRM LINK). The first link is [`LinkId::FIRST`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct LinkId(pub u32);

impl LinkId {
    /// The link created with the link group (first contact).
    pub const FIRST: LinkId = LinkId(0);
}

impl fmt::Display for LinkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "L{}", self.0)
    }
}

/// One of our RMBs, named by the runtime.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct RmbId(pub u32);

/// One of the peer's RMBs, named by the machine.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct PeerRmbId(pub u32);

/// A local RoCE device (RNIC port), named by the runtime.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct DeviceId(pub u32);

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

/// Server or client of the link group (RFC 7609 §2.2.3): the server adds and deletes links.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    /// Accepted the TCP connection that created the link group.
    Server,
    /// Initiated it.
    Client,
}

/// SMC-R version of the link group (fixed at rendezvous).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Version {
    /// RFC 7609 (type codes 0x01..0x09).
    V1,
    /// Linux SMC-Rv2 (type codes 0x21..0x29, ADD LINK v2 extension, no CONTINUATIONs).
    V2,
}

/// Timer values (RFC 7609 C.7; Linux values from linux-smc.md §2.6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LlcTimers {
    /// Server: wait for the first CONFIRM LINK response (Linux: 2 s).
    pub first_confirm_server: Duration,
    /// Client: wait for the first CONFIRM LINK request (Linux: 4 s).
    pub first_confirm_client: Duration,
    /// Any other reply (Linux `SMC_LLC_WAIT_TIME`: 2 s).
    pub reply: Duration,
    /// CONFIRM LINK on an added link (Linux `SMC_LLC_WAIT_FIRST_TIME`: 5 s).
    pub new_link_confirm: Duration,
    /// Client: wait for the server's ADD LINK after first contact (Linux: 2 s).
    pub add_link_wait: Duration,
    /// Client: wait for the server's DELETE LINK after asking for one (CDL-5). Longer than
    /// any exchange the server may finish first (it queues the request, §3.5.5.3).
    pub delete_link_wait: Duration,
    /// Server: retry a failed link addition after this long (C.8); `None`: only on a
    /// stimulus (client request, new device).
    pub add_link_retry: Option<Duration>,
    /// Send TEST LINK after a link received nothing this long (Linux `smcr_testlink_time`
    /// 30 s); `None` disables keepalive.
    pub test_link_interval: Option<Duration>,
    /// Keep an idle link group this long after [`LinkGroup::set_idle`] (Linux: server 600 s,
    /// client 610 s); `None` keeps it.
    pub linger: Option<Duration>,
}

impl LlcTimers {
    /// Linux's values for a role.
    pub fn linux(role: Role) -> LlcTimers {
        LlcTimers {
            first_confirm_server: Duration::from_secs(2),
            first_confirm_client: Duration::from_secs(4),
            reply: Duration::from_secs(2),
            new_link_confirm: Duration::from_secs(5),
            add_link_wait: Duration::from_secs(2),
            delete_link_wait: Duration::from_secs(10),
            add_link_retry: Some(Duration::from_secs(60)),
            test_link_interval: Some(Duration::from_secs(30)),
            linger: Some(Duration::from_secs(match role {
                Role::Server => 600,
                Role::Client => 610,
            })),
        }
    }
}

/// How a link group speaks LLC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LlcConfig {
    /// Our role.
    pub role: Role,
    /// SMC-R version.
    pub version: Version,
    /// Wire layout and v2 byte order.
    pub format: LlcFormat,
    /// RMBEs start with the RFC's 4-byte eye catcher. `false` is Linux's layout, announced
    /// with CONFIRM LINK flag 0x03 (Linux requires it; needs the Linux dialect or v2).
    pub rmbe_eyecatcher: bool,
    /// Most symmetric links (RFC 7609 §2.2.2: 2..=8; v2.1 may negotiate 1). The server
    /// offers it in CONFIRM LINK; the client answers with the smaller of both.
    pub max_links: u8,
    /// v2.1 / Linux dialect: most connections per link group (CONFIRM LINK byte 35).
    pub max_conns: u8,
    /// Link-group identifier: our link user IDs are `lgr_id << 8 | link number` (as Linux).
    pub lgr_id: u32,
    /// v2: the peer is reachable without a gateway (ADD LINK v2 extension flag).
    pub v2_direct: bool,
    /// Linux behaviour where RFC 7609 and Linux differ:
    /// * a client CONFIRM RKEY during the server's ADD/DELETE LINK is answered positively
    ///   (RFC §3.5.5.3.1: negatively, with the retry flag);
    /// * on first contact, an unanswered ADD LINK or a missing ADD LINK leaves a one-link
    ///   link group (RFC C.7.1: reset), AMB-20;
    /// * a missing RToken for a link in an ADD LINK v2 extension is logged, not fatal;
    /// * TEST LINK user data is all zero (RFC: REC nonce);
    /// * `max_links` is capped at 2 (Linux: `SMC_LINKS_ADD_LNK_MAX`), so no CONFIRM RKEY
    ///   CONTINUATION is ever needed.
    pub linux_compat: bool,
    /// Negative CONFIRM RKEY responses with the retry flag retried automatically.
    pub rkey_retries: u8,
    /// Timer values.
    pub timers: LlcTimers,
}

impl LlcConfig {
    /// What Linux does and expects: its layout, x86 byte order, no RMBE eye catcher,
    /// `max_links` 2, `max_conns` 255 (v2), Linux timers.
    pub fn linux(role: Role, version: Version) -> LlcConfig {
        LlcConfig {
            role,
            version,
            format: LlcFormat::LINUX_X86,
            rmbe_eyecatcher: false,
            max_links: 2,
            max_conns: if version == Version::V2 { 255 } else { 0 },
            lgr_id: 1,
            v2_direct: true,
            linux_compat: true,
            rkey_retries: 3,
            timers: LlcTimers::linux(role),
        }
    }

    /// RFC 7609 as written: v1, the figures' layout, RMBE eye catcher, up to 4 links.
    pub fn rfc(role: Role) -> LlcConfig {
        LlcConfig {
            role,
            version: Version::V1,
            format: LlcFormat::RFC7609,
            rmbe_eyecatcher: true,
            max_links: 4,
            max_conns: 0,
            lgr_id: 1,
            v2_direct: true,
            linux_compat: false,
            rkey_retries: 3,
            timers: LlcTimers::linux(role),
        }
    }

    /// Checks the combination.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let linux_layout = self.version == Version::V2 || self.format.dialect == Dialect::Linux;
        if !self.rmbe_eyecatcher && !linux_layout {
            return Err(ConfigError::EyecatcherFlagNeedsLinuxLayout);
        }
        let min = if self.version == Version::V2 { 1 } else { 2 };
        if !(min..=8).contains(&self.max_links) {
            return Err(ConfigError::MaxLinks(self.max_links));
        }
        if self.lgr_id > 0x00FF_FFFF {
            return Err(ConfigError::LgrId(self.lgr_id));
        }
        if self.max_conns != 0 && !linux_layout {
            return Err(ConfigError::MaxConnsNeedsLinuxLayout);
        }
        Ok(())
    }

    fn linux_layout(&self) -> bool {
        self.version == Version::V2 || self.format.dialect == Dialect::Linux
    }
}

/// A configuration the machine cannot run with.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum ConfigError {
    /// Flag 0x03 exists only in the Linux CONFIRM LINK layout.
    #[error("an RMBE without eye catcher needs the Linux dialect or SMC-Rv2")]
    EyecatcherFlagNeedsLinuxLayout,
    /// `max_conns` exists only in the Linux CONFIRM LINK layout.
    #[error("max_conns needs the Linux dialect or SMC-Rv2")]
    MaxConnsNeedsLinuxLayout,
    /// RFC 7609 §2.2.2: 2..=8 (v2.1: 1..=8).
    #[error("max_links {0} out of range")]
    MaxLinks(u8),
    /// Link user IDs carry 24 bits of it.
    #[error("lgr_id {0:#x} does not fit in 24 bits")]
    LgrId(u32),
    /// The first link's device is not in the device list.
    #[error("first link device {0:?} is not among the devices")]
    UnknownDevice(DeviceId),
}

/// A request the machine cannot take (a runtime bug or a race it must handle).
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum ApiError {
    /// No such link.
    #[error("unknown link {0}")]
    UnknownLink(LinkId),
    /// No such RMB.
    #[error("unknown RMB {0:?}")]
    UnknownRmb(RmbId),
    /// The RMB is already known.
    #[error("RMB {0:?} already added")]
    DuplicateRmb(RmbId),
    /// An RToken is missing for a link that has a QP.
    #[error("no RToken of RMB {rmb:?} for link {link}")]
    MissingToken {
        /// The RMB.
        rmb: RmbId,
        /// The link.
        link: LinkId,
    },
    /// RFC 7609 §2.1: at most 255 RMBs per peer per link group.
    #[error("255 RMBs already in the link group")]
    TooManyRmbs,
    /// The link is not in a state where this input makes sense.
    #[error("link {0} is not waiting for this")]
    WrongState(LinkId),
    /// The request is only for the other role.
    #[error("only the {0:?} may do this")]
    WrongRole(Role),
    /// The link group is gone.
    #[error("the link group is terminated")]
    Terminated,
}

/// Why a link stopped being usable.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum LinkDownReason {
    /// An LLC send completed in error.
    #[error("LLC send failed")]
    SendFailed,
    /// The runtime reported a QP error (any work request failed, async event).
    #[error("QP error")]
    QpError,
    /// A reply did not arrive in time (the carrying link failed, C.7.1).
    #[error("no reply to {0}")]
    ReplyTimeout(&'static str),
    /// No TEST LINK reply (§4.5.3).
    #[error("TEST LINK unanswered")]
    TestLinkTimeout,
    /// The peer broke the protocol on this link.
    #[error("LLC protocol violation: {0}")]
    ProtocolViolation(&'static str),
    /// The peer deleted the link (DELETE LINK request or response).
    #[error("deleted by the peer ({0})")]
    PeerDeleted(DeleteLinkReason),
    /// Deleted locally ([`LinkGroup::delete_link`], or the asymmetric link no longer needed).
    #[error("deleted locally ({0})")]
    LocalDelete(DeleteLinkReason),
    /// The peer's CONFIRM RKEY had no RToken for this link (C.7.1).
    #[error("the peer gave no RToken for this link")]
    MissingRkey,
    /// Its device was removed.
    #[error("device removed")]
    DeviceRemoved,
}

/// Why the link group ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum TerminateReason {
    /// The peer sent DELETE LINK for all links.
    #[error("deleted by the peer ({0})")]
    PeerDeleted(DeleteLinkReason),
    /// [`LinkGroup::terminate`].
    #[error("terminated locally ({0})")]
    Local(DeleteLinkReason),
    /// Idle for the linger time (§3.5.4).
    #[error("idle")]
    Idle,
    /// The last link failed.
    #[error("last link failed: {0}")]
    NoLinks(LinkDownReason),
    /// First contact failed (the Decline code says why).
    #[error("first contact failed: {0}")]
    FirstContact(DeclineCode),
    /// [`LinkGroup::abort`].
    #[error("aborted")]
    Aborted,
}

/// What went wrong with the first link.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FirstLinkFailureKind {
    /// A send completed in error or the QP failed (the usual RoCE failure, C.7).
    SendFailed,
    /// The peer's CONFIRM LINK was invalid (C.7.1).
    InvalidMessage,
    /// Our timer expired without the peer's CONFIRM LINK (C.7, C.7.1).
    Timeout,
    /// Anything else.
    Other,
}

/// Why the first link could not be confirmed (reported to the CLC machine).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct FirstLinkFailure {
    /// What went wrong.
    pub kind: FirstLinkFailureKind,
    /// Diagnosis code for the Decline (Linux's codes).
    pub code: DeclineCode,
    /// RFC 7609 C.2/C.7: a Decline (and TCP fallback) is still allowed; otherwise the TCP
    /// connection must be reset.
    pub may_decline: bool,
}

/// What the runtime is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// First contact: our CONFIRM LINK (server: the request; client: the response) went
    /// out successfully; from now on this side never sends a Decline (C.2, AMB-19).
    ConfirmLinkSent,
    /// First contact: link 1 is confirmed (server: valid response received; client: our
    /// response sent successfully). Comes after `ConfirmLinkSent`.
    FirstLinkUp,
    /// First contact: the C.3 point of no return passed (server: the ADD LINK went out or
    /// was answered; client: a negative ADD LINK answer sent, a positive one completed, or
    /// the second link's CONFIRM LINK arrived); at the latest with `FirstContactDone`.
    PointOfNoReturn,
    /// First contact failed before the first link was confirmed. [`Event::Terminated`]
    /// follows.
    FirstLinkFailed(FirstLinkFailure),
    /// First contact: the second-link attempt is over (added, rejected, failed or not
    /// needed); connections may go active (RFC 7609 §3.5.1.6, C.7.1).
    FirstContactDone,
    /// A link was added and confirmed.
    LinkUp(LinkId),
    /// A link must no longer be used: move its connections (§4.6). Its QP is destroyed later
    /// ([`Output::DestroyLink`]).
    LinkDown {
        /// The link.
        link: LinkId,
        /// Why.
        reason: LinkDownReason,
    },
    /// The peer has the RMB's RToken on every link: connections may use it.
    RmbConfirmed(RmbId),
    /// The peer refused or the exchange failed; connections must not use the RMB.
    RmbConfirmFailed {
        /// The RMB (still registered; delete or re-add it).
        rmb: RmbId,
        /// Worth trying again later (the peer set the retry flag, or a link failed).
        retry: bool,
    },
    /// DELETE RKEY done (positive or not, A.3.7: only logged): the RMB may be freed.
    RmbDeleted(RmbId),
    /// The peer announced an RMB (CONFIRM RKEY): its RTokens per link.
    PeerRmbAdded {
        /// Its name.
        rmb: PeerRmbId,
        /// RToken per link.
        tokens: Vec<(LinkId, RToken)>,
    },
    /// The peer's RMB got an RToken for a new link (ADD LINK CONTINUATION / v2 extension).
    PeerRmbToken {
        /// The RMB.
        rmb: PeerRmbId,
        /// The new link.
        link: LinkId,
        /// Its RToken there.
        token: RToken,
    },
    /// The peer deleted an RMB (DELETE RKEY).
    PeerRmbDeleted(PeerRmbId),
    /// The link group is gone: reset every connection, free every resource.
    Terminated(TerminateReason),
}

/// An LLC message to SEND on a link (RC SEND, inline when it fits, 44 bytes or more).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Link (QP) to send on.
    pub link: LinkId,
    /// Report the completion with [`LinkGroup::on_send_complete`].
    pub id: SendId,
    /// The message ([`LlcOut::encode`] with the link group's format).
    pub msg: LlcOut,
}

/// Something for the runtime to do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Send an LLC message.
    Send(Transmit),
    /// Create a QP (own PD, §2.1) on `device`, register every local RMB on it and post
    /// receive buffers; then [`LinkGroup::on_link_created`] (or
    /// [`LinkGroup::on_link_setup_failed`]).
    CreateLink {
        /// The new link.
        link: LinkId,
        /// Device to create it on.
        device: DeviceId,
    },
    /// Move the link's QP to RTR and RTS with the peer's values; then
    /// [`LinkGroup::on_link_connected`] (or [`LinkGroup::on_link_setup_failed`]).
    ConnectLink {
        /// The link.
        link: LinkId,
        /// Peer QP, GID, MAC, PSN and the path MTU.
        peer: PeerQp,
    },
    /// Destroy the link's QP and its memory registrations; forget the link.
    DestroyLink {
        /// The link.
        link: LinkId,
    },
    /// Tell the rest of the stack.
    Event(Event),
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

    // ----------------------------------------------------------------------------------
    // Inputs from the runtime

    /// A SEND payload received on `link` that is not a CDC (first byte ≠ 0xFE). Parses it
    /// with the link group's format and handles it; a parse error is handled per RFC 7609
    /// A.3 / C.7.1 (optional opcode: discarded; anything else: the link goes down).
    pub fn handle_llc_bytes(&mut self, now: Instant, link: LinkId, payload: &[u8]) {
        match LlcMessage::parse(payload, self.cfg.format) {
            Ok(m) => self.handle_llc(now, link, &m),
            Err(e) => {
                if self.term == Term::Done || self.find(link).is_none() {
                    return;
                }
                self.touch(now, link);
                match e.action(Layer::Llc) {
                    Action::Discard => debug!(%link, "discarding optional LLC message: {e}"),
                    _ => {
                        warn!(%link, "malformed LLC message: {e}");
                        self.link_failed(
                            now,
                            link,
                            LinkDownReason::ProtocolViolation("malformed LLC message"),
                        );
                    }
                }
                self.pump(now);
            }
        }
    }

    /// A parsed LLC message received on `link`.
    pub fn handle_llc(&mut self, now: Instant, link: LinkId, msg: &LlcMessage<'_>) {
        if self.term == Term::Done {
            return;
        }
        let Some(l) = self.find(link) else {
            debug!(%link, "LLC message on an unknown link dropped");
            return;
        };
        if l.state == LinkState::Down {
            trace!(%link, "LLC message on a down link dropped");
            return;
        }
        self.touch(now, link);
        self.dispatch(now, link, msg);
        self.pump(now);
    }

    /// The completion of a [`Transmit`]. `ok = false` counts as the timeout of whatever the
    /// message waited for (RFC 7609 C.7, LT-1): its link has failed.
    pub fn on_send_complete(&mut self, now: Instant, link: LinkId, id: SendId, ok: bool) {
        let purpose = self.sends.remove(&id).map(|(_, p)| p);
        if purpose == Some(Purpose::Echo) {
            if let Some(l) = self.find_mut(link) {
                l.echoes = l.echoes.saturating_sub(1);
            }
        }
        if self.term == Term::Done {
            return;
        }
        if !ok {
            debug!(%link, ?id, "LLC send failed");
            match purpose {
                Some(Purpose::DeleteAll) => self.delete_all_send_failed(now, link),
                Some(Purpose::DeleteResp(gone)) => {
                    self.remove_link(gone);
                    self.link_failed(now, link, LinkDownReason::SendFailed);
                }
                _ => self.link_failed(now, link, LinkDownReason::SendFailed),
            }
        } else {
            match purpose {
                Some(Purpose::FirstConfirmReq) => self.confirm_link_sent(),
                Some(Purpose::FirstConfirmResp) => self.first_resp_sent(now),
                Some(Purpose::SecondLinkMilestone) => self.point_of_no_return(),
                Some(Purpose::DeleteAll) => {
                    if let Term::Ending { reason, .. } = self.term {
                        if self.cfg.role == Role::Server {
                            self.finish(reason);
                        }
                    }
                }
                Some(Purpose::DeleteResp(gone)) => self.remove_link(gone),
                Some(Purpose::Echo) | Some(Purpose::Plain) | None => {}
            }
        }
        self.pump(now);
    }

    /// The runtime created the QP of a link ([`Output::CreateLink`]). `tokens` are the
    /// RTokens of every local RMB on it ([`LinkGroup::local_rmbs`]).
    pub fn on_link_created(
        &mut self,
        now: Instant,
        link: LinkId,
        qp: QpInfo,
        tokens: &[(RmbId, RToken)],
    ) -> Result<(), ApiError> {
        self.alive()?;
        let l = self.find(link).ok_or(ApiError::UnknownLink(link))?;
        if matches!(l.state, LinkState::Down | LinkState::Deleting) {
            // The machine gave up on the link meanwhile; DestroyLink follows.
            return Ok(());
        }
        if l.state != LinkState::Creating || l.local.is_some() {
            return Err(ApiError::WrongState(link));
        }
        for rmb in self.rt.local.keys() {
            if !tokens.iter().any(|(r, _)| r == rmb) {
                return Err(ApiError::MissingToken { rmb: *rmb, link });
            }
        }
        for (rmb, t) in tokens {
            if let Some(r) = self.rt.local.get_mut(rmb) {
                r.tokens.insert(link, *t);
            }
        }
        if let Some(l) = self.find_mut(link) {
            l.local = Some(qp);
        }
        self.link_created(now, link);
        self.pump(now);
        Ok(())
    }

    /// The runtime connected a link's QP ([`Output::ConnectLink`]).
    pub fn on_link_connected(&mut self, now: Instant, link: LinkId) -> Result<(), ApiError> {
        self.alive()?;
        let l = self.find(link).ok_or(ApiError::UnknownLink(link))?;
        if matches!(l.state, LinkState::Down | LinkState::Deleting) {
            return Ok(());
        }
        if l.state != LinkState::Connecting {
            return Err(ApiError::WrongState(link));
        }
        self.link_connected(now, link);
        self.pump(now);
        Ok(())
    }

    /// Creating or connecting a link's QP failed.
    pub fn on_link_setup_failed(&mut self, now: Instant, link: LinkId) {
        if self.term == Term::Done {
            return;
        }
        if self
            .find(link)
            .is_some_and(|l| matches!(l.state, LinkState::Creating | LinkState::Connecting))
        {
            self.link_setup_failed(now, link);
        }
        self.pump(now);
    }

    /// A QP error on a link (a failed CDC or RDMA WRITE, an asynchronous event).
    pub fn on_link_error(&mut self, now: Instant, link: LinkId) {
        if self.term == Term::Done {
            return;
        }
        self.link_failed(now, link, LinkDownReason::QpError);
        self.pump(now);
    }

    /// Something was received on the link (any receive completion): it is alive, no TEST
    /// LINK needed (§4.5.3). Cheap; call it as often as convenient.
    pub fn on_link_activity(&mut self, now: Instant, link: LinkId) {
        self.touch(now, link);
    }

    /// Announces a new local RMB: `tokens` has its RToken on every link with a QP
    /// ([`LinkGroup::links_with_qp`]). [`Event::RmbConfirmed`] follows when the peer has
    /// them all (CONFIRM RKEY, §3.5.5.2.1); until then no connection may use it (AR-5).
    pub fn add_rmb(
        &mut self,
        now: Instant,
        rmb: RmbId,
        tokens: &[(LinkId, RToken)],
    ) -> Result<(), ApiError> {
        self.alive()?;
        if self.rt.local.contains_key(&rmb) {
            return Err(ApiError::DuplicateRmb(rmb));
        }
        if self.rt.local.len() >= 255 {
            return Err(ApiError::TooManyRmbs);
        }
        for l in self.links.iter().filter(|l| l.local.is_some()) {
            if !tokens.iter().any(|(id, _)| *id == l.id) {
                return Err(ApiError::MissingToken { rmb, link: l.id });
            }
        }
        let toks = tokens
            .iter()
            .filter(|(id, _)| self.find(*id).is_some_and(|l| l.local.is_some()))
            .copied()
            .collect();
        self.rt.local.insert(
            rmb,
            rtoken::LocalRmb {
                tokens: toks,
                state: LocalState::Pending,
                retries: 0,
            },
        );
        self.ops.push_back(Op::ConfirmRmb(rmb));
        self.pump(now);
        Ok(())
    }

    /// Deletes a local RMB no connection uses any more (§3.5.5.2.2): DELETE RKEY, then
    /// [`Event::RmbDeleted`], after which the runtime may free it (DR-3).
    pub fn delete_rmb(&mut self, now: Instant, rmb: RmbId) -> Result<(), ApiError> {
        self.alive()?;
        let r = self
            .rt
            .local
            .get_mut(&rmb)
            .ok_or(ApiError::UnknownRmb(rmb))?;
        match r.state {
            LocalState::Deleting => return Ok(()),
            LocalState::Pending => {
                // Never announced: nothing to tell the peer.
                self.ops.retain(|o| *o != Op::ConfirmRmb(rmb));
                self.rt.local.remove(&rmb);
                self.emit(Event::RmbConfirmFailed { rmb, retry: false });
                self.emit(Event::RmbDeleted(rmb));
            }
            LocalState::Confirming | LocalState::Confirmed => {
                r.state = LocalState::Deleting;
                self.ops.push_back(Op::DeleteRmb(rmb));
            }
        }
        self.pump(now);
        Ok(())
    }

    /// Records a peer RMB learned outside LLC (CLC first contact is handled by
    /// [`LinkGroup::new`]; this is for a peer that names a new RMB in CLC without CONFIRM
    /// RKEY on a one-link group).
    pub fn learn_peer_rmb(&mut self, link: LinkId, token: RToken) -> PeerRmbId {
        if let Some(id) = self.rt.find_peer(link, token.rkey) {
            return id;
        }
        let mut t = BTreeMap::new();
        t.insert(link, token);
        self.rt.add_peer(t)
    }

    /// A new local device became usable: the server tries to add a link at once (C.8); the
    /// client tells the server (ADD LINK "FYI" in v1, REQUEST ADD LINK in v2; §3.5.5.1.2).
    pub fn add_device(&mut self, now: Instant, dev: Device) {
        if self.term != Term::Running {
            return;
        }
        if self.devices.iter().any(|d| d.id == dev.id) {
            return;
        }
        self.devices.push(dev);
        match self.cfg.role {
            Role::Server => self.queue_add_link(false),
            Role::Client => self.client_invite(now, dev),
        }
        self.pump(now);
    }

    /// A local device is gone: its links fail.
    pub fn remove_device(&mut self, now: Instant, dev: DeviceId) {
        self.devices.retain(|d| d.id != dev);
        let ids: Vec<LinkId> = self
            .links
            .iter()
            .filter(|l| l.device == dev)
            .map(|l| l.id)
            .collect();
        for id in ids {
            self.link_failed(now, id, LinkDownReason::DeviceRemoved);
        }
        self.pump(now);
    }

    /// Deletes one link (operator request, §3.5.5.1.3/4). The server runs a DELETE LINK
    /// exchange; the client asks the server with a DELETE LINK request.
    pub fn delete_link(
        &mut self,
        now: Instant,
        link: LinkId,
        orderly: bool,
    ) -> Result<(), ApiError> {
        self.alive()?;
        let l = self.find(link).ok_or(ApiError::UnknownLink(link))?;
        if !l.is_alive() {
            return Ok(());
        }
        let reason = DeleteLinkReason::OP_INIT_TERM;
        match self.cfg.role {
            Role::Server => {
                self.ops.push_back(Op::DeleteLink {
                    link,
                    reason,
                    orderly,
                });
            }
            Role::Client => self.client_request_delete(now, link, reason, orderly),
        }
        self.pump(now);
        Ok(())
    }

    /// The runtime's connection count reached zero (`true`) or not (`false`). After the
    /// linger time idle, the link group ends (§3.5.4, LGT-2).
    pub fn set_idle(&mut self, now: Instant, idle: bool) {
        if idle {
            if self.idle_since.is_none() {
                self.idle_since = Some(now);
            }
        } else {
            self.idle_since = None;
        }
    }

    /// Ends the link group in an orderly way (operator, §3.5.4): DELETE LINK with A set
    /// (server), or the request for it (client, LGT-6), then [`Event::Terminated`].
    pub fn terminate(&mut self, now: Instant) {
        self.terminate_with(now, DeleteLinkReason::OP_INIT_TERM, true);
    }

    /// [`LinkGroup::terminate`] with another reason code or without the orderly flag (Linux
    /// sends OP_INIT_TERM, not orderly, when its module is unloaded).
    pub fn terminate_with(&mut self, now: Instant, reason: DeleteLinkReason, orderly: bool) {
        if self.term != Term::Running {
            return;
        }
        self.start_terminate(now, TerminateReason::Local(reason), orderly);
        self.pump(now);
    }

    /// Drops the link group without telling the peer (e.g. a Decline arrived during first
    /// contact): [`Output::DestroyLink`] for every link, then [`Event::Terminated`].
    pub fn abort(&mut self) {
        if self.term != Term::Done {
            self.finish(TerminateReason::Aborted);
        }
    }

    // ----------------------------------------------------------------------------------
    // Internals shared by the flows

    fn alive(&self) -> Result<(), ApiError> {
        if self.term == Term::Done {
            Err(ApiError::Terminated)
        } else {
            Ok(())
        }
    }

    fn find(&self, id: LinkId) -> Option<&Link> {
        self.links.iter().find(|l| l.id == id)
    }

    fn find_mut(&mut self, id: LinkId) -> Option<&mut Link> {
        self.links.iter_mut().find(|l| l.id == id)
    }

    fn by_num(&self, num: u8) -> Option<LinkId> {
        self.links
            .iter()
            .find(|l| l.num == num && num != 0)
            .map(|l| l.id)
    }

    fn num_of(&self, id: LinkId) -> u8 {
        self.find(id).map_or(0, |l| l.num)
    }

    fn is_active(&self, id: LinkId) -> bool {
        self.find(id).is_some_and(Link::is_active)
    }

    /// An active link, preferring one other than `avoid`.
    fn pick_active(&self, avoid: Option<LinkId>) -> Option<LinkId> {
        self.links
            .iter()
            .find(|l| l.is_active() && Some(l.id) != avoid)
            .or_else(|| self.links.iter().find(|l| l.is_active()))
            .map(|l| l.id)
    }

    fn active_count(&self) -> usize {
        self.links.iter().filter(|l| l.is_active()).count()
    }

    fn device(&self, id: DeviceId) -> Option<Device> {
        self.devices.iter().find(|d| d.id == id).copied()
    }

    fn v2(&self) -> bool {
        self.cfg.version == Version::V2
    }

    fn new_link_id(&mut self) -> LinkId {
        let id = LinkId(self.next_link_id);
        self.next_link_id = self.next_link_id.wrapping_add(1).max(1);
        id
    }

    fn uid(&self, num: u8) -> u32 {
        (self.cfg.lgr_id << 8) | u32::from(num)
    }

    fn touch(&mut self, now: Instant, link: LinkId) {
        if let Some(l) = self.find_mut(link) {
            if now > l.last_rx {
                l.last_rx = now;
            }
        }
    }

    fn emit(&mut self, e: Event) {
        debug!(event = ?e, "llc event");
        self.out.push_back(Output::Event(e));
    }

    fn send(&mut self, link: LinkId, msg: &LlcMessage<'_>, purpose: Purpose) -> SendId {
        let id = SendId(self.next_send);
        self.next_send += 1;
        trace!(%link, ?id, msg = ?msg, "llc send");
        if purpose != Purpose::Plain {
            self.sends.insert(id, (link, purpose));
        }
        self.out.push_back(Output::Send(Transmit {
            link,
            id,
            msg: LlcOut::new(msg),
        }));
        id
    }

    /// Forgets a link for good: its tokens, its number, its QP.
    fn remove_link(&mut self, id: LinkId) {
        let Some(pos) = self.links.iter().position(|l| l.id == id) else {
            return;
        };
        let l = self.links.remove(pos);
        self.rt.drop_link(id);
        if l.num != 0 {
            self.gone_nums.push_back(l.num);
            if self.gone_nums.len() > 16 {
                self.gone_nums.pop_front();
            }
        }
        self.out.push_back(Output::DestroyLink { link: id });
    }

    /// Starts queued work and re-dispatches deferred peer messages while something moves.
    fn pump(&mut self, now: Instant) {
        for _ in 0..64 {
            if self.term == Term::Done {
                return;
            }
            let mut progress = false;
            while let Some((link, m)) = self.deferred.front().cloned() {
                if self.find(link).is_none_or(|l| l.state == LinkState::Down) {
                    self.deferred.pop_front();
                    continue;
                }
                if self.must_defer(&m.as_wire()) {
                    break;
                }
                self.deferred.pop_front();
                self.dispatch(now, link, &m.as_wire());
                progress = true;
            }
            progress |= self.start_op(now);
            self.check_first_done();
            if !progress {
                return;
            }
        }
    }

    /// Starts the next queued local request if nothing blocks it.
    fn start_op(&mut self, now: Instant) -> bool {
        if self.term != Term::Running || self.config.is_some() || self.rkey.is_some() {
            return false;
        }
        if !matches!(self.first, First::Done | First::Second { .. }) {
            return false;
        }
        if self.pick_active(None).is_none() {
            return false;
        }
        // After a negative CONFIRM RKEY with the retry flag, give the peer's configuration
        // change time to finish before asking again (CRK-3); other work may go first.
        let held = self.rkey_hold.is_some_and(|t| t > now);
        let Some(pos) = self
            .ops
            .iter()
            .position(|o| !held || !matches!(o, Op::ConfirmRmb(_)))
        else {
            return false;
        };
        let Some(op) = self.ops.remove(pos) else {
            return false;
        };
        match op {
            Op::AddLink { replace } => self.start_add_link(now, replace),
            Op::DeleteLink {
                link,
                reason,
                orderly,
            } => self.start_delete_link(now, link, reason, orderly),
            Op::ConfirmRmb(rmb) => self.start_confirm_rkey(now, rmb),
            Op::DeleteRmb(rmb) => self.start_delete_rkey(now, rmb),
        }
        true
    }

    fn queue_add_link(&mut self, replace: bool) {
        if self.cfg.role == Role::Server
            && self.term == Term::Running
            && !matches!(self.config, Some(Config::SrvAdd(_)))
        {
            if let Some(Op::AddLink { replace: r }) = self
                .ops
                .iter_mut()
                .find(|o| matches!(o, Op::AddLink { .. }))
            {
                *r |= replace;
            } else {
                self.ops.push_back(Op::AddLink { replace });
            }
        }
    }

    /// Whether a peer request must wait for the current exchange (§3.5.5.3, B.14).
    fn must_defer(&self, msg: &LlcMessage<'_>) -> bool {
        if msg.is_response() {
            return false;
        }
        match (self.cfg.role, msg) {
            // Server: a client DELETE LINK for one link waits for the current exchange.
            (Role::Server, LlcMessage::DeleteLink(d)) => {
                !d.all && (self.config.is_some() || self.rkey.is_some())
            }
            // Server: a client ADD LINK or REQUEST ADD LINK during DELETE LINK or an RKey
            // exchange is queued; during ADD LINK it crossed ours and is ignored.
            (Role::Server, LlcMessage::AddLink(_) | LlcMessage::ReqAddLink(_)) => {
                matches!(self.config, Some(Config::SrvDel(_))) || self.rkey.is_some()
            }
            // Client: the server's ADD LINK / DELETE LINK waits while our own RKey exchange
            // is unanswered, and a second one waits for the current one (Linux parks it).
            (Role::Client, LlcMessage::AddLink(_)) => {
                self.rkey.is_some() || self.config.is_some() || self.remote_rkey.is_some()
            }
            _ => false,
        }
    }

    /// Routes one received message (RFC 7609 A.3 opcodes, C.7.1 for the odd ones).
    fn dispatch(&mut self, now: Instant, link: LinkId, msg: &LlcMessage<'_>) {
        // v1-only messages in a v2 link group and the reverse are out of sync.
        let wrong_version = match msg {
            LlcMessage::AddLinkCont(_) | LlcMessage::ConfirmRkeyCont(_) => self.v2(),
            LlcMessage::ReqAddLink(_) | LlcMessage::DeleteRkeyV2(_) => !self.v2(),
            _ => false,
        };
        if wrong_version {
            self.link_failed(
                now,
                link,
                LinkDownReason::ProtocolViolation("LLC message of the other SMC-R version"),
            );
            return;
        }
        // C.7.1: server commands on a link the client sent DELETE LINK for are crossing
        // messages; only DELETE LINK (all) and answers to our own requests go through.
        if self.cfg.role == Role::Client
            && !msg.is_response()
            && self.find(link).is_some_and(|l| l.client_deleting)
            && !matches!(msg, LlcMessage::TestLink(_) | LlcMessage::DeleteLink(_))
        {
            debug!(%link, "ignoring server command on a link we asked to delete");
            return;
        }
        if self.must_defer(msg) {
            debug!(%link, ty = ?msg.msg_type(), "deferring colliding LLC request");
            if self.deferred.len() < 32 {
                self.deferred.push_back((link, LlcOut::new(msg)));
            } else {
                warn!("too many deferred LLC requests: dropping one");
            }
            return;
        }
        match msg {
            LlcMessage::TestLink(m) => self.rx_test_link(now, link, m),
            LlcMessage::ConfirmLink(m) => self.rx_confirm_link(now, link, m),
            LlcMessage::AddLink(m) => self.rx_add_link(now, link, m),
            LlcMessage::AddLinkCont(m) => self.rx_add_link_cont(now, link, m),
            LlcMessage::ReqAddLink(m) => self.rx_req_add_link(now, link, m),
            LlcMessage::DeleteLink(m) => self.rx_delete_link(now, link, m),
            LlcMessage::ConfirmRkey(m) => self.rx_confirm_rkey(now, link, m),
            LlcMessage::ConfirmRkeyCont(m) => self.rx_confirm_rkey_cont(now, link, m),
            LlcMessage::DeleteRkey(_) | LlcMessage::DeleteRkeyV2(_) => {
                self.rx_delete_rkey(now, link, msg)
            }
        }
    }

    fn protocol_violation(&mut self, now: Instant, link: LinkId, what: &'static str) {
        warn!(%link, "LLC protocol violation: {what}");
        self.link_failed(now, link, LinkDownReason::ProtocolViolation(what));
    }
}

impl Config {
    fn deadline(&self) -> Option<Instant> {
        match self {
            Config::SrvAdd(f) => f.deadline,
            Config::CliAdd(f) => f.deadline,
            Config::SrvDel(f) => Some(f.deadline),
        }
    }
}
