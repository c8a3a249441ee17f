//! Test hooks of the rendezvous machines (this crate's tests, and other crates with the
//! `testing` feature: the `clc_stream` fuzz target): the CLC stream reader and a fake
//! runtime ([`FakeEnv`]) with fixed client and server hosts.
//!
//! [`FakeEnv`] keeps link groups and RMB elements in memory, can be told to fail each
//! call, and asserts what a real runtime relies on: an RMB is freed and a link group
//! abandoned only once, and only if the machine allocated it.

use ::core::net::{IpAddr, Ipv4Addr};
use std::collections::BTreeMap;

use arrayvec::ArrayVec;
use smc_wire::common::{BufSize, Gid, HostName, Mac, PeerId, QpMtu, U24};
use smc_wire::decline::DeclineCode;

use super::*;

pub use super::reader::{ClcReader, Read};

/// The UEID both test hosts are configured with.
pub const UEID: &str = "SMC-PEER-TEST";

/// A UEID table from a comma-separated list.
pub fn ueids(list: &str) -> UeidTable {
    UeidTable::parse_list(list).unwrap()
}

/// Defaults plus one UEID and a host name.
pub fn cfg() -> ClcConfig {
    let mut c = ClcConfig::default();
    c.v2_config.ueids = ueids(UEID);
    c.hostname = HostName::new("smc-rs-test").unwrap();
    c
}

/// The RoCE MAC of test host `last`.
pub fn mac(last: u8) -> Mac {
    Mac([0x52, 0x54, 0, 0x99, 0, last])
}

/// The RoCEv2 GID (10.99.0.`last`) of test host `last`.
pub fn gid4(last: u8) -> Gid {
    Gid::from_ipv4(Ipv4Addr::new(10, 99, 0, last))
}

/// A peer ID on test host `last`.
pub fn pid(instance: u16, last: u8) -> PeerId {
    PeerId {
        instance,
        mac: mac(last),
    }
}

/// Host number of the client (10.99.0.2).
pub const CLIENT_HOST: u8 = 2;
/// Host number of the server (10.99.0.1).
pub const SERVER_HOST: u8 = 1;

/// The client host's route: v1 over IPv4 10.99.0.0/24 and v2, one device.
pub fn client_route() -> ClientRoute {
    let dev = LocalDevice {
        gid: gid4(CLIENT_HOST),
        mac: mac(CLIENT_HOST),
    };
    ClientRoute {
        peer_id: pid(0xb12d, CLIENT_HOST),
        v1: Some((
            dev,
            ProposalIp::V4 {
                subnet: Ipv4Addr::new(10, 99, 0, 0),
                prefix_len: 24,
            },
        )),
        v2: Some(ClientV2Route {
            device: dev,
            gid_list: ArrayVec::new(),
        }),
        same_host: None,
    }
}

/// The server host's route: v1 prefix 10.99.0.1/24 and v2.
pub fn server_route() -> ServerRoute {
    ServerRoute {
        peer_id: pid(0x0eef, SERVER_HOST),
        v1_prefixes: Some(vec![LocalPrefix {
            addr: IpAddr::V4(Ipv4Addr::new(10, 99, 0, SERVER_HOST)),
            prefix_len: 24,
        }]),
        v2: true,
        same_host: false,
    }
}

/// A link of a fake link group: ours, and the peer's side once known.
#[derive(Clone, Debug)]
pub struct FakeLink {
    pub local: LocalLink,
    pub peer: Option<PeerLinkId>,
}

/// A link group the fake runtime holds.
#[derive(Clone, Debug)]
pub struct FakeLgr {
    pub version: Version,
    pub peer_id: PeerId,
    pub peer_gid: Gid,
    pub links: Vec<FakeLink>,
    pub first_link_started: bool,
}

/// The runtime side, in memory: link groups with links, RMB elements, knobs to make
/// each call fail, and a record of what was given back.
#[derive(Debug)]
pub struct FakeEnv {
    pub host: u8,
    next: u64,
    pub lgrs: BTreeMap<LgrId, FakeLgr>,
    pub live_rmbs: BTreeMap<RmbId, LgrId>,
    pub abandoned: Vec<LgrId>,
    pub freed: Vec<RmbId>,
    pub fail_create: Option<DeclineCode>,
    pub fail_alloc: Option<DeclineCode>,
    pub fail_register: Option<DeclineCode>,
    pub fail_start: Option<DeclineCode>,
    pub conflict: Option<ConnRef>,
    pub needs_rkey: bool,
    pub route: Option<V2Route>,
    /// Server: report link groups as full (parallel link group).
    pub full: bool,
    pub mtu: QpMtu,
    pub rmbe_size: BufSize,
    /// Server: what `server_start_first_link` was given.
    pub started: Option<PeerQp>,
    /// Peer RMBs registered.
    pub registered: Vec<PeerRmb>,
    pub lgr_queries: Vec<LgrQuery>,
    pub server_requests: Vec<ServerLgrRequest>,
    pub client_requests: Vec<ClientLgrRequest>,
    /// Server: what to make of same-host offers.
    pub same_host_grant: super::ServerSameHost,
    /// Client: the shared memory of these nonces is ready.
    pub same_host_ready: Vec<u64>,
    /// Same-host offers the server was asked about.
    pub same_host_offers: Vec<smc_wire::clc::SameHostOffer>,
}

impl FakeEnv {
    pub fn new(host: u8) -> FakeEnv {
        FakeEnv {
            host,
            next: u64::from(host) * 1000,
            lgrs: BTreeMap::new(),
            live_rmbs: BTreeMap::new(),
            abandoned: Vec::new(),
            freed: Vec::new(),
            fail_create: None,
            fail_alloc: None,
            fail_register: None,
            fail_start: None,
            conflict: None,
            needs_rkey: false,
            route: Some(V2Route {
                uses_gateway: false,
                nexthop_mac: Mac([0xee; 6]),
            }),
            full: false,
            mtu: QpMtu::Mtu1024,
            rmbe_size: BufSize::encode(65536, BufSize::LINUX_MAX_CODE),
            started: None,
            registered: Vec::new(),
            lgr_queries: Vec::new(),
            server_requests: Vec::new(),
            client_requests: Vec::new(),
            same_host_grant: super::ServerSameHost::No,
            same_host_ready: Vec::new(),
            same_host_offers: Vec::new(),
        }
    }

    fn id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    fn new_link(&mut self) -> LocalLink {
        let n = self.id();
        LocalLink {
            link: LinkId(n as u32),
            gid: gid4(self.host),
            mac: mac(self.host),
            qpn: U24::new(0x11 + (n as u32 % 1000)).unwrap(),
            psn: U24::wrapping(0x64b13 + n as u32),
            mtu: self.mtu,
        }
    }

    /// Adds a second active link to `lgr` (for "the client picks another link").
    pub fn add_link(&mut self, lgr: LgrId, peer: Option<PeerLinkId>) -> LocalLink {
        let l = self.new_link();
        self.lgrs
            .get_mut(&lgr)
            .unwrap()
            .links
            .push(FakeLink { local: l, peer });
        l
    }

    /// Live link groups not abandoned.
    pub fn lgr_count(&self) -> usize {
        self.lgrs.len()
    }

    pub fn only_lgr(&self) -> LgrId {
        assert_eq!(self.lgrs.len(), 1, "{:?}", self.lgrs);
        *self.lgrs.keys().next().unwrap()
    }

    /// Records the peer side of our first link once the rendezvous completed (what the
    /// llc learns from CONFIRM LINK in the real runtime).
    pub fn learn_peer(&mut self, lgr: LgrId, peer: PeerLinkId) {
        if let Some(g) = self.lgrs.get_mut(&lgr) {
            if let Some(l) = g.links.first_mut() {
                l.peer.get_or_insert(peer);
            }
        }
    }
}

impl ClcEnv for FakeEnv {
    fn server_same_host(&mut self, offer: &smc_wire::clc::SameHostOffer) -> super::ServerSameHost {
        self.same_host_offers.push(*offer);
        self.same_host_grant
    }

    fn client_same_host(&mut self, nonce: u64, _server_stack: u64) -> bool {
        self.same_host_ready.contains(&nonce)
    }

    fn server_find_lgr(&mut self, q: &LgrQuery) -> LgrLookup {
        self.lgr_queries.push(q.clone());
        let found = self.lgrs.iter().find(|(_, g)| {
            g.version == q.version
                && match q.version {
                    Version::V1 => g.peer_id == q.peer_id,
                    Version::V2 => g.peer_gid == q.peer_gid,
                }
        });
        match found {
            Some(_) if self.full => LgrLookup::AllFull,
            Some((id, g)) => LgrLookup::Join {
                lgr: *id,
                link: g.links[0].local,
            },
            None => LgrLookup::None,
        }
    }

    fn server_create_lgr(
        &mut self,
        req: &ServerLgrRequest,
    ) -> Result<(LgrId, LocalLink), DeclineCode> {
        self.server_requests.push(req.clone());
        if let Some(c) = self.fail_create {
            return Err(c);
        }
        let id = LgrId(self.id());
        let link = self.new_link();
        self.lgrs.insert(
            id,
            FakeLgr {
                version: req.version,
                peer_id: req.peer_id,
                peer_gid: req.peer_gid,
                links: vec![FakeLink {
                    local: link,
                    peer: None,
                }],
                first_link_started: false,
            },
        );
        Ok((id, link))
    }

    fn server_match_link(&mut self, lgr: LgrId, client: &PeerLinkId) -> Option<LinkId> {
        let g = self.lgrs.get(&lgr)?;
        g.links
            .iter()
            .find(|l| {
                l.peer.is_some_and(|p| {
                    p.qpn == client.qpn
                        && p.gid == client.gid
                        && (g.version == Version::V2 || p.mac == client.mac)
                })
            })
            .map(|l| l.local.link)
    }

    fn server_start_first_link(
        &mut self,
        lgr: LgrId,
        link: LinkId,
        peer_id: PeerId,
        client: &PeerQp,
    ) -> Result<(), DeclineCode> {
        if let Some(c) = self.fail_start {
            return Err(c);
        }
        let g = self.lgrs.get_mut(&lgr).ok_or(DeclineCode::INTERR)?;
        let l = g
            .links
            .iter_mut()
            .find(|l| l.local.link == link)
            .ok_or(DeclineCode::INTERR)?;
        l.peer = Some(client.link_id(peer_id));
        g.first_link_started = true;
        self.started = Some(*client);
        Ok(())
    }

    fn client_lookup(&mut self, q: &AcceptQuery) -> ClientLookup {
        let mut out = ClientLookup::default();
        for (id, g) in &self.lgrs {
            if g.peer_id != q.server.peer_id {
                continue;
            }
            out.lgr.get_or_insert(*id);
            for l in &g.links {
                if let Some(p) = l.peer {
                    if p.qpn == q.server.qpn
                        && p.gid == q.server.gid
                        && (q.version == Version::V2 || p.mac == q.server.mac)
                    {
                        out.link = Some((*id, l.local));
                    }
                }
            }
        }
        out
    }

    fn client_create_lgr(
        &mut self,
        req: &ClientLgrRequest,
    ) -> Result<(LgrId, LocalLink), DeclineCode> {
        self.client_requests.push(req.clone());
        if let Some(c) = self.fail_create {
            return Err(c);
        }
        let id = LgrId(self.id());
        let link = self.new_link();
        self.lgrs.insert(
            id,
            FakeLgr {
                version: req.version,
                peer_id: req.peer_id,
                peer_gid: req.server.gid,
                links: vec![FakeLink {
                    local: link,
                    peer: Some(req.server.link_id(req.peer_id)),
                }],
                first_link_started: true,
            },
        );
        Ok((id, link))
    }

    fn alloc_rmb(
        &mut self,
        lgr: LgrId,
        _link: LinkId,
        first_contact: bool,
    ) -> Result<RmbAlloc, DeclineCode> {
        if let Some(c) = self.fail_alloc {
            return Err(c);
        }
        assert!(
            self.lgrs.contains_key(&lgr),
            "RMB for an unknown link group"
        );
        let n = self.id();
        let rmb = RmbId(n as u32);
        self.live_rmbs.insert(rmb, lgr);
        Ok(RmbAlloc {
            rmb,
            rkey: 0x300 + n as u32,
            vaddr: 0xff22_f8b0_837a_0000 + (n << 20),
            rmbe_idx: 1,
            size: self.rmbe_size,
            alert_token: n as u32,
            needs_confirm_rkey: self.needs_rkey && !first_contact,
        })
    }

    fn register_peer_rmb(
        &mut self,
        _lgr: LgrId,
        _link: LinkId,
        peer: &PeerRmb,
    ) -> Result<Option<ConnRef>, DeclineCode> {
        if let Some(c) = self.fail_register {
            return Err(c);
        }
        self.registered.push(*peer);
        Ok(self.conflict)
    }

    fn route_v2(&mut self, _peer_gid: Gid) -> Option<V2Route> {
        self.route
    }

    fn free_rmb(&mut self, lgr: LgrId, rmb: RmbId) {
        assert_eq!(
            self.live_rmbs.remove(&rmb),
            Some(lgr),
            "freeing an unknown RMB"
        );
        self.freed.push(rmb);
    }

    fn abandon_lgr(&mut self, lgr: LgrId) {
        assert!(
            self.lgrs.remove(&lgr).is_some(),
            "abandoning an unknown link group"
        );
        self.live_rmbs.retain(|_, l| *l != lgr);
        self.abandoned.push(lgr);
    }
}
