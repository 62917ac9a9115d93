#!/usr/bin/env bash
# Sets up (scripts/setup.sh), builds, and runs the main job: the exact KV-cache benchmark on
# the built-in model, a reduced table (about a minute here). Extra arguments go to
# `flowkv bench` (e.g. --model PATH, or --steps 4,8,28 --refs 1,2,3 for the full table).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/tools/flowkv bench --steps 4,8 --refs 1,3 "$@"
