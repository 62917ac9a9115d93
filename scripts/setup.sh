#!/usr/bin/env bash
# One-time set-up on a fresh Debian machine, then an incremental build. Safe to run again:
# packages already installed are skipped, and the build only recompiles what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/packages.sh
install_missing "${FLOWKV_PACKAGES[@]}" clang-format

build_type=${FLOWKV_BUILD_TYPE:-Release}
if [[ ! -f build/build.ninja ]]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="$build_type" >/dev/null
fi
cmake --build build
# The server tests' clients (the openai package, Pillow; pinned in python/clients/requirements.txt).
# Without PyPI the tests server.openai_clients and server.resident_pipeline are skipped, not failed.
python/clients/setup_venv.sh || echo "setup.sh: python/clients/.venv not created; the server.* client tests will be skipped"
