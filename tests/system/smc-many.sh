#!/usr/bin/env bash
# System test (issue 4): many connections on one link group, and no leaks.
#  1. 100 concurrent SMC-R connections from one client process to one listener
#     (64 KiB echoed and verified on each) share a single link group: the
#     listener's stats (SIGUSR1 snapshot while all 100 are open) show one link
#     group carrying 100 connections, and so do the client's.
#  2. 1000 connections opened, used (1 KiB echoed) and closed in sequence by one
#     client process: the listener's link groups, RMB elements in use, open QPs and
#     file descriptors (its own count and /proc/PID/fd) are no higher after the last
#     than after the first (both taken with the link group up and no connection
#     open), registered RMBs stay within the reuse cache; the same for the client.
# No eBPF: the SMC_RS_SKIP_TCP_OPTION policy lists the peers.
#
# Exit: 0 pass, 77 skip, anything else fail. SMC_TEST_SEQ overrides the 1000.
set -uo pipefail
cd "$(dirname "$0")/../.."
TEST_NAME=smc-many
. tests/system/lib/smc-common.bash
ensure_bin
SEQ=${SMC_TEST_SEQ:-1000}
export SMC_RS_SKIP_TCP_OPTION='127.0.0.0/8:*'
# Other loopback addresses when 127.0.0.1/.2 are busy (UDP 4791 taken by another stack).
SIP=${SMC_TEST_SERVER_IP:-127.0.0.2}; CIP=${SMC_TEST_CLIENT_IP:-127.0.0.1}

start_listen srv -- "$SIP:0" --echo --stats
SRV=$WORK/srv.out

# --- 1. 100 concurrent --------------------------------------------------------
timeout 120 "$SMC" connect --bind "$CIP" "$SIP:$PORT" --send-bytes 64K --expect-echo --require-smc \
  --conns 100 --concurrent --hold-ms 4000 --stats > "$WORK/c100.out" 2> "$WORK/c100.err" &
CPID=$!; PIDS+=("$CPID")
for _ in $(seq 600); do
  grep -q "^all 100 open" "$WORK/c100.err" 2>/dev/null && break
  kill -0 "$CPID" 2>/dev/null || break
  sleep 0.1
done
if grep -q "^all 100 open" "$WORK/c100.err"; then
  request_snapshot "$LPID" "$SRV" || fail "listener did not answer SIGUSR1"
  cp "$SRV" "$WORK/srv-100.out"
else
  fail "the client never had all 100 connections open"; show "$WORK/c100.err"
fi
wait "$CPID"; crc=$?

[ "$crc" = 0 ] && ok "client exit 0" || { fail "client exit $crc"; show "$WORK/c100.out" "$WORK/c100.err"; }
n_ok=$(grep -c "^conn [0-9]* mode=SMC-R sent 65536 bytes .* received 65536 bytes .* echo=ok" "$WORK/c100.out")
[ "$n_ok" = 100 ] && ok "100 connections SMC-R, 64 KiB echoed and verified on each" \
  || fail "$n_ok of 100 connections SMC-R and verified"
lg=$(stats_field "$WORK/srv-100.out" SIGUSR1 link-groups)
conns=$(stats_field "$WORK/srv-100.out" SIGUSR1 smc)
if [ "$lg" = 1 ] && [ "$conns" = 100 ]; then
  ok "listener (SIGUSR1 while all were open): 1 link group, 100 SMC-R connections"
  grep "^stats: link-group " "$WORK/srv-100.out" | tail -n1 | sed 's/^/    /'
else
  fail "listener snapshot: link-groups=$lg smc connections=$conns (want 1 and 100)"; show "$WORK/srv-100.out"
fi
clg=$(stats_field "$WORK/c100.out" "all 100 connections open" link-groups)
cconns=$(stats_field "$WORK/c100.out" "all 100 connections open" smc)
[ "$clg" = 1 ] && [ "$cconns" = 100 ] && ok "client: 1 link group, 100 SMC-R connections" \
  || { fail "client snapshot: link-groups=$clg smc=$cconns"; show "$WORK/c100.out"; }
# Exactly one first contact on each side.
fc=$(grep -c "first contact" "$WORK/c100.err")
[ "$fc" = 1 ] && ok "one first contact, 99 subsequent contacts" || fail "$fc first contacts among the 100 (want 1)"

# --- 2. 1000 in sequence ----------------------------------------------------
# The client pauses after its first and after its last connection (link group up,
# no connection open): the listener is asked for its state at both points.
settle() {   # waits until the listener has no connection left (closes are asynchronous)
  local i
  for i in $(seq 100); do
    request_snapshot "$LPID" "$SRV" || return 1
    [ "$(stats_field "$SRV" SIGUSR1 connections)" = 0 ] && return 0
    sleep 0.1
  done
  return 1
}
wait_line() {  # wait_line FILE TEXT PID
  local i; for i in $(seq 1200); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.05
  done; return 1
}
t0=$(date +%s.%N)
timeout 150 "$SMC" connect --bind "$CIP" "$SIP:$PORT" --send-bytes 1K --expect-echo --require-smc \
  --conns "$SEQ" --hold-ms 3000 --stats > "$WORK/seq.out" 2> "$WORK/seq.err" &
SPID=$!; PIDS+=("$SPID")
if wait_line "$WORK/seq.err" "^holding after connection 1$" "$SPID" && settle; then
  b_rmb=$(stats_field "$SRV" SIGUSR1 rmbs-in-use); b_reg=$(stats_field "$SRV" SIGUSR1 rmbs)
  b_qp=$(stats_field "$SRV" SIGUSR1 qps); b_lg=$(stats_field "$SRV" SIGUSR1 link-groups)
  b_fd=$(stats_field "$SRV" SIGUSR1 fds); b_pfd=$(fd_count "$LPID")
else fail "no listener snapshot after the first connection"; fi
if wait_line "$WORK/seq.err" "^holding after connection $SEQ$" "$SPID" && settle; then
  a_rmb=$(stats_field "$SRV" SIGUSR1 rmbs-in-use); a_reg=$(stats_field "$SRV" SIGUSR1 rmbs)
  a_qp=$(stats_field "$SRV" SIGUSR1 qps); a_lg=$(stats_field "$SRV" SIGUSR1 link-groups)
  a_fd=$(stats_field "$SRV" SIGUSR1 fds); a_pfd=$(fd_count "$LPID")
else fail "no listener snapshot after the last connection"; fi
wait "$SPID"; src=$?
t1=$(date +%s.%N)

[ "$src" = 0 ] && ok "$SEQ sequential connections: client exit 0 ($(python3 -c "import sys; print(f'{float(sys.argv[2])-float(sys.argv[1]):.1f}')" "$t0" "$t1") s)" \
  || { fail "sequential client exit $src"; tail -n 5 "$WORK/seq.out"; show "$WORK/seq.err"; }
n_ok=$(grep -c "^conn [0-9]* mode=SMC-R .* echo=ok" "$WORK/seq.out")
[ "$n_ok" = "$SEQ" ] && ok "$SEQ connections SMC-R and verified" || fail "$n_ok of $SEQ SMC-R and verified"
nolarger() {  # nolarger WHAT BEFORE AFTER
  if [ -n "$2" ] && [ -n "$3" ] && [ "$3" -le "$2" ]; then ok "listener $1: $2 after the first, $3 after the last"
  else fail "listener $1: $2 after the first, $3 after the last"; fi
}
nolarger "link groups" "${b_lg:-}" "${a_lg:-}"
nolarger "RMB elements in use" "$b_rmb" "$a_rmb"
# Freed RMBs stay registered up to the link group's cache (StackConfig::rmb_cache,
# 16 by default) for reuse: bounded, not a leak.
if [ -n "${a_reg:-}" ] && [ "$a_reg" -le 16 ]; then ok "listener RMBs registered: ${b_reg:-?} after the first, $a_reg after the last (cache ≤ 16)"
else fail "listener RMBs registered: ${b_reg:-?} after the first, ${a_reg:-?} after the last (cache is 16)"; fi
nolarger "open QPs" "$b_qp" "$a_qp"
nolarger "file descriptors (stats)" "$b_fd" "$a_fd"
nolarger "file descriptors (/proc/$LPID/fd)" "$b_pfd" "$a_pfd"
for k in rmbs-in-use qps fds; do
  b=$(stats_field "$WORK/seq.out" "after connection 1" "$k"); a=$(stats_field "$WORK/seq.out" "at exit" "$k")
  if [ -n "$b" ] && [ -n "$a" ] && [ "$a" -le "$b" ]; then ok "client $k: $b after the first, $a after the last"
  else fail "client $k: $b after the first, $a after the last"; fi
done

if [ "$FAILS" -gt 0 ]; then echo "smc-many: $FAILS check(s) failed"; KEEP_WORK=1; exit 1; fi
echo "smc-many: all checks passed"
