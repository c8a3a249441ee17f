//! The per-socket API the SMC-R core calls during rendezvous.
//!
//! RFC 7609 §3.1 / §3.5.1.1: both peers announce SMC-R with the TCP option in
//! SYN and SYN-ACK, and CLC starts only when both did. Usage, per socket:
//!
//! 1. [`SmcOption::open`] once per process (no root needed when the map's
//!    permissions allow it). On `Err(Unavailable)` never announce: run
//!    plain TCP and report the error's text as the reason.
//! 2. [`SmcOption::mark`] on the socket **before** `connect()` or `listen()`.
//!    Accepted sockets inherit the listener's mark.
//! 3. After `connect()` has completed (for a non-blocking or Fast Open
//!    socket: once the handshake is done, e.g. the socket became writable
//!    or data was received) or after `accept()`: [`SmcOption::outcome`].
//!    Only [`Outcome::BothAnnounced`] allows CLC; anything else means TCP
//!    fallback, with the outcome's `Display` as the reason.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};

use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType};
use socket2::{Protocol, SockRef, Type};
use thiserror::Error;

use crate::paths::PinPaths;
use crate::state::{SkState, VALUE_SIZE};

/// The option machinery cannot be used: the program is not installed, not
/// attached, or its map cannot be opened by this process.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("SMC-R option unavailable: {reason}")]
pub struct Unavailable {
    /// Why, in words.
    pub reason: String,
}

impl Unavailable {
    fn new(reason: impl Into<String>) -> Self {
        Unavailable {
            reason: reason.into(),
        }
    }
}

/// Why our side did not put the option into its SYN / SYN-ACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotAnnounced {
    /// The socket was never marked with [`SmcOption::mark`].
    NotMarked,
    /// The program did not see the marked socket's `connect()`/`listen()`:
    /// it was marked too late, or it lives outside the cgroup the program is
    /// attached to, or the program was attached after `listen()`.
    NotArmed,
    /// The handshake has not completed yet (asked too early).
    HandshakeNotSeen,
    /// The SYN / SYN-ACK had no TCP option space left (RFC 7609 A.1 needs 6
    /// bytes, 8 with alignment).
    NoOptionSpace,
    /// The connection was accepted from a SYN cookie: the kernel kept no
    /// state, so the SYN-ACK carried no option (both sides fall back).
    SynCookie,
    /// The option was not written although the socket was armed.
    NotWritten,
    /// A BPF helper failed with this (negative errno) value.
    HelperError(i32),
}

impl fmt::Display for NotAnnounced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotAnnounced::NotMarked => write!(f, "socket not marked for SMC-R"),
            NotAnnounced::NotArmed => write!(
                f,
                "the eBPF program did not see this socket's connect()/listen() \
                 (marked too late, or outside the attached cgroup)"
            ),
            NotAnnounced::HandshakeNotSeen => write!(f, "TCP handshake not complete yet"),
            NotAnnounced::NoOptionSpace => {
                write!(f, "no TCP option space left for the SMC-R option")
            }
            NotAnnounced::SynCookie => {
                write!(
                    f,
                    "connection accepted from a SYN cookie (no option echoed)"
                )
            }
            NotAnnounced::NotWritten => write!(f, "the SMC-R option was not written"),
            NotAnnounced::HelperError(e) => write!(
                f,
                "eBPF helper failed: {}",
                io::Error::from_raw_os_error(e.saturating_neg())
            ),
        }
    }
}

/// What the TCP handshake of one connection said about SMC-R
/// (RFC 7609 §3.5.1.1, CHECKLIST TO-4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// SYN and SYN-ACK both carried the option: proceed with CLC.
    BothAnnounced,
    /// We announced, the peer did not: plain TCP.
    PeerDidNotAnnounce,
    /// We did not announce: plain TCP.
    LocalNotAnnounced {
        /// Why not.
        why: NotAnnounced,
    },
    /// The record could not be read: plain TCP.
    Unavailable {
        /// Why not.
        reason: Unavailable,
    },
}

impl Outcome {
    /// True when CLC may start (RFC 7609 §3.5.1.1).
    pub fn both_announced(&self) -> bool {
        matches!(self, Outcome::BothAnnounced)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::BothAnnounced => write!(f, "both peers announced SMC-R"),
            Outcome::PeerDidNotAnnounce => write!(f, "peer did not announce SMC-R"),
            Outcome::LocalNotAnnounced { why } => write!(f, "SMC-R not announced: {why}"),
            Outcome::Unavailable { reason } => write!(f, "{reason}"),
        }
    }
}

/// Errors of [`SmcOption::mark`].
#[derive(Debug, Error)]
pub enum MarkError {
    /// Not a TCP stream socket.
    #[error("not a TCP socket")]
    NotTcp,
    /// `listen()` or `connect()` already happened: the SYN / SYN-ACK
    /// decision is taken at that moment, so marking now would be useless.
    #[error("socket already {0}; mark it before connect()/listen()")]
    TooLate(&'static str),
    /// The socket could not be inspected.
    #[error("cannot inspect socket: {0}")]
    Socket(#[source] io::Error),
    /// The map update failed.
    #[error("cannot mark socket in {map}: {source}")]
    Map {
        /// The map's pin path.
        map: PathBuf,
        /// The error.
        #[source]
        source: libbpf_rs::Error,
    },
}

/// An open handle on the pinned per-socket map of an installed program.
#[derive(Debug)]
pub struct SmcOption {
    map: MapHandle,
    path: PathBuf,
}

impl SmcOption {
    /// Opens the installation at the default place (`$SMC_RS_BPF_DIR` or
    /// `/sys/fs/bpf/smc-rs`).
    pub fn open() -> Result<Self, Unavailable> {
        Self::open_at(&PinPaths::from_env())
    }

    /// Opens the installation whose pins are in `paths`.
    pub fn open_at(paths: &PinPaths) -> Result<Self, Unavailable> {
        let map_path = paths.map();
        // The link pin exists while the program is attached; stat needs only
        // search permission on the directory.
        match std::fs::symlink_metadata(paths.link()) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Unavailable::new(format!(
                    "eBPF program not installed (no {}; run `smc bpf install`)",
                    paths.link().display()
                )))
            }
            Err(e) => {
                return Err(Unavailable::new(format!(
                    "cannot access {}: {e}",
                    paths.dir().display()
                )))
            }
        }
        let map = MapHandle::from_pinned_path(&map_path).map_err(|e| {
            Unavailable::new(format!("cannot open map {}: {e}", map_path.display()))
        })?;
        if map.map_type() != MapType::SkStorage || map.value_size() as usize != VALUE_SIZE {
            return Err(Unavailable::new(format!(
                "{} is not this version's socket map ({:?}, value size {})",
                map_path.display(),
                map.map_type(),
                map.value_size()
            )));
        }
        Ok(SmcOption {
            map,
            path: map_path,
        })
    }

    /// The map's pin path.
    pub fn map_path(&self) -> &Path {
        &self.path
    }

    /// Asks the program to announce SMC-R in this socket's SYN (if it will
    /// `connect()`) or in the SYN-ACKs of the connections it will accept
    /// (if it will `listen()`). Call before `connect()`/`listen()`.
    pub fn mark(&self, sock: impl AsFd) -> Result<(), MarkError> {
        let fd = sock.as_fd();
        check_fresh_tcp(fd)?;
        let key = fd.as_raw_fd().to_ne_bytes();
        self.map
            .update(&key, &SkState::marked().to_bytes(), MapFlags::ANY)
            .map_err(|source| MarkError::Map {
                map: self.path.clone(),
                source,
            })?;
        tracing::debug!(fd = fd.as_raw_fd(), "marked socket for the SMC-R option");
        Ok(())
    }

    /// The raw record of a socket (`None`: never marked). For diagnostics.
    pub fn state(&self, sock: impl AsFd) -> Result<Option<SkState>, Unavailable> {
        let key = sock.as_fd().as_raw_fd().to_ne_bytes();
        match self.map.lookup(&key, MapFlags::ANY) {
            Ok(Some(v)) => SkState::from_bytes(&v).map(Some).ok_or_else(|| {
                Unavailable::new(format!("unexpected value size {} in map", v.len()))
            }),
            Ok(None) => Ok(None),
            Err(e) => Err(Unavailable::new(format!(
                "cannot read map {}: {e}",
                self.path.display()
            ))),
        }
    }

    /// What the handshake said, after `connect()` completed or `accept()`
    /// returned this socket.
    pub fn outcome(&self, sock: impl AsFd) -> Outcome {
        match self.state(sock) {
            Ok(Some(s)) => s.outcome(),
            Ok(None) => Outcome::LocalNotAnnounced {
                why: NotAnnounced::NotMarked,
            },
            Err(reason) => Outcome::Unavailable { reason },
        }
    }
}

/// `mark` only makes sense on a TCP socket that is neither listening nor
/// connected yet.
fn check_fresh_tcp(fd: BorrowedFd<'_>) -> Result<(), MarkError> {
    let s = SockRef::from(&fd);
    if s.r#type().map_err(MarkError::Socket)? != Type::STREAM
        || s.protocol().map_err(MarkError::Socket)? != Some(Protocol::TCP)
    {
        return Err(MarkError::NotTcp);
    }
    if s.is_listener().map_err(MarkError::Socket)? {
        return Err(MarkError::TooLate("listening"));
    }
    match s.peer_addr() {
        Ok(_) => Err(MarkError::TooLate("connected")),
        Err(e) if e.kind() == std::io::ErrorKind::NotConnected => Ok(()),
        Err(e) => Err(MarkError::Socket(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use socket2::{Domain, Socket};

    #[test]
    fn open_without_installation_is_unavailable() {
        let dir = std::env::temp_dir().join(format!("smc-bpf-none-{}", std::process::id()));
        let err = SmcOption::open_at(&PinPaths::new(&dir)).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("SMC-R option unavailable: eBPF program not installed"),
            "{text}"
        );
    }

    #[test]
    fn mark_checks_the_socket() {
        let udp = Socket::new(Domain::IPV4, Type::DGRAM, None).unwrap();
        assert!(matches!(
            check_fresh_tcp(udp.as_fd()),
            Err(MarkError::NotTcp)
        ));

        let fresh = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        assert!(check_fresh_tcp(fresh.as_fd()).is_ok());

        let l = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        l.bind(
            &"127.0.0.1:0"
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
        )
        .unwrap();
        l.listen(1).unwrap();
        assert!(matches!(
            check_fresh_tcp(l.as_fd()),
            Err(MarkError::TooLate("listening"))
        ));

        let c = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        c.connect(&l.local_addr().unwrap()).unwrap();
        assert!(matches!(
            check_fresh_tcp(c.as_fd()),
            Err(MarkError::TooLate("connected"))
        ));
    }

    #[test]
    fn display_texts() {
        let u = Outcome::Unavailable {
            reason: Unavailable::new("x"),
        };
        assert_eq!(u.to_string(), "SMC-R option unavailable: x");
        assert!(!u.both_announced());
        assert!(Outcome::BothAnnounced.both_announced());
        let h = NotAnnounced::HelperError(-28).to_string();
        assert!(h.contains("No space left"), "{h}");
    }
}
