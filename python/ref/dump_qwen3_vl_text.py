#!/usr/bin/env python3
"""Golden dumps for flowkv's Qwen3-VL language side (the Qwen-Image 2.1 prompt encoder).

Builds a tiny random-weight ``Qwen3VLForConditionalGeneration`` (transformers 5.24.0) and a
``Qwen3VLProcessor`` around the real Qwen3 tokenizer cut to VOCAB ranks (as
dump_klein_pipeline.py's tiny_tokenizer cuts it), puts them in a ``QwenImage21Pipeline``
(diffusers 0.42.1; no VAE, transformer or scheduler: only the prompt encoder runs) and calls the
pipeline's own ``_get_qwen_prompt_embeds`` for

* ``t2i``  a text-only prompt, and
* ``ti2i`` a prompt with two condition images of different sizes (grids 1x4x8 and 1x6x4 patches),

recording, through hooks, what the language model was given and what it computed. Writes under
``<out>/``:

* ``text_encoder/``   the model, ``save_pretrained`` (model.language_model.*, model.visual.*,
                      lm_head.weight; float32, every weight rounded to bfloat16 values)
* ``processor/``      the processor, ``save_pretrained`` (tokenizer.json, tokenizer_config.json,
                      the chat template, preprocessor_config.json)
* ``<case>.safetensors``  ``input_ids`` [L], ``position_ids`` [3, L], ``image_grid_thw`` [n, 3],
                      ``image_embeds`` [n_img_tokens, H] and ``deepstack.<k>`` (the vision
                      tower's outputs fed to the language model), ``layer0`` (output of decoder
                      layer 0, before the deepstack add, transformers' hidden_states[1]),
                      ``layer0_ds`` (after it: the input of layer 1), ``last_prenorm`` (the last
                      layer's output, the pipeline's hidden_states[-1]), ``prompt_embeds``
                      [L - drop, H] and ``image_pad_mask`` [L - drop]; integers stored as F32
* ``text_encoder_bf16/`` the same weights saved in bfloat16, and ``ti2i_bf16.safetensors`` the
                      ti2i case run by the pipeline with that bf16 model (vision tower included)
* ``meta.json``       prompts, drop index, token ids of the special tokens, versions

The chat template: the processor's ``apply_chat_template`` is used by the pipeline only to count
the system message's tokens (the drop index). Qwen's public Qwen3-VL Instruct checkpoints
(e.g. Qwen/Qwen3-VL-8B-Instruct, chat_template.json, Apache-2.0) render a leading system message
with text content as ``<|im_start|>system\\n`` + the text parts + ``<|im_end|>\\n`` (no tools),
user turns with ``<|vision_start|><|image_pad|><|vision_end|>`` per image, and
``<|im_start|>assistant\\n`` for the generation prompt. CHAT_TEMPLATE below is a short template
written here that renders those cases the same way (tools and videos left out).

Usage (from the repository root; the real tokenizer.json is unpacked by CMake into the build
tree from tests/golden/tokenizer/qwen3_tokenizer.tar.xz)::

    python/ref/.venv/bin/python python/ref/dump_qwen3_vl_text.py \\
        --qwen3-tokenizer build/tests/golden/tokenizer --out tests/golden/qwen3_vl_text
"""

from __future__ import annotations

import argparse
import copy
import json
import os

import numpy as np
import PIL.Image
import torch

import dump_klein_pipeline
from transformers import (AutoTokenizer, Qwen3VLConfig, Qwen3VLForConditionalGeneration,
                          Qwen3VLProcessor)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from diffusers import QwenImage21Pipeline

from ref_common import check_pins, fresh_dir, setup_determinism, versions, write_st

SCRIPT = "python/ref/dump_qwen3_vl_text.py"
VOCAB = 1024  # ranks kept from the real tokenizer
SEED = 2024
MAX_TOTAL_BYTES = 2 * 1024 * 1024

# See the module docstring: the system / user / assistant cases of the public Qwen3-VL Instruct
# template, in a short form.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}"
    "{%- else %}{%- for item in message.content %}"
    "{%- if item.type == 'image' or 'image' in item %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif 'text' in item %}{{- item.text }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

TEXT_CFG = dict(
    hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, max_position_embeddings=256,
    rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [2, 1, 1],
                     "mrope_interleaved": True},
    attention_bias=False, hidden_act="silu",
)
VISION_CFG = dict(
    depth=3, hidden_size=16, intermediate_size=32, num_heads=2, in_channels=3, patch_size=16,
    spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=32, num_position_embeddings=16,
    deepstack_visual_indexes=[0, 2], hidden_act="gelu_pytorch_tanh",
)
# smart_resize keeps these sizes (multiples of 32 = patch 16 x merge 2, within the pixel range).
IMAGE_SIZES = [(128, 64), (64, 96)]  # (width, height): grids (1, 4, 8) and (1, 6, 4)
PROMPT_T2I = "A red fox café in the snow, «watercolour» 🦊\nsecond line"
PROMPT_TI2I = "Put the fox from <image1> into the snow of <image2>"
# Literal special-token strings in a prompt are matched as those tokens (the tokenizer finds added
# tokens in the raw text); <|image_pad|> and <|video_pad|> are refused by the processor.
PROMPT_SPECIAL = "a <|im_start|>cat<|vision_start|> x<|endoftext|> {} <think>"


def tiny_tokenizer(real_dir: str, out_dir: str):
    """The real Qwen3 tokenizer cut to VOCAB ranks, without its chat template (the processor
    carries the Qwen3-VL one)."""
    return dump_klein_pipeline.tiny_tokenizer(real_dir, out_dir, VOCAB, drop_chat_template=True)


def build_model(tokenizer, vocab_size):
    ids = {n: tokenizer.convert_tokens_to_ids(n) for n in
           ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"]}
    cfg = Qwen3VLConfig(
        text_config=dict(TEXT_CFG, vocab_size=vocab_size),
        vision_config=VISION_CFG,
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    model = Qwen3VLForConditionalGeneration(cfg).eval()
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("norm1.weight") or name.endswith(
                    "norm2.weight"):
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
            elif name.endswith("bias"):
                v = 0.1 * torch.randn(p.shape, generator=gen)
            elif p.dim() == 1 or name.endswith("embed_tokens.weight") or "pos_embed" in name:
                v = torch.randn(p.shape, generator=gen)
            else:
                fan_in = int(np.prod(p.shape[1:]))
                v = torch.randn(p.shape, generator=gen) / fan_in ** 0.5
            p.copy_(v.to(torch.bfloat16).to(torch.float32))
    return model


def test_image(width, height, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.stack([255 * x / (width - 1), 255 * y / (height - 1), np.full_like(x, 90.0)], -1)
    img = img + rng.normal(0, 20, img.shape)
    return PIL.Image.fromarray(np.clip(np.round(img), 0, 255).astype(np.uint8), "RGB")


class Recorder:
    """Hooks on the model that record the language model's inputs and intermediates."""

    def __init__(self, model):
        self.store = {}
        lm = model.model.language_model
        self.handles = [
            lm.register_forward_pre_hook(self._lm_pre, with_kwargs=True),
            lm.layers[0].register_forward_hook(self._put("layer0")),
            lm.layers[1].register_forward_pre_hook(self._pre("layer0_ds")),
            lm.norm.register_forward_pre_hook(self._pre("last_prenorm")),
        ]
        self.orig_get_image_features = model.model.get_image_features
        model.model.get_image_features = self._image_features

    def _image_features(self, *a, **k):
        out = self.orig_get_image_features(*a, **k)
        self.store["image_embeds"] = torch.cat(out.pooler_output, 0).detach().clone()
        for i, feats in enumerate(out.deepstack_features):
            self.store[f"deepstack.{i}"] = torch.cat(feats, 0).detach().clone()
        return out

    def _lm_pre(self, mod, args, kwargs):
        pos = kwargs.get("position_ids")
        self.store["lm_position_ids"] = None if pos is None else pos.detach().clone()
        self.store["lm_inputs_embeds"] = kwargs["inputs_embeds"].detach().clone()

    def _put(self, name):
        def hook(mod, args, out):
            self.store[name] = (out[0] if isinstance(out, tuple) else out).detach().clone()
        return hook

    def _pre(self, name):
        def hook(mod, args):
            self.store[name] = args[0].detach().clone()
        return hook


def run_case(pipe, model, name, prompt, images, out, meta):
    rec = Recorder(model)
    proc_out = {}
    orig_call = type(pipe.processor).__call__

    def traced_call(self, *a, **k):
        r = orig_call(self, *a, **k)
        proc_out.update({kk: v for kk, v in r.items()})
        return r

    type(pipe.processor).__call__ = traced_call
    try:
        with torch.no_grad():
            embeds, mask, pad_mask = pipe._get_qwen_prompt_embeds(prompt, images, "cpu")
    finally:
        type(pipe.processor).__call__ = orig_call
    ids = proc_out["input_ids"][0]
    L = ids.shape[0]
    assert proc_out["attention_mask"].all()  # one prompt: no padding
    s = rec.store
    if s["lm_position_ids"] is None:  # text only: transformers numbers 0..L-1 on every axis
        pos = torch.arange(L).view(1, -1).expand(3, -1)
    else:
        pos = s["lm_position_ids"][:, 0]
    dump = {
        "input_ids": ids,
        "position_ids": pos,
        "layer0": s["layer0"][0],
        "layer0_ds": s["layer0_ds"][0],
        "last_prenorm": s["last_prenorm"][0],
        "prompt_embeds": embeds[0],
        "image_pad_mask": pad_mask[0],
        "embeds_mask": mask[0],
    }
    if images is not None:
        grid = proc_out["image_grid_thw"]
        dump["image_grid_thw"] = grid
        dump["image_embeds"] = s["image_embeds"]
        for k in range(len(VISION_CFG["deepstack_visual_indexes"])):
            dump[f"deepstack.{k}"] = s[f"deepstack.{k}"]
        # The processor's expansion: t*h*w/merge^2 pads per image.
        n_pad = int((ids == model.config.image_token_id).sum())
        assert n_pad == int((grid.prod(-1) // 4).sum()) == s["image_embeds"].shape[0]
    assert torch.equal(embeds[0], s["last_prenorm"][0][pipe._drop_idx:])
    write_st(os.path.join(out, f"{name}.safetensors"), dump)
    meta["cases"][name] = {
        "prompt": prompt,
        "images": None if images is None else [list(im.size) for im in images],
        "tokens": L,
        "grid_thw": None if images is None else proc_out["image_grid_thw"].tolist(),
    }
    for h in rec.handles:
        h.remove()
    model.model.get_image_features = rec.orig_get_image_features
    return ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qwen3-tokenizer", required=True,
                    help="folder with the real Qwen3 tokenizer.json and tokenizer_config.json")
    ap.add_argument("--out", default="tests/golden/qwen3_vl_text")
    args = ap.parse_args()
    setup_determinism()
    check_pins()
    fresh_dir(args.out)
    proc_dir = os.path.join(args.out, "processor")
    tokenizer, vocab_size = tiny_tokenizer(args.qwen3_tokenizer, proc_dir)
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=16, temporal_patch_size=2, merge_size=2,
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
        size={"shortest_edge": 32 * 32, "longest_edge": 256 * 256})
    # No video processor: transformers' Qwen3-VL one needs torchvision (not pinned) and the
    # pipeline passes no videos. The class check is skipped for that one None argument.
    check = Qwen3VLProcessor.check_argument_for_proper_class
    Qwen3VLProcessor.check_argument_for_proper_class = (
        lambda self, name, arg: None if arg is None else check(self, name, arg))
    try:
        processor = Qwen3VLProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                     video_processor=None, chat_template=CHAT_TEMPLATE)
    finally:
        Qwen3VLProcessor.check_argument_for_proper_class = check
    image_processor.save_pretrained(proc_dir)
    with open(os.path.join(proc_dir, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)

    model = build_model(tokenizer, vocab_size)
    te_dir = os.path.join(args.out, "text_encoder")
    model.save_pretrained(te_dir, safe_serialization=True)

    pipe = QwenImage21Pipeline(scheduler=None, vae=None, text_encoder=model, processor=processor,
                               transformer=None)
    sys_text = "<|im_start|>system\n" + pipe.sys_prompt + "<|im_end|>\n"
    assert processor.apply_chat_template(
        [{"role": "system", "content": [{"type": "text", "text": pipe.sys_prompt}]}],
        tokenize=False) == sys_text
    meta = {
        "description": "tiny random Qwen3VLForConditionalGeneration run by QwenImage21Pipeline."
                       "_get_qwen_prompt_embeds (diffusers 0.42.1); see " + SCRIPT,
        "seed": SEED,
        "text_config": TEXT_CFG,
        "vision_config": VISION_CFG,
        "vocab_size": vocab_size,
        "drop_idx": pipe._drop_idx,
        "system_text": sys_text,
        "image_token_id": model.config.image_token_id,
        "cases": {},
        "versions": versions(),
        "generator": SCRIPT,
    }
    run_case(pipe, model, "t2i", PROMPT_T2I, None, args.out, meta)
    images = [test_image(w, h, 10 + i) for i, (w, h) in enumerate(IMAGE_SIZES)]
    run_case(pipe, model, "ti2i", PROMPT_TI2I, images, args.out, meta)
    # The empty prompt becomes " " (the pipeline's rule): its ids are checked too.
    run_case(pipe, model, "empty", "", None, args.out, meta)
    run_case(pipe, model, "special", PROMPT_SPECIAL, None, args.out, meta)
    # bfloat16: the same weights saved and run in bf16, as a released checkpoint runs (the vision
    # tower too: its bf16 outputs are what the language model is fed).
    model16 = copy.deepcopy(model).to(torch.bfloat16).eval()
    model16.save_pretrained(os.path.join(args.out, "text_encoder_bf16"), safe_serialization=True)
    pipe16 = QwenImage21Pipeline(scheduler=None, vae=None, text_encoder=model16,
                                 processor=processor, transformer=None)
    run_case(pipe16, model16, "ti2i_bf16", PROMPT_TI2I, images, args.out, meta)
    for bad, imgs in [("a <|image_pad|> b", None), ("a <|image_pad|> b", images),
                      ("a <|video_pad|>", None)]:
        try:
            pipe._get_qwen_prompt_embeds(bad, imgs, "cpu")
            raise AssertionError(f"{bad!r} was accepted")
        except ValueError as e:
            meta.setdefault("refused", []).append(
                {"prompt": bad, "images": 0 if imgs is None else len(imgs), "error": str(e)})
    # The drop index of the real tokenizer (the released template's system message).
    real = AutoTokenizer.from_pretrained(args.qwen3_tokenizer)
    meta["drop_idx_real_tokenizer"] = len(real(sys_text)["input_ids"])
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
        f.write("\n")
    total = 0
    for root, _, files in os.walk(args.out):
        for f in sorted(files):
            p = os.path.join(root, f)
            total += os.path.getsize(p)
            print(f"{p}: {os.path.getsize(p)} bytes")
    print(f"total {total} bytes; drop_idx {pipe._drop_idx}, real {meta['drop_idx_real_tokenizer']}")
    assert total < MAX_TOTAL_BYTES


if __name__ == "__main__":
    main()
