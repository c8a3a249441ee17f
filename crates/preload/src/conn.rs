//! SMC-R streams: the interposed `connect()`, and the pump that joins an SMC-R
//! connection to the descriptor the application holds.
//!
//! The application's descriptor of an SMC-R connection is one end of an AF_UNIX
//! socketpair; a task on this library's tokio runtime copies between the other end and
//! the connection, both ways (urgent data as AF_UNIX MSG_OOB). So every call on that descriptor — read/write and their
//! vector and msg forms, MSG_PEEK/MSG_WAITALL/MSG_DONTWAIT, poll/select/epoll in every
//! mode, FIONREAD, sendfile, splice, O_NONBLOCK — is the kernel's own, on a real socket,
//! and readiness means what it says. The price is one more copy and a thread hand-off
//! each way (README "Running unmodified programs").
//!
//! Ends map as TCP's do: the application's `shutdown(SHUT_WR)` (end of file on our end)
//! half-closes the SMC-R connection (PeerDoneWriting, RFC 7609 §4.8.1); the peer's
//! half-close becomes end of file for the application; when every descriptor of the
//! application's end is closed (POLLHUP on ours) the connection is closed, aborted if
//! data was still arriving (§4.8.2), as TCP sends RST.

use std::collections::BTreeMap;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libc::{c_int, sockaddr, socklen_t};
use smc::{SmcStream, Stack};
use tokio::io::{AsyncRead, AsyncWriteExt};

use crate::real;
use crate::report;

/// An option value set at (level, name).
pub(crate) type SavedOpt = ((c_int, c_int), Vec<u8>);

/// An SMC-R stream the application holds (table entry of its descriptor): what the
/// calls on it answer that a socketpair end cannot. It holds no handle on the
/// connection (the pump has the only one), so it may live in any process.
pub(crate) struct StreamEntry {
    pub local: SocketAddr,
    pub peer: SocketAddr,
    /// A descriptor of the connection's TCP socket (idle while SMC-R carries the data,
    /// RFC 7609 §4.8): IP/IPv6/TCP-level options, SO_KEEPALIVE and TCP_INFO go to it,
    /// as Linux SMC forwards them to its CLC socket. `None` if it could not be had.
    pub tcp: Option<OwnedFd>,
    /// Without `tcp`: the options at the IP/IPv6/TCP levels the application set (the
    /// socketpair end has none), given back by getsockopt.
    pub opts: Mutex<Vec<SavedOpt>>,
}

impl StreamEntry {
    pub(crate) fn new(local: SocketAddr, peer: SocketAddr, tcp: Option<OwnedFd>) -> StreamEntry {
        StreamEntry {
            local,
            peer,
            tcp,
            opts: Mutex::new(Vec::new()),
        }
    }

    /// Where an option at (level, name) goes: the TCP socket for IP/IPv6/TCP levels,
    /// SO_KEEPALIVE and SO_LINGER (the pump aborts a connection closed with linger 0),
    /// else the socketpair end.
    pub(crate) fn tcp_for(&self, level: c_int, name: c_int) -> Option<RawFd> {
        let tcp_level =
            level != libc::SOL_SOCKET || matches!(name, libc::SO_KEEPALIVE | libc::SO_LINGER);
        self.tcp
            .as_ref()
            .filter(|_| tcp_level)
            .map(|t| t.as_raw_fd())
    }
}

/// Bytes of one connection, for the report at its end.
#[derive(Default)]
struct Counters {
    sent: AtomicU64,
    received: AtomicU64,
}

/// What a `close()` with `SO_LINGER` waits on: a pump of this process, by the file of the
/// application's end of its socketpair.
pub(crate) struct Progress {
    /// Bytes the pump has read from the application and not yet handed to the
    /// connection.
    in_hand: AtomicU64,
    /// The connection (its unconfirmed bytes); taken when the pump ends, so that the
    /// connection closes (a handle keeps it open).
    control: Mutex<Option<smc::tokio::Control>>,
}

/// The running pumps, by the file of the application's end: the process running each
/// (belt and braces: a forked child empties its copy) and its progress. The fork
/// handlers hold it across `fork()` (lib.rs), and a child leaks its copy of the
/// parent's entries (their handles belong to the parent's runtime).
pub(crate) static PUMPS: crate::lock::Mutex<BTreeMap<FileId, (u32, Arc<Progress>)>> =
    crate::lock::Mutex::new(BTreeMap::new());

/// A file's identity (st_dev, st_ino), as `table::file_of` gives it.
type FileId = (u64, u64);

fn pump_of(file: (u64, u64)) -> Option<Arc<Progress>> {
    let pid = std::process::id();
    PUMPS
        .lock()
        .get(&file)
        .filter(|(p, _)| *p == pid)
        .map(|(_, g)| g.clone())
}

/// `setsockopt(IPPROTO_TCP, TCP_CORK | TCP_NODELAY)` on an SMC-R stream (already set on
/// its TCP socket, which answers getsockopt): the option also applies to the
/// connection, as Linux SMC honours both on its data path — corked data waits for more
/// (at most 200 ms), and TCP_NODELAY sends what is held. Through this process's pump of
/// the descriptor; a forked child writing through its parent's pump leaves the
/// connection as it is.
pub(crate) fn tcp_option_set(fd: c_int, name: c_int, on: bool) {
    let Some(p) = crate::table::file_of(fd).and_then(pump_of) else {
        tracing::debug!(
            fd,
            "TCP option not applied to the connection: no pump of ours"
        );
        return;
    };
    let Ok(c) = p.control.lock() else {
        return;
    };
    match (c.as_ref(), name) {
        (Some(c), libc::TCP_CORK) => c.set_cork(on),
        (Some(c), libc::TCP_NODELAY) => c.set_nodelay(on),
        _ => {}
    }
}

/// `close()` of the last descriptor of an SMC-R stream whose TCP socket has `SO_LINGER`
/// {1, t > 0} waits, at most t in all, as TCP's close waits for its data and FIN to be
/// acknowledged: before the descriptor closes, until everything the program wrote is
/// confirmed in the peer's RMB (out of the socketpair — SIOCOUTQ —, out of the pump, and
/// acknowledged by the peer's RNIC); after it closed, until the pump has ended, having
/// closed the connection (its close indication is posted). A program that leaves with
/// `_exit` right after such a close has delivered its data and its close.
pub(crate) struct Linger {
    file: (u64, u64),
    end: std::time::Instant,
}

impl Linger {
    /// The first half (before the descriptor closes); `None` when `close()` does not
    /// linger.
    pub(crate) fn before_close(fd: c_int, entry: &StreamEntry) -> Option<Linger> {
        let tcp = entry.tcp.as_ref()?;
        let t = match socket2::SockRef::from(tcp).linger() {
            Ok(Some(t)) if !t.is_zero() => t,
            _ => return None,
        };
        let file = crate::table::file_of(fd)?;
        if crate::table::fds_of_file(file).len() != 1 {
            return None; // not the last descriptor: nothing closes yet
        }
        let p = pump_of(file)?;
        let end = std::time::Instant::now() + t;
        loop {
            let mut outq: c_int = 0;
            // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one int.
            let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut outq) };
            let pending = (r == 0 && outq > 0)
                || p.in_hand.load(Ordering::Acquire) > 0
                || p.control
                    .lock()
                    .ok()
                    .and_then(|c| c.as_ref().map(|c| c.unconfirmed()))
                    .is_some_and(|n| n > 0);
            if !pending || pump_of(file).is_none() || std::time::Instant::now() >= end {
                return Some(Linger { file, end });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The second half (the descriptor is closed): until the pump has ended.
    pub(crate) fn after_close(self) {
        while pump_of(self.file).is_some() && std::time::Instant::now() < self.end {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Joins an SMC-R stream to a new socketpair: returns the application's end
/// (close-on-exec, blocking); the pump runs until both ends are done.
pub(crate) fn start(s: SmcStream, event: &'static str) -> io::Result<OwnedFd> {
    let local = s.local_addr()?;
    let peer = s.peer_addr()?;
    let (rmb, sndbuf) = s.buffer_sizes().unwrap_or_default();
    let (app, ours) = std::os::unix::net::UnixStream::pair()?;
    let app_file = crate::table::file_of(app.as_raw_fd());
    let ours = real::move_high(ours);
    ours.set_nonblocking(true)?;
    let counters = Arc::new(Counters::default());
    let c = counters.clone();
    let mode = s.mode().to_string();
    /// Counts a running pump, also when its task is dropped unfinished.
    struct Live;
    impl Drop for Live {
        fn drop(&mut self) {
            crate::LIVE_PUMPS.fetch_sub(1, Ordering::AcqRel);
        }
    }
    // Registered with the runtime here, not in the task: the pump's progress is listed
    // (PUMPS) before the program holds the descriptor, so that a setsockopt or a
    // lingering close() right after connect()/accept() finds it.
    let (stream, unix) = crate::guarded(|| {
        let _rt = crate::runtime().enter();
        let stream = smc::tokio::SmcStream::from_std(s)?;
        let unix = tokio::net::UnixStream::from_std(ours)?;
        Ok((stream, unix))
    })?;
    let progress = Arc::new(Progress {
        in_hand: AtomicU64::new(0),
        control: Mutex::new(stream.control()),
    });
    if let Some(f) = app_file {
        PUMPS
            .lock()
            .insert(f, (std::process::id(), progress.clone()));
    }
    crate::LIVE_PUMPS.fetch_add(1, Ordering::AcqRel);
    let live = Live;
    crate::runtime().spawn(async move {
        let _live = live;
        pump(stream, unix, app_file, &c, &progress).await;
        // The last handle goes first: the connection closes (its close indication is
        // posted) before a lingering close() learns that the pump ended.
        if let Ok(mut h) = progress.control.lock() {
            h.take();
        }
        if let Some(f) = app_file {
            let mut pumps = PUMPS.lock();
            if pumps
                .get(&f)
                .is_some_and(|(_, g)| Arc::ptr_eq(g, &progress))
            {
                pumps.remove(&f);
            }
        }
        report::line(format_args!(
            "close local={local} peer={peer} mode=SMC-R sent={} received={}",
            c.sent.load(Ordering::Relaxed),
            c.received.load(Ordering::Relaxed)
        ));
    });
    report::line(format_args!(
        "{event} local={local} peer={peer} mode=SMC-R info=\"{mode}\" rmb={rmb} sndbuf={sndbuf}"
    ));
    Ok(OwnedFd::from(app))
}

/// The pump's buffer per direction.
const CHUNK: usize = 64 * 1024;

/// True when every descriptor of the application's end is closed (not just shut down
/// for writing): our end then reports POLLHUP.
fn peer_end_closed(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no waiting.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & libc::POLLHUP != 0
}

/// `SIOCATMARK` (asm-generic/sockios.h; not in the libc crate).
const SIOCATMARK: libc::Ioctl = 0x8905;

/// Whether the next byte on our end of the socketpair is the application's urgent
/// byte (AF_UNIX `MSG_OOB`, Linux 5.15+: the queue's head is the OOB byte).
fn at_mark(fd: RawFd) -> bool {
    let mut v: c_int = 0;
    // SAFETY: SIOCATMARK writes one int into `v`.
    unsafe { libc::ioctl(fd, SIOCATMARK, &mut v) == 0 && v != 0 }
}

/// `recv` of at most one byte with `flags` and MSG_DONTWAIT: the byte, or the error.
fn recv_one(fd: RawFd, flags: c_int) -> io::Result<Option<u8>> {
    let mut b = 0u8;
    // SAFETY: receives at most one byte into `b`.
    let n = unsafe {
        libc::recv(
            fd,
            (&mut b as *mut u8).cast(),
            1,
            flags | libc::MSG_DONTWAIT,
        )
    };
    match n {
        n if n < 0 => Err(io::Error::last_os_error()),
        0 => Ok(None),
        _ => Ok(Some(b)),
    }
}

/// What the application's end holds next.
enum Up {
    /// In-band data (the read's byte count), or end of file (0).
    Data(usize),
    /// Its urgent byte.
    Urgent(u8),
}

/// One step of the application → SMC-R direction. Reads stop at an AF_UNIX OOB mark,
/// but a read that *starts* at it drops the urgent byte; so a read happens only when
/// the queue's head is known to be in-band data: a one-byte peek found data, and
/// then the head was not the mark (only this task consumes; new data goes to the tail).
/// `in_hand` is set before the read that takes data out of the socketpair and keeps its
/// count (the caller clears it once the connection has the bytes): a lingering `close()`
/// never sees the data in neither place.
async fn up_step(
    unix: &tokio::net::UnixStream,
    buf: &mut [u8],
    in_hand: &AtomicU64,
) -> io::Result<Up> {
    let fd = unix.as_raw_fd();
    loop {
        unix.readable().await?;
        let peeked = unix.try_io(tokio::io::Interest::READABLE, || {
            recv_one(fd, libc::MSG_PEEK)
        });
        if at_mark(fd) {
            // At the mark the OOB byte is there to take (our end is not OOBINLINE);
            // reading in-band now would drop it. Once taken, SIOCATMARK stays true
            // until the next in-band read (as on TCP) and recv(MSG_OOB) says EINVAL.
            match recv_one(fd, libc::MSG_OOB) {
                Ok(Some(b)) => return Ok(Up::Urgent(b)),
                Err(e) if e.raw_os_error() != Some(libc::EINVAL) => return Err(e),
                _ => {}
            }
        }
        match peeked {
            Ok(_) => {
                in_hand.store(u64::MAX, Ordering::Release);
                match unix.try_read(buf) {
                    Ok(n) => {
                        in_hand.store(n as u64, Ordering::Release);
                        return Ok(Up::Data(n));
                    }
                    Err(e) => {
                        in_hand.store(0, Ordering::Release);
                        if e.kind() == io::ErrorKind::WouldBlock {
                            continue;
                        }
                        return Err(e);
                    }
                }
            }
            // Nothing in-band (an urgent byte alone was handled above).
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Writes all of `data` to our end of the socketpair.
async fn unix_write_all(unix: &tokio::net::UnixStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        unix.writable().await?;
        match unix.try_write(data) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The peer's urgent byte to the application, after the data before it: AF_UNIX
/// `send(MSG_OOB)` puts the mark there (SIOCATMARK, POLLPRI and SIGURG on its end).
async fn unix_send_oob(unix: &tokio::net::UnixStream, b: u8) -> io::Result<()> {
    let fd = unix.as_raw_fd();
    loop {
        unix.writable().await?;
        let r = unix.try_io(tokio::io::Interest::WRITABLE, || {
            // SAFETY: sends one byte from `b`.
            let n = unsafe {
                libc::send(
                    fd,
                    (&b as *const u8).cast(),
                    1,
                    libc::MSG_OOB | libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        });
        match r {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

/// What the SMC-R connection holds next.
enum Down {
    Data(usize),
    Urgent(u8),
}

/// Why a direction of the pump ends everything.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum End {
    /// Both directions finished, or the application closed its end.
    Closed,
    /// The connection was reset or aborted (the peer's abort, a lost link group, a
    /// timeout): the application is to read ECONNRESET, as on a TCP socket after RST.
    Reset,
}

fn is_reset(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted | io::ErrorKind::TimedOut
    )
}

/// Makes the application's end of the socketpair report ECONNRESET once it has read
/// what it was sent: Linux sets ECONNRESET on the peer of an AF_UNIX stream socket that
/// is closed with unread data in its receive queue (`unix_release_sock`), so one byte
/// goes into our end's queue, sent through a descriptor of the application's end, just
/// before our end closes. The descriptor is taken from the table and duplicated first,
/// and the duplicate checked to be that end: the application may close or reuse the
/// number at any time.
fn reset_app_end(file: (u64, u64)) {
    for fd in crate::table::fds_of_file(file) {
        let d = real::dup_high(fd);
        if d < 0 {
            continue;
        }
        // SAFETY: `d` was just created by fcntl(F_DUPFD_CLOEXEC) and is ours.
        let d = unsafe { OwnedFd::from_raw_fd(d) };
        if crate::table::file_of(d.as_raw_fd()) != Some(file) {
            continue;
        }
        // SAFETY: one byte from a valid buffer on a descriptor we own; never blocks.
        let n = unsafe {
            libc::send(
                d.as_raw_fd(),
                [0u8].as_ptr().cast(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n == 1 || real::errno() == libc::EAGAIN {
            // Sent, or our end's queue is full: not empty either way.
            return;
        }
    }
    tracing::debug!("no descriptor of the application's end left: it reads EOF");
}

/// Copies between the SMC-R connection and our end of the socketpair until both
/// directions end, the application closes its end, or the connection fails (then the
/// application's end is made to report ECONNRESET, `app_file` being that end).
async fn pump(
    smc: smc::tokio::SmcStream,
    unix: tokio::net::UnixStream,
    app_file: Option<(u64, u64)>,
    c: &Counters,
    progress: &Progress,
) {
    let ufd = unix.as_raw_fd();
    // Urgent data (RFC 7609 §4.7.5) crosses as AF_UNIX MSG_OOB on the socketpair; the
    // program's SO_LINGER is on the TCP socket (exports.rs).
    let control = smc.control();
    let (mut sr, mut sw) = tokio::io::split(smc);
    let unix = &unix;
    // Application → SMC-R. Returns how everything must end (the application closed its
    // descriptor, or the connection failed), or `None` when only this direction is done.
    let up = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match up_step(unix, &mut buf, &progress.in_hand).await {
                Ok(Up::Data(0)) => {
                    tracing::debug!("application end: end of file");
                    if peer_end_closed(ufd) {
                        // close() with SO_LINGER {1, 0} aborts, as TCP sends RST.
                        if let Some(c) = &control {
                            if c.tcp_linger().ok().flatten() == Some(Duration::ZERO) {
                                c.abort();
                            }
                        }
                        return Some(End::Closed);
                    }
                    let _ = sw.shutdown().await;
                    return None;
                }
                Ok(Up::Data(n)) => {
                    let w = sw.write_all(&buf[..n]).await;
                    progress.in_hand.store(0, Ordering::Release);
                    if let Err(e) = w {
                        tracing::debug!(error = %e, "SMC-R connection failed");
                        return Some(if is_reset(&e) {
                            End::Reset
                        } else {
                            End::Closed
                        });
                    }
                    c.sent.fetch_add(n as u64, Ordering::Relaxed);
                }
                Ok(Up::Urgent(b)) => {
                    let sent = match &control {
                        Some(u) => u.send_urgent(b).await,
                        None => Err(io::ErrorKind::Unsupported.into()),
                    };
                    if let Err(e) = sent {
                        tracing::debug!(error = %e, "cannot send the urgent byte");
                        return Some(if is_reset(&e) {
                            End::Reset
                        } else {
                            End::Closed
                        });
                    }
                    c.sent.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "application end failed");
                    return Some(End::Closed);
                }
            }
        }
    };
    // SMC-R → application. Reads stop at the peer's urgent mark; the byte is asked
    // for after each read and whenever the connection wakes the reader.
    let down = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let step = std::future::poll_fn(|cx| {
                let urgent_now = || control.as_ref().and_then(|u| u.take_urgent_at_mark());
                if let Some(b) = urgent_now() {
                    return std::task::Poll::Ready(Ok(Down::Urgent(b)));
                }
                let mut rb = tokio::io::ReadBuf::new(&mut buf);
                match std::pin::Pin::new(&mut sr).poll_read(cx, &mut rb) {
                    std::task::Poll::Ready(Ok(())) => {
                        std::task::Poll::Ready(Ok(Down::Data(rb.filled().len())))
                    }
                    std::task::Poll::Ready(Err(e)) => std::task::Poll::Ready(Err(e)),
                    // The waker is registered: an urgent byte that arrived meanwhile
                    // is seen now or on the wake-up.
                    std::task::Poll::Pending => match urgent_now() {
                        Some(b) => std::task::Poll::Ready(Ok(Down::Urgent(b))),
                        None => std::task::Poll::Pending,
                    },
                }
            })
            .await;
            match step {
                Ok(Down::Data(0)) => {
                    // SAFETY: shuts down writing on our end (the application reads EOF).
                    unsafe { libc::shutdown(ufd, libc::SHUT_WR) };
                    return None;
                }
                Ok(Down::Data(n)) => {
                    if unix_write_all(unix, &buf[..n]).await.is_err() {
                        return Some(End::Closed);
                    }
                    c.received.fetch_add(n as u64, Ordering::Relaxed);
                }
                Ok(Down::Urgent(b)) => {
                    if unix_send_oob(unix, b).await.is_err() {
                        return Some(End::Closed);
                    }
                    c.received.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "SMC-R connection failed");
                    return Some(if is_reset(&e) {
                        End::Reset
                    } else {
                        End::Closed
                    });
                }
            }
        }
    };
    tokio::pin!(up, down);
    let (mut up_done, mut down_done) = (false, false);
    while !(up_done && down_done) {
        let end = tokio::select! {
            end = &mut up, if !up_done => {
                up_done = true;
                end
            }
            end = &mut down, if !down_done => {
                down_done = true;
                end
            }
        };
        if let Some(end) = end {
            if end == End::Reset {
                // Before our end closes (when `unix` is dropped on return).
                if let Some(f) = app_file {
                    reset_app_end(f);
                }
            }
            return;
        }
    }
    // Dropping the halves (and the urgent handle) closes the SMC-R connection (RFC 7609
    // §4.8.1, or an abort with unread data) and our end of the socketpair.
}

/// How long a non-blocking `connect()` waits for the TCP handshake before it leaves the
/// socket as plain TCP (`SMC_RS_PRELOAD_CONNECT_WAIT_MS`).
fn connect_wait() -> Duration {
    static W: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *W.get_or_init(|| {
        smc_verbs::process::config_var("SMC_RS_PRELOAD_CONNECT_WAIT_MS")
            .and_then(|v| v.parse().ok())
            .map(Duration::from_millis)
            .unwrap_or(Duration::from_secs(3))
    })
}

/// Waits until `fd` is writable (a connect finished) or `t` passes.
fn wait_writable(fd: c_int, t: Duration) -> bool {
    let deadline = std::time::Instant::now() + t;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as c_int) };
        if n == 1 {
            return true;
        }
        if n == 0 || (n < 0 && real::errno() != libc::EINTR) {
            return false;
        }
    }
}

/// `SMC_RS_LOCAL_ADDR`: the source address of client connections (as for the
/// runtime's own connects), applied when the application did not bind.
fn bind_local(fd: c_int, peer: &SocketAddr) {
    let Some(ip) = smc_verbs::process::config_var("SMC_RS_LOCAL_ADDR")
        .and_then(|v| v.parse::<std::net::IpAddr>().ok())
    else {
        return;
    };
    if ip.is_ipv4() != peer.is_ipv4() {
        return;
    }
    // SAFETY: `fd` is the application's open socket, borrowed for this call.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let sock = socket2::SockRef::from(&fd);
    let unbound = sock
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .is_some_and(|a| a.port() == 0 && a.ip().is_unspecified());
    if unbound {
        let _ = sock.bind(&SocketAddr::new(ip, 0).into());
    }
}

/// The interposed `connect()` of a TCP socket: TCP handshake on the application's
/// socket, then the SMC-R rendezvous on it; SMC-R puts the socketpair in its place,
/// anything else leaves it the TCP connection it is. A non-blocking socket waits for
/// the handshake (at most [`connect_wait`]) and returns 0.
///
/// # Safety
/// `addr`/`len` as for connect(2); `fd` is an open TCP socket not in the table.
pub(crate) unsafe fn connect(
    stack: &Stack,
    fd: c_int,
    addr: *const sockaddr,
    len: socklen_t,
    target: SocketAddr,
    real_connect: unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int,
) -> c_int {
    let fl = real::fcntl_raw(fd, libc::F_GETFL, 0);
    let nonblocking = fl >= 0 && fl & libc::O_NONBLOCK != 0;
    bind_local(fd, &target);
    // A destination the allow/deny lists (SMC_RS_ALLOW / SMC_RS_DENY) keep on TCP: no
    // option in the SYN either.
    if stack.config().policy.keeps_tcp(target).is_none() {
        // SAFETY: `fd` is open for the duration of this call.
        if let Err(e) = stack.mark_tcp_option(unsafe { BorrowedFd::borrow_raw(fd) }) {
            tracing::debug!(error = %e, "cannot mark the socket for the SMC-R option");
        }
    }
    // SAFETY: the caller's arguments, unchanged.
    let r = unsafe { real_connect(fd, addr, len) };
    if r != 0 {
        let e = real::errno();
        if !(nonblocking && e == libc::EINPROGRESS) {
            return r;
        }
        if !wait_writable(fd, connect_wait()) {
            report::line(format_args!(
                "connect peer={target} mode=TCP info=\"TCP handshake not done within {:?}: stays TCP\"",
                connect_wait()
            ));
            return real::fail(libc::EINPROGRESS);
        }
        match real::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR) {
            Some(0) => {}
            Some(err) => return real::fail(err),
            None => return real::fail(libc::EINPROGRESS),
        }
    }
    let nodelay = real::sockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY);
    let dup = real::dup_high(fd);
    if dup < 0 {
        return 0;
    }
    // SAFETY: `dup` is a new descriptor that nothing else owns.
    let tcp = unsafe { TcpStream::from_raw_fd(dup) };
    let restore = || {
        // The rendezvous made the (shared) file non-blocking and set TCP_NODELAY.
        if fl >= 0 {
            real::fcntl_raw(fd, libc::F_SETFL, fl as libc::c_ulong);
        }
        if let Some(v) = nodelay {
            real::set_sockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, v);
        }
    };
    let bufs = crate::sizes::take(fd);
    let s = match crate::guarded(|| SmcStream::from_connected_sized(stack, tcp, bufs)) {
        Ok(s) => s,
        Err(e) => {
            restore();
            report::line(format_args!(
                "connect peer={target} mode=failed info=\"{e}\""
            ));
            return real::fail(e.raw_os_error().unwrap_or(libc::ECONNRESET));
        }
    };
    let s = match s.into_fallback() {
        Ok((tcp, reason)) => {
            drop(tcp);
            restore();
            report::line(format_args!(
                "connect peer={target} mode=TCP info=\"{reason}\""
            ));
            return 0;
        }
        Err(s) => s,
    };
    let cloexec = real::fcntl_raw(fd, libc::F_GETFD, 0);
    let (local, peer) = (s.local_addr(), s.peer_addr());
    // `fd` is still the TCP socket here: the entry keeps a descriptor of it.
    let tcp = match real::dup_high(fd) {
        d if d >= 0 => {
            // SAFETY: `d` is a new descriptor nothing else owns.
            Some(unsafe { OwnedFd::from_raw_fd(d) })
        }
        _ => None,
    };
    let entry = match (local, peer) {
        (Ok(l), Ok(p)) => Arc::new(StreamEntry::new(l, p, tcp)),
        (Err(e), _) | (_, Err(e)) => return real::fail(e.raw_os_error().unwrap_or(libc::EIO)),
    };
    let app = match start(s, "connect") {
        Ok(x) => x,
        Err(e) => {
            // The SMC-R connection is gone with `s`; the TCP socket is its idle one.
            return real::fail(e.raw_os_error().unwrap_or(libc::ENOBUFS));
        }
    };
    let flags = if cloexec >= 0 && cloexec & libc::FD_CLOEXEC != 0 {
        libc::O_CLOEXEC
    } else {
        0
    };
    // Put our end where the TCP socket was: the application keeps its number. The
    // runtime holds its own descriptor of the TCP socket.
    let old = crate::table::remove(fd);
    if real::dup3_raw(app.as_raw_fd(), fd, flags) < 0 {
        return real::fail(real::errno());
    }
    drop(app);
    if fl >= 0 {
        real::fcntl_raw(fd, libc::F_SETFL, (fl & libc::O_NONBLOCK) as libc::c_ulong);
    }
    let replaced = crate::table::insert(fd, crate::table::Entry::Stream(entry));
    drop(old);
    drop(replaced);
    0
}

/// Turns an accepted descriptor into what `accept4(flags)` promises.
pub(crate) fn apply_accept_flags(fd: &OwnedFd, flags: c_int) {
    let raw = fd.as_raw_fd();
    let fl = real::fcntl_raw(raw, libc::F_GETFL, 0);
    if fl >= 0 {
        let fl = if flags & libc::SOCK_NONBLOCK != 0 {
            fl | libc::O_NONBLOCK
        } else {
            fl & !libc::O_NONBLOCK
        };
        real::fcntl_raw(raw, libc::F_SETFL, fl as libc::c_ulong);
    }
    let fdfl = if flags & libc::SOCK_CLOEXEC != 0 {
        libc::FD_CLOEXEC
    } else {
        0
    };
    real::fcntl_raw(raw, libc::F_SETFD, fdfl as libc::c_ulong);
}

/// Gives a descriptor to the application.
pub(crate) fn into_app(fd: OwnedFd) -> c_int {
    fd.into_raw_fd()
}
