#!/usr/bin/env bash
# Picked up by up.sh: a JSON Schema validator, Debian's python3-jsonschema (draft 2020-12), which
# tests/it/schema.rs runs beside `mesh-host check` over a corpus of declarations, so the schema
# `mesh-host schema` prints is held to what the agent accepts. Idempotent.
set -euo pipefail

if python3 -c 'import jsonschema; jsonschema.Draft202012Validator' 2>/dev/null; then
  exit 0
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-jsonschema >/dev/null
python3 -c 'import jsonschema; jsonschema.Draft202012Validator'
