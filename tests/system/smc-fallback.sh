#!/usr/bin/env bash
# System test (issue 4): TCP fallback, RFC 7609 §3.5 and Appendix C.
#  - `smc connect` to plain TCP servers (python3 -m http.server, nc -l): the
#    connection works as TCP (HTTP GET answered; data flows both ways) and the
#    mode printed is a TCP fallback with its reason;
#  - plain TCP clients (curl, nc) to `smc listen`: the same, seen from the listener;
#  - a scripted peer (clc-peer.py) that answers the CLC Proposal with a Decline: the
#    client falls back with the peer's diagnosis in words and data then flows as TCP;
#  - a scripted peer that answers with a malformed CLC Accept or with non-CLC bytes,
#    and a scripted client that sends such bytes to a listener waiting for a
#    Proposal: fallback or reset, never a hang, with the reason printed.
# The CLC cases need the peer listed in SMC_RS_SKIP_TCP_OPTION (no eBPF here); the
# plain-TCP cases run without it, as on a host without the eBPF program.
#
# Exit: 0 pass, 77 skip, anything else fail.
set -uo pipefail
cd "$(dirname "$0")/../.."
TEST_NAME=smc-fallback
. tests/system/lib/smc-common.bash
for t in python3 nc curl; do command -v "$t" >/dev/null || skip "missing $t (run scripts/setup.sh)"; done
ensure_bin
unset SMC_RS_SKIP_TCP_OPTION
PEER=tests/system/clc-peer.py
# Other loopback addresses when 127.0.0.1/.2 are busy (UDP 4791 taken by another stack).
SIP=${SMC_TEST_SERVER_IP:-127.0.0.2}; CIP=${SMC_TEST_CLIENT_IP:-127.0.0.1}

wait_port() {  # wait_port HOST PORT
  local i; for i in $(seq 100); do nc -z "$1" "$2" 2>/dev/null && return 0; sleep 0.05; done; return 1
}
mode_is_fallback() {  # FILE PREFIX: the mode line says TCP fallback with a reason
  grep -q "^$2.*: TCP fallback: ..*" "$1"
}

# --- smc connect → python3 -m http.server ------------------------------------
mkdir -p "$WORK/www" && echo "smc-fallback-page" > "$WORK/www/index.html"
P=$(free_port)
python3 -m http.server "$P" --bind 127.0.0.1 --directory "$WORK/www" > "$WORK/http.log" 2>&1 &
PIDS+=($!)
wait_port 127.0.0.1 "$P" || fail "http.server did not start"
printf 'GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n' | timeout 20 "$SMC" connect "127.0.0.1:$P" \
  > "$WORK/http.out" 2> "$WORK/http.err"
rc=$?
if [ "$rc" = 0 ] && grep -q "^HTTP/1.0 200" "$WORK/http.out" && grep -q "smc-fallback-page" "$WORK/http.out"; then
  ok "smc connect → http.server: HTTP GET answered"
else fail "smc connect → http.server (exit $rc)"; show "$WORK/http.out" "$WORK/http.err"; fi
mode_is_fallback "$WORK/http.err" "connected to" && ok "  mode: $(grep -m1 '^connected' "$WORK/http.err")" \
  || { fail "http.server: no TCP-fallback mode line"; show "$WORK/http.err"; }

# --- smc connect → nc -l ------------------------------------------------------
P=$(free_port)
echo "from-nc" > "$WORK/nc-in.txt"
timeout 20 nc -N -l 127.0.0.1 "$P" < "$WORK/nc-in.txt" > "$WORK/nc-got.txt" 2>"$WORK/nc.err" &
NCPID=$!; PIDS+=("$NCPID")
# (not probed with a connection: nc -l accepts only one)
for _ in $(seq 100); do ss -Hltn "sport = :$P" | grep -q . && break; sleep 0.05; done
echo "from-smc" | timeout 20 "$SMC" connect "127.0.0.1:$P" > "$WORK/nc.out" 2> "$WORK/nc-smc.err"
rc=$?; wait "$NCPID" 2>/dev/null
if [ "$rc" = 0 ] && grep -q "^from-nc$" "$WORK/nc.out" && grep -q "^from-smc$" "$WORK/nc-got.txt"; then
  ok "smc connect ↔ nc -l: data both ways"
else fail "smc connect ↔ nc -l (exit $rc)"; show "$WORK/nc.out" "$WORK/nc-got.txt" "$WORK/nc-smc.err"; fi
mode_is_fallback "$WORK/nc-smc.err" "connected to" && ok "  mode: $(grep -m1 '^connected' "$WORK/nc-smc.err")" \
  || { fail "nc: no TCP-fallback mode line"; show "$WORK/nc-smc.err"; }

# --- nc and curl → smc listen -------------------------------------------------
start_listen l-echo -- "$SIP:0" --echo --count 1
got=$(printf 'plain tcp client\n' | timeout 20 nc -N "$SIP" "$PORT")
wait_exit "$LPID" 20; lrc=$?
if [ "$got" = "plain tcp client" ] && [ "$lrc" = 0 ]; then ok "nc → smc listen --echo: echoed as TCP"
else fail "nc → smc listen --echo: got '$got', listener exit $lrc"; show "$WORK/l-echo.err"; fi
mode_is_fallback "$WORK/l-echo.err" "accepted" && ok "  mode: $(grep -m1 '^accepted' "$WORK/l-echo.err")" \
  || { fail "listener: no TCP-fallback mode line"; show "$WORK/l-echo.err"; }

printf 'HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 15\r\n\r\nfrom smc listen' \
  > "$WORK/resp.txt"
LISTEN_STDIN=$WORK/resp.txt start_listen l-curl -- "$SIP:0"
body=$(timeout 20 curl -s --http1.0 "http://$SIP:$PORT/hello")
wait_exit "$LPID" 20; lrc=$?
if [ "$body" = "from smc listen" ] && grep -q "^GET /hello HTTP/1.0" "$WORK/l-curl.out"; then
  ok "curl → smc listen: request on stdout, response from stdin"
else fail "curl → smc listen: body '$body', listener exit $lrc"; show "$WORK/l-curl.out" "$WORK/l-curl.err"; fi

# --- a peer that Declines -----------------------------------------------------
run_peer() {  # run_peer NAME ARGS...: starts clc-peer.py server, sets PPORT/PPID_
  local name=$1; shift
  timeout 40 python3 "$PEER" server --listen "$SIP:0" "$@" > "$WORK/$name.peer" 2>&1 &
  PPID_=$!; PIDS+=("$PPID_")
  local i; for i in $(seq 100); do grep -q "^listening" "$WORK/$name.peer" 2>/dev/null && break; sleep 0.05; done
  PPORT=$(sed -n 's/^listening port=//p' "$WORK/$name.peer")
}
run_peer decline --action decline --code 03030002
echo "after decline" | SMC_RS_SKIP_TCP_OPTION="$SIP:$PPORT" timeout 40 "$SMC" connect --bind "$CIP" "$SIP:$PPORT" \
  > "$WORK/decline.out" 2> "$WORK/decline.err"
rc=$?; wait "$PPID_"
if grep -q "^proposal type=1" "$WORK/decline.peer"; then ok "declining peer received a CLC Proposal"
else fail "declining peer saw no Proposal"; show "$WORK/decline.peer"; fi
if [ "$rc" = 0 ] && grep -q "^after decline$" "$WORK/decline.out"; then ok "after the Decline the data flows as TCP"
else fail "after Decline (exit $rc)"; show "$WORK/decline.out" "$WORK/decline.err" "$WORK/decline.peer"; fi
if grep -qi "^connected to .*TCP fallback: .*declin.*0x03030002" "$WORK/decline.err"; then
  ok "  mode: $(grep -m1 '^connected' "$WORK/decline.err")"
else fail "Decline: the mode line does not give the peer's reason"; show "$WORK/decline.err"; fi

# --- peers that answer the Proposal with garbage ------------------------------
for action in garbage junk; do
  run_peer "$action" --action "$action"
  start=$(date +%s)
  echo "data" | SMC_RS_SKIP_TCP_OPTION="$SIP:$PPORT" timeout 60 "$SMC" connect --bind "$CIP" "$SIP:$PPORT" \
    > "$WORK/$action.out" 2> "$WORK/$action.err"
  rc=$?; wait "$PPID_"; took=$(( $(date +%s) - start ))
  if [ "$rc" = 124 ]; then fail "$action: smc connect hung (killed after 60 s)"
  elif grep -q "^connected to .*TCP fallback: ..*" "$WORK/$action.err"; then
    ok "$action answer: TCP fallback in ${took} s: $(grep -m1 '^connected' "$WORK/$action.err" | sed 's/^connected to [^ ]* //')"
  elif [ "$rc" != 0 ] && grep -v "^note:" "$WORK/$action.err" | grep -qiE "reset|clc|malformed|invalid|protocol"; then
    ok "$action answer: connection reset in ${took} s: $(grep -v "^note:" "$WORK/$action.err" | grep -iE "reset|clc|malformed|invalid|protocol" | head -n1)"
  else fail "$action answer: exit $rc and no reason"; show "$WORK/$action.err"; fi
  grep -qE "^peer-(reset|eof)" "$WORK/$action.peer" && ok "  the peer saw: $(tail -n1 "$WORK/$action.peer")" \
    || { fail "$action: the peer saw neither reset nor end of stream"; show "$WORK/$action.peer"; }
done

# --- a client that sends garbage to a listener waiting for a Proposal ----------
# A connection whose rendezvous ends in a reset never reaches accept(): the
# listener's reason is its log line (warning level, on by default).
for send in junk bad-proposal; do
  SMC_RS_SKIP_TCP_OPTION='127.0.0.0/8:*' start_listen "l-$send" -- "$SIP:0" --echo
  timeout 60 python3 "$PEER" client --connect "$SIP:$PORT" --send "$send" > "$WORK/$send.cli" 2>&1
  prc=$?
  sleep 0.5; kill "$LPID" 2>/dev/null; wait "$LPID" 2>/dev/null
  if [ "$prc" = 0 ] && grep -qE "^(decline diagnosis=0x[0-9a-f]{8}|reset|eof)" "$WORK/$send.cli"; then
    ok "client sending $send: it got $(head -n1 "$WORK/$send.cli")"
  else fail "client sending $send (exit $prc)"; show "$WORK/$send.cli"; fi
  reason=$(grep -v "^note:\|^listening on" "$WORK/l-$send.err" | grep -iE "TCP fallback: ..|reset|CLC|declin" | head -n1)
  if [ -n "$reason" ]; then ok "  listener: ${reason#*WARN }"
  else fail "listener gave no reason for $send"; show "$WORK/l-$send.err"; fi
done

if [ "$FAILS" -gt 0 ]; then echo "smc-fallback: $FAILS check(s) failed"; exit 1; fi
echo "smc-fallback: all checks passed"
