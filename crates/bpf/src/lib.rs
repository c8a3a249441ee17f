//! # smc-bpf: the RFC 7609 SMC-R TCP option, written by an eBPF program
//!
//! RFC 7609 §3.1 and §3.5.1.1: both peers announce SMC-R capability with the
//! experimental TCP option kind 254, length 6, ExID `E2 D4 C3 D9` in their
//! SYN / SYN-ACK, and the CLC handshake happens only when both did. A
//! userspace stack cannot write TCP options through the socket API; this
//! crate does it with a cgroup `sock_ops` program (`bpf/smc_option.bpf.c`,
//! compiled by build.rs with clang, loaded with libbpf-rs):
//!
//! - only sockets the library marks ([`SmcOption::mark`], before
//!   `connect()`/`listen()`) carry the option; accepted sockets inherit the
//!   listener's mark; every other TCP connection is untouched;
//! - a listener echoes the option in its SYN-ACK only when the SYN carried it,
//!   and never from a SYN cookie;
//! - after `connect()`/`accept()`, [`SmcOption::outcome`] says whether both
//!   announced ([`Outcome::BothAnnounced`]) or why not.
//!
//! Without the program (or without access to its map) [`SmcOption::open`]
//! returns [`Unavailable`], whose text starts "SMC-R option unavailable": the
//! caller then never announces and runs plain TCP. [`SkipOptionPolicy`] (from
//! `smc::tcp_option`) is the opt-in override for hosts without eBPF (outside RFC 7609,
//! off by default). [`BpfTcpOption`] is this crate as the runtime's
//! `smc::tcp_option::TcpOption`; [`install_default`] makes it the default of
//! `smc::Stack::global`.
//!
//! Installation (`smc bpf install|status|uninstall`) is library code in
//! [`install`] with clap types in [`cli`].
//!
//! ## Using the program, in order
//!
//! The SMC-R runtime does this through [`BpfTcpOption`] (its `TcpOption` trait: `mark`
//! before `connect()`/`listen()`, `outcome` after the handshake) and then applies the
//! [`SkipOptionPolicy`] itself (`smc/src/runtime/routes.rs`). A program of its own calls:
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use smc_bpf::{SmcOption, SkipOptionPolicy, Decision};
//! let opt = SmcOption::open();                  // once; Err = Unavailable
//! let policy = SkipOptionPolicy::from_env()?;   // empty unless configured
//! let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
//! if let Ok(o) = &opt { o.mark(&sock)?; }        // before connect()/listen()
//! let peer: std::net::SocketAddr = "192.0.2.1:5000".parse()?;
//! sock.connect(&peer.into())?;
//! let outcome = match &opt {
//!     Ok(o) => o.outcome(&sock),
//!     Err(u) => smc_bpf::Outcome::Unavailable { reason: u.clone() },
//! };
//! match policy.decide(&outcome, peer) {
//!     Decision::Clc(_) => { /* send the CLC Proposal */ }
//!     Decision::Fallback { reason } => { /* plain TCP; log `reason` */ let _ = reason; }
//! }
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

pub mod cli;
pub mod install;
pub mod option;
pub mod paths;
pub mod state;
mod sys;

pub use option::{
    install_default, BpfTcpOption, MarkError, NotAnnounced, Outcome, SmcOption, Unavailable,
};
pub use paths::{PinPaths, DEFAULT_PIN_DIR, PIN_DIR_ENV};
/// The override policy lives with the runtime that applies it (`smc::tcp_option`).
pub use smc::tcp_option::{
    ClcBasis, Decision, PeerPattern, PolicyError, SkipOptionPolicy, POLICY_ENV,
};
pub use sys::ProgInfo;

/// Routes libbpf's own messages to `tracing` (debug level) instead of
/// stderr. Call once at start-up of a program that loads BPF objects.
pub fn route_libbpf_logs() {
    use libbpf_rs::PrintLevel;
    fn cb(level: PrintLevel, msg: String) {
        let msg = msg.trim_end();
        match level {
            PrintLevel::Warn => tracing::warn!(target: "libbpf", "{msg}"),
            PrintLevel::Info => tracing::debug!(target: "libbpf", "{msg}"),
            PrintLevel::Debug => tracing::trace!(target: "libbpf", "{msg}"),
        }
    }
    libbpf_rs::set_print(Some((PrintLevel::Debug, cb)));
}
