// Shared by the LLC targets (included with `include!`).
fn llc_round_trip(data: &[u8], fmt: smc_wire::llc::LlcFormat) {
    use smc_wire::llc::LlcMessage;
    if let Ok(m) = LlcMessage::parse(data, fmt) {
        let mut out = vec![0u8; m.buffer_len()];
        let n = m.emit(&mut out, fmt).expect("a parsed message emits");
        assert_eq!(n, out.len());
        assert!(n <= data.len());
        assert_eq!(LlcMessage::parse(&out, fmt).expect("emitted message parses"), m);
    }
}
