//! What both rendezvous machines share: the output queue, the message reader, the one
//! timer, the Decline window, and the resources to give back when the rendezvous fails.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use smc_wire::clc::{ClcMessage, ClcType, DeclineRepr, Eyecatcher};
use smc_wire::common::PeerId;
use smc_wire::decline::DeclineCode;
use smc_wire::{Action, Error as WireError, Layer};
use tracing::{debug, info, warn};

use super::config::{AddLinkTimeout, ClcConfig, FirstLinkTimeout};
use super::env::{ClcEnv, LgrId, RmbAlloc};
use super::reader::{ClcReader, Read};
use super::{FallbackReason, LinkEvent, LinkFailure, Outcome, Output, ResetReason, Role, Waiting};

/// Longest single wait: a misconfigured timer can delay a rendezvous, not overflow.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(3600);

/// The deadline of a wait of `d` starting `now` (capped at [`MAX_WAIT`]).
pub(crate) fn wait_until(now: Instant, d: Duration) -> Instant {
    now.checked_add(d.min(MAX_WAIT)).unwrap_or(now)
}

/// A complete or failed read while a CLC message was expected.
#[derive(Debug)]
pub(crate) enum Incoming {
    /// The expected message type, or a Decline, complete but not yet parsed.
    Message(ClcType, Vec<u8>),
    /// A framing error or a type that is neither expected nor a Decline (PE-RST).
    Protocol(String),
}

/// What a received Decline did.
pub(crate) struct PeerDecline {
    pub repr: Option<DeclineRepr>,
}

pub(crate) struct Core {
    pub role: Role,
    pub own_peer_id: PeerId,
    pub os_type: u8,
    outputs: VecDeque<Output>,
    reader: ClcReader,
    /// The one armed timer.
    pub deadline: Option<Instant>,
    pub done: Option<Outcome>,
    /// Our Decline window (RFC 7609 C.1–C.3): may we still send a Decline?
    pub may_decline: bool,
    /// Header version of a Decline we send (Linux: the Proposal's version on the server,
    /// the Accept's on the client).
    pub decline_version: u8,
    /// A link group this rendezvous created (abandoned on failure).
    pub created_lgr: Option<LgrId>,
    /// The RMB element allocated for this connection (freed on failure).
    pub rmb: Option<(LgrId, RmbAlloc)>,
    /// A link group this negotiation referenced (target of an out-of-sync cleanup).
    pub referenced_lgr: Option<LgrId>,
    /// The peer's TCP FIN arrived during the link wait (see [`Core::peer_fin`]).
    pub fin: bool,
}

impl Core {
    pub fn new(role: Role, own_peer_id: PeerId, os_type: u8) -> Core {
        Core {
            role,
            own_peer_id,
            os_type: os_type & 0x0F,
            outputs: VecDeque::new(),
            reader: ClcReader::default(),
            deadline: None,
            done: None,
            may_decline: true,
            decline_version: 1,
            created_lgr: None,
            rmb: None,
            referenced_lgr: None,
            fin: false,
        }
    }

    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    pub fn push(&mut self, o: Output) {
        self.outputs.push_back(o);
    }

    pub fn send(&mut self, msg: ClcMessage) {
        debug_assert!(
            msg.to_vec().is_ok(),
            "the machine only produces encodable messages: {msg:?}"
        );
        debug!(role = ?self.role, msg = msg.msg_type().name(), "CLC send");
        self.outputs.push_back(Output::Send(Box::new(msg)));
    }

    pub fn is_done(&self) -> bool {
        self.done.is_some()
    }

    /// Bytes the reader needs next (the machine decides whether it reads at all);
    /// nothing after the peer's FIN.
    pub fn reader_wanted(&self) -> usize {
        if self.fin {
            0
        } else {
            self.reader.wanted()
        }
    }

    /// The peer's TCP FIN. During the link wait of a first contact it is no error: the
    /// peer's CLC part is over (its Confirm, or our Confirm was read), and a peer
    /// application that shuts down writing at once sends its FIN while CONFIRM LINK is
    /// still in flight (Linux `smc_shutdown` shuts the TCP socket too). The FIN then
    /// belongs to the connection and is handled there once it is established. Anywhere
    /// else, or in the middle of a message, the rendezvous cannot complete: reset.
    pub fn peer_fin<E: ClcEnv + ?Sized>(&mut self, in_link_wait: bool, env: &mut E) {
        if self.is_done() {
            return;
        }
        if in_link_wait && self.reader.is_idle() {
            debug!(role = ?self.role, "peer's TCP FIN during the link wait: kept for the connection");
            self.fin = true;
            return;
        }
        self.reset(ResetReason::TcpClosed, env);
    }

    /// Feeds bytes while `expected` (or a Decline) is awaited; returns the bytes taken
    /// and what arrived, if anything did.
    pub fn read(&mut self, bytes: &[u8], expected: ClcType) -> (usize, Option<Incoming>) {
        let (n, r) = self.reader.push(bytes);
        let inc = match r {
            Read::More => None,
            Read::Header(ty) if ty == expected || ty == ClcType::Decline => None,
            Read::Header(ty) => Some(Incoming::Protocol(format!(
                "{} received while expecting {}",
                ty.name(),
                expected.name()
            ))),
            Read::BadHeader(e) => Some(Incoming::Protocol(format!(
                "expected {}, got bytes that are not a CLC message ({e})",
                expected.name()
            ))),
            Read::Complete(m) => {
                let ty = ClcType::from_u8(m[4]).unwrap_or(expected);
                Some(Incoming::Message(ty, m))
            }
        };
        (n, inc)
    }

    /// A Decline message arrived (complete bytes): parse it. A framing defect is a
    /// protocol error; a reserved value (version 0) still ends in a fallback, without a
    /// Decline of our own (the peer has already fallen back, and anything we sent now
    /// would reach its application).
    pub fn parse_decline(bytes: &[u8]) -> Result<PeerDecline, String> {
        match DeclineRepr::parse(bytes) {
            Ok(d) => Ok(PeerDecline { repr: Some(d) }),
            Err(e) if e.action(Layer::Clc) == Action::DeclineAndFallback => {
                Ok(PeerDecline { repr: None })
            }
            Err(e) => Err(format!("malformed Decline: {e}")),
        }
    }

    /// Builds our Decline (Linux `smc_clc_send_decline`).
    pub fn decline_msg(&self, code: DeclineCode, out_of_sync: bool) -> ClcMessage {
        let v2 = self.decline_version >= 2;
        ClcMessage::Decline(DeclineRepr {
            eyecatcher: Eyecatcher::Smcr,
            version: if v2 { 2 } else { 1 },
            out_of_sync,
            peer_id: self.own_peer_id,
            diagnosis: code,
            os_type: if v2 { self.os_type } else { 0 },
            diagnosis_v2: v2.then_some([0; 4]),
        })
    }

    /// Gives back what this rendezvous allocated.
    pub fn release<E: ClcEnv + ?Sized>(&mut self, env: &mut E) {
        if let Some((lgr, rmb)) = self.rmb.take() {
            if Some(lgr) != self.created_lgr {
                env.free_rmb(lgr, rmb.rmb);
            }
        }
        if let Some(lgr) = self.created_lgr.take() {
            env.abandon_lgr(lgr);
        }
    }

    fn finish(&mut self, outcome: Outcome) {
        self.deadline = None;
        self.may_decline = false;
        self.outputs.push_back(Output::Done(outcome.clone()));
        self.done = Some(outcome);
    }

    /// Ends in SMC-R: the resources now belong to the connection.
    pub fn finish_smc(&mut self, outcome: Outcome) {
        self.created_lgr = None;
        self.rmb = None;
        info!(role = ?self.role, "SMC-R rendezvous complete");
        self.finish(outcome);
    }

    /// Ends in a reset (RFC 7609 C.5, C.6).
    pub fn reset<E: ClcEnv + ?Sized>(&mut self, reason: ResetReason, env: &mut E) {
        if self.is_done() {
            return;
        }
        warn!(role = ?self.role, %reason, "CLC rendezvous failed: resetting the TCP connection");
        self.release(env);
        self.finish(Outcome::Reset(reason));
    }

    /// Ends in a fallback without any message (CLC never started).
    pub fn not_eligible(&mut self, reason: String) {
        info!(role = ?self.role, %reason, "SMC-R not negotiated: plain TCP");
        self.finish(Outcome::Fallback(FallbackReason {
            local: DeclineCode::PEERNOSMC,
            peer: None,
            out_of_sync: false,
            detail: Some(reason),
        }));
    }

    /// A local reason to give up: Decline and fall back while the Decline window is
    /// open, reset otherwise (no chase, RFC 7609 C.1; point of no return, C.3).
    pub fn decline<E: ClcEnv + ?Sized>(
        &mut self,
        code: DeclineCode,
        out_of_sync: bool,
        env: &mut E,
    ) {
        if self.is_done() {
            return;
        }
        if !self.may_decline {
            self.reset(ResetReason::LocalFailure(code), env);
            return;
        }
        info!(role = ?self.role, code = %code, out_of_sync, "declining SMC-R: TCP fallback");
        let msg = self.decline_msg(code, out_of_sync);
        self.send(msg);
        self.release(env);
        self.finish(Outcome::Fallback(FallbackReason {
            local: code,
            peer: None,
            out_of_sync,
            detail: None,
        }));
    }

    /// The peer declined (RFC 7609 C.1): fall back, no reply; S = 1 → the runtime
    /// terminates the link group this negotiation referenced (A.2.5, AMB-15).
    pub fn peer_declined<E: ClcEnv + ?Sized>(&mut self, d: PeerDecline, env: &mut E) {
        if self.is_done() {
            return;
        }
        let (diag, sync) = match d.repr {
            Some(r) => (r.diagnosis, r.out_of_sync),
            None => (DeclineCode(0), false),
        };
        info!(role = ?self.role, diagnosis = %diag, out_of_sync = sync, "peer declined SMC-R: TCP fallback");
        if sync {
            // A link group this rendezvous created is abandoned by `release` anyway.
            if let Some(lgr) = self.referenced_lgr.filter(|l| Some(*l) != self.created_lgr) {
                self.push(Output::OutOfSync { lgr });
            }
        }
        self.release(env);
        self.finish(Outcome::Fallback(FallbackReason {
            local: DeclineCode::PEERDECL,
            peer: Some(diag),
            out_of_sync: sync,
            detail: None,
        }));
    }

    /// Maps a parse error of an expected message to RFC 7609 C.6.
    pub fn parse_failed<E: ClcEnv + ?Sized>(&mut self, what: &str, e: WireError, env: &mut E) {
        match e.action(Layer::Clc) {
            Action::DeclineAndFallback => {
                debug!(role = ?self.role, %e, "reserved value in the {what}");
                self.decline(DeclineCode::VERSMISMAT, false, env)
            }
            _ => self.reset(ResetReason::Protocol(format!("malformed {what}: {e}")), env),
        }
    }
}

/// The wait after a first-contact Confirm: CONFIRM LINK, then the ADD LINK attempt
/// (RFC 7609 §3.5.1.5, §3.5.1.6, C.2, C.3, C.7; Linux `smcr_*_conf_first_link`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LinkWait {
    /// The first link is up (the ADD LINK wait is running).
    pub up: bool,
    /// The C.3 point of no return passed: a peer's Decline is a protocol error.
    pub no_return: bool,
    /// The wait expired once; only the grace period for a Decline is left.
    pub grace: bool,
}

impl Core {
    /// One llc event during the link wait. Returns true when the rendezvous completes.
    pub fn link_event<E: ClcEnv + ?Sized>(
        &mut self,
        w: &mut LinkWait,
        ev: LinkEvent,
        now: Instant,
        cfg: &ClcConfig,
        single_link: bool,
        env: &mut E,
    ) -> bool {
        match ev {
            LinkEvent::ConfirmLinkSent => {
                self.may_decline = false;
                false
            }
            LinkEvent::FirstLinkUp => {
                self.may_decline = false;
                if !w.up {
                    w.up = true;
                    w.grace = false;
                    if single_link {
                        // SMCv2.1 with max_links 1: no ADD LINK will come.
                        return true;
                    }
                    self.deadline = Some(wait_until(now, cfg.add_link_timeout));
                }
                false
            }
            LinkEvent::PointOfNoReturn => {
                self.may_decline = false;
                w.no_return = true;
                false
            }
            LinkEvent::SecondLinkSettled => {
                self.may_decline = false;
                true
            }
            LinkEvent::Failed {
                failure: LinkFailure::Timeout,
                ..
            } => {
                // The llc's own timer: handled like ours (RFC 7609 C.7).
                self.link_timeout(w, now, cfg, env)
            }
            LinkEvent::Failed { code, .. } => {
                if w.up || w.no_return {
                    self.reset(ResetReason::LocalFailure(code), env);
                } else {
                    // Decline while allowed (C.2: a send failure before our own CONFIRM
                    // LINK went out), reset otherwise.
                    self.decline(code, false, env);
                }
                false
            }
        }
    }

    /// The link wait's timer expired. Returns true when the rendezvous completes.
    pub fn link_timeout<E: ClcEnv + ?Sized>(
        &mut self,
        w: &mut LinkWait,
        now: Instant,
        cfg: &ClcConfig,
        env: &mut E,
    ) -> bool {
        if !w.up {
            match cfg.first_link_timeout {
                FirstLinkTimeout::Reset => {
                    self.reset(ResetReason::Timeout(Waiting::ConfirmLink), env)
                }
                FirstLinkTimeout::DeclineAfterGrace if !self.may_decline => {
                    self.reset(ResetReason::Timeout(Waiting::ConfirmLink), env)
                }
                FirstLinkTimeout::DeclineAfterGrace if w.grace => {
                    self.decline(DeclineCode::TIMEOUT_CL, false, env)
                }
                FirstLinkTimeout::DeclineAfterGrace => {
                    w.grace = true;
                    self.deadline = Some(wait_until(now, cfg.decline_grace));
                }
            }
            return false;
        }
        match cfg.add_link_timeout_action {
            AddLinkTimeout::Reset => {
                self.reset(ResetReason::Timeout(Waiting::AddLink), env);
                false
            }
            AddLinkTimeout::ContinueSingleLink if w.grace => true,
            AddLinkTimeout::ContinueSingleLink => {
                w.grace = true;
                self.deadline = Some(wait_until(now, cfg.decline_grace));
                false
            }
        }
    }

    /// A Decline arrived (either side): parsed, it ends the rendezvous as a fallback or, in
    /// a link wait past the point of no return, a reset; unparsable, a reset.
    pub fn decline_received<E: ClcEnv + ?Sized>(
        &mut self,
        bytes: &[u8],
        link_wait: Option<&LinkWait>,
        env: &mut E,
    ) {
        match Self::parse_decline(bytes) {
            Ok(d) => match link_wait {
                Some(w) => self.link_wait_decline(w, d, env),
                None => self.peer_declined(d, env),
            },
            Err(why) => self.reset(ResetReason::Protocol(why), env),
        }
    }

    /// A peer's Decline during the link wait: fallback before the point of no return
    /// (C.2, C.3), reset after it.
    pub fn link_wait_decline<E: ClcEnv + ?Sized>(
        &mut self,
        w: &LinkWait,
        d: PeerDecline,
        env: &mut E,
    ) {
        if w.no_return {
            let code = d.repr.map_or(DeclineCode(0), |r| r.diagnosis);
            self.reset(ResetReason::LateDecline(code), env);
        } else {
            self.peer_declined(d, env);
        }
    }
}

/// An environment with nothing in it, for declines before anything was allocated.
pub(crate) struct NoEnv;

impl ClcEnv for NoEnv {
    fn server_find_lgr(&mut self, _: &super::LgrQuery) -> super::LgrLookup {
        super::LgrLookup::None
    }
    fn server_create_lgr(
        &mut self,
        _: &super::ServerLgrRequest,
    ) -> Result<(LgrId, super::LocalLink), DeclineCode> {
        Err(DeclineCode::INTERR)
    }
    fn server_match_link(&mut self, _: LgrId, _: &super::PeerLinkId) -> Option<super::LinkId> {
        None
    }
    fn server_start_first_link(
        &mut self,
        _: LgrId,
        _: super::LinkId,
        _: smc_wire::common::PeerId,
        _: &super::PeerQp,
    ) -> Result<(), DeclineCode> {
        Err(DeclineCode::INTERR)
    }
    fn client_lookup(&mut self, _: &super::AcceptQuery) -> super::ClientLookup {
        super::ClientLookup::default()
    }
    fn client_create_lgr(
        &mut self,
        _: &super::ClientLgrRequest,
    ) -> Result<(LgrId, super::LocalLink), DeclineCode> {
        Err(DeclineCode::INTERR)
    }
    fn alloc_rmb(&mut self, _: LgrId, _: super::LinkId, _: bool) -> Result<RmbAlloc, DeclineCode> {
        Err(DeclineCode::INTERR)
    }
    fn register_peer_rmb(
        &mut self,
        _: LgrId,
        _: super::LinkId,
        _: &super::PeerRmb,
    ) -> Result<Option<super::ConnRef>, DeclineCode> {
        Err(DeclineCode::INTERR)
    }
    fn route_v2(&mut self, _: smc_wire::common::Gid) -> Option<super::V2Route> {
        None
    }
    fn free_rmb(&mut self, _: LgrId, _: super::RmbId) {}
    fn abandon_lgr(&mut self, _: LgrId) {}
}
