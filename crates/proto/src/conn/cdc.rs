//! The CDC message (RFC 7609 §3.4, §4.3, Appendix A.4; CHECKLIST A.4): the connection
//! machine works on `smc-wire`'s [`CdcRepr`] directly, as smoltcp's sockets work on
//! `TcpRepr` — one vocabulary from the wire to the machine. What is added here is the
//! sequence-number order.

pub use smc_wire::cdc::{CdcRepr, ConnStateFlags, Cursor, ProducerFlags};

/// `a` is older than `b` in 16-bit serial arithmetic (RFC 1982 style; CHECKLIST WIN-11,
/// AMB-38): `(a − b) mod 2^16` read as a signed number is negative. Equal is not older.
pub const fn seq_before(a: u16, b: u16) -> bool {
    (a.wrapping_sub(b) as i16) < 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TC-CDC-01 (the part the machine relies on): flag masks as in CHECKLIST A.4.
    #[test]
    fn tc_cdc_01_flag_masks() {
        assert_eq!(ProducerFlags::WRITE_BLOCKED.bits(), 0x80);
        assert_eq!(ProducerFlags::URG_PENDING.bits(), 0x40);
        assert_eq!(ProducerFlags::URG_PRESENT.bits(), 0x20);
        assert_eq!(ProducerFlags::CONS_UPDATE_REQ.bits(), 0x10);
        assert_eq!(ProducerFlags::FAILOVER_VALIDATION.bits(), 0x08);
        assert_eq!(ConnStateFlags::PEER_DONE_WRITING.bits(), 0x80);
        assert_eq!(ConnStateFlags::PEER_CONN_CLOSED.bits(), 0x40);
        assert_eq!(ConnStateFlags::PEER_CONN_ABORT.bits(), 0x20);
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
