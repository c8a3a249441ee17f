//! A scripted raw attacker (issue 10, malicious peers) against a live
//! device that carries another, verified transfer at the same time.
//!
//! The device under test (127.86.93.1) holds one QP connected to a
//! legitimate peer device (127.86.93.2), over which round after round of
//! 16 MiB RDMA WRITEs is placed and checked by SHA-256, and several victim
//! QPs connected to the attacker (127.86.93.3), which speaks raw RoCEv2 over
//! UDP with valid ICRCs. Every attack gets its IBA-defined outcome, and
//! none touches another QP:
//!
//! | attack | outcome |
//! |---|---|
//! | packets for the transfer QPs (WRITE at the expected PSN, NAKs) from the attacker's address | dropped unprocessed, counted (`rx_foreign`) |
//! | PSN far ahead of the expected one | one NAK PSN Sequence Error, then silence (PSN-4) |
//! | PSN far behind (duplicate region) | re-ACKed, not executed again (PSN-3) |
//! | Middle without First | NAK Invalid Request, that QP to ERR (SEG-8) |
//! | payload above the path MTU / First shorter than the MTU | NAK Invalid Request, QP to ERR (SEG-7) |
//! | R_Key of another PD (the transfer's region) | NAK Remote Access Error, QP to ERR, memory untouched (RK-C1 (b)) |
//! | misaligned atomic | NAK Invalid Request, QP to ERR (RK-C1 (e)) |
//! | READ/atomic beyond `max_dest_rd_atomic` | NAK Invalid Request, QP to ERR (C.7) |
//! | responses for requests never sent | ignored |
//! | bad ICRC, unknown opcode, truncated, unknown QPN | dropped silently, counted |

mod common;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use common::*;
use sha2::{Digest, Sha256};
use smc_softroce::icrc::{self, IpInfo, IPV4_DF};
use smc_softroce::wire::*;
use smc_softroce::Config;
use smc_verbs::*;

const NET: u8 = 93;
const ATTACKER_QPN: u32 = 0x4242;
/// PSN the transfer's requester starts at.
const TRANSFER_PSN: u32 = 5000;
const LEN: usize = 16 << 20;
const CHUNK: usize = 1 << 20;
/// PSNs one round uses: 16 WRITEs of 256 packets (MTU 4096) + 1 SEND.
const ROUND_PSNS: u32 = (LEN / 4096) as u32 + 1;

/// Raw RoCEv2 over UDP: receives on `me:4791`, sends from an ephemeral
/// port with ICRCs computed for the real addresses and ports.
struct Raw {
    rx: UdpSocket,
    tx: UdpSocket,
    me: Ipv4Addr,
    dut: Ipv4Addr,
}

impl Raw {
    fn new(me: Ipv4Addr, dut: Ipv4Addr) -> Raw {
        let rx = UdpSocket::bind(SocketAddr::new(IpAddr::V4(me), 4791)).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let tx = UdpSocket::bind(SocketAddr::new(IpAddr::V4(me), 0)).unwrap();
        Raw { rx, tx, me, dut }
    }
    /// The UDP payload of `repr` + `payload` with a valid ICRC for `dst`.
    fn build_for(&self, dst: Ipv4Addr, mut repr: PacketRepr, payload: &[u8]) -> Vec<u8> {
        repr.bth.pad_count = pad_for(payload.len()) as u8;
        let mut b = vec![0u8; repr.buffer_len(payload.len())];
        let off = repr.emit(&mut b).unwrap();
        b[off..off + payload.len()].copy_from_slice(payload);
        let ip = IpInfo::V4 {
            src: self.me,
            dst,
            id: 0,
            flags_frag: IPV4_DF,
        };
        icrc::fill(&ip, self.tx.local_addr().unwrap().port(), 4791, &mut b);
        b
    }
    fn build(&self, repr: PacketRepr, payload: &[u8]) -> Vec<u8> {
        self.build_for(self.dut, repr, payload)
    }
    fn send(&self, repr: PacketRepr, payload: &[u8]) {
        self.send_bytes(&self.build(repr, payload));
    }
    /// Sends to another device than the one under test.
    fn send_to(&self, dst: Ipv4Addr, repr: PacketRepr, payload: &[u8]) {
        let b = self.build_for(dst, repr, payload);
        self.tx
            .send_to(&b, SocketAddr::new(IpAddr::V4(dst), 4791))
            .unwrap();
    }
    fn send_bytes(&self, b: &[u8]) {
        self.tx
            .send_to(b, SocketAddr::new(IpAddr::V4(self.dut), 4791))
            .unwrap();
    }
    /// Room for a few MiB of READ responses without loss (SO_RCVBUFFORCE
    /// needs root, as the test suite runs); false if the kernel refuses.
    fn big_rcvbuf(&self) -> bool {
        rustix::net::sockopt::set_socket_recv_buffer_size_force(&self.rx, 16 << 20).is_ok()
    }
    fn recv(&self) -> Option<PacketRepr> {
        let mut b = [0u8; 8192];
        let (n, from) = self.rx.recv_from(&mut b).ok()?;
        assert_eq!(from.ip(), IpAddr::V4(self.dut));
        Some(
            PacketRepr::parse(&b[..n])
                .expect("the device sent a malformed packet")
                .repr,
        )
    }
    /// The next answer: (opcode, PSN, syndrome).
    fn expect(&self) -> (Opcode, u32, Syndrome) {
        let r = self.recv().expect("no answer from the device");
        (r.bth.opcode, r.bth.psn, r.aeth.expect("AETH").syndrome)
    }
    fn silence(&self) {
        self.rx
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        if let Some(r) = self.recv() {
            panic!("unexpected packet {r:?}");
        }
        self.rx
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
    }
}

fn req(dest_qp: u32, opcode: Opcode, psn: u32) -> PacketRepr {
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
            psn: psn & 0xff_ffff,
        },
        reth: None,
        aeth: None,
        imm: None,
        atomic: None,
        atomic_ack: None,
    }
}

fn with_reth(mut r: PacketRepr, va: u64, rkey: u32, len: u32) -> PacketRepr {
    r.reth = Some(RethRepr {
        va,
        rkey,
        dma_len: len,
    });
    r
}

fn sha(b: &RdmaBuffer) -> Vec<u8> {
    let mut v = vec![0u8; b.len()];
    b.read(0, &mut v);
    Sha256::digest(&v).to_vec()
}

/// A QP of the device under test connected to the attacker, with its own
/// PD, path MTU 1024, expecting PSN 100, one posted 4 KiB receive, and a
/// region of `mem` bytes with every access.
fn victim(dev: &Device, me: Ipv4Addr, mem: usize) -> (Side, Mr) {
    let o = Opts {
        mtu: Mtu::Mtu1024,
        ..Opts::default()
    };
    let s = side(dev, &o, 700);
    s.qp.modify_to_rtr(&RtrAttr {
        path_mtu: Mtu::Mtu1024,
        dest_qpn: ATTACKER_QPN,
        rq_psn: 100,
        ah: AddressHandle::to_gid(Gid::from_ip(IpAddr::V4(me))),
        max_dest_rd_atomic: 1,
        min_rnr_timer: 1,
    })
    .unwrap();
    s.qp.modify_to_rts(&RtsAttr {
        sq_psn: 700,
        timeout: 16,
        ..o.rts
    })
    .unwrap();
    let mem = buf(mem);
    let mr =
        s.pd.reg_mr(
            &mem,
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        )
        .unwrap();
    s.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: &[mr.sge(0, 4096)],
    })
    .unwrap();
    (s, mr)
}

fn stat(dev: &Device, f: impl Fn(&smc_softroce::Stats) -> &std::sync::atomic::AtomicU64) -> u64 {
    f(smc_softroce::stats(dev).unwrap()).load(Ordering::Relaxed)
}

/// Rounds of 16 MiB RDMA WRITE from the peer into the device under test,
/// each ended by a SEND; after each, the device's copy is checked by
/// SHA-256. Runs until `stop` (at least two rounds). Publishes the PSN the
/// next round starts at, so that the attacker can forge packets exactly
/// where the device expects the next one.
fn transfer(dut: &Side, peer: &Side, stop: &AtomicBool, next_psn: &AtomicU32) -> u32 {
    let dst = buf(LEN);
    let dmr = dut
        .pd
        .reg_mr(&dst, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let src = buf(LEN);
    let smr = peer.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE).unwrap();
    let ctl = buf(4096);
    let cmr = dut.pd.reg_mr(&ctl, AccessFlags::LOCAL_WRITE).unwrap();
    let mut round = 0u32;
    while round < 2 || !stop.load(Ordering::Acquire) {
        fill_pattern(&src, round as u8);
        let want = sha(&src);
        dut.qp
            .post_recv(&RecvWr {
                wr_id: round as u64,
                sg_list: &[cmr.sge(0, 64)],
            })
            .unwrap();
        for i in 0..LEN / CHUNK {
            peer.qp
                .post_send(&SendWr {
                    wr_id: i as u64,
                    op: SendOp::RdmaWrite {
                        remote_addr: dmr.addr() + (i * CHUNK) as u64,
                        rkey: dmr.rkey(),
                    },
                    sg_list: &[smr.sge(i * CHUNK, CHUNK as u32)],
                    flags: SendFlags::empty(),
                })
                .unwrap();
        }
        peer.qp
            .post_send(&SendWr {
                wr_id: 99,
                op: SendOp::Send,
                sg_list: &[],
                flags: SendFlags::SIGNALED,
            })
            .unwrap();
        let wc = wait_wc(&peer.scq, BIG);
        assert_eq!(wc.status, WcStatus::Success, "round {round}: {wc:?}");
        let wc = wait_wc(&dut.rcq, BIG);
        assert_eq!(wc.status, WcStatus::Success, "round {round}: {wc:?}");
        assert_eq!(sha(&dst), want, "round {round}: the transfer was corrupted");
        round += 1;
        next_psn.store(
            (TRANSFER_PSN + round * ROUND_PSNS) & 0xff_ffff,
            Ordering::Release,
        );
    }
    round
}

const BIG: Duration = Duration::from_secs(60);

#[test]
fn scripted_attacker_cannot_touch_another_transfer() {
    let cfg = Config::default();
    let d = device(NET, 1, &cfg);
    let p = device(NET, 2, &cfg);
    // A local ACK timeout of 268 ms: the point is isolation, not how fast
    // go-back-N recovers on a loaded machine.
    let o = Opts {
        rts: RtsAttr {
            timeout: 16,
            ..Opts::default().rts
        },
        ..Opts::default()
    };
    let dut = side(&d, &o, 1);
    let peer = side(&p, &o, TRANSFER_PSN);
    connect(&dut, &peer, &o);
    let me = Ipv4Addr::new(127, 86, NET, 3);
    let atk = Raw::new(me, Ipv4Addr::new(127, 86, NET, 1));
    let peer_ip = Ipv4Addr::new(127, 86, NET, 2);
    // A region in the transfer QP's PD, for the other-PD attack.
    let transfer_mem = buf(4096);
    let tmr = dut
        .pd
        .reg_mr(
            &transfer_mem,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    let stop = AtomicBool::new(false);
    let next_psn = AtomicU32::new(TRANSFER_PSN);
    let mut forged = 0u64;
    /// Stops the transfer when the attack phase ends, also by a failed assertion: the
    /// scope joins the transfer thread, which would otherwise loop for ever and turn a
    /// failure into a hang (seen once in CI).
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }
    let rounds = std::thread::scope(|s| {
        let t = s.spawn(|| transfer(&dut, &peer, &stop, &next_psn));
        let _stop = StopOnDrop(&stop);
        // 1. Forgeries aimed at the transfer, from the attacker's address:
        //    a WRITE at exactly the PSN the device expects next (executed,
        //    it would make the peer's real packet a duplicate and corrupt
        //    the round), and NAKs that would fail the peer's WRITEs.
        let forge = |forged: &mut u64| {
            for _ in 0..200 {
                let psn = next_psn.load(Ordering::Acquire);
                let w = with_reth(
                    req(dut.qp.qpn(), Opcode::WriteOnly, psn),
                    tmr.addr(),
                    tmr.rkey(),
                    64,
                );
                atk.send(w, &[0xee; 64]);
                let mut nak = req(peer.qp.qpn(), Opcode::Acknowledge, psn + 1);
                nak.aeth = Some(AethRepr {
                    syndrome: Syndrome::NakRemoteAccessError,
                    msn: 0,
                });
                atk.send_to(peer_ip, nak, &[]);
                *forged += 1;
                std::thread::yield_now();
            }
        };
        forge(&mut forged);

        // 2. PSN far ahead: one NAK sequence error, then silence; far
        //    behind: a duplicate, re-ACKed and not delivered.
        let (v1, _m1) = victim(&d, me, 8192);
        let q1 = v1.qp.qpn();
        atk.send(req(q1, Opcode::SendOnly, 100 + (1 << 22)), b"ahead");
        assert_eq!(
            atk.expect(),
            (Opcode::Acknowledge, 100, Syndrome::NakPsnSeqError)
        );
        atk.send(req(q1, Opcode::SendOnly, 100 + (1 << 23) - 1), b"ahead");
        atk.silence();
        atk.send(req(q1, Opcode::SendOnly, 100), b"hello");
        assert_eq!(atk.expect(), (Opcode::Acknowledge, 100, Syndrome::ACK));
        let wc = wait_wc(&v1.rcq, T);
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 5));
        atk.send(
            req(q1, Opcode::SendOnly, 100 + (1 << 24) - (1 << 22)),
            b"behind",
        );
        assert_eq!(atk.expect(), (Opcode::Acknowledge, 100, Syndrome::ACK));
        no_wc(&v1.rcq, Duration::from_millis(20));
        // Responses for requests v1 never sent change nothing.
        let mut ack = req(q1, Opcode::Acknowledge, 777);
        ack.aeth = Some(AethRepr {
            syndrome: Syndrome::ACK,
            msn: 9,
        });
        atk.send(ack, &[]);
        let mut rsp = req(q1, Opcode::ReadResponseOnly, 700);
        rsp.aeth = ack.aeth;
        atk.send(rsp, &[1; 16]);
        atk.silence();
        assert_eq!(v1.qp.state(), QpState::Rts);
        no_wc(&v1.scq, Duration::from_millis(1));

        // 3. Opcode sequence: a Middle without a First.
        let (v2, _m2) = victim(&d, me, 8192);
        atk.send(req(v2.qp.qpn(), Opcode::SendMiddle, 100), &[0; 1024]);
        assert_eq!(
            atk.expect(),
            (Opcode::Acknowledge, 100, Syndrome::NakInvalidRequest)
        );
        // 4. Payload above the path MTU.
        let (v3, _m3) = victim(&d, me, 8192);
        atk.send(req(v3.qp.qpn(), Opcode::SendOnly, 100), &[0; 2048]);
        assert_eq!(
            atk.expect(),
            (Opcode::Acknowledge, 100, Syndrome::NakInvalidRequest)
        );
        // 5. A First shorter than the path MTU.
        let (v4, _m4) = victim(&d, me, 8192);
        atk.send(req(v4.qp.qpn(), Opcode::SendFirst, 100), &[0; 100]);
        assert_eq!(
            atk.expect(),
            (Opcode::Acknowledge, 100, Syndrome::NakInvalidRequest)
        );
        // 6. The R_Key of the transfer QP's PD, at its region.
        let (v5, _m5) = victim(&d, me, 8192);
        let w = with_reth(
            req(v5.qp.qpn(), Opcode::WriteOnly, 100),
            tmr.addr(),
            tmr.rkey(),
            16,
        );
        atk.send(w, &[0xee; 16]);
        assert_eq!(
            atk.expect(),
            (Opcode::Acknowledge, 100, Syndrome::NakRemoteAccessError)
        );
        let mut rd = req(v5.qp.qpn(), Opcode::ReadRequest, 101);
        rd = with_reth(rd, tmr.addr(), tmr.rkey(), 16);
        atk.send(rd, &[]);
        atk.silence(); // v5 is in ERR: nothing more is answered
                       // 7. A misaligned atomic.
        let (v6, m6) = victim(&d, me, 8192);
        let mut fa = req(v6.qp.qpn(), Opcode::FetchAdd, 100);
        fa.atomic = Some(AtomicEthRepr {
            va: m6.addr() + 4,
            rkey: m6.rkey(),
            swap_add: 1,
            compare: 0,
        });
        atk.send(fa, &[]);
        assert_eq!(
            atk.expect(),
            (Opcode::Acknowledge, 100, Syndrome::NakInvalidRequest)
        );
        // 8. Two READs where one responder resource was granted: the first
        //    (2 MiB, 2048 responses, many service passes) still streams when
        //    the second arrives. (The harness test
        //    responder_resources_are_enforced proves it deterministically.)
        let (v7, m7) = victim(&d, me, 2 << 20);
        let q7 = v7.qp.qpn();
        let big_read = atk.big_rcvbuf();
        if big_read {
            let first = with_reth(
                req(q7, Opcode::ReadRequest, 100),
                m7.addr(),
                m7.rkey(),
                2 << 20,
            );
            let second = with_reth(req(q7, Opcode::ReadRequest, 2148), m7.addr(), m7.rkey(), 8);
            atk.send(first, &[]);
            atk.send(second, &[]);
            for psn in 100..2148 {
                let r = atk.recv().expect("READ response");
                assert_eq!(
                    (r.bth.opcode != Opcode::Acknowledge, r.bth.psn),
                    (true, psn)
                );
            }
            // Rejected while the first still streams (NAK Invalid Request); if the
            // engine finished the first before it took the second from the socket, the
            // resource is free again and the second is answered — also right (the
            // deterministic proof is responder_resources_are_enforced). Seen in CI.
            let second = atk.expect();
            assert!(
                second == (Opcode::Acknowledge, 2148, Syndrome::NakInvalidRequest)
                    || (second.0 == Opcode::ReadResponseOnly && second.1 == 2148),
                "{second:?}"
            );
            if second.0 == Opcode::ReadResponseOnly {
                // Not an error for the victim: end it as the NAK would have.
                v7.qp.modify_to_err().unwrap();
            }
        } else {
            eprintln!("skipping the responder-resources attack: SO_RCVBUFFORCE refused (not root)");
            v7.qp.modify_to_err().unwrap();
        }
        // 9. Garbage: bad ICRC, unknown opcode, truncated, unknown QPN.
        let mut bad = atk.build(req(v1.qp.qpn(), Opcode::SendOnly, 101), b"x");
        let n = bad.len();
        bad[n - 1] ^= 0xff;
        atk.send_bytes(&bad);
        let mut unknown = atk.build(req(v1.qp.qpn(), Opcode::SendOnly, 101), b"x");
        unknown[0] = 0x15;
        atk.send_bytes(&unknown);
        atk.send_bytes(&unknown[..7]);
        atk.send(req(0x00ff_fffe, Opcode::SendOnly, 101), b"x");
        atk.silence();

        forge(&mut forged);
        for (v, st) in [
            (&v1, QpState::Rts),
            (&v2, QpState::Err),
            (&v3, QpState::Err),
            (&v4, QpState::Err),
            (&v5, QpState::Err),
            (&v6, QpState::Err),
            (&v7, QpState::Err),
        ] {
            assert_eq!(v.qp.state(), st, "victim QP {:#x}", v.qp.qpn());
        }
        stop.store(true, Ordering::Release);
        t.join().unwrap()
    });
    assert!(rounds >= 2);
    assert_eq!(dut.qp.state(), QpState::Rts);
    assert_eq!(peer.qp.state(), QpState::Rts);
    assert_eq!(
        contents(&transfer_mem, 0, 4096),
        vec![0; 4096],
        "the attacker wrote into the transfer's PD"
    );
    // Forged packets were dropped and counted on both devices (the kernel
    // may drop some of a burst before they reach the socket).
    let foreign_d = stat(&d, |s| &s.rx_foreign);
    let foreign_p = stat(&p, |s| &s.rx_foreign);
    assert!(
        (1..=forged).contains(&foreign_d) && (1..=forged).contains(&foreign_p),
        "forged {forged}, counted {foreign_d} at the device, {foreign_p} at the peer"
    );
    assert!(stat(&d, |s| &s.rx_bad_icrc) >= 1);
    assert!(stat(&d, |s| &s.rx_malformed) >= 2);
    assert!(stat(&d, |s| &s.rx_unknown_qp) >= 1);
}
