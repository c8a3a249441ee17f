# Shared by the smc-*.sh system tests (sourced; not a test itself: no .sh suffix).
# Provides: BIN (built if missing), WORK (temp dir), skip/fail/ok, start_listen,
# stats_field, fd_count, and a cleanup that kills every process in PIDS and runs
# the optional function extra_cleanup.

# These scripts test SMC-R between local stacks over the RNIC: the same-host path (on by
# default between two smc-rs stacks of one host, docs/samehost.md) stays off unless a
# script or the caller turns it on (smc-samehost.sh does).
export SMC_RS_SAME_HOST=${SMC_RS_SAME_HOST:-0}

BIN=${BIN:-target/release}
SMC="$BIN/smc"
FAILS=0
PIDS=()
WORK=$(mktemp -d "/tmp/${TEST_NAME:-smc-test}.XXXXXX")

skip() {
  if [ "${CI:-}" = true ] && [ "${2:-}" != always ]; then
    echo "FAIL (CI): cannot run: $1"; exit 1
  fi
  echo "SKIP: $1"; exit 77
}
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
ok() { echo "ok: $*"; }

_smc_cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  if declare -F extra_cleanup >/dev/null; then extra_cleanup; fi
  if [ -n "${KEEP_WORK:-}" ]; then echo "work dir kept: $WORK"; else rm -rf "$WORK"; fi
}
trap _smc_cleanup EXIT
trap 'exit 130' INT TERM

ensure_bin() {
  if [ ! -x "$SMC" ]; then
    case $BIN in
      */release) CARGO_TARGET_DIR=${BIN%/release} cargo build --release -q -p smc-cli --bins \
                   || { echo "FAIL: build"; exit 1; } ;;
      *) echo "FAIL: $SMC not found (set BIN)"; exit 1 ;;
    esac
  fi
}

# show FILE...: indented copy of files, for failure reports.
show() { local f; for f in "$@"; do echo "  --- $f"; sed 's/^/    /' "$f" 2>/dev/null | tail -n 40; done; }

# start_listen NAME [PREFIX...] -- LISTEN-ARGS...
# Runs `[PREFIX...] smc listen LISTEN-ARGS` in the background (stdin from
# $LISTEN_STDIN, default /dev/null), stdout in
# $WORK/NAME.out, stderr in $WORK/NAME.err; waits for "listening on"; sets
# PORT and LPID (the listener's pid; with a prefix such as `ip netns exec`, the
# pid of that wrapper, which execs the listener).
start_listen() {
  local name=$1; shift
  local pre=()
  while [ "$1" != -- ]; do pre+=("$1"); shift; done
  shift
  # Emptied here, not only by the background job's own redirections: those happen in the
  # child, after the fork, and the wait below could otherwise read a previous listener's
  # "listening on" line under the same name (and take its port, or an emptied file).
  : > "$WORK/$name.out"; : > "$WORK/$name.err"
  "${pre[@]}" "$SMC" listen "$@" < "${LISTEN_STDIN:-/dev/null}" >> "$WORK/$name.out" 2>> "$WORK/$name.err" &
  LPID=$!
  PIDS+=("$LPID")
  local i
  for i in $(seq 1200); do
    grep -q "^listening on" "$WORK/$name.err" 2>/dev/null && break
    kill -0 "$LPID" 2>/dev/null || break
    sleep 0.05
  done
  PORT=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$WORK/$name.err" | head -n1)
  if [ -z "$PORT" ]; then
    echo "FAIL: listener $name did not start"; show "$WORK/$name.err"
    # Where it is stuck (the wrapper, e.g. `ip netns exec`, and what it runs).
    ps -o pid,stat,wchan:30,etime,cmd -p "$LPID" --ppid "$LPID" 2>/dev/null | sed 's/^/    /'
    cat "/proc/$LPID/stack" 2>/dev/null | sed 's/^/    stack: /'
    exit 1
  fi
}

# stats_field FILE TITLE KEY: the value of KEY=VALUE on the "stats:" summary
# line of the last snapshot titled TITLE in FILE.
stats_field() {
  awk -v t="stats: -- $2" -v k="$3" '
    $0 == t { inblk = 1; val = ""; next }
    /^stats: -- end$/ { if (inblk) last = val; inblk = 0; next }
    inblk && /^stats: summary / {
      for (i = 3; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) val = kv[2] }
    }
    END { print last }' "$1"
}

# snapshot_count FILE TITLE: how many complete snapshots titled TITLE FILE has.
snapshot_count() {
  awk -v t="stats: -- $2" '$0 == t { s = 1; next } /^stats: -- end$/ { if (s) n++; s = 0 } END { print n + 0 }' "$1"
}

# request_snapshot PID FILE: SIGUSR1 to a `smc listen --stats`, waits for the
# new "stats: -- SIGUSR1" snapshot to be complete in FILE.
request_snapshot() {
  local pid=$1 file=$2 before i
  before=$(snapshot_count "$file" SIGUSR1)
  kill -USR1 "$pid"
  for i in $(seq 100); do
    [ "$(snapshot_count "$file" SIGUSR1)" -gt "$before" ] && return 0
    sleep 0.05
  done
  return 1
}

fd_count() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }

# wait_exit PID SECS: waits for a background child; after SECS kills it and
# returns 124 (like timeout), else returns its exit status.
wait_exit() {
  local pid=$1 secs=$2 i
  for i in $(seq $((secs * 20))); do
    kill -0 "$pid" 2>/dev/null || { wait "$pid"; return $?; }
    sleep 0.05
  done
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  return 124
}

# ensure_preload: sets LIB to libsmc_preload.so beside the smc binary ($BIN), building it
# when missing (scripts/test.sh builds it first).
ensure_preload() {
  LIB="$BIN/libsmc_preload.so"
  if [ ! -f "$LIB" ]; then
    case $BIN in
      */release) CARGO_TARGET_DIR=${BIN%/release} cargo build --release -q -p smc-preload \
                   || { echo "FAIL: build smc-preload"; exit 1; } ;;
      *) echo "FAIL: $LIB not found (set BIN)"; exit 1 ;;
    esac
  fi
}

# free_port: a TCP port free on 127.0.0.1 right now.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# wait_listen PORT: waits (up to 15 s) until something listens on PORT.
wait_listen() {
  local i; for i in $(seq 300); do ss -Hltn "sport = :$1" | grep -q . && return 0; sleep 0.05; done; return 1
}

# json PY-EXPR: evaluates PY-EXPR with `d` = the JSON on stdin.
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
