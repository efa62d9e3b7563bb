#!/usr/bin/env bash
# Builds the Debian package into $CARGO_TARGET_DIR/debian (target/debian by default).
#   deploy/deb/build.sh           a release build (LTO: several minutes on two cores), packaged
#   deploy/deb/build.sh --debug   the debug build, packaged: what the tests install, in seconds
#                                 once the tests have built it
# cargo-deb itself: `cargo install --locked cargo-deb`. The man page and the completions are
# written by the binary (clap_mangen, clap_complete) before cargo deb packs them, so they always
# describe the binary they ship with.
set -euo pipefail
cd "$(dirname "$0")/../.."
target=${CARGO_TARGET_DIR:-target}
if [ "${1:-}" = --debug ]; then
  cargo build --locked --bin mesh-host
  dir=$target/debug
  # Stripped and lightly compressed: a debug binary is large, and xz takes minutes on it.
  profile=(--profile dev)
  fast=(--fast)
else
  cargo build --locked --release --bin mesh-host
  dir=$target/release
  profile=()
  # The binary stripped (48 MB to a few), its line tables, which panics' backtraces use, in a
  # mesh-host-dbgsym package beside it, as Debian ships debug symbols.
  fast=(--dbgsym)
fi
assets=$dir/deb-assets
rm -rf "$assets"
mkdir -p "$assets"
"$dir/mesh-host" man | gzip -9n >"$assets/mesh-host.1.gz"
"$dir/mesh-host" completions bash >"$assets/mesh-host.bash"
"$dir/mesh-host" completions zsh >"$assets/_mesh-host"
"$dir/mesh-host" completions fish >"$assets/mesh-host.fish"
cargo deb --no-build --locked "${profile[@]}" "${fast[@]}"
