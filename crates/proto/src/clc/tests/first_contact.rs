//! CHECKLIST §E.3 (first contact) and the rendezvous side of §E.4 (point of no return):
//! RFC 7609 §3.5.1, C.2, C.3, C.7.

use super::*;

fn v1() -> ClcConfig {
    let mut c = cfg();
    c.v2 = false;
    c
}

#[test]
fn tc_fc_01_happy_path_ipv4() {
    let mut p = Pair::new(&v1(), &v1());
    let (c, s) = p.run();
    let (c, s) = (smc(Some(&c)), smc(Some(&s)));
    assert_eq!((c.role, s.role), (Role::Client, Role::Server));
    assert_eq!((c.version, c.contact), (Version::V1, Contact::First));
    assert_eq!(s.contact, Contact::First);
    // Each side has the other's RMB and alert token.
    assert_eq!(c.peer_rmb.alert_token, s.local_rmb.alert_token);
    assert_eq!(s.peer_rmb.alert_token, c.local_rmb.alert_token);
    assert_eq!(c.peer_rmb.rkey, s.local_rmb.rkey);
    assert_eq!(s.peer_rmb.vaddr, c.local_rmb.vaddr);
    // The server's QP went RTR/RTS with the client's QP from the Confirm.
    let qp = p.senv.started.unwrap();
    assert_eq!(qp.link_id(s.peer_link.peer_id), s.peer_link);
    assert_eq!(qp.qpn, p.cenv.lgrs[&c.lgr].links[0].local.qpn);
    // The client's QP went RTR with the server's QP from the Accept.
    let req = &p.cenv.client_requests[0];
    assert_eq!(req.server.link_id(req.peer_id), c.peer_link);
    assert_eq!(c.peer_link.qpn, p.senv.lgrs[&s.lgr].links[0].local.qpn);
    // Order of the wire: Proposal, Accept, Confirm; nothing else.
    let kinds: Vec<_> = sent(&p.c_out)
        .iter()
        .chain(sent(&p.s_out).iter())
        .map(|m| m.msg_type().name())
        .collect();
    assert_eq!(kinds, ["Proposal", "Confirm", "Accept"]);
    assert_eq!(p.senv.live_rmbs.len(), 1);
    assert_eq!(p.cenv.live_rmbs.len(), 1);
}

#[test]
fn tc_fc_02_happy_path_ipv6() {
    let mut croute = client_route();
    let mut prefixes = ArrayVec::new();
    prefixes.push(smc_wire::clc::Ipv6Prefix {
        prefix: "fd00:99::".parse().unwrap(),
        len: 64,
    });
    croute.v1.as_mut().unwrap().1 = ProposalIp::V6 { prefixes };
    let mut sroute = server_route();
    sroute.v1_prefixes = Some(vec![LocalPrefix {
        addr: "fd00:99::1".parse().unwrap(),
        prefix_len: 64,
    }]);
    let mut p = Pair::start(
        t0(),
        &v1(),
        &v1(),
        croute,
        sroute,
        FakeEnv::new(CLIENT_HOST),
        FakeEnv::new(SERVER_HOST),
    );
    let (c, s) = p.run();
    smc(Some(&c));
    smc(Some(&s));
}

/// Runs a pair whose server declines; checks both sides and the server's resources.
fn declined_pair(mut p: Pair, code: DeclineCode) {
    let (c, s) = p.run();
    let fs = fallback(Some(&s));
    assert_eq!(fs.local, code);
    let fc = fallback(Some(&c));
    assert_eq!((fc.local, fc.peer), (DeclineCode::PEERDECL, Some(code)));
    assert_no_leak(&p.senv, 0);
    assert_no_leak(&p.cenv, 0);
}

#[test]
fn tc_fc_03_ipv4_subnet_mismatch() {
    let mut sroute = server_route();
    sroute.v1_prefixes = Some(vec![LocalPrefix {
        addr: "10.98.0.1".parse().unwrap(),
        prefix_len: 24,
    }]);
    let p = Pair::start(
        t0(),
        &v1(),
        &v1(),
        client_route(),
        sroute,
        FakeEnv::new(2),
        FakeEnv::new(1),
    );
    declined_pair(p, DeclineCode::DIFFPREFIX);
}

#[test]
fn tc_fc_04_ipv6_no_prefix_match() {
    let mut croute = client_route();
    let mut prefixes = ArrayVec::new();
    prefixes.push(smc_wire::clc::Ipv6Prefix {
        prefix: "fd00:99::".parse().unwrap(),
        len: 64,
    });
    croute.v1.as_mut().unwrap().1 = ProposalIp::V6 { prefixes };
    let mut sroute = server_route();
    sroute.v1_prefixes = Some(vec![LocalPrefix {
        addr: "fd00:98::1".parse().unwrap(),
        prefix_len: 64,
    }]);
    let p = Pair::start(
        t0(),
        &v1(),
        &v1(),
        croute,
        sroute,
        FakeEnv::new(2),
        FakeEnv::new(1),
    );
    declined_pair(p, DeclineCode::DIFFPREFIX);
}

#[test]
fn tc_fc_05_ipv6_zero_prefixes() {
    // Crafted: an IP area with no IPv4 subnet and no IPv6 prefix.
    let (_, mut prop) = client(t0(), &v1());
    if let smc_wire::clc::ProposalBody::V2 { ip: Some(ip), .. } = &mut prop.body {
        ip.subnet = Ipv4Addr::UNSPECIFIED;
        ip.prefix_len = 0;
    }
    let now = t0();
    let mut env = FakeEnv::new(SERVER_HOST);
    let mut s = server(now, &v1());
    let outs = feed_msg(&mut s, now, &ClcMessage::Proposal(prop), &mut env);
    assert_declined(&outs, DeclineCode::DIFFPREFIX);
    // A client with only an IPv6 interface without prefixes does not offer v1.
    let mut croute = client_route();
    croute.v1.as_mut().unwrap().1 = ProposalIp::V6 {
        prefixes: ArrayVec::new(),
    };
    let mut m = Rendezvous::client(now, &v1(), croute, Eligibility::BothAnnounced);
    let outs = drain(&mut m);
    let d = assert_declined(&outs, DeclineCode::NOSMCDEV);
    assert_eq!(d.version, 1, "Decline in place of the Proposal");
}

#[test]
fn tc_fc_06_policy_forbids_smcr() {
    let mut off = cfg();
    off.v1 = false;
    off.v2 = false;
    declined_pair(Pair::new(&cfg(), &off), DeclineCode::VERSMISMAT);
    // A server without any RoCE device on the route.
    let mut sroute = server_route();
    sroute.v1_prefixes = None;
    sroute.v2 = false;
    let p = Pair::start(
        t0(),
        &v1(),
        &v1(),
        client_route(),
        sroute,
        FakeEnv::new(2),
        FakeEnv::new(1),
    );
    declined_pair(p, DeclineCode::NOSMCRDEV);
}

#[test]
fn tc_fc_07_server_resource_failure() {
    for (create, alloc) in [
        (Some(DeclineCode::MEM), None),
        (None, Some(DeclineCode::MEM)),
    ] {
        let mut senv = FakeEnv::new(SERVER_HOST);
        senv.fail_create = create;
        senv.fail_alloc = alloc;
        declined_pair(
            Pair::with_envs(&v1(), &v1(), FakeEnv::new(2), senv),
            DeclineCode::MEM,
        );
    }
    let mut senv = FakeEnv::new(SERVER_HOST);
    senv.fail_start = Some(DeclineCode::ERR_RDYLNK);
    let mut p = Pair::with_envs(&v1(), &v1(), FakeEnv::new(2), senv);
    let (c, s) = p.run();
    assert_eq!(fallback(Some(&s)).local, DeclineCode::ERR_RDYLNK);
    assert_eq!(fallback(Some(&c)).peer, Some(DeclineCode::ERR_RDYLNK));
    assert_no_leak(&p.senv, 0);
    assert_no_leak(&p.cenv, 0);
}

#[test]
fn tc_fc_08_client_resource_failure() {
    for (create, alloc, register) in [
        (Some(DeclineCode::NOSMCRDEV), None, None),
        (None, Some(DeclineCode::MEM), None),
        (None, None, Some(DeclineCode::ERR_RTOK)),
    ] {
        let mut cenv = FakeEnv::new(CLIENT_HOST);
        cenv.fail_create = create;
        cenv.fail_alloc = alloc;
        cenv.fail_register = register;
        let code = create.or(alloc).or(register).unwrap();
        let mut p = Pair::with_envs(&v1(), &v1(), cenv, FakeEnv::new(SERVER_HOST));
        let (c, s) = p.run();
        assert_eq!(fallback(Some(&c)).local, code);
        assert_eq!(fallback(Some(&s)).peer, Some(code));
        let kinds: Vec<_> = sent(&p.c_out).iter().map(|m| m.msg_type().name()).collect();
        assert_eq!(
            kinds,
            ["Proposal", "Decline"],
            "Decline instead of the Confirm"
        );
        assert_no_leak(&p.cenv, 0);
        assert_no_leak(&p.senv, 0);
    }
}

#[test]
fn tc_fc_13_client_confirm_link_timer_expiry() {
    let mut p = Pair::new(&v1(), &v1());
    p.llc = LlcScript::Silent;
    let start = p.now;
    let (c, s) = p.run();
    assert_eq!(reset(Some(&c)), ResetReason::Timeout(Waiting::ConfirmLink));
    assert!(matches!(s, Outcome::Reset(_)));
    assert!(
        p.now - start >= secs(2.0),
        "the server's 2 s CONFIRM LINK wait"
    );
    assert!(sent(&p.c_out)
        .iter()
        .all(|m| !matches!(m, ClcMessage::Decline(_))));
    assert_no_leak(&p.cenv, 0);
    assert_no_leak(&p.senv, 0);
}

#[test]
fn tc_fc_13_linux_policy_declines_after_grace() {
    let mut c = v1();
    c.first_link_timeout = FirstLinkTimeout::DeclineAfterGrace;
    let now = t0();
    let mut env = FakeEnv::new(CLIENT_HOST);
    let (mut m, _) = client(now, &c);
    let acc = {
        let mut senv = FakeEnv::new(SERVER_HOST);
        let mut s = server(now, &c);
        let (_, prop) = client(now, &c);
        only_accept(&feed_msg(
            &mut s,
            now,
            &ClcMessage::Proposal(prop),
            &mut senv,
        ))
    };
    only_confirm(&feed_msg(&mut m, now, &ClcMessage::Accept(acc), &mut env));
    assert_eq!(m.poll_timeout(), Some(now + secs(4.0)));
    m.on_timeout(now + secs(4.0), &mut env);
    assert!(drain(&mut m).is_empty(), "grace period for a Decline");
    assert_eq!(m.poll_timeout(), Some(now + secs(5.0)));
    m.on_timeout(now + secs(5.0), &mut env);
    assert_declined(&drain(&mut m), DeclineCode::TIMEOUT_CL);
    assert_no_leak(&env, 0);
}

#[test]
fn tc_fc_14_server_confirm_link_send_error() {
    let mut p = Pair::new(&v1(), &v1());
    p.llc = LlcScript::ServerSendFails;
    let start = p.now;
    let (c, s) = p.run();
    assert_eq!(fallback(Some(&s)).local, DeclineCode::TIMEOUT_CL);
    assert_eq!(fallback(Some(&c)).peer, Some(DeclineCode::TIMEOUT_CL));
    assert_eq!(p.now, start, "the client falls back before its timer");
    assert_no_leak(&p.cenv, 0);
    assert_no_leak(&p.senv, 0);
}

#[test]
fn tc_fc_15_client_confirm_link_rsp_send_error() {
    let mut p = Pair::new(&v1(), &v1());
    p.llc = LlcScript::ClientSendFails;
    let (c, s) = p.run();
    assert_eq!(fallback(Some(&c)).local, DeclineCode::TIMEOUT_CL);
    // The server had sent its CONFIRM LINK but accepts the client's Decline (C.2).
    assert_eq!(fallback(Some(&s)).peer, Some(DeclineCode::TIMEOUT_CL));
    assert_no_leak(&p.cenv, 0);
    assert_no_leak(&p.senv, 0);
}

/// A server in the link wait (Confirm processed).
fn server_in_link_wait(c: &ClcConfig) -> (Rendezvous, FakeEnv, Instant) {
    let now = t0();
    let mut senv = FakeEnv::new(SERVER_HOST);
    let mut cenv = FakeEnv::new(CLIENT_HOST);
    let mut s = server(now, c);
    let (mut cm, prop) = client(now, c);
    let acc = feed_msg(&mut s, now, &ClcMessage::Proposal(prop), &mut senv);
    let conf = feed(&mut cm, now, &bytes_of(&acc), &mut cenv);
    assert!(feed(&mut s, now, &bytes_of(&conf), &mut senv).is_empty());
    assert!(senv.started.is_some());
    (s, senv, now)
}

#[test]
fn tc_fc_16_server_confirm_link_rsp_timeout() {
    let (mut s, mut env, now) = server_in_link_wait(&v1());
    s.handle_link_event(now, LinkEvent::ConfirmLinkSent, &mut env);
    assert_eq!(s.poll_timeout(), Some(now + secs(2.0)));
    s.on_timeout(now + secs(2.0), &mut env);
    assert_eq!(
        assert_reset(&drain(&mut s)),
        ResetReason::Timeout(Waiting::ConfirmLink)
    );
    assert_no_leak(&env, 0);
    // With Linux's policy it still resets: its CONFIRM LINK went out (C.2).
    let mut c = v1();
    c.first_link_timeout = FirstLinkTimeout::DeclineAfterGrace;
    let (mut s, mut env, now) = server_in_link_wait(&c);
    s.handle_link_event(now, LinkEvent::ConfirmLinkSent, &mut env);
    s.on_timeout(now + secs(2.0), &mut env);
    assert_reset(&drain(&mut s));
}

#[test]
fn tc_fc_17_no_data_before_second_link_attempt() {
    let (mut s, mut env, now) = server_in_link_wait(&v1());
    s.handle_link_event(now, LinkEvent::ConfirmLinkSent, &mut env);
    s.handle_link_event(now, LinkEvent::FirstLinkUp, &mut env);
    assert!(
        s.outcome().is_none(),
        "not open before the ADD LINK attempt resolved"
    );
    assert_eq!(s.poll_timeout(), Some(now + secs(2.0)));
    s.handle_link_event(now + secs(1.0), LinkEvent::SecondLinkSettled, &mut env);
    assert_eq!(smc(done(&drain(&mut s))).contact, Contact::First);
}

#[test]
fn tc_fc_20_decline_during_llc_accepted() {
    let (mut s, mut env, now) = server_in_link_wait(&v1());
    s.handle_link_event(now, LinkEvent::ConfirmLinkSent, &mut env);
    let d = ClcMessage::Decline(DeclineRepr {
        version: 1,
        diagnosis: DeclineCode::TIMEOUT_CL,
        ..Default::default()
    });
    assert!(
        s.bytes_wanted() > 0,
        "the TCP connection is read for a Decline (C.2)"
    );
    let outs = feed_msg(&mut s, now, &d, &mut env);
    assert_eq!(fallback(done(&outs)).peer, Some(DeclineCode::TIMEOUT_CL));
    assert_no_leak(&env, 0);
}

#[test]
fn tc_fc_21_no_decline_after_own_confirm_link() {
    let (mut s, mut env, now) = server_in_link_wait(&v1());
    s.handle_link_event(now, LinkEvent::ConfirmLinkSent, &mut env);
    s.handle_link_event(
        now,
        LinkEvent::Failed {
            failure: LinkFailure::InvalidMessage,
            code: DeclineCode::RMBE_EC,
        },
        &mut env,
    );
    assert_eq!(
        assert_reset(&drain(&mut s)),
        ResetReason::LocalFailure(DeclineCode::RMBE_EC)
    );
    assert_no_leak(&env, 0);
    // Before its CONFIRM LINK went out the same failure is a Decline.
    let (mut s, mut env, now) = server_in_link_wait(&v1());
    s.handle_link_event(
        now,
        LinkEvent::Failed {
            failure: LinkFailure::Other,
            code: DeclineCode::ERR_RDYLNK,
        },
        &mut env,
    );
    assert_declined(&drain(&mut s), DeclineCode::ERR_RDYLNK);
}

#[test]
fn tc_fc_23_client_waits_add_link_timeout() {
    for action in [AddLinkTimeout::Reset, AddLinkTimeout::ContinueSingleLink] {
        let mut c = v1();
        c.add_link_timeout_action = action;
        let mut p = Pair::new(&c, &c);
        p.llc = LlcScript::Silent;
        // Drive to the client's link wait, then only CONFIRM LINK happens.
        let prop = bytes_of(&drain(&mut p.c));
        let acc = bytes_of(&feed(&mut p.s, p.now, &prop, &mut p.senv));
        let conf = bytes_of(&feed(&mut p.c, p.now, &acc, &mut p.cenv));
        feed(&mut p.s, p.now, &conf, &mut p.senv);
        assert!(p.senv.started.is_some() && p.cenv.lgr_count() == 1);
        let now = p.now;
        p.c.handle_link_event(now, LinkEvent::FirstLinkUp, &mut p.cenv);
        assert_eq!(p.c.poll_timeout(), Some(now + secs(2.0)));
        p.c.on_timeout(now + secs(2.0), &mut p.cenv);
        match action {
            AddLinkTimeout::Reset => {
                assert_eq!(
                    assert_reset(&drain(&mut p.c)),
                    ResetReason::Timeout(Waiting::AddLink)
                );
                assert_no_leak(&p.cenv, 0);
            }
            AddLinkTimeout::ContinueSingleLink => {
                assert!(drain(&mut p.c).is_empty(), "1 s more for a Decline (Linux)");
                p.c.on_timeout(now + secs(3.0), &mut p.cenv);
                smc(done(&drain(&mut p.c)));
            }
        }
    }
}

#[test]
fn tc_sl_10_no_decline_after_point_of_no_return() {
    // A peer's Decline after the point of no return is a protocol error: reset.
    let (mut s, mut env, now) = server_in_link_wait(&v1());
    for ev in [
        LinkEvent::ConfirmLinkSent,
        LinkEvent::FirstLinkUp,
        LinkEvent::PointOfNoReturn,
    ] {
        s.handle_link_event(now, ev, &mut env);
    }
    let d = ClcMessage::Decline(DeclineRepr {
        version: 1,
        diagnosis: DeclineCode::TIMEOUT_AL,
        ..Default::default()
    });
    let outs = feed_msg(&mut s, now, &d, &mut env);
    assert_eq!(
        assert_reset(&outs),
        ResetReason::LateDecline(DeclineCode::TIMEOUT_AL)
    );
    // Before it (first link up, ADD LINK not yet sent), the Decline is honoured.
    let (mut s, mut env, now) = server_in_link_wait(&v1());
    s.handle_link_event(now, LinkEvent::FirstLinkUp, &mut env);
    let outs = feed_msg(&mut s, now, &d, &mut env);
    assert_eq!(fallback(done(&outs)).peer, Some(DeclineCode::TIMEOUT_AL));
    assert_no_leak(&env, 0);
}

#[test]
fn llc_timeout_event_is_handled_like_the_timer() {
    let (mut s, mut env, now) = server_in_link_wait(&v1());
    s.handle_link_event(
        now,
        LinkEvent::Failed {
            failure: LinkFailure::Timeout,
            code: DeclineCode::TIMEOUT_CL,
        },
        &mut env,
    );
    assert_eq!(
        assert_reset(&drain(&mut s)),
        ResetReason::Timeout(Waiting::ConfirmLink)
    );
}

#[test]
fn events_outside_the_link_wait_are_ignored() {
    let now = t0();
    let mut env = FakeEnv::new(1);
    let (mut c, _) = client(now, &v1());
    c.handle_link_event(now, LinkEvent::SecondLinkSettled, &mut env);
    c.handle_rkey_confirmed(now, Ok(()), &mut env);
    assert!(drain(&mut c).is_empty());
    assert!(c.outcome().is_none());
}

/// Issue 10 item 2: a peer that shuts down writing at once sends its TCP FIN right after
/// the Confirm (Linux `smc_shutdown` shuts the TCP socket too), while CONFIRM LINK is
/// still in flight. The FIN must not fail the rendezvous on either side: it is kept for
/// the connection, and nothing more is read from the socket.
#[test]
fn fin_during_the_link_wait_is_kept_for_the_connection() {
    for server_sees_fin in [true, false] {
        let mut p = Pair::new(&v1(), &v1());
        p.llc = LlcScript::Silent;
        while p.pump() {}
        assert!(p.llc_ready(), "both sides wait for the llc");
        if server_sees_fin {
            p.s.handle_tcp_fin(p.now, &mut p.senv);
            assert!(
                p.s.outcome().is_none(),
                "the server still waits for CONFIRM LINK"
            );
            assert_eq!(p.s.bytes_wanted(), 0, "nothing is read after the FIN");
        } else {
            p.c.handle_tcp_fin(p.now, &mut p.cenv);
            assert!(
                p.c.outcome().is_none(),
                "the client still waits for the llc"
            );
            assert_eq!(p.c.bytes_wanted(), 0, "nothing is read after the FIN");
        }
        p.llc = LlcScript::Normal;
        let (c, s) = p.run();
        smc(Some(&c));
        smc(Some(&s));
    }
}
