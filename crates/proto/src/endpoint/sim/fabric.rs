//! The simulated RNIC fabric: reliable-connected QPs that deliver work requests in
//! order per QP after a seeded delay, acknowledge signalled ones, and flush everything
//! once a QP has failed (IBA: the QP goes to the error state, outstanding work completes
//! with a flush error).

use super::{Ev, NodeId, World};

/// A work request on the wire.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Wr {
    /// RC SEND (CDC or LLC).
    Send {
        /// Completion id.
        wr_id: u64,
        /// Payload.
        bytes: Vec<u8>,
    },
    /// RDMA WRITE (unsignalled).
    Write {
        /// Remote key.
        rkey: u32,
        /// Remote address.
        addr: u64,
        /// Payload.
        data: Vec<u8>,
    },
}

/// A work request posted by a node on one of its QPs.
#[derive(Debug)]
pub(crate) struct Post {
    pub qpn: u32,
    pub wr: Wr,
}

/// QP numbers are unique in the world: the node (plus one, so that no QPN is below 2)
/// is in the high bits.
pub(crate) fn node_of_qpn(qpn: u32) -> NodeId {
    ((qpn >> 16) as usize).wrapping_sub(1)
}

impl World {
    /// Posts a work request: delivered at the peer in order after the earlier ones of
    /// the QP, its completion (SENDs are signalled) after that; flushed at once when the
    /// QP has failed or is not connected.
    pub(crate) fn post(&mut self, node: NodeId, p: Post) {
        let peer = self.nodes[node].qp_peer(p.qpn);
        let wr_id = match &p.wr {
            Wr::Send { wr_id, .. } => Some(*wr_id),
            Wr::Write { .. } => None,
        };
        let Some(peer_qpn) = peer else {
            if let Some(wr_id) = wr_id {
                let d = self.delay((1, 10));
                self.after(
                    d,
                    Ev::Complete {
                        node,
                        qpn: p.qpn,
                        wr_id,
                        ok: false,
                    },
                );
            }
            return;
        };
        let d = self.delay(self.delays.roce);
        let last = self
            .qp_last
            .get(&(node, p.qpn))
            .copied()
            .unwrap_or(self.now);
        let t = (self.now + d).max(last);
        self.qp_last.insert((node, p.qpn), t);
        let to = node_of_qpn(peer_qpn);
        self.at(
            t,
            Ev::Deliver {
                to,
                qpn: peer_qpn,
                wr: p.wr,
            },
        );
        if let Some(wr_id) = wr_id {
            // The ACK comes back after the delivery (RC completes in order).
            let ack = self.delay((1, 50));
            self.at(
                t + ack,
                Ev::Complete {
                    node,
                    qpn: p.qpn,
                    wr_id,
                    ok: true,
                },
            );
        }
    }

    /// A QP fails at both ends (a cut path): both nodes are told, in-flight work is
    /// flushed on delivery.
    pub(crate) fn fail_qp(&mut self, node: NodeId, qpn: u32) {
        let peer = self.nodes[node].qp_peer(qpn);
        let now = self.now;
        let out = self.nodes[node].qp_failed(now, qpn);
        self.carry(node, out);
        if let Some(pq) = peer {
            let pn = node_of_qpn(pq);
            let out = self.nodes[pn].qp_failed(now, pq);
            self.carry(pn, out);
        }
    }
}
