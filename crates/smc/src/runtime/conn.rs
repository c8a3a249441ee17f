//! One SMC-R connection at run time: the `conn` machine under the connection's lock,
//! its buffers and link, and the data path (docs/core-design.md "runtime").
//!
//! The application thread copies into the sndbuf and posts the RDMA WRITEs and the CDC
//! itself ([`ConnShared::drive`]); received CDCs are processed on the provider's
//! completion thread ([`ConnShared::on_cdc`]); timers, TCP monitoring and the release of
//! a closed connection's resources run on the event thread.

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::task::Waker;
use std::time::{Duration, Instant};

use smc_verbs::{DriveWaker, Mr, RdmaBuffer};
use tracing::{debug, warn};

use super::link::{wr_cdc, LinkRes, SlotWaiter, TX_SLOTS};
use super::shm::{ShmPath, ShmRings};
use super::{Inbox, Inner};
use crate::clc::LgrId;
use crate::conn::{CdcRepr, Conn, Events};

/// Mutable state of a connection, under [`ConnShared::state`].
pub(crate) struct ConnState {
    pub conn: Conn,
    /// The TCP connection, idle while SMC-R carries the data (RFC 7609 §4.8: it carries
    /// the final FIN, and its RST aborts). Closed by the event thread only.
    pub tcp: Option<TcpStream>,
    /// The TCP connection was shut down for writing (our FIN is out).
    pub tcp_fin_sent: bool,
    /// The peer's FIN or RST was seen; no more monitoring.
    pub tcp_done: bool,
    /// Timer the event thread knows about.
    pub armed: Option<Instant>,
    /// Waiting for send slots on the link.
    pub waiting_slots: bool,
    /// Every application handle is gone.
    pub released: bool,
    pub read_timeout: Option<Duration>,
    pub write_timeout: Option<Duration>,
    pub nonblocking: bool,
    pub rx_waker: Option<Waker>,
    pub tx_waker: Option<Waker>,
    /// Threads of blocking reads and writes inside `DeviceOps::drive` for this
    /// connection, woken with `wake_seq` (the CDC they wait for may be received by
    /// another thread).
    pub drivers: Vec<DriveWaker>,
    /// The same-host path's rings (`None` on SMC-R).
    pub shm: Option<ShmRings>,
    /// Same host: the eventfds of threads sleeping on the doorbell in a blocking call.
    pub shm_sleepers: Vec<Arc<smc_verbs::EventFd>>,
}

/// How a connection's data moves.
pub(crate) enum Path {
    /// SMC-R: RDMA WRITE + CDC on a link.
    Rdma(RdmaPath),
    /// Same host: copies into the peer's mapped RMB + CDCs in its ring (`shm`).
    Shm(ShmPath),
}

/// The RDMA side of an SMC-R connection.
pub(crate) struct RdmaPath {
    pub lgr: LgrId,
    pub link: Arc<LinkRes>,
    pub sndbuf_mr: Mr,
    /// Virtual address of the peer's RMB element on our link, and its RKey.
    pub peer_base: u64,
    pub peer_rkey: u32,
}

/// A connection shared by the application handles, the completion handler and the
/// event thread.
pub(crate) struct ConnShared {
    pub token: u32,
    pub path: Path,
    pub rmb: Arc<RdmaBuffer>,
    pub sndbuf: Arc<RdmaBuffer>,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub version: u8,
    pub first_contact: bool,
    pub state: Mutex<ConnState>,
    pub cond: Condvar,
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    /// Bumped whenever readers or writers are woken (for busy polling).
    pub wake_seq: AtomicU64,
    pub stack: Weak<Inner>,
    pub self_ref: Weak<ConnShared>,
}

impl ConnState {
    pub(crate) fn new(conn: Conn, tcp: Option<TcpStream>, shm: Option<ShmRings>) -> ConnState {
        ConnState {
            conn,
            tcp,
            tcp_fin_sent: false,
            tcp_done: false,
            armed: None,
            waiting_slots: false,
            released: false,
            read_timeout: None,
            write_timeout: None,
            nonblocking: false,
            rx_waker: None,
            tx_waker: None,
            drivers: Vec::new(),
            shm,
            shm_sleepers: Vec::new(),
        }
    }
}

impl std::fmt::Debug for ConnShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnShared")
            .field("token", &format_args!("{:#x}", self.token))
            .field("lgr", &self.lgr())
            .finish()
    }
}

impl SlotWaiter for ConnShared {
    /// Send slots came back: try again.
    fn kick(&self) {
        let mut st = self.lock();
        st.waiting_slots = false;
        self.drive(&mut st, Instant::now());
    }
}

impl ConnShared {
    /// The link group of an SMC-R connection.
    pub(crate) fn lgr(&self) -> Option<LgrId> {
        match &self.path {
            Path::Rdma(r) => Some(r.lgr),
            Path::Shm(_) => None,
        }
    }

    /// The SMC-R side, if this is an SMC-R connection.
    pub(crate) fn rdma(&self) -> Option<&RdmaPath> {
        match &self.path {
            Path::Rdma(r) => Some(r),
            Path::Shm(_) => None,
        }
    }

    /// The same-host side, if this is a same-host connection.
    pub(crate) fn shm(&self) -> Option<&ShmPath> {
        match &self.path {
            Path::Shm(p) => Some(p),
            Path::Rdma(_) => None,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, ConnState> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// After any input: post what the machine wants sent, then act on its events.
    pub(crate) fn drive(&self, st: &mut ConnState, now: Instant) {
        self.flush(st, now);
        let ev = st.conn.take_events();
        self.on_events(st, ev);
        let t = st.conn.poll_timeout();
        if t != st.armed {
            let earlier = match (t, st.armed) {
                (Some(n), Some(o)) => n < o,
                (Some(_), None) => true,
                _ => false,
            };
            st.armed = t;
            if earlier {
                if let Some(s) = self.stack.upgrade() {
                    s.wake();
                }
            }
        }
    }

    fn flush(&self, st: &mut ConnState, now: Instant) {
        let r = match &self.path {
            Path::Rdma(r) => r,
            Path::Shm(p) => return self.flush_shm(p, st, now),
        };
        loop {
            if st.conn.needs_failover() {
                return;
            }
            // A destroyed link posts nothing and gives no slot back; its link group's
            // machine ends every connection on it (no failover: RFC 7609 §4.8.3), so
            // waiting for slots there would only wait forever.
            if r.link.dead.load(Ordering::SeqCst) {
                return;
            }
            if !r.link.try_reserve(TX_SLOTS) {
                if !st.waiting_slots {
                    st.waiting_slots = true;
                    if let Some(me) = self.self_ref.upgrade() {
                        r.link.add_waiter(&me);
                    }
                }
                // Completions may have come back between the failed reservation and
                // the registration: look once more.
                if !r.link.try_reserve(TX_SLOTS) {
                    return;
                }
            }
            let Some(t) = st.conn.poll_transmit(now) else {
                r.link.release(TX_SLOTS);
                return;
            };
            let mut writes = [(0u64, 0u32, 0u32); 3];
            let n = t.writes().len();
            for (i, w) in t.writes().iter().enumerate() {
                writes[i] = (r.peer_base + u64::from(w.dst_off), w.src_off, w.len);
            }
            let cdc = t.cdc.to_bytes();
            let res = r.link.post_transmit(
                &writes[..n],
                r.peer_rkey,
                &r.sndbuf_mr,
                &cdc,
                wr_cdc(self.token, t.cdc.seqno, n as u8 + 1),
                TX_SLOTS,
            );
            match res {
                Ok(()) => {
                    self.bytes_sent.fetch_add(t.data_len(), Ordering::Relaxed);
                }
                Err(e) => {
                    warn!(token = self.token, error = %e, "posting a CDC failed");
                    st.conn.on_cdc_send_failed(t.cdc.seqno);
                    if let Some(s) = self.stack.upgrade() {
                        s.post(Inbox::LinkError {
                            lgr: r.lgr,
                            link: r.link.id,
                        });
                    }
                    return;
                }
            }
        }
    }

    /// The same-host transmit: the machine's RDMA WRITEs become copies into the peer's
    /// mapped RMB, its CDC goes into the peer's ring after them (release order: the
    /// data before the CDC, RFC 7609 §4.7.1), and the CDC is complete at once.
    fn flush_shm(&self, p: &ShmPath, st: &mut ConnState, now: Instant) {
        loop {
            let Some(rings) = st.shm.as_mut() else { return };
            match rings.tx.has_room() {
                Ok(true) => {}
                // The peer wakes us when it consumed (its ring's TX_WAIT).
                Ok(false) => return,
                Err(e) => {
                    warn!(token = self.token, error = %e, "same-host peer broke the ring");
                    st.conn.kill(crate::conn::AbortReason::Violation(
                        crate::conn::Violation::SharedRing,
                    ));
                    return;
                }
            }
            let Some(t) = st.conn.poll_transmit(now) else {
                return;
            };
            for w in t.writes() {
                self.sndbuf.copy_to(
                    w.src_off as usize,
                    &p.tx_data,
                    w.dst_off as usize,
                    w.len as usize,
                );
            }
            let cdc = t.cdc.to_bytes();
            let Some(rings) = st.shm.as_mut() else { return };
            if rings.tx.publish(&cdc) {
                p.ring_peer();
            }
            self.bytes_sent.fetch_add(t.data_len(), Ordering::Relaxed);
            st.conn.on_cdc_sent(t.cdc.seqno);
        }
    }

    /// Takes the CDCs waiting in a same-host connection's ring (any thread; the
    /// connection's lock is taken here).
    pub(crate) fn shm_poll(&self, now: Instant) {
        let Some(p) = self.shm() else { return };
        let mut st = self.lock();
        self.shm_drain(p, &mut st, now);
        self.drive(&mut st, now);
    }

    fn shm_drain(&self, p: &ShmPath, st: &mut ConnState, now: Instant) {
        let Some(mut rings) = st.shm.take() else {
            return;
        };
        let mut msgs: arrayvec::ArrayVec<[u8; 44], 64> = arrayvec::ArrayVec::new();
        let res = rings.rx.drain(|b| {
            let _ = msgs.try_push(*b);
        });
        p.rx_tail_hint.store(rings.rx.tail, Ordering::Release);
        st.shm = Some(rings);
        match res {
            Ok(wake_writer) => {
                if wake_writer {
                    p.ring_peer();
                }
            }
            Err(e) => {
                warn!(token = self.token, error = %e, "same-host peer broke the ring");
                st.conn.kill(crate::conn::AbortReason::Violation(
                    crate::conn::Violation::SharedRing,
                ));
                return;
            }
        }
        for b in &msgs {
            match CdcRepr::parse_bytes(b) {
                Ok(msg) => self.apply_cdc(st, &msg, now),
                Err(e) => {
                    // Not a CDC where the ring says one is: like a malformed CDC on a
                    // link, the peer broke the protocol; only this connection ends.
                    warn!(token = self.token, error = %e, "same-host peer wrote a bad CDC");
                    st.conn.kill(crate::conn::AbortReason::Violation(
                        crate::conn::Violation::SharedRing,
                    ));
                    return;
                }
            }
        }
    }

    fn on_events(&self, st: &mut ConnState, ev: Events) {
        if ev.intersects(
            Events::READABLE
                | Events::WRITABLE
                | Events::URGENT
                | Events::ERROR
                | Events::PEER_DONE,
        ) {
            self.wake_seq.fetch_add(1, Ordering::Release);
            self.cond.notify_all();
            for w in &st.shm_sleepers {
                w.wake();
            }
            for d in &st.drivers {
                d.wake();
            }
            if ev.intersects(Events::READABLE | Events::URGENT | Events::ERROR | Events::PEER_DONE)
            {
                if let Some(w) = st.rx_waker.take() {
                    w.wake();
                }
            }
            if ev.intersects(Events::WRITABLE | Events::ERROR) {
                if let Some(w) = st.tx_waker.take() {
                    w.wake();
                }
            }
        }
        if ev.contains(Events::TCP_SHUTDOWN) && !st.tcp_fin_sent {
            // RFC 7609 §4.8.1: the TCP FIN follows the SMC-R close flags.
            st.tcp_fin_sent = true;
            if let Some(t) = &st.tcp {
                let _ = t.shutdown(std::net::Shutdown::Write);
            }
        }
        if ev.intersects(Events::TCP_RESET | Events::CLOSED) {
            if let Some(s) = self.stack.upgrade() {
                if ev.contains(Events::TCP_RESET) {
                    s.post(Inbox::ResetTcp(self.token));
                }
                if ev.contains(Events::CLOSED) {
                    s.post(Inbox::ConnClosed);
                }
            }
        }
    }

    /// A received CDC (completion thread).
    pub(crate) fn on_cdc(&self, msg: &CdcRepr, now: Instant) {
        let mut st = self.lock();
        self.apply_cdc(&mut st, msg, now);
        self.drive(&mut st, now);
    }

    fn apply_cdc(&self, st: &mut ConnState, msg: &CdcRepr, now: Instant) {
        let before = st.conn.rx_consumed() + st.conn.rx_unread();
        let rmb = &self.rmb;
        let out = st.conn.handle_cdc(msg, now, |off| {
            let mut b = [0u8; 1];
            if rmb.contains(off as usize, 1) {
                rmb.read(off as usize, &mut b);
            }
            b[0]
        });
        let after = st.conn.rx_consumed() + st.conn.rx_unread();
        if after > before {
            self.bytes_received
                .fetch_add(after - before, Ordering::Relaxed);
        }
        tracing::trace!(token = self.token, ?out, "cdc");
    }

    /// A CDC's send completion (completion thread).
    pub(crate) fn on_cdc_complete(&self, seq: u16, ok: bool) {
        let mut st = self.lock();
        if ok {
            st.conn.on_cdc_sent(seq);
        } else {
            st.conn.on_cdc_send_failed(seq);
            // Single-link groups have nowhere to fail over to (§4.8.3); the link-group
            // machine decides about the link, the connection cannot go on.
            if st.conn.needs_failover() {
                debug!(token = self.token, "CDC send failed, no alternate link");
                st.conn.kill(crate::conn::AbortReason::LinkLost);
            }
        }
        self.drive(&mut st, Instant::now());
    }
}
