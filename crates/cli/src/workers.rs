//! Threads that serve one connection each and are kept for the next one: a server that
//! spawned a thread per connection would charge every connection of a measured rate
//! with a thread's creation and teardown (tens of µs here, the same for every transport,
//! so ratios get flattered and absolute rates understated).
//!
//! A job goes to a thread that waits for work, or to a new thread when none waits, so
//! any number of connections can be served at once, as with a thread each.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};

type Job = Box<dyn FnOnce() + Send + 'static>;

struct Queue {
    jobs: VecDeque<Job>,
    /// Threads waiting for a job.
    idle: usize,
    /// No more jobs: waiting threads exit.
    closed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A job runs outside the lock: a panicking job cannot poison it.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A set of reusable worker threads.
pub struct Workers {
    name: String,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    /// No threads yet; they are named `name`.
    pub fn new(name: &str) -> Workers {
        Workers {
            name: name.to_string(),
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue {
                    jobs: VecDeque::new(),
                    idle: 0,
                    closed: false,
                }),
                ready: Condvar::new(),
            }),
            threads: Vec::new(),
        }
    }

    /// Runs `job` on a waiting thread, or on a new one when every thread is busy.
    pub fn run(&mut self, job: impl FnOnce() + Send + 'static) -> io::Result<()> {
        let mut q = self.shared.lock();
        q.jobs.push_back(Box::new(job));
        // Waiting threads that have not taken a job yet are still counted idle: each
        // queued job needs one of them.
        if q.idle >= q.jobs.len() {
            drop(q);
            self.shared.ready.notify_one();
            return Ok(());
        }
        drop(q);
        let shared = self.shared.clone();
        match thread::Builder::new()
            .name(self.name.clone())
            .spawn(move || work(&shared))
        {
            Ok(t) => {
                self.threads.push(t);
                Ok(())
            }
            Err(e) => {
                // Nobody will take it: drop it (its connection closes).
                self.shared.lock().jobs.pop_back();
                Err(e)
            }
        }
    }

    /// Threads started so far.
    #[cfg(test)]
    fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Waits until every job has run, then ends the threads.
    pub fn join(mut self) {
        self.shared.lock().closed = true;
        self.shared.ready.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn work(shared: &Shared) {
    loop {
        let job = {
            let mut q = shared.lock();
            loop {
                if let Some(j) = q.jobs.pop_front() {
                    break j;
                }
                if q.closed {
                    return;
                }
                q.idle += 1;
                q = shared.ready.wait(q).unwrap_or_else(PoisonError::into_inner);
                q.idle -= 1;
            }
        };
        job();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn sequential_jobs_reuse_one_thread() {
        let mut w = Workers::new("t-seq");
        let done = Arc::new(AtomicUsize::new(0));
        for i in 1..=50 {
            let d = done.clone();
            w.run(move || {
                d.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
            // The job is over before the next is queued, and its thread waits again.
            let t0 = std::time::Instant::now();
            while (done.load(Ordering::SeqCst) < i || w.shared.lock().idle == 0)
                && t0.elapsed() < Duration::from_secs(10)
            {
                thread::yield_now();
            }
        }
        assert_eq!(w.threads(), 1);
        w.join();
        assert_eq!(done.load(Ordering::SeqCst), 50);
    }

    #[test]
    fn concurrent_jobs_get_a_thread_each() {
        // Every job waits (at most 10 s) until all have started: with fewer threads
        // than jobs some would only start after the others gave up.
        let n = 8;
        let mut w = Workers::new("t-conc");
        let started = Arc::new(AtomicUsize::new(0));
        let met = Arc::new(AtomicUsize::new(0));
        for _ in 0..n {
            let (s, m) = (started.clone(), met.clone());
            w.run(move || {
                s.fetch_add(1, Ordering::SeqCst);
                let t0 = std::time::Instant::now();
                while s.load(Ordering::SeqCst) < n && t0.elapsed() < Duration::from_secs(10) {
                    thread::yield_now();
                }
                if s.load(Ordering::SeqCst) == n {
                    m.fetch_add(1, Ordering::SeqCst);
                }
            })
            .unwrap();
        }
        w.join();
        assert_eq!(met.load(Ordering::SeqCst), n);
    }

    #[test]
    fn join_runs_what_is_queued() {
        let mut w = Workers::new("t-join");
        let done = Arc::new(AtomicUsize::new(0));
        for _ in 0..20 {
            let d = done.clone();
            w.run(move || {
                thread::sleep(Duration::from_millis(1));
                d.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        }
        w.join();
        assert_eq!(done.load(Ordering::SeqCst), 20);
    }
}
