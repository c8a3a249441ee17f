//! `smc-kpeer-scen client|server SCEN ADDR`: the other half of the kernel-peer harness's
//! scripted scenarios (tests/kernel-peer/README.md, "Scenarios") on our SMC-R stack, so
//! that the Linux kernel's `kpeer` meets our close flows and urgent data: `srvhalf` (the
//! server half-closes first, then the client sends more), `abort` (close with unread
//! data → the peer sees a reset, both ways) and `urg` (one urgent byte each way, RFC 7609
//! §4.7.5). Data is the harness's pattern (splitmix64 of seed = connection index) and is
//! checked byte for byte. Exit 0 when every step passed.
//!
//! The stack is `Stack::global()` (SMC_RS_UEID, the eBPF TCP option, SMC_RS_LOCAL_ADDR).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use smc::{SmcListener, SmcStream};

/// Byte `n` of the harness's stream with seed `s`.
fn pattern(seed: u64, off: u64, len: usize) -> Vec<u8> {
    (off..off + len as u64)
        .map(|n| {
            let mut z = (seed + 1)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .wrapping_add(n / 8);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            z.to_le_bytes()[(n % 8) as usize]
        })
        .collect()
}

fn read_exact_checked(s: &mut SmcStream, seed: u64, off: u64, len: usize) -> Result<()> {
    let mut b = vec![0u8; len];
    s.read_exact(&mut b)
        .with_context(|| format!("read {len} bytes at offset {off}"))?;
    ensure!(
        b == pattern(seed, off, len),
        "data mismatch at offsets {off}..{}",
        off + len as u64
    );
    Ok(())
}

fn expect_eof(s: &mut SmcStream) -> Result<()> {
    let mut b = [0u8; 1];
    let n = s.read(&mut b).context("read for EOF")?;
    ensure!(n == 0, "data after the expected end of stream");
    Ok(())
}

fn is_reset(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe
    )
}

/// Writes `len` pattern bytes until a reset is seen (within 15 s, as the harness's side).
fn send_until_reset(s: &mut SmcStream, seed: u64, len: usize) -> Result<()> {
    s.set_read_timeout(Some(Duration::from_millis(200)))?;
    let data = pattern(seed, 0, len);
    let t0 = Instant::now();
    let mut off = 0;
    while t0.elapsed() < Duration::from_secs(15) {
        if off < data.len() {
            match s.write(&data[off..]) {
                Ok(n) => off += n,
                Err(e) if is_reset(&e) => return Ok(()),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(e).context("write"),
            }
        }
        let mut b = [0u8; 4096];
        match s.read(&mut b) {
            Err(e) if is_reset(&e) => return Ok(()),
            Ok(0) if off >= data.len() => {
                // The peer closed; a write now must fail with the reset.
                match s.write(b"x") {
                    Err(e) if is_reset(&e) => return Ok(()),
                    _ => std::thread::sleep(Duration::from_millis(100)),
                }
            }
            _ => {}
        }
    }
    bail!("no reset seen within 15 s after sending {off} of {len} bytes")
}

/// Waits (≤ 15 s) for the urgent byte and returns it (the harness's side waits for
/// POLLPRI; we poll `recv(MSG_OOB)`).
fn wait_urgent(s: &SmcStream) -> Result<u8> {
    let t0 = Instant::now();
    loop {
        match s.recv_urgent() {
            Ok(b) => return Ok(b),
            Err(e)
                if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::InvalidInput)
                    && t0.elapsed() < Duration::from_secs(15) =>
            {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => return Err(e).context("no urgent byte within 15 s"),
        }
    }
}

fn mode(s: &SmcStream) -> Result<()> {
    eprintln!("connection: {}", s.mode());
    ensure!(s.mode().is_smc(), "not SMC-R: {}", s.mode());
    Ok(())
}

fn client(scen: &str, addr: SocketAddr) -> Result<()> {
    match scen {
        "srvhalf" => {
            let mut s = SmcStream::connect(addr).context("connect")?;
            mode(&s)?;
            s.write_all(&pattern(0, 0, 10_000))?;
            read_exact_checked(&mut s, 0, 0, 10_000)?;
            expect_eof(&mut s)?;
            s.write_all(&pattern(0, 10_000, 20_000))?;
            s.shutdown(Shutdown::Write)?;
            drop(s);
        }
        "abort" => {
            // conn 0: send 32768 B, the server closes with data unread: reset.
            let mut s = SmcStream::connect(addr).context("connect 0")?;
            mode(&s)?;
            send_until_reset(&mut s, 0, 32_768)?;
            eprintln!("conn 0: reset seen");
            drop(s);
            // conn 1: read 1000 B, wait 0.5 s, close with the rest unread (abort).
            let mut s = SmcStream::connect(addr).context("connect 1")?;
            mode(&s)?;
            read_exact_checked(&mut s, 1, 0, 1000)?;
            std::thread::sleep(Duration::from_millis(500));
            drop(s);
        }
        "urg" => {
            let mut s = SmcStream::connect(addr).context("connect")?;
            mode(&s)?;
            s.write_all(&pattern(0, 0, 1000))?;
            std::thread::sleep(Duration::from_millis(200));
            s.send_urgent(b'U')?;
            std::thread::sleep(Duration::from_millis(200));
            s.write_all(&pattern(0, 1000, 2000))?;
            s.shutdown(Shutdown::Write)?;
            let v = wait_urgent(&s)?;
            read_exact_checked(&mut s, 0, 0, 1000)?;
            ensure!(v == b'V', "urgent byte {v:#04x}, expected 'V'");
            read_exact_checked(&mut s, 0, 1000, 2000)?;
            expect_eof(&mut s)?;
            drop(s);
        }
        _ => bail!("unknown scenario {scen}"),
    }
    Ok(())
}

fn server(scen: &str, addr: SocketAddr) -> Result<()> {
    let l = SmcListener::bind(addr).context("bind")?;
    eprintln!("listening on {addr}");
    match scen {
        "srvhalf" => {
            let (mut s, _) = l.accept()?;
            mode(&s)?;
            read_exact_checked(&mut s, 0, 0, 10_000)?;
            s.write_all(&pattern(0, 0, 10_000))?;
            s.shutdown(Shutdown::Write)?;
            read_exact_checked(&mut s, 0, 10_000, 20_000)?;
            expect_eof(&mut s)?;
            drop(s);
        }
        "abort" => {
            // conn 0: read 1000 B, wait 0.5 s, close with the rest unread (abort).
            let (mut s, _) = l.accept()?;
            mode(&s)?;
            read_exact_checked(&mut s, 0, 0, 1000)?;
            std::thread::sleep(Duration::from_millis(500));
            drop(s);
            // conn 1: send 32768 B, the client closes with data unread: reset.
            let (mut s, _) = l.accept()?;
            mode(&s)?;
            send_until_reset(&mut s, 1, 32_768)?;
            eprintln!("conn 1: reset seen");
            drop(s);
        }
        "urg" => {
            let (mut s, _) = l.accept()?;
            mode(&s)?;
            let u = wait_urgent(&s)?;
            read_exact_checked(&mut s, 0, 0, 1000)?;
            ensure!(u == b'U', "urgent byte {u:#04x}, expected 'U'");
            s.write_all(&pattern(0, 0, 1000))?;
            std::thread::sleep(Duration::from_millis(200));
            s.send_urgent(b'V')?;
            read_exact_checked(&mut s, 0, 1000, 2000)?;
            expect_eof(&mut s)?;
            s.write_all(&pattern(0, 1000, 2000))?;
            drop(s);
        }
        _ => bail!("unknown scenario {scen}"),
    }
    Ok(())
}

/// Lets the closing connections finish their close flows (the peer must still read what
/// we sent: ending the link group now would abort them, RFC 7609 §4.8.2), then ends the
/// link groups in order (DELETE LINK) and waits for them to go.
fn finish() {
    let stack = smc::Stack::global();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) && !stack.connections().is_empty() {
        std::thread::sleep(Duration::from_millis(20));
    }
    stack.terminate_link_groups();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(2) && !stack.link_groups().is_empty() {
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SMC_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    smc_providers::install_default();
    smc_bpf::install_default();
    let args: Vec<String> = std::env::args().collect();
    let run = || -> Result<()> {
        ensure!(
            args.len() == 4,
            "usage: smc-kpeer-scen client|server srvhalf|abort|urg ADDR"
        );
        let addr: SocketAddr = args[3].parse().context("ADDR")?;
        match args[1].as_str() {
            "client" => client(&args[2], addr),
            "server" => server(&args[2], addr),
            r => bail!("unknown role {r}"),
        }
    };
    let r = run();
    finish();
    match r {
        Ok(()) => {
            println!("PEER OK");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("PEER FAIL: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn pattern_matches_the_harness() {
        // tests/kernel-peer/README.md: the first bytes of seed 0.
        assert_eq!(
            super::pattern(0, 0, 8),
            [0xaf, 0xcd, 0x1d, 0x7b, 0x39, 0xa8, 0x20, 0xe2]
        );
        assert_eq!(super::pattern(0, 3, 2), [0x7b, 0x39]);
    }
}
