//! Work completions (ibverbs `ibv_wc`).

/// Outcome of a work request (ibverbs `ibv_wc_status`, the subset an RC
/// transport can produce).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum WcStatus {
    /// Completed successfully.
    #[default]
    Success,
    /// Local length error: a received message did not fit the posted scatter
    /// list, or a gather list exceeded a limit.
    LocLenErr,
    /// Local QP operation error (an internal consistency error).
    LocQpOpErr,
    /// Local protection error: an SGE referred to memory outside a region,
    /// with a wrong lkey, or without the needed local access.
    LocProtErr,
    /// The work request was flushed because the QP entered the error state.
    WrFlushErr,
    /// Remote invalid request: the responder did not support the operation or
    /// the message was too long for it (NAK invalid request).
    RemInvReqErr,
    /// Remote access error: rkey, bounds or permission check failed at the
    /// responder (NAK remote access error).
    RemAccessErr,
    /// Remote operation error (NAK remote operational error).
    RemOpErr,
    /// Transport retry counter exceeded (no ACK within local ACK timeout
    /// retry_cnt + 1 times).
    RetryExcErr,
    /// RNR retry counter exceeded.
    RnrRetryExcErr,
    /// Unexpected response from the responder.
    BadRespErr,
    /// Fatal, unclassified error.
    GeneralErr,
}

impl WcStatus {
    /// True for [`WcStatus::Success`].
    pub fn is_ok(self) -> bool {
        self == WcStatus::Success
    }
}

/// What a completion completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum WcOpcode {
    /// A SEND or SEND with immediate.
    #[default]
    Send,
    /// An RDMA WRITE or RDMA WRITE with immediate (requester side).
    RdmaWrite,
    /// An RDMA READ.
    RdmaRead,
    /// An atomic compare-and-swap.
    CompSwap,
    /// An atomic fetch-and-add.
    FetchAdd,
    /// A receive consumed by a SEND.
    Recv,
    /// A receive consumed by an RDMA WRITE with immediate.
    RecvRdmaWithImm,
}

/// One completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct WorkCompletion {
    /// The `wr_id` of the work request.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Operation (valid only for `Success`; flushed completions report the
    /// opcode of the work queue they come from where known).
    pub opcode: WcOpcode,
    /// Bytes transferred (receives, RDMA READ, atomics).
    pub byte_len: u32,
    /// Immediate data, if the message carried one.
    pub imm_data: Option<u32>,
    /// Local QP number the work request was posted on.
    pub qp_num: u32,
    /// Remote QP number (receive completions).
    pub src_qp: u32,
    /// The solicited-event bit of the message (receive completions).
    pub solicited: bool,
}
