#!/usr/bin/env bash
# System test (issue 10, RdmaBuffer soundness): the smc-verbs RdmaBuffer tests under
# ThreadSanitizer. Two safe threads copy into and out of overlapping ranges of one buffer, and
# RDMA atomics on a word race with copies of its neighbours; with every access an atomic
# access to the aligned 8-byte word (crates/verbs/src/mem.rs) TSan must report no data race
# (with plain memcpy copies it reports one in RdmaBuffer::read/write). Needs the nightly
# toolchain (the TSan runtime ships with its rust-std); about a minute to build.
# Exit 0 pass, 77 skip (with the reason), anything else fail.
set -u
cd "$(dirname "$0")/../.." || exit 1
skip() {
	echo "SKIP tsan-rdma-buffer: $*"
	exit 77
}
command -v rustup >/dev/null || skip "rustup is not installed"
rustup toolchain list 2>/dev/null | grep -q '^nightly' || skip "no nightly toolchain (rustup toolchain install nightly)"
sysroot=$(rustup run nightly rustc --print sysroot 2>/dev/null) || skip "nightly rustc does not run"
ls "$sysroot"/lib/rustlib/x86_64-unknown-linux-gnu/lib/*rt.tsan.a >/dev/null 2>&1 ||
	skip "the nightly toolchain has no ThreadSanitizer runtime for x86_64-unknown-linux-gnu"
target_dir=${CARGO_TARGET_DIR:-target}/tsan
out=$(RUSTFLAGS="-Zsanitizer=thread -Cunsafe-allow-abi-mismatch=sanitizer" \
	TSAN_OPTIONS="halt_on_error=1 suppressions=$PWD/tests/system/lib/tsan-std.supp" \
	cargo +nightly test -q -p smc-verbs --target x86_64-unknown-linux-gnu \
	--target-dir "$target_dir" mem:: 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
	echo "$out" | grep -E "WARNING: ThreadSanitizer|SUMMARY|panicked|error" | head -20
	echo "FAIL tsan-rdma-buffer: exit $rc"
	exit 1
fi
echo "$out" | grep "test result"
echo "PASS tsan-rdma-buffer: no data race in RdmaBuffer under ThreadSanitizer"
