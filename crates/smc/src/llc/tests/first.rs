//! First contact (CHECKLIST §E.3 FC, §E.4 SL).

use super::*;

#[test]
fn smoke_v2_single_devices() {
    let mut sim = Sim::new(v2_pair(), 1);
    settle(&mut sim);
    println!("{}", sim.dump());
    println!("{:?}", sim.labels());
    sim.check_consistent().unwrap();
}

#[test]
fn smoke_rfc_two_devices() {
    let mut cfg = rfc_pair();
    cfg.server_devices = 2;
    cfg.client_devices = 2;
    let mut sim = Sim::new(cfg, 1);
    settle(&mut sim);
    println!("{}", sim.dump());
    println!("{:?}", sim.labels());
    sim.check_consistent().unwrap();
}
