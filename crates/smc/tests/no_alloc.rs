//! The SMC-R data path does not touch the heap in steady state: after a warm-up (link
//! group up, RMBs and send buffers allocated, a few MiB each way), 64 KiB echo rounds,
//! 1-byte ping-pongs and streaming with full windows both ways between two stacks over the
//! software RNIC run with a counting global allocator seeing no allocation in any thread:
//! the application threads (copy into the sndbuf, RDMA WRITE + CDC posting, reads, driving
//! the RNIC while blocked), the RNIC's engine threads, the completion handlers (CDC
//! processing) and the stacks' event threads.
//!
//! To find what allocates, `SMC_NOALLOC_TRACE=<n>` prints the backtraces of the first n
//! allocations in the window (`cargo test --release -p smc --test no_alloc -- --nocapture`).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use smc::{SmcListener, SmcStream, Stack};

struct Counting;
/// Allocations (and reallocations) while [`ARMED`].
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
/// The measurement window is open.
static ARMED: AtomicBool = AtomicBool::new(false);
/// Backtraces still to print (from `SMC_NOALLOC_TRACE`, read before the window).
static TRACE_LEFT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread is printing a backtrace: its own allocations are not counted.
    static IN_TRACE: Cell<bool> = const { Cell::new(false) };
}

fn record(layout: Layout) {
    if !ARMED.load(Ordering::Relaxed) || IN_TRACE.with(Cell::get) {
        return;
    }
    ALLOCS.fetch_add(1, Ordering::Relaxed);
    if TRACE_LEFT.load(Ordering::Relaxed) == 0 {
        return;
    }
    if TRACE_LEFT
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
    {
        IN_TRACE.with(|t| t.set(true));
        let bt = std::backtrace::Backtrace::force_capture();
        let name = thread::current().name().map(str::to_owned);
        eprintln!(
            "allocation of {} bytes on thread {name:?} in the window:\n{bt}",
            layout.size()
        );
        IN_TRACE.with(|t| t.set(false));
    }
}

// SAFETY: interposes on the global allocator only to count calls; every call is
// forwarded unchanged to `System`, which upholds the `GlobalAlloc` contract.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record(layout);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record(layout);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Message size of the bulk rounds, and the echo server's read buffer.
const BULK: usize = 64 * 1024;

/// Two stacks over the software RNIC whatever `SMC_RS_TEST_PROVIDER` says (the property
/// is the data path's over this provider), without a tracing subscriber (events must
/// cost nothing here, as in an application that installs none).
fn stacks() -> (Stack, Stack) {
    let softroce = |local: &str, peer: &str| {
        let mut c = config(local, peer);
        c.provider = smc_softroce::SoftRoce::global();
        Stack::new(c).unwrap()
    };
    (
        softroce(&server_ip(), &client_ip()),
        softroce(&client_ip(), &server_ip()),
    )
}

/// Echoes everything back until EOF, with one buffer allocated up front.
fn echo(s: SmcStream) -> thread::JoinHandle<()> {
    thread::Builder::new()
        .name("echo".into())
        .spawn(move || {
            let mut buf = vec![0u8; BULK];
            loop {
                match (&s).read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if (&s).write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                }
            }
        })
        .unwrap()
}

/// Where the `i`th 64 KiB message starts in the pattern (shifted so that a stuck or
/// misplaced write shows as a mismatch).
fn msg(data: &[u8], i: usize) -> &[u8] {
    let off = i % 251;
    &data[off..off + BULK]
}

/// The client: the stream, and a writer thread that streams on request, so that both
/// directions run with full windows (blocked writers, the B flag, consumer updates).
struct Client {
    c: SmcStream,
    data: Arc<Vec<u8>>,
    back: Vec<u8>,
    go: Arc<Barrier>,
    /// 64 KiB messages the writer thread sends after the next `go`; 0 ends it.
    chunks: Arc<AtomicUsize>,
    writer: Option<thread::JoinHandle<()>>,
}

impl Client {
    fn new(c: SmcStream) -> Client {
        let data = Arc::new(pattern(7, BULK + 256));
        let go = Arc::new(Barrier::new(2));
        let chunks = Arc::new(AtomicUsize::new(0));
        let (w, d, g, k) = (
            c.try_clone().unwrap(),
            data.clone(),
            go.clone(),
            chunks.clone(),
        );
        let writer = thread::Builder::new()
            .name("writer".into())
            .spawn(move || loop {
                g.wait();
                let n = k.load(Ordering::SeqCst);
                if n == 0 {
                    return;
                }
                for i in 0..n {
                    (&w).write_all(msg(&d, i)).unwrap();
                }
            })
            .unwrap();
        Client {
            c,
            data,
            back: vec![0u8; BULK],
            go,
            chunks,
            writer: Some(writer),
        }
    }

    /// `bulk` messages of 64 KiB, each written and echoed back, then `pings` 1-byte
    /// round trips, then `stream` messages streamed while the echo is read.
    fn rounds(&mut self, bulk: usize, pings: usize, stream: usize) {
        let mut c = &self.c;
        for i in 0..bulk {
            c.write_all(msg(&self.data, i)).unwrap();
            c.read_exact(&mut self.back).unwrap();
            assert!(
                self.back == msg(&self.data, i),
                "echo mismatch in round {i}"
            );
        }
        for i in 0..pings {
            let b = [i as u8];
            c.write_all(&b).unwrap();
            let mut r = [0u8; 1];
            c.read_exact(&mut r).unwrap();
            assert_eq!(r, b, "ping {i}");
        }
        if stream > 0 {
            self.chunks.store(stream, Ordering::SeqCst);
            self.go.wait();
            for i in 0..stream {
                c.read_exact(&mut self.back).unwrap();
                assert!(self.back == msg(&self.data, i), "stream mismatch at {i}");
            }
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.chunks.store(0, Ordering::SeqCst);
        self.go.wait();
        if let Some(w) = self.writer.take() {
            w.join().unwrap();
        }
    }
}

#[test]
fn steady_state_data_path_does_not_allocate() {
    if let Ok(v) = std::env::var("SMC_NOALLOC_TRACE") {
        TRACE_LEFT.store(v.parse().unwrap_or(1).max(1), Ordering::Relaxed);
    }
    let (srv, cli) = stacks();
    let l = SmcListener::bind_with(&srv, (server_ip().as_str(), 0)).unwrap();
    let addr = l.local_addr().unwrap();
    let acceptor = thread::spawn(move || l.accept().unwrap().0);
    let c = SmcStream::connect_with(&cli, addr).unwrap();
    assert!(c.mode().is_smc(), "not SMC-R: {}", c.mode());
    let s = acceptor.join().unwrap();
    c.set_nodelay(true).unwrap();
    s.set_nodelay(true).unwrap();
    let server = echo(s);
    let mut client = Client::new(c);

    // Warm-up: link group, RMBs and send buffers in place; 12 MiB each way (both rings
    // wrap many times, windows fill), ping-pongs.
    client.rounds(128, 200, 64);

    // The window: rounds of 1 MiB echoed in 64 KiB messages, 125 pings and 1 MiB
    // streamed each way; at least 16 rounds and at least 1.2 s so that it spans the event
    // threads' periodic wake-ups (every 500 ms at most: timers, TEST LINK bookkeeping,
    // the idle TCP sockets) and not only the data path's own threads.
    let mut rounds = 0;
    let t0 = Instant::now();
    ARMED.store(true, Ordering::SeqCst);
    while rounds < 16 || t0.elapsed() < Duration::from_millis(1200) {
        client.rounds(16, 125, 16);
        rounds += 1;
    }
    ARMED.store(false, Ordering::SeqCst);
    let n = ALLOCS.load(Ordering::SeqCst);
    let took = t0.elapsed();
    println!("{n} allocations in {rounds} rounds, {took:?}");

    drop(client);
    server.join().unwrap();
    assert_eq!(
        n, 0,
        "{n} allocations in {rounds} rounds (1 MiB echoed in 64 KiB messages, 125 1-byte \
         round trips, 1 MiB streamed each way) in {took:?} (SMC_NOALLOC_TRACE=1 prints where)"
    );
}
