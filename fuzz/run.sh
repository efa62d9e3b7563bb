#!/usr/bin/env bash
# Runs the fuzz targets one after the other, each for SECONDS (15 by default), at low priority:
# `fuzz/run.sh [SECONDS] [TARGET...]`. The CI path of tests/run.sh runs all five for 15 s each.
#
# cargo-fuzz passes rustc nightly flags (-Z sanitizer, coverage passes). No nightly toolchain can
# be installed here, and the stable one accepts those flags with RUSTC_BOOTSTRAP=1, which is
# set for these builds only. Each target starts from what earlier runs kept (corpus/, not
# committed) and the committed seeds (seeds/: the declarations of the refusal snapshots and
# deploy/examples, cron expressions of the tests, env-files, stores, manifests, signatures
# and allowed_signers lines). A crash stops the script
# with libFuzzer's exit code, and its input is in artifacts/TARGET/.
set -euo pipefail
cd "$(dirname "$0")"

# FUZZ_SANITIZER: address (the default, for the long runs) or none. FUZZ_DEV=1 builds without
# optimisation. CI sets both: still coverage-guided, with debug assertions and overflow checks,
# and the targets build in minutes on two cores instead of about 13 for one (the first four
# took about 3; measured before the manifest target).
build=(--sanitizer "${FUZZ_SANITIZER:-address}")
if [ "${FUZZ_DEV:-0}" = 1 ]; then
  build+=(--dev)
fi
seconds=${1:-15}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(declaration cron env_file store manifest)
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
  # A debug build of cargo-fuzz installs in about half the time of a release one.
  cargo install --locked --debug cargo-fuzz@0.13.2
fi
export RUSTC_BOOTSTRAP=1

mkdir -p logs
for t in "${targets[@]}"; do
  case $t in
    declaration | store) options=(-dict=json.dict -max_len=65536) ;;
    cron) options=(-max_len=256) ;;
    *) options=(-max_len=4096) ;;
  esac
  mkdir -p "corpus/$t" "artifacts/$t"
  echo "== fuzz $t for ${seconds}s"
  # -timeout: one input taking 10 s is a hang. -rss_limit_mb (and the malloc limit it sets):
  # more than 2 GiB for inputs of at most 64 KiB is memory out of bounds.
  nice -n 19 cargo fuzz run "${build[@]}" "$t" "corpus/$t" "seeds/$t" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="artifacts/$t/" "${options[@]}" >"logs/$t.log" 2>&1 || {
    code=$?
    tail -n 60 "logs/$t.log"
    echo "fuzz: $t failed (exit $code); the input is in fuzz/artifacts/$t/"
    exit "$code"
  }
  grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' "logs/$t.log" || true
done
