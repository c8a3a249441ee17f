//! The receive side of the UDP socket: one recvmmsg call per batch of up to
//! [`BATCH`] datagrams (with UDP GRO, each may hold a train of packets),
//! and the ICRC check every received packet must pass (CHECKLIST §C.2).
//!
//! recvmmsg with UDP_GRO control messages is called through libc: rustix
//! has no recvmmsg, and quinn-udp (whose receive path does this) cannot be
//! used for the socket (see [`crate::tx`]).

use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use crate::device::DevShared;
use crate::icrc::{self, IpInfo, IPV4_DF};
use crate::tx::{BATCH, SLOT, SOL_UDP};

/// UDP_GRO socket option and control message type (linux/udp.h).
const UDP_GRO: i32 = 104;

/// Has the kernel hand over GSO trains whole, with a UDP_GRO control
/// message giving the segment size (no per-segment trip through the
/// stack). Best effort: false (a kernel without UDP GRO, before 5.0) and
/// the packets arrive one by one.
pub(crate) fn enable_gro(sock: &socket2::Socket) -> bool {
    set_udp_opt(sock, UDP_GRO, 1)
}

/// Whether the kernel takes UDP_SEGMENT (UDP GSO, Linux 4.18): setting the
/// socket's default segment size to 0 (no GSO unless a message asks for it,
/// as we do per message) fails with ENOPROTOOPT where it is unknown.
pub(crate) fn has_udp_gso(sock: &socket2::Socket) -> bool {
    set_udp_opt(sock, crate::tx::UDP_SEGMENT, 0)
}

fn set_udp_opt(sock: &socket2::Socket, opt: i32, val: libc::c_int) -> bool {
    // SAFETY: setsockopt reads an int of the size passed from a live local;
    // `sock` is an open socket.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            SOL_UDP,
            opt,
            (&val as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    r == 0
}

/// Receive buffers of one batch (allocated once per device).
pub(crate) struct RxBatch {
    /// BATCH slots of `slot` bytes (64 KiB with UDP GRO, else SLOT).
    pub(crate) bufs: Vec<u8>,
    pub(crate) slot: usize,
    pub(crate) addrs: Box<[libc::sockaddr_storage; BATCH]>,
    ctrl: Box<[[u64; 4]; BATCH]>,
}

impl RxBatch {
    /// Buffers for [`BATCH`] datagrams of up to `slot` bytes (64 KiB with
    /// UDP GRO, else [`SLOT`]).
    /// Every page of them is resident (`crate::resident`): the kernel's
    /// copy into a page touched for the first time could wait for the
    /// process's mmap lock, and the device's receiving with it.
    pub(crate) fn new(slot: usize) -> RxBatch {
        debug_assert!(slot >= SLOT);
        let mut addrs: Box<[libc::sockaddr_storage; BATCH]> =
            // SAFETY: sockaddr_storage is plain old data.
            Box::new(unsafe { std::mem::zeroed() });
        let mut ctrl = Box::new([[0u64; 4]; BATCH]);
        // Small, but written by the kernel too: a store into each entry
        // (at most 128 bytes apart) reaches every page.
        for a in addrs.iter_mut() {
            a.ss_family = std::hint::black_box(0);
        }
        for c in ctrl.iter_mut() {
            c[0] = std::hint::black_box(0);
        }
        RxBatch {
            bufs: crate::resident::zeroed(slot * BATCH),
            slot,
            addrs,
            ctrl,
        }
    }
}

/// The address and port of a received datagram's sender.
pub(crate) fn sockaddr_ip(sa: &libc::sockaddr_storage) -> Option<(IpAddr, u16)> {
    match sa.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: family AF_INET means the storage holds a sockaddr_in.
            let sin = unsafe { &*(sa as *const _ as *const libc::sockaddr_in) };
            Some((
                IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes()),
                u16::from_be(sin.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: family AF_INET6 means a sockaddr_in6.
            let sin6 = unsafe { &*(sa as *const _ as *const libc::sockaddr_in6) };
            Some((
                IpAddr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
            ))
        }
        _ => None,
    }
}

/// What one [`recv_batch`] received.
pub(crate) struct RecvResult {
    /// Datagrams received.
    pub(crate) len: usize,
    /// Length of each (0: truncated, too large for any packet).
    pub(crate) lens: [usize; BATCH],
    /// GRO segment size per datagram (0: one packet).
    pub(crate) segs: [usize; BATCH],
}

/// Receives up to [`BATCH`] datagrams without blocking.
pub(crate) fn recv_batch(dev: &DevShared, rx: &mut RxBatch) -> RecvResult {
    let mut iov: [libc::iovec; BATCH] = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; BATCH];
    // SAFETY: mmsghdr is plain old data.
    let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
    let slot = rx.slot;
    for (i, (io, h)) in iov.iter_mut().zip(hdrs.iter_mut()).enumerate() {
        io.iov_base = rx.bufs[i * slot..].as_mut_ptr() as *mut libc::c_void;
        io.iov_len = slot;
        h.msg_hdr.msg_name = &mut rx.addrs[i] as *mut _ as *mut libc::c_void;
        h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
        h.msg_hdr.msg_iov = io;
        h.msg_hdr.msg_iovlen = 1;
        if dev.gro {
            h.msg_hdr.msg_control = rx.ctrl[i].as_mut_ptr() as *mut libc::c_void;
            h.msg_hdr.msg_controllen = std::mem::size_of::<[u64; 4]>();
        }
    }
    // SAFETY: every header points at buffers owned by `rx`/this frame.
    let r = unsafe {
        libc::recvmmsg(
            dev.sock.as_raw_fd(),
            hdrs.as_mut_ptr(),
            BATCH as u32,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    let mut out = RecvResult {
        len: 0,
        lens: [0; BATCH],
        segs: [0; BATCH],
    };
    if r > 0 {
        out.len = r as usize;
        for (i, h) in hdrs[..r as usize].iter().enumerate() {
            // A truncated datagram is larger than any valid packet.
            out.lens[i] = if h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                0
            } else {
                h.msg_len as usize
            };
            if dev.gro && h.msg_hdr.msg_controllen > 0 {
                // SAFETY: walking the control buffer the kernel filled,
                // with the libc macros, within msg_controllen; the i32 is
                // read only from a message long enough to hold it.
                unsafe {
                    let mut c = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                    while !c.is_null() {
                        if (*c).cmsg_level == SOL_UDP
                            && (*c).cmsg_type == UDP_GRO
                            && (*c).cmsg_len as usize >= libc::CMSG_LEN(4) as usize
                        {
                            let v = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const i32);
                            out.segs[i] = v.max(0) as usize;
                        }
                        c = libc::CMSG_NXTHDR(&h.msg_hdr, c);
                    }
                }
            }
        }
    }
    out
}

/// Checks the ICRC of a received packet (see [`crate::icrc`] for the IPv4
/// identification problem).
pub(crate) fn icrc_ok(dev: &DevShared, src: IpAddr, sport: u16, pkt: &[u8]) -> bool {
    let local = dev.attr.local_addr;
    match (src, local) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let ip = IpInfo::V4 {
                src: s,
                dst: d,
                id: 0,
                flags_frag: IPV4_DF,
            };
            // One CRC pass: ID 0 verifies directly, any other ID is
            // recovered from the syndrome.
            match icrc::recover_ipv4_id(&ip, sport, dev.local_port, pkt) {
                Some(0) => true,
                Some(_) => {
                    dev.stats
                        .rx_icrc_id_recovered
                        .fetch_add(1, Ordering::Relaxed);
                    true
                }
                // RoCE senders set DF, but the flags are covered unmasked:
                // accept a sender that does not.
                None => {
                    let no_df = IpInfo::V4 {
                        src: s,
                        dst: d,
                        id: 0,
                        flags_frag: 0,
                    };
                    icrc::recover_ipv4_id(&no_df, sport, dev.local_port, pkt).is_some()
                }
            }
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            icrc::verify(&IpInfo::V6 { src: s, dst: d }, sport, dev.local_port, pkt)
        }
        _ => false,
    }
}
