//! Reading CLC messages from the TCP byte stream by exact length.
//!
//! Like Linux (`smc_clc_wait_msg`: peek the 8-byte header, then read `length` bytes), the
//! reader never takes a byte beyond the end of the message it is reading, so application
//! data that follows a Decline stays in the stream for the application (RFC 7609 C.6,
//! CHECKLIST FB-11). It also judges the header as soon as it is complete: a bad eye
//! catcher, an unknown type or a length outside the type's range is a protocol error
//! (RFC 7609 C.6 "treated as application data"), reported before any more is read.
//!
//! The version nibble is not judged here: a reserved version (0) is a reserved
//! enumerated value, which calls for a Decline *after* the whole message was consumed.

use smc_wire::clc::{field, ClcType, Eyecatcher};
use smc_wire::Error as WireError;

/// Progress of one [`ClcReader::push`].
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// Everything given was consumed; the message is not complete.
    More,
    /// The header just became complete and is well-formed: this is its type.
    Header(ClcType),
    /// The header is not a CLC header (PE-RST).
    BadHeader(WireError),
    /// A whole message (header to trailer).
    Complete(Vec<u8>),
}

/// Accumulates one CLC message at a time.
#[derive(Debug, Default)]
pub struct ClcReader {
    buf: Vec<u8>,
    total: Option<usize>,
}

impl ClcReader {
    /// Bytes still needed to complete the header or the message (never 0).
    pub fn wanted(&self) -> usize {
        match self.total {
            None => field::HEADER_LEN - self.buf.len(),
            Some(t) => t - self.buf.len(),
        }
    }

    /// Takes up to [`Self::wanted`] bytes; returns how many were taken and the progress.
    /// True between messages (no partial message buffered).
    pub fn is_idle(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn push(&mut self, bytes: &[u8]) -> (usize, Read) {
        let n = bytes.len().min(self.wanted());
        self.buf.extend_from_slice(&bytes[..n]);
        if self.total.is_none() && self.buf.len() == field::HEADER_LEN {
            match check_header(&self.buf) {
                Ok((ty, len)) => {
                    self.total = Some(len);
                    return (n, Read::Header(ty));
                }
                Err(e) => return (n, Read::BadHeader(e)),
            }
        }
        if Some(self.buf.len()) == self.total {
            self.total = None;
            return (n, Read::Complete(std::mem::take(&mut self.buf)));
        }
        (n, Read::More)
    }
}

/// Eye catcher, type and length range of an 8-byte header (version not judged).
fn check_header(h: &[u8]) -> Result<(ClcType, usize), WireError> {
    Eyecatcher::from_bytes([h[0], h[1], h[2], h[3]], "header")?;
    let ty = ClcType::from_u8(h[field::TYPE])?;
    let len = usize::from(u16::from_be_bytes([h[field::LENGTH], h[field::LENGTH + 1]]));
    let (min, max) = ty.length_range();
    if len < min || len > max {
        return Err(WireError::CountOutOfRange {
            field: "CLC length",
            value: len,
            min,
            max,
        });
    }
    Ok((ty, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DECLINE: [u8; 28] = [
        0xE2, 0xD4, 0xC3, 0xD9, 4, 0, 28, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 3, 3, 0, 0, 0, 0, 0, 0,
        0xE2, 0xD4, 0xC3, 0xD9,
    ];

    #[test]
    fn exact_length_one_byte_at_a_time() {
        let mut r = ClcReader::default();
        let mut stream = DECLINE.to_vec();
        stream.extend_from_slice(b"GET /");
        let mut got = None;
        let mut i = 0;
        while got.is_none() {
            let (n, res) = r.push(&stream[i..i + 1]);
            i += n;
            match res {
                Read::Complete(m) => got = Some(m),
                Read::Header(t) => assert_eq!(t, ClcType::Decline),
                Read::More => {}
                Read::BadHeader(e) => panic!("{e}"),
            }
        }
        assert_eq!(got.unwrap(), DECLINE);
        assert_eq!(
            &stream[i..],
            b"GET /",
            "application data left in the stream"
        );
        assert_eq!(r.wanted(), 8, "ready for the next message");
    }

    #[test]
    fn bad_headers_are_reported_at_once() {
        for (i, v) in [(0usize, 0u8), (4, 5), (6, 27)] {
            let mut b = DECLINE;
            b[i] = v;
            let mut r = ClcReader::default();
            let (n, res) = r.push(&b);
            assert_eq!(n, 8, "nothing beyond the header is taken");
            assert!(matches!(res, Read::BadHeader(_)), "{i}: {res:?}");
        }
        // Version 0 is not a framing error.
        let mut b = DECLINE;
        b[7] = 0;
        let mut r = ClcReader::default();
        assert_eq!(r.push(&b), (8, Read::Header(ClcType::Decline)));
        assert!(matches!(r.push(&b[8..]), (20, Read::Complete(_))));
    }
}
