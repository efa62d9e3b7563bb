#!/usr/bin/env bash
# Picked up by up.sh: the reference `age` tool (Debian package `age`), which the secrets tests
# use to seal values mesh-host opens and to open values mesh-host seals. Idempotent.
set -euo pipefail
if command -v age >/dev/null && command -v age-keygen >/dev/null; then
  exit 0
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq age
age --version
