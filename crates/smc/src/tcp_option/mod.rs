//! The SMC-R TCP option as the runtime sees it (RFC 7609 §3.1, §3.5.1.1): both peers
//! announce SMC-R in their SYN / SYN-ACK, and CLC starts only when both did.
//!
//! A userspace stack cannot write TCP options through the socket API, so the runtime
//! asks a [`TcpOption`] source, chosen by the caller like the RDMA provider: `smc-bpf`
//! implements it with an eBPF `sock_ops` program (`smc_bpf::install_default`), and a
//! stack without one never announces (every connection stays TCP unless the
//! [`SkipOptionPolicy`] override names the peer). Keeping the source behind a trait keeps
//! libbpf out of this crate (the layer rule: `smc` knows verbs and TCP, nothing below).
//!
//! Per socket, the runtime calls [`TcpOption::mark`] before `connect()`/`listen()` and
//! [`TcpOption::outcome`] after the handshake, then [`SkipOptionPolicy::decide`].

mod policy;

use std::fmt;
use std::io;
use std::os::fd::BorrowedFd;

use thiserror::Error;

pub use policy::{ClcBasis, Decision, PeerPattern, PolicyError, SkipOptionPolicy, POLICY_ENV};

/// Where the runtime learns whether a connection's SYN and SYN-ACK carried the SMC-R
/// option, and arms it for the sockets it creates.
pub trait TcpOption: Send + Sync {
    /// Asks for the option in this fresh socket's SYN (it will `connect()`) or in the
    /// SYN-ACKs of the connections it will accept (it will `listen()`). Called before
    /// `connect()`/`listen()`; an error is logged and the socket then does not announce.
    fn mark(&self, sock: BorrowedFd<'_>) -> Result<(), Box<dyn std::error::Error + Send + Sync>>;

    /// What the handshake said, after `connect()` completed or `accept()` returned
    /// the socket.
    fn outcome(&self, sock: BorrowedFd<'_>) -> Outcome;
}

/// The source of a stack that has none: nothing is announced, every outcome says why.
#[derive(Debug, Clone)]
pub struct NoTcpOption {
    /// Why there is no source (shown as the fallback reason).
    pub reason: Unavailable,
}

impl NoTcpOption {
    /// A source that is unavailable for `reason`.
    pub fn new(reason: impl Into<String>) -> Self {
        NoTcpOption {
            reason: Unavailable::new(reason),
        }
    }
}

impl TcpOption for NoTcpOption {
    fn mark(&self, _sock: BorrowedFd<'_>) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        Ok(())
    }

    fn outcome(&self, _sock: BorrowedFd<'_>) -> Outcome {
        Outcome::Unavailable {
            reason: self.reason.clone(),
        }
    }
}

/// The option machinery cannot be used: the program is not installed, not
/// attached, or its map cannot be opened by this process.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("SMC-R option unavailable: {reason}")]
pub struct Unavailable {
    /// Why, in words.
    pub reason: String,
}

impl Unavailable {
    /// An `Unavailable` with this reason.
    pub fn new(reason: impl Into<String>) -> Self {
        Unavailable {
            reason: reason.into(),
        }
    }
}

/// Why our side did not put the option into its SYN / SYN-ACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotAnnounced {
    /// The socket was never marked ([`TcpOption::mark`]).
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
