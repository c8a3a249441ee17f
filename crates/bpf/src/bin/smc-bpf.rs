//! Stand-alone `smc-bpf install|status|uninstall` (the same code as
//! `smc bpf ...`).

use clap::Parser;
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "smc-bpf",
    version,
    about = "Manage the SMC-R TCP option eBPF program"
)]
struct Cli {
    #[command(subcommand)]
    cmd: smc_bpf::cli::BpfCommand,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    smc_bpf::route_libbpf_logs();
    smc_bpf::cli::run(Cli::parse().cmd)
}
