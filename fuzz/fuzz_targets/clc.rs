//! CLC: arbitrary bytes never panic; whatever parses re-emits to the same length and
//! re-parses to the same value. Covers smc-rs's same-host Accept (type 0x81, through
//! `ClcMessage`), the same-host offer inside a Proposal and the Unix-socket hello.
#![no_main]
use libfuzzer_sys::fuzz_target;
use smc_wire::clc::{self, ClcMessage, ProposalBody, SameHostHello, SameHostOffer, V1Area};

fuzz_target!(|data: &[u8]| {
    if let Ok(n) = clc::message_len(data) {
        assert!(n >= 12);
    }
    if let Ok(m) = ClcMessage::parse(data) {
        let out = m.to_vec().expect("a parsed message emits");
        assert_eq!(out.len(), data.len());
        assert_eq!(ClcMessage::parse(&out).expect("emitted message parses"), m);
        if let ClcMessage::Proposal(p) = &m {
            let area = match &p.body {
                ProposalBody::V2 { smcd, .. }
                | ProposalBody::V1 {
                    area: V1Area::Smcd(smcd),
                    ..
                } => Some(smcd),
                _ => None,
            };
            if let Some(o) = area.and_then(SameHostOffer::from_smcd_area) {
                let mut a = *area.unwrap();
                o.emit_into(&mut a);
                assert_eq!(SameHostOffer::from_smcd_area(&a), Some(o));
            }
        }
    }
    if let Ok(h) = SameHostHello::parse(data) {
        assert_eq!(
            SameHostHello::parse(&h.to_bytes()).expect("hello re-parses"),
            h
        );
    }
});
