//! CLC: arbitrary bytes never panic; whatever parses re-emits to the same length and
//! re-parses to the same value.
#![no_main]
use libfuzzer_sys::fuzz_target;
use smc_wire::clc::{self, ClcMessage};

fuzz_target!(|data: &[u8]| {
    if let Ok(n) = clc::message_len(data) {
        assert!(n >= 12);
    }
    if let Ok(m) = ClcMessage::parse(data) {
        let out = m.to_vec().expect("a parsed message emits");
        assert_eq!(out.len(), data.len());
        assert_eq!(ClcMessage::parse(&out).expect("emitted message parses"), m);
    }
});
