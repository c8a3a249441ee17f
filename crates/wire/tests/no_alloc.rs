//! Parsing does not touch the heap: a counting allocator wrapped around the system allocator
//! sees zero allocations while LLC, CDC and CLC messages are parsed on this thread.

use smc_wire::cdc::{CdcMessage, CdcRepr};
use smc_wire::clc::ClcMessage;
use smc_wire::llc::{LlcFormat, LlcMessage};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    // `const` thread-locals without destructors never allocate themselves.
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: interposes on the global allocator only to count calls; every call is forwarded
// unchanged to `System`, which upholds the `GlobalAlloc` contract.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn allocations_during(f: impl FnOnce()) -> usize {
    let before = ALLOCS.with(Cell::get);
    f();
    ALLOCS.with(Cell::get) - before
}

#[test]
fn parsing_does_not_allocate() {
    // Inputs are prepared (allocated) before counting starts.
    // A CONFIRM LINK v2 request as Linux sends it (k612-pair frame 17 layout).
    let mut confirm_link =
        hex("212c000352540099000100000000000000000000ffff0a630001000011010000010102ff");
    confirm_link.resize(44, 0);
    let add_link_v2 = hex("22580000525400990001000000000000000000000000ffff0a63000100001202036ac1d90000000000000000800000000000000000000000ffff0a63000100000000000000000100000003620000054fff22f8b0837a0000");
    let cdc = hex(
        "fe2c000100000101000000000000001000000000000000001000000000000000000000000000000000000000",
    );
    let proposal = hex("e2d4c3d901009c22000000000000000000000000000000000000000000000000000000000000000000000000000000000000001c00000000000000000000000000000000000000000000000000000000010000100000000000000000000000000000ffff0a630002ff020001000000000000000000000000534d432d504545522d5445535420202020202020202020202020202020202020e2d4c3d9");
    let fmt = LlcFormat::LINUX_X86;

    let n = allocations_during(|| {
        let m = LlcMessage::parse(&confirm_link, fmt).unwrap();
        assert!(m.is_v2());
        let a = LlcMessage::parse(&add_link_v2, fmt).unwrap();
        let LlcMessage::AddLink(a) = a else { panic!() };
        assert_eq!(a.ext.unwrap().rtokens.iter().count(), 1);
        let v = CdcMessage::new_checked(&cdc[..]).unwrap();
        assert_eq!(v.seqno(), 1);
        assert_eq!(CdcRepr::parse(&v).token, 0x101);
        let p = ClcMessage::parse(&proposal).unwrap();
        assert_eq!(p.buffer_len(), proposal.len());
    });
    assert_eq!(n, 0, "parsing allocated {n} times");

    // The counter works: a Vec allocates.
    assert!(allocations_during(|| drop(vec![0u8; 64])) >= 1);
}
