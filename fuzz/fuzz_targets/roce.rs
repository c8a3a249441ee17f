//! RoCEv2 packets (smc-softroce wire + ICRC): parsing never panics; what
//! parses re-emits to the same length, byte-identical in its headers, and
//! re-parses to the same headers and payload span.
#![no_main]
use libfuzzer_sys::fuzz_target;
use smc_softroce::icrc::{self, IpInfo};
use smc_softroce::wire::PacketRepr;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = PacketRepr::parse(data) {
        assert!(p.payload_off + p.payload_len + 4 <= data.len());
        let mut out = vec![0u8; p.repr.buffer_len(p.payload_len)];
        assert_eq!(out.len(), data.len(), "re-emitted length");
        let off = p.repr.emit(&mut out).expect("emit");
        assert_eq!(off, p.payload_off);
        assert_eq!(&out[..off], &data[..off]);
        out[off..off + p.payload_len].copy_from_slice(&data[off..off + p.payload_len]);
        let q = PacketRepr::parse(&out).expect("re-parse");
        assert_eq!(q, p);
    }
    // The ICRC paths accept any bytes.
    let ip = IpInfo::V4 {
        src: [10, 0, 0, 1].into(),
        dst: [10, 0, 0, 2].into(),
        id: 0,
        flags_frag: icrc::IPV4_DF,
    };
    let _ = icrc::verify(&ip, 4791, 4791, data);
    let _ = icrc::recover_ipv4_id(&ip, 4791, 4791, data);
});
