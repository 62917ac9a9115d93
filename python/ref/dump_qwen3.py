#!/usr/bin/env python3
"""Golden reference dumper for flowkv's Qwen3 text encoder (the FLUX.2 Klein prompt encoder).

Runs transformers' own ``Qwen3ForCausalLM`` on a tiny random-weight config, in float32 on the
CPU, the way diffusers' ``Flux2KleinPipeline._get_qwen3_prompt_embeds`` calls it
(``output_hidden_states=True``, ``use_cache=False``, ids right-padded to a fixed length with an
attention mask), and writes under ``<out>/``:

* ``f32/``                 the model, ``save_pretrained`` in float32 (lm_head untied, present)
* ``bf16/``                the same weights in bfloat16, saved with tied embeddings (no lm_head)
* ``inputs.safetensors``   ``input_ids`` and ``attention_mask`` [B, L] (as F32: exact integers)
* ``dump.safetensors``     ``hidden_states.<k>`` [B, L, H] for every k (0 = embeddings,
                           num_hidden_layers = after the final norm), ``klein.<a>_<b>_<c>``
                           [B, L, 3H] for two layer triples, and ``klein_bf16.1_3_5``: the
                           same stacking from the bfloat16 model run in bfloat16 (what the
                           pipeline computes with a bf16 checkpoint)
* ``meta.json``            description, versions, seed, shapes

Every weight is rounded to bfloat16 before saving, so the f32 and bf16 folders hold the same
values. Usage (from the repository root)::

    python/ref/.venv/bin/python python/ref/dump_qwen3.py --out tests/golden/qwen3
"""

from __future__ import annotations

import argparse
import os

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from ref_common import check_pins, fresh_dir, setup_determinism, write_meta, write_st

SCRIPT = "python/ref/dump_qwen3.py"
SEED = 1234
MAX_FILE_BYTES = 1024 * 1024

CONFIG = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=False,
    attention_bias=False,
    pad_token_id=299,
)
SEQ = 16  # the fixed padded length (Klein pads to 512)
REAL = [11, 16]  # real tokens per row; the rest is right padding, as the pipeline pads
TRIPLES = [(1, 3, 5), (2, 4, 6)]  # (2, 4, 6) reaches the last index: the final-normed output


def klein_stack(hidden_states, layers):
    # diffusers' _get_qwen3_prompt_embeds: stack on dim 1, then [B, L, n*H]
    out = torch.stack([hidden_states[k] for k in layers], dim=1)
    b, n, l, h = out.shape
    return out.permute(0, 2, 1, 3).reshape(b, l, n * h)


def build_model(gen):
    cfg = Qwen3Config(**CONFIG)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
            elif name.endswith("embed_tokens.weight"):
                v = torch.randn(p.shape, generator=gen)
            else:
                v = torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5
            p.copy_(v.to(torch.bfloat16).to(torch.float32))
    return model


def run(model, ids, mask):
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
    return out.hidden_states


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/golden/qwen3")
    args = ap.parse_args()
    setup_determinism()
    check_pins()
    fresh_dir(args.out)
    gen = torch.Generator().manual_seed(SEED)
    model = build_model(gen)

    ids = torch.randint(0, CONFIG["vocab_size"] - 1, (len(REAL), SEQ), generator=gen)
    ids[0, 0] = CONFIG["vocab_size"] - 2  # a high id
    mask = torch.zeros(len(REAL), SEQ, dtype=torch.long)
    for b, n in enumerate(REAL):
        mask[b, :n] = 1
        ids[b, n:] = CONFIG["pad_token_id"]

    hs = run(model, ids, mask)
    assert len(hs) == CONFIG["num_hidden_layers"] + 1
    # Padded query rows: with right padding each one attends to every real token (the causal
    # mask allows keys <= its position, the padding mask drops the padded keys). eager and sdpa
    # agree on them; check it so the dump does not depend on the attention backend.
    model.set_attn_implementation("eager")
    hs_eager = run(model, ids, mask)
    model.set_attn_implementation("sdpa")
    for a, b in zip(hs, hs_eager):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), float((a - b).abs().max())

    dump = {}
    for k, h in enumerate(hs):
        dump[f"hidden_states.{k}"] = h
    for t in TRIPLES:
        dump["klein." + "_".join(map(str, t))] = klein_stack(hs, t)

    f32_dir = os.path.join(args.out, "f32")
    model.save_pretrained(f32_dir, safe_serialization=True)

    bf16 = Qwen3ForCausalLM(Qwen3Config(**{**CONFIG, "tie_word_embeddings": True})).eval()
    bf16.load_state_dict({k: v for k, v in model.state_dict().items() if k != "lm_head.weight"},
                         strict=False)
    bf16 = bf16.to(torch.bfloat16)
    bf16_dir = os.path.join(args.out, "bf16")
    bf16.save_pretrained(bf16_dir, safe_serialization=True)
    assert not any("lm_head" in k for k in
                   __import__("safetensors.torch", fromlist=["load_file"]).load_file(
                       os.path.join(bf16_dir, "model.safetensors")))
    hs16 = run(bf16, ids, mask)
    dump["klein_bf16.1_3_5"] = klein_stack(hs16, (1, 3, 5))

    inputs = {"input_ids": ids.to(torch.float32), "attention_mask": mask.to(torch.float32)}
    write_st(os.path.join(args.out, "inputs.safetensors"), inputs)
    write_st(os.path.join(args.out, "dump.safetensors"), dump)
    meta = {
        "description": "tiny random Qwen3ForCausalLM; hidden_states of output_hidden_states=True, "
                       "use_cache=False on right-padded ids with an attention mask, as "
                       "diffusers' Flux2KleinPipeline._get_qwen3_prompt_embeds calls it",
        "seed": SEED,
        "config": CONFIG,
        "real_tokens": REAL,
        "triples": [list(t) for t in TRIPLES],
        "weights": "N(0, 1/fan_in) linears, N(0,1) embeddings, 1 + 0.2 N(0,1) norms; all rounded to bf16",
    }
    write_meta(args.out, meta, dump, inputs, SCRIPT)
    for root, _, files in os.walk(args.out):
        for f in files:
            p = os.path.join(root, f)
            size = os.path.getsize(p)
            print(f"{p}: {size} bytes")
            assert size < MAX_FILE_BYTES, p


if __name__ == "__main__":
    main()
