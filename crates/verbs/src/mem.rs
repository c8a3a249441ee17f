//! Memory an RNIC may access: page-aligned, zero-initialised, shared between
//! the application and the provider.
//!
//! An RNIC writes registered memory behind the program's back (an RDMA
//! WRITE arriving from a peer) while the program reads other parts of it,
//! and which part belongs to whom at any moment is decided by the protocol
//! above (for SMC-R: the producer and consumer cursors of RFC 7609 §4.3).
//! A peer need not follow that protocol, so the buffer must stay sound when
//! it does not: [`RdmaBuffer`] is `Sync` and its [`read`](RdmaBuffer::read),
//! [`write`](RdmaBuffer::write) and [`fill`](RdmaBuffer::fill) are safe and
//! may race with each other and with the provider.
//!
//! **How**: every access to the bytes goes through an atomic operation on
//! the aligned 8-byte word that holds them: relaxed loads and stores for
//! whole words, a compare-and-swap that changes only the addressed bytes
//! for the partial words at either end of a range. The provider's RDMA
//! atomics use the same words ([`RdmaBuffer::atomic_u64`]). So all accesses
//! to any byte are atomic accesses of one size at one address: there is
//! neither a data race nor a racing mixed-size access (both undefined
//! behaviour in Rust's memory model), whatever the threads and peers do.
//! What racing copies may see is a mix of old and new words (a copy is not
//! one atomic step), i.e. the same torn data a hardware RNIC's DMA would
//! give; keeping the data consistent remains the protocol's job.
//!
//! **Fast copies, same model**: on x86-64 the middle of a copy of 256 bytes or
//! more moves by inline assembly: `rep movsq` into a buffer (`copy_words`),
//! aligned 16-byte SSE2 loads out of one (`copy_blocks`). The compiler does not
//! see inside the assembly, and the hardware carries out each of those aligned
//! accesses whole (the SSE2 loads only on processors with AVX, where Intel
//! documents it; others keep the word loops), so to a buffer they are what the
//! word loops are: each aligned 8-byte word loaded or stored whole, the same
//! size at the same addresses as every other access. (`rep movsb` was a little
//! faster still, but its accesses are bytes: a peer's racing word write would
//! be a mixed-size race.)
//!
//! **Why not the alternatives**: `unsafe` copy methods whose contract is
//! "no concurrent access to these bytes" cannot be used honestly for memory
//! a peer may write at any time (an RMB registered with REMOTE_WRITE): the
//! application cannot promise what the peer does. Volatile copies are still
//! data races in Rust's memory model. A lock per buffer would serialise the
//! application against the RNIC for every packet.
//!
//! **Addresses**: a buffer has no address in the verbs API. Memory regions
//! over it are known by an I/O virtual address the provider chooses
//! ([`crate::Mr::addr`]), not by where the buffer lies in the process, so
//! that the address given to a peer reveals nothing of our address space.
//!
//! **Cost**: the compiler does not merge or vectorise atomic accesses, so a
//! word loop moves 8 bytes per load/store pair instead of a `memcpy`'s 32-64:
//! a 4 KiB copy took about 0.4 µs instead of 0.15-0.25 µs on the 2-core
//! development VM. That bounded the same-host path's bulk throughput (two
//! copies per byte, nothing else in the way), hence the copies above;
//! shorter copies and other architectures keep the word loops. The software
//! RNIC's data path is bounded by the kernel's per-datagram UDP cost, not by
//! these copies: `smc-softroce`'s `loopback_perf` (64 KiB RDMA WRITEs) ran at
//! the same throughput within its noise with the word loops as with `memcpy`
//! (best runs ≈14 Gbit/s with UDP GSO, ≈4.4 without), with ≈20-30 % more user
//! CPU (≈0.07 s per GiB, beside ≈0.3-1.5 s per GiB of kernel time).

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{
    AtomicBool, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::Arc;

/// Bytes per atomic word.
const WORD: usize = 8;

/// A page-aligned, zeroed byte buffer that can be registered as a memory
/// region. Shared with `Arc`; the mapping lives until the last reference
/// (including the provider's, held by a registered [`crate::Mr`]) is gone.
pub struct RdmaBuffer {
    /// First byte of the mapping: every access goes through this pointer,
    /// as atomic words, never through a slice of `map`.
    ptr: NonNull<u8>,
    len: usize,
    /// The mapping (memmap2), anonymous or of a shared file: unmapped when the last
    /// buffer over it drops (two buffers share one mapping after
    /// [`RdmaBuffer::map_shared_split`]).
    _map: Arc<memmap2::MmapMut>,
    /// What [`RdmaBuffer::zero_written`] has to zero.
    written: Written,
}

/// The bytes of a buffer that may be non-zero: the span `[lo, hi)` (one atomic word, so
/// that taking it and resetting it is one step) covers every write made through this
/// type since the buffer was made or last zeroed by [`RdmaBuffer::zero_written`], unless
/// `untracked` (not made with [`RdmaBuffer::new_tracked`]; or someone writes it another
/// way: a NIC's DMA, another process's mapping; or it is too large for the 32-bit
/// halves), when any byte may be.
///
/// Why: an RMB is zeroed before every reuse (RFC 7609 §4.4.1, CHECKLIST RE-3), and a
/// short connection writes a few bytes of it: zeroing all of a 256 KiB RMB, 32,768
/// word stores, was a tenth of a connection's CPU over the software RNIC (issue 15).
struct Written {
    /// `lo` in the upper 32 bits, `hi` in the lower; [`Written::EMPTY`] when nothing.
    span: AtomicU64,
    untracked: AtomicBool,
}

impl Written {
    const EMPTY: u64 = (u32::MAX as u64) << 32;

    /// Nothing written yet (fresh zeroed memory of `len` bytes), or `untracked`.
    fn new(untracked: bool, len: usize) -> Written {
        Written {
            span: AtomicU64::new(Self::EMPTY),
            untracked: AtomicBool::new(untracked || u32::try_from(len).is_err()),
        }
    }

    fn unpack(v: u64) -> (usize, usize) {
        ((v >> 32) as usize, (v & u64::from(u32::MAX)) as usize)
    }

    /// Bytes `[offset, end)` were written: called *after* the stores, as a Release
    /// read-modify-write of the span, so that a `zero_written` whose swap comes after it
    /// zeroes them (their stores happen before its own), and one whose swap came before
    /// leaves the span recorded here for the next time. Also when the span already
    /// covers them (a connection's ring after its first lap): a plain load could read
    /// the span from before a swap while the stores are still on their way, and the
    /// bytes would then be neither zeroed nor recorded. One uncontended compare-and-swap
    /// per write; nothing for untracked buffers.
    #[inline]
    fn note(&self, offset: usize, end: usize) {
        if offset >= end || self.untracked.load(Relaxed) {
            return;
        }
        // Saturated: a buffer above 4 GiB is untracked anyway.
        let (o, e) = (offset.min(u32::MAX as usize), end.min(u32::MAX as usize));
        let mut cur = self.span.load(Relaxed);
        loop {
            let (lo, hi) = Self::unpack(cur);
            let new = ((lo.min(o) as u64) << 32) | hi.max(e) as u64;
            match self.span.compare_exchange_weak(cur, new, Release, Relaxed) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }
}

// SAFETY: the buffer is plain memory with no thread affinity. Through
// `&RdmaBuffer` its bytes are reached only by atomic operations on aligned
// 8-byte words (see the module documentation), which may race between
// threads without undefined behaviour; no `&[u8]`/`&mut [u8]` into it is
// ever handed out.
unsafe impl Send for RdmaBuffer {}
// SAFETY: as above: shared access from several threads is atomic word
// access only.
unsafe impl Sync for RdmaBuffer {}

impl RdmaBuffer {
    /// Maps `len` bytes (rounded up to whole pages) of zeroed memory. Its writes are not
    /// tracked: [`RdmaBuffer::zero_written`] zeroes all of it (see
    /// [`RdmaBuffer::new_tracked`]).
    pub fn new(len: usize) -> io::Result<Arc<RdmaBuffer>> {
        Self::new_with(len, false)
    }

    /// Like [`RdmaBuffer::new`], for memory zeroed before each reuse (an RMB): the span
    /// written through its methods is tracked, so that [`RdmaBuffer::zero_written`]
    /// costs what was written. Other buffers (send buffers, never zeroed) do not pay for
    /// the tracking on every write.
    pub fn new_tracked(len: usize) -> io::Result<Arc<RdmaBuffer>> {
        Self::new_with(len, true)
    }

    fn new_with(len: usize, tracked: bool) -> io::Result<Arc<RdmaBuffer>> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "RDMA buffer length must be non-zero",
            ));
        }
        let page = rustix::param::page_size();
        let map_len = len
            .checked_add(page - 1)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "RDMA buffer too large"))?
            & !(page - 1);
        // A private anonymous mapping: page-aligned and zeroed.
        let mut map = memmap2::MmapMut::map_anon(map_len)?;
        // The raw pointer memmap2 got from mmap: no reference to the bytes
        // is created, here or later.
        let ptr =
            NonNull::new(map.as_mut_ptr()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Arc::new(RdmaBuffer {
            ptr,
            len,
            _map: Arc::new(map),
            written: Written::new(!tracked, len),
        }))
    }

    /// Maps `len` bytes at `offset` of a shared-memory file `MAP_SHARED`, for memory two
    /// processes share (smc's same-host path maps a peer's receive buffer this way). The
    /// bytes are then reached exactly as those of [`RdmaBuffer::new`]: atomic words only,
    /// so a peer writing them at any time is no data race.
    ///
    /// # Safety
    ///
    /// `offset` must be page-aligned, and `offset + len` bytes of the file must stay in
    /// place for as long as the buffer lives: a file that shrinks under a mapping makes
    /// accesses past its end raise SIGBUS. A memfd sealed with `F_SEAL_SHRINK` and at
    /// least that long keeps the promise whoever else holds it.
    pub unsafe fn map_shared<F: std::os::fd::AsRawFd>(
        file: &F,
        offset: u64,
        len: usize,
    ) -> io::Result<Arc<RdmaBuffer>> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "RDMA buffer length must be non-zero",
            ));
        }
        check_page_offset(offset)?;
        // SAFETY: the caller guarantees the file's bytes [offset, offset + len) stay
        // (module contract above); the offset is a whole number of pages (checked), so
        // the buffer starts on a page boundary of the mapping.
        let mut map = unsafe {
            memmap2::MmapOptions::new()
                .offset(offset)
                .len(len)
                .map_mut(file.as_raw_fd())?
        };
        let ptr =
            NonNull::new(map.as_mut_ptr()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Arc::new(RdmaBuffer {
            ptr,
            len,
            _map: Arc::new(map),
            // The other process writes it through its own mapping.
            written: Written::new(true, len),
        }))
    }

    /// Maps `first + second` bytes at `offset` of a shared-memory file with one `mmap`
    /// and returns two buffers over it: bytes `[0, first)` and `[first, first + second)`
    /// of the mapping. One mapping instead of two halves the `mmap`/`munmap` calls (each
    /// `munmap` of a multi-threaded process may cost a TLB shootdown on every CPU); the
    /// mapping goes when both buffers are gone.
    ///
    /// # Safety
    ///
    /// As [`RdmaBuffer::map_shared`] for `offset + first + second` bytes of the file.
    pub unsafe fn map_shared_split<F: std::os::fd::AsRawFd>(
        file: &F,
        offset: u64,
        first: usize,
        second: usize,
    ) -> io::Result<(Arc<RdmaBuffer>, Arc<RdmaBuffer>)> {
        let page = rustix::param::page_size();
        if first == 0 || second == 0 || !first.is_multiple_of(page) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "split RDMA buffer: both parts non-empty, the first whole pages",
            ));
        }
        let len = first
            .checked_add(second)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "RDMA buffer too large"))?;
        check_page_offset(offset)?;
        // SAFETY: the caller guarantees the file's bytes [offset, offset + len) stay
        // (module contract above); the offset is a whole number of pages (checked), so
        // both buffers start on page boundaries of the mapping.
        let mut map = unsafe {
            memmap2::MmapOptions::new()
                .offset(offset)
                .len(len)
                .map_mut(file.as_raw_fd())?
        };
        let base = map.as_mut_ptr();
        let ptr = NonNull::new(base).ok_or_else(|| io::Error::other("mmap returned null"))?;
        // SAFETY: `first < len`, so `base + first` lies inside the mapping just made.
        let ptr2 = NonNull::new(unsafe { base.add(first) })
            .ok_or_else(|| io::Error::other("mmap returned null"))?;
        let map = Arc::new(map);
        // The second part starts on a page boundary (`first` is whole pages) and ends
        // where the mapping does (rounded up to a page): each buffer's words lie in the
        // mapping, as `word` requires.
        Ok((
            Arc::new(RdmaBuffer {
                ptr,
                len: first,
                _map: map.clone(),
                written: Written::new(true, first),
            }),
            Arc::new(RdmaBuffer {
                ptr: ptr2,
                len: second,
                _map: map,
                written: Written::new(true, second),
            }),
        ))
    }

    /// Usable length in bytes (as requested; the mapping may be larger).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: zero-length buffers cannot be created.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Raw pointer to the first byte (page-aligned), for providers that
    /// hand the memory to hardware or FFI. Dereferencing it is `unsafe`
    /// and sound only with the contract of this module: every access from
    /// Rust code must be an atomic access to the aligned 8-byte
    /// [`AtomicU64`] word holding the bytes (accesses outside the Rust
    /// abstract machine, such as a NIC's DMA, are not constrained), and
    /// none may happen after the buffer is dropped. Whoever lets something
    /// write the bytes this way (a NIC it registers them with) calls
    /// [`RdmaBuffer::mark_untracked`] first.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Something writes this buffer other than through its methods (a NIC's DMA):
    /// [`RdmaBuffer::zero_written`] zeroes all of it from now on.
    pub fn mark_untracked(&self) {
        self.written.untracked.store(true, Relaxed);
    }

    /// Zeroes every byte that may be non-zero, leaving the whole buffer zero: the bytes
    /// written through this type since it was made or last zeroed by this method, or
    /// all of them if it is [untracked](RdmaBuffer::mark_untracked). For memory that
    /// is about to be reused (an RMB, RFC 7609 §4.4.1): it costs what the last user
    /// wrote, not the buffer's size. A write racing with it (which the protocol that
    /// reuses the memory excludes) may survive it, as it could a full `fill`, but stays
    /// recorded for the next call: no byte written through this type is ever left out
    /// for good (but see [`RdmaBuffer::atomic_u64`]).
    pub fn zero_written(&self) {
        if self.written.untracked.load(Relaxed) {
            self.fill_words(0, self.len, 0);
            return;
        }
        // Acquire: the stores of every write whose `note` came before are done.
        let (lo, hi) = Written::unpack(self.written.span.swap(Written::EMPTY, Acquire));
        let hi = hi.min(self.len);
        if lo < hi {
            self.fill_words(lo, hi - lo, 0);
        }
    }

    /// The range [`RdmaBuffer::zero_written`] would zero now (`None`: all of it).
    #[cfg(test)]
    fn written_range(&self) -> Option<std::ops::Range<usize>> {
        if self.written.untracked.load(Relaxed) {
            return None;
        }
        let (lo, hi) = Written::unpack(self.written.span.load(Relaxed));
        Some(if lo < hi { lo..hi } else { 0..0 })
    }

    /// True if `[offset, offset + len)` lies inside the buffer.
    pub fn contains(&self, offset: usize, len: usize) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// The aligned word with index `i` (bytes `8i .. 8i+8`).
    #[inline(always)]
    fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i < self.len.div_ceil(WORD));
        // SAFETY: callers pass only indices of words that hold a byte below
        // `len` (the public methods check their ranges first), and the
        // buffer starts on a page boundary of its mapping and the mapping
        // extends a whole number of pages ≥ `len` beyond it, so the word lies
        // in it; the buffer is page-aligned, so the word is 8-byte aligned; it
        // stays mapped while `&self` lives (`_map` unmaps it on drop); and
        // every access this type makes to the mapping is an atomic access to
        // such a word, so no non-atomic or differently sized access races
        // with it (`as_ptr` puts other code under the same rule).
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().cast::<u64>().add(i)) }
    }

    /// The address of word `i` (bytes `8i ..`), for [`copy_words`] and [`copy_blocks`];
    /// `i` may be one past the last word (an empty copy at the end).
    #[inline(always)]
    fn word_ptr(&self, i: usize) -> *mut u8 {
        debug_assert!(i <= self.len.div_ceil(WORD));
        self.ptr.as_ptr().wrapping_add(i * WORD)
    }

    /// Atomically replaces the bytes `at..at + bytes.len()` of word `i`,
    /// leaving its other bytes as they are (another thread may be changing
    /// them).
    #[inline]
    fn store_bytes(&self, i: usize, at: usize, bytes: &[u8]) {
        let mut mask = [0u8; WORD];
        let mut val = [0u8; WORD];
        mask[at..at + bytes.len()].fill(0xff);
        val[at..at + bytes.len()].copy_from_slice(bytes);
        let (mask, val) = (u64::from_ne_bytes(mask), u64::from_ne_bytes(val));
        let w = self.word(i);
        let mut cur = w.load(Relaxed);
        while let Err(now) = w.compare_exchange_weak(cur, (cur & !mask) | val, Relaxed, Relaxed) {
            cur = now;
        }
    }

    /// Copies `len` bytes at `src_off` of this buffer to `dst_off` of `dst` (another
    /// buffer, e.g. a peer's mapped one), word by word where both ranges share their
    /// alignment, through a small stack buffer where they do not.
    ///
    /// # Panics
    /// If either range is outside its buffer (a caller bug, never peer input).
    pub fn copy_to(&self, src_off: usize, dst: &RdmaBuffer, dst_off: usize, len: usize) {
        assert!(
            self.contains(src_off, len) && dst.contains(dst_off, len),
            "RdmaBuffer::copy_to out of bounds"
        );
        let mut bounce = [0u8; 512];
        let mut by_bounce = |s: usize, d: usize, n: usize| {
            let mut done = 0;
            while done < n {
                let k = (n - done).min(bounce.len());
                self.read(s + done, &mut bounce[..k]);
                dst.write(d + done, &bounce[..k]);
                done += k;
            }
        };
        if src_off % WORD != dst_off % WORD {
            return by_bounce(src_off, dst_off, len);
        }
        let head = ((WORD - src_off % WORD) % WORD).min(len);
        by_bounce(src_off, dst_off, head);
        let words = (len - head) / WORD;
        let (si, di) = ((src_off + head) / WORD, (dst_off + head) / WORD);
        // SAFETY: both word ranges are inside their buffers (checked above), and they do
        // not overlap: they are in different buffers (a copy within one buffer, whose
        // ranges may overlap, goes word by word).
        if words * WORD < VECTOR_COPY_MIN
            || std::ptr::eq(self, dst)
            || !unsafe { copy_words(dst.word_ptr(di), self.word_ptr(si), words) }
        {
            for k in 0..words {
                dst.word(di + k)
                    .store(self.word(si + k).load(Relaxed), Relaxed);
            }
        }
        let done = head + words * WORD;
        by_bounce(src_off + done, dst_off + done, len - done);
        // After the stores (`Written::note`); the bounced parts noted themselves.
        dst.written.note(dst_off + head, dst_off + done);
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
        let head = offset % WORD;
        let (first, rest) = if head == 0 {
            (&mut [][..], dst)
        } else {
            let n = (WORD - head).min(dst.len());
            dst.split_at_mut(n)
        };
        if !first.is_empty() {
            let w = self.word(offset / WORD).load(Relaxed).to_ne_bytes();
            first.copy_from_slice(&w[head..head + first.len()]);
        }
        let mut i = (offset + first.len()) / WORD;
        let mut rest = rest;
        if rest.len() >= VECTOR_COPY_MIN {
            if i % 2 == 1 {
                // One word to reach a 16-byte boundary of the buffer.
                let (w, r) = rest.split_at_mut(WORD);
                w.copy_from_slice(&self.word(i).load(Relaxed).to_ne_bytes());
                (rest, i) = (r, i + 1);
            }
            let blocks = rest.len() / BLOCK;
            // SAFETY: the words `i .. i + blocks * BLOCK / WORD` are inside the buffer
            // (range checked above; `i` is a word of it) and start 16-byte aligned (`i`
            // even, the buffer page-aligned); `rest` is the caller's slice, long enough.
            if unsafe { copy_blocks(rest.as_mut_ptr(), self.word_ptr(i), blocks) } {
                rest = &mut rest[blocks * BLOCK..];
                i += blocks * BLOCK / WORD;
            }
        }
        let mut chunks = rest.chunks_exact_mut(WORD);
        for c in &mut chunks {
            c.copy_from_slice(&self.word(i).load(Relaxed).to_ne_bytes());
            i += 1;
        }
        let tail = chunks.into_remainder();
        if !tail.is_empty() {
            let w = self.word(i).load(Relaxed).to_ne_bytes();
            tail.copy_from_slice(&w[..tail.len()]);
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
        let head = offset % WORD;
        let n = if head == 0 {
            0
        } else {
            (WORD - head).min(src.len())
        };
        let (first, rest) = src.split_at(n);
        if !first.is_empty() {
            self.store_bytes(offset / WORD, head, first);
        }
        let mut i = (offset + n) / WORD;
        let mut rest = rest;
        let words = rest.len() / WORD;
        // SAFETY: the words `i .. i + words` are inside the buffer (range checked above;
        // `i` is the first whole word of it), hence 8-byte aligned; `rest` holds at
        // least `words * WORD` bytes.
        if rest.len() >= VECTOR_COPY_MIN
            && unsafe { copy_words(self.word_ptr(i), rest.as_ptr(), words) }
        {
            rest = &rest[words * WORD..];
            i += words;
        }
        let mut chunks = rest.chunks_exact(WORD);
        for c in &mut chunks {
            let mut b = [0u8; WORD];
            b.copy_from_slice(c);
            self.word(i).store(u64::from_ne_bytes(b), Relaxed);
            i += 1;
        }
        let tail = chunks.remainder();
        if !tail.is_empty() {
            self.store_bytes(i, 0, tail);
        }
        // After the stores (`Written::note`).
        self.written.note(offset, offset + src.len());
    }

    /// Sets `len` bytes at `offset` to `byte`.
    ///
    /// # Panics
    /// If the range is outside the buffer.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) {
        assert!(self.contains(offset, len), "RdmaBuffer::fill out of bounds");
        self.fill_words(offset, len, byte);
        if byte != 0 {
            // After the stores (`Written::note`).
            self.written.note(offset, offset + len);
        }
    }

    /// [`RdmaBuffer::fill`] of a checked range, without noting it written.
    fn fill_words(&self, offset: usize, len: usize, byte: u8) {
        let end = offset + len;
        let pattern = [byte; WORD];
        // A partial first word, whole words in a tight loop (`zero_written` zeroes a
        // reused RMB this way, on the connection-setup path), a partial last word.
        let body = offset.next_multiple_of(WORD).min(end);
        if body > offset {
            self.store_bytes(offset / WORD, offset % WORD, &pattern[..body - offset]);
        }
        let tail = (end / WORD * WORD).max(body);
        let word = u64::from_ne_bytes(pattern);
        for i in body / WORD..tail / WORD {
            self.word(i).store(word, Relaxed);
        }
        if end > tail {
            self.store_bytes(tail / WORD, 0, &pattern[..end - tail]);
        }
    }

    /// The 8 bytes at `offset` as an atomic word, for RDMA atomics
    /// (IBA §1.11.2.3, CHECKLIST C.8: 8-byte operands, 8-byte aligned
    /// targets). `None` unless
    /// `offset` is a multiple of 8 and the word lies inside the buffer.
    pub fn atomic_u64(&self, offset: usize) -> Option<&AtomicU64> {
        (offset.is_multiple_of(WORD) && self.contains(offset, WORD)).then(|| {
            // The caller may change it: counted as written, before it does (a change
            // racing with `zero_written` may then go unrecorded; RDMA atomics need
            // REMOTE_ATOMIC, which no RMB is registered with).
            self.written.note(offset, offset + WORD);
            self.word(offset / WORD)
        })
    }
}

/// A file offset to map at must be a whole number of pages: memmap2 would round it
/// down and hand back a pointer into the page, and the buffer's words (and the 16-byte
/// loads of [`copy_blocks`]) need the page's alignment.
fn check_page_offset(offset: u64) -> io::Result<()> {
    if offset.is_multiple_of(rustix::param::page_size() as u64) {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "shared RDMA buffer: the file offset must be page-aligned",
        ))
    }
}

/// Copies at least this long (after their first partial word) move their middle with
/// the instructions below ([`copy_words`] into a buffer, [`copy_blocks`] out of one);
/// shorter ones (a CDC message, a small send) word by word.
const VECTOR_COPY_MIN: usize = 256;
/// Bytes per [`copy_blocks`] step: four 16-byte moves.
const BLOCK: usize = 64;

// Why these copies keep the module's memory model: inline assembly is opaque to the
// compiler, and what each does to a buffer is what the word loops do — every aligned
// 8-byte word of it loaded or stored whole, once, in some order: the same size at the
// same addresses as every other access, so no data race and no mixed-size race
// whatever a peer does. They are ordinary write-back accesses, ordered like `mov`s: a
// Release store after a copy (a producer cursor) follows all of its stores (string
// operations are not reordered with other stores, Intel SDM vol. 3 §9.2.4.2), an
// Acquire load before one precedes its loads. `rep movsb` was a little faster, but its
// accesses are bytes: a peer's racing word write would be a mixed-size race.
//
// Why at all: the same-host path's bulk throughput is these copies (a sender's into the
// peer's mapped RMB, a receiver's out of its own), and the word loops move 8 bytes per
// load/store pair: see the module's "Cost". Into a buffer the fast-string copy is the
// quickest (it writes whole cache lines without first reading them from the CPU that
// last read them); out of one into a slice of any alignment, it lost a quarter, and
// aligned SSE2 loads do not.

/// Copies `words` 8-byte words from `src` to `dst` with `rep movsq` (x86-64) and returns
/// true, or returns false (another architecture, or Miri) so that the caller copies
/// word by word with atomics. Architecturally each element of the string is a quadword
/// move: with `dst` a buffer's aligned words, an aligned 8-byte store, which x86-64
/// carries out atomically (Intel SDM vol. 3 §9.1.1). Fast-string operation may reorder
/// the element stores among themselves (§9.2.4.2), which relaxed stores to different
/// words allow too; that it never splits one aligned element is relied on here (the
/// manual allows only the order to vary), not separately stated.
///
/// # Safety
/// `src` readable and `dst` writable for `words * 8` bytes, not overlapping; `dst` is
/// whole words of a live [`RdmaBuffer`]; `src` is either such words too or memory the
/// caller alone accesses (a slice it holds).
#[inline]
unsafe fn copy_words(dst: *mut u8, src: *const u8, words: usize) -> bool {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        // SAFETY: the caller's promise (valid, non-overlapping ranges of `words`
        // words); the direction flag is clear on entry to inline assembly (Rust
        // reference, inline assembly rules), so the copy goes upwards; `rep movsq`
        // touches no flags and no stack.
        unsafe {
            std::arch::asm!(
                "rep movsq",
                inout("rcx") words => _,
                inout("rsi") src => _,
                inout("rdi") dst => _,
                options(nostack, preserves_flags)
            );
        }
        true
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        let _ = (dst, src, words);
        false
    }
}

/// Copies `blocks` × 64 bytes from a buffer's words at `src` (16-byte aligned) to `dst`
/// (a slice of the caller's, any alignment) with 16-byte SSE2 moves and returns true,
/// or returns false (a processor without AVX, another architecture, or Miri) so that
/// the caller copies word by word with atomics. The loads are aligned `movdqa`s, which
/// every processor that enumerates AVX carries out atomically (Intel SDM vol. 3
/// §9.1.1), so each of the buffer's words is read whole; without AVX the manual only
/// says such an access may be made of several, hence the check (cached by std).
///
/// # Safety
/// `src` readable and `dst` writable for `blocks * 64` bytes, not overlapping; `src` is
/// whole words of a live [`RdmaBuffer`] starting 16-byte aligned; `dst` is memory the
/// caller alone accesses.
#[inline]
unsafe fn copy_blocks(dst: *mut u8, src: *const u8, blocks: usize) -> bool {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        if !std::arch::is_x86_feature_detected!("avx") {
            return false;
        }
        debug_assert!((src as usize).is_multiple_of(16));
        // SAFETY: the caller's promise: `blocks` 64-byte blocks readable at `src` (16-byte
        // aligned, as `movdqa` needs) and writable at `dst`, not overlapping. Only the
        // four xmm registers named and the flags are changed; no stack.
        unsafe {
            std::arch::asm!(
                "2:",
                "test {n}, {n}",
                "jz 3f",
                "movdqa {a}, [{s}]",
                "movdqa {b}, [{s} + 16]",
                "movdqa {c}, [{s} + 32]",
                "movdqa {d}, [{s} + 48]",
                "movdqu [{t}], {a}",
                "movdqu [{t} + 16], {b}",
                "movdqu [{t} + 32], {c}",
                "movdqu [{t} + 48], {d}",
                "add {s}, 64",
                "add {t}, 64",
                "dec {n}",
                "jmp 2b",
                "3:",
                n = inout(reg) blocks => _,
                s = inout(reg) src => _,
                t = inout(reg) dst => _,
                a = out(xmm_reg) _,
                b = out(xmm_reg) _,
                c = out(xmm_reg) _,
                d = out(xmm_reg) _,
                options(nostack)
            );
        }
        true
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        let _ = (dst, src, blocks);
        false
    }
}

impl std::fmt::Debug for RdmaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // No address: it must not reach logs a peer might see, and regions
        // are known by their I/O virtual address (`Mr::addr`) anyway.
        f.debug_struct("RdmaBuffer")
            .field("len", &self.len)
            .finish()
    }
}

/// A random I/O virtual address for a memory region whose first byte has the page offset
/// of `addr` (the verbs rule of `PdOps::reg_mr`: an RToken must not reveal the process's
/// address-space layout). Page-aligned random base below 2^62, so that `iova + len` never
/// wraps; the low 12 bits kept, as hardware keeps them between address and iova.
pub fn random_iova(addr: u64) -> u64 {
    (rand::random::<u64>() & 0x3fff_ffff_ffff_f000) | (addr & 0xfff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_aligned_and_bounds_checked() {
        let b = RdmaBuffer::new(10_000).unwrap();
        assert_eq!(b.as_ptr() as usize % 4096, 0);
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

    /// One mapping, two buffers: each sees its own part of the file, the second
    /// starting at `first`; the mapping outlives the first buffer dropped.
    #[test]
    fn split_mapping_of_a_shared_file() {
        let f = tempfile_of(3 * 4096);
        // SAFETY: the file is ours, 3 pages long, and never shrinks while mapped.
        let (a, b) = unsafe { RdmaBuffer::map_shared_split(&f, 0, 4096, 2 * 4096) }.unwrap();
        assert_eq!((a.len(), b.len()), (4096, 2 * 4096));
        assert_eq!(b.as_ptr() as usize - a.as_ptr() as usize, 4096);
        a.write(4090, b"ctrl!!");
        b.write(0, b"data");
        drop(a);
        // SAFETY: as above.
        let whole = unsafe { RdmaBuffer::map_shared(&f, 0, 3 * 4096) }.unwrap();
        let mut got = [0u8; 10];
        whole.read(4090, &mut got);
        assert_eq!(&got, b"ctrl!!data");
        b.write(8188, b"end!");
        let mut e = [0u8; 4];
        whole.read(3 * 4096 - 4, &mut e);
        assert_eq!(&e, b"end!");
        // SAFETY: as above.
        let bad = unsafe { RdmaBuffer::map_shared_split(&f, 0, 100, 4096) };
        assert!(bad.is_err(), "the first part must be whole pages");
        // An offset inside a page would give a buffer that is not page-aligned (memmap2
        // rounds the offset down and points into the page).
        for off in [8u64, 100, 4096 + 16] {
            // SAFETY: as above (and nothing is mapped).
            let e = unsafe { RdmaBuffer::map_shared(&f, off, 4096) }.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "offset {off}");
            // SAFETY: as above.
            let e = unsafe { RdmaBuffer::map_shared_split(&f, off, 4096, 4096) }.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "offset {off}");
        }
        // SAFETY: as above.
        let at_page = unsafe { RdmaBuffer::map_shared(&f, 4096, 4096) }.unwrap();
        let mut d = [0u8; 4];
        at_page.read(0, &mut d);
        assert_eq!(&d, b"data");
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

    /// `zero_written` leaves the whole buffer zero after any mix of writes, fills,
    /// copies and atomics, touching only the span they wrote (a byte outside it that
    /// was non-zero would stay so: see `only_the_written_span_is_zeroed`).
    #[test]
    fn zero_written_zeroes_everything_written() {
        let b = RdmaBuffer::new_tracked(3 * 4096).unwrap();
        let src = RdmaBuffer::new(4096).unwrap();
        src.fill(0, 4096, 0xa5);
        let mut seed = 7u32;
        let mut rnd = |m: usize| {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            (seed >> 8) as usize % m
        };
        for round in 0..200 {
            for _ in 0..1 + rnd(4) {
                let off = rnd(b.len());
                let len = rnd((b.len() - off).min(300) + 1);
                match rnd(5) {
                    0 => b.write(off, &vec![0x5a; len]),
                    1 => b.fill(off, len, 1 + rnd(255) as u8),
                    2 => src.copy_to(rnd(4096 - 300), &b, off, len),
                    3 => {
                        if let Some(w) = b.atomic_u64(off & !7) {
                            w.fetch_add(3, Relaxed);
                        }
                    }
                    _ => b.fill(off, len, 0),
                }
            }
            let r = b.written_range().unwrap();
            b.zero_written();
            assert_eq!(b.written_range(), Some(0..0));
            let mut all = vec![1u8; b.len()];
            b.read(0, &mut all);
            assert!(all.iter().all(|&x| x == 0), "round {round}: written {r:?}");
        }
    }

    #[test]
    fn only_the_written_span_is_zeroed() {
        let b = RdmaBuffer::new_tracked(8192).unwrap();
        assert_eq!(b.written_range(), Some(0..0));
        b.write(100, b"abc");
        b.write(5000, b"xyz");
        assert_eq!(b.written_range(), Some(100..5003));
        b.zero_written();
        let mut got = [9u8; 3];
        b.read(5000, &mut got);
        assert_eq!(got, [0; 3]);
        // A fill with zero writes nothing that needs zeroing.
        b.fill(0, 8192, 0);
        assert_eq!(b.written_range(), Some(0..0));
        // Untracked (a NIC writes it): all of it, every time.
        b.mark_untracked();
        assert_eq!(b.written_range(), None);
        b.zero_written();
        assert_eq!(b.written_range(), None);
    }

    /// Shared mappings are written by another process: never tracked.
    #[test]
    fn shared_mappings_are_untracked() {
        let f = tempfile_of(2 * 4096);
        // SAFETY: the file is ours, 2 pages long, and never shrinks while mapped.
        let b = unsafe { RdmaBuffer::map_shared(&f, 0, 4096) }.unwrap();
        assert_eq!(b.written_range(), None);
        // SAFETY: as above.
        let (x, y) = unsafe { RdmaBuffer::map_shared_split(&f, 0, 4096, 4096) }.unwrap();
        assert_eq!((x.written_range(), y.written_range()), (None, None));
    }

    /// A file of `len` zero bytes, unlinked at once (gone with its last descriptor).
    fn tempfile_of(len: u64) -> std::fs::File {
        // Per process and thread: tests run in parallel.
        let path = std::env::temp_dir().join(format!(
            "smc-verbs-mem-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let _ = std::fs::remove_file(&path);
        f.set_len(len).unwrap();
        f
    }

    /// Copies at every alignment and length agree with a plain byte array.
    #[test]
    fn copies_at_every_alignment_match_a_model() {
        let b = RdmaBuffer::new(100).unwrap();
        let mut model = [0u8; 100];
        let mut seed = 1u32;
        for off in 0..40 {
            for len in 0..40 {
                let src: Vec<u8> = (0..len)
                    .map(|_| {
                        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                        (seed >> 16) as u8
                    })
                    .collect();
                if (off + len) % 3 == 0 {
                    b.fill(off, len, src.first().copied().unwrap_or(7));
                    model[off..off + len].fill(src.first().copied().unwrap_or(7));
                } else {
                    b.write(off, &src);
                    model[off..off + len].copy_from_slice(&src);
                }
                let mut all = [0u8; 100];
                b.read(0, &mut all);
                assert_eq!(all, model, "after write at {off} len {len}");
                let mut part = vec![0u8; len];
                b.read(off + 1, &mut part[..len.min(99 - off)]);
                assert_eq!(
                    &part[..len.min(99 - off)],
                    &model[off + 1..off + 1 + len.min(99 - off)]
                );
            }
        }
    }

    /// Copies long enough for the assembly (`copy_words`, `copy_blocks`), at every
    /// alignment of the buffer side and of the slice side, through `write`, `read` and
    /// `copy_to`, agree with a plain byte array and leave the bytes around them alone.
    #[test]
    fn long_copies_at_every_alignment_match_a_model() {
        const LEN: usize = 8192;
        let b = RdmaBuffer::new(LEN).unwrap();
        let c = RdmaBuffer::new(LEN).unwrap();
        let mut model = vec![0u8; LEN];
        let mut model_c = vec![0u8; LEN];
        let mut seed = 5u32;
        let mut src = vec![0u8; 3000];
        for off in 0..16 {
            for slice_off in 0..9 {
                for len in [255, 256, 257, 300, 511, 512, 513, 520, 1000, 2047, 2900] {
                    for x in src.iter_mut() {
                        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                        *x = (seed >> 16) as u8;
                    }
                    let at = off + 97 * slice_off;
                    let piece = &src[slice_off..slice_off + len];
                    b.write(at, piece);
                    model[at..at + len].copy_from_slice(piece);
                    let mut all = vec![0u8; LEN];
                    b.read(0, &mut all);
                    assert_eq!(all, model, "write at {at} len {len} slice +{slice_off}");
                    let mut out = vec![0u8; len + 9];
                    b.read(at, &mut out[slice_off..slice_off + len]);
                    assert_eq!(&out[slice_off..slice_off + len], piece, "read at {at}");
                    assert!(out[..slice_off].iter().all(|&x| x == 0));
                    assert!(out[slice_off + len..].iter().all(|&x| x == 0));
                    let to = 4096 + (off * 3 + slice_off) % 8 + slice_off;
                    b.copy_to(at, &c, to, len);
                    model_c[to..to + len].copy_from_slice(piece);
                    c.read(0, &mut all);
                    assert_eq!(all, model_c, "copy_to {to} from {at} len {len}");
                }
            }
        }
    }

    /// RDMA atomics (the provider) on a word while the application copies
    /// the neighbouring bytes and reads the word itself: no update is lost
    /// and no byte outside the addressed ones changes. Race-free under
    /// ThreadSanitizer (same words, same size).
    #[test]
    fn atomics_and_copies_share_words() {
        let b = RdmaBuffer::new(64).unwrap();
        assert!(b.atomic_u64(4).is_none());
        assert!(b.atomic_u64(64).is_none());
        assert!(b.atomic_u64(56).is_some());
        std::thread::scope(|s| {
            let b = &b;
            s.spawn(move || {
                for _ in 0..10_000 {
                    b.atomic_u64(8).unwrap().fetch_add(1, Relaxed);
                }
            });
            s.spawn(move || {
                let mut w = [0u8; 8];
                for i in 0..10_000u32 {
                    // Unaligned writes around word 1 (bytes 8..16).
                    b.write(3, &[0xaa; 5]);
                    b.write(16, &[(i % 251) as u8; 7]);
                    b.read(8, &mut w);
                }
            });
        });
        assert_eq!(b.atomic_u64(8).unwrap().load(Relaxed), 10_000);
        let mut all = [0u8; 24];
        b.read(0, &mut all);
        assert_eq!(&all[3..8], &[0xaa; 5]);
        assert_eq!(&all[..3], &[0; 3]);
    }

    #[test]
    #[should_panic]
    fn out_of_bounds_read_panics() {
        let b = RdmaBuffer::new(64).unwrap();
        let mut out = [0u8; 8];
        b.read(60, &mut out);
    }
}
