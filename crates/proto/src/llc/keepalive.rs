//! TEST LINK: the echo (RFC 7609 A.3.8, TL-1/TL-2) and the link keepalive (§4.5.3, B.22;
//! Linux `smc_llc_testlink_work`).

use std::time::Instant;

use smc_wire::llc::{LlcMessage, TestLink};

use tracing::debug;

use super::link::PendingTest;
use super::{LinkDownReason, LinkGroup, LinkId, Purpose};

/// TEST LINK responses in flight per link at most (see `rx_test_link`).
const MAX_ECHOES_IN_FLIGHT: u8 = 4;

impl LinkGroup {
    /// TEST LINK request: echo it at once on the same link, whatever else is going on
    /// (§3.3, §3.5.5.3: group 1; Linux tears the link down after 2 s without an answer, H9).
    /// Response: it must carry the user data we sent (C.7.1).
    pub(super) fn rx_test_link(&mut self, now: Instant, link: LinkId, m: &TestLink) {
        if !m.response {
            // KA-4: a peer has one TEST LINK outstanding per link at a time; answers to a
            // flood beyond a few in flight are dropped (its own keepalive would time out;
            // nobody else's link is touched), so that it cannot fill our send queue.
            match self.find_mut(link) {
                Some(l) if l.echoes < MAX_ECHOES_IN_FLIGHT => l.echoes += 1,
                Some(_) => {
                    debug!(%link, "TEST LINK flood: request dropped");
                    self.dropped_requests += 1;
                    return;
                }
                None => return,
            }
            let r = TestLink {
                v2: self.v2(),
                response: true,
                user_data: m.user_data,
            };
            self.send(link, &LlcMessage::TestLink(r), Purpose::Echo);
            return;
        }
        let Some(l) = self.find_mut(link) else { return };
        match l.test {
            Some(t) if t.data == m.user_data => l.test = None,
            Some(_) => {
                self.protocol_violation(now, link, "TEST LINK response with other user data")
            }
            // TC-LGM-24: a reply on another link than its request (§3.3) is out of sync.
            None => self.protocol_violation(now, link, "TEST LINK response without a request"),
        }
    }

    pub(super) fn keepalive_deadline(&self) -> Option<std::time::Instant> {
        let interval = self.cfg.timers.test_link_interval;
        self.links
            .iter()
            .filter(|l| l.is_active())
            .filter_map(|l| match (l.test, interval) {
                (Some(t), _) => Some(t.deadline),
                (None, Some(iv)) => Some(l.last_rx + iv),
                (None, None) => None,
            })
            .min()
    }

    pub(super) fn keepalive_timeout(&mut self, now: Instant) {
        let interval = self.cfg.timers.test_link_interval;
        let ids: Vec<LinkId> = self
            .links
            .iter()
            .filter(|l| l.is_active())
            .map(|l| l.id)
            .collect();
        for id in ids {
            let Some(l) = self.find(id) else { continue };
            match (l.test, interval) {
                (Some(t), _) if t.deadline <= now => {
                    // KA-3: no reply: the link has failed.
                    self.link_failed(now, id, LinkDownReason::TestLinkTimeout);
                }
                (None, Some(iv)) if l.last_rx + iv <= now => self.send_test(now, id),
                _ => {}
            }
        }
    }

    /// Checks at once that `link` still reaches the peer (a TEST LINK now, unless one is
    /// outstanding; no reply within the reply timer → the link fails, KA-3). For signs
    /// that the peer may be gone although the link looks idle-healthy, e.g. its TCP FIN
    /// on a connection that carries no SMC-R close flags yet: a peer process that died
    /// sends nothing more, while a live one may shut its TCP socket before its last CDC
    /// arrives (Linux `smc_shutdown`), and that must not end the connection.
    pub fn probe_link(&mut self, now: Instant, link: LinkId) {
        if !matches!(self.term, super::Term::Running) {
            return;
        }
        match self.find(link) {
            Some(l) if l.is_active() && l.test.is_none() => {}
            _ => return,
        }
        self.send_test(now, link);
        self.pump(now);
    }

    fn send_test(&mut self, now: Instant, id: LinkId) {
        let data = self.test_data();
        let m = TestLink {
            v2: self.v2(),
            response: false,
            user_data: data,
        };
        self.send(id, &LlcMessage::TestLink(m), Purpose::Plain);
        let deadline = now + self.cfg.timers.reply;
        if let Some(l) = self.find_mut(id) {
            l.test = Some(PendingTest { data, deadline });
        }
    }

    /// User data of our TEST LINK: a sequence number (REC: a nonce), or zeros like Linux.
    fn test_data(&mut self) -> [u8; 16] {
        let mut d = [0u8; 16];
        if !self.cfg.linux_compat {
            self.test_seq = self.test_seq.wrapping_add(1);
            d[..8].copy_from_slice(&self.test_seq.to_be_bytes());
            d[8..12].copy_from_slice(&self.cfg.lgr_id.to_be_bytes());
        }
        d
    }
}
