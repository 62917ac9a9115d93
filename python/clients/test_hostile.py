"""flowkv serve against hostile clients: every reproducer of docs/reliability.md's server section.

Started by ctest (server.hostile) as
    python test_hostile.py --flowkv BUILD/tools/flowkv [--only NAME]
Each test attacks a `flowkv serve` child on 127.0.0.1 (the tiny Klein KV pipeline of
tests/golden) with raw sockets, curl or the openai package, then checks that the attack got a
clear answer (413, 411, 415, 400, 408, 401) and that the server goes on serving real clients:
bodies over --max-body in any transfer encoding, deep and wide JSON, slow clients (slowloris)
holding every connection thread, pipelined requests, API keys, text fields that are not UTF-8,
a newline in `user`, the server's paths in error bodies, sizes the model would round, NUL in a
prompt, and the default limits. Loopback only; every loop is bounded, each test a few seconds.
"""

import argparse
import json
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import openai

import test_server as ts
from test_server import KLEIN, KLEIN_REF, curl, get, log, metric, metrics, raw_request

PROMPT = "a fox"
KEY = "flowkv-test-key-0123456789abcdef"


def rss_kib(server):
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def status_of(response):
    m = re.match(rb"HTTP/1\.1 (\d+)", response)
    assert m, response[:200]
    return int(m.group(1))


def error_of(response):
    return json.loads(response[response.index(b"\r\n\r\n") + 4:])["error"]


def health_ok(server, timeout=3):
    t0 = time.time()
    status, _ = get(server.url + "/health", timeout=timeout)
    return status == 200, time.time() - t0


# ---- bodies ------------------------------------------------------------------------------------

def test_chunked_body_over_limit(a):
    """--max-body 1M: a 400 MiB chunked body is cut off after ~1 MiB with 413, memory flat."""
    before = rss_kib(a)
    sent = [0]

    def chunks():
        mib = b"x" * (1 << 20)
        for _ in range(400):
            sent[0] += len(mib)
            yield b"%x\r\n" % len(mib) + mib + b"\r\n"
        yield b"0\r\n\r\n"

    t0 = time.time()
    out = raw_request(a.port, b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
                      chunks())
    took = time.time() - t0
    assert status_of(out) == 413, out[:300]
    assert "--max-body" in error_of(out)["message"]
    grew = rss_kib(a) - before
    log(f"    413 after {sent[0] >> 20} MiB sent, {took:.2f} s; RSS grew {grew >> 10} MiB")
    assert sent[0] < (64 << 20), sent[0]  # the server stopped reading: the client's sends fail
    assert grew < 64 << 10, grew
    assert health_ok(a)[0]


def test_body_without_length(a):
    out = raw_request(a.port, b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\n\r\n{\"prompt\": \"x\"}", timeout=10)
    assert status_of(out) == 411, out[:300]


def test_compressed_and_ambiguous_bodies(a):
    out = raw_request(a.port, b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Encoding: gzip\r\n"
                      b"Content-Length: 4\r\n\r\nabcd", timeout=10)
    assert status_of(out) == 415, out[:300]
    # The request-smuggling pair, and a Transfer-Encoding that is not chunked.
    for head in (b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n",
                 b"Transfer-Encoding: gzip, chunked\r\n",
                 b"Content-Length: 4\r\nContent-Length: 5\r\n"):
        out = raw_request(a.port, b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\n" + head +
                          b"\r\n4\r\nabcd\r\n0\r\n\r\n", timeout=10)
        assert status_of(out) == 400, (head, out[:300])


def test_deep_json(a):
    """60 MiB of '[' inside the body limit: 400 at once, no CPU or memory spent on it."""
    before = rss_kib(a)
    body = b"[" * (60 << 20)
    t0 = time.time()
    out = raw_request(a.port, b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body),
                      (body[i:i + (1 << 20)] for i in range(0, len(body), 1 << 20)))
    took = time.time() - t0
    assert status_of(out) == 400 and "nested deeper" in error_of(out)["message"], out[:300]
    # Wide instead of deep: a 30 MiB array of numbers.
    wide = b"[" + b"1," * (15 << 20) + b"1]"
    out = raw_request(a.port, b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(wide),
                      (wide[i:i + (1 << 20)] for i in range(0, len(wide), 1 << 20)))
    assert status_of(out) == 400 and "values" in error_of(out)["message"], out[:300]
    grew = rss_kib(a) - before
    log(f"    deep: 400 in {took:.2f} s; RSS after both {grew >> 10} MiB over before")
    assert grew < 200 << 10, grew  # the bodies themselves (60 + 30 MiB) are held while read


# ---- slow clients ------------------------------------------------------------------------------

class Slowloris:
    """`n` sockets each sending one more header line every `every` seconds, never finishing."""

    def __init__(self, port, n, every):
        self.socks, self.closed, self.stop = [], 0, threading.Event()
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            self.socks.append(s)
        self.thread = threading.Thread(target=self.run, args=(every,), daemon=True)
        self.thread.start()

    def run(self, every):
        i = 0
        while not self.stop.wait(every):
            for s in list(self.socks):
                try:
                    s.sendall(b"X-Slow-%d: a\r\n" % i)
                except OSError:
                    self.socks.remove(s)
                    self.closed += 1
            i += 1

    def end(self):
        self.stop.set()
        self.thread.join()
        for s in self.socks:
            s.close()


def test_slowloris_headers(s):
    """--header-timeout 2: slow header senders are cut off; real clients meanwhile answered."""
    attack = Slowloris(s.port, 8, 0.5)
    try:
        worst = 0
        for _ in range(6):
            ok, took = health_ok(s)
            assert ok
            worst = max(worst, took)
            time.sleep(0.5)
        r = s.client.images.generate(prompt=PROMPT, size="64x64", extra_body={"steps": 2})
        assert r.data[0].b64_json
        time.sleep(1.5)
    finally:
        attack.end()
    text = metrics(s)
    log(f"    /health worst {worst * 1000:.0f} ms under attack; {attack.closed} of 8 slow "
        f"sockets cut off; header timeouts {metric(text, 'flowkv_connection_header_timeouts_total'):.0f}")
    assert attack.closed == 8, attack.closed
    assert metric(text, "flowkv_connection_header_timeouts_total") >= 8


def test_slowloris_pool(s):
    """More slow sockets than connection threads (--workers 1 --queue 4: 21) and a header
    timeout longer than the test: /health still answers, because a reading connection gives
    way when a new one finds no thread."""
    attack = Slowloris(s.port, 40, 0.5)
    try:
        time.sleep(0.5)
        worst = 0
        for _ in range(5):
            ok, took = health_ok(s, timeout=5)
            assert ok
            worst = max(worst, took)
        r = s.client.images.generate(prompt=PROMPT, size="64x64", extra_body={"steps": 2})
        assert r.data[0].b64_json
    finally:
        attack.end()
    text = metrics(s)
    evicted = metric(text, "flowkv_connection_evicted_total")
    log(f"    /health worst {worst * 1000:.0f} ms with 40 slow sockets; {evicted:.0f} evicted")
    assert evicted >= 1
    assert worst < 2, worst


def test_slow_body(s):
    """A body trickling in below the minimum rate after the grace period: 408, not a held
    thread. (The grace is 10 s; the test sends 100 bytes a second for 12 s.)"""
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=20)
    try:
        sock.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
        t0 = time.time()
        out = b""
        while time.time() - t0 < 16:
            try:
                sock.sendall(b" " * 100)
            except OSError:
                break
            sock.settimeout(1)
            try:
                b = sock.recv(65536)
                if not b:
                    break
                out += b
            except socket.timeout:
                pass
        took = time.time() - t0
        while True:
            try:
                b = sock.recv(65536)
            except OSError:
                break
            if not b:
                break
            out += b
    finally:
        sock.close()
    log(f"    slow body answered after {took:.1f} s")
    assert status_of(out) == 408, out[:300]
    assert took < 15, took


# ---- pipelining --------------------------------------------------------------------------------

def pipelined(port, requests, timeout):
    """Writes `requests` at once on one connection; every byte answered until the server closes."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        sock.sendall(requests)
        out = b""
        while True:
            b = sock.recv(1 << 16)
            if not b:
                return out
            out += b
    finally:
        sock.close()


def test_pipelined_requests(a):
    """100 requests written at once on one connection: 100 answers, in order."""
    n = 100
    reqs = b"".join(b"GET /health HTTP/1.1\r\nHost: x\r\nX-N: %d\r\n\r\n" % i
                    for i in range(n - 1))
    reqs += b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    out = pipelined(a.port, reqs, 20)
    answers = re.findall(rb"HTTP/1\.1 (\d+)", out)
    assert len(answers) == n and all(x == b"200" for x in answers), (len(answers), out[-300:])
    assert b'"object":"list"' in out.rsplit(b"HTTP/1.1", 1)[1]
    # POSTs pipelined behind each other, bodies included.
    body = json.dumps({"prompt": PROMPT, "size": "64x64", "steps": 1, "seed": 3}).encode()
    post = (b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
    out = pipelined(a.port, post * 2 + b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close"
                    b"\r\n\r\n", 60)
    answers = re.findall(rb"HTTP/1\.1 (\d+)", out)
    assert answers == [b"200", b"200", b"200"], answers


# ---- authentication ----------------------------------------------------------------------------

def test_api_keys(k):
    # No key, a wrong key: 401 in OpenAI's shape, the key not echoed.
    status, body = get(k.url + "/v1/models")
    err = json.loads(body)["error"]
    assert status == 401 and err["type"] == "invalid_request_error" and err["code"] is None, body
    code, body = curl("-H", "Authorization: Bearer wrong-key-wrong-key-wrong", k.url + "/v1/models")
    err = json.loads(body)["error"]
    assert code == 401 and err["code"] == "invalid_api_key" and "wrong-key" not in err["message"]
    out = raw_request(k.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", timeout=10)
    assert status_of(out) == 401 and b"WWW-Authenticate: Bearer" in out, out[:300]
    # A POST without a key is refused before its body is read, and the connection closes.
    out = raw_request(k.port, b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n",
                      timeout=10)
    assert status_of(out) in (401, 413), out[:300]
    # /health answers anyone; the openai client with the key gets its picture.
    assert get(k.url + "/health")[0] == 200
    bad = openai.OpenAI(base_url=k.url + "/v1", api_key="not-the-key-not-the-key", max_retries=0)
    try:
        bad.models.list()
        raise AssertionError("a wrong key was accepted")
    except openai.AuthenticationError:
        pass
    r = k.client.images.generate(prompt=PROMPT, size="64x64", extra_body={"steps": 1})
    assert r.data[0].b64_json
    assert metric(metrics_with_key(k), "flowkv_unauthorized_total") >= 4


def metrics_with_key(k):
    code, body = curl("-H", f"Authorization: Bearer {KEY}", k.url + "/metrics")
    assert code == 200, body
    return body.decode()


def test_key_file_and_warning(_):
    tmp = Path(ts.TMP)
    loose = tmp / "keys-loose"
    loose.write_text(KEY + "\n")
    loose.chmod(0o644)
    r = run_serve("--api-key-file", str(loose))
    assert r.returncode != 0 and "chmod 600" in r.stderr, r.stderr
    short = tmp / "keys-short"
    short.write_text("# comment\nshort\n")
    short.chmod(0o600)
    r = run_serve("--api-key-file", str(short))
    assert r.returncode != 0 and "16 to 512" in r.stderr, r.stderr
    fifo = tmp / "keys-fifo"
    os.mkfifo(fifo)
    t0 = time.time()
    r = run_serve("--api-key-file", str(fifo))
    assert r.returncode != 0 and "not a regular file" in r.stderr and time.time() - t0 < 10
    # Beyond loopback without a key: a loud warning (the server still starts).
    s = ts.Server(KLEIN, "--host", "0.0.0.0")
    try:
        assert "WARNING: listening on 0.0.0.0 without an API key" in s.log(), s.log()[-2000:]
    finally:
        s.stop()


def run_serve(*extra):
    import subprocess
    return subprocess.run([ts.ARGS.flowkv, "serve", "--model", str(KLEIN), "--port", "0", *extra],
                          capture_output=True, text=True, timeout=30)


# ---- the small ones ----------------------------------------------------------------------------

def test_invalid_utf8_fields(a):
    code, body = curl("-F", b"prompt=\xff\xfe fox", "-F",
                      "image=@" + str(KLEIN_REF), a.url + "/v1/images/edits")
    assert code == 400 and json.loads(body)["error"]["code"] == "invalid_encoding", body
    # Bytes that are not UTF-8 inside an error message are rendered, not a 500.
    body = b'{"prompt": "x", "size": "\xff\xffx64"}'
    out = raw_request(a.port, b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) +
                      body, timeout=10)
    assert status_of(out) == 400, out[:300]
    assert "internal" not in a.log()[-2000:]


def test_user_cannot_forge_log_lines(a):
    forged = "x\nrequest 999 POST /v1/images/generations 200 0.001 s user=admin"
    r = a.client.images.generate(prompt=PROMPT, size="64x64", user=forged, extra_body={"steps": 1})
    assert r.data[0].b64_json
    text = a.log()
    assert "\nrequest 999 " not in text, text[-1000:]
    assert "user=x\\x0arequest 999" in text, text[-1000:]


def test_no_server_paths_in_errors(_):
    """A staged server whose transformer weights vanish after start: the error names the model,
    not the server's folder."""
    folder = Path(ts.TMP) / "private-folder-of-the-server" / "klein"
    shutil.copytree(KLEIN, folder)
    s = ts.Server(folder, "--memory", "staged")
    try:
        for f in (folder / "transformer").glob("*.safetensors"):
            f.write_bytes(b"not a safetensors file")
        code, body = curl("-H", "Content-Type: application/json", "-d",
                          json.dumps({"prompt": PROMPT, "size": "64x64", "steps": 1}),
                          s.url + "/v1/images/generations")
        assert code in (400, 500), (code, body)
        assert b"private-folder-of-the-server" not in body, body
        log(f"    {code}: {json.loads(body)['error']['message'][:160]}")
    finally:
        s.stop()


def test_sizes_the_model_rounds(a):
    for size in ("65x64", "64x70"):
        code, body = curl("-H", "Content-Type: application/json", "-d",
                          json.dumps({"prompt": PROMPT, "size": size, "steps": 1}),
                          a.url + "/v1/images/generations")
        err = json.loads(body)["error"]
        assert code == 400 and err["param"] == "size" and "64x64" in err["message"], body


def test_nul_in_prompt_fails_before_generating(a):
    t0 = time.time()
    code, body = curl("-H", "Content-Type: application/json", "-d",
                      json.dumps({"prompt": "a\u0000fox", "size": "256x256", "steps": 50}),
                      a.url + "/v1/images/generations")
    took = time.time() - t0
    assert code == 400 and "NUL" in json.loads(body)["error"]["message"], body
    assert took < 1, took  # checked at prepare: no weight read, no step run


def test_default_limits(d):
    """The defaults (no limit flags) are what a 2-core machine can honour."""
    for extra, param in [({"size": "2048x2048"}, "size"), ({"steps": 51}, "steps"),
                         ({"n": 3}, "n")]:
        code, body = curl("-H", "Content-Type: application/json", "-d",
                          json.dumps({"prompt": PROMPT, **extra}), d.url + "/v1/images/generations")
        assert code == 400 and json.loads(body)["error"]["param"] == param, (extra, body)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--flowkv", required=True)
    p.add_argument("--only", default="")
    ts.ARGS = p.parse_args()
    ts.TMP = tempfile.mkdtemp(prefix="flowkv-hostile-test-")
    t_all = time.time()
    passed, failed = 0, []

    def run(name, fn, server):
        nonlocal passed
        if ts.ARGS.only and ts.ARGS.only not in name:
            return
        t0 = time.time()
        try:
            fn(server)
            passed += 1
            log(f"ok   {name} ({time.time() - t0:.2f} s)")
        except Exception:
            failed.append(name)
            tail = server.log()[-3000:] if server else ""
            log(f"FAIL {name}\n{traceback.format_exc()}\n--- server log ---\n{tail}")

    a = ts.Server(KLEIN, "--max-body", "64M", "--timeout", "60")
    for name, fn in [("body_without_length", test_body_without_length),
                     ("compressed_and_ambiguous_bodies", test_compressed_and_ambiguous_bodies),
                     ("deep_json", test_deep_json),
                     ("pipelined_requests", test_pipelined_requests),
                     ("invalid_utf8_fields", test_invalid_utf8_fields),
                     ("user_cannot_forge_log_lines", test_user_cannot_forge_log_lines),
                     ("sizes_the_model_rounds", test_sizes_the_model_rounds),
                     ("nul_in_prompt_fails_before_generating",
                      test_nul_in_prompt_fails_before_generating),
                     ("default_limits", test_default_limits)]:
        run(name, fn, a)
    a.stop()

    m = ts.Server(KLEIN, "--max-body", "1M")
    run("chunked_body_over_limit", test_chunked_body_over_limit, m)
    m.stop()

    s = ts.Server(KLEIN, "--workers", "1", "--queue", "4", "--header-timeout", "2")
    for name, fn in [("slowloris_headers", test_slowloris_headers),
                     ("slow_body", test_slow_body)]:
        run(name, fn, s)
    s.stop()
    # A header timeout longer than the test: only a connection giving way frees a thread.
    p = ts.Server(KLEIN, "--workers", "1", "--queue", "4", "--header-timeout", "60")
    run("slowloris_pool", test_slowloris_pool, p)
    p.stop()

    k = ts.Server(KLEIN, "--api-key", KEY, api_key=KEY,
                  env=dict(os.environ, FLOWKV_API_KEY="second-key-0123456789abcdef"))
    run("api_keys", test_api_keys, k)
    k.stop()
    run("key_file_and_warning", test_key_file_and_warning, None)
    run("no_server_paths_in_errors", test_no_server_paths_in_errors, None)

    log(f"{passed} passed, {len(failed)} failed in {time.time() - t_all:.1f} s")
    if failed:
        log("failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
