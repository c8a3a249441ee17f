//! The SMC-R TCP option (RFC 7609 §3.1, A.1; RFC 6994 shared experimental option):
//! kind 254, length 6, ExID `E2 D4 C3 D9`, sent in SYN and SYN-ACK only.

use crate::common::EYECATCHER_SMCR;
use crate::error::{check_out, Error, Result};

/// TCP option kind for RFC 6994 experiments (RFC 4727 "experiment 2").
pub const KIND: u8 = 254;
/// Option length of the SMC-R option.
pub const LEN: u8 = 6;
/// ExID of SMC-R ("SMCR" in EBCDIC).
pub const EXID: [u8; 4] = EYECATCHER_SMCR;
/// The 8-byte form Linux puts in a SYN: NOP, NOP, then the option (4-byte aligned).
pub const ALIGNED: [u8; 8] = [1, 1, KIND, LEN, 0xE2, 0xD4, 0xC3, 0xD9];

/// Outcome of scanning a TCP options block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// The SMC-R option is present at this offset of the options block.
    Found(usize),
    /// The options block is well formed and has no SMC-R option.
    Absent,
}

/// Scans a TCP options block (the bytes after the 20-byte TCP header) for the SMC-R option.
///
/// Every option is examined, not only the first kind 254, because kind 254 carries other
/// experiments too (dispatch on ExID, CHECKLIST A.1). A kind 254 option whose length is not
/// 6 is not the SMC-R option (AMB-04). A malformed block (an option length < 2 or running
/// past the end) ends the scan with an error unless the SMC-R option was already found;
/// receivers treat that as "option absent".
pub fn scan(options: &[u8]) -> Result<Scan> {
    let mut i = 0;
    while i < options.len() {
        match options[i] {
            0 => return Ok(Scan::Absent), // End of option list.
            1 => i += 1,                  // NOP.
            kind => {
                let Some(&len) = options.get(i + 1) else {
                    return Err(Error::Truncated {
                        what: "TCP option length",
                        need: i + 2,
                        have: options.len(),
                    });
                };
                let len = usize::from(len);
                if len < 2 {
                    return Err(Error::CountOutOfRange {
                        field: "TCP option length",
                        value: len,
                        min: 2,
                        max: 40,
                    });
                }
                if i + len > options.len() {
                    return Err(Error::Truncated {
                        what: "TCP option",
                        need: i + len,
                        have: options.len(),
                    });
                }
                if kind == KIND && len == usize::from(LEN) && options[i + 2..i + 6] == EXID {
                    return Ok(Scan::Found(i));
                }
                i += len;
            }
        }
    }
    Ok(Scan::Absent)
}

/// Whether the options block carries the SMC-R option (malformed blocks count as "no").
pub fn has_smc_option(options: &[u8]) -> bool {
    matches!(scan(options), Ok(Scan::Found(_)))
}

/// Writes the aligned 8-byte form (NOP, NOP, kind, len, ExID); returns 8.
pub fn emit_aligned(buf: &mut [u8]) -> Result<usize> {
    check_out(buf, ALIGNED.len())?;
    buf[..8].copy_from_slice(&ALIGNED);
    Ok(8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_linux_syn_option() {
        // MSS, SACK_PERM, TS, NOP, WS, NOP, NOP, SMC (as in k612-pair frame 8).
        let mut opts = vec![
            2, 4, 5, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 6,
        ];
        let at = opts.len() + 2;
        opts.extend_from_slice(&ALIGNED);
        assert_eq!(scan(&opts), Ok(Scan::Found(at)));
        assert!(has_smc_option(&opts));
    }

    #[test]
    fn other_experiments_and_lengths_are_skipped() {
        // Another kind-254 experiment first, then a kind 254 with the SMC ExID but length 8.
        let opts = [
            254, 4, 0x12, 0x34, 254, 8, 0xE2, 0xD4, 0xC3, 0xD9, 0, 0, 1, 1, 254, 6, 0xE2, 0xD4,
            0xC3, 0xD9,
        ];
        assert_eq!(scan(&opts), Ok(Scan::Found(14)));
        assert_eq!(scan(&opts[..12]), Ok(Scan::Absent));
    }

    #[test]
    fn malformed_blocks_do_not_panic() {
        assert!(scan(&[254]).is_err());
        assert!(scan(&[254, 0]).is_err());
        assert!(scan(&[254, 1, 0]).is_err());
        assert!(scan(&[254, 6, 0xE2]).is_err());
        assert_eq!(scan(&[0, 254, 6, 0xE2, 0xD4, 0xC3, 0xD9]), Ok(Scan::Absent));
        assert!(!has_smc_option(&[2, 200]));
    }

    #[test]
    fn emit() {
        let mut b = [0u8; 8];
        assert_eq!(emit_aligned(&mut b), Ok(8));
        assert_eq!(scan(&b), Ok(Scan::Found(2)));
        assert!(emit_aligned(&mut b[..7]).is_err());
    }
}
