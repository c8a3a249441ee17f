//! SMC Decline (CLC type 4), either direction (RFC 7609 A.2.5; Linux `smc_clc_msg_decline`
//! and `_v2`): 28 bytes in version 1, 44 bytes in version ≥ 2 (OS type and four more
//! diagnosis words).

use super::{check_frame, check_version, write_frame, ClcType, Eyecatcher};
use crate::common::{get_u32, put_u32, PeerId};
use crate::decline::DeclineCode;
use crate::error::{check_out, Error, Result};

/// Byte offsets of the Decline.
pub mod field {
    /// Sender Peer ID (8).
    pub const PEER_ID: usize = 8;
    /// Peer diagnosis information (BE32).
    pub const DIAGNOSIS: usize = 16;
    /// OS type (high nibble; Linux v2: 2).
    pub const OS_TYPE: usize = 20;
    /// v2: four more diagnosis words (16 bytes).
    pub const DIAGNOSIS_V2: usize = 24;
    /// v1 length.
    pub const V1_LEN: usize = 28;
    /// v2 length.
    pub const V2_LEN: usize = 44;
}

/// An SMC Decline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeclineRepr {
    /// Eye catcher (Linux always writes SMCR, even for SMC-D).
    pub eyecatcher: Eyecatcher,
    /// Header version: 1 → 28 bytes, ≥ 2 → 44 bytes.
    pub version: u8,
    /// S flag (0x08): the link group is out of sync; the receiver must clean it up.
    pub out_of_sync: bool,
    /// Sender Peer ID.
    pub peer_id: PeerId,
    /// Peer diagnosis information.
    pub diagnosis: DeclineCode,
    /// OS type (4 bits; 0 in v1).
    pub os_type: u8,
    /// Version ≥ 2 only: the four extra diagnosis words (Linux sends zeros).
    pub diagnosis_v2: Option<[u32; 4]>,
}

impl DeclineRepr {
    /// Parses a complete Decline.
    pub fn parse(b: &[u8]) -> Result<DeclineRepr> {
        let h = check_frame(b)?;
        if h.msg_type()? != ClcType::Decline {
            return Err(Error::UnknownType {
                layer: "CLC Decline",
                value: b[super::field::TYPE],
            });
        }
        let version = h.version();
        let expected = if version == 1 {
            field::V1_LEN
        } else {
            field::V2_LEN
        };
        if b.len() != expected {
            return Err(Error::BadLength {
                msg: "CLC Decline",
                expected,
                got: b.len(),
            });
        }
        let diagnosis_v2 =
            (version >= 2).then(|| [0, 1, 2, 3].map(|i| get_u32(b, field::DIAGNOSIS_V2 + 4 * i)));
        Ok(DeclineRepr {
            eyecatcher: h.eyecatcher()?,
            version,
            out_of_sync: h.flag(),
            peer_id: PeerId::read(b, field::PEER_ID),
            diagnosis: DeclineCode(get_u32(b, field::DIAGNOSIS)),
            os_type: b[field::OS_TYPE] >> 4,
            diagnosis_v2,
        })
    }

    /// Total length on the wire.
    pub fn buffer_len(&self) -> usize {
        if self.diagnosis_v2.is_some() {
            field::V2_LEN
        } else {
            field::V1_LEN
        }
    }

    /// Writes the Decline; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        check_version(self.version)?;
        if (self.version >= 2) != self.diagnosis_v2.is_some() || self.os_type > 15 {
            return Err(Error::Inconsistent {
                field: "version",
                why: "v2 diagnosis words present iff version >= 2; os_type is 4 bits",
            });
        }
        let len = self.buffer_len();
        check_out(buf, len)?;
        let b = &mut buf[..len];
        b.fill(0);
        let byte7 = (self.version << 4) | if self.out_of_sync { 0x08 } else { 0 };
        write_frame(b, self.eyecatcher, ClcType::Decline, len, byte7);
        self.peer_id.write(b, field::PEER_ID);
        put_u32(b, field::DIAGNOSIS, self.diagnosis.0);
        b[field::OS_TYPE] = self.os_type << 4;
        if let Some(d) = self.diagnosis_v2 {
            for (i, w) in d.iter().enumerate() {
                put_u32(b, field::DIAGNOSIS_V2 + 4 * i, *w);
            }
        }
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clc::ClcMessage;

    /// The v2 Decline Linux 6.12 sent on a UEID mismatch (kernel-smc README §V4(f); the
    /// README abbreviates the 16 zero bytes of `peer_diagnosis_v2`).
    fn linux_v2_decline() -> Vec<u8> {
        let mut b = vec![0xe2, 0xd4, 0xc3, 0xd9, 0x04, 0x00, 0x2c, 0x20];
        b.extend_from_slice(&[0x4b, 0xe8, 0x52, 0x54, 0x00, 0x99, 0x00, 0x01]);
        b.extend_from_slice(&[0x03, 0x03, 0x00, 0x00, 0x20, 0, 0, 0]);
        b.extend_from_slice(&[0u8; 16]);
        b.extend_from_slice(&[0xe2, 0xd4, 0xc3, 0xd9]);
        b
    }

    #[test]
    fn linux_v2_decline_round_trip() {
        let b = linux_v2_decline();
        let ClcMessage::Decline(d) = ClcMessage::parse(&b).unwrap() else {
            panic!("Decline expected")
        };
        assert_eq!(d.diagnosis, DeclineCode::NOSMCDEV);
        assert_eq!(d.os_type, 2);
        assert!(!d.out_of_sync);
        assert_eq!(d.peer_id.to_string(), "0x4be8525400990001");
        let mut out = [0u8; 44];
        assert_eq!(d.emit(&mut out), Ok(44));
        assert_eq!(&out[..], &b[..]);
    }

    #[test]
    fn decline_length_must_match_version() {
        let mut b = linux_v2_decline();
        b[7] = 0x10; // version 1 but 44 bytes
        assert!(matches!(
            ClcMessage::parse(&b),
            Err(Error::BadLength { expected: 28, .. })
        ));
        let mut b = linux_v2_decline();
        b[43] = 0;
        assert_eq!(
            ClcMessage::parse(&b),
            Err(Error::BadEyecatcher { which: "trailer" })
        );
        let mut b = linux_v2_decline();
        b[43] = 0xc4; // SMCD trailer after an SMCR header
        assert_eq!(ClcMessage::parse(&b), Err(Error::TrailerMismatch));
    }
}
