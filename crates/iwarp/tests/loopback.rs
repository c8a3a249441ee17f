//! Two iWARP endpoints of ours over loopback TCP: every operation, RFC 6581 negotiation
//! over the wire, protection checks, and a connection cut mid-transfer.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use smc_iwarp::cm::{CmError, ConnParams};
use smc_iwarp::negotiate::{ReadParams, Rtr};
use smc_iwarp::wire::mpa::{RtrSet, IRD_ORD_NO_LIMIT};
use smc_iwarp::Config;
use smc_verbs::{AccessFlags, QpState, RecvWr, SendFlags, SendOp, SendWr, WcOpcode, WcStatus};

fn send_wr(wr_id: u64, op: SendOp, sges: &[smc_verbs::Sge]) -> SendWr<'_> {
    SendWr {
        wr_id,
        op,
        sg_list: sges,
        flags: SendFlags::SIGNALED,
    }
}

#[test]
fn send_write_read_data_checked() {
    let c = ep(8 << 20);
    let s = ep(8 << 20);
    let (cc, sc) = pair(&c, &s);
    assert_eq!((cc.rev, sc.rev), (2, 2));
    assert!(cc.enhanced && sc.enhanced && !cc.p2p);
    // SEND of 300 KiB (several FPDUs), solicited
    let data = pattern(1, 300 * 1024);
    c.buf.write(0, &data);
    s.qp.post_recv(&RecvWr {
        wr_id: 7,
        sg_list: &[s.mr.sge(0, 1 << 20)],
    })
    .unwrap();
    let sg = [c.mr.sge(0, data.len() as u32)];
    c.qp.post_send(&SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sg_list: &sg,
        flags: SendFlags::SIGNALED | SendFlags::SOLICITED,
    })
    .unwrap();
    assert_eq!(wait_ok(&c.scq, "send").opcode, WcOpcode::Send);
    let r = wait_ok(&s.rcq, "recv");
    assert_eq!(
        (r.wr_id, r.byte_len, r.solicited),
        (7, data.len() as u32, true)
    );
    assert_eq!(read_back(&s, 0, data.len()), data);

    // RDMA WRITE of 1 MiB + 3 bytes at an odd offset, then READ it back elsewhere.
    let w = pattern(2, (1 << 20) + 3);
    c.buf.write(1 << 20, &w);
    let sg = [c.mr.sge(1 << 20, w.len() as u32)];
    c.qp.post_send(&send_wr(
        2,
        SendOp::RdmaWrite {
            remote_addr: s.mr.addr() + 12345,
            rkey: s.mr.rkey(),
        },
        &sg,
    ))
    .unwrap();
    let sg_r = [c.mr.sge(3 << 20, w.len() as u32)];
    c.qp.post_send(&send_wr(
        3,
        SendOp::RdmaRead {
            remote_addr: s.mr.addr() + 12345,
            rkey: s.mr.rkey(),
        },
        &sg_r,
    ))
    .unwrap();
    // a WRITE after the READ completes after it (in-order SQ completions)
    let sg_w2 = [c.mr.sge(0, 16)];
    c.qp.post_send(&send_wr(
        4,
        SendOp::RdmaWrite {
            remote_addr: s.mr.addr(),
            rkey: s.mr.rkey(),
        },
        &sg_w2,
    ))
    .unwrap();
    let ids: Vec<_> = (0..3).map(|_| wait_ok(&c.scq, "wr")).collect();
    assert_eq!(
        ids.iter().map(|w| (w.wr_id, w.opcode)).collect::<Vec<_>>(),
        vec![
            (2, WcOpcode::RdmaWrite),
            (3, WcOpcode::RdmaRead),
            (4, WcOpcode::RdmaWrite)
        ]
    );
    assert_eq!(ids[1].byte_len, w.len() as u32);
    assert_eq!(read_back(&c, 3 << 20, w.len()), w);
    assert_eq!(read_back(&s, 12345, w.len()), w);
}

#[test]
fn bidirectional_reads_do_not_deadlock() {
    // Both sides READ 2 MiB from each other at once with small TCP buffers' worth of
    // responses in flight: the responses never wait behind the send queue.
    let a = ep(8 << 20);
    let b = ep(8 << 20);
    pair(&a, &b);
    a.buf.write(0, &pattern(3, 2 << 20));
    b.buf.write(0, &pattern(4, 2 << 20));
    for (x, y) in [(&a, &b), (&b, &a)] {
        for i in 0..4u64 {
            let sg = [x.mr.sge(4 << 20, 2 << 20)];
            x.qp.post_send(&send_wr(
                i,
                SendOp::RdmaRead {
                    remote_addr: y.mr.addr(),
                    rkey: y.mr.rkey(),
                },
                &sg,
            ))
            .unwrap();
        }
    }
    for _ in 0..4 {
        wait_ok(&a.scq, "a read");
        wait_ok(&b.scq, "b read");
    }
    assert_eq!(read_back(&a, 4 << 20, 2 << 20), pattern(4, 2 << 20));
    assert_eq!(read_back(&b, 4 << 20, 2 << 20), pattern(3, 2 << 20));
}

fn p2p(rtr: RtrSet) -> ConnParams {
    ConnParams {
        p2p: true,
        rtr,
        ..ConnParams::default()
    }
}

#[test]
fn tc_mpa_06_07_08_p2p_each_rtr_then_data() {
    for (offer, want) in [
        (
            RtrSet {
                send: true,
                ..RtrSet::NONE
            },
            Rtr::Send,
        ),
        (
            RtrSet {
                write: true,
                ..RtrSet::NONE
            },
            Rtr::Write,
        ),
        (
            RtrSet {
                read: true,
                ..RtrSet::NONE
            },
            Rtr::Read,
        ),
        (RtrSet::ALL, Rtr::Write),
    ] {
        let c = ep(1 << 16);
        let s = ep(1 << 16);
        // The responder posts its receive first: a Send RTR must not consume it (AMB-M5).
        s.qp.post_recv(&RecvWr {
            wr_id: 9,
            sg_list: &[s.mr.sge(0, 4096)],
        })
        .unwrap();
        let read0 = ConnParams {
            read: ReadParams {
                ord: 0,
                ..ReadParams::default()
            },
            ..p2p(offer)
        };
        let (cc, sc) = pair_with(&c, &s, &read0, &p2p(RtrSet::ALL));
        let (cc, sc) = (cc.unwrap(), sc.unwrap());
        assert_eq!(cc.rtr, Some(want), "offer {offer}");
        assert!(cc.p2p && sc.p2p, "TC-MPA-12: A echoed");
        if want == Rtr::Read {
            // IO-7: with initiator ORD 0 and only Read RTR, the responder's IRD is 1.
            assert_eq!(sc.ird, 1);
        }
        // The responder may send first now (peer-to-peer).
        c.qp.post_recv(&RecvWr {
            wr_id: 5,
            sg_list: &[c.mr.sge(0, 4096)],
        })
        .unwrap();
        s.buf.write(100, b"server first");
        let sg = [s.mr.sge(100, 12)];
        s.qp.post_send(&send_wr(1, SendOp::Send, &sg)).unwrap();
        wait_ok(&s.scq, "server send");
        let r = wait_ok(&c.rcq, "client recv");
        assert_eq!(r.byte_len, 12);
        assert_eq!(read_back(&c, 0, 12), b"server first");
        c.buf.write(200, b"client data");
        let sg = [c.mr.sge(200, 11)];
        c.qp.post_send(&send_wr(2, SendOp::Send, &sg)).unwrap();
        let r = wait_ok(&s.rcq, "server recv");
        assert_eq!(
            (r.wr_id, r.byte_len),
            (9, 11),
            "the RTR consumed no receive"
        );
    }
}

/// Reads one MPA frame off a raw socket.
fn read_frame(s: &mut TcpStream) -> Vec<u8> {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).unwrap();
    let n = u16::from_be_bytes([h[18], h[19]]) as usize;
    let mut v = h.to_vec();
    v.resize(20 + n, 0);
    s.read_exact(&mut v[20..]).unwrap();
    v
}

fn raw_request(flags: u8, rev: u8, pd: &[u8]) -> Vec<u8> {
    let mut v = b"MPA ID Req Frame".to_vec();
    v.push(flags);
    v.push(rev);
    v.extend_from_slice(&(pd.len() as u16).to_be_bytes());
    v.extend_from_slice(pd);
    v
}

fn fpdu(ulpdu: &[u8], crc: bool) -> Vec<u8> {
    let mut b = vec![0u8; ulpdu.len() + 12];
    let n = smc_iwarp::wire::mpa::emit_fpdu(&mut b, ulpdu, crc).unwrap();
    b.truncate(n);
    b
}

#[test]
fn tc_mpa_13_fencing_responder_waits_for_rtr() {
    let s = ep(1 << 16);
    let l = smc_iwarp::cm::Listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = addr_of(&l);
    let sqp = s.qp.clone();
    let t = std::thread::spawn(move || l.accept().unwrap().accept(&sqp, &p2p(RtrSet::ALL)));
    let mut raw = TcpStream::connect(addr).unwrap();
    // Request: A=1, C (Write RTR), IRD 1 ORD 1
    raw.write_all(&raw_request(0x10, 2, &[0x80, 0x01, 0x80, 0x01]))
        .unwrap();
    let rep = read_frame(&mut raw);
    assert_eq!(&rep[..16], b"MPA ID Rep Frame");
    assert_eq!(rep[16] & 0x30, 0x10, "S set, not rejected");
    assert_eq!(&rep[20..22], &[0x80, 0x01], "A echoed");
    assert_ne!(rep[22] & 0x80, 0, "Write RTR supported");
    t.join().unwrap().unwrap();
    // The responder posts a SEND: nothing may leave before the RTR.
    s.buf.write(0, b"early");
    let sg = [s.mr.sge(0, 5)];
    s.qp.post_send(&send_wr(1, SendOp::Send, &sg)).unwrap();
    raw.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut b = [0u8; 64];
    assert!(
        raw.read(&mut b).is_err(),
        "responder transmitted before the RTR"
    );
    // zero-length RDMA Write RTR: STag 0, TO 0
    raw.write_all(&fpdu(
        &[0xc1, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        false,
    ))
    .unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut len = [0u8; 2];
    raw.read_exact(&mut len).unwrap();
    let n = u16::from_be_bytes(len) as usize;
    let mut rest = vec![0u8; smc_iwarp::wire::mpa::fpdu_len(n) - 2];
    raw.read_exact(&mut rest).unwrap();
    assert_eq!(rest[1] & 0x0f, 3, "the Send follows the RTR");
    assert_eq!(&rest[18..23], b"early");
    wait_ok(&s.scq, "send after RTR");
}

#[test]
fn tc_mpa_14_25_16_rev1_and_unenhanced_requests() {
    for (flags, rev) in [(0x00u8, 1u8), (0x00, 2), (0x0f, 1)] {
        // 0x0f: Res bits set, ignored (TC-MPA-20)
        let s = ep(1 << 16);
        let l = smc_iwarp::cm::Listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = addr_of(&l);
        let sqp = s.qp.clone();
        let t =
            std::thread::spawn(move || l.accept().unwrap().accept(&sqp, &ConnParams::default()));
        let mut raw = TcpStream::connect(addr).unwrap();
        raw.write_all(&raw_request(flags, rev, b"hi")).unwrap();
        let rep = read_frame(&mut raw);
        let conn = t.join().unwrap().unwrap();
        assert_eq!(rep[16] & 0xf0, 0, "plain reply: no S, no R");
        assert_eq!(rep[17], rev);
        assert!(!conn.enhanced && conn.peer_private_data == b"hi");
    }
}

#[test]
fn tc_mpa_17_18_19_malformed_requests_closed() {
    for req in [
        raw_request(0x10, 1, &[0, 1, 0, 1]), // S with rev 1
        raw_request(0x10, 2, &[0, 1]),       // S with PD 2
        {
            let mut v = raw_request(0, 1, &[]);
            v[18..20].copy_from_slice(&513u16.to_be_bytes()); // PD 513
            v.extend_from_slice(&[0u8; 513]);
            v
        },
        raw_request(0, 3, &[]), // unknown revision
    ] {
        let l = smc_iwarp::cm::Listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = addr_of(&l);
        let t = std::thread::spawn(move || l.accept().map(|_| ()));
        let mut raw = TcpStream::connect(addr).unwrap();
        raw.write_all(&req).unwrap();
        assert!(matches!(t.join().unwrap(), Err(CmError::Protocol(_))));
        raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 8];
        assert!(
            matches!(raw.read(&mut b), Ok(0) | Err(_)),
            "closed, no reply"
        );
    }
}

#[test]
fn markers_refused_as_siw_does() {
    let c = ep(1 << 16);
    let s = ep(1 << 16);
    let cp = ConnParams {
        markers: true,
        ..ConnParams::default()
    };
    let (cr, sr) = pair_with(&c, &s, &cp, &ConnParams::default());
    assert!(matches!(cr, Err(CmError::Rejected { .. })), "{cr:?}");
    assert!(matches!(sr, Err(CmError::Refused(_))), "{sr:?}");
}

#[test]
fn crc_negotiated_and_checked() {
    let c = ep(1 << 16);
    let s = ep(1 << 16);
    let cp = ConnParams {
        crc: true,
        ..ConnParams::default()
    };
    let (cc, sc) = pair_with(&c, &s, &cp, &ConnParams::default());
    assert!(cc.unwrap().crc && sc.unwrap().crc, "responder echoes C");
    s.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: &[s.mr.sge(0, 8192)],
    })
    .unwrap();
    c.buf.write(0, &pattern(5, 5000));
    let sg = [c.mr.sge(0, 5000)];
    c.qp.post_send(&send_wr(1, SendOp::Send, &sg)).unwrap();
    assert_eq!(wait_ok(&s.rcq, "recv").byte_len, 5000);
    assert_eq!(read_back(&s, 0, 5000), pattern(5, 5000));

    // A scripted initiator that negotiates CRC and then sends a corrupt FPDU.
    let s = ep(1 << 16);
    let l = smc_iwarp::cm::Listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = addr_of(&l);
    let sqp = s.qp.clone();
    let t = std::thread::spawn(move || l.accept().unwrap().accept(&sqp, &ConnParams::default()));
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.write_all(&raw_request(0x40, 1, &[])).unwrap();
    let rep = read_frame(&mut raw);
    assert_ne!(rep[16] & 0x40, 0);
    t.join().unwrap().unwrap();
    let mut f = fpdu(&[0xc1, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], true);
    let last = f.len() - 1;
    f[last] ^= 0xff;
    raw.write_all(&f).unwrap();
    // The responder answers with Terminate LLP/MPA/CRC error (2/0/2) and closes.
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut t = Vec::new();
    let _ = raw.read_to_end(&mut t);
    assert!(t.len() >= 2 + 18 + 4, "got {t:?}");
    assert_eq!(t[3] & 0x0f, 7, "Terminate opcode");
    assert_eq!(&t[20..22], &[0x20, 0x02]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.qp.state() != QpState::Err {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(smc_iwarp::qp_error(&s.qp).unwrap().contains("CRC"));
}

#[test]
fn ird_ord_negotiated_over_the_wire() {
    let c = ep(1 << 16);
    let s = ep(1 << 16);
    let cp = ConnParams {
        read: ReadParams {
            ird: 3,
            ord: 20,
            ..ReadParams::default()
        },
        ..ConnParams::default()
    };
    let sp = ConnParams {
        read: ReadParams {
            ird: 4,
            ord: 8,
            max_ird: 6,
            required_ord: 0,
        },
        ..ConnParams::default()
    };
    let (cc, sc) = pair_with(&c, &s, &cp, &sp);
    let (cc, sc) = (cc.unwrap(), sc.unwrap());
    // responder: ORD <= initiator IRD (3); IRD = initiator ORD capped at its max (6)
    assert_eq!((sc.ird, sc.ord), (6, 3));
    // initiator: IRD >= responder ORD, ORD <= responder IRD (IO-9)
    assert_eq!((cc.ird, cc.ord), (3, 6));
    // both got the peer's values (IO-5)
    assert_eq!(sc.peer_ird_ord, Some((3, 20)));
    assert_eq!(cc.peer_ird_ord, Some((6, 3)));
}

#[test]
fn tc_mpa_04_insufficient_ird_terminates() {
    // A responder (scripted) whose ORD exceeds what the initiator can take as IRD (its
    // device allows 128 inbound Reads): the initiator sends TERM 2/0/6 and closes (IO-9).
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut a, _) = l.accept().unwrap();
        let f = read_frame(&mut a);
        assert_eq!(f[16] & 0x10, 0x10);
        let mut rep = b"MPA ID Rep Frame".to_vec();
        rep.extend_from_slice(&[0x10, 2, 0, 4]);
        rep.extend_from_slice(&1u16.to_be_bytes()); // IRD 1
        rep.extend_from_slice(&200u16.to_be_bytes()); // ORD 200
        a.write_all(&rep).unwrap();
        let mut term = Vec::new();
        a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = a.read_to_end(&mut term);
        term
    });
    let c = ep(1 << 16);
    let cp = ConnParams {
        read: ReadParams {
            ird: 4,
            ord: 1,
            ..ReadParams::default()
        },
        ..ConnParams::default()
    };
    match smc_iwarp::cm::connect(&c.qp, addr, &cp) {
        Err(CmError::Terminated(why)) => assert!(why.contains("insufficient IRD"), "{why}"),
        other => panic!("{other:?}"),
    }
    let term = t.join().unwrap();
    assert!(term.len() >= 24, "{term:?}");
    assert_eq!(term[3] & 0x0f, 7, "Terminate");
    assert_eq!(&term[20..22], &[0x20, 0x06], "Layer 2 / EType 0 / code 6");
}

#[test]
fn tc_mpa_05_no_limit_over_the_wire() {
    // Initiator IRD and ORD "no limit" (0x3FFF): the responder keeps its own values and
    // echoes 0x3FFF; the initiator keeps its own too (IO-11).
    let c = ep(1 << 16);
    let s = ep(1 << 16);
    let cp = ConnParams {
        read: ReadParams {
            ird: IRD_ORD_NO_LIMIT,
            ord: IRD_ORD_NO_LIMIT,
            ..ReadParams::default()
        },
        ..ConnParams::default()
    };
    let sp = ConnParams {
        read: ReadParams {
            ird: 4,
            ord: 5,
            ..ReadParams::default()
        },
        ..ConnParams::default()
    };
    let (cc, sc) = pair_with(&c, &s, &cp, &sp);
    let (cc, sc) = (cc.unwrap(), sc.unwrap());
    assert_eq!((sc.ird, sc.ord), (4, 5));
    assert_eq!(cc.peer_ird_ord, Some((IRD_ORD_NO_LIMIT, IRD_ORD_NO_LIMIT)));
    assert_eq!((cc.ird, cc.ord), (IRD_ORD_NO_LIMIT, IRD_ORD_NO_LIMIT));
}

#[test]
fn tc_mpa_10_no_matching_rtr_terminates() {
    let c = ep(1 << 16);
    let s = ep(1 << 16);
    let write_only = RtrSet {
        write: true,
        ..RtrSet::NONE
    };
    let read_only = RtrSet {
        read: true,
        ..RtrSet::NONE
    };
    let (cr, sr) = pair_with(&c, &s, &p2p(write_only), &p2p(read_only));
    match cr {
        Err(CmError::Terminated(why)) => assert!(why.contains("no matching RTR"), "{why}"),
        other => panic!("{other:?}"),
    }
    sr.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while smc_iwarp::qp_error(&s.qp).is_none() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(smc_iwarp::qp_error(&s.qp).unwrap().contains("RTR"));
}

#[test]
fn tc_mpa_22_23_reject_with_required_ord() {
    let c = ep(1 << 16);
    let s = ep(1 << 16);
    let cp = ConnParams {
        read: ReadParams {
            ird: 2,
            ..ReadParams::default()
        },
        ..ConnParams::default()
    };
    let sp = ConnParams {
        read: ReadParams {
            required_ord: 8,
            ..ReadParams::default()
        },
        ..ConnParams::default()
    };
    let (cr, sr) = pair_with(&c, &s, &cp, &sp);
    match cr {
        Err(CmError::Rejected { peer_ird_ord, .. }) => {
            assert_eq!(peer_ird_ord.map(|x| x.1), Some(8))
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(sr, Err(CmError::Refused(_))));
}

#[test]
fn tc_mpa_15_legacy_responder_closes_then_rev1() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        // a responder without RFC 6581: closes on the enhanced Request
        let (mut a, _) = l.accept().unwrap();
        let f = read_frame(&mut a);
        assert_eq!((f[16] & 0x10, f[17]), (0x10, 2));
        drop(a);
        // then answers the revision 1 retry
        let (mut b, _) = l.accept().unwrap();
        let f = read_frame(&mut b);
        assert_eq!((f[16] & 0x10, f[17]), (0, 1), "retry is plain revision 1");
        let mut rep = b"MPA ID Rep Frame".to_vec();
        rep.extend_from_slice(&[0, 1, 0, 0]);
        b.write_all(&rep).unwrap();
        b
    });
    let c = ep(1 << 16);
    let cp = ConnParams {
        retry_rev1: true,
        ..ConnParams::default()
    };
    let conn = smc_iwarp::cm::connect(&c.qp, addr, &cp).unwrap();
    assert_eq!((conn.rev, conn.enhanced), (1, false));
    let _b = t.join().unwrap();
}

#[test]
fn protection_checks_terminate_and_touch_nothing() {
    let cases: [(&str, AccessFlags, u64, bool); 4] = [
        ("bad STag", AccessFlags::REMOTE_WRITE, 0, true),
        ("bounds", AccessFlags::REMOTE_WRITE, 4096 - 8, false),
        ("no write access", AccessFlags::REMOTE_READ, 0, false),
        ("read: bad STag", AccessFlags::REMOTE_READ, 0, true),
    ];
    for (i, (what, access, off, bad_key)) in cases.into_iter().enumerate() {
        let c = ep(1 << 16);
        let s = ep_with(&Config::default(), 4096, access);
        // guard region right after: must never change
        let guard = s.pd.reg_mr(&s.buf, AccessFlags::LOCAL_WRITE).unwrap();
        pair(&c, &s);
        c.buf.write(0, &[0xaa; 64]);
        let rkey = if bad_key {
            s.mr.rkey() ^ 0x100
        } else {
            s.mr.rkey()
        };
        let sg = [c.mr.sge(0, 64)];
        let op = if i == 3 {
            SendOp::RdmaRead {
                remote_addr: s.mr.addr() + off,
                rkey,
            }
        } else {
            SendOp::RdmaWrite {
                remote_addr: s.mr.addr() + off,
                rkey,
            }
        };
        c.qp.post_send(&send_wr(1, op, &sg)).unwrap();
        let first = wait(&c.scq, what);
        if i == 3 {
            assert_eq!(first.status, WcStatus::RemAccessErr, "{what}");
        } else {
            // iWARP completes a WRITE when it is handed to TCP (or flushes it if the
            // responder's Terminate came first); the Terminate moves the QP to ERR and
            // later work is flushed.
            assert!(
                matches!(first.status, WcStatus::Success | WcStatus::WrFlushErr),
                "{what}: {first:?}"
            );
            let deadline = Instant::now() + Duration::from_secs(5);
            while c.qp.state() != QpState::Err {
                assert!(Instant::now() < deadline, "{what}: no Terminate");
                std::thread::sleep(Duration::from_millis(5));
            }
            c.qp.post_send(&send_wr(2, SendOp::Send, &sg)).unwrap();
            assert_eq!(wait(&c.scq, "flushed").status, WcStatus::WrFlushErr);
        }
        let why = smc_iwarp::qp_error(&c.qp).unwrap();
        assert!(why.contains("peer terminated"), "{what}: {why}");
        assert_eq!(
            read_back(&s, 0, 4096),
            vec![0u8; 4096],
            "{what}: memory touched"
        );
        drop(guard);
    }
}

#[test]
fn send_without_receive_and_too_long_terminate() {
    for posted in [0u32, 8] {
        let c = ep(1 << 16);
        let s = ep(1 << 16);
        pair(&c, &s);
        if posted > 0 {
            s.qp.post_recv(&RecvWr {
                wr_id: 1,
                sg_list: &[s.mr.sge(0, posted)],
            })
            .unwrap();
        }
        let sg = [c.mr.sge(0, 100)];
        c.qp.post_send(&send_wr(1, SendOp::Send, &sg)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while smc_iwarp::qp_error(&c.qp).is_none() {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(5));
        }
        let why = smc_iwarp::qp_error(&s.qp).unwrap();
        assert!(
            why.contains(if posted == 0 {
                "no receive"
            } else {
                "longer than the receive"
            }),
            "{why}"
        );
        if posted > 0 {
            assert_eq!(wait(&s.rcq, "flushed recv").status, WcStatus::WrFlushErr);
        }
    }
}

/// A TCP relay between two ports that can be cut.
fn relay(to: std::net::SocketAddr) -> (std::net::SocketAddr, std::sync::mpsc::Sender<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let (a, _) = l.accept().unwrap();
        let b = TcpStream::connect(to).unwrap();
        let (a2, b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
        let pump = |mut x: TcpStream, mut y: TcpStream| {
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n) = x.read(&mut buf) {
                    if n == 0 || y.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            })
        };
        pump(a.try_clone().unwrap(), b.try_clone().unwrap());
        pump(b2, a2);
        let _ = rx.recv();
        let _ = a.shutdown(Shutdown::Both);
        let _ = b.shutdown(Shutdown::Both);
    });
    (addr, tx)
}

#[test]
fn cut_connection_mid_transfer_flushes_everything() {
    let c = ep(8 << 20);
    let s = ep(8 << 20);
    let l = smc_iwarp::cm::Listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let (via, cut) = relay(addr_of(&l));
    let sqp = s.qp.clone();
    let t = std::thread::spawn(move || l.accept().unwrap().accept(&sqp, &ConnParams::default()));
    smc_iwarp::cm::connect(&c.qp, via, &ConnParams::default()).unwrap();
    t.join().unwrap().unwrap();
    for i in 0..64 {
        s.qp.post_recv(&RecvWr {
            wr_id: 100 + i,
            sg_list: &[s.mr.sge(0, 1 << 20)],
        })
        .unwrap();
    }
    let n = 200u64;
    for i in 0..n {
        let sg = [c.mr.sge(0, 4 << 20)];
        let op = if i % 2 == 0 {
            SendOp::RdmaWrite {
                remote_addr: s.mr.addr(),
                rkey: s.mr.rkey(),
            }
        } else {
            SendOp::RdmaRead {
                remote_addr: s.mr.addr(),
                rkey: s.mr.rkey(),
            }
        };
        c.qp.post_send(&send_wr(i, op, &sg)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    cut.send(()).unwrap();
    let t0 = Instant::now();
    let (mut ok, mut flushed) = (0, 0);
    let mut last = None;
    for _ in 0..n {
        let wc = wait(&c.scq, "completion after the cut");
        // in order, each exactly once
        if let Some(l) = last {
            assert_eq!(wc.wr_id, l + 1);
        }
        last = Some(wc.wr_id);
        match wc.status {
            WcStatus::Success => ok += 1,
            WcStatus::WrFlushErr => flushed += 1,
            st => panic!("unexpected {st:?}"),
        }
    }
    assert!(
        flushed > 0,
        "the cut came too late to test anything ({ok} done)"
    );
    assert!(t0.elapsed() < Duration::from_secs(15));
    assert_eq!(c.qp.state(), QpState::Err);
    // the server side flushes its receives too
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.qp.state() != QpState::Err {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    for _ in 0..64 {
        assert_eq!(wait(&s.rcq, "flushed recv").status, WcStatus::WrFlushErr);
    }
}

#[test]
fn unsupported_ops_and_states_are_errors() {
    let c = ep(1 << 16);
    let sg = [c.mr.sge(0, 8)];
    // not connected yet
    assert!(c.qp.post_send(&send_wr(1, SendOp::Send, &sg)).is_err());
    let s = ep(1 << 16);
    pair(&c, &s);
    assert!(c
        .qp
        .post_send(&send_wr(1, SendOp::SendWithImm { imm: 1 }, &sg))
        .is_err());
    let two = [c.mr.sge(0, 8), c.mr.sge(8, 8)];
    assert!(c
        .qp
        .post_send(&send_wr(
            1,
            SendOp::RdmaRead {
                remote_addr: 0,
                rkey: 0
            },
            &two
        ))
        .is_err());
}

#[test]
fn send_with_invalidate_terminates() {
    // RFC 5040 §6.10: our STags are memory regions, which a peer cannot invalidate.
    let s = ep(1 << 16);
    s.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: &[s.mr.sge(0, 4096)],
    })
    .unwrap();
    let l = smc_iwarp::cm::Listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = addr_of(&l);
    let sqp = s.qp.clone();
    let t = std::thread::spawn(move || l.accept().unwrap().accept(&sqp, &ConnParams::default()));
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.write_all(&raw_request(0, 1, &[])).unwrap();
    read_frame(&mut raw);
    t.join().unwrap().unwrap();
    let mut u = vec![0x41u8, 0x44]; // untagged, last; Send with Invalidate
    u.extend_from_slice(&s.mr.rkey().to_be_bytes()); // Invalidate STag
    u.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]); // QN 0, MSN 1, MO 0
    u.extend_from_slice(b"data");
    raw.write_all(&fpdu(&u, false)).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut term = Vec::new();
    let _ = raw.read_to_end(&mut term);
    assert!(term.len() >= 24, "{term:?}");
    assert_eq!(term[3] & 0x0f, 7, "Terminate");
    assert_eq!(
        &term[20..22],
        &[0x02, 0x09],
        "RDMAP / remote operation / cannot invalidate"
    );
    assert_eq!(wait(&s.rcq, "flushed recv").status, WcStatus::WrFlushErr);
    assert_eq!(read_back(&s, 0, 4), vec![0u8; 4], "nothing placed");
}

#[test]
fn enhanced_request_answered_plain_is_refused() {
    // RFC 6581 §10: an enhanced responder MUST answer enhanced; a plain Reply to our
    // enhanced Request ends the connect with Terminate 2/0/4 (invalid Request/Reply).
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut a, _) = l.accept().unwrap();
        read_frame(&mut a);
        let mut rep = b"MPA ID Rep Frame".to_vec();
        rep.extend_from_slice(&[0, 2, 0, 0]);
        a.write_all(&rep).unwrap();
        let mut term = Vec::new();
        a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = a.read_to_end(&mut term);
        term
    });
    let c = ep(1 << 16);
    match smc_iwarp::cm::connect(&c.qp, addr, &ConnParams::default()) {
        Err(CmError::Protocol(why)) => assert!(why.contains("without enhanced"), "{why}"),
        other => panic!("{other:?}"),
    }
    let term = t.join().unwrap();
    assert!(term.len() >= 24, "{term:?}");
    assert_eq!(&term[20..22], &[0x20, 0x04]);
}

#[test]
fn send_queue_depth_is_enforced() {
    let c = ep(1 << 16);
    let s = ep(1 << 16);
    pair(&c, &s);
    let sg = [c.mr.sge(0, 8)];
    let wrs: Vec<SendWr<'_>> = (0..1024)
        .map(|i| {
            send_wr(
                i,
                SendOp::RdmaWrite {
                    remote_addr: s.mr.addr(),
                    rkey: s.mr.rkey(),
                },
                &sg,
            )
        })
        .collect();
    // 1024 = max_send_wr fit at once, one more does not (until completions drain)
    c.qp.post_send_batch(&wrs).unwrap();
    let extra = c.qp.post_send(&send_wr(
        5000,
        SendOp::RdmaWrite {
            remote_addr: s.mr.addr(),
            rkey: s.mr.rkey(),
        },
        &sg,
    ));
    if let Err(e) = extra {
        assert!(matches!(e, smc_verbs::VerbsError::QueueFull), "{e}");
    }
    for _ in 0..1024 {
        wait_ok(&c.scq, "write");
    }
}

#[test]
fn tc_mpa_21_local_catastrophic_term5() {
    // The application moves the QP to ERR while the MPA exchange is in flight: when the
    // Reply arrives the initiator cannot go on and sends Terminate 2/0/5 before closing
    // (RFC 6581 §9.3).
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let (mut a, _) = l.accept().unwrap();
        read_frame(&mut a);
        go_rx.recv().unwrap();
        let mut rep = b"MPA ID Rep Frame".to_vec();
        rep.extend_from_slice(&[0x10, 2, 0, 4, 0, 1, 0, 1]);
        a.write_all(&rep).unwrap();
        let mut term = Vec::new();
        a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = a.read_to_end(&mut term);
        term
    });
    let c = ep(1 << 16);
    let qp = c.qp.clone();
    let conn =
        std::thread::spawn(move || smc_iwarp::cm::connect(&qp, addr, &ConnParams::default()));
    std::thread::sleep(Duration::from_millis(200));
    c.qp.modify_to_err().unwrap();
    go_tx.send(()).unwrap();
    assert!(conn.join().unwrap().is_err());
    let term = t.join().unwrap();
    assert!(term.len() >= 24, "{term:?}");
    assert_eq!(term[3] & 0x0f, 7, "Terminate");
    assert_eq!(&term[20..22], &[0x20, 0x05], "Layer 2 / EType 0 / code 5");
}

#[test]
fn accept_within_times_out_then_still_accepts() {
    let l = smc_iwarp::cm::Listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = addr_of(&l);
    let t0 = Instant::now();
    match l.accept_within(Duration::from_millis(150)) {
        Err(CmError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::TimedOut),
        Err(e) => panic!("expected a timeout, got {e}"),
        Ok(_) => panic!("nothing connected, yet accept_within returned a connection"),
    }
    assert!(t0.elapsed() >= Duration::from_millis(150));
    // The listener is still usable (and blocking again) after a timeout.
    let s = ep(1 << 16);
    let c = ep(1 << 16);
    let sqp = s.qp.clone();
    let t = std::thread::spawn(move || {
        l.accept_within(Duration::from_secs(10))
            .unwrap()
            .accept(&sqp, &ConnParams::default())
    });
    let conn = smc_iwarp::cm::connect(&c.qp, addr, &ConnParams::default()).unwrap();
    let sconn = t.join().unwrap().unwrap();
    assert_eq!(conn.local, sconn.peer);
}
