//! Steady state does not touch the heap: after a warm-up, hundreds of
//! RDMA WRITE + inline SEND round trips (segmentation, ICRC, sendmmsg,
//! recvmmsg, ACKs, completions, CQ notification) run with a counting global
//! allocator seeing no allocation in any thread (application or engines).

mod common;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use smc_softroce::Config;
use smc_verbs::*;

struct Counting;
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: interposes on the global allocator only to count calls; every call
// is forwarded unchanged to `System`, which upholds the `GlobalAlloc`
// contract.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn steady_state_does_not_allocate() {
    let o = Opts::default();
    let (a, b) = pair(96, &Config::default(), &o);
    let src = buf(64 << 10);
    fill_pattern(&src, 96);
    let smr = a.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = buf(128 << 10);
    let dmr =
        b.pd.reg_mr(&dst, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    let wsge = [smr.sge(0, 64 << 10)];
    let ssge = [smr.sge(0, 44)];
    let rsge = [dmr.sge(64 << 10, 64)];
    let round = || {
        b.qp.post_recv(&RecvWr {
            wr_id: 1,
            sg_list: &rsge,
        })
        .unwrap();
        a.qp.post_send_batch(&[
            SendWr {
                wr_id: 1,
                op: SendOp::RdmaWrite {
                    remote_addr: dmr.addr(),
                    rkey: dmr.rkey(),
                },
                sg_list: &wsge,
                flags: SendFlags::empty(),
            },
            SendWr {
                wr_id: 2,
                op: SendOp::Send,
                sg_list: &ssge,
                flags: SendFlags::SIGNALED | SendFlags::INLINE,
            },
        ])
        .unwrap();
        assert_eq!(wait_wc(&b.rcq, T).status, WcStatus::Success);
        assert_eq!(wait_wc(&a.scq, T).status, WcStatus::Success);
    };
    for _ in 0..100 {
        round();
    }
    engines_started();
    let before = ALLOCS.load(Ordering::Relaxed);
    for _ in 0..500 {
        round();
    }
    let n = ALLOCS.load(Ordering::Relaxed) - before;
    assert_eq!(
        n, 0,
        "{n} allocations in 500 steady-state rounds (8500 packets)"
    );
}

/// Waits until every engine thread of this process has started and sleeps in its loop.
/// The application drives the RNIC itself here, so an engine thread may not have run at
/// all yet on a loaded machine, and std's start-up of a thread allocates (its name for
/// the stack-overflow handler, its thread-locals): that must not count as the steady
/// state's (seen under CI load: 3-5 allocations, all in an engine thread's start).
fn engines_started() {
    let t0 = std::time::Instant::now();
    loop {
        let mut engines = 0;
        let mut asleep = 0;
        for e in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
            if !comm.trim_end().ends_with("-engine") {
                continue;
            }
            engines += 1;
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            // The state follows the parenthesised name: "tid (comm) S ...".
            let state = stat.rsplit_once(") ").and_then(|(_, r)| r.chars().next());
            if state == Some('S') {
                asleep += 1;
            }
        }
        if engines == 2 && asleep == engines {
            return;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "engine threads: {engines} found, {asleep} asleep"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
