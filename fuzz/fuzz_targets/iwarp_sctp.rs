//! DDP over SCTP session control messages with the RFC 6581 §7 function codes
//! (smc-iwarp): parsing never panics; what parses re-emits byte-identically (the enhanced
//! word's B/C/D, which are ignored with A = 0, aside) and re-parses equal; whatever is
//! accepted keeps RFC 6581 §7's rules (private data at most 512 bytes, none in a
//! Terminate, the enhanced data first in Enhanced Initiate/Accept).
#![no_main]
use libfuzzer_sys::fuzz_target;
use smc_iwarp::wire::sctp::{
    DdpSctpPayload, FunctionCode, SessionControl, SessionControlRepr,
    PPID_DDP_STREAM_SESSION_CONTROL,
};

fuzz_target!(|data: &[u8]| {
    let _ = DdpSctpPayload::parse(PPID_DDP_STREAM_SESSION_CONTROL, data);
    let Ok(m) = SessionControl::new_checked(data) else {
        return;
    };
    assert!(m.pd_length() <= 512);
    let Ok(r) = SessionControlRepr::parse(&m) else {
        return;
    };
    if r.function == FunctionCode::Terminate {
        assert!(m.private_data().is_empty());
    }
    assert_eq!(r.enhanced.is_some(), r.function.carries_enhanced_data());
    let mut out = vec![0u8; r.buffer_len()];
    let n = r.emit(&mut out).expect("emit");
    assert_eq!(n, m.total_len());
    assert_eq!(&out[..4], &data[..4]);
    if r.enhanced.is_some() {
        // A = 0 zeroes B/C/D on emit (RFC 6581 §9.2); IRD/ORD and the ULP data survive
        assert_eq!(out[4] & 0x3f, data[4] & 0x3f);
        assert_eq!(out[6] & 0x3f, data[6] & 0x3f);
        assert_eq!(&out[8..n], &data[8..n]);
    } else {
        assert_eq!(&out[4..n], &data[4..n]);
    }
    assert_eq!(SessionControlRepr::parse_bytes(&out).expect("re-parse"), r);
});
