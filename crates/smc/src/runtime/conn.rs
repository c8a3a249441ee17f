//! One SMC-R connection at run time: the `conn` machine under the connection's lock,
//! its buffers and link, and the data path (docs/core-design.md "runtime"). A
//! same-host connection (docs/samehost.md) runs the same machine over shared memory
//! instead of a link.
//!
//! The application thread copies into the sndbuf and posts the RDMA WRITEs and the CDC
//! itself ([`ConnShared::drive`]); received CDCs are processed on the provider's
//! completion thread ([`ConnShared::on_cdc`]); timers, TCP monitoring and the release of
//! a closed connection's resources run on the event thread.

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::Waker;
use std::time::{Duration, Instant};

use smc_verbs::{DriveWaker, Mr, RdmaBuffer};
use tracing::{debug, warn};

use super::cond::Cond;
use super::link::{wr_cdc, LinkRes, SlotWaiter, TX_SLOTS};
use super::shm::{ShmPath, ShmRings};
use super::{Inbox, Inner};
use crate::clc::LgrId;
use crate::conn::{CdcRepr, Conn, Events};

/// How a connection's data moves, under the connection's lock: an SMC-R connection's
/// link can change (failover, RFC 7609 §4.6); a same-host connection has no link, and
/// never gets one.
pub(crate) enum Path {
    /// SMC-R: RDMA WRITE + CDC on a link.
    Rdma(RdmaPath),
    /// Same host: copies into the peer's mapped RMB + CDCs in its ring; the rings (the
    /// lock-free part is [`ConnShared::shm`]).
    Shm(ShmRings),
}

/// The link a connection's data goes on, and where in the peer's RMB element it writes:
/// changed by a failover (RFC 7609 §4.6).
pub(crate) struct RdmaPath {
    pub link: Arc<LinkRes>,
    /// The send buffer's registration on the link's PD.
    pub sndbuf_mr: Mr,
    /// Virtual address of the peer's RMB element on the link, and its RKey.
    pub peer_base: u64,
    pub peer_rkey: u32,
}

/// Mutable state of a connection, under [`ConnShared::state`].
pub(crate) struct ConnState {
    pub conn: Conn,
    pub path: Path,
    /// Times the connection moved to another link.
    pub failovers: u32,
    /// The link it moved away from last (RFC 7609 §4.6): its completion queue may still
    /// hold CDCs of ours when the peer's failover validation arrives
    /// ([`ConnShared::links_to_drain_before_validation`]).
    pub left_link: Option<Weak<LinkRes>>,
    /// A failover's validation CDC not posted yet (it waits for a send slot like any
    /// transmit, and goes before them).
    pub validation: Option<CdcRepr>,
    /// The TCP connection, idle while SMC-R carries the data (RFC 7609 §4.8: it carries
    /// the final FIN, and its RST aborts). Closed by the event thread only.
    pub tcp: Option<TcpStream>,
    /// The TCP connection was shut down for writing (our FIN is out).
    pub tcp_fin_sent: bool,
    /// The peer's FIN or RST was seen; no more monitoring.
    pub tcp_done: bool,
    /// The machine's next deadline (`Conn::poll_timeout`).
    pub armed: Option<Instant>,
    /// This connection's live entry in the stack's timer queue (`timers.rs`): the
    /// earliest deadline queued and not yet taken out by the event thread.
    pub queued: Option<Instant>,
    /// Waiting for send slots on the link.
    pub waiting_slots: bool,
    /// Every application handle is gone.
    pub released: bool,
    pub read_timeout: Option<Duration>,
    pub write_timeout: Option<Duration>,
    pub nonblocking: bool,
    pub rx_waker: Option<Waker>,
    pub tx_waker: Option<Waker>,
    /// Threads of blocking reads inside `DeviceOps::drive` for this connection, woken
    /// with `rx_seq` (the CDC they wait for may be received by another thread).
    pub rx_drivers: Vec<DriveWaker>,
    /// The same for blocking writes (`tx_seq`).
    pub tx_drivers: Vec<DriveWaker>,
    /// Same host: the eventfds of threads sleeping on the doorbell in a blocking read
    /// (woken with `rx_seq`) ...
    pub shm_rx_sleepers: Vec<Arc<smc_verbs::EventFd>>,
    /// ... and in a blocking write (`tx_seq`).
    pub shm_tx_sleepers: Vec<Arc<smc_verbs::EventFd>>,
    /// Same host: a tokio task of the stream's runtime watches the doorbell and takes
    /// the ring (`api::tokio`), so the event thread leaves it alone.
    pub shm_bell_task: bool,
    /// That task's waker, woken when the connection reaches CLOSED (its end).
    pub bell_waker: Option<Waker>,
}

impl ConnState {
    pub(crate) fn new(conn: Conn, path: Path, tcp: Option<TcpStream>) -> ConnState {
        ConnState {
            conn,
            path,
            failovers: 0,
            left_link: None,
            validation: None,
            tcp,
            tcp_fin_sent: false,
            tcp_done: false,
            armed: None,
            queued: None,
            waiting_slots: false,
            released: false,
            read_timeout: None,
            write_timeout: None,
            nonblocking: false,
            rx_waker: None,
            tx_waker: None,
            // Room for the usual waiters from the start: a first wait of the connection
            // (which may come long after the set-up: a writer that never found the
            // window closed before) allocates nothing on the data path.
            rx_drivers: Vec::with_capacity(2),
            tx_drivers: Vec::with_capacity(2),
            shm_rx_sleepers: Vec::with_capacity(2),
            shm_tx_sleepers: Vec::with_capacity(2),
            shm_bell_task: false,
            bell_waker: None,
        }
    }

    /// The RDMA path of an SMC-R connection (`None` on the same-host path).
    pub(crate) fn rdma(&self) -> Option<&RdmaPath> {
        match &self.path {
            Path::Rdma(r) => Some(r),
            Path::Shm(_) => None,
        }
    }
}

/// What kind of connection this is, fixed at its creation (no lock needed).
pub(crate) enum Kind {
    /// SMC-R in this link group (a failover moves the connection to another link of the
    /// same group: RFC 7609 §4.6).
    SmcR(LgrId),
    /// The same-host path.
    SameHost(ShmPath),
}

/// A connection shared by the application handles, the completion handler and the
/// event thread.
pub(crate) struct ConnShared {
    pub token: u32,
    pub kind: Kind,
    pub rmb: Arc<RdmaBuffer>,
    pub sndbuf: Arc<RdmaBuffer>,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub version: u8,
    pub first_contact: bool,
    pub state: Mutex<ConnState>,
    /// Blocked readers wait here (data, urgent data, the peer's end, an error) ...
    pub rx_cond: Cond,
    /// ... and blocked writers here (send buffer space, the peer's end, an error): an
    /// ACK or a consumer-cursor update that frees send space wakes no reader (issue 15).
    pub tx_cond: Cond,
    pub bytes_sent: AtomicU64,
    /// Of `bytes_sent`, those the writer put straight into the peer's mapped RMB
    /// (same-host, `Conn::tx_place_space`).
    pub bytes_placed: AtomicU64,
    pub bytes_received: AtomicU64,
    /// Bumped whenever readers are woken (for busy polling and drivers).
    pub rx_seq: AtomicU64,
    /// Bumped whenever writers are woken.
    pub tx_seq: AtomicU64,
    /// How long a blocking call looks for the peer's answer before it sleeps: on its
    /// RNIC (`StackConfig::rnic_spin`) or on its same-host ring (`same_host_spin`).
    pub spin: crate::runtime::spin::SpinBudget,
    pub stack: Weak<Inner>,
    pub self_ref: Weak<ConnShared>,
}

/// What makes one connection's [`ConnShared`] (the rest starts empty).
pub(crate) struct ConnParts {
    pub token: u32,
    pub kind: Kind,
    pub rmb: Arc<RdmaBuffer>,
    pub sndbuf: Arc<RdmaBuffer>,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub version: u8,
    pub first_contact: bool,
    pub state: ConnState,
}

impl ConnShared {
    /// A new connection of `inner`'s stack (SMC-R or same-host).
    pub(crate) fn new(p: ConnParts, inner: &Arc<Inner>) -> Arc<ConnShared> {
        let spin_max = match p.kind {
            Kind::SmcR(_) => inner.cfg.rnic_spin,
            Kind::SameHost(_) => inner.cfg.same_host_spin,
        };
        Arc::new_cyclic(|me| ConnShared {
            token: p.token,
            kind: p.kind,
            rmb: p.rmb,
            sndbuf: p.sndbuf,
            local: p.local,
            peer: p.peer,
            version: p.version,
            first_contact: p.first_contact,
            state: Mutex::new(p.state),
            rx_cond: Cond::new(),
            tx_cond: Cond::new(),
            bytes_sent: Default::default(),
            bytes_placed: Default::default(),
            bytes_received: Default::default(),
            rx_seq: Default::default(),
            tx_seq: Default::default(),
            spin: crate::runtime::spin::SpinBudget::new(spin_max),
            stack: Arc::downgrade(inner),
            self_ref: me.clone(),
        })
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
        match &self.kind {
            Kind::SmcR(l) => Some(*l),
            Kind::SameHost(_) => None,
        }
    }

    /// The same-host side, if this is a same-host connection.
    pub(crate) fn shm(&self) -> Option<&ShmPath> {
        match &self.kind {
            Kind::SameHost(p) => Some(p),
            Kind::SmcR(_) => None,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, ConnState> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// One input from the application (an option, an abort): applied to the machine
    /// under the connection's lock, then driven.
    pub(crate) fn apply(&self, f: impl FnOnce(&mut Conn, Instant)) {
        let mut st = self.lock();
        let now = Instant::now();
        f(&mut st.conn, now);
        self.drive(&mut st, now);
    }

    /// After any input: post what the machine wants sent, then act on its events.
    pub(crate) fn drive(&self, st: &mut ConnState, now: Instant) {
        self.flush(st, now);
        let ev = st.conn.take_events();
        self.on_events(st, ev);
        st.armed = st.conn.poll_timeout();
        self.schedule(st);
    }

    /// Queues the deadline with the event thread when it has no entry at or before it
    /// (`timers.rs`); a new entry wakes the event thread, which may sleep past it.
    pub(crate) fn schedule(&self, st: &mut ConnState) {
        let Some(t) = st.armed else { return };
        if st.queued.is_some_and(|q| q <= t) {
            return;
        }
        st.queued = Some(t);
        if let Some(s) = self.stack.upgrade() {
            if s.timers.push(t, self.token) {
                s.wake();
            }
        }
    }

    fn flush(&self, st: &mut ConnState, now: Instant) {
        let lgr = match &self.kind {
            Kind::SmcR(l) => *l,
            Kind::SameHost(p) => return self.flush_shm(p, st, now),
        };
        loop {
            let Path::Rdma(path) = &st.path else { return };
            if st.conn.needs_failover() {
                return;
            }
            // A destroyed link posts nothing and gives no slot back; its link group's
            // machine moves every connection on it to another link (RFC 7609 §4.6) or
            // ends it (§4.8.3), so waiting for slots there would only wait forever.
            let link = &path.link;
            if link.dead.load(Ordering::SeqCst) || link.failed.load(Ordering::SeqCst) {
                return;
            }
            if let Some(v) = st.validation {
                // RFC 7609 §4.6.1: the validation CDC first on the new link. It consumes
                // no sequence number, and the machine ignores its completion (no CDC in
                // flight has its number); its slot comes back with it.
                if !link.try_reserve_data(1) {
                    if !st.waiting_slots {
                        st.waiting_slots = true;
                        if let Some(me) = self.self_ref.upgrade() {
                            link.add_waiter(&me);
                        }
                    }
                    if !link.try_reserve_data(1) {
                        return;
                    }
                }
                let res = link.post_transmit(
                    &[],
                    path.peer_rkey,
                    &path.sndbuf_mr,
                    &v.to_bytes(),
                    wr_cdc(self.token, v.seqno, 1),
                    1,
                );
                if let Err(e) = res {
                    warn!(token = self.token, error = %e, "failover validation CDC not posted");
                    st.conn.kill(crate::conn::AbortReason::LinkLost);
                    return;
                }
                st.validation = None;
                continue;
            }
            if !link.try_reserve_data(TX_SLOTS) {
                if !st.waiting_slots {
                    st.waiting_slots = true;
                    if let Some(me) = self.self_ref.upgrade() {
                        link.add_waiter(&me);
                    }
                }
                // Completions may have come back between the failed reservation and
                // the registration: look once more.
                if !link.try_reserve_data(TX_SLOTS) {
                    return;
                }
            }
            let Some(t) = st.conn.poll_transmit(now) else {
                link.release(TX_SLOTS);
                return;
            };
            let p = path;
            let mut writes = [(0u64, 0u32, 0u32); 3];
            let n = t.writes().len();
            for (i, w) in t.writes().iter().enumerate() {
                writes[i] = (p.peer_base + u64::from(w.dst_off), w.src_off, w.len);
            }
            let cdc = t.cdc.to_bytes();
            let res = p.link.post_transmit(
                &writes[..n],
                p.peer_rkey,
                &p.sndbuf_mr,
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
                            lgr,
                            link: p.link.id,
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
            // Once our last CDC is published the peer may take it at once, give its
            // region to its next connection with us (docs/samehost.md, "Reusing
            // memory") and zero the control page: the ring is no longer ours to look at
            // (its TAIL, back at 0, would read as a broken ring).
            if st.conn.finished_sending() {
                return;
            }
            let Path::Shm(rings) = &mut st.path else {
                return;
            };
            match rings.tx.has_room() {
                Ok(true) => {}
                // The peer wakes us when it consumed (its ring's TX_WAIT).
                Ok(false) => return,
                Err(e) => return self.shm_violation(st, "broke the ring", &e),
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
            let Path::Shm(rings) = &mut st.path else {
                return;
            };
            if rings.tx.publish(&cdc) {
                p.ring_peer();
            }
            self.bytes_sent.fetch_add(t.data_len(), Ordering::Relaxed);
            if t.placed > 0 {
                self.bytes_placed
                    .fetch_add(u64::from(t.placed), Ordering::Relaxed);
            }
            st.conn.on_cdc_sent(t.cdc.seqno);
        }
    }

    /// The same-host peer broke the shared ring: only this connection ends
    /// (`Stats::same_host_violations`).
    fn shm_violation(&self, st: &mut ConnState, what: &str, e: &dyn std::fmt::Display) {
        warn!(token = self.token, error = %e, "same-host peer {what}");
        if let Some(s) = self.stack.upgrade() {
            s.counters.shm_violations.fetch_add(1, Ordering::Relaxed);
        }
        st.conn.kill(crate::conn::AbortReason::Violation(
            crate::conn::Violation::SharedRing,
        ));
    }

    /// Takes the CDCs waiting in a same-host connection's ring (any thread; the
    /// connection's lock is taken here).
    pub(crate) fn shm_poll(&self, now: Instant) {
        let Some(p) = self.shm() else { return };
        let mut st = self.lock();
        self.shm_drain(p, &mut st, now);
        self.drive(&mut st, now);
    }

    /// [`ConnShared::shm_poll`] under a lock the caller holds, and only if a CDC waits:
    /// a thread inside a read or write call counts as polling the ring (the peer does
    /// not ring for it, `api::samehost::Polling`), so it takes what came itself.
    pub(crate) fn shm_take(&self, st: &mut ConnState) {
        let Some(p) = self.shm() else { return };
        if p.rx_pending() {
            let now = Instant::now();
            self.shm_drain(p, st, now);
            self.drive(st, now);
        }
    }

    /// [`ConnShared::shm_poll`] for the doorbell's tokio task: false (nothing taken)
    /// once the connection is CLOSED. Looked at under the same lock as the drain: a
    /// connection is released only once CLOSED, and its ring and doorbell may then
    /// serve a later connection, whose CDCs this task must never take.
    #[cfg(feature = "tokio")]
    pub(crate) fn shm_poll_live(&self, now: Instant) -> bool {
        let Some(p) = self.shm() else { return false };
        let mut st = self.lock();
        if st.conn.state() == crate::conn::State::Closed {
            return false;
        }
        p.bell.drain();
        self.shm_drain(p, &mut st, now);
        self.drive(&mut st, now);
        true
    }

    fn shm_drain(&self, p: &ShmPath, st: &mut ConnState, now: Instant) {
        let Path::Shm(rings) = &mut st.path else {
            return;
        };
        let mut msgs: arrayvec::ArrayVec<[u8; 44], 64> = arrayvec::ArrayVec::new();
        let res = rings.rx.drain(|b| {
            let _ = msgs.try_push(*b);
        });
        p.rx_tail_hint.store(rings.rx.tail, Ordering::Release);
        match res {
            Ok(wake_writer) => {
                if wake_writer {
                    p.ring_peer();
                }
            }
            Err(e) => return self.shm_violation(st, "broke the ring", &e),
        }
        for b in &msgs {
            match CdcRepr::parse_bytes(b) {
                Ok(msg) => self.apply_cdc(st, &msg, now),
                Err(e) => {
                    // Not a CDC where the ring says one is: like a malformed CDC on a
                    // link, the peer broke the protocol; only this connection ends.
                    self.shm_violation(st, "wrote a bad CDC", &e);
                    return;
                }
            }
        }
    }

    fn on_events(&self, st: &mut ConnState, ev: Events) {
        // Readers and writers are woken apart: in a request/response exchange the
        // requester reads right after writing, and the completion of its write (the
        // RNIC's ACK) or the peer's consumer update only concerns a writer.
        if ev.intersects(Events::READABLE | Events::URGENT | Events::ERROR | Events::PEER_DONE) {
            self.rx_seq.fetch_add(1, Ordering::Release);
            self.rx_cond.notify_all();
            for d in &st.rx_drivers {
                d.wake();
            }
            for w in &st.shm_rx_sleepers {
                w.wake();
            }
            if let Some(w) = st.rx_waker.take() {
                w.wake();
            }
        }
        if ev.intersects(Events::WRITABLE | Events::ERROR | Events::PEER_DONE) {
            self.tx_seq.fetch_add(1, Ordering::Release);
            self.tx_cond.notify_all();
            for d in &st.tx_drivers {
                d.wake();
            }
            for w in &st.shm_tx_sleepers {
                w.wake();
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
        if ev.contains(Events::CLOSED) {
            // The doorbell's task ends (api::tokio).
            if let Some(w) = st.bell_waker.take() {
                w.wake();
            }
        }
        if ev.intersects(Events::TCP_RESET | Events::CLOSED) {
            if let Some(s) = self.stack.upgrade() {
                if ev.contains(Events::TCP_RESET) {
                    s.post(Inbox::ResetTcp(self.token));
                }
                // Its release waits for both: closed, and let go by the application
                // (`released`). Let go first, the event thread is told now; else the
                // application's release tells it (`SmcHandle::drop`).
                if ev.contains(Events::CLOSED) && st.released {
                    s.post(Inbox::ConnClosed(self.token));
                }
            }
        }
    }

    /// The links other than `arriving` whose completion queues may still hold CDCs the
    /// peer sent this connection before its failover (RFC 7609 §4.6.1): the link it is
    /// on (the peer moved first) and the one it left last (we moved first). Taken
    /// without the connection's lock held while they are drained (their handlers take
    /// it).
    pub(crate) fn links_to_drain_before_validation(
        &self,
        arriving: &LinkRes,
    ) -> [Option<Arc<LinkRes>>; 2] {
        let st = self.lock();
        let other = |l: Arc<LinkRes>| (!std::ptr::eq(&*l, arriving)).then_some(l);
        let cur = st.rdma().and_then(|p| other(p.link.clone()));
        let left = st
            .left_link
            .as_ref()
            .and_then(Weak::upgrade)
            .and_then(other)
            .filter(|l| cur.as_ref().is_none_or(|c| !Arc::ptr_eq(c, l)));
        [cur, left]
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

    /// A CDC's send completion (completion thread). A failure stops transmission; the
    /// link's error reaches the endpoint (`Inbox::LinkError`, posted by the link), which
    /// moves the connection to another link (`ConnAction::Failover`, RFC 7609 §4.6) or
    /// ends it (§4.8.3). Completions of a link the connection has left concern CDCs
    /// the failover already counted as lost; the machine ignores them.
    pub(crate) fn on_cdc_complete(&self, seq: u16, ok: bool) {
        let mut st = self.lock();
        if ok {
            st.conn.on_cdc_sent(seq);
        } else {
            st.conn.on_cdc_send_failed(seq);
            if st.conn.needs_failover() {
                debug!(token = self.token, "CDC send failed: waiting for failover");
            }
        }
        self.drive(&mut st, Instant::now());
    }

    /// RFC 7609 §4.6: the connection moves to `path` (event thread). The old link's QP
    /// goes to the error state first, so that nothing posted there can still reach
    /// the peer (§2.3: the writes end before the connection moves; their completions,
    /// flushed, are ignored). Then the validation CDC goes first on the new link and the
    /// unconfirmed writes are replayed (`Conn::prepare_failover`). A same-host
    /// connection has no link to lose (and is in no link group): nothing to do.
    pub(crate) fn fail_over(&self, st: &mut ConnState, path: RdmaPath, now: Instant) {
        let Path::Rdma(cur) = &mut st.path else {
            debug!(
                token = self.token,
                "failover of a same-host connection: ignored"
            );
            return;
        };
        let old = std::mem::replace(cur, path);
        old.link.fail();
        st.left_link = Some(Arc::downgrade(&old.link));
        st.waiting_slots = false;
        st.failovers += 1;
        st.validation = st.conn.prepare_failover();
        self.drive(st, now);
    }
}
