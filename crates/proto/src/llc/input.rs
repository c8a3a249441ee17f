//! Inputs from the runtime: received LLC messages, send completions, the QP life cycle,
//! RMBs, devices, idleness and termination requests.

use super::*;

impl LinkGroup {
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
}
