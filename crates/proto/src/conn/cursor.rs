//! RMBE geometry and cursor arithmetic (RFC 7609 §2.1, §4.2, §4.3, Appendix A.4;
//! CHECKLIST B.18).
//!
//! An RMB element (RMBE) is `len` bytes. The RFC puts a 4-byte eye catcher at offset 0
//! and the wrapping receive buffer after it (RFC 7609 §4.2); Linux has no eye catcher
//! and uses the whole element (CHECKLIST I-01, CONFIRM LINK flag 0x03). So data lives in
//! `[data_off, len)` and the ring capacity is `cap = len − data_off`.
//!
//! A cursor is `(wrap, count)`: `count` is the byte offset inside the element, always in
//! `[data_off, len)`, so that "cursors start and wrap at 4, not 0" (RFC 7609 §4.7) in RFC
//! mode and at 0 in Linux mode; `wrap` is a 16-bit counter incremented each time the
//! cursor wraps (RFC 7609 Appendix A.4). The wrap counter exists so that equal offsets can
//! be told apart: equal counts with equal wraps is an empty ring, equal counts with wraps
//! one apart is a full ring (RFC 7609 §4.7.4 step 4; CHECKLIST WIN-5/WIN-6).
//!
//! Inside the connection machine positions are plain `u64` byte counts
//! ("absolute positions"): position `p` maps to the cursor
//! `(wrap = ⌊p / cap⌋ mod 2^16, count = data_off + p mod cap)`. A cursor received from
//! the peer is turned back into a position relative to a known one with [`RmbeGeometry::dist`]
//! — valid only when the distance is at most `cap` (CHECKLIST B.18, WIN-12).

/// A producer or consumer cursor as carried in a CDC message (RFC 7609 Appendix A.4):
/// `smc-wire`'s, used as is.
pub use smc_wire::cdc::Cursor;

/// Why an [`RmbeGeometry`] was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GeometryError {
    /// The data offset leaves no room for data (`data_off >= len`).
    #[error("RMBE data offset {data_off} leaves no data area in a {len}-byte element")]
    NoDataArea {
        /// Element length.
        len: u32,
        /// Data offset.
        data_off: u32,
    },
    /// The element is larger than [`RmbeGeometry::MAX_LEN`].
    #[error("RMBE length {0} exceeds the maximum {max}", max = RmbeGeometry::MAX_LEN)]
    TooLarge(u32),
}

/// Layout of one RMB element: total length and where the data ring starts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RmbeGeometry {
    len: u32,
    data_off: u32,
}

impl RmbeGeometry {
    /// Length of the RFC eye catcher at the start of every RMBE (RFC 7609 §4.2).
    pub const EYE_CATCHER_LEN: u32 = 4;
    /// Largest element accepted: 2^31 bytes (Linux's largest RMB is 512 MiB; the CLC
    /// Bsize encoding cannot express more than 2^19 KiB). Keeps every offset in `i32`.
    pub const MAX_LEN: u32 = 1 << 31;

    /// An element of `len` bytes whose data starts at `data_off`.
    pub fn new(len: u32, data_off: u32) -> Result<Self, GeometryError> {
        if len > Self::MAX_LEN {
            return Err(GeometryError::TooLarge(len));
        }
        if data_off >= len {
            return Err(GeometryError::NoDataArea { len, data_off });
        }
        Ok(RmbeGeometry { len, data_off })
    }

    /// RFC 7609 layout: 4-byte eye catcher, data from offset 4.
    pub fn rfc(len: u32) -> Result<Self, GeometryError> {
        Self::new(len, Self::EYE_CATCHER_LEN)
    }

    /// Linux layout (no eye catcher, CONFIRM LINK flag 0x03): data from offset 0.
    pub fn linux(len: u32) -> Result<Self, GeometryError> {
        Self::new(len, 0)
    }

    /// Element length in bytes (the decoded Bsize).
    pub const fn elem_len(&self) -> u32 {
        self.len
    }

    /// Where data starts: 4 with the RFC eye catcher, 0 without.
    pub const fn data_off(&self) -> u32 {
        self.data_off
    }

    /// Capacity of the data ring: `len − data_off`.
    pub const fn cap(&self) -> u32 {
        self.len - self.data_off
    }

    /// The cursor of a fresh connection: wrap 0 at the first data byte (RFC 7609 §4.7 figures).
    pub const fn initial(&self) -> Cursor {
        Cursor {
            wrap: 0,
            count: self.data_off,
        }
    }

    /// Whether a cursor's offset lies in the data area `[data_off, len)` (CHECKLIST A.4,
    /// WIN-12). Anything else from a peer is a protocol violation.
    pub const fn is_valid(&self, c: Cursor) -> bool {
        c.count >= self.data_off && c.count < self.len
    }

    /// `c` advanced by `n` bytes, wrapping at `len` back to `data_off` and incrementing
    /// the wrap counter once per wrap (CHECKLIST B.18 `advance`). `c` must be valid.
    pub fn advance(&self, c: Cursor, n: u64) -> Cursor {
        debug_assert!(self.is_valid(c));
        let cap = u64::from(self.cap());
        let rel = u64::from(c.count - self.data_off) + n;
        Cursor {
            // Truncation is the mod-2^16 wrap of the counter.
            wrap: c.wrap.wrapping_add((rel / cap) as u16),
            count: self.data_off + (rel % cap) as u32,
        }
    }

    /// Bytes from `a` forward to `b`, modulo the cursor space `2^16 · cap`
    /// (CHECKLIST B.18 `dist`). Meaningful only when the result is at most `cap`:
    /// 0 is an empty ring, `cap` a full one. Both cursors must be valid.
    pub fn dist(&self, a: Cursor, b: Cursor) -> u64 {
        debug_assert!(self.is_valid(a) && self.is_valid(b));
        let cap = u64::from(self.cap());
        let space = cap << 16;
        let wraps = u64::from(b.wrap.wrapping_sub(a.wrap));
        // wraps·cap + b.count − a.count, kept non-negative by adding `space` first.
        (space + wraps * cap + u64::from(b.count) - u64::from(a.count)) % space
    }

    /// [`dist`](Self::dist) if it is a legal window (`≤ cap`), else `None`.
    pub fn dist_within_cap(&self, a: Cursor, b: Cursor) -> Option<u64> {
        let d = self.dist(a, b);
        (d <= u64::from(self.cap())).then_some(d)
    }

    /// The cursor of absolute position `pos` (position 0 is `(0, data_off)`).
    pub fn cursor_at(&self, pos: u64) -> Cursor {
        let cap = u64::from(self.cap());
        Cursor {
            wrap: (pos / cap) as u16,
            count: self.data_off + (pos % cap) as u32,
        }
    }

    /// The absolute position of a cursor taken as being in the first 2^16 wraps. Used to
    /// turn the configured initial cursors into positions.
    pub fn position_of(&self, c: Cursor) -> u64 {
        debug_assert!(self.is_valid(c));
        u64::from(c.wrap) * u64::from(self.cap()) + u64::from(c.count - self.data_off)
    }

    /// Element offset (`count`) of absolute position `pos`: where the byte lives.
    pub fn offset_of(&self, pos: u64) -> u32 {
        self.data_off + (pos % u64::from(self.cap())) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rfc10k() -> RmbeGeometry {
        RmbeGeometry::rfc(10_000).unwrap()
    }

    #[test]
    fn geometry_validation() {
        assert!(RmbeGeometry::new(4, 4).is_err());
        assert!(RmbeGeometry::new(0, 0).is_err());
        assert!(RmbeGeometry::new(RmbeGeometry::MAX_LEN + 1, 0).is_err());
        let g = RmbeGeometry::rfc(16).unwrap();
        assert_eq!(g.cap(), 12);
        assert_eq!(g.initial(), Cursor::new(0, 4));
        assert!(!g.is_valid(Cursor::new(0, 3)));
        assert!(!g.is_valid(Cursor::new(0, 16)));
        assert!(g.is_valid(Cursor::new(7, 15)));
    }

    /// RFC 7609 §4.7.4: 8,996 + 1,000 bytes from (1, 1004) land on (2, 1004), a full window.
    #[test]
    fn scenario4_wrap() {
        let g = rfc10k();
        let c = g.advance(Cursor::new(1, 1004), 8996);
        assert_eq!(c, Cursor::new(2, 4));
        let c = g.advance(c, 1000);
        assert_eq!(c, Cursor::new(2, 1004));
        assert_eq!(g.dist(Cursor::new(1, 1004), c), 9996);
    }

    /// TC-FLOW-06 full_vs_empty_equal_cursors.
    #[test]
    fn tc_flow_06_full_vs_empty_equal_cursors() {
        let g = rfc10k();
        let a = Cursor::new(5, 1234);
        assert_eq!(g.dist(a, a), 0, "equal wraps: empty");
        assert_eq!(
            g.dist(a, Cursor::new(6, 1234)),
            u64::from(g.cap()),
            "wrap+1: full"
        );
        assert_eq!(
            g.dist_within_cap(a, Cursor::new(7, 1234)),
            None,
            "two wraps: invalid"
        );
        // Linux geometry behaves the same way with data at offset 0.
        let l = RmbeGeometry::linux(9996).unwrap();
        let z = Cursor::new(0, 0);
        assert_eq!(l.dist(z, Cursor::new(1, 0)), 9996);
    }

    /// TC-FLOW-14 wrap_counter_u16_overflow: comparisons stay correct across 65535 → 0.
    #[test]
    fn tc_flow_14_wrap_counter_u16_overflow() {
        let g = RmbeGeometry::rfc(16).unwrap();
        let a = Cursor::new(u16::MAX, 10);
        let b = g.advance(a, 8);
        assert_eq!(b, Cursor::new(0, 6));
        assert_eq!(g.dist(a, b), 8);
        assert_eq!(g.dist_within_cap(b, a), None, "backwards is not a window");
        // Positions past 2^16 wraps map onto the same cursors.
        let p = u64::from(g.cap()) * 65_536 * 3 + 5;
        assert_eq!(g.cursor_at(p), Cursor::new(0, 9));
    }

    fn geometry() -> impl Strategy<Value = RmbeGeometry> {
        (1u32..5000, prop_oneof![Just(0u32), Just(4u32)])
            .prop_map(|(cap, off)| RmbeGeometry::new(cap + off, off).unwrap())
    }

    proptest! {
        /// advance/dist agree with plain integer arithmetic on absolute positions,
        /// including wrap of the 16-bit counter.
        #[test]
        fn prop_advance_matches_positions(g in geometry(), start in any::<u64>(), n in 0u64..20_000) {
            let cap = u64::from(g.cap());
            let start = start % (cap << 20);
            let a = g.cursor_at(start);
            prop_assert!(g.is_valid(a));
            let b = g.advance(a, n);
            prop_assert_eq!(b, g.cursor_at(start + n));
            prop_assert_eq!(g.dist(a, b), n % (cap << 16));
            prop_assert_eq!(g.offset_of(start + n), b.count);
        }

        /// Within one capacity, dist is exact and the reverse direction is never a
        /// legal window unless it is zero (full vs empty disambiguation).
        #[test]
        fn prop_dist_within_cap(g in geometry(), start in any::<u64>(), n in 0u64..5000) {
            let cap = u64::from(g.cap());
            let n = n % (cap + 1);
            let a = g.cursor_at(start % (cap << 18));
            let b = g.advance(a, n);
            prop_assert_eq!(g.dist_within_cap(a, b), Some(n));
            if n > 0 && cap > 1 && n < cap {
                prop_assert_eq!(g.dist_within_cap(b, a), None);
            }
        }

        /// position_of inverts cursor_at for the first 2^16 wraps.
        #[test]
        fn prop_position_roundtrip(g in geometry(), pos in any::<u64>()) {
            let cap = u64::from(g.cap());
            let pos = pos % (cap << 16);
            prop_assert_eq!(g.position_of(g.cursor_at(pos)), pos);
        }
    }
}
