#!/usr/bin/env bash
# System test (issue 13): `smc run` — unmodified programs on SMC-R through the
# interposition library (crates/preload, libsmc_preload.so), both ends on loopback
# with SMC_RS_SKIP_TCP_OPTION (no eBPF):
#  - python3 -m http.server + curl: a 20 MiB file, SHA-256 checked, two connections in
#    one curl (first and subsequent contact);
#  - nc both ways (client → server, server → client), data compared;
#  - that each connection really was SMC-R: the SMC_RS_STATS event lines the library
#    writes (mode=SMC-R on both ends, byte counts);
#  - a server killed with SIGKILL mid-transfer: the `smc run` client ends (no hang);
#  - mixed: an `smc run` curl against a plain http.server, and a plain curl against an
#    `smc run` http.server: TCP fallback with the reason, and it works;
#  - redis-server + redis-cli (a 1.4 MB value SET and GET back) and redis-benchmark
#    (-t set,get -n 20000, 50 clients): every connection SMC-R; the same benchmark over
#    kernel TCP is printed beside it (reported, not asserted);
#  - iperf3 -P 2 both ways (-R): control and data connections SMC-R on both ends, the
#    throughput beside kernel TCP (reported).
# Server and client addresses: SMC_RUN_SERVER_IP / SMC_RUN_CLIENT_IP (default
# 127.0.13.2 / 127.0.13.1: each process's software RNIC binds UDP 4791 there).
#
# Exit: 0 pass, 77 skip, anything else fail.
set -uo pipefail
cd "$(dirname "$0")/../.."
TEST_NAME=smc-run
. tests/system/lib/smc-common.bash
for t in python3 nc curl sha256sum ss; do
  command -v "$t" >/dev/null || skip "missing $t (run scripts/setup.sh)"
done
ensure_bin
ensure_preload
SIP=${SMC_RUN_SERVER_IP:-127.0.13.2}; CIP=${SMC_RUN_CLIENT_IP:-127.0.13.1}
POLICY='127.0.0.0/8:*'
STATS="$WORK/stats.log"
export SMC_RS_STATS="$STATS"

# wait_listen PORT: a listening socket on PORT (no probe connection: it would be a
# connection of its own to the server under test).
# smc_lines PID MODE: how many connect/accept lines of PID have mode=MODE.
smc_lines() { grep -cE "^pid=$1 (connect|accept) .* mode=$2( |$)" "$STATS"; }
server_pid_of() {  # the pid in the stats file that listened on PORT
  sed -n "s/^pid=\([0-9]*\) listen local=.*:$1 mode=SMC$/\1/p" "$STATS" | head -n1
}

# --- python3 -m http.server + curl, both under smc run ------------------------
mkdir -p "$WORK/www"
head -c $((20 << 20)) /dev/urandom > "$WORK/www/big.bin"
want=$(sha256sum < "$WORK/www/big.bin" | cut -d' ' -f1)
P=$(free_port)
SMC_RS_SKIP_TCP_OPTION=$POLICY "$SMC" run -- python3 -m http.server "$P" --bind "$SIP" \
  --directory "$WORK/www" > "$WORK/http.log" 2>&1 &
HPID=$!; PIDS+=("$HPID")
wait_listen "$P" || { fail "http.server under smc run did not start"; show "$WORK/http.log"; exit 1; }
SMC_RS_SKIP_TCP_OPTION=$POLICY SMC_RS_LOCAL_ADDR=$CIP timeout 60 "$SMC" run curl -sS \
  -o "$WORK/got1.bin" "http://$SIP:$P/big.bin" -o "$WORK/got2.bin" "http://$SIP:$P/big.bin" \
  2> "$WORK/curl.err"
rc=$?
g1=$(sha256sum < "$WORK/got1.bin" 2>/dev/null | cut -d' ' -f1)
g2=$(sha256sum < "$WORK/got2.bin" 2>/dev/null | cut -d' ' -f1)
if [ "$rc" = 0 ] && [ "$g1" = "$want" ] && [ "$g2" = "$want" ]; then
  ok "smc run curl ← smc run python3 -m http.server: 2 × 20 MiB, SHA-256 verified"
else fail "curl (exit $rc) sha256 $g1 / $g2, want $want"; show "$WORK/curl.err" "$WORK/http.log" "$STATS"; fi
spid=$(server_pid_of "$P")
cpid=$(sed -n "s/^pid=\([0-9]*\) connect .*peer=$SIP:$P .*/\1/p" "$STATS" | head -n1)
if [ -n "$spid" ] && [ -n "$cpid" ] && [ "$(smc_lines "$cpid" SMC-R)" = 2 ] \
   && [ "$(smc_lines "$spid" SMC-R)" = 2 ] \
   && grep -q "^pid=$cpid connect .*subsequent contact" "$STATS" \
   && [ "$(grep -cE "^pid=$cpid close .* mode=SMC-R .*received=2097[0-9]{4}$" "$STATS")" = 2 ]; then
  ok "  both connections SMC-R on both ends (first and subsequent contact), 20 MiB each through SMC-R"
else fail "http: connections not SMC-R (server pid ${spid:-?}, curl pid ${cpid:-?})"; show "$STATS"; fi

# Done with this server (processes can share an address's UDP 4791 since the port
# sharing of docs/port-sharing.md; smc-run-many.sh tests that).
kill "$HPID" 2>/dev/null; wait "$HPID" 2>/dev/null

# --- nc, client → server and server → client ---------------------------------
head -c 3000000 /dev/urandom > "$WORK/up.bin"
head -c 2000000 /dev/urandom > "$WORK/down.bin"
nc_case() {  # NAME SERVER-ARGS CLIENT-ARGS SERVER-IN CLIENT-IN SERVER-OUT CLIENT-OUT
  local name=$1 sargs=$2 cargs=$3 sin=$4 cin=$5 sout=$6 cout=$7 p npid rc
  p=$(free_port)
  # shellcheck disable=SC2086
  SMC_RS_SKIP_TCP_OPTION=$POLICY timeout 60 "$SMC" run nc $sargs -l "$SIP" "$p" < "$sin" > "$sout" 2> "$WORK/$name-srv.err" &
  npid=$!; PIDS+=("$npid")
  wait_listen "$p" || { fail "$name: nc -l under smc run did not start"; return; }
  # shellcheck disable=SC2086
  SMC_RS_SKIP_TCP_OPTION=$POLICY SMC_RS_LOCAL_ADDR=$CIP timeout 60 "$SMC" run nc $cargs "$SIP" "$p" \
    < "$cin" > "$cout" 2> "$WORK/$name-cli.err"
  rc=$?
  wait_exit "$npid" 30
  NC_RC=$rc NC_PORT=$p
}
nc_case up "" "-N" /dev/null "$WORK/up.bin" "$WORK/up.got" /dev/null
if [ "$NC_RC" = 0 ] && cmp -s "$WORK/up.bin" "$WORK/up.got"; then
  ok "smc run nc -N → smc run nc -l: 3000000 bytes identical"
else fail "nc client → server (exit $NC_RC)"; show "$WORK/up-cli.err" "$WORK/up-srv.err"; fi
spid=$(server_pid_of "$NC_PORT")
grep -qE "^pid=$spid accept .* mode=SMC-R " "$STATS" \
  && grep -qE "^pid=$spid close .* mode=SMC-R sent=0 received=3000000$" "$STATS" \
  && grep -qE "^pid=[0-9]+ connect .*peer=$SIP:$NC_PORT mode=SMC-R " "$STATS" \
  && ok "  SMC-R on both ends" || { fail "nc up: not SMC-R"; show "$STATS"; }
nc_case down "-N" "-d" "$WORK/down.bin" /dev/null /dev/null "$WORK/down.got"
if [ "$NC_RC" = 0 ] && cmp -s "$WORK/down.bin" "$WORK/down.got"; then
  ok "smc run nc -d ← smc run nc -N -l: 2000000 bytes identical"
else fail "nc server → client (exit $NC_RC)"; show "$WORK/down-cli.err" "$WORK/down-srv.err"; fi
spid=$(server_pid_of "$NC_PORT")
grep -qE "^pid=$spid close .* mode=SMC-R sent=2000000 received=0$" "$STATS" \
  && grep -qE "^pid=[0-9]+ connect .*peer=$SIP:$NC_PORT mode=SMC-R " "$STATS" \
  && ok "  SMC-R on both ends" || { fail "nc down: not SMC-R"; show "$STATS"; }

# --- a server killed (SIGKILL) mid-transfer: the client ends, it does not hang -----
p=$(free_port)
SMC_RS_SKIP_TCP_OPTION=$POLICY "$SMC" run nc -l "$SIP" "$p" < /dev/zero > /dev/null 2>&1 &
KPID=$!; PIDS+=("$KPID")
if wait_listen "$p"; then
  SMC_RS_SKIP_TCP_OPTION=$POLICY SMC_RS_LOCAL_ADDR=$CIP "$SMC" run nc -d "$SIP" "$p" > /dev/null 2>&1 &
  CPID=$!; PIDS+=("$CPID")
  for _ in $(seq 100); do grep -qE "^pid=[0-9]+ connect .*peer=$SIP:$p mode=SMC-R " "$STATS" && break; sleep 0.05; done
  sleep 0.5
  kill -9 "$KPID"
  t0=$(date +%s%N)
  wait_exit "$CPID" 20; rc=$?
  if [ "$rc" != 124 ]; then
    ok "server killed mid-transfer: the smc run client ended after $(( ($(date +%s%N) - t0) / 1000000 )) ms (exit $rc), no hang"
  else fail "client still running 20 s after its SMC-R peer was killed"; fi
else fail "nc -l for the kill case did not start"; fi

# --- mixed: fallback to TCP ------------------------------------------------------
# No policy and no eBPF: nobody announces SMC-R, as with a peer that cannot.
echo "plain-page" > "$WORK/www/plain.txt"
P2=$(free_port)
python3 -m http.server "$P2" --bind "$SIP" --directory "$WORK/www" > "$WORK/plain.log" 2>&1 &
PIDS+=($!)
wait_listen "$P2" || { fail "plain http.server did not start"; exit 1; }
out=$(timeout 30 "$SMC" run curl -sS "http://$SIP:$P2/plain.txt" 2> "$WORK/fb.err")
if [ "$out" = plain-page ] && grep -qE "^pid=[0-9]+ connect peer=$SIP:$P2 mode=TCP info=\"..*\"$" "$STATS"; then
  ok "smc run curl → plain http.server: works, TCP fallback: $(sed -n "s/^pid=[0-9]* connect peer=$SIP:$P2 mode=TCP info=//p" "$STATS")"
else fail "smc run curl → plain server ($out)"; show "$WORK/fb.err" "$STATS"; fi
P3=$(free_port)
"$SMC" run python3 -m http.server "$P3" --bind "$SIP" --directory "$WORK/www" > "$WORK/smcsrv.log" 2>&1 &
PIDS+=($!)
wait_listen "$P3" || { fail "smc run http.server (no policy) did not start"; exit 1; }
out=$(timeout 30 curl -sS "http://$SIP:$P3/plain.txt" 2> "$WORK/fb2.err")
spid=$(server_pid_of "$P3")
if [ "$out" = plain-page ] && grep -qE "^pid=$spid accept .* mode=TCP info=\"..*\"$" "$STATS"; then
  ok "plain curl → smc run http.server: works, TCP fallback"
else fail "plain curl → smc run server ($out)"; show "$WORK/fb2.err" "$STATS"; fi

# --- redis-server + redis-benchmark, both under smc run -------------------------
command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null \
  && command -v redis-cli >/dev/null || skip "missing redis-server/redis-tools (run scripts/setup.sh)"
# --protected-mode no: our client address is 127.0.13.1, which redis's protected mode
# does not count as loopback (only 127.0.0.1 and ::1) — the same over plain TCP.
P4=$(free_port)
SMC_RS_SKIP_TCP_OPTION=$POLICY "$SMC" run redis-server --bind "$SIP" --port "$P4" --save '' \
  --appendonly no --protected-mode no > "$WORK/redis.log" 2>&1 &
RPID=$!; PIDS+=("$RPID")
wait_listen "$P4" || { fail "redis-server under smc run did not start"; show "$WORK/redis.log"; exit 1; }
head -c $((1 << 20)) /dev/urandom | base64 -w0 > "$WORK/value.txt"
SMC_RS_SKIP_TCP_OPTION=$POLICY SMC_RS_LOCAL_ADDR=$CIP timeout 30 "$SMC" run redis-cli -h "$SIP" -p "$P4" \
  -x set smc-run-key < "$WORK/value.txt" > "$WORK/redis-set.out" 2>&1
SMC_RS_SKIP_TCP_OPTION=$POLICY SMC_RS_LOCAL_ADDR=$CIP timeout 30 "$SMC" run redis-cli -h "$SIP" -p "$P4" \
  --raw get smc-run-key 2>&1 | head -c "$(stat -c %s "$WORK/value.txt")" > "$WORK/redis-get.out"
if cmp -s "$WORK/value.txt" "$WORK/redis-get.out"; then
  ok "smc run redis-cli: a 1.4 MB value SET and GET back identical"
else fail "redis-cli set/get"; show "$WORK/redis-set.out"; fi
before=$(grep -c . "$STATS")
SMC_RS_SKIP_TCP_OPTION=$POLICY SMC_RS_LOCAL_ADDR=$CIP timeout 120 "$SMC" run redis-benchmark \
  -h "$SIP" -p "$P4" -t set,get -n 20000 -q > "$WORK/bench.out" 2> "$WORK/bench.err"
rc=$?
tr '\r' '\n' < "$WORK/bench.out" | grep -E '^(SET|GET): [0-9.]+ requests per second' > "$WORK/bench.res"
bpid=$(tail -n +"$((before + 1))" "$STATS" | sed -n 's/^pid=\([0-9]*\) connect .*/\1/p' | sort | uniq -c | sort -rn | awk 'NR==1{print $2}')
nsmc=$(grep -cE "^pid=${bpid:-x} connect .* mode=SMC-R " "$STATS")
ntcp=$(grep -cE "^pid=${bpid:-x} connect .* mode=(TCP|failed) " "$STATS")
if [ "$rc" = 0 ] && [ "$(wc -l < "$WORK/bench.res")" = 2 ] && [ "$nsmc" -ge 100 ] && [ "$ntcp" = 0 ]; then
  ok "smc run redis-benchmark -t set,get -n 20000 → smc run redis-server: $nsmc connections, all SMC-R"
  sed 's/^/    SMC-R: /' "$WORK/bench.res"
else fail "redis-benchmark (exit $rc, $nsmc SMC-R / $ntcp TCP connections)"; show "$WORK/bench.out" "$WORK/bench.err" "$WORK/redis.log"; fi
kill "$RPID" 2>/dev/null; wait "$RPID" 2>/dev/null
# The same benchmark over kernel TCP on the same addresses, for the ratio (reported,
# never asserted).
P5=$(free_port)
redis-server --bind "$SIP" --port "$P5" --save '' --appendonly no --protected-mode no > "$WORK/redis-tcp.log" 2>&1 &
RPID=$!; PIDS+=("$RPID")
if wait_listen "$P5"; then
  redis-benchmark -h "$SIP" -p "$P5" -t set,get -n 20000 -q 2>/dev/null | tr '\r' '\n' \
    | grep -E '^(SET|GET): [0-9.]+ requests per second' | sed 's/^/    TCP:   /'
fi
kill "$RPID" 2>/dev/null; wait "$RPID" 2>/dev/null

# --- iperf3, both directions, under smc run ----------------------------------------
command -v iperf3 >/dev/null || skip "missing iperf3 (run scripts/setup.sh)"
iperf_case() {  # NAME CLIENT-ARGS...: one test against a one-off server, both under smc run
  local name=$1 p ipid rc cpid n; shift
  p=$(free_port)
  SMC_RS_SKIP_TCP_OPTION=$POLICY timeout 60 "$SMC" run iperf3 -s -1 -B "$SIP" -p "$p" \
    > "$WORK/$name-srv.log" 2>&1 &
  ipid=$!; PIDS+=("$ipid")
  wait_listen "$p" || { fail "$name: iperf3 -s under smc run did not start"; return; }
  SMC_RS_SKIP_TCP_OPTION=$POLICY SMC_RS_LOCAL_ADDR=$CIP timeout 60 "$SMC" run iperf3 -c "$SIP" -p "$p" \
    -t 2 -P 2 "$@" > "$WORK/$name.log" 2>&1
  rc=$?
  wait_exit "$ipid" 30
  cpid=$(sed -n "s/^pid=\([0-9]*\) connect .*peer=$SIP:$p .*/\1/p" "$STATS" | head -n1)
  n=$(grep -cE "^pid=${cpid:-x} connect .*peer=$SIP:$p mode=SMC-R " "$STATS")
  # The control connection and the two streams, SMC-R; iperf3's own verdict.
  if [ "$rc" = 0 ] && [ "$n" = 3 ] && grep -q "iperf Done" "$WORK/$name.log" \
     && [ "$(grep -cE "^pid=[0-9]+ accept local=$SIP:$p .* mode=SMC-R " "$STATS")" = 3 ]; then
    ok "smc run iperf3 -P 2 $* ↔ smc run iperf3 -s: 3 connections SMC-R on both ends"
    grep -E '^\[SUM\].*receiver' "$WORK/$name.log" | sed 's/^/    SMC-R: /'
  else fail "iperf3 $name (exit $rc, $n SMC-R connections)"; show "$WORK/$name.log" "$WORK/$name-srv.log"; fi
}
iperf_case iperf-up
iperf_case iperf-down -R
P6=$(free_port)
timeout 60 iperf3 -s -1 -B "$SIP" -p "$P6" > /dev/null 2>&1 &
IPID=$!; PIDS+=("$IPID")
if wait_listen "$P6"; then
  timeout 60 iperf3 -c "$SIP" -p "$P6" -t 2 -P 2 2>/dev/null | grep -E '^\[SUM\].*receiver' | sed 's/^/    TCP:   /'
fi
wait_exit "$IPID" 30 >/dev/null

[ "$FAILS" = 0 ] || exit 1
echo "PASS: smc run"
