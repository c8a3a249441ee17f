//! Protection domains and memory regions.
//!
//! Keys: the lkey and rkey of a region are equal. The low 8 bits are a
//! random "key" byte and the upper 24 bits an index, so a deregistered
//! region's rkey does not name a later region (CHECKLIST §C.6 RK-C1 (a)),
//! and a peer cannot guess rkeys from one another.
//!
//! Addresses: a region is known by an I/O virtual address (`Mr::addr`,
//! what SGEs and peers' RETH/AtomicETH use), never by where its buffer
//! lies in the process: every registration draws a random page-aligned
//! base (plus the region's offset within its first page, so alignment is
//! kept), like `ibv_reg_mr_iova`. An SMC-R RMB address given to a peer thus
//! reveals nothing about our address space layout, and a peer cannot name
//! memory by guessing process addresses.
//!
//! Deregistration ends every access at once, including those that hold a
//! reference to the region from an earlier check (a multi-packet WRITE in
//! progress, READ responses still streaming, a saved READ for duplicate
//! replay): each access to a region's memory happens inside an
//! [`MrEntry::enter`] guard, and dropping the `Mr` marks the region dead and
//! waits for guards already inside (at most one packet's copy) to leave.
//! Once `ibv_dereg_mr` returns no byte of the region is touched again, as
//! with rxe, which re-checks the MR state for every packet.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use smc_verbs::{AccessFlags, RdmaBuffer, Result, VerbsError};

/// A registered region, shared by the MR handle, the key table and any
/// work request that refers to it.
#[derive(Debug)]
pub(crate) struct MrEntry {
    pub(crate) buf: Arc<RdmaBuffer>,
    /// Offset of the region's first byte inside `buf`.
    pub(crate) base: usize,
    pub(crate) len: usize,
    /// I/O virtual address of the first byte (random, see the module
    /// documentation).
    pub(crate) iova: u64,
    pub(crate) access: AccessFlags,
    pub(crate) pd: u32,
    pub(crate) key: u32,
    /// Accesses in progress, plus [`DEAD`] once deregistered.
    users: AtomicU32,
}

/// `MrEntry::users` bit: the region was deregistered.
const DEAD: u32 = 1 << 31;

/// An access to a live region (see [`MrEntry::enter`]). Offsets are buffer
/// offsets; every access must lie inside the region (`debug_assert`ed, so
/// the fuzz target and tests catch a check that let one out).
pub(crate) struct MrUse<'a> {
    mr: &'a MrEntry,
}

impl MrUse<'_> {
    fn check(&self, boff: usize, len: usize) {
        debug_assert!(
            boff >= self.mr.base
                && boff
                    .checked_add(len)
                    .is_some_and(|e| e <= self.mr.base + self.mr.len),
            "access [{boff}, +{len}) outside region [{}, +{})",
            self.mr.base,
            self.mr.len
        );
    }
    /// Copies out of the region at buffer offset `boff`.
    pub(crate) fn read(&self, boff: usize, out: &mut [u8]) {
        self.check(boff, out.len());
        self.mr.buf.read(boff, out);
    }
    /// Copies into the region at buffer offset `boff`.
    pub(crate) fn write(&self, boff: usize, data: &[u8]) {
        self.check(boff, data.len());
        self.mr.buf.write(boff, data);
    }
    /// The aligned 8-byte word at `boff` (None if misaligned).
    pub(crate) fn atomic(&self, boff: usize) -> Option<&AtomicU64> {
        self.check(boff, 8);
        self.mr.buf.atomic_u64(boff)
    }
}

impl Drop for MrUse<'_> {
    fn drop(&mut self) {
        self.mr.users.fetch_sub(1, Ordering::Release);
    }
}

impl MrEntry {
    /// Starts an access to the region's memory; `None` once it has been
    /// deregistered. Keep the guard only for one packet's copy.
    pub(crate) fn enter(&self) -> Option<MrUse<'_>> {
        let prev = self.users.fetch_add(1, Ordering::Acquire);
        if prev & DEAD != 0 {
            self.users.fetch_sub(1, Ordering::Release);
            return None;
        }
        Some(MrUse { mr: self })
    }

    /// Marks the region dead and waits until no access is in progress.
    fn invalidate(&self) {
        self.users.fetch_or(DEAD, Ordering::AcqRel);
        let mut spins = 0u32;
        while self.users.load(Ordering::Acquire) & !DEAD != 0 {
            // Accesses last one packet's copy: spin briefly, then yield.
            if spins < 64 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Buffer offset of `[va, va+len)` if it lies inside the region.
    pub(crate) fn range(&self, va: u64, len: u64) -> Option<usize> {
        let start = va.checked_sub(self.iova)?;
        let end = start.checked_add(len)?;
        (end <= self.len as u64).then(|| self.base + start as usize)
    }
}

/// The device's key → region table.
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
    /// A region of protection domain `pd` covering `[addr, addr+len)`: the
    /// one named by `lkey` if it does, else any of the PD (for INLINE, where
    /// lkeys are not checked, but memory of another PD must stay out of
    /// reach). Returns the buffer offset.
    pub(crate) fn find_covering(
        &self,
        pd: u32,
        lkey: u32,
        addr: u64,
        len: u64,
    ) -> Option<(Arc<MrEntry>, usize)> {
        let m = self.map.read().unwrap_or_else(|e| e.into_inner());
        if let Some(mr) = m.get(&lkey).filter(|mr| mr.pd == pd) {
            if let Some(off) = mr.range(addr, len) {
                return Some((mr.clone(), off));
            }
        }
        m.values()
            .filter(|mr| mr.pd == pd)
            .find_map(|mr| mr.range(addr, len).map(|off| (mr.clone(), off)))
    }

    /// Registers `[offset, offset+len)` of `buf` (checked by the caller)
    /// for protection domain `pd`, with a fresh key and a random I/O
    /// virtual address; at most `max` regions.
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
                users: AtomicU32::new(0),
            },
            max,
        )
    }

    /// Deregisters a region: no new lookup finds it, then no reference
    /// held from an earlier lookup may use it (see [`MrEntry::enter`]).
    pub(crate) fn deregister(&self, e: &MrEntry) {
        self.remove(e.key);
        e.invalidate();
    }

    fn insert(&self, mut e: MrEntry, max: usize) -> Result<Arc<MrEntry>> {
        let mut m = self.map.write().unwrap_or_else(|e| e.into_inner());
        if m.len() >= max {
            return Err(VerbsError::ResourceExhausted("memory regions"));
        }
        loop {
            let idx = self.next_index.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
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
    fn remove(&self, key: u32) {
        self.map
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
    }
}

/// A random 32-bit value (key bytes, I/O virtual addresses, first QPN):
/// unpredictable to peers (a CSPRNG seeded by the OS).
pub(crate) fn random_u32() -> u32 {
    rand::random()
}
