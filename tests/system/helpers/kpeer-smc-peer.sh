#!/usr/bin/env bash
# PEER_CMD of tests/system/kpeer-linux-*.sh: our `smc connect` / `smc listen` against the
# Linux 6.12 kernel VM of tests/kernel-peer/run.sh (smc-server / smc-client modes).
#
# Runs inside the harness's network namespace (KPEER_* variables, see
# tests/kernel-peer/README.md "What PEER_CMD gets"). It first moves itself into the cgroup
# $KPEER_CG where the smc-bpf sock_ops program is attached (pins in $SMC_RS_BPF_DIR), so our
# SYN / SYN-ACK carry the RFC 7609 TCP option: the kernel does SMC only when it was exchanged.
#
# PLAN (environment):
#   client roles (smc-server mode: kernel server, our client)
#     reuse     three 1 MiB echoes in one process (first contact, then subsequent contact on
#               the same link group), idle HOLD_MS after the first and after the last so that
#               TEST LINK runs; then a second process echoes 100 MiB (BIG, default 100M)
#     decline   two echoes (4 KiB, 64 KiB); every one must fall back to TCP after a CLC
#               Decline from the kernel and still echo correctly
#     run       an unmodified program under `smc run`: `ncat` sends 4 MiB of random data,
#               half-closes and reads the echo to the end (then again, a subsequent
#               contact from a second process); identical, and SMC-Rv2 by the
#               SMC_RS_STATS lines of the library
#   server role (smc-client mode: kernel client, our server)
#     serve     echo every connection until SIGTERM; then check: $KPEER_CONNS connections,
#               SMC-Rv2 on one link group (first, then subsequent contact), or with
#               PEER_EXPECT=decline every one declined by us and echoed over TCP
#   scen        (either role) SCEN=srvhalf|abort|urg with smc-kpeer-scen: server half-close
#               first; close with unread data → reset, both ways; urgent data
# Exit status is the verdict (the harness also accepts death by its SIGTERM).
set -u
SMC=${SMC:?path of the smc binary}
PLAN=${PLAN:-reuse}
echo $$ > "$KPEER_CG/cgroup.procs" || { echo "cannot join cgroup $KPEER_CG"; exit 1; }
export SMC_RS_UEID=$KPEER_UEID
# Our own TEST LINK when idle (the kernel's smcr_testlink_time is 5 s in the harness).
export SMC_RS_KEEPALIVE_MS=${SMC_RS_KEEPALIVE_MS:-4000}
export SMC_LOG=${SMC_LOG:-info}
peer=$KPEER_PEER_IP:$KPEER_PORT
log=$KPEER_LOGDIR

fail() { echo "PEER FAIL: $*"; exit 1; }

case $KPEER_ROLE/$PLAN in
client/reuse)
  "$SMC" connect --bind "$KPEER_LOCAL_IP" "$peer" --conns 3 --send-bytes 1M --expect-echo \
    --require-smc --hold-ms "${HOLD_MS:-7000}" --stats > "$log/reuse.out" 2> "$log/reuse.err"
  rc=$?
  cat "$log/reuse.out"; grep -v ' INFO \| DEBUG ' "$log/reuse.err"
  [ "$rc" = 0 ] || fail "smc connect (3 x 1 MiB) exit $rc"
  [ "$(grep -c '^conn .* echo=ok' "$log/reuse.out")" = 3 ] || fail "not 3 verified echoes"
  grep -q '^connected to .*: SMC-R v2, link group lgr1, first contact' "$log/reuse.err" \
    || fail "first connection not SMC-Rv2 first contact"
  [ "$(grep -c '^connected to .*: SMC-R v2, link group lgr1, subsequent contact' "$log/reuse.err")" = 2 ] \
    || fail "connections 2 and 3 did not reuse link group lgr1"
  "$SMC" connect --bind "$KPEER_LOCAL_IP" "$peer" --send-bytes "${BIG:-100M}" --expect-echo \
    --require-smc > "$log/big.out" 2> "$log/big.err"
  rc=$?
  cat "$log/big.out"; grep -v ' INFO \| DEBUG ' "$log/big.err"
  [ "$rc" = 0 ] || fail "smc connect (${BIG:-100M}) exit $rc"
  grep -q '^conn .* echo=ok' "$log/big.out" || fail "big echo not verified"
  echo "PEER OK"
  ;;
client/run)
  head -c 4M /dev/urandom > "$log/run.in"
  for i in 1 2; do
    SMC_RS_LOCAL_ADDR=$KPEER_LOCAL_IP SMC_RS_STATS=$log/run.stats timeout 120 \
      "$SMC" run ncat "$KPEER_PEER_IP" "$KPEER_PORT" < "$log/run.in" > "$log/run$i.out" 2> "$log/run$i.err"
    rc=$?
    grep -v ' INFO \| DEBUG ' "$log/run$i.err"
    [ "$rc" = 0 ] || fail "smc run ncat ($i) exit $rc"
    cmp -s "$log/run.in" "$log/run$i.out" || fail "smc run ncat ($i): the echo differs"
  done
  cat "$log/run.stats"
  [ "$(grep -c ' connect .* mode=SMC-R info="SMC-Rv2 ' "$log/run.stats")" = 2 ] \
    || fail "smc run ncat: not 2 SMC-Rv2 connections"
  [ "$(grep -cE ' close .* mode=SMC-R sent=4194304 received=4194304$' "$log/run.stats")" = 2 ] \
    || fail "smc run ncat: not 4 MiB each way through SMC-R on both connections"
  echo "smc run ncat ×2 → the kernel's SMC-R echo server: 4 MiB each, identical, SMC-Rv2"
  echo "PEER OK"
  ;;
client/decline)
  "$SMC" connect --bind "$KPEER_LOCAL_IP" "$peer" --conns 2 --send-bytes 64K --expect-echo \
    > "$log/decline.out" 2> "$log/decline.err"
  rc=$?
  cat "$log/decline.out"; grep -v ' INFO \| DEBUG ' "$log/decline.err"
  [ "$rc" = 0 ] || fail "smc connect exit $rc"
  [ "$(grep -c '^conn .* echo=ok' "$log/decline.out")" = 2 ] || fail "not 2 verified echoes"
  [ "$(grep -c '^connected to .*: TCP fallback: peer declined' "$log/decline.err")" = 2 ] \
    || fail "connections did not fall back after the kernel's Decline"
  echo "PEER OK"
  ;;
server/serve)
  # Until the harness's SIGTERM (after the kernel's connections, idle time and teardown);
  # passed on to the listener, which then ends its link groups in order.
  "$SMC" listen "$KPEER_LOCAL_IP:$KPEER_PORT" --echo --stats > "$log/listen.out" 2> "$log/listen.err" &
  lpid=$!
  trap 'kill -TERM "$lpid" 2>/dev/null' TERM
  wait "$lpid"; rc=$?
  if kill -0 "$lpid" 2>/dev/null; then wait "$lpid"; rc=$?; fi
  cat "$log/listen.out"; grep -v ' INFO \| DEBUG ' "$log/listen.err"
  case $rc in 0|143) ;; *) fail "smc listen exit $rc" ;; esac
  n=$KPEER_CONNS
  [ "$(grep -c '^accepted ' "$log/listen.err")" = "$n" ] || fail "not $n connections accepted"
  [ "$(grep -c '^conn .* echoed ' "$log/listen.out")" = "$n" ] || fail "not $n connections echoed"
  if [ "${PEER_EXPECT:-smcr}" = decline ]; then
    [ "$(grep -c '^accepted .*: TCP fallback: declined: .*(0x03030000)' "$log/listen.err")" = "$n" ] \
      || fail "not every connection declined by us (NOSMCDEV) and carried on as TCP"
  else
    grep -m1 '^accepted ' "$log/listen.err" | grep -q ': SMC-R v2, link group lgr1, first contact' \
      || fail "first connection not SMC-Rv2 first contact"
    [ "$(grep -c '^accepted .*: SMC-R v2, link group lgr1, subsequent contact' "$log/listen.err")" = $((n - 1)) ] \
      || fail "later connections did not reuse link group lgr1"
    # TEARDOWN=rmmod: the kernel's DELETE LINK (ALL) must have ended our link group.
    if [ "${TEARDOWN:-none}" = rmmod ]; then
      grep -q 'link group terminated: deleted by the peer' "$log/listen.err" \
        || fail "the kernel's DELETE LINK did not end our link group"
      echo "link group ended by the kernel's DELETE LINK"
    fi
  fi
  echo "PEER OK"
  ;;
client/scen)
  # SCEN=srvhalf|abort|urg: the other half of the kernel's scenario (close flows, resets).
  export SMC_RS_LOCAL_ADDR=$KPEER_LOCAL_IP
  exec "$(dirname "$SMC")/smc-kpeer-scen" client "$KPEER_SCEN" "$peer"
  ;;
server/scen)
  exec "$(dirname "$SMC")/smc-kpeer-scen" server "$KPEER_SCEN" "$KPEER_LOCAL_IP:$KPEER_PORT"
  ;;
*) fail "unknown role/plan $KPEER_ROLE/$PLAN" ;;
esac
