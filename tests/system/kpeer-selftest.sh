#!/usr/bin/env bash
# System test: the kernel-peer harness (tests/kernel-peer) boots two Linux 6.12
# VMs under QEMU and they talk SMC-R to each other over rxe: two connections
# (the second reuses the link group), data echoed and verified, smc_diag mode
# SMCR on both kernels, every RoCEv2 ICRC checked, kernel logs scanned.
# Exit 0 pass, 77 skip (with the reason) when this machine cannot run VMs,
# anything else fail. About 25 s with a warm cache, ~50 s on a clean machine.
set -u
cd "$(dirname "$0")/../.." || exit 1
skip() {
	echo "SKIP kpeer-selftest: $*"
	exit 77
}
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, tap devices)"
command -v qemu-system-x86_64 >/dev/null 2>&1 || skip "qemu-system-x86_64 is not installed (scripts/setup.sh installs it)"
[ -e /dev/net/tun ] || skip "no /dev/net/tun"
probe=kpeer-probe-$$
ip netns add "$probe" 2>/dev/null || skip "cannot create network namespaces"
ip netns del "$probe"

out=$(mktemp -d /tmp/kpeer-selftest.XXXXXX)
log=$out.log
timeout 600 tests/kernel-peer/run.sh smc-pair SIZES=4096,64k OUT="$out" NO_INSTALL=1 >"$log" 2>&1
rc=$?
grep -E '^(FAIL|WARN|VERDICT)' "$log"
grep -E 'timings:' "$log"
case $rc in
0)
	rm -rf "$out" "$log"
	echo "kpeer-selftest: passed"
	exit 0
	;;
4)
	reason=$(grep -m1 'cannot run here' "$log" | sed 's/.*cannot run here: //')
	rm -rf "$out" "$log"
	skip "${reason:-the harness cannot run on this machine}"
	;;
*)
	echo "kpeer-selftest: FAILED (run.sh exit $rc); harness output:"
	tail -n 60 "$log"
	echo "artefacts kept in $out"
	exit 1
	;;
esac
