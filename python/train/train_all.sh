#!/usr/bin/env bash
# The built-in model from scratch, as committed (assets/tiny-klein-kv, assets/tiny-klein-twin):
# 37 minutes on 2 cores (AVX-512 and AMX) with nothing else running; 45 minutes to over an hour
# on an AVX2 machine (docs/builtin-model.md).
# Each step is deterministic (fixed seeds).
#   1. tokenizer, text encoder, VAE (500 steps on random 32x32 crops: a quarter of the cost)
#   2. the VAE 2000 more steps on 32x32 crops of the digit (where the strokes are)
#   3. the VAE 600 more steps on whole 64x64 pictures (a VAE that saw only crops
#      reconstructs whole pictures about 10 dB worse: GroupNorm statistics and the mid-block
#      attention differ), then the training samples encoded once
#   4. the transformer under Klein KV's rules and its twin without them, side by side
#   5. the showcase cases, then both pipelines copied into assets/
set -euo pipefail
cd "$(dirname "$0")/../.."
py="${PYTHON:-python/train/.venv/bin/python}"
runs=python/train/runs
"$py" python/train/train.py --out $runs/kv --prepare-only --threads 2
"$py" python/train/train.py --out $runs/kv --components $runs/kv --prepare-only --threads 2 \
    --vae-continue 2000 --vae-batch 16 --vae-crop digit
"$py" python/train/train.py --out $runs/kv --components $runs/kv --prepare-only --threads 2 \
    --vae-continue 600 --vae-crop full
"$py" python/train/train.py --out $runs/kv --components $runs/kv --steps 1600 > $runs/kv.log 2>&1 &
"$py" python/train/train.py --out $runs/twin --rules none --components $runs/kv --steps 1600 \
    > $runs/twin.log 2>&1 &
wait
"$py" python/train/make_cases.py --out assets/tiny-klein-kv/cases
for m in kv twin; do
    dst=assets/tiny-klein-$m
    mkdir -p $dst
    for part in model_index.json scheduler text_encoder tokenizer transformer vae; do
        rm -rf "${dst:?}/$part" && cp -r $runs/$m/$part $dst/
    done
done
echo "wrote assets/tiny-klein-kv and assets/tiny-klein-twin"
