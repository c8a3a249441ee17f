//! First contact: confirming link 1 (RFC 7609 §3.5.1.5, C.7; CHECKLIST B.3, B.4) and
//! waiting for the second-link attempt (§3.5.1.6, S11/C8/C9).

use std::time::Instant;

use smc_wire::decline::DeclineCode;
use smc_wire::llc::{ConfirmLink, LlcMessage};
use tracing::{debug, warn};

use super::link::Link;
use super::{
    Config, Event, First, FirstLinkFailure, FirstLinkFailureKind, LinkGroup, LinkId, LinkState, Op,
    Purpose, Role, TerminateReason, Version,
};

impl LinkGroup {
    pub(super) fn start_first(&mut self, now: Instant) {
        match self.cfg.role {
            Role::Server => {
                // The server numbers links from 1 (AMB-34) and confirms the QP over it.
                let uid = self.uid(1);
                if let Some(l) = self.find_mut(LinkId::FIRST) {
                    l.num = 1;
                    l.local_uid = uid;
                }
                let m = self.confirm_link_msg(LinkId::FIRST, false, self.max_links);
                self.send(
                    LinkId::FIRST,
                    &LlcMessage::ConfirmLink(m),
                    Purpose::FirstConfirmReq,
                );
                self.first = First::ServerConfirm {
                    deadline: now + self.cfg.timers.first_confirm_server,
                };
            }
            Role::Client => {
                self.first = First::ClientConfirm {
                    deadline: now + self.cfg.timers.first_confirm_client,
                };
            }
        }
    }

    /// CONFIRM LINK for a link whose QP and number are known (A.3.1; Linux sets flag 0x03
    /// and `max_conns` in its layout).
    pub(super) fn confirm_link_msg(
        &self,
        id: LinkId,
        response: bool,
        max_links: u8,
    ) -> ConfirmLink {
        let l = self.find(id);
        let dev = l.and_then(|l| self.device(l.device));
        let linux = self.cfg.linux_layout();
        ConfirmLink {
            v2: self.v2(),
            response,
            no_rmbe_eyecatcher: linux && !self.cfg.rmbe_eyecatcher,
            mac: dev.map(|d| d.mac).unwrap_or_default(),
            gid: dev.map(|d| d.gid).unwrap_or_default(),
            qpn: l.and_then(|l| l.local).map(|q| q.qpn).unwrap_or_default(),
            link_num: l.map_or(1, |l| l.num.max(1)),
            link_uid: l.map_or(0, |l| l.local_uid),
            max_links,
            max_conns: if linux { self.cfg.max_conns } else { 0 },
        }
    }

    /// Checks a CONFIRM LINK against what we know of the peer's side of the link (C.7.1
    /// "incorrect link information"): GID and QPN, the MAC in v1 (SMC-Rv2 peers are
    /// identified by GID), and the RMBE eye-catcher flag (Linux declines a mismatch with
    /// RMBE_EC).
    pub(super) fn check_confirm(
        &self,
        l: &Link,
        m: &ConfirmLink,
    ) -> Result<(), (&'static str, DeclineCode)> {
        let Some(p) = l.peer else {
            return Err((
                "CONFIRM LINK before the peer's QP is known",
                DeclineCode::CNFERR,
            ));
        };
        if m.gid != p.gid || m.qpn != p.qpn || (self.cfg.version == Version::V1 && m.mac != p.mac) {
            return Err(("CONFIRM LINK names another QP", DeclineCode::CNFERR));
        }
        if self.cfg.linux_layout() && m.no_rmbe_eyecatcher == self.cfg.rmbe_eyecatcher {
            return Err((
                "CONFIRM LINK eye-catcher flag mismatch",
                DeclineCode::RMBE_EC,
            ));
        }
        Ok(())
    }

    /// A CONFIRM LINK request or response arrived.
    pub(super) fn rx_confirm_link(&mut self, now: Instant, link: LinkId, m: &ConfirmLink) {
        match (self.cfg.role, m.response) {
            (Role::Server, true) => {
                if matches!(self.first, First::ServerConfirm { .. }) && link == LinkId::FIRST {
                    self.first_confirm_response(now, m);
                } else if matches!(&self.config, Some(Config::SrvAdd(f)) if f.new == link) {
                    self.srv_confirm_response(now, link, m);
                } else {
                    debug!(%link, "unexpected CONFIRM LINK response dropped");
                }
            }
            (Role::Client, false) => {
                if matches!(self.first, First::ClientConfirm { .. }) && link == LinkId::FIRST {
                    self.first_confirm_request(now, m);
                } else if matches!(&self.config, Some(Config::CliAdd(f)) if f.new == link) {
                    self.cli_confirm_request(now, link, m);
                } else {
                    self.protocol_violation(now, link, "CONFIRM LINK request out of sequence");
                }
            }
            (Role::Server, false) => {
                self.protocol_violation(now, link, "CONFIRM LINK request from the client")
            }
            (Role::Client, true) => debug!(%link, "CONFIRM LINK response at the client dropped"),
        }
    }

    /// Server, first contact: the client's CONFIRM LINK response (S10, CL-4).
    fn first_confirm_response(&mut self, now: Instant, m: &ConfirmLink) {
        let Some(l) = self.find(LinkId::FIRST).cloned() else {
            return;
        };
        let mut err = self.check_confirm(&l, m).err();
        if err.is_none() && m.link_num != l.num {
            err = Some((
                "CONFIRM LINK response for another link",
                DeclineCode::CNFERR,
            ));
        }
        // CL-4: the client's value is optional (0), never above ours, never below the
        // minimum of the version.
        let min = if self.cfg.version == Version::V2 {
            1
        } else {
            2
        };
        let final_max = if m.max_links == 0 {
            self.max_links
        } else {
            m.max_links
        };
        if err.is_none() && (final_max > self.max_links || final_max < min) {
            err = Some((
                "CONFIRM LINK max_links out of range",
                DeclineCode::MAXLINKERR,
            ));
        }
        if let Some((why, code)) = err {
            warn!("first CONFIRM LINK response rejected: {why}");
            // Our CONFIRM LINK went out: no Decline any more (AMB-19), reset.
            self.first_failed(FirstLinkFailureKind::InvalidMessage, code, false);
            return;
        }
        self.max_links = final_max;
        self.confirm_link_sent();
        if let Some(l) = self.find_mut(LinkId::FIRST) {
            l.peer_uid = m.link_uid;
            l.state = LinkState::Active;
            l.last_rx = now;
        }
        self.emit(Event::FirstLinkUp);
        self.after_first_link_up(now);
    }

    /// Client, first contact: the server's CONFIRM LINK request (C6).
    fn first_confirm_request(&mut self, now: Instant, m: &ConfirmLink) {
        let Some(l) = self.find(LinkId::FIRST).cloned() else {
            return;
        };
        let mut err = self.check_confirm(&l, m).err();
        let min = if self.cfg.version == Version::V2 {
            1
        } else {
            2
        };
        if err.is_none() && m.max_links < min {
            err = Some((
                "server max_links below the minimum",
                DeclineCode::MAXLINKERR,
            ));
        }
        if let Some((why, code)) = err {
            warn!("first CONFIRM LINK rejected: {why}");
            // Still before our response: Decline and fall back (C.7.1).
            self.first_failed(FirstLinkFailureKind::InvalidMessage, code, true);
            return;
        }
        self.max_links = self.max_links.min(m.max_links);
        let uid = self.uid(m.link_num);
        if let Some(l) = self.find_mut(LinkId::FIRST) {
            l.num = m.link_num;
            l.local_uid = uid;
            l.peer_uid = m.link_uid;
            l.state = LinkState::Active;
            l.last_rx = now;
        }
        let r = self.confirm_link_msg(LinkId::FIRST, true, self.max_links);
        self.send(
            LinkId::FIRST,
            &LlcMessage::ConfirmLink(r),
            Purpose::FirstConfirmResp,
        );
        self.first = First::ClientRespSent;
    }

    /// Client: our first CONFIRM LINK response went out (C7: no Decline from here on).
    pub(super) fn first_resp_sent(&mut self, now: Instant) {
        if self.first != First::ClientRespSent {
            return;
        }
        self.confirm_link_sent();
        self.emit(Event::FirstLinkUp);
        self.after_first_link_up(now);
    }

    fn after_first_link_up(&mut self, now: Instant) {
        if self.max_links < 2 {
            // v2.1 with max_links 1: no second link (Linux does not wait for one).
            self.first = First::Done;
            self.point_of_no_return();
            self.emit(Event::FirstContactDone);
            return;
        }
        match self.cfg.role {
            Role::Server => {
                // S11: attempt the second link before connection data flows.
                self.first = First::Second { deadline: None };
                self.ops.push_front(Op::AddLink { replace: false });
            }
            Role::Client => {
                // C8: wait (bounded) for the server's ADD LINK.
                let deadline = if self.add_seen {
                    None
                } else {
                    Some(now + self.cfg.timers.add_link_wait)
                };
                self.first = First::Second { deadline };
            }
        }
    }

    /// Emits `FirstContactDone` once the second-link attempt has settled.
    pub(super) fn check_first_done(&mut self) {
        let First::Second { .. } = self.first else {
            return;
        };
        let settled = match self.cfg.role {
            Role::Server => {
                self.config.is_none()
                    && !self
                        .ops
                        .iter()
                        .any(|o| matches!(o, Op::AddLink { .. } | Op::DeleteLink { .. }))
            }
            Role::Client => {
                self.add_seen
                    && self.config.is_none()
                    && self.client_dels.is_empty()
                    && !self.deferred.iter().any(|(_, m)| {
                        m.msg_type() == smc_wire::llc::LlcType::AddLink && !m.is_response()
                    })
            }
        };
        if settled && self.term == super::Term::Running {
            self.first = First::Done;
            self.point_of_no_return();
            self.emit(Event::FirstContactDone);
        }
    }

    pub(super) fn first_timeout(&mut self, now: Instant) {
        match self.first {
            First::ServerConfirm { deadline } | First::ClientConfirm { deadline }
                if deadline <= now =>
            {
                // C.7.1: no CONFIRM LINK (response) in time: reset, clean up the link.
                self.first_failed(
                    FirstLinkFailureKind::Timeout,
                    DeclineCode::TIMEOUT_CL,
                    false,
                );
            }
            First::Second {
                deadline: Some(deadline),
            } if deadline <= now && !self.add_seen => {
                if self.cfg.linux_compat {
                    // Linux clients carry on with one link (H4).
                    debug!("no ADD LINK after first contact: continuing with one link");
                    self.first = First::Done;
                    self.point_of_no_return();
                    self.emit(Event::FirstContactDone);
                } else {
                    // C.7.1 "CONFIRM LINK reply (client, first contact)": reset.
                    warn!("no ADD LINK after first contact: ending the link group");
                    self.abandon(
                        now,
                        TerminateReason::FirstContact(DeclineCode::TIMEOUT_AL),
                        smc_wire::llc::DeleteLinkReason::PROT_VIOL,
                    );
                }
            }
            _ => {}
        }
    }

    /// Our first CONFIRM LINK went out (reported once, before `FirstLinkUp`).
    pub(super) fn confirm_link_sent(&mut self) {
        if !self.confirm_sent && self.first_pending() {
            self.confirm_sent = true;
            self.emit(Event::ConfirmLinkSent);
        }
    }

    /// The C.3 point of no return of first contact (reported once).
    pub(super) fn point_of_no_return(&mut self) {
        if !self.ponr && self.confirm_sent && self.term == super::Term::Running {
            self.ponr = true;
            self.emit(Event::PointOfNoReturn);
        }
    }

    /// First contact failed before link 1 was confirmed.
    pub(super) fn first_failed(
        &mut self,
        kind: FirstLinkFailureKind,
        code: DeclineCode,
        may_decline: bool,
    ) {
        // C.2 / AMB-19: never a Decline after our own CONFIRM LINK went out.
        let may_decline = may_decline && !self.confirm_sent;
        self.emit(Event::FirstLinkFailed(FirstLinkFailure {
            kind,
            code,
            may_decline,
        }));
        self.first = First::Done;
        self.finish(TerminateReason::FirstContact(code));
    }

    /// Whether link 1 is still being confirmed.
    pub(super) fn first_pending(&self) -> bool {
        matches!(
            self.first,
            First::ServerConfirm { .. } | First::ClientConfirm { .. } | First::ClientRespSent
        )
    }
}
