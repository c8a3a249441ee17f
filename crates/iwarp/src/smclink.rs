//! SMC-R links over iWARP: a private extension between two smc-rs stacks, outside RFC
//! 7609 (which only says "adjustments to the rendezvous methods could enable it to run
//! over ... iWARP", §1.1.1; CHECKLIST AMB-M9). Both ends must opt in; the SMC-R layer
//! never offers it on the strength of the TCP option alone
//! ([`smc_verbs::Provider::private_transport`]).
//!
//! How the CLC (and LLC ADD LINK) fields map onto an iWARP QP set-up, so that the SMC-R
//! runtime stays as it is for RoCE (it calls `modify_to_rtr`/`modify_to_rts` with what
//! the peer advertised):
//!
//! | CLC field | RoCE meaning | here |
//! |---|---|---|
//! | GID | IPv4-mapped / IPv6 address of the RNIC port | the same: the IP address of the peer's device |
//! | MAC | Ethernet MAC of the port | `02:69:77:00:PP:PP`: the marker `02 69 77 00` ("\x02iw\0") and the TCP port of the peer device's link listener |
//! | QP number | the RC QP | the iWARP QP: named in the MPA private data so that the listener binds the TCP connection to it |
//! | PSN | initial packet sequence number | unused (TCP orders the stream) |
//! | path MTU | IBA MTU | unused (FPDUs follow the TCP MSS) |
//! | RKey / virtual address | of the RMB | STag / tagged offset (RFC 5040 §2.1) |
//!
//! The SMC-R client (or, for ADD LINK, the side that moves its QP first: RFC 7609
//! §3.5.1.6.1 has the client do it) initiates. Its `modify_to_rtr` connects TCP to the
//! peer's listener and sends an MPA Request (revision 2, RFC 6581 enhanced data,
//! peer-to-peer with a zero-length RDMA Write RTR) whose private data is
//! `"SMCR-IW1" | initiator QPN (u32 BE) | target QPN (u32 BE)`. The peer's listener thread
//! looks up the target QP (it exists since the Accept / ADD LINK that advertised it) and
//! accepts onto it; the server's own `modify_to_rtr`, after the CLC Confirm, then only
//! checks that its QP is connected to the QP and address the Confirm names. Peer-to-peer
//! mode is what lets the SMC-R server send the first message on the link (CONFIRM LINK)
//! although it is the MPA responder (RFC 6581 §4.3; CHECKLIST D.12, TC-MPA-26): its QP
//! transmits nothing until the RTR has arrived.

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use smc_verbs::{Mac, QpState, Result, RtrAttr, VerbsError};

use crate::cm::{self, ConnParams, Incoming};
use crate::device::DevShared;
use crate::qp::{QpShared, QpTable};
use crate::wire::mpa::RtrSet;

/// First bytes of the MPA private data of an SMC-R link connection.
pub const MAGIC: &[u8; 8] = b"SMCR-IW1";
/// The MAC prefix an SMC-R-over-iWARP device advertises.
pub const MAC_PREFIX: [u8; 4] = [0x02, 0x69, 0x77, 0x00];
/// How long an initiator waits for the peer's listener, and the responder's
/// `modify_to_rtr` for the initiator's connection.
const LINK_TIMEOUT: Duration = Duration::from_secs(5);

/// The MAC advertising a link listener on `port`.
pub fn mac_for_port(port: u16) -> Mac {
    let p = port.to_be_bytes();
    Mac([
        MAC_PREFIX[0],
        MAC_PREFIX[1],
        MAC_PREFIX[2],
        MAC_PREFIX[3],
        p[0],
        p[1],
    ])
}

/// The link listener port a MAC advertises, if it is an SMC-R-over-iWARP MAC.
pub fn port_from_mac(mac: Mac) -> Option<u16> {
    (mac.0[..4] == MAC_PREFIX)
        .then(|| u16::from_be_bytes([mac.0[4], mac.0[5]]))
        .filter(|&p| p != 0)
}

/// The MPA private data of a link connection.
pub fn private_data(initiator_qpn: u32, target_qpn: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&initiator_qpn.to_be_bytes());
    b[12..16].copy_from_slice(&target_qpn.to_be_bytes());
    b
}

/// Parses [`private_data`]: `(initiator QPN, target QPN)`.
pub fn parse_private_data(b: &[u8]) -> Option<(u32, u32)> {
    if b.len() != 16 || &b[..8] != MAGIC {
        return None;
    }
    let q = |at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    Some((q(8), q(12)))
}

fn link_params(pd: Vec<u8>) -> ConnParams {
    ConnParams {
        p2p: true,
        rtr: RtrSet {
            write: true,
            ..RtrSet::NONE
        },
        private_data: pd,
        timeout: LINK_TIMEOUT,
        ..ConnParams::default()
    }
}

/// The device's accept thread: every connection is handled on its own short-lived thread,
/// so a slow or silent peer cannot hold up others' links.
pub(crate) fn spawn_listener(
    l: TcpListener,
    dev: Weak<DevShared>,
    qps: Arc<QpTable>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("iw-smc-listen".into())
        .spawn(move || loop {
            let Ok((s, peer)) = l.accept() else {
                if dev.upgrade().is_none() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
                continue;
            };
            if dev.upgrade().is_none() {
                return;
            }
            let qps = qps.clone();
            let _ = std::thread::Builder::new()
                .name("iw-smc-accept".into())
                .spawn(move || {
                    if let Err(e) = accept_link(&qps, s, peer) {
                        tracing::debug!(%peer, error = %e, "SMC-R iWARP link connection refused");
                    }
                });
        })?;
    Ok(())
}

fn accept_link(
    qps: &QpTable,
    s: std::net::TcpStream,
    peer: SocketAddr,
) -> std::result::Result<(), cm::CmError> {
    let inc = Incoming::read(s, peer, LINK_TIMEOUT)?;
    let Some((iqpn, tqpn)) = parse_private_data(inc.private_data()) else {
        inc.reject(&[])?;
        return Err(cm::CmError::Refused("not an SMC-R link connection".into()));
    };
    let Some(qp) = qps.get(tqpn) else {
        inc.reject(&[])?;
        return Err(cm::CmError::Refused(format!("no QP {tqpn:#x}")));
    };
    {
        let mut g = qp.lock();
        if g.state != QpState::Init || g.link_claimed {
            drop(g);
            inc.reject(&[])?;
            return Err(cm::CmError::Refused(format!(
                "QP {tqpn:#x} is not waiting for a link"
            )));
        }
        g.link_claimed = true;
    }
    let r = inc.accept_shared(&qp, &link_params(Vec::new()));
    let mut g = qp.lock();
    match r {
        Ok(_) => {
            g.link_peer = Some((peer.ip(), iqpn));
            qp.cv.notify_all();
            Ok(())
        }
        Err(e) => {
            g.link_claimed = false;
            qp.cv.notify_all();
            Err(e)
        }
    }
}

fn same_ip(a: IpAddr, b: IpAddr) -> bool {
    let norm = |x: IpAddr| match x {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(x),
        v4 => v4,
    };
    norm(a) == norm(b)
}

/// `modify_to_rtr` of a QP in SMC-R link mode: connect to the peer QP (initiator), or
/// check the connection the listener accepted (responder).
pub(crate) fn modify_to_rtr(qp: &Arc<QpShared>, attr: &RtrAttr) -> Result<()> {
    let peer_ip = attr.ah.dgid.to_ip();
    let deadline = Instant::now() + LINK_TIMEOUT;
    {
        let mut g = qp.lock();
        // The listener is accepting onto this QP right now (the QP may already be in RTS
        // while the listener has not recorded the peer yet): wait for it.
        while g.link_claimed && g.link_peer.is_none() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            g = qp
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if let Some((ip, qpn)) = g.link_peer {
            if g.state == QpState::Rts && qpn == attr.dest_qpn && same_ip(ip, peer_ip) {
                return Ok(());
            }
            return Err(VerbsError::InvalidArgument(
                "iWARP link QP is connected to another peer QP than the one named",
            ));
        }
        if g.state != QpState::Init {
            return Err(VerbsError::InvalidTransition {
                from: g.state,
                to: QpState::Rtr,
            });
        }
        g.link_claimed = true;
    }
    let port = attr
        .ah
        .dmac
        .and_then(port_from_mac)
        .ok_or(VerbsError::InvalidArgument(
        "the peer advertised no SMC-R-over-iWARP endpoint (its MAC lacks the 02:69:77:00 marker)",
    ));
    let r = port.and_then(|port| {
        cm::connect_shared(
            qp,
            SocketAddr::new(peer_ip, port),
            &link_params(private_data(qp.qpn, attr.dest_qpn).to_vec()),
        )
        .map_err(|e| VerbsError::DeviceGone(format!("iWARP link connection: {e}")))
    });
    let mut g = qp.lock();
    match r {
        Ok(_) => {
            g.link_peer = Some((peer_ip, attr.dest_qpn));
            Ok(())
        }
        Err(e) => {
            g.link_claimed = false;
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_and_private_data_round_trip() {
        let m = mac_for_port(40123);
        assert_eq!(m.0[..4], MAC_PREFIX);
        assert_eq!(port_from_mac(m), Some(40123));
        assert_eq!(port_from_mac(Mac([2, 0x1a, 1, 2, 3, 4])), None);
        assert_eq!(port_from_mac(mac_for_port(0)), None);
        let pd = private_data(0x1234, 0xabcdef);
        assert_eq!(parse_private_data(&pd), Some((0x1234, 0xabcdef)));
        assert_eq!(parse_private_data(&pd[..15]), None);
        let mut bad = pd;
        bad[0] = b'X';
        assert_eq!(parse_private_data(&bad), None);
    }
}
