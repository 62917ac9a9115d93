"""flowkv against PyTorch (diffusers) on one Klein-9B-shaped block pair, side by side.

The model: FLUX.2 Klein 9B's released config (flowkv writes it) cut to 1 double + 1 single
block (width 4096 = 32 heads x 128, text width 12288), random weights (seed 0), saved as an f32
diffusers folder that both sides load. Input: 1,024 image tokens (a 32x32 grid) + 256 text
tokens, batch 1. Both sides run on the same number of threads. Rounds alternate: one timed
PyTorch forward (in this process, model loaded once, after a warm-up), then one flowkv process
(`flowkv forward --runs N`, which loads, warms up and prints the median of N forwards) per
flowkv variant (f32, int8). Medians over the rounds are printed, with the ratios, and int8's
NMSE against flowkv f32 (`forward --against`).

    python/ref/.venv/bin/python python/bench_torch_block.py [--flowkv build/tools/flowkv]
        [--threads 2] [--rounds 5] [--dir /tmp/flowkv_torch_block]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import time

import torch
from diffusers import Flux2Transformer2DModel


def run(cmd: list[str]) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def make_model_folder(flowkv: str, folder: str) -> dict:
    zeros = folder + "_config"
    if not os.path.exists(os.path.join(zeros, "config.json")):
        run([flowkv, "export-builtin", "klein-9b-kv", zeros, "--zeros"])
    cfg = json.load(open(os.path.join(zeros, "config.json")))
    cfg.update(num_layers=1, num_single_layers=1)
    if not os.path.exists(os.path.join(folder, "config.json")):
        torch.manual_seed(0)
        keys = {k: v for k, v in cfg.items() if not k.startswith("_")}
        model = Flux2Transformer2DModel(**keys)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.02)
        model.save_pretrained(folder, safe_serialization=True)
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flowkv", default="build/tools/flowkv")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=2, help="timed forwards per flowkv process (>= 2)")
    ap.add_argument("--dir", default="/tmp/flowkv_torch_block")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = make_model_folder(a.flowkv, a.dir)
    model = Flux2Transformer2DModel.from_pretrained(a.dir, torch_dtype=torch.float32).eval()
    h = w = 32
    text = 256
    g = torch.Generator().manual_seed(1)
    inp = dict(
        hidden_states=torch.randn(1, h * w, cfg["in_channels"], generator=g),
        encoder_hidden_states=torch.randn(1, text, cfg["joint_attention_dim"], generator=g),
        timestep=torch.tensor([0.75]),
        img_ids=torch.cartesian_prod(torch.tensor([0]), torch.arange(h), torch.arange(w),
                                     torch.tensor([0])).float(),
        txt_ids=torch.cartesian_prod(torch.tensor([0]), torch.tensor([0]), torch.tensor([0]),
                                     torch.arange(text)).float(),
        guidance=None,
        return_dict=False,
    )

    def torch_forward() -> float:
        t0 = time.perf_counter()
        with torch.no_grad():
            model(**inp)
        return time.perf_counter() - t0

    def flowkv_forward(dtype: str) -> float:
        out = run([a.flowkv, "--threads", str(a.threads), "forward", "--model", a.dir, "--dtype",
                   dtype, "--grid", f"{h}x{w}", "--text-tokens", str(text), "--runs",
                   str(a.runs)])
        return float(re.search(r"median ([0-9.]+) s", out).group(1))

    torch_forward()  # warm-up
    times: dict[str, list[float]] = {"torch f32": [], "flowkv f32": [], "flowkv int8": []}
    for r in range(a.rounds):
        times["torch f32"].append(torch_forward())
        times["flowkv f32"].append(flowkv_forward("f32"))
        times["flowkv int8"].append(flowkv_forward("int8"))
        print(f"round {r + 1}/{a.rounds}: " +
              ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items()), flush=True)
    err = run([a.flowkv, "--threads", str(a.threads), "forward", "--model", a.dir, "--dtype",
               "int8", "--grid", f"{h}x{w}", "--text-tokens", str(text), "--against", a.dir])
    nmse = re.search(r"NMSE ([0-9.e+-]+), PSNR ([0-9.]+) dB", err)
    base = statistics.median(times["torch f32"])
    print(f"\nKlein-9B-shaped block (width {cfg['num_attention_heads'] * cfg['attention_head_dim']},"
          f" 1 double + 1 single), {h * w} image + {text} text tokens, {a.threads} threads, "
          f"torch {torch.__version__}")
    print(f"{'':14s} {'median s':>9s} {'vs torch':>9s}")
    for k, v in times.items():
        m = statistics.median(v)
        print(f"{k:14s} {m:9.3f} {base / m:8.2f}x")
    print(f"flowkv int8 against flowkv f32: NMSE {nmse.group(1)}, PSNR {nmse.group(2)} dB")


if __name__ == "__main__":
    main()
