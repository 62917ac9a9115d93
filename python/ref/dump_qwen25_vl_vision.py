#!/usr/bin/env python3
"""Golden reference dumper for flowkv's Qwen2.5-VL vision side (the Qwen-Image prompt encoder's
image path): the image processor with Qwen-Image's preprocessor_config.json values and the
vision tower with window attention.

The processor is ``Qwen2VLImageProcessorPil`` (what ``Qwen2VLProcessor`` loads in the pinned
venv, where torchvision is not installed). The tower is transformers' own
``Qwen2_5_VLForConditionalGeneration.model.visual`` on a tiny random config, float32 on the CPU,
called as ``get_image_features`` calls it.

The tiny tower: patch 14 (as released), window_size 56 (a window of 2x2 merged tokens), depth 4
with block 2 attending over the whole image (fullatt_block_indexes [2]), the others within
windows. Image ``a`` is 112x56 px (merged grid 2x4: two windows, a multiple of the window, so
get_window_index pads a whole empty window), image ``b`` 84x84 px (merged grid 3x3: four
windows of 4, 2, 2 and 1 merged tokens, padded).

Writes under ``<out>/``:

* ``text_encoder/``          the whole tiny Qwen2_5_VLForConditionalGeneration, ``save_pretrained``
                             (f32; transformers 5.24 writes the original key layout, ``visual.``
                             and ``model.layers.``, and a config with nested text_config and
                             vision rope_parameters), with Qwen-Image's ``preprocessor_config.json``
                             values (patch 14, min_pixels 3136, max_pixels 12845056, CLIP mean/std)
* ``bf16/``                  the tower's tensors alone in bfloat16 under ``model.visual.`` (the
                             in-memory names, which transformers 4.52-4.57 also saved) and a
                             config.json in the transformers 4.x flat layout (text fields at the
                             top, vision_config.model_type "qwen2_5_vl", in_chans, no
                             rope_parameters), as the released Qwen-Image text_encoder/ has it
* ``in/*.png``               the test images (RGB)
* ``processor.safetensors``  per processor case ``<case>.pixel_values`` [N, 3*2*14*14] and
                             ``<case>.grid_thw`` [n, 3] (F32, exact integers)
* ``dump.safetensors``       the tower on the two images of case ``main``: ``patch_embed``
                             (processor order), ``rope.cos`` / ``rope.sin`` [N, head_dim]
                             (processor order), ``window_index`` (merged tokens, window order),
                             ``cu_window_seqlens`` and ``cu_seqlens`` (patches), ``blocks.<i>``
                             (each block's output, window order), ``embeds`` (image order);
                             ``frames2.embeds`` for the same rows read as grids
                             [[2, 4, 4], [1, 6, 6]]; ``bf16.embeds`` the bf16 tower (sdpa)
* ``meta.json``              description, versions, seed, configs, cases

Usage (from the repository root)::

    python/ref/.venv/bin/python python/ref/dump_qwen25_vl_vision.py --out tests/golden/qwen25_vl_vision
"""

from __future__ import annotations

import argparse
import json
import os
import warnings

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.vision_utils import get_vision_attention_seqlens, get_vision_window_index

from ref_common import check_pins, fresh_dir, setup_determinism, write_meta, write_st

SCRIPT = "python/ref/dump_qwen25_vl_vision.py"
SEED = 2511
MAX_TOTAL_BYTES = 1536 * 1024

VISION = dict(
    depth=4,
    hidden_size=32,
    hidden_act="silu",
    intermediate_size=48,
    num_heads=2,
    in_channels=3,
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=2,
    window_size=56,
    out_hidden_size=40,
    fullatt_block_indexes=[2],
    tokens_per_second=2,
)
TEXT = dict(
    vocab_size=64,
    hidden_size=40,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=256,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 4, 4]},
)
TOP = dict(image_token_id=60, video_token_id=61, vision_start_token_id=62, vision_end_token_id=63)

# Qwen-Image's text_encoder/preprocessor_config.json (Qwen/Qwen-Image, processor/).
PROCESSOR = dict(patch_size=14, temporal_patch_size=2, merge_size=2, min_pixels=3136,
                 max_pixels=12845056, image_mean=[0.48145466, 0.4578275, 0.40821073],
                 image_std=[0.26862954, 0.26130258, 0.27577711])
IMAGES = {"a_112x56": (112, 56), "b_80x90": (80, 90), "c_40x30": (40, 30), "d_150x61": (150, 61)}
CASES = [
    ("main", ["a_112x56", "b_80x90"], {}),  # 112x56 exact; 80x90 -> 84x84
    ("small", ["c_40x30"], {}),  # below min_pixels: scaled up to 84x56
    ("max_pixels", ["d_150x61"], dict(max_pixels=3136)),  # 150x61, beta branch down
]


def make_image(rng, w, h):
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
    cfg = Qwen2_5_VLConfig(vision_config=VISION, text_config=TEXT, **TOP)
    model = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ("norm" in name or "ln_q" in name) and name.endswith("weight"):
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
            elif name.endswith("bias"):
                v = 0.1 * torch.randn(p.shape, generator=gen)
            elif name.endswith("embed_tokens.weight"):
                v = torch.randn(p.shape, generator=gen)
            else:
                fan_in = p[0].numel() if p.dim() > 1 else p.shape[0]
                v = torch.randn(p.shape, generator=gen) / fan_in ** 0.5
            p.copy_(v)
    return model


def v4_config(saved: dict) -> dict:
    """The transformers 4.x flat layout of the same model (how Qwen-Image's text_encoder/ stores
    it): text fields at the top, the vision sub-config with the old model_type and in_chans."""
    text = {k: v for k, v in saved["text_config"].items()
            if k not in ("model_type", "rope_parameters", "architectures", "dtype")}
    rope = saved["text_config"]["rope_parameters"]
    vision = {k: v for k, v in saved["vision_config"].items() if k not in ("rope_parameters", "dtype")}
    vision["model_type"] = "qwen2_5_vl"
    vision["in_chans"] = vision["in_channels"]
    vision["spatial_patch_size"] = vision["patch_size"]
    vision["torch_dtype"] = "bfloat16"
    out = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
           **text, "rope_scaling": {"type": "mrope", "mrope_section": rope["mrope_section"]},
           "rope_theta": rope["rope_theta"], "torch_dtype": "bfloat16",
           "transformers_version": "4.53.1", "vision_config": vision, **TOP}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/golden/qwen25_vl_vision")
    args = ap.parse_args()
    setup_determinism()
    check_pins()
    fresh_dir(args.out)
    os.makedirs(os.path.join(args.out, "in"))
    rng = np.random.default_rng(SEED)
    images = {}
    for name, (w, h) in IMAGES.items():
        make_image(rng, w, h).save(os.path.join(args.out, "in", name + ".png"))
        images[name] = Image.open(os.path.join(args.out, "in", name + ".png")).convert("RGB")

    proc_dump, cases_meta = {}, []
    for case, names, over in CASES:
        out = make_processor(**over)([images[n] for n in names], return_tensors="pt")
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
        saved_pp = json.load(f)
    with open(os.path.join(te, "config.json")) as f:
        saved = json.load(f)

    visual = model.model.visual
    pv = proc_dump["main.pixel_values"]
    grid = proc_dump["main.grid_thw"].to(torch.int64)
    assert grid.tolist() == [[1, 4, 8], [1, 6, 6]], grid.tolist()
    dump = {}

    def rope_hook(m, a, o):  # returns None: the output (cos, sin) is left as it is
        dump["rope.cos"], dump["rope.sin"] = o

    hooks = [
        visual.patch_embed.register_forward_hook(lambda m, a, o: dump.__setitem__("patch_embed", o)),
        visual.rotary_pos_emb.register_forward_hook(rope_hook),
    ]
    for i, blk in enumerate(visual.blocks):
        hooks.append(blk.register_forward_hook(
            lambda m, a, o, i=i: dump.__setitem__(f"blocks.{i}", o)))
    with torch.no_grad():
        out = model.model.get_image_features(pv, grid)
    for h in hooks:
        h.remove()
    window_index, cu_window = get_vision_window_index(
        grid, spatial_merge_size=2, window_size=VISION["window_size"], patch_size=14)
    cu_seqlens, _ = get_vision_attention_seqlens(grid, visual.config)
    dump["window_index"] = window_index
    dump["cu_window_seqlens"] = cu_window
    dump["cu_seqlens"] = cu_seqlens
    dump["embeds"] = torch.cat(list(out.pooler_output))
    # The two images' windows: a (2x4 merged) two full windows, b (3x3) four padded ones.
    assert cu_window.tolist() == [0, 16, 32, 48, 56, 64, 68], cu_window.tolist()

    grid_t2 = torch.tensor([[2, 4, 4], [1, 6, 6]])
    with torch.no_grad():
        out_t2 = model.model.get_image_features(pv, grid_t2)
    dump["frames2.embeds"] = torch.cat(list(out_t2.pooler_output))
    # eager attention gives the same numbers (the dump does not depend on the backend)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out2 = model.model.get_image_features(pv, grid)
    assert torch.allclose(torch.cat(list(out2.pooler_output)), dump["embeds"], atol=1e-5, rtol=1e-5)
    model.set_attn_implementation("sdpa")

    # bf16: the tower's tensors under "model.visual." and a 4.x flat config.json. The reference
    # itself must read that config to the same vision config.
    v4 = os.path.join(args.out, "bf16")
    os.makedirs(v4)
    visual16 = {k: v.detach().to(torch.bfloat16).contiguous().clone()
                for k, v in model.state_dict().items() if k.startswith("model.visual.")}
    save_file(visual16, os.path.join(v4, "model.safetensors"), metadata={"format": "pt"})
    cfg4 = v4_config(saved)
    with open(os.path.join(v4, "config.json"), "w") as f:
        json.dump(cfg4, f, indent=2, sort_keys=True)
        f.write("\n")
    back = Qwen2_5_VLConfig.from_pretrained(v4).vision_config
    for k, v in VISION.items():
        assert getattr(back, k) == v, (k, getattr(back, k), v)
    assert back.rope_parameters["rope_theta"] == 10000.0
    model16 = model.to(torch.bfloat16)
    with torch.no_grad():
        out16 = model16.model.get_image_features(pv, grid)
    dump["bf16.embeds"] = torch.cat(list(out16.pooler_output))

    write_st(os.path.join(args.out, "processor.safetensors"), proc_dump)
    write_st(os.path.join(args.out, "dump.safetensors"), dump)
    meta = {
        "description": "tiny random Qwen2_5_VLForConditionalGeneration: the vision tower (window "
                       "attention) as get_image_features runs it on the processor's pixel_values, "
                       "and Qwen2VLImageProcessorPil with Qwen-Image's preprocessor values",
        "seed": SEED,
        "vision_config": VISION,
        "processor": PROCESSOR,
        "preprocessor_config": saved_pp,
        "processor_cases": cases_meta,
        "images": {k: list(v) for k, v in IMAGES.items()},
        "weights": "N(0, 1/fan_in) weights, 0.1 N(0,1) biases, 1 + 0.2 N(0,1) norms",
    }
    write_meta(args.out, meta, dump, {"main.pixel_values": pv}, SCRIPT)
    total = 0
    for root, _, files in os.walk(args.out):
        for f in files:
            p = os.path.join(root, f)
            total += os.path.getsize(p)
            print(f"{p}: {os.path.getsize(p)} bytes")
    print("total", total)
    assert total < MAX_TOTAL_BYTES, total
    for k, v in dump.items():
        print(k, tuple(v.shape))


if __name__ == "__main__":
    main()
