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
#   failover    (either role; the harness with LINKS=2) SMC-R failover (RFC 7609 §4.6) with
#               the kernel: our stack with FO_DEVICES (2: $KPEER_LOCAL_IP and
#               $KPEER_LOCAL_IP2, a symmetric two-link group; 1: only the first, the kernel
#               adds an asymmetric second link). Once FO_AT (default a quarter) of the first
#               connection's BIG bytes have arrived here with two links active, the kernel's
#               NIC that carries the connection's link loses its carrier (QMP set_link,
#               tests/kernel-peer/lib/vmlink.py), FO_DOWN_S seconds (5), then comes back.
#               Checks: every echo intact (SHA-256 here, byte for byte in the kernel), still
#               SMC-R, a failover counted here, two links active again within FO_READD_S
#               (60), one of them over the NIC that was cut (FO_READD=cut) or any
#               (FO_READD=any). Client role: two connections in sequence (BIG each; the link group
#               idles HOLD_MS after each); server role: the kernel's SIZES.
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

# --- failover plan helpers (SIGUSR1 snapshots of our --stats, the kernel NIC's carrier)
snapshots() { # FILE: complete SIGUSR1 snapshots in it
  awk '$0 == "stats: -- SIGUSR1" { s = 1; next } /^stats: -- end$/ { if (s) n++; s = 0 } END { print n + 0 }' "$1"
}
snapshot() { # PID FILE: a new complete SIGUSR1 snapshot in FILE
  local before i
  before=$(snapshots "$2")
  kill -USR1 "$1" 2>/dev/null || return 1
  for i in $(seq 100); do
    [ "$(snapshots "$2")" -gt "$before" ] && return 0
    sleep 0.05
  done
  return 1
}
last_snapshot() { # FILE: the lines of the last complete SIGUSR1 snapshot
  awk '$0 == "stats: -- SIGUSR1" { s = 1; b = ""; next } /^stats: -- end$/ { if (s) last = b; s = 0; next } s { b = b $0 "\n" } END { printf "%s", last }' "$1"
}
# the link-group line of $LGR (the first one while it is unset) in a snapshot on stdin
lgr_line() { grep "^stats: link-group ${LGR:-}" | head -n1; }
active_links() { lgr_line | grep -o '[0-9]*:Active' | wc -l; }
all_links() { lgr_line | grep -o '\(\[\|, \)[0-9]*:' | wc -l; }
summary_field() { # KEY (stdin: a snapshot)
  sed -n "s/^stats: summary .* $1=\([0-9]*\).*/\1/p" | head -n1
}
vmlink() { # NIC up|down: the kernel VM's carrier on NIC
  python3 "$KPEER_DIR/lib/vmlink.py" "$KPEER_OUT" "$KPEER_KERNEL_VM" "$1" "$2"
}
# fo_watch PID FILE BYTES ERRFILE READY: once READY (an ERE) is in ERRFILE (the process has
# its SIGUSR1 handler by then; before, SIGUSR1 would kill it), cut the kernel's NIC of the connection's link once a quarter
# (FO_AT_PCT) of BYTES has arrived with two links active, restore it FO_DOWN_S later, then
# wait until the link group is back to two links, both active, one of them over the NIC that
# was cut (the kernel may first add a stop-gap asymmetric link over its other NIC and delete
# it once the path is back); with FO_READD=any two active links over any kernel NIC do.
# Prints "cut ...", "restored ...", "re-added ..." lines.
fo_watch() {
  local pid=$1 f=$2 bytes=$3 snap r l link gid nic="" cut_ip="" t0 i
  for i in $(seq 600); do
    grep -Eq "$5" "$4" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  local at=$((bytes * ${FO_AT_PCT:-25} / 100))
  # the harness ends PEER_CMD's process group with SIGTERM: say where the watch was
  trap 'echo "watch: stopped by SIGTERM (cut NIC: ${nic:-none})"; exit 1' TERM
  for i in $(seq 3000); do
    kill -0 "$pid" 2>/dev/null || break
    snapshot "$pid" "$f" || { sleep 0.1; continue; }
    snap=$(last_snapshot "$f")
    r=$(sed -n 's/^stats: conn .* received=\([0-9]*\).*/\1/p' <<<"$snap" | head -n1)
    l=$(active_links <<<"$snap")
    if [ -n "$r" ] && [ "$r" -ge "$at" ] && [ "$l" = 2 ]; then
      link=$(sed -n 's/^stats: conn .* link=\([0-9]*\).*/\1/p' <<<"$snap" | head -n1)
      gid=$(grep '^stats: link-group ' <<<"$snap" | head -n1 | grep -o "\(\[\|, \)$link:[^,]*" |
        sed -n 's/.*peer-gid=\([^],]*\).*/\1/p')
      case $gid in
        *:"$KPEER_PEER_IP2") nic=eth1 cut_ip=$KPEER_PEER_IP2 ;;
        *:"$KPEER_PEER_IP") nic=eth0 cut_ip=$KPEER_PEER_IP ;;
        *) echo "watch: link $link has peer GID '$gid', not the kernel's"; return 1 ;;
      esac
      # the re-add must happen in this link group (not in a new one for the next connection)
      LGR="$(lgr_line <<<"$snap" | cut -d' ' -f3) "
      echo "watch: links before the cut: $(lgr_line <<<"$snap")"
      vmlink "$nic" down || return 1
      t0=$SECONDS
      echo "cut: $KPEER_KERNEL_VM $nic down (the connection's link $link, peer GID $gid) at $r bytes"
      break
    fi
    sleep 0.1
  done
  [ -n "$nic" ] || { echo "watch: no cut (never $at bytes with two links active)"; return 1; }
  sleep "${FO_DOWN_S:-5}"
  vmlink "$nic" up || return 1
  echo "restored: $KPEER_KERNEL_VM $nic up after $((SECONDS - t0)) s"
  t0=$SECONDS
  while [ $((SECONDS - t0)) -lt "${FO_READD_S:-60}" ] && kill -0 "$pid" 2>/dev/null; do
    if snapshot "$pid" "$f"; then
      snap=$(last_snapshot "$f")
      if [ "$(active_links <<<"$snap")" = 2 ] && [ "$(all_links <<<"$snap")" = 2 ] &&
        { [ "${FO_READD:-cut}" = any ] ||
          lgr_line <<<"$snap" | grep -q "[0-9]:Active [^,]*peer-gid=::ffff:$cut_ip[],]"; }; then
        echo "re-added: two links active $((SECONDS - t0)) s after the path came back: $(lgr_line <<<"$snap")"
        echo "watch: failovers=$(summary_field failovers <<<"$snap") links-failed=$(summary_field links-failed <<<"$snap")"
        return 0
      fi
    fi
    sleep 0.5
  done
  echo "watch: last snapshot of ${LGR:-the link group}: $(lgr_line <<<"$snap")"
  echo "watch: not two links again within ${FO_READD_S:-60} s of the path coming back"
  return 1
}
fo_devices() { # SMC_RS_DEVICES for FO_DEVICES (2: both our addresses, 1: the default)
  if [ "${FO_DEVICES:-2}" = 2 ]; then
    [ -n "${KPEER_LOCAL_IP2:-}" ] || fail "PLAN=failover FO_DEVICES=2 needs the harness's LINKS=2"
    export SMC_RS_DEVICES=$KPEER_LOCAL_IP,$KPEER_LOCAL_IP2
  else
    unset SMC_RS_DEVICES
  fi
  [ -n "${KPEER_PEER_IP2:-}" ] || fail "PLAN=failover needs the harness's LINKS=2"
}

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
client/failover)
  fo_devices
  big=${BIG:-100M}
  bytes=$(numfmt --from=iec "$big")
  "$SMC" connect --bind "$KPEER_LOCAL_IP" "$peer" --conns 2 --send-bytes "$big" --expect-echo \
    --require-smc --hold-ms "${HOLD_MS:-20000}" --stats > "$log/fo.out" 2> "$log/fo.err" &
  cpid=$!
  fo_watch "$cpid" "$log/fo.out" "$bytes" "$log/fo.err" '^connected to' > "$log/watch.out" 2>&1
  wrc=$?
  wait "$cpid"; rc=$?
  cat "$log/watch.out"
  grep -v '^stats: \| INFO \| DEBUG ' "$log/fo.out"; grep -v ' INFO \| DEBUG ' "$log/fo.err"
  grep '^stats: link-group \|^stats: summary' "$log/fo.out" | tail -n 4
  [ "$wrc" = 0 ] || fail "failover watch failed (see above)"
  [ "$rc" = 0 ] || fail "smc connect exit $rc"
  [ "$(grep -c "^conn [12] mode=SMC-R.* sent $bytes bytes .* received $bytes bytes .* echo=ok" "$log/fo.out")" = 2 ] \
    || fail "not two verified SMC-R echoes of $big"
  grep -q '^connected to .*: SMC-R v2, link group lgr1, first contact' "$log/fo.err" \
    || fail "first connection not SMC-Rv2 first contact"
  grep -q '^connected to .*: SMC-R v2, link group lgr1, subsequent contact' "$log/fo.err" \
    || fail "second connection not on the same link group"
  fo=$(grep -A20 '^stats: -- at exit$' "$log/fo.out" | summary_field failovers)
  [ "${fo:-0}" -ge 1 ] || fail "no failover counted (failovers=${fo:-?})"
  echo "PEER OK: failovers=$fo"
  ;;
server/failover)
  fo_devices
  bytes=$(numfmt --from=iec "${KPEER_SIZES%%,*}")
  "$SMC" listen "$KPEER_LOCAL_IP:$KPEER_PORT" --echo --stats > "$log/listen.out" 2> "$log/listen.err" &
  lpid=$!
  trap 'kill -TERM "$lpid" 2>/dev/null' TERM
  fo_watch "$lpid" "$log/listen.out" "$bytes" "$log/listen.err" '^listening on' > "$log/watch.out" 2>&1 &
  wpid=$!
  wait "$lpid"; rc=$?
  if kill -0 "$lpid" 2>/dev/null; then wait "$lpid"; rc=$?; fi
  wait "$wpid"; wrc=$?
  cat "$log/watch.out"
  grep -v '^stats: ' "$log/listen.out"; grep -v ' INFO \| DEBUG ' "$log/listen.err"
  grep '^stats: link-group \|^stats: summary' "$log/listen.out" | tail -n 4
  case $rc in 0|143) ;; *) fail "smc listen exit $rc" ;; esac
  [ "$wrc" = 0 ] || fail "failover watch failed (see above)"
  n=$KPEER_CONNS
  [ "$(grep -c '^conn .* echoed ' "$log/listen.out")" = "$n" ] || fail "not $n connections echoed"
  grep -q "^conn 1 .*echoed $bytes bytes" "$log/listen.out" || fail "the first connection did not echo $bytes bytes"
  grep -m1 '^accepted ' "$log/listen.err" | grep -q ': SMC-R v2, link group lgr1, first contact' \
    || fail "first connection not SMC-Rv2 first contact"
  fo=$(sed -n 's/^watch: failovers=\([0-9]*\).*/\1/p' "$log/watch.out")
  [ "${fo:-0}" -ge 1 ] || fail "no failover counted (failovers=${fo:-?})"
  echo "PEER OK: failovers=$fo"
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
