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
if ! command -v cargo-deny >/dev/null 2>&1; then
  # A debug build installs in about half the time of a release one, and checks as well.
  cargo install --locked --debug cargo-deny@0.20.2
fi
cargo deny check licenses bans sources
echo "== cargo-deb (tests/it/operator.rs packages the debug build and installs it in the testbed)"
if ! cargo deb --version >/dev/null 2>&1; then
  cargo install --locked --debug cargo-deb@3.8.0
fi
echo "== the power-loss mutant (tests/powerloss/): the agent with every sync a no-op"
# Built here, in the suite's own target directory, so that only the root crate is compiled
# again for the feature (a target directory of its own would build every dependency a second
# time); the real binary is put back before any test runs. tests/it/powerloss.rs finds it
# through MESH_HOST_POWERLOSS_MUTANT.
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --quiet --features powerloss-mutant --bin mesh-host
mkdir -p "$target_dir/powerloss-mutant"
cp "$target_dir/debug/mesh-host" "$target_dir/powerloss-mutant/mesh-host"
cargo build --quiet --bin mesh-host
if cmp -s "$target_dir/debug/mesh-host" "$target_dir/powerloss-mutant/mesh-host"; then
  echo "tests/run.sh: the real binary was not put back after the mutant's build" >&2
  exit 1
fi
export MESH_HOST_POWERLOSS_MUTANT="$target_dir/powerloss-mutant/mesh-host"
echo "== the fleet harness's mutants (tests/robust/): one build, each mutant picked per run by MESH_HOST_MUTANT"
# As the power-loss mutant above: built for the feature, kept aside, the real binary put back;
# only the root crate is compiled again, once for every mutant (src/fleet/mod.rs, \`mutant\`).
cargo build --quiet --features robust-mutant --bin mesh-host
mkdir -p "$target_dir/robust-mutant" && cp "$target_dir/debug/mesh-host" "$target_dir/robust-mutant/mesh-host"
cargo build --quiet --bin mesh-host
cmp -s "$target_dir/debug/mesh-host" "$target_dir/robust-mutant/mesh-host" && { echo "tests/run.sh: the real binary was not put back after the fleet mutant's build" >&2; exit 1; }
export MESH_HOST_ROBUST_MUTANT="$target_dir/robust-mutant/mesh-host"
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
echo "== the fleet under faults, short (tests/robust/; the long run: RELIABILITY.md)"
# The checker's unit tests; a seeded schedule (75 s of operations and faults over 3 etcd members
# and 8 agents, a heal, 30 s of quiet: its seed printed, its history kept); then each mutant's
# directed schedule beside the same schedule on the real build. One at a time, about 5 minutes
# on two cores. The test binary and the real mesh-host are the ones built for the tests above.
SECONDS=0
MESH_HOST_ROBUST_SECS=75 cargo test --test robust -- --include-ignored --test-threads 1 --nocapture
echo "tests/run.sh: the fleet under faults took ${SECONDS} s"
echo "== power loss: both lanes, the VM lane short, real and mutant (tests/powerloss/)"
# The FUSE lane, and Debian's kernel under QEMU (TCG) with the agent on ext4 over
# dm-log-writes: every crash state checked. The real build must show nothing torn, lost or
# ahead, and no state whose next apply fails or counts drift; the mutant must show losses, in
# each lane (run.sh judges both sums; the VM lane's own is judged here).
tests/powerloss/run.sh --short
tests/powerloss/run.sh --short --mutant | tee /tmp/mesh-host-powerloss-mutant.out
awk '/^powerloss: lane=vm/ { for (i = 1; i <= NF; i++) if ($i ~ /^(torn|lost)=/) { split($i, kv, "="); s += kv[2] } }
     END { if (s == 0) { print "tests/run.sh: the VM lane saw no loss in the mutant: it cannot see one" > "/dev/stderr"; exit 1 } }' \
  /tmp/mesh-host-powerloss-mutant.out
echo "== fuzz (short)"
# The five fuzz targets, 15 s each, from the seeds and what earlier runs kept; the long runs'
# figures are in RELIABILITY.md. Here without AddressSanitizer and optimisation (still
# coverage-guided, with overflow checks): the long runs' build takes about 13 minutes on two
# cores, more than CI can spend; this one about 3.
FUZZ_SANITIZER=none FUZZ_DEV=1 fuzz/run.sh 15
