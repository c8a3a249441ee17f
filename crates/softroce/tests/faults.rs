//! Large transfers with the seeded fault injector on both devices (loss,
//! reordering, duplication): data arrives intact (SHA-256 checked), atomics
//! execute exactly once, and the run ends in bounded time.

mod common;
use std::time::{Duration, Instant};

use common::*;
use sha2::{Digest, Sha256};
use smc_softroce::{Config, FaultConfig};
use smc_verbs::*;

fn faulty(seed: u64) -> Config {
    Config {
        faults: Some(FaultConfig {
            seed,
            loss: 0.05,
            reorder: 0.02,
            duplicate: 0.02,
        }),
        ..Config::default()
    }
}

fn sha(b: &RdmaBuffer, off: usize, len: usize) -> Vec<u8> {
    Sha256::digest(contents(b, off, len)).to_vec()
}

const BIG: Duration = Duration::from_secs(120);

#[test]
fn write_32mib_and_send_8mib_with_loss_reorder_dup() {
    let o = Opts::default();
    let (a, b) = pair(40, &faulty(1), &o);
    let t0 = Instant::now();
    const W: usize = 32 << 20;
    let src = buf(W);
    fill_pattern(&src, 40);
    let smr = a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = buf(W);
    let dmr =
        b.pd.reg_mr(&dst, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
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
    let wc = wait_wc(&a.scq, BIG);
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(sha(&dst, 0, W), sha(&src, 0, W), "32 MiB WRITE corrupted");
    // 8 MiB of SENDs, 64 KiB each, receives posted ahead.
    const S: usize = 8 << 20;
    const M: usize = 64 << 10;
    let rbuf = buf(S);
    let rmr = b.pd.reg_mr(&rbuf, AccessFlags::LOCAL_WRITE).unwrap();
    let n = S / M;
    let mut posted = 0;
    let mut done = 0;
    while done < n {
        while posted < n && posted - done < 64 {
            b.qp.post_recv(&RecvWr {
                wr_id: posted as u64,
                sg_list: &[rmr.sge(posted * M, M as u32)],
            })
            .unwrap();
            a.qp.post_send(&SendWr {
                wr_id: posted as u64,
                op: SendOp::Send,
                sg_list: &[smr.sge(posted * M, M as u32)],
                flags: SendFlags::SIGNALED,
            })
            .unwrap();
            posted += 1;
        }
        let wc = wait_wc(&a.scq, BIG);
        assert_eq!((wc.wr_id, wc.status), (done as u64, WcStatus::Success));
        let rc = wait_wc(&b.rcq, BIG);
        assert_eq!(
            (rc.wr_id, rc.status, rc.byte_len as usize),
            (done as u64, WcStatus::Success, M)
        );
        done += 1;
    }
    assert_eq!(
        sha(&rbuf, 0, S),
        sha(&src, 0, S),
        "8 MiB of SENDs corrupted"
    );
    let st = smc_softroce::stats(&a.dev).unwrap();
    assert!(
        st.fault_dropped.load(std::sync::atomic::Ordering::Relaxed) > 100,
        "faults were not injected"
    );
    eprintln!(
        "faulty 32 MiB WRITE + 8 MiB SEND in {:?}; A {:?}",
        t0.elapsed(),
        st
    );
}

#[test]
fn read_and_atomics_with_loss_reorder_dup() {
    let o = Opts::default();
    let (a, b) = pair(41, &faulty(7), &o);
    const R: usize = 4 << 20;
    let remote = buf(R);
    fill_pattern(&remote, 41);
    let rmr =
        b.pd.reg_mr(
            &remote,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
        )
        .unwrap();
    let local = buf(R);
    let lmr = a.pd.reg_mr(&local, AccessFlags::LOCAL_WRITE).unwrap();
    for (i, chunk) in [R, 1 << 20, 5000].iter().enumerate() {
        local.fill(0, R, 0);
        a.qp.post_send(&SendWr {
            wr_id: i as u64,
            op: SendOp::RdmaRead {
                remote_addr: rmr.addr(),
                rkey: rmr.rkey(),
            },
            sg_list: &[lmr.sge(0, *chunk as u32)],
            flags: SendFlags::SIGNALED,
        })
        .unwrap();
        assert_eq!(wait_wc(&a.scq, BIG).status, WcStatus::Success);
        assert_eq!(sha(&local, 0, *chunk), sha(&remote, 0, *chunk));
    }
    // Fetch-adds: duplicates and retransmissions must not add twice (PSN-3).
    remote.write(0, &0u64.to_ne_bytes());
    for i in 0..300u64 {
        a.qp.post_send(&SendWr {
            wr_id: i,
            op: SendOp::AtomicFetchAdd {
                remote_addr: rmr.addr(),
                rkey: rmr.rkey(),
                add: 1,
            },
            sg_list: &[lmr.sge(8 * (i as usize % 64), 8)],
            flags: SendFlags::SIGNALED,
        })
        .unwrap();
        let wc = wait_wc(&a.scq, BIG);
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
        let got = u64::from_ne_bytes(
            contents(&local, 8 * (i as usize % 64), 8)
                .try_into()
                .unwrap(),
        );
        assert_eq!(got, i, "fetch-add {i} returned a wrong original value");
    }
    assert_eq!(
        u64::from_ne_bytes(contents(&remote, 0, 8).try_into().unwrap()),
        300
    );
}

#[test]
fn read_32mib_in_one_request() {
    // One READ whose responses far exceed the socket buffers: the
    // requester re-requests from the first gap (PSN-3) until done.
    let o = Opts::default();
    let (a, b) = pair(42, &Config::default(), &o);
    const R: usize = 32 << 20;
    let remote = buf(R);
    fill_pattern(&remote, 42);
    let rmr =
        b.pd.reg_mr(&remote, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
            .unwrap();
    let local = buf(R);
    let lmr = a.pd.reg_mr(&local, AccessFlags::LOCAL_WRITE).unwrap();
    let t0 = Instant::now();
    a.qp.post_send(&SendWr {
        wr_id: 1,
        op: SendOp::RdmaRead {
            remote_addr: rmr.addr(),
            rkey: rmr.rkey(),
        },
        sg_list: &[lmr.sge(0, R as u32)],
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    assert_eq!(wait_wc(&a.scq, BIG).status, WcStatus::Success);
    assert_eq!(sha(&local, 0, R), sha(&remote, 0, R));
    eprintln!(
        "32 MiB READ in {:?}; B {:?}",
        t0.elapsed(),
        smc_softroce::stats(&b.dev)
    );
}
