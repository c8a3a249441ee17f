//! Sends one 64 KiB RDMA WRITE from `local` to a peer QP at `peer` (which
//! need not exist) and exits after a moment: a probe for checking on the
//! wire how packets (and with SMC_RS_SOFTROCE_GSO=1, GSO segments) look.
//! `gso_probe <local-ip> <peer-ip>`

use std::net::IpAddr;
use std::time::Duration;

use smc_softroce::{open_device, Config};
use smc_verbs::*;

fn main() {
    let mut args = std::env::args().skip(1);
    let local: IpAddr = args.next().expect("local ip").parse().expect("ip");
    let peer: IpAddr = args.next().expect("peer ip").parse().expect("ip");
    let dev = open_device(local, &Config::from_env()).expect("device");
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            cap: QpCap::default(),
            sq_sig_all: true,
        })
        .unwrap();
    qp.modify_to_init(&InitAttr::default()).unwrap();
    qp.modify_to_rtr(&RtrAttr {
        path_mtu: Mtu::Mtu4096,
        dest_qpn: 0x11,
        rq_psn: 0,
        ah: AddressHandle::to_gid(Gid::from_ip(peer)),
        max_dest_rd_atomic: 1,
        min_rnr_timer: 1,
    })
    .unwrap();
    qp.modify_to_rts(&RtsAttr {
        timeout: 18,
        retry_cnt: 0,
        ..RtsAttr::default()
    })
    .unwrap();
    let b = RdmaBuffer::new(64 << 10).unwrap();
    let mr = pd.reg_mr(&b, AccessFlags::LOCAL_WRITE).unwrap();
    qp.post_send(&SendWr {
        wr_id: 1,
        op: SendOp::RdmaWrite {
            remote_addr: 0x1000,
            rkey: 0x1234,
        },
        sg_list: &[mr.sge(0, 64 << 10)],
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
}
