#!/usr/bin/env python3
"""Whole-pipeline golden dumps for `flowkv generate` on Qwen-Image-2.1: a tiny random-weight
QwenImage21Pipeline (diffusers 0.42.1, transformers 5.24.0: Qwen3-VL prompt encoder with its
processor, AutoencoderKLQwenImage21, QwenImage21Transformer2DModel), run from a prompt, a negative
prompt (true CFG), two condition images of different sizes (one RGBA, one RGB) and a seed to the
output image, in float32 on the CPU, with and without the prefix KV cache.

Under ``<out>/``:

* ``pipeline/``           the folder as ``save_pretrained`` writes it (model_index.json,
                          scheduler/, text_encoder/, processor/, transformer/, vae/)
* ``cond_rgba.png``, ``cond_rgb.png``   the condition images
* ``<case>/output.png``   diffusers' output (PIL) for each case: ``cfg_cached``, ``cfg_uncached``,
                          ``t2i`` (no condition image, no CFG)
* ``<case>/stages.safetensors``  (not for ``cfg_uncached``) the tensors between stages (prompt ids, embeddings and
                          image-pad masks of both branches, the processor's pixel values, the
                          condition latents, the noise, the final latents, the decoded image)
* ``meta.json``           prompts, seed, sizes, steps, versions

The tokenizer is the real Qwen3 tokenizer (its tokenizer.json and tokenizer_config.json, e.g. the
ones CMake unpacks into build/tests/golden/tokenizer/) cut to its first VOCAB ranks, special tokens
renumbered after the cut (dump_klein_pipeline.tiny_tokenizer). The chat template only serves the
pipeline's drop index (the system message's token count); it renders a system message the way
Qwen3-VL's template does.

Usage (from the repository root)::

    python/ref/.venv/bin/python python/ref/dump_qwen21_pipeline.py \
        --qwen3-tokenizer build/tests/golden/tokenizer --out tests/golden/qwen21_pipeline
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import PIL.Image
import torch
from transformers import AutoTokenizer, Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from diffusers import (
    AutoencoderKLQwenImage21,
    FlowMatchEulerDiscreteScheduler,
    QwenImage21Pipeline,
    QwenImage21Transformer2DModel,
)

from dump_klein_pipeline import tiny_tokenizer
from ref_common import check_pins, fresh_dir, setup_determinism, versions, write_st

SCRIPT = "python/ref/dump_qwen21_pipeline.py"
MAX_FILE_BYTES = 2 * 1024 * 1024

# Qwen3-VL's chat template for a message list (system / user / assistant, string or typed
# content): what apply_chat_template renders for the pipeline's system message.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif content['type'] == 'text' %}{{- content['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# The released Qwen3-VL preprocessor_config.json values.
IMAGE_PROCESSOR = dict(patch_size=16, temporal_patch_size=2, merge_size=2,
                       image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
                       size={"longest_edge": 16777216, "shortest_edge": 65536 // 64})
TEXT_HIDDEN = 32
Z_DIM = 16
SCHED_CFG = dict(num_train_timesteps=1000, base_image_seq_len=256, max_image_seq_len=8192,
                 base_shift=0.5, max_shift=0.9, shift=1.0, shift_terminal=0.02,
                 time_shift_type="exponential", use_dynamic_shifting=True)
VAE_CFG = dict(base_dim=8, decoder_base_dim=12, z_dim=Z_DIM, dim_mult=[1, 2, 2, 2, 2],
               num_res_blocks=1, temperal_downsample=[False, True, True, True])
TRANSFORMER_CFG = dict(patch_size=1, in_channels=Z_DIM, out_channels=Z_DIM, num_layers=2,
                       attention_head_dim=16, num_attention_heads=2, context_in_dim=TEXT_HIDDEN,
                       mlp_ratio=2, axes_dims_rope=(4, 6, 6))
PROMPT = "A red fox café in the snow, «watercolour» 🦊 <|im_end|> next to <image1>"
NEGATIVE = "blurry, low quality"
SEED = 42
STEPS = 3
CFG_SCALE = 4.0
OUTPUT_RESOLUTION = 64  # condition images resized to about 64x64 pixels of area (multiples of 32)
HEIGHT, WIDTH = 64, 96  # the output size of the conditioned cases


def cond_images() -> tuple[PIL.Image.Image, PIL.Image.Image]:
    """An 80x72 RGBA image (gradients, a disc, seeded noise, a varying alpha with a hole) and a
    50x100 RGB image."""
    rng = np.random.default_rng(7)
    h, w = 72, 80
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    rgb = np.stack([255 * x / (w - 1), 255 * y / (h - 1),
                    np.where((x - 30) ** 2 + (y - 40) ** 2 < 300, 230.0, 40.0)], -1)
    rgb += rng.normal(0, 12, rgb.shape)
    alpha = np.clip(255 * (0.3 + 0.7 * x / (w - 1)), 0, 255)
    alpha[(x - 55) ** 2 + (y - 20) ** 2 < 80] = 0
    rgba = np.concatenate([rgb, alpha[..., None]], -1)
    a = PIL.Image.fromarray(np.clip(np.round(rgba), 0, 255).astype(np.uint8), "RGBA")
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


def _check_class(self, name, arg, _orig=Qwen3VLProcessor.check_argument_for_proper_class):
    # The video processor's class lookup needs torchvision, which the reference venv does not
    # install (so the image processor is the PIL one); the pipeline reads no video.
    return None if arg is None else _orig(self, name, arg)


Qwen3VLProcessor.check_argument_for_proper_class = _check_class


def _save_processor(self, save_directory, **_):
    # ProcessorMixin.save_pretrained needs every attribute, the absent video processor too: the
    # files a released processor/ folder holds for images and text, saved part by part.
    os.makedirs(save_directory, exist_ok=True)
    self.tokenizer.save_pretrained(save_directory)
    self.image_processor.save_pretrained(save_directory)
    json.dump({"chat_template": self.chat_template},
              open(os.path.join(save_directory, "chat_template.json"), "w"), indent=1)


Qwen3VLProcessor.save_pretrained = _save_processor


def components(tok_dir: str, vocab_size: int) -> QwenImage21Pipeline:
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    image_token_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    processor = Qwen3VLProcessor(image_processor=Qwen2VLImageProcessorPil(**IMAGE_PROCESSOR),
                                 tokenizer=tokenizer, video_processor=None,
                                 chat_template=CHAT_TEMPLATE)
    cfg = Qwen3VLConfig(
        text_config=dict(vocab_size=vocab_size, hidden_size=TEXT_HIDDEN, intermediate_size=48,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, rms_norm_eps=1e-6, max_position_embeddings=2048,
                         rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                                          "mrope_section": [2, 1, 1], "mrope_interleaved": True}),
        vision_config=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2,
                           in_channels=3, patch_size=16, spatial_merge_size=2,
                           temporal_patch_size=2, out_hidden_size=TEXT_HIDDEN,
                           num_position_embeddings=16, deepstack_visual_indexes=[0, 2]),
        image_token_id=image_token_id,
        video_token_id=tokenizer.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tokenizer.convert_tokens_to_ids("<|vision_start|>"),
        vision_end_token_id=tokenizer.convert_tokens_to_ids("<|vision_end|>"),
        tie_word_embeddings=True)
    torch.manual_seed(0)
    text_encoder = Qwen3VLForConditionalGeneration(cfg).eval()
    init_small(text_encoder, 10)
    torch.manual_seed(1)
    g = torch.Generator().manual_seed(11)
    vae = AutoencoderKLQwenImage21(
        **VAE_CFG, latents_mean=(torch.randn(Z_DIM, generator=g) * 0.5).tolist(),
        latents_std=(torch.rand(Z_DIM, generator=g) * 1.5 + 0.5).tolist()).eval()
    init_small(vae, 12, 0.15)
    torch.manual_seed(2)
    transformer = QwenImage21Transformer2DModel(**TRANSFORMER_CFG).eval()
    init_small(transformer, 13, 0.1)
    scheduler = FlowMatchEulerDiscreteScheduler(**SCHED_CFG)
    pipe = QwenImage21Pipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder,
                               processor=processor, transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def trace(pipe: QwenImage21Pipeline, stages: dict[str, torch.Tensor]):
    """Records the tensors between stages while the pipeline runs."""
    n_prompt = [0]
    get = pipe._get_qwen_prompt_embeds

    def traced_embeds(prompt, image=None, device=None):
        branch = "prompt" if n_prompt[0] == 0 else "negative"
        n_prompt[0] += 1
        proc = pipe.processor
        orig = proc.__call__

        def traced_proc(*a, **k):
            r = orig(*a, **k)
            stages[f"{branch}_ids"] = r["input_ids"].to(torch.int32)
            if "pixel_values" in r and branch == "prompt":  # the negative branch's are the same
                stages[f"{branch}_pixel_values"] = r["pixel_values"].detach().clone()
                stages[f"{branch}_grid_thw"] = r["image_grid_thw"].to(torch.int32)
            return r

        proc.__class__ = type("TracedProcessor", (proc.__class__,), {"__call__": lambda s, *a, **k: traced_proc(*a, **k)})
        try:
            e, m, pad = get(prompt, image, device)
        finally:
            proc.__class__ = proc.__class__.__mro__[1]
        stages[f"{branch}_embeds"] = e.detach().clone()
        stages[f"{branch}_pad_mask"] = pad.to(torch.int32)
        return e, m, pad

    pipe._get_qwen_prompt_embeds = traced_embeds

    enc = pipe._encode_vae_image

    def traced_vae_image(image, generator):
        k = sum(1 for n in stages if n.startswith("cond_pixels_"))
        stages[f"cond_pixels_{k}"] = image.detach().clone()
        z = enc(image, generator)
        stages[f"cond_latents_{k}"] = z.detach().clone()
        return z

    pipe._encode_vae_image = traced_vae_image

    prep = pipe.prepare_latents

    def traced_latents(*a, **k):
        lat, img = prep(*a, **k)
        stages["noise"] = lat.detach().clone()
        return lat, img

    pipe.prepare_latents = traced_latents

    unpack = pipe._unpack_latents

    def traced_unpack(x, *rest):
        stages["final_latents"] = x.detach().clone()
        return unpack(x, *rest)

    pipe._unpack_latents = traced_unpack

    decode = pipe.vae.decode

    def traced_decode(z, *a, **k):
        stages["decoder_input"] = z.detach().clone()
        r = decode(z, *a, **k)
        stages["decoded"] = r[0].detach().clone()
        return r

    pipe.vae.decode = traced_decode


def run_case(pipe, out: str, name: str, images, negative, cfg_scale, kv: bool, hw,
             keep_stages: bool = True):
    case = os.path.join(out, name)
    fresh_dir(case)
    stages: dict[str, torch.Tensor] = {}
    trace(pipe, stages)
    kwargs = dict(prompt=PROMPT, num_inference_steps=STEPS, output_type="pil", use_kv_cache=kv,
                  generator=torch.Generator("cpu").manual_seed(SEED),
                  output_resolution=OUTPUT_RESOLUTION)
    if images:
        kwargs["image"] = images
    if negative is not None:
        kwargs.update(negative_prompt=negative, true_cfg_scale=cfg_scale)
    if hw is not None:
        kwargs.update(height=hw[0], width=hw[1])
    image = pipe(**kwargs).images[0]
    for attr in ("_get_qwen_prompt_embeds", "_encode_vae_image", "prepare_latents", "_unpack_latents"):
        delattr(pipe, attr)
    del pipe.vae.decode
    image.save(os.path.join(case, "output.png"))
    stages = {k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in stages.items()}
    if keep_stages:
        write_st(os.path.join(case, "stages.safetensors"), stages)
    return {"mode": image.mode, "size": list(image.size), "kv_cache": kv,
            "negative_prompt": negative, "true_cfg_scale": cfg_scale, "images": len(images or []),
            "height": hw[0] if hw else None, "width": hw[1] if hw else None,
            "shapes": {k: list(v.shape) for k, v in stages.items()}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qwen3-tokenizer", required=True,
                    help="folder with the real tokenizer.json and tokenizer_config.json")
    ap.add_argument("--out", default="tests/golden/qwen21_pipeline")
    a = ap.parse_args()
    check_pins()
    setup_determinism()
    fresh_dir(a.out)
    tok_dir = os.path.join(a.out, ".tokenizer")
    _, vocab_size = tiny_tokenizer(a.qwen3_tokenizer, tok_dir)
    rgba, rgb = cond_images()
    rgba.save(os.path.join(a.out, "cond_rgba.png"))
    rgb.save(os.path.join(a.out, "cond_rgb.png"))
    pipe = components(tok_dir, vocab_size)
    pipe.save_pretrained(os.path.join(a.out, "pipeline"), safe_serialization=True)
    imgs = [PIL.Image.open(os.path.join(a.out, f)) for f in ("cond_rgba.png", "cond_rgb.png")]
    cases = {
        "cfg_cached": run_case(pipe, a.out, "cfg_cached", imgs, NEGATIVE, CFG_SCALE, True, None),
        "cfg_uncached": run_case(pipe, a.out, "cfg_uncached", imgs, NEGATIVE, CFG_SCALE, False, None,
                                 keep_stages=False),
        "t2i": run_case(pipe, a.out, "t2i", None, None, 1.0, True, (HEIGHT, WIDTH)),
    }
    meta = {"script": SCRIPT, "pipeline": type(pipe).__name__, "prompt": PROMPT,
            "negative_prompt": NEGATIVE, "seed": SEED, "steps": STEPS,
            "true_cfg_scale": CFG_SCALE, "output_resolution": OUTPUT_RESOLUTION,
            "images": ["cond_rgba.png", "cond_rgb.png"], "drop_idx": pipe._drop_idx,
            "img_token_id": pipe._img_token_id, "versions": versions(), "cases": cases}
    json.dump(meta, open(os.path.join(a.out, "meta.json"), "w"), indent=1, ensure_ascii=False)
    for f in os.listdir(tok_dir):
        os.remove(os.path.join(tok_dir, f))
    os.rmdir(tok_dir)
    for root, _, files in os.walk(a.out):
        for f in files:
            assert os.path.getsize(os.path.join(root, f)) < MAX_FILE_BYTES, f"{f} is too large"


if __name__ == "__main__":
    main()
