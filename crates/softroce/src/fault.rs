//! Deterministic fault injection on the send path (CHECKLIST §C.10 MAP-5):
//! each packet is dropped, held back behind the next packet (reordered) or
//! sent twice, decided by a seeded RNG per QP so that a run is reproducible
//! for a given seed and traffic.

use crate::config::FaultConfig;

/// What to do with one outgoing packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    Send,
    Drop,
    Duplicate,
    Hold,
}

/// Per-QP injector state.
#[derive(Debug)]
pub(crate) struct FaultState {
    cfg: FaultConfig,
    rng: u64,
    /// A held packet waiting to go out after the next one.
    pub(crate) held: Option<Vec<u8>>,
}

impl FaultState {
    pub(crate) fn new(cfg: &FaultConfig, qpn: u32) -> FaultState {
        FaultState {
            cfg: cfg.clone(),
            rng: cfg.seed
                ^ (qpn as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
                ^ 0x5851_f42d_4c95_7f2d,
            held: None,
        }
    }

    /// splitmix64: small, fast, good enough for fault decisions.
    fn next_f64(&mut self) -> f64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    pub(crate) fn decide(&mut self) -> Fate {
        let r = self.next_f64();
        let c = &self.cfg;
        if r < c.loss {
            Fate::Drop
        } else if r < c.loss + c.reorder {
            if self.held.is_some() {
                Fate::Send
            } else {
                Fate::Hold
            }
        } else if r < c.loss + c.reorder + c.duplicate {
            Fate::Duplicate
        } else {
            Fate::Send
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_roughly_calibrated() {
        let cfg = FaultConfig {
            seed: 42,
            loss: 0.1,
            reorder: 0.05,
            duplicate: 0.05,
        };
        let mut a = FaultState::new(&cfg, 17);
        let mut b = FaultState::new(&cfg, 17);
        let mut drops = 0;
        for _ in 0..10_000 {
            let f = a.decide();
            assert_eq!(f, b.decide());
            drops += (f == Fate::Drop) as u32;
        }
        assert!((800..1200).contains(&drops), "{drops}");
    }
}
