//! Interoperability with Linux 6.12: the real CLC messages of
//! `tests/fixtures/pcaps/k612-pair.pcap` fed to our machines, and what we answer checked
//! against the rules the Linux peer applies (linux-smc.md §1.3–§1.5, `smc_clc.c`,
//! `af_smc.c`), plus the Linux v2 Decline of kernel-peer README §V4(f).

use super::*;
use smc_wire::clc::{PathType, ProposalBody};

static K612: &[u8] = include_bytes!("../../../../../tests/fixtures/pcaps/k612-pair.pcap");

/// The TCP payloads of the capture that start with the SMC-R eye catcher, in order
/// (each CLC message of this capture travels in one segment). A minimal reader for
/// classic little-endian pcap with Ethernet framing and IPv4.
fn linux_clc_messages() -> Vec<Vec<u8>> {
    let d = K612;
    assert_eq!(&d[..4], &[0xd4, 0xc3, 0xb2, 0xa1], "little-endian pcap");
    assert_eq!(
        u32::from_le_bytes(d[20..24].try_into().unwrap()),
        1,
        "Ethernet"
    );
    let mut out = Vec::new();
    let mut off = 24;
    while off + 16 <= d.len() {
        let incl = u32::from_le_bytes(d[off + 8..off + 12].try_into().unwrap()) as usize;
        let pkt = &d[off + 16..(off + 16 + incl).min(d.len())];
        off += 16 + incl;
        if pkt.len() < 14 + 20 || pkt[12..14] != [0x08, 0x00] {
            continue;
        }
        let ip = &pkt[14..];
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        if ip[9] != 6 || total > ip.len() || ihl + 20 > total {
            continue;
        }
        let tcp = &ip[ihl..total];
        let doff = usize::from(tcp[12] >> 4) * 4;
        let payload = &tcp[doff.min(tcp.len())..];
        if payload.starts_with(&[0xE2, 0xD4, 0xC3, 0xD9]) {
            out.push(payload.to_vec());
        }
        if out.len() == 9 {
            break;
        }
    }
    out
}

struct Fixtures {
    proposal: Vec<u8>,
    accept_first: Vec<u8>,
    confirm_first: Vec<u8>,
    accept_next: Vec<u8>,
    confirm_next: Vec<u8>,
}

fn fixtures() -> Fixtures {
    let m = linux_clc_messages();
    assert_eq!(m.len(), 9, "3 connections × (Proposal, Accept, Confirm)");
    let types: Vec<u8> = m.iter().map(|b| b[4]).collect();
    assert_eq!(types, [1, 2, 3, 1, 2, 3, 1, 2, 3]);
    Fixtures {
        proposal: m[0].clone(),
        accept_first: m[1].clone(),
        confirm_first: m[2].clone(),
        accept_next: m[4].clone(),
        confirm_next: m[5].clone(),
    }
}

/// Our side as configured in the kernel-peer run: UEID SMC-PEER-TEST, 10.99.0.0/24.
fn linux_like_cfg() -> ClcConfig {
    cfg()
}

/// What a Linux 6.12 client checks in an Accept to its v2-only Proposal (independent
/// restatement of `smc_clc_msg_hdr_valid`, `smc_connect_check_aclc`,
/// `smc_connect_rdma_v2_prepare` and `smc_clc_clnt_v2x_features_validate`).
fn linux_client_accepts(b: &[u8]) -> Result<(), String> {
    let len = usize::from(u16::from_be_bytes([b[5], b[6]]));
    if b[..4] != [0xE2, 0xD4, 0xC3, 0xD9] || b[len - 4..len] != [0xE2, 0xD4, 0xC3, 0xD9] {
        return Err("eye catchers".into());
    }
    if b[4] != 2 || len != b.len() || b[7] >> 4 < 1 {
        return Err("header".into());
    }
    if b[7] & 0x03 != 0 {
        return Err("typev1 must be R".into());
    }
    if b[7] >> 4 != 2 {
        return Err("a v2-only client needs a v2 Accept (MODEUNSUPP)".into());
    }
    if len < 108 {
        return Err("v2 SMC-R Accept shorter than 108".into());
    }
    let first = b[7] & 0x08 != 0;
    if first {
        if len < 160 {
            return Err("first contact needs the 52-byte extension".into());
        }
        let fce = &b[104..156];
        let release = fce[1] & 0x0f;
        if release >= 1 {
            if fce[36] < 16 {
                return Err("MAXCONNERR".into());
            }
            if !(1..=2).contains(&fce[37]) {
                return Err("MAXLINKERR".into());
            }
        }
        if !(1..=5).contains(&(b[50] & 0x0f)) {
            return Err("QP MTU".into());
        }
    }
    if b[45] == 0 || u32::from_be_bytes([0, b[38], b[39], b[40]]) < 2 {
        return Err("rmbe_idx / QPN".into());
    }
    if b[50] >> 4 > 15 {
        return Err("RMBE size".into());
    }
    Ok(())
}

/// What a Linux 6.12 server checks in a first-contact Confirm
/// (`smc_clc_msg_acc_conf_valid`, `smc_clc_v2x_features_confirm_check`).
fn linux_server_accepts_confirm(b: &[u8], accept: &[u8]) -> Result<(), String> {
    let len = usize::from(u16::from_be_bytes([b[5], b[6]]));
    if b[4] != 3 || len != b.len() || b[7] & 0x03 != 0 || len < 108 {
        return Err("header".into());
    }
    if b[len - 4..] != [0xE2, 0xD4, 0xC3, 0xD9] {
        return Err("trailer".into());
    }
    if b[7] & 0x08 != 0 {
        if len < 164 {
            return Err("first-contact Confirm without extension and GID list".into());
        }
        let (c, a) = (&b[104..156], &accept[104..156]);
        if c[1] & 0x0f != a[1] & 0x0f {
            return Err("RELEASEERR".into());
        }
        if c[36] != a[36] {
            return Err("MAXCONNERR".into());
        }
        if c[37] != a[37] {
            return Err("MAXLINKERR".into());
        }
        let gids = usize::from(b[156]);
        if len != 164 + 16 * gids {
            return Err("GID list length".into());
        }
    }
    Ok(())
}

#[test]
fn fixtures_parse() {
    let f = fixtures();
    for b in [
        &f.proposal,
        &f.accept_first,
        &f.confirm_first,
        &f.accept_next,
        &f.confirm_next,
    ] {
        ClcMessage::parse(b).unwrap();
    }
    // Sanity of the independent checkers on Linux's own messages.
    linux_client_accepts(&f.accept_first).unwrap();
    linux_client_accepts(&f.accept_next).unwrap();
    linux_server_accepts_confirm(&f.confirm_first, &f.accept_first).unwrap();
    linux_server_accepts_confirm(&f.confirm_next, &f.accept_next).unwrap();
    let mut bad = f.accept_first.clone();
    bad[104 + 37] = 3;
    assert!(linux_client_accepts(&bad).is_err(), "the checker can fail");
}

#[test]
fn our_server_accepts_linux_proposal() {
    let f = fixtures();
    let now = t0();
    let mut env = FakeEnv::new(SERVER_HOST);
    let mut s = Rendezvous::server(
        now,
        &linux_like_cfg(),
        server_route(),
        Eligibility::BothAnnounced,
    );
    let outs = feed(&mut s, now, &f.proposal, &mut env);
    let ours = bytes_of(&outs);
    linux_client_accepts(&ours).unwrap();
    // Same shape as Linux's own Accept: length, flags, EID, extension bytes.
    let theirs = &f.accept_first;
    assert_eq!(ours.len(), theirs.len(), "160 bytes");
    assert_eq!(ours[7], theirs[7], "0x28: version 2, first contact, SMC-R");
    assert_eq!(ours[64..96], theirs[64..96], "negotiated EID");
    assert_eq!(
        ours[104..106],
        theirs[104..106],
        "v2_direct, OS Linux, release 1"
    );
    assert_eq!(
        ours[140..144],
        theirs[140..144],
        "max_conns 255, max_links 2, features 1"
    );
    // The link group was looked up by the v2 GID (the v1 fields are zero, H3).
    assert_eq!(env.lgr_queries[0].peer_gid, gid4(2));
    assert_eq!(env.lgr_queries[0].peer_id, PeerId::default());
}

#[test]
fn our_server_completes_with_linux_confirm() {
    // Linux's Confirm answers Linux's Accept; ours has other QP/RKey values, which a
    // Confirm does not echo, so Linux's Confirm is valid for our Accept too.
    let f = fixtures();
    let now = t0();
    let mut env = FakeEnv::new(SERVER_HOST);
    let mut s = Rendezvous::server(
        now,
        &linux_like_cfg(),
        server_route(),
        Eligibility::BothAnnounced,
    );
    feed(&mut s, now, &f.proposal, &mut env);
    assert!(feed(&mut s, now, &f.confirm_first, &mut env).is_empty());
    let qp = env.started.unwrap();
    assert_eq!(qp.qpn.get(), 0x11);
    assert_eq!(qp.psn.get(), 0xca_5000);
    assert_eq!(qp.mtu, QpMtu::Mtu1024);
    for ev in [
        LinkEvent::ConfirmLinkSent,
        LinkEvent::FirstLinkUp,
        LinkEvent::SecondLinkSettled,
    ] {
        s.handle_link_event(now, ev, &mut env);
    }
    let e = smc(done(&drain(&mut s)));
    assert_eq!(e.peer_rmb.rkey, 0x3ae);
    assert_eq!(e.peer_rmb.alert_token, 1);
    assert_eq!(e.peer_rmb.size.bytes(), 65536);
    let v2 = e.v2.unwrap().first_contact.unwrap();
    assert_eq!(v2.peer_hostname.to_string(), "smc-client");
    assert_eq!(v2.peer_gids, vec![gid4(2)]);
}

#[test]
fn our_client_accepts_linux_accept() {
    let f = fixtures();
    let now = t0();
    let mut env = FakeEnv::new(CLIENT_HOST);
    let mut route = client_route();
    route.v1 = None; // like the Linux client of the capture: v2 only
    let mut c = Rendezvous::client(now, &linux_like_cfg(), route, Eligibility::BothAnnounced);
    let prop = bytes_of(&drain(&mut c));
    // Our Proposal has the same layout as Linux's (156 bytes, same flags, same v2 area).
    assert_eq!(prop.len(), f.proposal.len());
    assert_eq!(prop[7], f.proposal[7]);
    assert_eq!(prop[40..80], f.proposal[40..80]);
    assert_eq!(prop[80..84], f.proposal[80..84], "EID count, release");
    assert_eq!(
        prop[104..152],
        f.proposal[104..152],
        "limits, features, EID"
    );
    let outs = feed(&mut c, now, &f.accept_first, &mut env);
    let ours = bytes_of(&outs);
    linux_server_accepts_confirm(&ours, &f.accept_first).unwrap();
    assert_eq!(
        ours.len(),
        f.confirm_first.len(),
        "180 bytes: extension + 1 GID"
    );
    assert_eq!(ours[7], f.confirm_first[7]);
    assert_eq!(ours[64..96], f.confirm_first[64..96], "EID echoed");
    // The QP goes RTR with the server's values from the Accept.
    let req = &env.client_requests[0];
    assert_eq!(req.server.qpn.get(), 0x11, "server QPN");
    assert_eq!(req.server.psn.get(), 0x06_4b13, "server PSN");
    assert_eq!(
        req.route.unwrap().nexthop_mac,
        mac(1),
        "v2_direct: the Accept's MAC"
    );
    for ev in [LinkEvent::FirstLinkUp, LinkEvent::SecondLinkSettled] {
        c.handle_link_event(now, ev, &mut env);
    }
    let e = smc(done(&drain(&mut c)));
    assert_eq!(e.peer_rmb.rkey, 0x362);
    assert_eq!(e.peer_rmb.vaddr, 0xff22_f8b0_837a_0000);
    assert_eq!(e.peer_link.peer_id.to_string(), "0x0eef525400990001");
    assert_eq!(
        e.v2.unwrap()
            .first_contact
            .unwrap()
            .peer_hostname
            .to_string(),
        "smc-server"
    );
}

#[test]
fn our_client_handles_linux_subsequent_accept() {
    let f = fixtures();
    let now = t0();
    let mut env = FakeEnv::new(CLIENT_HOST);
    let mut route = client_route();
    route.v1 = None;
    let c0 = linux_like_cfg();
    let mut c = Rendezvous::client(now, &c0, route.clone(), Eligibility::BothAnnounced);
    drain(&mut c);
    feed(&mut c, now, &f.accept_first, &mut env);
    for ev in [LinkEvent::FirstLinkUp, LinkEvent::SecondLinkSettled] {
        c.handle_link_event(now, ev, &mut env);
    }
    smc(done(&drain(&mut c)));
    // Second connection: Linux's 108-byte Accept with F = 0 names the same link.
    let mut c = Rendezvous::client(now, &c0, route, Eligibility::BothAnnounced);
    drain(&mut c);
    let outs = feed(&mut c, now, &f.accept_next, &mut env);
    let ours = bytes_of(&outs);
    assert_eq!(ours.len(), 108);
    assert_eq!(ours[7], 0x20, "v2, not first contact");
    linux_server_accepts_confirm(&ours, &f.accept_next).unwrap();
    assert_eq!(smc(done(&outs)).contact, Contact::Subsequent);
}

/// The 44-byte v2 Decline Linux sent on a UEID mismatch (kernel-peer README §V4(f)).
fn linux_decline() -> Vec<u8> {
    let mut b = vec![0xe2, 0xd4, 0xc3, 0xd9, 0x04, 0x00, 0x2c, 0x20];
    b.extend_from_slice(&[0x4b, 0xe8, 0x52, 0x54, 0x00, 0x99, 0x00, 0x01]);
    b.extend_from_slice(&[0x03, 0x03, 0x00, 0x00, 0x20, 0, 0, 0]);
    b.extend_from_slice(&[0u8; 16]);
    b.extend_from_slice(&[0xe2, 0xd4, 0xc3, 0xd9]);
    b
}

#[test]
fn linux_decline_to_our_client() {
    let now = t0();
    let mut env = FakeEnv::new(CLIENT_HOST);
    let (mut c, _) = client(now, &cfg());
    let outs = feed(&mut c, now, &linux_decline(), &mut env);
    let f = fallback(done(&outs));
    assert_eq!(
        (f.local, f.peer),
        (DeclineCode::PEERDECL, Some(DeclineCode::NOSMCDEV))
    );
    assert_eq!(
        f.to_string(),
        "TCP fallback: peer declined: no usable SMC device (neither SMC-R nor SMC-D) for this \
         connection, or no matching EID (0x03030000)"
    );
}

#[test]
fn our_decline_to_linux_proposal_matches_linux() {
    // Our server with another UEID answers Linux's Proposal like Linux's server did.
    let f = fixtures();
    let mut c = cfg();
    c.v2_config.ueids = ueids("SMC-PEER-OTHER");
    let now = t0();
    let mut env = FakeEnv::new(SERVER_HOST);
    let mut s = Rendezvous::server(now, &c, server_route(), Eligibility::BothAnnounced);
    let ours = bytes_of(&feed(&mut s, now, &f.proposal, &mut env));
    let theirs = linux_decline();
    assert_eq!(ours.len(), 44);
    assert_eq!(ours[..8], theirs[..8]);
    assert_eq!(
        ours[16..],
        theirs[16..],
        "diagnosis, OS type, reserved words, trailer"
    );
}

#[test]
fn linux_proposal_layout_is_what_the_wire_says() {
    let f = fixtures();
    let ClcMessage::Proposal(p) = ClcMessage::parse(&f.proposal).unwrap() else {
        panic!()
    };
    assert_eq!((p.typev1, p.typev2), (PathType::N, PathType::R));
    assert!(matches!(
        p.body,
        ProposalBody::V2 {
            ip: None,
            v2: Some(_),
            ..
        }
    ));
}
