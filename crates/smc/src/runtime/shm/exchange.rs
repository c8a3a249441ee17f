//! The Unix-socket half of the same-host handshake: each side sends a
//! [`SameHostHello`] with two descriptors (the memfd of its receive region and its
//! doorbell eventfd, SCM_RIGHTS) and checks the other's credentials (SO_PEERCRED).
//! Nothing else of either process crosses: the memfd holds only this connection's
//! control page and RMB.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use smc_wire::clc::samehost::HELLO_LEN;
use smc_wire::clc::SameHostHello;

/// Each read or write of the exchange waits at most this long: a peer process that
/// stops answering delays only the rendezvous that asked it (see docs/samehost.md).
pub(crate) const IO_TIMEOUT: Duration = Duration::from_millis(250);

fn invalid(m: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, m.to_string())
}

/// Who is at the other end of `s`: its pid, after checking its user (same user as us,
/// or either of us root).
pub(crate) fn check_peer(s: &UnixStream) -> io::Result<i32> {
    let c = rustix::net::sockopt::socket_peercred(s)?;
    let me = rustix::process::getuid();
    if c.uid != me && !c.uid.is_root() && !me.is_root() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("same-host peer runs as uid {}", c.uid.as_raw()),
        ));
    }
    Ok(c.pid.as_raw_nonzero().get())
}

/// Sends a hello with our region's memfd and our bell.
pub(crate) fn send(s: &UnixStream, h: &SameHostHello, fds: &[&OwnedFd]) -> io::Result<()> {
    send_flags(s, h, fds, SendFlags::NOSIGNAL)
}

/// Connects to a stack's socket with every step bounded by [`IO_TIMEOUT`], the connect
/// itself too: a listener whose backlog is full (a process that never accepts) makes
/// connect(2) wait for room for as long as `SO_SNDTIMEO` allows (Linux
/// `unix_stream_connect`), and without it for ever.
pub(crate) fn connect(path: &std::path::Path) -> io::Result<UnixStream> {
    let s = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.connect(&socket2::SockAddr::unix(path)?)?;
    Ok(s.into())
}

/// Sends a hello on a session without waiting: a peer that does not read its session
/// (its socket buffer full) gets `WouldBlock`, and the caller drops the session.
pub(crate) fn send_nowait(s: &UnixStream, h: &SameHostHello, fds: &[&OwnedFd]) -> io::Result<()> {
    send_flags(s, h, fds, SendFlags::NOSIGNAL | SendFlags::DONTWAIT)
}

fn send_flags(
    s: &UnixStream,
    h: &SameHostHello,
    fds: &[&OwnedFd],
    flags: SendFlags,
) -> io::Result<()> {
    let bytes = h.to_bytes();
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !cmsg.push(SendAncillaryMessage::ScmRights(&borrowed)) {
        return Err(io::Error::other("control buffer too small"));
    }
    let n = rustix::net::sendmsg(s, &[IoSlice::new(&bytes)], &mut cmsg, flags)?;
    if n != HELLO_LEN {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short hello"));
    }
    Ok(())
}

/// Receives a hello and the descriptors that came with it (at most two are kept; any
/// others are closed on the spot).
pub(crate) fn recv(s: &UnixStream) -> io::Result<(SameHostHello, Vec<OwnedFd>)> {
    recv_flags(s, RecvFlags::WAITALL)?
        .ok_or_else(|| io::Error::new(io::ErrorKind::WouldBlock, "no same-host hello"))
}

/// The next hello of a session if one is there, without waiting. A session's hellos
/// are whole (each sent by one `sendmsg` of 32 bytes, which a stream socket with room
/// takes whole; `send_nowait` fails rather than sending part of one), so a partial one
/// or the end of the stream means the session is broken.
pub(crate) fn recv_nowait(s: &UnixStream) -> io::Result<Option<(SameHostHello, Vec<OwnedFd>)>> {
    match recv_flags(s, RecvFlags::DONTWAIT) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        r => r,
    }
}

fn recv_flags(
    s: &UnixStream,
    flags: RecvFlags,
) -> io::Result<Option<(SameHostHello, Vec<OwnedFd>)>> {
    let mut b = [0u8; HELLO_LEN];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let r = rustix::net::recvmsg(
        s,
        &mut [IoSliceMut::new(&mut b)],
        &mut cmsg,
        RecvFlags::CMSG_CLOEXEC | flags,
    )?;
    let mut fds = Vec::new();
    for m in cmsg.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = m {
            for fd in it {
                if fds.len() < 2 {
                    // Held for the connection's life: numbered above the program's.
                    fds.push(smc_verbs::process::lift(fd));
                }
            }
        }
    }
    if r.bytes == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "same-host peer closed its socket",
        ));
    }
    if r.bytes != HELLO_LEN {
        return Err(invalid("short same-host hello"));
    }
    let h = SameHostHello::parse(&b).map_err(|e| invalid(&e.to_string()))?;
    Ok(Some((h, fds)))
}

/// A bell from the peer must be an eventfd: writing to anything else (a pipe that
/// fills, a socket) could block or mean something else.
pub(crate) fn check_eventfd(fd: &OwnedFd) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    if link.as_os_str() != "anon_inode:[eventfd]" {
        return Err(invalid("peer's bell is not an eventfd"));
    }
    // Never block on it, whatever the peer set.
    rustix::fs::fcntl_setfl(fd, rustix::fs::OFlags::NONBLOCK)?;
    Ok(())
}
