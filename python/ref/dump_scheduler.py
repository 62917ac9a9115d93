"""Golden schedules of diffusers' FlowMatchEulerDiscreteScheduler.set_timesteps, for
tests/scheduler_test.cc.

Each case is a scheduler_config.json (what a pipeline folder's scheduler/ holds), the sigmas and
mu a pipeline passes (np.linspace(1, 1/n, n) and compute_empirical_mu as the Klein pipelines do,
calculate_shift from the scheduler config as QwenImage21Pipeline does, or given values), and the
scheduler's float32 sigmas (n + 1, the appended terminal one included) and timesteps (n) as the
hex of their bits, which is exact. The sigmas passed and mu are written with repr (shortest
round-trip), so the C++ side parses the same doubles.
Writes tests/golden/scheduler/cases.json.
    python dump_scheduler.py [OUT_DIR]
With --sweep COUNT, writes OUT_DIR/sweep.json instead (not committed): COUNT seeded random
configs, step counts (1-150), mus and sigma grids, for
    FLOWKV_SCHEDULER_SWEEP=OUT_DIR/sweep.json build/tests/scheduler_test
    python dump_scheduler.py --sweep 1500 /tmp/sched_sweep
"""
import json
import os
import random
import sys

import numpy as np
import scipy
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_common import check_pins, json_compact, setup_determinism, versions  # noqa: E402

from diffusers import FlowMatchEulerDiscreteScheduler  # noqa: E402
from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu  # noqa: E402
from diffusers.pipelines.qwenimage21.pipeline_qwenimage21 import calculate_shift  # noqa: E402

check_pins()
setup_determinism()
args = sys.argv[1:]
sweep = 0
if args[:1] == ["--sweep"]:
    sweep, args = int(args[1]), args[2:]
    assert args, "--sweep COUNT needs OUT_DIR"
out = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/golden/scheduler")
os.makedirs(out, exist_ok=True)

# FLUX.1-dev's scheduler config, which the FLUX.2 Klein pipelines load (spec flux2-klein-kv.md).
KLEIN = {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.32.0.dev0",
         "base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 4096, "max_shift": 1.15,
         "num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": True}
# The released Qwen-Image / Qwen-Image-2.1 scheduler config (spec qwen-image.md §3.3).
QWEN = {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.34.0.dev0",
        "base_image_seq_len": 256, "base_shift": 0.5, "invert_sigmas": False, "max_image_seq_len": 8192,
        "max_shift": 0.9, "num_train_timesteps": 1000, "shift": 1.0, "shift_terminal": 0.02,
        "stochastic_sampling": False, "time_shift_type": "exponential", "use_beta_sigmas": False,
        "use_dynamic_shifting": True, "use_exponential_sigmas": False, "use_karras_sigmas": False}


def with_(base, **kw):
    c = dict(base)
    c.update(kw)
    return c


def hex32(t: torch.Tensor) -> list[str]:
    assert t.dtype == torch.float32, t.dtype
    return [f"{int(b):08x}" for b in t.numpy().view(np.uint32)]


def readable(t: torch.Tensor) -> list:
    return [None if np.isnan(v) else float(v) for v in t.numpy()]  # strict JSON has no NaN


def case(name, config, steps, *, mu_from=None, mu=None, sigmas=None):
    """mu_from: "klein" (compute_empirical_mu(image_seq_len, steps)), "qwen" (calculate_shift
    from the scheduler's config, as QwenImage21Pipeline reads it), or None (mu given)."""
    image_seq_len = None
    if sigmas is None:  # both pipelines' default grid
        sigmas = np.linspace(1.0, 1 / steps, steps)
    if mu_from == "klein":
        image_seq_len = mu
        mu = compute_empirical_mu(image_seq_len=image_seq_len, num_steps=len(sigmas))
    elif mu_from == "qwen":
        image_seq_len = mu
        s = FlowMatchEulerDiscreteScheduler.from_config(config).config
        mu = calculate_shift(image_seq_len, s.get("base_image_seq_len", 256), s.get("max_image_seq_len", 4096),
                             s.get("base_shift", 0.5), s.get("max_shift", 1.15))
    sched = FlowMatchEulerDiscreteScheduler.from_config(config)
    sched.set_timesteps(sigmas=sigmas, mu=mu)
    nan = bool(torch.isnan(sched.sigmas).any())
    c = {"name": name, "config": config, "sigmas_in": [float(v) for v in sigmas], "mu": mu,
         "sigmas": hex32(sched.sigmas), "timesteps": hex32(sched.timesteps),
         # readable copies (the hex is what the test compares)
         "sigmas_f": readable(sched.sigmas), "timesteps_f": readable(sched.timesteps)}
    if nan:
        c["diffusers_nan"] = True
    if mu_from:
        c["mu_from"] = {"family": mu_from, "image_seq_len": image_seq_len}
    assert len(c["sigmas"]) == len(sigmas) + 1 and len(c["timesteps"]) == len(sigmas)
    return c


def random_cases(count):
    """Seeded random configs around Klein's: spacing, static shift, shift_terminal, linear shift,
    invert_sigmas, num_train_timesteps, linspace or random sigma grids. Cases diffusers refuses
    (log of 0) are left out; its NaN cases are kept (flowkv must refuse those)."""
    rng = random.Random(1)
    cases = []
    for i in range(count):
        cfg = dict(KLEIN)
        n = rng.randint(1, 150)
        kind = rng.choice(["none", "none", "karras", "exponential", "beta"])
        if kind != "none":
            cfg[f"use_{kind}_sigmas"] = True
        if rng.random() < 0.3:
            cfg["use_dynamic_shifting"] = False
            cfg["shift"] = round(rng.uniform(0.5, 8), rng.randint(1, 12))
        if rng.random() < 0.3:
            cfg["shift_terminal"] = round(rng.uniform(0.001, 0.5), rng.randint(1, 10))
        if rng.random() < 0.2:
            cfg["time_shift_type"] = "linear"
        if rng.random() < 0.1:
            cfg["invert_sigmas"] = True
        if rng.random() < 0.1:
            cfg["num_train_timesteps"] = rng.randint(1, 5000)
        if kind != "none" and rng.random() < 0.1:
            cfg["sigma_min"], cfg["sigma_max"] = sorted([round(rng.uniform(0.001, 1), 6) for _ in range(2)])
        mu = rng.uniform(-1, 3) if cfg.get("time_shift_type") != "linear" else rng.uniform(0.1, 3)
        if rng.random() < 0.5:
            sig = np.linspace(1.0, 1 / n, n)
        else:
            sig = sorted([rng.uniform(0.01, 1) for _ in range(n)], reverse=True)
        try:
            cases.append(case(f"sweep{i}", cfg, n, mu=mu, sigmas=sig))
        except ValueError:  # math.log(0)
            pass
    return cases


if sweep:
    cases = random_cases(sweep)
    json.dump({"cases": cases}, open(os.path.join(out, "sweep.json"), "w"), allow_nan=False)
    print(len(cases), "cases ->", os.path.join(out, "sweep.json"))
    sys.exit(0)

cases = []
for steps, seq in [(4, 4096), (1, 4096), (28, 1024), (50, 6000)]:  # 6000 > 4300: the other fit
    cases.append(case(f"klein_{steps}_steps_seq{seq}", KLEIN, steps, mu_from="klein", mu=seq))
# One step with shift_terminal: the last shifted sigma is 1, stretch_shift_to_terminal divides 0 by
# 0 and diffusers' schedule is NaN (flowkv refuses it; the case records diffusers' answer).
for steps, seq in [(28, 4096), (4, 6032), (2, 1024), (1, 1024), (50, 8192)]:
    cases.append(case(f"qwen21_{steps}_steps_seq{seq}", QWEN, steps, mu_from="qwen", mu=seq))
cases += [
    case("klein_shift_terminal_0.1", with_(KLEIN, shift_terminal=0.1), 28, mu_from="klein", mu=4096),
    case("qwen21_shift_terminal_0.1", with_(QWEN, shift_terminal=0.1), 4, mu_from="qwen", mu=4096),
    case("klein_linear_shift", with_(KLEIN, time_shift_type="linear"), 28, mu_from="klein", mu=4096),
    case("qwen21_linear_shift", with_(QWEN, time_shift_type="linear"), 8, mu_from="qwen", mu=2048),
    case("static_shift_3", with_(KLEIN, use_dynamic_shifting=False), 28),
    case("static_shift_3.3_4_steps", with_(KLEIN, use_dynamic_shifting=False, shift=3.3), 4),
    case("static_shift_terminal", with_(QWEN, use_dynamic_shifting=False, shift=2.7, shift_terminal=0.05), 12),
    # The distilled identity scheduler (spec qwen-image.md: shift 1, no dynamic shifting).
    case("identity_4_steps", with_(QWEN, use_dynamic_shifting=False, shift=1.0, shift_terminal=None), 4),
    case("class_defaults_7_steps", {"_class_name": "FlowMatchEulerDiscreteScheduler"}, 7),
    case("num_train_timesteps_999", with_(KLEIN, num_train_timesteps=999), 9, mu_from="klein", mu=4096),
    case("invert_sigmas", with_(KLEIN, invert_sigmas=True), 6, mu_from="klein", mu=4096),
    case("given_sigmas", KLEIN, 5, mu_from="klein", mu=2304, sigmas=[1.0, 0.9, 0.62, 0.3, 0.1]),
    case("given_sigmas_mu", with_(QWEN, shift_terminal=None), 3, mu=0.8123456789, sigmas=[0.95, 0.5, 0.125]),
]
for kind in ["karras", "exponential", "beta"]:
    for steps in [1, 2, 4, 28, 50]:
        cases.append(case(f"{kind}_{steps}_steps", with_(KLEIN, **{f"use_{kind}_sigmas": True}), steps,
                          mu_from="klein", mu=4096))
    cases.append(case(f"{kind}_qwen21_9_steps", with_(QWEN, **{f"use_{kind}_sigmas": True}), 9,
                      mu_from="qwen", mu=4096))
    cases.append(case(f"{kind}_static_shift_20_steps", with_(KLEIN, use_dynamic_shifting=False,
                                                            **{f"use_{kind}_sigmas": True}), 20))
# scipy's beta.ppf(0.5, 0.6, 0.6) is 0.5000000000000001; here the middle sigma is a float32 tie
# that this last ulp rounds up (found by a random sweep; flowkv's beta_ppf gives scipy's median).
cases.append(case("beta_median_tie_3_steps", with_(KLEIN, use_beta_sigmas=True, shift_terminal=0.200507), 3,
                  mu=2.7442327924590533))
# sigma_min / sigma_max: not __init__ arguments, but extra keys of the config that the karras,
# exponential and beta conversions read (hasattr(self.config, "sigma_min")), despite diffusers'
# warning that they "will be ignored".
for kind in ["karras", "exponential", "beta"]:
    cases.append(case(f"{kind}_sigma_min_max", with_(KLEIN, sigma_min=0.0625, sigma_max=0.9,
                                                    **{f"use_{kind}_sigmas": True}), 12, mu_from="klein", mu=4096))
# One step with shift_terminal gives NaN stretched sigmas, which karras over a configured
# sigma_min and sigma_max never reads: diffusers' schedule is finite, and flowkv's must be too.
cases.append(case("karras_1_step_shift_terminal_sigma_range",
                  with_(QWEN, use_karras_sigmas=True, sigma_min=0.3, sigma_max=0.7), 1, mu_from="qwen", mu=1024))
cases.append(case("karras_sigma_min_only", with_(KLEIN, sigma_min=0.03, use_karras_sigmas=True), 10,
                  mu_from="klein", mu=1024))
names = [c["name"] for c in cases]
assert len(set(names)) == len(names)

meta = {"generator": "python/ref/dump_scheduler.py",
        "versions": dict(versions(), scipy=scipy.__version__),
        "note": "sigmas and timesteps: float32 bits as hex; sigmas_f / timesteps_f the same values, "
                "readable (null: NaN)",
        "cases": cases}
json.dumps(meta, allow_nan=False)  # strict JSON: the C++ parser reads no NaN
text = json_compact(meta)
assert json.loads(text) == json.loads(json.dumps(meta))
with open(os.path.join(out, "cases.json"), "w") as f:
    f.write(text + "\n")
print(len(cases), "cases ->", os.path.join(out, "cases.json"))
