//! The data connection and the measured loops of both roles (write, read, send with
//! credits).

use super::*;

/// The data side: QP, buffers and, for send, the credit words.
pub(super) struct Data {
    pub(super) qp: Qp,
    pub(super) scq: Cq,
    pub(super) rcq: Cq,
    pub(super) buf: Arc<RdmaBuffer>,
    pub(super) mr: Mr,
    pub(super) credit: Option<(Arc<RdmaBuffer>, Mr)>,
}

// Credit memory: [0, 4) perftest's ctrl word (unused by us), [4, 8) the credit word the
// peer writes (the address we advertise), then our source words for credit WRITEs.
const CREDIT_WORD: usize = 4;
const CREDIT_SRC: usize = 8;

impl Data {
    pub(super) fn new(
        pd: &Pd,
        dev: &Device,
        buf_len: usize,
        remote: AccessFlags,
        credit: bool,
        recv_wr: u32,
    ) -> Result<Data, RdmaError> {
        let depth = MAX_TX_DEPTH + CREDIT_SLOTS as u32;
        let scq = dev.create_cq(depth * 2)?;
        let rcq = dev.create_cq(recv_wr.max(1) * 2)?;
        let buf = RdmaBuffer::new(buf_len.max(64))?;
        // The peer gets only what its verb needs: WRITE into a write server's buffer, READ
        // from a read server's; a client's buffers are local.
        let mr = pd.reg_mr(&buf, AccessFlags::LOCAL_WRITE | remote)?;
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | remote;
        let credit = if credit {
            let b = RdmaBuffer::new(CREDIT_SRC + 4 * CREDIT_SLOTS)?;
            let m = pd.reg_mr(&b, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
            Some((b, m))
        } else {
            None
        };
        let qp = pd.create_qp(&QpInitAttr {
            send_cq: scq.clone(),
            recv_cq: rcq.clone(),
            cap: QpCap {
                max_send_wr: depth,
                max_recv_wr: recv_wr.max(1),
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: true,
        })?;
        qp.modify_to_init(&InitAttr {
            access,
            ..InitAttr::default()
        })?;
        Ok(Data {
            qp,
            scq,
            rcq,
            buf,
            mr,
            credit,
        })
    }

    /// Our key block: the data buffer, or (send) the credit word.
    pub(super) fn dest(&self, out_reads: u32, gid: [u8; 16]) -> PingpongDest {
        let (rkey, vaddr) = match &self.credit {
            Some((_, m)) => (m.rkey(), m.addr() + CREDIT_WORD as u64),
            None => (self.mr.rkey(), self.mr.addr()),
        };
        PingpongDest {
            lid: 0,
            out_reads,
            qpn: self.qp.qpn(),
            psn: crate::rdma::endpoint::random_psn(),
            rkey,
            vaddr,
            gid,
            srqn: 0,
            gid_index: 0,
        }
    }

    pub(super) fn credit_word(&self) -> u32 {
        let mut w = [0u8; 4];
        if let Some((b, _)) = &self.credit {
            b.read(CREDIT_WORD, &mut w);
        }
        // perftest writes the count in host order: little-endian on the x86 hosts it runs on.
        u32::from_le_bytes(w)
    }
}

/// Waits for one send completion and checks that it is the next one expected.
pub(super) fn reap_send(
    d: &Data,
    expect: WcOpcode,
    timeout: Duration,
    what: &str,
) -> Result<WorkCompletion, RdmaError> {
    let wc = wait(&d.scq, &d.qp, progress(timeout), what)?;
    if wc.opcode != expect {
        return Err(RdmaError::Protocol(format!(
            "{what}: completed as {:?}, expected {expect:?}",
            wc.opcode
        )));
    }
    Ok(wc)
}

/// Sizes of a run, checked against the memory cap.
pub(super) fn slots(a: &Args, want: u32) -> Result<usize, RdmaError> {
    let n = (want.max(1) as usize).min((MAX_BUFFERS / a.size).max(1));
    if a.size > MAX_BUFFERS {
        return Err(RdmaError::Usage(format!(
            "-s {} is larger than the {} MiB this tool allocates",
            a.size,
            MAX_BUFFERS >> 20
        )));
    }
    Ok(n)
}

pub(super) fn client(
    a: &Args,
    addr: SocketAddr,
    comm_p: &ConnParams,
    data_p: &ConnParams,
    timeout: Duration,
) -> Result<(), RdmaError> {
    let local = a.local.unwrap_or_else(|| unspecified_like(&addr));
    let dev = smc_iwarp::open_device(local, &smc_iwarp::Config::from_env())?;
    let pd = dev.alloc_pd()?;
    let comm = Comm::new(&pd, &dev, true, timeout)?;
    let cc = connect_retry(&comm.qp, addr, comm_p, timeout, "communication connection")?;
    eprintln!(
        "perftest client: communication connection to {addr}: {}",
        describe(&cc)
    );
    let sys = exchange_sys(&comm, &dev)?;
    comm.dest(
        &PingpongDest::default(),
        "block A (before the data connection)",
    )?;

    let tx_depth = a.iters.min(MAX_TX_DEPTH);
    let depth = slots(a, tx_depth)?;
    let rslots = if a.size > sys.cycle / 2 {
        1
    } else {
        sys.cycle / addr_step(a.size, sys.cache_line)
    };
    // Send/write: one source slot per WR in flight. Read: one sink slot per WR in flight.
    let data = Data::new(
        &pd,
        &dev,
        depth * a.size,
        AccessFlags::empty(),
        a.verb == Verb::Send,
        1,
    )?;
    let dc = connect_retry(&data.qp, addr, data_p, timeout, "data connection")?;
    eprintln!(
        "perftest client: data connection to {addr}: {}",
        describe(&dc)
    );
    comm.dest(
        &PingpongDest::default(),
        "block B (after the data connection)",
    )?;
    let out_reads = if a.verb == Verb::Read {
        dc.ord.max(1) as u32
    } else {
        1
    };
    let me = data.dest(out_reads, dev.gid().0);
    let peer = comm.dest(&me, "block C (keys)")?;
    for what in ["block D", "block E"] {
        let p = comm.dest(&me, what)?;
        if !p.same_keys(&peer) {
            return Err(RdmaError::Protocol(format!(
                "{what}: the server's keys changed"
            )));
        }
    }
    if a.verb == Verb::Send {
        comm.dest(&me, "block F (server's receives posted)")?;
    }
    println!(
        "  local:  QPN {:#06x} RKey {:#010x} VAddr {:#018x}\n  remote: QPN {:#06x} RKey {:#010x} VAddr {:#018x} out_reads {} (perftest {})",
        me.qpn, me.rkey, me.vaddr, peer.qpn, peer.rkey, peer.vaddr, peer.out_reads, sys.peer_version
    );

    let mut dump = Vec::new();
    let t0 = Instant::now();
    let mut msg = vec![0u8; a.size];
    let mut inflight = 0u32;
    let mut done = 0u64;
    // Read client: what each remote slot held the first time it was read.
    let mut seen: Vec<Option<Vec<u8>>> = vec![None; rslots];
    let depth_rx = rx_depth(a.iters);
    let mut complete_one = |data: &Data, done: &mut u64| -> Result<(), RdmaError> {
        let expect = match a.verb {
            Verb::Send => WcOpcode::Send,
            Verb::Write => WcOpcode::RdmaWrite,
            Verb::Read => WcOpcode::RdmaRead,
        };
        reap_send(data, expect, timeout, "a data completion")?;
        if a.verb == Verb::Read {
            let k = *done;
            let slot = (k % depth as u64) as usize;
            let mut got = vec![0u8; a.size];
            data.buf.read(slot * a.size, &mut got);
            let r = (k % rslots as u64) as usize;
            match &seen[r] {
                None => seen[r] = Some(got),
                Some(first) if *first != got => {
                    let at = first
                        .iter()
                        .zip(&got)
                        .position(|(x, y)| x != y)
                        .unwrap_or(0);
                    return Err(RdmaError::DataMismatch(format!(
                        "READ {k} of remote offset {} differs from its first READ at byte {at}",
                        remote_offset(k, a.size, sys.cycle, sys.cache_line)
                    )));
                }
                Some(_) => {}
            }
        }
        *done += 1;
        Ok(())
    };
    for k in 0..a.iters as u64 {
        // Room in the send queue, and (send) a credit window below the server's depth.
        let deadline = progress(timeout);
        loop {
            let credit_ok =
                a.verb != Verb::Send || (k as u32 + 1).wrapping_sub(data.credit_word()) < depth_rx;
            if inflight < tx_depth && inflight < depth as u32 && credit_ok {
                break;
            }
            if inflight > 0 {
                complete_one(&data, &mut done)?;
                inflight -= 1;
            } else if Instant::now() >= deadline {
                return Err(RdmaError::Timeout(format!(
                    "a credit from the server for message {k} (credit word {})",
                    data.credit_word()
                )));
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let slot = (k % depth as u64) as usize;
        let off = slot * a.size;
        let roff = remote_offset(k, a.size, sys.cycle, sys.cache_line) as u64;
        let op = match a.verb {
            Verb::Send => SendOp::Send,
            Verb::Write => SendOp::RdmaWrite {
                remote_addr: peer.vaddr + roff,
                rkey: peer.rkey,
            },
            Verb::Read => SendOp::RdmaRead {
                remote_addr: peer.vaddr + roff,
                rkey: peer.rkey,
            },
        };
        if a.verb != Verb::Read {
            pattern::fill(SEED + k, 0, &mut msg);
            data.buf.write(off, &msg);
            if a.dump.is_some() {
                dump.extend_from_slice(&msg);
            }
        }
        data.qp.post_send(&SendWr {
            wr_id: k,
            op,
            sg_list: &[data.mr.sge(off, a.size as u32)],
            flags: SendFlags::SIGNALED,
        })?;
        inflight += 1;
    }
    while inflight > 0 {
        complete_one(&data, &mut done)?;
        inflight -= 1;
    }
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    if a.verb == Verb::Read {
        // The server's buffer as we read it: each remote slot at its offset.
        let step = if rslots > 1 {
            addr_step(a.size, sys.cache_line)
        } else {
            0
        };
        let mut img = vec![0u8; (rslots - 1) * step + a.size];
        for (r, s) in seen.iter().enumerate() {
            if let Some(s) = s {
                img[r * step..r * step + a.size].copy_from_slice(s);
            }
        }
        dump = img;
    }
    let bytes = a.size as f64 * a.iters as f64;
    let mbps = bytes / secs / (1u64 << 20) as f64;
    let report = BwReport {
        size: a.size as u64,
        iters: a.iters as u64,
        bw_peak: mbps,
        bw_avg: mbps,
        msg_rate: a.iters as f64 / secs / 1e6,
    };
    if a.verb != Verb::Send {
        comm.dest(&me, "block F (run finished)")?;
        for (i, b) in report.blocks().iter().enumerate() {
            comm.xchg(b, &format!("result {i}"))?;
        }
    }
    comm.dest(&me, "block G (closing)")?;
    if let Some(p) = &a.dump {
        std::fs::write(p, &dump)?;
    }
    let what = match a.verb {
        Verb::Send => "SENDs",
        Verb::Write => "RDMA WRITEs",
        Verb::Read => "RDMA READs (every remote offset read back the same bytes)",
    };
    println!(
        "perftest client: {} {what} of {} bytes, {mbps:.2} MB/s, {:.6} Mpps",
        a.iters, a.size, report.msg_rate
    );
    // perftest's ends disconnect the data connection first and only then destroy the
    // communication one. So do we: closing both at once can reach a siw server while its
    // last SEND (the block above, already here) is still its active work request, which
    // the close then completes with a local QP error and fails the server. We close the
    // data connection and wait (bounded) until the server has closed the other.
    drop(data);
    let deadline = progress(timeout.min(Duration::from_secs(10)));
    while comm.qp.state() != QpState::Err && Instant::now() < deadline {
        comm.rcq.wait(Some(Duration::from_millis(50)))?;
    }
    drop(comm);
    Ok(())
}

pub(super) fn server(
    a: &Args,
    comm_p: &ConnParams,
    data_p: &ConnParams,
    timeout: Duration,
) -> Result<(), RdmaError> {
    let mut l = Listener::bind(SocketAddr::new(a.bind, a.port))?;
    l.set_timeout(timeout);
    eprintln!("perftest server: listening on {}", l.local_addr()?);
    let dev = smc_iwarp::open_device(a.bind, &smc_iwarp::Config::from_env())?;
    let pd = dev.alloc_pd()?;
    let comm = Comm::new(&pd, &dev, false, timeout)?;
    let inc = l
        .accept()
        .map_err(|e| RdmaError::Protocol(format!("communication connection: {e}")))?;
    let cc = inc
        .accept(&comm.qp, comm_p)
        .map_err(|e| RdmaError::Protocol(format!("communication connection: {e}")))?;
    eprintln!(
        "perftest server: communication connection from {}: {}",
        cc.peer,
        describe(&cc)
    );
    let sys = exchange_sys(&comm, &dev)?;
    let region = region_len(a.size, sys.cycle, sys.cache_line);
    let depth_rx = rx_depth(a.iters);
    let (buf_len, recv_wr) = match a.verb {
        // One receive slot per posted receive, so that every message can be kept.
        Verb::Send => {
            if (depth_rx as usize).saturating_mul(a.size) > MAX_BUFFERS {
                return Err(RdmaError::Usage(format!(
                    "a send server keeps {depth_rx} receives of {} bytes: more than {} MiB",
                    a.size,
                    MAX_BUFFERS >> 20
                )));
            }
            (depth_rx as usize * a.size, depth_rx)
        }
        // perftest's buffer is twice the cycle buffer; the second half must stay untouched.
        Verb::Write | Verb::Read => {
            if region > MAX_BUFFERS / 2 {
                return Err(RdmaError::Usage(format!(
                    "a {} server needs twice {region} bytes: more than {} MiB",
                    if a.verb == Verb::Write {
                        "write"
                    } else {
                        "read"
                    },
                    MAX_BUFFERS >> 20
                )));
            }
            (2 * region, 1)
        }
    };
    let remote = match a.verb {
        Verb::Send => AccessFlags::empty(),
        Verb::Write => AccessFlags::REMOTE_WRITE,
        Verb::Read => AccessFlags::REMOTE_READ,
    };
    let data = Data::new(&pd, &dev, buf_len, remote, a.verb == Verb::Send, recv_wr)?;
    if a.verb == Verb::Read {
        let mut img = vec![0u8; buf_len];
        pattern::fill(SEED, 0, &mut img);
        data.buf.write(0, &img);
    }
    let post_recv = |slot: usize| -> Result<(), RdmaError> {
        Ok(data.qp.post_recv(&RecvWr {
            wr_id: slot as u64,
            sg_list: &[data.mr.sge(slot * a.size, a.size as u32)],
        })?)
    };
    if a.verb == Verb::Send {
        for s in 0..depth_rx as usize {
            post_recv(s)?;
        }
    }
    comm.xchg(
        &PingpongDest::default().encode(),
        "block A (before the data connection)",
    )?;
    let inc = l
        .accept_within(timeout)
        .map_err(|e| RdmaError::Protocol(format!("data connection: {e}")))?;
    let dc = inc
        .accept(&data.qp, data_p)
        .map_err(|e| RdmaError::Protocol(format!("data connection: {e}")))?;
    eprintln!(
        "perftest server: data connection from {}: {}",
        dc.peer,
        describe(&dc)
    );
    drop(l);
    comm.dest(
        &PingpongDest::default(),
        "block B (after the data connection)",
    )?;
    let out_reads = if a.verb == Verb::Read {
        dc.ird.max(1) as u32
    } else {
        1
    };
    let me = data.dest(out_reads, dev.gid().0);
    let peer = comm.dest(&me, "block C (keys)")?;
    for what in ["block D", "block E"] {
        let p = comm.dest(&me, what)?;
        if !p.same_keys(&peer) {
            return Err(RdmaError::Protocol(format!(
                "{what}: the client's keys changed"
            )));
        }
    }
    println!(
        "  local:  QPN {:#06x} RKey {:#010x} VAddr {:#018x}\n  remote: QPN {:#06x} RKey {:#010x} VAddr {:#018x} (perftest {})",
        me.qpn, me.rkey, me.vaddr, peer.qpn, peer.rkey, peer.vaddr, sys.peer_version
    );
    let mut dump = Vec::new();
    match a.verb {
        Verb::Send => {
            comm.dest(&me, "block F (our receives posted)")?;
            let (cbuf, cmr) = data
                .credit
                .as_ref()
                .ok_or_else(|| RdmaError::Protocol("no credit memory".into()))?;
            let mut posted = depth_rx as u64;
            let mut credits_inflight = 0usize;
            let mut credit_n = 0usize;
            let mut msg = vec![0u8; a.size];
            for rcnt in 1..=a.iters {
                let wc = wait(
                    &data.rcq,
                    &data.qp,
                    progress(timeout),
                    "a SEND from the client",
                )?;
                if wc.opcode != WcOpcode::Recv || wc.byte_len as usize != a.size {
                    return Err(RdmaError::Protocol(format!(
                        "message {rcnt}: {:?} of {} bytes, expected a SEND of {}",
                        wc.opcode, wc.byte_len, a.size
                    )));
                }
                let slot = wc.wr_id as usize;
                if a.dump.is_some() {
                    data.buf.read(slot * a.size, &mut msg);
                    dump.extend_from_slice(&msg);
                }
                if posted < a.iters as u64 {
                    post_recv(slot)?;
                    posted += 1;
                }
                if credit_due(rcnt, depth_rx) {
                    if credits_inflight == CREDIT_SLOTS {
                        reap_send(&data, WcOpcode::RdmaWrite, timeout, "a credit WRITE")?;
                        credits_inflight -= 1;
                    }
                    let src = CREDIT_SRC + 4 * (credit_n % CREDIT_SLOTS);
                    cbuf.write(src, &rcnt.to_le_bytes());
                    data.qp.post_send(&SendWr {
                        wr_id: rcnt as u64,
                        op: SendOp::RdmaWrite {
                            remote_addr: peer.vaddr,
                            rkey: peer.rkey,
                        },
                        sg_list: &[cmr.sge(src, 4)],
                        flags: SendFlags::SIGNALED,
                    })?;
                    credits_inflight += 1;
                    credit_n += 1;
                }
            }
            while credits_inflight > 0 {
                reap_send(&data, WcOpcode::RdmaWrite, timeout, "a credit WRITE")?;
                credits_inflight -= 1;
            }
            comm.dest(&me, "block G (closing)")?;
            println!(
                "perftest server: received {} SENDs of {} bytes, {credit_n} credits written",
                a.iters, a.size
            );
        }
        Verb::Write | Verb::Read => {
            // The client runs now; its next block says it has finished.
            comm.dest(&me, "block F (client's run finished)")?;
            let mut blocks = [[0u8; 8]; 5];
            for (i, b) in blocks.iter_mut().enumerate() {
                let got = comm.xchg(&[0u8; 8], &format!("result {i}"))?;
                b.copy_from_slice(&got);
            }
            let r = BwReport::from_blocks(&blocks);
            comm.dest(&me, "block G (closing)")?;
            if a.verb == Verb::Write {
                // On iWARP a WRITE completes at the client once it is in the TCP stream,
                // not when it is placed here (RDMAP, RFC 5040), and the client's "finished"
                // comes over the other connection: it can overtake WRITEs our RNIC has
                // still to place. The client's disconnect follows its last WRITE in the
                // data stream, so once our QP has seen it every WRITE is in our buffer.
                let deadline = progress(timeout);
                while data.qp.state() != QpState::Err && Instant::now() < deadline {
                    data.scq.wait(Some(Duration::from_millis(50)))?;
                }
            }
            let mut img = vec![0u8; buf_len];
            data.buf.read(0, &mut img);
            if a.verb == Verb::Write {
                if img[..a.size].iter().all(|&b| b == 0) {
                    return Err(RdmaError::DataMismatch(
                        "the client's WRITEs left our buffer untouched".into(),
                    ));
                }
                if let Some(at) = img[region..].iter().position(|&b| b != 0) {
                    return Err(RdmaError::DataMismatch(format!(
                        "the client wrote past the {region}-byte cycle buffer (byte {})",
                        region + at
                    )));
                }
            } else if let Some(at) = pattern::first_mismatch(SEED, 0, &img) {
                return Err(RdmaError::DataMismatch(format!(
                    "our read-only buffer changed at byte {at}"
                )));
            }
            dump = img[..region].to_vec();
            println!(
                "perftest server: the client's {} run: {} x {} bytes, peak {:.2} MB/s, average {:.2} MB/s, {:.6} Mpps",
                if a.verb == Verb::Write { "RDMA WRITE" } else { "RDMA READ" },
                r.iters, r.size, r.bw_peak, r.bw_avg, r.msg_rate
            );
        }
    }
    if let Some(p) = &a.dump {
        std::fs::write(p, &dump)?;
    }
    // perftest's client disconnects the data connection after the last block; closing
    // first would cut its rdma_disconnect short. Wait (bounded) until it has left, then
    // close the data connection and, after it, the communication one.
    let deadline = progress(timeout);
    while data.qp.state() != QpState::Err && Instant::now() < deadline {
        data.scq.wait(Some(Duration::from_millis(50)))?;
    }
    drop(data);
    drop(comm);
    Ok(())
}
