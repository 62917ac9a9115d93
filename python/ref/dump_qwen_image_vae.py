#!/usr/bin/env python3
"""Golden reference dumper for flowkv's Qwen-Image VAE (diffusers ``AutoencoderKLQwenImage``).

Builds one tiny random-weight ``AutoencoderKLQwenImage`` (the released architecture at base_dim 2:
4 levels, /8 down and up, temperal_downsample [False, True, True] so the checkpoint holds
time_convs, two resnets per level with conv shortcuts where the width changes, mid attention,
non-trivial latents_mean / latents_std) and writes it with ``save_pretrained`` to ``<out>/vae/``.
Then, per case, under ``<out>/<case>/``:

* ``inputs.safetensors``  ``source`` [h, w, 3] the RGB source image (uint8 values as f32) that the
                          pipeline hands to ``VaeImageProcessor.preprocess``; ``latents``
                          normalised latents [1, 16, h, w] to decode; ``tiled_latents`` likewise
                          for the tiled decode
* ``dump.safetensors``    named F32 tensors (PyTorch order)
* ``meta.json``           description, versions, sizes, tiling, dumped names

Cases: an RGB source preprocessed to an explicit 64x48 (WxH; resized, as
QwenImageEditPlusPipeline passes its VAE size), and an RGB source preprocessed without a size
(rounded down to multiples of 16: 41x77 -> 32x64).

Dumped names:
``pre.resized`` the resized RGB uint8 pixels [H, W, 3] (PIL Lanczos); ``pre.image``
preprocess's output [1, 3, H, W]; ``encode.<module>`` encoder intermediates under diffusers'
module names (every entry of the flat ``encoder.down_blocks`` list); ``encode.moments``
(vae.encode's distribution parameters [1, 32, 1, h, w] with the frame axis dropped);
``encode.mode``; ``encode.normalized`` (``_encode_vae_image``: argmax, (z - mean) / std);
``encode.tokens`` (``_pack_latents``, [1, hw/4, 64]); ``decode.tokens`` (the packed latents the
pipeline unpacks); ``decode.denormalized``; ``decode.<module>`` decoder intermediates;
``decode.decoder`` (the decoder before the clamp); ``decode.image``
(``vae.decode(...)[0][:, :, 0]``); ``post.pixels`` (postprocess to PIL: RGB uint8 [H, W, 3]);
``tiled.image`` (tiled decode with small tiles, as diffusers returns it: not clamped; diffusers'
seam error against the untiled decode is in meta.json). The second case dumps the endpoints only.

Usage (from the repository root)::

    /work/main/python/ref/.venv/bin/python python/ref/dump_qwen_image_vae.py --out tests/golden/qwen_image_vae
"""

from __future__ import annotations

import argparse
import os
import types

import numpy as np
import torch
from PIL import Image

from diffusers import AutoencoderKLQwenImage
from diffusers.image_processor import VaeImageProcessor
from diffusers.pipelines.qwenimage.pipeline_qwenimage import QwenImagePipeline
from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import (QwenImageEditPlusPipeline,
                                                                        retrieve_latents)

from ref_common import check_pins, fresh_dir, max_abs, setup_determinism, versions, write_meta, write_st

SCRIPT = "python/ref/dump_qwen_image_vae.py"
P = QwenImagePipeline
Z = 16

CFG = dict(base_dim=4, z_dim=Z, dim_mult=[1, 2, 2, 2], num_res_blocks=2, attn_scales=[],
           temperal_downsample=[False, True, True], dropout=0.0, input_channels=3)

TILING = dict(tile_sample_min_height=32, tile_sample_min_width=32,
              tile_sample_stride_height=24, tile_sample_stride_width=24)


def init_weights(model, seed):
    """Convolutions ~ N(0, 1/fan_in) (fan_in of one time tap for the 3-D kernels: a single frame
    meets only the last one), biases 0.05 N(0,1), RMS-norm gammas 1 + 0.1 N(0,1); the decoder's
    conv_out scaled by 0.5 so a part of the image (a few per cent) is clamped."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".gamma"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel() // (p.shape[2] if p.dim() == 5 else 1)
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
        model.decoder.conv_out.weight.mul_(0.5)


def source_rgb(w, h, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), ((x + y) * 37) % 256], -1)
    rgb = rgb + rng.integers(-40, 41, (h, w, 3))
    return Image.fromarray(rgb.clip(0, 255).astype(np.uint8), "RGB")


def modules_traced(vae):
    enc = (["encoder.conv_in"] + [f"encoder.down_blocks.{i}" for i in range(len(vae.encoder.down_blocks))]
           + ["encoder.mid_block.resnets.0", "encoder.mid_block.attentions.0", "encoder.mid_block",
              "encoder.conv_out", "quant_conv"])
    dec = (["post_quant_conv", "decoder.conv_in", "decoder.mid_block.resnets.0",
            "decoder.mid_block.attentions.0", "decoder.mid_block"]
           + [f"decoder.up_blocks.{i}" for i in range(len(vae.decoder.up_blocks))] + ["decoder"])
    return enc, dec


class Hooks:
    def __init__(self, model, names):
        self.store, self.prefix = None, ""
        mods = dict(model.named_modules())
        for n in names:
            mods[n].register_forward_hook(self._hook(n))

    def _hook(self, name):
        def hook(mod, args, out):
            if self.store is not None:
                key = self.prefix + name
                assert key not in self.store, key
                assert out.dim() == 5 and out.shape[2] == 1, (name, out.shape)
                self.store[key] = out[:, :, 0].detach().clone()  # one frame: drop the T axis
        return hook


def stats(vae, like):
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1).to(like.device, like.dtype)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1).to(like.device, like.dtype)
    return mean, std


def run_case(out_root, vae, pipe, case, src, size, decode_hw, tiled_hw, seed, description, trace=True):
    case_dir = os.path.join(out_root, case)
    fresh_dir(case_dir)
    enc_names, dec_names = modules_traced(vae) if trace else ([], [])
    hooks = Hooks(vae, enc_names + dec_names)
    dump = {}
    width, height = size if size else pipe.image_processor.get_default_height_width(src)[::-1]
    resized = pipe.image_processor.resize(src, width=width, height=height)
    dump["pre.resized"] = torch.from_numpy(np.array(resized).astype(np.float32))
    pre = (pipe.image_processor.preprocess(src, width=width, height=height) if size
           else pipe.image_processor.preprocess(src))
    assert tuple(pre.shape) == (1, 3, height, width), pre.shape
    dump["pre.image"] = pre
    x = pre.unsqueeze(2)
    with torch.no_grad():
        hooks.store, hooks.prefix = dump, "encode."
        dist = vae.encode(x).latent_dist
        hooks.store = None
        dump["encode.moments"] = dist.parameters[:, :, 0]
        mode = retrieve_latents(vae.encode(x), sample_mode="argmax")
        dump["encode.mode"] = mode[:, :, 0]
        got = pipe._encode_vae_image(x, generator=torch.Generator().manual_seed(0))
        mean, std = stats(vae, mode)
        assert torch.equal(got, (mode - mean) / std)
        dump["encode.normalized"] = got[:, :, 0]
        h, w = got.shape[3:]
        dump["encode.tokens"] = P._pack_latents(got[:, :, 0], 1, Z, h, w)

        # Decode: random normalised latents packed as the transformer's output, then the end of
        # QwenImagePipeline.__call__: _unpack_latents, latents / (1 / std) + mean, decode.
        h, w = decode_hw
        g = torch.Generator().manual_seed(seed)
        lat = torch.randn((1, Z, h, w), generator=g)
        tokens = P._pack_latents(lat, 1, Z, h, w)
        dump["decode.tokens"] = tokens
        z = P._unpack_latents(tokens, h * 8, w * 8, 8)
        assert torch.equal(z[:, :, 0], lat)
        mean, std = stats(vae, z)
        z = z / (1.0 / std) + mean
        dump["decode.denormalized"] = z[:, :, 0]
        hooks.store, hooks.prefix = dump, "decode."
        image = vae.decode(z, return_dict=False)[0][:, :, 0]
        hooks.store = None
        dump["decode.image"] = image
        pil = pipe.image_processor.postprocess(image, output_type="pil")
        assert len(pil) == 1 and pil[0].mode == "RGB", pil[0].mode
        dump["post.pixels"] = torch.from_numpy(np.array(pil[0]).astype(np.float32))

        # Tiled decode of a larger latent with small tiles.
        th, tw = tiled_hw
        tlat = torch.randn((1, Z, th, tw), generator=g)
        tz = tlat.unsqueeze(2) * std + mean
        untiled = vae.decode(tz, return_dict=False)[0][:, :, 0]
        vae.enable_tiling(**TILING)
        tiled = vae.decode(tz, return_dict=False)[0][:, :, 0]
        vae.disable_tiling()
        dump["tiled.image"] = tiled
        seam = max_abs(tiled.clamp(-1, 1), untiled)
        print(f"[{case}] tiled vs untiled: max abs {seam:.4g}")

    inputs = {"source": torch.from_numpy(np.array(src).astype(np.float32)), "latents": lat,
              "tiled_latents": tlat}
    for k, v in dump.items():
        print(f"  {k:40s} {str(tuple(v.shape)):22s} std {float(v.std()):.3f} absmax {float(v.abs().max()):.3f}")
    write_st(os.path.join(case_dir, "inputs.safetensors"), inputs)
    write_st(os.path.join(case_dir, "dump.safetensors"), dump)
    meta = {"case": case, "description": description, "seed": seed, "width": width, "height": height,
            "explicit_size": bool(size), "decode_hw": list(decode_hw), "source_size": list(src.size),
            "tiling": TILING, "tiled_latents_hw": list(tiled_hw), "tiled_seam_max_abs_vs_untiled": seam,
            "tiled_outside_unit_fraction": float((tiled.abs() > 1).float().mean()),
            "decode_clamped_fraction": float((image.abs() >= 1).float().mean())}
    write_meta(case_dir, meta, dump, inputs, SCRIPT)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/golden/qwen_image_vae")
    args = ap.parse_args(argv)
    check_pins()
    det = setup_determinism()
    print(f"versions: {versions()}  deterministic_algorithms={det}")
    fresh_dir(args.out)
    g = torch.Generator().manual_seed(9400)
    cfg = dict(CFG, latents_mean=[round(float(v), 4) for v in torch.randn(Z, generator=g)],
               latents_std=[round(float(v), 4) for v in 0.5 + 1.5 * torch.rand(Z, generator=g)])
    torch.manual_seed(9401)
    vae = AutoencoderKLQwenImage(**cfg).eval()
    init_weights(vae, 9402)
    vdir = os.path.join(args.out, "vae")
    vae.save_pretrained(vdir, safe_serialization=True)
    vae = AutoencoderKLQwenImage.from_pretrained(vdir, torch_dtype=torch.float32, low_cpu_mem_usage=False).eval()
    with torch.no_grad():
        for prm in vae.parameters():
            prm.data = prm.data.clone()
    # The pipelines' VAE-side parts, built as QwenImageEditPlusPipeline.__init__ builds them
    # (vae_scale_factor 8, latent_channels z_dim, VaeImageProcessor(16)), and its methods called
    # on this stand-in.
    pipe = types.SimpleNamespace(vae=vae, vae_scale_factor=8, latent_channels=vae.config.z_dim)
    pipe.image_processor = VaeImageProcessor(vae_scale_factor=16)
    pipe._encode_vae_image = lambda image, generator: QwenImageEditPlusPipeline._encode_vae_image(
        pipe, image, generator)
    run_case(args.out, vae, pipe, "rgb_64x48", source_rgb(70, 53, 1), (64, 48), (4, 6), (7, 9), 9500,
             "RGB source 70x53 preprocessed to 64x48; decode of [16,4,6] latents; tiled decode of "
             "[16,7,9] with 32 px tiles every 24 px")
    run_case(args.out, vae, pipe, "rgb_41x77", source_rgb(41, 77, 2), None, (2, 8), (5, 4), 9600,
             "RGB source 41x77 preprocessed without a size (rounded down to 32x64); decode of [16,2,8]; "
             "tiled decode of [16,5,4]; no intermediates", trace=False)
    total = 0
    for root, _, files in os.walk(args.out):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print(f"total {total / 1024:.0f} KiB")
    assert total < 1.5 * 1000 * 1000


if __name__ == "__main__":
    main()
