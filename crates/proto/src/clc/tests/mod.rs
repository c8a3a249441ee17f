//! Deterministic tests of the rendezvous machines with a fake runtime ([`FakeEnv`]), a
//! fake clock and a fake llc. Test functions carry the CHECKLIST conformance IDs (§E.2
//! CLC, §E.3 FC, §E.4 SL, §E.5 SC); `linux` feeds the real Linux 6.12 messages of
//! `tests/fixtures/pcaps/k612-pair.pcap`; `adversarial` runs seeded random peers.

mod adversarial;
mod clc;
mod first_contact;
mod linux;
mod samehost;
mod subsequent;
mod v2;

use ::core::net::Ipv4Addr;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use arrayvec::ArrayVec;
use smc_wire::clc::{AcceptConfirmRepr, ClcMessage, DeclineRepr, ProposalRepr};
use smc_wire::common::{BufSize, Mac, PeerId, QpMtu, U24};
use smc_wire::decline::DeclineCode;

use super::*;

// The fake runtime and the fixed hosts live in `clc::testing` (shared with the fuzz
// targets through the `testing` feature).
pub(super) use super::testing::{
    cfg, client_route, gid4, mac, pid, server_route, ueids, FakeEnv, FakeLgr, FakeLink,
    CLIENT_HOST, SERVER_HOST, UEID,
};

/// All outputs so far.
pub(super) fn drain(m: &mut Rendezvous) -> Vec<Output> {
    std::iter::from_fn(|| m.poll_output()).collect()
}

/// The CLC messages among outputs.
pub(super) fn sent(outs: &[Output]) -> Vec<ClcMessage> {
    outs.iter()
        .filter_map(|o| match o {
            Output::Send(m) => Some((**m).clone()),
            _ => None,
        })
        .collect()
}

pub(super) fn bytes_of(outs: &[Output]) -> Vec<u8> {
    sent(outs)
        .iter()
        .flat_map(|m| m.to_vec().unwrap())
        .collect()
}

pub(super) fn done(outs: &[Output]) -> Option<&Outcome> {
    outs.iter().find_map(|o| match o {
        Output::Done(d) => Some(d),
        _ => None,
    })
}

pub(super) fn only_proposal(outs: &[Output]) -> ProposalRepr {
    match sent(outs).as_slice() {
        [ClcMessage::Proposal(p)] => p.clone(),
        other => panic!("expected one Proposal, got {other:?}"),
    }
}

pub(super) fn only_accept(outs: &[Output]) -> AcceptConfirmRepr {
    match sent(outs).as_slice() {
        [ClcMessage::Accept(a)] => a.clone(),
        other => panic!("expected one Accept, got {other:?}"),
    }
}

pub(super) fn only_confirm(outs: &[Output]) -> AcceptConfirmRepr {
    match sent(outs).as_slice() {
        [ClcMessage::Confirm(a)] => a.clone(),
        other => panic!("expected one Confirm, got {other:?}"),
    }
}

pub(super) fn only_decline(outs: &[Output]) -> DeclineRepr {
    match sent(outs).as_slice() {
        [ClcMessage::Decline(d)] => *d,
        other => panic!("expected one Decline, got {other:?}"),
    }
}

pub(super) fn smc(o: Option<&Outcome>) -> SmcEstablished {
    match o {
        Some(Outcome::Smc(s)) => (**s).clone(),
        other => panic!("expected SMC-R, got {other:?}"),
    }
}

pub(super) fn fallback(o: Option<&Outcome>) -> FallbackReason {
    match o {
        Some(Outcome::Fallback(f)) => f.clone(),
        other => panic!("expected a fallback, got {other:?}"),
    }
}

pub(super) fn reset(o: Option<&Outcome>) -> ResetReason {
    match o {
        Some(Outcome::Reset(r)) => r.clone(),
        other => panic!("expected a reset, got {other:?}"),
    }
}

/// Asserts that the machine sent a Decline with this code and fell back.
#[track_caller]
pub(super) fn assert_declined(outs: &[Output], code: DeclineCode) -> DeclineRepr {
    let d = only_decline(outs);
    assert_eq!(d.diagnosis, code, "Decline code");
    let f = fallback(done(outs));
    assert_eq!(f.local, code);
    assert_eq!(f.peer, None);
    d
}

/// Asserts a reset with no CLC message sent.
#[track_caller]
pub(super) fn assert_reset(outs: &[Output]) -> ResetReason {
    assert!(
        sent(outs).is_empty(),
        "no message on a reset: {:?}",
        sent(outs)
    );
    reset(done(outs))
}

/// The resources of a failed rendezvous were given back.
#[track_caller]
pub(super) fn assert_no_leak(env: &FakeEnv, before_lgrs: usize) {
    assert!(env.live_rmbs.is_empty(), "RMBs left: {:?}", env.live_rmbs);
    assert_eq!(
        env.lgr_count(),
        before_lgrs,
        "link groups left: {:?}",
        env.lgrs
    );
}

/// A clock for tests.
pub(super) fn t0() -> Instant {
    Instant::now()
}

pub(super) fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// A client that sent its Proposal.
pub(super) fn client(now: Instant, c: &ClcConfig) -> (Rendezvous, ProposalRepr) {
    let mut m = Rendezvous::client(now, c, client_route(), Eligibility::BothAnnounced);
    let outs = drain(&mut m);
    (m, only_proposal(&outs))
}

/// A server waiting for a Proposal.
pub(super) fn server(now: Instant, c: &ClcConfig) -> Rendezvous {
    let mut m = Rendezvous::server(now, c, server_route(), Eligibility::BothAnnounced);
    assert!(drain(&mut m).is_empty());
    m
}

/// Feeds bytes; asserts they were all taken.
#[track_caller]
pub(super) fn feed(
    m: &mut Rendezvous,
    now: Instant,
    bytes: &[u8],
    env: &mut FakeEnv,
) -> Vec<Output> {
    let n = m.handle_tcp_bytes(now, bytes, env);
    assert_eq!(n, bytes.len(), "all bytes taken");
    drain(m)
}

pub(super) fn feed_msg(
    m: &mut Rendezvous,
    now: Instant,
    msg: &ClcMessage,
    env: &mut FakeEnv,
) -> Vec<Output> {
    feed(m, now, &msg.to_vec().unwrap(), env)
}

/// A client and a server back to back, with a fake llc for the first link.
pub(super) struct Pair {
    pub now: Instant,
    pub c: Rendezvous,
    pub s: Rendezvous,
    pub cenv: FakeEnv,
    pub senv: FakeEnv,
    pub c_out: Vec<Output>,
    pub s_out: Vec<Output>,
    c2s: Vec<u8>,
    s2c: Vec<u8>,
    /// What the fake llc does once both first links exist.
    pub llc: LlcScript,
}

/// The fake llc's behaviour on the first link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LlcScript {
    /// CONFIRM LINK both ways, then the ADD LINK attempt settles.
    Normal,
    /// Nothing happens (timers decide).
    Silent,
    /// The server's CONFIRM LINK send fails.
    ServerSendFails,
    /// The client's CONFIRM LINK response send fails.
    ClientSendFails,
}

impl Pair {
    pub fn new(ccfg: &ClcConfig, scfg: &ClcConfig) -> Pair {
        Pair::with_envs(
            ccfg,
            scfg,
            FakeEnv::new(CLIENT_HOST),
            FakeEnv::new(SERVER_HOST),
        )
    }

    pub fn with_envs(ccfg: &ClcConfig, scfg: &ClcConfig, cenv: FakeEnv, senv: FakeEnv) -> Pair {
        let now = t0();
        Pair::start(now, ccfg, scfg, client_route(), server_route(), cenv, senv)
    }

    pub fn start(
        now: Instant,
        ccfg: &ClcConfig,
        scfg: &ClcConfig,
        croute: ClientRoute,
        sroute: ServerRoute,
        cenv: FakeEnv,
        senv: FakeEnv,
    ) -> Pair {
        Pair {
            now,
            c: Rendezvous::client(now, ccfg, croute, Eligibility::BothAnnounced),
            s: Rendezvous::server(now, scfg, sroute, Eligibility::BothAnnounced),
            cenv,
            senv,
            c_out: Vec::new(),
            s_out: Vec::new(),
            c2s: Vec::new(),
            s2c: Vec::new(),
            llc: LlcScript::Normal,
        }
    }

    /// Another connection between the same two stacks (link groups kept).
    pub fn next_connection(self, ccfg: &ClcConfig, scfg: &ClcConfig) -> Pair {
        let now = self.now + secs(1.0);
        Pair::start(
            now,
            ccfg,
            scfg,
            client_route(),
            server_route(),
            self.cenv,
            self.senv,
        )
    }

    fn pump(&mut self) -> bool {
        let mut progress = false;
        for o in drain(&mut self.c) {
            match &o {
                Output::Send(m) => self.c2s.extend(m.to_vec().unwrap()),
                Output::ConfirmRkey { .. } => {
                    self.c
                        .handle_rkey_confirmed(self.now, Ok(()), &mut self.cenv);
                }
                _ => {}
            }
            self.c_out.push(o);
            progress = true;
        }
        for o in drain(&mut self.s) {
            match &o {
                Output::Send(m) => self.s2c.extend(m.to_vec().unwrap()),
                Output::ConfirmRkey { .. } => {
                    self.s
                        .handle_rkey_confirmed(self.now, Ok(()), &mut self.senv);
                }
                _ => {}
            }
            self.s_out.push(o);
            progress = true;
        }
        let w = self.s.bytes_wanted().min(self.c2s.len());
        if w > 0 {
            let n = self
                .s
                .handle_tcp_bytes(self.now, &self.c2s[..w], &mut self.senv);
            self.c2s.drain(..n);
            progress |= n > 0;
        }
        let w = self.c.bytes_wanted().min(self.s2c.len());
        if w > 0 {
            let n = self
                .c
                .handle_tcp_bytes(self.now, &self.s2c[..w], &mut self.cenv);
            self.s2c.drain(..n);
            progress |= n > 0;
        }
        progress
    }

    /// Both first links exist and both machines wait for the llc.
    fn llc_ready(&self) -> bool {
        self.senv.started.is_some()
            && self.cenv.lgrs.values().any(|g| g.first_link_started)
            && self.c.outcome().is_none()
            && self.s.outcome().is_none()
            && self.c2s.is_empty()
    }

    fn run_llc(&mut self) {
        let (now, c, s) = (self.now, &mut self.c, &mut self.s);
        match self.llc {
            LlcScript::Normal => {
                s.handle_link_event(now, LinkEvent::ConfirmLinkSent, &mut self.senv);
                c.handle_link_event(now, LinkEvent::FirstLinkUp, &mut self.cenv);
                s.handle_link_event(now, LinkEvent::FirstLinkUp, &mut self.senv);
                s.handle_link_event(now, LinkEvent::PointOfNoReturn, &mut self.senv);
                c.handle_link_event(now, LinkEvent::PointOfNoReturn, &mut self.cenv);
                s.handle_link_event(now, LinkEvent::SecondLinkSettled, &mut self.senv);
                c.handle_link_event(now, LinkEvent::SecondLinkSettled, &mut self.cenv);
            }
            LlcScript::Silent => {}
            LlcScript::ServerSendFails => s.handle_link_event(
                now,
                LinkEvent::Failed {
                    failure: LinkFailure::SendFailed,
                    code: DeclineCode::TIMEOUT_CL,
                },
                &mut self.senv,
            ),
            LlcScript::ClientSendFails => {
                s.handle_link_event(now, LinkEvent::ConfirmLinkSent, &mut self.senv);
                c.handle_link_event(
                    now,
                    LinkEvent::Failed {
                        failure: LinkFailure::SendFailed,
                        code: DeclineCode::TIMEOUT_CL,
                    },
                    &mut self.cenv,
                );
            }
        }
        self.llc = LlcScript::Silent;
    }

    /// Runs until both machines are done, advancing the clock to the next timer when
    /// nothing else can happen. Panics past the configured bound.
    pub fn run(&mut self) -> (Outcome, Outcome) {
        let start = self.now;
        let bound = start + secs(60.0);
        loop {
            while self.pump() {}
            if self.llc_ready() && self.llc != LlcScript::Silent {
                self.run_llc();
                continue;
            }
            if let (Some(c), Some(s)) = (self.c.outcome(), self.s.outcome()) {
                // Unless a side reset, every CLC byte sent was read by the other side.
                if !matches!(c, Outcome::Reset(_)) && !matches!(s, Outcome::Reset(_)) {
                    assert!(
                        self.c2s.is_empty() && self.s2c.is_empty(),
                        "unread CLC bytes"
                    );
                }
                return (c.clone(), s.clone());
            }
            let next = [self.c.poll_timeout(), self.s.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            let Some(next) = next else {
                // A side finished while the other waits for bytes that will never come:
                // the TCP connection is closed (fallback keeps it, but nothing is sent).
                if self.c.outcome().is_some() && matches!(self.c.outcome(), Some(Outcome::Reset(_)))
                {
                    self.s.handle_tcp_closed(self.now, &mut self.senv);
                    continue;
                }
                if matches!(self.s.outcome(), Some(Outcome::Reset(_))) {
                    self.c.handle_tcp_closed(self.now, &mut self.cenv);
                    continue;
                }
                panic!(
                    "stuck: client {:?} server {:?}",
                    self.c.outcome(),
                    self.s.outcome()
                );
            };
            assert!(next <= bound, "rendezvous took too long");
            self.now = self.now.max(next);
            self.c.on_timeout(self.now, &mut self.cenv);
            self.s.on_timeout(self.now, &mut self.senv);
        }
    }

    /// After a successful first contact, the llc would know the peers' link sides.
    pub fn learn(&mut self) {
        if let (Some(Outcome::Smc(c)), Some(Outcome::Smc(s))) = (self.c.outcome(), self.s.outcome())
        {
            let (c, s) = ((**c).clone(), (**s).clone());
            self.cenv.learn_peer(c.lgr, c.peer_link);
            self.senv.learn_peer(s.lgr, s.peer_link);
        }
    }
}
