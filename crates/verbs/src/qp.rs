//! Queue-pair attributes and the IBA QP state machine (IBA §10.3, ibverbs
//! `ibv_modify_qp`).

use crate::types::{AccessFlags, Gid, Mac, Mtu};

/// QP states. Transitions allowed by [`QpState::can_transition`]:
/// RESET → INIT → RTR → RTS, any → ERR, any → RESET, INIT → INIT,
/// RTS → RTS, SQE → RTS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Freshly created, or reset. Nothing can be posted.
    Reset,
    /// Initialised: receives can be posted, nothing is processed.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained (not used by RC in this stack, kept for
    /// completeness of the ibverbs state set).
    Sqd,
    /// Send queue error.
    Sqe,
    /// Error: outstanding and new work requests complete with
    /// [`crate::WcStatus::WrFlushErr`].
    Err,
}

impl QpState {
    /// Whether the IBA state machine allows `self → to` through a modify.
    pub fn can_transition(self, to: QpState) -> bool {
        use QpState::*;
        matches!(
            (self, to),
            (_, Reset)
                | (_, Err)
                | (Reset, Init)
                | (Init, Init)
                | (Init, Rtr)
                | (Rtr, Rts)
                | (Rts, Rts)
                | (Sqe, Rts)
                | (Rts, Sqd)
                | (Sqd, Rts)
        )
    }
}

/// Queue capacities requested at QP creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCap {
    /// Maximum outstanding send work requests.
    pub max_send_wr: u32,
    /// Maximum outstanding receive work requests.
    pub max_recv_wr: u32,
    /// Maximum SGEs per send work request.
    pub max_send_sge: u32,
    /// Maximum SGEs per receive work request.
    pub max_recv_sge: u32,
    /// Maximum inline data per send work request.
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> Self {
        QpCap {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        }
    }
}

/// Attributes of RESET → INIT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitAttr {
    /// Port number (1 for single-port devices).
    pub port_num: u8,
    /// P_Key index (0 = default partition 0xFFFF).
    pub pkey_index: u16,
    /// Remote access rights granted to incoming requests on this QP; a
    /// request also needs the matching right on the target region.
    pub access: AccessFlags,
}

impl Default for InitAttr {
    fn default() -> Self {
        InitAttr {
            port_num: 1,
            pkey_index: 0,
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        }
    }
}

/// Where the peer QP is (RoCEv2 address handle with GRH).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressHandle {
    /// Destination GID (IPv4-mapped for IPv4).
    pub dgid: Gid,
    /// Index of the local GID to send from.
    pub sgid_index: u8,
    /// IP TTL / hop limit. SMC-R uses 1 on a direct link (Linux
    /// `smc_ib_modify_qp_rtr`).
    pub hop_limit: u8,
    /// IP traffic class (DSCP/ECN byte).
    pub traffic_class: u8,
    /// IPv6 flow label (20 bits).
    pub flow_label: u32,
    /// Destination MAC, when the provider needs one (L2 providers).
    pub dmac: Option<Mac>,
}

impl AddressHandle {
    /// A handle for `dgid` with hop limit 64 and default class.
    pub fn to_gid(dgid: Gid) -> Self {
        AddressHandle {
            dgid,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            dmac: None,
        }
    }
}

/// Attributes of INIT → RTR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtrAttr {
    /// Path MTU used by both directions of this QP.
    pub path_mtu: Mtu,
    /// Peer QP number (24 bits).
    pub dest_qpn: u32,
    /// First PSN expected from the peer (24 bits).
    pub rq_psn: u32,
    /// Peer address.
    pub ah: AddressHandle,
    /// RDMA READ / atomic requests from the peer this QP can have in
    /// progress (responder resources).
    pub max_dest_rd_atomic: u8,
    /// Minimum RNR NAK timer value advertised to the requester (IBA
    /// encoding 0..=31; 12 = 0.64 ms).
    pub min_rnr_timer: u8,
}

/// Attributes of RTR → RTS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtsAttr {
    /// First PSN this QP sends (24 bits).
    pub sq_psn: u32,
    /// Local ACK timeout, IBA encoding: 4.096 µs × 2^timeout; 0 = infinite.
    pub timeout: u8,
    /// Transport retries before `RetryExcErr` (0..=7).
    pub retry_cnt: u8,
    /// RNR retries before `RnrRetryExcErr` (0..=6; 7 = infinite).
    pub rnr_retry: u8,
    /// RDMA READ / atomic requests this QP may have outstanding as requester.
    pub max_rd_atomic: u8,
}

impl Default for RtsAttr {
    fn default() -> Self {
        RtsAttr {
            sq_psn: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::QpState::*;

    #[test]
    fn state_machine() {
        assert!(Reset.can_transition(Init));
        assert!(Init.can_transition(Rtr));
        assert!(Rtr.can_transition(Rts));
        assert!(Rts.can_transition(Err));
        assert!(Err.can_transition(Reset));
        assert!(!Reset.can_transition(Rtr));
        assert!(!Reset.can_transition(Rts));
        assert!(!Init.can_transition(Rts));
        assert!(!Err.can_transition(Rts));
        assert!(!Rtr.can_transition(Init));
    }
}
