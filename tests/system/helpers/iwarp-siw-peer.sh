#!/usr/bin/env bash
# PEER_CMD of tests/system/iwarp-siw.sh: our iWARP tools (rping, and perftest's rdma_cm
# mode: send_bw_cm, write_bw_cm, read_bw_cm) against Linux siw in the kernel-peer VM, in
# the role the harness gives ($KPEER_ROLE) for $KPEER_TOOL.
# IWARP_ARGS: extra MPA options (--p2p --rtr ... --crc --mpa-rev 1 ...); IWARP_ARGS_<N>
# overrides them for the harness's step N ($KPEER_STEP_INDEX: a tool listed N-th in
# VERBS_TOOLS), so that one VM run can try several MPA configurations.
set -uo pipefail
BIN=${BIN:-target/release}
v=IWARP_ARGS_${KPEER_STEP_INDEX:-0}
IWARP_ARGS=${!v-${IWARP_ARGS:-}}
echo "== step ${KPEER_STEP_INDEX:-?} $KPEER_TOOL as $KPEER_ROLE, MPA options: ${IWARP_ARGS:-(defaults)}"
case "$KPEER_TOOL" in
rping)
	if [ "$KPEER_ROLE" = client ]; then
		# The VM reports "ready" when port 7174 listens; right after the previous rping the
		# closing listener of that one may still be what it sees: retry refused connects
		# for a while, as the VM's own clients do.
		for i in $(seq 40); do
			# shellcheck disable=SC2086
			"$BIN/smc" rdma rping --provider iwarp -c -a "$KPEER_PEER_IP" -I "$KPEER_LOCAL_IP" \
				-p "$KPEER_PORT" -C "$KPEER_ITERS" -S "$KPEER_SIZE" -V --timeout 60 ${IWARP_ARGS:-} \
				>"$KPEER_LOGDIR/rping.out" 2>&1
			rc=$?
			if [ $rc -ne 0 ] && grep -q 'Connection refused' "$KPEER_LOGDIR/rping.out" && [ "$i" -lt 40 ]; then
				sleep 0.5
				continue
			fi
			[ "$i" -gt 1 ] && echo "(connected after $((i - 1)) refused attempts)"
			cat "$KPEER_LOGDIR/rping.out"
			exit $rc
		done
	else
		# shellcheck disable=SC2086
		exec "$BIN/smc" rdma rping --provider iwarp -s -a "$KPEER_LOCAL_IP" \
			-p "$KPEER_PORT" -C "$KPEER_ITERS" -S "$KPEER_SIZE" -V --timeout 60 ${IWARP_ARGS:-}
	fi
	;;
send_bw_cm | write_bw_cm | read_bw_cm)
	# perftest's ib_<verb>_bw -R; our side dumps the data as it saw it, for the capture
	# check (tests/system/helpers/perftest_cm_check.py).
	verb=${KPEER_TOOL%_bw_cm}
	dump="$KPEER_LOGDIR/${KPEER_TOOL}-${KPEER_STEP_INDEX:-0}-$KPEER_ROLE.bin"
	if [ "$KPEER_ROLE" = client ]; then
		# shellcheck disable=SC2086
		exec "$BIN/smc" rdma perftest --provider iwarp --verb "$verb" -p "$KPEER_PORT" \
			-n "$KPEER_ITERS" -s "$KPEER_SIZE" --local "$KPEER_LOCAL_IP" --dump "$dump" \
			--timeout 60 ${IWARP_ARGS:-} "$KPEER_PEER_IP"
	else
		# shellcheck disable=SC2086
		exec "$BIN/smc" rdma perftest --provider iwarp --verb "$verb" -p "$KPEER_PORT" \
			-n "$KPEER_ITERS" -s "$KPEER_SIZE" --bind "$KPEER_LOCAL_IP" --dump "$dump" \
			--timeout 60 ${IWARP_ARGS:-}
	fi
	;;
*)
	echo "iwarp-siw-peer.sh: tool $KPEER_TOOL not supported" >&2
	exit 2
	;;
esac
