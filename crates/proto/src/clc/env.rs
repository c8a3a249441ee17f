//! What the rendezvous machines ask of their environment, synchronously: link-group
//! lookups, link-group and RMB allocation, peer RMB registration, RoCEv2 routes and
//! cleanup. In a stack the environment is the endpoint (`crate::endpoint`, whose `Host`
//! — the `smc` runtime — creates the verbs objects); in the machines' tests it is
//! `clc::testing::FakeEnv`.
//!
//! Every call is local and quick (no network round trip): the environment answers from
//! its tables or has verbs objects created. Exchanges that need the peer (CONFIRM RKEY,
//! CONFIRM LINK, ADD LINK) are asynchronous instead: the machine emits an
//! [`Output`](super::Output) and the driver reports back through
//! [`Rendezvous::handle_rkey_confirmed`](super::Rendezvous::handle_rkey_confirmed) /
//! [`handle_link_event`](super::Rendezvous::handle_link_event).
//!
//! Failures are answered with the Linux Decline code the machine should send
//! ([`DeclineCode::MEM`], [`DeclineCode::NOSMCRDEV`], [`DeclineCode::ERR_RDYLNK`], ...);
//! the machine decides whether it may still Decline or must reset (RFC 7609 C.1–C.3).
//!
//! Ownership: what the machine allocated through this trait ([`ClcEnv::server_create_lgr`],
//! [`ClcEnv::client_create_lgr`], [`ClcEnv::alloc_rmb`]) is released by the machine
//! ([`ClcEnv::abandon_lgr`], [`ClcEnv::free_rmb`]) when the rendezvous ends in a fallback
//! or a reset (RFC 7609 §3.5.1.6.4: "tears down the RoCE resources allocated for it");
//! when it ends in [`Outcome::Smc`](super::Outcome::Smc) it all belongs to the new
//! connection.

use ::core::net::{IpAddr, Ipv4Addr};
use arrayvec::ArrayVec;
use smc_wire::clc::{Ipv6Prefix, SameHostOffer};
use smc_wire::common::{BufSize, Eid, Gid, Mac, PeerId, QpMtu, U24};
use smc_wire::decline::DeclineCode;

use crate::ids::Version;
pub use crate::ids::{LgrId, LinkId, RmbId};

/// An existing connection, as the environment names it (RMBE conflict resolution; the
/// endpoint uses the connection's alert token).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnRef(pub u64);

/// Most GIDs a client lists in a first-contact v2 Confirm (smc-wire accepts 8; Linux
/// sends ≤ 2).
pub const MAX_GID_LIST: usize = 8;

/// The RDMA device (port and GID) the runtime picked for the TCP connection's route
/// (Linux: the RoCE port of the netdev that carries the TCP connection, linux-smc.md §2.12).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalDevice {
    /// GID (SMC-Rv2: the IPv4-mapped RoCEv2 GID of an address in the TCP source subnet).
    pub gid: Gid,
    /// The port's MAC.
    pub mac: Mac,
}

/// The client's IP information for the v1 same-LAN check (RFC 7609 §3.5.1.2, A.2.2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProposalIp {
    /// IPv4: the subnet number (address AND mask) and prefix length of the outgoing
    /// interface (CHECKLIST AMB-05).
    V4 {
        /// Subnet number.
        subnet: Ipv4Addr,
        /// Prefix length, 0..=32.
        prefix_len: u8,
    },
    /// IPv6: the prefixes of the interface (1..=8, link-local excluded, like Linux).
    V6 {
        /// The prefixes.
        prefixes: ArrayVec<Ipv6Prefix, 8>,
    },
}

/// Client per-connection facts: what may be offered on this connection's route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientRoute {
    /// Our Peer ID (RFC 7609 A.2.1; one per stack instance, CHECKLIST INV-19).
    pub peer_id: PeerId,
    /// SMC-Rv1 possible on this route: device and IP information. `None` = do not offer.
    pub v1: Option<(LocalDevice, ProposalIp)>,
    /// SMC-Rv2 possible on this route (IPv4 TCP connection and a RoCEv2 GID in the
    /// source subnet). `None` = do not offer.
    pub v2: Option<ClientV2Route>,
    /// smc-rs's same-host offer to put in the Proposal (`None` = do not offer). Needs
    /// the Linux Proposal layout (the SMC-D/v2 area carries it).
    pub same_host: Option<SameHostOffer>,
}

/// Client SMC-Rv2 route facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientV2Route {
    /// The device and its RoCEv2 GID (offered in the Proposal's v2 extension).
    pub device: LocalDevice,
    /// Our usable RoCEv2 GIDs for the Confirm's GID list on first contact (Linux
    /// `smc_fill_gid_list`: the link's GID first, then an alternate device's). Empty =
    /// just `device.gid`.
    pub gid_list: ArrayVec<Gid, MAX_GID_LIST>,
}

/// One local interface address, for the server's v1 same-LAN check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalPrefix {
    /// Address of the interface.
    pub addr: IpAddr,
    /// Its prefix length.
    pub prefix_len: u8,
}

/// What the runtime made of a client's same-host offer ([`ClcEnv::server_same_host`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerSameHost {
    /// Done: the shared memory is set up; our stack id for the same-host Accept.
    Taken(u64),
    /// The exchange runs elsewhere (it may wait on the client's process): the
    /// rendezvous waits for its outcome, at most `ClcConfig::same_host_timeout`.
    Later,
    /// Not taken: SMC-R as if nothing had been offered.
    No,
}

/// Server per-connection facts: what may be accepted on this connection's route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerRoute {
    /// Our Peer ID.
    pub peer_id: PeerId,
    /// SMC-Rv1 possible: the addresses of the interface the TCP connection arrived on
    /// (RFC 7609 §3.5.1.2 same-LAN check; Linux `smc_clc_prfx_match`). `None` = no v1
    /// device for this route.
    pub v1_prefixes: Option<Vec<LocalPrefix>>,
    /// SMC-Rv2 possible: a RoCEv2 device for this route exists.
    pub v2: bool,
    /// Take a client's same-host offer ([`ClcEnv::server_same_host`]).
    pub same_host: bool,
}

/// The local side of a link, as Accept/Confirm present it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalLink {
    /// The environment's name of the link.
    pub link: LinkId,
    /// Our GID on this link.
    pub gid: Gid,
    /// Our MAC on this link.
    pub mac: Mac,
    /// Our QP number.
    pub qpn: U24,
    /// Our initial send PSN of the link (for an existing link: the original value,
    /// CHECKLIST AMB-54).
    pub psn: U24,
    /// The link's path MTU (new link: the port's active MTU).
    pub mtu: QpMtu,
}

/// Who the peer's side of a link is (the link-match key of RFC 7609 §3.5.2.2/§3.5.2.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerLinkId {
    /// Peer ID.
    pub peer_id: PeerId,
    /// Peer GID.
    pub gid: Gid,
    /// Peer MAC (Linux ignores it for v2 link matching).
    pub mac: Mac,
    /// Peer QP number.
    pub qpn: U24,
}

pub use crate::ids::PeerQp;

impl PeerQp {
    /// The link-match key of this QP of the peer `peer_id`.
    pub fn link_id(&self, peer_id: PeerId) -> PeerLinkId {
        PeerLinkId {
            peer_id,
            gid: self.gid,
            mac: self.mac,
            qpn: self.qpn,
        }
    }
}

/// The peer's RMB element for this connection (RFC 7609 A.2.3/A.2.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerRmb {
    /// RKey of the peer's RMB on the link named in the message.
    pub rkey: u32,
    /// Virtual address of the peer's RMB on that link.
    pub vaddr: u64,
    /// Element index, 1..=255 (element i at `vaddr + (i-1)·size`, AMB-10).
    pub rmbe_idx: u8,
    /// Element size.
    pub size: BufSize,
    /// The peer's alert token: goes into every CDC we send.
    pub alert_token: u32,
}

/// Negotiated SMC-Rv2 parameters (SMCv2.1: release, limits and features).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct V2Params {
    /// Negotiated EID.
    pub eid: Eid,
    /// Negotiated release (0 = v2.0, 1 = v2.1).
    pub release: u8,
    /// Connections per link group (v2.1; 255 for v2.0).
    pub max_conns: u8,
    /// Links per link group (v2.1; 2 for v2.0).
    pub max_links: u8,
    /// Features both support.
    pub feature_mask: u16,
}

/// How the peer's RoCEv2 GID is reached (Linux `smc_ib_find_route`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct V2Route {
    /// Through a gateway (`v2_direct` = false).
    pub uses_gateway: bool,
    /// Next-hop MAC (the gateway's when `uses_gateway`).
    pub nexthop_mac: Mac,
}

/// Server: which link group a Proposal may join.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LgrQuery {
    /// The version chosen.
    pub version: Version,
    /// Peer ID from the Proposal. **Zero in v2-only Proposals** (Linux leaves the v1
    /// fields empty, linux-smc.md H3): match SMC-Rv2 link groups on the GID.
    pub peer_id: PeerId,
    /// The client's GID (v2: the RoCEv2 GID of the v2 extension).
    pub peer_gid: Gid,
    /// The client's MAC (zero in v2-only Proposals).
    pub peer_mac: Mac,
    /// v2 parameters (the link group must have been created with the same EID).
    pub v2: Option<V2Params>,
}

/// Server: answer to [`ClcEnv::server_find_lgr`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LgrLookup {
    /// No link group with this peer (server role, same version, not out of sync):
    /// first contact.
    None,
    /// A usable link group: subsequent contact on this link (RFC 7609 §3.5.2.1; the
    /// server may pick any active link, preferably the one matching the client's
    /// preferred GID/MAC).
    Join {
        /// The link group.
        lgr: LgrId,
        /// The chosen link's local side.
        link: LocalLink,
    },
    /// Link groups with this peer exist but none can take another connection (limit
    /// of connections or RMBs): a parallel link group is created (RFC 7609 §3.5.3).
    AllFull,
}

/// Server: what a new link group is created for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerLgrRequest {
    /// Version.
    pub version: Version,
    /// Peer ID from the Proposal (zero in v2-only Proposals).
    pub peer_id: PeerId,
    /// Client GID (v2: the v2 extension's RoCEv2 GID).
    pub peer_gid: Gid,
    /// Client MAC from the Proposal.
    pub peer_mac: Mac,
    /// v2 parameters.
    pub v2: Option<V2Params>,
    /// v2 route to the client's GID.
    pub route: Option<V2Route>,
}

/// Client: the Accept's view of the server's link, for classification (B.6.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcceptQuery {
    /// Version of the Accept.
    pub version: Version,
    /// The server's link identity (Peer ID, GID, MAC, QPN).
    pub server: PeerLinkId,
}

/// Client: answer to [`ClcEnv::client_lookup`].
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ClientLookup {
    /// A link group in client role with this peer (Peer ID) exists.
    pub lgr: Option<LgrId>,
    /// An *active* link whose server side equals the Accept's (Peer ID, GID, QPN, and
    /// MAC for v1), with its link group and our side of it.
    pub link: Option<(LgrId, LocalLink)>,
}

/// Client: what a new link group is created for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientLgrRequest {
    /// Version.
    pub version: Version,
    /// The server's Peer ID (from the Accept).
    pub peer_id: PeerId,
    /// The server's QP (from the Accept): the QP goes INIT → RTR with it (RFC 7609
    /// §3.5.1.3), ready for the CONFIRM LINK.
    pub server: PeerQp,
    /// v2 parameters.
    pub v2: Option<V2Params>,
    /// v2 route to the server's GID.
    pub route: Option<V2Route>,
}

/// An RMB element allocated for this connection (RFC 7609 §2.1, §4.1; initialised:
/// zeroed, eye catcher set when used, ready to receive — ACC-1, RE-3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RmbAlloc {
    /// The environment's name of it.
    pub rmb: RmbId,
    /// RKey of the RMB on the link named in the message.
    pub rkey: u32,
    /// Virtual address of the RMB on that link.
    pub vaddr: u64,
    /// Element index, 1..=255.
    pub rmbe_idx: u8,
    /// Element size.
    pub size: BufSize,
    /// Our alert token for the connection (the peer echoes it in CDCs).
    pub alert_token: u32,
    /// The RMB is not yet known to the peer on every link: CONFIRM RKEY first
    /// (RFC 7609 §3.5.2.1/§3.5.2.2; Linux SMC-Rv2 does it for every new connection).
    /// Ignored on first contact (the first CONFIRM LINK confirms it implicitly).
    pub needs_confirm_rkey: bool,
}

/// The environment's side of the rendezvous (see the module docs).
pub trait ClcEnv {
    /// Server: an existing link group this connection can join.
    fn server_find_lgr(&mut self, query: &LgrQuery) -> LgrLookup;

    /// Server, first contact: create a link group and its first link on the device of
    /// this route, the QP in INIT (RFC 7609 §3.5.1.2, CHECKLIST ACC-2).
    fn server_create_lgr(
        &mut self,
        req: &ServerLgrRequest,
    ) -> Result<(LgrId, LocalLink), DeclineCode>;

    /// Server, subsequent contact: the active link of `lgr` whose client side the
    /// Confirm names (any active link may be named, RFC 7609 §3.5.2.3).
    fn server_match_link(&mut self, lgr: LgrId, client: &PeerLinkId) -> Option<LinkId>;

    /// Server, first contact, Confirm processed: QP INIT → RTR → RTS with the client's
    /// QP, create the llc machine for the link group (it sends CONFIRM LINK) and give it
    /// the client's RMB (RFC 7609 §3.5.1.4, §3.5.1.5). The llc's progress comes back as
    /// [`LinkEvent`](super::LinkEvent)s.
    fn server_start_first_link(
        &mut self,
        lgr: LgrId,
        link: LinkId,
        peer_id: PeerId,
        client: &PeerQp,
    ) -> Result<(), DeclineCode>;

    /// Client: look the Accept's server link up (CHECKLIST B.6.3).
    fn client_lookup(&mut self, query: &AcceptQuery) -> ClientLookup;

    /// Client, first contact (or parallel link group): create a link group and its
    /// first link, QP INIT → RTR with the server's QP, the llc machine waiting for
    /// CONFIRM LINK (RFC 7609 §3.5.1.3). Its progress comes back as
    /// [`LinkEvent`](super::LinkEvent)s.
    fn client_create_lgr(
        &mut self,
        req: &ClientLgrRequest,
    ) -> Result<(LgrId, LocalLink), DeclineCode>;

    /// Allocate and initialise an RMB element for this connection on `lgr`, with its
    /// RKey/VA for `link` and an alert token. `first_contact`: the link group is new.
    fn alloc_rmb(
        &mut self,
        lgr: LgrId,
        link: LinkId,
        first_contact: bool,
    ) -> Result<RmbAlloc, DeclineCode>;

    /// Record the peer's RMB element for this connection on `link` (Linux
    /// `smc_rmb_rtoken_handling`). If the <RToken, index> is already used by another
    /// live connection of the link group, return it: the machine reports it for abort
    /// (RFC 7609 §4.4.2, CHECKLIST RE-8) and proceeds.
    fn register_peer_rmb(
        &mut self,
        lgr: LgrId,
        link: LinkId,
        peer: &PeerRmb,
    ) -> Result<Option<ConnRef>, DeclineCode>;

    /// How the peer's RoCEv2 GID is reached from this connection's source address,
    /// `None` without a route (Linux `smc_ib_find_route`).
    fn route_v2(&mut self, peer_gid: Gid) -> Option<V2Route>;

    /// Give back an RMB element from [`ClcEnv::alloc_rmb`] (rendezvous failed).
    fn free_rmb(&mut self, lgr: LgrId, rmb: RmbId);

    /// Tear down a link group this rendezvous created (rendezvous failed; RFC 7609
    /// §3.5.1.6.4): its links, QPs, RMBs and llc machine.
    fn abandon_lgr(&mut self, lgr: LgrId);

    /// Server: the client offered smc-rs's same-host path
    /// (`smc_wire::clc::samehost`). Prove that the client is on this host and set the
    /// connection's shared memory up with it (the runtime's Unix-socket exchange):
    /// [`ServerSameHost::Taken`] when done, [`ServerSameHost::Later`] when the exchange
    /// runs elsewhere and its outcome comes through
    /// [`super::Rendezvous::handle_same_host`], [`ServerSameHost::No`] to go on with
    /// SMC-R as if nothing had been offered. The default takes no offer.
    fn server_same_host(&mut self, _offer: &SameHostOffer) -> ServerSameHost {
        ServerSameHost::No
    }

    /// Client: the server (stack `server_stack`, from its Accept) took our same-host
    /// offer with this nonce. `true` when the shared memory for it is ready (the server
    /// set it up over the Unix socket before answering); `false` resets the connection.
    /// The default has none.
    fn client_same_host(&mut self, _nonce: u64, _server_stack: u64) -> bool {
        false
    }
}
