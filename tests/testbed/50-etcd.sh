#!/usr/bin/env bash
# Picked up by up.sh: one etcd member on loopback, for the fleet tests (issue 14: declarations
# and status through etcd). Idempotent: a second run finds it answering and only checks. On a
# fresh Debian 12 machine, as root.
#
# What it leaves running, in the background:
#   etcd (Debian's etcd-server 3.4) serving clients on 127.0.0.1:23790 and peers on
#   127.0.0.1:23800, data under /var/lib/mesh-host-testbed/etcd, log /tmp/mesh-host-etcd.log
# and etcdctl (etcd-client) for the tests to look at etcd as an operator would.
# The ports are not etcd's defaults (2379/2380) so a developer's own etcd is left alone.
set -euo pipefail

CLIENT=127.0.0.1:23790
PEER=127.0.0.1:23800
DIR=/var/lib/mesh-host-testbed/etcd
LOG=/tmp/mesh-host-etcd.log

need=()
command -v etcd >/dev/null || need+=(etcd-server)
command -v etcdctl >/dev/null || need+=(etcd-client)
command -v curl >/dev/null || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
  # The package's own service must not start (no systemd as PID 1 here, and it would take the
  # default ports): a policy says so for the install where none is in place already.
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

healthy() { curl -sf "http://$CLIENT/health" 2>/dev/null | grep -q '"health":"true"'; }

if ! healthy; then
  mkdir -p "$DIR"
  chmod 700 "$DIR"
  # setsid: the member outlives this script and up.sh, which must return.
  setsid nohup etcd --name mesh-host-testbed --data-dir "$DIR" \
    --listen-client-urls "http://$CLIENT" --advertise-client-urls "http://$CLIENT" \
    --listen-peer-urls "http://$PEER" --initial-advertise-peer-urls "http://$PEER" \
    --initial-cluster "mesh-host-testbed=http://$PEER" \
    >"$LOG" 2>&1 </dev/null &
  for _ in $(seq 1 100); do healthy && break; sleep 0.1; done
  healthy || { echo "50-etcd.sh: etcd did not answer on $CLIENT; see $LOG" >&2; exit 1; }
fi
ETCDCTL_API=3 etcdctl --endpoints "http://$CLIENT" endpoint health
