#!/usr/bin/env bash
# System test (issue 13, "proof with programs no one here wrote"): Debian's programs,
# both ends under `smc run`, every connection checked SMC-R by the server's own counters
# (`smc stats --pid SERVER`: SMC-R connections counted, no fallback, no handshake reset)
# and, while the long clients run, by `smc ss` (their sockets SMCR, none TCP):
#  - nginx (master + 2 forked workers accepting on the inherited listener) serving a
#    100 MiB file to curl (SHA-256 checked) and to wrk (no socket error, no non-2xx);
#  - redis-server + redis-benchmark -t set,get: 50 clients, -P 16, and -c 1000
#    (1,000 connections at once);
#  - iperf3 -P 4 both directions (-R);
#  - sockperf ping-pong (TCP);
#  - a forking server, python3 socketserver.ForkingTCPServer echoing (a forked child per
#    connection uses the descriptor it inherited, the parent keeps accepting), and
#    `ncat -l -k --sh-exec` (fork, then fork+exec of a shell per connection);
#  - performance beside plain kernel TCP on the same addresses in the same run
#    (redis-benchmark ops/s, sockperf latency, iperf3 and wrk throughput): printed as
#    "perf:" lines, reported and never asserted (README table).
# CI=true runs shorter loads (-n 20000, 2-3 s runs); SMC_RUN_PROGRAMS_FULL=1 forces the
# full ones (the default outside CI: -n 100000, 5-10 s runs).
# Addresses: SMC_RUN_PROGRAMS_SERVER_IP / SMC_RUN_PROGRAMS_CLIENT_IP (default
# 127.0.13.52 / 127.0.13.51).
#
# Exit: 0 pass, 77 skip, anything else fail.
set -uo pipefail
cd "$(dirname "$0")/../.."
TEST_NAME=smc-run-programs
. tests/system/lib/smc-common.bash
for t in python3 curl sha256sum ss nginx wrk redis-server redis-benchmark iperf3 sockperf ncat; do
  command -v "$t" >/dev/null || skip "missing $t (run scripts/setup.sh)"
done
ensure_bin
ensure_preload
SIP=${SMC_RUN_PROGRAMS_SERVER_IP:-127.0.13.52}; CIP=${SMC_RUN_PROGRAMS_CLIENT_IP:-127.0.13.51}
export SMC_RS_SKIP_TCP_OPTION='127.0.0.0/8:*'
if [ "${CI:-}" = true ] && [ -z "${SMC_RUN_PROGRAMS_FULL:-}" ]; then
  N=20000; T=2; WRK_T=3
else
  N=100000; T=5; WRK_T=10
fi
# 1,000 connections on each side: the program's descriptor, our socketpair end and TCP
# socket, the runtime's own.
ulimit -n "$(ulimit -Hn)" 2>/dev/null
[ "$(ulimit -n)" -ge 8192 ] || skip "redis-benchmark -c 1000 needs ulimit -n ≥ 8192 (have $(ulimit -n))" always

# stat PID KEY: a counter of one process (`smc stats --pid`).
stat() { "$SMC" stats --pid "$1" --json | json "d.get('$2', 0)"; }
# snap PID: "smc_total fallbacks handshake_resets" of PID.
snap() { "$SMC" stats --pid "$1" --json | json "'%d %d %d' % (d.get('smc_total',0), d.get('fallbacks',0), d.get('handshake_resets',0))"; }
# snap_all PID...: `snap` summed over processes (a process that started no stack: 0).
snap_all() {
  local p a b c t=0 f=0 r=0
  for p in "$@"; do
    read -r a b c <<< "$(snap "$p" 2>/dev/null)"
    t=$((t + ${a:-0})); f=$((f + ${b:-0})); r=$((r + ${c:-0}))
  done
  echo "$t $f $r"
}
# all_smc NAME "SERVER-PIDS" BEFORE MIN: the servers (a `snap_all` of their pids) accepted
# at least MIN more SMC-R connections since BEFORE, none fell back or was reset. Sets GOT.
all_smc() {
  local name=$1 pid=$2 before=$3 min=$4 after t0 f0 r0 t1 f1 r1 p
  # shellcheck disable=SC2086 # a list of pids
  after=$(snap_all $pid)
  read -r t0 f0 r0 <<< "$before"; read -r t1 f1 r1 <<< "${after:-0 0 0}"
  GOT=$((t1 - t0))
  if [ "$GOT" -ge "$min" ] && [ "$f1" = "$f0" ] && [ "$r1" = "$r0" ]; then
    ok "  $name: smc stats --pid $pid: $GOT SMC-R connections accepted, 0 fallbacks, 0 handshake resets"
    return 0
  fi
  fail "$name: server $pid: $GOT SMC-R connections (want ≥ $min), fallbacks $f0 → $f1, resets $r0 → $r1"
  for p in $pid; do "$SMC" stats --pid "$p" | sed 's/^/    /'; done
  return 1
}
# watch_ss PID OUT: while PID runs, samples `smc ss --json`; writes "MAX-SMCR TCP" of
# PID's sockets (the most SMC-R sockets seen at once, TCP sockets ever seen) to OUT.
tree() { local c; echo "$1"; for c in $(ps -o pid= --ppid "$1"); do tree "$c"; done; }
watch_ss() {
  local pid=$1 out=$2 best=0 tcp=0 n t line ps
  while kill -0 "$pid" 2>/dev/null; do
    # `timeout` runs the program as its child.
    ps=$(tree "$pid" | tr '\n' ',')
    line=$("$SMC" ss --json 2>/dev/null | json "'%d %d' % (sum(1 for s in d if s['pid'] in ($ps) and s['mode']=='SMCR'), sum(1 for s in d if s['pid'] in ($ps) and s['mode']=='TCP'))" 2>/dev/null)
    read -r n t <<< "${line:-0 0}"
    [ "$n" -gt "$best" ] && best=$n
    [ "$t" -gt "$tcp" ] && tcp=$t
    echo "$best $tcp" > "$out"
    sleep 0.3
  done
}
PERF=()
perf() { PERF+=("$*"); }

# === nginx: a 100 MiB file to curl and wrk ===========================================
mkdir -p "$WORK/www" "$WORK/ng"
head -c $((100 << 20)) /dev/urandom > "$WORK/www/big.bin"
want=$(sha256sum < "$WORK/www/big.bin" | cut -d' ' -f1)
nginx_conf() {  # nginx_conf PORT NAME: nginx as it runs by default (it daemonizes: the
  # process started exits, its child is the master, which forks 2 workers) on SIP:PORT
  mkdir -p "$WORK/ng/$2"
  cat > "$WORK/ng/$2/nginx.conf" <<EOF
worker_processes 2;
user root;
pid $WORK/ng/$2/nginx.pid;
error_log $WORK/ng/$2/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $WORK/ng/$2/body;
  proxy_temp_path $WORK/ng/$2/proxy;
  fastcgi_temp_path $WORK/ng/$2/fastcgi;
  uwsgi_temp_path $WORK/ng/$2/uwsgi;
  scgi_temp_path $WORK/ng/$2/scgi;
  sendfile on;
  server { listen $SIP:$1; root $WORK/www; }
}
EOF
  echo "$WORK/ng/$2/nginx.conf"
}
# nginx_stop NAME: QUIT to the master (graceful), then wait until it is gone.
nginx_stop() {
  local m i
  m=$(cat "$WORK/ng/$1/nginx.pid" 2>/dev/null) || return 0
  kill -QUIT "$m" 2>/dev/null
  for i in $(seq 100); do kill -0 "$m" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$m" 2>/dev/null
}
NP=$(free_port)
# Returns once nginx has daemonized (the process that listened exits; its child is the
# master, whose workers take the listener over).
"$SMC" run nginx -c "$(nginx_conf "$NP" smc)" -e "$WORK/ng/smc/error.log" > "$WORK/nginx.out" 2>&1
rc=$?
NGM=
wait_listen "$NP" && NGM=$(cat "$WORK/ng/smc/nginx.pid" 2>/dev/null)
if [ "$rc" != 0 ] || [ -z "$NGM" ]; then
  fail "nginx under smc run did not start (exit $rc)"; show "$WORK/nginx.out" "$WORK/ng/smc/error.log"; exit 1
fi
PIDS+=("$NGM")
NGW=$(ps -o pid= --ppid "$NGM" | tr -s ' \n' ' ')
[ "$(wc -w <<< "$NGW")" = 2 ] || { fail "nginx: 2 workers expected under master $NGM, found: $NGW"; exit 1; }
# shellcheck disable=SC2086 # a list of pids
b=$(snap_all $NGW)
SMC_RS_LOCAL_ADDR=$CIP timeout 120 "$SMC" run curl -sS -o "$WORK/got.bin" "http://$SIP:$NP/big.bin" \
  -o "$WORK/got2.bin" "http://$SIP:$NP/big.bin" 2> "$WORK/curl.err"
rc=$?
g1=$(sha256sum < "$WORK/got.bin" 2>/dev/null | cut -d' ' -f1)
g2=$(sha256sum < "$WORK/got2.bin" 2>/dev/null | cut -d' ' -f1)
if [ "$rc" = 0 ] && [ "$g1" = "$want" ] && [ "$g2" = "$want" ]; then
  ok "smc run curl ← smc run nginx (daemonized: master + 2 workers): 2 × 100 MiB, SHA-256 verified"
else fail "curl ← nginx (exit $rc): sha256 $g1 / $g2, want $want"; show "$WORK/curl.err" "$WORK/ng/smc/error.log"; fi
# curl reuses its connection for the second file (keep-alive): one connection at least,
# accepted by a worker.
all_smc "curl → nginx" "$NGW" "$b" 1
rm -f "$WORK/got.bin" "$WORK/got2.bin"

# shellcheck disable=SC2086 # a list of pids
b=$(snap_all $NGW)
SMC_RS_LOCAL_ADDR=$CIP timeout $((WRK_T + 60)) "$SMC" run wrk -t 2 -c 4 -d "${WRK_T}s" --timeout 60s \
  "http://$SIP:$NP/big.bin" > "$WORK/wrk.out" 2>&1 &
WPID=$!
watch_ss "$WPID" "$WORK/wrk.ss" &
WW=$!
wait "$WPID"; rc=$?
wait "$WW"
reqs=$(sed -n 's/^ *\([0-9]*\) requests in .*/\1/p' "$WORK/wrk.out")
read -r wsmc wtcp < "$WORK/wrk.ss" 2>/dev/null
# Requests finished in the time (a loaded machine may finish few 100 MiB ones); that all
# 4 connections were SMC-R is the workers' count below.
if [ "$rc" = 0 ] && [ "${reqs:-0}" -ge 1 ] && ! grep -q "Socket errors\|Non-2xx" "$WORK/wrk.out" \
   && [ "${wsmc:-0}" -ge 1 ] && [ "${wtcp:-1}" = 0 ]; then
  ok "smc run wrk -c 4 ← smc run nginx: $reqs × 100 MiB, no socket error, no non-2xx; smc ss saw $wsmc of wrk's sockets SMCR at once, none TCP"
  perf "wrk -t 2 -c 4 -d ${WRK_T}s (100 MiB file)  SMC-R: $(sed -n 's/^Transfer\/sec: *//p' "$WORK/wrk.out")/s, $reqs requests"
else fail "wrk (exit $rc, $reqs requests, smc ss: ${wsmc:-?} SMCR / ${wtcp:-?} TCP)"; show "$WORK/wrk.out" "$WORK/ng/smc/error.log"; fi
all_smc "wrk → nginx" "$NGW" "$b" 4
nginx_stop smc
# The same over kernel TCP (reported).
NP2=$(free_port)
nginx -c "$(nginx_conf "$NP2" tcp)" -e "$WORK/ng/tcp/error.log" > /dev/null 2>&1
if wait_listen "$NP2"; then
  PIDS+=("$(cat "$WORK/ng/tcp/nginx.pid")")
  wrk -t 2 -c 4 -d "${WRK_T}s" --timeout 60s "http://$SIP:$NP2/big.bin" > "$WORK/wrk-tcp.out" 2>&1
  perf "wrk -t 2 -c 4 -d ${WRK_T}s (100 MiB file)  TCP:   $(sed -n 's/^Transfer\/sec: *//p' "$WORK/wrk-tcp.out")/s, $(sed -n 's/^ *\([0-9]*\) requests in .*/\1/p' "$WORK/wrk-tcp.out") requests"
fi
nginx_stop tcp
rm -f "$WORK/www/big.bin"

# === redis ===========================================================================
RP=$(free_port)
"$SMC" run redis-server --bind "$SIP" --port "$RP" --save '' --appendonly no --protected-mode no \
  --maxclients 4000 > "$WORK/redis.log" 2>&1 &
RPID=$!; PIDS+=("$RPID")
wait_listen "$RP" || { fail "redis-server under smc run did not start"; show "$WORK/redis.log"; exit 1; }
# bench NAME ARGS...: redis-benchmark -t set,get under smc run; results in $WORK/NAME.res
bench() {
  local name=$1 rc b min=100; shift
  case " $* " in *" -c 1000 "*) min=2000 ;; esac
  b=$(snap "$RPID")
  SMC_RS_LOCAL_ADDR=$CIP timeout 300 "$SMC" run redis-benchmark -h "$SIP" -p "$RP" -t set,get -n "$N" -q "$@" \
    > "$WORK/$name.out" 2> "$WORK/$name.err" &
  local bp=$!
  watch_ss "$bp" "$WORK/$name.ss" &
  local ww=$!
  wait "$bp"; rc=$?
  wait "$ww"
  tr '\r' '\n' < "$WORK/$name.out" | grep -E '^(SET|GET): [0-9.]+ requests per second' > "$WORK/$name.res"
  local s t; read -r s t < "$WORK/$name.ss" 2>/dev/null
  if [ "$rc" = 0 ] && [ "$(wc -l < "$WORK/$name.res")" = 2 ] && [ "${t:-1}" = 0 ]; then
    ok "smc run redis-benchmark -t set,get -n $N $* → smc run redis-server: SET and GET done; smc ss saw ${s:-0} of its sockets SMCR at once, none TCP"
    sed 's/^/    /' "$WORK/$name.res"
  else fail "redis-benchmark $* (exit $rc; smc ss ${s:-?} SMCR / ${t:-?} TCP)"; show "$WORK/$name.out" "$WORK/$name.err" "$WORK/redis.log"; fi
  all_smc "redis-benchmark $*" "$RPID" "$b" "$min"
}
rps() { sed -n "s/^$2: \([0-9.]*\) requests per second.*/\1/p" "$1"; }
bench rb50
bench rbP16 -P 16
bench rb1000 -c 1000
kill "$RPID" 2>/dev/null; wait "$RPID" 2>/dev/null
RP2=$(free_port)
redis-server --bind "$SIP" --port "$RP2" --save '' --appendonly no --protected-mode no --maxclients 4000 \
  > "$WORK/redis-tcp.log" 2>&1 &
RT=$!; PIDS+=("$RT")
if wait_listen "$RP2"; then
  for a in "" "-P 16" "-c 1000"; do
    # shellcheck disable=SC2086
    redis-benchmark -h "$SIP" -p "$RP2" -t set,get -n "$N" -q $a 2>/dev/null | tr '\r' '\n' \
      | grep -E '^(SET|GET): [0-9.]+ requests per second' > "$WORK/rbtcp.res"
    case $a in "") f=rb50 ;; "-P 16") f=rbP16 ;; *) f=rb1000 ;; esac
    perf "redis-benchmark -t set,get -n $N ${a:--c 50}  SET/s SMC-R $(rps "$WORK/$f.res" SET) TCP $(rps "$WORK/rbtcp.res" SET)   GET/s SMC-R $(rps "$WORK/$f.res" GET) TCP $(rps "$WORK/rbtcp.res" GET)"
  done
fi
kill "$RT" 2>/dev/null; wait "$RT" 2>/dev/null

# === iperf3 -P 4, both directions ======================================================
IP3=$(free_port)
"$SMC" run iperf3 -s -B "$SIP" -p "$IP3" > "$WORK/iperf-srv.log" 2>&1 &
IPID=$!; PIDS+=("$IPID")
wait_listen "$IP3" || { fail "iperf3 -s under smc run did not start"; show "$WORK/iperf-srv.log"; exit 1; }
sum_rx() { grep -E '^\[SUM\].*receiver' "$1" | awk '{for(i=1;i<=NF;i++) if ($i ~ /bits\/sec$/) {print $(i-1), $i; exit}}'; }
for dir in up down; do
  extra=(); [ "$dir" = down ] && extra=(-R)
  b=$(snap "$IPID")
  SMC_RS_LOCAL_ADDR=$CIP timeout $((T + 60)) "$SMC" run iperf3 -c "$SIP" -p "$IP3" -t "$T" -P 4 "${extra[@]}" \
    > "$WORK/iperf-$dir.log" 2>&1 &
  cp=$!
  watch_ss "$cp" "$WORK/iperf-$dir.ss" &
  ww=$!
  wait "$cp"; rc=$?
  wait "$ww"
  read -r s t < "$WORK/iperf-$dir.ss" 2>/dev/null
  if [ "$rc" = 0 ] && grep -q "iperf Done" "$WORK/iperf-$dir.log" && [ "${s:-0}" -ge 5 ] && [ "${t:-1}" = 0 ]; then
    ok "smc run iperf3 -P 4 ${extra[*]} ↔ smc run iperf3 -s: $(sum_rx "$WORK/iperf-$dir.log"); smc ss saw the control and 4 data sockets SMCR, none TCP"
  else fail "iperf3 -P 4 ${extra[*]} (exit $rc; smc ss ${s:-?} SMCR / ${t:-?} TCP)"; show "$WORK/iperf-$dir.log" "$WORK/iperf-srv.log"; fi
  all_smc "iperf3 -P 4 ${extra[*]}" "$IPID" "$b" 5
  perf "iperf3 -P 4 -t $T ${extra[*]:-   }  SMC-R $(sum_rx "$WORK/iperf-$dir.log")"
done
kill "$IPID" 2>/dev/null; wait "$IPID" 2>/dev/null
IP4=$(free_port)
iperf3 -s -B "$SIP" -p "$IP4" > /dev/null 2>&1 &
IT=$!; PIDS+=("$IT")
if wait_listen "$IP4"; then
  for extra in "" "-R"; do
    # shellcheck disable=SC2086
    timeout $((T + 60)) iperf3 -c "$SIP" -p "$IP4" -t "$T" -P 4 $extra > "$WORK/iperf-tcp.log" 2>&1
    perf "iperf3 -P 4 -t $T ${extra:-  }  TCP   $(sum_rx "$WORK/iperf-tcp.log")"
  done
fi
kill "$IT" 2>/dev/null; wait "$IT" 2>/dev/null

# === sockperf ping-pong ================================================================
lat() {  # lat FILE: "avg A us, p50 B us, p99 C us"
  local a p50 p99
  a=$(sed -n 's/.*avg-latency=\([0-9.]*\).*/\1/p' "$1" | tail -n1)
  p50=$(sed -n 's/.*percentile 50.000 = *\([0-9.]*\).*/\1/p' "$1" | tail -n1)
  p99=$(sed -n 's/.*percentile 99.000 = *\([0-9.]*\).*/\1/p' "$1" | tail -n1)
  echo "avg $a µs, p50 $p50 µs, p99 $p99 µs"
}
SPP=$(free_port)
"$SMC" run sockperf sr --tcp -i "$SIP" -p "$SPP" > "$WORK/sockperf-srv.log" 2>&1 &
SPID=$!; PIDS+=("$SPID")
wait_listen "$SPP" || { fail "sockperf sr under smc run did not start"; show "$WORK/sockperf-srv.log"; exit 1; }
b=$(snap "$SPID")
SMC_RS_LOCAL_ADDR=$CIP timeout $((T + 60)) "$SMC" run sockperf pp --tcp -i "$SIP" -p "$SPP" -t "$T" -m 64 \
  > "$WORK/sockperf.log" 2>&1
rc=$?
if [ "$rc" = 0 ] && grep -q "avg-latency=" "$WORK/sockperf.log" \
   && grep -q "# dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0" "$WORK/sockperf.log"; then
  ok "smc run sockperf ping-pong --tcp -m 64 ↔ smc run sockperf sr: $(lat "$WORK/sockperf.log"); no message dropped, duplicated or out of order"
else fail "sockperf (exit $rc)"; show "$WORK/sockperf.log" "$WORK/sockperf-srv.log"; fi
all_smc "sockperf" "$SPID" "$b" 1
perf "sockperf ping-pong --tcp -m 64 -t $T  SMC-R $(lat "$WORK/sockperf.log")"
kill "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null
SPP2=$(free_port)
sockperf sr --tcp -i "$SIP" -p "$SPP2" > /dev/null 2>&1 &
ST=$!; PIDS+=("$ST")
if wait_listen "$SPP2"; then
  timeout $((T + 60)) sockperf pp --tcp -i "$SIP" -p "$SPP2" -t "$T" -m 64 > "$WORK/sockperf-tcp.log" 2>&1
  perf "sockperf ping-pong --tcp -m 64 -t $T  TCP   $(lat "$WORK/sockperf-tcp.log")"
fi
kill "$ST" 2>/dev/null; wait "$ST" 2>/dev/null

# === forking servers ===================================================================
head -c 3000000 /dev/urandom > "$WORK/up.bin"
head -c 2000000 /dev/urandom > "$WORK/down.bin"
up_sha=$(sha256sum < "$WORK/up.bin" | cut -d' ' -f1)
cat > "$WORK/fork_echo.py" <<'EOF'
# A forking echo server: each connection is served by a forked child (its pid is the
# first line it sends), which echoes until end of file.
import os, socketserver, sys
class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        self.request.sendall(b"%d\n" % os.getpid())
        while True:
            b = self.request.recv(65536)
            if not b:
                return
            self.request.sendall(b)
class Server(socketserver.ForkingTCPServer):
    allow_reuse_address = True
    request_queue_size = 64
Server((sys.argv[1], int(sys.argv[2])), Echo).serve_forever()
EOF
FP=$(free_port)
"$SMC" run python3 "$WORK/fork_echo.py" "$SIP" "$FP" > "$WORK/fork.log" 2>&1 &
FPID=$!; PIDS+=("$FPID")
wait_listen "$FP" || { fail "ForkingTCPServer under smc run did not start"; show "$WORK/fork.log"; exit 1; }
b=$(snap "$FPID")
bad=0; kids=()
for round in 1 2; do
  cps=()
  for i in 1 2 3; do
    SMC_RS_LOCAL_ADDR=$CIP timeout 60 "$SMC" run ncat "$SIP" "$FP" < "$WORK/up.bin" > "$WORK/fe$round$i.out" 2> "$WORK/fe$round$i.err" &
    cps+=("$!")
  done
  for p in "${cps[@]}"; do wait "$p" || bad=1; done
  for i in 1 2 3; do
    kids+=("$(head -n1 "$WORK/fe$round$i.out")")
    g=$(tail -n +2 "$WORK/fe$round$i.out" | sha256sum | cut -d' ' -f1)
    [ "$g" = "$up_sha" ] || { bad=1; echo "  round $round client $i: echo sha256 $g, want $up_sha"; }
  done
done
nkids=$(printf '%s\n' "${kids[@]}" | grep -vx "$FPID" | sort -u | grep -c .)
if [ "$bad" = 0 ] && [ "$nkids" = 6 ] && kill -0 "$FPID" 2>/dev/null; then
  ok "smc run python3 ForkingTCPServer: 2 rounds × 3 smc run ncat at once, each echoed (3 MB, SHA-256) by its own forked child on the inherited descriptor; the parent kept accepting"
else fail "forking server ($nkids distinct children)"; show "$WORK"/fe11.err "$WORK/fork.log"; fi
all_smc "ForkingTCPServer" "$FPID" "$b" 6
kill "$FPID" 2>/dev/null; wait "$FPID" 2>/dev/null

# ncat -k --sh-exec: per connection a forked ncat relays between the socket and a
# forked+exec'd shell. ncat's relay stops at the client's end of file (under TCP too),
# so the client keeps its side open (--no-shutdown) and the shell ends the exchange:
# it reads the upload, answers its SHA-256, then sends a file.
KP=$(free_port)
"$SMC" run ncat -l -k --sh-exec "head -c 3000000 | sha256sum; cat '$WORK/down.bin'" "$SIP" "$KP" > "$WORK/ncat-k.log" 2>&1 &
KPID=$!; PIDS+=("$KPID")
wait_listen "$KP" || { fail "ncat -l -k under smc run did not start"; show "$WORK/ncat-k.log"; exit 1; }
b=$(snap "$KPID")
bad=0; cps=()
for i in 1 2 3; do
  SMC_RS_LOCAL_ADDR=$CIP timeout 60 "$SMC" run ncat --no-shutdown "$SIP" "$KP" < "$WORK/up.bin" > "$WORK/nk$i.out" 2> "$WORK/nk$i.err" &
  cps+=("$!")
done
for p in "${cps[@]}"; do wait "$p" || bad=1; done
for i in 1 2 3; do
  [ "$(head -c 64 "$WORK/nk$i.out")" = "$up_sha" ] || { bad=1; echo "  client $i: upload hash $(head -c 64 "$WORK/nk$i.out")"; }
  tail -c +69 "$WORK/nk$i.out" | cmp -s - "$WORK/down.bin" || { bad=1; echo "  client $i: download differs"; }
done
if [ "$bad" = 0 ]; then
  ok "smc run ncat -l -k --sh-exec (fork, fork+exec per connection) ← 3 smc run ncat at once: 3 MB up (SHA-256 answered), 2 MB down, identical"
else fail "ncat -k --sh-exec"; show "$WORK/nk1.err" "$WORK/ncat-k.log"; fi
all_smc "ncat -l -k --sh-exec" "$KPID" "$b" 3
kill "$KPID" 2>/dev/null; wait "$KPID" 2>/dev/null

# === performance, reported ============================================================
echo "perf: through smc run (both ends) beside kernel TCP, same addresses, same run (reported, not asserted):"
for l in "${PERF[@]}"; do echo "perf:   $l"; done

[ "$FAILS" = 0 ] || exit 1
echo "PASS: smc-run-programs"
