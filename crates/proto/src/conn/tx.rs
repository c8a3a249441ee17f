//! The send side: the sndbuf ring, RDMA WRITE placement into the peer's RMBE, the CDC
//! that follows, the writer-blocked flag, urgent data, send completions and the
//! failover replay (RFC 7609 §4.5, §4.6, §4.7; CHECKLIST B.18–B.20, B.23).
//!
//! Positions are stream byte counts since the connection started:
//! `acked ≤ sent ≤ app` index the sndbuf ring (`pos mod sndbuf_len`), and stream byte
//! `s` lands at peer-RMBE position `p0 + s` (see [`super::cursor`]).
//!
//! * `app`: committed by the application (Linux `tx_curs_prep`).
//! * `sent`: covered by posted RDMA WRITEs; the producer cursor we advertise.
//! * `acked`: covered by a CDC whose send completed; sndbuf space up to here is free
//!   again (Linux `tx_curs_fin`): the writes before that CDC completed too (RC order).
//! * `peer_cons`: the peer's consumer cursor, the left edge of our window:
//!   `sent − peer_cons ≤ cap` at all times (WIN-1).
//! * `placed`: bytes up to here that the application put straight into the peer's RMBE
//!   ([`Conn::tx_place_space`], a path that maps it) instead of the sndbuf; no write
//!   moves them, the CDC announcing them is all that follows. `placed ≤ app`.

use std::time::{Duration, Instant};

use tracing::{debug, trace};

use super::cdc::{CdcRepr, ConnStateFlags, ProducerFlags};
use super::{Conn, ConnError, Events, InflightEntry, Regions, RmbeWrite, State, Transmit};

#[derive(Debug)]
pub(super) struct TxState {
    /// Peer-RMBE position of stream byte 0.
    pub(super) p0: u64,
    pub(super) app: u64,
    pub(super) sent: u64,
    /// Highest `sent` ever (a failover rewinds `sent`; the peer may have seen more).
    pub(super) sent_max: u64,
    pub(super) acked: u64,
    pub(super) peer_cons: u64,
    pub(super) placed: u64,
    /// The last CDC we posted had B set.
    pub(super) b_sent: bool,
    /// Stream index of an urgent byte not yet covered by a CDC with U.
    pub(super) urg: Option<u64>,
    /// A CDC with P has been posted for `urg`.
    pub(super) p_signalled: bool,
    /// Urgent byte announced with U; no new WRITE until the peer consumes up to it
    /// (RFC 7609 §4.7.5 step 3).
    pub(super) hold: Option<u64>,
    pub(super) stall_deadline: Option<Instant>,
    /// R is set on our CDCs (after a stall probe, until the writer is unblocked).
    pub(super) r_active: bool,
    /// A probe CDC with R is due.
    pub(super) r_needed: bool,
    /// `TCP_CORK` is set ([`Conn::set_cork`]).
    pub(super) corked: bool,
    /// While corked: when the data held since the last transmission must go anyway.
    pub(super) cork_deadline: Option<Instant>,
    /// Send what is held once, cork or not (`TCP_NODELAY` set while corked, tcp(7)).
    pub(super) cork_push: bool,
}

impl TxState {
    pub(super) fn new(p0: u64) -> Self {
        TxState {
            p0,
            app: 0,
            sent: 0,
            sent_max: 0,
            acked: 0,
            peer_cons: 0,
            placed: 0,
            b_sent: false,
            urg: None,
            p_signalled: false,
            hold: None,
            stall_deadline: None,
            r_active: false,
            r_needed: false,
            corked: false,
            cork_deadline: None,
            cork_push: false,
        }
    }
}

/// How long `TCP_CORK` holds partial data at most (tcp(7): "a 200 millisecond ceiling";
/// Linux SMC's own is SMC_TX_CORK_DELAY, 250 ms).
pub const CORK_MAX_HOLD: Duration = Duration::from_millis(200);

impl Conn {
    /// Where the application may copy data: up to two regions of the sndbuf.
    ///
    /// Errors when writing is no longer possible: after `shutdown_write`/`close`
    /// ([`ConnError::SendShutdown`]), after the peer's C ([`ConnError::PeerClosed`], it
    /// will read no more, §4.8.1 4A), or when the connection failed.
    pub fn tx_space(&self) -> Result<Regions, ConnError> {
        self.check_writable()?;
        let free = self.tx_sndbuf_free();
        Ok(Regions::ring(0, self.sndbuf_len, self.tx.app, free))
    }

    /// Make the next `n` bytes copied into [`Conn::tx_space`] part of the stream.
    /// With `urgent`, the last of them is the urgent byte (`MSG_OOB`, BSD semantics,
    /// CHECKLIST AMB-42); a newer urgent byte supersedes one not yet sent.
    pub fn tx_commit(&mut self, n: u32, urgent: bool) -> Result<(), ConnError> {
        self.check_writable()?;
        let free = self.tx_sndbuf_free();
        if u64::from(n) > free {
            return Err(ConnError::InvalidLength {
                requested: n.into(),
                available: free,
            });
        }
        if n == 0 {
            return Ok(());
        }
        self.tx.app += u64::from(n);
        if urgent {
            self.tx.urg = Some(self.tx.app - 1);
            self.tx.p_signalled = false;
        }
        self.events |= Events::TRANSMIT;
        Ok(())
    }

    /// Where the application may put the next bytes straight into the peer's RMBE
    /// instead of the sndbuf, on a path where the element is mapped into our memory
    /// (same-host shared memory): up to two regions, offsets in the element as
    /// [`RmbeWrite::dst_off`], at most what the peer's window (WIN-1) and the sndbuf's
    /// free space take. Empty while bytes wait in the sndbuf (they go first, in stream
    /// order), while an urgent byte is pending or held (RFC 7609 §4.7.5), or while the
    /// window is closed: then write through [`Conn::tx_space`]. Errors as `tx_space`.
    ///
    /// Placed bytes are not in the sndbuf, so nothing can write them again: only for a
    /// path whose CDCs cannot be lost and that never fails over (a
    /// [`Conn::prepare_failover`] with placed bytes unconfirmed ends the connection).
    pub fn tx_place_space(&self) -> Result<Regions, ConnError> {
        self.check_writable()?;
        if !self.tx_may_place() {
            return Ok(Regions::default());
        }
        let n = self.tx_sndbuf_free().min(self.tx_window());
        Ok(Regions::ring(
            self.peer.data_off(),
            self.peer.cap(),
            self.tx.p0 + self.tx.sent,
            n,
        ))
    }

    /// Whether [`Conn::tx_place_space`] is empty only because the peer's window is
    /// closed: nothing waits in the sndbuf, no urgent byte, the connection writable. A
    /// blocking writer may then wait a little for the peer's consumer cursor rather
    /// than copy into the sndbuf (and later out of it again).
    pub fn tx_place_awaits_window(&self) -> bool {
        self.check_writable().is_ok()
            && self.tx_may_place()
            && self.tx_window() == 0
            && self.tx_sndbuf_free() > 0
    }

    /// Placing keeps the stream in order and the urgent rules: nothing waits in the
    /// sndbuf, no urgent byte is pending or held (RFC 7609 §4.7.5), the link is up.
    fn tx_may_place(&self) -> bool {
        self.tx.app == self.tx.sent
            && self.tx.urg.is_none()
            && self.tx.hold.is_none()
            && !self.link_failed
    }

    /// Free sndbuf space: what is not committed-and-unconfirmed.
    fn tx_sndbuf_free(&self) -> u64 {
        u64::from(self.sndbuf_len) - (self.tx.app - self.tx.acked)
    }

    /// Make the next `n` bytes placed into [`Conn::tx_place_space`] part of the stream:
    /// the next [`Conn::poll_transmit`] announces them with its CDC and no write
    /// ([`Transmit::placed`]). They take sndbuf space until that CDC completes, as
    /// written bytes do, so a writer alternating between both paths sees one budget.
    pub fn tx_place_commit(&mut self, n: u32) -> Result<(), ConnError> {
        let room = self.tx_place_space()?.total();
        if u64::from(n) > room {
            return Err(ConnError::InvalidLength {
                requested: n.into(),
                available: room,
            });
        }
        if n > 0 {
            // Placing needs `app == sent` (tx_place_space): these bytes follow
            // everything written, so `placed` can simply move to the new end.
            self.tx_commit(n, false)?;
            self.tx.placed = self.tx.app;
        }
        Ok(())
    }

    /// Stream bytes committed by the application so far.
    pub fn tx_committed(&self) -> u64 {
        self.tx.app
    }

    /// Bytes committed and not yet delivered (not yet reclaimed from the sndbuf).
    pub fn tx_outstanding(&self) -> u64 {
        self.tx.app - self.tx.acked
    }

    fn check_writable(&self) -> Result<(), ConnError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if self.cl.app_shut_wr {
            return Err(ConnError::SendShutdown);
        }
        if self.cl.peer.contains(ConnStateFlags::PEER_CONN_CLOSED) {
            return Err(ConnError::PeerClosed);
        }
        match self.state {
            State::Active | State::AppCloseWait1 => Ok(()),
            _ => Err(ConnError::Closed),
        }
    }

    /// Free space in the peer's RMBE as we know it.
    fn tx_window(&self) -> u64 {
        u64::from(self.peer.cap()) - (self.tx.sent - self.tx.peer_cons)
    }

    /// Bytes that may be written now: window, urgent hold and urgent boundary applied.
    fn tx_sendable(&self) -> u64 {
        let end = match (self.tx.hold, self.tx.urg) {
            (Some(_), _) => self.tx.sent,
            // Up to and including the urgent byte; what follows waits for the hold.
            (None, Some(u)) => u + 1,
            (None, None) => self.tx.app,
        };
        end.saturating_sub(self.tx.sent).min(self.tx_window())
    }

    /// Data is waiting and cannot be written (window closed or urgent hold).
    pub(super) fn tx_blocked(&self) -> bool {
        self.tx.app > self.tx.sent
            && (self.tx_window() == 0 || self.tx.hold.is_some())
            && !matches!(
                self.state,
                State::Closed | State::PeerAbortWait | State::ProcessAbort
            )
    }

    /// Corking (RFC 7609 §4.5.2 "may coalesce"): Linux-style autocorking that defers a
    /// small write only while an earlier CDC is in flight; its completion flushes.
    fn should_cork(&self, n: u64) -> bool {
        let limit = u64::from(self.cfg.cork_limit.min(self.sndbuf_len / 2));
        self.cfg.cork
            && !self.cfg.nodelay
            && n > 0
            && n < limit
            && n == self.tx.app - self.tx.sent
            && !self.inflight.is_empty()
            && self.tx.urg.is_none()
            && self.cl.want.is_empty()
    }

    /// `TCP_CORK` (tcp(7); Linux SMC honours it in `smc_tx_should_cork`): hold the
    /// data the application writes until the send buffer is full, the cork is removed,
    /// or [`CORK_MAX_HOLD`] has passed since the first byte was held. Urgent data and
    /// the closing flags are never held (they flush what precedes them).
    fn cork_holds(&mut self, n: u64, now: Instant) -> bool {
        if !self.tx.corked || n == 0 || std::mem::take(&mut self.tx.cork_push) {
            self.tx.cork_deadline = None;
            return false;
        }
        // A full send buffer, or more unsent than the peer's window takes now (TCP sends
        // full segments while corked): nothing is gained by waiting.
        let full = self.tx.app - self.tx.acked >= u64::from(self.sndbuf_len)
            || self.tx.app - self.tx.sent > n;
        if full || self.tx.urg.is_some() || !self.cl.want.is_empty() {
            self.tx.cork_deadline = None;
            return false;
        }
        match self.tx.cork_deadline {
            None => {
                self.tx.cork_deadline = Some(now + CORK_MAX_HOLD);
                true
            }
            Some(d) if now < d => true,
            Some(_) => {
                self.tx.cork_deadline = None;
                false
            }
        }
    }

    /// The next RDMA WRITEs + CDC to post, if any. Call until `None` after every input.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        let t = self.next_transmit(now);
        self.update_stall(now);
        t
    }

    fn next_transmit(&mut self, now: Instant) -> Option<Transmit> {
        if self.link_failed || self.inflight.is_full() {
            return None;
        }
        // TRM-2: after C or A we send nothing more.
        if self
            .cl
            .sent
            .intersects(ConnStateFlags::PEER_CONN_CLOSED | ConnStateFlags::PEER_CONN_ABORT)
        {
            return None;
        }
        // §4.8.2 1A/2B: the abort indicator goes out before anything else.
        if self.cl.want.contains(ConnStateFlags::PEER_CONN_ABORT) {
            return Some(self.emit(0, ConnStateFlags::PEER_CONN_ABORT, now));
        }
        if self.state == State::Closed {
            // Only a C whose CDC was lost in a link failure is sent again.
            let replay_c = self.cl.want.contains(ConnStateFlags::PEER_CONN_CLOSED)
                && !self.cl.sent.contains(ConnStateFlags::PEER_CONN_CLOSED)
                && self.inflight.is_empty();
            return replay_c.then(|| self.emit(0, ConnStateFlags::PEER_CONN_CLOSED, now));
        }
        if matches!(self.state, State::PeerAbortWait | State::ProcessAbort) {
            return None;
        }
        let mut n = self.tx_sendable();
        if self.cork_holds(n, now) {
            trace!(token = self.local_token, n, "held by TCP_CORK");
            n = 0;
        } else if self.should_cork(n) {
            trace!(token = self.local_token, n, "corked");
            n = 0;
        }
        // §4.8.1 3A: D/C only once all data is written and every earlier CDC completed.
        let new_close = self.cl.want - self.cl.sent;
        let close_ready = !new_close.is_empty()
            && self.tx.app == self.tx.sent
            && self.inflight.is_empty()
            && n == 0;
        let update = self.rx.update_needed && self.rx.cons != self.rx.cons_sent;
        let need_b = self.tx.app > self.tx.sent && self.tx_window() == 0 && !self.tx.b_sent;
        let need_p = self.tx.urg.is_some() && !self.tx.p_signalled;
        if n == 0 && !close_ready && !need_b && !need_p && !update && !self.tx.r_needed {
            return None;
        }
        let flags = if close_ready {
            new_close
        } else {
            ConnStateFlags::empty()
        };
        Some(self.emit(n, flags, now))
    }

    /// Build and record one transmit of `n` bytes (possibly 0) and `close_new` flags.
    fn emit(&mut self, n: u64, close_new: ConnStateFlags, now: Instant) -> Transmit {
        let seq = self.tx_seq.wrapping_add(1);
        self.tx_seq = seq;
        let mut t = Transmit {
            writes: [RmbeWrite::default(); 3],
            n_writes: 0,
            placed: 0,
            cdc: CdcRepr::default(),
        };
        self.split_writes(n, &mut t);
        let sent = self.tx.sent + n;
        let window = u64::from(self.peer.cap()) - (sent - self.tx.peer_cons);

        let mut pf = ProducerFlags::empty();
        // WIN-9: left-over data that does not fit the window.
        if self.tx.app > sent && window == 0 {
            pf |= ProducerFlags::WRITE_BLOCKED;
        }
        let covered = self.tx.urg.filter(|&u| u < sent);
        if self.tx.urg.is_some() {
            pf |= ProducerFlags::URG_PENDING;
        }
        if covered.is_some() {
            pf |= ProducerFlags::URG_PRESENT;
        }
        if self.tx.r_active {
            pf |= ProducerFlags::CONS_UPDATE_REQ;
        }
        let conn_flags = self.cl.sent | close_new;
        t.cdc = CdcRepr {
            seqno: seq,
            token: self.peer_token,
            prod: self.peer.cursor_at(self.tx.p0 + sent),
            // CDC-5: every CDC carries the current consumer cursor.
            cons: self.local.cursor_at(self.rx.r0 + self.rx.cons),
            prod_flags: pf,
            conn_flags,
        };

        self.tx.sent = sent;
        self.tx.sent_max = self.tx.sent_max.max(sent);
        self.tx.b_sent = pf.contains(ProducerFlags::WRITE_BLOCKED);
        self.tx.r_needed = false;
        if let Some(u) = covered {
            self.tx.urg = None;
            self.tx.p_signalled = false;
            self.tx.hold = Some(u);
            self.tx_check_hold_release();
        } else if pf.contains(ProducerFlags::URG_PENDING) {
            self.tx.p_signalled = true;
        }
        self.rx.cons_sent = self.rx.cons;
        self.rx.cons_posted_max = self.rx.cons_posted_max.max(self.rx.cons);
        self.rx.update_needed = false;
        self.cl.sent |= close_new;
        self.inflight.push(InflightEntry {
            seq,
            tx_end: sent,
            cons: self.rx.cons,
            flags: conn_flags,
        });
        trace!(
            token = self.local_token,
            seq,
            bytes = n,
            prod = ?t.cdc.prod,
            cons = ?t.cdc.cons,
            flags = ?pf,
            conn_flags = ?conn_flags,
            "cdc out"
        );
        if !close_new.is_empty() {
            self.on_close_flags_posted(close_new, now);
        }
        t
    }

    /// Cut `[sent, sent + n)` at the sndbuf wrap and at the peer-RMBE wrap (WIN-2),
    /// less the bytes already placed in the peer's RMBE (a prefix: placing needs the
    /// sndbuf empty, [`Conn::tx_place_space`]).
    fn split_writes(&self, n: u64, t: &mut Transmit) {
        let mut done = self.tx.placed.saturating_sub(self.tx.sent).min(n);
        t.placed = done as u32;
        while done < n {
            let s = self.tx.sent + done;
            let src_off = (s % u64::from(self.sndbuf_len)) as u32;
            let dst_off = self.peer.offset_of(self.tx.p0 + s);
            let len = (n - done)
                .min(u64::from(self.sndbuf_len - src_off))
                .min(u64::from(self.peer.elem_len() - dst_off));
            // n ≤ min(sndbuf_len, cap): each ring wraps at most once, so ≤ 3 pieces.
            t.writes[usize::from(t.n_writes)] = RmbeWrite {
                src_off,
                len: len as u32,
                dst_off,
            };
            t.n_writes += 1;
            done += len;
        }
    }

    /// Blocked-writer bookkeeping after every poll: arm the stall probe while blocked,
    /// forget it once unblocked.
    fn update_stall(&mut self, now: Instant) {
        if self.tx_blocked() {
            if self.tx.stall_deadline.is_none() && !self.tx.r_active {
                self.tx.stall_deadline = self.cfg.stall_probe.map(|d| now + d);
            }
        } else {
            self.tx.stall_deadline = None;
            self.tx.r_active = false;
        }
    }

    /// Release the urgent hold once the peer's consumer reached the configured point.
    pub(super) fn tx_check_hold_release(&mut self) {
        if let Some(h) = self.tx.hold {
            let point = match self.cfg.urgent_release {
                super::UrgentRelease::AtMark => h,
                super::UrgentRelease::PastMark => h + 1,
            };
            if self.tx.peer_cons >= point {
                trace!(token = self.local_token, "urgent hold released");
                self.tx.hold = None;
                self.events |= Events::WRITABLE;
                if self.tx.app > self.tx.sent {
                    self.events |= Events::TRANSMIT;
                }
            }
        }
    }

    /// Apply `d` bytes of consumer progress from the peer (already validated).
    pub(super) fn tx_peer_consumed(&mut self, d: u64) {
        self.tx.peer_cons += d;
        self.tx.stall_deadline = None;
        if self.tx.peer_cons > self.tx.sent {
            // Only after a failover rewind: the peer consumed bytes we were about to
            // replay, so it has them. Do not write them again.
            self.tx.sent = self.tx.peer_cons;
            if self.tx.urg.is_some_and(|u| u < self.tx.sent) {
                self.tx.urg = None;
                self.tx.p_signalled = false;
            }
        }
        self.tx_reclaim_consumed();
        self.events |= Events::WRITABLE;
        if self.tx.app > self.tx.sent {
            self.events |= Events::TRANSMIT;
        }
        self.tx_check_hold_release();
    }

    /// Bytes the peer consumed were delivered, so their sndbuf space is free — but only
    /// once no posted WR can still read them (a failover replay may be in flight).
    fn tx_reclaim_consumed(&mut self) {
        if self.inflight.is_empty() && self.tx.peer_cons > self.tx.acked {
            self.tx.acked = self.tx.peer_cons;
            self.events |= Events::WRITABLE;
        }
    }

    /// Send completion of the CDC `seq` (and, RC being in order, of everything posted
    /// before it): reclaim sndbuf space, advance SS (§4.6.1).
    pub fn on_cdc_sent(&mut self, seq: u16) {
        let Some(k) = self.inflight.position(seq) else {
            trace!(token = self.local_token, seq, "completion for unknown cdc");
            return;
        };
        for _ in 0..=k {
            let Some(e) = self.inflight.pop() else { break };
            if e.tx_end > self.tx.acked {
                self.tx.acked = e.tx_end;
                self.events |= Events::WRITABLE;
            }
            self.ss = e.seq;
            self.rx.cons_confirmed = e.cons;
            let newly = e.flags - self.cl.confirmed;
            self.cl.confirmed |= e.flags;
            if newly
                .intersects(ConnStateFlags::PEER_DONE_WRITING | ConnStateFlags::PEER_CONN_CLOSED)
                && !self.cl.fin_signalled
            {
                // TRM-3: the TCP FIN follows the SMC-R close flags.
                self.cl.fin_signalled = true;
                self.events |= Events::TCP_SHUTDOWN;
            }
            if newly.contains(ConnStateFlags::PEER_CONN_ABORT) && self.state == State::ProcessAbort
            {
                // §4.8.2 2B: our abort indicator is out; the RMBE is free.
                self.enter_closed();
            }
        }
        self.tx_reclaim_consumed();
        if self.state != State::Closed
            && (self.tx.app > self.tx.sent || !(self.cl.want - self.cl.sent).is_empty())
        {
            self.events |= Events::TRANSMIT;
        }
    }

    /// The CDC `seq` (or a WRITE before it) failed: the link is down. Nothing more is
    /// transmitted until [`Conn::prepare_failover`] or [`Conn::kill`].
    pub fn on_cdc_send_failed(&mut self, seq: u16) {
        if self.inflight.position(seq).is_some() && !self.link_failed {
            debug!(token = self.local_token, seq, "cdc send failed, link down");
            self.link_failed = true;
        }
    }

    /// Move the connection to a new link (RFC 7609 §4.6): returns the failover
    /// validation CDC to send first on the new link (F = 1, seq = SS, consumes no seqno),
    /// or `None` if the connection is closed. Every CDC still in flight counts as lost:
    /// call this only after the old link's outstanding completions were delivered
    /// (§2.3: writes must complete, successfully or in error, before moving).
    ///
    /// The next [`Conn::poll_transmit`] calls replay what was not confirmed: data from
    /// the last known-delivered position, and any D/C/A or urgent indication that was
    /// not confirmed, with seqnos above every failed one (§4.6.2, "combine" option).
    pub fn prepare_failover(&mut self) -> Option<CdcRepr> {
        if self.state == State::Closed
            && !(self.cl.sent - self.cl.confirmed).contains(ConnStateFlags::PEER_CONN_CLOSED)
        {
            self.inflight.clear();
            self.link_failed = false;
            return None;
        }
        if self.tx.placed > self.tx.acked {
            // Placed bytes were never in the sndbuf: nothing could replay them.
            debug!(
                token = self.local_token,
                "failover with placed bytes unconfirmed"
            );
            self.kill(super::AbortReason::LinkLost);
            return None;
        }
        let lost = self.inflight.len;
        self.inflight.clear();
        self.link_failed = false;
        // Bytes the peer consumed were delivered even if their completion was lost. The
        // space they free in the send buffer is news to a writer waiting for it: without
        // WRITABLE it would sleep for ever once nothing else is in flight (each side of a
        // busy echo stalled with exactly one send buffer written, multilink tests).
        if self.tx.peer_cons > self.tx.acked {
            self.tx.acked = self.tx.peer_cons;
            self.events |= Events::WRITABLE;
        }
        self.tx.sent = self.tx.acked;
        if self.error.is_some() || self.state == State::Closed {
            // Aborting or closed: unconfirmed data is not replayed, only the flags.
            self.tx.app = self.tx.sent;
        }
        if let Some(h) = self.tx.hold {
            if h >= self.tx.sent {
                // The urgent byte is replayed: announce it again.
                self.tx.hold = None;
                if self.tx.urg.is_none() {
                    self.tx.urg = Some(h);
                }
            }
        }
        self.tx.p_signalled = false;
        self.tx.b_sent = false;
        self.cl.sent = self.cl.confirmed;
        self.rx.cons_sent = self.rx.cons_confirmed;
        self.rx.update_needed = self.rx.cons != self.rx.cons_sent;
        self.events |= Events::TRANSMIT;
        debug!(
            token = self.local_token,
            ss = self.ss,
            lost,
            "failover: replaying unconfirmed writes"
        );
        Some(CdcRepr {
            seqno: self.ss,
            token: self.peer_token,
            prod: self.peer.cursor_at(self.tx.p0 + self.tx.sent),
            cons: self.local.cursor_at(self.rx.r0 + self.rx.cons_sent),
            prod_flags: ProducerFlags::FAILOVER_VALIDATION,
            conn_flags: ConnStateFlags::empty(),
        })
    }

    /// Whether an urgent byte is committed and not yet acknowledged by the peer's
    /// consumer cursor (the writer holds further writes meanwhile).
    pub fn tx_urgent_outstanding(&self) -> bool {
        self.tx.urg.is_some() || self.tx.hold.is_some()
    }

    /// Drop everything not yet written (abort, §4.8.2 2A).
    pub(super) fn tx_purge(&mut self) {
        self.tx.app = self.tx.sent;
        self.tx.placed = self.tx.placed.min(self.tx.app);
        self.tx.urg = None;
        self.tx.hold = None;
        self.tx.p_signalled = false;
        self.tx.stall_deadline = None;
        self.tx.r_active = false;
        self.tx.r_needed = false;
    }
}
