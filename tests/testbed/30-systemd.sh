#!/usr/bin/env bash
# Picked up by up.sh: the systemd testbed (a Debian 12 tree booted with systemd-nspawn).
exec bash "$(dirname "$0")/systemd.sh" up
