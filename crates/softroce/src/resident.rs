//! Memory the receive and transmit paths write is made resident before
//! they run, so that they never take a first-touch page fault.
//!
//! Why: a fault on anonymous memory never touched before allocates a page,
//! and when the kernel cannot do that under the lock of the faulting
//! mapping alone (the first fault of a new mapping, or a mapping being
//! changed) it takes the process's mmap lock, which every `mmap`, `munmap`,
//! `mprotect` and thread creation of the application holds for writing. An
//! application that starts a hundred threads and allocates gigabytes just
//! as its transfers begin (`hundred_connections_fail_over_at_once` in
//! `crates/smc/tests/multilink.rs`) queues such faults behind each other for
//! over a second on a busy two-core VM. A device receives on one thread at
//! a time (`Engine::drain_rx`), so a receiver stuck in that queue stops
//! every QP of the device: no ACK gets in, and after `retry_cnt` + 1 local
//! ACK timeouts without progress (8 × 134 ms on SMC-R links) a QP fails
//! with RetryExcErr although nothing was lost (CHECKLIST RTY-1).
//! Hardware never faults there: `ibv_reg_mr` pins a region's pages (rxe:
//! `ib_umem_get`), and a NIC's rings are kernel memory.
//!
//! So the device's receive and transmit batches are touched when they are
//! allocated ([`zeroed`]), and a memory region a peer writes into
//! (registered with REMOTE_WRITE, SMC-R's RMBs) is populated when it is
//! registered ([`populate`]): RDMA WRITE data is then placed into pages that
//! are already there. Other regions (send buffers, which the application
//! fills first; a link's receive slots, of which a CDC touches one page) fault
//! in as they are used, so that an idle connection does not pay for them
//! (`tests/system/smc-scale.sh` counts memory per connection).

use std::hint::black_box;
use std::sync::atomic::Ordering::Relaxed;

use smc_verbs::RdmaBuffer;

/// Distance between touches: the smallest page size Linux uses (a larger
/// page is just touched more than once).
const PAGE: usize = 4096;

/// Writes a zero into every page of `buf` (first and last byte included,
/// at most [`PAGE`] apart, so that no page is skipped). The value stored
/// is opaque to the compiler (`black_box`), so the stores are not elided
/// as writes of zero into zeroed memory.
pub(crate) fn touch(buf: &mut [u8]) {
    let Some(last) = buf.len().checked_sub(1) else {
        return;
    };
    for i in (0..buf.len()).step_by(PAGE) {
        buf[i] = black_box(0);
    }
    buf[last] = black_box(0);
}

/// `len` zero bytes, every page of them resident.
pub(crate) fn zeroed(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    touch(&mut v);
    v
}

/// Faults in, writable, the pages of `buf` that hold `[offset, offset +
/// len)`, without changing a byte (what `ibv_reg_mr`'s pinning does for
/// rxe). Best effort: a region that cannot be populated still works, its
/// pages are then faulted in when first used.
pub(crate) fn populate(buf: &RdmaBuffer, offset: usize, len: usize) {
    if len == 0 || !buf.contains(offset, len) {
        return;
    }
    // The buffer's mapping starts page-aligned (smc_verbs::RdmaBuffer) and
    // ends on a page boundary: the page-aligned span holding the range lies
    // inside it.
    let start = offset & !(PAGE - 1);
    let end = (offset + len).div_ceil(PAGE) * PAGE;
    let ptr = buf.as_ptr().wrapping_add(start).cast::<std::ffi::c_void>();
    // SAFETY: MADV_POPULATE_WRITE only faults in the pages of
    // `[ptr, ptr + end - start)`, which lie inside the buffer's own live
    // mapping (`buf` is borrowed for the call); it reads and writes none of
    // their bytes, so the buffer's atomic-access contract is kept.
    let r =
        unsafe { rustix::mm::madvise(ptr, end - start, rustix::mm::Advice::LinuxPopulateWrite) };
    if r == Err(rustix::io::Errno::INVAL) {
        // A kernel before Linux 5.14 does not know the advice: a write to
        // each page does the same. An atomic compare-exchange of a word
        // with its own value is a write that changes nothing, whatever
        // the peer or the application do to the word meanwhile.
        let mut off = offset & !7;
        while off < offset + len {
            if let Some(w) = buf.atomic_u64(off) {
                let v = w.load(Relaxed);
                let _ = w.compare_exchange(v, v, Relaxed, Relaxed);
            }
            off = (off + PAGE) & !(PAGE - 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resident pages of `buf`, from mincore(2).
    fn resident_pages(ptr: *const u8, len: usize) -> usize {
        let pages = len.div_ceil(PAGE);
        let mut vec = vec![0u8; pages];
        // SAFETY: mincore reads the page table state of a range of our own
        // live mapping and writes one byte per page into `vec`.
        let r = unsafe { libc::mincore(ptr as *mut libc::c_void, len, vec.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|b| *b & 1 != 0).count()
    }

    #[test]
    fn touch_reaches_every_page_of_any_span() {
        for len in [1, 7, PAGE - 1, PAGE, PAGE + 1, 3 * PAGE + 5] {
            let mut v = vec![1u8; len];
            touch(&mut v);
            for (i, b) in v.iter().enumerate() {
                // Only bytes at page steps and the last one were written.
                let touched = i % PAGE == 0 || i == len - 1;
                assert_eq!(*b, if touched { 0 } else { 1 }, "len {len} byte {i}");
            }
        }
        touch(&mut []);
    }

    #[test]
    fn touched_memory_is_resident() {
        // Above glibc's largest mmap threshold (32 MiB): a fresh mapping,
        // nothing of it resident before it is touched.
        let len = 40 << 20;
        let mut v = vec![0u8; len];
        // The allocation need not be page-aligned: count whole pages inside.
        let head = v.as_ptr().align_offset(PAGE);
        let whole = (len - head) / PAGE * PAGE;
        let before = resident_pages(v[head..].as_ptr(), whole);
        assert!(before < whole / PAGE / 2, "fresh: {before} pages resident");
        touch(&mut v);
        let after = resident_pages(v[head..].as_ptr(), whole);
        assert_eq!(after, whole / PAGE, "every page resident");
        let z = zeroed(3 * PAGE + 1);
        assert!(z.len() == 3 * PAGE + 1 && z.iter().all(|b| *b == 0));
    }

    #[test]
    fn populate_makes_a_region_resident_and_keeps_its_bytes() {
        let len = 256 * PAGE;
        let buf = RdmaBuffer::new(len).unwrap();
        buf.write(5 * PAGE + 3, b"kept");
        let before = resident_pages(buf.as_ptr(), len);
        assert!(before < 10, "a fresh mapping is not resident ({before})");
        // A region from the middle of one page to the middle of another.
        populate(&buf, 10 * PAGE + 100, 100 * PAGE);
        let in_region = resident_pages(buf.as_ptr().wrapping_add(10 * PAGE), 101 * PAGE);
        assert_eq!(in_region, 101, "every page of the region resident");
        let mut got = [0u8; 4];
        buf.read(5 * PAGE + 3, &mut got);
        assert_eq!(&got, b"kept");
        let mut zero = [1u8; 64];
        buf.read(60 * PAGE, &mut zero);
        assert_eq!(zero, [0u8; 64], "populated memory reads as zero");
        // Out-of-range or empty regions are ignored.
        populate(&buf, len, 1);
        populate(&buf, 0, 0);
    }
}
