//! RC queue pairs: state transitions and posting work requests.

use std::any::Any;
use std::ffi::c_int;
use std::sync::{Arc, Mutex};

use smc_verbs::{
    InitAttr, QpCap, QpOps, QpState, RecvWr, Result, RtrAttr, RtsAttr, SendFlags, SendOp, SendWr,
    VerbsError,
};
use tracing::warn;

use super::pd::access_bits;
use super::pd::PdRaw;
use super::{errno_error, lock, Ctx};
use crate::ffi;

pub(super) struct QpInner {
    /// Dropped after the QP is destroyed.
    pub(super) _pd: Arc<PdRaw>,
    pub(super) ctx: Arc<Ctx>,
    pub(super) qp: *mut ffi::ibv_qp,
    pub(super) qpn: u32,
    pub(super) cap: QpCap,
    pub(super) state: Mutex<QpState>,
    pub(super) post_send: ffi::PostSendFn,
    pub(super) post_recv: ffi::PostRecvFn,
    pub(super) port: u8,
    pub(super) gid_index: u8,
    /// The CQs must outlive the QP.
    pub(super) _cqs: (smc_verbs::Cq, smc_verbs::Cq),
}

// SAFETY: ibv_qp may be used from any thread (providers lock their queues); the pointer
// is valid until Drop.
unsafe impl Send for QpInner {}
// SAFETY: as above.
unsafe impl Sync for QpInner {}

impl Drop for QpInner {
    fn drop(&mut self) {
        {
            let mut m = lock(&self.ctx.shared.qps);
            // Only our own entry (a new QP may already reuse the number).
            if m.get(&self.qpn).is_some_and(|w| w.strong_count() == 0) {
                m.remove(&self.qpn);
            }
        }
        // SAFETY: destroying the QP created in `create_qp`, once.
        let rc = unsafe { (self.ctx.api.destroy_qp)(self.qp) };
        if rc != 0 {
            warn!(rc, qpn = self.qpn, "ibv_destroy_qp failed");
        }
    }
}

fn to_ibv_state(s: QpState) -> u32 {
    match s {
        QpState::Reset => ffi::IBV_QPS_RESET,
        QpState::Init => ffi::IBV_QPS_INIT,
        QpState::Rtr => ffi::IBV_QPS_RTR,
        QpState::Rts => ffi::IBV_QPS_RTS,
        QpState::Sqd => ffi::IBV_QPS_SQD,
        QpState::Sqe => ffi::IBV_QPS_SQE,
        QpState::Err => ffi::IBV_QPS_ERR,
    }
}

fn from_ibv_state(s: u32) -> Option<QpState> {
    Some(match s {
        ffi::IBV_QPS_RESET => QpState::Reset,
        ffi::IBV_QPS_INIT => QpState::Init,
        ffi::IBV_QPS_RTR => QpState::Rtr,
        ffi::IBV_QPS_RTS => QpState::Rts,
        ffi::IBV_QPS_SQD => QpState::Sqd,
        ffi::IBV_QPS_SQE => QpState::Sqe,
        ffi::IBV_QPS_ERR => QpState::Err,
        _ => return None,
    })
}

/// Work requests converted per post on the stack; longer lists are posted from the heap.
const STACK_WRS: usize = 8;
const STACK_SGES: usize = 32;

impl QpInner {
    fn modify(&self, to: QpState, attr: &mut ffi::ibv_qp_attr, mask: c_int) -> Result<()> {
        let mut st = lock(&self.state);
        if !st.can_transition(to) {
            return Err(VerbsError::InvalidTransition { from: *st, to });
        }
        attr.qp_state = to_ibv_state(to);
        // SAFETY: valid QP, fully initialised attributes.
        let rc = unsafe { (self.ctx.api.modify_qp)(self.qp, attr, mask | ffi::IBV_QP_STATE) };
        if rc != 0 {
            return Err(errno_error("ibv_modify_qp", rc));
        }
        *st = to;
        Ok(())
    }

    fn check_psn(psn: u32) -> Result<()> {
        if psn > smc_verbs::PSN_MASK {
            return Err(VerbsError::InvalidArgument("PSN above 2^24"));
        }
        Ok(())
    }
}

impl QpOps for QpInner {
    fn qpn(&self) -> u32 {
        self.qpn
    }

    fn state(&self) -> QpState {
        // The hardware moves a QP to ERR by itself (failed work requests): ask it.
        let mut a = ffi::ibv_qp_attr::default();
        // SAFETY: `ibv_qp_init_attr` is plain data; zero is a valid value.
        let mut ia: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid QP and out-pointers.
        let rc = unsafe { (self.ctx.api.query_qp)(self.qp, &mut a, ffi::IBV_QP_STATE, &mut ia) };
        let mut st = lock(&self.state);
        if rc == 0 {
            if let Some(s) = from_ibv_state(a.qp_state) {
                *st = s;
            }
        }
        *st
    }

    fn cap(&self) -> QpCap {
        self.cap
    }

    fn modify_to_init(&self, attr: &InitAttr) -> Result<()> {
        let mut a = ffi::ibv_qp_attr {
            pkey_index: attr.pkey_index,
            // The port serving this address, whatever the caller's default says.
            port_num: self.port,
            qp_access_flags: access_bits(attr.access) as u32,
            ..Default::default()
        };
        self.modify(
            QpState::Init,
            &mut a,
            ffi::IBV_QP_PKEY_INDEX | ffi::IBV_QP_PORT | ffi::IBV_QP_ACCESS_FLAGS,
        )
    }

    fn modify_to_rtr(&self, attr: &RtrAttr) -> Result<()> {
        Self::check_psn(attr.rq_psn)?;
        if attr.dest_qpn > smc_verbs::QPN_MASK {
            return Err(VerbsError::InvalidArgument("QPN above 2^24"));
        }
        let mut a = ffi::ibv_qp_attr {
            path_mtu: attr.path_mtu as u32,
            dest_qp_num: attr.dest_qpn,
            rq_psn: attr.rq_psn,
            max_dest_rd_atomic: attr.max_dest_rd_atomic,
            min_rnr_timer: attr.min_rnr_timer,
            ah_attr: ffi::ibv_ah_attr {
                grh: ffi::ibv_global_route {
                    dgid: ffi::ibv_gid(attr.ah.dgid.0),
                    flow_label: attr.ah.flow_label,
                    // The RoCEv2 GID of this device's address (smc-verbs' "GID 0" is the
                    // address the device was opened for).
                    sgid_index: self.gid_index,
                    hop_limit: attr.ah.hop_limit,
                    traffic_class: attr.ah.traffic_class,
                },
                is_global: 1,
                port_num: self.port,
                ..Default::default()
            },
            ..Default::default()
        };
        self.modify(
            QpState::Rtr,
            &mut a,
            ffi::IBV_QP_AV
                | ffi::IBV_QP_PATH_MTU
                | ffi::IBV_QP_DEST_QPN
                | ffi::IBV_QP_RQ_PSN
                | ffi::IBV_QP_MAX_DEST_RD_ATOMIC
                | ffi::IBV_QP_MIN_RNR_TIMER,
        )
    }

    fn modify_to_rts(&self, attr: &RtsAttr) -> Result<()> {
        Self::check_psn(attr.sq_psn)?;
        if attr.retry_cnt > 7 || attr.rnr_retry > 7 || attr.timeout > 31 {
            return Err(VerbsError::InvalidArgument(
                "retry count or timeout out of range",
            ));
        }
        let mut a = ffi::ibv_qp_attr {
            sq_psn: attr.sq_psn,
            timeout: attr.timeout,
            retry_cnt: attr.retry_cnt,
            rnr_retry: attr.rnr_retry,
            max_rd_atomic: attr.max_rd_atomic,
            ..Default::default()
        };
        self.modify(
            QpState::Rts,
            &mut a,
            ffi::IBV_QP_SQ_PSN
                | ffi::IBV_QP_TIMEOUT
                | ffi::IBV_QP_RETRY_CNT
                | ffi::IBV_QP_RNR_RETRY
                | ffi::IBV_QP_MAX_QP_RD_ATOMIC,
        )
    }

    fn modify_to_err(&self) -> Result<()> {
        self.modify(QpState::Err, &mut ffi::ibv_qp_attr::default(), 0)
    }

    fn modify_to_reset(&self) -> Result<()> {
        self.modify(QpState::Reset, &mut ffi::ibv_qp_attr::default(), 0)
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        if wrs.is_empty() {
            return Ok(());
        }
        let st = *lock(&self.state);
        // IBA §10.8.3: sends may be posted in RTS (and SQD/SQE/ERR, where they flush).
        if matches!(st, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(VerbsError::InvalidState(st));
        }
        let nsge: usize = wrs.iter().map(|w| w.sg_list.len()).sum();
        for w in wrs {
            if w.sg_list.len() > self.cap.max_send_sge as usize {
                return Err(VerbsError::InvalidArgument("more SGEs than max_send_sge"));
            }
            if w.flags.contains(SendFlags::INLINE) {
                let len: usize = w.sg_list.iter().map(|s| s.length as usize).sum();
                if len > self.cap.max_inline_data as usize {
                    return Err(VerbsError::InlineTooLarge {
                        len,
                        max: self.cap.max_inline_data as usize,
                    });
                }
            }
            if matches!(
                w.op,
                SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. }
            ) && (w.sg_list.len() != 1 || w.sg_list[0].length != 8)
            {
                return Err(VerbsError::InvalidArgument("atomics need one 8-byte SGE"));
            }
        }
        if wrs.len() <= STACK_WRS && nsge <= STACK_SGES {
            let mut iw = [ffi::ibv_send_wr::default(); STACK_WRS];
            let mut is = [ffi::ibv_sge::default(); STACK_SGES];
            self.post_send_in(wrs, &mut iw[..wrs.len()], &mut is[..nsge])
        } else {
            let mut iw = vec![ffi::ibv_send_wr::default(); wrs.len()];
            let mut is = vec![ffi::ibv_sge::default(); nsge];
            self.post_send_in(wrs, &mut iw, &mut is)
        }
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        if wrs.is_empty() {
            return Ok(());
        }
        let st = *lock(&self.state);
        if st == QpState::Reset {
            return Err(VerbsError::InvalidState(st));
        }
        let nsge: usize = wrs.iter().map(|w| w.sg_list.len()).sum();
        if wrs
            .iter()
            .any(|w| w.sg_list.len() > self.cap.max_recv_sge as usize)
        {
            return Err(VerbsError::InvalidArgument("more SGEs than max_recv_sge"));
        }
        if wrs.len() <= STACK_WRS && nsge <= STACK_SGES {
            let mut iw = [ffi::ibv_recv_wr::default(); STACK_WRS];
            let mut is = [ffi::ibv_sge::default(); STACK_SGES];
            self.post_recv_in(wrs, &mut iw[..wrs.len()], &mut is[..nsge])
        } else {
            let mut iw = vec![ffi::ibv_recv_wr::default(); wrs.len()];
            let mut is = vec![ffi::ibv_sge::default(); nsge];
            self.post_recv_in(wrs, &mut iw, &mut is)
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl QpInner {
    fn post_send_in(
        &self,
        wrs: &[SendWr<'_>],
        iw: &mut [ffi::ibv_send_wr],
        is: &mut [ffi::ibv_sge],
    ) -> Result<()> {
        let mut k = 0;
        let n = wrs.len();
        let base = iw.as_mut_ptr();
        for (i, w) in wrs.iter().enumerate() {
            let first = k;
            let inline = w.flags.contains(SendFlags::INLINE);
            for s in w.sg_list {
                // INLINE data is read by the CPU at its process address, not through
                // the region's I/O virtual address (see `pd::inline_addr`).
                let addr = if inline && s.length > 0 {
                    self._pd
                        .inline_addr(s.lkey, s.addr, u64::from(s.length))
                        .ok_or(VerbsError::InvalidArgument(
                            "INLINE SGE outside the memory regions of the QP's PD",
                        ))?
                } else {
                    s.addr
                };
                is[k] = ffi::ibv_sge {
                    addr,
                    length: s.length,
                    lkey: s.lkey,
                };
                k += 1;
            }
            let mut x = ffi::ibv_send_wr {
                wr_id: w.wr_id,
                num_sge: w.sg_list.len() as c_int,
                sg_list: if w.sg_list.is_empty() {
                    std::ptr::null_mut()
                } else {
                    // SAFETY: `first` < is.len(): this WR's SGEs were written there.
                    unsafe { is.as_mut_ptr().add(first) }
                },
                // SAFETY: i + 1 <= n = iw.len(): a pointer to the next element (unused
                // for the last one, which gets null).
                next: if i + 1 < n {
                    unsafe { base.add(i + 1) }
                } else {
                    std::ptr::null_mut()
                },
                ..Default::default()
            };
            let mut flags = 0;
            if w.flags.contains(SendFlags::SIGNALED) {
                flags |= ffi::IBV_SEND_SIGNALED;
            }
            if w.flags.contains(SendFlags::SOLICITED) {
                flags |= ffi::IBV_SEND_SOLICITED;
            }
            if w.flags.contains(SendFlags::INLINE) {
                flags |= ffi::IBV_SEND_INLINE;
            }
            if w.flags.contains(SendFlags::FENCE) {
                flags |= ffi::IBV_SEND_FENCE;
            }
            x.send_flags = flags;
            match w.op {
                SendOp::Send => x.opcode = ffi::IBV_WR_SEND,
                SendOp::SendWithImm { imm } => {
                    x.opcode = ffi::IBV_WR_SEND_WITH_IMM;
                    x.imm_data = imm.to_be();
                }
                SendOp::RdmaWrite { remote_addr, rkey } => {
                    x.opcode = ffi::IBV_WR_RDMA_WRITE;
                    x.wr.remote_addr = remote_addr;
                    x.wr.word1 = rkey as u64;
                }
                SendOp::RdmaWriteWithImm {
                    remote_addr,
                    rkey,
                    imm,
                } => {
                    x.opcode = ffi::IBV_WR_RDMA_WRITE_WITH_IMM;
                    x.wr.remote_addr = remote_addr;
                    x.wr.word1 = rkey as u64;
                    x.imm_data = imm.to_be();
                }
                SendOp::RdmaRead { remote_addr, rkey } => {
                    x.opcode = ffi::IBV_WR_RDMA_READ;
                    x.wr.remote_addr = remote_addr;
                    x.wr.word1 = rkey as u64;
                }
                SendOp::AtomicCmpSwap {
                    remote_addr,
                    rkey,
                    compare,
                    swap,
                } => {
                    x.opcode = ffi::IBV_WR_ATOMIC_CMP_AND_SWP;
                    x.wr.remote_addr = remote_addr;
                    x.wr.word1 = compare;
                    x.wr.swap = swap;
                    x.wr.atomic_rkey = rkey;
                }
                SendOp::AtomicFetchAdd {
                    remote_addr,
                    rkey,
                    add,
                } => {
                    x.opcode = ffi::IBV_WR_ATOMIC_FETCH_AND_ADD;
                    x.wr.remote_addr = remote_addr;
                    x.wr.word1 = add;
                    x.wr.atomic_rkey = rkey;
                }
            }
            iw[i] = x;
        }
        let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: valid QP; `iw` is a linked list of fully initialised WRs whose SGE
        // pointers point into `is`, both alive for the call; the provider copies them.
        let rc = unsafe { (self.post_send)(self.qp, base, &mut bad) };
        if rc != 0 {
            // The provider posts in order and stops at the first WR it cannot take;
            // every check that can fail for a valid WR list was done above, so this
            // is the hardware queue filling up (the caller posted beyond max_send_wr).
            // SAFETY: `bad` points into `iw` when set.
            let at = if bad.is_null() {
                0
            } else {
                unsafe { bad.offset_from(base) }
            };
            if at > 0 {
                warn!(qpn = self.qpn, at, "post_send stopped inside a batch");
            }
            return Err(errno_error("ibv_post_send", rc));
        }
        Ok(())
    }

    fn post_recv_in(
        &self,
        wrs: &[RecvWr<'_>],
        iw: &mut [ffi::ibv_recv_wr],
        is: &mut [ffi::ibv_sge],
    ) -> Result<()> {
        let mut k = 0;
        let n = wrs.len();
        let base = iw.as_mut_ptr();
        for (i, w) in wrs.iter().enumerate() {
            let first = k;
            for s in w.sg_list {
                is[k] = ffi::ibv_sge {
                    addr: s.addr,
                    length: s.length,
                    lkey: s.lkey,
                };
                k += 1;
            }
            iw[i] = ffi::ibv_recv_wr {
                wr_id: w.wr_id,
                num_sge: w.sg_list.len() as c_int,
                sg_list: if w.sg_list.is_empty() {
                    std::ptr::null_mut()
                } else {
                    // SAFETY: this WR's SGEs start at `first` < is.len().
                    unsafe { is.as_mut_ptr().add(first) }
                },
                next: if i + 1 < n {
                    // SAFETY: i + 1 < n = iw.len().
                    unsafe { base.add(i + 1) }
                } else {
                    std::ptr::null_mut()
                },
            };
        }
        let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: valid QP; a linked list of initialised WRs with SGEs in `is`.
        let rc = unsafe { (self.post_recv)(self.qp, base, &mut bad) };
        if rc != 0 {
            return Err(errno_error("ibv_post_recv", rc));
        }
        Ok(())
    }
}
