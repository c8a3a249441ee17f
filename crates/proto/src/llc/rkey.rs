//! CONFIRM RKEY (+ CONTINUATION) and DELETE RKEY, both directions (RFC 7609 §3.5.5.2,
//! A.3.5–A.3.7; CHECKLIST B.13.1, B.13.2; Linux `smc_llc_do_confirm_rkey`,
//! `smc_llc_rmt_conf_rkey`, `smc_llc_rmt_delete_rkey`).

use std::collections::BTreeMap;
use std::time::Instant;

use smc_wire::llc::{
    ConfirmRkey, ConfirmRkeyCont, DeleteRkey, DeleteRkeyV2, LlcMessage, OtherLinkRkey, RkeyList,
    MAX_DELETE_RKEYS,
};
use tracing::{debug, warn};

use super::rtoken::{LocalState, RToken};
use super::{Config, Event, LinkDownReason, LinkGroup, LinkId, Op, Purpose, RmbId, Role};

/// Most RKeys in one DELETE RKEY v2 we send: 8 + 4·9 = 44 bytes. Linux copies only the
/// first 44 bytes of a received DELETE RKEY v2 (`smc_llc_rmt_delete_rkey`), so more would
/// be read from stale memory there.
const MAX_DELETE_RKEYS_V2: usize = 9;

/// Our RKey exchange in flight.
#[derive(Clone, Debug)]
pub(super) struct RkeyFlow {
    pub link: LinkId,
    pub deadline: Instant,
    pub kind: RkeyKind,
}

#[derive(Clone, Debug)]
pub(super) enum RkeyKind {
    /// CONFIRM RKEY; `cont` are the other-link specs still to send in CONTINUATIONs.
    Confirm {
        rmb: RmbId,
        cont: Vec<OtherLinkRkey>,
    },
    /// DELETE RKEY for these RMBs.
    Delete { rmbs: Vec<RmbId> },
}

/// The peer's CONFIRM RKEY whose CONTINUATIONs are still coming (v1, more than 3 links).
#[derive(Clone, Debug)]
pub(super) struct RemoteRkey {
    pub link: LinkId,
    pub tokens: BTreeMap<LinkId, RToken>,
    /// Specs still to come.
    pub left: u8,
    pub deadline: Instant,
}

impl LinkGroup {
    /// Sends CONFIRM RKEY for a new RMB over an active link (AR-1..AR-3).
    pub(super) fn start_confirm_rkey(&mut self, now: Instant, rmb: RmbId) {
        let Some(r) = self.rt.local.get(&rmb) else {
            return;
        };
        if r.state != LocalState::Pending {
            return;
        }
        let Some(link) = self.pick_active(None) else {
            // No link to carry it: the link group is ending.
            self.ops.push_front(Op::ConfirmRmb(rmb));
            return;
        };
        let mut own = None;
        let mut others = Vec::new();
        for l in self.links.iter().filter(|l| l.is_active()) {
            let Some(t) = r.tokens.get(&l.id) else {
                continue;
            };
            if l.id == link {
                own = Some(*t);
            } else {
                others.push(OtherLinkRkey {
                    link_num: l.num,
                    rkey: t.rkey,
                    vaddr: t.vaddr,
                });
            }
        }
        let Some(own) = own else {
            warn!(?rmb, "no RToken for the carrying link");
            self.rt.local.remove(&rmb);
            self.emit(Event::RmbConfirmFailed { rmb, retry: false });
            return;
        };
        // NumTkns counts the other links (AMB-28); more than 2 need CONTINUATIONs (v1
        // only; v2 and Linux groups never have more than 3 links).
        let mut first = [OtherLinkRkey::default(); 2];
        for (slot, o) in first.iter_mut().zip(&others) {
            *slot = *o;
        }
        let cont = others.iter().skip(2).copied().collect();
        let m = ConfirmRkey {
            v2: self.v2(),
            response: false,
            negative: false,
            retry: false,
            num_tokens: others.len() as u8,
            rkey: own.rkey,
            vaddr: own.vaddr,
            others: first,
        };
        if let Some(r) = self.rt.local.get_mut(&rmb) {
            r.state = LocalState::Confirming;
        }
        self.send(link, &LlcMessage::ConfirmRkey(m), Purpose::Plain);
        self.rkey = Some(RkeyFlow {
            link,
            deadline: now + self.cfg.timers.reply,
            kind: RkeyKind::Confirm { rmb, cont },
        });
    }

    /// Sends DELETE RKEY for this RMB and the deletions queued right behind it (DR-2).
    pub(super) fn start_delete_rkey(&mut self, now: Instant, rmb: RmbId) {
        let Some(link) = self.pick_active(None) else {
            self.ops.push_front(Op::DeleteRmb(rmb));
            return;
        };
        let max = if self.v2() {
            MAX_DELETE_RKEYS_V2
        } else {
            MAX_DELETE_RKEYS
        };
        let mut rmbs = vec![rmb];
        while rmbs.len() < max {
            match self.ops.front() {
                Some(Op::DeleteRmb(r)) => {
                    rmbs.push(*r);
                    self.ops.pop_front();
                }
                _ => break,
            }
        }
        let mut keys = Vec::new();
        let mut sent = Vec::new();
        for r in rmbs {
            match self.rt.local.get(&r).and_then(|x| x.tokens.get(&link)) {
                Some(t) => {
                    keys.push(t.rkey);
                    sent.push(r);
                }
                None => {
                    // Never known on this link: nothing to tell the peer.
                    self.rt.local.remove(&r);
                    self.emit(Event::RmbDeleted(r));
                }
            }
        }
        if sent.is_empty() {
            return;
        }
        if self.v2() {
            let m = DeleteRkeyV2 {
                response: false,
                negative: false,
                num_inval_rkeys: 0,
                rkeys: RkeyList::Slice(&keys),
            };
            self.send(link, &LlcMessage::DeleteRkeyV2(m), Purpose::Plain);
        } else {
            let mut rkeys = [0u32; MAX_DELETE_RKEYS];
            rkeys[..keys.len()].copy_from_slice(&keys);
            let m = DeleteRkey {
                response: false,
                negative: false,
                count: keys.len() as u8,
                err_mask: 0,
                rkeys,
            };
            self.send(link, &LlcMessage::DeleteRkey(m), Purpose::Plain);
        }
        self.rkey = Some(RkeyFlow {
            link,
            deadline: now + self.cfg.timers.reply,
            kind: RkeyKind::Delete { rmbs: sent },
        });
    }

    /// AR-7: no reply → the carrying link has failed (C.7.1).
    pub(super) fn rkey_timeout(&mut self, now: Instant) {
        let Some(f) = self.rkey.as_ref() else { return };
        let what = match f.kind {
            RkeyKind::Confirm { .. } => "CONFIRM RKEY",
            RkeyKind::Delete { .. } => "DELETE RKEY",
        };
        let link = f.link;
        // The exchange ends here even if the link was already given up.
        self.abort_rkey_flow(link);
        self.link_failed(now, link, LinkDownReason::ReplyTimeout(what));
    }

    /// The carrying link of our RKey exchange failed: the exchange is not replayed on
    /// another link (§2.3) but started again once the configuration is stable.
    pub(super) fn abort_rkey_flow(&mut self, link: LinkId) {
        if self.rkey.as_ref().is_none_or(|f| f.link != link) {
            return;
        }
        let Some(f) = self.rkey.take() else { return };
        match f.kind {
            RkeyKind::Confirm { rmb, .. } => {
                if let Some(r) = self.rt.local.get_mut(&rmb) {
                    r.state = LocalState::Pending;
                    self.ops.push_front(Op::ConfirmRmb(rmb));
                }
            }
            RkeyKind::Delete { rmbs } => {
                for r in rmbs.into_iter().rev() {
                    if self.rt.local.contains_key(&r) {
                        self.ops.push_front(Op::DeleteRmb(r));
                    }
                }
            }
        }
    }

    /// CONFIRM RKEY from the peer (request) or its answer to ours (response).
    pub(super) fn rx_confirm_rkey(&mut self, now: Instant, link: LinkId, m: &ConfirmRkey) {
        if m.response {
            self.confirm_rkey_answer(now, link, m.negative, m.retry);
            return;
        }
        // §3.5.5.3.1/2: a client CONFIRM RKEY during the server's ADD/DELETE LINK gets a
        // negative answer with the retry flag (REC), unless Linux behaviour is selected.
        // The server must not send one during its own ADD LINK (the client answers it
        // negatively too), and a new one may not start before the CONTINUATIONs of the
        // previous one are in.
        let collision = match self.cfg.role {
            Role::Server => self.config.is_some() && !self.cfg.linux_compat,
            Role::Client => matches!(self.config, Some(Config::CliAdd(_))),
        } || self.remote_rkey.is_some();
        // INV-14: at most 255 RMBs per peer per link group (Linux: no free rtoken slot →
        // NEG and RETRY).
        let full = self.rt.peer.len() >= 255 && self.rt.find_peer(link, m.rkey).is_none();
        let mut r = *m;
        r.v2 = self.v2();
        r.response = true;
        if collision || full {
            debug!(%link, full, "CONFIRM RKEY refused: negative");
            r.negative = true;
            r.retry = true;
            self.send(link, &LlcMessage::ConfirmRkey(r), Purpose::Plain);
            return;
        }
        let mut tokens = BTreeMap::new();
        tokens.insert(
            link,
            RToken {
                rkey: m.rkey,
                vaddr: m.vaddr,
            },
        );
        let here = usize::from(m.num_tokens.min(2));
        for o in &m.others[..here] {
            self.add_other_token(&mut tokens, o);
        }
        if m.num_tokens > 2 && !self.v2() {
            self.remote_rkey = Some(RemoteRkey {
                link,
                tokens,
                left: m.num_tokens - 2,
                deadline: now + self.cfg.timers.reply,
            });
            self.send(link, &LlcMessage::ConfirmRkey(r), Purpose::Plain);
            return;
        }
        self.send(link, &LlcMessage::ConfirmRkey(r), Purpose::Plain);
        self.peer_rmb_complete(now, link, tokens);
    }

    fn add_other_token(&self, tokens: &mut BTreeMap<LinkId, RToken>, o: &OtherLinkRkey) {
        match self.by_num(o.link_num) {
            Some(id) => {
                tokens.insert(
                    id,
                    RToken {
                        rkey: o.rkey,
                        vaddr: o.vaddr,
                    },
                );
            }
            None => debug!(num = o.link_num, "RToken for an unknown link ignored"),
        }
    }

    /// CONFIRM RKEY CONTINUATION: the rest of the peer's tokens, or the echo of ours.
    pub(super) fn rx_confirm_rkey_cont(&mut self, now: Instant, link: LinkId, m: &ConfirmRkeyCont) {
        if m.response {
            self.confirm_rkey_answer(now, link, m.negative, false);
            return;
        }
        let Some(mut rr) = self.remote_rkey.take() else {
            // Linux neither expects nor answers it; without a CONFIRM RKEY before it there
            // is nothing to continue.
            debug!(%link, "CONFIRM RKEY CONTINUATION without a CONFIRM RKEY dropped");
            return;
        };
        if rr.link != link || m.num_left != rr.left {
            self.protocol_violation(now, link, "CONFIRM RKEY CONTINUATION count mismatch");
            return;
        }
        let n = usize::from(m.num_left.min(3));
        for o in &m.others[..n] {
            self.add_other_token(&mut rr.tokens, o);
        }
        let mut r = *m;
        r.response = true;
        self.send(link, &LlcMessage::ConfirmRkeyCont(r), Purpose::Plain);
        rr.left -= n as u8;
        if rr.left == 0 {
            self.peer_rmb_complete(now, link, rr.tokens);
        } else {
            rr.deadline = now + self.cfg.timers.reply;
            self.remote_rkey = Some(rr);
        }
    }

    /// Records a peer RMB announced by CONFIRM RKEY; links it gave no token for have failed
    /// (CRK-4, C.7.1).
    fn peer_rmb_complete(&mut self, now: Instant, link: LinkId, tokens: BTreeMap<LinkId, RToken>) {
        let rkey = tokens.get(&link).map_or(0, |t| t.rkey);
        let missing: Vec<LinkId> = self
            .links
            .iter()
            .filter(|l| l.is_active() && !tokens.contains_key(&l.id))
            .map(|l| l.id)
            .collect();
        let id = match self.rt.find_peer(link, rkey) {
            Some(id) => {
                if let Some(p) = self.rt.peer.get_mut(&id) {
                    p.tokens = tokens;
                }
                id
            }
            None => self.rt.add_peer(tokens),
        };
        let tokens = self.peer_tokens(id);
        self.emit(Event::PeerRmbAdded { rmb: id, tokens });
        for l in missing {
            self.link_failed(now, l, LinkDownReason::MissingRkey);
        }
    }

    /// The answer to our CONFIRM RKEY or to one of its CONTINUATIONs.
    fn confirm_rkey_answer(&mut self, now: Instant, link: LinkId, negative: bool, retry: bool) {
        let (rmb, mut cont) = match &self.rkey {
            Some(f) if f.link == link => match &f.kind {
                RkeyKind::Confirm { rmb, cont } => (*rmb, cont.clone()),
                RkeyKind::Delete { .. } => {
                    debug!(%link, "CONFIRM RKEY response during DELETE RKEY dropped");
                    return;
                }
            },
            _ => {
                debug!(%link, "unexpected CONFIRM RKEY response dropped");
                return;
            }
        };
        if negative {
            self.rkey = None;
            // CRK-3: with C, retry once the current change is complete; without, wait for a
            // natural stimulus (the runtime's next add_rmb).
            let retries = self.rt.local.get(&rmb).map_or(0, |r| r.retries);
            if retry && retries < self.cfg.rkey_retries {
                debug!(?rmb, "negative CONFIRM RKEY with retry: retrying later");
                if let Some(r) = self.rt.local.get_mut(&rmb) {
                    r.state = LocalState::Pending;
                    r.retries += 1;
                }
                self.ops.push_back(Op::ConfirmRmb(rmb));
                self.rkey_hold = Some(now + self.cfg.timers.reply / 8 * u32::from(retries + 1));
            } else {
                warn!(?rmb, retry, "CONFIRM RKEY refused by the peer");
                self.rt.local.remove(&rmb);
                self.emit(Event::RmbConfirmFailed { rmb, retry });
            }
            return;
        }
        if !cont.is_empty() {
            // A.3.6: three specs per CONTINUATION, NumTknsLeft counting down.
            let left = cont.len() as u8;
            let mut others = [OtherLinkRkey::default(); 3];
            let n = cont.len().min(3);
            others[..n].copy_from_slice(&cont[..n]);
            cont.drain(..n);
            let m = ConfirmRkeyCont {
                response: false,
                negative: false,
                num_left: left,
                others,
            };
            self.send(link, &LlcMessage::ConfirmRkeyCont(m), Purpose::Plain);
            self.rkey = Some(RkeyFlow {
                link,
                deadline: now + self.cfg.timers.reply,
                kind: RkeyKind::Confirm { rmb, cont },
            });
            return;
        }
        self.rkey = None;
        if let Some(r) = self.rt.local.get_mut(&rmb) {
            if r.state == LocalState::Confirming {
                r.state = LocalState::Confirmed;
                r.retries = 0;
                self.emit(Event::RmbConfirmed(rmb));
            }
        }
    }

    /// DELETE RKEY from the peer, or the answer to ours.
    pub(super) fn rx_delete_rkey(&mut self, _now: Instant, link: LinkId, msg: &LlcMessage<'_>) {
        let (response, negative) = match msg {
            LlcMessage::DeleteRkey(m) => (m.response, m.negative),
            LlcMessage::DeleteRkeyV2(m) => (m.response, m.negative),
            _ => return,
        };
        if response {
            let rmbs = match &self.rkey {
                Some(f) if f.link == link => match &f.kind {
                    RkeyKind::Delete { rmbs } => rmbs.clone(),
                    RkeyKind::Confirm { .. } => {
                        debug!(%link, "DELETE RKEY response during CONFIRM RKEY dropped");
                        return;
                    }
                },
                _ => {
                    debug!(%link, "unexpected DELETE RKEY response dropped");
                    return;
                }
            };
            self.rkey = None;
            if negative {
                // DRK-1: no recovery beyond logging.
                warn!(?rmbs, "peer did not know some deleted RKeys");
            }
            for r in rmbs {
                self.rt.local.remove(&r);
                self.emit(Event::RmbDeleted(r));
            }
            return;
        }
        // DRK-4: delete what we know, flag what we do not.
        match msg {
            LlcMessage::DeleteRkey(m) => {
                let mut mask = 0u8;
                for (i, k) in m.rkeys().iter().enumerate() {
                    if !self.forget_peer_rmb(link, *k) {
                        mask |= 0x80 >> i;
                    }
                }
                let mut r = *m;
                r.response = true;
                r.negative = mask != 0;
                r.err_mask = mask;
                self.send(link, &LlcMessage::DeleteRkey(r), Purpose::Plain);
            }
            LlcMessage::DeleteRkeyV2(m) => {
                let keys: Vec<u32> = m.rkeys.iter().collect();
                let mut inval = 0u8;
                for k in &keys {
                    if !self.forget_peer_rmb(link, *k) {
                        inval = inval.saturating_add(1);
                    }
                }
                // Linux answers with the keys zeroed and the count of unknown ones.
                let zeros = vec![0u32; keys.len()];
                let r = DeleteRkeyV2 {
                    response: true,
                    negative: inval != 0,
                    num_inval_rkeys: inval,
                    rkeys: RkeyList::Slice(&zeros),
                };
                self.send(link, &LlcMessage::DeleteRkeyV2(r), Purpose::Plain);
            }
            _ => {}
        }
    }

    fn forget_peer_rmb(&mut self, link: LinkId, rkey: u32) -> bool {
        match self.rt.find_peer(link, rkey) {
            Some(id) => {
                self.rt.peer.remove(&id);
                self.emit(Event::PeerRmbDeleted(id));
                true
            }
            None => false,
        }
    }
}
