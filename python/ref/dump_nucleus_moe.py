#!/usr/bin/env python3
"""Golden dumps for flowkv's NucleusMoE-Image MoE layer (src/models/nucleus/moe.cc).

Runs diffusers' own ``NucleusMoELayer`` (diffusers 0.42.1, transformer_nucleusmoe_image.py:
router on [temb | un-modulated input], expert-choice top-C routing, per-token renormalised
weights times route_scale, routed ``SwiGLUExperts`` and the shared ``FeedForward("swiglu")``)
on tiny random weights, in float32 and with the module and its inputs cast to bfloat16.

One set of weights (D=64, I=32, E=8; every value a bfloat16 value, so the f32 and bf16 runs
share them exactly) and five cases of B=2 batch elements:

* ``softmax``       S=24, cf=2   (C=6), softmax router
* ``sigmoid``       S=36, cf=0.5 (C=3), sigmoid router: many tokens chosen by no expert
* ``partial_sort``  S=64, cf=0.1 (C=1): C*64 <= S, torch.topk's partial_sort path; most tokens
                    unchosen
* ``full``          S=20, cf=8   (C=20=S): every expert takes every token
* ``ties``          S=32, cf=3   (C=12), xn made of 3 distinct rows repeated: the router scores
                    tie exactly and torch.topk's tie order decides which tokens are chosen

Writes under ``<out>/``:

* ``weights.safetensors``  the layer's state dict (diffusers' names and layout: gate.weight
                           [E, 2D], experts.gate_up_proj [E, D, 2I], experts.down_proj [E, I, D],
                           shared_expert.net.0.proj.weight [2I, D], shared_expert.net.2.weight [D, I])
* ``<case>.safetensors``   inputs ``temb`` [B, D], ``xn`` [B, S, D], ``xm`` [B, S, D]; per run
                           (``f32.`` / ``bf16.``) the forward's own locals, read when it returns:
                           ``scores`` [B, E, S] (affinity, after the cast to the model dtype),
                           ``top_indices`` [B, E, C], ``weights`` [B, E, C] (gating_flat after
                           renormalisation and route_scale), ``token_score_sums`` [B*S], and
                           ``out`` [B, S, D]. Everything stored as F32 (indices are small integers).
* ``meta.json``            the cases, their capacities and tie counts, seeds, versions

Usage (from the repository root)::

    python/ref/.venv/bin/python python/ref/dump_nucleus_moe.py --out tests/golden/nucleus_moe
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch

from diffusers.models.transformers.transformer_nucleusmoe_image import NucleusMoELayer

from ref_common import check_pins, fresh_dir, json_compact, setup_determinism, versions, write_st

SCRIPT = "python/ref/dump_nucleus_moe.py"
D, I, E, B = 64, 32, 8, 2
ROUTE_SCALE = 2.5
SEED = 4242
MAX_TOTAL_BYTES = 1024 * 1024

CASES = [
    dict(name="softmax", S=24, cf=2.0, sigmoid=False),
    dict(name="sigmoid", S=36, cf=0.5, sigmoid=True),
    dict(name="partial_sort", S=64, cf=0.1, sigmoid=False),
    dict(name="full", S=20, cf=8.0, sigmoid=False),
    dict(name="ties", S=32, cf=3.0, sigmoid=False, distinct=3),
]


def bf16_values(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(torch.float32)


def make_weights(gen: torch.Generator) -> dict[str, torch.Tensor]:
    def randn(*shape, std):
        return bf16_values(torch.randn(*shape, generator=gen) * std)

    return {
        # Router: logits of spread ~1.7 over the 2D inputs, so scores differ visibly by expert.
        "gate.weight": randn(E, 2 * D, std=0.15),
        "experts.gate_up_proj": randn(E, D, 2 * I, std=1 / math.sqrt(D)),
        "experts.down_proj": randn(E, I, D, std=1 / math.sqrt(I)),
        "shared_expert.net.0.proj.weight": randn(2 * I, D, std=1 / math.sqrt(D)),
        "shared_expert.net.2.weight": randn(D, I, std=1 / math.sqrt(I)),
    }


def make_inputs(case: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    S = case["S"]
    temb = bf16_values(torch.randn(B, D, generator=gen))
    xn = bf16_values(torch.randn(B, S, D, generator=gen))
    xm = bf16_values(torch.randn(B, S, D, generator=gen))
    if "distinct" in case:  # tokens repeat a few distinct rows: their router scores tie
        k = case["distinct"]
        pick = torch.randint(0, k, (B, S), generator=gen)
        xn = torch.stack([xn[b, :k][pick[b]] for b in range(B)])
    return {"temb": temb, "xn": xn, "xm": xm}


def run(layer: NucleusMoELayer, inputs: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The forward's result and its locals at return (the reference's own routing)."""
    grabbed = {}
    code = NucleusMoELayer.forward.__code__

    def profiler(frame, event, arg):
        if event == "return" and frame.f_code is code:
            grabbed.update(frame.f_locals)

    m = layer.to(dtype)
    args = [inputs[k].to(dtype) for k in ("xm", "xn", "temb")]
    sys.setprofile(profiler)
    try:
        with torch.no_grad():
            out = m(args[0], args[1], timestep=args[2])
    finally:
        sys.setprofile(None)
    C = grabbed["capacity"]
    assert out.dtype == dtype and grabbed["scores"].dtype == dtype
    return {
        "scores": grabbed["affinity"],
        "top_indices": grabbed["top_indices"],
        # gating_flat is [E * B * C] in expert, batch, slot order.
        "weights": grabbed["gating_flat"].reshape(E, B, C).transpose(0, 1),
        "token_score_sums": grabbed["token_score_sums"],
        "out": out,
    }


def tie_count(scores: torch.Tensor, top: torch.Tensor) -> int:
    """(b, e) rows whose C-th score ties with an unchosen token's score."""
    n = 0
    for b in range(scores.shape[0]):
        for e in range(scores.shape[1]):
            chosen = set(top[b, e].tolist())
            last = scores[b, e, top[b, e, -1]]
            n += any(j not in chosen and scores[b, e, j] == last for j in range(scores.shape[2]))
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    check_pins()
    setup_determinism()
    fresh_dir(args.out)

    gen = torch.Generator().manual_seed(SEED)
    weights = make_weights(gen)
    write_st(os.path.join(args.out, "weights.safetensors"), weights)

    meta = {"generator": SCRIPT, "versions": versions(), "seed": SEED,
            "config": {"dim": D, "inner": I, "experts": E, "batch": B, "route_scale": ROUTE_SCALE},
            "cases": []}
    for case in CASES:
        S = case["S"]
        layer = NucleusMoELayer(hidden_size=D, moe_intermediate_dim=I, num_experts=E,
                                capacity_factor=case["cf"], use_sigmoid=case["sigmoid"],
                                route_scale=ROUTE_SCALE).eval()
        layer.load_state_dict(weights, strict=True)
        inputs = make_inputs(case, gen)
        tensors = dict(inputs)
        info = dict(case)
        for tag, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
            got = run(layer, inputs, dtype)
            C = got["top_indices"].shape[-1]
            info["capacity"] = C
            chosen = torch.zeros(B * S, dtype=torch.bool)
            chosen[(got["top_indices"] + torch.arange(B).view(B, 1, 1) * S).reshape(-1)] = True
            info[f"{tag}_unchosen_tokens"] = int((~chosen).sum())
            info[f"{tag}_tied_boundaries"] = tie_count(got["scores"].float(), got["top_indices"])
            for k, v in got.items():
                tensors[f"{tag}.{k}"] = v
        assert info["capacity"] == max(1, math.ceil(case["cf"] * S / E))
        if "distinct" in case:
            assert info["f32_tied_boundaries"] > 0 and info["bf16_tied_boundaries"] > 0, info
        write_st(os.path.join(args.out, f"{case['name']}.safetensors"), tensors)
        meta["cases"].append(info)
        print(info)

    with open(os.path.join(args.out, "meta.json"), "w") as f:
        f.write(json_compact(meta) + "\n")
    total = sum(os.path.getsize(os.path.join(args.out, n)) for n in os.listdir(args.out))
    assert total < MAX_TOTAL_BYTES, total
    print(f"{args.out}: {total} bytes")


if __name__ == "__main__":
    main()
