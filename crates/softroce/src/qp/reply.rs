//! What the responder sends (rxe_resp.c's acks and read replies): ACKs,
//! NAKs, atomic ACKs and READ responses, owed in PSN order (IBA vol. 1
//! §9.7) and sent from the front of [`Resp`] queue, READ responses at most
//! [`READ_CHUNK`] packets per pass.

use smc_verbs::{psn_add, psn_diff, PSN_MASK};

use super::{path_parts, Ctx, QpInner, Resp, MAX_RESPONSES, READ_CHUNK};
use crate::wire::{AethRepr, BthRepr, Opcode, PacketRepr, Syndrome};

impl QpInner {
    /// A responder packet (ACK, atomic ACK, READ response) to the peer QP:
    /// everything but opcode, PSN and the AETH is fixed on this path.
    pub(super) fn response(
        dest_qp: u32,
        msn: u32,
        opcode: Opcode,
        psn: u32,
        syndrome: Option<Syndrome>,
    ) -> PacketRepr {
        PacketRepr {
            bth: BthRepr {
                opcode,
                se: false,
                mig_req: false,
                pad_count: 0,
                pkey: 0xffff,
                resv8a: 0,
                dest_qp,
                ack_req: false,
                resv7: 0,
                psn,
            },
            reth: None,
            aeth: syndrome.map(|syndrome| AethRepr { syndrome, msn }),
            imm: None,
            atomic: None,
            atomic_ack: None,
        }
    }

    /// Sends a payload-less responder packet now (see [`Self::respond`]
    /// for the order).
    pub(super) fn send_response(&mut self, ctx: &mut Ctx<'_>, repr: &PacketRepr) {
        if let Some(path) = self.path.as_ref() {
            ctx.tx.packet(
                &ctx.qp.dev,
                path_parts(path, ctx.qp),
                &mut self.fault,
                repr,
                0,
                |_| true,
            );
        }
    }

    /// Owes `r` after every response owed so far (a new request's answer).
    /// Sent at once when nothing is owed; consecutive ACKs merge into the
    /// last (cumulative), and a NAK identical to the last one owed (an RNR
    /// or sequence NAK for a retransmission) is not owed twice.
    pub(super) fn respond(&mut self, ctx: &mut Ctx<'_>, r: Resp) {
        match (&r, self.responses.back_mut()) {
            (Resp::Ack { psn, msn }, Some(Resp::Ack { psn: p, msn: m })) => {
                (*p, *m) = (*psn, *msn);
                return;
            }
            (Resp::Nak { psn, syn, .. }, Some(Resp::Nak { psn: p, syn: y, .. }))
                if p == psn && y == syn =>
            {
                return
            }
            _ => {}
        }
        if self.responses.len() >= MAX_RESPONSES {
            // Cannot happen within the bounds above; never grow without limit.
            tracing::warn!(qpn = ctx.qp.qpn, "responder queue full, QP to ERR");
            return self.enter_err(ctx);
        }
        self.responses.push_back(r);
        self.pump_responses(ctx);
    }

    /// Owes `r` before everything owed so far: the answer to a duplicate,
    /// whose PSN precedes every queued response.
    pub(super) fn respond_first(&mut self, ctx: &mut Ctx<'_>, r: Resp) {
        if self.responses.len() >= MAX_RESPONSES {
            tracing::warn!(qpn = ctx.qp.qpn, "responder queue full, QP to ERR");
            return self.enter_err(ctx);
        }
        self.responses.push_front(r);
        self.pump_responses(ctx);
    }

    pub(super) fn send_nak(&mut self, ctx: &mut Ctx<'_>, psn: u32, syn: Syndrome) {
        let msn = self.msn;
        self.respond(
            ctx,
            Resp::Nak {
                psn,
                syn,
                msn,
                fatal: false,
            },
        );
    }

    pub(super) fn flush_ack(&mut self, ctx: &mut Ctx<'_>) {
        if self.ack_pending {
            self.ack_pending = false;
            let (psn, msn) = (psn_add(self.epsn, PSN_MASK), self.msn);
            self.respond(ctx, Resp::Ack { psn, msn });
        }
    }

    /// A fatal responder error: NAK and move to ERR (RK-C1, SEG-7/8).
    pub(super) fn responder_error(&mut self, ctx: &mut Ctx<'_>, syn: Syndrome) {
        self.responder_error_at(ctx, self.epsn, syn);
    }

    /// A fatal responder error reported at `psn` (the READ response or
    /// duplicate that failed rather than the expected PSN). The NAK leaves
    /// after the responses owed for earlier PSNs; from now on no request is
    /// executed, and the QP enters ERR once the NAK is sent.
    pub(super) fn responder_error_at(&mut self, ctx: &mut Ctx<'_>, psn: u32, syn: Syndrome) {
        tracing::debug!(qpn = ctx.qp.qpn, psn, ?syn, "responder error");
        self.resp_fatal = true;
        let msn = self.msn;
        let nak = Resp::Nak {
            psn,
            syn,
            msn,
            fatal: true,
        };
        if psn_diff(psn, self.epsn) < 0 && !self.responses.is_empty() {
            // A duplicate's error: before the responses of later PSNs.
            self.respond_first(ctx, nak);
        } else {
            self.respond(ctx, nak);
        }
    }

    /// Sends owed responses from the front: READ responses up to
    /// READ_CHUNK packets (C.7, SEG-5), everything else as it comes up.
    pub(super) fn pump_responses(&mut self, ctx: &mut Ctx<'_>) {
        let mut budget = READ_CHUNK;
        while budget > 0 {
            let Some(front) = self.responses.front_mut() else {
                return;
            };
            match front {
                Resp::Read(r) => {
                    let k = r.next;
                    let n = r.npkts;
                    let op = match (k == 0, k + 1 == n) {
                        (true, true) => Opcode::ReadResponseOnly,
                        (true, false) => Opcode::ReadResponseFirst,
                        (false, true) => Opcode::ReadResponseLast,
                        (false, false) => Opcode::ReadResponseMiddle,
                    };
                    let off = k as usize * self.mtu;
                    let len = r.len.saturating_sub(off).min(self.mtu);
                    let psn = psn_add(r.first_psn, k);
                    let repr = Self::response(
                        self.dest_qpn,
                        r.msn,
                        op,
                        psn,
                        op.has_aeth().then_some(Syndrome::ACK),
                    );
                    let (mr, boff) = (r.mr.clone(), r.boff + off);
                    r.next += 1;
                    if r.next >= n {
                        self.responses.pop_front();
                    }
                    budget -= 1;
                    let Some(path) = self.path.as_ref() else {
                        continue;
                    };
                    let sent = ctx.tx.packet(
                        &ctx.qp.dev,
                        path_parts(path, ctx.qp),
                        &mut self.fault,
                        &repr,
                        len,
                        |buf| match &mr {
                            Some(mr) => match mr.enter() {
                                Some(m) => {
                                    m.read(boff, buf);
                                    true
                                }
                                None => false,
                            },
                            None => true,
                        },
                    );
                    if !sent {
                        // Deregistered while its responses stream: not
                        // one more byte of it leaves (item 6); this NAK is
                        // the next response in PSN order.
                        tracing::debug!(qpn = ctx.qp.qpn, psn, "READ region deregistered");
                        let msn = self.msn;
                        self.responses.push_front(Resp::Nak {
                            psn,
                            syn: Syndrome::NakRemoteAccessError,
                            msn,
                            fatal: true,
                        });
                        self.resp_fatal = true;
                    }
                }
                Resp::Ack { psn, msn } => {
                    let repr = Self::response(
                        self.dest_qpn,
                        *msn,
                        Opcode::Acknowledge,
                        *psn,
                        Some(Syndrome::ACK),
                    );
                    self.responses.pop_front();
                    self.send_response(ctx, &repr);
                }
                Resp::AtomicAck { psn, orig, msn } => {
                    let repr = PacketRepr {
                        atomic_ack: Some(*orig),
                        ..Self::response(
                            self.dest_qpn,
                            *msn,
                            Opcode::AtomicAcknowledge,
                            *psn,
                            Some(Syndrome::ACK),
                        )
                    };
                    self.responses.pop_front();
                    self.send_response(ctx, &repr);
                }
                Resp::Nak {
                    psn,
                    syn,
                    msn,
                    fatal,
                } => {
                    let fatal = *fatal;
                    let repr =
                        Self::response(self.dest_qpn, *msn, Opcode::Acknowledge, *psn, Some(*syn));
                    self.responses.pop_front();
                    self.send_response(ctx, &repr);
                    if fatal {
                        return self.enter_err(ctx);
                    }
                }
            }
        }
    }
}
