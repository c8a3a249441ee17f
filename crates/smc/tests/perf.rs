//! Rough numbers (ignored by default; `cargo test --release -p smc --test perf --
//! --ignored --nocapture`): ping-pong latency and bulk throughput, SMC-R over the
//! software RNIC beside kernel TCP on loopback. Never asserted (DEVELOPERS.md: speed
//! targets are reported, not tested).

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Instant;

use common::*;

fn pingpong<S: Read + Write>(c: &mut S, n: usize, size: usize) -> f64 {
    let buf = vec![1u8; size];
    let mut back = vec![0u8; size];
    let t0 = Instant::now();
    for _ in 0..n {
        c.write_all(&buf).unwrap();
        c.read_exact(&mut back).unwrap();
    }
    t0.elapsed().as_secs_f64() * 1e6 / n as f64
}

#[test]
#[ignore]
fn latency_and_throughput() {
    let size = |c: &mut smc::StackConfig| {
        if let Some(n) = std::env::var("PERF_BUF").ok().and_then(|v| v.parse().ok()) {
            c.rmb_size = n;
            c.sndbuf_size = n;
        }
    };
    let (srv, cli) = pair_with(size, size);
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    echo_server(l);
    let mut c = smc::SmcStream::connect_with(&cli, addr).unwrap();
    c.set_nodelay(true).unwrap();
    pingpong(&mut c, 1000, 1);
    let smc1 = pingpong(&mut c, 20000, 1);
    let smc1k = pingpong(&mut c, 20000, 1024);

    let tl = TcpListener::bind("127.0.0.1:0").unwrap();
    let ta = tl.local_addr().unwrap();
    thread::spawn(move || {
        for s in tl.incoming() {
            let mut s = s.unwrap();
            s.set_nodelay(true).unwrap();
            thread::spawn(move || {
                let mut b = vec![0u8; 65536];
                loop {
                    let n = s.read(&mut b).unwrap_or(0);
                    if n == 0 || s.write_all(&b[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let mut t = TcpStream::connect(ta).unwrap();
    t.set_nodelay(true).unwrap();
    pingpong(&mut t, 1000, 1);
    let tcp1 = pingpong(&mut t, 20000, 1);
    let tcp1k = pingpong(&mut t, 20000, 1024);
    println!("RTT 1 B: SMC-R {smc1:.1} µs, TCP {tcp1:.1} µs; 1 KiB: SMC-R {smc1k:.1} µs, TCP {tcp1k:.1} µs");

    // Connection rate (subsequent contact): connect, 1 byte each way, close.
    let n = 2000;
    let l = listen(&srv);
    let caddr = l.local_addr().unwrap();
    echo_server(l);
    let t0 = Instant::now();
    for _ in 0..n {
        let mut s = smc::SmcStream::connect_with(&cli, caddr).unwrap();
        s.write_all(b"x").unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).unwrap();
    }
    let smc_cps = n as f64 / t0.elapsed().as_secs_f64();
    let tl = TcpListener::bind("127.0.0.1:0").unwrap();
    let ta = tl.local_addr().unwrap();
    thread::spawn(move || {
        for s in tl.incoming() {
            let mut s = s.unwrap();
            thread::spawn(move || {
                let mut b = [0u8; 1];
                if s.read_exact(&mut b).is_ok() {
                    let _ = s.write_all(&b);
                }
            });
        }
    });
    let t0 = Instant::now();
    for _ in 0..n {
        let mut s = TcpStream::connect(ta).unwrap();
        s.write_all(b"x").unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).unwrap();
    }
    let tcp_cps = n as f64 / t0.elapsed().as_secs_f64();
    println!("connections/s: SMC-R {smc_cps:.0}, TCP {tcp_cps:.0}");

    // Bulk: 1 GiB one way, 64 KiB writes.
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    const N: usize = 1 << 30;
    let r = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        recv_stream(&s, N).0
    });
    let c = smc::SmcStream::connect_with(&cli, addr).unwrap();
    let t0 = Instant::now();
    let chunk = vec![7u8; 65536];
    let mut left = N;
    while left > 0 {
        (&c).write_all(&chunk).unwrap();
        left -= chunk.len();
    }
    drop(c);
    assert_eq!(r.join().unwrap(), N);
    let smc_gbps = N as f64 * 8.0 / t0.elapsed().as_secs_f64() / 1e9;
    let tl = TcpListener::bind("127.0.0.1:0").unwrap();
    let ta = tl.local_addr().unwrap();
    let r = thread::spawn(move || {
        let (mut s, _) = tl.accept().unwrap();
        let mut b = vec![0u8; 65536];
        let mut got = 0;
        loop {
            let n = s.read(&mut b).unwrap();
            if n == 0 {
                return got;
            }
            got += n;
        }
    });
    let mut t = TcpStream::connect(ta).unwrap();
    let t0 = Instant::now();
    let mut left = N;
    while left > 0 {
        t.write_all(&chunk).unwrap();
        left -= chunk.len();
    }
    drop(t);
    assert_eq!(r.join().unwrap(), N);
    let tcp_gbps = N as f64 * 8.0 / t0.elapsed().as_secs_f64() / 1e9;
    println!("bulk 1 GiB, 64 KiB writes: SMC-R {smc_gbps:.2} Gbit/s, TCP {tcp_gbps:.2} Gbit/s");
}
