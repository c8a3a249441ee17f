//! SMC-Rv2 / v2.1 (Linux dialect, linux-smc.md §1.3–§1.5, §2.12): version negotiation,
//! EIDs, release and limits in both directions, routes and `v2_direct`.

use super::*;
use smc_wire::clc::{PathType, ProposalBody};

fn v2_only_route() -> ClientRoute {
    let mut r = client_route();
    r.v1 = None;
    r
}

/// A client (v2 offered) and the server's Accept to its Proposal.
fn client_and_accept(
    ccfg: &ClcConfig,
    route: ClientRoute,
) -> (Rendezvous, AcceptConfirmRepr, Instant) {
    let now = t0();
    let mut c = Rendezvous::client(now, ccfg, route, Eligibility::BothAnnounced);
    let prop = only_proposal(&drain(&mut c));
    let mut senv = FakeEnv::new(SERVER_HOST);
    let mut s = server(now, &cfg());
    let a = only_accept(&feed_msg(
        &mut s,
        now,
        &ClcMessage::Proposal(prop),
        &mut senv,
    ));
    (c, a, now)
}

fn client_gets_accept(a: AcceptConfirmRepr) -> (Vec<Output>, FakeEnv) {
    client_gets_accept_env(a, FakeEnv::new(CLIENT_HOST))
}

fn client_gets_accept_env(a: AcceptConfirmRepr, mut env: FakeEnv) -> (Vec<Output>, FakeEnv) {
    let (mut c, _, now) = client_and_accept(&cfg(), v2_only_route());
    let outs = feed_msg(&mut c, now, &ClcMessage::Accept(a), &mut env);
    (outs, env)
}

fn v2_accept() -> AcceptConfirmRepr {
    client_and_accept(&cfg(), v2_only_route()).1
}

fn with_fce(
    mut a: AcceptConfirmRepr,
    f: impl FnOnce(&mut smc_wire::clc::FirstContactExt),
) -> AcceptConfirmRepr {
    f(a.v2.as_mut().unwrap().fce.as_mut().unwrap());
    a
}

/// A server that answered a v2-only Proposal and got the client's first Confirm back,
/// returned before the Confirm is processed.
fn server_and_confirm() -> (Rendezvous, FakeEnv, AcceptConfirmRepr, Instant) {
    let now = t0();
    let mut senv = FakeEnv::new(SERVER_HOST);
    let mut cenv = FakeEnv::new(CLIENT_HOST);
    let mut s = server(now, &cfg());
    let mut c = Rendezvous::client(now, &cfg(), v2_only_route(), Eligibility::BothAnnounced);
    let prop = bytes_of(&drain(&mut c));
    let acc = bytes_of(&feed(&mut s, now, &prop, &mut senv));
    let conf = only_confirm(&feed(&mut c, now, &acc, &mut cenv));
    (s, senv, conf, now)
}

#[test]
fn v2_first_and_subsequent_contact() {
    let mut p = Pair::new(&cfg(), &cfg());
    let (c, s) = p.run();
    let (c, s) = (smc(Some(&c)), smc(Some(&s)));
    assert_eq!((c.version, s.version), (Version::V2, Version::V2));
    let msgs: Vec<_> = sent(&p.s_out).into_iter().chain(sent(&p.c_out)).collect();
    let lens: Vec<_> = msgs.iter().map(|m| m.buffer_len()).collect();
    assert_eq!(
        lens,
        [160, 164, 180],
        "Accept, Proposal (v1+v2, 1 UEID), Confirm (1 GID)"
    );
    for e in [&c, &s] {
        let v2 = e.v2.as_ref().unwrap();
        assert_eq!(v2.eid.to_string(), UEID);
        let f = v2.first_contact.as_ref().unwrap();
        assert_eq!(
            (
                f.params.release,
                f.params.max_conns,
                f.params.max_links,
                f.params.feature_mask
            ),
            (1, 255, 2, 1)
        );
        assert_eq!(f.peer_os, 2);
    }
    let sf = s.v2.as_ref().unwrap().first_contact.clone().unwrap();
    assert_eq!(sf.peer_hostname.to_string(), "smc-rs-test");
    assert_eq!(sf.peer_gids, vec![gid4(CLIENT_HOST)]);
    // The server looked its link groups up by the v2 GID.
    assert_eq!(p.senv.lgr_queries[0].peer_gid, gid4(CLIENT_HOST));

    p.learn();
    let mut p = p.next_connection(&cfg(), &cfg());
    let (c, s) = p.run();
    let (c, s) = (smc(Some(&c)), smc(Some(&s)));
    assert_eq!(
        (c.contact, s.contact),
        (Contact::Subsequent, Contact::Subsequent)
    );
    assert!(c.v2.as_ref().unwrap().first_contact.is_none());
    let lens: Vec<_> = sent(&p.s_out)
        .into_iter()
        .chain(sent(&p.c_out))
        .map(|m| m.buffer_len())
        .collect();
    assert_eq!(lens, [108, 164, 108]);
}

#[test]
fn v1_v2_offer_to_v1_only_server() {
    let mut s = cfg();
    s.v2 = false;
    let mut p = Pair::new(&cfg(), &s);
    let (c, _) = p.run();
    assert_eq!(smc(Some(&c)).version, Version::V1);
    // Same when the server has SMC-Rv2 but another EID.
    let mut s = cfg();
    s.v2_config.ueids = ueids("SMC-PEER-OTHER");
    let mut p = Pair::new(&cfg(), &s);
    let (c, s) = p.run();
    assert_eq!(
        (smc(Some(&c)).version, smc(Some(&s)).version),
        (Version::V1, Version::V1)
    );
}

#[test]
fn v2_only_eid_mismatch_is_nosmcdev() {
    // kernel-peer README §V4(f): Linux answers a mismatching EID with NOSMCDEV, in a
    // 44-byte v2 Decline with OS type Linux.
    let mut s = cfg();
    s.v2_config.ueids = ueids("SMC-PEER-OTHER");
    let now = t0();
    let mut p = Pair::start(
        now,
        &cfg(),
        &s,
        v2_only_route(),
        server_route(),
        FakeEnv::new(2),
        FakeEnv::new(1),
    );
    let (c, _) = p.run();
    let d = only_decline(&p.s_out);
    assert_eq!(
        (d.version, d.os_type, d.diagnosis),
        (2, 2, DeclineCode::NOSMCDEV)
    );
    assert_eq!(ClcMessage::Decline(d).to_vec().unwrap().len(), 44);
    assert_eq!(fallback(Some(&c)).peer, Some(DeclineCode::NOSMCDEV));
    // A server with no UEID at all says the same.
    let mut s = cfg();
    s.v2_config.ueids = UeidTable::new();
    let mut p = Pair::start(
        now,
        &cfg(),
        &s,
        v2_only_route(),
        server_route(),
        FakeEnv::new(2),
        FakeEnv::new(1),
    );
    p.run();
    assert_eq!(only_decline(&p.s_out).diagnosis, DeclineCode::NOSMCDEV);
}

#[test]
fn v2_offer_without_eid_is_noueid() {
    let mut c = Rendezvous::client(t0(), &cfg(), v2_only_route(), Eligibility::BothAnnounced);
    let mut prop = only_proposal(&drain(&mut c));
    if let ProposalBody::V2 { v2: Some(ext), .. } = &mut prop.body {
        ext.eids.clear();
    }
    let now = t0();
    let mut env = FakeEnv::new(SERVER_HOST);
    let mut s = server(now, &cfg());
    let outs = feed_msg(&mut s, now, &ClcMessage::Proposal(prop), &mut env);
    assert_declined(&outs, DeclineCode::NOUEID);
}

#[test]
fn client_without_ueid_offers_v1_only() {
    let mut c = cfg();
    c.v2_config.ueids = UeidTable::new();
    let (_, p) = client(t0(), &c);
    assert_eq!((p.typev1, p.typev2), (PathType::R, PathType::N));
    // And with no v1 route either: a Decline in place of the Proposal (Linux).
    let mut m = Rendezvous::client(t0(), &c, v2_only_route(), Eligibility::BothAnnounced);
    assert_declined(&drain(&mut m), DeclineCode::NOSMCDEV);
}

#[test]
fn server_without_v2_route() {
    let mut senv = FakeEnv::new(SERVER_HOST);
    senv.route = None;
    let mut p = Pair::start(
        t0(),
        &cfg(),
        &cfg(),
        v2_only_route(),
        server_route(),
        FakeEnv::new(2),
        senv,
    );
    p.run();
    assert_eq!(only_decline(&p.s_out).diagnosis, DeclineCode::NOSMCRDEV);
    let mut sroute = server_route();
    sroute.v2 = false;
    let mut p = Pair::start(
        t0(),
        &cfg(),
        &cfg(),
        v2_only_route(),
        sroute,
        FakeEnv::new(2),
        FakeEnv::new(1),
    );
    p.run();
    assert_eq!(only_decline(&p.s_out).diagnosis, DeclineCode::NOSMCRDEV);
}

#[test]
fn smcd_only_proposal() {
    let mut c = Rendezvous::client(t0(), &cfg(), v2_only_route(), Eligibility::BothAnnounced);
    let mut prop = only_proposal(&drain(&mut c));
    prop.typev1 = PathType::D;
    prop.typev2 = PathType::N;
    if let ProposalBody::V2 { v2, ip, .. } = &mut prop.body {
        *v2 = None;
        *ip = Some(smc_wire::clc::IpArea {
            subnet: Ipv4Addr::new(10, 99, 0, 0),
            prefix_len: 24,
            ipv6_prefixes: ArrayVec::new(),
        });
    }
    let now = t0();
    let mut env = FakeEnv::new(SERVER_HOST);
    let mut s = server(now, &cfg());
    let outs = feed_msg(&mut s, now, &ClcMessage::Proposal(prop), &mut env);
    assert_declined(&outs, DeclineCode::NOSMCDDEV);
}

#[test]
fn release_mismatch_both_directions() {
    // Client: an Accept with a release above what we offered.
    let (outs, env) = client_gets_accept(with_fce(v2_accept(), |f| f.release = 2));
    assert_declined(&outs, DeclineCode::RELEASEERR);
    assert_no_leak(&env, 0);
    // Server: a Confirm that does not echo the negotiated release.
    let (mut s, mut env, mut conf, now) = server_and_confirm();
    conf.v2.as_mut().unwrap().fce.as_mut().unwrap().release = 0;
    let outs = feed_msg(&mut s, now, &ClcMessage::Confirm(conf), &mut env);
    assert_declined(&outs, DeclineCode::RELEASEERR);
    assert_no_leak(&env, 0);
    // A v2.0 peer (release 0): no limits negotiated, values 0 on the wire.
    let (outs, _) = client_gets_accept(with_fce(v2_accept(), |f| {
        f.release = 0;
        f.max_conns = 0;
        f.max_links = 0;
    }));
    let c = only_confirm(&outs);
    let f = c.v2.unwrap().fce.unwrap();
    assert_eq!((f.release, f.max_conns, f.max_links), (0, 0, 0));
}

#[test]
fn max_conns_and_max_links_both_directions() {
    // Server: min(offered, ours) below the thresholds.
    for (conns, links, code) in [
        (15u8, 2u8, DeclineCode::MAXCONNERR),
        (255, 0, DeclineCode::MAXLINKERR),
    ] {
        let mut c = Rendezvous::client(t0(), &cfg(), v2_only_route(), Eligibility::BothAnnounced);
        let mut prop = only_proposal(&drain(&mut c));
        if let ProposalBody::V2 { v2: Some(ext), .. } = &mut prop.body {
            ext.max_conns = conns;
            ext.max_links = links;
        }
        let now = t0();
        let mut env = FakeEnv::new(SERVER_HOST);
        let mut s = server(now, &cfg());
        assert_declined(
            &feed_msg(&mut s, now, &ClcMessage::Proposal(prop.clone()), &mut env),
            code,
        );
        // With v1 offered too, the server answers in v1 instead.
        let (_, mut both) = client(t0(), &cfg());
        if let ProposalBody::V2 { v2: Some(ext), .. } = &mut both.body {
            ext.max_conns = conns;
            ext.max_links = links;
        }
        let mut s = server(now, &cfg());
        let a = only_accept(&feed_msg(
            &mut s,
            now,
            &ClcMessage::Proposal(both),
            &mut env,
        ));
        assert_eq!(a.version, 1);
    }
    // Server: our own limits are smaller.
    let mut small = cfg();
    small.v2_config.max_conns = 32;
    small.v2_config.max_links = 1;
    let mut p = Pair::new(&cfg(), &small);
    let (c, _) = p.run();
    let f = smc(Some(&c)).v2.unwrap().first_contact.unwrap();
    assert_eq!((f.params.max_conns, f.params.max_links), (32, 1));
    // Client: an Accept out of bounds.
    for (conns, links, code) in [
        (15u8, 2u8, DeclineCode::MAXCONNERR),
        (255, 3, DeclineCode::MAXLINKERR),
        (255, 0, DeclineCode::MAXLINKERR),
    ] {
        let (outs, _) = client_gets_accept(with_fce(v2_accept(), |f| {
            f.max_conns = conns;
            f.max_links = links;
        }));
        assert_declined(&outs, code);
    }
    // Server: a Confirm that does not echo them.
    for (conns, links, code) in [
        (254u8, 2u8, DeclineCode::MAXCONNERR),
        (255, 1, DeclineCode::MAXLINKERR),
    ] {
        let (mut s, mut env, mut conf, now) = server_and_confirm();
        let f = conf.v2.as_mut().unwrap().fce.as_mut().unwrap();
        f.max_conns = conns;
        f.max_links = links;
        assert_declined(
            &feed_msg(&mut s, now, &ClcMessage::Confirm(conf), &mut env),
            code,
        );
    }
}

#[test]
fn single_link_group_completes_without_add_link() {
    let mut small = cfg();
    small.v2_config.max_links = 1;
    let (mut s, mut env, conf, now) = {
        let now = t0();
        let mut senv = FakeEnv::new(SERVER_HOST);
        let mut cenv = FakeEnv::new(CLIENT_HOST);
        let mut s = server(now, &small);
        let mut c = Rendezvous::client(now, &cfg(), v2_only_route(), Eligibility::BothAnnounced);
        let prop = bytes_of(&drain(&mut c));
        let acc = bytes_of(&feed(&mut s, now, &prop, &mut senv));
        let conf = only_confirm(&feed(&mut c, now, &acc, &mut cenv));
        (s, senv, conf, now)
    };
    assert!(feed_msg(&mut s, now, &ClcMessage::Confirm(conf), &mut env).is_empty());
    s.handle_link_event(now, LinkEvent::FirstLinkUp, &mut env);
    smc(done(&drain(&mut s)));
}

#[test]
fn v2_direct_and_routes() {
    // Server: its route decides v2_direct in the Accept.
    let now = t0();
    let mut senv = FakeEnv::new(SERVER_HOST);
    senv.route = Some(V2Route {
        uses_gateway: true,
        nexthop_mac: Mac([0x66; 6]),
    });
    let mut s = server(now, &cfg());
    let (_, prop) = client(now, &cfg());
    let a = only_accept(&feed_msg(
        &mut s,
        now,
        &ClcMessage::Proposal(prop),
        &mut senv,
    ));
    assert!(!a.v2.as_ref().unwrap().fce.unwrap().v2_direct);
    // Client: "not direct" needs a route through a gateway.
    let indirect = with_fce(v2_accept(), |f| f.v2_direct = false);
    let mut env = FakeEnv::new(CLIENT_HOST);
    env.route = None;
    assert_declined(
        &client_gets_accept_env(indirect.clone(), env).0,
        DeclineCode::NOROUTE,
    );
    let env = FakeEnv::new(CLIENT_HOST); // its route is direct
    assert_declined(
        &client_gets_accept_env(indirect.clone(), env).0,
        DeclineCode::NOINDIRECT,
    );
    let mut env = FakeEnv::new(CLIENT_HOST);
    let gw = V2Route {
        uses_gateway: true,
        nexthop_mac: Mac([0x66; 6]),
    };
    env.route = Some(gw);
    let (outs, env) = client_gets_accept_env(indirect, env);
    assert!(!only_confirm(&outs).v2.unwrap().fce.unwrap().v2_direct);
    assert_eq!(env.client_requests[0].route, Some(gw));
    // Direct: the next hop is the server's MAC from the Accept.
    let (outs, env) = client_gets_accept(v2_accept());
    only_confirm(&outs);
    let r = env.client_requests[0].route.unwrap();
    assert_eq!((r.uses_gateway, r.nexthop_mac), (false, mac(SERVER_HOST)));
}

#[test]
fn accept_eid_and_version_must_match_the_offer() {
    let mut a = v2_accept();
    a.v2.as_mut().unwrap().eid = smc_wire::common::Eid::new("NOT-OFFERED").unwrap();
    assert_declined(&client_gets_accept(a).0, DeclineCode::NOUEID);
    // A v1 Accept to a v2-only offer, and a v2 Accept to a v1-only offer.
    let mut a = v2_accept();
    a.version = 1;
    a.v2 = None;
    assert_declined(&client_gets_accept(a).0, DeclineCode::MODEUNSUPP);
    let mut c1 = cfg();
    c1.v2 = false;
    let (mut c, _) = client(t0(), &c1);
    let mut env = FakeEnv::new(CLIENT_HOST);
    let outs = feed_msg(&mut c, t0(), &ClcMessage::Accept(v2_accept()), &mut env);
    assert_declined(&outs, DeclineCode::MODEUNSUPP);
}

#[test]
fn v2_first_contact_accept_without_extension_is_a_protocol_error() {
    let mut a = v2_accept();
    a.v2.as_mut().unwrap().fce = None;
    let (outs, _) = client_gets_accept(a);
    assert!(matches!(assert_reset(&outs), ResetReason::Protocol(_)));
}

#[test]
fn decline_version_follows_the_peer() {
    // A server declines a version-2 Proposal with a 44-byte Decline, a version-1
    // Proposal with a 28-byte one.
    for (layout, len) in [
        (ProposalLayout::Linux, 44usize),
        (ProposalLayout::Rfc7609, 28),
    ] {
        let mut c = cfg();
        c.v2 = false;
        c.proposal_layout = layout;
        let mut senv = FakeEnv::new(SERVER_HOST);
        senv.fail_create = Some(DeclineCode::MEM);
        let mut p = Pair::with_envs(&c, &c, FakeEnv::new(CLIENT_HOST), senv);
        p.run();
        assert_eq!(bytes_of(&p.s_out).len(), len, "{layout:?}");
    }
}
