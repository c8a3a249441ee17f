//! CLC (Connection Layer Control) messages, exchanged in-band on the TCP connection during the
//! SMC handshake (RFC 7609 §3.2, A.2; Linux `smc_clc.h`, linux-smc.md §1.2–§1.5).
//!
//! Both the RFC 7609 (version 1) layouts and the layouts Linux sends today (version-2 header
//! with `typev2`/`typev1` path bits, the 40-byte SMC-D/v2 area in the Proposal, the v2
//! extensions, v2 Accept/Confirm and the 44-byte v2 Decline) are supported. SMC-D
//! Accept/Confirm messages come out as [`ClcMessage::OtherPath`], never as SMC-R.
//!
//! Validation follows CHECKLIST §A.2: eye catchers at both ends, a known type, a length field
//! equal to both the layout's length and the bytes framed, version ≥ 1, counts within range,
//! offsets where the layout puts them. Reserved fields are not validated (CLC-G3) and are sent
//! as zero.

mod accept;
mod decline;
mod proposal;
pub mod samehost;

pub use accept::{AcceptConfirmRepr, AcceptV2, FirstContactExt, OtherPathRepr};
pub use decline::DeclineRepr;
pub use proposal::{
    IpArea, Ipv6Prefix, IsmGid, ProposalBody, ProposalRepr, ProposalV2Ext, SmcdArea, SmcdV2Ext,
    V1Area,
};
pub use samehost::{SameHostAcceptRepr, SameHostHello, SameHostOffer};

use crate::common::{get_u16, EYECATCHER_SMCD, EYECATCHER_SMCR};
use crate::error::{check_len, Error, Result};

/// Byte offsets of the common header (RFC 7609 A.2, Linux `struct smc_clc_msg_hdr`).
pub mod field {
    /// Eye catcher, 4 bytes.
    pub const EYECATCHER: core::ops::Range<usize> = 0..4;
    /// Message type.
    pub const TYPE: usize = 4;
    /// Total length, u16 BE.
    pub const LENGTH: usize = 5;
    /// Version (high nibble) and flag/path bits (low nibble).
    pub const VERSION: usize = 7;
    /// Header length.
    pub const HEADER_LEN: usize = 8;
    /// Trailer (eye catcher) length.
    pub const TRAILER_LEN: usize = 4;
}

/// The 0x08 bit of header byte 7: First Contact (Accept, Confirm) / out of sync (Decline).
pub const FLAG_0X08: u8 = 0x08;

/// CLC message types (RFC 7609 A.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ClcType {
    /// SMC Proposal, client → server.
    Proposal = 1,
    /// SMC Accept, server → client.
    Accept = 2,
    /// SMC Confirm, client → server.
    Confirm = 3,
    /// SMC Decline, either direction.
    Decline = 4,
    /// smc-rs private: the server took the client's same-host offer ([`samehost`]). Only
    /// ever sent to a client whose Proposal carried the offer.
    SameHostAccept = 0x81,
}

impl ClcType {
    /// Decodes the type byte.
    pub fn from_u8(v: u8) -> Result<ClcType> {
        Ok(match v {
            1 => ClcType::Proposal,
            2 => ClcType::Accept,
            3 => ClcType::Confirm,
            4 => ClcType::Decline,
            0x81 => ClcType::SameHostAccept,
            _ => {
                return Err(Error::UnknownType {
                    layer: "CLC",
                    value: v,
                })
            }
        })
    }
    /// Name as in the RFC.
    pub fn name(self) -> &'static str {
        match self {
            ClcType::Proposal => "Proposal",
            ClcType::Accept => "Accept",
            ClcType::Confirm => "Confirm",
            ClcType::Decline => "Decline",
            ClcType::SameHostAccept => "same-host Accept",
        }
    }
    /// Smallest and largest total length a message of this type can have.
    pub fn length_range(self) -> (usize, usize) {
        match self {
            // RFC v1 IPv4 (52) .. Linux v2 with every list full (80 + 144 + 296 + 128 + 4).
            ClcType::Proposal => (52, 652),
            // SMC-D v1 (48) .. SMC-R v2 first-contact Confirm with 8 GIDs.
            ClcType::Accept | ClcType::Confirm => (48, accept::MAX_LEN),
            ClcType::Decline => (28, 44),
            ClcType::SameHostAccept => (
                samehost::SAME_HOST_ACCEPT_LEN,
                samehost::SAME_HOST_ACCEPT_LEN,
            ),
        }
    }
}

/// The eye catcher of a CLC message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Eyecatcher {
    /// "SMCR" (RFC 7609).
    #[default]
    Smcr,
    /// "SMCD" (Linux SMC-D).
    Smcd,
}

impl Eyecatcher {
    /// Decodes 4 bytes.
    pub fn from_bytes(b: [u8; 4], which: &'static str) -> Result<Eyecatcher> {
        match b {
            EYECATCHER_SMCR => Ok(Eyecatcher::Smcr),
            EYECATCHER_SMCD => Ok(Eyecatcher::Smcd),
            _ => Err(Error::BadEyecatcher { which }),
        }
    }
    /// The 4 bytes.
    pub fn bytes(self) -> [u8; 4] {
        match self {
            Eyecatcher::Smcr => EYECATCHER_SMCR,
            Eyecatcher::Smcd => EYECATCHER_SMCD,
        }
    }
}

/// Path type in the low bits of header byte 7 (Linux `SMC_TYPE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum PathType {
    /// SMC-R.
    #[default]
    R = 0,
    /// SMC-D.
    D = 1,
    /// None offered.
    N = 2,
    /// Both SMC-R and SMC-D.
    B = 3,
}

impl PathType {
    /// Decodes 2 bits.
    pub fn from_bits(v: u8) -> PathType {
        match v & 3 {
            0 => PathType::R,
            1 => PathType::D,
            2 => PathType::N,
            _ => PathType::B,
        }
    }
    /// Whether SMC-R is included (R or B).
    pub fn has_r(self) -> bool {
        matches!(self, PathType::R | PathType::B)
    }
    /// Whether SMC-D is included (D or B).
    pub fn has_d(self) -> bool {
        matches!(self, PathType::D | PathType::B)
    }
    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            PathType::R => "R",
            PathType::D => "D",
            PathType::N => "none",
            PathType::B => "R+D",
        }
    }
}

/// A typed view of the 8-byte CLC header at the start of a buffer.
#[derive(Debug, Clone, Copy)]
pub struct Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Header<T> {
    /// Wraps a buffer without checks; accessors panic if it is shorter than 8 bytes.
    pub fn new_unchecked(buffer: T) -> Header<T> {
        Header { buffer }
    }
    /// Wraps a buffer of at least 8 bytes whose eye catcher, type and length are valid
    /// (length within the type's range; the buffer itself may hold only the header).
    pub fn new_checked(buffer: T) -> Result<Header<T>> {
        let h = Header { buffer };
        h.check()?;
        Ok(h)
    }
    fn check(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        check_len("CLC header", b, field::HEADER_LEN)?;
        self.eyecatcher()?;
        let ty = self.msg_type()?;
        let len = usize::from(self.length());
        let (min, max) = ty.length_range();
        if len < min || len > max {
            return Err(Error::CountOutOfRange {
                field: "CLC length",
                value: len,
                min,
                max,
            });
        }
        if self.version() == 0 {
            // CHECKLIST A.2.0 REC: version 0 is a reserved enumerated value → ENUM-DECL.
            return Err(Error::ReservedValue {
                field: "CLC version",
                value: 0,
            });
        }
        Ok(())
    }
    /// Eye catcher.
    pub fn eyecatcher(&self) -> Result<Eyecatcher> {
        let b = self.buffer.as_ref();
        Eyecatcher::from_bytes([b[0], b[1], b[2], b[3]], "header")
    }
    /// Message type.
    pub fn msg_type(&self) -> Result<ClcType> {
        ClcType::from_u8(self.buffer.as_ref()[field::TYPE])
    }
    /// Total message length including header and trailer.
    pub fn length(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::LENGTH)
    }
    /// Version (high nibble of byte 7).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION] >> 4
    }
    /// The 0x08 bit: First Contact (Accept/Confirm), out of sync (Decline).
    pub fn flag(&self) -> bool {
        self.buffer.as_ref()[field::VERSION] & FLAG_0X08 != 0
    }
    /// Linux `typev2` (bits 3..2 of byte 7).
    pub fn typev2(&self) -> PathType {
        PathType::from_bits(self.buffer.as_ref()[field::VERSION] >> 2)
    }
    /// Linux `typev1` (bits 1..0 of byte 7).
    pub fn typev1(&self) -> PathType {
        PathType::from_bits(self.buffer.as_ref()[field::VERSION])
    }
}

/// Given at least the first 8 bytes of a CLC message, the total number of bytes it has.
///
/// The core reads CLC by exact length (like Linux, which peeks the header and then reads
/// `length` bytes), so it never consumes application data that follows the message.
pub fn message_len(first: &[u8]) -> Result<usize> {
    Ok(usize::from(Header::new_checked(first)?.length()))
}

/// Checks everything common to all CLC messages: header fields, `length` equal to the bytes
/// given, and the trailing eye catcher. Returns the header view.
pub(crate) fn check_frame(b: &[u8]) -> Result<Header<&[u8]>> {
    let h = Header::new_checked(b)?;
    let len = usize::from(h.length());
    if b.len() < len {
        return Err(Error::Truncated {
            what: "CLC message",
            need: len,
            have: b.len(),
        });
    }
    if b.len() > len {
        return Err(Error::BadLength {
            msg: "CLC message",
            expected: len,
            got: b.len(),
        });
    }
    let t = Eyecatcher::from_bytes([b[len - 4], b[len - 3], b[len - 2], b[len - 1]], "trailer")?;
    if t != h.eyecatcher()? {
        return Err(Error::TrailerMismatch);
    }
    Ok(h)
}

/// Writes header and trailer for a message of `len` bytes into `b[..len]` (already zeroed).
pub(crate) fn write_frame(b: &mut [u8], ec: Eyecatcher, ty: ClcType, len: usize, byte7: u8) {
    b[0..4].copy_from_slice(&ec.bytes());
    b[field::TYPE] = ty as u8;
    b[field::LENGTH..field::LENGTH + 2].copy_from_slice(&(len as u16).to_be_bytes());
    b[field::VERSION] = byte7;
    b[len - 4..len].copy_from_slice(&ec.bytes());
}

pub(crate) fn check_version(version: u8) -> Result<()> {
    if version == 0 || version > 15 {
        return Err(Error::ReservedValue {
            field: "CLC version",
            value: version.into(),
        });
    }
    Ok(())
}

/// Any CLC message.
// Fixed-capacity lists keep parsing allocation-free (no Box); CLC is handled once per
// connection, so the enum's size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClcMessage {
    /// SMC Proposal.
    Proposal(ProposalRepr),
    /// SMC-R Accept.
    Accept(AcceptConfirmRepr),
    /// SMC-R Confirm.
    Confirm(AcceptConfirmRepr),
    /// SMC Decline.
    Decline(DeclineRepr),
    /// An Accept or Confirm for another path (SMC-D), kept as bytes; never SMC-R.
    OtherPath(OtherPathRepr),
    /// smc-rs's same-host Accept ([`samehost`]).
    SameHostAccept(SameHostAcceptRepr),
}

impl ClcMessage {
    /// Parses exactly one CLC message (`bytes.len()` must equal its length field).
    pub fn parse(bytes: &[u8]) -> Result<ClcMessage> {
        let h = check_frame(bytes)?;
        match h.msg_type()? {
            ClcType::Proposal => Ok(ClcMessage::Proposal(ProposalRepr::parse(bytes)?)),
            ClcType::Decline => Ok(ClcMessage::Decline(DeclineRepr::parse(bytes)?)),
            ClcType::SameHostAccept => Ok(ClcMessage::SameHostAccept(SameHostAcceptRepr::parse(
                bytes,
            )?)),
            ty @ (ClcType::Accept | ClcType::Confirm) => {
                if accept::is_other_path(&h)? {
                    return Ok(ClcMessage::OtherPath(OtherPathRepr::parse(bytes)?));
                }
                let r = AcceptConfirmRepr::parse(bytes, ty)?;
                Ok(if ty == ClcType::Accept {
                    ClcMessage::Accept(r)
                } else {
                    ClcMessage::Confirm(r)
                })
            }
        }
    }
    /// The message type.
    pub fn msg_type(&self) -> ClcType {
        match self {
            ClcMessage::Proposal(_) => ClcType::Proposal,
            ClcMessage::Accept(_) => ClcType::Accept,
            ClcMessage::Confirm(_) => ClcType::Confirm,
            ClcMessage::Decline(_) => ClcType::Decline,
            ClcMessage::OtherPath(o) => o.msg_type(),
            ClcMessage::SameHostAccept(_) => ClcType::SameHostAccept,
        }
    }
    /// Bytes [`Self::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        match self {
            ClcMessage::Proposal(p) => p.buffer_len(),
            ClcMessage::Accept(a) | ClcMessage::Confirm(a) => a.buffer_len(),
            ClcMessage::Decline(d) => d.buffer_len(),
            ClcMessage::OtherPath(o) => o.buffer_len(),
            ClcMessage::SameHostAccept(a) => a.buffer_len(),
        }
    }
    /// Writes the message into `buf`; returns the number of bytes written.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        match self {
            ClcMessage::Proposal(p) => p.emit(buf),
            ClcMessage::Accept(a) => a.emit(buf, ClcType::Accept),
            ClcMessage::Confirm(a) => a.emit(buf, ClcType::Confirm),
            ClcMessage::Decline(d) => d.emit(buf),
            ClcMessage::OtherPath(o) => o.emit(buf),
            ClcMessage::SameHostAccept(a) => a.emit(buf),
        }
    }
    /// Emits into a new vector.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.buffer_len()];
        self.emit(&mut v)?;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_view_and_message_len() {
        let b = [0xE2, 0xD4, 0xC3, 0xD9, 2, 0, 160, 0x28];
        let h = Header::new_checked(&b[..]).unwrap();
        assert_eq!(h.msg_type().unwrap(), ClcType::Accept);
        assert_eq!(h.version(), 2);
        assert!(h.flag());
        assert_eq!(h.typev1(), PathType::R);
        assert_eq!(message_len(&b).unwrap(), 160);
        let mut bad = b;
        bad[3] = 0;
        assert_eq!(
            message_len(&bad),
            Err(Error::BadEyecatcher { which: "header" })
        );
        let mut bad = b;
        bad[4] = 9;
        assert!(matches!(
            message_len(&bad),
            Err(Error::UnknownType { value: 9, .. })
        ));
        let mut bad = b;
        bad[7] = 0x08;
        assert!(matches!(
            message_len(&bad),
            Err(Error::ReservedValue { .. })
        ));
        let mut bad = b;
        bad[5] = 0xff;
        assert!(matches!(
            message_len(&bad),
            Err(Error::CountOutOfRange { .. })
        ));
        assert!(message_len(&b[..7]).is_err());
    }
}
