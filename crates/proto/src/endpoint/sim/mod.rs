//! A seeded, deterministic simulator: several [`Endpoint`]s with their connections over a
//! simulated RNIC (reliable-connected QPs with in-order delivery per QP, RDMA WRITE into
//! registered memory, send completions) and simulated TCP (byte streams with FIN and
//! RST), driven by a simulated clock. Every delay comes from one seeded RNG, so a seed
//! replays exactly the same interleaving of TCP, RoCE, timers and applications: a
//! failing seed is a one-line reproduction (`SMC_SIM_SEED=<seed>`).
//!
//! The host glue here does what the runtime does (the `smc` crate's runtime): it implements
//! [`Host`], routes CDCs through a [`TokenTable`], drives each connection's `Conn`
//! machine (posting its RDMA WRITEs and CDC on the link's QP), and runs small scripted
//! applications (a client that sends and reads back, an echo server). What is
//! protocol stays in the endpoint and the machines under test.

mod fabric;
mod node;

#[cfg(test)]
mod tests;

use ::core::net::{IpAddr, Ipv4Addr};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{EndpointConfig, TcpId};
use crate::clc::{
    ClcConfig, ClientRoute, ClientV2Route, Eligibility, LocalDevice, LocalPrefix, ProposalIp,
    ServerRoute,
};
use crate::conn::ConnConfig;
use crate::llc::{self, DeviceId};

pub use self::fabric::Wr;
pub use self::node::{App, AppResult, Node};

use smc_wire::common::{Gid, Mac, PeerId, QpMtu};

/// A node's index in the world.
pub type NodeId = usize;

/// Delays of the simulated network, in microseconds (uniform in `[min, max]`).
#[derive(Clone, Copy, Debug)]
pub struct Delays {
    /// One TCP segment.
    pub tcp: (u64, u64),
    /// One RoCE work request (per QP, in order).
    pub roce: (u64, u64),
    /// An application's reaction (read, write, close).
    pub app: (u64, u64),
    /// A received LLC message waits this long for the event thread (the runtime hands
    /// LLC messages from the completion thread to its event thread; the RNIC has
    /// acknowledged them already).
    pub llc_hop: (u64, u64),
}

impl Default for Delays {
    fn default() -> Self {
        Delays {
            tcp: (20, 400),
            roce: (5, 300),
            app: (0, 200),
            llc_hop: (0, 100),
        }
    }
}

/// Something scheduled.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Ev {
    /// A work request arrives at the other end of a QP.
    Deliver { to: NodeId, qpn: u32, wr: Wr },
    /// A received LLC message reaches the node's event thread.
    LlcIn {
        to: NodeId,
        qpn: u32,
        bytes: Vec<u8>,
    },
    /// A work request's send completion (ok or flushed).
    Complete {
        node: NodeId,
        qpn: u32,
        wr_id: u64,
        ok: bool,
    },
    /// TCP bytes (empty + `fin`: the FIN; `rst`: a reset) arrive.
    Tcp {
        to: NodeId,
        tcp: TcpId,
        data: Vec<u8>,
        fin: bool,
        rst: bool,
    },
    /// A timer of a node may be due; a client connects; an application acts.
    Wake(NodeId),
    /// A client opens a connection to a server node.
    Connect {
        from: NodeId,
        to: NodeId,
        app: usize,
    },
    /// A link of a node fails (both ends see a QP error).
    FailLink { node: NodeId, qpn: u32 },
}

/// The simulated world.
pub struct World {
    /// The clock.
    pub now: Instant,
    start: Instant,
    /// The seed everything derives from.
    pub seed: u64,
    rng: StdRng,
    /// Delays.
    pub delays: Delays,
    /// The nodes.
    pub nodes: Vec<Node>,
    queue: BinaryHeap<Reverse<(Instant, u64, Ev)>>,
    seq: u64,
    /// TCP pairs: (node, tcp) → (peer node, peer tcp).
    pub(crate) tcp_peer: BTreeMap<(NodeId, TcpId), (NodeId, TcpId)>,
    /// When the last segment of each TCP direction arrives (in order).
    tcp_last: BTreeMap<(NodeId, TcpId), Instant>,
    /// When the last work request of each QP arrives (in order, RC).
    qp_last: BTreeMap<(NodeId, u32), Instant>,
    /// When the last LLC message reaches each node's event thread (in order).
    llc_last: BTreeMap<NodeId, Instant>,
    next_tcp: u64,
    /// Events processed.
    pub steps: u64,
    /// Early CDCs kept by some node (the race was reached).
    pub early_cdcs: u64,
}

/// An endpoint configuration for the simulator: Linux timers, small buffers.
pub fn config() -> EndpointConfig {
    EndpointConfig {
        clc: ClcConfig {
            v2: false,
            ..ClcConfig::default()
        },
        rmb_size: 16 * 1024,
        sndbuf_size: 16 * 1024,
        rmb_cache: 4,
        lgr_idle_timeout: Duration::from_secs(600),
        keepalive: Some(Duration::from_secs(30)),
        llc_reply_timeout: Duration::from_secs(2),
        add_link_retry: Duration::from_secs(60),
        failover: true,
    }
}

impl World {
    /// An empty world; `seed` decides every delay.
    pub fn new(seed: u64) -> World {
        let start = Instant::now();
        World {
            now: start,
            start,
            seed,
            rng: StdRng::seed_from_u64(seed),
            delays: Delays::default(),
            nodes: Vec::new(),
            queue: BinaryHeap::new(),
            seq: 0,
            tcp_peer: BTreeMap::new(),
            tcp_last: BTreeMap::new(),
            qp_last: BTreeMap::new(),
            llc_last: BTreeMap::new(),
            next_tcp: 1,
            steps: 0,
            early_cdcs: 0,
        }
    }

    /// Adds a node with one device at `10.0.0.<n+1>`.
    pub fn add_node(&mut self, cfg: EndpointConfig, conn: ConnConfig) -> NodeId {
        self.add_node_with_devices(cfg, conn, 1)
    }

    /// Adds a node with `devices` RDMA devices, at `10.0.<d>.<n+1>` (d = 0, 1, ...); with
    /// more than one, each may carry links ([`Endpoint::add_link_device`]).
    ///
    /// [`Endpoint::add_link_device`]: crate::endpoint::Endpoint::add_link_device
    pub fn add_node_with_devices(
        &mut self,
        cfg: EndpointConfig,
        conn: ConnConfig,
        devices: u8,
    ) -> NodeId {
        let id = self.nodes.len();
        let ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, id as u8 + 1));
        let seed = self.rng.random();
        self.nodes
            .push(Node::new(id, ip, cfg, conn, seed, devices.max(1)));
        id
    }

    /// Simulated time since the start.
    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    pub(crate) fn delay(&mut self, (lo, hi): (u64, u64)) -> Duration {
        Duration::from_micros(self.rng.random_range(lo..=hi))
    }

    pub(crate) fn at(&mut self, t: Instant, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse((t, self.seq, ev)));
    }

    /// Schedules `ev` after `d`.
    pub(crate) fn after(&mut self, d: Duration, ev: Ev) {
        let t = self.now + d;
        self.at(t, ev);
    }

    /// A client application on `from` connects to `to` after `after`.
    pub fn connect_at(&mut self, after: Duration, from: NodeId, to: NodeId, app: App) {
        let idx = self.nodes[from].add_app(app);
        self.after(after, Ev::Connect { from, to, app: idx });
    }

    /// Fails the link of `node` whose QP is `qpn` after `after`.
    pub fn fail_link_at(&mut self, after: Duration, node: NodeId, qpn: u32) {
        self.after(after, Ev::FailLink { node, qpn });
    }

    /// Opens a TCP connection from `from` to `to`: both ends get an id; the server
    /// accepts and the client connects at once (the handshake itself is not modelled).
    fn open_tcp(&mut self, from: NodeId, to: NodeId, app: usize) {
        let c = TcpId(self.next_tcp);
        let s = TcpId(self.next_tcp + 1);
        self.next_tcp += 2;
        self.tcp_peer.insert((from, c), (to, s));
        self.tcp_peer.insert((to, s), (from, c));
        let (cip, sip) = (self.nodes[from].ip, self.nodes[to].ip);
        let now = self.now;
        let out = self.nodes[to].accept(now, s, sip, cip);
        self.carry(to, out);
        let out = self.nodes[from].connect(now, c, cip, sip, app);
        self.carry(from, out);
    }

    /// Sends TCP bytes (or FIN/RST) from `node`'s end `tcp`, in order after what was sent
    /// before on it.
    pub(crate) fn tcp_send(
        &mut self,
        node: NodeId,
        tcp: TcpId,
        data: Vec<u8>,
        fin: bool,
        rst: bool,
    ) {
        let Some(&(to, ptcp)) = self.tcp_peer.get(&(node, tcp)) else {
            return;
        };
        let d = self.delay(self.delays.tcp);
        let last = self.tcp_last.get(&(node, tcp)).copied().unwrap_or(self.now);
        let t = (self.now + d).max(last);
        self.tcp_last.insert((node, tcp), t);
        self.at(
            t,
            Ev::Tcp {
                to,
                tcp: ptcp,
                data,
                fin,
                rst,
            },
        );
    }

    /// Carries out what a node asked for (its outbox), scheduling the effects.
    pub(crate) fn carry(&mut self, node: NodeId, out: node::Outbox) {
        for (tcp, data, fin, rst) in out.tcp {
            self.tcp_send(node, tcp, data, fin, rst);
        }
        for p in out.posts {
            self.post(node, p);
        }
        if out.wake {
            let d = self.delay(self.delays.app);
            self.after(d, Ev::Wake(node));
        }
        self.schedule_timer(node);
    }

    fn schedule_timer(&mut self, node: NodeId) {
        if let Some(t) = self.nodes[node].next_timer() {
            let t = t.max(self.now);
            self.at(t, Ev::Wake(node));
        }
    }

    /// Runs until nothing is scheduled or `limit` of simulated time passed. Returns the
    /// simulated time it took.
    pub fn run(&mut self, limit: Duration) -> Duration {
        let end = self.start + limit;
        while let Some(Reverse((t, _, ev))) = self.queue.pop() {
            if t > end {
                self.queue.push(Reverse((t, 0, ev)));
                break;
            }
            self.now = self.now.max(t);
            self.steps += 1;
            self.handle(ev);
            if self.nodes.iter().all(|n| n.quiet()) && self.only_timers_left() {
                break;
            }
        }
        self.elapsed()
    }

    /// Runs for `d` of simulated time, timers included, even when every node is quiet
    /// (to see what keepalive, retry and idle timers do).
    pub fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while let Some(Reverse((t, _, ev))) = self.queue.pop() {
            if t > end {
                self.queue.push(Reverse((t, 0, ev)));
                break;
            }
            self.now = self.now.max(t);
            self.steps += 1;
            self.handle(ev);
        }
        self.now = self.now.max(end);
    }

    /// Nothing but far timers (keepalive, idle) is scheduled.
    fn only_timers_left(&self) -> bool {
        self.queue.iter().all(|Reverse((t, _, ev))| {
            matches!(ev, Ev::Wake(_)) && *t > self.now + Duration::from_secs(20)
        })
    }

    fn handle(&mut self, ev: Ev) {
        let now = self.now;
        match ev {
            Ev::Connect { from, to, app } => self.open_tcp(from, to, app),
            Ev::Tcp {
                to,
                tcp,
                data,
                fin,
                rst,
            } => {
                let out = self.nodes[to].tcp_in(now, tcp, &data, fin, rst);
                self.carry(to, out);
            }
            Ev::Deliver {
                to,
                qpn,
                wr: Wr::Send { bytes, .. },
            } if bytes.first() != Some(&0xFE) => {
                let d = self.delay(self.delays.llc_hop);
                let last = self.llc_last.get(&to).copied().unwrap_or(now);
                let t = (now + d).max(last);
                self.llc_last.insert(to, t);
                self.at(t, Ev::LlcIn { to, qpn, bytes });
            }
            Ev::Deliver { to, qpn, wr } => {
                let (out, early) = self.nodes[to].deliver(now, qpn, wr);
                self.early_cdcs += early;
                self.carry(to, out);
            }
            Ev::LlcIn { to, qpn, bytes } => {
                let (out, _) = self.nodes[to].deliver(now, qpn, Wr::Send { wr_id: 0, bytes });
                self.carry(to, out);
            }
            Ev::Complete {
                node,
                qpn,
                wr_id,
                ok,
            } => {
                let out = self.nodes[node].complete(now, qpn, wr_id, ok);
                self.carry(node, out);
            }
            Ev::Wake(node) => {
                let out = self.nodes[node].wake(now);
                self.carry(node, out);
            }
            Ev::FailLink { node, qpn } => self.fail_qp(node, qpn),
        }
    }

    /// Client route facts of a node (one IPv4 subnet, 10.0.0.0/24).
    pub(crate) fn client_route(peer_id: PeerId, gid: Gid, mac: Mac) -> ClientRoute {
        ClientRoute {
            peer_id,
            v1: Some((
                LocalDevice { gid, mac },
                ProposalIp::V4 {
                    subnet: Ipv4Addr::new(10, 0, 0, 0),
                    prefix_len: 24,
                },
            )),
            v2: Some(ClientV2Route {
                device: LocalDevice { gid, mac },
                gid_list: Default::default(),
            }),
            same_host: None,
        }
    }

    /// Server route facts of a node.
    pub(crate) fn server_route(peer_id: PeerId, ip: IpAddr) -> ServerRoute {
        ServerRoute {
            peer_id,
            v1_prefixes: Some(vec![LocalPrefix {
                addr: ip,
                prefix_len: 24,
            }]),
            v2: true,
            same_host: false,
        }
    }
}

/// The one device of a node.
pub(crate) const DEVICE: DeviceId = DeviceId(0);
/// Path MTU of the simulated devices.
pub(crate) const MTU: QpMtu = QpMtu::Mtu1024;
/// Everyone is CLC-eligible in the simulator.
pub(crate) fn eligible() -> Eligibility {
    Eligibility::PolicyOverride {
        pattern: "sim".into(),
    }
}

/// The link id type, re-exported for scenarios.
pub type LinkId = llc::LinkId;
