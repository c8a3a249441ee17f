//! The requester (rxe_req.c): segments send WQEs into packets within the
//! window and the READ/atomic limits, sets AckReq (ACK-3), and repositions
//! transmission for go-back-N retransmission; its timers (local ACK
//! timeout, RNR wait).

use smc_verbs::{psn_add, psn_diff, QpState, SendOp, WcStatus};

use super::wqe::gather;
use super::{path_parts, Ctx, QpInner, SendWqe, ACK_EVERY, MIN_WINDOW};
use crate::wire::{AtomicEthRepr, BthRepr, Opcode, PacketRepr, RethRepr};

impl QpInner {
    // ----- requester: transmission ---------------------------------------

    pub(super) fn npkts(&self, w: &SendWqe) -> u32 {
        match w.op {
            SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. } => 1,
            _ => (w.len as usize).div_ceil(self.mtu).max(1) as u32,
        }
    }

    /// Sends what the window, RNR wait and read/atomic limits allow.
    pub(super) fn pump(&mut self, ctx: &mut Ctx<'_>) {
        if self.state != QpState::Rts || self.rnr_until.is_some() || self.path.is_none() {
            return;
        }
        while self.next_wqe < self.sq.len() && psn_diff(self.psn, self.una) < self.cwnd {
            let i = self.next_wqe;
            // A local error (found at post time, or a gather region
            // deregistered mid-message) completes the WQE with that error
            // once everything before it completed.
            if let Some(st) = self.sq[i].local_err {
                if i == 0 {
                    self.fail_front(ctx, st);
                    return;
                }
                break;
            }
            if self.next_pkt == 0 {
                let earlier_rd = self.sq.range(..i).filter(|w| w.rd_atomic()).count();
                if self.sq[i].rd_atomic() && earlier_rd >= self.max_rd_atomic.max(1) as usize {
                    break;
                }
                if self.sq[i].fence && earlier_rd > 0 {
                    break;
                }
                let n = self.npkts(&self.sq[i]);
                let w = &mut self.sq[i];
                w.first_psn = self.psn;
                w.npkts = n;
                w.read_got = 0;
            }
            if !self.send_next_packet(ctx, i) {
                self.sq[i].local_err = Some(WcStatus::LocProtErr);
                continue;
            }
            if self.timer.is_none() {
                self.timer = self.timeout.map(|t| ctx.now + t);
            }
        }
    }

    /// Sends the next packet of WQE `i`; false (nothing sent) when its
    /// gather list names a region deregistered since it was posted.
    pub(super) fn send_next_packet(&mut self, ctx: &mut Ctx<'_>, i: usize) -> bool {
        let mtu = self.mtu;
        let k = self.next_pkt;
        let dest_qp = self.dest_qpn;
        let psn = self.psn;
        let w = &self.sq[i];
        let n = w.npkts;
        let first = k == 0;
        let last = k + 1 >= n;
        let mut bth = BthRepr {
            opcode: Opcode::SendOnly,
            se: last && w.solicited,
            mig_req: false, // rxe sends 0 (no APM)
            pad_count: 0,
            pkey: 0xffff,
            resv8a: 0,
            dest_qp,
            // ACK-3: on the last packet, periodically, and when the window
            // fills so that it opens again promptly.
            ack_req: last
                || (k + 1).is_multiple_of(ACK_EVERY)
                || psn_diff(psn_add(psn, 1), self.una) >= self.cwnd,
            resv7: 0,
            psn,
        };
        let mut repr = PacketRepr {
            bth,
            reth: None,
            aeth: None,
            imm: None,
            atomic: None,
            atomic_ack: None,
        };
        let off = k as usize * mtu;
        let seg_len = (w.len as usize).saturating_sub(off).min(mtu);
        let (opcode, payload_len, advance) = match w.op {
            SendOp::Send | SendOp::SendWithImm { .. } => {
                let imm = match w.op {
                    SendOp::SendWithImm { imm } => Some(imm),
                    _ => None,
                };
                let op = match (first, last, imm.is_some()) {
                    (true, true, false) => Opcode::SendOnly,
                    (true, true, true) => Opcode::SendOnlyImm,
                    (true, false, _) => Opcode::SendFirst,
                    (false, false, _) => Opcode::SendMiddle,
                    (false, true, false) => Opcode::SendLast,
                    (false, true, true) => Opcode::SendLastImm,
                };
                if last {
                    repr.imm = imm;
                }
                (op, seg_len, 1)
            }
            SendOp::RdmaWrite { remote_addr, rkey }
            | SendOp::RdmaWriteWithImm {
                remote_addr, rkey, ..
            } => {
                let imm = match w.op {
                    SendOp::RdmaWriteWithImm { imm, .. } => Some(imm),
                    _ => None,
                };
                let op = match (first, last, imm.is_some()) {
                    (true, true, false) => Opcode::WriteOnly,
                    (true, true, true) => Opcode::WriteOnlyImm,
                    (true, false, _) => Opcode::WriteFirst,
                    (false, false, _) => Opcode::WriteMiddle,
                    (false, true, false) => Opcode::WriteLast,
                    (false, true, true) => Opcode::WriteLastImm,
                };
                if first {
                    repr.reth = Some(RethRepr {
                        va: remote_addr,
                        rkey,
                        dma_len: w.len,
                    });
                }
                if last {
                    repr.imm = imm;
                }
                (op, seg_len, 1)
            }
            SendOp::RdmaRead { remote_addr, rkey } => {
                repr.reth = Some(RethRepr {
                    va: remote_addr.wrapping_add(off as u64),
                    rkey,
                    dma_len: w.len - (off.min(w.len as usize) as u32),
                });
                bth.ack_req = false;
                (Opcode::ReadRequest, 0, n - k)
            }
            SendOp::AtomicCmpSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                repr.atomic = Some(AtomicEthRepr {
                    va: remote_addr,
                    rkey,
                    swap_add: swap,
                    compare,
                });
                (Opcode::CompareSwap, 0, 1)
            }
            SendOp::AtomicFetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                repr.atomic = Some(AtomicEthRepr {
                    va: remote_addr,
                    rkey,
                    swap_add: add,
                    compare: 0,
                });
                (Opcode::FetchAdd, 0, 1)
            }
        };
        bth.opcode = opcode;
        if !matches!(opcode, Opcode::ReadRequest) {
            bth.ack_req = bth.ack_req || opcode.is_last() || !opcode.has_payload();
        }
        repr.bth = bth;
        let w = &self.sq[i];
        let (segs, inline) = (&w.segs, w.inline.as_deref());
        if let Some(path) = self.path.as_ref() {
            let sent = ctx.tx.packet(
                &ctx.qp.dev,
                path_parts(path, ctx.qp),
                &mut self.fault,
                &repr,
                payload_len,
                |buf| match inline {
                    Some(d) => {
                        buf.copy_from_slice(&d[off..off + payload_len]);
                        true
                    }
                    None => gather(segs, off, buf),
                },
            );
            if !sent {
                return false;
            }
        }
        self.psn = psn_add(self.psn, advance);
        if psn_diff(self.psn, self.max_psn) > 0 {
            self.max_psn = self.psn;
        }
        self.next_pkt += advance;
        if self.next_pkt >= n {
            self.next_wqe += 1;
            self.next_pkt = 0;
        }
        true
    }

    /// Repositions transmission so that the next packet sent is the one
    /// with PSN `p`: backwards for go-back-N (RTY-1, RTY-4), forwards when
    /// an ACK covers packets sent before an earlier rewind. PSN ranges of
    /// WQEs that were ever started stay valid (segmentation is
    /// deterministic).
    pub(super) fn rewind(&mut self, p: u32) {
        for j in 0..self.sq.len() {
            let w = &self.sq[j];
            if w.npkts == 0 {
                // First never-started WQE: `p` is the high-water mark.
                if p == self.max_psn {
                    self.next_wqe = j;
                    self.next_pkt = 0;
                    self.psn = p;
                }
                return;
            }
            let d = psn_diff(p, w.first_psn);
            if d >= 0 && (d as u32) < w.npkts {
                let k = if w.rd_atomic() { w.read_got } else { d as u32 };
                self.next_wqe = j;
                self.next_pkt = k;
                self.psn = psn_add(w.first_psn, k);
                return;
            }
        }
        if p == self.max_psn {
            self.next_wqe = self.sq.len();
            self.next_pkt = 0;
            self.psn = p;
        }
    }

    pub(super) fn service(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now;
        if self.rnr_until.is_some_and(|t| t <= now) {
            self.rnr_until = None;
            self.timer = self.timeout.map(|t| now + t);
        }
        if self.timer.is_some_and(|t| t <= now) {
            self.timer = None;
            if self.state == QpState::Rts && self.outstanding() {
                // RTY-1: local ACK timeout.
                if self.retry_left == 0 {
                    return self.fail_front(ctx, WcStatus::RetryExcErr);
                }
                self.retry_left -= 1;
                self.cwnd = MIN_WINDOW;
                tracing::trace!(
                    qpn = ctx.qp.qpn,
                    psn = self.una,
                    "retransmit on ACK timeout"
                );
                self.rewind(self.una);
                self.timer = self.timeout.map(|t| now + t);
            }
        }
        self.pump_responses(ctx);
        self.pump(ctx);
    }
}
