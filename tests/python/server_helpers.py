"""A real `ntransformer serve` process on loopback for the server tests, and the comparisons they
share.

Greedy outputs are compared exactly: the CPU backend is batch-invariant (a sequence's logits are
bit-identical whether it is decoded alone or among other requests, its prompt in one step or in
chunks, or after a reused prefix: tests/unit/test_batch_invariance.cpp), so any difference between
a request and its single-client run is a bug (a token from another request, a stale cache cell,
a wrong position).
"""
import http.client
import json
import os
import re
import subprocess
import threading
import time

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


def chat_tokens(choice):
    """(token, logprob) of every generated token of a chat choice (requested with logprobs)."""
    return [(c.token, c.logprob) for c in choice.logprobs.content]
