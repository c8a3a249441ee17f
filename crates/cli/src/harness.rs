//! The measuring server and client of `smc demo` and `smc bench`, generic over the
//! transport ([`Net`]) so that SMC-R and kernel TCP run the very same code.
//!
//! Each connection opens with one command byte:
//! - `X` len:u64 seed_c:u64 seed_s:u64 — exchange: both sides send `len` bytes of their
//!   [`Pattern`] at once and each checks the SHA-256 of what it received;
//! - `B` — bulk: the server counts bytes to end of stream and answers the count (u64);
//! - `P` size:u32 — ping-pong: the server echoes `size`-byte messages until end of stream;
//! - `C` — connection: the server answers one byte and waits for the close;
//! - `Q` — stop the server.
//!
//! Numbers are big-endian. Every read on either side gives up after [`STALL`]: a lost
//! message turns into an error that names the step, not a hang.

use crate::net::{ConnMode, Listener, Net, Stream, StreamOf};
use crate::payload::{self, Moved, Pattern, CHUNK};
use crate::workers::Workers;
use std::io;
use std::net::{Shutdown, SocketAddr};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// The longest a measurement waits for its peer's next bytes.
pub const STALL: Duration = Duration::from_secs(30);

/// Connects with `net` and bounds its reads by [`STALL`].
fn dial<N: Net>(net: &N, addr: SocketAddr) -> io::Result<StreamOf<N>> {
    let s = net.connect(addr)?;
    s.set_read_timeout(Some(STALL))?;
    Ok(s)
}

fn stalled(e: io::Error, what: &str) -> io::Error {
    if matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    ) {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{what}: nothing from the peer for {} s", STALL.as_secs()),
        )
    } else {
        e
    }
}

/// What the server saw on one connection.
#[derive(Clone, Debug)]
pub struct ServerRecord {
    /// The connection's mode on the server side.
    pub mode: ConnMode,
    /// The command byte.
    pub command: u8,
    /// For `X`: what arrived and whether it matched the client's pattern.
    pub received: Option<(Moved, bool)>,
    /// An error that ended the connection.
    pub error: Option<String>,
}

/// A running measuring server.
pub struct Server {
    addr: SocketAddr,
    records: Arc<Mutex<Vec<ServerRecord>>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Server {
    /// Starts serving `listener` on a thread (connections on threads kept for the next
    /// ones, [`Workers`]).
    pub fn start<L>(listener: L) -> io::Result<Server>
    where
        L: Listener + 'static,
        L::Stream: 'static,
    {
        let addr = listener.local_addr()?;
        let records = Arc::new(Mutex::new(Vec::new()));
        let recs = records.clone();
        let thread = thread::Builder::new()
            .name("harness-accept".into())
            .spawn(move || accept_loop(listener, recs))?;
        Ok(Server {
            addr,
            records,
            thread: Some(thread),
        })
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Everything recorded so far.
    pub fn records(&self) -> Vec<ServerRecord> {
        self.records.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Stops the accept loop (via a `Q` connection over `net`), waits for it and every
    /// connection thread, and returns all records.
    pub fn stop<N: Net>(self, net: &N) -> Vec<ServerRecord> {
        stop_remote(net, self.addr);
        self.wait()
    }

    /// Waits until a client stops the accept loop (`Q`) and every connection thread is
    /// done, and returns all records (`smc bench --listen`: serving another process).
    pub fn wait(mut self) -> Vec<ServerRecord> {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.records()
    }
}

/// Sends the stop command (`Q`) to the measuring server at `addr`, in this process or
/// another, and waits for it to close the connection.
pub fn stop_remote<N: Net>(net: &N, addr: SocketAddr) {
    if let Ok(s) = net.connect(addr) {
        let _ = s.set_read_timeout(Some(STALL));
        let _ = payload::write_all(&s, b"Q");
        let _ = s.shutdown(Shutdown::Write);
        let mut b = [0u8; 1];
        let _ = payload::read_retry(&s, &mut b);
    }
}

fn accept_loop<L>(listener: L, records: Arc<Mutex<Vec<ServerRecord>>>)
where
    L: Listener + 'static,
    L::Stream: 'static,
{
    // Threads kept from one connection to the next (crate::workers): a connection's
    // rate is then not a thread's creation.
    let mut workers = Workers::new("harness-conn");
    loop {
        let (s, _) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!("harness accept: {e}");
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let _ = s.set_read_timeout(Some(STALL));
        let mut cmd = [0u8; 1];
        if let Err(e) = payload::read_exact(&s, &mut cmd) {
            tracing::warn!("harness: no command byte: {}", stalled(e, "command"));
            continue;
        }
        if cmd[0] == b'Q' {
            let _ = s.shutdown(Shutdown::Both);
            break;
        }
        let recs = records.clone();
        let job = move || {
            let mode = s.mode();
            let mut rec = ServerRecord {
                mode,
                command: cmd[0],
                received: None,
                error: None,
            };
            if let Err(e) = serve(&s, cmd[0], &mut rec) {
                rec.error = Some(e.to_string());
            }
            // Closed before the thread takes the next connection.
            drop(s);
            if let Ok(mut r) = recs.lock() {
                r.push(rec);
            }
        };
        if let Err(e) = workers.run(job) {
            tracing::warn!("harness: cannot start a connection thread: {e}");
        }
    }
    workers.join();
}

fn read_u64<S: Stream>(s: &S) -> io::Result<u64> {
    let mut b = [0u8; 8];
    payload::read_exact(s, &mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn serve<S: Stream>(s: &S, cmd: u8, rec: &mut ServerRecord) -> io::Result<()> {
    match cmd {
        b'X' => {
            let len = read_u64(s)?;
            let seed_c = read_u64(s)?;
            let seed_s = read_u64(s)?;
            let (sent, got) = thread::scope(|sc| {
                let tx = sc.spawn(|| -> io::Result<Moved> {
                    let m = payload::send_pattern(s, Pattern::new(seed_s), len)?;
                    s.shutdown(Shutdown::Write)?;
                    Ok(m)
                });
                let got = payload::recv_hash(s);
                (tx.join(), got)
            });
            let got = got?;
            sent.map_err(|_| io::Error::other("sender thread panicked"))??;
            let ok = got.bytes == len && got.sha256 == Pattern::new(seed_c).sha256(len);
            rec.received = Some((got, ok));
            Ok(())
        }
        b'B' => {
            let mut buf = vec![0u8; CHUNK];
            let mut n = 0u64;
            loop {
                match payload::read_retry(s, &mut buf)? {
                    0 => break,
                    k => n += k as u64,
                }
            }
            payload::write_all(s, &n.to_be_bytes())?;
            s.shutdown(Shutdown::Write)
        }
        b'P' => {
            s.set_nodelay(true)?;
            let mut sz = [0u8; 4];
            payload::read_exact(s, &mut sz)?;
            let size = u32::from_be_bytes(sz) as usize;
            if size == 0 || size > 1 << 20 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "ping-pong size out of range",
                ));
            }
            let mut buf = vec![0u8; size];
            loop {
                // A clean end of stream between messages ends the test.
                let n = payload::read_retry(s, &mut buf[..1])?;
                if n == 0 {
                    return Ok(());
                }
                payload::read_exact(s, &mut buf[1..])?;
                payload::write_all(s, &buf)?;
            }
        }
        b'C' => {
            payload::write_all(s, b"c")?;
            let mut b = [0u8; 1];
            while payload::read_retry(s, &mut b)? != 0 {}
            Ok(())
        }
        other => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unknown harness command {other:#04x}"),
        )),
    }
}

/// Result of one exchange, as the client saw it.
#[derive(Clone, Debug)]
pub struct Exchange {
    /// The client's connection mode.
    pub mode: ConnMode,
    /// What the client sent.
    pub sent: Moved,
    /// What the client received.
    pub received: Moved,
    /// Whether `received` matched the server's pattern.
    pub verified: bool,
    /// From connect to both directions complete.
    pub elapsed: Duration,
}

/// Connects and exchanges `len` bytes each way (client seed `seed`, server `seed + 1`).
pub fn exchange<N: Net>(net: &N, addr: SocketAddr, len: u64, seed: u64) -> io::Result<Exchange> {
    let start = Instant::now();
    let s = dial(net, addr)?;
    let mode = s.mode();
    let seed_s = seed.wrapping_add(1);
    let mut hdr = Vec::with_capacity(25);
    hdr.push(b'X');
    hdr.extend_from_slice(&len.to_be_bytes());
    hdr.extend_from_slice(&seed.to_be_bytes());
    hdr.extend_from_slice(&seed_s.to_be_bytes());
    payload::write_all(&s, &hdr)?;
    let (sent, received) = thread::scope(|sc| {
        let rx = sc.spawn(|| payload::recv_hash(&s));
        let sent = payload::send_pattern(&s, Pattern::new(seed), len)
            .and_then(|m| s.shutdown(Shutdown::Write).map(|_| m));
        (sent, rx.join())
    });
    let sent = sent?;
    let received = received
        .map_err(|_| io::Error::other("receiver thread panicked"))?
        .map_err(|e| stalled(e, "exchange"))?;
    let verified = received.bytes == len && received.sha256 == Pattern::new(seed_s).sha256(len);
    Ok(Exchange {
        mode,
        sent,
        received,
        verified,
        elapsed: start.elapsed(),
    })
}

/// Bulk throughput: `len` bytes client → server in [`CHUNK`] writes, timed from the
/// first write to the server's count arriving back.
pub fn bulk<N: Net>(net: &N, addr: SocketAddr, len: u64) -> io::Result<(ConnMode, Duration)> {
    let s = dial(net, addr)?;
    let mode = s.mode();
    let mut buf = vec![0u8; CHUNK];
    Pattern::new(3).fill(0, &mut buf);
    let start = Instant::now();
    payload::write_all(&s, b"B")?;
    let mut left = len;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        payload::write_all(&s, &buf[..n])?;
        left -= n as u64;
    }
    s.shutdown(Shutdown::Write)?;
    let got = read_u64(&s).map_err(|e| stalled(e, "bulk: the receiver's count"))?;
    let elapsed = start.elapsed();
    if got != len {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bulk: server counted {got} bytes, {len} sent"),
        ));
    }
    Ok((mode, elapsed))
}

/// Round-trip times of `iters` ping-pongs of `size` bytes (after `warmup` untimed ones).
pub fn pingpong<N: Net>(
    net: &N,
    addr: SocketAddr,
    size: u32,
    warmup: usize,
    iters: usize,
) -> io::Result<(ConnMode, Vec<Duration>)> {
    let s = dial(net, addr)?;
    s.set_nodelay(true)?;
    let mode = s.mode();
    let mut hdr = vec![b'P'];
    hdr.extend_from_slice(&size.to_be_bytes());
    payload::write_all(&s, &hdr)?;
    let mut msg = vec![0u8; size as usize];
    Pattern::new(5).fill(0, &mut msg);
    let mut back = vec![0u8; size as usize];
    let mut rtts = Vec::with_capacity(iters);
    for i in 0..warmup + iters {
        let t = Instant::now();
        payload::write_all(&s, &msg)?;
        payload::read_exact(&s, &mut back)
            .map_err(|e| stalled(e, &format!("ping-pong {size} B, round trip {i}")))?;
        if i >= warmup {
            rtts.push(t.elapsed());
        }
        if back != msg {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "ping-pong: echo differs",
            ));
        }
    }
    s.shutdown(Shutdown::Write)?;
    Ok((mode, rtts))
}

/// Opens, uses (one byte each way) and closes `count` connections in sequence; returns
/// the modes seen and the total time.
pub fn conn_rate<N: Net>(
    net: &N,
    addr: SocketAddr,
    count: usize,
) -> io::Result<(Vec<ConnMode>, Duration)> {
    let mut modes = Vec::with_capacity(count);
    let start = Instant::now();
    for _ in 0..count {
        let s: StreamOf<N> = dial(net, addr)?;
        payload::write_all(&s, b"C")?;
        let mut b = [0u8; 1];
        payload::read_exact(&s, &mut b)
            .map_err(|e| stalled(e, &format!("connection {}", modes.len() + 1)))?;
        modes.push(s.mode());
        drop(s);
    }
    Ok((modes, start.elapsed()))
}

/// Summary of round-trip times, in microseconds.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LatencySummary {
    /// Samples.
    pub samples: usize,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Mean.
    pub mean_us: f64,
    /// Minimum.
    pub min_us: f64,
}

/// Summarises round-trip times: percentiles from an HdrHistogram of the nanosecond
/// values (3 significant digits, 0.1 % resolution), mean and minimum exact.
pub fn summarize(rtts: &[Duration]) -> LatencySummary {
    let ns = |d: &Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let hist = Histogram::<u64>::new(3).ok().map(|mut h| {
        for d in rtts {
            // Auto-resizing: only a value beyond what the histogram can ever cover
            // (u64 nanoseconds) fails, and is clamped.
            if h.record(ns(d)).is_err() {
                h.saturating_record(ns(d));
            }
        }
        h
    });
    let pick = |q: f64| -> f64 {
        match &hist {
            Some(h) if !h.is_empty() => h.value_at_quantile(q) as f64 / 1e3,
            _ => 0.0,
        }
    };
    let us = |d: &Duration| d.as_secs_f64() * 1e6;
    LatencySummary {
        samples: rtts.len(),
        p50_us: pick(0.5),
        p99_us: pick(0.99),
        mean_us: if rtts.is_empty() {
            0.0
        } else {
            rtts.iter().map(us).sum::<f64>() / rtts.len() as f64
        },
        min_us: rtts.iter().min().map(us).unwrap_or(0.0),
    }
}

/// CPU time (user + system) of this process so far (all its threads).
pub fn cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::KernelTcp;

    fn server() -> Server {
        Server::start(KernelTcp.bind("127.0.0.1:0".parse().unwrap()).unwrap()).unwrap()
    }

    #[test]
    fn exchange_bulk_pingpong_and_conns_over_tcp() {
        let srv = server();
        let x = exchange(&KernelTcp, srv.addr(), 1 << 20, 9).unwrap();
        assert!(x.verified);
        assert_eq!(x.sent.sha256, Pattern::new(9).sha256(1 << 20));
        let (mode, d) = bulk(&KernelTcp, srv.addr(), 5 << 20).unwrap();
        assert_eq!(mode.kind, crate::net::ModeKind::KernelTcp);
        assert!(d > Duration::ZERO);
        let (_, rtts) = pingpong(&KernelTcp, srv.addr(), 1024, 5, 50).unwrap();
        assert_eq!(rtts.len(), 50);
        let (modes, _) = conn_rate(&KernelTcp, srv.addr(), 20).unwrap();
        assert_eq!(modes.len(), 20);
        let recs = srv.stop(&KernelTcp);
        let x = recs.iter().find(|r| r.command == b'X').unwrap();
        assert!(
            x.received.as_ref().unwrap().1,
            "server verified the exchange"
        );
        assert_eq!(recs.iter().filter(|r| r.command == b'C').count(), 20);
        assert!(recs.iter().all(|r| r.error.is_none()), "{recs:?}");
    }

    #[test]
    fn server_notices_a_corrupted_exchange() {
        let srv = server();
        // Claim seed 1 but send seed 2's bytes: the server must flag it.
        let s = KernelTcp.connect(srv.addr()).unwrap();
        let mut hdr = vec![b'X'];
        for v in [4096u64, 1, 2] {
            hdr.extend_from_slice(&v.to_be_bytes());
        }
        payload::write_all(&s, &hdr).unwrap();
        payload::send_pattern(&s, Pattern::new(2), 4096).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let back = payload::recv_hash(&s).unwrap();
        assert_eq!(back.sha256, Pattern::new(2).sha256(4096));
        drop(s);
        let recs = srv.stop(&KernelTcp);
        let x = recs.iter().find(|r| r.command == b'X').unwrap();
        let (got, ok) = x.received.as_ref().unwrap();
        assert_eq!(got.bytes, 4096);
        assert!(!ok, "a stream of the wrong pattern must not verify");
    }

    #[test]
    fn summary_percentiles() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        let s = summarize(&v);
        assert_eq!(s.samples, 100);
        assert!((s.p50_us - 50.0).abs() <= 1.0);
        assert!((s.p99_us - 99.0).abs() <= 1.0);
        assert!((s.min_us - 1.0).abs() < 1e-9);
    }
}
