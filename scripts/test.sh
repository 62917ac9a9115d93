#!/usr/bin/env bash
# Sets up (scripts/setup.sh), builds, and runs every test. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir build --output-on-failure -j 2 "$@"
