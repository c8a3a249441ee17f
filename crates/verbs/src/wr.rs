//! Work requests (ibverbs `ibv_send_wr` / `ibv_recv_wr`).

/// A scatter/gather element: `length` bytes at I/O virtual address `addr`,
/// inside the memory region whose local key is `lkey` (as with regions
/// registered by `ibv_reg_mr_iova`, the address is in the region's I/O
/// virtual address space, [`crate::Mr::addr`], not a process address).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// I/O virtual address ([`crate::Mr::addr`] plus an offset; see
    /// [`crate::Mr::sge`]).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the memory region covering the range.
    pub lkey: u32,
}

/// What a send work request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// Two-sided SEND; consumes a receive work request at the responder.
    Send,
    /// SEND with 32 bits of immediate data delivered in the receive completion.
    SendWithImm {
        /// Immediate data.
        imm: u32,
    },
    /// One-sided RDMA WRITE of the gather list to `remote_addr` in the
    /// region named by `rkey`.
    RdmaWrite {
        /// Target virtual address at the responder.
        remote_addr: u64,
        /// Remote key of the target region.
        rkey: u32,
    },
    /// RDMA WRITE that also consumes a receive work request at the responder
    /// and delivers `imm` in its completion.
    RdmaWriteWithImm {
        /// Target virtual address at the responder.
        remote_addr: u64,
        /// Remote key of the target region.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ from `remote_addr` into the scatter list.
    RdmaRead {
        /// Source virtual address at the responder.
        remote_addr: u64,
        /// Remote key of the source region.
        rkey: u32,
    },
    /// 64-bit atomic compare-and-swap at `remote_addr` (8-byte aligned); the
    /// original value is written to the (8-byte) scatter list.
    AtomicCmpSwap {
        /// Target virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key of the target region.
        rkey: u32,
        /// Value to compare with.
        compare: u64,
        /// Value stored when equal.
        swap: u64,
    },
    /// 64-bit atomic fetch-and-add at `remote_addr`; the original value is
    /// written to the (8-byte) scatter list.
    AtomicFetchAdd {
        /// Target virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key of the target region.
        rkey: u32,
        /// Value to add.
        add: u64,
    },
}

bitflags::bitflags! {
    /// Send work request flags (ibverbs `IBV_SEND_*`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Generate a completion even when the QP does not signal all WRs.
        const SIGNALED = 1 << 0;
        /// Set the solicited-event bit on the last packet.
        const SOLICITED = 1 << 1;
        /// Copy the gather list at post time; lkeys are not checked and the
        /// memory may be reused as soon as `post_send` returns.
        const INLINE = 1 << 2;
        /// Wait for earlier RDMA READs and atomics to complete first.
        const FENCE = 1 << 3;
    }
}

/// A send work request.
#[derive(Clone, Copy, Debug)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// Gather list (scatter list for RDMA READ and atomics).
    pub sg_list: &'a [Sge],
    /// Flags.
    pub flags: SendFlags,
}

/// A receive work request.
#[derive(Clone, Copy, Debug)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Scatter list the incoming SEND is placed into.
    pub sg_list: &'a [Sge],
}
