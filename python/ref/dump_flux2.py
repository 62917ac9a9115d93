#!/usr/bin/env python3
"""Golden reference dumper for flowkv's FLUX.2 transformer / Klein-KV port.

Runs Hugging Face diffusers' own ``Flux2Transformer2DModel`` (and, for one case,
``Flux2KleinKVPipeline``) on tiny random-weight configs, in float32 on the CPU,
and writes, per case, under ``<out>/<case>/``:

* ``transformer/``          the model, written by diffusers ``save_pretrained``
* ``inputs.safetensors``    the F32 inputs of the forward call(s)
* ``dump.safetensors``      the named intermediates (F32, contiguous)
* ``meta.json``             description, versions, seed, shapes, dumped names

Intermediates are captured with forward hooks / forward pre-hooks on diffusers'
modules, plus two wrappers installed in the module namespace of
``diffusers.models.transformers.transformer_flux2`` (``dispatch_attention_fn``
and ``_flux2_kv_causal_attention``) to see the joint Q/K/V and the attention
result. No diffusers code is copied here.

Usage (from the repository root)::

    python/ref/.venv/bin/python python/ref/dump_flux2.py --out tests/golden/flux2

See python/ref/README.md for the naming convention.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import os
from typing import Any

import torch

from diffusers import (
    AutoencoderKLFlux2,
    FlowMatchEulerDiscreteScheduler,
    Flux2KleinKVPipeline,
    Flux2Transformer2DModel,
)
import diffusers.models.transformers.transformer_flux2 as tf2
import diffusers.pipelines.flux2.pipeline_flux2_klein_kv as kvpipe_mod
from diffusers.models.transformers.transformer_flux2 import (
    Flux2KVAttnProcessor,
    Flux2KVParallelSelfAttnProcessor,
)

from ref_common import (TracerBase, check_names, check_pins, clean_config, f32_contig, fresh_dir,
                        load_transformer, max_abs, setup_determinism, versions, write_meta, write_st)

SCRIPT = "python/ref/dump_flux2.py"
MAX_FILE_BYTES = 4 * 1024 * 1024  # hard limit per written file (brief: "well under 4 MiB")

# --------------------------------------------------------------------------------------
# Tracer: records named intermediates of one Flux2Transformer2DModel forward
# --------------------------------------------------------------------------------------


class Tracer(TracerBase):
    """Hooks a Flux2Transformer2DModel and records intermediates while ``record()`` is active."""

    active: "Tracer | None" = None  # the tracer currently recording (seen by the namespace wrappers)

    # module -> (name of its 1st call, name of its 2nd call or None). In extract mode diffusers
    # calls time_guidance_embed / double_stream_modulation_img / single_stream_modulation a
    # second time for the reference tokens (ref_fixed_timestep); those become the ref_* extras.
    CALL_NAMES = {
        "time_guidance_embed": ("temb", "ref_temb"),
        "double_stream_modulation_img": ("double_stream_mod_img", "ref_double_stream_mod_img"),
        "double_stream_modulation_txt": ("double_stream_mod_txt", None),
        "single_stream_modulation": ("single_stream_mod", "ref_single_stream_mod"),
        "x_embedder": ("x_embedder", None),
        "context_embedder": ("context_embedder", None),
        "norm_out": ("norm_out", None),
        "proj_out": ("output", None),
    }

    def __init__(self, model: Flux2Transformer2DModel):
        self.kv_depth = 0
        self.calls: dict[str, int] = {}
        super().__init__(model)

    def _reset(self):
        self.calls, self.kv_depth = {}, 0

    def _check(self):
        self._check_attn_out()

    # ---- hooks -----------------------------------------------------------------------
    def _install(self):
        m = self.model
        for attr, names in self.CALL_NAMES.items():
            mod = getattr(m, attr)
            self.handles.append(mod.register_forward_hook(self._counted_hook(attr, names)))

        for i, blk in enumerate(m.transformer_blocks):
            p = f"transformer_blocks.{i}."
            self.handles.append(blk.register_forward_pre_hook(self._double_in(p), with_kwargs=True))
            self.handles.append(blk.register_forward_hook(self._double_out(p)))
            self.handles.append(blk.attn.register_forward_pre_hook(self._double_attn_in(p), with_kwargs=True))
            self.handles.append(blk.attn.register_forward_hook(self._attn_exit()))
            self.handles.append(blk.attn.to_out[0].register_forward_pre_hook(self._side_in(p + "to_out_in")))
            self.handles.append(blk.attn.to_add_out.register_forward_pre_hook(self._side_in(p + "to_add_out_in")))
        for j, blk in enumerate(m.single_transformer_blocks):
            p = f"single_transformer_blocks.{j}."
            self.handles.append(blk.register_forward_pre_hook(self._single_in(p), with_kwargs=True))
            self.handles.append(blk.register_forward_hook(self._single_out(p)))
            self.handles.append(blk.attn.register_forward_pre_hook(self._single_attn_in(p), with_kwargs=True))
            self.handles.append(blk.attn.register_forward_hook(self._attn_exit()))
            self.handles.append(blk.attn.to_out.register_forward_pre_hook(self._side_in(p + "to_out_in")))

    def _counted_hook(self, attr, names):
        def hook(mod, args, out):
            if self.store is None:
                return
            k = self.calls.get(attr, 0)
            self.calls[attr] = k + 1
            if k >= 2 or names[k] is None:
                raise RuntimeError(f"unexpected call #{k + 1} of {attr}")
            self.put(names[k], out)

        return hook

    def _rope(self, kwargs):
        if self.store is not None and (self.prefix + "rope_cos") not in self.store:
            cos, sin = kwargs["image_rotary_emb"]
            self.put("rope_cos", cos)
            self.put("rope_sin", sin)

    def _double_in(self, p):
        def hook(mod, args, kwargs):
            assert not args, "diffusers calls the blocks with keyword arguments only"
            self._rope(kwargs)
            self.put(p + "in_img", kwargs["hidden_states"])
            self.put(p + "in_txt", kwargs["encoder_hidden_states"])

        return hook

    def _double_out(self, p):
        def hook(mod, args, out):
            txt, img = out  # the block returns (encoder_hidden_states, hidden_states)
            self.put(p + "out_img", img)
            self.put(p + "out_txt", txt)

        return hook

    def _single_in(self, p):
        def hook(mod, args, kwargs):
            assert not args
            assert kwargs.get("encoder_hidden_states") is None
            self._rope(kwargs)
            self.put(p + "in", kwargs["hidden_states"])

        return hook

    def _single_out(self, p):
        def hook(mod, args, out):
            self.put(p + "out", out)

        return hook

    def _double_attn_in(self, p):
        def hook(mod, args, kwargs):
            assert not args
            self.cur_attn = p + "attn"
            self.put(p + "norm1", kwargs["hidden_states"])
            self.put(p + "norm1_context", kwargs["encoder_hidden_states"])

        return hook

    def _single_attn_in(self, p):
        def hook(mod, args, kwargs):
            assert not args
            self.cur_attn = p + "attn"
            self.put(p + "norm", kwargs["hidden_states"])

        return hook

    def _check_attn_out(self):
        """attn.out must equal what to_out / to_add_out consume (guards the wrapper approach)."""
        st, pre = self.store, self.prefix
        for i in range(len(self.model.transformer_blocks)):
            p = f"transformer_blocks.{i}."
            if pre + p + "attn.out" not in st:
                continue
            joint = torch.cat([self.side[p + "to_add_out_in"], self.side[p + "to_out_in"]], dim=1)
            assert torch.equal(joint, st[pre + p + "attn.out"]), p
        D = self.model.inner_dim
        for j in range(len(self.model.single_transformer_blocks)):
            p = f"single_transformer_blocks.{j}."
            if pre + p + "attn.out" not in st:
                continue
            assert torch.equal(self.side[p + "to_out_in"][..., :D], st[pre + p + "attn.out"]), p


# Module-namespace wrappers: the processors look these names up in transformer_flux2's
# globals at call time, so replacing them there lets us see q/k/v/out. The wrapper of
# _flux2_kv_causal_attention suppresses recording of the dispatch calls nested inside it
# (extract mode makes two SDPA calls; we record the joint tensors around them instead).
_orig_dispatch_attention_fn = tf2.dispatch_attention_fn
_orig_flux2_kv_causal_attention = tf2._flux2_kv_causal_attention


def _traced_dispatch_attention_fn(query, key, value, *args, **kwargs):
    out = _orig_dispatch_attention_fn(query, key, value, *args, **kwargs)
    tr = Tracer.active
    if tr is not None and tr.kv_depth == 0:
        tr.on_attention(query, key, value, out)
    return out


def _traced_flux2_kv_causal_attention(query, key, value, *args, **kwargs):
    tr = Tracer.active
    if tr is not None:
        tr.kv_depth += 1
    try:
        out = _orig_flux2_kv_causal_attention(query, key, value, *args, **kwargs)
    finally:
        if tr is not None:
            tr.kv_depth -= 1
    if tr is not None:
        tr.on_attention(query, key, value, out)
    return out


tf2.dispatch_attention_fn = _traced_dispatch_attention_fn
tf2._flux2_kv_causal_attention = _traced_flux2_kv_causal_attention


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


def expected_shapes(model, B, L, N, N_out, extract=False) -> dict[str, tuple]:
    """The naming contract: required name -> shape for one forward."""
    D = model.inner_dim
    H = model.config.num_attention_heads
    hd = model.config.attention_head_dim
    p = model.config.patch_size
    c_out = model.out_channels
    S = L + N
    e = {
        "temb": (B, D),
        "double_stream_mod_img": (B, 6 * D),
        "double_stream_mod_txt": (B, 6 * D),
        "single_stream_mod": (B, 3 * D),
        "x_embedder": (B, N, D),
        "context_embedder": (B, L, D),
        "rope_cos": (S, hd),
        "rope_sin": (S, hd),
        "norm_out": (B, N_out, D),
        "output": (B, N_out, p * p * c_out),
    }
    for i in range(model.config.num_layers):
        q = f"transformer_blocks.{i}."
        e.update({
            q + "in_img": (B, N, D), q + "in_txt": (B, L, D),
            q + "norm1": (B, N, D), q + "norm1_context": (B, L, D),
            q + "attn.q": (B, S, H, hd), q + "attn.k": (B, S, H, hd), q + "attn.v": (B, S, H, hd),
            q + "attn.out": (B, S, D),
            q + "out_img": (B, N, D), q + "out_txt": (B, L, D),
        })
    for j in range(model.config.num_single_layers):
        q = f"single_transformer_blocks.{j}."
        e.update({
            q + "in": (B, S, D), q + "norm": (B, S, D),
            q + "attn.q": (B, S, H, hd), q + "attn.k": (B, S, H, hd), q + "attn.v": (B, S, H, hd),
            q + "attn.out": (B, S, D), q + "out": (B, S, D),
        })
    if extract:
        e.update({"ref_temb": (B, D), "ref_double_stream_mod_img": (B, 6 * D), "ref_single_stream_mod": (B, 3 * D)})
    return e


def init_weights(model: torch.nn.Module, seed: int):
    """Seeded re-init: linear weights ~ N(0, 1/fan_in), RMSNorm weights 1 + 0.1*N(0,1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if prm.ndim == 2:
                prm.copy_(torch.randn(prm.shape, generator=g) / math.sqrt(prm.shape[1]))
            elif prm.ndim == 1 and name.rsplit(".", 2)[-2] in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
                prm.copy_(1.0 + 0.1 * torch.randn(prm.shape, generator=g))
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(prm.shape)}")
        for name, buf in model.named_buffers():
            raise RuntimeError(f"unexpected buffer {name}")


def grid_ids(h: int, w: int, t: int = 0) -> torch.Tensor:
    """(T, y, x, 0), row-major over (y, x): the pipelines' _prepare_latent_ids/_prepare_image_ids layout."""
    return torch.cartesian_prod(torch.tensor([t]), torch.arange(h), torch.arange(w), torch.tensor([0])).float()


def text_ids(L: int) -> torch.Tensor:
    """(0, 0, 0, l) for l = 0..L-1."""
    return torch.cartesian_prod(torch.tensor([0]), torch.tensor([0]), torch.tensor([0]), torch.arange(L)).float()


def set_kv_processors(model):
    # Same as Flux2KleinKVPipeline._set_kv_attn_processors (and TT:601-605).
    for blk in model.transformer_blocks:
        blk.attn.set_processor(Flux2KVAttnProcessor())
    for blk in model.single_transformer_blocks:
        blk.attn.set_processor(Flux2KVParallelSelfAttnProcessor())


def new_model(cfg: dict, seed: int) -> Flux2Transformer2DModel:
    torch.manual_seed(seed)
    model = Flux2Transformer2DModel(**cfg).eval()
    init_weights(model, seed + 1)
    return model


def save_transformer(model, folder, dtype=torch.float32, max_shard_size="10GB"):
    m = model if dtype == torch.float32 else copy.deepcopy(model).to(dtype)
    m.save_pretrained(folder, safe_serialization=True, max_shard_size=max_shard_size)


# --------------------------------------------------------------------------------------
# Plain (non-KV) transformer cases
# --------------------------------------------------------------------------------------


def plain_forward(model, inp, tracer=None, prefix=""):
    kw = dict(
        hidden_states=inp["hidden_states"],
        encoder_hidden_states=inp["encoder_hidden_states"],
        timestep=inp["timestep"],
        img_ids=inp["img_ids"],
        txt_ids=inp["txt_ids"],
        guidance=inp.get("guidance"),
        return_dict=False,
    )
    with torch.no_grad():
        if tracer is None:
            return model(**kw)[0], None
        with tracer.record(prefix) as st:
            out = model(**kw)[0]
        assert torch.equal(out, st[prefix + "output"])
        return out, st


def run_plain_case(out_root, case, description, cfg, seed, B, grid, L, timestep, guidance,
                   save_dtype=torch.float32, max_shard_size="10GB", extra_meta=None):
    case_dir = os.path.join(out_root, case)
    fresh_dir(case_dir)
    model = new_model(cfg, seed)
    tdir = os.path.join(case_dir, "transformer")
    save_transformer(model, tdir, dtype=save_dtype, max_shard_size=max_shard_size)
    if save_dtype != torch.float32:
        # compute in f32 from exactly the weights in the file (bf16-rounded, upcast)
        model = model.to(save_dtype).to(torch.float32)

    h, w = grid
    N = h * w
    g = torch.Generator().manual_seed(seed + 2)
    inp = {
        "hidden_states": torch.randn(B, N, cfg["in_channels"], generator=g),
        "encoder_hidden_states": torch.randn(B, L, cfg["joint_attention_dim"], generator=g),
        "timestep": torch.tensor(timestep, dtype=torch.float32),
        "img_ids": grid_ids(h, w),
        "txt_ids": text_ids(L),
    }
    if guidance is not None:
        inp["guidance"] = torch.tensor(guidance, dtype=torch.float32)

    tracer = Tracer(model)
    out, dump = plain_forward(model, inp, tracer)
    tracer.remove()
    check_names(dump, "", expected_shapes(model, B, L, N, N))

    write_st(os.path.join(case_dir, "inputs.safetensors"), inp)
    write_st(os.path.join(case_dir, "dump.safetensors"), dump)
    meta = {
        "case": case,
        "description": description,
        "seed": seed,
        "seeds": {"model_construct": seed, "weights": seed + 1, "inputs": seed + 2},
        "weight_init": "linear weight ~ N(0, 1/fan_in); RMSNorm (norm_q/k, norm_added_q/k) weight = 1 + 0.1*N(0,1)",
        "transformer_config": clean_config(model.config),
        "saved_weight_dtype": str(save_dtype).replace("torch.", ""),
        "batch": B,
        "latent_grid_hw": [h, w],
        "num_txt_tokens": L,
        "num_img_tokens": N,
        "timestep": timestep,
        "guidance": guidance,
        "call": "model(hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids, guidance, return_dict=False)",
    }
    meta.update(extra_meta or {})
    write_meta(case_dir, meta, dump, inp, SCRIPT)

    # self-check: reload the saved folder and reproduce the output bit-exactly
    reloaded = load_transformer(Flux2Transformer2DModel, tdir)
    sd0, sd1 = model.state_dict(), reloaded.state_dict()
    assert sd0.keys() == sd1.keys()
    for k in sd0:
        assert torch.equal(sd0[k], sd1[k]), f"{case}: weight {k} changed in save/load"
    out2, _ = plain_forward(reloaded, inp)
    assert torch.equal(out2, dump["output"]), f"{case}: reloaded output differs ({max_abs(out2, dump['output'])})"
    out3, _ = plain_forward(load_transformer(Flux2Transformer2DModel, tdir, realign=False), inp)
    unaligned = max_abs(out3, dump["output"])
    assert unaligned < 1e-5
    print(f"[{case}] self-check OK: reloaded transformer reproduces output exactly "
          f"(|output|max={float(out.abs().max()):.4g}; as-loaded, unrealigned weights: max|diff|={unaligned:.3g})")
    return case_dir


# --------------------------------------------------------------------------------------
# Klein KV transformer case
# --------------------------------------------------------------------------------------

KLEIN_KV_CFG = dict(
    patch_size=1, in_channels=4, num_layers=2, num_single_layers=2, attention_head_dim=16,
    num_attention_heads=2, joint_attention_dim=16, timestep_guidance_channels=256,
    axes_dims_rope=[4, 4, 4, 4], guidance_embeds=False,
)
KLEIN_KV_SEED = 4000
REF_GRIDS = [(2, 3), (3, 2)]  # (h, w) per reference; ids T = 10*(i+1)
TARGET_GRID = (4, 4)
KV_L = 12


def ref_ids_for(grids):
    return torch.cat([grid_ids(h, w, t=10 * (i + 1)) for i, (h, w) in enumerate(grids)], dim=0)


def kv_calls(model, inp, tracer=None):
    """extract -> cached -> recompute, returning (dump, outputs, kv_cache)."""
    N_ref = inp["ref_hidden_states"].shape[1]
    common = dict(encoder_hidden_states=inp["encoder_hidden_states"], txt_ids=inp["txt_ids"],
                  guidance=None, return_dict=False)
    dump = {}
    ctx = (lambda p: tracer.record(p)) if tracer is not None else (lambda p: contextlib.nullcontext({}))
    with torch.no_grad():
        with ctx("extract.") as st:
            out_e, kv = model(
                hidden_states=torch.cat([inp["ref_hidden_states"], inp["hidden_states"]], dim=1),
                img_ids=torch.cat([inp["ref_ids"], inp["img_ids"]], dim=0),
                timestep=inp["timestep"], kv_cache_mode="extract", num_ref_tokens=N_ref, **common)
        dump.update(st)
        with ctx("cached.") as st:
            out_c = model(hidden_states=inp["hidden_states_cached"], img_ids=inp["img_ids"],
                          timestep=inp["timestep_cached"], kv_cache=kv, kv_cache_mode="cached", **common)[0]
        dump.update(st)
        # uncached baseline: the extract call at the cached step's time / latent
        out_r, kv_r = model(
            hidden_states=torch.cat([inp["ref_hidden_states"], inp["hidden_states_cached"]], dim=1),
            img_ids=torch.cat([inp["ref_ids"], inp["img_ids"]], dim=0),
            timestep=inp["timestep_cached"], kv_cache_mode="extract", num_ref_tokens=N_ref, **common)
    return dump, (out_e, out_c, out_r), kv, kv_r


def run_klein_kv_case(out_root):
    case = "klein_kv"
    case_dir = os.path.join(out_root, case)
    fresh_dir(case_dir)
    model = new_model(KLEIN_KV_CFG, KLEIN_KV_SEED)
    tdir = os.path.join(case_dir, "transformer")
    save_transformer(model, tdir)
    set_kv_processors(model)

    B, L = 1, KV_L
    th, tw = TARGET_GRID
    N_img = th * tw
    N_ref = sum(h * w for h, w in REF_GRIDS)
    C, Ct = KLEIN_KV_CFG["in_channels"], KLEIN_KV_CFG["joint_attention_dim"]
    g = torch.Generator().manual_seed(KLEIN_KV_SEED + 2)
    inp = {
        "ref_hidden_states": torch.randn(B, N_ref, C, generator=g),
        "ref_ids": ref_ids_for(REF_GRIDS),
        "hidden_states": torch.randn(B, N_img, C, generator=g),
        "hidden_states_cached": torch.randn(B, N_img, C, generator=g),
        "encoder_hidden_states": torch.randn(B, L, Ct, generator=g),
        "txt_ids": text_ids(L),
        "img_ids": grid_ids(th, tw),
        "timestep": torch.tensor([0.7]),
        "timestep_cached": torch.tensor([0.4]),
    }

    tracer = Tracer(model)
    dump, (out_e, out_c, out_r), kv, kv_r = kv_calls(model, inp, tracer)
    tracer.remove()
    check_names(dump, "extract.", expected_shapes(model, B, L, N_ref + N_img, N_img, extract=True))
    check_names(dump, "cached.", expected_shapes(model, B, L, N_img, N_img))
    assert torch.equal(dump["extract.output"], out_e) and torch.equal(dump["cached.output"], out_c)
    assert kv.num_ref_tokens == N_ref

    H, hd = model.config.num_attention_heads, model.config.attention_head_dim
    kv_diff = 0.0
    for kind, caches, pre in (("double", kv.double_block_caches, "transformer_blocks"),
                              ("single", kv.single_block_caches, "single_transformer_blocks")):
        caches_r = kv_r.double_block_caches if kind == "double" else kv_r.single_block_caches
        for i, c in enumerate(caches):
            assert c.k_ref.shape == (B, N_ref, H, hd)
            dump[f"extract.kv.{kind}.{i}.k"] = c.k_ref
            dump[f"extract.kv.{kind}.{i}.v"] = c.v_ref
            # the cache is the [L, L+N_ref) slice of the joint post-RoPE K / raw V
            assert torch.equal(c.k_ref, dump[f"extract.{pre}.{i}.attn.k"][:, L:L + N_ref])
            assert torch.equal(c.v_ref, dump[f"extract.{pre}.{i}.attn.v"][:, L:L + N_ref])
            kv_diff = max(kv_diff, max_abs(c.k_ref, caches_r[i].k_ref), max_abs(c.v_ref, caches_r[i].v_ref))
    dump["recompute.output"] = out_r
    dump = f32_contig(dump)
    cached_vs_recompute = max_abs(out_c, out_r)
    print(f"[{case}] cached vs recompute output max|diff| = {cached_vs_recompute:.3g}; "
          f"ref K/V extract@t=0.7 vs extract@t=0.4 max|diff| = {kv_diff:.3g}")
    assert cached_vs_recompute < 1e-4, "cached and uncached baseline should agree to f32 rounding"

    write_st(os.path.join(case_dir, "inputs.safetensors"), inp)
    write_st(os.path.join(case_dir, "dump.safetensors"), dump)
    meta = {
        "case": case,
        "description": (
            "Klein-KV-shaped tiny config with Flux2KVAttnProcessor / Flux2KVParallelSelfAttnProcessor installed. "
            "extract.*: kv_cache_mode='extract' on hidden_states=cat([ref_hidden_states, hidden_states]), "
            "img_ids=cat([ref_ids, img_ids]), timestep, num_ref_tokens=N_ref, ref_fixed_timestep=0.0 (default); "
            "joint layout [txt, ref, img]. extract.kv.{double,single}.{i}.{k,v}: the returned cache "
            "[B, N_ref, H, hd] (K post-RMSNorm post-RoPE, V raw). cached.*: kv_cache_mode='cached' with that cache "
            "on hidden_states_cached, img_ids (target only), timestep_cached; cached.*.attn.k/v are the [txt; img] "
            "tensors passed to _flux2_kv_causal_attention, i.e. WITHOUT the injected cached ref K/V. "
            "recompute.output: the extract call at timestep_cached on hidden_states_cached (uncached baseline)."),
        "seed": KLEIN_KV_SEED,
        "seeds": {"model_construct": KLEIN_KV_SEED, "weights": KLEIN_KV_SEED + 1, "inputs": KLEIN_KV_SEED + 2},
        "weight_init": "linear weight ~ N(0, 1/fan_in); RMSNorm (norm_q/k, norm_added_q/k) weight = 1 + 0.1*N(0,1)",
        "transformer_config": clean_config(model.config),
        "saved_weight_dtype": "float32",
        "batch": B,
        "num_txt_tokens": L,
        "target_grid_hw": list(TARGET_GRID),
        "num_img_tokens": N_img,
        "ref_grids_hw": [list(x) for x in REF_GRIDS],
        "ref_T_ids": [10 * (i + 1) for i in range(len(REF_GRIDS))],
        "num_ref_tokens": N_ref,
        "timestep_extract": 0.7,
        "timestep_cached": 0.4,
        "ref_fixed_timestep": 0.0,
        "max_abs_diff_cached_vs_recompute": cached_vs_recompute,
        "max_abs_diff_refkv_extract_vs_recompute": kv_diff,
    }
    write_meta(case_dir, meta, dump, inp, SCRIPT)

    reloaded = load_transformer(Flux2Transformer2DModel, tdir)
    set_kv_processors(reloaded)
    _, (e2, c2, r2), _, _ = kv_calls(reloaded, inp)
    for nm, a, b in (("extract", e2, out_e), ("cached", c2, out_c), ("recompute", r2, out_r)):
        assert torch.equal(a, b), f"{case}: reloaded {nm} output differs ({max_abs(a, b)})"
    re3 = load_transformer(Flux2Transformer2DModel, tdir, realign=False)
    set_kv_processors(re3)
    _, outs3, _, _ = kv_calls(re3, inp)
    unaligned = max(max_abs(a, b) for a, b in zip(outs3, (out_e, out_c, out_r)))
    assert unaligned < 1e-5
    print(f"[{case}] self-check OK: reloaded transformer reproduces extract/cached/recompute outputs exactly "
          f"(as-loaded, unrealigned weights: max|diff|={unaligned:.3g})")
    return model


# --------------------------------------------------------------------------------------
# Klein KV pipeline case
# --------------------------------------------------------------------------------------

PIPE_SEED = 5000
PIPE_STEPS = 2
SCHED_CFG = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                 max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)


def tiny_vae():
    # The tiny VAE of tests/pipelines/flux2/test_pipeline_flux2_klein_kv.py (TPK). Only its
    # config (vae_scale_factor = 2**0 = 1) and BatchNorm running stats are used: reference
    # encoding is replaced below and output_type="latent" skips decoding.
    torch.manual_seed(0)
    return AutoencoderKLFlux2(
        sample_size=32, in_channels=3, out_channels=3,
        down_block_types=("DownEncoderBlock2D",), up_block_types=("UpDecoderBlock2D",),
        block_out_channels=(4,), layers_per_block=1, latent_channels=1, norm_num_groups=1,
        use_quant_conv=False, use_post_quant_conv=False,
    ).eval()


def unpack(packed: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Inverse of Flux2KleinKVPipeline._pack_latents: [B, h*w, C] -> [B, C, h, w]."""
    B, N, C = packed.shape
    assert N == h * w
    return packed.permute(0, 2, 1).reshape(B, C, h, w)


def run_pipeline(transformer, inp):
    """Drive diffusers' Flux2KleinKVPipeline.__call__; returns captured tensors and mu."""
    from PIL import Image

    sched = FlowMatchEulerDiscreteScheduler(**SCHED_CFG)
    pipe = Flux2KleinKVPipeline(scheduler=sched, vae=tiny_vae(), text_encoder=None, tokenizer=None,
                                transformer=transformer)  # __init__ installs the KV processors
    pipe.set_progress_bar_config(disable=True)
    assert pipe.vae_scale_factor == 1

    # Replace only the VAE encode of the references: return the given (normalised, patchified)
    # latents per reference, in order. Ids, packing, concatenation stay the pipeline's own code.
    ref_unpacked, off = [], 0
    for h, w in REF_GRIDS:
        ref_unpacked.append(unpack(inp["ref_latents"][:, off:off + h * w], h, w))
        off += h * w
    calls = {"n": 0}

    def fake_encode_vae_image(image, generator):
        k = calls["n"]
        calls["n"] += 1
        return ref_unpacked[k].clone()

    pipe._encode_vae_image = fake_encode_vae_image

    cap: dict[str, Any] = {"steps": []}
    orig_rt = kvpipe_mod.retrieve_timesteps

    def rt_wrapper(*a, **kw):
        cap["mu"] = kw.get("mu")
        cap["sigmas_in"] = kw.get("sigmas")
        return orig_rt(*a, **kw)

    def tr_hook(mod, args, kwargs, out):
        cap["steps"].append({
            "model_output": out[0].detach().clone(),
            "timestep": kwargs["timestep"].detach().clone(),
            "hidden_states": kwargs["hidden_states"].detach().clone(),
            "img_ids": kwargs["img_ids"].detach().clone(),
            "txt_ids": kwargs["txt_ids"].detach().clone(),
            "mode": kwargs.get("kv_cache_mode"),
            "num_ref_tokens": kwargs.get("num_ref_tokens", 0),
        })

    lat_after = []

    def cb(p, i, t, cbk):
        lat_after.append(cbk["latents"].detach().clone())
        return {}

    th, tw = TARGET_GRID
    h_px, w_px = th * 2 * pipe.vae_scale_factor, tw * 2 * pipe.vae_scale_factor
    handle = transformer.register_forward_hook(tr_hook, with_kwargs=True)
    kvpipe_mod.retrieve_timesteps = rt_wrapper
    try:
        with torch.no_grad():
            res = pipe(
                image=[Image.new("RGB", (64, 64)) for _ in REF_GRIDS],  # placeholders (min side 64)
                prompt=None,
                prompt_embeds=inp["prompt_embeds"],
                height=h_px, width=w_px,
                num_inference_steps=PIPE_STEPS,
                latents=unpack(inp["latents"], th, tw),
                output_type="latent",
                return_dict=False,
                callback_on_step_end=cb,
                callback_on_step_end_tensor_inputs=["latents"],
            )
    finally:
        kvpipe_mod.retrieve_timesteps = orig_rt
        handle.remove()
    assert calls["n"] == len(REF_GRIDS)
    cap["latents_after"] = lat_after
    cap["sigmas"] = pipe.scheduler.sigmas.detach().clone()
    cap["timesteps"] = pipe.scheduler.timesteps.detach().clone()
    cap["scheduler_config"] = clean_config(pipe.scheduler.config)
    cap["final"] = res[0]
    cap["hw_px"] = (h_px, w_px)
    return cap


def run_pipeline_case(out_root, kv_model):
    case = "klein_kv_pipeline"
    case_dir = os.path.join(out_root, case)
    fresh_dir(case_dir)
    # same weights as klein_kv (saved again so the folder is self-contained)
    model = new_model(KLEIN_KV_CFG, KLEIN_KV_SEED)
    for (k, a), (k2, b) in zip(model.state_dict().items(), kv_model.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    tdir = os.path.join(case_dir, "transformer")
    save_transformer(model, tdir)

    B, L = 1, KV_L
    th, tw = TARGET_GRID
    N_img = th * tw
    N_ref = sum(h * w for h, w in REF_GRIDS)
    C, Ct = KLEIN_KV_CFG["in_channels"], KLEIN_KV_CFG["joint_attention_dim"]
    g = torch.Generator().manual_seed(PIPE_SEED)
    inp = {
        "prompt_embeds": torch.randn(B, L, Ct, generator=g),
        "txt_ids": text_ids(L),
        "latents": torch.randn(B, N_img, C, generator=g),
        "latent_ids": grid_ids(th, tw),
        "ref_latents": torch.randn(B, N_ref, C, generator=g),
        "ref_ids": ref_ids_for(REF_GRIDS),
    }

    cap = run_pipeline(model, inp)
    steps = cap["steps"]
    assert len(steps) == PIPE_STEPS and len(cap["latents_after"]) == PIPE_STEPS
    # the pipeline's own ids / packing must reproduce our inputs
    s0 = steps[0]
    assert s0["mode"] == "extract" and s0["num_ref_tokens"] == N_ref
    assert torch.equal(s0["hidden_states"][:, :N_ref], inp["ref_latents"])
    assert torch.equal(s0["hidden_states"][:, N_ref:], inp["latents"])
    assert torch.equal(s0["img_ids"][0].float(), torch.cat([inp["ref_ids"], inp["latent_ids"]]))
    assert torch.equal(s0["txt_ids"][0].float(), inp["txt_ids"])
    for k in range(1, PIPE_STEPS):
        assert steps[k]["mode"] == "cached"
        assert torch.equal(steps[k]["hidden_states"], cap["latents_after"][k - 1])
        assert torch.equal(steps[k]["img_ids"][0].float(), inp["latent_ids"])

    dump = {"sigmas": cap["sigmas"], "timesteps": cap["timesteps"]}
    for k in range(PIPE_STEPS):
        dump[f"step.{k}.timestep"] = steps[k]["timestep"]  # what the model receives: t/1000
        dump[f"step.{k}.model_output"] = steps[k]["model_output"]
        dump[f"step.{k}.latents"] = cap["latents_after"][k]
    dump = f32_contig(dump)

    # Independent re-derivation of the Euler update from the dumped tensors (sanity only).
    x = inp["latents"]
    for k in range(PIPE_STEPS):
        dt = cap["sigmas"][k + 1] - cap["sigmas"][k]
        x = x + dt * dump[f"step.{k}.model_output"]
        assert torch.equal(x, dump[f"step.{k}.latents"]), f"Euler step {k} mismatch"

    write_st(os.path.join(case_dir, "inputs.safetensors"), inp)
    write_st(os.path.join(case_dir, "dump.safetensors"), dump)
    mu = cap["mu"]
    meta = {
        "case": case,
        "description": (
            "2-step Flux2KleinKVPipeline.__call__ (diffusers' own denoise loop: sigmas=linspace(1,1/N,N), "
            "empirical mu from the target token count, FlowMatchEulerDiscreteScheduler.set_timesteps(sigmas, mu), "
            "step 0 kv_cache_mode='extract' with refs prepended, step 1 'cached', Euler update) on the klein_kv "
            "transformer weights, float32. Text encoder absent (prompt_embeds given). The tiny VAE of the "
            "diffusers pipeline test is attached (vae_scale_factor=1, so the 4x4 latent grid is 8x8 px); "
            "pipe._encode_vae_image is replaced to return the given normalised, patchified reference latents "
            "(ref_latents unpacked per reference) for two placeholder 64x64 images; ref ids, packing and "
            "concatenation are the pipeline's own. step.{k}.timestep is the model's timestep argument (t/1000), "
            "step.{k}.model_output the transformer output, step.{k}.latents the packed latents after the "
            "scheduler step."),
        "seed": PIPE_SEED,
        "seeds": {"inputs": PIPE_SEED, "transformer": "identical to klein_kv (seed 4000/4001)"},
        "transformer_config": clean_config(model.config),
        "saved_weight_dtype": "float32",
        "batch": B,
        "num_inference_steps": PIPE_STEPS,
        "mu": mu,
        "mu_formula": "compute_empirical_mu(image_seq_len=num_img_tokens, num_steps=num_inference_steps)",
        "scheduler_class": "FlowMatchEulerDiscreteScheduler",
        "scheduler_config": cap["scheduler_config"],
        "sigmas_passed": [float(s) for s in cap["sigmas_in"]] if cap["sigmas_in"] is not None else None,
        "num_txt_tokens": L,
        "target_grid_hw": list(TARGET_GRID),
        "num_img_tokens": N_img,
        "height_width_px": list(cap["hw_px"]),
        "vae_scale_factor": 1,
        "ref_grids_hw": [list(x) for x in REF_GRIDS],
        "ref_T_ids": [10 * (i + 1) for i in range(len(REF_GRIDS))],
        "num_ref_tokens": N_ref,
        "step_modes": [s["mode"] for s in steps],
    }
    write_meta(case_dir, meta, dump, inp, SCRIPT)

    reloaded = load_transformer(Flux2Transformer2DModel, tdir)
    cap2 = run_pipeline(reloaded, inp)
    for k in range(PIPE_STEPS):
        assert torch.equal(cap2["steps"][k]["model_output"], dump[f"step.{k}.model_output"]), k
        assert torch.equal(cap2["latents_after"][k], dump[f"step.{k}.latents"]), k
    print(f"[{case}] self-check OK: reloaded transformer reproduces both steps exactly; "
          f"mu={mu:.10f} sigmas={cap['sigmas'].tolist()} timesteps={cap['timesteps'].tolist()}")


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------

TINY_UNIT_CFG = dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
                     num_attention_heads=2, joint_attention_dim=32, timestep_guidance_channels=256,
                     axes_dims_rope=[4, 4, 4, 4])  # guidance_embeds: default (True)
MULTI_CFG = dict(patch_size=1, in_channels=8, num_layers=2, num_single_layers=3, attention_head_dim=32,
                 num_attention_heads=3, joint_attention_dim=24, timestep_guidance_channels=256,
                 axes_dims_rope=[8, 8, 8, 8], guidance_embeds=True)
HD128_CFG = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=128,
                 num_attention_heads=1, joint_attention_dim=32, timestep_guidance_channels=256,
                 axes_dims_rope=[32, 32, 32, 32], guidance_embeds=False)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/golden/flux2", help="output root (default: tests/golden/flux2)")
    args = ap.parse_args(argv)
    check_pins()
    det = setup_determinism()
    print(f"versions: {versions()}  deterministic_algorithms={det}")
    out = args.out
    os.makedirs(out, exist_ok=True)

    run_plain_case(
        out, "tiny_unit",
        "diffusers' unit-test config (TT:86-97; guidance_embeds default True), inputs shaped as that test builds "
        "them (4x4 grid, 48 text tokens, img ids (0,h,w,0), txt ids (0,0,0,l)) but drawn from one seeded "
        "generator, timestep 0.73 (instead of 1.0), guidance 3.5 (instead of 1.0). Saved f32, single file.",
        TINY_UNIT_CFG, seed=1000, B=1, grid=(4, 4), L=48, timestep=[0.73], guidance=[3.5])
    run_plain_case(
        out, "multi_guidance",
        "2 double + 3 single blocks, 3 heads x 32, axes_dims_rope [8,8,8,8], guidance embedder, batch 2 with "
        "per-element timestep/guidance, non-square 6x10 latent grid (ids (0,y,x,0) row-major), 40 text tokens. "
        "Saved f32, sharded (save_pretrained max_shard_size=1MB).",
        MULTI_CFG, seed=2000, B=2, grid=(6, 10), L=40, timestep=[0.9, 0.35], guidance=[2.5, 4.0],
        max_shard_size="1MB")
    run_plain_case(
        out, "hd128",
        "head_dim 128 (1 head, D=128), axes_dims_rope [32,32,32,32], 1 double + 1 single block, no guidance "
        "embedder, 8x8 grid, 16 text tokens. Weights saved in BF16; the dump is the float32 forward of exactly "
        "those bf16 values upcast to f32 (from_pretrained(..., torch_dtype=torch.float32)).",
        HD128_CFG, seed=3000, B=1, grid=(8, 8), L=16, timestep=[0.55], guidance=None,
        save_dtype=torch.bfloat16)
    kv_model = run_klein_kv_case(out)
    run_pipeline_case(out, kv_model)

    print("\nfiles written:")
    total = 0
    for root, _, files in sorted(os.walk(out)):
        for fn in sorted(files):
            pth = os.path.join(root, fn)
            sz = os.path.getsize(pth)
            total += sz
            print(f"  {sz:>10,d}  {pth}")
            if sz >= MAX_FILE_BYTES:
                raise SystemExit(f"error: {pth} is {sz} bytes (limit {MAX_FILE_BYTES})")
    print(f"  {total:>10,d}  total ({total / 2**20:.2f} MiB)")


if __name__ == "__main__":
    main()
