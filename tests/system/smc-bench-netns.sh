#!/usr/bin/env bash
# System test (issue 15): `smc bench` in two processes in two network namespaces joined
# by a veth pair, like iperf3 -s / -c: `smc bench --listen` serves one run (SMC-R and
# kernel TCP), `smc bench --connect` measures it. Checks that both exit 0, that every
# metric is reported for both transports with SMC-R connections only, and that the
# server saw the run. Timings are reported, never checked.
#
# The one command for a two-namespace run (any size): SMC_BENCH_ARGS="--bytes 1G
# --iters 10000 --conns 1000" tests/system/smc-bench-netns.sh (prints the report).
# Exit: 0 pass, 77 skip (not root), anything else fail.
set -uo pipefail
cd "$(dirname "$0")/../.."
TEST_NAME=smc-bench-netns
. tests/system/lib/smc-common.bash
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)" always
command -v ip >/dev/null || skip "missing ip (run scripts/setup.sh)"
ensure_bin
# shellcheck disable=SC2206 # word splitting intended
ARGS=(${SMC_BENCH_ARGS:---bytes 64M --iters 1000 --conns 100})
export SMC_RS_SKIP_TCP_OPTION='10.234.0.0/24:*'

NS_C=smcb-c-$$; NS_S=smcb-s-$$
extra_cleanup() { ip netns del "$NS_C" 2>/dev/null; ip netns del "$NS_S" 2>/dev/null; }
ip netns add "$NS_C" && ip netns add "$NS_S" || { echo "FAIL: netns"; exit 1; }
ip link add "bc$$" type veth peer name "bs$$" || { echo "FAIL: veth"; exit 1; }
ip link set "bc$$" netns "$NS_C"; ip link set "bs$$" netns "$NS_S"
ip -n "$NS_C" addr add 10.234.0.1/24 dev "bc$$"
ip -n "$NS_S" addr add 10.234.0.2/24 dev "bs$$"
for n in "$NS_C" "$NS_S"; do ip -n "$n" link set lo up; done
ip -n "$NS_C" link set "bc$$" up; ip -n "$NS_S" link set "bs$$" up

ip netns exec "$NS_S" "$SMC" bench --listen 10.234.0.2 > "$WORK/srv.out" 2> "$WORK/srv.err" &
SPID=$!
PIDS+=("$SPID")
for _ in $(seq 200); do
  grep -q "^smc bench: serving" "$WORK/srv.err" 2>/dev/null && break
  kill -0 "$SPID" 2>/dev/null || break
  sleep 0.05
done
grep -q "^smc bench: serving" "$WORK/srv.err" || { echo "FAIL: server did not start"; show "$WORK/srv.err"; exit 1; }

timeout 600 ip netns exec "$NS_C" "$SMC" bench --connect 10.234.0.2 "${ARGS[@]}" \
  > "$WORK/cli.out" 2> "$WORK/cli.err"
rc=$?
src=
for _ in $(seq 600); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.05; done
if kill -0 "$SPID" 2>/dev/null; then src=running; else wait "$SPID"; src=$?; fi

cat "$WORK/cli.out"
[ "$rc" = 0 ] && ok "client exit 0" || { fail "client exit $rc"; show "$WORK/cli.out" "$WORK/cli.err"; }
[ "$src" = 0 ] && ok "server exit 0 after the run" || { fail "server exit $src"; show "$WORK/srv.out" "$WORK/srv.err"; }
for line in "latency 1 B RTT p50" "latency 1 KiB RTT p50" "throughput, " \
  "CPU s per GiB (client process)" "connections/s" "SMC-R subsequent contact"; do
  if grep -F "$line" "$WORK/cli.out" | grep -qv "failed"; then ok "reported: $line"
  else fail "not reported: $line"; fi
done
grep -q "^SMC-R connection mode: SMC-R v" "$WORK/cli.out" \
  && ok "$(grep -m1 '^SMC-R connection mode' "$WORK/cli.out")" || { fail "no SMC-R mode line"; show "$WORK/cli.out"; }
grep -q "^smc bench: SMC-R: served [1-9]" "$WORK/srv.err" && grep -q "^smc bench: TCP: served [1-9]" "$WORK/srv.err" \
  && ok "server: $(grep '^smc bench: .*served' "$WORK/srv.err" | tr '\n' ' ')" \
  || { fail "server records"; show "$WORK/srv.err"; }

if [ "$FAILS" -gt 0 ]; then echo "smc-bench-netns: $FAILS check(s) failed"; exit 1; fi
echo "smc-bench-netns: all checks passed"
