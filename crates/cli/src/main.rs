//! `smc`: the smc-rs command line. Each subcommand lives in its own module of the `smc_cli`
//! library and exposes `Args` (clap) and `command(&Args) -> ExitCode`; adding one is a
//! variant here plus a match arm.

use clap::{Parser, Subcommand};
use std::io::IsTerminal;
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
    /// Listen for SMC connections: netcat-like (stdin/stdout), or --echo / --sink.
    Listen(smc_cli::endpoint::ListenArgs),
    /// Connect with SMC: netcat-like (stdin/stdout), or --send-bytes with hash checks.
    Connect(smc_cli::endpoint::ConnectArgs),
    /// SMC-R between two stacks in this process, verified, beside kernel TCP.
    Demo(smc_cli::smc_cmd::DemoArgs),
    /// Throughput, latency and connection rate: SMC-R vs kernel TCP, with the targets.
    Bench(smc_cli::smc_cmd::BenchArgs),
    /// Many connections: N held open at once and M in sequence, SMC-R beside kernel TCP
    /// (times, memory, threads, fds), with a server mode (--listen / --connect).
    Scale(smc_cli::scale::ScaleArgs),
    /// Install, inspect or remove the eBPF program that puts the SMC-R option in SYN/SYN-ACK.
    #[command(subcommand)]
    Bpf(smc_bpf::cli::BpfCommand),
    /// RDMA tools on the software RoCEv2 RNIC: interop with rdma-core/perftest, benchmark,
    /// self-test, bulk transfer.
    #[command(subcommand)]
    Rdma(smc_cli::rdma::RdmaCommand),
    /// Run an unmodified program with its TCP sockets on SMC-R where the peer can
    /// (LD_PRELOAD of libsmc_preload.so; see the README, "Running unmodified programs").
    Run(smc_cli::run::Args),
    /// Every SMC socket of every smc-rs process on the host (like smcss): process, state,
    /// addresses, mode, fallback reason, link group, bytes.
    Ss(smc_cli::observe::SsArgs),
    /// Link groups and links of every smc-rs process (like smcr linkgroup show).
    Lgr(smc_cli::observe::LgrArgs),
    /// Host-wide SMC counters (like smcr stats); `reset` zeroes them.
    Stats(smc_cli::observe::StatsArgs),
    /// Try an SMC connection to HOST:PORT and say whether SMC-R was used, and if not why
    /// and what to change (like smc_chk).
    Chk(smc_cli::observe::ChkArgs),
    /// Show or change the user EIDs (UEIDs) that SMC-Rv2 needs (file shared by every stack).
    #[command(subcommand)]
    Ueid(smc_cli::ueid::UeidCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Run(args) = &cli.command {
        // Nothing of this process's own: the program gets the environment as it is.
        return smc_cli::run::command(args);
    }
    // The SMC commands say once that the TCP-option override is in use (demo and bench
    // set it themselves); smc-bpf's warning on every connection would bury their output.
    let default_filter = match cli.command {
        Command::Listen(_)
        | Command::Connect(_)
        | Command::Demo(_)
        | Command::Bench(_)
        | Command::Scale(_) => "warn,smc::tcp_option::policy=error",
        Command::Chk(_) => "warn,smc::tcp_option::policy=error",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("SMC_LOG").unwrap_or_else(|_| EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    // The runtime links no provider and no eBPF: the defaults of Stack::global and
    // StackConfig::from_env come from here (smc::defaults).
    smc_providers::install_default();
    smc_bpf::install_default();
    match cli.command {
        Command::Decode(args) => smc_cli::decode::command(&args),
        Command::Listen(args) => smc_cli::smc_cmd::listen(&args),
        Command::Connect(args) => smc_cli::smc_cmd::connect(&args),
        Command::Demo(args) => smc_cli::smc_cmd::demo(&args),
        Command::Bench(args) => smc_cli::smc_cmd::bench(&args),
        Command::Scale(args) => smc_cli::smc_cmd::scale(&args),
        Command::Rdma(cmd) => smc_cli::rdma::command(&cmd),
        Command::Ueid(cmd) => smc_cli::ueid::command(&cmd),
        Command::Ss(args) => smc_cli::observe::ss(&args),
        Command::Lgr(args) => smc_cli::observe::lgr(&args),
        Command::Stats(args) => smc_cli::observe::stats(&args),
        Command::Chk(args) => smc_cli::observe::chk(&args),
        Command::Run(args) => smc_cli::run::command(&args),
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
