"""Ground-truth quality of the built-in model and its twin, with diffusers (the reference), on
held-out digits: per task, PSNR and SSIM of each picture against its computed answer (text to
image: the class's prototype); for text to image also whether the digit is the asked one
(1-nearest-neighbour against the training digits) and whether the colours are. Also the
denoising time of each with references (the KV model reuses its references' K/V after step 1;
the twin recomputes them at every step).

    python/train/.venv/bin/python python/train/evaluate.py --per-task 40 \\
        [--models assets/tiny-klein-kv assets/tiny-klein-twin] [--steps 8]

Prints a markdown table (the note and docs/caches.md quote it).
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from PIL import Image

import data

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Wang et al. 2004 with an 11x11 Gaussian window (sigma 1.5), per channel, averaged; the
    valid region only (as scikit-image crops its edges)."""
    x = np.arange(11) - 5
    g = np.exp(-x ** 2 / (2 * 1.5 ** 2))
    g /= g.sum()

    def blur(im):
        im = np.apply_along_axis(lambda r: np.convolve(r, g, mode="valid"), 0, im)
        return np.apply_along_axis(lambda r: np.convolve(r, g, mode="valid"), 1, im)

    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    out = []
    for ch in range(a.shape[2]):
        p, q = a[..., ch].astype(np.float64), b[..., ch].astype(np.float64)
        mp, mq = blur(p), blur(q)
        vp, vq, cpq = blur(p * p) - mp * mp, blur(q * q) - mq * mq, blur(p * q) - mp * mq
        s = ((2 * mp * mq + c1) * (2 * cpq + c2)) / ((mp ** 2 + mq ** 2 + c1) * (vp + vq + c2))
        out.append(s.mean())
    return float(np.mean(out))


class DigitReader:
    """Which digit a picture shows and in which colours: the picture's coverage (its distance
    from the background colour along the foreground's), cut to the 48x48 digit box, scaled to
    28x28 and matched to its nearest training digit."""

    def __init__(self, digits: dict[int, np.ndarray]):
        xs, ys = [], []
        for d, a in digits.items():
            xs.append(a.reshape(len(a), -1))
            ys += [d] * len(a)
        self.x = np.concatenate(xs).astype(np.float32)
        self.y = np.asarray(ys)

    @staticmethod
    def misfit(img: np.ndarray, b: np.ndarray, colour: str) -> float:
        """How badly the picture fits data.paint's model, background b blended with one colour
        (each pixel's coverage the best in [0, 1]). The nearest colour to the ink's mean read
        the ground truth wrong 3 times in 40: anti-aliased edges pull orange towards yellow."""
        f = np.asarray(data.COLOURS[colour], np.float32) - b
        x = img.astype(np.float32) - b
        a = np.clip((x @ f) / (f @ f), 0, 1)
        return float(((x - a[..., None] * f) ** 2).sum())

    def read(self, img: np.ndarray, bg: str):
        b = np.asarray(data.BACKGROUNDS[bg], np.float32)
        diff = np.linalg.norm(img.astype(np.float32) - b, axis=2)
        colour = None
        if diff.max() > 40:  # some ink
            colour = min(data.COLOURS, key=lambda c: self.misfit(img, b, c))
        o = (data.SIZE - data.DIGIT) // 2
        cov = np.clip(diff / max(diff.max(), 1), 0, 1)[o:o + data.DIGIT, o:o + data.DIGIT]
        small = np.asarray(Image.fromarray((cov * 255).astype(np.uint8)).resize((28, 28),
                                                                              Image.BILINEAR))
        v = small.reshape(-1).astype(np.float32) / 255
        d = int(self.y[np.argmin(((self.x - v) ** 2).sum(1))])
        return d, colour


def run(pipe, prompt, refs, size, steps, seed):
    t0 = time.perf_counter()
    img = pipe(prompt=prompt, image=[Image.fromarray(r) for r in refs] or None, height=size[0],
               width=size[1], num_inference_steps=steps,
               max_sequence_length=pipe.tokenizer.model_max_length,
               generator=torch.Generator("cpu").manual_seed(seed), output_type="np").images[0]
    return np.clip(img * 255 + 0.5, 0, 255).astype(np.uint8), time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=[os.path.join(ROOT, "assets", "tiny-klein-kv"),
                                                   os.path.join(ROOT, "assets", "tiny-klein-twin")])
    ap.add_argument("--per-task", type=int, default=40)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache", default=os.path.join(HERE, ".cache"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from diffusers import DiffusionPipeline
    from diffusers.utils import logging
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    all_digits = data.load_digits(a.cache)
    held = data.split(all_digits, held_out=True)
    train_digits = data.split(all_digits, held_out=False)
    protos = data.prototypes(train_digits)
    reader = DigitReader(train_digits)
    tasks = data.TASKS
    rows = {}
    for folder in a.models:
        pipe = DiffusionPipeline.from_pretrained(folder, torch_dtype=torch.float32)
        pipe.set_progress_bar_config(disable=True)
        name = os.path.basename(os.path.normpath(folder))
        rng = np.random.default_rng(7)  # the same samples for every model
        for task in tasks:
            ps, ss, ok_digit, ok_colour, secs = [], [], [], [], []
            for i in range(a.per_task):
                prompt, refs, truth = data.make_sample(rng, held, task, protos)
                img, t = run(pipe, prompt, refs, truth.shape[:2], a.steps, i)
                secs.append(t)
                if task == "text":
                    words = prompt.split()
                    d, colour = reader.read(img, words[-1])
                    ok_digit.append(d == int(words[2]))
                    ok_colour.append(colour == words[1])
                ps.append(psnr(img, truth)), ss.append(ssim(img, truth))
            rows[(name, task)] = (ps, ss, ok_digit, ok_colour, secs)
            print(f"{name} {task}: done", flush=True)
    print("\n| model | task | PSNR vs truth (dB) | SSIM vs truth | right digit | right colour "
          "| s per picture |")
    print("|---|---|---|---|---|---|---|")
    for (name, task), (ps, ss, od, oc, secs) in rows.items():
        p = f"{np.mean(ps):.2f}" if ps else "-"
        s = f"{np.mean(ss):.3f}" if ss else "-"
        d = f"{100 * np.mean(od):.0f}%" if od else "-"
        c = f"{100 * np.mean(oc):.0f}%" if oc else "-"
        print(f"| {name} | {task} | {p} | {s} | {d} | {c} | {np.median(secs):.3f} |")
    # Two floors a model must beat: the unedited reference (right shape, wrong colour), and a
    # picture of the right background alone (right colour almost everywhere, no digit).
    rng = np.random.default_rng(7)  # the same samples as the models'
    print("\n| baseline | task | PSNR vs truth (dB) |\n|---|---|---|")
    for task in tasks:
        unedited, blank = [], []
        for _ in range(a.per_task):
            _, refs, truth = data.make_sample(rng, held, task, protos)
            if len(refs) == 1:
                unedited.append(psnr(refs[0], truth))
            bg = np.empty_like(truth)
            bg[:] = truth[0, 0]  # the corner is background in every task
            blank.append(psnr(bg, truth))
        if unedited:
            print(f"| the reference, unedited | {task} | {np.mean(unedited):.2f} |")
        print(f"| the background alone | {task} | {np.mean(blank):.2f} |")


if __name__ == "__main__":
    main()
