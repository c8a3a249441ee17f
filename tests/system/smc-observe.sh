#!/usr/bin/env bash
# System test (issue 13, observability and policy): `smc ss`, `smc lgr`, `smc stats`,
# `smc chk` against real programs under `smc run`, and the SMC_RS_ALLOW / SMC_RS_DENY
# policy:
#  - an `smc run python3 -m http.server` and two slow `smc run curl` downloads: `smc ss`
#    lists the three SMC-R sockets (both ends, process names, link groups, bytes
#    moving), `-l` the listener; `--json` parses; `smc lgr` shows the server's and the
#    clients' link groups with QPs; `smc stats` sums the processes' counters,
#    `--prometheus` prints them, `reset` zeroes the cumulative ones;
#  - a curl with SMC_RS_DENY naming the server: TCP, `smc ss` shows it with the reason,
#    PEERNOSMC and [policy]; SMC_RS_ALLOW not naming it: the same; allowing it: SMC-R;
#  - `smc chk` against the SMC server (SMC-R, exit 0) and against a plain server (TCP,
#    the reason and what to change, exit 2);
#  - a process killed with SIGKILL disappears from `smc ss` at once (no stale entry).
# Exit: 0 pass, 77 skip, anything else fail.
set -uo pipefail
cd "$(dirname "$0")/../.."
TEST_NAME=smc-observe
. tests/system/lib/smc-common.bash
for t in python3 curl ss; do
  command -v "$t" >/dev/null || skip "missing $t (run scripts/setup.sh)"
done
ensure_bin
ensure_preload
SIP=${SMC_OBSERVE_SERVER_IP:-127.0.13.42}; CIP=${SMC_OBSERVE_CLIENT_IP:-127.0.13.41}
export SMC_RS_SKIP_TCP_OPTION='127.0.0.0/8:*'

mkdir -p "$WORK/www"
head -c $((40 << 20)) /dev/zero > "$WORK/www/f.bin"
P=$(free_port)
"$SMC" run -- python3 -m http.server "$P" --bind "$SIP" --directory "$WORK/www" > "$WORK/http.log" 2>&1 &
SPID=$!; PIDS+=("$SPID")
wait_listen "$P" || { fail "http.server did not start"; show "$WORK/http.log"; exit 1; }
slow_curl() {  # slow_curl NAME [ENV...]: a 40 MiB download at 4 MB/s in the background
  local name=$1; shift
  env "$@" SMC_RS_LOCAL_ADDR=$CIP "$SMC" run curl -sS --limit-rate 4M -o /dev/null \
    "http://$SIP:$P/f.bin" 2> "$WORK/$name.err" &
  PIDS+=("$!")
}
slow_curl c1; C1=$!
slow_curl c2; C2=$!
sleep 1.5

# --- smc ss ----------------------------------------------------------------------------
"$SMC" ss > "$WORK/ss.txt"; "$SMC" ss --json > "$WORK/ss.json"
n_smc=$(json "sum(1 for s in d if s['mode']=='SMCR' and str(s['pid']) in ('$SPID','$C1','$C2'))" < "$WORK/ss.json")
moving=$(json "min(s['bytes_sent'] for s in d if s['mode']=='SMCR' and s['pid']==$SPID)" < "$WORK/ss.json")
if [ "$n_smc" = 4 ] && [ "${moving:-0}" -gt 0 ] && grep -q "python3 .* ACTIVE .*SMCR  *lgr" "$WORK/ss.txt" \
   && grep -q "^$C1 .*curl .*ACTIVE .*$CIP:.*$SIP:$P .*SMCR" "$WORK/ss.txt"; then
  ok "smc ss: 4 SMC-R sockets (server ×2, curl ×2) with process, state, link group, bytes"
  sed 's/^/    /' "$WORK/ss.txt"
else fail "smc ss (SMC-R sockets $n_smc, server bytes ${moving:-?})"; show "$WORK/ss.txt" "$WORK/ss.json"; fi
"$SMC" ss -l > "$WORK/ssl.txt"
if grep -q "^$SPID .*LISTEN .*$SIP:$P" "$WORK/ssl.txt" && ! grep -q "SMCR" "$WORK/ssl.txt"; then
  ok "smc ss -l: the listener only"
else fail "smc ss -l"; show "$WORK/ssl.txt"; fi

# --- smc lgr -------------------------------------------------------------------------
"$SMC" lgr > "$WORK/lgr.txt"; "$SMC" lgr --json > "$WORK/lgr.json"
roles=$(json "sorted(g['role'] for g in d if g['pid'] in ($SPID,$C1,$C2))" < "$WORK/lgr.json")
qps=$(json "all(l['qpn']>0 and l['peer_qpn'] for g in d for l in g['links'])" < "$WORK/lgr.json")
# Our GID on each link: the server's address on the server's, the client's on the curls'.
gids=$(json "all(l['gid'] == '::ffff:' + ('$SIP' if g['pid'] == $SPID else '$CIP') for g in d if g['pid'] in ($SPID,$C1,$C2) for l in g['links'])" < "$WORK/lgr.json")
if [ "$roles" = "['client', 'client', 'server', 'server']" ] && [ "$qps" = True ] && [ "$gids" = True ] \
   && grep -q "(pid $SPID python3): role server" "$WORK/lgr.txt"; then
  ok "smc lgr: the server's link groups (one per client process) and each curl's, with QPs and our GIDs"
  sed 's/^/    /' "$WORK/lgr.txt"
else fail "smc lgr ($roles, qps $qps, gids $gids)"; show "$WORK/lgr.txt"; fi

# --- smc stats -----------------------------------------------------------------------
"$SMC" stats --json > "$WORK/st.json"
tot=$(json "d['smc_total']" < "$WORK/st.json"); np=$(json "d['processes']" < "$WORK/st.json")
# RMB sizes: what the processes registered, by size, adding up to the bytes.
rmbs=$(json "d['rmb_bytes'] > 0 and d['rmb_bytes'] == sum(int(k) * v for k, v in d['rmb_sizes'].items()) and sum(d['rmb_sizes'].values()) == d['rmbs']" < "$WORK/st.json")
"$SMC" stats --prometheus > "$WORK/prom.txt"
if [ "$tot" -ge 4 ] && [ "$np" -ge 3 ] && grep -q "^smc_rs_smc_total $tot$" "$WORK/prom.txt" \
   && [ "$rmbs" = True ] && grep -q '^smc_rs_rmb_sizes{bytes="[0-9]*"} [1-9]' "$WORK/prom.txt"; then
  ok "smc stats: $tot SMC-R connections over $np processes, RMB sizes adding up to rmb_bytes; --prometheus agrees"
else fail "smc stats (total $tot, processes $np, rmb sizes $rmbs)"; show "$WORK/st.json" "$WORK/prom.txt"; fi

# --- policy --------------------------------------------------------------------------
# Kept-TCP clients go to a plain server: with SMC_RS_SKIP_TCP_OPTION (no eBPF here) an
# SMC server cannot tell that a client will not propose.
PP=$(free_port)
python3 -m http.server "$PP" --bind "$SIP" --directory "$WORK/www" > /dev/null 2>&1 &
PIDS+=("$!")
wait_listen "$PP"
slow_curl_to() {  # slow_curl_to NAME PORT [ENV...]
  local name=$1 port=$2; shift 2
  env "$@" SMC_RS_LOCAL_ADDR=$CIP "$SMC" run curl -sS --limit-rate 4M -o /dev/null \
    "http://$SIP:$port/f.bin" 2> "$WORK/$name.err" &
  PIDS+=("$!")
}
slow_curl_to deny "$PP" SMC_RS_DENY="$SIP:$PP"; D1=$!
slow_curl_to allow-other "$PP" SMC_RS_ALLOW="10.0.0.0/8"; D2=$!
slow_curl_to allow-it "$P" SMC_RS_ALLOW="$SIP/32:$P"; D3=$!
# The policy file: its deny line keeps the connection TCP; SMC_RS_DENY set empty replaces it.
printf '# test policy\ndeny %s:%s %s:%s  # both servers\n' "$SIP" "$PP" "$SIP" "$P" > "$WORK/policy"
slow_curl_to file-deny "$PP" SMC_RS_POLICY_FILE="$WORK/policy"; D4=$!
slow_curl_to file-overridden "$P" SMC_RS_POLICY_FILE="$WORK/policy" SMC_RS_DENY=; D5=$!
sleep 1
"$SMC" ss --json > "$WORK/ss2.json"; "$SMC" ss > "$WORK/ss2.txt"
m() { json "[(s['mode'], s.get('policy', False)) for s in d if s['pid']==$1]" < "$WORK/ss2.json"; }
if [ "$(m "$D1")" = "[('TCP', True)]" ] && [ "$(m "$D2")" = "[('TCP', True)]" ] \
   && [ "$(m "$D3")" = "[('SMCR', False)]" ] \
   && [ "$(m "$D4")" = "[('TCP', True)]" ] && [ "$(m "$D5")" = "[('SMCR', False)]" ] \
   && grep -q "^$D1 .*TCP .*0x03010000 PEERNOSMC \[policy\]: .*SMC_RS_DENY" "$WORK/ss2.txt" \
   && grep -q "^$D4 .*TCP .*\[policy\]: .*\`deny\` of $WORK/policy" "$WORK/ss2.txt"; then
  ok "policy: SMC_RS_DENY naming the server → TCP; SMC_RS_ALLOW not naming it → TCP; naming it → SMC-R; a policy file's deny line → TCP, overridden by SMC_RS_DENY= → SMC-R; smc ss says policy:"
  grep -E "^($D1|$D2|$D4) " "$WORK/ss2.txt" | sed 's/^/    /'
else fail "policy ($(m "$D1") / $(m "$D2") / $(m "$D3") / $(m "$D4") / $(m "$D5"))"; show "$WORK/ss2.txt"; fi

# --- SIGKILL: no stale entry -----------------------------------------------------------
kill -KILL "$C1"; wait "$C1" 2>/dev/null
sleep 0.2
"$SMC" ss --json > "$WORK/ss3.json"
left=$(json "sum(1 for s in d if s['pid']==$C1)" < "$WORK/ss3.json")
if [ "$left" = 0 ]; then ok "a SIGKILLed curl is gone from smc ss at once"
else fail "SIGKILLed process still listed ($left sockets)"; fi

# --- stats reset -----------------------------------------------------------------------
"$SMC" stats reset > /dev/null
after=$(  "$SMC" stats --json | json "d['smc_total']")
if [ "$after" = 0 ]; then ok "smc stats reset: cumulative counters zeroed"
else fail "after reset smc_total=$after"; fi

# --- smc chk -----------------------------------------------------------------------------
"$SMC" chk "$SIP:$P" > "$WORK/chk1.txt" 2>&1; rc1=$?
env -u SMC_RS_SKIP_TCP_OPTION "$SMC" chk "$SIP:$PP" > "$WORK/chk2.txt" 2>&1; rc2=$?
if [ "$rc1" = 0 ] && grep -q "SMC-R: yes" "$WORK/chk1.txt" && [ "$rc2" = 2 ] \
   && grep -q "SMC-R: no" "$WORK/chk2.txt" && grep -q "what to change: .*smc run" "$WORK/chk2.txt"; then
  ok "smc chk: SMC-R against the smc run server; TCP with the reason and what to change against a plain one"
  sed 's/^/    /' "$WORK/chk1.txt" "$WORK/chk2.txt"
else fail "smc chk (exit $rc1 / $rc2)"; show "$WORK/chk1.txt" "$WORK/chk2.txt"; fi

[ "$FAILS" = 0 ] || exit 1
echo "PASS: smc-observe"
