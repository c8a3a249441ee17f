//! The connections' timers as one queue, so that the event thread finds the due ones
//! and its next deadline without looking at every connection (issue 15: with 10,000
//! connections, a scan of all of them on every wake-up made opening them quadratic).
//!
//! A connection's deadline (`ConnState::armed`) changes on whatever thread drives it.
//! It enters the queue only when it is earlier than the entry the connection already
//! has there (`ConnState::queued`); a later deadline waits until that entry is due and
//! is queued then. So a connection has at most one live entry; entries superseded by an
//! earlier one stay until their time and are recognised as stale (their instant is not
//! the connection's `queued`).
//!
//! The queue also knows until when the event thread sleeps ([`TimerQueue::plan_sleep`]),
//! so that a connection wakes it only for a deadline before that ([`TimerQueue::push`]):
//! a closing connection's timer (RFC 7609 §4.8's wait for the peer's close, 60 s)
//! otherwise woke it once per connection for nothing (issue 15).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Mutex;
use std::time::Instant;

/// Deadlines by alert token, earliest first.
#[derive(Default)]
pub(crate) struct TimerQueue {
    heap: Mutex<Heap>,
}

struct Heap {
    entries: BinaryHeap<Reverse<(Instant, u32)>>,
    /// When the event thread's next sleep ends at the latest (`None`: not planned yet).
    sleep_until: Option<Instant>,
}

/// Entries the queue has room for from the start (1.5 KiB): a stack's first timer, which
/// may be armed by a data-path call long after its connections were set up, allocates
/// nothing there. Beyond it the heap grows once to its high-water mark and keeps it.
const INITIAL_ENTRIES: usize = 64;

impl Default for Heap {
    fn default() -> Heap {
        Heap {
            entries: BinaryHeap::with_capacity(INITIAL_ENTRIES),
            sleep_until: None,
        }
    }
}

impl TimerQueue {
    /// Queues `token`'s deadline `at`. True if the event thread must be woken for it:
    /// it sleeps past `at` (its plan was made before this entry; one made after it sees
    /// the entry, both under the queue's lock).
    #[must_use]
    pub(crate) fn push(&self, at: Instant, token: u32) -> bool {
        match self.heap.lock() {
            Ok(mut h) => {
                h.entries.push(Reverse((at, token)));
                h.sleep_until.is_none_or(|s| at < s)
            }
            Err(_) => true,
        }
    }

    /// The event thread is about to sleep until `until` at the latest: returns the
    /// earlier of that and the earliest queued deadline, and remembers it for
    /// [`TimerQueue::push`].
    pub(crate) fn plan_sleep(&self, until: Instant) -> Instant {
        let Ok(mut h) = self.heap.lock() else {
            return until;
        };
        let at = match h.entries.peek() {
            Some(Reverse((at, _))) => until.min(*at),
            None => until,
        };
        h.sleep_until = Some(at);
        at
    }

    /// The earliest entry, if it is due at `now`, taken out of the queue.
    pub(crate) fn pop_due(&self, now: Instant) -> Option<(Instant, u32)> {
        let mut h = self.heap.lock().ok()?;
        match h.entries.peek() {
            Some(Reverse((at, _))) if *at <= now => h.entries.pop().map(|Reverse(e)| e),
            _ => None,
        }
    }

    /// The earliest deadline queued (possibly a stale one: an early look is harmless).
    pub(crate) fn next(&self) -> Option<Instant> {
        self.heap
            .lock()
            .ok()?
            .entries
            .peek()
            .map(|Reverse((at, _))| *at)
    }

    /// Entries queued, stale ones included.
    pub(crate) fn len(&self) -> usize {
        self.heap.lock().map(|h| h.entries.len()).unwrap_or(0)
    }

    /// Drops the entries of connections that are gone. A closing connection usually
    /// leaves an entry behind (its close timer, 60 s), so without this a stream of short
    /// connections would hold a minute's worth of them; called when they outnumber the
    /// live connections (amortised constant cost per connection, and no allocation:
    /// the heap keeps its capacity).
    pub(crate) fn retain_tokens(&self, mut live: impl FnMut(u32) -> bool) {
        if let Ok(mut h) = self.heap.lock() {
            h.entries.retain(|Reverse((_, t))| live(*t));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn due_entries_come_out_earliest_first_and_others_stay() {
        let q = TimerQueue::default();
        let t0 = Instant::now();
        let _ = q.push(t0 + Duration::from_millis(30), 3);
        let _ = q.push(t0 + Duration::from_millis(10), 1);
        let _ = q.push(t0 + Duration::from_millis(20), 2);
        assert_eq!(q.next(), Some(t0 + Duration::from_millis(10)));
        assert_eq!(q.pop_due(t0), None);
        let now = t0 + Duration::from_millis(25);
        assert_eq!(q.pop_due(now), Some((t0 + Duration::from_millis(10), 1)));
        assert_eq!(q.pop_due(now), Some((t0 + Duration::from_millis(20), 2)));
        assert_eq!(q.pop_due(now), None);
        assert_eq!(q.len(), 1);
        assert_eq!(q.next(), Some(t0 + Duration::from_millis(30)));
    }

    #[test]
    fn entries_of_gone_connections_are_dropped() {
        let q = TimerQueue::default();
        let t0 = Instant::now();
        for t in 0..10u32 {
            let _ = q.push(t0 + Duration::from_millis(u64::from(t)), t);
        }
        q.retain_tokens(|t| t % 2 == 0);
        assert_eq!(q.len(), 5);
        let late = t0 + Duration::from_secs(1);
        let got: Vec<u32> = std::iter::from_fn(|| q.pop_due(late).map(|(_, t)| t)).collect();
        assert_eq!(got, vec![0, 2, 4, 6, 8]);
    }

    #[test]
    fn only_a_deadline_before_the_planned_sleep_asks_for_a_wake_up() {
        let q = TimerQueue::default();
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        // No plan yet: the event thread may sleep for ever.
        assert!(q.push(ms(60_000), 1));
        // The plan takes the earliest entry into account.
        assert_eq!(q.plan_sleep(ms(500)), ms(500));
        assert!(q.push(ms(100), 2));
        assert_eq!(q.plan_sleep(ms(500)), ms(100));
        // Later than the plan, or at it: the event thread sees it when it wakes.
        assert!(!q.push(ms(100), 3));
        assert!(!q.push(ms(60_000), 4));
        assert!(q.push(ms(99), 5));
    }
}
