#!/usr/bin/env bash
# Picked up by up.sh: what the VM power-loss lane (tests/powerloss/vm/run.sh) runs on the host:
# QEMU (without its recommends, whose install fails here), cpio for the initramfs, and the
# filesystems' tools it copies into the guest. The lane fetches Debian's kernel and busybox
# itself, into /var/lib/mesh-host-testbed/powerloss/, and installs neither. Idempotent.
set -euo pipefail
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v cpio >/dev/null || need+=(cpio)
command -v mkfs.xfs >/dev/null || need+=(xfsprogs)
command -v mkfs.btrfs >/dev/null || need+=(btrfs-progs)
command -v dmsetup >/dev/null || need+=(dmsetup)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
