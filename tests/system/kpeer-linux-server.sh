#!/usr/bin/env bash
# System test (issue 6): our `smc connect` → the Linux 6.12 kernel's SMC-R server, in QEMU
# (tests/kernel-peer/run.sh smc-server), over our software RNIC ↔ Linux rxe, SMC-Rv2.
#   run 1 (PLAN=reuse): three 1 MiB echoes in one process — first contact, then two
#     subsequent contacts on the same link group (CONFIRM RKEY / DELETE RKEY) — idle 7 s
#     after the first and the last, with our TEST LINK requests answered by the kernel,
#     then 100 MiB echoed from a second process; all verified by SHA-256 here and byte for
#     byte by the kernel; the SMC-R TCP option in SYN and SYN-ACK (CHECK_OPTION=1) through
#     the eBPF program; smc_diag SMCR on every kernel connection; no kernel protocol
#     violation; every RoCEv2 ICRC right; orderly close (and DELETE LINK at our exit).
#   SCEN=srvhalf, abort, urg with smc-kpeer-scen (close flows, resets both ways, urgent data).
#   run 2 (SCEN=decline): the kernel has another User EID, declines (CLC Decline on the
#     wire, smc_diag shows its decline reason) and both sides carry on as TCP.
# Exit 0 pass, 77 skip (with the reason) when this machine cannot run VMs, else fail.
# About 1.5 min under TCG with a warm cache.
set -u
cd "$(dirname "$0")/../.." || exit 1
TEST_NAME=kpeer-linux-server
. tests/system/lib/kpeer-linux.bash
kpeer_linux_prepare

# Our keepalive (3 s) is shorter than the kernel's smcr_testlink_time (5 s), so here our
# TEST LINK requests go out while idle and the kernel must answer each one (a link's
# timer restarts on anything received, so only the shorter one ever fires; the kernel's
# own request is checked in kpeer-linux-client.sh with CHECK_TESTLINK=1).
kpeer_run reuse smc-server PLAN=reuse CHECK_OPTION=1 \
  SMC_RS_KEEPALIVE_MS=3000 HOLD_MS=7000 BIG=100M
census=$KP_OUT/reuse/decode/census.json
if [ -f "$census" ] && python3 - "$census" <<'PY'
import json, sys
t = json.load(open(sys.argv[1])).get("testlink", {}).get("10.44.0.3>10.44.0.1", {})
print(f"   TEST LINK from us: {t.get('requests', 0)} request(s), {t.get('answered', 0)} answered by the kernel")
sys.exit(0 if t.get("requests", 0) >= 2 and t.get("answered") == t.get("requests") else 1)
PY
then echo "ok: our TEST LINK requests while idle, each answered by the kernel"
else FAILS=$((FAILS + 1)); echo "FAIL: our TEST LINK requests were not all answered (or none sent)"; fi
# Close flows (smc-kpeer-scen follows the kernel's scenario script): the server half-closes
# first, then the client sends more; close with unread data sends abnormal close and the
# peer sees a reset, in both directions; urgent data (RFC 7609 §4.7.5) each way.
kpeer_run srvhalf smc-server SCEN=srvhalf PLAN=scen
kpeer_run abort smc-server SCEN=abort PLAN=scen
kpeer_run urg smc-server SCEN=urg PLAN=scen
kpeer_run decline smc-server SCEN=decline PLAN=decline CHECK_OPTION=1

if [ "$FAILS" -gt 0 ]; then echo "$TEST_NAME: $FAILS run(s) failed"; exit 1; fi
echo "$TEST_NAME: all checks passed"
