//! The provider-independent verbs conformance suite: every opcode of RC and the
//! completion statuses any RNIC must produce, written against the `smc-verbs` API only, so
//! that each provider runs the same checks (`smc-softroce`'s tests on two software
//! devices; `smc rdma conformance` on whatever `SMC_RS_PROVIDER` selects, e.g. Linux rxe
//! through libibverbs). Each case builds its own connected QP pair between two devices
//! (which may be the same device) and returns `Err` with what differed.
//!
//! Not covered here because they are not portable: the solicited-event bit of receive
//! completions (ibverbs does not report it), provider statistics and fault injection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::*;

/// One case's outcome.
pub type CaseResult = std::result::Result<(), String>;

/// A conformance case: name and function over two devices.
pub struct Case {
    /// Short name.
    pub name: &'static str,
    /// Runs the case.
    pub run: fn(&Device, &Device) -> CaseResult,
}

/// Every case, in order.
pub const CASES: &[Case] = &[
    Case {
        name: "send-recv-sizes-sgls-imm",
        run: send_recv,
    },
    Case {
        name: "inline-and-unsignaled",
        run: inline_unsignaled,
    },
    Case {
        name: "rdma-write-and-write-imm",
        run: rdma_write,
    },
    Case {
        name: "rdma-read",
        run: rdma_read,
    },
    Case {
        name: "atomics",
        run: atomics,
    },
    Case {
        name: "rem-access-err-then-flush",
        run: remote_access,
    },
    Case {
        name: "loc-prot-err",
        run: local_protection,
    },
    Case {
        name: "loc-len-err-rem-inv-req",
        run: too_long,
    },
    Case {
        name: "rnr-retry-exc-err",
        run: rnr_exceeded,
    },
];

/// Runs every case; returns (name, result) per case.
pub fn run_all(a: &Device, b: &Device) -> Vec<(&'static str, CaseResult)> {
    CASES.iter().map(|c| (c.name, (c.run)(a, b))).collect()
}

macro_rules! check {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

const T: Duration = Duration::from_secs(10);

struct Side {
    dev: Device,
    pd: Pd,
    scq: Cq,
    rcq: Cq,
    qp: Qp,
    psn: u32,
}

fn e<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |err| format!("{what}: {err}")
}

fn side(dev: &Device, psn: u32) -> std::result::Result<Side, String> {
    let pd = dev.alloc_pd().map_err(e("alloc_pd"))?;
    let scq = dev.create_cq(1024).map_err(e("create_cq"))?;
    let rcq = dev.create_cq(1024).map_err(e("create_cq"))?;
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: scq.clone(),
            recv_cq: rcq.clone(),
            cap: QpCap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 2,
                max_recv_sge: 2,
                max_inline_data: 64,
            },
            sq_sig_all: false,
        })
        .map_err(e("create_qp"))?;
    qp.modify_to_init(&InitAttr {
        access: AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        ..InitAttr::default()
    })
    .map_err(e("modify_to_init"))?;
    Ok(Side {
        dev: dev.clone(),
        pd,
        scq,
        rcq,
        qp,
        psn,
    })
}

/// A connected pair; `rnr_retry` for both (7 = infinite).
fn pair(da: &Device, db: &Device, rnr_retry: u8) -> std::result::Result<(Side, Side), String> {
    // PSNs near the 24-bit wrap so sequence arithmetic is exercised.
    let a = side(da, 0xfffff0)?;
    let b = side(db, 0x7ffff8)?;
    let mtu = da
        .attr()
        .active_mtu
        .min(db.attr().active_mtu)
        .min(Mtu::Mtu1024);
    for (x, y) in [(&a, &b), (&b, &a)] {
        x.qp.modify_to_rtr(&RtrAttr {
            path_mtu: mtu,
            dest_qpn: y.qp.qpn(),
            rq_psn: y.psn,
            ah: AddressHandle::to_gid(y.dev.gid()),
            max_dest_rd_atomic: 4,
            min_rnr_timer: 1,
        })
        .map_err(e("modify_to_rtr"))?;
    }
    for x in [&a, &b] {
        x.qp.modify_to_rts(&RtsAttr {
            sq_psn: x.psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry,
            max_rd_atomic: 4,
        })
        .map_err(e("modify_to_rts"))?;
    }
    Ok((a, b))
}

fn buf(len: usize) -> std::result::Result<Arc<RdmaBuffer>, String> {
    RdmaBuffer::new(len).map_err(e("RdmaBuffer::new"))
}

fn pattern(b: &RdmaBuffer, seed: u8) {
    let v: Vec<u8> = (0..b.len())
        .map(|i| {
            (i as u32)
                .wrapping_mul(2654435761)
                .wrapping_add(seed as u32)
                .to_le_bytes()[1]
        })
        .collect();
    b.write(0, &v);
}

fn bytes(b: &RdmaBuffer, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    b.read(off, &mut v);
    v
}

fn wait_wc(cq: &Cq, what: &str) -> std::result::Result<WorkCompletion, String> {
    let deadline = Instant::now() + T;
    let mut wc = [WorkCompletion::default()];
    loop {
        if cq.poll(&mut wc) == 1 {
            return Ok(wc[0]);
        }
        let now = Instant::now();
        check!(now < deadline, "no completion for {what} within {T:?}");
        cq.wait(Some(deadline - now)).map_err(e("Cq::wait"))?;
    }
}

fn post(a: &Side, wr: SendWr<'_>) -> CaseResult {
    a.qp.post_send(&wr).map_err(e("post_send"))
}

fn send_recv(da: &Device, db: &Device) -> CaseResult {
    let (a, b) = pair(da, db, 7)?;
    let src = buf(64 << 10)?;
    pattern(&src, 1);
    let dst = buf(64 << 10)?;
    let smr =
        a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE)
            .map_err(e("reg_mr"))?;
    let dmr =
        b.pd.reg_mr(&dst, AccessFlags::LOCAL_WRITE)
            .map_err(e("reg_mr"))?;
    for (i, &len) in [0usize, 1, 1023, 1024, 1025, 4097, 65_536]
        .iter()
        .enumerate()
    {
        dst.fill(0, dst.len(), 0);
        let half = 32 << 10;
        b.qp.post_recv(&RecvWr {
            wr_id: 100 + i as u64,
            sg_list: &[dmr.sge(0, half as u32), dmr.sge(half, half as u32)],
        })
        .map_err(e("post_recv"))?;
        let l1 = len / 3;
        let imm = (i % 2 == 1).then_some(0xdead_0000 + i as u32);
        post(
            &a,
            SendWr {
                wr_id: i as u64,
                op: match imm {
                    Some(imm) => SendOp::SendWithImm { imm },
                    None => SendOp::Send,
                },
                sg_list: &[smr.sge(0, l1 as u32), smr.sge(l1, (len - l1) as u32)],
                flags: SendFlags::SIGNALED | SendFlags::SOLICITED,
            },
        )?;
        let wc = wait_wc(&a.scq, "SEND")?;
        check!(
            (wc.wr_id, wc.status, wc.opcode) == (i as u64, WcStatus::Success, WcOpcode::Send),
            "send completion {wc:?}"
        );
        let rc = wait_wc(&b.rcq, "RECV")?;
        check!(
            (rc.wr_id, rc.status, rc.opcode) == (100 + i as u64, WcStatus::Success, WcOpcode::Recv),
            "receive completion {rc:?}"
        );
        check!(
            rc.byte_len as usize == len,
            "byte_len {} != {len}",
            rc.byte_len
        );
        check!(rc.imm_data == imm, "imm {:?} != {imm:?}", rc.imm_data);
        check!(rc.qp_num == b.qp.qpn(), "qp_num {:#x}", rc.qp_num);
        check!(
            bytes(&dst, 0, len) == bytes(&src, 0, len),
            "data of {len} bytes differs"
        );
    }
    Ok(())
}

fn inline_unsignaled(da: &Device, db: &Device) -> CaseResult {
    let (a, b) = pair(da, db, 7)?;
    let src = buf(4096)?;
    let smr =
        a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE)
            .map_err(e("reg_mr"))?;
    let dst = buf(4096)?;
    let dmr =
        b.pd.reg_mr(&dst, AccessFlags::LOCAL_WRITE)
            .map_err(e("reg_mr"))?;
    for i in 0..10u64 {
        b.qp.post_recv(&RecvWr {
            wr_id: i,
            sg_list: &[dmr.sge(i as usize * 64, 64)],
        })
        .map_err(e("post_recv"))?;
    }
    for i in 0..10u64 {
        // Inline: the source may change right after posting.
        src.write(0, &[i as u8; 44]);
        let mut flags = SendFlags::INLINE;
        if i == 9 {
            flags |= SendFlags::SIGNALED;
        }
        post(
            &a,
            SendWr {
                wr_id: i,
                op: SendOp::Send,
                sg_list: &[smr.sge(0, 44)],
                flags,
            },
        )?;
        src.write(0, &[0xee; 44]);
    }
    for i in 0..10u64 {
        let rc = wait_wc(&b.rcq, "RECV")?;
        check!(
            (rc.wr_id, rc.status, rc.byte_len) == (i, WcStatus::Success, 44),
            "receive {rc:?}"
        );
        check!(
            bytes(&dst, i as usize * 64, 44) == vec![i as u8; 44],
            "inline data {i} differs"
        );
    }
    let wc = wait_wc(&a.scq, "signaled SEND")?;
    check!(
        (wc.wr_id, wc.status) == (9, WcStatus::Success),
        "only the signaled WR completes: {wc:?}"
    );
    std::thread::sleep(Duration::from_millis(20));
    let mut more = [WorkCompletion::default()];
    check!(
        a.scq.poll(&mut more) == 0,
        "unsignaled WR completed: {:?}",
        more[0]
    );
    Ok(())
}

fn rdma_write(da: &Device, db: &Device) -> CaseResult {
    let (a, b) = pair(da, db, 7)?;
    let src = buf(256 << 10)?;
    pattern(&src, 7);
    let dst = buf(256 << 10)?;
    let smr =
        a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE)
            .map_err(e("reg_mr"))?;
    let dmr =
        b.pd.reg_mr(&dst, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .map_err(e("reg_mr"))?;
    for (i, &(off, len)) in [(0usize, 1usize), (3, 1024), (5000, 70_000), (0, 256 << 10)]
        .iter()
        .enumerate()
    {
        dst.fill(0, dst.len(), 0);
        post(
            &a,
            SendWr {
                wr_id: i as u64,
                op: SendOp::RdmaWrite {
                    remote_addr: dmr.addr() + off as u64,
                    rkey: dmr.rkey(),
                },
                sg_list: &[smr.sge(off, len as u32)],
                flags: SendFlags::SIGNALED,
            },
        )?;
        let wc = wait_wc(&a.scq, "RDMA WRITE")?;
        check!(
            (wc.status, wc.opcode) == (WcStatus::Success, WcOpcode::RdmaWrite),
            "write completion {wc:?}"
        );
        check!(
            bytes(&dst, off, len) == bytes(&src, off, len),
            "written data differs ({len} at {off})"
        );
    }
    // WRITE with immediate consumes a receive and reports the immediate.
    b.qp.post_recv(&RecvWr {
        wr_id: 77,
        sg_list: &[],
    })
    .map_err(e("post_recv"))?;
    post(
        &a,
        SendWr {
            wr_id: 9,
            op: SendOp::RdmaWriteWithImm {
                remote_addr: dmr.addr(),
                rkey: dmr.rkey(),
                imm: 0x1234_5678,
            },
            sg_list: &[smr.sge(0, 3000)],
            flags: SendFlags::SIGNALED,
        },
    )?;
    let wc = wait_wc(&a.scq, "WRITE with immediate")?;
    check!(
        wc.status == WcStatus::Success,
        "write-imm completion {wc:?}"
    );
    let rc = wait_wc(&b.rcq, "RECV of WRITE with immediate")?;
    check!(
        (rc.wr_id, rc.status, rc.opcode, rc.imm_data)
            == (
                77,
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                Some(0x1234_5678)
            ),
        "receive completion {rc:?}"
    );
    check!(rc.byte_len == 3000, "byte_len {}", rc.byte_len);
    check!(
        bytes(&dst, 0, 3000) == bytes(&src, 0, 3000),
        "write-imm data differs"
    );
    Ok(())
}

fn rdma_read(da: &Device, db: &Device) -> CaseResult {
    let (a, b) = pair(da, db, 7)?;
    let remote = buf(128 << 10)?;
    pattern(&remote, 3);
    let local = buf(128 << 10)?;
    let rmr =
        b.pd.reg_mr(&remote, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
            .map_err(e("reg_mr"))?;
    let lmr =
        a.pd.reg_mr(&local, AccessFlags::LOCAL_WRITE)
            .map_err(e("reg_mr"))?;
    for &(off, len) in &[(0usize, 8usize), (100, 4096), (7, 100_000)] {
        local.fill(0, local.len(), 0);
        post(
            &a,
            SendWr {
                wr_id: off as u64,
                op: SendOp::RdmaRead {
                    remote_addr: rmr.addr() + off as u64,
                    rkey: rmr.rkey(),
                },
                sg_list: &[lmr.sge(0, len as u32)],
                flags: SendFlags::SIGNALED,
            },
        )?;
        let wc = wait_wc(&a.scq, "RDMA READ")?;
        check!(
            (wc.status, wc.opcode, wc.byte_len as usize)
                == (WcStatus::Success, WcOpcode::RdmaRead, len),
            "read completion {wc:?}"
        );
        check!(
            bytes(&local, 0, len) == bytes(&remote, off, len),
            "read data differs ({len} at {off})"
        );
    }
    Ok(())
}

fn atomics(da: &Device, db: &Device) -> CaseResult {
    let (a, b) = pair(da, db, 7)?;
    let remote = buf(4096)?;
    remote.write(8, &100u64.to_ne_bytes());
    let local = buf(4096)?;
    let rmr =
        b.pd.reg_mr(
            &remote,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
        )
        .map_err(e("reg_mr"))?;
    let lmr =
        a.pd.reg_mr(&local, AccessFlags::LOCAL_WRITE)
            .map_err(e("reg_mr"))?;
    let u64_at = |b: &RdmaBuffer, off: usize| {
        let mut x = [0u8; 8];
        b.read(off, &mut x);
        u64::from_ne_bytes(x)
    };
    let ops = [
        (
            SendOp::AtomicFetchAdd {
                remote_addr: rmr.addr() + 8,
                rkey: rmr.rkey(),
                add: 5,
            },
            WcOpcode::FetchAdd,
            100,
            105,
        ),
        (
            SendOp::AtomicCmpSwap {
                remote_addr: rmr.addr() + 8,
                rkey: rmr.rkey(),
                compare: 105,
                swap: 7,
            },
            WcOpcode::CompSwap,
            105,
            7,
        ),
        (
            SendOp::AtomicCmpSwap {
                remote_addr: rmr.addr() + 8,
                rkey: rmr.rkey(),
                compare: 1,
                swap: 9,
            },
            WcOpcode::CompSwap,
            7,
            7,
        ),
    ];
    for (i, (op, opc, orig, after)) in ops.into_iter().enumerate() {
        post(
            &a,
            SendWr {
                wr_id: i as u64,
                op,
                sg_list: &[lmr.sge(0, 8)],
                flags: SendFlags::SIGNALED,
            },
        )?;
        let wc = wait_wc(&a.scq, "atomic")?;
        check!(
            (wc.status, wc.opcode) == (WcStatus::Success, opc),
            "atomic completion {wc:?}"
        );
        check!(
            u64_at(&local, 0) == orig,
            "atomic {i} returned {} not {orig}",
            u64_at(&local, 0)
        );
        check!(
            u64_at(&remote, 8) == after,
            "atomic {i} left {} not {after}",
            u64_at(&remote, 8)
        );
    }
    Ok(())
}

fn remote_access(da: &Device, db: &Device) -> CaseResult {
    let (a, b) = pair(da, db, 7)?;
    let src = buf(4096)?;
    let dst = buf(4096)?;
    let smr =
        a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE)
            .map_err(e("reg_mr"))?;
    // The target allows local write only: a remote WRITE must be refused.
    let dmr =
        b.pd.reg_mr(&dst, AccessFlags::LOCAL_WRITE)
            .map_err(e("reg_mr"))?;
    src.write(0, &[0x5a; 64]);
    post(
        &a,
        SendWr {
            wr_id: 1,
            op: SendOp::RdmaWrite {
                remote_addr: dmr.addr(),
                rkey: dmr.rkey(),
            },
            sg_list: &[smr.sge(0, 64)],
            flags: SendFlags::SIGNALED,
        },
    )?;
    post(
        &a,
        SendWr {
            wr_id: 2,
            op: SendOp::Send,
            sg_list: &[smr.sge(0, 8)],
            flags: SendFlags::SIGNALED,
        },
    )?;
    let wc = wait_wc(&a.scq, "refused WRITE")?;
    check!(
        (wc.wr_id, wc.status) == (1, WcStatus::RemAccessErr),
        "expected RemAccessErr: {wc:?}"
    );
    let wc = wait_wc(&a.scq, "WR behind the failed one")?;
    check!(
        (wc.wr_id, wc.status) == (2, WcStatus::WrFlushErr),
        "expected WrFlushErr: {wc:?}"
    );
    check!(
        bytes(&dst, 0, 64) == vec![0u8; 64],
        "refused WRITE changed the memory"
    );
    check!(
        a.qp.state() == QpState::Err,
        "requester QP state {:?} after the error",
        a.qp.state()
    );
    Ok(())
}

fn local_protection(da: &Device, db: &Device) -> CaseResult {
    let (a, _b) = pair(da, db, 7)?;
    let src = buf(4096)?;
    let smr =
        a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE)
            .map_err(e("reg_mr"))?;
    // An SGE beyond the region.
    post(
        &a,
        SendWr {
            wr_id: 5,
            op: SendOp::Send,
            sg_list: &[Sge {
                addr: smr.addr() + 4000,
                length: 200,
                lkey: smr.lkey(),
            }],
            flags: SendFlags::SIGNALED,
        },
    )?;
    let wc = wait_wc(&a.scq, "SEND with a bad SGE")?;
    check!(
        (wc.wr_id, wc.status) == (5, WcStatus::LocProtErr),
        "expected LocProtErr: {wc:?}"
    );
    Ok(())
}

fn too_long(da: &Device, db: &Device) -> CaseResult {
    let (a, b) = pair(da, db, 7)?;
    let src = buf(4096)?;
    let dst = buf(4096)?;
    let smr =
        a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE)
            .map_err(e("reg_mr"))?;
    let dmr =
        b.pd.reg_mr(&dst, AccessFlags::LOCAL_WRITE)
            .map_err(e("reg_mr"))?;
    b.qp.post_recv(&RecvWr {
        wr_id: 3,
        sg_list: &[dmr.sge(0, 16)],
    })
    .map_err(e("post_recv"))?;
    post(
        &a,
        SendWr {
            wr_id: 4,
            op: SendOp::Send,
            sg_list: &[smr.sge(0, 100)],
            flags: SendFlags::SIGNALED,
        },
    )?;
    let rc = wait_wc(&b.rcq, "receive of a too long SEND")?;
    check!(
        (rc.wr_id, rc.status) == (3, WcStatus::LocLenErr),
        "expected LocLenErr: {rc:?}"
    );
    let wc = wait_wc(&a.scq, "too long SEND")?;
    check!(
        (wc.wr_id, wc.status) == (4, WcStatus::RemInvReqErr),
        "expected RemInvReqErr: {wc:?}"
    );
    Ok(())
}

fn rnr_exceeded(da: &Device, db: &Device) -> CaseResult {
    // rnr_retry 0: the first RNR NAK ends the SEND.
    let (a, _b) = pair(da, db, 0)?;
    let src = buf(4096)?;
    let smr =
        a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE)
            .map_err(e("reg_mr"))?;
    post(
        &a,
        SendWr {
            wr_id: 6,
            op: SendOp::Send,
            sg_list: &[smr.sge(0, 8)],
            flags: SendFlags::SIGNALED,
        },
    )?;
    let wc = wait_wc(&a.scq, "SEND without a receive")?;
    check!(
        (wc.wr_id, wc.status) == (6, WcStatus::RnrRetryExcErr),
        "expected RnrRetryExcErr: {wc:?}"
    );
    Ok(())
}
