//! Protection domains and memory regions. An iWARP STag is our rkey (RFC 5040 §2.1: "STag:
//! the identifier of a tagged buffer"); lkey = rkey. The upper 24 bits are an index, the
//! low 8 bits a random key byte, so a deregistered region's STag does not name a later
//! region and STags cannot be guessed from one another.
//!
//! All reads and writes of registered memory go through [`MrEntry::fetch`] and
//! [`MrEntry::place`], the only two call sites that touch `RdmaBuffer`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};

use smc_verbs::{AccessFlags, RdmaBuffer, Result, VerbsError};

/// A registered region.
#[derive(Debug)]
pub(crate) struct MrEntry {
    buf: Arc<RdmaBuffer>,
    base: usize,
    pub(crate) len: usize,
    pub(crate) iova: u64,
    pub(crate) access: AccessFlags,
    pub(crate) pd: u32,
    pub(crate) key: u32,
}

impl MrEntry {
    /// Region offset of `[va, va+len)` if it lies inside the region.
    pub(crate) fn offset_of(&self, va: u64, len: u64) -> Option<usize> {
        let start = va.checked_sub(self.iova)?;
        let end = start.checked_add(len)?;
        (end <= self.len as u64).then_some(start as usize)
    }
    /// Copies region bytes `[off, off + dst.len())` out (bounds checked by the caller via
    /// [`MrEntry::offset_of`]).
    pub(crate) fn fetch(&self, off: usize, dst: &mut [u8]) {
        self.buf.read(self.base + off, dst)
    }
    /// The buffer the region lies in (for the MR handle; data moves through
    /// [`MrEntry::fetch`] and [`MrEntry::place`]).
    pub(crate) fn buffer(&self) -> &Arc<RdmaBuffer> {
        &self.buf
    }
    /// Copies `src` into the region at `off`.
    pub(crate) fn place(&self, off: usize, src: &[u8]) {
        self.buf.write(self.base + off, src)
    }
}

/// The device's STag → region table.
#[derive(Default)]
pub(crate) struct MrTable {
    map: RwLock<HashMap<u32, Arc<MrEntry>>>,
    next_index: AtomicU32,
}

impl MrTable {
    pub(crate) fn lookup(&self, key: u32) -> Option<Arc<MrEntry>> {
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned()
    }
    /// Registers `[offset, offset+len)` of `buf` (checked by the caller) for protection
    /// domain `pd`, with a fresh STag and a random I/O virtual address; at most `max`
    /// regions.
    pub(crate) fn register(
        &self,
        buf: Arc<RdmaBuffer>,
        offset: usize,
        len: usize,
        access: AccessFlags,
        pd: u32,
        max: usize,
    ) -> Result<Arc<MrEntry>> {
        self.insert(
            MrEntry {
                iova: smc_verbs::random_iova(offset as u64),
                buf,
                base: offset,
                len,
                access,
                pd,
                key: 0,
            },
            max,
        )
    }

    fn insert(&self, mut e: MrEntry, max: usize) -> Result<Arc<MrEntry>> {
        let mut m = self.map.write().unwrap_or_else(|e| e.into_inner());
        if m.len() >= max {
            return Err(VerbsError::ResourceExhausted("memory regions"));
        }
        loop {
            let idx = self.next_index.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
            // STag 0 is never a region: the RTR messages use it (CHECKLIST AMB-M4).
            let key = (idx << 8) | (random_u32() & 0xff);
            if key != 0 && !m.contains_key(&key) {
                e.key = key;
                break;
            }
        }
        let e = Arc::new(e);
        m.insert(e.key, e.clone());
        Ok(e)
    }
    /// Deregisters the region with STag `key`.
    pub(crate) fn remove(&self, key: u32) {
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
    }
}

/// A random 32-bit value (STag key bytes, first QPN).
pub(crate) fn random_u32() -> u32 {
    rand::random()
}
