# shellcheck shell=bash
# Network namespace, capture, QEMU and the control channel (sourced by run.sh).

# The test wire: one bridge in a private namespace; every VM is a tap on it,
# PEER_CMD runs in the namespace itself (bridge address PEER_IP).
SERVER_IP=10.44.0.1
CLIENT_IP=10.44.0.2
PEER_IP=10.44.0.3
# mode peer-host: HOST_CMD in the namespace (PEER_CMD runs in VM "guest" at PEER_IP)
HOST_IP=10.44.0.4
NET_PREFIX=24
SERVER_MAC=52:54:00:44:00:01
CLIENT_MAC=52:54:00:44:00:02
GUEST_MAC=52:54:00:44:00:03
# LINKS=2: a second NIC per VM (eth1, rxe1, tap "<tap>b") and a second address in the
# namespace, on the same subnet and bridge. Linux's SMC-Rv2 takes an alternate RoCE device
# for a second link only when one of its netdev's addresses shares a subnet with the link
# group's TCP source address (smc_ib_determine_gid: inet_ifa_match on lgr->saddr), so a
# second subnet would only ever give asymmetric link groups.
SERVER_IP2=10.44.0.11
CLIENT_IP2=10.44.0.12
PEER_IP2=10.44.0.13
SERVER_MAC2=52:54:00:44:00:11
CLIENT_MAC2=52:54:00:44:00:12

# Run a command in the namespace. Background processes are started with a
# plain `nsenter ... &` instead, so that $! is the process itself (nsenter
# execs it) and not a subshell that would not pass signals on.
in_ns() { nsenter --net="/run/netns/$NS" -- "$@"; }

setup_net() {
	local t
	NS=kpeer-$$
	[ -e /dev/net/tun ] || modprobe tun 2>/dev/null || true
	[ -e /dev/net/tun ] || cannot_run "/dev/net/tun is missing (no tun/tap support)"
	ip netns add "$NS" 2>"$OUT/netns.err" || cannot_run "ip netns add failed: $(cat "$OUT/netns.err")"
	CLEAN_NETNS=$NS
	# no IPv6 on the test wire: no ND/MLD noise in the capture
	in_ns sysctl -q -w net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 || true
	ip -n "$NS" link set lo up
	ip -n "$NS" link add br0 type bridge stp_state 0 forward_delay 0 mcast_snooping 0 ||
		cannot_run "cannot create a bridge in a network namespace"
	local taps="tap0 tap1"
	[ "$PEER_VM" = 1 ] && taps="$taps tap2"
	[ "$LINKS" = 2 ] && taps="$taps tap0b tap1b"
	for t in $taps; do
		ip -n "$NS" tuntap add dev "$t" mode tap || cannot_run "cannot create tap devices"
		ip -n "$NS" link set "$t" master br0
		ip -n "$NS" link set "$t" up
	done
	ip -n "$NS" link set br0 up
	case "$MODE" in
	*-pair) ;;
	peer-host) ip -n "$NS" addr add "$HOST_IP/$NET_PREFIX" dev br0 ;;
	*)
		if [ "$PEER_VM" != 1 ]; then
			ip -n "$NS" addr add "$PEER_IP/$NET_PREFIX" dev br0
			[ "$LINKS" = 1 ] || ip -n "$NS" addr add "$PEER_IP2/$NET_PREFIX" dev br0
		fi
		;;
	esac
}

start_capture() {
	[ "$CAPTURE" = 1 ] || return 0
	# tcpdump puts br0 into promiscuous mode, so frames the bridge forwards
	# between the taps reach it too. --immediate-mode: without it the frames of
	# the last, unfilled TPACKET block are lost when tcpdump is stopped (seen:
	# "1404 packets received by filter", 1238 captured, the run's tail missing).
	# -B 65536: a 64 MiB kernel buffer, so that tcpdump, competing for the CPU with
	# QEMU under TCG, does not drop frames (seen: 33 "dropped by kernel" with the
	# default 2 MiB).
	nsenter --net="/run/netns/$NS" -- \
		tcpdump -i br0 --immediate-mode -B 65536 -U -n -Z root -s "$SNAPLEN" -w "$OUT/capture.pcap" 2>"$OUT/tcpdump.log" &
	TCPDUMP_PID=$!
	register_pid "$TCPDUMP_PID"
	wait_line "$OUT/tcpdump.log" 'listening on' 1 10 "$TCPDUMP_PID" ||
		die "$EXIT_INFRA" "tcpdump did not start: $(cat "$OUT/tcpdump.log")"
}

stop_capture() {
	[ -n "${TCPDUMP_PID:-}" ] || return 0
	sleep 0.5 # let the last frames through
	kill -INT "$TCPDUMP_PID" 2>/dev/null || true
	wait_gone "$TCPDUMP_PID" 10 || kill -KILL "$TCPDUMP_PID" 2>/dev/null || true
	wait "$TCPDUMP_PID" 2>/dev/null || true
	TCPDUMP_PID=
}

# write_conf VMDIR KEY=VALUE...: the VM's /etc/kpeer.conf
write_conf() {
	local d=$1 kv
	shift
	mkdir -p "$d"
	: >"$d/kpeer.conf"
	for kv in "$@"; do
		printf "%s='%s'\n" "${kv%%=*}" "${kv#*=}" >>"$d/kpeer.conf"
	done
}

# boot_vm NAME TAP MAC [MAC2]: boot OUT/NAME (kpeer.conf written) on the tap; TAP
# "none" boots without a network card. With MAC2 (LINKS=2) a second card (netdev n1,
# the guest's eth1) sits on tap "<TAP>b". QMP listens on OUT/NAME/qmp.sock (lib/vmlink.py).
boot_vm() {
	local name=$1 tap=$2 mac=$3 mac2=${4:-} d=$OUT/$1 net pid
	vm_initrd "$d"
	rm -f "$d/ctl.in" "$d/ctl.out" "$d/console.log" "$d/results.log"
	mkfifo "$d/ctl.in" "$d/ctl.out"
	local nsarg=""
	if [ "$tap" = none ]; then
		net="-nic none" # no network card: no namespace either (KVM probe)
	else
		nsarg=--net="/run/netns/$NS"
		net="-netdev tap,id=n0,ifname=$tap,script=no,downscript=no -device virtio-net-pci,netdev=n0,mac=$mac"
		[ -z "$mac2" ] ||
			net="$net -netdev tap,id=n1,ifname=${tap}b,script=no,downscript=no -device virtio-net-pci,netdev=n1,mac=$mac2"
	fi
	rm -f "$d/qmp.sock"
	local qmp=""
	# a unix socket path has at most 107 bytes; without QMP only lib/vmlink.py cannot work
	[ "${#d}" -gt 95 ] || qmp="-qmp unix:$d/qmp.sock,server=on,wait=off"
	# no_timer_check: under TCG on a starved host the kernel's early IO-APIC timer check
	# can fail and panic the boot ("IO-APIC + timer doesn't work!", seen once while the
	# host compiled); QEMU's timer is fine, the check only measures how fast we run.
	# shellcheck disable=SC2086
	nsenter $nsarg -- qemu-system-x86_64 $QACCEL -M q35 -m "$VM_MEM" -smp 1 \
		-nodefaults -no-user-config -display none -monitor none -no-reboot \
		-kernel "$VMLINUZ" -initrd "$d/initrd" \
		-append "console=ttyS0 loglevel=4 panic=-1 no_timer_check $KERNEL_APPEND" \
		-serial "file:$d/console.log" -serial "file:$d/results.log" -serial "pipe:$d/ctl" \
		$qmp $net >"$d/qemu.log" 2>&1 &
	pid=$!
	register_pid "$pid"
	eval "VMPID_$name=$pid"
	log "booted VM $name (pid $pid, $ACCEL_USED)"
}

vm_pid() { eval "echo \${VMPID_$1:-}"; }

# vm_wait NAME ERE [COUNT] [TIMEOUT]: wait for a result line of VM NAME; gives up
# early when the VM is gone or its kernel oopsed (vm_oops)
vm_wait() {
	local name=$1 re=$2 n=${3:-1} t=${4:-120}
	wait_line "$OUT/$name/results.log" "^KPEER $re" "$n" "$t" "$(vm_pid "$name")" \
		"$OUT/$name/console.log"
}

# vm_oops NAME: did VM NAME's kernel oops or panic? Prints the console's first such line.
vm_oops() {
	grep -a -m1 -E "$KERNEL_OOPS_RE" "$OUT/$1/console.log" 2>/dev/null
}

# vm_ctl NAME LINE: send one control line to VM NAME
vm_ctl() {
	local pid
	pid=$(vm_pid "$1")
	if [ -n "$pid" ] && alive "$pid" &&
		timeout 10 bash -c 'printf "%s\n" "$1" >"$2"' _ "$2" "$OUT/$1/ctl.in"; then
		return 0
	fi
	log "cannot send '$2' to VM $1 (not running?)"
	INFRA_ERRORS="$INFRA_ERRORS vm-$1-control-failed"
	return 1
}

# vm_abort NAME: the run went wrong; make the VM report what it has and stop.
# Its control port only works once init has opened it ("boot" line); before
# that the VM is simply killed (its console log still shows how far it got).
vm_abort() {
	local pid
	pid=$(vm_pid "$1")
	if vm_wait "$1" 'boot ' 1 0; then
		vm_ctl "$1" abort || true
		vm_finish "$1" 30
	elif [ -n "$pid" ]; then
		log "stopping VM $1 before its userspace came up"
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
}

# vm_finish NAME [TIMEOUT]: wait for the VM to power off (it does so after
# its "end" line). A VM gone without that line, or whose kernel oopsed, is
# recorded in OUT/vm-died ("NAME" or "NAME (kernel oops)") for lib/retry.bash.
vm_finish() {
	local name=$1 pid oops finished
	pid=$(vm_pid "$name")
	[ -n "$pid" ] || return 0
	finished=1
	vm_wait "$name" 'end ' 1 "${2:-$((IOTIMEOUT + 60))}" || finished=0
	if oops=$(vm_oops "$name"); then
		# the guest kernel crashed (a kernel bug, e.g. in rxe; the verdict fails on it):
		# like a VM that died, this says nothing about the stacks under test, and
		# lib/retry.bash runs the step again
		if [ "$finished" = 0 ]; then
			# the registers and call trace follow the first line through the emulated
			# UART (slow under TCG): the console is the only record, let them arrive
			wait_line "$OUT/$name/console.log" 'end trace|Kernel panic' 1 10 "$pid" || true
		fi
		log "VM $name: its kernel oopsed (${oops:0:160}); last lines of $OUT/$name/console.log:"
		echo "$name (kernel oops)" >>"$OUT/vm-died"
		tail -n 40 "$OUT/$name/console.log" 2>/dev/null | sed "s/^/[vm $name] /" >&2 || true
		if [ "$finished" = 0 ]; then
			INFRA_ERRORS="$INFRA_ERRORS vm-$name-oops"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	elif [ "$finished" = 0 ]; then
		if alive "$pid"; then
			log "VM $name did not finish; stopping it"
		else
			# gone without its end line: the guest kernel panicked (panic=-1, -no-reboot)
			# or QEMU died; the console's last lines say which
			log "VM $name exited without its end line; last lines of $OUT/$name/console.log and qemu.log:"
			echo "$name" >>"$OUT/vm-died" # lib/retry.bash runs such a run once more
			tail -n 40 "$OUT/$name/console.log" 2>/dev/null | sed "s/^/[vm $name] /" >&2 || true
			tail -n 5 "$OUT/$name/qemu.log" 2>/dev/null | sed "s/^/[qemu $name] /" >&2 || true
		fi
		INFRA_ERRORS="$INFRA_ERRORS vm-$name-no-end"
	fi
	wait_gone "$pid" 20 || kill -KILL "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}

# Choose KVM or TCG. KVM is used only when a real boot of this kernel under
# it reaches userspace: some hosts expose /dev/kvm through a nested
# hypervisor (e.g. kvm_pvm) on which a stock kernel does not boot.
choose_accel() {
	local key cache d pid
	case "$ACCEL" in
	tcg) ACCEL_USED=tcg ;;
	kvm) ACCEL_USED=kvm ;;
	auto)
		ACCEL_USED=tcg
		if [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
			key=$( {
				uname -r
				qemu-system-x86_64 --version | head -n1
				basename "$KDEB"
			} | sha256sum | cut -c1-16)
			cache=$KPEER_CACHE/accel-$key
			if [ -f "$cache" ]; then
				ACCEL_USED=$(cat "$cache")
			else
				log "probing KVM (a TCG fallback is used if the kernel does not boot under it)"
				d=$OUT/kvmprobe
				write_conf "$d" KP_VM=kvmprobe KP_ROLE=probe
				QACCEL="-accel kvm -cpu host"
				ACCEL_USED=kvm-probe
				boot_vm kvmprobe none none
				pid=$(vm_pid kvmprobe)
				if vm_wait kvmprobe 'boot ' 1 25; then
					ACCEL_USED=kvm
				else
					ACCEL_USED=tcg
				fi
				kill -KILL "$pid" 2>/dev/null || true
				wait "$pid" 2>/dev/null || true
				echo "$ACCEL_USED" >"$cache"
				log "KVM probe: $ACCEL_USED ($(head -c 300 "$d/qemu.log" | tr '\n' ' '))"
			fi
		fi
		;;
	*) die "$EXIT_USAGE" "ACCEL must be auto, kvm or tcg" ;;
	esac
	if [ "$ACCEL_USED" = kvm ]; then
		QACCEL="-accel kvm -cpu host"
	else
		QACCEL="-accel tcg -cpu max"
	fi
}

# ------------------------------------------------------------- PEER_CMD

# Environment PEER_CMD sees (README.md, "What PEER_CMD gets")
export_peer_env() {
	export KPEER_MODE=$MODE KPEER_NETNS=$NS KPEER_IFACE=br0
	export KPEER_LOCAL_IP=$PEER_IP KPEER_PREFIX=$NET_PREFIX
	export KPEER_OUT=$OUT KPEER_LOGDIR=$OUT/peer KPEER_DONE_FILE=$OUT/peer/done
	export KPEER_REPO=$REPO_DIR KPEER_DIR=$KPEER_DIR
	mkdir -p "$OUT/peer"
}

# start_peer STEP: run PEER_CMD in the namespace, in its own process group (or, with
# PEER_VM=1, boot VM "guest" that runs it)
start_peer() {
	local step=$1
	if [ "$PEER_VM" = 1 ]; then
		start_peer_vm "$step"
		return
	fi
	rm -f "$KPEER_DONE_FILE"
	log "PEER_CMD ($step): $PEER_CMD"
	setsid nsenter --net="/run/netns/$NS" -- bash -c "$PEER_CMD" >>"$OUT/peer/peer.log" 2>&1 </dev/null &
	PEER_PID=$!
	register_pgid "$PEER_PID"
	PEER_STEP=$step
}

# stop_peer GRACE: give PEER_CMD GRACE seconds to exit, then SIGTERM (and
# SIGKILL after 10 s); record "step rc how" in OUT/peer/steps.tsv
stop_peer() {
	local grace=$1 rc how=exited
	[ -n "${PEER_PID:-}" ] || return 0
	if [ "$PEER_VM" = 1 ]; then
		stop_peer_vm "$grace"
		return
	fi
	if ! wait_gone "$PEER_PID" "$grace"; then
		how=terminated
		kill -TERM -- "-$PEER_PID" 2>/dev/null || true
		if ! wait_gone "$PEER_PID" 10; then
			how=killed
			kill -KILL -- "-$PEER_PID" 2>/dev/null || true
		fi
	fi
	rc=0
	wait "$PEER_PID" 2>/dev/null || rc=$?
	printf '%s\t%s\t%s\n' "$PEER_STEP" "$rc" "$how" >>"$OUT/peer/steps.tsv"
	log "PEER_CMD ($PEER_STEP) $how, exit status $rc"
	PEER_PID=
}

# peer_listening PORT: is a TCP socket listening on PORT in the namespace (in VM guest)?
peer_listening() {
	if [ "$PEER_VM" = 1 ]; then
		# the VM's result line: "KPEER peer-listening vm=guest port=N"
		vm_wait guest "peer-listening vm=guest port=$1( |$)" 1 0
		return
	fi
	in_ns ss -Hltn "sport = :$1" 2>/dev/null | grep -q .
}

# peer_alive: is PEER_CMD still running?
peer_alive() {
	if [ "$PEER_VM" = 1 ]; then
		alive "$(vm_pid guest)" && ! vm_oops guest >/dev/null && ! vm_wait guest 'peer-exit ' 1 0
		return
	fi
	alive "$PEER_PID"
}

# peer_done: did PEER_CMD create $KPEER_DONE_FILE?
peer_done() {
	if [ "$PEER_VM" = 1 ]; then
		vm_wait guest 'peer-done' 1 0
		return
	fi
	[ -e "$KPEER_DONE_FILE" ]
}

# ------------------------------------------------------------- PEER_CMD in a VM

# The guest's /peer: env (KPEER_*, SMC_* and RUST_* variables), cmd (PEER_CMD) and
# the files of PEER_FILES, plus the shared libraries those need (resolved on this host:
# the VM's userland is this Debian release's, see lib/image.sh).
peer_vm_layer() {
	local d=$OUT/guest f l kv name
	rm -rf "$d/layer"
	mkdir -p "$d/layer/peer"
	env | grep -E '^(KPEER|SMC|RUST)_[A-Za-z0-9_]*=' |
		grep -v -E '^KPEER_(DONE_FILE|LOGDIR|OUT|REPO|DIR|NETNS|IFACE)=' |
		while IFS= read -r kv; do
			case "$kv" in *"'"*) continue ;; esac
			printf "export %s='%s'\n" "${kv%%=*}" "${kv#*=}"
		done >"$d/layer/peer/env"
	printf 'export KPEER_IFACE=eth0\n' >>"$d/layer/peer/env"
	printf '%s\n' "$PEER_CMD" >"$d/layer/peer/cmd"
	for f in $PEER_FILES; do
		[ -f "$f" ] || die "$EXIT_USAGE" "PEER_FILES: $f is not a file"
		name=$(basename "$f")
		cp -L "$f" "$d/layer/peer/$name"
		ldd "$f" >/dev/null 2>&1 || continue
		for l in $(ldd "$f" | awk '/=> \// { print $3 } /^[ \t]*\/lib64\// { print $1 }' | sort -u); do
			mkdir -p "$d/layer$(dirname "$l")"
			cp -L "$l" "$d/layer$l"
		done
	done
}

start_peer_vm() {
	local step=$1
	log "PEER_CMD ($step) in VM guest: $PEER_CMD"
	peer_vm_layer
	write_conf "$OUT/guest" KP_VM=guest KP_ROLE=peer KP_IP="$PEER_IP/$NET_PREFIX" \
		KP_PEER="${KPEER_PEER_IP:-}" KP_PORT="$PORT" KP_IOTIMEOUT="$IOTIMEOUT"
	boot_vm guest tap2 "$GUEST_MAC"
	PEER_PID=guest-vm
	PEER_STEP=$step
}

stop_peer_vm() {
	local grace=$1 rc=255 how=killed line
	if ! vm_wait guest 'peer-exit ' 1 "$grace"; then
		vm_ctl guest term || true
		vm_wait guest 'peer-exit ' 1 20 || true
	fi
	line=$(grep -a -m1 '^KPEER peer-exit ' "$OUT/guest/results.log" 2>/dev/null || true)
	if [ -n "$line" ]; then
		rc=$(sed -n 's/.* rc=\([0-9]*\).*/\1/p' <<<"$line")
		how=$(sed -n 's/.* how=\([a-z]*\).*/\1/p' <<<"$line")
		vm_ctl guest stop || true
		vm_finish guest
	else
		vm_abort guest
	fi
	# a guest that died early printed no output: no match is no error (set -e, pipefail)
	{ grep -a '^KPEER-OUT peer ' "$OUT/guest/results.log" 2>/dev/null || true; } |
		sed 's/^KPEER-OUT peer //' >>"$OUT/peer/peer.log"
	printf '%s\t%s\t%s\n' "$PEER_STEP" "${rc:-255}" "${how:-killed}" >>"$OUT/peer/steps.tsv"
	log "PEER_CMD ($PEER_STEP) in VM guest $how, exit status ${rc:-255}"
	PEER_PID=
}

# HOST_CMD (mode peer-host): like PEER_CMD, in the namespace at HOST_IP
start_host() {
	log "HOST_CMD: $HOST_CMD"
	KPEER_LOCAL_IP=$HOST_IP KPEER_PEER_IP=$PEER_IP setsid nsenter --net="/run/netns/$NS" -- \
		bash -c "$HOST_CMD" >>"$OUT/peer/host.log" 2>&1 </dev/null &
	HOST_PID=$!
	register_pgid "$HOST_PID"
}

stop_host() {
	local grace=$1 rc how=exited
	[ -n "${HOST_PID:-}" ] || return 0
	if ! wait_gone "$HOST_PID" "$grace"; then
		how=terminated
		kill -TERM -- "-$HOST_PID" 2>/dev/null || true
		if ! wait_gone "$HOST_PID" 10; then
			how=killed
			kill -KILL -- "-$HOST_PID" 2>/dev/null || true
		fi
	fi
	rc=0
	wait "$HOST_PID" 2>/dev/null || rc=$?
	printf 'host\t%s\t%s\n' "$rc" "$how" >>"$OUT/peer/steps.tsv"
	log "HOST_CMD $how, exit status $rc"
	HOST_PID=
}
