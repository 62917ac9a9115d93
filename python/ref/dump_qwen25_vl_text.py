#!/usr/bin/env python3
"""Golden dumps for flowkv's Qwen2.5-VL language side (Qwen-Image's prompt encoder).

Builds a tiny random-weight ``Qwen2_5_VLForConditionalGeneration`` (transformers 5.24.0) with the
real Qwen3 tokenizer cut to VOCAB ranks (Qwen2.5 and Qwen3 share the BPE and the vision special
tokens; dump_klein_pipeline.py's tiny_tokenizer cuts it) and records:

* ``mm``      the language model called as Qwen2_5_VLModel.forward calls it: inputs_embeds built
              here (token embeddings, the <|image_pad|> rows replaced by given vision embeddings)
              and the 3-D position_ids of ``get_rope_index`` for two images (grids 1x4x6 and
              2x6x4 patches: the second has two frames, so the t axis moves inside an image);
              ``input_ids``, ``image_grid_thw``, ``image_embeds``, ``position_ids``,
              ``layer.<k>`` (decoder layer k's output) and ``final`` (after the final norm)
* ``t2i_<n>`` QwenImagePipeline.encode_prompt (diffusers 0.42.1) for one prompt:
              ``input_ids`` (the tokenizer's, truncated at 1024 + 34), ``hidden`` (the encoder's
              hidden_states[-1] for all tokens) and ``prompt_embeds`` [L - 34 cut to
              max_sequence_length, H]; ``t2i_long`` is long enough to hit both the tokenizer's
              truncation and the 512 cut
* ``edit``    QwenImageEditPlusPipeline.encode_prompt with two images through a Qwen2VLProcessor
              (``input_ids`` with the pads expanded, ``image_grid_thw``, ``image_embeds`` the vision
              tower's output fed to the language model, ``prompt_embeds`` [L - 64, H]) and
              ``prompt_embeds_mrope``: the same with the 3-D positions of get_rope_index (what
              transformers 4.x computed from input_ids; 5.24 only does so when the caller passes
              mm_token_type_ids, which diffusers 0.42.1 does not, so the pipeline's own output
              uses positions 0..L-1 on every axis)

``t2i_short_bf16`` and ``edit_bf16`` are those cases run by the pipelines with the model in
bfloat16 (the released dtype); ``text_encoder_bf16/`` holds its language model's tensors in
bfloat16 (the vision tower left out).

Folders: ``text_encoder/`` (save_pretrained: config.json with text_config nested; the tensors as
transformers 4.x saved them and 5.24 still writes them: model.layers.*, model.embed_tokens,
visual.*, lm_head), ``text_encoder_alt/`` (the same weights with the other layouts: a flat
config.json, text fields at the top level and rope_scaling {"type": "mrope"}, as the released
Qwen-Image text_encoder/ carries it; the tensors under the module names model.language_model.*,
model.visual.*; loaded back here by transformers 5.24 and checked to give the same output),
``tokenizer/`` (tokenizer.json). Integers are stored as F32.

Usage (from the repository root; CMake unpacks the real tokenizer into the build tree)::

    python/ref/.venv/bin/python python/ref/dump_qwen25_vl_text.py \\
        --qwen3-tokenizer build/tests/golden/tokenizer --out tests/golden/qwen25_vl_text
"""

from __future__ import annotations

import argparse
import copy
import json
import os

import numpy as np
import PIL.Image
import safetensors.torch
import torch

import dump_klein_pipeline
from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
from transformers import Qwen2VLProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from diffusers import QwenImageEditPlusPipeline, QwenImagePipeline

from ref_common import check_pins, fresh_dir, setup_determinism, versions, write_st

SCRIPT = "python/ref/dump_qwen25_vl_text.py"
VOCAB = 1024
SEED = 2025
MAX_TOTAL_BYTES = 1536 * 1024

TEXT_CFG = dict(
    hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=2048,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [1, 1, 2]},
    hidden_act="silu", use_sliding_window=False,
)
VISION_CFG = dict(
    depth=2, hidden_size=16, intermediate_size=24, num_heads=2, in_channels=3, patch_size=14,
    spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=32, window_size=56,
    fullatt_block_indexes=[1], tokens_per_second=2, hidden_act="silu",
)
MM_GRIDS = [[1, 4, 6], [2, 6, 4]]
PROMPTS_T2I = {
    "t2i_short": "A red fox café in the snow, «watercolour» 🦊\nsecond line",
    "t2i_empty": "",
}
EDIT_PROMPT = "Put the fox of picture 1 into the snow of picture 2"
EDIT_SIZES = [(56, 84), (112, 56)]  # (width, height), multiples of 28: grids 1x6x4 and 1x4x8


def build_model(tok, vocab_size):
    ids = {n: tok.convert_tokens_to_ids(n) for n in
           ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"]}
    cfg = Qwen2_5_VLConfig(
        text_config=dict(TEXT_CFG, vocab_size=vocab_size), vision_config=VISION_CFG,
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False)
    model = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("norm1.weight") or name.endswith(
                    "norm2.weight") or name.endswith("ln_q.weight"):
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
            elif name.endswith("bias"):
                v = 0.3 * torch.randn(p.shape, generator=gen)
            elif p.dim() == 1 or name.endswith("embed_tokens.weight"):
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


def layer_outputs(model, fn):
    """Runs fn() and returns the decoder layers' outputs and the final norm's output."""
    lm = model.model.language_model
    got = {}
    hs = []
    for k, layer in enumerate(lm.layers):
        hs.append(layer.register_forward_hook(
            lambda m, a, o, k=k: got.__setitem__(f"layer.{k}", (o[0] if isinstance(o, tuple)
                                                               else o).detach().clone())))
    hs.append(lm.norm.register_forward_hook(
        lambda m, a, o: got.__setitem__("final", o.detach().clone())))
    try:
        with torch.no_grad():
            r = fn()
    finally:
        for h in hs:
            h.remove()
    return r, got


def mm_case(model, tok):
    cfg = model.config
    text = lambda s: tok(s)["input_ids"]  # noqa: E731
    ids = text("<|im_start|>user\nPicture 1: ")
    grids = torch.tensor(MM_GRIDS)
    for k, g in enumerate(MM_GRIDS):
        n = g[0] * g[1] * g[2] // 4
        ids += [cfg.vision_start_token_id] + [cfg.image_token_id] * n + [cfg.vision_end_token_id]
        ids += text(" then picture 2: " if k == 0 else " and a fox")
    ids += text("<|im_end|>\n")
    ids = torch.tensor([ids])
    n_img = int((ids == cfg.image_token_id).sum())
    gen = torch.Generator().manual_seed(SEED + 1)
    image_embeds = torch.randn(n_img, TEXT_CFG["hidden_size"], generator=gen)
    lm = model.model.language_model
    with torch.no_grad():
        embeds = lm.embed_tokens(ids)
        mask = (ids == cfg.image_token_id).unsqueeze(-1)
        embeds = embeds.masked_scatter(mask, image_embeds)
        mm_types = (ids == cfg.image_token_id).int()
        pos, _ = model.model.get_rope_index(ids, mm_types, image_grid_thw=grids)
    out, got = layer_outputs(model, lambda: lm(inputs_embeds=embeds, position_ids=pos,
                                               output_hidden_states=True))
    # transformers 5.24: hidden_states[-1] is the final norm's output (last_hidden_state).
    assert torch.equal(out.hidden_states[-1], out.last_hidden_state)
    assert torch.equal(out.last_hidden_state, got["final"])
    # The same through the full model from input_ids (its own scatter and get_rope_index).
    with torch.no_grad():
        full = model.model(input_ids=ids, image_grid_thw=grids, mm_token_type_ids=mm_types,
                           mm_encoder_outputs={"image": _pooled(image_embeds, grids)})
    assert torch.allclose(full.last_hidden_state, out.last_hidden_state, atol=1e-6)
    dump = {"input_ids": ids[0], "image_grid_thw": grids, "image_embeds": image_embeds,
            "position_ids": pos[:, 0], "final": got["final"][0]}
    for k in range(TEXT_CFG["num_hidden_layers"]):
        dump[f"layer.{k}"] = got[f"layer.{k}"][0]
    return dump


def _pooled(image_embeds, grids):
    from transformers.modeling_outputs import BaseModelOutputWithPooling
    sizes = (grids.prod(-1) // 4).tolist()
    return BaseModelOutputWithPooling(pooler_output=torch.split(image_embeds, sizes))


def t2i_case(pipe, prompt, max_sequence_length):
    rec = {}
    orig = pipe.text_encoder.forward

    def fwd(*a, **k):
        rec["input_ids"] = k["input_ids"].clone()
        r = orig(*a, **k)
        rec["hidden"] = r.hidden_states[-1].detach().clone()
        assert torch.equal(r.hidden_states[-1], r.last_hidden_state if hasattr(
            r, "last_hidden_state") else r.hidden_states[-1])
        return r

    pipe.text_encoder.forward = fwd
    try:
        with torch.no_grad():
            embeds, mask = pipe.encode_prompt(prompt, device="cpu",
                                              max_sequence_length=max_sequence_length)
    finally:
        del pipe.text_encoder.forward
    assert mask is None  # one prompt: no padding left
    return {"input_ids": rec["input_ids"][0], "hidden": rec["hidden"][0],
            "prompt_embeds": embeds[0]}


def edit_case(pipe, model, images):
    rec = {}
    orig_feats = model.model.get_image_features

    def feats(*a, **k):
        out = orig_feats(*a, **k)
        rec["image_embeds"] = torch.cat(out.pooler_output, 0).detach().clone()
        return out

    orig_call = type(pipe.processor).__call__

    def call(self, *a, **k):
        r = orig_call(self, *a, **k)
        rec.update({kk: v for kk, v in r.items()})
        return r

    model.model.get_image_features = feats
    type(pipe.processor).__call__ = call
    try:
        with torch.no_grad():
            embeds, mask = pipe.encode_prompt(EDIT_PROMPT, image=images, device="cpu")
            # The 3-D positions (transformers 4.x): the same call with mm_token_type_ids.
            out = model(input_ids=rec["input_ids"], attention_mask=rec["attention_mask"],
                        pixel_values=rec["pixel_values"], image_grid_thw=rec["image_grid_thw"],
                        mm_token_type_ids=rec["mm_token_type_ids"], output_hidden_states=True)
    finally:
        del model.model.get_image_features
        type(pipe.processor).__call__ = orig_call
    assert mask is None
    drop = pipe.prompt_template_encode_start_idx
    return {"input_ids": rec["input_ids"][0], "image_grid_thw": rec["image_grid_thw"],
            "image_embeds": rec["image_embeds"], "prompt_embeds": embeds[0],
            "prompt_embeds_mrope": out.hidden_states[-1][0, drop:]}


def write_alt_layout(model, src_dir, dst_dir):
    """The same model with a flat config.json (the text fields at the top level, rope_scaling
    {"type": "mrope"}: the released Qwen-Image text_encoder/) and the tensors under the module
    names (model.language_model.*, model.visual.*)."""
    os.makedirs(dst_dir, exist_ok=True)
    cfg = json.load(open(os.path.join(src_dir, "config.json")))
    text = cfg.pop("text_config")
    flat = {k: v for k, v in cfg.items()}
    for k, v in text.items():
        if k not in ("model_type", "dtype", "rope_parameters"):
            flat[k] = v
    rp = dict(text["rope_parameters"])
    flat["rope_theta"] = rp.pop("rope_theta")
    flat["rope_scaling"] = {"type": "mrope", "mrope_section": rp["mrope_section"]}
    flat["torch_dtype"] = "float32"
    flat["model_type"] = "qwen2_5_vl"
    flat["vision_config"]["model_type"] = "qwen2_5_vl"
    json.dump(flat, open(os.path.join(dst_dir, "config.json"), "w"), indent=1)
    sd = {k: v.contiguous().clone() for k, v in model.state_dict().items()}
    assert "model.language_model.embed_tokens.weight" in sd
    safetensors.torch.save_file(sd, os.path.join(dst_dir, "model.safetensors"),
                                metadata={"format": "pt"})
    return sd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qwen3-tokenizer", required=True)
    ap.add_argument("--out", default="tests/golden/qwen25_vl_text")
    args = ap.parse_args()
    setup_determinism()
    check_pins()
    fresh_dir(args.out)
    tok_dir = os.path.join(args.out, "tokenizer")
    tok, vocab_size = dump_klein_pipeline.tiny_tokenizer(args.qwen3_tokenizer, tok_dir, VOCAB,
                                                         drop_chat_template=True)
    model = build_model(tok, vocab_size)
    te_dir = os.path.join(args.out, "text_encoder")
    model.save_pretrained(te_dir, safe_serialization=True)
    # transformers 5.24 saves the tensors as 4.x did (model.layers.*, visual.*), the config with
    # text_config nested.
    keys = safetensors.torch.load_file(os.path.join(te_dir, "model.safetensors")).keys()
    assert "model.embed_tokens.weight" in keys and "visual.merger.mlp.0.weight" in keys
    alt_dir = os.path.join(args.out, "text_encoder_alt")
    write_alt_layout(model, te_dir, alt_dir)
    model_alt = Qwen2_5_VLForConditionalGeneration.from_pretrained(alt_dir).eval()

    meta = {"description": "tiny random Qwen2_5_VLForConditionalGeneration; see " + SCRIPT,
            "seed": SEED, "text_config": TEXT_CFG, "vision_config": VISION_CFG,
            "vocab_size": vocab_size, "image_token_id": model.config.image_token_id,
            "cases": {}, "versions": versions(), "generator": SCRIPT}

    dump = mm_case(model, tok)
    write_st(os.path.join(args.out, "mm.safetensors"), dump)
    assert torch.equal(mm_case(model_alt, tok)["final"], dump["final"])  # other layout: same model
    meta["cases"]["mm"] = {"grids": MM_GRIDS, "tokens": int(dump["input_ids"].numel())}

    pipe = QwenImagePipeline(scheduler=None, vae=None, text_encoder=model, tokenizer=tok,
                             transformer=None)
    long_prompt = " ".join(f"word{i} and" for i in range(700))
    cases = dict(PROMPTS_T2I, t2i_long=long_prompt)
    for name, prompt in cases.items():
        msl = 512
        d = t2i_case(pipe, prompt, msl)
        if name == "t2i_long":
            del d["hidden"]  # size: prompt_embeds covers it
        write_st(os.path.join(args.out, f"{name}.safetensors"), d)
        full = len(tok(pipe.prompt_template_encode.format(prompt))["input_ids"])
        meta["cases"][name] = {"prompt": prompt, "max_sequence_length": msl,
                               "tokens": int(d["input_ids"].numel()), "untruncated_tokens": full}
        print(name, "tokens", d["input_ids"].numel(), "of", full, "embeds",
              tuple(d["prompt_embeds"].shape))
    assert meta["cases"]["t2i_long"]["tokens"] == 1024 + 34
    meta["t2i_drop_idx"] = pipe.prompt_template_encode_start_idx

    image_processor = Qwen2VLImageProcessorPil(
        patch_size=14, temporal_patch_size=2, merge_size=2,
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
        size={"shortest_edge": 28 * 28, "longest_edge": 256 * 256})
    check = Qwen2VLProcessor.check_argument_for_proper_class
    Qwen2VLProcessor.check_argument_for_proper_class = (
        lambda self, name, arg: None if arg is None else check(self, name, arg))
    try:
        processor = Qwen2VLProcessor(image_processor=image_processor, tokenizer=tok,
                                     video_processor=None)
    finally:
        Qwen2VLProcessor.check_argument_for_proper_class = check
    epipe = QwenImageEditPlusPipeline(scheduler=None, vae=None, text_encoder=model, tokenizer=tok,
                                      processor=processor, transformer=None)
    images = [test_image(w, h, 10 + i) for i, (w, h) in enumerate(EDIT_SIZES)]
    d = edit_case(epipe, model, images)
    write_st(os.path.join(args.out, "edit.safetensors"), d)
    meta["cases"]["edit"] = {"prompt": EDIT_PROMPT, "images": EDIT_SIZES,
                             "grid_thw": d["image_grid_thw"].tolist(),
                             "tokens": int(d["input_ids"].numel())}
    meta["edit_drop_idx"] = epipe.prompt_template_encode_start_idx

    # bfloat16: the same weights run in bf16 (as the released checkpoint runs); the language
    # model's tensors saved in bf16 (kModel layout, no vision tower: flowkv reads none of it).
    model16 = copy.deepcopy(model).to(torch.bfloat16).eval()
    bf16_dir = os.path.join(args.out, "text_encoder_bf16")
    os.makedirs(bf16_dir)
    cfg16 = json.load(open(os.path.join(te_dir, "config.json")))
    cfg16["dtype"] = "bfloat16"
    json.dump(cfg16, open(os.path.join(bf16_dir, "config.json"), "w"), indent=1)
    sd16 = {k: v.contiguous() for k, v in model16.state_dict().items()
            if k.startswith("model.language_model.")}
    sd16 = {"model." + k[len("model.language_model."):]: v for k, v in sd16.items()}
    safetensors.torch.save_file(sd16, os.path.join(bf16_dir, "model.safetensors"),
                                metadata={"format": "pt"})
    pipe16 = QwenImagePipeline(scheduler=None, vae=None, text_encoder=model16, tokenizer=tok,
                               transformer=None)
    d = t2i_case(pipe16, PROMPTS_T2I["t2i_short"], 512)
    del d["hidden"]
    write_st(os.path.join(args.out, "t2i_short_bf16.safetensors"), d)
    epipe16 = QwenImageEditPlusPipeline(scheduler=None, vae=None, text_encoder=model16,
                                        tokenizer=tok, processor=processor, transformer=None)
    write_st(os.path.join(args.out, "edit_bf16.safetensors"), edit_case(epipe16, model16, images))
    meta["cases"]["t2i_short_bf16"] = dict(meta["cases"]["t2i_short"])
    meta["cases"]["edit_bf16"] = dict(meta["cases"]["edit"])

    # The drop indices against the real tokenizer: the template's text before the prompt.
    real = AutoTokenizer.from_pretrained(args.qwen3_tokenizer)
    for key, p in [("t2i", pipe), ("edit", epipe)]:
        head = p.prompt_template_encode.split("{}")[0]
        meta[f"{key}_template_head_tokens_real"] = len(real(head)["input_ids"])
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
        f.write("\n")
    total = 0
    for root, _, files in os.walk(args.out):
        for f in sorted(files):
            total += os.path.getsize(os.path.join(root, f))
    print(f"total {total} bytes; head tokens t2i {meta['t2i_template_head_tokens_real']}, "
          f"edit {meta['edit_template_head_tokens_real']}")
    assert total < MAX_TOTAL_BYTES


if __name__ == "__main__":
    main()
