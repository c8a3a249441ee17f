//! DDP/RDMAP headers, RDMA Read Request and Terminate (smc-iwarp): parsing never panics;
//! what parses re-emits byte-identically (reserved bits aside) and re-parses equal.
#![no_main]
use libfuzzer_sys::fuzz_target;
use smc_iwarp::wire::ddp::{DdpRepr, ReadRequest, TerminateRepr};

fuzz_target!(|data: &[u8]| {
    if let Ok((d, rest)) = DdpRepr::parse(data) {
        let n = d.header_len();
        assert_eq!(rest.len(), data.len() - n);
        let mut out = vec![0u8; n];
        d.emit(&mut out).expect("emit");
        assert_eq!(out[0], data[0] & 0xc3, "DDP control without Rsvd");
        assert_eq!(out[1], data[1] & 0xcf, "RDMAP control without Rsv");
        assert_eq!(&out[2..], &data[2..n]);
        assert_eq!(DdpRepr::parse(&out).expect("re-parse").0, d);
        if let Ok(rr) = ReadRequest::parse(rest) {
            let mut b = [0u8; 28];
            rr.emit(&mut b).expect("emit");
            assert_eq!(&b[..], &rest[..28]);
        }
        if let Ok(t) = TerminateRepr::parse(rest) {
            let mut b = vec![0u8; t.buffer_len()];
            t.emit(&mut b).expect("emit");
            assert_eq!(TerminateRepr::parse(&b).expect("re-parse"), t);
        }
    }
});
