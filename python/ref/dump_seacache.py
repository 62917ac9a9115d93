#!/usr/bin/env python3
"""SeaCache decision traces and pictures from diffusers 0.42.1's own SeaCache hooks
(hooks/sea_cache.py) on the tiny pipelines of tests/golden: FLUX.2 Klein (Flux2KleinPipeline,
tests/golden/klein_pipeline/base/pipeline, one reference image, no CFG) and Qwen-Image-2.1
(QwenImage21Pipeline, tests/golden/qwen21_pipeline/pipeline, two condition images, a negative
prompt and true CFG), at several thresholds, in float32 on the CPU.

How SeaCache is applied (its generic path: "register block metadata and provide
raw_vision_callback"):

* The scheduler coordinates SeaCache reads from the cache context (step index, sigma, step
  count) are added to the pipelines' own ``cache_context("cond" / "uncond")`` calls: step k of a
  context is its k-th call, sigma is ``scheduler.sigmas[k]``.
* ``raw_vision_callback`` gives the target's packed latent (the scheduler's ``latents``, the
  first / last tokens of the transformer's ``hidden_states``) as one (C, 1, H, W) tensor per
  batch element, H x W the packed grid.
* Qwen-Image-2.1: ``QwenImage21TransformerBlock`` is not in diffusers' block registry; it is
  registered as a single-stream block (``return_hidden_states_index=0``, no encoder stream) and
  ``transformer.enable_cache(SeaCacheConfig(...))`` applies diffusers' hooks unchanged. The
  pipeline runs without its prefix KV cache (``use_kv_cache=False``): with it, the first step's
  block input holds the prefix and later ones do not, and diffusers' residual history would
  change shape (flowkv's exact prefix cache is bit-identical to no cache, with or without SeaCache).
* FLUX.2: diffusers' generic path cannot cache this model as it stands. Its last repeated block is
  a single-stream block whose output is the concatenated [text; image] sequence, so the residual
  (tail output - leader input) never has the leader input's shape, diffusers records no history
  and every cache hit runs in full ("fail-open"). Here diffusers' own root, leader and
  identity-block hooks are registered as ``apply_sea_cache`` registers them, and only the tail
  hook is replaced by a subclass of diffusers' ``SeaCacheBlockHook`` that splits the last block's
  output into its text and image parts before diffusers' ``_record_full_execution`` (the
  residual of the image tokens, the text part as the auxiliary stream). Gate, SEA filter,
  residual extrapolation and skipping are diffusers' code.

Each call's decision is observed, not inferred: a call computed iff the last block's attention
ran (a torch forward pre-hook on it). Under ``<out>/``:

* ``meta.json``                    the cases: pipeline, request, flowkv --cache spec, diffusers'
                                   SeaCacheConfig, the decisions (one character per transformer
                                   call in call order, C computed / s skipped; with CFG cond then
                                   uncond each step), versions
* ``<case>/output.png``            diffusers' picture
* ``<case>/final.safetensors``     the final packed latents
* ``filter.safetensors``           diffusers' ``_apply_sea_filter`` of a seeded latent
                                   (packed [H * W, C], H x W = 5 x 6, C = 16) at FILTERS
                                   (sigma, power_exp): ``x`` and ``out_<i>``

Usage (from the repository root)::

    python/ref/.venv/bin/python python/ref/dump_seacache.py --out tests/golden/seacache
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

import PIL.Image
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_common import check_pins, fresh_dir, setup_determinism, versions, write_st  # noqa: E402
import dump_qwen21_pipeline  # noqa: E402  (its processor patches, applied on import)

from diffusers import Flux2KleinPipeline, QwenImage21Pipeline, SeaCacheConfig  # noqa: E402
from diffusers.hooks import sea_cache as sea  # noqa: E402
from diffusers.hooks._helpers import TransformerBlockMetadata, TransformerBlockRegistry  # noqa: E402
from diffusers.hooks.hooks import HookRegistry, StateManager  # noqa: E402
from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21TransformerBlock  # noqa: E402
from transformers import AutoTokenizer, Qwen3VLProcessor  # noqa: E402
from dump_qwen21_pipeline import Qwen2VLImageProcessorPil  # noqa: E402

SCRIPT = "python/ref/dump_seacache.py"
GOLDEN = "tests/golden"
KLEIN = f"{GOLDEN}/klein_pipeline/base/pipeline"
QWEN21 = f"{GOLDEN}/qwen21_pipeline/pipeline"
STEPS = 10
MAX_FILE_BYTES = 256 * 1024

# (case, model, SeaCacheConfig knobs). The defaults are diffusers' (threshold 0.25, order 1,
# retention 1, cache end 1, at most 2 cached in a row, power 3).
CASES = [
    ("klein_t0.05", "klein", dict(threshold=0.05)),
    ("klein_t0.25", "klein", dict()),
    ("klein_t1", "klein", dict(threshold=1.0)),
    ("klein_t1_order0_unlimited", "klein",
     dict(threshold=1.0, residual_order=0, max_consecutive_cached=0)),
    ("qwen21_cfg_t0.05", "qwen21", dict(threshold=0.05)),
    ("qwen21_cfg_t0.25", "qwen21", dict()),
    ("qwen21_cfg_t1", "qwen21", dict(threshold=1.0)),
    ("qwen21_cfg_t1_order0_unlimited_end2", "qwen21",
     dict(threshold=1.0, residual_order=0, max_consecutive_cached=0, retention_steps=2,
          cache_end_steps=2, power_exp=2.0)),
]
FILTERS = [(0.37, 3.0), (0.9, 3.0), (0.05, 2.0), (0.0, 3.0)]
# flowkv's knob names are diffusers' field names.
KNOBS = ("threshold", "residual_order", "retention_steps", "cache_end_steps",
         "max_consecutive_cached", "power_exp")


def flowkv_spec(knobs: dict) -> str:
    return "seacache" + (":" + ",".join(f"{k}={knobs[k]}" for k in KNOBS if k in knobs)
                         if knobs else "")


class StepContexts:
    """Adds step_index / sigma / num_inference_steps to the pipeline's cache_context calls."""

    def __init__(self, pipe):
        self.pipe = pipe
        self.calls: dict[str, int] = {}
        orig = pipe.transformer.cache_context  # bound method of CacheMixin

        @contextlib.contextmanager
        def with_steps(name, **kwargs):
            k = self.calls.get(name, 0)
            self.calls[name] = k + 1
            sched = pipe.scheduler
            with orig(name, step_index=k, sigma=float(sched.sigmas[k]),
                      num_inference_steps=len(sched.timesteps), **kwargs):
                yield

        pipe.transformer.cache_context = with_steps


class Decisions:
    """One character per transformer call: C when the last block's attention ran, else s."""

    def __init__(self, transformer, last_block):
        self.trace = ""
        self._ran = False
        last_block.attn.register_forward_pre_hook(lambda *_: setattr(self, "_ran", True))
        transformer.register_forward_pre_hook(lambda *_: setattr(self, "_ran", False))
        transformer.register_forward_hook(
            lambda *_: setattr(self, "trace", self.trace + ("C" if self._ran else "s")))


def vision_callback(first: bool):
    """raw_vision_callback: the target's packed latent tokens as (C, 1, H, W) per batch element.
    The grid comes from the pipeline call (set before it runs)."""
    grid = {}

    def callback(module, args, kwargs):
        x = kwargs["hidden_states"]  # [B, tokens, C]
        h, w = grid["hw"]
        n = h * w
        x = x[:, :n] if first else x[:, -n:]
        return [t.reshape(h, w, -1).permute(2, 0, 1).unsqueeze(1) for t in x.unbind(0)]

    return callback, grid


class Flux2TailHook(sea.SeaCacheBlockHook):
    """diffusers' tail hook for a last block whose output is [text; image] concatenated: the
    image part is the generated stream, the text part the auxiliary one."""

    def new_forward(self, module, *args, **kwargs):
        if self.state_manager._context is None:
            return self.fn_ref.original_forward(*args, **kwargs)
        state = self.state_manager.get_state()
        if state.skip_remaining:
            return sea.SeaCacheBlockHook.new_forward(self, module, *args, **kwargs)
        out = self.fn_ref.original_forward(*args, **kwargs)
        if state.full_execution_pending and state.gen_input is not None:
            n_txt = out.shape[1] - state.gen_input.shape[1]
            sea._record_full_execution(self.config, state, gen_output=out[:, n_txt:],
                                       und_output=out[:, :n_txt])
        return out


def apply_flux2(transformer, config: SeaCacheConfig):
    """apply_sea_cache's registrations for FLUX.2, with the tail hook above."""
    state_manager = StateManager(sea.SeaCacheContextState)
    shared = sea.SeaCacheSharedState()
    root = HookRegistry.check_if_exists_or_initialize(transformer)
    root.register_hook(sea.SeaCacheRootHook(config, state_manager, shared,
                                            config.raw_vision_callback), sea._SEA_CACHE_ROOT_HOOK)
    blocks = list(transformer.transformer_blocks) + list(transformer.single_transformer_blocks)
    HookRegistry.check_if_exists_or_initialize(blocks[0]).register_hook(
        sea.SeaCacheLeaderBlockHook(config, state_manager, shared), sea._SEA_CACHE_LEADER_BLOCK_HOOK)
    for b in blocks[1:-1]:
        HookRegistry.check_if_exists_or_initialize(b).register_hook(
            sea.SeaCacheBlockHook(config, state_manager, shared), sea._SEA_CACHE_BLOCK_HOOK)
    HookRegistry.check_if_exists_or_initialize(blocks[-1]).register_hook(
        Flux2TailHook(config, state_manager, shared, is_tail=True), sea._SEA_CACHE_BLOCK_HOOK)
    root._child_registries_cache = None
    return blocks[-1]


def run_klein(knobs: dict):
    meta = json.load(open(f"{GOLDEN}/klein_pipeline/base/meta.json"))
    pipe = Flux2KleinPipeline.from_pretrained(KLEIN)
    pipe.set_progress_bar_config(disable=True)
    callback, grid = vision_callback(first=True)  # hidden_states = [target; references]
    grid["hw"] = (meta["height"] // 16, meta["width"] // 16)
    last = apply_flux2(pipe.transformer, SeaCacheConfig(**knobs, raw_vision_callback=callback))
    StepContexts(pipe)
    dec = Decisions(pipe.transformer, last)
    final = {}
    unpack = pipe._unpack_latents_with_ids

    def traced_unpack(x, *rest):
        final["latents"] = x.detach().clone()
        return unpack(x, *rest)
    pipe._unpack_latents_with_ids = traced_unpack
    req = {"prompt": meta["prompt"], "height": meta["height"], "width": meta["width"],
           "steps": STEPS, "seed": meta["seed"], "references": ["klein_pipeline/reference.png"]}
    image = pipe(image=PIL.Image.open(f"{GOLDEN}/klein_pipeline/reference.png"),
                 prompt=req["prompt"], height=req["height"], width=req["width"],
                 num_inference_steps=STEPS, generator=torch.Generator("cpu").manual_seed(req["seed"]),
                 output_type="pil").images[0]
    return image, final["latents"], dec.trace, req, "klein_pipeline/base/pipeline"


def run_qwen21(knobs: dict):
    meta = json.load(open(f"{GOLDEN}/qwen21_pipeline/meta.json"))
    proc_dir = os.path.join(QWEN21, "processor")
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessorPil(**dump_qwen21_pipeline.IMAGE_PROCESSOR),
        tokenizer=AutoTokenizer.from_pretrained(proc_dir), video_processor=None,
        chat_template=dump_qwen21_pipeline.CHAT_TEMPLATE)
    pipe = QwenImage21Pipeline.from_pretrained(QWEN21, processor=processor)
    pipe.set_progress_bar_config(disable=True)
    callback, grid = vision_callback(first=False)  # hidden_states = [conditions; target]

    def grid_of(module, args, kwargs):
        _, h, w = kwargs["img_shapes"][0][-1]
        grid["hw"] = (h, w)
        return callback(module, args, kwargs)
    pipe.transformer.enable_cache(SeaCacheConfig(**knobs, raw_vision_callback=grid_of))
    StepContexts(pipe)
    dec = Decisions(pipe.transformer, pipe.transformer.transformer_blocks[-1])
    final = {}
    unpack = pipe._unpack_latents

    def traced_unpack(x, *rest):
        final["latents"] = x.detach().clone()
        return unpack(x, *rest)
    pipe._unpack_latents = traced_unpack
    req = {"prompt": meta["prompt"], "negative_prompt": meta["negative_prompt"],
           "true_cfg_scale": meta["true_cfg_scale"], "steps": STEPS, "seed": meta["seed"],
           "output_resolution": meta["output_resolution"],
           "references": [f"qwen21_pipeline/{f}" for f in meta["images"]]}
    images = [PIL.Image.open(f"{GOLDEN}/qwen21_pipeline/{f}") for f in meta["images"]]
    image = pipe(prompt=req["prompt"], image=images, negative_prompt=req["negative_prompt"],
                 true_cfg_scale=req["true_cfg_scale"], num_inference_steps=STEPS,
                 generator=torch.Generator("cpu").manual_seed(req["seed"]),
                 output_resolution=req["output_resolution"], use_kv_cache=False,
                 output_type="pil").images[0]
    return image, final["latents"], dec.trace, req, "qwen21_pipeline/pipeline"


def filter_dump(out: str):
    h, w, c = 5, 6, 16
    x = torch.randn(h * w, c, generator=torch.Generator().manual_seed(5))
    frame = x.reshape(h, w, c).permute(2, 0, 1).unsqueeze(1)  # (C, 1, H, W), the callback's
    tensors = {"x": x}
    for i, (sigma, power) in enumerate(FILTERS):
        y = sea._apply_sea_filter(frame.movedim(0, -1), sigma=sigma, power_exp=power)  # (1, H, W, C)
        tensors[f"out_{i}"] = y.reshape(h * w, c)
    write_st(os.path.join(out, "filter.safetensors"), tensors)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=f"{GOLDEN}/seacache")
    a = ap.parse_args()
    check_pins()
    setup_determinism()
    TransformerBlockRegistry.register(
        model_class=QwenImage21TransformerBlock,
        metadata=TransformerBlockMetadata(return_hidden_states_index=0,
                                          return_encoder_hidden_states_index=None))
    fresh_dir(a.out)
    filter_dump(a.out)
    cases = {}
    for name, model, knobs in CASES:
        run = run_klein if model == "klein" else run_qwen21
        image, latents, trace, req, pipeline = run(knobs)
        case = os.path.join(a.out, name)
        os.makedirs(case)
        image.save(os.path.join(case, "output.png"))
        write_st(os.path.join(case, "final.safetensors"), {"final_latents": latents})
        cases[name] = {"pipeline": pipeline, "request": req, "cache": flowkv_spec(knobs),
                       "config": {k: getattr(SeaCacheConfig(**knobs), k) for k in KNOBS},
                       "cfg": model == "qwen21", "decisions": trace}
        print(f"{name:40s} {trace}")
    meta = {"script": SCRIPT, "steps": STEPS, "filters": [list(f) for f in FILTERS],
            "versions": versions(), "cases": cases}
    json.dump(meta, open(os.path.join(a.out, "meta.json"), "w"), indent=1, ensure_ascii=False)
    for root, _, files in os.walk(a.out):
        for f in files:
            assert os.path.getsize(os.path.join(root, f)) < MAX_FILE_BYTES, f"{f} is too large"


if __name__ == "__main__":
    main()
