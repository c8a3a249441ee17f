//! 1000 SMC-R connections opened and closed in sequence: no RMB element, QP, alert
//! token or file descriptor leaks. In its own test binary so that the process-wide fd
//! count is not disturbed by other tests.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn thousand_sequential_connections_leak_nothing() {
    let (srv, cli) = pair();
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    echo_server(l);
    echo_once(&cli, addr, 0, 1000);
    let settle = |what: &str| {
        assert!(
            wait_until(Duration::from_secs(20), || cli.stats().smc_connections == 0
                && srv.stats().smc_connections == 0
                && cli.stats().handshakes == 0
                && srv.stats().handshakes == 0),
            "{what}: {:?} / {:?}",
            cli.stats(),
            srv.stats()
        );
    };
    settle("after the first");
    let base_c = cli.stats();
    let base_s = srv.stats();
    for i in 0..1000 {
        let m = echo_once(&cli, addr, i, 1000);
        assert!(m.is_smc(), "connection {i}: {m}");
    }
    settle("after 1000");
    let (c, s) = (cli.stats(), srv.stats());
    for (now, base, side) in [(&c, &base_c, "client"), (&s, &base_s, "server")] {
        assert_eq!(now.qps_open, base.qps_open, "{side} QPs: {now:?}");
        assert_eq!(now.link_groups, 1, "{side}: {now:?}");
        assert_eq!(now.rmb_elements_in_use, 0, "{side}: {now:?}");
        assert!(now.rmbs <= base.rmbs.max(16), "{side} RMBs: {now:?}");
        assert_eq!(now.alert_tokens, 0, "{side} tokens: {now:?}");
        assert_eq!(now.smc_total, base.smc_total + 1000, "{side}: {now:?}");
    }
    // Both stacks live in this process: fds of both are counted.
    assert!(
        wait_until(Duration::from_secs(10), || cli.stats().fds
            <= base_c.fds + 2),
        "fds: {} then {}",
        base_c.fds,
        cli.stats().fds
    );
}
