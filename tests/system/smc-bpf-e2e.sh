#!/usr/bin/env bash
# System test (issues 4 and 5, end to end): with the eBPF program installed, `smc
# connect` → `smc listen` reaches SMC-R through the real RFC 7609 TCP option — no
# SMC_RS_SKIP_TCP_OPTION override — and a capture shows kind 254 (FE 06 E2 D4 C3 D9)
# in the SYN and in the SYN-ACK.
#
# The program is installed under a private pin directory and attached to a private
# cgroup (both processes run in it), so nothing else on the machine is affected; it
# is uninstalled on exit.
#
# Exit: 0 pass, 77 skip (not root, no eBPF sock_ops support, missing tools),
# anything else fail. With CI=true a missing tool is a failure, not a skip.
set -uo pipefail
cd "$(dirname "$0")/../.."
TEST_NAME=smc-bpf-e2e
. tests/system/lib/smc-common.bash
[ "$(id -u)" = 0 ] || skip "needs root (eBPF)" always
for t in tcpdump tshark bpftool; do command -v "$t" >/dev/null || skip "missing $t (run scripts/setup.sh)"; done
# (Captured first: with pipefail, grep -q closing the pipe early would fail bpftool.)
FEATURES=$(bpftool feature probe kernel 2>/dev/null)
grep -q "program_type sock_ops is available" <<<"$FEATURES" \
  || skip "kernel has no eBPF sock_ops program support" always
CG_ROOT=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/self/mounts)
[ -n "$CG_ROOT" ] || skip "no cgroup2 filesystem mounted" always
ensure_bin
unset SMC_RS_SKIP_TCP_OPTION
# Other loopback addresses when 127.0.0.1/.2 are busy (UDP 4791 taken by another stack).
SIP=${SMC_TEST_SERVER_IP:-127.0.0.2}; CIP=${SMC_TEST_CLIENT_IP:-127.0.0.1}

PIN=/sys/fs/bpf/smc-e2e-$$
CG=$CG_ROOT/smc-e2e-$$
BPFFS_MODE=$(stat -c %a /sys/fs/bpf 2>/dev/null)
extra_cleanup() {
  "$SMC" bpf uninstall --pin-dir "$PIN" >/dev/null 2>&1 || rm -rf "$PIN"
  if [ -d "$CG" ]; then
    while read -r p; do echo "$p" > "$CG_ROOT/cgroup.procs" 2>/dev/null; done < "$CG/cgroup.procs"
    rmdir "$CG" 2>/dev/null
  fi
  [ -n "$BPFFS_MODE" ] && chmod "$BPFFS_MODE" /sys/fs/bpf 2>/dev/null
}
mkdir "$CG" || { echo "FAIL: cannot create cgroup $CG"; exit 1; }
"$SMC" bpf install --cgroup "$CG" --pin-dir "$PIN" > "$WORK/install.txt" 2>&1 \
  || { cat "$WORK/install.txt"; echo "FAIL: smc bpf install"; exit 1; }
ok "installed: $(head -n1 "$WORK/install.txt")"
export SMC_RS_BPF_DIR=$PIN

# Runs "$@" in the test cgroup, so that the sock_ops program sees its sockets.
in_cg() { bash -c 'echo $$ > "$0/cgroup.procs" && exec "${@:1}"' "$CG" "$@"; }

# Listener first (port 0), then the capture for its port, then the client.
start_listen srv in_cg -- "$SIP:0" --echo --count 1 --stats
tcpdump -i lo --immediate-mode -U -s 200 -w "$WORK/cap.pcap" "tcp port $PORT" > /dev/null 2> "$WORK/tcpdump.err" &
TPID=$!; PIDS+=("$TPID")
for _ in $(seq 100); do grep -q "listening on" "$WORK/tcpdump.err" 2>/dev/null && break; sleep 0.05; done
timeout 60 bash -c 'echo $$ > "$0/cgroup.procs" && exec "${@:1}"' "$CG" \
  "$SMC" connect --bind "$CIP" "$SIP:$PORT" --send-bytes 4M --expect-echo --require-smc \
  > "$WORK/cli.out" 2> "$WORK/cli.err"
rc=$?
wait_exit "$LPID" 30; lrc=$?
sleep 1; kill "$TPID" 2>/dev/null; wait "$TPID" 2>/dev/null

[ "$rc" = 0 ] && ok "client exit 0: $(grep -m1 '^conn 1' "$WORK/cli.out" | cut -c1-60)…" \
  || { fail "client exit $rc"; show "$WORK/cli.out" "$WORK/cli.err"; }
[ "$lrc" = 0 ] || { fail "listener exit $lrc"; show "$WORK/srv.out" "$WORK/srv.err"; }
grep -q "^connected to $SIP:$PORT: SMC-R" "$WORK/cli.err" && ok "client mode: $(grep -m1 '^connected' "$WORK/cli.err")" \
  || { fail "client not SMC-R"; show "$WORK/cli.err"; }
grep -q "^accepted $CIP:[0-9]*: SMC-R" "$WORK/srv.err" && ok "listener mode: $(grep -m1 '^accepted' "$WORK/srv.err")" \
  || { fail "listener not SMC-R"; show "$WORK/srv.err"; }

tshark -r "$WORK/cap.pcap" -Y "tcp.flags.syn == 1" -T fields -E separator=' ' \
  -e tcp.srcport -e tcp.dstport -e tcp.flags.ack -e tcp.options > "$WORK/syns.txt" 2> "$WORK/tshark.err" \
  || { fail "tshark"; show "$WORK/tshark.err"; }
OPT=fe06e2d4c3d9
syn=$(awk -v p="$PORT" '$2 == p && $3 == 0' "$WORK/syns.txt")
synack=$(awk -v p="$PORT" '$1 == p && $3 == 1' "$WORK/syns.txt")
if [ -n "$syn" ] && grep -q "$OPT" <<<"$syn"; then ok "SYN carries FE 06 E2 D4 C3 D9"
else fail "SYN without the SMC-R option"; show "$WORK/syns.txt"; fi
if [ -n "$synack" ] && grep -q "$OPT" <<<"$synack"; then ok "SYN-ACK carries FE 06 E2 D4 C3 D9"
else fail "SYN-ACK without the SMC-R option"; show "$WORK/syns.txt"; fi
# tshark's own decoding of the option, as a second opinion.
tshark -r "$WORK/cap.pcap" -Y "tcp.flags.syn == 1 && tcp.option_kind == 254" 2>/dev/null | wc -l > "$WORK/n254"
[ "$(cat "$WORK/n254")" -ge 2 ] && ok "tshark: $(cat "$WORK/n254") SYN/SYN-ACK segments with option kind 254" \
  || fail "tshark finds $(cat "$WORK/n254") segments with option kind 254"

# Control: the same pair outside the cgroup (the program does not see their
# sockets) announces nothing, so it must fall back and say why.
start_listen ctl -- "$SIP:0" --echo --count 1
timeout 30 "$SMC" connect --bind "$CIP" "$SIP:$PORT" --send-bytes 64K --expect-echo \
  > "$WORK/ctl-cli.out" 2> "$WORK/ctl-cli.err"
wait_exit "$LPID" 30
if grep -q "^connected to .*: TCP fallback: .*" "$WORK/ctl-cli.err" && grep -q "echo=ok" "$WORK/ctl-cli.out"; then
  ok "control outside the cgroup: $(grep -m1 '^connected' "$WORK/ctl-cli.err" | sed 's/^connected to [^ ]* //')"
else fail "control outside the cgroup did not fall back"; show "$WORK/ctl-cli.out" "$WORK/ctl-cli.err"; fi

"$SMC" bpf uninstall --pin-dir "$PIN" > /dev/null 2>&1 && [ ! -e "$PIN" ] && ok "uninstalled" || fail "uninstall"

if [ "$FAILS" -gt 0 ]; then echo "smc-bpf-e2e: $FAILS check(s) failed"; exit 1; fi
echo "smc-bpf-e2e: all checks passed"
