//! Deterministic tests of the link-group machine. Test functions carry the CHECKLIST
//! conformance IDs (§E.3 FC, §E.4 SL, §E.6 LGM, §E.7 RK, §E.8 LLC, §E.12 KA).

mod first;
mod random;

use std::time::Duration;

use super::sim::{Sim, SimConfig, CLIENT, SERVER};
use super::*;

/// A Linux-style SMC-Rv2 pair.
pub(super) fn v2_pair() -> SimConfig {
    SimConfig::pair(LlcConfig::linux(Role::Server, Version::V2))
}

/// An RFC 7609 v1 pair.
pub(super) fn rfc_pair() -> SimConfig {
    SimConfig::pair(LlcConfig::rfc(Role::Server))
}

pub(super) fn settle(sim: &mut Sim) {
    assert!(sim.settle(Duration::from_secs(30)), "did not settle:\n{}", sim.dump());
}
