//! SMC-Rv2 LLC (type 0x2X, variable length) with big-endian length_v2/num_rkeys.
#![no_main]
use libfuzzer_sys::fuzz_target;
use smc_wire::llc::LlcFormat;

include!("common.rs");

fuzz_target!(|data: &[u8]| {
    let mut d = data.to_vec();
    if let Some(t) = d.first_mut() {
        // Steer the type byte into the v2 range so the fuzzer explores v2 layouts.
        *t = 0x20 | (*t & 0x0F);
    }
    llc_round_trip(&d, LlcFormat::LINUX_BE);
});
