# shellcheck shell=bash
# kpeer_run_retry OUT LOG CMD...: run CMD (one tests/kernel-peer/run.sh invocation with
# OUT=OUT), its output to LOG, and return its exit status. A VM that vanished without its
# end line (QEMU gone: a guest kernel panic, panic=-1 with -no-reboot, or the emulator
# itself), or whose kernel oopsed (seen in CI: a rxe bug, list corruption in
# rxe_receiver, left the VM up with its RDMA dead), says nothing about the stacks under
# test (vm_finish records either in OUT/vm-died; the verdict fails on the oops):
# its console (in LOG) is shown with a WARN line and CMD runs again, up to twice; a third
# death, or any other failure, is CMD's status. Twice: in 11 CI runs of ibverbs-rxe.sh
# (two rxe VMs talking under TCG) a VM died or oopsed in 4, so one retry still left a
# run failing about once in ten for a Linux bug. The last death's OUT and LOG are kept
# beside (OUT.vm-died, OUT.vm-died.log). Sourced by tests/system/ibverbs-rxe.sh and
# tests/system/lib/kpeer-linux.bash.
kpeer_run_retry() {
  local out=$1 log=$2 rc try
  shift 2
  for try in 1 2 3; do
    "$@" >"$log" 2>&1
    rc=$?
    if [ "$rc" != 0 ] && [ "$try" -lt 3 ] && [ -s "$out/vm-died" ]; then
      echo "WARN: $(basename "$out"): VM $(tr '\n' ' ' <"$out/vm-died")died or oopsed under the run (console below); running it again"
      grep -aE 'exited without its end line|its kernel oopsed|^\[(vm|qemu) ' "$log" | sed 's/^/   /'
      rm -rf "$out.vm-died" "$out.vm-died.log"
      mv "$out" "$out.vm-died"
      mv "$log" "$out.vm-died.log"
      continue
    fi
    return "$rc"
  done
}
