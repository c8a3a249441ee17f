//! `smc rdma pingpong`: SEND/RECV ping-pong that pairs with rdma-core's `ibv_rc_pingpong`
//! (either role, same options and out-of-band exchange, see [`super::oob`]), and verifies
//! every byte that comes back.
//!
//! ibv_rc_pingpong sends from and receives into one buffer, so whatever it sends after the
//! first message is what it received last. Its first message is its initial buffer: 0x7b
//! bytes, with the first byte of every 4096-byte page set to 0 under `-c`, which also makes
//! it check that those bytes are 0 in every message it receives. Our messages therefore keep
//! byte 0 of every page 0 and fill the rest with the harness pattern ([`super::pattern`]).
//!
//! Verification: as client we send a fresh pattern each iteration and the reply must equal
//! it (the server echoes its buffer). As server we check the first message (ibv_rc_pingpong's
//! initial buffer or our client's pattern 0), and then with `--reply echo` (default) each
//! message must be our client's pattern for that iteration or a repetition of the previous
//! one; with `--reply fresh` we answer with a new pattern and the client's next message must
//! equal it (true for ibv_rc_pingpong, whose buffer holds our reply).

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use clap::{Args as ClapArgs, ValueEnum};
use smc_verbs::{AccessFlags, Mtu, QpCap, RecvWr, SendFlags, SendOp, SendWr, WcOpcode};

use super::endpoint::{random_psn, wait_one, Endpoint, EndpointOpts};
use super::oob::{self, PpDest, PP_DONE, PP_MSG_LEN};
use super::{mtu_from_bytes, pattern, RdmaError};

/// rc_pingpong's page size for `-c` (the first byte of every page is 0).
const PAGE: usize = 4096;
/// rc_pingpong's initial buffer byte.
const RC_INITIAL: u8 = 0x7b;
/// Seeds of our client's and our server's messages (distinct streams).
const CLIENT_SEED: u64 = 0x5050_0000;
const SERVER_SEED: u64 = 0x5353_0000;

/// How the server answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Reply {
    /// Send back what was received (what ibv_rc_pingpong does).
    Echo,
    /// Send a new pattern; the peer must mirror it back (ibv_rc_pingpong as client does).
    Fresh,
}

/// `smc rdma pingpong` options (the ibv_rc_pingpong ones that matter on RoCE).
#[derive(ClapArgs, Debug, Clone)]
pub struct Args {
    /// Server to connect to; without it, wait for a client.
    pub server: Option<String>,
    /// TCP port of the out-of-band exchange.
    #[arg(short = 'p', long, default_value_t = 18515)]
    pub port: u16,
    /// Message size in bytes.
    #[arg(short = 's', long, default_value_t = 4096)]
    pub size: usize,
    /// Number of exchanges.
    #[arg(short = 'n', long, default_value_t = 1000)]
    pub iters: u32,
    /// Path MTU (256, 512, 1024, 2048, 4096).
    #[arg(short = 'm', long, default_value_t = 1024)]
    pub mtu: usize,
    /// Receives kept posted.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    pub rx_depth: u32,
    /// Client: local address to connect from (the RDMA device binds to it).
    #[arg(long)]
    pub local: Option<IpAddr>,
    /// Server: local address to listen on (the RDMA device binds to the address the client
    /// connected to).
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: IpAddr,
    /// Server: how to answer (see the module documentation).
    #[arg(long, value_enum, default_value_t = Reply::Echo)]
    pub reply: Reply,
    /// Give up after this many seconds (connect, exchange and every completion).
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
}

/// Message `i` of a stream: pattern bytes, byte 0 of every page 0 (rc_pingpong `-c`).
fn message(seed: u64, i: u32, out: &mut [u8]) {
    pattern::fill(seed + i as u64, 0, out);
    for b in out.iter_mut().step_by(PAGE) {
        *b = 0;
    }
}

fn is_rc_initial(m: &[u8]) -> bool {
    m.iter()
        .enumerate()
        .all(|(i, &b)| b == RC_INITIAL || (i % PAGE == 0 && b == 0))
}

/// Result of a run, printed by [`run`].
pub struct Outcome {
    /// Messages verified.
    pub verified: u64,
    /// Elapsed time of the ping-pong phase.
    pub elapsed: Duration,
}

/// Runs the command.
pub fn run(args: &Args) -> Result<(), RdmaError> {
    if args.size == 0 || args.iters == 0 {
        return Err(RdmaError::Usage("size and iters must be positive".into()));
    }
    let mtu = mtu_from_bytes(args.mtu)?;
    let timeout = Duration::from_secs(args.timeout);
    let out = match &args.server {
        Some(host) => {
            let addr = resolve(host, args.port)?;
            let stream = oob::connect_retry(addr, args.local, timeout)?;
            client(args, mtu, stream, timeout)?
        }
        None => {
            let listener = TcpListener::bind(SocketAddr::new(args.bind, args.port))?;
            println!("  waiting for a client on {}", listener.local_addr()?);
            let stream = accept(&listener, timeout)?;
            server(args, mtu, stream, timeout)?
        }
    };
    let usec = out.elapsed.as_secs_f64() * 1e6;
    let bytes = args.size as u64 * args.iters as u64 * 2;
    println!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        args.iters,
        usec / 1e6,
        usec / args.iters as f64
    );
    println!(
        "data verified: {} messages of {} bytes",
        out.verified, args.size
    );
    Ok(())
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr, RdmaError> {
    (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| RdmaError::Usage(format!("cannot resolve {host}")))
}

/// Accepts one connection before `timeout`.
pub fn accept(listener: &TcpListener, timeout: Duration) -> Result<TcpStream, RdmaError> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(RdmaError::Timeout("waiting for a client".into()));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn open(args: &Args, local: IpAddr) -> Result<Endpoint, RdmaError> {
    // Send area [0, size), receive area [size, 2·size): we keep what we sent to compare.
    Endpoint::open(&EndpointOpts {
        local,
        buf_len: 2 * args.size,
        access: AccessFlags::LOCAL_WRITE,
        cap: QpCap {
            max_send_wr: 16,
            max_recv_wr: args.rx_depth.max(2),
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
    })
}

fn post_recvs(ep: &Endpoint, size: usize, n: u32) -> Result<(), RdmaError> {
    let sge = [ep.mr.sge(size, size as u32)];
    for _ in 0..n {
        ep.qp.post_recv(&RecvWr {
            wr_id: 1,
            sg_list: &sge,
        })?;
    }
    Ok(())
}

fn post_send(ep: &Endpoint, size: usize) -> Result<(), RdmaError> {
    let sge = [ep.mr.sge(0, size as u32)];
    ep.qp.post_send(&SendWr {
        wr_id: 2,
        op: SendOp::Send,
        sg_list: &sge,
        flags: SendFlags::SIGNALED,
    })?;
    Ok(())
}

fn local_ip(s: &TcpStream) -> Result<IpAddr, RdmaError> {
    let ip = s.local_addr()?.ip();
    Ok(match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    })
}

fn print_dest(which: &str, d: &PpDest) {
    println!(
        "  {which} address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        d.lid, d.qpn, d.psn, d.gid
    );
}

/// Receives one message into the receive area; checks its length and reposts the receive.
fn recv_one(
    ep: &Endpoint,
    size: usize,
    deadline: Instant,
    got: &mut [u8],
) -> Result<(), RdmaError> {
    let wc = wait_one(&ep.recv_cq, deadline, "receive completion")?;
    if wc.opcode != WcOpcode::Recv || wc.byte_len as usize != size {
        return Err(RdmaError::Protocol(format!(
            "receive completion {:?} of {} bytes, expected a SEND of {size}",
            wc.opcode, wc.byte_len
        )));
    }
    ep.buf.read(size, got);
    post_recvs(ep, size, 1)
}

fn client(
    args: &Args,
    mtu: Mtu,
    mut s: TcpStream,
    timeout: Duration,
) -> Result<Outcome, RdmaError> {
    let size = args.size;
    let ep = open(args, local_ip(&s)?)?;
    post_recvs(&ep, size, args.rx_depth.max(2))?;
    let me = PpDest {
        lid: 0,
        qpn: ep.qp.qpn(),
        psn: random_psn(),
        gid: ep.gid(),
    };
    print_dest("local ", &me);
    oob::write_all(&mut s, &me.encode(), "local address")?;
    let peer = PpDest::parse(&oob::read_exact(&mut s, PP_MSG_LEN, "remote address")?)?;
    oob::write_all(&mut s, PP_DONE, "done")?;
    print_dest("remote", &peer);
    ep.connect(&peer.remote(), me.psn, mtu)?;
    let mut sent = vec![0u8; size];
    let mut got = vec![0u8; size];
    let start = Instant::now();
    let deadline = start + timeout;
    for i in 0..args.iters {
        message(CLIENT_SEED, i, &mut sent);
        ep.buf.write(0, &sent);
        post_send(&ep, size)?;
        wait_one(&ep.send_cq, deadline, "send completion")?;
        recv_one(&ep, size, deadline, &mut got)?;
        if let Some(at) = first_diff(&sent, &got) {
            return Err(RdmaError::DataMismatch(format!(
                "reply {i} differs from what we sent at byte {at}: {:#04x} instead of {:#04x}",
                got[at], sent[at]
            )));
        }
    }
    Ok(Outcome {
        verified: args.iters as u64,
        elapsed: start.elapsed(),
    })
}

fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

fn server(
    args: &Args,
    mtu: Mtu,
    mut s: TcpStream,
    timeout: Duration,
) -> Result<Outcome, RdmaError> {
    let size = args.size;
    let ep = open(args, local_ip(&s)?)?;
    post_recvs(&ep, size, args.rx_depth.max(2))?;
    let peer = PpDest::parse(&oob::read_exact(&mut s, PP_MSG_LEN, "remote address")?)?;
    let me = PpDest {
        lid: 0,
        qpn: ep.qp.qpn(),
        psn: random_psn(),
        gid: ep.gid(),
    };
    print_dest("local ", &me);
    print_dest("remote", &peer);
    // As rc_pingpong: the QP is ready before the client learns our address.
    ep.connect(&peer.remote(), me.psn, mtu)?;
    oob::write_all(&mut s, &me.encode(), "local address")?;
    // The client's "done"; a client that closes without it is tolerated, as rc_pingpong does.
    let mut done = [0u8; 5];
    let _ = std::io::Read::read(&mut s, &mut done);

    let mut got = vec![0u8; size];
    let mut prev = vec![0u8; size];
    let mut reply = vec![0u8; size];
    let mut expect = vec![0u8; size];
    let start = Instant::now();
    let deadline = start + timeout;
    for i in 0..args.iters {
        recv_one(&ep, size, deadline, &mut got)?;
        message(CLIENT_SEED, i, &mut expect);
        let ok = match (i, args.reply) {
            (0, _) => is_rc_initial(&got) || got == expect,
            (_, Reply::Echo) => got == expect || got == prev,
            (_, Reply::Fresh) => got == reply,
        };
        if !ok {
            let what = match (i, args.reply) {
                (0, _) => "ibv_rc_pingpong's initial buffer or our client's first message",
                (_, Reply::Echo) => "our client's pattern or a repetition of the last message",
                (_, Reply::Fresh) => "our last reply mirrored back",
            };
            return Err(RdmaError::DataMismatch(format!(
                "message {i} is not {what} (first bytes {:02x?})",
                &got[..got.len().min(16)]
            )));
        }
        match args.reply {
            Reply::Echo => reply.copy_from_slice(&got),
            Reply::Fresh => message(SERVER_SEED, i, &mut reply),
        }
        prev.copy_from_slice(&got);
        ep.buf.write(0, &reply);
        post_send(&ep, size)?;
        wait_one(&ep.send_cq, deadline, "send completion")?;
    }
    Ok(Outcome {
        verified: args.iters as u64,
        elapsed: start.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_keep_page_starts_zero_and_differ_per_iteration() {
        let mut a = vec![0u8; 3 * PAGE + 5];
        let mut b = vec![0u8; 3 * PAGE + 5];
        message(CLIENT_SEED, 0, &mut a);
        message(CLIENT_SEED, 1, &mut b);
        assert_ne!(a, b);
        for p in 0..4 {
            assert_eq!(a[p * PAGE], 0);
        }
        assert!(!is_rc_initial(&a));
        let mut init = vec![RC_INITIAL; 2 * PAGE];
        assert!(is_rc_initial(&init));
        init[PAGE] = 0;
        assert!(is_rc_initial(&init));
        init[PAGE + 1] = 0;
        assert!(!is_rc_initial(&init));
    }
}
