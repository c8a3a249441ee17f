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

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};

use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType};
use socket2::{Protocol, SockRef, Type};
use thiserror::Error;

pub use smc::tcp_option::{NotAnnounced, Outcome, Unavailable};

use crate::paths::PinPaths;
use crate::state::{SkState, VALUE_SIZE};

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

/// The eBPF program as the SMC-R runtime's TCP-option source ([`smc::tcp_option::TcpOption`]):
/// the installation opened once; when it cannot be opened, nothing is announced and every
/// outcome carries the reason.
#[derive(Debug)]
pub struct BpfTcpOption {
    opened: Result<SmcOption, Unavailable>,
}

impl BpfTcpOption {
    /// Opens the installation at the default place ([`SmcOption::open`]).
    pub fn open() -> Self {
        let opened = SmcOption::open();
        if let Err(u) = &opened {
            tracing::debug!(reason = %u, "TCP option not available");
        }
        BpfTcpOption { opened }
    }

    /// The opened installation, or why there is none.
    pub fn opened(&self) -> &Result<SmcOption, Unavailable> {
        &self.opened
    }
}

impl smc::tcp_option::TcpOption for BpfTcpOption {
    fn mark(&self, sock: BorrowedFd<'_>) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        match &self.opened {
            Ok(o) => Ok(o.mark(sock)?),
            // Not announcing is what Unavailable means; outcome() says why.
            Err(_) => Ok(()),
        }
    }

    fn outcome(&self, sock: BorrowedFd<'_>) -> Outcome {
        match &self.opened {
            Ok(o) => o.outcome(sock),
            Err(u) => Outcome::Unavailable { reason: u.clone() },
        }
    }
}

/// Makes the eBPF program the TCP-option source of every stack built from
/// `StackConfig::from_env` (hence of `Stack::global`). Call once at start-up, before the
/// first connection.
pub fn install_default() {
    smc::defaults::set_tcp_option(|| std::sync::Arc::new(BpfTcpOption::open()));
}
