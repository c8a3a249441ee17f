//! Property tests of the iWARP codecs: every value emits and parses back to itself, and no
//! input makes a parser panic.

use proptest::prelude::*;
use smc_iwarp::wire::ddp::{DdpRepr, Opcode, Placement, ReadRequest, TerminateRepr};
use smc_iwarp::wire::mpa::{emit_fpdu, EnhancedData, Fpdu, FrameKind, MpaFrame, MpaRepr, RtrSet};
use smc_iwarp::wire::sctp::{
    DdpSctpPayload, FunctionCode, SessionControl, SessionControlRepr,
    PPID_DDP_STREAM_SESSION_CONTROL,
};

fn rtr() -> impl Strategy<Value = RtrSet> {
    (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(send, write, read)| RtrSet {
        send,
        write,
        read,
    })
}

fn enhanced() -> impl Strategy<Value = EnhancedData> {
    (any::<bool>(), rtr(), 0u16..=0x3fff, 0u16..=0x3fff).prop_map(|(p2p, rtr, ird, ord)| {
        EnhancedData {
            p2p,
            // B/C/D only travel with A (RFC 6581 §9.2)
            rtr: if p2p { rtr } else { RtrSet::NONE },
            ird,
            ord,
        }
    })
}

proptest! {
    #[test]
    fn mpa_frame_round_trip(
        req in any::<bool>(), m in any::<bool>(), c in any::<bool>(), r in any::<bool>(),
        enh in proptest::option::of(enhanced()), rev in 1u8..=2,
        pd in proptest::collection::vec(any::<u8>(), 0..508),
    ) {
        let rev = if enh.is_some() { 2 } else { rev };
        let repr = MpaRepr {
            kind: if req { FrameKind::Request } else { FrameKind::Reply },
            markers: m, crc: c, reject: r, rev, enhanced: enh, ulp_data: &pd,
        };
        let mut buf = vec![0u8; repr.buffer_len()];
        let n = repr.emit(&mut buf).unwrap();
        prop_assert_eq!(n, buf.len());
        prop_assert_eq!(MpaRepr::parse_bytes(&buf).unwrap(), repr);
    }

    #[test]
    fn mpa_parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..600)) {
        if let Ok(f) = MpaFrame::new_checked(&b[..]) {
            let _ = MpaRepr::parse(&f);
        }
        let _ = EnhancedData::parse(&b);
    }

    #[test]
    fn fpdu_round_trip(ulpdu in proptest::collection::vec(any::<u8>(), 0..3000), crc in any::<bool>()) {
        let mut out = vec![0u8; ulpdu.len() + 12];
        let n = emit_fpdu(&mut out, &ulpdu, crc).unwrap();
        let f = Fpdu::new_checked(&out[..n]).unwrap();
        prop_assert_eq!(f.ulpdu(), &ulpdu[..]);
        prop_assert_eq!(f.total_len() % 4, 0);
        if crc { prop_assert!(f.crc_ok()); } else { prop_assert_eq!(f.crc_field(), 0); }
    }

    #[test]
    fn ddp_round_trip(
        last in any::<bool>(), op in 0u8..8, stag in any::<u32>(), to in any::<u64>(),
        qn in any::<u32>(), msn in any::<u32>(), mo in any::<u32>(),
    ) {
        let opcode = Opcode::from_u8(op).unwrap();
        let placement = if opcode.is_tagged() {
            Placement::Tagged { stag, to }
        } else {
            Placement::Untagged { inv_stag: stag, qn, msn, mo }
        };
        let d = DdpRepr { last, opcode, placement };
        let mut b = [0u8; 18];
        let n = d.emit(&mut b).unwrap();
        let (p, rest) = DdpRepr::parse(&b[..n]).unwrap();
        prop_assert_eq!(p, d);
        prop_assert!(rest.is_empty());
    }

    #[test]
    fn read_request_round_trip(a in any::<u32>(), b in any::<u64>(), c in any::<u32>(), d in any::<u32>(), e in any::<u64>()) {
        let r = ReadRequest { sink_stag: a, sink_to: b, size: c, src_stag: d, src_to: e };
        let mut buf = [0u8; 28];
        r.emit(&mut buf).unwrap();
        prop_assert_eq!(ReadRequest::parse(&buf).unwrap(), r);
    }

    #[test]
    fn ddp_and_terminate_parse_never_panic(b in proptest::collection::vec(any::<u8>(), 0..80)) {
        let _ = DdpRepr::parse(&b);
        let _ = ReadRequest::parse(&b);
        if let Ok(t) = TerminateRepr::parse(&b) {
            let mut out = vec![0u8; t.buffer_len()];
            let n = t.emit(&mut out).unwrap();
            prop_assert_eq!(TerminateRepr::parse(&out[..n]).unwrap(), t);
        }
    }

    #[test]
    fn sctp_session_control_round_trip(
        code in 1u16..=7, enh in enhanced(),
        pd in proptest::collection::vec(any::<u8>(), 0..520),
    ) {
        let function = FunctionCode::from_u16(code).unwrap();
        let enhanced = function.carries_enhanced_data().then_some(enh);
        let ulp_data: &[u8] = if function == FunctionCode::Terminate { &[] } else { &pd };
        let r = SessionControlRepr { function, enhanced, ulp_data };
        let mut buf = vec![0u8; r.buffer_len()];
        match r.emit(&mut buf) {
            Ok(n) => {
                // RFC 6581 §7: at most 512 bytes of private data, enhanced data included
                prop_assert!(n - 4 <= 512);
                prop_assert_eq!(SessionControlRepr::parse_bytes(&buf).unwrap(), r);
                prop_assert_eq!(
                    DdpSctpPayload::parse(PPID_DDP_STREAM_SESSION_CONTROL, &buf).unwrap(),
                    DdpSctpPayload::Control(r)
                );
            }
            Err(_) => prop_assert!(r.buffer_len() - 4 > 512),
        }
    }

    #[test]
    fn sctp_session_control_parse_never_panics(
        code in 0u16..10, pdl in 0u16..530, rest in proptest::collection::vec(any::<u8>(), 0..600),
        raw in any::<bool>(),
    ) {
        // Mostly plausible headers (a code near the defined ones, a PD_Length near 512),
        // sometimes raw bytes.
        let mut b = Vec::new();
        if !raw {
            b.extend_from_slice(&code.to_be_bytes());
            b.extend_from_slice(&pdl.to_be_bytes());
        }
        b.extend_from_slice(&rest);
        if let Ok(m) = SessionControl::new_checked(&b[..]) {
            if let Ok(r) = SessionControlRepr::parse(&m) {
                // what parses re-emits the same bytes (the enhanced word's B/C/D aside when A = 0)
                let mut out = vec![0u8; r.buffer_len()];
                let n = r.emit(&mut out).unwrap();
                prop_assert_eq!(n, m.total_len());
                prop_assert_eq!(SessionControlRepr::parse_bytes(&out).unwrap(), r);
            }
        }
        let _ = DdpSctpPayload::parse(PPID_DDP_STREAM_SESSION_CONTROL, &b);
    }
}
