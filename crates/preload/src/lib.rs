//! `libsmc_preload.so`: SMC-R for unmodified programs (`smc run PROG`, or
//! `LD_PRELOAD=libsmc_preload.so PROG`).
//!
//! The library interposes the few libc calls where a TCP socket's fate is decided —
//! `connect`, `listen`, `accept`/`accept4` — and those that must answer for the
//! descriptors it hands out — `close`, `dup`/`dup2`/`dup3`, `fcntl(F_DUPFD*)`,
//! `getsockname`/`getpeername`, `getsockopt`/`setsockopt`, and `sendto`/`sendmsg` (a
//! destination named on a connected socket, which TCP ignores, is dropped for ours) —
//! all found with `dlsym(RTLD_NEXT)`. Every AF_INET/AF_INET6 TCP socket the program connects or
//! listens on goes through the SMC-R runtime (`Stack::global()`, configured from the
//! environment like the `smc` command's): the TCP option (eBPF when installed, or
//! `SMC_RS_SKIP_TCP_OPTION`), CLC, then SMC-R or TCP with the reason.
//!
//! What the application then holds is always a real kernel descriptor with the number
//! it expects:
//! - a TCP fallback (either side) is the TCP socket itself, untouched;
//! - an SMC-R connection is one end of an AF_UNIX socketpair whose other end a task
//!   copies to and from the connection ([`conn`]), so data calls, readiness
//!   (poll/select/epoll, level- or edge-triggered), FIONREAD, sendfile and splice are
//!   the kernel's own and need no interposition;
//! - an SMC listener is one end of a SOCK_SEQPACKET socketpair on which each finished
//!   rendezvous arrives as a message carrying its descriptor ([`listen`]).
//!
//! Not interposed, so plain TCP (documented in the README): static binaries, io_uring
//! and raw system calls for connect/listen/accept.
//!
//! `fork()`: the child starts its own runtime on first use (`smc_verbs::process`), so
//! its own connections and listeners are SMC-R too. The SMC-R descriptors it inherited
//! keep working through the parent's pumps; a listener it inherited keeps receiving
//! the parent's connections, and once the child waits on it (accept, poll, select,
//! epoll) the child watches the parent and starts its own accept task when the parent
//! is gone — a server that daemonizes keeps its listeners ([`listen`]).

// The unit tests build without the exported symbols (a test binary must not interpose
// its own socket calls), which leaves their callees unused there.
#![cfg_attr(test, allow(dead_code))]

mod conn;
mod listen;
mod lock;
mod real;
mod report;
mod sizes;
mod table;

use std::cell::Cell;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use libc::{c_int, sockaddr, socklen_t};
use smc::Stack;

thread_local! {
    /// This thread is inside the library's own work (a rendezvous, a listener set-up):
    /// socket calls it makes are the runtime's, not the application's.
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread marked busy, and catches a panic (nothing may unwind
/// into C) as an error.
pub(crate) fn guarded<T>(f: impl FnOnce() -> std::io::Result<T>) -> std::io::Result<T> {
    let was = BUSY.with(|b| b.replace(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    BUSY.with(|b| b.set(was));
    r.unwrap_or_else(|_| Err(std::io::Error::other("SMC-R runtime panicked")))
}

/// The library's one-time set-up ran (tracing, providers, fork handlers); `false` if
/// the fork handlers could not be registered (then SMC is never tried).
static INIT: OnceLock<bool> = OnceLock::new();

fn init() -> bool {
    *INIT.get_or_init(|| {
        // Warnings reach the program's stderr even without SMC_LOG: what takes SMC-R
        // away from the whole process (no RDMA device, a RoCEv2 port that cannot be
        // shared) must never be silent. SMC_LOG=off silences them.
        let filter = tracing_subscriber::EnvFilter::try_from_env("SMC_LOG").unwrap_or_else(|_| {
            // The TCP-option override's per-connection warning is for SMC_LOG users
            // (the `smc` command does the same).
            tracing_subscriber::EnvFilter::new("warn,smc::tcp_option::policy=error")
        });
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .try_init();
        // The stack's own descriptors go above the program's, as ours do (real.rs).
        smc_verbs::process::set_fd_floor(real::fd_floor());
        smc_providers::install_default();
        smc_bpf::install_default();
        // SAFETY: three plain `extern "C"` functions with no arguments.
        let r = unsafe {
            libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child))
        };
        r == 0
    })
}

/// The stack, when this call should try SMC: not from the library's own work. Each
/// process has its own (a forked child starts one on first use: the parent's threads
/// are not in it, `smc_verbs::process`).
fn stack() -> Option<&'static Stack> {
    if BUSY.with(|b| b.get()) || !init() {
        return None;
    }
    let s = std::panic::catch_unwind(Stack::global).ok()?;
    // Registered after Stack::global's own handler, so it runs first: the data is out
    // before the stack says goodbye to its peers (DELETE LINK). Once per address space:
    // a forked child inherits it.
    static EXIT: std::sync::Once = std::sync::Once::new();
    EXIT.call_once(|| {
        // SAFETY: a plain `extern "C"` function with no arguments.
        if unsafe { libc::atexit(drain_at_exit) } != 0 {
            tracing::debug!("atexit registration failed; data in flight at exit may be lost");
        }
    });
    Some(s)
}

/// SMC-R pumps still running (conn.rs).
pub(crate) static LIVE_PUMPS: AtomicUsize = AtomicUsize::new(0);

/// At exit(): what the kernel does for TCP sockets a process leaves open, the library
/// does for its SMC-R connections, since its threads die with the process: it closes
/// the application's descriptors (the pumps then forward what is still buffered and
/// close), and waits until every connection has sent its data and its close flags
/// (at most `SMC_RS_PRELOAD_EXIT_DRAIN_MS`, default 5000).
extern "C" fn drain_at_exit() {
    // A process that never started a stack has no pumps (a forked child's inherited
    // streams are pumped by its parent).
    let Some(stack) = Stack::global_if_started() else {
        return;
    };
    for fd in table::stream_fds() {
        let e = table::remove(fd);
        if let Some(f) = real::close() {
            // SAFETY: `fd` is the application's descriptor of an SMC-R stream; the
            // process is exiting and nothing of ours uses it after this.
            unsafe { f(fd) };
        }
        drop(e);
    }
    let limit = smc_verbs::process::config_var("SMC_RS_PRELOAD_EXIT_DRAIN_MS")
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(5), Duration::from_millis);
    let t = Instant::now();
    while t.elapsed() < limit {
        // Our final flags not sent yet (RFC 7609 §4.8.1: C/D follow the data).
        let busy = stack.connections().iter().any(|c| {
            matches!(
                c.state.as_str(),
                "ACTIVE" | "APPCLOSEWAIT1" | "APPCLOSEWAIT2" | "APPFINCLOSEWAIT"
            )
        });
        if !busy && LIVE_PUMPS.load(Ordering::Acquire) == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The tokio runtime of the pumps and accept loops (started on first use; a forked
/// child starts its own).
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: smc_verbs::process::PerProcess<tokio::runtime::Runtime> =
        smc_verbs::process::PerProcess::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("smc-preload")
            // I/O and timers; no signal driver (its socketpair would be three more
            // descriptors, and the library handles no signals).
            .enable_io()
            .enable_time()
            .build()
            .unwrap_or_else(|e| panic!("cannot start the smc-preload runtime: {e}"))
    })
}

/// A pidfd of the forking process while a fork is under way (-1: none): the child's
/// inherited listeners watch it (`listen::forked`). Opened by the parent, before the
/// fork, because the child cannot name its parent afterwards: a daemonizing parent may
/// exit before the child runs its handler, and `getppid()` then names the reaper
/// instead (the child would wait for the wrong process to end before taking over).
static FORK_PIDFD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn fork_prepare() {
    // Held across fork(): the child's copy is then never locked by a thread it lacks.
    let t = table::TABLE.lock();
    if table::has_listener(&t) {
        // SAFETY: pidfd_open(2) of this process, with no flags.
        let p =
            unsafe { libc::syscall(libc::SYS_pidfd_open, libc::c_long::from(libc::getpid()), 0) };
        FORK_PIDFD.store(if p >= 0 { p as c_int } else { -1 }, Ordering::Release);
    }
    std::mem::forget(t);
    std::mem::forget(conn::PUMPS.lock());
}

/// Closes the pidfd fork_prepare opened (the parent's copy, or the child's once used).
fn close_fork_pidfd() {
    let p = FORK_PIDFD.swap(-1, Ordering::AcqRel);
    if p >= 0 {
        // SAFETY: fork_prepare's descriptor, owned by nothing else. The system call:
        // our interposed close would look at the table.
        unsafe { libc::syscall(libc::SYS_close, libc::c_long::from(p)) };
    }
}

extern "C" fn fork_parent() {
    close_fork_pidfd();
    // SAFETY: fork_prepare locked them on this thread and forgot the guards.
    unsafe {
        conn::PUMPS.force_unlock();
        table::TABLE.force_unlock();
    }
}

extern "C" fn fork_child() {
    // SAFETY: as in fork_parent (the child has only this thread).
    unsafe {
        conn::PUMPS.force_unlock();
        table::TABLE.force_unlock();
    }
    // The parent's pumps run in the parent: their entries (and the connection handles
    // in them) are leaked, never dropped here.
    std::mem::forget(std::mem::take(&mut *conn::PUMPS.lock()));
    // The parent's pumps are not here; the child counts its own.
    LIVE_PUMPS.store(0, Ordering::Release);
    listen::UNWATCHED.store(0, Ordering::Release);
    let parent = FORK_PIDFD.load(Ordering::Acquire);
    // SAFETY: fork_prepare's descriptor, inherited; open until close_fork_pidfd below.
    table::forked((parent >= 0).then(|| unsafe { BorrowedFd::borrow_raw(parent) }));
    close_fork_pidfd();
}

/// A TCP socket of the internet families (the ones SMC serves).
fn is_tcp(fd: c_int) -> bool {
    matches!(
        real::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN),
        Some(libc::AF_INET | libc::AF_INET6)
    ) && real::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_TYPE) == Some(libc::SOCK_STREAM)
        && real::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL) == Some(libc::IPPROTO_TCP)
}

/// The internet address in a sockaddr, if it is one.
///
/// # Safety
/// `addr` is null or valid for `len` bytes.
unsafe fn inet_addr(addr: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
    if addr.is_null() || (len as usize) < std::mem::size_of::<libc::sa_family_t>() {
        return None;
    }
    // SAFETY: `addr` is valid for at least the family field.
    let family = c_int::from(unsafe { std::ptr::read_unaligned(addr.cast::<libc::sa_family_t>()) });
    match family {
        libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: `addr` is valid for a sockaddr_in (length checked).
            let a = unsafe { std::ptr::read_unaligned(addr.cast::<libc::sockaddr_in>()) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: `addr` is valid for a sockaddr_in6 (length checked).
            let a = unsafe { std::ptr::read_unaligned(addr.cast::<libc::sockaddr_in6>()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inet_addr_reads_both_families_and_rejects_others() {
        for a in ["127.0.0.2:8000", "[::1]:443", "[fe80::1%2]:7"] {
            let a: SocketAddr = a.parse().unwrap();
            let sa = socket2::SockAddr::from(a);
            // SAFETY: `sa` holds `sa.len()` bytes.
            assert_eq!(unsafe { inet_addr(sa.as_ptr().cast(), sa.len()) }, Some(a));
            // Too short for the family: not an address.
            // SAFETY: as above, shorter length.
            assert_eq!(unsafe { inet_addr(sa.as_ptr().cast(), sa.len() - 1) }, None);
        }
        let un = libc::sockaddr_un {
            sun_family: libc::AF_UNIX as libc::sa_family_t,
            sun_path: [0; 108],
        };
        let len = std::mem::size_of_val(&un) as socklen_t;
        // SAFETY: `un` is valid for `len` bytes.
        assert_eq!(
            unsafe { inet_addr((&un as *const libc::sockaddr_un).cast(), len) },
            None
        );
        // SAFETY: a null address.
        assert_eq!(unsafe { inet_addr(std::ptr::null(), 16) }, None);
    }
}

#[cfg(not(test))]
mod exports;
