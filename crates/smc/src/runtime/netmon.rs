//! Interface and address changes, from rtnetlink: a link fails as soon as the interface
//! of its device goes down or loses the device's address, not only when its QP gives up
//! retrying or TEST LINK goes unanswered (RFC 7609 §4.6: failover starts on the loss of
//! a link, whatever detects it). Linux learns the same from rxe's `IB_EVENT_PORT_ERR` on
//! `NETDEV_DOWN` and from the RoCE GID table losing the address (`smcr_port_err`).
//!
//! The socket only wakes the event thread: what changed is then read from getifaddrs
//! ([`smc_verbs::netdev::path_state`]) for the addresses that have devices, so no
//! netlink message is parsed and a lost notification (ENOBUFS) costs nothing but a
//! re-read.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use rustix::net::netlink::SocketAddrNetlink;
use rustix::net::{AddressFamily, RecvFlags, SocketFlags, SocketType};

/// `RTMGRP_LINK`, `RTMGRP_IPV4_IFADDR`, `RTMGRP_IPV6_IFADDR` (linux/rtnetlink.h): link
/// state and address additions/removals.
const GROUPS: u32 = 0x1 | 0x10 | 0x100;

/// An rtnetlink socket subscribed to link and address notifications (non-blocking).
pub(crate) struct NetMon {
    fd: OwnedFd,
}

impl NetMon {
    pub(crate) fn open() -> io::Result<NetMon> {
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::RAW,
            SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            None, // NETLINK_ROUTE is protocol 0
        )?;
        rustix::net::bind(&fd, &SocketAddrNetlink::new(0, GROUPS))?;
        Ok(NetMon {
            fd: smc_verbs::process::lift(fd),
        })
    }

    /// Reads every pending notification; true if there was any (or some were lost to
    /// a full socket buffer, which also means something changed).
    pub(crate) fn drain(&self, buf: &mut [u8]) -> bool {
        let mut any = false;
        loop {
            match rustix::net::recv(&self.fd, &mut *buf, RecvFlags::DONTWAIT) {
                Ok(_) => any = true,
                Err(rustix::io::Errno::NOBUFS) => any = true,
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => return any,
            }
        }
    }
}

impl AsRawFd for NetMon {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_and_has_nothing_pending_at_first() {
        let m = NetMon::open().expect("an rtnetlink socket needs no privilege");
        let mut buf = [0u8; 256];
        // Nothing changed since it was opened (unless another test's interface did:
        // then draining must still end, which is what this checks).
        let _ = m.drain(&mut buf);
        assert!(!m.drain(&mut buf));
    }
}
