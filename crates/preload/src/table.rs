//! Which descriptors of this process are SMC sockets: an accepted or connected SMC-R
//! stream (one end of a socketpair, its peer end pumped to the connection) or an SMC
//! listener (a socketpair end on which finished rendezvous arrive).
//!
//! Every entry remembers the file it was made for (device and inode): a descriptor
//! closed behind our back (`fclose`, a raw `close` syscall) and reused for another file
//! is not mistaken for ours. Nothing is dropped under the lock: dropping an entry can
//! close descriptors, and `close` is interposed and looks here.

use std::collections::BTreeMap;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use libc::c_int;

use crate::conn::StreamEntry;
use crate::listen::ListenerEntry;
use crate::lock::Mutex;

/// What a descriptor of ours is.
#[derive(Clone)]
pub(crate) enum Entry {
    Stream(Arc<StreamEntry>),
    Listener(Arc<ListenerEntry>),
}

pub(crate) struct Slot {
    file: (u64, u64),
    entry: Entry,
}

/// The table; fork handlers take and release it around `fork()` (lib.rs).
pub(crate) static TABLE: Mutex<BTreeMap<c_int, Slot>> = Mutex::new(BTreeMap::new());

/// One bit per descriptor below [`MARK_FDS`]: "may be in the table". `close()` of every
/// other descriptor of the process costs one atomic load, not a lock.
const MARK_FDS: usize = 1 << 16;
static MARKS: [AtomicU64; MARK_FDS / 64] = [const { AtomicU64::new(0) }; MARK_FDS / 64];

fn mark(fd: c_int, on: bool) {
    let Ok(i) = usize::try_from(fd) else { return };
    if i >= MARK_FDS {
        return;
    }
    let bit = 1u64 << (i % 64);
    if on {
        MARKS[i / 64].fetch_or(bit, Ordering::AcqRel);
    } else {
        MARKS[i / 64].fetch_and(!bit, Ordering::AcqRel);
    }
}

fn marked(fd: c_int) -> bool {
    match usize::try_from(fd) {
        Ok(i) if i < MARK_FDS => MARKS[i / 64].load(Ordering::Acquire) & (1u64 << (i % 64)) != 0,
        Ok(_) => true,
        Err(_) => false,
    }
}

/// Device and inode of the file `fd` refers to.
pub(crate) fn file_of(fd: c_int) -> Option<(u64, u64)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `st` is valid for a struct stat; fstat fills it on success.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: fstat returned 0, so `st` is initialised.
    let st = unsafe { st.assume_init() };
    Some((st.st_dev, st.st_ino))
}

/// Records `fd` as `entry` (replacing what was there, which is returned for dropping).
pub(crate) fn insert(fd: c_int, entry: Entry) -> Option<Entry> {
    let file = file_of(fd)?;
    mark(fd, true);
    TABLE
        .lock()
        .insert(fd, Slot { file, entry })
        .map(|s| s.entry)
}

/// The entry of `fd`, if it is still the file we recorded.
pub(crate) fn lookup(fd: c_int) -> Option<Entry> {
    if !marked(fd) {
        return None;
    }
    let file = file_of(fd);
    let mut t = TABLE.lock();
    let slot = t.get(&fd)?;
    if Some(slot.file) == file {
        return Some(slot.entry.clone());
    }
    let stale = t.remove(&fd);
    drop(t);
    mark(fd, false);
    drop(stale);
    None
}

/// Forgets `fd` (closed or about to be replaced); the caller drops the result after
/// the descriptor is gone.
pub(crate) fn remove(fd: c_int) -> Option<Entry> {
    if !marked(fd) {
        return None;
    }
    let s = TABLE.lock().remove(&fd);
    mark(fd, false);
    s.map(|s| s.entry)
}

/// `new` is a duplicate of `old` (dup, dup2, dup3, F_DUPFD): the same socket.
pub(crate) fn duplicated(old: c_int, new: c_int) -> Option<Entry> {
    let e = lookup(old)?;
    insert(new, e)
}

/// The descriptors recorded for the file `file` (device and inode).
pub(crate) fn fds_of_file(file: (u64, u64)) -> Vec<c_int> {
    TABLE
        .lock()
        .iter()
        .filter(|(_, s)| s.file == file)
        .map(|(fd, _)| *fd)
        .collect()
}

/// The descriptors of SMC-R streams.
pub(crate) fn stream_fds() -> Vec<c_int> {
    TABLE
        .lock()
        .iter()
        .filter(|(_, s)| matches!(s.entry, Entry::Stream(_)))
        .map(|(fd, _)| *fd)
        .collect()
}

/// Whether the (locked) table holds a listener: a fork then needs a pidfd of the
/// forking process (lib.rs, `fork_prepare`).
pub(crate) fn has_listener(t: &BTreeMap<c_int, Slot>) -> bool {
    t.values().any(|s| matches!(s.entry, Entry::Listener(_)))
}

/// In a forked child (its fork handler, the table unlocked and this the only thread):
/// every listener entry is replaced by the child's own view of it
/// ([`crate::listen::forked`]); the parent's entries are leaked, never dropped (their
/// tasks and descriptors' owners are the parent's). Streams stay: their entries hold
/// nothing of the parent's runtime.
/// `parent`: a pidfd of the process that forked (`None` if it could not be opened).
pub(crate) fn forked(parent: Option<BorrowedFd<'_>>) {
    let mut t = TABLE.lock();
    let mut made: Vec<(*const ListenerEntry, Arc<ListenerEntry>)> = Vec::new();
    for slot in t.values_mut() {
        let Entry::Listener(old) = &slot.entry else {
            continue;
        };
        // Duplicated descriptors share one entry, and keep sharing one.
        let key = Arc::as_ptr(old);
        let new = match made.iter().find(|(k, _)| *k == key) {
            Some((_, n)) => n.clone(),
            None => {
                let n = crate::listen::forked(old, parent);
                made.push((key, n.clone()));
                n
            }
        };
        let old = std::mem::replace(&mut slot.entry, Entry::Listener(new));
        std::mem::forget(old);
    }
}
