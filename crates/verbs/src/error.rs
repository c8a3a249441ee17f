//! Errors returned synchronously by verbs calls. Errors that happen while a
//! work request is processed are reported as a [`crate::WcStatus`] in its
//! completion instead, as in ibverbs.

use crate::qp::QpState;

/// Result alias for verbs calls.
pub type Result<T> = std::result::Result<T, VerbsError>;

/// A verbs call that could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    /// An attribute or argument is out of range (e.g. PSN ≥ 2^24, MTU not an
    /// IBA value, more SGEs than the QP was created with).
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// The requested QP state transition is not allowed from the current state
    /// (IBA QP state machine).
    #[error("invalid QP state transition {from:?} -> {to:?}")]
    InvalidTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// Posting is not allowed in the QP's current state (e.g. post_send
    /// before RTS, or post_recv in RESET).
    #[error("operation not allowed in QP state {0:?}")]
    InvalidState(QpState),
    /// The send or receive queue is full.
    #[error("work queue full")]
    QueueFull,
    /// Inline data larger than the QP's max_inline_data.
    #[error("inline data of {len} bytes exceeds the limit of {max}")]
    InlineTooLarge {
        /// Requested inline length.
        len: usize,
        /// Limit the QP was created with.
        max: usize,
    },
    /// A device, QP or MR resource limit was reached.
    #[error("resource exhausted: {0}")]
    ResourceExhausted(&'static str),
    /// The handle was created by a different device or provider.
    #[error("object belongs to another device or protection domain")]
    WrongDevice,
    /// The device is closed or its progress engine stopped.
    #[error("device is not available: {0}")]
    DeviceGone(String),
    /// An operating-system call failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}
