//! The one error type of the crate, and what a receiver should do about each error.
//!
//! Every variant names the field (or message) and the rule that was broken, so that a log line
//! or a `smc decode` report says exactly what was wrong with the bytes. [`Error::action`] maps an
//! error to the receiver action of RFC 7609 Appendix C (CHECKLIST §0.4), given the layer the
//! bytes arrived on, so the SMC-R core can act on it without string matching.

/// Result alias used throughout the crate.
pub type Result<T> = core::result::Result<T, Error>;

/// A malformed, unsupported or out-of-range message, or an output buffer that is too small.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Fewer bytes than the layout needs.
    #[error("{what}: truncated, need {need} bytes, have {have}")]
    Truncated {
        /// Message or field that did not fit.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// An eye catcher is neither "SMCR" nor "SMCD" in EBCDIC (RFC 7609 A.2).
    #[error("bad {which} eye catcher")]
    BadEyecatcher {
        /// "header" or "trailer".
        which: &'static str,
    },
    /// The trailing eye catcher differs from the leading one.
    #[error("trailer eye catcher does not match the header eye catcher")]
    TrailerMismatch,
    /// A length field disagrees with the message type or the bytes framed.
    #[error("{msg}: length {got}, expected {expected}")]
    BadLength {
        /// Message whose length is wrong.
        msg: &'static str,
        /// Length the layout requires.
        expected: usize,
        /// Length found.
        got: usize,
    },
    /// A type/opcode byte that is not defined for this layer.
    #[error("unknown {layer} message type {value:#04x}")]
    UnknownType {
        /// "CLC", "LLC", ...
        layer: &'static str,
        /// The type byte.
        value: u8,
    },
    /// An LLC opcode in the optional class 0x80..0xBF that this implementation does not
    /// support: RFC 7609 A.3 says it must be silently discarded.
    #[error("unsupported optional LLC message type {0:#04x} (discard)")]
    OptionalLlc(u8),
    /// A reserved (undefined) enumerated value, e.g. QP MTU 0 or 6..15.
    #[error("reserved value {value:#x} in {field}")]
    ReservedValue {
        /// Field name.
        field: &'static str,
        /// Value found.
        value: u32,
    },
    /// A count or length-like field larger than the layout allows.
    #[error("{field} = {value} out of range (allowed {min}..={max})")]
    CountOutOfRange {
        /// Field name.
        field: &'static str,
        /// Value found.
        value: usize,
        /// Smallest allowed value.
        min: usize,
        /// Largest allowed value.
        max: usize,
    },
    /// An offset field that does not point where the layout says it must.
    #[error("{field} = {got}, expected {expected}")]
    BadOffset {
        /// Field name.
        field: &'static str,
        /// Offset the layout requires.
        expected: usize,
        /// Offset found.
        got: usize,
    },
    /// Fields that contradict each other (e.g. a v2 extension offset without a v2 path type).
    #[error("inconsistent {field}: {why}")]
    Inconsistent {
        /// Field name.
        field: &'static str,
        /// What contradicts it.
        why: &'static str,
    },
    /// The output buffer given to an `emit` is shorter than `buffer_len()`.
    #[error("output buffer too small: need {need} bytes, have {have}")]
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes given.
        have: usize,
    },
}

/// The layer a message arrived on; the same defect calls for different actions per layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    /// The SMC-R TCP option in a SYN or SYN-ACK.
    TcpOption,
    /// A CLC message on the TCP connection during the handshake.
    Clc,
    /// An LLC message in a SEND on an SMC-R link.
    Llc,
    /// A CDC message in a SEND on an SMC-R link.
    Cdc,
}

/// Receiver action codes of CHECKLIST §0.4 (RFC 7609 Appendix C).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `PE-RST`: CLC protocol error; reset the TCP connection, no fallback (RFC 7609 C.6).
    ProtocolErrorReset,
    /// `ENUM-DECL`: reserved enumerated value; send a Decline and fall back to TCP (C.6).
    DeclineAndFallback,
    /// `DISCARD`: drop silently (optional LLC opcodes, RFC 7609 A.3; bad CDC, AMB-39).
    Discard,
    /// `LINK-DOWN`: LLC protocol error; treat the link as failed (C.7.1).
    LinkDown,
    /// The SMC-R option is treated as absent (CHECKLIST A.1, AMB-04).
    OptionAbsent,
    /// Not a peer's fault: a local programming error (e.g. a too-small emit buffer).
    LocalError,
}

impl Error {
    /// What a receiver should do with a message that failed to parse with this error.
    ///
    /// CLC: reserved enumerated values → Decline and fall back (RFC 7609 C.6 "ENUM-DECL");
    /// every framing defect → protocol error and RST (C.6 "PE-RST"). LLC: optional opcodes are
    /// discarded (A.3), everything else is a protocol error that takes the link down (C.7.1).
    /// CDC: dropped (CHECKLIST A.4, AMB-39). TCP option: treated as absent (AMB-04).
    pub fn action(&self, layer: Layer) -> Action {
        if let Error::BufferTooSmall { .. } = self {
            return Action::LocalError;
        }
        match layer {
            Layer::TcpOption => Action::OptionAbsent,
            Layer::Clc => match self {
                Error::ReservedValue { .. } => Action::DeclineAndFallback,
                _ => Action::ProtocolErrorReset,
            },
            Layer::Llc => match self {
                Error::OptionalLlc(_) => Action::Discard,
                _ => Action::LinkDown,
            },
            Layer::Cdc => Action::Discard,
        }
    }
}

/// Fails with [`Error::Truncated`] unless `buf` has at least `need` bytes.
#[inline]
pub(crate) fn check_len(what: &'static str, buf: &[u8], need: usize) -> Result<()> {
    if buf.len() < need {
        Err(Error::Truncated {
            what,
            need,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}

/// Fails with [`Error::BufferTooSmall`] unless `buf` has at least `need` bytes.
#[inline]
pub(crate) fn check_out(buf: &[u8], need: usize) -> Result<()> {
    if buf.len() < need {
        Err(Error::BufferTooSmall {
            need,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_follow_appendix_c() {
        let mtu = Error::ReservedValue {
            field: "qp_mtu",
            value: 0,
        };
        assert_eq!(mtu.action(Layer::Clc), Action::DeclineAndFallback);
        assert_eq!(mtu.action(Layer::Llc), Action::LinkDown);
        let ec = Error::BadEyecatcher { which: "header" };
        assert_eq!(ec.action(Layer::Clc), Action::ProtocolErrorReset);
        assert_eq!(Error::OptionalLlc(0x80).action(Layer::Llc), Action::Discard);
        assert_eq!(ec.action(Layer::Cdc), Action::Discard);
        assert_eq!(ec.action(Layer::TcpOption), Action::OptionAbsent);
        let small = Error::BufferTooSmall { need: 44, have: 0 };
        assert_eq!(small.action(Layer::Llc), Action::LocalError);
        assert_eq!(
            ec.to_string(),
            "bad header eye catcher",
            "messages name the field"
        );
    }
}
