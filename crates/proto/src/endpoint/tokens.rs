//! Alert tokens (RFC 7609 §4.1, A.2.3) and the CDCs that arrive before their connection.
//!
//! A token is the only thing a CDC says about its connection, so tokens are random
//! 32-bit values: a peer cannot name a connection it was not told about (with sequential
//! tokens a peer with a link group of its own could guess the tokens of other peers'
//! connections and inject into them). Each token remembers the link group it was
//! allocated in, and a CDC counts only when it arrives on a link of that link group —
//! before and after its connection is attached.
//!
//! On subsequent contact the client may write as soon as its Confirm is out, so its
//! first CDCs can overtake the host's processing of that Confirm: they are kept with the
//! token (a few at most) and handed over when the connection is attached.
//!
//! The table is generic over the host's connection handle `C`: the runtime keeps it
//! behind its own lock on the CDC fast path (the completion thread), the simulator
//! keeps plain ids.

use std::collections::HashMap;

use rand::RngCore;

use crate::clc::LgrId;
use crate::conn::CdcRepr;

/// Most early CDCs kept per token (a well-behaved peer sends a handful at most before
/// the Confirm is processed: its window is our whole RMBE).
pub const MAX_EARLY_CDCS: usize = 64;
/// Most tokens in use at once (connections plus rendezvous of an endpoint).
pub const MAX_TOKENS: usize = 1 << 20;

/// What became of a received CDC (see [`TokenTable::route`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Route<C> {
    /// Deliver it to this connection.
    Conn(C),
    /// Kept until the connection is attached.
    Kept,
    /// Dropped: unknown token, another link group's token, or too many early CDCs.
    Dropped(DropReason),
}

/// Why a CDC was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// No connection or rendezvous has this token.
    UnknownToken,
    /// The token belongs to a connection of another link group.
    ForeignLinkGroup,
    /// [`MAX_EARLY_CDCS`] are kept already.
    TooManyEarly,
}

struct Slot<C> {
    lgr: LgrId,
    conn: Option<C>,
    early: Vec<CdcRepr>,
}

/// Token → connection (or rendezvous still running), with the early CDCs.
pub struct TokenTable<C> {
    map: HashMap<u32, Slot<C>>,
}

impl<C> Default for TokenTable<C> {
    fn default() -> Self {
        TokenTable {
            map: HashMap::new(),
        }
    }
}

impl<C: Clone> TokenTable<C> {
    /// A fresh token for a connection of link group `lgr`: random (from `rng`), never
    /// 0, never one in use. `None` when [`MAX_TOKENS`] are in use.
    pub fn alloc(&mut self, lgr: LgrId, rng: &mut dyn RngCore) -> Option<u32> {
        if self.map.len() >= MAX_TOKENS {
            return None;
        }
        loop {
            let t = rng.next_u32();
            if t == 0 || self.map.contains_key(&t) {
                continue;
            }
            self.map.insert(
                t,
                Slot {
                    lgr,
                    conn: None,
                    early: Vec::new(),
                },
            );
            return Some(t);
        }
    }

    /// Attaches the connection; returns the CDCs that arrived before it, in order.
    pub fn attach(&mut self, token: u32, conn: C) -> Vec<CdcRepr> {
        match self.map.get_mut(&token) {
            Some(s) => {
                s.conn = Some(conn);
                std::mem::take(&mut s.early)
            }
            None => Vec::new(),
        }
    }

    /// The attached connection of `token`, if the CDC came from its link group (the
    /// fast path: no change to the table).
    pub fn get(&self, token: u32, lgr: LgrId) -> Option<&C> {
        let s = self.map.get(&token)?;
        if s.lgr != lgr {
            return None;
        }
        s.conn.as_ref()
    }

    /// Routes a CDC that arrived on a link of `lgr`: to its connection, into the early
    /// queue of a token whose connection is not attached yet, or nowhere.
    pub fn route(&mut self, lgr: LgrId, msg: &CdcRepr) -> Route<C> {
        let Some(s) = self.map.get_mut(&msg.token) else {
            return Route::Dropped(DropReason::UnknownToken);
        };
        if s.lgr != lgr {
            return Route::Dropped(DropReason::ForeignLinkGroup);
        }
        if let Some(c) = &s.conn {
            return Route::Conn(c.clone());
        }
        if s.early.len() >= MAX_EARLY_CDCS {
            return Route::Dropped(DropReason::TooManyEarly);
        }
        s.early.push(*msg);
        Route::Kept
    }

    /// Forgets a token (its connection was released, or its rendezvous failed).
    pub fn release(&mut self, token: u32) {
        self.map.remove(&token);
    }

    /// Tokens in use.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// No token in use.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;
    use crate::conn::{ConnStateFlags, Cursor, ProducerFlags};

    fn cdc(token: u32, seq: u16) -> CdcRepr {
        CdcRepr {
            seqno: seq,
            token,
            prod: Cursor { wrap: 0, count: 0 },
            cons: Cursor { wrap: 0, count: 0 },
            prod_flags: ProducerFlags::empty(),
            conn_flags: ConnStateFlags::empty(),
        }
    }

    /// Issue 10 item 4: a peer must not be able to guess another connection's token
    /// (they used to be `generation << 16 | slot`, so the next one was known).
    #[test]
    fn tokens_are_unpredictable_and_unique() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let mut t: TokenTable<u32> = TokenTable::default();
        let toks: Vec<u32> = (0..64)
            .map(|_| t.alloc(LgrId(1), &mut rng).unwrap())
            .collect();
        assert!(toks.iter().all(|&x| x != 0));
        let mut uniq = toks.clone();
        uniq.sort_unstable();
        uniq.dedup();
        assert_eq!(uniq.len(), toks.len());
        // Sequential slots would keep the low half below 64 and the high half constant.
        assert!(toks.iter().any(|&x| x & 0xFFFF >= 64));
        assert!(toks.windows(2).any(|w| w[0] >> 16 != w[1] >> 16));
        assert_eq!(t.len(), 64);
        for x in toks {
            t.release(x);
        }
        assert!(t.is_empty());
    }

    /// Issue 10 item 4: early CDCs count only from the link group that owns the token,
    /// are handed over in order on attach, and are bounded; attached connections are
    /// reached only from their link group.
    #[test]
    fn early_cdcs_only_from_the_owning_link_group() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let mut t: TokenTable<&'static str> = TokenTable::default();
        let tok = t.alloc(LgrId(7), &mut rng).unwrap();
        assert_eq!(
            t.route(LgrId(8), &cdc(tok, 1)),
            Route::Dropped(DropReason::ForeignLinkGroup)
        );
        assert_eq!(
            t.route(LgrId(7), &cdc(tok.wrapping_add(1), 1)),
            Route::Dropped(DropReason::UnknownToken)
        );
        assert_eq!(t.route(LgrId(7), &cdc(tok, 1)), Route::Kept);
        assert_eq!(t.route(LgrId(7), &cdc(tok, 2)), Route::Kept);
        for i in 2..MAX_EARLY_CDCS as u16 {
            assert_eq!(t.route(LgrId(7), &cdc(tok, i + 1)), Route::Kept);
        }
        assert_eq!(
            t.route(LgrId(7), &cdc(tok, 999)),
            Route::Dropped(DropReason::TooManyEarly)
        );
        let early = t.attach(tok, "conn");
        assert_eq!(early.len(), MAX_EARLY_CDCS);
        assert_eq!(early[0].seqno, 1);
        assert_eq!(early[1].seqno, 2);
        assert_eq!(t.route(LgrId(7), &cdc(tok, 3)), Route::Conn("conn"));
        assert_eq!(t.get(tok, LgrId(7)), Some(&"conn"));
        assert_eq!(t.get(tok, LgrId(8)), None);
        assert_eq!(
            t.route(LgrId(8), &cdc(tok, 4)),
            Route::Dropped(DropReason::ForeignLinkGroup)
        );
    }
}
