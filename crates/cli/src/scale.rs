//! `smc scale`: many connections, for the scale system tests (issue 15).
//!
//! `--listen IP` serves SMC-R on `--port` and kernel TCP on the next port with three
//! threads per transport whatever the number of connections (accept → echo one byte →
//! wait for the end), so that its memory is the stack's, not one thread per connection.
//! `--connect IP --conns N` opens N connections and holds them all, exchanges one byte
//! each way on every one, closes them and looks at what is left; then the same N over
//! kernel TCP for the time ratio. `--seq M` then opens, uses (one byte each way) and
//! closes M connections in sequence, sampling its resources as it goes.
//!
//! Every measurement is a `scale ...` line of `key=value` pairs on stdout (for scripts):
//! times, resident memory (`/proc/self/status` VmRSS), threads and file descriptors.
//! Nothing here judges them; the scripts in tests/system do (never on times).

use crate::net::{Listener, Net, Stream, StreamOf};
use crate::payload::{read_exact, write_all};
use anyhow::{bail, Context, Result};
use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// `smc scale` options.
#[derive(clap::Args, Debug, Clone)]
pub struct ScaleArgs {
    /// Serve on this address (SMC-R on --port, kernel TCP on the next port) until killed.
    #[arg(long, value_name = "IP", conflicts_with = "connect")]
    pub listen: Option<std::net::IpAddr>,
    /// Measure against a `smc scale --listen` at this address.
    #[arg(long, value_name = "IP")]
    pub connect: Option<std::net::IpAddr>,
    /// SMC-R port (kernel TCP: the next one).
    #[arg(long, default_value_t = 5303)]
    pub port: u16,
    /// Local address to connect from (and to open the RDMA device on).
    #[arg(long, value_name = "IP")]
    pub bind: Option<std::net::IpAddr>,
    /// Connections held open at once (0: none).
    #[arg(long, default_value_t = 1000)]
    pub conns: usize,
    /// Open, use and close the N connections this many times (a later round that
    /// leaves more behind than the first is a leak; the first may leave the allocator's
    /// cache).
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Then this many connections in sequence (0: none).
    #[arg(long, default_value_t = 0)]
    pub seq: usize,
    /// Resource samples during --seq (every seq/samples connections).
    #[arg(long, default_value_t = 10)]
    pub samples: usize,
    /// Bytes each held connection sends and gets back (at most 64 KiB). With the RMB's and the send buffer's size, every page of both is
    /// in use and the memory per connection is what a busy connection costs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub bytes: u32,
    /// Skip the kernel TCP comparison.
    #[arg(long)]
    pub no_tcp: bool,
    /// Pause this long at each measuring point (`scale hold PHASE` on stderr first), so
    /// that a script can look at the server meanwhile.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub hold_ms: u64,
    /// Wait at most this long for closed connections and idle link groups to be gone.
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    pub settle_ms: u64,
    /// With --listen: print the stack's state on SIGUSR1 and at exit.
    #[arg(long)]
    pub stats: bool,
}

/// What the client learns from its stack (SMC-R) or not (TCP).
pub trait Gauge: Sync {
    /// Connections the stack still has (closed ones go asynchronously).
    fn connections(&self) -> usize {
        0
    }
    /// Link groups alive.
    fn link_groups(&self) -> usize {
        0
    }
    /// RMB size + send buffer size per connection, bytes (0: not an SMC-R stack).
    fn buffers_per_conn(&self) -> usize {
        0
    }
}

/// Kernel TCP: nothing to ask.
pub struct NoGauge;
impl Gauge for NoGauge {}

/// The process's resources, from /proc/self.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    /// Resident set, KiB.
    pub rss_kib: u64,
    /// Threads.
    pub threads: u64,
    /// Open file descriptors.
    pub fds: u64,
}

impl Usage {
    /// Now.
    pub fn now() -> Usage {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let fds = std::fs::read_dir("/proc/self/fd")
            .map(|d| d.count() as u64)
            .unwrap_or(0);
        Usage {
            rss_kib: field("VmRSS:"),
            threads: field("Threads:"),
            fds,
        }
    }

    fn kv(&self, prefix: &str) -> String {
        format!(
            "{prefix}rss_kib={} {prefix}threads={} {prefix}fds={}",
            self.rss_kib, self.threads, self.fds
        )
    }
}

fn line(s: String) {
    let mut o = io::stdout().lock();
    let _ = writeln!(o, "{s}");
    let _ = o.flush();
}

fn hold(args: &ScaleArgs, phase: &str) {
    if args.hold_ms > 0 {
        eprintln!("scale hold {phase}");
        thread::sleep(Duration::from_millis(args.hold_ms));
    }
}

/// Largest echo `serve` does.
const MAX_BYTES: usize = 65536;

/// One byte each way: write `b`, read it back.
fn ping<S: Stream>(s: &S, b: u8) -> io::Result<()> {
    let mut m = [0u8; 5];
    m[..4].copy_from_slice(&1u32.to_be_bytes());
    m[4] = b;
    write_all(s, &m)?;
    expect_byte(s, b)
}

fn expect_byte<S: Stream>(s: &S, b: u8) -> io::Result<()> {
    let mut got = [0u8; 1];
    loop {
        match s.read(&mut got) {
            Ok(1) if got[0] == b => return Ok(()),
            Ok(1) => return Err(io::Error::other("wrong byte echoed")),
            Ok(_) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Serves `listener` until accept fails: every connection gets its one byte echoed and
/// is closed once the peer closed it. Three threads, whatever the number of connections
/// (connections are taken in accept order; a client that writes to all before reading
/// any, as `run_client` does, never waits on this order).
pub fn serve<L: Listener + 'static>(listener: L) -> Result<()>
where
    L::Stream: 'static,
{
    let (to_echo, echo_rx) = mpsc::channel::<L::Stream>();
    let (to_end, end_rx) = mpsc::channel::<L::Stream>();
    let echo = thread::Builder::new()
        .name("scale-echo".into())
        .spawn(move || {
            for s in echo_rx {
                // A 4-byte length (big endian, at most 64 KiB), then that many bytes.
                let mut h = [0u8; 4];
                if read_exact(&s, &mut h).is_err() {
                    continue;
                }
                let len = u32::from_be_bytes(h) as usize;
                if len > MAX_BYTES {
                    continue;
                }
                let mut b = vec![0u8; len];
                if read_exact(&s, &mut b).is_ok() && write_all(&s, &b).is_ok() {
                    let _ = to_end.send(s);
                }
            }
        })?;
    let end = thread::Builder::new()
        .name("scale-end".into())
        .spawn(move || {
            let mut b = [0u8; 16];
            for s in end_rx {
                // Until the peer's end of stream (or an error): then closed by drop.
                while matches!(s.read(&mut b), Ok(n) if n > 0) {}
            }
        })?;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                if to_echo.send(s).is_err() {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                drop(to_echo);
                let _ = echo.join();
                let _ = end.join();
                return Err(e).context("accept");
            }
        }
    }
    Ok(())
}

/// Waits until the stack has no connection left, at most `lgrs` link groups and (when
/// given) at most `fds` open file descriptors: links and their QPs are torn down
/// asynchronously after their link group is gone.
fn settle(g: &dyn Gauge, lgrs: usize, fds: Option<u64>, limit: Duration) -> bool {
    let t = Instant::now();
    loop {
        if g.connections() == 0
            && g.link_groups() <= lgrs
            && fds.is_none_or(|f| Usage::now().fds <= f)
        {
            return true;
        }
        if t.elapsed() >= limit {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// N connections open at once over `net`: the `scale <label> ...` lines. Returns the
/// seconds the opening took.
pub fn concurrent<N: Net>(
    net: &N,
    addr: SocketAddr,
    args: &ScaleArgs,
    g: &dyn Gauge,
    label: &str,
) -> Result<f64> {
    let smc = g.buffers_per_conn() > 0;
    // Warm-up: the device, the engine and one link group exist before the baseline.
    let lgrs_before = {
        let s = net.connect(addr).context("warm-up connection")?;
        ping(&s, 0).context("warm-up connection")?;
        drop(s);
        settle(g, usize::MAX, None, Duration::from_millis(args.settle_ms));
        g.link_groups()
    };
    let base = Usage::now();
    hold(args, &format!("{label} base"));
    let t0 = Instant::now();
    let mut conns: Vec<StreamOf<N>> = Vec::with_capacity(args.conns);
    let mut not_smc = 0usize;
    for i in 0..args.conns {
        let s = net
            .connect(addr)
            .with_context(|| format!("connection {} of {}", i + 1, args.conns))?;
        if smc && !s.mode().is_smc() {
            not_smc += 1;
        }
        conns.push(s);
    }
    let secs = t0.elapsed().as_secs_f64();
    let open = Usage::now();
    let n = args.conns.max(1) as f64;
    let per_conn = (open.rss_kib as f64 - base.rss_kib as f64) / n;
    line(format!(
        "scale {label} open conns={} secs={secs:.3} per_sec={:.0} not_smc={not_smc} \
         link_groups={} {} {} rss_per_conn_kib={per_conn:.1} buffers_per_conn_kib={}",
        args.conns,
        args.conns as f64 / secs.max(1e-9),
        g.link_groups(),
        base.kv("base_"),
        open.kv(""),
        g.buffers_per_conn() / 1024,
    ));
    hold(args, &format!("{label} open"));
    let t1 = Instant::now();
    let len = args.bytes as usize;
    let mut out = vec![0u8; 4 + len];
    out[..4].copy_from_slice(&(len as u32).to_be_bytes());
    let mut back = vec![0u8; len];
    for (i, s) in conns.iter().enumerate() {
        out[4..].fill(i as u8);
        write_all(s, &out).with_context(|| format!("write on connection {}", i + 1))?;
    }
    for (i, s) in conns.iter().enumerate() {
        read_exact(s, &mut back).with_context(|| format!("echo on connection {}", i + 1))?;
        if back.iter().any(|&b| b != i as u8) {
            bail!("connection {}: the echo differs from what was sent", i + 1);
        }
    }
    let used = Usage::now();
    line(format!(
        "scale {label} echoed conns={} bytes={len} secs={:.3} {} rss_per_conn_kib={:.1}",
        conns.len(),
        t1.elapsed().as_secs_f64(),
        used.kv(""),
        (used.rss_kib as f64 - base.rss_kib as f64) / n,
    ));
    hold(args, &format!("{label} echoed"));
    let t2 = Instant::now();
    for s in &conns {
        let _ = s.shutdown(Shutdown::Write);
    }
    drop(conns);
    let settled = settle(
        g,
        lgrs_before,
        Some(base.fds),
        Duration::from_millis(args.settle_ms),
    );
    let closed = Usage::now();
    line(format!(
        "scale {label} closed secs={:.3} settled={settled} connections={} link_groups={} {} {}",
        t2.elapsed().as_secs_f64(),
        g.connections(),
        g.link_groups(),
        base.kv("base_"),
        closed.kv(""),
    ));
    hold(args, &format!("{label} closed"));
    Ok(secs)
}

/// M connections in sequence: open, one byte each way, close; `scale <label> seq` lines
/// at every sample point.
pub fn sequential<N: Net>(
    net: &N,
    addr: SocketAddr,
    args: &ScaleArgs,
    g: &dyn Gauge,
    label: &str,
) -> Result<()> {
    let every = (args.seq / args.samples.max(1)).max(1);
    let t0 = Instant::now();
    let mut not_smc = 0usize;
    let smc = g.buffers_per_conn() > 0;
    for i in 0..args.seq {
        let s = net
            .connect(addr)
            .with_context(|| format!("sequential connection {}", i + 1))?;
        if smc && !s.mode().is_smc() {
            not_smc += 1;
        }
        ping(&s, i as u8).with_context(|| format!("sequential connection {}", i + 1))?;
        drop(s);
        let done = i + 1;
        if done == 1 || done % every == 0 || done == args.seq {
            // Closing is asynchronous: sample the steady state.
            settle(g, usize::MAX, None, Duration::from_millis(args.settle_ms));
            line(format!(
                "scale {label} seq done={done} secs={:.3} not_smc={not_smc} connections={} \
                 link_groups={} {}",
                t0.elapsed().as_secs_f64(),
                g.connections(),
                g.link_groups(),
                Usage::now().kv("")
            ));
            if done == 1 {
                hold(args, &format!("{label} seq first"));
            }
        }
    }
    hold(args, &format!("{label} seq last"));
    Ok(())
}

/// The client: SMC-R (`smc_net`, `g`) then kernel TCP (`tcp_net`).
pub fn run_client<S: Net, T: Net>(
    smc_net: &S,
    g: &dyn Gauge,
    tcp_net: &T,
    args: &ScaleArgs,
    ip: std::net::IpAddr,
) -> Result<()> {
    let smc_addr = SocketAddr::new(ip, args.port);
    let tcp_addr = SocketAddr::new(ip, args.port.wrapping_add(1));
    if args.conns > 0 {
        let mut s = 0.0;
        for r in 0..args.rounds.max(1) {
            if r > 0 {
                line(format!("scale smc round {}", r + 1));
            }
            let t = concurrent(smc_net, smc_addr, args, g, "smc")?;
            if r == 0 {
                s = t; // the ratio compares first rounds
            }
        }
        if !args.no_tcp {
            let t = concurrent(tcp_net, tcp_addr, args, &NoGauge, "tcp")?;
            line(format!(
                "scale ratio conns={} open_secs_smc={s:.3} open_secs_tcp={t:.3} smc_over_tcp={:.2}",
                args.conns,
                s / t.max(1e-9)
            ));
        }
    }
    if args.seq > 0 {
        sequential(smc_net, smc_addr, args, g, "smc")?;
    }
    if args.conns == 0 && args.seq == 0 {
        bail!("nothing to do: --conns 0 and --seq 0");
    }
    Ok(())
}

/// Kernel TCP connecting from `bind` as the SMC-R stack does with a local address
/// (bind to port 0 with IP_BIND_ADDRESS_NO_PORT, the port chosen by `connect()`): both
/// columns take the same port-allocation path in the kernel.
pub struct BoundTcp(pub Option<std::net::IpAddr>);

impl Net for BoundTcp {
    type Listener = std::net::TcpListener;
    fn label(&self) -> &'static str {
        "TCP"
    }
    fn bind(&self, addr: SocketAddr) -> io::Result<std::net::TcpListener> {
        std::net::TcpListener::bind(addr)
    }
    fn connect(&self, addr: SocketAddr) -> io::Result<std::net::TcpStream> {
        let Some(ip) = self.0 else {
            return std::net::TcpStream::connect(addr);
        };
        let sock = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        no_port(&sock);
        sock.bind(&SocketAddr::new(ip, 0).into())?;
        sock.connect(&addr.into())?;
        Ok(sock.into())
    }
}

/// A kernel TCP listener with the SMC-R listener's backlog (1024; `std` uses 128, and a
/// full accept queue drops SYNs, which then wait a second for their retransmission).
pub fn tcp_listener(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    sock.set_reuse_address(true)?;
    sock.bind(&addr.into())?;
    sock.listen(1024)?;
    Ok(sock.into())
}

/// IP_BIND_ADDRESS_NO_PORT (ip(7)); best effort, as in the runtime.
fn no_port(sock: &socket2::Socket) {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: setsockopt on a socket we own, with a pointer to a live c_int and its size.
    let _ = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}
