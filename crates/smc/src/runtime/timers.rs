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

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Mutex;
use std::time::Instant;

/// Deadlines by alert token, earliest first.
#[derive(Default)]
pub(crate) struct TimerQueue {
    heap: Mutex<BinaryHeap<Reverse<(Instant, u32)>>>,
}

impl TimerQueue {
    /// Queues `token`'s deadline `at`.
    pub(crate) fn push(&self, at: Instant, token: u32) {
        if let Ok(mut h) = self.heap.lock() {
            h.push(Reverse((at, token)));
        }
    }

    /// The earliest entry, if it is due at `now`, taken out of the queue.
    pub(crate) fn pop_due(&self, now: Instant) -> Option<(Instant, u32)> {
        let mut h = self.heap.lock().ok()?;
        match h.peek() {
            Some(Reverse((at, _))) if *at <= now => h.pop().map(|Reverse(e)| e),
            _ => None,
        }
    }

    /// The earliest deadline queued (possibly a stale one: an early look is harmless).
    pub(crate) fn next(&self) -> Option<Instant> {
        self.heap.lock().ok()?.peek().map(|Reverse((at, _))| *at)
    }

    /// Entries queued, stale ones included.
    pub(crate) fn len(&self) -> usize {
        self.heap.lock().map(|h| h.len()).unwrap_or(0)
    }

    /// Drops the entries of connections that are gone. A closing connection usually
    /// leaves an entry behind (its close timer, 60 s), so without this a stream of short
    /// connections would hold a minute's worth of them; called when they outnumber the
    /// live connections (amortised constant cost per connection, and no allocation:
    /// the heap keeps its capacity).
    pub(crate) fn retain_tokens(&self, mut live: impl FnMut(u32) -> bool) {
        if let Ok(mut h) = self.heap.lock() {
            h.retain(|Reverse((_, t))| live(*t));
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
        q.push(t0 + Duration::from_millis(30), 3);
        q.push(t0 + Duration::from_millis(10), 1);
        q.push(t0 + Duration::from_millis(20), 2);
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
            q.push(t0 + Duration::from_millis(u64::from(t)), t);
        }
        q.retain_tokens(|t| t % 2 == 0);
        assert_eq!(q.len(), 5);
        let late = t0 + Duration::from_secs(1);
        let got: Vec<u32> = std::iter::from_fn(|| q.pop_due(late).map(|(_, t)| t)).collect();
        assert_eq!(got, vec![0, 2, 4, 6, 8]);
    }
}
