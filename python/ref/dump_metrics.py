"""Golden PSNR and SSIM from scikit-image 0.25.2 on small pictures, for tests/metrics_test.cc.

Writes tests/golden/metrics/: <case>_a.png, <case>_b.png (8-bit RGB or RGBA) and metrics.json
with, per case, skimage.metrics.peak_signal_noise_ratio(a, b, data_range=255) (null when the
pictures are identical: +inf) and structural_similarity(a, b, channel_axis=2, data_range=255,
gaussian_weights=True, sigma=1.5, use_sample_covariance=False), the settings flowkv's
metrics.h reproduces.
    python dump_metrics.py [OUT_DIR]
"""
import json
import math
import os
import sys

import numpy as np
import PIL.Image as Image
import skimage
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_common import check_pins  # noqa: E402

check_pins()
out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "../../tests/golden/metrics")
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(2025)


def noisy(a, scale):
    return np.clip(a.astype(np.int32) + rng.integers(-scale, scale + 1, a.shape), 0, 255).astype(np.uint8)


def digit(w, h, colour):
    """A blocky "7" on white, as the showcase's coloured digits look."""
    im = np.full((h, w, 3), 255, np.uint8)
    im[h // 5:h // 5 + h // 8, w // 4:3 * w // 4] = colour
    for y in range(h // 5, 4 * h // 5):
        x = 3 * w // 4 - (y - h // 5) * (w // 3) // (3 * h // 5)
        im[y, max(0, x - w // 16):x + w // 16] = colour
    return im


cases = {}
a = rng.integers(0, 256, (13, 16, 3), dtype=np.uint8)  # odd sizes, not square
cases["noise_rgb"] = (a, noisy(a, 40))
yy, xx = np.mgrid[0:20, 0:24]
smooth = np.stack([xx * 10, yy * 12, (xx + yy) * 5], axis=2).clip(0, 255).astype(np.uint8)
cases["smooth_rgb"] = (smooth, np.roll(smooth, 1, axis=1))
rgba = rng.integers(0, 256, (11, 12, 4), dtype=np.uint8)  # the smallest size SSIM takes: 11
cases["rgba_min"] = (rgba, noisy(rgba, 10))
d = digit(64, 64, (220, 30, 30))
cases["digit_rot90"] = (d, np.ascontiguousarray(np.rot90(d)))
cases["digit_colour"] = (d, digit(64, 64, (30, 30, 220)))
cases["identical"] = (d, d.copy())
cases["black_white"] = (np.zeros((12, 12, 3), np.uint8), np.full((12, 12, 3), 255, np.uint8))

meta = {"scikit-image": skimage.__version__, "numpy": np.__version__, "cases": {}}
for name, (a, b) in cases.items():
    mode = "RGBA" if a.shape[2] == 4 else "RGB"
    Image.fromarray(a, mode).save(os.path.join(out, f"{name}_a.png"))
    Image.fromarray(b, mode).save(os.path.join(out, f"{name}_b.png"))
    with np.errstate(divide="ignore"):
        p = float(peak_signal_noise_ratio(a, b, data_range=255))
    s = float(structural_similarity(a, b, channel_axis=2, data_range=255, gaussian_weights=True,
                                    sigma=1.5, use_sample_covariance=False))
    meta["cases"][name] = {"size": [a.shape[1], a.shape[0]], "channels": a.shape[2],
                           "psnr": None if math.isinf(p) else p, "ssim": s}
    print(f"{name:14s} psnr {p:.6f} ssim {s:.9f}")
with open(os.path.join(out, "metrics.json"), "w") as f:
    json.dump(meta, f, indent=1, sort_keys=True)
    f.write("\n")
