//! The communication connection: perftest's message exchange (version, sizes, MTU, the
//! 56-byte destination blocks) over its own rdma_cm/MPA connection.

use super::*;

pub(super) fn progress(timeout: Duration) -> Instant {
    Instant::now() + timeout
}

/// The communication connection: a QP with one 56-byte receive always posted.
pub(super) struct Comm {
    pub(super) qp: Qp,
    pub(super) scq: Cq,
    pub(super) rcq: Cq,
    pub(super) buf: Arc<RdmaBuffer>,
    pub(super) mr: Mr,
    pub(super) client: bool,
    pub(super) timeout: Duration,
}

const COMM_RECV: usize = 0;
const COMM_SEND: usize = 64;

impl Comm {
    pub(super) fn new(
        pd: &Pd,
        dev: &Device,
        client: bool,
        timeout: Duration,
    ) -> Result<Comm, RdmaError> {
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

    pub(super) fn post_recv(&self) -> Result<(), RdmaError> {
        Ok(self.qp.post_recv(&RecvWr {
            wr_id: 1,
            sg_list: &[self.mr.sge(COMM_RECV, DEST_LEN as u32)],
        })?)
    }

    pub(super) fn send(&self, m: &[u8], what: &str) -> Result<(), RdmaError> {
        self.buf.write(COMM_SEND, m);
        self.qp.post_send(&SendWr {
            wr_id: 2,
            op: SendOp::Send,
            sg_list: &[self.mr.sge(COMM_SEND, m.len() as u32)],
            flags: SendFlags::SIGNALED,
        })?;
        wait(&self.scq, &self.qp, progress(self.timeout), what).map(|_| ())
    }

    pub(super) fn recv(&self, len: usize, what: &str) -> Result<Vec<u8>, RdmaError> {
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
    pub(super) fn xchg(&self, mine: &[u8], what: &str) -> Result<Vec<u8>, RdmaError> {
        if self.client {
            self.send(mine, what)?;
            self.recv(mine.len(), what)
        } else {
            let theirs = self.recv(mine.len(), what)?;
            self.send(mine, what)?;
            Ok(theirs)
        }
    }

    pub(super) fn dest(&self, mine: &PingpongDest, what: &str) -> Result<PingpongDest, RdmaError> {
        PingpongDest::parse(&self.xchg(&mine.encode(), what)?)
    }
}

/// What both sides agreed on in the first exchanges.
pub(super) struct Sys {
    pub(super) cycle: usize,
    pub(super) cache_line: usize,
    pub(super) peer_version: String,
}

pub(super) fn exchange_sys(comm: &Comm, dev: &Device) -> Result<Sys, RdmaError> {
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

pub(super) fn unspecified_like(a: &SocketAddr) -> IpAddr {
    if a.is_ipv4() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    }
}

/// `connect`, retrying while the server's port refuses connections (perftest's server
/// listens for the data connection only after it answered the first block; its client
/// retries the same way).
pub(super) fn connect_retry(
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
