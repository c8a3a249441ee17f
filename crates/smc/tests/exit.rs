//! A process using `Stack::global()` exits: its link groups end with DELETE LINK at exit,
//! so the peer frees its side at once (not after a failed TEST LINK, 30 s by default).

mod common;

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// The child: connect with the global stack, echo once, exit without closing.
#[test]
#[ignore]
fn exit_child() {
    let Ok(addr) = std::env::var("SMC_TEST_CHILD_ADDR") else {
        return;
    };
    // What a program does once: the runtime links no provider (smc::defaults).
    smc_providers::install_default();
    let c = smc::SmcStream::connect(addr.as_str()).unwrap();
    assert!(c.mode().is_smc(), "{}", c.mode());
    (&c).write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    (&c).read_exact(&mut b).unwrap();
    std::mem::forget(c);
    if std::env::var_os("SMC_TEST_CHILD_KILL").is_some() {
        // No atexit hook, no DELETE LINK: the kernel closes the TCP socket (FIN) and
        // the RNIC's UDP socket; nothing else tells the peer.
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    }
    std::process::exit(0);
}

#[test]
fn link_groups_end_when_the_peer_process_exits() {
    let (srv, _cli) = pair_with(
        |s| s.skip_tcp_option = format!("{},{}", client_ip(), ip(4)).parse().unwrap(),
        |_| {},
    );
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    echo_server(l);
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "exit_child", "--nocapture"])
        .env("SMC_TEST_CHILD_ADDR", addr.to_string())
        .env("SMC_RS_SKIP_TCP_OPTION", server_ip())
        .env("SMC_RS_LOCAL_ADDR", ip(4))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t0 = Instant::now();
    assert!(
        wait_until(Duration::from_secs(5), || srv.link_groups().is_empty()),
        "{:?}",
        srv.link_groups()
    );
    // Well before any keepalive could have noticed (30 s).
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(srv.stats().links_failed, 0, "{:?}", srv.stats());
}

/// Issue 10 item 1's other side: the peer's FIN without SMC-R close flags no longer ends
/// a connection by itself, but a killed peer is still noticed at once: the FIN makes
/// the survivor probe the link (TEST LINK), which fails, and the connection ends —
/// seconds, not the 30 s keepalive.
#[test]
fn a_killed_peer_process_is_noticed_through_its_fin() {
    let (srv, _cli) = pair_with(
        |s| s.skip_tcp_option = format!("{},{}", client_ip(), ip(5)).parse().unwrap(),
        |_| {},
    );
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut b = [0u8; 4];
        (&s).read_exact(&mut b).unwrap();
        (&s).write_all(&b).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let t0 = Instant::now();
        let r = (&s).read(&mut b);
        (r.map_err(|e| e.kind()), t0.elapsed())
    });
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "exit_child", "--nocapture"])
        .env("SMC_TEST_CHILD_ADDR", addr.to_string())
        .env("SMC_TEST_CHILD_KILL", "1")
        .env("SMC_RS_SKIP_TCP_OPTION", server_ip())
        .env("SMC_RS_LOCAL_ADDR", ip(5))
        .output()
        .unwrap();
    assert!(!out.status.success(), "the child was killed");
    let (r, took) = server.join().unwrap();
    assert!(
        matches!(
            r,
            Err(std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted)
        ),
        "{r:?} after {took:?}"
    );
    assert!(took < Duration::from_secs(10), "noticed after {took:?}");
    assert!(
        wait_until(Duration::from_secs(5), || srv.link_groups().is_empty()),
        "{:?}",
        srv.link_groups()
    );
}
