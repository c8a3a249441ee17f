//! Adding a link, client side: answering ADD LINK, the rtoken exchange and CONFIRM LINK,
//! and the client's invitations (ADD LINK "FYI" in v1, REQUEST ADD LINK in v2)
//! (RFC 7609 §3.5.5.1.2, §3.5.5.2.3).

use super::*;

impl LinkGroup {
    /// Client: the server's ADD LINK request (SL-C1..SL-C5).
    pub(in crate::llc) fn cli_add_link(&mut self, now: Instant, link: LinkId, m: &AddLink<'_>) {
        self.add_seen = true;
        self.req_add = None;
        if !self.is_active(link) {
            self.protocol_violation(now, link, "ADD LINK on a link that is not active");
            return;
        }
        // SL-C4 (Linux also refuses MTU 0).
        if QpMtu::from_code(m.qp_mtu).is_err() {
            self.cli_reject(link, m, ADD_LINK_RSN_INVALID_MTU);
            return;
        }
        let v1 = !self.v2();
        let alive: Vec<&Link> = self.links.iter().filter(|l| l.is_alive()).collect();
        let same_rnic = |l: &&Link| {
            l.peer
                .is_some_and(|p| p.gid == m.gid && (!v1 || p.mac == m.mac))
        };
        // SL-C1: does the server offer an RNIC it already uses with us on a symmetric link?
        // (A link replacing the asymmetric one may reuse that one's RNICs, INV-9.)
        let same_server = alive.iter().any(|l| !l.asym && same_rnic(l));
        // Our devices in order of preference: unused, then used only by the asymmetric
        // link; never one that would make a parallel link to an existing one.
        let pick = |only_sym: bool| {
            self.devices
                .iter()
                .find(|d| {
                    !alive
                        .iter()
                        .any(|l| l.device == d.id && (!only_sym || !l.asym || same_rnic(l)))
                })
                .map(|d| d.id)
        };
        let unused = pick(false).or_else(|| pick(true));
        let sym = alive.iter().filter(|l| !l.asym).count();
        let asym_exists = alive.len() > sym;
        let (device, asym) = match (same_server, unused) {
            // SL-C2: same server RNIC, our second RNIC: asymmetric on the server's side.
            (true, Some(d)) => (d, true),
            // No alternate path (§3.5.1.6.1).
            (true, None) => {
                self.cli_reject(link, m, ADD_LINK_RSN_NO_ALT_PATH);
                return;
            }
            // SL-C3: new server RNIC: symmetric with a free RNIC, else asymmetric on ours.
            (false, Some(d)) => (d, false),
            (false, None) => (self.find(link).map_or(DeviceId(0), |l| l.device), true),
        };
        let too_many = if asym {
            asym_exists
        } else {
            sym >= usize::from(self.max_links)
        };
        if too_many || m.link_num == 0 || self.by_num(m.link_num).is_some() {
            self.cli_reject(link, m, ADD_LINK_RSN_NO_ALT_PATH);
            return;
        }
        let Ok(mtu) = QpMtu::from_code(m.qp_mtu) else {
            return;
        };
        let id = self.new_link_id();
        let mut l = Link::new(id, m.link_num, device, now);
        l.asym = asym;
        l.local_uid = self.uid(m.link_num);
        l.peer = Some(PeerQp {
            mac: m.mac,
            gid: m.gid,
            qpn: m.qpn,
            psn: m.psn,
            mtu,
        });
        self.links.push(l);
        info!(%id, num = m.link_num, ?device, asym, "accepting a new link");
        // v2: the server's RTokens for the new link came with the request.
        if let Some(e) = m.ext {
            let pairs: Vec<AddLinkRtoken> = e.rtokens.iter().collect();
            self.apply_pairs(link, id, &pairs, false);
        }
        self.out
            .push_back(crate::llc::Output::CreateLink { link: id, device });
        self.config = Some(Config::CliAdd(CliAdd {
            new: id,
            carrying: link,
            stage: CliStage::Creating,
            deadline: None,
            first_contact: !matches!(self.first, First::Done),
            req: LlcOut::new(&LlcMessage::AddLink(*m)),
        }));
    }

    /// Rejects the server's ADD LINK by echoing it with R and Z (Linux
    /// `smc_llc_cli_add_link_reject`; v1 carries the reason, v2 has no room for it, H2).
    pub(in crate::llc) fn cli_reject(&mut self, link: LinkId, m: &AddLink<'_>, reason: u8) {
        info!(%link, reason, "rejecting ADD LINK");
        let r = AddLink {
            v2: self.v2(),
            response: true,
            reject: true,
            reject_reason: if self.v2() { 0 } else { reason },
            ext: None,
            ..*m
        };
        self.send(link, &LlcMessage::AddLink(r), Purpose::Plain);
        if !matches!(self.first, First::Done) {
            self.point_of_no_return();
        }
    }

    /// Client: one ADD LINK CONTINUATION from the server; answer with ours (ALC-A3).
    pub(in crate::llc) fn cli_cont_request(
        &mut self,
        now: Instant,
        link: LinkId,
        m: &AddLinkCont,
        mut f: CliAdd,
    ) {
        let new_num = self.num_of(f.new);
        let CliStage::Cont { mine, srv_last } = &mut f.stage else {
            self.protocol_violation(now, link, "ADD LINK CONTINUATION out of sequence");
            return;
        };
        let n = m.num_rkeys.min(2);
        let ok = m.link_num == new_num && next_count(*srv_last, m.num_rkeys);
        *srv_last = Some(m.num_rkeys);
        let srv_left = m.num_rkeys - n;
        let num = mine.len().min(255) as u8;
        let mut rtokens = [AddLinkRtoken::default(); 2];
        let k = mine.len().min(2);
        rtokens[..k].copy_from_slice(&mine[..k]);
        mine.drain(..k);
        let more = !mine.is_empty() || srv_left > 0;
        if !ok || !self.apply_pairs(link, f.new, &m.rtokens[..usize::from(n)], true) {
            self.config = None;
            self.remove_link(f.new);
            self.protocol_violation(now, link, "ADD LINK CONTINUATION mismatch");
            return;
        }
        let r = AddLinkCont {
            response: true,
            link_num: new_num,
            num_rkeys: num,
            rtokens,
        };
        self.send(link, &LlcMessage::AddLinkCont(r), Purpose::Plain);
        if more {
            f.deadline = Some(now + self.cfg.timers.reply);
        } else {
            if !self.new_link_complete(f.new) {
                self.config = None;
                self.remove_link(f.new);
                self.protocol_violation(now, link, "peer RMB without an RToken on the new link");
                return;
            }
            f.stage = CliStage::AwaitConfirm;
            f.deadline = Some(now + self.cfg.timers.new_link_confirm);
        }
        self.config = Some(Config::CliAdd(f));
    }

    /// Client: CONFIRM LINK on the new link (SL-C9).
    pub(in crate::llc) fn cli_confirm_request(
        &mut self,
        now: Instant,
        link: LinkId,
        m: &ConfirmLink,
    ) {
        let Some(Config::CliAdd(f)) = self.config.clone() else {
            return;
        };
        if !matches!(f.stage, CliStage::AwaitConfirm) {
            self.protocol_violation(now, link, "CONFIRM LINK before the RTokens");
            return;
        }
        if f.first_contact {
            self.point_of_no_return();
        }
        let Some(l) = self.find(link).cloned() else {
            return;
        };
        if self.check_confirm(&l, m).is_err() || m.link_num != l.num {
            // C.7.1: incorrect link information → bring the link down with DELETE LINK.
            warn!(%link, "invalid CONFIRM LINK on the new link");
            self.config = None;
            self.client_request_delete(now, link, DeleteLinkReason::PROT_VIOL, false);
            return;
        }
        if self.v2() && !self.new_link_complete(link) {
            self.config = None;
            self.client_request_delete(now, link, DeleteLinkReason::PROT_VIOL, false);
            return;
        }
        self.config = None;
        if let Some(x) = self.find_mut(link) {
            x.peer_uid = m.link_uid;
            x.state = LinkState::Active;
            x.last_rx = now;
        }
        let r = self.confirm_link_msg(link, true, self.max_links);
        self.send(link, &LlcMessage::ConfirmLink(r), Purpose::Plain);
        info!(%link, num = l.num, asym = l.asym, "link up");
        self.emit(Event::LinkUp(link));
    }

    /// Client: a new device; tell the server if the link group lacks redundancy.
    pub(in crate::llc) fn client_invite(&mut self, now: Instant, dev: Device) {
        if self.active_count() >= usize::from(self.max_links)
            || self.config.is_some()
            || self.req_add.is_some()
        {
            return;
        }
        let Some(link) = self.pick_active(None) else {
            return;
        };
        if self.v2() {
            // Linux: the GIDs we could use, the current link's first (`smc_fill_gid_list`).
            let mut r = ReqAddLink::default();
            let cur = self
                .find(link)
                .and_then(|l| self.device(l.device))
                .map(|d| d.gid);
            let mut gids: Vec<Gid> = cur.into_iter().collect();
            gids.extend(self.devices.iter().map(|d| d.gid));
            for g in gids {
                if !r.gids.contains(&g) && r.gids.try_push(g).is_err() {
                    break;
                }
            }
            self.send(link, &LlcMessage::ReqAddLink(r), Purpose::Plain);
            self.req_add = Some(now + self.cfg.timers.reply);
        } else {
            // §3.5.5.1.2: ADD LINK request with the new RNIC; no answer is expected.
            let m = AddLink {
                v2: false,
                response: false,
                reject: false,
                reject_reason: 0,
                mac: dev.mac,
                gid: dev.gid,
                qpn: Default::default(),
                link_num: 0,
                qp_mtu: 0,
                psn: Default::default(),
                ext: None,
            };
            self.send(link, &LlcMessage::AddLink(m), Purpose::Plain);
        }
    }

    /// REQUEST ADD LINK (v2): the server adds a link, or answers that it cannot (Linux
    /// `smc_llc_send_req_add_link_response`: the echo with R and zeroed data).
    pub(in crate::llc) fn rx_req_add_link(&mut self, _now: Instant, link: LinkId, m: &ReqAddLink) {
        match (self.cfg.role, m.response) {
            (Role::Client, true) => self.req_add = None,
            (Role::Server, false) => {
                if matches!(self.config, Some(Config::SrvAdd(_))) {
                    return;
                }
                if self.choose_add_device(true).is_some() && self.term == crate::llc::Term::Running
                {
                    self.add_retry_at = None;
                    self.queue_add_link(true);
                } else {
                    let r = ReqAddLink {
                        response: true,
                        other_flags: m.other_flags,
                        gids: Default::default(),
                    };
                    self.send(link, &LlcMessage::ReqAddLink(r), Purpose::Plain);
                }
            }
            _ => debug!(%link, "REQUEST ADD LINK dropped"),
        }
    }
}
