#!/usr/bin/env bash
# Picked up by up.sh: Docker and Podman with the test image. The work is docker.sh's, which can
# also be run alone.
exec bash "$(dirname "$0")/docker.sh"
