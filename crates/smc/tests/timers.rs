//! Link-group timers with short configured values: the idle teardown (RFC 7609 §3.5.4)
//! and TEST LINK keepalive (§4.5.3); SMC-Rv2 selected by configuration (UEIDs); a
//! connection's termination timer (§4.8.1) waking the event thread in time.

mod common;

use std::time::Duration;

use common::*;
use smc::Mode;

#[test]
fn idle_link_group_is_torn_down_and_recreated() {
    let short = |c: &mut smc::StackConfig| c.lgr_idle_timeout = Duration::from_millis(300);
    let (srv, cli) = pair_with(short, short);
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    echo_server(l);
    let m = echo_once(&cli, addr, 1, 10_000);
    assert!(
        matches!(
            m,
            Mode::Smc {
                first_contact: true,
                ..
            }
        ),
        "{m}"
    );
    assert!(
        wait_until(Duration::from_secs(5), || cli.link_groups().is_empty()
            && srv.link_groups().is_empty()),
        "{:?} / {:?}",
        cli.link_groups(),
        srv.link_groups()
    );
    for s in [cli.stats(), srv.stats()] {
        assert_eq!(s.qps_open, 0, "{s:?}");
        assert_eq!(s.rmbs, 0, "{s:?}");
        assert!(s.lgrs_ended >= 1, "{s:?}");
    }
    // The next connection is a first contact again.
    let m = echo_once(&cli, addr, 2, 10_000);
    assert!(
        matches!(
            m,
            Mode::Smc {
                first_contact: true,
                ..
            }
        ),
        "{m}"
    );
}

#[test]
fn keepalive_keeps_an_idle_link_up() {
    let ka = |c: &mut smc::StackConfig| c.keepalive = Some(Duration::from_millis(100));
    let (srv, cli) = pair_with(ka, ka);
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    echo_server(l);
    let c = smc::SmcStream::connect_with(&cli, addr).unwrap();
    assert!(c.mode().is_smc());
    let before = (cli.stats().llc_received, srv.stats().llc_received);
    std::thread::sleep(Duration::from_millis(1200));
    let after = (cli.stats().llc_received, srv.stats().llc_received);
    // TEST LINK requests and responses went both ways while the link was idle.
    assert!(
        after.0 >= before.0 + 4,
        "client LLC in: {before:?} -> {after:?}"
    );
    assert!(
        after.1 >= before.1 + 4,
        "server LLC in: {before:?} -> {after:?}"
    );
    assert_eq!(cli.stats().links_failed, 0);
    assert_eq!(srv.stats().links_failed, 0);
    use std::io::{Read, Write};
    (&c).write_all(b"still here").unwrap();
    let mut b = [0u8; 10];
    (&c).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"still here");
}

#[test]
fn smc_rv2_when_both_have_a_common_ueid() {
    let ueid = |c: &mut smc::StackConfig| {
        c.ueids
            .add(smc::clc::Ueid::new("SMC-RS-TEST").unwrap())
            .unwrap()
    };
    let (srv, cli) = pair_with(ueid, ueid);
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    echo_server(l);
    let m1 = echo_once(&cli, addr, 1, 300_000);
    let m2 = echo_once(&cli, addr, 2, 300_000);
    assert!(
        matches!(
            m1,
            Mode::Smc {
                version: 2,
                first_contact: true,
                ..
            }
        ),
        "{m1}"
    );
    assert!(
        matches!(
            m2,
            Mode::Smc {
                version: 2,
                first_contact: false,
                ..
            }
        ),
        "{m2}"
    );
    assert_eq!(cli.link_groups()[0].version, 2);
}

/// A connection's deadline wakes the event thread when it is earlier than the wake-up
/// the thread planned (runtime/timers.rs): a close whose peer never answers ends at its
/// termination timer (100 ms here), not when the event thread happens to wake next (it
/// plans up to 500 ms ahead). A liveness bound with room for a loaded machine.
#[test]
fn a_connection_timer_wakes_the_event_thread() {
    let short = |c: &mut smc::StackConfig| c.conn.close_timeout = Duration::from_millis(100);
    let (srv, cli) = pair_with(|_| {}, short);
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        // Held open, never closed: the client's close gets no answer.
        let s = l.accept().unwrap().0;
        (s, l, srv)
    });
    let c = smc::SmcStream::connect_with(&cli, addr).unwrap();
    assert!(c.mode().is_smc(), "{}", c.mode());
    let _held = server.join().unwrap();
    // Let the event thread plan its next sleep while nothing is due.
    std::thread::sleep(Duration::from_millis(50));
    let t0 = std::time::Instant::now();
    drop(c);
    let ended = wait_until(Duration::from_secs(5), || cli.connections().is_empty());
    let took = t0.elapsed();
    assert!(ended, "{:?}", cli.connections());
    assert!(
        took < Duration::from_millis(400),
        "the close ended after {took:?}, its timer was 100 ms"
    );
}
