//! SMC listeners: the interposed `listen()` and `accept()`.
//!
//! The runtime's event thread accepts on the TCP socket and runs each rendezvous
//! (RFC 7609 §3.5.1) before `accept()` may return it, so the listening socket's own
//! readiness would say "a connection is waiting" too early, and never again once the
//! runtime took it. The application's descriptor of a listener is therefore one end of
//! an AF_UNIX SOCK_SEQPACKET socketpair: for each finished rendezvous the accept task
//! sends one message on the other end — the addresses, and the connection's descriptor
//! (SMC-R: a socketpair end, see [`crate::conn`]; TCP fallback: the TCP socket) as
//! SCM_RIGHTS — and `accept()` is a `recvmsg()`. So poll/select/epoll on the listener
//! are readable exactly when `accept()` has something, a blocking `accept()` sleeps in
//! the kernel, O_NONBLOCK gives EAGAIN, and any process holding the descriptor can
//! accept — the workers of a pre-forking server too (the pumps stay in the process that
//! listened).

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use libc::{c_int, sockaddr, socklen_t};
use smc::{SmcListener, Stack};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::conn::{self, StreamEntry};
use crate::lock::Mutex;
use crate::report;
use crate::{real, table};

/// An SMC listener the application holds (table entry of its descriptor).
pub(crate) struct ListenerEntry {
    pub local: SocketAddr,
    /// Our descriptor of the listening TCP socket: socket options go there, and the
    /// accept task of a process runs on a duplicate of it.
    pub tcp: OwnedFd,
    /// SO_RCVBUF / SO_SNDBUF set before `listen()`: the accepted connections' buffers.
    bufs: smc::BufSizes,
    state: Mutex<State>,
}

/// Who accepts in this process.
enum State {
    /// This process's accept task (started by `listen()`, or by a forked child taking
    /// over). The raw numbers of the descriptors it owns: a forked child closes its
    /// copy of the runtime's and reuses its copy of the feed.
    Running {
        task: tokio::task::AbortHandle,
        feed: RawFd,
        runtime_tcp: RawFd,
    },
    /// A forked child's view of a listener whose accept task runs in another process
    /// (`owner`, a pidfd; `None`: gone). Connections keep arriving from there; when the
    /// child waits on the listener (accept, poll, select, epoll) it watches the owner
    /// and starts its own task on `feed` (the same socketpair) once the owner is gone —
    /// a server that daemonizes (fork, parent exits) keeps accepting.
    Inherited {
        feed: OwnedFd,
        owner: Option<OwnedFd>,
        watching: bool,
    },
    /// No task (shut down, or it could not start: logged).
    Idle,
}

/// Inherited listeners nobody in this process waited on yet: the interposed poll/select
/// look for them only while this is non-zero.
pub(crate) static UNWATCHED: AtomicUsize = AtomicUsize::new(0);

impl Drop for ListenerEntry {
    fn drop(&mut self) {
        let state = std::mem::replace(self.state.get_mut(), State::Idle);
        match state {
            State::Running { task, .. } => {
                // Stops accepting: the SmcListener is dropped with the task.
                let stack = Stack::global_if_started();
                let listed = || {
                    stack.map_or(0, |s| {
                        s.listener_addrs()
                            .iter()
                            .filter(|a| **a == self.local)
                            .count()
                    })
                };
                let before = listed();
                task.abort();
                // close(2) of a TCP listener frees its port at once, and programs
                // listen on it again right away (iperf3 -s between two tests): wait
                // until the runtime has closed its descriptor of the socket (its event
                // thread drops a closed listener on its next turn), at most 1 s.
                let t0 = std::time::Instant::now();
                while before > 0
                    && listed() >= before
                    && t0.elapsed() < std::time::Duration::from_secs(1)
                {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            State::Inherited { watching, .. } => {
                if !watching {
                    UNWATCHED.fetch_sub(1, Ordering::AcqRel);
                }
            }
            State::Idle => {}
        }
    }
}

/// The interposed `listen()` of a bound TCP socket: the runtime takes the listening
/// socket and our socketpair end takes its number.
pub(crate) fn listen(
    stack: &'static Stack,
    fd: c_int,
    backlog: c_int,
    real_listen: unsafe extern "C" fn(c_int, c_int) -> c_int,
) -> c_int {
    // SAFETY: `fd` is the application's open socket for the duration of this call.
    if let Err(e) = stack.mark_tcp_option(unsafe { BorrowedFd::borrow_raw(fd) }) {
        tracing::debug!(error = %e, "cannot mark the listener for the SMC-R option");
    }
    // SAFETY: the caller's arguments.
    let r = unsafe { real_listen(fd, backlog) };
    if r != 0 {
        return r;
    }
    let fl = real::fcntl_raw(fd, libc::F_GETFL, 0);
    match adopt(stack, fd) {
        Ok(local) => {
            report::line(format_args!("listen local={local} mode=SMC"));
        }
        Err(e) => {
            // The socket stays the program's TCP listener, as it set it (the runtime,
            // had it started, made the shared file non-blocking).
            if fl >= 0 {
                real::fcntl_raw(fd, libc::F_SETFL, fl as libc::c_ulong);
            }
            report::line(format_args!("listen fd={fd} mode=TCP info=\"{e}\""));
        }
    }
    0
}

fn dup_cloexec(fd: c_int) -> io::Result<OwnedFd> {
    let d = real::dup_high(fd);
    if d < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `d` is a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(d) })
}

fn adopt(stack: &'static Stack, fd: c_int) -> io::Result<SocketAddr> {
    let fl = real::fcntl_raw(fd, libc::F_GETFL, 0);
    let fdfl = real::fcntl_raw(fd, libc::F_GETFD, 0);
    let ours = dup_cloexec(fd)?;
    let local = socket2::SockRef::from(&ours)
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("a listener without an internet address"))?;
    let mut pair = [-1 as c_int; 2];
    // SAFETY: `pair` has room for the two descriptors.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            pair.as_mut_ptr(),
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and ours.
    let (app, feed) = unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) };
    let feed = real::move_high(feed);
    let ffl = real::fcntl_raw(feed.as_raw_fd(), libc::F_GETFL, 0);
    real::fcntl_raw(
        feed.as_raw_fd(),
        libc::F_SETFL,
        (ffl | libc::O_NONBLOCK) as libc::c_ulong,
    );
    let entry = Arc::new(ListenerEntry {
        local,
        tcp: ours,
        bufs: crate::sizes::take(fd),
        state: Mutex::new(State::Idle),
    });
    let running = start_task(&entry, stack, feed)?;
    *entry.state.lock() = running;
    // The number the application knows becomes our socketpair end; the runtime and
    // `ours` keep the TCP socket.
    let cloexec = if fdfl >= 0 && fdfl & libc::FD_CLOEXEC != 0 {
        libc::O_CLOEXEC
    } else {
        0
    };
    if real::dup3_raw(app.as_raw_fd(), fd, cloexec) < 0 {
        return Err(io::Error::last_os_error());
    }
    drop(app);
    if fl >= 0 {
        real::fcntl_raw(fd, libc::F_SETFL, (fl & libc::O_NONBLOCK) as libc::c_ulong);
    }
    drop(table::insert(fd, table::Entry::Listener(entry)));
    Ok(local)
}

/// Starts this process's accept task on the listener, feeding `feed`.
fn start_task(entry: &ListenerEntry, stack: &'static Stack, feed: OwnedFd) -> io::Result<State> {
    let runtime_fd = dup_cloexec(entry.tcp.as_raw_fd())?;
    let runtime_tcp = runtime_fd.as_raw_fd();
    let bufs = entry.bufs;
    let smc_l = crate::guarded(|| {
        SmcListener::from_listening_sized(stack, TcpListener::from(runtime_fd), bufs)
    })?;
    let local = entry.local;
    let feed_raw = feed.as_raw_fd();
    let task = crate::runtime().spawn(async move {
        // SAFETY: an OwnedFd stays open, on the same file, and returns the same number
        // for as long as the AsyncFd owns it.
        let feed = match unsafe { AsyncFd::register_with_interest(feed, Interest::WRITABLE) }
            .map_err(io::Error::from)
        {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "listener socketpair not usable from tokio");
                return;
            }
        };
        accept_loop(smc::tokio::SmcListener::from_std(smc_l), feed, local).await;
    });
    Ok(State::Running {
        task: task.abort_handle(),
        feed: feed_raw,
        runtime_tcp,
    })
}

/// The application waits on `entry` (accept, poll, select, epoll): in a forked child
/// whose listener's accept task runs elsewhere, watch that process and take over when
/// it is gone.
pub(crate) fn waited_on(entry: &Arc<ListenerEntry>) {
    let mut st = entry.state.lock();
    let State::Inherited {
        owner, watching, ..
    } = &mut *st
    else {
        return;
    };
    if *watching {
        return;
    }
    *watching = true;
    UNWATCHED.fetch_sub(1, Ordering::AcqRel);
    // The entry keeps its pidfd (a child forked later watches the same owner).
    let pidfd = match owner.as_ref().map(|o| dup_cloexec(o.as_raw_fd())) {
        None => None,
        Some(Ok(d)) => Some(d),
        Some(Err(e)) => {
            tracing::warn!(error = %e, "cannot watch the process accepting on an inherited listener");
            return;
        }
    };
    drop(st);
    let Some(pidfd) = pidfd else {
        take_over(entry);
        return;
    };
    let weak = Arc::downgrade(entry);
    crate::runtime().spawn(async move {
        // A pidfd is readable once its process has exited (pidfd_open(2)).
        // SAFETY: as for the feed above: the OwnedFd stays open while registered.
        if let Ok(w) = unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) } {
            let _ = w.readable().await;
        }
        if let Some(e) = weak.upgrade() {
            take_over(&e);
        }
    });
}

/// Starts this process's own accept task on an inherited listener.
fn take_over(entry: &Arc<ListenerEntry>) {
    let feed = {
        let mut st = entry.state.lock();
        match std::mem::replace(&mut *st, State::Idle) {
            State::Inherited { feed, .. } => feed,
            other => {
                *st = other;
                return;
            }
        }
    };
    let started = match crate::stack() {
        Some(stack) => start_task(entry, stack, feed),
        None => Err(io::Error::other("no SMC-R stack in this process")),
    };
    match started {
        Ok(running) => {
            report::line(format_args!(
                "listen local={} mode=SMC info=\"taken over\"",
                entry.local
            ));
            *entry.state.lock() = running;
        }
        Err(e) => tracing::warn!(local = %entry.local, error = %e,
            "cannot accept on an inherited SMC listener whose process is gone"),
    }
}

/// In a forked child (the fork handler, with the table held): every listener becomes
/// [`State::Inherited`] from the process that runs its accept task. The parent's
/// entries are left alone (not dropped: their task is the parent's).
/// `parent` is a pidfd of the forking process, opened by it before the fork.
pub(crate) fn forked(
    old: &Arc<ListenerEntry>,
    parent: Option<BorrowedFd<'_>>,
) -> Arc<ListenerEntry> {
    if old.state.is_locked() {
        // SAFETY: the child has one thread, this one; the holder was a parent's thread.
        unsafe { old.state.force_unlock() };
    }
    // SAFETY (both raw adoptions below): the numbers are descriptors this process
    // inherited from the parent's entry, which is never dropped here, so each has
    // exactly one owner again.
    let (feed, owner) = match &*old.state.lock() {
        State::Running {
            feed, runtime_tcp, ..
        } => {
            // The runtime's copy of the TCP socket is the parent's event thread's; the
            // child's task would make its own. close(2) through the system call: the
            // table is held by this thread.
            // SAFETY: our inherited copy; nothing in the child uses it.
            unsafe { libc::syscall(libc::SYS_close, libc::c_long::from(*runtime_tcp)) };
            // Our own copy of the parent's pidfd (F_DUPFD_CLOEXEC through the system
            // call: the table is held by this thread). Without one the listener is
            // taken over at once, as if the parent were gone.
            let owner = parent.and_then(|p| {
                // SAFETY: fcntl(2) on a descriptor that is open for this call.
                let d = unsafe {
                    libc::syscall(
                        libc::SYS_fcntl,
                        libc::c_long::from(p.as_raw_fd()),
                        libc::c_long::from(libc::F_DUPFD_CLOEXEC),
                        libc::c_long::from(3),
                    )
                };
                // SAFETY: a new descriptor nothing else owns.
                (d >= 0).then(|| unsafe { OwnedFd::from_raw_fd(d as RawFd) })
            });
            // SAFETY: see above (the feed of the parent's task, inherited).
            let feed = unsafe { OwnedFd::from_raw_fd(*feed) };
            (Some(feed), owner)
        }
        State::Inherited { feed, owner, .. } => (
            // SAFETY: see above.
            Some(unsafe { OwnedFd::from_raw_fd(feed.as_raw_fd()) }),
            // SAFETY: see above.
            owner
                .as_ref()
                .map(|o| unsafe { OwnedFd::from_raw_fd(o.as_raw_fd()) }),
        ),
        State::Idle => (None, None),
    };
    // SAFETY: see above.
    let tcp = unsafe { OwnedFd::from_raw_fd(old.tcp.as_raw_fd()) };
    let state = match feed {
        Some(feed) => {
            UNWATCHED.fetch_add(1, Ordering::AcqRel);
            State::Inherited {
                feed,
                owner,
                watching: false,
            }
        }
        None => State::Idle,
    };
    Arc::new(ListenerEntry {
        local: old.local,
        tcp,
        bufs: old.bufs,
        state: Mutex::new(state),
    })
}

/// One finished rendezvous as a message: "S" (SMC-R) or "T" (TCP), our address and the
/// peer's, separated by spaces; the descriptor rides along as SCM_RIGHTS.
fn encode(smc: bool, local: &SocketAddr, peer: &SocketAddr) -> String {
    format!("{} {local} {peer}", if smc { 'S' } else { 'T' })
}

fn decode(msg: &[u8]) -> Option<(bool, SocketAddr, SocketAddr)> {
    let text = std::str::from_utf8(msg).ok()?;
    let mut it = text.split(' ');
    let smc = match it.next()? {
        "S" => true,
        "T" => false,
        _ => return None,
    };
    Some((smc, it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// Room for the control message of two descriptors.
const CMSG_ROOM: usize = 64;

/// sendmsg of `msg` with `fds` (one or two) attached.
fn send_fds(sock: RawFd, msg: &[u8], fds: &[RawFd]) -> io::Result<()> {
    assert!((1..=2).contains(&fds.len()));
    let mut iov = libc::iovec {
        iov_base: msg.as_ptr() as *mut libc::c_void,
        iov_len: msg.len(),
    };
    let mut cbuf = [0u64; CMSG_ROOM / 8];
    let data_len = std::mem::size_of_val(fds) as u32;
    // SAFETY: a zeroed msghdr is valid; the fields set below point to live buffers.
    let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
    h.msg_iov = &mut iov;
    h.msg_iovlen = 1;
    h.msg_control = cbuf.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is arithmetic.
    h.msg_controllen = unsafe { libc::CMSG_SPACE(data_len) } as usize;
    // SAFETY: the control buffer (64 bytes, 8-aligned) holds one cmsghdr with at most
    // two ints, which CMSG_FIRSTHDR/CMSG_DATA address inside it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&h);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(data_len) as usize;
        for (i, fd) in fds.iter().enumerate() {
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<c_int>().add(i), *fd);
        }
    }
    // SAFETY: `h` describes valid buffers.
    let n = unsafe { libc::sendmsg(sock, &h, libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// recvmsg of one message and its descriptors (close-on-exec; at most two are kept, any
/// more are closed): blocks or not as the descriptor is set.
fn recv_fds(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; CMSG_ROOM / 8];
    // SAFETY: a zeroed msghdr is valid; the fields set below point to live buffers.
    let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
    h.msg_iov = &mut iov;
    h.msg_iovlen = 1;
    h.msg_control = cbuf.as_mut_ptr().cast();
    h.msg_controllen = CMSG_ROOM;
    // SAFETY: `h` describes valid buffers.
    let n = unsafe { libc::recvmsg(sock, &mut h, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `h.msg_control`; CMSG_FIRSTHDR/NXTHDR walk inside it,
    // and CMSG_DATA holds (cmsg_len - CMSG_LEN(0)) / 4 ints.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let count =
                    ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<c_int>();
                for i in 0..count {
                    let raw = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<c_int>().add(i));
                    // The kernel installed `raw` in this process for us.
                    fds.push(OwnedFd::from_raw_fd(raw));
                }
            }
            c = libc::CMSG_NXTHDR(&h, c);
        }
    }
    fds.truncate(2);
    Ok((n as usize, fds))
}

async fn accept_loop(l: smc::tokio::SmcListener, feed: AsyncFd<OwnedFd>, local: SocketAddr) {
    loop {
        let (s, peer) = l.accept_std().await;
        // An SMC-R connection's idle TCP socket goes along: socket options and TCP_INFO
        // of the accepted descriptor are its (conn::StreamEntry).
        let (fd, tcp, msg) = match s.into_fallback() {
            Ok((tcp, reason)) => {
                let local = tcp.local_addr().unwrap_or(local);
                report::line(format_args!(
                    "accept local={local} peer={peer} mode=TCP info=\"{reason}\""
                ));
                (OwnedFd::from(tcp), None, encode(false, &local, &peer))
            }
            Err(s) => {
                let local = s.local_addr().unwrap_or(local);
                let tcp = s.tcp_clone().ok().map(OwnedFd::from);
                match conn::start(s, "accept") {
                    Ok(fd) => (fd, tcp, encode(true, &local, &peer)),
                    Err(e) => {
                        tracing::warn!(%peer, error = %e, "cannot hand an SMC-R connection over");
                        continue;
                    }
                }
            }
        };
        // Our descriptor goes once the message holds its own reference.
        loop {
            let mut guard = match feed.writable().await {
                Ok(g) => g,
                Err(_) => return,
            };
            let mut fds = vec![fd.as_raw_fd()];
            fds.extend(tcp.as_ref().map(|t| t.as_raw_fd()));
            match guard.try_io(|f| send_fds(f.as_raw_fd(), msg.as_bytes(), &fds)) {
                Ok(Ok(())) => break,
                Ok(Err(e)) => match e.raw_os_error() {
                    // Every descriptor of the application's end is closed: nobody will
                    // accept (the listener's table entry stops this task as well).
                    Some(libc::EPIPE | libc::ECONNREFUSED | libc::ECONNRESET) => return,
                    // E.g. too many descriptors in flight: this connection is closed,
                    // as a full backlog would drop it.
                    _ => {
                        tracing::warn!(%peer, error = %e, "cannot queue a connection for accept()");
                        break;
                    }
                },
                Err(_would_block) => continue,
            }
        }
    }
}

/// Writes `a` to the caller's sockaddr buffer as accept(2)/getsockname(2) do.
///
/// # Safety
/// `addr`/`len` are null or valid as for accept(2).
pub(crate) unsafe fn write_addr(a: &SocketAddr, addr: *mut sockaddr, len: *mut socklen_t) {
    if addr.is_null() || len.is_null() {
        return;
    }
    let sa = socket2::SockAddr::from(*a);
    // SAFETY: the caller guarantees `len` points to the buffer's size.
    let cap = unsafe { *len } as usize;
    let n = (sa.len() as usize).min(cap);
    // SAFETY: `addr` has room for `cap` ≥ `n` bytes; `sa` holds `sa.len()` ≥ `n`.
    unsafe {
        std::ptr::copy_nonoverlapping(sa.as_ptr().cast::<u8>(), addr.cast::<u8>(), n);
        *len = sa.len();
    }
}

/// The interposed `accept4()` on an SMC listener: the next message of the accept task,
/// in whichever process holds the descriptor.
///
/// # Safety
/// `addr`/`len` as for accept4(2).
pub(crate) unsafe fn accept(
    entry: &Arc<ListenerEntry>,
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    waited_on(entry);
    let mut buf = [0u8; 160];
    let (got, tcp, local, peer, smc) = loop {
        let (n, mut fds) = match recv_fds(fd, &mut buf) {
            Ok(x) => x,
            Err(e) => return real::fail(e.raw_os_error().unwrap_or(libc::EIO)),
        };
        let tcp = (fds.len() == 2).then(|| fds.pop()).flatten();
        match (fds.pop(), decode(&buf[..n])) {
            (Some(got), Some((smc, local, peer))) => break (got, tcp, local, peer, smc),
            // Not one of ours (nothing else writes there); its descriptors, if any, are
            // closed with it.
            _ => continue,
        }
    };
    conn::apply_accept_flags(&got, flags);
    // SAFETY: the caller's buffer.
    unsafe { write_addr(&peer, addr, len) };
    if smc {
        let entry = Arc::new(StreamEntry::new(local, peer, tcp.map(real::move_high)));
        drop(table::insert(got.as_raw_fd(), table::Entry::Stream(entry)));
    }
    conn::into_app(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_junk_is_refused() {
        let l: SocketAddr = "127.0.0.2:80".parse().unwrap();
        let p: SocketAddr = "[::1]:5000".parse().unwrap();
        for smc in [true, false] {
            assert_eq!(decode(encode(smc, &l, &p).as_bytes()), Some((smc, l, p)));
        }
        for junk in [
            "",
            "S",
            "X 127.0.0.2:80 [::1]:5000",
            "S 127.0.0.2:80",
            "S a b",
        ] {
            assert_eq!(decode(junk.as_bytes()), None, "{junk}");
        }
    }

    #[test]
    fn a_descriptor_crosses_the_socketpair() {
        let (a, b) = std::os::unix::net::UnixDatagram::pair().unwrap();
        let f = std::fs::File::open("/dev/null").unwrap();
        send_fds(
            a.as_raw_fd(),
            b"T 127.0.0.1:1 127.0.0.1:2",
            &[f.as_raw_fd()],
        )
        .unwrap();
        let mut buf = [0u8; 64];
        let (n, mut fds) = recv_fds(b.as_raw_fd(), &mut buf).unwrap();
        let fd = fds.pop();
        assert_eq!(&buf[..n], b"T 127.0.0.1:1 127.0.0.1:2");
        let fd = fd.expect("a descriptor");
        assert_ne!(fd.as_raw_fd(), f.as_raw_fd());
        let cloexec = real::fcntl_raw(fd.as_raw_fd(), libc::F_GETFD, 0);
        assert_ne!(cloexec & libc::FD_CLOEXEC, 0, "MSG_CMSG_CLOEXEC");
    }
}
