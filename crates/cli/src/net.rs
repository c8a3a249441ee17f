//! The two transports the `smc` command drives through the same code: SMC-R (the `smc`
//! runtime's `SmcListener`/`SmcStream`, which may fall back to TCP) and kernel TCP
//! (`std::net`, the baseline of `smc demo` and `smc bench`). Running both through one
//! code path is what makes the comparison fair: same buffers, same threads, same loops.
//!
//! Both stream types are `Read + Write` through a shared reference, so a connection can
//! be read and written from two threads at once ([`Io`]).

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};

/// How a connection carries its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModeKind {
    /// SMC-R: RDMA WRITEs into the peer's RMB.
    SmcR,
    /// smc-rs's same-host path: copies into the peer's RMB mapped through shared memory.
    SameHost,
    /// An SMC socket that stays on TCP (RFC 7609 §3.5 fallback).
    Fallback,
    /// A plain kernel TCP socket (baseline), not an SMC socket at all.
    KernelTcp,
}

/// A connection's mode as the command prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnMode {
    /// Which kind.
    pub kind: ModeKind,
    /// The link group, for SMC-R.
    pub link_group: Option<String>,
    /// For SMC-R: whether this connection created its link group (first contact).
    pub first_contact: Option<bool>,
    /// The runtime's own description (SMC-R version and contact, or the fallback reason).
    pub text: String,
}

impl ConnMode {
    /// True for SMC: SMC-R, or the same-host path (SMC without RDMA).
    pub fn is_smc(&self) -> bool {
        matches!(self.kind, ModeKind::SmcR | ModeKind::SameHost)
    }

    /// The short name `smc connect` prints (`mode=...`).
    pub fn short(&self) -> &'static str {
        match self.kind {
            ModeKind::SmcR => "SMC-R",
            ModeKind::SameHost => "same-host",
            ModeKind::Fallback | ModeKind::KernelTcp => "TCP",
        }
    }
}

impl fmt::Display for ConnMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// One connected stream.
pub trait Stream: Send + Sync + Sized {
    /// `Read::read` through a shared reference.
    fn read(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// `Write::write` through a shared reference.
    fn write(&self, buf: &[u8]) -> io::Result<usize>;
    /// `Write::flush` through a shared reference.
    fn flush(&self) -> io::Result<()>;
    /// `shutdown(2)`.
    fn shutdown(&self, how: Shutdown) -> io::Result<()>;
    /// Disables Nagle-like batching (latency measurements).
    fn set_nodelay(&self, on: bool) -> io::Result<()>;
    /// Bounds each blocking read (`None`: forever).
    fn set_read_timeout(&self, t: Option<std::time::Duration>) -> io::Result<()>;
    /// The peer's address.
    fn peer_addr(&self) -> io::Result<SocketAddr>;
    /// This end's address.
    fn local_addr(&self) -> io::Result<SocketAddr>;
    /// How the connection carries its bytes.
    fn mode(&self) -> ConnMode;
}

/// A listening socket.
pub trait Listener: Send + Sync {
    /// The streams it accepts.
    type Stream: Stream;
    /// Blocks for the next connection.
    fn accept(&self) -> io::Result<(Self::Stream, SocketAddr)>;
    /// The bound address (port 0 resolved).
    fn local_addr(&self) -> io::Result<SocketAddr>;
}

/// A transport: creates listeners and outgoing connections.
pub trait Net: Sync {
    /// Its listener type.
    type Listener: Listener;
    /// Short name for reports ("SMC-R", "TCP").
    fn label(&self) -> &'static str;
    /// Binds and listens.
    fn bind(&self, addr: SocketAddr) -> io::Result<Self::Listener>;
    /// Connects (for SMC: TCP handshake, then CLC when eligible).
    fn connect(&self, addr: SocketAddr) -> io::Result<<Self::Listener as Listener>::Stream>;
}

/// The accepted/connected stream type of a transport.
pub type StreamOf<N> = <<N as Net>::Listener as Listener>::Stream;

/// `Read + Write` over a shared stream reference.
pub struct Io<'a, S>(pub &'a S);

impl<S: Stream> Read for Io<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl<S: Stream> Write for Io<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// Kernel TCP (`std::net`), the baseline.
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelTcp;

impl Stream for TcpStream {
    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        (&mut &*self).read(buf)
    }
    fn write(&self, buf: &[u8]) -> io::Result<usize> {
        (&mut &*self).write(buf)
    }
    fn flush(&self) -> io::Result<()> {
        (&mut &*self).flush()
    }
    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        TcpStream::shutdown(self, how)
    }
    fn set_nodelay(&self, on: bool) -> io::Result<()> {
        TcpStream::set_nodelay(self, on)
    }
    fn set_read_timeout(&self, t: Option<std::time::Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, t)
    }
    fn peer_addr(&self) -> io::Result<SocketAddr> {
        TcpStream::peer_addr(self)
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        TcpStream::local_addr(self)
    }
    fn mode(&self) -> ConnMode {
        ConnMode {
            kind: ModeKind::KernelTcp,
            link_group: None,
            first_contact: None,
            text: "kernel TCP".into(),
        }
    }
}

impl Listener for TcpListener {
    type Stream = TcpStream;
    fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        TcpListener::accept(self)
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        TcpListener::local_addr(self)
    }
}

impl Net for KernelTcp {
    type Listener = TcpListener;
    fn label(&self) -> &'static str {
        "TCP"
    }
    fn bind(&self, addr: SocketAddr) -> io::Result<TcpListener> {
        TcpListener::bind(addr)
    }
    fn connect(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        TcpStream::connect(addr)
    }
}

/// Resolves `host:port` (or `[v6]:port`) to the first address.
pub fn resolve(addr: &str) -> io::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    addr.to_socket_addrs()?.next().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{addr}: no address found"),
        )
    })
}
