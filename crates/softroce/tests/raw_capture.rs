//! Our packets as a foreign receiver (Linux rxe, a NIC) sees them: a raw
//! IPv4 socket captures the real IP headers of a session between two
//! devices, and every packet's ICRC must verify with those headers —
//! in particular with the IPv4 identification the kernel actually put on the
//! wire (verifiers.md fact 6: 0 with DF on an unconnected socket). Skips
//! (passes with a message) without CAP_NET_RAW.

mod common;
use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use common::*;
use smc_softroce::icrc::{self, IpInfo};
use smc_softroce::wire::PacketRepr;
use smc_softroce::Config;
use smc_verbs::*;
use socket2::{Domain, Protocol, Socket, Type};

#[test]
fn every_packet_verifies_with_its_real_ip_header() {
    let net = 90u8;
    // One raw socket per direction of the test, bound to the receiving address and
    // connected to the sending one: the kernel then gives each only the datagrams
    // between the two, so other RoCE traffic on lo (another test or stack on the
    // machine) neither reaches the check nor fills the sockets' buffers and pushes ours
    // out. (Bound first: connect would otherwise bind to the route's source.)
    let mut raws = Vec::new();
    for (host, to) in [(1u8, 2u8), (2, 1)] {
        let raw = match Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP)) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("skipping: no raw socket ({e})");
                return;
            }
        };
        let at = std::net::SocketAddrV4::new(Ipv4Addr::new(127, 86, net, to), 0);
        let from = std::net::SocketAddrV4::new(Ipv4Addr::new(127, 86, net, host), 0);
        raw.bind(&at.into()).unwrap();
        raw.connect(&from.into()).unwrap();
        raw.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        raws.push(raw);
    }
    let o = Opts {
        mtu: Mtu::Mtu1024,
        ..Opts::default()
    };
    // One datagram per packet: on lo a raw socket sees UDP GSO trains
    // unsegmented (super-packets). Segments on a real wire: tests/gso_wire.rs.
    let cfg = Config {
        gso: Some(false),
        ..Config::default()
    };
    let (a, b) = pair(net, &cfg, &o);
    let src = buf(64 << 10);
    fill_pattern(&src, 90);
    let smr = a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = buf(64 << 10);
    let dmr =
        b.pd.reg_mr(
            &dst,
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        )
        .unwrap();
    for i in 0..6 {
        b.qp.post_recv(&RecvWr {
            wr_id: i,
            sg_list: &[dmr.sge(0, 8192)],
        })
        .unwrap();
    }
    let wrs = [
        SendWr {
            wr_id: 1,
            op: SendOp::SendWithImm { imm: 1 },
            sg_list: &[smr.sge(0, 3001)],
            flags: SendFlags::SIGNALED,
        },
        SendWr {
            wr_id: 2,
            op: SendOp::RdmaWrite {
                remote_addr: dmr.addr(),
                rkey: dmr.rkey(),
            },
            sg_list: &[smr.sge(0, 5000)],
            flags: SendFlags::SIGNALED,
        },
        SendWr {
            wr_id: 3,
            op: SendOp::RdmaWriteWithImm {
                remote_addr: dmr.addr(),
                rkey: dmr.rkey(),
                imm: 2,
            },
            sg_list: &[smr.sge(0, 2048)],
            flags: SendFlags::SIGNALED,
        },
        SendWr {
            wr_id: 4,
            op: SendOp::RdmaRead {
                remote_addr: dmr.addr(),
                rkey: dmr.rkey(),
            },
            sg_list: &[smr.sge(8192, 3333)],
            flags: SendFlags::SIGNALED,
        },
        SendWr {
            wr_id: 5,
            op: SendOp::AtomicCmpSwap {
                remote_addr: dmr.addr() + 4096,
                rkey: dmr.rkey(),
                compare: 0,
                swap: 1,
            },
            sg_list: &[smr.sge(16384, 8)],
            flags: SendFlags::SIGNALED,
        },
        SendWr {
            wr_id: 6,
            op: SendOp::AtomicFetchAdd {
                remote_addr: dmr.addr() + 4096,
                rkey: dmr.rkey(),
                add: 1,
            },
            sg_list: &[smr.sge(16384, 8)],
            flags: SendFlags::SIGNALED,
        },
        SendWr {
            wr_id: 7,
            op: SendOp::Send,
            sg_list: &[smr.sge(0, 2000)],
            flags: SendFlags::SIGNALED,
        },
        SendWr {
            wr_id: 8,
            op: SendOp::RdmaWriteWithImm {
                remote_addr: dmr.addr(),
                rkey: dmr.rkey(),
                imm: 3,
            },
            sg_list: &[smr.sge(0, 100)],
            flags: SendFlags::SIGNALED,
        },
        SendWr {
            wr_id: 9,
            op: SendOp::RdmaWrite {
                remote_addr: dmr.addr(),
                rkey: dmr.rkey(),
            },
            sg_list: &[smr.sge(0, 100)],
            flags: SendFlags::SIGNALED,
        },
        SendWr {
            wr_id: 10,
            op: SendOp::RdmaRead {
                remote_addr: dmr.addr(),
                rkey: dmr.rkey(),
            },
            sg_list: &[smr.sge(8192, 100)],
            flags: SendFlags::SIGNALED,
        },
        SendWr {
            wr_id: 11,
            op: SendOp::Send,
            sg_list: &[smr.sge(0, 10)],
            flags: SendFlags::SIGNALED,
        },
        SendWr {
            wr_id: 12,
            op: SendOp::SendWithImm { imm: 4 },
            sg_list: &[smr.sge(0, 10)],
            flags: SendFlags::SIGNALED,
        },
    ];
    a.qp.post_send_batch(&wrs).unwrap();
    for i in 1..=12 {
        let wc = wait_wc(&a.scq, T);
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
    }
    // Read everything the raw socket saw for our two addresses.
    let ours = |ip: Ipv4Addr| ip.octets()[..3] == [127, 86, net];
    let mut opcodes = BTreeSet::new();
    let mut n = 0;
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut b = vec![std::mem::MaybeUninit::<u8>::uninit(); 65536];
    let mut quiet = [false; 2];
    while Instant::now() < deadline && !quiet.iter().all(|q| *q) {
        for (k, raw) in raws.iter().enumerate() {
            let Ok(len) = raw.recv(&mut b) else {
                quiet[k] = true;
                continue;
            };
            quiet[k] = false;
            // SAFETY: recv initialised the first `len` bytes.
            let d: Vec<u8> = b[..len]
                .iter()
                .map(|x| unsafe { x.assume_init() })
                .collect();
            let ihl = (d[0] & 0x0f) as usize * 4;
            let (s, t) = (
                Ipv4Addr::new(d[12], d[13], d[14], d[15]),
                Ipv4Addr::new(d[16], d[17], d[18], d[19]),
            );
            let udp = &d[ihl..];
            let dport = u16::from_be_bytes([udp[2], udp[3]]);
            if !ours(s) || !ours(t) || dport != 4791 {
                continue;
            }
            let ip = IpInfo::V4 {
                src: s,
                dst: t,
                id: u16::from_be_bytes([d[4], d[5]]),
                flags_frag: u16::from_be_bytes([d[6], d[7]]),
            };
            let sport = u16::from_be_bytes([udp[0], udp[1]]);
            let payload = &udp[8..];
            assert!(
                icrc::verify(&ip, sport, dport, payload),
                "ICRC fails with the real header {ip:?}"
            );
            assert_eq!(
                u16::from_be_bytes([d[6], d[7]]) & 0x4000,
                0x4000,
                "DF not set"
            );
            opcodes.insert(PacketRepr::parse(payload).unwrap().repr.bth.opcode as u8);
            n += 1;
        }
    }
    eprintln!("{n} packets verified; opcodes {opcodes:x?}");
    // Every opcode of the session was seen (requests and responses).
    for op in 0x00u8..=0x14 {
        assert!(
            opcodes.contains(&op),
            "opcode {op:#04x} not captured; saw {opcodes:x?}"
        );
    }
}
