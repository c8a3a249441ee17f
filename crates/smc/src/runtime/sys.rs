//! Small OS helpers of the runtime: the event thread's wake-up eventfd, interface
//! addresses (for the CLC same-LAN facts, RFC 7609 §3.5.1.2), RST on close and fd counts.

use std::net::{IpAddr, TcpStream};

/// One address of a local interface (the workspace's one getifaddrs).
pub(crate) use smc_verbs::netdev::IfAddr;
/// The event thread's wake-up (the workspace's one eventfd implementation).
pub(crate) use smc_verbs::EventFd;

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
    // Addresses without a netmask (prefix length 0) name no subnet.
    smc_verbs::netdev::if_addrs()
        .into_iter()
        .filter(|a| a.prefix_len > 0)
        .collect()
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

/// Binds a client socket to `ip` and lets `connect()` choose the port
/// (IP_BIND_ADDRESS_NO_PORT, ip(7)): a `bind()` to port 0 picks the port alone, and
/// with thousands of sockets on the address the kernel's search for one without a
/// conflict costs time linear in their number (issue 15: 10,000 connections from one
/// address took 40 s, most of it in `inet_csk_get_port`); `connect()` needs only the
/// four-tuple to be unique.
pub(crate) fn bind_no_port(sock: &socket2::Socket, ip: IpAddr) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: setsockopt on a socket we own, with a pointer to a live c_int and its size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "IP_BIND_ADDRESS_NO_PORT");
    }
    sock.bind(&std::net::SocketAddr::new(ip, 0).into())
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
        use smc_verbs::event::wait_readable;
        use std::os::fd::AsFd;
        use std::time::Duration;
        let e = EventFd::new().unwrap();
        e.wake();
        assert!(wait_readable(e.as_fd(), Some(Duration::ZERO)).unwrap());
        e.drain();
        assert!(!wait_readable(e.as_fd(), Some(Duration::ZERO)).unwrap());
    }
}
