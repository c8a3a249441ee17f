//! `smc ueid add|del|show`: the User EIDs (SMC-Rv2) of `Stack::global()`, kept in the UEID
//! file (`/etc/smc-rs/ueid`, or `SMC_RS_UEID_FILE`), one per line. Linux keeps its UEIDs in
//! the kernel (`smcd ueid add`); SMC-Rv2 needs one in common with the peer, else the server
//! declines (Linux: NOSMCDEV) and both sides stay on TCP.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args as ClapArgs, Subcommand};
use smc::clc::ueid::{UEID_ENV, UEID_FILE_ENV};
use smc::clc::{Ueid, UeidError, UeidTable};

/// `smc ueid` arguments.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// UEID file to read and write [default: $SMC_RS_UEID_FILE or /etc/smc-rs/ueid]
    #[arg(long, global = true)]
    pub file: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

/// What to do.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Add a User EID (up to 32 characters A-Z 0-9 . -; at most 4).
    Add {
        /// The UEID, e.g. SMC-RS-DEMO
        ueid: String,
    },
    /// Remove a User EID (`--all`: every one).
    Del {
        /// The UEID to remove
        #[arg(required_unless_present = "all")]
        ueid: Option<String>,
        /// Remove every UEID
        #[arg(long, conflicts_with = "ueid")]
        all: bool,
    },
    /// Print the UEIDs in the file and the ones in effect for `smc listen`/`connect`.
    Show,
}

/// Runs `smc ueid`.
pub fn command(args: &Args) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("smc ueid: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), UeidError> {
    let path = args.file.clone().unwrap_or_else(UeidTable::default_path);
    match &args.command {
        Command::Add { ueid } => {
            let mut t = UeidTable::load(&path)?;
            t.add(Ueid::new(ueid)?)?;
            t.save(&path)?;
            println!("added {} ({})", ueid.trim(), path.display());
        }
        Command::Del { ueid, all } => {
            let mut t = UeidTable::load(&path)?;
            if *all {
                t.clear();
            } else if let Some(u) = ueid {
                t.remove(&Ueid::new(u)?)?;
            }
            t.save(&path)?;
            println!("{} UEID(s) left ({})", t.len(), path.display());
        }
        Command::Show => {
            let t = UeidTable::load(&path)?;
            println!("file {}:", path.display());
            for u in &t {
                println!("  {u}");
            }
            // What Stack::global() uses: the environment wins over the file.
            match std::env::var(UEID_ENV) {
                Ok(v) => {
                    let e = UeidTable::parse_list(&v)?;
                    println!("in effect (from {UEID_ENV}, the file is ignored):");
                    for u in &e {
                        println!("  {u}");
                    }
                    if e.is_empty() {
                        println!("  none: SMC-Rv2 is not offered");
                    }
                }
                Err(_) if t.is_empty() => {
                    println!("in effect: none (SMC-Rv2 is not offered; set {UEID_ENV} or add one)")
                }
                Err(_) => println!("in effect: the file's ({UEID_FILE_ENV} picks another file)"),
            }
        }
    }
    Ok(())
}
