#!/usr/bin/env bash
# System test (issue 12): SMC-R failover (RFC 7609 §4.6) across two network namespaces
# joined by two veth pairs on two subnets (fo0: 10.233.40.0/24, fo1: 10.233.41.0/24). Both
# stacks have a software RNIC on each (SMC_RS_DEVICES), so each link group gets two
# symmetric links. Each run echoes SMC_FO_SIZE (1G) each way; once an eighth of it has
# arrived at the listener (its SIGUSR1 snapshot, both links active), the path of the
# connection's link goes down (`ip link set down` on the client's end in odd runs, the
# server's in even ones; the stacks notice at once by rtnetlink); when the link group is
# down to one link the path comes back, the server adds the link again (C.8 retry,
# SMC_RS_ADD_LINK_RETRY_MS=1000), and with two links again the *other* path goes down
# for good. Checks: both SHA-256 intact, the connection still SMC-R, two failovers on
# each side (it moved twice), the link group down to one link then back to two.
# SMC_FO_RUNS runs in a row (default 3, 1 when CI=true; the README's 50-run loop:
# SMC_FO_RUNS=50), then SMC_FO_LOSS_RUNS (1) more with SMC_FO_LOSS (1%) packet loss on
# both paths in both directions (netem; the RNIC without UDP GSO so that loss is per
# packet, SMC_FO_LOSS_SIZE, default 256M). No eBPF: SMC_RS_SKIP_TCP_OPTION.
#
# Exit: 0 pass, 77 skip (not root), anything else fail.
set -uo pipefail
cd "$(dirname "$0")/../.."
TEST_NAME=smc-failover
. tests/system/lib/smc-common.bash
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)" always
command -v ip >/dev/null || skip "missing ip (run scripts/setup.sh)"
ensure_bin
if [ "${CI:-}" = true ]; then RUNS=${SMC_FO_RUNS:-1}; else RUNS=${SMC_FO_RUNS:-3}; fi
LOSS_RUNS=${SMC_FO_LOSS_RUNS:-1}
LOSS=${SMC_FO_LOSS:-1%}
bytes() { python3 -c "import sys; s=sys.argv[1]; u={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*u[s[-1]] if s[-1] in u else int(s))" "$1"; }
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
# Polls the listener's snapshot (every 50 ms, up to 60 s) until `cond` holds.
snap_until() {
  local cond=$1 _
  for _ in $(seq 1200); do
    request_snapshot "$LPID" "$WORK/srv.out" || return 1
    r=$(srv_received); l=$(srv_links)
    eval "$cond" && return 0
    kill -0 "$CPID" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
# Loss on both paths, both directions: tc netem where the kernel has sch_netem, else
# nftables `numgen random` drops of RoCEv2 (UDP 4791) on arrival in each namespace (a
# drop on the sender's output would fail its sendmsg instead of losing the packet).
LOSS_PERMILLE=$(python3 -c "import sys; print(round(float(sys.argv[1].rstrip('%'))*10))" "$LOSS")
IMPAIR=""
netem() { # netem add|del
  local op=$1 i n
  if [ "$op" = del ]; then
    for i in 0 1; do
      tc -n "$NS_C" qdisc del dev "fo${i}c$$" root 2>/dev/null
      tc -n "$NS_S" qdisc del dev "fo${i}s$$" root 2>/dev/null
    done
    for n in "$NS_C" "$NS_S"; do ip netns exec "$n" nft delete table ip fo_loss 2>/dev/null; done
    return 0
  fi
  if tc -n "$NS_C" qdisc replace dev fo0c$$ root netem loss "$LOSS" 2>/dev/null; then
    IMPAIR="tc netem loss $LOSS"
    for i in 0 1; do
      tc -n "$NS_C" qdisc replace dev "fo${i}c$$" root netem loss "$LOSS" || return 1
      tc -n "$NS_S" qdisc replace dev "fo${i}s$$" root netem loss "$LOSS" || return 1
    done
    return 0
  fi
  command -v nft >/dev/null || return 1
  IMPAIR="nftables: RoCEv2 packets dropped on arrival; no sch_netem here"
  for n in "$NS_C" "$NS_S"; do
    ip netns exec "$n" nft -f - <<NFT || return 1
table ip fo_loss {
  chain in {
    type filter hook prerouting priority -300; policy accept;
    udp dport 4791 numgen random mod 1000 < $LOSS_PERMILLE counter drop
  }
}
NFT
  done
}

TOTAL=$((RUNS + LOSS_RUNS))
for run in $(seq "$TOTAL"); do
  if [ "$run" -gt "$RUNS" ]; then
    SIZE=${SMC_FO_LOSS_SIZE:-256M}; LOSSY="with $LOSS loss"; export SMC_RS_SOFTROCE_GSO=0
    netem add || { fail "cannot inject loss (neither sch_netem nor nftables)"; break; }
    LOSSY="with $LOSS loss ($IMPAIR)"
  else
    SIZE=${SMC_FO_SIZE:-1G}; LOSSY=""; unset SMC_RS_SOFTROCE_GSO
  fi
  BYTES=$(bytes "$SIZE")
  if [ $((run % 2)) = 1 ]; then SIDE_NS=$NS_C; SIDE=c; else SIDE_NS=$NS_S; SIDE=s; fi
  : > "$WORK/srv.out"
  start_listen srv ip netns exec "$NS_S" env SMC_RS_DEVICES=10.233.40.2,10.233.41.2 -- \
    10.233.40.2:0 --echo --count 1 --stats
  SMC_RS_DEVICES=10.233.40.1,10.233.41.1 timeout 600 ip netns exec "$NS_C" "$SMC" connect \
    "10.233.40.2:$PORT" --send-bytes "$SIZE" --seed "$run" --expect-echo --require-smc \
    --concurrent --stats > "$WORK/cli.out" 2> "$WORK/cli.err" &
  CPID=$!; PIDS+=("$CPID")
  steps=""
  # 1: the first path (fo0: the first link's, and the TCP connection's) goes down.
  if snap_until '[ -n "$r" ] && [ "$r" -gt $((BYTES / 8)) ] && [ "$l" = 2 ]'; then
    ip -n "$SIDE_NS" link set "fo0$SIDE$$" down && steps="fo0 down at $r bytes"
    # 2: down to one link; the path comes back; the server adds the link again.
    if snap_until '[ "$l" = 1 ]'; then
      ip -n "$SIDE_NS" link set "fo0$SIDE$$" up
      if snap_until '[ "$l" = 2 ]'; then
        # 3: the other path goes down for good (the connection is on it by now).
        ip -n "$SIDE_NS" link set "fo1$SIDE$$" down && steps="$steps, 1 link, back to 2 links at $r bytes, fo1 down"
        snap_until '[ "$l" = 1 ]' && steps="$steps, 1 link"
      fi
    fi
  fi
  wait_exit "$CPID" 600; rc=$?
  wait_exit "$LPID" 60; lrc=$?
  ip -n "$SIDE_NS" link set "fo1$SIDE$$" up
  [ -n "$LOSSY" ] && netem del
  line=$(grep "^conn 1 " "$WORK/cli.out")
  sent_sha=$(sed -n 's/.* sent [0-9]* bytes sha256=\([0-9a-f]*\) .*/\1/p' <<<"$line")
  cfo=$(stats_field "$WORK/cli.out" "at exit" failovers)
  sfo=$(stats_field "$WORK/srv.out" "at exit" failovers)
  bad=0
  case "$steps" in
    *"fo1 down, 1 link") ;;
    *) fail "run $run: the cut/re-add/cut sequence did not complete before the transfer ended: ${steps:-nothing}"; bad=1 ;;
  esac
  [ "$rc" = 0 ] || { fail "run $run: client exit $rc"; bad=1; }
  [ "$lrc" = 0 ] || { fail "run $run: listener exit $lrc"; bad=1; }
  grep -q "^conn 1 mode=SMC-R.* sent $BYTES bytes .* received $BYTES bytes .* echo=ok" <<<"$line" \
    || { fail "run $run: client result: $line"; bad=1; }
  { [ -n "$sent_sha" ] && grep -q "^conn 1 .*echoed $BYTES bytes sha256=$sent_sha" "$WORK/srv.out"; } \
    || { fail "run $run: listener did not echo the client's bytes"; bad=1; }
  [ "${cfo:-0}" -ge 2 ] || { fail "run $run: client failovers=${cfo:-?} (2 expected)"; bad=1; }
  [ "${sfo:-0}" -ge 2 ] || { fail "run $run: listener failovers=${sfo:-?} (2 expected)"; bad=1; }
  if [ "$bad" = 0 ]; then
    ok "run $run/$TOTAL: $SIZE each way intact over SMC-R $LOSSY, $steps; failovers client=$cfo listener=$sfo"
  else
    show "$WORK/cli.out" "$WORK/cli.err" "$WORK/srv.out" "$WORK/srv.err"
    break
  fi
done
if [ "$FAILS" -gt 0 ]; then echo "smc-failover: $FAILS check(s) failed"; exit 1; fi
echo "smc-failover: all $TOTAL run(s) passed"
