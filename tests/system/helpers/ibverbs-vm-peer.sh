#!/bin/sh
# PEER_CMD / HOST_CMD of tests/system/ibverbs-rxe.sh (POSIX sh: inside the kernel-peer VM it
# runs under busybox). In the VM the smc binary sits in /peer (PEER_FILES) and uses the rxe
# device through libibverbs; on the host it is $SMC with the software RNIC.
#
# PLAN:
#   kclient   (VM, smc-server mode) our client → the kernel's SMC-R server: two 1 MiB echoes
#             (first contact, then subsequent contact on the same link group), then BIG
#   kserver   (VM, smc-client mode) our server for the kernel's client, until SIGTERM
#   conform   (VM) the provider-independent verbs conformance suite on rxe0
#   gserver / gclient   (VM) our server / client against our stack on the host (softroce)
#   hserver / hclient   (host namespace) the other half, on the software RNIC
#   gportdown (VM) our server, one process throughout; eth0 (rxe0's netdev) goes down twice:
#             under an idle connection (the provider must get the port-error async event
#             and fail the QPs, and that alone must take the link down and end the
#             connection: TEST LINK is off for 120 s) and under a running transfer (ends
#             with an error, no hang); after each, eth0 up: the device is active again and
#             new SMC-R connections work (a new link group)
#   hportdown (host namespace) the other half: an idle connection, then 1 MiB echoes until
#             one works, a long transfer (must fail), 1 MiB echoes until one works
#   gdevdel   (VM) our server, one process throughout; with an idle SMC-R connection and
#             one under a running transfer, rxe0 is deleted (`rdma link delete`, through
#             kpeer rxe-del). rxe reports no async event for this; the provider must see
#             the kernel's removal uevent, fail the QPs (TEST LINK off for 120 s: nothing
#             else can end the idle link), end both connections, and release the device:
#             the kernel's deletion waits for that, so it must return in bounded time.
#             Then rxe0 is added again and a new connection is SMC-R on the new device.
#   hdevdel   (host namespace) the other half: the idle connection and the long transfer
#             at once (both must fail, not hang), then 1 MiB echoes until one works. Each
#             process's software RNIC needs an address of its own (UDP 4791): the idle
#             connection comes from a second address on the namespace's bridge (IDLE_IP)
# Every plan checks that the provider it expects was used and exits non-zero on failure.
set -u
SMC=${SMC:-/peer/smc}
PLAN=${PLAN:?}
export SMC_RS_UEID=${KPEER_UEID:-SMC-RS-KPEER}
export SMC_LOG=${SMC_LOG:-info}
log=${KPEER_LOGDIR:-/tmp}
mkdir -p "$log"
fail() { echo "PEER FAIL ($PLAN): $*"; exit 1; }
count() { grep -c "$1" "$2" 2>/dev/null || true; }
show() { cat "$1.out"; grep -v ' DEBUG ' "$1.err"; }

# The kernel does SMC-R only when the SYN carried the RFC 7609 TCP option: our eBPF
# sock_ops program on a cgroup of our own (bpffs and cgroup2 are mounted by the VM's init).
bpf_option() {
  cg=/sys/fs/cgroup/smc-peer
  mkdir -p "$cg" || fail "cgroup"
  # the stack finds the installation through SMC_RS_BPF_DIR
  export SMC_RS_BPF_DIR=/sys/fs/bpf/smc-peer
  "$SMC" bpf install --cgroup "$cg" --pin-dir "$SMC_RS_BPF_DIR" > "$log/bpf.txt" 2>&1 \
    || { cat "$log/bpf.txt"; fail "smc bpf install"; }
  echo $$ > "$cg/cgroup.procs" || fail "joining $cg"
}

provider_check() { # FILE WANT: the --stats summary names the devices and their provider
  grep -q "devices=[^ ]*:$2" "$1" || fail "no $2 device in the stats: $(grep -m1 'stats: summary' "$1")"
}
# used_rxe FILE: the log (SMC_LOG=info) says the stack opened rxe0 through libibverbs; for
# servers stopped by a signal, whose link groups are gone when the stats are printed
used_rxe() {
  grep -q 'ibverbs device opened device=rxe0' "$1" || fail "rxe0 was not used through ibverbs"
}

# wait_for SECONDS COMMAND...: polls COMMAND every 0.2 s; false when it never succeeds
wait_for() {
  n=$(($1 * 5)); shift
  while ! "$@"; do
    n=$((n - 1)); [ $n -le 0 ] && return 1
    sleep 0.2
  done
}
lines() { [ "$(count "$2" "$3")" -ge "$1" ]; } # N PATTERN FILE: at least N matching lines

# Our server in the VM for the event plans: $srv.out/.err, process $lpid.
serve_events() {
  srv=$1
  # SMC_LOG=info shows the provider's event lines. TEST LINK only every 120 s here: an
  # idle link must be taken down by the device's event, not by a keepalive.
  SMC_RS_KEEPALIVE_MS=120000 "$SMC" listen "$KPEER_LOCAL_IP:$KPEER_PORT" --echo --stats \
    > "$srv.out" 2> "$srv.err" &
  lpid=$!
  trap 'kill -TERM $lpid 2>/dev/null' TERM
}
stop() { kill -TERM $lpid 2>/dev/null; wait $lpid; show "$srv"; }
die() { stop; fail "$*"; }
accepted() { count '^accepted ' "$srv.err"; }
ended() { grep -q "^conn $1 peer=.*: " "$srv.err"; } # CONN ended with an error
# first connection after the N-th accepted one that is SMC-R and was echoed in full → k
echoed_after() {
  k=$(grep '^accepted ' "$srv.err" | awk -v n="$1" 'NR > n && /: SMC-R v2, link group/ { print NR }' |
    while read -r j; do grep -q "^conn $j .* echoed " "$srv.out" && { echo "$j"; break; }; done)
  [ -n "$k" ]
}
# connect_idle OUT: an SMC-R connection that sends nothing (stdin: a FIFO nobody writes
# to; fd 3 holds it open), TEST LINK every 3 s, in the background as $cpid; retried
# while the server is not listening yet
connect_idle() { # OUT [LOCAL_IP]
  rm -f "$log/$1.fifo"; mkfifo "$log/$1.fifo" || fail "mkfifo"
  i=0
  while :; do
    SMC_RS_KEEPALIVE_MS=3000 timeout 200 "$SMC" connect --bind "${2:-$KPEER_LOCAL_IP}" \
      "$KPEER_PEER_IP:${KPEER_PORT:-5000}" < "$log/$1.fifo" > "$log/$1.out" 2> "$log/$1.err" &
    cpid=$!
    exec 3> "$log/$1.fifo"
    wait_for 60 connected_or_gone "$log/$1.err"
    grep -q '^connected to ' "$log/$1.err" && return 0
    exec 3>&-
    kill $cpid 2>/dev/null; wait $cpid
    i=$((i + 1)); [ $i -ge 120 ] && { show "$log/$1"; fail "idle connection: never connected"; }
    sleep 1
  done
}
connected_or_gone() { grep -q '^connected to ' "$1" || ! kill -0 $cpid 2>/dev/null; }

case $PLAN in
kclient|kserver|gserver|gclient|conform|gportdown|gdevdel)
  "$SMC" rdma devices --addr "$KPEER_LOCAL_IP" || fail "smc rdma devices"
  ;;
esac

case $PLAN in
kclient)
  bpf_option
  "$SMC" connect --bind "$KPEER_LOCAL_IP" "$KPEER_PEER_IP:$KPEER_PORT" --conns 2 --send-bytes 1M \
    --expect-echo --require-smc --stats > "$log/c1.out" 2> "$log/c1.err"
  rc=$?; show "$log/c1"
  [ $rc = 0 ] || fail "smc connect (2 x 1 MiB) exit $rc"
  [ "$(count '^conn .* echo=ok' "$log/c1.out")" = 2 ] || fail "not 2 verified echoes"
  grep -q '^connected to .*: SMC-R v2, link group lgr1, first contact' "$log/c1.err" || fail "no first contact"
  grep -q '^connected to .*: SMC-R v2, link group lgr1, subsequent contact' "$log/c1.err" || fail "no subsequent contact"
  provider_check "$log/c1.out" ibverbs
  "$SMC" connect --bind "$KPEER_LOCAL_IP" "$KPEER_PEER_IP:$KPEER_PORT" --send-bytes "${BIG:-100M}" \
    --expect-echo --require-smc --stats > "$log/c2.out" 2> "$log/c2.err"
  rc=$?; show "$log/c2"
  [ $rc = 0 ] || fail "smc connect (${BIG:-100M}) exit $rc"
  grep -q '^conn .* echo=ok' "$log/c2.out" || fail "big echo not verified"
  provider_check "$log/c2.out" ibverbs
  ;;
kserver|gserver)
  # kserver: until the harness's SIGTERM (after the kernel's connections); gserver: exits
  # after EXPECT_CONNS connections (peer-host waits for both sides to exit)
  count=
  if [ $PLAN = kserver ]; then bpf_option; else count="--count ${EXPECT_CONNS:-2}"; fi
  # shellcheck disable=SC2086
  "$SMC" listen "$KPEER_LOCAL_IP:$KPEER_PORT" --echo --stats $count > "$log/l.out" 2> "$log/l.err" &
  lpid=$!
  trap 'kill -TERM $lpid 2>/dev/null' TERM
  wait $lpid; rc=$?
  if kill -0 $lpid 2>/dev/null; then wait $lpid; rc=$?; fi
  show "$log/l"
  case $rc in 0|143) ;; *) fail "smc listen exit $rc" ;; esac
  n=${EXPECT_CONNS:-$KPEER_CONNS}
  [ "$(count '^accepted .*: SMC-R v2, link group lgr1' "$log/l.err")" = "$n" ] || fail "not $n SMC-Rv2 connections on lgr1"
  [ "$(count '^conn .* echoed ' "$log/l.out")" = "$n" ] || fail "not $n connections echoed"
  grep -m1 '^accepted ' "$log/l.err" | grep -q 'first contact' || fail "first connection not first contact"
  used_rxe "$log/l.err"
  ;;
gclient|hclient)
  # the server side may still be starting: retry the first connection for a while
  i=0
  while :; do
    "$SMC" connect --bind "$KPEER_LOCAL_IP" "$KPEER_PEER_IP:${KPEER_PORT:-5000}" --conns 2 \
      --send-bytes "${SIZE:-4M}" --expect-echo --require-smc --stats > "$log/g.out" 2> "$log/g.err"
    rc=$?
    if [ $rc != 0 ] && grep -q -i 'refused' "$log/g.err" && [ $i -lt 120 ]; then
      i=$((i + 1)); sleep 1; continue
    fi
    break
  done
  show "$log/g"
  [ $rc = 0 ] || fail "smc connect exit $rc"
  [ "$(count '^conn .* echo=ok' "$log/g.out")" = 2 ] || fail "not 2 verified echoes"
  grep -q 'subsequent contact' "$log/g.err" || fail "no subsequent contact"
  provider_check "$log/g.out" "${WANT:-ibverbs}"
  ;;
hserver)
  "$SMC" listen "$KPEER_LOCAL_IP:${KPEER_PORT:-5000}" --echo --stats --count 2 > "$log/h.out" 2> "$log/h.err"
  rc=$?; show "$log/h"
  [ $rc = 0 ] || fail "smc listen exit $rc"
  [ "$(count '^conn .* echoed ' "$log/h.out")" = 2 ] || fail "not 2 connections echoed"
  provider_check "$log/h.out" softroce
  ;;
conform)
  # Linux rxe (6.12) completes a SEND whose SGE lies outside its MR with WR_FLUSH_ERR (not
  # LOC_PROT_ERR) and a too-long SEND with LOC_QP_OP_ERR at the receiver (not LOC_LEN_ERR):
  # statuses rxe does not produce; every other case must pass.
  "$SMC" rdma conformance --addr "$KPEER_LOCAL_IP" --known loc-prot-err --known loc-len-err-rem-inv-req \
    || fail "verbs conformance suite"
  ;;
gportdown)
  serve_events "$log/p"
  # port_cycle CONN LIMIT WHAT: eth0 down; connection CONN must end with an error within
  # LIMIT s; eth0 up; the provider must see the port active again
  port_cycle() {
    up0=$(count 'port active again' "$log/p.err")
    t0=$(date +%s)
    ip link set eth0 down || die "ip link set eth0 down"
    echo "eth0 down ($3)"
    wait_for "$2" ended "$1"; ended=$?
    t1=$(date +%s)
    ip link set eth0 up || die "ip link set eth0 up"
    echo "eth0 up"
    [ $ended = 0 ] || die "$3: connection $1 did not end within $2 s of the port going down"
    echo "$3: connection $1 ended $((t1 - t0)) s after the port went down: $(grep -m1 "^conn $1 peer=" "$log/p.err")"
    wait_for 60 lines $((up0 + 1)) 'port active again' "$log/p.err" || die "no PORT_ACTIVE after eth0 up"
  }
  # 1. an idle SMC-R connection (the host sends nothing): only the async event can tell
  wait_for 300 lines 1 '^accepted ' "$log/p.err" || die "no first connection"
  grep -m1 '^accepted ' "$log/p.err" | grep -q 'SMC-R v2' || die "the idle connection is not SMC-R"
  sleep 2
  port_cycle 1 20 idle
  # the order in the log: the port-error event, the provider failing the QPs, then the link
  ev=$(grep -n 'device unusable: failing its QPs' "$log/p.err" | head -1 | cut -d: -f1)
  down=$(grep -n 'link down' "$log/p.err" | head -1 | cut -d: -f1)
  [ -n "$ev" ] && [ -n "$down" ] && [ "$ev" -lt "$down" ] \
    || die "idle: the link did not go down after the provider failed the QPs (lines ${ev:-none}, ${down:-none})"
  grep 'device unusable\|link down\|link group terminated\|^conn 1 ' "$log/p.err" | sed 's/^/  idle: /'
  # 2. a connection moving data (the host's long transfer, after an echo that works again)
  n=$(accepted)
  wait_for 300 echoed_after "$n" || die "no working SMC-R connection after the port came back"
  echo "connection $k: SMC-R again after the port came back, echoed"
  big=$((k + 1))
  wait_for 120 lines $big '^accepted ' "$log/p.err" || die "no long transfer"
  sleep 3
  grep -q "^conn $big " "$log/p.out" "$log/p.err" && die "the long transfer ended before the port went down"
  port_cycle $big 60 busy
  # 3. and again: a new link group in the same process
  n=$(accepted)
  wait_for 300 echoed_after "$n" || die "no working SMC-R connection after the port came back (2)"
  grep '^accepted ' "$log/p.err" | sed -n "${k}p" | grep -q 'first contact' || die "connection $k: not a new link group"
  echo "connection $k: SMC-R on a new link group, echoed"
  stop
  grep -q 'event=port error' "$log/p.err" || fail "the port-error async event is not in the log"
  grep -q '^conn 1 .* echoed ' "$log/p.out" && fail "the idle connection ended normally"
  grep -q "^conn $big .* echoed " "$log/p.out" && fail "the long transfer was echoed in full despite the port going down"
  used_rxe "$log/p.err"
  ;;
gdevdel)
  serve_events "$log/r"
  # 1. the host's idle connection, then its long transfer
  wait_for 300 lines 2 '^accepted ' "$srv.err" || die "not two connections"
  [ "$(count '^accepted .*: SMC-R v2' "$srv.err")" = 2 ] || die "the two connections are not SMC-R"
  sleep 3
  ended 1 && die "the idle connection ended before the device was removed"
  ended 2 && die "the long transfer ended before the device was removed"
  t0=$(date +%s)
  (kpeer rxe-del name=rxe0; echo $? > "$log/del.rc") > "$log/del.log" 2>&1 &
  echo "rxe0 deleted (rdma link delete)"
  wait_for 30 ended 1 || die "the idle connection did not end within 30 s of the device removal"
  wait_for 30 ended 2 || die "the long transfer did not end within 30 s of the device removal"
  echo "both connections ended $(($(date +%s) - t0)) s after the removal: $(grep '^conn [12] peer=' "$srv.err" | tr '\n' ' ')"
  # the kernel finishes unregistering rxe0 only when no process has it open any more
  wait_for 60 test -s "$log/del.rc" \
    || die "the kernel's removal of rxe0 did not finish within 60 s: the device is still held open"
  [ "$(cat "$log/del.rc")" = 0 ] || die "kpeer rxe-del failed: $(cat "$log/del.log")"
  echo "the kernel finished removing rxe0 $(($(date +%s) - t0)) s after the deletion began (device released)"
  [ -e /sys/class/infiniband/rxe0 ] && die "rxe0 still in sysfs"
  kill -0 $lpid 2>/dev/null || die "the server exited"
  # the order in the log: the removal, the provider failing the QPs, then the link
  ev=$(grep -n 'device removed' "$srv.err" | head -1 | cut -d: -f1)
  down=$(grep -n 'link down' "$srv.err" | head -1 | cut -d: -f1)
  [ -n "$ev" ] && [ -n "$down" ] && [ "$ev" -lt "$down" ] \
    || die "the link did not go down after the provider saw the removal (lines ${ev:-none}, ${down:-none})"
  grep -q 'RDMA device removed: released' "$srv.err" || die "the stack did not release the removed device"
  grep 'device removed\|link down\|link group terminated\|released\|^conn [12] ' "$srv.err" | sed 's/^/  removal: /'
  # 2. rxe0 again: a new connection is SMC-R on the new device (a new link group)
  kpeer rxe-add name=rxe0 netdev=eth0 || die "kpeer rxe-add"
  echo "rxe0 added again"
  wait_for 300 echoed_after 2 || die "no working SMC-R connection after rxe0 was added again"
  grep '^accepted ' "$srv.err" | sed -n "${k}p" | grep -q 'first contact' || die "connection $k: not a new link group"
  echo "connection $k: SMC-R on the new rxe0 (new link group), echoed"
  stop
  [ "$(count 'ibverbs device opened device=rxe0' "$srv.err")" -ge 2 ] || fail "rxe0 was not opened anew"
  grep -q 'provider auto: softroce' "$srv.err" && fail "a connection used the software RNIC"
  grep -q '^conn 1 .* echoed ' "$srv.out" && fail "the idle connection ended normally"
  grep -q '^conn 2 .* echoed ' "$srv.out" && fail "the long transfer was echoed in full despite the removal"
  ;;
hdevdel)
  # the idle connection, then the long transfer (minutes under TCG) beside it
  idle_ip=${IDLE_IP:-10.44.0.5}
  ip addr add "$idle_ip/${KPEER_PREFIX:-24}" dev br0 || fail "ip addr add $idle_ip"
  trap 'ip addr del "$idle_ip/${KPEER_PREFIX:-24}" dev br0 2>/dev/null' EXIT
  connect_idle r1 "$idle_ip"
  timeout 240 "$SMC" connect --bind "$KPEER_LOCAL_IP" "$KPEER_PEER_IP:${KPEER_PORT:-5000}" --send-bytes 4G \
    --expect-echo --require-smc > "$log/r2.out" 2> "$log/r2.err" &
  bpid=$!
  wait $cpid; rc1=$?
  exec 3>&-
  wait $bpid; rc2=$?
  show "$log/r1"; show "$log/r2"
  grep -q '^connected to .*: SMC-R v2' "$log/r1.err" || fail "idle connection: not SMC-R"
  grep -q '^connected to .*: SMC-R v2' "$log/r2.err" || fail "long transfer: not SMC-R"
  case $rc1 in
    0) fail "idle connection: ended normally although the peer's device was removed" ;;
    124) fail "idle connection: hung after the peer's device was removed" ;;
  esac
  case $rc2 in
    0) fail "long transfer: succeeded although the peer's device was removed" ;;
    124) fail "long transfer: hung after the peer's device was removed" ;;
  esac
  echo "idle connection (exit $rc1) and long transfer (exit $rc2) failed as they should"
  i=0
  while :; do
    "$SMC" connect --bind "$KPEER_LOCAL_IP" "$KPEER_PEER_IP:${KPEER_PORT:-5000}" --send-bytes 1M \
      --expect-echo --require-smc > "$log/r3.out" 2> "$log/r3.err"
    rc=$?
    [ $rc = 0 ] && break
    i=$((i + 1)); [ $i -ge 60 ] && break
    sleep 2
  done
  show "$log/r3"
  [ $rc = 0 ] || fail "no working connection after the peer's device came back"
  grep -q 'first contact' "$log/r3.err" || fail "not a new link group"
  ;;
hportdown)
  port=${KPEER_PORT:-5000}
  # 1. idle: connected, sends nothing (stdin is a FIFO nobody writes to); the peer's port
  # goes down; our side must notice by itself (TEST LINK every 3 s) and exit with an error
  mkfifo "$log/idle.fifo" || fail "mkfifo"
  i=0
  while :; do
    SMC_RS_KEEPALIVE_MS=3000 timeout 200 "$SMC" connect --bind "$KPEER_LOCAL_IP" "$KPEER_PEER_IP:$port" \
      < "$log/idle.fifo" > "$log/d1.out" 2> "$log/d1.err" &
    cpid=$!
    exec 3> "$log/idle.fifo"
    wait $cpid; rc=$?
    exec 3>&-
    if [ $rc != 0 ] && grep -q -i 'refused' "$log/d1.err" && [ $i -lt 120 ]; then
      i=$((i + 1)); sleep 1; continue
    fi
    break
  done
  show "$log/d1"
  grep -q '^connected to .*: SMC-R v2' "$log/d1.err" || fail "idle connection: not SMC-R"
  case $rc in
    0) fail "idle connection: ended normally although the peer's port went down" ;;
    124) fail "idle connection: hung after the peer's port went down" ;;
  esac
  echo "idle connection failed as it should (exit $rc)"
  # echo1 OUT: retry 1 MiB echoes (every 2 s, up to 2 min) until one is SMC-R and verified
  echo1() {
    i=0
    while :; do
      "$SMC" connect --bind "$KPEER_LOCAL_IP" "$KPEER_PEER_IP:$port" --send-bytes 1M --expect-echo \
        --require-smc > "$log/$1.out" 2> "$log/$1.err"
      rc=$?
      [ $rc = 0 ] && break
      i=$((i + 1)); [ $i -ge 60 ] && break
      sleep 2
    done
    show "$log/$1"
    [ $rc = 0 ] || fail "no working connection after the peer's port came back"
  }
  echo1 d2
  # 2. busy: the port goes down under this one (minutes of data under TCG): it must fail,
  # not hang
  timeout 240 "$SMC" connect --bind "$KPEER_LOCAL_IP" "$KPEER_PEER_IP:$port" --send-bytes 4G \
    --expect-echo --require-smc > "$log/d3.out" 2> "$log/d3.err"
  rc=$?
  show "$log/d3"
  case $rc in
    0) fail "long transfer: succeeded although the peer's port went down" ;;
    124) fail "long transfer: hung after the peer's port went down" ;;
  esac
  echo "long transfer failed as it should (exit $rc)"
  # 3. works again
  echo1 d4
  grep -q 'first contact' "$log/d4.err" || fail "not a new link group"
  ;;
*) fail "unknown plan" ;;
esac
echo "PEER OK ($PLAN)"
