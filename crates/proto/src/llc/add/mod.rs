//! Adding a link: ADD LINK, ADD LINK CONTINUATION / the v2 extension, CONFIRM LINK on the
//! new link, both roles (RFC 7609 §3.5.1.6, §3.5.5.1.1/2, §3.5.5.2.3, C.7.1, C.8;
//! CHECKLIST B.5, B.9, B.10, B.13.3), and the client's invitations (ADD LINK "FYI" in v1,
//! REQUEST ADD LINK in v2).

use std::time::Instant;

use smc_wire::common::{Gid, QpMtu};
use smc_wire::llc::{
    AddLink, AddLinkCont, AddLinkRtoken, AddLinkV2Ext, ConfirmLink, DeleteLinkReason, LlcMessage,
    ReqAddLink, RtokenList, ADD_LINK_RSN_INVALID_MTU, ADD_LINK_RSN_NO_ALT_PATH,
};
use tracing::{debug, info, warn};

use super::link::{Link, LinkState, PeerQp};
use super::{
    Config, Device, DeviceId, Event, First, LinkDownReason, LinkGroup, LinkId, LlcOut, Op, Purpose,
    Role, TerminateReason,
};

/// Server side of an ADD LINK exchange.
#[derive(Clone, Debug)]
pub(super) struct SrvAdd {
    pub new: LinkId,
    pub carrying: LinkId,
    pub stage: SrvStage,
    pub deadline: Option<Instant>,
    pub first_contact: bool,
}

#[derive(Clone, Debug)]
pub(super) enum SrvStage {
    /// Waiting for the runtime to create the QP.
    Creating,
    /// ADD LINK sent.
    AwaitResponse,
    /// Waiting for the runtime to connect the QP; the client's v2 rtokens.
    Connecting { rtokens: Vec<AddLinkRtoken> },
    /// ADD LINK CONTINUATION sent; `mine` still to send, `peer_last` the client's last count.
    Cont {
        mine: Vec<AddLinkRtoken>,
        peer_last: Option<u8>,
    },
    /// CONFIRM LINK sent on the new link.
    AwaitConfirm,
}

/// Client side of an ADD LINK exchange.
#[derive(Clone, Debug)]
pub(super) struct CliAdd {
    pub new: LinkId,
    pub carrying: LinkId,
    pub stage: CliStage,
    pub deadline: Option<Instant>,
    pub first_contact: bool,
    /// The server's request (echoed back by a reject, as Linux does).
    pub req: LlcOut,
}

#[derive(Clone, Debug)]
pub(super) enum CliStage {
    Creating,
    Connecting,
    /// Waiting for the server's next ADD LINK CONTINUATION.
    Cont {
        mine: Vec<AddLinkRtoken>,
        srv_last: Option<u8>,
    },
    /// Waiting for CONFIRM LINK on the new link.
    AwaitConfirm,
}

/// Next value of a NumRTokens countdown (B.13.3 ALC-A6): remaining − 2 while pairs are
/// left, then 0 (empty messages).
fn next_count(prev: Option<u8>, got: u8) -> bool {
    match prev {
        None => true,
        Some(p) => got == p.saturating_sub(2),
    }
}

mod client;
mod server;

impl LinkGroup {
    // ----------------------------------------------------------------------------------
    // Timers and failures

    /// The ADD LINK exchange's timer expired (C.7.1, B.15).
    pub(in crate::llc) fn add_timeout(&mut self, now: Instant) {
        match self.config.clone() {
            Some(Config::SrvAdd(f)) => match f.stage {
                SrvStage::AwaitResponse | SrvStage::Cont { .. } => {
                    if f.first_contact && !self.cfg.linux_compat {
                        // "ADD LINK from server (first contact)": reset.
                        self.config = None;
                        self.abandon(
                            now,
                            TerminateReason::FirstContact(
                                smc_wire::decline::DeclineCode::TIMEOUT_AL,
                            ),
                            DeleteLinkReason::LOST_PATH,
                        );
                    } else {
                        self.srv_add_failed(now, !self.cfg.linux_compat);
                    }
                }
                SrvStage::AwaitConfirm => {
                    // SL-S10/SL-S11: DELETE LINK for the new link, retry later.
                    self.config = None;
                    self.mark_down(f.new);
                    self.ops.push_front(Op::DeleteLink {
                        link: f.new,
                        reason: DeleteLinkReason::LOST_PATH,
                        orderly: false,
                    });
                    self.arm_add_retry(now);
                }
                SrvStage::Creating | SrvStage::Connecting { .. } => {}
            },
            Some(Config::CliAdd(f)) => match f.stage {
                CliStage::Cont { .. } => {
                    self.config = None;
                    if f.first_contact && !self.cfg.linux_compat {
                        self.abandon(
                            now,
                            TerminateReason::FirstContact(
                                smc_wire::decline::DeclineCode::TIMEOUT_AL,
                            ),
                            DeleteLinkReason::LOST_PATH,
                        );
                    } else if self.cfg.linux_compat {
                        self.client_request_delete(now, f.new, DeleteLinkReason::LOST_PATH, false);
                    } else {
                        self.remove_link(f.new);
                        self.link_failed(
                            now,
                            f.carrying,
                            LinkDownReason::ReplyTimeout("ADD LINK CONTINUATION"),
                        );
                    }
                }
                CliStage::AwaitConfirm => {
                    // SL-C8: DELETE LINK for the new link; first contact opens only after the
                    // server's DELETE LINK for it (client_dels keeps FirstContactDone back).
                    self.config = None;
                    self.client_request_delete(now, f.new, DeleteLinkReason::LOST_PATH, false);
                }
                CliStage::Creating | CliStage::Connecting => {}
            },
            _ => {}
        }
    }

    /// A link involved in the ADD LINK exchange failed.
    pub(in crate::llc) fn abort_add(&mut self, now: Instant, failed: LinkId) {
        match self.config.clone() {
            Some(Config::SrvAdd(f)) if f.carrying == failed => {
                self.config = None;
                self.remove_link(f.new);
                self.arm_add_retry(now);
            }
            Some(Config::SrvAdd(f)) if f.new == failed => {
                // The generic failure path deletes it with the client.
                self.config = None;
                self.arm_add_retry(now);
            }
            Some(Config::CliAdd(f)) if f.carrying == failed => {
                self.config = None;
                self.remove_link(f.new);
            }
            Some(Config::CliAdd(f)) if f.new == failed => {
                self.config = None;
            }
            _ => {}
        }
    }
}
