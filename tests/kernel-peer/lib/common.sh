# shellcheck shell=bash
# Logging, errors and cleanup for tests/kernel-peer/run.sh (sourced).

# Exit codes of run.sh (README.md, "Exit codes")
readonly EXIT_PASS=0 EXIT_FAIL=1 EXIT_USAGE=2 EXIT_INFRA=3 EXIT_CANNOT_RUN=4

T_START=$(date +%s.%N)
elapsed() { awk -v a="$(date +%s.%N)" -v b="${1:-$T_START}" 'BEGIN { printf "%.1f", a - b }'; }
log() { printf '[kpeer %6ss] %s\n' "$(elapsed)" "$*" >&2; }
die() { # exit-code message
	local rc=$1
	shift
	log "ERROR: $*"
	exit "$rc"
}
cannot_run() { die "$EXIT_CANNOT_RUN" "cannot run here: $*"; }

# Timings, written to $OUT/timings.txt at the end
declare -a TIMINGS=()
timing() { TIMINGS+=("$1=$2"); }

# ---------------------------------------------------------------- cleanup
# Every process the harness starts is registered here and stopped by PID on
# every exit path (VMs, tcpdump, PEER_CMD), then the namespace is deleted.
declare -a CLEAN_PIDS=() CLEAN_PGIDS=()
CLEAN_NETNS=
register_pid() { CLEAN_PIDS+=("$1"); }
register_pgid() { CLEAN_PGIDS+=("$1"); }

cleanup() {
	local rc=$? p any
	trap - EXIT INT TERM HUP
	set +e
	for p in "${CLEAN_PGIDS[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done
	for p in "${CLEAN_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		any=0
		for p in "${CLEAN_PIDS[@]}" "${CLEAN_PGIDS[@]}"; do
			alive "$p" && any=1
		done
		[ "$any" = 0 ] && break
		sleep 0.3
	done
	for p in "${CLEAN_PGIDS[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done
	for p in "${CLEAN_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
	wait 2>/dev/null
	if [ -n "$CLEAN_NETNS" ]; then
		ip netns del "$CLEAN_NETNS" 2>/dev/null
	fi
	exit "$rc"
}
on_signal() {
	log "interrupted"
	exit "$EXIT_INFRA"
}
trap cleanup EXIT
trap on_signal INT TERM HUP

# alive PID: the process exists and is not a zombie (our exited children stay
# zombies until waited for, and kill -0 succeeds on them)
alive() {
	local st
	st=$(sed -n 's/.*) \(.\).*/\1/p' "/proc/$1/stat" 2>/dev/null) || return 1
	[ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}

# A guest kernel that crashed: every oops report has an "Oops:" line ("Oops: invalid
# opcode" after a "kernel BUG at", "Oops: general protection fault", "Oops: 0000 [#1]"
# after a NULL dereference); a panic says so. Matched on a VM's console (loglevel=4
# prints these), where they appear even when the VM never reports its dmesg, anywhere
# on a line: userspace output without a newline may come first (even ending in a digit).
KERNEL_OOPS_RE='\[ *[0-9]+\.[0-9]+\] (Oops: |Kernel panic)'

# wait_line FILE ERE COUNT TIMEOUT [PID [CONSOLE]]: wait until FILE holds COUNT lines
# matching ERE; fails after TIMEOUT seconds, as soon as PID has exited or as soon as
# the kernel console log CONSOLE shows an oops (a VM that oopsed rarely goes on:
# seen in CI, a rxe bug left the VM up and its SMC-R traffic dead for the 900 s timeout).
wait_line() {
	local f=$1 re=$2 n=$3 t=$4 pid=${5:-} console=${6:-} deadline n_now
	deadline=$(($(date +%s) + t))
	while :; do
		n_now=$(grep -a -c -E "$re" "$f" 2>/dev/null) || n_now=0
		[ "$n_now" -ge "$n" ] && return 0
		[ "$(date +%s)" -ge "$deadline" ] && return 1
		if { [ -n "$pid" ] && ! alive "$pid"; } ||
			{ [ -n "$console" ] && grep -a -q -E "$KERNEL_OOPS_RE" "$console" 2>/dev/null; }; then
			# one last look: the line may have been written just before exit
			n_now=$(grep -a -c -E "$re" "$f" 2>/dev/null) || n_now=0
			[ "$n_now" -ge "$n" ] && return 0
			return 1
		fi
		sleep 0.2
	done
}

# wait_gone PID TIMEOUT: wait until PID has exited (it is not reaped here)
wait_gone() {
	local pid=$1 deadline=$(($(date +%s) + $2))
	while alive "$pid"; do
		[ "$(date +%s)" -ge "$deadline" ] && return 1
		sleep 0.2
	done
	return 0
}
