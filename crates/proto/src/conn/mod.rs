//! One SMC-R connection's data path and termination, as a sans-I/O state machine.
//!
//! This module is the single source of truth for the data-path rules of RFC 7609 §4:
//! cursors and wrap arithmetic ([`cursor`]), the CDC message content ([`cdc`]), the send
//! side (`tx`: RDMA WRITE placement, the writer-blocked flag, urgent data, small sends),
//! the receive side (`rx`: cursor validation, the window-update rules of §4.5.1, urgent
//! data and the urgent mark), termination (`close`: Fig 22 and Fig 23) and the
//! connection-level failover hooks of §4.6.
//!
//! # How it is driven
//!
//! A [`Conn`] does no I/O, never blocks, never reads a clock and does not allocate after
//! [`Conn::new`]. It speaks in offsets: the runtime owns the send buffer (sndbuf), the
//! local RMB element and the verbs objects, and copies bytes itself.
//!
//! * Application write: [`Conn::tx_space`] gives up to two regions of the sndbuf to copy
//!   into, [`Conn::tx_commit`] makes them part of the stream (with `urgent = true` for
//!   `MSG_OOB`: the last committed byte is the urgent byte). A path that maps the peer's
//!   RMB into our memory (same-host) may instead copy straight into it:
//!   [`Conn::tx_place_space`] / [`Conn::tx_place_commit`] (one copy fewer).
//! * Transmit: [`Conn::poll_transmit`] returns a [`Transmit`]: up to three RDMA WRITEs
//!   (sndbuf offset → peer RMBE offset; a wrap of either ring splits a write, CHECKLIST
//!   WIN-2) followed by the CDC to SEND **on the same QP** (RFC 7609 §4.7.1, WIN-3: RC
//!   ordering places the data before the CDC is seen). Post exactly that, in order.
//!   Call it until it returns `None` after every input.
//! * Send completions: [`Conn::on_cdc_sent`] reclaims the sndbuf space covered by that
//!   CDC (like Linux `smc_cdc_tx_handler`) and advances SS (§4.6.1);
//!   [`Conn::on_cdc_send_failed`] stops transmission until [`Conn::prepare_failover`]
//!   (alternate link) or [`Conn::kill`] (no link left).
//! * Received CDC: [`Conn::handle_cdc`], on the receive-completion path.
//! * Application read: [`Conn::rx_available`] / [`Conn::rx_consume`], [`Conn::read_oob`],
//!   [`Conn::at_mark`], [`Conn::rx_eof`].
//! * Close: [`Conn::shutdown_write`], [`Conn::close`], [`Conn::abort`],
//!   [`Conn::on_tcp_reset`], [`Conn::kill`]; timers via [`Conn::poll_timeout`] /
//!   [`Conn::on_timeout`].
//! * After any call, [`Conn::take_events`] says what to wake up and what to do with the
//!   TCP socket ([`Events::TCP_SHUTDOWN`], [`Events::TCP_RESET`]) and when the RMBE is
//!   free again ([`Events::CLOSED`]).
//!
//! # Rules implemented here, and why
//!
//! * **Window** (RFC 7609 §2.1, A.4; WIN-1): the writer never writes past the peer's
//!   consumer cursor as it knows it: `sent − peer_cons ≤ cap`. Data is written whenever
//!   there is window (§4.5.2, no Nagle) unless corking is configured (SS-2); corking is
//!   Linux-style "autocorking": it only defers while a CDC is in flight, so the send
//!   completion is the flush timer and data is always eventually sent; `TCP_NODELAY`
//!   turns it off (SS-3). `TCP_CORK` ([`Conn::set_cork`], tcp(7), Linux SMC's
//!   `smc_tx_should_cork`) holds partial data for at most [`CORK_MAX_HOLD`] unless the
//!   send buffer or the window is full, urgent data or the close is due, or
//!   `TCP_NODELAY` is set.
//! * **B flag** (§4.5.1, §4.7.4; WIN-9): set on a CDC when data is left over that does
//!   not fit the window. If the application adds data while the window is already full
//!   and the last CDC said B = 0, a data-less CDC with B = 1 tells the peer (§4.7.6 step 1
//!   does the same with P).
//! * **Consumer updates** (§4.5.1; WIN-7..WIN-10): every CDC carries the current consumer
//!   cursor (piggy-back). A dedicated update is sent after a consumption when
//!   [`UpdatePolicy`] says so (RFC: writer's window `< cap/2` and gain `≥ cap/10`; Linux:
//!   `smc_tx_consumer_update`), when the peer's last CDC had B or R set, or when urgent
//!   data was consumed (UR-3). When a CDC with B, R or P arrives while consumed bytes
//!   are not yet advertised, the update goes out at once — otherwise a writer that
//!   filled the window after our last read would wait forever.
//! * **Validation** (A.4; WIN-11, WIN-12, AMB-38/39): seqnos older than the last one
//!   (16-bit serial arithmetic) are dropped, equal ones are processed idempotently;
//!   cursors that go backwards are ignored; a cursor outside `[data_off, len)`, a
//!   producer that overruns the window we advertised, or a consumer ahead of what we
//!   produced aborts the connection ([`Violation`]).
//! * **Urgent data** (§4.7.5, §4.7.6; B.20, AMB-42): BSD semantics, one urgent byte, the
//!   mark is producer cursor − 1 of the CDC with U. The byte occupies one ring byte and
//!   counts in the cursors in both OOBINLINE modes (as Linux does). Writer: P on every
//!   CDC from the `MSG_OOB` commit until the CDC with U (inclusive), a data-less P CDC if
//!   the byte cannot be written at once, then no new RDMA WRITE until the peer's
//!   consumer cursor reaches the mark ([`UrgentRelease`]). Receiver: latch the byte when
//!   U arrives, stop reads at the mark, skip the byte in-band unless OOBINLINE, and always
//!   advance past it and send the update.
//! * **Linux interop** (kernel-peer README §V4 (a)): a Linux receiver that had already
//!   read up to the mark when U arrived leaves its consumer cursor *on* the urgent byte
//!   and sends no update. So the default release point is "consumer reached the mark",
//!   and a writer that stays blocked for [`ConnConfig::stall_probe`] sends a CDC with R
//!   (consumer update requested, which §4.5.1 reserves for diagnosing a stalled
//!   receiver); Linux answers R with its current cursor, so neither side deadlocks.
//! * **Termination** (§4.8; B.24, B.25, AMB-44): see [`State`]. D and C go out only
//!   after all data has been written and every earlier CDC has completed (§4.8.1 3A
//!   "pending close"); nothing is sent after C or A (TRM-2); close with unread data
//!   aborts (3A); a C from the peer while we still have unsent data aborts (4A); every
//!   state that waits for the peer has a timer (AMB-44), the pending close too: data
//!   still unsent when it expires aborts the connection; after C was sent an abort is a
//!   plain TCP RST.
//! * **Failover** (§4.6; B.23): SS is the seqno of the last CDC whose send completed, SR
//!   the last CDC accepted. [`Conn::prepare_failover`] returns the F message (seq = SS,
//!   no seqno consumed) and rewinds the producer to what is known delivered, so the
//!   next transmits replay the unconfirmed writes *combined*, with seqnos above every
//!   failed one (§4.6.2 second option). On an F message the receiver resets the
//!   connection if SR < seq.

pub mod cdc;
mod close;
pub mod cursor;
mod rx;
#[cfg(any(test, feature = "testing"))]
pub mod sim;
mod tx;

#[cfg(test)]
mod tests;

use std::fmt;
use std::time::{Duration, Instant};

use bitflags::bitflags;
use tracing::{debug, warn};

pub use cdc::{seq_before, CdcRepr, ConnStateFlags, ProducerFlags};
pub use close::State;
pub use cursor::{Cursor, GeometryError, RmbeGeometry};
pub use tx::CORK_MAX_HOLD;

use close::CloseState;
use rx::RxState;
use tx::TxState;

/// When the consumer cursor is advertised in a dedicated CDC (RFC 7609 §4.5.1).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum UpdatePolicy {
    /// RFC 7609 §4.5.1 with the CHECKLIST AMB-41 reading: the writer's window computed
    /// from the last advertised cursor is strictly below `cap/2` **and** the update
    /// grows it by at least `cap/10`; or the peer's B flag is set (any consumption).
    #[default]
    Rfc,
    /// Linux `smc_tx_consumer_update`: unadvertised bytes exceed
    /// `max(cap/10, min_update)` **and** (the writer's free space is at most `cap/2`
    /// or the peer's B flag is set). Linux's `min_update` is `SOCK_MIN_SNDBUF / 2`.
    Linux {
        /// Lower bound of the update threshold in bytes.
        min_update: u32,
    },
}

impl UpdatePolicy {
    /// Linux's policy with its default threshold floor (`SOCK_MIN_SNDBUF / 2` = 2304 on
    /// x86-64).
    pub const fn linux() -> Self {
        UpdatePolicy::Linux { min_update: 2304 }
    }
}

/// When a writer that sent urgent data may write again (RFC 7609 §4.7.5 step 3).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum UrgentRelease {
    /// When the peer's consumer cursor has reached the urgent byte, i.e. all in-band
    /// data before the mark is consumed and the receiver has seen the mark. Safe with
    /// Linux receivers, which may never advance past the byte (kernel-peer §V4 (a)).
    #[default]
    AtMark,
    /// When the peer's consumer cursor is past the urgent byte (the RFC's literal
    /// "urgent data consumed"). A Linux receiver can deadlock this.
    PastMark,
}

/// Policy knobs of one connection.
#[derive(Clone, Debug)]
pub struct ConnConfig {
    /// Consumer-cursor update policy (§4.5.1).
    pub update_policy: UpdatePolicy,
    /// Coalesce small writes while a CDC is in flight (RFC 7609 §4.5.2 allows it;
    /// off by default: "data is always sent if sufficient window space is available").
    pub cork: bool,
    /// Writes of at least this many bytes (or half the sndbuf) are never corked.
    pub cork_limit: u32,
    /// `TCP_NODELAY`: stored for getsockopt (App. B.1) and disables corking.
    pub nodelay: bool,
    /// `SO_OOBINLINE`: deliver the urgent byte in the stream instead of out of band.
    pub oob_inline: bool,
    /// When writing resumes after urgent data.
    pub urgent_release: UrgentRelease,
    /// Termination timer of PeerCloseWait1/2 and PeerFinCloseWait (§4.8.1; like TCP's
    /// FIN_WAIT_2 timeout). On expiry the TCP connection is reset.
    pub close_timeout: Duration,
    /// Timer of PeerAbortWait and ProcessAbort (§4.8.2 1B).
    pub abort_timeout: Duration,
    /// After this long blocked (window closed or urgent hold) with data waiting and no
    /// consumer progress, send one CDC with R set (§4.5.1). `None` disables it.
    pub stall_probe: Option<Duration>,
    /// CDCs this connection may have posted and not yet completed (bounds the
    /// preallocated in-flight table; Linux has 16 send slots per link).
    pub max_inflight: u16,
}

impl Default for ConnConfig {
    fn default() -> Self {
        ConnConfig {
            update_policy: UpdatePolicy::Rfc,
            cork: false,
            cork_limit: 64 * 1024,
            nodelay: false,
            oob_inline: false,
            urgent_release: UrgentRelease::AtMark,
            close_timeout: Duration::from_secs(60),
            abort_timeout: Duration::from_secs(10),
            stall_probe: Some(Duration::from_secs(1)),
            max_inflight: 16,
        }
    }
}

/// What the connection needs to know at creation, once rendezvous is complete.
#[derive(Clone, Copy, Debug)]
pub struct ConnParams {
    /// Our RMB element (the peer writes into it).
    pub local_rmbe: RmbeGeometry,
    /// The peer's RMB element (we write into it).
    pub peer_rmbe: RmbeGeometry,
    /// Length of our send buffer.
    pub sndbuf_len: u32,
    /// The alert token we assigned; the peer puts it in CDCs to us.
    pub local_token: u32,
    /// The peer's alert token; we put it in CDCs to the peer.
    pub peer_token: u32,
    /// Our producer cursor in the peer's RMBE at start (= the peer's consumer cursor).
    pub tx_start: Cursor,
    /// The peer's producer cursor in our RMBE at start (= our consumer cursor).
    pub rx_start: Cursor,
}

impl ConnParams {
    /// Parameters of a fresh connection: all cursors at `(0, data_off)`.
    pub fn new(
        local_rmbe: RmbeGeometry,
        peer_rmbe: RmbeGeometry,
        sndbuf_len: u32,
        local_token: u32,
        peer_token: u32,
    ) -> Self {
        ConnParams {
            local_rmbe,
            peer_rmbe,
            sndbuf_len,
            local_token,
            peer_token,
            tx_start: peer_rmbe.initial(),
            rx_start: local_rmbe.initial(),
        }
    }
}

/// A protocol violation by the peer, detected on a CDC (CHECKLIST WIN-12, AMB-39).
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum Violation {
    /// Producer cursor offset outside `[data_off, len)` of our RMBE.
    #[error("producer cursor outside the RMBE data area")]
    ProducerOutOfRange,
    /// Producer cursor beyond the window we advertised (it overwrote unread data).
    #[error("producer cursor overruns the advertised window")]
    ProducerOverrun,
    /// Consumer cursor offset outside `[data_off, len)` of the peer's RMBE.
    #[error("consumer cursor outside the RMBE data area")]
    ConsumerOutOfRange,
    /// Consumer cursor beyond what we ever produced, or not within one window.
    #[error("consumer cursor ahead of the produced data")]
    ConsumerAhead,
    /// New data after the peer said it was done writing.
    #[error("data after PeerDoneWriting")]
    DataAfterDone,
    /// Same-host path: the peer broke the shared-memory ring (indices out of range, a
    /// slot that is no CDC).
    #[error("shared-memory ring broken by the peer")]
    SharedRing,
}

/// Why a connection ended abnormally.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum AbortReason {
    /// The application aborted (e.g. `SO_LINGER` 0).
    #[error("aborted by the application")]
    Local,
    /// `close()` with unread data in the RMBE (RFC 7609 §4.8.1 3A).
    #[error("closed with unread data")]
    UnreadDataOnClose,
    /// The peer sent PeerConnAbort (§4.8.2 2A).
    #[error("aborted by the peer")]
    PeerAbort,
    /// The TCP connection was reset (§4.8.2).
    #[error("TCP connection reset")]
    TcpReset,
    /// The peer closed while we still had data to send (§4.8.1 4A).
    #[error("peer closed with data still to send")]
    PeerClosedWithPendingData,
    /// The peer broke the protocol.
    #[error("protocol violation: {0}")]
    Violation(Violation),
    /// Failover validation showed lost data (§4.6.1).
    #[error("data lost in failover")]
    FailoverDataLoss,
    /// No link left to carry the connection (§4.8.3).
    #[error("no SMC-R link left")]
    LinkLost,
    /// The peer did not finish the close handshake in time (§4.8.1).
    #[error("termination timed out")]
    CloseTimeout,
    /// Same-host path: the peer process is gone (its TCP connection ended without the
    /// SMC close flags in its ring).
    #[error("same-host peer process gone")]
    PeerGone,
}

/// Errors reported to the application.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum ConnError {
    /// Bad buffer geometry.
    #[error(transparent)]
    Geometry(#[from] GeometryError),
    /// Bad connection parameters.
    #[error("invalid connection parameters: {0}")]
    InvalidParams(&'static str),
    /// Commit or consume of more bytes than offered.
    #[error("{requested} bytes requested, {available} available")]
    InvalidLength {
        /// Bytes asked for.
        requested: u64,
        /// Bytes that were available.
        available: u64,
    },
    /// The sending side was shut down locally (EPIPE).
    #[error("sending side is shut down")]
    SendShutdown,
    /// The peer closed the connection; nothing more can be sent.
    #[error("peer closed the connection")]
    PeerClosed,
    /// The connection is closed.
    #[error("connection closed")]
    Closed,
    /// The connection ended abnormally.
    #[error("connection aborted: {0}")]
    Aborted(AbortReason),
}

impl ConnError {
    /// The `std::io::ErrorKind` a socket API should report.
    pub fn io_kind(&self) -> std::io::ErrorKind {
        use std::io::ErrorKind as K;
        match self {
            ConnError::Geometry(_) | ConnError::InvalidParams(_) => K::InvalidInput,
            ConnError::InvalidLength { .. } => K::InvalidInput,
            ConnError::SendShutdown | ConnError::PeerClosed => K::BrokenPipe,
            ConnError::Closed => K::NotConnected,
            ConnError::Aborted(r) => match r {
                AbortReason::PeerAbort
                | AbortReason::TcpReset
                | AbortReason::PeerClosedWithPendingData => K::ConnectionReset,
                AbortReason::CloseTimeout => K::TimedOut,
                _ => K::ConnectionAborted,
            },
        }
    }
}

/// Result of [`Conn::read_oob`].
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum OobError {
    /// `SO_OOBINLINE` is set: the urgent byte is in the stream (EINVAL).
    #[error("urgent data is delivered inline")]
    Inline,
    /// Urgent data is announced (P) but not yet here (EAGAIN).
    #[error("urgent data not yet arrived")]
    WouldBlock,
    /// No unread urgent byte (EINVAL).
    #[error("no urgent data")]
    NoUrgentData,
}

/// What [`Conn::handle_cdc`] did with a message.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CdcOutcome {
    /// Processed.
    Accepted,
    /// Dropped: seqno older than the last one received (A.4).
    Stale,
    /// Dropped: not our alert token.
    WrongToken,
    /// Dropped: the connection is closed, or the peer already sent C/A, or we are
    /// waiting for the peer's abort (§4.8.2 1A: ignore all other activity).
    Ignored,
    /// A failover validation message that matched (SR ≥ seq).
    FailoverValidated,
    /// The message made us abort the connection.
    Aborted(AbortReason),
}

bitflags! {
    /// What happened during the calls since the last [`Conn::take_events`].
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
    pub struct Events: u16 {
        /// Data, EOF or an error is there for readers.
        const READABLE = 1 << 0;
        /// Send-buffer space, window or an error is there for writers.
        const WRITABLE = 1 << 1;
        /// Urgent data announced or arrived (POLLPRI / SIGURG).
        const URGENT = 1 << 2;
        /// The peer will send no more data (EOF once the RMBE is drained).
        const PEER_DONE = 1 << 3;
        /// The connection failed: see [`Conn::error`].
        const ERROR = 1 << 4;
        /// Our D or C has been delivered: shut down the TCP connection's sending side
        /// (FIN), after the SMC-R close flags as RFC 7609 §3.5.4/§4.8.1 require.
        const TCP_SHUTDOWN = 1 << 5;
        /// Reset the TCP connection (RST) (§4.8.1 timer expiry, §4.8.2).
        const TCP_RESET = 1 << 6;
        /// The connection reached CLOSED: the RMBE may be reused, the alert token
        /// released once no CDC for it can arrive any more.
        const CLOSED = 1 << 7;
        /// [`Conn::poll_transmit`] has something to send.
        const TRANSMIT = 1 << 8;
    }
}

/// A contiguous piece of a ring buffer: offset and length.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Region {
    /// Offset from the start of the buffer (for an RMBE: of the element).
    pub off: u32,
    /// Length in bytes.
    pub len: u32,
}

/// Up to two regions of a ring buffer (the second when the range wraps).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Regions {
    parts: [Region; 2],
    n: u8,
}

impl Regions {
    /// The regions, in stream order.
    pub fn as_slice(&self) -> &[Region] {
        &self.parts[..usize::from(self.n)]
    }

    /// Total length.
    pub fn total(&self) -> u64 {
        self.as_slice().iter().map(|r| u64::from(r.len)).sum()
    }

    /// Whether there is nothing.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// `len` bytes of the ring `[base, base + ring)` starting at ring position `pos`.
    fn ring(base: u32, ring: u32, pos: u64, len: u64) -> Regions {
        debug_assert!(len <= u64::from(ring));
        let mut r = Regions::default();
        if len == 0 {
            return r;
        }
        let start = (pos % u64::from(ring)) as u32;
        let first = len.min(u64::from(ring - start)) as u32;
        r.parts[0] = Region {
            off: base + start,
            len: first,
        };
        r.n = 1;
        let rest = (len - u64::from(first)) as u32;
        if rest > 0 {
            r.parts[1] = Region {
                off: base,
                len: rest,
            };
            r.n = 2;
        }
        r
    }
}

/// One RDMA WRITE: `len` bytes from our sndbuf at `src_off` to the peer's RMB element
/// at `dst_off` (add the element's address for the link in use; no immediate data,
/// RFC 7609 §4.7.1). Never crosses the end of either ring and never touches the eye
/// catcher.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct RmbeWrite {
    /// Offset in our sndbuf.
    pub src_off: u32,
    /// Length in bytes.
    pub len: u32,
    /// Offset in the peer's RMB element.
    pub dst_off: u32,
}

/// RDMA WRITEs followed by the CDC that announces them, to post in this order on one QP.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Transmit {
    writes: [RmbeWrite; 3],
    n_writes: u8,
    /// Bytes the CDC announces that the application placed in the peer's RMBE itself
    /// ([`Conn::tx_place_space`]): before the writes in the stream, moved by none.
    pub placed: u32,
    /// The CDC to SEND after the writes.
    pub cdc: CdcRepr,
}

impl Transmit {
    /// The writes, in stream order (at most three: one sndbuf wrap and one RMBE wrap).
    /// Consecutive writes with adjacent `dst_off` may be posted as one WR with two SGEs.
    pub fn writes(&self) -> &[RmbeWrite] {
        &self.writes[..usize::from(self.n_writes)]
    }

    /// Bytes of data this transmit announces: the placed ones and the written ones.
    pub fn data_len(&self) -> u64 {
        u64::from(self.placed) + self.writes().iter().map(|w| u64::from(w.len)).sum::<u64>()
    }
}

/// Cursor bookkeeping, for diagnostics (like `smc_diag`) and tests.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Snapshot {
    /// Our producer cursor in the peer's RMBE (last sent).
    pub tx_prod: Cursor,
    /// The peer's consumer cursor as we know it.
    pub tx_peer_cons: Cursor,
    /// Bytes committed by the application and not yet written.
    pub tx_unsent: u64,
    /// Bytes in the sndbuf not yet reclaimed.
    pub tx_unacked: u64,
    /// The peer's producer cursor in our RMBE.
    pub rx_prod: Cursor,
    /// Our consumer cursor.
    pub rx_cons: Cursor,
    /// The consumer cursor last sent to the peer.
    pub rx_cons_sent: Cursor,
    /// Seqno of our last CDC.
    pub tx_seq: u16,
    /// SS: seqno of our last completed CDC.
    pub ss: u16,
    /// SR: seqno of the last CDC we accepted.
    pub sr: u16,
}

/// One SMC-R connection (see the module documentation).
#[derive(Debug)]
pub struct Conn {
    cfg: ConnConfig,
    local: RmbeGeometry,
    peer: RmbeGeometry,
    sndbuf_len: u32,
    local_token: u32,
    peer_token: u32,
    state: State,
    tx: TxState,
    rx: RxState,
    cl: CloseState,
    inflight: Inflight,
    /// Seqno of the last CDC sent (the next is +1; the first is 1).
    tx_seq: u16,
    /// SS (§4.6.1).
    ss: u16,
    link_failed: bool,
    error: Option<ConnError>,
    events: Events,
}

impl Conn {
    /// A connection in state ACTIVE (Fig 22 transition 2: rendezvous done, RMBE indices
    /// exchanged, link active).
    pub fn new(params: ConnParams, cfg: ConnConfig) -> Result<Conn, ConnError> {
        if params.sndbuf_len == 0 {
            return Err(ConnError::InvalidParams("sndbuf length is zero"));
        }
        if !params.peer_rmbe.is_valid(params.tx_start) {
            return Err(ConnError::InvalidParams(
                "tx start cursor outside the peer RMBE",
            ));
        }
        if !params.local_rmbe.is_valid(params.rx_start) {
            return Err(ConnError::InvalidParams(
                "rx start cursor outside the local RMBE",
            ));
        }
        if cfg.max_inflight == 0 {
            return Err(ConnError::InvalidParams("max_inflight is zero"));
        }
        let conn = Conn {
            local: params.local_rmbe,
            peer: params.peer_rmbe,
            sndbuf_len: params.sndbuf_len,
            local_token: params.local_token,
            peer_token: params.peer_token,
            state: State::Active,
            tx: TxState::new(params.peer_rmbe.position_of(params.tx_start)),
            rx: RxState::new(params.local_rmbe.position_of(params.rx_start)),
            cl: CloseState::default(),
            inflight: Inflight::new(usize::from(cfg.max_inflight)),
            tx_seq: 0,
            ss: 0,
            link_failed: false,
            error: None,
            events: Events::empty(),
            cfg,
        };
        debug!(token = conn.local_token, "conn active");
        Ok(conn)
    }

    /// Current state (Fig 22 / Fig 23).
    pub fn state(&self) -> State {
        self.state
    }

    /// The configuration in effect.
    pub fn config(&self) -> &ConnConfig {
        &self.cfg
    }

    /// The alert token we assigned (peers address us with it).
    pub fn local_token(&self) -> u32 {
        self.local_token
    }

    /// Set `TCP_NODELAY`. Turning it on flushes corked data, also data held by
    /// `TCP_CORK` (once: tcp(7), "setting this option forces an explicit flush of
    /// pending output, even if TCP_CORK is currently set").
    pub fn set_nodelay(&mut self, on: bool) {
        self.cfg.nodelay = on;
        if on && self.tx.app > self.tx.sent {
            self.tx.cork_push = self.tx.corked;
            self.events |= Events::TRANSMIT;
        }
    }

    /// Set `TCP_CORK` ([`CORK_MAX_HOLD`]): while on, partial data waits for more;
    /// turning it off sends what is held at once.
    pub fn set_cork(&mut self, on: bool) {
        self.tx.corked = on;
        if !on {
            self.tx.cork_deadline = None;
            if self.tx.app > self.tx.sent {
                self.events |= Events::TRANSMIT;
            }
        }
    }

    /// Whether `TCP_CORK` is set.
    pub fn corked(&self) -> bool {
        self.tx.corked
    }

    /// Set `SO_OOBINLINE`.
    pub fn set_oob_inline(&mut self, on: bool) {
        self.cfg.oob_inline = on;
        self.rx_skip_urgent_if_at_mark();
    }

    /// The error to report on socket calls, if the connection failed.
    pub fn error(&self) -> Option<ConnError> {
        self.error
    }

    /// The peer sent its last CDC: its close (PeerConnClosed) or abort (PeerConnAbort)
    /// flag reached us (RFC 7609 §4.8.1). A peer that follows the protocol writes
    /// nothing more into our RMB after it; a connection closed without it (our abort,
    /// a peer that died) may still see writes in flight.
    pub fn peer_finished(&self) -> bool {
        self.cl
            .peer
            .intersects(ConnStateFlags::PEER_CONN_CLOSED | ConnStateFlags::PEER_CONN_ABORT)
    }

    /// We sent our last CDC: our close or abort flag is posted, and
    /// [`Conn::poll_transmit`] gives nothing more (CHECKLIST TRM-2; on SMC-R a failover
    /// may still replay a close flag whose CDC was lost). Mirror of
    /// [`Conn::peer_finished`]: from here on the peer may reuse the memory we wrote into.
    pub fn finished_sending(&self) -> bool {
        self.cl
            .sent
            .intersects(ConnStateFlags::PEER_CONN_CLOSED | ConnStateFlags::PEER_CONN_ABORT)
    }

    /// Events since the last call; clears them.
    pub fn take_events(&mut self) -> Events {
        std::mem::take(&mut self.events)
    }

    /// Cursor bookkeeping.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            tx_prod: self.peer.cursor_at(self.tx.p0 + self.tx.sent),
            tx_peer_cons: self.peer.cursor_at(self.tx.p0 + self.tx.peer_cons),
            tx_unsent: self.tx.app - self.tx.sent,
            tx_unacked: self.tx.app - self.tx.acked,
            rx_prod: self.local.cursor_at(self.rx.r0 + self.rx.prod),
            rx_cons: self.local.cursor_at(self.rx.r0 + self.rx.cons),
            rx_cons_sent: self.local.cursor_at(self.rx.r0 + self.rx.cons_sent),
            tx_seq: self.tx_seq,
            ss: self.ss,
            sr: self.rx.sr,
        }
    }

    /// Whether a send failed and the runtime must fail over or kill the connection.
    pub fn needs_failover(&self) -> bool {
        self.link_failed
    }

    /// The earliest time [`Conn::on_timeout`] must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.cl.deadline,
            self.tx.stall_deadline,
            self.tx.cork_deadline,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Run expired timers.
    pub fn on_timeout(&mut self, now: Instant) {
        if self.tx.cork_deadline.is_some_and(|d| d <= now) {
            // The held data goes at the next transmission. The deadline is cleared
            // here, not there: a transmission that cannot happen yet (a full in-flight
            // table, a failed link) must not leave a past deadline re-arming the timer.
            self.tx.cork_deadline = None;
            self.tx.cork_push = true;
            self.events |= Events::TRANSMIT;
        }
        if self.tx.stall_deadline.is_some_and(|d| d <= now) {
            self.tx.stall_deadline = None;
            if self.tx_blocked() {
                debug!(
                    token = self.local_token,
                    "writer stalled, requesting a consumer update"
                );
                self.tx.r_active = true;
                self.tx.r_needed = true;
                self.events |= Events::TRANSMIT;
            }
        }
        if self.cl.deadline.is_some_and(|d| d <= now) {
            self.cl.deadline = None;
            self.close_timer_expired(now);
        }
    }

    /// Record an abnormal end (first reason wins) and wake everyone.
    fn set_error(&mut self, e: ConnError) {
        if self.error.is_none() {
            // Application aborts and resets are routine; the rest deserve attention.
            let routine = matches!(
                e,
                ConnError::Aborted(
                    AbortReason::Local
                        | AbortReason::UnreadDataOnClose
                        | AbortReason::PeerAbort
                        | AbortReason::TcpReset
                )
            );
            if routine {
                debug!(token = self.local_token, error = %e, "conn aborted");
            } else {
                warn!(token = self.local_token, error = %e, "conn failed");
            }
            self.error = Some(e);
        }
        self.events |= Events::ERROR | Events::READABLE | Events::WRITABLE;
    }
}

/// One posted CDC awaiting its send completion.
#[derive(Clone, Copy, Debug, Default)]
struct InflightEntry {
    seq: u16,
    /// Stream bytes written up to and including this CDC.
    tx_end: u64,
    /// Consumer position it carried.
    cons: u64,
    /// Connection-state flags it carried.
    flags: ConnStateFlags,
}

/// Fixed-capacity FIFO of posted CDCs (allocated once).
#[derive(Debug)]
struct Inflight {
    buf: Box<[InflightEntry]>,
    head: usize,
    len: usize,
}

impl Inflight {
    fn new(cap: usize) -> Self {
        Inflight {
            buf: vec![InflightEntry::default(); cap].into_boxed_slice(),
            head: 0,
            len: 0,
        }
    }

    fn is_full(&self) -> bool {
        self.len == self.buf.len()
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn push(&mut self, e: InflightEntry) {
        debug_assert!(!self.is_full());
        let i = (self.head + self.len) % self.buf.len();
        self.buf[i] = e;
        self.len += 1;
    }

    fn get(&self, k: usize) -> &InflightEntry {
        &self.buf[(self.head + k) % self.buf.len()]
    }

    /// Index (from the oldest) of the entry with this seqno.
    fn position(&self, seq: u16) -> Option<usize> {
        (0..self.len).find(|&k| self.get(k).seq == seq)
    }

    fn pop(&mut self) -> Option<InflightEntry> {
        if self.len == 0 {
            return None;
        }
        let e = self.buf[self.head];
        self.head = (self.head + 1) % self.buf.len();
        self.len -= 1;
        Some(e)
    }

    fn clear(&mut self) {
        self.head = 0;
        self.len = 0;
    }
}

impl fmt::Display for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conn token {:#x} {}", self.local_token, self.state)
    }
}
