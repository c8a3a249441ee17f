//! The connection manager: an iWARP QP is bound to one TCP connection, set up by an MPA
//! Request/Reply exchange (RFC 5044 §7.1) with the RFC 6581 enhanced data. This plays the
//! part of Linux's `iw_cm`/`rdma_cm` for our provider:
//!
//! - [`connect`] (initiator / active side): TCP connect from the QP's device address, MPA
//!   Request, Reply, IRD/ORD adjustment and RTR (§9.1–§9.3), then the QP is in RTS;
//! - [`Listener`] (responder / passive side): [`Listener::accept`] reads a Request and
//!   hands it to the ULP as an [`Incoming`], which it accepts onto a QP or rejects.
//!
//! Policies follow Linux siw where RFC 5044 leaves a choice: markers are refused (a Request
//! asking for them gets a Reject; a Reply asking for them makes the initiator give up);
//! CRC is used when either side asks for it (the responder echoes C); a Request with S
//! gets an enhanced Reply, one without gets a plain one (RFC 6581 §10).

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use smc_verbs::{Qp, QpState, VerbsError};
use socket2::{Domain, SockRef, Socket, Type};

use crate::negotiate::{self, InitiatorDecision, ReadParams, ResponderDecision, Rtr};
use crate::qp::{terminate_stream, ConnSetup, Fence, IwQp, QpShared};
use crate::wire::ddp::{term, TerminateRepr};
use crate::wire::mpa::{frame_len, EnhancedData, FrameKind, MpaRepr, RtrSet, RR_HEADER_LEN};

/// What a side asks for when it connects or accepts.
#[derive(Clone, Debug)]
pub struct ConnParams {
    /// MPA revision to speak: 1 (RFC 5044 only) or 2.
    pub rev: u8,
    /// With rev 2: send the RFC 6581 enhanced data (S). Ignored by a responder, which
    /// mirrors the Request (RFC 6581 §10).
    pub enhanced: bool,
    /// Initiator: ask for the peer-to-peer model with an RTR (A).
    pub p2p: bool,
    /// Initiator: the RTR messages it can send (B/C/D); responder: those it accepts.
    pub rtr: RtrSet,
    /// IRD/ORD and limits.
    pub read: ReadParams,
    /// Ask for (initiator) or require (both) CRC32c on FPDUs.
    pub crc: bool,
    /// Initiator: ask for MPA markers (only to exercise a peer's refusal; we cannot send
    /// them).
    pub markers: bool,
    /// ULP private data (at most 512 bytes minus the enhanced data).
    pub private_data: Vec<u8>,
    /// Time allowed for TCP connect and the MPA exchange.
    pub timeout: Duration,
    /// Initiator: when an enhanced Request is answered by the peer closing the
    /// connection (a responder without RFC 6581), try once more with revision 1 (RFC 6581
    /// §10 MAY).
    pub retry_rev1: bool,
    /// Initiator: wait this long after the Reply before the first FPDU (the RTR or the
    /// ULP's first message). RFC 5044 needs no wait; Linux siw 6.12 does: its responder
    /// sends the Reply before it hands the socket to the QP (`siw_accept`:
    /// `siw_send_mpareqrep`, then `siw_qp_socket_assoc`) and never reads an FPDU that
    /// arrived in between. Under TCG that window is about a millisecond.
    pub first_fpdu_delay: Duration,
}

impl Default for ConnParams {
    fn default() -> Self {
        ConnParams {
            rev: 2,
            enhanced: true,
            p2p: false,
            rtr: RtrSet::ALL,
            read: ReadParams::default(),
            crc: false,
            markers: false,
            private_data: Vec::new(),
            timeout: Duration::from_secs(10),
            retry_rev1: false,
            first_fpdu_delay: Duration::ZERO,
        }
    }
}

/// What was negotiated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    /// Our TCP address.
    pub local: SocketAddr,
    /// The peer's TCP address.
    pub peer: SocketAddr,
    /// MPA revision in use.
    pub rev: u8,
    /// Enhanced (RFC 6581) establishment was used.
    pub enhanced: bool,
    /// CRC32c on FPDUs.
    pub crc: bool,
    /// Our IRD.
    pub ird: u16,
    /// Our ORD.
    pub ord: u16,
    /// The peer's IRD and ORD as it sent them (RFC 6581 §9.1: passed to the ULP, IO-5).
    pub peer_ird_ord: Option<(u16, u16)>,
    /// Peer-to-peer model.
    pub p2p: bool,
    /// RTR options of the Reply (initiator) or offered in it (responder).
    pub rtr_options: RtrSet,
    /// The RTR the initiator sent (initiator side).
    pub rtr: Option<Rtr>,
    /// The peer's ULP private data.
    pub peer_private_data: Vec<u8>,
}

/// Why a connection could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum CmError {
    /// A TCP call failed.
    #[error("TCP: {0}")]
    Io(#[from] std::io::Error),
    /// The peer answered with a Reject (R = 1).
    #[error("rejected by the peer (its IRD/ORD: {peer_ird_ord:?})")]
    Rejected {
        /// The enhanced data of the Reject, passed to the ULP (RFC 6581 §9.1, IO-10).
        peer_ird_ord: Option<(u16, u16)>,
        /// Its private data.
        private_data: Vec<u8>,
    },
    /// The peer closed the TCP connection during the MPA exchange.
    #[error("the peer closed the TCP connection during the MPA exchange")]
    Closed,
    /// The exchange broke an MPA/RFC 6581 rule; the connection was closed.
    #[error("MPA: {0}")]
    Protocol(String),
    /// We refused the peer's parameters (markers, CRC, IRD) and told it so.
    #[error("refused: {0}")]
    Refused(String),
    /// We sent a Terminate after the Reply (RFC 6581 §8: insufficient IRD, no matching RTR).
    #[error("terminated: {0}")]
    Terminated(String),
    /// The QP is not an iWARP QP in INIT.
    #[error("verbs: {0}")]
    Verbs(#[from] VerbsError),
}

fn iw_qp(qp: &Qp) -> Result<Arc<QpShared>, CmError> {
    let s =
        qp.0.as_any()
            .downcast_ref::<IwQp>()
            .map(|q| q.shared.clone())
            .ok_or(VerbsError::WrongDevice)?;
    match qp.state() {
        QpState::Init => Ok(s),
        st => Err(VerbsError::InvalidState(st).into()),
    }
}

fn read_frame(s: &mut TcpStream) -> Result<Vec<u8>, CmError> {
    let mut hdr = [0u8; RR_HEADER_LEN];
    s.read_exact(&mut hdr).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset => CmError::Closed,
        _ => CmError::Io(e),
    })?;
    let n = frame_len(&hdr).map_err(|e| CmError::Protocol(e.to_string()))?;
    let mut v = vec![0u8; n];
    v[..RR_HEADER_LEN].copy_from_slice(&hdr);
    s.read_exact(&mut v[RR_HEADER_LEN..])
        .map_err(|_| CmError::Closed)?;
    Ok(v)
}

fn write_frame(s: &mut TcpStream, r: &MpaRepr<'_>) -> Result<(), CmError> {
    let mut b = vec![0u8; r.buffer_len()];
    r.emit(&mut b)
        .map_err(|e| CmError::Protocol(e.to_string()))?;
    s.write_all(&b)?;
    Ok(())
}

/// Largest ULPDU such that an FPDU fits one TCP segment of the connection (RFC 5044 §5:
/// MULPDU from the EMSS), capped by the configuration.
fn mulpdu(s: &TcpStream, cap: usize) -> usize {
    let mss = SockRef::from(s).tcp_mss().unwrap_or(1460).max(128) as usize;
    // 2 + u + 4 <= mss with 2 + u a multiple of 4 (no pad).
    let u = ((mss - 6) / 4) * 4 - 2;
    u.min(cap).clamp(64, 65_532)
}

fn tcp_connect(local: IpAddr, remote: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    let sock = Socket::new(Domain::for_address(remote), Type::STREAM, None)?;
    if !local.is_unspecified() && local.is_ipv4() == remote.is_ipv4() {
        sock.bind(&SocketAddr::new(local, 0).into())?;
    }
    sock.connect_timeout(&remote.into(), timeout)?;
    let s: TcpStream = sock.into();
    s.set_nodelay(true)?;
    Ok(s)
}

/// Connects `qp` (in INIT) to an iWARP listener at `remote` and moves it to RTS. Returns
/// once the QP may be used: after the RTR was sent in peer-to-peer mode (RFC 6581 §5).
pub fn connect(qp: &Qp, remote: SocketAddr, p: &ConnParams) -> Result<Connection, CmError> {
    match connect_once(qp, remote, p) {
        Err(CmError::Closed) if p.retry_rev1 && p.rev >= 2 && p.enhanced => {
            tracing::info!(%remote, "enhanced MPA Request closed by the peer; retrying with revision 1");
            let mut q = p.clone();
            q.rev = 1;
            q.enhanced = false;
            q.p2p = false;
            connect_once(qp, remote, &q)
        }
        r => r,
    }
}

fn connect_once(qp: &Qp, remote: SocketAddr, p: &ConnParams) -> Result<Connection, CmError> {
    connect_shared(&iw_qp(qp)?, remote, p)
}

/// [`connect`] on the provider's QP object (SMC-R link mode).
pub(crate) fn connect_shared(
    shared: &Arc<QpShared>,
    remote: SocketAddr,
    p: &ConnParams,
) -> Result<Connection, CmError> {
    let dev = shared.dev.clone();
    let mut s = tcp_connect(dev.attr.local_addr, remote, p.timeout)?;
    s.set_read_timeout(Some(p.timeout))?;
    let rev = p.rev.clamp(1, 2);
    let sent = (rev >= 2 && p.enhanced).then_some(EnhancedData {
        p2p: p.p2p,
        rtr: if p.p2p { p.rtr } else { RtrSet::NONE },
        ird: p.read.ird,
        ord: p.read.ord,
    });
    // RFC 6581 §10 (IN-5): no enhanced format unless wanted; rev 1 never carries S.
    write_frame(
        &mut s,
        &MpaRepr {
            kind: FrameKind::Request,
            markers: p.markers,
            crc: p.crc,
            reject: false,
            rev,
            enhanced: sent,
            ulp_data: &p.private_data,
        },
    )?;
    let raw = read_frame(&mut s)?;
    let reply =
        MpaRepr::parse_bytes(&raw).map_err(|e| CmError::Protocol(format!("bad MPA Reply: {e}")))?;
    if reply.kind != FrameKind::Reply {
        return Err(CmError::Protocol(
            "expected an MPA Reply, got a Request".into(),
        ));
    }
    let peer_ird_ord = reply.enhanced.map(|e| (e.ird, e.ord));
    if reply.reject {
        return Err(CmError::Rejected {
            peer_ird_ord,
            private_data: reply.ulp_data.to_vec(),
        });
    }
    if reply.markers {
        return Err(CmError::Refused(
            "the responder wants MPA markers, which this implementation does not send (as Linux siw)".into(),
        ));
    }
    if p.crc && !reply.crc {
        return Err(CmError::Refused(
            "CRC required but the responder did not agree".into(),
        ));
    }
    let crc = reply.crc;
    let local_read = ReadParams {
        max_ird: dev.config.max_ird,
        ..p.read
    };
    let (ird, ord, rtr, rtr_options) = match (sent, reply.enhanced) {
        (Some(sent), Some(rep)) => {
            if reply.rev < 2 {
                return Err(CmError::Protocol(format!(
                    "enhanced Reply with revision {}",
                    reply.rev
                )));
            }
            match negotiate::initiator(&sent, &rep, &local_read, p.rtr) {
                InitiatorDecision::Proceed { ird, ord, rtr } => {
                    (ird, ord, rtr, rep.effective_rtr())
                }
                InitiatorDecision::Terminate { code } => {
                    let t = TerminateRepr::new(term::LAYER_LLP, term::LLP_MPA, code);
                    let _ = terminate_stream(&mut s, code, crc);
                    return Err(CmError::Terminated(t.describe()));
                }
            }
        }
        (Some(_), None) => {
            // RFC 6581 §10 (IN-2): an enhanced responder MUST answer enhanced.
            let _ = terminate_stream(&mut s, term::MPA_INVALID_RR, crc);
            return Err(CmError::Protocol(
                "enhanced Request answered without enhanced data".into(),
            ));
        }
        (None, _) => (p.read.ird, p.read.ord, None, RtrSet::NONE),
    };
    let conn = Connection {
        local: s.local_addr()?,
        peer: s.peer_addr()?,
        rev: reply.rev,
        enhanced: sent.is_some(),
        crc,
        ird,
        ord,
        peer_ird_ord,
        p2p: sent.is_some_and(|e| e.p2p),
        rtr_options,
        rtr,
        peer_private_data: reply.ulp_data.to_vec(),
    };
    let setup = ConnSetup {
        crc,
        mulpdu: mulpdu(&s, dev.config.max_ulpdu),
        ird,
        ord,
        fence: Fence::None,
        send_rtr: rtr,
    };
    if !p.first_fpdu_delay.is_zero() {
        std::thread::sleep(p.first_fpdu_delay);
    }
    shared.attach(s, setup)?;
    tracing::debug!(
        qpn = shared.qpn,
        ?conn,
        "iWARP connection established (initiator)"
    );
    Ok(conn)
}

/// A passive endpoint.
pub struct Listener {
    l: TcpListener,
    timeout: Duration,
}

/// An MPA Request waiting for the ULP's accept or reject.
pub struct Incoming {
    s: TcpStream,
    peer: SocketAddr,
    rev: u8,
    crc: bool,
    enhanced: Option<EnhancedData>,
    private_data: Vec<u8>,
}

impl Listener {
    /// Listens on `addr`.
    pub fn bind(addr: SocketAddr) -> std::io::Result<Listener> {
        let sock = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
        sock.set_reuse_address(true)?;
        sock.bind(&addr.into())?;
        sock.listen(128)?;
        Ok(Listener {
            l: sock.into(),
            timeout: Duration::from_secs(10),
        })
    }
    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.l.local_addr()
    }
    /// Time allowed for the peer's MPA Request.
    pub fn set_timeout(&mut self, t: Duration) {
        self.timeout = t;
    }

    /// Accepts one TCP connection and reads its MPA Request. Requests that cannot be
    /// served are answered here (markers: Reject, as siw) or closed (malformed, unknown
    /// revision) and reported as an error; the listener stays usable.
    pub fn accept(&self) -> Result<Incoming, CmError> {
        let (s, peer) = self.l.accept()?;
        Incoming::read(s, peer, self.timeout)
    }

    /// [`Listener::accept`], giving up with [`std::io::ErrorKind::TimedOut`] when no TCP
    /// connection arrives within `wait` (a ULP that expects one more connection from a peer
    /// it already talks to, e.g. perftest's data connection, must not wait for ever).
    pub fn accept_within(&self, wait: Duration) -> Result<Incoming, CmError> {
        let deadline = std::time::Instant::now() + wait;
        self.l.set_nonblocking(true)?;
        let r = loop {
            match self.l.accept() {
                Ok(x) => break Ok(x),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if std::time::Instant::now() >= deadline {
                        break Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "no connection arrived in time",
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => break Err(e),
            }
        };
        self.l.set_nonblocking(false)?;
        let (s, peer) = r?;
        // Linux does not pass O_NONBLOCK to accepted sockets; say so anyway, the MPA
        // exchange relies on blocking reads with a timeout.
        s.set_nonblocking(false)?;
        Incoming::read(s, peer, self.timeout)
    }
}

impl Incoming {
    /// Reads the MPA Request of an accepted TCP connection (see [`Listener::accept`]).
    pub(crate) fn read(
        mut s: TcpStream,
        peer: SocketAddr,
        timeout: Duration,
    ) -> Result<Incoming, CmError> {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        let raw = read_frame(&mut s)?;
        let req = match MpaRepr::parse_bytes(&raw) {
            Ok(r) if r.kind == FrameKind::Request => r,
            Ok(_) => {
                return Err(CmError::Protocol(
                    "expected an MPA Request, got a Reply".into(),
                ))
            }
            // RFC 5044 §7.1.1: a malformed Request closes the connection.
            Err(e) => return Err(CmError::Protocol(format!("bad MPA Request: {e}"))),
        };
        if req.rev == 0 || req.rev > 2 {
            return Err(CmError::Protocol(format!(
                "MPA revision {} not supported",
                req.rev
            )));
        }
        if req.markers {
            // Linux siw: markers are not supported; Reject without markers.
            write_frame(
                &mut s,
                &MpaRepr {
                    kind: FrameKind::Reply,
                    markers: false,
                    crc: req.crc,
                    reject: true,
                    rev: req.rev,
                    enhanced: None,
                    ulp_data: &[],
                },
            )?;
            return Err(CmError::Refused(
                "the initiator asked for MPA markers".into(),
            ));
        }
        Ok(Incoming {
            peer,
            rev: req.rev,
            crc: req.crc,
            enhanced: req.enhanced,
            private_data: req.ulp_data.to_vec(),
            s,
        })
    }

    /// The initiator's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }
    /// MPA revision of the Request.
    pub fn rev(&self) -> u8 {
        self.rev
    }
    /// The Request asked for CRC.
    pub fn crc(&self) -> bool {
        self.crc
    }
    /// The enhanced data of the Request (its IRD/ORD and model, passed to the ULP as RFC
    /// 6581 §9.1 requires).
    pub fn enhanced(&self) -> Option<EnhancedData> {
        self.enhanced
    }
    /// The initiator's ULP private data.
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// Accepts onto `qp` (in INIT): MPA Reply, then RTS. In peer-to-peer mode the QP sends
    /// nothing until the RTR arrives; in client-server mode nothing until the initiator's
    /// first FPDU (RFC 5044 §7.1.2; RFC 6581 §3 MPA fencing).
    pub fn accept(self, qp: &Qp, p: &ConnParams) -> Result<Connection, CmError> {
        self.accept_shared(&iw_qp(qp)?, p)
    }

    /// [`Incoming::accept`] on the provider's QP object (SMC-R link mode).
    pub(crate) fn accept_shared(
        mut self,
        shared: &Arc<QpShared>,
        p: &ConnParams,
    ) -> Result<Connection, CmError> {
        let dev = shared.dev.clone();
        let crc = self.crc || p.crc;
        let local_read = ReadParams {
            max_ird: dev.config.max_ird.min(p.read.max_ird),
            ..p.read
        };
        let (reply_enh, ird, ord, p2p) = match self.enhanced {
            Some(req) => {
                let supported = if p.rtr.is_empty() { RtrSet::ALL } else { p.rtr };
                match negotiate::responder(&req, &local_read, supported) {
                    ResponderDecision::Accept {
                        reply,
                        ird,
                        ord,
                        p2p,
                    } => (Some(reply), ird, ord, p2p),
                    ResponderDecision::Reject { reply } => {
                        // AMB-M1: Reject carrying the ORD we need, then close.
                        write_frame(
                            &mut self.s,
                            &MpaRepr {
                                kind: FrameKind::Reply,
                                markers: false,
                                crc,
                                reject: true,
                                rev: self.rev,
                                enhanced: Some(reply),
                                ulp_data: &p.private_data,
                            },
                        )?;
                        return Err(CmError::Refused(format!(
                            "initiator IRD {} below the required ORD {}",
                            req.ird, reply.ord
                        )));
                    }
                }
            }
            // IN-3: a plain Request gets a plain Reply; IRD/ORD are the ULP's business.
            None => (None, p.read.ird, p.read.ord, false),
        };
        write_frame(
            &mut self.s,
            &MpaRepr {
                kind: FrameKind::Reply,
                markers: false,
                crc,
                reject: false,
                rev: self.rev,
                enhanced: reply_enh,
                ulp_data: &p.private_data,
            },
        )?;
        let conn = Connection {
            local: self.s.local_addr()?,
            peer: self.peer,
            rev: self.rev,
            enhanced: reply_enh.is_some(),
            crc,
            ird,
            ord,
            peer_ird_ord: self.enhanced.map(|e| (e.ird, e.ord)),
            p2p,
            rtr_options: reply_enh.map_or(RtrSet::NONE, |e| e.effective_rtr()),
            rtr: None,
            peer_private_data: self.private_data.clone(),
        };
        let setup = ConnSetup {
            crc,
            mulpdu: mulpdu(&self.s, dev.config.max_ulpdu),
            ird,
            ord,
            fence: if p2p { Fence::Rtr } else { Fence::FirstFpdu },
            send_rtr: None,
        };
        shared.attach(self.s, setup)?;
        tracing::debug!(
            qpn = shared.qpn,
            ?conn,
            "iWARP connection established (responder)"
        );
        Ok(conn)
    }

    /// Rejects the Request (R = 1) with `private_data`, then closes.
    pub fn reject(mut self, private_data: &[u8]) -> Result<(), CmError> {
        let enh = self.enhanced.map(|e| EnhancedData {
            p2p: e.p2p,
            rtr: RtrSet::NONE,
            ird: 0,
            ord: 0,
        });
        write_frame(
            &mut self.s,
            &MpaRepr {
                kind: FrameKind::Reply,
                markers: false,
                crc: self.crc,
                reject: true,
                rev: self.rev,
                enhanced: enh,
                ulp_data: private_data,
            },
        )?;
        Ok(())
    }
}
