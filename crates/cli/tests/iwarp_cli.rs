//! `smc rdma rping --provider iwarp` as a user runs it: server and client processes over
//! loopback, client-server and peer-to-peer (each RTR), CRC, MPA revision 1; every ping
//! verified on both sides; a refused connection is an error, not a hang.

use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn smc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_smc"))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn rping(server_extra: &[&str], client_extra: &[&str]) -> (Output, Output) {
    let port = free_port().to_string();
    let base = [
        "rdma",
        "rping",
        "--provider",
        "iwarp",
        "-a",
        "127.0.0.1",
        "-p",
        &port,
    ];
    let s = smc()
        .args(base)
        .args(["-s", "-C", "20", "-S", "100"])
        .args(server_extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let c = smc()
        .args(base)
        .args(["-c", "-C", "20", "-S", "100", "-V", "--timeout", "10"])
        .args(client_extra)
        .output()
        .unwrap();
    (s.wait_with_output().unwrap(), c)
}

#[test]
fn rping_client_server_modes() {
    for (sx, cx, expect) in [
        (&[][..], &[][..], "MPA rev 2 enhanced crc=off ird=1 ord=1"),
        (&[], &["--p2p", "--rtr", "write"], "p2p=true rtr=write"),
        (&[], &["--p2p", "--rtr", "read"], "p2p=true rtr=read"),
        (&[], &["--p2p", "--rtr", "send"], "p2p=true rtr=send"),
        (&["--rtr", "read"], &["--p2p"], "p2p=true rtr=read"),
        (&[], &["--crc"], "crc=on"),
        (&["--crc"], &[], "crc=on"),
        (&[], &["--mpa-rev", "1"], "MPA rev 1 crc=off"),
    ] {
        let (s, c) = rping(sx, cx);
        let (st, ct) = (text(&s), text(&c));
        assert!(c.status.success(), "client {cx:?}: {ct}\nserver: {st}");
        assert!(s.status.success(), "server {sx:?}: {st}\nclient: {ct}");
        assert!(ct.contains("20 pings of 100 bytes, data verified"), "{ct}");
        assert!(st.contains("20 pings of 100 bytes, data verified"), "{st}");
        assert!(ct.contains(expect), "{cx:?}: want {expect:?} in {ct}");
    }
}

#[test]
fn rping_refused_connection_is_an_error() {
    let port = free_port().to_string();
    let o = smc()
        .args([
            "rdma",
            "rping",
            "-c",
            "-a",
            "127.0.0.1",
            "-p",
            &port,
            "--timeout",
            "5",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(text(&o).contains("connect to 127.0.0.1"), "{}", text(&o));
}
