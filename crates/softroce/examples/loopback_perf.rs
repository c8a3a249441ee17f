//! Quick loopback measurement: RDMA WRITE throughput and SEND ping-pong
//! latency between two softroce devices, beside kernel TCP loopback.
//! `cargo run --release -p smc-softroce --example loopback_perf [net]`

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use smc_softroce::{open_device, Config};
use smc_verbs::*;

fn wait(cq: &Cq) -> WorkCompletion {
    let mut wc = [WorkCompletion::default()];
    loop {
        if cq.poll(&mut wc) == 1 {
            assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
            return wc[0];
        }
        cq.wait(Some(Duration::from_secs(10))).unwrap();
    }
}

struct Side {
    pd: Pd,
    scq: Cq,
    rcq: Cq,
    qp: Qp,
}

fn side(dev: &Device) -> Side {
    let pd = dev.alloc_pd().unwrap();
    let scq = dev.create_cq(4096).unwrap();
    let rcq = dev.create_cq(4096).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: scq.clone(),
            recv_cq: rcq.clone(),
            cap: QpCap {
                max_send_wr: 1024,
                max_recv_wr: 1024,
                ..QpCap::default()
            },
            sq_sig_all: false,
        })
        .unwrap();
    qp.modify_to_init(&InitAttr::default()).unwrap();
    Side { pd, scq, rcq, qp }
}

fn main() {
    let net: u8 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(99);
    let ip = |h| IpAddr::V4(Ipv4Addr::new(127, 87, net, h));
    let cfg = Config::from_env();
    let (da, db) = (
        open_device(ip(1), &cfg).unwrap(),
        open_device(ip(2), &cfg).unwrap(),
    );
    let (a, b) = (side(&da), side(&db));
    for (x, y, yd) in [(&a, &b, &db), (&b, &a, &da)] {
        x.qp.modify_to_rtr(&RtrAttr {
            path_mtu: Mtu::Mtu4096,
            dest_qpn: y.qp.qpn(),
            rq_psn: 0,
            ah: AddressHandle::to_gid(yd.gid()),
            max_dest_rd_atomic: 16,
            min_rnr_timer: 1,
        })
        .unwrap();
    }
    for x in [&a, &b] {
        x.qp.modify_to_rts(&RtsAttr {
            sq_psn: 0,
            timeout: 14,
            ..RtsAttr::default()
        })
        .unwrap();
    }
    let size = 64 << 10;
    let src = RdmaBuffer::new(size).unwrap();
    let smr = a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = RdmaBuffer::new(size).unwrap();
    let dmr =
        b.pd.reg_mr(&dst, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    // Throughput: keep 16 writes in flight (PINGPONG_ONLY=1: skip).
    let total = if std::env::var_os("PINGPONG_ONLY").is_some() {
        0
    } else {
        5000usize
    };
    let t0 = Instant::now();
    let mut posted = 0;
    let mut done = 0;
    while done < total {
        while posted < total && posted - done < 16 {
            a.qp.post_send(&SendWr {
                wr_id: posted as u64,
                op: SendOp::RdmaWrite {
                    remote_addr: dmr.addr(),
                    rkey: dmr.rkey(),
                },
                sg_list: &[smr.sge(0, size as u32)],
                flags: SendFlags::SIGNALED,
            })
            .unwrap();
            posted += 1;
        }
        wait(&a.scq);
        done += 1;
    }
    let el = t0.elapsed();
    let gbps = (total * size) as f64 * 8.0 / el.as_secs_f64() / 1e9;
    if std::env::var_os("WRITE_ONLY").is_some() {
        println!("RDMA WRITE 64 KiB: {gbps:.2} Gbit/s");
        println!(
            "A {:?}\nB {:?}",
            smc_softroce::stats(&da),
            smc_softroce::stats(&db)
        );
        return;
    }
    // Ping-pong with 64-byte inline SENDs, blocking on the CQ event fd.
    let rbuf = RdmaBuffer::new(4096).unwrap();
    let ra = a.pd.reg_mr(&rbuf, AccessFlags::LOCAL_WRITE).unwrap();
    let rb = b.pd.reg_mr(&rbuf, AccessFlags::LOCAL_WRITE).unwrap();
    let iters = 20_000;
    let bq = b.qp.clone();
    let brcq = b.rcq.clone();
    let bscq = b.scq.clone();
    for _ in 0..4 {
        bq.post_recv(&RecvWr {
            wr_id: 0,
            sg_list: &[rb.sge(0, 64)],
        })
        .unwrap();
        a.qp.post_recv(&RecvWr {
            wr_id: 0,
            sg_list: &[ra.sge(0, 64)],
        })
        .unwrap();
    }
    let echo = std::thread::spawn(move || {
        for _ in 0..iters {
            wait(&brcq);
            bq.post_recv(&RecvWr {
                wr_id: 0,
                sg_list: &[rb.sge(0, 64)],
            })
            .unwrap();
            bq.post_send(&SendWr {
                wr_id: 0,
                op: SendOp::Send,
                sg_list: &[rb.sge(64, 64)],
                flags: SendFlags::SIGNALED | SendFlags::INLINE,
            })
            .unwrap();
            wait(&bscq);
        }
    });
    let t0 = Instant::now();
    for _ in 0..iters {
        a.qp.post_send(&SendWr {
            wr_id: 0,
            op: SendOp::Send,
            sg_list: &[ra.sge(64, 64)],
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
        })
        .unwrap();
        wait(&a.rcq);
        a.qp.post_recv(&RecvWr {
            wr_id: 0,
            sg_list: &[ra.sge(0, 64)],
        })
        .unwrap();
        wait(&a.scq);
    }
    let rtt = t0.elapsed() / iters as u32;
    echo.join().unwrap();
    // TCP loopback for comparison.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let srv = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut b = vec![0u8; size];
        let mut n = 0;
        while n < total * size {
            let r = s.read(&mut b).unwrap();
            n += r;
        }
        s.write_all(&[1]).unwrap();
        let mut m = [0u8; 64];
        for _ in 0..iters {
            s.read_exact(&mut m).unwrap();
            s.write_all(&m).unwrap();
        }
    });
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_nodelay(true).unwrap();
    let data = vec![7u8; size];
    let t0 = Instant::now();
    for _ in 0..total {
        c.write_all(&data).unwrap();
    }
    let mut one = [0u8; 1];
    c.read_exact(&mut one).unwrap();
    let tcp_gbps = (total * size) as f64 * 8.0 / t0.elapsed().as_secs_f64() / 1e9;
    let mut m = [0u8; 64];
    let t0 = Instant::now();
    for _ in 0..iters {
        c.write_all(&m).unwrap();
        c.read_exact(&mut m).unwrap();
    }
    let tcp_rtt = t0.elapsed() / iters as u32;
    srv.join().unwrap();
    println!(
        "RDMA WRITE 64 KiB: {gbps:.2} Gbit/s   TCP: {tcp_gbps:.2} Gbit/s   ratio {:.2}",
        gbps / tcp_gbps
    );
    println!(
        "SEND ping-pong 64 B RTT: {rtt:?}   TCP: {tcp_rtt:?}   ratio {:.2}",
        rtt.as_secs_f64() / tcp_rtt.as_secs_f64()
    );
    println!("{:?}", smc_softroce::stats(&da));
}
