//! The UEID configuration of a host, on disk and in the environment (`smc ueid`, and the
//! runtime's default stack): where the [`UeidTable`] of the protocol crate comes from.
//!
//! - a file, one UEID per line, `#` comments and blank lines ignored ([`load`], [`save`];
//!   default path [`DEFAULT_UEID_FILE`], overridden by the environment variable
//!   [`UEID_FILE_ENV`]);
//! - the environment variable [`UEID_ENV`] (comma- or blank-separated), which, when set,
//!   replaces the file ([`from_env_or_file`]).

use std::io::Write;
use std::path::{Path, PathBuf};

use smc_proto::clc::{UeidError, UeidTable};

/// Environment variable listing the UEIDs (comma- or blank-separated); overrides the file.
pub const UEID_ENV: &str = "SMC_RS_UEID";
/// Environment variable naming the UEID file (default [`DEFAULT_UEID_FILE`]).
pub const UEID_FILE_ENV: &str = "SMC_RS_UEID_FILE";
/// Default UEID file.
pub const DEFAULT_UEID_FILE: &str = "/etc/smc-rs/ueid";

/// Reading, writing or parsing the UEID configuration failed.
#[derive(Debug, thiserror::Error)]
pub enum UeidFileError {
    /// Reading or writing the file failed.
    #[error("UEID file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Its content (or the environment's) is not a valid UEID list.
    #[error(transparent)]
    Ueid(#[from] UeidError),
}

/// Loads a UEID file; a missing file is an empty table.
pub fn load(path: &Path) -> Result<UeidTable, UeidFileError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(UeidTable::parse_file(&text, path)?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(UeidTable::new()),
        Err(source) => Err(UeidFileError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Writes the table to `path` atomically (temporary file in the same directory, then
/// rename), creating the directory if needed.
pub fn save(table: &UeidTable, path: &Path) -> Result<(), UeidFileError> {
    let io = |source| UeidFileError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(table.to_file_text().as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}

/// The UEID file in effect: [`UEID_FILE_ENV`] if set and not empty, else
/// [`DEFAULT_UEID_FILE`].
pub fn default_path() -> PathBuf {
    match smc_verbs::process::config_var(UEID_FILE_ENV) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(DEFAULT_UEID_FILE),
    }
}

/// The configuration in effect: [`UEID_ENV`] when set (even empty: an empty value
/// disables SMC-Rv2), else the file at [`default_path`].
pub fn from_env_or_file() -> Result<UeidTable, UeidFileError> {
    resolve(
        smc_verbs::process::config_var(UEID_ENV).as_deref(),
        &default_path(),
    )
}

/// [`from_env_or_file`] with the environment value passed in (testable).
pub fn resolve(env_value: Option<&str>, file: &Path) -> Result<UeidTable, UeidFileError> {
    match env_value {
        Some(v) => Ok(UeidTable::parse_list(v)?),
        None => load(file),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_round_trip_and_errors() {
        let dir = std::env::temp_dir().join(format!("smc-rs-ueid-test-{}", std::process::id()));
        let path = dir.join("sub").join("ueid");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(load(&path).unwrap().is_empty(), "missing file");
        let t = UeidTable::parse_list("SMC-PEER-TEST, OTHER.1\nTHIRD").unwrap();
        save(&t, &path).unwrap();
        assert_eq!(load(&path).unwrap(), t);
        std::fs::write(&path, "# c\n\nGOOD # trailing comment\nbad one\n").unwrap();
        match load(&path) {
            Err(UeidFileError::Ueid(UeidError::File { line: 4, .. })) => {}
            other => panic!("{other:?}"),
        }
        // The environment value wins over the file, and an empty value disables v2.
        std::fs::write(&path, "FROMFILE\n").unwrap();
        assert_eq!(resolve(Some("ENV1 ENV2"), &path).unwrap().len(), 2);
        assert!(resolve(Some(""), &path).unwrap().is_empty());
        assert_eq!(
            resolve(None, &path)
                .unwrap()
                .iter()
                .next()
                .unwrap()
                .to_string(),
            "FROMFILE"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
