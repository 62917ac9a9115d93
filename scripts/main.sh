#!/usr/bin/env bash
# Sets up (scripts/setup.sh), builds, and runs the main job on the built-in default model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build/tools/flowkv forward "$@"
