//! Carrying out a link group's llc outputs, and what its events mean for rendezvous and
//! connections (docs/llc.md, RFC 7609 §3.5, §4.6, §4.8.3).

use std::time::Instant;

use smc_wire::decline::DeclineCode;
use tracing::{debug, info, warn};

use super::rendezvous::Note;
use super::{first_contact_settled, Endpoint, Host, Output, TcpId};
use crate::clc::{LgrId, LinkEvent, LinkFailure};
use crate::conn::AbortReason;
use crate::llc::{self, RToken};

impl Endpoint {
    /// Runs a link group's llc outputs until there are none.
    pub(super) fn process_lgr(&mut self, now: Instant, host: &mut dyn Host, id: LgrId) {
        loop {
            let Some(g) = self.lgrs.get_mut(&id) else {
                return;
            };
            let Some(out) = g.llc.as_mut().and_then(|l| l.poll_output()) else {
                break;
            };
            match out {
                llc::Output::Send(t) => match t.msg.encode(g.llc_cfg.format) {
                    Ok(bytes) => self.out.push_back(Output::LlcSend {
                        lgr: id,
                        link: t.link,
                        id: t.id,
                        bytes,
                    }),
                    Err(e) => {
                        warn!(error = %e, "LLC message does not encode");
                        if let Some(l) = g.llc.as_mut() {
                            l.on_send_complete(now, t.link, t.id, false);
                        }
                    }
                },
                llc::Output::CreateLink { link, device } => {
                    let qp = host.create_link(id, link, device);
                    let Some(g) = self.lgrs.get_mut(&id) else {
                        return;
                    };
                    let qp = match qp {
                        Ok(qp) => qp,
                        Err(e) => {
                            warn!(error = %e, "cannot create a QP for a new link");
                            if let Some(l) = g.llc.as_mut() {
                                l.on_link_setup_failed(now, link);
                            }
                            continue;
                        }
                    };
                    g.links.insert(link, qp);
                    // Every local RMB gets an RToken on the new link (§3.5.5.2.3).
                    let rmbs: Vec<llc::RmbId> = g
                        .llc
                        .as_ref()
                        .map(|l| l.local_rmbs().collect())
                        .unwrap_or_default();
                    let mut tokens: Vec<(llc::RmbId, RToken)> = Vec::new();
                    let mut ok = true;
                    for rid in rmbs {
                        match host.register_rmb(id, rid, link) {
                            Ok(t) => {
                                if let Some(r) = g.rmbs.get_mut(&rid.0) {
                                    r.tokens.insert(link, t);
                                }
                                tokens.push((rid, t));
                            }
                            Err(e) => {
                                warn!(error = %e, "RMB registration on a new link failed");
                                ok = false;
                            }
                        }
                    }
                    if let Some(l) = g.llc.as_mut() {
                        if ok {
                            if let Err(e) = l.on_link_created(now, link, qp, &tokens) {
                                debug!(error = %e, "link creation not taken");
                            }
                        } else {
                            l.on_link_setup_failed(now, link);
                        }
                    }
                }
                llc::Output::ConnectLink { link, peer } => {
                    let r = host.connect_link(id, link, &peer);
                    if let Some(l) = self.lgrs.get_mut(&id).and_then(|g| g.llc.as_mut()) {
                        match r {
                            Ok(()) => {
                                if let Err(e) = l.on_link_connected(now, link) {
                                    debug!(error = %e, "link connect not taken");
                                }
                            }
                            Err(e) => {
                                debug!(error = %e, "cannot connect a new link's QP");
                                l.on_link_setup_failed(now, link);
                            }
                        }
                    }
                }
                llc::Output::DestroyLink { link } => {
                    if g.links.remove(&link).is_some() {
                        debug!(lgr = id.0, %link, "link destroyed");
                        for r in g.rmbs.values_mut() {
                            r.tokens.remove(&link);
                        }
                        host.destroy_link(id, link);
                    }
                }
                llc::Output::Event(e) => self.on_llc_event(host, id, e),
            }
        }
        self.finish_lgr_if_gone(host, id);
    }

    fn note(&mut self, tcp: Option<TcpId>, n: Note) {
        if let Some(t) = tcp {
            self.notes.push_back((t, n));
        }
    }

    fn on_llc_event(&mut self, host: &mut dyn Host, id: LgrId, e: llc::Event) {
        let Some(g) = self.lgrs.get_mut(&id) else {
            return;
        };
        let first = if g.first_done { None } else { g.first_rdv };
        match e {
            llc::Event::ConfirmLinkSent => self.note(first, Note::Link(LinkEvent::ConfirmLinkSent)),
            llc::Event::FirstLinkUp => {
                info!(lgr = id.0, "first link up");
                self.note(first, Note::Link(LinkEvent::FirstLinkUp))
            }
            llc::Event::PointOfNoReturn => self.note(first, Note::Link(LinkEvent::PointOfNoReturn)),
            llc::Event::FirstContactDone => {
                g.first_done = true;
                let pending = g.counted_pending.take();
                first_contact_settled(&mut self.server_first_pending, pending);
                self.note(first, Note::Link(LinkEvent::SecondLinkSettled));
            }
            llc::Event::FirstLinkFailed(f) => {
                let failure = match f.kind {
                    llc::FirstLinkFailureKind::SendFailed => LinkFailure::SendFailed,
                    llc::FirstLinkFailureKind::InvalidMessage => LinkFailure::InvalidMessage,
                    llc::FirstLinkFailureKind::Timeout => LinkFailure::Timeout,
                    llc::FirstLinkFailureKind::Other => LinkFailure::Other,
                };
                self.note(
                    first,
                    Note::Link(LinkEvent::Failed {
                        failure,
                        code: f.code,
                    }),
                );
            }
            llc::Event::LinkUp(l) => info!(lgr = id.0, link = %l, "link up"),
            llc::Event::LinkDown { link, reason } => {
                warn!(lgr = id.0, %link, %reason, "link down");
                self.counters.links_failed += 1;
                // §4.6: its connections move to a surviving link; without one they end
                // (§4.8.3).
                self.fail_over_link(id, link);
            }
            llc::Event::RmbConfirmed(r) => {
                if let Some(rmb) = g.rmbs.get_mut(&r.0) {
                    rmb.announced = true;
                }
                let w = g.rkey_waiters.remove(&r.0);
                self.note(w, Note::Rkey(Ok(())));
            }
            llc::Event::RmbConfirmFailed { rmb, retry } => {
                debug!(lgr = id.0, ?rmb, retry, "CONFIRM RKEY failed");
                let w = g.rkey_waiters.remove(&rmb.0);
                self.note(w, Note::Rkey(Err(DeclineCode::ERR_RTOK)));
            }
            llc::Event::RmbDeleted(r) => {
                if g.rmbs.get(&r.0).is_some_and(|x| !x.in_use) {
                    g.rmbs.remove(&r.0);
                    host.free_rmb(id, r);
                    self.counters.rmbs_deleted += 1;
                }
            }
            llc::Event::PeerRmbAdded { .. }
            | llc::Event::PeerRmbToken { .. }
            | llc::Event::PeerRmbDeleted(_) => {}
            llc::Event::Terminated(reason) => {
                info!(lgr = id.0, %reason, "link group terminated");
                g.terminated = true;
                self.counters.lgrs_ended += 1;
                let was_pending = g.counted_pending.take();
                let first_open = !g.first_done;
                g.first_done = true;
                let waiters: Vec<TcpId> = g.rkey_waiters.drain().map(|(_, t)| t).collect();
                first_contact_settled(&mut self.server_first_pending, was_pending);
                if first_open {
                    // A Terminated before FirstContactDone resets the first connection
                    // (docs/llc.md); the machine ignores it after a FirstLinkFailed.
                    self.note(
                        first,
                        Note::Link(LinkEvent::Failed {
                            failure: LinkFailure::Other,
                            code: DeclineCode::INTERR,
                        }),
                    );
                }
                for t in waiters {
                    self.notes
                        .push_back((t, Note::Rkey(Err(DeclineCode::ERR_RTOK))));
                }
                self.kill_conns(id, AbortReason::LinkLost);
            }
        }
    }
}
