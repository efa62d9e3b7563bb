#!/usr/bin/env bash
# Picked up by up.sh: /dev/fuse, for the FUSE power-loss lane (tests/it/powerloss.rs,
# tests/powerloss/). The lane's server is the `fuser` crate without libfuse, mounting through
# the kernel as root, so no package is needed: only the kernel's fuse module. Idempotent.
set -euo pipefail
if [ ! -e /dev/fuse ]; then
  modprobe fuse
fi
[ -e /dev/fuse ] || { echo "testbed: /dev/fuse is missing and modprobe fuse did not make it" >&2; exit 1; }
