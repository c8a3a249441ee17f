//! TCP options block scan: never panics, and a reported option really is the SMC-R option.
#![no_main]
use libfuzzer_sys::fuzz_target;
use smc_wire::tcp_option::{self, Scan};

fuzz_target!(|data: &[u8]| {
    if let Ok(Scan::Found(at)) = tcp_option::scan(data) {
        assert_eq!(&data[at..at + 6], &tcp_option::ALIGNED[2..]);
    }
});
