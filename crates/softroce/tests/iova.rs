//! Memory-region addresses (item 8 of issue 10): the address a region is
//! known by (`Mr::addr`, what SMC-R advertises to its peer as the RMB
//! address) is an I/O virtual address the provider translates, not the
//! process's virtual address, so a peer learns nothing about our address
//! space layout. ibverbs has the same with `ibv_reg_mr_iova`.

mod common;
use common::*;
use smc_softroce::Config;
use smc_verbs::*;

#[test]
fn regions_are_addressed_by_iova_not_by_process_address() {
    let o = Opts::default();
    let (a, b) = pair(60, &Config::default(), &o);
    let mem = buf(3 * 4096);
    let va = mem.as_ptr() as u64;
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let whole = b.pd.reg_mr(&mem, all).unwrap();
    let part = b.pd.reg_mr_range(&mem, 4104, 4096, all).unwrap();
    // Not the process address, nor derived from it by the region offset.
    assert_ne!(whole.addr(), va);
    assert_ne!(part.addr(), va + 4104);
    assert_ne!(part.addr() - 4104, whole.addr(), "regions share one base");
    let span = va..va + 3 * 4096;
    assert!(!span.contains(&whole.addr()) && !span.contains(&part.addr()));
    // Alignment within a page is kept (8-byte alignment of atomic targets).
    assert_eq!(whole.addr() % 4096, 0);
    assert_eq!(part.addr() % 4096, 4104 % 4096);
    // The data path translates: a WRITE to part.addr() + 8 lands at
    // buffer offset 4112.
    let src = buf(4096);
    fill_pattern(&src, 60);
    let smr = a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE).unwrap();
    a.qp.post_send(&SendWr {
        wr_id: 1,
        op: SendOp::RdmaWrite {
            remote_addr: part.addr() + 8,
            rkey: part.rkey(),
        },
        sg_list: &[smr.sge(0, 100)],
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    assert_eq!(wait_wc(&a.scq, T).status, WcStatus::Success);
    assert_eq!(contents(&mem, 4112, 100), contents(&src, 0, 100));
    assert_eq!(contents(&mem, 4104, 8), vec![0; 8]);
    // A local SGE that names the process address is not in the region.
    a.qp.post_send(&SendWr {
        wr_id: 2,
        op: SendOp::Send,
        sg_list: &[Sge {
            addr: src.as_ptr() as u64,
            length: 16,
            lkey: smr.lkey(),
        }],
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    let wc = wait_wc(&a.scq, T);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::LocProtErr));
}

/// INLINE data is read through a region covering its address, which must
/// belong to the QP's protection domain (lkeys are not checked for INLINE,
/// the PD still is).
#[test]
fn inline_data_comes_from_the_qps_own_protection_domain() {
    let o = Opts::default();
    let (a, _b) = pair(61, &Config::default(), &o);
    let secret = buf(4096);
    secret.fill(0, 4096, 0x5e);
    let other_pd = a.dev.alloc_pd().unwrap();
    let other = other_pd.reg_mr(&secret, AccessFlags::LOCAL_WRITE).unwrap();
    a.qp.post_send(&SendWr {
        wr_id: 3,
        op: SendOp::Send,
        sg_list: &[Sge {
            addr: other.addr(),
            length: 16,
            lkey: 0,
        }],
        flags: SendFlags::SIGNALED | SendFlags::INLINE,
    })
    .unwrap();
    let wc = wait_wc(&a.scq, T);
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::LocProtErr));
}
