//! `smc rdma rping --provider iwarp`: rdma-core's `rping` over our iWARP provider, either
//! role, wire- and protocol-compatible with `rping -s` / `rping -c` (librdmacm
//! `examples/rping.c`) on Linux siw.
//!
//! The connection is an iWARP one (TCP + MPA, `smc_iwarp::cm`; rping's rdma_cm asks for
//! responder resources 1 and initiator depth 1, i.e. IRD 1 / ORD 1 in the MPA enhanced
//! data). Each ping (rping's buffer exchange over SEND, then RDMA READ and WRITE):
//!
//! 1. client → server SEND of 16 bytes `{buf u64, rkey u32, size u32}` (big-endian): its
//!    `start_buf`, holding `"rdma-ping-%d: "` followed by the characters 65..122 cycling
//!    from a start that advances each ping, NUL-terminated;
//! 2. the server RDMA READs `size` bytes from there into its `rdma_buf`, then SENDs 16
//!    bytes ("go ahead");
//! 3. client → server SEND of its `rdma_buf` address;
//! 4. the server RDMA WRITEs `strlen(rdma_buf) + 1` bytes there, then SENDs 16 bytes;
//! 5. the client compares `start_buf` with `rdma_buf` (`-V`).
//!
//! Both our roles verify every ping's text against that pattern (our server checks what it
//! READ, our client what was WRITTEN back); rping itself checks on the client side with -V.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use clap::{Args as ClapArgs, ValueEnum};
use smc_verbs::{
    AccessFlags, Cq, InitAttr, Mr, QpCap, QpInitAttr, RdmaBuffer, RecvWr, SendFlags, SendOp,
    SendWr, WcStatus, WorkCompletion,
};

use super::RdmaError;

/// Which RDMA provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Provider {
    /// The software iWARP RNIC (`smc-iwarp`): RDMAP/DDP/MPA over TCP.
    Iwarp,
}

/// Options shared by the iWARP tools: what to ask for in the MPA exchange.
#[derive(ClapArgs, Debug, Clone)]
pub struct MpaArgs {
    /// MPA revision (1: RFC 5044 only; 2: RFC 6581 enhanced data).
    #[arg(long = "mpa-rev", default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub mpa_rev: u8,
    /// Client: ask for the peer-to-peer model with an RTR (RFC 6581 §9.2).
    #[arg(long)]
    pub p2p: bool,
    /// RTR messages offered (client) or accepted (server): any of send,write,read.
    #[arg(long, default_value = "send,write,read")]
    pub rtr: String,
    /// Ask for (and require) CRC32c on every FPDU.
    #[arg(long)]
    pub crc: bool,
    /// IRD offered (inbound RDMA Reads). Default: what the peer tool's rdma_cm asks for
    /// (rping: 1; perftest: 128 for read, 0 otherwise).
    #[arg(long)]
    pub ird: Option<u16>,
    /// ORD wanted (outbound RDMA Reads). Default as for --ird.
    #[arg(long)]
    pub ord: Option<u16>,
    /// Client: milliseconds between the MPA Reply and the first FPDU. Linux siw 6.12
    /// misses an FPDU that arrives while it is still handing the socket to its QP (see
    /// `smc_iwarp::cm::ConnParams::first_fpdu_delay`); 0 for RFC 5044 behaviour.
    #[arg(long = "first-fpdu-delay-ms", default_value_t = 20)]
    pub first_fpdu_delay_ms: u64,
}

impl MpaArgs {
    /// The connection parameters these options describe; `ird_ord` is the tool's IRD/ORD
    /// when `--ird`/`--ord` are not given.
    pub fn params(
        &self,
        timeout: Duration,
        ird_ord: (u16, u16),
    ) -> Result<smc_iwarp::cm::ConnParams, RdmaError> {
        let rtr = smc_iwarp::wire::mpa::RtrSet::parse(&self.rtr)
            .ok_or_else(|| RdmaError::Usage(format!("--rtr {}: use send,write,read", self.rtr)))?;
        Ok(smc_iwarp::cm::ConnParams {
            rev: self.mpa_rev,
            enhanced: self.mpa_rev >= 2,
            p2p: self.p2p,
            rtr,
            read: smc_iwarp::negotiate::ReadParams {
                ird: self.ird.unwrap_or(ird_ord.0),
                ord: self.ord.unwrap_or(ird_ord.1),
                ..Default::default()
            },
            crc: self.crc,
            timeout,
            first_fpdu_delay: Duration::from_millis(self.first_fpdu_delay_ms),
            ..Default::default()
        })
    }
}

/// `smc rdma rping` options (rping's own letters).
#[derive(ClapArgs, Debug, Clone)]
pub struct Args {
    /// The RDMA provider (rping needs a connection manager: iWARP).
    #[arg(long, value_enum, default_value_t = Provider::Iwarp)]
    pub provider: Provider,
    /// Server: listen on -a.
    #[arg(short = 's', long, conflicts_with = "client")]
    pub server: bool,
    /// Client: connect to -a.
    #[arg(short = 'c', long)]
    pub client: bool,
    /// Address to listen on (server) or connect to (client).
    #[arg(short = 'a', long)]
    pub addr: String,
    /// Client: local address to connect from.
    #[arg(short = 'I', long)]
    pub local: Option<IpAddr>,
    /// TCP port.
    #[arg(short = 'p', long, default_value_t = 7174)]
    pub port: u16,
    /// Pings (client); the server stops after this many (0: until the client leaves).
    #[arg(short = 'C', long, default_value_t = 10)]
    pub count: u32,
    /// Ping buffer size (rping's minimum is 15: the "rdma-ping-%d: " text).
    #[arg(short = 'S', long, default_value_t = 64)]
    pub size: usize,
    /// Verify every ping's data (rping -V); ours always checks, this only prints it.
    #[arg(short = 'V', long)]
    pub validate: bool,
    /// Print each ping's text (rping -v).
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// MPA/RFC 6581 parameters.
    #[command(flatten)]
    pub mpa: MpaArgs,
    /// Give up after this many seconds without progress.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
}

const INFO: usize = 16;
const RECV_OFF: usize = 0;
const SEND_OFF: usize = 64;
const START_OFF: usize = 128;

/// The text of ping `n` as rping's client builds it in a buffer of `size` bytes.
pub fn ping_text(n: u32, size: usize) -> Vec<u8> {
    let mut v = vec![0u8; size];
    let head = format!("rdma-ping-{n}: ");
    let hl = head.len().min(size);
    v[..hl].copy_from_slice(&head.as_bytes()[..hl]);
    // `start` begins at 65 and advances by one per ping, wrapping 122 -> 65.
    let mut c = 65 + (n % 58) as u8;
    for b in v.iter_mut().skip(hl) {
        *b = c;
        c += 1;
        if c > 122 {
            c = 65;
        }
    }
    if size > 0 {
        v[size - 1] = 0;
    }
    v
}

struct Ep {
    qp: smc_verbs::Qp,
    scq: Cq,
    rcq: Cq,
    buf: std::sync::Arc<RdmaBuffer>,
    mr: Mr,
    size: usize,
}

impl Ep {
    fn open(local: IpAddr, size: usize) -> Result<Ep, RdmaError> {
        let dev = smc_iwarp::open_device(local, &smc_iwarp::Config::from_env())?;
        let pd = dev.alloc_pd()?;
        let scq = dev.create_cq(64)?;
        let rcq = dev.create_cq(64)?;
        let buf = RdmaBuffer::new(START_OFF + 2 * size)?;
        let mr = pd.reg_mr(
            &buf,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
        )?;
        let qp = pd.create_qp(&QpInitAttr {
            send_cq: scq.clone(),
            recv_cq: rcq.clone(),
            cap: QpCap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: true,
        })?;
        qp.modify_to_init(&InitAttr {
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
            ..InitAttr::default()
        })?;
        Ok(Ep {
            qp,
            scq,
            rcq,
            buf,
            mr,
            size,
        })
    }
    fn start_off(&self) -> usize {
        START_OFF
    }
    fn rdma_off(&self) -> usize {
        START_OFF + self.size
    }
    fn post_recv(&self) -> Result<(), RdmaError> {
        Ok(self.qp.post_recv(&RecvWr {
            wr_id: 1,
            sg_list: &[self.mr.sge(RECV_OFF, INFO as u32)],
        })?)
    }
    /// SENDs `{addr, rkey, len}` of a local range (rping_format_send).
    fn send_info(&self, off: usize, len: usize) -> Result<(), RdmaError> {
        let mut m = [0u8; INFO];
        m[..8].copy_from_slice(&(self.mr.addr() + off as u64).to_be_bytes());
        m[8..12].copy_from_slice(&self.mr.rkey().to_be_bytes());
        m[12..16].copy_from_slice(&(len as u32).to_be_bytes());
        self.buf.write(SEND_OFF, &m);
        let sg = [self.mr.sge(SEND_OFF, INFO as u32)];
        self.qp.post_send(&SendWr {
            wr_id: 2,
            op: SendOp::Send,
            sg_list: &sg,
            flags: SendFlags::SIGNALED,
        })?;
        Ok(())
    }
    fn recv_info(&self, deadline: Instant, what: &str) -> Result<(u64, u32, u32), RdmaError> {
        let wc = wait(&self.rcq, &self.qp, deadline, what)?;
        if wc.byte_len as usize != INFO {
            return Err(RdmaError::Protocol(format!(
                "{what}: {} bytes, rping sends {INFO}",
                wc.byte_len
            )));
        }
        let mut m = [0u8; INFO];
        self.buf.read(RECV_OFF, &mut m);
        let addr = u64::from_be_bytes(m[..8].try_into().unwrap_or([0; 8]));
        let rkey = u32::from_be_bytes(m[8..12].try_into().unwrap_or([0; 4]));
        let len = u32::from_be_bytes(m[12..16].try_into().unwrap_or([0; 4]));
        Ok((addr, rkey, len))
    }
    fn rdma(
        &self,
        op: SendOp,
        off: usize,
        len: usize,
        deadline: Instant,
        what: &str,
    ) -> Result<(), RdmaError> {
        let sg = [self.mr.sge(off, len as u32)];
        self.qp.post_send(&SendWr {
            wr_id: 3,
            op,
            sg_list: &sg,
            flags: SendFlags::SIGNALED,
        })?;
        wait(&self.scq, &self.qp, deadline, what).map(|_| ())
    }
    fn send_done(&self, deadline: Instant, what: &str) -> Result<(), RdmaError> {
        wait(&self.scq, &self.qp, deadline, what).map(|_| ())
    }
}

pub(super) fn wait(
    cq: &Cq,
    qp: &smc_verbs::Qp,
    deadline: Instant,
    what: &str,
) -> Result<WorkCompletion, RdmaError> {
    let mut one = [WorkCompletion::default()];
    loop {
        if cq.poll(&mut one) == 1 {
            if one[0].status != WcStatus::Success {
                let why = smc_iwarp::qp_error(qp).unwrap_or_default();
                return Err(RdmaError::Protocol(format!(
                    "{what}: {:?}{}{}",
                    one[0].status,
                    if why.is_empty() { "" } else { ": " },
                    why
                )));
            }
            return Ok(one[0]);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(RdmaError::Timeout(what.into()));
        }
        cq.wait(Some((deadline - now).min(Duration::from_millis(200))))?;
    }
}

pub(super) fn describe(c: &smc_iwarp::cm::Connection) -> String {
    format!(
        "MPA rev {}{} crc={} ird={} ord={} peer_ird_ord={} p2p={} rtr={} rtr_options={}",
        c.rev,
        if c.enhanced { " enhanced" } else { "" },
        if c.crc { "on" } else { "off" },
        c.ird,
        c.ord,
        c.peer_ird_ord
            .map_or("-".into(), |(i, o)| format!("{i}/{o}")),
        c.p2p,
        c.rtr.map_or("-".into(), |r| r.to_string()),
        c.rtr_options
    )
}

/// Runs `smc rdma rping`.
pub fn run(a: &Args) -> Result<(), RdmaError> {
    if a.server == a.client {
        return Err(RdmaError::Usage("give -s (server) or -c (client)".into()));
    }
    if a.size < 16 {
        return Err(RdmaError::Usage(
            "-S must be at least 16 (rping's text needs it)".into(),
        ));
    }
    let timeout = Duration::from_secs(a.timeout);
    // rping's rdma_cm asks for responder resources 1 and initiator depth 1.
    let params = a.mpa.params(timeout, (1, 1))?;
    let addr: SocketAddr = (a.addr.as_str(), a.port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| RdmaError::Usage(format!("cannot resolve {}", a.addr)))?;
    if a.server {
        server(a, addr, &params, timeout)
    } else {
        client(a, addr, &params, timeout)
    }
}

fn client(
    a: &Args,
    addr: SocketAddr,
    p: &smc_iwarp::cm::ConnParams,
    timeout: Duration,
) -> Result<(), RdmaError> {
    let local = a.local.unwrap_or(if addr.is_ipv4() {
        IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
    });
    let ep = Ep::open(local, a.size)?;
    let conn = smc_iwarp::cm::connect(&ep.qp, addr, p)
        .map_err(|e| RdmaError::Protocol(format!("connect to {addr}: {e}")))?;
    eprintln!("rping client: connected to {addr}: {}", describe(&conn));
    for n in 0..a.count {
        let deadline = Instant::now() + timeout;
        let text = ping_text(n, a.size);
        ep.buf.write(ep.start_off(), &text);
        ep.buf.fill(ep.rdma_off(), a.size, 0);
        ep.post_recv()?;
        ep.send_info(ep.start_off(), a.size)?;
        ep.send_done(deadline, "SEND of the start buffer")?;
        ep.recv_info(deadline, "server's go-ahead")?;
        ep.post_recv()?;
        ep.send_info(ep.rdma_off(), a.size)?;
        ep.send_done(deadline, "SEND of the RDMA buffer")?;
        ep.recv_info(deadline, "server's write-complete")?;
        let mut got = vec![0u8; a.size];
        ep.buf.read(ep.rdma_off(), &mut got);
        if got != text {
            return Err(RdmaError::DataMismatch(format!(
                "ping {n}: wrote back {:?}",
                String::from_utf8_lossy(
                    &got[..got.iter().position(|&b| b == 0).unwrap_or(got.len())]
                )
            )));
        }
        if a.verbose {
            println!(
                "ping data: {}",
                String::from_utf8_lossy(&text[..a.size - 1])
            );
        }
    }
    println!(
        "rping client: {} pings of {} bytes, data verified{}",
        a.count,
        a.size,
        if a.validate { " (-V)" } else { "" }
    );
    Ok(())
}

fn server(
    a: &Args,
    addr: SocketAddr,
    p: &smc_iwarp::cm::ConnParams,
    timeout: Duration,
) -> Result<(), RdmaError> {
    let l = smc_iwarp::cm::Listener::bind(addr)?;
    eprintln!("rping server: listening on {}", l.local_addr()?);
    let inc = l
        .accept()
        .map_err(|e| RdmaError::Protocol(format!("accept: {e}")))?;
    let local = inc_local(&inc, addr);
    let ep = Ep::open(local, a.size)?;
    ep.post_recv()?;
    let conn = inc
        .accept(&ep.qp, p)
        .map_err(|e| RdmaError::Protocol(format!("accept: {e}")))?;
    eprintln!(
        "rping server: connection from {}: {}",
        conn.peer,
        describe(&conn)
    );
    let mut n = 0u32;
    loop {
        if a.count > 0 && n == a.count {
            break;
        }
        let deadline = Instant::now() + timeout;
        let (raddr, rkey, rlen) = match ep.recv_info(deadline, "client's start buffer") {
            Ok(x) => x,
            // rping's client disconnects after its last ping: the flushed receive ends us.
            Err(e) if a.count == 0 && n > 0 => {
                tracing::debug!("client left: {e}");
                break;
            }
            Err(e) => return Err(e),
        };
        if rlen as usize > a.size {
            return Err(RdmaError::Protocol(format!(
                "ping {n}: the client's buffer ({rlen} bytes) is larger than ours (-S {})",
                a.size
            )));
        }
        ep.buf.fill(ep.rdma_off(), a.size, 0);
        ep.rdma(
            SendOp::RdmaRead {
                remote_addr: raddr,
                rkey,
            },
            ep.rdma_off(),
            rlen as usize,
            deadline,
            "RDMA READ of the ping",
        )?;
        let mut got = vec![0u8; rlen as usize];
        ep.buf.read(ep.rdma_off(), &mut got);
        if got != ping_text(n, rlen as usize) {
            return Err(RdmaError::DataMismatch(format!(
                "ping {n}: read {:?}",
                String::from_utf8_lossy(&got)
            )));
        }
        if a.verbose {
            println!(
                "server ping data: {}",
                String::from_utf8_lossy(&got[..got.len().saturating_sub(1)])
            );
        }
        ep.post_recv()?;
        ep.send_info(ep.rdma_off(), a.size)?;
        ep.send_done(deadline, "SEND go-ahead")?;
        let (waddr, wkey, wlen) = ep.recv_info(deadline, "client's RDMA buffer")?;
        let strlen = got.iter().position(|&b| b == 0).unwrap_or(got.len());
        let len = (strlen + 1).min(rlen as usize);
        if len > wlen as usize {
            return Err(RdmaError::Protocol(format!(
                "ping {n}: the client's sink ({wlen} bytes) is too small"
            )));
        }
        ep.rdma(
            SendOp::RdmaWrite {
                remote_addr: waddr,
                rkey: wkey,
            },
            ep.rdma_off(),
            len,
            deadline,
            "RDMA WRITE of the echo",
        )?;
        ep.post_recv()?;
        ep.send_info(ep.rdma_off(), a.size)?;
        ep.send_done(deadline, "SEND write-complete")?;
        n += 1;
    }
    // rping's client disconnects after its last ping; closing first would make it see the
    // disconnect before it has processed our last SEND (rping then fails its wait). Wait
    // for it to leave (our posted receive is flushed) before we close.
    if a.count > 0 {
        let deadline = Instant::now() + timeout;
        while ep.qp.state() != smc_verbs::QpState::Err && Instant::now() < deadline {
            ep.rcq.wait(Some(Duration::from_millis(100)))?;
        }
    }
    println!("rping server: {n} pings of {} bytes, data verified", a.size);
    Ok(())
}

/// The device address for an accepted connection: the address the client reached.
fn inc_local(_inc: &smc_iwarp::cm::Incoming, listen: SocketAddr) -> IpAddr {
    listen.ip()
}

#[cfg(test)]
mod tests {
    use super::ping_text;

    #[test]
    fn rping_text_layout() {
        let t = ping_text(0, 64);
        assert_eq!(&t[..13], b"rdma-ping-0: ");
        assert_eq!(t[13], b'A');
        assert_eq!(t[63], 0);
        let t = ping_text(1, 20);
        assert_eq!(&t[..13], b"rdma-ping-1: ");
        assert_eq!(t[13], b'B');
        // ping 57 starts at 'z' (122) and wraps back to 'A'; its header is 14 bytes
        let t = ping_text(57, 40);
        assert_eq!(&t[..14], b"rdma-ping-57: ");
        assert_eq!((t[14], t[15]), (b'z', b'A'));
    }
}
