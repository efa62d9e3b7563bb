#!/usr/bin/env bash
# The whole test suite, as CI runs it: set up the real components, then the quality gates and
# every test. Run as root on a Debian 12 machine: `tests/run.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."

tests/testbed/up.sh

echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== tests"
# nextest runs each test in its own process, in parallel, and reports slow ones; plain cargo
# test is the fallback where it is not installed.
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast --failure-output final
else
  cargo test --workspace --no-fail-fast
fi
echo "== fuzz (short)"
# The four fuzz targets, 15 s each, from the seeds and what earlier runs kept; the long runs'
# figures are in RELIABILITY.md. The first build of the instrumented targets takes about 13
# minutes on two cores.
fuzz/run.sh 15
