//! Byte-exact, zero-copy SMC-R wire formats: RFC 7609 plus the Linux SMC-Rv2 dialect.
//!
//! Every message SMC-R puts on the wire, in both directions (parse to typed values, emit to
//! bytes), modelled on smoltcp's `wire` module:
//!
//! | module | what | RFC 7609 |
//! |---|---|---|
//! | [`tcp_option`] | the SMC-R TCP option (kind 254, ExID `E2D4C3D9`) in SYN/SYN-ACK | §3.1, A.1 |
//! | [`clc`] | CLC Proposal, Accept, Confirm, Decline: v1 and Linux v2 layouts | §3.2, A.2 |
//! | [`decline`] | every Linux Decline diagnosis code with a one-line explanation | A.2.5 |
//! | [`llc`] | the eight RFC LLC messages and the Linux SMC-Rv2 ones (0x21..0x29) | §3.3, A.3 |
//! | [`cdc`] | the 44-byte CDC message (cursors, producer and connection-state flags) | §4.3, A.4 |
//! | [`common`] | U24, MAC, GID, Peer ID, QP MTU, compressed buffer size, EIDs | A.2.1, A.2.3 |
//!
//! Rules the crate keeps:
//! - Parsing never panics and never reads out of bounds, whatever the bytes; every receiver
//!   check of the layouts returns an [`Error`] naming the field, and [`Error::action`] says
//!   what RFC 7609 Appendix C wants the receiver to do about it.
//! - `emit(parse(x)) == x` for every valid message and `parse(emit(m)) == m` for every
//!   message value (property-tested and fuzzed).
//! - No heap allocation to parse: LLC/CDC messages are `Copy`; CLC lists use fixed-capacity
//!   `ArrayVec`s; the long lists of SMC-Rv2 LLC messages are borrowed views of the input.
//! - Where Linux differs from the RFC figures, the choice is explicit: [`llc::Dialect`] for
//!   the ADD LINK GID offset and CONFIRM LINK flags, [`common::ByteOrder`] for the v2 fields
//!   Linux writes in host byte order, [`common::BufSize`] codes up to 15.
//! - No I/O.
//!
//! SMC-R control messages on a link are demultiplexed by their first byte (0xFE = CDC), see
//! [`ControlMessage`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cdc;
pub mod clc;
pub mod common;
pub mod decline;
pub mod error;
pub mod llc;
pub mod tcp_option;

pub use error::{Action, Error, Layer, Result};

/// A message received in a SEND on an SMC-R link: LLC or CDC, told apart by the first byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlMessage<'a> {
    /// An LLC message.
    Llc(llc::LlcMessage<'a>),
    /// A CDC message.
    Cdc(cdc::CdcRepr),
}

impl<'a> ControlMessage<'a> {
    /// Parses a SEND payload (Linux `smc_wr_rx_demultiplex`: 0xFE is CDC, anything else LLC).
    pub fn parse(payload: &'a [u8], fmt: llc::LlcFormat) -> Result<ControlMessage<'a>> {
        match payload.first() {
            Some(&cdc::CDC_TYPE) => Ok(ControlMessage::Cdc(cdc::CdcRepr::parse_bytes(payload)?)),
            _ => Ok(ControlMessage::Llc(llc::LlcMessage::parse(payload, fmt)?)),
        }
    }
    /// The layer, for [`Error::action`].
    pub fn layer_of(payload: &[u8]) -> Layer {
        if payload.first() == Some(&cdc::CDC_TYPE) {
            Layer::Cdc
        } else {
            Layer::Llc
        }
    }
    /// Bytes [`Self::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        match self {
            ControlMessage::Llc(m) => m.buffer_len(),
            ControlMessage::Cdc(c) => c.buffer_len(),
        }
    }
    /// Writes the message; returns its length.
    pub fn emit(&self, buf: &mut [u8], fmt: llc::LlcFormat) -> Result<usize> {
        match self {
            ControlMessage::Llc(m) => m.emit(buf, fmt),
            ControlMessage::Cdc(c) => c.emit(buf),
        }
    }
}
