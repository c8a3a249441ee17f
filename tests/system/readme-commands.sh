#!/usr/bin/env bash
# System test: the README's first command (the main job) runs as written, literally.
# It is read out of the README's first code block (first line that is not a comment),
# its trailing comment stripped, and run by bash from the repository root; it must
# exit 0 and report an SMC-R connection whose data verified. The test command (the
# block's second line) is what runs this script, so it is not run again here.
#
# Exit: 0 pass, 77 skip, anything else fail. README_DEMO_ARGS appends arguments to the
# command (default: a smaller transfer than the demo's 256 MiB, to keep CI short; set
# it to the empty string to run the command exactly as written).
set -uo pipefail
cd "$(dirname "$0")/../.."
TEST_NAME=readme-commands
. tests/system/lib/smc-common.bash

main=$(awk '/^```/{n++; next} n==1' README.md | grep -v '^\s*#' | grep -v '^\s*$' | head -n 1)
main=${main%%#*}
[ -n "$main" ] || { echo "FAIL: no command in the README's first code block"; exit 1; }
case $main in
  *"cargo run"*" -- demo"*) ;;
  *) echo "FAIL: the README's first command is not the demo: $main"; exit 1 ;;
esac
args=${README_DEMO_ARGS-"--bytes 16M"}
echo "running the README's main command: $main $args"
timeout 900 bash -c "$main $args" > "$WORK/main.out" 2> "$WORK/main.err"
rc=$?
if [ "$rc" = 0 ]; then ok "README main command exit 0"; else
  fail "README main command exit $rc"; show "$WORK/main.out" "$WORK/main.err"; fi
# The demo's own verdict: both directions verified by SHA-256 over SMC-R.
if grep -q "^client connection: SMC-R" "$WORK/main.out" \
   && grep -q "^SMC-R .* SHA-256 verified both ways" "$WORK/main.out"; then
  ok "demo ran over SMC-R and verified its data"
else fail "demo output"; show "$WORK/main.out"; fi

[ "$FAILS" = 0 ] || exit 1
echo "PASS: README main command"
