#!/usr/bin/env bash
# Picked up by up.sh: firewalld in a systemd-nspawn machine with a network of its own.
exec bash "$(dirname "$0")/firewalld.sh" up
