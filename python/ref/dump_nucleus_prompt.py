#!/usr/bin/env python3
"""Golden dumps for flowkv's NucleusMoE-Image prompt encoder (diffusers 0.42.1
NucleusMoEImagePipeline.encode_prompt with transformers 5.24.0's Qwen3-VL).

Builds a tiny random-weight ``Qwen3VLForConditionalGeneration`` (10 text layers, so that
``hidden_states[-8]`` is the output of decoder layer 2) and a ``Qwen3VLProcessor`` around the real
Qwen3 tokenizer cut to 1024 ranks (dump_qwen3_vl_text.tiny_tokenizer), with the short Qwen3-VL
Instruct chat template of dump_qwen3_vl_text.py, puts them in a ``NucleusMoEImagePipeline`` (no
transformer, VAE or scheduler) and calls the pipeline's own ``encode_prompt`` for one prompt at a
time, as the pipeline does for the prompt and the negative prompt. Writes under ``<out>/``:

* ``text_encoder/``   the model (float32, every weight rounded to bfloat16 values)
* ``processor/``      tokenizer.json, tokenizer_config.json (no padding_side / truncation_side:
                      transformers' defaults, right and right), the chat template,
                      preprocessor_config.json
* ``processor_left/`` the same with ``"padding_side": "left"`` and ``"truncation_side": "left"``
                      in tokenizer_config.json (the other files are symlinks to processor/)
* ``<case>.safetensors``  ``input_ids`` [L] and ``attention_mask`` [L] (the processor's, int32),
                      ``prompt_embeds`` [1, L, H] (f32), ``mask`` [L] (int32; absent when the
                      pipeline returned None, i.e. no padding)
* ``meta.json``       each case's prompt, processor, max_sequence_length, return_index, the
                      rendered template text, the lengths; the pad token; versions

Usage (from the repository root)::

    python/ref/.venv/bin/python python/ref/dump_nucleus_prompt.py \\
        --qwen3-tokenizer build/tests/golden/tokenizer --out tests/golden/nucleus_prompt
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch
from transformers import AutoTokenizer, Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from diffusers import NucleusMoEImagePipeline
from diffusers.pipelines.nucleusmoe_image.pipeline_nucleusmoe_image import DEFAULT_SYSTEM_PROMPT

import dump_qwen3_vl_text
from ref_common import check_pins, fresh_dir, setup_determinism, versions, write_st

SCRIPT = "python/ref/dump_nucleus_prompt.py"
SEED = 2025
MAX_TOTAL_BYTES = 1536 * 1024
CHAT_TEMPLATE = dump_qwen3_vl_text.CHAT_TEMPLATE

TEXT_CFG = dict(
    hidden_size=32, intermediate_size=48, num_hidden_layers=10, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, max_position_embeddings=2048,
    rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [2, 1, 1],
                     "mrope_interleaved": True},
    attention_bias=False, hidden_act="silu",
)
VISION_CFG = dict(
    depth=1, hidden_size=16, intermediate_size=16, num_heads=2, in_channels=3, patch_size=16,
    spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=32, num_position_embeddings=16,
    deepstack_visual_indexes=[0], hidden_act="gelu_pytorch_tanh",
)
IMAGE_PROCESSOR = dict(patch_size=16, temporal_patch_size=2, merge_size=2,
                       image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
                       size={"shortest_edge": 32 * 32, "longest_edge": 256 * 256})
LONG = ("A red fox café in the snow, «watercolour» 🦊 next to a frozen lake, with pine trees on "
        "the left and a wooden cabin on the right, three birds in the sky")


def build_model(tokenizer, vocab_size):
    ids = {n: tokenizer.convert_tokens_to_ids(n) for n in
           ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"]}
    cfg = Qwen3VLConfig(
        text_config=dict(TEXT_CFG, vocab_size=vocab_size), vision_config=VISION_CFG,
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True)
    torch.manual_seed(SEED)
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


def make_processor(tokenizer):
    check = Qwen3VLProcessor.check_argument_for_proper_class
    Qwen3VLProcessor.check_argument_for_proper_class = (
        lambda self, name, arg: None if arg is None else check(self, name, arg))
    try:
        return Qwen3VLProcessor(image_processor=Qwen2VLImageProcessorPil(**IMAGE_PROCESSOR),
                                tokenizer=tokenizer, video_processor=None,
                                chat_template=CHAT_TEMPLATE)
    finally:
        Qwen3VLProcessor.check_argument_for_proper_class = check


def save_processor(processor, tokenizer_dir, proc_dir):
    processor.image_processor.save_pretrained(proc_dir)
    with open(os.path.join(proc_dir, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)
    assert os.path.exists(os.path.join(tokenizer_dir, "tokenizer.json"))


def run_case(pipe, name, prompt, out, meta, max_length=1024, return_index=None, proc="processor"):
    got = {}
    orig = type(pipe.processor).__call__

    def traced(self, *a, **k):
        r = orig(self, *a, **k)
        got.update(text=k.get("text"), ids=r["input_ids"][0].clone(),
                   mask=r["attention_mask"][0].clone())
        return r

    type(pipe.processor).__call__ = traced
    try:
        with torch.no_grad():
            embeds, mask = pipe.encode_prompt(prompt, device="cpu", max_sequence_length=max_length,
                                              return_index=return_index)
    finally:
        type(pipe.processor).__call__ = orig
    dump = {"input_ids": got["ids"].to(torch.int32), "attention_mask": got["mask"].to(torch.int32),
            "prompt_embeds": embeds.float()}
    if mask is not None:
        dump["mask"] = mask[0].to(torch.int32)
    write_st(os.path.join(out, f"{name}.safetensors"), dump)
    full = pipe.processor.tokenizer(got["text"][0])["input_ids"]
    meta["cases"][name] = {
        "prompt": prompt, "processor": proc, "max_sequence_length": max_length,
        "return_index": return_index if return_index is not None else pipe.default_return_index,
        "text": got["text"][0], "untruncated_tokens": len(full), "tokens": int(got["ids"].shape[0]),
        "valid": int(got["mask"].sum()), "mask_none": mask is None,
    }
    print(name, meta["cases"][name]["tokens"], meta["cases"][name]["valid"], len(full))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qwen3-tokenizer", required=True)
    ap.add_argument("--out", default="tests/golden/nucleus_prompt")
    args = ap.parse_args()
    setup_determinism()
    check_pins()
    fresh_dir(args.out)
    proc_dir = os.path.join(args.out, "processor")
    tokenizer, vocab_size = dump_qwen3_vl_text.tiny_tokenizer(args.qwen3_tokenizer, proc_dir)
    assert tokenizer.padding_side == "right" and tokenizer.truncation_side == "right"
    processor = make_processor(tokenizer)
    save_processor(processor, proc_dir, proc_dir)
    left_dir = os.path.join(args.out, "processor_left")
    os.makedirs(left_dir)
    cfg = json.load(open(os.path.join(proc_dir, "tokenizer_config.json"), encoding="utf-8"))
    cfg.update(padding_side="left", truncation_side="left")
    json.dump(cfg, open(os.path.join(left_dir, "tokenizer_config.json"), "w", encoding="utf-8"),
              ensure_ascii=False, indent=1)
    for f in os.listdir(proc_dir):
        if f != "tokenizer_config.json":
            os.symlink(os.path.join("..", "processor", f), os.path.join(left_dir, f))
    left_tok = AutoTokenizer.from_pretrained(left_dir)
    assert left_tok.padding_side == "left" and left_tok.truncation_side == "left"
    left_processor = make_processor(left_tok)

    model = build_model(tokenizer, vocab_size)
    model.save_pretrained(os.path.join(args.out, "text_encoder"), safe_serialization=True)
    pipe = NucleusMoEImagePipeline(transformer=None, scheduler=None, vae=None, text_encoder=model,
                                   processor=processor)
    pipe_left = NucleusMoEImagePipeline(transformer=None, scheduler=None, vae=None,
                                        text_encoder=model, processor=left_processor)
    meta = {
        "description": "tiny random Qwen3VLForConditionalGeneration run by NucleusMoEImagePipeline"
                       ".encode_prompt (diffusers 0.42.1); see " + SCRIPT,
        "seed": SEED, "text_config": TEXT_CFG, "vocab_size": vocab_size,
        "system_prompt": DEFAULT_SYSTEM_PROMPT,
        "pad_token": tokenizer.pad_token, "pad_token_id": tokenizer.pad_token_id,
        "cases": {}, "versions": versions(), "generator": SCRIPT,
    }
    # A prompt whose template is a whole number of 8 tokens: no padding, mask None.
    n0 = len(tokenizer(pipe._format_prompt("a"))["input_ids"])
    whole = "a" + " a" * ((8 - n0 % 8) % 8)
    run_case(pipe, "short", "a red fox", args.out, meta)
    run_case(pipe, "whole", whole, args.out, meta)
    run_case(pipe, "long", LONG, args.out, meta)
    run_case(pipe, "empty", "", args.out, meta)
    run_case(pipe, "trunc", LONG, args.out, meta, max_length=16)
    run_case(pipe, "trunc_mid", LONG, args.out, meta, max_length=72)
    run_case(pipe, "index_m3", "a red fox", args.out, meta, return_index=-3)
    run_case(pipe, "index_last", "a red fox", args.out, meta, return_index=-1)
    run_case(pipe_left, "left_short", "a red fox", args.out, meta, proc="processor_left")
    run_case(pipe_left, "left_trunc", LONG, args.out, meta, max_length=72, proc="processor_left")
    # A max_length that is not a multiple of 8 is refused by the tokenizer (truncation and
    # pad_to_multiple_of together).
    try:
        pipe.encode_prompt(LONG, device="cpu", max_sequence_length=13)
        raise AssertionError("max_length 13 was accepted")
    except ValueError as e:
        meta["refused"] = {"max_sequence_length": 13, "error": str(e)}
    assert meta["cases"]["whole"]["mask_none"] and not meta["cases"]["short"]["mask_none"]
    # transformers 5.24 replaces the last recorded hidden state with the final norm's output.
    with torch.no_grad():
        ids = processor(text=[pipe._format_prompt("x")], return_tensors="pt")
        o = model(**ids, output_hidden_states=True)
        lm = model.model.language_model
        meta["hidden_states_last_is_normed"] = bool(
            torch.equal(o.hidden_states[-1], o.hidden_states[-1]) and
            torch.allclose(o.hidden_states[-1], lm.norm(lm.layers[-1](
                o.hidden_states[-2], position_embeddings=lm.rotary_emb(
                    o.hidden_states[-2], torch.arange(o.hidden_states[-2].shape[1]).view(1, 1, -1)
                    .expand(3, 1, -1)), attention_mask=None)), atol=1e-5))
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
        f.write("\n")
    total = 0
    for root, _, files in os.walk(args.out):
        for f in sorted(files):
            p = os.path.join(root, f)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    print(f"total {total} bytes; last normed {meta['hidden_states_last_is_normed']}")
    assert total < MAX_TOTAL_BYTES


if __name__ == "__main__":
    main()
