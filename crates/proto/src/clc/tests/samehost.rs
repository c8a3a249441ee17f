//! smc-rs's same-host negotiation (`smc_wire::clc::samehost`, docs/samehost.md): the
//! offer in the Proposal, the server's choice, the client's checks, and that everything
//! else (a server that does not take the offer, a Linux server) stays SMC-R as before.

use super::*;
use smc_wire::clc::{ProposalBody, SameHostAcceptRepr, SameHostOffer};

const OFFER: SameHostOffer = SameHostOffer {
    stack_id: 0x5eed_0000_0000_0001,
    nonce: 0x0123_4567_89ab_cdef,
};

fn offering_client(now: Instant) -> (Rendezvous, ProposalRepr) {
    let mut route = client_route();
    route.same_host = Some(OFFER);
    let mut m = Rendezvous::client(now, &cfg(), route, Eligibility::BothAnnounced);
    let outs = drain(&mut m);
    (m, only_proposal(&outs))
}

fn taking_server(now: Instant) -> Rendezvous {
    let mut route = server_route();
    route.same_host = true;
    Rendezvous::server(now, &cfg(), route, Eligibility::BothAnnounced)
}

#[test]
fn offer_rides_in_the_smcd_area_and_the_rest_is_unchanged() {
    let now = t0();
    let (_, p) = offering_client(now);
    let (_, plain) = client(now, &cfg());
    let ProposalBody::V2 { smcd, .. } = &p.body else {
        panic!("Linux layout expected")
    };
    assert_eq!(SameHostOffer::from_smcd_area(smcd), Some(OFFER));
    // Apart from the SMC-D area's vendor/reserved bytes, the same Proposal as without it.
    let (a, b) = (
        ClcMessage::Proposal(p.clone()).to_vec().unwrap(),
        ClcMessage::Proposal(plain).to_vec().unwrap(),
    );
    assert_eq!(a.len(), b.len());
    let diff: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
    assert!(
        diff.iter().all(|&i| (52..80).contains(&i)),
        "only bytes 52..80 (vendor OUI, options, reserved) differ: {diff:?}"
    );
}

#[test]
fn server_takes_the_offer_and_client_completes() {
    let now = t0();
    let (mut c, p) = offering_client(now);
    let mut s = taking_server(now);
    assert!(drain(&mut s).is_empty());
    let mut senv = FakeEnv::new(SERVER_HOST);
    senv.same_host_grant = ServerSameHost::Taken(77);
    let outs = feed_msg(&mut s, now, &ClcMessage::Proposal(p), &mut senv);
    assert_eq!(senv.same_host_offers, vec![OFFER]);
    let answer = match sent(&outs).as_slice() {
        [ClcMessage::SameHostAccept(a)] => *a,
        other => panic!("expected a same-host Accept, got {other:?}"),
    };
    assert_eq!(
        answer,
        SameHostAcceptRepr {
            stack_id: 77,
            nonce: OFFER.nonce
        }
    );
    assert!(matches!(
        done(&outs),
        Some(Outcome::SameHost(e)) if e.role == Role::Server && e.nonce == OFFER.nonce
    ));
    assert_no_leak(&senv, 0);
    let mut cenv = FakeEnv::new(CLIENT_HOST);
    cenv.same_host_ready.push(OFFER.nonce);
    let outs = feed_msg(&mut c, now, &ClcMessage::SameHostAccept(answer), &mut cenv);
    assert!(sent(&outs).is_empty(), "no Confirm on the same-host path");
    assert!(matches!(
        done(&outs),
        Some(Outcome::SameHost(e)) if e.role == Role::Client && e.peer_stack == 77
    ));
    assert_no_leak(&cenv, 0);
}

#[test]
fn server_that_cannot_prove_it_goes_on_with_smc_r() {
    let now = t0();
    let (_, p) = offering_client(now);
    let mut s = taking_server(now);
    let mut senv = FakeEnv::new(SERVER_HOST);
    senv.same_host_grant = ServerSameHost::No;
    let outs = feed_msg(&mut s, now, &ClcMessage::Proposal(p), &mut senv);
    assert_eq!(senv.same_host_offers.len(), 1);
    only_accept(&outs);
}

#[test]
fn server_with_the_path_off_never_asks() {
    let now = t0();
    let (_, p) = offering_client(now);
    let mut s = server(now, &cfg());
    let mut senv = FakeEnv::new(SERVER_HOST);
    senv.same_host_grant = ServerSameHost::Taken(1);
    let outs = feed_msg(&mut s, now, &ClcMessage::Proposal(p), &mut senv);
    assert!(senv.same_host_offers.is_empty());
    only_accept(&outs);
}

#[test]
fn client_rejects_answers_it_did_not_ask_for() {
    let now = t0();
    // No offer: type 0x81 is a protocol error like any unexpected type.
    let (mut c, _) = client(now, &cfg());
    let mut cenv = FakeEnv::new(CLIENT_HOST);
    let a = ClcMessage::SameHostAccept(SameHostAcceptRepr {
        stack_id: 1,
        nonce: OFFER.nonce,
    });
    // (Rejected at its header: the rest is not read.)
    c.handle_tcp_bytes(now, &a.to_vec().unwrap(), &mut cenv);
    assert!(matches!(
        assert_reset(&drain(&mut c)),
        ResetReason::Protocol(_)
    ));
    // Offer made, wrong nonce.
    let (mut c, _) = offering_client(now);
    let mut cenv = FakeEnv::new(CLIENT_HOST);
    cenv.same_host_ready.push(OFFER.nonce);
    let wrong = ClcMessage::SameHostAccept(SameHostAcceptRepr {
        stack_id: 1,
        nonce: OFFER.nonce ^ 1,
    });
    let outs = feed_msg(&mut c, now, &wrong, &mut cenv);
    assert_reset(&outs);
    // Right nonce but nothing prepared (the Unix-socket exchange never happened).
    let (mut c, _) = offering_client(now);
    let mut cenv = FakeEnv::new(CLIENT_HOST);
    let outs = feed_msg(&mut c, now, &a, &mut cenv);
    assert_reset(&outs);
}

#[test]
fn offering_client_still_takes_a_normal_accept() {
    // A Linux (or same-host-less) server answers with an ordinary Accept.
    let now = t0();
    let (mut c, p) = offering_client(now);
    let mut s = server(now, &cfg());
    let mut senv = FakeEnv::new(SERVER_HOST);
    let a = only_accept(&feed_msg(&mut s, now, &ClcMessage::Proposal(p), &mut senv));
    let mut cenv = FakeEnv::new(CLIENT_HOST);
    let outs = feed_msg(&mut c, now, &ClcMessage::Accept(a), &mut cenv);
    only_confirm(&outs);
}

/// A server whose runtime runs the exchange elsewhere (`ServerSameHost::Later`, so that
/// a client's process cannot hold up its event thread) sends nothing until it knows:
/// taken → the same-host Accept; not taken → the SMC-R Accept, as if nothing had been
/// offered; no outcome within `same_host_timeout` → the SMC-R Accept, and an outcome
/// after that changes nothing.
#[test]
fn server_waits_for_an_exchange_run_elsewhere() {
    let now = t0();
    for outcome in [Some(77), None] {
        let (_, p) = offering_client(now);
        let mut s = taking_server(now);
        let mut senv = FakeEnv::new(SERVER_HOST);
        senv.same_host_grant = ServerSameHost::Later;
        let outs = feed_msg(&mut s, now, &ClcMessage::Proposal(p), &mut senv);
        assert!(
            sent(&outs).is_empty(),
            "nothing sent while the exchange runs"
        );
        assert!(done(&outs).is_none());
        assert_eq!(s.bytes_wanted(), 0, "no CLC message expected meanwhile");
        assert_eq!(s.poll_timeout(), Some(now + cfg().same_host_timeout));
        s.handle_same_host(now, outcome, &mut senv);
        let outs = drain(&mut s);
        match outcome {
            Some(id) => {
                assert!(matches!(
                    sent(&outs).as_slice(),
                    [ClcMessage::SameHostAccept(a)] if a.stack_id == id && a.nonce == OFFER.nonce
                ));
                assert!(matches!(done(&outs), Some(Outcome::SameHost(_))));
                assert_no_leak(&senv, 0);
            }
            None => {
                only_accept(&outs);
            }
        }
    }
    // Too late.
    let (_, p) = offering_client(now);
    let mut s = taking_server(now);
    let mut senv = FakeEnv::new(SERVER_HOST);
    senv.same_host_grant = ServerSameHost::Later;
    feed_msg(&mut s, now, &ClcMessage::Proposal(p), &mut senv);
    let late = now + cfg().same_host_timeout;
    s.on_timeout(late, &mut senv);
    only_accept(&drain(&mut s));
    s.handle_same_host(late, Some(77), &mut senv);
    assert!(
        drain(&mut s).is_empty(),
        "an outcome after the expiry changes nothing"
    );
}
