#!/usr/bin/env bash
# System test (issue 12): SMC-R failover (RFC 7609 §4.6) across two network namespaces
# joined by two veth pairs on two subnets (fo0: 10.233.40.0/24, fo1: 10.233.41.0/24). Both
# stacks have a software RNIC on each (SMC_RS_DEVICES), so each link group gets two
# symmetric links. Each run echoes SMC_FO_SIZE each way; once a quarter of it has arrived
# at the listener (seen in its SIGUSR1 snapshot, with both links active), the path the
# connection's link uses (fo0, also the TCP path) goes down (`ip link set down`, on the
# client's end in odd runs, the server's in even ones) and comes back 3 s later. Checks:
# both SHA-256 intact, the connection still SMC-R and moved to the other link (client and
# listener count a failover), the link group back to two links after the C.8 retry
# (SMC_RS_ADD_LINK_RETRY_MS=1000). SMC_FO_RUNS runs in a row (default 3, 1 when CI=true;
# the README's 50-run loop: SMC_FO_RUNS=50). No eBPF: SMC_RS_SKIP_TCP_OPTION.
#
# Exit: 0 pass, 77 skip (not root), anything else fail.
set -uo pipefail
cd "$(dirname "$0")/../.."
TEST_NAME=smc-failover
. tests/system/lib/smc-common.bash
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)" always
command -v ip >/dev/null || skip "missing ip (run scripts/setup.sh)"
ensure_bin
SIZE=${SMC_FO_SIZE:-512M}
if [ "${CI:-}" = true ]; then RUNS=${SMC_FO_RUNS:-1}; else RUNS=${SMC_FO_RUNS:-3}; fi
BYTES=$(python3 -c "import sys; s=sys.argv[1]; u={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*u[s[-1]] if s[-1] in u else int(s))" "$SIZE")
export SMC_RS_SKIP_TCP_OPTION='10.233.40.0/24:*'
export SMC_RS_ADD_LINK_RETRY_MS=1000

NS_C=fo-c-$$; NS_S=fo-s-$$
extra_cleanup() { ip netns del "$NS_C" 2>/dev/null; ip netns del "$NS_S" 2>/dev/null; }
ip netns add "$NS_C" && ip netns add "$NS_S" || { echo "FAIL: netns"; exit 1; }
for i in 0 1; do
  ip link add "fo${i}c$$" type veth peer name "fo${i}s$$" || { echo "FAIL: veth"; exit 1; }
  ip link set "fo${i}c$$" netns "$NS_C"; ip link set "fo${i}s$$" netns "$NS_S"
  ip -n "$NS_C" addr add "10.233.4$i.1/24" dev "fo${i}c$$"
  ip -n "$NS_S" addr add "10.233.4$i.2/24" dev "fo${i}s$$"
  ip -n "$NS_C" link set "fo${i}c$$" up; ip -n "$NS_S" link set "fo${i}s$$" up
done
for n in "$NS_C" "$NS_S"; do ip -n "$n" link set lo up; done

# The listener's snapshot: received bytes of its connection, and its active links.
srv_received() { sed -n 's/^stats: conn .* received=\([0-9]*\).*/\1/p' "$WORK/srv.out" | tail -n1; }
srv_links() { grep '^stats: link-group ' "$WORK/srv.out" | tail -n1 | grep -o '[0-9]*:Active' | wc -l; }

for run in $(seq "$RUNS"); do
  if [ $((run % 2)) = 1 ]; then CUT_NS=$NS_C; CUT_DEV=fo0c$$; else CUT_NS=$NS_S; CUT_DEV=fo0s$$; fi
  : > "$WORK/srv.out"
  start_listen srv ip netns exec "$NS_S" env SMC_RS_DEVICES=10.233.40.2,10.233.41.2 -- \
    10.233.40.2:0 --echo --count 1 --stats
  SMC_RS_DEVICES=10.233.40.1,10.233.41.1 timeout 300 ip netns exec "$NS_C" "$SMC" connect \
    "10.233.40.2:$PORT" --send-bytes "$SIZE" --seed "$run" --expect-echo --require-smc \
    --concurrent --stats > "$WORK/cli.out" 2> "$WORK/cli.err" &
  CPID=$!; PIDS+=("$CPID")
  cut=""
  for _ in $(seq 600); do
    request_snapshot "$LPID" "$WORK/srv.out" || break
    r=$(srv_received); l=$(srv_links)
    if [ -n "$r" ] && [ "$r" -gt $((BYTES / 4)) ] && [ "$l" = 2 ]; then
      ip -n "$CUT_NS" link set "$CUT_DEV" down && cut="$CUT_DEV at $r bytes"
      break
    fi
    sleep 0.05
  done
  if [ -n "$cut" ]; then
    sleep 3
    ip -n "$CUT_NS" link set "$CUT_DEV" up
  fi
  wait_exit "$CPID" 300; rc=$?
  wait_exit "$LPID" 60; lrc=$?
  line=$(grep "^conn 1 " "$WORK/cli.out")
  sent_sha=$(sed -n 's/.* sent [0-9]* bytes sha256=\([0-9a-f]*\) .*/\1/p' <<<"$line")
  cfo=$(stats_field "$WORK/cli.out" "at exit" failovers)
  sfo=$(stats_field "$WORK/srv.out" "at exit" failovers)
  bad=0
  [ -n "$cut" ] || { fail "run $run: no cut (the transfer never had a quarter through with two links)"; bad=1; }
  [ "$rc" = 0 ] || { fail "run $run: client exit $rc"; bad=1; }
  [ "$lrc" = 0 ] || { fail "run $run: listener exit $lrc"; bad=1; }
  grep -q "^conn 1 mode=SMC-R sent $BYTES bytes .* received $BYTES bytes .* echo=ok" <<<"$line" \
    || { fail "run $run: client result: $line"; bad=1; }
  { [ -n "$sent_sha" ] && grep -q "^conn 1 .*echoed $BYTES bytes sha256=$sent_sha" "$WORK/srv.out"; } \
    || { fail "run $run: listener did not echo the client's bytes"; bad=1; }
  [ "${cfo:-0}" -ge 1 ] || { fail "run $run: client failovers=${cfo:-?}"; bad=1; }
  [ "${sfo:-0}" -ge 1 ] || { fail "run $run: listener failovers=${sfo:-?}"; bad=1; }
  if [ "$bad" = 0 ]; then
    ok "run $run/$RUNS: $SIZE each way intact over SMC-R, $cut, failovers client=$cfo listener=$sfo"
  else
    show "$WORK/cli.out" "$WORK/cli.err" "$WORK/srv.out" "$WORK/srv.err"
    break
  fi
done
if [ "$FAILS" -gt 0 ]; then echo "smc-failover: $FAILS check(s) failed"; exit 1; fi
echo "smc-failover: all $RUNS run(s) passed"
