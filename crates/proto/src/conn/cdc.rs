//! The semantic content of a CDC message (RFC 7609 §3.4, §4.3, Appendix A.4; CHECKLIST A.4).
//!
//! This is the core's own type: the `smc-wire` crate encodes and decodes the 44-byte
//! layout, the runtime converts between the two. Flag values are the wire masks of the
//! byte they live in, so the conversion is a plain copy of the byte.

use super::cursor::Cursor;
use bitflags::bitflags;
use smc_wire::cdc as wcdc;

bitflags! {
    /// Producer flags (CDC byte 24, RFC 7609 Appendix A.4).
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
    pub struct ProducerFlags: u8 {
        /// B: the writer has filled the window and has more data; the receiver must send
        /// a consumer update on every consumption until a CDC with B = 0 (§4.5.1).
        const WRITE_BLOCKED = 0x80;
        /// P: urgent data is pending in the stream (possibly not written yet, §4.7.6).
        const URGENT_PENDING = 0x40;
        /// U: urgent data is in the RMBE; its last byte is at producer cursor − 1 (§4.7.5).
        const URGENT_PRESENT = 0x20;
        /// R: the writer requests a consumer-cursor update (§4.5.1, diagnostics).
        const CONS_UPDATE_REQ = 0x10;
        /// F: failover validation message; only type, length, token and seqno count (§4.6.1).
        const FAILOVER = 0x08;
    }
}

bitflags! {
    /// Connection-state flags (CDC byte 25, RFC 7609 Appendix A.4).
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
    pub struct ConnStateFlags: u8 {
        /// D, PeerDoneWriting: the sender did shutdown(SHUT_WR) (§4.8.1).
        const DONE_WRITING = 0x80;
        /// C, PeerConnectionClosed: the sender will not touch our RMBE again (§4.8.1).
        const CLOSED = 0x40;
        /// A, PeerConnAbort: abnormal close (§4.8.2).
        const ABORT = 0x20;
    }
}

/// One CDC message, as sent or received.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct CdcMsg {
    /// Sequence number: per connection, 1 for the first CDC, +1 per CDC, wraps to 0;
    /// the failover-validation message reuses SS (RFC 7609 §4.3, §4.6.1).
    pub seq: u16,
    /// The alert token the *receiver* of this message assigned (its Accept/Confirm).
    pub token: u32,
    /// Producer cursor: where the sender writes next in the receiver's RMBE.
    pub prod: Cursor,
    /// Consumer cursor: how far the sender has consumed its own RMBE.
    pub cons: Cursor,
    /// B/P/U/R/F.
    pub prod_flags: ProducerFlags,
    /// D/C/A.
    pub conn_flags: ConnStateFlags,
}

impl CdcMsg {
    /// The 44 bytes on the wire (RFC 7609 A.4; `smc-wire` does the layout).
    pub fn to_bytes(&self) -> [u8; 44] {
        let r = wcdc::CdcRepr {
            seqno: self.seq,
            token: self.token,
            prod: wcdc::Cursor {
                wrap: self.prod.wrap,
                count: self.prod.count,
            },
            cons: wcdc::Cursor {
                wrap: self.cons.wrap,
                count: self.cons.count,
            },
            prod_flags: wcdc::ProducerFlags::from_bits_truncate(self.prod_flags.bits()),
            conn_flags: wcdc::ConnStateFlags::from_bits_truncate(self.conn_flags.bits()),
        };
        let mut b = [0u8; 44];
        // Never fails: the buffer is exactly 44 bytes.
        let _ = r.emit(&mut b);
        b
    }

    /// Parses a received CDC; `None` when the bytes are not one (a peer error: dropped).
    pub fn from_bytes(b: &[u8]) -> Option<CdcMsg> {
        let r = wcdc::CdcRepr::parse_bytes(b).ok()?;
        Some(CdcMsg {
            seq: r.seqno,
            token: r.token,
            prod: Cursor {
                wrap: r.prod.wrap,
                count: r.prod.count,
            },
            cons: Cursor {
                wrap: r.cons.wrap,
                count: r.cons.count,
            },
            prod_flags: ProducerFlags::from_bits_truncate(r.prod_flags.bits()),
            conn_flags: ConnStateFlags::from_bits_truncate(r.conn_flags.bits()),
        })
    }

    /// Whether this is the failover data-validation message (F = 1, RFC 7609 §4.6.1).
    pub fn is_failover_validation(&self) -> bool {
        self.prod_flags.contains(ProducerFlags::FAILOVER)
    }
}

/// `a` is older than `b` in 16-bit serial arithmetic (RFC 1982 style; CHECKLIST WIN-11,
/// AMB-38): `(a − b) mod 2^16` read as a signed number is negative. Equal is not older.
pub const fn seq_before(a: u16, b: u16) -> bool {
    (a.wrapping_sub(b) as i16) < 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TC-CDC-01 (the part owned here): flag masks as in CHECKLIST A.4.
    #[test]
    fn tc_cdc_01_flag_masks() {
        assert_eq!(ProducerFlags::WRITE_BLOCKED.bits(), 0x80);
        assert_eq!(ProducerFlags::URGENT_PENDING.bits(), 0x40);
        assert_eq!(ProducerFlags::URGENT_PRESENT.bits(), 0x20);
        assert_eq!(ProducerFlags::CONS_UPDATE_REQ.bits(), 0x10);
        assert_eq!(ProducerFlags::FAILOVER.bits(), 0x08);
        assert_eq!(ConnStateFlags::DONE_WRITING.bits(), 0x80);
        assert_eq!(ConnStateFlags::CLOSED.bits(), 0x40);
        assert_eq!(ConnStateFlags::ABORT.bits(), 0x20);
        // Reserved bits from a peer are dropped, never an error (AMB-37).
        assert_eq!(ProducerFlags::from_bits_truncate(0xFF).bits(), 0xF8);
        assert_eq!(ConnStateFlags::from_bits_truncate(0xFF).bits(), 0xE0);
    }

    /// TC-CDC-04 seq_compare_across_wrap.
    #[test]
    fn tc_cdc_04_seq_compare_across_wrap() {
        assert!(seq_before(65535, 0), "0 after 65535 is newer");
        assert!(!seq_before(0, 65535));
        assert!(seq_before(1, 2));
        assert!(!seq_before(7, 7), "equal is not older");
        assert!(seq_before(40000, 10));
        assert!(!seq_before(10, 40000));
    }
}
