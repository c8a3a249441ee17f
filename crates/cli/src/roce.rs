//! Just enough RoCEv2 framing for decoding SMC-R captures: the 12-byte IBA Base Transport
//! Header (BTH) on UDP 4791, and the payload of RC SEND packets (IBA §9.2; RoCEv2 = IBA
//! transport over UDP/IP). SEND First/Middle/Last packets are reassembled per destination QP.
//!
//! Layout of the BTH: byte 0 opcode; byte 1 SE(0x80) M(0x40) PadCnt(0x30) TVer(0x0F);
//! bytes 2-3 P_Key; byte 4 reserved; bytes 5-7 destination QP; byte 8 AckReq(0x80);
//! bytes 9-11 PSN. The packet ends with the 4-byte ICRC.

use std::collections::HashMap;
use std::net::IpAddr;

/// UDP destination port of RoCEv2.
pub const ROCEV2_PORT: u16 = 4791;
/// BTH length.
pub const BTH_LEN: usize = 12;
/// ICRC length.
pub const ICRC_LEN: usize = 4;

/// RC opcodes of the SEND family (IBA Table 38; transport class RC = 0b000).
mod opcode {
    pub const SEND_FIRST: u8 = 0x00;
    pub const SEND_MIDDLE: u8 = 0x01;
    pub const SEND_LAST: u8 = 0x02;
    pub const SEND_LAST_IMM: u8 = 0x03;
    pub const SEND_ONLY: u8 = 0x04;
    pub const SEND_ONLY_IMM: u8 = 0x05;
    pub const SEND_LAST_INV: u8 = 0x16;
    pub const SEND_ONLY_INV: u8 = 0x17;
}

/// The decoded BTH of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bth {
    /// Opcode.
    pub opcode: u8,
    /// Pad count (0..=3 bytes of padding before the ICRC).
    pub pad: u8,
    /// Destination QP number.
    pub dest_qp: u32,
    /// Packet sequence number.
    pub psn: u32,
}

/// Why a UDP 4791 datagram could not be framed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FramingError(pub String);

/// Parses the BTH and returns it with the packet's payload (after extension headers, before
/// pad and ICRC) if it is an RC SEND; `Ok(None)` for other opcodes.
pub fn send_payload(udp_payload: &[u8]) -> Result<Option<(Bth, &[u8])>, FramingError> {
    if udp_payload.len() < BTH_LEN + ICRC_LEN {
        return Err(FramingError(format!(
            "RoCEv2 packet of {} bytes is shorter than BTH + ICRC",
            udp_payload.len()
        )));
    }
    let b = udp_payload;
    let bth = Bth {
        opcode: b[0],
        pad: (b[1] >> 4) & 3,
        dest_qp: u32::from_be_bytes([0, b[5], b[6], b[7]]),
        psn: u32::from_be_bytes([0, b[9], b[10], b[11]]),
    };
    let ext = match bth.opcode {
        opcode::SEND_FIRST | opcode::SEND_MIDDLE | opcode::SEND_LAST | opcode::SEND_ONLY => 0,
        // ImmDt or IETH: 4 bytes.
        opcode::SEND_LAST_IMM
        | opcode::SEND_ONLY_IMM
        | opcode::SEND_LAST_INV
        | opcode::SEND_ONLY_INV => 4,
        _ => return Ok(None),
    };
    let start = BTH_LEN + ext;
    let end = b.len() - ICRC_LEN;
    let pad = usize::from(bth.pad);
    if start + pad > end {
        return Err(FramingError(format!(
            "RoCEv2 SEND opcode {:#04x}: headers and pad ({} bytes) exceed the packet",
            bth.opcode,
            start + pad
        )));
    }
    Ok(Some((bth, &b[start..end - pad])))
}

/// Longest reassembled SEND message kept (SMC-Rv2 LLC messages are ≤ 8 KiB).
pub const MAX_MESSAGE: usize = 64 * 1024;

/// Reassembles multi-packet SENDs per (source, destination, destination QP).
#[derive(Default)]
pub struct SendReassembler {
    partial: HashMap<(IpAddr, IpAddr, u32), Vec<u8>>,
}

/// Outcome of feeding one SEND packet.
#[derive(Debug, PartialEq, Eq)]
pub enum Reassembly {
    /// A complete message.
    Complete(Vec<u8>),
    /// More packets needed.
    Pending,
    /// A Middle/Last without a First, or a message over [`MAX_MESSAGE`].
    Broken(String),
}

impl SendReassembler {
    /// Feeds one SEND packet's payload.
    pub fn push(&mut self, src: IpAddr, dst: IpAddr, bth: Bth, payload: &[u8]) -> Reassembly {
        let key = (src, dst, bth.dest_qp);
        match bth.opcode {
            opcode::SEND_ONLY | opcode::SEND_ONLY_IMM | opcode::SEND_ONLY_INV => {
                Reassembly::Complete(payload.to_vec())
            }
            opcode::SEND_FIRST => {
                self.partial.insert(key, payload.to_vec());
                Reassembly::Pending
            }
            _ => {
                let last = bth.opcode != opcode::SEND_MIDDLE;
                let Some(buf) = self.partial.get_mut(&key) else {
                    return Reassembly::Broken(format!(
                        "SEND continuation (opcode {:#04x}, PSN {}) without a SEND First",
                        bth.opcode, bth.psn
                    ));
                };
                if buf.len() + payload.len() > MAX_MESSAGE {
                    self.partial.remove(&key);
                    return Reassembly::Broken(format!("SEND message over {MAX_MESSAGE} bytes"));
                }
                buf.extend_from_slice(payload);
                if last {
                    Reassembly::Complete(self.partial.remove(&key).unwrap_or_default())
                } else {
                    Reassembly::Pending
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_only_with_pad() {
        let mut p = vec![0x04, 0x20, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0, 1, 2];
        p.extend_from_slice(&[7, 7, 7, 0, 0]); // 3 bytes payload + 2 pad
        p.extend_from_slice(&[1, 2, 3, 4]); // ICRC
        let (bth, pl) = send_payload(&p).unwrap().unwrap();
        assert_eq!((bth.dest_qp, bth.psn, bth.pad), (0x11, 0x102, 2));
        assert_eq!(pl, &[7, 7, 7]);
        p[0] = 0x0a; // RDMA WRITE Only
        assert_eq!(send_payload(&p).unwrap(), None);
        assert!(send_payload(&p[..15]).is_err());
        let mut bad = vec![0x05, 0x30, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        bad.extend_from_slice(&[0; 4]);
        assert!(send_payload(&bad).is_err(), "ImmDt + pad 3 exceed 3 bytes");
    }

    #[test]
    fn multi_packet_send() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let bth = |opcode| Bth {
            opcode,
            pad: 0,
            dest_qp: 0x11,
            psn: 0,
        };
        let mut r = SendReassembler::default();
        assert!(matches!(
            r.push(a, b, bth(0x01), &[1]),
            Reassembly::Broken(_)
        ));
        assert_eq!(r.push(a, b, bth(0x00), &[1, 2]), Reassembly::Pending);
        assert_eq!(r.push(a, b, bth(0x01), &[3]), Reassembly::Pending);
        assert_eq!(
            r.push(a, b, bth(0x02), &[4]),
            Reassembly::Complete(vec![1, 2, 3, 4])
        );
        assert_eq!(r.push(a, b, bth(0x04), &[9]), Reassembly::Complete(vec![9]));
    }
}
