"""Golden MeanCache trajectories for tests/meancache_test.cc, made by the reference's own code.

MeanCache's public code (UnicomAI/MeanCache, commit REF_COMMIT) is a replacement `__call__` for
diffusers' QwenImagePipeline (`meancache_inference` in MeanCache4Qwen-Image/Mc_qwenimage.py and
Mc_qwenimage_2512.py) plus, inside `main()`, the tables that say which steps compute and which
JVP span each skipped interval uses. This script runs that code unmodified, without a model:

- the reference file is read from the MeanCache repository (a checkout or the bare mirror) and
  executed as a module; its unused `import pandas` gets an empty stand-in module;
- the schedule (`bool_list`, `result_edge_order`) comes from executing `main()`'s own statements
  up to the point where it loads the pipeline, with `get_args()` answering `--cache-jvp B`;
- `meancache_inference` then runs on a stand-in pipeline object whose transformer is a synthetic
  velocity field, elementwise in float32 so that C++ reproduces it bit for bit:
      v(x, tt) = ((a * x + b) + c * tt) + (d * tt) * tt     (tt = the model's timestep / 1000)
  with a, b, c, d seeded, and whose scheduler is diffusers' real FlowMatchEulerDiscreteScheduler
  with the Qwen-Image config. The prompt and the negative prompt give the same field, so the
  reference's true CFG (u + s (c - u), then the norm rescale) returns the field exactly: the
  velocity MeanCache caches is the field's. (The reference only logs computed steps when CFG
  runs, so CFG must run.)

Recorded per case: the field, the initial latents, the scheduler's float32 sigmas, the
reference's compute flags and per-step JVP spans, which steps called the transformer (and the
timestep each call saw), the velocity every Euler step consumed and the latents after it. All
float32 values are written as their shortest decimal (checked to read back, through double, as
the same float32), so C++ reads back the same floats.
Writes tests/golden/meancache/trajectories.json.
    python dump_meancache.py [--ref PATH_TO_MEANCACHE_REPO_OR_GIT_DIR] [OUT_DIR]
"""
import argparse
import ast
import contextlib
import json
import os
import subprocess
import sys
import types

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_common import check_pins, setup_determinism, versions  # noqa: E402

from diffusers import FlowMatchEulerDiscreteScheduler  # noqa: E402

REF_COMMIT = "2e12280abfa9be521ad65c300ac50ad51f426e21"
DEFAULT_REF = "/work/.mirror/UnicomAI+MeanCache/repo"

# The released Qwen-Image scheduler config (as in dump_scheduler.py).
QWEN_SCHEDULER = {"base_image_seq_len": 256, "base_shift": 0.5, "invert_sigmas": False,
                  "max_image_seq_len": 8192, "max_shift": 0.9, "num_train_timesteps": 1000,
                  "shift": 1.0, "shift_terminal": 0.02, "stochastic_sampling": False,
                  "time_shift_type": "exponential", "use_beta_sigmas": False,
                  "use_dynamic_shifting": True, "use_exponential_sigmas": False,
                  "use_karras_sigmas": False}

TOKENS, CHANNELS, STEPS = 4, 4, 50


def reference_source(ref, path):
    """The file at REF_COMMIT from a bare git dir, or from a checkout's work tree."""
    if os.path.isdir(os.path.join(ref, "objects")) or ref.endswith(".git"):
        return subprocess.check_output(["git", "-C", ref, "show", f"{REF_COMMIT}:{path}"], text=True)
    with open(os.path.join(ref, path)) as f:
        return f.read()


def load_reference(ref, path):
    sys.modules.setdefault("pandas", types.ModuleType("pandas"))  # imported, never used
    module = types.ModuleType("meancache_ref_" + os.path.basename(path).replace(".", "_"))
    source = reference_source(ref, path)
    exec(compile(source, path, "exec"), module.__dict__)
    module.__source__ = source
    return module


def reference_schedule(module, budget, steps):
    """main()'s own statements, up to loading the pipeline, with --cache-jvp budget."""
    main = next(n for n in ast.parse(module.__source__).body
                if isinstance(n, ast.FunctionDef) and n.name == "main")
    body = []
    for stmt in main.body:
        if isinstance(stmt, ast.Assign) and any(getattr(t, "id", "") == "model_name" for t in stmt.targets):
            break
        body.append(stmt)
    code = compile(ast.Module(body=body, type_ignores=[]), "main()", "exec")
    ns = dict(module.__dict__)
    ns["get_args"] = lambda: argparse.Namespace(cache_jvp=budget, step=steps, seed=0)
    exec(code, ns)
    return ns["bool_list"], ns["result_edge_order"], ns["target_step"]


class Field:
    """The stand-in transformer: v(x, tt) elementwise, the same for every prompt."""

    def __init__(self, seed):
        g = torch.Generator().manual_seed(seed)
        shape = (1, TOKENS, CHANNELS)
        self.a = torch.rand(shape, generator=g) * 2 - 1
        self.b = torch.randn(shape, generator=g)
        self.c = torch.randn(shape, generator=g)
        self.d = torch.randn(shape, generator=g)
        self.config = types.SimpleNamespace(in_channels=CHANNELS * 4, guidance_embeds=False)
        self.calls = []  # the tt of each call

    def cache_context(self, name):
        return contextlib.nullcontext()

    def __call__(self, hidden_states, timestep, **kwargs):
        tt = timestep.view(-1, 1, 1)
        self.calls.append(float(timestep[0]))
        v = ((self.a * hidden_states + self.b) + self.c * tt) + (self.d * tt) * tt
        return (v,)


class StandInPipeline:
    """What meancache_inference reads of `self`, without a model."""
    default_sample_size = 128
    vae_scale_factor = 8
    _execution_device = torch.device("cpu")

    def __init__(self, field, scheduler, latents, flags, edge_order, cache_jvp):
        self.transformer, self.scheduler, self.latents = field, scheduler, latents
        self.should_calc_list, self.edge_order, self.cache_jvp = flags, edge_order, cache_jvp
        self._attention_kwargs, self._interrupt = None, False

    @property
    def attention_kwargs(self):
        return self._attention_kwargs

    @property
    def interrupt(self):
        return self._interrupt

    def check_inputs(self, *args, **kwargs):
        pass

    def encode_prompt(self, prompt=None, **kwargs):
        return torch.zeros(1, 4, 8), torch.ones(1, 4, dtype=torch.long)

    def prepare_latents(self, *args, **kwargs):
        return self.latents.clone()

    def progress_bar(self, total):
        return contextlib.nullcontext(types.SimpleNamespace(update=lambda: None))

    def maybe_free_model_hooks(self):
        pass


def f32(t):
    """float32 values as the shortest decimals that read back (through double) as the same."""
    out = []
    for v in t.detach().to(torch.float32).reshape(-1).numpy():
        short = float(str(v))
        assert np.float32(short) == v, (short, v)
        out.append(short)
    return out


def run_case(module, table_file, budget, cache_jvp, seed):
    flags, edge_order, target = reference_schedule(module, budget, STEPS)
    field = Field(seed)
    g = torch.Generator().manual_seed(seed + 1000)
    latents = torch.randn((1, TOKENS, CHANNELS), generator=g)
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(QWEN_SCHEDULER)
    consumed = []
    step = scheduler.step

    def recording_step(model_output, t, sample, **kwargs):
        consumed.append(model_output.detach().clone())
        return step(model_output, t, sample, **kwargs)

    scheduler.step = recording_step
    pipe = StandInPipeline(field, scheduler, latents, flags, edge_order, cache_jvp)
    after, computed, model_t, seen = [], [], [], [0]

    def on_step(p, i, t, kw):
        after.append(kw["latents"].detach().clone())
        computed.append(len(field.calls) > seen[0])
        seen[0] = len(field.calls)
        model_t.append(field.calls[-1] if computed[-1] else None)
        return {}

    out = module.meancache_inference(pipe, prompt="a", negative_prompt="", height=256, width=256,
                                     num_inference_steps=STEPS, true_cfg_scale=4.0,
                                     output_type="latent", callback_on_step_end=on_step)
    assert len(after) == STEPS and len(consumed) == STEPS
    assert computed == list(flags), "the transformer ran on other steps than the schedule says"
    # Two calls (cond, uncond) per computed step, the same timestep.
    assert field.calls[0::2] == field.calls[1::2]
    assert torch.equal(out.images, after[-1])
    return {
        "name": f"{os.path.basename(table_file)} B={target}" + ("" if cache_jvp else " no jvp"),
        "file": table_file,
        "budget": target,
        "cache_jvp": cache_jvp,
        "seed": seed,
        "tokens": TOKENS,
        "channels": CHANNELS,
        "steps": STEPS,
        "compute": [bool(f) for f in flags],
        "edge_order": list(edge_order),
        "sigmas": f32(scheduler.sigmas),
        "model_timestep": model_t,
        "a": f32(field.a), "b": f32(field.b), "c": f32(field.c), "d": f32(field.d),
        "x0": f32(latents),
        "v": [f32(v) for v in consumed],
        "x": [f32(x) for x in after],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ref", default=DEFAULT_REF, help="MeanCache repository (checkout or git dir)")
    parser.add_argument("out", nargs="?", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "../../tests/golden/meancache"))
    args = parser.parse_args()
    check_pins()
    setup_determinism()
    qwen = "MeanCache4Qwen-Image/Mc_qwenimage.py"
    q2512 = "MeanCache4Qwen-Image/Mc_qwenimage_2512.py"
    modules = {p: load_reference(args.ref, p) for p in (qwen, q2512)}
    cases = [
        run_case(modules[qwen], qwen, 25, True, 1),       # chain, 1, 5
        run_case(modules[qwen], qwen, 17, True, 2),       # 2, 1, 4
        run_case(modules[qwen], qwen, 10, True, 3),       # 2, 1, 4, gaps of 7
        run_case(modules[q2512], q2512, 10, True, 4),     # 1 first, 3
        run_case(modules[q2512], q2512, 25, True, 5),     # 2, 1, 5
        run_case(modules[qwen], qwen, 10, False, 3),      # cache_jvp off: the last velocity reused
    ]
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "trajectories.json")
    meta = {"reference": "UnicomAI/MeanCache", "commit": REF_COMMIT, "versions": versions(),
            "field": "v = ((a * x + b) + c * tt) + (d * tt) * tt, float32, elementwise",
            "scheduler": QWEN_SCHEDULER}
    with open(path, "w") as f:
        json.dump({"meta": meta, "cases": cases}, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path}: {len(cases)} cases, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
