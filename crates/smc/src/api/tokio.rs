//! The tokio surface (feature `tokio`): [`SmcListener`] and [`SmcStream`] with
//! `AsyncRead` / `AsyncWrite`.
//!
//! SMC-R streams register their task's waker with the connection; the completion
//! handler that processes a CDC (or the event thread) wakes it — no extra thread per
//! stream. On the same-host path a task of the stream's runtime watches the
//! connection's doorbell itself ([`watch_bell`]), so that the peer's CDC wakes a worker
//! of this runtime directly instead of the event thread, which then woke the worker.
//! Fallback streams are plain `tokio::net::TcpStream`s. The rendezvous itself (TCP
//! connect + CLC) runs on a blocking thread.

use std::future::poll_fn;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::{connect_one, stream_from, Mode, SmcHandle, Wait};
use crate::clc::FallbackReason;
use crate::runtime::conn::ConnShared;
use crate::runtime::Stack;

enum Inner {
    Smc(Arc<SmcHandle>),
    Tcp(tokio::net::TcpStream, FallbackReason),
}

/// An SMC-R stream (or TCP fallback) for tokio.
pub struct SmcStream {
    inner: Inner,
    /// Same host: whether the doorbell's task was asked for yet ([`watch_bell`], at the
    /// first read or write, on the runtime that polls it).
    bell_asked: bool,
}

impl std::fmt::Debug for SmcStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmcStream")
            .field("mode", &self.mode().to_string())
            .finish()
    }
}

impl SmcStream {
    /// Connects with [`Stack::global`].
    pub async fn connect(addr: SocketAddr) -> io::Result<SmcStream> {
        Self::connect_with(Stack::global(), addr).await
    }

    /// Connects with `stack` (the rendezvous runs on a blocking thread).
    pub async fn connect_with(stack: &Stack, addr: SocketAddr) -> io::Result<SmcStream> {
        let inner = stack.inner.clone();
        let e = tokio::task::spawn_blocking(move || {
            connect_one(&inner, addr, None).map(|e| stream_from(&inner, e))
        })
        .await
        .map_err(io::Error::other)??;
        Self::from_std(e)
    }

    /// Wraps a blocking [`super::SmcStream`] (must be called inside a tokio runtime).
    pub fn from_std(s: super::SmcStream) -> io::Result<SmcStream> {
        Ok(SmcStream {
            bell_asked: false,
            inner: match s.into_parts() {
                Ok(h) => Inner::Smc(h),
                Err((t, r)) => {
                    t.set_nonblocking(true)?;
                    Inner::Tcp(tokio::net::TcpStream::from_std(t)?, r)
                }
            },
        })
    }

    /// SMC-R or TCP fallback.
    pub fn mode(&self) -> Mode {
        match &self.inner {
            Inner::Smc(h) => Mode::of(&h.conn),
            Inner::Tcp(_, r) => Mode::Fallback { reason: r.clone() },
        }
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        match &self.inner {
            Inner::Smc(h) => Ok(h.conn.peer),
            Inner::Tcp(t, _) => t.peer_addr(),
        }
    }

    /// A handle on an SMC-R stream usable beside its read and write halves
    /// (`tokio::io::split`): urgent data (`MSG_OOB`, RFC 7609 §4.7.5), the TCP socket's
    /// `SO_LINGER`, abort. `None` for a TCP fallback (whose socket does all that).
    pub fn control(&self) -> Option<Control> {
        match &self.inner {
            Inner::Smc(h) => Some(Control { h: h.clone() }),
            Inner::Tcp(..) => None,
        }
    }

    /// Our address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match &self.inner {
            Inner::Smc(h) => Ok(h.conn.local),
            Inner::Tcp(t, _) => t.local_addr(),
        }
    }
}

/// Set once a runtime without its I/O driver refused a doorbell (tokio panics there):
/// later streams do not try again.
static NO_IO_DRIVER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Same host: starts the task that watches the connection's doorbell on the runtime that
/// polls the stream (docs/samehost.md "Waking"), at its first read or write — so that a
/// stream made in one runtime and used in another is watched where it is used, and one
/// never polled asks for nothing. The task takes the ring when the peer rings, as the
/// event thread would, and whatever that wakes (this stream's reader or writer) runs
/// next on the same worker: one thread woken per CDC instead of two. One task per
/// connection (a `try_clone`d stream finds it running). It holds the connection's
/// state, not the application's handle (which alone closes it), watches a duplicate of
/// the doorbell (an eventfd may serve a later connection once this one is released,
/// and a registration by number must not outlive this task), and ends when the
/// connection is CLOSED (its last CDC taken) or its runtime drops it (the event thread
/// then watches the doorbell again). Without a runtime, its I/O driver or a
/// descriptor, the event thread watches it as before.
fn watch_bell(conn: &Arc<ConnShared>) {
    use std::sync::atomic::Ordering;
    use tokio::io::unix::AsyncFd;
    let Some(p) = conn.shm() else { return };
    if NO_IO_DRIVER.load(Ordering::Relaxed) {
        return;
    }
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    {
        let mut st = conn.lock();
        if st.shm_bell_task || st.conn.state() == crate::conn::State::Closed {
            return;
        }
        st.shm_bell_task = true;
    }
    /// Gives the doorbell back to the event thread when the task ends or never starts
    /// while the connection is open (its runtime shut down, no descriptor).
    struct Guard(Arc<ConnShared>);
    impl Drop for Guard {
        fn drop(&mut self) {
            let mut st = self.0.lock();
            st.shm_bell_task = false;
            st.bell_waker = None;
            let open = st.conn.state() != crate::conn::State::Closed;
            drop(st);
            if open {
                if let Some(s) = self.0.stack.upgrade() {
                    s.wake();
                }
            }
        }
    }
    let g = Guard(conn.clone());
    let Ok(fd) = p.bell.as_fd().try_clone_to_owned() else {
        return;
    };
    let fd = smc_verbs::process::lift(fd);
    // tokio panics, rather than fails, on a runtime built without `enable_io`.
    let registered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: an OwnedFd stays open, on the same file, and returns the same number
        // for as long as the AsyncFd owns it.
        unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
            .map_err(io::Error::from)
    }));
    let afd = match registered {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "doorbell not watched by the runtime");
            return;
        }
        Err(_) => {
            NO_IO_DRIVER.store(true, Ordering::Relaxed);
            tracing::warn!(
                "a tokio runtime without I/O: same-host doorbells stay with the event thread"
            );
            return;
        }
    };
    rt.spawn(async move {
        loop {
            let ready = poll_fn(|cx| {
                {
                    let mut st = g.0.lock();
                    if st.conn.state() == crate::conn::State::Closed {
                        return Poll::Ready(false);
                    }
                    st.bell_waker = Some(cx.waker().clone());
                }
                match afd.poll_read_ready(cx) {
                    Poll::Ready(Ok(mut r)) => {
                        // Cleared before the eventfd is drained (shm_poll_live): a
                        // ring after the drain is a new edge.
                        r.clear_ready();
                        Poll::Ready(true)
                    }
                    Poll::Ready(Err(_)) => Poll::Ready(false),
                    Poll::Pending => Poll::Pending,
                }
            })
            .await;
            if !ready || !g.0.shm_poll_live(std::time::Instant::now()) {
                break;
            }
        }
        drop(g);
    });
}

impl AsyncRead for SmcStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match &mut this.inner {
            Inner::Tcp(t, _) => Pin::new(t).poll_read(cx, buf),
            Inner::Smc(h) => {
                if !this.bell_asked {
                    this.bell_asked = true;
                    watch_bell(&h.conn);
                }
                for attempt in 0..2 {
                    match h.read(buf.initialize_unfilled(), Some(Wait::Never)) {
                        Ok(n) => {
                            buf.advance(n);
                            return Poll::Ready(Ok(()));
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            if attempt == 0 {
                                // Register, then look again: a CDC processed in between
                                // found no waker to wake.
                                h.conn.lock().rx_waker = Some(cx.waker().clone());
                            }
                        }
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                }
                Poll::Pending
            }
        }
    }
}

impl AsyncWrite for SmcStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match &mut this.inner {
            Inner::Tcp(t, _) => Pin::new(t).poll_write(cx, buf),
            Inner::Smc(h) => {
                if !this.bell_asked {
                    this.bell_asked = true;
                    watch_bell(&h.conn);
                }
                for attempt in 0..2 {
                    match h.write(buf, Some(Wait::Never)) {
                        Ok(n) => return Poll::Ready(Ok(n)),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            if attempt == 0 {
                                h.conn.lock().tx_waker = Some(cx.waker().clone());
                            }
                        }
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                }
                Poll::Pending
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Tcp(t, _) => Pin::new(t).poll_flush(cx),
            Inner::Smc(_) => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Tcp(t, _) => Pin::new(t).poll_shutdown(cx),
            Inner::Smc(h) => Poll::Ready(h.shutdown(std::net::Shutdown::Write)),
        }
    }
}

/// A handle on an SMC-R stream ([`SmcStream::control`]). It holds a reference on the
/// connection: the connection closes when the stream and every `Control` are dropped.
pub struct Control {
    h: Arc<SmcHandle>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control").finish_non_exhaustive()
    }
}

impl Control {
    /// `SO_LINGER` of the connection's TCP socket (set there by whoever holds it, e.g.
    /// smc-preload for a program's `setsockopt`): `Some(0)` asks that closing abort.
    pub fn tcp_linger(&self) -> io::Result<Option<std::time::Duration>> {
        match &self.h.conn.lock().tcp {
            Some(t) => socket2::SockRef::from(t).linger(),
            None => Ok(None),
        }
    }

    /// Bytes written to the connection that are not yet confirmed in the peer's RMB
    /// (unsent, or sent and not yet acknowledged by the peer's RNIC): 0 once all of it
    /// arrived, which is what a TCP `close()` with `SO_LINGER` waits for.
    pub fn unconfirmed(&self) -> u64 {
        self.h.conn.lock().conn.snapshot().tx_unacked
    }

    /// `TCP_CORK` on the connection, as the std `SmcStream::set_cork` (smc-preload
    /// forwards a program's `setsockopt` here).
    pub fn set_cork(&self, on: bool) {
        self.h.conn.apply(|c, _| c.set_cork(on));
    }

    /// `TCP_NODELAY` on the connection, as the std `SmcStream::set_nodelay`: setting it
    /// also sends what `TCP_CORK` holds, once (tcp(7)).
    pub fn set_nodelay(&self, on: bool) {
        self.h.conn.apply(|c, _| c.set_nodelay(on));
    }

    /// Aborts the connection (RFC 7609 §4.8.2): unsent and unread data is discarded and
    /// the peer sees a reset.
    pub fn abort(&self) {
        self.h.conn.apply(|c, now| c.abort(now));
    }

    /// Sends one urgent byte after the data written so far (`send(MSG_OOB)`): it waits
    /// for room in the peer's RMB as a write does.
    pub async fn send_urgent(&self, byte: u8) -> io::Result<()> {
        poll_fn(|cx| {
            for attempt in 0..2 {
                match self.h.send_urgent(byte, Some(Wait::Never)) {
                    Ok(()) => return Poll::Ready(Ok(())),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if attempt == 0 {
                            self.h.conn.lock().tx_waker = Some(cx.waker().clone());
                        }
                    }
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            Poll::Pending
        })
        .await
    }

    /// The peer's urgent byte, once every byte before its mark has been read
    /// (`SIOCATMARK` true, then `recv(MSG_OOB)`): reads stop at the mark, so a reader
    /// that asks after each read (and when woken without data) hands the byte on at
    /// its place in the stream. `None` when there is none, or it is not its turn.
    pub fn take_urgent_at_mark(&self) -> Option<u8> {
        if !self.h.conn.lock().conn.at_mark() {
            return None;
        }
        self.h.recv_urgent().ok()
    }
}

/// A listener for tokio.
#[derive(Debug)]
pub struct SmcListener {
    inner: super::SmcListener,
}

impl SmcListener {
    /// Binds with [`Stack::global`].
    pub async fn bind(addr: impl ToSocketAddrs) -> io::Result<SmcListener> {
        Self::bind_with(Stack::global(), addr)
    }

    /// Binds with `stack`.
    pub fn bind_with(stack: &Stack, addr: impl ToSocketAddrs) -> io::Result<SmcListener> {
        Ok(SmcListener {
            inner: super::SmcListener::bind_with(stack, addr)?,
        })
    }

    /// Wraps a blocking [`super::SmcListener`] (e.g. one made by
    /// [`super::SmcListener::from_listening_with`]).
    pub fn from_std(l: super::SmcListener) -> SmcListener {
        SmcListener { inner: l }
    }

    /// The next finished rendezvous (SMC-R or fallback).
    pub async fn accept(&self) -> io::Result<(SmcStream, SocketAddr)> {
        let (s, a) = self.accept_std().await;
        Ok((SmcStream::from_std(s)?, a))
    }

    /// The next finished rendezvous as a blocking [`super::SmcStream`], for a caller
    /// that hands a fallback's TCP socket on ([`super::SmcStream::into_fallback`])
    /// instead of registering it with tokio.
    pub async fn accept_std(&self) -> (super::SmcStream, SocketAddr) {
        poll_fn(|cx| match self.inner.poll_accept(cx.waker()) {
            Some(x) => Poll::Ready(x),
            None => Poll::Pending,
        })
        .await
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}
