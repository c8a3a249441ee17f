//! Finds SMC messages in captured frames: the SMC-R TCP option in SYN/SYN-ACK, CLC messages
//! in the reassembled TCP byte streams of the handshake, and LLC/CDC messages in RoCEv2 RC
//! SEND payloads. Parsing of the messages themselves is left to `smc-wire`.

use crate::capture::{Frame, LinkType};
use crate::roce::{self, Reassembly, SendReassembler};
use etherparse::{NetSlice, SlicedPacket, TransportSlice};
use smc_wire::clc::{self, ClcType};
use smc_wire::common::{EYECATCHER_SMCD, EYECATCHER_SMCR};
use smc_wire::tcp_option;
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Where and when a message was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    /// Frame number (the frame that completed the message).
    pub frame: u64,
    /// Capture time.
    pub time: Duration,
    /// Source address (port 0 for RoCE).
    pub src: SocketAddr,
    /// Destination address (port 0 for RoCE).
    pub dst: SocketAddr,
}

/// Something SMC found in a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// The SMC-R TCP option in a SYN (`syn_ack` false) or SYN-ACK.
    TcpOption {
        /// Where.
        origin: Origin,
        /// SYN-ACK rather than SYN.
        syn_ack: bool,
    },
    /// One complete CLC message (exact bytes).
    Clc {
        /// Where.
        origin: Origin,
        /// The message.
        bytes: Vec<u8>,
    },
    /// One RoCEv2 SEND message payload (LLC or CDC).
    Send {
        /// Where.
        origin: Origin,
        /// Destination QP.
        dest_qp: u32,
        /// The payload.
        payload: Vec<u8>,
    },
    /// Bytes that should have been an SMC message but could not be framed.
    Malformed {
        /// Where.
        origin: Origin,
        /// Which layer ("CLC", "RoCEv2", "TCP option").
        layer: &'static str,
        /// What was wrong.
        why: String,
    },
}

impl Found {
    /// Where the item was found.
    pub fn origin(&self) -> &Origin {
        match self {
            Found::TcpOption { origin, .. }
            | Found::Clc { origin, .. }
            | Found::Send { origin, .. }
            | Found::Malformed { origin, .. } => origin,
        }
    }
}

type FlowKey = (SocketAddr, SocketAddr);

/// Longest CLC backlog kept per direction (a CLC message is at most a few hundred bytes).
const MAX_CLC_BUFFER: usize = 64 * 1024;
/// Most out-of-order segments kept per direction.
const MAX_OOO_SEGMENTS: usize = 256;

/// Per-direction TCP state while the CLC handshake may still be running.
#[derive(Default)]
struct Direction {
    next_seq: Option<u32>,
    buf: Vec<u8>,
    ooo: BTreeMap<u32, Vec<u8>>,
    /// The handshake is over in this direction (or the data is not CLC): stop looking.
    done: bool,
}

impl Direction {
    /// Adds a segment at sequence number `seq`, handling retransmits (overlap trimmed) and
    /// out-of-order segments (held until the gap fills).
    fn add(&mut self, seq: u32, data: &[u8]) {
        let next = *self.next_seq.get_or_insert(seq);
        let off = seq.wrapping_sub(next) as i32;
        if off > 0 {
            if self.ooo.len() < MAX_OOO_SEGMENTS {
                self.ooo.entry(seq).or_insert_with(|| data.to_vec());
            }
            return;
        }
        let skip = off.unsigned_abs() as usize;
        if skip >= data.len() {
            return; // pure retransmission
        }
        self.append(&data[skip..]);
        // Drain out-of-order segments that now fit (each pass removes one).
        while let Some(n) = self.next_seq {
            let Some(&s) = self.ooo.keys().find(|&&s| (s.wrapping_sub(n) as i32) <= 0) else {
                break;
            };
            let seg = self.ooo.remove(&s).unwrap_or_default();
            let skip = n.wrapping_sub(s) as usize;
            if skip < seg.len() {
                self.append(&seg[skip..]);
            }
        }
    }

    fn append(&mut self, data: &[u8]) {
        if let Some(n) = self.next_seq.as_mut() {
            *n = n.wrapping_add(data.len() as u32);
        }
        if !self.done && self.buf.len() + data.len() <= MAX_CLC_BUFFER {
            self.buf.extend_from_slice(data);
        } else {
            self.done = true;
            self.buf.clear();
        }
    }
}

/// Stateful extractor; feed it frames in capture order.
#[derive(Default)]
pub struct Extractor {
    flows: HashMap<FlowKey, Direction>,
    sends: SendReassembler,
}

/// Whether `b` starts like a CLC message (either eye catcher).
fn starts_with_eyecatcher(b: &[u8]) -> bool {
    b.len() >= 4 && (b[..4] == EYECATCHER_SMCR || b[..4] == EYECATCHER_SMCD)
}

impl Extractor {
    /// A new extractor.
    pub fn new() -> Extractor {
        Extractor::default()
    }

    /// Everything SMC in one frame (frames that are not IP are ignored).
    pub fn push(&mut self, frame: &Frame) -> Vec<Found> {
        let sliced = match frame.link {
            LinkType::Ethernet => SlicedPacket::from_ethernet(&frame.data),
            LinkType::RawIp => SlicedPacket::from_ip(&frame.data),
            LinkType::LinuxSll => SlicedPacket::from_linux_sll(&frame.data),
            LinkType::Other(_) => return Vec::new(),
        };
        let Ok(p) = sliced else {
            return Vec::new();
        };
        let (src_ip, dst_ip): (IpAddr, IpAddr) = match &p.net {
            Some(NetSlice::Ipv4(v4)) => (
                v4.header().source_addr().into(),
                v4.header().destination_addr().into(),
            ),
            Some(NetSlice::Ipv6(v6)) => (
                v6.header().source_addr().into(),
                v6.header().destination_addr().into(),
            ),
            _ => return Vec::new(),
        };
        let mut out = Vec::new();
        match &p.transport {
            Some(TransportSlice::Tcp(tcp)) => {
                let origin = Origin {
                    frame: frame.number,
                    time: frame.time,
                    src: SocketAddr::new(src_ip, tcp.source_port()),
                    dst: SocketAddr::new(dst_ip, tcp.destination_port()),
                };
                self.tcp(origin, tcp, &mut out);
            }
            Some(TransportSlice::Udp(udp)) if udp.destination_port() == roce::ROCEV2_PORT => {
                let origin = Origin {
                    frame: frame.number,
                    time: frame.time,
                    src: SocketAddr::new(src_ip, 0),
                    dst: SocketAddr::new(dst_ip, 0),
                };
                match roce::send_payload(udp.payload()) {
                    Err(e) => out.push(Found::Malformed {
                        origin,
                        layer: "RoCEv2",
                        why: e.0,
                    }),
                    Ok(None) => {}
                    Ok(Some((bth, payload))) => match self.sends.push(src_ip, dst_ip, bth, payload)
                    {
                        Reassembly::Complete(payload) => out.push(Found::Send {
                            origin,
                            dest_qp: bth.dest_qp,
                            payload,
                        }),
                        Reassembly::Pending => {}
                        Reassembly::Broken(why) => out.push(Found::Malformed {
                            origin,
                            layer: "RoCEv2",
                            why,
                        }),
                    },
                }
            }
            _ => {}
        }
        out
    }

    fn tcp(&mut self, origin: Origin, tcp: &etherparse::TcpSlice<'_>, out: &mut Vec<Found>) {
        let key = (origin.src, origin.dst);
        if tcp.syn() {
            match tcp_option::scan(tcp.options()) {
                Ok(tcp_option::Scan::Found(_)) => out.push(Found::TcpOption {
                    origin,
                    syn_ack: tcp.ack(),
                }),
                Ok(tcp_option::Scan::Absent) => {}
                Err(e) => out.push(Found::Malformed {
                    origin,
                    layer: "TCP options",
                    why: e.to_string(),
                }),
            }
            // A SYN starts a new stream in this direction.
            self.flows.insert(
                key,
                Direction {
                    next_seq: Some(tcp.sequence_number().wrapping_add(1)),
                    ..Default::default()
                },
            );
        }
        let payload = tcp.payload();
        if payload.is_empty() {
            return;
        }
        let dir = self.flows.entry(key).or_default();
        if dir.done {
            return;
        }
        dir.add(tcp.sequence_number(), payload);
        // Cut complete CLC messages off the front of the stream.
        while !dir.done && dir.buf.len() >= 4 {
            if !starts_with_eyecatcher(&dir.buf) {
                // Application data (e.g. after a fallback): CLC must not be parsed from it
                // (RFC 7609 C.6).
                dir.done = true;
                dir.buf.clear();
                break;
            }
            if dir.buf.len() < clc::field::HEADER_LEN {
                break;
            }
            let len = match clc::message_len(&dir.buf[..clc::field::HEADER_LEN]) {
                Ok(n) => n,
                Err(e) => {
                    out.push(Found::Malformed {
                        origin,
                        layer: "CLC",
                        why: e.to_string(),
                    });
                    dir.done = true;
                    dir.buf.clear();
                    break;
                }
            };
            if dir.buf.len() < len {
                break;
            }
            let bytes: Vec<u8> = dir.buf.drain(..len).collect();
            let ty = bytes[clc::field::TYPE];
            out.push(Found::Clc { origin, bytes });
            // After Accept (server), Confirm (client) or Decline the handshake is over in
            // this direction; what follows is application data.
            if ty != ClcType::Proposal as u8 {
                dir.done = true;
                dir.buf.clear();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reassembly_handles_retransmits_and_reordering() {
        let mut d = Direction {
            next_seq: Some(100),
            ..Default::default()
        };
        d.add(103, &[4, 5]); // early
        d.add(100, &[1, 2]);
        d.add(100, &[1, 2]); // retransmit
        d.add(101, &[2, 3]); // overlap
        assert_eq!(d.buf, [1, 2, 3, 4, 5]);
        assert_eq!(d.next_seq, Some(105));
        // Sequence numbers wrap.
        let mut d = Direction {
            next_seq: Some(u32::MAX),
            ..Default::default()
        };
        d.add(u32::MAX, &[1, 2]);
        d.add(1, &[3]);
        assert_eq!(d.buf, [1, 2, 3]);
    }
}
