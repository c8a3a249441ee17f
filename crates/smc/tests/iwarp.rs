//! SMC-R over iWARP, the opt-in extension outside RFC 7609 (smc-iwarp in SMC-R link mode):
//! the links really are iWARP connections (FPDUs counted by the provider, MPA peer-to-peer
//! with the RTR so that the server's CONFIRM LINK may go first, CHECKLIST TC-MPA-26), and a
//! peer that did not opt in (a RoCE stack) ends in a TCP fallback with its data intact.
//! The SMC-R end-to-end tests run over it too: `SMC_RS_TEST_PROVIDER=iwarp cargo test -p
//! smc --test e2e --test close --test leak --test fallback --test timers`.

mod common;

use std::sync::atomic::Ordering;

use common::*;
use smc::{Stack, StackConfig};

fn iwarp_config(local: &str, peer: &str) -> (StackConfig, std::sync::Arc<smc_iwarp::Iwarp>) {
    let p = smc_iwarp::Iwarp::for_smc();
    let mut c = StackConfig::with_provider(p.clone());
    c.tcp_option = None;
    c.skip_tcp_option = peer.parse().unwrap();
    c.local_addr = Some(local.parse().unwrap());
    (c, p)
}

#[test]
fn links_are_iwarp_connections() {
    init_tracing();
    let (sc, sp) = iwarp_config(&ip(20), &ip(21));
    let (cc, cp) = iwarp_config(&ip(21), &ip(20));
    let (srv, cli) = (Stack::new(sc).unwrap(), Stack::new(cc).unwrap());
    let l = smc::SmcListener::bind_with(&srv, (ip(20).as_str(), 0)).unwrap();
    let addr = l.local_addr().unwrap();
    echo_server(l);
    let m = echo_once(&cli, addr, 7, 3 << 20);
    assert!(m.is_smc(), "{m}");
    let m = echo_once(&cli, addr, 8, 100_000);
    assert!(
        matches!(
            m,
            smc::Mode::Smc {
                first_contact: false,
                ..
            }
        ),
        "{m}"
    );
    use smc_verbs::Provider;
    for (who, p) in [("server", &sp), ("client", &cp)] {
        let devs = p.devices();
        assert_eq!(devs.len(), 1, "{who}");
        let d = &devs[0];
        assert_eq!(d.attr().provider, "iwarp");
        assert!(
            smc_iwarp::smclink::port_from_mac(d.mac()).is_some(),
            "{who}: MAC advertises the link listener"
        );
        let st = smc_iwarp::stats(d).unwrap();
        assert!(st.tx_fpdus.load(Ordering::Relaxed) > 10, "{who}: {st:?}");
        assert!(st.rx_fpdus.load(Ordering::Relaxed) > 10, "{who}: {st:?}");
        assert_eq!(st.rx_bad_crc.load(Ordering::Relaxed), 0);
        assert_eq!(st.rx_terminates.load(Ordering::Relaxed), 0);
    }
    assert_eq!(srv.link_groups().len(), 1);
    assert_eq!(cli.link_groups().len(), 1);
}

#[test]
fn roce_peer_that_did_not_opt_in_falls_back_to_tcp() {
    init_tracing();
    // The iWARP client lists the server (it opted in), the RoCE server lists the client
    // but speaks RoCE: the client cannot reach an iWARP link listener there (no marker in
    // the server's MAC) and the connection carries on over TCP.
    let (cc, _cp) = iwarp_config(&ip(23), &ip(22));
    let mut sc = StackConfig::with_provider(smc_softroce::SoftRoce::global());
    sc.tcp_option = None;
    sc.skip_tcp_option = ip(23).parse().unwrap();
    sc.local_addr = Some(ip(22).parse().unwrap());
    let (srv, cli) = (Stack::new(sc).unwrap(), Stack::new(cc).unwrap());
    let l = smc::SmcListener::bind_with(&srv, (ip(22).as_str(), 0)).unwrap();
    let addr = l.local_addr().unwrap();
    echo_server(l);
    let m = echo_once(&cli, addr, 9, 200_000);
    assert!(!m.is_smc(), "{m}");
    assert!(m.to_string().contains("fallback"), "{m}");
}
