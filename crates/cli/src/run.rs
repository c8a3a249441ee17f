//! `smc run [--] PROG ARGS...`: runs an unmodified program with `libsmc_preload.so`
//! preloaded (crates/preload), so that its TCP sockets use SMC-R where the peer can and
//! TCP where it cannot. The library is inherited by the program's children through the
//! environment.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The interposition library's file name.
pub const LIBRARY: &str = "libsmc_preload.so";

/// Arguments of `smc run`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The program and its arguments (`--` before them if they start with `-`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROG [ARGS]..."
    )]
    pub command: Vec<OsString>,
}

/// Where the library is: `SMC_RS_PRELOAD` if set, else next to the `smc` binary (as
/// `cargo build --release -p smc-preload` leaves it beside target/release/smc), else
/// in `../lib` from it (an installed layout).
pub fn locate(env: Option<&OsStr>, exe: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = env.filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(std::path::absolute(&p).unwrap_or(p))
        } else {
            Err(format!("SMC_RS_PRELOAD={}: no such file", p.display()))
        };
    }
    let dir = exe
        .and_then(Path::parent)
        .ok_or("cannot tell where the smc binary is; set SMC_RS_PRELOAD")?;
    let tried = [dir.join(LIBRARY), dir.join("../lib").join(LIBRARY)];
    for p in &tried {
        if p.is_file() {
            return Ok(p.clone());
        }
    }
    Err(format!(
        "{LIBRARY} not found at {} (build it with `cargo build --release -p smc-preload`, \
         or set SMC_RS_PRELOAD)",
        tried
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" or ")
    ))
}

/// LD_PRELOAD with `lib` appended to what was there (kept in front: an interposer the
/// user already preloads still sees the calls first), unless it is already listed.
pub fn ld_preload(existing: Option<&OsStr>, lib: &Path) -> OsString {
    let lib = lib.as_os_str();
    match existing.filter(|e| !e.is_empty()) {
        None => lib.to_owned(),
        Some(e) => {
            let listed = e
                .to_string_lossy()
                .split([':', ' '])
                .any(|x| OsStr::new(x) == lib);
            if listed {
                return e.to_owned();
            }
            let mut v = e.to_owned();
            v.push(":");
            v.push(lib);
            v
        }
    }
}

/// `smc run`: execs the program (returns only when it cannot: 127 not found, 126 other).
pub fn command(args: &Args) -> ExitCode {
    let exe = std::env::current_exe().ok();
    let lib = match locate(
        std::env::var_os("SMC_RS_PRELOAD").as_deref(),
        exe.as_deref(),
    ) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("smc run: {e}");
            return ExitCode::from(127);
        }
    };
    let preload = ld_preload(std::env::var_os("LD_PRELOAD").as_deref(), &lib);
    let (prog, rest) = match args.command.split_first() {
        Some(x) => x,
        None => return ExitCode::from(2),
    };
    let err = std::process::Command::new(prog)
        .args(rest)
        .env("LD_PRELOAD", preload)
        .exec();
    eprintln!("smc run: {}: {err}", Path::new(prog).display());
    ExitCode::from(if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ld_preload_appends_once() {
        let lib = Path::new("/x/libsmc_preload.so");
        assert_eq!(ld_preload(None, lib), "/x/libsmc_preload.so");
        assert_eq!(
            ld_preload(Some(OsStr::new("")), lib),
            "/x/libsmc_preload.so"
        );
        assert_eq!(
            ld_preload(Some(OsStr::new("/a/libfoo.so")), lib),
            "/a/libfoo.so:/x/libsmc_preload.so"
        );
        assert_eq!(
            ld_preload(Some(OsStr::new("/a/libfoo.so /x/libsmc_preload.so")), lib),
            "/a/libfoo.so /x/libsmc_preload.so"
        );
    }

    #[test]
    fn locate_prefers_the_environment_then_the_binary_directory() {
        let dir = std::env::temp_dir().join(format!("smc-run-locate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("smc");
        assert!(locate(None, Some(&exe))
            .unwrap_err()
            .contains("cargo build --release -p smc-preload"));
        std::fs::write(dir.join(LIBRARY), b"").unwrap();
        assert_eq!(locate(None, Some(&exe)).unwrap(), dir.join(LIBRARY));
        let other = dir.join("other.so");
        assert!(locate(Some(other.as_os_str()), Some(&exe))
            .unwrap_err()
            .contains("no such file"));
        std::fs::write(&other, b"").unwrap();
        assert_eq!(locate(Some(other.as_os_str()), Some(&exe)).unwrap(), other);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
