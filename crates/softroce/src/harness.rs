//! A device without its engine thread, driven step by step by the caller:
//! deterministic responder tests (`cfg(test)`) and the `roce_responder`
//! fuzz target (feature `fuzzing`, which exports this module and nothing
//! else).
//!
//! [`Harness::feed`] runs one received packet through exactly the path the
//! engine uses (`handle_packet`: parse, ICRC, QP lookup, source check, QP),
//! [`Harness::service`] is one engine pass (timers, READ responses still to
//! stream, deferred CQ handlers), and what the device sends lands on a
//! local UDP socket that [`Harness::sent`] drains. The device is bound to
//! an ephemeral port, so harnesses never collide with each other or with
//! real devices.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Instant;

use smc_verbs::{
    AccessFlags, AddressHandle, Cq, Device, Gid, InitAttr, Mtu, Pd, Qp, QpCap, QpInitAttr, RtrAttr,
    RtsAttr,
};

use crate::config::Config;
use crate::device::Stats;
use crate::engine::{handle_packet, Engine};
use crate::icrc::{self, IpInfo, IPV4_DF};

/// Address of the harness device and of its scripted peer.
pub const LOCAL: Ipv4Addr = Ipv4Addr::LOCALHOST;

/// An engine-less device plus the socket that receives what it sends.
pub struct Harness {
    /// The device (no engine thread).
    pub dev: Device,
    eng: Arc<Engine>,
    sink: UdpSocket,
    touched: Vec<Arc<crate::qp::QpShared>>,
    service: Vec<Arc<crate::qp::QpShared>>,
    fire: Vec<Arc<crate::cq::CqShared>>,
}

/// A connected RC QP of the harness with its PD and CQs.
pub struct HarnessQp {
    /// Protection domain of the QP.
    pub pd: Pd,
    /// Send CQ.
    pub scq: Cq,
    /// Receive CQ.
    pub rcq: Cq,
    /// The QP (RTS), connected to `peer_qpn` at [`LOCAL`].
    pub qp: Qp,
}

impl Harness {
    /// Opens the device on [`LOCAL`] with path MTU `mtu`.
    pub fn new(mtu: Mtu) -> io::Result<Harness> {
        let sink = UdpSocket::bind(SocketAddr::new(IpAddr::V4(LOCAL), 0))?;
        sink.set_nonblocking(true)?;
        // Room for a few service passes of READ responses between drains.
        let _ = socket2::SockRef::from(&sink).set_recv_buffer_size(4 << 20);
        let cfg = Config {
            udp_port: Some(0),
            peer_port: Some(sink.local_addr()?.port()),
            max_mtu: Some(mtu),
            faults: None,
            // One datagram per packet: the harness's sink reads them singly.
            gso: Some(false),
        };
        let (dev, eng) = crate::verbs::open_inner(IpAddr::V4(LOCAL), &cfg, false)
            .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(Harness {
            dev,
            eng,
            sink,
            touched: Vec::with_capacity(4),
            service: Vec::with_capacity(4),
            fire: Vec::with_capacity(4),
        })
    }

    /// A QP in RTS connected to QPN `peer_qpn` at [`LOCAL`]: it expects
    /// PSN `rq_psn` from the peer, sends from `sq_psn`, grants every remote
    /// access and keeps `max_dest_rd_atomic` responder resources.
    pub fn qp(
        &self,
        peer_qpn: u32,
        rq_psn: u32,
        sq_psn: u32,
        max_dest_rd_atomic: u8,
    ) -> smc_verbs::Result<HarnessQp> {
        let pd = self.dev.alloc_pd()?;
        let scq = self.dev.create_cq(1024)?;
        let rcq = self.dev.create_cq(1024)?;
        let qp = pd.create_qp(&QpInitAttr {
            send_cq: scq.clone(),
            recv_cq: rcq.clone(),
            cap: QpCap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 2,
                max_recv_sge: 2,
                max_inline_data: 64,
            },
            sq_sig_all: true,
        })?;
        qp.modify_to_init(&InitAttr {
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            ..InitAttr::default()
        })?;
        qp.modify_to_rtr(&RtrAttr {
            path_mtu: self.dev.attr().active_mtu,
            dest_qpn: peer_qpn,
            rq_psn,
            ah: AddressHandle::to_gid(Gid::from_ip(IpAddr::V4(LOCAL))),
            max_dest_rd_atomic,
            min_rnr_timer: 1,
        })?;
        qp.modify_to_rts(&RtsAttr {
            sq_psn,
            // Long enough that no retransmission interleaves with a script.
            timeout: 18,
            ..RtsAttr::default()
        })?;
        Ok(HarnessQp { pd, scq, rcq, qp })
    }

    /// The UDP port the device receives on (covered by the ICRC).
    pub fn port(&self) -> u16 {
        self.eng.dev.local_port
    }

    /// Computes and stores the ICRC of `pkt` (a whole UDP payload with room
    /// for the ICRC) as sent from `src:sport` to the device.
    pub fn seal(&self, src: IpAddr, sport: u16, pkt: &mut [u8]) {
        if let IpAddr::V4(src) = src {
            let ip = IpInfo::V4 {
                src,
                dst: LOCAL,
                id: 0,
                flags_frag: IPV4_DF,
            };
            icrc::fill(&ip, sport, self.port(), pkt);
        }
    }

    /// Delivers one UDP payload from `src:sport` as the engine would.
    pub fn feed(&mut self, pkt: &[u8], src: IpAddr, sport: u16) {
        handle_packet(
            &self.eng,
            Instant::now(),
            pkt,
            src,
            sport,
            &mut self.touched,
        );
        for qp in self.touched.drain(..) {
            qp.after_batch();
        }
    }

    /// One engine pass: expired timers, streaming READ responses, deferred
    /// completion handlers. Returns whether a QP still has work.
    pub fn service(&mut self) -> bool {
        self.eng.run_timers(&mut self.service, &mut self.fire).1
    }

    /// Everything the device sent since the last call, oldest first.
    pub fn sent(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut b = vec![0u8; 65_536];
        while let Ok(n) = self.sink.recv(&mut b) {
            out.push(b[..n].to_vec());
        }
        out
    }

    /// The device's counters.
    pub fn stats(&self) -> &Stats {
        &self.eng.dev.stats
    }
}
