#!/usr/bin/env bash
# System test: our software RoCEv2 RNIC against Linux rxe (issue 3, "Interop with Linux rxe").
# The kernel-peer harness (tests/kernel-peer, QEMU + Debian Linux 6.12 + rdma_rxe) runs
#   verbs-server: ibv_rc_pingpong -c, ib_write_bw and ib_send_bw servers in the VM, our
#                 tools as clients;
#   verbs-client: the same tools as clients in the VM, our tools as servers;
# through tests/system/helpers/roce-rxe-peer.sh (smc rdma pingpong / smc rdma write-test
# [--verb send]). Data is verified on our side (see `smc rdma pingpong --help`, `smc rdma write-test --help`) and by
# ibv_rc_pingpong -c in the VM; the harness checks every tool's exit status, every RoCEv2
# ICRC in the capture of the bridge, and the VM's kernel log. perftest checks no data (and
# ib_write_bw's QP refuses RDMA READ), so for write_bw and send_bw every message in the capture is
# counted, ours must carry their pattern streams, and the last one must equal what we sent
# (client) / what arrived in our memory (server) (helpers/write_payload.py).
# Exit 0 pass, 77 skip (with the reason), anything else fail.
#
# Cost: under TCG (no usable KVM) one harness run takes ~25-40 s here, so both runs fit the
# CI budget; SMC_RS_KPEER=0 skips the test, VERBS_ITERS/ROCE_RXE_TOOLS tune it.
set -u
cd "$(dirname "$0")/../.." || exit 1
BIN=${BIN:-target/release}
skip() {
	echo "SKIP roce-rxe-interop: $*"
	exit 77
}
[ "${SMC_RS_KPEER:-1}" = 0 ] && skip "SMC_RS_KPEER=0"
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, tap devices)"
command -v qemu-system-x86_64 >/dev/null 2>&1 || skip "qemu-system-x86_64 is not installed (scripts/setup.sh installs it)"
[ -e /dev/net/tun ] || skip "no /dev/net/tun"
smc=$(realpath "$BIN/smc" 2>/dev/null)
[ -x "$smc" ] || { echo "FAIL roce-rxe-interop: $BIN/smc not built"; exit 1; }
"$smc" rdma selftest --help >/dev/null 2>&1 || { echo "FAIL roce-rxe-interop: $smc has no rdma subcommand"; exit 1; }
"$smc" rdma info >/dev/null 2>&1 || skip "$BIN/smc was built without an RDMA provider (smc-cli feature softroce)"

tools=${ROCE_RXE_TOOLS:-pingpong,write_bw,send_bw}
iters=${VERBS_ITERS:-50}
status=0
for mode in verbs-server verbs-client; do
	out=$(mktemp -d /tmp/roce-rxe.XXXXXX)
	log=$out.log
	t0=$(date +%s)
	SMC_BIN=$smc timeout 900 tests/kernel-peer/run.sh "$mode" VERBS_TOOLS="$tools" \
		VERBS_ITERS="$iters" VERBS_CHK=1 OUT="$out" NO_INSTALL=1 \
		PEER_CMD="bash $PWD/tests/system/helpers/roce-rxe-peer.sh" >"$log" 2>&1
	rc=$?
	echo "-- $mode ($tools, $iters iterations): run.sh exit $rc in $(($(date +%s) - t0)) s"
	grep -E '^(FAIL|WARN|VERDICT)|ICRC|timings:' "$log" | head -n 20
	grep -ahE 'data verified|write-test:|mismatch|error' "$out/peer/peer.log" 2>/dev/null | head -n 10
	# RDMA WRITE data: ib_write_bw verifies nothing and its QP refuses RDMA READ, so the
	# last WRITE message on the wire must equal what we sent (our client) or what landed in
	# our memory (our server: rxe's bytes placed by softroce).
	for tool in write_bw send_bw; do
		[ $rc = 0 ] && [[ ,$tools, == *,$tool,* ]] || continue
		# 16384: the harness's message size for the bandwidth tools (VERBS_SIZE unset)
		opt="--size 16384"; [ $tool = send_bw ] && opt="$opt --send"
		if [ $mode = verbs-server ]; then
			# 0x57420000: the pattern seed of `smc rdma write-test` (writetest.rs SEED)
			wp="10.44.0.3 10.44.0.1 $out/peer/$tool-client.bin --count $iters --pattern 0x57420000"
		else
			wp="10.44.0.2 10.44.0.3 $out/peer/$tool-server.bin --count $iters"
		fi
		# shellcheck disable=SC2086
		python3 tests/system/helpers/write_payload.py "$out/capture.pcap" $wp $opt || rc=1
	done
	case $rc in
	0) rm -rf "$out" "$log" ;;
	4)
		reason=$(grep -m1 'cannot run here' "$log" | sed 's/.*cannot run here: //')
		rm -rf "$out" "$log"
		skip "${reason:-the kernel-peer harness cannot run on this machine}"
		;;
	*)
		echo "roce-rxe-interop: $mode FAILED; harness output:"
		tail -n 40 "$log"
		echo "peer log:"
		tail -n 20 "$out/peer/peer.log" 2>/dev/null
		echo "artefacts kept in $out"
		status=1
		;;
	esac
done
[ $status = 0 ] && echo "roce-rxe-interop: passed ($tools over rxe, both roles)"
exit $status
