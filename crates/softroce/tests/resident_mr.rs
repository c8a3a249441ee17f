//! Which registered regions the software RNIC makes resident up front: those a peer
//! writes into (REMOTE_WRITE, SMC-R's RMBs), as `ibv_reg_mr` pins them, so that placing
//! a peer's RDMA WRITE never waits in a page fault; not the others (a send buffer, which
//! the application fills first; receive slots), so that an idle connection does not pay
//! for them.

mod common;
use common::*;
use smc_softroce::Config;
use smc_verbs::*;

/// Resident pages of `buf`, from mincore(2).
fn resident_pages(buf: &RdmaBuffer) -> usize {
    let pages = buf.len().div_ceil(4096);
    let mut v = vec![0u8; pages];
    // SAFETY: mincore reads the page-table state of the buffer's own live mapping
    // (page-aligned, `len` rounded up to pages) and writes one byte per page into `v`.
    let r = unsafe { libc::mincore(buf.as_ptr().cast(), buf.len(), v.as_mut_ptr()) };
    assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
    v.iter().filter(|b| *b & 1 != 0).count()
}

#[test]
fn only_regions_a_peer_writes_into_are_made_resident() {
    let dev = device(97, 1, &Config::default());
    let pd = dev.alloc_pd().unwrap();
    let pages = 64;
    let rmb = buf(pages * 4096);
    let sndbuf = buf(pages * 4096);
    let slots = buf(pages * 4096);
    assert_eq!(resident_pages(&rmb), 0, "a fresh buffer is not resident");
    let _rmb_mr = pd
        .reg_mr(&rmb, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let _snd_mr = pd.reg_mr(&sndbuf, AccessFlags::empty()).unwrap();
    let _slots_mr = pd.reg_mr(&slots, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(resident_pages(&rmb), pages, "the RMB, every page");
    assert_eq!(
        resident_pages(&sndbuf),
        0,
        "a send buffer faults in as it is filled"
    );
    assert_eq!(
        resident_pages(&slots),
        0,
        "receive slots fault in as they are used"
    );
}
