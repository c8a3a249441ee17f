//! The softroce RC QP (responder and requester receive paths) against
//! arbitrary packets: no input may panic, every packet the device sends in
//! answer must parse, and no byte outside registered memory changes.
//!
//! Each input is a script run on a fresh QP of an engine-less device
//! (`smc_softroce::harness`, feature `fuzzing`): the QP expects PSN 100
//! from its peer, has receives posted, and a READ and an atomic of its own
//! outstanding (so responses reach the requester path). Its region is the
//! middle page of a three-page buffer whose outer pages are canaries; a
//! region of another PD on the same device is all canary. Script steps:
//!
//! * `0`: a raw packet (length byte, then bytes) from the peer's address
//!   (checksum not fixed, so mostly dropped at the ICRC);
//! * `1`: a structured request or response (opcode, PSN offset from 100,
//!   flags, which R_Key and where, DMA length, payload size and byte),
//!   emitted by the codec with a valid ICRC, from the peer or from
//!   another address;
//! * `2`: an engine pass (timers, READ responses still to stream);
//! * `3`: deregistering the QP's region (later accesses must fail);
//! * `4`: posting a receive.
//!
//! ```sh
//! cd fuzz && cargo +nightly fuzz run roce_responder corpus/roce_responder seeds/roce_responder
//! ```
#![no_main]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};

use libfuzzer_sys::fuzz_target;
use smc_softroce::harness::{Harness, LOCAL};
use smc_softroce::wire::{
    pad_for, AethRepr, AtomicEthRepr, BthRepr, Opcode, PacketRepr, RethRepr, Syndrome,
};
use smc_verbs::{AccessFlags, Mtu, RdmaBuffer, RecvWr, SendFlags, SendOp, SendWr};

const PEER_QPN: u32 = 0x77;
const PAGE: usize = 4096;
const CANARY: u8 = 0xc5;

static HARNESS: Mutex<Option<Harness>> = Mutex::new(None);

/// Bytes of the script, read front to back; zeros once exhausted.
struct Script<'a>(&'a [u8]);

impl Script<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

fn canaries_intact(b: &RdmaBuffer, ranges: &[(usize, usize)]) -> bool {
    let mut v = vec![0u8; b.len()];
    b.read(0, &mut v);
    ranges
        .iter()
        .all(|&(from, to)| v[from..to].iter().all(|&x| x == CANARY))
}

fuzz_target!(|data: &[u8]| {
    let mut guard = HARNESS.lock().unwrap_or_else(|e| e.into_inner());
    let h = guard.get_or_insert_with(|| Harness::new(Mtu::Mtu1024).expect("harness device"));
    let q = h.qp(PEER_QPN, 100, 500, 2).expect("QP");
    let qpn = q.qp.qpn();
    let peer = IpAddr::V4(LOCAL);
    let stranger = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9));
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;

    // The QP's region: the middle page, canaries around it.
    let mem: Arc<RdmaBuffer> = RdmaBuffer::new(3 * PAGE).unwrap();
    mem.fill(0, 3 * PAGE, CANARY);
    mem.fill(PAGE, PAGE, 0);
    let mut mr = Some(q.pd.reg_mr_range(&mem, PAGE, PAGE, all).unwrap());
    let (iova, rkey) = {
        let m = mr.as_ref().unwrap();
        (m.addr(), m.rkey())
    };
    // A region of another PD: must never be touched through this QP.
    let other_pd = h.dev.alloc_pd().unwrap();
    let other = RdmaBuffer::new(PAGE).unwrap();
    other.fill(0, PAGE, CANARY);
    let other_mr = other_pd.reg_mr(&other, all).unwrap();

    let post_recv = |mr: &Option<smc_verbs::Mr>, off: usize, len: u32| {
        if let Some(m) = mr {
            let _ = q.qp.post_recv(&RecvWr {
                wr_id: 1,
                sg_list: &[m.sge(off, len)],
            });
        }
    };
    post_recv(&mr, 0, 2048);
    post_recv(&mr, 2048, 2048);
    // Our own READ and atomic, so responses have something to answer.
    if let Some(m) = mr.as_ref() {
        let _ = q.qp.post_send(&SendWr {
            wr_id: 2,
            op: SendOp::RdmaRead {
                remote_addr: 0x1000,
                rkey: 0x42,
            },
            sg_list: &[m.sge(0, 3000)],
            flags: SendFlags::SIGNALED,
        });
        let _ = q.qp.post_send(&SendWr {
            wr_id: 3,
            op: SendOp::AtomicFetchAdd {
                remote_addr: 0x2000,
                rkey: 0x42,
                add: 1,
            },
            sg_list: &[m.sge(3000 & !7, 8)],
            flags: SendFlags::SIGNALED,
        });
    }

    let mut s = Script(data);
    let mut steps = 0;
    while !s.done() && steps < 64 {
        steps += 1;
        match s.u8() % 5 {
            0 => {
                let n = s.u8() as usize;
                let pkt = s.bytes(n).to_vec();
                h.feed(&pkt, peer, 4791);
            }
            1 => {
                let op = Opcode::ALL[s.u8() as usize % Opcode::ALL.len()];
                let psn_off = s.u16() as i16 as i32;
                let flags = s.u8();
                let key_sel = s.u8();
                let va_off = s.u32() as u64;
                let dma_len = s.u32() % (3 * PAGE as u32);
                let payload_len = (s.u16() as usize) % 2100;
                let fill = s.u8();
                let rk = match key_sel % 4 {
                    0 | 1 => rkey,
                    2 => other_mr.rkey(),
                    _ => s.u32(),
                };
                let va = match key_sel / 4 % 3 {
                    0 => iova.wrapping_add(va_off % (2 * PAGE as u64)),
                    1 => other_mr.addr().wrapping_add(va_off % PAGE as u64),
                    _ => va_off,
                };
                let repr = PacketRepr {
                    bth: BthRepr {
                        opcode: op,
                        se: flags & 1 != 0,
                        mig_req: false,
                        pad_count: 0,
                        pkey: 0xffff,
                        resv8a: 0,
                        dest_qp: if flags & 2 != 0 { qpn ^ 1 } else { qpn },
                        ack_req: flags & 4 != 0,
                        resv7: 0,
                        psn: (100i32.wrapping_add(psn_off) as u32) & 0xff_ffff,
                    },
                    reth: op.has_reth().then_some(RethRepr {
                        va,
                        rkey: rk,
                        dma_len,
                    }),
                    aeth: op.has_aeth().then_some(AethRepr {
                        syndrome: Syndrome::from_u8(fill),
                        msn: 0,
                    }),
                    imm: op.has_imm().then_some(u32::from(fill)),
                    atomic: op.has_atomic_eth().then_some(AtomicEthRepr {
                        va,
                        rkey: rk,
                        swap_add: u64::from(fill),
                        compare: 0,
                    }),
                    atomic_ack: op.has_atomic_ack_eth().then_some(u64::from(fill)),
                };
                let payload_len = if op.has_payload() { payload_len } else { 0 };
                let mut repr = repr;
                repr.bth.pad_count = pad_for(payload_len) as u8;
                let mut b = vec![0u8; repr.buffer_len(payload_len)];
                let off = repr.emit(&mut b).expect("emit");
                b[off..off + payload_len].fill(fill);
                let src = if flags & 8 != 0 { stranger } else { peer };
                h.seal(src, 4791, &mut b);
                h.feed(&b, src, 4791);
            }
            2 => {
                h.service();
            }
            3 => {
                mr = None;
            }
            _ => {
                let off = (s.u16() as usize) % PAGE;
                let len = u32::from(s.u16()) % 4096;
                post_recv(&mr, off, len.min((PAGE - off) as u32));
            }
        }
    }
    // READ responses still owed must come from the region too.
    for _ in 0..64 {
        if !h.service() {
            break;
        }
    }
    for pkt in h.sent() {
        PacketRepr::parse(&pkt).expect("the device sent a malformed packet");
    }
    assert!(
        canaries_intact(&mem, &[(0, PAGE), (2 * PAGE, 3 * PAGE)]),
        "bytes outside the QP's region changed"
    );
    assert!(
        canaries_intact(&other, &[(0, PAGE)]),
        "a region of another PD changed"
    );
    drop(mr);
    drop(q);
});
