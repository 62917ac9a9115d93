#!/usr/bin/env python3
"""Whole-pipeline golden dumps for NucleusMoE-Image: a tiny random-weight
NucleusMoEImagePipeline (diffusers 0.42.1, transformers 5.24.0: Qwen3-VL prompt encoder with its
processor, AutoencoderKLQwenImage, NucleusMoEImageTransformer2DModel with dense and MoE layers
and GQA, FlowMatchEulerDiscreteScheduler), run from a prompt and a seed to the output picture, in
float32 on the CPU (as the other pipeline dumps run).

Under ``<out>/``:

* ``pipeline/``           the folder as ``save_pretrained`` writes it (model_index.json,
                          scheduler/, text_encoder/, processor/, transformer/, vae/)
* ``<case>/output.png``   diffusers' picture (numpy_to_pil of the "np" output: round(255 x))
* ``<case>/stages.safetensors``  the tensors between stages (float32; masks int32):
  ``prompt_ids``/``negative_ids`` [L] and ``prompt_attention_mask``/``negative_attention_mask``
  [L] (the processor's), ``prompt_embeds``/``negative_embeds`` [1, L, 32], ``prompt_mask``/
  ``negative_mask`` [1, L] (only when the pipeline passes a mask: not all ones),
  ``initial_latents`` [1, N, 64] (packed noise), ``sigmas`` [steps + 1] and ``timesteps``
  [steps] (the scheduler's), ``step0_timestep`` [1] (what the transformer is given: t / 1000),
  ``step0_cond`` and ``step0_uncond`` [1, N, 64] (the transformer's outputs at step 0),
  ``step0_guided`` (after the CFG norm rescale, before the pipeline negates it),
  ``step0_latents`` (after the first Euler step), ``final_latents`` [1, N, 64] (packed, before
  the VAE), ``image`` [H, W, 3] (the "np" output, float32 in [0, 1])
* ``meta.json``           prompt, seed, steps, sizes, configs, per-case settings and results
  (``cfg_textkv``: whether the picture equals ``cfg``'s bit for bit), versions

Cases: ``cfg`` (guidance_scale 4.0, the default negative prompt ""), ``cfg_textkv`` (the same
with ``pipe.transformer.enable_cache(TextKVCacheConfig())``), ``nocfg`` (guidance_scale 1.0: one
transformer call a step, no negative prompt).

The text encoder and processor are built as dump_nucleus_prompt.py builds them (10 layers:
hidden_states[-8] is decoder layer 2's output). The scheduler is FlowMatchEulerDiscreteScheduler
with its class defaults (shift 1.0, use_dynamic_shifting false), which the pipeline's own
defaults are too; the released scheduler_config.json was not available to check.

Usage (from the repository root)::

    python/ref/.venv/bin/python python/ref/dump_nucleus_pipeline.py \\
        --qwen3-tokenizer build/tests/golden/tokenizer --out tests/golden/nucleus_pipeline
"""

from __future__ import annotations

import argparse
import json
import os
import shutil

import numpy as np
import torch
from transformers import Qwen3VLProcessor

from diffusers import (
    AutoencoderKLQwenImage,
    FlowMatchEulerDiscreteScheduler,
    NucleusMoEImagePipeline,
    NucleusMoEImageTransformer2DModel,
    TextKVCacheConfig,
)

import dump_nucleus_prompt
import dump_qwen3_vl_text
from ref_common import check_pins, fresh_dir, setup_determinism, versions, write_st

SCRIPT = "python/ref/dump_nucleus_pipeline.py"
MAX_TOTAL_BYTES = 2560 * 1024
TEXT_HIDDEN = dump_nucleus_prompt.TEXT_CFG["hidden_size"]
Z_DIM = 16
# dump_qwen_image_pipeline.py's tiny VAE (spatial factor 8).
VAE_CFG = dict(base_dim=4, z_dim=Z_DIM, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
               temperal_downsample=[False, True, True])
VAE_OUT_GAIN = 4.0
# Layers 0-2 dense, 3-4 MoE (the released dense_moe_strategy); GQA: 4 query heads of 12 on 2 KV
# heads (D = 48, the least width whose dense inner width int(D * 4 * 2 / 3) // 128 * 128 is not
# 0: 128);
# expert-choice capacities 1 and 2 (C = ceil(cf * N / E) = 6 and 12 of N = 24 tokens), so some
# tokens are routed to no expert and some to several.
TRANSFORMER_CFG = dict(patch_size=2, in_channels=4 * Z_DIM, out_channels=Z_DIM, num_layers=5,
                       attention_head_dim=12, num_attention_heads=4, num_key_value_heads=2,
                       joint_attention_dim=TEXT_HIDDEN, axes_dims_rope=(2, 4, 6), mlp_ratio=4.0,
                       moe_enabled=True, dense_moe_strategy="leave_first_three_blocks_dense",
                       num_experts=4, moe_intermediate_dim=24,
                       capacity_factors=[0.0, 0.0, 0.0, 1.0, 2.0], use_sigmoid=False,
                       route_scale=2.5)
SCHED_CFG = {}  # FlowMatchEulerDiscreteScheduler's defaults
PROMPT = "A red fox café in the snow, «watercolour» 🦊 next to a lake"
SEED = 42
STEPS = 4
CFG_SCALE = 4.0
HEIGHT, WIDTH = 64, 96


def init_small(module: torch.nn.Module, seed: int, scale: float = 0.2):
    """Random weights of a scale that keeps activations O(1) through the tiny models."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("weight") and p.dim() == 1 and "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=g))


def _save_processor(self, save_directory, **_):
    # ProcessorMixin.save_pretrained needs every attribute, the absent video processor too: the
    # files a released processor/ folder holds for images and text, saved part by part.
    os.makedirs(save_directory, exist_ok=True)
    self.tokenizer.save_pretrained(save_directory)
    self.image_processor.save_pretrained(save_directory)
    with open(os.path.join(save_directory, "chat_template.jinja"), "w") as f:
        f.write(self.chat_template)


Qwen3VLProcessor.save_pretrained = _save_processor


def components(qwen3_tokenizer: str, tok_dir: str) -> NucleusMoEImagePipeline:
    tokenizer, vocab_size = dump_qwen3_vl_text.tiny_tokenizer(qwen3_tokenizer, tok_dir)
    processor = dump_nucleus_prompt.make_processor(tokenizer)
    text_encoder = dump_nucleus_prompt.build_model(tokenizer, vocab_size)
    torch.manual_seed(1)
    g = torch.Generator().manual_seed(11)
    vae = AutoencoderKLQwenImage(
        **VAE_CFG, latents_mean=(torch.randn(Z_DIM, generator=g) * 0.5).tolist(),
        latents_std=(torch.rand(Z_DIM, generator=g) * 1.5 + 0.5).tolist()).eval()
    init_small(vae, 12, 0.15)
    with torch.no_grad():  # more contrast than the tiny decoder gives (std 0.03 -> about 0.1)
        vae.decoder.conv_out.weight.mul_(VAE_OUT_GAIN)
    torch.manual_seed(2)
    transformer = NucleusMoEImageTransformer2DModel(**TRANSFORMER_CFG).eval()
    init_small(transformer, 13, 0.15)
    scheduler = FlowMatchEulerDiscreteScheduler(**SCHED_CFG)
    pipe = NucleusMoEImagePipeline(transformer=transformer, scheduler=scheduler, vae=vae,
                                   text_encoder=text_encoder, processor=processor)
    pipe.set_progress_bar_config(disable=True)
    return pipe


class Tracer:
    """Records the tensors between stages while the pipeline runs; remove() undoes it."""

    def __init__(self, pipe: NucleusMoEImagePipeline):
        self.pipe, self.s = pipe, {}
        self.n_encode, self.calls, self.steps = 0, [], 0
        s = self.s
        enc, proc_call = pipe.encode_prompt, type(pipe.processor).__call__
        tracer = self

        def traced_encode(*a, **k):
            branch = "prompt" if tracer.n_encode == 0 else "negative"
            tracer.n_encode += 1

            def traced_proc(self_, *pa, **pk):
                r = proc_call(self_, *pa, **pk)
                s[f"{branch}_ids"] = r["input_ids"][0].to(torch.int32)
                s[f"{branch}_attention_mask"] = r["attention_mask"][0].to(torch.int32)
                return r

            type(pipe.processor).__call__ = traced_proc
            try:
                e, m = enc(*a, **k)
            finally:
                type(pipe.processor).__call__ = proc_call
            s[f"{branch}_embeds"] = e.detach().clone()
            if m is not None:
                s[f"{branch}_mask"] = m.to(torch.int32)
            return e, m

        pipe.encode_prompt = traced_encode
        prep = pipe.prepare_latents

        def traced_latents(*a, **k):
            lat = prep(*a, **k)
            s["initial_latents"] = lat.detach().clone()
            return lat

        pipe.prepare_latents = traced_latents
        unpack = pipe._unpack_latents

        def traced_unpack(x, *rest):
            s["final_latents"] = x.detach().clone()
            return unpack(x, *rest)

        pipe._unpack_latents = traced_unpack

        def on_transformer(mod, args, kwargs, out):
            if len(tracer.calls) < 2:
                tracer.calls.append(out[0].detach().clone())
                if len(tracer.calls) == 1:
                    s["step0_timestep"] = kwargs["timestep"].detach().clone()

        self.handle = pipe.transformer.register_forward_hook(on_transformer, with_kwargs=True)
        step = pipe.scheduler.step

        def traced_step(model_output, t, latents, *a, **k):
            r = step(model_output, t, latents, *a, **k)
            if tracer.steps == 0:
                s["sigmas"] = pipe.scheduler.sigmas.detach().clone()
                s["timesteps"] = pipe.scheduler.timesteps.detach().clone()
                s["step0_guided"] = (-model_output).detach().clone()
                s["step0_latents"] = r[0].detach().clone()
            tracer.steps += 1
            return r

        pipe.scheduler.step = traced_step

    def remove(self):
        for attr in ("encode_prompt", "prepare_latents", "_unpack_latents"):
            delattr(self.pipe, attr)
        del self.pipe.scheduler.step
        self.handle.remove()
        self.s["step0_cond"] = self.calls[0]
        if self.n_encode == 2:
            self.s["step0_uncond"] = self.calls[1]


# Stages kept for the cached case (the rest equal cfg's when the cache is exact).
TEXTKV_STAGES = ("step0_cond", "step0_uncond", "final_latents", "image")


def run_case(pipe, out: str, name: str, guidance: float, textkv: bool = False):
    case = os.path.join(out, name)
    fresh_dir(case)
    tr = Tracer(pipe)
    if textkv:
        pipe.transformer.enable_cache(TextKVCacheConfig())
    try:
        images = pipe(prompt=PROMPT, guidance_scale=guidance, num_inference_steps=STEPS,
                      height=HEIGHT, width=WIDTH, output_type="np",
                      generator=torch.Generator("cpu").manual_seed(SEED)).images
    finally:
        tr.remove()
        if textkv:
            pipe.transformer.disable_cache()
    image = images[0]
    pipe.numpy_to_pil(images)[0].save(os.path.join(case, "output.png"))
    stages = dict(tr.s)
    stages["image"] = torch.from_numpy(np.ascontiguousarray(image))
    if textkv:
        stages = {k: v for k, v in stages.items() if k in TEXTKV_STAGES}
    stages = {k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in stages.items()}
    write_st(os.path.join(case, "stages.safetensors"), stages)
    meta = {"guidance_scale": guidance, "negative_prompt": "" if guidance > 1 else None,
            "text_kv_cache": textkv, "height": HEIGHT, "width": WIDTH, "steps": STEPS,
            "transformer_calls_per_step": 2 if guidance > 1 else 1,
            "image_std": float(image.std()), "image_mean": float(image.mean()),
            "shapes": {k: list(v.shape) for k, v in stages.items()}}
    print(name, "std", image.std(), "mean", image.mean())
    return meta, image


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qwen3-tokenizer", required=True,
                    help="folder with the real tokenizer.json and tokenizer_config.json")
    ap.add_argument("--out", default="tests/golden/nucleus_pipeline")
    a = ap.parse_args()
    check_pins()
    setup_determinism()
    fresh_dir(a.out)
    tok_dir = os.path.join(a.out, ".tokenizer")
    pipe = components(a.qwen3_tokenizer, tok_dir)
    pipe.save_pretrained(os.path.join(a.out, "pipeline"), safe_serialization=True)
    shutil.rmtree(tok_dir)
    cases = {}
    cases["cfg"], img_cfg = run_case(pipe, a.out, "cfg", CFG_SCALE)
    cases["cfg_textkv"], img_kv = run_case(pipe, a.out, "cfg_textkv", CFG_SCALE, textkv=True)
    cases["cfg_textkv"]["bit_identical_to_cfg"] = bool(np.array_equal(img_cfg, img_kv))
    cases["cfg_textkv"]["max_abs_diff_to_cfg"] = float(np.abs(img_cfg - img_kv).max())
    cases["nocfg"], _ = run_case(pipe, a.out, "nocfg", 1.0)
    meta = {"script": SCRIPT, "pipeline": type(pipe).__name__, "versions": versions(),
            "prompt": PROMPT, "seed": SEED, "steps": STEPS, "guidance_scale": CFG_SCALE,
            "height": HEIGHT, "width": WIDTH, "dtype": "float32",
            "max_sequence_length": pipe.default_max_sequence_length,
            "return_index": pipe.default_return_index,
            "transformer_config": TRANSFORMER_CFG, "vae_config": VAE_CFG,
            "scheduler_config": {k: v for k, v in pipe.scheduler.config.items()
                                 if not k.startswith("_")},
            "cases": cases}
    json.dump(meta, open(os.path.join(a.out, "meta.json"), "w"), indent=1, ensure_ascii=False,
              default=str)
    total = 0
    for root, _, files in os.walk(a.out):
        for f in files:
            p = os.path.join(root, f)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    print("total", total, "bit identical", cases["cfg_textkv"]["bit_identical_to_cfg"])
    assert total < MAX_TOTAL_BYTES


if __name__ == "__main__":
    main()
