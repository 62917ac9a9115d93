"""The tiny golden pipelines under other scheduler configs: diffusers' pictures when the folder's
scheduler/scheduler_config.json asks for another shift.

flowkv reads a pipeline folder's scheduler_config.json (every FlowMatchEulerDiscreteScheduler
field, or refuses it by name). This script loads the committed tiny pipelines of
dump_klein_pipeline.py and dump_qwen21_pipeline.py (tests/golden/klein_pipeline/kv/pipeline,
tests/golden/qwen21_pipeline/pipeline), gives each a changed scheduler config and runs diffusers
0.42.1 with the cases' own prompt, pictures and seed. Per case, under ``<out>/<case>/``:

* ``scheduler_config.json``  the config flowkv's test writes into a copy of the pipeline folder
* ``output.png``             diffusers' picture
* ``meta.json``              the pipeline folder, the request, versions

Run from the repository root:
    python/ref/.venv/bin/python python/ref/dump_scheduler_pipelines.py
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import PIL.Image
import torch

sys.path.insert(0, os.path.dirname(__file__))
from ref_common import check_pins, fresh_dir, setup_determinism, versions  # noqa: E402
import dump_qwen21_pipeline  # noqa: E402,F401  (its processor patches, applied on import)

from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinKVPipeline  # noqa: E402
from diffusers import QwenImage21Pipeline  # noqa: E402
from transformers import AutoTokenizer, Qwen3VLProcessor  # noqa: E402
from dump_qwen21_pipeline import Qwen2VLImageProcessorPil  # noqa: E402

SCRIPT = "python/ref/dump_scheduler_pipelines.py"
GOLDEN = "tests/golden"

KLEIN = f"{GOLDEN}/klein_pipeline/kv/pipeline"
QWEN21 = f"{GOLDEN}/qwen21_pipeline/pipeline"

# Each case: the pipeline, the scheduler config's changes, the request.
CASES = {
    # The example: shift_terminal stretches the schedule to end at 0.1.
    "klein_shift_terminal": (KLEIN, {"shift_terminal": 0.1}),
    # No dynamic shifting: the static shift (Klein still passes mu; the scheduler ignores it).
    "klein_static_shift": (KLEIN, {"use_dynamic_shifting": False, "shift": 2.0}),
    "klein_karras": (KLEIN, {"use_karras_sigmas": True}),
    # Qwen-Image-2.1's mu reads base/max shift and seq lens from the config.
    "qwen21_linear_shift": (QWEN21, {"time_shift_type": "linear", "base_shift": 0.7,
                                     "max_shift": 1.2, "shift_terminal": 0.1}),
    "qwen21_exponential_sigmas": (QWEN21, {"use_exponential_sigmas": True, "shift_terminal": None}),
}


def scheduler_config(folder: str, changes: dict) -> dict:
    cfg = json.load(open(os.path.join(folder, "scheduler", "scheduler_config.json")))
    cfg.update(changes)
    return cfg


def run_klein(folder: str, cfg: dict) -> tuple[PIL.Image.Image, dict]:
    meta = json.load(open(os.path.join(os.path.dirname(folder), "meta.json")))
    pipe = Flux2KleinKVPipeline.from_pretrained(folder)
    pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(cfg)
    pipe.set_progress_bar_config(disable=True)
    ref = PIL.Image.open(f"{GOLDEN}/klein_pipeline/reference.png")
    req = {"prompt": meta["prompt"], "height": meta["height"], "width": meta["width"],
           "steps": meta["steps"], "seed": meta["seed"], "references": ["klein_pipeline/reference.png"]}
    image = pipe(image=ref, prompt=req["prompt"], height=req["height"], width=req["width"],
                 num_inference_steps=req["steps"],
                 generator=torch.Generator("cpu").manual_seed(req["seed"]),
                 output_type="pil").images[0]
    return image, req


def run_qwen21(folder: str, cfg: dict) -> tuple[PIL.Image.Image, dict]:
    meta = json.load(open(os.path.join(os.path.dirname(folder), "meta.json")))
    # The processor as dump_qwen21_pipeline.py builds it (transformers' AutoProcessor would
    # want the video processor, which needs torchvision).
    proc_dir = os.path.join(folder, "processor")
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessorPil(**dump_qwen21_pipeline.IMAGE_PROCESSOR),
        tokenizer=AutoTokenizer.from_pretrained(proc_dir), video_processor=None,
        chat_template=dump_qwen21_pipeline.CHAT_TEMPLATE)
    pipe = QwenImage21Pipeline.from_pretrained(folder, processor=processor)
    pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(cfg)
    pipe.set_progress_bar_config(disable=True)
    images = [PIL.Image.open(f"{GOLDEN}/qwen21_pipeline/{f}") for f in meta["images"]]
    req = {"prompt": meta["prompt"], "negative_prompt": meta["negative_prompt"],
           "true_cfg_scale": meta["true_cfg_scale"], "steps": meta["steps"], "seed": meta["seed"],
           "output_resolution": meta["output_resolution"],
           "references": [f"qwen21_pipeline/{f}" for f in meta["images"]]}
    image = pipe(prompt=req["prompt"], image=images, negative_prompt=req["negative_prompt"],
                 true_cfg_scale=req["true_cfg_scale"], num_inference_steps=req["steps"],
                 generator=torch.Generator("cpu").manual_seed(req["seed"]),
                 output_resolution=req["output_resolution"], output_type="pil").images[0]
    return image, req


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=f"{GOLDEN}/scheduler_pipelines")
    a = ap.parse_args()
    check_pins()
    setup_determinism()
    os.makedirs(a.out, exist_ok=True)
    for name, (folder, changes) in CASES.items():
        case = os.path.join(a.out, name)
        fresh_dir(case)
        cfg = scheduler_config(folder, changes)
        run = run_klein if folder == KLEIN else run_qwen21
        image, req = run(folder, cfg)
        image.save(os.path.join(case, "output.png"))
        json.dump(cfg, open(os.path.join(case, "scheduler_config.json"), "w"), indent=1,
                  sort_keys=True)
        meta = {"script": SCRIPT, "pipeline": os.path.relpath(folder, GOLDEN), "changes": changes,
                "request": req, "mode": image.mode, "size": list(image.size),
                "versions": versions()}
        json.dump(meta, open(os.path.join(case, "meta.json"), "w"), indent=1, ensure_ascii=False)
        print(f"{name}: {image.size[0]}x{image.size[1]} {image.mode}")


if __name__ == "__main__":
    main()
