//! DDP over SCTP (RFC 5043): the user data of SCTP DATA chunks, and the DDP Stream Session
//! Control messages with the enhanced function codes of RFC 6581 §7.
//!
//! The Payload Protocol Identifier of a DATA chunk says what its user data is (RFC 5043;
//! IANA "SCTP Payload Protocol Identifiers"):
//!
//! | PPID | user data |
//! |---|---|
//! | 16, DDP Segment | one DDP segment: the RFC 5041 header and payload ([`super::ddp`]); no MPA framing, SCTP's own CRC32c covers it |
//! | 17, DDP Stream Session Control | a session control message (below) |
//!
//! DDP Stream Session Control message (RFC 5043 §5.3 as updated by RFC 6581 §7):
//! ```text
//!  0..2  Function Code (u16 BE)
//!  2..4  PD_Length (u16 BE, at most 512, RFC 6581 §7)
//!  4..   Private Data (PD_Length bytes); with Enhanced Initiate (0x5) and Enhanced
//!        Accept (0x6) it begins with the RFC 6581 §9 enhanced data word (IRD/ORD, A/B/C/D:
//!        [`super::mpa::EnhancedData`]), the ULP's private data after it
//! ```
//! (The codes 0x5-0x7, the 512-byte limit and the PPIDs are checked against RFC 6581 and
//! IANA; the two 16-bit fields are RFC 5043 §5.3 as we know it — its text was not at hand
//! to check, see docs/iwarp.md "SCTP".)
//!
//! Function codes: 0x1 DDP Stream Session Initiate, 0x2 Accept, 0x3 Reject, 0x4 Terminate
//! (RFC 5043); 0x5 Enhanced DDP Stream Session Initiate, 0x6 Enhanced Accept, 0x7 Enhanced
//! Reject (RFC 6581 §7, §11). A Terminate carries no private data (RFC 6581 §7), and there
//! is no enhanced Terminate: a session set up with the enhanced codes ends with 0x4.
//!
//! Since the PPID separates session control from DDP segments, either side may send the
//! first DDP message (RFC 6581 §7): SCTP needs no RTR, and the peer-to-peer bits of the
//! enhanced data only say which RTR a ULP could use. No transport here: see
//! docs/iwarp.md "SCTP" for why.

use super::mpa::{EnhancedData, ENHANCED_LEN, MAX_PRIVATE_DATA};
use super::{be16, check, put16, room, Result, WireError};
use crate::negotiate::{self, ReadParams, ResponderDecision};
use crate::wire::mpa::RtrSet;

/// PPID of a DATA chunk carrying a DDP segment.
pub const PPID_DDP_SEGMENT: u32 = 16;
/// PPID of a DATA chunk carrying a DDP Stream Session Control message.
pub const PPID_DDP_STREAM_SESSION_CONTROL: u32 = 17;
/// Function Code and PD_Length.
pub const HEADER_LEN: usize = 4;

/// The DDP Stream Session Control function codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum FunctionCode {
    /// DDP Stream Session Initiate (RFC 5043).
    Initiate = 0x1,
    /// DDP Stream Session Accept (RFC 5043).
    Accept = 0x2,
    /// DDP Stream Session Reject (RFC 5043).
    Reject = 0x3,
    /// DDP Stream Session Terminate (RFC 5043): ends any session, enhanced or not.
    Terminate = 0x4,
    /// Enhanced DDP Stream Session Initiate (RFC 6581 §7).
    EnhancedInitiate = 0x5,
    /// Enhanced DDP Stream Session Accept (RFC 6581 §7).
    EnhancedAccept = 0x6,
    /// Enhanced DDP Stream Session Reject (RFC 6581 §7).
    EnhancedReject = 0x7,
}

impl FunctionCode {
    /// From the wire value; anything else is not a function code this stack knows.
    pub fn from_u16(v: u16) -> Option<FunctionCode> {
        Some(match v {
            0x1 => FunctionCode::Initiate,
            0x2 => FunctionCode::Accept,
            0x3 => FunctionCode::Reject,
            0x4 => FunctionCode::Terminate,
            0x5 => FunctionCode::EnhancedInitiate,
            0x6 => FunctionCode::EnhancedAccept,
            0x7 => FunctionCode::EnhancedReject,
            _ => return None,
        })
    }

    /// One of RFC 6581's codes.
    pub fn is_enhanced(self) -> bool {
        matches!(
            self,
            FunctionCode::EnhancedInitiate
                | FunctionCode::EnhancedAccept
                | FunctionCode::EnhancedReject
        )
    }

    /// The private data begins with the enhanced data word (RFC 6581 §7: the ULP's
    /// private data "MUST follow the enhanced RDMA connection establishment data" in
    /// Enhanced Initiate and Enhanced Accept).
    pub fn carries_enhanced_data(self) -> bool {
        matches!(
            self,
            FunctionCode::EnhancedInitiate | FunctionCode::EnhancedAccept
        )
    }
}

/// A typed view of a DDP Stream Session Control message, length-checked once.
#[derive(Clone, Copy, Debug)]
pub struct SessionControl<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> SessionControl<T> {
    /// Checks that `buf` holds the header and the private data it announces, at most 512
    /// bytes (RFC 6581 §7: "Private Data length MUST NOT exceed 512 bytes in any message").
    /// Bytes after the private data are not part of the message (an SCTP message has its
    /// own length; [`SessionControl::total_len`] says how much was used).
    pub fn new_checked(buf: T) -> Result<SessionControl<T>> {
        let b = buf.as_ref();
        check("DDP session control", b, HEADER_LEN)?;
        let pd = be16(b, 2) as usize;
        if pd > MAX_PRIVATE_DATA {
            return Err(WireError::Invalid {
                field: "session control PD_Length",
                value: pd as u64,
            });
        }
        check("DDP session control private data", b, HEADER_LEN + pd)?;
        Ok(SessionControl { buf })
    }
    /// Function Code as sent.
    pub fn function_code(&self) -> u16 {
        be16(self.buf.as_ref(), 0)
    }
    /// PD_Length.
    pub fn pd_length(&self) -> u16 {
        be16(self.buf.as_ref(), 2)
    }
    /// The private data (enhanced data included).
    pub fn private_data(&self) -> &[u8] {
        &self.buf.as_ref()[HEADER_LEN..HEADER_LEN + self.pd_length() as usize]
    }
    /// Bytes the message occupies.
    pub fn total_len(&self) -> usize {
        HEADER_LEN + self.pd_length() as usize
    }
}

/// A DDP Stream Session Control message as values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionControlRepr<'a> {
    /// What the message does.
    pub function: FunctionCode,
    /// The enhanced data: present exactly for Enhanced Initiate and Enhanced Accept.
    pub enhanced: Option<EnhancedData>,
    /// The ULP's private data (after the enhanced data), to be reported to the ULP
    /// (RFC 6581 §7: "any supplied Private Data MUST be available for the ULP").
    pub ulp_data: &'a [u8],
}

impl<'a> SessionControlRepr<'a> {
    /// Parses a message. Receiver rules: an unknown function code, private data in a
    /// Terminate (RFC 6581 §7 "MUST NOT be included in the DDP Stream Session TERM
    /// message"), or an Enhanced Initiate/Accept whose private data cannot hold the
    /// enhanced data are invalid.
    pub fn parse(m: &SessionControl<&'a [u8]>) -> Result<SessionControlRepr<'a>> {
        let code = m.function_code();
        let function = FunctionCode::from_u16(code).ok_or(WireError::Invalid {
            field: "session control Function Code",
            value: code as u64,
        })?;
        let pd: &'a [u8] = {
            let b: &'a [u8] = m.buf;
            &b[HEADER_LEN..HEADER_LEN + m.pd_length() as usize]
        };
        if function == FunctionCode::Terminate && !pd.is_empty() {
            return Err(WireError::Invalid {
                field: "session control PD_Length (Terminate)",
                value: pd.len() as u64,
            });
        }
        let (enhanced, ulp_data) = if function.carries_enhanced_data() {
            if pd.len() < ENHANCED_LEN {
                return Err(WireError::Invalid {
                    field: "session control PD_Length (enhanced data missing)",
                    value: pd.len() as u64,
                });
            }
            (Some(EnhancedData::parse(pd)?), &pd[ENHANCED_LEN..])
        } else {
            (None, pd)
        };
        Ok(SessionControlRepr {
            function,
            enhanced,
            ulp_data,
        })
    }

    /// Parses a message from bytes.
    pub fn parse_bytes(b: &'a [u8]) -> Result<SessionControlRepr<'a>> {
        SessionControlRepr::parse(&SessionControl::new_checked(b)?)
    }

    fn pd_len(&self) -> usize {
        self.ulp_data.len() + self.enhanced.map_or(0, |_| ENHANCED_LEN)
    }

    /// Bytes [`SessionControlRepr::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.pd_len()
    }

    /// Writes the message; returns its length. Refused: private data above 512 bytes,
    /// private data in a Terminate, enhanced data missing from Enhanced Initiate/Accept or
    /// present in any other message.
    pub fn emit(&self, b: &mut [u8]) -> Result<usize> {
        let pd = self.pd_len();
        if pd > MAX_PRIVATE_DATA {
            return Err(WireError::Invalid {
                field: "session control PD_Length",
                value: pd as u64,
            });
        }
        if self.function == FunctionCode::Terminate && pd != 0 {
            return Err(WireError::Invalid {
                field: "session control PD_Length (Terminate)",
                value: pd as u64,
            });
        }
        if self.function.carries_enhanced_data() != self.enhanced.is_some() {
            return Err(WireError::Invalid {
                field: "session control enhanced data",
                value: self.function as u64,
            });
        }
        let n = HEADER_LEN + pd;
        room(b, n)?;
        // Validate the enhanced word before writing anything.
        let mut at = HEADER_LEN;
        if let Some(e) = &self.enhanced {
            e.emit(&mut b[at..])?;
            at += ENHANCED_LEN;
        }
        put16(b, 0, self.function as u16);
        put16(b, 2, pd as u16);
        b[at..at + self.ulp_data.len()].copy_from_slice(self.ulp_data);
        Ok(n)
    }

    /// The DDP Stream Session Terminate: no private data, also for enhanced sessions
    /// (RFC 6581 §7: "MUST use the DDP stream session termination function code").
    pub fn terminate() -> SessionControlRepr<'static> {
        SessionControlRepr {
            function: FunctionCode::Terminate,
            enhanced: None,
            ulp_data: &[],
        }
    }
}

/// The user data of one SCTP DATA chunk of a DDP association, by its PPID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DdpSctpPayload<'a> {
    /// PPID 16: a DDP segment (parse it with [`super::ddp`]).
    Segment(&'a [u8]),
    /// PPID 17: a session control message.
    Control(SessionControlRepr<'a>),
}

impl<'a> DdpSctpPayload<'a> {
    /// Classifies `data` by `ppid`; another PPID, or a session control message that does not
    /// parse, is an error (the association is not carrying DDP as RFC 5043 defines it).
    pub fn parse(ppid: u32, data: &'a [u8]) -> Result<DdpSctpPayload<'a>> {
        match ppid {
            PPID_DDP_SEGMENT => Ok(DdpSctpPayload::Segment(data)),
            PPID_DDP_STREAM_SESSION_CONTROL => {
                let m = SessionControl::new_checked(data)?;
                if m.total_len() != data.len() {
                    // One SCTP message is one session control message.
                    return Err(WireError::Invalid {
                        field: "session control message length",
                        value: data.len() as u64,
                    });
                }
                Ok(DdpSctpPayload::Control(SessionControlRepr::parse(&m)?))
            }
            _ => Err(WireError::Invalid {
                field: "SCTP PPID",
                value: ppid as u64,
            }),
        }
    }
}

/// The passive side's answer to an Initiate (no I/O): a plain Initiate is accepted with a
/// plain Accept; an Enhanced Initiate goes through the RFC 6581 §9 negotiation
/// ([`negotiate::responder`]) and is answered with an Enhanced Accept carrying the
/// negotiated enhanced data, or with an Enhanced Reject — never a plain Reject, since the
/// configuration would have been accepted without the enhancement (RFC 6581 §7: "The
/// Enhanced Reject function code MUST be used ..."). `ulp_data` is the ULP's private data
/// for the answer. Returns the answer and, when accepted, the local IRD/ORD.
pub fn answer_initiate<'u>(
    initiate: &SessionControlRepr<'_>,
    local: &ReadParams,
    supported: RtrSet,
    ulp_data: &'u [u8],
) -> Result<(SessionControlRepr<'u>, Option<(u16, u16)>)> {
    match (initiate.function, initiate.enhanced) {
        (FunctionCode::Initiate, _) => Ok((
            SessionControlRepr {
                function: FunctionCode::Accept,
                enhanced: None,
                ulp_data,
            },
            Some((local.ird, local.ord)),
        )),
        (FunctionCode::EnhancedInitiate, Some(req)) => {
            match negotiate::responder(&req, local, supported) {
                ResponderDecision::Accept {
                    reply, ird, ord, ..
                } => Ok((
                    SessionControlRepr {
                        function: FunctionCode::EnhancedAccept,
                        enhanced: Some(reply),
                        ulp_data,
                    },
                    Some((ird, ord)),
                )),
                ResponderDecision::Reject { .. } => Ok((
                    SessionControlRepr {
                        function: FunctionCode::EnhancedReject,
                        enhanced: None,
                        ulp_data,
                    },
                    None,
                )),
            }
        }
        (f, _) => Err(WireError::Invalid {
            field: "session control: not an Initiate",
            value: f as u64,
        }),
    }
}

/// Whether `reply` is a legal answer to `initiate`: an Initiate is answered by Accept or
/// Reject, an Enhanced Initiate by Enhanced Accept or Enhanced Reject (RFC 6581 §7's legal
/// sequences, "as with" RFC 5043's with the extended codes); either may instead be ended
/// by a Terminate (a rejection without the ULP).
pub fn legal_answer(initiate: FunctionCode, reply: FunctionCode) -> bool {
    matches!(
        (initiate, reply),
        (
            FunctionCode::Initiate,
            FunctionCode::Accept | FunctionCode::Reject
        ) | (
            FunctionCode::EnhancedInitiate,
            FunctionCode::EnhancedAccept | FunctionCode::EnhancedReject
        ) | (
            FunctionCode::Initiate | FunctionCode::EnhancedInitiate,
            FunctionCode::Terminate
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enh(ird: u16, ord: u16) -> EnhancedData {
        EnhancedData {
            p2p: false,
            rtr: RtrSet::NONE,
            ird,
            ord,
        }
    }

    fn emit(r: &SessionControlRepr<'_>) -> Vec<u8> {
        let mut b = vec![0u8; r.buffer_len()];
        let n = r.emit(&mut b).unwrap();
        assert_eq!(n, b.len());
        b
    }

    #[test]
    fn tc_mpa_24_sctp_function_codes_5_6_7() {
        // RFC 6581 §7 / §11: Enhanced Initiate 0x0005, Accept 0x0006, Reject 0x0007; RFC
        // 5043's 0x1..0x4 stay; PPIDs 16 (segment) and 17 (session control).
        for (v, f, e) in [
            (1u16, FunctionCode::Initiate, false),
            (2, FunctionCode::Accept, false),
            (3, FunctionCode::Reject, false),
            (4, FunctionCode::Terminate, false),
            (5, FunctionCode::EnhancedInitiate, true),
            (6, FunctionCode::EnhancedAccept, true),
            (7, FunctionCode::EnhancedReject, true),
        ] {
            assert_eq!(FunctionCode::from_u16(v), Some(f));
            assert_eq!(f as u16, v);
            assert_eq!(f.is_enhanced(), e);
        }
        for v in [0u16, 8, 0x100, 0xffff] {
            assert_eq!(FunctionCode::from_u16(v), None);
            let m = [(v >> 8) as u8, v as u8, 0, 0];
            assert!(SessionControlRepr::parse_bytes(&m).is_err(), "code {v:#x}");
        }
        assert_eq!(
            (PPID_DDP_SEGMENT, PPID_DDP_STREAM_SESSION_CONTROL),
            (16, 17)
        );
    }

    #[test]
    fn sctp_7_enhanced_initiate_layout() {
        // Enhanced Initiate, IRD 4 / ORD 200, P2P with Write RTR, 3 bytes of ULP data.
        let r = SessionControlRepr {
            function: FunctionCode::EnhancedInitiate,
            enhanced: Some(EnhancedData {
                p2p: true,
                rtr: RtrSet {
                    send: false,
                    write: true,
                    read: false,
                },
                ird: 4,
                ord: 200,
            }),
            ulp_data: b"ulp",
        };
        let b = emit(&r);
        // §9: network byte order, 14-bit IRD/ORD with A (IRD word) and C (ORD word).
        assert_eq!(b, [0, 5, 0, 7, 0x80, 0x04, 0x80, 0xc8, b'u', b'l', b'p']);
        assert_eq!(SessionControlRepr::parse_bytes(&b).unwrap(), r);
    }

    #[test]
    fn sctp_7_ulp_data_follows_enhanced_data_in_initiate_and_accept() {
        for f in [FunctionCode::EnhancedInitiate, FunctionCode::EnhancedAccept] {
            let r = SessionControlRepr {
                function: f,
                enhanced: Some(enh(16, 16)),
                ulp_data: b"private",
            };
            let b = emit(&r);
            assert_eq!(&b[8..], b"private", "{f:?}: ULP data after the 4-byte word");
            let p = SessionControlRepr::parse_bytes(&b).unwrap();
            assert_eq!(p.ulp_data, b"private", "{f:?}: reported to the ULP");
            assert_eq!(p.enhanced, Some(enh(16, 16)));
            // Without room for the enhanced data, the message is malformed ...
            for pd in 0..ENHANCED_LEN {
                let mut m = vec![0, f as u8, 0, pd as u8];
                m.resize(HEADER_LEN + pd, 0);
                assert!(
                    SessionControlRepr::parse_bytes(&m).is_err(),
                    "{f:?} PD {pd}"
                );
            }
            // ... and we never send one.
            let bad = SessionControlRepr {
                enhanced: None,
                ..r
            };
            assert!(bad.emit(&mut [0u8; 64]).is_err());
        }
        // The other codes carry no enhanced data (their private data is the ULP's).
        let rej = SessionControlRepr {
            function: FunctionCode::EnhancedReject,
            enhanced: None,
            ulp_data: b"no",
        };
        assert_eq!(emit(&rej), [0, 7, 0, 2, b'n', b'o']);
        assert!(SessionControlRepr {
            enhanced: Some(enh(1, 1)),
            ..rej
        }
        .emit(&mut [0u8; 64])
        .is_err());
    }

    #[test]
    fn sctp_7_private_data_at_most_512_bytes() {
        let pd = [0xa5u8; 512];
        // 508 bytes of ULP data + the enhanced word = 512: allowed.
        let ok = SessionControlRepr {
            function: FunctionCode::EnhancedAccept,
            enhanced: Some(enh(1, 1)),
            ulp_data: &pd[..508],
        };
        let b = emit(&ok);
        assert_eq!(b.len(), 4 + 512);
        assert_eq!(SessionControlRepr::parse_bytes(&b).unwrap(), ok);
        // 509 + 4 = 513: refused on emit ...
        let big = SessionControlRepr {
            ulp_data: &pd[..509],
            ..ok
        };
        assert!(big.emit(&mut [0u8; 600]).is_err());
        let plain = SessionControlRepr {
            function: FunctionCode::Initiate,
            enhanced: None,
            ulp_data: &[0u8; 513],
        };
        assert!(plain.emit(&mut [0u8; 600]).is_err());
        // ... and on parse, whatever the code.
        let mut m = vec![0u8; 4 + 513];
        m[1] = 1;
        m[2..4].copy_from_slice(&513u16.to_be_bytes());
        assert!(SessionControl::new_checked(&m[..]).is_err());
    }

    #[test]
    fn sctp_7_no_private_data_in_terminate() {
        let t = SessionControlRepr::terminate();
        assert_eq!(emit(&t), [0, 4, 0, 0]);
        assert_eq!(SessionControlRepr::parse_bytes(&[0, 4, 0, 0]).unwrap(), t);
        // A Terminate with private data is refused both ways.
        assert!(SessionControlRepr::parse_bytes(&[0, 4, 0, 1, 0xff]).is_err());
        let bad = SessionControlRepr {
            ulp_data: b"x",
            ..t
        };
        assert!(bad.emit(&mut [0u8; 8]).is_err());
    }

    #[test]
    fn sctp_7_enhanced_sessions_end_with_terminate_code() {
        // There is no enhanced Terminate: 0x4 ends enhanced and plain sessions alike, and
        // it is a legal end of an Initiate of either kind.
        assert_eq!(
            SessionControlRepr::terminate().function as u16,
            FunctionCode::Terminate as u16
        );
        assert!(!FunctionCode::Terminate.is_enhanced());
        assert!(legal_answer(
            FunctionCode::EnhancedInitiate,
            FunctionCode::Terminate
        ));
        assert!(legal_answer(
            FunctionCode::Initiate,
            FunctionCode::Terminate
        ));
    }

    #[test]
    fn sctp_7_enhanced_reject_for_enhanced_initiates() {
        // The responder needs an ORD of 8 but the initiator offers IRD 2: Enhanced Reject
        // (0x7), never the plain Reject, since a plain Initiate would have been accepted.
        let local = ReadParams {
            ird: 16,
            ord: 16,
            max_ird: 128,
            required_ord: 8,
        };
        let init = SessionControlRepr {
            function: FunctionCode::EnhancedInitiate,
            enhanced: Some(enh(2, 4)),
            ulp_data: b"hello",
        };
        let (ans, rd) = answer_initiate(&init, &local, RtrSet::ALL, b"busy").unwrap();
        assert_eq!(ans.function, FunctionCode::EnhancedReject);
        assert_eq!((ans.ulp_data, rd), (&b"busy"[..], None));
        assert!(legal_answer(init.function, ans.function));
        let plain = SessionControlRepr {
            function: FunctionCode::Initiate,
            enhanced: None,
            ulp_data: b"hello",
        };
        let (ans, rd) = answer_initiate(&plain, &local, RtrSet::ALL, b"").unwrap();
        assert_eq!(ans.function, FunctionCode::Accept);
        assert_eq!(rd, Some((16, 16)));
        // Mixed flavours are not legal answers.
        assert!(!legal_answer(
            FunctionCode::EnhancedInitiate,
            FunctionCode::Reject
        ));
        assert!(!legal_answer(
            FunctionCode::EnhancedInitiate,
            FunctionCode::Accept
        ));
        assert!(!legal_answer(
            FunctionCode::Initiate,
            FunctionCode::EnhancedAccept
        ));
        assert!(!legal_answer(
            FunctionCode::Initiate,
            FunctionCode::EnhancedReject
        ));
        assert!(!legal_answer(FunctionCode::Accept, FunctionCode::Accept));
        // Only Initiates can be answered.
        assert!(answer_initiate(&ans, &local, RtrSet::ALL, b"").is_err());
    }

    #[test]
    fn sctp_9_enhanced_accept_carries_the_negotiation() {
        // Initiator IRD 4 / ORD 200; the responder (IRD up to 128) answers IRD 128 and an
        // ORD of at most the initiator's IRD (RFC 6581 §9.1), as over MPA.
        let local = ReadParams {
            ird: 16,
            ord: 16,
            max_ird: 128,
            required_ord: 0,
        };
        let init = SessionControlRepr {
            function: FunctionCode::EnhancedInitiate,
            enhanced: Some(enh(4, 200)),
            ulp_data: &[],
        };
        let (ans, rd) = answer_initiate(&init, &local, RtrSet::ALL, b"ok").unwrap();
        assert_eq!(ans.function, FunctionCode::EnhancedAccept);
        assert_eq!(ans.enhanced, Some(enh(128, 4)));
        assert_eq!(rd, Some((128, 4)));
        let b = emit(&ans);
        assert_eq!(b, [0, 6, 0, 6, 0, 128, 0, 4, b'o', b'k']);
    }

    #[test]
    fn ppid_classifies_segments_and_control() {
        let seg = [0x41u8, 0x43, 0, 0, 0, 0];
        assert_eq!(
            DdpSctpPayload::parse(PPID_DDP_SEGMENT, &seg).unwrap(),
            DdpSctpPayload::Segment(&seg[..])
        );
        assert_eq!(
            DdpSctpPayload::parse(PPID_DDP_STREAM_SESSION_CONTROL, &[0, 4, 0, 0]).unwrap(),
            DdpSctpPayload::Control(SessionControlRepr::terminate())
        );
        // Trailing bytes after a control message, and other PPIDs, are errors.
        assert!(DdpSctpPayload::parse(PPID_DDP_STREAM_SESSION_CONTROL, &[0, 4, 0, 0, 9]).is_err());
        assert!(DdpSctpPayload::parse(0, &seg).is_err());
        assert!(DdpSctpPayload::parse(18, &seg).is_err());
        // Truncated messages.
        for n in 0..4 {
            assert!(SessionControl::new_checked(&[0u8, 1, 0, 0][..n]).is_err());
        }
        assert!(SessionControl::new_checked(&[0u8, 1, 0, 2, 9][..]).is_err());
    }
}
