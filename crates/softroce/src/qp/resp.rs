//! The responder (rxe_resp.c): executes requests in PSN order (SEND into
//! posted receives, WRITE, READ, atomics) after the R_Key checks (RK-C1),
//! NAKs out-of-sequence requests once (PSN-4) and answers duplicates from
//! saved READ/atomic resources (PSN-3).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use smc_verbs::{psn_add, psn_diff, AccessFlags, QpState, WcOpcode, WcStatus};

use super::wqe::scatter;
use super::{Ctx, InProgress, PendingRead, QpInner, RdRes, Resp, MAX_RD_ATOMIC};
use crate::mr::MrEntry;
use crate::wire::{BthRepr, Opcode, Parsed, Syndrome};

impl QpInner {
    /// RK-C1: the region named by `rkey`, if `[va, va+len)` lies in it with
    /// `need` access and the QP grants that access to its peer.
    pub(super) fn check_remote(
        &self,
        ctx: &Ctx<'_>,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Option<(Arc<MrEntry>, usize)> {
        if !self.access.contains(need) {
            return None;
        }
        let mr = ctx.qp.dev.mrs.lookup(rkey)?;
        if mr.pd != ctx.qp.pd || !mr.access.contains(need) {
            return None;
        }
        let boff = mr.range(va, len)?;
        Some((mr, boff))
    }

    pub(super) fn on_request(&mut self, ctx: &mut Ctx<'_>, p: &Parsed, pkt: &[u8]) {
        if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) || self.resp_fatal {
            // Not receiving, or a fatal NAK is owed: the QP is about to
            // enter ERR, nothing more is executed.
            return;
        }
        let bth = p.repr.bth;
        let d = psn_diff(bth.psn, self.epsn);
        if d < 0 {
            return self.on_duplicate(ctx, p);
        }
        if d > 0 {
            // PSN-4: NAK once, then drop until ePSN arrives.
            if !self.nak_sent {
                self.nak_sent = true;
                self.send_nak(ctx, self.epsn, Syndrome::NakPsnSeqError);
            }
            return;
        }
        let payload = &pkt[p.payload_off..p.payload_off + p.payload_len];
        let op = bth.opcode;
        if payload.len() > self.mtu {
            return self.responder_error(ctx, Syndrome::NakInvalidRequest);
        }
        match op {
            Opcode::SendFirst
            | Opcode::SendMiddle
            | Opcode::SendLast
            | Opcode::SendLastImm
            | Opcode::SendOnly
            | Opcode::SendOnlyImm => self.on_send(ctx, p, payload),
            Opcode::WriteFirst
            | Opcode::WriteMiddle
            | Opcode::WriteLast
            | Opcode::WriteLastImm
            | Opcode::WriteOnly
            | Opcode::WriteOnlyImm => self.on_write(ctx, p, payload),
            Opcode::ReadRequest => self.on_read_request(ctx, p),
            Opcode::CompareSwap | Opcode::FetchAdd => self.on_atomic(ctx, p),
            _ => {}
        }
    }

    pub(super) fn accept(&mut self, bth: &BthRepr, advance: u32) {
        self.nak_sent = false;
        self.epsn = psn_add(self.epsn, advance);
        if bth.ack_req {
            self.ack_pending = true;
        }
    }

    pub(super) fn on_send(&mut self, ctx: &mut Ctx<'_>, p: &Parsed, payload: &[u8]) {
        let bth = p.repr.bth;
        let op = bth.opcode;
        let first = op.is_first();
        let last = op.is_last();
        let in_send = matches!(self.cur, Some(InProgress::Send { .. }));
        if first == in_send || (!first && self.cur.is_none()) || (first && self.cur.is_some()) {
            return self.responder_error(ctx, Syndrome::NakInvalidRequest); // SEG-8
        }
        if !last && payload.len() != self.mtu {
            return self.responder_error(ctx, Syndrome::NakInvalidRequest); // SEG-7
        }
        if first {
            let Some(wqe) = self.rq.pop_front() else {
                // No receive posted: RNR NAK, the requester retries later.
                return self.send_nak(
                    ctx,
                    self.epsn,
                    Syndrome::RnrNak {
                        timer: self.min_rnr_timer,
                    },
                );
            };
            self.cur = Some(InProgress::Send { wqe, written: 0 });
        }
        let Some(InProgress::Send { wqe, written }) = self.cur.as_mut() else {
            return;
        };
        let wr_id = wqe.wr_id;
        let failure = if let Some(st) = wqe.local_err {
            Some((st, Syndrome::NakRemoteOperationalError))
        } else if let Err(st) = scatter(&wqe.segs, *written, payload) {
            // RC-4: message longer than the receive buffer (invalid
            // request), or the buffer's region was deregistered since the
            // receive was posted (the WQE is broken: operational error).
            let syn = if st == WcStatus::LocLenErr {
                Syndrome::NakInvalidRequest
            } else {
                Syndrome::NakRemoteOperationalError
            };
            Some((st, syn))
        } else {
            *written += payload.len();
            None
        };
        let written = *written;
        if let Some((st, syn)) = failure {
            let wc = self.recv_wc(ctx, wr_id, st);
            self.cur = None;
            self.complete_recv(ctx, wc);
            return self.responder_error(ctx, syn);
        }
        self.accept(&bth, 1);
        if last {
            if let Some(InProgress::Send { wqe, .. }) = self.cur.take() {
                self.msn = psn_add(self.msn, 1);
                let mut wc = self.recv_wc(ctx, wqe.wr_id, WcStatus::Success);
                wc.byte_len = written as u32;
                wc.imm_data = p.repr.imm;
                wc.solicited = bth.se;
                self.complete_recv(ctx, wc);
            }
        }
    }

    pub(super) fn on_write(&mut self, ctx: &mut Ctx<'_>, p: &Parsed, payload: &[u8]) {
        let bth = p.repr.bth;
        let op = bth.opcode;
        let first = op.is_first();
        let last = op.is_last();
        if first {
            if self.cur.is_some() {
                return self.responder_error(ctx, Syndrome::NakInvalidRequest);
            }
            let Some(reth) = p.repr.reth else { return };
            let total = reth.dma_len as usize;
            let (mr, boff) = if total == 0 {
                (None, 0) // RK-C3: zero-length writes are not checked.
            } else {
                match self.check_remote(
                    ctx,
                    reth.rkey,
                    reth.va,
                    total as u64,
                    AccessFlags::REMOTE_WRITE,
                ) {
                    Some((mr, boff)) => (Some(mr), boff),
                    None => return self.responder_error(ctx, Syndrome::NakRemoteAccessError),
                }
            };
            let ok_len = if last {
                payload.len() == total
            } else {
                payload.len() == self.mtu && total > self.mtu
            };
            if !ok_len {
                return self.responder_error(ctx, Syndrome::NakInvalidRequest);
            }
            self.cur = Some(InProgress::Write {
                mr,
                boff,
                remaining: total,
                total: reth.dma_len,
            });
        } else {
            let Some(InProgress::Write { remaining, .. }) = self.cur.as_ref() else {
                return self.responder_error(ctx, Syndrome::NakInvalidRequest);
            };
            let ok_len = if last {
                payload.len() == *remaining
            } else {
                payload.len() == self.mtu && *remaining > self.mtu
            };
            if !ok_len {
                return self.responder_error(ctx, Syndrome::NakInvalidRequest);
            }
        }
        if last && op.has_imm() && self.rq.is_empty() {
            // The immediate needs a receive WQE; nothing of this packet is
            // placed yet, so the retry after the RNR wait starts here.
            if first {
                self.cur = None;
            }
            return self.send_nak(
                ctx,
                self.epsn,
                Syndrome::RnrNak {
                    timer: self.min_rnr_timer,
                },
            );
        }
        let Some(InProgress::Write {
            mr,
            boff,
            remaining,
            total,
        }) = self.cur.as_mut()
        else {
            return;
        };
        if let (Some(mr), false) = (mr.as_ref(), payload.is_empty()) {
            // The region may have been deregistered since the First packet
            // was checked: then nothing more is placed (item 6, RK-C1 (a)).
            let Some(m) = mr.enter() else {
                return self.responder_error(ctx, Syndrome::NakRemoteAccessError);
            };
            m.write(*boff, payload);
        }
        *boff += payload.len();
        *remaining -= payload.len();
        let total = *total;
        self.accept(&bth, 1);
        if last {
            self.cur = None;
            self.msn = psn_add(self.msn, 1);
            if op.has_imm() {
                if let Some(wqe) = self.rq.pop_front() {
                    let status = wqe.local_err.unwrap_or(WcStatus::Success);
                    let mut wc = self.recv_wc(ctx, wqe.wr_id, status);
                    wc.opcode = WcOpcode::RecvRdmaWithImm;
                    wc.byte_len = total;
                    wc.imm_data = p.repr.imm;
                    wc.solicited = bth.se;
                    self.complete_recv(ctx, wc);
                }
            }
        }
    }

    /// Saves a READ/atomic for duplicate replay. The last MAX_RD_ATOMIC
    /// are kept, at least `max_dest_rd_atomic`: a requester within its
    /// `max_rd_atomic` only ever retries one of those.
    pub(super) fn rd_res_push(&mut self, r: RdRes) {
        if self.rd_res.len() >= MAX_RD_ATOMIC {
            self.rd_res.pop_front();
        }
        self.rd_res.push_back(r);
    }

    /// A new READ or atomic may start only while fewer than
    /// `max_dest_rd_atomic` are in progress, i.e. still owe responses
    /// (the responder resources; CHECKLIST C.7: NAK Invalid Request on
    /// overflow). This also bounds what a peer can make us queue.
    pub(super) fn rd_atomic_allowed(&self) -> bool {
        let in_progress = self
            .responses
            .iter()
            .filter(|r| matches!(r, Resp::Read(_) | Resp::AtomicAck { .. }))
            .count();
        in_progress < self.max_dest_rd_atomic as usize
    }

    pub(super) fn on_read_request(&mut self, ctx: &mut Ctx<'_>, p: &Parsed) {
        if self.cur.is_some() || !self.rd_atomic_allowed() {
            return self.responder_error(ctx, Syndrome::NakInvalidRequest);
        }
        let Some(reth) = p.repr.reth else { return };
        let len = reth.dma_len as usize;
        let (mr, boff) = if len == 0 {
            (None, 0)
        } else {
            match self.check_remote(
                ctx,
                reth.rkey,
                reth.va,
                len as u64,
                AccessFlags::REMOTE_READ,
            ) {
                Some((mr, boff)) => (Some(mr), boff),
                None => return self.responder_error(ctx, Syndrome::NakRemoteAccessError),
            }
        };
        let npkts = len.div_ceil(self.mtu).max(1) as u32;
        let psn = p.repr.bth.psn;
        self.rd_res_push(RdRes::Read {
            first_psn: psn,
            npkts,
            rkey: reth.rkey,
            va: reth.va,
            len,
        });
        self.nak_sent = false;
        self.epsn = psn_add(self.epsn, npkts);
        self.msn = psn_add(self.msn, 1);
        let msn = self.msn;
        self.respond(
            ctx,
            Resp::Read(PendingRead {
                first_psn: psn,
                next: 0,
                npkts,
                mr,
                boff,
                len,
                msn,
            }),
        );
    }

    pub(super) fn on_atomic(&mut self, ctx: &mut Ctx<'_>, p: &Parsed) {
        if self.cur.is_some() || !self.rd_atomic_allowed() {
            return self.responder_error(ctx, Syndrome::NakInvalidRequest);
        }
        let Some(a) = p.repr.atomic else { return };
        if a.va % 8 != 0 {
            return self.responder_error(ctx, Syndrome::NakInvalidRequest); // RK-C1 (e)
        }
        let Some((mr, boff)) = self.check_remote(ctx, a.rkey, a.va, 8, AccessFlags::REMOTE_ATOMIC)
        else {
            return self.responder_error(ctx, Syndrome::NakRemoteAccessError);
        };
        // The provider's atomics and every copy into or out of the buffer
        // (ours and the application's) are accesses to the same aligned
        // 8-byte words (smc_verbs::mem), so they never race (C.8).
        let orig = {
            let Some(m) = mr.enter() else {
                return self.responder_error(ctx, Syndrome::NakRemoteAccessError);
            };
            let Some(cell) = m.atomic(boff) else {
                return self.responder_error(ctx, Syndrome::NakInvalidRequest);
            };
            match p.repr.bth.opcode {
                Opcode::CompareSwap => {
                    match cell.compare_exchange(
                        a.compare,
                        a.swap_add,
                        Ordering::SeqCst,
                        Ordering::SeqCst,
                    ) {
                        Ok(v) | Err(v) => v,
                    }
                }
                _ => cell.fetch_add(a.swap_add, Ordering::SeqCst),
            }
        };
        let psn = p.repr.bth.psn;
        self.rd_res_push(RdRes::Atomic { psn, orig });
        self.nak_sent = false;
        self.epsn = psn_add(self.epsn, 1);
        self.msn = psn_add(self.msn, 1);
        let msn = self.msn;
        self.respond(ctx, Resp::AtomicAck { psn, orig, msn });
    }

    /// PSN-3: duplicates are re-acknowledged, READs re-executed and atomics
    /// answered from the saved result.
    pub(super) fn on_duplicate(&mut self, ctx: &mut Ctx<'_>, p: &Parsed) {
        let psn = p.repr.bth.psn;
        match p.repr.bth.opcode {
            Opcode::ReadRequest => {
                let saved = self.rd_res.iter().find_map(|r| match *r {
                    RdRes::Read {
                        first_psn,
                        npkts,
                        rkey,
                        va,
                        len,
                    } => {
                        let d = psn_diff(psn, first_psn);
                        (d >= 0 && (d as u32) < npkts)
                            .then_some((first_psn, d as u32, npkts, rkey, va, len))
                    }
                    RdRes::Atomic { .. } => None,
                });
                let Some((first_psn, next, npkts, rkey, va, len)) = saved else {
                    return self.unknown_duplicate(ctx, psn);
                };
                // Re-executed from memory (C.7), but only after the R_Key
                // is looked up and checked again for the part still to
                // send: the region may have been deregistered (item 6).
                let off = (next as usize * self.mtu).min(len);
                let (mr, boff) = if len == 0 {
                    (None, 0)
                } else {
                    match self.check_remote(
                        ctx,
                        rkey,
                        va.wrapping_add(off as u64),
                        (len - off) as u64,
                        AccessFlags::REMOTE_READ,
                    ) {
                        Some((mr, boff)) => (Some(mr), boff - off),
                        None => {
                            return self.responder_error_at(
                                ctx,
                                psn,
                                Syndrome::NakRemoteAccessError,
                            )
                        }
                    }
                };
                // Still owed (partly sent): resend from the PSN asked for.
                for r in self.responses.iter_mut() {
                    if let Resp::Read(q) = r {
                        if q.first_psn == first_psn {
                            q.next = q.next.min(next);
                            return;
                        }
                    }
                }
                let msn = self.msn;
                self.respond_first(
                    ctx,
                    Resp::Read(PendingRead {
                        first_psn,
                        next,
                        npkts,
                        mr,
                        boff,
                        len,
                        msn,
                    }),
                );
            }
            Opcode::CompareSwap | Opcode::FetchAdd => {
                let saved = self.rd_res.iter().find_map(|r| match r {
                    RdRes::Atomic { psn: q, orig } if *q == psn => Some(*orig),
                    _ => None,
                });
                let owed = self
                    .responses
                    .iter()
                    .any(|r| matches!(r, Resp::AtomicAck { psn: q, .. } if *q == psn));
                match (saved, owed) {
                    (Some(orig), false) => {
                        let msn = self.msn;
                        self.respond_first(ctx, Resp::AtomicAck { psn, orig, msn });
                    }
                    (None, _) => self.unknown_duplicate(ctx, psn),
                    (Some(_), true) => {}
                }
            }
            _ => self.ack_pending = true,
        }
    }

    /// A duplicate READ or atomic we keep no record of (older than the
    /// last MAX_RD_ATOMIC, so from a requester that exceeded our
    /// `max_dest_rd_atomic`, or a late network duplicate of a long
    /// completed request). Never executed again (PSN-3: an atomic must not
    /// run twice). rxe drops it silently (IBA class D), which leaves a
    /// requester that really waits for it retrying until its retry count
    /// runs out, forever with rxe's retry_cnt 7; we answer NAK Invalid
    /// Request at its PSN so that requester fails at once. Our QP stays up:
    /// a requester not waiting for that PSN ignores the NAK, and a stale
    /// duplicate must not kill a working connection.
    pub(super) fn unknown_duplicate(&mut self, ctx: &mut Ctx<'_>, psn: u32) {
        tracing::debug!(
            qpn = ctx.qp.qpn,
            psn,
            "duplicate READ/atomic without a saved resource"
        );
        let msn = self.msn;
        self.respond_first(
            ctx,
            Resp::Nak {
                psn,
                syn: Syndrome::NakInvalidRequest,
                msn,
                fatal: false,
            },
        );
    }
}
