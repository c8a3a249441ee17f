//! The interposed symbols. Each one is libc's function unless the descriptor is ours
//! (the table) or, for connect/listen, a TCP socket the runtime should take.
//!
//! # Safety (for every function here)
//! The caller follows the C prototype of the libc function of the same name
//! (pointers valid for the lengths given), as any caller of libc must.

use std::os::fd::AsRawFd;

use libc::{c_ulong, c_void};

use super::*;
use crate::table::Entry;

/// -1/ENOSYS: libc does not define the function (it always does on glibc and musl).
fn missing() -> c_int {
    real::fail(libc::ENOSYS)
}

/// Drops table entries after the call, keeping the call's errno.
fn drop_keeping_errno<T>(v: T) {
    let e = real::errno();
    drop(v);
    real::set_errno(e);
}

/// connect(2).
///
/// # Safety
/// As for connect(2).
#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let Some(real_connect) = real::connect() else {
        return missing();
    };
    match table::lookup(fd) {
        Some(Entry::Stream(_)) => return real::fail(libc::EISCONN),
        Some(Entry::Listener(_)) => return real::fail(libc::EINVAL),
        None => {}
    }
    // SAFETY: the caller's arguments.
    let target = unsafe { inet_addr(addr, len) };
    let stack = match target {
        Some(_) if is_tcp(fd) => stack(),
        _ => None,
    };
    match (stack, target) {
        // SAFETY: the caller's arguments; `fd` is a TCP socket not in the table.
        (Some(s), Some(t)) => unsafe { conn::connect(s, fd, addr, len, t, real_connect) },
        // SAFETY: the caller's arguments.
        _ => unsafe { real_connect(fd, addr, len) },
    }
}

/// listen(2).
///
/// # Safety
/// As for listen(2).
#[no_mangle]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    let Some(real_listen) = real::listen() else {
        return missing();
    };
    match table::lookup(fd) {
        // Listening again only changes the backlog; the runtime's is fixed.
        Some(Entry::Listener(_)) => return 0,
        Some(Entry::Stream(_)) => return real::fail(libc::EINVAL),
        None => {}
    }
    match is_tcp(fd).then(stack).flatten() {
        Some(s) => listen::listen(s, fd, backlog, real_listen),
        // SAFETY: the caller's arguments.
        None => unsafe { real_listen(fd, backlog) },
    }
}

/// accept(2).
///
/// # Safety
/// As for accept(2).
#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    match table::lookup(fd) {
        // SAFETY: the caller's arguments.
        Some(Entry::Listener(l)) => unsafe { listen::accept(&l, fd, addr, len, 0) },
        Some(Entry::Stream(_)) => real::fail(libc::EINVAL),
        None => match real::accept() {
            // SAFETY: the caller's arguments.
            Some(f) => unsafe { f(fd, addr, len) },
            None => missing(),
        },
    }
}

/// accept4(2).
///
/// # Safety
/// As for accept4(2).
#[no_mangle]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    match table::lookup(fd) {
        Some(Entry::Listener(l)) => {
            if flags & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) != 0 {
                return real::fail(libc::EINVAL);
            }
            // SAFETY: the caller's arguments.
            unsafe { listen::accept(&l, fd, addr, len, flags) }
        }
        Some(Entry::Stream(_)) => real::fail(libc::EINVAL),
        None => match real::accept4() {
            // SAFETY: the caller's arguments.
            Some(f) => unsafe { f(fd, addr, len, flags) },
            None => missing(),
        },
    }
}

/// close(2).
///
/// # Safety
/// As for close(2).
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    let linger = match table::lookup(fd) {
        Some(table::Entry::Stream(e)) => crate::conn::Linger::before_close(fd, &e),
        _ => None,
    };
    let removed = table::remove(fd);
    sizes::forget(fd);
    let r = match real::close() {
        // SAFETY: the caller's argument.
        Some(f) => unsafe { f(fd) },
        None => missing(),
    };
    drop_keeping_errno(removed);
    if let Some(l) = linger {
        let e = real::errno();
        l.after_close();
        real::set_errno(e);
    }
    r
}

/// dup(2).
///
/// # Safety
/// As for dup(2).
#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    let Some(f) = real::dup() else {
        return missing();
    };
    // SAFETY: the caller's argument.
    let r = unsafe { f(fd) };
    if r >= 0 {
        drop_keeping_errno(table::duplicated(fd, r));
    }
    r
}

/// dup2(2).
///
/// # Safety
/// As for dup2(2).
#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    let Some(f) = real::dup2() else {
        return missing();
    };
    // SAFETY: the caller's arguments.
    let r = unsafe { f(old, new) };
    if r >= 0 && old != new {
        let gone = table::remove(new);
        let dup = table::duplicated(old, new);
        drop_keeping_errno((gone, dup));
    }
    r
}

/// dup3(2).
///
/// # Safety
/// As for dup3(2).
#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    let Some(f) = real::dup3() else {
        return missing();
    };
    // SAFETY: the caller's arguments.
    let r = unsafe { f(old, new, flags) };
    if r >= 0 {
        let gone = table::remove(new);
        let dup = table::duplicated(old, new);
        drop_keeping_errno((gone, dup));
    }
    r
}

fn fcntl_common(
    f: Option<unsafe extern "C" fn(c_int, c_int, c_ulong) -> c_int>,
    fd: c_int,
    cmd: c_int,
    arg: c_ulong,
) -> c_int {
    let Some(f) = f else {
        return missing();
    };
    // SAFETY: the caller's arguments, passed on as they came (see `fcntl`).
    let r = unsafe { f(fd, cmd, arg) };
    if r >= 0 && (cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC) {
        drop_keeping_errno(table::duplicated(fd, r));
    }
    r
}

/// fcntl(2). C declares it variadic; its one optional argument is an int or a pointer,
/// which the x86-64 and AArch64 Linux ABIs pass in the same integer register as a
/// fixed third argument, so taking and passing it as `c_ulong` forwards it unchanged.
///
/// # Safety
/// As for fcntl(2).
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    fcntl_common(real::fcntl(), fd, cmd, arg)
}

/// fcntl64 (glibc's name for fcntl with 64-bit file offsets; same argument rule).
///
/// # Safety
/// As for fcntl(2).
#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    fcntl_common(real::fcntl64(), fd, cmd, arg)
}

/// getsockname(2).
///
/// # Safety
/// As for getsockname(2).
#[no_mangle]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    let a = match table::lookup(fd) {
        Some(Entry::Stream(s)) => s.local,
        Some(Entry::Listener(l)) => l.local,
        None => {
            return match real::getsockname() {
                // SAFETY: the caller's arguments.
                Some(f) => unsafe { f(fd, addr, len) },
                None => missing(),
            };
        }
    };
    if addr.is_null() || len.is_null() {
        return real::fail(libc::EFAULT);
    }
    // SAFETY: the caller's buffer.
    unsafe { listen::write_addr(&a, addr, len) };
    0
}

/// getpeername(2).
///
/// # Safety
/// As for getpeername(2).
#[no_mangle]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    let a = match table::lookup(fd) {
        Some(Entry::Stream(s)) => s.peer,
        Some(Entry::Listener(_)) => return real::fail(libc::ENOTCONN),
        None => {
            return match real::getpeername() {
                // SAFETY: the caller's arguments.
                Some(f) => unsafe { f(fd, addr, len) },
                None => missing(),
            };
        }
    };
    if addr.is_null() || len.is_null() {
        return real::fail(libc::EFAULT);
    }
    // SAFETY: the caller's buffer.
    unsafe { listen::write_addr(&a, addr, len) };
    0
}

/// Writes an int option value as getsockopt(2) does.
///
/// # Safety
/// `val`/`len` valid as for getsockopt(2).
unsafe fn put_int(v: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int {
    if val.is_null() || len.is_null() {
        return real::fail(libc::EFAULT);
    }
    let b = v.to_ne_bytes();
    // SAFETY: `len` points to the buffer's size.
    let n = (unsafe { *len } as usize).min(b.len());
    // SAFETY: `val` has room for `*len` ≥ `n` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(b.as_ptr(), val.cast::<u8>(), n);
        *len = n as socklen_t;
    }
    0
}

/// getsockopt(2). On an SMC-R stream: SO_DOMAIN/SO_PROTOCOL say TCP; IP/IPv6/TCP
/// options (TCP_INFO among them) and SO_KEEPALIVE are the connection's TCP socket's, as
/// Linux SMC answers from its CLC socket; other SOL_SOCKET options are the socketpair
/// end's (SO_ERROR, SO_RCVBUF, ...). On a listener: the listening TCP socket's.
///
/// # Safety
/// As for getsockopt(2).
#[no_mangle]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    let Some(f) = real::getsockopt() else {
        return missing();
    };
    match table::lookup(fd) {
        // SAFETY: the caller's arguments.
        None => unsafe { f(fd, level, name, val, len) },
        // SAFETY: the caller's arguments, on our descriptor of the TCP socket.
        Some(Entry::Listener(l)) => unsafe { f(l.tcp.as_raw_fd(), level, name, val, len) },
        Some(Entry::Stream(s)) => {
            if let Some(t) = s.tcp_for(level, name) {
                // SAFETY: the caller's arguments, on the connection's TCP socket.
                return unsafe { f(t, level, name, val, len) };
            }
            if level == libc::SOL_SOCKET {
                return match name {
                    libc::SO_DOMAIN => {
                        let d = if s.local.is_ipv4() {
                            libc::AF_INET
                        } else {
                            libc::AF_INET6
                        };
                        // SAFETY: the caller's buffer.
                        unsafe { put_int(d, val, len) }
                    }
                    // SAFETY: the caller's buffer.
                    libc::SO_PROTOCOL => unsafe { put_int(libc::IPPROTO_TCP, val, len) },
                    // SAFETY: the caller's arguments on the socketpair end.
                    _ => unsafe { f(fd, level, name, val, len) },
                };
            }
            if val.is_null() || len.is_null() {
                return real::fail(libc::EFAULT);
            }
            let stored = s.opts.lock().ok().and_then(|o| {
                o.iter()
                    .find(|(k, _)| *k == (level, name))
                    .map(|(_, v)| v.clone())
            });
            match stored {
                Some(v) => {
                    // SAFETY: `len` points to the buffer's size, `val` has that room.
                    unsafe {
                        let n = (*len as usize).min(v.len());
                        std::ptr::copy_nonoverlapping(v.as_ptr(), val.cast::<u8>(), n);
                        *len = n as socklen_t;
                    }
                    0
                }
                None if level == libc::IPPROTO_TCP && name == libc::TCP_INFO => {
                    real::fail(libc::EOPNOTSUPP)
                }
                // SAFETY: the caller's buffer.
                None => unsafe { put_int(0, val, len) },
            }
        }
    }
}

/// setsockopt(2). On a TCP socket before connect/listen: libc's, and SO_RCVBUF/SO_SNDBUF
/// are remembered to size the SMC-R buffers ([`crate::sizes`]). On an SMC-R stream:
/// IP/IPv6/TCP options, SO_KEEPALIVE and SO_LINGER go to the connection's TCP socket
/// (Linux SMC sets them on its CLC socket: TCP keepalive probes the idle connection,
/// whose failure resets the SMC-R one; the pump aborts a connection closed with linger
/// 0, and `close()` waits with a linger time above 0, [`crate::conn::Linger`]); other
/// SOL_SOCKET options go to the socketpair end
/// (SO_RCVBUF/SO_SNDBUF size its buffers); without the TCP socket IP/IPv6/TCP options
/// are kept for getsockopt. The pump sends at once, as with TCP_NODELAY. On a listener:
/// the listening TCP socket's.
///
/// # Safety
/// As for setsockopt(2).
#[no_mangle]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    let Some(f) = real::setsockopt() else {
        return missing();
    };
    match table::lookup(fd) {
        None => {
            // SAFETY: the caller's arguments.
            let r = unsafe { f(fd, level, name, val, len) };
            if r == 0 && level == libc::SOL_SOCKET {
                // SO_RCVBUF / SO_SNDBUF before connect()/listen() size SMC-R buffers.
                let e = real::errno();
                sizes::set(fd, name);
                real::set_errno(e);
            }
            r
        }
        // SAFETY: the caller's arguments, on our descriptor of the TCP socket.
        Some(Entry::Listener(l)) => unsafe { f(l.tcp.as_raw_fd(), level, name, val, len) },
        Some(Entry::Stream(s)) => {
            if let Some(t) = s.tcp_for(level, name) {
                // SAFETY: the caller's arguments, on the connection's TCP socket.
                let r = unsafe { f(t, level, name, val, len) };
                if r == 0
                    && level == libc::IPPROTO_TCP
                    && matches!(name, libc::TCP_CORK | libc::TCP_NODELAY)
                    && !val.is_null()
                    && len as usize >= std::mem::size_of::<c_int>()
                {
                    // SAFETY: `val` holds an int (the kernel just read one from it).
                    let on = unsafe { std::ptr::read_unaligned(val.cast::<c_int>()) } != 0;
                    let e = real::errno();
                    crate::conn::tcp_option_set(fd, name, on);
                    real::set_errno(e);
                }
                return r;
            }
            if level == libc::SOL_SOCKET {
                // SAFETY: the caller's arguments on the socketpair end.
                let r = unsafe { f(fd, level, name, val, len) };
                if r == 0 || !matches!(real::errno(), libc::EOPNOTSUPP | libc::ENOPROTOOPT) {
                    return r;
                }
            }
            if val.is_null() {
                return real::fail(libc::EFAULT);
            }
            // SAFETY: `val` is valid for `len` bytes.
            let v = unsafe { std::slice::from_raw_parts(val.cast::<u8>(), len as usize) }.to_vec();
            if let Ok(mut o) = s.opts.lock() {
                o.retain(|(k, _)| *k != (level, name));
                o.push(((level, name), v));
            }
            0
        }
    }
}

/// Whether `fd` is an SMC-R stream of ours. Only asked when a send names a destination.
fn is_stream(fd: c_int) -> bool {
    matches!(table::lookup(fd), Some(Entry::Stream(_)))
}

/// sendto(2). TCP ignores a destination given on a connected socket (Linux
/// `tcp_sendmsg` never reads it), but an AF_UNIX stream — what an SMC-R descriptor is —
/// refuses one with EISCONN; programs such as sockperf name the peer on every send.
/// For our streams the destination is dropped, as TCP would; a call without one (the
/// usual case) goes straight to libc.
///
/// # Safety
/// As for sendto(2).
#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: libc::size_t,
    flags: c_int,
    addr: *const sockaddr,
    len: socklen_t,
) -> libc::ssize_t {
    let Some(f) = real::sendto() else {
        return missing() as libc::ssize_t;
    };
    if len != 0 && is_stream(fd) {
        // SAFETY: the caller's buffer, without the destination (see above).
        return unsafe { f(fd, buf, n, flags, std::ptr::null(), 0) };
    }
    // SAFETY: the caller's arguments.
    unsafe { f(fd, buf, n, flags, addr, len) }
}

/// sendmsg(2): as `sendto`, a destination (`msg_name`) on an SMC-R stream is dropped.
///
/// # Safety
/// As for sendmsg(2).
#[no_mangle]
pub unsafe extern "C" fn sendmsg(
    fd: c_int,
    msg: *const libc::msghdr,
    flags: c_int,
) -> libc::ssize_t {
    let Some(f) = real::sendmsg() else {
        return missing() as libc::ssize_t;
    };
    // SAFETY: a non-null `msg` is a valid msghdr (the caller's contract).
    if !msg.is_null() && unsafe { (*msg).msg_namelen } != 0 && is_stream(fd) {
        // SAFETY: as above; the copy shares the caller's iovecs and control data,
        // which stay valid for the call.
        let mut m = unsafe { std::ptr::read(msg) };
        m.msg_name = std::ptr::null_mut();
        m.msg_namelen = 0;
        // SAFETY: the caller's message without its destination.
        return unsafe { f(fd, &m, flags) };
    }
    // SAFETY: the caller's arguments.
    unsafe { f(fd, msg, flags) }
}

// --- waiting on an inherited listener -----------------------------------------------
//
// A forked child's inherited SMC listener is served by its parent's accept task; when
// the child waits on it, it watches that process and takes over if it goes (a server
// that daemonizes). These calls only look at the table while such a listener exists
// (`listen::UNWATCHED`), so they cost one atomic load otherwise.

fn waiting_on(fd: c_int) {
    if let Some(Entry::Listener(l)) = table::lookup(fd) {
        listen::waited_on(&l);
    }
}

fn any_unwatched() -> bool {
    listen::UNWATCHED.load(std::sync::atomic::Ordering::Acquire) != 0
}

/// # Safety
/// `fds` is null or valid for `n` entries.
unsafe fn waiting_on_pollfds(fds: *const libc::pollfd, n: libc::nfds_t) {
    if !any_unwatched() || fds.is_null() {
        return;
    }
    // SAFETY: the caller's array of `n` pollfds.
    for p in unsafe { std::slice::from_raw_parts(fds, n as usize) } {
        if p.fd >= 0 && p.events & libc::POLLIN != 0 {
            waiting_on(p.fd);
        }
    }
}

/// # Safety
/// `set` is null or a valid fd_set for descriptors below `nfds`.
unsafe fn waiting_on_fdset(nfds: c_int, set: *mut libc::fd_set) {
    if !any_unwatched() || set.is_null() {
        return;
    }
    for fd in 0..nfds.clamp(0, libc::FD_SETSIZE as c_int) {
        // SAFETY: `set` is valid and `fd` below FD_SETSIZE.
        if unsafe { libc::FD_ISSET(fd, set) } {
            waiting_on(fd);
        }
    }
}

/// epoll_ctl(2).
///
/// # Safety
/// As for epoll_ctl(2).
#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    event: *mut libc::epoll_event,
) -> c_int {
    let Some(f) = real::epoll_ctl() else {
        return missing();
    };
    if any_unwatched() && (op == libc::EPOLL_CTL_ADD || op == libc::EPOLL_CTL_MOD) {
        waiting_on(fd);
    }
    // SAFETY: the caller's arguments.
    unsafe { f(epfd, op, fd, event) }
}

/// poll(2).
///
/// # Safety
/// As for poll(2).
#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int {
    let Some(f) = real::poll() else {
        return missing();
    };
    // SAFETY: the caller's arguments.
    unsafe {
        waiting_on_pollfds(fds, n);
        f(fds, n, timeout)
    }
}

/// `__poll_chk` (poll under _FORTIFY_SOURCE).
///
/// # Safety
/// As for poll(2); `fdslen` is the size of the caller's array.
#[no_mangle]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: c_int,
    fdslen: libc::size_t,
) -> c_int {
    let Some(f) = real::__poll_chk() else {
        return missing();
    };
    // SAFETY: the caller's arguments (libc checks `fdslen` against `n`).
    unsafe {
        if (n as usize) <= fdslen / std::mem::size_of::<libc::pollfd>() {
            waiting_on_pollfds(fds, n);
        }
        f(fds, n, timeout, fdslen)
    }
}

/// ppoll(2).
///
/// # Safety
/// As for ppoll(2).
#[no_mangle]
pub unsafe extern "C" fn ppoll(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: *const libc::timespec,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let Some(f) = real::ppoll() else {
        return missing();
    };
    // SAFETY: the caller's arguments.
    unsafe {
        waiting_on_pollfds(fds, n);
        f(fds, n, timeout, sigmask)
    }
}

/// `__ppoll_chk` (ppoll under _FORTIFY_SOURCE).
///
/// # Safety
/// As for ppoll(2); `fdslen` is the size of the caller's array.
#[no_mangle]
pub unsafe extern "C" fn __ppoll_chk(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: *const libc::timespec,
    sigmask: *const libc::sigset_t,
    fdslen: libc::size_t,
) -> c_int {
    let Some(f) = real::__ppoll_chk() else {
        return missing();
    };
    // SAFETY: the caller's arguments (libc checks `fdslen` against `n`).
    unsafe {
        if (n as usize) <= fdslen / std::mem::size_of::<libc::pollfd>() {
            waiting_on_pollfds(fds, n);
        }
        f(fds, n, timeout, sigmask, fdslen)
    }
}

/// select(2).
///
/// # Safety
/// As for select(2).
#[no_mangle]
pub unsafe extern "C" fn select(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    let Some(f) = real::select() else {
        return missing();
    };
    // SAFETY: the caller's arguments.
    unsafe {
        waiting_on_fdset(nfds, readfds);
        f(nfds, readfds, writefds, exceptfds, timeout)
    }
}

/// pselect(2).
///
/// # Safety
/// As for pselect(2).
#[no_mangle]
pub unsafe extern "C" fn pselect(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *const libc::timespec,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let Some(f) = real::pselect() else {
        return missing();
    };
    // SAFETY: the caller's arguments.
    unsafe {
        waiting_on_fdset(nfds, readfds);
        f(nfds, readfds, writefds, exceptfds, timeout, sigmask)
    }
}
