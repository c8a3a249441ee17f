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

/// `smc rdma perftest` server and client over loopback; returns both outputs and dumps.
fn perftest(
    verb: &str,
    size: usize,
    iters: u32,
    extra: &[&str],
) -> (Output, Output, Vec<u8>, Vec<u8>) {
    let port = free_port().to_string();
    let dir =
        std::env::temp_dir().join(format!("smc-perftest-{}-{verb}-{size}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (sd, cd) = (dir.join("server.bin"), dir.join("client.bin"));
    let (size, iters) = (size.to_string(), iters.to_string());
    let common = [
        "rdma",
        "perftest",
        "--provider",
        "iwarp",
        "--verb",
        verb,
        "-p",
        &port,
        "-s",
        &size,
        "-n",
        &iters,
        "--timeout",
        "20",
    ];
    let s = smc()
        .args(common)
        .args(["--bind", "127.0.0.1", "--dump", sd.to_str().unwrap()])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let c = smc()
        .args(common)
        .args(["--dump", cd.to_str().unwrap()])
        .args(extra)
        .arg("127.0.0.1")
        .output()
        .unwrap();
    let s = s.wait_with_output().unwrap();
    let (sb, cb) = (
        std::fs::read(&sd).unwrap_or_default(),
        std::fs::read(&cd).unwrap_or_default(),
    );
    let _ = std::fs::remove_dir_all(&dir);
    (s, c, sb, cb)
}

/// Message `k` of our perftest client: the harness pattern, stream 0x50460000 + k.
fn pattern_msg(k: u64, size: usize) -> Vec<u8> {
    let mut v = vec![0u8; size];
    smc_cli::rdma::pattern::fill(0x5046_0000 + k, 0, &mut v);
    v
}

#[test]
fn perftest_cm_modes_between_our_client_and_server() {
    // 16 KiB: every message at the start of the server's buffer; 100 bytes: offsets walk
    // the 4 KiB cycle buffer in steps of 128 (perftest's). Credits (perftest's rule: depth
    // min(512, n), one every depth / 3 and at each multiple of the depth): 13, 26, 39, 40
    // for 40 messages; 40, 80, 120 for 120.
    for (size, iters) in [(16384usize, 40u32), (100, 120)] {
        for verb in ["send", "write", "read"] {
            let (s, c, sb, cb) = perftest(verb, size, iters, &["--crc"]);
            let (st, ct) = (text(&s), text(&c));
            assert!(
                c.status.success(),
                "{verb} {size}: client: {ct}\nserver: {st}"
            );
            assert!(
                s.status.success(),
                "{verb} {size}: server: {st}\nclient: {ct}"
            );
            assert!(ct.contains("crc=on"), "{ct}");
            match verb {
                "send" => {
                    // every message arrived as sent, in order
                    let want: Vec<u8> = (0..iters as u64)
                        .flat_map(|k| pattern_msg(k, size))
                        .collect();
                    assert_eq!(cb, want);
                    assert_eq!(sb, want, "{verb} {size}: the server's messages");
                    let credits = if size == 100 { 3 } else { 4 };
                    assert!(st.contains(&format!("{credits} credits written")), "{st}");
                }
                "write" => {
                    // the server's cycle buffer holds each offset's last message
                    let mut img = vec![0u8; 4096.max(size.div_ceil(64) * 64)];
                    for k in 0..iters as u64 {
                        let o = if size > 2048 {
                            0
                        } else {
                            (k as usize % (4096 / 128)) * 128
                        };
                        img[o..o + size].copy_from_slice(&pattern_msg(k, size));
                    }
                    assert_eq!(sb, img, "{verb} {size}: the server's buffer");
                    assert!(
                        st.contains(&format!("RDMA WRITE run: {iters} x {size} bytes")),
                        "{st}"
                    );
                }
                _ => {
                    // what the client read is the server's (patterned) buffer at each
                    // offset it read (its dump leaves the bytes between messages zero)
                    let step = if size > 2048 { 0 } else { 128 };
                    let slots = 4096usize.checked_div(step).unwrap_or(1);
                    assert_eq!(cb.len(), (slots - 1) * step + size, "{verb} {size}");
                    for r in 0..slots {
                        let o = r * step;
                        assert_eq!(
                            cb[o..o + size],
                            sb[o..o + size],
                            "{verb} {size}: offset {o}"
                        );
                    }
                    let mut want = vec![0u8; sb.len()];
                    smc_cli::rdma::pattern::fill(0x5046_0000, 0, &mut want);
                    assert_eq!(sb, want);
                }
            }
        }
    }
}

#[test]
fn perftest_mismatched_verbs_fail_without_hanging() {
    // A send client against a write server: the exchange goes out of step (the server
    // wants 8-byte results where the client sends a 56-byte block); both give up.
    let port = free_port().to_string();
    let common = [
        "rdma",
        "perftest",
        "-p",
        &port,
        "-s",
        "4096",
        "-n",
        "10",
        "--timeout",
        "5",
    ];
    let t0 = std::time::Instant::now();
    let s = smc()
        .args(common)
        .args(["--verb", "write", "--bind", "127.0.0.1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let c = smc()
        .args(common)
        .args(["--verb", "send", "127.0.0.1"])
        .output()
        .unwrap();
    let s = s.wait_with_output().unwrap();
    assert!(
        !s.status.success() && !c.status.success(),
        "server: {}\nclient: {}",
        text(&s),
        text(&c)
    );
    assert!(text(&s).contains("perftest"), "{}", text(&s));
    assert!(t0.elapsed() < Duration::from_secs(30));
}

#[test]
fn perftest_refused_connection_is_an_error() {
    let port = free_port().to_string();
    let o = smc()
        .args([
            "rdma",
            "perftest",
            "--verb",
            "write",
            "-p",
            &port,
            "--timeout",
            "1",
            "127.0.0.1",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        text(&o).contains("communication connection: connect to 127.0.0.1"),
        "{}",
        text(&o)
    );
}
