#!/usr/bin/env bash
# System test (issue 4): SMC-R across two network namespaces joined by a veth pair:
# the listener in one, the client in the other, each with its software RoCEv2 RNIC
# on its veth address. 1 GiB each way (echo), hash-verified on both sides, both
# connections SMC-R. No eBPF: the SMC_RS_SKIP_TCP_OPTION policy lists the peers.
#
# Exit: 0 pass, 77 skip (not root), anything else fail. SMC_TEST_SIZE overrides the size.
set -uo pipefail
cd "$(dirname "$0")/../.."
TEST_NAME=smc-netns
. tests/system/lib/smc-common.bash
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)" always
command -v ip >/dev/null || skip "missing ip (run scripts/setup.sh)"
ensure_bin
SIZE=${SMC_TEST_SIZE:-1G}
export SMC_RS_SKIP_TCP_OPTION='10.233.0.0/24:*'

NS_C=smcn-c-$$; NS_S=smcn-s-$$
extra_cleanup() { ip netns del "$NS_C" 2>/dev/null; ip netns del "$NS_S" 2>/dev/null; }
ip netns add "$NS_C" && ip netns add "$NS_S" || { echo "FAIL: netns"; exit 1; }
ip link add "vc$$" type veth peer name "vs$$" || { echo "FAIL: veth"; exit 1; }
ip link set "vc$$" netns "$NS_C"; ip link set "vs$$" netns "$NS_S"
ip -n "$NS_C" addr add 10.233.0.1/24 dev "vc$$"
ip -n "$NS_S" addr add 10.233.0.2/24 dev "vs$$"
for n in "$NS_C" "$NS_S"; do ip -n "$n" link set lo up; done
ip -n "$NS_C" link set "vc$$" up; ip -n "$NS_S" link set "vs$$" up

start_listen srv ip netns exec "$NS_S" -- 10.233.0.2:0 --echo --count 1 --stats
timeout 170 ip netns exec "$NS_C" "$SMC" connect "10.233.0.2:$PORT" --send-bytes "$SIZE" --seed 11 \
  --expect-echo --require-smc --concurrent --stats > "$WORK/cli.out" 2> "$WORK/cli.err"
rc=$?
wait_exit "$LPID" 30; lrc=$?

BYTES=$(python3 -c "import sys; s=sys.argv[1]; u={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*u[s[-1]] if s[-1] in u else int(s))" "$SIZE")
line=$(grep "^conn 1 " "$WORK/cli.out")
sent_sha=$(sed -n 's/.* sent [0-9]* bytes sha256=\([0-9a-f]*\) .*/\1/p' <<<"$line")
echo_line=$(grep "^conn 1 " "$WORK/srv.out")

[ "$rc" = 0 ] && ok "client exit 0" || { fail "client exit $rc"; show "$WORK/cli.out" "$WORK/cli.err"; }
[ "$lrc" = 0 ] && ok "listener exit 0" || { fail "listener exit $lrc"; show "$WORK/srv.out" "$WORK/srv.err"; }
if grep -q "^conn 1 mode=SMC-R sent $BYTES bytes .* received $BYTES bytes .* echo=ok" <<<"$line"; then
  ok "client: $SIZE each way, echo verified by SHA-256, mode SMC-R ($(sed 's/.* in \([0-9.]* s\).*/\1/' <<<"$line"))"
else fail "client result: $line"; fi
if [ -n "$sent_sha" ] && grep -q "echoed $BYTES bytes sha256=$sent_sha" <<<"$echo_line"; then
  ok "listener received $SIZE with the client's SHA-256"
else fail "listener result: $echo_line (client sent $sent_sha)"; fi
grep -q "^connected to 10.233.0.2:$PORT: SMC-R" "$WORK/cli.err" && ok "client mode: $(grep -m1 '^connected' "$WORK/cli.err")" \
  || { fail "client mode"; show "$WORK/cli.err"; }
grep -q "^accepted 10.233.0.1:[0-9]*: SMC-R" "$WORK/srv.err" && ok "listener mode: $(grep -m1 '^accepted' "$WORK/srv.err")" \
  || { fail "listener mode"; show "$WORK/srv.err"; }
# The client's link group runs over the veth: its link's peer GID is the listener's
# address (--concurrent: a snapshot is taken after the transfer, before the close; at
# exit either side may already have ended the link group).
grep -q "^stats: link-group .*peer-gid=::ffff:10.233.0.2" "$WORK/cli.out" \
  && ok "client link group over the veth: $(grep -m1 '^stats: link-group' "$WORK/cli.out" | sed 's/^stats: //')" \
  || { fail "client stats show no link group with peer 10.233.0.2"; show "$WORK/cli.out"; }

if [ "$FAILS" -gt 0 ]; then echo "smc-netns: $FAILS check(s) failed"; exit 1; fi
echo "smc-netns: all checks passed"
