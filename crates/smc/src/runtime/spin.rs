//! An adaptive spin budget: how long a blocking call looks for its peer's answer
//! without sleeping (a same-host connection on its ring, an SMC-R connection on its
//! RNIC through `DeviceOps::drive`). Spinning saves the sleeping thread's wake-up — on
//! the 2-CPU development VM a wake-up costs ~30 µs, more than a whole same-host round
//! trip — at the price of CPU while nothing comes, so the budget adapts (docs/
//! samehost.md "Waking", docs/core-design.md "Receiving readers").

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The budget of one connection: between a sixteenth of `max` and all of it.
pub(crate) struct SpinBudget {
    ns: AtomicU64,
    max: Duration,
}

impl SpinBudget {
    /// Starts at `max` (zero: never spin).
    pub(crate) fn new(max: Duration) -> SpinBudget {
        SpinBudget {
            ns: AtomicU64::new(max.as_nanos() as u64),
            max,
        }
    }

    /// How long the next wait may spin.
    pub(crate) fn get(&self) -> Duration {
        Duration::from_nanos(self.ns.load(Ordering::Relaxed))
    }

    /// After a wait that ended with its answer after `waited` (spin and sleep together;
    /// `None` for a wait that ended without one: a drive that ran out, a timeout, which
    /// counts as long however short it was): an answer within twice the
    /// longest spin puts the budget back to the maximum — spinning that long would have
    /// caught it or nearly, and the measured wait includes this thread's own wake-up
    /// when the spin was shorter (~30 µs on the development VM), so a bound of one spin
    /// would keep two peers whose budgets both decayed at the floor for good — while a
    /// longer wait halves it, down to a sixteenth: an idle connection costs little CPU,
    /// a busy one gets its answers without a wake-up.
    pub(crate) fn adapt(&self, waited: Option<Duration>) {
        let max = self.max.as_nanos() as u64;
        let next = if waited.is_some_and(|w| w <= self.max.saturating_mul(2)) {
            max
        } else {
            (self.ns.load(Ordering::Relaxed) / 2).max(max / 16)
        };
        self.ns.store(next, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_waits_halve_the_budget_down_to_a_sixteenth_and_a_quick_answer_restores_it() {
        let b = SpinBudget::new(Duration::from_micros(64));
        assert_eq!(b.get(), Duration::from_micros(64));
        b.adapt(Some(Duration::from_millis(5)));
        assert_eq!(b.get(), Duration::from_micros(32));
        for _ in 0..10 {
            b.adapt(Some(Duration::from_millis(5)));
        }
        assert_eq!(b.get(), Duration::from_micros(4));
        // An answer soon after a short spin (this thread's wake-up included) restores it.
        b.adapt(Some(Duration::from_micros(128)));
        assert_eq!(b.get(), Duration::from_micros(64));
        b.adapt(Some(Duration::from_micros(129)));
        assert_eq!(b.get(), Duration::from_micros(32));
        // A wait that ended without its answer (a drive that ran out) never restores.
        b.adapt(None);
        assert_eq!(b.get(), Duration::from_micros(16));
        let off = SpinBudget::new(Duration::ZERO);
        off.adapt(Some(Duration::from_millis(1)));
        assert_eq!(off.get(), Duration::ZERO);
    }
}
