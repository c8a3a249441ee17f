//! DDP segment headers (RFC 5041 §4) with the RDMAP control byte (RFC 5040 §4.1), the RDMA
//! Read Request header (RFC 5040 §4.4) and the Terminate header (RFC 5040 §4.8).
//!
//! ```text
//! byte 0  DDP control: T(0x80) L(0x40) Rsvd(0x3c) DV(0x03) = 1
//! byte 1  RDMAP control: RV(0xc0) = 1, Rsv(0x30), Opcode(0x0f)
//! tagged   (14 bytes): STag(4) TO(8)
//! untagged (18 bytes): RsvdULP(4) (Invalidate STag of Send with Invalidate) QN(4) MSN(4) MO(4)
//! ```

use super::{be32, be64, check, put32, put64, room, Result, WireError};

/// Tagged header length.
pub const TAGGED_HDR_LEN: usize = 14;
/// Untagged header length.
pub const UNTAGGED_HDR_LEN: usize = 18;
/// Read Request header length (after the untagged DDP header).
pub const READ_REQ_LEN: usize = 28;
/// Terminate control field length.
pub const TERM_CTRL_LEN: usize = 4;
/// DDP version this implementation speaks (RFC 5041 §4.1: DV = 01b).
pub const DDP_VERSION: u8 = 1;
/// RDMAP version (RFC 5040 §4.1: RV = 01b).
pub const RDMAP_VERSION: u8 = 1;

/// Untagged queue numbers (RFC 5040 §5.1).
pub mod qn {
    /// Send, Send with Invalidate/SE.
    pub const SEND: u32 = 0;
    /// RDMA Read Request.
    pub const READ_REQ: u32 = 1;
    /// Terminate.
    pub const TERMINATE: u32 = 2;
}

/// Field names the parser reports, so that a receiver can map a failure to the Terminate
/// error code RFC 5040/5041 assign to it.
pub mod field {
    /// DDP version not 1.
    pub const DDP_VERSION: &str = "DDP version";
    /// RDMAP version not 1.
    pub const RDMAP_VERSION: &str = "RDMAP version";
    /// Opcode 8..15, or tagged flag inconsistent with the opcode.
    pub const OPCODE: &str = "RDMAP opcode";
}

/// RDMAP opcodes (RFC 5040 §4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// RDMA Write (tagged).
    Write = 0,
    /// RDMA Read Request (untagged, QN 1).
    ReadRequest = 1,
    /// RDMA Read Response (tagged).
    ReadResponse = 2,
    /// Send (untagged, QN 0).
    Send = 3,
    /// Send with Invalidate.
    SendInvalidate = 4,
    /// Send with Solicited Event.
    SendSe = 5,
    /// Send with Solicited Event and Invalidate.
    SendSeInvalidate = 6,
    /// Terminate (untagged, QN 2).
    Terminate = 7,
}

impl Opcode {
    /// From the 4-bit field.
    pub fn from_u8(v: u8) -> Option<Opcode> {
        Some(match v {
            0 => Opcode::Write,
            1 => Opcode::ReadRequest,
            2 => Opcode::ReadResponse,
            3 => Opcode::Send,
            4 => Opcode::SendInvalidate,
            5 => Opcode::SendSe,
            6 => Opcode::SendSeInvalidate,
            7 => Opcode::Terminate,
            _ => return None,
        })
    }
    /// True for the tagged opcodes (Write, Read Response).
    pub fn is_tagged(self) -> bool {
        matches!(self, Opcode::Write | Opcode::ReadResponse)
    }
    /// True for the four Send variants.
    pub fn is_send(self) -> bool {
        matches!(
            self,
            Opcode::Send | Opcode::SendInvalidate | Opcode::SendSe | Opcode::SendSeInvalidate
        )
    }
    /// The untagged queue this opcode travels on.
    pub fn queue(self) -> Option<u32> {
        match self {
            Opcode::ReadRequest => Some(qn::READ_REQ),
            Opcode::Terminate => Some(qn::TERMINATE),
            o if o.is_send() => Some(qn::SEND),
            _ => None,
        }
    }
}

/// Where a segment's payload goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Tagged buffer model: STag and tagged offset.
    Tagged {
        /// Data sink STag.
        stag: u32,
        /// Data sink tagged offset.
        to: u64,
    },
    /// Untagged buffer model.
    Untagged {
        /// RsvdULP: the Invalidate STag of Send with Invalidate, else 0.
        inv_stag: u32,
        /// Queue number.
        qn: u32,
        /// Message sequence number (starts at 1 per queue).
        msn: u32,
        /// Message offset.
        mo: u32,
    },
}

/// A DDP segment header with its RDMAP control byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DdpRepr {
    /// L: last segment of the message.
    pub last: bool,
    /// RDMAP opcode.
    pub opcode: Opcode,
    /// Tagged or untagged fields.
    pub placement: Placement,
}

impl DdpRepr {
    /// Header length of this segment.
    pub fn header_len(&self) -> usize {
        match self.placement {
            Placement::Tagged { .. } => TAGGED_HDR_LEN,
            Placement::Untagged { .. } => UNTAGGED_HDR_LEN,
        }
    }

    /// Parses the header at the start of a ULPDU; returns it and the payload. Versions must
    /// be 1, the opcode known and its tagged flag right (RFC 5040 §4.2 table).
    pub fn parse(b: &[u8]) -> Result<(DdpRepr, &[u8])> {
        check("DDP header", b, 2)?;
        let ddp = b[0];
        let rdmap = b[1];
        if ddp & 0x03 != DDP_VERSION {
            return Err(WireError::Invalid {
                field: field::DDP_VERSION,
                value: (ddp & 0x03) as u64,
            });
        }
        if rdmap >> 6 != RDMAP_VERSION {
            return Err(WireError::Invalid {
                field: field::RDMAP_VERSION,
                value: (rdmap >> 6) as u64,
            });
        }
        let tagged = ddp & 0x80 != 0;
        let opcode = Opcode::from_u8(rdmap & 0x0f)
            .filter(|o| o.is_tagged() == tagged)
            .ok_or(WireError::Invalid {
                field: field::OPCODE,
                value: (rdmap & 0x0f) as u64,
            })?;
        let last = ddp & 0x40 != 0;
        if tagged {
            check("DDP tagged header", b, TAGGED_HDR_LEN)?;
            Ok((
                DdpRepr {
                    last,
                    opcode,
                    placement: Placement::Tagged {
                        stag: be32(b, 2),
                        to: be64(b, 6),
                    },
                },
                &b[TAGGED_HDR_LEN..],
            ))
        } else {
            check("DDP untagged header", b, UNTAGGED_HDR_LEN)?;
            Ok((
                DdpRepr {
                    last,
                    opcode,
                    placement: Placement::Untagged {
                        inv_stag: be32(b, 2),
                        qn: be32(b, 6),
                        msn: be32(b, 10),
                        mo: be32(b, 14),
                    },
                },
                &b[UNTAGGED_HDR_LEN..],
            ))
        }
    }

    /// Writes the header; returns its length. Reserved bits are 0.
    pub fn emit(&self, b: &mut [u8]) -> Result<usize> {
        let n = self.header_len();
        room(b, n)?;
        let tagged = matches!(self.placement, Placement::Tagged { .. });
        if tagged != self.opcode.is_tagged() {
            return Err(WireError::Invalid {
                field: field::OPCODE,
                value: self.opcode as u64,
            });
        }
        b[0] = (if tagged { 0x80 } else { 0 }) | (if self.last { 0x40 } else { 0 }) | DDP_VERSION;
        b[1] = (RDMAP_VERSION << 6) | self.opcode as u8;
        match self.placement {
            Placement::Tagged { stag, to } => {
                put32(b, 2, stag);
                put64(b, 6, to);
            }
            Placement::Untagged {
                inv_stag,
                qn,
                msn,
                mo,
            } => {
                put32(b, 2, inv_stag);
                put32(b, 6, qn);
                put32(b, 10, msn);
                put32(b, 14, mo);
            }
        }
        Ok(n)
    }
}

/// The RDMA Read Request header (RFC 5040 §4.4), the payload of an untagged QN 1 message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ReadRequest {
    /// Data sink STag (the requester's buffer).
    pub sink_stag: u32,
    /// Data sink tagged offset.
    pub sink_to: u64,
    /// RDMA Read Message Size.
    pub size: u32,
    /// Data source STag (the responder's buffer).
    pub src_stag: u32,
    /// Data source tagged offset.
    pub src_to: u64,
}

impl ReadRequest {
    /// Parses the 28 bytes.
    pub fn parse(b: &[u8]) -> Result<ReadRequest> {
        check("RDMA Read Request", b, READ_REQ_LEN)?;
        Ok(ReadRequest {
            sink_stag: be32(b, 0),
            sink_to: be64(b, 4),
            size: be32(b, 12),
            src_stag: be32(b, 16),
            src_to: be64(b, 20),
        })
    }
    /// Writes the 28 bytes.
    pub fn emit(&self, b: &mut [u8]) -> Result<usize> {
        room(b, READ_REQ_LEN)?;
        put32(b, 0, self.sink_stag);
        put64(b, 4, self.sink_to);
        put32(b, 12, self.size);
        put32(b, 16, self.src_stag);
        put64(b, 20, self.src_to);
        Ok(READ_REQ_LEN)
    }
}

/// Terminate error layers, types and codes (RFC 5040 §4.8, RFC 5041 §7.2, RFC 5044 §8,
/// RFC 6581 §8).
pub mod term {
    /// Layer: RDMAP.
    pub const LAYER_RDMAP: u8 = 0;
    /// Layer: DDP.
    pub const LAYER_DDP: u8 = 1;
    /// Layer: LLP (MPA).
    pub const LAYER_LLP: u8 = 2;

    /// RDMAP error type: local catastrophic.
    pub const RDMAP_CATASTROPHIC: u8 = 0;
    /// RDMAP error type: remote protection error.
    pub const RDMAP_REMOTE_PROT: u8 = 1;
    /// RDMAP error type: remote operation error.
    pub const RDMAP_REMOTE_OP: u8 = 2;
    /// Remote protection: invalid STag.
    pub const PROT_INVALID_STAG: u8 = 0x00;
    /// Remote protection: base or bounds violation.
    pub const PROT_BOUNDS: u8 = 0x01;
    /// Remote protection: access rights violation.
    pub const PROT_ACCESS: u8 = 0x02;
    /// Remote protection: STag not associated with this RDMAP stream.
    pub const PROT_STAG_STREAM: u8 = 0x03;
    /// Remote protection: tagged offset wrap.
    pub const PROT_TO_WRAP: u8 = 0x04;
    /// Remote protection / operation: STag cannot be invalidated.
    pub const PROT_CANNOT_INVALIDATE: u8 = 0x09;
    /// Remote operation: invalid RDMAP version.
    pub const OP_INVALID_VERSION: u8 = 0x05;
    /// Remote operation: unexpected opcode.
    pub const OP_UNEXPECTED_OPCODE: u8 = 0x06;
    /// Remote operation: catastrophic error localized to this RDMAP stream.
    pub const OP_CATASTROPHIC_STREAM: u8 = 0x07;

    /// DDP error type: local catastrophic.
    pub const DDP_CATASTROPHIC: u8 = 0;
    /// DDP error type: tagged buffer error.
    pub const DDP_TAGGED: u8 = 1;
    /// DDP error type: untagged buffer error.
    pub const DDP_UNTAGGED: u8 = 2;
    /// Tagged: invalid STag.
    pub const TAGGED_INVALID_STAG: u8 = 0x00;
    /// Tagged: base or bounds violation.
    pub const TAGGED_BOUNDS: u8 = 0x01;
    /// Tagged: invalid DDP version.
    pub const TAGGED_VERSION: u8 = 0x04;
    /// Untagged: invalid QN.
    pub const UNTAGGED_INVALID_QN: u8 = 0x01;
    /// Untagged: invalid MSN, no buffer available.
    pub const UNTAGGED_NO_BUFFER: u8 = 0x02;
    /// Untagged: invalid MSN, MSN range not valid.
    pub const UNTAGGED_MSN_RANGE: u8 = 0x03;
    /// Untagged: invalid MO.
    pub const UNTAGGED_INVALID_MO: u8 = 0x04;
    /// Untagged: DDP message too long for the available buffer.
    pub const UNTAGGED_TOO_LONG: u8 = 0x05;
    /// Untagged: invalid DDP version.
    pub const UNTAGGED_VERSION: u8 = 0x06;

    /// LLP error type: MPA.
    pub const LLP_MPA: u8 = 0;
    /// MPA: TCP connection closed, terminated or lost (RFC 5044 §8).
    pub const MPA_TCP_CLOSED: u8 = 0x01;
    /// MPA: CRC error.
    pub const MPA_CRC: u8 = 0x02;
    /// MPA: marker and ULPDU length mismatch.
    pub const MPA_MARKER: u8 = 0x03;
    /// MPA: invalid Request/Reply frame.
    pub const MPA_INVALID_RR: u8 = 0x04;
    /// RFC 6581 §8: local catastrophic.
    pub const MPA_LOCAL_CATASTROPHIC: u8 = 0x05;
    /// RFC 6581 §8: insufficient IRD resources.
    pub const MPA_INSUFFICIENT_IRD: u8 = 0x06;
    /// RFC 6581 §8: no matching RTR option.
    pub const MPA_NO_MATCHING_RTR: u8 = 0x07;
}

/// A Terminate message (RFC 5040 §4.8): control word and the optional copies of the DDP
/// segment length and header (HdrCt D) and of the RDMAP header (HdrCt R).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TerminateRepr<'a> {
    /// Layer (4 bits).
    pub layer: u8,
    /// Error type (4 bits).
    pub etype: u8,
    /// Error code.
    pub code: u8,
    /// HdrCt M: the DDP segment was delivered to the ULP in part.
    pub m: bool,
    /// With D: the DDP segment length and the terminated DDP header (14 bytes when the
    /// error type is a DDP tagged buffer error, else 18).
    pub ddp: Option<(u16, &'a [u8])>,
    /// With R: the terminated RDMAP header (the 28-byte Read Request header).
    pub rdmap: Option<&'a [u8]>,
}

impl<'a> TerminateRepr<'a> {
    /// Length of the terminated DDP header copy for this error (as Wireshark and siw read
    /// it: tagged only for a DDP tagged buffer error).
    fn ddp_copy_len(layer: u8, etype: u8) -> usize {
        if layer == term::LAYER_DDP && etype == term::DDP_TAGGED {
            TAGGED_HDR_LEN
        } else {
            UNTAGGED_HDR_LEN
        }
    }

    /// A Terminate with no header copies.
    pub fn new(layer: u8, etype: u8, code: u8) -> TerminateRepr<'static> {
        TerminateRepr {
            layer,
            etype,
            code,
            m: false,
            ddp: None,
            rdmap: None,
        }
    }

    /// Parses a Terminate payload.
    pub fn parse(b: &'a [u8]) -> Result<TerminateRepr<'a>> {
        check("Terminate control", b, TERM_CTRL_LEN)?;
        let layer = b[0] >> 4;
        let etype = b[0] & 0x0f;
        let code = b[1];
        let hdrct = b[2];
        let mut at = TERM_CTRL_LEN;
        let ddp = if hdrct & 0x40 != 0 {
            let n = Self::ddp_copy_len(layer, etype);
            check("Terminate DDP header", b, at + 2 + n)?;
            let seg = u16::from_be_bytes([b[at], b[at + 1]]);
            let h = &b[at + 2..at + 2 + n];
            at += 2 + n;
            Some((seg, h))
        } else {
            None
        };
        let rdmap = if hdrct & 0x20 != 0 {
            check("Terminate RDMAP header", b, at + READ_REQ_LEN)?;
            Some(&b[at..at + READ_REQ_LEN])
        } else {
            None
        };
        Ok(TerminateRepr {
            layer,
            etype,
            code,
            m: hdrct & 0x80 != 0,
            ddp,
            rdmap,
        })
    }

    /// Bytes [`TerminateRepr::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        TERM_CTRL_LEN
            + self
                .ddp
                .map_or(0, |_| 2 + Self::ddp_copy_len(self.layer, self.etype))
            + self.rdmap.map_or(0, |_| READ_REQ_LEN)
    }

    /// Writes the Terminate payload.
    pub fn emit(&self, b: &mut [u8]) -> Result<usize> {
        if self.layer > 0x0f || self.etype > 0x0f {
            return Err(WireError::Invalid {
                field: "Terminate layer/etype",
                value: ((self.layer as u64) << 4) | self.etype as u64,
            });
        }
        let n = self.buffer_len();
        room(b, n)?;
        b[0] = (self.layer << 4) | self.etype;
        b[1] = self.code;
        b[2] = (if self.m { 0x80 } else { 0 })
            | (if self.ddp.is_some() { 0x40 } else { 0 })
            | (if self.rdmap.is_some() { 0x20 } else { 0 });
        b[3] = 0;
        let mut at = TERM_CTRL_LEN;
        if let Some((seg, h)) = self.ddp {
            let want = Self::ddp_copy_len(self.layer, self.etype);
            if h.len() != want {
                return Err(WireError::Invalid {
                    field: "Terminate DDP header copy length",
                    value: h.len() as u64,
                });
            }
            b[at..at + 2].copy_from_slice(&seg.to_be_bytes());
            b[at + 2..at + 2 + want].copy_from_slice(h);
            at += 2 + want;
        }
        if let Some(r) = self.rdmap {
            if r.len() != READ_REQ_LEN {
                return Err(WireError::Invalid {
                    field: "Terminate RDMAP header copy length",
                    value: r.len() as u64,
                });
            }
            b[at..at + READ_REQ_LEN].copy_from_slice(r);
        }
        Ok(n)
    }

    /// A short description ("LLP/MPA: insufficient IRD resources (2/0/0x06)").
    pub fn describe(&self) -> String {
        let what = match (self.layer, self.etype, self.code) {
            (term::LAYER_LLP, term::LLP_MPA, term::MPA_TCP_CLOSED) => "TCP connection lost",
            (term::LAYER_LLP, term::LLP_MPA, term::MPA_CRC) => "MPA CRC error",
            (term::LAYER_LLP, term::LLP_MPA, term::MPA_MARKER) => "MPA marker/length mismatch",
            (term::LAYER_LLP, term::LLP_MPA, term::MPA_INVALID_RR) => "invalid MPA request/reply",
            (term::LAYER_LLP, term::LLP_MPA, term::MPA_LOCAL_CATASTROPHIC) => {
                "MPA local catastrophic error"
            }
            (term::LAYER_LLP, term::LLP_MPA, term::MPA_INSUFFICIENT_IRD) => {
                "insufficient IRD resources"
            }
            (term::LAYER_LLP, term::LLP_MPA, term::MPA_NO_MATCHING_RTR) => "no matching RTR option",
            (term::LAYER_RDMAP, term::RDMAP_REMOTE_PROT, term::PROT_INVALID_STAG) => {
                "remote protection: invalid STag"
            }
            (term::LAYER_RDMAP, term::RDMAP_REMOTE_PROT, term::PROT_BOUNDS) => {
                "remote protection: base or bounds violation"
            }
            (term::LAYER_RDMAP, term::RDMAP_REMOTE_PROT, term::PROT_ACCESS) => {
                "remote protection: access rights violation"
            }
            (term::LAYER_RDMAP, term::RDMAP_REMOTE_PROT, term::PROT_STAG_STREAM) => {
                "remote protection: STag not associated with this stream"
            }
            (term::LAYER_RDMAP, _, term::PROT_CANNOT_INVALIDATE) => "STag cannot be invalidated",
            (term::LAYER_RDMAP, term::RDMAP_REMOTE_OP, term::OP_INVALID_VERSION) => {
                "invalid RDMAP version"
            }
            (term::LAYER_RDMAP, term::RDMAP_REMOTE_OP, term::OP_UNEXPECTED_OPCODE) => {
                "unexpected RDMAP opcode"
            }
            (term::LAYER_DDP, term::DDP_TAGGED, term::TAGGED_INVALID_STAG) => {
                "DDP tagged: invalid STag"
            }
            (term::LAYER_DDP, term::DDP_TAGGED, term::TAGGED_BOUNDS) => {
                "DDP tagged: base or bounds violation"
            }
            (term::LAYER_DDP, term::DDP_UNTAGGED, term::UNTAGGED_INVALID_QN) => {
                "DDP untagged: invalid QN"
            }
            (term::LAYER_DDP, term::DDP_UNTAGGED, term::UNTAGGED_NO_BUFFER) => {
                "DDP untagged: no buffer available"
            }
            (term::LAYER_DDP, term::DDP_UNTAGGED, term::UNTAGGED_MSN_RANGE) => {
                "DDP untagged: MSN range not valid"
            }
            (term::LAYER_DDP, term::DDP_UNTAGGED, term::UNTAGGED_INVALID_MO) => {
                "DDP untagged: invalid MO"
            }
            (term::LAYER_DDP, term::DDP_UNTAGGED, term::UNTAGGED_TOO_LONG) => {
                "DDP untagged: message too long for the receive buffer"
            }
            (_, _, _) if self.etype == 0 => "local catastrophic error",
            _ => "error",
        };
        format!("{what} ({}/{}/{:#04x})", self.layer, self.etype, self.code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_and_untagged_round_trip() {
        let t = DdpRepr {
            last: true,
            opcode: Opcode::Write,
            placement: Placement::Tagged {
                stag: 0xabcdef,
                to: 0x1000,
            },
        };
        let mut b = [0u8; 18];
        assert_eq!(t.emit(&mut b).unwrap(), 14);
        assert_eq!(&b[..2], &[0xc1, 0x40]);
        assert_eq!(DdpRepr::parse(&b[..14]).unwrap(), (t, &[][..]));
        let u = DdpRepr {
            last: false,
            opcode: Opcode::SendSe,
            placement: Placement::Untagged {
                inv_stag: 0,
                qn: 0,
                msn: 7,
                mo: 4096,
            },
        };
        assert_eq!(u.emit(&mut b).unwrap(), 18);
        assert_eq!(&b[..2], &[0x01, 0x45]);
        assert_eq!(DdpRepr::parse(&b).unwrap().0, u);
    }

    #[test]
    fn rejects_bad_versions_and_opcodes() {
        let bad = |b: &[u8], f: &str| match DdpRepr::parse(b) {
            Err(WireError::Invalid { field, .. }) => assert_eq!(field, f),
            other => panic!("{other:?}"),
        };
        let mut h = [0u8; 18];
        h[0] = 0x02; // DV 2
        h[1] = 0x43;
        bad(&h, field::DDP_VERSION);
        h[0] = 0x01;
        h[1] = 0x83; // RV 2
        bad(&h, field::RDMAP_VERSION);
        h[1] = 0x48; // opcode 8
        bad(&h, field::OPCODE);
        h[1] = 0x40; // Write, untagged
        bad(&h, field::OPCODE);
        h[1] = 0x43; // Send, untagged, but only 5 bytes
        assert!(matches!(
            DdpRepr::parse(&h[..5]),
            Err(WireError::Truncated { .. })
        ));
    }

    #[test]
    fn terminate_round_trip() {
        let t = TerminateRepr::new(term::LAYER_LLP, term::LLP_MPA, term::MPA_NO_MATCHING_RTR);
        let mut b = [0u8; 64];
        assert_eq!(t.emit(&mut b).unwrap(), 4);
        assert_eq!(&b[..4], &[0x20, 0x07, 0, 0]);
        assert_eq!(TerminateRepr::parse(&b[..4]).unwrap(), t);
        let hdr = [0x41u8; 18];
        let rr = [7u8; 28];
        let t2 = TerminateRepr {
            layer: term::LAYER_RDMAP,
            etype: term::RDMAP_REMOTE_PROT,
            code: term::PROT_INVALID_STAG,
            m: false,
            ddp: Some((46, &hdr)),
            rdmap: Some(&rr),
        };
        let n = t2.emit(&mut b).unwrap();
        assert_eq!(n, 4 + 2 + 18 + 28);
        assert_eq!(TerminateRepr::parse(&b[..n]).unwrap(), t2);
    }
}
