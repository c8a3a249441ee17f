//! Where the installed program, map and cgroup link are pinned.

use std::path::{Path, PathBuf};

/// Default pin directory (on the bpffs mounted at /sys/fs/bpf).
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/smc-rs";

/// Environment variable that overrides [`DEFAULT_PIN_DIR`] for
/// [`SmcOption::open`](crate::SmcOption::open) and the CLI (used by tests
/// that must not disturb a real installation).
pub const PIN_DIR_ENV: &str = "SMC_RS_BPF_DIR";

/// The files of one installation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinPaths {
    /// The directory holding the pins.
    pub dir: PathBuf,
}

impl PinPaths {
    /// Pins under `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        PinPaths { dir: dir.into() }
    }

    /// `$SMC_RS_BPF_DIR` if set and not empty, else [`DEFAULT_PIN_DIR`].
    pub fn from_env() -> Self {
        match std::env::var_os(PIN_DIR_ENV) {
            Some(d) if !d.is_empty() => Self::new(d),
            _ => Self::new(DEFAULT_PIN_DIR),
        }
    }

    /// The pinned sock_ops program.
    pub fn prog(&self) -> PathBuf {
        self.dir.join("prog")
    }

    /// The pinned `BPF_MAP_TYPE_SK_STORAGE` map that marks sockets.
    pub fn map(&self) -> PathBuf {
        self.dir.join("sk_state")
    }

    /// The pinned cgroup link; while it exists the program is attached.
    pub fn link(&self) -> PathBuf {
        self.dir.join("link")
    }

    /// Every pin, in the order `uninstall` removes them (link first, so the
    /// program is detached before anything else goes).
    pub fn all(&self) -> [PathBuf; 3] {
        [self.link(), self.prog(), self.map()]
    }

    /// The directory, as a path.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
