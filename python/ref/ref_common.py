"""Helpers shared by the reference dumpers (dump_flux2.py, dump_qwen.py): determinism, pinned
versions, reproducible safetensors / JSON output, name checks. No side effects on import (the
dumpers install their own wrappers into diffusers' modules; this module touches none)."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import diffusers
import transformers
import safetensors


def setup_determinism() -> bool:
    diffusers.utils.logging.set_verbosity_error()  # silence accelerate / dtype-cast chatter
    diffusers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)  # one thread: no reduction-order dependence on the core count
    torch.set_default_dtype(torch.float32)
    try:
        torch.use_deterministic_algorithms(True)
        return True
    except Exception as e:  # pragma: no cover
        print(f"warning: torch.use_deterministic_algorithms(True) failed: {e}", file=sys.stderr)
        return False


def check_pins():
    """Warn (loudly) when the running versions differ from python/ref/requirements.txt."""
    from importlib.metadata import version
    req = os.path.join(os.path.dirname(os.path.abspath(__file__)), "requirements.txt")
    bad = []
    for line in open(req):
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, want = line.partition("==")
            have = version(name.strip())
            if have.split("+", 1)[0] != want.strip():
                bad.append(f"{name.strip()} {have} (pinned {want.strip()})")
    if bad:
        print("WARNING: versions differ from requirements.txt, the dumps may not match the committed ones: "
              + ", ".join(bad), file=sys.stderr)


def versions() -> dict[str, str]:
    return {
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
        "python": sys.version.split()[0],
    }


def check_names(store, prefix, expected):
    got = {k[len(prefix):]: tuple(v.shape) for k, v in store.items() if k.startswith(prefix)}
    if got != expected:
        missing = sorted(set(expected) - set(got))
        extra = sorted(set(got) - set(expected))
        wrong = sorted(k for k in set(got) & set(expected) if got[k] != expected[k])
        raise RuntimeError(f"{prefix}: name/shape mismatch: missing={missing} extra={extra} "
                           f"wrong={[(k, got[k], expected[k]) for k in wrong]}")


def f32_contig(d: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in d.items()}


def write_st(path, tensors: dict[str, torch.Tensor]):
    tensors = f32_contig(tensors)
    save_file(tensors, path, metadata={"format": "pt"})  # one key: header bytes stay reproducible
    back = load_file(path)
    assert back.keys() == tensors.keys()
    for k in tensors:
        assert torch.equal(back[k], tensors[k]), f"{path}: {k} read-back mismatch"


def clean_config(cfg) -> dict:
    # drop diffusers' bookkeeping set (its iteration order is not reproducible across runs)
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dict(cfg).items() if k != "_use_default_values"}


def json_compact(obj) -> str:
    """Indented JSON, but lists of scalars on one line."""
    text = json.dumps(obj, indent=1)
    return re.sub(r"\[\s*((?:-?[\w.+\-]+|\"[^\"\n]*\")(?:,\s*(?:-?[\w.+\-]+|\"[^\"\n]*\"))*)\s*\]",
                  lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text)


def write_meta(case_dir, meta: dict, dump: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor],
               generator: str):
    meta = dict(meta)
    meta["versions"] = versions()
    meta["generator"] = generator
    meta["dtype"] = "float32 (compute), CPU, torch.use_deterministic_algorithms(True), 1 thread"
    meta["inputs"] = {k: list(v.shape) for k, v in inputs.items()}
    meta["dump_names"] = list(dump.keys())
    meta["dump_shapes"] = {k: list(v.shape) for k, v in dump.items()}
    text = json_compact(meta)
    assert json.loads(text) == json.loads(json.dumps(meta))
    with open(os.path.join(case_dir, "meta.json"), "w") as f:
        f.write(text + "\n")


def fresh_dir(path):
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)


def load_transformer(cls, folder, realign=True):
    # low_cpu_mem_usage=False: plain load (accelerate is not a pinned requirement)
    model = cls.from_pretrained(folder, torch_dtype=torch.float32, low_cpu_mem_usage=False)
    if realign:
        # Parameters loaded from safetensors can sit at 8-byte (not 64-byte) aligned addresses, and the
        # CPU GEMM kernels then take a different path that changes f32 results by ~1 ulp. Copy every
        # parameter into a fresh (allocator-aligned) tensor; values are unchanged.
        with torch.no_grad():
            for prm in model.parameters():
                prm.data = prm.data.clone()
    return model.eval()


def max_abs(a, b) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0


class TracerBase:
    """Forward hooks on a diffusers transformer that record named intermediates while ``record()``
    is active. Subclasses install their hooks in ``_install()``; each subclass's ``active`` is the
    tracer the attention wrappers report to."""

    active = None

    def __init__(self, model):
        self.model = model
        self.store: dict[str, torch.Tensor] | None = None
        self.side: dict = {}  # internal consistency data, not dumped unless asked
        self.prefix = ""
        self.cur_attn: str | None = None
        self.handles = []
        self._install()

    def _install(self):
        raise NotImplementedError

    def _reset(self):
        """Per-recording state beyond the common one."""

    def _check(self):
        """Consistency checks at the end of a recording."""

    @contextlib.contextmanager
    def record(self, prefix: str = ""):
        cls = type(self)
        assert cls.active is None
        self.store, self.side, self.prefix, self.cur_attn = {}, {}, prefix, None
        self._reset()
        cls.active = self
        try:
            yield self.store
            self._check()
        finally:
            cls.active = None
            self.store, self.cur_attn = None, None

    def put(self, name: str, t: torch.Tensor):
        if self.store is None:
            return
        key = self.prefix + name
        if key in self.store:
            raise RuntimeError(f"intermediate {key} recorded twice")
        self.store[key] = t.detach().to(torch.float32).contiguous().clone()

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []

    def _out_hook(self, name):
        def hook(mod, args, out):
            self.put(name, out)

        return hook

    def _attn_exit(self):
        def hook(mod, args, out):
            self.cur_attn = None

        return hook

    def _side_in(self, key):
        def hook(mod, args):
            if self.store is not None:
                self.side[key] = args[0].detach().clone()

        return hook

    def on_attention(self, query, key, value, out):
        """Called by the attention wrappers with the joint q/k/v and the attention result."""
        if self.store is None:
            return
        if self.cur_attn is None:
            raise RuntimeError("attention call outside of an attention module")
        p = self.cur_attn
        self.put(p + ".q", query)
        self.put(p + ".k", key)
        self.put(p + ".v", value)
        self.put(p + ".out", out.flatten(2, 3))
