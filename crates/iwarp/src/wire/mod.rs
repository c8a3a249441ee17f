//! Byte layouts of iWARP, in the style of `smc-wire` (typed views + `Repr`s, no I/O, no
//! allocation, never a panic on input):
//!
//! | module | what | spec |
//! |---|---|---|
//! | [`mpa`] | MPA Request/Reply frames, the RFC 6581 enhanced data word, FPDU framing + CRC32c | RFC 5044 §7, §4; RFC 6581 §6, §9 |
//! | [`ddp`] | DDP tagged/untagged headers with the RDMAP control byte, Read Request, Terminate | RFC 5041 §4; RFC 5040 §4 |
//! | [`sctp`] | DDP over SCTP: PPIDs, DDP Stream Session Control messages with the enhanced function codes | RFC 5043 §5; RFC 6581 §7 |

pub mod ddp;
pub mod mpa;
pub mod sctp;

/// Why bytes did not parse (or a value could not be emitted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The buffer is shorter than the layout needs.
    #[error("{what}: truncated ({have} of {need} bytes)")]
    Truncated {
        /// Which structure.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// A field holds a value the specification forbids.
    #[error("{field}: invalid value {value:#x}")]
    Invalid {
        /// Which field.
        field: &'static str,
        /// The value found.
        value: u64,
    },
    /// The output buffer is too small for `emit`.
    #[error("output buffer too small ({have} of {need} bytes)")]
    NoRoom {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
}

/// Result of the codecs.
pub type Result<T> = core::result::Result<T, WireError>;

pub(crate) fn check(what: &'static str, buf: &[u8], need: usize) -> Result<()> {
    if buf.len() < need {
        Err(WireError::Truncated {
            what,
            need,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}

pub(crate) fn room(buf: &[u8], need: usize) -> Result<()> {
    if buf.len() < need {
        Err(WireError::NoRoom {
            need,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}

#[inline]
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
#[inline]
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
#[inline]
pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}
#[inline]
pub(crate) fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}
#[inline]
pub(crate) fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
#[inline]
pub(crate) fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}
