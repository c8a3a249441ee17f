//! UDP GSO/GRO transmission (`SMC_RS_SOFTROCE_GSO=1`, set for this whole
//! test process): trains of equal-sized packets leave in one send, each
//! segment's ICRC patched for the IPv4 ID the kernel numbers it with; the
//! receiver splits GRO datagrams back into packets. Data must arrive intact,
//! also with the fault injector on.

mod common;
use std::sync::atomic::Ordering;

use common::*;
use sha2::{Digest, Sha256};
use smc_softroce::{Config, FaultConfig};
use smc_verbs::*;

fn enable_gso() {
    // SAFETY-free in edition 2021; every test of this process sets the
    // same value before opening devices.
    std::env::set_var("SMC_RS_SOFTROCE_GSO", "1");
}

fn run(net: u8, cfg: &Config) -> (u64, u64) {
    enable_gso();
    let o = Opts::default();
    let (a, b) = pair(net, cfg, &o);
    const W: usize = 8 << 20;
    let src = buf(W);
    fill_pattern(&src, net);
    let smr = a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = buf(W);
    let dmr =
        b.pd.reg_mr(
            &dst,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    a.qp.post_send(&SendWr {
        wr_id: 1,
        op: SendOp::RdmaWrite {
            remote_addr: dmr.addr(),
            rkey: dmr.rkey(),
        },
        sg_list: &[smr.sge(0, W as u32)],
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    assert_eq!(wait_wc(&a.scq, T * 6).status, WcStatus::Success);
    assert_eq!(
        Sha256::digest(contents(&dst, 0, W)),
        Sha256::digest(contents(&src, 0, W))
    );
    // SENDs of 64 KiB.
    let rbuf = buf(1 << 20);
    let rmr = b.pd.reg_mr(&rbuf, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..16usize {
        b.qp.post_recv(&RecvWr {
            wr_id: i as u64,
            sg_list: &[rmr.sge(i << 16, 1 << 16)],
        })
        .unwrap();
        a.qp.post_send(&SendWr {
            wr_id: i as u64,
            op: SendOp::Send,
            sg_list: &[smr.sge(i << 16, 1 << 16)],
            flags: SendFlags::SIGNALED,
        })
        .unwrap();
    }
    for _ in 0..16 {
        assert_eq!(wait_wc(&a.scq, T * 6).status, WcStatus::Success);
        assert_eq!(wait_wc(&b.rcq, T * 6).status, WcStatus::Success);
    }
    assert_eq!(contents(&rbuf, 0, 1 << 20), contents(&src, 0, 1 << 20));
    // READ back 2 MiB (responses travel in GSO trains too).
    let back = buf(2 << 20);
    let bmr = a.pd.reg_mr(&back, AccessFlags::LOCAL_WRITE).unwrap();
    a.qp.post_send(&SendWr {
        wr_id: 2,
        op: SendOp::RdmaRead {
            remote_addr: dmr.addr(),
            rkey: dmr.rkey(),
        },
        sg_list: &[bmr.sge(0, 2 << 20)],
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    assert_eq!(wait_wc(&a.scq, T * 6).status, WcStatus::Success);
    assert_eq!(contents(&back, 0, 2 << 20), contents(&src, 0, 2 << 20));
    let sb = smc_softroce::stats(&b.dev).unwrap();
    let sa = smc_softroce::stats(&a.dev).unwrap();
    (
        sb.rx_icrc_id_recovered.load(Ordering::Relaxed)
            + sa.rx_icrc_id_recovered.load(Ordering::Relaxed),
        sb.rx_bad_icrc.load(Ordering::Relaxed) + sa.rx_bad_icrc.load(Ordering::Relaxed),
    )
}

#[test]
fn gso_trains_arrive_intact() {
    let (recovered, bad) = run(50, &Config::default());
    // Segments after the first carry ICRCs for IDs 1, 2, ...
    assert!(recovered > 1000, "{recovered}");
    assert_eq!(bad, 0);
}

#[test]
fn gso_with_faults() {
    let cfg = Config {
        faults: Some(FaultConfig {
            seed: 3,
            loss: 0.03,
            reorder: 0.02,
            duplicate: 0.02,
        }),
        ..Config::default()
    };
    let (_, bad) = run(51, &cfg);
    assert_eq!(bad, 0);
}
