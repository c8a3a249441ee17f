//! `smc rdma ...`: tools around the software RoCEv2 RNIC (`smc-softroce`).
//!
//! - [`pingpong`]: SEND ping-pong interoperable with rdma-core's `ibv_rc_pingpong`, data
//!   verified.
//! - [`writetest`]: RDMA WRITE (read back and verified) against perftest's `ib_write_bw`.
//! - [`bench`]: RDMA WRITE throughput and SEND/RECV latency between two softroce devices on
//!   loopback, beside kernel TCP measured in the same run.
//! - [`selftest`]: one exchange that sends every opcode softroce produces (for captures and
//!   external decoders) and checks every result.
//! - [`transfer`]: bulk RDMA WRITE + SEND transfer between two hosts or namespaces with
//!   SHA-256 verification on both ends (the lossy-link test).
//! - [`rping`]: rdma-core's `rping` (buffer exchange over SEND, RDMA READ and WRITE) over
//!   the software iWARP RNIC (`--provider iwarp`), either role, against Linux siw.
//! - [`perftest`]: perftest's `ib_send_bw` / `ib_write_bw` / `ib_read_bw` in rdma_cm mode
//!   (`-R`) over the software iWARP RNIC, either role, against Linux siw.

pub mod bench;
pub mod conformance;
pub mod devices;
pub mod endpoint;
pub mod iwbench;
pub mod oob;
pub mod pattern;
pub mod perftest;
pub mod pingpong;
pub mod rping;
pub mod selftest;
pub mod transfer;
pub mod writetest;

use std::process::ExitCode;

use clap::Subcommand;
use smc_verbs::{Mtu, VerbsError, WcStatus};

/// Errors of the `smc rdma` tools.
#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    /// A verbs call failed.
    #[error("verbs: {0}")]
    Verbs(#[from] VerbsError),
    /// An I/O call failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The out-of-band exchange failed or the peer's message was malformed.
    #[error("out-of-band exchange: {0}")]
    Oob(String),
    /// A work request completed with an error.
    #[error("{what} completed with {status:?} (wr_id {wr_id})")]
    Completion {
        /// Which completion.
        what: String,
        /// Its status.
        status: WcStatus,
        /// Its wr_id.
        wr_id: u64,
    },
    /// Nothing happened in time.
    #[error("timed out waiting for {0}")]
    Timeout(String),
    /// Data arrived but is not what was sent.
    #[error("data mismatch: {0}")]
    DataMismatch(String),
    /// The peer did something the protocol does not allow.
    #[error("protocol: {0}")]
    Protocol(String),
    /// This build has no RDMA provider (the `softroce` feature of smc-cli is off).
    #[error("no RDMA provider in this build for {0} (build smc-cli with the softroce feature)")]
    NoProvider(std::net::IpAddr),
    /// Bad command-line values.
    #[error("usage: {0}")]
    Usage(String),
}

/// Path MTU from a byte count.
pub fn mtu_from_bytes(n: usize) -> Result<Mtu, RdmaError> {
    Mtu::from_bytes(n).ok_or_else(|| {
        RdmaError::Usage(format!("MTU {n} is not one of 256, 512, 1024, 2048, 4096"))
    })
}

/// `smc rdma` subcommands.
#[derive(Subcommand, Debug)]
pub enum RdmaCommand {
    /// SEND ping-pong, interoperable with rdma-core's ibv_rc_pingpong (either role).
    Pingpong(pingpong::Args),
    /// RDMA WRITE with read-back verification, interoperable with perftest's ib_write_bw.
    WriteTest(writetest::Args),
    /// RDMA WRITE throughput and SEND/RECV latency on loopback beside kernel TCP.
    Bench(bench::Args),
    /// Run every opcode between two local softroce devices and check the results.
    Selftest(selftest::Args),
    /// Bulk RDMA WRITE + SEND transfer with SHA-256 checks on both ends.
    Transfer(transfer::Args),
    /// rping (rdma-core) over the software iWARP RNIC: SEND buffer exchange, RDMA READ and
    /// WRITE, every ping verified; pairs with `rping -s` / `rping -c` on Linux siw.
    Rping(rping::Args),
    /// perftest's ib_send_bw / ib_write_bw / ib_read_bw in rdma_cm mode (-R) over the
    /// software iWARP RNIC; pairs with `ib_<verb>_bw -R` on Linux siw (either role).
    Perftest(perftest::Args),
    /// Print which RDMA provider this build has (exit 1 without one).
    Info,
    /// List RDMA devices (sysfs + libibverbs), their ports and GID tables, and which
    /// provider SMC_RS_PROVIDER gives an address (like ibv_devices / rdma link).
    Devices(devices::Args),
    /// Run the provider-independent verbs conformance suite on the selected provider.
    Conformance(conformance::Args),
}

/// `smc rdma info`.
fn info() -> Result<(), RdmaError> {
    println!("provider: iwarp (software iWARP RNIC: RDMAP/DDP/MPA over TCP, RFC 6581)");
    if cfg!(feature = "softroce") {
        println!("provider: softroce (software RoCEv2 RNIC over UDP 4791)");
        println!("provider: ibverbs (RDMA NICs through libibverbs, loaded at run time)");
        match smc_providers::selection_from_env() {
            Ok(s) => println!("selection: {}={s}", smc_providers::ENV),
            Err(e) => return Err(RdmaError::Usage(e)),
        }
        Ok(())
    } else {
        Err(RdmaError::NoProvider(
            std::net::Ipv4Addr::UNSPECIFIED.into(),
        ))
    }
}

/// Runs a subcommand; errors are printed, the exit status says pass/fail.
pub fn command(cmd: &RdmaCommand) -> ExitCode {
    let (name, r) = match cmd {
        RdmaCommand::Pingpong(a) => ("pingpong", pingpong::run(a)),
        RdmaCommand::WriteTest(a) => ("write-test", writetest::run(a)),
        RdmaCommand::Bench(a) => ("bench", bench::run(a)),
        RdmaCommand::Selftest(a) => ("selftest", selftest::run(a)),
        RdmaCommand::Transfer(a) => ("transfer", transfer::run(a)),
        RdmaCommand::Rping(a) => ("rping", rping::run(a)),
        RdmaCommand::Perftest(a) => ("perftest", perftest::run(a)),
        RdmaCommand::Info => ("info", info()),
        RdmaCommand::Devices(a) => ("devices", devices::run(a)),
        RdmaCommand::Conformance(a) => ("conformance", conformance::run(a)),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("smc rdma {name}: {e}");
            ExitCode::FAILURE
        }
    }
}
