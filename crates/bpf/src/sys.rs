//! Small system helpers: mounts, cgroups, groups, BPF object info.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Group};
use rustix::mount::MountFlags;

/// `BPF_FS_MAGIC` from <linux/magic.h>.
pub const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
/// `CGROUP2_SUPER_MAGIC` from <linux/magic.h>.
pub const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// The filesystem magic of the filesystem holding `p`.
pub fn fs_magic(p: &Path) -> io::Result<i64> {
    let st = rustix::fs::statfs(p)?;
    // f_type is an i64 on x86-64 but narrower on other architectures.
    #[allow(clippy::unnecessary_cast)]
    Ok(st.f_type as i64)
}

/// Mount points of `fstype` listed in /proc/self/mountinfo.
pub fn mounts_of_type(fstype: &str) -> io::Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text
        .lines()
        .filter_map(|l| {
            // "... mount-point ... - fstype source options"
            let (left, right) = l.split_once(" - ")?;
            let ty = right.split_whitespace().next()?;
            let mp = left.split_whitespace().nth(4)?;
            (ty == fstype).then(|| PathBuf::from(unescape_mountinfo(mp)))
        })
        .collect())
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The root of the cgroup v2 hierarchy (the first cgroup2 mount).
pub fn cgroup2_root() -> io::Result<PathBuf> {
    mounts_of_type("cgroup2")?
        .into_iter()
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no cgroup2 filesystem is mounted"))
}

/// Finds the cgroup v2 directory whose inode number is `id` (on cgroup2 the
/// cgroup id is the directory's inode number). Searches at most `limit`
/// directories.
pub fn cgroup_path_by_id(root: &Path, id: u64, limit: usize) -> Option<PathBuf> {
    let mut queue = std::collections::VecDeque::from([root.to_path_buf()]);
    let mut seen = 0;
    while let Some(dir) = queue.pop_front() {
        seen += 1;
        if seen > limit {
            return None;
        }
        let md = std::fs::metadata(&dir).ok()?;
        if md.ino() == id {
            return Some(dir);
        }
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    queue.push_back(e.path());
                }
            }
        }
    }
    None
}

/// Mounts a bpffs at `at` (mode 0700, as systemd does).
pub fn mount_bpffs(at: &Path) -> io::Result<()> {
    rustix::mount::mount("bpf", at, "bpf", MountFlags::empty(), c"mode=0700")?;
    Ok(())
}

/// Resolves a group name (or a numeric gid) to a gid (NSS, getgrnam_r).
pub fn group_id(name: &str) -> io::Result<u32> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    match Group::from_name(name) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        Ok(None) => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no such group: {name}"),
        )),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// The name of group `gid`, if it has one (NSS, getgrgid_r).
pub fn group_name(gid: u32) -> Option<String> {
    Group::from_gid(Gid::from_raw(gid))
        .ok()
        .flatten()
        .map(|g| g.name)
}

/// Identity of a pinned program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgInfo {
    /// Kernel program id.
    pub id: u32,
    /// Program name (at most 15 bytes).
    pub name: String,
    /// The 8-byte program tag, in hex.
    pub tag: String,
}

/// Reads the id, name and tag of the program pinned at `path`.
pub fn pinned_prog_info(path: &Path) -> io::Result<ProgInfo> {
    let c = cpath(path)?;
    // SAFETY: `c` is a valid NUL-terminated path.
    let fd = unsafe { libbpf_rs::libbpf_sys::bpf_obj_get(c.as_ptr()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: bpf_obj_get returned a new file descriptor that we own.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let mut info = libbpf_rs::libbpf_sys::bpf_prog_info::default();
    let mut len = std::mem::size_of_val(&info) as u32;
    // SAFETY: `info` is a writable bpf_prog_info of `len` bytes, and no
    // pointer fields (which would make the kernel write elsewhere) are set.
    let r = unsafe {
        libbpf_rs::libbpf_sys::bpf_prog_get_info_by_fd(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &mut info,
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r.saturating_neg()));
    }
    let name: Vec<u8> = info
        .name
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    Ok(ProgInfo {
        id: info.id,
        name: String::from_utf8_lossy(&name).into_owned(),
        tag: info.tag.iter().map(|b| format!("{b:02x}")).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_unescape() {
        assert_eq!(unescape_mountinfo("/a\\040b"), "/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo("/x\\04"), "/x\\04");
    }
}
