//! What the link-group machine tells the runtime: events, transmits, outputs, and the
//! reasons links and link groups end.

use super::*;

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
    /// A link must no longer be used: its connections leave it — moved to another link
    /// (§4.6) by a driver that does failover; the endpoint, which does not yet, ends them.
    /// Its QP is destroyed later ([`Output::DestroyLink`]).
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
