#!/usr/bin/env python3
"""Serving: resident vs staged (docs/bench.md). Starts `flowkv serve` once per memory policy on
127.0.0.1 (any free port), sends N sequential edit requests (one uploaded reference picture, a
new prompt and seed each, STEPS steps), and prints a markdown table: first-request latency,
median latency of the later requests, component loads and load seconds per request (from
/metrics), and the server's peak RSS (/metrics' flowkv_peak_rss_bytes).

    scripts/bench_serve.py [--flowkv build/tools/flowkv] [--model assets/tiny-klein-kv]
        [--image assets/tiny-klein-kv/cases/refs/recolour-1-1.png] [--requests 20] [--steps 8]
        [--rounds 3]

Standard library only (no venv needed). Every request has a 300 s client timeout.
"""

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COLOURS = ["orange", "yellow", "red", "blue", "green"]


def get(url, timeout=30):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def edit(url, image, prompt, seed, steps):
    """One multipart edit; returns its wall seconds."""
    boundary = uuid.uuid4().hex
    parts = []
    for name, value in (("prompt", prompt), ("seed", str(seed)), ("steps", str(steps))):
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
                     f"{value}\r\n".encode())
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="image[]"; '
                 f'filename="{image.name}"\r\nContent-Type: image/png\r\n\r\n'.encode() +
                 image.read_bytes() + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    req = urllib.request.Request(url + "/v1/images/edits", data=b"".join(parts), method="POST",
                                 headers={"Content-Type":
                                          f"multipart/form-data; boundary={boundary}"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as r:
        body = json.loads(r.read())
    took = time.perf_counter() - t0
    assert body["data"][0]["b64_json"], body
    return took


def warm_page_cache(folder):
    """Reads every file of the pipeline, so that neither policy's loads pay for a cold disk."""
    for f in Path(folder).rglob("*"):
        if f.is_file():
            f.read_bytes()


def run(args, memory):
    warm_page_cache(args.model)
    cmd = [args.flowkv, "serve", "--model", args.model, "--port", "0", "--memory", memory]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        m = re.match(r"listening on (http://[\d.]+:\d+)", proc.stdout.readline())
        assert m, "flowkv serve did not start"
        url = m.group(1)
        seconds, loads, load_s = [], [], []
        for i in range(args.requests):
            seconds.append(edit(url, Path(args.image), f"make it {COLOURS[i % len(COLOURS)]}, take {i}", i, args.steps))
            text = get(url + "/metrics").decode()
            loads.append(metric(text, "flowkv_component_loads_total"))
            load_s.append(metric(text, "flowkv_component_load_seconds_total"))
        rss = metric(get(url + "/metrics").decode(), "flowkv_peak_rss_bytes")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    n = args.requests
    later_loads = (loads[-1] - loads[0]) / (n - 1)
    later_load_s = (load_s[-1] - load_s[0]) / (n - 1)
    return {
        "memory": memory,
        "first": seconds[0],
        "later_median": statistics.median(seconds[1:]),
        "first_loads": loads[0],
        "first_load_s": load_s[0],
        "later_loads": later_loads,
        "later_load_s": later_load_s,
        "load_s_per_request": load_s[-1] / n,
        "rss_mib": rss / 2**20,
        "total": sum(seconds),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--flowkv", default=str(REPO / "build" / "tools" / "flowkv"))
    p.add_argument("--model", default=str(REPO / "assets" / "tiny-klein-kv"))
    p.add_argument("--image",
                   default=str(REPO / "assets" / "tiny-klein-kv" / "cases" / "refs" /
                               "recolour-1-1.png"))
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    assert args.requests >= 2
    # The machine may be shared: the policies alternate (resident first in even rounds, staged
    # first in odd ones) and each figure is the median over the rounds.
    runs = {"resident": [], "staged": []}
    for k in range(args.rounds):
        for memory in (("resident", "staged") if k % 2 == 0 else ("staged", "resident")):
            runs[memory].append(run(args, memory))
    rows = []
    for memory, rs in runs.items():
        row = {"memory": memory}
        for key in rs[0]:
            if key != "memory":
                row[key] = statistics.median(r[key] for r in rs)
        rows.append(row)
    print(f"{args.requests} sequential edits, {args.steps} steps, one reference "
          f"({Path(args.image).name}), {Path(args.model).name}; medians of {args.rounds} "
          "rounds\n")
    print("| --memory | first request s | later requests s (median) | loads / load s: first "
          "request | loads / load s per later request | load s per request (all) | all requests s "
          "| peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['memory']} | {r['first']:.3f} | {r['later_median']:.3f} | "
              f"{r['first_loads']:.0f} / {r['first_load_s']:.4f} | "
              f"{r['later_loads']:.1f} / {r['later_load_s']:.4f} | "
              f"{r['load_s_per_request']:.4f} | {r['total']:.2f} | {r['rss_mib']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
