//! CHECKLIST §E.5 (subsequent contact and parallel link groups): RFC 7609 §3.5.2,
//! §3.5.3, C.4, §4.4.2.

use super::*;

fn v1() -> ClcConfig {
    let mut c = cfg();
    c.v2 = false;
    c
}

/// A pair after one successful first contact, ready for the next connection.
fn established(c: &ClcConfig) -> Pair {
    let mut p = Pair::new(c, c);
    let (a, b) = p.run();
    assert_eq!(smc(Some(&a)).contact, Contact::First);
    assert_eq!(smc(Some(&b)).contact, Contact::First);
    p.learn();
    p.next_connection(c, c)
}

/// Exchanges Proposal and Accept by hand; returns the Accept's bytes.
fn to_accept(p: &mut Pair) -> Vec<u8> {
    let prop = bytes_of(&drain(&mut p.c));
    bytes_of(&feed(&mut p.s, p.now, &prop, &mut p.senv))
}

#[test]
fn tc_sc_01_reuse_lg_existing_rmb() {
    for c in [v1(), cfg()] {
        let mut p = established(&c);
        let lgr_c = p.cenv.only_lgr();
        let lgr_s = p.senv.only_lgr();
        let (a, b) = p.run();
        let (a, b) = (smc(Some(&a)), smc(Some(&b)));
        assert_eq!(
            (a.contact, b.contact),
            (Contact::Subsequent, Contact::Subsequent)
        );
        assert_eq!((a.lgr, b.lgr), (lgr_c, lgr_s), "same link groups");
        assert_eq!(p.cenv.lgr_count(), 1);
        assert_eq!(p.senv.lgr_count(), 1);
        let acc = sent(&p.s_out);
        let [ClcMessage::Accept(acc)] = acc.as_slice() else {
            panic!("{acc:?}")
        };
        assert!(!acc.first_contact);
        assert_eq!(acc.buffer_len(), if c.v2 { 108 } else { 68 });
        assert_eq!(a.peer_rmb.alert_token, b.local_rmb.alert_token);
        assert_eq!(p.cenv.live_rmbs.len(), 2, "a second RMB element per side");
        assert_eq!(p.senv.live_rmbs.len(), 2);
    }
}

#[test]
fn tc_sc_04_client_picks_other_link() {
    let mut p = established(&v1());
    // Both sides have a second link, known to each other.
    let (cl, sl) = (p.cenv.only_lgr(), p.senv.only_lgr());
    let c2 = p.cenv.add_link(cl, None);
    let s2 = p.senv.add_link(
        sl,
        Some(PeerLinkId {
            peer_id: client_route().peer_id,
            gid: c2.gid,
            mac: c2.mac,
            qpn: c2.qpn,
        }),
    );
    p.cenv.lgrs.get_mut(&cl).unwrap().links[1].peer = Some(PeerLinkId {
        peer_id: server_route().peer_id,
        gid: s2.gid,
        mac: s2.mac,
        qpn: s2.qpn,
    });
    let acc = to_accept(&mut p);
    let confirm = bytes_of(&feed(&mut p.c, p.now, &acc, &mut p.cenv));
    let mut c = match ClcMessage::parse(&confirm).unwrap() {
        ClcMessage::Confirm(c) => c,
        m => panic!("{m:?}"),
    };
    c.qpn = c2.qpn; // the client names its second link
    let outs = feed_msg(&mut p.s, p.now, &ClcMessage::Confirm(c), &mut p.senv);
    let s = smc(done(&outs));
    assert_eq!(s.peer_rmb_link, s2.link, "the peer's RToken is for link 2");
    assert_ne!(s.link, s2.link, "our Accept named link 1");
}

#[test]
fn tc_sc_05_confirm_unknown_link() {
    let mut p = established(&v1());
    let acc = to_accept(&mut p);
    let confirm = bytes_of(&feed(&mut p.c, p.now, &acc, &mut p.cenv));
    let mut c = match ClcMessage::parse(&confirm).unwrap() {
        ClcMessage::Confirm(c) => c,
        m => panic!("{m:?}"),
    };
    c.qpn = U24::new(0x999).unwrap();
    let rmbs = p.senv.live_rmbs.len();
    let outs = feed_msg(&mut p.s, p.now, &ClcMessage::Confirm(c), &mut p.senv);
    assert!(
        matches!(assert_reset(&outs), ResetReason::Protocol(_)),
        "no Decline after the Accept"
    );
    assert_eq!(
        p.senv.live_rmbs.len(),
        rmbs - 1,
        "the new RMB element is freed"
    );
    assert_eq!(p.senv.lgr_count(), 1, "the existing link group stays");
}

#[test]
fn tc_sc_06_server_new_rmb_before_accept() {
    let mut p = established(&v1());
    p.senv.needs_rkey = true;
    let prop = bytes_of(&drain(&mut p.c));
    let outs = feed(&mut p.s, p.now, &prop, &mut p.senv);
    assert!(sent(&outs).is_empty(), "no Accept before CONFIRM RKEY");
    assert!(matches!(outs.as_slice(), [Output::ConfirmRkey { .. }]));
    assert_eq!(p.s.bytes_wanted(), 0, "nothing read meanwhile");
    p.s.handle_rkey_confirmed(p.now, Ok(()), &mut p.senv);
    only_accept(&drain(&mut p.s));

    // CONFIRM RKEY fails, or never ends: Decline (still before the Accept).
    for fail in [true, false] {
        let mut p = established(&v1());
        p.senv.needs_rkey = true;
        let prop = bytes_of(&drain(&mut p.c));
        feed(&mut p.s, p.now, &prop, &mut p.senv);
        if fail {
            p.s.handle_rkey_confirmed(p.now, Err(DeclineCode::ERR_REGBUF), &mut p.senv);
        } else {
            assert_eq!(p.s.poll_timeout(), Some(p.now + secs(3.0)));
            p.s.on_timeout(p.now + secs(3.0), &mut p.senv);
        }
        assert_declined(&drain(&mut p.s), DeclineCode::ERR_REGBUF);
        assert_eq!(p.senv.live_rmbs.len(), 1, "the new element is freed");
    }
}

#[test]
fn tc_sc_07_client_new_rmb_before_confirm() {
    let mut p = established(&v1());
    p.cenv.needs_rkey = true;
    let acc = to_accept(&mut p);
    let outs = feed(&mut p.c, p.now, &acc, &mut p.cenv);
    assert!(
        sent(&outs).is_empty(),
        "no Confirm before CONFIRM RKEY (Fig 13)"
    );
    let [Output::ConfirmRkey { lgr, .. }] = outs.as_slice() else {
        panic!("{outs:?}")
    };
    assert_eq!(*lgr, p.cenv.only_lgr());
    p.c.handle_rkey_confirmed(p.now, Ok(()), &mut p.cenv);
    let outs = drain(&mut p.c);
    only_confirm(&outs);
    smc(done(&outs));
    // Failure: Decline in place of the Confirm.
    let mut p = established(&v1());
    p.cenv.needs_rkey = true;
    let acc = to_accept(&mut p);
    feed(&mut p.c, p.now, &acc, &mut p.cenv);
    p.c.handle_rkey_confirmed(p.now, Err(DeclineCode::ERR_REGBUF), &mut p.cenv);
    assert_declined(&drain(&mut p.c), DeclineCode::ERR_REGBUF);
    assert_eq!(p.cenv.live_rmbs.len(), 1);
}

#[test]
fn tc_sc_08_12_accept_f0_unknown_link_out_of_sync() {
    // C.4: the client lost its only link group, the server still has it.
    let mut p = established(&v1());
    let lgr = p.cenv.only_lgr();
    p.cenv.lgrs.remove(&lgr);
    let acc = to_accept(&mut p);
    let outs = feed(&mut p.c, p.now, &acc, &mut p.cenv);
    let d = assert_declined(&outs, DeclineCode::SYNCERR);
    assert!(d.out_of_sync, "S = 1");
    assert!(fallback(done(&outs)).out_of_sync);
    // The server tears its link group down.
    let slgr = p.senv.only_lgr();
    let outs = feed_msg(&mut p.s, p.now, &ClcMessage::Decline(d), &mut p.senv);
    assert!(outs.contains(&Output::OutOfSync { lgr: slgr }));
}

#[test]
fn accept_f0_link_group_without_that_link() {
    let mut p = established(&v1());
    let lgr = p.cenv.only_lgr();
    p.cenv.lgrs.get_mut(&lgr).unwrap().links[0].peer = None;
    let acc = to_accept(&mut p);
    let d = assert_declined(
        &feed(&mut p.c, p.now, &acc, &mut p.cenv),
        DeclineCode::NOSRVLINK,
    );
    assert!(!d.out_of_sync, "Linux NOSRVLINK has no S flag");
}

#[test]
fn accept_f1_naming_an_active_link_is_out_of_sync() {
    let mut p = established(&v1());
    let lgr = p.cenv.only_lgr();
    let acc = to_accept(&mut p);
    let mut a = match ClcMessage::parse(&acc).unwrap() {
        ClcMessage::Accept(a) => a,
        m => panic!("{m:?}"),
    };
    a.first_contact = true;
    let outs = feed_msg(&mut p.c, p.now, &ClcMessage::Accept(a), &mut p.cenv);
    let d = assert_declined(&outs, DeclineCode::SYNCERR);
    assert!(d.out_of_sync);
    // The server hears S = 1; our link group stays (the Accept's claim to be its peer
    // proves nothing: a stranger could name it to end it).
    assert!(!outs.iter().any(|o| matches!(o, Output::OutOfSync { .. })));
    assert!(p.cenv.lgrs.contains_key(&lgr));
}

#[test]
fn tc_sc_09_new_rtoken_not_first_contact() {
    let mut p = established(&v1());
    let acc = to_accept(&mut p);
    let mut a = match ClcMessage::parse(&acc).unwrap() {
        ClcMessage::Accept(a) => a,
        m => panic!("{m:?}"),
    };
    a.rmb_rkey ^= 0x5555;
    let outs = feed_msg(&mut p.c, p.now, &ClcMessage::Accept(a.clone()), &mut p.cenv);
    let e = smc(done(&outs));
    assert_eq!(e.contact, Contact::Subsequent);
    assert_eq!(e.peer_rmb.rkey, a.rmb_rkey);
}

#[test]
fn tc_sc_10_11_rmbe_conflict() {
    // Client side.
    let mut p = established(&v1());
    p.cenv.conflict = Some(ConnRef(77));
    let acc = to_accept(&mut p);
    let outs = feed(&mut p.c, p.now, &acc, &mut p.cenv);
    assert!(outs.contains(&Output::AbortConn { conn: ConnRef(77) }));
    smc(done(&outs));
    // Server side.
    let mut p = established(&v1());
    p.senv.conflict = Some(ConnRef(78));
    let (_, s) = p.run();
    smc(Some(&s));
    assert!(p.s_out.contains(&Output::AbortConn { conn: ConnRef(78) }));
}

#[test]
fn tc_sc_13_rmb_limit() {
    // No room for another RMB: the server declines (FB), nothing leaks.
    let mut p = established(&v1());
    p.senv.fail_alloc = Some(DeclineCode::MEM);
    let (c, s) = p.run();
    assert_eq!(fallback(Some(&s)).local, DeclineCode::MEM);
    assert_eq!(fallback(Some(&c)).peer, Some(DeclineCode::MEM));
    assert_eq!(p.senv.live_rmbs.len(), 1);
    assert_eq!(p.cenv.live_rmbs.len(), 1);
    assert_eq!((p.senv.lgr_count(), p.cenv.lgr_count()), (1, 1));
}

#[test]
fn tc_sc_14_15_parallel_lg_f1() {
    let mut p = established(&v1());
    p.senv.full = true;
    let (c, s) = p.run();
    let (c, s) = (smc(Some(&c)), smc(Some(&s)));
    assert_eq!(
        (c.contact, s.contact),
        (Contact::Parallel, Contact::Parallel)
    );
    let msgs = sent(&p.s_out);
    let [ClcMessage::Accept(a)] = msgs.as_slice() else {
        panic!("{msgs:?}")
    };
    assert!(a.first_contact, "F = 1 for a parallel link group");
    assert_eq!((p.cenv.lgr_count(), p.senv.lgr_count()), (2, 2));
    // New RMBs in the new link groups.
    assert_eq!(p.cenv.live_rmbs[&c.local_rmb.rmb], c.lgr);
    assert_ne!(c.lgr, *p.cenv.lgrs.keys().next().unwrap());
}

#[test]
fn tc_sc_17_per_process_peer_id() {
    // Another process = another Peer ID: the server creates a new link group.
    let mut p = established(&v1());
    let mut route = client_route();
    route.peer_id.instance ^= 0xffff;
    p.c = Rendezvous::client(p.now, &v1(), route, Eligibility::BothAnnounced);
    let (_, s) = p.run();
    assert_eq!(smc(Some(&s)).contact, Contact::First);
    assert_eq!(p.senv.lgr_count(), 2);
}
