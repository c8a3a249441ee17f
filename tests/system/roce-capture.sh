#!/usr/bin/env bash
# System test: external checks of what the software RoCEv2 RNIC puts on the wire (issue 3,
# "External checks"). In a private network namespace (its own loopback, so no other traffic),
# `smc rdma selftest --all-opcodes` runs every opcode softroce sends between 127.0.0.1 and
# 127.0.0.2 while tcpdump captures UDP 4791; then tests/system/roce_check.py requires that
#   - tshark decodes every packet as RoCE (RRoCE) with no malformed packet, and with the
#     same BTH opcode as scapy;
#   - scapy's RoCE layer (scapy.contrib.roce, not our code) computes the ICRC found in every
#     packet;
#   - every packet kind occurs: SEND First/Middle/Last/Only, SEND Only with immediate, RDMA
#     WRITE First/Middle/Last and Last with immediate, RDMA READ request and response
#     First/Middle/Last, compare-and-swap, fetch-and-add, atomic ACK, ACK, RNR NAK, NAK
#     remote access error.
# The checker itself must reject the same capture with one byte of a payload flipped.
# Exit 0 pass, 77 skip (with the reason), anything else fail. A few seconds.
set -u
cd "$(dirname "$0")/../.." || exit 1
BIN=${BIN:-target/release}
skip() {
	echo "SKIP roce-capture: $*"
	exit 77
}
fail() {
	echo "FAIL roce-capture: $*"
	exit 1
}
[ "$(id -u)" = 0 ] || skip "needs root (network namespace, capture)"
command -v tcpdump >/dev/null || skip "tcpdump is not installed (scripts/setup.sh installs it)"
command -v tshark >/dev/null || skip "tshark is not installed (scripts/setup.sh installs it)"
python3 -c 'import scapy.contrib.roce' 2>/dev/null || skip "python3 scapy is not installed (scripts/setup.sh: pip install scapy)"
smc=$(realpath "$BIN/smc" 2>/dev/null) || fail "$BIN/smc is not built"
[ -x "$smc" ] || fail "$BIN/smc is not built"
"$smc" rdma info >/dev/null 2>&1 || skip "$BIN/smc was built without an RDMA provider (smc-cli feature softroce)"

ns=roce-cap-$$
tmp=$(mktemp -d /tmp/roce-capture.XXXXXX)
tcpdump_pid=
cleanup() {
	[ -n "$tcpdump_pid" ] && kill "$tcpdump_pid" 2>/dev/null && wait "$tcpdump_pid" 2>/dev/null
	ip netns del "$ns" 2>/dev/null
	if [ "${keep:-0}" = 1 ]; then echo "artefacts kept in $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
ip netns add "$ns" || skip "cannot create network namespaces"
ip -n "$ns" link set lo up
ip -n "$ns" addr add 127.0.0.2/8 dev lo 2>/dev/null # usually implied by 127.0.0.1/8

ip netns exec "$ns" tcpdump -i lo --immediate-mode -U -s 0 -w "$tmp/selftest.pcap" 'udp port 4791' 2>"$tmp/tcpdump.log" &
tcpdump_pid=$!
for _ in $(seq 50); do grep -q "listening on" "$tmp/tcpdump.log" && break; sleep 0.1; done
grep -q "listening on" "$tmp/tcpdump.log" || fail "tcpdump did not start: $(cat "$tmp/tcpdump.log")"

# One datagram per packet (SMC_RS_SOFTROCE_GSO=0): with UDP GSO, softroce's default, a
# capture on lo sees each train of packets as one GSO super-packet, which no dissector
# splits. (GSO segments on a real wire: crates/softroce/tests/gso_wire.rs.)
if ! SMC_RS_SOFTROCE_GSO=0 ip netns exec "$ns" timeout 60 "$smc" rdma selftest --all-opcodes >"$tmp/selftest.log" 2>&1; then
	cat "$tmp/selftest.log"
	keep=1
	fail "smc rdma selftest failed"
fi
cat "$tmp/selftest.log"
sleep 1
kill -INT "$tcpdump_pid"
wait "$tcpdump_pid" 2>/dev/null
tcpdump_pid=

expect=SEND_FIRST,SEND_MIDDLE,SEND_LAST,SEND_ONLY,SEND_ONLY_WITH_IMMEDIATE
expect=$expect,RDMA_WRITE_FIRST,RDMA_WRITE_MIDDLE,RDMA_WRITE_LAST,RDMA_WRITE_LAST_WITH_IMMEDIATE
expect=$expect,RDMA_READ_REQUEST,RDMA_READ_RESPONSE_FIRST,RDMA_READ_RESPONSE_MIDDLE,RDMA_READ_RESPONSE_LAST
expect=$expect,COMPARE_SWAP,FETCH_ADD,ATOMIC_ACKNOWLEDGE,ACKNOWLEDGE,ACK,RNR_NAK,NAK_REMOTE_ACCESS
if ! python3 tests/system/roce_check.py "$tmp/selftest.pcap" --expect "$expect" --min-packets 20; then
	keep=1
	fail "the capture did not pass the external checks"
fi

# The checker must be able to fail: flip one payload byte of the first RoCEv2 packet.
python3 - "$tmp/selftest.pcap" "$tmp/corrupt.pcap" <<'PY' || fail "could not build the corrupted capture"
import sys
from scapy.all import rdpcap, wrpcap, UDP
pkts = list(rdpcap(sys.argv[1]))
for i, p in enumerate(pkts):
    if UDP in p and p[UDP].dport == 4791:
        b = bytearray(bytes(p))
        b[len(b) - 8] ^= 0x01  # inside the payload, before the ICRC
        p2 = p.__class__(bytes(b))
        p2.time = p.time
        pkts[i] = p2
        break
wrpcap(sys.argv[2], pkts)
PY
if python3 tests/system/roce_check.py "$tmp/corrupt.pcap" --expect "$expect" >"$tmp/corrupt.log" 2>&1; then
	cat "$tmp/corrupt.log"
	fail "the checker accepted a capture with a corrupted packet"
fi
why=$(grep -m1 "ICRC" "$tmp/corrupt.log") || fail "the checker rejected the corrupted capture for another reason"
echo "roce-capture: the checker rejects a capture with one flipped byte, as it must (${why#FAIL })"
echo "roce-capture: passed"
