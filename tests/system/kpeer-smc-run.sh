#!/usr/bin/env bash
# System test (issue 13, mixed): an unmodified program under `smc run` — `ncat`, a
# Debian package — against the Linux 6.12 kernel's SMC-R echo server in QEMU
# (tests/kernel-peer/run.sh smc-server), over our software RNIC ↔ Linux rxe: two
# connections from two processes, 4 MiB each way, echo identical, SMC-Rv2 by the
# library's SMC_RS_STATS lines; the SMC-R TCP option in SYN and SYN-ACK (CHECK_OPTION=1,
# eBPF), smc_diag SMCR on the kernel's side, every RoCEv2 ICRC right (the harness's
# verdict). PLAN=run of tests/system/helpers/kpeer-smc-peer.sh.
# Exit 0 pass, 77 skip (with the reason) when this machine cannot run VMs, else fail.
# About 1.5 min under TCG with a warm cache.
set -u
cd "$(dirname "$0")/../.." || exit 1
TEST_NAME=kpeer-smc-run
. tests/system/lib/kpeer-linux.bash
kpeer_linux_prepare
[ -f "$(dirname "$SMC")/libsmc_preload.so" ] || cargo build --release -q -p smc-preload \
  || { echo "FAIL: build smc-preload"; exit 1; }
command -v ncat >/dev/null || skip "missing ncat (run scripts/setup.sh)"
kpeer_run run smc-server PLAN=run CHECK_OPTION=1
if [ "$FAILS" -gt 0 ]; then echo "$TEST_NAME: $FAILS run(s) failed"; exit 1; fi
echo "$TEST_NAME: all checks passed"
