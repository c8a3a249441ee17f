//! CHECKLIST §E.2 (CLC encoding and validation) and the receiver decision matrix A.2.6
//! (RFC 7609 Appendix C.1, C.5, C.6) for both roles.

use super::*;
use smc_wire::clc::PathType;

/// A v1-only configuration with the RFC 7609 Proposal layout.
fn rfc_v1() -> ClcConfig {
    let mut c = cfg();
    c.v2 = false;
    c.proposal_layout = ProposalLayout::Rfc7609;
    c
}

fn rfc_proposal_bytes() -> Vec<u8> {
    let (_, p) = client(t0(), &rfc_v1());
    ClcMessage::Proposal(p).to_vec().unwrap()
}

/// A server that got `bytes` as its Proposal.
fn server_gets(bytes: &[u8]) -> (Vec<Output>, FakeEnv) {
    let now = t0();
    let mut env = FakeEnv::new(SERVER_HOST);
    let mut s = server(now, &cfg());
    let n = s.handle_tcp_bytes(now, bytes, &mut env);
    assert!(n <= bytes.len());
    (drain(&mut s), env)
}

/// A client whose Proposal was answered with `bytes`.
fn client_gets(c: &ClcConfig, bytes: &[u8]) -> (Vec<Output>, FakeEnv) {
    let now = t0();
    let mut env = FakeEnv::new(CLIENT_HOST);
    let (mut m, _) = client(now, c);
    let n = m.handle_tcp_bytes(now, bytes, &mut env);
    assert!(n <= bytes.len());
    (drain(&mut m), env)
}

/// Our server's first-contact v1 Accept to the RFC Proposal.
fn v1_accept() -> AcceptConfirmRepr {
    let (outs, _) = server_gets(&rfc_proposal_bytes());
    only_accept(&outs)
}

fn accept_bytes(a: &AcceptConfirmRepr) -> Vec<u8> {
    ClcMessage::Accept(a.clone()).to_vec().unwrap()
}

#[test]
fn tc_clc_01_proposal_ipv4_golden() {
    let b = rfc_proposal_bytes();
    assert_eq!(b.len(), 52);
    assert_eq!(&b[..8], &[0xE2, 0xD4, 0xC3, 0xD9, 1, 0, 52, 0x10]);
    assert_eq!(
        &b[8..16],
        &[0xb1, 0x2d, 0x52, 0x54, 0, 0x99, 0, 2],
        "Peer ID"
    );
    assert_eq!(b[16..32], gid4(CLIENT_HOST).0, "preferred GID");
    assert_eq!(b[32..38], mac(CLIENT_HOST).0, "preferred MAC");
    assert_eq!(&b[38..40], &[0, 0], "iparea_offset");
    assert_eq!(
        &b[40..48],
        &[10, 99, 0, 0, 24, 0, 0, 0],
        "subnet, prefix length, k = 0"
    );
    assert_eq!(&b[48..], &[0xE2, 0xD4, 0xC3, 0xD9]);
}

#[test]
fn tc_clc_02_proposal_ipv6_k1_k8() {
    for k in [1usize, 8] {
        let mut route = client_route();
        let mut prefixes = ArrayVec::new();
        for i in 0..k {
            prefixes.push(smc_wire::clc::Ipv6Prefix {
                prefix: format!("fd00:{i}::").parse().unwrap(),
                len: 64,
            });
        }
        route.v1.as_mut().unwrap().1 = ProposalIp::V6 { prefixes };
        let mut m = Rendezvous::client(t0(), &rfc_v1(), route, Eligibility::BothAnnounced);
        let b = bytes_of(&drain(&mut m));
        assert_eq!(b.len(), 52 + 17 * k, "k = {k}");
        assert_eq!(b[47] as usize, k);
        assert_eq!(b[48 + 16], 64, "17-byte elements, no padding");
    }
}

#[test]
fn linux_layout_proposal_sizes() {
    // linux-smc.md §1.3: v1 only 92, v1+v2 with one UEID 164, v2 only 156.
    let mut c = cfg();
    c.v2 = false;
    let (_, p) = client(t0(), &c);
    assert_eq!(ClcMessage::Proposal(p.clone()).to_vec().unwrap().len(), 92);
    assert_eq!(
        (p.version, p.typev1, p.typev2),
        (2, PathType::R, PathType::N)
    );
    let (_, p) = client(t0(), &cfg());
    assert_eq!(ClcMessage::Proposal(p.clone()).to_vec().unwrap().len(), 164);
    assert_eq!(&ClcMessage::Proposal(p).to_vec().unwrap()[38..40], &[0, 40]);
    let mut route = client_route();
    route.v1 = None;
    let mut m = Rendezvous::client(t0(), &cfg(), route, Eligibility::BothAnnounced);
    let p = only_proposal(&drain(&mut m));
    let b = ClcMessage::Proposal(p.clone()).to_vec().unwrap();
    assert_eq!(b.len(), 156);
    assert_eq!(b[7], 0x22, "v2, typev2 R, typev1 none");
    assert_eq!(
        &b[8..40],
        &[0u8; 32],
        "v2-only: Peer ID, GID and MAC zeroed (Linux)"
    );
}

#[test]
fn tc_clc_03_proposal_nine_prefixes() {
    let mut b = rfc_proposal_bytes();
    b[47] = 9;
    let len = 52 + 17 * 9;
    b.splice(48..48, std::iter::repeat_n(0u8, 17 * 9));
    b[5..7].copy_from_slice(&(len as u16).to_be_bytes());
    let (outs, _) = server_gets(&b);
    assert_reset(&outs);
}

#[test]
fn tc_clc_04_05_bad_eye_catchers() {
    for i in [0usize, 3, 48, 51] {
        let mut b = rfc_proposal_bytes();
        b[i] ^= 0x01;
        let now = t0();
        let mut env = FakeEnv::new(SERVER_HOST);
        let mut s = server(now, &cfg());
        let n = s.handle_tcp_bytes(now, &b, &mut env);
        let outs = drain(&mut s);
        assert!(
            matches!(assert_reset(&outs), ResetReason::Protocol(_)),
            "byte {i}"
        );
        if i < 4 {
            assert_eq!(n, 8, "a bad header is judged before more is read");
        }
    }
}

#[test]
fn tc_clc_06_proposal_length_mismatch() {
    for delta in [-17i32, -1, 1, 17] {
        let mut b = rfc_proposal_bytes();
        let len = (52 + delta) as usize;
        b.resize(len.max(52), 0);
        b.truncate(len);
        let l = b.len();
        b[l - 4..].copy_from_slice(&[0xE2, 0xD4, 0xC3, 0xD9]);
        b[5..7].copy_from_slice(&(l as u16).to_be_bytes());
        let (outs, env) = server_gets(&b);
        assert_reset(&outs);
        assert_no_leak(&env, 0);
    }
}

#[test]
fn tc_clc_07_proposal_nonzero_ip_area_offset() {
    let b = rfc_proposal_bytes();
    let mut x = b[..40].to_vec();
    x[38..40].copy_from_slice(&[0, 8]);
    x.extend_from_slice(&[0xAA; 8]);
    x.extend_from_slice(&b[40..]);
    x[5..7].copy_from_slice(&60u16.to_be_bytes());
    let (outs, _) = server_gets(&x);
    let a = only_accept(&outs);
    assert_eq!(a.version, 1, "subnet read at 48, Accept at v1");
}

#[test]
fn tc_clc_08_proposal_reserved_nonzero_ignored() {
    let mut b = rfc_proposal_bytes();
    b[7] |= 0x07; // reserved low bits of byte 7 (Linux reads typev1 = B)
    b[45] = 0xFF;
    b[46] = 0xFF;
    let (outs, _) = server_gets(&b);
    only_accept(&outs);
    let mut b = rfc_proposal_bytes();
    b[7] = 0x12; // typev1 "none" in Linux terms: reserved in v1, ignored
    let (outs, _) = server_gets(&b);
    only_accept(&outs);
}

#[test]
fn tc_clc_09_proposal_version2_lowest_common() {
    // A v1+v2 Proposal to a server without SMC-Rv2: Accept at version 1.
    let (_, p) = client(t0(), &cfg());
    let mut scfg = cfg();
    scfg.v2 = false;
    let now = t0();
    let mut env = FakeEnv::new(SERVER_HOST);
    let mut s = server(now, &scfg);
    let outs = feed_msg(&mut s, now, &ClcMessage::Proposal(p), &mut env);
    let a = only_accept(&outs);
    assert_eq!((a.version, a.v2.is_none()), (1, true));
    assert_eq!(accept_bytes(&a).len(), 68);
}

#[test]
fn tc_clc_10_proposal_version0() {
    let mut b = rfc_proposal_bytes();
    b[7] = 0x00;
    let (outs, env) = server_gets(&b);
    let d = assert_declined(&outs, DeclineCode::VERSMISMAT);
    assert_eq!(d.version, 1);
    assert_no_leak(&env, 0);
}

#[test]
fn tc_clc_11_accept_golden_offsets() {
    let a = v1_accept();
    let b = accept_bytes(&a);
    assert_eq!(b.len(), 68);
    assert_eq!(&b[4..8], &[2, 0, 68, 0x18], "type, length, version 1 + F");
    assert_eq!(&b[8..16], &[0x0e, 0xef, 0x52, 0x54, 0, 0x99, 0, 1]);
    assert_eq!(b[38..41], a.qpn.get().to_be_bytes()[1..]);
    assert_eq!(b[41..45], a.rmb_rkey.to_be_bytes());
    assert_eq!(b[45], 1);
    assert_eq!(b[46..50], a.rmbe_alert_token.to_be_bytes());
    assert_eq!(b[50], 0x23, "64 KiB, MTU 1024");
    assert_eq!(b[52..60], a.rmb_vaddr.to_be_bytes());
    assert_eq!(b[61..64], a.psn.get().to_be_bytes()[1..]);
    assert_eq!(&b[64..], &[0xE2, 0xD4, 0xC3, 0xD9]);
}

#[test]
fn tc_clc_12_accept_wrong_length() {
    for len in [67usize, 69] {
        let mut b = accept_bytes(&v1_accept());
        b.resize(len, 0);
        b[len - 4..].copy_from_slice(&[0xE2, 0xD4, 0xC3, 0xD9]);
        b[5..7].copy_from_slice(&(len as u16).to_be_bytes());
        let (outs, env) = client_gets(&rfc_v1(), &b);
        assert_reset(&outs);
        assert_no_leak(&env, 0);
    }
}

#[test]
fn tc_clc_13_14_accept_reserved_mtu_first_contact() {
    for mtu in [0u8, 6, 7, 9, 15] {
        let mut b = accept_bytes(&v1_accept());
        b[50] = (b[50] & 0xF0) | mtu;
        let (outs, env) = client_gets(&rfc_v1(), &b);
        assert_declined(&outs, DeclineCode::VERSMISMAT);
        assert_no_leak(&env, 0);
    }
}

#[test]
fn tc_clc_15_accept_bad_mtu_subsequent_not_validated() {
    let mut p = Pair::new(&rfc_v1(), &rfc_v1());
    p.run();
    p.learn();
    let mut p = p.next_connection(&rfc_v1(), &rfc_v1());
    let prop = bytes_of(&drain(&mut p.c));
    let mut acc = accept_bytes(&only_accept(&feed(&mut p.s, p.now, &prop, &mut p.senv)));
    assert_eq!(acc[7], 0x10, "subsequent contact");
    acc[50] = (acc[50] & 0xF0) | 9;
    let outs = feed(&mut p.c, p.now, &acc, &mut p.cenv);
    only_confirm(&outs);
    assert_eq!(smc(done(&outs)).contact, Contact::Subsequent);
}

#[test]
fn tc_clc_16_mtu_min_applied() {
    let now = t0();
    let mut cenv = FakeEnv::new(CLIENT_HOST);
    cenv.mtu = QpMtu::Mtu4096;
    let (mut c, _) = client(now, &rfc_v1());
    let mut a = v1_accept();
    a.qp_mtu = QpMtu::Mtu1024.code();
    let outs = feed_msg(&mut c, now, &ClcMessage::Accept(a), &mut cenv);
    assert_eq!(only_confirm(&outs).qp_mtu, QpMtu::Mtu1024.code());
    assert_eq!(
        cenv.client_requests[0].server.mtu,
        QpMtu::Mtu1024,
        "the QP gets it too"
    );
}

#[test]
fn tc_clc_17_accept_rmbe_index_zero() {
    let mut b = accept_bytes(&v1_accept());
    b[45] = 0;
    let (outs, _) = client_gets(&rfc_v1(), &b);
    assert_reset(&outs);
}

#[test]
fn tc_clc_18_19_bsize_policy() {
    // Code 6 (1 MiB) is fine with Linux's limit, declined (never reset) with the RFC's.
    let mut b = accept_bytes(&v1_accept());
    b[50] = 0x63;
    let (outs, _) = client_gets(&rfc_v1(), &b);
    only_confirm(&outs);
    let mut strict = rfc_v1();
    strict.max_peer_rmbe_code = BufSize::RFC_MAX_CODE;
    let (outs, env) = client_gets(&strict, &b);
    assert_declined(&outs, DeclineCode::VERSMISMAT);
    assert_no_leak(&env, 0);
}

#[test]
fn tc_clc_20_21_confirm_f_bit() {
    let mut p = Pair::new(&rfc_v1(), &rfc_v1());
    let (c, s) = p.run();
    assert!(matches!((&c, &s), (Outcome::Smc(_), Outcome::Smc(_))));
    p.learn();
    let mut p = p.next_connection(&rfc_v1(), &rfc_v1());
    let prop = bytes_of(&drain(&mut p.c));
    let outs = feed(&mut p.s, p.now, &prop, &mut p.senv);
    let acc = accept_bytes(&only_accept(&outs));
    let outs = feed(&mut p.c, p.now, &acc, &mut p.cenv);
    let confirm = only_confirm(&outs);
    let mut b = ClcMessage::Confirm(confirm).to_vec().unwrap();
    assert_eq!(
        b[7], 0x10,
        "subsequent-contact Confirm: bit 0x08 clear (TC-CLC-20)"
    );
    b[7] |= 0x08; // TC-CLC-21: reserved bit set, and a reserved MTU that is not judged
    b[50] = (b[50] & 0xF0) | 0x0F;
    let outs = feed(&mut p.s, p.now, &b, &mut p.senv);
    assert_eq!(smc(done(&outs)).contact, Contact::Subsequent);
}

#[test]
fn tc_clc_22_decline_golden() {
    let mut env = FakeEnv::new(SERVER_HOST);
    env.fail_create = Some(DeclineCode::MEM);
    let now = t0();
    let mut s = server(now, &cfg());
    let outs = feed(&mut s, now, &rfc_proposal_bytes(), &mut env);
    let b = bytes_of(&outs);
    assert_eq!(b.len(), 28);
    assert_eq!(&b[..8], &[0xE2, 0xD4, 0xC3, 0xD9, 4, 0, 28, 0x10]);
    assert_eq!(&b[8..16], &[0x0e, 0xef, 0x52, 0x54, 0, 0x99, 0, 1]);
    assert_eq!(&b[16..20], &[1, 1, 0, 0], "MEM");
    assert_eq!(&b[20..24], &[0; 4], "reserved");
    assert_eq!(&b[24..], &[0xE2, 0xD4, 0xC3, 0xD9]);
}

fn decline(code: u32, sync: bool, version: u8) -> Vec<u8> {
    ClcMessage::Decline(DeclineRepr {
        version,
        out_of_sync: sync,
        peer_id: pid(0x4be8, SERVER_HOST),
        diagnosis: DeclineCode(code),
        os_type: if version >= 2 { 2 } else { 0 },
        diagnosis_v2: (version >= 2).then_some([0; 4]),
        ..Default::default()
    })
    .to_vec()
    .unwrap()
}

#[test]
fn tc_clc_23_decline_any_diag_accepted() {
    let (outs, _) = client_gets(&cfg(), &decline(0xDEAD_BEEF, false, 1));
    assert!(sent(&outs).is_empty(), "no reply to a Decline");
    let f = fallback(done(&outs));
    assert_eq!(
        (f.local, f.peer),
        (DeclineCode::PEERDECL, Some(DeclineCode(0xDEAD_BEEF)))
    );
    assert_eq!(
        f.to_string(),
        "TCP fallback: peer declined: unknown reason (0xdeadbeef)"
    );
}

#[test]
fn tc_clc_24_decline_wrong_length() {
    let mut b = decline(0x0303_0000, false, 1);
    b.truncate(27);
    b[6] = 27;
    let (outs, _) = client_gets(&cfg(), &b);
    assert_reset(&outs);
    // A v1 header with the v2 length is a length error too.
    let mut b = decline(0x0303_0000, false, 2);
    b[7] = 0x10;
    let (outs, _) = client_gets(&cfg(), &b);
    assert_reset(&outs);
}

#[test]
fn tc_clc_25_clc_fragmented_segments() {
    let now = t0();
    let mut env = FakeEnv::new(CLIENT_HOST);
    let (mut c, _) = client(now, &rfc_v1());
    let b = accept_bytes(&v1_accept());
    let mut outs = Vec::new();
    for (i, byte) in b.iter().enumerate() {
        assert!(c.bytes_wanted() >= 1, "byte {i}");
        assert!(
            c.bytes_wanted() <= b.len() - i,
            "never asks past the message"
        );
        outs.extend(feed(&mut c, now, &[*byte], &mut env));
    }
    only_confirm(&outs);
}

#[test]
fn tc_clc_26_app_data_when_clc_expected() {
    for role in ["client", "server"] {
        let now = t0();
        let mut env = FakeEnv::new(1);
        let data = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        let (n, outs) = if role == "client" {
            let (mut c, _) = client(now, &cfg());
            (c.handle_tcp_bytes(now, data, &mut env), drain(&mut c))
        } else {
            let mut s = server(now, &cfg());
            (s.handle_tcp_bytes(now, data, &mut env), drain(&mut s))
        };
        assert_eq!(n, 8);
        assert!(
            matches!(assert_reset(&outs), ResetReason::Protocol(_)),
            "{role}"
        );
    }
}

#[test]
fn tc_clc_27_unexpected_clc_type() {
    let mut a = v1_accept();
    a.first_contact = false;
    let b = ClcMessage::Confirm(a.clone()).to_vec().unwrap();
    let (outs, _) = client_gets(&rfc_v1(), &b);
    assert!(matches!(assert_reset(&outs), ResetReason::Protocol(ref s) if s.contains("Confirm")));
    // A Proposal at the client, an Accept at the server.
    let (outs, _) = client_gets(&rfc_v1(), &rfc_proposal_bytes());
    assert_reset(&outs);
    let (outs, _) = server_gets(&accept_bytes(&a));
    assert_reset(&outs);
}

#[test]
fn tc_clc_28_unknown_clc_type_5() {
    let mut b = decline(0, false, 1);
    b[4] = 5;
    let (outs, _) = client_gets(&cfg(), &b);
    assert_reset(&outs);
    let (outs, _) = server_gets(&b);
    assert_reset(&outs);
}

#[test]
fn tc_clc_29_decline_in_lieu_of_accept() {
    let now = t0();
    let mut env = FakeEnv::new(CLIENT_HOST);
    let (mut c, _) = client(now, &cfg());
    let mut stream = decline(0x0303_0000, false, 2);
    stream.extend_from_slice(b"application data");
    let n = c.handle_tcp_bytes(now, &stream, &mut env);
    assert_eq!(
        &stream[n..],
        b"application data",
        "left for the application"
    );
    let outs = drain(&mut c);
    let f = fallback(done(&outs));
    assert_eq!(f.peer, Some(DeclineCode::NOSMCDEV));
    assert_eq!(c.bytes_wanted(), 0);
    assert_eq!(c.handle_tcp_bytes(now, &stream[n..], &mut env), 0);
}

#[test]
fn tc_clc_30_decline_in_lieu_of_confirm() {
    for first in [true, false] {
        let mut p = Pair::new(&rfc_v1(), &rfc_v1());
        if !first {
            p.run();
            p.learn();
            p = p.next_connection(&rfc_v1(), &rfc_v1());
        }
        let lgrs = p.senv.lgr_count();
        let rmbs = p.senv.live_rmbs.len();
        let prop = bytes_of(&drain(&mut p.c));
        only_accept(&feed(&mut p.s, p.now, &prop, &mut p.senv));
        assert!(p.senv.live_rmbs.len() > rmbs);
        let outs = feed(
            &mut p.s,
            p.now,
            &decline(0x0101_0000, false, 1),
            &mut p.senv,
        );
        assert_eq!(fallback(done(&outs)).peer, Some(DeclineCode::MEM));
        assert_eq!(p.senv.lgr_count(), lgrs, "new link group torn down");
        assert_eq!(p.senv.live_rmbs.len(), rmbs, "RMB element freed");
    }
}

#[test]
fn tc_clc_31_decline_in_lieu_of_proposal() {
    let (outs, env) = server_gets(&decline(0x0303_0000, false, 1));
    assert!(sent(&outs).is_empty());
    assert_eq!(fallback(done(&outs)).peer, Some(DeclineCode::NOSMCDEV));
    assert_no_leak(&env, 0);
}

#[test]
fn tc_clc_32_no_chase_client() {
    // The client's device fails after the Proposal: nothing is sent until the Accept,
    // then a Decline in place of the Confirm.
    let now = t0();
    let mut env = FakeEnv::new(CLIENT_HOST);
    let (mut c, _) = client(now, &rfc_v1());
    env.fail_create = Some(DeclineCode::NOSMCRDEV);
    c.on_timeout(now + secs(3.0), &mut env);
    assert!(drain(&mut c).is_empty(), "no early Decline");
    let outs = feed_msg(
        &mut c,
        now + secs(3.0),
        &ClcMessage::Accept(v1_accept()),
        &mut env,
    );
    assert_declined(&outs, DeclineCode::NOSMCRDEV);
}

#[test]
fn tc_clc_33_no_decline_after_accept_subsequent() {
    let mut p = Pair::new(&rfc_v1(), &rfc_v1());
    p.run();
    p.learn();
    let mut p = p.next_connection(&rfc_v1(), &rfc_v1());
    let prop = bytes_of(&drain(&mut p.c));
    let acc = bytes_of(&feed(&mut p.s, p.now, &prop, &mut p.senv));
    let confirm = bytes_of(&feed(&mut p.c, p.now, &acc, &mut p.cenv));
    p.senv.fail_register = Some(DeclineCode::ERR_RTOK);
    let outs = feed(&mut p.s, p.now, &confirm, &mut p.senv);
    assert_eq!(
        assert_reset(&outs),
        ResetReason::LocalFailure(DeclineCode::ERR_RTOK)
    );
}

#[test]
fn tc_clc_34_no_decline_after_confirm_subsequent() {
    let mut p = Pair::new(&rfc_v1(), &rfc_v1());
    p.run();
    p.learn();
    let mut p = p.next_connection(&rfc_v1(), &rfc_v1());
    let prop = bytes_of(&drain(&mut p.c));
    let acc = bytes_of(&feed(&mut p.s, p.now, &prop, &mut p.senv));
    let outs = feed(&mut p.c, p.now, &acc, &mut p.cenv);
    only_confirm(&outs);
    assert_eq!(
        smc(done(&outs)).contact,
        Contact::Subsequent,
        "committed with the Confirm"
    );
    // Nothing can make it decline now.
    p.c.handle_link_event(
        p.now,
        LinkEvent::Failed {
            failure: LinkFailure::SendFailed,
            code: DeclineCode::INTERR,
        },
        &mut p.cenv,
    );
    p.c.on_timeout(p.now + secs(100.0), &mut p.cenv);
    p.c.handle_tcp_closed(p.now, &mut p.cenv);
    assert!(drain(&mut p.c).is_empty());
}

#[test]
fn tc_clc_35_clc_timeouts() {
    let now = t0();
    let mut env = FakeEnv::new(1);
    let c0 = cfg();
    // Server waiting for the Proposal.
    let mut s = server(now, &c0);
    assert_eq!(s.poll_timeout(), Some(now + secs(6.0)));
    s.on_timeout(now + secs(5.9), &mut env);
    assert!(drain(&mut s).is_empty(), "not before the deadline");
    s.on_timeout(now + secs(6.0), &mut env);
    assert_eq!(
        assert_reset(&drain(&mut s)),
        ResetReason::Timeout(Waiting::Proposal)
    );
    // Client waiting for the Accept (half a message arrived).
    let (mut c, _) = client(now, &c0);
    feed(&mut c, now, &accept_bytes(&v1_accept())[..20], &mut env);
    c.on_timeout(now + secs(6.0), &mut env);
    assert_eq!(
        assert_reset(&drain(&mut c)),
        ResetReason::Timeout(Waiting::Accept)
    );
    // Server waiting for the Confirm: the new link group is torn down.
    let mut env = FakeEnv::new(SERVER_HOST);
    let mut s = server(now, &c0);
    only_accept(&feed(&mut s, now, &rfc_proposal_bytes(), &mut env));
    assert_eq!(env.lgr_count(), 1);
    s.on_timeout(now + secs(12.0), &mut env);
    assert_eq!(
        assert_reset(&drain(&mut s)),
        ResetReason::Timeout(Waiting::Confirm)
    );
    assert_no_leak(&env, 0);
}

#[test]
fn tc_clc_36_decline_sync_bit_cleanup() {
    // Server: S = 1 in place of the Confirm on subsequent contact → clean up that LG.
    let mut p = Pair::new(&rfc_v1(), &rfc_v1());
    p.run();
    p.learn();
    let lgr = p.senv.only_lgr();
    let mut p = p.next_connection(&rfc_v1(), &rfc_v1());
    let prop = bytes_of(&drain(&mut p.c));
    feed(&mut p.s, p.now, &prop, &mut p.senv);
    let outs = feed(&mut p.s, p.now, &decline(0x0400_0000, true, 1), &mut p.senv);
    assert!(outs.contains(&Output::OutOfSync { lgr }));
    let f = fallback(done(&outs));
    assert!(f.out_of_sync);
    assert!(f.to_string().ends_with("[link group out of sync]"), "{f}");
    // Client: S = 1 in place of the Accept references no LG yet: nothing to clean up.
    // The Decline's Peer ID selects nothing (a stranger could write anyone's, and
    // Linux's v2-only Proposals carry zero): only this connection falls back.
    let (outs, _) = client_gets(&cfg(), &decline(0x0400_0000, true, 2));
    assert!(!outs.iter().any(|o| matches!(o, Output::OutOfSync { .. })));
    assert!(fallback(done(&outs)).out_of_sync);
}

#[test]
fn tc_clc_37_data_not_parsed_as_clc_after_setup() {
    let mut p = Pair::new(&rfc_v1(), &rfc_v1());
    p.run();
    let d = decline(0x0303_0000, false, 1);
    assert_eq!(p.c.bytes_wanted(), 0);
    assert_eq!(p.s.bytes_wanted(), 0);
    assert_eq!(p.c.handle_tcp_bytes(p.now, &d, &mut p.cenv), 0);
    assert_eq!(p.s.handle_tcp_bytes(p.now, &d, &mut p.senv), 0);
    assert!(drain(&mut p.c).is_empty() && drain(&mut p.s).is_empty());
}

#[test]
fn decline_with_reserved_version_falls_back_silently() {
    let mut b = decline(0x0303_0000, false, 1);
    b[7] = 0x00;
    let (outs, _) = client_gets(&cfg(), &b);
    assert!(
        sent(&outs).is_empty(),
        "never answer a Decline with a Decline"
    );
    fallback(done(&outs));
}

#[test]
fn tcp_closed_during_rendezvous_resets() {
    let now = t0();
    let mut env = FakeEnv::new(SERVER_HOST);
    let mut s = server(now, &cfg());
    only_accept(&feed(&mut s, now, &rfc_proposal_bytes(), &mut env));
    s.handle_tcp_closed(now, &mut env);
    assert_eq!(assert_reset(&drain(&mut s)), ResetReason::TcpClosed);
    assert_no_leak(&env, 0);
}

#[test]
fn tc_topt_03_04_not_eligible_sends_nothing() {
    for role in [Role::Client, Role::Server] {
        let why = Eligibility::NotEligible {
            reason: "peer did not announce SMC-R".into(),
        };
        let outs = match role {
            Role::Client => drain(&mut Rendezvous::client(t0(), &cfg(), client_route(), why)),
            Role::Server => drain(&mut Rendezvous::server(t0(), &cfg(), server_route(), why)),
        };
        assert!(sent(&outs).is_empty());
        let f = fallback(done(&outs));
        assert_eq!(f.local, DeclineCode::PEERNOSMC);
        assert_eq!(
            f.to_string(),
            "TCP fallback: SMC-R not negotiated: peer did not announce SMC-R"
        );
    }
}

#[test]
fn policy_override_starts_clc() {
    let mut m = Rendezvous::client(
        t0(),
        &cfg(),
        client_route(),
        Eligibility::PolicyOverride {
            pattern: "10.0.0.0/8:5000".into(),
        },
    );
    only_proposal(&drain(&mut m));
}

#[test]
fn reserved_version_in_accept_header() {
    // An Accept whose header says version 0 is consumed whole, then declined.
    let mut b = accept_bytes(&v1_accept());
    b[7] = 0x08;
    let (outs, _) = client_gets(&rfc_v1(), &b);
    assert_declined(&outs, DeclineCode::VERSMISMAT);
}

#[test]
fn reason_texts() {
    assert_eq!(
        ResetReason::Timeout(Waiting::Accept).to_string(),
        "timed out waiting for the CLC Accept"
    );
    assert_eq!(
        ResetReason::LocalFailure(DeclineCode::ERR_RTOK).to_string(),
        "internal error: rtoken handling failed (0x09990001), after the Decline window closed"
    );
    let f = FallbackReason {
        local: DeclineCode::DIFFPREFIX,
        peer: None,
        out_of_sync: false,
        detail: None,
    };
    assert_eq!(
        f.to_string(),
        "TCP fallback: declined: the peers are not on the same IP subnet/prefix (SMC-Rv1) \
         (0x03070000)"
    );
}

#[test]
fn absurd_timer_configuration_does_not_overflow() {
    let mut c = cfg();
    c.clc_timeout = Duration::MAX;
    c.decline_grace = Duration::MAX;
    assert_eq!(
        c.max_rendezvous_time(),
        // clc ×2 (capped), rkey, same-host, client CONFIRM LINK, ADD LINK, grace ×2.
        secs(3600.0 * 2.0 + 3.0 + 1.0 + 4.0 + 2.0 + 7200.0)
    );
    let now = t0();
    let (mut m, _) = client(now, &c);
    assert_eq!(m.poll_timeout(), Some(now + secs(3600.0)));
    let mut env = FakeEnv::new(CLIENT_HOST);
    m.on_timeout(now + secs(3600.0), &mut env);
    assert_eq!(
        assert_reset(&drain(&mut m)),
        ResetReason::Timeout(Waiting::Accept)
    );
}

/// Issue 10 item 2, the other side of `fin_during_the_link_wait_is_kept_for_the_connection`:
/// a FIN where a CLC message is still due, or in the middle of one, and a TCP
/// reset anywhere, end the rendezvous in a reset as before.
#[test]
fn fin_before_the_confirm_or_mid_message_and_rst_still_reset() {
    // Server waiting for the Confirm.
    let mut env = FakeEnv::new(SERVER_HOST);
    let now = t0();
    let mut s = server(now, &rfc_v1());
    only_accept(&feed(&mut s, now, &rfc_proposal_bytes(), &mut env));
    s.handle_tcp_fin(now, &mut env);
    assert_eq!(assert_reset(&drain(&mut s)), ResetReason::TcpClosed);
    assert_no_leak(&env, 0);

    // In the link wait, a FIN after half a Decline.
    let mut p = Pair::new(&rfc_v1(), &rfc_v1());
    p.llc = LlcScript::Silent;
    while p.pump() {}
    let d = decline(0x0300_0000, false, 1);
    assert!(p.s.bytes_wanted() > 0);
    p.s.handle_tcp_bytes(p.now, &d[..10], &mut p.senv);
    p.s.handle_tcp_fin(p.now, &mut p.senv);
    assert!(matches!(
        p.s.outcome(),
        Some(Outcome::Reset(ResetReason::TcpClosed))
    ));

    // In the link wait, an RST.
    let mut p = Pair::new(&rfc_v1(), &rfc_v1());
    p.llc = LlcScript::Silent;
    while p.pump() {}
    p.c.handle_tcp_closed(p.now, &mut p.cenv);
    assert!(matches!(
        p.c.outcome(),
        Some(Outcome::Reset(ResetReason::TcpClosed))
    ));
}
