//! `smc bpf install | status | uninstall`, as clap types the `smc` command
//! embeds:
//!
//! ```ignore
//! #[derive(clap::Subcommand)]
//! enum Command {
//!     /// The eBPF program that puts the SMC-R option in SYN/SYN-ACK.
//!     #[command(subcommand)]
//!     Bpf(smc_bpf::cli::BpfCommand),
//! }
//! // ...
//! Command::Bpf(cmd) => smc_bpf::cli::run(cmd)?,
//! ```

use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::install::{self, InstallOptions};
use crate::paths::PinPaths;

/// Where the pins live (all subcommands).
#[derive(Debug, Clone, Args)]
pub struct PinArgs {
    /// Pin directory on a bpffs [default: $SMC_RS_BPF_DIR or /sys/fs/bpf/smc-rs]
    #[arg(long, value_name = "DIR")]
    pub pin_dir: Option<PathBuf>,
}

impl PinArgs {
    fn paths(&self) -> PinPaths {
        match &self.pin_dir {
            Some(d) => PinPaths::new(d),
            None => PinPaths::from_env(),
        }
    }
}

/// Manage the eBPF sock_ops program that writes the RFC 7609 SMC-R TCP
/// option into the SYN/SYN-ACK of marked sockets.
#[derive(Debug, Clone, Subcommand)]
pub enum BpfCommand {
    /// Load, pin and attach the program (root). Replaces an existing
    /// installation at the same pin directory.
    Install {
        /// cgroup v2 directory to attach to [default: the cgroup v2 root]
        #[arg(long, value_name = "PATH")]
        cgroup: Option<PathBuf>,
        /// Group (name or gid) allowed to mark sockets without root
        #[arg(long, value_name = "NAME")]
        group: Option<String>,
        /// Pin directory.
        #[command(flatten)]
        pins: PinArgs,
    },
    /// Show what is installed and attached.
    Status {
        /// Pin directory.
        #[command(flatten)]
        pins: PinArgs,
    },
    /// Detach and unpin everything (root). Succeeds when nothing is installed.
    Uninstall {
        /// Pin directory.
        #[command(flatten)]
        pins: PinArgs,
    },
}

/// Runs one subcommand, printing its result on stdout.
pub fn run(cmd: BpfCommand) -> anyhow::Result<()> {
    match cmd {
        BpfCommand::Install {
            cgroup,
            group,
            pins,
        } => {
            let st = install::install(&InstallOptions {
                paths: pins.paths(),
                cgroup,
                group,
            })?;
            print!("{st}");
        }
        BpfCommand::Status { pins } => {
            let st = install::status(&pins.paths())?;
            print!("{st}");
            if !st.is_installed() && st.dir_perms.is_some() {
                anyhow::bail!("installation at {} is incomplete", st.dir.display());
            }
        }
        BpfCommand::Uninstall { pins } => {
            let paths = pins.paths();
            install::uninstall(&paths)?;
            println!("not installed: {}", paths.dir().display());
        }
    }
    Ok(())
}
