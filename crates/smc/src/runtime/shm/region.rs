//! The shared memory of one same-host connection direction: a sealed memfd holding a
//! control page (the CDC ring and the wake-up words) and the receiver's RMB, and the
//! ring protocol over it (docs/samehost.md "Memory layout").
//!
//! Each side creates the region it *receives* into and passes the memfd to its peer,
//! which maps it and writes data into the RMB and CDCs into the ring, exactly as an RNIC
//! would place RDMA WRITEs and a SEND (RFC 7609 §4.7.1: data before the CDC that
//! announces it). Both processes map the whole region read-write, so a peer can write
//! anything anywhere in it at any time; every value read from it is treated as peer
//! input: ring indices are checked against our own counters, CDCs are parsed and go
//! through the connection machine's cursor validation (`Conn::handle_cdc`), and all
//! accesses are atomic words ([`RdmaBuffer`]), so a scribbling peer can corrupt only
//! this connection's bytes and end only this connection.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;

use rustix::fs::{MemfdFlags, SealFlags};
use smc_verbs::RdmaBuffer;

/// Bytes of the control page (the data area starts after it, page-aligned).
pub(crate) const CTRL_LEN: usize = 4096;
/// CDCs published by the writer (the peer of the region's owner), ever.
const HEAD: usize = 0;
/// CDCs consumed by the owner, ever.
const TAIL: usize = 8;
/// Threads of the owner polling the ring now (inside a read or write call and not
/// asleep, `api::samehost::Polling`): the writer need not ring the bell.
const POLLING: usize = 16;
/// The writer found the ring full and waits for the owner to ring its bell.
const TX_WAIT: usize = 24;
/// First CDC slot.
const SLOTS: usize = 64;
/// Bytes per slot (a 44-byte CDC, padded to whole words).
const SLOT_LEN: usize = 48;
/// Slots in the ring. The connection machine sends a CDC per write or window update;
/// 64 covers any window of a 1 MiB RMB in 16 KiB writes before the writer must wait.
pub(crate) const NSLOTS: u64 = 64;
/// Largest RMB a peer may offer (the CLC's largest, RFC 7609 A.2.3 / RmbeGeometry).
pub(crate) const MAX_RMB: u32 = 512 << 20;
/// Smallest RMB a peer may offer (RFC 7609 A.2.3: 16 KiB).
pub(crate) const MIN_RMB: u32 = 16 << 10;

const _: () = assert!(SLOTS + SLOT_LEN * NSLOTS as usize <= CTRL_LEN);

/// A peer broke the ring protocol (its indices make no sense).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RingError {
    /// The peer's head is behind our tail or more than the ring ahead of it.
    #[error("same-host ring: peer's head index out of range")]
    BadHead,
    /// The peer's tail is ahead of what we published or more than the ring behind.
    #[error("same-host ring: peer's tail index out of range")]
    BadTail,
}

/// A mapped region: its control page and its data area (the RMB).
#[derive(Clone)]
pub(crate) struct Region {
    pub ctrl: Arc<RdmaBuffer>,
    pub data: Arc<RdmaBuffer>,
}

impl Region {
    /// A new region of our own for an RMB of `rmb_len` bytes: the memfd (to send to the
    /// peer, then close) and our mappings. Sealed before anyone else sees it, so the
    /// peer cannot shrink it under our mappings (SIGBUS) or grow it.
    pub(crate) fn create(rmb_len: u32) -> io::Result<(Region, OwnedFd)> {
        let fd = rustix::fs::memfd_create(
            "smc-rs-samehost",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        rustix::fs::ftruncate(&fd, (CTRL_LEN + rmb_len as usize) as u64)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let r = Region::map(&fd, rmb_len)?;
        Ok((r, fd))
    }

    /// Maps a peer's region after checking that it cannot shrink and holds a control
    /// page and `rmb_len` bytes (a value the peer told us: bounded first).
    pub(crate) fn map_peer(fd: &OwnedFd, rmb_len: u32) -> io::Result<Region> {
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
        if !(MIN_RMB..=MAX_RMB).contains(&rmb_len) || !(rmb_len as usize).is_multiple_of(CTRL_LEN) {
            return Err(bad("peer's RMB size out of range"));
        }
        let seals = rustix::fs::fcntl_get_seals(fd)?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::SEAL) {
            return Err(bad("peer's memfd is not sealed against shrinking"));
        }
        let st = rustix::fs::fstat(fd)?;
        if (st.st_size as u64) < (CTRL_LEN + rmb_len as usize) as u64 {
            return Err(bad("peer's memfd is shorter than it says"));
        }
        Region::map(fd, rmb_len)
    }

    fn map(fd: &impl AsFd, rmb_len: u32) -> io::Result<Region> {
        let fd = fd.as_fd();
        // SAFETY: the memfd is sealed against shrinking (our own, sealed in `create`, or
        // a peer's, checked in `map_peer`) and at least CTRL_LEN + rmb_len long, so the
        // mapping stays backed for its whole life; CTRL_LEN is a whole page. One mapping
        // for both (the control page and the RMB follow each other in the file).
        let (ctrl, data) =
            unsafe { RdmaBuffer::map_shared_split(&fd, 0, CTRL_LEN, rmb_len as usize)? };
        Ok(Region { ctrl, data })
    }
}

fn word(b: &RdmaBuffer, off: usize) -> &AtomicU64 {
    // The control page is CTRL_LEN bytes and every offset used is a constant below it.
    b.atomic_u64(off)
        .expect("control word inside the control page")
}

/// Our end of the ring we receive on (in our own region).
pub(crate) struct RxRing {
    pub ctrl: Arc<RdmaBuffer>,
    /// CDCs consumed (our own count; the shared TAIL is only a copy for the writer).
    pub tail: u64,
}

impl RxRing {
    /// A CDC is waiting (a cheap look, for spinning).
    pub(crate) fn pending(ctrl: &RdmaBuffer, tail: u64) -> bool {
        word(ctrl, HEAD).load(Ordering::Acquire) != tail
    }

    /// Takes every CDC published so far, in order, into `f` (bytes as the peer wrote
    /// them). Returns whether the writer waits for room (ring its bell).
    pub(crate) fn drain(&mut self, mut f: impl FnMut(&[u8; 44])) -> Result<bool, RingError> {
        let head = word(&self.ctrl, HEAD).load(Ordering::Acquire);
        let n = head.wrapping_sub(self.tail);
        if n > NSLOTS {
            return Err(RingError::BadHead);
        }
        let mut b = [0u8; 44];
        for _ in 0..n {
            let off = SLOTS + (self.tail % NSLOTS) as usize * SLOT_LEN;
            self.ctrl.read(off, &mut b);
            f(&b);
            self.tail += 1;
        }
        if n > 0 {
            word(&self.ctrl, TAIL).store(self.tail, Ordering::Release);
        }
        // Pairs with the writer's fence between setting TX_WAIT and re-reading TAIL.
        fence(Ordering::SeqCst);
        Ok(word(&self.ctrl, TX_WAIT).swap(0, Ordering::AcqRel) != 0)
    }

    /// A thread of ours starts (`+1`) or stops (`-1`) polling this ring.
    pub(crate) fn polling(ctrl: &RdmaBuffer, start: bool) {
        let w = word(ctrl, POLLING);
        if start {
            w.fetch_add(1, Ordering::SeqCst);
        } else {
            w.fetch_sub(1, Ordering::SeqCst);
        }
        fence(Ordering::SeqCst);
    }
}

/// Our end of the ring we send on (in the peer's region).
pub(crate) struct TxRing {
    pub ctrl: Arc<RdmaBuffer>,
    /// CDCs published (our own count).
    pub head: u64,
}

impl TxRing {
    /// Is there a free slot? When not, asks the peer to ring our bell when it consumed.
    pub(crate) fn has_room(&self) -> Result<bool, RingError> {
        let tail = word(&self.ctrl, TAIL).load(Ordering::Acquire);
        let used = self.head.wrapping_sub(tail);
        if used > NSLOTS {
            return Err(RingError::BadTail);
        }
        if used < NSLOTS {
            return Ok(true);
        }
        word(&self.ctrl, TX_WAIT).store(1, Ordering::SeqCst);
        // Pairs with the reader's fence between storing TAIL and reading TX_WAIT.
        fence(Ordering::SeqCst);
        let tail = word(&self.ctrl, TAIL).load(Ordering::Acquire);
        Ok(self.head.wrapping_sub(tail) < NSLOTS)
    }

    /// Publishes a CDC (after [`Self::has_room`] said yes). Returns whether the peer
    /// sleeps (no thread of it polls the ring): then ring its bell.
    pub(crate) fn publish(&mut self, cdc: &[u8; 44]) -> bool {
        let off = SLOTS + (self.head % NSLOTS) as usize * SLOT_LEN;
        self.ctrl.write(off, cdc);
        self.head += 1;
        // Release: the data written into the RMB and the slot before are visible to
        // whoever sees the new head (the RC ordering of RFC 7609 §4.7.1).
        word(&self.ctrl, HEAD).store(self.head, Ordering::Release);
        // Pairs with the reader's fence after announcing it polls.
        fence(Ordering::SeqCst);
        word(&self.ctrl, POLLING).load(Ordering::SeqCst) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_in_order_with_back_pressure_and_scribbles() {
        let (r, fd) = Region::create(MIN_RMB).unwrap();
        let peer = Region::map_peer(&fd, MIN_RMB).unwrap();
        let mut tx = TxRing {
            ctrl: peer.ctrl.clone(),
            head: 0,
        };
        let mut rx = RxRing {
            ctrl: r.ctrl.clone(),
            tail: 0,
        };
        for i in 0..NSLOTS {
            assert!(tx.has_room().unwrap());
            assert!(tx.publish(&[i as u8; 44]), "nobody polls: ring");
        }
        assert!(!tx.has_room().unwrap(), "full");
        let mut got = Vec::new();
        let wake = rx.drain(|c| got.push(c[0])).unwrap();
        assert!(wake, "the writer asked to be woken");
        assert_eq!(got, (0..NSLOTS as u8).collect::<Vec<_>>());
        assert!(tx.has_room().unwrap());
        RxRing::polling(&r.ctrl, true);
        assert!(!tx.publish(&[9; 44]), "a poller: no bell");
        RxRing::polling(&r.ctrl, false);
        // The data area is shared too.
        peer.data.write(100, b"hello");
        let mut b = [0u8; 5];
        r.data.read(100, &mut b);
        assert_eq!(&b, b"hello");
        // A peer that scribbles on the indices ends the connection, nothing else.
        word(&r.ctrl, HEAD).store(u64::MAX, Ordering::SeqCst);
        assert_eq!(rx.drain(|_| {}), Err(RingError::BadHead));
        word(&peer.ctrl, TAIL).store(1 << 40, Ordering::SeqCst);
        assert_eq!(tx.has_room(), Err(RingError::BadTail));
    }

    #[test]
    fn unsealed_or_short_memfds_are_refused() {
        let fd =
            rustix::fs::memfd_create("x", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&fd, (CTRL_LEN + MIN_RMB as usize) as u64).unwrap();
        assert!(Region::map_peer(&fd, MIN_RMB).is_err(), "not sealed");
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::SEAL).unwrap();
        assert!(Region::map_peer(&fd, MIN_RMB).is_ok());
        assert!(
            Region::map_peer(&fd, MIN_RMB * 2).is_err(),
            "shorter than claimed"
        );
        assert!(Region::map_peer(&fd, 1000).is_err(), "size out of range");
    }
}
