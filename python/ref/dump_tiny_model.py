"""Golden pictures of the built-in model: diffusers 0.42.1 runs the committed pipelines
(assets/tiny-klein-kv: Flux2KleinKVPipeline; assets/tiny-klein-twin: Flux2KleinPipeline, the
twin trained without the reference rules) on every case of their cases.json, and the PNGs are
committed, so CI checks flowkv against diffusers without torch.

    python/ref/.venv/bin/python python/ref/dump_tiny_model.py --out tests/golden/tiny_model

Weights are loaded as float32 (bf16 on disk, widened exactly). Prompts are padded to the
tokenizer's model_max_length (64), passed as max_sequence_length: diffusers' default would be
512, flowkv reads the tokenizer's. Two runs write identical files.
"""
from __future__ import annotations

import argparse
import json
import os

import PIL.Image
import torch

from ref_common import check_pins, fresh_dir, setup_determinism, versions

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
MODELS = {"kv": "assets/tiny-klein-kv", "twin": "assets/tiny-klein-twin"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "golden", "tiny_model"))
    a = ap.parse_args()
    setup_determinism()
    check_pins()
    from diffusers import DiffusionPipeline

    fresh_dir(a.out)
    cases_file = os.path.join(ROOT, MODELS["kv"], "cases", "cases.json")
    manifest = json.load(open(cases_file))
    cases_dir = os.path.dirname(cases_file)
    meta = {"script": "python/ref/dump_tiny_model.py", "versions": versions(), "outputs": []}
    for tag, folder in MODELS.items():
        pipe = DiffusionPipeline.from_pretrained(os.path.join(ROOT, folder),
                                                 torch_dtype=torch.float32)
        rows = pipe.tokenizer.model_max_length
        for c in manifest["cases"]:
            refs = [PIL.Image.open(os.path.join(cases_dir, r)).convert("RGB")
                    for r in c["references"]]
            w, h = c.get("size", manifest["size"])  # compose's own: 128x64
            image = pipe(prompt=c["prompt"], image=refs or None, height=h, width=w,
                         num_inference_steps=manifest["steps"], max_sequence_length=rows,
                         generator=torch.Generator("cpu").manual_seed(manifest["seed"]),
                         output_type="pil").images[0]
            name = f"{tag}-{c['name']}.png"
            image.save(os.path.join(a.out, name))
            meta["outputs"].append({"file": name, "model": folder, "pipeline": type(pipe).__name__,
                                    "case": c["name"], "max_sequence_length": rows})
            print(f"{name}: {type(pipe).__name__}")
    json.dump(meta, open(os.path.join(a.out, "meta.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
