//! Memory an RNIC may access: page-aligned, zero-initialised, shared between
//! the application and the provider.
//!
//! An RNIC writes registered memory behind the program's back (RDMA WRITE
//! arriving from the peer) while the program reads other parts of it. That
//! is why this is not a `Vec<u8>`: the bytes live in an anonymous mapping
//! that is only ever accessed through raw copies, and which part of the
//! buffer belongs to whom at any moment is decided by the protocol above
//! (for SMC-R: the producer and consumer cursors of RFC 7609 §4.3).

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

/// A page-aligned, zeroed byte buffer that can be registered as a memory
/// region. Shared with `Arc`; the mapping lives until the last reference
/// (including the provider's, held by a registered [`crate::Mr`]) is gone.
pub struct RdmaBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is plain memory with no thread affinity. All accesses go
// through raw copies whose exclusivity is the caller's protocol contract (see
// the module documentation); no references into it are ever handed out.
unsafe impl Send for RdmaBuffer {}
// SAFETY: as above; `&RdmaBuffer` only allows raw copies in and out.
unsafe impl Sync for RdmaBuffer {}

impl RdmaBuffer {
    /// Maps `len` bytes (rounded up to whole pages) of zeroed memory.
    pub fn new(len: usize) -> io::Result<Arc<RdmaBuffer>> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "RDMA buffer length must be non-zero",
            ));
        }
        let page = page_size();
        let map_len = len
            .checked_add(page - 1)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "RDMA buffer too large"))?
            & !(page - 1);
        // SAFETY: anonymous private mapping with no address hint; the result
        // is checked against MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(p as *mut u8).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Arc::new(RdmaBuffer { ptr, len }))
    }

    /// Usable length in bytes (as requested; the mapping may be larger).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: zero-length buffers cannot be created.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The virtual address of the first byte, as used in [`crate::Sge::addr`]
    /// and as the I/O virtual address of memory regions covering it.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Raw pointer to the first byte. For providers and FFI.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// True if `[offset, offset + len)` lies inside the buffer.
    pub fn contains(&self, offset: usize, len: usize) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// Copies `dst.len()` bytes starting at `offset` out of the buffer.
    ///
    /// # Panics
    /// If the range is outside the buffer (a caller bug, never peer input).
    pub fn read(&self, offset: usize, dst: &mut [u8]) {
        assert!(
            self.contains(offset, dst.len()),
            "RdmaBuffer::read out of bounds"
        );
        // SAFETY: the range was bounds-checked above; `dst` is a distinct
        // Rust allocation, so the regions do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            )
        }
    }

    /// Copies `src` into the buffer at `offset`.
    ///
    /// # Panics
    /// If the range is outside the buffer (a caller bug, never peer input).
    pub fn write(&self, offset: usize, src: &[u8]) {
        assert!(
            self.contains(offset, src.len()),
            "RdmaBuffer::write out of bounds"
        );
        // SAFETY: the range was bounds-checked above; `src` is a distinct
        // Rust allocation, so the regions do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len())
        }
    }

    /// Sets `len` bytes at `offset` to `byte`.
    ///
    /// # Panics
    /// If the range is outside the buffer.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) {
        assert!(self.contains(offset, len), "RdmaBuffer::fill out of bounds");
        // SAFETY: bounds-checked above.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(offset), byte, len) }
    }
}

impl Drop for RdmaBuffer {
    fn drop(&mut self) {
        let page = page_size();
        let map_len = (self.len + page - 1) & !(page - 1);
        // SAFETY: unmapping exactly the mapping created in `new`; no
        // references into it can outlive `self`.
        unsafe {
            libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, map_len);
        }
    }
}

impl std::fmt::Debug for RdmaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaBuffer")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .finish()
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_aligned_and_bounds_checked() {
        let b = RdmaBuffer::new(10_000).unwrap();
        assert_eq!(b.addr() % 4096, 0);
        let mut out = [1u8; 16];
        b.read(9_984, &mut out);
        assert_eq!(out, [0u8; 16]);
        b.write(100, b"hello");
        let mut got = [0u8; 5];
        b.read(100, &mut got);
        assert_eq!(&got, b"hello");
        assert!(b.contains(9_990, 10));
        assert!(!b.contains(9_991, 10));
        assert!(!b.contains(usize::MAX, 2));
        assert!(RdmaBuffer::new(0).is_err());
    }

    /// Two safe threads copying into and out of overlapping, unaligned
    /// ranges at once (what a peer's RDMA WRITE into bytes the application
    /// is reading amounts to). Every byte read comes from one of the
    /// writers; under ThreadSanitizer (`RUSTFLAGS=-Zsanitizer=thread cargo
    /// +nightly test -p smc-verbs --target x86_64-unknown-linux-gnu`) no
    /// data race is reported.
    #[test]
    fn overlapping_copies_from_threads_are_race_free() {
        let b = RdmaBuffer::new(4096).unwrap();
        std::thread::scope(|s| {
            for t in 1..=2u8 {
                let b = &b;
                s.spawn(move || {
                    let data = [t; 77];
                    // Every write covers bytes 7..80.
                    let mut out = [0u8; 73];
                    for i in 0..2000 {
                        b.write(3 + i % 5, &data);
                        b.read(7, &mut out);
                        assert!(out.iter().all(|&x| x == 1 || x == 2), "{out:?}");
                        b.fill(100, 13, t);
                    }
                });
            }
        });
    }

    #[test]
    #[should_panic]
    fn out_of_bounds_read_panics() {
        let b = RdmaBuffer::new(64).unwrap();
        let mut out = [0u8; 8];
        b.read(60, &mut out);
    }
}
