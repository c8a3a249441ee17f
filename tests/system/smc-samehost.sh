#!/usr/bin/env bash
# System test (issue 14): the same-host path between two smc processes
# (docs/samehost.md). Both run with the path on by default (SMC_RS_SAME_HOST unset) and one
# socket directory; section 4 runs redis under smc run on it.
#
#  1. Two processes on loopback: 1 GiB each way (256 MiB with CI=true), echo,
#     SHA-256 on both sides, both connections on the same-host path.
#  2. Two network namespaces (veth) sharing the file system: same-host path (the
#     Unix socket proves one kernel). The client in a private mount namespace with
#     its own (tmpfs) socket directory, as in a container: no proof, SMC-R over the
#     veth. Which path each case takes is what docs/samehost.md documents.
#  3. 1,000 sequential and 1,000 concurrent connections (200 with CI=true) to one
#     listener, then a client SIGKILLed in the middle of a transfer: the listener
#     survives, its connection ends, and it holds no same-host connection, no memfd
#     mapping and no more descriptors than before; it still serves.
#
# Exit: 0 pass, 77 skip, anything else fail. SMC_SAMEHOST_FULL=1: full sizes in CI too.
set -uo pipefail
cd "$(dirname "$0")/../.."
TEST_NAME=smc-samehost
. tests/system/lib/smc-common.bash
ensure_bin
if [ "${CI:-}" = true ] && [ -z "${SMC_SAMEHOST_FULL:-}" ]; then SIZE=256M; N=200; else SIZE=1G; N=1000; fi
SIZE=${SMC_TEST_SIZE:-$SIZE}
# On by default (smc-common.bash turned it off for the SMC-R scripts): every command
# below runs with the variable unset, as a user's would.
unset SMC_RS_SAME_HOST
export SMC_RS_SAME_HOST_DIR="$WORK/sockets"
export SMC_RS_SKIP_TCP_OPTION='127.0.0.0/8:*,10.234.0.0/24:*'
SIP=${SMC_TEST_SERVER_IP:-127.0.14.2}; CIP=${SMC_TEST_CLIENT_IP:-127.0.14.1}
BYTES=$(python3 -c "import sys; s=sys.argv[1]; u={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*u[s[-1]] if s[-1] in u else int(s))" "$SIZE")
maps() { awk '/memfd:smc-rs-samehost/ { n++ } END { print n + 0 }' "/proc/$1/maps" 2>/dev/null; }

# ---- 1. two processes, bulk both ways ------------------------------------------------
start_listen bulk -- "$SIP:0" --echo --count 1
timeout 300 "$SMC" connect --bind "$CIP" "$SIP:$PORT" --send-bytes "$SIZE" --seed 14 --expect-echo \
  --require-smc > "$WORK/cli.out" 2> "$WORK/cli.err"
rc=$?
wait_exit "$LPID" 30; lrc=$?
line=$(grep "^conn 1 " "$WORK/cli.out")
sent_sha=$(sed -n 's/.* sent [0-9]* bytes sha256=\([0-9a-f]*\) .*/\1/p' <<<"$line")
[ "$rc" = 0 ] && [ "$lrc" = 0 ] && ok "client and listener exit 0" \
  || { fail "exit: client $rc, listener $lrc"; show "$WORK/cli.out" "$WORK/cli.err" "$WORK/bulk.err"; }
if grep -q "^conn 1 mode=same-host sent $BYTES bytes .* received $BYTES bytes .* echo=ok" <<<"$line"; then
  ok "$SIZE each way over the same-host path, echo verified ($(sed 's/.* in \([0-9.]* s\).*/\1/' <<<"$line"))"
else fail "client result: $line"; fi
[ -n "$sent_sha" ] && grep -q "echoed $BYTES bytes sha256=$sent_sha" "$WORK/bulk.out" \
  && ok "listener received the client's SHA-256" || { fail "listener result"; show "$WORK/bulk.out"; }
grep -q "^accepted $CIP:[0-9]*: SMC same-host" "$WORK/bulk.err" && ok "listener mode: $(grep -m1 '^accepted' "$WORK/bulk.err")" \
  || { fail "listener mode"; show "$WORK/bulk.err"; }

# ---- 2. network namespaces and mount namespaces ---------------------------------------
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null && command -v unshare >/dev/null; then
  NS_C=smsh-c-$$; NS_S=smsh-s-$$
  extra_cleanup() { ip netns del "$NS_C" 2>/dev/null; ip netns del "$NS_S" 2>/dev/null; }
  ip netns add "$NS_C" && ip netns add "$NS_S" || { echo "FAIL: netns"; exit 1; }
  ip link add "shc$$" type veth peer name "shs$$" || { echo "FAIL: veth"; exit 1; }
  ip link set "shc$$" netns "$NS_C"; ip link set "shs$$" netns "$NS_S"
  ip -n "$NS_C" addr add 10.234.0.1/24 dev "shc$$"; ip -n "$NS_S" addr add 10.234.0.2/24 dev "shs$$"
  for n in "$NS_C" "$NS_S"; do ip -n "$n" link set lo up; done
  ip -n "$NS_C" link set "shc$$" up; ip -n "$NS_S" link set "shs$$" up
  start_listen ns ip netns exec "$NS_S" -- 10.234.0.2:0 --echo --count 2
  timeout 60 ip netns exec "$NS_C" "$SMC" connect "10.234.0.2:$PORT" --send-bytes 8M --expect-echo \
    --require-smc > "$WORK/ns1.out" 2> "$WORK/ns1.err"
  grep -q "^conn 1 mode=same-host .*echo=ok" "$WORK/ns1.out" \
    && ok "two network namespaces, one file system: same-host path" \
    || { fail "two netns: not same-host"; show "$WORK/ns1.out" "$WORK/ns1.err"; }
  # The client in a mount namespace of its own, its socket directory a private tmpfs
  # (a container's /tmp): the server cannot reach its socket, so SMC-R over the veth.
  mkdir -p "$SMC_RS_SAME_HOST_DIR"
  timeout 60 ip netns exec "$NS_C" unshare -m sh -c \
    'mount -t tmpfs smc-samehost-private "$SMC_RS_SAME_HOST_DIR" && exec "$0" "$@"' \
    "$SMC" connect "10.234.0.2:$PORT" --send-bytes 8M --expect-echo --require-smc \
    > "$WORK/ns2.out" 2> "$WORK/ns2.err"
  grep -q "^conn 1 mode=SMC-R .*echo=ok" "$WORK/ns2.out" \
    && ok "private mount namespace (no shared socket directory): SMC-R over the veth" \
    || { fail "private mount ns: not SMC-R"; show "$WORK/ns2.out" "$WORK/ns2.err"; }
  wait_exit "$LPID" 30 || { fail "netns listener exit"; show "$WORK/ns.err"; }
else
  echo "info: namespace cases skipped (need root, ip and unshare)"
fi

# ---- 3. many connections, then a SIGKILLed client -----------------------------------
start_listen many -- "$SIP:0" --echo --stats
SRV=$LPID
timeout 60 "$SMC" connect --bind "$CIP" "$SIP:$PORT" --send-bytes 1K --expect-echo --require-smc \
  > "$WORK/warm.out" 2>&1 || { fail "warm-up"; show "$WORK/warm.out"; }
sleep 0.5
fd0=$(fd_count "$SRV"); maps0=$(maps "$SRV")
timeout 600 "$SMC" connect --bind "$CIP" "$SIP:$PORT" --conns "$N" --send-bytes 2K --expect-echo \
  --require-smc > "$WORK/seq.out" 2> "$WORK/seq.err"; rc=$?
good=$(grep -c "mode=same-host .*echo=ok" "$WORK/seq.out")
[ "$rc" = 0 ] && [ "$good" = "$N" ] && ok "$N sequential connections, all same-host and verified" \
  || { fail "sequential: exit $rc, $good/$N good"; show "$WORK/seq.err"; }
timeout 600 "$SMC" connect --bind "$CIP" "$SIP:$PORT" --conns "$N" --concurrent --send-bytes 2K \
  --expect-echo --require-smc > "$WORK/conc.out" 2> "$WORK/conc.err"; rc=$?
good=$(grep -c "mode=same-host .*echo=ok" "$WORK/conc.out")
[ "$rc" = 0 ] && [ "$good" = "$N" ] && ok "$N concurrent connections, all same-host and verified" \
  || { fail "concurrent: exit $rc, $good/$N good"; show "$WORK/conc.err"; }

# A client killed mid-transfer: the listener's side must end and give everything back.
"$SMC" connect --bind "$CIP" "$SIP:$PORT" --send-bytes 64G --require-smc > "$WORK/kill.out" 2>&1 &
KPID=$!; PIDS+=("$KPID")
for i in $(seq 100); do [ "$(maps "$SRV")" -gt "$maps0" ] && break; sleep 0.05; done
sleep 0.5
[ "$(maps "$SRV")" -gt "$maps0" ] && ok "listener maps the client's memory ($(maps "$SRV") mappings)" \
  || fail "no same-host mapping during the transfer"
# `smc ss` labels both ends SAMEHOST (no link group), never SMCR.
"$SMC" ss --json > "$WORK/ss.json" 2>&1
ss_modes=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sorted(set((s['mode'], s.get('lgr')) for s in d if str(s['pid']) in sys.argv[2:] and s['mode'] != 'SMC')))" \
  "$WORK/ss.json" "$SRV" "$KPID" 2>&1)
[ "$ss_modes" = "[('SAMEHOST', None)]" ] && ok "smc ss: both ends SAMEHOST, no link group" \
  || { fail "smc ss modes: $ss_modes"; show "$WORK/ss.json"; }
kill -9 "$KPID"; t0=$(date +%s.%N)
clean=""
for i in $(seq 200); do
  request_snapshot "$SRV" "$WORK/many.out" || break
  if [ "$(stats_field "$WORK/many.out" SIGUSR1 same-host)" = 0 ] && [ "$(maps "$SRV")" -le "$maps0" ]; then
    clean=1; break
  fi
  sleep 0.05
done
t1=$(date +%s.%N)
secs=$(python3 -c "import sys; print(f'{float(sys.argv[2])-float(sys.argv[1]):.2f}')" "$t0" "$t1")
[ -n "$clean" ] && ok "after SIGKILL of the client: no same-host connection, $(maps "$SRV") memfd mappings (before: $maps0), in $secs s" \
  || { fail "after SIGKILL: same-host=$(stats_field "$WORK/many.out" SIGUSR1 same-host) mappings=$(maps "$SRV")"; show "$WORK/many.err"; }
for i in $(seq 100); do [ "$(fd_count "$SRV")" -le "$fd0" ] && break; sleep 0.05; done
[ "$(fd_count "$SRV")" -le "$fd0" ] && ok "listener fds back to $fd0 or fewer ($(fd_count "$SRV"))" \
  || { fail "listener fds $(fd_count "$SRV") > $fd0"; ls -l "/proc/$SRV/fd"; }
kill -0 "$SRV" 2>/dev/null && ok "listener survived" || fail "listener died"
timeout 60 "$SMC" connect --bind "$CIP" "$SIP:$PORT" --send-bytes 1M --expect-echo --require-smc \
  > "$WORK/after.out" 2>&1 && grep -q "mode=same-host .*echo=ok" "$WORK/after.out" \
  && ok "listener still serves same-host connections" || { fail "after kill"; show "$WORK/after.out"; }

# ---- 4. unmodified programs under smc run on the same-host path -------------------------
# redis-server and redis-benchmark, both under smc run (the path on by default): every
# connection SAMEHOST in smc ss, beside plain kernel TCP in the same run (reported).
if command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null; then
  ensure_preload
  RN=$([ "${CI:-}" = true ] && echo 20000 || echo 100000)
  RP=$(free_port)
  "$SMC" run redis-server --bind "$SIP" --port "$RP" --save '' --appendonly no --protected-mode no \
    > "$WORK/redis.log" 2>&1 &
  RPID=$!; PIDS+=("$RPID")
  if wait_listen "$RP"; then
    SMC_RS_LOCAL_ADDR=$CIP timeout 300 "$SMC" run redis-benchmark -h "$SIP" -p "$RP" -t set,get -n "$RN" -q \
      > "$WORK/rb.out" 2> "$WORK/rb.err" &
    BP=$!
    # smc ss every 0.1 s while the benchmark runs (a quiet machine finishes -n 20000 in
    # under a second: one look after 1 s found it gone once): the modes of every
    # snapshot together.
    # $BP is timeout's pid; redis-benchmark is its child (smc run execs it).
    n=0 CPID=
    while kill -0 "$BP" 2>/dev/null; do
      [ -n "$CPID" ] || CPID=$(pgrep -P "$BP" | head -n 1)
      "$SMC" ss --json > "$WORK/rbss.$n.json" 2>/dev/null
      n=$((n + 1))
      sleep 0.1
    done
    wait "$BP"; rc=$?
    # the modes smc ss showed for the server's and for the client's sockets
    modes=$(python3 -c "
import glob, json, sys
seen = {'server': set(), 'client': set()}
for f in glob.glob(sys.argv[1] + '/rbss.*.json'):
    try:
        d = json.load(open(f))
    except ValueError:
        continue
    for s in d:
        # CLC: a connection still in its handshake (the benchmark opens its 50 at the
        # start); SMC: the listener
        if s['mode'] in ('SMC', 'CLC'):
            continue
        for side, pid in (('server', sys.argv[2]), ('client', sys.argv[3])):
            if str(s['pid']) == pid:
                seen[side].add(s['mode'])
print(' '.join(k + '=' + ','.join(sorted(v)) for k, v in seen.items()))" "$WORK" "$RPID" "${CPID:-none}" 2>&1)
    tr '\r' '\n' < "$WORK/rb.out" | grep -E '^(SET|GET): [0-9.]+ requests per second' > "$WORK/rb.res"
    if [ "$rc" = 0 ] && [ "$(wc -l < "$WORK/rb.res")" = 2 ] && [ "$modes" = "server=SAMEHOST client=SAMEHOST" ]; then
      ok "smc run redis-benchmark -t set,get -n $RN → smc run redis-server: done, smc ss saw SAMEHOST only (server and client)"
    else fail "redis under smc run (exit $rc, smc ss modes $modes)"; show "$WORK/rb.out" "$WORK/rb.err" "$WORK/redis.log"; fi
    kill "$RPID" 2>/dev/null; wait "$RPID" 2>/dev/null
    RP2=$(free_port)
    redis-server --bind "$SIP" --port "$RP2" --save '' --appendonly no --protected-mode no > /dev/null 2>&1 &
    RT=$!; PIDS+=("$RT")
    if wait_listen "$RP2"; then
      redis-benchmark -h "$SIP" -p "$RP2" -t set,get -n "$RN" -q 2>/dev/null | tr '\r' '\n' \
        | grep -E '^(SET|GET): [0-9.]+ requests per second' > "$WORK/rbtcp.res"
      rps() { sed -n "s/^$2: \([0-9.]*\) requests per second.*/\1/p" "$1"; }
      echo "perf: redis-benchmark -t set,get -n $RN (50 clients), both ends under smc run on the same-host path beside kernel TCP:" \
        "SET/s $(rps "$WORK/rb.res" SET) vs $(rps "$WORK/rbtcp.res" SET), GET/s $(rps "$WORK/rb.res" GET) vs $(rps "$WORK/rbtcp.res" GET)"
    fi
    kill "$RT" 2>/dev/null; wait "$RT" 2>/dev/null
  else fail "redis-server under smc run did not start"; show "$WORK/redis.log"; fi
else echo "note: redis-server / redis-benchmark not installed: smc run section skipped"; fi

if [ "$FAILS" -gt 0 ]; then echo "smc-samehost: $FAILS check(s) failed"; exit 1; fi
echo "smc-samehost: all checks passed"
