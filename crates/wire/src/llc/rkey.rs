//! RKey management messages: CONFIRM RKEY, CONFIRM RKEY CONTINUATION, DELETE RKEY and
//! DELETE RKEY v2 (RFC 7609 A.3.5–A.3.7; Linux `smc_llc.c`).

use super::{write_header, LlcFormat, LlcType, RkeyList, FLAG_RESP, LLC_LEN};
use crate::common::{get_u32, get_u64, put_u32, put_u64};
use crate::error::{Error, Result};

fn fixed_len(ty: LlcType, m: &[u8]) -> Result<()> {
    if m.len() != LLC_LEN {
        return Err(Error::BadLength {
            msg: ty.name(),
            expected: LLC_LEN,
            got: m.len(),
        });
    }
    Ok(())
}

/// CONFIRM RKEY / DELETE RKEY flag: negative response (Z).
pub const FLAG_RKEY_NEG: u8 = 0x20;
/// CONFIRM RKEY flag: configuration retry (C, negative responses only).
pub const FLAG_RKEY_RETRY: u8 = 0x10;

/// An "other link" RMB specification (13 bytes, unaligned; RFC 7609 Fig 37).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OtherLinkRkey {
    /// Link number.
    pub link_num: u8,
    /// RMB RKey on that link.
    pub rkey: u32,
    /// RMB virtual address on that link.
    pub vaddr: u64,
}

impl OtherLinkRkey {
    /// Wire length.
    pub const LEN: usize = 13;
    fn read(b: &[u8], off: usize) -> OtherLinkRkey {
        OtherLinkRkey {
            link_num: b[off],
            rkey: get_u32(b, off + 1),
            vaddr: get_u64(b, off + 5),
        }
    }
    fn write(&self, b: &mut [u8], off: usize) {
        b[off] = self.link_num;
        put_u32(b, off + 1, self.rkey);
        put_u64(b, off + 5, self.vaddr);
    }
}

/// Most other-link tokens a CONFIRM RKEY may announce: an LG has at most 8 links (AMB-28).
pub const MAX_OTHER_TOKENS: u8 = 7;

/// CONFIRM RKEY (RFC 7609 A.3.5): a new RMB's RToken on this link and up to two others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConfirmRkey {
    /// SMC-Rv2 message (0x26).
    pub v2: bool,
    /// Response flag.
    pub response: bool,
    /// Z: negative response.
    pub negative: bool,
    /// C: configuration retry.
    pub retry: bool,
    /// Other links' tokens still to come, including this message's (≤ 2: no continuation).
    pub num_tokens: u8,
    /// RMB RKey on the link carrying the message.
    pub rkey: u32,
    /// RMB virtual address on that link.
    pub vaddr: u64,
    /// Other-link specifications (zero when unused).
    pub others: [OtherLinkRkey; 2],
}

impl ConfirmRkey {
    pub(crate) fn parse(m: &[u8], v2: bool) -> Result<ConfirmRkey> {
        fixed_len(LlcType::ConfirmRkey, m)?;
        if m[4] > MAX_OTHER_TOKENS {
            return Err(Error::CountOutOfRange {
                field: "CONFIRM RKEY num_tkns",
                value: m[4].into(),
                min: 0,
                max: MAX_OTHER_TOKENS.into(),
            });
        }
        Ok(ConfirmRkey {
            v2,
            response: m[3] & FLAG_RESP != 0,
            negative: m[3] & FLAG_RKEY_NEG != 0,
            retry: m[3] & FLAG_RKEY_RETRY != 0,
            num_tokens: m[4],
            rkey: get_u32(m, 5),
            vaddr: get_u64(m, 9),
            others: [OtherLinkRkey::read(m, 17), OtherLinkRkey::read(m, 30)],
        })
    }
    pub(crate) fn emit(&self, b: &mut [u8], fmt: LlcFormat) -> Result<()> {
        if self.num_tokens > MAX_OTHER_TOKENS {
            return Err(Error::CountOutOfRange {
                field: "CONFIRM RKEY num_tkns",
                value: self.num_tokens.into(),
                min: 0,
                max: MAX_OTHER_TOKENS.into(),
            });
        }
        let mut flags = if self.response { FLAG_RESP } else { 0 };
        if self.negative {
            flags |= FLAG_RKEY_NEG;
        }
        if self.retry {
            flags |= FLAG_RKEY_RETRY;
        }
        write_header(b, LlcType::ConfirmRkey, self.v2, flags, fmt);
        b[4] = self.num_tokens;
        put_u32(b, 5, self.rkey);
        put_u64(b, 9, self.vaddr);
        self.others[0].write(b, 17);
        self.others[1].write(b, 30);
        Ok(())
    }
}

/// CONFIRM RKEY CONTINUATION (RFC 7609 A.3.6; three 13-byte specs, AMB-29). Linux never
/// sends it and ignores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConfirmRkeyCont {
    /// Response flag.
    pub response: bool,
    /// Z: negative response.
    pub negative: bool,
    /// Specs remaining including this message (≤ 3 means last).
    pub num_left: u8,
    /// Other-link specifications (zero when unused).
    pub others: [OtherLinkRkey; 3],
}

impl ConfirmRkeyCont {
    pub(crate) fn parse(m: &[u8]) -> Result<ConfirmRkeyCont> {
        fixed_len(LlcType::ConfirmRkeyCont, m)?;
        Ok(ConfirmRkeyCont {
            response: m[3] & FLAG_RESP != 0,
            negative: m[3] & FLAG_RKEY_NEG != 0,
            num_left: m[4],
            others: [5, 18, 31].map(|o| OtherLinkRkey::read(m, o)),
        })
    }
    pub(crate) fn emit(&self, b: &mut [u8], fmt: LlcFormat) {
        let mut flags = if self.response { FLAG_RESP } else { 0 };
        if self.negative {
            flags |= FLAG_RKEY_NEG;
        }
        write_header(b, LlcType::ConfirmRkeyCont, false, flags, fmt);
        b[4] = self.num_left;
        for (o, s) in [5, 18, 31].into_iter().zip(&self.others) {
            s.write(b, o);
        }
    }
}

/// Most RKeys in a v1 DELETE RKEY.
pub const MAX_DELETE_RKEYS: usize = 8;

/// DELETE RKEY v1 (RFC 7609 A.3.7): up to 8 RKeys, error mask on a negative response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeleteRkey {
    /// Response flag.
    pub response: bool,
    /// Z: negative response.
    pub negative: bool,
    /// Number of RKeys, 1..=8 (AMB-52).
    pub count: u8,
    /// Negative response: bit `0x80 >> i` set = RKey i was not deleted.
    pub err_mask: u8,
    /// The 8 RKey slots (entries past `count` are zero).
    pub rkeys: [u32; MAX_DELETE_RKEYS],
}

impl DeleteRkey {
    /// The RKeys in use (`count` entries).
    pub fn rkeys(&self) -> &[u32] {
        &self.rkeys[..usize::from(self.count).min(MAX_DELETE_RKEYS)]
    }
    fn check_count(count: u8) -> Result<()> {
        if count == 0 || usize::from(count) > MAX_DELETE_RKEYS {
            return Err(Error::CountOutOfRange {
                field: "DELETE RKEY count",
                value: count.into(),
                min: 1,
                max: MAX_DELETE_RKEYS,
            });
        }
        Ok(())
    }
    pub(crate) fn parse(m: &[u8]) -> Result<DeleteRkey> {
        fixed_len(LlcType::DeleteRkey, m)?;
        Self::check_count(m[4])?;
        Ok(DeleteRkey {
            response: m[3] & FLAG_RESP != 0,
            negative: m[3] & FLAG_RKEY_NEG != 0,
            count: m[4],
            err_mask: m[5],
            rkeys: core::array::from_fn(|i| get_u32(m, 8 + 4 * i)),
        })
    }
    pub(crate) fn emit(&self, b: &mut [u8], fmt: LlcFormat) -> Result<()> {
        Self::check_count(self.count)?;
        let mut flags = if self.response { FLAG_RESP } else { 0 };
        if self.negative {
            flags |= FLAG_RKEY_NEG;
        }
        write_header(b, LlcType::DeleteRkey, false, flags, fmt);
        b[4] = self.count;
        b[5] = self.err_mask;
        for (i, k) in self.rkeys.iter().enumerate() {
            put_u32(b, 8 + 4 * i, *k);
        }
        Ok(())
    }
}

/// DELETE RKEY v2 (0x29; Linux `smc_llc_msg_delete_rkey_v2`): up to 255 RKeys and a count of
/// invalid ones. Length is max(44, 8 + 4·n).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeleteRkeyV2<'a> {
    /// Response flag.
    pub response: bool,
    /// Z: negative response.
    pub negative: bool,
    /// Number of invalid RKeys (responses).
    pub num_inval_rkeys: u8,
    /// The RKeys (`num_rkeys` entries).
    pub rkeys: RkeyList<'a>,
}

impl<'a> DeleteRkeyV2<'a> {
    const HDR: usize = 8;
    /// Total length on the wire.
    pub fn buffer_len(&self) -> usize {
        (Self::HDR + 4 * self.rkeys.len()).max(LLC_LEN)
    }
    pub(crate) fn parse(m: &'a [u8]) -> Result<DeleteRkeyV2<'a>> {
        let n = usize::from(m[4]);
        let expected = (Self::HDR + 4 * n).max(LLC_LEN);
        if m.len() != expected {
            return Err(Error::BadLength {
                msg: "DELETE RKEY v2",
                expected,
                got: m.len(),
            });
        }
        Ok(DeleteRkeyV2 {
            response: m[3] & FLAG_RESP != 0,
            negative: m[3] & FLAG_RKEY_NEG != 0,
            num_inval_rkeys: m[5],
            rkeys: RkeyList::Wire(&m[Self::HDR..Self::HDR + 4 * n]),
        })
    }
    pub(crate) fn emit(&self, b: &mut [u8], fmt: LlcFormat) -> Result<()> {
        if self.rkeys.len() > 255 {
            return Err(Error::CountOutOfRange {
                field: "DELETE RKEY v2 num_rkeys",
                value: self.rkeys.len(),
                min: 0,
                max: 255,
            });
        }
        let mut flags = if self.response { FLAG_RESP } else { 0 };
        if self.negative {
            flags |= FLAG_RKEY_NEG;
        }
        write_header(b, LlcType::DeleteRkey, true, flags, fmt);
        b[4] = self.rkeys.len() as u8;
        b[5] = self.num_inval_rkeys;
        for (i, k) in self.rkeys.iter().enumerate() {
            put_u32(b, Self::HDR + 4 * i, k);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::LlcMessage;
    use super::*;

    #[test]
    fn delete_rkey_count_range() {
        let f = LlcFormat::LINUX_X86;
        let mut b = [0u8; 44];
        b[0] = 9;
        b[1] = 44;
        b[4] = 0;
        assert!(matches!(
            LlcMessage::parse(&b, f),
            Err(Error::CountOutOfRange { value: 0, .. })
        ));
        b[4] = 9;
        assert!(LlcMessage::parse(&b, f).is_err());
        b[4] = 2;
        b[8..12].copy_from_slice(&0x362u32.to_be_bytes());
        let LlcMessage::DeleteRkey(d) = LlcMessage::parse(&b, f).unwrap() else {
            panic!()
        };
        assert_eq!(d.rkeys(), &[0x362, 0]);
    }

    #[test]
    fn delete_rkey_v2_list_is_a_view() {
        // 12 rkeys: 8 + 48 = 56 bytes, little-endian length_v2.
        let mut b = vec![0u8; 56];
        b[0] = 0x29;
        b[1] = 56;
        b[4] = 12;
        for i in 0..12u32 {
            b[8 + 4 * i as usize..12 + 4 * i as usize].copy_from_slice(&(i + 1).to_be_bytes());
        }
        let f = LlcFormat::LINUX_X86;
        let m = LlcMessage::parse(&b, f).unwrap();
        let LlcMessage::DeleteRkeyV2(d) = m else {
            panic!()
        };
        assert_eq!(
            d.rkeys.iter().collect::<Vec<_>>(),
            (1..=12).collect::<Vec<_>>()
        );
        let mut out = vec![0u8; m.buffer_len()];
        m.emit(&mut out, f).unwrap();
        assert_eq!(out, b);
        let owned = [1, 2, 3];
        let small = LlcMessage::DeleteRkeyV2(DeleteRkeyV2 {
            rkeys: RkeyList::Slice(&owned),
            ..d
        });
        assert_eq!(small.buffer_len(), 44);
    }
}
