#!/usr/bin/env bash
# The step-cache table of docs/caches.md, on the built-in trained model (assets/tiny-klein-kv):
#   1. `flowkv calibrate` fits TeaCache's polynomial and MagCache's ratios on its showcase cases
#      (8 steps, as the showcase runs);
#   2. the sweep: `--sweep full` (every step cache at its defaults and two other settings, alone
#      and with the exact cache; TaylorSeer alone and with it at 4, 8 and 28 steps) plus the
#      fitted TeaCache and MagCache, alone and with the exact cache; then every step cache at
#      its three settings alone at 28 steps (label "...@28"), and MeanCache's schedules searched
#      by `flowkv calibrate --policy meancache` (8 steps: budgets 3 and 5; 28 steps: 8 and 12);
#   3. `flowkv showcase` runs it: PSNR/SSIM against the ground truth and against uncached.
# Writes calibration.json, sweep.json, table.md and the report into the folder given (default
# out/caches-trained).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/caches-trained}
mkdir -p "$out"
flowkv=build/tools/flowkv
[ -x "$flowkv" ] || scripts/setup.sh
model=assets/tiny-klein-kv
cases=$model/cases/cases.json

"$flowkv" calibrate --model "$model" --cases "$cases" --json "$out/calibration.json"
"$flowkv" calibrate --model "$model" --cases "$cases" --policy meancache --budget 3 --budget 5 \
  --json "$out/meancache8.json" > "$out/meancache8.log" 2>&1
"$flowkv" calibrate --model "$model" --cases "$cases" --steps 28 --policy meancache --budget 8 \
  --budget 12 --json "$out/meancache28.json" > "$out/meancache28.log" 2>&1
"$flowkv" showcase --model "$model" --cases "$cases" --sweep full --write-sweep "$out/full.json" \
  > /dev/null
python3 - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
sweep = json.load(open(f"{out}/full.json"))
cal = json.load(open(f"{out}/calibration.json"))
for name in ("teacache", "magcache"):
    spec = cal[name]["spec"]
    if not spec:
        sys.exit(f"calibrate fitted no {name}: {cal[name].get('problem', '')}")
    sweep.append({"label": f"{name} (fitted here)", "caches": [spec]})
    sweep.append({"label": f"kv+{name} (fitted here)", "caches": ["kv", spec]})
# Every step cache's three settings at 28 steps too (alone; "= without kv" is shown at 8).
labels = {c["label"] for c in sweep}
for c in [c for c in sweep if "steps" not in c and c["caches"] and c["caches"][0] != "kv"
          and "(fitted here)" not in c["label"] and c["label"] + "@28" not in labels]:
    sweep.append({"label": c["label"] + "@28", "caches": c["caches"], "steps": 28})
# MeanCache's searched schedules.
for steps in (8, 28):
    found = json.load(open(f"{out}/meancache{steps}.json"))
    for sched in found["meancache"]["schedules"]:
        spec = sched["spec"]
        entry = {"label": f"meancache budget {sched['budget']} (searched here)@{steps}",
                 "caches": [spec]}
        if steps != 8:
            entry["steps"] = steps
        else:
            entry["label"] = entry["label"][:-2]
        sweep.append(entry)
json.dump(sweep, open(f"{out}/sweep.json", "w"), indent=1)
EOF
"$flowkv" showcase --model "$model" --cases "$cases" --sweep "$out/sweep.json" --out "$out" \
  --markdown "$out/table.md"
echo "wrote $out/table.md, $out/report.html and $out/calibration.json"
