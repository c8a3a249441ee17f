# shellcheck shell=bash
# kpeer_run_retry OUT LOG CMD...: run CMD (one tests/kernel-peer/run.sh invocation with
# OUT=OUT), its output to LOG, and return its exit status. A VM that vanished without its
# end line (QEMU gone: a guest kernel panic, panic=-1 with -no-reboot, or the emulator
# itself; vm_finish records it in OUT/vm-died) says nothing about the stacks under test:
# its console (in LOG) is shown with a WARN line and CMD runs once more; a second death,
# or any other failure, is CMD's status. The first try's OUT and LOG are kept beside
# (OUT.vm-died, OUT.vm-died.log). Sourced by tests/system/ibverbs-rxe.sh and
# tests/system/lib/kpeer-linux.bash.
kpeer_run_retry() {
  local out=$1 log=$2 rc try
  shift 2
  for try in 1 2; do
    "$@" >"$log" 2>&1
    rc=$?
    if [ "$rc" != 0 ] && [ "$try" = 1 ] && [ -s "$out/vm-died" ]; then
      echo "WARN: $(basename "$out"): VM $(tr '\n' ' ' <"$out/vm-died")died under the run (console below); running it again"
      grep -aE 'exited without its end line|^\[(vm|qemu) ' "$log" | sed 's/^/   /'
      rm -rf "$out.vm-died" "$out.vm-died.log"
      mv "$out" "$out.vm-died"
      mv "$log" "$out.vm-died.log"
      continue
    fi
    return "$rc"
  done
}
