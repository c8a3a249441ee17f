//! MPA (RFC 5044) connection frames and FPDU framing, with the RFC 6581 enhancements.
//!
//! Request/Reply frame (RFC 5044 §7.1, RFC 6581 §6):
//! ```text
//!  0..16  Key: "MPA ID Req Frame" / "MPA ID Rep Frame"
//!  16     M C R S Res(4)        (markers, CRC, reject, S = enhanced data present)
//!  17     Rev
//!  18..20 PD_Length (u16 BE, <= 512)
//!  20..   Private Data (with S: the 4-byte enhanced data word first, RFC 6581 §9)
//! ```
//! FPDU (RFC 5044 §4.1, markers not in use): `ULPDU_Length (u16 BE) | ULPDU | PAD (0..3) |
//! CRC (4)`; the CRC is CRC32c over length, ULPDU and pad, sent least significant byte first
//! (the iSCSI convention RFC 5044 §4.3 refers to), and zero when CRC was not negotiated.

use super::{be16, check, put16, room, Result, WireError};

/// Key of an MPA Request frame.
pub const KEY_REQ: [u8; 16] = *b"MPA ID Req Frame";
/// Key of an MPA Reply frame.
pub const KEY_REP: [u8; 16] = *b"MPA ID Rep Frame";
/// Length of the frame before the private data.
pub const RR_HEADER_LEN: usize = 20;
/// Largest private data (RFC 5044 §7.1, RFC 6581 §7).
pub const MAX_PRIVATE_DATA: usize = 512;
/// Length of the RFC 6581 §9 enhanced connection establishment data.
pub const ENHANCED_LEN: usize = 4;
/// IRD/ORD value meaning "no automatic negotiation" (RFC 6581 §9.1).
pub const IRD_ORD_NO_LIMIT: u16 = 0x3fff;

/// Byte 16 flags.
pub mod flags {
    /// M: the sender wants to receive markers.
    pub const MARKERS: u8 = 0x80;
    /// C: the sender wants CRCs.
    pub const CRC: u8 = 0x40;
    /// R: the reply rejects the connection.
    pub const REJECT: u8 = 0x20;
    /// S: the private data begins with the enhanced data (RFC 6581 §6).
    pub const ENHANCED: u8 = 0x10;
    /// Res: MUST be sent as 0 and MUST NOT be checked (RFC 6581 §6).
    pub const RES_MASK: u8 = 0x0f;
}

/// Enhanced data word bits (RFC 6581 §9), in the 16-bit IRD and ORD words.
pub mod enh {
    /// A (IRD word): peer-to-peer connection model.
    pub const PEER_TO_PEER: u16 = 0x8000;
    /// B (IRD word): zero-length Send RTR.
    pub const SEND_RTR: u16 = 0x4000;
    /// C (ORD word): zero-length RDMA Write RTR.
    pub const WRITE_RTR: u16 = 0x8000;
    /// D (ORD word): zero-length RDMA Read RTR.
    pub const READ_RTR: u16 = 0x4000;
    /// The 14-bit IRD/ORD value.
    pub const VALUE_MASK: u16 = 0x3fff;
}

/// Request or Reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// "MPA ID Req Frame".
    Request,
    /// "MPA ID Rep Frame".
    Reply,
}

/// The set of RTR indications (RFC 6581 §9.2, control flags B, C, D).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RtrSet {
    /// B: zero-length Send.
    pub send: bool,
    /// C: zero-length RDMA Write.
    pub write: bool,
    /// D: zero-length RDMA Read.
    pub read: bool,
}

impl RtrSet {
    /// No option.
    pub const NONE: RtrSet = RtrSet {
        send: false,
        write: false,
        read: false,
    };
    /// All three options.
    pub const ALL: RtrSet = RtrSet {
        send: true,
        write: true,
        read: true,
    };
    /// True when no option is set.
    pub fn is_empty(&self) -> bool {
        !(self.send || self.write || self.read)
    }
    /// Options in both sets.
    pub fn intersect(&self, o: &RtrSet) -> RtrSet {
        RtrSet {
            send: self.send && o.send,
            write: self.write && o.write,
            read: self.read && o.read,
        }
    }
    /// Parses `send,write,read` (any subset, comma-separated; `none` or empty for none).
    pub fn parse(s: &str) -> Option<RtrSet> {
        let mut r = RtrSet::NONE;
        for p in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match p {
                "send" => r.send = true,
                "write" => r.write = true,
                "read" => r.read = true,
                "none" => {}
                "all" => r = RtrSet::ALL,
                _ => return None,
            }
        }
        Some(r)
    }
}

impl std::fmt::Display for RtrSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut v = Vec::new();
        if self.send {
            v.push("send");
        }
        if self.write {
            v.push("write");
        }
        if self.read {
            v.push("read");
        }
        if v.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&v.join(","))
        }
    }
}

/// The RFC 6581 §9 Enhanced RDMA Connection Establishment Data: `A B IRD(14) | C D ORD(14)`,
/// network byte order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EnhancedData {
    /// A: peer-to-peer model.
    pub p2p: bool,
    /// B/C/D: RTR options requested (in a Request) or supported (in a Reply).
    pub rtr: RtrSet,
    /// IRD, 14 bits (0x3FFF = no automatic negotiation).
    pub ird: u16,
    /// ORD, 14 bits (0x3FFF = no automatic negotiation).
    pub ord: u16,
}

impl EnhancedData {
    /// Parses the first 4 bytes of `b`.
    pub fn parse(b: &[u8]) -> Result<EnhancedData> {
        check("MPA enhanced data", b, ENHANCED_LEN)?;
        let ird = be16(b, 0);
        let ord = be16(b, 2);
        let p2p = ird & enh::PEER_TO_PEER != 0;
        Ok(EnhancedData {
            p2p,
            // RFC 6581 §9.2: with A = 0, "Control Flags B, C, and D MUST be ignored".
            rtr: if p2p {
                RtrSet {
                    send: ird & enh::SEND_RTR != 0,
                    write: ord & enh::WRITE_RTR != 0,
                    read: ord & enh::READ_RTR != 0,
                }
            } else {
                RtrSet::NONE
            },
            ird: ird & enh::VALUE_MASK,
            ord: ord & enh::VALUE_MASK,
        })
    }

    /// The two 16-bit words. IRD/ORD above 14 bits are an error; with `p2p` false the RTR
    /// flags are sent as 0 (RFC 6581 §9.2: "If Control Flag A is set to 0, then Control
    /// Flags B, C, and D MUST also be set to 0").
    pub fn words(&self) -> Result<(u16, u16)> {
        for (field, v) in [("IRD", self.ird), ("ORD", self.ord)] {
            if v > enh::VALUE_MASK {
                return Err(WireError::Invalid {
                    field,
                    value: v as u64,
                });
            }
        }
        let mut ird = self.ird;
        let mut ord = self.ord;
        if self.p2p {
            ird |= enh::PEER_TO_PEER;
            if self.rtr.send {
                ird |= enh::SEND_RTR;
            }
            if self.rtr.write {
                ord |= enh::WRITE_RTR;
            }
            if self.rtr.read {
                ord |= enh::READ_RTR;
            }
        }
        Ok((ird, ord))
    }

    /// Writes the 4 bytes.
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        room(b, ENHANCED_LEN)?;
        let (ird, ord) = self.words()?;
        put16(b, 0, ird);
        put16(b, 2, ord);
        Ok(())
    }

    /// The RTR options that count: none unless A is set (RFC 6581 §9.2, "if Control Flag
    /// A is set to 0, then Control Flags B, C, and D MUST be ignored").
    pub fn effective_rtr(&self) -> RtrSet {
        if self.p2p {
            self.rtr
        } else {
            RtrSet::NONE
        }
    }
}

/// A typed view of an MPA Request/Reply frame, length-checked once.
#[derive(Clone, Copy, Debug)]
pub struct MpaFrame<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> MpaFrame<T> {
    /// Checks that `buf` holds the 20-byte header and the private data it announces
    /// (at most 512 bytes).
    pub fn new_checked(buf: T) -> Result<MpaFrame<T>> {
        let b = buf.as_ref();
        check("MPA request/reply", b, RR_HEADER_LEN)?;
        let pd = be16(b, 18) as usize;
        if pd > MAX_PRIVATE_DATA {
            return Err(WireError::Invalid {
                field: "MPA PD_Length",
                value: pd as u64,
            });
        }
        check("MPA private data", b, RR_HEADER_LEN + pd)?;
        Ok(MpaFrame { buf })
    }
    /// The 16-byte key.
    pub fn key(&self) -> &[u8] {
        &self.buf.as_ref()[..16]
    }
    /// The flags byte.
    pub fn flags(&self) -> u8 {
        self.buf.as_ref()[16]
    }
    /// Rev.
    pub fn rev(&self) -> u8 {
        self.buf.as_ref()[17]
    }
    /// PD_Length.
    pub fn pd_length(&self) -> u16 {
        be16(self.buf.as_ref(), 18)
    }
    /// The private data (enhanced data included).
    pub fn private_data(&self) -> &[u8] {
        let n = self.pd_length() as usize;
        &self.buf.as_ref()[RR_HEADER_LEN..RR_HEADER_LEN + n]
    }
    /// Bytes the frame occupies.
    pub fn total_len(&self) -> usize {
        RR_HEADER_LEN + self.pd_length() as usize
    }
}

/// Length of a frame whose header is `hdr` (20 bytes), or the error that makes it
/// unacceptable (PD_Length above 512). For reading a frame off a stream.
pub fn frame_len(hdr: &[u8; RR_HEADER_LEN]) -> Result<usize> {
    let pd = be16(hdr, 18) as usize;
    if pd > MAX_PRIVATE_DATA {
        return Err(WireError::Invalid {
            field: "MPA PD_Length",
            value: pd as u64,
        });
    }
    Ok(RR_HEADER_LEN + pd)
}

/// An MPA Request or Reply as values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MpaRepr<'a> {
    /// Request or Reply.
    pub kind: FrameKind,
    /// M.
    pub markers: bool,
    /// C.
    pub crc: bool,
    /// R (replies only; a request with R set is parsed as is).
    pub reject: bool,
    /// Rev.
    pub rev: u8,
    /// With S: the enhanced data word.
    pub enhanced: Option<EnhancedData>,
    /// Private data after the enhanced word (the ULP's).
    pub ulp_data: &'a [u8],
}

impl<'a> MpaRepr<'a> {
    /// Parses a frame. Receiver rules: the key must be one of the two; Res is ignored
    /// (RFC 6581 §6); S with Rev < 2 is malformed (CHECKLIST AMB-M2); S with PD_Length < 4
    /// is malformed (RFC 6581 §6: the private data "MUST begin with" the enhanced data).
    pub fn parse(f: &MpaFrame<&'a [u8]>) -> Result<MpaRepr<'a>> {
        let kind = if f.key() == KEY_REQ {
            FrameKind::Request
        } else if f.key() == KEY_REP {
            FrameKind::Reply
        } else {
            return Err(WireError::Invalid {
                field: "MPA key",
                value: u64::from_be_bytes(f.key()[..8].try_into().unwrap_or([0; 8])),
            });
        };
        let fl = f.flags();
        let rev = f.rev();
        let pd: &'a [u8] = {
            let b: &'a [u8] = f.buf;
            let n = f.pd_length() as usize;
            &b[RR_HEADER_LEN..RR_HEADER_LEN + n]
        };
        let (enhanced, ulp_data) = if fl & flags::ENHANCED != 0 {
            if rev < 2 {
                return Err(WireError::Invalid {
                    field: "MPA Rev (S set)",
                    value: rev as u64,
                });
            }
            if pd.len() < ENHANCED_LEN {
                return Err(WireError::Invalid {
                    field: "MPA PD_Length (S set)",
                    value: pd.len() as u64,
                });
            }
            (Some(EnhancedData::parse(pd)?), &pd[ENHANCED_LEN..])
        } else {
            (None, pd)
        };
        Ok(MpaRepr {
            kind,
            markers: fl & flags::MARKERS != 0,
            crc: fl & flags::CRC != 0,
            reject: fl & flags::REJECT != 0,
            rev,
            enhanced,
            ulp_data,
        })
    }

    /// Parses a whole frame from bytes.
    pub fn parse_bytes(b: &'a [u8]) -> Result<MpaRepr<'a>> {
        let f = MpaFrame::new_checked(b)?;
        MpaRepr::parse(&f)
    }

    /// Bytes [`MpaRepr::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        RR_HEADER_LEN + self.pd_len()
    }

    fn pd_len(&self) -> usize {
        self.ulp_data.len()
            + if self.enhanced.is_some() {
                ENHANCED_LEN
            } else {
                0
            }
    }

    /// Writes the frame (Res as 0); returns its length.
    pub fn emit(&self, b: &mut [u8]) -> Result<usize> {
        let pd = self.pd_len();
        if pd > MAX_PRIVATE_DATA {
            return Err(WireError::Invalid {
                field: "MPA PD_Length",
                value: pd as u64,
            });
        }
        if self.enhanced.is_some() && self.rev < 2 {
            return Err(WireError::Invalid {
                field: "MPA Rev (S set)",
                value: self.rev as u64,
            });
        }
        let n = RR_HEADER_LEN + pd;
        room(b, n)?;
        b[..16].copy_from_slice(match self.kind {
            FrameKind::Request => &KEY_REQ,
            FrameKind::Reply => &KEY_REP,
        });
        let mut fl = 0;
        if self.markers {
            fl |= flags::MARKERS;
        }
        if self.crc {
            fl |= flags::CRC;
        }
        if self.reject {
            fl |= flags::REJECT;
        }
        let mut at = RR_HEADER_LEN;
        if let Some(e) = &self.enhanced {
            fl |= flags::ENHANCED;
            e.emit(&mut b[at..])?;
            at += ENHANCED_LEN;
        }
        b[16] = fl;
        b[17] = self.rev;
        put16(b, 18, pd as u16);
        b[at..at + self.ulp_data.len()].copy_from_slice(self.ulp_data);
        Ok(n)
    }
}

/// Bytes of the FPDU length field.
pub const FPDU_LEN_FIELD: usize = 2;
/// Bytes of the FPDU CRC field.
pub const FPDU_CRC_LEN: usize = 4;
/// Largest ULPDU the 16-bit length field allows.
pub const MAX_ULPDU: usize = 0xffff;

/// Pad bytes after a ULPDU of `ulpdu_len` so that the FPDU is a multiple of 4 bytes
/// (RFC 5044 §4.1).
#[inline]
pub fn pad_len(ulpdu_len: usize) -> usize {
    (4 - (FPDU_LEN_FIELD + ulpdu_len) % 4) % 4
}

/// Total FPDU length for a ULPDU of `ulpdu_len` bytes (no markers).
#[inline]
pub fn fpdu_len(ulpdu_len: usize) -> usize {
    FPDU_LEN_FIELD + ulpdu_len + pad_len(ulpdu_len) + FPDU_CRC_LEN
}

/// CRC32c (Castagnoli) of an FPDU body (length field, ULPDU and pad), as RFC 5044 §4.3
/// computes it; the wire form is `crc.to_le_bytes()`.
pub fn fpdu_crc(body: &[u8]) -> u32 {
    crc32c::crc32c(body)
}

/// Continues a CRC32c over more bytes (for an FPDU written from several pieces).
pub fn fpdu_crc_append(crc: u32, more: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, more)
}

/// A typed view of one FPDU (markers not in use).
#[derive(Clone, Copy, Debug)]
pub struct Fpdu<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Fpdu<T> {
    /// Checks that `buf` holds a whole FPDU as its length field announces.
    pub fn new_checked(buf: T) -> Result<Fpdu<T>> {
        let b = buf.as_ref();
        check("FPDU length", b, FPDU_LEN_FIELD)?;
        let n = fpdu_len(be16(b, 0) as usize);
        check("FPDU", b, n)?;
        Ok(Fpdu { buf })
    }
    /// ULPDU_Length.
    pub fn ulpdu_len(&self) -> usize {
        be16(self.buf.as_ref(), 0) as usize
    }
    /// The ULPDU (DDP segment).
    pub fn ulpdu(&self) -> &[u8] {
        &self.buf.as_ref()[FPDU_LEN_FIELD..FPDU_LEN_FIELD + self.ulpdu_len()]
    }
    /// Bytes the FPDU occupies.
    pub fn total_len(&self) -> usize {
        fpdu_len(self.ulpdu_len())
    }
    /// The CRC field as sent.
    pub fn crc_field(&self) -> u32 {
        let b = self.buf.as_ref();
        let at = self.total_len() - FPDU_CRC_LEN;
        u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }
    /// The CRC the FPDU should carry.
    pub fn compute_crc(&self) -> u32 {
        fpdu_crc(&self.buf.as_ref()[..self.total_len() - FPDU_CRC_LEN])
    }
    /// True if the CRC field is right.
    pub fn crc_ok(&self) -> bool {
        self.crc_field() == self.compute_crc()
    }
}

/// Writes an FPDU around `ulpdu` into `out`; with `crc` the CRC32c, else zero. Returns its
/// length.
pub fn emit_fpdu(out: &mut [u8], ulpdu: &[u8], crc: bool) -> Result<usize> {
    if ulpdu.len() > MAX_ULPDU {
        return Err(WireError::Invalid {
            field: "ULPDU_Length",
            value: ulpdu.len() as u64,
        });
    }
    let n = fpdu_len(ulpdu.len());
    room(out, n)?;
    put16(out, 0, ulpdu.len() as u16);
    out[2..2 + ulpdu.len()].copy_from_slice(ulpdu);
    let body = n - FPDU_CRC_LEN;
    out[2 + ulpdu.len()..body].fill(0);
    let c = if crc { fpdu_crc(&out[..body]) } else { 0 };
    out[body..n].copy_from_slice(&c.to_le_bytes());
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_vectors_rfc3720_b4() {
        // RFC 3720 B.4: 32 bytes of zeros -> aa 36 91 8a on the wire; 32 x 0xff -> 43 ab a8 62.
        assert_eq!(fpdu_crc(&[0u8; 32]).to_le_bytes(), [0xaa, 0x36, 0x91, 0x8a]);
        assert_eq!(
            fpdu_crc(&[0xffu8; 32]).to_le_bytes(),
            [0x43, 0xab, 0xa8, 0x62]
        );
    }

    #[test]
    fn fpdu_round_trip_and_padding() {
        for n in 0..9 {
            let data: Vec<u8> = (0..n as u8).collect();
            let mut out = [0u8; 32];
            let len = emit_fpdu(&mut out, &data, true).unwrap();
            assert_eq!(len % 4, 0);
            assert_eq!(len, fpdu_len(n));
            let f = Fpdu::new_checked(&out[..len]).unwrap();
            assert_eq!(f.ulpdu(), &data[..]);
            assert!(f.crc_ok());
            let mut bad = out;
            bad[2] ^= 1;
            if n > 0 {
                assert!(!Fpdu::new_checked(&bad[..len]).unwrap().crc_ok());
            }
        }
        assert!(Fpdu::new_checked(&[0u8, 8, 1, 2][..]).is_err());
    }

    #[test]
    fn siw_p2p_request_words() {
        // Seen from siw built with SIW_P2P=1: private data 8001 c001 (IRD 1 + P2P, ORD 1 +
        // WRITE|READ RTR); reply 8001 8001 (WRITE RTR).
        let e = EnhancedData::parse(&[0x80, 0x01, 0xc0, 0x01]).unwrap();
        assert_eq!(
            e,
            EnhancedData {
                p2p: true,
                rtr: RtrSet {
                    send: false,
                    write: true,
                    read: true
                },
                ird: 1,
                ord: 1
            }
        );
        let mut b = [0u8; 4];
        e.emit(&mut b).unwrap();
        assert_eq!(b, [0x80, 0x01, 0xc0, 0x01]);
    }
}
