#!/usr/bin/env bash
# Runs every cargo-fuzz target under fuzz/ (or the ones named) one after the other,
# each starting from its corpus in fuzz/corpus/<target> (kept in the repo) plus the
# seeds in fuzz/seeds/<target>. A crash fails the run (the other targets still run),
# with the input in hex and a copy in fuzz/artifacts/<target>/.
#
#   scripts/fuzz.sh [TARGET...]
#
# How long each target runs:
#   CI=true          FUZZ_SECONDS per target (default 20): the smoke run of scripts/test.sh
#   FUZZ_FULL=1      at least FUZZ_RUNS executions per target (default 10^7), no time bound
#   otherwise        FUZZ_SECONDS per target (default 60)
# Other knobs:
#   FUZZ_UPDATE_CORPUS=1  replace fuzz/corpus/<target> by a minimized merge of it, the
#                         seeds and what the run found (libFuzzer -merge=1 on edge
#                         coverage, like `cargo fuzz cmin`)
#   FUZZ_SANITIZER        cargo-fuzz sanitizer (default none: the fuzzed crates have no
#                         unsafe code, and `none` also builds on the stable toolchain)
#   FUZZ_JOBS             libFuzzer -jobs/-workers per target (default 1, in-process)
#
# Toolchain: nightly when installed (the project's usual `cargo +nightly fuzz`), else the
# stable toolchain, which builds cargo-fuzz targets without a sanitizer. cargo-fuzz is
# installed from crates.io when missing. Exit 77 (skip) when neither can be had.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

skip() { echo "fuzz: SKIP: $*" >&2; exit 77; }

command -v cargo >/dev/null 2>&1 || skip "no cargo on this machine"
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz from crates.io" >&2
  cargo install --locked -q cargo-fuzz >&2 || skip "cargo-fuzz is not installed and could not be installed"
fi

sanitizer=${FUZZ_SANITIZER:-none}
toolchain=
if rustup run nightly rustc --version >/dev/null 2>&1; then
  toolchain=+nightly
elif [ "$sanitizer" != none ]; then
  skip "sanitizer '$sanitizer' needs the nightly toolchain, which is not installed"
fi

cd "$root/fuzz"
if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo $toolchain fuzz list)
fi
[ ${#targets[@]} -gt 0 ] || { echo "fuzz: no targets" >&2; exit 1; }

if [ "${FUZZ_FULL:-0}" = 1 ]; then
  limit=(-runs="${FUZZ_RUNS:-10000000}")
  [ -n "${FUZZ_SECONDS:-}" ] && limit+=(-max_total_time="$FUZZ_SECONDS")
  mode="full: ${FUZZ_RUNS:-10000000} executions per target"
elif [ "${CI:-}" = true ]; then
  limit=(-max_total_time="${FUZZ_SECONDS:-20}")
  mode="smoke: ${FUZZ_SECONDS:-20} s per target"
else
  limit=(-max_total_time="${FUZZ_SECONDS:-60}")
  mode="${FUZZ_SECONDS:-60} s per target"
fi
jobs=${FUZZ_JOBS:-1}

echo "fuzz: building ${#targets[@]} targets (toolchain ${toolchain:-stable}, sanitizer $sanitizer)"
if [ $# -gt 0 ]; then
  for t in "${targets[@]}"; do cargo $toolchain fuzz build -s "$sanitizer" "$t"; done
else
  cargo $toolchain fuzz build -s "$sanitizer"
fi
bin_dir=$root/fuzz/target/x86_64-unknown-linux-gnu/release

work=$(mktemp -d /tmp/smc-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "fuzz: $mode; work dir $work"

summary=()
failed=()
for t in "${targets[@]}"; do
  corpus=$root/fuzz/corpus/$t
  seeds=$root/fuzz/seeds/$t
  mkdir -p "$work/$t/corpus" "$work/$t/artifacts"
  # The run writes what it finds into a scratch copy, never into the repo.
  [ -d "$corpus" ] && cp -r "$corpus/." "$work/$t/corpus/"
  dirs=("$work/$t/corpus")
  [ -d "$seeds" ] && dirs+=("$seeds")
  echo "== fuzz $t"
  par=()
  [ "$jobs" -gt 1 ] && par=(-jobs="$jobs" -workers="$jobs")
  set +e
  (cd "$work/$t" && "$bin_dir/$t" "${limit[@]}" "${par[@]}" -print_final_stats=1 \
      -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$work/$t/artifacts/" \
      "${dirs[@]}") >"$work/$t/log" 2>&1
  rc=$?
  set -e
  if [ "$jobs" -gt 1 ]; then cat "$work/$t"/fuzz-*.log >>"$work/$t/log" 2>/dev/null || true; fi
  # (A crashed run prints no final stats: count what the log has, never fail here.)
  execs=$({ grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$t/log" || true; } |
    awk '{s+=$2} END {print s+0}')
  secs=$({ grep -o 'Done [0-9]* runs in [0-9]* second' "$work/$t/log" || true; } |
    awk '{s+=$5} END {print s+0}')
  # With -jobs a crashed worker may not set the exit code: an artifact is a failure too.
  if [ -n "$(ls -A "$work/$t/artifacts")" ] && [ $rc -eq 0 ]; then rc=1; fi
  if [ $rc -ne 0 ]; then
    tail -40 "$work/$t/log" >&2
    for a in "$work/$t"/artifacts/*; do
      [ -e "$a" ] || continue
      echo "fuzz: $t: failing input $(basename "$a") ($(stat -c %s "$a") bytes):" >&2
      od -An -tx1 -v "$a" | tr -d ' \n' >&2
      echo >&2
      mkdir -p "$root/fuzz/artifacts/$t"
      cp "$a" "$root/fuzz/artifacts/$t/"
    done
    echo "fuzz: FAIL $t after $execs executions (inputs kept in fuzz/artifacts/$t)" >&2
    failed+=("$t")
    summary+=("$t: FAILED after $execs executions")
    continue
  fi
  if [ "${FUZZ_UPDATE_CORPUS:-0}" = 1 ]; then
    # Keep a small set of inputs that covers every edge corpus and seeds cover (edges
    # only, without hit counts and comparison features: tens to hundreds of files).
    mkdir -p "$work/$t/min"
    "$bin_dir/$t" -merge=1 -use_counters=0 -use_cmp=0 -rss_limit_mb=2048 \
      "$work/$t/min" "$work/$t/corpus" "${dirs[@]:1}" \
      >"$work/$t/merge.log" 2>&1 || { tail -20 "$work/$t/merge.log" >&2; exit 1; }
    rm -rf "$corpus"
    mkdir -p "$corpus"
    cp "$work/$t/min/." "$corpus/" -r
    echo "fuzz: $t: fuzz/corpus/$t now has $(ls "$corpus" | wc -l) inputs"
  fi
  summary+=("$t: $execs executions in ${secs}s, corpus $(ls "$work/$t/corpus" | wc -l) inputs")
  echo "fuzz: $t: $execs executions"
done

echo "== fuzz summary ($mode)"
printf '  %s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
