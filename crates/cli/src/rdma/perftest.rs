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

fn progress(timeout: Duration) -> Instant {
    Instant::now() + timeout
}

/// The communication connection: a QP with one 56-byte receive always posted.
struct Comm {
    qp: Qp,
    scq: Cq,
    rcq: Cq,
    buf: Arc<RdmaBuffer>,
    mr: Mr,
    client: bool,
    timeout: Duration,
}

const COMM_RECV: usize = 0;
const COMM_SEND: usize = 64;

impl Comm {
    fn new(pd: &Pd, dev: &Device, client: bool, timeout: Duration) -> Result<Comm, RdmaError> {
        let scq = dev.create_cq(8)?;
        let rcq = dev.create_cq(8)?;
        let buf = RdmaBuffer::new(2 * COMM_SEND)?;
        let mr = pd.reg_mr(&buf, AccessFlags::LOCAL_WRITE)?;
        let qp = pd.create_qp(&QpInitAttr {
            send_cq: scq.clone(),
            recv_cq: rcq.clone(),
            cap: QpCap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: true,
        })?;
        qp.modify_to_init(&InitAttr {
            access: AccessFlags::LOCAL_WRITE,
            ..InitAttr::default()
        })?;
        let c = Comm {
            qp,
            scq,
            rcq,
            buf,
            mr,
            client,
            timeout,
        };
        // perftest posts its receive before it connects or accepts; so do we.
        c.post_recv()?;
        Ok(c)
    }

    fn post_recv(&self) -> Result<(), RdmaError> {
        Ok(self.qp.post_recv(&RecvWr {
            wr_id: 1,
            sg_list: &[self.mr.sge(COMM_RECV, DEST_LEN as u32)],
        })?)
    }

    fn send(&self, m: &[u8], what: &str) -> Result<(), RdmaError> {
        self.buf.write(COMM_SEND, m);
        self.qp.post_send(&SendWr {
            wr_id: 2,
            op: SendOp::Send,
            sg_list: &[self.mr.sge(COMM_SEND, m.len() as u32)],
            flags: SendFlags::SIGNALED,
        })?;
        wait(&self.scq, &self.qp, progress(self.timeout), what).map(|_| ())
    }

    fn recv(&self, len: usize, what: &str) -> Result<Vec<u8>, RdmaError> {
        let wc = wait(&self.rcq, &self.qp, progress(self.timeout), what)?;
        if wc.opcode != WcOpcode::Recv || wc.byte_len as usize != len {
            return Err(RdmaError::Protocol(format!(
                "{what}: the peer sent {} bytes ({:?}), perftest sends {len} here",
                wc.byte_len, wc.opcode
            )));
        }
        let mut m = vec![0u8; len];
        self.buf.read(COMM_RECV, &mut m);
        self.post_recv()?;
        Ok(m)
    }

    /// One exchange (perftest `ctx_xchg_data`): the client writes first, the server reads
    /// first; both messages have the same size.
    fn xchg(&self, mine: &[u8], what: &str) -> Result<Vec<u8>, RdmaError> {
        if self.client {
            self.send(mine, what)?;
            self.recv(mine.len(), what)
        } else {
            let theirs = self.recv(mine.len(), what)?;
            self.send(mine, what)?;
            Ok(theirs)
        }
    }

    fn dest(&self, mine: &PingpongDest, what: &str) -> Result<PingpongDest, RdmaError> {
        PingpongDest::parse(&self.xchg(&mine.encode(), what)?)
    }
}

/// What both sides agreed on in the first exchanges.
struct Sys {
    cycle: usize,
    cache_line: usize,
    peer_version: String,
}

fn exchange_sys(comm: &Comm, dev: &Device) -> Result<Sys, RdmaError> {
    let mut v = [0u8; 16];
    v[..VERSION.len()].copy_from_slice(VERSION);
    let pv = comm.xchg(&v, "version")?;
    let end = pv.iter().position(|&b| b == 0).unwrap_or(pv.len());
    let peer_version = String::from_utf8_lossy(&pv[..end]).into_owned();
    // The rest of the exchange (cycle buffer, cache line, a 2-byte MTU, 8-byte iteration
    // counts) is what perftest does with a peer of version 5.33 or later.
    match peer_version.trim().parse::<f32>() {
        Ok(x) if x >= 5.33 => {}
        _ => {
            return Err(RdmaError::Protocol(format!(
                "peer's perftest version {peer_version:?}: versions before 5.33 speak a different exchange"
            )))
        }
    }
    let cb = comm.xchg(&CYCLE_BUFFER.to_be_bytes(), "cycle buffer size")?;
    let cl = comm.xchg(&CACHE_LINE.to_be_bytes(), "cache line size")?;
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    // perftest takes the larger of both; a peer's absurd value is refused, not allocated.
    let cycle = be(&cb).max(CYCLE_BUFFER) as usize;
    let cache_line = be(&cl).max(CACHE_LINE) as usize;
    if cycle > 64 << 20 || cache_line > 4096 || !cache_line.is_power_of_two() {
        return Err(RdmaError::Protocol(format!(
            "peer's cycle buffer {cycle} / cache line {cache_line} out of range"
        )));
    }
    // The MTU enumeration as text (iWARP has no IBA path MTU; the device reports 4096).
    let mtu = [b'0' + dev.attr().active_mtu as u8, 0];
    let pm = comm.xchg(&mtu, "MTU")?;
    tracing::debug!(peer_mtu = %String::from_utf8_lossy(&pm[..1]), "perftest MTU exchange");
    Ok(Sys {
        cycle,
        cache_line,
        peer_version,
    })
}

/// The data side: QP, buffers and, for send, the credit words.
struct Data {
    qp: Qp,
    scq: Cq,
    rcq: Cq,
    buf: Arc<RdmaBuffer>,
    mr: Mr,
    credit: Option<(Arc<RdmaBuffer>, Mr)>,
}

// Credit memory: [0, 4) perftest's ctrl word (unused by us), [4, 8) the credit word the
// peer writes (the address we advertise), then our source words for credit WRITEs.
const CREDIT_WORD: usize = 4;
const CREDIT_SRC: usize = 8;

impl Data {
    fn new(
        pd: &Pd,
        dev: &Device,
        buf_len: usize,
        remote: AccessFlags,
        credit: bool,
        recv_wr: u32,
    ) -> Result<Data, RdmaError> {
        let depth = MAX_TX_DEPTH + CREDIT_SLOTS as u32;
        let scq = dev.create_cq(depth * 2)?;
        let rcq = dev.create_cq(recv_wr.max(1) * 2)?;
        let buf = RdmaBuffer::new(buf_len.max(64))?;
        // The peer gets only what its verb needs: WRITE into a write server's buffer, READ
        // from a read server's; a client's buffers are local.
        let mr = pd.reg_mr(&buf, AccessFlags::LOCAL_WRITE | remote)?;
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | remote;
        let credit = if credit {
            let b = RdmaBuffer::new(CREDIT_SRC + 4 * CREDIT_SLOTS)?;
            let m = pd.reg_mr(&b, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
            Some((b, m))
        } else {
            None
        };
        let qp = pd.create_qp(&QpInitAttr {
            send_cq: scq.clone(),
            recv_cq: rcq.clone(),
            cap: QpCap {
                max_send_wr: depth,
                max_recv_wr: recv_wr.max(1),
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: true,
        })?;
        qp.modify_to_init(&InitAttr {
            access,
            ..InitAttr::default()
        })?;
        Ok(Data {
            qp,
            scq,
            rcq,
            buf,
            mr,
            credit,
        })
    }

    /// Our key block: the data buffer, or (send) the credit word.
    fn dest(&self, out_reads: u32, gid: [u8; 16]) -> PingpongDest {
        let (rkey, vaddr) = match &self.credit {
            Some((_, m)) => (m.rkey(), m.addr() + CREDIT_WORD as u64),
            None => (self.mr.rkey(), self.mr.addr()),
        };
        PingpongDest {
            lid: 0,
            out_reads,
            qpn: self.qp.qpn(),
            psn: super::endpoint::random_psn(),
            rkey,
            vaddr,
            gid,
            srqn: 0,
            gid_index: 0,
        }
    }

    fn credit_word(&self) -> u32 {
        let mut w = [0u8; 4];
        if let Some((b, _)) = &self.credit {
            b.read(CREDIT_WORD, &mut w);
        }
        // perftest writes the count in host order: little-endian on the x86 hosts it runs on.
        u32::from_le_bytes(w)
    }
}

/// Waits for one send completion and checks that it is the next one expected.
fn reap_send(
    d: &Data,
    expect: WcOpcode,
    timeout: Duration,
    what: &str,
) -> Result<WorkCompletion, RdmaError> {
    let wc = wait(&d.scq, &d.qp, progress(timeout), what)?;
    if wc.opcode != expect {
        return Err(RdmaError::Protocol(format!(
            "{what}: completed as {:?}, expected {expect:?}",
            wc.opcode
        )));
    }
    Ok(wc)
}

fn unspecified_like(a: &SocketAddr) -> IpAddr {
    if a.is_ipv4() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    }
}

/// `connect`, retrying while the server's port refuses connections (perftest's server
/// listens for the data connection only after it answered the first block; its client
/// retries the same way).
fn connect_retry(
    qp: &Qp,
    addr: SocketAddr,
    p: &ConnParams,
    timeout: Duration,
    what: &str,
) -> Result<Connection, RdmaError> {
    let deadline = progress(timeout);
    loop {
        match smc_iwarp::cm::connect(qp, addr, p) {
            Ok(c) => return Ok(c),
            Err(CmError::Io(e))
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => {
                return Err(RdmaError::Protocol(format!(
                    "{what}: connect to {addr}: {e}"
                )))
            }
        }
    }
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

/// Sizes of a run, checked against the memory cap.
fn slots(a: &Args, want: u32) -> Result<usize, RdmaError> {
    let n = (want.max(1) as usize).min((MAX_BUFFERS / a.size).max(1));
    if a.size > MAX_BUFFERS {
        return Err(RdmaError::Usage(format!(
            "-s {} is larger than the {} MiB this tool allocates",
            a.size,
            MAX_BUFFERS >> 20
        )));
    }
    Ok(n)
}

fn client(
    a: &Args,
    addr: SocketAddr,
    comm_p: &ConnParams,
    data_p: &ConnParams,
    timeout: Duration,
) -> Result<(), RdmaError> {
    let local = a.local.unwrap_or_else(|| unspecified_like(&addr));
    let dev = smc_iwarp::open_device(local, &smc_iwarp::Config::from_env())?;
    let pd = dev.alloc_pd()?;
    let comm = Comm::new(&pd, &dev, true, timeout)?;
    let cc = connect_retry(&comm.qp, addr, comm_p, timeout, "communication connection")?;
    eprintln!(
        "perftest client: communication connection to {addr}: {}",
        describe(&cc)
    );
    let sys = exchange_sys(&comm, &dev)?;
    comm.dest(
        &PingpongDest::default(),
        "block A (before the data connection)",
    )?;

    let tx_depth = a.iters.min(MAX_TX_DEPTH);
    let depth = slots(a, tx_depth)?;
    let rslots = if a.size > sys.cycle / 2 {
        1
    } else {
        sys.cycle / addr_step(a.size, sys.cache_line)
    };
    // Send/write: one source slot per WR in flight. Read: one sink slot per WR in flight.
    let data = Data::new(
        &pd,
        &dev,
        depth * a.size,
        AccessFlags::empty(),
        a.verb == Verb::Send,
        1,
    )?;
    let dc = connect_retry(&data.qp, addr, data_p, timeout, "data connection")?;
    eprintln!(
        "perftest client: data connection to {addr}: {}",
        describe(&dc)
    );
    comm.dest(
        &PingpongDest::default(),
        "block B (after the data connection)",
    )?;
    let out_reads = if a.verb == Verb::Read {
        dc.ord.max(1) as u32
    } else {
        1
    };
    let me = data.dest(out_reads, dev.gid().0);
    let peer = comm.dest(&me, "block C (keys)")?;
    for what in ["block D", "block E"] {
        let p = comm.dest(&me, what)?;
        if !p.same_keys(&peer) {
            return Err(RdmaError::Protocol(format!(
                "{what}: the server's keys changed"
            )));
        }
    }
    if a.verb == Verb::Send {
        comm.dest(&me, "block F (server's receives posted)")?;
    }
    println!(
        "  local:  QPN {:#06x} RKey {:#010x} VAddr {:#018x}\n  remote: QPN {:#06x} RKey {:#010x} VAddr {:#018x} out_reads {} (perftest {})",
        me.qpn, me.rkey, me.vaddr, peer.qpn, peer.rkey, peer.vaddr, peer.out_reads, sys.peer_version
    );

    let mut dump = Vec::new();
    let t0 = Instant::now();
    let mut msg = vec![0u8; a.size];
    let mut inflight = 0u32;
    let mut done = 0u64;
    // Read client: what each remote slot held the first time it was read.
    let mut seen: Vec<Option<Vec<u8>>> = vec![None; rslots];
    let depth_rx = rx_depth(a.iters);
    let mut complete_one = |data: &Data, done: &mut u64| -> Result<(), RdmaError> {
        let expect = match a.verb {
            Verb::Send => WcOpcode::Send,
            Verb::Write => WcOpcode::RdmaWrite,
            Verb::Read => WcOpcode::RdmaRead,
        };
        reap_send(data, expect, timeout, "a data completion")?;
        if a.verb == Verb::Read {
            let k = *done;
            let slot = (k % depth as u64) as usize;
            let mut got = vec![0u8; a.size];
            data.buf.read(slot * a.size, &mut got);
            let r = (k % rslots as u64) as usize;
            match &seen[r] {
                None => seen[r] = Some(got),
                Some(first) if *first != got => {
                    let at = first
                        .iter()
                        .zip(&got)
                        .position(|(x, y)| x != y)
                        .unwrap_or(0);
                    return Err(RdmaError::DataMismatch(format!(
                        "READ {k} of remote offset {} differs from its first READ at byte {at}",
                        remote_offset(k, a.size, sys.cycle, sys.cache_line)
                    )));
                }
                Some(_) => {}
            }
        }
        *done += 1;
        Ok(())
    };
    for k in 0..a.iters as u64 {
        // Room in the send queue, and (send) a credit window below the server's depth.
        let deadline = progress(timeout);
        loop {
            let credit_ok =
                a.verb != Verb::Send || (k as u32 + 1).wrapping_sub(data.credit_word()) < depth_rx;
            if inflight < tx_depth && inflight < depth as u32 && credit_ok {
                break;
            }
            if inflight > 0 {
                complete_one(&data, &mut done)?;
                inflight -= 1;
            } else if Instant::now() >= deadline {
                return Err(RdmaError::Timeout(format!(
                    "a credit from the server for message {k} (credit word {})",
                    data.credit_word()
                )));
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let slot = (k % depth as u64) as usize;
        let off = slot * a.size;
        let roff = remote_offset(k, a.size, sys.cycle, sys.cache_line) as u64;
        let op = match a.verb {
            Verb::Send => SendOp::Send,
            Verb::Write => SendOp::RdmaWrite {
                remote_addr: peer.vaddr + roff,
                rkey: peer.rkey,
            },
            Verb::Read => SendOp::RdmaRead {
                remote_addr: peer.vaddr + roff,
                rkey: peer.rkey,
            },
        };
        if a.verb != Verb::Read {
            pattern::fill(SEED + k, 0, &mut msg);
            data.buf.write(off, &msg);
            if a.dump.is_some() {
                dump.extend_from_slice(&msg);
            }
        }
        data.qp.post_send(&SendWr {
            wr_id: k,
            op,
            sg_list: &[data.mr.sge(off, a.size as u32)],
            flags: SendFlags::SIGNALED,
        })?;
        inflight += 1;
    }
    while inflight > 0 {
        complete_one(&data, &mut done)?;
        inflight -= 1;
    }
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    if a.verb == Verb::Read {
        // The server's buffer as we read it: each remote slot at its offset.
        let step = if rslots > 1 {
            addr_step(a.size, sys.cache_line)
        } else {
            0
        };
        let mut img = vec![0u8; (rslots - 1) * step + a.size];
        for (r, s) in seen.iter().enumerate() {
            if let Some(s) = s {
                img[r * step..r * step + a.size].copy_from_slice(s);
            }
        }
        dump = img;
    }
    let bytes = a.size as f64 * a.iters as f64;
    let mbps = bytes / secs / (1u64 << 20) as f64;
    let report = BwReport {
        size: a.size as u64,
        iters: a.iters as u64,
        bw_peak: mbps,
        bw_avg: mbps,
        msg_rate: a.iters as f64 / secs / 1e6,
    };
    if a.verb != Verb::Send {
        comm.dest(&me, "block F (run finished)")?;
        for (i, b) in report.blocks().iter().enumerate() {
            comm.xchg(b, &format!("result {i}"))?;
        }
    }
    comm.dest(&me, "block G (closing)")?;
    if let Some(p) = &a.dump {
        std::fs::write(p, &dump)?;
    }
    let what = match a.verb {
        Verb::Send => "SENDs",
        Verb::Write => "RDMA WRITEs",
        Verb::Read => "RDMA READs (every remote offset read back the same bytes)",
    };
    println!(
        "perftest client: {} {what} of {} bytes, {mbps:.2} MB/s, {:.6} Mpps",
        a.iters, a.size, report.msg_rate
    );
    // perftest's ends disconnect the data connection first and only then destroy the
    // communication one. So do we: closing both at once can reach a siw server while its
    // last SEND (the block above, already here) is still its active work request, which
    // the close then completes with a local QP error and fails the server. We close the
    // data connection and wait (bounded) until the server has closed the other.
    drop(data);
    let deadline = progress(timeout.min(Duration::from_secs(10)));
    while comm.qp.state() != QpState::Err && Instant::now() < deadline {
        comm.rcq.wait(Some(Duration::from_millis(50)))?;
    }
    drop(comm);
    Ok(())
}

fn server(
    a: &Args,
    comm_p: &ConnParams,
    data_p: &ConnParams,
    timeout: Duration,
) -> Result<(), RdmaError> {
    let mut l = Listener::bind(SocketAddr::new(a.bind, a.port))?;
    l.set_timeout(timeout);
    eprintln!("perftest server: listening on {}", l.local_addr()?);
    let dev = smc_iwarp::open_device(a.bind, &smc_iwarp::Config::from_env())?;
    let pd = dev.alloc_pd()?;
    let comm = Comm::new(&pd, &dev, false, timeout)?;
    let inc = l
        .accept()
        .map_err(|e| RdmaError::Protocol(format!("communication connection: {e}")))?;
    let cc = inc
        .accept(&comm.qp, comm_p)
        .map_err(|e| RdmaError::Protocol(format!("communication connection: {e}")))?;
    eprintln!(
        "perftest server: communication connection from {}: {}",
        cc.peer,
        describe(&cc)
    );
    let sys = exchange_sys(&comm, &dev)?;
    let region = region_len(a.size, sys.cycle, sys.cache_line);
    let depth_rx = rx_depth(a.iters);
    let (buf_len, recv_wr) = match a.verb {
        // One receive slot per posted receive, so that every message can be kept.
        Verb::Send => {
            if (depth_rx as usize).saturating_mul(a.size) > MAX_BUFFERS {
                return Err(RdmaError::Usage(format!(
                    "a send server keeps {depth_rx} receives of {} bytes: more than {} MiB",
                    a.size,
                    MAX_BUFFERS >> 20
                )));
            }
            (depth_rx as usize * a.size, depth_rx)
        }
        // perftest's buffer is twice the cycle buffer; the second half must stay untouched.
        Verb::Write | Verb::Read => {
            if region > MAX_BUFFERS / 2 {
                return Err(RdmaError::Usage(format!(
                    "a {} server needs twice {region} bytes: more than {} MiB",
                    if a.verb == Verb::Write {
                        "write"
                    } else {
                        "read"
                    },
                    MAX_BUFFERS >> 20
                )));
            }
            (2 * region, 1)
        }
    };
    let remote = match a.verb {
        Verb::Send => AccessFlags::empty(),
        Verb::Write => AccessFlags::REMOTE_WRITE,
        Verb::Read => AccessFlags::REMOTE_READ,
    };
    let data = Data::new(&pd, &dev, buf_len, remote, a.verb == Verb::Send, recv_wr)?;
    if a.verb == Verb::Read {
        let mut img = vec![0u8; buf_len];
        pattern::fill(SEED, 0, &mut img);
        data.buf.write(0, &img);
    }
    let post_recv = |slot: usize| -> Result<(), RdmaError> {
        Ok(data.qp.post_recv(&RecvWr {
            wr_id: slot as u64,
            sg_list: &[data.mr.sge(slot * a.size, a.size as u32)],
        })?)
    };
    if a.verb == Verb::Send {
        for s in 0..depth_rx as usize {
            post_recv(s)?;
        }
    }
    comm.xchg(
        &PingpongDest::default().encode(),
        "block A (before the data connection)",
    )?;
    let inc = l
        .accept_within(timeout)
        .map_err(|e| RdmaError::Protocol(format!("data connection: {e}")))?;
    let dc = inc
        .accept(&data.qp, data_p)
        .map_err(|e| RdmaError::Protocol(format!("data connection: {e}")))?;
    eprintln!(
        "perftest server: data connection from {}: {}",
        dc.peer,
        describe(&dc)
    );
    drop(l);
    comm.dest(
        &PingpongDest::default(),
        "block B (after the data connection)",
    )?;
    let out_reads = if a.verb == Verb::Read {
        dc.ird.max(1) as u32
    } else {
        1
    };
    let me = data.dest(out_reads, dev.gid().0);
    let peer = comm.dest(&me, "block C (keys)")?;
    for what in ["block D", "block E"] {
        let p = comm.dest(&me, what)?;
        if !p.same_keys(&peer) {
            return Err(RdmaError::Protocol(format!(
                "{what}: the client's keys changed"
            )));
        }
    }
    println!(
        "  local:  QPN {:#06x} RKey {:#010x} VAddr {:#018x}\n  remote: QPN {:#06x} RKey {:#010x} VAddr {:#018x} (perftest {})",
        me.qpn, me.rkey, me.vaddr, peer.qpn, peer.rkey, peer.vaddr, sys.peer_version
    );
    let mut dump = Vec::new();
    match a.verb {
        Verb::Send => {
            comm.dest(&me, "block F (our receives posted)")?;
            let (cbuf, cmr) = data
                .credit
                .as_ref()
                .ok_or_else(|| RdmaError::Protocol("no credit memory".into()))?;
            let mut posted = depth_rx as u64;
            let mut credits_inflight = 0usize;
            let mut credit_n = 0usize;
            let mut msg = vec![0u8; a.size];
            for rcnt in 1..=a.iters {
                let wc = wait(
                    &data.rcq,
                    &data.qp,
                    progress(timeout),
                    "a SEND from the client",
                )?;
                if wc.opcode != WcOpcode::Recv || wc.byte_len as usize != a.size {
                    return Err(RdmaError::Protocol(format!(
                        "message {rcnt}: {:?} of {} bytes, expected a SEND of {}",
                        wc.opcode, wc.byte_len, a.size
                    )));
                }
                let slot = wc.wr_id as usize;
                if a.dump.is_some() {
                    data.buf.read(slot * a.size, &mut msg);
                    dump.extend_from_slice(&msg);
                }
                if posted < a.iters as u64 {
                    post_recv(slot)?;
                    posted += 1;
                }
                if credit_due(rcnt, depth_rx) {
                    if credits_inflight == CREDIT_SLOTS {
                        reap_send(&data, WcOpcode::RdmaWrite, timeout, "a credit WRITE")?;
                        credits_inflight -= 1;
                    }
                    let src = CREDIT_SRC + 4 * (credit_n % CREDIT_SLOTS);
                    cbuf.write(src, &rcnt.to_le_bytes());
                    data.qp.post_send(&SendWr {
                        wr_id: rcnt as u64,
                        op: SendOp::RdmaWrite {
                            remote_addr: peer.vaddr,
                            rkey: peer.rkey,
                        },
                        sg_list: &[cmr.sge(src, 4)],
                        flags: SendFlags::SIGNALED,
                    })?;
                    credits_inflight += 1;
                    credit_n += 1;
                }
            }
            while credits_inflight > 0 {
                reap_send(&data, WcOpcode::RdmaWrite, timeout, "a credit WRITE")?;
                credits_inflight -= 1;
            }
            comm.dest(&me, "block G (closing)")?;
            println!(
                "perftest server: received {} SENDs of {} bytes, {credit_n} credits written",
                a.iters, a.size
            );
        }
        Verb::Write | Verb::Read => {
            // The client runs now; its next block says it has finished.
            comm.dest(&me, "block F (client's run finished)")?;
            let mut blocks = [[0u8; 8]; 5];
            for (i, b) in blocks.iter_mut().enumerate() {
                let got = comm.xchg(&[0u8; 8], &format!("result {i}"))?;
                b.copy_from_slice(&got);
            }
            let r = BwReport::from_blocks(&blocks);
            comm.dest(&me, "block G (closing)")?;
            let mut img = vec![0u8; buf_len];
            data.buf.read(0, &mut img);
            if a.verb == Verb::Write {
                if img[..a.size].iter().all(|&b| b == 0) {
                    return Err(RdmaError::DataMismatch(
                        "the client's WRITEs left our buffer untouched".into(),
                    ));
                }
                if let Some(at) = img[region..].iter().position(|&b| b != 0) {
                    return Err(RdmaError::DataMismatch(format!(
                        "the client wrote past the {region}-byte cycle buffer (byte {})",
                        region + at
                    )));
                }
            } else if let Some(at) = pattern::first_mismatch(SEED, 0, &img) {
                return Err(RdmaError::DataMismatch(format!(
                    "our read-only buffer changed at byte {at}"
                )));
            }
            dump = img[..region].to_vec();
            println!(
                "perftest server: the client's {} run: {} x {} bytes, peak {:.2} MB/s, average {:.2} MB/s, {:.6} Mpps",
                if a.verb == Verb::Write { "RDMA WRITE" } else { "RDMA READ" },
                r.iters, r.size, r.bw_peak, r.bw_avg, r.msg_rate
            );
        }
    }
    if let Some(p) = &a.dump {
        std::fs::write(p, &dump)?;
    }
    // perftest's client disconnects the data connection after the last block; closing
    // first would cut its rdma_disconnect short. Wait (bounded) until it has left, then
    // close the data connection and, after it, the communication one.
    let deadline = progress(timeout);
    while data.qp.state() != QpState::Err && Instant::now() < deadline {
        data.scq.wait(Some(Duration::from_millis(50)))?;
    }
    drop(data);
    drop(comm);
    Ok(())
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
