"""A real `ntransformer serve` process on loopback for the server tests, and the comparisons they
share.

Greedy outputs are compared "up to near-ties": the CPU kernels are not batch-invariant (a
1-column GEMV and a multi-column tile round differently, ~1e-6 relative; the F16 KV cache turns
that into whole-ulp differences and SmolLM2's outlier activations amplify them), so the same
prompt decoded alone or among other requests gets logits up to ~0.6 apart and top-2 margins up
to ~0.7 nats apart (measured over 16 chat prompts x 64 tokens). Two greedy runs may therefore
part where the two most likely tokens were within NEAR_TIE of each other; they must never part
where the model was confident, which is what a token from another request, a stale cache cell or
a wrong position produces.
"""
import http.client
import json
import os
import re
import subprocess
import threading
import time

NEAR_TIE = 1.0  # nats between the two most likely tokens


class Server:
    """ntransformer serve on 127.0.0.1 and a free port; stops (and checks the exit) on close()."""

    def __init__(self, cli, model, *args, api_key=None, ctx=1024, device="cpu", start_timeout=60, stop_timeout=20):
        cmd = [cli, "serve", "-m", model, "--port", "0", "--device", device, "-c", str(ctx), *args]
        if api_key:
            cmd += ["--api-key", api_key]
        self.api_key = api_key
        self.log = []
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.stop_timeout = stop_timeout
        deadline = time.time() + start_timeout
        self.port = None
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"on http://[\d.]+:(\d+) ", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("the server did not start:\n" + "".join(self.log) + self.proc.stderr.read())
        # Keep draining stderr so that the server never blocks on a full pipe.
        self._drain = threading.Thread(target=self._read_log, daemon=True)
        self._drain.start()
        self.base_url = f"http://127.0.0.1:{self.port}"

    def _read_log(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def headers(self, auth=True):
        h = {"Content-Type": "application/json"}
        if auth and self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def request(self, method, path, body=None, headers=None, timeout=120):
        """(status, headers dict with lower-case names, body bytes)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
            conn.request(method, path, body=body, headers=self.headers() if headers is None else headers)
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def json(self, method, path, body=None, headers=None):
        status, hdrs, data = self.request(method, path, body, headers)
        return status, hdrs, json.loads(data)

    def client(self, **kw):
        import openai

        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=self.api_key or "none", max_retries=0,
                             timeout=120, **kw)

    def metrics(self):
        """Prometheus samples as {'name{labels}': value}."""
        status, _, data = self.request("GET", "/metrics")
        assert status == 200
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def health(self):
        status, _, body = self.json("GET", "/health", headers={})
        assert status == 200
        return body

    def wait_idle(self, timeout=10):
        """Waits until no slot is busy and nothing is queued; returns the seconds it took."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            h = self.health()
            if h["slots_busy"] == 0 and h["queue"] == 0:
                return time.time() - t0
            time.sleep(0.05)
        raise AssertionError(f"the server is still busy after {timeout} s: {self.health()}")

    def rss(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def alive(self):
        return self.proc.poll() is None

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"the server did not stop within {self.stop_timeout} s of SIGTERM")
        self._drain.join(timeout=5)
        assert self.proc.returncode == 0, f"server exit code {self.proc.returncode}:\n" + "".join(self.log[-20:])


def chat_margins(choice):
    """(token strings, margins) from a chat choice's logprobs (top_logprobs >= 2)."""
    toks, margins = [], []
    for c in choice.logprobs.content:
        toks.append(c.token)
        top = c.top_logprobs
        margins.append(top[0].logprob - top[1].logprob if len(top) > 1 else float("inf"))
    return toks, margins


def assert_same_greedy(ref_tokens, ref_margins, got_tokens, got_margins, what, near_tie=NEAR_TIE):
    """Two greedy runs agree, or part where either was near a tie. Returns whether they agree.
    End-of-generation tokens are not reported, so a run that ended has no margin there; the
    other run's margin at that token decides."""
    k = 0
    while k < len(ref_tokens) and k < len(got_tokens) and ref_tokens[k] == got_tokens[k]:
        k += 1
    if k == len(ref_tokens) and k == len(got_tokens):
        return True
    margins = [m[k] for m in (ref_margins, got_margins) if k < len(m)]
    assert margins and min(margins) < near_tie, (
        f"{what}: the runs part at token {k} ({ref_tokens[k] if k < len(ref_tokens) else 'end'!r} vs "
        f"{got_tokens[k] if k < len(got_tokens) else 'end'!r}) where the model was confident "
        f"(margins {margins}); reference {''.join(ref_tokens)!r}, got {''.join(got_tokens)!r}")
    return False


def assert_same_greedy_text(ref_text, tokens, margins, got_text, what, near_tie=NEAR_TIE):
    """Text of a greedy run against a reference text, given the run's tokens and margins: equal,
    or parting inside a token that was a near-tie."""
    if got_text == ref_text:
        return True
    pos = 0
    for tok, margin in zip(tokens, margins):
        if not ref_text.startswith(got_text[: pos + len(tok)]) or pos + len(tok) > len(ref_text):
            assert margin < near_tie, (
                f"{what}: parts from the reference at {got_text[:pos + len(tok)]!r} where the run was "
                f"confident (margin {margin:.3f}); reference {ref_text!r}")
            return False
        pos += len(tok)
    # Every token agreed with the reference as far as it went, and the run ended first (at an
    # end-of-generation token, whose margin is not reported).
    raise AssertionError(f"{what}: the run ended at {got_text!r} but the reference goes on: {ref_text!r}")
