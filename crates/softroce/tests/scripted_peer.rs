//! The responder against a scripted peer: a plain UDP socket that builds
//! RoCEv2 packets with our codec and checks every answer byte for byte in
//! its fields (duplicate re-ACK, PSN sequence error NAK sent once, invalid
//! opcode sequence, bad ICRC dropped silently, READ re-execution and atomic
//! replay for duplicates). CHECKLIST §C.5 PSN-2..4, ACK-1..3, §C.4 SEG-8.

mod common;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Duration;

use common::*;
use smc_softroce::icrc::{self, IpInfo, IPV4_DF};
use smc_softroce::wire::*;
use smc_softroce::Config;
use smc_verbs::*;

const PEER_QPN: u32 = 0x99;

/// The scripted peer: receives on `me:4791` like any RoCEv2 node, sends
/// from `tx`, bound to an ephemeral port (RoCEv2 receivers must take
/// packets from any source port; rxe uses one per QP).
struct Peer {
    sock: UdpSocket,
    tx: UdpSocket,
    me: Ipv4Addr,
    dut: Ipv4Addr,
    dut_qpn: u32,
}

impl Peer {
    fn send(&self, mut repr: PacketRepr, payload: &[u8]) {
        repr.bth.pad_count = pad_for(payload.len()) as u8;
        let mut b = vec![0u8; repr.buffer_len(payload.len())];
        let off = repr.emit(&mut b).unwrap();
        b[off..off + payload.len()].copy_from_slice(payload);
        let ip = IpInfo::V4 {
            src: self.me,
            dst: self.dut,
            id: 0,
            flags_frag: IPV4_DF,
        };
        let sport = self.tx.local_addr().unwrap().port();
        icrc::fill(&ip, sport, 4791, &mut b);
        self.tx
            .send_to(&b, SocketAddr::new(IpAddr::V4(self.dut), 4791))
            .unwrap();
    }
    fn send_raw(&self, b: &[u8]) {
        self.tx
            .send_to(b, SocketAddr::new(IpAddr::V4(self.dut), 4791))
            .unwrap();
    }
    fn recv(&self) -> Option<(PacketRepr, Vec<u8>)> {
        self.recv_from().map(|(r, d, _)| (r, d))
    }
    /// A packet from the DUT with its UDP source port.
    fn recv_from(&self) -> Option<(PacketRepr, Vec<u8>, u16)> {
        let mut b = [0u8; 8192];
        match self.sock.recv_from(&mut b) {
            Ok((n, from)) => {
                let p = PacketRepr::parse(&b[..n]).expect("DUT sent a malformed packet");
                let ip = IpInfo::V4 {
                    src: self.dut,
                    dst: self.me,
                    id: 0,
                    flags_frag: IPV4_DF,
                };
                assert!(
                    icrc::verify(&ip, from.port(), 4791, &b[..n]),
                    "DUT packet ICRC (ID 0)"
                );
                Some((
                    p.repr,
                    b[p.payload_off..p.payload_off + p.payload_len].to_vec(),
                    from.port(),
                ))
            }
            Err(_) => None,
        }
    }
    fn expect(&self) -> (PacketRepr, Vec<u8>) {
        self.recv().expect("no answer from the device")
    }
    fn silence(&self) {
        self.sock
            .set_read_timeout(Some(Duration::from_millis(60)))
            .unwrap();
        if let Some((r, _)) = self.recv() {
            panic!("unexpected packet {r:?}");
        }
        self.sock
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
    }
    fn req(&self, opcode: Opcode, psn: u32, ack_req: bool) -> PacketRepr {
        PacketRepr {
            bth: BthRepr {
                opcode,
                se: false,
                mig_req: false,
                pad_count: 0,
                pkey: 0xffff,
                resv8a: 0,
                dest_qp: self.dut_qpn,
                ack_req,
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
}

fn setup(net: u8) -> (Side, Peer) {
    setup_mtu(net, Mtu::Mtu1024)
}

fn setup_mtu(net: u8, mtu: Mtu) -> (Side, Peer) {
    // One datagram per packet: the peer checks every ICRC for IPv4 ID 0,
    // while the kernel numbers the segments of a GSO train 0, 1, 2, … when
    // it splits it for this plain socket (those: tests/gso_wire.rs).
    let cfg = Config {
        gso: Some(false),
        ..Config::default()
    };
    let dev = device(net, 1, &cfg);
    let o = Opts {
        mtu,
        ..Opts::default()
    };
    let s = side(&dev, &o, 500);
    let me = Ipv4Addr::new(127, 86, net, 2);
    s.qp.modify_to_rtr(&RtrAttr {
        path_mtu: mtu,
        dest_qpn: PEER_QPN,
        rq_psn: 100,
        ah: AddressHandle::to_gid(Gid::from_ip(IpAddr::V4(me))),
        max_dest_rd_atomic: 4,
        min_rnr_timer: 3,
    })
    .unwrap();
    // A long ACK timeout (268 ms) so no retransmission interleaves with
    // the script.
    s.qp.modify_to_rts(&RtsAttr {
        sq_psn: 500,
        timeout: 16,
        ..o.rts
    })
    .unwrap();
    let sock = UdpSocket::bind(SocketAddr::new(IpAddr::V4(me), 4791)).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let tx = UdpSocket::bind(SocketAddr::new(IpAddr::V4(me), 0)).unwrap();
    let dut = Ipv4Addr::new(127, 86, net, 1);
    let qpn = s.qp.qpn();
    (
        s,
        Peer {
            sock,
            tx,
            me,
            dut,
            dut_qpn: qpn,
        },
    )
}

fn ack_of(r: &PacketRepr) -> (Opcode, u32, Syndrome, u32) {
    let a = r.aeth.expect("AETH");
    assert_eq!(r.bth.dest_qp, PEER_QPN);
    (r.bth.opcode, r.bth.psn, a.syndrome, a.msn)
}

#[test]
fn send_duplicate_gap_and_rnr() {
    let (s, peer) = setup(80);
    let dst = buf(4096);
    let mr = s.pd.reg_mr(&dst, AccessFlags::LOCAL_WRITE).unwrap();
    // No receive posted: RNR NAK with our min_rnr_timer, nothing consumed.
    peer.send(peer.req(Opcode::SendOnly, 100, true), b"hello");
    assert_eq!(
        ack_of(&peer.expect().0),
        (Opcode::Acknowledge, 100, Syndrome::RnrNak { timer: 3 }, 0)
    );
    s.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: &[mr.sge(0, 64)],
    })
    .unwrap();
    s.qp.post_recv(&RecvWr {
        wr_id: 2,
        sg_list: &[mr.sge(1024, 2048)],
    })
    .unwrap();
    peer.send(peer.req(Opcode::SendOnly, 100, true), b"hello");
    assert_eq!(
        ack_of(&peer.expect().0),
        (Opcode::Acknowledge, 100, Syndrome::ACK, 1)
    );
    let wc = wait_wc(&s.rcq, T);
    assert_eq!((wc.wr_id, wc.byte_len, wc.src_qp), (1, 5, PEER_QPN));
    assert_eq!(contents(&dst, 0, 5), b"hello");
    // Duplicate: re-ACKed, not delivered again (PSN-3).
    peer.send(peer.req(Opcode::SendOnly, 100, true), b"HELLO");
    assert_eq!(
        ack_of(&peer.expect().0),
        (Opcode::Acknowledge, 100, Syndrome::ACK, 1)
    );
    no_wc(&s.rcq, Duration::from_millis(30));
    assert_eq!(contents(&dst, 0, 5), b"hello");
    // Gap: one NAK PSN sequence error naming the expected PSN, then silence.
    peer.send(peer.req(Opcode::SendOnly, 103, true), b"x");
    assert_eq!(
        ack_of(&peer.expect().0),
        (Opcode::Acknowledge, 101, Syndrome::NakPsnSeqError, 1)
    );
    peer.send(peer.req(Opcode::SendOnly, 104, true), b"y");
    peer.send(peer.req(Opcode::SendOnly, 105, true), b"z");
    peer.silence();
    // Bad ICRC and garbage are dropped silently.
    let mut r = peer.req(Opcode::SendOnly, 101, true);
    r.bth.pad_count = 0;
    let mut b = vec![0u8; r.buffer_len(4)];
    let off = r.emit(&mut b).unwrap();
    b[off..off + 4].copy_from_slice(b"evil");
    peer.send_raw(&b); // ICRC left zero
    peer.send_raw(&[0xff; 3]);
    peer.send_raw(&[0x15; 40]);
    peer.silence();
    assert!(
        smc_softroce::stats(&s.dev)
            .unwrap()
            .rx_bad_icrc
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
    // The expected PSN still works; a 2-packet SEND without AckReq on the
    // first packet is acknowledged once, coalesced, at its end.
    let mut first = peer.req(Opcode::SendFirst, 101, false);
    first.bth.ack_req = false;
    peer.send(first, &[1u8; 1024]);
    peer.send(peer.req(Opcode::SendLast, 102, true), &[2u8; 10]);
    assert_eq!(
        ack_of(&peer.expect().0),
        (Opcode::Acknowledge, 102, Syndrome::ACK, 2)
    );
    let wc = wait_wc(&s.rcq, T);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (2, WcStatus::Success, 1034)
    );
    assert_eq!(contents(&dst, 1024, 1024), vec![1u8; 1024]);
    assert_eq!(contents(&dst, 2048, 10), vec![2u8; 10]);
    peer.silence();
}

#[test]
fn invalid_opcode_sequence_is_nakked() {
    let (s, peer) = setup(81);
    s.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: &[],
    })
    .unwrap();
    // SEG-8: a Middle without a First.
    peer.send(peer.req(Opcode::SendMiddle, 100, true), &[0u8; 1024]);
    assert_eq!(
        ack_of(&peer.expect().0),
        (Opcode::Acknowledge, 100, Syndrome::NakInvalidRequest, 0)
    );
    let wc = wait_wc(&s.rcq, T);
    assert_eq!(wc.status, WcStatus::WrFlushErr);
    assert_eq!(s.qp.state(), QpState::Err);
}

#[test]
fn read_and_atomic_duplicates_are_replayed() {
    let (s, peer) = setup(82);
    let mem = buf(8192);
    fill_pattern(&mem, 82);
    mem.write(4096, &7u64.to_ne_bytes());
    let mr =
        s.pd.reg_mr(
            &mem,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
        )
        .unwrap();
    let mut rd = peer.req(Opcode::ReadRequest, 100, false);
    rd.reth = Some(RethRepr {
        va: mr.addr(),
        rkey: mr.rkey(),
        dma_len: 2500,
    });
    peer.send(rd, &[]);
    let expect_read = |peer: &Peer, from: u32| {
        let ops = [
            Opcode::ReadResponseFirst,
            Opcode::ReadResponseMiddle,
            Opcode::ReadResponseLast,
        ];
        for k in from..3 {
            let (r, data) = peer.expect();
            assert_eq!((r.bth.opcode, r.bth.psn), (ops[k as usize], 100 + k));
            let off = k as usize * 1024;
            let len = (2500 - off).min(1024);
            assert_eq!(data, contents(&mem, off, len));
            assert_eq!(r.aeth.is_some(), k != 1);
        }
    };
    expect_read(&peer, 0);
    // Duplicate READ from the middle: re-executed from PSN 101 on.
    let mut rd2 = peer.req(Opcode::ReadRequest, 101, false);
    rd2.reth = Some(RethRepr {
        va: mr.addr() + 1024,
        rkey: mr.rkey(),
        dma_len: 1476,
    });
    peer.send(rd2, &[]);
    expect_read(&peer, 1);
    // Fetch-add, then its duplicate: same original value, added once.
    let mut fa = peer.req(Opcode::FetchAdd, 103, false);
    fa.atomic = Some(AtomicEthRepr {
        va: mr.addr() + 4096,
        rkey: mr.rkey(),
        swap_add: 5,
        compare: 0,
    });
    for _ in 0..2 {
        peer.send(fa, &[]);
        let (r, _) = peer.expect();
        assert_eq!(
            (r.bth.opcode, r.bth.psn, r.atomic_ack),
            (Opcode::AtomicAcknowledge, 103, Some(7))
        );
    }
    assert_eq!(
        u64::from_ne_bytes(contents(&mem, 4096, 8).try_into().unwrap()),
        12
    );
    peer.silence();
}

/// Our QP as requester against the scripted peer as responder.
fn data_packets(peer: &Peer, n: usize) -> Vec<(PacketRepr, Vec<u8>)> {
    (0..n).map(|_| peer.expect()).collect()
}

fn ack(peer: &Peer, psn: u32, syndrome: Syndrome, msn: u32) -> PacketRepr {
    let mut r = peer.req(Opcode::Acknowledge, psn, false);
    r.aeth = Some(AethRepr { syndrome, msn });
    r
}

#[test]
fn requester_go_back_n_rnr_and_completion() {
    let (s, peer) = setup(83);
    let src = buf(4096);
    fill_pattern(&src, 83);
    let mr = s.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE).unwrap();
    s.qp.post_send(&SendWr {
        wr_id: 9,
        op: SendOp::Send,
        sg_list: &[mr.sge(0, 3000)],
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    let first = data_packets(&peer, 3);
    let ops: Vec<_> = first
        .iter()
        .map(|(r, _)| (r.bth.opcode, r.bth.psn, r.bth.ack_req))
        .collect();
    assert_eq!(
        ops,
        [
            (Opcode::SendFirst, 500, false),
            (Opcode::SendMiddle, 501, false),
            (Opcode::SendLast, 502, true)
        ]
    );
    assert_eq!(first[2].1.len(), 3000 - 2048);
    // NAK PSN sequence error at 501: go back to 501 (RTY-4).
    peer.send(ack(&peer, 501, Syndrome::NakPsnSeqError, 0), &[]);
    let again = data_packets(&peer, 2);
    assert_eq!(
        (again[0].0.bth.opcode, again[0].0.bth.psn),
        (Opcode::SendMiddle, 501)
    );
    assert_eq!(again[0].1, first[1].1);
    assert_eq!(
        (again[1].0.bth.opcode, again[1].0.bth.psn),
        (Opcode::SendLast, 502)
    );
    // RNR NAK at 501 with timer code 14 (1.28 ms): retransmission only after it (RTY-2).
    let t0 = std::time::Instant::now();
    peer.send(ack(&peer, 501, Syndrome::RnrNak { timer: 14 }, 0), &[]);
    let after_rnr = data_packets(&peer, 2);
    assert!(
        t0.elapsed() >= Duration::from_micros(1280),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(after_rnr[0].0.bth.psn, 501);
    no_wc(&s.scq, Duration::from_millis(5));
    // A stale ACK (before the window) changes nothing; the right one completes.
    peer.send(ack(&peer, 400, Syndrome::ACK, 0), &[]);
    no_wc(&s.scq, Duration::from_millis(5));
    peer.send(ack(&peer, 502, Syndrome::ACK, 1), &[]);
    let wc = wait_wc(&s.scq, T);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (9, WcStatus::Success, WcOpcode::Send)
    );
    peer.silence();
}

#[test]
fn malformed_read_response_is_a_bad_response() {
    let (s, peer) = setup(84);
    let local = buf(4096);
    let mr = s.pd.reg_mr(&local, AccessFlags::LOCAL_WRITE).unwrap();
    s.qp.post_send(&SendWr {
        wr_id: 3,
        op: SendOp::RdmaRead {
            remote_addr: 0xabc000,
            rkey: 0x42,
        },
        sg_list: &[mr.sge(0, 2000)],
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    let (req, _) = peer.expect();
    assert_eq!(req.bth.opcode, Opcode::ReadRequest);
    assert_eq!(
        req.reth,
        Some(RethRepr {
            va: 0xabc000,
            rkey: 0x42,
            dma_len: 2000
        })
    );
    // First response of the right PSN but a short payload.
    let mut r = peer.req(Opcode::ReadResponseFirst, req.bth.psn, false);
    r.aeth = Some(AethRepr {
        syndrome: Syndrome::ACK,
        msn: 1,
    });
    peer.send(r, &[0u8; 100]);
    let wc = wait_wc(&s.scq, T);
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::BadRespErr));
    assert_eq!(s.qp.state(), QpState::Err);
}

/// Item 6: a duplicate READ after the region was deregistered is not
/// replayed from the saved reference: the rkey is looked up again (as rxe
/// re-checks the MR) and the answer is NAK Remote Access Error.
#[test]
fn duplicate_read_after_deregistration_is_refused() {
    let (s, peer) = setup(85);
    let mem = buf(4096);
    fill_pattern(&mem, 85);
    let mr =
        s.pd.reg_mr(&mem, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
            .unwrap();
    let mut rd = peer.req(Opcode::ReadRequest, 100, false);
    rd.reth = Some(RethRepr {
        va: mr.addr(),
        rkey: mr.rkey(),
        dma_len: 2000,
    });
    peer.send(rd, &[]);
    for (op, psn) in [
        (Opcode::ReadResponseFirst, 100),
        (Opcode::ReadResponseLast, 101),
    ] {
        let (r, _) = peer.expect();
        assert_eq!((r.bth.opcode, r.bth.psn), (op, psn));
    }
    drop(mr);
    peer.send(rd, &[]);
    let (r, data) = peer.expect();
    assert!(data.is_empty(), "data of a deregistered region was sent");
    assert_eq!(
        ack_of(&r),
        (Opcode::Acknowledge, 100, Syndrome::NakRemoteAccessError, 1)
    );
    peer.silence();
    assert_eq!(s.qp.state(), QpState::Err);
}

/// Item 6: a multi-packet WRITE whose region is deregistered after its
/// first packet places nothing more: the next packet is answered with NAK
/// Remote Access Error.
#[test]
fn write_in_progress_stops_at_deregistration() {
    let (s, peer) = setup(86);
    let mem = buf(4096);
    let mr =
        s.pd.reg_mr(&mem, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    let mut first = peer.req(Opcode::WriteFirst, 100, true);
    first.reth = Some(RethRepr {
        va: mr.addr(),
        rkey: mr.rkey(),
        dma_len: 3000,
    });
    peer.send(first, &[0x11; 1024]);
    assert_eq!(
        ack_of(&peer.expect().0),
        (Opcode::Acknowledge, 100, Syndrome::ACK, 0)
    );
    drop(mr);
    peer.send(peer.req(Opcode::WriteMiddle, 101, true), &[0x22; 1024]);
    assert_eq!(
        ack_of(&peer.expect().0),
        (Opcode::Acknowledge, 101, Syndrome::NakRemoteAccessError, 0)
    );
    assert_eq!(contents(&mem, 0, 1024), vec![0x11; 1024]);
    assert_eq!(contents(&mem, 1024, 2048), vec![0; 2048]);
    peer.send(peer.req(Opcode::WriteLast, 102, true), &[0x33; 952]);
    peer.silence();
    assert_eq!(contents(&mem, 2048, 952), vec![0; 952]);
    assert_eq!(s.qp.state(), QpState::Err);
}

/// Item 6, receive side: a posted receive whose region was deregistered
/// takes no SEND data; the receive completes with a local protection error
/// and the peer gets NAK Remote Operational Error.
#[test]
fn receive_into_deregistered_region_is_refused() {
    let (s, peer) = setup(87);
    let mem = buf(4096);
    let mr = s.pd.reg_mr(&mem, AccessFlags::LOCAL_WRITE).unwrap();
    s.qp.post_recv(&RecvWr {
        wr_id: 5,
        sg_list: &[mr.sge(0, 64)],
    })
    .unwrap();
    drop(mr);
    peer.send(peer.req(Opcode::SendOnly, 100, true), b"intruder");
    assert_eq!(
        ack_of(&peer.expect().0),
        (
            Opcode::Acknowledge,
            100,
            Syndrome::NakRemoteOperationalError,
            0
        )
    );
    let wc = wait_wc(&s.rcq, T);
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::LocProtErr));
    assert_eq!(contents(&mem, 0, 8), vec![0; 8]);
    assert_eq!(s.qp.state(), QpState::Err);
}

/// Item 6, requester side: READ responses for a READ whose local target
/// region was deregistered are not placed; the READ completes with a
/// local protection error.
#[test]
fn read_response_into_deregistered_region_is_refused() {
    let (s, peer) = setup(88);
    let local = buf(4096);
    let mr = s.pd.reg_mr(&local, AccessFlags::LOCAL_WRITE).unwrap();
    s.qp.post_send(&SendWr {
        wr_id: 6,
        op: SendOp::RdmaRead {
            remote_addr: 0x1000,
            rkey: 0x42,
        },
        sg_list: &[mr.sge(0, 100)],
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    let (req, _) = peer.expect();
    assert_eq!(req.bth.opcode, Opcode::ReadRequest);
    drop(mr);
    let mut r = peer.req(Opcode::ReadResponseOnly, req.bth.psn, false);
    r.aeth = Some(AethRepr {
        syndrome: Syndrome::ACK,
        msn: 1,
    });
    peer.send(r, &[0xee; 100]);
    let wc = wait_wc(&s.scq, T);
    assert_eq!((wc.wr_id, wc.status), (6, WcStatus::LocProtErr));
    assert_eq!(contents(&local, 0, 100), vec![0; 100]);
    assert_eq!(s.qp.state(), QpState::Err);
}

/// `psns` must be `first, first + 1, ..` (`n` of them); the message names
/// the first packet out of place instead of printing a thousand PSNs.
fn assert_psns(psns: &[u32], first: u32, n: u32) {
    let bad = (0..n as usize).find(|&i| psns.get(i) != Some(&(first + i as u32)));
    assert!(
        bad.is_none() && psns.len() == n as usize,
        "{} READ responses before the next response, want {n}; first out of place at index {bad:?}: {:?}",
        psns.len(),
        bad.and_then(|i| psns.get(i))
    );
}

impl Peer {
    /// Room for a whole 1 MiB READ's responses (SO_RCVBUFFORCE needs root,
    /// as the test suite runs; else as much as rmem_max allows). Returns
    /// the READ length the buffer can hold without loss.
    fn room_for_long_read(&self) -> u32 {
        use rustix::net::sockopt;
        let want = 4 << 20;
        if sockopt::set_socket_recv_buffer_size_force(&self.sock, want).is_err() {
            let _ = sockopt::set_socket_recv_buffer_size(&self.sock, want);
        }
        let got = socket2::SockRef::from(&self.sock)
            .recv_buffer_size()
            .unwrap_or(0);
        // Each 1 KiB response costs about 2 KiB of socket buffer.
        if got >= 3 << 20 {
            1 << 20
        } else {
            128 << 10
        }
    }
}

/// Item 7 against the live device: a long READ (1 MiB, 1024 responses at
/// MTU 1024, many service passes) pipelined with two SENDs. Every READ
/// response leaves before any ACK (responses in PSN order, IBA §9.7.5.1.1),
/// and the SENDs are acknowledged after it.
#[test]
fn long_read_pipelined_with_sends_keeps_psn_order() {
    let (s, peer) = setup(89);
    let len = peer.room_for_long_read();
    let n = len / 1024;
    let mem = buf(len as usize);
    fill_pattern(&mem, 89);
    let mr =
        s.pd.reg_mr(&mem, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
            .unwrap();
    for i in 0..2 {
        s.qp.post_recv(&RecvWr {
            wr_id: i,
            sg_list: &[mr.sge(64 * i as usize, 64)],
        })
        .unwrap();
    }
    let mut rd = peer.req(Opcode::ReadRequest, 100, false);
    rd.reth = Some(RethRepr {
        va: mr.addr(),
        rkey: mr.rkey(),
        dma_len: len,
    });
    peer.send(rd, &[]);
    peer.send(peer.req(Opcode::SendOnly, 100 + n, true), b"one");
    peer.send(peer.req(Opcode::SendOnly, 101 + n, true), b"two");
    let mut got = Vec::new();
    loop {
        let (r, _) = peer.expect();
        let done = r.bth.opcode == Opcode::Acknowledge && r.bth.psn == 101 + n;
        got.push((r.bth.opcode, r.bth.psn, r.aeth.map(|a| a.syndrome)));
        if done {
            break;
        }
    }
    let reads: Vec<u32> = got
        .iter()
        .take_while(|g| g.0 != Opcode::Acknowledge)
        .map(|g| g.1)
        .collect();
    assert_psns(&reads, 100, n);
    for g in &got[n as usize..] {
        assert_eq!((g.0, g.2), (Opcode::Acknowledge, Some(Syndrome::ACK)));
    }
    peer.silence();
    assert_eq!(s.qp.state(), QpState::Rts);
}

/// Item 7 against the live device: a long READ followed by a WRITE with an
/// unknown R_Key. The READ is answered in full, then comes the NAK Remote
/// Access Error for the WRITE, and only then is the QP in ERR.
#[test]
fn long_read_then_fatal_request_keeps_psn_order() {
    let (s, peer) = setup(90);
    let len = peer.room_for_long_read();
    let n = len / 1024;
    let mem = buf(len as usize);
    let mr =
        s.pd.reg_mr(
            &mem,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let mut rd = peer.req(Opcode::ReadRequest, 100, false);
    rd.reth = Some(RethRepr {
        va: mr.addr(),
        rkey: mr.rkey(),
        dma_len: len,
    });
    peer.send(rd, &[]);
    let mut wr = peer.req(Opcode::WriteOnly, 100 + n, true);
    wr.reth = Some(RethRepr {
        va: mr.addr(),
        rkey: mr.rkey() ^ 0x100,
        dma_len: 4,
    });
    peer.send(wr, b"evil");
    let mut reads = Vec::new();
    let last = loop {
        let (r, _) = peer.expect();
        if r.bth.opcode == Opcode::Acknowledge {
            break r;
        }
        reads.push(r.bth.psn);
    };
    assert_psns(&reads, 100, n);
    assert_eq!(
        ack_of(&last),
        (
            Opcode::Acknowledge,
            100 + n,
            Syndrome::NakRemoteAccessError,
            1
        )
    );
    peer.silence();
    assert_eq!(s.qp.state(), QpState::Err);
}

/// Item 8: a message must fit the PSN window. IBA compares PSNs in a 2^23
/// window (CHECKLIST PSN-1); a 2 GiB message at path MTU 256 spans 2^23
/// PSNs, so a retransmission could not find its place in it (a lost packet
/// would hang the QP). post_send refuses messages of more than 2^22
/// packets; 1 GiB at MTU 256 (2^22 packets) is still fine.
#[test]
fn messages_beyond_the_psn_window_are_refused() {
    let (s, peer) = setup_mtu(91, Mtu::Mtu256);
    let big = buf(1 << 31);
    let mr = s.pd.reg_mr(&big, AccessFlags::LOCAL_WRITE).unwrap();
    let ops = [
        SendOp::RdmaRead {
            remote_addr: 0x1000,
            rkey: 0x42,
        },
        SendOp::RdmaWrite {
            remote_addr: 0x1000,
            rkey: 0x42,
        },
        SendOp::Send,
    ];
    for op in ops {
        let r = s.qp.post_send(&SendWr {
            wr_id: 1,
            op,
            sg_list: &[mr.sge(0, 1 << 31)],
            flags: SendFlags::SIGNALED,
        });
        assert!(
            matches!(r, Err(VerbsError::InvalidArgument(_))),
            "{op:?} of 2 GiB at MTU 256: {r:?}"
        );
    }
    peer.silence();
    s.qp.post_send(&SendWr {
        wr_id: 2,
        op: ops[0],
        sg_list: &[mr.sge(0, 1 << 30)],
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    let (r, _) = peer.expect();
    assert_eq!(r.bth.opcode, Opcode::ReadRequest);
    assert_eq!(r.reth.map(|x| x.dma_len), Some(1 << 30));
}

/// Item 8: every QP sends from a UDP source port of its own (not 4791),
/// as Linux rxe does, so ECMP can spread QPs over paths; the destination
/// stays 4791, and the port is stable for the QP. The peer's own packets
/// come from an ephemeral port and are answered all the same (a RoCEv2
/// receiver takes any source port).
#[test]
fn each_qp_sends_from_its_own_source_port() {
    let (s, peer) = setup(92);
    assert_ne!(peer.tx.local_addr().unwrap().port(), 4791);
    let qp2 =
        s.pd.create_qp(&QpInitAttr {
            send_cq: s.scq.clone(),
            recv_cq: s.rcq.clone(),
            cap: Opts::default().cap,
            sq_sig_all: false,
        })
        .unwrap();
    qp2.modify_to_init(&InitAttr::default()).unwrap();
    qp2.modify_to_rtr(&RtrAttr {
        path_mtu: Mtu::Mtu1024,
        dest_qpn: PEER_QPN + 1,
        rq_psn: 0,
        ah: AddressHandle::to_gid(Gid::from_ip(IpAddr::V4(peer.me))),
        max_dest_rd_atomic: 1,
        min_rnr_timer: 1,
    })
    .unwrap();
    qp2.modify_to_rts(&RtsAttr {
        sq_psn: 0,
        timeout: 16,
        ..RtsAttr::default()
    })
    .unwrap();
    let mem = buf(4096);
    let mr = s.pd.reg_mr(&mem, AccessFlags::LOCAL_WRITE).unwrap();
    let send = |qp: &Qp| {
        qp.post_send(&SendWr {
            wr_id: 1,
            op: SendOp::Send,
            sg_list: &[mr.sge(0, 16)],
            flags: SendFlags::empty(),
        })
        .unwrap();
        let (r, _, port) = peer.recv_from().expect("no packet from the DUT");
        (r.bth.dest_qp, port)
    };
    let (q1, p1) = send(&s.qp);
    let (q2, p2) = send(&qp2);
    let (q1b, p1b) = send(&s.qp);
    assert_eq!((q1, q2, q1b), (PEER_QPN, PEER_QPN + 1, PEER_QPN));
    assert!(p1 != 4791 && p2 != 4791, "source ports {p1} {p2}");
    assert_ne!(p1, p2, "two QPs share a source port");
    assert_eq!(p1, p1b, "a QP changed its source port");
    // The DUT takes our requests from an ephemeral port and answers to 4791.
    peer.send(peer.req(Opcode::SendOnly, 100, true), b"x");
    assert_eq!(
        ack_of(&peer.expect().0),
        (Opcode::Acknowledge, 100, Syndrome::RnrNak { timer: 3 }, 0)
    );
}
