//! The transmit thread of a connected QP (siw_qp_tx.c): a pending
//! Terminate first, then RDMA Read Responses owed to the peer, then
//! send-queue work requests, each built into FPDUs and written to the
//! socket without the QP lock held.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use smc_verbs::{AccessFlags, QpState, Sge, WcStatus};

use super::{Fence, OutRead, Outbox, QpShared, ReadResp, SqKind, SqWqe, TermOut};
use crate::mr::MrEntry;
use crate::negotiate::Rtr;
use crate::wire::ddp::{
    qn, term, DdpRepr, Opcode, Placement, ReadRequest, TerminateRepr, READ_REQ_LEN, TAGGED_HDR_LEN,
    UNTAGGED_HDR_LEN,
};
use crate::wire::mpa::{emit_fpdu, fpdu_crc, fpdu_len, pad_len};

impl QpShared {
    pub(super) fn tx_loop(self: Arc<Self>, mut w: TcpStream) {
        let mut fb = FrameBuf::new();
        loop {
            enum Job {
                Term(TermOut, u32),
                Resp(ReadResp),
                Wqe(SqWqe, bool, usize),
                Stop,
            }
            let (job, crc) = {
                let mut g = self.lock();
                loop {
                    if let Some(t) = g.term_out.take() {
                        let msn = g.tx_msn[qn::TERMINATE as usize];
                        g.tx_msn[qn::TERMINATE as usize] = msn.wrapping_add(1);
                        break (Job::Term(t, msn), g.conn.as_ref().is_some_and(|c| c.crc));
                    }
                    if g.closing || g.state == QpState::Err {
                        // Work requests posted while in ERR are flushed here, on a
                        // provider thread.
                        let mut out = Outbox::default();
                        self.flush_queues(&mut g, &mut out);
                        if g.closing || !out.send.is_empty() || !out.recv.is_empty() {
                            drop(g);
                            self.deliver(out);
                            g = self.lock();
                            if g.closing {
                                g.tx_alive = false;
                                break (Job::Stop, false);
                            }
                            continue;
                        }
                        g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
                        continue;
                    }
                    let crc = g.conn.as_ref().is_some_and(|c| c.crc);
                    let mulpdu = g.conn.as_ref().map_or(1024, |c| c.mulpdu);
                    let ord = g.conn.as_ref().map_or(1, |c| c.ord.max(1)) as usize;
                    if g.fence == Fence::None {
                        if let Some(r) = g.resp_q.pop_front() {
                            break (Job::Resp(r), crc);
                        }
                        if let Some(h) = g.sq.front() {
                            let is_read = matches!(h.kind, SqKind::Read { .. })
                                || h.kind == SqKind::Rtr(Rtr::Read);
                            // ORD strictly limits outbound Reads in flight (RFC 6581
                            // §4.1, IO-12); a fenced WR waits for earlier Reads.
                            let blocked = (is_read && g.reads.len() >= ord)
                                || (h.fence && !g.reads.is_empty());
                            if !blocked {
                                let wqe = g.sq.pop_front().expect("front exists");
                                if !matches!(wqe.kind, SqKind::Read { .. } | SqKind::Rtr(Rtr::Read))
                                {
                                    g.tx_current = Some(wqe.seq);
                                }
                                break (Job::Wqe(wqe, crc, mulpdu), crc);
                            }
                        }
                    }
                    g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
                }
            };
            let r = match job {
                Job::Stop => return,
                Job::Term(t, msn) => {
                    let res = self.send_terminate(&mut w, &mut fb, t, msn, crc);
                    self.dev.stats.tx_terminates.fetch_add(1, Ordering::Relaxed);
                    // RFC 5040 §5.3: after a Terminate the stream is closed; keep reading
                    // (and discarding) until the peer closes, so the Terminate is not lost
                    // to a reset.
                    let _ = w.flush();
                    let _ = w.shutdown(Shutdown::Write);
                    if let Err(e) = res {
                        tracing::debug!(qpn = self.qpn, error = %e, "sending Terminate failed");
                    }
                    continue;
                }
                Job::Resp(r) => self.send_read_response(&mut w, &mut fb, &r, crc),
                Job::Wqe(wqe, crc, mulpdu) => {
                    let seq = wqe.seq;
                    let r = self.send_wqe(&mut w, &mut fb, wqe, crc, mulpdu);
                    let mut out = Outbox::default();
                    {
                        let mut g = self.lock();
                        if g.tx_current == Some(seq) {
                            g.tx_current = None;
                            if r.is_err() {
                                self.finish(&mut g, seq, WcStatus::WrFlushErr, &mut out);
                            }
                        }
                    }
                    self.deliver(out);
                    r
                }
            };
            if let Err(e) = r {
                self.fail(&format!("TCP send failed: {e}"), None);
            }
        }
    }

    fn send_terminate(
        &self,
        w: &mut TcpStream,
        fb: &mut FrameBuf,
        t: TermOut,
        msn: u32,
        crc: bool,
    ) -> std::io::Result<()> {
        let tr = TerminateRepr::new(t.layer, t.etype, t.code);
        let mut body = [0u8; 64];
        let n = tr.emit(&mut body).map_err(std::io::Error::other)?;
        let hdr = DdpRepr {
            last: true,
            opcode: Opcode::Terminate,
            placement: Placement::Untagged {
                inv_stag: 0,
                qn: qn::TERMINATE,
                msn,
                mo: 0,
            },
        };
        fb.build(&hdr, n, crc, |p| p.copy_from_slice(&body[..n]));
        self.dev.stats.tx_fpdus.fetch_add(1, Ordering::Relaxed);
        w.write_all(fb.bytes())
    }

    /// Gathers `[off, off+dst.len())` of a WR's data into `dst`.
    fn gather(
        &self,
        wqe: &SqWqe,
        srcs: &[(Arc<MrEntry>, usize, usize)],
        off: usize,
        dst: &mut [u8],
    ) {
        if let Some(d) = &wqe.inline {
            dst.copy_from_slice(&d[off..off + dst.len()]);
            return;
        }
        let mut pos = 0usize; // start of the current SGE in the message
        let mut done = 0usize;
        for (mr, moff, len) in srcs {
            let (s, e) = (pos, pos + len);
            pos = e;
            let want_s = off + done;
            if want_s >= e || done == dst.len() {
                continue;
            }
            let from = want_s - s;
            let n = (len - from).min(dst.len() - done);
            mr.fetch(moff + from, &mut dst[done..done + n]);
            done += n;
        }
    }

    /// Resolves a gather/scatter list against the region table: each SGE must lie in a
    /// region of this QP's PD named by its lkey (with `need` access).
    fn resolve(
        &self,
        sges: &[Sge],
        need: AccessFlags,
    ) -> Option<Vec<(Arc<MrEntry>, usize, usize)>> {
        let mut v = Vec::with_capacity(sges.len());
        for s in sges {
            if s.length == 0 {
                continue;
            }
            let mr = self.dev.mrs.lookup(s.lkey)?;
            if mr.pd != self.pd || !mr.access.contains(need) {
                return None;
            }
            let off = mr.offset_of(s.addr, s.length as u64)?;
            v.push((mr, off, s.length as usize));
        }
        Some(v)
    }

    fn send_wqe(
        &self,
        w: &mut TcpStream,
        fb: &mut FrameBuf,
        wqe: SqWqe,
        crc: bool,
        mulpdu: usize,
    ) -> std::io::Result<()> {
        let total: usize = match &wqe.inline {
            Some(d) => d.len(),
            None => wqe.sges.iter().map(|s| s.length as usize).sum(),
        };
        let srcs = if wqe.inline.is_some() {
            Some(Vec::new())
        } else {
            let need = if matches!(wqe.kind, SqKind::Read { .. }) {
                AccessFlags::LOCAL_WRITE
            } else {
                AccessFlags::empty()
            };
            self.resolve(&wqe.sges, need)
        };
        let Some(srcs) = srcs else {
            // Local protection error: the WR fails and the QP goes to ERR (IBA C10-95
            // semantics, as the RoCE provider does).
            let mut out = Outbox::default();
            {
                let mut g = self.lock();
                self.finish(&mut g, wqe.seq, WcStatus::LocProtErr, &mut out);
                self.fail_locked(&mut g, "local protection error", None, None, &mut out);
            }
            self.deliver(out);
            return Ok(());
        };
        match wqe.kind {
            SqKind::Send { se } => {
                let msn = {
                    let mut g = self.lock();
                    let m = g.tx_msn[0];
                    g.tx_msn[0] = m.wrapping_add(1);
                    m
                };
                let op = if se { Opcode::SendSe } else { Opcode::Send };
                let room = mulpdu - UNTAGGED_HDR_LEN;
                let mut off = 0usize;
                loop {
                    let n = (total - off).min(room);
                    let last = off + n == total;
                    let hdr = DdpRepr {
                        last,
                        opcode: op,
                        placement: Placement::Untagged {
                            inv_stag: 0,
                            qn: qn::SEND,
                            msn,
                            mo: off as u32,
                        },
                    };
                    fb.build(&hdr, n, crc, |p| self.gather(&wqe, &srcs, off, p));
                    w.write_all(fb.bytes())?;
                    self.dev.stats.tx_fpdus.fetch_add(1, Ordering::Relaxed);
                    off += n;
                    if last {
                        break;
                    }
                }
            }
            SqKind::Write { raddr, rkey } => {
                let room = mulpdu - TAGGED_HDR_LEN;
                let mut off = 0usize;
                loop {
                    let n = (total - off).min(room);
                    let last = off + n == total;
                    let hdr = DdpRepr {
                        last,
                        opcode: Opcode::Write,
                        placement: Placement::Tagged {
                            stag: rkey,
                            to: raddr.wrapping_add(off as u64),
                        },
                    };
                    fb.build(&hdr, n, crc, |p| self.gather(&wqe, &srcs, off, p));
                    w.write_all(fb.bytes())?;
                    self.dev.stats.tx_fpdus.fetch_add(1, Ordering::Relaxed);
                    off += n;
                    if last {
                        break;
                    }
                }
            }
            SqKind::Read { raddr, rkey } => {
                let (sink_stag, sink_to) = wqe
                    .sges
                    .first()
                    .filter(|s| s.length > 0)
                    .map_or((0, 0), |s| (s.lkey, s.addr));
                return self.send_read_request(
                    w,
                    fb,
                    wqe.seq,
                    sink_stag,
                    sink_to,
                    total as u64,
                    rkey,
                    raddr,
                    crc,
                );
            }
            SqKind::Rtr(Rtr::Write) => {
                // RFC 6581 §9.2: zero-length RDMA Write, STag 0 / TO 0 (AMB-M4).
                let hdr = DdpRepr {
                    last: true,
                    opcode: Opcode::Write,
                    placement: Placement::Tagged { stag: 0, to: 0 },
                };
                fb.build(&hdr, 0, crc, |_| {});
                w.write_all(fb.bytes())?;
                self.dev.stats.tx_fpdus.fetch_add(1, Ordering::Relaxed);
            }
            SqKind::Rtr(Rtr::Send) => {
                let msn = {
                    let mut g = self.lock();
                    let m = g.tx_msn[0];
                    g.tx_msn[0] = m.wrapping_add(1);
                    m
                };
                let hdr = DdpRepr {
                    last: true,
                    opcode: Opcode::Send,
                    placement: Placement::Untagged {
                        inv_stag: 0,
                        qn: qn::SEND,
                        msn,
                        mo: 0,
                    },
                };
                fb.build(&hdr, 0, crc, |_| {});
                w.write_all(fb.bytes())?;
                self.dev.stats.tx_fpdus.fetch_add(1, Ordering::Relaxed);
            }
            SqKind::Rtr(Rtr::Read) => {
                // Zero-length RDMA Read; its (zero-length) response completes it inside
                // the provider.
                return self.send_read_request(w, fb, wqe.seq, 0, 0, 0, 0, 0, crc);
            }
        }
        let mut out = Outbox::default();
        {
            let mut g = self.lock();
            self.finish(&mut g, wqe.seq, WcStatus::Success, &mut out);
            self.cv.notify_all();
        }
        self.deliver(out);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn send_read_request(
        &self,
        w: &mut TcpStream,
        fb: &mut FrameBuf,
        seq: u64,
        sink_stag: u32,
        sink_to: u64,
        size: u64,
        src_stag: u32,
        src_to: u64,
        crc: bool,
    ) -> std::io::Result<()> {
        let msn = {
            let mut g = self.lock();
            if g.state != QpState::Rts {
                return Ok(());
            }
            let m = g.tx_msn[qn::READ_REQ as usize];
            g.tx_msn[qn::READ_REQ as usize] = m.wrapping_add(1);
            // Registered before the request leaves, so the response finds it.
            g.reads.push_back(OutRead {
                seq,
                sink_stag,
                sink_to,
                size,
                received: 0,
            });
            self.cv.notify_all();
            m
        };
        let rr = ReadRequest {
            sink_stag,
            sink_to,
            size: size as u32,
            src_stag,
            src_to,
        };
        let hdr = DdpRepr {
            last: true,
            opcode: Opcode::ReadRequest,
            placement: Placement::Untagged {
                inv_stag: 0,
                qn: qn::READ_REQ,
                msn,
                mo: 0,
            },
        };
        fb.build(&hdr, READ_REQ_LEN, crc, |p| {
            let _ = rr.emit(p);
        });
        self.dev.stats.tx_fpdus.fetch_add(1, Ordering::Relaxed);
        w.write_all(fb.bytes())
    }

    fn send_read_response(
        &self,
        w: &mut TcpStream,
        fb: &mut FrameBuf,
        r: &ReadResp,
        crc: bool,
    ) -> std::io::Result<()> {
        let mulpdu = self.lock().conn.as_ref().map_or(1024, |c| c.mulpdu);
        let room = mulpdu - TAGGED_HDR_LEN;
        let total = r.len as usize;
        let mut off = 0usize;
        loop {
            let n = (total - off).min(room);
            let last = off + n == total;
            let hdr = DdpRepr {
                last,
                opcode: Opcode::ReadResponse,
                placement: Placement::Tagged {
                    stag: r.sink_stag,
                    to: r.sink_to.wrapping_add(off as u64),
                },
            };
            fb.build(&hdr, n, crc, |p| {
                if let Some((mr, moff)) = &r.src {
                    mr.fetch(moff + off, p);
                }
            });
            w.write_all(fb.bytes())?;
            self.dev.stats.tx_fpdus.fetch_add(1, Ordering::Relaxed);
            off += n;
            if last {
                break;
            }
        }
        let mut g = self.lock();
        g.inbound_reads = g.inbound_reads.saturating_sub(1);
        Ok(())
    }
}

/// One reusable FPDU buffer of the transmit thread.
struct FrameBuf {
    buf: Vec<u8>,
    len: usize,
}

impl FrameBuf {
    fn new() -> FrameBuf {
        FrameBuf {
            buf: vec![0u8; 70_000],
            len: 0,
        }
    }
    /// Builds `len | hdr | payload (filled by fill) | pad | crc`.
    fn build(
        &mut self,
        hdr: &DdpRepr,
        payload_len: usize,
        crc: bool,
        fill: impl FnOnce(&mut [u8]),
    ) {
        let h = hdr.header_len();
        let ulen = h + payload_len;
        let total = fpdu_len(ulen);
        self.buf[..2].copy_from_slice(&(ulen as u16).to_be_bytes());
        let _ = hdr.emit(&mut self.buf[2..2 + h]);
        fill(&mut self.buf[2 + h..2 + ulen]);
        let body = 2 + ulen + pad_len(ulen);
        self.buf[2 + ulen..body].fill(0);
        let c = if crc { fpdu_crc(&self.buf[..body]) } else { 0 };
        self.buf[body..total].copy_from_slice(&c.to_le_bytes());
        self.len = total;
    }
    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Writes a Terminate FPDU (MSN 1 on queue 2) straight onto the socket: used when the
/// negotiation fails right after the Reply, before the QP runs (RFC 6581 §8, §9.1, §9.2).
pub(crate) fn terminate_stream(s: &mut TcpStream, code: u8, crc: bool) -> std::io::Result<()> {
    let mut ulpdu = [0u8; 18 + 4];
    let hdr = DdpRepr {
        last: true,
        opcode: Opcode::Terminate,
        placement: Placement::Untagged {
            inv_stag: 0,
            qn: qn::TERMINATE,
            msn: 1,
            mo: 0,
        },
    };
    hdr.emit(&mut ulpdu).map_err(std::io::Error::other)?;
    TerminateRepr::new(term::LAYER_LLP, term::LLP_MPA, code)
        .emit(&mut ulpdu[18..])
        .map_err(std::io::Error::other)?;
    let mut f = [0u8; 32];
    let n = emit_fpdu(&mut f, &ulpdu, crc).map_err(std::io::Error::other)?;
    s.write_all(&f[..n])?;
    s.flush()?;
    let _ = s.shutdown(std::net::Shutdown::Write);
    // Let the peer read it before the socket goes (a close with unread data would reset).
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut sink = [0u8; 512];
    while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
    Ok(())
}
