//! The iWARP column of `smc rdma bench`: two endpoints of the software iWARP RNIC
//! (`smc-iwarp`) connected over loopback TCP (MPA rev 2, enhanced), measured the same way as
//! the softroce pair: RDMA WRITE throughput with a window of outstanding WRITEs, and SEND
//! ping-pong round trips (plain SEND: iWARP has no immediate data, so the last ping says
//! "stop" in its first byte).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use smc_verbs::{
    AccessFlags, Cq, InitAttr, Mr, Qp, QpCap, QpInitAttr, RdmaBuffer, RecvWr, SendFlags, SendOp,
    SendWr, WcStatus, WorkCompletion,
};

use super::RdmaError;

const MAX_WR: u32 = 128;

/// One side.
pub struct IwEp {
    qp: Qp,
    scq: Cq,
    rcq: Cq,
    buf: Arc<RdmaBuffer>,
    mr: Mr,
}

fn open(local: IpAddr, len: usize) -> Result<IwEp, RdmaError> {
    let dev = smc_iwarp::open_device(local, &smc_iwarp::Config::from_env())?;
    let pd = dev.alloc_pd()?;
    let scq = dev.create_cq(MAX_WR * 2)?;
    let rcq = dev.create_cq(MAX_WR * 2)?;
    let buf = RdmaBuffer::new(len)?;
    let mr = pd.reg_mr(&buf, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let qp = pd.create_qp(&QpInitAttr {
        send_cq: scq.clone(),
        recv_cq: rcq.clone(),
        cap: QpCap {
            max_send_wr: MAX_WR,
            max_recv_wr: MAX_WR,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    })?;
    qp.modify_to_init(&InitAttr {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        ..InitAttr::default()
    })?;
    Ok(IwEp {
        qp,
        scq,
        rcq,
        buf,
        mr,
    })
}

/// Two connected endpoints on `a` (initiator) and `b` (listener), `len` bytes each.
pub fn pair(a: IpAddr, b: IpAddr, len: usize) -> Result<(IwEp, IwEp), RdmaError> {
    let ea = open(a, len)?;
    let eb = open(b, len)?;
    let l = smc_iwarp::cm::Listener::bind(SocketAddr::new(b, 0))?;
    let addr = l.local_addr()?;
    let qb = eb.qp.clone();
    let t = thread::spawn(move || {
        l.accept()
            .and_then(|i| i.accept(&qb, &smc_iwarp::cm::ConnParams::default()))
    });
    smc_iwarp::cm::connect(&ea.qp, addr, &smc_iwarp::cm::ConnParams::default())
        .map_err(|e| RdmaError::Protocol(format!("iWARP connect: {e}")))?;
    t.join()
        .map_err(|_| RdmaError::Protocol("accept thread panicked".into()))?
        .map_err(|e| RdmaError::Protocol(format!("iWARP accept: {e}")))?;
    Ok((ea, eb))
}

fn wait(cq: &Cq, deadline: Instant, what: &str) -> Result<WorkCompletion, RdmaError> {
    let mut one = [WorkCompletion::default()];
    loop {
        if cq.poll(&mut one) == 1 {
            if one[0].status != WcStatus::Success {
                return Err(RdmaError::Completion {
                    what: what.into(),
                    status: one[0].status,
                    wr_id: one[0].wr_id,
                });
            }
            return Ok(one[0]);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(RdmaError::Timeout(what.into()));
        }
        cq.wait(Some((deadline - now).min(Duration::from_millis(200))))?;
    }
}

/// Bytes per second of RDMA WRITEs of `size` from `a` into `b` for `dur`.
pub fn write_bw(
    a: &IwEp,
    b: &IwEp,
    size: usize,
    dur: Duration,
    window: usize,
) -> Result<f64, RdmaError> {
    let depth = (window / size).clamp(2, MAX_WR as usize);
    let slots = (a.buf.len() / size).max(1);
    let start = Instant::now();
    let stop = start + dur;
    let deadline = stop + Duration::from_secs(30);
    let (mut posted, mut done) = (0u64, 0u64);
    loop {
        while Instant::now() < stop && posted - done < depth as u64 {
            let off = (posted as usize % slots) * size;
            let sge = [a.mr.sge(off, size as u32)];
            a.qp.post_send(&SendWr {
                wr_id: posted,
                op: SendOp::RdmaWrite {
                    remote_addr: b.mr.addr() + off as u64,
                    rkey: b.mr.rkey(),
                },
                sg_list: &sge,
                flags: SendFlags::SIGNALED,
            })?;
            posted += 1;
        }
        if done == posted {
            break;
        }
        wait(&a.scq, deadline, "iWARP RDMA WRITE completion")?;
        done += 1;
    }
    Ok((done * size as u64) as f64 / start.elapsed().as_secs_f64())
}

fn post_recv(ep: &IwEp, at: usize, len: usize) -> Result<(), RdmaError> {
    ep.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: &[ep.mr.sge(at, len as u32)],
    })?;
    Ok(())
}

fn send(ep: &IwEp, size: usize) -> Result<(), RdmaError> {
    let sge = [ep.mr.sge(0, size as u32)];
    ep.qp.post_send(&SendWr {
        wr_id: 2,
        op: SendOp::Send,
        sg_list: &sge,
        // every 16th signalled so that the send queue drains
        flags: SendFlags::SIGNALED,
    })?;
    Ok(())
}

fn reap(ep: &IwEp) {
    let mut w = [WorkCompletion::default(); 16];
    while ep.scq.poll(&mut w) > 0 {}
}

/// Mean round trip of `size`-byte SEND ping-pongs; `b` pongs on its own thread.
pub fn pingpong(
    a: &IwEp,
    b: IwEp,
    size: usize,
    recv_len: usize,
    dur: Duration,
) -> Result<(Duration, IwEp), RdmaError> {
    let size = size.max(1);
    for _ in 0..4 {
        post_recv(a, recv_len, recv_len)?;
        post_recv(&b, recv_len, recv_len)?;
    }
    let pong = thread::spawn(move || -> Result<IwEp, RdmaError> {
        loop {
            let deadline = Instant::now() + Duration::from_secs(30);
            wait(&b.rcq, deadline, "ping")?;
            let mut flag = [0u8];
            b.buf.read(recv_len, &mut flag);
            post_recv(&b, recv_len, recv_len)?;
            send(&b, size)?;
            reap(&b);
            if flag[0] == 1 {
                return Ok(b);
            }
        }
    });
    let round = |last: bool| -> Result<(), RdmaError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        a.buf.write(0, &[u8::from(last)]);
        send(a, size)?;
        wait(&a.rcq, deadline, "pong")?;
        post_recv(a, recv_len, recv_len)?;
        reap(a);
        Ok(())
    };
    let measure = || -> Result<Duration, RdmaError> {
        for _ in 0..50 {
            round(false)?;
        }
        let start = Instant::now();
        let mut n = 0u32;
        while start.elapsed() < dur {
            round(false)?;
            n += 1;
        }
        Ok(start.elapsed() / n.max(1))
    };
    let r = measure();
    let stopped = round(true);
    let b = pong
        .join()
        .map_err(|_| RdmaError::Protocol("pong thread panicked".into()))??;
    stopped?;
    Ok((r?, b))
}
