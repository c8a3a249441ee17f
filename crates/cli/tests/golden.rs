//! Golden vectors from real Linux: every SMC message in the captures (Linux 6.12 kernels
//! running SMC-Rv2 over rxe, plus crafted RFC/Linux-layout captures) parses with zero errors
//! and re-emits byte for byte, and the message census matches what tshark counts
//! (tests/fixtures/pcaps/k612-pair.census.txt) so the test cannot pass vacuously.

use smc_cli::capture::Capture;
use smc_cli::extract::{Extractor, Found};
use smc_wire::clc::{ClcMessage, ClcType};
use smc_wire::llc::{LlcFormat, LlcMessage};
use smc_wire::ControlMessage;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/pcaps")
        .join(name)
}

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Parses and re-emits one CLC message; returns its census label.
fn clc_round_trip(bytes: &[u8], where_: &str) -> String {
    let m = ClcMessage::parse(bytes).unwrap_or_else(|e| panic!("{where_}: CLC parse: {e}"));
    let out = m
        .to_vec()
        .unwrap_or_else(|e| panic!("{where_}: CLC emit: {e}"));
    assert_eq!(out, bytes, "{where_}: CLC re-emit differs ({m:?})");
    let name = m.msg_type().name();
    match m {
        ClcMessage::OtherPath(_) => format!("CLC {name} SMC-D"),
        ClcMessage::Proposal(p) if p.version >= 2 => format!("CLC v2 {name}"),
        ClcMessage::Accept(ref a) | ClcMessage::Confirm(ref a) if a.version >= 2 => {
            format!("CLC v2 {name}")
        }
        ClcMessage::Decline(d) if d.version >= 2 => format!("CLC v2 {name}"),
        _ => format!("CLC {name}"),
    }
}

/// Parses and re-emits one SEND payload (LLC or CDC); returns its census label.
fn send_round_trip(payload: &[u8], fmt: LlcFormat, where_: &str) -> String {
    let m = ControlMessage::parse(payload, fmt)
        .unwrap_or_else(|e| panic!("{where_}: parse {:02x?}: {e}", &payload[..4]));
    assert_eq!(m.buffer_len(), payload.len(), "{where_}: SEND length");
    let mut out = vec![0u8; m.buffer_len()];
    m.emit(&mut out, fmt)
        .unwrap_or_else(|e| panic!("{where_}: emit: {e}"));
    assert_eq!(out, payload, "{where_}: re-emit differs ({m:?})");
    match m {
        ControlMessage::Cdc(_) => "CDC".into(),
        ControlMessage::Llc(l) => format!(
            "LLC {}{} {}",
            l.msg_type().name(),
            if l.is_v2() { " v2" } else { "" },
            if l.is_response() {
                "response"
            } else {
                "request"
            }
        ),
    }
}

/// Walks a capture; round-trips every message; returns the census.
fn census(name: &str, fmt: LlcFormat) -> BTreeMap<String, usize> {
    let mut cap = Capture::open(&fixture(name)).expect("open capture");
    let mut ex = Extractor::new();
    let mut counts = BTreeMap::new();
    while let Some(frame) = cap.next_frame() {
        let frame = frame.expect("capture readable");
        for found in ex.push(&frame) {
            let where_ = format!("{name} frame {}", found.origin().frame);
            let label = match &found {
                Found::TcpOption { syn_ack, .. } => {
                    if *syn_ack {
                        "TCP option SYN-ACK".to_string()
                    } else {
                        "TCP option SYN".to_string()
                    }
                }
                Found::Clc { bytes, .. } => clc_round_trip(bytes, &where_),
                Found::Send { payload, .. } => send_round_trip(payload, fmt, &where_),
                Found::Malformed { layer, why, .. } => panic!("{where_}: malformed {layer}: {why}"),
            };
            *counts.entry(label).or_insert(0) += 1;
        }
    }
    counts
}

fn expect(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[test]
fn k612_pair_linux_6_12_capture() {
    // The census tshark (+ the harness's v2 LLC dissector) reports for this capture.
    let want = expect(&[
        ("TCP option SYN", 3),
        ("TCP option SYN-ACK", 3),
        ("CLC v2 Proposal", 3),
        ("CLC v2 Accept", 3),
        ("CLC v2 Confirm", 3),
        ("CDC", 77),
        ("LLC CONFIRM LINK v2 request", 1),
        ("LLC CONFIRM LINK v2 response", 1),
        ("LLC ADD LINK v2 request", 1),
        ("LLC ADD LINK v2 response", 1),
        ("LLC CONFIRM RKEY v2 request", 4),
        ("LLC CONFIRM RKEY v2 response", 4),
        ("LLC DELETE RKEY v2 request", 6),
        ("LLC DELETE RKEY v2 response", 6),
        ("LLC TEST LINK v2 request", 3),
        ("LLC TEST LINK v2 response", 3),
        ("LLC DELETE LINK v2 request", 16),
    ]);
    assert_eq!(census("k612-pair.pcap", LlcFormat::LINUX_X86), want);
}

#[test]
fn k612_pair_v2_fields_are_little_endian_on_x86() {
    // Read as big-endian, x86 Linux's `2c 00` length is 11264: every v2 LLC message fails,
    // so the byte-order choice is real.
    let mut cap = Capture::open(&fixture("k612-pair.pcap")).unwrap();
    let mut ex = Extractor::new();
    let (mut v2, mut rejected) = (0, 0);
    while let Some(frame) = cap.next_frame() {
        for found in ex.push(&frame.unwrap()) {
            if let Found::Send { payload, .. } = found {
                if payload[0] & 0xF0 == 0x20 {
                    v2 += 1;
                    if LlcMessage::parse(&payload, LlcFormat::LINUX_BE).is_err() {
                        rejected += 1;
                    }
                }
            }
        }
    }
    assert_eq!((v2, rejected), (46, 46));
}

#[test]
fn crafted_clc_capture() {
    let want = expect(&[
        ("TCP option SYN", 2),
        ("TCP option SYN-ACK", 2),
        ("CLC Proposal", 2),
        ("CLC Accept", 1),
        ("CLC Confirm", 1),
        ("CLC Decline", 1),
    ]);
    assert_eq!(census("smc_clc.pcap", LlcFormat::LINUX_X86), want);
}

#[test]
fn rfc_offset0_proposal_capture() {
    let want = expect(&[
        ("TCP option SYN", 1),
        ("TCP option SYN-ACK", 1),
        ("CLC Proposal", 1),
    ]);
    assert_eq!(
        census("smc_clc_rfc_offset0.pcap", LlcFormat::LINUX_X86),
        want
    );
}

#[test]
fn crafted_rocev2_capture_both_dialects() {
    // The CONFIRM LINK there has flags 0 and byte 35 = 0, so it reads the same in both.
    for fmt in [LlcFormat::LINUX_X86, LlcFormat::RFC7609] {
        let want = expect(&[("LLC CONFIRM LINK request", 1), ("CDC", 1)]);
        assert_eq!(census("rocev2.pcap", fmt), want);
    }
}

#[test]
fn test_vectors_file() {
    let text = std::fs::read_to_string(fixture("test_vectors.txt")).unwrap();
    let mut lines = text.lines();
    let mut seen = BTreeMap::new();
    while let Some(title) = lines.next() {
        let title = title.trim_start_matches("# ");
        let bytes = hex(lines.next().expect("hex line after title").trim());
        let label = if title.starts_with("CLC") {
            clc_round_trip(&bytes, title)
        } else if title.starts_with("LLC") || title.starts_with("CDC") {
            send_round_trip(&bytes, LlcFormat::RFC7609, title)
        } else {
            // A full Ethernet frame: run it through the extractor.
            let frame = smc_cli::capture::Frame {
                number: 1,
                time: Default::default(),
                link: smc_cli::capture::LinkType::Ethernet,
                data: bytes,
            };
            let mut ex = Extractor::new();
            let found = ex.push(&frame);
            match found.as_slice() {
                [] => "no SMC".into(),
                [Found::Send { payload, .. }] => {
                    send_round_trip(payload, LlcFormat::LINUX_X86, title)
                }
                other => panic!("{title}: unexpected {other:?}"),
            }
        };
        *seen.entry(label).or_insert(0) += 1;
    }
    let want = expect(&[
        ("CLC Proposal", 2),
        ("LLC CONFIRM LINK request", 2),
        ("CDC", 2),
        ("no SMC", 5),
    ]);
    assert_eq!(seen, want);
}

#[test]
fn linux_v2_decline_vector() {
    // kernel-smc README §V4(f): the v2 Decline Linux 6.12 sends on a UEID mismatch.
    let b = hex(concat!(
        "e2d4c3d904002c20",
        "4be8525400990001",
        "0303000020000000",
        "00000000000000000000000000000000",
        "e2d4c3d9"
    ));
    assert_eq!(clc_round_trip(&b, "v2 decline"), "CLC v2 Decline");
    let ClcMessage::Decline(d) = ClcMessage::parse(&b).unwrap() else {
        unreachable!()
    };
    assert_eq!(d.diagnosis.name(), Some("NOSMCDEV"));
    assert_eq!(ClcType::Decline, ClcMessage::Decline(d).msg_type());
}
