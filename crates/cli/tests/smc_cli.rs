//! The `smc` binary end to end over SMC-R: `smc demo`, and `smc listen --echo` with
//! `smc connect --send-bytes` in two processes. Each test uses its own pair of loopback
//! addresses (each stack's software RNIC binds UDP 4791 on its address, so two tests —
//! or another SMC-R process — must not share one).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn smc() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_smc"));
    c.env_remove("SMC_RS_SKIP_TCP_OPTION").env_remove("SMC_LOG");
    // SMC-R between local processes: the same-host path (on by default) stays off.
    c.env("SMC_RS_SAME_HOST", "0");
    c
}

/// Loopback addresses for this test: 127.<a>.<b>.1 (client) and .2 (server), varied by
/// process id and test number so that parallel runs do not collide.
fn pair(test: u8) -> (String, String) {
    let p = std::process::id();
    let a = 100 + (p % 100) as u8;
    let b = ((p / 100) % 200) as u8 + test;
    (format!("127.{a}.{b}.1"), format!("127.{a}.{b}.2"))
}

#[test]
fn demo_moves_verified_data_over_smc_r() {
    let (c, s) = pair(1);
    let out = smc()
        .args([
            "demo",
            "--bytes",
            "8M",
            "--iters",
            "50",
            "--client-ip",
            &c,
            "--server-ip",
            &s,
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}\n{err}");
    assert!(text.contains("client connection: SMC-R v"), "{text}\n{err}");
    assert!(text.contains("server connection: SMC-R v"), "{text}");
    assert!(text.contains("SMC-R  8 MiB each way"), "{text}");
    assert_eq!(text.matches("verified both ways").count(), 2, "{text}");
    assert!(text.contains("link group lgr"), "{text}");
}

fn wait_listening(child: &mut std::process::Child) -> String {
    // `listening on ADDR` is the first stderr line after the optional policy note.
    let mut err = child.stderr.take().unwrap();
    let mut buf = Vec::new();
    let t = Instant::now();
    let mut byte = [0u8; 1];
    while t.elapsed() < Duration::from_secs(10) {
        if err.read(&mut byte).unwrap_or(0) == 0 {
            break;
        }
        buf.push(byte[0]);
        let s = String::from_utf8_lossy(&buf);
        if let Some(line) = s.lines().find(|l| l.starts_with("listening on ")) {
            if s.ends_with('\n') {
                let addr = line.trim_start_matches("listening on ").to_string();
                child.stderr = Some(err);
                return addr;
            }
        }
    }
    panic!("no 'listening on' line: {}", String::from_utf8_lossy(&buf));
}

#[test]
fn listen_echo_and_connect_generator_in_two_processes() {
    let (c, s) = pair(2);
    let mut l = smc()
        .env("SMC_RS_SKIP_TCP_OPTION", "127.0.0.0/8:*")
        .args(["listen", &format!("{s}:0"), "--echo", "--count", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr = wait_listening(&mut l);
    let out = smc()
        .env("SMC_RS_SKIP_TCP_OPTION", "127.0.0.0/8:*")
        .args([
            "connect",
            "--bind",
            &c,
            &addr,
            "--send-bytes",
            "3M",
            "--expect-echo",
            "--require-smc",
            "--conns",
            "2",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}\n{err}");
    assert_eq!(
        text.matches("mode=SMC-R sent 3145728 bytes").count(),
        2,
        "{text}"
    );
    assert_eq!(text.matches("echo=ok").count(), 2, "{text}");
    assert!(err.contains("first contact"), "{err}");
    assert!(err.contains("subsequent contact"), "{err}");
    let lo = l.wait_with_output().unwrap();
    assert!(lo.status.success());
    let ltext = String::from_utf8_lossy(&lo.stdout);
    assert_eq!(ltext.matches("echoed 3145728 bytes").count(), 2, "{ltext}");
}

#[test]
fn connect_to_a_plain_tcp_server_falls_back_and_works() {
    let srv = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = srv.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = srv.accept().unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        s.write_all(b"pong\n").unwrap();
        got
    });
    let mut child = smc()
        .args(["connect", &addr.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"ping\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout, b"pong\n");
    assert_eq!(t.join().unwrap(), b"ping\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TCP fallback: "), "{err}");
}

#[test]
fn bench_json_reports_every_metric_for_both_transports() {
    let (c, s) = pair(3);
    let out = smc()
        .args([
            "bench",
            "--json",
            "--bytes",
            "4M",
            "--iters",
            "30",
            "--conns",
            "10",
            "--client-ip",
            &c,
            "--server-ip",
            &s,
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}\n{err}");
    // Shape only: the targets are reported, never asserted.
    for side in ["smc", "tcp"] {
        for key in [
            "\"throughput_bytes_per_sec\"",
            "\"conns_per_sec\"",
            "\"p50_us\"",
        ] {
            assert!(text.contains(key), "{side} {key} missing:\n{text}");
        }
    }
    assert!(text.contains("\"transport\": \"SMC-R\""), "{text}");
    assert!(text.contains("\"all_expected_mode\": true"), "{text}");
    assert!(text.contains("\"conns_smc_subsequent\": 10"), "{text}");
    assert!(!text.contains("\"ratio\": null"), "{text}");
    // p50 of 1 B and 1 KiB, bulk, connection rate, then 1 B p99 and CPU per GiB.
    assert_eq!(text.matches("\"met\": ").count(), 6, "{text}");
    assert_eq!(text.matches("\"of\": \"TCP\"").count(), 6, "{text}");
}

#[test]
fn sink_listener_hashes_what_the_generator_sent() {
    let (c, s) = pair(4);
    let mut l = smc()
        .env("SMC_RS_SKIP_TCP_OPTION", "127.0.0.0/8:*")
        .args(["listen", &format!("{s}:0"), "--sink", "--count", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr = wait_listening(&mut l);
    // The sink sends nothing back: the client must receive the empty stream.
    let empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    let out = smc()
        .env("SMC_RS_SKIP_TCP_OPTION", "127.0.0.0/8:*")
        .args([
            "connect",
            "--bind",
            &c,
            &addr,
            "--send-bytes",
            "2M",
            "--seed",
            "9",
            "--expect-sha256",
            empty,
            "--require-smc",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sent = text
        .split_whitespace()
        .skip_while(|w| *w != "sent")
        .nth(3)
        .and_then(|w| w.strip_prefix("sha256="))
        .expect("sent sha256")
        .to_string();
    assert!(text.contains("received 0 bytes"), "{text}");
    assert!(text.contains("sha256=ok"), "{text}");
    let lo = l.wait_with_output().unwrap();
    assert!(lo.status.success());
    let ltext = String::from_utf8_lossy(&lo.stdout);
    assert!(
        ltext.contains(&format!("received 2097152 bytes sha256={sent}")),
        "{ltext} vs {sent}"
    );
}

/// `smc run`: the program runs with the library appended to LD_PRELOAD (arguments with
/// hyphens passed through, its exit status kept); a missing library or program is an
/// error that says what to do.
#[test]
fn run_execs_the_program_with_the_library_preloaded() {
    let dir = std::env::temp_dir().join(format!("smc-cli-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // An empty file: the loader says on stderr that it cannot preload it and goes on,
    // which is all these programs need (the real library is tested by smc-preload).
    let lib = dir.join("libsmc_preload.so");
    std::fs::write(&lib, b"").unwrap();
    let run = |args: &[&str]| {
        smc()
            .env("SMC_RS_PRELOAD", &lib)
            .env("LD_PRELOAD", "/other/libfoo.so")
            .arg("run")
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["printenv", "LD_PRELOAD"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("/other/libfoo.so:{}", lib.display()),
        "{out:?}"
    );
    let out = run(&["--", "sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    let out = run(&["/nonexistent/program"]);
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    let out = smc()
        .env("SMC_RS_PRELOAD", dir.join("nope.so"))
        .args(["run", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such file"));
    std::fs::remove_dir_all(&dir).unwrap();
}
