//! Field types shared by CLC, LLC and CDC: 24-bit integers, MAC, GID, Peer ID, QP MTU,
//! compressed buffer size, EIDs and host names, and the byte-order choice of Linux SMC-Rv2.

use crate::error::{Error, Result};
use core::fmt;

/// "SMCR" in EBCDIC (IBM-1047): CLC eye catcher and TCP option ExID (RFC 7609 A.1, A.2).
pub const EYECATCHER_SMCR: [u8; 4] = [0xE2, 0xD4, 0xC3, 0xD9];
/// "SMCD" in EBCDIC: the eye catcher Linux uses for SMC-D CLC messages.
pub const EYECATCHER_SMCD: [u8; 4] = [0xE2, 0xD4, 0xC3, 0xC4];

// Big-endian field access. Callers check the buffer length once before using these
// (CHECKLIST ENC-1, ENC-5: every field is big-endian and unaligned, so read byte slices).
#[inline]
pub(crate) fn get_u16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}
#[inline]
pub(crate) fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}
#[inline]
pub(crate) fn get_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_be_bytes(a)
}
#[inline]
pub(crate) fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_be_bytes());
}
#[inline]
pub(crate) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
}
#[inline]
pub(crate) fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_be_bytes());
}
#[inline]
pub(crate) fn array<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[off..off + N]);
    a
}

/// A 24-bit unsigned integer (QP numbers and PSNs, CHECKLIST ENC-3), big-endian on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct U24(u32);

impl U24 {
    /// Largest value.
    pub const MAX: U24 = U24(0x00FF_FFFF);

    /// `Some` if `v` < 2^24.
    pub const fn new(v: u32) -> Option<U24> {
        if v <= 0x00FF_FFFF {
            Some(U24(v))
        } else {
            None
        }
    }
    /// Keeps the low 24 bits of `v` (PSN arithmetic is modulo 2^24).
    pub const fn wrapping(v: u32) -> U24 {
        U24(v & 0x00FF_FFFF)
    }
    /// The value.
    pub const fn get(self) -> u32 {
        self.0
    }
    /// Reads 3 big-endian bytes at `off`.
    #[inline]
    pub(crate) fn read(b: &[u8], off: usize) -> U24 {
        U24(u32::from_be_bytes([0, b[off], b[off + 1], b[off + 2]]))
    }
    /// Writes 3 big-endian bytes at `off`.
    #[inline]
    pub(crate) fn write(self, b: &mut [u8], off: usize) {
        b[off..off + 3].copy_from_slice(&self.0.to_be_bytes()[1..]);
    }
}

impl fmt::Display for U24 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

/// A 48-bit Ethernet MAC address (the RoCE MAC of CLC and LLC; the verbs API's too).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Mac(pub [u8; 6]);

impl fmt::Debug for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mac({self})")
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// A 16-byte global identifier (RoCE GID in CLC and LLC; the verbs API's too). On RoCEv2
/// it is the port's IPv6 address, or the IPv4-mapped address (`::ffff:a.b.c.d`) for IPv4.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The IPv4-mapped GID `::ffff:a.b.c.d` that RoCEv2 uses for an IPv4 address.
    pub fn from_ipv4(ip: core::net::Ipv4Addr) -> Gid {
        Gid(ip.to_ipv6_mapped().octets())
    }
    /// The GID for an IP address (IPv4 addresses are mapped).
    pub fn from_ip(ip: core::net::IpAddr) -> Gid {
        match ip {
            core::net::IpAddr::V4(v4) => Gid::from_ipv4(v4),
            core::net::IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }
    /// The GID as an IPv6 address.
    pub fn to_ipv6(self) -> core::net::Ipv6Addr {
        core::net::Ipv6Addr::from(self.0)
    }
    /// The IP address this GID stands for (IPv4 when it is IPv4-mapped).
    pub fn to_ip(&self) -> core::net::IpAddr {
        let v6 = self.to_ipv6();
        match v6.to_ipv4_mapped() {
            Some(v4) => core::net::IpAddr::V4(v4),
            None => core::net::IpAddr::V6(v6),
        }
    }
    /// The IPv4 address if this GID is IPv4-mapped.
    pub fn to_ipv4(&self) -> Option<core::net::Ipv4Addr> {
        self.to_ipv6().to_ipv4_mapped()
    }
    /// True for the all-zero GID.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({})", self.to_ipv6())
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.to_ipv6(), f)
    }
}

/// Peer ID: 2-byte instance ID + 6-byte RoCE MAC, unique per stack instance (RFC 7609 A.2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PeerId {
    /// Instance ID; must change on every restart of the stack (§2.2.4).
    pub instance: u16,
    /// MAC of one of the sender's RNICs.
    pub mac: Mac,
}

impl PeerId {
    /// Wire length.
    pub const LEN: usize = 8;

    pub(crate) fn read(b: &[u8], off: usize) -> PeerId {
        PeerId {
            instance: get_u16(b, off),
            mac: Mac(array(b, off + 2)),
        }
    }
    pub(crate) fn write(&self, b: &mut [u8], off: usize) {
        put_u16(b, off, self.instance);
        b[off + 2..off + 8].copy_from_slice(&self.mac.0);
    }
    /// The 8 bytes as one big-endian number (how tshark prints it).
    pub fn as_u64(&self) -> u64 {
        let mut b = [0u8; 8];
        self.write(&mut b, 0);
        u64::from_be_bytes(b)
    }
}

impl fmt::Display for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#018x}", self.as_u64())
    }
}

/// QP MTU enumeration (RFC 7609 A.2.3, same numbering as the IBTA path MTU and ibverbs'
/// `enum ibv_mtu`; CHECKLIST A.6a). The verbs API uses this type as `smc_verbs::Mtu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum QpMtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl QpMtu {
    /// All values, smallest first.
    pub const ALL: [QpMtu; 5] = [
        QpMtu::Mtu256,
        QpMtu::Mtu512,
        QpMtu::Mtu1024,
        QpMtu::Mtu2048,
        QpMtu::Mtu4096,
    ];

    /// From the IBA enumeration value (1..=5); `None` for anything else.
    pub fn from_enum(v: u8) -> Option<QpMtu> {
        Self::ALL.get((v as usize).wrapping_sub(1)).copied()
    }

    /// From a byte count that is exactly one of the IBA sizes.
    pub fn from_bytes(n: usize) -> Option<QpMtu> {
        Self::ALL.iter().copied().find(|m| m.bytes() == n)
    }

    /// The largest IBA MTU whose payload fits in `n` bytes (as [`QpMtu::from_bytes_floor`]).
    pub fn largest_fitting(n: usize) -> Option<QpMtu> {
        Self::from_bytes_floor(n)
    }

    /// Decodes the 4-bit code; 0 and 6..15 are reserved (→ Decline / negative ADD LINK).
    pub fn from_code(code: u8) -> Result<QpMtu> {
        Ok(match code {
            1 => QpMtu::Mtu256,
            2 => QpMtu::Mtu512,
            3 => QpMtu::Mtu1024,
            4 => QpMtu::Mtu2048,
            5 => QpMtu::Mtu4096,
            _ => {
                return Err(Error::ReservedValue {
                    field: "qp_mtu",
                    value: code.into(),
                })
            }
        })
    }
    /// The 4-bit code.
    pub fn code(self) -> u8 {
        self as u8
    }
    /// MTU in bytes.
    pub fn bytes(self) -> usize {
        128 << (self as u8)
    }
    /// The largest enumerated MTU that is ≤ `bytes`, if any.
    pub fn from_bytes_floor(bytes: usize) -> Option<QpMtu> {
        [
            QpMtu::Mtu4096,
            QpMtu::Mtu2048,
            QpMtu::Mtu1024,
            QpMtu::Mtu512,
            QpMtu::Mtu256,
        ]
        .into_iter()
        .find(|m| m.bytes() <= bytes)
    }
}

/// Compressed (4-bit) RMBE / DMBE size: `16 KiB << code` (RFC 7609 A.2.3, CHECKLIST A.6b).
///
/// RFC 7609 defines codes 0..=5 (16 KiB..512 KiB); Linux ≥ 6.11 sends up to 15 (512 MiB) for
/// SMC-R. The codec keeps any 4-bit code so messages round-trip; which codes a receiver
/// accepts is a policy choice ([`BufSize::from_code`] takes the maximum).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct BufSize(u8);

impl BufSize {
    /// Largest code RFC 7609 defines (512 KiB).
    pub const RFC_MAX_CODE: u8 = 5;
    /// Largest code Linux ≥ 6.11 uses for SMC-R (512 MiB).
    pub const LINUX_MAX_CODE: u8 = 15;

    /// Wraps a code read from the wire (any 4-bit value).
    pub(crate) fn from_nibble(code: u8) -> BufSize {
        BufSize(code & 0x0F)
    }
    /// A code, rejected if above `max_code` (use [`Self::RFC_MAX_CODE`] or
    /// [`Self::LINUX_MAX_CODE`]).
    pub fn from_code(code: u8, max_code: u8) -> Result<BufSize> {
        if code > max_code.min(15) {
            return Err(Error::ReservedValue {
                field: "rmbe_size",
                value: code.into(),
            });
        }
        Ok(BufSize(code))
    }
    /// Encodes a buffer size, rounding **up** so that the RMBE is at least `size` bytes
    /// (RFC 7609 §4.1; Linux `smc_compress_bufsize`), clamped to `max_code`.
    pub fn encode(size: usize, max_code: u8) -> BufSize {
        let max_code = max_code.min(15);
        if size <= 16384 {
            return BufSize(0);
        }
        let units = (size - 1) >> 14; // ≥ 1
        let code = (usize::BITS - units.leading_zeros()) as u8; // ilog2(units) + 1
        BufSize(code.min(max_code))
    }
    /// The 4-bit code.
    pub fn code(self) -> u8 {
        self.0
    }
    /// Decoded size in bytes: 16 KiB << code.
    pub fn bytes(self) -> usize {
        16384usize << self.0
    }
}

/// Byte order of the fields Linux writes in host order in SMC-Rv2 LLC messages
/// (`length_v2` and the ADD LINK v2 `num_rkeys`; linux-smc.md hazard H1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ByteOrder {
    /// What x86 Linux sends (e.g. `2c 00` for 44).
    Little,
    /// What a big-endian host (s390) sends, and presumably IBM's specification.
    Big,
}

impl ByteOrder {
    pub(crate) fn get_u16(self, b: &[u8], off: usize) -> u16 {
        let a = [b[off], b[off + 1]];
        match self {
            ByteOrder::Little => u16::from_le_bytes(a),
            ByteOrder::Big => u16::from_be_bytes(a),
        }
    }
    pub(crate) fn put_u16(self, b: &mut [u8], off: usize, v: u16) {
        let a = match self {
            ByteOrder::Little => v.to_le_bytes(),
            ByteOrder::Big => v.to_be_bytes(),
        };
        b[off..off + 2].copy_from_slice(&a);
    }
}

/// A 32-byte blank-padded identifier field: EIDs (user EID, system EID) and host names.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Name32(pub [u8; 32]);

impl Name32 {
    /// Wire length.
    pub const LEN: usize = 32;

    /// Blank-pads `s`; `None` if longer than 32 bytes.
    pub fn new(s: &str) -> Option<Name32> {
        let b = s.as_bytes();
        if b.len() > 32 {
            return None;
        }
        let mut a = [b' '; 32];
        a[..b.len()].copy_from_slice(b);
        Some(Name32(a))
    }
    /// The text with trailing blanks and NULs removed (lossy for non-UTF-8 bytes).
    pub fn trimmed(&self) -> &[u8] {
        let end = self
            .0
            .iter()
            .rposition(|&c| c != b' ' && c != 0)
            .map_or(0, |p| p + 1);
        &self.0[..end]
    }
    /// Linux's user-EID validity rule (`smc_clc_ueid_valid`): the first character is
    /// alphanumeric, every character up to the blank padding is one of A-Z, 0-9, '.', '-',
    /// and there are no blanks inside.
    pub fn is_valid_ueid(&self) -> bool {
        let t = self.trimmed();
        match t.first() {
            Some(c) if c.is_ascii_uppercase() || c.is_ascii_digit() => {}
            _ => return false,
        }
        t.iter()
            .all(|&c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'.' || c == b'-')
            && self.0[t.len()..].iter().all(|&c| c == b' ')
    }
}

impl Default for Name32 {
    fn default() -> Self {
        Name32([b' '; 32])
    }
}

impl fmt::Display for Name32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for &c in self.trimmed() {
            if c.is_ascii_graphic() || c == b' ' {
                write!(f, "{}", c as char)?;
            } else {
                write!(f, "\\x{c:02x}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Name32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// An Enterprise ID (user EID or system EID) of SMCv2.
pub type Eid = Name32;
/// A host name field (first-contact extension), 32 bytes blank-padded.
pub type HostName = Name32;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u24_round_trip() {
        let mut b = [0u8; 4];
        U24::new(0x12_3456).unwrap().write(&mut b, 1);
        assert_eq!(b, [0, 0x12, 0x34, 0x56]);
        assert_eq!(U24::read(&b, 1).get(), 0x12_3456);
        assert!(U24::new(1 << 24).is_none());
        assert_eq!(U24::wrapping(0x0123_4567).get(), 0x23_4567);
    }

    #[test]
    fn bufsize_rounds_up_like_linux() {
        let m = BufSize::LINUX_MAX_CODE;
        assert_eq!(BufSize::encode(0, m).code(), 0);
        assert_eq!(BufSize::encode(16384, m).code(), 0);
        assert_eq!(BufSize::encode(16385, m).code(), 1);
        assert_eq!(BufSize::encode(65536, m).code(), 2);
        assert_eq!(BufSize::encode(65537, m).code(), 3);
        assert_eq!(BufSize::encode(1 << 20, m).code(), 6);
        assert_eq!(BufSize::encode(1 << 20, BufSize::RFC_MAX_CODE).code(), 5);
        assert_eq!(BufSize::encode(usize::MAX, m).code(), 15);
        for c in 0..=15u8 {
            let b = BufSize::from_code(c, 15).unwrap();
            assert_eq!(BufSize::encode(b.bytes(), 15), b, "code {c}");
            assert!(b.bytes() >= 16384);
        }
        assert!(BufSize::from_code(6, BufSize::RFC_MAX_CODE).is_err());
    }

    #[test]
    fn mtu_enumeration() {
        assert!(QpMtu::from_code(0).is_err());
        assert!(QpMtu::from_code(6).is_err());
        assert_eq!(QpMtu::from_code(3).unwrap().bytes(), 1024);
        assert_eq!(QpMtu::from_code(5).unwrap().bytes(), 4096);
        assert_eq!(QpMtu::from_bytes_floor(1500), Some(QpMtu::Mtu1024));
        assert_eq!(QpMtu::from_bytes_floor(100), None);
    }

    #[test]
    fn names_and_ueid_rule() {
        let e = Name32::new("SMC-PEER-TEST").unwrap();
        assert!(e.is_valid_ueid());
        assert_eq!(e.to_string(), "SMC-PEER-TEST");
        assert!(!Name32::new("smc-lower").unwrap().is_valid_ueid());
        assert!(!Name32::new("-LEADING").unwrap().is_valid_ueid());
        assert!(!Name32::new("IN SIDE").unwrap().is_valid_ueid());
        assert!(!Name32::new("").unwrap().is_valid_ueid());
        assert!(Name32::new(&"X".repeat(33)).is_none());
    }

    #[test]
    fn displays() {
        let g = Gid::from_ipv4(core::net::Ipv4Addr::new(10, 99, 0, 1));
        assert_eq!(g.to_string(), "::ffff:10.99.0.1");
        let p = PeerId {
            instance: 0x0eef,
            mac: Mac([0x52, 0x54, 0, 0x99, 0, 1]),
        };
        assert_eq!(p.to_string(), "0x0eef525400990001");
        assert_eq!(p.mac.to_string(), "52:54:00:99:00:01");
    }
}
