//! Work queue entries: what `post_send`/`post_recv` validate and queue
//! (local memory resolved through the MR table, lkeys and PD checked), and
//! the copies between a message and its scatter/gather list.

use arrayvec::ArrayVec;
use smc_verbs::{
    AccessFlags, QpState, RecvWr, Result, SendFlags, SendOp, SendWr, VerbsError, WcStatus,
};

use super::{Ctx, LocalSeg, QpInner, RecvWqe, SendWqe, MAX_INLINE, MAX_MSG_PKTS, MAX_SGE};
use crate::device::DevShared;

/// Copies `out.len()` message bytes starting at message offset `off` out of
/// the gather list; false if a region of the list was deregistered.
pub(super) fn gather(segs: &[LocalSeg], mut off: usize, out: &mut [u8]) -> bool {
    let mut done = 0;
    for s in segs {
        if done == out.len() {
            break;
        }
        if off >= s.len {
            off -= s.len;
            continue;
        }
        let n = (s.len - off).min(out.len() - done);
        let Some(m) = s.mr.enter() else { return false };
        m.read(s.boff + off, &mut out[done..done + n]);
        done += n;
        off = 0;
    }
    true
}

/// Copies `data` into the scatter list at message offset `off`. Fails with
/// `LocLenErr` if it does not fit, `LocProtErr` if a region of the list was
/// deregistered.
pub(super) fn scatter(
    segs: &[LocalSeg],
    mut off: usize,
    data: &[u8],
) -> std::result::Result<(), WcStatus> {
    let mut done = 0;
    for s in segs {
        if done == data.len() {
            break;
        }
        if off >= s.len {
            off -= s.len;
            continue;
        }
        let n = (s.len - off).min(data.len() - done);
        let Some(m) = s.mr.enter() else {
            return Err(WcStatus::LocProtErr);
        };
        m.write(s.boff + off, &data[done..done + n]);
        done += n;
        off = 0;
    }
    if done == data.len() {
        Ok(())
    } else {
        Err(WcStatus::LocLenErr)
    }
}

impl QpInner {
    // ----- local memory ------------------------------------------------

    pub(super) fn resolve(
        dev: &DevShared,
        pd: u32,
        sges: &[smc_verbs::Sge],
        need_write: bool,
    ) -> (ArrayVec<LocalSeg, MAX_SGE>, u64, Option<WcStatus>) {
        let mut segs = ArrayVec::new();
        let mut total = 0u64;
        for s in sges {
            total += s.length as u64;
            if s.length == 0 {
                continue;
            }
            let ok = dev.mrs.lookup(s.lkey).and_then(|mr| {
                if mr.pd != pd || (need_write && !mr.access.contains(AccessFlags::LOCAL_WRITE)) {
                    return None;
                }
                let boff = mr.range(s.addr, s.length as u64)?;
                Some(LocalSeg {
                    mr,
                    boff,
                    len: s.length as usize,
                })
            });
            match ok {
                Some(seg) => segs.push(seg),
                None => return (ArrayVec::new(), total, Some(WcStatus::LocProtErr)),
            }
        }
        (segs, total, None)
    }

    // ----- posting ----------------------------------------------------

    pub(super) fn post_send(&mut self, ctx: &mut Ctx<'_>, wrs: &[SendWr<'_>]) -> Result<()> {
        match self.state {
            QpState::Rts | QpState::Sqd | QpState::Err => {}
            s => return Err(VerbsError::InvalidState(s)),
        }
        let cap = ctx.qp.cap;
        if self.sq.len() + wrs.len() > cap.max_send_wr as usize {
            return Err(VerbsError::QueueFull);
        }
        for wr in wrs {
            if wr.sg_list.len() > cap.max_send_sge as usize {
                return Err(VerbsError::InvalidArgument("too many SGEs"));
            }
            let len: u64 = wr.sg_list.iter().map(|s| s.length as u64).sum();
            if wr.flags.contains(SendFlags::INLINE) {
                let inline_ok = matches!(
                    wr.op,
                    SendOp::Send
                        | SendOp::SendWithImm { .. }
                        | SendOp::RdmaWrite { .. }
                        | SendOp::RdmaWriteWithImm { .. }
                );
                if !inline_ok {
                    return Err(VerbsError::InvalidArgument("inline only for SEND/WRITE"));
                }
                if len > cap.max_inline_data as u64 {
                    return Err(VerbsError::InlineTooLarge {
                        len: len as usize,
                        max: cap.max_inline_data as usize,
                    });
                }
            }
            if matches!(
                wr.op,
                SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. }
            ) && len != 8
            {
                return Err(VerbsError::InvalidArgument(
                    "atomics need an 8-byte scatter list",
                ));
            }
            if len > (1u64 << 31) {
                return Err(VerbsError::InvalidArgument("message longer than 2 GiB"));
            }
            // PSN-1: PSNs compare in a 2^23 window. A message's packets,
            // plus the send window before them, must fit in it, or a
            // retransmission (go-back-N to a PSN inside the message) could
            // not be placed and the QP would hang. IBA's 2 GiB maximum at
            // path MTU 256 is exactly 2^23 packets.
            if len.div_ceil(self.mtu as u64) > MAX_MSG_PKTS {
                return Err(VerbsError::InvalidArgument(
                    "message spans more than 2^22 packets at this path MTU",
                ));
            }
        }
        let dev = ctx.qp.dev.clone();
        for wr in wrs {
            let need_write = matches!(
                wr.op,
                SendOp::RdmaRead { .. }
                    | SendOp::AtomicCmpSwap { .. }
                    | SendOp::AtomicFetchAdd { .. }
            );
            let (segs, len, mut local_err, inline) = if wr.flags.contains(SendFlags::INLINE) {
                let mut data = ArrayVec::<u8, MAX_INLINE>::new();
                let mut err = None;
                for s in wr.sg_list {
                    if s.length == 0 {
                        continue;
                    }
                    // INLINE: lkeys are not checked, but the memory must be
                    // ours; read it through a region of this QP's PD that
                    // covers the address, else the request fails with a
                    // protection error rather than touching unknown memory.
                    match dev
                        .mrs
                        .find_covering(ctx.qp.pd, s.lkey, s.addr, s.length as u64)
                    {
                        Some((mr, boff)) => {
                            let start = data.len();
                            for _ in 0..s.length {
                                data.push(0);
                            }
                            match mr.enter() {
                                Some(m) => m.read(boff, &mut data[start..]),
                                None => err = Some(WcStatus::LocProtErr),
                            }
                        }
                        None => err = Some(WcStatus::LocProtErr),
                    }
                }
                let n = data.len() as u64;
                (ArrayVec::new(), n, err, Some(data))
            } else {
                let (s, l, e) = Self::resolve(&dev, ctx.qp.pd, wr.sg_list, need_write);
                (s, l, e, None)
            };
            if len > u32::MAX as u64 {
                local_err = Some(WcStatus::LocLenErr);
            }
            self.sq.push_back(SendWqe {
                wr_id: wr.wr_id,
                op: wr.op,
                signaled: wr.flags.contains(SendFlags::SIGNALED),
                solicited: wr.flags.contains(SendFlags::SOLICITED),
                fence: wr.flags.contains(SendFlags::FENCE),
                segs,
                inline,
                len: len as u32,
                local_err,
                first_psn: 0,
                npkts: 0,
                read_got: 0,
            });
        }
        if self.state == QpState::Err {
            self.flush(ctx);
        } else {
            self.pump(ctx);
        }
        Ok(())
    }

    pub(super) fn post_recv(&mut self, ctx: &mut Ctx<'_>, wrs: &[RecvWr<'_>]) -> Result<()> {
        if self.state == QpState::Reset {
            return Err(VerbsError::InvalidState(self.state));
        }
        let cap = ctx.qp.cap;
        if self.rq.len() + wrs.len() > cap.max_recv_wr as usize {
            return Err(VerbsError::QueueFull);
        }
        if wrs
            .iter()
            .any(|w| w.sg_list.len() > cap.max_recv_sge as usize)
        {
            return Err(VerbsError::InvalidArgument("too many SGEs"));
        }
        let dev = ctx.qp.dev.clone();
        for wr in wrs {
            let (segs, _, local_err) = Self::resolve(&dev, ctx.qp.pd, wr.sg_list, true);
            self.rq.push_back(RecvWqe {
                wr_id: wr.wr_id,
                segs,
                local_err,
            });
        }
        if self.state == QpState::Err {
            self.flush(ctx);
        }
        Ok(())
    }
}
