#!/usr/bin/env bash
# System test: the parts of the kernel-peer harness that judge a run (RoCEv2
# ICRC checker, tshark decoder with our SMC-Rv2 LLC dissector, verdict logic,
# data pattern), checked against real Linux captures in tests/fixtures/pcaps.
# No VM, no root, a few seconds. Exit 0 pass, 77 skip, else fail.
set -u
cd "$(dirname "$0")/../.." || exit 1
if ! command -v tshark >/dev/null 2>&1; then
	echo "SKIP kpeer-offline: tshark is not installed (scripts/setup.sh installs it)"
	exit 77
fi
exec python3 -m unittest discover -s tests/kernel-peer/selftest -p 'test_*.py'
