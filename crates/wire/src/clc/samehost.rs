//! smc-rs's same-host extension: the bytes that let two smc-rs stacks on one host agree, in
//! the CLC handshake, to carry a connection through shared memory instead of RDMA
//! (README "Same-host path", docs/samehost.md).
//!
//! Three pieces, none of them in RFC 7609:
//!
//! - **The offer** ([`SameHostOffer`]), in the client's Proposal, inside the 40-byte SMC-D/v2
//!   area every current Linux Proposal carries (`smc_clc_msg_smcd`): `vendor_oui` =
//!   [`SAME_HOST_OUI`], `vendor_exp_options` = `[SAME_HOST_VERSION, 0, 0, 0, 0]`, and the
//!   first 16 of the 20 reserved bytes = the client stack's id (u64 BE) and a one-time nonce
//!   (u64 BE). Linux writes zeros there and never reads these bytes (it reads the area's
//!   ISM GID only when the Proposal offers SMC-D, and its `v2_ext_offset`), so a Linux
//!   server answers such a Proposal exactly as any other: interop is unchanged.
//! - **The answer** ([`SameHostAcceptRepr`]), a CLC message of the private type
//!   [`super::ClcType::SameHostAccept`] (0x81), 28 bytes, sent by an smc-rs server only to a
//!   client whose Proposal carried the offer, after the shared memory was exchanged over a
//!   Unix socket: header (`SMCR`, 0x81, length 28, version 2), server stack id (u64 BE),
//!   the nonce echoed (u64 BE), trailer `SMCR`. Nothing else ever sends
//!   or expects type 0x81.
//! - **The hello** ([`SameHostHello`]), not CLC at all: the fixed 32-byte message each stack
//!   sends on the Unix socket with its memfd and eventfd (SCM_RIGHTS).

use super::{check_frame, check_version, write_frame, ClcType, Eyecatcher, SmcdArea};
use crate::common::{get_u64, put_u64};
use crate::error::{check_out, Error, Result};

/// `vendor_oui` of a Proposal carrying the offer: "SRS" (smc-rs). Not an IEEE OUI; an
/// IEEE-assigned one is all zeros in Linux's messages, so no Linux peer sends this.
pub const SAME_HOST_OUI: [u8; 3] = *b"SRS";
/// Version of the extension, in `vendor_exp_options[0]`.
pub const SAME_HOST_VERSION: u8 = 1;
/// Length of a [`SameHostAcceptRepr`] on the wire.
pub const SAME_HOST_ACCEPT_LEN: usize = 28;

/// The same-host offer of a client stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SameHostOffer {
    /// The client stack's id: names its Unix socket (`<dir>/<id as 16 hex digits>.sock`).
    pub stack_id: u64,
    /// Random, one per Proposal: the server presents it on the Unix socket, proving that
    /// whoever answers there is the process at the other end of this TCP connection.
    pub nonce: u64,
}

impl SameHostOffer {
    /// The offer carried by a Proposal's SMC-D/v2 area, if any. A marker with another
    /// version is no offer (a later extension we do not speak).
    pub fn from_smcd_area(a: &SmcdArea) -> Option<SameHostOffer> {
        if a.vendor_oui != SAME_HOST_OUI || a.vendor_exp_options[0] != SAME_HOST_VERSION {
            return None;
        }
        Some(SameHostOffer {
            stack_id: get_u64(&a.reserved, 0),
            nonce: get_u64(&a.reserved, 8),
        })
    }

    /// Writes the offer into an SMC-D/v2 area (the other fields stay as they are).
    pub fn emit_into(&self, a: &mut SmcdArea) {
        a.vendor_oui = SAME_HOST_OUI;
        a.vendor_exp_options = [SAME_HOST_VERSION, 0, 0, 0, 0];
        put_u64(&mut a.reserved, 0, self.stack_id);
        put_u64(&mut a.reserved, 8, self.nonce);
        a.reserved[16..].fill(0);
    }
}

/// The server's answer to an offer it took (CLC type 0x81).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SameHostAcceptRepr {
    /// The server stack's id (diagnostics).
    pub stack_id: u64,
    /// The offer's nonce, echoed.
    pub nonce: u64,
}

impl SameHostAcceptRepr {
    /// Parses a complete message.
    pub fn parse(b: &[u8]) -> Result<SameHostAcceptRepr> {
        let h = check_frame(b)?;
        if h.msg_type()? != ClcType::SameHostAccept || h.eyecatcher()? != Eyecatcher::Smcr {
            return Err(Error::UnknownType {
                layer: "CLC same-host Accept",
                value: b[super::field::TYPE],
            });
        }
        check_version(h.version())?;
        if b.len() != SAME_HOST_ACCEPT_LEN {
            return Err(Error::BadLength {
                msg: "CLC same-host Accept",
                expected: SAME_HOST_ACCEPT_LEN,
                got: b.len(),
            });
        }
        Ok(SameHostAcceptRepr {
            stack_id: get_u64(b, 8),
            nonce: get_u64(b, 16),
        })
    }

    /// Bytes [`Self::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        SAME_HOST_ACCEPT_LEN
    }

    /// Writes the message; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        check_out(buf, SAME_HOST_ACCEPT_LEN)?;
        let b = &mut buf[..SAME_HOST_ACCEPT_LEN];
        b.fill(0);
        write_frame(
            b,
            Eyecatcher::Smcr,
            ClcType::SameHostAccept,
            SAME_HOST_ACCEPT_LEN,
            0x20,
        );
        put_u64(b, 8, self.stack_id);
        put_u64(b, 16, self.nonce);
        Ok(SAME_HOST_ACCEPT_LEN)
    }
}

/// Magic of a [`SameHostHello`]: "SMCRSHM1".
pub const HELLO_MAGIC: [u8; 8] = *b"SMCRSHM1";
/// Length of a [`SameHostHello`].
pub const HELLO_LEN: usize = 32;

/// What each side tells the other on the Unix socket, beside its two descriptors (the
/// memfd of its receive region and its doorbell eventfd).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SameHostHello {
    /// The offer's nonce (server → client: which rendezvous; client → server: echoed).
    pub nonce: u64,
    /// The sender's connection token (the peer puts it in CDCs to the sender).
    pub token: u32,
    /// Size of the sender's RMB (the data area of its receive region), bytes.
    pub rmb_len: u32,
    /// [`HELLO_ACCEPTED`], [`HELLO_REFUSED`] (no such rendezvous, no resources), or
    /// [`HELLO_RELEASE`] (on a session: the sender no longer offers its region
    /// `region`; the receiver unmaps it). Any other value refuses.
    pub status: u32,
    /// The sender's number for its region (1.., unique per stack). With descriptors: a
    /// new region, which the receiver may remember under this number on the session
    /// between the two stacks; without: a region the receiver already has mapped from
    /// an earlier hello on that session (reused). 0: no number (not reusable).
    pub region: u32,
}

/// [`SameHostHello::status`]: the rendezvous is accepted.
pub const HELLO_ACCEPTED: u32 = 0;
/// [`SameHostHello::status`]: refused.
pub const HELLO_REFUSED: u32 = 1;
/// [`SameHostHello::status`]: the sender's region [`SameHostHello::region`] is no longer
/// offered (no nonce, token or size; no descriptors).
pub const HELLO_RELEASE: u32 = 2;

impl SameHostHello {
    /// Parses exactly [`HELLO_LEN`] bytes.
    pub fn parse(b: &[u8]) -> Result<SameHostHello> {
        if b.len() != HELLO_LEN {
            return Err(Error::BadLength {
                msg: "same-host hello",
                expected: HELLO_LEN,
                got: b.len(),
            });
        }
        if b[..8] != HELLO_MAGIC {
            return Err(Error::BadEyecatcher {
                which: "same-host hello",
            });
        }
        let u32at = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        Ok(SameHostHello {
            nonce: get_u64(b, 8),
            token: u32at(16),
            rmb_len: u32at(20),
            status: u32at(24),
            region: u32at(28),
        })
    }

    /// The message's bytes.
    pub fn to_bytes(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..8].copy_from_slice(&HELLO_MAGIC);
        put_u64(&mut b, 8, self.nonce);
        b[16..20].copy_from_slice(&self.token.to_be_bytes());
        b[20..24].copy_from_slice(&self.rmb_len.to_be_bytes());
        b[24..28].copy_from_slice(&self.status.to_be_bytes());
        b[28..32].copy_from_slice(&self.region.to_be_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clc::ClcMessage;

    #[test]
    fn accept_bytes_on_the_wire() {
        let m = SameHostAcceptRepr {
            stack_id: 0x0102030405060708,
            nonce: 0x1112131415161718,
        };
        let mut b = [0u8; 28];
        assert_eq!(m.emit(&mut b).unwrap(), 28);
        assert_eq!(
            b,
            [
                0xE2, 0xD4, 0xC3, 0xD9, 0x81, 0, 28, 0x20, 1, 2, 3, 4, 5, 6, 7, 8, 0x11, 0x12,
                0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0xE2, 0xD4, 0xC3, 0xD9
            ]
        );
        assert_eq!(SameHostAcceptRepr::parse(&b).unwrap(), m);
        assert_eq!(
            ClcMessage::parse(&b).unwrap(),
            ClcMessage::SameHostAccept(m)
        );
        let mut bad = b;
        bad[27] = 0;
        assert!(SameHostAcceptRepr::parse(&bad).is_err());
        assert!(SameHostAcceptRepr::parse(&b[..20]).is_err());
    }

    #[test]
    fn offer_in_the_smcd_area() {
        let mut a = SmcdArea::default();
        assert_eq!(
            SameHostOffer::from_smcd_area(&a),
            None,
            "Linux's zeros: no offer"
        );
        let o = SameHostOffer {
            stack_id: 7,
            nonce: u64::MAX,
        };
        o.emit_into(&mut a);
        assert_eq!(a.vendor_oui, *b"SRS");
        assert_eq!(a.vendor_exp_options, [1, 0, 0, 0, 0]);
        assert_eq!(&a.reserved[..8], &7u64.to_be_bytes());
        assert_eq!(SameHostOffer::from_smcd_area(&a), Some(o));
        a.vendor_exp_options[0] = 2;
        assert_eq!(SameHostOffer::from_smcd_area(&a), None, "unknown version");
    }

    #[test]
    fn hello_round_trip_and_rejects() {
        let h = SameHostHello {
            nonce: 42,
            token: 0xdeadbeef,
            rmb_len: 1 << 20,
            status: 0,
            region: 0x0102_0304,
        };
        let b = h.to_bytes();
        assert_eq!(&b[28..32], &[1, 2, 3, 4], "the region number, last");
        assert_eq!(SameHostHello::parse(&b).unwrap(), h);
        assert!(SameHostHello::parse(&b[..31]).is_err());
        let mut bad = b;
        bad[0] = b'X';
        assert!(SameHostHello::parse(&bad).is_err());
    }
}
