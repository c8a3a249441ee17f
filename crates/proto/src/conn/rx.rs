//! The receive side: CDC validation, the peer's producer cursor, the application's
//! reads from the local RMBE, consumer-cursor updates (RFC 7609 §4.5.1) and urgent
//! data (§4.7.5, §4.7.6); also the failover validation check (§4.6.1).
//!
//! Positions are stream byte counts; stream byte `s` lives at local-RMBE position
//! `r0 + s`. `cons ≤ prod`, and `prod − cons_posted_max ≤ cap` is enforced on every
//! CDC (the peer must not write past the consumer cursor we advertised).

use std::time::Instant;

use tracing::{trace, warn};

use super::cdc::{seq_before, CdcRepr, ConnStateFlags, ProducerFlags};
use super::cursor::Cursor;
use super::{
    AbortReason, CdcOutcome, Conn, ConnError, Events, OobError, Regions, State, UpdatePolicy,
    Violation,
};

/// Urgent data as the receiver sees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum RxUrgent {
    None,
    /// P seen, the urgent byte has not arrived yet (§4.7.6 step 2).
    Pending,
    /// U seen: the urgent byte is at stream index `mark`; its value was latched when
    /// the CDC arrived, before our consumer cursor could let the writer reuse the slot.
    Valid {
        mark: u64,
        byte: u8,
        oob_read: bool,
    },
}

#[derive(Debug)]
pub(super) struct RxState {
    /// Local-RMBE position of stream byte 0.
    pub(super) r0: u64,
    pub(super) prod: u64,
    pub(super) cons: u64,
    /// Consumer cursor carried by our last CDC.
    pub(super) cons_sent: u64,
    /// Highest consumer cursor ever posted (a failover may roll `cons_sent` back).
    pub(super) cons_posted_max: u64,
    /// Consumer cursor carried by our last *completed* CDC.
    pub(super) cons_confirmed: u64,
    /// B/R/P of the peer's last CDC.
    pub(super) peer_flags: ProducerFlags,
    /// A dedicated consumer update is due.
    pub(super) update_needed: bool,
    pub(super) urg: RxUrgent,
    /// SIOCATMARK after the urgent byte was skipped in-band, until the next read.
    pub(super) at_mark: bool,
    /// The application did shutdown(SHUT_RD).
    pub(super) shut_rd: bool,
    pub(super) seq_last: u16,
    /// SR (§4.6.1).
    pub(super) sr: u16,
}

impl RxState {
    pub(super) fn new(r0: u64) -> Self {
        RxState {
            r0,
            prod: 0,
            cons: 0,
            cons_sent: 0,
            cons_posted_max: 0,
            cons_confirmed: 0,
            peer_flags: ProducerFlags::empty(),
            update_needed: false,
            urg: RxUrgent::None,
            at_mark: false,
            shut_rd: false,
            seq_last: 0,
            sr: 0,
        }
    }
}

impl Conn {
    /// Process a received CDC. `read_byte(off)` must return the byte at offset `off` of
    /// our RMB element; it is called at most once, when urgent data arrives, to latch
    /// the urgent byte (the CDC's writes are placed before the CDC is seen: RC order).
    pub fn handle_cdc<F: FnOnce(u32) -> u8>(
        &mut self,
        msg: &CdcRepr,
        now: Instant,
        read_byte: F,
    ) -> CdcOutcome {
        if msg.token != self.local_token {
            return CdcOutcome::WrongToken;
        }
        if self.state == State::Closed {
            return CdcOutcome::Ignored;
        }
        if msg.is_failover_validation() {
            return self.handle_failover_validation(msg, now);
        }
        // A.4 / WIN-11: older than the last one → discard; equal → idempotent.
        if seq_before(msg.seqno, self.rx.seq_last) {
            trace!(
                token = self.local_token,
                seq = msg.seqno,
                "stale cdc dropped"
            );
            return CdcOutcome::Stale;
        }
        // Received, even if its content is ignored below: SR covers it (§4.6.1), or a
        // replay of the peer's C after a failover would look like lost data.
        self.rx.seq_last = msg.seqno;
        self.rx.sr = msg.seqno;
        // TRM-2: nothing may follow the peer's C or A.
        if self
            .cl
            .peer
            .intersects(ConnStateFlags::PEER_CONN_CLOSED | ConnStateFlags::PEER_CONN_ABORT)
        {
            return CdcOutcome::Ignored;
        }
        if self.state == State::PeerAbortWait {
            // §4.8.2 1A: ignore all other activity, wait for the peer's A.
            if msg.conn_flags.contains(ConnStateFlags::PEER_CONN_ABORT) {
                self.on_peer_abort(now);
                return CdcOutcome::Accepted;
            }
            if msg.conn_flags.contains(ConnStateFlags::PEER_CONN_CLOSED) {
                // The peer's C crossed our A.
                self.cl.peer |= ConnStateFlags::PEER_CONN_CLOSED;
                self.abort_after_peer_close(now);
                return CdcOutcome::Accepted;
            }
            return CdcOutcome::Ignored;
        }

        let prod_d = match self.check_producer(msg.prod) {
            Ok(d) => d,
            Err(v) => return self.peer_violation(v, now),
        };
        let cons_d = match self.check_consumer(msg.cons) {
            Ok(d) => d,
            Err(v) => return self.peer_violation(v, now),
        };
        if prod_d > 0
            && self
                .cl
                .peer
                .intersects(ConnStateFlags::PEER_DONE_WRITING | ConnStateFlags::PEER_CONN_CLOSED)
        {
            return self.peer_violation(Violation::DataAfterDone, now);
        }

        if cons_d > 0 {
            self.tx_peer_consumed(cons_d);
        }
        if prod_d > 0 {
            self.rx.prod += prod_d;
            self.events |= Events::READABLE;
            if msg.prod_flags.contains(ProducerFlags::URG_PRESENT) {
                self.rx_urgent_arrived(read_byte);
            }
        }
        let pending = msg.prod_flags.contains(ProducerFlags::URG_PENDING)
            && !(prod_d > 0 && msg.prod_flags.contains(ProducerFlags::URG_PRESENT));
        if pending {
            self.rx_urgent_pending();
        }
        self.rx.peer_flags = msg.prod_flags
            & (ProducerFlags::WRITE_BLOCKED
                | ProducerFlags::CONS_UPDATE_REQ
                | ProducerFlags::URG_PENDING);
        // A blocked or urgent-pending writer, or one asking for it, learns about
        // consumption it has not been told of now, not at our next read.
        if !self.rx.peer_flags.is_empty() && self.rx.cons != self.rx.cons_sent {
            self.request_update();
        }
        self.on_peer_conn_flags(msg.conn_flags, now);
        CdcOutcome::Accepted
    }

    /// New producer position relative to the current one; 0 for a stale cursor.
    fn check_producer(&self, c: Cursor) -> Result<u64, Violation> {
        let g = self.local;
        if !g.is_valid(c) {
            return Err(Violation::ProducerOutOfRange);
        }
        let cur = g.cursor_at(self.rx.r0 + self.rx.prod);
        match g.dist_within_cap(cur, c) {
            Some(d) => {
                if self.rx.prod + d > self.rx.cons_posted_max + u64::from(g.cap()) {
                    Err(Violation::ProducerOverrun)
                } else {
                    Ok(d)
                }
            }
            // WIN-12: a cursor that went backwards is ignored, not applied.
            None if g.dist_within_cap(c, cur).is_some() => Ok(0),
            None => Err(Violation::ProducerOverrun),
        }
    }

    /// New consumer position of the peer relative to the known one; 0 for stale.
    fn check_consumer(&self, c: Cursor) -> Result<u64, Violation> {
        let g = self.peer;
        if !g.is_valid(c) {
            return Err(Violation::ConsumerOutOfRange);
        }
        let cur = g.cursor_at(self.tx.p0 + self.tx.peer_cons);
        match g.dist_within_cap(cur, c) {
            Some(d) if self.tx.peer_cons + d <= self.tx.sent_max => Ok(d),
            Some(_) => Err(Violation::ConsumerAhead),
            None if g.dist_within_cap(c, cur).is_some() => Ok(0),
            None => Err(Violation::ConsumerAhead),
        }
    }

    fn peer_violation(&mut self, v: Violation, now: Instant) -> CdcOutcome {
        warn!(token = self.local_token, violation = %v, "peer protocol violation");
        let r = AbortReason::Violation(v);
        self.abort_with(r, now, true);
        CdcOutcome::Aborted(r)
    }

    /// §4.6.1: the peer moved to a new link and tells us the last seqno it knows we got.
    fn handle_failover_validation(&mut self, msg: &CdcRepr, now: Instant) -> CdcOutcome {
        if matches!(self.state, State::PeerAbortWait | State::ProcessAbort) {
            return CdcOutcome::Ignored;
        }
        if seq_before(self.rx.sr, msg.seqno) {
            warn!(
                token = self.local_token,
                sr = self.rx.sr,
                seq = msg.seqno,
                "failover validation: data lost"
            );
            self.abort_with(AbortReason::FailoverDataLoss, now, true);
            return CdcOutcome::Aborted(AbortReason::FailoverDataLoss);
        }
        trace!(
            token = self.local_token,
            sr = self.rx.sr,
            seq = msg.seqno,
            "failover validated"
        );
        CdcOutcome::FailoverValidated
    }

    fn rx_urgent_arrived<F: FnOnce(u32) -> u8>(&mut self, read_byte: F) {
        let mark = self.rx.prod - 1;
        let byte = read_byte(self.local.offset_of(self.rx.r0 + mark));
        // A newer mark supersedes an older unread one (BSD semantics); an older byte
        // not yet reached is then read in-band.
        self.rx.urg = RxUrgent::Valid {
            mark,
            byte,
            oob_read: false,
        };
        self.rx.at_mark = false;
        self.events |= Events::URGENT | Events::READABLE;
        trace!(token = self.local_token, mark, "urgent data arrived");
        self.rx_skip_urgent_if_at_mark();
    }

    fn rx_urgent_pending(&mut self) {
        match self.rx.urg {
            RxUrgent::Pending => {}
            // The current mark is still ahead: it is the one being announced.
            RxUrgent::Valid { mark, .. } if self.rx.cons <= mark => {}
            _ => {
                self.rx.urg = RxUrgent::Pending;
                self.events |= Events::URGENT;
            }
        }
    }

    /// Without OOBINLINE the urgent byte is not part of the stream: once reading has
    /// reached it, step over it and tell the writer at once (UR-3; a Linux writer does
    /// not write again before our consumer cursor passes the byte).
    pub(super) fn rx_skip_urgent_if_at_mark(&mut self) {
        if let RxUrgent::Valid { mark, .. } = self.rx.urg {
            if !self.cfg.oob_inline && self.rx.cons == mark {
                self.rx.cons += 1;
                self.rx.at_mark = true;
                self.request_update();
            }
        }
    }

    fn request_update(&mut self) {
        self.rx.update_needed = true;
        self.events |= Events::TRANSMIT;
    }

    /// Where the application may read: up to two regions of our RMB element. Reads stop
    /// at the urgent mark so that [`Conn::at_mark`] can be checked (SIOCATMARK).
    pub fn rx_available(&self) -> Regions {
        let n = self.rx_readable();
        Regions::ring(
            self.local.data_off(),
            self.local.cap(),
            self.rx.r0 + self.rx.cons,
            n,
        )
    }

    fn rx_readable(&self) -> u64 {
        if self.rx.shut_rd {
            return 0;
        }
        let mut end = self.rx.prod;
        if let RxUrgent::Valid { mark, .. } = self.rx.urg {
            if self.rx.cons < mark {
                end = end.min(mark);
            }
        }
        end - self.rx.cons
    }

    /// The application consumed `n` bytes from the front of [`Conn::rx_available`].
    pub fn rx_consume(&mut self, n: u32) -> Result<(), ConnError> {
        let avail = self.rx_readable();
        if u64::from(n) > avail {
            return Err(ConnError::InvalidLength {
                requested: n.into(),
                available: avail,
            });
        }
        if n == 0 {
            return Ok(());
        }
        let before = self.rx.cons;
        self.rx.cons += u64::from(n);
        self.rx.at_mark = false;
        if let RxUrgent::Valid { mark, .. } = self.rx.urg {
            if self.cfg.oob_inline && before <= mark && self.rx.cons > mark {
                // UR-3: urgent byte consumed in-band: update whatever the window.
                self.request_update();
            }
        }
        self.rx_skip_urgent_if_at_mark();
        if self.consumer_update_due() {
            self.request_update();
        }
        Ok(())
    }

    /// RFC 7609 §4.5.1 / Linux policy for a dedicated consumer update after consumption.
    fn consumer_update_due(&self) -> bool {
        let gain = self.rx.cons - self.rx.cons_sent;
        if gain == 0 {
            return false;
        }
        let blocked = self.rx.peer_flags.contains(ProducerFlags::WRITE_BLOCKED);
        if self.rx.peer_flags.contains(ProducerFlags::CONS_UPDATE_REQ) {
            return true;
        }
        let cap = u64::from(self.local.cap());
        // The writer's window as the writer sees it: from the last cursor we sent.
        let writer_window = cap.saturating_sub(self.rx.prod.saturating_sub(self.rx.cons_sent));
        match self.cfg.update_policy {
            UpdatePolicy::Rfc => blocked || (2 * writer_window < cap && 10 * gain >= cap),
            UpdatePolicy::Linux { min_update } => {
                // Clamped to cap/2 so that a small RMBE still gets updates (Linux's
                // RMBEs are at least 16 KiB, where the clamp never applies).
                let limit = (cap / 10).max(u64::from(min_update)).min(cap / 2);
                gain > limit && (writer_window <= cap / 2 || blocked)
            }
        }
    }

    /// The peer is done sending and everything it sent has been read: `read()` = 0.
    pub fn rx_eof(&self) -> bool {
        if self.rx.shut_rd {
            return true;
        }
        self.error.is_none()
            && self
                .cl
                .peer
                .intersects(ConnStateFlags::PEER_DONE_WRITING | ConnStateFlags::PEER_CONN_CLOSED)
            && self.rx_readable() == 0
            && self.rx.cons >= self.rx.prod
    }

    /// `recv(MSG_OOB)`: the urgent byte, once.
    pub fn read_oob(&mut self) -> Result<u8, OobError> {
        if self.cfg.oob_inline {
            return Err(OobError::Inline);
        }
        match &mut self.rx.urg {
            RxUrgent::Valid {
                byte,
                oob_read: read @ false,
                ..
            } => {
                *read = true;
                Ok(*byte)
            }
            RxUrgent::Pending => Err(OobError::WouldBlock),
            _ => Err(OobError::NoUrgentData),
        }
    }

    /// SIOCATMARK: the next byte the application reads is the one after the urgent
    /// mark (without OOBINLINE) or the urgent byte itself (with it).
    pub fn at_mark(&self) -> bool {
        match self.rx.urg {
            RxUrgent::Valid { mark, .. } => {
                if self.cfg.oob_inline {
                    self.rx.cons == mark
                } else {
                    self.rx.at_mark
                }
            }
            _ => false,
        }
    }

    /// Urgent data is announced or present and not yet read (poll exception condition).
    pub fn urgent_pending(&self) -> bool {
        match self.rx.urg {
            RxUrgent::None => false,
            RxUrgent::Pending => true,
            RxUrgent::Valid { mark, oob_read, .. } => {
                if self.cfg.oob_inline {
                    self.rx.cons <= mark
                } else {
                    !oob_read
                }
            }
        }
    }

    /// `shutdown(SHUT_RD)`: reads return EOF from now on. No network flow (TRM-1);
    /// data still arriving stays unread, so a later close aborts (§4.8.1 3A).
    pub fn shutdown_read(&mut self) {
        self.rx.shut_rd = true;
        self.events |= Events::READABLE;
    }

    /// Stream bytes consumed so far (a skipped urgent byte counts).
    pub fn rx_consumed(&self) -> u64 {
        self.rx.cons
    }

    /// Unread data in our RMBE (a close now would abort, §4.8.1 3A).
    pub fn rx_unread(&self) -> u64 {
        self.rx.prod - self.rx.cons
    }

    /// Drop unread data (abort, §4.8.2 2A). No update is sent for it.
    pub(super) fn rx_purge(&mut self) {
        self.rx.cons = self.rx.prod;
        self.rx.urg = RxUrgent::None;
        self.rx.at_mark = false;
        self.rx.update_needed = false;
    }
}
