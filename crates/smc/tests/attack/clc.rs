//! CLC over a raw TCP socket: well-formed messages built with `smc-wire`, and the means
//! to send anything else (truncated, oversized, lying lengths, garbage).

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use arrayvec::ArrayVec;
use smc_wire::clc::{
    AcceptConfirmRepr, ClcMessage, DeclineRepr, Eyecatcher, IpArea, PathType, ProposalBody,
    ProposalRepr, ProposalV2Ext, SmcdArea, V1Area,
};
use smc_wire::common::{Eid, Gid, Mac, PeerId};
use smc_wire::decline::DeclineCode;

/// A TCP connection from `local` (port chosen by the kernel) to `to`.
pub fn tcp_from(local: IpAddr, to: SocketAddr) -> io::Result<TcpStream> {
    let domain = if local.is_ipv4() {
        socket2::Domain::IPV4
    } else {
        socket2::Domain::IPV6
    };
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, None)?;
    s.bind(&SocketAddr::new(local, 0).into())?;
    s.connect_timeout(&to.into(), Duration::from_secs(5))?;
    let t: TcpStream = s.into();
    t.set_nodelay(true)?;
    Ok(t)
}

/// An SMC-Rv1 Proposal in the RFC 7609 layout (header version 1, IPv4 127.0.0.0/8).
pub fn proposal(peer_id: PeerId, gid: Gid, mac: Mac) -> Vec<u8> {
    ClcMessage::Proposal(ProposalRepr {
        eyecatcher: Eyecatcher::Smcr,
        version: 1,
        typev1: PathType::R,
        typev2: PathType::R,
        peer_id,
        gid,
        mac,
        body: ProposalBody::V1 {
            area: V1Area::None,
            ip: IpArea {
                subnet: Ipv4Addr::new(127, 0, 0, 0),
                prefix_len: 8,
                ipv6_prefixes: ArrayVec::new(),
            },
        },
    })
    .to_vec()
    .expect("Proposal encodes")
}

/// An SMC-Rv2-only Proposal (header version 2, no IP area, the v2 extension with one
/// UEID, release 1, one link per link group), the layout Linux sends for v2 only.
pub fn proposal_v2(peer_id: PeerId, gid: Gid, mac: Mac, ueid: Eid) -> Vec<u8> {
    let mut eids = ArrayVec::new();
    eids.push(ueid);
    ClcMessage::Proposal(ProposalRepr {
        eyecatcher: Eyecatcher::Smcr,
        version: 2,
        typev1: PathType::N,
        typev2: PathType::R,
        peer_id,
        gid,
        mac,
        body: ProposalBody::V2 {
            smcd: SmcdArea::default(),
            ip: None,
            v2: Some(ProposalV2Ext {
                eids,
                release: 1,
                seid: false,
                roce_gid: gid,
                max_conns: 255,
                max_links: 1,
                feature_mask: 0,
                smcd: None,
            }),
        },
    })
    .to_vec()
    .expect("v2 Proposal encodes")
}

/// A v1 Decline (28 bytes), with or without the out-of-sync (S) flag.
pub fn decline(peer_id: PeerId, out_of_sync: bool, code: DeclineCode) -> Vec<u8> {
    ClcMessage::Decline(DeclineRepr {
        eyecatcher: Eyecatcher::Smcr,
        version: 1,
        out_of_sync,
        peer_id,
        diagnosis: code,
        os_type: 0,
        diagnosis_v2: None,
    })
    .to_vec()
    .expect("Decline encodes")
}

/// An Accept (`accept`) or Confirm (`!accept`).
pub fn accept_confirm(accept: bool, r: &AcceptConfirmRepr) -> Vec<u8> {
    let m = if accept {
        ClcMessage::Accept(r.clone())
    } else {
        ClcMessage::Confirm(r.clone())
    };
    m.to_vec().expect("Accept/Confirm encodes")
}

/// Reads one CLC message by its header's length (no validation beyond the length).
pub fn read_clc(s: &mut TcpStream, t: Duration) -> io::Result<Vec<u8>> {
    s.set_read_timeout(Some(t))?;
    let mut h = [0u8; 8];
    s.read_exact(&mut h)?;
    let len = usize::from(u16::from_be_bytes([h[5], h[6]]));
    if len < 8 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "CLC length < 8"));
    }
    let mut m = h.to_vec();
    m.resize(len, 0);
    s.read_exact(&mut m[8..])?;
    Ok(m)
}

/// Reads and parses one CLC message.
pub fn read_msg(s: &mut TcpStream, t: Duration) -> io::Result<ClcMessage> {
    let b = read_clc(s, t)?;
    ClcMessage::parse(&b).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad CLC from the victim: {e}"),
        )
    })
}

/// How a TCP connection the attacker holds ended (or not) within `t`.
#[derive(Debug, PartialEq, Eq)]
pub enum TcpEnd {
    /// Orderly close (FIN) with this many bytes read before it.
    Closed(usize),
    /// Reset.
    Reset(usize),
    /// Still open after `t`, with this many bytes read.
    Open(usize),
}

/// Reads (and discards) until the victim closes or resets the connection, or `t` passes.
pub fn wait_end(s: &mut TcpStream, t: Duration) -> TcpEnd {
    let end = Instant::now() + t;
    let mut n = 0;
    let mut b = [0u8; 4096];
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return TcpEnd::Open(n);
        }
        let _ = s.set_read_timeout(Some(left.max(Duration::from_millis(1))));
        match s.read(&mut b) {
            Ok(0) => return TcpEnd::Closed(n),
            Ok(k) => n += k,
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut =>
            {
                return TcpEnd::Open(n)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return TcpEnd::Reset(n),
        }
    }
}

/// Writes everything, ignoring a peer that already reset the connection.
pub fn send_all(s: &mut TcpStream, b: &[u8]) -> bool {
    s.write_all(b).is_ok()
}
