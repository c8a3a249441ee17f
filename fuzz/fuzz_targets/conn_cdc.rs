//! The connection machine (`smc_proto::conn::Conn`) against a hostile peer: arbitrary CDC
//! messages (any seqno, token, cursors and flags, or cursors near the real ones)
//! interleaved with local writes, reads, urgent data, transmits, send completions and
//! failures, failover, shutdown, close, abort, TCP resets and timers, on small RMB
//! elements and send buffers (RFC 7609 and Linux layouts) so that every ring wraps.
//!
//! Input: `ctl[0..4]` (geometries, start cursors, policies) then one action per byte
//! with its parameters taken from the following bytes.
//!
//! Asserts, besides "no panic": the application is never given more bytes than the peer
//! can have written — not beyond the largest producer cursor it sent, and not beyond
//! the consumer cursor we advertised plus our RMBE capacity; readable data lies in our
//! RMBE's data area and never exceeds its capacity; every RDMA WRITE lies inside the
//! peer's RMBE data area and the sndbuf, and ends at the CDC's producer cursor; the
//! producer cursor we announce is never more than the peer's RMBE capacity ahead of any
//! consumer cursor the peer sent (we never overwrite what it has not read); and after
//! the local close and the peer's silence the timers bring the connection to CLOSED.
#![no_main]
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use smc_proto::conn::{
    AbortReason, CdcRepr, Conn, ConnConfig, ConnParams, ConnStateFlags, Cursor, ProducerFlags,
    RmbeGeometry, State, UpdatePolicy, UrgentRelease,
};

const LOCAL_TOKEN: u32 = 0xA1;
const PEER_TOKEN: u32 = 0xB2;

struct Input<'a> {
    data: &'a [u8],
    at: usize,
}

impl Input<'_> {
    fn u8(&mut self) -> Option<u8> {
        let b = self.data.get(self.at).copied();
        self.at += 1;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8().unwrap_or(0), self.u8().unwrap_or(0)])
    }
    fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | u32::from(self.u16()) << 16
    }
}

fn geometry(sel: u8) -> RmbeGeometry {
    let len = [5, 8, 16, 33, 64, 100, 1024, 65536][usize::from(sel & 7)];
    if sel & 8 != 0 {
        RmbeGeometry::rfc(len).unwrap()
    } else {
        RmbeGeometry::linux(len).unwrap()
    }
}

/// Linear index of a valid cursor in the cursor space `[0, 2^16 · cap)`.
fn linear(g: &RmbeGeometry, c: Cursor) -> Option<u64> {
    g.is_valid(c)
        .then(|| u64::from(c.wrap) * u64::from(g.cap()) + u64::from(c.count - g.data_off()))
}

/// The stream offset (from `base`) congruent to `c` that is closest to `near`.
fn unwrap(g: &RmbeGeometry, base: u64, c: Cursor, near: u64) -> Option<u64> {
    let space = u64::from(g.cap()) << 16;
    let rel = (linear(g, c)? + space - base % space) % space;
    let k = near / space;
    [k.wrapping_sub(1), k, k + 1]
        .into_iter()
        .filter_map(|k| k.checked_mul(space).map(|b| b + rel))
        .min_by_key(|p| p.abs_diff(near))
}

struct Harness {
    conn: Conn,
    now: Instant,
    local: RmbeGeometry,
    peer: RmbeGeometry,
    sndbuf_len: u32,
    /// Cursor-space index of our first byte in the peer's RMBE / of the peer's first
    /// byte in ours.
    tx_base: u64,
    rx_base: u64,
    /// Posted CDC seqnos awaiting completion, in order.
    posted: VecDeque<u16>,
    /// Largest producer offset we announced, and the last one.
    prod_hi: u64,
    prod_last: u64,
    /// Largest consumer offset the peer claimed (at most what we had announced then).
    peer_cons_hi: u64,
    /// Largest consumer offset we advertised.
    cons_adv_hi: u64,
    /// Largest producer offset the peer claimed.
    peer_prod_hi: u64,
    /// Bytes the application was given so far (consumed + readable).
    delivered: u64,
    /// The peer's seqno counter.
    peer_seq: u16,
}

impl Harness {
    fn delivered_now(&self) -> u64 {
        self.conn.rx_consumed() + self.conn.rx_unread()
    }

    fn check(&mut self) {
        let _ = self.conn.take_events();
        let avail = self.conn.rx_available();
        assert!(
            avail.total() <= u64::from(self.local.cap()),
            "more readable than the RMBE holds"
        );
        for r in avail.as_slice() {
            assert!(
                r.off >= self.local.data_off()
                    && u64::from(r.off) + u64::from(r.len) <= u64::from(self.local.elem_len()),
                "readable region {r:?} outside the data area of {:?}",
                self.local
            );
        }
        let d = self.delivered_now();
        assert!(
            self.conn.rx_unread() <= u64::from(self.local.cap()),
            "unread beyond capacity"
        );
        assert!(
            d <= self.peer_prod_hi,
            "delivered {d} bytes, the peer never announced more than {}",
            self.peer_prod_hi
        );
        assert!(
            d <= self.cons_adv_hi + u64::from(self.local.cap()),
            "delivered {d} bytes, the peer could write at most {} + {}",
            self.cons_adv_hi,
            self.local.cap()
        );
        // Consumed bytes stay consumed; a reset may discard unread data.
        assert!(self.conn.rx_consumed() <= d);
        self.delivered = self.delivered.max(d);
    }

    /// Our CDC went out: check its writes and cursors.
    fn sent_cdc(&mut self, cdc: &CdcRepr, writes: &[smc_proto::conn::RmbeWrite]) {
        assert_eq!(cdc.token, PEER_TOKEN, "our CDCs carry the peer's token");
        if let Some(c) = unwrap(&self.local, self.rx_base, cdc.cons, self.cons_adv_hi) {
            // The consumer cursor we advertise never passes what the peer produced.
            assert!(
                c <= self.peer_prod_hi.max(self.delivered),
                "advertised consumer {c} ahead"
            );
            self.cons_adv_hi = self.cons_adv_hi.max(c);
        } else {
            panic!("invalid consumer cursor {:?} sent", cdc.cons);
        }
        if cdc.prod_flags.contains(ProducerFlags::FAILOVER_VALIDATION) {
            return;
        }
        let prod = unwrap(&self.peer, self.tx_base, cdc.prod, self.prod_last)
            .unwrap_or_else(|| panic!("invalid producer cursor {:?} sent", cdc.prod));
        let cap = u64::from(self.peer.cap());
        assert!(
            prod <= self.peer_cons_hi + cap,
            "producer {prod} overruns the peer: its consumer is at most {} (cap {cap})",
            self.peer_cons_hi
        );
        let mut total = 0u64;
        for w in writes {
            assert!(w.len > 0, "empty write");
            assert!(
                w.dst_off >= self.peer.data_off()
                    && u64::from(w.dst_off) + u64::from(w.len) <= u64::from(self.peer.elem_len()),
                "write {w:?} outside the peer's data area {:?}",
                self.peer
            );
            assert!(
                u64::from(w.src_off) + u64::from(w.len) <= u64::from(self.sndbuf_len),
                "write {w:?} outside the sndbuf"
            );
            total += u64::from(w.len);
        }
        assert!(
            total <= cap,
            "one transmit writes more than the peer's RMBE"
        );
        if let Some(w) = writes.last() {
            let end = w.dst_off + w.len;
            let end = if end == self.peer.elem_len() {
                self.peer.data_off()
            } else {
                end
            };
            assert_eq!(end, cdc.prod.count, "the writes end at the producer cursor");
        }
        self.prod_last = prod;
        self.prod_hi = self.prod_hi.max(prod);
    }

    fn transmit(&mut self) {
        for _ in 0..64 {
            let Some(t) = self.conn.poll_transmit(self.now) else {
                return;
            };
            self.sent_cdc(&t.cdc, t.writes());
            self.posted.push_back(t.cdc.seqno);
        }
    }

    fn complete(&mut self, n: usize) {
        for _ in 0..n {
            let Some(seq) = self.posted.pop_front() else {
                return;
            };
            self.conn.on_cdc_sent(seq);
        }
    }

    fn timers(&mut self, by: Duration) {
        let target = self.now + by;
        for _ in 0..16 {
            match self.conn.poll_timeout() {
                Some(t) if t <= target => {
                    self.now = self.now.max(t);
                    self.conn.on_timeout(self.now);
                }
                _ => break,
            }
        }
        self.now = target;
    }

    fn receive(&mut self, inp: &mut Input) {
        let mode = inp.u8().unwrap_or(0);
        let seq = if mode & 1 != 0 {
            inp.u16()
        } else {
            self.peer_seq
                .wrapping_add(inp.u8().unwrap_or(1) as i8 as u16)
        };
        if !ProducerFlags::from_bits_truncate(mode).contains(ProducerFlags::FAILOVER_VALIDATION) {
            self.peer_seq = self.peer_seq.max(seq);
        }
        let token = if mode & 2 != 0 {
            inp.u32()
        } else {
            LOCAL_TOKEN
        };
        let lcap = u64::from(self.local.cap());
        let prod = if mode & 4 != 0 {
            Cursor::new(inp.u16(), inp.u32())
        } else {
            // Near the real producer: up to one capacity ahead, a little behind.
            let delta = u64::from(inp.u16()) % (lcap + 2);
            let pos = (self.peer_prod_hi + delta).saturating_sub(1);
            self.local.cursor_at_from(self.rx_base, pos)
        };
        let cons = if mode & 8 != 0 {
            Cursor::new(inp.u16(), inp.u32())
        } else {
            let back = u64::from(inp.u16()) % (u64::from(self.peer.cap()) + 2);
            let pos = (self.prod_hi + 1).saturating_sub(back);
            self.peer.cursor_at_from(self.tx_base, pos)
        };
        let prod_flags = ProducerFlags::from_bits_truncate(inp.u8().unwrap_or(0));
        let conn_flags = ConnStateFlags::from_bits_truncate(inp.u8().unwrap_or(0));
        let msg = CdcRepr {
            seqno: seq,
            token,
            prod,
            cons,
            prod_flags,
            conn_flags,
        };
        // What the peer claims, as the bounds of the invariants (a claim the machine
        // rejects only widens them).
        if token == LOCAL_TOKEN && !prod_flags.contains(ProducerFlags::FAILOVER_VALIDATION) {
            let d = self.delivered_now();
            if let Some(p) = unwrap(&self.local, self.rx_base, prod, d) {
                self.peer_prod_hi = self.peer_prod_hi.max(p);
            }
            if let Some(c) = unwrap(&self.peer, self.tx_base, cons, self.prod_hi) {
                self.peer_cons_hi = self.peer_cons_hi.max(c.min(self.prod_hi));
            }
        }
        let local = self.local;
        let now = self.now;
        self.conn.handle_cdc(&msg, now, |off| {
            assert!(
                off >= local.data_off() && off < local.elem_len(),
                "urgent byte read at {off} outside the data area of {local:?}"
            );
            0x55
        });
    }
}

trait CursorFrom {
    fn cursor_at_from(&self, base: u64, pos: u64) -> Cursor;
}

impl CursorFrom for RmbeGeometry {
    /// The cursor of stream offset `pos` when offset 0 is cursor-space index `base`.
    fn cursor_at_from(&self, base: u64, pos: u64) -> Cursor {
        let space = u64::from(self.cap()) << 16;
        self.cursor_at((base + pos) % space)
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let mut inp = Input { data, at: 4 };
    let local = geometry(data[0]);
    let peer = geometry(data[0] >> 4);
    let sndbuf_len = [1, 3, 16, 64, 100, 4096, 7, 65536][usize::from(data[1] & 7)];
    let mut params = ConnParams::new(local, peer, sndbuf_len, LOCAL_TOKEN, PEER_TOKEN);
    if data[1] & 0x08 != 0 {
        // Start near the end of the cursor space: the wrap counter wraps soon.
        params.tx_start = Cursor::new(0xFFFF, peer.data_off() + (u32::from(data[2]) % peer.cap()));
        params.rx_start = Cursor::new(
            0xFFFF,
            local.data_off() + (u32::from(data[3]) % local.cap()),
        );
    }
    let cfg = ConnConfig {
        update_policy: if data[1] & 0x10 != 0 {
            UpdatePolicy::linux()
        } else {
            UpdatePolicy::Rfc
        },
        cork: data[1] & 0x20 != 0,
        oob_inline: data[1] & 0x40 != 0,
        urgent_release: if data[1] & 0x80 != 0 {
            UrgentRelease::PastMark
        } else {
            UrgentRelease::AtMark
        },
        max_inflight: 1 + u16::from(data[2] & 7),
        ..ConnConfig::default()
    };
    let Ok(conn) = Conn::new(params, cfg) else {
        return;
    };
    let mut h = Harness {
        conn,
        now: Instant::now(),
        local,
        peer,
        sndbuf_len,
        tx_base: linear(&peer, params.tx_start).unwrap(),
        rx_base: linear(&local, params.rx_start).unwrap(),
        posted: VecDeque::new(),
        prod_hi: 0,
        prod_last: 0,
        peer_cons_hi: 0,
        cons_adv_hi: 0,
        peer_prod_hi: 0,
        delivered: 0,
        peer_seq: 0,
    };
    while let Some(op) = inp.u8() {
        let now = h.now;
        match op % 16 {
            0..=3 => h.receive(&mut inp),
            4 => {
                let n = u32::from(inp.u8().unwrap_or(1)) * (1 + u32::from(op >> 6));
                if let Ok(space) = h.conn.tx_space() {
                    let n = n.min(space.total() as u32);
                    h.conn
                        .tx_commit(n, op & 0x10 != 0)
                        .expect("commit of offered space");
                }
            }
            5 => {
                let avail = h.conn.rx_available().total() as u32;
                let n = (u32::from(inp.u8().unwrap_or(255)) * (1 + u32::from(op >> 6))).min(avail);
                h.conn.rx_consume(n).expect("consume of offered data");
            }
            6 => {
                let _ = h.conn.read_oob();
            }
            7 => h.transmit(),
            8 => {
                let n = usize::from(op >> 4) + 1;
                h.complete(n);
            }
            9 => {
                if let Some(seq) = h.posted.front().copied() {
                    h.conn.on_cdc_send_failed(seq);
                }
            }
            10 => {
                // Failover: the old link's completions are all in (a prefix succeeded,
                // the rest failed), then the validation message opens the new link.
                let ok = usize::from(op >> 4) % (h.posted.len() + 1);
                h.complete(ok);
                while let Some(seq) = h.posted.pop_front() {
                    h.conn.on_cdc_send_failed(seq);
                }
                if h.conn.needs_failover() {
                    if let Some(f) = h.conn.prepare_failover() {
                        h.sent_cdc(&f, &[]);
                        // It consumes no seqno and gets no completion we track.
                    }
                }
            }
            11 => {
                let _ = h.conn.shutdown_write(now);
            }
            12 => h.conn.close(now),
            13 => match op >> 4 {
                0 => h.conn.abort(now),
                1 => h.conn.on_tcp_reset(now),
                2 => h.conn.kill(AbortReason::LinkLost),
                3 => h.conn.set_nodelay(true),
                4 => h.conn.set_nodelay(false),
                5 => h.conn.set_oob_inline(true),
                6 => h.conn.set_oob_inline(false),
                7 => h.conn.shutdown_read(),
                _ => {}
            },
            _ => {
                let ms = u64::from(inp.u8().unwrap_or(0)) * 10 * (1 + u64::from(op >> 4));
                h.timers(Duration::from_millis(ms));
            }
        }
        h.check();
    }

    // End: the application closes, the link completes everything, the peer goes
    // silent. The close timers must end the connection.
    let now = h.now;
    h.conn.close(now);
    for _ in 0..64 {
        if h.conn.needs_failover() {
            h.conn.kill(AbortReason::LinkLost);
        }
        h.transmit();
        let n = h.posted.len();
        h.complete(n);
        h.check();
        if h.conn.state() == State::Closed {
            break;
        }
        match h.conn.poll_timeout() {
            Some(t) => {
                h.now = h.now.max(t);
                h.conn.on_timeout(h.now);
            }
            None if h.posted.is_empty() => break,
            None => {}
        }
        h.check();
    }
    assert_eq!(
        h.conn.state(),
        State::Closed,
        "closed, completed and timed out, but not CLOSED: {:?}",
        h.conn.snapshot()
    );
});
