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
  "$SMC" bpf install --cgroup "$cg" --pin-dir /sys/fs/bpf/smc-peer > "$log/bpf.txt" 2>&1 \
    || { cat "$log/bpf.txt"; fail "smc bpf install"; }
  echo $$ > "$cg/cgroup.procs" || fail "joining $cg"
}

provider_check() { # FILE WANT: the --stats summary names the devices and their provider
  grep -q "devices=[^ ]*:$2" "$1" || fail "no $2 device in the stats: $(grep -m1 'stats: summary' "$1")"
}

case $PLAN in
kclient|kserver|gserver|gclient|conform)
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
  provider_check "$log/l.out" ibverbs
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
*) fail "unknown plan" ;;
esac
echo "PEER OK ($PLAN)"
