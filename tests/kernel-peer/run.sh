#!/usr/bin/env bash
# Linux kernel peer for smc-rs: boots Debian's Linux 6.12 in QEMU, with the
# kernel's own SMC-R over Soft-RoCE (rdma_rxe), on a bridge in a private
# network namespace, and runs an SMC-R or RDMA verbs scenario against a second
# kernel VM or against PEER_CMD (our implementation) in the namespace.
#
#   tests/kernel-peer/run.sh MODE [KEY=VALUE ...]
#   tests/kernel-peer/run.sh --help
#
# MODE: smc-pair smc-server smc-client verbs-pair verbs-server verbs-client
#       prepare (download + build only)
# Every knob is an environment variable; KEY=VALUE arguments set them too.
# tests/kernel-peer/README.md documents modes, knobs, PEER_CMD's environment,
# the result lines and the exit codes (0 pass, 1 checks failed, 2 usage,
# 3 harness/VM failure, 4 cannot run on this machine).
set -euo pipefail

KPEER_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$KPEER_DIR/../.." && pwd)

usage() {
	sed -n '/^## Quick reference/,/^## /p' "$KPEER_DIR/README.md" | sed '$d'
	exit "${1:-0}"
}

case "${1:-}" in
-h | --help | help | "") usage 0 ;;
esac
MODE=$1
shift
for kv in "$@"; do
	case "$kv" in
	[A-Z]*=*) export "${kv%%=*}=${kv#*=}" ;;
	*)
		echo "run.sh: arguments must be KEY=VALUE (got '$kv'); see --help" >&2
		exit 2
		;;
	esac
done

# shellcheck source=lib/common.sh
. "$KPEER_DIR/lib/common.sh"
# shellcheck source=lib/fetch.sh
. "$KPEER_DIR/lib/fetch.sh"
# shellcheck source=lib/image.sh
. "$KPEER_DIR/lib/image.sh"
# shellcheck source=lib/vm.sh
. "$KPEER_DIR/lib/vm.sh"

# ------------------------------------------------------------------ knobs
: "${KPEER_CACHE:=/var/cache/smc-rs-kpeer}"
: "${OUT:=/tmp/smc-rs-kpeer/$MODE-$(date +%Y%m%d-%H%M%S)-$$}"
: "${ACCEL:=auto}" "${KPKG:=}" "${VM_MEM:=512}" "${VM_TIMEOUT:=900}" "${KERNEL_APPEND:=}"
: "${CAPTURE:=1}" "${SNAPLEN:=0}" "${DECODE:=1}" "${NO_INSTALL:=0}"
# Our side sends with UDP GSO (softroce's default) and the capture on br0 is still
# checked packet by packet: the bridge takes its offloads from its ports, the taps have no
# UDP segmentation offload, so br0 splits each train before tcpdump sees it (and rxe gets
# the segments). Should a tap ever offer it, run with SMC_RS_SOFTROCE_GSO=0.
: "${PEER_CMD:=}" "${PEER_TIMEOUT:=600}" "${PEER_GRACE:=5}" "${PEER_MUST_EXIT:=0}"
: "${PEER_VM:=0}" "${PEER_FILES:=}" "${HOST_CMD:=}" "${LINKS:=1}"
: "${PORT:=5000}" "${SCEN:=echo}" "${SIZES:=}" "${CONNS:=}" "${HOLD:=0}" "${IDLE:=0}"
: "${BUFSIZE:=}" "${UEID:=SMC-RS-KPEER}" "${SERVER_UEID:=}" "${CLIENT_UEID:=}" "${PEER_UEID:=}"
: "${SYSCTLS=net.smc.smcr_testlink_time=5}" "${TEARDOWN:=none}" "${EXPECT:=}"
: "${CHECK_TESTLINK:=0}" "${CHECK_OPTION:=0}" "${IOTIMEOUT:=30}" "${DMESG_FAIL:=}"
: "${VERBS_ITERS:=100}" "${VERBS_SIZE:=}"
: "${VERBS_TIMEOUT:=60}" "${VERBS_ARGS:=}" "${VERBS_CHK:=1}" "${VERBS_PORT:=18515}"
: "${RDMA_DEV:=rxe}" "${SIW_P2P:=0}" "${SIW_MPA_REV:=2}" "${SIW_CRC:=0}" "${RPING_PORT:=7174}"
INFRA_ERRORS=""

case "$MODE" in
smc-pair | smc-server | smc-client | verbs-pair | verbs-server | verbs-client | prepare) ;;
peer-host) PEER_VM=1 ;;
*)
	echo "run.sh: unknown mode '$MODE'; see --help" >&2
	exit "$EXIT_USAGE"
	;;
esac

# RDMA_DEV=siw runs the rdma_cm tools (rping, perftest -R) over siw0, the kernel's
# software iWARP, built from the kernel source (README.md, "iWARP: Linux siw")
if [ "${RDMA_DEV:-rxe}" = siw ]; then
	: "${VERBS_TOOLS:=rping,send_bw_cm,write_bw_cm,read_bw_cm}"
else
	: "${VERBS_TOOLS:=pingpong,write_bw,send_bw,send_lat}"
fi

# Scenario presets (README.md, "Scenarios")
case "$SCEN" in
echo | multi | urg | srvhalf | abort) ;;
big)
	SCEN='echo'
	: "${BUFSIZE:=1048576}" "${SIZES:=16M}"
	;;
decline)
	SCEN='echo'
	: "${SIZES:=4096,65536}" "${EXPECT:=decline}"
	# the kernel server's EID differs from everybody else's
	if [ "$MODE" = smc-client ]; then
		: "${PEER_UEID:=SMC-RS-OTHER}"
	else
		: "${SERVER_UEID:=SMC-RS-OTHER}"
	fi
	;;
*) die "$EXIT_USAGE" "unknown SCEN '$SCEN' (echo multi urg srvhalf abort big decline)" ;;
esac
: "${SIZES:=4096}" "${BUFSIZE:=0}" "${EXPECT:=smcr}"
: "${SERVER_UEID:=$UEID}" "${CLIENT_UEID:=$UEID}" "${PEER_UEID:=$UEID}"
# connections a scenario makes unless CONNS says otherwise
if [ -n "$CONNS" ]; then
	PLANNED_CONNS=$CONNS
else
	case "$SCEN" in
	echo) PLANNED_CONNS=$(($(tr -cd , <<<"$SIZES" | wc -c) + 1)) ;;
	multi) PLANNED_CONNS=8 ;;
	abort) PLANNED_CONNS=2 ;;
	*) PLANNED_CONNS=1 ;;
	esac
fi

# Values end up in shell-sourced config files and kernel lines: keep them tame
check_value() { # name value ERE
	[[ "$2" =~ ^($3)$ ]] || die "$EXIT_USAGE" "bad $1='$2'"
}
check_value SIZES "$SIZES" '[0-9]+[kKmMgG]?(,[0-9]+[kKmMgG]?)*'
for v in HOLD IDLE BUFSIZE PORT VM_MEM VM_TIMEOUT IOTIMEOUT PEER_TIMEOUT PEER_GRACE \
	VERBS_ITERS VERBS_TIMEOUT VERBS_PORT SNAPLEN RPING_PORT; do
	check_value "$v" "${!v}" '[0-9]+'
done
check_value CONNS "$CONNS" '([1-9][0-9]*)?'
check_value VERBS_SIZE "$VERBS_SIZE" '([1-9][0-9]*)?'
for v in UEID SERVER_UEID CLIENT_UEID PEER_UEID; do
	check_value "$v" "${!v}" '[A-Za-z0-9][A-Za-z0-9.-]{0,31}'
done
check_value SYSCTLS "$SYSCTLS" '([a-z0-9_.]+=[A-Za-z0-9_.-]+( [a-z0-9_.]+=[A-Za-z0-9_.-]+)*)?'
check_value VERBS_TOOLS "$VERBS_TOOLS" '[a-z_]+(,[a-z_]+)*'
check_value VERBS_ARGS "$VERBS_ARGS" '[A-Za-z0-9 =._-]*'
check_value KERNEL_APPEND "$KERNEL_APPEND" '[A-Za-z0-9 =,._/-]*'
check_value TEARDOWN "$TEARDOWN" 'none|rmmod'
check_value EXPECT "$EXPECT" 'smcr|fallback|decline|peernosmc|any'
check_value RDMA_DEV "$RDMA_DEV" 'rxe|siw'
check_value LINKS "$LINKS" '[12]'
check_value SIW_MPA_REV "$SIW_MPA_REV" '[12]'
for v in CAPTURE DECODE NO_INSTALL CHECK_TESTLINK CHECK_OPTION VERBS_CHK PEER_MUST_EXIT SIW_P2P SIW_CRC PEER_VM; do
	check_value "$v" "${!v}" '[01]'
done
for t in ${VERBS_TOOLS//,/ }; do
	if [ "$RDMA_DEV" = siw ]; then
		check_value VERBS_TOOLS "$t" 'rping|send_bw_cm|write_bw_cm|read_bw_cm'
	else
		check_value VERBS_TOOLS "$t" 'pingpong|write_bw|send_bw|read_bw|send_lat|write_lat|read_lat'
	fi
done
case "$MODE" in smc-*) [ "$RDMA_DEV" = rxe ] || die "$EXIT_USAGE" "RDMA_DEV=siw is for the verbs modes" ;; esac
case "$MODE" in
smc-server | smc-client | verbs-server | verbs-client | peer-host)
	[ -n "$PEER_CMD" ] || die "$EXIT_USAGE" "MODE=$MODE needs PEER_CMD (your side of the test)"
	;;
esac
if [ "$PEER_VM" = 1 ]; then
	case "$MODE" in
	smc-server | smc-client | peer-host) ;;
	*) die "$EXIT_USAGE" "PEER_VM=1 works with the modes smc-server, smc-client and peer-host" ;;
	esac
fi
if [ "$LINKS" = 2 ]; then
	case "$MODE" in
	smc-pair | smc-server | smc-client | prepare) ;;
	*) die "$EXIT_USAGE" "LINKS=2 works with the modes smc-pair, smc-server and smc-client" ;;
	esac
	[ "$PEER_VM" = 0 ] || die "$EXIT_USAGE" "LINKS=2 does not work with PEER_VM=1"
fi
[ "$MODE" != peer-host ] || [ -n "$HOST_CMD" ] || die "$EXIT_USAGE" "MODE=peer-host needs HOST_CMD"
[ "$MODE" = peer-host ] || [ -z "$HOST_CMD" ] || die "$EXIT_USAGE" "HOST_CMD is only for MODE=peer-host"

# ------------------------------------------------------------------ setup
[ "$(id -u)" = 0 ] || cannot_run "needs root (network namespaces, taps, apt)"
mkdir -p "$OUT" "$KPEER_CACHE"
log "mode $MODE, output in $OUT"
ensure_host_tools
T0=$(date +%s.%N)
# one harness at a time may download and build into the cache
exec 9>"$KPEER_CACHE/.lock"
flock 9
resolve_kernel
resolve_userland
timing fetch_s "$(elapsed "$T0")"
T0=$(date +%s.%N)
build_image
timing build_s "$(elapsed "$T0")"
flock -u 9
log "kernel $KPKG $KDEBVER ($KVER)"
if [ "$MODE" = prepare ]; then
	log "prepared: $BASE_INITRD"
	exit "$EXIT_PASS"
fi

T0=$(date +%s.%N)
choose_accel
timing accel_probe_s "$(elapsed "$T0")"
setup_net
export_peer_env
start_capture

# What verdict.py needs to know about this run
{
	for v in MODE SCEN SIZES CONNS HOLD IDLE BUFSIZE EXPECT CHECK_TESTLINK CHECK_OPTION TEARDOWN PORT \
		SERVER_UEID CLIENT_UEID PEER_UEID SYSCTLS VERBS_TOOLS VERBS_ITERS VERBS_SIZE \
		CAPTURE DECODE PEER_MUST_EXIT PEER_VM DMESG_FAIL KPKG KDEBVER KVER RDMA_DEV SIW_P2P SIW_MPA_REV SIW_CRC LINKS; do
		printf '%s=%s\n' "$v" "${!v}"
	done
	printf 'ACCEL=%s\nSERVER_IP=%s\nCLIENT_IP=%s\nPEER_IP=%s\nHAS_PEER=%s\n' \
		"$ACCEL_USED" "$SERVER_IP" "$CLIENT_IP" "$PEER_IP" "$([ -n "$PEER_CMD" ] && echo 1 || echo 0)"
	[ "$LINKS" = 1 ] || printf 'SERVER_IP2=%s\nCLIENT_IP2=%s\nPEER_IP2=%s\n' "$SERVER_IP2" "$CLIENT_IP2" "$PEER_IP2"
} >"$OUT/config.env"

# ------------------------------------------------------------------ VMs
smc_conf() { # NAME ROLE IP PEER UEID [IP2]
	local ip2=""
	[ -z "${6:-}" ] || ip2=$6/$NET_PREFIX
	write_conf "$OUT/$1" KP_VM="$1" KP_ROLE="$2" KP_IP="$3/$NET_PREFIX" KP_PEER="$4" KP_IP2="$ip2" \
		KP_PORT="$PORT" KP_SCEN="$SCEN" KP_SIZES="$SIZES" KP_CONNS="$CONNS" KP_HOLD="$HOLD" \
		KP_IDLE="$IDLE" KP_BUFSIZE="$BUFSIZE" KP_UEID="$5" KP_SYSCTLS="$SYSCTLS" \
		KP_TEARDOWN="$TEARDOWN" KP_IOTIMEOUT="$IOTIMEOUT"
}
verbs_conf() { # NAME ROLE IP PEER
	write_conf "$OUT/$1" KP_VM="$1" KP_ROLE="$2" KP_IP="$3/$NET_PREFIX" KP_PEER="$4" \
		KP_VERBS_PORT="$VERBS_PORT" KP_VERBS_ITERS="$VERBS_ITERS" \
		KP_VERBS_TIMEOUT="$VERBS_TIMEOUT" KP_VERBS_ARGS="$VERBS_ARGS" KP_VERBS_CHK="$VERBS_CHK" \
		KP_RDMA="$RDMA_DEV" KP_RPING_PORT="$RPING_PORT"
}
infra() { # note a harness-level failure; the verdict fails on it
	log "FAILED: $*"
	INFRA_ERRORS="$INFRA_ERRORS $(echo "$*" | tr ' ' '-')"
}
vm_gid() { # NAME: the VM's RoCEv2 GID (from its ready line)
	grep -a -m1 '^KPEER ready ' "$OUT/$1/results.log" | sed -n 's/.* gid=\([^ ]*\).*/\1/p'
}
client_finished_or_fail() { # wait for the client VM's result while PEER_CMD (the server) lives
	# A PEER_CMD gone first (its VM crashed, the process died) leaves the kernel client
	# to its I/O timeouts, one per connection still to come, so that waiting for its
	# line could take VM_TIMEOUT: it gets IOTIMEOUT more to report, then the run stops.
	local deadline=$(($(date +%s) + VM_TIMEOUT)) grace=$((IOTIMEOUT + 10))
	while :; do
		vm_wait client 'client-finished' 1 2 && return 0
		# a client VM that died or oopsed is reported by vm_finish (vm-died)
		alive "$(vm_pid client)" || return 1
		vm_oops client >/dev/null && return 1
		if [ "$(date +%s)" -ge "$deadline" ]; then
			infra "client VM did not finish in ${VM_TIMEOUT}s"
			return 1
		fi
		if ! peer_alive; then
			log "PEER_CMD is gone before the client VM finished; waiting ${grace}s more"
			vm_wait client 'client-finished' 1 "$grace" && return 0
			infra "PEER_CMD exited before the client VM finished"
			return 1
		fi
	done
}

ready_or_fail() { # NAME: wait until the VM reports ready
	vm_wait "$1" 'ready ' 1 180 || {
		infra "VM $1 did not get ready (see $OUT/$1/console.log)"
		return 1
	}
	log "VM $1 ready: $(grep -a -m1 '^KPEER ready ' "$OUT/$1/results.log" | cut -d' ' -f3-)"
}

T_VM=$(date +%s.%N)
export KPEER_SCEN=$SCEN KPEER_SIZES=$SIZES KPEER_CONNS=$PLANNED_CONNS KPEER_HOLD=$HOLD KPEER_IDLE=$IDLE
export KPEER_BUFSIZE=$BUFSIZE KPEER_PORT=$PORT KPEER_UEID=$PEER_UEID
# LINKS=2: every VM has eth1/rxe1 at IP2 and PEER_CMD a second address (README, "LINKS=2")
SRV_IP2="" CLI_IP2="" SRV_MAC2="" CLI_MAC2=""
if [ "$LINKS" = 2 ]; then
	SRV_IP2=$SERVER_IP2 CLI_IP2=$CLIENT_IP2 SRV_MAC2=$SERVER_MAC2 CLI_MAC2=$CLIENT_MAC2
	export KPEER_LOCAL_IP2=$PEER_IP2
fi
export KPEER_LINKS=$LINKS

case "$MODE" in
smc-pair)
	smc_conf server smc-server "$SERVER_IP" "" "$SERVER_UEID" "$SRV_IP2"
	smc_conf client smc-client "$CLIENT_IP" "$SERVER_IP" "$CLIENT_UEID" "$CLI_IP2"
	boot_vm server tap0 "$SERVER_MAC" "$SRV_MAC2"
	boot_vm client tap1 "$CLIENT_MAC" "$CLI_MAC2"
	if ready_or_fail server && ready_or_fail client &&
		vm_wait server 'listen ' 1 60 && vm_wait client 'wait-go' 1 60; then
		vm_ctl client go
		if ! vm_wait client 'client-finished' 1 "$VM_TIMEOUT"; then
			# (vm_wait gives up early on a client whose kernel oopsed: vm_finish says so)
			vm_oops client >/dev/null || infra "client VM did not finish in ${VM_TIMEOUT}s"
		fi
		vm_ctl server stop
		vm_finish server
		vm_ctl client stop
		vm_finish client
	else
		infra "VMs did not come up"
		vm_abort client
		vm_abort server
	fi
	;;

smc-server)
	smc_conf server smc-server "$SERVER_IP" "" "$SERVER_UEID" "$SRV_IP2"
	boot_vm server tap0 "$SERVER_MAC" "$SRV_MAC2"
	export KPEER_ROLE=client KPEER_PEER_IP=$SERVER_IP KPEER_KERNEL_UEID=$SERVER_UEID KPEER_KERNEL_VM=server
	[ "$LINKS" = 1 ] || export KPEER_PEER_IP2=$SERVER_IP2
	if ready_or_fail server && vm_wait server 'listen ' 1 60; then
		KPEER_GID=$(vm_gid server)
		export KPEER_GID
		timing vm_ready_s "$(elapsed "$T_VM")"
		start_peer smc-client
		# PEER_CMD is done when it exits or touches $KPEER_DONE_FILE
		deadline=$(($(date +%s) + PEER_TIMEOUT))
		while peer_alive && ! peer_done && ! vm_oops server >/dev/null &&
			[ "$(date +%s)" -lt "$deadline" ]; do
			sleep 0.2
		done
		[ "$(date +%s)" -lt "$deadline" ] || infra "PEER_CMD did not finish in ${PEER_TIMEOUT}s"
		vm_ctl server stop
		vm_finish server
		stop_peer "$PEER_GRACE"
	else
		vm_abort server
	fi
	;;

smc-client)
	smc_conf client smc-client "$CLIENT_IP" "$PEER_IP" "$CLIENT_UEID" "$CLI_IP2"
	export KPEER_ROLE=server KPEER_PEER_IP=$CLIENT_IP KPEER_KERNEL_UEID=$CLIENT_UEID KPEER_KERNEL_VM=client
	[ "$LINKS" = 1 ] || export KPEER_PEER_IP2=$CLIENT_IP2
	start_peer smc-server
	boot_vm client tap1 "$CLIENT_MAC" "$CLI_MAC2"
	wait_ok=1
	# a PEER_CMD in a VM first boots it (up to ~35 s under TCG on a busy machine)
	deadline=$(($(date +%s) + 120 + PEER_VM * 180))
	until peer_listening "$PORT"; do
		if ! peer_alive || [ "$(date +%s)" -ge "$deadline" ]; then
			infra "PEER_CMD is not listening on $PEER_IP:$PORT"
			wait_ok=0
			break
		fi
		sleep 0.2
	done
	if [ "$wait_ok" = 1 ] && ready_or_fail client && vm_wait client 'wait-go' 1 60; then
		timing vm_ready_s "$(elapsed "$T_VM")"
		KPEER_GID=$(vm_gid client)
		export KPEER_GID
		vm_ctl client go
		if client_finished_or_fail; then
			vm_ctl client stop || true
			vm_finish client
		else
			# still inside its connections (it reads its control port after them):
			# stopped at once, what it reported so far is in its results.log
			vm_finish client 10
		fi
	else
		vm_abort client
	fi
	stop_peer "$PEER_GRACE"
	;;

peer-host)
	# PEER_CMD in VM guest (10.44.0.3) and HOST_CMD in the namespace (10.44.0.4), at the
	# same time; each side waits for the other by itself (e.g. a client retries).
	export KPEER_ROLE=guest KPEER_PEER_IP=$HOST_IP KPEER_HOST_IP=$HOST_IP KPEER_GUEST_IP=$PEER_IP
	start_peer guest
	if ready_or_fail guest; then
		timing vm_ready_s "$(elapsed "$T_VM")"
		start_host
		deadline=$(($(date +%s) + PEER_TIMEOUT))
		while { peer_alive || alive "$HOST_PID"; } && [ "$(date +%s)" -lt "$deadline" ]; do
			sleep 0.2
		done
		[ "$(date +%s)" -lt "$deadline" ] || infra "PEER_CMD/HOST_CMD did not finish in ${PEER_TIMEOUT}s"
		stop_host "$PEER_GRACE"
	fi
	stop_peer "$PEER_GRACE"
	;;

verbs-*)
	VMS=""
	if [ "$MODE" != verbs-client ]; then
		verbs_conf server verbs-server "$SERVER_IP" ""
		boot_vm server tap0 "$SERVER_MAC"
		VMS="server"
	fi
	if [ "$MODE" != verbs-server ]; then
		if [ "$MODE" = verbs-client ]; then
			verbs_conf client verbs-client "$CLIENT_IP" "$PEER_IP"
		else
			verbs_conf client verbs-client "$CLIENT_IP" "$SERVER_IP"
		fi
		boot_vm client tap1 "$CLIENT_MAC"
		VMS="$VMS client"
	fi
	up=1
	for v in $VMS; do ready_or_fail "$v" || up=0; done
	# run_in VM TOOL SIZE: hand the VM its next tool (it is idle between tools)
	declare -A SENT=([server]=0 [client]=0)
	run_in() {
		vm_wait "$1" 'wait-cmd' "$((SENT[$1] + 1))" 60 && vm_ctl "$1" "run:$2:$3" &&
			SENT[$1]=$((SENT[$1] + 1))
	}
	if [ "$up" = 1 ]; then
		timing vm_ready_s "$(elapsed "$T_VM")"
		step_index=0
		for tool in ${VERBS_TOOLS//,/ }; do
			# a tool may appear more than once (PEER_CMD can vary its options by
			# $KPEER_STEP_INDEX); each run is its own step "tool@index"
			step_index=$((step_index + 1))
			export KPEER_STEP_INDEX=$step_index
			size=$VERBS_SIZE
			if [ -z "$size" ]; then
				case "$tool" in
				pingpong) size=4096 ;;
				*_bw | *_bw_cm) size=16384 ;;
				*) size=64 ;;
				esac
			fi
			tport=$VERBS_PORT
			[ "$tool" = rping ] && tport=$RPING_PORT
			export KPEER_TOOL=$tool KPEER_ITERS=$VERBS_ITERS KPEER_SIZE=$size KPEER_PORT=$tport
			export KPEER_RDMA_DEV=$RDMA_DEV
			log "verbs tool: $tool, $VERBS_ITERS iterations of $size bytes"
			case "$MODE" in
			verbs-pair)
				if run_in server "$tool" "$size" &&
					vm_wait server "verbs-ready vm=server tool=$tool " 1 60 &&
					run_in client "$tool" "$size"; then
					vm_wait client "verbs vm=client tool=$tool " 1 "$((VERBS_TIMEOUT * 3 + 30))" ||
						infra "client $tool did not finish"
				else
					infra "$tool could not be started"
				fi
				vm_wait server "verbs vm=server tool=$tool " 1 "$((VERBS_TIMEOUT + 30))" ||
					infra "server $tool did not finish"
				;;
			verbs-server)
				export KPEER_ROLE=client KPEER_PEER_IP=$SERVER_IP
				KPEER_GID=$(vm_gid server)
				export KPEER_GID
				if run_in server "$tool" "$size" &&
					vm_wait server "verbs-ready vm=server tool=$tool " 1 60; then
					KPEER_TOOL_CMD=$(grep -a "^KPEER verbs-ready vm=server tool=$tool " "$OUT/server/results.log" |
						sed -n 's/.* cmd=\([^ ]*\).*/\1/p' | tr '+' ' ')
					export KPEER_TOOL_CMD
					start_peer "$tool@$step_index"
					wait_gone "$PEER_PID" "$((VERBS_TIMEOUT + 30))" || infra "PEER_CMD ($tool) timed out"
					stop_peer 0
				else
					infra "server $tool could not be started"
				fi
				vm_wait server "verbs vm=server tool=$tool " 1 "$((VERBS_TIMEOUT + 30))" ||
					infra "server $tool did not finish"
				;;
			verbs-client)
				export KPEER_ROLE=server KPEER_PEER_IP=$CLIENT_IP
				KPEER_GID=$(vm_gid client)
				export KPEER_GID
				start_peer "$tool@$step_index"
				deadline=$(($(date +%s) + 60))
				until peer_listening "$tport" || ! alive "$PEER_PID" || [ "$(date +%s)" -ge "$deadline" ]; do
					sleep 0.1
				done
				if ! peer_listening "$tport"; then
					infra "PEER_CMD ($tool) is not listening on $PEER_IP:$tport"
				elif run_in client "$tool" "$size"; then
					vm_wait client "verbs vm=client tool=$tool " 1 "$((VERBS_TIMEOUT * 3 + 30))" ||
						infra "client $tool did not finish"
				fi
				stop_peer "$((VERBS_TIMEOUT / 2 + 5))"
				;;
			esac
		done
	fi
	for v in $VMS; do
		if [ "$up" = 1 ] && vm_wait "$v" 'wait-cmd' "$((SENT[$v] + 1))" "$((VERBS_TIMEOUT + 10))"; then
			vm_ctl "$v" stop
			vm_finish "$v"
		else
			vm_abort "$v"
		fi
	done
	;;
esac
timing vm_phase_s "$(elapsed "$T_VM")"
stop_capture

# ------------------------------------------------------------------ verdict
if [ "$CAPTURE" = 1 ] && [ "$DECODE" = 1 ] && [ -s "$OUT/capture.pcap" ]; then
	T0=$(date +%s.%N)
	python3 "$KPEER_DIR/decode/decode.py" "$OUT/capture.pcap" "$OUT/decode" --summary --verbose ||
		infra "decoding the capture failed"
	timing decode_s "$(elapsed "$T0")"
fi
timing total_s "$(elapsed)"
{
	printf 'kernel=%s %s (%s) accel=%s mode=%s\n' "$KPKG" "$KDEBVER" "$KVER" "$ACCEL_USED" "$MODE"
	printf '%s\n' "${TIMINGS[@]}"
} >"$OUT/timings.txt"
printf 'INFRA_ERRORS=%s\n' "$INFRA_ERRORS" >>"$OUT/config.env"
rc=0
python3 "$KPEER_DIR/lib/verdict.py" "$OUT" || rc=$?
if [ -s "$OUT/peer/peer.log" ]; then
	log "last lines of PEER_CMD's output ($OUT/peer/peer.log):"
	tail -n 15 "$OUT/peer/peer.log" | sed 's/^/    /' >&2
fi
log "timings: $(tr '\n' ' ' <"$OUT/timings.txt")"
log "artefacts: $OUT"
exit "$rc"
