#!/usr/bin/env python3
"""Golden reference dumper for flowkv's FLUX.2 VAE (diffusers ``AutoencoderKLFlux2``).

Builds tiny random-weight ``AutoencoderKLFlux2`` models, runs them in float32 on the CPU the way
``Flux2KleinPipeline`` uses them, and writes, per case, under ``<out>/<case>/``:

* ``vae/``                  the model, written by diffusers ``save_pretrained`` (F32 safetensors)
* ``inputs.safetensors``    the F32 inputs: ``image`` [B,3,H,W] in [-1,1] and ``latents`` (the
                            normalised, patchified latents a denoise would hand to the decoder)
* ``dump.safetensors``      named intermediates (F32, contiguous, PyTorch NCHW order)
* ``meta.json``             description, versions, seed, config, dumped names and shapes

Encode path (``Flux2KleinPipeline._encode_vae_image``: ``retrieve_latents(vae.encode(image),
sample_mode="argmax")`` = the posterior's mode, then ``_patchify_latents`` and the BatchNorm
running-statistics normalisation):
``encode.encoder.conv_in`` ... ``encode.quant_conv`` (the moments), ``encode.mode``,
``encode.patchified``, ``encode.normalized`` (what the pipeline returns), ``encode.tokens``
(``_pack_latents``: [B, h*w, C], what the transformer reads).

Decode path (the end of ``Flux2KleinPipeline.__call__``: ``_unpack_latents_with_ids``, then
``latents * sqrt(running_var + eps) + running_mean``, ``_unpatchify_latents``, ``vae.decode``):
``decode.unpacked`` ... ``decode.image``.

Tiled decode: ``vae.tiled_decode`` with a small tile (``tile_latent_min_size``), dumped as
``tiled.image`` beside the untiled ``tiled.untiled`` of the same latents.

Usage (from the repository root)::

    python/ref/.venv/bin/python python/ref/dump_flux2_vae.py --out tests/golden/flux2_vae
"""

from __future__ import annotations

import argparse
import os

import torch

from diffusers import AutoencoderKLFlux2, Flux2KleinPipeline

from ref_common import (check_pins, clean_config, fresh_dir, max_abs, setup_determinism, versions,
                        write_meta, write_st)

SCRIPT = "python/ref/dump_flux2_vae.py"
MAX_FILE_BYTES = 1536 * 1024  # the whole area must stay well under 2 MB

P = Flux2KleinPipeline  # its static helpers: _patchify_latents, _pack_latents, ...


def init_weights(model: torch.nn.Module, seed: int):
    """Re-initialises every parameter from a seeded generator, and the BatchNorm running stats.

    Convolutions and linears ~ N(0, 1/fan_in) (unit-variance preserving), biases ~ 0.05 N(0,1);
    GroupNorm weight = 1 + 0.1 N(0,1), bias = 0.1 N(0,1); running_mean ~ 0.5 N(0,1),
    running_var ~ U(0.5, 2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias") and p.ndim == 1 and ("norm" in name.split(".")[-2]):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".weight") and p.ndim == 1:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
        c = model.bn.running_mean.numel()
        model.bn.running_mean.copy_(0.5 * torch.randn(c, generator=g))
        model.bn.running_var.copy_(0.5 + 1.5 * torch.rand(c, generator=g))


class Hooks:
    """Forward hooks that store module outputs under their module names (with a prefix)."""

    def __init__(self, model, names):
        self.store = None
        self.prefix = ""
        mods = dict(model.named_modules())
        self.handles = [mods[n].register_forward_hook(self._hook(n)) for n in names]

    def _hook(self, name):
        def hook(mod, args, out):
            if self.store is not None:
                key = self.prefix + name
                assert key not in self.store, key
                self.store[key] = out.detach().clone()
        return hook


def traced_names(model) -> tuple[list[str], list[str]]:
    """Module outputs dumped: block level (each down / up block, the mid block's parts), enough
    to name the first diverging stage while the dump stays small."""
    cfg = model.config
    mid = lambda p: ([f"{p}.mid_block.resnets.0"] +  # noqa: E731
                     ([f"{p}.mid_block.attentions.0"] if cfg.mid_block_add_attention else []) +
                     [f"{p}.mid_block"])
    enc = ["encoder.conv_in"] + [f"encoder.down_blocks.{i}" for i in range(len(model.encoder.down_blocks))]
    enc += mid("encoder") + ["encoder.conv_out"]
    if model.quant_conv is not None:
        enc.append("quant_conv")
    dec = ([] if model.post_quant_conv is None else ["post_quant_conv"]) + ["decoder.conv_in"]
    dec += mid("decoder") + [f"decoder.up_blocks.{i}" for i in range(len(model.decoder.up_blocks))]
    return enc, dec


def bn_stats(vae, like):
    mean = vae.bn.running_mean.view(1, -1, 1, 1).to(like.device, like.dtype)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps).to(like.device, like.dtype)
    return mean, std


def pipeline_encode(pipe, image, hooks):
    """Flux2KleinPipeline._encode_vae_image, one image at a time as prepare_image_latents calls
    it, with the pipeline's intermediate steps recomputed beside it for the dump."""
    vae = pipe.vae
    out = {}
    hooks.store, hooks.prefix = out, "encode."
    dist = vae.encode(image).latent_dist
    hooks.store = None
    mode = dist.mode()
    patched = P._patchify_latents(mode)
    mean, std = bn_stats(vae, patched)
    normalized = (patched - mean) / std
    with torch.no_grad():
        got = pipe._encode_vae_image(image=image, generator=torch.Generator().manual_seed(0))
    assert torch.equal(got, normalized), "the pipeline's own _encode_vae_image differs"
    out["encode.mode"] = mode
    out["encode.patchified"] = patched
    out["encode.normalized"] = normalized
    out["encode.tokens"] = P._pack_latents(normalized)
    return out


def pipeline_decode(vae, latents, hooks):
    """The end of Flux2KleinPipeline.__call__: tokens -> unpack -> de-normalise -> unpatchify ->
    vae.decode. `latents` are normalised patchified [B, C, h, w]; they are packed first, as the
    denoise loop holds them."""
    B, C, h, w = latents.shape
    tokens = P._pack_latents(latents)
    ids = P._prepare_latent_ids(latents)
    out = {"decode.tokens": tokens}
    x = P._unpack_latents_with_ids(tokens, ids, h, w)
    assert torch.equal(x, latents)
    mean, std = bn_stats(vae, x)
    x = x * std + mean
    out["decode.denormalized"] = x
    x = P._unpatchify_latents(x)
    out["decode.unpatchified"] = x
    hooks.store, hooks.prefix = out, "decode."
    img = vae.decode(x, return_dict=False)[0]
    hooks.store = None
    out["decode.image"] = img
    return out


def run_case(out_root, case, description, cfg, seed, image_shape, latent_hw, tiled=None):
    case_dir = os.path.join(out_root, case)
    fresh_dir(case_dir)
    torch.manual_seed(seed)
    vae = AutoencoderKLFlux2(**cfg).eval()
    init_weights(vae, seed + 1)
    vdir = os.path.join(case_dir, "vae")
    vae.save_pretrained(vdir, safe_serialization=True)
    vae = AutoencoderKLFlux2.from_pretrained(vdir, torch_dtype=torch.float32, low_cpu_mem_usage=False).eval()
    with torch.no_grad():  # realign parameters (see ref_common.load_transformer)
        for prm in vae.parameters():
            prm.data = prm.data.clone()
    pipe = Flux2KleinPipeline(scheduler=None, vae=vae, text_encoder=None, tokenizer=None, transformer=None)
    f = pipe.vae_scale_factor * 2
    B, _, H, W = image_shape
    assert H % f == 0 and W % f == 0

    g = torch.Generator().manual_seed(seed + 2)
    image = 2 * torch.rand(image_shape, generator=g) - 1
    C = 4 * cfg["latent_channels"]
    latents = torch.randn((B, C) + tuple(latent_hw), generator=g)
    inp = {"image": image, "latents": latents}

    enc_names, dec_names = traced_names(vae)
    hooks = Hooks(vae, enc_names + dec_names)
    with torch.no_grad():
        dump = {}
        for b in range(B):  # the pipeline encodes each reference alone (batch 1)
            one = pipeline_encode(pipe, image[b:b + 1], hooks)
            for k, v in one.items():
                dump.setdefault(k, []).append(v)
        dump = {k: torch.cat(v) for k, v in dump.items()}
        # ... and a batched encode gives the same latents (flowkv encodes a batch)
        hooks.store = None
        batched = P._patchify_latents(vae.encode(image).latent_dist.mode())
        print(f"[{case}] batch-of-{B} encode vs one at a time: max abs {max_abs(batched, dump['encode.patchified']):.3g}")
        dec = pipeline_decode(vae, latents, hooks)
        dump.update(dec)
        expect = ["encode." + n for n in enc_names] + ["decode." + n for n in dec_names]
        missing = [n for n in expect if n not in dump]
        assert not missing, missing
        meta_extra = {}
        if tiled is not None:
            tl = tiled["latents_hw"]
            tlat = torch.randn((1, C) + tuple(tl), generator=g)
            inp["tiled_latents"] = tlat
            z = P._unpatchify_latents(tlat * bn_stats(vae, tlat)[1] + bn_stats(vae, tlat)[0])
            untiled = vae.decode(z, return_dict=False)[0]
            vae.tile_latent_min_size = tiled["tile_latent"]
            vae.tile_sample_min_size = tiled["tile_latent"] * pipe.vae_scale_factor
            vae.tile_overlap_factor = tiled["overlap"]
            vae.enable_tiling()
            tiled_img = vae.decode(z, return_dict=False)[0]
            vae.disable_tiling()
            assert tiled_img.shape == untiled.shape
            dump["tiled.untiled"] = untiled
            dump["tiled.image"] = tiled_img
            meta_extra["tiled"] = dict(tiled, tile_sample=vae.tile_sample_min_size,
                                       seam_max_abs_vs_untiled=max_abs(tiled_img, untiled))
            print(f"[{case}] diffusers tiled vs untiled decode: max abs {max_abs(tiled_img, untiled):.4g}")

    order = ["encode." + n for n in enc_names] + [
        "encode.mode", "encode.patchified", "encode.normalized", "encode.tokens", "decode.tokens",
        "decode.denormalized", "decode.unpatchified"] + ["decode." + n for n in dec_names] + ["decode.image"]
    order += [k for k in dump if k not in order]
    dump = {k: dump[k] for k in order}
    for k, v in dump.items():
        print(f"  {k:48s} {str(tuple(v.shape)):22s} std {float(v.std()):.3f}")
    write_st(os.path.join(case_dir, "inputs.safetensors"), inp)
    write_st(os.path.join(case_dir, "dump.safetensors"), dump)
    meta = {
        "case": case,
        "description": description,
        "seed": seed,
        "vae_config": clean_config(vae.config),
        "vae_scale_factor": pipe.vae_scale_factor,
        "image_shape": list(image_shape),
        "latents_shape": list(latents.shape),
        "encode": "per image (batch 1) as Flux2KleinPipeline.prepare_image_latents; mode of the posterior",
        "batch_encode_max_abs_vs_single": max_abs(batched, dump["encode.patchified"]),
        "weights": "conv/linear ~ N(0,1/fan_in), biases 0.05 N, GroupNorm 1+0.1N / 0.1N, bn mean 0.5N var U(0.5,2)",
    }
    meta.update(meta_extra)
    write_meta(case_dir, meta, dump, inp, SCRIPT)

    total = 0
    for root, _, files in os.walk(case_dir):
        for fn in files:
            sz = os.path.getsize(os.path.join(root, fn))
            total += sz
            assert sz < MAX_FILE_BYTES, f"{fn}: {sz} bytes"
    print(f"[{case}] wrote {total / 1024:.0f} KiB")
    return total


TINY_CFG = dict(
    in_channels=3, out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
    block_out_channels=(8, 16, 16, 16), decoder_block_out_channels=(8, 8, 16, 16),
    layers_per_block=1, latent_channels=4, norm_num_groups=4, sample_size=64,
    use_quant_conv=True, use_post_quant_conv=True, mid_block_add_attention=True,
    batch_norm_eps=1e-3, batch_norm_momentum=0.1, patch_size=(2, 2))

PLAIN_CFG = dict(
    in_channels=3, out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
    block_out_channels=(8, 8), layers_per_block=2, latent_channels=2, norm_num_groups=2,
    sample_size=32, use_quant_conv=False, use_post_quant_conv=False, mid_block_add_attention=False,
    patch_size=(2, 2))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/golden/flux2_vae")
    args = ap.parse_args(argv)
    check_pins()
    det = setup_determinism()
    print(f"versions: {versions()}  deterministic_algorithms={det}")
    os.makedirs(args.out, exist_ok=True)
    total = run_case(
        args.out, "tiny",
        "4 blocks (8,16,16,16), decoder (8,8,16,16), 1 resnet per encoder block (2 per decoder block), "
        "4 latent channels (16 patchified), 4 groups, quant convs, mid-block attention, batch_norm_eps 1e-3; "
        "2 images 32x48 (HxW) encoded as the pipeline does; decode of 2 given latents [16,2,3]; "
        "tiled decode of a [16,4,6] latent with 4-latent tiles (32 px), overlap 0.25.",
        TINY_CFG, 7000, (2, 3, 32, 48), (2, 3),
        tiled=dict(latents_hw=[4, 6], tile_latent=4, overlap=0.25))
    total += run_case(
        args.out, "plain",
        "2 blocks (8,8), 2 resnets per encoder block, 2 latent channels, 2 groups, no quant convs, "
        "no mid-block attention, default batch_norm_eps; one 16x24 image; decode of one [8,4,6] latent.",
        PLAIN_CFG, 7100, (1, 3, 16, 24), (4, 6))
    print(f"total {total / 1024:.0f} KiB")
    assert total < 2 * 1000 * 1000


if __name__ == "__main__":
    main()
