"""The built-in model's showcase cases: held-out digits (never trained on), as PNG references and
ground-truth answers, with the manifest `flowkv showcase` and the tests read.

    python3 python/train/make_cases.py --out assets/tiny-klein-kv/cases

Needs numpy and pillow only (no torch). Two runs write identical files.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil

import numpy as np
from PIL import Image

import data

HERE = os.path.dirname(os.path.abspath(__file__))

# (task, count); every case has one right answer (text to image: the class's prototype).
PLAN = [("text", 4), ("recolour", 4), ("background", 3), ("compose", 3)]


def save_png(img: np.ndarray, path: str) -> None:
    # No metadata chunks (no time stamps): the same pixels give the same bytes.
    Image.fromarray(img).save(path, optimize=False, compress_level=9)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "..", "..", "assets", "tiny-klein-kv",
                                                  "cases"))
    ap.add_argument("--cache", default=os.path.join(HERE, ".cache"))
    ap.add_argument("--seed", type=int, default=2026)
    a = ap.parse_args()
    all_digits = data.load_digits(a.cache)
    digits = data.split(all_digits, held_out=True)
    protos = data.prototypes(data.split(all_digits, held_out=False))
    rng = np.random.default_rng(a.seed)
    for sub in ("refs", "truth"):  # no stale pictures of an earlier plan
        shutil.rmtree(os.path.join(a.out, sub), ignore_errors=True)
        os.makedirs(os.path.join(a.out, sub))
    cases = []
    for task, count in PLAN:
        for i in range(count):
            name = f"{task}-{i + 1}"
            prompt, refs, target = data.make_sample(rng, digits, task, protos)
            ref_paths = []
            for k, r in enumerate(refs):
                p = f"refs/{name}-{k + 1}.png"
                save_png(r, os.path.join(a.out, p))
                ref_paths.append(p)
            truth = f"truth/{name}.png"
            save_png(target, os.path.join(a.out, truth))
            case = {"name": name, "task": task, "prompt": prompt}
            h, w = target.shape[:2]
            if (w, h) != (data.SIZE, data.SIZE):
                case["size"] = [w, h]  # compose: 128x64
            case.update(references=ref_paths, truth=truth)
            cases.append(case)
    manifest = {"size": [data.SIZE, data.SIZE], "steps": 8, "seed": 0, "cases": cases}
    with open(os.path.join(a.out, "cases.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {a.out}")


if __name__ == "__main__":
    main()
