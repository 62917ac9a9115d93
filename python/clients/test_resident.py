"""flowkv serve on one opened Pipeline: weights loaded once, nothing written to disk per request.

Started by ctest (server.resident_pipeline) as
    python test_resident.py --flowkv BUILD/tools/flowkv
Over the tiny Klein KV pipeline of tests/golden, with TMPDIR of each server a fresh empty folder:
- resident (the default): after the first request, /metrics' flowkv_component_loads_total and
  flowkv_component_load_seconds_total stay constant over three edits with uploaded images (each a
  new prompt, so the text encoder runs every time), a generation and a stream with partial images;
- no file appears in the server's TMPDIR through all of those (uploads stay in memory, PNGs are
  encoded in memory);
- a staged server (--memory staged) loads components for every request, and returns the same PNG
  bytes as the resident one for the same requests.
Loopback only; every client is bounded in time. Helpers come from test_server.py.
"""

import argparse
import os
import sys
import tempfile
import time
import traceback

import test_server as ts
from test_server import KLEIN, KLEIN_REF, log, metric, metrics

STEPS = 2


def loads(server):
    text = metrics(server)
    return (metric(text, "flowkv_component_loads_total"),
            metric(text, "flowkv_component_load_seconds_total"),
            metric(text, "flowkv_resident_components"))


def edit(server, prompt, seed):
    with open(KLEIN_REF, "rb") as f:
        r = server.client.images.edit(image=f, prompt=prompt,
                                      extra_body={"steps": STEPS, "seed": seed})
    return r.data[0].b64_json


def generate(server, prompt, seed):
    r = server.client.images.generate(prompt=prompt, size="64x64",
                                      extra_body={"steps": STEPS, "seed": seed})
    return r.data[0].b64_json


def stream_edit(server, prompt, seed):
    with open(KLEIN_REF, "rb") as f:
        events = list(server.client.images.edit(image=f, prompt=prompt, stream=True,
                                                partial_images=1,
                                                extra_body={"steps": 3, "seed": seed}))
    assert any(getattr(e, "type", "") == "image_edit.partial_image" for e in events)
    return [e for e in events if getattr(e, "type", "") == "image_edit.completed"][0].b64_json


# The requests both servers answer, in order: (kind, prompt, seed).
REQUESTS = [("edit", "a fox", 7), ("edit", "a red fox", 8), ("edit", "a fox at night", 9),
            ("edit", "a fox in snow", 10), ("generate", "a cat", 3), ("stream", "a owl", 4)]


def answer(server, kind, prompt, seed):
    return {"edit": edit, "generate": generate, "stream": stream_edit}[kind](server, prompt, seed)


def empty_dir(path):
    found = []
    for root, dirs, files in os.walk(path):
        found += [os.path.join(root, n) for n in dirs + files]
    return found


def run_server(memory, tmpdir):
    """Every request of REQUESTS on a server with that --memory; its answers and its loads."""
    extra = ["--timeout", "60"] + (["--memory", memory] if memory else [])
    server = ts.Server(KLEIN, *extra, env=dict(os.environ, TMPDIR=tmpdir))
    try:
        answers, after = [], []
        for kind, prompt, seed in REQUESTS:
            answers.append(answer(server, kind, prompt, seed))
            after.append(loads(server))
            left = empty_dir(tmpdir)
            assert not left, f"{kind} '{prompt}' left files in TMPDIR: {left}"
        return answers, after, server.log()
    finally:
        if server.proc.poll() is None:
            assert server.stop() == 0


def test_resident_loads_once(results):
    answers, after, log_text = results["resident"]
    assert "resident pipeline" in log_text, log_text[-2000:]
    first_loads, first_seconds, resident = after[0]
    assert first_loads >= 1 and first_seconds > 0, after[0]
    # The first edit runs every stage: each component is loaded, once, and stays.
    assert resident == first_loads, after[0]
    for (kind, prompt, _), got in zip(REQUESTS[1:], after[1:]):
        assert got[:2] == (first_loads, first_seconds), (kind, prompt, after)
    log(f"    {int(first_loads)} component loads ({first_seconds:.3f} s) on the first request, "
        f"none over the next {len(REQUESTS) - 1}")


def test_staged_loads_per_request(results):
    _, after, log_text = results["staged"]
    assert "staged pipeline" in log_text, log_text[-2000:]
    counts = [a[0] for a in after]
    assert all(b > a for a, b in zip(counts, counts[1:])), counts
    assert after[-1][2] == 0, after[-1]  # nothing stays loaded between requests


def test_resident_equals_staged(results):
    resident, staged = results["resident"][0], results["staged"][0]
    for (kind, prompt, _), a, b in zip(REQUESTS, resident, staged):
        assert a == b, f"{kind} '{prompt}': resident and staged PNG bytes differ"


def test_no_temp_files(results):
    # run_server checked after every request; the folders must still be empty now.
    for name, path in results["tmpdirs"].items():
        assert not empty_dir(path), (name, empty_dir(path))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--flowkv", required=True)
    ts.ARGS = p.parse_args()
    ts.TMP = tempfile.mkdtemp(prefix="flowkv-resident-test-")
    t_all = time.time()
    results = {"tmpdirs": {}}
    for memory in ("resident", "staged"):
        tmpdir = tempfile.mkdtemp(prefix=f"flowkv-serve-tmpdir-{memory}-")
        results["tmpdirs"][memory] = tmpdir
        t0 = time.time()
        try:
            # The resident server runs with no --memory: resident is the default.
            results[memory] = run_server(None if memory == "resident" else memory, tmpdir)
        except Exception:
            log(f"FAIL {memory} server\n{traceback.format_exc()}")
            return 1
        log(f"ok   {memory} server: {len(REQUESTS)} requests ({time.time() - t0:.2f} s)")
    failed = []
    for name, fn in [("resident_loads_once", test_resident_loads_once),
                     ("staged_loads_per_request", test_staged_loads_per_request),
                     ("resident_equals_staged", test_resident_equals_staged),
                     ("no_temp_files", test_no_temp_files)]:
        try:
            fn(results)
            log(f"ok   {name}")
        except Exception:
            failed.append(name)
            log(f"FAIL {name}\n{traceback.format_exc()}")
    for path in results["tmpdirs"].values():
        os.rmdir(path)
    log(f"{4 - len(failed)} passed, {len(failed)} failed in {time.time() - t_all:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
