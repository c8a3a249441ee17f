//! Link management messages: CONFIRM LINK, ADD LINK (+ v2 extension), ADD LINK CONTINUATION,
//! DELETE LINK, REQUEST ADD LINK (v2) and TEST LINK (RFC 7609 A.3.1–A.3.4, A.3.8).

use super::{
    write_header, AddLinkRtoken, Dialect, LlcFormat, LlcType, RtokenList, FLAG_RESP, LLC_LEN,
};
use crate::common::{array, get_u32, put_u32, Gid, Mac, QpMtu, U24};
use crate::error::{Error, Result};
use arrayvec::ArrayVec;
use core::fmt;

fn fixed_len(ty: LlcType, m: &[u8]) -> Result<()> {
    if m.len() != LLC_LEN {
        return Err(Error::BadLength {
            msg: ty.name(),
            expected: LLC_LEN,
            got: m.len(),
        });
    }
    Ok(())
}

/// CONFIRM LINK flag (Linux): the RMBEs have no eye catcher (INTEROP I-01).
pub const FLAG_NO_RMBE_EYEC: u8 = 0x03;

/// CONFIRM LINK (RFC 7609 A.3.1; Linux `smc_llc_msg_confirm_link`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConfirmLink {
    /// SMC-Rv2 message (0x21).
    pub v2: bool,
    /// Response flag.
    pub response: bool,
    /// Linux flag 0x03: no RMBE eye catcher (reserved bits in the RFC dialect).
    pub no_rmbe_eyecatcher: bool,
    /// Sender's RoCE MAC.
    pub mac: Mac,
    /// Sender's GID.
    pub gid: Gid,
    /// Sender's QP number.
    pub qpn: U24,
    /// Link number (assigned by the server).
    pub link_num: u8,
    /// Sender's link user ID (opaque).
    pub link_uid: u32,
    /// Max links (server: 2..=8).
    pub max_links: u8,
    /// Linux v2.1: max connections (reserved byte 35 in the RFC dialect).
    pub max_conns: u8,
}

impl ConfirmLink {
    fn linux(v2: bool, fmt: LlcFormat) -> bool {
        v2 || fmt.dialect == Dialect::Linux
    }
    pub(crate) fn parse(m: &[u8], v2: bool, fmt: LlcFormat) -> Result<ConfirmLink> {
        fixed_len(LlcType::ConfirmLink, m)?;
        // The server assigns link numbers from 1 (AMB-34: 0 is invalid; Linux skips it).
        if m[29] == 0 {
            return Err(Error::CountOutOfRange {
                field: "CONFIRM LINK link_num",
                value: 0,
                min: 1,
                max: 255,
            });
        }
        let linux = Self::linux(v2, fmt);
        Ok(ConfirmLink {
            v2,
            response: m[3] & FLAG_RESP != 0,
            no_rmbe_eyecatcher: linux && m[3] & FLAG_NO_RMBE_EYEC == FLAG_NO_RMBE_EYEC,
            mac: Mac(array(m, 4)),
            gid: Gid(array(m, 10)),
            qpn: U24::read(m, 26),
            link_num: m[29],
            link_uid: get_u32(m, 30),
            max_links: m[34],
            max_conns: if linux { m[35] } else { 0 },
        })
    }
    pub(crate) fn emit(&self, b: &mut [u8], fmt: LlcFormat) -> Result<()> {
        let linux = Self::linux(self.v2, fmt);
        if self.link_num == 0 {
            return Err(Error::CountOutOfRange {
                field: "CONFIRM LINK link_num",
                value: 0,
                min: 1,
                max: 255,
            });
        }
        if !linux && (self.no_rmbe_eyecatcher || self.max_conns != 0) {
            return Err(Error::Inconsistent {
                field: "CONFIRM LINK flags",
                why: "no-eye-catcher flag and max_conns exist only in the Linux dialect",
            });
        }
        let mut flags = if self.response { FLAG_RESP } else { 0 };
        if self.no_rmbe_eyecatcher {
            flags |= FLAG_NO_RMBE_EYEC;
        }
        write_header(b, LlcType::ConfirmLink, self.v2, flags, fmt);
        b[4..10].copy_from_slice(&self.mac.0);
        b[10..26].copy_from_slice(&self.gid.0);
        self.qpn.write(b, 26);
        b[29] = self.link_num;
        put_u32(b, 30, self.link_uid);
        b[34] = self.max_links;
        b[35] = self.max_conns;
        Ok(())
    }
}

/// ADD LINK flag: the request is rejected (Z, only on a response).
pub const FLAG_ADD_LINK_REJ: u8 = 0x40;
/// ADD LINK reject reason: no alternate path available.
pub const ADD_LINK_RSN_NO_ALT_PATH: u8 = 1;
/// ADD LINK reject reason: invalid MTU value specified.
pub const ADD_LINK_RSN_INVALID_MTU: u8 = 2;

/// The SMC-Rv2 ADD LINK extension (Linux `smc_llc_msg_add_link_v2_ext`), bytes 44.. of an
/// ADD LINK v2 request or accepting response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddLinkV2Ext<'a> {
    /// The peer is reachable without a gateway.
    pub v2_direct: bool,
    /// GID of the new link (the target the client should use).
    pub client_target_gid: Gid,
    /// Every RMB's RToken on the new link (`num_rkeys` ≤ 255 entries).
    pub rtokens: RtokenList<'a>,
}

/// ADD LINK (RFC 7609 A.3.2; Linux `smc_llc_msg_add_link` + v2 extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddLink<'a> {
    /// SMC-Rv2 message (0x22); always the Linux layout.
    pub v2: bool,
    /// Response flag.
    pub response: bool,
    /// Z flag: the request is rejected.
    pub reject: bool,
    /// Reject reason (v1 only; byte 2 low nibble). In v2 that byte holds `length_v2`
    /// (linux-smc.md H2), so it must be 0.
    pub reject_reason: u8,
    /// Sender's RoCE MAC for the new link.
    pub mac: Mac,
    /// Sender's GID for the new link.
    pub gid: Gid,
    /// Sender's QP number for the new link.
    pub qpn: U24,
    /// Link number of the new link.
    pub link_num: u8,
    /// QP MTU code as sent (4 bits); see [`Self::mtu`]. A client "FYI" request may send 0.
    pub qp_mtu: u8,
    /// Initial PSN.
    pub psn: U24,
    /// v2 extension (v2 only; absent in a 44-byte v2 reject).
    pub ext: Option<AddLinkV2Ext<'a>>,
}

/// Offsets (mac, gid, qpn, link_num, mtu, psn) per layout.
struct AddLinkOffsets {
    gid: usize,
    qpn: usize,
    link: usize,
    mtu: usize,
    psn: usize,
}

const ADD_LINK_RFC: AddLinkOffsets = AddLinkOffsets {
    gid: 10,
    qpn: 26,
    link: 29,
    mtu: 30,
    psn: 31,
};
const ADD_LINK_LINUX: AddLinkOffsets = AddLinkOffsets {
    gid: 12,
    qpn: 28,
    link: 31,
    mtu: 32,
    psn: 33,
};
/// Fixed part of the ADD LINK v2 extension.
const ADD_LINK_EXT_LEN: usize = 28;

impl<'a> AddLink<'a> {
    /// The QP MTU as an enumeration (reserved code → error; reply with reason 2).
    pub fn mtu(&self) -> Result<QpMtu> {
        QpMtu::from_code(self.qp_mtu)
    }
    fn offsets(v2: bool, fmt: LlcFormat) -> &'static AddLinkOffsets {
        if v2 || fmt.dialect == Dialect::Linux {
            &ADD_LINK_LINUX
        } else {
            &ADD_LINK_RFC
        }
    }
    pub(crate) fn parse(m: &'a [u8], v2: bool, fmt: LlcFormat) -> Result<AddLink<'a>> {
        let o = Self::offsets(v2, fmt);
        let ext = if v2 && m.len() > LLC_LEN {
            let base = LLC_LEN + ADD_LINK_EXT_LEN;
            if m.len() < base {
                return Err(Error::BadLength {
                    msg: "ADD LINK v2",
                    expected: base,
                    got: m.len(),
                });
            }
            let n = usize::from(fmt.v2_byte_order.get_u16(m, LLC_LEN + 26));
            if n > 255 {
                return Err(Error::CountOutOfRange {
                    field: "num_rkeys",
                    value: n,
                    min: 0,
                    max: 255,
                });
            }
            let end = base + AddLinkRtoken::LEN * n;
            if m.len() != end {
                return Err(Error::BadLength {
                    msg: "ADD LINK v2",
                    expected: end,
                    got: m.len(),
                });
            }
            Some(AddLinkV2Ext {
                v2_direct: m[LLC_LEN] & 0x80 != 0,
                client_target_gid: Gid(array(m, LLC_LEN + 2)),
                rtokens: RtokenList::Wire(&m[base..end]),
            })
        } else {
            fixed_len(LlcType::AddLink, m)?;
            None
        };
        Ok(AddLink {
            v2,
            response: m[3] & FLAG_RESP != 0,
            reject: m[3] & FLAG_ADD_LINK_REJ != 0,
            reject_reason: if v2 { 0 } else { m[2] & 0x0F },
            mac: Mac(array(m, 4)),
            gid: Gid(array(m, o.gid)),
            qpn: U24::read(m, o.qpn),
            link_num: m[o.link],
            qp_mtu: m[o.mtu] & 0x0F,
            psn: U24::read(m, o.psn),
            ext,
        })
    }
    /// Total length on the wire.
    pub fn buffer_len(&self) -> usize {
        match &self.ext {
            None => LLC_LEN,
            Some(e) => LLC_LEN + ADD_LINK_EXT_LEN + AddLinkRtoken::LEN * e.rtokens.len(),
        }
    }
    pub(crate) fn emit(&self, b: &mut [u8], fmt: LlcFormat) -> Result<()> {
        if let Some(e) = &self.ext {
            if !self.v2 || e.rtokens.len() > 255 {
                return Err(Error::Inconsistent {
                    field: "ADD LINK v2 extension",
                    why: "only v2 messages have it, with at most 255 rtokens",
                });
            }
        }
        if self.qp_mtu > 15 || self.reject_reason > 15 || (self.v2 && self.reject_reason != 0) {
            return Err(Error::Inconsistent {
                field: "ADD LINK",
                why: "qp_mtu and reject_reason are 4-bit; v2 has no reject reason",
            });
        }
        let o = Self::offsets(self.v2, fmt);
        let mut flags = if self.response { FLAG_RESP } else { 0 };
        if self.reject {
            flags |= FLAG_ADD_LINK_REJ;
        }
        write_header(b, LlcType::AddLink, self.v2, flags, fmt);
        if !self.v2 {
            b[2] = self.reject_reason;
        }
        b[4..10].copy_from_slice(&self.mac.0);
        b[o.gid..o.gid + 16].copy_from_slice(&self.gid.0);
        self.qpn.write(b, o.qpn);
        b[o.link] = self.link_num;
        b[o.mtu] = self.qp_mtu;
        self.psn.write(b, o.psn);
        if let Some(e) = &self.ext {
            b[LLC_LEN] = if e.v2_direct { 0x80 } else { 0 };
            b[LLC_LEN + 2..LLC_LEN + 18].copy_from_slice(&e.client_target_gid.0);
            fmt.v2_byte_order
                .put_u16(b, LLC_LEN + 26, e.rtokens.len() as u16);
            let mut p = LLC_LEN + ADD_LINK_EXT_LEN;
            for rt in e.rtokens.iter() {
                rt.write(b, p);
                p += AddLinkRtoken::LEN;
            }
        }
        Ok(())
    }
}

/// ADD LINK CONTINUATION (RFC 7609 A.3.3; v1 only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AddLinkCont {
    /// Response flag.
    pub response: bool,
    /// Number of the new link.
    pub link_num: u8,
    /// RTokens remaining including this message (≤ 2 means last).
    pub num_rkeys: u8,
    /// The two RToken pairs (the second is zero when only one remains).
    pub rtokens: [AddLinkRtoken; 2],
}

impl AddLinkCont {
    pub(crate) fn parse(m: &[u8]) -> Result<AddLinkCont> {
        fixed_len(LlcType::AddLinkCont, m)?;
        Ok(AddLinkCont {
            response: m[3] & FLAG_RESP != 0,
            link_num: m[4],
            num_rkeys: m[5],
            rtokens: [AddLinkRtoken::read(m, 8), AddLinkRtoken::read(m, 24)],
        })
    }
    pub(crate) fn emit(&self, b: &mut [u8], fmt: LlcFormat) {
        let flags = if self.response { FLAG_RESP } else { 0 };
        write_header(b, LlcType::AddLinkCont, false, flags, fmt);
        b[4] = self.link_num;
        b[5] = self.num_rkeys;
        self.rtokens[0].write(b, 8);
        self.rtokens[1].write(b, 24);
    }
}

/// DELETE LINK flag: delete all links (the whole link group).
pub const FLAG_DEL_LINK_ALL: u8 = 0x40;
/// DELETE LINK flag: orderly (operator-initiated) deletion.
pub const FLAG_DEL_LINK_ORDERLY: u8 = 0x20;

/// DELETE LINK reason code (u32; RFC 7609 A.3.4, Linux adds NOLGR).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DeleteLinkReason(pub u32);

impl DeleteLinkReason {
    /// Lost path.
    pub const LOST_PATH: DeleteLinkReason = DeleteLinkReason(0x0001_0000);
    /// Operator-initiated termination.
    pub const OP_INIT_TERM: DeleteLinkReason = DeleteLinkReason(0x0002_0000);
    /// Program-initiated termination (link inactivity).
    pub const PROG_INIT_TERM: DeleteLinkReason = DeleteLinkReason(0x0003_0000);
    /// LLC protocol violation.
    pub const PROT_VIOL: DeleteLinkReason = DeleteLinkReason(0x0004_0000);
    /// Asymmetric link no longer needed.
    pub const NO_ASYM_NEEDED: DeleteLinkReason = DeleteLinkReason(0x0005_0000);
    /// Response: unknown link ID.
    pub const NOLNK: DeleteLinkReason = DeleteLinkReason(0x0010_0000);
    /// Response (Linux): unknown link group.
    pub const NOLGR: DeleteLinkReason = DeleteLinkReason(0x0020_0000);

    /// Short name, if known.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0x0001_0000 => "LOST_PATH",
            0x0002_0000 => "OP_INIT_TERM",
            0x0003_0000 => "PROG_INIT_TERM",
            0x0004_0000 => "PROT_VIOL",
            0x0005_0000 => "NO_ASYM_NEEDED",
            0x0010_0000 => "NOLNK",
            0x0020_0000 => "NOLGR",
            _ => return None,
        })
    }
}

impl fmt::Display for DeleteLinkReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{:#010x} {n}", self.0),
            None => write!(f, "{:#010x}", self.0),
        }
    }
}

impl fmt::Debug for DeleteLinkReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeleteLinkReason({self})")
    }
}

/// DELETE LINK (RFC 7609 A.3.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeleteLink {
    /// SMC-Rv2 message (0x24).
    pub v2: bool,
    /// Response flag.
    pub response: bool,
    /// A: terminate every link of the link group.
    pub all: bool,
    /// O: orderly termination.
    pub orderly: bool,
    /// Link to delete (0 with `all`).
    pub link_num: u8,
    /// Reason code; unknown codes are informational only.
    pub reason: DeleteLinkReason,
}

impl DeleteLink {
    pub(crate) fn parse(m: &[u8], v2: bool) -> Result<DeleteLink> {
        fixed_len(LlcType::DeleteLink, m)?;
        Ok(DeleteLink {
            v2,
            response: m[3] & FLAG_RESP != 0,
            all: m[3] & FLAG_DEL_LINK_ALL != 0,
            orderly: m[3] & FLAG_DEL_LINK_ORDERLY != 0,
            link_num: m[4],
            reason: DeleteLinkReason(get_u32(m, 5)),
        })
    }
    pub(crate) fn emit(&self, b: &mut [u8], fmt: LlcFormat) {
        let mut flags = if self.response { FLAG_RESP } else { 0 };
        if self.all {
            flags |= FLAG_DEL_LINK_ALL;
        }
        if self.orderly {
            flags |= FLAG_DEL_LINK_ORDERLY;
        }
        write_header(b, LlcType::DeleteLink, self.v2, flags, fmt);
        b[4] = self.link_num;
        put_u32(b, 5, self.reason.0);
    }
}

/// Most GIDs in a REQUEST ADD LINK we accept (Linux sends ≤ 2).
pub const MAX_REQ_ADD_LINK_GIDS: usize = 8;

/// REQUEST ADD LINK v2 (0x25; Linux `smc_llc_msg_req_add_link_v2`): the client invites the
/// server to add a link and lists its usable GIDs. Linux sends 28 + 16·n bytes (n ≥ 1 in
/// practice, as receivers require ≥ 44) and answers with a 44-byte echo; so the length here
/// is max(44, 28 + 16·n).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReqAddLink {
    /// Response flag (the server answers only when it cannot add a link).
    pub response: bool,
    /// Flag bits other than the response flag (0x7F), kept verbatim: Linux marks a negative
    /// response there.
    pub other_flags: u8,
    /// The client's GIDs.
    pub gids: ArrayVec<Gid, MAX_REQ_ADD_LINK_GIDS>,
}

impl ReqAddLink {
    const HDR: usize = 28;
    /// Total length on the wire.
    pub fn buffer_len(&self) -> usize {
        (Self::HDR + 16 * self.gids.len()).max(LLC_LEN)
    }
    pub(crate) fn parse(m: &[u8]) -> Result<ReqAddLink> {
        let n = usize::from(m[24]);
        if n > MAX_REQ_ADD_LINK_GIDS {
            return Err(Error::CountOutOfRange {
                field: "gid_cnt",
                value: n,
                min: 0,
                max: MAX_REQ_ADD_LINK_GIDS,
            });
        }
        let expected = (Self::HDR + 16 * n).max(LLC_LEN);
        if m.len() != expected {
            return Err(Error::BadLength {
                msg: "REQ ADD LINK v2",
                expected,
                got: m.len(),
            });
        }
        let mut gids = ArrayVec::new();
        for i in 0..n {
            gids.push(Gid(array(m, Self::HDR + 16 * i)));
        }
        Ok(ReqAddLink {
            response: m[3] & FLAG_RESP != 0,
            other_flags: m[3] & !FLAG_RESP,
            gids,
        })
    }
    pub(crate) fn emit(&self, b: &mut [u8], fmt: LlcFormat) {
        let flags = if self.response { FLAG_RESP } else { 0 } | (self.other_flags & !FLAG_RESP);
        write_header(b, LlcType::ReqAddLink, true, flags, fmt);
        b[24] = self.gids.len() as u8;
        for (i, g) in self.gids.iter().enumerate() {
            let p = Self::HDR + 16 * i;
            b[p..p + 16].copy_from_slice(&g.0);
        }
    }
}

/// TEST LINK (RFC 7609 A.3.8): the receiver echoes `user_data` in a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TestLink {
    /// SMC-Rv2 message (0x27).
    pub v2: bool,
    /// Response flag.
    pub response: bool,
    /// Opaque data echoed by the responder.
    pub user_data: [u8; 16],
}

impl TestLink {
    pub(crate) fn parse(m: &[u8], v2: bool) -> Result<TestLink> {
        fixed_len(LlcType::TestLink, m)?;
        Ok(TestLink {
            v2,
            response: m[3] & FLAG_RESP != 0,
            user_data: array(m, 4),
        })
    }
    pub(crate) fn emit(&self, b: &mut [u8], fmt: LlcFormat) {
        let flags = if self.response { FLAG_RESP } else { 0 };
        write_header(b, LlcType::TestLink, self.v2, flags, fmt);
        b[4..20].copy_from_slice(&self.user_data);
    }
}

#[cfg(test)]
mod tests {
    use super::super::LlcMessage;
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// k612-pair frame 21: ADD LINK v2 request, 88 bytes, one rtoken, LE length/num_rkeys.
    const K612_ADD_LINK: &str = "22580000525400990001000000000000000000000000ffff0a63000100001202036ac1d90000000000000000800000000000000000000000ffff0a63000100000000000000000100000003620000054fff22f8b0837a0000";

    #[test]
    fn linux_add_link_v2() {
        let b = hex(K612_ADD_LINK);
        let f = LlcFormat::LINUX_X86;
        let LlcMessage::AddLink(a) = LlcMessage::parse(&b, f).unwrap() else {
            panic!("ADD LINK expected")
        };
        assert!(a.v2 && !a.response);
        assert_eq!(a.gid.to_string(), "::ffff:10.99.0.1");
        assert_eq!(a.qpn.get(), 0x12);
        assert_eq!(a.link_num, 2);
        assert_eq!(a.mtu().unwrap(), QpMtu::Mtu1024);
        assert_eq!(a.psn.get(), 0x6ac1d9);
        let e = a.ext.unwrap();
        assert!(e.v2_direct);
        let rts: Vec<_> = e.rtokens.iter().collect();
        assert_eq!(
            rts,
            [AddLinkRtoken {
                rmb_key: 0x362,
                rmb_key_new: 0x54f,
                rmb_vaddr_new: 0xff22_f8b0_837a_0000
            }]
        );
        let mut out = vec![0u8; a.buffer_len()];
        LlcMessage::AddLink(a).emit(&mut out, f).unwrap();
        assert_eq!(out, b);
        // Read with the wrong byte order, the length is 0x5800: out of range.
        assert!(LlcMessage::parse(&b, LlcFormat::LINUX_BE).is_err());
    }

    #[test]
    fn add_link_layouts_differ_in_gid_offset() {
        let a = AddLink {
            v2: false,
            response: true,
            reject: true,
            reject_reason: ADD_LINK_RSN_NO_ALT_PATH,
            mac: Mac([2, 0, 0, 0, 0, 1]),
            gid: Gid([0xAB; 16]),
            qpn: U24::new(0x123).unwrap(),
            link_num: 2,
            qp_mtu: 3,
            psn: U24::new(0x4567).unwrap(),
            ext: None,
        };
        let m = LlcMessage::AddLink(a);
        let mut rfc = [0u8; 44];
        let mut lnx = [0u8; 44];
        m.emit(&mut rfc, LlcFormat::RFC7609).unwrap();
        m.emit(&mut lnx, LlcFormat::LINUX_X86).unwrap();
        assert_eq!(&rfc[10..26], &[0xAB; 16]);
        assert_eq!(&lnx[12..28], &[0xAB; 16]);
        assert_eq!((rfc[2], rfc[3]), (1, 0xC0));
        assert_eq!(LlcMessage::parse(&rfc, LlcFormat::RFC7609).unwrap(), m);
        assert_eq!(LlcMessage::parse(&lnx, LlcFormat::LINUX_X86).unwrap(), m);
    }

    #[test]
    fn confirm_link_dialects() {
        // CHECKLIST test vector: RFC-figure CONFIRM LINK request.
        let b = hex("012c000002000000000100000000000000000000ffffc0000201000123011122334403000000000000000000");
        let LlcMessage::ConfirmLink(c) = LlcMessage::parse(&b, LlcFormat::RFC7609).unwrap() else {
            panic!()
        };
        assert_eq!((c.link_num, c.link_uid, c.max_links), (1, 0x1122_3344, 3));
        let mut x = b.clone();
        x[3] = 0x83;
        x[35] = 0xff;
        let r = LlcMessage::parse(&x, LlcFormat::RFC7609).unwrap();
        let l = LlcMessage::parse(&x, LlcFormat::LINUX_X86).unwrap();
        let (LlcMessage::ConfirmLink(r), LlcMessage::ConfirmLink(l)) = (r, l) else {
            panic!()
        };
        assert!(r.response && !r.no_rmbe_eyecatcher && r.max_conns == 0);
        assert!(l.response && l.no_rmbe_eyecatcher && l.max_conns == 255);
        x[29] = 0; // link number 0 is invalid (AMB-34)
        assert!(matches!(
            LlcMessage::parse(&x, LlcFormat::LINUX_X86),
            Err(Error::CountOutOfRange { value: 0, .. })
        ));
    }
}
