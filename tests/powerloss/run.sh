#!/usr/bin/env bash
# The power-loss lanes, one command (tests/powerloss/README.md). Root.
#   tests/powerloss/run.sh [--mutant] [--short] [STATES]
# STATES: sync boundaries checked per workload in the FUSE lane (each at two crash states: all
# that was not durable dropped, and a seeded random subset kept), a tenth of them served again
# and applied on; passed on to the VM lane. --mutant: the same with the build that never
# syncs, which must end with losses (MESH_HOST_POWERLOSS_MUTANT names one already built, as
# tests/run.sh does). --short: the VM lane's short run (ext4, 200 files), as CI runs it.
# Ends with one line:
#   powerloss: N crash states checked, T torn, L lost, A ahead
set -euo pipefail
cd "$(dirname "$0")/../.."

mutant=0
short=0
states=40
for arg in "$@"; do
  case "$arg" in
    --mutant) mutant=1 ;;
    --short) short=1 ;;
    *[!0-9]* | '') echo "usage: tests/powerloss/run.sh [--mutant] [--short] [STATES]" >&2; exit 2 ;;
    *) states=$arg ;;
  esac
done
[ -e /dev/fuse ] || { echo "powerloss: /dev/fuse is missing: modprobe fuse (the lane runs as root)" >&2; exit 1; }

target=${CARGO_TARGET_DIR:-target}
if [ "$mutant" = 1 ] && [ -n "${MESH_HOST_POWERLOSS_MUTANT:-}" ]; then
  agent=$MESH_HOST_POWERLOSS_MUTANT
elif [ "$mutant" = 1 ]; then
  # A target dir of its own: the mutant never overwrites the real binary the other tests run.
  cargo build --quiet --features powerloss-mutant --bin mesh-host --target-dir "$target/powerloss-mutant"
  agent=$target/powerloss-mutant/debug/mesh-host
else
  cargo build --quiet --bin mesh-host
  agent=$target/debug/mesh-host
fi
cargo build --quiet -p mesh-host-powerloss

out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$target/debug/powerloss-fuse" --agent "$agent" --boundaries "$states" --served $((states / 10 + 1)) | tee -a "$out"

if [ -x tests/powerloss/vm/run.sh ]; then
  vm_args=()
  [ "$mutant" = 1 ] && vm_args+=(--mutant)
  if [ "$short" = 1 ]; then vm_args+=(--short); else vm_args+=("$states"); fi
  tests/powerloss/vm/run.sh "${vm_args[@]}" | tee -a "$out"
else
  echo "powerloss: lane=vm skipped: tests/powerloss/vm/run.sh is not in this tree"
fi

field() { grep '^powerloss: lane=' "$out" | grep -o " $1=[0-9]*" | cut -d= -f2 | awk '{s += $1} END {print s + 0}'; }
n=$(field states); t=$(field torn); l=$(field lost); a=$(field ahead)
# Temporary files a crash left that the next apply did not remove: a finding of this lane once
# (RELIABILITY.md, "Temporaries that outlived their journal lines"), a failure of the real build.
temps=$(field temps)
echo "powerloss: ${n:-0} crash states checked, ${t:-0} torn, ${l:-0} lost, ${a:-0} ahead"
if [ "$mutant" = 1 ]; then
  [ $((t + l)) -gt 0 ] || { echo "powerloss: the mutant lost nothing: the lanes cannot see a loss" >&2; exit 1; }
else
  [ $((t + l + a)) -eq 0 ] || exit 1
  ! grep -q ' other=[1-9]' "$out" || { echo "powerloss: a state's next apply failed or counted drift (above)" >&2; exit 1; }
  [ "${temps:-0}" -eq 0 ] || { echo "powerloss: $temps temporary files a crash left were still there after the next apply (above)" >&2; exit 1; }
fi
