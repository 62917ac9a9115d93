#!/usr/bin/env python3
"""Golden reference dumper for flowkv's Qwen-Image-2.1 VAE (diffusers ``AutoencoderKLQwenImage21``).

Builds one tiny random-weight ``AutoencoderKLQwenImage21`` (5 levels: /16 down and up, residual
AvgDown3D / DupUp3D shortcuts, mid attention, channel-changing resnets with conv shortcuts,
non-trivial latents_mean / latents_std) and writes it with ``save_pretrained`` to
``<out>/vae/``. Then, per case, under ``<out>/<case>/``:

* ``inputs.safetensors``  ``source`` [h, w, 4] the RGBA source image (uint8 values as f32) that
                          the pipeline hands to ``VaeImageProcessor.preprocess``; ``latents``
                          normalised latents [1, 64, h, w] to decode; ``tiled_latents`` likewise
                          for the tiled decode
* ``dump.safetensors``    named F32 tensors (PyTorch order)
* ``meta.json``           description, versions, sizes, tiling, dumped names

``load_rgba.json``: for each file of tests/golden/images/in, what ``Image.open``,
``ImageOps.exif_transpose`` and ``convert("RGBA")`` give (size, FNV-1a 64 of the RGBA bytes).

Cases: an RGBA source with varying alpha (alpha 0 and 255 included) preprocessed to 64x48 (WxH),
and an RGB source converted to RGBA (as QwenImage21Pipeline.__call__ does) preprocessed to 32x80.

Dumped names:
``pre.resized`` the resized RGBA uint8 pixels [H, W, 4] (PIL resize of an RGBA image:
premultiplied, Lanczos, un-premultiplied); ``pre.image`` preprocess's output [1, 4, H, W];
``encode.<module>`` encoder intermediates; ``encode.moments`` (vae.encode's distribution
parameters [1, 128, 1, h, w] with the frame axis dropped); ``encode.mode``; ``encode.normalized``
(``_encode_vae_image``); ``encode.tokens`` (``_pack_latents``); ``decode.denormalized``;
``decode.<module>`` decoder intermediates; ``decode.decoder`` (the decoder before the clamp);
``decode.image`` (``vae.decode(...)[0][:, :, 0]``); ``post.pixels`` (postprocess to PIL: RGBA
uint8 [H, W, 4]); ``tiled.image`` (tiled decode with small tiles; diffusers' seam error against
the untiled decode is in meta.json). The second case dumps the endpoints only, and neither keeps
the two full-resolution decoder levels (size).

Usage (from the repository root)::

    /work/main/python/ref/.venv/bin/python python/ref/dump_qwen21_vae.py --out tests/golden/qwen21_vae
"""

from __future__ import annotations

import argparse
import json
import os
import types

import numpy as np
import torch
from PIL import Image, ImageOps

from diffusers import AutoencoderKLQwenImage21
from diffusers.image_processor import VaeImageProcessor
from diffusers.pipelines.qwenimage21.pipeline_qwenimage21 import QwenImage21Pipeline, retrieve_latents

from ref_common import (check_pins, clean_config, fresh_dir, max_abs, setup_determinism, versions,
                        write_meta, write_st)

SCRIPT = "python/ref/dump_qwen21_vae.py"
P = QwenImage21Pipeline

CFG = dict(base_dim=2, decoder_base_dim=3, z_dim=64, dim_mult=[1, 2, 4, 8, 8], num_res_blocks=1,
           attn_scales=[], temperal_downsample=[False, True, True, True], dropout=0.0,
           is_residual=True, in_channels=4, out_channels=4, patch_size=None,
           scale_factor_temporal=8, scale_factor_spatial=16)

TILING = dict(tile_sample_min_height=48, tile_sample_min_width=48,
              tile_sample_stride_height=32, tile_sample_stride_width=32)


def init_weights(model, seed):
    """Convolutions ~ N(0, 1/fan_in), biases 0.05 N(0,1), RMS-norm gammas 1 + 0.1 N(0,1); the
    decoder's conv_out scaled by 0.3 so the image is mostly inside the [-1, 1] clamp."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".gamma"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
        model.decoder.conv_out.weight.mul_(0.3)


def source_rgba(w, h, seed):
    """An RGBA image: smooth colour gradients plus noise, alpha a ramp with a fully transparent
    and a fully opaque band."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    r = (x * 255 // max(w - 1, 1))
    gch = (y * 255 // max(h - 1, 1))
    b = ((x + y) * 37) % 256
    rgb = np.stack([r, gch, b], -1) + rng.integers(-40, 41, (h, w, 3))
    a = (x * 300 // max(w - 1, 1)) - 20
    a[: h // 5] = 0
    a[-(h // 5):] = 255
    img = np.concatenate([rgb, a[..., None]], -1).clip(0, 255).astype(np.uint8)
    return Image.fromarray(img, "RGBA")


def source_rgb(w, h, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([(x * 13) % 256, (y * 29) % 256, ((x * y) // 3) % 256], -1) + rng.integers(-30, 31, (h, w, 3))
    return Image.fromarray(rgb.clip(0, 255).astype(np.uint8), "RGB")


def check_pil_alpha_formulas():
    """The premultiply / un-premultiply rules flowkv implements, against PIL on every (c, a)."""
    c = np.arange(256)[None, :].repeat(256, 0)
    a = np.arange(256)[:, None].repeat(256, 1)
    arr = np.stack([c, 255 - c, (c * 7) % 256, a], -1).astype(np.uint8)
    pm = np.array(Image.fromarray(arr, "RGBA").convert("RGBa")).astype(np.int64)
    t = arr[..., :3].astype(np.int64) * a[..., None] + 128
    assert (pm[..., :3] == ((t >> 8) + t) >> 8).all()
    un = np.array(Image.fromarray(arr, "RGBa").convert("RGBA")).astype(np.int64)
    x = arr[..., :3].astype(np.int64)
    A = a[..., None]
    want = np.where((A == 0) | (A == 255), x, np.clip(255 * x // np.maximum(A, 1), 0, 255))
    assert (un[..., :3] == want).all()


def fnv1a64(data: bytes) -> str:
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def dump_load_rgba(out_root):
    """What the pipeline makes of each test image file of tests/golden/images/in (PIL's open,
    exif_transpose, convert("RGBA")), as size and an FNV-1a 64 hash of the RGBA bytes."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/golden/images/in")
    got = {}
    for name in sorted(os.listdir(src)):
        im = Image.open(os.path.join(src, name))
        mode = im.mode
        im = ImageOps.exif_transpose(im).convert("RGBA")
        data = im.tobytes()
        got[name] = {"mode": mode, "width": im.width, "height": im.height, "fnv1a64": fnv1a64(data)}
    with open(os.path.join(out_root, "load_rgba.json"), "w") as f:
        json.dump(got, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"load_rgba.json: {len(got)} files")


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


def run_case(out_root, vae, pipe, case, src, width, height, decode_hw, tiled_hw, seed, description,
             trace=True):
    case_dir = os.path.join(out_root, case)
    fresh_dir(case_dir)
    enc_names, dec_names = modules_traced(vae) if trace else ([], [])
    hooks = Hooks(vae, enc_names + dec_names)
    dump = {}
    # The pipeline's step 1: convert to RGBA, preprocess at the chosen size, add the frame axis.
    img = src if src.mode == "RGBA" else src.convert("RGBA")
    resized = pipe.image_processor.resize(img, width=width, height=height)
    dump["pre.resized"] = torch.from_numpy(np.array(resized).astype(np.float32))
    pre = pipe.image_processor.preprocess(img, width=width, height=height)
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
        dump["encode.tokens"] = P._pack_latents(got, 1, 64, h, w)

        # Decode: random normalised latents, as the end of __call__ (whose _unpack_latents needs
        # an even latent size: the pipeline's images are multiples of 32 pixels).
        h, w = decode_hw
        g = torch.Generator().manual_seed(seed)
        lat = torch.randn((1, 64, h, w), generator=g)
        tokens = P._pack_latents(lat.unsqueeze(2), 1, 64, h, w)
        z = P._unpack_latents(tokens, h * 16, w * 16, 16)
        assert torch.equal(z[:, :, 0], lat)
        mean, std = stats(vae, z)
        z = z * std + mean
        dump["decode.denormalized"] = z[:, :, 0]
        hooks.store, hooks.prefix = dump, "decode."
        image = vae.decode(z, return_dict=False)[0][:, :, 0]
        hooks.store = None
        dump["decode.image"] = image
        pil = pipe.image_processor.postprocess(image, output_type="pil")
        assert len(pil) == 1 and pil[0].mode == "RGBA", pil[0].mode
        dump["post.pixels"] = torch.from_numpy(np.array(pil[0]).astype(np.float32))

        # Tiled decode of a larger latent with small tiles.
        th, tw = tiled_hw
        tlat = torch.randn((1, 64, th, tw), generator=g)
        tz = tlat.unsqueeze(2)
        tz = tz * std + mean
        untiled = vae.decode(tz, return_dict=False)[0][:, :, 0]
        vae.enable_tiling(**TILING)
        tiled = vae.decode(tz, return_dict=False)[0][:, :, 0]
        vae.disable_tiling()
        dump["tiled.image"] = tiled
        seam = max_abs(tiled, untiled)
        print(f"[{case}] tiled vs untiled: max abs {seam:.4g}")

    inputs = {"source": torch.from_numpy(np.array(img).astype(np.float32)), "latents": lat,
              "tiled_latents": tlat}
    # Left out to keep the area small: the two full-resolution decoder levels (the next names
    # pin them down) and the untiled decode of the tiled case (flowkv computes its own).
    for k in ["decode.decoder.up_blocks.3", "decode.decoder.up_blocks.4"]:
        dump.pop(k, None)
    for k, v in dump.items():
        print(f"  {k:40s} {str(tuple(v.shape)):22s} std {float(v.std()):.3f} absmax {float(v.abs().max()):.3f}")
    write_st(os.path.join(case_dir, "inputs.safetensors"), inputs)
    write_st(os.path.join(case_dir, "dump.safetensors"), dump)
    meta = {"case": case, "description": description, "seed": seed, "width": width, "height": height,
            "decode_hw": list(decode_hw), "source_mode": src.mode, "source_size": list(src.size), "tiling": TILING,
            "tiled_latents_hw": list(tiled_hw), "tiled_seam_max_abs_vs_untiled": seam,
            "decode_clamped_fraction": float((image.abs() >= 1).float().mean())}
    write_meta(case_dir, meta, dump, inputs, SCRIPT)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/golden/qwen21_vae")
    args = ap.parse_args(argv)
    check_pins()
    det = setup_determinism()
    print(f"versions: {versions()}  deterministic_algorithms={det}")
    check_pil_alpha_formulas()
    fresh_dir(args.out)
    dump_load_rgba(args.out)
    g = torch.Generator().manual_seed(9100)
    cfg = dict(CFG, latents_mean=[round(float(v), 4) for v in torch.randn(64, generator=g)],
               latents_std=[round(float(v), 4) for v in 0.5 + 1.5 * torch.rand(64, generator=g)])
    torch.manual_seed(9101)
    vae = AutoencoderKLQwenImage21(**cfg).eval()
    init_weights(vae, 9102)
    vdir = os.path.join(args.out, "vae")
    vae.save_pretrained(vdir, safe_serialization=True)
    vae = AutoencoderKLQwenImage21.from_pretrained(vdir, torch_dtype=torch.float32, low_cpu_mem_usage=False).eval()
    with torch.no_grad():
        for prm in vae.parameters():
            prm.data = prm.data.clone()
    # The pipeline's __init__ needs a processor; its VAE-side parts are built here the same way
    # (QwenImage21Pipeline.__init__: vae_scale_factor 16, VaeImageProcessor(16, z_dim)) and its
    # methods called on this stand-in.
    pipe = types.SimpleNamespace(vae=vae, vae_scale_factor=16, latent_channels=vae.config.z_dim)
    pipe.image_processor = VaeImageProcessor(vae_scale_factor=16, vae_latent_channels=vae.config.z_dim)
    pipe._encode_vae_image = lambda image, generator: P._encode_vae_image(pipe, image, generator)
    run_case(args.out, vae, pipe, "rgba_64x48", source_rgba(70, 53, 1), 64, 48, (4, 2), (5, 6), 9200,
             "RGBA source 70x53 with alpha 0..255, preprocessed to 64x48; tiled decode of [64,5,6] "
             "with 48 px tiles every 32 px; decode of [64,4,2] latents")
    run_case(args.out, vae, pipe, "rgb_32x80", source_rgb(41, 77, 2), 32, 80, (2, 6), (4, 7), 9300,
             "RGB source 41x77 converted to RGBA, preprocessed to 32x80; tiled decode of [64,4,7]; decode of [64,2,6]; no intermediates", trace=False)
    total = 0
    for root, _, files in os.walk(args.out):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print(f"total {total / 1024:.0f} KiB")
    assert total < 2 * 1000 * 1000


if __name__ == "__main__":
    main()
