//! Helpers for the iWARP provider tests: two endpoints on loopback, a buffer each.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use smc_iwarp::cm::{self, ConnParams, Connection, Listener};
use smc_iwarp::Config;
use smc_verbs::{
    AccessFlags, Cq, Device, InitAttr, Mr, Pd, Qp, QpCap, QpInitAttr, RdmaBuffer, WcStatus,
    WorkCompletion,
};

pub struct Ep {
    pub dev: Device,
    pub pd: Pd,
    pub scq: Cq,
    pub rcq: Cq,
    pub qp: Qp,
    pub buf: Arc<RdmaBuffer>,
    pub mr: Mr,
}

pub fn ep_with(cfg: &Config, len: usize, access: AccessFlags) -> Ep {
    let dev = smc_iwarp::open_device("127.0.0.1".parse().unwrap(), cfg).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let scq = dev.create_cq(4096).unwrap();
    let rcq = dev.create_cq(4096).unwrap();
    let buf = RdmaBuffer::new(len).unwrap();
    let mr = pd.reg_mr(&buf, access | AccessFlags::LOCAL_WRITE).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: scq.clone(),
            recv_cq: rcq.clone(),
            cap: QpCap {
                max_send_wr: 1024,
                max_recv_wr: 1024,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 128,
            },
            sq_sig_all: true,
        })
        .unwrap();
    qp.modify_to_init(&InitAttr {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        ..InitAttr::default()
    })
    .unwrap();
    Ep {
        dev,
        pd,
        scq,
        rcq,
        qp,
        buf,
        mr,
    }
}

pub fn ep(len: usize) -> Ep {
    ep_with(
        &Config::default(),
        len,
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    )
}

/// Connects `client` to `server` through a fresh listener; returns both sides' results.
pub fn pair_with(
    client: &Ep,
    server: &Ep,
    cp: &ConnParams,
    sp: &ConnParams,
) -> (
    Result<Connection, cm::CmError>,
    Result<Connection, cm::CmError>,
) {
    let l = Listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let sqp = server.qp.clone();
    let sp = sp.clone();
    let t = std::thread::spawn(move || {
        let inc = l.accept()?;
        inc.accept(&sqp, &sp)
    });
    let c = cm::connect(&client.qp, addr, cp);
    let s = t.join().unwrap();
    (c, s)
}

pub fn pair(client: &Ep, server: &Ep) -> (Connection, Connection) {
    let (c, s) = pair_with(
        client,
        server,
        &ConnParams::default(),
        &ConnParams::default(),
    );
    (c.unwrap(), s.unwrap())
}

pub fn wait(cq: &Cq, what: &str) -> WorkCompletion {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut one = [WorkCompletion::default()];
    loop {
        if cq.poll(&mut one) == 1 {
            return one[0];
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        cq.wait(Some(Duration::from_millis(100))).unwrap();
    }
}

pub fn wait_ok(cq: &Cq, what: &str) -> WorkCompletion {
    let wc = wait(cq, what);
    assert_eq!(wc.status, WcStatus::Success, "{what}: {wc:?}");
    wc
}

pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn read_back(ep: &Ep, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    ep.buf.read(off, &mut v);
    v
}

pub fn addr_of(l: &Listener) -> SocketAddr {
    l.local_addr().unwrap()
}
