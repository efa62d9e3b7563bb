#!/usr/bin/env bash
# The Debian 12 tree both nspawn machines start from (systemd.sh's mesh-host-testbed and
# firewalld.sh's mesh-host-fw): debootstrapped once, into a base tree kept beside them, and
# copied for each machine (cp --reflink=auto: a clone on btrfs or XFS, a plain copy on ext4),
# so that a fresh machine pays one debootstrap, not two (docs/testing.md, "How long the suite
# takes").
#
#   tests/testbed/debian.sh DEST    DEST made a copy of the base tree (the base made first, once)
#
# MESH_HOST_TESTBED_BASE moves the base tree (default /var/lib/machines/.mesh-host-debian-12: a
# name machinectl hides, on the machines' own filesystem, so a reflink can share its blocks).
# Runs as root. A marker in the base says it is whole and with which packages; a base without
# it, or made for other packages, is made again. Two machines set up at once take turns (flock).
set -euo pipefail

DEST=${1:?usage: $0 DEST}
BASE=${MESH_HOST_TESTBED_BASE:-/var/lib/machines/.mesh-host-debian-12}
SUITE=bookworm
INCLUDE=systemd,dbus,systemd-sysv
MARKER=$BASE/.mesh-host-debian-base
WANT="$SUITE minbase $INCLUDE"
LOG=/run/mesh-host-debian-base.debootstrap.log

now_us() { local t=${EPOCHREALTIME/./}; echo "${t#0}"; }
t0=$(now_us)
elapsed() { local d=$(( $(now_us) - t0 )); printf '%d.%01ds' $((d / 1000000)) $(((d % 1000000) / 100000)); }
say() { echo "testbed debian: $* ($(elapsed))"; }

mkdir -p "$(dirname "$BASE")" /run
exec 9>"$BASE.lock"
flock 9

if [[ ! -f $MARKER || $(cat "$MARKER") != "$WANT" ]]; then
  rm -rf "$BASE"
  debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$BASE" http://deb.debian.org/debian \
    >"$LOG" 2>&1 || { tail -20 "$LOG"; rm -rf "$BASE"; exit 1; }
  # debootstrap's package cache: the machines never install from it, and each copy would carry it.
  rm -f "$BASE"/var/cache/apt/archives/*.deb
  echo "$WANT" >"$MARKER"
  say "debootstrapped the base tree $BASE"
fi

rm -rf "$DEST"
mkdir -p "$DEST"
cp -a --reflink=auto "$BASE/." "$DEST/"
rm -f "$DEST/.mesh-host-debian-base"
say "copied the base tree to $DEST"
