//! Small OS helpers of the runtime: the event thread's wake-up eventfd, interface
//! addresses (for the CLC same-LAN facts, RFC 7609 §3.5.1.2), RST on close and fd counts.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A Linux eventfd used to wake the event thread out of `poll()`.
#[derive(Debug)]
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    pub(crate) fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub(crate) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our own eventfd.
        unsafe {
            libc::write(
                self.0.as_raw_fd(),
                (&one as *const u64).cast::<libc::c_void>(),
                8,
            )
        };
    }

    pub(crate) fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64 from our own non-blocking eventfd.
        unsafe {
            libc::read(
                self.0.as_raw_fd(),
                (&mut v as *mut u64).cast::<libc::c_void>(),
                8,
            )
        };
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// One address of a local interface.
#[derive(Clone, Debug)]
pub(crate) struct IfAddr {
    pub name: String,
    pub addr: IpAddr,
    pub prefix_len: u8,
}

/// How long interface addresses are cached (every rendezvous needs them; a netlink dump
/// per connection would cost more than the rest of the rendezvous' local work).
const IF_CACHE: std::time::Duration = std::time::Duration::from_secs(2);

/// Every address of every interface (getifaddrs), cached for a short while.
pub(crate) fn if_addrs() -> Vec<IfAddr> {
    static CACHE: std::sync::Mutex<Option<(std::time::Instant, Vec<IfAddr>)>> =
        std::sync::Mutex::new(None);
    let mut c = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((t, v)) = c.as_ref() {
        if t.elapsed() < IF_CACHE {
            return v.clone();
        }
    }
    let v = if_addrs_now();
    *c = Some((std::time::Instant::now(), v.clone()));
    v
}

fn if_addrs_now() -> Vec<IfAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_netmask.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: sa_family is readable for any sockaddr.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        if family == libc::AF_INET {
            // SAFETY: the family says these are sockaddr_in.
            let (a, m) = unsafe {
                (
                    &*(ifa.ifa_addr as *const libc::sockaddr_in),
                    &*(ifa.ifa_netmask as *const libc::sockaddr_in),
                )
            };
            let addr = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            let mask = u32::from_be(m.sin_addr.s_addr);
            out.push(IfAddr {
                name,
                addr: IpAddr::V4(addr),
                prefix_len: mask.count_ones() as u8,
            });
        } else if family == libc::AF_INET6 {
            // SAFETY: the family says these are sockaddr_in6.
            let (a, m) = unsafe {
                (
                    &*(ifa.ifa_addr as *const libc::sockaddr_in6),
                    &*(ifa.ifa_netmask as *const libc::sockaddr_in6),
                )
            };
            let addr = Ipv6Addr::from(a.sin6_addr.s6_addr);
            let mask = u128::from_be_bytes(m.sin6_addr.s6_addr);
            out.push(IfAddr {
                name,
                addr: IpAddr::V6(addr),
                prefix_len: mask.count_ones() as u8,
            });
        }
    }
    // SAFETY: frees the list getifaddrs allocated; no node is used afterwards.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// `addr` with the host bits of a `prefix`-bit prefix cleared.
pub(crate) fn masked(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let m = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(prefix.min(32)))
            };
            IpAddr::V4((u32::from(a) & m).into())
        }
        IpAddr::V6(a) => {
            let m = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(prefix.min(128)))
            };
            IpAddr::V6((u128::from(a) & m).into())
        }
    }
}

/// The interface address whose subnet holds `ip` (the interface a connection with this
/// local address uses; loopback aliases like 127.0.0.2 fall under lo's 127.0.0.1/8).
pub(crate) fn interface_of(ip: IpAddr) -> Option<IfAddr> {
    let all = if_addrs();
    if let Some(exact) = all.iter().find(|a| a.addr == ip) {
        return Some(exact.clone());
    }
    all.into_iter()
        .filter(|a| a.addr.is_ipv4() == ip.is_ipv4())
        .filter(|a| masked(a.addr, a.prefix_len) == masked(ip, a.prefix_len))
        .max_by_key(|a| a.prefix_len)
}

/// Every address of the interface named `name`.
pub(crate) fn addrs_of(name: &str) -> Vec<IfAddr> {
    if_addrs().into_iter().filter(|a| a.name == name).collect()
}

/// Close a TCP connection with RST (SO_LINGER 0), RFC 7609 C.5/C.6 and §4.8.2.
pub(crate) fn reset_tcp(tcp: TcpStream) {
    let sock = socket2::Socket::from(tcp);
    if let Err(e) = sock.set_linger(Some(std::time::Duration::ZERO)) {
        tracing::debug!(error = %e, "SO_LINGER 0 failed; closing normally");
    }
    drop(sock);
}

/// Open file descriptors of this process (for leak accounting in [`super::Stats`]).
pub(crate) fn count_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count().saturating_sub(1))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_alias_maps_to_lo() {
        let i = interface_of("127.0.0.2".parse().unwrap()).expect("lo");
        assert_eq!(
            masked(i.addr, i.prefix_len),
            masked("127.0.0.9".parse().unwrap(), i.prefix_len)
        );
    }

    #[test]
    fn eventfd_wakes_poll() {
        let e = EventFd::new().unwrap();
        e.wake();
        let mut p = libc::pollfd {
            fd: e.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 1);
        e.drain();
        p.revents = 0;
        // SAFETY: as above.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 0);
    }
}
