//! The SMC-R rendezvous: CLC Proposal → Accept → Confirm (or Decline) on the TCP
//! connection, as one sans-I/O state machine per connection, [`Rendezvous`] (client or
//! server side).
//!
//! RFC 7609 §3.5.1–§3.5.3 and Appendix C, with the Linux dialect (SMC-Rv2 / v2.1,
//! linux-smc.md §1.2–§1.8, §2.1–§2.3, §2.12). Message contents come from `smc-wire`.
//!
//! # How it is driven
//!
//! A machine does no I/O and reads no clock. Its driver — the
//! [`Endpoint`](crate::endpoint::Endpoint), which owns the link groups and their llc
//! machines, with the `smc` runtime doing the socket and verbs I/O for it — does this:
//!
//! 1. creates the machine after the TCP handshake with the TCP-option outcome
//!    ([`Eligibility`]) and the route facts ([`ClientRoute`] / [`ServerRoute`]);
//! 2. reads exactly [`Rendezvous::bytes_wanted`] bytes (never more: what follows a
//!    Decline is application data) and passes them to `handle_tcp_bytes`; reports EOF
//!    with `handle_tcp_fin` (no error during a first contact's link wait) and a socket
//!    error or RST with `handle_tcp_closed`;
//! 3. forwards the llc machine's progress ([`LinkEvent`]) and CONFIRM RKEY results, and
//!    (server) the outcome of a same-host exchange it runs elsewhere
//!    ([`Rendezvous::handle_same_host`], after [`ServerSameHost::Later`]);
//! 4. calls `on_timeout(now)` at [`Rendezvous::poll_timeout`];
//! 5. after every call drains `poll_output()` in order: [`Output::Send`] goes on the TCP
//!    socket, [`Output::ConfirmRkey`] to the llc machine, [`Output::OutOfSync`] /
//!    [`Output::AbortConn`] to the link-group and connection tables, and
//!    [`Output::Done`] ends the rendezvous.
//!
//! Local queries and allocations are synchronous calls on the driver's [`ClcEnv`] (the
//! endpoint's implementation is `endpoint/env.rs`); only the same-host exchange may
//! answer "later" (it waits on the client's process). `docs/clc.md` walks through the
//! driver's side.
//!
//! # Rules implemented here, and why
//!
//! * **Eligibility** (RFC 7609 §3.1, §3.5.1.1, CHECKLIST B.2 TO-4): without the TCP
//!   option from both sides (or an explicit policy override) nothing is sent and the
//!   outcome is an immediate [`Outcome::Fallback`] with the reason in words.
//! * **Decline in lieu of an expected message** (C.1, CHECKLIST A.2.6, FB-2): accepted
//!   in every wait; it ends the rendezvous in a fallback, with no reply. With the S flag
//!   (out of sync, A.2.5) the driver is told to terminate the link group this
//!   negotiation referenced ([`Output::OutOfSync`], AMB-15).
//! * **Protocol errors** (C.6): a bad eye catcher, type, length or layout, application
//!   data where a CLC message is expected, or an unexpected message type reset the TCP
//!   connection — no fallback. A reserved enumerated value (QP MTU on first contact, a
//!   CLC version 0, an RMBE size code above [`ClcConfig::max_peer_rmbe_code`]) is
//!   answered with a Decline and falls back instead (AMB-08, AMB-09).
//! * **Timers** (C.5, C.7): every wait is bounded ([`ClcConfig`]); a CLC wait that
//!   expires resets the TCP connection. [`ClcConfig::max_rendezvous_time`] bounds the
//!   whole rendezvous.
//! * **No chase** (C.1, FB-3): a Decline is only ever sent in place of our next CLC
//!   message: the client declines in place of the Confirm (or, with nothing to offer, of
//!   the Proposal, like Linux), the server in place of the Accept.
//! * **Point of no return** (C.2, C.3, AMB-19): on subsequent contact the server never
//!   declines after its Accept and the client never after its Confirm; on first contact
//!   neither declines once its own CONFIRM LINK was sent successfully
//!   ([`LinkEvent::ConfirmLinkSent`]); after that, failures reset the TCP connection.
//!   A peer's Decline is accepted up to [`LinkEvent::PointOfNoReturn`] (C.3 milestones).
//! * **Accept classification** (B.6.3, C.4, AMB-14): F = 1 and no link group with the
//!   peer → first contact; F = 1 with a link group → parallel link group (§3.5.3); F = 1
//!   naming one of our active links → out of sync; F = 0 naming an active link →
//!   subsequent contact; F = 0 and no link group with the peer → out of sync (Decline
//!   SYNCERR with S = 1, like Linux `smc_conn_create`); F = 0 with a link group but no such
//!   link → Decline NOSRVLINK (Linux `smc_connect_rdma`).
//! * **Versions** (A.2 CLC-G4, AMB-08, Linux §1.8): the client offers v1 and/or v2 (v2
//!   only with a UEID configured, as Linux); the server answers in the highest version
//!   both can use. v2 needs a common UEID; a v2-only Proposal whose EIDs match none of
//!   ours is declined with NOSMCDEV — what Linux sends (kernel-peer README §V4(f)) — and
//!   one that carries no EID at all with NOUEID. A v2 failure falls back to v1 when v1
//!   was offered too (Linux would decline; answering v1 is what the client asked for).
//! * **SMCv2.1** (Linux `smc_clc_*_v2x_features_*`): the server takes the minimum of
//!   both `max_conns` / `max_links` and declines MAXCONNERR below 16 connections and
//!   MAXLINKERR below 1 link; the client declines an Accept whose values are out of those
//!   bounds or above what it offered, or whose release is above its own (RELEASEERR); the
//!   server declines a first-contact Confirm that does not echo the negotiated release
//!   and limits.
//! * **SMC-Rv2 routes** (Linux `smc_connect_rdma_v2_prepare`): a client that is told the
//!   server is not directly reachable (`v2_direct` = 0) needs a route (NOROUTE) through a
//!   gateway (NOINDIRECT); the server reports `v2_direct` from its own route lookup.
//! * **Same LAN** (§3.5.1.2, v1): the server needs an interface address whose prefix
//!   equals the client's IPv4 subnet (same prefix length) or one of its IPv6 prefixes;
//!   otherwise DIFFPREFIX. An IPv6 Proposal with no prefix cannot match (AMB-07).
//! * **RMBE conflicts** (§4.4.2, CHECKLIST RE-8, AMB-46): an <RToken, index> already in
//!   use by a live connection is not a Decline: the old connection is aborted
//!   ([`Output::AbortConn`]) and the rendezvous proceeds.

mod client;
mod config;
mod core;
mod env;
mod negotiate;
mod reader;
mod rendezvous;
mod server;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod ueid;

#[cfg(test)]
mod tests;

use std::fmt;

use smc_wire::clc::ClcMessage;
use smc_wire::common::{Eid, Gid, HostName};
use smc_wire::decline::DeclineCode;

pub use crate::ids::{Role, Version};
pub use config::{
    AddLinkTimeout, ClcConfig, FirstLinkTimeout, ProposalLayout, V2Config, LINUX_MAX_LINKS_PER_LGR,
    MAX_CONNS_PER_LGR, MIN_CONNS_PER_LGR, MIN_LINKS_PER_LGR, OS_TYPE_LINUX, RELEASE_V2_1,
};
pub use env::{
    AcceptQuery, ClcEnv, ClientLgrRequest, ClientLookup, ClientRoute, ClientV2Route, ConnRef,
    LgrId, LgrLookup, LgrQuery, LinkId, LocalDevice, LocalLink, LocalPrefix, PeerLinkId, PeerQp,
    PeerRmb, ProposalIp, RmbAlloc, RmbId, ServerLgrRequest, ServerRoute, ServerSameHost, V2Params,
    V2Route, MAX_GID_LIST,
};
pub use rendezvous::Rendezvous;
pub use ueid::{Ueid, UeidError, UeidTable};

/// Whether CLC may start on this connection: the runtime's reading of the TCP option
/// (RFC 7609 §3.5.1.1) — `smc::tcp_option::Decision` maps one to one:
/// `Clc(BothAnnounced)` → [`Eligibility::BothAnnounced`],
/// `Clc(PolicyOverride { pattern })` → [`Eligibility::PolicyOverride`],
/// `Fallback { reason }` → [`Eligibility::NotEligible`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Eligibility {
    /// SYN and SYN-ACK both carried the SMC-R option.
    BothAnnounced,
    /// Outside RFC 7609: the option check was skipped for this peer by policy.
    PolicyOverride {
        /// The matching pattern, for the logs.
        pattern: String,
    },
    /// Plain TCP; no CLC message is sent or expected.
    NotEligible {
        /// Why, in words (e.g. "peer did not announce SMC-R").
        reason: String,
    },
}

/// How the connection relates to link groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contact {
    /// A new link group (no other with this peer in this role).
    First,
    /// A new link group next to an existing one (RFC 7609 §3.5.3).
    Parallel,
    /// An existing link group (RFC 7609 §3.5.2).
    Subsequent,
}

impl Contact {
    /// True for a new link group (first or parallel).
    pub fn is_first(self) -> bool {
        !matches!(self, Contact::Subsequent)
    }
}

/// Why the rendezvous waited in vain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waiting {
    /// Server: the Proposal.
    Proposal,
    /// Client: the Accept.
    Accept,
    /// Server: the Confirm.
    Confirm,
    /// A CONFIRM RKEY exchange.
    ConfirmRkey,
    /// The first link's CONFIRM LINK exchange.
    ConfirmLink,
    /// The ADD LINK outcome after first contact.
    AddLink,
}

impl fmt::Display for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Waiting::Proposal => "the CLC Proposal",
            Waiting::Accept => "the CLC Accept",
            Waiting::Confirm => "the CLC Confirm",
            Waiting::ConfirmRkey => "CONFIRM RKEY",
            Waiting::ConfirmLink => "CONFIRM LINK",
            Waiting::AddLink => "ADD LINK",
        })
    }
}

/// Why the TCP connection must be reset (no fallback).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResetReason {
    /// A wait expired (RFC 7609 C.5, C.7).
    #[error("timed out waiting for {0}")]
    Timeout(Waiting),
    /// A CLC protocol error (RFC 7609 C.6): malformed or unexpected message, or
    /// application data where CLC was expected.
    #[error("CLC protocol error: {0}")]
    Protocol(String),
    /// The TCP connection was closed or failed during the rendezvous.
    #[error("TCP connection closed during the rendezvous")]
    TcpClosed,
    /// A local failure after this side may no longer Decline (RFC 7609 C.1–C.3).
    #[error("{}, after the Decline window closed", explain(*.0))]
    LocalFailure(DeclineCode),
    /// The peer declined after the point of no return (RFC 7609 C.3).
    #[error("peer declined after the point of no return: {}", explain(*.0))]
    LateDecline(DeclineCode),
}

/// Why the connection carries on as plain TCP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FallbackReason {
    /// The local reason code, as Linux reports it (smc_diag): what we sent in our
    /// Decline, [`DeclineCode::PEERDECL`] when the peer declined, or
    /// [`DeclineCode::PEERNOSMC`] when CLC did not start.
    pub local: DeclineCode,
    /// The peer's diagnosis, when the peer declined.
    pub peer: Option<DeclineCode>,
    /// The S (out of sync) flag of the Decline that ended the rendezvous.
    pub out_of_sync: bool,
    /// More detail (why CLC did not start).
    pub detail: Option<String>,
}

fn explain(code: DeclineCode) -> String {
    match code.explain() {
        Some(e) => format!("{e} ({:#010x})", code.0),
        None => format!("unknown reason ({:#010x})", code.0),
    }
}

impl fmt::Display for FallbackReason {
    /// `TCP fallback: peer declined: no usable SMC device ... (0x03030000)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TCP fallback: ")?;
        if let Some(p) = self.peer {
            write!(f, "peer declined: {}", explain(p))?;
        } else if let Some(d) = &self.detail {
            write!(f, "SMC-R not negotiated: {d}")?;
        } else {
            write!(f, "declined: {}", explain(self.local))?;
        }
        if self.out_of_sync {
            f.write_str(" [link group out of sync]")?;
        }
        Ok(())
    }
}

/// SMC-Rv2 facts of an established connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct V2Established {
    /// The negotiated EID (the link group's).
    pub eid: Eid,
    /// First contact only: what was negotiated for the new link group. A subsequent
    /// contact inherits the link group's values.
    pub first_contact: Option<V2FirstContact>,
}

/// What a first-contact SMC-Rv2 exchange settled for the new link group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct V2FirstContact {
    /// Negotiated release, limits and features.
    pub params: V2Params,
    /// The peer's OS type (4 bits: 1 z/OS, 2 Linux, 3 AIX).
    pub peer_os: u8,
    /// The peer's host name.
    pub peer_hostname: HostName,
    /// Server only: the client's usable RoCEv2 GIDs from the Confirm (for ADD LINK).
    pub peer_gids: Vec<Gid>,
    /// How the peer's GID is reached (`v2_direct` = `!uses_gateway`).
    pub route: V2Route,
}

/// A connection that will use SMC-R: everything the driver needs to create the `conn`
/// machine and account for it in its link group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SmcEstablished {
    /// Our role.
    pub role: Role,
    /// Negotiated version.
    pub version: Version,
    /// First, parallel or subsequent contact.
    pub contact: Contact,
    /// The link group.
    pub lgr: LgrId,
    /// The link we named in our Accept/Confirm (our RMB's RKey is the one for it).
    pub link: LinkId,
    /// Our RMB element and alert token.
    pub local_rmb: RmbAlloc,
    /// The link the peer named (its RMB RKey is the one for it).
    pub peer_rmb_link: LinkId,
    /// The peer's side of that link.
    pub peer_link: PeerLinkId,
    /// The peer's RMB element and alert token.
    pub peer_rmb: PeerRmb,
    /// SMC-Rv2 details.
    pub v2: Option<V2Established>,
}

/// How a rendezvous ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// SMC-R: the connection's data goes over RDMA.
    Smc(Box<SmcEstablished>),
    /// Plain TCP on the same connection.
    Fallback(FallbackReason),
    /// Reset the TCP connection (RST, e.g. `SO_LINGER` 0 then close).
    Reset(ResetReason),
    /// smc-rs's same-host path: the connection's data goes through the shared memory the
    /// runtime set up for this nonce (`ClcEnv::server_same_host` /
    /// `ClcEnv::client_same_host`).
    SameHost(SameHostEstablished),
}

/// A rendezvous that ended on the same-host path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SameHostEstablished {
    /// Our side.
    pub role: Role,
    /// The offer's nonce: names the shared memory the runtime prepared.
    pub nonce: u64,
    /// The peer stack's id.
    pub peer_stack: u64,
}

/// The llc machine's progress on the first link of a new link group, reported by the
/// driver (the endpoint) to the rendezvous machine (RFC 7609 §3.5.1.5, §3.5.1.6, C.2, C.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkEvent {
    /// Our CONFIRM LINK (server: the request; client: the response) completed
    /// successfully. From now on this side never sends a Decline (C.2, AMB-19).
    ConfirmLinkSent,
    /// The first link is confirmed (server: the response arrived; client: the response
    /// was sent). Implies [`LinkEvent::ConfirmLinkSent`].
    FirstLinkUp,
    /// The C.3 point of no return passed (server: ADD LINK send completed or its reply
    /// arrived; client: a negative ADD LINK reply sent, a positive one completed, or the
    /// second link's CONFIRM LINK arrived). A peer's Decline is a protocol error after it.
    PointOfNoReturn,
    /// The second-link attempt after first contact is over (link added, rejected, or not
    /// attempted because the link group allows one link): the connection may open
    /// (RFC 7609 §3.5.1.6; CHECKLIST B.3 S11/C9).
    SecondLinkSettled,
    /// Setting up the first link failed.
    Failed {
        /// What failed.
        failure: LinkFailure,
        /// The diagnosis for a Decline (e.g. TIMEOUT_CL, RMBE_EC, ERR_RDYLNK).
        code: DeclineCode,
    },
}

/// Kinds of first-link failure (RFC 7609 C.7, C.7.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkFailure {
    /// A send completed in error (the usual RoCE failure): Decline while allowed.
    SendFailed,
    /// The peer's CONFIRM LINK was invalid: Decline while allowed (C.7.1).
    InvalidMessage,
    /// The llc's own timer expired: handled like the machine's own timer (C.7).
    Timeout,
    /// Any other local failure: Decline while allowed.
    Other,
}

/// What the driver must do next, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Write this CLC message to the TCP socket (`msg.to_vec()`; never fails for
    /// messages the machine produces).
    Send(Box<ClcMessage>),
    /// Run CONFIRM RKEY for this RMB on all links of the link group through the llc
    /// machine, then call `handle_rkey_confirmed` (RFC 7609 §3.5.5.2.1).
    ConfirmRkey {
        /// Link group.
        lgr: LgrId,
        /// The link to send it on (the connection's).
        link: LinkId,
        /// The RMB.
        rmb: RmbId,
    },
    /// A Decline with the S flag was received: terminate the link group this
    /// negotiation referenced and its connections (RFC 7609 A.2.5; CHECKLIST AMB-15).
    /// Only that one: the Decline's Peer ID is whatever the sender wrote (Linux's
    /// v2-only Proposals carry zero), so it must never select link groups — a stranger
    /// could otherwise end every link group of another peer (Linux, too, touches only
    /// `smc->conn.lgr`). A Decline with S = 1 when nothing was referenced changes
    /// nothing but this connection's outcome.
    OutOfSync {
        /// The link group this negotiation referenced.
        lgr: LgrId,
    },
    /// This existing connection uses the <RToken, index> the peer just assigned to the
    /// new one: abort it — reset its TCP connection, stop writing to its peer RMBE,
    /// discard its data, free its RMBE (RFC 7609 §4.4.2, CHECKLIST RE-8).
    AbortConn {
        /// The connection.
        conn: ConnRef,
    },
    /// The rendezvous is over. `Fallback`: the TCP socket now carries the application's
    /// data; `Smc`: it stays open and idle for close and keepalive.
    Done(Outcome),
}
