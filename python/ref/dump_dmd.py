"""Golden forecasts of cache-dit's DMD calibrator (cache_dit/caching/cache_contexts/calibrators/
dmd.py), for tests/dmd_test.cc (TaylorSeer's forecaster=dmd).

cache-dit is not in requirements.txt (it pins its own diffusers and transformers ranges); it
lives in a venv of its own, outside the repository, at the versions of requirements-dmd.txt:
    python3 -m venv /tmp/dmd-venv
    /tmp/dmd-venv/bin/pip install -r python/ref/requirements-dmd.txt
    /tmp/dmd-venv/bin/python python/ref/dump_dmd.py [OUT_DIR]
It runs on CPU in a few seconds and writes OUT_DIR/cases.json (default
tests/golden/dmd/cases.json); two runs write the same bytes.

Each case is a fixed sequence of feature vectors made here from a seeded numpy generator (float32
values, written with 9 significant digits, which round-trip exactly):
  noise    N(0, 1), 64 values per step: no dynamics at all, every singular value kept;
  modes    three damped oscillations and one slowly growing real mode over fixed random spatial
           patterns, plus 1e-3 noise (the shape DMD is meant for);
  lowrank  two exact real modes (rank 2): the automatic rank rule truncates;
  batch2   two batch items of 32 values with different dynamics (cache-dit fits each alone).
For each case two kinds of records:
  windows  _dmd_fit on the last m steps (m = 4, 5, 6) in float64 and _dmd_eval at horizons k
           (fractional included): the forecaster alone, compared in double;
  schedule DMDState driven as flowkv's TaylorSeer schedules one module (calls < before compute,
           then before+1, before+1+interval, ...), with float32 features: the forecast of every
           call where the DMD path is taken (an evenly spaced tail of >= 4 computed steps), which
           the C++ test compares with the policy's fetched outputs. Before that cache-dit uses
           its own Taylor ladder and flowkv diffusers' TaylorSeer series; those calls are not
           recorded.
Forecasts are written as json writes a float (repr: the shortest round-trip of the double).
"""
import json
import os
import sys

import numpy as np
import torch

import cache_dit
from cache_dit.caching.cache_contexts.calibrators.dmd import DMDState, _dmd_eval, _dmd_fit

PINS = {"cache-dit": "1.5.3", "torch": "2.15.0"}


def f32(a):
    return np.asarray(a, dtype=np.float32)


def make_cases():
    rng = np.random.default_rng(20260)
    cases = {}
    steps = 20
    cases["noise"] = f32(rng.standard_normal((steps, 1, 64)))

    t = np.arange(steps)[:, None]
    pats = rng.standard_normal((8, 64))
    x = np.zeros((steps, 64))
    for i, (rho, omega) in enumerate([(0.97, 0.35), (0.9, 0.9), (0.8, 2.1)]):
        x += np.outer(rho ** t[:, 0] * np.cos(omega * t[:, 0]), pats[2 * i])
        x += np.outer(rho ** t[:, 0] * np.sin(omega * t[:, 0]), pats[2 * i + 1])
    x += np.outer(1.01 ** t[:, 0], pats[6])
    x += 1e-3 * rng.standard_normal(x.shape)
    cases["modes"] = f32(x[:, None, :])

    x = np.outer(0.95 ** t[:, 0], pats[0]) + np.outer((-0.6) ** t[:, 0], pats[1])
    cases["lowrank"] = f32(x[:, None, :])

    a = np.outer(0.9 ** t[:, 0] * np.cos(0.5 * t[:, 0]), pats[2, :32]) + np.outer(
        0.9 ** t[:, 0] * np.sin(0.5 * t[:, 0]), pats[3, :32])
    b = np.outer(1.02 ** t[:, 0], pats[4, :32]) + 0.1 * rng.standard_normal((steps, 32))
    cases["batch2"] = f32(np.stack([a, b], axis=1))
    return cases


def fmt_f32(v):
    return float(f"{float(v):.9g}")


def window_records(seq):
    out = []
    n = seq.shape[0]
    for end in (12,):
        for m in (4, 5, 6):
            snaps = [torch.from_numpy(seq[i].astype(np.float64)) for i in range(end - m, end)]
            fit = _dmd_fit(snaps)
            for k in (1.0 / 3.0, 1.0, 2.0, 3.0):
                pred = _dmd_eval(fit, k) if fit is not None else None
                out.append({
                    "first": end - m,
                    "count": m,
                    "k": k,
                    # per batch item: the rank the automatic rule chose (null: degenerate)
                    "ranks": None if fit is None else [None if f is None else len(f[1])
                                                       for f in fit[0]],
                    # null: cache-dit found the fit degenerate (it then reuses the newest step)
                    "forecast": None if pred is None else [float(v) for v in pred.flatten()],
                })
    assert n >= 12
    return out


def schedule_records(seq, interval, before):
    state = DMDState()  # cache-dit's defaults: history 6, rank 0, ridge 1e-8
    out = []
    for s in range(seq.shape[0]):
        y = torch.from_numpy(seq[s].copy())  # float32, [batch, features]
        compute = s < before or (s - before - 1) % interval == 0
        state.mark_step_begin()
        if compute:
            state.update(y)
            continue
        tail, _ = state._uniform_tail()
        pred = state.approximate()
        if len(tail) >= 4:
            out.append({"call": s, "forecast": [float(v) for v in pred.double().flatten()]})
    return out


def main():
    for name, want in PINS.items():
        got = cache_dit.__version__ if name == "cache-dit" else torch.__version__.split("+")[0]
        if got != want:
            print(f"warning: {name} {got} is installed, the dump was made with {want}",
                  file=sys.stderr)
    torch.set_num_threads(1)
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "../../tests/golden/dmd")
    doc = {"generator": "python/ref/dump_dmd.py", "versions": PINS, "cases": []}
    for name, seq in make_cases().items():
        doc["cases"].append({
            "name": name,
            "batch": int(seq.shape[1]),
            "features": int(seq.shape[2]),
            "steps": [[fmt_f32(v) for v in step.flatten()] for step in seq],
            "windows": window_records(seq),
            "schedules": [{"interval": iv, "before": bf, "records": schedule_records(seq, iv, bf)}
                          for iv, bf in ((2, 1), (3, 2))],
        })
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "cases.json")
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
