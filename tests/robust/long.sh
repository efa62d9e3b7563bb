#!/usr/bin/env bash
# The fleet harness's long run (RELIABILITY.md, "The fleet under faults"): seeded schedules one
# after another, each of SECS seconds (240 by default) with its own seed (FIRST, FIRST+1, ...),
# until MINUTES (70 by default) have passed; every run's output in DIR/run-N.log, a line per
# run in DIR/long.log. Run as root after building the tests (`cargo build --tests`); the binaries
# are copied first, so builds in the same target directory may go on meanwhile.
#   tests/robust/long.sh [MINUTES] [SECS] [FIRST] [DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
minutes="${1:-70}" secs="${2:-240}" first="${3:-4200}" dir="${4:-/var/tmp/mesh-host-robust-long}"
target="${CARGO_TARGET_DIR:-$PWD/target}"
mkdir -p "$dir"
: >"$dir/long.log"
test_bin=$(cargo test --test robust --no-run --message-format=json 2>/dev/null |
  sed -n 's|.*"executable":"\([^"]*/deps/robust-[^"]*\)".*|\1|p' | tail -1)
[ -x "$test_bin" ] || { echo "long.sh: the robust test binary was not built" >&2; exit 1; }
cp "$test_bin" "$dir/robust"
cp "$target/debug/mesh-host" "$dir/mesh-host"
end=$(($(date +%s) + minutes * 60))
i=0
while [ "$(date +%s)" -lt "$end" ]; do
  i=$((i + 1))
  seed=$((first + i))
  rc=0
  MESH_HOST_ROBUST_BIN="$dir/mesh-host" MESH_HOST_ROBUST_SEED=$seed MESH_HOST_ROBUST_SECS=$secs \
    "$dir/robust" the_fleet_keeps --include-ignored --nocapture >"$dir/run-$i.log" 2>&1 || rc=$?
  echo "run $i seed $seed rc=$rc $(grep -E '^seed [0-9]+:|violation\(s\)' "$dir/run-$i.log" | tr '\n' ' ')" |
    tee -a "$dir/long.log"
  # The history is kept; the etcd members' data (their WAL preallocated) is not.
  h=$(grep -o 'history: /var/tmp/mesh-host-robust-[A-Za-z0-9]*' "$dir/run-$i.log" | head -1 | cut -d' ' -f2)
  [ -z "$h" ] || rm -rf "$h"/etcd-m?
done
echo "long.sh: $i runs; violations: $(grep -o '[0-9]* violation(s)' "$dir/long.log" | awk '{s += $1} END {print s + 0}')"
