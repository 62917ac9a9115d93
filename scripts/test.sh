#!/usr/bin/env bash
# Sets up (scripts/setup.sh), builds, and runs every test. CI runs exactly this.
# Then hostile inputs: the fast subset under ASan + UBSan (scripts/sanitize.sh) and every fuzz
# target's saved crashes plus FLOWKV_FUZZ_SECONDS of fuzzing each (scripts/fuzz.sh; default 5,
# 0: replay the saved crashes only). Both use one clang build, build-san/ (scripts/san_build.sh):
# the sanitized library is compiled once, by the first. FLOWKV_SKIP_HOSTILE=1 skips both (a
# quick local run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir build --output-on-failure -j 2 "$@"
if [[ ${FLOWKV_SKIP_HOSTILE:-0} != 1 ]]; then
  scripts/sanitize.sh
  scripts/fuzz.sh "${FLOWKV_FUZZ_SECONDS:-5}"
fi
