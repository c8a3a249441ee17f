//! The names every machine shares: which end a stack is, which SMC-R version a link
//! group speaks, and the runtime's names for link groups, links, RMBs and devices. One
//! definition each, so that clc, llc, conn and the endpoint pass them along unconverted.

use std::fmt;

use smc_wire::common::{Gid, Mac, QpMtu, U24};

/// Which end of the TCP connection that created the link group (RFC 7609 §2.2.3): the
/// server decides link groups, adds and deletes links.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Sent the SYN and the Proposal.
    Client,
    /// Accepted the connection.
    Server,
}

/// The SMC-R version a rendezvous settled on, fixed for the link group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Version {
    /// SMC-Rv1 (RFC 7609; LLC type codes 0x01..0x09).
    V1,
    /// SMC-Rv2 as Linux implements it (LLC type codes 0x21..0x29, ADD LINK v2
    /// extension, no CONTINUATIONs).
    V2,
}

impl Version {
    /// The CLC header version nibble.
    pub fn wire(self) -> u8 {
        match self {
            Version::V1 => 1,
            Version::V2 => 2,
        }
    }
}

/// A link group, as the runtime names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LgrId(pub u64);

/// A link (QP pair) of a link group, as the runtime names it (not the wire link number,
/// which the client learns only from CONFIRM LINK). The first link is [`LinkId::FIRST`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LinkId(pub u32);

impl LinkId {
    /// The link created with the link group (first contact).
    pub const FIRST: LinkId = LinkId(0);
}

impl fmt::Display for LinkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "L{}", self.0)
    }
}

/// One of our RMBs (an RMB element's buffer), as the runtime names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RmbId(pub u32);

/// A local RoCE device (RNIC port), as the runtime names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId(pub u32);

/// The peer's side of a QP pair: what CLC Accept/Confirm and ADD LINK announce, and what
/// moves our QP to RTR/RTS (RFC 7609 A.2.3, A.3.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerQp {
    /// Peer RoCE MAC.
    pub mac: Mac,
    /// Peer GID.
    pub gid: Gid,
    /// Peer QP number.
    pub qpn: U24,
    /// The peer's initial send PSN: our expected receive PSN (RTR).
    pub psn: U24,
    /// As announced by the peer (CLC), its QP MTU; as handed to the link-group machine and
    /// the RNIC, the path MTU: the smaller of both sides' (RFC 7609 A.2.3).
    pub mtu: QpMtu,
}
