#!/usr/bin/env bash
# PEER_CMD of roce-rxe-interop.sh: runs inside the kernel-peer harness's namespace (our
# address $KPEER_LOCAL_IP, the VM at $KPEER_PEER_IP) once per verbs tool, and maps the VM's
# tool to ours: pingpong (ibv_rc_pingpong) -> smc rdma pingpong, write_bw (ib_write_bw) ->
# smc rdma write-test, send_bw (ib_send_bw) -> smc rdma write-test --verb send, in the role the harness asks for ($KPEER_ROLE). Our exit status is the
# harness's verdict for this step.
set -u
smc=${SMC_BIN:?SMC_BIN must name the smc binary}
role=${KPEER_ROLE:?} tool=${KPEER_TOOL:?} iters=${KPEER_ITERS:?} size=${KPEER_SIZE:?}
port=${KPEER_PORT:-18515}
echo "roce-rxe-peer: $tool as $role, $iters x $size bytes, VM $KPEER_PEER_IP"
case $tool:$role in
pingpong:client)
	"$smc" rdma pingpong "$KPEER_PEER_IP" -p "$port" -n "$iters" -s "$size" --timeout 60 ;;
pingpong:server)
	# ibv_rc_pingpong as client mirrors our replies back: answer with fresh data each time.
	"$smc" rdma pingpong --bind "$KPEER_LOCAL_IP" -p "$port" -n "$iters" -s "$size" \
		--reply fresh --timeout 60 ;;
write_bw:client)
	# ib_write_bw's QP refuses RDMA READ, so no read-back: the last message is dumped and
	# compared with the capture by roce-rxe-interop.sh.
	"$smc" rdma write-test "$KPEER_PEER_IP" -p "$port" -n "$iters" -s "$size" --timeout 60 \
		--dump "$KPEER_LOGDIR/write_bw-client.bin" ;;
write_bw:server)
	"$smc" rdma write-test --bind "$KPEER_LOCAL_IP" -p "$port" -n "$iters" -s "$size" --timeout 60 \
		--dump "$KPEER_LOGDIR/write_bw-server.bin" ;;
send_bw:client)
	"$smc" rdma write-test --verb send "$KPEER_PEER_IP" -p "$port" -n "$iters" -s "$size" \
		--timeout 60 --dump "$KPEER_LOGDIR/send_bw-client.bin" ;;
send_bw:server)
	"$smc" rdma write-test --verb send --bind "$KPEER_LOCAL_IP" -p "$port" -n "$iters" \
		-s "$size" --timeout 60 --dump "$KPEER_LOGDIR/send_bw-server.bin" ;;
*)
	echo "roce-rxe-peer: no tool of ours for $tool as $role" >&2
	exit 2 ;;
esac
rc=$?
# UDP counters of this namespace: receive-buffer overflows would explain retransmissions.
awk '/^Udp:/ { n++; if (n == 1) { split($0, h); next } for (i = 2; i <= NF; i++) printf "%s=%s ", h[i], $i; print "" }' /proc/net/snmp |
	sed 's/^/roce-rxe-peer: udp counters: /'
exit $rc
