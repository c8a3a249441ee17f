//! SMC Proposal (CLC type 1), client → server (RFC 7609 A.2.2; Linux `smc_clc_send_proposal`).
//!
//! Two layouts, chosen by the header version:
//! - **Version 1** (RFC 7609 and Linux ≤ 5.9): base fields, then `iparea_offset` bytes of
//!   "area for future growth" (0 in the RFC; 40 = the SMC-D area in Linux), then the IP area.
//! - **Version ≥ 2** (every current Linux): base fields, then the 40-byte SMC-D/v2 area, which is
//!   always present; the IP area (only when `typev1` ≠ none, `iparea_offset` = 40); the v2
//!   extension (only when `typev2` ≠ none) with EIDs, RoCEv2 GID and v2.1 limits; and the
//!   SMC-Dv2 extension (only when `typev2` includes D).
//!
//! Offsets (`iparea_offset`, `v2_ext_offset`, `smcd_v2_ext_offset`) are derived from the
//! structure on emit and must be exactly where the structure puts them on parse; the total
//! length must match exactly (Linux `smc_clc_msg_prop_valid` is just as strict).

use super::{check_frame, check_version, write_frame, ClcType, Eyecatcher, PathType};
use crate::common::{array, get_u16, get_u64, put_u16, put_u64, Eid, Gid, Mac, Name32, PeerId};
use crate::error::{check_out, Error, Result};
use arrayvec::ArrayVec;
use core::net::{Ipv4Addr, Ipv6Addr};

/// Byte offsets of the Proposal.
pub mod field {
    /// Peer ID (8).
    pub const PEER_ID: usize = 8;
    /// Client preferred GID (16).
    pub const GID: usize = 16;
    /// Client preferred RoCE MAC (6).
    pub const MAC: usize = 32;
    /// Offset from byte 40 to the IP area (u16).
    pub const IPAREA_OFFSET: usize = 38;
    /// End of the base part.
    pub const BASE_END: usize = 40;
    /// SMC-D/v2 area (Linux `smc_clc_msg_smcd`), 40 bytes.
    pub const SMCD_AREA_LEN: usize = 40;
    /// `v2_ext_offset` in the SMC-D/v2 area: distance from byte 52 to the v2 extension.
    pub const V2_EXT_OFFSET: usize = 50;
    /// Base of `v2_ext_offset`.
    pub const V2_EXT_BASE: usize = 52;
    /// Fixed part of the IP area (subnet, prefix length, reserved, prefix count).
    pub const IP_AREA_LEN: usize = 8;
    /// One IPv6 prefix element: 16-byte prefix + 1-byte length, unpadded.
    pub const IPV6_PREFIX_LEN: usize = 17;
    /// Fixed part of the v2 extension.
    pub const V2_EXT_LEN: usize = 40;
    /// Fixed part of the SMC-Dv2 extension (system EID + reserved).
    pub const SMCD_V2_EXT_LEN: usize = 48;
    /// One ISM GID entry (GID u64 + CHID u16).
    pub const ISM_GID_LEN: usize = 10;
}

/// Most IPv6 prefixes a Proposal may carry (RFC 7609 A.2.2).
pub const MAX_IPV6_PREFIXES: usize = 8;
/// Most user EIDs in the v2 extension (Linux `SMC_CLC_MAX_UEID`).
pub const MAX_EIDS: usize = 8;
/// Most ISMv2 GIDs in the SMC-Dv2 extension (Linux `SMCD_CLC_MAX_V2_GID_ENTRIES`).
pub const MAX_ISM_GIDS: usize = 8;

/// One IPv6 prefix of the IP area.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Prefix {
    /// Prefix value.
    pub prefix: Ipv6Addr,
    /// Prefix length, 0..=128.
    pub len: u8,
}

/// The IP area: the client's IPv4 subnet or its IPv6 prefixes (RFC 7609 A.2.2, §3.5.1.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpArea {
    /// IPv4 subnet number of the outgoing interface (address AND mask; AMB-05); 0 for IPv6.
    pub subnet: Ipv4Addr,
    /// IPv4 prefix length 0..=32; 0 for IPv6.
    pub prefix_len: u8,
    /// IPv6 prefixes (0 for IPv4, 1..=8 for IPv6).
    pub ipv6_prefixes: ArrayVec<Ipv6Prefix, MAX_IPV6_PREFIXES>,
}

impl IpArea {
    fn len(&self) -> usize {
        field::IP_AREA_LEN + field::IPV6_PREFIX_LEN * self.ipv6_prefixes.len()
    }
    fn parse(b: &[u8], at: usize) -> Result<IpArea> {
        need(b, at + field::IP_AREA_LEN, "IP area")?;
        let prefix_len = b[at + 4];
        if prefix_len > 32 {
            return Err(Error::CountOutOfRange {
                field: "IPv4 prefix length",
                value: prefix_len.into(),
                min: 0,
                max: 32,
            });
        }
        let k = usize::from(b[at + 7]);
        if k > MAX_IPV6_PREFIXES {
            return Err(Error::CountOutOfRange {
                field: "IPv6 prefix count",
                value: k,
                min: 0,
                max: MAX_IPV6_PREFIXES,
            });
        }
        let mut ipv6_prefixes = ArrayVec::new();
        let mut p = at + field::IP_AREA_LEN;
        need(b, p + field::IPV6_PREFIX_LEN * k, "IPv6 prefix array")?;
        for _ in 0..k {
            let len = b[p + 16];
            if len > 128 {
                return Err(Error::CountOutOfRange {
                    field: "IPv6 prefix length",
                    value: len.into(),
                    min: 0,
                    max: 128,
                });
            }
            ipv6_prefixes.push(Ipv6Prefix {
                prefix: Ipv6Addr::from(array::<16>(b, p)),
                len,
            });
            p += field::IPV6_PREFIX_LEN;
        }
        Ok(IpArea {
            subnet: Ipv4Addr::from(array::<4>(b, at)),
            prefix_len,
            ipv6_prefixes,
        })
    }
    fn emit(&self, b: &mut [u8], at: usize) {
        b[at..at + 4].copy_from_slice(&self.subnet.octets());
        b[at + 4] = self.prefix_len;
        b[at + 7] = self.ipv6_prefixes.len() as u8;
        let mut p = at + field::IP_AREA_LEN;
        for pf in &self.ipv6_prefixes {
            b[p..p + 16].copy_from_slice(&pf.prefix.octets());
            b[p + 16] = pf.len;
            p += field::IPV6_PREFIX_LEN;
        }
    }
}

/// The 40-byte SMC-D/v2 area Linux always puts after the base fields (`smc_clc_msg_smcd`).
/// Its `v2_ext_offset` is derived from the structure and not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SmcdArea {
    /// SMC-Dv1 ISM GID, 0 if none.
    pub ism_gid: u64,
    /// ISM CHID.
    pub chid: u16,
    /// Vendor OUI (Linux: 0).
    pub vendor_oui: [u8; 3],
    /// Vendor experimental options (Linux: 0).
    pub vendor_exp_options: [u8; 5],
    /// The 20 reserved bytes at the end (Linux: 0, never read). Kept so that a Proposal
    /// round-trips; smc-rs's same-host offer lives here and in the vendor fields
    /// ([`super::samehost`]).
    pub reserved: [u8; 20],
}

impl SmcdArea {
    fn parse(b: &[u8], at: usize) -> SmcdArea {
        SmcdArea {
            ism_gid: get_u64(b, at),
            chid: get_u16(b, at + 8),
            vendor_oui: array(b, at + 12),
            vendor_exp_options: array(b, at + 15),
            reserved: array(b, at + 20),
        }
    }
    fn emit(&self, b: &mut [u8], at: usize, v2_ext_offset: u16) {
        put_u64(b, at, self.ism_gid);
        put_u16(b, at + 8, self.chid);
        put_u16(b, at + 10, v2_ext_offset);
        b[at + 12..at + 15].copy_from_slice(&self.vendor_oui);
        b[at + 15..at + 20].copy_from_slice(&self.vendor_exp_options);
        b[at + 20..at + 40].copy_from_slice(&self.reserved);
    }
}

/// What a version-1 Proposal has between the base fields and the IP area.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum V1Area {
    /// `iparea_offset` = 0: the RFC 7609 layout.
    None,
    /// `iparea_offset` = 40: Linux's SMC-D area (its v2 extension offset must be 0 in v1).
    Smcd(SmcdArea),
    /// `iparea_offset` 1..=39: opaque "area for future growth", skipped as RFC 7609 A.2.2
    /// requires and kept so the message round-trips.
    Opaque(ArrayVec<u8, 39>),
}

/// One ISMv2 GID entry of the SMC-Dv2 extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IsmGid {
    /// ISM GID.
    pub gid: u64,
    /// CHID.
    pub chid: u16,
}

/// SMC-Dv2 extension (parsed so that SMC-R can skip it correctly; content is SMC-D business).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SmcdV2Ext {
    /// System EID (SEID).
    pub system_eid: Eid,
    /// ISMv2 GIDs (their count is the v2 extension's `ism_gid_cnt`).
    pub ism_gids: ArrayVec<IsmGid, MAX_ISM_GIDS>,
}

/// The SMCv2 extension of a Proposal (IBM "SMC Version 2"; linux-smc.md §1.3).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProposalV2Ext {
    /// User EIDs offered.
    pub eids: ArrayVec<Eid, MAX_EIDS>,
    /// SMCv2 release (Linux: 1 = v2.1), 4 bits.
    pub release: u8,
    /// SEID indicator.
    pub seid: bool,
    /// RoCEv2 GID (IPv4-mapped) when `typev2` includes R.
    pub roce_gid: Gid,
    /// Max connections per link group (v2.1).
    pub max_conns: u8,
    /// Max links per link group (v2.1).
    pub max_links: u8,
    /// Feature mask (v2.1), e.g. 0x0001 emulated-ISM.
    pub feature_mask: u16,
    /// SMC-Dv2 extension, present exactly when `typev2` includes D.
    pub smcd: Option<SmcdV2Ext>,
}

impl ProposalV2Ext {
    fn len(&self) -> usize {
        let mut n = field::V2_EXT_LEN + Name32::LEN * self.eids.len();
        if let Some(d) = &self.smcd {
            n += field::SMCD_V2_EXT_LEN + field::ISM_GID_LEN * d.ism_gids.len();
        }
        n
    }
}

/// The layout-specific part of a Proposal.
// Fixed-capacity lists keep parsing allocation-free; the size difference is deliberate.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProposalBody {
    /// Header version 1 (RFC 7609; Linux ≤ 5.9).
    V1 {
        /// What lies between the base fields and the IP area.
        area: V1Area,
        /// The IP area (always present in v1).
        ip: IpArea,
    },
    /// Header version ≥ 2 (Linux ≥ 5.10).
    V2 {
        /// The always-present SMC-D/v2 area.
        smcd: SmcdArea,
        /// The IP area; present exactly when `typev1` ≠ none.
        ip: Option<IpArea>,
        /// The v2 extension; present exactly when `typev2` ≠ none.
        v2: Option<ProposalV2Ext>,
    },
}

/// An SMC Proposal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProposalRepr {
    /// Eye catcher (SMCR, or SMCD from an SMC-D-only client).
    pub eyecatcher: Eyecatcher,
    /// Header version (1..=15); selects the layout together with `body`.
    pub version: u8,
    /// Path offered for v1 (RFC senders: R).
    pub typev1: PathType,
    /// Path offered for v2 (v1 messages: whatever bits 3..2 held, normally 0).
    pub typev2: PathType,
    /// Client Peer ID (zero in a Linux v2-only Proposal).
    pub peer_id: PeerId,
    /// Client preferred GID (zero in a Linux v2-only Proposal).
    pub gid: Gid,
    /// Client preferred RoCE MAC.
    pub mac: Mac,
    /// Layout-specific remainder.
    pub body: ProposalBody,
}

fn need(b: &[u8], end: usize, what: &'static str) -> Result<()> {
    if b.len() < end + 4 {
        // The trailer must still follow; a short message is a length mismatch.
        return Err(Error::BadLength {
            msg: what,
            expected: end + 4,
            got: b.len(),
        });
    }
    Ok(())
}

impl ProposalRepr {
    /// Parses a complete Proposal (header, body and trailer).
    pub fn parse(b: &[u8]) -> Result<ProposalRepr> {
        let h = check_frame(b)?;
        if h.msg_type()? != ClcType::Proposal {
            return Err(Error::UnknownType {
                layer: "CLC Proposal",
                value: b[super::field::TYPE],
            });
        }
        need(b, field::BASE_END, "CLC Proposal")?;
        let version = h.version();
        let typev1 = h.typev1();
        let typev2 = h.typev2();
        let iparea_offset = usize::from(get_u16(b, field::IPAREA_OFFSET));
        let mut pos;
        let body = if version == 1 {
            let area = match iparea_offset {
                0 => V1Area::None,
                40 => {
                    need(b, field::BASE_END + 40, "CLC Proposal SMC-D area")?;
                    if get_u16(b, field::V2_EXT_OFFSET) != 0 {
                        return Err(Error::Inconsistent {
                            field: "v2_ext_offset",
                            why: "non-zero in a version 1 Proposal",
                        });
                    }
                    V1Area::Smcd(SmcdArea::parse(b, field::BASE_END))
                }
                n if n < 40 => {
                    need(b, field::BASE_END + n, "CLC Proposal area")?;
                    let mut a = ArrayVec::new();
                    a.try_extend_from_slice(&b[field::BASE_END..field::BASE_END + n])
                        .map_err(|_| Error::CountOutOfRange {
                            field: "iparea_offset",
                            value: n,
                            min: 0,
                            max: 40,
                        })?;
                    V1Area::Opaque(a)
                }
                n => {
                    return Err(Error::CountOutOfRange {
                        field: "iparea_offset",
                        value: n,
                        min: 0,
                        max: 40,
                    })
                }
            };
            pos = field::BASE_END + iparea_offset;
            let ip = IpArea::parse(b, pos)?;
            pos += ip.len();
            ProposalBody::V1 { area, ip }
        } else {
            need(b, field::BASE_END + field::SMCD_AREA_LEN, "CLC Proposal v2")?;
            let smcd = SmcdArea::parse(b, field::BASE_END);
            pos = field::BASE_END + field::SMCD_AREA_LEN;
            let expected_ipoff = if typev1 == PathType::N { 0 } else { 40 };
            if iparea_offset != expected_ipoff {
                return Err(Error::BadOffset {
                    field: "iparea_offset",
                    expected: expected_ipoff,
                    got: iparea_offset,
                });
            }
            let ip = if typev1 == PathType::N {
                None
            } else {
                let ip = IpArea::parse(b, pos)?;
                pos += ip.len();
                Some(ip)
            };
            let v2_off = usize::from(get_u16(b, field::V2_EXT_OFFSET));
            let v2 = if typev2 == PathType::N {
                if v2_off != 0 {
                    return Err(Error::BadOffset {
                        field: "v2_ext_offset",
                        expected: 0,
                        got: v2_off,
                    });
                }
                None
            } else {
                if v2_off != pos - field::V2_EXT_BASE {
                    return Err(Error::BadOffset {
                        field: "v2_ext_offset",
                        expected: pos - field::V2_EXT_BASE,
                        got: v2_off,
                    });
                }
                let v2 = parse_v2_ext(b, pos, typev2)?;
                pos += v2.len();
                Some(v2)
            };
            ProposalBody::V2 { smcd, ip, v2 }
        };
        if pos + 4 != b.len() {
            return Err(Error::BadLength {
                msg: "CLC Proposal",
                expected: pos + 4,
                got: b.len(),
            });
        }
        Ok(ProposalRepr {
            eyecatcher: h.eyecatcher()?,
            version,
            typev1,
            typev2,
            peer_id: PeerId::read(b, field::PEER_ID),
            gid: Gid(array(b, field::GID)),
            mac: Mac(array(b, field::MAC)),
            body,
        })
    }

    /// Total length on the wire.
    pub fn buffer_len(&self) -> usize {
        let mut n = field::BASE_END + 4;
        match &self.body {
            ProposalBody::V1 { area, ip } => {
                n += v1_area_len(area) + ip.len();
            }
            ProposalBody::V2 { ip, v2, .. } => {
                n += field::SMCD_AREA_LEN;
                n += ip.as_ref().map_or(0, IpArea::len);
                n += v2.as_ref().map_or(0, ProposalV2Ext::len);
            }
        }
        n
    }

    /// Checks that the header version, path types and present parts agree.
    pub fn check_consistent(&self) -> Result<()> {
        check_version(self.version)?;
        match &self.body {
            ProposalBody::V1 { .. } if self.version != 1 => Err(Error::Inconsistent {
                field: "version",
                why: "a v1 body needs header version 1",
            }),
            ProposalBody::V2 { .. } if self.version < 2 => Err(Error::Inconsistent {
                field: "version",
                why: "a v2 body needs header version >= 2",
            }),
            ProposalBody::V2 { ip, v2, .. } => {
                if ip.is_some() != (self.typev1 != PathType::N) {
                    return Err(Error::Inconsistent {
                        field: "typev1",
                        why: "IP area present iff typev1 is not none",
                    });
                }
                if v2.is_some() != (self.typev2 != PathType::N) {
                    return Err(Error::Inconsistent {
                        field: "typev2",
                        why: "v2 extension present iff typev2 is not none",
                    });
                }
                if let Some(v2) = v2 {
                    if v2.smcd.is_some() != self.typev2.has_d() {
                        return Err(Error::Inconsistent {
                            field: "typev2",
                            why: "SMC-Dv2 extension present iff typev2 includes D",
                        });
                    }
                    if v2.release > 15 {
                        return Err(Error::CountOutOfRange {
                            field: "release",
                            value: v2.release.into(),
                            min: 0,
                            max: 15,
                        });
                    }
                }
                Ok(())
            }
            ProposalBody::V1 { .. } => Ok(()),
        }
    }

    /// Writes the Proposal; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        self.check_consistent()?;
        let len = self.buffer_len();
        check_out(buf, len)?;
        let b = &mut buf[..len];
        b.fill(0);
        let byte7 = (self.version << 4) | ((self.typev2 as u8) << 2) | self.typev1 as u8;
        write_frame(b, self.eyecatcher, ClcType::Proposal, len, byte7);
        self.peer_id.write(b, field::PEER_ID);
        b[field::GID..field::GID + 16].copy_from_slice(&self.gid.0);
        b[field::MAC..field::MAC + 6].copy_from_slice(&self.mac.0);
        let mut pos = field::BASE_END;
        match &self.body {
            ProposalBody::V1 { area, ip } => {
                let n = v1_area_len(area);
                put_u16(b, field::IPAREA_OFFSET, n as u16);
                match area {
                    V1Area::None => {}
                    V1Area::Smcd(s) => s.emit(b, pos, 0),
                    V1Area::Opaque(a) => b[pos..pos + a.len()].copy_from_slice(a),
                }
                pos += n;
                ip.emit(b, pos);
            }
            ProposalBody::V2 { smcd, ip, v2 } => {
                let smcd_at = pos;
                pos += field::SMCD_AREA_LEN;
                if let Some(ip) = ip {
                    put_u16(b, field::IPAREA_OFFSET, 40);
                    ip.emit(b, pos);
                    pos += ip.len();
                }
                let v2_off = if v2.is_some() {
                    (pos - field::V2_EXT_BASE) as u16
                } else {
                    0
                };
                smcd.emit(b, smcd_at, v2_off);
                if let Some(v2) = v2 {
                    emit_v2_ext(v2, b, pos);
                }
            }
        }
        Ok(len)
    }
}

fn v1_area_len(a: &V1Area) -> usize {
    match a {
        V1Area::None => 0,
        V1Area::Smcd(_) => 40,
        V1Area::Opaque(o) => o.len(),
    }
}

fn parse_v2_ext(b: &[u8], at: usize, typev2: PathType) -> Result<ProposalV2Ext> {
    need(b, at + field::V2_EXT_LEN, "CLC Proposal v2 extension")?;
    let eid_cnt = usize::from(b[at]);
    let ism_cnt = usize::from(b[at + 1]);
    if eid_cnt > MAX_EIDS {
        return Err(Error::CountOutOfRange {
            field: "eid_cnt",
            value: eid_cnt,
            min: 0,
            max: MAX_EIDS,
        });
    }
    if ism_cnt > MAX_ISM_GIDS {
        return Err(Error::CountOutOfRange {
            field: "ism_gid_cnt",
            value: ism_cnt,
            min: 0,
            max: MAX_ISM_GIDS,
        });
    }
    let flag = b[at + 3];
    let smcd_off = usize::from(get_u16(b, at + 6));
    let mut p = at + field::V2_EXT_LEN;
    need(b, p + Name32::LEN * eid_cnt, "CLC Proposal EID list")?;
    let mut eids = ArrayVec::new();
    for _ in 0..eid_cnt {
        eids.push(Name32(array(b, p)));
        p += Name32::LEN;
    }
    let smcd = if typev2.has_d() {
        // Distance from v2ext+8 to the SMC-Dv2 extension.
        let expected = p - (at + 8);
        if smcd_off != expected {
            return Err(Error::BadOffset {
                field: "smcd_v2_ext_offset",
                expected,
                got: smcd_off,
            });
        }
        need(
            b,
            p + field::SMCD_V2_EXT_LEN + field::ISM_GID_LEN * ism_cnt,
            "CLC Proposal SMC-Dv2 extension",
        )?;
        let system_eid = Name32(array(b, p));
        p += field::SMCD_V2_EXT_LEN;
        let mut ism_gids = ArrayVec::new();
        for _ in 0..ism_cnt {
            ism_gids.push(IsmGid {
                gid: get_u64(b, p),
                chid: get_u16(b, p + 8),
            });
            p += field::ISM_GID_LEN;
        }
        Some(SmcdV2Ext {
            system_eid,
            ism_gids,
        })
    } else {
        if smcd_off != 0 {
            return Err(Error::BadOffset {
                field: "smcd_v2_ext_offset",
                expected: 0,
                got: smcd_off,
            });
        }
        if ism_cnt != 0 {
            return Err(Error::Inconsistent {
                field: "ism_gid_cnt",
                why: "ISM GIDs without an SMC-Dv2 extension",
            });
        }
        None
    };
    Ok(ProposalV2Ext {
        eids,
        release: flag >> 4,
        seid: flag & 0x01 != 0,
        roce_gid: Gid(array(b, at + 8)),
        max_conns: b[at + 24],
        max_links: b[at + 25],
        feature_mask: get_u16(b, at + 26),
        smcd,
    })
}

fn emit_v2_ext(v2: &ProposalV2Ext, b: &mut [u8], at: usize) {
    b[at] = v2.eids.len() as u8;
    b[at + 1] = v2.smcd.as_ref().map_or(0, |d| d.ism_gids.len() as u8);
    b[at + 3] = (v2.release << 4) | u8::from(v2.seid);
    b[at + 8..at + 24].copy_from_slice(&v2.roce_gid.0);
    b[at + 24] = v2.max_conns;
    b[at + 25] = v2.max_links;
    put_u16(b, at + 26, v2.feature_mask);
    let mut p = at + field::V2_EXT_LEN;
    for e in &v2.eids {
        b[p..p + 32].copy_from_slice(&e.0);
        p += Name32::LEN;
    }
    if let Some(d) = &v2.smcd {
        put_u16(b, at + 6, (p - (at + 8)) as u16);
        b[p..p + 32].copy_from_slice(&d.system_eid.0);
        p += field::SMCD_V2_EXT_LEN;
        for g in &d.ism_gids {
            put_u64(b, p, g.gid);
            put_u16(b, p + 8, g.chid);
            p += field::ISM_GID_LEN;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    // k612-pair frame 11: Linux 6.12 v2-only SMC-R Proposal with one UEID.
    const K612_PROPOSAL: &str = "e2d4c3d901009c22000000000000000000000000000000000000000000000000000000000000000000000000000000000000001c00000000000000000000000000000000000000000000000000000000010000100000000000000000000000000000ffff0a630002ff020001000000000000000000000000534d432d504545522d5445535420202020202020202020202020202020202020e2d4c3d9";

    #[test]
    fn linux_v2_only_proposal() {
        let b = hex(K612_PROPOSAL);
        let p = ProposalRepr::parse(&b).unwrap();
        assert_eq!(p.version, 2);
        assert_eq!((p.typev1, p.typev2), (PathType::N, PathType::R));
        let ProposalBody::V2 { ip, v2, .. } = &p.body else {
            panic!("v2 body expected")
        };
        assert!(ip.is_none());
        let v2 = v2.as_ref().unwrap();
        assert_eq!(v2.eids.len(), 1);
        assert_eq!(v2.eids[0].to_string(), "SMC-PEER-TEST");
        assert_eq!(v2.roce_gid.to_string(), "::ffff:10.99.0.2");
        assert_eq!((v2.max_conns, v2.max_links, v2.feature_mask), (255, 2, 1));
        assert_eq!(v2.release, 1);
        let mut out = vec![0u8; p.buffer_len()];
        assert_eq!(p.emit(&mut out).unwrap(), b.len());
        assert_eq!(out, b);
    }

    #[test]
    fn length_and_offset_checks() {
        let b = hex(K612_PROPOSAL);
        let mut bad = b.clone();
        bad[51] = 0x1d; // v2_ext_offset off by one
        assert!(matches!(
            ProposalRepr::parse(&bad),
            Err(Error::BadOffset {
                field: "v2_ext_offset",
                ..
            })
        ));
        let mut bad = b.clone();
        bad[80] = 9; // eid_cnt 9
        assert!(matches!(
            ProposalRepr::parse(&bad),
            Err(Error::CountOutOfRange {
                field: "eid_cnt",
                ..
            })
        ));
        let mut bad = b.clone();
        bad[80] = 2; // eid_cnt 2 but only one EID framed
        assert!(matches!(
            ProposalRepr::parse(&bad),
            Err(Error::BadLength { .. })
        ));
    }
}
