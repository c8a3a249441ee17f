//! SO_RCVBUF / SO_SNDBUF that the program set on a TCP socket before `connect()` or
//! `listen()`: they size the SMC-R connection's RMB and send buffer (an accepted
//! connection's from its listener's, as TCP's accepted sockets inherit them), as Linux
//! sizes an SMC socket's buffers from sk_rcvbuf / sk_sndbuf. A socket without them gets
//! the stack's sizes (`SMC_RS_RMB_SIZE`, `SMC_RS_SNDBUF_SIZE`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use libc::c_int;
use smc::BufSizes;

use crate::lock::Mutex;

/// The file a size was set on (device, inode): a reused descriptor number is not it.
type File = (u64, u64);

/// Per descriptor: the file and the sizes.
static SET: Mutex<BTreeMap<c_int, (File, BufSizes)>> = Mutex::new(BTreeMap::new());
/// Anything recorded ever: `close()` looks here only then.
static ANY: AtomicBool = AtomicBool::new(false);

/// The buffer size in effect after `setsockopt`: the kernel doubles what was asked
/// and clamps it (net.core.rmem_max / wmem_max unless *FORCE); Linux SMC sizes its
/// buffers from sk_rcvbuf / 2 and sk_sndbuf / 2, so do we (the endpoint rounds up to
/// 16 KiB × 2^n, RFC 7609 A.2.3).
fn effective(fd: c_int, name: c_int) -> Option<usize> {
    let v = crate::real::sockopt_int(fd, libc::SOL_SOCKET, name)?;
    usize::try_from(v / 2).ok()
}

/// After a successful `setsockopt(fd, SOL_SOCKET, name, v)` on a socket not (yet) ours.
pub(crate) fn set(fd: c_int, name: c_int) {
    let rcv = matches!(name, libc::SO_RCVBUF | libc::SO_RCVBUFFORCE);
    let snd = matches!(name, libc::SO_SNDBUF | libc::SO_SNDBUFFORCE);
    if !(rcv || snd) || !crate::is_tcp(fd) {
        return;
    }
    let Some(file) = crate::table::file_of(fd) else {
        return;
    };
    ANY.store(true, Ordering::Release);
    let mut m = SET.lock();
    let e = m.entry(fd).or_insert((file, BufSizes::default()));
    if e.0 != file {
        *e = (file, BufSizes::default());
    }
    if rcv {
        e.1.rmb = effective(fd, libc::SO_RCVBUF);
    } else {
        e.1.sndbuf = effective(fd, libc::SO_SNDBUF).and_then(|n| u32::try_from(n).ok());
    }
}

/// The sizes set on `fd` (still the same file), forgotten.
pub(crate) fn take(fd: c_int) -> BufSizes {
    if !ANY.load(Ordering::Acquire) {
        return BufSizes::default();
    }
    let file = crate::table::file_of(fd);
    match SET.lock().remove(&fd) {
        Some((f, b)) if Some(f) == file => b,
        _ => BufSizes::default(),
    }
}

/// `fd` is closed.
pub(crate) fn forget(fd: c_int) {
    if ANY.load(Ordering::Acquire) {
        SET.lock().remove(&fd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn set_int(fd: c_int, name: c_int, v: c_int) {
        // SAFETY: setsockopt with a pointer to one int of the right length.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                name,
                (&v as *const c_int).cast(),
                std::mem::size_of::<c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0);
    }

    #[test]
    fn the_sizes_set_on_a_tcp_socket_are_taken_once() {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        let fd = s.as_raw_fd();
        assert_eq!(take(fd), BufSizes::default(), "nothing set");
        set_int(fd, libc::SO_RCVBUF, 65536);
        set(fd, libc::SO_RCVBUF);
        set_int(fd, libc::SO_SNDBUF, 32768);
        set(fd, libc::SO_SNDBUF);
        set(fd, libc::SO_KEEPALIVE);
        let b = take(fd);
        // What the kernel keeps (doubled, clamped), halved: what Linux SMC uses.
        let rcv = crate::real::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF).unwrap();
        let snd = crate::real::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF).unwrap();
        assert_eq!(b.rmb, Some(rcv as usize / 2));
        assert_eq!(b.sndbuf, Some(snd as u32 / 2));
        assert_eq!(take(fd), BufSizes::default(), "taken once");
        // A UDP socket is none of ours.
        let u = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
        set_int(u.as_raw_fd(), libc::SO_RCVBUF, 65536);
        set(u.as_raw_fd(), libc::SO_RCVBUF);
        assert_eq!(take(u.as_raw_fd()), BufSizes::default());
    }
}
