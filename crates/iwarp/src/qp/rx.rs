//! The receive thread of a connected QP (siw_qp_rx.c): reads FPDUs,
//! checks CRC, DDP and RDMAP headers, places tagged data (STag/TO checked
//! against the region's PD, bounds and access) and untagged data (into the
//! posted receive of the message's MSN), and queues Read Responses.

use std::io::{BufReader, Read};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use smc_verbs::{AccessFlags, QpState, WcOpcode, WcStatus};

use super::{wire_err, CurRecv, Fence, Inner, Outbox, QpShared, ReadResp};
use crate::wire::ddp::{qn, term, DdpRepr, Opcode, Placement, ReadRequest, TerminateRepr};
use crate::wire::mpa::{fpdu_crc, fpdu_len, FPDU_CRC_LEN, FPDU_LEN_FIELD};

impl QpShared {
    pub(super) fn rx_loop(self: Arc<Self>, r: TcpStream) {
        let mut rd = BufReader::with_capacity(256 * 1024, r);
        let mut buf = vec![0u8; 70_000];
        loop {
            let mut lenb = [0u8; 2];
            if let Err(e) = rd.read_exact(&mut lenb) {
                self.rx_closed(&e);
                return;
            }
            let ulen = u16::from_be_bytes(lenb) as usize;
            let total = fpdu_len(ulen);
            buf[..2].copy_from_slice(&lenb);
            if let Err(e) = rd.read_exact(&mut buf[2..total]) {
                self.rx_closed(&e);
                return;
            }
            let (crc, drain) = {
                let g = self.lock();
                (g.conn.as_ref().is_some_and(|c| c.crc), g.rx_drain)
            };
            if drain {
                continue;
            }
            self.dev.stats.rx_fpdus.fetch_add(1, Ordering::Relaxed);
            if crc {
                let body = total - FPDU_CRC_LEN;
                let want = fpdu_crc(&buf[..body]);
                let got =
                    u32::from_le_bytes([buf[body], buf[body + 1], buf[body + 2], buf[body + 3]]);
                if want != got {
                    self.dev.stats.rx_bad_crc.fetch_add(1, Ordering::Relaxed);
                    self.fail(
                        "MPA CRC error",
                        Some((term::LAYER_LLP, term::LLP_MPA, term::MPA_CRC)),
                    );
                    continue;
                }
            }
            let ulpdu = &buf[FPDU_LEN_FIELD..FPDU_LEN_FIELD + ulen];
            match DdpRepr::parse(ulpdu) {
                Ok((hdr, payload)) => {
                    if let Err((why, t)) = self.rx_segment(&hdr, payload) {
                        self.fail(why, Some(t));
                    }
                }
                Err(e) => {
                    let t = wire_err(e);
                    self.fail(&format!("bad DDP/RDMAP header: {e}"), Some(t));
                }
            }
        }
    }

    fn rx_closed(&self, e: &std::io::Error) {
        let clean = e.kind() == std::io::ErrorKind::UnexpectedEof;
        let mut g = self.lock();
        if g.state == QpState::Rts {
            let mut out = Outbox::default();
            let why = if clean {
                "TCP connection closed by the peer".to_string()
            } else {
                format!("TCP connection lost: {e}")
            };
            self.fail_locked(&mut g, &why, None, None, &mut out);
            drop(g);
            self.deliver(out);
        } else {
            drop(g);
            self.shutdown(Shutdown::Both);
        }
    }

    /// Processes one DDP segment. `Err((why, terminate))` makes the caller send that
    /// Terminate and move the QP to ERR.
    fn rx_segment(
        &self,
        hdr: &DdpRepr,
        payload: &[u8],
    ) -> std::result::Result<(), (&'static str, (u8, u8, u8))> {
        let mut out = Outbox::default();
        let r = {
            let mut g = self.lock();
            if g.state != QpState::Rts {
                return Ok(());
            }
            let r = self.rx_segment_locked(&mut g, hdr, payload, &mut out);
            if r.is_ok() && g.fence == Fence::FirstFpdu {
                g.fence = Fence::None;
            }
            if r.is_ok() {
                self.cv.notify_all();
            }
            r
        };
        self.deliver(out);
        r
    }

    fn rx_segment_locked(
        &self,
        g: &mut Inner,
        hdr: &DdpRepr,
        payload: &[u8],
        out: &mut Outbox,
    ) -> std::result::Result<(), (&'static str, (u8, u8, u8))> {
        const PROT: u8 = term::RDMAP_REMOTE_PROT;
        match (hdr.opcode, hdr.placement) {
            (Opcode::Write, Placement::Tagged { stag, to }) => {
                if payload.is_empty() {
                    // Zero-length Write: no STag check (AMB-M4); the RTR when awaited.
                    if hdr.last && g.fence != Fence::None {
                        g.fence = Fence::None;
                    }
                    return Ok(());
                }
                if g.fence == Fence::Rtr {
                    return Err((
                        "data before the RTR",
                        (
                            term::LAYER_RDMAP,
                            term::RDMAP_REMOTE_OP,
                            term::OP_UNEXPECTED_OPCODE,
                        ),
                    ));
                }
                let mr = self.dev.mrs.lookup(stag).ok_or((
                    "RDMA Write: invalid STag",
                    (term::LAYER_RDMAP, PROT, term::PROT_INVALID_STAG),
                ))?;
                if mr.pd != self.pd {
                    return Err((
                        "RDMA Write: STag of another PD",
                        (term::LAYER_RDMAP, PROT, term::PROT_STAG_STREAM),
                    ));
                }
                if !mr.access.contains(AccessFlags::REMOTE_WRITE)
                    || !g.access.contains(AccessFlags::REMOTE_WRITE)
                {
                    return Err((
                        "RDMA Write: no remote write access",
                        (term::LAYER_RDMAP, PROT, term::PROT_ACCESS),
                    ));
                }
                let off = mr.offset_of(to, payload.len() as u64).ok_or((
                    "RDMA Write: base or bounds violation",
                    (term::LAYER_RDMAP, PROT, term::PROT_BOUNDS),
                ))?;
                mr.place(off, payload);
                Ok(())
            }
            (Opcode::ReadResponse, Placement::Tagged { stag, to }) => {
                let Some(rd) = g.reads.front_mut() else {
                    return Err((
                        "Read Response without a Read Request",
                        (
                            term::LAYER_RDMAP,
                            term::RDMAP_REMOTE_OP,
                            term::OP_UNEXPECTED_OPCODE,
                        ),
                    ));
                };
                if !payload.is_empty() {
                    if stag != rd.sink_stag {
                        return Err((
                            "Read Response: wrong STag",
                            (term::LAYER_DDP, term::DDP_TAGGED, term::TAGGED_INVALID_STAG),
                        ));
                    }
                    let exp = rd.sink_to.wrapping_add(rd.received);
                    if to != exp || rd.received + payload.len() as u64 > rd.size {
                        return Err((
                            "Read Response: bad offset or length",
                            (term::LAYER_DDP, term::DDP_TAGGED, term::TAGGED_BOUNDS),
                        ));
                    }
                    let mr = self
                        .dev
                        .mrs
                        .lookup(stag)
                        .filter(|m| m.pd == self.pd)
                        .ok_or((
                            "Read Response: sink region gone",
                            (term::LAYER_DDP, term::DDP_TAGGED, term::TAGGED_INVALID_STAG),
                        ))?;
                    let off = mr.offset_of(to, payload.len() as u64).ok_or((
                        "Read Response: outside the sink region",
                        (term::LAYER_DDP, term::DDP_TAGGED, term::TAGGED_BOUNDS),
                    ))?;
                    mr.place(off, payload);
                    rd.received += payload.len() as u64;
                }
                if hdr.last {
                    if rd.received != rd.size {
                        return Err((
                            "Read Response shorter than requested",
                            (term::LAYER_DDP, term::DDP_TAGGED, term::TAGGED_BOUNDS),
                        ));
                    }
                    let rd = g.reads.pop_front().expect("front exists");
                    if let Some(f) = g.inflight.iter_mut().find(|f| f.seq == rd.seq) {
                        f.byte_len = rd.size as u32;
                    }
                    self.finish(g, rd.seq, WcStatus::Success, out);
                }
                Ok(())
            }
            (
                op,
                Placement::Untagged {
                    inv_stag,
                    qn: q,
                    msn,
                    mo,
                },
            ) if op.is_send() => {
                if q != qn::SEND {
                    return Err((
                        "Send on a queue other than 0",
                        (
                            term::LAYER_DDP,
                            term::DDP_UNTAGGED,
                            term::UNTAGGED_INVALID_QN,
                        ),
                    ));
                }
                if msn != g.rx_send_msn {
                    return Err((
                        "Send: unexpected MSN",
                        (
                            term::LAYER_DDP,
                            term::DDP_UNTAGGED,
                            term::UNTAGGED_MSN_RANGE,
                        ),
                    ));
                }
                if matches!(op, Opcode::SendInvalidate | Opcode::SendSeInvalidate) {
                    // RFC 5040 §6.10: our STags are memory regions, which cannot be
                    // invalidated remotely.
                    let _ = inv_stag;
                    return Err((
                        "Send with Invalidate: STag cannot be invalidated",
                        (
                            term::LAYER_RDMAP,
                            term::RDMAP_REMOTE_OP,
                            term::PROT_CANNOT_INVALIDATE,
                        ),
                    ));
                }
                if g.fence == Fence::Rtr && msn == 1 && mo == 0 && payload.is_empty() && hdr.last {
                    // The zero-length Send RTR is consumed by the provider (AMB-M5).
                    g.fence = Fence::None;
                    g.rx_send_msn = 2;
                    return Ok(());
                }
                if g.fence == Fence::Rtr {
                    return Err((
                        "data before the RTR",
                        (
                            term::LAYER_RDMAP,
                            term::RDMAP_REMOTE_OP,
                            term::OP_UNEXPECTED_OPCODE,
                        ),
                    ));
                }
                if g.cur_recv.is_none() {
                    if mo != 0 {
                        return Err((
                            "Send: first segment with MO != 0",
                            (
                                term::LAYER_DDP,
                                term::DDP_UNTAGGED,
                                term::UNTAGGED_INVALID_MO,
                            ),
                        ));
                    }
                    let Some(wqe) = g.rq.pop_front() else {
                        return Err((
                            "Send: no receive posted",
                            (
                                term::LAYER_DDP,
                                term::DDP_UNTAGGED,
                                term::UNTAGGED_NO_BUFFER,
                            ),
                        ));
                    };
                    g.cur_recv = Some(CurRecv { wqe, got: 0 });
                }
                let cur = g.cur_recv.as_mut().expect("set above");
                if mo as u64 != cur.got {
                    return Err((
                        "Send: invalid MO",
                        (
                            term::LAYER_DDP,
                            term::DDP_UNTAGGED,
                            term::UNTAGGED_INVALID_MO,
                        ),
                    ));
                }
                if !payload.is_empty() {
                    let cap: u64 = cur.wqe.sges.iter().map(|s| s.length as u64).sum();
                    if cur.got + payload.len() as u64 > cap {
                        return Err((
                            "Send: longer than the receive buffer",
                            (term::LAYER_DDP, term::DDP_UNTAGGED, term::UNTAGGED_TOO_LONG),
                        ));
                    }
                    // Scatter into the receive's SGEs from offset `got`.
                    let mut done = 0usize;
                    let mut pos = 0u64;
                    for s in &cur.wqe.sges {
                        let (a, b) = (pos, pos + s.length as u64);
                        pos = b;
                        let at = cur.got + done as u64;
                        if at >= b || done == payload.len() {
                            continue;
                        }
                        let from = at - a;
                        let n = ((s.length as u64 - from) as usize).min(payload.len() - done);
                        let mr = self.dev.mrs.lookup(s.lkey).filter(|m| {
                            m.pd == self.pd && m.access.contains(AccessFlags::LOCAL_WRITE)
                        });
                        let off = mr
                            .as_ref()
                            .and_then(|m| m.offset_of(s.addr + from, n as u64));
                        match (mr, off) {
                            (Some(m), Some(o)) => m.place(o, &payload[done..done + n]),
                            _ => {
                                // The receive's own SGE is bad: a local protection error
                                // on our side (IBA), reported in its completion.
                                let c = g.cur_recv.take().expect("set above");
                                out.push(
                                    g,
                                    false,
                                    self.wc(c.wqe.wr_id, WcStatus::LocProtErr, WcOpcode::Recv, 0),
                                );
                                return Err((
                                    "receive buffer not accessible",
                                    (term::LAYER_DDP, term::DDP_CATASTROPHIC, 0),
                                ));
                            }
                        }
                        done += n;
                    }
                    cur.got += payload.len() as u64;
                }
                if hdr.last {
                    let c = g.cur_recv.take().expect("set above");
                    g.rx_send_msn = g.rx_send_msn.wrapping_add(1);
                    let mut wc =
                        self.wc(c.wqe.wr_id, WcStatus::Success, WcOpcode::Recv, c.got as u32);
                    wc.solicited = matches!(op, Opcode::SendSe | Opcode::SendSeInvalidate);
                    out.push(g, false, wc);
                }
                Ok(())
            }
            (Opcode::ReadRequest, Placement::Untagged { qn: q, msn, .. }) => {
                if q != qn::READ_REQ {
                    return Err((
                        "Read Request on a queue other than 1",
                        (
                            term::LAYER_DDP,
                            term::DDP_UNTAGGED,
                            term::UNTAGGED_INVALID_QN,
                        ),
                    ));
                }
                if msn != g.rx_rreq_msn {
                    return Err((
                        "Read Request: unexpected MSN",
                        (
                            term::LAYER_DDP,
                            term::DDP_UNTAGGED,
                            term::UNTAGGED_MSN_RANGE,
                        ),
                    ));
                }
                let rr = ReadRequest::parse(payload).map_err(|_| {
                    (
                        "Read Request: truncated",
                        (
                            term::LAYER_RDMAP,
                            term::RDMAP_REMOTE_OP,
                            term::OP_CATASTROPHIC_STREAM,
                        ),
                    )
                })?;
                g.rx_rreq_msn = g.rx_rreq_msn.wrapping_add(1);
                let ird = g.conn.as_ref().map_or(0, |c| c.ird) as u32;
                if rr.size == 0 {
                    if g.fence != Fence::None {
                        // The zero-length Read RTR: answered with a zero-length response.
                        g.fence = Fence::None;
                    }
                    g.resp_q.push_back(ReadResp {
                        src: None,
                        len: 0,
                        sink_stag: rr.sink_stag,
                        sink_to: rr.sink_to,
                    });
                    g.inbound_reads += 1;
                    return Ok(());
                }
                if g.fence == Fence::Rtr {
                    return Err((
                        "data before the RTR",
                        (
                            term::LAYER_RDMAP,
                            term::RDMAP_REMOTE_OP,
                            term::OP_UNEXPECTED_OPCODE,
                        ),
                    ));
                }
                if g.inbound_reads >= ird.max(1) && ird != crate::wire::mpa::IRD_ORD_NO_LIMIT as u32
                {
                    // More Reads than our IRD: the peer overran the negotiated queue.
                    return Err((
                        "Read Request beyond IRD",
                        (
                            term::LAYER_DDP,
                            term::DDP_UNTAGGED,
                            term::UNTAGGED_MSN_RANGE,
                        ),
                    ));
                }
                let mr = self.dev.mrs.lookup(rr.src_stag).ok_or((
                    "Read Request: invalid source STag",
                    (term::LAYER_RDMAP, PROT, term::PROT_INVALID_STAG),
                ))?;
                if mr.pd != self.pd {
                    return Err((
                        "Read Request: STag of another PD",
                        (term::LAYER_RDMAP, PROT, term::PROT_STAG_STREAM),
                    ));
                }
                if !mr.access.contains(AccessFlags::REMOTE_READ)
                    || !g.access.contains(AccessFlags::REMOTE_READ)
                {
                    return Err((
                        "Read Request: no remote read access",
                        (term::LAYER_RDMAP, PROT, term::PROT_ACCESS),
                    ));
                }
                let off = mr.offset_of(rr.src_to, rr.size as u64).ok_or((
                    "Read Request: base or bounds violation",
                    (term::LAYER_RDMAP, PROT, term::PROT_BOUNDS),
                ))?;
                g.resp_q.push_back(ReadResp {
                    src: Some((mr, off)),
                    len: rr.size as u64,
                    sink_stag: rr.sink_stag,
                    sink_to: rr.sink_to,
                });
                g.inbound_reads += 1;
                Ok(())
            }
            (Opcode::Terminate, Placement::Untagged { qn: q, msn, .. }) => {
                self.dev.stats.rx_terminates.fetch_add(1, Ordering::Relaxed);
                let _ = (q, msn, g.rx_term_msn);
                let desc = TerminateRepr::parse(payload)
                    .map(|t| t.describe())
                    .unwrap_or_else(|_| "malformed Terminate".into());
                let t = TerminateRepr::parse(payload).ok();
                let read_status = t.map(|t| match (t.layer, t.etype) {
                    (term::LAYER_RDMAP, term::RDMAP_REMOTE_PROT) => WcStatus::RemAccessErr,
                    (term::LAYER_DDP, term::DDP_TAGGED) => WcStatus::RemAccessErr,
                    (term::LAYER_RDMAP, term::RDMAP_REMOTE_OP) => WcStatus::RemOpErr,
                    _ => WcStatus::RemOpErr,
                });
                tracing::debug!(qpn = self.qpn, "Terminate received: {desc}");
                self.fail_locked(
                    g,
                    &format!("peer terminated: {desc}"),
                    None,
                    read_status,
                    out,
                );
                Ok(())
            }
            _ => Err((
                "unexpected RDMAP message",
                (
                    term::LAYER_RDMAP,
                    term::RDMAP_REMOTE_OP,
                    term::OP_UNEXPECTED_OPCODE,
                ),
            )),
        }
    }
}
