//! SMC Accept (type 2) and SMC Confirm (type 3): identical SMC-R layouts (RFC 7609 A.2.3,
//! A.2.4) plus Linux's version-2 tail: negotiated EID, the first-contact extension
//! (`smc_clc_first_contact_ext_v2x`) and, in a first-contact Confirm, the GID list.
//!
//! SMC-D Accept/Confirm (eye catcher "SMCD" or path type D) has a different layout; it is
//! returned as [`OtherPathRepr`] so that it can never be mistaken for SMC-R.

use super::{check_frame, check_version, write_frame, ClcType, Eyecatcher, Header, PathType};
use crate::common::{
    array, get_u16, get_u32, get_u64, put_u16, put_u32, put_u64, BufSize, Eid, Gid, HostName, Mac,
    Name32, PeerId, QpMtu, U24,
};
use crate::error::{check_out, Error, Result};
use arrayvec::ArrayVec;

/// Byte offsets of the SMC-R Accept/Confirm.
pub mod field {
    /// Peer ID (8).
    pub const PEER_ID: usize = 8;
    /// RoCE GID (16).
    pub const GID: usize = 16;
    /// RoCE MAC (6).
    pub const MAC: usize = 32;
    /// QP number (BE24).
    pub const QPN: usize = 38;
    /// RMB RKey (BE32).
    pub const RMB_RKEY: usize = 41;
    /// RMB element index.
    pub const RMBE_IDX: usize = 45;
    /// RMBE alert token (BE32).
    pub const RMBE_ALERT_TOKEN: usize = 46;
    /// Bsize (high nibble) | QP MTU (low nibble).
    pub const SIZE_MTU: usize = 50;
    /// RMB virtual address (BE64).
    pub const RMB_VADDR: usize = 52;
    /// Initial PSN (BE24).
    pub const PSN: usize = 61;
    /// v1 length.
    pub const V1_LEN: usize = 68;
    /// v2: negotiated EID (32).
    pub const EID: usize = 64;
    /// v2: end of EID + 8 reserved bytes; first-contact extension starts here.
    pub const V2_BASE_END: usize = 104;
    /// v2 length without the first-contact extension.
    pub const V2_LEN: usize = 108;
    /// SMC-R first-contact extension length.
    pub const FCE_LEN: usize = 52;
    /// GID list header (count + 3 reserved).
    pub const GID_LIST_HDR: usize = 4;
}

/// Most GIDs in a Confirm GID list we accept (Linux sends ≤ 2).
pub const MAX_GIDS: usize = 8;
/// Longest SMC-R Accept/Confirm: v2 first-contact Confirm with [`MAX_GIDS`] GIDs.
pub const MAX_LEN: usize =
    field::V2_BASE_END + field::FCE_LEN + field::GID_LIST_HDR + 16 * MAX_GIDS + 4;

/// The SMCv2 first-contact extension of an Accept/Confirm (Linux `fce_v2x`, SMC-R form).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FirstContactExt {
    /// The peer is reachable without a gateway.
    pub v2_direct: bool,
    /// OS type (1 z/OS, 2 Linux, 3 AIX), 4 bits.
    pub os_type: u8,
    /// SMCv2 release (0 = v2.0, 1 = v2.1), 4 bits.
    pub release: u8,
    /// Host name, blank-padded.
    pub hostname: HostName,
    /// Max connections per link group (v2.1).
    pub max_conns: u8,
    /// Max links per link group (v2.1).
    pub max_links: u8,
    /// Feature mask (v2.1).
    pub feature_mask: u16,
    /// Vendor experimental options.
    pub vendor_exp_options: u32,
}

/// The version-2 tail of an SMC-R Accept/Confirm.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AcceptV2 {
    /// Negotiated EID.
    pub eid: Eid,
    /// First-contact extension (first contact only).
    pub fce: Option<FirstContactExt>,
    /// Confirm only (after the extension): the client's usable RoCEv2 GIDs.
    pub gid_list: Option<ArrayVec<Gid, MAX_GIDS>>,
}

/// An SMC-R Accept or Confirm (the message type is the [`super::ClcMessage`] variant).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AcceptConfirmRepr {
    /// Header version: 1 (68-byte RFC layout) or ≥ 2 (Linux v2 tail in `v2`).
    pub version: u8,
    /// First Contact flag (0x08).
    pub first_contact: bool,
    /// Sender's Peer ID.
    pub peer_id: PeerId,
    /// Sender's RoCE GID for the link.
    pub gid: Gid,
    /// Sender's RoCE MAC.
    pub mac: Mac,
    /// Sender's QP number.
    pub qpn: U24,
    /// RKey of the sender's RMB on that QP.
    pub rmb_rkey: u32,
    /// RMB element index (1..=255; Linux always 1).
    pub rmbe_idx: u8,
    /// Alert token the peer puts in every CDC message.
    pub rmbe_alert_token: u32,
    /// Compressed RMBE size.
    pub rmbe_size: BufSize,
    /// QP MTU code as sent (validated only on first contact, RFC 7609 A.2.3); see
    /// [`Self::mtu`].
    pub qp_mtu: u8,
    /// RMB virtual address.
    pub rmb_vaddr: u64,
    /// Initial PSN.
    pub psn: U24,
    /// Version-2 tail; present exactly when `version` ≥ 2.
    pub v2: Option<AcceptV2>,
}

/// Whether an Accept/Confirm header belongs to another path (SMC-D) rather than SMC-R.
pub(crate) fn is_other_path(h: &Header<&[u8]>) -> Result<bool> {
    Ok(h.eyecatcher()? == Eyecatcher::Smcd || h.typev1() == PathType::D)
}

impl AcceptConfirmRepr {
    /// The QP MTU as an enumeration (error for a reserved code).
    pub fn mtu(&self) -> Result<QpMtu> {
        QpMtu::from_code(self.qp_mtu)
    }

    /// Parses a complete SMC-R Accept or Confirm of type `ty`.
    pub fn parse(b: &[u8], ty: ClcType) -> Result<AcceptConfirmRepr> {
        let h = check_frame(b)?;
        let got = h.msg_type()?;
        if got != ty || !matches!(ty, ClcType::Accept | ClcType::Confirm) {
            return Err(Error::UnknownType {
                layer: "CLC Accept/Confirm",
                value: got as u8,
            });
        }
        if is_other_path(&h)? {
            return Err(Error::Inconsistent {
                field: "path type",
                why: "SMC-D Accept/Confirm is not SMC-R",
            });
        }
        match h.typev1() {
            PathType::R => {}
            other => {
                return Err(Error::ReservedValue {
                    field: "chosen path type",
                    value: other as u32,
                })
            }
        }
        let msg = if ty == ClcType::Accept {
            "CLC Accept"
        } else {
            "CLC Confirm"
        };
        let version = h.version();
        let first_contact = h.flag();
        let mut r = AcceptConfirmRepr {
            version,
            first_contact,
            ..Default::default()
        };
        if version == 1 {
            if b.len() != field::V1_LEN {
                return Err(Error::BadLength {
                    msg,
                    expected: field::V1_LEN,
                    got: b.len(),
                });
            }
        } else {
            if b.len() < field::V2_LEN {
                return Err(Error::BadLength {
                    msg,
                    expected: field::V2_LEN,
                    got: b.len(),
                });
            }
            let mut v2 = AcceptV2 {
                eid: Name32(array(b, field::EID)),
                fce: None,
                gid_list: None,
            };
            let mut p = field::V2_BASE_END;
            let end = b.len() - 4;
            if end > p {
                if end < p + field::FCE_LEN {
                    return Err(Error::BadLength {
                        msg,
                        expected: p + field::FCE_LEN + 4,
                        got: b.len(),
                    });
                }
                v2.fce = Some(parse_fce(b, p));
                p += field::FCE_LEN;
            }
            if end > p {
                if ty != ClcType::Confirm || end < p + field::GID_LIST_HDR {
                    return Err(Error::BadLength {
                        msg,
                        expected: p + 4,
                        got: b.len(),
                    });
                }
                let cnt = usize::from(b[p]);
                if cnt > MAX_GIDS {
                    return Err(Error::CountOutOfRange {
                        field: "gid_cnt",
                        value: cnt,
                        min: 0,
                        max: MAX_GIDS,
                    });
                }
                p += field::GID_LIST_HDR;
                if end != p + 16 * cnt {
                    return Err(Error::BadLength {
                        msg,
                        expected: p + 16 * cnt + 4,
                        got: b.len(),
                    });
                }
                let mut gids = ArrayVec::new();
                for i in 0..cnt {
                    gids.push(Gid(array(b, p + 16 * i)));
                }
                v2.gid_list = Some(gids);
            }
            r.v2 = Some(v2);
        }
        r.peer_id = PeerId::read(b, field::PEER_ID);
        r.gid = Gid(array(b, field::GID));
        r.mac = Mac(array(b, field::MAC));
        r.qpn = U24::read(b, field::QPN);
        r.rmb_rkey = get_u32(b, field::RMB_RKEY);
        r.rmbe_idx = b[field::RMBE_IDX];
        r.rmbe_alert_token = get_u32(b, field::RMBE_ALERT_TOKEN);
        r.rmbe_size = BufSize::from_nibble(b[field::SIZE_MTU] >> 4);
        r.qp_mtu = b[field::SIZE_MTU] & 0x0F;
        r.rmb_vaddr = get_u64(b, field::RMB_VADDR);
        r.psn = U24::read(b, field::PSN);
        // CHECKLIST A.2.3 (EXT): QPs 0 and 1 are the IB special QPs, never an RC QP.
        if r.qpn.get() < 2 {
            return Err(Error::CountOutOfRange {
                field: "qpn",
                value: r.qpn.get() as usize,
                min: 2,
                max: U24::MAX.get() as usize,
            });
        }
        // RFC 7609 §2.1: RMB element indexes are 1..255 (AMB-10: 0 → protocol error).
        if r.rmbe_idx == 0 {
            return Err(Error::CountOutOfRange {
                field: "rmbe_idx",
                value: 0,
                min: 1,
                max: 255,
            });
        }
        if first_contact {
            // RFC 7609 A.2.3: the MTU "should only be validated in the first contact
            // exchange"; a reserved value there is ENUM-DECL (Decline, fall back).
            r.mtu()?;
        }
        Ok(r)
    }

    /// Total length on the wire.
    pub fn buffer_len(&self) -> usize {
        match &self.v2 {
            None => field::V1_LEN,
            Some(v2) => {
                let mut n = field::V2_LEN;
                if v2.fce.is_some() {
                    n += field::FCE_LEN;
                }
                if let Some(g) = &v2.gid_list {
                    n += field::GID_LIST_HDR + 16 * g.len();
                }
                n
            }
        }
    }

    /// Checks that version, v2 tail and message type agree.
    pub fn check_consistent(&self, ty: ClcType) -> Result<()> {
        check_version(self.version)?;
        if (self.version >= 2) != self.v2.is_some() {
            return Err(Error::Inconsistent {
                field: "version",
                why: "v2 tail present iff version >= 2",
            });
        }
        if let Some(v2) = &self.v2 {
            if v2.gid_list.is_some() && (ty != ClcType::Confirm || v2.fce.is_none()) {
                return Err(Error::Inconsistent {
                    field: "gid_list",
                    why: "only a Confirm with a first-contact extension has a GID list",
                });
            }
            if let Some(f) = &v2.fce {
                if f.os_type > 15 || f.release > 15 {
                    return Err(Error::Inconsistent {
                        field: "fce",
                        why: "os_type and release are 4-bit fields",
                    });
                }
            }
        }
        if self.qp_mtu > 15 {
            return Err(Error::ReservedValue {
                field: "qp_mtu",
                value: self.qp_mtu.into(),
            });
        }
        if self.first_contact {
            self.mtu()?;
        }
        if self.qpn.get() < 2 || self.rmbe_idx == 0 {
            return Err(Error::Inconsistent {
                field: "qpn/rmbe_idx",
                why: "QPN must be >= 2 and the RMBE index >= 1",
            });
        }
        Ok(())
    }

    /// Writes the message as type `ty` (Accept or Confirm); returns its length.
    pub fn emit(&self, buf: &mut [u8], ty: ClcType) -> Result<usize> {
        if !matches!(ty, ClcType::Accept | ClcType::Confirm) {
            return Err(Error::Inconsistent {
                field: "type",
                why: "Accept/Confirm repr emitted as another type",
            });
        }
        self.check_consistent(ty)?;
        let len = self.buffer_len();
        check_out(buf, len)?;
        let b = &mut buf[..len];
        b.fill(0);
        let byte7 = (self.version << 4) | if self.first_contact { 0x08 } else { 0 };
        write_frame(b, Eyecatcher::Smcr, ty, len, byte7);
        self.peer_id.write(b, field::PEER_ID);
        b[field::GID..field::GID + 16].copy_from_slice(&self.gid.0);
        b[field::MAC..field::MAC + 6].copy_from_slice(&self.mac.0);
        self.qpn.write(b, field::QPN);
        put_u32(b, field::RMB_RKEY, self.rmb_rkey);
        b[field::RMBE_IDX] = self.rmbe_idx;
        put_u32(b, field::RMBE_ALERT_TOKEN, self.rmbe_alert_token);
        b[field::SIZE_MTU] = (self.rmbe_size.code() << 4) | self.qp_mtu;
        put_u64(b, field::RMB_VADDR, self.rmb_vaddr);
        self.psn.write(b, field::PSN);
        if let Some(v2) = &self.v2 {
            b[field::EID..field::EID + 32].copy_from_slice(&v2.eid.0);
            let mut p = field::V2_BASE_END;
            if let Some(f) = &v2.fce {
                emit_fce(f, b, p);
                p += field::FCE_LEN;
            }
            if let Some(g) = &v2.gid_list {
                b[p] = g.len() as u8;
                p += field::GID_LIST_HDR;
                for gid in g {
                    b[p..p + 16].copy_from_slice(&gid.0);
                    p += 16;
                }
            }
        }
        Ok(len)
    }
}

fn parse_fce(b: &[u8], p: usize) -> FirstContactExt {
    FirstContactExt {
        v2_direct: b[p] & 0x80 != 0,
        os_type: b[p + 1] >> 4,
        release: b[p + 1] & 0x0F,
        hostname: Name32(array(b, p + 4)),
        max_conns: b[p + 36],
        max_links: b[p + 37],
        feature_mask: get_u16(b, p + 38),
        vendor_exp_options: get_u32(b, p + 40),
    }
}

fn emit_fce(f: &FirstContactExt, b: &mut [u8], p: usize) {
    b[p] = if f.v2_direct { 0x80 } else { 0 };
    b[p + 1] = (f.os_type << 4) | f.release;
    b[p + 4..p + 36].copy_from_slice(&f.hostname.0);
    b[p + 36] = f.max_conns;
    b[p + 37] = f.max_links;
    put_u16(b, p + 38, f.feature_mask);
    put_u32(b, p + 40, f.vendor_exp_options);
}

/// An Accept or Confirm for another path (SMC-D), kept byte-exact.
///
/// Only the framing (eye catchers, type, length) is validated; the SMC-D body is exposed
/// through a few accessors for display. It never turns into an SMC-R repr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtherPathRepr {
    bytes: ArrayVec<u8, MAX_LEN>,
}

impl OtherPathRepr {
    /// Parses (frames) an SMC-D Accept/Confirm.
    pub fn parse(b: &[u8]) -> Result<OtherPathRepr> {
        let h = check_frame(b)?;
        let ty = h.msg_type()?;
        if !matches!(ty, ClcType::Accept | ClcType::Confirm) || !is_other_path(&h)? {
            return Err(Error::Inconsistent {
                field: "path type",
                why: "not an SMC-D Accept/Confirm",
            });
        }
        // The shortest SMC-D Accept/Confirm is the 48-byte v1 form (linux-smc.md §1.4).
        if b.len() < 48 {
            return Err(Error::BadLength {
                msg: "CLC SMC-D Accept/Confirm",
                expected: 48,
                got: b.len(),
            });
        }
        let mut bytes = ArrayVec::new();
        bytes
            .try_extend_from_slice(b)
            .map_err(|_| Error::CountOutOfRange {
                field: "CLC length",
                value: b.len(),
                min: 48,
                max: MAX_LEN,
            })?;
        Ok(OtherPathRepr { bytes })
    }
    /// The raw message.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
    /// Accept or Confirm.
    pub fn msg_type(&self) -> ClcType {
        if self.bytes[4] == ClcType::Accept as u8 {
            ClcType::Accept
        } else {
            ClcType::Confirm
        }
    }
    /// Header version.
    pub fn version(&self) -> u8 {
        self.bytes[7] >> 4
    }
    /// First Contact flag.
    pub fn first_contact(&self) -> bool {
        self.bytes[7] & 0x08 != 0
    }
    /// Sender's ISM GID (SMC-D layout, offset 8).
    pub fn ism_gid(&self) -> u64 {
        get_u64(&self.bytes, 8)
    }
    /// DMB token (SMC-D layout, offset 16).
    pub fn dmb_token(&self) -> u64 {
        get_u64(&self.bytes, 16)
    }
    /// Compressed DMBE size (SMC-D layout, offset 25 high nibble).
    pub fn dmbe_size(&self) -> BufSize {
        BufSize::from_nibble(self.bytes[25] >> 4)
    }
    /// Link-group ID (SMC-D layout, offset 28).
    pub fn link_id(&self) -> u32 {
        get_u32(&self.bytes, 28)
    }
    /// Total length.
    pub fn buffer_len(&self) -> usize {
        self.bytes.len()
    }
    /// Writes the message back byte for byte.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        check_out(buf, self.bytes.len())?;
        buf[..self.bytes.len()].copy_from_slice(&self.bytes);
        Ok(self.bytes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clc::ClcMessage;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    // k612-pair frame 15: Linux first-contact v2 Confirm with a GID list of one.
    const K612_CONFIRM: &str = "e2d4c3d90300b428b12d52540099000200000000000000000000ffff0a630002525400990002000011000003ae01000000012300ff27713b82b6000000ca5000534d432d504545522d5445535420202020202020202020202020202020202020000000000000000080210000736d632d636c69656e7420202020202020202020202020202020202020202020ff0200010000000000000000000000000100000000000000000000000000ffff0a630002e2d4c3d9";

    #[test]
    fn linux_first_contact_confirm() {
        let b = hex(K612_CONFIRM);
        let ClcMessage::Confirm(c) = ClcMessage::parse(&b).unwrap() else {
            panic!("Confirm expected")
        };
        assert!(c.first_contact);
        assert_eq!(c.qpn.get(), 0x11);
        assert_eq!(c.rmb_rkey, 0x3ae);
        assert_eq!(c.rmbe_size.bytes(), 65536);
        assert_eq!(c.mtu().unwrap(), QpMtu::Mtu1024);
        let v2 = c.v2.as_ref().unwrap();
        let fce = v2.fce.unwrap();
        assert!(fce.v2_direct);
        assert_eq!((fce.os_type, fce.release), (2, 1));
        assert_eq!(fce.hostname.to_string(), "smc-client");
        assert_eq!(v2.gid_list.as_ref().unwrap().len(), 1);
        let mut out = vec![0u8; c.buffer_len()];
        c.emit(&mut out, ClcType::Confirm).unwrap();
        assert_eq!(out, b);
    }

    #[test]
    fn reserved_mtu_on_first_contact_is_enum_decline() {
        let mut b = hex(K612_CONFIRM);
        b[field::SIZE_MTU] = 0x27;
        let e = ClcMessage::parse(&b).unwrap_err();
        assert_eq!(
            e.action(crate::Layer::Clc),
            crate::Action::DeclineAndFallback
        );
        let mut z = b.clone();
        z[field::QPN..field::QPN + 3].copy_from_slice(&[0, 0, 1]);
        z[field::SIZE_MTU] = 0x23;
        assert!(matches!(
            ClcMessage::parse(&z),
            Err(Error::CountOutOfRange { field: "qpn", .. })
        ));
        z[field::QPN + 2] = 0x11;
        z[field::RMBE_IDX] = 0;
        assert!(matches!(
            ClcMessage::parse(&z),
            Err(Error::CountOutOfRange {
                field: "rmbe_idx",
                ..
            })
        ));
        b[7] = 0x20; // not first contact: the MTU is not validated (RFC 7609 A.2.3)
        let ClcMessage::Confirm(c) = ClcMessage::parse(&b).unwrap() else {
            panic!("Confirm expected")
        };
        assert!(c.mtu().is_err());
    }

    #[test]
    fn smcd_is_other_path() {
        let mut b = vec![0u8; 48];
        b[..4].copy_from_slice(&crate::common::EYECATCHER_SMCD);
        b[4] = 2;
        b[6] = 48;
        b[7] = 0x11;
        b[44..].copy_from_slice(&crate::common::EYECATCHER_SMCD);
        let m = ClcMessage::parse(&b).unwrap();
        let ClcMessage::OtherPath(o) = &m else {
            panic!("SMC-D must not parse as SMC-R")
        };
        assert_eq!(o.msg_type(), ClcType::Accept);
        assert_eq!(m.to_vec().unwrap(), b);
        // Path type D with an SMCR eye catcher is SMC-D too.
        b[..4].copy_from_slice(&crate::common::EYECATCHER_SMCR);
        b[44..].copy_from_slice(&crate::common::EYECATCHER_SMCR);
        assert!(matches!(
            ClcMessage::parse(&b).unwrap(),
            ClcMessage::OtherPath(_)
        ));
    }
}
