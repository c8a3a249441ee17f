//! SMC listeners: the interposed `listen()` and `accept()`.
//!
//! The runtime's event thread accepts on the TCP socket and runs each rendezvous
//! (RFC 7609 §3.5.1) before `accept()` may return it, so the listening socket's own
//! readiness would say "a connection is waiting" too early, and never again once the
//! runtime took it. The application's descriptor of a listener is therefore an eventfd
//! in semaphore mode that counts finished connections: poll/select/epoll on it are
//! readable exactly when `accept()` has something, a blocking `accept()` sleeps in the
//! eventfd's read, and O_NONBLOCK on it gives EAGAIN.

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use libc::{c_int, sockaddr, socklen_t};
use smc::{SmcListener, Stack};

use crate::conn::{self, StreamEntry};
use crate::report;
use crate::{real, table};

/// A connection whose rendezvous finished, waiting for `accept()`.
struct Accepted {
    fd: OwnedFd,
    peer: SocketAddr,
    /// SMC-R: the table entry of `fd` (a socketpair end); TCP fallback: `fd` is the
    /// TCP socket itself.
    stream: Option<Arc<StreamEntry>>,
}

/// The finished connections of one listener and the eventfd that counts them.
struct Queue {
    items: Mutex<VecDeque<Accepted>>,
    /// Our descriptor of the eventfd the application holds.
    efd: OwnedFd,
}

impl Queue {
    fn push(&self, a: Accepted) {
        if let Ok(mut q) = self.items.lock() {
            q.push_back(a);
        }
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from `one` to our eventfd.
        let _ = unsafe { libc::write(self.efd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

/// An SMC listener the application holds (table entry of its descriptor).
pub(crate) struct ListenerEntry {
    pub local: SocketAddr,
    /// Our descriptor of the listening TCP socket: socket options go there.
    pub tcp: OwnedFd,
    queue: Arc<Queue>,
    task: Option<tokio::task::AbortHandle>,
    owner: u32,
}

impl Drop for ListenerEntry {
    fn drop(&mut self) {
        let task = self.task.take();
        if std::process::id() == self.owner {
            // Stops accepting: the SmcListener is dropped with the task.
            if let Some(t) = task {
                t.abort();
            }
        } else {
            // A forked child: the runtime is the parent's.
            std::mem::forget(task);
        }
    }
}

/// The interposed `listen()` of a bound TCP socket: the runtime takes the listening
/// socket and an eventfd takes its number.
pub(crate) fn listen(
    stack: &Stack,
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
    match adopt(stack, fd) {
        Ok(local) => {
            report::line(format_args!("listen local={local} mode=SMC"));
        }
        Err(e) => {
            report::line(format_args!("listen fd={fd} mode=TCP info=\"{e}\""));
        }
    }
    0
}

fn dup_cloexec(fd: c_int) -> io::Result<OwnedFd> {
    let d = real::fcntl_raw(fd, libc::F_DUPFD_CLOEXEC, 0);
    if d < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `d` is a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(d) })
}

fn adopt(stack: &Stack, fd: c_int) -> io::Result<SocketAddr> {
    let fl = real::fcntl_raw(fd, libc::F_GETFL, 0);
    let fdfl = real::fcntl_raw(fd, libc::F_GETFD, 0);
    let ours = dup_cloexec(fd)?;
    let runtime_fd = dup_cloexec(fd)?;
    let l = TcpListener::from(runtime_fd);
    let local = l.local_addr()?;
    let nonblocking = fl >= 0 && fl & libc::O_NONBLOCK != 0;
    let mut efl = libc::EFD_SEMAPHORE | libc::EFD_CLOEXEC;
    if nonblocking {
        efl |= libc::EFD_NONBLOCK;
    }
    // SAFETY: plain flags.
    let efd = unsafe { libc::eventfd(0, efl) };
    if efd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `efd` is new and ours.
    let efd = unsafe { OwnedFd::from_raw_fd(efd) };
    let queue = Arc::new(Queue {
        items: Mutex::new(VecDeque::new()),
        efd: dup_cloexec(efd.as_raw_fd())?,
    });
    let smc_l = crate::guarded(|| SmcListener::from_listening_with(stack, l))?;
    // The number the application knows becomes the eventfd; the runtime and `ours`
    // keep the TCP socket.
    let cloexec = if fdfl >= 0 && fdfl & libc::FD_CLOEXEC != 0 {
        libc::O_CLOEXEC
    } else {
        0
    };
    if real::dup3_raw(efd.as_raw_fd(), fd, cloexec) < 0 {
        return Err(io::Error::last_os_error());
    }
    drop(efd);
    let q = queue.clone();
    let task = crate::runtime().spawn(accept_loop(smc::tokio::SmcListener::from_std(smc_l), q));
    let entry = ListenerEntry {
        local,
        tcp: ours,
        queue,
        task: Some(task.abort_handle()),
        owner: std::process::id(),
    };
    drop(table::insert(fd, table::Entry::Listener(Arc::new(entry))));
    Ok(local)
}

async fn accept_loop(l: smc::tokio::SmcListener, q: Arc<Queue>) {
    loop {
        let (s, peer) = l.accept_std().await;
        let a = match s.into_fallback() {
            Ok((tcp, reason)) => {
                let local = tcp.local_addr().ok();
                report::line(format_args!(
                    "accept local={} peer={peer} mode=TCP info=\"{reason}\"",
                    local.map_or_else(|| "?".into(), |a| a.to_string())
                ));
                Accepted {
                    fd: OwnedFd::from(tcp),
                    peer,
                    stream: None,
                }
            }
            Err(s) => match conn::start(s, "accept") {
                Ok((fd, entry)) => Accepted {
                    fd,
                    peer,
                    stream: Some(entry),
                },
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "cannot hand an SMC-R connection over");
                    continue;
                }
            },
        };
        q.push(a);
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

/// The interposed `accept4()` on an SMC listener.
///
/// # Safety
/// `addr`/`len` as for accept4(2).
pub(crate) unsafe fn accept(
    l: &ListenerEntry,
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    if std::process::id() != l.owner {
        // The eventfd is shared with the parent, the queue is not: a token taken here
        // would lose the parent a connection.
        tracing::warn!("accept() on an SMC listener inherited across fork: only the process that called listen() accepts");
        return real::fail(libc::EINVAL);
    }
    let a = loop {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into `v`; blocks or not as the application set the
        // descriptor (it is the eventfd).
        let r = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
        if r < 0 {
            return -1;
        }
        let item = l.queue.items.lock().ok().and_then(|mut q| q.pop_front());
        if let Some(a) = item {
            break a;
        }
    };
    conn::apply_accept_flags(&a.fd, flags);
    // SAFETY: the caller's buffer.
    unsafe { write_addr(&a.peer, addr, len) };
    let raw = a.fd.as_raw_fd();
    if let Some(e) = a.stream {
        drop(table::insert(raw, table::Entry::Stream(e)));
    }
    conn::into_app(a.fd)
}
