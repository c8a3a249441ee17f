//! The CDC (Connection Data Control) message: 44 bytes, type 0xFE, carrying a connection's
//! cursors and flags in an RC SEND (RFC 7609 §4.3, A.4; Linux `struct smc_cdc_msg`).
//!
//! This is the data path's control message, so [`CdcMessage`] is a view with direct field
//! accessors and setters (a few loads and stores, no intermediate struct). [`CdcRepr`] is the
//! owned form for code that prefers values.

use crate::common::{get_u16, get_u32, put_u16, put_u32};
use crate::error::{check_len, check_out, Error, Result};

/// Type byte of a CDC message.
pub const CDC_TYPE: u8 = 0xFE;
/// Length of a CDC message.
pub const CDC_LEN: usize = 44;

/// Byte offsets (RFC 7609 Fig 41).
pub mod field {
    /// Type (0xFE).
    pub const TYPE: usize = 0;
    /// Length (44).
    pub const LENGTH: usize = 1;
    /// Sequence number (u16).
    pub const SEQNO: usize = 2;
    /// Alert token (u32).
    pub const TOKEN: usize = 4;
    /// Producer cursor wrap sequence number (u16), after 2 reserved bytes.
    pub const PROD_WRAP: usize = 10;
    /// Producer cursor (u32).
    pub const PROD_COUNT: usize = 12;
    /// Consumer cursor wrap sequence number (u16), after 2 reserved bytes.
    pub const CONS_WRAP: usize = 18;
    /// Consumer cursor (u32).
    pub const CONS_COUNT: usize = 20;
    /// Producer flags.
    pub const PROD_FLAGS: usize = 24;
    /// Connection-state flags.
    pub const CONN_FLAGS: usize = 25;
}

bitflags::bitflags! {
    /// Producer flags (byte 24).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct ProducerFlags: u8 {
        /// B: the writer is blocked (no space in the peer's RMBE).
        const WRITE_BLOCKED = 0x80;
        /// P: urgent data pending.
        const URG_PENDING = 0x40;
        /// U: urgent data present (the producer cursor points 1 past the urgent byte).
        const URG_PRESENT = 0x20;
        /// R: consumer cursor update requested.
        const CONS_UPDATE_REQ = 0x10;
        /// F: failover validation (only type, length, token and seqno are significant).
        const FAILOVER_VALIDATION = 0x08;
    }
}

bitflags::bitflags! {
    /// Connection-state flags (byte 25).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct ConnStateFlags: u8 {
        /// D: the sender is done writing (shutdown SHUT_WR).
        const PEER_DONE_WRITING = 0x80;
        /// C: the sender closed the connection.
        const PEER_CONN_CLOSED = 0x40;
        /// A: abnormal close.
        const PEER_CONN_ABORT = 0x20;
    }
}

/// A cursor: wrap sequence number and byte offset into an RMBE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Cursor {
    /// Incremented each time the cursor wraps.
    pub wrap: u16,
    /// Offset into the RMBE.
    pub count: u32,
}

impl Cursor {
    /// A cursor with the given wrap counter and offset.
    pub const fn new(wrap: u16, count: u32) -> Self {
        Cursor { wrap, count }
    }
}

/// A typed view of a CDC message in a buffer.
#[derive(Debug, Clone, Copy)]
pub struct CdcMessage<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> CdcMessage<T> {
    /// Wraps a buffer without checks; accessors panic if it is shorter than 44 bytes.
    pub fn new_unchecked(buffer: T) -> CdcMessage<T> {
        CdcMessage { buffer }
    }
    /// Wraps a received buffer: at least 44 bytes, type 0xFE, length byte 44.
    pub fn new_checked(buffer: T) -> Result<CdcMessage<T>> {
        let b = buffer.as_ref();
        check_len("CDC message", b, CDC_LEN)?;
        if b[field::TYPE] != CDC_TYPE {
            return Err(Error::UnknownType {
                layer: "CDC",
                value: b[field::TYPE],
            });
        }
        if usize::from(b[field::LENGTH]) != CDC_LEN {
            return Err(Error::BadLength {
                msg: "CDC message",
                expected: CDC_LEN,
                got: b[field::LENGTH].into(),
            });
        }
        Ok(CdcMessage { buffer })
    }
    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    /// Sequence number.
    #[inline]
    pub fn seqno(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::SEQNO)
    }
    /// Alert token (assigned by the receiver in its Accept/Confirm).
    #[inline]
    pub fn token(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::TOKEN)
    }
    /// Producer cursor (into the receiver's RMBE).
    #[inline]
    pub fn prod(&self) -> Cursor {
        let b = self.buffer.as_ref();
        Cursor {
            wrap: get_u16(b, field::PROD_WRAP),
            count: get_u32(b, field::PROD_COUNT),
        }
    }
    /// Consumer cursor (into the sender's own RMBE).
    #[inline]
    pub fn cons(&self) -> Cursor {
        let b = self.buffer.as_ref();
        Cursor {
            wrap: get_u16(b, field::CONS_WRAP),
            count: get_u32(b, field::CONS_COUNT),
        }
    }
    /// Producer flags (reserved bits dropped).
    #[inline]
    pub fn prod_flags(&self) -> ProducerFlags {
        ProducerFlags::from_bits_truncate(self.buffer.as_ref()[field::PROD_FLAGS])
    }
    /// Connection-state flags (reserved bits dropped).
    #[inline]
    pub fn conn_flags(&self) -> ConnStateFlags {
        ConnStateFlags::from_bits_truncate(self.buffer.as_ref()[field::CONN_FLAGS])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CdcMessage<T> {
    /// Writes type, length and zeroes every reserved byte; fields are set separately.
    #[inline]
    pub fn init(&mut self) {
        let b = &mut self.buffer.as_mut()[..CDC_LEN];
        b.fill(0);
        b[field::TYPE] = CDC_TYPE;
        b[field::LENGTH] = CDC_LEN as u8;
    }
    /// Sets the sequence number.
    #[inline]
    pub fn set_seqno(&mut self, v: u16) {
        put_u16(self.buffer.as_mut(), field::SEQNO, v)
    }
    /// Sets the alert token.
    #[inline]
    pub fn set_token(&mut self, v: u32) {
        put_u32(self.buffer.as_mut(), field::TOKEN, v)
    }
    /// Sets the producer cursor.
    #[inline]
    pub fn set_prod(&mut self, c: Cursor) {
        let b = self.buffer.as_mut();
        put_u16(b, field::PROD_WRAP, c.wrap);
        put_u32(b, field::PROD_COUNT, c.count);
    }
    /// Sets the consumer cursor.
    #[inline]
    pub fn set_cons(&mut self, c: Cursor) {
        let b = self.buffer.as_mut();
        put_u16(b, field::CONS_WRAP, c.wrap);
        put_u32(b, field::CONS_COUNT, c.count);
    }
    /// Sets the producer flags.
    #[inline]
    pub fn set_prod_flags(&mut self, f: ProducerFlags) {
        self.buffer.as_mut()[field::PROD_FLAGS] = f.bits();
    }
    /// Sets the connection-state flags.
    #[inline]
    pub fn set_conn_flags(&mut self, f: ConnStateFlags) {
        self.buffer.as_mut()[field::CONN_FLAGS] = f.bits();
    }
}

/// An owned CDC message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CdcRepr {
    /// Sequence number.
    pub seqno: u16,
    /// Alert token.
    pub token: u32,
    /// Producer cursor.
    pub prod: Cursor,
    /// Consumer cursor.
    pub cons: Cursor,
    /// Producer flags.
    pub prod_flags: ProducerFlags,
    /// Connection-state flags.
    pub conn_flags: ConnStateFlags,
}

impl CdcRepr {
    /// The failover data-validation message (F = 1, RFC 7609 §4.6.1): only its type,
    /// length, token and sequence number count.
    pub fn is_failover_validation(&self) -> bool {
        self.prod_flags.contains(ProducerFlags::FAILOVER_VALIDATION)
    }

    /// Parses a checked view.
    pub fn parse<T: AsRef<[u8]>>(m: &CdcMessage<T>) -> CdcRepr {
        CdcRepr {
            seqno: m.seqno(),
            token: m.token(),
            prod: m.prod(),
            cons: m.cons(),
            prod_flags: m.prod_flags(),
            conn_flags: m.conn_flags(),
        }
    }
    /// Parses bytes (at least 44; a longer receive buffer is fine).
    pub fn parse_bytes(b: &[u8]) -> Result<CdcRepr> {
        Ok(CdcRepr::parse(&CdcMessage::new_checked(b)?))
    }
    /// Always 44.
    pub fn buffer_len(&self) -> usize {
        CDC_LEN
    }
    /// Writes the message; returns 44.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        check_out(buf, CDC_LEN)?;
        let mut m = CdcMessage::new_unchecked(&mut buf[..CDC_LEN]);
        m.init();
        m.set_seqno(self.seqno);
        m.set_token(self.token);
        m.set_prod(self.prod);
        m.set_cons(self.cons);
        m.set_prod_flags(self.prod_flags);
        m.set_conn_flags(self.conn_flags);
        Ok(CDC_LEN)
    }

    /// The 44 bytes of the message (what an RC SEND carries inline).
    pub fn to_bytes(&self) -> [u8; CDC_LEN] {
        let mut b = [0u8; CDC_LEN];
        let mut m = CdcMessage::new_unchecked(&mut b[..]);
        m.init();
        m.set_seqno(self.seqno);
        m.set_token(self.token);
        m.set_prod(self.prod);
        m.set_cons(self.cons);
        m.set_prod_flags(self.prod_flags);
        m.set_conn_flags(self.conn_flags);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checklist_vector() {
        // tests/fixtures/pcaps/test_vectors.txt "CDC message".
        let b: Vec<u8> = (0..88)
            .step_by(2)
            .map(|i| {
                u8::from_str_radix(
                    &"fe2c000100000101000000000000001000000000000000001000000000000000000000000000000000000000"[i..i + 2],
                    16,
                )
                .unwrap()
            })
            .collect();
        let r = CdcRepr::parse_bytes(&b).unwrap();
        assert_eq!(r.seqno, 1);
        assert_eq!(r.token, 0x101);
        assert_eq!(r.prod, Cursor { wrap: 0, count: 16 });
        assert_eq!(r.prod_flags, ProducerFlags::CONS_UPDATE_REQ);
        let mut out = [0xAAu8; 44];
        r.emit(&mut out).unwrap();
        assert_eq!(&out[..], &b[..]);
    }

    #[test]
    fn checks() {
        let mut b = [0u8; 44];
        b[0] = 0xFE;
        b[1] = 44;
        assert!(CdcMessage::new_checked(&b[..]).is_ok());
        assert!(CdcMessage::new_checked(&b[..43]).is_err());
        b[1] = 48;
        assert!(matches!(
            CdcMessage::new_checked(&b[..]),
            Err(Error::BadLength { got: 48, .. })
        ));
        b[1] = 44;
        b[0] = 0x01;
        assert!(matches!(
            CdcMessage::new_checked(&b[..]),
            Err(Error::UnknownType { .. })
        ));
    }
}
