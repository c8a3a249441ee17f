#!/usr/bin/env bash
# System test (issue 6): the Linux 6.12 kernel's SMC-R client → our `smc listen --echo`, in
# QEMU (tests/kernel-peer/run.sh smc-client), over Linux rxe ↔ our software RNIC, SMC-Rv2.
#   run 1: the kernel connects three times (1 MiB, 100 MiB, 1 MiB echoed and checked byte
#     for byte by the kernel): first contact, then two subsequent contacts on the same link
#     group; the link group then idles 8 s and the kernel's TEST LINK is answered
#     (CHECK_TESTLINK=1); the SMC-R TCP option in SYN and our SYN-ACK (CHECK_OPTION=1);
#     smc_diag SMCR on every kernel connection; no kernel protocol violation; every RoCEv2
#     ICRC right; orderly close; then the kernel unloads smc (TEARDOWN=rmmod), which sends
#     DELETE LINK (ALL): our listener answers and ends the link group.
#   run 2 (SCEN=big): 16 MiB echoed with 1 MiB RMBs on the kernel side.
#   SCEN=srvhalf, abort, urg with smc-kpeer-scen (close flows, resets both ways, urgent data).
#   run 3 (SCEN=decline): our server has another User EID, sends the CLC Decline, the
#     kernel records PEERDECL and both sides carry on as TCP (the echo is still checked).
# Exit 0 pass, 77 skip (with the reason) when this machine cannot run VMs, else fail.
# About 2 min under TCG with a warm cache.
set -u
cd "$(dirname "$0")/../.." || exit 1
TEST_NAME=kpeer-linux-client
. tests/system/lib/kpeer-linux.bash
kpeer_linux_prepare

kpeer_run reuse smc-client PLAN=serve SIZES=1M,100M,1M IDLE=8 TEARDOWN=rmmod CHECK_TESTLINK=1 CHECK_OPTION=1 \
  SMC_RS_KEEPALIVE_MS=30000
# SCEN=big: the kernel client with 1 MiB socket buffers (1 MiB RMBs) echoes 16 MiB: the
# kernel writes hundreds of KiB per RDMA WRITE into our RMB and we fill its 1 MiB RMB.
kpeer_run big smc-client SCEN=big PLAN=serve
# Close flows (smc-kpeer-scen follows the kernel's scenario script): the server half-closes
# first, then the client sends more; close with unread data sends abnormal close and the
# peer sees a reset, in both directions; urgent data (RFC 7609 §4.7.5) each way.
kpeer_run srvhalf smc-client SCEN=srvhalf PLAN=scen
kpeer_run abort smc-client SCEN=abort PLAN=scen
kpeer_run urg smc-client SCEN=urg PLAN=scen
kpeer_run decline smc-client SCEN=decline PLAN=serve PEER_EXPECT=decline CHECK_OPTION=1

if [ "$FAILS" -gt 0 ]; then echo "$TEST_NAME: $FAILS run(s) failed"; exit 1; fi
echo "$TEST_NAME: all checks passed"
