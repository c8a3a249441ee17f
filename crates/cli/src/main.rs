//! `smc`: the smc-rs command line.

use clap::{Parser, Subcommand};
use std::io::Write;
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
    let cli = Cli::parse();
    match cli.command {
        Command::Decode(args) => {
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            match smc_cli::decode::run(&args, &mut out) {
                Ok(s) => {
                    let _ = out.flush();
                    let kinds: Vec<String> =
                        s.counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
                    eprintln!(
                        "smc decode: {} frames, {} SMC messages, {} malformed, {} non-SMC SENDs{}",
                        s.frames,
                        s.messages(),
                        s.malformed,
                        s.non_smc_sends,
                        if s.damaged.is_some() {
                            ", capture damaged"
                        } else {
                            ""
                        }
                    );
                    eprintln!("  {}", kinds.join("; "));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    let _ = out.flush();
                    eprintln!("smc decode: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
