#!/usr/bin/env bash
# System test (issue 17): smc-bpf's sock_ops program (crates/bpf/bpf/smc_option.bpf.c) on
# Debian's Linux 6.12, the kernel of the kernel-peer VMs. Each kernel's verifier judges the
# program anew (6.12 rejected a loop that newer kernels accept), so a program that loads on
# the host proves nothing for 6.12. One run of tests/kernel-peer/run.sh peer-host (PEER_VM=1):
#   in the VM: `smc bpf install` must load and attach the program; then smc-bpf-probe over
#   loopback checks every outcome it records (both marked, only the client, only the
#   server, neither, TCP Fast Open, SYN cookies); then across the bridge against the host's
#   kernel with the program installed there too (a private cgroup and pin directory, removed
#   on exit): the VM's client → the host's server and the host's client → the VM's server,
#   both ends BothAnnounced (the 6.12 program writes the option in SYN and SYN-ACK and
#   finds the host's in SYN-ACK and SYN); `smc bpf status` and `uninstall` in the VM.
# Exit 0 pass, 77 skip (with the reason) when this machine cannot run VMs, else fail.
# About 1 min under TCG with a warm cache.
set -u
cd "$(dirname "$0")/../.." || exit 1
TAG=kpeer-bpf-guest
BIN=${BIN:-target/release}
skip() { echo "SKIP $TAG: $*"; exit 77; }

[ "${SMC_RS_KPEER:-1}" = 0 ] && skip "SMC_RS_KPEER=0"
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, tap devices, eBPF)"
command -v qemu-system-x86_64 >/dev/null 2>&1 || skip "qemu-system-x86_64 is not installed (scripts/setup.sh installs it)"
[ -e /dev/net/tun ] || skip "no /dev/net/tun"
command -v bpftool >/dev/null || skip "bpftool is not installed (scripts/setup.sh installs it)"
bpftool feature probe kernel 2>/dev/null | grep -q "program_type sock_ops is available" \
  || skip "the host kernel has no eBPF sock_ops support"
CG_ROOT=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/self/mounts)
[ -n "$CG_ROOT" ] || skip "no cgroup2 filesystem mounted"
if [ ! -x "$BIN/smc" ] || [ ! -x "$BIN/smc-bpf-probe" ]; then
  case $BIN in
    */release) CARGO_TARGET_DIR=${BIN%/release} cargo build --release -q -p smc-cli -p smc-bpf --bins \
                 || { echo "FAIL $TAG: build"; exit 1; } ;;
    *) echo "FAIL $TAG: $BIN/smc or smc-bpf-probe not built"; exit 1 ;;
  esac
fi
smc=$(realpath "$BIN/smc")
probe=$(realpath "$BIN/smc-bpf-probe")
helper=$PWD/tests/system/helpers/bpf-vm-peer.sh

work=$(mktemp -d /tmp/$TAG.XXXXXX)
pin=/sys/fs/bpf/$TAG-$$
cg=$CG_ROOT/$TAG-$$
cleanup() {
  "$smc" bpf uninstall --pin-dir "$pin" >/dev/null 2>&1 || rm -rf "$pin"
  if [ -d "$cg" ]; then
    local p
    while read -r p; do echo "$p" > "$CG_ROOT/cgroup.procs" 2>/dev/null; done < "$cg/cgroup.procs"
    rmdir "$cg" 2>/dev/null
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir "$cg" || { echo "FAIL $TAG: cannot create cgroup $cg"; exit 1; }
"$smc" bpf install --cgroup "$cg" --pin-dir "$pin" > "$work/host-install.txt" 2>&1 \
  || { cat "$work/host-install.txt"; echo "FAIL $TAG: smc bpf install on the host"; exit 1; }

echo "== run.sh peer-host (the program in the Linux 6.12 VM)"
t0=$SECONDS
# No RDMA here: no capture (peer-host's capture check wants RoCEv2 traffic).
timeout 900 tests/kernel-peer/run.sh peer-host OUT="$work/run" NO_INSTALL=1 CAPTURE=0 \
  PEER_TIMEOUT=400 PEER_FILES="$smc $probe $helper" \
  PEER_CMD='PLAN=guest sh /peer/bpf-vm-peer.sh' \
  HOST_CMD="PLAN=host PROBE=$probe PIN=$pin CG=$cg sh $helper" > "$work/run.log" 2>&1
rc=$?
grep -E '^(PASS|FAIL|WARN|VERDICT)' "$work/run.log" | sed 's/^/   /'
grep -ahE '^(kernel:|ok |PEER )' "$work/run/peer/peer.log" 2>/dev/null | sed 's/^/   guest: /'
grep -ahE '^(ok |PEER )' "$work/run/peer/host.log" 2>/dev/null | sed 's/^/   host: /'
case $rc in
  0) ;;
  4) reason=$(grep -m1 'cannot run here' "$work/run.log" | sed 's/.*cannot run here: //')
     rm -rf "$work"; skip "${reason:-the kernel-peer harness cannot run here}" ;;
  *) echo "FAIL $TAG: run.sh exit $rc (artefacts in $work)"
     tail -n 40 "$work/run/peer/peer.log" 2>/dev/null | sed 's/^/   guest: /'
     tail -n 15 "$work/run/peer/host.log" 2>/dev/null | sed 's/^/   host: /'
     tail -n 15 "$work/run.log" | sed 's/^/   /'
     exit 1 ;;
esac
# The guest's own report: the kernel it ran on, and that it got to the end.
# (KPKG picks another kernel package for the VM; then any kernel will do.)
if [ -z "${KPKG:-}" ]; then
  grep -q '^kernel: 6\.12\.' "$work/run/peer/peer.log" \
    || { echo "FAIL $TAG: the VM did not run Linux 6.12 ($(grep -m1 '^kernel:' "$work/run/peer/peer.log"))"; exit 1; }
fi
grep -q '^PEER OK (guest)' "$work/run/peer/peer.log" || { echo "FAIL $TAG: the guest did not finish"; exit 1; }
kver=$(sed -n "s/^kernel: //p" "$work/run/peer/peer.log" | head -1)
rm -rf "$work"
echo "$TAG: passed (smc-bpf loads, attaches and announces on Linux $kver; $((SECONDS - t0)) s)"
