//! Shared test helpers: two devices on loopback with a connected RC QP pair.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smc_softroce::{open_device, Config};
use smc_verbs::*;

pub struct Side {
    pub dev: Device,
    pub pd: Pd,
    pub scq: Cq,
    pub rcq: Cq,
    pub qp: Qp,
    pub psn: u32,
}

pub struct Opts {
    pub access: AccessFlags,
    pub rts: RtsAttr,
    pub min_rnr_timer: u8,
    pub mtu: Mtu,
    pub cap: QpCap,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            rts: RtsAttr {
                timeout: 12,
                ..RtsAttr::default()
            },
            min_rnr_timer: 1,
            mtu: Mtu::Mtu4096,
            cap: QpCap {
                max_send_wr: 256,
                max_recv_wr: 256,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 128,
            },
        }
    }
}

/// Address 127.86.`net`.`host`: every test uses its own /24 so tests in
/// one binary (and other processes using 127.0.0.x) never share a port.
pub fn addr(net: u8, host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 86, net, host))
}

pub fn device(net: u8, host: u8, cfg: &Config) -> Device {
    open_device(addr(net, host), cfg).expect("open device")
}

pub fn side(dev: &Device, o: &Opts, psn: u32) -> Side {
    let pd = dev.alloc_pd().unwrap();
    let scq = dev.create_cq(4096).unwrap();
    let rcq = dev.create_cq(4096).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: scq.clone(),
            recv_cq: rcq.clone(),
            cap: o.cap,
            sq_sig_all: false,
        })
        .unwrap();
    qp.modify_to_init(&InitAttr {
        access: o.access,
        ..InitAttr::default()
    })
    .unwrap();
    Side {
        dev: dev.clone(),
        pd,
        scq,
        rcq,
        qp,
        psn,
    }
}

pub fn connect(a: &Side, b: &Side, o: &Opts) {
    for (x, y) in [(a, b), (b, a)] {
        x.qp.modify_to_rtr(&RtrAttr {
            path_mtu: o.mtu,
            dest_qpn: y.qp.qpn(),
            rq_psn: y.psn,
            ah: AddressHandle::to_gid(y.dev.gid()),
            max_dest_rd_atomic: 16,
            min_rnr_timer: o.min_rnr_timer,
        })
        .unwrap();
    }
    for x in [a, b] {
        x.qp.modify_to_rts(&RtsAttr {
            sq_psn: x.psn,
            ..o.rts
        })
        .unwrap();
    }
}

/// Two devices 127.86.net.1 / .2 with a connected QP pair.
pub fn pair(net: u8, cfg: &Config, o: &Opts) -> (Side, Side) {
    let da = device(net, 1, cfg);
    let db = device(net, 2, cfg);
    // PSNs near the wrap so 24-bit arithmetic is exercised.
    let a = side(&da, o, 0xfffff0);
    let b = side(&db, o, 0x7ffff8);
    connect(&a, &b, o);
    (a, b)
}

pub fn buf(len: usize) -> Arc<RdmaBuffer> {
    RdmaBuffer::new(len).unwrap()
}

pub fn fill_pattern(b: &RdmaBuffer, seed: u8) {
    let mut v = vec![0u8; b.len()];
    for (i, x) in v.iter_mut().enumerate() {
        *x = (i as u32)
            .wrapping_mul(2654435761)
            .wrapping_add(seed as u32)
            .to_le_bytes()[1];
    }
    b.write(0, &v);
}

pub fn contents(b: &RdmaBuffer, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    b.read(off, &mut v);
    v
}

/// Waits for exactly one completion.
pub fn wait_wc(cq: &Cq, timeout: Duration) -> WorkCompletion {
    let deadline = Instant::now() + timeout;
    let mut wc = [WorkCompletion::default()];
    loop {
        if cq.poll(&mut wc) == 1 {
            return wc[0];
        }
        let now = Instant::now();
        assert!(now < deadline, "no completion within {timeout:?}");
        cq.wait(Some(deadline - now)).unwrap();
    }
}

pub fn no_wc(cq: &Cq, wait: Duration) {
    std::thread::sleep(wait);
    let mut wc = [WorkCompletion::default()];
    assert_eq!(cq.poll(&mut wc), 0, "unexpected completion {:?}", wc[0]);
}

pub const T: Duration = Duration::from_secs(10);
