# Shared by tests/system/kpeer-linux-*.sh (sourced; not a test itself: no .sh suffix):
# our `smc connect` / `smc listen` against the Linux 6.12 kernel's SMC-R in the QEMU
# harness tests/kernel-peer/run.sh, with the PEER_CMD tests/system/helpers/kpeer-smc-peer.sh.
#
# Provides: kpeer_linux_prepare (skip checks, eBPF TCP-option program installed into a
# private cgroup and pin directory, removed on exit) and kpeer_run NAME MODE KNOBS...
# (one harness run; prints its checks; counts failures in FAILS; exits 77 when the
# harness says it cannot run here).

FAILS=0
BIN=${BIN:-target/release}
. tests/kernel-peer/lib/retry.bash
SMC=$(cd "$(dirname "$BIN/smc")" 2>/dev/null && pwd)/smc
KP_TAG=${TEST_NAME:-kpeer-linux}-$$
KP_OUT=$(mktemp -d "/tmp/$KP_TAG.XXXXXX")
KPEER_CG=
SMC_RS_BPF_DIR=

skip() {
  echo "SKIP $TEST_NAME: $*"
  exit 77
}

_kpeer_linux_cleanup() {
  if [ -n "$SMC_RS_BPF_DIR" ]; then
    "$SMC" bpf uninstall --pin-dir "$SMC_RS_BPF_DIR" >/dev/null 2>&1 || rm -rf "$SMC_RS_BPF_DIR"
  fi
  if [ -n "$KPEER_CG" ] && [ -d "$KPEER_CG" ]; then
    local p
    while read -r p; do echo "$p" > "$CG_ROOT/cgroup.procs" 2>/dev/null; done < "$KPEER_CG/cgroup.procs"
    rmdir "$KPEER_CG" 2>/dev/null
  fi
  if [ "$FAILS" = 0 ] && [ -z "${KEEP_WORK:-}" ]; then rm -rf "$KP_OUT"; else echo "artefacts kept in $KP_OUT"; fi
}

kpeer_linux_prepare() {
  [ "$(id -u)" = 0 ] || skip "needs root (network namespaces, tap devices, eBPF)"
  command -v qemu-system-x86_64 >/dev/null 2>&1 || skip "qemu-system-x86_64 is not installed (scripts/setup.sh installs it)"
  [ -e /dev/net/tun ] || skip "no /dev/net/tun"
  local probe=kpeer-probe-$$
  ip netns add "$probe" 2>/dev/null || skip "cannot create network namespaces"
  ip netns del "$probe"
  command -v bpftool >/dev/null || skip "bpftool is not installed (scripts/setup.sh installs it)"
  bpftool feature probe kernel 2>/dev/null | grep -q "program_type sock_ops is available" \
    || skip "kernel has no eBPF sock_ops support (the Linux peer needs the SMC-R TCP option)"
  CG_ROOT=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/self/mounts)
  [ -n "$CG_ROOT" ] || skip "no cgroup2 filesystem mounted"
  if [ ! -x "$SMC" ] || [ ! -x "$(dirname "$SMC")/smc-kpeer-scen" ]; then
    case $BIN in
      */release) CARGO_TARGET_DIR=${BIN%/release} cargo build --release -q -p smc-cli --bins \
                   || { echo "FAIL: build"; exit 1; }
                 SMC=$(cd "$BIN" && pwd)/smc ;;
      *) echo "FAIL: $SMC not found (set BIN)"; exit 1 ;;
    esac
  fi
  trap _kpeer_linux_cleanup EXIT
  trap 'exit 130' INT TERM
  # Only processes in this cgroup (the PEER_CMD moves itself there) get the option.
  KPEER_CG=$CG_ROOT/$KP_TAG
  SMC_RS_BPF_DIR=/sys/fs/bpf/$KP_TAG
  mkdir "$KPEER_CG" || { echo "FAIL: cannot create cgroup $KPEER_CG"; exit 1; }
  "$SMC" bpf install --cgroup "$KPEER_CG" --pin-dir "$SMC_RS_BPF_DIR" > "$KP_OUT/bpf-install.txt" 2>&1 \
    || { cat "$KP_OUT/bpf-install.txt"; echo "FAIL: smc bpf install"; exit 1; }
  export SMC KPEER_CG SMC_RS_BPF_DIR
}

# kpeer_run NAME MODE KNOB=VALUE...: one harness run with our PEER_CMD; PLAN=... among
# the knobs is passed to the PEER_CMD through the environment.
kpeer_run() {
  local name=$1 mode=$2; shift 2
  local out=$KP_OUT/$name log=$KP_OUT/$name.log rc t0=$SECONDS
  echo "== $name: run.sh $mode $*"
  # a VM that dies under the run runs it again (lib/retry.bash)
  kpeer_run_retry "$out" "$log" \
    env "$@" timeout ${KPEER_TIMEOUT:-900} tests/kernel-peer/run.sh "$mode" OUT="$out" NO_INSTALL=1 \
    PEER_CMD='exec "$KPEER_REPO/tests/system/helpers/kpeer-smc-peer.sh"'
  rc=$?
  grep -E '^(PASS|FAIL|WARN|VERDICT)' "$log" | sed 's/^/   /'
  grep -E 'timings:' "$log" | sed 's/^.*timings: /   timings: /'
  case $rc in
    0) echo "ok: $name ($((SECONDS - t0)) s)" ;;
    4) local reason
       reason=$(grep -m1 'cannot run here' "$log" | sed 's/.*cannot run here: //')
       skip "${reason:-the kernel-peer harness cannot run on this machine}" ;;
    *) FAILS=$((FAILS + 1))
       echo "FAIL: $name (run.sh exit $rc); last harness lines:"
       tail -n 40 "$log" | sed 's/^/   /' ;;
  esac
}
