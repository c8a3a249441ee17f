//! One SMC-R link of the link group as the machine sees it (RFC 7609 §2.2, §2.2.4).

use std::time::Instant;

use smc_wire::common::{QpMtu, U24};

use super::{DeviceId, LinkId};

/// Where a link is in its life.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LinkState {
    /// The runtime is creating its QP (`CreateLink` emitted, `on_link_created` pending).
    Creating,
    /// The runtime is connecting its QP to the peer (`ConnectLink` emitted).
    Connecting,
    /// The QP is connected; the ADD LINK CONTINUATION and CONFIRM LINK exchanges run
    /// (first link: CONFIRM LINK).
    Confirming,
    /// Confirmed: carries connections and LLC messages.
    Active,
    /// Being deleted by a DELETE LINK exchange; no new work is put on it.
    Deleting,
    /// Failed or deleted; waiting for the DELETE LINK exchange that lets both sides clean up.
    Down,
}

/// Our side of a link's QP, as created by the runtime.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct QpInfo {
    /// QP number.
    pub qpn: U24,
    /// Initial send PSN (the peer programs it as its expected PSN).
    pub psn: U24,
    /// Largest path MTU the device supports for this QP.
    pub mtu: QpMtu,
}

pub use crate::ids::PeerQp;

/// A read-only snapshot of a link for the runtime.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LinkInfo {
    /// The machine's handle.
    pub id: LinkId,
    /// Link number on the wire (assigned by the server; 0 while a client's first link is
    /// not yet confirmed).
    pub num: u8,
    /// State.
    pub state: LinkState,
    /// Our device.
    pub device: DeviceId,
    /// Our QP, once created.
    pub local: Option<QpInfo>,
    /// The peer's QP, once known.
    pub peer: Option<PeerQp>,
    /// Our link user ID (RFC 7609 §2.2.4: opaque, for management).
    pub local_uid: u32,
    /// The peer's link user ID (0 until CONFIRM LINK).
    pub peer_uid: u32,
    /// Asymmetric: shares a device with another link on one side (§2.2.1, AMB-49).
    pub asymmetric: bool,
}

/// A TEST LINK to send unless the link hears from the peer first
/// ([`super::LinkGroup::probe_link_deferred`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct PendingProbe {
    /// The latest sign that asked for it: anything received after it shows the peer's
    /// process alive.
    pub since: Instant,
    /// When to look next.
    pub at: Instant,
}

/// A TEST LINK we sent and wait for (RFC 7609 A.3.8).
#[derive(Clone, Copy, Debug)]
pub(super) struct PendingTest {
    pub data: [u8; 16],
    pub deadline: Instant,
}

#[derive(Clone, Debug)]
pub(super) struct Link {
    pub id: LinkId,
    pub num: u8,
    pub state: LinkState,
    pub device: DeviceId,
    pub local: Option<QpInfo>,
    pub peer: Option<PeerQp>,
    pub local_uid: u32,
    pub peer_uid: u32,
    pub asym: bool,
    /// Last time something was received on the link (keepalive, §4.5.3).
    pub last_rx: Instant,
    pub test: Option<PendingTest>,
    pub probe: Option<PendingProbe>,
    /// Client: we sent DELETE LINK for this link; server commands arriving on it are
    /// crossing messages and ignored (C.7.1, CHECKLIST B.16).
    pub client_deleting: bool,
    /// Our TEST LINK responses posted and not yet completed (bounded: a peer's TEST LINK
    /// flood must not fill the send queue, KA-4).
    pub echoes: u8,
}

impl Link {
    pub fn new(id: LinkId, num: u8, device: DeviceId, now: Instant) -> Link {
        Link {
            id,
            num,
            state: LinkState::Creating,
            device,
            local: None,
            peer: None,
            local_uid: 0,
            peer_uid: 0,
            asym: false,
            last_rx: now,
            echoes: 0,
            test: None,
            probe: None,
            client_deleting: false,
        }
    }

    /// Carries LLC requests and connections.
    pub fn is_active(&self) -> bool {
        self.state == LinkState::Active
    }

    /// Not failed or being deleted (counts towards the link group's links).
    pub fn is_alive(&self) -> bool {
        !matches!(self.state, LinkState::Down | LinkState::Deleting)
    }

    pub fn info(&self) -> LinkInfo {
        LinkInfo {
            id: self.id,
            num: self.num,
            state: self.state,
            device: self.device,
            local: self.local,
            peer: self.peer,
            local_uid: self.local_uid,
            peer_uid: self.peer_uid,
            asymmetric: self.asym,
        }
    }
}
