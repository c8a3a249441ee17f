//! `install`, `status` and `uninstall`: loading, pinning and attaching the
//! sock_ops program (root), as library code for the `smc bpf` command.

use std::fmt;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use libbpf_rs::query::LinkTypeInfo;
use libbpf_rs::{Link, MapCore, MapHandle, ObjectBuilder};

use crate::paths::PinPaths;
use crate::sys;

/// The compiled sock_ops program (built by build.rs from
/// bpf/smc_option.bpf.c).
pub static BPF_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/smc_option.bpf.o"));

const PROG_NAME: &str = "smc_sockops";
const MAP_NAME: &str = "smc_sk_state";

/// What `install` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallOptions {
    /// Pins.
    pub paths: PinPaths,
    /// cgroup v2 directory to attach to; `None` = the cgroup v2 root.
    pub cgroup: Option<PathBuf>,
    /// Group whose members may mark sockets without root.
    pub group: Option<String>,
}

fn ensure_root() -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        bail!("this needs root (loading and attaching eBPF programs)");
    }
    Ok(())
}

/// Makes sure a bpffs is mounted where the pin directory will live.
fn ensure_bpffs(paths: &PinPaths) -> Result<PathBuf> {
    let parent = paths
        .dir()
        .parent()
        .context("pin directory has no parent")?
        .to_path_buf();
    match sys::fs_magic(&parent) {
        Ok(m) if m == sys::BPF_FS_MAGIC => return Ok(parent),
        Ok(_) => {}
        Err(e) => return Err(e).with_context(|| format!("cannot stat {}", parent.display())),
    }
    tracing::info!(at = %parent.display(), "mounting bpffs");
    sys::mount_bpffs(&parent)
        .with_context(|| format!("cannot mount bpffs at {}", parent.display()))?;
    Ok(parent)
}

fn resolve_cgroup(cgroup: Option<&Path>) -> Result<PathBuf> {
    let path = match cgroup {
        Some(p) => p.to_path_buf(),
        None => sys::cgroup2_root().context("cannot find the cgroup v2 mount")?,
    };
    let magic = sys::fs_magic(&path).with_context(|| format!("cannot stat {}", path.display()))?;
    if magic != sys::CGROUP2_SUPER_MAGIC {
        bail!("{} is not a cgroup v2 directory", path.display());
    }
    Ok(path)
}

/// Loads the program, pins program and map, attaches the program to the
/// cgroup through a pinned link and sets permissions. An existing
/// installation at the same place is replaced.
pub fn install(opts: &InstallOptions) -> Result<Status> {
    ensure_root()?;
    let paths = &opts.paths;
    let gid = opts
        .group
        .as_deref()
        .map(sys::group_id)
        .transpose()
        .context("--group")?;
    let cgroup = resolve_cgroup(opts.cgroup.as_deref())?;
    let bpffs = ensure_bpffs(paths)?;
    if paths.dir().exists() {
        tracing::info!(dir = %paths.dir().display(), "replacing the existing installation");
        uninstall(paths)?;
    }

    let mut obj = ObjectBuilder::default()
        .open_memory(BPF_OBJECT)
        .context("cannot open the embedded BPF object")?
        .load()
        .context("the kernel rejected the BPF program (its verifier log is above; needs Linux >= 5.10 with BPF_SOCK_OPS_WRITE_HDR_OPT_CB, cgroup v2, BTF)")?;

    fs::create_dir(paths.dir())
        .with_context(|| format!("cannot create {}", paths.dir().display()))?;
    let result = (|| -> Result<()> {
        let mut map = obj
            .maps_mut()
            .find(|m| m.name() == MAP_NAME)
            .context("map smc_sk_state missing from the object")?;
        map.pin(paths.map()).context("cannot pin the map")?;
        let mut prog = obj
            .progs_mut()
            .find(|p| p.name() == PROG_NAME)
            .context("program smc_sockops missing from the object")?;
        prog.pin(paths.prog()).context("cannot pin the program")?;
        let cg = fs::File::open(&cgroup)
            .with_context(|| format!("cannot open cgroup {}", cgroup.display()))?;
        let mut link = prog
            .attach_cgroup(cg.as_raw_fd())
            .with_context(|| format!("cannot attach to cgroup {}", cgroup.display()))?;
        link.pin(paths.link())
            .context("cannot pin the cgroup link")?;
        // The pin keeps the attachment alive after this process exits.
        link.disconnect();
        set_permissions(paths, gid, &bpffs)
    })();
    if let Err(e) = result {
        let _ = uninstall(paths);
        return Err(e);
    }
    tracing::info!(cgroup = %cgroup.display(), dir = %paths.dir().display(), "installed");
    status(paths)
}

/// Root owns everything. With a group: the directory is 0750 and the map
/// 0660 for that group (marking and reading need write and read access to
/// the map), the program and link stay 0600. The bpffs mount point gets
/// search permission for others (0711-style: no listing) when it has none,
/// or group members could not reach the directory.
fn set_permissions(paths: &PinPaths, gid: Option<u32>, bpffs: &Path) -> Result<()> {
    let chmod = |p: &Path, mode: u32| {
        fs::set_permissions(p, fs::Permissions::from_mode(mode))
            .with_context(|| format!("cannot chmod {}", p.display()))
    };
    let chown = |p: &Path, gid: u32| {
        std::os::unix::fs::chown(p, Some(0), Some(gid))
            .with_context(|| format!("cannot chown {}", p.display()))
    };
    chmod(&paths.prog(), 0o600)?;
    chmod(&paths.link(), 0o600)?;
    match gid {
        None => {
            chmod(paths.dir(), 0o700)?;
            chmod(&paths.map(), 0o600)?;
        }
        Some(gid) => {
            chown(paths.dir(), gid)?;
            chown(&paths.map(), gid)?;
            chmod(paths.dir(), 0o750)?;
            chmod(&paths.map(), 0o660)?;
            let mode = fs::metadata(bpffs)?.mode() & 0o7777;
            if mode & 0o001 == 0 {
                tracing::info!(at = %bpffs.display(), "adding search permission (o+x) to the bpffs mount point");
                chmod(bpffs, mode | 0o001)?;
            }
        }
    }
    Ok(())
}

/// Removes the pins (the link first, which detaches the program). Succeeds
/// when nothing is installed.
pub fn uninstall(paths: &PinPaths) -> Result<()> {
    ensure_root()?;
    for p in paths.all() {
        match fs::remove_file(&p) {
            Ok(()) => tracing::info!(pin = %p.display(), "removed"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot remove {}", p.display())),
        }
    }
    match fs::remove_dir(paths.dir()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| {
            format!(
                "cannot remove {} (does it hold files that are not ours?)",
                paths.dir().display()
            )
        }),
    }
}

/// Ownership and mode of one pin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Perms {
    /// Owner uid.
    pub uid: u32,
    /// Group gid.
    pub gid: u32,
    /// Permission bits.
    pub mode: u32,
}

impl fmt::Display for Perms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = sys::group_name(self.gid).unwrap_or_else(|| self.gid.to_string());
        write!(f, "{:04o} uid {} group {}", self.mode, self.uid, g)
    }
}

fn perms(p: &Path) -> Option<Perms> {
    fs::symlink_metadata(p).ok().map(|m| Perms {
        uid: m.uid(),
        gid: m.gid(),
        mode: m.mode() & 0o7777,
    })
}

/// What is installed at one pin directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// The pin directory.
    pub dir: PathBuf,
    /// Its permissions, if it exists.
    pub dir_perms: Option<Perms>,
    /// The pinned program, if any.
    pub prog: Option<sys::ProgInfo>,
    /// Link id, program id and cgroup id of the pinned cgroup link.
    pub link: Option<(u32, u32, u64)>,
    /// The cgroup directory the link attaches to, when found.
    pub cgroup: Option<PathBuf>,
    /// Map id and permissions of the pinned map.
    pub map: Option<(u32, Perms)>,
    /// Things that look wrong.
    pub problems: Vec<String>,
}

impl Status {
    /// Program pinned, map pinned and link pinned.
    pub fn is_installed(&self) -> bool {
        self.prog.is_some() && self.link.is_some() && self.map.is_some()
    }
}

/// Reports what is installed at `paths` (root is not needed for the parts
/// the caller may read).
pub fn status(paths: &PinPaths) -> Result<Status> {
    let mut st = Status {
        dir: paths.dir().to_path_buf(),
        dir_perms: perms(paths.dir()),
        ..Status::default()
    };
    if st.dir_perms.is_none() {
        return Ok(st);
    }
    match sys::pinned_prog_info(&paths.prog()) {
        Ok(p) => st.prog = Some(p),
        Err(e) => st
            .problems
            .push(format!("program {}: {e}", paths.prog().display())),
    }
    match Link::open(paths.link()) {
        Ok(mut link) => {
            match link.info() {
                Ok(info) => {
                    let cg = match info.info {
                        LinkTypeInfo::Cgroup(c) => c.cgroup_id,
                        _ => {
                            st.problems
                                .push("the pinned link is not a cgroup link".into());
                            0
                        }
                    };
                    st.link = Some((info.id, info.prog_id, cg));
                    if cg != 0 {
                        st.cgroup = sys::cgroup2_root()
                            .ok()
                            .and_then(|root| sys::cgroup_path_by_id(&root, cg, 100_000));
                    }
                    if let Some(p) = &st.prog {
                        if p.id != info.prog_id {
                            st.problems.push(format!(
                                "link runs program {} but program {} is pinned",
                                info.prog_id, p.id
                            ));
                        }
                    }
                }
                Err(e) => st.problems.push(format!("link info: {e}")),
            }
            // Dropping a libbpf link closes its fd; it never detaches a
            // pinned link, but say so explicitly.
            link.disconnect();
        }
        Err(e) => st
            .problems
            .push(format!("link {}: {e}", paths.link().display())),
    }
    match MapHandle::from_pinned_path(paths.map()) {
        Ok(m) => match m.info() {
            Ok(i) => {
                if let Some(p) = perms(&paths.map()) {
                    st.map = Some((i.info.id, p));
                }
            }
            Err(e) => st.problems.push(format!("map info: {e}")),
        },
        Err(e) => st
            .problems
            .push(format!("map {}: {e}", paths.map().display())),
    }
    Ok(st)
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(dp) = &self.dir_perms else {
            return writeln!(f, "not installed (no {})", self.dir.display());
        };
        writeln!(
            f,
            "{}: {}",
            if self.is_installed() {
                "installed"
            } else {
                "partly installed"
            },
            self.dir.display()
        )?;
        writeln!(f, "  directory: {dp}")?;
        match &self.prog {
            Some(p) => writeln!(f, "  program:   id {} name {} tag {}", p.id, p.name, p.tag)?,
            None => writeln!(f, "  program:   missing")?,
        }
        match (&self.link, &self.cgroup) {
            (Some((id, prog, cg)), Some(path)) => writeln!(
                f,
                "  attached:  link id {id}, program {prog}, cgroup {} (id {cg}), sock_ops",
                path.display()
            )?,
            (Some((id, prog, cg)), None) => writeln!(
                f,
                "  attached:  link id {id}, program {prog}, cgroup id {cg} (path not found), sock_ops"
            )?,
            (None, _) => writeln!(f, "  attached:  no")?,
        }
        match &self.map {
            Some((id, p)) => writeln!(
                f,
                "  map:       {} (id {id}), {p}",
                self.dir.join("sk_state").display()
            )?,
            None => writeln!(f, "  map:       missing")?,
        }
        for p in &self.problems {
            writeln!(f, "  problem:   {p}")?;
        }
        Ok(())
    }
}
