//! The decisions of the rendezvous as plain functions: which version the server
//! answers in, the v1 same-LAN check, and the SMCv2.1 limit rules of both roles.

use ::core::net::IpAddr;

use smc_wire::clc::{
    Eyecatcher, FirstContactExt, IpArea, PathType, ProposalBody, ProposalRepr, ProposalV2Ext,
};
use smc_wire::common::Gid;
use smc_wire::decline::DeclineCode;

use super::config::{
    ClcConfig, LINUX_MAX_LINKS_PER_LGR, MAX_CONNS_PER_LGR, MIN_CONNS_PER_LGR, MIN_LINKS_PER_LGR,
};
use super::env::{LocalPrefix, ServerRoute, V2Params, V2Route};

/// The server's answer to a Proposal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Choice {
    /// SMC-Rv2 with these parameters, reaching the client's GID this way.
    V2 {
        params: V2Params,
        route: V2Route,
        client_gid: Gid,
    },
    /// SMC-Rv1.
    V1,
}

/// What a Proposal offers for SMC-R.
pub(crate) struct Offer<'a> {
    pub v1: Option<&'a IpArea>,
    pub v1_offered: bool,
    pub v2: Option<&'a ProposalV2Ext>,
    pub smcd_only: bool,
}

/// Reads what a Proposal offers. Version 1 (RFC 7609): byte 7's low bits are reserved
/// (CLC-G3), so SMC-R is offered unless the message is Linux SMC-D (eye catcher "SMCD"
/// or type D). Version ≥ 2 (Linux): `typev1` / `typev2` say it.
pub(crate) fn offer(p: &ProposalRepr) -> Offer<'_> {
    match &p.body {
        ProposalBody::V1 { ip, .. } => {
            let r = p.eyecatcher == Eyecatcher::Smcr && p.typev1 != PathType::D;
            Offer {
                v1: r.then_some(ip),
                v1_offered: r,
                v2: None,
                smcd_only: !r,
            }
        }
        ProposalBody::V2 { ip, v2, .. } => {
            let v1 = if p.typev1.has_r() { ip.as_ref() } else { None };
            let v2r = if p.typev2.has_r() { v2.as_ref() } else { None };
            Offer {
                v1,
                v1_offered: p.typev1.has_r(),
                v2: v2r,
                smcd_only: !p.typev1.has_r()
                    && !p.typev2.has_r()
                    && (p.typev1.has_d() || p.typev2.has_d()),
            }
        }
    }
}

/// RFC 7609 §3.5.1.2 same-LAN check (Linux `smc_clc_prfx_match`): IPv4 — an interface
/// address whose prefix length equals the client's and whose network equals the
/// client's subnet; IPv6 — an interface address (not link-local) inside one of the
/// client's prefixes, with the same length. A Proposal with neither cannot match.
pub(crate) fn same_lan(ip: &IpArea, local: &[LocalPrefix]) -> bool {
    if ip.ipv6_prefixes.is_empty() {
        let client = u32::from(ip.subnet);
        local.iter().any(|l| match l.addr {
            IpAddr::V4(a) if l.prefix_len == ip.prefix_len && l.prefix_len <= 32 => {
                let mask = mask32(l.prefix_len);
                (u32::from(a) ^ client) & mask == 0
            }
            _ => false,
        })
    } else {
        local.iter().any(|l| match l.addr {
            IpAddr::V6(a) if l.prefix_len <= 128 && !is_link_local(a) => {
                ip.ipv6_prefixes.iter().any(|p| {
                    p.len == l.prefix_len
                        && (u128::from(a) ^ u128::from(p.prefix)) & mask128(p.len) == 0
                })
            }
            _ => false,
        })
    }
}

fn is_link_local(a: ::core::net::Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}

fn mask32(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len.min(32)))
    }
}

fn mask128(len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(len.min(128)))
    }
}

/// The server's v2.1 rules (Linux `smc_clc_srv_v2x_features_validate`): release =
/// min(offered, ours); from release 1 on, `max_conns` and `max_links` are the minimum of
/// both sides and must be at least 16 and 1.
pub(crate) fn server_v2_limits(
    ext: &ProposalV2Ext,
    cfg: &ClcConfig,
) -> Result<(u8, u8, u8), DeclineCode> {
    let release = ext.release.min(cfg.v2_config.release);
    if release == 0 {
        return Ok((0, MAX_CONNS_PER_LGR, LINUX_MAX_LINKS_PER_LGR));
    }
    let max_conns = ext.max_conns.min(cfg.v2_config.max_conns);
    if max_conns < MIN_CONNS_PER_LGR {
        return Err(DeclineCode::MAXCONNERR);
    }
    let max_links = ext.max_links.min(cfg.v2_config.max_links);
    if max_links < MIN_LINKS_PER_LGR {
        return Err(DeclineCode::MAXLINKERR);
    }
    Ok((release, max_conns, max_links))
}

/// Why the server could not use one version.
#[derive(Clone, Copy, Debug)]
struct Refusal(DeclineCode);

/// The server's choice of version and parameters for a Proposal, or the Decline code.
///
/// v2 is tried first (highest common version, Linux `smc_listen_find_device`), then v1.
/// When neither works the code is, in this order: the v1 subnet mismatch (Linux checks
/// the prefix first), the v2 reason, the v1 reason.
pub(crate) fn server_choose(
    p: &ProposalRepr,
    cfg: &ClcConfig,
    route: &ServerRoute,
    mut route_v2: impl FnMut(Gid) -> Option<V2Route>,
) -> Result<Choice, DeclineCode> {
    let o = offer(p);
    if o.smcd_only {
        // Linux without an ISM device: "no SMC-D device".
        return Err(DeclineCode::NOSMCDDEV);
    }
    if !o.v1_offered && o.v2.is_none() {
        return Err(DeclineCode::PEERNOSMC);
    }
    let mut v2_refusal = None;
    if let Some(ext) = o.v2 {
        match server_try_v2(ext, cfg, route, &mut route_v2) {
            Ok(c) => return Ok(c),
            Err(r) => v2_refusal = Some(r),
        }
    }
    let mut v1_refusal = None;
    if o.v1_offered {
        match server_try_v1(o.v1, cfg, route) {
            Ok(()) => return Ok(Choice::V1),
            Err(r) => v1_refusal = Some(r),
        }
    }
    if let Some(Refusal(DeclineCode::DIFFPREFIX)) = v1_refusal {
        return Err(DeclineCode::DIFFPREFIX);
    }
    Err(v2_refusal
        .or(v1_refusal)
        .map_or(DeclineCode::NOSMCDEV, |r| r.0))
}

fn server_try_v2(
    ext: &ProposalV2Ext,
    cfg: &ClcConfig,
    route: &ServerRoute,
    route_v2: &mut impl FnMut(Gid) -> Option<V2Route>,
) -> Result<Choice, Refusal> {
    if !cfg.v2 {
        return Err(Refusal(DeclineCode::VERSMISMAT));
    }
    // Linux `smc_listen_v2_check`: a v2 offer without any EID → NOUEID.
    if ext.eids.is_empty() {
        return Err(Refusal(DeclineCode::NOUEID));
    }
    // Linux `smc_find_rdma_v2_device_serv`: no common EID → "not found", which
    // `smc_listen_find_device` turns into its default NOSMCDEV (kernel-peer §V4(f)).
    let eid = cfg
        .v2_config
        .ueids
        .first_common(ext.eids.iter())
        .ok_or(Refusal(DeclineCode::NOSMCDEV))?;
    let (release, max_conns, max_links) = server_v2_limits(ext, cfg).map_err(Refusal)?;
    if !route.v2 {
        return Err(Refusal(DeclineCode::NOSMCRDEV));
    }
    let r = route_v2(ext.roce_gid).ok_or(Refusal(DeclineCode::NOSMCRDEV))?;
    Ok(Choice::V2 {
        params: V2Params {
            eid,
            release,
            max_conns,
            max_links,
            feature_mask: if release >= 1 {
                cfg.v2_config.feature_mask
            } else {
                0
            },
        },
        route: r,
        client_gid: ext.roce_gid,
    })
}

fn server_try_v1(ip: Option<&IpArea>, cfg: &ClcConfig, route: &ServerRoute) -> Result<(), Refusal> {
    if !cfg.v1 {
        return Err(Refusal(DeclineCode::VERSMISMAT));
    }
    let prefixes = route
        .v1_prefixes
        .as_ref()
        .ok_or(Refusal(DeclineCode::NOSMCRDEV))?;
    match ip {
        Some(ip) if same_lan(ip, prefixes) => Ok(()),
        _ => Err(Refusal(DeclineCode::DIFFPREFIX)),
    }
}

/// What the client offered in its v2 extension (for checking the Accept).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct V2Offered {
    pub release: u8,
    pub max_conns: u8,
    pub max_links: u8,
    pub feature_mask: u16,
}

/// The client's checks of a first-contact v2 Accept's extension (Linux
/// `smc_clc_clnt_v2x_features_validate`, plus: nothing above what we offered).
/// Returns (release, max_conns, max_links, feature_mask).
pub(crate) fn client_v2_limits(
    fce: &FirstContactExt,
    offered: &V2Offered,
) -> Result<(u8, u8, u8, u16), DeclineCode> {
    if fce.release > offered.release {
        return Err(DeclineCode::RELEASEERR);
    }
    if fce.release == 0 {
        return Ok((0, MAX_CONNS_PER_LGR, LINUX_MAX_LINKS_PER_LGR, 0));
    }
    if fce.max_conns < MIN_CONNS_PER_LGR || fce.max_conns > offered.max_conns {
        return Err(DeclineCode::MAXCONNERR);
    }
    if fce.max_links < MIN_LINKS_PER_LGR || fce.max_links > offered.max_links {
        return Err(DeclineCode::MAXLINKERR);
    }
    Ok((
        fce.release,
        fce.max_conns,
        fce.max_links,
        fce.feature_mask & offered.feature_mask,
    ))
}

/// The server's check of a first-contact v2 Confirm (Linux
/// `smc_clc_v2x_features_confirm_check`): the same release, and from release 1 on the
/// same limits. Returns the feature mask the client settled on.
pub(crate) fn server_confirm_check(
    fce: Option<&FirstContactExt>,
    negotiated: &V2Params,
) -> Result<u16, DeclineCode> {
    let fce = fce.ok_or(DeclineCode::RELEASEERR)?;
    if fce.release != negotiated.release {
        return Err(DeclineCode::RELEASEERR);
    }
    if fce.release == 0 {
        return Ok(0);
    }
    if fce.max_conns != negotiated.max_conns {
        return Err(DeclineCode::MAXCONNERR);
    }
    if fce.max_links != negotiated.max_links {
        return Err(DeclineCode::MAXLINKERR);
    }
    Ok(fce.feature_mask & negotiated.feature_mask)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::core::net::{Ipv4Addr, Ipv6Addr};
    use arrayvec::ArrayVec;
    use smc_wire::clc::Ipv6Prefix;

    fn v4(subnet: [u8; 4], prefix_len: u8) -> IpArea {
        IpArea {
            subnet: Ipv4Addr::from(subnet),
            prefix_len,
            ipv6_prefixes: ArrayVec::new(),
        }
    }

    fn lp(addr: &str, prefix_len: u8) -> LocalPrefix {
        LocalPrefix {
            addr: addr.parse().unwrap(),
            prefix_len,
        }
    }

    #[test]
    fn ipv4_subnet_and_prefix_length_must_match() {
        let local = [lp("10.99.0.1", 24), lp("192.168.7.9", 16)];
        assert!(same_lan(&v4([10, 99, 0, 0], 24), &local));
        assert!(same_lan(&v4([192, 168, 0, 0], 16), &local));
        assert!(!same_lan(&v4([10, 99, 1, 0], 24), &local), "other subnet");
        assert!(
            !same_lan(&v4([10, 99, 0, 0], 16), &local),
            "other prefix length"
        );
        assert!(
            !same_lan(&v4([0, 0, 0, 0], 0), &local),
            "IPv6 with no prefix"
        );
        assert!(!same_lan(&v4([10, 99, 0, 0], 24), &[lp("fd00::1", 64)]));
    }

    #[test]
    fn ipv6_prefixes() {
        let mut ip = v4([0; 4], 0);
        ip.ipv6_prefixes.push(Ipv6Prefix {
            prefix: "fd00:1::".parse::<Ipv6Addr>().unwrap(),
            len: 64,
        });
        assert!(same_lan(&ip, &[lp("fd00:1::7", 64)]));
        assert!(!same_lan(&ip, &[lp("fd00:2::7", 64)]));
        assert!(!same_lan(&ip, &[lp("fd00:1::7", 48)]));
        assert!(!same_lan(&ip, &[lp("fe80::1", 64)]), "link-local ignored");
        ip.ipv6_prefixes[0] = Ipv6Prefix {
            prefix: "fe80::".parse().unwrap(),
            len: 64,
        };
        assert!(!same_lan(&ip, &[lp("fe80::1", 64)]));
    }

    #[test]
    fn v2_1_limits() {
        let cfg = ClcConfig::default();
        let mut ext = ProposalV2Ext {
            release: 1,
            max_conns: 255,
            max_links: 2,
            ..Default::default()
        };
        assert_eq!(server_v2_limits(&ext, &cfg), Ok((1, 255, 2)));
        ext.max_conns = 15;
        assert_eq!(server_v2_limits(&ext, &cfg), Err(DeclineCode::MAXCONNERR));
        ext.max_conns = 16;
        ext.max_links = 0;
        assert_eq!(server_v2_limits(&ext, &cfg), Err(DeclineCode::MAXLINKERR));
        ext.release = 0;
        assert_eq!(
            server_v2_limits(&ext, &cfg),
            Ok((0, 255, 2)),
            "v2.0: no limits"
        );
        ext.release = 7;
        ext.max_links = 9;
        assert_eq!(server_v2_limits(&ext, &cfg), Ok((1, 16, 2)), "min of both");

        let offered = V2Offered {
            release: 1,
            max_conns: 255,
            max_links: 2,
            feature_mask: 1,
        };
        let fce = |release, max_conns, max_links| FirstContactExt {
            release,
            max_conns,
            max_links,
            feature_mask: 3,
            ..Default::default()
        };
        assert_eq!(
            client_v2_limits(&fce(1, 255, 2), &offered),
            Ok((1, 255, 2, 1))
        );
        assert_eq!(
            client_v2_limits(&fce(2, 255, 2), &offered),
            Err(DeclineCode::RELEASEERR)
        );
        assert_eq!(
            client_v2_limits(&fce(1, 15, 2), &offered),
            Err(DeclineCode::MAXCONNERR)
        );
        assert_eq!(
            client_v2_limits(&fce(1, 16, 3), &offered),
            Err(DeclineCode::MAXLINKERR)
        );
        assert_eq!(
            client_v2_limits(&fce(1, 16, 0), &offered),
            Err(DeclineCode::MAXLINKERR)
        );
        assert_eq!(
            client_v2_limits(&fce(0, 0, 0), &offered),
            Ok((0, 255, 2, 0))
        );

        let neg = V2Params {
            eid: Default::default(),
            release: 1,
            max_conns: 255,
            max_links: 2,
            feature_mask: 1,
        };
        assert_eq!(server_confirm_check(Some(&fce(1, 255, 2)), &neg), Ok(1));
        assert_eq!(
            server_confirm_check(Some(&fce(0, 255, 2)), &neg),
            Err(DeclineCode::RELEASEERR)
        );
        assert_eq!(
            server_confirm_check(Some(&fce(1, 254, 2)), &neg),
            Err(DeclineCode::MAXCONNERR)
        );
        assert_eq!(
            server_confirm_check(Some(&fce(1, 255, 1)), &neg),
            Err(DeclineCode::MAXLINKERR)
        );
        assert_eq!(
            server_confirm_check(None, &neg),
            Err(DeclineCode::RELEASEERR)
        );
    }
}
