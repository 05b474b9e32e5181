"""The chat page at / in headless Chromium (Debian's chromium, driven over the DevTools protocol
with the `websockets` package): type a prompt, press Enter, and watch the answer stream in; the
final text must be the server's own greedy answer to the same conversation.
"""
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request

import pytest

import websockets.sync.client as websockets_sync  # requirements-test.txt

from server_helpers import Server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
QUESTION = "What is the capital of France?"
MAX_TOKENS = 48


class DevTools:
    """A minimal Chrome DevTools Protocol session on one page."""

    def __init__(self, ws):
        self.ws = ws
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=30))
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")


@pytest.fixture
def browser_page(cli, smollm2):
    if not CHROMIUM:
        pytest.fail("chromium is not installed; scripts/setup.sh installs it (Debian package 'chromium')")
    server = Server(cli, smollm2, "--parallel", "2", ctx=512)
    profile = tempfile.mkdtemp(prefix="nt-chromium-")
    # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
    proc = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--remote-debugging-port=0", f"--user-data-dir={profile}", server.base_url + "/"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port = None
        deadline = time.time() + 60
        while time.time() < deadline and port is None:
            try:
                with open(f"{profile}/DevToolsActivePort") as f:
                    port = int(f.readline())
            except (FileNotFoundError, ValueError):
                time.sleep(0.2)
        assert port, "Chromium did not open its DevTools port"
        page = None
        while time.time() < deadline and page is None:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as r:
                pages = [t for t in json.load(r) if t["type"] == "page" and t["url"].startswith(server.base_url)]
            page = pages[0] if pages else time.sleep(0.2)
        assert page, "the chat page did not open"
        with websockets_sync.connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
            yield server, DevTools(ws)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(profile, ignore_errors=True)
        server.close()


def test_chat_page_streams_an_answer(browser_page):
    server, dt = browser_page
    deadline = time.time() + 30
    while dt.eval("document.readyState") != "complete" or not dt.eval("!!document.getElementById('prompt')"):
        assert time.time() < deadline, "the page did not load"
        time.sleep(0.1)
    # Greedy settings, so that the page's answer can be checked against the API's.
    dt.eval(f"document.getElementById('temperature').value = '0'; "
            f"document.getElementById('max-tokens').value = '{MAX_TOKENS}'; "
            "document.getElementById('prompt').focus()")
    dt.call("Input.insertText", text=QUESTION)  # typed into the focused textarea
    assert dt.eval("document.getElementById('prompt').value") == QUESTION
    for kind in ("keyDown", "keyUp"):
        dt.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter", windowsVirtualKeyCode=13,
                nativeVirtualKeyCode=13)

    probe = """(() => {
        const a = [...document.querySelectorAll('.msg.assistant')].pop();
        const u = [...document.querySelectorAll('.msg.user')].pop();
        const e = [...document.querySelectorAll('.msg.error')].pop();
        return a ? {state: a.dataset.state, chunks: Number(a.dataset.chunks), text: a.textContent,
                    user: u ? u.textContent : null, error: e ? e.textContent : null} : null;
    })()"""
    snapshots = []
    deadline = time.time() + 120
    while time.time() < deadline:
        s = dt.eval(probe)
        if s:
            snapshots.append(s)
            if s["state"] in ("done", "error"):
                break
        time.sleep(0.03)
    final = snapshots[-1]
    assert final["state"] == "done", final
    assert final["user"] == QUESTION and final["error"] is None
    assert final["text"].strip()
    # It streamed: the page showed part of the answer before the end, in several pieces.
    partial = [s for s in snapshots if s["state"] == "streaming" and 0 < len(s["text"]) < len(final["text"])]
    assert partial, "no partial answer was ever shown"
    assert final["chunks"] > 1
    # The same conversation through the API gives the same answer, to the character.
    status, _, body = server.json("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": QUESTION}], "temperature": 0, "max_tokens": MAX_TOKENS})
    assert status == 200
    assert final["text"] == body["choices"][0]["message"]["content"]
    assert dt.eval("document.getElementById('model').textContent") == "SmolLM2-135M-Instruct.Q4_1"
