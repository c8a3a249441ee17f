//! `smc rdma perftest --provider iwarp --verb send|write|read`: perftest's `ib_send_bw`,
//! `ib_write_bw` and `ib_read_bw` in their rdma_cm mode (`-R`, the only mode perftest has on
//! iWARP), either role, over the software iWARP RNIC; wire- and protocol-compatible with
//! perftest 4.5 (protocol version "6.06") on Linux siw.
//!
//! What perftest does in this mode (perftest `perftest_communication.c` and the `*_bw.c`
//! mains; confirmed by siw↔siw captures in the kernel-peer VM):
//!
//! 1. **Communication connection.** The client makes an rdma_cm RC connection to the
//!    server's port (here an MPA connection, IRD/ORD 0/0). Both sides keep one 56-byte
//!    receive posted on it. Every exchange is "the client SENDs a message, the server
//!    answers with one of the same size", the server reading before it writes:
//!    the version `"6.06"` NUL-padded to 16 bytes; the cycle buffer size (4 bytes,
//!    big-endian, 4096) and the cache line size (4, 64), each side then using the larger;
//!    the path MTU enumeration as text with its NUL (2 bytes); then 56-byte
//!    [`PingpongDest`] blocks (every field big-endian).
//! 2. **Data connection.** After the first block (all zero: the QP does not exist yet) the
//!    client connects a second time to the same port, the data connection (IRD/ORD 0/0 for
//!    send and write, both perftest's `out_reads` — the device's `max_qp_rd_atom`, 128 on
//!    siw — for read); a second all-zero block follows.
//! 3. **Keys.** Blocks C, D, E (and F for send, after the server posted its receives) carry
//!    each side's QPN, PSN, RKey and VAddr: of the data buffer for write and read; for send
//!    on iWARP, of a 4-byte *credit* word (below).
//! 4. **Data.** write: the client RDMA WRITEs `-n` messages of `-s` bytes into the server's
//!    buffer; read: it RDMA READs them from there; send: it SENDs them into the server's
//!    posted receives. Remote addresses advance by the message size rounded up to the cache
//!    line and wrap at the cycle buffer when a message is at most half of it, else every
//!    message uses the buffer's start.
//! 5. **Credits (send).** iWARP has no receiver-not-ready retry, so perftest's server
//!    RDMA WRITEs the number of messages received so far (a 4-byte word in host order,
//!    little-endian on x86) to the client's credit word whenever that count modulo its
//!    receive depth is a multiple of a third of the depth; the client keeps fewer than
//!    "receive depth" messages beyond the last credit. The depth is `min(512, -n)`, made even.
//! 6. **End.** write and read: one block, the client's results (five 8-byte big-endian
//!    fields: size, iterations, peak and average MB/s, message rate; the server answers with
//!    five blocks of its own, unused), one more block. send: one block.
//!
//! Checks. perftest checks no data, so ours are: as client we send a pattern (message `k`
//! is stream `SEED + k` of the harness pattern, [`super::pattern`]); READ results must be
//! the same every time the same remote bytes are read; as server a written buffer must have
//! been written and nothing past the cycle buffer may be touched, a read buffer must still
//! hold its pattern. `--dump FILE` writes what crossed the wire from our side's point of
//! view (see [`Args::dump`]), so that a capture can be compared with it
//! (`tests/system/helpers/perftest_cm_check.py`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args as ClapArgs, ValueEnum};
use smc_iwarp::cm::{CmError, ConnParams, Connection, Listener};
use smc_verbs::{
    AccessFlags, Cq, Device, InitAttr, Mr, Pd, Qp, QpCap, QpInitAttr, QpState, RdmaBuffer, RecvWr,
    SendFlags, SendOp, SendWr, WcOpcode, WorkCompletion,
};

use super::rping::{describe, wait, MpaArgs, Provider};
use super::{pattern, RdmaError};

mod comm;
mod session;
use comm::*;
use session::*;

/// Which perftest tool is the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Verb {
    /// `ib_send_bw -R`: SENDs into the server's posted receives, credits back.
    Send,
    /// `ib_write_bw -R`: RDMA WRITEs into the server's buffer.
    Write,
    /// `ib_read_bw -R`: RDMA READs from the server's buffer.
    Read,
}

/// `smc rdma perftest` options (perftest's letters where they exist).
#[derive(ClapArgs, Debug, Clone)]
pub struct Args {
    /// The RDMA provider (perftest's rdma_cm mode needs a connection manager: iWARP).
    #[arg(long, value_enum, default_value_t = Provider::Iwarp)]
    pub provider: Provider,
    /// The test: ib_send_bw (send), ib_write_bw (write) or ib_read_bw (read), all with -R.
    #[arg(long, value_enum)]
    pub verb: Verb,
    /// Server to connect to; without it, wait for a client.
    pub server: Option<String>,
    /// TCP port of both connections (perftest -p).
    #[arg(short = 'p', long, default_value_t = 18515)]
    pub port: u16,
    /// Bytes per message (perftest -s; both sides must agree).
    #[arg(short = 's', long, default_value_t = 65536)]
    pub size: usize,
    /// Messages (perftest -n; both sides must agree).
    #[arg(short = 'n', long, default_value_t = 1000)]
    pub iters: u32,
    /// Client: local address to connect from.
    #[arg(long)]
    pub local: Option<IpAddr>,
    /// Server: local address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: IpAddr,
    /// Give up after this many seconds without progress (a write or read server sees no
    /// progress while the client runs: this must cover the whole run).
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Write the data as our side saw it: send or write client, every message sent in
    /// order; send server, every message received in order; write server, our buffer's
    /// first cycle-buffer bytes after the run; read server, those bytes (what the client
    /// read); read client, the server's buffer as read (the bytes at each remote offset).
    #[arg(long)]
    pub dump: Option<PathBuf>,
    /// MPA/RFC 6581 parameters of both connections (IRD/ORD only for the data connection;
    /// the communication connection uses 0/0 as perftest does).
    #[command(flatten)]
    pub mpa: MpaArgs,
}

/// perftest's protocol version string ("6.06" in perftest 4.5).
pub const VERSION: &[u8; 4] = b"6.06";
/// Length of a `struct pingpong_dest` on the wire.
pub const DEST_LEN: usize = 56;
/// Our cycle buffer (perftest: the page size).
pub const CYCLE_BUFFER: u32 = 4096;
/// Our cache line size (perftest's default).
pub const CACHE_LINE: u32 = 64;
/// perftest's default and largest receive depth for send tests (`DEF_RX_SEND`).
pub const MAX_RX_DEPTH: u32 = 512;
/// perftest's send queue depth for bandwidth tests (`DEF_TX_BW`).
pub const MAX_TX_DEPTH: u32 = 128;
/// Seed of our data pattern: message `k` is stream `SEED + k`; a read server's buffer is
/// stream `SEED`.
pub const SEED: u64 = 0x5046_0000;
/// The most memory a run may use for data buffers.
const MAX_BUFFERS: usize = 256 << 20;
/// Credit words our send server keeps in flight (one source word each).
const CREDIT_SLOTS: usize = 64;

/// perftest's `struct pingpong_dest` as rdma_cm mode sends it: every field big-endian
/// (`htobe32`/`htobe64`), 4 bytes of padding after the RKey (not initialised by perftest;
/// sent as zero by us, ignored on receipt).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PingpongDest {
    /// LID (0 on iWARP).
    pub lid: u32,
    /// Outstanding RDMA Reads the sender accepts.
    pub out_reads: u32,
    /// QP number.
    pub qpn: u32,
    /// First PSN (meaningless on iWARP, random as perftest's).
    pub psn: u32,
    /// Remote key of the buffer below.
    pub rkey: u32,
    /// Address of the sender's data buffer (send on iWARP: of its credit word).
    pub vaddr: u64,
    /// Port GID (siw: its MAC, zero-padded).
    pub gid: [u8; 16],
    /// SRQ number (0).
    pub srqn: u32,
    /// GID index.
    pub gid_index: u32,
}

impl PingpongDest {
    /// The 56 bytes.
    pub fn encode(&self) -> [u8; DEST_LEN] {
        let mut b = [0u8; DEST_LEN];
        b[0..4].copy_from_slice(&self.lid.to_be_bytes());
        b[4..8].copy_from_slice(&self.out_reads.to_be_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        // [20, 24): alignment padding of the C struct before the 64-bit vaddr.
        b[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        b[32..48].copy_from_slice(&self.gid);
        b[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        b[52..56].copy_from_slice(&self.gid_index.to_be_bytes());
        b
    }

    /// Parses a block; it must be exactly [`DEST_LEN`] bytes.
    pub fn parse(b: &[u8]) -> Result<PingpongDest, RdmaError> {
        if b.len() != DEST_LEN {
            return Err(RdmaError::Protocol(format!(
                "a pingpong_dest block is {DEST_LEN} bytes, got {}",
                b.len()
            )));
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut vaddr = [0u8; 8];
        vaddr.copy_from_slice(&b[24..32]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[32..48]);
        Ok(PingpongDest {
            lid: u32_at(0),
            out_reads: u32_at(4),
            qpn: u32_at(8),
            psn: u32_at(12),
            rkey: u32_at(16),
            vaddr: u64::from_be_bytes(vaddr),
            gid,
            srqn: u32_at(48),
            gid_index: u32_at(52),
        })
    }

    /// The fields the peer's data phase depends on (the padding and PSN aside).
    fn same_keys(&self, o: &PingpongDest) -> bool {
        (self.qpn, self.rkey, self.vaddr) == (o.qpn, o.rkey, o.vaddr)
    }
}

/// The client's results as perftest's `xchg_bw_reports` sends them to a version ≥ 5.33
/// peer: five 8-byte big-endian fields, MB meaning 2^20 bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BwReport {
    /// Message size.
    pub size: u64,
    /// Messages.
    pub iters: u64,
    /// Peak MB/s.
    pub bw_peak: f64,
    /// Average MB/s.
    pub bw_avg: f64,
    /// Millions of messages per second.
    pub msg_rate: f64,
}

impl BwReport {
    /// The five blocks, in exchange order.
    pub fn blocks(&self) -> [[u8; 8]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.bw_peak.to_bits().to_be_bytes(),
            self.bw_avg.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }

    /// From the five blocks.
    pub fn from_blocks(b: &[[u8; 8]; 5]) -> BwReport {
        BwReport {
            size: u64::from_be_bytes(b[0]),
            iters: u64::from_be_bytes(b[1]),
            bw_peak: f64::from_bits(u64::from_be_bytes(b[2])),
            bw_avg: f64::from_bits(u64::from_be_bytes(b[3])),
            msg_rate: f64::from_bits(u64::from_be_bytes(b[4])),
        }
    }
}

/// perftest's receive depth for a send test of `iters` messages: `min(512, iters)`, plus
/// one when odd (perftest's work-around for odd depths).
pub fn rx_depth(iters: u32) -> u32 {
    let d = iters.clamp(1, MAX_RX_DEPTH);
    d + (d % 2)
}

/// Whether perftest's send server writes a credit after its `rcnt`-th message: when
/// `(rcnt mod depth) mod (depth / 3) == 0`.
pub fn credit_due(rcnt: u32, depth: u32) -> bool {
    let every = (depth / 3).max(1);
    (rcnt % depth).is_multiple_of(every)
}

/// perftest's address step: the size rounded up to the cache line, at least one line.
pub fn addr_step(size: usize, cache_line: usize) -> usize {
    if size > cache_line {
        size.div_ceil(cache_line) * cache_line
    } else {
        cache_line
    }
}

/// Offset of message `k` in the peer's buffer (perftest `increase_rem_addr`): messages of
/// at most half the cycle buffer walk through it, larger ones all start at 0.
pub fn remote_offset(k: u64, size: usize, cycle: usize, cache_line: usize) -> usize {
    if size > cycle / 2 {
        return 0;
    }
    let step = addr_step(size, cache_line);
    let slots = (cycle / step).max(1) as u64;
    (k % slots) as usize * step
}

/// The part of a buffer the peer's messages may touch: the cycle buffer, or one step.
pub fn region_len(size: usize, cycle: usize, cache_line: usize) -> usize {
    cycle.max(addr_step(size, cache_line))
}

/// Runs `smc rdma perftest`.
pub fn run(a: &Args) -> Result<(), RdmaError> {
    if a.size == 0 || a.iters == 0 {
        return Err(RdmaError::Usage("-s and -n must be positive".into()));
    }
    let timeout = Duration::from_secs(a.timeout.max(1));
    let base = a.mpa.params(timeout, (0, 0))?;
    // The communication connection: IRD/ORD 0/0, as perftest's SEND-only rdma_cm QP.
    let mut comm_p = base.clone();
    comm_p.read.ird = 0;
    comm_p.read.ord = 0;
    // The data connection: perftest asks for out_reads in both directions for read.
    let reads = if a.verb == Verb::Read { 128 } else { 0 };
    let data_p = a.mpa.params(timeout, (reads, reads))?;
    match &a.server {
        Some(host) => {
            let addr: SocketAddr = (host.as_str(), a.port)
                .to_socket_addrs()?
                .next()
                .ok_or_else(|| RdmaError::Usage(format!("cannot resolve {host}")))?;
            client(a, addr, &comm_p, &data_p, timeout)
        }
        None => server(a, &comm_p, &data_p, timeout),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn pingpong_dest_matches_siw_capture() {
        // Block C of ib_write_bw -R's client on siw (kernel-peer VM, perftest 4.5-0.17):
        // out_reads 1, QPN 2, PSN 0x381098, RKey 0x3452b000, its MAC as GID; the padding
        // bytes are whatever perftest's stack held (here 0).
        let b = hex(concat!(
            "00000000000000010000000200381098",
            "3452b000000000000000561127b8a000",
            "52540044000200000000000000000000",
            "0000000000000000"
        ));
        let d = PingpongDest::parse(&b).unwrap();
        assert_eq!((d.lid, d.out_reads, d.qpn, d.psn), (0, 1, 2, 0x0038_1098));
        assert_eq!(d.rkey, 0x3452_b000);
        assert_eq!(d.vaddr, 0x5611_27b8_a000);
        assert_eq!(&d.gid[..6], &[0x52, 0x54, 0x00, 0x44, 0x00, 0x02]);
        assert_eq!(d.encode().to_vec(), b);
        // ib_read_bw's: out_reads 128; padding bytes not zero are ignored.
        let mut r = hex(concat!(
            "00000000000000800000000200808efc",
            "43fc2e00ae550000000055ae60f5b000",
            "52540044000200000000000000000000",
            "0000000000000000"
        ));
        let d = PingpongDest::parse(&r).unwrap();
        assert_eq!(
            (d.out_reads, d.rkey, d.vaddr),
            (128, 0x43fc_2e00, 0x55ae_60f5_b000)
        );
        r[20..24].fill(0);
        assert_eq!(d.encode().to_vec(), r);
        assert!(PingpongDest::parse(&r[..55]).is_err());
        assert!(PingpongDest::parse(&[0u8; 57]).is_err());
    }

    #[test]
    fn bw_report_matches_siw_capture() {
        // ib_write_bw -R's client results in the same capture: 16384 bytes, 20 messages,
        // peak 84.40 MB/s (perftest printed "84.40").
        let blocks = [
            hex("0000000000004000"),
            hex("0000000000000014"),
            hex("4055196b95b11383"),
            hex("40220998aea385a2"),
            hex("3f42e9e69966c463"),
        ];
        let mut b = [[0u8; 8]; 5];
        for (d, s) in b.iter_mut().zip(&blocks) {
            d.copy_from_slice(s);
        }
        let r = BwReport::from_blocks(&b);
        assert_eq!((r.size, r.iters), (16384, 20));
        assert!((r.bw_peak - 84.40).abs() < 0.005, "{}", r.bw_peak);
        assert!((r.bw_avg - 9.02).abs() < 0.005, "{}", r.bw_avg);
        assert_eq!(r.blocks(), b);
    }

    #[test]
    fn credits_as_perftest_writes_them() {
        // 20 messages: depth 20, a credit every 6 -> 6, 12, 18 and 20 (the capture's).
        assert_eq!(rx_depth(20), 20);
        let due: Vec<u32> = (1..=20).filter(|&r| credit_due(r, 20)).collect();
        assert_eq!(due, [6, 12, 18, 20]);
        // Odd depths are made even; the depth is at most 512.
        assert_eq!(rx_depth(25), 26);
        assert_eq!(rx_depth(5000), 512);
        assert_eq!(rx_depth(1), 2);
        assert!(credit_due(1, 2));
    }

    #[test]
    fn remote_offsets_walk_the_cycle_buffer() {
        // 16 KiB messages all start at the buffer (the write capture: every TO the same).
        assert!((0..20).all(|k| remote_offset(k, 16384, 4096, 64) == 0));
        // 100-byte messages step by 128 and wrap after 32.
        assert_eq!(addr_step(100, 64), 128);
        assert_eq!(remote_offset(1, 100, 4096, 64), 128);
        assert_eq!(remote_offset(31, 100, 4096, 64), 31 * 128);
        assert_eq!(remote_offset(32, 100, 4096, 64), 0);
        // Tiny messages use whole cache lines; half a cycle buffer still walks.
        assert_eq!(remote_offset(3, 1, 4096, 64), 192);
        assert_eq!(remote_offset(1, 2048, 4096, 64), 2048);
        assert_eq!(remote_offset(2, 2048, 4096, 64), 0);
        assert_eq!(remote_offset(1, 2049, 4096, 64), 0);
        assert_eq!(region_len(100, 4096, 64), 4096);
        assert_eq!(region_len(5000, 4096, 64), 5056);
    }
}
