//! UDP GSO on a real wire: a device in one network namespace sends a
//! 64 KiB RDMA WRITE with `SMC_RS_SOFTROCE_GSO=1` over a veth pair whose
//! sender side cannot segment in hardware (`gso_max_segs 1`), so the kernel
//! splits every train into datagrams and numbers their IPv4 IDs 0, 1, 2, …
//! A raw socket in the other namespace checks that every segment's ICRC
//! verifies with its real IP header. Needs root and iproute2; skips (with a
//! message) otherwise.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsFd;
use std::process::Command;
use std::time::{Duration, Instant};

use smc_softroce::icrc::{self, IpInfo};
use smc_softroce::wire::PacketRepr;
use smc_softroce::{open_device, Config};
use smc_verbs::*;
use socket2::{Domain, Protocol, Socket, Type};

fn ip(args: &str) -> bool {
    Command::new("ip")
        .args(args.split_whitespace())
        .status()
        .is_ok_and(|s| s.success())
}

struct Netns(Vec<String>);
impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.0 {
            ip(&format!("netns del {n}"));
        }
    }
}

fn enter(ns: &str) {
    let f = std::fs::File::open(format!("/run/netns/{ns}")).expect("netns file");
    // setns affects only this thread.
    rustix::thread::move_into_link_name_space(
        f.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .expect("setns");
}

#[test]
fn gso_segments_verify_with_their_real_ip_ids() {
    let id = std::process::id() % 100_000;
    let (na, nb) = (format!("sra{id}"), format!("srb{id}"));
    if !ip(&format!("netns add {na}")) {
        eprintln!("skipping: cannot create network namespaces (not root or no iproute2)");
        return;
    }
    let _guard = Netns(vec![na.clone(), nb.clone()]);
    let (va, vb) = (format!("vga{id}"), format!("vgb{id}"));
    for c in [
        format!("netns add {nb}"),
        format!("link add {va} netns {na} type veth peer name {vb} netns {nb}"),
        format!("-n {na} addr add 10.78.0.1/24 dev {va}"),
        format!("-n {nb} addr add 10.78.0.2/24 dev {vb}"),
        format!("-n {na} link set {va} up"),
        format!("-n {nb} link set {vb} up"),
        format!("-n {na} link set {va} gso_max_segs 1"),
    ] {
        if !ip(&c) {
            eprintln!("skipping: `ip {c}` failed (no veth support?)");
            return;
        }
    }
    std::env::set_var("SMC_RS_SOFTROCE_GSO", "1");
    // Capture in B.
    let nb2 = nb.clone();
    let cap = std::thread::spawn(move || {
        enter(&nb2);
        let raw = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP)).unwrap();
        raw.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut out = Vec::new();
        let mut b = vec![std::mem::MaybeUninit::<u8>::uninit(); 70_000];
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            match raw.recv(&mut b) {
                // SAFETY: recv initialised the first `n` bytes.
                Ok(n) => out.push(
                    b[..n]
                        .iter()
                        .map(|x| unsafe { x.assume_init() })
                        .collect::<Vec<u8>>(),
                ),
                Err(_) if !out.is_empty() => break,
                Err(_) => {}
            }
        }
        out
    });
    std::thread::sleep(Duration::from_millis(100));
    // Send from A (the device's socket lives in A's namespace).
    let na2 = na.clone();
    std::thread::spawn(move || {
        enter(&na2);
        let dev = open_device(IpAddr::V4(Ipv4Addr::new(10, 78, 0, 1)), &Config::default()).unwrap();
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
            ah: AddressHandle::to_gid(Gid::from_ip(IpAddr::V4(Ipv4Addr::new(10, 78, 0, 2)))),
            max_dest_rd_atomic: 1,
            min_rnr_timer: 1,
        })
        .unwrap();
        qp.modify_to_rts(&RtsAttr {
            timeout: 20,
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
                rkey: 1,
            },
            sg_list: &[mr.sge(0, 64 << 10)],
            flags: SendFlags::SIGNALED,
        })
        .unwrap();
        std::thread::sleep(Duration::from_millis(500));
    })
    .join()
    .unwrap();
    let pkts = cap.join().unwrap();
    let mut ids = Vec::new();
    for d in &pkts {
        let ihl = (d[0] & 0x0f) as usize * 4;
        let udp = &d[ihl..];
        if u16::from_be_bytes([udp[2], udp[3]]) != 4791 {
            continue;
        }
        let id = u16::from_be_bytes([d[4], d[5]]);
        let info = IpInfo::V4 {
            src: Ipv4Addr::new(d[12], d[13], d[14], d[15]),
            dst: Ipv4Addr::new(d[16], d[17], d[18], d[19]),
            id,
            flags_frag: u16::from_be_bytes([d[6], d[7]]),
        };
        let payload = &udp[8..];
        assert!(
            PacketRepr::parse(payload).is_ok(),
            "not a single RoCE packet: {} bytes",
            payload.len()
        );
        assert!(
            icrc::verify(&info, u16::from_be_bytes([udp[0], udp[1]]), 4791, payload),
            "ICRC fails for IP ID {id}"
        );
        ids.push(id);
    }
    eprintln!(
        "{} segments verified, IDs {:?}",
        ids.len(),
        &ids[..ids.len().min(20)]
    );
    assert!(ids.len() >= 16, "too few packets captured: {}", ids.len());
    assert!(ids.iter().any(|&i| i > 0), "no GSO train was segmented");
}
