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
    let c = smc::SmcStream::connect(addr.as_str()).unwrap();
    assert!(c.mode().is_smc(), "{}", c.mode());
    (&c).write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    (&c).read_exact(&mut b).unwrap();
    std::mem::forget(c);
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
