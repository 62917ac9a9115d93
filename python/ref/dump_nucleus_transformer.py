#!/usr/bin/env python3
"""Golden reference dumper for flowkv's NucleusMoE-Image transformer port.

Runs diffusers' own ``NucleusMoEImageTransformer2DModel`` on one tiny random-weight config
(4 query heads and 2 key/value heads of 8, width 32, 5 blocks: 0-2 dense SwiGLU, 3-4
mixture-of-experts with 4 experts and capacity factors 2.0 / 1.5), batch 2, a 3 x 4 latent grid
and 6 prompt rows of which the second sample's last 2 are padding, and writes under
``<out>/nucleus_transformer/``:

* ``transformer/``                the 5-block model (diffusers ``save_pretrained``, f32)
* ``inputs.safetensors``          hidden_states [2, 12, 16], encoder_hidden_states [2, 6, 24],
                                  encoder_hidden_states_mask [2, 6] (as F32), timestep [2]; the
                                  latent and prompt rows are bf16 values (exact in f32), so the
                                  bf16 runs read the very inputs the f32 runs read
* ``<case>/dump.safetensors``     the named intermediates of one forward (F32)
* ``<case>/meta.json``

Cases: ``dense3`` (the first 3 blocks only: a 3-block model loaded from the same weights, all
dense), ``full`` (all 5 blocks), both in f32 and in bf16 (``dense3_bf16``, ``full_bf16``: the
model cast with ``.to(torch.bfloat16)``, inputs cast to bf16, outputs dumped as F32).

Intermediates are captured with forward hooks on diffusers' modules and a wrapper of
``_apply_rotary_emb_nucleus`` in the module namespace (called per block for the image query, the
image key and the text key, in that order). No diffusers code is copied here.

Usage (from the repository root)::

    python/ref/.venv/bin/python python/ref/dump_nucleus_transformer.py --out tests/golden
"""

from __future__ import annotations

import argparse
import math
import os

import torch

from diffusers import NucleusMoEImageTransformer2DModel
import diffusers.models.transformers.transformer_nucleusmoe_image as tn

from ref_common import (TracerBase, check_pins, clean_config, fresh_dir, load_transformer,
                        setup_determinism, write_meta, write_st)

SCRIPT = "python/ref/dump_nucleus_transformer.py"
MAX_TOTAL_BYTES = 1536 * 1024

CONFIG = dict(
    patch_size=2,
    in_channels=16,
    out_channels=4,
    num_layers=5,
    attention_head_dim=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    joint_attention_dim=24,
    axes_dims_rope=(2, 2, 4),
    mlp_ratio=6.0,  # int(32 * 6 * 2 / 3) // 128 * 128 = 128
    moe_enabled=True,
    dense_moe_strategy="leave_first_three_blocks_dense",
    num_experts=4,
    moe_intermediate_dim=16,
    capacity_factors=[0.0, 0.0, 0.0, 2.0, 1.5],
    use_sigmoid=False,
    route_scale=2.5,
)
B, H_GRID, W_GRID, L = 2, 3, 4, 6
VALID = [[1] * 6, [1, 1, 1, 1, 0, 0]]
TIMESTEPS = [0.7, 0.25]
SEED_WEIGHTS, SEED_INPUTS = 1234, 99

WEIGHT_INIT = ("2-D linear weight and router ~ N(0, 1/fan_in); experts.gate_up_proj [E, D, 2I] ~ N(0, 1/D), "
               "experts.down_proj [E, I, D] ~ N(0, 1/I); biases 0.1*N(0,1); RMSNorm weights (norm_q/k, "
               "norm_added_q/k, txt_norm, time_text_embed.norm) 1 + 0.1*N(0,1)")


def init_weights(model: torch.nn.Module, seed: int):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                prm.copy_(torch.randn(prm.shape, generator=g) / math.sqrt(prm.shape[1]))
            elif prm.ndim == 2:
                prm.copy_(torch.randn(prm.shape, generator=g) / math.sqrt(prm.shape[1]))
            elif prm.ndim == 1 and name.endswith(".bias"):
                prm.copy_(0.1 * torch.randn(prm.shape, generator=g))
            elif prm.ndim == 1 and name.endswith(".weight"):
                prm.copy_(1.0 + 0.1 * torch.randn(prm.shape, generator=g))
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(prm.shape)}")


class NucleusTracer(TracerBase):
    active: "NucleusTracer | None" = None

    def _install(self):
        m = self.model
        for attr, name in {"img_in": "img_in", "txt_norm": "txt_norm", "time_text_embed": "temb",
                           "norm_out": "norm_out", "proj_out": "output"}.items():
            self.handles.append(getattr(m, attr).register_forward_hook(self._out_hook(name)))
        for i, blk in enumerate(m.transformer_blocks):
            p = f"transformer_blocks.{i}."
            self.handles.append(blk.register_forward_pre_hook(self._block_in(p), with_kwargs=True))
            self.handles.append(blk.attn.register_forward_pre_hook(self._attn_in(p), with_kwargs=True))
            self.handles.append(blk.attn.to_v.register_forward_hook(self._heads(p + "attn.v")))
            self.handles.append(blk.attn.add_v_proj.register_forward_hook(self._heads(p + "attn.txt_v")))
            self.handles.append(blk.attn.to_out[0].register_forward_pre_hook(self._to_out_in(p)))
            self.handles.append(blk.img_mlp.register_forward_hook(self._out_hook(p + "mlp")))
            self.handles.append(blk.register_forward_hook(self._out_hook(p + "out")))

    def _block_in(self, p):
        def hook(mod, args, kwargs):
            assert not args
            self.put(p + "in", kwargs["hidden_states"])

        return hook

    def _attn_in(self, p):
        def hook(mod, args, kwargs):
            if self.store is None:
                return
            self.cur_attn = p
            self.side["rope_calls"] = 0
            self.put(p + "norm1", kwargs["hidden_states"])

        return hook

    def _heads(self, name):
        kv_heads = self.model.config.num_key_value_heads

        def hook(mod, args, out):
            self.put(name, out.unflatten(-1, (kv_heads, -1)))

        return hook

    def _to_out_in(self, p):
        def hook(mod, args):
            self.put(p + "attn.out", args[0])
            self.cur_attn = None

        return hook

    def on_rope(self, out):
        if self.store is None or self.cur_attn is None:
            return
        k = self.side["rope_calls"]
        self.side["rope_calls"] = k + 1
        self.put(self.cur_attn + ("attn.q", "attn.k", "attn.txt_k")[k], out)


_orig_rope = tn._apply_rotary_emb_nucleus


def _traced_rope(x, freqs_cis, *args, **kwargs):
    out = _orig_rope(x, freqs_cis, *args, **kwargs)
    tr = NucleusTracer.active
    if tr is not None:
        tr.on_rope(out)
    return out


tn._apply_rotary_emb_nucleus = _traced_rope


def make_inputs():
    g = torch.Generator().manual_seed(SEED_INPUTS)
    hs = torch.randn(B, H_GRID * W_GRID, CONFIG["in_channels"], generator=g)
    enc = torch.randn(B, L, CONFIG["joint_attention_dim"], generator=g) * 2.0
    # bf16 values, exact in f32: the bf16 and f32 runs read the same numbers.
    hs, enc = hs.to(torch.bfloat16).float(), enc.to(torch.bfloat16).float()
    mask = torch.tensor(VALID, dtype=torch.float32)
    t = torch.tensor(TIMESTEPS, dtype=torch.float32)
    return {"hidden_states": hs, "encoder_hidden_states": enc, "encoder_hidden_states_mask": mask,
            "timestep": t}


def run(model, inputs, dtype):
    with torch.no_grad():
        out = model(hidden_states=inputs["hidden_states"].to(dtype),
                    img_shapes=[(1, H_GRID, W_GRID)] * B,
                    encoder_hidden_states=inputs["encoder_hidden_states"].to(dtype),
                    encoder_hidden_states_mask=inputs["encoder_hidden_states_mask"].bool(),
                    timestep=inputs["timestep"].to(dtype), return_dict=False)[0]
    return out


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    check_pins()
    det = setup_determinism()
    root = os.path.join(args.out, "nucleus_transformer")
    fresh_dir(root)

    torch.manual_seed(0)
    model = NucleusMoEImageTransformer2DModel(**CONFIG)
    init_weights(model, SEED_WEIGHTS)
    model.save_pretrained(os.path.join(root, "transformer"), safe_serialization=True, max_shard_size="10GB")
    full = load_transformer(NucleusMoEImageTransformer2DModel, os.path.join(root, "transformer"))
    dense_cfg = dict(CONFIG, num_layers=3, capacity_factors=CONFIG["capacity_factors"][:3])
    dense = NucleusMoEImageTransformer2DModel(**dense_cfg)
    missing, unexpected = dense.load_state_dict(full.state_dict(), strict=False)
    assert not missing and all(k.startswith(("transformer_blocks.3.", "transformer_blocks.4."))
                               for k in unexpected), (missing, unexpected)
    dense = dense.eval()

    inputs = make_inputs()
    write_st(os.path.join(root, "inputs.safetensors"), inputs)
    for name, m, dtype in [("dense3", dense, torch.float32), ("full", full, torch.float32),
                           ("dense3_bf16", dense, torch.bfloat16), ("full_bf16", full, torch.bfloat16)]:
        m = m.to(dtype)
        tracer = NucleusTracer(m)
        with tracer.record() as store:
            out = run(m, inputs, dtype)
        tracer.remove()
        dump = dict(store)
        assert torch.equal(dump["output"], out.float())
        case = os.path.join(root, name)
        os.makedirs(case)
        write_st(os.path.join(case, "dump.safetensors"), dump)
        meta = {
            "description": f"NucleusMoEImageTransformer2DModel forward, case {name}",
            "config": {k: v for k, v in clean_config(m.config).items() if k != "_name_or_path"},
            "compute_dtype": str(dtype).replace("torch.", ""),
            "weights": "transformer/ (dense3 uses its top-level tensors and blocks 0-2)",
            "weight_init": WEIGHT_INIT,
            "seeds": {"weights": SEED_WEIGHTS, "inputs": SEED_INPUTS},
            "img_shapes": [[1, H_GRID, W_GRID]] * B,
            "deterministic_algorithms": det,
        }
        write_meta(case, meta, dump, inputs, SCRIPT)
        m.to(torch.float32)
    total = dir_bytes(root)
    assert total <= MAX_TOTAL_BYTES, f"{root}: {total} bytes written, over the {MAX_TOTAL_BYTES} limit"
    print(f"wrote {root} ({total} bytes)")


if __name__ == "__main__":
    main()
