//! Property tests: parse(emit(m)) == m for every message type over generated values;
//! emit(parse(x)) == x for generated valid byte strings; arbitrary bytes never panic any
//! parser, and whatever parses re-emits to something that parses to the same value.

use arrayvec::ArrayVec;
use proptest::collection::vec;
use proptest::prelude::*;
use smc_wire::cdc::{CdcMessage, CdcRepr, ConnStateFlags, Cursor, ProducerFlags};
use smc_wire::clc::{
    self, AcceptConfirmRepr, AcceptV2, ClcMessage, ClcType, DeclineRepr, Eyecatcher,
    FirstContactExt, IpArea, Ipv6Prefix, IsmGid, PathType, ProposalBody, ProposalRepr,
    ProposalV2Ext, SmcdArea, SmcdV2Ext, V1Area,
};
use smc_wire::common::{BufSize, ByteOrder, Gid, Mac, Name32, PeerId, U24};
use smc_wire::decline::DeclineCode;
use smc_wire::llc::{
    AddLink, AddLinkCont, AddLinkRtoken, AddLinkV2Ext, ConfirmLink, ConfirmRkey, ConfirmRkeyCont,
    DeleteLink, DeleteLinkReason, DeleteRkey, DeleteRkeyV2, Dialect, LlcFormat, LlcMessage,
    OtherLinkRkey, ReqAddLink, RkeyList, RtokenList, TestLink,
};
use smc_wire::{tcp_option, ControlMessage};

// ---------- field strategies ----------

fn u24() -> impl Strategy<Value = U24> {
    (0u32..1 << 24).prop_map(|v| U24::new(v).unwrap())
}
fn gid() -> impl Strategy<Value = Gid> {
    any::<[u8; 16]>().prop_map(Gid)
}
fn mac() -> impl Strategy<Value = Mac> {
    any::<[u8; 6]>().prop_map(Mac)
}
fn peer_id() -> impl Strategy<Value = PeerId> {
    (any::<u16>(), mac()).prop_map(|(instance, mac)| PeerId { instance, mac })
}
fn name32() -> impl Strategy<Value = Name32> {
    any::<[u8; 32]>().prop_map(Name32)
}
fn path_type() -> impl Strategy<Value = PathType> {
    (0u8..4).prop_map(PathType::from_bits)
}
fn bufsize() -> impl Strategy<Value = BufSize> {
    (0u8..16).prop_map(|c| BufSize::from_code(c, 15).unwrap())
}
fn eyecatcher() -> impl Strategy<Value = Eyecatcher> {
    prop_oneof![Just(Eyecatcher::Smcr), Just(Eyecatcher::Smcd)]
}
fn arrayvec<T: std::fmt::Debug + Clone, const N: usize>(
    s: impl Strategy<Value = T>,
) -> impl Strategy<Value = ArrayVec<T, N>> {
    vec(s, 0..=N).prop_map(|v| v.into_iter().collect())
}

fn ip_area() -> impl Strategy<Value = IpArea> {
    (
        any::<[u8; 4]>(),
        0u8..=32,
        arrayvec::<_, 8>(
            (any::<[u8; 16]>(), 0u8..=128).prop_map(|(p, len)| Ipv6Prefix {
                prefix: p.into(),
                len,
            }),
        ),
    )
        .prop_map(|(s, prefix_len, ipv6_prefixes)| IpArea {
            subnet: s.into(),
            prefix_len,
            ipv6_prefixes,
        })
}

fn smcd_area() -> impl Strategy<Value = SmcdArea> {
    (
        any::<u64>(),
        any::<u16>(),
        any::<[u8; 3]>(),
        any::<[u8; 5]>(),
        any::<[u8; 20]>(),
    )
        .prop_map(
            |(ism_gid, chid, vendor_oui, vendor_exp_options, reserved)| SmcdArea {
                ism_gid,
                chid,
                vendor_oui,
                vendor_exp_options,
                reserved,
            },
        )
}

fn v2_ext(with_smcd: bool) -> impl Strategy<Value = ProposalV2Ext> {
    let smcd =
        (name32(), arrayvec::<_, 8>((any::<u64>(), any::<u16>()))).prop_map(|(system_eid, g)| {
            SmcdV2Ext {
                system_eid,
                ism_gids: g
                    .into_iter()
                    .map(|(gid, chid)| IsmGid { gid, chid })
                    .collect(),
            }
        });
    (
        arrayvec::<_, 8>(name32()),
        0u8..16,
        any::<bool>(),
        gid(),
        any::<(u8, u8, u16)>(),
        smcd,
    )
        .prop_map(
            move |(eids, release, seid, roce_gid, (mc, ml, fm), smcd)| ProposalV2Ext {
                eids,
                release,
                seid,
                roce_gid,
                max_conns: mc,
                max_links: ml,
                feature_mask: fm,
                smcd: with_smcd.then_some(smcd),
            },
        )
}

fn proposal() -> impl Strategy<Value = ProposalRepr> {
    let head = || {
        (
            eyecatcher(),
            peer_id(),
            gid(),
            mac(),
            path_type(),
            path_type(),
        )
    };
    let v1 = (
        head(),
        prop_oneof![
            Just(V1Area::None),
            smcd_area().prop_map(V1Area::Smcd),
            vec(any::<u8>(), 1..40).prop_map(|v| V1Area::Opaque(v.into_iter().collect())),
        ],
        ip_area(),
    )
        .prop_map(|((ec, pid, g, m, t1, t2), area, ip)| ProposalRepr {
            eyecatcher: ec,
            version: 1,
            typev1: t1,
            typev2: t2,
            peer_id: pid,
            gid: g,
            mac: m,
            body: ProposalBody::V1 { area, ip },
        });
    let v2 = (head(), 2u8..16)
        .prop_flat_map(|((ec, pid, g, m, t1, t2), version)| {
            (
                Just((ec, pid, g, m, t1, t2, version)),
                smcd_area(),
                proptest::option::of(ip_area()),
                v2_ext(t2.has_d()),
            )
        })
        .prop_map(|((ec, pid, g, m, t1, t2, version), smcd, ip, v2)| {
            // Presence follows the path types (Linux smc_clc_send_proposal).
            let ip = if t1 == PathType::N {
                None
            } else {
                Some(ip.unwrap_or(IpArea {
                    subnet: [0; 4].into(),
                    prefix_len: 0,
                    ipv6_prefixes: ArrayVec::new(),
                }))
            };
            ProposalRepr {
                eyecatcher: ec,
                version,
                typev1: t1,
                typev2: t2,
                peer_id: pid,
                gid: g,
                mac: m,
                body: ProposalBody::V2 {
                    smcd,
                    ip,
                    v2: (t2 != PathType::N).then_some(v2),
                },
            }
        });
    prop_oneof![v1, v2]
}

fn fce() -> impl Strategy<Value = FirstContactExt> {
    (
        any::<bool>(),
        0u8..16,
        0u8..16,
        name32(),
        any::<(u8, u8, u16, u32)>(),
    )
        .prop_map(
            |(v2_direct, os_type, release, hostname, (mc, ml, fm, vx))| FirstContactExt {
                v2_direct,
                os_type,
                release,
                hostname,
                max_conns: mc,
                max_links: ml,
                feature_mask: fm,
                vendor_exp_options: vx,
            },
        )
}

fn accept(ty: ClcType) -> impl Strategy<Value = AcceptConfirmRepr> {
    let fixed = (
        peer_id(),
        gid(),
        mac(),
        (2u32..1 << 24).prop_map(|v| U24::new(v).unwrap()),
        any::<(u32, u8, u32, u64)>().prop_map(|(k, i, t, v)| (k, i.max(1), t, v)),
        bufsize(),
        u24(),
    );
    (
        1u8..16,
        any::<bool>(),
        fixed,
        0u8..16,
        name32(),
        proptest::option::of(fce()),
        arrayvec::<_, 8>(gid()),
        any::<bool>(),
    )
        .prop_map(
            move |(
                version,
                fc,
                (p, g, m, qpn, (rkey, idx, tok, va), size, psn),
                mtu,
                eid,
                fce,
                gids,
                with_gids,
            )| {
                let v2 = (version >= 2).then(|| AcceptV2 {
                    eid,
                    fce,
                    gid_list: (ty == ClcType::Confirm && fce.is_some() && with_gids)
                        .then_some(gids),
                });
                AcceptConfirmRepr {
                    version,
                    first_contact: fc,
                    peer_id: p,
                    gid: g,
                    mac: m,
                    qpn,
                    rmb_rkey: rkey,
                    rmbe_idx: idx,
                    rmbe_alert_token: tok,
                    rmbe_size: size,
                    // First contact validates the MTU (reserved → Decline).
                    qp_mtu: if fc { 1 + mtu % 5 } else { mtu },
                    rmb_vaddr: va,
                    psn,
                    v2,
                }
            },
        )
}

fn decline() -> impl Strategy<Value = DeclineRepr> {
    (
        eyecatcher(),
        1u8..16,
        any::<bool>(),
        peer_id(),
        prop_oneof![
            (0..DeclineCode::ALL.len()).prop_map(|i| DeclineCode::ALL[i]),
            any::<u32>().prop_map(DeclineCode)
        ],
        0u8..16,
        any::<[u32; 4]>(),
    )
        .prop_map(|(ec, version, oos, p, d, os, d2)| DeclineRepr {
            eyecatcher: ec,
            version,
            out_of_sync: oos,
            peer_id: p,
            diagnosis: d,
            os_type: os,
            diagnosis_v2: (version >= 2).then_some(d2),
        })
}

fn clc_message() -> impl Strategy<Value = ClcMessage> {
    prop_oneof![
        proposal().prop_map(ClcMessage::Proposal),
        accept(ClcType::Accept).prop_map(ClcMessage::Accept),
        accept(ClcType::Confirm).prop_map(ClcMessage::Confirm),
        decline().prop_map(ClcMessage::Decline),
    ]
}

fn llc_format() -> impl Strategy<Value = LlcFormat> {
    (any::<bool>(), any::<bool>()).prop_map(|(linux, le)| LlcFormat {
        dialect: if linux {
            Dialect::Linux
        } else {
            Dialect::Rfc7609
        },
        v2_byte_order: if le {
            ByteOrder::Little
        } else {
            ByteOrder::Big
        },
    })
}

fn rtoken() -> impl Strategy<Value = AddLinkRtoken> {
    any::<(u32, u32, u64)>().prop_map(|(a, b, c)| AddLinkRtoken {
        rmb_key: a,
        rmb_key_new: b,
        rmb_vaddr_new: c,
    })
}

fn other() -> impl Strategy<Value = OtherLinkRkey> {
    any::<(u8, u32, u64)>().prop_map(|(link_num, rkey, vaddr)| OtherLinkRkey {
        link_num,
        rkey,
        vaddr,
    })
}

/// Owned inputs for the LLC messages that borrow their lists.
#[derive(Debug, Clone)]
struct LlcSpec {
    fmt: LlcFormat,
    which: u8,
    v2: bool,
    flags: [bool; 4],
    mac: Mac,
    gid: Gid,
    gid2: Gid,
    qpn: U24,
    psn: U24,
    bytes: [u8; 16],
    small: [u8; 4],
    word: u32,
    va: u64,
    rtokens: Vec<AddLinkRtoken>,
    rkeys: Vec<u32>,
    gids: ArrayVec<Gid, 8>,
    others: [OtherLinkRkey; 3],
    with_ext: bool,
}

fn llc_spec() -> impl Strategy<Value = LlcSpec> {
    (
        (llc_format(), 0u8..10, any::<bool>(), any::<[bool; 4]>()),
        (mac(), gid(), gid(), u24(), u24()),
        (
            any::<[u8; 16]>(),
            any::<[u8; 4]>(),
            any::<u32>(),
            any::<u64>(),
        ),
        (
            vec(rtoken(), 0..40),
            vec(any::<u32>(), 0..=255),
            arrayvec::<_, 8>(gid()),
        ),
        ([other(), other(), other()], any::<bool>()),
    )
        .prop_map(
            |(
                (fmt, which, v2, flags),
                (mac, gid, gid2, qpn, psn),
                (bytes, small, word, va),
                (rtokens, rkeys, gids),
                (others, with_ext),
            )| LlcSpec {
                fmt,
                which,
                v2,
                flags,
                mac,
                gid,
                gid2,
                qpn,
                psn,
                bytes,
                small,
                word,
                va,
                rtokens,
                rkeys,
                gids,
                others,
                with_ext,
            },
        )
}

/// Builds one valid LLC message of kind `s.which` from the spec.
fn build(s: &LlcSpec) -> LlcMessage<'_> {
    let [f0, f1, f2, f3] = s.flags;
    let linux = s.fmt.dialect == Dialect::Linux;
    match s.which {
        0 => LlcMessage::ConfirmLink(ConfirmLink {
            v2: s.v2,
            response: f0,
            no_rmbe_eyecatcher: (linux || s.v2) && f1,
            mac: s.mac,
            gid: s.gid,
            qpn: s.qpn,
            link_num: s.small[0].max(1),
            link_uid: s.word,
            max_links: s.small[1],
            max_conns: if linux || s.v2 { s.small[2] } else { 0 },
        }),
        1 => LlcMessage::AddLink(AddLink {
            v2: s.v2,
            response: f0,
            reject: f1,
            reject_reason: if s.v2 { 0 } else { s.small[0] & 0x0F },
            mac: s.mac,
            gid: s.gid,
            qpn: s.qpn,
            link_num: s.small[1],
            qp_mtu: s.small[2] & 0x0F,
            psn: s.psn,
            ext: (s.v2 && s.with_ext).then_some(AddLinkV2Ext {
                v2_direct: f2,
                client_target_gid: s.gid2,
                rtokens: RtokenList::Slice(&s.rtokens),
            }),
        }),
        2 => LlcMessage::AddLinkCont(AddLinkCont {
            response: f0,
            link_num: s.small[0],
            num_rkeys: s.small[1],
            rtokens: [
                s.rtokens.first().copied().unwrap_or_default(),
                s.rtokens.get(1).copied().unwrap_or_default(),
            ],
        }),
        3 => LlcMessage::DeleteLink(DeleteLink {
            v2: s.v2,
            response: f0,
            all: f1,
            orderly: f2,
            link_num: s.small[0],
            reason: DeleteLinkReason(s.word),
        }),
        4 => LlcMessage::ReqAddLink(ReqAddLink {
            response: f0,
            other_flags: s.small[3] & 0x7F,
            gids: s.gids.clone(),
        }),
        5 => LlcMessage::ConfirmRkey(ConfirmRkey {
            v2: s.v2,
            response: f0,
            negative: f1,
            retry: f2,
            num_tokens: s.small[0] % 8,
            rkey: s.word,
            vaddr: s.va,
            others: [s.others[0], s.others[1]],
        }),
        6 => LlcMessage::ConfirmRkeyCont(ConfirmRkeyCont {
            response: f0,
            negative: f1,
            num_left: s.small[0],
            others: s.others,
        }),
        7 => LlcMessage::DeleteRkey(DeleteRkey {
            response: f0,
            negative: f1,
            count: 1 + s.small[0] % 8,
            err_mask: s.small[1],
            rkeys: std::array::from_fn(|i| s.rkeys.get(i).copied().unwrap_or(0)),
        }),
        8 => LlcMessage::DeleteRkeyV2(DeleteRkeyV2 {
            response: f0,
            negative: f3,
            num_inval_rkeys: s.small[0],
            rkeys: RkeyList::Slice(&s.rkeys),
        }),
        _ => LlcMessage::TestLink(TestLink {
            v2: s.v2,
            response: f0,
            user_data: s.bytes,
        }),
    }
}

fn cdc() -> impl Strategy<Value = CdcRepr> {
    any::<(u16, u32, u16, u32, u16, u32, u8, u8)>().prop_map(
        |(seq, tok, pw, pc, cw, cc, pf, cf)| CdcRepr {
            seqno: seq,
            token: tok,
            prod: Cursor {
                wrap: pw,
                count: pc,
            },
            cons: Cursor {
                wrap: cw,
                count: cc,
            },
            prod_flags: ProducerFlags::from_bits_truncate(pf),
            conn_flags: ConnStateFlags::from_bits_truncate(cf),
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    // ---------- parse(emit(m)) == m ----------

    #[test]
    fn clc_value_round_trip(m in clc_message()) {
        let bytes = m.to_vec().unwrap();
        prop_assert_eq!(bytes.len(), m.buffer_len());
        prop_assert_eq!(clc::message_len(&bytes[..8]).unwrap(), bytes.len());
        let back = ClcMessage::parse(&bytes).unwrap();
        prop_assert_eq!(&back, &m);
        // ... and emit(parse(x)) == x for the valid byte strings so generated.
        prop_assert_eq!(back.to_vec().unwrap(), bytes);
    }

    #[test]
    fn llc_value_round_trip(s in llc_spec()) {
        let m = build(&s);
        let mut buf = vec![0u8; m.buffer_len()];
        let n = m.emit(&mut buf, s.fmt).unwrap();
        prop_assert_eq!(n, buf.len());
        let back = LlcMessage::parse(&buf, s.fmt).unwrap();
        prop_assert_eq!(&back, &m);
        let mut again = vec![0u8; back.buffer_len()];
        back.emit(&mut again, s.fmt).unwrap();
        prop_assert_eq!(again, buf);
    }

    #[test]
    fn cdc_value_round_trip(c in cdc()) {
        let mut buf = [0u8; 44];
        c.emit(&mut buf).unwrap();
        prop_assert_eq!(CdcRepr::parse_bytes(&buf).unwrap(), c);
        let v = CdcMessage::new_checked(&buf[..]).unwrap();
        prop_assert_eq!((v.seqno(), v.token(), v.prod(), v.cons()), (c.seqno, c.token, c.prod, c.cons));
    }

    #[test]
    fn smcd_accept_is_never_smc_r(body in vec(any::<u8>(), 36..=280), accept in any::<bool>(), v in 1u8..16) {
        let len = 8 + body.len() + 4;
        let mut b = vec![0xE2, 0xD4, 0xC3, 0xC4, if accept { 2 } else { 3 }];
        b.extend_from_slice(&(len as u16).to_be_bytes());
        b.push(v << 4);
        b.extend_from_slice(&body);
        b.extend_from_slice(&[0xE2, 0xD4, 0xC3, 0xC4]);
        let m = ClcMessage::parse(&b).unwrap();
        prop_assert!(matches!(m, ClcMessage::OtherPath(_)));
        prop_assert_eq!(m.to_vec().unwrap(), b);
    }

    // ---------- emit(parse(x)) == x for generated valid byte strings ----------

    #[test]
    fn cdc_bytes_round_trip(mut b in any::<[u8; 44]>()) {
        // A valid CDC: type, length, reserved bytes zero, reserved flag bits zero.
        b[0] = 0xFE;
        b[1] = 44;
        b[8] = 0; b[9] = 0; b[16] = 0; b[17] = 0;
        b[24] &= 0xF8;
        b[25] &= 0xE0;
        b[26..].fill(0);
        let c = CdcRepr::parse_bytes(&b).unwrap();
        let mut out = [0u8; 44];
        c.emit(&mut out).unwrap();
        prop_assert_eq!(out, b);
    }

    #[test]
    fn llc_fixed_bytes_round_trip(mut b in any::<[u8; 44]>(), t in prop_oneof![Just(4u8), Just(7u8), Just(0x24u8), Just(0x27u8)], le in any::<bool>()) {
        // DELETE LINK and TEST LINK: every non-reserved byte may hold anything.
        let fmt = if le { LlcFormat::LINUX_X86 } else { LlcFormat::LINUX_BE };
        b[0] = t;
        if t & 0x20 != 0 {
            let l = if le { 44u16.to_le_bytes() } else { 44u16.to_be_bytes() };
            b[1] = l[0];
            b[2] = l[1];
        } else {
            b[1] = 44;
            b[2] = 0;
        }
        if t & 0x0F == 4 {
            b[3] &= 0xE0;
            b[9..].fill(0);
        } else {
            b[3] &= 0x80;
            b[20..].fill(0);
        }
        let m = LlcMessage::parse(&b, fmt).unwrap();
        let mut out = [0u8; 44];
        m.emit(&mut out, fmt).unwrap();
        prop_assert_eq!(out, b);
    }

    #[test]
    fn tcp_option_emitted_is_found(prefix in vec(prop_oneof![Just(vec![1u8]), Just(vec![2, 4, 5, 0xb4]), Just(vec![254, 4, 1, 2]), Just(vec![3, 3, 7])], 0..5)) {
        let mut opts: Vec<u8> = prefix.concat();
        let at = opts.len();
        let mut o = [0u8; 8];
        tcp_option::emit_aligned(&mut o).unwrap();
        opts.extend_from_slice(&o);
        prop_assert_eq!(tcp_option::scan(&opts), Ok(tcp_option::Scan::Found(at + 2)));
    }

    // ---------- arbitrary bytes never panic; what parses is stable ----------

    #[test]
    fn arbitrary_bytes_clc(b in vec(any::<u8>(), 0..700)) {
        let _ = clc::message_len(&b);
        if let Ok(m) = ClcMessage::parse(&b) {
            let out = m.to_vec().unwrap();
            prop_assert_eq!(ClcMessage::parse(&out).unwrap(), m);
        }
    }

    #[test]
    fn arbitrary_clc_framed(ty in 1u8..=4, v in any::<u8>(), body in vec(any::<u8>(), 0..400), ec in any::<bool>()) {
        // Well-framed messages with random bodies reach the body parsers.
        let e = if ec { [0xE2, 0xD4, 0xC3, 0xD9] } else { [0xE2, 0xD4, 0xC3, 0xC4] };
        let len = 8 + body.len() + 4;
        let mut b = e.to_vec();
        b.push(ty);
        b.extend_from_slice(&(len as u16).to_be_bytes());
        b.push(v);
        b.extend_from_slice(&body);
        b.extend_from_slice(&e);
        if let Ok(m) = ClcMessage::parse(&b) {
            let out = m.to_vec().unwrap();
            prop_assert_eq!(ClcMessage::parse(&out).unwrap(), m);
        }
    }

    #[test]
    fn arbitrary_bytes_llc_cdc(b in vec(any::<u8>(), 0..200), fmt in llc_format(), t in any::<u8>(), tweak in any::<bool>()) {
        let mut b = b;
        if tweak && b.len() >= 3 {
            // Bias towards known types with a matching length field.
            b[0] = t;
            b[1] = 44;
            if t & 0x20 != 0 {
                let n = b.len();
                fmt.v2_byte_order_put(&mut b, n);
            }
        }
        let _ = CdcRepr::parse_bytes(&b);
        let _ = tcp_option::scan(&b);
        if let Ok(m) = ControlMessage::parse(&b, fmt) {
            let mut out = vec![0u8; m.buffer_len()];
            m.emit(&mut out, fmt).unwrap();
            prop_assert_eq!(ControlMessage::parse(&out, fmt).unwrap(), m);
        }
    }
}

/// Test helper: write `len` as a v2 LLC length in the format's byte order.
trait PutLen {
    fn v2_byte_order_put(&self, b: &mut [u8], len: usize);
}
impl PutLen for LlcFormat {
    fn v2_byte_order_put(&self, b: &mut [u8], len: usize) {
        let l = (len.min(8192) as u16).max(44);
        let x = match self.v2_byte_order {
            ByteOrder::Little => l.to_le_bytes(),
            ByteOrder::Big => l.to_be_bytes(),
        };
        b[1] = x[0];
        b[2] = x[1];
    }
}

// ---------- smc-rs same-host extension ----------

proptest! {
    /// The offer survives a whole Proposal round trip, and a Proposal whose SMC-D area
    /// carries it still parses as the same Proposal (Linux sees only reserved bytes).
    #[test]
    fn same_host_offer_rides_in_a_proposal(p in proposal(), stack_id in any::<u64>(), nonce in any::<u64>()) {
        let mut p = p;
        let offer = clc::SameHostOffer { stack_id, nonce };
        let area = match &mut p.body {
            ProposalBody::V2 { smcd, .. } => Some(smcd),
            ProposalBody::V1 { area: V1Area::Smcd(smcd), .. } => Some(smcd),
            _ => None,
        };
        if let Some(a) = area {
            offer.emit_into(a);
            let mut b = vec![0u8; p.buffer_len()];
            let n = p.emit(&mut b).unwrap();
            let q = ProposalRepr::parse(&b[..n]).unwrap();
            prop_assert_eq!(&q, &p);
            let got = match &q.body {
                ProposalBody::V2 { smcd, .. } => clc::SameHostOffer::from_smcd_area(smcd),
                ProposalBody::V1 { area: V1Area::Smcd(smcd), .. } => clc::SameHostOffer::from_smcd_area(smcd),
                _ => None,
            };
            prop_assert_eq!(got, Some(offer));
        }
    }

    #[test]
    fn same_host_accept_round_trip(stack_id in any::<u64>(), nonce in any::<u64>()) {
        let m = ClcMessage::SameHostAccept(clc::SameHostAcceptRepr { stack_id, nonce });
        let b = m.to_vec().unwrap();
        prop_assert_eq!(b.len(), 28);
        prop_assert_eq!(clc::message_len(&b).unwrap(), 28);
        prop_assert_eq!(ClcMessage::parse(&b).unwrap(), m);
    }

    #[test]
    fn same_host_hello_round_trip_and_garbage(nonce in any::<u64>(), token in any::<u32>(),
        rmb_len in any::<u32>(), status in any::<u32>(), region in any::<u32>(),
        junk in vec(any::<u8>(), 0..64)) {
        let h = clc::SameHostHello { nonce, token, rmb_len, status, region };
        prop_assert_eq!(clc::SameHostHello::parse(&h.to_bytes()).unwrap(), h);
        if let Ok(x) = clc::SameHostHello::parse(&junk) {
            prop_assert_eq!(clc::SameHostHello::parse(&x.to_bytes()).unwrap(), x);
        }
    }
}
