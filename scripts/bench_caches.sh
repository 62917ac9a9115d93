#!/usr/bin/env bash
# The step-cache measurements of docs/caches.md: every policy composed with the exact cache on
# the built-in FLUX.2 'small' (Klein KV rules, one reference) and Qwen-Image-2.1 'qwen21-small'
# (CFG), against no step cache and against uncached, in one run each. Writes the printed tables
# and JSON to the folder given (default: bench-caches/). Takes about half an hour on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-caches}
mkdir -p "$out"
flowkv=build/tools/flowkv
[ -x "$flowkv" ] || scripts/setup.sh
common=(--runs 3 --grid 16x16 --ref-grid 16x16 --text-tokens 64)

# The control: TaylorSeer alone vs TaylorSeer + reference KV at 4 and 8 (and 28) steps.
"$flowkv" bench --builtin small --steps 4,8,28 --refs 1 "${common[@]}" --cache kv --cache taylorseer \
  --json "$out/klein_taylorseer.json" | tee "$out/klein_taylorseer.txt"
"$flowkv" bench --builtin small --steps 4,8 --refs 1 "${common[@]}" --cache kv \
  --cache taylorseer:interval=2 --json "$out/klein_taylorseer_i2.json" | tee "$out/klein_taylorseer_i2.txt"

# Every policy with the reference cache. FBC and DBCache thresholds are raised to 1: random
# weights change their residuals by ~60-100% per step, so the defaults never fire.
for spec in fbcache:threshold=1 dbcache:fn=2,bn=1,threshold=1,warmup=2 teacache magcache:ratios=flux1 \
            fora pab fastercache; do
  name=${spec%%:*}
  "$flowkv" bench --builtin small --steps 8,28 --refs 1 "${common[@]}" --cache kv --cache "$spec" \
    --json "$out/klein_$name.json" | tee "$out/klein_$name.txt"
done

# Qwen-Image-2.1 with CFG: FasterCache's unconditional skipping, and a block-level policy.
for spec in fastercache taylorseer magcache:ratios=flux1; do
  name=${spec%%:*}
  "$flowkv" bench --family qwen21 --builtin qwen21-small --steps 8,28 --refs 1 --cfg 1 \
    "${common[@]}" --cache kv --cache "$spec" --json "$out/qwen21_$name.json" | tee "$out/qwen21_$name.txt"
done
