//! One RC queue pair with its device, protection domain, completion queues and one registered
//! buffer: what every `smc rdma` tool needs, set up the way `ibv_rc_pingpong` does (IBA §10.3
//! state machine RESET → INIT → RTR → RTS; RTR/RTS attributes as rc_pingpong sets them).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use smc_verbs::{
    AccessFlags, AddressHandle, Cq, Device, Gid, InitAttr, Mr, Mtu, Pd, Qp, QpCap, QpInitAttr,
    RdmaBuffer, RtrAttr, RtsAttr, WcStatus, WorkCompletion,
};

use super::RdmaError;

/// Everything one side of a connection owns.
pub struct Endpoint {
    /// The softroce device bound to the local address.
    pub device: Device,
    /// Protection domain.
    pub pd: Pd,
    /// CQ of send completions.
    pub send_cq: Cq,
    /// CQ of receive completions.
    pub recv_cq: Cq,
    /// The RC queue pair (state INIT after [`Endpoint::open`]).
    pub qp: Qp,
    /// The registered buffer.
    pub buf: Arc<RdmaBuffer>,
    /// Its memory region.
    pub mr: Mr,
}

/// The peer's side of a connection.
#[derive(Clone, Copy, Debug)]
pub struct RemoteQp {
    /// Peer QP number.
    pub qpn: u32,
    /// First PSN the peer sends.
    pub psn: u32,
    /// Peer GID.
    pub gid: Gid,
}

/// What [`Endpoint::open`] creates.
#[derive(Clone, Copy, Debug)]
pub struct EndpointOpts {
    /// Local IP address the device binds to.
    pub local: IpAddr,
    /// Registered buffer length.
    pub buf_len: usize,
    /// Access rights of the region and of the QP for incoming requests.
    pub access: AccessFlags,
    /// Queue capacities.
    pub cap: QpCap,
}

impl Endpoint {
    /// Opens (or reuses) the device for `opts.local` and creates PD, CQs, buffer, MR and an
    /// RC QP in INIT.
    pub fn open(opts: &EndpointOpts) -> Result<Endpoint, RdmaError> {
        let device = open_device(opts.local)?;
        let pd = device.alloc_pd()?;
        let send_cq = device.create_cq(opts.cap.max_send_wr + 16)?;
        let recv_cq = device.create_cq(opts.cap.max_recv_wr + 16)?;
        let buf = RdmaBuffer::new(opts.buf_len)?;
        let mr = pd.reg_mr(&buf, opts.access | AccessFlags::LOCAL_WRITE)?;
        let qp = pd.create_qp(&QpInitAttr {
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            cap: opts.cap,
            sq_sig_all: false,
        })?;
        qp.modify_to_init(&InitAttr {
            access: opts.access,
            ..InitAttr::default()
        })?;
        tracing::debug!(dev = device.name(), qpn = qp.qpn(), "endpoint ready");
        Ok(Endpoint {
            device,
            pd,
            send_cq,
            recv_cq,
            qp,
            buf,
            mr,
        })
    }

    /// This side's GID.
    pub fn gid(&self) -> Gid {
        self.device.gid()
    }

    /// This endpoint's side as the peer sees it, sending from `psn`.
    pub fn remote(&self, psn: u32) -> RemoteQp {
        RemoteQp {
            qpn: self.qp.qpn(),
            psn,
            gid: self.gid(),
        }
    }

    /// Connects two local endpoints to each other ([`Endpoint::connect`] both ways), `a`
    /// sending from `psn_a` and `b` from `psn_b`.
    pub fn connect_pair(
        a: &Endpoint,
        b: &Endpoint,
        psn_a: u32,
        psn_b: u32,
        mtu: Mtu,
    ) -> Result<(), RdmaError> {
        a.connect(&b.remote(psn_b), psn_a, mtu)?;
        b.connect(&a.remote(psn_a), psn_b, mtu)
    }

    /// INIT → RTR → RTS towards `remote`, with rc_pingpong's attributes: MTU as given, one
    /// outstanding RDMA READ/atomic each way, RNR timer 12 (0.64 ms), ACK timeout 14
    /// (67 ms), 7 retries, infinite RNR retries.
    pub fn connect(&self, remote: &RemoteQp, my_psn: u32, mtu: Mtu) -> Result<(), RdmaError> {
        self.connect_with(remote, my_psn, mtu, 1)
    }

    /// As [`Endpoint::connect`] with `rd_atomic` outstanding RDMA READs/atomics each way.
    pub fn connect_with(
        &self,
        remote: &RemoteQp,
        my_psn: u32,
        mtu: Mtu,
        rd_atomic: u8,
    ) -> Result<(), RdmaError> {
        self.connect_full(remote, my_psn, mtu, rd_atomic, 14)
    }

    /// As [`Endpoint::connect_with`] with the local ACK timeout `ack_timeout` (IBA encoding:
    /// 4.096 µs × 2^ack_timeout).
    pub fn connect_full(
        &self,
        remote: &RemoteQp,
        my_psn: u32,
        mtu: Mtu,
        rd_atomic: u8,
        ack_timeout: u8,
    ) -> Result<(), RdmaError> {
        if remote.gid.is_zero() {
            return Err(RdmaError::Protocol(
                "the peer sent an all-zero GID: RoCEv2 needs one (give ibv_rc_pingpong -g)".into(),
            ));
        }
        self.qp.modify_to_rtr(&RtrAttr {
            path_mtu: mtu,
            dest_qpn: remote.qpn,
            rq_psn: remote.psn,
            ah: AddressHandle::to_gid(remote.gid),
            max_dest_rd_atomic: rd_atomic,
            min_rnr_timer: 12,
        })?;
        self.qp.modify_to_rts(&RtsAttr {
            sq_psn: my_psn,
            timeout: ack_timeout,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: rd_atomic,
        })?;
        Ok(())
    }
}

/// The device serving `local` from the provider `SMC_RS_PROVIDER` selects (auto: a
/// libibverbs device whose RoCEv2 GID is `local`, else a softroce device configured from
/// the environment: `SMC_RS_SOFTROCE_FAULTS` etc., see `smc_softroce::Config::from_env`).
#[cfg(feature = "softroce")]
fn open_device(local: IpAddr) -> Result<Device, RdmaError> {
    let sel = smc_providers::selection_from_env().map_err(RdmaError::Usage)?;
    Ok(smc_providers::open_device(sel, local)?)
}

#[cfg(not(feature = "softroce"))]
fn open_device(local: IpAddr) -> Result<Device, RdmaError> {
    Err(RdmaError::NoProvider(local))
}

/// Waits for one completion on `cq` until `deadline`; fails on a non-success status.
pub fn wait_one(cq: &Cq, deadline: Instant, what: &str) -> Result<WorkCompletion, RdmaError> {
    let wc = wait_any(cq, deadline, what)?;
    if wc.status != WcStatus::Success {
        return Err(RdmaError::Completion {
            what: what.to_string(),
            status: wc.status,
            wr_id: wc.wr_id,
        });
    }
    Ok(wc)
}

/// As [`wait_one`], polling in a loop (yielding the CPU between polls) instead of sleeping on
/// the CQ's event fd: lower latency, one core busy.
pub fn spin_one(cq: &Cq, deadline: Instant, what: &str) -> Result<WorkCompletion, RdmaError> {
    let mut one = [WorkCompletion::default()];
    loop {
        if cq.poll(&mut one) == 1 {
            if one[0].status != WcStatus::Success {
                return Err(RdmaError::Completion {
                    what: what.to_string(),
                    status: one[0].status,
                    wr_id: one[0].wr_id,
                });
            }
            return Ok(one[0]);
        }
        if Instant::now() >= deadline {
            return Err(RdmaError::Timeout(what.to_string()));
        }
        std::thread::yield_now();
    }
}

/// Waits for one completion on `cq` until `deadline`, whatever its status.
pub fn wait_any(cq: &Cq, deadline: Instant, what: &str) -> Result<WorkCompletion, RdmaError> {
    let mut one = [WorkCompletion::default()];
    loop {
        if cq.poll(&mut one) == 1 {
            return Ok(one[0]);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(RdmaError::Timeout(what.to_string()));
        }
        cq.wait(Some((deadline - now).min(Duration::from_millis(500))))?;
    }
}

/// A random 24-bit PSN, as rc_pingpong picks one (`lrand48() & 0xffffff`).
pub fn random_psn() -> u32 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    (h.finish() as u32) & 0xff_ffff
}
