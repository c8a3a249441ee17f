//! MPA FPDUs (smc-iwarp): framing never panics; a parsed FPDU re-emits byte-identically
//! when its CRC (or zero CRC) and pad are right.
#![no_main]
use libfuzzer_sys::fuzz_target;
use smc_iwarp::wire::mpa::{emit_fpdu, Fpdu};

fuzz_target!(|data: &[u8]| {
    let Ok(f) = Fpdu::new_checked(data) else {
        return;
    };
    let n = f.total_len();
    let crc = f.crc_field() != 0;
    let mut out = vec![0u8; n];
    assert_eq!(emit_fpdu(&mut out, f.ulpdu(), crc).expect("emit"), n);
    let pad_zero = data[2 + f.ulpdu_len()..n - 4].iter().all(|&b| b == 0);
    if pad_zero && (f.crc_ok() || f.crc_field() == 0) {
        assert_eq!(&out[..], &data[..n]);
    }
});
