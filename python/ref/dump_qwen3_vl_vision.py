#!/usr/bin/env python3
"""Golden reference dumper for flowkv's Qwen3-VL vision side (the Qwen-Image-2.1 prompt encoder's
image path): the image processor and the vision tower.

The processor is what ``Qwen3VLProcessor`` uses in the pinned venv: ``Qwen2VLImageProcessorPil``
(torchvision is not installed, so ``AutoImageProcessor`` / ``Qwen2VLImageProcessor`` fall back to
the PIL backend: PIL bicubic resize after ``smart_resize``, rescale in float64 then float32,
normalize in float32, patchify in merge-block order with the frame repeated ``temporal_patch_size``
times). The tower is transformers' own ``Qwen3VLForConditionalGeneration.model.visual`` on a tiny
random config, float32 on the CPU, called as ``get_image_features`` calls it.

Writes under ``<out>/``:

* ``text_encoder/``          the whole tiny Qwen3VLForConditionalGeneration, ``save_pretrained``
                             (f32), with ``preprocessor_config.json`` of the processor beside it
* ``in/*.png``               the test images (RGB)
* ``processor.safetensors``  per processor case ``<case>.pixel_values`` [N, C*T*P*P] and
                             ``<case>.grid_thw`` [n, 3] (F32, exact integers)
* ``dump.safetensors``       the tower on the two images of case ``main``: ``patch_embed``,
                             ``pos_embed`` (after the learned position embedding is added),
                             ``blocks.<i>`` (each block's output), ``deepstack.<j>``, ``embeds``
* ``frames2.*``             ``embeds`` and ``deepstack.1`` of the same rows read as grids
                             [[1, 4, 4], [2, 2, 2]] (a two-frame entry)
* ``bf16/``                  the tower's tensors alone in bfloat16 (with the config), and in
                             dump.safetensors ``bf16.<name>`` for the same names: the same
                             call with the model in bfloat16 (sdpa attention; eager differs
                             from it by ~0.7% in bf16, so bf16 is checked to ~1% only)
* ``meta.json``              description, versions, seed, configs, cases

Usage (from the repository root)::

    python/ref/.venv/bin/python python/ref/dump_qwen3_vl_vision.py --out tests/golden/qwen3_vl_vision
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import warnings

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from ref_common import check_pins, fresh_dir, setup_determinism, write_meta, write_st

SCRIPT = "python/ref/dump_qwen3_vl_vision.py"
SEED = 4321
MAX_FILE_BYTES = 1024 * 1024

VISION = dict(
    depth=3,
    hidden_size=32,
    hidden_act="gelu_pytorch_tanh",
    intermediate_size=64,
    num_heads=2,
    in_channels=3,
    patch_size=16,
    spatial_merge_size=2,
    temporal_patch_size=2,
    out_hidden_size=48,
    num_position_embeddings=16,
    deepstack_visual_indexes=[0, 1],
)
TEXT = dict(
    vocab_size=64,
    hidden_size=48,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=24,
    max_position_embeddings=256,
    rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [4, 4, 4],
                     "mrope_interleaved": True},
)
TOP = dict(image_token_id=60, video_token_id=61, vision_start_token_id=62, vision_end_token_id=63)

# The processor of the golden folder (preprocessor_config.json): the released Qwen3-VL fields
# with a small pixel range, so the test images exercise both resize directions.
PROCESSOR = dict(patch_size=16, temporal_patch_size=2, merge_size=2, min_pixels=1024,
                 max_pixels=8192, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
# Extra processor-only cases: (name, images, overrides of PROCESSOR).
IMAGES = {"a_64x48": (64, 48), "b_40x72": (40, 72), "c_50x30": (50, 30), "d_64x32": (64, 32)}
CASES = [
    ("main", ["a_64x48", "b_40x72"], {}),  # 64x48 -> 64x64 (up), 40x72 -> 32x64 (down)
    ("max_pixels", ["a_64x48"], dict(max_pixels=1024)),  # beta branch: 32x32
    ("min_pixels", ["b_40x72"], dict(min_pixels=4096)),  # beta branch: 64x96
    ("odd", ["c_50x30"], dict(image_mean=[0.48145466, 0.4578275, 0.40821073],
                              image_std=[0.26862954, 0.26130258, 0.27577711])),  # CLIP mean/std
    ("exact", ["d_64x32"], {}),  # already a multiple of 32: no resize
]


def make_image(rng, w, h):
    # smooth gradients plus noise: the resize filter's taps all matter
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    base = np.stack([128 + 100 * np.sin(x / 5 + c) * np.cos(y / 7 - c) for c in range(3)], -1)
    img = base + rng.normal(0, 30, size=(h, w, 3))
    return Image.fromarray(np.clip(np.round(img), 0, 255).astype(np.uint8), "RGB")


def make_processor(**over):
    cfg = {**PROCESSOR, **over}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Qwen2VLImageProcessorPil(**cfg)


def build_model(gen):
    cfg = Qwen3VLConfig(vision_config=VISION, text_config=TEXT, **TOP)
    model = Qwen3VLForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
            elif name.endswith("bias"):
                v = 0.1 * torch.randn(p.shape, generator=gen)
            elif name.endswith("pos_embed.weight") or name.endswith("embed_tokens.weight"):
                v = torch.randn(p.shape, generator=gen)
            else:
                fan_in = p[0].numel() if p.dim() > 1 else p.shape[0]
                v = torch.randn(p.shape, generator=gen) / fan_in ** 0.5
            p.copy_(v)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/golden/qwen3_vl_vision")
    args = ap.parse_args()
    setup_determinism()
    check_pins()
    fresh_dir(args.out)
    os.makedirs(os.path.join(args.out, "in"))
    rng = np.random.default_rng(SEED)
    images = {}
    for name, (w, h) in IMAGES.items():
        images[name] = make_image(rng, w, h)
        images[name].save(os.path.join(args.out, "in", name + ".png"))
        images[name] = Image.open(os.path.join(args.out, "in", name + ".png")).convert("RGB")

    proc_dump, cases_meta = {}, []
    for case, names, over in CASES:
        proc = make_processor(**over)
        out = proc([images[n] for n in names], return_tensors="pt")
        proc_dump[f"{case}.pixel_values"] = out["pixel_values"]
        proc_dump[f"{case}.grid_thw"] = out["image_grid_thw"].to(torch.float32)
        cases_meta.append({"case": case, "images": names, "overrides": over,
                           "grid_thw": out["image_grid_thw"].tolist()})

    gen = torch.Generator().manual_seed(SEED)
    model = build_model(gen)
    te = os.path.join(args.out, "text_encoder")
    model.save_pretrained(te, safe_serialization=True)
    make_processor().save_pretrained(te)
    with open(os.path.join(te, "preprocessor_config.json")) as f:
        saved = json.load(f)

    visual = model.model.visual
    dump = {}
    hooks = [
        visual.patch_embed.register_forward_hook(lambda m, a, o: dump.__setitem__("patch_embed", o)),
        visual.rotary_pos_emb.register_forward_hook(
            lambda m, a, o: dump.__setitem__("pos_embed", a[0])),
    ]
    for i, blk in enumerate(visual.blocks):
        hooks.append(blk.register_forward_hook(
            lambda m, a, o, i=i: dump.__setitem__(f"blocks.{i}", o)))
    pv = proc_dump["main.pixel_values"]
    grid = proc_dump["main.grid_thw"].to(torch.int64)
    with torch.no_grad():
        out = model.model.get_image_features(pv, grid)
    for h in hooks:
        h.remove()
    for j, feats in enumerate(out.deepstack_features):
        dump[f"deepstack.{j}"] = torch.cat(list(feats))
    dump["embeds"] = torch.cat(list(out.pooler_output))
    # A two-frame grid over the same rows (video-style: each frame attends within itself, the
    # position tables repeat per frame): [[1, 4, 4], [2, 2, 2]] also covers 24 patches.
    grid_t2 = torch.tensor([[1, 4, 4], [2, 2, 2]])
    with torch.no_grad():
        out_t2 = model.model.get_image_features(pv, grid_t2)
    dump["frames2.embeds"] = torch.cat(list(out_t2.pooler_output))
    dump["frames2.deepstack.1"] = torch.cat(list(out_t2.deepstack_features[1]))
    # eager attention gives the same numbers (the dump does not depend on the backend)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out2 = model.model.get_image_features(pv, grid)
    assert torch.allclose(torch.cat(list(out2.pooler_output)), dump["embeds"], atol=1e-5, rtol=1e-5)

    # The same tower in bfloat16, as a bf16 checkpoint runs (get_image_features casts
    # pixel_values to the tower's dtype): its vision tensors alone, in bf16, with the config.
    bf16_dir = os.path.join(args.out, "bf16")
    os.makedirs(bf16_dir)
    visual16 = {k: v.detach().to(torch.bfloat16).contiguous().clone()
                for k, v in model.state_dict().items() if k.startswith("model.visual.")}
    save_file(visual16, os.path.join(bf16_dir, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(te, "config.json"), os.path.join(bf16_dir, "config.json"))
    model.set_attn_implementation("sdpa")
    model16 = model.to(torch.bfloat16)
    visual = model16.model.visual
    hooks = [
        visual.patch_embed.register_forward_hook(
            lambda m, a, o: dump.__setitem__("bf16.patch_embed", o)),
        visual.rotary_pos_emb.register_forward_hook(
            lambda m, a, o: dump.__setitem__("bf16.pos_embed", a[0])),
    ]
    for i, blk in enumerate(visual.blocks):
        hooks.append(blk.register_forward_hook(
            lambda m, a, o, i=i: dump.__setitem__(f"bf16.blocks.{i}", o)))
    with torch.no_grad():
        out16 = model16.model.get_image_features(pv, grid)
    for h in hooks:
        h.remove()
    dump["bf16.embeds"] = torch.cat(list(out16.pooler_output))
    for j, feats in enumerate(out16.deepstack_features):
        dump[f"bf16.deepstack.{j}"] = torch.cat(list(feats))

    write_st(os.path.join(args.out, "processor.safetensors"), proc_dump)
    write_st(os.path.join(args.out, "dump.safetensors"), dump)
    meta = {
        "description": "tiny random Qwen3VLForConditionalGeneration: the vision tower as "
                       "get_image_features runs it on the processor's pixel_values, and "
                       "Qwen2VLImageProcessorPil (what Qwen3VLProcessor uses without torchvision) "
                       "on small RGB images",
        "seed": SEED,
        "vision_config": VISION,
        "processor": PROCESSOR,
        "preprocessor_config": saved,
        "processor_cases": cases_meta,
        "images": {k: list(v) for k, v in IMAGES.items()},
        "weights": "N(0, 1/fan_in) weights, 0.1 N(0,1) biases, N(0,1) pos_embed, 1 + 0.2 N(0,1) norms",
    }
    write_meta(args.out, meta, dump, {"main.pixel_values": pv}, SCRIPT)
    total = 0
    for root, _, files in os.walk(args.out):
        for f in files:
            p = os.path.join(root, f)
            size = os.path.getsize(p)
            total += size
            print(f"{p}: {size} bytes")
            assert size < MAX_FILE_BYTES, p
    print("total", total)
    for k, v in dump.items():
        print(k, tuple(v.shape))


if __name__ == "__main__":
    main()
