#!/usr/bin/env bash
# Smoke run of every cargo-fuzz target (scripts/fuzz.sh) from the corpora kept in
# fuzz/corpus: FUZZ_SECONDS (default 20) per target, so a regression that the corpus
# or a short run reaches fails the suite. Long runs: FUZZ_FULL=1 scripts/fuzz.sh
# (README "Fuzzing"). Skips (77) when cargo-fuzz cannot be installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
FUZZ_SECONDS=${FUZZ_SECONDS:-20} exec scripts/fuzz.sh
