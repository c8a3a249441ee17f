//! Two stacks in one process: a server on 127.a.b.2 and a client on 127.a.b.1, both
//! over the software RNIC, with the TCP-option check skipped by policy (no eBPF).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::thread;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use smc::{SmcListener, SmcStream, Stack, StackConfig};

/// A loopback address private to this test process: the software RNIC binds UDP 4791 on
/// each address, and other processes on the host (system tests, other test binaries)
/// may hold 127.0.0.1/127.0.0.2.
pub fn ip(host: u8) -> String {
    let pid = std::process::id();
    format!("127.{}.{}.{host}", 100 + pid % 100, (pid / 100) % 250)
}

pub fn server_ip() -> String {
    ip(2)
}

pub fn client_ip() -> String {
    ip(1)
}

/// Logs (`RUST_LOG` / `SMC_LOG` filter syntax in `RUST_LOG`) go to the test's captured
/// output, or with `SMC_TEST_LOG_FILE=PATH` appended to that file: events of the stacks'
/// own threads are not always in the output a failing test prints, and a flake seen
/// once under load needs them.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::from_default_env();
    if let Some(path) = std::env::var_os("SMC_TEST_LOG_FILE") {
        if let Ok(f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(f))
                .try_init();
            return;
        }
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// The provider the tests run over: the software RoCEv2 RNIC, or with
/// `SMC_RS_TEST_PROVIDER=iwarp` the SMC-R-over-iWARP extension (smc-iwarp in SMC-R link
/// mode, one provider instance per stack).
pub fn provider() -> std::sync::Arc<dyn smc_verbs::Provider> {
    match std::env::var("SMC_RS_TEST_PROVIDER").as_deref() {
        Ok("iwarp") => smc_iwarp::Iwarp::for_smc(),
        Ok("softroce") | Err(_) => smc_softroce::SoftRoce::global(),
        Ok(other) => panic!("SMC_RS_TEST_PROVIDER={other}: softroce or iwarp"),
    }
}

/// A stack config for tests: softroce (or iWARP, see [`provider`]), CLC without the TCP
/// option for `peers`. With `SMC_RS_TEST_SAME_HOST=1` both stacks of a pair take the
/// same-host path instead (the close/abort/urgent tests of `close.rs` on it).
pub fn config(local: &str, peers: &str) -> StackConfig {
    let mut c = StackConfig::with_provider(provider());
    c.tcp_option = None;
    c.skip_tcp_option = peers.parse().expect("policy");
    c.local_addr = Some(local.parse().unwrap());
    if same_host_tests() {
        enable_same_host(&mut c);
    }
    c
}

/// `SMC_RS_TEST_SAME_HOST=1`: run the pair's connections on the same-host path.
pub fn same_host_tests() -> bool {
    std::env::var("SMC_RS_TEST_SAME_HOST").is_ok_and(|v| v == "1")
}

/// Same-host path on, with a socket directory of the tests (stale sockets of killed
/// test processes are removed by the next stack that listens there).
pub fn enable_same_host(c: &mut StackConfig) {
    c.same_host = true;
    c.same_host_dir = std::env::temp_dir().join("smc-rs-test-samehost");
}

pub fn pair() -> (Stack, Stack) {
    pair_with(|_| {}, |_| {})
}

pub fn pair_with(
    srv: impl FnOnce(&mut StackConfig),
    cli: impl FnOnce(&mut StackConfig),
) -> (Stack, Stack) {
    init_tracing();
    let mut s = config(&server_ip(), &client_ip());
    srv(&mut s);
    let mut c = config(&client_ip(), &server_ip());
    cli(&mut c);
    (Stack::new(s).unwrap(), Stack::new(c).unwrap())
}

pub fn listen(stack: &Stack) -> SmcListener {
    SmcListener::bind_with(stack, (server_ip().as_str(), 0)).unwrap()
}

/// Deterministic pseudo-random bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub fn sha(b: &[u8]) -> [u8; 32] {
    Sha256::digest(b).into()
}

/// Sends `total` bytes of the pattern in `chunk`-sized writes; returns their hash.
pub fn send_stream(mut s: &SmcStream, seed: u64, total: usize, chunk: usize) -> [u8; 32] {
    let data = pattern(seed, chunk.max(1) * 4);
    let mut h = Sha256::new();
    let mut sent = 0;
    let mut i = 0;
    while sent < total {
        let n = chunk.min(total - sent);
        let off = (i * 7919) % (data.len() - n + 1);
        let piece = &data[off..off + n];
        s.write_all(piece).unwrap();
        h.update(piece);
        sent += n;
        i += 1;
    }
    h.finalize().into()
}

/// Reads until EOF or `total` bytes; returns count and hash.
pub fn recv_stream(mut s: &SmcStream, total: usize) -> (usize, [u8; 32]) {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0;
    while got < total {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        got += n;
    }
    (got, h.finalize().into())
}

/// Polls `f` until it is true or `t` passes.
pub fn wait_until(t: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + t;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    f()
}

/// An echo server: every accepted stream is echoed on its own thread until EOF.
pub fn echo_server(l: smc::SmcListener) {
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            thread::spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match (&s).read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if (&s).write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
}

pub fn echo_once(cli: &smc::Stack, addr: std::net::SocketAddr, seed: u64, len: usize) -> smc::Mode {
    let c = smc::SmcStream::connect_with(cli, addr).unwrap();
    let data = pattern(seed, len);
    let c2 = c.try_clone().unwrap();
    let d2 = data.clone();
    let w = thread::spawn(move || {
        (&c2).write_all(&d2).unwrap();
    });
    let mut got = vec![0u8; len];
    (&c).read_exact(&mut got).unwrap();
    w.join().unwrap();
    assert!(got == data, "echo mismatch");
    c.mode()
}
