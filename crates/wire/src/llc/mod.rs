//! LLC (Link Layer Control) messages, sent as RC SENDs on an SMC-R link (RFC 7609 §3.3, A.3;
//! Linux `smc_llc.c`, linux-smc.md §1.9).
//!
//! - The eight RFC 7609 messages (type 0x01..0x09 except 0x05), 44 bytes each.
//! - The Linux SMC-Rv2 messages (type `0x20 | t`: 0x21, 0x22, 0x24, 0x25, 0x26, 0x27, 0x29),
//!   whose 16-bit `length_v2` (44..=8192) overlaps bytes 1..2 and, like the ADD LINK v2
//!   `num_rkeys`, is written in the sender's host byte order (x86: little-endian). The byte
//!   order is an explicit [`LlcFormat`] choice.
//! - Where Linux's v1 layout differs from the RFC figure (ADD LINK GID offset, CHECKLIST
//!   A.3.2 / AMB-21; the CONFIRM LINK "no RMBE eye catcher" flag 0x03 and `max_conns`), the
//!   [`Dialect`] chooses. SMC-Rv2 messages always use the Linux layout.
//!
//! Opcode classes (RFC 7609 A.3, C.7.1): 0x00..0x3F mandatory (unknown → [`Error::UnknownType`],
//! link down), 0x40..0x7F undefined (treated like mandatory, AMB-35), 0x80..0xBF optional
//! (unknown → [`Error::OptionalLlc`], discard), 0xC0..0xFF CDC.
//!
//! Parsing a 44-byte message does not allocate: message structs are `Copy`, and the variable
//! lists of v2 messages are borrowed views of the input ([`RtokenList`], [`RkeyList`]).

mod link;
mod rkey;

pub use link::*;
pub use rkey::*;

use crate::common::{get_u32, get_u64, put_u32, put_u64, ByteOrder};
use crate::error::{check_len, check_out, Error, Result};
use core::fmt;

/// Length of every v1 LLC message (and the minimum of v2 messages).
pub const LLC_LEN: usize = 44;
/// Largest SMC-Rv2 LLC message (Linux `SMC_WR_BUF_V2_SIZE`).
pub const MAX_V2_LEN: usize = 8192;

/// Common header offsets.
pub mod field {
    /// Type byte.
    pub const TYPE: usize = 0;
    /// v1: length byte (44). v2: `length_v2` u16 in bytes 1..2.
    pub const LENGTH: usize = 1;
    /// v1: reserved; ADD LINK: reject reason in the low nibble.
    pub const BYTE2: usize = 2;
    /// Flags.
    pub const FLAGS: usize = 3;
}

/// Flag common to all LLC messages: this is a response (RFC 7609 A.3).
pub const FLAG_RESP: u8 = 0x80;

/// Which layout to use where the RFC 7609 figures and Linux differ (v1 messages only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// The RFC 7609 figures: ADD LINK GID at offset 10; CONFIRM LINK flag bits 0x7F and byte
    /// 35 reserved.
    Rfc7609,
    /// Linux/z/OS as deployed: ADD LINK GID at offset 12 (2 reserved bytes after the MAC);
    /// CONFIRM LINK flags 0x03 = no RMBE eye catcher, byte 35 = `max_conns`.
    Linux,
}

/// How to encode and decode LLC messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LlcFormat {
    /// Layout for v1 messages.
    pub dialect: Dialect,
    /// Byte order of the v2 `length_v2` and ADD LINK v2 `num_rkeys` fields.
    pub v2_byte_order: ByteOrder,
}

impl LlcFormat {
    /// What x86 Linux sends and expects.
    pub const LINUX_X86: LlcFormat = LlcFormat {
        dialect: Dialect::Linux,
        v2_byte_order: ByteOrder::Little,
    };
    /// Big-endian Linux (s390), and z/OS.
    pub const LINUX_BE: LlcFormat = LlcFormat {
        dialect: Dialect::Linux,
        v2_byte_order: ByteOrder::Big,
    };
    /// The RFC 7609 figures (v2 messages, if any, big-endian).
    pub const RFC7609: LlcFormat = LlcFormat {
        dialect: Dialect::Rfc7609,
        v2_byte_order: ByteOrder::Big,
    };
}

impl Default for LlcFormat {
    fn default() -> Self {
        LlcFormat::LINUX_X86
    }
}

/// LLC message types (low nibble of the type byte; RFC 7609 A.6c plus Linux 0x05).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LlcType {
    /// CONFIRM LINK.
    ConfirmLink = 1,
    /// ADD LINK.
    AddLink = 2,
    /// ADD LINK CONTINUATION (v1 only).
    AddLinkCont = 3,
    /// DELETE LINK.
    DeleteLink = 4,
    /// REQUEST ADD LINK (Linux SMC-Rv2 only, 0x25).
    ReqAddLink = 5,
    /// CONFIRM RKEY.
    ConfirmRkey = 6,
    /// TEST LINK.
    TestLink = 7,
    /// CONFIRM RKEY CONTINUATION (v1 only).
    ConfirmRkeyCont = 8,
    /// DELETE RKEY.
    DeleteRkey = 9,
}

impl LlcType {
    /// Name as in the RFC.
    pub fn name(self) -> &'static str {
        match self {
            LlcType::ConfirmLink => "CONFIRM LINK",
            LlcType::AddLink => "ADD LINK",
            LlcType::AddLinkCont => "ADD LINK CONT",
            LlcType::DeleteLink => "DELETE LINK",
            LlcType::ReqAddLink => "REQ ADD LINK",
            LlcType::ConfirmRkey => "CONFIRM RKEY",
            LlcType::TestLink => "TEST LINK",
            LlcType::ConfirmRkeyCont => "CONFIRM RKEY CONT",
            LlcType::DeleteRkey => "DELETE RKEY",
        }
    }
}

/// Opcode class by the two high bits of the type byte (RFC 7609 A.3, C.7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpcodeClass {
    /// 0x00..0x3F: must be supported; unknown is a protocol error.
    Mandatory,
    /// 0x40..0x7F: not described by the RFC; treated as an error (AMB-35).
    Undefined,
    /// 0x80..0xBF: optional; unknown ones are silently discarded.
    Optional,
    /// 0xC0..0xFF: CDC (only 0xFE is defined).
    Cdc,
}

/// The opcode class of a type byte.
pub fn opcode_class(t: u8) -> OpcodeClass {
    match t >> 6 {
        0 => OpcodeClass::Mandatory,
        1 => OpcodeClass::Undefined,
        2 => OpcodeClass::Optional,
        _ => OpcodeClass::Cdc,
    }
}

/// Decodes a type byte into (type, is_v2), classifying unknown ones.
pub fn classify(t: u8) -> Result<(LlcType, bool)> {
    let ty = match t & 0x0F {
        1 => Some(LlcType::ConfirmLink),
        2 => Some(LlcType::AddLink),
        3 => Some(LlcType::AddLinkCont),
        4 => Some(LlcType::DeleteLink),
        5 => Some(LlcType::ReqAddLink),
        6 => Some(LlcType::ConfirmRkey),
        7 => Some(LlcType::TestLink),
        8 => Some(LlcType::ConfirmRkeyCont),
        9 => Some(LlcType::DeleteRkey),
        _ => None,
    };
    let unknown = || match opcode_class(t) {
        OpcodeClass::Optional => Error::OptionalLlc(t),
        _ => Error::UnknownType {
            layer: "LLC",
            value: t,
        },
    };
    let ty = ty.ok_or_else(unknown)?;
    match (t & 0xF0, ty) {
        // v1: every RFC type; 0x05 is not an RFC 7609 opcode.
        (0x00, LlcType::ReqAddLink) => Err(unknown()),
        (0x00, ty) => Ok((ty, false)),
        // v2: there is no v2 ADD LINK CONT or CONFIRM RKEY CONT (linux-smc.md §1.9).
        (0x20, LlcType::AddLinkCont | LlcType::ConfirmRkeyCont) => Err(unknown()),
        (0x20, ty) => Ok((ty, true)),
        _ => Err(unknown()),
    }
}

/// A typed view of the 4-byte LLC header.
#[derive(Debug, Clone, Copy)]
pub struct Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Header<T> {
    /// Wraps a buffer of at least 4 bytes.
    pub fn new_checked(buffer: T) -> Result<Header<T>> {
        check_len("LLC header", buffer.as_ref(), 4)?;
        Ok(Header { buffer })
    }
    /// The type byte.
    pub fn type_byte(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }
    /// Whether the type byte says SMC-Rv2 (`0x2X`).
    pub fn is_v2(&self) -> bool {
        self.type_byte() & 0xF0 == 0x20
    }
    /// Message length: the length byte (v1) or `length_v2` in `order` (v2).
    pub fn length(&self, order: ByteOrder) -> usize {
        let b = self.buffer.as_ref();
        if self.is_v2() {
            order.get_u16(b, field::LENGTH).into()
        } else {
            b[field::LENGTH].into()
        }
    }
    /// Flags byte.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }
    /// Whether the response flag is set.
    pub fn is_response(&self) -> bool {
        self.flags() & FLAG_RESP != 0
    }
}

/// Validates the header and returns (type, is_v2, message bytes).
fn frame(b: &[u8], fmt: LlcFormat) -> Result<(LlcType, bool, &[u8])> {
    check_len("LLC message", b, 1)?;
    let (ty, v2) = classify(b[0])?;
    check_len("LLC message", b, LLC_LEN)?;
    let h = Header { buffer: b };
    let len = h.length(fmt.v2_byte_order);
    if !v2 {
        if len != LLC_LEN {
            return Err(Error::BadLength {
                msg: ty.name(),
                expected: LLC_LEN,
                got: len,
            });
        }
    } else {
        if !(LLC_LEN..=MAX_V2_LEN).contains(&len) {
            return Err(Error::CountOutOfRange {
                field: "length_v2",
                value: len,
                min: LLC_LEN,
                max: MAX_V2_LEN,
            });
        }
        check_len(ty.name(), b, len)?;
    }
    Ok((ty, v2, &b[..len]))
}

/// Writes the common header into a zeroed `b` (`b.len()` = message length).
fn write_header(b: &mut [u8], ty: LlcType, v2: bool, flags: u8, fmt: LlcFormat) {
    if v2 {
        b[field::TYPE] = 0x20 | ty as u8;
        fmt.v2_byte_order.put_u16(b, field::LENGTH, b.len() as u16);
    } else {
        b[field::TYPE] = ty as u8;
        b[field::LENGTH] = LLC_LEN as u8;
    }
    b[field::FLAGS] = flags;
}

/// One RToken pair of ADD LINK CONTINUATION and of the ADD LINK v2 extension (16 bytes):
/// the RMB's RKey on the link the message is sent over, and its RKey and VA on the new link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AddLinkRtoken {
    /// RKey as known on the link carrying the message (reference RKey).
    pub rmb_key: u32,
    /// RKey of the same RMB on the new link.
    pub rmb_key_new: u32,
    /// Virtual address of the same RMB on the new link.
    pub rmb_vaddr_new: u64,
}

impl AddLinkRtoken {
    /// Wire length.
    pub const LEN: usize = 16;
    pub(crate) fn read(b: &[u8], off: usize) -> AddLinkRtoken {
        AddLinkRtoken {
            rmb_key: get_u32(b, off),
            rmb_key_new: get_u32(b, off + 4),
            rmb_vaddr_new: get_u64(b, off + 8),
        }
    }
    pub(crate) fn write(&self, b: &mut [u8], off: usize) {
        put_u32(b, off, self.rmb_key);
        put_u32(b, off + 4, self.rmb_key_new);
        put_u64(b, off + 8, self.rmb_vaddr_new);
    }
}

/// A list of [`AddLinkRtoken`]s: a borrowed view of received bytes, or a slice to send.
#[derive(Clone, Copy)]
pub enum RtokenList<'a> {
    /// `n × 16` bytes as received.
    Wire(&'a [u8]),
    /// Values to emit.
    Slice(&'a [AddLinkRtoken]),
}

impl<'a> RtokenList<'a> {
    /// Number of entries.
    pub fn len(&self) -> usize {
        match self {
            RtokenList::Wire(b) => b.len() / AddLinkRtoken::LEN,
            RtokenList::Slice(s) => s.len(),
        }
    }
    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The entries.
    pub fn iter(&self) -> impl Iterator<Item = AddLinkRtoken> + 'a {
        let this = *self;
        (0..this.len()).map(move |i| match this {
            RtokenList::Wire(b) => AddLinkRtoken::read(b, i * AddLinkRtoken::LEN),
            RtokenList::Slice(s) => s[i],
        })
    }
}

impl PartialEq for RtokenList<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}
impl Eq for RtokenList<'_> {}

impl fmt::Debug for RtokenList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// A list of 32-bit RKeys (DELETE RKEY v2): a borrowed view of received bytes, or a slice.
#[derive(Clone, Copy)]
pub enum RkeyList<'a> {
    /// `n × 4` bytes as received.
    Wire(&'a [u8]),
    /// Values to emit.
    Slice(&'a [u32]),
}

impl<'a> RkeyList<'a> {
    /// Number of entries.
    pub fn len(&self) -> usize {
        match self {
            RkeyList::Wire(b) => b.len() / 4,
            RkeyList::Slice(s) => s.len(),
        }
    }
    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The entries.
    pub fn iter(&self) -> impl Iterator<Item = u32> + 'a {
        let this = *self;
        (0..this.len()).map(move |i| match this {
            RkeyList::Wire(b) => get_u32(b, 4 * i),
            RkeyList::Slice(s) => s[i],
        })
    }
}

impl PartialEq for RkeyList<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}
impl Eq for RkeyList<'_> {}

impl fmt::Debug for RkeyList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.iter().map(|k| format!("{k:#x}")))
            .finish()
    }
}

/// Any LLC message, v1 or v2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LlcMessage<'a> {
    /// CONFIRM LINK (0x01 / 0x21).
    ConfirmLink(ConfirmLink),
    /// ADD LINK (0x02 / 0x22).
    AddLink(AddLink<'a>),
    /// ADD LINK CONTINUATION (0x03).
    AddLinkCont(AddLinkCont),
    /// DELETE LINK (0x04 / 0x24).
    DeleteLink(DeleteLink),
    /// REQUEST ADD LINK (0x25).
    ReqAddLink(ReqAddLink),
    /// CONFIRM RKEY (0x06 / 0x26).
    ConfirmRkey(ConfirmRkey),
    /// CONFIRM RKEY CONTINUATION (0x08).
    ConfirmRkeyCont(ConfirmRkeyCont),
    /// DELETE RKEY (0x09).
    DeleteRkey(DeleteRkey),
    /// DELETE RKEY v2 (0x29).
    DeleteRkeyV2(DeleteRkeyV2<'a>),
    /// TEST LINK (0x07 / 0x27).
    TestLink(TestLink),
}

impl<'a> LlcMessage<'a> {
    /// Parses one LLC message from the start of `b` (a SEND payload; it may be longer than
    /// the message, as receive buffers are).
    pub fn parse(b: &'a [u8], fmt: LlcFormat) -> Result<LlcMessage<'a>> {
        let (ty, v2, m) = frame(b, fmt)?;
        Ok(match ty {
            LlcType::ConfirmLink => LlcMessage::ConfirmLink(ConfirmLink::parse(m, v2, fmt)?),
            LlcType::AddLink => LlcMessage::AddLink(AddLink::parse(m, v2, fmt)?),
            LlcType::AddLinkCont => LlcMessage::AddLinkCont(AddLinkCont::parse(m)?),
            LlcType::DeleteLink => LlcMessage::DeleteLink(DeleteLink::parse(m, v2)?),
            LlcType::ReqAddLink => LlcMessage::ReqAddLink(ReqAddLink::parse(m)?),
            LlcType::ConfirmRkey => LlcMessage::ConfirmRkey(ConfirmRkey::parse(m, v2)?),
            LlcType::ConfirmRkeyCont => LlcMessage::ConfirmRkeyCont(ConfirmRkeyCont::parse(m)?),
            LlcType::DeleteRkey if v2 => LlcMessage::DeleteRkeyV2(DeleteRkeyV2::parse(m)?),
            LlcType::DeleteRkey => LlcMessage::DeleteRkey(DeleteRkey::parse(m)?),
            LlcType::TestLink => LlcMessage::TestLink(TestLink::parse(m, v2)?),
        })
    }

    /// The message type.
    pub fn msg_type(&self) -> LlcType {
        match self {
            LlcMessage::ConfirmLink(_) => LlcType::ConfirmLink,
            LlcMessage::AddLink(_) => LlcType::AddLink,
            LlcMessage::AddLinkCont(_) => LlcType::AddLinkCont,
            LlcMessage::DeleteLink(_) => LlcType::DeleteLink,
            LlcMessage::ReqAddLink(_) => LlcType::ReqAddLink,
            LlcMessage::ConfirmRkey(_) => LlcType::ConfirmRkey,
            LlcMessage::ConfirmRkeyCont(_) => LlcType::ConfirmRkeyCont,
            LlcMessage::DeleteRkey(_) | LlcMessage::DeleteRkeyV2(_) => LlcType::DeleteRkey,
            LlcMessage::TestLink(_) => LlcType::TestLink,
        }
    }

    /// Whether this is an SMC-Rv2 message.
    pub fn is_v2(&self) -> bool {
        match self {
            LlcMessage::ConfirmLink(m) => m.v2,
            LlcMessage::AddLink(m) => m.v2,
            LlcMessage::DeleteLink(m) => m.v2,
            LlcMessage::ConfirmRkey(m) => m.v2,
            LlcMessage::TestLink(m) => m.v2,
            LlcMessage::ReqAddLink(_) | LlcMessage::DeleteRkeyV2(_) => true,
            LlcMessage::AddLinkCont(_)
            | LlcMessage::ConfirmRkeyCont(_)
            | LlcMessage::DeleteRkey(_) => false,
        }
    }

    /// Whether the response flag is set.
    pub fn is_response(&self) -> bool {
        match self {
            LlcMessage::ConfirmLink(m) => m.response,
            LlcMessage::AddLink(m) => m.response,
            LlcMessage::AddLinkCont(m) => m.response,
            LlcMessage::DeleteLink(m) => m.response,
            LlcMessage::ReqAddLink(m) => m.response,
            LlcMessage::ConfirmRkey(m) => m.response,
            LlcMessage::ConfirmRkeyCont(m) => m.response,
            LlcMessage::DeleteRkey(m) => m.response,
            LlcMessage::DeleteRkeyV2(m) => m.response,
            LlcMessage::TestLink(m) => m.response,
        }
    }

    /// Bytes [`Self::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        match self {
            LlcMessage::AddLink(m) => m.buffer_len(),
            LlcMessage::ReqAddLink(m) => m.buffer_len(),
            LlcMessage::DeleteRkeyV2(m) => m.buffer_len(),
            _ => LLC_LEN,
        }
    }

    /// Writes the message into `buf`; returns the number of bytes written.
    pub fn emit(&self, buf: &mut [u8], fmt: LlcFormat) -> Result<usize> {
        let len = self.buffer_len();
        check_out(buf, len)?;
        let b = &mut buf[..len];
        b.fill(0);
        match self {
            LlcMessage::ConfirmLink(m) => m.emit(b, fmt)?,
            LlcMessage::AddLink(m) => m.emit(b, fmt)?,
            LlcMessage::AddLinkCont(m) => m.emit(b, fmt),
            LlcMessage::DeleteLink(m) => m.emit(b, fmt),
            LlcMessage::ReqAddLink(m) => m.emit(b, fmt),
            LlcMessage::ConfirmRkey(m) => m.emit(b, fmt)?,
            LlcMessage::ConfirmRkeyCont(m) => m.emit(b, fmt),
            LlcMessage::DeleteRkey(m) => m.emit(b, fmt)?,
            LlcMessage::DeleteRkeyV2(m) => m.emit(b, fmt)?,
            LlcMessage::TestLink(m) => m.emit(b, fmt),
        }
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcode_classes() {
        assert_eq!(classify(0x01).unwrap(), (LlcType::ConfirmLink, false));
        assert_eq!(classify(0x25).unwrap(), (LlcType::ReqAddLink, true));
        assert!(matches!(
            classify(0x05),
            Err(Error::UnknownType { value: 5, .. })
        ));
        assert!(matches!(classify(0x23), Err(Error::UnknownType { .. })));
        assert!(matches!(classify(0x0a), Err(Error::UnknownType { .. })));
        assert_eq!(classify(0x81), Err(Error::OptionalLlc(0x81)));
        assert!(matches!(classify(0x41), Err(Error::UnknownType { .. })));
        assert!(matches!(classify(0xfe), Err(Error::UnknownType { .. })));
        assert_eq!(opcode_class(0xfe), OpcodeClass::Cdc);
    }

    #[test]
    fn framing_errors() {
        let f = LlcFormat::LINUX_X86;
        let mut b = [0u8; 44];
        b[0] = 7;
        b[1] = 44;
        assert!(LlcMessage::parse(&b, f).is_ok());
        b[1] = 43;
        assert!(matches!(
            LlcMessage::parse(&b, f),
            Err(Error::BadLength { got: 43, .. })
        ));
        assert!(matches!(
            LlcMessage::parse(&b[..40], f),
            Err(Error::Truncated { .. })
        ));
        b[0] = 0x27;
        b[1] = 44;
        b[2] = 0;
        assert!(LlcMessage::parse(&b, f).is_ok());
        assert!(matches!(
            LlcMessage::parse(&b, LlcFormat::LINUX_BE),
            Err(Error::CountOutOfRange {
                field: "length_v2",
                ..
            })
        ));
        b[1] = 45;
        assert!(matches!(
            LlcMessage::parse(&b, f),
            Err(Error::Truncated { .. })
        ));
        assert!(LlcMessage::parse(&[], f).is_err());
    }
}
