//! `smc rdma write-test`: RDMA WRITE (or, with `--verb send`, SEND) with verified data against
//! perftest's `ib_write_bw` (`ib_send_bw`) (perftest 4.5, whose out-of-band protocol
//! identifies itself as version "6.06"), either role.
//!
//! The out-of-band exchange over TCP (port 18515), as observed between two `ib_write_bw` in
//! the kernel-peer VMs; every step is "client writes a block, server answers with a block of
//! the same size":
//! 1. 16 bytes: the protocol version, "6.06" NUL-padded;
//! 2. 4 bytes: cycle buffer size (0x00001000), 3. 4 bytes: cache line size (0x00000040);
//! 4. 2 bytes: the MTU enumeration as text ("3" = 1024) and a NUL;
//! 5. three 108-byte key blocks ([`PerftestKey`]): QPN, PSN, RKey and VAddr of the buffer,
//!    GID; the QPs are connected before the third (a barrier); `ib_send_bw` adds a fourth
//!    once the server's receives are posted;
//! 6. the RDMA phase (the client WRITEs / SENDs `iters` times `size` bytes; WRITEs go to the
//!    server's VAddr);
//! 7. one key block (barrier after the run);
//! 8. `ib_write_bw` only: five 8-byte blocks, the client's results for the server to print
//!    (size, iterations, peak and average MB/s, message rate; big-endian), each answered by
//!    8 bytes, and one more key block;
//! 9. "done" NUL from the server, then from the client.
//!
//! Verification. Our WRITEs carry a fresh pattern per iteration. With `--readback` each
//! WRITE is read back with RDMA READ (client) or the client's source buffer is read after
//! its run (server) and compared byte for byte; this needs the peer's QP and region to allow
//! RDMA READ, which `ib_write_bw`'s do not (rxe answers NAK invalid request), so it is for
//! peers like ourselves. Against `ib_write_bw`, `--dump FILE` writes the last message —
//! what we sent last as client, what arrived as server — so that a capture can be compared
//! with it (`tests/system/helpers/write_payload.py`): the bytes on the wire, our memory and,
//! for the server role, rxe's data must be identical. As server we also require that the
//! client's WRITEs changed our (zeroed) buffer and touched nothing past `size` bytes.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use clap::{Args as ClapArgs, ValueEnum};
use smc_verbs::{AccessFlags, QpCap, RecvWr, SendFlags, SendOp, SendWr, WcOpcode};

use super::endpoint::{random_psn, wait_one, Endpoint, EndpointOpts};
use super::oob::{self, PerftestKey};
use super::pingpong::accept;
use super::{mtu_from_bytes, pattern, RdmaError};

/// Which perftest tool is the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Verb {
    /// `ib_write_bw`: RDMA WRITE.
    Write,
    /// `ib_send_bw`: SEND into the server's posted receives.
    Send,
}

/// `smc rdma write-test` options (ib_write_bw's that matter here).
#[derive(ClapArgs, Debug, Clone)]
pub struct Args {
    /// Server to connect to; without it, wait for a client.
    pub server: Option<String>,
    /// TCP port of the out-of-band exchange.
    #[arg(short = 'p', long, default_value_t = 18515)]
    pub port: u16,
    /// Bytes per WRITE (must match the peer's -s).
    #[arg(short = 's', long, default_value_t = 16384)]
    pub size: usize,
    /// Iterations.
    #[arg(short = 'n', long, default_value_t = 100)]
    pub iters: u32,
    /// Path MTU.
    #[arg(short = 'm', long, default_value_t = 1024)]
    pub mtu: usize,
    /// Client: local address to connect from (the RDMA device binds to it).
    #[arg(long)]
    pub local: Option<IpAddr>,
    /// Server: local address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: IpAddr,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// The peer's tool: ib_write_bw (write) or ib_send_bw (send).
    #[arg(long, value_enum, default_value_t = Verb::Write)]
    pub verb: Verb,
    /// Verify with RDMA READ (the peer must allow it; ib_write_bw does not).
    #[arg(long)]
    pub readback: bool,
    /// Write the last message (sent as client, received as server) to this file.
    #[arg(long)]
    pub dump: Option<std::path::PathBuf>,
}

const VERSION: &[u8; 4] = b"6.06";
const CYCLE_BUFFER: u32 = 4096;
const CACHE_LINE: u32 = 64;
const SEED: u64 = 0x5742_0000;
/// Receives kept posted by a `--verb send` server.
const RECV_DEPTH: u32 = 256;

fn local_ip(s: &TcpStream) -> Result<IpAddr, RdmaError> {
    let ip = s.local_addr()?.ip();
    Ok(match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    })
}

/// One "client writes, server answers" step; returns the peer's block.
fn step(s: &mut TcpStream, client: bool, mine: &[u8], what: &str) -> Result<Vec<u8>, RdmaError> {
    if client {
        oob::write_all(s, mine, what)?;
        oob::read_exact(s, mine.len(), what)
    } else {
        let theirs = oob::read_exact(s, mine.len(), what)?;
        oob::write_all(s, mine, what)?;
        Ok(theirs)
    }
}

/// Runs the command.
pub fn run(args: &Args) -> Result<(), RdmaError> {
    if args.size == 0 || args.iters == 0 {
        return Err(RdmaError::Usage("size and iters must be positive".into()));
    }
    if args.readback && args.verb == Verb::Send {
        return Err(RdmaError::Usage("--readback needs --verb write".into()));
    }
    let send = args.verb == Verb::Send;
    let mtu = mtu_from_bytes(args.mtu)?;
    let timeout = Duration::from_secs(args.timeout);
    let (mut s, client) = match &args.server {
        Some(host) => {
            let addr: SocketAddr =
                std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), args.port))?
                    .next()
                    .ok_or_else(|| RdmaError::Usage(format!("cannot resolve {host}")))?;
            (oob::connect_retry(addr, args.local, timeout)?, true)
        }
        None => {
            let l = TcpListener::bind(SocketAddr::new(args.bind, args.port))?;
            println!("  waiting for a client on {}", l.local_addr()?);
            (accept(&l, timeout)?, false)
        }
    };
    s.set_read_timeout(Some(timeout))?;
    let deadline = Instant::now() + timeout;
    let size = args.size;
    // [0, size): what we WRITE (client) or what is written into (server);
    // [size, 2·size): where RDMA READ results land.
    let ep = Endpoint::open(&EndpointOpts {
        local: local_ip(&s)?,
        buf_len: 2 * size,
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        cap: QpCap {
            max_send_wr: 16,
            max_recv_wr: RECV_DEPTH,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
    })?;

    let mut version = [0u8; 16];
    version[..4].copy_from_slice(VERSION);
    let v = step(&mut s, client, &version, "version")?;
    if !v.starts_with(VERSION) {
        let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
        tracing::warn!(peer = %String::from_utf8_lossy(&v[..end]), "perftest protocol version differs from 6.06");
    }
    let cb = step(&mut s, client, &CYCLE_BUFFER.to_be_bytes(), "cycle buffer")?;
    let cl = step(&mut s, client, &CACHE_LINE.to_be_bytes(), "cache line")?;
    let mtu_txt = [b'0' + mtu as u8, 0];
    let m = step(&mut s, client, &mtu_txt, "MTU")?;
    tracing::debug!(?cb, ?cl, ?m, "perftest parameters");
    if m[0] != mtu_txt[0] {
        return Err(RdmaError::Protocol(format!(
            "peer uses MTU enum {:?}, we use {}",
            m[0] as char, mtu_txt[0] as char
        )));
    }
    let me = PerftestKey {
        lid: 0,
        out_reads: 1,
        qpn: ep.qp.qpn(),
        psn: random_psn(),
        rkey: ep.mr.rkey(),
        vaddr: ep.mr.addr(),
        gid: ep.gid(),
        srqn: 0,
    };
    let key = me.encode();
    let peer = PerftestKey::parse(&step(&mut s, client, &key, "key block 1")?)?;
    let peer2 = PerftestKey::parse(&step(&mut s, client, &key, "key block 2")?)?;
    if peer2 != peer {
        return Err(RdmaError::Protocol("the peer's key blocks differ".into()));
    }
    println!(
        "  local:  QPN {:#06x} PSN {:#08x} RKey {:#010x} VAddr {:#018x} GID {}",
        me.qpn, me.psn, me.rkey, me.vaddr, me.gid
    );
    println!(
        "  remote: QPN {:#06x} PSN {:#08x} RKey {:#010x} VAddr {:#018x} GID {}",
        peer.qpn, peer.psn, peer.rkey, peer.vaddr, peer.gid
    );
    ep.connect_with(
        &peer.remote(),
        me.psn,
        mtu,
        peer.out_reads.clamp(1, 16) as u8,
    )?;
    let post_recv = || -> Result<(), RdmaError> {
        let sge = [ep.mr.sge(0, size as u32)];
        ep.qp.post_recv(&RecvWr {
            wr_id: 0,
            sg_list: &sge,
        })?;
        Ok(())
    };
    let mut posted = 0u32;
    if send && !client {
        // Every message lands at offset 0: after the last completion it holds the last one.
        while posted < args.iters.min(RECV_DEPTH) {
            post_recv()?;
            posted += 1;
        }
    }
    step(&mut s, client, &key, "key block 3 (connected)")?;
    if send {
        step(&mut s, client, &key, "key block 4 (receives posted)")?;
    }

    let post = |wr_id: u64, op: SendOp, off: usize| -> Result<(), RdmaError> {
        let sge = [ep.mr.sge(off, size as u32)];
        ep.qp.post_send(&SendWr {
            wr_id,
            op,
            sg_list: &sge,
            flags: SendFlags::SIGNALED,
        })?;
        Ok(())
    };
    let mut data = vec![0u8; size];
    let mut back = vec![0u8; size];
    let t0 = Instant::now();
    let verified = if client {
        for i in 0..args.iters {
            pattern::fill(SEED + i as u64, 0, &mut data);
            ep.buf.write(0, &data);
            let op = if send {
                SendOp::Send
            } else {
                SendOp::RdmaWrite {
                    remote_addr: peer.vaddr,
                    rkey: peer.rkey,
                }
            };
            post(2 * i as u64, op, 0)?;
            wait_one(&ep.send_cq, deadline, "WRITE/SEND completion")?;
            if !args.readback {
                continue;
            }
            post(
                2 * i as u64 + 1,
                SendOp::RdmaRead {
                    remote_addr: peer.vaddr,
                    rkey: peer.rkey,
                },
                size,
            )?;
            let wc = wait_one(&ep.send_cq, deadline, "RDMA READ (read-back) completion")?;
            if wc.opcode != WcOpcode::RdmaRead {
                return Err(RdmaError::Protocol(format!(
                    "read-back completed as {:?}",
                    wc.opcode
                )));
            }
            ep.buf.read(size, &mut back);
            if let Some(at) = data.iter().zip(&back).position(|(a, b)| a != b) {
                return Err(RdmaError::DataMismatch(format!(
                    "iteration {i}: the peer's buffer differs at byte {at} after our WRITE"
                )));
            }
        }
        args.iters as u64
    } else if send {
        for i in 0..args.iters {
            let wc = wait_one(&ep.recv_cq, deadline, "a SEND from the client")?;
            if wc.opcode != WcOpcode::Recv || wc.byte_len as usize != size {
                return Err(RdmaError::Protocol(format!(
                    "message {i}: {:?} of {} bytes, expected a SEND of {size}",
                    wc.opcode, wc.byte_len
                )));
            }
            if posted < args.iters {
                post_recv()?;
                posted += 1;
            }
        }
        args.iters as u64
    } else {
        // Our buffer is still all zero (RdmaBuffer starts zeroed): the client WRITEs now.
        0
    };
    let secs = t0.elapsed().as_secs_f64();
    step(&mut s, client, &key, "key block (run finished)")?;
    if !client {
        // The client's WRITEs are acknowledged before it enters the barrier above (and we
        // counted its SENDs), so our buffer holds its last message.
        ep.buf.read(0, &mut data);
        if data.iter().all(|&b| b == 0) {
            return Err(RdmaError::DataMismatch(
                "the client's messages left our buffer untouched".into(),
            ));
        }
        ep.buf.read(size, &mut back);
        if back.iter().any(|&b| b != 0) {
            return Err(RdmaError::DataMismatch(format!(
                "the client wrote past the {size} bytes of a message"
            )));
        }
        if args.readback {
            post(
                1,
                SendOp::RdmaRead {
                    remote_addr: peer.vaddr,
                    rkey: peer.rkey,
                },
                size,
            )?;
            wait_one(&ep.send_cq, deadline, "RDMA READ of the client's buffer")?;
            ep.buf.read(size, &mut back);
            if let Some(at) = data.iter().zip(&back).position(|(a, b)| a != b) {
                return Err(RdmaError::DataMismatch(format!(
                    "our buffer differs from the client's source buffer at byte {at}"
                )));
            }
        }
    }
    if let Some(path) = &args.dump {
        std::fs::write(path, &data)?;
    }
    // Results for the server to print (client) / answers (server): five 8-byte blocks.
    let mbps = (size as f64 * args.iters as f64) / secs.max(1e-9) / 1e6;
    let results: [u64; 5] = [
        size as u64,
        args.iters as u64,
        mbps.to_bits(),
        mbps.to_bits(),
        (args.iters as f64 / secs.max(1e-9) / 1e6).to_bits(),
    ];
    if !send {
        for (i, r) in results.iter().enumerate() {
            let mine = if client { *r } else { 0 };
            step(
                &mut s,
                client,
                &mine.to_be_bytes(),
                &format!("result block {i}"),
            )?;
        }
        step(&mut s, client, &key, "key block (after the results)")?;
    }
    let how = if args.readback {
        "read back with RDMA READ and verified"
    } else {
        "acknowledged"
    };
    if client {
        oob::read_exact(&mut s, 5, "done")?;
        oob::write_all(&mut s, b"done\0", "done")?;
        let what = if send { "SENDs" } else { "WRITEs" };
        println!("write-test: {verified} {what} of {size} bytes, each {how} ({mbps:.2} MB/s)");
    } else {
        oob::write_all(&mut s, b"done\0", "done")?;
        let _ = oob::read_exact(&mut s, 5, "done");
        println!(
            "write-test: received the client's {} of {size} bytes{}",
            if send { "SENDs" } else { "WRITEs" },
            if args.readback {
                "; the last one matches its source buffer read back with RDMA READ"
            } else {
                ""
            }
        );
    }
    Ok(())
}
