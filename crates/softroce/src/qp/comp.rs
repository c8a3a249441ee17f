//! The completer (rxe_comp.c): ACKs, NAKs and READ/atomic responses retire
//! send WQEs in order into work completions (ACK-2, RTY-2..4), and the
//! completions of both queues reach their CQs.

use smc_verbs::{psn_add, psn_diff, QpState, SendOp, WcOpcode, WcStatus, WorkCompletion, PSN_MASK};

use super::wqe::scatter;
use super::{rnr_timeout, Ctx, QpInner, SendWqe, MIN_WINDOW, WINDOW};
use crate::wire::{Opcode, Parsed, Syndrome};

impl QpInner {
    // ----- completions and errors -------------------------------------

    pub(super) fn complete_send(&mut self, ctx: &mut Ctx<'_>, w: &SendWqe, status: WcStatus) {
        if !(w.signaled || ctx.qp.sig_all || status != WcStatus::Success) {
            return;
        }
        let byte_len = match w.op {
            SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. } => 8,
            _ => w.len,
        };
        let wc = WorkCompletion {
            wr_id: w.wr_id,
            status,
            opcode: w.wc_opcode(),
            byte_len,
            imm_data: None,
            qp_num: ctx.qp.qpn,
            src_qp: self.dest_qpn,
            solicited: false,
        };
        match ctx.qp.send_cq.push(wc) {
            Ok(f) => ctx.fire_send |= f,
            Err(()) => self.enter_err(ctx),
        }
    }

    pub(super) fn complete_recv(&mut self, ctx: &mut Ctx<'_>, wc: WorkCompletion) {
        match ctx.qp.recv_cq.push(wc) {
            Ok(f) => ctx.fire_recv |= f,
            Err(()) => self.enter_err(ctx),
        }
    }

    pub(super) fn recv_wc(&self, ctx: &Ctx<'_>, wr_id: u64, status: WcStatus) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode: WcOpcode::Recv,
            byte_len: 0,
            imm_data: None,
            qp_num: ctx.qp.qpn,
            src_qp: self.dest_qpn,
            solicited: false,
        }
    }

    /// Completes the oldest send WQE with an error and moves to ERR (RTY-1..3).
    pub(super) fn fail_front(&mut self, ctx: &mut Ctx<'_>, status: WcStatus) {
        if let Some(w) = self.sq.pop_front() {
            tracing::debug!(
                qpn = ctx.qp.qpn,
                wr_id = w.wr_id,
                ?status,
                "send WQE failed"
            );
            self.complete_send(ctx, &w, status);
        }
        self.next_wqe = self.next_wqe.saturating_sub(1);
        self.enter_err(ctx);
    }

    pub(super) fn update_una(&mut self, acked: Option<u32>) {
        self.una = match self.sq.front() {
            Some(w) if w.npkts > 0 => {
                if w.rd_atomic() {
                    psn_add(w.first_psn, w.read_got)
                } else {
                    match acked {
                        Some(p) if psn_diff(psn_add(p, 1), w.first_psn) > 0 => psn_add(p, 1),
                        _ => w.first_psn,
                    }
                }
            }
            _ => self.max_psn,
        };
    }

    pub(super) fn outstanding(&self) -> bool {
        self.una != self.max_psn
    }

    pub(super) fn progress(&mut self, ctx: &mut Ctx<'_>) {
        self.cwnd = (self.cwnd + 1).min(WINDOW);
        self.retry_left = self.retry_cnt;
        self.rnr_left = self.rnr_retry;
        self.last_rewind = None;
        self.timer = if self.outstanding() {
            self.timeout.map(|t| ctx.now + t)
        } else {
            None
        };
    }

    /// Cumulative acknowledgement of every PSN up to `p` (ACK-2). Returns
    /// whether anything new was acknowledged.
    pub(super) fn ack_upto(&mut self, ctx: &mut Ctx<'_>, p: u32) -> bool {
        if psn_diff(p, self.una) < -1 || psn_diff(p, self.max_psn) >= 0 {
            return false;
        }
        let mut advanced = psn_diff(p, self.una) >= 0;
        let next = psn_add(p, 1);
        if psn_diff(next, self.psn) > 0 {
            // Acknowledged beyond what we are retransmitting: skip ahead.
            self.rewind(next);
        }
        while let Some(w) = self.sq.front() {
            if w.npkts == 0 || self.next_wqe == 0 {
                break;
            }
            let last = psn_add(w.first_psn, w.npkts.saturating_sub(1));
            if w.rd_atomic() {
                // An ACK beyond an unanswered READ/atomic means its response
                // was lost: ask again from the first missing response.
                let missing = psn_add(w.first_psn, w.read_got);
                if psn_diff(p, missing) >= 0 && self.last_rewind != Some(missing) {
                    self.last_rewind = Some(missing);
                    self.rewind(missing);
                }
                break;
            }
            if psn_diff(last, p) > 0 {
                break;
            }
            if let Some(w) = self.sq.pop_front() {
                self.next_wqe -= 1;
                self.complete_send(ctx, &w, WcStatus::Success);
                advanced = true;
            }
        }
        if advanced {
            self.update_una(Some(p));
            self.progress(ctx);
        }
        advanced
    }

    // ----- requester: responses -------------------------------------------

    pub(super) fn on_response(&mut self, ctx: &mut Ctx<'_>, p: &Parsed, pkt: &[u8]) {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return;
        }
        let r = &p.repr;
        let psn = r.bth.psn;
        match r.bth.opcode {
            Opcode::Acknowledge => {
                let Some(aeth) = r.aeth else { return };
                match aeth.syndrome {
                    Syndrome::Ack { .. } => {
                        self.ack_upto(ctx, psn);
                    }
                    nak => self.on_nak(ctx, psn, nak),
                }
            }
            Opcode::AtomicAcknowledge => {
                let (Some(orig), Some(aeth)) = (r.atomic_ack, r.aeth) else {
                    return;
                };
                if !matches!(aeth.syndrome, Syndrome::Ack { .. }) {
                    return self.on_nak(ctx, psn, aeth.syndrome);
                }
                self.ack_upto(ctx, psn_add(psn, PSN_MASK));
                let Some(w) = self.sq.front() else { return };
                if w.npkts == 0
                    || !w.rd_atomic()
                    || matches!(w.op, SendOp::RdmaRead { .. })
                    || w.first_psn != psn
                {
                    return;
                }
                if let Err(st) = scatter(&w.segs, 0, &orig.to_ne_bytes()) {
                    return self.fail_front(ctx, st);
                }
                if psn_diff(psn_add(psn, 1), self.psn) > 0 {
                    self.rewind(psn_add(psn, 1));
                }
                if let Some(w) = self.sq.pop_front() {
                    self.next_wqe = self.next_wqe.saturating_sub(1);
                    self.complete_send(ctx, &w, WcStatus::Success);
                }
                self.update_una(None);
                self.progress(ctx);
            }
            Opcode::ReadResponseFirst
            | Opcode::ReadResponseMiddle
            | Opcode::ReadResponseLast
            | Opcode::ReadResponseOnly => {
                if let Some(aeth) = r.aeth {
                    if !matches!(aeth.syndrome, Syndrome::Ack { .. }) {
                        return self.on_nak(ctx, psn, aeth.syndrome);
                    }
                }
                self.on_read_response(ctx, p, pkt);
            }
            _ => {}
        }
    }

    pub(super) fn on_read_response(&mut self, ctx: &mut Ctx<'_>, p: &Parsed, pkt: &[u8]) {
        let psn = p.repr.bth.psn;
        // Find the READ this response belongs to.
        let mut found = None;
        for j in 0..self.sq.len() {
            let w = &self.sq[j];
            if w.npkts == 0 {
                break;
            }
            let d = psn_diff(psn, w.first_psn);
            if matches!(w.op, SendOp::RdmaRead { .. }) && d >= 0 && (d as u32) < w.npkts {
                found = Some(j);
                break;
            }
        }
        let Some(j) = found else { return };
        let expected = psn_add(self.sq[j].first_psn, self.sq[j].read_got);
        let d = psn_diff(psn, expected);
        if d != 0 {
            if d > 0 && self.last_rewind != Some(expected) {
                // A gap in the responses: re-request from the first missing
                // one (the responder re-executes reads, PSN-3).
                self.last_rewind = Some(expected);
                self.rewind(expected);
                self.pump(ctx);
            }
            return;
        }
        // Responses implicitly acknowledge everything before them (ACK-2).
        if j > 0 {
            let read_first = self.sq[j].first_psn;
            self.ack_upto(ctx, psn_add(read_first, PSN_MASK));
            let at_front = self.sq.front().is_some_and(|w| {
                matches!(w.op, SendOp::RdmaRead { .. }) && w.first_psn == read_first
            });
            if !at_front {
                return;
            }
        }
        let w = &self.sq[0];
        let k = w.read_got;
        let n = w.npkts;
        let want = match (k == 0, k + 1 == n) {
            (true, true) => Opcode::ReadResponseOnly,
            (true, false) => Opcode::ReadResponseFirst,
            (false, true) => Opcode::ReadResponseLast,
            (false, false) => Opcode::ReadResponseMiddle,
        };
        let off = k as usize * self.mtu;
        let len = (w.len as usize).saturating_sub(off).min(self.mtu);
        if p.repr.bth.opcode != want || p.payload_len != len {
            // The expected response, but with the wrong opcode or length:
            // the responder is broken (IBA "bad response").
            tracing::debug!(qpn = ctx.qp.qpn, psn, "malformed read response");
            return self.fail_front(ctx, WcStatus::BadRespErr);
        }
        if let Err(st) = scatter(&w.segs, off, &pkt[p.payload_off..p.payload_off + len]) {
            return self.fail_front(ctx, st);
        }
        self.sq[0].read_got += 1;
        if psn_diff(psn_add(psn, 1), self.psn) > 0 {
            self.rewind(psn_add(psn, 1));
        }
        if self.sq[0].read_got == n {
            if let Some(w) = self.sq.pop_front() {
                self.next_wqe = self.next_wqe.saturating_sub(1);
                self.complete_send(ctx, &w, WcStatus::Success);
            }
        }
        self.update_una(None);
        self.progress(ctx);
        self.pump(ctx);
    }

    pub(super) fn on_nak(&mut self, ctx: &mut Ctx<'_>, psn: u32, syn: Syndrome) {
        // Only NAKs for PSNs in flight count.
        if psn_diff(psn, self.una) < 0 || psn_diff(psn, self.max_psn) >= 0 {
            return;
        }
        self.ack_upto(ctx, psn_add(psn, PSN_MASK));
        if self.state != QpState::Rts {
            return;
        }
        match syn {
            Syndrome::NakPsnSeqError => {
                if self.rnr_until.is_some() || self.last_rewind == Some(psn) {
                    // Packets that followed an RNR-NAKed one (the RNR wait
                    // already rewound), or a duplicate of a NAK we acted on
                    // without progress since.
                    return;
                }
                self.last_rewind = Some(psn);
                // RTY-4: retransmit from the NAK'd PSN without using a retry.
                self.cwnd = (self.cwnd / 2).max(MIN_WINDOW);
                self.rewind(psn);
                self.timer = self.timeout.map(|t| ctx.now + t);
                self.pump(ctx);
            }
            Syndrome::RnrNak { timer } => {
                // RTY-2.
                if self.rnr_retry != 7 {
                    if self.rnr_left == 0 {
                        return self.fail_front(ctx, WcStatus::RnrRetryExcErr);
                    }
                    self.rnr_left -= 1;
                }
                self.rewind(psn);
                self.timer = None;
                self.rnr_until = Some(ctx.now + rnr_timeout(timer));
            }
            Syndrome::NakInvalidRequest | Syndrome::NakInvalidRdRequest => {
                self.fail_front(ctx, WcStatus::RemInvReqErr)
            }
            Syndrome::NakRemoteAccessError => self.fail_front(ctx, WcStatus::RemAccessErr),
            Syndrome::NakRemoteOperationalError => self.fail_front(ctx, WcStatus::RemOpErr),
            Syndrome::Ack { .. } | Syndrome::Reserved(_) => {}
        }
    }
}
