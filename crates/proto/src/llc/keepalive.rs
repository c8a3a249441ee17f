//! TEST LINK: the echo (RFC 7609 A.3.8, TL-1/TL-2) and the link keepalive (§4.5.3, B.22;
//! Linux `smc_llc_testlink_work`).

use std::time::Instant;

use smc_wire::llc::{LlcMessage, TestLink};

use tracing::debug;

use super::link::{PendingProbe, PendingTest};
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
            .filter_map(|l| {
                let ka = match (l.test, interval) {
                    (Some(t), _) => Some(t.deadline),
                    (None, Some(iv)) => Some(l.last_rx + iv),
                    (None, None) => None,
                };
                [ka, l.probe.map(|p| p.at)].into_iter().flatten().min()
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
            self.probe_timeout(now, id);
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

    /// A deferred probe of `id` that is due: dropped if the link heard from the peer
    /// after the latest sign that asked for it, looked at again the grace after that sign
    /// if it is more recent than that, else sent.
    fn probe_timeout(&mut self, now: Instant, id: LinkId) {
        let grace = self.cfg.timers.fin_probe_grace;
        let running = matches!(self.term, super::Term::Running);
        let Some(l) = self.find_mut(id) else { return };
        let Some(p) = l.probe else { return };
        if p.at > now {
            return;
        }
        if !running || l.last_rx > p.since {
            l.probe = None;
        } else if p.since + grace > now {
            l.probe = Some(PendingProbe {
                at: p.since + grace,
                ..p
            });
        } else {
            l.probe = None;
            if l.test.is_none() {
                debug!(%id, "nothing from the peer since its FIN: TEST LINK");
                self.send_test(now, id);
            }
        }
    }

    /// Checks that `link` still reaches the peer (a TEST LINK, unless one is
    /// outstanding; no reply within the reply timer → the link fails, KA-3) unless the
    /// link hears from the peer within [`super::LlcTimers::fin_probe_grace`] after this
    /// call. For signs that the peer may be gone although the link looks idle-healthy,
    /// e.g. its TCP FIN on a connection that carries no SMC-R close flags yet: a peer
    /// process that died sends nothing more, while a live one may shut its TCP socket
    /// before its last CDC arrives (Linux `smc_shutdown`), and that must not end the
    /// connection; usually those close flags arrive within microseconds, and the live
    /// peer is then not asked at all. Further calls before the look move it to the grace
    /// after the latest.
    pub fn probe_link_deferred(&mut self, now: Instant, link: LinkId) {
        let grace = self.cfg.timers.fin_probe_grace;
        if !matches!(self.term, super::Term::Running) {
            return;
        }
        let Some(l) = self.find_mut(link) else { return };
        if !l.is_active() {
            return;
        }
        l.probe = Some(match l.probe {
            Some(p) => PendingProbe {
                since: p.since.max(now),
                at: p.at,
            },
            None => PendingProbe {
                since: now,
                at: now + grace,
            },
        });
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
