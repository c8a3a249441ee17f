//! `smc listen` and `smc connect`: netcat-like endpoints (stdin → socket, socket →
//! stdout, half-close on stdin end of file), plus the modes the system tests use to move
//! verifiable data: an echo and a hashing sink on the listener, and a seeded generator
//! with hash checks on the connecting side. Generic over the transport ([`Net`]); the
//! commands run them over SMC-R, the unit tests over kernel TCP.
//!
//! Every connection's mode (SMC-R with its link group, or TCP fallback with the reason)
//! goes to stderr unless `-q`; data and per-connection results go to stdout.

use crate::net::{Listener, Net, Stream};
use crate::payload::{self, Moved, Pattern};
use anyhow::{bail, Context, Result};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::Duration;

/// Something whose state `--stats` prints (the SMC-R stack).
pub trait Inspect: Sync {
    /// A multi-line snapshot, each line prefixed for grepping.
    fn snapshot(&self) -> String;
    /// Waits (at most `limit`) until closed connections are gone, so that a snapshot
    /// taken next shows the steady state (closing is asynchronous).
    fn quiesce(&self, limit: Duration) {
        let _ = limit;
    }
}

/// No stack to show (kernel TCP).
pub struct NoInspect;

impl Inspect for NoInspect {
    fn snapshot(&self) -> String {
        String::new()
    }
}

/// `smc listen` options.
#[derive(clap::Args, Debug, Clone)]
pub struct ListenArgs {
    /// Address to listen on, e.g. 127.0.0.2:5000 or [::1]:5000 (port 0: any free port).
    pub addr: String,
    /// Echo every connection's bytes back (connections served concurrently).
    #[arg(long, conflicts_with = "sink")]
    pub echo: bool,
    /// Read every connection to its end and print its byte count and SHA-256 on stdout.
    #[arg(long)]
    pub sink: bool,
    /// With --echo or --sink: exit after N connections have finished (default: never).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Print the stack's link groups, connections and counters on exit and on SIGUSR1.
    #[arg(long)]
    pub stats: bool,
    /// Do not print modes and progress to stderr.
    #[arg(short, long)]
    pub quiet: bool,
}

/// `smc connect` options.
#[derive(clap::Args, Debug, Clone)]
pub struct ConnectArgs {
    /// Address to connect to, e.g. 127.0.0.2:5000.
    pub addr: String,
    /// Local address to connect from (and to open the RDMA device on), e.g. 127.0.0.3;
    /// default: the one the kernel picks.
    #[arg(long, value_name = "IP")]
    pub bind: Option<std::net::IpAddr>,
    /// Instead of stdin: send N bytes of a seeded pseudo-random stream (e.g. 1G, 64K),
    /// half-close, read to the end and print both byte counts and SHA-256s on stdout.
    #[arg(long, value_name = "N")]
    pub send_bytes: Option<String>,
    /// Seed of the generated stream (connection i uses seed + i).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// With --send-bytes: the bytes received must be exactly the bytes sent (an echo peer).
    #[arg(long, requires = "send_bytes")]
    pub expect_echo: bool,
    /// With --send-bytes: the SHA-256 (hex) the received bytes must have.
    #[arg(
        long,
        value_name = "HEX",
        requires = "send_bytes",
        conflicts_with = "expect_echo"
    )]
    pub expect_sha256: Option<String>,
    /// With --send-bytes: open N connections (in sequence unless --concurrent).
    #[arg(long, default_value_t = 1, requires = "send_bytes")]
    pub conns: usize,
    /// With --conns: open all connections first, then transfer on all at once.
    #[arg(long, requires = "send_bytes")]
    pub concurrent: bool,
    /// With --concurrent: keep every connection open this many milliseconds after the
    /// transfers (and print "all N open" to stderr when that starts), then close them.
    /// In sequence: pause this long after the first and after the last connection
    /// ("holding after connection I" on stderr), the link group up and no connection open.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub hold_ms: u64,
    /// Fail (exit 1) when a connection is not SMC-R.
    #[arg(long)]
    pub require_smc: bool,
    /// Print the stack's link groups, connections and counters at the end; also, with
    /// --concurrent, while all connections are open, and in sequence after the first.
    #[arg(long)]
    pub stats: bool,
    /// Do not print modes and progress to stderr.
    #[arg(short, long)]
    pub quiet: bool,
}

fn note(quiet: bool, msg: impl AsRef<str>) {
    if !quiet {
        eprintln!("{}", msg.as_ref());
    }
}

/// Prints one snapshot on stdout between `stats: -- TITLE` and `stats: -- end`.
pub fn print_stats(inspect: &dyn Inspect, title: &str) {
    let s = inspect.snapshot();
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "stats: -- {title}");
    let _ = out.write_all(s.as_bytes());
    let _ = writeln!(out, "stats: -- end");
    let _ = out.flush();
}

/// Runs `smc listen` over `net`.
pub fn listen<N: Net>(net: &N, args: &ListenArgs, inspect: &dyn Inspect) -> Result<()> {
    let addr = crate::net::resolve(&args.addr)?;
    let listener = net
        .bind(addr)
        .with_context(|| format!("listen on {addr}"))?;
    let local = listener.local_addr()?;
    note(args.quiet, format!("listening on {local}"));
    let r = if args.echo || args.sink {
        serve_many(&listener, args)
    } else {
        serve_netcat(&listener, args)
    };
    if args.stats {
        print_stats(inspect, "at exit");
    }
    r
}

fn serve_netcat<L: Listener>(listener: &L, args: &ListenArgs) -> Result<()> {
    let (s, peer) = listener.accept().context("accept")?;
    note(args.quiet, format!("accepted {peer}: {}", s.mode()));
    netcat(&s)
}

fn serve_many<L: Listener>(listener: &L, args: &ListenArgs) -> Result<()> {
    let failed = AtomicBool::new(false);
    let index = AtomicU64::new(0);
    let out = Mutex::new(());
    thread::scope(|sc| -> Result<()> {
        let mut accepted = 0u64;
        while args.count.is_none_or(|n| accepted < n) {
            let (s, peer) = match listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e).context("accept"),
            };
            accepted += 1;
            let i = index.fetch_add(1, Ordering::Relaxed) + 1;
            let mode = s.mode();
            note(args.quiet, format!("accepted {peer}: {mode}"));
            let (failed, out) = (&failed, &out);
            sc.spawn(move || {
                let r: io::Result<String> = if args.echo {
                    payload::echo(&s)
                        .map(|m| format!("echoed {} bytes sha256={}", m.bytes, m.hex()))
                } else {
                    payload::recv_hash(&s)
                        .map(|m| format!("received {} bytes sha256={}", m.bytes, m.hex()))
                };
                let _g = out.lock();
                match r {
                    Ok(line) => {
                        let mut o = io::stdout().lock();
                        let _ = writeln!(o, "conn {i} peer={peer} {line}");
                        let _ = o.flush();
                    }
                    Err(e) => {
                        failed.store(true, Ordering::Relaxed);
                        eprintln!("conn {i} peer={peer}: {e}");
                    }
                }
            });
        }
        Ok(())
    })?;
    if failed.load(Ordering::Relaxed) {
        bail!("some connections failed");
    }
    Ok(())
}

/// Waits until `fd` (the input) has data (or end of file) and returns true; false once
/// `stop` is set. Polls in slices of 200 ms so that the input direction also ends when
/// the connection failed while the input stays silent (an idle terminal or pipe).
fn input_ready(fd: BorrowedFd<'_>, stop: &AtomicBool) -> io::Result<bool> {
    loop {
        if stop.load(Ordering::Acquire) {
            return Ok(false);
        }
        // Readable, or hung up / error: read() tells which. EINTR counts as a
        // wake-up that rechecks `stop`.
        if smc_verbs::event::wait_readable(fd, Some(Duration::from_millis(200)))? {
            return Ok(true);
        }
    }
}

/// stdin → socket (then half-close), socket → stdout; returns when both directions are
/// done, or at once when the socket fails (a reset connection ends the command even
/// while stdin is silent).
fn netcat<S: Stream>(s: &S) -> Result<()> {
    netcat_io(s, io::stdin(), io::stdout().lock())
}

/// [`netcat`] with its input and output given.
fn netcat_io<S: Stream, I: Read + AsFd + Send, O: Write>(
    s: &S,
    mut input: I,
    mut stdout: O,
) -> Result<()> {
    let failed = AtomicBool::new(false);
    thread::scope(|sc| {
        let failed = &failed;
        let up = sc.spawn(move || -> io::Result<()> {
            // CHUNK is larger than stdin's own buffer, so reads bypass it and poll(2) on
            // the descriptor sees every byte not read yet.
            let mut buf = vec![0u8; payload::CHUNK];
            loop {
                if !input_ready(input.as_fd(), failed)? {
                    return Ok(());
                }
                let n = match input.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                };
                payload::write_all(s, &buf[..n])?;
            }
            s.shutdown(Shutdown::Write)
        });
        let mut buf = vec![0u8; payload::CHUNK];
        let down: io::Result<()> = loop {
            match payload::read_retry(s, &mut buf) {
                Ok(0) => break stdout.flush(),
                Ok(n) => {
                    // netcat semantics: what arrives is passed on at once (stdout is
                    // line-buffered, and binary data or a prompt has no newline).
                    if let Err(e) = stdout.write_all(&buf[..n]).and_then(|_| stdout.flush()) {
                        break Err(e);
                    }
                }
                Err(e) => break Err(e),
            }
        };
        if down.is_err() {
            failed.store(true, Ordering::Release);
        }
        let up = up
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("stdin thread panicked")));
        down.context("socket → stdout")?;
        // A peer that stops reading (closed before we sent everything) is reported.
        up.context("stdin → socket")
    })
}

/// Runs `smc connect` over `net`.
pub fn connect<N: Net>(net: &N, args: &ConnectArgs, inspect: &dyn Inspect) -> Result<()> {
    let addr = crate::net::resolve(&args.addr)?;
    let Some(size) = &args.send_bytes else {
        let s = net
            .connect(addr)
            .with_context(|| format!("connect to {addr}"))?;
        let mode = s.mode();
        note(args.quiet, format!("connected to {addr}: {mode}"));
        let r = netcat(&s);
        if args.stats {
            print_stats(inspect, "at exit");
        }
        r?;
        if args.require_smc && !mode.is_smc() {
            bail!("the connection is not SMC-R: {mode}");
        }
        return Ok(());
    };
    let len = payload::parse_size(size).map_err(anyhow::Error::msg)?;
    let expect = match &args.expect_sha256 {
        Some(h) => Some(payload::parse_sha256(h).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let check = Check {
        addr,
        len,
        expect,
        echo: args.expect_echo,
        require_smc: args.require_smc,
        quiet: args.quiet,
    };
    let ok = if args.concurrent {
        generate_concurrent(net, addr, args, &check, inspect)?
    } else {
        let mut ok = true;
        for i in 0..args.conns {
            let s = net
                .connect(addr)
                .with_context(|| format!("connect to {addr} (connection {})", i + 1))?;
            ok &= check.report(
                i + 1,
                &s,
                transfer(&s, args.seed.wrapping_add(i as u64), len),
            );
            drop(s);
            // Reference points for leak checks, with the link group up and no connection:
            // after the first and after the last connection (the peer may take its own
            // snapshots while this one holds).
            if (i == 0 || i + 1 == args.conns) && args.conns > 1 {
                if args.stats || args.hold_ms > 0 {
                    inspect.quiesce(Duration::from_secs(5));
                }
                if args.stats && i == 0 {
                    print_stats(inspect, "after connection 1");
                }
                if args.hold_ms > 0 {
                    note(check.quiet, format!("holding after connection {}", i + 1));
                    thread::sleep(Duration::from_millis(args.hold_ms));
                }
            }
        }
        ok
    };
    if args.stats {
        inspect.quiesce(Duration::from_secs(5));
        print_stats(inspect, "at exit");
    }
    if !ok {
        bail!("verification failed (see stdout)");
    }
    Ok(())
}

struct Check {
    addr: SocketAddr,
    len: u64,
    expect: Option<[u8; 32]>,
    echo: bool,
    require_smc: bool,
    quiet: bool,
}

impl Check {
    /// Prints one connection's result line; false when it fails a check.
    fn report<S: Stream>(&self, i: usize, s: &S, r: io::Result<(Moved, Moved)>) -> bool {
        let mode = s.mode();
        let peer = s.peer_addr().unwrap_or(self.addr);
        note(self.quiet, format!("connected to {peer}: {mode}"));
        let mut o = io::stdout().lock();
        let (sent, got) = match r {
            Ok(x) => x,
            Err(e) => {
                let _ = writeln!(o, "conn {i} FAILED: {e}");
                return false;
            }
        };
        let mut verdict = Vec::new();
        let mut ok = sent.bytes == self.len;
        if self.echo {
            let same = got.bytes == sent.bytes && got.sha256 == sent.sha256;
            verdict.push(if same { "echo=ok" } else { "echo=MISMATCH" });
            ok &= same;
        }
        if let Some(h) = self.expect {
            let same = got.sha256 == h;
            verdict.push(if same { "sha256=ok" } else { "sha256=MISMATCH" });
            ok &= same;
        }
        if self.require_smc && !mode.is_smc() {
            verdict.push("NOT-SMC-R");
            ok = false;
        }
        let _ = writeln!(
            o,
            "conn {i} mode={} sent {} bytes sha256={} received {} bytes sha256={} in {:.3} s {}",
            mode.short(),
            sent.bytes,
            sent.hex(),
            got.bytes,
            got.hex(),
            sent.elapsed.max(got.elapsed).as_secs_f64(),
            verdict.join(" ")
        );
        let _ = o.flush();
        ok
    }
}

/// Sends `len` generated bytes while hashing everything that comes back.
fn transfer<S: Stream>(s: &S, seed: u64, len: u64) -> io::Result<(Moved, Moved)> {
    thread::scope(|sc| {
        let rx = sc.spawn(|| payload::recv_hash(s));
        let sent = payload::send_pattern(s, Pattern::new(seed), len)
            .and_then(|m| s.shutdown(Shutdown::Write).map(|_| m));
        let got = rx
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("receiver thread panicked")));
        Ok((sent?, got?))
    })
}

fn generate_concurrent<N: Net>(
    net: &N,
    addr: SocketAddr,
    args: &ConnectArgs,
    check: &Check,
    inspect: &dyn Inspect,
) -> Result<bool> {
    let mut streams = Vec::with_capacity(args.conns);
    for i in 0..args.conns {
        streams.push(
            net.connect(addr)
                .with_context(|| format!("connect to {addr} (connection {})", i + 1))?,
        );
    }
    let ok = AtomicBool::new(true);
    thread::scope(|sc| {
        for (i, s) in streams.iter().enumerate() {
            let ok = &ok;
            sc.spawn(move || {
                let r = transfer(s, args.seed.wrapping_add(i as u64), check.len);
                if !check.report(i + 1, s, r) {
                    ok.store(false, Ordering::Relaxed);
                }
            });
        }
    });
    note(check.quiet, format!("all {} open", streams.len()));
    if args.stats {
        print_stats(inspect, &format!("all {} connections open", streams.len()));
    }
    if args.hold_ms > 0 {
        thread::sleep(Duration::from_millis(args.hold_ms));
    }
    drop(streams);
    Ok(ok.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::KernelTcp;

    fn listen_args(addr: &str) -> ListenArgs {
        ListenArgs {
            addr: addr.into(),
            echo: true,
            sink: false,
            count: Some(3),
            stats: true,
            quiet: true,
        }
    }

    fn connect_args(addr: String) -> ConnectArgs {
        ConnectArgs {
            addr,
            bind: None,
            send_bytes: Some("200K".into()),
            seed: 4,
            expect_echo: true,
            expect_sha256: None,
            conns: 3,
            concurrent: false,
            hold_ms: 0,
            require_smc: false,
            stats: false,
            quiet: true,
        }
    }

    /// A free port on 127.0.0.1 (bound and released; the race is harmless in tests).
    fn free_addr() -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    }

    #[test]
    fn echo_listener_and_generator_verify_over_tcp() {
        let addr = free_addr();
        let la = listen_args(&addr);
        let srv = thread::spawn(move || listen(&KernelTcp, &la, &NoInspect));
        thread::sleep(Duration::from_millis(100));
        connect(&KernelTcp, &connect_args(addr.clone()), &NoInspect).unwrap();
        srv.join().unwrap().unwrap();
    }

    #[test]
    fn concurrent_generator_and_wrong_hash_fails() {
        let addr = free_addr();
        let mut la = listen_args(&addr);
        la.count = Some(4);
        let srv = thread::spawn(move || listen(&KernelTcp, &la, &NoInspect));
        thread::sleep(Duration::from_millis(100));
        let mut ca = connect_args(addr.clone());
        ca.concurrent = true;
        connect(&KernelTcp, &ca, &NoInspect).unwrap();
        // An echo never has some other stream's hash.
        let mut bad = connect_args(addr);
        bad.conns = 1;
        bad.expect_echo = false;
        bad.expect_sha256 = Some(payload::hex(&Pattern::new(99).sha256(200 << 10)));
        assert!(connect(&KernelTcp, &bad, &NoInspect).is_err());
        srv.join().unwrap().unwrap();
    }

    #[test]
    fn require_smc_fails_on_tcp() {
        let addr = free_addr();
        let mut la = listen_args(&addr);
        la.count = Some(1);
        let srv = thread::spawn(move || listen(&KernelTcp, &la, &NoInspect));
        thread::sleep(Duration::from_millis(100));
        let mut ca = connect_args(addr);
        ca.conns = 1;
        ca.require_smc = true;
        assert!(connect(&KernelTcp, &ca, &NoInspect).is_err());
        srv.join().unwrap().unwrap();
    }

    /// Netcat: input to the socket, half-close at its end, the echo to the output.
    #[test]
    fn netcat_relays_and_half_closes() {
        use std::os::unix::net::UnixStream;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let srv = thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut got = Vec::new();
            c.read_to_end(&mut got).unwrap();
            c.write_all(&got).unwrap();
        });
        let s = std::net::TcpStream::connect(addr).unwrap();
        let (mut feed, input) = UnixStream::pair().unwrap();
        feed.write_all(b"hello netcat").unwrap();
        drop(feed); // end of input
        let mut out = Vec::new();
        netcat_io(&s, input, &mut out).unwrap();
        assert_eq!(out, b"hello netcat");
        srv.join().unwrap();
    }

    /// A connection that fails ends netcat while its input stays open and silent (an idle
    /// terminal): before, the input thread kept it waiting for the next line.
    #[test]
    fn netcat_ends_on_a_reset_while_input_is_silent() {
        use std::os::unix::net::UnixStream;
        use std::sync::mpsc;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let srv = thread::spawn(move || {
            let (c, _) = l.accept().unwrap();
            thread::sleep(Duration::from_millis(100));
            // SO_LINGER 0: close() sends a reset
            socket2::SockRef::from(&c)
                .set_linger(Some(Duration::ZERO))
                .unwrap();
        });
        let s = std::net::TcpStream::connect(addr).unwrap();
        let (_feed, input) = UnixStream::pair().unwrap(); // open, never written
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let r = netcat_io(&s, input, io::sink());
            let _ = tx.send(r.map_err(|e| format!("{e:#}")));
        });
        srv.join().unwrap();
        let r = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("netcat still waits for input after the reset");
        let e = r.expect_err("a reset connection is an error");
        assert!(e.contains("socket → stdout"), "{e}");
    }
}
