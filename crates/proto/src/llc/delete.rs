//! Losing and deleting links, and ending the link group (RFC 7609 §2.3, §3.5.4,
//! §3.5.5.1.3/4, C.7.1; CHECKLIST B.8, B.11, B.12, B.16, FO-2).

use std::time::Instant;

use smc_wire::llc::{DeleteLink, DeleteLinkReason, LlcMessage};
use tracing::{debug, info, warn};

use super::{
    Config, Event, LinkDownReason, LinkGroup, LinkId, LinkState, Op, Purpose, Role, Term,
    TerminateReason,
};

/// Server: our DELETE LINK (single link) waiting for the client's response.
#[derive(Clone, Debug)]
pub(super) struct SrvDel {
    pub link: LinkId,
    pub carrying: LinkId,
    pub deadline: Instant,
}

/// Client: our DELETE LINK request waiting for the server's DELETE LINK (CDL-3).
#[derive(Clone, Debug)]
pub(super) struct ClientDelete {
    pub link: LinkId,
    pub carrying: LinkId,
    pub deadline: Instant,
}

impl LinkGroup {
    /// Marks a link down without an event (it never carried anything, or it already got
    /// its `LinkDown`).
    pub(super) fn mark_down(&mut self, link: LinkId) {
        if let Some(l) = self.find_mut(link) {
            l.state = LinkState::Down;
            l.test = None;
        }
    }

    /// A link failed or is out of sync (C.7.1 "treat the link as down"; FO-2). Tells the
    /// runtime, aborts what ran over it, and deletes it with the peer over another link;
    /// with no link left the link group ends.
    pub(super) fn link_failed(&mut self, now: Instant, link: LinkId, reason: LinkDownReason) {
        if self.term == Term::Done {
            return;
        }
        let Some(l) = self.find(link) else { return };
        if l.state == LinkState::Down {
            return;
        }
        if self.first_pending() && link == LinkId::FIRST {
            // C.7: a send failure before link 1 is confirmed → Decline.
            warn!(%link, "first link failed: {reason}");
            let kind = match reason {
                LinkDownReason::SendFailed | LinkDownReason::QpError => {
                    super::FirstLinkFailureKind::SendFailed
                }
                LinkDownReason::ProtocolViolation(_) => super::FirstLinkFailureKind::InvalidMessage,
                _ => super::FirstLinkFailureKind::Other,
            };
            self.first_failed(kind, smc_wire::decline::DeclineCode::TIMEOUT_CL, true);
            return;
        }
        let was_active = l.state == LinkState::Active;
        info!(%link, num = l.num, "link down: {reason}");
        self.mark_down(link);
        if was_active {
            self.emit(Event::LinkDown { link, reason });
        }
        self.abort_rkey_flow(link);
        if self.remote_rkey.as_ref().is_some_and(|r| r.link == link) {
            self.remote_rkey = None;
        }
        self.abort_add(now, link);
        if let Some(Config::SrvDel(d)) = &self.config {
            if d.carrying == link {
                // SDL-6: the deletion is retried over a surviving link below.
                let target = d.link;
                self.config = None;
                self.ops.push_front(Op::DeleteLink {
                    link: target,
                    reason: DeleteLinkReason::LOST_PATH,
                    orderly: false,
                });
            }
        }
        // Client deletions that were carried over this link: the server cannot answer them.
        let lost: Vec<LinkId> = self
            .client_dels
            .iter()
            .filter(|c| c.carrying == link)
            .map(|c| c.link)
            .collect();
        self.client_dels.retain(|c| c.carrying != link);
        for t in lost {
            if t != link {
                self.client_request_delete(now, t, DeleteLinkReason::LOST_PATH, false);
            }
        }
        if let Term::Ending { reason, .. } = self.term {
            if self.active_count() == 0 {
                self.finish(reason);
            }
            return;
        }
        if self.active_count() == 0 {
            warn!("no link left: ending the link group");
            self.finish(TerminateReason::NoLinks(reason));
            return;
        }
        match self.cfg.role {
            Role::Server => {
                let queued = self
                    .ops
                    .iter()
                    .any(|o| matches!(o, Op::DeleteLink { link: x, .. } if *x == link))
                    || matches!(&self.config, Some(Config::SrvDel(d)) if d.link == link);
                if !queued {
                    self.ops.push_front(Op::DeleteLink {
                        link,
                        reason: DeleteLinkReason::LOST_PATH,
                        orderly: false,
                    });
                }
            }
            Role::Client => {
                if !self.client_dels.iter().any(|c| c.link == link) {
                    self.client_request_delete(now, link, DeleteLinkReason::LOST_PATH, false);
                }
            }
        }
    }

    /// Server: DELETE LINK exchange for one link (SDL-3, SDL-4).
    pub(super) fn start_delete_link(
        &mut self,
        now: Instant,
        link: LinkId,
        reason: DeleteLinkReason,
        orderly: bool,
    ) {
        let Some(l) = self.find(link) else { return };
        let num = l.num;
        let was_active = l.state == LinkState::Active;
        let carrying = self
            .links
            .iter()
            .find(|x| x.is_active() && x.id != link)
            .map(|x| x.id);
        let Some(carrying) = carrying else {
            if was_active {
                // Deleting the last link is deleting the link group.
                self.start_terminate(now, TerminateReason::Local(reason), orderly);
            } else {
                self.remove_link(link);
            }
            return;
        };
        if was_active {
            // SDL-2: the connections leave the link (LinkDown) before it goes.
            if let Some(l) = self.find_mut(link) {
                l.state = LinkState::Deleting;
                l.test = None;
            }
            self.emit(Event::LinkDown {
                link,
                reason: LinkDownReason::LocalDelete(reason),
            });
        }
        let m = DeleteLink {
            v2: self.v2(),
            response: false,
            all: false,
            orderly,
            link_num: num,
            reason,
        };
        self.send(carrying, &LlcMessage::DeleteLink(m), Purpose::Plain);
        // C.7: the timer is ours to choose. A client that lost the path itself queues our
        // request behind its own DELETE LINK exchange (§3.5.5.3); Linux 6.12 under load
        // answered after 2.9 s. On the 2 s reply timer the surviving link would be declared
        // unusable too (SDL-6) and every connection aborted, so wait as long as the client
        // waits for ours (CDL-5).
        self.config = Some(Config::SrvDel(SrvDel {
            link,
            carrying,
            deadline: now + self.cfg.timers.delete_link_wait,
        }));
    }

    /// SDL-6: no response; the carrying link is unusable too.
    pub(super) fn delete_timeout(&mut self, now: Instant) {
        let Some(Config::SrvDel(d)) = self.config.take() else {
            return;
        };
        self.remove_link(d.link);
        self.link_failed(now, d.carrying, LinkDownReason::ReplyTimeout("DELETE LINK"));
    }

    /// DELETE LINK request or response, either role.
    pub(super) fn rx_delete_link(&mut self, now: Instant, link: LinkId, m: &DeleteLink) {
        if m.all {
            if m.response {
                // AMB-27: tolerated, nothing to do.
                debug!(%link, "DELETE LINK (all) response ignored");
                if let (Role::Client, Term::Ending { reason, .. }) = (self.cfg.role, self.term) {
                    self.finish(reason);
                }
                return;
            }
            match (self.cfg.role, self.term) {
                (Role::Client, Term::Ending { reason, .. }) => {
                    // LGT-6: the server's answer to our request.
                    self.finish(reason);
                }
                (Role::Client, _) => {
                    // LGT-5: comply at once, no reply.
                    info!("server deleted the link group ({})", m.reason);
                    self.finish(TerminateReason::PeerDeleted(m.reason));
                }
                (Role::Server, Term::Running) => {
                    // LGT-6: send our own DELETE LINK (all), then clean up.
                    info!("client asked to delete the link group ({})", m.reason);
                    self.start_terminate(now, TerminateReason::PeerDeleted(m.reason), m.orderly);
                }
                (Role::Server, _) => {
                    // Both ended at once (§3.5.5.3.2): clean up now.
                    self.finish(TerminateReason::PeerDeleted(m.reason));
                }
            }
            return;
        }
        match (self.cfg.role, m.response) {
            (Role::Server, true) => {
                let done = matches!(&self.config, Some(Config::SrvDel(d))
                    if d.carrying == link && self.num_of(d.link) == m.link_num);
                if done {
                    let Some(Config::SrvDel(d)) = self.config.take() else {
                        return;
                    };
                    debug!(link = %d.link, "DELETE LINK answered");
                    self.remove_link(d.link);
                    if self.active_count() < 2 && m.reason != DeleteLinkReason::NO_ASYM_NEEDED {
                        // C.8: the link group lost its redundancy; try again later.
                        self.add_retry_at = self.cfg.timers.add_link_retry.map(|d| now + d);
                    }
                } else {
                    debug!(%link, "unexpected DELETE LINK response dropped");
                }
            }
            (Role::Server, false) => self.srv_client_delete(now, link, m),
            (Role::Client, false) => self.cli_server_delete(now, link, m),
            (Role::Client, true) => debug!(%link, "DELETE LINK response at the client dropped"),
        }
    }

    /// Server: the client asks to delete one link (CDL-2/3): run our own exchange for it.
    fn srv_client_delete(&mut self, now: Instant, link: LinkId, m: &DeleteLink) {
        let Some(target) = self.by_num(m.link_num) else {
            if self.gone_nums.contains(&m.link_num) {
                // C.7.1: being cleaned up, a timing window.
                debug!(
                    num = m.link_num,
                    "DELETE LINK for a link already gone ignored"
                );
            } else {
                let r = DeleteLink {
                    v2: self.v2(),
                    response: true,
                    all: false,
                    orderly: m.orderly,
                    link_num: m.link_num,
                    reason: DeleteLinkReason::NOLNK,
                };
                self.send(link, &LlcMessage::DeleteLink(r), Purpose::Plain);
            }
            return;
        };
        let busy = self
            .ops
            .iter()
            .any(|o| matches!(o, Op::DeleteLink { link: x, .. } if *x == target))
            || matches!(&self.config, Some(Config::SrvDel(d)) if d.link == target);
        if busy {
            return;
        }
        let was_active = self.is_active(target);
        if was_active {
            self.mark_down(target);
            self.emit(Event::LinkDown {
                link: target,
                reason: LinkDownReason::PeerDeleted(m.reason),
            });
        } else {
            // A link still being added (e.g. the client gave up waiting for CONFIRM LINK).
            self.abort_add(now, target);
            self.mark_down(target);
        }
        self.ops.push_front(Op::DeleteLink {
            link: target,
            reason: m.reason,
            orderly: m.orderly,
        });
    }

    /// Client: the server deletes one link (SDL-5): always answer positively on the link
    /// the request came on, then drop the link once the answer is out.
    fn cli_server_delete(&mut self, now: Instant, link: LinkId, m: &DeleteLink) {
        let mut r = *m;
        r.v2 = self.v2();
        r.response = true;
        let Some(target) = self.by_num(m.link_num) else {
            // C.7.1: unknown link → reply with "no link" (AMB-26).
            r.reason = DeleteLinkReason::NOLNK;
            self.send(link, &LlcMessage::DeleteLink(r), Purpose::Plain);
            return;
        };
        // Linux answers with reason 0.
        r.reason = DeleteLinkReason(0);
        self.client_dels.retain(|c| c.link != target);
        let was_active = self.is_active(target);
        if was_active {
            self.emit(Event::LinkDown {
                link: target,
                reason: LinkDownReason::PeerDeleted(m.reason),
            });
        }
        self.mark_down(target);
        self.abort_rkey_flow(target);
        self.abort_add(now, target);
        if self.remote_rkey.as_ref().is_some_and(|x| x.link == target) {
            self.remote_rkey = None;
        }
        let purpose = if target == link {
            Purpose::DeleteResp(target)
        } else {
            Purpose::Plain
        };
        self.send(link, &LlcMessage::DeleteLink(r), purpose);
        if target != link {
            self.remove_link(target);
        }
        if self.active_count() == 0 {
            self.finish(TerminateReason::NoLinks(LinkDownReason::PeerDeleted(
                m.reason,
            )));
        }
    }

    /// Client: ask the server to delete a link (§3.5.5.1.4), or the link group if it is
    /// the last one.
    pub(super) fn client_request_delete(
        &mut self,
        now: Instant,
        link: LinkId,
        reason: DeleteLinkReason,
        orderly: bool,
    ) {
        let Some(l) = self.find(link) else { return };
        let num = l.num;
        let was_active = l.is_active();
        let carrying = self
            .links
            .iter()
            .find(|x| x.is_active() && x.id != link)
            .map(|x| x.id);
        let Some(carrying) = carrying else {
            if was_active {
                self.start_terminate(now, TerminateReason::Local(reason), orderly);
            } else {
                self.remove_link(link);
            }
            return;
        };
        if was_active {
            self.emit(Event::LinkDown {
                link,
                reason: LinkDownReason::LocalDelete(reason),
            });
        }
        if was_active && orderly {
            // CDL-2: the link still works until the server deletes it; only new work stays
            // off it (the server may still use it to carry its own DELETE LINK).
            if let Some(l) = self.find_mut(link) {
                l.state = LinkState::Deleting;
                l.test = None;
            }
        } else {
            // A failed link, or a disorderly request (CDL-4): treat it as gone, and what
            // ran over it with it.
            self.mark_down(link);
            self.abort_rkey_flow(link);
            if self.remote_rkey.as_ref().is_some_and(|r| r.link == link) {
                self.remote_rkey = None;
            }
        }
        if let Some(l) = self.find_mut(link) {
            l.client_deleting = true;
        }
        let m = DeleteLink {
            v2: self.v2(),
            response: false,
            all: false,
            orderly,
            link_num: num,
            reason,
        };
        self.send(carrying, &LlcMessage::DeleteLink(m), Purpose::Plain);
        self.client_dels.retain(|c| c.link != link);
        self.client_dels.push(ClientDelete {
            link,
            carrying,
            deadline: now + self.cfg.timers.delete_link_wait,
        });
    }

    /// CDL-5: the server did not act on our DELETE LINK; the carrying link is unusable too.
    pub(super) fn client_delete_timeouts(&mut self, now: Instant) {
        while let Some(pos) = self.client_dels.iter().position(|c| c.deadline <= now) {
            let c = self.client_dels.remove(pos);
            self.remove_link(c.link);
            self.link_failed(now, c.carrying, LinkDownReason::ReplyTimeout("DELETE LINK"));
        }
    }

    /// DELETE LINK with A set: the server ends the link group once it went out (LGT-4),
    /// the client waits for the server's (LGT-6). Both give up after the reply timer.
    pub(super) fn start_terminate(&mut self, now: Instant, reason: TerminateReason, orderly: bool) {
        if self.term != Term::Running {
            return;
        }
        let code = match reason {
            TerminateReason::Local(r) | TerminateReason::PeerDeleted(r) => r,
            TerminateReason::Idle => DeleteLinkReason::PROG_INIT_TERM,
            _ => DeleteLinkReason::PROT_VIOL,
        };
        let Some(link) = self.pick_active(None) else {
            self.finish(reason);
            return;
        };
        info!("ending the link group ({code})");
        self.term = Term::Ending {
            deadline: now + self.cfg.timers.reply,
            reason,
            orderly,
        };
        self.send_delete_all(link, code, orderly);
    }

    fn send_delete_all(&mut self, link: LinkId, reason: DeleteLinkReason, orderly: bool) {
        let m = DeleteLink {
            v2: self.v2(),
            response: false,
            all: true,
            orderly,
            link_num: 0,
            reason,
        };
        self.send(link, &LlcMessage::DeleteLink(m), Purpose::DeleteAll);
    }

    /// LGT-7: the DELETE LINK (all) did not go out: try the next link, else give up.
    pub(super) fn delete_all_send_failed(&mut self, _now: Instant, link: LinkId) {
        let Term::Ending {
            reason, orderly, ..
        } = self.term
        else {
            return;
        };
        self.mark_down(link);
        match self.pick_active(None) {
            Some(next) => {
                let code = match reason {
                    TerminateReason::Local(r) | TerminateReason::PeerDeleted(r) => r,
                    TerminateReason::Idle => DeleteLinkReason::PROG_INIT_TERM,
                    _ => DeleteLinkReason::PROT_VIOL,
                };
                self.send_delete_all(next, code, orderly);
            }
            None => self.finish(reason),
        }
    }

    /// Gives up on the link group: a best-effort DELETE LINK (all) so the peer need not
    /// wait for its timers, then [`LinkGroup::finish`].
    pub(super) fn abandon(
        &mut self,
        _now: Instant,
        reason: TerminateReason,
        code: DeleteLinkReason,
    ) {
        if let Some(link) = self.pick_active(None) {
            let m = DeleteLink {
                v2: self.v2(),
                response: false,
                all: true,
                orderly: false,
                link_num: 0,
                reason: code,
            };
            self.send(link, &LlcMessage::DeleteLink(m), Purpose::Plain);
        }
        self.finish(reason);
    }

    /// The link group is gone: every QP goes, then `Terminated`.
    pub(super) fn finish(&mut self, reason: TerminateReason) {
        if self.term == Term::Done {
            return;
        }
        info!("link group terminated: {reason}");
        for l in std::mem::take(&mut self.links) {
            self.out
                .push_back(super::Output::DestroyLink { link: l.id });
        }
        self.config = None;
        self.rkey = None;
        self.remote_rkey = None;
        self.client_dels.clear();
        self.ops.clear();
        self.deferred.clear();
        self.sends.clear();
        self.req_add = None;
        self.add_retry_at = None;
        self.idle_since = None;
        self.rt = Default::default();
        self.first = super::First::Done;
        self.term = Term::Done;
        self.emit(Event::Terminated(reason));
    }

    /// The configuration exchange's timer expired.
    pub(super) fn config_timeout(&mut self, now: Instant) {
        match self.config {
            Some(Config::SrvDel(_)) => self.delete_timeout(now),
            Some(Config::SrvAdd(_)) | Some(Config::CliAdd(_)) => self.add_timeout(now),
            None => {}
        }
    }
}
