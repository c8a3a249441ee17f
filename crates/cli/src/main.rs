//! `smc`: the smc-rs command line. Each subcommand lives in its own module of the `smc_cli`
//! library and exposes `Args` (clap) and `command(&Args) -> ExitCode`; adding one is a
//! variant here plus a match arm.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

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
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Decode(args) => smc_cli::decode::command(&args),
    }
}
