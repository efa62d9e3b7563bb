#!/usr/bin/env bash
# Picked up by up.sh, after 20-docker.sh: a container registry on loopback, for the tests of
# images made present at apply (pulled when absent, by tag and by digest). Idempotent: a second
# run finds it answering and only checks. On a fresh Debian 12 machine, as root.
#
# What it leaves running, in the background:
#   docker-registry (Debian's distribution registry) on 127.0.0.1:5055, storage under
#   /var/lib/mesh-host-testbed/registry, log /tmp/mesh-host-registry.log
#   a second one on 127.0.0.1:5057 that asks for a login (user mh-parity, password
#   registry-pw-parity: a test's throw-away), storage .../registry-auth, log
#   /tmp/mesh-host-registry-auth.log
# and Podman told to speak plain HTTP to it (a registries.conf.d drop-in); Docker trusts a
# loopback registry without TLS by itself. The tests push what they pull (tests/it/docker/images.rs).
set -euo pipefail

ADDR=127.0.0.1:5055
DIR=/var/lib/mesh-host-testbed/registry
CONF=/run/mesh-host-testbed/registry.yml
LOG=/tmp/mesh-host-registry.log

# The package's own service would listen on :5000 under systemd; there is no systemd as PID 1
# here, and this script runs its own instance, on loopback only.
need=()
command -v docker-registry >/dev/null || need+=(docker-registry)
command -v curl >/dev/null || need+=(curl)
command -v htpasswd >/dev/null || need+=(apache2-utils)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

mkdir -p "$DIR" "$(dirname "$CONF")"
cat >"$CONF" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $DIR
  delete:
    enabled: true
http:
  addr: $ADDR
EOF

if ! curl -sf "http://$ADDR/v2/" >/dev/null 2>&1; then
  nohup docker-registry serve "$CONF" >"$LOG" 2>&1 &
  for _ in $(seq 1 100); do curl -sf "http://$ADDR/v2/" >/dev/null 2>&1 && break; sleep 0.1; done
  curl -sf "http://$ADDR/v2/" >/dev/null \
    || { echo "40-registry.sh: the registry did not answer on $ADDR; see $LOG" >&2; exit 1; }
fi

# The one that asks for a login: the registry reads bcrypt htpasswd files.
AUTH_ADDR=127.0.0.1:5057
AUTH_DIR=/var/lib/mesh-host-testbed/registry-auth
AUTH_CONF=/run/mesh-host-testbed/registry-auth.yml
mkdir -p "$AUTH_DIR"
[ -s "$AUTH_DIR/htpasswd" ] || htpasswd -Bbn mh-parity registry-pw-parity >"$AUTH_DIR/htpasswd"
cat >"$AUTH_CONF" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $AUTH_DIR/storage
http:
  addr: $AUTH_ADDR
auth:
  htpasswd:
    realm: mesh-host-testbed
    path: $AUTH_DIR/htpasswd
EOF
# /v2/ answers 401 to a stranger once it is up.
auth_up() { [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$AUTH_ADDR/v2/")" = 401 ]; }
if ! auth_up; then
  nohup docker-registry serve "$AUTH_CONF" >/tmp/mesh-host-registry-auth.log 2>&1 &
  for _ in $(seq 1 100); do auth_up && break; sleep 0.1; done
  auth_up || { echo "40-registry.sh: the registry with a login did not answer on $AUTH_ADDR; see /tmp/mesh-host-registry-auth.log" >&2; exit 1; }
fi

# Podman refuses plain HTTP unless the registry is listed as insecure.
mkdir -p /etc/containers/registries.conf.d
cat >/etc/containers/registries.conf.d/mesh-host-testbed.conf <<EOF
[[registry]]
location = "$ADDR"
insecure = true

[[registry]]
location = "$AUTH_ADDR"
insecure = true
EOF
echo "40-registry.sh: registries answer on http://$ADDR and (with a login) http://$AUTH_ADDR"
