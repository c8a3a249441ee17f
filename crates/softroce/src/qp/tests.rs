//! Deterministic responder tests on the engine-less [`Harness`]: the test
//! feeds packets and runs engine passes itself, so interleavings that a
//! live device makes timing-dependent (a READ still streaming when the
//! next request arrives, a region deregistered between two response
//! packets) happen exactly as scripted.

use std::net::IpAddr;
use std::sync::Arc;

use smc_verbs::{AccessFlags, Mr, Mtu, QpState, RdmaBuffer, WorkCompletion};

use crate::harness::{Harness, HarnessQp, LOCAL};
use crate::wire::{pad_for, AtomicEthRepr, BthRepr, Opcode, PacketRepr, RethRepr, Syndrome};

const PEER_QPN: u32 = 0x77;
const SPORT: u16 = 50_000;

fn peer() -> IpAddr {
    IpAddr::V4(LOCAL)
}

/// A request from the scripted peer to `dest_qp`.
fn req(dest_qp: u32, opcode: Opcode, psn: u32, ack_req: bool) -> PacketRepr {
    PacketRepr {
        bth: BthRepr {
            opcode,
            se: false,
            mig_req: false,
            pad_count: 0,
            pkey: 0xffff,
            resv8a: 0,
            dest_qp,
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

fn read_req(dest_qp: u32, psn: u32, mr: &Mr, off: u64, len: u32) -> PacketRepr {
    PacketRepr {
        reth: Some(RethRepr {
            va: mr.addr() + off,
            rkey: mr.rkey(),
            dma_len: len,
        }),
        ..req(dest_qp, Opcode::ReadRequest, psn, false)
    }
}

/// Emits `repr` + `payload` with a valid ICRC and feeds it.
fn feed(h: &mut Harness, mut repr: PacketRepr, payload: &[u8]) {
    repr.bth.pad_count = pad_for(payload.len()) as u8;
    let mut b = vec![0u8; repr.buffer_len(payload.len())];
    let off = repr.emit(&mut b).unwrap();
    b[off..off + payload.len()].copy_from_slice(payload);
    h.seal(peer(), SPORT, &mut b);
    h.feed(&b, peer(), SPORT);
}

/// Runs engine passes until no QP has work, collecting what was sent.
fn drain(h: &mut Harness, out: &mut Vec<(PacketRepr, Vec<u8>)>) {
    loop {
        let busy = h.service();
        collect(h, out);
        if !busy {
            return;
        }
    }
}

fn collect(h: &Harness, out: &mut Vec<(PacketRepr, Vec<u8>)>) {
    for b in h.sent() {
        let p = PacketRepr::parse(&b).expect("the device sent a malformed packet");
        out.push((
            p.repr,
            b[p.payload_off..p.payload_off + p.payload_len].to_vec(),
        ));
    }
}

fn setup(mtu: Mtu, max_dest_rd_atomic: u8) -> (Harness, HarnessQp) {
    let h = Harness::new(mtu).unwrap();
    let q = h.qp(PEER_QPN, 100, 500, max_dest_rd_atomic).unwrap();
    (h, q)
}

fn region(q: &HarnessQp, len: usize, byte: u8) -> (Arc<RdmaBuffer>, Mr) {
    let b = RdmaBuffer::new(len).unwrap();
    b.fill(0, len, byte);
    let mr =
        q.pd.reg_mr(
            &b,
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_ATOMIC,
        )
        .unwrap();
    (b, mr)
}

fn nak_of(r: &PacketRepr) -> Option<(u32, Syndrome)> {
    match (r.bth.opcode, r.aeth) {
        (Opcode::Acknowledge, Some(a)) if !matches!(a.syndrome, Syndrome::Ack { .. }) => {
            Some((r.bth.psn, a.syndrome))
        }
        _ => None,
    }
}

fn poll_all(q: &HarnessQp) -> Vec<WorkCompletion> {
    let mut v = Vec::new();
    let mut wc = [WorkCompletion::default(); 16];
    for cq in [&q.scq, &q.rcq] {
        loop {
            let n = cq.poll(&mut wc);
            v.extend_from_slice(&wc[..n]);
            if n == 0 {
                break;
            }
        }
    }
    v
}

/// Item 6: a READ queued behind a long one must not be served from a
/// region deregistered meanwhile (rxe re-checks the MR): the long READ
/// completes, then NAK Remote Access Error at the queued READ's PSN, and
/// the QP is in ERR.
#[test]
fn queued_read_stops_at_deregistration() {
    let (mut h, q) = setup(Mtu::Mtu1024, 4);
    let qpn = q.qp.qpn();
    let (_b1, mr1) = region(&q, 1 << 20, 0x11);
    let (_b2, mr2) = region(&q, 4096, 0x5a);
    let mut out = Vec::new();
    feed(&mut h, read_req(qpn, 100, &mr1, 0, 1 << 20), &[]);
    feed(&mut h, read_req(qpn, 1124, &mr2, 0, 4096), &[]);
    collect(&h, &mut out);
    assert!(out.len() < 1024, "the first READ must still be streaming");
    drop(mr2);
    drain(&mut h, &mut out);
    let psns: Vec<u32> = out
        .iter()
        .filter(|(r, _)| r.bth.opcode != Opcode::Acknowledge)
        .map(|(r, _)| r.bth.psn)
        .collect();
    assert_eq!(psns, (100..1124).collect::<Vec<_>>());
    assert!(out.iter().all(|(_, d)| d.iter().all(|&x| x == 0x11)));
    assert_eq!(
        out.last().and_then(|(r, _)| nak_of(r)),
        Some((1124, Syndrome::NakRemoteAccessError))
    );
    assert_eq!(q.qp.state(), QpState::Err);
}

/// Item 6: a READ whose region is deregistered while its responses stream
/// stops at once with NAK Remote Access Error at the first response not
/// sent.
#[test]
fn streaming_read_stops_at_deregistration() {
    let (mut h, q) = setup(Mtu::Mtu1024, 4);
    let qpn = q.qp.qpn();
    let (_b1, mr1) = region(&q, 1 << 20, 0x11);
    let mut out = Vec::new();
    feed(&mut h, read_req(qpn, 100, &mr1, 0, 1 << 20), &[]);
    collect(&h, &mut out);
    let sent = out.len() as u32;
    assert!(sent > 0 && sent < 1024);
    drop(mr1);
    drain(&mut h, &mut out);
    assert_eq!(
        out.len() as u32,
        sent + 1,
        "nothing but the NAK after the deregistration"
    );
    assert_eq!(
        nak_of(&out.last().unwrap().0),
        Some((100 + sent, Syndrome::NakRemoteAccessError))
    );
    assert_eq!(q.qp.state(), QpState::Err);
    let _ = poll_all(&q);
}

fn write_only(dest_qp: u32, psn: u32, va: u64, rkey: u32, len: u32) -> PacketRepr {
    PacketRepr {
        reth: Some(RethRepr {
            va,
            rkey,
            dma_len: len,
        }),
        ..req(dest_qp, Opcode::WriteOnly, psn, true)
    }
}

fn fetch_add(dest_qp: u32, psn: u32, mr: &Mr, off: u64, add: u64) -> PacketRepr {
    PacketRepr {
        atomic: Some(AtomicEthRepr {
            va: mr.addr() + off,
            rkey: mr.rkey(),
            swap_add: add,
            compare: 0,
        }),
        ..req(dest_qp, Opcode::FetchAdd, psn, false)
    }
}

/// What the device sent, as (opcode, PSN, syndrome if any).
fn summary(out: &[(PacketRepr, Vec<u8>)]) -> Vec<(Opcode, u32, Option<Syndrome>)> {
    out.iter()
        .map(|(r, _)| (r.bth.opcode, r.bth.psn, r.aeth.map(|a| a.syndrome)))
        .collect()
}

/// The responses a 1 MiB READ at PSN 100 (MTU 1024) must produce.
fn read_responses() -> Vec<(Opcode, u32, Option<Syndrome>)> {
    (0..1024u32)
        .map(|k| {
            let op = match k {
                0 => Opcode::ReadResponseFirst,
                1023 => Opcode::ReadResponseLast,
                _ => Opcode::ReadResponseMiddle,
            };
            (op, 100 + k, op.has_aeth().then_some(Syndrome::ACK))
        })
        .collect()
}

/// Item 7: a READ longer than one service pass (64 packets) followed by
/// SENDs, a fetch-and-add and more SENDs: every response leaves in PSN
/// order (IBA §9.7.5.1.1), so the ACKs and the atomic ACK come after the
/// READ's last response, never ahead of it.
#[test]
fn responses_leave_in_psn_order_behind_a_long_read() {
    let (mut h, q) = setup(Mtu::Mtu1024, 4);
    let qpn = q.qp.qpn();
    let (_b, mr) = region(&q, 1 << 20, 0x11);
    for i in 0..3 {
        q.qp.post_recv(&smc_verbs::RecvWr {
            wr_id: i,
            sg_list: &[mr.sge(4096 * i as usize, 64)],
        })
        .unwrap();
    }
    let mut out = Vec::new();
    feed(&mut h, read_req(qpn, 100, &mr, 0, 1 << 20), &[]);
    feed(&mut h, req(qpn, Opcode::SendOnly, 1124, true), b"one");
    feed(&mut h, req(qpn, Opcode::SendOnly, 1125, true), b"two");
    feed(&mut h, fetch_add(qpn, 1126, &mr, 8192, 1), &[]);
    feed(&mut h, req(qpn, Opcode::SendOnly, 1127, true), b"three");
    drain(&mut h, &mut out);
    let mut want = read_responses();
    want.push((Opcode::Acknowledge, 1125, Some(Syndrome::ACK)));
    want.push((Opcode::AtomicAcknowledge, 1126, Some(Syndrome::ACK)));
    want.push((Opcode::Acknowledge, 1127, Some(Syndrome::ACK)));
    let got = summary(&out);
    let first_diff = got.iter().zip(&want).position(|(a, b)| a != b);
    assert!(
        got == want,
        "{} packets, first difference at {first_diff:?}: {:?}",
        got.len(),
        first_diff.map(|i| (&got[i], &want[i]))
    );
    assert_eq!(q.qp.state(), QpState::Rts);
}

/// Item 7: a request that gets a fatal NAK behind a long READ: the READ's
/// responses all leave first, then the NAK, then the QP is in ERR (and
/// nothing after the bad request is executed).
#[test]
fn fatal_nak_waits_for_the_read_before_it() {
    let (mut h, q) = setup(Mtu::Mtu1024, 4);
    let qpn = q.qp.qpn();
    let (b, mr) = region(&q, 1 << 20, 0x11);
    let mut out = Vec::new();
    feed(&mut h, read_req(qpn, 100, &mr, 0, 1 << 20), &[]);
    // R_Key that names nothing: NAK Remote Access Error at 1124.
    feed(
        &mut h,
        write_only(qpn, 1124, mr.addr(), mr.rkey() ^ 0x100, 8),
        &[0x22; 8],
    );
    // Must not be executed: the QP is about to enter ERR.
    feed(
        &mut h,
        write_only(qpn, 1125, mr.addr(), mr.rkey(), 8),
        &[0x33; 8],
    );
    drain(&mut h, &mut out);
    let mut want = read_responses();
    want.push((
        Opcode::Acknowledge,
        1124,
        Some(Syndrome::NakRemoteAccessError),
    ));
    let got = summary(&out);
    let first_diff = got.iter().zip(&want).position(|(a, b)| a != b);
    assert!(
        got == want,
        "{} packets, first difference at {first_diff:?}: {:?}",
        got.len(),
        first_diff.map(|i| (&got[i], &want[i]))
    );
    assert_eq!(q.qp.state(), QpState::Err);
    let mut first = [0u8; 8];
    b.read(0, &mut first);
    assert_eq!(first, [0x11; 8]);
}

fn zero_read(dest_qp: u32, psn: u32, mr: &Mr) -> PacketRepr {
    read_req(dest_qp, psn, mr, 0, 0)
}

/// Item 8: `max_dest_rd_atomic` READ/atomic requests in progress at most
/// (IBA responder resources; CHECKLIST C.7): one more is answered with NAK
/// Invalid Request, after the responses owed before it, and the QP enters
/// ERR. So the READs a peer can queue are bounded.
#[test]
fn responder_resources_are_enforced() {
    let (mut h, q) = setup(Mtu::Mtu1024, 2);
    let qpn = q.qp.qpn();
    let (b, mr) = region(&q, 1 << 20, 0x11);
    let mut out = Vec::new();
    // Two long READs in progress (the second queued), a third is one too many.
    feed(&mut h, read_req(qpn, 100, &mr, 0, 1 << 20), &[]);
    feed(&mut h, read_req(qpn, 1124, &mr, 0, 1 << 20), &[]);
    feed(&mut h, fetch_add(qpn, 2148, &mr, 0, 1), &[]);
    drain(&mut h, &mut out);
    let got = summary(&out);
    assert_eq!(got.len(), 2049, "two READs answered in full, then one NAK");
    assert!(got[..2048]
        .iter()
        .enumerate()
        .all(|(i, g)| g.1 == 100 + i as u32 && g.0 != Opcode::Acknowledge));
    assert_eq!(
        got[2048],
        (Opcode::Acknowledge, 2148, Some(Syndrome::NakInvalidRequest))
    );
    assert_eq!(q.qp.state(), QpState::Err);
    let mut word = [0u8; 8];
    b.read(0, &mut word);
    assert_eq!(word, [0x11; 8], "the refused atomic was executed");
}

/// Item 8: with `max_dest_rd_atomic` 0 the QP takes no READ or atomic.
#[test]
fn no_responder_resources_no_reads() {
    let (mut h, q) = setup(Mtu::Mtu1024, 0);
    let (_b, mr) = region(&q, 4096, 0x11);
    let mut out = Vec::new();
    feed(&mut h, zero_read(q.qp.qpn(), 100, &mr), &[]);
    drain(&mut h, &mut out);
    assert_eq!(
        summary(&out),
        [(Opcode::Acknowledge, 100, Some(Syndrome::NakInvalidRequest))]
    );
    assert_eq!(q.qp.state(), QpState::Err);
}

/// Item 8: RTR rejects more responder resources than the device has
/// (`DeviceAttr::max_qp_rd_atom`), as ibverbs does (EINVAL).
#[test]
fn responder_resources_beyond_the_device_limit_are_rejected() {
    let h = Harness::new(Mtu::Mtu1024).unwrap();
    let max = h.dev.attr().max_qp_rd_atom;
    assert!(h.qp(PEER_QPN, 100, 500, max).is_ok());
    assert!(matches!(
        h.qp(PEER_QPN, 100, 500, max + 1),
        Err(smc_verbs::VerbsError::InvalidArgument(_))
    ));
}

/// Item 8: a duplicate atomic whose saved result is gone (more READ/atomic
/// requests came after it than the responder keeps results for) is
/// answered with NAK Invalid Request at its PSN instead of silence (after
/// which a requester retries forever with rxe's infinite retry_cnt 7);
/// the QP itself stays up, because a late network duplicate of a long
/// completed atomic looks the same. It is never executed twice.
#[test]
fn duplicate_atomic_without_saved_result_is_nakked() {
    let (mut h, q) = setup(Mtu::Mtu1024, 2);
    let qpn = q.qp.qpn();
    let (b, mr) = region(&q, 4096, 0);
    let mut out = Vec::new();
    feed(&mut h, fetch_add(qpn, 100, &mr, 0, 5), &[]);
    for i in 0..40 {
        feed(&mut h, zero_read(qpn, 101 + i, &mr), &[]);
    }
    drain(&mut h, &mut out);
    assert_eq!(out.len(), 41);
    out.clear();
    feed(&mut h, fetch_add(qpn, 100, &mr, 0, 5), &[]);
    drain(&mut h, &mut out);
    assert_eq!(
        summary(&out),
        [(Opcode::Acknowledge, 100, Some(Syndrome::NakInvalidRequest))]
    );
    assert_eq!(q.qp.state(), QpState::Rts);
    let mut word = [0u8; 8];
    b.read(0, &mut word);
    assert_eq!(u64::from_ne_bytes(word), 5);
    // A recent one is still replayed from its saved result.
    out.clear();
    feed(&mut h, fetch_add(qpn, 141, &mr, 0, 5), &[]);
    feed(&mut h, fetch_add(qpn, 141, &mr, 0, 5), &[]);
    drain(&mut h, &mut out);
    assert_eq!(out.len(), 2);
    assert!(out.iter().all(|(r, _)| r.atomic_ack == Some(5)));
}
