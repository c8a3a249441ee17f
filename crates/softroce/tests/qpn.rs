//! QP numbers: a device instance starts at a random QPN (≥ 17, 24 bits), so a peer still
//! holding a link to a previous process on the same address does not hit the new process's
//! QPs with plausible packets.

mod common;

use common::{device, side, Opts};
use smc_softroce::Config;

#[test]
fn each_device_instance_starts_at_its_own_random_qpn() {
    let mut firsts = Vec::new();
    for host in 1..=3 {
        // A fresh device instance each time (as in a restarted process); with a fixed
        // starting point all three would hand out the same first QPN.
        let dev = device(120, host, &Config::default());
        let a = side(&dev, &Opts::default(), 0);
        let b = side(&dev, &Opts::default(), 0);
        let (qa, qb) = (a.qp.qpn(), b.qp.qpn());
        for q in [qa, qb] {
            assert!((17..=0x00ff_ffff).contains(&q), "QPN {q:#x} out of range");
        }
        assert_ne!(qa, qb, "two live QPs share a QPN");
        firsts.push(qa);
        drop((a, b, dev));
    }
    // Three draws from ~15.7 million values: equal ones mean the start is not random.
    firsts.sort_unstable();
    firsts.dedup();
    assert_eq!(
        firsts.len(),
        3,
        "three device instances handed out the same a first QPN"
    );
}
