//! CDC (and the LLC/CDC demultiplexer): never panics; parsed values round-trip.
#![no_main]
use libfuzzer_sys::fuzz_target;
use smc_wire::cdc::{CdcMessage, CdcRepr};
use smc_wire::llc::LlcFormat;
use smc_wire::ControlMessage;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = CdcMessage::new_checked(data) {
        let r = CdcRepr::parse(&v);
        let mut out = [0u8; 44];
        r.emit(&mut out).expect("emit");
        assert_eq!(CdcRepr::parse_bytes(&out).expect("re-parse"), r);
    }
    if let Ok(m) = ControlMessage::parse(data, LlcFormat::LINUX_X86) {
        let mut out = vec![0u8; m.buffer_len()];
        m.emit(&mut out, LlcFormat::LINUX_X86).expect("emit");
        assert_eq!(
            ControlMessage::parse(&out, LlcFormat::LINUX_X86).expect("re-parse"),
            m
        );
    }
});
