//! Placing written bytes straight into the peer's RMBE ([`Conn::tx_place_space`],
//! the same-host path): where, how much, and what the next transmit announces.

use std::time::Instant;

use super::*;

const LOCAL: u32 = 0x1111;
const PEER: u32 = 0x2222;

/// A lone connection: RFC layout (data from offset 4), 10,000-byte RMBEs (capacity
/// 9,996), a send buffer of `sndbuf` bytes.
fn lone(sndbuf: u32) -> Conn {
    let g = RmbeGeometry::rfc(10_000).unwrap();
    Conn::new(
        ConnParams::new(g, g, sndbuf, LOCAL, PEER),
        ConnConfig::default(),
    )
    .unwrap()
}

/// The peer consumed everything we sent (its consumer cursor at our producer).
fn peer_consumed_all(c: &mut Conn, seq: u16, now: Instant) {
    let g = RmbeGeometry::rfc(10_000).unwrap();
    let snap = c.snapshot();
    let m = CdcRepr {
        seqno: seq,
        token: LOCAL,
        prod: g.initial(),
        cons: snap.tx_prod,
        prod_flags: ProducerFlags::empty(),
        conn_flags: ConnStateFlags::empty(),
    };
    assert_eq!(c.handle_cdc(&m, now, |_| 0), CdcOutcome::Accepted);
}

#[test]
fn placed_bytes_go_out_as_a_cdc_without_writes() {
    let now = Instant::now();
    let mut c = lone(32 * 1024);
    let space = c.tx_place_space().unwrap();
    // The whole window, from the first data byte of the peer's element.
    assert_eq!(space.as_slice(), &[Region { off: 4, len: 9_996 }]);
    c.tx_place_commit(1000).unwrap();
    assert_eq!(c.tx_committed(), 1000);
    let t = c
        .poll_transmit(now)
        .expect("a CDC announces the placed bytes");
    assert!(t.writes().is_empty(), "nothing to write: {:?}", t.writes());
    assert_eq!((t.placed, t.data_len()), (1000, 1000));
    assert_eq!(t.cdc.prod, Cursor::new(0, 1004));
    assert!(c.poll_transmit(now).is_none());
    // They hold send-buffer space until the CDC completes, as written bytes do.
    assert_eq!(c.tx_space().unwrap().total(), 32 * 1024 - 1000);
    c.on_cdc_sent(t.cdc.seqno);
    assert_eq!(c.tx_space().unwrap().total(), 32 * 1024);
    // Next place: after them, what is left of the window.
    let space = c.tx_place_space().unwrap();
    assert_eq!(
        space.as_slice(),
        &[Region {
            off: 1004,
            len: 8_996
        }]
    );
}

#[test]
fn place_is_bounded_by_window_and_send_buffer_and_wraps() {
    let now = Instant::now();
    let mut c = lone(4096);
    assert_eq!(
        c.tx_place_space().unwrap().total(),
        4096,
        "send buffer bounds it"
    );
    assert!(matches!(
        c.tx_place_commit(4097),
        Err(ConnError::InvalidLength {
            requested: 4097,
            available: 4096
        })
    ));
    // Fill the peer's ring up to 100 bytes before its end, all consumed.
    let mut seq = 1;
    let mut left = 9_896u32;
    while left > 0 {
        let n = left.min(4096);
        c.tx_place_commit(n).unwrap();
        let t = c.poll_transmit(now).unwrap();
        c.on_cdc_sent(t.cdc.seqno);
        peer_consumed_all(&mut c, seq, now);
        seq += 1;
        left -= n;
    }
    // The next place wraps: 100 bytes at the end of the element, the rest from 4.
    let space = c.tx_place_space().unwrap();
    assert_eq!(
        space.as_slice(),
        &[
            Region {
                off: 9_900,
                len: 100
            },
            Region { off: 4, len: 3_996 }
        ]
    );
    c.tx_place_commit(4096).unwrap();
    let t = c.poll_transmit(now).unwrap();
    assert!(t.writes().is_empty());
    assert_eq!(t.cdc.prod, Cursor::new(1, 4 + 3_996));
    c.on_cdc_sent(t.cdc.seqno);
    // Not consumed: the window left is 9,996 − 4,096 (the send buffer, 4,096, bounds it).
    assert_eq!(c.tx_place_space().unwrap().total(), 4096);
    c.tx_place_commit(4096).unwrap();
    let t = c.poll_transmit(now).unwrap();
    c.on_cdc_sent(t.cdc.seqno);
    // Now the window bounds it: 9,996 − 8,192.
    assert_eq!(c.tx_place_space().unwrap().total(), 1_804);
    assert!(!c.tx_place_awaits_window());
    c.tx_place_commit(1_804).unwrap();
    let t = c.poll_transmit(now).unwrap();
    c.on_cdc_sent(t.cdc.seqno);
    assert!(c.tx_place_space().unwrap().is_empty());
    assert!(c.tx_place_awaits_window(), "only the window is missing");
    c.tx_commit(1, false).unwrap();
    assert!(
        !c.tx_place_awaits_window(),
        "a byte waits in the send buffer"
    );
}

#[test]
fn no_place_while_the_send_buffer_holds_bytes_or_urgent_data_waits() {
    let now = Instant::now();
    let mut c = lone(32 * 1024);
    // A closed window: 9,996 bytes placed and not consumed.
    c.tx_place_commit(9_996).unwrap();
    let t = c.poll_transmit(now).unwrap();
    c.on_cdc_sent(t.cdc.seqno);
    assert!(c.tx_place_space().unwrap().is_empty(), "window closed");
    // Written bytes wait in the send buffer for the window.
    c.tx_commit(10, false).unwrap();
    assert!(c.poll_transmit(now).is_some_and(|t| t.data_len() == 0));
    peer_consumed_all(&mut c, 1, now);
    assert!(c.tx_place_space().unwrap().is_empty(), "the 10 go first");
    let t = c.poll_transmit(now).unwrap();
    assert_eq!(t.data_len(), 10);
    assert_eq!((t.placed, t.writes().len()), (0, 1));
    c.on_cdc_sent(t.cdc.seqno);
    assert!(
        !c.tx_place_space().unwrap().is_empty(),
        "sent: placing again"
    );
    // An urgent byte pending or held: through the send buffer only.
    c.tx_commit(1, true).unwrap();
    assert!(c.tx_place_space().unwrap().is_empty());
    let t = c.poll_transmit(now).unwrap();
    c.on_cdc_sent(t.cdc.seqno);
    assert!(c.tx_urgent_outstanding());
    assert!(c.tx_place_space().unwrap().is_empty(), "urgent hold");
    // After close, an error as tx_space.
    c.close(now);
    assert!(c.tx_place_space().is_err());
}

#[test]
fn placed_bytes_held_by_the_cork_come_before_written_ones() {
    let now = Instant::now();
    let mut c = lone(32 * 1024);
    c.set_cork(true);
    c.tx_place_commit(100).unwrap();
    assert!(c.poll_transmit(now).is_none(), "held by TCP_CORK");
    assert!(
        c.tx_place_space().unwrap().is_empty(),
        "placed bytes not sent yet"
    );
    c.tx_commit(50, false).unwrap();
    c.set_cork(false);
    let t = c.poll_transmit(now).expect("uncorked");
    assert_eq!((t.placed, t.data_len()), (100, 150));
    // Only the written 50 move: from send-buffer offset 100 to element offset 104.
    assert_eq!(
        t.writes(),
        &[RmbeWrite {
            src_off: 100,
            len: 50,
            dst_off: 104
        }]
    );
}

#[test]
fn failover_with_placed_bytes_unconfirmed_ends_the_connection() {
    let now = Instant::now();
    let mut c = lone(32 * 1024);
    c.tx_place_commit(10).unwrap();
    let t = c.poll_transmit(now).unwrap();
    c.on_cdc_send_failed(t.cdc.seqno);
    assert!(c.prepare_failover().is_none(), "nothing could replay them");
    assert_eq!(c.state(), State::Closed);
    assert!(matches!(
        c.error(),
        Some(ConnError::Aborted(AbortReason::LinkLost))
    ));
    // Confirmed placed bytes are no obstacle.
    let mut c = lone(32 * 1024);
    c.tx_place_commit(10).unwrap();
    let t = c.poll_transmit(now).unwrap();
    c.on_cdc_sent(t.cdc.seqno);
    c.tx_commit(5, false).unwrap();
    let t = c.poll_transmit(now).unwrap();
    c.on_cdc_send_failed(t.cdc.seqno);
    assert!(c.prepare_failover().is_some());
    let t = c.poll_transmit(now).expect("the written 5 are replayed");
    assert_eq!((t.placed, t.data_len()), (0, 5));
}

#[test]
fn placing_nothing_changes_nothing() {
    let now = Instant::now();
    let mut c = lone(32 * 1024);
    c.tx_commit(10, false).unwrap();
    // Bytes wait in the send buffer: no place, and committing 0 placed bytes does not
    // mark the written ones as placed.
    assert!(c.tx_place_space().unwrap().is_empty());
    c.tx_place_commit(0).unwrap();
    let t = c.poll_transmit(now).unwrap();
    assert_eq!((t.placed, t.writes().len(), t.data_len()), (0, 1, 10));
}
