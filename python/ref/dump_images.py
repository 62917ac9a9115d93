"""Golden dumps of image decoding, PIL's Lanczos resize and the FLUX.2 Klein reference
preprocessing / output postprocessing (Pillow 13.0.0, diffusers 0.42.1), for tests/image_test.cc.

Writes tests/golden/images/:
  in/       small test files: PNG of every colour type and depth, palettes with tRNS, 16-bit,
            EXIF / XMP orientation; JPEG baseline, progressive, 4:4:4, grey, CMYK, EXIF rotated
  expect/   what diffusers' load_image gives for each (exif_transpose + convert("RGB")), and
            PIL's LANCZOS resizes and Klein's preprocessed references, as PNG (lossless); of a
            large reference every 8th pixel of every 8th row, and a hash of all pixels
  tensor.f32   the Klein preprocessing's float for each 8-bit value 0..255 (256 floats)
  post_in.f32 / post_out.u8   VaeImageProcessor.postprocess input and its uint8 output
  manifest.json
    python dump_images.py [OUT_DIR]
"""
import io
import json
import os
import struct
import sys
import zlib

import numpy as np
import PIL
import PIL.Image as Image
import PIL.ImageOps
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_common import check_pins  # noqa: E402

import diffusers
from diffusers.pipelines.flux2.image_processor import Flux2ImageProcessor
from diffusers.utils import load_image

check_pins()
out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "../../tests/golden/images")
os.makedirs(os.path.join(out, "in"), exist_ok=True)
os.makedirs(os.path.join(out, "expect"), exist_ok=True)
rng = np.random.default_rng(1234)


def pattern(w, h, noise=12.0):
    """Smooth colour gradients and waves with a little noise (compresses, and exercises the
    filters with edges of every slope)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 127 + 120 * np.sin(x / (w / 5.3) + y / (h / 2.1))
    g = 255 * x / max(w - 1, 1)
    b = 127 + 120 * np.cos((x - y) / 7.0) * np.sin(y / (h / 3.7))
    img = np.stack([r, g, b], -1) + rng.normal(0, noise, (h, w, 3))
    img[h // 3: h // 3 + 2, :, :] = [255, 0, 40]   # hard edges
    img[:, w // 2, :] = 0
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def raw_png(w, h, color_type, depth, rows, extra=b"", trailing=b""):
    """A PNG written by hand (PIL cannot write 16-bit RGB / LA / RGBA or 2-bit grey)."""
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    data = b"".join(b"\0" + r for r in rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, 0))
            + extra + chunk(b"IDAT", zlib.compress(data)) + trailing + chunk(b"IEND", b""))


def adam7_png(arr, color_type, depth):
    """An interlaced (Adam7) PNG of arr [H, W, C] (uint8, or uint16 for depth 16)."""
    h, w = arr.shape[:2]
    data = b""
    for x0, y0, dx, dy in [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4),
                           (1, 0, 2, 2), (0, 1, 1, 2)]:
        sub = arr[y0::dy, x0::dx]
        if sub.shape[0] == 0 or sub.shape[1] == 0:
            continue
        for row in sub:
            data += b"\0" + (row.astype(">u2") if depth == 16 else row).tobytes()
    return (b"\x89PNG\r\n\x1a\n"
            + png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, 1))
            + png_chunk(b"IDAT", zlib.compress(data)) + png_chunk(b"IEND", b""))


def png_chunk(t, d):
    return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)


def exif_orientation_block(orientation, big_endian=False):
    e = Image.Exif()
    e[0x0112] = orientation
    data = e.tobytes()  # "Exif\0\0" + TIFF
    return data


manifest = {"pillow": PIL.__version__, "diffusers": diffusers.__version__, "decode": [],
            "resize": [], "klein": []}


def save_expect(name, img):
    img.save(os.path.join(out, "expect", name + ".png"))


def add_decode(name, data):
    path = os.path.join(out, "in", name)
    with open(path, "wb") as f:
        f.write(data)
    got = load_image(path)  # diffusers: open, exif_transpose, convert("RGB")
    opened = Image.open(path)
    save_expect(name, got)
    manifest["decode"].append({"file": name, "mode": opened.mode, "width": got.width,
                               "height": got.height})


base = pattern(37, 23)
rgb = Image.fromarray(base, "RGB")


def pil_bytes(img, fmt, **kw):
    b = io.BytesIO()
    img.save(b, fmt, **kw)
    return b.getvalue()


# ---- PNG ----
add_decode("rgb.png", pil_bytes(rgb, "PNG"))
add_decode("grey.png", pil_bytes(rgb.convert("L"), "PNG"))
alpha = Image.fromarray(pattern(37, 23)[:, :, 0], "L")
la = Image.merge("LA", [rgb.convert("L"), alpha])
add_decode("ga.png", pil_bytes(la, "PNG"))
rgba = rgb.copy()
rgba.putalpha(alpha)
add_decode("rgba.png", pil_bytes(rgba, "PNG"))
pal = rgb.quantize(colors=200)
add_decode("palette.png", pil_bytes(pal, "PNG"))
pal_t = rgb.quantize(colors=60)
add_decode("palette_trns.png", pil_bytes(pal_t, "PNG", transparency=bytes(range(0, 240, 4))))
pal4 = rgb.quantize(colors=16)
add_decode("palette4.png", pil_bytes(pal4, "PNG", bits=4))
add_decode("grey1.png", pil_bytes(rgb.convert("1"), "PNG"))
grey_t = rgb.convert("L")
add_decode("grey_trns.png", pil_bytes(grey_t, "PNG", transparency=128))
# 16-bit: grey (PIL "I;16": clipped at 255), RGB, grey + alpha, RGBA (high bytes).
w16, h16 = 19, 11
v16 = rng.integers(0, 65536, (h16, w16, 4), dtype=np.uint16)
v16[0, :8, 0] = [0, 1, 200, 255, 256, 1000, 65535, 300]
for name, ct, nch in [("grey16.png", 0, 1), ("rgb16.png", 2, 3), ("ga16.png", 4, 2),
                      ("rgba16.png", 6, 4)]:
    rows = [v16[y, :, :nch].astype(">u2").tobytes() for y in range(h16)]
    add_decode(name, raw_png(w16, h16, ct, 16, rows))
# 2-bit grey (scaled x85) and 4-bit grey (x17).
g2 = rng.integers(0, 4, (7, 16), dtype=np.uint8)
add_decode("grey2.png", raw_png(16, 7, 0, 2, [bytes((r[i] << 6) | (r[i + 1] << 4) | (r[i + 2] << 2) | r[i + 3]
                                                    for i in range(0, 16, 4)) for r in g2]))
g4 = rng.integers(0, 16, (5, 10), dtype=np.uint8)
add_decode("grey4.png", raw_png(10, 5, 0, 4, [bytes((r[i] << 4) | r[i + 1] for i in range(0, 10, 2))
                                              for r in g4]))
# Orientation: eXIf before and after IDAT; XMP in iTXt.
rows8 = [base[y].tobytes() for y in range(base.shape[0])]
add_decode("exif3.png", raw_png(37, 23, 2, 8, rows8,
                                extra=png_chunk(b"eXIf", exif_orientation_block(3)[6:])))
add_decode("exif6_after.png", raw_png(37, 23, 2, 8, rows8,
                                      trailing=png_chunk(b"eXIf", exif_orientation_block(6)[6:])))
xmp = b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:Description tiff:Orientation="8"/></x:xmpmeta>'
add_decode("xmp8.png", raw_png(37, 23, 2, 8, rows8,
                               extra=png_chunk(b"iTXt", b"XML:com.adobe.xmp\0\0\0\0\0" + xmp)))

add_decode("rgb_adam7.png", adam7_png(base, 2, 8))
add_decode("rgba16_adam7.png", adam7_png(v16, 6, 16))

# ---- JPEG ----
add_decode("baseline.jpg", pil_bytes(rgb, "JPEG", quality=90))
add_decode("q50_444.jpg", pil_bytes(rgb, "JPEG", quality=50, subsampling=0))
add_decode("q75_422.jpg", pil_bytes(rgb, "JPEG", quality=75, subsampling=1))
add_decode("progressive.jpg", pil_bytes(rgb, "JPEG", quality=85, progressive=True))
add_decode("grey.jpg", pil_bytes(rgb.convert("L"), "JPEG", quality=90))
add_decode("cmyk.jpg", pil_bytes(rgb.convert("CMYK"), "JPEG", quality=90))
for o in [2, 5, 6, 7, 8]:
    add_decode(f"exif{o}.jpg", pil_bytes(rgb, "JPEG", quality=90, exif=exif_orientation_block(o)))
add_decode("xmp6.jpg", pil_bytes(rgb, "JPEG", quality=90, xmp=xmp.replace(b'"8"', b'"6"')))

# ---- Lanczos resize (PIL's Image.resize(size, LANCZOS) on RGB) ----
src_small = Image.fromarray(pattern(64, 48), "RGB")
src_small.save(os.path.join(out, "in", "resize_src_64x48.png"))
src_big = Image.fromarray(pattern(300, 200, noise=20.0), "RGB")
src_big.save(os.path.join(out, "in", "resize_src_300x200.png"))
for src_name, src, sizes in [
        ("resize_src_64x48.png", src_small,
         [(32, 24), (17, 29), (100, 75), (64, 13), (5, 5), (128, 96), (1, 1), (64, 100), (200, 48),
          (31, 48), (63, 47), (65, 49)]),
        ("resize_src_300x200.png", src_big,
         [(97, 61), (150, 100), (299, 199), (301, 203), (37, 180), (16, 16)])]:
    for w, h in sizes:
        name = f"{src_name[:-4]}_to_{w}x{h}"
        save_expect(name, src.resize((w, h), Image.LANCZOS))
        manifest["resize"].append({"src": src_name, "width": w, "height": h, "expect": name})

# ---- FLUX.2 Klein reference preprocessing, as Flux2KleinPipeline.__call__ step 4 ----
proc = Flux2ImageProcessor(vae_scale_factor=16)


def klein_reference(img):
    proc.check_image_input(img)
    image_width, image_height = img.size
    if image_width * image_height > 1024 * 1024:
        img = proc._resize_to_target_area(img, 1024 * 1024)
        image_width, image_height = img.size
    multiple_of = 16
    image_width = (image_width // multiple_of) * multiple_of
    image_height = (image_height // multiple_of) * multiple_of
    return proc.preprocess(img, height=image_height, width=image_width, resize_mode="crop")


for name, img in [("klein_150x90.png", Image.fromarray(pattern(150, 90), "RGB")),
                  # Above 1024^2 pixels (resized first); smooth, so the PNGs stay small.
                  ("klein_1100x1000.jpg", Image.fromarray(pattern(1100, 1000, noise=0.0), "RGB")),
                  ("klein_2900x363.jpg", Image.fromarray(pattern(2900, 363, noise=0.0), "RGB"))]:
    path = os.path.join(out, "in", name)
    img.save(path, **({"quality": 80} if name.endswith(".jpg") else {}))
    t = klein_reference(load_image(path))  # [1, 3, H, W] in [-1, 1]
    u8 = np.rint((t[0].permute(1, 2, 0).numpy() + 1) / 2 * 255).astype(np.uint8)
    back = torch.from_numpy(u8.astype(np.float32) / 255.0).permute(2, 0, 1)[None] * 2.0 - 1.0
    assert torch.equal(back, t), name  # the tensor is a function of the 8-bit pixels
    # Large outputs: every 8th pixel of every 8th row, and a hash (FNV-1a 64) of all of them.
    step = 8 if u8.shape[0] * u8.shape[1] > 100000 else 1
    save_expect(name[:-4] + "_ref", Image.fromarray(np.ascontiguousarray(u8[::step, ::step]), "RGB"))
    h = 0xcbf29ce484222325
    for byte in u8.tobytes():
        h = ((h ^ byte) * 0x100000001b3) & 0xffffffffffffffff
    manifest["klein"].append({"file": name, "width": t.shape[3], "height": t.shape[2],
                              "expect": name[:-4] + "_ref", "step": step, "fnv1a64": f"{h:016x}"})
for bad in [(63, 200), (600, 70)]:  # too small; aspect 8.57 > 8
    try:
        proc.check_image_input(Image.new("RGB", bad))
        raise SystemExit(f"{bad} accepted")
    except ValueError:
        pass

# The preprocessing's float for each 8-bit value (the whole map from pixels to the tensor).
ramp = np.tile(np.arange(256, dtype=np.uint8).reshape(16, 16), (4, 4))
ramp_img = Image.fromarray(np.stack([ramp] * 3, -1), "RGB")
t = proc.preprocess(ramp_img, height=64, width=64, resize_mode="crop")
table = np.zeros(256, np.float32)
table[ramp[:16, :16].ravel()] = t[0, 0, :16, :16].numpy().ravel()
table.astype("<f4").tofile(os.path.join(out, "tensor.f32"))

# Postprocess: decoded floats (normal, exact boundaries, ties of x * 255) to uint8.
vals = np.concatenate([rng.normal(0, 0.7, 3 * 16 * 16 - 64).astype(np.float32),
                       np.array([-1, 1, 0, -2, 2, 1e-8, -1e-8, np.inf, -np.inf], np.float32),
                       ((np.arange(55) + 0.5) / 255 * 2 - 1).astype(np.float32)])
post_in = torch.from_numpy(vals.reshape(1, 3, 16, 16))
post_out = np.array(proc.postprocess(post_in, output_type="pil")[0])
post_in.numpy().astype("<f4").tofile(os.path.join(out, "post_in.f32"))
post_out.astype(np.uint8).tofile(os.path.join(out, "post_out.u8"))

# ---- Resizes Pillow 13 runs vertical pass first (the height shrinks by more than twice as many
# pixels as the width), and RGBA resizes (premultiplied: RGBA -> RGBa -> resize -> RGBA) ----
for src_name, src, sizes in [
        ("resize_src_64x48.png", src_small, [(60, 20), (70, 9)]),
        ("resize_src_300x200.png", src_big, [(290, 90), (100, 30)])]:
    for w, h in sizes:
        name = f"{src_name[:-4]}_to_{w}x{h}"
        save_expect(name, src.resize((w, h), Image.LANCZOS))
        manifest["resize"].append({"src": src_name, "width": w, "height": h, "expect": name})
alpha = np.clip(np.round(255 * np.linspace(0, 1, 64)[None, :] * np.ones((48, 1))
                         + rng.normal(0, 30, (48, 64))), 0, 255).astype(np.uint8)
alpha[10:20, 5:15] = 0
alpha[30:40, 40:50] = 255
src_rgba = Image.fromarray(np.concatenate([pattern(64, 48), alpha[..., None]], -1), "RGBA")
src_rgba.save(os.path.join(out, "in", "resize_src_64x48_rgba.png"))
for w, h in [(32, 24), (17, 29), (100, 75), (60, 20)]:
    name = f"resize_src_64x48_rgba_to_{w}x{h}"
    save_expect(name, src_rgba.resize((w, h), Image.LANCZOS))
    manifest["resize"].append({"src": "resize_src_64x48_rgba.png", "width": w, "height": h,
                               "expect": name, "rgba": True})

json.dump(manifest, open(os.path.join(out, "manifest.json"), "w"), indent=1)
print(len(manifest["decode"]), "decode,", len(manifest["resize"]), "resize,", len(manifest["klein"]),
      "klein cases")
