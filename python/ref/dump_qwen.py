#!/usr/bin/env python3
"""Golden reference dumper for flowkv's Qwen-Image-2.1 and Qwen-Image transformer ports.

Runs Hugging Face diffusers' own ``QwenImage21Transformer2DModel`` (and, for two cases,
``QwenImage21Pipeline``) and ``QwenImageTransformer2DModel`` on tiny random-weight configs,
in float32 on the CPU, and writes, per case, under ``<out>/qwen_image21/<case>/`` and
``<out>/qwen_image/<case>/``:

* ``transformer/``          the model, written by diffusers ``save_pretrained`` (f32)
* ``inputs.safetensors``    the F32 inputs of the forward call(s) (masks / shapes as F32)
* ``dump.safetensors``      the named intermediates (F32, contiguous)
* ``meta.json``             description, versions, seeds, shapes, dumped names

Intermediates are captured with forward hooks / forward pre-hooks on diffusers' modules, plus
wrappers installed in the module namespaces of
``diffusers.models.transformers.transformer_qwenimage21`` (``_qwenimage21_prepare_qkv`` and
``dispatch_attention_fn``) and ``diffusers.models.transformers.transformer_qwenimage``
(``dispatch_attention_fn``), and a wrapper of the static
``QwenImage21Transformer2DModel.build_token_metadata`` (records its result only). No diffusers
code is copied here.

Usage (from the repository root)::

    python/ref/.venv/bin/python python/ref/dump_qwen.py --out tests/golden

See python/ref/README.md for the naming convention.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
from typing import Any

import numpy as np
import torch

from diffusers import (
    FlowMatchEulerDiscreteScheduler,
    QwenImage21Pipeline,
    QwenImage21Transformer2DModel,
    QwenImageTransformer2DModel,
)
import diffusers.models.transformers.transformer_qwenimage21 as tq21
import diffusers.models.transformers.transformer_qwenimage as tqi
import diffusers.pipelines.qwenimage21.pipeline_qwenimage21 as q21pipe_mod
from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21AttnProcessor, QwenImage21KVCache

from ref_common import (TracerBase, check_names, check_pins, clean_config, f32_contig, fresh_dir,
                        load_transformer, max_abs, setup_determinism, versions, write_meta, write_st)

SCRIPT = "python/ref/dump_qwen.py"
MAX_FILE_BYTES = 4 * 1024 * 1024  # hard limit per written file
MAX_TOTAL_BYTES = 10 * 1024 * 1024  # hard limit for everything this script writes

# --------------------------------------------------------------------------------------
# Helpers (determinism and file helpers come from ref_common.py, shared with dump_flux2.py)
# --------------------------------------------------------------------------------------


def shapes_tensor(img_shapes) -> torch.Tensor:
    """[(f, h, w), ...] -> F32 [K, 3] (how img_shapes is stored in inputs.safetensors)."""
    return torch.tensor([list(s) for s in img_shapes], dtype=torch.float32)


def shapes_list(t: torch.Tensor) -> list[tuple[int, int, int]]:
    return [tuple(int(x) for x in row) for row in t.tolist()]


# --------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------

WEIGHT_INIT_21 = ("linear weight ~ N(0, 1/fan_in); attn.norm_q/norm_k weight = 1 + 0.1*N(0,1); "
                  "txt_in.text_norm.weight (zero-centred, effective scale w+1) = 0.1*N(0,1); no biases exist")
WEIGHT_INIT_QI = ("linear weight ~ N(0, 1/fan_in); linear bias = 0.1*N(0,1); RMSNorm weight (attn.norm_q/k, "
                  "norm_added_q/k, txt_norm) = 1 + 0.1*N(0,1)")
ONE_CENTRED_NORMS = ("norm_q", "norm_k", "norm_added_q", "norm_added_k", "txt_norm")


def init_weights(model: torch.nn.Module, seed: int):
    """Seeded re-init of every parameter, in named_parameters() order (see WEIGHT_INIT_*)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, prm in model.named_parameters():
            owner = name.rsplit(".", 2)[-2]  # the module that owns the parameter
            if prm.ndim == 2:
                prm.copy_(torch.randn(prm.shape, generator=g) / math.sqrt(prm.shape[1]))
            elif prm.ndim == 1 and name == "txt_in.text_norm.weight":
                prm.copy_(0.1 * torch.randn(prm.shape, generator=g))  # zero-centred RMSNorm (2.1)
            elif prm.ndim == 1 and name.endswith(".weight") and owner in ONE_CENTRED_NORMS:
                prm.copy_(1.0 + 0.1 * torch.randn(prm.shape, generator=g))
            elif prm.ndim == 1 and name.endswith(".bias"):
                prm.copy_(0.1 * torch.randn(prm.shape, generator=g))
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(prm.shape)}")
        for name, buf in model.named_buffers():
            # the only buffer: the fixed sinusoid frequencies of 2.1's timestep embedding (non-persistent)
            if name != "time_text_embed.time_proj.freqs":
                raise RuntimeError(f"unexpected buffer {name}")


def save_transformer(model, folder):
    model.save_pretrained(folder, safe_serialization=True, max_shard_size="10GB")


def check_reload_weights(model, reloaded, case):
    sd0, sd1 = model.state_dict(), reloaded.state_dict()
    assert sd0.keys() == sd1.keys()
    for k in sd0:
        assert torch.equal(sd0[k], sd1[k]), f"{case}: weight {k} changed in save/load"


# --------------------------------------------------------------------------------------
# Qwen-Image-2.1 tracer
# --------------------------------------------------------------------------------------


class Q21Tracer(TracerBase):
    """Hooks a QwenImage21Transformer2DModel and records intermediates while ``record()`` is active."""

    active: "Q21Tracer | None" = None

    MODULE_NAMES = {
        "img_in": "img_in",
        "txt_in": "txt_in",
        "time_text_embed": "temb",
        "modulation": "modulation",
        "norm_out": "norm_out",
        "proj_out": "output",
    }

    def _install(self):
        m = self.model
        for attr, name in self.MODULE_NAMES.items():
            self.handles.append(getattr(m, attr).register_forward_hook(self._out_hook(name)))
        for i, blk in enumerate(m.transformer_blocks):
            p = f"transformer_blocks.{i}."
            self.handles.append(blk.register_forward_pre_hook(self._block_in(p, i == 0), with_kwargs=True))
            self.handles.append(blk.register_forward_hook(self._out_hook(p + "out")))
            self.handles.append(blk.attn.register_forward_pre_hook(self._attn_in(p), with_kwargs=True))
            self.handles.append(blk.attn.register_forward_hook(self._attn_exit()))
            self.handles.append(blk.attn.to_out[0].register_forward_pre_hook(self._to_out_in(p)))

    def _block_in(self, p, first):
        def hook(mod, args, kwargs):
            assert not args, "diffusers calls the blocks with keyword arguments only"
            if first:
                rot = kwargs["rotary_emb"]  # complex64 [S', hd/2], as every block receives it
                assert rot.dtype == torch.complex64
                self.put("rope_cos", rot.real)
                self.put("rope_sin", rot.imag)
                self.put("joint_in", kwargs["hidden_states"])
            self.put(p + "in", kwargs["hidden_states"])

        return hook

    def _attn_in(self, p):
        def hook(mod, args, kwargs):
            assert not args
            if self.store is None:
                return
            self.cur_attn = p + "attn"
            self.side[p + "dispatch_out"] = []
            self.put(p + "norm1", kwargs["hidden_states"])

        return hook

    def _to_out_in(self, p):
        def hook(mod, args):
            if self.store is None:
                return
            x = args[0]
            # attn.out == concatenation of the SDPA calls' results (segments + target), heads flattened
            outs = self.side[p + "dispatch_out"]
            joint = torch.cat(outs, dim=1).flatten(2, 3)
            assert torch.equal(joint, x), f"{p}: attention result != to_out input"
            self.side[p + "n_dispatch"] = len(outs)
            self.put(p + "attn.out", x)

        return hook

    def on_qkv(self, query, key, value, seq_len_q, layer_cache, kv_cache_mode):
        if self.store is None:
            return
        if self.cur_attn is None:
            raise RuntimeError("_qwenimage21_prepare_qkv called outside of an attention module")
        p = self.cur_attn
        S = seq_len_q
        assert query.shape[1] == S
        if kv_cache_mode == "cached":
            # key/value = cat(cached prefix, current); keep the current tokens only
            ck, cv = layer_cache.get()
            assert torch.equal(key[:, :-S], ck) and torch.equal(value[:, :-S], cv)
            self.side[p + ".kv_len"] = key.shape[1]
        else:
            assert key.shape[1] == S
        self.put(p + ".q", query)
        self.put(p + ".k", key[:, -S:])
        self.put(p + ".v", value[:, -S:])

    def on_dispatch(self, out):
        if self.store is None:
            return
        if self.cur_attn is None:
            raise RuntimeError("dispatch_attention_fn called outside of an attention module")
        self.side[self.cur_attn[: -len("attn")] + "dispatch_out"].append(out.detach().clone())

    def on_metadata(self, image_ids, target_token_mask):
        if self.store is None:
            return
        self.side["image_ids"] = image_ids.detach().clone()
        self.side["target_token_mask"] = target_token_mask.detach().clone()


# Module-namespace wrappers. The processors look these names up in transformer_qwenimage21's globals
# at call time, so replacing them there lets us see q/k/v and the attention results.
_orig_q21_prepare_qkv = tq21._qwenimage21_prepare_qkv
_orig_q21_dispatch = tq21.dispatch_attention_fn
_orig_q21_build_token_metadata = QwenImage21Transformer2DModel.build_token_metadata  # the plain function


def _traced_q21_prepare_qkv(attn, hidden_states, rotary_emb, layer_cache, kv_cache_mode, cache_write_slice):
    q, k, v, sq = _orig_q21_prepare_qkv(attn, hidden_states, rotary_emb, layer_cache, kv_cache_mode,
                                        cache_write_slice)
    tr = Q21Tracer.active
    if tr is not None:
        tr.on_qkv(q, k, v, sq, layer_cache, kv_cache_mode)
    return q, k, v, sq


def _traced_q21_dispatch(query, key, value, *args, **kwargs):
    out = _orig_q21_dispatch(query, key, value, *args, **kwargs)
    tr = Q21Tracer.active
    if tr is not None:
        tr.on_dispatch(out)
    return out


def _traced_q21_build_token_metadata(image_pad_mask, img_shapes):
    image_ids, target_token_mask = _orig_q21_build_token_metadata(image_pad_mask, img_shapes)
    tr = Q21Tracer.active
    if tr is not None:
        tr.on_metadata(image_ids, target_token_mask)
    return image_ids, target_token_mask


tq21._qwenimage21_prepare_qkv = _traced_q21_prepare_qkv
tq21.dispatch_attention_fn = _traced_q21_dispatch
QwenImage21Transformer2DModel.build_token_metadata = staticmethod(_traced_q21_build_token_metadata)


def expected_21(model, B, L, N, S_cur, rows) -> dict[str, tuple]:
    """The naming contract for one QwenImage21 forward: name -> shape."""
    D = model.inner_dim
    H = model.config.num_attention_heads
    hd = model.config.attention_head_dim
    C = model.config.patch_size ** 2 * model.out_channels
    e = {
        "img_in": (B, N, D),
        "txt_in": (B, L, D),
        "temb": (rows, D),
        "modulation": (rows, 4 * D),
        "rope_cos": (S_cur, hd // 2),
        "rope_sin": (S_cur, hd // 2),
        "joint_in": (B, S_cur, D),
        "norm_out": (B, S_cur, D),
        "output": (B, S_cur, C),
    }
    for i in range(model.config.num_layers):
        q = f"transformer_blocks.{i}."
        e.update({
            q + "in": (B, S_cur, D), q + "norm1": (B, S_cur, D),
            q + "attn.q": (B, S_cur, H, hd), q + "attn.k": (B, S_cur, H, hd), q + "attn.v": (B, S_cur, H, hd),
            q + "attn.out": (B, S_cur, D), q + "out": (B, S_cur, D),
        })
    return e


# --------------------------------------------------------------------------------------
# Qwen-Image (dual-stream) tracer
# --------------------------------------------------------------------------------------


class QITracer(TracerBase):
    """Hooks a QwenImageTransformer2DModel and records intermediates while ``record()`` is active."""

    active: "QITracer | None" = None

    MODULE_NAMES = {
        "img_in": "img_in",
        "txt_in": "txt_in",
        "time_text_embed": "temb",
        "norm_out": "norm_out",
        "proj_out": "output",
    }

    def _check(self):
        self._check_attn_out()

    def _install(self):
        m = self.model
        for attr, name in self.MODULE_NAMES.items():
            self.handles.append(getattr(m, attr).register_forward_hook(self._out_hook(name)))
        for i, blk in enumerate(m.transformer_blocks):
            p = f"transformer_blocks.{i}."
            self.handles.append(blk.register_forward_pre_hook(self._block_in(p, i == 0), with_kwargs=True))
            self.handles.append(blk.register_forward_hook(self._block_out(p)))
            self.handles.append(blk.attn.register_forward_pre_hook(self._attn_in(p), with_kwargs=True))
            self.handles.append(blk.attn.register_forward_hook(self._attn_exit()))
            self.handles.append(blk.attn.to_out[0].register_forward_pre_hook(self._side_in(p + "to_out_in")))
            self.handles.append(blk.attn.to_add_out.register_forward_pre_hook(self._side_in(p + "to_add_out_in")))

    def _block_in(self, p, first):
        def hook(mod, args, kwargs):
            assert not args
            if first:
                img_f, txt_f = kwargs["image_rotary_emb"]  # complex64 [N, hd/2], [L, hd/2]
                assert img_f.dtype == torch.complex64 and txt_f.dtype == torch.complex64
                self.put("rope_img_cos", img_f.real)
                self.put("rope_img_sin", img_f.imag)
                self.put("rope_txt_cos", txt_f.real)
                self.put("rope_txt_sin", txt_f.imag)
            self.put(p + "in_img", kwargs["hidden_states"])
            self.put(p + "in_txt", kwargs["encoder_hidden_states"])

        return hook

    def _block_out(self, p):
        def hook(mod, args, out):
            txt, img = out  # the block returns (encoder_hidden_states, hidden_states)
            self.put(p + "out_img", img)
            self.put(p + "out_txt", txt)

        return hook

    def _attn_in(self, p):
        def hook(mod, args, kwargs):
            assert not args
            if self.store is None:
                return
            self.cur_attn = p + "attn"
            self.put(p + "norm1", kwargs["hidden_states"])
            self.put(p + "norm1_context", kwargs["encoder_hidden_states"])

        return hook

    def _check_attn_out(self):
        """attn.out must equal what to_add_out / to_out consume (guards the wrapper approach)."""
        st, pre = self.store, self.prefix
        for i in range(len(self.model.transformer_blocks)):
            p = f"transformer_blocks.{i}."
            joint = torch.cat([self.side[p + "to_add_out_in"], self.side[p + "to_out_in"]], dim=1)
            assert torch.equal(joint, st[pre + p + "attn.out"]), p


_orig_qi_dispatch = tqi.dispatch_attention_fn


def _traced_qi_dispatch(query, key, value, *args, **kwargs):
    out = _orig_qi_dispatch(query, key, value, *args, **kwargs)
    tr = QITracer.active
    if tr is not None:
        tr.on_attention(query, key, value, out)
    return out


tqi.dispatch_attention_fn = _traced_qi_dispatch


def expected_qi(model, B, L, N) -> dict[str, tuple]:
    D = model.inner_dim
    H = model.config.num_attention_heads
    hd = model.config.attention_head_dim
    C = model.config.patch_size ** 2 * model.out_channels
    S = L + N
    e = {
        "img_in": (B, N, D), "txt_in": (B, L, D), "temb": (B, D),
        "rope_img_cos": (N, hd // 2), "rope_img_sin": (N, hd // 2),
        "rope_txt_cos": (L, hd // 2), "rope_txt_sin": (L, hd // 2),
        "norm_out": (B, N, D), "output": (B, N, C),
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
    return e


# --------------------------------------------------------------------------------------
# Qwen-Image-2.1 transformer cases
# --------------------------------------------------------------------------------------

Q21_TINY_CFG = dict(patch_size=1, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=16,
                    num_attention_heads=2, context_in_dim=8, mlp_ratio=2, axes_dims_rope=(4, 6, 6))


def new_q21(cfg: dict, seed: int) -> QwenImage21Transformer2DModel:
    torch.manual_seed(seed)
    model = QwenImage21Transformer2DModel(**cfg).eval()
    init_weights(model, seed + 1)
    for blk in model.transformer_blocks:
        assert isinstance(blk.attn.processor, QwenImage21AttnProcessor)  # the default processor
    return model


def text_layout_mask(layout, target_hw) -> tuple[torch.Tensor, list[tuple[int, int, int]], int]:
    """layout: list of ints (text runs) and (h, w) tuples (condition images, h*w/4 slots each).

    Returns (img_mask row over L + T/4 entries, True at image slots, the pipeline's target slots
    appended), img_shapes (conditions first, target last) and L (rows of encoder_hidden_states)."""
    row, shapes = [], []
    for item in layout:
        if isinstance(item, int):
            row += [False] * item
        else:
            h, w = item
            assert (h * w) % 4 == 0
            row += [True] * (h * w // 4)
            shapes.append((1, h, w))
    L = len(row)
    th, tw = target_hw
    row += [True] * (th * tw // 4)
    shapes.append((1, th, tw))
    return torch.tensor(row), shapes, L


def layout_desc(layout) -> list[str]:
    """Human-readable text layout for meta.json, e.g. ["3 text", "image 2x4 (2 slots)", "2 text"]."""
    return [f"{x} text" if isinstance(x, int) else f"image {x[0]}x{x[1]} ({x[0] * x[1] // 4} slots)" for x in layout]


def q21_kwargs(inp, hidden_key, t_key):
    mask = inp.get("encoder_hidden_states_mask")
    return dict(
        hidden_states=inp[hidden_key],
        encoder_hidden_states=inp["encoder_hidden_states"],
        timestep=inp[t_key],
        img_shapes=[shapes_list(inp["img_shapes"])] * inp[hidden_key].shape[0],
        img_mask=inp["img_mask"].bool(),
        encoder_hidden_states_mask=None if mask is None else mask.bool(),
        return_dict=False,
    )


def q21_calls(model, inp, tracer=None):
    """plain -> extract -> cached -> recompute (+ an untraced extract at the cached inputs)."""
    n = model.config.num_layers
    dump, side = {}, {}
    ctx = (lambda p: tracer.record(p)) if tracer is not None else (lambda p: contextlib.nullcontext({}))
    with torch.no_grad():
        with ctx("plain.") as st:
            out_p = model(**q21_kwargs(inp, "hidden_states", "timestep"))[0]
        dump.update(st)
        if tracer is not None:
            side["plain"] = dict(tracer.side)
        kv = QwenImage21KVCache(n)
        with ctx("extract.") as st:
            out_e = model(**q21_kwargs(inp, "hidden_states", "timestep"), kv_cache=kv, kv_cache_mode="extract")[0]
        dump.update(st)
        with ctx("cached.") as st:
            out_c = model(**q21_kwargs(inp, "hidden_states_cached", "timestep_cached"), kv_cache=kv,
                          kv_cache_mode="cached")[0]
        dump.update(st)
        if tracer is not None:
            side["cached"] = dict(tracer.side)
        out_r = model(**q21_kwargs(inp, "hidden_states_cached", "timestep_cached"))[0]
        kv_r = QwenImage21KVCache(n)
        model(**q21_kwargs(inp, "hidden_states_cached", "timestep_cached"), kv_cache=kv_r, kv_cache_mode="extract")
    return dump, (out_p, out_e, out_c, out_r), kv, kv_r, side


def run_q21_kv_case(out_root, case, description, seed, B, layout, target_hw, timestep, timestep_cached,
                    invalid_text=None, dump_metadata=False):
    """Cases (a) and (b): plain / extract / cached / recompute on the tiny config."""
    case_dir = os.path.join(out_root, case)
    fresh_dir(case_dir)
    model = new_q21(Q21_TINY_CFG, seed)
    tdir = os.path.join(case_dir, "transformer")
    save_transformer(model, tdir)

    img_row, img_shapes, L = text_layout_mask(layout, target_hw)
    cond_shapes, (_, th, tw) = img_shapes[:-1], img_shapes[-1]
    T = th * tw
    N_cond = sum(h * w for _, h, w in cond_shapes)
    N = N_cond + T
    S = (L - N_cond // 4) + N
    P = S - T
    C, Ct = Q21_TINY_CFG["in_channels"], Q21_TINY_CFG["context_in_dim"]
    g = torch.Generator().manual_seed(seed + 2)
    cond = torch.randn(B, N_cond, C, generator=g)
    inp = {
        "hidden_states": torch.cat([cond, torch.randn(B, T, C, generator=g)], dim=1),
        "encoder_hidden_states": torch.randn(B, L, Ct, generator=g),
        "timestep": torch.tensor(timestep, dtype=torch.float32),
    }
    inp["hidden_states_cached"] = torch.cat([cond, torch.randn(B, T, C, generator=g)], dim=1)
    inp["timestep_cached"] = torch.tensor(timestep_cached, dtype=torch.float32)
    inp["img_mask"] = img_row[None].expand(B, -1).float()
    inp["img_shapes"] = shapes_tensor(img_shapes)
    if invalid_text is not None:
        m = torch.ones(B, L)
        for b, l in invalid_text:
            assert not bool(img_row[l]), "invalid position must be a text token"
            m[b, l] = 0.0
        inp["encoder_hidden_states_mask"] = m

    tracer = Q21Tracer(model)
    dump, (out_p, out_e, out_c, out_r), kv, kv_r, side = q21_calls(model, inp, tracer)
    tracer.remove()
    check_names(dump, "plain.", expected_21(model, B, L, N, S, B + 1))
    check_names(dump, "extract.", expected_21(model, B, L, N, S, B + 1))
    check_names(dump, "cached.", expected_21(model, B, L, N, T, B + 1))
    assert torch.equal(dump["plain.output"], out_p) and torch.equal(dump["cached.output"], out_c)

    # extract = plain + a cache write: identical tensors
    extract_vs_plain = max(max_abs(dump["extract." + k[len("plain."):]], v)
                           for k, v in dump.items() if k.startswith("plain."))
    assert extract_vs_plain == 0.0, f"{case}: extract differs from plain ({extract_vs_plain})"
    # the cached rope table is the target slice of the full one
    assert torch.equal(dump["cached.rope_cos"], dump["plain.rope_cos"][P:])
    assert torch.equal(dump["cached.rope_sin"], dump["plain.rope_sin"][P:])
    # token metadata
    tmask = side["plain"]["target_token_mask"]
    assert int(tmask.sum()) == T and bool(tmask[P:].all()) and not bool(tmask[:P].any())
    n_segments = side["plain"]["transformer_blocks.0.n_dispatch"]

    H, hd = model.config.num_attention_heads, model.config.attention_head_dim
    kv_step_diff = 0.0
    for i in range(model.config.num_layers):
        c = kv.get_layer(i)
        assert c.k.shape == (B, P, H, hd) and c.v.shape == (B, P, H, hd)
        # the cache is the prefix slice of the extract K (post-norm, post-RoPE) / raw V
        assert torch.equal(c.k, dump[f"extract.transformer_blocks.{i}.attn.k"][:, :P])
        assert torch.equal(c.v, dump[f"extract.transformer_blocks.{i}.attn.v"][:, :P])
        dump[f"extract.kv.{i}.k"] = c.k
        dump[f"extract.kv.{i}.v"] = c.v
        r = kv_r.get_layer(i)
        kv_step_diff = max(kv_step_diff, max_abs(c.k, r.k), max_abs(c.v, r.v))
        assert side["cached"][f"transformer_blocks.{i}.attn.kv_len"] == S
    dump["recompute.output"] = out_r
    if dump_metadata:
        dump["plain.image_ids"] = side["plain"]["image_ids"].float()
        dump["plain.target_token_mask"] = side["plain"]["target_token_mask"].float()
    dump = f32_contig(dump)
    cached_vs_recompute = max_abs(out_c, out_r[:, P:])
    prefix_out_diff = max_abs(out_p[:, :P], out_r[:, :P])
    print(f"[{case}] cached vs recompute[:, P:] output max|diff| = {cached_vs_recompute:.3g}; prefix K/V "
          f"extract@t vs extract@t_cached max|diff| = {kv_step_diff:.3g}; prefix output rows "
          f"plain vs recompute max|diff| = {prefix_out_diff:.3g}; prefill SDPA calls/layer = {n_segments}")
    assert cached_vs_recompute < 1e-4, "cached and uncached baseline should agree to f32 rounding"

    write_st(os.path.join(case_dir, "inputs.safetensors"), inp)
    write_st(os.path.join(case_dir, "dump.safetensors"), dump)
    meta = {
        "case": case,
        "description": description,
        "seed": seed,
        "seeds": {"model_construct": seed, "weights": seed + 1, "inputs": seed + 2},
        "weight_init": WEIGHT_INIT_21,
        "transformer_config": clean_config(model.config),
        "saved_weight_dtype": "float32",
        "attn_processor": "QwenImage21AttnProcessor (default; per-segment SDPA prefill)",
        "batch": B,
        "text_layout": layout_desc(layout),
        "num_text_rows": L,
        "num_text_tokens": L - N_cond // 4,
        "num_condition_slots": N_cond // 4,
        "img_shapes": [list(s) for s in img_shapes],
        "num_img_tokens": N,
        "num_target_tokens": T,
        "joint_seq_len": S,
        "prefix_len": P,
        "prefill_sdpa_calls_per_layer": n_segments,
        "timestep": timestep,
        "timestep_cached": timestep_cached,
        "encoder_hidden_states_mask": ("None" if invalid_text is None else
                                       {"invalid_(batch,row)": [list(x) for x in invalid_text]}),
        "calls": {
            "plain": "model(hidden_states, encoder_hidden_states, timestep, img_shapes=[img_shapes]*B, img_mask, "
                     "encoder_hidden_states_mask, return_dict=False)",
            "extract": "plain + kv_cache=QwenImage21KVCache(num_layers), kv_cache_mode='extract'",
            "cached": "kv_cache_mode='cached' with that cache, hidden_states_cached, timestep_cached",
            "recompute": "plain forward with the cached call's inputs (hidden_states_cached, timestep_cached); "
                         "full S rows",
        },
        "max_abs_diff_extract_vs_plain": extract_vs_plain,
        "max_abs_diff_cached_vs_recompute_target_rows": cached_vs_recompute,
        "max_abs_diff_prefix_kv_extract_vs_extract_at_cached_inputs": kv_step_diff,
        "max_abs_diff_prefix_output_rows_plain_vs_recompute": prefix_out_diff,
    }
    write_meta(case_dir, meta, dump, inp, SCRIPT)

    reloaded = load_transformer(QwenImage21Transformer2DModel, tdir)
    check_reload_weights(model, reloaded, case)
    _, outs2, _, _, _ = q21_calls(reloaded, inp)
    for nm, a, b in zip(("plain", "extract", "cached", "recompute"), outs2, (out_p, out_e, out_c, out_r)):
        assert torch.equal(a, b), f"{case}: reloaded {nm} output differs ({max_abs(a, b)})"
    _, outs3, _, _, _ = q21_calls(load_transformer(QwenImage21Transformer2DModel, tdir, realign=False), inp)
    unaligned = max(max_abs(a, b) for a, b in zip(outs3, (out_p, out_e, out_c, out_r)))
    assert unaligned < 1e-5
    print(f"[{case}] self-check OK: reloaded transformer reproduces plain/extract/cached/recompute exactly "
          f"(as-loaded, unrealigned weights: max|diff|={unaligned:.3g})")
    return model, inp


def run_q21_no_causal_case(out_root):
    case = "no_causal"
    case_dir = os.path.join(out_root, case)
    fresh_dir(case_dir)
    seed = 8000
    cfg = dict(Q21_TINY_CFG, causal_condition=False)
    model = new_q21(cfg, seed)
    tdir = os.path.join(case_dir, "transformer")
    save_transformer(model, tdir)

    B, layout, target_hw = 1, [7], (4, 6)
    img_row, img_shapes, L = text_layout_mask(layout, target_hw)
    T = target_hw[0] * target_hw[1]
    S = L + T
    C, Ct = cfg["in_channels"], cfg["context_in_dim"]
    g = torch.Generator().manual_seed(seed + 2)
    inp = {
        "hidden_states": torch.randn(B, T, C, generator=g),
        "encoder_hidden_states": torch.randn(B, L, Ct, generator=g),
        "timestep": torch.tensor([0.8]),
        "img_mask": img_row[None].float(),
        "img_shapes": shapes_tensor(img_shapes),
    }
    tracer = Q21Tracer(model)
    with torch.no_grad(), tracer.record("plain.") as dump:
        out = model(**q21_kwargs(inp, "hidden_states", "timestep"))[0]
    tracer.remove()
    check_names(dump, "plain.", expected_21(model, B, L, T, S, B))
    assert torch.equal(out, dump["plain.output"])

    errors = {}
    for mode in ("extract", "cached"):
        try:
            with torch.no_grad():
                model(**q21_kwargs(inp, "hidden_states", "timestep"), kv_cache=QwenImage21KVCache(2),
                      kv_cache_mode=mode)
        except ValueError as e:
            errors[mode] = str(e)
        else:
            raise RuntimeError("diffusers accepted a kv_cache with causal_condition=False")
    assert errors["extract"] == errors["cached"]
    dump = f32_contig(dump)
    write_st(os.path.join(case_dir, "inputs.safetensors"), inp)
    write_st(os.path.join(case_dir, "dump.safetensors"), dump)
    meta = {
        "case": case,
        "description": (
            "Tiny 2.1 config with causal_condition=False (no extra t=0 row: temb/modulation have B rows and every "
            "token, text included, is modulated from its sample's timestep). T2I layout as t2i: 7 text tokens, "
            "4x6 target. Plain forward only; passing a kv_cache raises ValueError (message below)."),
        "seed": seed,
        "seeds": {"model_construct": seed, "weights": seed + 1, "inputs": seed + 2},
        "weight_init": WEIGHT_INIT_21,
        "transformer_config": clean_config(model.config),
        "saved_weight_dtype": "float32",
        "batch": B,
        "num_text_tokens": L,
        "img_shapes": [list(s) for s in img_shapes],
        "num_target_tokens": T,
        "joint_seq_len": S,
        "timestep": [0.8],
        "encoder_hidden_states_mask": "None",
        "kv_cache_error": {"type": "ValueError", "message": errors["extract"],
                           "raised_for_modes": ["extract", "cached"]},
    }
    write_meta(case_dir, meta, dump, inp, SCRIPT)
    reloaded = load_transformer(QwenImage21Transformer2DModel, tdir)
    check_reload_weights(model, reloaded, case)
    with torch.no_grad():
        out2 = reloaded(**q21_kwargs(inp, "hidden_states", "timestep"))[0]
    assert torch.equal(out2, dump["plain.output"])
    print(f"[{case}] self-check OK: reloaded transformer reproduces output exactly; kv_cache error: {errors['extract']!r}")


# --------------------------------------------------------------------------------------
# Qwen-Image-2.1 pipeline cases
# --------------------------------------------------------------------------------------

PIPE_SCHED_RELEASED = dict(num_train_timesteps=1000, base_image_seq_len=256, max_image_seq_len=8192, base_shift=0.5,
                           max_shift=0.9, shift=1.0, shift_terminal=0.02, time_shift_type="exponential",
                           use_dynamic_shifting=True)
PIPE_SCHED_IDENTITY = dict(num_train_timesteps=1000, base_image_seq_len=256, max_image_seq_len=8192, base_shift=0.5,
                           max_shift=0.9, shift=1.0, shift_terminal=None, time_shift_type="exponential",
                           use_dynamic_shifting=False)
PIPE_COND_HW = (2, 4)  # condition image latent grid (h, w) = 32x64 px at the pipeline's 16x factor
PIPE_TARGET_HW = (4, 4)
PIPE_OUTPUT_RESOLUTION = 45  # calculate_dimensions(45^2, 64/32) -> (64, 32) px: the condition keeps its 2x4 grid


class _NoProcessor:
    """Stand-in for the Qwen3-VL processor (there is no text encoder here).

    QwenImage21Pipeline.__init__ tokenises its system prompt (``apply_chat_template``) and looks up the
    ``<|image_pad|>`` id; both results are only used by ``_get_qwen_prompt_embeds``, which never runs
    because prompt embeddings are given. Any other use fails loudly."""

    class _Tokenizer:
        def encode(self, text):
            assert text == "<|image_pad|>"
            return [-1]

    tokenizer = _Tokenizer()

    def apply_chat_template(self, messages, tokenize=True, return_dict=False):
        return [[]]

    def __call__(self, *args, **kwargs):
        raise RuntimeError("text encoding must not run in the golden dump")


def unpack21(packed: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Inverse of QwenImage21Pipeline._pack_latents: [B, h*w, C] -> [B, C, 1, h, w] (VAE latent layout)."""
    B, N, C = packed.shape
    assert N == h * w
    return packed.transpose(1, 2).reshape(B, C, 1, h, w)


def run_q21_pipeline(transformer, inp, sched_cfg, cfg_scale, neg, sample_sigmas=None, num_inference_steps=2):
    """Drive diffusers' QwenImage21Pipeline.__call__; returns the captured tensors."""
    from PIL import Image

    sched = FlowMatchEulerDiscreteScheduler(**sched_cfg)
    pipe = QwenImage21Pipeline(scheduler=sched, vae=None, text_encoder=None, processor=_NoProcessor(),
                               transformer=transformer, sample_sigmas=sample_sigmas)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.vae_scale_factor == 16

    ch, cw = PIPE_COND_HW
    th, tw = PIPE_TARGET_HW

    # (1) the VAE encode of the condition image returns the given (normalised) latents
    calls = {"vae": 0, "encode_prompt": []}

    def fake_encode_vae_image(image, generator):
        calls["vae"] += 1
        assert image.shape[-2:] == (ch * 16, cw * 16), image.shape  # the pipeline's own resize
        return unpack21(inp["cond_latents"], ch, cw).clone()

    pipe._encode_vae_image = fake_encode_vae_image

    # (2) __call__ has no image_pad_mask argument, and encode_prompt refuses prompt_embeds that cover a
    # condition image without one; hand it the mask that belongs to the given embeddings. Everything else
    # (num_images_per_prompt repeat, all-ones mask -> None) is encode_prompt's own code.
    orig_encode_prompt = pipe.encode_prompt

    def encode_prompt_with_pad_mask(*args, **kwargs):
        pe = kwargs["prompt_embeds"]
        assert kwargs.get("image_pad_mask") is None
        if pe is inp["prompt_embeds"]:
            ipm = inp["image_pad_mask"].bool()
            calls["encode_prompt"].append("cond")
        elif neg and pe is inp["negative_prompt_embeds"]:
            ipm = inp["negative_image_pad_mask"].bool()
            calls["encode_prompt"].append("uncond")
        else:
            raise RuntimeError("unexpected prompt_embeds")
        return orig_encode_prompt(*args, image_pad_mask=ipm, **kwargs)

    pipe.encode_prompt = encode_prompt_with_pad_mask

    cap: dict[str, Any] = {"calls": [], "step_args": [], "latents_after": []}
    orig_rt = q21pipe_mod.retrieve_timesteps

    def rt_wrapper(*a, **kw):
        cap["mu"] = kw.get("mu")
        s = kw.get("sigmas")
        cap["sigmas_in"] = None if s is None else [float(x) for x in s]
        return orig_rt(*a, **kw)

    def tr_hook(mod, args, kwargs, out):
        m = kwargs["encoder_hidden_states_mask"]
        cap["calls"].append({
            "output": out[0].detach().clone(),
            "timestep": kwargs["timestep"].detach().clone(),
            "hidden_states": kwargs["hidden_states"].detach().clone(),
            "encoder_hidden_states": kwargs["encoder_hidden_states"].detach().clone(),
            "encoder_hidden_states_mask": None if m is None else m.detach().clone(),
            "img_mask": kwargs["img_mask"].detach().clone(),
            "img_shapes": kwargs["img_shapes"],
            "mode": kwargs.get("kv_cache_mode"),
        })

    orig_step = pipe.scheduler.step

    def step_wrapper(model_output, timestep, sample, *a, **kw):  # capture only
        cap["step_args"].append({"noise_pred": model_output.detach().clone(), "t": timestep.detach().clone(),
                                 "sample": sample.detach().clone()})
        return orig_step(model_output, timestep, sample, *a, **kw)

    pipe.scheduler.step = step_wrapper

    def cb(p, i, t, cbk):
        cap["latents_after"].append(cbk["latents"].detach().clone())
        return {}

    image = Image.new("RGBA", (cw * 16, ch * 16))  # placeholder condition image (PIL size is (w, h))
    kwargs = dict(
        image=[image],
        prompt=None,
        prompt_embeds=inp["prompt_embeds"],
        prompt_embeds_mask=inp["prompt_embeds_mask"].long(),
        height=th * 16, width=tw * 16,
        num_inference_steps=num_inference_steps,
        latents=inp["latents"],
        output_type="latent",
        return_dict=False,
        callback_on_step_end=cb,
        callback_on_step_end_tensor_inputs=["latents"],
        output_resolution=PIPE_OUTPUT_RESOLUTION,
        use_kv_cache=True,
        true_cfg_scale=cfg_scale,
    )
    if neg:
        kwargs.update(negative_prompt_embeds=inp["negative_prompt_embeds"],
                      negative_prompt_embeds_mask=inp["negative_prompt_embeds_mask"].long())
    handle = transformer.register_forward_hook(tr_hook, with_kwargs=True)
    q21pipe_mod.retrieve_timesteps = rt_wrapper
    try:
        with torch.no_grad():
            res = pipe(**kwargs)
    finally:
        q21pipe_mod.retrieve_timesteps = orig_rt
        handle.remove()
    assert calls["vae"] == 1
    assert calls["encode_prompt"] == (["cond", "uncond"] if neg else ["cond"])
    cap["sigmas"] = pipe.scheduler.sigmas.detach().clone()
    cap["timesteps"] = pipe.scheduler.timesteps.detach().clone()
    cap["scheduler_config"] = clean_config(pipe.scheduler.config)
    cap["pipeline_sample_sigmas"] = pipe.config.sample_sigmas
    cap["final"] = res[0]
    assert torch.equal(res[0], cap["latents_after"][-1])
    return cap


def pipe_inputs(seed, neg, cond_layout, neg_layout=None, neg_invalid_last=False):
    """Embeddings, masks, condition latents and noise for the pipeline cases (batch 1)."""
    C, Ct = Q21_TINY_CFG["in_channels"], Q21_TINY_CFG["context_in_dim"]
    ch, cw = PIPE_COND_HW
    th, tw = PIPE_TARGET_HW
    g = torch.Generator().manual_seed(seed)
    row, shapes, L = text_layout_mask(cond_layout, PIPE_TARGET_HW)
    assert shapes == [(1, ch, cw), (1, th, tw)]
    inp = {
        "prompt_embeds": torch.randn(1, L, Ct, generator=g),
        "prompt_embeds_mask": torch.ones(1, L),
        "image_pad_mask": row[None, :L].float(),
        "img_mask": row[None].float(),
    }
    if neg:
        nrow, nshapes, nL = text_layout_mask(neg_layout, PIPE_TARGET_HW)
        assert nshapes == shapes
        nm = torch.ones(1, nL)
        if neg_invalid_last:
            assert not bool(nrow[nL - 1])
            nm[0, nL - 1] = 0.0
        inp.update({
            "negative_prompt_embeds": torch.randn(1, nL, Ct, generator=g),
            "negative_prompt_embeds_mask": nm,
            "negative_image_pad_mask": nrow[None, :nL].float(),
            "negative_img_mask": nrow[None].float(),
        })
    inp["cond_latents"] = torch.randn(1, ch * cw, C, generator=g)
    inp["latents"] = torch.randn(1, th * tw, C, generator=g)
    inp["img_shapes"] = shapes_tensor(shapes)
    return inp


def check_pipeline_calls(cap, inp, neg, steps, cfg_scale):
    """The pipeline's own layout / masks / modes / CFG / Euler updates reproduce our stored inputs."""
    T = inp["latents"].shape[1]
    per = 2 if neg else 1
    assert len(cap["calls"]) == per * steps and len(cap["latents_after"]) == steps
    shapes = shapes_list(inp["img_shapes"])
    x = inp["latents"]
    for k in range(steps):
        branches = [("cond", cap["calls"][per * k])] + ([("uncond", cap["calls"][per * k + 1])] if neg else [])
        for br, c in branches:
            pre = "" if br == "cond" else "negative_"
            assert c["mode"] == ("extract" if k == 0 else "cached"), (k, br, c["mode"])
            assert torch.equal(c["hidden_states"], torch.cat([inp["cond_latents"], x], dim=1))
            assert torch.equal(c["encoder_hidden_states"], inp[pre + "prompt_embeds"])
            assert torch.equal(c["img_mask"], inp[pre + "img_mask"].bool())
            assert c["img_shapes"] == [shapes]
            m = inp[pre + "prompt_embeds_mask"]
            if bool(m.bool().all()):
                assert c["encoder_hidden_states_mask"] is None  # encode_prompt drops an all-ones mask
            else:
                assert torch.equal(c["encoder_hidden_states_mask"].float(), m)
            assert torch.equal(c["timestep"], cap["calls"][per * k]["timestep"])
        sa = cap["step_args"][k]
        assert torch.equal(sa["sample"], x)
        cond = cap["calls"][per * k]["output"][:, -T:]
        if neg:
            unc = cap["calls"][per * k + 1]["output"][:, -T:]
            assert torch.equal(sa["noise_pred"], unc + cfg_scale * (cond - unc)), f"CFG combine step {k}"
        else:
            assert torch.equal(sa["noise_pred"], cond)
        x = x + (cap["sigmas"][k + 1] - cap["sigmas"][k]) * sa["noise_pred"]
        assert torch.equal(x, cap["latents_after"][k]), f"Euler step {k} mismatch"


def pipeline_cache_check(model, cap, inp, neg):
    """Uncached forwards at the pipeline's cached-step inputs: max |cached - uncached| over target rows."""
    per = 2 if neg else 1
    T = inp["latents"].shape[1]
    worst = 0.0
    with torch.no_grad():
        for c in cap["calls"][per:]:
            out = model(hidden_states=c["hidden_states"], encoder_hidden_states=c["encoder_hidden_states"],
                        timestep=c["timestep"], img_shapes=c["img_shapes"], img_mask=c["img_mask"],
                        encoder_hidden_states_mask=c["encoder_hidden_states_mask"], return_dict=False)[0]
            worst = max(worst, max_abs(out[:, -T:], c["output"]))
    return worst


def run_q21_pipeline_case(out_root, case, refs_model, seed, neg, cfg_scale, sched_cfg, sample_sigmas, steps,
                          description, cond_layout, neg_layout=None, neg_invalid_last=False,
                          num_inference_steps_arg=None):
    """``steps``: the expected number of denoising steps; ``num_inference_steps_arg``: what __call__ is given
    (defaults to ``steps``; ignored by the pipeline when sample_sigmas is configured)."""
    nis = steps if num_inference_steps_arg is None else num_inference_steps_arg
    case_dir = os.path.join(out_root, case)
    fresh_dir(case_dir)
    # same weights as qwen_image21/refs (saved again so the folder is self-contained)
    model = new_q21(Q21_TINY_CFG, REFS_SEED)
    for (k, a), (k2, b) in zip(model.state_dict().items(), refs_model.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    tdir = os.path.join(case_dir, "transformer")
    save_transformer(model, tdir)

    inp = pipe_inputs(seed, neg, cond_layout, neg_layout, neg_invalid_last)
    T = inp["latents"].shape[1]
    cap = run_q21_pipeline(model, inp, sched_cfg, cfg_scale, neg, sample_sigmas, num_inference_steps=nis)
    check_pipeline_calls(cap, inp, neg, steps, cfg_scale)
    per = 2 if neg else 1

    dump = {"sigmas": cap["sigmas"], "timesteps": cap["timesteps"]}
    for k in range(steps):
        dump[f"step.{k}.timestep"] = cap["calls"][per * k]["timestep"]  # what the model receives
        if neg:
            dump[f"step.{k}.cond_output"] = cap["calls"][per * k]["output"][:, -T:]
            dump[f"step.{k}.uncond_output"] = cap["calls"][per * k + 1]["output"][:, -T:]
        dump[f"step.{k}.noise_pred"] = cap["step_args"][k]["noise_pred"]
        dump[f"step.{k}.latents"] = cap["latents_after"][k]
    dump = f32_contig(dump)
    # the model timestep: (timesteps[k] as latents dtype) / 1000
    for k in range(steps):
        assert torch.equal(dump[f"step.{k}.timestep"], cap["timesteps"][k].expand(1).to(torch.float32) / 1000)
    if sample_sigmas is not None:
        assert cap["sigmas_in"] == [float(s) for s in sample_sigmas]
        assert torch.equal(cap["sigmas"], torch.tensor(list(sample_sigmas) + [0.0], dtype=torch.float32))
    cache_diff = pipeline_cache_check(model, cap, inp, neg)
    print(f"[{case}] pipeline cached-step outputs vs uncached forwards max|diff| = {cache_diff:.3g}")
    assert cache_diff < 1e-4

    write_st(os.path.join(case_dir, "inputs.safetensors"), inp)
    write_st(os.path.join(case_dir, "dump.safetensors"), dump)
    meta = {
        "case": case,
        "description": description,
        "seed": seed,
        "seeds": {"inputs": seed, "transformer": f"identical to qwen_image21/refs (seed {REFS_SEED}/{REFS_SEED + 1})"},
        "transformer_config": clean_config(model.config),
        "saved_weight_dtype": "float32",
        "batch": 1,
        "num_inference_steps": steps,
        "num_inference_steps_argument": nis,
        "true_cfg_scale": cfg_scale,
        "use_kv_cache": True,
        "step_modes": [cap["calls"][per * k]["mode"] for k in range(steps)],
        "mu": cap["mu"],
        "mu_formula": "calculate_shift(T, base_image_seq_len, max_image_seq_len, base_shift, max_shift) from the "
                      "scheduler config; T = target tokens",
        "scheduler_class": "FlowMatchEulerDiscreteScheduler",
        "scheduler_config": cap["scheduler_config"],
        "pipeline_sample_sigmas": cap["pipeline_sample_sigmas"],
        "sigmas_passed": cap["sigmas_in"],
        "height_width_px": [PIPE_TARGET_HW[0] * 16, PIPE_TARGET_HW[1] * 16],
        "output_resolution": PIPE_OUTPUT_RESOLUTION,
        "condition_image_px_wh": [PIPE_COND_HW[1] * 16, PIPE_COND_HW[0] * 16],
        "img_shapes": [list(s) for s in shapes_list(inp["img_shapes"])],
        "text_layout_cond": layout_desc(cond_layout),
        "text_layout_uncond": layout_desc(neg_layout) if neg else None,
        "cond_mask_reaching_transformer": "None (all-ones mask dropped by encode_prompt)",
        "uncond_mask_reaching_transformer": (None if not neg else
                                             ("given mask (last row invalid)" if neg_invalid_last else "None")),
        "max_abs_diff_cached_steps_vs_uncached_forward": cache_diff,
    }
    if sample_sigmas is None and sched_cfg["use_dynamic_shifting"]:
        # With 2 steps the terminal stretch maps the only non-initial sigma to shift_terminal whatever mu is,
        # so the exponential shift is not exercised by the run itself. Record the same scheduler's sigmas for
        # 4 steps at the same mu (scheduler only, no model) so a C++ scheduler test can cover the shift.
        probe = FlowMatchEulerDiscreteScheduler(**sched_cfg)
        probe.set_timesteps(sigmas=np.linspace(1.0, 1 / 4, 4), mu=cap["mu"])
        meta["scheduler_probe"] = {
            "what": "FlowMatchEulerDiscreteScheduler(scheduler_config).set_timesteps(sigmas=linspace(1, 1/4, 4), "
                    "mu=mu): float32 values, terminal 0 included",
            "sigmas": [float(x) for x in probe.sigmas],
            "timesteps": [float(x) for x in probe.timesteps],
        }
    write_meta(case_dir, meta, dump, inp, SCRIPT)

    reloaded = load_transformer(QwenImage21Transformer2DModel, tdir)
    check_reload_weights(model, reloaded, case)
    cap2 = run_q21_pipeline(reloaded, inp, sched_cfg, cfg_scale, neg, sample_sigmas, num_inference_steps=nis)
    for k in range(steps):
        assert torch.equal(cap2["step_args"][k]["noise_pred"], dump[f"step.{k}.noise_pred"]), k
        assert torch.equal(cap2["latents_after"][k], dump[f"step.{k}.latents"]), k
    print(f"[{case}] self-check OK: reloaded transformer reproduces all steps exactly; mu={cap['mu']:.10f} "
          f"sigmas={cap['sigmas'].tolist()} timesteps={cap['timesteps'].tolist()}")


# --------------------------------------------------------------------------------------
# Qwen-Image (dual-stream) cases
# --------------------------------------------------------------------------------------

QI_TINY_CFG = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16,
                   num_attention_heads=4, joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4))


def qi_kwargs(inp, img_shapes):
    mask = inp.get("encoder_hidden_states_mask")
    return dict(hidden_states=inp["hidden_states"], encoder_hidden_states=inp["encoder_hidden_states"],
                encoder_hidden_states_mask=None if mask is None else mask.bool(), timestep=inp["timestep"],
                img_shapes=img_shapes, return_dict=False)


def run_qi_case(out_root, case, description, seed, img_shapes_arg, L, timestep, invalid_text=None):
    case_dir = os.path.join(out_root, case)
    fresh_dir(case_dir)
    torch.manual_seed(seed)
    model = QwenImageTransformer2DModel(**QI_TINY_CFG).eval()
    init_weights(model, seed + 1)
    tdir = os.path.join(case_dir, "transformer")
    save_transformer(model, tdir)

    shapes = img_shapes_arg[0] if isinstance(img_shapes_arg[0], list) else img_shapes_arg
    N = sum(f * h * w for f, h, w in shapes)
    B = 1
    C, Ct = QI_TINY_CFG["in_channels"], QI_TINY_CFG["joint_attention_dim"]
    g = torch.Generator().manual_seed(seed + 2)
    inp = {
        "hidden_states": torch.randn(B, N, C, generator=g),
        "encoder_hidden_states": torch.randn(B, L, Ct, generator=g),
        "timestep": torch.tensor(timestep, dtype=torch.float32),
        "img_shapes": shapes_tensor(shapes),
    }
    if invalid_text is not None:
        m = torch.ones(B, L)
        for b, l in invalid_text:
            m[b, l] = 0.0
        inp["encoder_hidden_states_mask"] = m

    tracer = QITracer(model)
    with torch.no_grad(), tracer.record("") as dump:
        out = model(**qi_kwargs(inp, img_shapes_arg))[0]
    tracer.remove()
    check_names(dump, "", expected_qi(model, B, L, N))
    assert torch.equal(out, dump["output"])
    dump = f32_contig(dump)

    write_st(os.path.join(case_dir, "inputs.safetensors"), inp)
    write_st(os.path.join(case_dir, "dump.safetensors"), dump)
    meta = {
        "case": case,
        "description": description,
        "seed": seed,
        "seeds": {"model_construct": seed, "weights": seed + 1, "inputs": seed + 2},
        "weight_init": WEIGHT_INIT_QI,
        "transformer_config": clean_config(model.config),
        "saved_weight_dtype": "float32",
        "batch": B,
        "num_txt_tokens": L,
        "img_shapes_argument": repr(img_shapes_arg),
        "img_shapes": [list(s) for s in shapes],
        "num_img_tokens": N,
        "timestep": timestep,
        "encoder_hidden_states_mask": ("None" if invalid_text is None else
                                       {"invalid_(batch,row)": [list(x) for x in invalid_text]}),
        "call": "model(hidden_states, encoder_hidden_states, encoder_hidden_states_mask, timestep, img_shapes, "
                "return_dict=False)",
    }
    write_meta(case_dir, meta, dump, inp, SCRIPT)
    reloaded = load_transformer(QwenImageTransformer2DModel, tdir)
    check_reload_weights(model, reloaded, case)
    with torch.no_grad():
        out2 = reloaded(**qi_kwargs(inp, img_shapes_arg))[0]
        out3 = load_transformer(QwenImageTransformer2DModel, tdir, realign=False)(**qi_kwargs(inp, img_shapes_arg))[0]
    assert torch.equal(out2, dump["output"]), f"{case}: reloaded output differs ({max_abs(out2, dump['output'])})"
    unaligned = max_abs(out3, dump["output"])
    assert unaligned < 1e-5
    print(f"[{case}] self-check OK: reloaded transformer reproduces output exactly "
          f"(|output|max={float(out.abs().max()):.4g}; as-loaded, unrealigned weights: max|diff|={unaligned:.3g})")


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------

T2I_SEED = 6000
REFS_SEED = 7000


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/golden",
                    help="output root; cases go to <out>/qwen_image21/ and <out>/qwen_image/ (default: tests/golden)")
    args = ap.parse_args(argv)
    check_pins()
    det = setup_determinism()
    print(f"versions: {versions()}  deterministic_algorithms={det}")
    out21 = os.path.join(args.out, "qwen_image21")
    outqi = os.path.join(args.out, "qwen_image")
    os.makedirs(out21, exist_ok=True)
    os.makedirs(outqi, exist_ok=True)

    # ---- Qwen-Image-2.1 transformer ----
    run_q21_kv_case(
        out21, "t2i",
        "Tiny 2.1 test config (causal_condition=True, default QwenImage21AttnProcessor). T2I: batch 1, 7 text "
        "tokens, no condition image, 4x6 target (24 tokens); img_mask = 7 False + 6 True (T/4 target slots, as the "
        "pipeline appends them); encoder_hidden_states_mask None. plain.* at t=0.8, extract.* (same inputs, "
        "kv_cache_mode='extract') + extract.kv.{i}.k|v [B,P,H,hd], cached.* (kv_cache_mode='cached', "
        "hidden_states_cached, t=0.35: S'=T rows), recompute.output (plain forward at the cached call's inputs, "
        "all S rows).",
        seed=T2I_SEED, B=1, layout=[7], target_hw=(4, 6), timestep=[0.8], timestep_cached=[0.35])
    refs_model, _ = run_q21_kv_case(
        out21, "refs",
        "Tiny 2.1 test config, batch 2, two condition images spliced into the text: text rows [3 text, image 1 "
        "(2x4 latent grid = 8 tokens = 2 slots), 2 text, image 2 (4x2 = 8 tokens = 2 slots), 2 text] (L=11 rows, "
        "7 text tokens), 4x4 target; hidden_states = cat(cond1, cond2, target); img_shapes "
        "[[(1,2,4),(1,4,2),(1,4,4)]]*2; encoder_hidden_states_mask [2,11] all valid except the last text row of "
        "batch element 1. Per-sample timesteps [0.8,0.55] (cached call [0.35,0.2]). Calls as in t2i; "
        "plain.image_ids and plain.target_token_mask [S] are build_token_metadata's result as F32.",
        seed=REFS_SEED, B=2, layout=[3, (2, 4), 2, (4, 2), 2], target_hw=(4, 4), timestep=[0.8, 0.55],
        timestep_cached=[0.35, 0.2], invalid_text=[(1, 10)], dump_metadata=True)
    run_q21_no_causal_case(out21)

    # ---- Qwen-Image-2.1 pipeline ----
    run_q21_pipeline_case(
        out21, "pipeline_cfg", refs_model, seed=9000, neg=True, cfg_scale=4.0, sched_cfg=PIPE_SCHED_RELEASED,
        sample_sigmas=None, steps=2,
        cond_layout=[3, PIPE_COND_HW, 2], neg_layout=[1, PIPE_COND_HW, 3, 1], neg_invalid_last=True,
        description=(
            "2-step QwenImage21Pipeline.__call__ with true CFG (true_cfg_scale 4.0, negative_prompt_embeds given), "
            "use_kv_cache=True (step 0 'extract', step 1 'cached', one cache per branch), transformer weights of "
            "qwen_image21/refs, batch 1, one 2x4 condition image (32x64 px placeholder; output_resolution 45 keeps "
            "it at 2x4) spliced into the prompt: cond rows [3 text, 2 slots, 2 text] (mask all ones -> None), "
            "uncond rows [1 text, 2 slots, 3 text, 1 padded] (its mask marks the last row invalid and reaches the "
            "transformer). 4x4 target (64x64 px). Scheduler: released config (dynamic exponential shift, "
            "base/max seq 256/8192, shift 0.5/0.9, shift_terminal 0.02). No text encoder / VAE: a stub processor "
            "satisfies __init__, pipe._encode_vae_image returns cond_latents (unpacked), and pipe.encode_prompt is "
            "wrapped only to add image_pad_mask for the given embeddings. step.{k}.timestep is the model's "
            "timestep argument, cond/uncond_output the transformer outputs' last T rows, noise_pred the CFG "
            "combination handed to scheduler.step, latents the packed target latents after the step."))
    run_q21_pipeline_case(
        out21, "pipeline_sample_sigmas", refs_model, seed=9500, neg=False, cfg_scale=1.0,
        sched_cfg=PIPE_SCHED_IDENTITY, sample_sigmas=[1.0, 0.6, 0.3], steps=3, num_inference_steps_arg=2,
        cond_layout=[3, PIPE_COND_HW, 2],
        description=(
            "3-step QwenImage21Pipeline.__call__ with the pipeline-level sample_sigmas [1.0, 0.6, 0.3] (constructor "
            "argument, pipe.config.sample_sigmas) and the identity scheduler (use_dynamic_shifting false, shift 1, "
            "shift_terminal None): sigmas used verbatim plus a terminal 0; num_inference_steps (2 passed) is "
            "ignored. CFG off, use_kv_cache=True (extract, cached, cached). Same weights / layout / glue as "
            "pipeline_cfg, without the negative branch."))

    # ---- Qwen-Image (dual stream) ----
    run_qi_case(
        outqi, "t2i",
        "Qwen-Image unit-test tiny config (patch 2, in 16, out 4, 2 layers, 4 heads x 16, joint 16, axes (8,4,4)). "
        "Batch 1, 6 text tokens with encoder_hidden_states_mask marking the last one invalid, img_shapes "
        "[(1,3,4)] (12 packed tokens), timestep 0.6.",
        seed=10000, img_shapes_arg=[(1, 3, 4)], L=6, timestep=[0.6], invalid_text=[(0, 5)])
    run_qi_case(
        outqi, "edit_plus",
        "Qwen-Image tiny config, Edit-Plus layout: img_shapes [[(1,2,4) target, (1,2,2) reference]], "
        "hidden_states = cat(target, ref) (8 + 4 tokens; RoPE frame index 0 / 1), 5 text tokens, mask None, "
        "timestep 0.45. Output covers all 12 image tokens (the pipeline keeps the first 8).",
        seed=11000, img_shapes_arg=[[(1, 2, 4), (1, 2, 2)]], L=5, timestep=[0.45])

    print("\nfiles written:")
    total = 0
    for top in (out21, outqi):
        for root, _, files in sorted(os.walk(top)):
            for fn in sorted(files):
                pth = os.path.join(root, fn)
                sz = os.path.getsize(pth)
                total += sz
                print(f"  {sz:>10,d}  {pth}")
                if sz >= MAX_FILE_BYTES:
                    raise SystemExit(f"error: {pth} is {sz} bytes (limit {MAX_FILE_BYTES})")
    print(f"  {total:>10,d}  total ({total / 2**20:.2f} MiB)")
    if total >= MAX_TOTAL_BYTES:
        raise SystemExit(f"error: total {total} bytes (limit {MAX_TOTAL_BYTES})")


if __name__ == "__main__":
    main()
