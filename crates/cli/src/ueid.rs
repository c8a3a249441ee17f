//! `smc ueid add | del | show | flush`: the user-defined EIDs (UEIDs) that SMC-Rv2 needs
//! before two hosts talk version 2 (Linux `smc_ueid`; linux-smc.md §2). The table lives in
//! a file ([`smc::ueid_file::default_path`]: `$SMC_RS_UEID_FILE` or `/etc/smc-rs/ueid`)
//! that every smc-rs stack reads at start-up; `$SMC_RS_UEID` overrides the file for one
//! process, which `show` points out.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use smc::clc::{Ueid, UeidError, UeidTable};
use smc::ueid_file::{self, UeidFileError, UEID_ENV};

/// What `smc ueid` does.
#[derive(clap::Subcommand, Debug)]
pub enum UeidCommand {
    /// Add a UEID (up to 32 characters: A-Z, 0-9, '.' and '-', starting with A-Z or 0-9;
    /// lower case is refused because peers compare the bytes exactly; at most 4 per host,
    /// as Linux).
    Add {
        /// The UEID.
        ueid: String,
        #[command(flatten)]
        file: FileArg,
    },
    /// Remove a UEID.
    Del {
        /// The UEID.
        ueid: String,
        #[command(flatten)]
        file: FileArg,
    },
    /// Print the UEIDs in effect, one per line.
    Show {
        #[command(flatten)]
        file: FileArg,
    },
    /// Remove every UEID (SMC-Rv2 is then not offered; v1 still is).
    Flush {
        #[command(flatten)]
        file: FileArg,
    },
}

/// The file to edit.
#[derive(clap::Args, Debug)]
pub struct FileArg {
    /// UEID file [default: $SMC_RS_UEID_FILE or /etc/smc-rs/ueid]
    #[arg(long)]
    file: Option<PathBuf>,
}

impl FileArg {
    fn path(&self) -> PathBuf {
        self.file.clone().unwrap_or_else(ueid_file::default_path)
    }
}

/// Runs one `smc ueid` command; output goes to `out`.
pub fn run(cmd: &UeidCommand, out: &mut dyn std::io::Write) -> Result<(), UeidFileError> {
    match cmd {
        UeidCommand::Add { ueid, file } => edit(&file.path(), |t| t.add(Ueid::new(ueid)?)),
        UeidCommand::Del { ueid, file } => edit(&file.path(), |t| t.remove(&Ueid::new(ueid)?)),
        UeidCommand::Flush { file } => edit(&file.path(), |t| {
            t.clear();
            Ok(())
        }),
        UeidCommand::Show { file } => {
            let path = file.path();
            let table = ueid_file::load(&path)?;
            for u in &table {
                let _ = writeln!(out, "{u}");
            }
            // The environment wins over the file in every stack this shell starts: say so
            // rather than let `show` list UEIDs that are not in effect.
            if let Ok(v) = std::env::var(UEID_ENV) {
                let _ = writeln!(
                    out,
                    "# note: ${UEID_ENV}={v:?} is set and overrides {} for programs started here",
                    path.display()
                );
            }
            Ok(())
        }
    }
}

fn edit(
    path: &Path,
    f: impl FnOnce(&mut UeidTable) -> Result<(), UeidError>,
) -> Result<(), UeidFileError> {
    let mut table = ueid_file::load(path)?;
    f(&mut table)?;
    ueid_file::save(&table, path)
}

/// `smc ueid ...` as a process exit status.
pub fn command(cmd: &UeidCommand) -> ExitCode {
    match run(cmd, &mut std::io::stdout()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("smc ueid: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_arg(p: &Path) -> FileArg {
        FileArg {
            file: Some(p.to_path_buf()),
        }
    }

    fn show(p: &Path) -> String {
        let mut out = Vec::new();
        run(&UeidCommand::Show { file: file_arg(p) }, &mut out).unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    #[test]
    fn add_del_show_flush_round_trip_through_the_file() {
        let dir = std::env::temp_dir().join(format!("smc-ueid-test-{}", std::process::id()));
        let p = dir.join("ueid");
        assert_eq!(show(&p), "", "a missing file is an empty table");
        for u in ["SMC-RS-A", "SMC-RS-B"] {
            let cmd = UeidCommand::Add {
                ueid: u.into(),
                file: file_arg(&p),
            };
            run(&cmd, &mut Vec::new()).unwrap();
        }
        assert_eq!(show(&p), "SMC-RS-A\nSMC-RS-B\n");
        // Another reader of the same file (what a stack does at start-up) sees the same.
        assert_eq!(ueid_file::load(&p).unwrap().len(), 2);
        let del = UeidCommand::Del {
            ueid: "SMC-RS-A".into(),
            file: file_arg(&p),
        };
        run(&del, &mut Vec::new()).unwrap();
        assert_eq!(show(&p), "SMC-RS-B\n");
        // Deleting what is not there and adding what is invalid are errors, and leave
        // the file as it was.
        assert!(run(&del, &mut Vec::new()).is_err());
        for bad in ["no spaces allowed", "lower-case", "-LEADING-DASH"] {
            let bad = UeidCommand::Add {
                ueid: bad.into(),
                file: file_arg(&p),
            };
            assert!(run(&bad, &mut Vec::new()).is_err());
        }
        assert_eq!(show(&p), "SMC-RS-B\n");
        run(&UeidCommand::Flush { file: file_arg(&p) }, &mut Vec::new()).unwrap();
        assert_eq!(show(&p), "");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
