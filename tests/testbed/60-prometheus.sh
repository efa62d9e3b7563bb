#!/usr/bin/env bash
# Picked up by up.sh: promtool (Debian's `prometheus` package), which the tests use to check the
# live /metrics exposition (`promtool check metrics`) and the shipped alert rules (`promtool
# check rules`, `promtool test rules deploy/prometheus/*.test.yml`). Idempotent.
set -euo pipefail

if command -v promtool >/dev/null; then
  exit 0
fi
# Only promtool is wanted: the package's server must not start on the test machine. Where no
# policy says so already (a container image usually has one), one is put in place for the
# install and taken away after it.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
promtool --version | head -1
