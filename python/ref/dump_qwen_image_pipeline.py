#!/usr/bin/env python3
"""Whole-pipeline golden dumps for `flowkv generate` on Qwen-Image: tiny random-weight
QwenImagePipeline and QwenImageEditPlusPipeline (diffusers 0.42.1, transformers 5.24.0:
Qwen2.5-VL prompt encoder with its tokenizer and processor, AutoencoderKLQwenImage,
QwenImageTransformer2DModel), run from a prompt (a negative prompt for true CFG), pictures and a
seed to the output image, in float32 on the CPU.

Under ``<out>/``:

* ``pipeline/``            the Edit-Plus folder as ``save_pretrained`` writes it (model_index.json,
                           scheduler/, text_encoder/, tokenizer/, processor/, transformer/, vae/);
                           ``pipeline_t2i/model_index.json`` names the same components as a
                           QwenImagePipeline (symbolic links to the component folders)
* ``transformer_2511/``    the transformer with ``zero_cond_t`` (Edit-2511), same weights, and
                           ``pipeline_2511/`` the Edit-Plus pipeline with it (links again)
* ``pic_a.png``, ``pic_b.png``   the input pictures (different sizes and aspect ratios)
* ``<case>/output.png``    diffusers' output (PIL) for each case
* ``<case>/stages.safetensors``  small tensors between stages (prompt ids and embeddings of both
                           branches, the noise, the final latents)
* ``<case>/fbcache.json``  (``t2i_fbcache``) FirstBlockCache's decisions per step and branch
* ``meta.json``            prompts, seed, sizes, steps, versions, per-case settings

Cases: ``t2i`` (no CFG), ``t2i_cfg`` (negative prompt, true_cfg_scale 4), ``t2i_fbcache``
(FirstBlockCache threshold 0.2, CFG, more steps), ``edit_plus`` (two pictures of different sizes,
CFG; output size given), ``edit_2511`` (zero_cond_t, one picture, no CFG).

The tokenizer is the real Qwen3 tokenizer (its tokenizer.json and tokenizer_config.json, e.g. the
ones CMake unpacks into build/tests/golden/tokenizer/) cut to its first VOCAB ranks
(dump_klein_pipeline.tiny_tokenizer): Qwen2.5's byte-level BPE is the same.

Usage (from the repository root)::

    python/ref/.venv/bin/python python/ref/dump_qwen_image_pipeline.py \
        --qwen3-tokenizer build/tests/golden/tokenizer --out tests/golden/qwen_image_pipeline
"""

from __future__ import annotations

import argparse
import json
import os
import shutil

import numpy as np
import PIL.Image
import torch
from transformers import (AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                          Qwen2VLProcessor)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from diffusers import (
    AutoencoderKLQwenImage,
    FirstBlockCacheConfig,
    FlowMatchEulerDiscreteScheduler,
    QwenImageEditPlusPipeline,
    QwenImagePipeline,
    QwenImageTransformer2DModel,
)
from diffusers.hooks import first_block_cache

from dump_klein_pipeline import tiny_tokenizer
from ref_common import check_pins, fresh_dir, setup_determinism, versions, write_st

SCRIPT = "python/ref/dump_qwen_image_pipeline.py"

# Qwen-Image's released preprocessor_config.json values (Qwen2VLImageProcessor).
IMAGE_PROCESSOR = dict(patch_size=14, temporal_patch_size=2, merge_size=2,
                       image_mean=[0.48145466, 0.4578275, 0.40821073],
                       image_std=[0.26862954, 0.26130258, 0.27577711],
                       size={"shortest_edge": 3136, "longest_edge": 12845056})
TEXT_HIDDEN = 32
Z_DIM = 16
SCHED_CFG = dict(num_train_timesteps=1000, base_image_seq_len=256, max_image_seq_len=8192,
                 base_shift=0.5, max_shift=0.9, shift=1.0, shift_terminal=0.02,
                 time_shift_type="exponential", use_dynamic_shifting=True)
VAE_CFG = dict(base_dim=4, z_dim=Z_DIM, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
               temperal_downsample=[False, True, True])
TRANSFORMER_CFG = dict(patch_size=2, in_channels=4 * Z_DIM, out_channels=Z_DIM, num_layers=2,
                       attention_head_dim=16, num_attention_heads=2,
                       joint_attention_dim=TEXT_HIDDEN, axes_dims_rope=(4, 6, 6))
PROMPT = "A red fox café in the snow, «watercolour» 🦊 next to a lake"
NEGATIVE = "blurry, low quality"
SEED = 42
STEPS = 3
FBC_STEPS = 20
CFG_SCALE = 4.0
HEIGHT, WIDTH = 64, 96


def pictures() -> tuple[PIL.Image.Image, PIL.Image.Image]:
    """An 80x72 RGB image (gradients, a disc, seeded noise) and a 50x100 RGB image."""
    rng = np.random.default_rng(7)
    h, w = 72, 80
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    rgb = np.stack([255 * x / (w - 1), 255 * y / (h - 1),
                    np.where((x - 30) ** 2 + (y - 40) ** 2 < 300, 230.0, 40.0)], -1)
    rgb += rng.normal(0, 12, rgb.shape)
    a = PIL.Image.fromarray(np.clip(np.round(rgb), 0, 255).astype(np.uint8), "RGB")
    h, w = 50, 100
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    rgb = np.stack([128 + 100 * np.sin(x / 7), 128 + 100 * np.cos(y / 5), 255 * (x + y) / (w + h)], -1)
    rgb += rng.normal(0, 10, rgb.shape)
    b = PIL.Image.fromarray(np.clip(np.round(rgb), 0, 255).astype(np.uint8), "RGB")
    return a, b


def init_small(module: torch.nn.Module, seed: int, scale: float = 0.2):
    """Random weights of a scale that keeps activations O(1) through the tiny models."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("weight") and p.dim() == 1 and "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=g))


def _check_class(self, name, arg, _orig=Qwen2VLProcessor.check_argument_for_proper_class):
    # The video processor's class lookup needs torchvision, which the reference venv does not
    # install (so the image processor is the PIL one); the pipeline reads no video.
    return None if arg is None else _orig(self, name, arg)


Qwen2VLProcessor.check_argument_for_proper_class = _check_class


def _save_processor(self, save_directory, **_):
    # ProcessorMixin.save_pretrained needs every attribute, the absent video processor too: the
    # files a released processor/ folder holds for images and text, saved part by part.
    os.makedirs(save_directory, exist_ok=True)
    self.tokenizer.save_pretrained(save_directory)
    self.image_processor.save_pretrained(save_directory)


Qwen2VLProcessor.save_pretrained = _save_processor


def components(tok_dir: str, vocab_size: int):
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    processor = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessorPil(**IMAGE_PROCESSOR),
                                 tokenizer=tokenizer, video_processor=None)
    cfg = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=vocab_size, hidden_size=TEXT_HIDDEN, intermediate_size=48,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         rms_norm_eps=1e-6, max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                          "mrope_section": [1, 1, 2]}),
        vision_config=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2,
                           in_channels=3, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2, out_hidden_size=TEXT_HIDDEN, window_size=56,
                           fullatt_block_indexes=[1]),
        image_token_id=tokenizer.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tokenizer.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tokenizer.convert_tokens_to_ids("<|vision_start|>"),
        vision_end_token_id=tokenizer.convert_tokens_to_ids("<|vision_end|>"),
        tie_word_embeddings=True)
    torch.manual_seed(0)
    text_encoder = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    init_small(text_encoder, 10)
    torch.manual_seed(1)
    g = torch.Generator().manual_seed(11)
    vae = AutoencoderKLQwenImage(
        **VAE_CFG, latents_mean=(torch.randn(Z_DIM, generator=g) * 0.5).tolist(),
        latents_std=(torch.rand(Z_DIM, generator=g) * 1.5 + 0.5).tolist()).eval()
    init_small(vae, 12, 0.15)
    torch.manual_seed(2)
    transformer = QwenImageTransformer2DModel(**TRANSFORMER_CFG).eval()
    init_small(transformer, 13, 0.1)
    with torch.no_grad():  # a timestep embedding gentle enough for FirstBlockCache to skip
        for name, p in transformer.named_parameters():
            if name.startswith("time_text_embed"):
                p.mul_(0.3)
    t2511 = QwenImageTransformer2DModel(**TRANSFORMER_CFG, zero_cond_t=True).eval()
    t2511.load_state_dict(transformer.state_dict())
    scheduler = FlowMatchEulerDiscreteScheduler(**SCHED_CFG)
    edit = QwenImageEditPlusPipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder,
                                     tokenizer=tokenizer, processor=processor,
                                     transformer=transformer)
    t2i = QwenImagePipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder,
                            tokenizer=tokenizer, transformer=transformer)
    for p in (edit, t2i):
        p.set_progress_bar_config(disable=True)
    return t2i, edit, t2511


def trace(pipe, stages: dict[str, torch.Tensor]):
    """Records the tensors between stages while the pipeline runs."""
    n_prompt = [0]
    enc = pipe.encode_prompt

    def traced_encode(*a, **k):
        branch = "prompt" if n_prompt[0] == 0 else "negative"
        n_prompt[0] += 1
        e, m = enc(*a, **k)
        stages[f"{branch}_embeds"] = e.detach().clone()
        if m is not None:
            stages[f"{branch}_mask"] = m.to(torch.int32)
        return e, m

    pipe.encode_prompt = traced_encode
    prep = pipe.prepare_latents

    def traced_latents(*a, **k):
        r = prep(*a, **k)
        lat = r[0] if isinstance(r, tuple) else r
        stages["noise"] = lat.detach().clone()
        return r

    pipe.prepare_latents = traced_latents
    unpack = pipe._unpack_latents

    def traced_unpack(x, *rest):
        stages["final_latents"] = x.detach().clone()
        return unpack(x, *rest)

    pipe._unpack_latents = traced_unpack


def untrace(pipe):
    for attr in ("encode_prompt", "prepare_latents", "_unpack_latents"):
        delattr(pipe, attr)


def run_case(pipe, out: str, name: str, images=None, negative=None, steps=STEPS, hw=(HEIGHT, WIDTH),
             fbcache: float | None = None):
    case = os.path.join(out, name)
    fresh_dir(case)
    stages: dict[str, torch.Tensor] = {}
    trace(pipe, stages)
    decisions: list[dict] = []
    if fbcache is not None:
        pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=fbcache))
        orig = first_block_cache.FBCHeadBlockHook._should_compute_remaining_blocks

        def recorded(self, residual):
            r = orig(self, residual)
            decisions.append({"compute": bool(r)})
            return r

        first_block_cache.FBCHeadBlockHook._should_compute_remaining_blocks = recorded
    kwargs = dict(prompt=PROMPT, num_inference_steps=steps, output_type="pil",
                  generator=torch.Generator("cpu").manual_seed(SEED), height=hw[0], width=hw[1])
    if images:
        kwargs["image"] = images
    if negative is not None:
        kwargs.update(negative_prompt=negative, true_cfg_scale=CFG_SCALE)
    try:
        image = pipe(**kwargs).images[0]
    finally:
        untrace(pipe)
        if fbcache is not None:
            first_block_cache.FBCHeadBlockHook._should_compute_remaining_blocks = orig
            pipe.transformer.disable_cache()
    image.save(os.path.join(case, "output.png"))
    stages = {k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in stages.items()}
    write_st(os.path.join(case, "stages.safetensors"), stages)
    meta = {"mode": image.mode, "size": list(image.size), "negative_prompt": negative,
            "true_cfg_scale": CFG_SCALE if negative is not None else None,
            "images": len(images or []), "height": hw[0], "width": hw[1], "steps": steps,
            "shapes": {k: list(v.shape) for k, v in stages.items()}}
    if fbcache is not None:
        branches = 2 if negative is not None else 1
        per_step = ["".join("C" if decisions[s * branches + b]["compute"] else "s"
                            for s in range(steps)) for b in range(branches)]
        calls = "".join("C" if d["compute"] else "s" for d in decisions)
        json.dump({"threshold": fbcache, "branches": per_step, "calls": calls},
                  open(os.path.join(case, "fbcache.json"), "w"), indent=1)
        meta["fbcache"] = {"threshold": fbcache, "branches": per_step, "calls": calls}
    return meta


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qwen3-tokenizer", required=True,
                    help="folder with the real tokenizer.json and tokenizer_config.json")
    ap.add_argument("--out", default="tests/golden/qwen_image_pipeline")
    a = ap.parse_args()
    check_pins()
    setup_determinism()
    fresh_dir(a.out)
    tok_dir = os.path.join(a.out, ".tokenizer")
    _, vocab_size = tiny_tokenizer(a.qwen3_tokenizer, tok_dir, drop_chat_template=True)
    pic_a, pic_b = pictures()
    pic_a.save(os.path.join(a.out, "pic_a.png"))
    pic_b.save(os.path.join(a.out, "pic_b.png"))
    t2i, edit, t2511 = components(tok_dir, vocab_size)
    edit.save_pretrained(os.path.join(a.out, "pipeline"), safe_serialization=True)
    t2511.save_pretrained(os.path.join(a.out, "transformer_2511"), safe_serialization=True)
    # The same components as a QwenImagePipeline, and the Edit-Plus pipeline with the 2511
    # transformer: model_index.json files beside symbolic links to the shared component folders.
    idx = json.load(open(os.path.join(a.out, "pipeline", "model_index.json")))
    for name, cls, links in (
            ("pipeline_t2i", "QwenImagePipeline",
             {c: f"../pipeline/{c}" for c in ("scheduler", "text_encoder", "tokenizer",
                                                "transformer", "vae")}),
            ("pipeline_2511", "QwenImageEditPlusPipeline",
             {**{c: f"../pipeline/{c}" for c in ("scheduler", "text_encoder", "tokenizer",
                                                 "processor", "vae")},
              "transformer": "../transformer_2511"})):
        folder = os.path.join(a.out, name)
        os.makedirs(folder, exist_ok=True)
        i = {k: v for k, v in idx.items() if k.startswith("_") or k in links}
        i["_class_name"] = cls
        json.dump(i, open(os.path.join(folder, "model_index.json"), "w"), indent=2)
        for c, target in links.items():
            os.symlink(target, os.path.join(folder, c))
    shutil.rmtree(tok_dir)
    cases = {
        "t2i": run_case(t2i, a.out, "t2i"),
        "t2i_cfg": run_case(t2i, a.out, "t2i_cfg", negative=NEGATIVE),
        "t2i_fbcache": run_case(t2i, a.out, "t2i_fbcache", negative=NEGATIVE, steps=FBC_STEPS,
                                fbcache=0.2),
        "edit_plus": run_case(edit, a.out, "edit_plus", images=[pic_a, pic_b], negative=NEGATIVE),
    }
    edit.transformer = t2511
    cases["edit_2511"] = run_case(edit, a.out, "edit_2511", images=[pic_b])
    meta = {"script": SCRIPT, "versions": versions(), "prompt": PROMPT, "negative_prompt": NEGATIVE,
            "seed": SEED, "cases": cases}
    json.dump(meta, open(os.path.join(a.out, "meta.json"), "w"), indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
