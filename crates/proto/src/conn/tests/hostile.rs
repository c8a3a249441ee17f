//! A hostile or broken peer: arbitrary CDC messages interleaved with local calls. The
//! machine never panics and its invariants hold whatever arrives (DEVELOPERS.md: bad
//! input always gets a defined outcome).

use std::time::{Duration, Instant};

use super::*;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    /// A CDC: seq delta from the last one, producer/consumer advance or raw cursor,
    /// flag bytes.
    Cdc {
        seq_delta: i16,
        prod: Result<u32, (u16, u32)>,
        cons: Result<u32, (u16, u32)>,
        pf: u8,
        cf: u8,
        failover: bool,
    },
    Write(u32, bool),
    Read(u32),
    Oob,
    Poll,
    Complete,
    Fail,
    Failover,
    Close,
    Shutdown,
    Abort,
    Reset,
    Time(u16),
}

fn cursor_choice() -> impl Strategy<Value = Result<u32, (u16, u32)>> {
    prop_oneof![
        4 => (0u32..3000).prop_map(Ok),
        1 => (any::<u16>(), 0u32..1100).prop_map(Err),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (-3i16..4, cursor_choice(), cursor_choice(), any::<u8>(), any::<u8>(), proptest::bool::weighted(0.05))
            .prop_map(|(seq_delta, prod, cons, pf, cf, failover)| Op::Cdc { seq_delta, prod, cons, pf, cf, failover }),
        3 => (0u32..1500, any::<bool>()).prop_map(|(n, u)| Op::Write(n, u)),
        3 => (0u32..1500).prop_map(Op::Read),
        1 => Just(Op::Oob),
        3 => Just(Op::Poll),
        2 => Just(Op::Complete),
        1 => Just(Op::Fail),
        1 => Just(Op::Failover),
        1 => Just(Op::Close),
        1 => Just(Op::Shutdown),
        1 => Just(Op::Abort),
        1 => Just(Op::Reset),
        1 => (0u16..20_000).prop_map(Op::Time),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn hostile_peer_never_panics(ops in proptest::collection::vec(op(), 1..120), linux in any::<bool>()) {
        let g = if linux { RmbeGeometry::linux(1000).unwrap() } else { RmbeGeometry::rfc(1004).unwrap() };
        let cap = u64::from(g.cap());
        let mut c = Conn::new(ConnParams::new(g, g, 1500, 7, 9), ConnConfig::default()).unwrap();
        let mut now = Instant::now();
        let mut seq: u16 = 0;
        let mut posted: Vec<u16> = Vec::new();
        // The peer's idea of its producer and consumer positions.
        let (mut prod, mut cons) = (0u64, 0u64);
        for op in ops {
            match op {
                Op::Cdc { seq_delta, prod: p, cons: q, pf, cf, failover } => {
                    seq = seq.wrapping_add(seq_delta as u16);
                    let pc = match p { Ok(k) => { prod += u64::from(k); g.cursor_at(prod) } Err((w, o)) => Cursor::new(w, o) };
                    let cc = match q { Ok(k) => { cons += u64::from(k); g.cursor_at(cons) } Err((w, o)) => Cursor::new(w, o) };
                    let mut pf = ProducerFlags::from_bits_retain(pf);
                    if failover { pf |= ProducerFlags::FAILOVER_VALIDATION; } else { pf -= ProducerFlags::FAILOVER_VALIDATION; }
                    let m = CdcRepr { seqno: seq, token: 7, prod: pc, cons: cc, prod_flags: pf, conn_flags: ConnStateFlags::from_bits_retain(cf) };
                    let _ = c.handle_cdc(&m, now, |off| { assert!(off < g.elem_len()); 0 });
                }
                Op::Write(n, u) => {
                    if let Ok(space) = c.tx_space() {
                        let n = n.min(space.total() as u32);
                        c.tx_commit(n, u).unwrap();
                    }
                }
                Op::Read(n) => {
                    let n = n.min(c.rx_available().total() as u32);
                    c.rx_consume(n).unwrap();
                }
                Op::Oob => { let _ = c.read_oob(); }
                Op::Poll => {
                    while let Some(t) = c.poll_transmit(now) {
                        for w in t.writes() {
                            prop_assert!(w.dst_off >= g.data_off() && w.dst_off + w.len <= g.elem_len());
                            prop_assert!(w.src_off + w.len <= 1500);
                        }
                        posted.push(t.cdc.seqno);
                    }
                }
                Op::Complete => { if !posted.is_empty() { c.on_cdc_sent(posted.remove(0)); } }
                Op::Fail => { if let Some(&s) = posted.first() { c.on_cdc_send_failed(s); } }
                Op::Failover => { posted.clear(); let _ = c.prepare_failover(); }
                Op::Close => c.close(now),
                Op::Shutdown => { let _ = c.shutdown_write(now); }
                Op::Abort => c.abort(now),
                Op::Reset => c.on_tcp_reset(now),
                Op::Time(ms) => {
                    now += Duration::from_millis(u64::from(ms) * 10);
                    if c.poll_timeout().is_some_and(|t| t <= now) { c.on_timeout(now); }
                }
            }
            let _ = c.take_events();
            // Invariants.
            let s = c.snapshot();
            prop_assert!(c.rx_available().total() <= cap);
            prop_assert!(c.rx_unread() <= cap);
            prop_assert!(g.dist(s.tx_peer_cons, s.tx_prod) <= cap);
            prop_assert!(s.tx_unsent <= s.tx_unacked && s.tx_unacked <= 1500);
            prop_assert!(g.is_valid(s.tx_prod) && g.is_valid(s.rx_cons));
        }
    }
}
