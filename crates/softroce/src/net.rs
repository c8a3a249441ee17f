//! The device's view of the network (rxe_net.c's job): UDP sockets for
//! RoCEv2, the netdev that carries an address (its MTU and MAC), and the
//! path MTU that fits it.

use std::net::{IpAddr, SocketAddr};

use rustix::net::sockopt::{self, Ipv4PathMtuDiscovery, Ipv6PathMtuDiscovery};
use smc_verbs::{netdev, Gid, Mac, Mtu};
use socket2::{Domain, Protocol, Socket, Type};

/// The netdev carrying `ip` (the one with that address; for loopback
/// addresses, lo), with its MTU and MAC (see [`smc_verbs::netdev`]).
pub(crate) fn netdev_for(ip: IpAddr) -> Option<(String, usize, Option<Mac>)> {
    let name = netdev::carrier_of(ip)?;
    let mtu = netdev::mtu(&name).unwrap_or(1500);
    let mac = netdev::mac(&name);
    Some((name, mtu, mac))
}

/// A locally administered MAC derived from the address (for netdevs
/// without one, e.g. loopback).
pub(crate) fn derived_mac(ip: IpAddr) -> Mac {
    let g = Gid::from_ip(ip).0;
    Mac([0x02, 0x00, g[12], g[13], g[14], g[15]])
}

/// A QP's own sending socket: UDP on `local`, an ephemeral source port
/// chosen by the kernel. Linux rxe gives each QP its own source port (a
/// hash of the QPN above 0xC000) so that ECMP spreads QPs over paths;
/// receivers take RoCEv2 by destination port 4791 whatever the source.
/// Unconnected and DF set like the device socket: Linux then sends IPv4 ID
/// 0, which our ICRC assumes (verifiers.md fact 6). Nothing is received on
/// it (peers send to 4791), so its receive buffer is minimal.
pub(crate) fn qp_socket(local: IpAddr) -> std::io::Result<(Socket, u16)> {
    let sock = udp_socket(local)?;
    // The kernel raises 0 to its minimum receive buffer.
    let _ = sockopt::set_socket_recv_buffer_size(&sock, 0);
    sock.bind(&SocketAddr::new(local, 0).into())?;
    let port = sock
        .local_addr()?
        .as_socket()
        .map(|a| a.port())
        .ok_or_else(|| std::io::Error::other("socket has no port"))?;
    Ok((sock, port))
}

/// A UDP socket for RoCEv2 on `local`'s family: DF set (IPv4 ID 0 on the
/// wire, verifiers.md fact 6), large buffers, not bound yet.
pub(crate) fn udp_socket(local: IpAddr) -> std::io::Result<Socket> {
    let domain = if local.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let sock = smc_verbs::process::lift(Socket::new(
        domain,
        Type::DGRAM.cloexec(),
        Some(Protocol::UDP),
    )?);
    // IP_PMTUDISC_DO: DF on every packet, never fragmented locally (and
    // IPv4 ID 0 on an unconnected socket, which the ICRC covers).
    if local.is_ipv4() {
        let _ = sockopt::set_ip_mtu_discover(&sock, Ipv4PathMtuDiscovery::DO);
    } else {
        sock.set_only_v6(true)?;
        let _ = sockopt::set_ipv6_mtu_discover(&sock, Ipv6PathMtuDiscovery::DO);
    }
    // Large buffers absorb bursts of a full send window; FORCE works as
    // root, else fall back to the capped variant.
    let size = 8 << 20;
    if sockopt::set_socket_recv_buffer_size_force(&sock, size).is_err() {
        let _ = sockopt::set_socket_recv_buffer_size(&sock, size);
    }
    if sockopt::set_socket_send_buffer_size_force(&sock, size).is_err() {
        let _ = sockopt::set_socket_send_buffer_size(&sock, size);
    }
    Ok(sock)
}

/// The largest IBA path MTU whose biggest packet fits a netdev MTU of
/// `netdev_mtu` bytes (Mtu256 if none does).
pub(crate) fn active_mtu_for(netdev_mtu: usize, ipv4: bool) -> Mtu {
    // RoCEv2 overhead of the largest packet, a WRITE Only with immediate:
    // IP (20/40) + UDP 8 + BTH 12 + RETH 16 + ImmDt 4 + ICRC 4 (a full
    // payload needs no pad: every IBA MTU is a multiple of 4).
    let overhead = if ipv4 { 20 } else { 40 } + 8 + 12 + 16 + 4 + 4;
    Mtu::largest_fitting(netdev_mtu.saturating_sub(overhead)).unwrap_or(Mtu::Mtu256)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{BthRepr, Opcode, PacketRepr, RethRepr};

    /// The largest packet of each path MTU: a WRITE Only with immediate
    /// (BTH + RETH + ImmDt + a full payload + ICRC), in an IP packet.
    fn largest_packet(mtu: Mtu, ipv4: bool) -> usize {
        let repr = PacketRepr {
            bth: BthRepr {
                opcode: Opcode::WriteOnlyImm,
                se: false,
                mig_req: false,
                pad_count: 0,
                pkey: 0xffff,
                resv8a: 0,
                dest_qp: 17,
                ack_req: true,
                resv7: 0,
                psn: 0,
            },
            reth: Some(RethRepr {
                va: 0,
                rkey: 0,
                dma_len: 0,
            }),
            aeth: None,
            imm: Some(0),
            atomic: None,
            atomic_ack: None,
        };
        let ip = if ipv4 { 20 } else { 40 };
        ip + 8 + repr.buffer_len(mtu.bytes())
    }

    /// Item 8: every packet of the chosen path MTU fits the netdev MTU,
    /// including the 4-byte ImmDt (else sending fails with EMSGSIZE: the
    /// sockets set DF); the next MTU up does not.
    #[test]
    fn path_mtu_fits_the_largest_packet() {
        for ipv4 in [true, false] {
            for mtu in Mtu::ALL {
                let need = largest_packet(mtu, ipv4);
                assert_eq!(active_mtu_for(need, ipv4), mtu, "netdev MTU {need}");
                if mtu > Mtu::Mtu256 {
                    assert!(
                        active_mtu_for(need - 1, ipv4) < mtu,
                        "netdev MTU {} gives {mtu:?}, whose WRITE with immediate needs {need}",
                        need - 1
                    );
                }
            }
            assert_eq!(active_mtu_for(1500, ipv4), Mtu::Mtu1024);
            assert_eq!(active_mtu_for(65_536, ipv4), Mtu::Mtu4096);
        }
    }
}
