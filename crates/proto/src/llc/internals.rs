//! Internals shared by the flows: link lookup, sending, the queue of local operations
//! (RFC 7609 §3.5.5.3: one configuration change at a time) and message dispatch.

use super::*;

impl LinkGroup {
    pub(super) fn alive(&self) -> Result<(), ApiError> {
        if self.term == Term::Done {
            Err(ApiError::Terminated)
        } else {
            Ok(())
        }
    }

    pub(super) fn find(&self, id: LinkId) -> Option<&Link> {
        self.links.iter().find(|l| l.id == id)
    }

    pub(super) fn find_mut(&mut self, id: LinkId) -> Option<&mut Link> {
        self.links.iter_mut().find(|l| l.id == id)
    }

    pub(super) fn by_num(&self, num: u8) -> Option<LinkId> {
        self.links
            .iter()
            .find(|l| l.num == num && num != 0)
            .map(|l| l.id)
    }

    pub(super) fn num_of(&self, id: LinkId) -> u8 {
        self.find(id).map_or(0, |l| l.num)
    }

    pub(super) fn is_active(&self, id: LinkId) -> bool {
        self.find(id).is_some_and(Link::is_active)
    }

    /// An active link, preferring one other than `avoid`.
    pub(super) fn pick_active(&self, avoid: Option<LinkId>) -> Option<LinkId> {
        self.links
            .iter()
            .find(|l| l.is_active() && Some(l.id) != avoid)
            .or_else(|| self.links.iter().find(|l| l.is_active()))
            .map(|l| l.id)
    }

    pub(super) fn active_count(&self) -> usize {
        self.links.iter().filter(|l| l.is_active()).count()
    }

    pub(super) fn device(&self, id: DeviceId) -> Option<Device> {
        self.devices.iter().find(|d| d.id == id).copied()
    }

    pub(super) fn v2(&self) -> bool {
        self.cfg.version == Version::V2
    }

    pub(super) fn new_link_id(&mut self) -> LinkId {
        let id = LinkId(self.next_link_id);
        self.next_link_id = self.next_link_id.wrapping_add(1).max(1);
        id
    }

    pub(super) fn uid(&self, num: u8) -> u32 {
        (self.cfg.lgr_id << 8) | u32::from(num)
    }

    pub(super) fn touch(&mut self, now: Instant, link: LinkId) {
        if let Some(l) = self.find_mut(link) {
            if now > l.last_rx {
                l.last_rx = now;
            }
        }
    }

    pub(super) fn emit(&mut self, e: Event) {
        debug!(event = ?e, "llc event");
        self.out.push_back(Output::Event(e));
    }

    pub(super) fn send(&mut self, link: LinkId, msg: &LlcMessage<'_>, purpose: Purpose) -> SendId {
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
    pub(super) fn remove_link(&mut self, id: LinkId) {
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
    pub(super) fn pump(&mut self, now: Instant) {
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
    pub(super) fn start_op(&mut self, now: Instant) -> bool {
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

    pub(super) fn queue_add_link(&mut self, replace: bool) {
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
    pub(super) fn must_defer(&self, msg: &LlcMessage<'_>) -> bool {
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
    pub(super) fn dispatch(&mut self, now: Instant, link: LinkId, msg: &LlcMessage<'_>) {
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

    pub(super) fn protocol_violation(&mut self, now: Instant, link: LinkId, what: &'static str) {
        warn!(%link, "LLC protocol violation: {what}");
        self.link_failed(now, link, LinkDownReason::ProtocolViolation(what));
    }
}

impl Config {
    pub(super) fn deadline(&self) -> Option<Instant> {
        match self {
            Config::SrvAdd(f) => f.deadline,
            Config::CliAdd(f) => f.deadline,
            Config::SrvDel(f) => Some(f.deadline),
        }
    }
}
