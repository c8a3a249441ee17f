//! Adding a link, server side: ADD LINK on a free device pair, the rtoken exchange
//! (ADD LINK CONTINUATION or the v2 extension) and CONFIRM LINK on the new link
//! (RFC 7609 §3.5.5.1.1, §3.5.5.2.3).

use super::*;

impl LinkGroup {
    /// Which device a new link would use, if the link group may grow (SL-S1, CL-5, CL-6).
    /// With `replace` (the client announced a new RNIC), a device used only by the
    /// asymmetric link counts as free: the new link replaces it (INV-9).
    pub(in crate::llc) fn choose_add_device(&self, replace: bool) -> Option<(DeviceId, bool)> {
        let alive: Vec<&Link> = self.links.iter().filter(|l| l.is_alive()).collect();
        let sym = alive.iter().filter(|l| !l.asym).count();
        let asym = alive.len() - sym;
        if sym >= usize::from(self.max_links) {
            return None;
        }
        let unused = |only_sym: bool| {
            self.devices.iter().find(|d| {
                !alive
                    .iter()
                    .any(|l| l.device == d.id && (!only_sym || !l.asym))
            })
        };
        if let Some(d) = unused(false).or_else(|| unused(true).filter(|_| replace)) {
            return Some((d.id, false));
        }
        // Only one device: an asymmetric attempt on it, in case the client has a second
        // one (§3.5.1.6); at most one asymmetric link (§2.2.2).
        if asym == 0 && alive.len() == 1 {
            return Some((alive[0].device, true));
        }
        None
    }

    pub(in crate::llc) fn alloc_num(&mut self) -> Option<u8> {
        // §2.2.4: unique, not reused until the space is exhausted.
        for _ in 0..255 {
            let n = self.next_link_num;
            self.next_link_num = if n == 255 { 1 } else { n + 1 };
            if self.by_num(n).is_none() {
                return Some(n);
            }
        }
        None
    }

    /// Server: start an ADD LINK exchange if the link group may and can grow.
    pub(in crate::llc) fn start_add_link(&mut self, now: Instant, replace: bool) {
        if self.cfg.role != Role::Server {
            return;
        }
        let Some(carrying) = self.pick_active(None) else {
            return;
        };
        let Some((device, asym)) = self.choose_add_device(replace) else {
            debug!("no link to add");
            return;
        };
        let Some(num) = self.alloc_num() else { return };
        let id = self.new_link_id();
        let mut l = Link::new(id, num, device, now);
        l.asym = asym;
        l.local_uid = self.uid(num);
        self.links.push(l);
        self.add_retry_at = None;
        info!(%id, num, ?device, asym, "adding a link");
        self.out
            .push_back(crate::llc::Output::CreateLink { link: id, device });
        self.config = Some(Config::SrvAdd(SrvAdd {
            new: id,
            carrying,
            stage: SrvStage::Creating,
            deadline: None,
            first_contact: matches!(self.first, First::Second { .. }),
        }));
    }

    /// The RToken pairs of our RMBs for a new link: (RKey on `carrying`, RKey and VA on
    /// `new`) — §3.5.5.2.3.
    pub(in crate::llc) fn rtoken_pairs(&self, carrying: LinkId, new: LinkId) -> Vec<AddLinkRtoken> {
        self.rt
            .known_local()
            .filter_map(|(_, r)| {
                let old = r.tokens.get(&carrying)?;
                let n = r.tokens.get(&new)?;
                Some(AddLinkRtoken {
                    rmb_key: old.rkey,
                    rmb_key_new: n.rkey,
                    rmb_vaddr_new: n.vaddr,
                })
            })
            .take(255)
            .collect()
    }

    pub(in crate::llc) fn add_link_msg(
        &self,
        new: LinkId,
        carrying: LinkId,
        response: bool,
    ) -> Option<LlcOut> {
        let l = self.find(new)?;
        let dev = self.device(l.device)?;
        let qp = l.local?;
        let mtu = match (response, l.peer) {
            (true, Some(p)) => p.mtu.min(qp.mtu),
            _ => qp.mtu,
        };
        let pairs = if self.v2() {
            self.rtoken_pairs(carrying, new)
        } else {
            Vec::new()
        };
        let m = AddLink {
            v2: self.v2(),
            response,
            reject: false,
            reject_reason: 0,
            mac: dev.mac,
            gid: dev.gid,
            qpn: qp.qpn,
            link_num: l.num,
            qp_mtu: mtu.code(),
            psn: qp.psn,
            ext: self.v2().then_some(AddLinkV2Ext {
                v2_direct: self.cfg.v2_direct,
                client_target_gid: dev.gid,
                rtokens: RtokenList::Slice(&pairs),
            }),
        };
        Some(LlcOut::new(&LlcMessage::AddLink(m)))
    }

    /// The runtime created a new link's QP.
    pub(in crate::llc) fn link_created(&mut self, now: Instant, link: LinkId) {
        match self.config.clone() {
            Some(Config::SrvAdd(mut f)) if f.new == link => {
                let Some(m) = self.add_link_msg(link, f.carrying, false) else {
                    self.srv_add_failed(now, false);
                    return;
                };
                let p = if f.first_contact {
                    Purpose::SecondLinkMilestone
                } else {
                    Purpose::Plain
                };
                self.send(f.carrying, &m.as_wire(), p);
                f.stage = SrvStage::AwaitResponse;
                f.deadline = Some(now + self.cfg.timers.reply);
                self.config = Some(Config::SrvAdd(f));
            }
            Some(Config::CliAdd(mut f)) if f.new == link => {
                let Some(l) = self.find_mut(link) else { return };
                let (Some(qp), Some(mut peer)) = (l.local, l.peer) else {
                    return;
                };
                peer.mtu = peer.mtu.min(qp.mtu);
                l.peer = Some(peer);
                l.state = LinkState::Connecting;
                self.out
                    .push_back(crate::llc::Output::ConnectLink { link, peer });
                f.stage = CliStage::Connecting;
                self.config = Some(Config::CliAdd(f));
            }
            _ => debug!(%link, "link created outside an ADD LINK exchange"),
        }
    }

    /// The runtime connected a new link's QP.
    pub(in crate::llc) fn link_connected(&mut self, now: Instant, link: LinkId) {
        match self.config.clone() {
            Some(Config::SrvAdd(mut f)) if f.new == link => {
                let SrvStage::Connecting { rtokens } = &f.stage else {
                    return;
                };
                if let Some(l) = self.find_mut(link) {
                    l.state = LinkState::Confirming;
                }
                let rtokens = rtokens.clone();
                self.apply_pairs(f.carrying, link, &rtokens, false);
                if self.v2() {
                    self.srv_confirm_new(now, f);
                } else {
                    let mine = self.rtoken_pairs(f.carrying, link);
                    f.stage = SrvStage::Cont {
                        mine,
                        peer_last: None,
                    };
                    self.srv_send_cont(now, f);
                }
            }
            Some(Config::CliAdd(mut f)) if f.new == link => {
                if let Some(l) = self.find_mut(link) {
                    l.state = LinkState::Confirming;
                }
                let Some(m) = self.add_link_msg(link, f.carrying, true) else {
                    return;
                };
                let p = if f.first_contact {
                    Purpose::SecondLinkMilestone
                } else {
                    Purpose::Plain
                };
                self.send(f.carrying, &m.as_wire(), p);
                if self.v2() {
                    f.stage = CliStage::AwaitConfirm;
                    f.deadline = Some(now + self.cfg.timers.new_link_confirm);
                } else {
                    // The server starts the CONTINUATION exchange (A.3.3).
                    f.stage = CliStage::Cont {
                        mine: self.rtoken_pairs(f.carrying, link),
                        srv_last: None,
                    };
                    f.deadline = Some(now + self.cfg.timers.reply);
                }
                self.config = Some(Config::CliAdd(f));
            }
            _ => debug!(%link, "link connected outside an ADD LINK exchange"),
        }
    }

    /// Creating or connecting the new link's QP failed.
    pub(in crate::llc) fn link_setup_failed(&mut self, now: Instant, link: LinkId) {
        match self.config.clone() {
            Some(Config::SrvAdd(f)) if f.new == link => {
                if matches!(f.stage, SrvStage::Creating) {
                    self.srv_add_failed(now, false);
                } else {
                    // The client set its side up already: delete it properly.
                    self.config = None;
                    self.mark_down(link);
                    self.ops.push_front(Op::DeleteLink {
                        link,
                        reason: DeleteLinkReason::LOST_PATH,
                        orderly: false,
                    });
                    self.arm_add_retry(now);
                }
            }
            Some(Config::CliAdd(f)) if f.new == link => {
                // SL-C5 failed: reject (Linux: the echo with reason "no alternate path").
                self.config = None;
                self.remove_link(link);
                let req = f.req.clone();
                if let LlcMessage::AddLink(r) = req.as_wire() {
                    self.cli_reject(f.carrying, &r, ADD_LINK_RSN_NO_ALT_PATH);
                }
            }
            _ => {}
        }
    }

    pub(in crate::llc) fn arm_add_retry(&mut self, now: Instant) {
        if self.cfg.role == Role::Server {
            self.add_retry_at = self.cfg.timers.add_link_retry.map(|d| now + d);
        }
    }

    /// The server's attempt ended without a link; `carrying_failed`: C.7.1 says the
    /// carrying link failed too.
    pub(in crate::llc) fn srv_add_failed(&mut self, now: Instant, carrying_failed: bool) {
        let Some(Config::SrvAdd(f)) = self.config.take() else {
            return;
        };
        self.remove_link(f.new);
        self.arm_add_retry(now);
        if carrying_failed {
            self.link_failed(now, f.carrying, LinkDownReason::ReplyTimeout("ADD LINK"));
        }
    }

    pub(in crate::llc) fn srv_send_cont(&mut self, now: Instant, mut f: SrvAdd) {
        let SrvStage::Cont { mine, .. } = &mut f.stage else {
            return;
        };
        let num = mine.len().min(255) as u8;
        let mut rtokens = [AddLinkRtoken::default(); 2];
        let n = mine.len().min(2);
        rtokens[..n].copy_from_slice(&mine[..n]);
        mine.drain(..n);
        let m = AddLinkCont {
            response: false,
            link_num: self.num_of(f.new),
            num_rkeys: num,
            rtokens,
        };
        self.send(f.carrying, &LlcMessage::AddLinkCont(m), Purpose::Plain);
        f.deadline = Some(now + self.cfg.timers.reply);
        self.config = Some(Config::SrvAdd(f));
    }

    pub(in crate::llc) fn srv_confirm_new(&mut self, now: Instant, mut f: SrvAdd) {
        let m = self.confirm_link_msg(f.new, false, self.max_links);
        self.send(f.new, &LlcMessage::ConfirmLink(m), Purpose::Plain);
        f.stage = SrvStage::AwaitConfirm;
        f.deadline = Some(now + self.cfg.timers.new_link_confirm);
        self.config = Some(Config::SrvAdd(f));
    }

    /// Records the peer's RToken pairs for a new link. Unknown reference RKeys are a
    /// protocol error in v1 (ALC-A6); Linux ignores them (`smc_rtoken_set`), and so do we
    /// for v2.
    pub(in crate::llc) fn apply_pairs(
        &mut self,
        carrying: LinkId,
        new: LinkId,
        pairs: &[AddLinkRtoken],
        strict: bool,
    ) -> bool {
        for p in pairs {
            match self.rt.find_peer(carrying, p.rmb_key) {
                Some(id) => {
                    let token = crate::llc::RToken {
                        rkey: p.rmb_key_new,
                        vaddr: p.rmb_vaddr_new,
                    };
                    if let Some(r) = self.rt.peer.get_mut(&id) {
                        r.tokens.insert(new, token);
                    }
                    self.emit(Event::PeerRmbToken {
                        rmb: id,
                        link: new,
                        token,
                    });
                }
                None if strict => return false,
                None => debug!(rkey = p.rmb_key, "RToken pair for an unknown RMB ignored"),
            }
        }
        true
    }

    /// ALC-A7: every peer RMB has an RToken on the new link.
    pub(in crate::llc) fn new_link_complete(&self, new: LinkId) -> bool {
        let missing = self
            .rt
            .peer
            .values()
            .filter(|p| !p.tokens.contains_key(&new))
            .count();
        if missing > 0 {
            if self.cfg.linux_compat {
                warn!(%new, missing, "peer RMBs without an RToken on the new link");
                return true;
            }
            return false;
        }
        true
    }

    /// ADD LINK request or response.
    pub(in crate::llc) fn rx_add_link(&mut self, now: Instant, link: LinkId, m: &AddLink<'_>) {
        match (self.cfg.role, m.response) {
            (Role::Server, true) => self.srv_add_response(now, link, m),
            (Role::Server, false) => self.srv_client_add_link(now),
            (Role::Client, false) => self.cli_add_link(now, link, m),
            (Role::Client, true) => debug!(%link, "ADD LINK response at the client dropped"),
        }
    }

    /// Server: the client's answer to our ADD LINK (SL-S5..SL-S7).
    pub(in crate::llc) fn srv_add_response(&mut self, now: Instant, link: LinkId, m: &AddLink<'_>) {
        let Some(Config::SrvAdd(mut f)) = self.config.clone() else {
            debug!(%link, "unexpected ADD LINK response dropped");
            return;
        };
        if f.carrying != link || !matches!(f.stage, SrvStage::AwaitResponse) {
            debug!(%link, "ADD LINK response out of sequence dropped");
            return;
        }
        if f.first_contact {
            self.point_of_no_return();
        }
        if m.reject {
            info!(reason = m.reject_reason, "the client rejected the new link");
            self.srv_add_failed(now, false);
            return;
        }
        let new_num = self.num_of(f.new);
        let mtu = QpMtu::from_code(m.qp_mtu);
        let (Ok(mtu), true) = (mtu, m.link_num == new_num) else {
            self.srv_add_failed(now, false);
            self.protocol_violation(now, link, "ADD LINK response for another link or bad MTU");
            return;
        };
        let v1 = !self.v2();
        let same_peer = |l: &Link| {
            l.id != f.new
                && l.is_alive()
                && l.peer
                    .is_some_and(|p| p.gid == m.gid && (!v1 || p.mac == m.mac))
        };
        let new_dev = self.find(f.new).map(|l| l.device);
        // C.7.1: a parallel link (same RNIC on both sides as an existing link) is not
        // allowed: delete it over another link.
        let parallel = self
            .links
            .iter()
            .any(|l| same_peer(l) && Some(l.device) == new_dev);
        // Sharing the client's RNIC with the asymmetric link is fine: it replaces it.
        let peer_asym = self.links.iter().any(|l| !l.asym && same_peer(l));
        let Some(l) = self.find_mut(f.new) else {
            return;
        };
        let local_mtu = l.local.map_or(mtu, |q| q.mtu);
        let peer = PeerQp {
            mac: m.mac,
            gid: m.gid,
            qpn: m.qpn,
            psn: m.psn,
            mtu: mtu.min(local_mtu),
        };
        l.peer = Some(peer);
        l.asym |= peer_asym;
        if parallel {
            warn!("the client's answer would make a parallel link: deleting it");
            self.config = None;
            self.mark_down(f.new);
            self.ops.push_front(Op::DeleteLink {
                link: f.new,
                reason: DeleteLinkReason::PROT_VIOL,
                orderly: false,
            });
            return;
        }
        l.state = LinkState::Connecting;
        let rtokens = m
            .ext
            .map(|e| e.rtokens.iter().collect())
            .unwrap_or_default();
        self.out
            .push_back(crate::llc::Output::ConnectLink { link: f.new, peer });
        f.stage = SrvStage::Connecting { rtokens };
        f.deadline = None;
        self.config = Some(Config::SrvAdd(f));
    }

    /// Server: the client told us about a new device (§3.5.5.1.2). During our own ADD
    /// LINK it crossed ours and is ignored (§3.5.5.3.1); otherwise retry at once (C.8).
    pub(in crate::llc) fn srv_client_add_link(&mut self, _now: Instant) {
        if matches!(self.config, Some(Config::SrvAdd(_))) {
            debug!("client ADD LINK crossed ours: ignored");
            return;
        }
        if self.choose_add_device(true).is_some() {
            self.add_retry_at = None;
            self.queue_add_link(true);
        } else {
            // CAL-4: at the maximum the request is ignored.
            debug!("client ADD LINK ignored: no link to add");
        }
    }

    /// ADD LINK CONTINUATION (v1): the server receives answers, the client requests.
    pub(in crate::llc) fn rx_add_link_cont(&mut self, now: Instant, link: LinkId, m: &AddLinkCont) {
        match (self.config.clone(), m.response) {
            (Some(Config::SrvAdd(f)), true) if f.carrying == link => {
                self.srv_cont_response(now, link, m, f)
            }
            (Some(Config::CliAdd(f)), false) if f.carrying == link => {
                self.cli_cont_request(now, link, m, f)
            }
            _ => debug!(%link, "ADD LINK CONTINUATION outside an exchange dropped"),
        }
    }

    pub(in crate::llc) fn srv_cont_response(
        &mut self,
        now: Instant,
        link: LinkId,
        m: &AddLinkCont,
        mut f: SrvAdd,
    ) {
        let SrvStage::Cont { mine, peer_last } = &mut f.stage else {
            debug!(%link, "ADD LINK CONTINUATION response out of sequence dropped");
            return;
        };
        let n = m.num_rkeys.min(2);
        let ok = m.link_num == self.num_of(f.new) && next_count(*peer_last, m.num_rkeys);
        *peer_last = Some(m.num_rkeys);
        let peer_left = m.num_rkeys - n;
        let more = !mine.is_empty() || peer_left > 0;
        if !ok || !self.apply_pairs(link, f.new, &m.rtokens[..usize::from(n)], true) {
            // C.7.1: RMB count mismatch → protocol error, link outage.
            self.srv_add_failed(now, false);
            self.protocol_violation(now, link, "ADD LINK CONTINUATION mismatch");
            return;
        }
        if more {
            self.srv_send_cont(now, f);
        } else if !self.new_link_complete(f.new) {
            self.srv_add_failed(now, false);
            self.protocol_violation(now, link, "peer RMB without an RToken on the new link");
        } else {
            self.srv_confirm_new(now, f);
        }
    }

    /// Server: CONFIRM LINK response on the new link (SL-S9).
    pub(in crate::llc) fn srv_confirm_response(
        &mut self,
        now: Instant,
        link: LinkId,
        m: &ConfirmLink,
    ) {
        let Some(Config::SrvAdd(f)) = self.config.clone() else {
            return;
        };
        if !matches!(f.stage, SrvStage::AwaitConfirm) {
            debug!(%link, "CONFIRM LINK response out of sequence dropped");
            return;
        }
        let Some(l) = self.find(link).cloned() else {
            return;
        };
        if self.check_confirm(&l, m).is_err() || m.link_num != l.num {
            // AMB-50: handled like the client's case: delete the new link.
            warn!(%link, "invalid CONFIRM LINK response on the new link");
            self.config = None;
            self.mark_down(link);
            self.ops.push_front(Op::DeleteLink {
                link,
                reason: DeleteLinkReason::PROT_VIOL,
                orderly: false,
            });
            return;
        }
        self.config = None;
        let asym = l.asym;
        if let Some(l) = self.find_mut(link) {
            l.peer_uid = m.link_uid;
            l.state = LinkState::Active;
            l.last_rx = now;
        }
        info!(%link, num = l.num, asym, "link up");
        self.emit(Event::LinkUp(link));
        // More devices and room for more links: keep adding (§3.5.5.1.1).
        if self.choose_add_device(false).is_some_and(|(_, a)| !a) {
            self.queue_add_link(false);
        }
        // INV-9: once a symmetric link exists, the asymmetric one goes (reason 0x00050000).
        if !asym {
            if let Some(a) = self
                .links
                .iter()
                .find(|x| x.id != link && x.asym && x.is_active())
                .map(|x| x.id)
            {
                self.ops.push_back(Op::DeleteLink {
                    link: a,
                    reason: DeleteLinkReason::NO_ASYM_NEEDED,
                    orderly: true,
                });
            }
        }
    }
}
