#!/usr/bin/env bash
# Sets up a real Docker engine and Podman for the container tests, on a fresh Debian 12
# machine, as root. Idempotent: run it twice and the second run only checks.
#
# What it leaves running, in the background:
#   dockerd, on Docker's default socket /var/run/docker.sock (log: /tmp/dockerd.log)
#   podman system service, on unix:///run/mesh-host-testbed/podman.sock (log: /tmp/podman-service.log)
# and an image `local/busybox:1` in both, imported from busybox-static (there is no registry).
set -euo pipefail

start=$(date +%s.%N)
step() { awk -v s="$start" -v n="$(date +%s.%N)" -v what="$1" 'BEGIN { printf "docker.sh: %-58s %6.2fs\n", what, n - s }'; }

PODMAN_DIR=/run/mesh-host-testbed
PODMAN_SOCK=$PODMAN_DIR/podman.sock
IMAGE=local/busybox:1

need=()
command -v dockerd >/dev/null || need+=(docker.io)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v podman >/dev/null || need+=(podman)
command -v curl >/dev/null || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
step "packages present"

# Debian's engine; /usr/local/bin/docker may be a newer client, which negotiates down.
if ! docker info >/dev/null 2>&1; then
  (cd / && exec nohup dockerd >/tmp/dockerd.log 2>&1) &
  for _ in $(seq 1 100); do docker info >/dev/null 2>&1 && break; sleep 0.1; done
  docker info >/dev/null 2>&1 || { echo "docker.sh: dockerd did not answer; see /tmp/dockerd.log" >&2; exit 1; }
fi
step "dockerd answers"

# A root filesystem holding busybox and the links tests use, imported as an image.
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
mkdir -p "$rootfs/bin" "$rootfs/tmp" "$rootfs/etc"
cp /bin/busybox "$rootfs/bin/busybox"
for tool in sh sleep cat env ls echo nc wget true false test grep printf kill; do
  ln -sf busybox "$rootfs/bin/$tool"
done
if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  tar -C "$rootfs" -c . | docker import -c 'ENV PATH=/bin' - "$IMAGE" >/dev/null
fi
step "docker has $IMAGE"

# Podman 4.3's default ulimits are higher than this machine lets a container have.
mkdir -p /etc/containers
conf=/etc/containers/containers.conf
if ! grep -q '^default_ulimits' "$conf" 2>/dev/null; then
  if grep -q '^\[containers\]' "$conf" 2>/dev/null; then
    sed -i '/^\[containers\]/a default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]' "$conf"
  else
    printf '[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n' >>"$conf"
  fi
fi
if ! podman image exists "$IMAGE" 2>/dev/null; then
  tar -C "$rootfs" -c . | podman import -q -c 'ENV PATH=/bin' - "$IMAGE" >/dev/null
fi
step "podman has $IMAGE"

mkdir -p "$PODMAN_DIR"
if ! curl -sf --unix-socket "$PODMAN_SOCK" http://d/_ping >/dev/null 2>&1; then
  rm -f "$PODMAN_SOCK"
  # From /: the service and every conmon it starts keep the directory they were started in,
  # and a checkout removed under them (a CI clone) makes conmon fail to start any container.
  (cd / && exec nohup podman system service --time=0 "unix://$PODMAN_SOCK" >/tmp/podman-service.log 2>&1) &
  for _ in $(seq 1 100); do [ -S "$PODMAN_SOCK" ] && curl -sf --unix-socket "$PODMAN_SOCK" http://d/_ping >/dev/null 2>&1 && break; sleep 0.1; done
  curl -sf --unix-socket "$PODMAN_SOCK" http://d/_ping >/dev/null \
    || { echo "docker.sh: podman's service did not answer; see /tmp/podman-service.log" >&2; exit 1; }
fi
step "podman answers on $PODMAN_SOCK"
echo "docker.sh: ready (MESH_HOST_TEST_PODMAN=unix://$PODMAN_SOCK)"
