//! The `smc` command's library: each subcommand lives in its own module so that new ones
//! (`listen`, `connect`, `bench`, `demo`, `bpf`) are added with one line in `main.rs`.
//!
//! - [`decode`]: `smc decode FILE.pcap`, one line per SMC message in a capture.
//! - [`smc_cmd`]: `smc listen`, `smc connect`, `smc demo`, `smc bench` over the `smc`
//!   runtime, built from the transport-generic [`endpoint`], [`demo`], [`bench`] and
//!   [`harness`] (which the unit tests run over kernel TCP), [`net`], [`payload`], [`signal`].
//! - [`capture`], [`extract`], [`roce`]: reading captures, finding the TCP option, CLC
//!   messages in TCP streams and LLC/CDC messages in RoCEv2 SENDs (used by `decode` and by
//!   the golden-vector tests).
//! - [`rdma`]: `smc rdma ...`, tools around the software RoCEv2 RNIC (ibv_rc_pingpong and
//!   ib_write_bw interop, loopback benchmark against TCP, opcode self-test, bulk transfer).
//! - [`ueid`]: `smc ueid add|del|show|flush`, the SMC-Rv2 user EIDs.

pub mod bench;
pub mod capture;
pub mod decode;
pub mod demo;
pub mod endpoint;
pub mod extract;
pub mod harness;
pub mod net;
pub mod observe;
pub mod payload;
pub mod rdma;
pub mod roce;
pub mod run;
pub mod scale;
pub mod signal;
pub mod smc_cmd;
pub mod ueid;
pub mod workers;
