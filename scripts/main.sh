#!/usr/bin/env bash
# Sets up (scripts/setup.sh), builds, and runs the main job on the built-in model
# (assets/tiny-klein-kv, trained by python/train/train.py under FLUX.2 Klein 9B KV's rules):
# its showcase cases (pictures from prompts, edits of held-out digits with computed right
# answers), each uncached and with the exact reference cache (bit-identical), and each step
# cache at its defaults. Writes the PNGs and out/showcase/report.html (pictures side by side,
# the speed table, a speed-versus-quality plot) and prints where. About 30 s here (3 timing
# rounds per configuration, the fastest kept; --runs 1: about 11 s, a noisier table).
# Extra arguments go to `flowkv showcase` (e.g. --sweep full, --out DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/tools/flowkv showcase --model assets/tiny-klein-kv \
    --cases assets/tiny-klein-kv/cases/cases.json --out out/showcase "$@"
