//! The verbs of a QP (called by [`crate::verbs`]'s `QpOps`): state changes and posting work
//! requests.

use smc_verbs::{
    InitAttr, QpCap, QpState, RecvWr, Result, RtsAttr, SendFlags, SendOp, SendWr, VerbsError,
    WcOpcode, WcStatus,
};

use super::{Inflight, Outbox, QpShared, RqWqe, SqKind, SqWqe};

impl QpShared {
    pub(crate) fn state(&self) -> QpState {
        self.lock().state
    }
    pub(crate) fn cap(&self) -> QpCap {
        self.cap
    }
    pub(crate) fn modify_to_init(&self, attr: &InitAttr) -> Result<()> {
        let mut g = self.lock();
        if !g.state.can_transition(QpState::Init) {
            return Err(VerbsError::InvalidTransition {
                from: g.state,
                to: QpState::Init,
            });
        }
        g.state = QpState::Init;
        g.access = attr.access;
        Ok(())
    }
    /// RTS in SMC-R link mode: `modify_to_rtr` connected the QP (it is in RTS already).
    pub(crate) fn modify_to_rts(&self, _attr: &RtsAttr) -> Result<()> {
        let st = self.lock().state;
        if self.dev.config.smc_links && st == QpState::Rts {
            return Ok(());
        }
        Err(VerbsError::InvalidArgument(
            "iWARP QPs are connected by the connection manager (smc_iwarp::cm), not RTS attributes",
        ))
    }
    pub(crate) fn modify_to_err(&self) -> Result<()> {
        self.fail("moved to ERR by the application", None);
        Ok(())
    }
    pub(crate) fn modify_to_reset(&self) -> Result<()> {
        let mut g = self.lock();
        if g.conn.is_some() && g.state != QpState::Err {
            return Err(VerbsError::InvalidTransition {
                from: g.state,
                to: QpState::Reset,
            });
        }
        if g.conn.is_some() {
            // A QP that was bound to a connection stays bound to it (iWARP); reset is only
            // meaningful before connecting.
            return Err(VerbsError::InvalidArgument(
                "an iWARP QP that was connected cannot be reused; create a new one",
            ));
        }
        g.state = QpState::Reset;
        g.rq.clear();
        Ok(())
    }
    pub(crate) fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        let s = self;
        let mut g = s.lock();
        if g.state != QpState::Rts && g.state != QpState::Err {
            return Err(VerbsError::InvalidState(g.state));
        }
        // Every posted, not yet completed WR is in `inflight` (queued ones too).
        if g.inflight.len() + wrs.len() > s.cap.max_send_wr as usize {
            return Err(VerbsError::QueueFull);
        }
        for wr in wrs {
            if wr.sg_list.len() > s.cap.max_send_sge as usize {
                return Err(VerbsError::InvalidArgument("too many SGEs"));
            }
            let len: u64 = wr.sg_list.iter().map(|x| x.length as u64).sum();
            if len > u32::MAX as u64 {
                return Err(VerbsError::InvalidArgument("message longer than 4 GiB"));
            }
            match wr.op {
                SendOp::Send | SendOp::RdmaWrite { .. } => {}
                SendOp::RdmaRead { .. } => {
                    if wr.sg_list.len() > 1 || wr.flags.contains(SendFlags::INLINE) {
                        // RFC 5040 §4.4: a Read Request names one data sink STag/TO.
                        return Err(VerbsError::InvalidArgument(
                            "iWARP RDMA Read takes one SGE (one data sink STag)",
                        ));
                    }
                }
                _ => {
                    return Err(VerbsError::InvalidArgument(
                        "iWARP (RFC 5040) has no immediate data or atomics",
                    ))
                }
            }
            if wr.flags.contains(SendFlags::INLINE) && len > s.cap.max_inline_data as u64 {
                return Err(VerbsError::InlineTooLarge {
                    len: len as usize,
                    max: s.cap.max_inline_data as usize,
                });
            }
        }
        for wr in wrs {
            let seq = g.next_seq;
            g.next_seq += 1;
            let len: u64 = wr.sg_list.iter().map(|x| x.length as u64).sum();
            let (kind, opcode) = match wr.op {
                SendOp::Send => (
                    SqKind::Send {
                        se: wr.flags.contains(SendFlags::SOLICITED),
                    },
                    WcOpcode::Send,
                ),
                SendOp::RdmaWrite { remote_addr, rkey } => (
                    SqKind::Write {
                        raddr: remote_addr,
                        rkey,
                    },
                    WcOpcode::RdmaWrite,
                ),
                SendOp::RdmaRead { remote_addr, rkey } => (
                    SqKind::Read {
                        raddr: remote_addr,
                        rkey,
                    },
                    WcOpcode::RdmaRead,
                ),
                _ => unreachable!("checked above"),
            };
            let inline = if wr.flags.contains(SendFlags::INLINE) {
                // INLINE: the data is copied now and lkeys are not checked; it must lie
                // in some registered region of this device (we cannot read arbitrary
                // process memory soundly).
                let mut d = vec![0u8; len as usize];
                let mut at = 0usize;
                for sge in wr.sg_list {
                    let n = sge.length as usize;
                    let mr = s
                        .dev
                        .mrs
                        .lookup(sge.lkey)
                        .and_then(|m| m.offset_of(sge.addr, n as u64).map(|o| (m, o)));
                    match mr {
                        Some((m, o)) => m.fetch(o, &mut d[at..at + n]),
                        None => {
                            return Err(VerbsError::InvalidArgument(
                                "inline data outside a registered region",
                            ))
                        }
                    }
                    at += n;
                }
                Some(d)
            } else {
                None
            };
            g.inflight.push_back(Inflight {
                seq,
                wr_id: wr.wr_id,
                opcode,
                byte_len: if opcode == WcOpcode::RdmaRead {
                    0
                } else {
                    len as u32
                },
                signaled: s.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED),
                internal: false,
                done: None,
            });
            g.sq.push_back(SqWqe {
                seq,
                kind,
                sges: wr.sg_list.to_vec(),
                inline,
                fence: wr.flags.contains(SendFlags::FENCE),
            });
        }
        s.cv.notify_all();
        Ok(())
    }
    pub(crate) fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        let s = self;
        let mut out = Outbox::default();
        {
            let mut g = s.lock();
            if g.state == QpState::Reset {
                return Err(VerbsError::InvalidState(g.state));
            }
            if g.rq.len() + wrs.len() > s.cap.max_recv_wr as usize {
                return Err(VerbsError::QueueFull);
            }
            if wrs
                .iter()
                .any(|w| w.sg_list.len() > s.cap.max_recv_sge as usize)
            {
                return Err(VerbsError::InvalidArgument("too many SGEs"));
            }
            for w in wrs {
                if g.state == QpState::Err {
                    out.push(
                        &mut g,
                        false,
                        s.wc(w.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0),
                    );
                } else {
                    g.rq.push_back(RqWqe {
                        wr_id: w.wr_id,
                        sges: w.sg_list.to_vec(),
                    });
                }
            }
        }
        s.deliver(out);
        Ok(())
    }
}
