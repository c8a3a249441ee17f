#!/usr/bin/env bash
# System test (issue 13, many processes per host): several smc-rs processes on the same
# addresses at once, all on SMC-R. Every process's software RNIC needs UDP 4791 on its
# address; they share it (SO_REUSEPORT group steered by destination QPN with an eBPF
# SK_REUSEPORT program, docs/port-sharing.md):
#  - two `smc run python3 -m http.server` servers on one address (SIP), four `smc run curl`
#    clients at once from one other address (CIP), 8 MiB each, SHA-256 checked; every
#    connection SMC-R on both ends by the SMC_RS_STATS event lines (not just the data);
#  - meanwhile a plain `smc listen --echo` on SIP and two `smc connect --require-smc`
#    at once from CIP (echo verified) — so five processes hold SIP's port at once;
#  - a third server with SMC_RS_SOFTROCE_SHARE=0 (the behaviour before sharing) on SIP:
#    it cannot bind the port, says so on stderr (the warning and the reason: never
#    silent), and serves its client over TCP with the reason in its stats line;
#  - a client killed with SIGKILL frees its slot: a new client on CIP still gets SMC-R.
# Addresses: SMC_RUN_MANY_SERVER_IP / SMC_RUN_MANY_CLIENT_IP (default 127.0.13.12 /
# 127.0.13.11).
#
# Exit: 0 pass, 77 skip, anything else fail.
set -uo pipefail
cd "$(dirname "$0")/../.."
TEST_NAME=smc-run-many
. tests/system/lib/smc-common.bash
for t in python3 curl sha256sum ss; do
  command -v "$t" >/dev/null || skip "missing $t (run scripts/setup.sh)"
done
[ "$(id -u)" = 0 ] || skip "needs root (CAP_BPF, CAP_SYS_ADMIN) to share the RoCEv2 port"
ensure_bin
ensure_preload
SIP=${SMC_RUN_MANY_SERVER_IP:-127.0.13.12}; CIP=${SMC_RUN_MANY_CLIENT_IP:-127.0.13.11}
export SMC_RS_SKIP_TCP_OPTION='127.0.0.0/8:*'
STATS="$WORK/stats.log"
export SMC_RS_STATS="$STATS"

# lines PID EVENT MODE: how many EVENT lines (connect/accept) of PID have mode=MODE.
lines() { grep -cE "^pid=$1 $2 .* mode=$3( |$)" "$STATS"; }
server_pid_of() { sed -n "s/^pid=\([0-9]*\) listen local=.*:$1 mode=SMC$/\1/p" "$STATS" | head -n1; }
# holders IP: processes with a UDP socket on IP:4791.
holders() { ss -Huanp "sport = :4791" | grep -F "$1:4791" | grep -o 'pid=[0-9]*' | sort -u | wc -l; }

mkdir -p "$WORK/www"
head -c $((8 << 20)) /dev/urandom > "$WORK/www/f.bin"
want=$(sha256sum < "$WORK/www/f.bin" | cut -d' ' -f1)

# --- two servers on SIP -------------------------------------------------------------
PA=$(free_port); PB=$(free_port)
for p in "$PA" "$PB"; do
  "$SMC" run -- python3 -m http.server "$p" --bind "$SIP" --directory "$WORK/www" \
    > "$WORK/http-$p.log" 2>&1 &
  PIDS+=("$!")
  wait_listen "$p" || { fail "http.server on $p did not start"; show "$WORK/http-$p.log"; exit 1; }
done
# A plain smc listener on the same address too.
start_listen echo -- --echo "$SIP:0"
EPORT=$PORT

# --- clients at once from CIP -----------------------------------------------------
CPIDS=()
for i in 1 2 3 4; do
  if [ $((i % 2)) = 1 ]; then p=$PA; else p=$PB; fi
  SMC_RS_LOCAL_ADDR=$CIP timeout 60 "$SMC" run curl -sS --limit-rate 6M -o "$WORK/got$i.bin" \
    "http://$SIP:$p/f.bin" 2> "$WORK/curl$i.err" &
  CPIDS+=("$!")
done
for i in 1 2; do
  timeout 60 "$SMC" connect --bind "$CIP" --send-bytes 4M --seed "$i" --expect-echo \
    --require-smc "$SIP:$EPORT" > "$WORK/conn$i.out" 2> "$WORK/conn$i.err" &
  CPIDS+=("$!")
done
# The most processes seen holding each address's port while the clients run.
nsip=0; ncip=0
while kill -0 "${CPIDS[0]}" 2>/dev/null || kill -0 "${CPIDS[1]}" 2>/dev/null; do
  n=$(holders "$SIP"); [ "$n" -gt "$nsip" ] && nsip=$n
  n=$(holders "$CIP"); [ "$n" -gt "$ncip" ] && ncip=$n
  sleep 0.1
done
bad=0
for j in "${!CPIDS[@]}"; do wait "${CPIDS[$j]}" || { bad=1; echo "  client $j: exit $?"; }; done
for i in 1 2 3 4; do
  g=$(sha256sum < "$WORK/got$i.bin" 2>/dev/null | cut -d' ' -f1)
  [ "$g" = "$want" ] || { bad=1; echo "  curl $i: sha256 $g, want $want"; }
done
if [ "$bad" = 0 ]; then
  ok "4 smc run curl + 2 smc connect from $CIP at once ← 2 smc run http.server + smc listen on $SIP: data verified"
else fail "concurrent clients"; show "$WORK"/curl*.err "$WORK"/conn*.err "$WORK"/http-*.log "$WORK/echo.err"; fi

# Every connection SMC-R, on both ends, by the stats lines.
sa=$(server_pid_of "$PA"); sb=$(server_pid_of "$PB")
ncurl=0
for cp in $(sed -n "s/^pid=\([0-9]*\) connect .*peer=$SIP:\($PA\|$PB\) .*/\1/p" "$STATS" | sort -u); do
  [ "$(lines "$cp" connect SMC-R)" = 1 ] && ncurl=$((ncurl + 1))
done
if [ -n "$sa" ] && [ -n "$sb" ] && [ "$sa" != "$sb" ] && [ "$ncurl" = 4 ] \
   && [ "$(lines "$sa" accept SMC-R)" = 2 ] && [ "$(lines "$sb" accept SMC-R)" = 2 ] \
   && [ "$(grep -c 'mode=TCP' "$STATS")" = 0 ]; then
  ok "  all 8 ends SMC-R (two servers of one address, four clients of another; no TCP fallback)"
else fail "not all SMC-R (servers ${sa:-?} ${sb:-?}, curl clients on SMC-R: $ncurl/4)"; show "$STATS"; fi
if grep -q "SMC-R" "$WORK/conn1.err" && grep -q "SMC-R" "$WORK/conn2.err" \
   && ! grep -qi "fallback\|TCP (" "$WORK/conn1.err" "$WORK/conn2.err"; then
  ok "  smc connect ×2 → smc listen on the same addresses: SMC-R (--require-smc)"
else fail "smc connect not SMC-R"; show "$WORK/conn1.err" "$WORK/conn2.err" "$WORK/echo.err"; fi
if [ "$nsip" -ge 3 ] && [ "$ncip" -ge 2 ]; then
  ok "  processes sharing UDP 4791 at once: $nsip on $SIP, $ncip on $CIP (most seen)"
else fail "processes holding UDP 4791 at once: $nsip on $SIP (expected ≥ 3), $ncip on $CIP (≥ 2)"; fi
for f in "$WORK"/http-*.log "$WORK/echo.err"; do
  if grep -qi "not shared\|cannot be shared" "$f"; then fail "port-sharing warning in $f"; show "$f"; fi
done

# --- a process that does not share (SMC_RS_SOFTROCE_SHARE=0): loud, TCP ------------
PC=$(free_port)
SMC_RS_SOFTROCE_SHARE=0 "$SMC" run -- python3 -m http.server "$PC" --bind "$SIP" \
  --directory "$WORK/www" > "$WORK/http-noshare.log" 2>&1 &
PIDS+=("$!")
wait_listen "$PC" || { fail "http.server (no share) did not start"; show "$WORK/http-noshare.log"; exit 1; }
SMC_RS_LOCAL_ADDR=$CIP timeout 60 "$SMC" run curl -sS -o "$WORK/got-ns.bin" "http://$SIP:$PC/f.bin" \
  2> "$WORK/curl-ns.err"
g=$(sha256sum < "$WORK/got-ns.bin" 2>/dev/null | cut -d' ' -f1)
sc=$(server_pid_of "$PC")
if [ "$g" = "$want" ] && [ -n "$sc" ] && [ "$(lines "$sc" accept TCP)" = 1 ] \
   && grep -q "SMC_RS_SOFTROCE_SHARE=0" "$WORK/http-noshare.log" \
   && grep -q "no RDMA device" "$WORK/http-noshare.log"; then
  ok "a server that does not share the port: data over TCP, and it says why on stderr:"
  grep -m1 -o "UDP $SIP:4791 is taken.*" "$WORK/http-noshare.log" | cut -c1-160 | sed 's/^/    /'
  sed -n "s/^pid=$sc accept .*mode=TCP info=/    stats: /p" "$STATS" | head -n1
else fail "non-sharing server (sha $g, pid ${sc:-?})"; show "$WORK/http-noshare.log" "$STATS"; fi

# --- SIGKILL frees a slot -------------------------------------------------------------
SMC_RS_LOCAL_ADDR=$CIP "$SMC" run curl -sS --limit-rate 200K -o /dev/null \
  "http://$SIP:$PA/f.bin" 2> /dev/null &
KPID=$!
for i in $(seq 100); do [ "$(holders "$CIP")" -ge 1 ] && break; sleep 0.05; done
sleep 0.3
kill -KILL "$KPID"; wait "$KPID" 2>/dev/null
SMC_RS_LOCAL_ADDR=$CIP timeout 60 "$SMC" run curl -sS -o "$WORK/got-k.bin" "http://$SIP:$PB/f.bin" \
  2> "$WORK/curl-k.err"
g=$(sha256sum < "$WORK/got-k.bin" 2>/dev/null | cut -d' ' -f1)
kp=$(sed -n "s/^pid=\([0-9]*\) connect .*peer=$SIP:$PB .*/\1/p" "$STATS" | tail -n1)
if [ "$g" = "$want" ] && [ -n "$kp" ] && [ "$(lines "$kp" connect SMC-R)" = 1 ]; then
  ok "after a client on $CIP was SIGKILLed mid-transfer, a new client there: SMC-R, data verified"
else fail "client after SIGKILL (sha $g, pid ${kp:-?})"; show "$WORK/curl-k.err" "$STATS"; fi
# The servers survived it.
for p in "$PA" "$PB"; do
  ss -Hltn "sport = :$p" | grep -q . || fail "server on $p died"
done

[ "$FAILS" = 0 ] || exit 1
echo "PASS: smc-run-many"
