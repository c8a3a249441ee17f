#!/bin/sh
# PEER_CMD / HOST_CMD of tests/system/kpeer-bpf-guest.sh (POSIX sh: in the kernel-peer VM it
# runs under busybox). In the VM (Debian's Linux 6.12) `smc bpf install` loads and attaches
# our sock_ops program (crates/bpf/bpf/smc_option.bpf.c) and smc-bpf-probe checks every
# outcome the program records, over loopback in the VM and against the host's kernel.
#
# PLAN:
#   guest   (VM) install; loopback: both marked, only the client, only the server, neither,
#           TCP Fast Open, SYN cookies; then across the bridge: our client → the host's marked
#           server (10.44.0.4:$HPORT), and a marked server on $GPORT for the host's client;
#           status, uninstall
#   host    (namespace, in the test's cgroup with the program installed on the host) a marked
#           server for the guest's client, then a marked client to the guest's server
# Every plan exits non-zero on the first failed check.
set -u
PLAN=${PLAN:?}
HPORT=${HPORT:-5101}
GPORT=${GPORT:-5102}
log=${KPEER_LOGDIR:-/tmp}
mkdir -p "$log"
fail() { echo "PEER FAIL ($PLAN): $*"; exit 1; }
ok() { echo "ok ($PLAN): $*"; }

# expect FILE PATTERN WHAT: FILE has a line matching PATTERN
expect() {
  grep -q "$2" "$1" && { ok "$3"; return 0; }
  sed 's/^/    /' "$1"
  fail "$3: no line matching '$2'"
}

# connect_retry OUT PROBE-ARGS...: the other side may still be starting (connection refused)
connect_retry() {
  out=$1; shift
  i=0
  while :; do
    "$PROBE" --pin-dir "$PIN" client "$@" > "$out" 2>&1 && return 0
    i=$((i + 1))
    [ $i -ge 120 ] && { cat "$out"; return 1; }
    sleep 1
  done
}

case $PLAN in
guest)
  PROBE=/peer/smc-bpf-probe
  SMC=/peer/smc
  PIN=/sys/fs/bpf/smc-bpf-guest
  CG=/sys/fs/cgroup/smc-bpf-guest
  echo "kernel: $(uname -r)"
  mkdir -p "$CG" || fail "cgroup $CG"
  if ! "$SMC" bpf install --cgroup "$CG" --pin-dir "$PIN" > "$log/install.txt" 2>&1; then
    cat "$log/install.txt"
    fail "smc bpf install: the kernel rejected the program"
  fi
  cat "$log/install.txt"
  expect "$log/install.txt" "^installed: $PIN" "smc bpf install on $(uname -r)"
  echo $$ > "$CG/cgroup.procs" || fail "joining $CG"

  # case NAME SERVER-ARGS CLIENT-ARGS CLIENT-TAG SERVER-TAG [COUNT]: loopback in the VM
  case_lo() {
    name=$1 sargs=$2 cargs=$3 ct=$4 st=$5 n=${6:-1}
    # shellcheck disable=SC2086
    timeout 30 "$PROBE" --pin-dir "$PIN" server --listen 127.0.0.1:0 --count "$n" $sargs \
      > "$log/$name.srv" 2>&1 &
    sp=$!
    i=0
    while ! grep -q '^listening' "$log/$name.srv" 2>/dev/null && [ $i -lt 100 ]; do
      sleep 0.1; i=$((i + 1))
    done
    port=$(sed -n 's/^listening port=//p' "$log/$name.srv")
    [ -n "$port" ] || { cat "$log/$name.srv"; fail "$name: server did not listen"; }
    : > "$log/$name.cli"
    k=0
    while [ $k -lt "$n" ]; do
      # shellcheck disable=SC2086
      timeout 20 "$PROBE" --pin-dir "$PIN" client --connect "127.0.0.1:$port" $cargs \
        >> "$log/$name.cli" 2>&1 || { cat "$log/$name.cli"; fail "$name: client failed"; }
      k=$((k + 1))
    done
    wait $sp || { cat "$log/$name.srv"; fail "$name: server failed"; }
    [ "$(grep -c "^connected outcome=$ct " "$log/$name.cli")" = "$n" ] \
      || { cat "$log/$name.cli"; fail "$name: client outcome is not $ct"; }
    [ "$(grep -c "^accepted .* outcome=$st " "$log/$name.srv")" = "$n" ] \
      || { cat "$log/$name.srv"; fail "$name: server outcome is not $st"; }
    ok "$name: client $ct, server $st"
  }
  case_lo both "--mark" "--mark" BothAnnounced BothAnnounced
  case_lo cli "" "--mark" PeerDidNotAnnounce LocalNotAnnounced:NotMarked
  case_lo srv "--mark" "" LocalNotAnnounced:NotMarked PeerDidNotAnnounce
  case_lo none "" "" LocalNotAnnounced:NotMarked LocalNotAnnounced:NotMarked
  # TCP Fast Open: the second connection's SYN carries data and the child is "established"
  # on its SYN (the program keeps the header callbacks until the SYN-ACK is out)
  echo 3 > /proc/sys/net/ipv4/tcp_fastopen || fail "tcp_fastopen"
  case_lo tfo "--mark --fastopen" "--mark --fastopen" BothAnnounced BothAnnounced 2
  # SYN cookies always: no request socket, so no echo
  old_cookies=$(cat /proc/sys/net/ipv4/tcp_syncookies)
  echo 2 > /proc/sys/net/ipv4/tcp_syncookies || fail "tcp_syncookies"
  case_lo cookie "--mark" "--mark" PeerDidNotAnnounce LocalNotAnnounced:SynCookie
  echo "$old_cookies" > /proc/sys/net/ipv4/tcp_syncookies

  # Across the bridge, against the host's kernel and its copy of the program.
  "$PROBE" --pin-dir "$PIN" server --listen "$KPEER_LOCAL_IP:$GPORT" --mark > "$log/gsrv.out" 2>&1 &
  gsp=$!
  connect_retry "$log/gcli.out" --connect "$KPEER_PEER_IP:$HPORT" --mark \
    || fail "client to the host's server"
  cat "$log/gcli.out"
  expect "$log/gcli.out" "^connected outcome=BothAnnounced .*server-outcome=BothAnnounced" \
    "guest client → host server: both announced (6.12 SYN, host SYN-ACK)"
  i=0
  while kill -0 $gsp 2>/dev/null && [ $i -lt 1200 ]; do sleep 0.1; i=$((i + 1)); done
  kill $gsp 2>/dev/null
  wait $gsp || { cat "$log/gsrv.out"; fail "guest server failed"; }
  cat "$log/gsrv.out"
  expect "$log/gsrv.out" "^accepted .* outcome=BothAnnounced" \
    "host client → guest server: both announced (host SYN, 6.12 SYN-ACK)"

  "$SMC" bpf status --pin-dir "$PIN" > "$log/status.txt" 2>&1
  cat "$log/status.txt"
  expect "$log/status.txt" "cgroup $CG" "smc bpf status shows the attachment"
  "$SMC" bpf uninstall --pin-dir "$PIN" || fail "smc bpf uninstall"
  [ -e "$PIN" ] && fail "uninstall left $PIN"
  ok "uninstalled"
  ;;
host)
  PROBE=${PROBE:?}
  PIN=${PIN:?}
  echo $$ > "${CG:?}/cgroup.procs" || fail "joining $CG"
  # bounded: a guest that failed early never connects
  timeout 240 "$PROBE" --pin-dir "$PIN" server --listen "$KPEER_LOCAL_IP:$HPORT" --mark \
    > "$log/hsrv.out" 2>&1 || { cat "$log/hsrv.out"; fail "host server"; }
  cat "$log/hsrv.out"
  connect_retry "$log/hcli.out" --connect "$KPEER_PEER_IP:$GPORT" --mark \
    || fail "client to the guest's server"
  cat "$log/hcli.out"
  expect "$log/hcli.out" "^connected outcome=BothAnnounced .*server-outcome=BothAnnounced" \
    "host client → guest server: both announced"
  ;;
*) fail "unknown plan" ;;
esac
echo "PEER OK ($PLAN)"
