//! The `std::net`-shaped surface: [`SmcListener`], [`SmcStream`] and [`Mode`].
//!
//! A stream is SMC-R (the bytes move by RDMA WRITE into the peer's RMB element, RFC
//! 7609 §4) or, when the rendezvous fell back, the plain TCP connection it started as.
//! [`SmcStream::mode`] tells which, with the reason in words for a fallback.

mod samehost;
#[cfg(feature = "tokio")]
pub mod tokio;

use std::fmt;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use smc_verbs::DriveWaker;
use socket2::{Domain, Protocol, Socket, Type};
use tracing::debug;

use crate::clc::FallbackReason;
use crate::conn::{ConnError, OobError};
use crate::endpoint::BufSizes;
use crate::runtime::cond::Cond;
use crate::runtime::conn::ConnState;
use crate::runtime::{
    drive_client_rendezvous, register_client, register_listener, ConnShared, ConnectSlot,
    Established, Inbox, Inner, LinkGroupId, ListenerShared, Stack,
};

/// How a stream carries its data.
#[derive(Clone, Debug)]
pub enum Mode {
    /// SMC-R over RDMA.
    Smc {
        /// The link group.
        link_group: LinkGroupId,
        /// SMC-R version: 1 or 2.
        version: u8,
        /// This connection created the link group.
        first_contact: bool,
    },
    /// Plain TCP.
    Fallback {
        /// Why (Display: the reason in words, with the Decline code's text).
        reason: FallbackReason,
    },
    /// smc-rs's same-host path: SMC through shared memory with another smc-rs stack on
    /// this host (docs/samehost.md), the SMC-R connection semantics without RDMA.
    SameHost {
        /// The peer process (from SO_PEERCRED).
        peer_pid: i32,
    },
}

impl Mode {
    /// True for SMC, over RDMA or through same-host shared memory (not TCP).
    pub fn is_smc(&self) -> bool {
        matches!(self, Mode::Smc { .. } | Mode::SameHost { .. })
    }

    /// True for the same-host path.
    pub fn is_same_host(&self) -> bool {
        matches!(self, Mode::SameHost { .. })
    }

    /// The mode of an established connection.
    pub(crate) fn of(c: &ConnShared) -> Mode {
        match (c.lgr(), c.shm()) {
            (Some(lgr), _) => Mode::Smc {
                link_group: LinkGroupId(lgr.0),
                version: c.version,
                first_contact: c.first_contact,
            },
            (None, p) => Mode::SameHost {
                peer_pid: p.map_or(0, |p| p.peer_pid),
            },
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Smc {
                link_group,
                version,
                first_contact,
            } => write!(
                f,
                "SMC-Rv{version} on {link_group} ({} contact)",
                if *first_contact {
                    "first"
                } else {
                    "subsequent"
                }
            ),
            Mode::Fallback { reason } => write!(f, "{reason}"),
            Mode::SameHost { peer_pid } => {
                write!(f, "SMC same-host (shared memory, peer pid {peer_pid})")
            }
        }
    }
}

/// How long a blocking same-host write waits for the peer's window before it copies
/// into the send buffer instead (`SmcHandle::write`).
const SAME_HOST_PLACE_WAIT: Duration = Duration::from_millis(2);

fn io_err(e: ConnError) -> io::Error {
    io::Error::new(e.io_kind(), e)
}

/// A blocking same-host writer ahead of its reader waits a little for the peer to
/// consume instead of filling the send buffer: once bytes wait there, every later one
/// goes through it (two copies) until it drains. Not for long: a peer that does not read
/// gets the send buffer's room too, as on SMC-R (an application may write more than the
/// RMB holds before it reads, and must not deadlock where it did not). Returns until
/// when to wait now (`None`: use the send buffer); `first` keeps the end of the short
/// wait across the call's turns.
fn place_wait(st: &ConnState, wait: Wait, first: &mut Option<Instant>) -> Option<Instant> {
    let Wait::Until(user) = wait else {
        return None;
    };
    if !st.conn.tx_place_awaits_window() {
        return None;
    }
    let now = Instant::now();
    let d = *first.get_or_insert(now + SAME_HOST_PLACE_WAIT);
    (now < d).then(|| user.map_or(d, |u| u.min(d)))
}

/// Copies the start of `src` into the regions of `dst` (a send buffer, or the peer's RMB
/// element on the same-host path), in order, as far as they reach. Returns the bytes
/// copied.
fn copy_into(
    dst: &smc_verbs::RdmaBuffer,
    regions: &[smc_proto::conn::Region],
    src: &[u8],
) -> usize {
    let mut n = 0usize;
    for r in regions {
        let take = (r.len as usize).min(src.len() - n);
        if take == 0 {
            break;
        }
        dst.write(r.off as usize, &src[n..n + take]);
        n += take;
    }
    n
}

/// The application's reference on an SMC-R connection; the last one closes it.
pub(crate) struct SmcHandle {
    pub(crate) conn: Arc<ConnShared>,
    pub(crate) stack: Arc<Inner>,
}

impl Drop for SmcHandle {
    fn drop(&mut self) {
        let mut st = self.conn.lock();
        // close(): C after all data is out, or abort with unread data (RFC 7609 §4.8.1).
        let now = Instant::now();
        st.conn.close(now);
        // Released only after this drive: a CLOSED event in it posts nothing to the
        // event thread (ConnShared::on_events); the one post is below.
        self.conn.drive(&mut st, now);
        st.released = true;
        let closed = st.conn.state() == crate::conn::State::Closed;
        drop(st);
        // The event thread frees a connection that is closed and let go of. Closed
        // already: tell it now (not freed here: on the event thread, which runs beside
        // this one, it costs the next connection nothing; freed here, the same-host
        // rate fell 8 %). Else its CLOSED event, now that it is released, tells it.
        if closed {
            self.stack.post(Inbox::Released(self.conn.token));
        }
    }
}

/// How long a blocking call may wait.
#[derive(Clone, Copy)]
pub(crate) enum Wait {
    Never,
    Until(Option<Instant>),
}

impl Wait {
    /// The caller's time is up (never for an unbounded wait; always for `Never`).
    fn passed(self) -> bool {
        match self {
            Wait::Never => true,
            Wait::Until(d) => d.is_some_and(|d| Instant::now() >= d),
        }
    }
}

/// What a blocked call waits for (runtime/conn.rs wakes readers and writers apart).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    Read,
    Write,
}

impl SmcHandle {
    fn seq(&self, dir: Dir) -> &std::sync::atomic::AtomicU64 {
        match dir {
            Dir::Read => &self.conn.rx_seq,
            Dir::Write => &self.conn.tx_seq,
        }
    }

    fn cond(&self, dir: Dir) -> &Cond {
        match dir {
            Dir::Read => &self.conn.rx_cond,
            Dir::Write => &self.conn.tx_cond,
        }
    }

    fn wait<'a>(
        &'a self,
        mut st: MutexGuard<'a, ConnState>,
        wait: Wait,
        dir: Dir,
    ) -> io::Result<MutexGuard<'a, ConnState>> {
        if let (Some(p), Wait::Until(deadline)) = (self.conn.shm(), wait) {
            let t0 = Instant::now();
            st = match self.spin_same_host(p, st, dir) {
                Ok(st) => {
                    self.conn.spin.adapt(Some(t0.elapsed()));
                    return Ok(st);
                }
                Err(st) => st,
            };
            let r = self.sleep_same_host(p, st, deadline, dir);
            self.conn.spin.adapt(r.is_ok().then(|| t0.elapsed()));
            return r;
        }
        // The RNIC is driven from this thread only on SMC-R (a same-host connection
        // that does not wait, `Wait::Never`, has no link either).
        let drive = match st.rdma() {
            Some(_) => self.stack.cfg.rnic_drive,
            None => Duration::ZERO,
        };
        let seq_of = self.seq(dir);
        let cond = self.cond(dir);
        fn drivers(st: &mut ConnState, dir: Dir) -> &mut Vec<DriveWaker> {
            match dir {
                Dir::Read => &mut st.rx_drivers,
                Dir::Write => &mut st.tx_drivers,
            }
        }
        let st = if !drive.is_zero() {
            if let Wait::Until(deadline) = wait {
                // Receive on this thread for a while (no lock held: the completion
                // handler runs here and takes the connection's lock).
                let seq = seq_of.load(Ordering::Acquire);
                // The link can change under a failover: its device, as of now.
                // (`drive` is zero without a link: the `else` cannot happen.)
                let Some(device) = st.rdma().map(|p| p.link.device.clone()) else {
                    return Ok(st);
                };
                // Registered under the lock before `seq` can move again: whoever
                // moves it (the completion handler, on whichever thread received the
                // CDC) wakes this thread's drive, which otherwise sleeps on the socket.
                let waker = DriveWaker::current();
                if let Some(w) = &waker {
                    drivers(&mut st, dir).push(w.clone());
                }
                drop(st);
                let max = deadline.map_or(drive, |d| {
                    d.saturating_duration_since(Instant::now()).min(drive)
                });
                let t0 = Instant::now();
                let answered = device.0.drive(
                    &|| seq_of.load(Ordering::Acquire) != seq,
                    waker.as_ref(),
                    max,
                    self.conn.spin.get().min(max),
                );
                // A drive that ran out is no answer (a spin as long as the drive must not
                // look like a quick one).
                self.conn.spin.adapt(answered.then(|| t0.elapsed()));
                let mut st = self.conn.lock();
                if let Some(w) = &waker {
                    let v = drivers(&mut st, dir);
                    if let Some(i) = v.iter().position(|d| d.same(w)) {
                        v.swap_remove(i);
                    }
                }
                if seq_of.load(Ordering::Acquire) != seq {
                    return Ok(st);
                }
                st
            } else {
                st
            }
        } else {
            st
        };
        let busy = self.stack.cfg.busy_poll;
        let st = if matches!(wait, Wait::Until(_)) && !busy.is_zero() {
            // Busy poll: spin a little for the completion thread's wake-up before
            // paying for a sleep and a thread wake-up.
            let seq = seq_of.load(Ordering::Acquire);
            drop(st);
            let t0 = Instant::now();
            while seq_of.load(Ordering::Acquire) == seq && t0.elapsed() < busy {
                std::hint::spin_loop();
            }
            let st = self.conn.lock();
            if seq_of.load(Ordering::Acquire) != seq {
                return Ok(st);
            }
            st
        } else {
            st
        };
        match wait {
            Wait::Never => Err(ErrorKind::WouldBlock.into()),
            Wait::Until(None) => Ok(cond.wait(st)),
            Wait::Until(Some(d)) => {
                let now = Instant::now();
                if now >= d {
                    return Err(io::Error::new(ErrorKind::WouldBlock, "timed out"));
                }
                Ok(cond.wait_timeout(st, d - now).0)
            }
        }
    }

    fn read_wait(&self, st: &ConnState) -> Wait {
        if st.nonblocking {
            Wait::Never
        } else {
            Wait::Until(st.read_timeout.map(|t| Instant::now() + t))
        }
    }

    fn write_wait(&self, st: &ConnState) -> Wait {
        if st.nonblocking {
            Wait::Never
        } else {
            Wait::Until(st.write_timeout.map(|t| Instant::now() + t))
        }
    }

    /// One read: copy what is in our RMB element (RFC 7609 §4.4), consume it.
    pub(crate) fn read(&self, buf: &mut [u8], wait: Option<Wait>) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let _polling = self.polling();
        let mut st = self.conn.lock();
        self.conn.shm_take(&mut st);
        let wait = wait.unwrap_or_else(|| self.read_wait(&st));
        loop {
            let regions = st.conn.rx_available();
            if !regions.is_empty() {
                let mut n = 0usize;
                for r in regions.as_slice() {
                    let take = (r.len as usize).min(buf.len() - n);
                    if take == 0 {
                        break;
                    }
                    self.conn.rmb.read(r.off as usize, &mut buf[n..n + take]);
                    n += take;
                }
                st.conn.rx_consume(n as u32).map_err(io_err)?;
                self.conn.drive(&mut st, Instant::now());
                return Ok(n);
            }
            if st.conn.rx_eof() {
                return Ok(0);
            }
            if let Some(e) = st.conn.error() {
                return Err(io_err(e));
            }
            st = self.wait(st, wait, Dir::Read)?;
        }
    }

    /// One write: copy into the send buffer as far as it has room, post it.
    pub(crate) fn write(&self, buf: &[u8], wait: Option<Wait>) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let _polling = self.polling();
        let mut st = self.conn.lock();
        self.conn.shm_take(&mut st);
        let wait = wait.unwrap_or_else(|| self.write_wait(&st));
        let mut place_deadline: Option<Instant> = None;
        loop {
            if let Some(e) = st.conn.error() {
                return Err(io_err(e));
            }
            if let Some(p) = self.conn.shm() {
                // Same-host: straight into the peer's mapped RMB when nothing waits in
                // the send buffer (one copy instead of two; the CDC follows as usual).
                let space = st.conn.tx_place_space().map_err(io_err)?;
                if !space.is_empty() {
                    let n = copy_into(&p.tx_data, space.as_slice(), buf);
                    st.conn.tx_place_commit(n as u32).map_err(io_err)?;
                    self.conn.drive(&mut st, Instant::now());
                    return Ok(n);
                }
                if let Some(until) = place_wait(&st, wait, &mut place_deadline) {
                    st = match self.wait(st, Wait::Until(Some(until)), Dir::Write) {
                        Ok(st) => st,
                        // The short wait's end, not the caller's: look again.
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock && !wait.passed() => {
                            self.conn.lock()
                        }
                        Err(e) => return Err(e),
                    };
                    continue;
                }
            }
            let space = st.conn.tx_space().map_err(io_err)?;
            if !space.is_empty() {
                let n = copy_into(&self.conn.sndbuf, space.as_slice(), buf);
                st.conn.tx_commit(n as u32, false).map_err(io_err)?;
                self.conn.drive(&mut st, Instant::now());
                return Ok(n);
            }
            st = self.wait(st, wait, Dir::Write)?;
        }
    }

    pub(crate) fn send_urgent(&self, byte: u8, wait: Option<Wait>) -> io::Result<()> {
        let _polling = self.polling();
        let mut st = self.conn.lock();
        self.conn.shm_take(&mut st);
        let wait = wait.unwrap_or_else(|| self.write_wait(&st));
        loop {
            if let Some(e) = st.conn.error() {
                return Err(io_err(e));
            }
            let space = st.conn.tx_space().map_err(io_err)?;
            if let Some(r) = space.as_slice().first() {
                self.conn.sndbuf.write(r.off as usize, &[byte]);
                // RFC 7609 §4.7.5: the last byte committed with MSG_OOB is urgent.
                st.conn.tx_commit(1, true).map_err(io_err)?;
                self.conn.drive(&mut st, Instant::now());
                return Ok(());
            }
            st = self.wait(st, wait, Dir::Write)?;
        }
    }

    pub(crate) fn recv_urgent(&self) -> io::Result<u8> {
        let mut st = self.conn.lock();
        let r = st.conn.read_oob();
        self.conn.drive(&mut st, Instant::now());
        r.map_err(|e| match e {
            OobError::WouldBlock => io::Error::new(ErrorKind::WouldBlock, e),
            OobError::Inline | OobError::NoUrgentData => io::Error::new(ErrorKind::InvalidInput, e),
        })
    }

    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let mut st = self.conn.lock();
        let now = Instant::now();
        match how {
            Shutdown::Write => st.conn.shutdown_write(now).map_err(io_err)?,
            Shutdown::Read => st.conn.shutdown_read(),
            Shutdown::Both => {
                st.conn.shutdown_read();
                st.conn.close(now);
            }
        }
        self.conn.drive(&mut st, now);
        self.conn.rx_cond.notify_all();
        self.conn.tx_cond.notify_all();
        for w in st.shm_rx_sleepers.iter().chain(&st.shm_tx_sleepers) {
            w.wake();
        }
        Ok(())
    }
}

enum Inner2 {
    Smc(Arc<SmcHandle>),
    Tcp(TcpStream, FallbackReason),
}

/// A stream between two SMC-R stacks, or a TCP fallback (like `std::net::TcpStream`).
pub struct SmcStream {
    inner: Inner2,
}

impl fmt::Debug for SmcStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SmcStream")
            .field("mode", &self.mode().to_string())
            .field("peer", &self.peer_addr().ok())
            .finish()
    }
}

pub(crate) fn stream_from(stack: &Arc<Inner>, e: Established) -> SmcStream {
    match e {
        Established::Smc(conn) => SmcStream {
            inner: Inner2::Smc(Arc::new(SmcHandle {
                conn,
                stack: stack.clone(),
            })),
        },
        Established::Fallback(t, r) => SmcStream {
            inner: Inner2::Tcp(t, r),
        },
    }
}

/// Connects one address: TCP (the SMC-R option marked on the socket first, RFC 7609
/// §3.1), then the rendezvous on the event thread.
pub(crate) fn connect_one(
    stack: &Arc<Inner>,
    addr: SocketAddr,
    timeout: Option<Duration>,
) -> io::Result<Established> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // A destination the allow/deny lists keep on TCP gets no option in its SYN either
    // (crate::policy), so that the server does not wait for a Proposal.
    if stack.cfg.policy.keeps_tcp(addr).is_none() {
        if let Err(e) = stack.tcp_option.mark(sock.as_fd()) {
            debug!(error = %e, "cannot mark the socket for the SMC-R option");
        }
    }
    if let Some(ip) = stack.cfg.local_addr {
        if ip.is_ipv4() == addr.is_ipv4() {
            crate::runtime::bind_no_port(&sock, ip)?;
        }
    }
    let t0 = Instant::now();
    match timeout {
        Some(t) => sock.connect_timeout(&addr.into(), t)?,
        None => sock.connect(&addr.into())?,
    }
    rendezvous_on(
        stack,
        sock.into(),
        timeout.map(|t| t0 + t),
        BufSizes::default(),
    )
}

/// The rendezvous of a client whose TCP connection is up: CLC on the event thread,
/// bounded by the machines' timers and by `deadline`.
fn rendezvous_on(
    stack: &Arc<Inner>,
    tcp: TcpStream,
    deadline: Option<Instant>,
    bufs: BufSizes,
) -> io::Result<Established> {
    let _ = tcp.set_nodelay(true);
    // This thread reads the server's replies itself when it has a waker to be woken
    // by (core::drive_client_rendezvous), else the event thread does.
    let waker = DriveWaker::current();
    let slot = Arc::new(ConnectSlot::new(waker.clone()));
    let own = register_client(stack, tcp, slot.clone(), bufs, waker.is_some())?;
    // The machines bound every wait (ClcConfig::max_rendezvous_time); the margin only
    // protects against a stopped stack. A connect timeout bounds the whole connect.
    let mut limit = Instant::now() + stack.clc.max_rendezvous_time() + Duration::from_secs(5);
    if let Some(d) = deadline {
        limit = limit.min(d);
    }
    if let (Some(w), Some(id)) = (&waker, own) {
        slot.polling.store(true, Ordering::SeqCst);
        drive_client_rendezvous(stack, id, &slot, w, limit);
        slot.polling.store(false, Ordering::SeqCst);
    }
    let mut g = slot.result.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if let Some(r) = g.take() {
            return r;
        }
        let now = Instant::now();
        if now >= limit {
            // A result arriving later is closed by the event thread.
            slot.abandoned.store(true, Ordering::SeqCst);
            return Err(io::Error::new(
                ErrorKind::TimedOut,
                "SMC-R rendezvous did not finish in time",
            ));
        }
        g = slot.cond.wait_timeout(g, limit - now).0;
    }
}

fn each_addr<A: ToSocketAddrs, T>(
    addr: A,
    mut f: impl FnMut(SocketAddr) -> io::Result<T>,
) -> io::Result<T> {
    let mut last = None;
    for a in addr.to_socket_addrs()? {
        match f(a) {
            Ok(t) => return Ok(t),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::new(ErrorKind::InvalidInput, "no address to use")))
}

impl Stack {
    /// Asks this stack's TCP-option source (e.g. smc-bpf) to announce SMC-R on a socket
    /// the caller will `connect()` or `listen()` on (RFC 7609 §3.1): for
    /// [`SmcStream::from_connected_with`] and [`SmcListener::from_listening_with`].
    pub fn mark_tcp_option(&self, sock: BorrowedFd<'_>) -> io::Result<()> {
        self.inner.tcp_option.mark(sock).map_err(io::Error::other)
    }
}

/// `SIOCATMARK` (asm-generic/sockios.h; not in the libc crate).
const SIOCATMARK: libc::Ioctl = 0x8905;

fn oob_send(s: &TcpStream, byte: u8) -> io::Result<()> {
    socket2::SockRef::from(s).send_out_of_band(&[byte])?;
    Ok(())
}

fn oob_recv(s: &TcpStream) -> io::Result<u8> {
    let mut b = [std::mem::MaybeUninit::<u8>::uninit()];
    match socket2::SockRef::from(s).recv_out_of_band(&mut b)? {
        0 => Err(io::Error::new(ErrorKind::InvalidInput, "no urgent data")),
        // SAFETY: recv reported one byte written into `b`.
        _ => Ok(unsafe { b[0].assume_init() }),
    }
}

impl SmcStream {
    /// Connects with [`Stack::global`].
    pub fn connect(addr: impl ToSocketAddrs) -> io::Result<Self> {
        Self::connect_with(Stack::global(), addr)
    }

    /// Connects with `stack`: SMC-R when both sides can, otherwise TCP (see [`Mode`]).
    pub fn connect_with(stack: &Stack, addr: impl ToSocketAddrs) -> io::Result<Self> {
        let inner = stack.inner.clone();
        each_addr(addr, |a| connect_one(&inner, a, None)).map(|e| stream_from(&inner, e))
    }

    /// Connects with [`Stack::global`]; the whole connect (TCP handshake and SMC-R
    /// rendezvous) is bounded by `t` (`TimedOut`).
    pub fn connect_timeout(addr: &SocketAddr, t: Duration) -> io::Result<Self> {
        let inner = Stack::global().inner.clone();
        connect_one(&inner, *addr, Some(t)).map(|e| stream_from(&inner, e))
    }

    /// [`SmcStream::connect_timeout`] with `stack`.
    pub fn connect_timeout_with(stack: &Stack, addr: &SocketAddr, t: Duration) -> io::Result<Self> {
        let inner = stack.inner.clone();
        connect_one(&inner, *addr, Some(t)).map(|e| stream_from(&inner, e))
    }

    /// The rendezvous on a TCP connection the caller connected itself (e.g. an
    /// interposed `connect()` that must keep the application's socket, its bind address
    /// and options). The socket should have been marked with
    /// [`Stack::mark_tcp_option`] before `connect()`. `tcp` is taken over: for SMC-R it
    /// becomes the connection's idle TCP socket (RFC 7609 §4.8), for a fallback it is
    /// the stream itself ([`SmcStream::into_fallback`] gives it back).
    pub fn from_connected_with(stack: &Stack, tcp: TcpStream) -> io::Result<Self> {
        Self::from_connected_sized(stack, tcp, BufSizes::default())
    }

    /// [`SmcStream::from_connected_with`] with this connection's own RMB and send
    /// buffer sizes (as a socket's SO_RCVBUF / SO_SNDBUF ask; the stack's where `None`).
    pub fn from_connected_sized(stack: &Stack, tcp: TcpStream, bufs: BufSizes) -> io::Result<Self> {
        let inner = stack.inner.clone();
        rendezvous_on(&inner, tcp, None, bufs).map(|e| stream_from(&inner, e))
    }

    /// The TCP connection of a fallback stream and its reason; an SMC-R stream comes
    /// back unchanged as the error.
    pub fn into_fallback(self) -> Result<(TcpStream, FallbackReason), SmcStream> {
        match self.inner {
            Inner2::Tcp(t, r) => Ok((t, r)),
            inner @ Inner2::Smc(_) => Err(SmcStream { inner }),
        }
    }

    /// A descriptor of the connection's TCP socket: the idle one of an SMC-R connection
    /// (RFC 7609 §4.8: it stays open for the connection's life), the stream itself for
    /// a fallback. For TCP-level socket options and `TCP_INFO`, as Linux SMC forwards
    /// them to its CLC socket; writing to it would break the connection.
    pub fn tcp_clone(&self) -> io::Result<TcpStream> {
        match &self.inner {
            Inner2::Smc(h) => match &h.conn.lock().tcp {
                Some(t) => t.try_clone(),
                None => Err(io::Error::new(
                    ErrorKind::NotConnected,
                    "the TCP connection is closed",
                )),
            },
            Inner2::Tcp(t, _) => t.try_clone(),
        }
    }

    /// The connection's RMB and send buffer sizes in bytes (`None` for a fallback).
    pub fn buffer_sizes(&self) -> Option<(usize, usize)> {
        match &self.inner {
            Inner2::Smc(h) => Some((h.conn.rmb.len(), h.conn.sndbuf.len())),
            Inner2::Tcp(..) => None,
        }
    }

    /// SMC-R or TCP fallback (with the reason).
    pub fn mode(&self) -> Mode {
        match &self.inner {
            Inner2::Smc(h) => Mode::of(&h.conn),
            Inner2::Tcp(_, r) => Mode::Fallback { reason: r.clone() },
        }
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        match &self.inner {
            Inner2::Smc(h) => Ok(h.conn.peer),
            Inner2::Tcp(t, _) => t.peer_addr(),
        }
    }

    /// Our address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match &self.inner {
            Inner2::Smc(h) => Ok(h.conn.local),
            Inner2::Tcp(t, _) => t.local_addr(),
        }
    }

    /// `shutdown(2)`: `Write` sends PeerDoneWriting after the data (RFC 7609 §4.8.1),
    /// `Both` closes.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match &self.inner {
            Inner2::Smc(h) => h.shutdown(how),
            Inner2::Tcp(t, _) => t.shutdown(how),
        }
    }

    /// Blocking reads give up after `t` (`WouldBlock`, like `TcpStream`).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        if t == Some(Duration::ZERO) {
            return Err(io::Error::new(ErrorKind::InvalidInput, "zero timeout"));
        }
        match &self.inner {
            Inner2::Smc(h) => {
                h.conn.lock().read_timeout = t;
                Ok(())
            }
            Inner2::Tcp(s, _) => s.set_read_timeout(t),
        }
    }

    /// Blocking writes give up after `t`.
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        if t == Some(Duration::ZERO) {
            return Err(io::Error::new(ErrorKind::InvalidInput, "zero timeout"));
        }
        match &self.inner {
            Inner2::Smc(h) => {
                h.conn.lock().write_timeout = t;
                Ok(())
            }
            Inner2::Tcp(s, _) => s.set_write_timeout(t),
        }
    }

    /// Non-blocking reads and writes (`WouldBlock`).
    pub fn set_nonblocking(&self, nb: bool) -> io::Result<()> {
        match &self.inner {
            Inner2::Smc(h) => {
                h.conn.lock().nonblocking = nb;
                Ok(())
            }
            Inner2::Tcp(s, _) => s.set_nonblocking(nb),
        }
    }

    /// `TCP_NODELAY` (SMC-R: disables corking).
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        match &self.inner {
            Inner2::Smc(h) => {
                h.conn.apply(|c, _| c.set_nodelay(on));
                Ok(())
            }
            Inner2::Tcp(s, _) => s.set_nodelay(on),
        }
    }

    /// `TCP_CORK` (tcp(7)): while set, partial data waits for more — until the send
    /// buffer is full, the cork is removed, or [`smc_proto::conn::CORK_MAX_HOLD`]
    /// (200 ms) has passed; removing it sends what is held at once. Urgent data and
    /// closing are never held. On a fallback, the TCP socket's option.
    pub fn set_cork(&self, on: bool) -> io::Result<()> {
        match &self.inner {
            Inner2::Smc(h) => {
                h.conn.apply(|c, _| c.set_cork(on));
                Ok(())
            }
            Inner2::Tcp(s, _) => socket2::SockRef::from(s).set_tcp_cork(on),
        }
    }

    /// Whether `TCP_CORK` is set ([`SmcStream::set_cork`]).
    pub fn cork(&self) -> io::Result<bool> {
        match &self.inner {
            Inner2::Smc(h) => Ok(h.conn.lock().conn.corked()),
            Inner2::Tcp(s, _) => socket2::SockRef::from(s).tcp_cork(),
        }
    }

    /// `SO_OOBINLINE`: the urgent byte stays in the stream.
    pub fn set_oob_inline(&self, on: bool) -> io::Result<()> {
        match &self.inner {
            Inner2::Smc(h) => {
                h.conn.apply(|c, _| c.set_oob_inline(on));
                Ok(())
            }
            Inner2::Tcp(s, _) => socket2::SockRef::from(s).set_out_of_band_inline(on),
        }
    }

    /// `SIOCATMARK`: the next byte read is the one after the urgent mark.
    pub fn at_mark(&self) -> io::Result<bool> {
        match &self.inner {
            Inner2::Smc(h) => Ok(h.conn.lock().conn.at_mark()),
            Inner2::Tcp(s, _) => {
                let mut v: libc::c_int = 0;
                // SAFETY: SIOCATMARK writes one int into `v`.
                let r = unsafe { libc::ioctl(s.as_raw_fd(), SIOCATMARK, &mut v) };
                if r < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(v != 0)
                }
            }
        }
    }

    /// Sends one urgent byte (`send(MSG_OOB)`, RFC 7609 §4.7.5).
    pub fn send_urgent(&self, byte: u8) -> io::Result<()> {
        match &self.inner {
            Inner2::Smc(h) => h.send_urgent(byte, None),
            Inner2::Tcp(s, _) => oob_send(s, byte),
        }
    }

    /// Reads the urgent byte (`recv(MSG_OOB)`): `WouldBlock` while it is announced but
    /// not here yet, `InvalidInput` without urgent data or with `SO_OOBINLINE`.
    pub fn recv_urgent(&self) -> io::Result<u8> {
        match &self.inner {
            Inner2::Smc(h) => h.recv_urgent(),
            Inner2::Tcp(s, _) => oob_recv(s),
        }
    }

    /// Aborts the connection (`SO_LINGER` 0 then close; RFC 7609 §4.8.2): unsent and
    /// unread data is discarded and the peer sees a reset.
    pub fn abort(self) -> io::Result<()> {
        match &self.inner {
            Inner2::Smc(h) => {
                h.conn.apply(|c, now| c.abort(now));
                Ok(())
            }
            Inner2::Tcp(s, _) => socket2::SockRef::from(s).set_linger(Some(Duration::ZERO)),
        }
    }

    /// Another handle on the same connection (the connection closes with the last one).
    pub fn try_clone(&self) -> io::Result<SmcStream> {
        Ok(SmcStream {
            inner: match &self.inner {
                Inner2::Smc(h) => Inner2::Smc(h.clone()),
                Inner2::Tcp(s, r) => Inner2::Tcp(s.try_clone()?, r.clone()),
            },
        })
    }

    #[cfg(feature = "tokio")]
    pub(crate) fn into_parts(self) -> Result<Arc<SmcHandle>, (TcpStream, FallbackReason)> {
        match self.inner {
            Inner2::Smc(h) => Ok(h),
            Inner2::Tcp(t, r) => Err((t, r)),
        }
    }

    /// Termination state (Linux smc_diag names; "TCP" for a fallback).
    pub fn state(&self) -> String {
        match &self.inner {
            Inner2::Smc(h) => h.conn.lock().conn.state().to_string(),
            Inner2::Tcp(..) => "TCP".into(),
        }
    }
}

impl Read for SmcStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl Read for &SmcStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &self.inner {
            Inner2::Smc(h) => h.read(buf, None),
            Inner2::Tcp(s, _) => (&*s).read(buf),
        }
    }
}

impl Write for SmcStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        (&*self).flush()
    }
}

impl Write for &SmcStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &self.inner {
            Inner2::Smc(h) => h.write(buf, None),
            Inner2::Tcp(s, _) => (&*s).write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        // SMC-R data is posted at once (no corking by default).
        match &self.inner {
            Inner2::Smc(_) => Ok(()),
            Inner2::Tcp(s, _) => (&*s).flush(),
        }
    }
}

/// A listener that accepts SMC-R connections (and TCP fallbacks), like
/// `std::net::TcpListener`. The rendezvous runs on the stack's event thread;
/// [`SmcListener::accept`] returns finished connections.
pub struct SmcListener {
    shared: Arc<ListenerShared>,
    stack: Arc<Inner>,
}

impl fmt::Debug for SmcListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SmcListener")
            .field("local", &self.shared.local)
            .finish()
    }
}

impl Drop for SmcListener {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.stack.wake();
    }
}

impl SmcListener {
    /// Binds with [`Stack::global`].
    pub fn bind(addr: impl ToSocketAddrs) -> io::Result<Self> {
        Self::bind_with(Stack::global(), addr)
    }

    /// Binds with `stack` (the socket is marked for the SMC-R option before `listen()`).
    pub fn bind_with(stack: &Stack, addr: impl ToSocketAddrs) -> io::Result<Self> {
        let inner = stack.inner.clone();
        each_addr(addr, |a| {
            let sock = Socket::new(Domain::for_address(a), Type::STREAM, Some(Protocol::TCP))?;
            sock.set_reuse_address(true)?;
            if let Err(e) = inner.tcp_option.mark(sock.as_fd()) {
                debug!(error = %e, "cannot mark the listener for the SMC-R option");
            }
            sock.bind(&a.into())?;
            sock.listen(1024)?;
            let l: TcpListener = sock.into();
            let shared = register_listener(&inner, l, BufSizes::default())?;
            Ok(SmcListener {
                shared,
                stack: inner.clone(),
            })
        })
    }

    /// A listener over a TCP socket the caller bound and put in the listening state
    /// itself (e.g. an interposed `listen()`); mark it with [`Stack::mark_tcp_option`]
    /// before `listen()` so that its SYN-ACKs announce SMC-R. The event thread accepts
    /// on it from now on.
    pub fn from_listening_with(stack: &Stack, l: TcpListener) -> io::Result<Self> {
        Self::from_listening_sized(stack, l, BufSizes::default())
    }

    /// [`SmcListener::from_listening_with`] with the buffer sizes of the connections it
    /// accepts (the listening socket's SO_RCVBUF / SO_SNDBUF, which TCP's accepted
    /// sockets inherit; the stack's where `None`).
    pub fn from_listening_sized(stack: &Stack, l: TcpListener, bufs: BufSizes) -> io::Result<Self> {
        let inner = stack.inner.clone();
        let shared = register_listener(&inner, l, bufs)?;
        Ok(SmcListener {
            shared,
            stack: inner,
        })
    }

    /// The next connection (SMC-R or fallback) and its peer's address.
    pub fn accept(&self) -> io::Result<(SmcStream, SocketAddr)> {
        let mut q = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some((e, peer)) = q.pop_front() {
                return Ok((stream_from(&self.stack, e), peer));
            }
            if self.shared.nonblocking.load(Ordering::SeqCst) {
                return Err(ErrorKind::WouldBlock.into());
            }
            q = self.shared.cond.wait_timeout(q, Duration::from_secs(1)).0;
        }
    }

    #[cfg(feature = "tokio")]
    pub(crate) fn poll_accept(&self, waker: &std::task::Waker) -> Option<(SmcStream, SocketAddr)> {
        let mut q = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((e, peer)) = q.pop_front() {
            return Some((stream_from(&self.stack, e), peer));
        }
        if let Ok(mut w) = self.shared.waker.lock() {
            *w = Some(waker.clone());
        }
        None
    }

    /// Accepted connections, forever.
    pub fn incoming(&self) -> impl Iterator<Item = io::Result<SmcStream>> + '_ {
        std::iter::from_fn(move || Some(self.accept().map(|(s, _)| s)))
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.shared.local)
    }

    /// `accept` returns `WouldBlock` instead of waiting.
    pub fn set_nonblocking(&self, nb: bool) -> io::Result<()> {
        self.shared.nonblocking.store(nb, Ordering::SeqCst);
        Ok(())
    }
}
