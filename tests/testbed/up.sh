#!/usr/bin/env bash
# Installs and starts every real component the integration tests need, on a fresh Debian 12
# machine, as root. Idempotent: a second run finds everything up and returns quickly.
# Each component has its own script beside this one; this one runs them all.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)

if [ "$(id -u)" != 0 ]; then
  echo "tests/testbed/up.sh: the tests run as root (useradd, chown, Docker, systemd)" >&2
  exit 1
fi

# Tools the filesystem tests call as a person at the machine would.
need=()
command -v useradd >/dev/null || need+=(passwd)
command -v flock >/dev/null || need+=(util-linux)
command -v chown >/dev/null || need+=(coreutils)
# The reliability battery mounts small filesystems (tests/it/faults.rs, tests/reliability/).
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
command -v losetup >/dev/null || need+=(mount)
# Signed declarations are signed and cross-checked with OpenSSH's own (tests/it/signed.rs).
command -v ssh-keygen >/dev/null || need+=(openssh-client)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi

for component in "$here"/[0-9][0-9]-*.sh; do
  [ -e "$component" ] || continue
  echo "testbed: $(basename "$component")"
  bash "$component"
done

echo "testbed: up in $(( $(date +%s) - start )) s"
