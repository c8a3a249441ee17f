//! `smc rdma bench`: RDMA WRITE throughput and SEND/RECV ping-pong latency between two
//! softroce devices on loopback (127.0.0.1 ↔ 127.0.0.2 by default, one process, one thread
//! per side), printed beside kernel TCP over loopback for the same message sizes, measured in
//! the same run, and beside the software iWARP RNIC (`smc-iwarp`, two endpoints over
//! loopback TCP, see [`super::iwbench`]) unless `--no-iwarp`. The targets of issue 3 (WRITE throughput ≥ 0.5× TCP at 64 KiB, ping-pong
//! latency ≤ 1.5× TCP) are reported as met or not met; nothing here asserts on speed.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;
use smc_verbs::{AccessFlags, QpCap, RecvWr, SendFlags, SendOp, SendWr, WorkCompletion};

use super::endpoint::{spin_one, wait_one, Endpoint, EndpointOpts};
use super::{mtu_from_bytes, RdmaError};

/// `smc rdma bench` options.
#[derive(ClapArgs, Debug, Clone)]
pub struct Args {
    /// Address of the writing / pinging device.
    #[arg(long, default_value = "127.0.0.1")]
    pub a: IpAddr,
    /// Address of the written / ponging device.
    #[arg(long, default_value = "127.0.0.2")]
    pub b: IpAddr,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 0.5)]
    pub duration: f64,
    /// Measurements per size and side, alternating softroce and TCP; the best of each is
    /// reported (the machine is shared, so single runs are noisy).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub trials: u32,
    /// RDMA WRITE / TCP message sizes in bytes.
    #[arg(long, value_delimiter = ',', default_values_t = [4096usize, 16384, 65536, 262144, 1048576])]
    pub sizes: Vec<usize>,
    /// Ping-pong message sizes in bytes.
    #[arg(long = "lat-sizes", value_delimiter = ',', default_values_t = [64usize, 4096])]
    pub lat_sizes: Vec<usize>,
    /// Path MTU of the RDMA connection.
    #[arg(long, default_value_t = 4096)]
    pub mtu: usize,
    /// Poll completion queues in a loop instead of sleeping on their event fd (both the
    /// softroce side and, for fairness, nothing changes on the TCP side, which blocks).
    #[arg(long = "busy-poll")]
    pub busy_poll: bool,
    /// Bytes of RDMA WRITEs kept outstanding.
    #[arg(long, default_value_t = 4 << 20)]
    pub window: usize,
    /// Leave out the software iWARP RNIC's column.
    #[arg(long = "no-iwarp")]
    pub no_iwarp: bool,
}

const MAX_WR: u32 = 128;

fn pair(args: &Args, len: usize) -> Result<(Endpoint, Endpoint), RdmaError> {
    let cap = QpCap {
        max_send_wr: MAX_WR,
        max_recv_wr: MAX_WR,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let a = Endpoint::open(&EndpointOpts {
        local: args.a,
        buf_len: len,
        access,
        cap,
    })?;
    let b = Endpoint::open(&EndpointOpts {
        local: args.b,
        buf_len: len,
        access,
        cap,
    })?;
    let mtu = mtu_from_bytes(args.mtu)?;
    let (pa, pb) = (0x10_0000, 0x20_0000);
    Endpoint::connect_pair(&a, &b, pa, pb, mtu)?;
    Ok((a, b))
}

/// Bytes per second of RDMA WRITEs of `size` from `a` into `b` for `dur`.
fn rdma_write(
    a: &Endpoint,
    b: &Endpoint,
    size: usize,
    dur: Duration,
    window: usize,
) -> Result<f64, RdmaError> {
    let depth = (window / size).clamp(2, MAX_WR as usize);
    let slots = a.buf.len() / size;
    let (rkey, raddr) = (b.mr.rkey(), b.mr.addr());
    let start = Instant::now();
    let stop = start + dur;
    let deadline = stop + Duration::from_secs(30);
    let (mut posted, mut done, mut bytes) = (0u64, 0u64, 0u64);
    loop {
        while Instant::now() < stop && posted - done < depth as u64 {
            let off = (posted as usize % slots) * size;
            let sge = [a.mr.sge(off, size as u32)];
            a.qp.post_send(&SendWr {
                wr_id: posted,
                op: SendOp::RdmaWrite {
                    remote_addr: raddr + off as u64,
                    rkey,
                },
                sg_list: &sge,
                flags: SendFlags::SIGNALED,
            })?;
            posted += 1;
        }
        if done == posted {
            break;
        }
        wait_one(&a.send_cq, deadline, "RDMA WRITE completion")?;
        done += 1;
        bytes += size as u64;
    }
    Ok(bytes as f64 / start.elapsed().as_secs_f64())
}

/// Bytes per second of `size`-byte writes over a loopback TCP connection for `dur`.
fn tcp_stream(size: usize, dur: Duration) -> Result<f64, RdmaError> {
    let l = TcpListener::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0))?;
    let addr = l.local_addr()?;
    let rx = thread::spawn(move || -> std::io::Result<u64> {
        let (mut s, _) = l.accept()?;
        let mut buf = vec![0u8; size];
        let mut n = 0u64;
        loop {
            match s.read(&mut buf)? {
                0 => return Ok(n),
                k => n += k as u64,
            }
        }
    });
    let mut s = TcpStream::connect(addr)?;
    let buf = vec![0x5au8; size];
    let start = Instant::now();
    let stop = start + dur;
    let mut sent = 0u64;
    while Instant::now() < stop {
        s.write_all(&buf)?;
        sent += size as u64;
    }
    s.shutdown(Shutdown::Write)?;
    let got = rx
        .join()
        .map_err(|_| RdmaError::Protocol("TCP receiver thread panicked".into()))??;
    if got != sent {
        return Err(RdmaError::DataMismatch(format!(
            "TCP received {got} of {sent} bytes"
        )));
    }
    Ok(got as f64 / start.elapsed().as_secs_f64())
}

/// Mean round-trip time of SEND/RECV ping-pongs of `size` bytes between `a` and `b`. Every
/// message is a SEND with immediate data: 0 while running, 1 on the last ping, after which
/// the ponging thread answers once more and returns `b`.
/// Receives are posted with room for `recv_len` bytes at offset `recv_len`, so that those
/// left posted after one size still fit the messages of the next.
fn rdma_pingpong(
    a: &Endpoint,
    b: Endpoint,
    size: usize,
    recv_len: usize,
    dur: Duration,
    busy: bool,
) -> Result<(Duration, Endpoint), RdmaError> {
    let wait = if busy { spin_one } else { wait_one };
    fn post_recv(ep: &Endpoint, size: usize) -> Result<(), RdmaError> {
        let sge = [ep.mr.sge(size, size as u32)];
        ep.qp.post_recv(&RecvWr {
            wr_id: 1,
            sg_list: &sge,
        })?;
        Ok(())
    }
    fn send(ep: &Endpoint, size: usize, imm: u32) -> Result<(), RdmaError> {
        let sge = [ep.mr.sge(0, size as u32)];
        ep.qp.post_send(&SendWr {
            wr_id: 2,
            op: SendOp::SendWithImm { imm },
            sg_list: &sge,
            flags: SendFlags::SIGNALED,
        })?;
        Ok(())
    }
    for _ in 0..4 {
        post_recv(a, recv_len)?;
        post_recv(&b, recv_len)?;
    }
    // A round ends when the answer arrives, as it does for TCP, whose write() does not wait
    // for the peer's ACK either: send completions (which need the RC ACK) are reaped on the
    // side, with at most MAX_UNREAPED outstanding.
    const MAX_UNREAPED: u32 = 8;
    fn reap(
        ep: &Endpoint,
        pending: &mut u32,
        deadline: Instant,
        wait_all: bool,
    ) -> Result<(), RdmaError> {
        let mut wcs = [WorkCompletion::default(); 8];
        loop {
            let n = ep.send_cq.poll(&mut wcs);
            for wc in &wcs[..n] {
                if !wc.status.is_ok() {
                    return Err(RdmaError::Completion {
                        what: "ping-pong send".into(),
                        status: wc.status,
                        wr_id: wc.wr_id,
                    });
                }
            }
            *pending -= n as u32;
            let must_wait = if wait_all {
                *pending > 0
            } else {
                *pending >= MAX_UNREAPED
            };
            if !must_wait {
                return Ok(());
            }
            if n == 0 {
                ep.send_cq
                    .wait(Some(deadline.saturating_duration_since(Instant::now())))?;
                if Instant::now() >= deadline {
                    return Err(RdmaError::Timeout("send completions".into()));
                }
            }
        }
    }
    let pong = thread::spawn(move || -> Result<Endpoint, RdmaError> {
        let mut pending = 0u32;
        loop {
            let deadline = Instant::now() + Duration::from_secs(30);
            let wc = wait(&b.recv_cq, deadline, "ping")?;
            post_recv(&b, recv_len)?;
            send(&b, size, 0)?;
            pending += 1;
            let last = wc.imm_data == Some(1);
            reap(&b, &mut pending, deadline, last)?;
            if last {
                return Ok(b);
            }
        }
    });
    let pending = std::cell::Cell::new(0u32);
    let round = |imm: u32| -> Result<(), RdmaError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        send(a, size, imm)?;
        wait(&a.recv_cq, deadline, "pong")?;
        post_recv(a, recv_len)?;
        let mut p = pending.get() + 1;
        reap(a, &mut p, deadline, imm == 1)?;
        pending.set(p);
        Ok(())
    };
    let measure = || -> Result<Duration, RdmaError> {
        for _ in 0..50 {
            round(0)?; // warm-up
        }
        let start = Instant::now();
        let mut n = 0u32;
        while start.elapsed() < dur {
            round(0)?;
            n += 1;
        }
        Ok(start.elapsed() / n.max(1))
    };
    let result = measure();
    // Stop the ponging thread (also after an error, so that it does not wait forever).
    let stopped = round(1);
    let b = pong
        .join()
        .map_err(|_| RdmaError::Protocol("pong thread panicked".into()))??;
    stopped?;
    Ok((result?, b))
}

/// Mean round-trip time of `size`-byte ping-pongs over loopback TCP (TCP_NODELAY).
fn tcp_pingpong(size: usize, dur: Duration) -> Result<Duration, RdmaError> {
    let l = TcpListener::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0))?;
    let addr = l.local_addr()?;
    let echo = thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = l.accept()?;
        s.set_nodelay(true)?;
        let mut buf = vec![0u8; size];
        loop {
            if let Err(e) = s.read_exact(&mut buf) {
                return if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    Ok(())
                } else {
                    Err(e)
                };
            }
            s.write_all(&buf)?;
        }
    });
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut buf = vec![0x33u8; size];
    for _ in 0..50 {
        s.write_all(&buf)?;
        s.read_exact(&mut buf)?;
    }
    let start = Instant::now();
    let stop = start + dur;
    let mut n = 0u32;
    while Instant::now() < stop {
        s.write_all(&buf)?;
        s.read_exact(&mut buf)?;
        n += 1;
    }
    let elapsed = start.elapsed();
    s.shutdown(Shutdown::Both)?;
    echo.join()
        .map_err(|_| RdmaError::Protocol("TCP echo thread panicked".into()))??;
    Ok(elapsed / n.max(1))
}

fn human(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1024 && n.is_multiple_of(1024) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

/// Runs the benchmark and prints the tables.
pub fn run(args: &Args) -> Result<(), RdmaError> {
    let dur = Duration::from_secs_f64(args.duration);
    let max = args
        .sizes
        .iter()
        .chain(&args.lat_sizes)
        .copied()
        .max()
        .unwrap_or(4096);
    if args.sizes.contains(&0) || args.lat_sizes.contains(&0) {
        return Err(RdmaError::Usage("sizes must be positive".into()));
    }
    // Room for `window` bytes of distinct source/target slots of the largest size.
    let len = (args.window.max(2 * max)).next_multiple_of(max);
    let (a, mut b) = pair(args, len)?;
    let mut iw = if args.no_iwarp {
        None
    } else {
        Some(super::iwbench::pair(args.a, args.b, len.max(2 * max))?)
    };
    let iw_col = |x: Option<f64>| x.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
    println!(
        "softroce {} ({}) -> {} ({}), path MTU {}; kernel TCP over 127.0.0.1; best of {} x {:.1} s, alternating",
        a.device.name(),
        args.a,
        b.device.name(),
        args.b,
        args.mtu,
        args.trials,
        args.duration
    );
    println!();
    println!("RDMA WRITE throughput");
    println!(
        "{:>9}  {:>14}  {:>14}  {:>7}  {:>12}  {:>7}",
        "size", "softroce MB/s", "TCP MB/s", "ratio", "iWARP MB/s", "ratio"
    );
    let mut at64k = None;
    for &size in &args.sizes {
        let (mut r, mut t, mut w) = (0f64, 0f64, None::<f64>);
        for _ in 0..args.trials {
            r = r.max(rdma_write(&a, &b, size, dur, args.window)?);
            t = t.max(tcp_stream(size, dur)?);
            if let Some((ia, ib)) = &iw {
                let x = super::iwbench::write_bw(ia, ib, size, dur, args.window)?;
                w = Some(w.map_or(x, |y| y.max(x)));
            }
        }
        let ratio = r / t;
        if size == 65536 {
            at64k = Some(ratio);
        }
        println!(
            "{:>9}  {:>14.1}  {:>14.1}  {:>6.2}x  {:>12}  {:>7}",
            human(size),
            r / 1e6,
            t / 1e6,
            ratio,
            iw_col(w.map(|x| x / 1e6)),
            w.map_or("-".into(), |x| format!("{:.2}x", x / t))
        );
    }
    println!();
    println!("SEND/RECV ping-pong round trip");
    println!(
        "{:>9}  {:>14}  {:>14}  {:>7}  {:>12}  {:>7}",
        "size", "softroce us", "TCP us", "ratio", "iWARP us", "ratio"
    );
    let mut lat = Vec::new();
    let recv_len = args.lat_sizes.iter().copied().max().unwrap_or(64);
    for &size in &args.lat_sizes {
        let (mut r, mut t, mut w) = (Duration::MAX, Duration::MAX, None::<Duration>);
        for _ in 0..args.trials {
            let (x, back) = rdma_pingpong(&a, b, size, recv_len, dur, args.busy_poll)?;
            b = back;
            r = r.min(x);
            t = t.min(tcp_pingpong(size, dur)?);
            if let Some((ia, ib)) = iw.take() {
                let (x, back) = super::iwbench::pingpong(&ia, ib, size, recv_len, dur)?;
                iw = Some((ia, back));
                w = Some(w.map_or(x, |y| y.min(x)));
            }
        }
        let ratio = r.as_secs_f64() / t.as_secs_f64();
        lat.push(ratio);
        println!(
            "{:>9}  {:>14.1}  {:>14.1}  {:>6.2}x  {:>12}  {:>7}",
            human(size),
            r.as_secs_f64() * 1e6,
            t.as_secs_f64() * 1e6,
            ratio,
            iw_col(w.map(|x| x.as_secs_f64() * 1e6)),
            w.map_or("-".into(), |x| format!(
                "{:.2}x",
                x.as_secs_f64() / t.as_secs_f64()
            ))
        );
    }
    println!();
    match at64k {
        Some(x) => println!(
            "target: RDMA WRITE throughput >= 0.5x TCP at 64 KiB: {:.2}x, {}",
            x,
            verdict(x >= 0.5)
        ),
        None => println!("target: RDMA WRITE throughput >= 0.5x TCP at 64 KiB: not measured (64 KiB not in --sizes)"),
    }
    if let Some(worst) = lat.iter().copied().reduce(f64::max) {
        println!(
            "target: ping-pong latency <= 1.5x TCP: worst {:.2}x, {}",
            worst,
            verdict(worst <= 1.5)
        );
    }
    Ok(())
}
