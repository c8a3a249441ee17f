//! Connection termination: the normal flows of RFC 7609 §4.8.1 (Fig 22) and the
//! abnormal ones of §4.8.2 (Fig 23); CHECKLIST B.24, B.25, AMB-44.
//!
//! Local requests only *want* a flag (D, C or A); the flag goes out in a CDC from
//! [`Conn::poll_transmit`], and the state changes when that CDC is posted — this is the
//! RFC's "pending close" (3A): D and C wait until every byte is written and every
//! earlier CDC has completed. The abort flag A goes out ahead of anything else.
//!
//! The TCP connection is closed the way the RFC says: FIN only after our D/C has been
//! delivered ([`Events::TCP_SHUTDOWN`], TRM-3), RST on active aborts and on termination
//! timer expiry ([`Events::TCP_RESET`]).

use std::fmt;
use std::time::Instant;

use tracing::debug;

use super::cdc::ConnStateFlags;
use super::{AbortReason, Conn, ConnError, Events};

/// Connection states of RFC 7609 Fig 22 (normal) and Fig 23 (abnormal). `Display` shows
/// the Linux `smc_diag` names; [`State::linux_code`] the Linux numbers.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum State {
    /// Data flows both ways.
    Active,
    /// We sent D or C (active close, 3A); waiting for the peer.
    PeerCloseWait1,
    /// The peer answered with D (3B); waiting for its C.
    PeerCloseWait2,
    /// The peer sent C while we had only shut down writing (3D); waiting for our app.
    AppFinCloseWait,
    /// The peer sent D or C first (passive close, 4A); waiting for our app.
    AppCloseWait1,
    /// Our app shut down writing after the peer's close (4B); waiting for its close.
    AppCloseWait2,
    /// We sent C after the peer's D (4C); waiting for the peer's C (4D).
    PeerFinCloseWait,
    /// We aborted (1A); waiting for the peer's A.
    PeerAbortWait,
    /// The peer aborted (2A); our A is being sent (2B).
    ProcessAbort,
    /// The RMBE is free (1, 3C, 3D, 4C, 4D, 1B, 2B).
    Closed,
}

impl State {
    /// Linux `enum smc_state` value (`smc_diag`).
    pub const fn linux_code(self) -> u8 {
        match self {
            State::Active => 1,
            State::Closed => 7,
            State::PeerCloseWait1 => 20,
            State::PeerCloseWait2 => 21,
            State::AppCloseWait1 => 22,
            State::AppCloseWait2 => 23,
            State::AppFinCloseWait => 24,
            State::PeerFinCloseWait => 25,
            State::PeerAbortWait => 26,
            State::ProcessAbort => 27,
        }
    }

    /// Linux `smc_diag` name.
    pub const fn linux_name(self) -> &'static str {
        match self {
            State::Active => "ACTIVE",
            State::Closed => "CLOSED",
            State::PeerCloseWait1 => "PEERCLOSEWAIT1",
            State::PeerCloseWait2 => "PEERCLOSEWAIT2",
            State::AppCloseWait1 => "APPCLOSEWAIT1",
            State::AppCloseWait2 => "APPCLOSEWAIT2",
            State::AppFinCloseWait => "APPFINCLOSEWAIT",
            State::PeerFinCloseWait => "PEERFINCLOSEWAIT",
            State::PeerAbortWait => "PEERABORTWAIT",
            State::ProcessAbort => "PROCESSABORT",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.linux_name())
    }
}

#[derive(Debug, Default)]
pub(super) struct CloseState {
    /// The application shut down writing (shutdown(SHUT_WR), close or abort).
    pub(super) app_shut_wr: bool,
    /// The application closed (close or shutdown(SHUT_RDWR)).
    pub(super) app_closed: bool,
    /// Flags we want the peer to see.
    pub(super) want: ConnStateFlags,
    /// Flags posted (sticky: every later CDC repeats them, as Linux does).
    pub(super) sent: ConnStateFlags,
    /// Flags carried by a CDC whose send completed.
    pub(super) confirmed: ConnStateFlags,
    /// Flags received from the peer (sticky; C subsumes D, TRM-4).
    pub(super) peer: ConnStateFlags,
    /// Termination timer (§4.8.1, §4.8.2 1B).
    pub(super) deadline: Option<Instant>,
    /// TCP FIN already requested.
    pub(super) fin_signalled: bool,
}

impl Conn {
    /// `shutdown(SHUT_WR)`: send D once all data is out (§4.8.1 3A, 4B).
    pub fn shutdown_write(&mut self, _now: Instant) -> Result<(), ConnError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        match self.state {
            State::Active | State::AppCloseWait1 => {}
            State::Closed => return Err(ConnError::Closed),
            _ => return Ok(()),
        }
        if !self.cl.app_shut_wr {
            self.cl.app_shut_wr = true;
            self.cl.want |= ConnStateFlags::PEER_DONE_WRITING;
            self.events |= Events::TRANSMIT;
            debug!(token = self.local_token, state = %self.state, "shutdown write requested");
        }
        Ok(())
    }

    /// `close()` / `shutdown(SHUT_RDWR)`: send C once all data is out, or abort when
    /// unread data is left in our RMBE (§4.8.1 3A; Linux `smc_close_final`).
    pub fn close(&mut self, now: Instant) {
        if self.cl.app_closed {
            return;
        }
        self.cl.app_closed = true;
        self.cl.app_shut_wr = true;
        match self.state {
            State::Closed
            | State::PeerAbortWait
            | State::ProcessAbort
            | State::PeerFinCloseWait => return,
            _ => {}
        }
        if self.rx_unread() > 0 {
            self.abort_with(AbortReason::UnreadDataOnClose, now, true);
            return;
        }
        self.cl.want |= ConnStateFlags::PEER_CONN_CLOSED;
        self.events |= Events::TRANSMIT;
        // §4.8.1 "prevent being stranded in a termination state indefinitely": C waits
        // until our data is written (pending close, 3A), which a peer that never reads
        // would make last forever, and the application has let go of the socket. The
        // peer gets the termination timer's time, then the connection is aborted
        // (fuzz finding, `conn_cdc`: closed, window shut, peer silent → never CLOSED).
        if self.cl.deadline.is_none() {
            self.cl.deadline = Some(now + self.cfg.close_timeout);
        }
        debug!(token = self.local_token, state = %self.state, "close requested");
    }

    /// Active abort (§4.8.2 1A), e.g. `SO_LINGER` 0: purge, send A, reset TCP.
    pub fn abort(&mut self, now: Instant) {
        self.abort_with(AbortReason::Local, now, true);
    }

    /// The TCP connection was reset by the peer (§4.8.2): abort unless the peer's A
    /// already arrived.
    pub fn on_tcp_reset(&mut self, now: Instant) {
        self.abort_with(AbortReason::TcpReset, now, false);
    }

    /// The link group is gone (no link left, §4.8.3; B.23 FO-12): no CDC can be sent.
    /// Ends the connection at once and asks for a TCP reset.
    pub fn kill(&mut self, reason: AbortReason) {
        if self.state == State::Closed {
            return;
        }
        self.set_error(ConnError::Aborted(reason));
        self.rx_purge();
        self.tx_purge();
        self.inflight.clear();
        self.link_failed = false;
        self.events |= Events::TCP_RESET;
        self.enter_closed();
    }

    /// Start an active abort for `reason`; `rst`: also reset the TCP connection.
    pub(super) fn abort_with(&mut self, reason: AbortReason, now: Instant, rst: bool) {
        match self.state {
            State::Closed | State::PeerAbortWait | State::ProcessAbort => return,
            _ => {}
        }
        self.set_error(ConnError::Aborted(reason));
        self.cl.app_shut_wr = true;
        self.rx_purge();
        self.tx_purge();
        if rst {
            self.events |= Events::TCP_RESET;
        }
        if self.cl.sent.contains(ConnStateFlags::PEER_CONN_CLOSED) {
            // AMB-44: after C only a plain TCP reset is possible; no A follows C.
            self.enter_closed();
            return;
        }
        self.cl.want |= ConnStateFlags::PEER_CONN_ABORT;
        self.events |= Events::TRANSMIT;
        if self.cl.peer.contains(ConnStateFlags::PEER_CONN_CLOSED) {
            // The peer's C came first.
            self.abort_after_peer_close(now);
            return;
        }
        self.set_state(State::PeerAbortWait, now);
    }

    /// Our abort with the peer's C in (it came first, or crossed our A): nothing may
    /// follow a C (TRM-2), so no A will answer ours, and waiting for one (1A) would only
    /// hold the RMBE until the 1B timer. CLOSED once our A is confirmed, as a passive
    /// aborter's (2B): at once if it is, else in ProcessAbort (a failover still replays
    /// an A only posted).
    pub(super) fn abort_after_peer_close(&mut self, now: Instant) {
        if self.cl.confirmed.contains(ConnStateFlags::PEER_CONN_ABORT) {
            self.enter_closed();
        } else {
            self.set_state(State::ProcessAbort, now);
        }
    }

    /// A close flag has just been posted: Fig 22 transitions 3A, 4B, 4C, 3D.
    pub(super) fn on_close_flags_posted(&mut self, flags: ConnStateFlags, now: Instant) {
        let peer_closed = self.cl.peer.contains(ConnStateFlags::PEER_CONN_CLOSED);
        if flags.contains(ConnStateFlags::PEER_CONN_CLOSED) {
            match self.state {
                State::Active => self.set_state(State::PeerCloseWait1, now),
                State::AppCloseWait1 | State::AppCloseWait2 => {
                    if peer_closed {
                        self.enter_closed();
                    } else {
                        self.set_state(State::PeerFinCloseWait, now);
                    }
                }
                State::AppFinCloseWait => self.enter_closed(),
                _ => {}
            }
        } else if flags.contains(ConnStateFlags::PEER_DONE_WRITING) {
            match self.state {
                State::Active => self.set_state(State::PeerCloseWait1, now),
                State::AppCloseWait1 => self.set_state(State::AppCloseWait2, now),
                _ => {}
            }
        }
    }

    /// Connection-state flags from the peer (Fig 22 3B, 3C, 3D, 4A, 4D; Fig 23 2A).
    pub(super) fn on_peer_conn_flags(&mut self, flags: ConnStateFlags, now: Instant) {
        // Reserved bits are ignored (CHECKLIST AMB-37).
        let new = (flags & ConnStateFlags::all()) - self.cl.peer;
        if new.is_empty() {
            return;
        }
        self.cl.peer |= new;
        if new.contains(ConnStateFlags::PEER_CONN_ABORT) {
            self.on_peer_abort(now);
            return;
        }
        let closed = self.cl.peer.contains(ConnStateFlags::PEER_CONN_CLOSED);
        self.events |= Events::PEER_DONE | Events::READABLE;
        if closed {
            self.events |= Events::WRITABLE;
        }
        if new.contains(ConnStateFlags::PEER_CONN_CLOSED)
            && matches!(
                self.state,
                State::Active | State::AppCloseWait1 | State::AppCloseWait2
            )
            && self.tx.app > self.tx.sent
        {
            // 4A: the peer closed, our data can never be delivered: reset.
            self.abort_with(AbortReason::PeerClosedWithPendingData, now, true);
            return;
        }
        match self.state {
            State::Active => self.set_state(State::AppCloseWait1, now),
            State::PeerCloseWait1 | State::PeerCloseWait2 if closed => {
                if self.cl.sent.contains(ConnStateFlags::PEER_CONN_CLOSED) {
                    self.enter_closed(); // 3C
                } else {
                    self.set_state(State::AppFinCloseWait, now); // 3D
                }
            }
            State::PeerCloseWait1 => self.set_state(State::PeerCloseWait2, now), // 3B
            State::PeerFinCloseWait if closed => self.enter_closed(),            // 4D
            // AppCloseWait1/2: remember the C for 4C (TRM-4).
            _ => {}
        }
    }

    /// The peer's A arrived (§4.8.2 1B, 2A, 2B).
    pub(super) fn on_peer_abort(&mut self, now: Instant) {
        self.cl.peer |= ConnStateFlags::PEER_CONN_ABORT;
        match self.state {
            State::Closed | State::ProcessAbort => {}
            State::PeerAbortWait => {
                if self.cl.sent.contains(ConnStateFlags::PEER_CONN_ABORT) {
                    self.enter_closed(); // 1B
                } else {
                    // Concurrent aborts: our A still has to go out (both take path 1).
                    self.set_state(State::ProcessAbort, now);
                }
            }
            _ if self.cl.sent.contains(ConnStateFlags::PEER_CONN_CLOSED) => {
                // Nothing may follow our C: the RMBE is free.
                self.set_error(ConnError::Aborted(AbortReason::PeerAbort));
                self.rx_purge();
                self.enter_closed();
            }
            _ => {
                // 2A: report, purge in-flight data both ways; 2B: answer with A.
                self.set_error(ConnError::Aborted(AbortReason::PeerAbort));
                self.cl.app_shut_wr = true;
                self.rx_purge();
                self.tx_purge();
                self.cl.want |= ConnStateFlags::PEER_CONN_ABORT;
                self.events |= Events::TRANSMIT;
                self.set_state(State::ProcessAbort, now);
            }
        }
    }

    /// §4.8.1: "prevent being stranded in a termination state indefinitely".
    pub(super) fn close_timer_expired(&mut self, now: Instant) {
        match self.state {
            State::Active
            | State::AppCloseWait1
            | State::AppCloseWait2
            | State::AppFinCloseWait
                if self.cl.app_closed =>
            {
                // The pending close could not write its data in time: abort (A and a
                // TCP reset) rather than end with a C that hides the loss.
                debug!(token = self.local_token, state = %self.state, "pending close timed out");
                self.abort_with(AbortReason::CloseTimeout, now, true);
            }
            State::PeerCloseWait1 | State::PeerCloseWait2 | State::PeerFinCloseWait => {
                // TCP reset; no more RDMA writes (we already said we are done).
                debug!(token = self.local_token, state = %self.state, "termination timer expired");
                self.set_error(ConnError::Aborted(AbortReason::CloseTimeout));
                self.rx_purge();
                self.tx_purge();
                self.events |= Events::TCP_RESET;
                self.enter_closed();
            }
            State::PeerAbortWait | State::ProcessAbort => {
                debug!(token = self.local_token, state = %self.state, "abort timer expired");
                self.enter_closed();
            }
            _ => {}
        }
    }

    /// Change state and (re)arm the termination timer of the states that wait for the
    /// peer (AMB-44: all of them, not only PeerCloseWait1/2).
    pub(super) fn set_state(&mut self, new: State, now: Instant) {
        if new == self.state {
            return;
        }
        debug!(token = self.local_token, from = %self.state, to = %new, "conn state");
        self.state = new;
        self.cl.deadline = self.close_deadline(new, now);
    }

    /// The termination timer of a state (§4.8.1: "prevent being stranded in a termination
    /// state indefinitely"). It belongs to `close()`, not to `shutdown(SHUT_WR)`: a
    /// half-closed connection whose application still reads stays open as long as the
    /// peer keeps sending, as a half-closed TCP connection does (Linux arms no timer on
    /// `shutdown` either). So PeerCloseWait1/2 are timed only once the application closed;
    /// PeerFinCloseWait is only reached by `close()`; the abort states always are.
    fn close_deadline(&self, state: State, now: Instant) -> Option<Instant> {
        match state {
            State::PeerCloseWait1 | State::PeerCloseWait2 if !self.cl.app_closed => None,
            State::PeerCloseWait1 | State::PeerCloseWait2 | State::PeerFinCloseWait => {
                Some(now + self.cfg.close_timeout)
            }
            State::PeerAbortWait | State::ProcessAbort => Some(now + self.cfg.abort_timeout),
            // A pending close keeps its timer across the peer's D or C (see `close`).
            _ if self.cl.app_closed && !self.cl.sent.contains(ConnStateFlags::PEER_CONN_CLOSED) => {
                self.cl.deadline.or(Some(now + self.cfg.close_timeout))
            }
            _ => None,
        }
    }

    /// CLOSED: the RMBE may be reused (no more writes from either side).
    pub(super) fn enter_closed(&mut self) {
        if self.state == State::Closed {
            return;
        }
        debug!(token = self.local_token, from = %self.state, "conn closed");
        self.state = State::Closed;
        self.cl.deadline = None;
        self.tx.stall_deadline = None;
        self.tx.r_active = false;
        self.events |= Events::CLOSED | Events::READABLE | Events::WRITABLE;
    }
}
