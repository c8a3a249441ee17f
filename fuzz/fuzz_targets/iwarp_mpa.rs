//! MPA Request/Reply frames with the RFC 6581 enhanced data (smc-iwarp): parsing never
//! panics; what parses re-emits byte-identically (Res bits, which the receiver ignores,
//! aside) and re-parses equal.
#![no_main]
use libfuzzer_sys::fuzz_target;
use smc_iwarp::wire::mpa::{EnhancedData, MpaFrame, MpaRepr, ENHANCED_LEN};

fuzz_target!(|data: &[u8]| {
    let _ = EnhancedData::parse(data);
    let Ok(f) = MpaFrame::new_checked(data) else {
        return;
    };
    let Ok(r) = MpaRepr::parse(&f) else { return };
    let mut out = vec![0u8; r.buffer_len()];
    let n = r.emit(&mut out).expect("emit");
    assert_eq!(n, f.total_len());
    assert_eq!(&out[..16], &data[..16]);
    assert_eq!(out[16], data[16] & 0xf0, "flags without Res");
    assert_eq!(&out[17..20], &data[17..20]);
    if r.enhanced.is_some() {
        // A = 0 zeroes B/C/D on emit (RFC 6581 §9.2); the values themselves survive
        assert_eq!(out[20] & 0x3f, data[20] & 0x3f);
        assert_eq!(&out[20 + ENHANCED_LEN..n], &data[20 + ENHANCED_LEN..n]);
    } else {
        assert_eq!(&out[20..n], &data[20..n]);
    }
    assert_eq!(MpaRepr::parse_bytes(&out).expect("re-parse"), r);
});
