#!/usr/bin/env bash
# System test (issue 10): a malicious peer against the real binary. `smc listen --echo`
# on 127.0.0.2 carries an honest `smc connect` transfer (SMC-R, SHA-256 verified both
# ways) while the attacker (`cargo build --release -p smc --example attacker`, the
# malicious-peer suite's harness) attacks from other loopback addresses:
#  1. decline-dos: three TCP connections that carry only a CLC Decline with the S flag
#     naming the honest client's Peer ID (read from the listener's SIGUSR1 snapshot, as
#     an on-path observer reads it from the Proposal);
#  2. test-link-flood: a full SMC-R rendezvous of its own, then TEST LINK requests as fast
#     as its link takes them, answers unread.
# Each round has its own listener. The honest transfer must finish intact, and the
# listener must still serve a new SMC-R connection afterwards.
#
# A defence found missing can be listed in EXPECT_FAIL (default: none; every attack must
# fail): such an attack succeeding is then reported as "xfail" and the script exits 77
# naming it; such an attack failing is reported as "XPASS: remove it from EXPECT_FAIL"
# (not an error: the flood does not stop a vulnerable listener every time). The flood
# runs up to three times.
#
# Exit: 0 pass, 77 skip (or known gaps only), anything else fail. SMC_TEST_SIZE sets the
# honest transfer's size (default 512M, 256M with CI=true).
set -uo pipefail
cd "$(dirname "$0")/../.."
TEST_NAME=smc-malicious
. tests/system/lib/smc-common.bash
ensure_bin
ATTACKER=$BIN/examples/attacker
case $BIN in
  # Built here (a no-op when up to date): `cargo build --bins` does not build examples.
  */release) CARGO_TARGET_DIR=${BIN%/release} cargo build --release -q -p smc --example attacker \
               || { echo "FAIL: build attacker"; exit 1; } ;;
  *) [ -x "$ATTACKER" ] || { echo "FAIL: $ATTACKER not found"; exit 1; } ;;
esac
EXPECT_FAIL=${EXPECT_FAIL-}
if [ "${CI:-}" = true ]; then SIZE=${SMC_TEST_SIZE:-256M}; else SIZE=${SMC_TEST_SIZE:-512M}; fi
export SMC_RS_SKIP_TCP_OPTION='127.0.0.0/8:*'
# Short timers so that dead peers and idle link groups go within the test.
export SMC_RS_KEEPALIVE_MS=500 SMC_RS_CLC_TIMEOUT_MS=3000
SIP=${SMC_TEST_SERVER_IP:-127.0.0.2}; CIP=${SMC_TEST_CLIENT_IP:-127.0.0.1}
AIP=${SMC_TEST_ATTACKER_IP:-127.0.0.23}

XFAILS=()
expected() { [[ " $EXPECT_FAIL " == *" $1 "* ]]; }
verdict() { # verdict NAME OK(0/1; 2: inconclusive, already reported) DETAIL
  if [ "$2" = 2 ]; then return; fi
  if [ "$2" = 0 ]; then
    if expected "$1"; then echo "XPASS: $1 ($3): remove it from EXPECT_FAIL"
    else ok "$1: $3"; fi
  else
    if expected "$1"; then echo "xfail: $1 ($3)"; XFAILS+=("$1")
    else fail "$1: $3"; fi
  fi
}

# gone_within PID SECS: whether the child exits within SECS (never waits longer; the
# library's wait_exit waits for a process that ignores SIGTERM).
gone_within() {
  local i
  for i in $(seq $(($2 * 20))); do
    kill -0 "$1" 2>/dev/null || { wait "$1" 2>/dev/null; return 0; }
    sleep 0.05
  done
  return 1
}

# round NAME ATTACK-ARGS...: listener + honest transfer + attack; sets ROUND_OK (0 when
# the honest transfer and the listener came through, 1 when not, 2 when the round proved
# nothing and said so) and ROUND_WHY.
round() {
  local name=$1; shift
  start_listen "$name-srv" -- "$SIP:0" --echo --stats
  local srv=$WORK/$name-srv.out
  timeout 300 "$SMC" connect --bind "$CIP" "$SIP:$PORT" --send-bytes "$SIZE" --seed 11 --expect-echo \
    --require-smc > "$WORK/$name-cli.out" 2> "$WORK/$name-cli.err" &
  local cpid=$! i pid=""
  PIDS+=("$cpid")
  # The honest link group is up: its Peer ID is in the listener's snapshot.
  for i in $(seq 100); do
    request_snapshot "$LPID" "$srv" || true
    pid=$(sed -n 's/^stats: link-group .* peer=\(0x[0-9a-f]*\) .*/\1/p' "$srv" | tail -n1)
    [ -n "$pid" ] && break
    kill -0 "$cpid" 2>/dev/null || break
    sleep 0.05
  done
  if [ -z "$pid" ]; then
    fail "$name: the honest connection never came up"; show "$WORK/$name-cli.err" "$WORK/$name-srv.err"
    ROUND_OK=2; ROUND_WHY="inconclusive"; kill -KILL "$LPID" 2>/dev/null
    return
  fi
  local args=("$@")
  if [ "$name" = decline-dos ]; then args+=(--peer-id "$pid"); fi
  # The attack starts while the honest transfer runs (it may outlast it).
  local during=1
  kill -0 "$cpid" 2>/dev/null && during=0
  timeout 60 "$ATTACKER" "$name" --from "$AIP" --to "$SIP:$PORT" "${args[@]}" > "$WORK/$name-att.out" 2>&1
  local arc=$?
  echo "    attacker: $(tail -n1 "$WORK/$name-att.out") (exit $arc)"
  local crc=124
  if gone_within "$cpid" 300; then wait "$cpid" 2>/dev/null; crc=$?; else kill -KILL "$cpid" 2>/dev/null; fi
  local line; line=$(grep "^conn 1 " "$WORK/$name-cli.out")
  local good=1 why=""
  if [ "$crc" != 0 ]; then why="honest client exit $crc: ${line:-$(tail -n1 "$WORK/$name-cli.err")}"
  elif ! grep -q "mode=SMC-R .* received .* echo=ok" <<<"$line"; then why="honest result: $line"
  elif [ "$during" != 0 ]; then
    # Intact, but it proves nothing: the attack came too late.
    fail "$name: the honest transfer ended before the attack began (raise SMC_TEST_SIZE)"
    ROUND_OK=2; ROUND_WHY="inconclusive"; kill "$LPID" 2>/dev/null; gone_within "$LPID" 10 || kill -KILL "$LPID"
    return
  else good=0; why="honest $SIZE each way intact (${line#conn 1 })"; fi
  if [ "$good" = 0 ]; then
    # The listener still serves.
    if ! timeout 30 "$SMC" connect --bind "$CIP" "$SIP:$PORT" --send-bytes 1M --seed 12 --expect-echo \
         --require-smc > "$WORK/$name-after.out" 2> "$WORK/$name-after.err"; then
      good=1; why="the listener no longer serves: $(tail -n1 "$WORK/$name-after.err")"
    fi
  fi
  # The listener ends on SIGTERM (its link groups with DELETE LINK); a stuck one is killed.
  kill "$LPID" 2>/dev/null
  if ! gone_within "$LPID" 10; then
    kill -KILL "$LPID" 2>/dev/null; wait "$LPID" 2>/dev/null
    if [ "$good" = 0 ]; then good=1; why="the listener did not end on SIGTERM"; fi
    why="$why; listener stuck (SIGTERM ignored for 10 s, killed)"
  fi
  ROUND_OK=$good; ROUND_WHY=$why
  [ "$good" = 0 ] || show "$WORK/$name-cli.err" "$WORK/$name-srv.err" | tail -n 30
}

ROUND_OK=1; ROUND_WHY=""
round decline-dos --count 3
verdict decline-dos "$ROUND_OK" "$ROUND_WHY"
# The flood stops a vulnerable listener in most rounds, not all: up to three.
for _ in 1 2 3; do
  round test-link-flood --secs 3
  [ "$ROUND_OK" = 0 ] || break
done
verdict test-link-flood "$ROUND_OK" "$ROUND_WHY"

if [ "$FAILS" -gt 0 ]; then
  echo "smc-malicious: $FAILS check(s) failed"; exit 1
fi
if [ "${#XFAILS[@]}" -gt 0 ]; then
  skip "known gaps (EXPECT_FAIL): ${XFAILS[*]}" always
fi
echo "smc-malicious: all checks passed"
