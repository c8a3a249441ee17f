//! LLC v1 (and whatever else the type byte says) in both dialects.
#![no_main]
use libfuzzer_sys::fuzz_target;
use smc_wire::llc::LlcFormat;

include!("common.rs");

fuzz_target!(|data: &[u8]| {
    llc_round_trip(data, LlcFormat::RFC7609);
    llc_round_trip(data, LlcFormat::LINUX_X86);
});
