#!/usr/bin/env bash
# The kill rounds of the reliability battery, in full (RELIABILITY.md): 100 rounds over 10,000
# files of 1 KiB in 1,000 directories, on a fresh loop-mounted ext4, killed at random moments
# and aborted at the failpoints. As root (mount, mkfs.ext4). About 20 minutes with a debug build
# on 2 cores (2026-11-30); less with --release, which first builds with fat LTO.
#
#   tests/reliability/kill-rounds.sh [--release] [REPORT.json]
#
# Any MESH_HOST_KILL_* setting in the environment wins over the ones here (see the comment at
# the top of tests/reliability/kill_rounds.rs): MESH_HOST_KILL_SEED replays a run.
set -euo pipefail
cd "$(dirname "$0")/../.."

profile=()
if [ "${1:-}" = "--release" ]; then
  profile=(--release)
  shift
fi
report="${1:-target/kill-rounds.json}"
mkdir -p "$(dirname "$report")"

if [ "$(id -u)" != 0 ]; then
  echo "kill-rounds.sh: run as root (the tree is a loop-mounted ext4 made for the run)" >&2
  exit 1
fi

export MESH_HOST_KILL_ROUNDS="${MESH_HOST_KILL_ROUNDS:-100}"
export MESH_HOST_KILL_FILES="${MESH_HOST_KILL_FILES:-10000}"
export MESH_HOST_KILL_FAILPOINTS="${MESH_HOST_KILL_FAILPOINTS:-batch-staged,batch-renamed,store-write}"
export MESH_HOST_KILL_FAILPOINT_EVERY="${MESH_HOST_KILL_FAILPOINT_EVERY:-4}"
export MESH_HOST_KILL_DIR="${MESH_HOST_KILL_DIR:-loop}"
export MESH_HOST_KILL_REPORT="$report"

log="${report%.json}.log"
echo "kill rounds: $MESH_HOST_KILL_ROUNDS rounds over $MESH_HOST_KILL_FILES files; figures in $report, every round in $log"
status=0
cargo test "${profile[@]}" --test kill_rounds -- --nocapture 2>&1 | tee "$log" || status=$?
echo "figures: $report"
exit "$status"
