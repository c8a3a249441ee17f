//! The device's view of the network (rxe_net.c's job): UDP sockets for
//! RoCEv2, the netdev that carries an address (its MTU and MAC), and the
//! path MTU that fits it.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;

use smc_verbs::{Gid, Mac, Mtu};
use socket2::{Domain, Protocol, Socket, Type};

/// The netdev carrying `ip`, with its MTU and MAC, from getifaddrs and
/// sysfs.
pub(crate) fn netdev_for(ip: IpAddr) -> Option<(String, usize, Option<Mac>)> {
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `ifap` with a list we free below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return None;
    }
    let mut found = None;
    let mut p = ifap;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list returned by getifaddrs.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points at a sockaddr of the
        // family it declares.
        let fam = unsafe { (*ifa.ifa_addr).sa_family } as i32;
        let addr = match fam {
            libc::AF_INET => {
                // SAFETY: family AF_INET means a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes())
            }
            libc::AF_INET6 => {
                // SAFETY: family AF_INET6 means a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                IpAddr::from(sin6.sin6_addr.s6_addr)
            }
            _ => continue,
        };
        // Loopback: 127.0.0.1/8 covers every 127.x address we may bind.
        let matches = addr == ip
            || (ip.is_loopback() && addr.is_loopback() && addr.is_ipv4() == ip.is_ipv4());
        if matches {
            // SAFETY: ifa_name is a NUL-terminated string from the kernel.
            let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
                .to_string_lossy()
                .into_owned();
            found = Some(name);
            if addr == ip {
                break;
            }
        }
    }
    // SAFETY: freeing the list getifaddrs allocated.
    unsafe { libc::freeifaddrs(ifap) };
    let name = found?;
    let mtu = std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1500);
    let mac = std::fs::read_to_string(format!("/sys/class/net/{name}/address"))
        .ok()
        .and_then(|s| {
            let b: Vec<u8> = s
                .trim()
                .split(':')
                .filter_map(|x| u8::from_str_radix(x, 16).ok())
                .collect();
            (b.len() == 6 && b.iter().any(|&x| x != 0))
                .then(|| Mac([b[0], b[1], b[2], b[3], b[4], b[5]]))
        });
    Some((name, mtu, mac))
}

/// A locally administered MAC derived from the address (for netdevs
/// without one, e.g. loopback).
pub(crate) fn derived_mac(ip: IpAddr) -> Mac {
    let g = Gid::from_ip(ip).0;
    Mac([0x02, 0x00, g[12], g[13], g[14], g[15]])
}

pub(crate) fn setsockopt_int(fd: i32, level: i32, name: i32, v: i32) -> bool {
    // SAFETY: passing a valid pointer to an int of the stated size.
    unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &v as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as u32,
        ) == 0
    }
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
    setsockopt_int(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, 0);
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
    let sock = Socket::new(domain, Type::DGRAM.cloexec(), Some(Protocol::UDP))?;
    let fd = sock.as_raw_fd();
    if local.is_ipv4() {
        setsockopt_int(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        );
    } else {
        sock.set_only_v6(true)?;
        setsockopt_int(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        );
    }
    // Large buffers absorb bursts of a full send window; FORCE works as
    // root, else fall back to the capped variant.
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        let size = 8 << 20;
        if !setsockopt_int(fd, libc::SOL_SOCKET, force, size) {
            setsockopt_int(fd, libc::SOL_SOCKET, plain, size);
        }
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
