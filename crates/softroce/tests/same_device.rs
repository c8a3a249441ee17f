//! QP pairs inside one device (the device sends to itself), over IPv4 and
//! IPv6 (::1, so the IPv6 pseudo-header ICRC path runs end to end).

mod common;
use std::net::{IpAddr, Ipv6Addr};

use common::*;
use smc_softroce::{open_device, Config};
use smc_verbs::*;

fn exercise(dev: &Device) {
    let o = Opts::default();
    let a = side(dev, &o, 1);
    let b = side(dev, &o, 0xffffff);
    connect(&a, &b, &o);
    let src = buf(1 << 20);
    fill_pattern(&src, 60);
    let smr = a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = buf(1 << 20);
    let dmr =
        b.pd.reg_mr(
            &dst,
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        )
        .unwrap();
    a.qp.post_send(&SendWr {
        wr_id: 1,
        op: SendOp::RdmaWrite {
            remote_addr: dmr.addr(),
            rkey: dmr.rkey(),
        },
        sg_list: &[smr.sge(0, 1 << 20)],
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    assert_eq!(wait_wc(&a.scq, T).status, WcStatus::Success);
    assert_eq!(contents(&dst, 0, 1 << 20), contents(&src, 0, 1 << 20));
    b.qp.post_recv(&RecvWr {
        wr_id: 2,
        sg_list: &[dmr.sge(0, 4096)],
    })
    .unwrap();
    a.qp.post_send(&SendWr {
        wr_id: 2,
        op: SendOp::SendWithImm { imm: 5 },
        sg_list: &[smr.sge(0, 3000)],
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    assert_eq!(wait_wc(&a.scq, T).status, WcStatus::Success);
    let rc = wait_wc(&b.rcq, T);
    assert_eq!(
        (rc.status, rc.byte_len, rc.imm_data),
        (WcStatus::Success, 3000, Some(5))
    );
    let back = buf(1 << 20);
    let bmr = a.pd.reg_mr(&back, AccessFlags::LOCAL_WRITE).unwrap();
    a.qp.post_send(&SendWr {
        wr_id: 3,
        op: SendOp::RdmaRead {
            remote_addr: dmr.addr(),
            rkey: dmr.rkey(),
        },
        sg_list: &[bmr.sge(0, 100_000)],
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    assert_eq!(wait_wc(&a.scq, T).status, WcStatus::Success);
    assert_eq!(contents(&back, 0, 100_000), contents(&dst, 0, 100_000));
    a.qp.post_send(&SendWr {
        wr_id: 4,
        op: SendOp::AtomicFetchAdd {
            remote_addr: dmr.addr() + 8,
            rkey: dmr.rkey(),
            add: 1,
        },
        sg_list: &[bmr.sge(0, 8)],
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    assert_eq!(wait_wc(&a.scq, T).status, WcStatus::Success);
    let st = smc_softroce::stats(dev).unwrap();
    assert_eq!(st.rx_bad_icrc.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[test]
fn ipv4_pair_inside_one_device() {
    exercise(&device(70, 1, &Config::default()));
}

#[test]
fn ipv6_loopback() {
    let cfg = Config {
        udp_port: Some(47911),
        peer_port: Some(47911),
        ..Config::default()
    };
    let dev = match open_device(IpAddr::V6(Ipv6Addr::LOCALHOST), &cfg) {
        Ok(d) => d,
        Err(e) => {
            // Hosts without IPv6 on lo (some containers): nothing to test.
            eprintln!("skipping: no IPv6 loopback ({e})");
            return;
        }
    };
    assert_eq!(dev.gid(), Gid::from_ip(IpAddr::V6(Ipv6Addr::LOCALHOST)));
    exercise(&dev);
}
