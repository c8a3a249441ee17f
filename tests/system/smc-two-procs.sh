#!/usr/bin/env bash
# System test (issue 4): SMC-R between two smc processes on one host — the listener
# on 127.0.0.2, the client on 127.0.0.1, each with its own software RoCEv2 RNIC
# (UDP 4791 on its own address). 1 GiB goes each way (the listener echoes while the
# client still sends), hash-verified on both sides, and both connections must be
# SMC-R. No eBPF: the SMC_RS_SKIP_TCP_OPTION policy lists the peers.
#
# Exit: 0 pass, 77 skip, anything else fail. SMC_TEST_SIZE overrides the size.
set -uo pipefail
cd "$(dirname "$0")/../.."
TEST_NAME=smc-two-procs
. tests/system/lib/smc-common.bash
ensure_bin
SIZE=${SMC_TEST_SIZE:-1G}
export SMC_RS_SKIP_TCP_OPTION='127.0.0.0/8:*'
# Other loopback addresses when 127.0.0.1/.2 are busy (UDP 4791 taken by another stack).
SIP=${SMC_TEST_SERVER_IP:-127.0.0.2}; CIP=${SMC_TEST_CLIENT_IP:-127.0.0.1}

start_listen srv -- "$SIP:0" --echo --count 1 --stats
t0=$(date +%s.%N)
timeout 150 "$SMC" connect --bind "$CIP" "$SIP:$PORT" --send-bytes "$SIZE" --seed 7 --expect-echo --require-smc \
  > "$WORK/cli.out" 2> "$WORK/cli.err"
rc=$?
t1=$(date +%s.%N)
wait_exit "$LPID" 30; lrc=$?

BYTES=$(python3 -c "import sys; s=sys.argv[1]; u={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*u[s[-1]] if s[-1] in u else int(s))" "$SIZE")
# The generator's hash, computed independently of the transfer.
line=$(grep "^conn 1 " "$WORK/cli.out")
sent_sha=$(sed -n 's/.* sent [0-9]* bytes sha256=\([0-9a-f]*\) .*/\1/p' <<<"$line")
recv_sha=$(sed -n 's/.* received [0-9]* bytes sha256=\([0-9a-f]*\) .*/\1/p' <<<"$line")
echo_line=$(grep "^conn 1 " "$WORK/srv.out")

[ "$rc" = 0 ] && ok "client exit 0" || { fail "client exit $rc"; show "$WORK/cli.out" "$WORK/cli.err"; }
[ "$lrc" = 0 ] && ok "listener exit 0" || { fail "listener exit $lrc"; show "$WORK/srv.out" "$WORK/srv.err"; }
if grep -q "^conn 1 mode=SMC-R sent $BYTES bytes .* received $BYTES bytes .* echo=ok" <<<"$line"; then
  ok "client: $SIZE sent and the same $SIZE back (SHA-256 $sent_sha), mode SMC-R"
else fail "client result: $line"; fi
if grep -q "echoed $BYTES bytes sha256=$sent_sha" <<<"$echo_line" && [ -n "$sent_sha" ] && [ "$sent_sha" = "$recv_sha" ]; then
  ok "listener received $SIZE with the client's SHA-256"
else fail "listener result: $echo_line (client sent $sent_sha)"; fi
grep -q "^connected to $SIP:$PORT: SMC-R" "$WORK/cli.err" && ok "client mode: $(grep -m1 '^connected' "$WORK/cli.err")" \
  || { fail "client mode"; show "$WORK/cli.err"; }
grep -q "^accepted $CIP:[0-9]*: SMC-R" "$WORK/srv.err" && ok "listener mode: $(grep -m1 '^accepted' "$WORK/srv.err")" \
  || { fail "listener mode"; show "$WORK/srv.err"; }
python3 -c "import sys; b=int(sys.argv[1]); t=float(sys.argv[3])-float(sys.argv[2]); print(f'info: {b>>20} MiB each way in {t:.1f} s ({b/t/1e6:.0f} MB/s each way, including process start and hashing)')" "$BYTES" "$t0" "$t1"

if [ "$FAILS" -gt 0 ]; then echo "smc-two-procs: $FAILS check(s) failed"; exit 1; fi
echo "smc-two-procs: all checks passed"
