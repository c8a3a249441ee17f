//! `smc`: the smc-rs command line. Each subcommand lives in its own module of the `smc_cli`
//! library and exposes `Args` (clap) and `command(&Args) -> ExitCode`; adding one is a
//! variant here plus a match arm.

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(name = "smc", version, about = "smc-rs: userspace SMC-R (RFC 7609)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print every SMC message (TCP option, CLC, LLC, CDC) in a pcap/pcapng capture.
    Decode(smc_cli::decode::Args),
    /// Install, inspect or remove the eBPF program that puts the SMC-R option in SYN/SYN-ACK.
    #[command(subcommand)]
    Bpf(smc_bpf::cli::BpfCommand),
    /// RDMA tools on the software RoCEv2 RNIC: interop with rdma-core/perftest, benchmark,
    /// self-test, bulk transfer.
    #[command(subcommand)]
    Rdma(smc_cli::rdma::RdmaCommand),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("SMC_LOG").unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Decode(args) => smc_cli::decode::command(&args),
        Command::Rdma(cmd) => smc_cli::rdma::command(&cmd),
        Command::Bpf(cmd) => {
            smc_bpf::route_libbpf_logs();
            match smc_bpf::cli::run(cmd) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("smc bpf: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
