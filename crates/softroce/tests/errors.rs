//! Every completion status, protection checks, RNR, retry exhaustion and
//! flushing, between two devices over loopback.

mod common;
use std::time::Duration;

use common::*;
use smc_softroce::Config;
use smc_verbs::*;

fn write_wr(wr_id: u64, sge: &Sge, remote_addr: u64, rkey: u32) -> SendWr<'_> {
    SendWr {
        wr_id,
        op: SendOp::RdmaWrite { remote_addr, rkey },
        sg_list: std::slice::from_ref(sge),
        flags: SendFlags::SIGNALED,
    }
}

/// Posts a failing request followed by one more, and checks the first
/// completes with `status`, the second is flushed and the QP is in ERR.
fn expect_failure(a: &Side, wr: &SendWr<'_>, status: WcStatus) {
    let follow = SendWr {
        wr_id: 999,
        op: SendOp::Send,
        sg_list: &[],
        flags: SendFlags::SIGNALED,
    };
    a.qp.post_send_batch(&[*wr, follow]).unwrap();
    let wc = wait_wc(&a.scq, T);
    assert_eq!((wc.wr_id, wc.status), (wr.wr_id, status));
    let wc = wait_wc(&a.scq, T);
    assert_eq!((wc.wr_id, wc.status), (999, WcStatus::WrFlushErr));
    assert_eq!(a.qp.state(), QpState::Err);
}

#[test]
fn remote_access_errors_leave_memory_unchanged() {
    let o = Opts::default();
    let cases: [(&str, u8); 6] = [
        ("out of bounds", 20),
        ("stale rkey", 21),
        ("no REMOTE_WRITE", 22),
        ("read without REMOTE_READ", 23),
        ("atomic without REMOTE_ATOMIC", 24),
        ("other PD", 25),
    ];
    for (what, net) in cases {
        let (a, b) = pair(net, &Config::default(), &o);
        let src = buf(8192);
        fill_pattern(&src, 9);
        let smr = a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE).unwrap();
        let dst = buf(8192);
        dst.fill(0, 8192, 0x5a);
        let sge = smr.sge(0, 4096);
        let sge8 = smr.sge(0, 8);
        let all = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        match what {
            "out of bounds" => {
                let dmr = b.pd.reg_mr_range(&dst, 0, 4096, all).unwrap();
                expect_failure(
                    &a,
                    &write_wr(1, &sge, dmr.addr() + 1, dmr.rkey()),
                    WcStatus::RemAccessErr,
                );
            }
            "stale rkey" => {
                let dmr = b.pd.reg_mr(&dst, all).unwrap();
                let (addr, rkey) = (dmr.addr(), dmr.rkey());
                drop(dmr);
                expect_failure(&a, &write_wr(1, &sge, addr, rkey), WcStatus::RemAccessErr);
            }
            "no REMOTE_WRITE" => {
                let dmr =
                    b.pd.reg_mr(&dst, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
                        .unwrap();
                expect_failure(
                    &a,
                    &write_wr(1, &sge, dmr.addr(), dmr.rkey()),
                    WcStatus::RemAccessErr,
                );
            }
            "read without REMOTE_READ" => {
                let dmr =
                    b.pd.reg_mr(&dst, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
                        .unwrap();
                let wr = SendWr {
                    wr_id: 1,
                    op: SendOp::RdmaRead {
                        remote_addr: dmr.addr(),
                        rkey: dmr.rkey(),
                    },
                    sg_list: std::slice::from_ref(&sge),
                    flags: SendFlags::SIGNALED,
                };
                expect_failure(&a, &wr, WcStatus::RemAccessErr);
            }
            "atomic without REMOTE_ATOMIC" => {
                let dmr =
                    b.pd.reg_mr(&dst, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
                        .unwrap();
                let wr = SendWr {
                    wr_id: 1,
                    op: SendOp::AtomicFetchAdd {
                        remote_addr: dmr.addr(),
                        rkey: dmr.rkey(),
                        add: 1,
                    },
                    sg_list: std::slice::from_ref(&sge8),
                    flags: SendFlags::SIGNALED,
                };
                expect_failure(&a, &wr, WcStatus::RemAccessErr);
            }
            "other PD" => {
                let other = b.dev.alloc_pd().unwrap();
                let dmr = other.reg_mr(&dst, all).unwrap();
                expect_failure(
                    &a,
                    &write_wr(1, &sge, dmr.addr(), dmr.rkey()),
                    WcStatus::RemAccessErr,
                );
            }
            _ => unreachable!(),
        }
        assert!(
            contents(&dst, 0, 8192).iter().all(|&x| x == 0x5a),
            "{what}: target memory changed"
        );
        // The responder NAKed and moved to ERR as well (RK-C1).
        let deadline = std::time::Instant::now() + T;
        while b.qp.state() != QpState::Err {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: responder not in ERR"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[test]
fn qp_without_remote_write_access_is_refused() {
    let o = Opts {
        access: AccessFlags::LOCAL_WRITE,
        ..Opts::default()
    };
    let (a, b) = pair(26, &Config::default(), &o);
    let src = buf(4096);
    let smr = a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = buf(4096);
    let dmr =
        b.pd.reg_mr(&dst, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    src.fill(0, 4096, 1);
    expect_failure(
        &a,
        &write_wr(1, &smr.sge(0, 100), dmr.addr(), dmr.rkey()),
        WcStatus::RemAccessErr,
    );
    assert!(contents(&dst, 0, 4096).iter().all(|&x| x == 0));
}

#[test]
fn rnr_retry_exceeded_without_receive() {
    let o = Opts {
        rts: RtsAttr {
            timeout: 12,
            rnr_retry: 0,
            ..RtsAttr::default()
        },
        ..Opts::default()
    };
    let (a, _b) = pair(27, &Config::default(), &o);
    expect_failure(
        &a,
        &SendWr {
            wr_id: 5,
            op: SendOp::Send,
            sg_list: &[],
            flags: SendFlags::SIGNALED,
        },
        WcStatus::RnrRetryExcErr,
    );
}

#[test]
fn rnr_retries_until_a_late_receive() {
    let o = Opts {
        rts: RtsAttr {
            timeout: 12,
            rnr_retry: 7,
            ..RtsAttr::default()
        },
        min_rnr_timer: 14,
        ..Opts::default()
    };
    let (a, b) = pair(28, &Config::default(), &o);
    let src = buf(4096);
    src.write(0, b"late but welcome");
    let smr = a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = buf(4096);
    let dmr = b.pd.reg_mr(&dst, AccessFlags::LOCAL_WRITE).unwrap();
    a.qp.post_send(&SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sg_list: &[smr.sge(0, 16)],
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    // Also a WRITE with immediate, which needs a receive too.
    let wmr =
        b.pd.reg_mr(
            &buf(4096),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    a.qp.post_send(&SendWr {
        wr_id: 2,
        op: SendOp::RdmaWriteWithImm {
            remote_addr: wmr.addr(),
            rkey: wmr.rkey(),
            imm: 3,
        },
        sg_list: &[smr.sge(0, 16)],
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    no_wc(&a.scq, Duration::from_millis(50));
    b.qp.post_recv(&RecvWr {
        wr_id: 10,
        sg_list: &[dmr.sge(0, 64)],
    })
    .unwrap();
    b.qp.post_recv(&RecvWr {
        wr_id: 11,
        sg_list: &[],
    })
    .unwrap();
    assert_eq!(wait_wc(&a.scq, T).status, WcStatus::Success);
    assert_eq!(wait_wc(&a.scq, T).status, WcStatus::Success);
    let rc = wait_wc(&b.rcq, T);
    assert_eq!((rc.wr_id, rc.byte_len), (10, 16));
    assert_eq!(contents(&dst, 0, 16), b"late but welcome");
    let rc = wait_wc(&b.rcq, T);
    assert_eq!(
        (rc.wr_id, rc.opcode, rc.imm_data),
        (11, WcOpcode::RecvRdmaWithImm, Some(3))
    );
}

#[test]
fn retry_exceeded_when_peer_is_gone() {
    let o = Opts {
        rts: RtsAttr {
            timeout: 10,
            retry_cnt: 2,
            ..RtsAttr::default()
        },
        ..Opts::default()
    };
    let (a, b) = pair(29, &Config::default(), &o);
    drop(b); // destroys the responder QP: its packets are dropped
    let src = buf(4096);
    let smr = a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE).unwrap();
    let t0 = std::time::Instant::now();
    expect_failure(
        &a,
        &SendWr {
            wr_id: 3,
            op: SendOp::Send,
            sg_list: &[smr.sge(0, 100)],
            flags: SendFlags::SIGNALED,
        },
        WcStatus::RetryExcErr,
    );
    // 3 transmissions × ~4 ms timeout.
    assert!(
        t0.elapsed() >= Duration::from_millis(10),
        "{:?}",
        t0.elapsed()
    );
}

#[test]
fn flush_on_err_and_posting_in_err() {
    let o = Opts::default();
    let (_a, b) = pair(30, &Config::default(), &o);
    let dst = buf(4096);
    let dmr = b.pd.reg_mr(&dst, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..3 {
        b.qp.post_recv(&RecvWr {
            wr_id: i,
            sg_list: &[dmr.sge(0, 64)],
        })
        .unwrap();
    }
    b.qp.modify_to_err().unwrap();
    for i in 0..3 {
        let wc = wait_wc(&b.rcq, T);
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (i, WcStatus::WrFlushErr, WcOpcode::Recv)
        );
    }
    // Posting in ERR completes at once with flush errors.
    b.qp.post_recv(&RecvWr {
        wr_id: 7,
        sg_list: &[],
    })
    .unwrap();
    assert_eq!(wait_wc(&b.rcq, T).status, WcStatus::WrFlushErr);
    b.qp.post_send(&SendWr {
        wr_id: 8,
        op: SendOp::Send,
        sg_list: &[],
        flags: SendFlags::empty(),
    })
    .unwrap();
    let wc = wait_wc(&b.scq, T);
    assert_eq!((wc.wr_id, wc.status), (8, WcStatus::WrFlushErr));
    // ERR → RESET → INIT works, RTS transitions are checked.
    b.qp.modify_to_reset().unwrap();
    assert_eq!(b.qp.state(), QpState::Reset);
    assert!(matches!(
        b.qp.post_recv(&RecvWr {
            wr_id: 0,
            sg_list: &[]
        }),
        Err(VerbsError::InvalidState(QpState::Reset))
    ));
    assert!(matches!(
        b.qp.modify_to_rts(&RtsAttr::default()),
        Err(VerbsError::InvalidTransition { .. })
    ));
    b.qp.modify_to_init(&InitAttr::default()).unwrap();
    assert!(matches!(
        b.qp.post_send(&SendWr {
            wr_id: 0,
            op: SendOp::Send,
            sg_list: &[],
            flags: SendFlags::empty()
        }),
        Err(VerbsError::InvalidState(QpState::Init))
    ));
}

#[test]
fn local_protection_error() {
    let o = Opts::default();
    let (a, _b) = pair(31, &Config::default(), &o);
    let src = buf(4096);
    let smr = a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE).unwrap();
    let bad = Sge {
        addr: smr.addr() + 4000,
        length: 200,
        lkey: smr.lkey(),
    }; // beyond the region
    expect_failure(
        &a,
        &SendWr {
            wr_id: 4,
            op: SendOp::Send,
            sg_list: &[bad],
            flags: SendFlags::SIGNALED,
        },
        WcStatus::LocProtErr,
    );
}

#[test]
fn read_into_region_without_local_write_is_a_protection_error() {
    let o = Opts::default();
    let (a, b) = pair(32, &Config::default(), &o);
    let local = buf(4096);
    let lmr = a.pd.reg_mr(&local, AccessFlags::empty()).unwrap();
    let rmr = b.pd.reg_mr(&buf(4096), AccessFlags::REMOTE_READ).unwrap();
    let wr = SendWr {
        wr_id: 6,
        op: SendOp::RdmaRead {
            remote_addr: rmr.addr(),
            rkey: rmr.rkey(),
        },
        sg_list: &[lmr.sge(0, 64)],
        flags: SendFlags::SIGNALED,
    };
    expect_failure(&a, &wr, WcStatus::LocProtErr);
}

#[test]
fn message_too_long_for_receive() {
    let o = Opts::default();
    let (a, b) = pair(33, &Config::default(), &o);
    let src = buf(8192);
    let smr = a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = buf(4096);
    let dmr = b.pd.reg_mr(&dst, AccessFlags::LOCAL_WRITE).unwrap();
    b.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: &[dmr.sge(0, 100)],
    })
    .unwrap();
    expect_failure(
        &a,
        &SendWr {
            wr_id: 2,
            op: SendOp::Send,
            sg_list: &[smr.sge(0, 5000)],
            flags: SendFlags::SIGNALED,
        },
        WcStatus::RemInvReqErr,
    );
    let rc = wait_wc(&b.rcq, T);
    assert_eq!((rc.wr_id, rc.status), (1, WcStatus::LocLenErr));
}

#[test]
fn misaligned_atomic_is_an_invalid_request() {
    let o = Opts::default();
    let (a, b) = pair(34, &Config::default(), &o);
    let lmr = a.pd.reg_mr(&buf(4096), AccessFlags::LOCAL_WRITE).unwrap();
    let rmr =
        b.pd.reg_mr(
            &buf(4096),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
        )
        .unwrap();
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::AtomicCmpSwap {
            remote_addr: rmr.addr() + 4,
            rkey: rmr.rkey(),
            compare: 0,
            swap: 1,
        },
        sg_list: &[lmr.sge(0, 8)],
        flags: SendFlags::SIGNALED,
    };
    expect_failure(&a, &wr, WcStatus::RemInvReqErr);
}

#[test]
fn receive_with_bad_lkey_is_a_remote_operational_error() {
    let o = Opts::default();
    let (a, b) = pair(35, &Config::default(), &o);
    let src = buf(4096);
    let smr = a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE).unwrap();
    b.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: &[Sge {
            addr: 0x1000,
            length: 64,
            lkey: 0xdead_beef,
        }],
    })
    .unwrap();
    expect_failure(
        &a,
        &SendWr {
            wr_id: 2,
            op: SendOp::Send,
            sg_list: &[smr.sge(0, 10)],
            flags: SendFlags::SIGNALED,
        },
        WcStatus::RemOpErr,
    );
    let rc = wait_wc(&b.rcq, T);
    assert_eq!((rc.wr_id, rc.status), (1, WcStatus::LocProtErr));
}

#[test]
fn completion_handler_and_event_fd() {
    let o = Opts::default();
    let (a, b) = pair(36, &Config::default(), &o);
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h = hits.clone();
    b.rcq.set_handler(Some(std::sync::Arc::new(move || {
        h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    })));
    b.rcq.req_notify(false);
    b.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: &[],
    })
    .unwrap();
    a.qp.post_send(&SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sg_list: &[],
        flags: SendFlags::empty(),
    })
    .unwrap();
    assert!(b.rcq.wait(Some(T)).unwrap());
    let deadline = std::time::Instant::now() + T;
    while hits.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(std::time::Instant::now() < deadline, "handler not called");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Solicited-only arming ignores an unsolicited completion.
    let mut wc = [WorkCompletion::default()];
    assert_eq!(b.rcq.poll(&mut wc), 1);
    b.rcq.ack_events();
    b.rcq.req_notify(true);
    let before = hits.load(std::sync::atomic::Ordering::SeqCst);
    b.qp.post_recv(&RecvWr {
        wr_id: 2,
        sg_list: &[],
    })
    .unwrap();
    a.qp.post_send(&SendWr {
        wr_id: 2,
        op: SendOp::Send,
        sg_list: &[],
        flags: SendFlags::empty(),
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(b.rcq.pending(), 1);
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), before);
    b.qp.post_recv(&RecvWr {
        wr_id: 3,
        sg_list: &[],
    })
    .unwrap();
    a.qp.post_send(&SendWr {
        wr_id: 3,
        op: SendOp::Send,
        sg_list: &[],
        flags: SendFlags::SOLICITED,
    })
    .unwrap();
    let deadline = std::time::Instant::now() + T;
    while hits.load(std::sync::atomic::Ordering::SeqCst) == before {
        assert!(
            std::time::Instant::now() < deadline,
            "solicited completion did not fire"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn cq_overflow_moves_the_qp_to_err() {
    let o = Opts::default();
    let da = device(37, 1, &Config::default());
    let db = device(37, 2, &Config::default());
    let mut a = side(&da, &o, 0);
    let b = side(&db, &o, 0);
    // Replace A's QP with one whose send CQ holds 2 completions.
    let small = da.create_cq(2).unwrap();
    a.qp =
        a.pd.create_qp(&QpInitAttr {
            send_cq: small.clone(),
            recv_cq: a.rcq.clone(),
            cap: o.cap,
            sq_sig_all: true,
        })
        .unwrap();
    a.qp.modify_to_init(&InitAttr::default()).unwrap();
    connect(&a, &b, &o);
    for _ in 0..4 {
        b.qp.post_recv(&RecvWr {
            wr_id: 0,
            sg_list: &[],
        })
        .unwrap();
    }
    for i in 0..4 {
        a.qp.post_send(&SendWr {
            wr_id: i,
            op: SendOp::Send,
            sg_list: &[],
            flags: SendFlags::empty(),
        })
        .unwrap();
    }
    let deadline = std::time::Instant::now() + T;
    while !small.0.overflowed() || a.qp.state() != QpState::Err {
        assert!(std::time::Instant::now() < deadline, "no overflow");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(small.pending(), 2);
}

#[test]
fn provider_returns_one_device_per_address() {
    use smc_softroce::SoftRoce;
    let p = SoftRoce::new(Config::default());
    let ip = addr(38, 1);
    let d1 = p.device_for(ip).unwrap();
    let d2 = p.device_for(ip).unwrap();
    assert_eq!(d1.name(), d2.name());
    assert_eq!(p.name(), "softroce");
    assert_eq!(p.devices().len(), 1);
    assert_eq!(d1.gid(), Gid::from_ip(ip));
    assert_eq!(d1.attr().local_addr, ip);
    assert_eq!(d1.attr().active_mtu, Mtu::Mtu4096); // loopback
    assert_eq!(d1.attr().mac.0[0] & 0x02, 0x02); // locally administered
    assert!(d1.is_active());
    // A second device on the same address (as another process would open) shares the
    // port where the port can be shared (root: CAP_BPF, docs/port-sharing.md); else its
    // bind fails cleanly.
    let second = smc_softroce::open_device(ip, &Config::default());
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        let d3 = second.expect("a second device shares the port");
        assert_ne!(d3.name(), d1.name());
    } else {
        assert!(second.is_err());
    }
}
