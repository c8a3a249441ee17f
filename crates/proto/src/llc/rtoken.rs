//! The RToken set of a link group, both directions (RFC 7609 §2.1, §3.5.5.2; CHECKLIST
//! RKM-0).
//!
//! An RMB has one RToken (RKey + virtual address) per link, because every link has its own
//! QP and protection domain. Local RMBs are named by the runtime's [`RmbId`]; peer RMBs get
//! a [`PeerRmbId`] from the machine and are found by their RKey on any link (the way LLC
//! messages and CLC name them).

use std::collections::BTreeMap;

use super::{LinkId, PeerRmbId, RmbId};

/// An RMB's RKey and virtual address on one link.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct RToken {
    /// Remote key of the memory region on that link's protection domain.
    pub rkey: u32,
    /// Virtual address of the RMB's first byte on that link.
    pub vaddr: u64,
}

/// What the peer knows about one of our RMBs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum LocalState {
    /// Not announced yet (a CONFIRM RKEY exchange is queued).
    Pending,
    /// CONFIRM RKEY (+ CONT) in flight.
    Confirming,
    /// The peer has its RToken on every link.
    Confirmed,
    /// DELETE RKEY queued or in flight.
    Deleting,
}

#[derive(Clone, Debug)]
pub(super) struct LocalRmb {
    pub tokens: BTreeMap<LinkId, RToken>,
    pub state: LocalState,
    /// CONFIRM RKEY attempts answered negatively with the retry flag.
    pub retries: u8,
}

#[derive(Clone, Debug, Default)]
pub(super) struct PeerRmb {
    pub tokens: BTreeMap<LinkId, RToken>,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Rtokens {
    pub local: BTreeMap<RmbId, LocalRmb>,
    pub peer: BTreeMap<PeerRmbId, PeerRmb>,
    next_peer: u32,
}

impl Rtokens {
    /// The peer RMB whose RKey on `link` is `rkey`.
    pub fn find_peer(&self, link: LinkId, rkey: u32) -> Option<PeerRmbId> {
        self.peer
            .iter()
            .find(|(_, p)| p.tokens.get(&link).is_some_and(|t| t.rkey == rkey))
            .map(|(id, _)| *id)
    }

    /// Records a new peer RMB.
    pub fn add_peer(&mut self, tokens: BTreeMap<LinkId, RToken>) -> PeerRmbId {
        self.next_peer = self.next_peer.wrapping_add(1);
        while self.peer.contains_key(&PeerRmbId(self.next_peer)) {
            self.next_peer = self.next_peer.wrapping_add(1);
        }
        let id = PeerRmbId(self.next_peer);
        self.peer.insert(id, PeerRmb { tokens });
        id
    }

    /// Forgets every token of a link that is gone.
    pub fn drop_link(&mut self, link: LinkId) {
        for r in self.local.values_mut() {
            r.tokens.remove(&link);
        }
        for r in self.peer.values_mut() {
            r.tokens.remove(&link);
        }
    }

    /// Local RMBs the peer knows (they go into ADD LINK v2 / ADD LINK CONTINUATION): the
    /// confirmed ones, including those whose DELETE RKEY is still queued.
    pub fn known_local(&self) -> impl Iterator<Item = (&RmbId, &LocalRmb)> {
        self.local
            .iter()
            .filter(|(_, r)| matches!(r.state, LocalState::Confirmed | LocalState::Deleting))
    }
}
