//! `smc-proto`: SMC-R (RFC 7609, and the Linux SMC-Rv2 dialect) as sans-I/O state
//! machines — the quinn-proto of this workspace.
//!
//! Nothing here opens a socket, starts a thread, reads a clock or calls the OS: every
//! machine is driven by events and `now` and says what to do. The `smc` crate's runtime
//! does the I/O; the simulators (feature `testing`) replay every interleaving from a
//! seed.
//!
//! | module | what |
//! |---|---|
//! | [`clc`] | the rendezvous on the TCP connection: Proposal → Accept → Confirm or Decline (RFC 7609 §3.5.1–§3.5.3, Appendix C) |
//! | [`llc`] | one link group's LLC flows, timers and RTokens (§3.5, §4.5.3) |
//! | [`conn`] | one connection's CDC data path, flow control, urgent data and termination (§4) |
//! | [`endpoint`] | the link-group table, rendezvous coordination, RMB and token accounting, and the rules that tie connections to links |
//!
//! `docs/architecture.md` draws the crate graph and follows a byte from `write()` to
//! the peer's `read()`.

pub mod clc;
pub mod conn;
pub mod endpoint;
pub mod ids;
pub mod llc;
