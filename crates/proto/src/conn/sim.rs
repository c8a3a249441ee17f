//! A deterministic simulator: two [`Conn`]s back to back over a fake reliable-connected
//! link, with byte arrays for the send buffers and RMB elements.
//!
//! The link executes what `poll_transmit` returns the way an RC QP does: WRs of one
//! direction are carried out in order; "delivering" a WR copies its RDMA WRITEs from the
//! sender's sndbuf *as it is at that moment* into the receiver's RMBE and queues the CDC
//! at the receiver; the sender's send completion and the receiver's processing of the
//! CDC are separate steps that a test (or the seeded random driver) interleaves at will.
//! A link failure delivers a prefix of what was posted, loses the rest, completes a
//! prefix of what was delivered successfully and fails the rest, then both sides fail
//! over (RFC 7609 §4.6).
//!
//! The simulator checks, on every write, that nothing lands on the eye catcher or
//! beyond the element, and that no unread byte is overwritten by a different stream
//! byte (CHECKLIST WIN-1, TC-FLOW-10, TC-FLOW-16). [`run_random`] drives writes, reads,
//! urgent data, deliveries, completions, time, link failures and closes from a seed and
//! checks that every byte arrives exactly once and in order and that both sides reach
//! CLOSED without an error.
//!
//! Available to this crate's tests and, with the `testing` feature, to other crates.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::{
    CdcOutcome, CdcRepr, Conn, ConnConfig, ConnParams, Cursor, Events, OobError, RmbeGeometry,
    RmbeWrite, State, Transmit,
};

/// Alert token of side A (what B puts in its CDCs).
pub const TOKEN_A: u32 = 0xA1;
/// Alert token of side B.
pub const TOKEN_B: u32 = 0xB2;
/// The eye catcher the simulator writes into RFC-mode RMBEs (contents are
/// implementation-defined, RFC 7609 §4.2).
pub const EYE_CATCHER: [u8; 4] = *b"SMCR";

/// One end of the simulated connection.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Side {
    /// The first host.
    A,
    /// The second host.
    B,
}

impl Side {
    /// The other side.
    pub fn peer(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }
}

/// How one host is set up.
#[derive(Clone, Debug)]
pub struct HostConfig {
    /// This host's RMB element.
    pub rmbe: RmbeGeometry,
    /// This host's send buffer length.
    pub sndbuf_len: u32,
    /// This host's policies.
    pub conn: ConnConfig,
    /// Initial cursor of the data flowing *into* this host's RMBE (both hosts agree on
    /// it); `None` = `(0, data_off)`.
    pub rx_start: Option<Cursor>,
    /// `TCP_CORK` set on this host's connection from the start ([`Conn::set_cork`]).
    pub tcp_cork: bool,
}

impl HostConfig {
    /// A host with this RMBE and sndbuf and default policies.
    pub fn new(rmbe: RmbeGeometry, sndbuf_len: u32) -> Self {
        HostConfig {
            rmbe,
            sndbuf_len,
            conn: ConnConfig::default(),
            rx_start: None,
            tcp_cork: false,
        }
    }
}

/// One posted CDC with its writes, as seen on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceItem {
    /// Who sent it.
    pub from: Side,
    /// The RDMA WRITEs before the CDC.
    pub writes: Vec<RmbeWrite>,
    /// The CDC.
    pub cdc: CdcRepr,
}

#[derive(Debug)]
enum Wr {
    Data(Transmit),
    Validation(CdcRepr),
}

/// A simulated host: its connection and its memory.
#[derive(Debug)]
pub struct Host {
    /// The connection machine.
    pub conn: Conn,
    /// Send buffer contents.
    pub sndbuf: Vec<u8>,
    /// RMB element contents (the peer writes here).
    pub rmbe: Vec<u8>,
    /// Stream index of the byte in each sndbuf slot.
    sndbuf_tag: Vec<u64>,
    /// Stream index of the unread byte in each RMBE slot.
    rmbe_tag: Vec<Option<u64>>,
    geometry: RmbeGeometry,
    /// RMBE position of incoming stream byte 0.
    r0: u64,
    /// Incoming stream bytes whose slots were released.
    freed: u64,
    /// Bytes read in-band.
    pub inband: Vec<u8>,
    /// Bytes read with `read_oob`.
    pub oob: Vec<u8>,
    /// Events accumulated from the connection.
    pub events: Events,
    /// Outcome of every CDC processed.
    pub outcomes: Vec<CdcOutcome>,
    /// Stream indices of the urgent bytes this host sent.
    pub urgent_sent: Vec<u64>,
    rq: VecDeque<CdcRepr>,
    cq: VecDeque<u16>,
    seed: u64,
    /// This host's TCP reset has reached the peer.
    rst_delivered: bool,
}

impl Host {
    fn new(cfg: &HostConfig, peer: &HostConfig, token: u32, peer_token: u32, seed: u64) -> Self {
        let mut params = ConnParams::new(cfg.rmbe, peer.rmbe, cfg.sndbuf_len, token, peer_token);
        if let Some(c) = cfg.rx_start {
            params.rx_start = c;
        }
        if let Some(c) = peer.rx_start {
            params.tx_start = c;
        }
        let mut conn = Conn::new(params, cfg.conn.clone()).expect("simulator host parameters");
        conn.set_cork(cfg.tcp_cork);
        let len = cfg.rmbe.elem_len() as usize;
        let mut rmbe = vec![0u8; len];
        let h = cfg.rmbe.data_off() as usize;
        for (i, b) in rmbe[..h].iter_mut().enumerate() {
            *b = EYE_CATCHER[i % 4];
        }
        Host {
            conn,
            sndbuf: vec![0; cfg.sndbuf_len as usize],
            rmbe,
            sndbuf_tag: vec![u64::MAX; cfg.sndbuf_len as usize],
            rmbe_tag: vec![None; len],
            geometry: cfg.rmbe,
            r0: cfg.rmbe.position_of(params.rx_start),
            freed: 0,
            inband: Vec::new(),
            oob: Vec::new(),
            events: Events::empty(),
            outcomes: Vec::new(),
            urgent_sent: Vec::new(),
            rq: VecDeque::new(),
            cq: VecDeque::new(),
            seed,
            rst_delivered: false,
        }
    }

    /// The byte this host sends at stream index `i` (a deterministic pattern).
    pub fn stream_byte(&self, i: u64) -> u8 {
        (splitmix64(self.seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> 56) as u8
    }

    /// The first `n` bytes of this host's outgoing stream.
    pub fn stream(&self, n: u64) -> Vec<u8> {
        (0..n).map(|i| self.stream_byte(i)).collect()
    }

    /// Whether the eye catcher is intact.
    pub fn eye_catcher_intact(&self) -> bool {
        let h = self.geometry.data_off() as usize;
        self.rmbe[..h]
            .iter()
            .enumerate()
            .all(|(i, &b)| b == EYE_CATCHER[i % 4])
    }

    /// Pull the connection's events into [`Host::events`] and release the RMBE slots of
    /// consumed bytes. The simulator does this itself; call it after driving `conn`
    /// directly.
    pub fn collect(&mut self) {
        self.events |= self.conn.take_events();
        // Release the tags of consumed bytes (including a skipped urgent byte).
        let consumed = self.conn.rx_consumed();
        while self.freed < consumed {
            let slot = self.geometry.offset_of(self.r0 + self.freed) as usize;
            if self.rmbe_tag[slot] == Some(self.freed) {
                self.rmbe_tag[slot] = None;
            }
            self.freed += 1;
        }
    }
}

/// Two hosts and the link between them.
#[derive(Debug)]
pub struct Sim {
    /// Host A.
    pub a: Host,
    /// Host B.
    pub b: Host,
    ab: VecDeque<Wr>,
    ba: VecDeque<Wr>,
    /// Simulated time.
    pub now: Instant,
    /// Every CDC posted, in posting order.
    pub trace: Vec<TraceItem>,
    /// Violations of the data-path invariants seen by the link.
    pub faults: Vec<String>,
    /// Number of link failures simulated.
    pub failovers: usize,
    /// Bytes placed straight into an RMBE ([`Sim::place`]), both ways.
    pub placed: u64,
}

impl Sim {
    /// Two connected hosts.
    ///
    /// # Panics
    ///
    /// If a host configuration is refused by [`Conn::new`] (a test-setup error).
    pub fn new(a: HostConfig, b: HostConfig) -> Sim {
        Sim {
            a: Host::new(&a, &b, TOKEN_A, TOKEN_B, 0x5EED_000A),
            b: Host::new(&b, &a, TOKEN_B, TOKEN_A, 0x5EED_000B),
            ab: VecDeque::new(),
            ba: VecDeque::new(),
            now: Instant::now(),
            trace: Vec::new(),
            faults: Vec::new(),
            failovers: 0,
            placed: 0,
        }
    }

    /// A host.
    pub fn host(&self, side: Side) -> &Host {
        match side {
            Side::A => &self.a,
            Side::B => &self.b,
        }
    }

    /// A host, mutably.
    pub fn host_mut(&mut self, side: Side) -> &mut Host {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// The connection of a side.
    pub fn conn(&mut self, side: Side) -> &mut Conn {
        &mut self.host_mut(side).conn
    }

    /// The application of `side` writes up to `n` bytes of its stream; the last one is
    /// urgent if `urgent` and all `n` fit. Returns the bytes written.
    pub fn write(&mut self, side: Side, n: u64, urgent: bool) -> u64 {
        let h = self.host_mut(side);
        let Ok(space) = h.conn.tx_space() else {
            return 0;
        };
        let mut done = 0u64;
        let base = h.conn.tx_committed();
        for r in space.as_slice() {
            for k in 0..r.len {
                if done == n {
                    break;
                }
                let i = base + done;
                let slot = (r.off + k) as usize;
                h.sndbuf[slot] = h.stream_byte(i);
                h.sndbuf_tag[slot] = i;
                done += 1;
            }
        }
        let urgent = urgent && done == n && n > 0;
        h.conn
            .tx_commit(done as u32, urgent)
            .expect("commit of offered space");
        if urgent {
            h.urgent_sent.push(base + done - 1);
        }
        h.collect();
        done
    }

    /// The application of `side` puts up to `n` bytes of its stream straight into the
    /// peer's RMBE ([`Conn::tx_place_space`], the same-host path), checked like a
    /// delivered write (no unread byte overwritten). Returns the bytes placed: 0 when
    /// the connection offers no place now (it must write through the sndbuf).
    pub fn place(&mut self, side: Side, n: u64) -> u64 {
        let mut faults = Vec::new();
        let done = Self::place_into(self.hosts(side), n, &mut faults);
        self.faults.extend(faults);
        self.placed += done;
        done
    }

    fn place_into((s, r): (&mut Host, &mut Host), n: u64, faults: &mut Vec<String>) -> u64 {
        let Ok(space) = s.conn.tx_place_space() else {
            return 0;
        };
        let base = s.conn.tx_committed();
        let consumed = r.conn.rx_consumed();
        let mut done = 0u64;
        for reg in space.as_slice() {
            for k in 0..reg.len {
                if done == n {
                    break;
                }
                let i = base + done;
                let dst = (reg.off + k) as usize;
                if reg.off + k < r.geometry.data_off() || dst >= r.rmbe.len() {
                    faults.push(format!("place {reg:?} outside the data area"));
                    return done;
                }
                if let Some(old) = r.rmbe_tag[dst].filter(|&old| old >= consumed) {
                    faults.push(format!(
                        "overrun: placed stream byte {i} over unread byte {old} at offset {dst}"
                    ));
                    return done;
                }
                r.rmbe[dst] = s.stream_byte(i);
                r.rmbe_tag[dst] = Some(i);
                done += 1;
            }
        }
        s.conn
            .tx_place_commit(done as u32)
            .expect("commit of offered place");
        s.collect();
        done
    }

    /// The application of `side` reads up to `max` bytes in-band. Returns the count.
    pub fn read(&mut self, side: Side, max: u64) -> u64 {
        let h = self.host_mut(side);
        let avail = h.conn.rx_available();
        let mut got = 0u64;
        for r in avail.as_slice() {
            for k in 0..r.len {
                if got == max {
                    break;
                }
                h.inband.push(h.rmbe[(r.off + k) as usize]);
                got += 1;
            }
        }
        h.conn
            .rx_consume(got as u32)
            .expect("consume of offered data");
        h.collect();
        got
    }

    /// Read everything available, across the urgent mark, until nothing is left.
    pub fn read_all(&mut self, side: Side) -> u64 {
        let mut total = 0;
        loop {
            let n = self.read(side, u64::MAX);
            if n == 0 {
                return total;
            }
            total += n;
        }
    }

    /// `recv(MSG_OOB)` on `side`.
    pub fn read_oob(&mut self, side: Side) -> Result<u8, OobError> {
        let h = self.host_mut(side);
        let r = h.conn.read_oob();
        if let Ok(b) = r {
            h.oob.push(b);
        }
        h.collect();
        r
    }

    /// Post everything `side` wants to transmit.
    pub fn post(&mut self, side: Side) -> usize {
        let now = self.now;
        let mut n = 0;
        loop {
            let h = self.host_mut(side);
            let Some(t) = h.conn.poll_transmit(now) else {
                h.collect();
                return n;
            };
            h.collect();
            self.trace.push(TraceItem {
                from: side,
                writes: t.writes().to_vec(),
                cdc: t.cdc,
            });
            self.queue(side).push_back(Wr::Data(t));
            n += 1;
        }
    }

    /// Post for both sides.
    pub fn post_all(&mut self) -> usize {
        self.post(Side::A) + self.post(Side::B)
    }

    fn queue(&mut self, from: Side) -> &mut VecDeque<Wr> {
        match from {
            Side::A => &mut self.ab,
            Side::B => &mut self.ba,
        }
    }

    /// WRs posted by `from` and not yet delivered.
    pub fn in_flight(&self, from: Side) -> usize {
        match from {
            Side::A => self.ab.len(),
            Side::B => self.ba.len(),
        }
    }

    /// CDCs delivered to `side` and not yet processed.
    pub fn rx_queued(&self, side: Side) -> usize {
        self.host(side).rq.len()
    }

    /// Completions pending for `side`.
    pub fn completions_queued(&self, side: Side) -> usize {
        self.host(side).cq.len()
    }

    fn hosts(&mut self, from: Side) -> (&mut Host, &mut Host) {
        match from {
            Side::A => (&mut self.a, &mut self.b),
            Side::B => (&mut self.b, &mut self.a),
        }
    }

    /// The link carries out the oldest WR from `from`: writes are placed, the CDC is
    /// queued at the peer, the completion at the sender.
    pub fn deliver(&mut self, from: Side) -> bool {
        let Some(wr) = self.queue(from).pop_front() else {
            return false;
        };
        let mut faults = Vec::new();
        let (s, r) = self.hosts(from);
        match wr {
            Wr::Data(t) => {
                for w in t.writes() {
                    place(s, r, w, &mut faults);
                }
                r.rq.push_back(t.cdc);
                s.cq.push_back(t.cdc.seqno);
            }
            Wr::Validation(m) => r.rq.push_back(m),
        }
        self.faults.extend(faults);
        true
    }

    /// The oldest WR from `from` is lost on the wire (no placement, no CDC).
    pub fn drop_in_flight(&mut self, from: Side) -> Option<u16> {
        match self.queue(from).pop_front()? {
            Wr::Data(t) => Some(t.cdc.seqno),
            Wr::Validation(m) => Some(m.seqno),
        }
    }

    /// `side` processes its oldest received CDC.
    pub fn process(&mut self, side: Side) -> Option<CdcOutcome> {
        let now = self.now;
        let h = self.host_mut(side);
        let m = h.rq.pop_front()?;
        let Host { conn, rmbe, .. } = h;
        let out = conn.handle_cdc(&m, now, |off| rmbe[off as usize]);
        h.outcomes.push(out);
        h.collect();
        Some(out)
    }

    /// `side` processes its oldest send completion (successful).
    pub fn complete(&mut self, side: Side) -> bool {
        let h = self.host_mut(side);
        let Some(seq) = h.cq.pop_front() else {
            return false;
        };
        h.conn.on_cdc_sent(seq);
        h.collect();
        true
    }

    /// `side`'s queued send completions all fail (the link went down after their WRs
    /// were carried out: the peer has them, the sender is never told). Returns their
    /// seqnos.
    pub fn fail_completions(&mut self, side: Side) -> Vec<u16> {
        let h = self.host_mut(side);
        let failed: Vec<u16> = h.cq.drain(..).collect();
        for &seq in &failed {
            h.conn.on_cdc_send_failed(seq);
        }
        h.collect();
        failed
    }

    /// Deliver, process and complete everything, posting as the hosts react, until the
    /// link is idle. Applications do not read.
    pub fn flush(&mut self) {
        loop {
            let mut progress = self.post_all() > 0;
            for side in [Side::A, Side::B] {
                while self.deliver(side) {
                    progress = true;
                }
            }
            for side in [Side::A, Side::B] {
                while self.process(side).is_some() {
                    progress = true;
                }
                while self.complete(side) {
                    progress = true;
                }
            }
            if !progress {
                return;
            }
        }
    }

    /// Advance time by `d` and run both hosts' timers.
    pub fn advance(&mut self, d: Duration) {
        self.now += d;
        let now = self.now;
        for side in [Side::A, Side::B] {
            let h = self.host_mut(side);
            if h.conn.poll_timeout().is_some_and(|t| t <= now) {
                h.conn.on_timeout(now);
            }
            h.collect();
        }
    }

    /// Advance time to the earliest pending timer, if any.
    pub fn advance_to_next_timer(&mut self) -> bool {
        let next = [self.a.conn.poll_timeout(), self.b.conn.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        match next {
            Some(t) => {
                let d = t.saturating_duration_since(self.now);
                self.advance(d);
                true
            }
            None => false,
        }
    }

    /// The link fails: a random prefix of each direction's posted WRs is delivered,
    /// the rest lost; a random prefix of the delivered-but-uncompleted ones completes
    /// successfully, the rest fail. Then both sides move to a new link, which starts
    /// with their failover validation messages (RFC 7609 §4.6.1).
    pub fn fail_link(&mut self, rng: &mut Rng) {
        self.failovers += 1;
        for from in [Side::A, Side::B] {
            let posted = self.in_flight(from) as u64;
            let deliver = rng.below(posted + 1);
            for _ in 0..deliver {
                self.deliver(from);
            }
            let mut lost = Vec::new();
            while let Some(seq) = self.drop_in_flight(from) {
                lost.push(seq);
            }
            let h = self.host_mut(from);
            let ok = rng.below(h.cq.len() as u64 + 1);
            for _ in 0..ok {
                let seq = h.cq.pop_front().expect("counted");
                h.conn.on_cdc_sent(seq);
            }
            let failed: Vec<u16> = h.cq.drain(..).chain(lost).collect();
            for seq in failed {
                h.conn.on_cdc_send_failed(seq);
            }
            h.collect();
        }
        for from in [Side::A, Side::B] {
            let h = self.host_mut(from);
            let f = h.conn.prepare_failover();
            h.collect();
            if let Some(f) = f {
                self.queue(from).push_back(Wr::Validation(f));
            }
        }
    }

    /// The last `n` posted CDCs, one per line (for failure messages).
    pub fn recent_trace(&self, n: usize) -> String {
        let skip = self.trace.len().saturating_sub(n);
        self.trace[skip..]
            .iter()
            .map(|t| {
                format!(
                    "{:?} seq {} prod {:?} cons {:?} {:?} {:?} bytes {}",
                    t.from,
                    t.cdc.seqno,
                    t.cdc.prod,
                    t.cdc.cons,
                    t.cdc.prod_flags,
                    t.cdc.conn_flags,
                    t.writes.iter().map(|w| u64::from(w.len)).sum::<u64>()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The TCP connection carries a reset to the peer once a host asked for one
    /// ([`Events::TCP_RESET`]): the peer sees `on_tcp_reset`.
    pub fn deliver_tcp_resets(&mut self) {
        let now = self.now;
        for side in [Side::A, Side::B] {
            let (h, p) = self.hosts(side);
            if h.events.contains(Events::TCP_RESET) && !h.rst_delivered {
                h.rst_delivered = true;
                p.conn.on_tcp_reset(now);
                p.collect();
            }
        }
    }

    /// Take the trace recorded so far.
    pub fn take_trace(&mut self) -> Vec<TraceItem> {
        std::mem::take(&mut self.trace)
    }
}

/// Carry out one RDMA WRITE from `s`'s sndbuf into `r`'s RMBE, checking the invariants.
fn place(s: &Host, r: &mut Host, w: &RmbeWrite, faults: &mut Vec<String>) {
    let g = r.geometry;
    if w.dst_off < g.data_off() || u64::from(w.dst_off) + u64::from(w.len) > u64::from(g.elem_len())
    {
        faults.push(format!("write {w:?} outside the data area of {g:?}"));
        return;
    }
    if u64::from(w.src_off) + u64::from(w.len) > s.sndbuf.len() as u64 {
        faults.push(format!("write {w:?} outside the sndbuf"));
        return;
    }
    let consumed = r.conn.rx_consumed();
    for k in 0..w.len {
        let src = (w.src_off + k) as usize;
        let dst = (w.dst_off + k) as usize;
        let tag = s.sndbuf_tag[src];
        r.rmbe[dst] = s.sndbuf[src];
        if tag < consumed {
            // A failover replay of bytes the reader already consumed: the slot is free.
            continue;
        }
        if let Some(old) = r.rmbe_tag[dst] {
            if old != tag {
                faults.push(format!(
                    "overrun: stream byte {tag} overwrote unread byte {old} at offset {dst}"
                ));
                return;
            }
        }
        r.rmbe_tag[dst] = Some(tag);
    }
}

/// SplitMix64: a small, fixed PRNG so that seeds replay identically forever.
pub fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Seeded random numbers for the driver.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        splitmix64(self.0)
    }

    /// Uniform in `[0, n)`; 0 when `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// True with probability `pct` percent.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
}

/// What [`run_random`] exercises.
#[derive(Clone, Debug)]
pub struct RandomOpts {
    /// Random actions before the orderly end phase.
    pub steps: usize,
    /// Upper bound of each side's stream length.
    pub max_stream: u64,
    /// Upper bound of one write or read.
    pub max_io: u64,
    /// Send urgent bytes now and then.
    pub urgent: bool,
    /// Fail the link now and then.
    pub failover: bool,
    /// Abort (SO_LINGER 0) one side at a random moment instead of closing normally.
    pub abort: bool,
    /// Put half of the writes straight into the peer's RMBE where the connection offers
    /// it ([`Sim::place`]); not with `failover` (placed bytes cannot be replayed).
    pub place: bool,
}

impl Default for RandomOpts {
    fn default() -> Self {
        RandomOpts {
            steps: 2000,
            max_stream: 40_000,
            max_io: 3000,
            urgent: false,
            failover: false,
            abort: false,
            place: false,
        }
    }
}

/// Summary of a random run.
#[derive(Clone, Debug, Default)]
pub struct RandomReport {
    /// Bytes A → B.
    pub a_to_b: u64,
    /// Bytes B → A.
    pub b_to_a: u64,
    /// CDCs posted.
    pub cdcs: usize,
    /// Link failures.
    pub failovers: usize,
    /// Whether an abort was injected.
    pub aborted: bool,
    /// Bytes placed straight into an RMBE.
    pub placed: u64,
}

/// The in-band bytes `receiver` must have read of `sender`'s stream of `n` bytes.
fn expected_inband(sender: &Host, n: u64, receiver_inline: bool) -> Vec<u8> {
    let mut urgent = sender.urgent_sent.clone();
    urgent.sort_unstable();
    (0..n)
        .filter(|i| receiver_inline || urgent.binary_search(i).is_err())
        .map(|i| sender.stream_byte(i))
        .collect()
}

/// Everything that changes when the simulation makes progress.
fn progress_marker(sim: &Sim) -> impl PartialEq {
    (
        sim.trace.len(),
        sim.a.inband.len(),
        sim.b.inband.len(),
        sim.a.conn.state(),
        sim.b.conn.state(),
        sim.a.conn.snapshot(),
        sim.b.conn.snapshot(),
    )
}

/// Drive two hosts from `seed` (see the module documentation) and check the outcome.
pub fn run_random(
    seed: u64,
    a: HostConfig,
    b: HostConfig,
    opts: &RandomOpts,
) -> Result<RandomReport, String> {
    let inline = [a.conn.oob_inline, b.conn.oob_inline];
    let mut sim = Sim::new(a, b);
    let mut rng = Rng::new(seed);
    let target = [
        rng.below(opts.max_stream + 1),
        rng.below(opts.max_stream + 1),
    ];
    let abort_step = opts
        .abort
        .then(|| rng.below(opts.steps as u64 + 1) as usize);
    let mut aborted = false;
    let mut aborter = Side::A;
    let sides = [Side::A, Side::B];
    let idx = |s: Side| if s == Side::A { 0 } else { 1 };

    let app_step = |sim: &mut Sim, side: Side, rng: &mut Rng, random: bool| {
        let i = idx(side);
        let h = sim.host(side);
        let written = h.conn.tx_committed();
        if written < target[i] {
            let n = if random {
                (1 + rng.below(opts.max_io)).min(target[i] - written)
            } else {
                target[i] - written
            };
            // Non-inline receivers need one urgent byte at a time for an exact oracle.
            let may_urgent = opts.urgent
                && random
                && (inline[idx(side.peer())] || !h.conn.tx_urgent_outstanding());
            let urgent = may_urgent && rng.chance(15);
            let placed = opts.place && !urgent && rng.chance(50) && sim.place(side, n) > 0;
            if !placed {
                sim.write(side, n, urgent);
            }
        } else if sim.host(side).conn.state() == State::Active
            || sim.host(side).conn.state() == State::AppCloseWait1
        {
            let now = sim.now;
            let h = sim.host_mut(side);
            // Done writing: close if the peer is done too, else half-close.
            if h.conn.rx_eof() {
                h.conn.close(now);
            } else if !random || rng.chance(30) {
                let _ = h.conn.shutdown_write(now);
            }
            h.collect();
        }
        let now = sim.now;
        let h = sim.host_mut(side);
        if h.conn.rx_eof()
            && !matches!(h.conn.state(), State::Closed)
            && h.conn.tx_committed() == target[i]
        {
            h.conn.close(now);
            h.collect();
        }
    };

    for step in 0..opts.steps {
        if abort_step == Some(step) {
            let side = if rng.chance(50) { Side::A } else { Side::B };
            let now = sim.now;
            // An abort after the normal close finished changes nothing.
            aborted = sim.host(side).conn.state() != State::Closed;
            aborter = side;
            sim.conn(side).abort(now);
            sim.host_mut(side).collect();
        }
        let side = if rng.chance(50) { Side::A } else { Side::B };
        match rng.below(13) {
            0..=2 => app_step(&mut sim, side, &mut rng, true),
            3 | 4 => {
                let n = 1 + rng.below(opts.max_io);
                sim.read(side, n);
            }
            5 => {
                if opts.urgent {
                    let _ = sim.read_oob(side);
                }
            }
            6 | 7 => {
                sim.deliver(side);
            }
            8 | 9 => {
                sim.process(side);
            }
            10 | 11 => {
                sim.complete(side);
            }
            _ => {
                if rng.chance(20) {
                    let ms = 10 + rng.below(290);
                    sim.advance(Duration::from_millis(ms));
                } else if opts.failover && rng.chance(10) && !aborted {
                    sim.fail_link(&mut rng);
                }
            }
        }
        sim.deliver_tcp_resets();
        sim.post_all();
        if !sim.faults.is_empty() {
            return Err(format!(
                "seed {seed} step {step}: {:?}\n{}",
                sim.faults,
                sim.recent_trace(16)
            ));
        }
    }

    // Orderly end: finish writing, read everything, close, until both are CLOSED.
    // Every round moves at least one byte or fires a timer; a 1-byte sndbuf needs a
    // round per byte.
    let rounds = 4 * opts.max_stream + 10_000;
    for round in 0..rounds {
        if sides
            .iter()
            .all(|&s| sim.host(s).conn.state() == State::Closed)
        {
            break;
        }
        let before = progress_marker(&sim);
        for side in sides {
            app_step(&mut sim, side, &mut rng, false);
            sim.read_all(side);
            if opts.urgent {
                let _ = sim.read_oob(side);
            }
        }
        sim.flush();
        sim.deliver_tcp_resets();
        sim.flush();
        let after = progress_marker(&sim);
        if before == after && !sim.advance_to_next_timer() {
            return Err(format!(
                "seed {seed}: stuck in round {round}: A {} B {} (A {:?}, B {:?})\n{}",
                sim.a.conn.state(),
                sim.b.conn.state(),
                sim.a.conn.snapshot(),
                sim.b.conn.snapshot(),
                sim.recent_trace(12)
            ));
        }
        if !sim.faults.is_empty() {
            return Err(format!("seed {seed} end phase: {:?}", sim.faults));
        }
    }
    for side in sides {
        let h = sim.host(side);
        if h.conn.state() != State::Closed {
            return Err(format!("seed {seed}: {side:?} ended in {}", h.conn.state()));
        }
        if !h.eye_catcher_intact() {
            return Err(format!("seed {seed}: {side:?} eye catcher overwritten"));
        }
    }
    let report = RandomReport {
        a_to_b: sim.a.conn.tx_committed(),
        b_to_a: sim.b.conn.tx_committed(),
        cdcs: sim.trace.len(),
        failovers: sim.failovers,
        aborted,
        placed: sim.placed,
    };
    for (rx, tx) in [(Side::A, Side::B), (Side::B, Side::A)] {
        let (r, s) = (sim.host(rx), sim.host(tx));
        let want = expected_inband(s, s.conn.tx_committed(), inline[idx(rx)]);
        if aborted {
            if r.inband.len() > want.len() || r.inband[..] != want[..r.inband.len()] {
                return Err(format!("seed {seed}: {rx:?} read bytes that were not sent"));
            }
            // The peer of the aborter may have finished its normal close first.
            if rx == aborter && r.conn.error().is_none() {
                return Err(format!("seed {seed}: {rx:?} has no error after its abort"));
            }
        } else {
            if let Some(e) = r.conn.error() {
                return Err(format!("seed {seed}: {rx:?} failed: {e}"));
            }
            if r.events.contains(Events::TCP_RESET) {
                return Err(format!("seed {seed}: {rx:?} reset its TCP connection"));
            }
            if r.inband != want {
                let at = r
                    .inband
                    .iter()
                    .zip(&want)
                    .position(|(x, y)| x != y)
                    .unwrap_or(r.inband.len().min(want.len()));
                return Err(format!(
                    "seed {seed}: {rx:?} read {} bytes, expected {}; first difference at {at}",
                    r.inband.len(),
                    want.len()
                ));
            }
            if !r
                .oob
                .iter()
                .all(|b| s.urgent_sent.iter().any(|&i| s.stream_byte(i) == *b))
            {
                return Err(format!("seed {seed}: {rx:?} read an OOB byte never sent"));
            }
        }
    }
    Ok(report)
}
