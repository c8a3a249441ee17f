#!/usr/bin/env bash
# System test: the software RoCEv2 RNIC over a lossy, reordering, duplicating link (issue 3,
# "Faults"). Two network namespaces joined by a veth pair; on both veth ends
#   - tc netem: loss 5%, reorder 3% (with 1 ms delay), duplicate 1%, when the kernel has
#     sch_netem;
#   - otherwise an equivalent built from what this kernel has: nftables `numgen random`
#     drops 5% and `dup to` duplicates 1% of the RoCEv2 packets (both directions, requests
#     and ACKs alike), and an HTB class with a slow rate delays every packet whose PSN is 7
#     mod 32 (tc u32 on the BTH), so later packets overtake it (reordering).
# The script says which one ran, and requires the impairment counters to be non-zero.
# Then `smc rdma transfer` moves ROCE_NETEM_WRITE (256M) bytes with RDMA WRITE and
# ROCE_NETEM_SEND (64M) bytes with SEND; both ends hash both streams with SHA-256 and must
# agree, and the run must end within ROCE_NETEM_TIMEOUT (240) seconds.
# Exit 0 pass, 77 skip (with the reason), anything else fail.
set -u
cd "$(dirname "$0")/../.." || exit 1
BIN=${BIN:-target/release}
# Loss, duplication and reordering are applied per packet: without UDP GSO (on by default)
# the RNIC hands the kernel single RoCEv2 packets, not trains that netfilter would drop whole.
export SMC_RS_SOFTROCE_GSO=0
WRITE=${ROCE_NETEM_WRITE:-256M}
SEND=${ROCE_NETEM_SEND:-64M}
LIMIT=${ROCE_NETEM_TIMEOUT:-240}
ACKTO=${ROCE_NETEM_ACK_TIMEOUT:-}
skip() {
	echo "SKIP roce-netem: $*"
	exit 77
}
fail() {
	echo "FAIL roce-netem: $*"
	keep=1
	exit 1
}
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, tc, nftables)"
command -v tc >/dev/null || skip "tc is not installed (iproute2)"
smc=$(realpath "$BIN/smc" 2>/dev/null) || fail "$BIN/smc is not built"
[ -x "$smc" ] || fail "$BIN/smc is not built"
"$smc" rdma info >/dev/null 2>&1 || skip "$BIN/smc was built without an RDMA provider (smc-cli feature softroce)"

a=roce-ne-a-$$ b=roce-ne-b-$$
tmp=$(mktemp -d /tmp/roce-netem.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
	ip netns del "$a" 2>/dev/null
	ip netns del "$b" 2>/dev/null
	if [ "${keep:-0}" = 1 ]; then echo "artefacts kept in $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
ip netns add "$a" || skip "cannot create network namespaces"
ip netns add "$b"
ip -n "$a" link add va type veth peer name vb netns "$b" || skip "cannot create a veth pair"
ip -n "$a" addr add 10.45.0.1/24 dev va
ip -n "$b" addr add 10.45.0.2/24 dev vb
for n in "$a" "$b"; do ip -n "$n" link set lo up; done
ip -n "$a" link set va mtu "${ROCE_NETEM_MTU:-1500}" up
ip -n "$b" link set vb mtu "${ROCE_NETEM_MTU:-1500}" up

impair=
if tc -n "$a" qdisc add dev va root netem loss 5% reorder 3% 50% duplicate 1% delay 1ms 2>"$tmp/netem.err" &&
	tc -n "$b" qdisc add dev vb root netem loss 5% reorder 3% 50% duplicate 1% delay 1ms 2>>"$tmp/netem.err"; then
	impair=netem
	echo "roce-netem: impairment: tc netem loss 5% reorder 3% 50% duplicate 1% delay 1ms on both veth ends"
else
	echo "roce-netem: tc netem is not available here ($(head -c 200 "$tmp/netem.err" | tr '\n' ' '))"
	command -v nft >/dev/null || skip "neither sch_netem nor nftables (nft) is available"
	for side in "$a:va:10.45.0.2" "$b:vb:10.45.0.1"; do
		IFS=: read -r n dev peer <<<"$side"
		# Drops happen on the receiving side (prerouting of the packet's own veth): a drop
		# in the sender's output path would fail its sendmsg() with EPERM instead of
		# losing the packet silently. Duplicates are made on the sending side.
		ip netns exec "$n" nft -f - <<-NFT || skip "nftables numgen/dup rules are not supported by this kernel"
			table ip roce_chaos {
				chain in {
					type filter hook prerouting priority -300; policy accept;
					iifname "$dev" udp dport 4791 numgen random mod 1000 < 50 counter drop
				}
				chain out {
					type filter hook output priority 0; policy accept;
					udp dport 4791 numgen random mod 1000 < 10 counter dup to $peer device "$dev"
				}
			}
		NFT
		tc -n "$n" qdisc add dev "$dev" root handle 1: htb default 10 &&
			tc -n "$n" class add dev "$dev" parent 1: classid 1:10 htb rate 10gbit quantum 200000 &&
			tc -n "$n" class add dev "$dev" parent 1: classid 1:20 htb rate 200mbit ceil 200mbit burst 2k cburst 2k quantum 1514 &&
			tc -n "$n" filter add dev "$dev" parent 1: protocol ip prio 1 u32 \
				match ip protocol 17 0xff match ip dport 4791 0xffff \
				match u32 0x00000007 0x0000001f at 36 flowid 1:20 ||
			skip "cannot set up the HTB/u32 reordering classes"
	done
	impair=nftables
	echo "roce-netem: impairment: nftables numgen random drop 5% + dup to 1% (RoCEv2, both directions)," \
		"HTB/u32 delay of every packet with PSN = 7 mod 32 (reordering); sch_netem is missing"
fi

# Local ACK timeout 4.096 us x 2^N: 10 (4 ms) on the bare veth, 12 (17 ms) with netem's 1 ms
# delay each way; tail losses are recovered by this timer (ibv_rc_pingpong's 14 = 67 ms
# makes the run ~10x slower).
[ -n "$ACKTO" ] || { [ "$impair" = netem ] && ACKTO=12 || ACKTO=10; }
t0=$(date +%s)
ip netns exec "$b" timeout "$LIMIT" "$smc" rdma transfer --listen 10.45.0.2:18600 --timeout "$LIMIT" --ack-timeout "$ACKTO" >"$tmp/server.log" 2>&1 &
spid=$!
pids+=("$spid")
ip netns exec "$a" timeout "$LIMIT" "$smc" rdma transfer --connect 10.45.0.2:18600 \
	--write-bytes "$WRITE" --send-bytes "$SEND" --timeout "$LIMIT" --ack-timeout "$ACKTO" >"$tmp/client.log" 2>&1
crc=$?
wait "$spid"
src=$?
pids=()
secs=$(($(date +%s) - t0))
echo "-- client (10.45.0.1)"
cat "$tmp/client.log"
echo "-- server (10.45.0.2)"
cat "$tmp/server.log"
echo "roce-netem: transfer took $secs s (client exit $crc, server exit $src)"

if [ "$impair" = nftables ]; then
	total_drop=0 total_dup=0 total_slow=0
	for n in "$a" "$b"; do
		d=$(ip netns exec "$n" nft list table ip roce_chaos | awk '/drop/ {for (i=1;i<=NF;i++) if ($i=="packets") print $(i+1)}')
		u=$(ip netns exec "$n" nft list table ip roce_chaos | awk '/dup to/ {for (i=1;i<=NF;i++) if ($i=="packets") print $(i+1)}')
		dev=va; [ "$n" = "$b" ] && dev=vb
		s=$(tc -n "$n" -s class show dev "$dev" classid 1:20 | awk '/Sent/ {print $4; exit}')
		total_drop=$((total_drop + ${d:-0})) total_dup=$((total_dup + ${u:-0})) total_slow=$((total_slow + ${s:-0}))
	done
	echo "roce-netem: impairment counters: $total_drop packets dropped, $total_dup duplicated, $total_slow delayed for reordering"
	[ "$total_drop" -gt 0 ] && [ "$total_dup" -gt 0 ] && [ "$total_slow" -gt 0 ] ||
		fail "the impairment did not act (counters above)"
else
	tc -n "$a" -s qdisc show dev va | sed 's/^/  va: /'
	tc -n "$b" -s qdisc show dev vb | sed 's/^/  vb: /'
fi

[ $crc = 0 ] && [ $src = 0 ] || fail "transfer failed (client $crc, server $src; 124 = timed out after $LIMIT s)"
cw=$(awk '/^WRITE/ {print $4}' "$tmp/client.log") sw=$(awk '/^WRITE/ {print $4}' "$tmp/server.log")
cs=$(awk '/^SEND/ {print $4}' "$tmp/client.log") ss=$(awk '/^SEND/ {print $4}' "$tmp/server.log")
[ -n "$cw" ] && [ "$cw" = "$sw" ] && [ -n "$cs" ] && [ "$cs" = "$ss" ] ||
	fail "SHA-256 differ: WRITE $cw / $sw, SEND $cs / $ss"
echo "roce-netem: passed ($impair): $WRITE by RDMA WRITE and $SEND by SEND intact (SHA-256 equal on both ends) in $secs s"
