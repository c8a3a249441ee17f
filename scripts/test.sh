#!/usr/bin/env bash
# The one command that runs every test of smc-rs (README, second command).
# Installs what the tests need, then: formatting, lints, unit/property/
# integration tests, and the system tests under tests/system (network
# namespaces, tshark, QEMU kernel peers; each skips with a clear message
# when the machine cannot run it).
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy -p smc --all-targets --features tokio -- -D warnings
echo "== cargo test"
# libsmc_preload.so beside target/release/smc, for `smc run`: crates/preload/tests and
# tests/system/smc-run.sh preload it (the test would build it itself, with this
# package's own feature set: built here first, that is a no-op).
cargo build --release -p smc-preload
cargo test --workspace --release
echo "== cargo test (smc end to end over SMC-R-over-iWARP, the opt-in extension)"
SMC_RS_TEST_PROVIDER=iwarp cargo test --release -p smc --test e2e --test close --test leak --test timers
echo "== cargo test (smc, tokio feature)"
cargo test --release -p smc --features tokio --test tokio
echo "== system tests"
cargo build --release --workspace --bins
status=0
for t in tests/system/*.sh; do
  [ -e "$t" ] || continue
  echo "-- $t"
  set +e
  bash "$t"
  rc=$?
  set -e
  case $rc in
    0)  echo "PASS $t" ;;
    77) echo "SKIP $t" ;;
    *)  echo "FAIL $t (exit $rc)"; status=1 ;;
  esac
done
exit $status
