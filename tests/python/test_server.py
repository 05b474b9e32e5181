"""The OpenAI-compatible server against the official `openai` client and raw HTTP, on loopback with
SmolLM2: completions and chat, streamed and not, against the CLI's own greedy output; sampling
parameters; concurrent clients against their single-client runs; cancellation; every error
class; auth; metrics. The 60 s load test is in test_server_load.py, the web page in
test_server_web.py.
"""
import json
import socket
import subprocess
import threading
import time

import openai
import pytest

from server_helpers import Server, chat_tokens

KEY = "test-key-123"
PARALLEL = 4
CTX = 512


@pytest.fixture(scope="module")
def server(cli, smollm2):
    s = Server(cli, smollm2, "--parallel", str(PARALLEL), "--queue", "16", "--max-body", "64K", api_key=KEY,
               ctx=CTX)
    yield s
    assert s.alive(), "the server died during the tests:\n" + "".join(s.log[-30:])
    s.close()


@pytest.fixture(scope="module")
def client(server):
    return server.client()


@pytest.fixture(scope="module")
def model_id(client):
    return client.models.list().data[0].id


def cli_generate(cli, model, prompt, n):
    r = subprocess.run([cli, "generate", "-m", model, "-p", prompt, "-n", str(n), "--temp", "0", "-c", str(CTX),
                        "--device", "cpu"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("\n")
    return r.stdout[:-1]


def cli_chat(cli, model, question, n):
    r = subprocess.run([cli, "chat", "-m", model, "-n", str(n), "--temp", "0", "-c", str(CTX), "--device", "cpu"],
                       input=question + "\n", capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # "> " answer "\n" "> " (the next prompt, then end of input)
    assert r.stdout.startswith("> ") and r.stdout.endswith("\n> "), r.stdout
    return r.stdout[2:-3]


# ---- completions and chat, against the CLI ----

def test_models_and_health(server, client, model_id):
    assert model_id == "SmolLM2-135M-Instruct.Q4_1"
    m = client.models.retrieve(model_id)
    assert m.id == model_id and m.owned_by == "ntransformer"
    assert server.health()["status"] == "ok"
    status, _, body = server.json("GET", "/v1/models/no-such-model")
    assert status == 404 and body["error"]["code"] == "model_not_found"


def test_completion_matches_cli(server, client, model_id, cli, smollm2):
    prompt = "The capital of France is"
    ref = cli_generate(cli, smollm2, prompt, 16)
    r = client.completions.create(model=model_id, prompt=prompt, max_tokens=16, temperature=0, logprobs=2)
    c = r.choices[0]
    assert c.text == ref  # greedy: exactly the CLI's text (see server_helpers)
    toks = c.logprobs.tokens
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert c.finish_reason == "length"
    assert r.usage.completion_tokens == 16 and r.usage.prompt_tokens == 5
    assert r.usage.total_tokens == 21
    # logprobs: one entry per token, the tokens spell the text, greedy picks the most likely.
    assert "".join(toks) == c.text
    assert len(c.logprobs.token_logprobs) == 16 and all(lp <= 0 for lp in c.logprobs.token_logprobs)
    for tok, lp, top in zip(toks, c.logprobs.token_logprobs, c.logprobs.top_logprobs):
        assert max(top.values()) == pytest.approx(lp, abs=1e-5)
    assert c.logprobs.text_offset[0] == 0 and c.logprobs.text_offset[1] == len(toks[0])


def test_completion_stream_equals_non_stream(client, model_id):
    kw = dict(model=model_id, prompt="List three colors:\n1.", max_tokens=20, temperature=0)
    full = client.completions.create(**kw).choices[0]
    chunks = list(client.completions.create(stream=True, **kw))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == full.text
    assert sum(1 for ch in chunks if ch.choices and ch.choices[0].text) > 3  # it streamed
    assert chunks[-1].choices[0].finish_reason == full.finish_reason
    assert all(ch.choices[0].finish_reason is None for ch in chunks[:-1])


def test_chat_matches_cli(client, model_id, cli, smollm2):
    question = "What is the capital of France?"
    ref = cli_chat(cli, smollm2, question, 64)
    r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": question}],
                                       temperature=0, max_tokens=64, logprobs=True, top_logprobs=2)
    c = r.choices[0]
    assert c.message.content == ref
    toks = chat_tokens(c)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert c.message.role == "assistant"
    assert c.finish_reason == "stop"  # the end of turn, before 64 tokens
    assert r.usage.completion_tokens == len(toks)
    # The prompt is the ChatML rendering of the message.
    assert r.usage.prompt_tokens > len(question.split())


def test_chat_stream_equals_non_stream(client, model_id):
    kw = dict(model=model_id, temperature=0, max_tokens=40,
              messages=[{"role": "system", "content": "You are a helpful assistant."},
                        {"role": "user", "content": "Name two planets."}])
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_multi_turn_chat_reuses_the_cache(server, client, model_id):
    msgs = [{"role": "user", "content": "Give me a fruit."}]
    a1 = client.chat.completions.create(model=model_id, messages=msgs, temperature=0, max_tokens=24)
    msgs += [{"role": "assistant", "content": a1.choices[0].message.content},
             {"role": "user", "content": "And a vegetable?"}]
    before = server.metrics()
    a2 = client.chat.completions.create(model=model_id, messages=msgs, temperature=0, max_tokens=24)
    after = server.metrics()
    cached = after["nt_prompt_tokens_cached_total"] - before["nt_prompt_tokens_cached_total"]
    evaluated = after["nt_prompt_tokens_total"] - before["nt_prompt_tokens_total"]
    assert cached + evaluated == a2.usage.prompt_tokens
    assert cached >= a1.usage.prompt_tokens  # the first turn was not evaluated again
    assert a2.choices[0].message.content


# ---- sampling parameters ----

def test_stop_sequences(client, model_id):
    kw = dict(model=model_id, prompt="List three colors:\n1.", max_tokens=24, temperature=0)
    full = client.completions.create(**kw).choices[0].text
    assert "\n" in full
    cut = client.completions.create(stop=["\n"], **kw).choices[0]
    assert cut.text == full[: full.index("\n")] and cut.finish_reason == "stop"
    # A stop string spanning tokens, streamed: nothing of it reaches the client.
    word = full.split()[1][:3]
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(stream=True, stop=[word, "zzz"], **kw))
    assert streamed == full[: full.index(word)]


def test_seed_temperature_and_top_p(client, model_id):
    # A request computes exactly as on an idle server (its prompt prefix reused or not), so a seed
    # replays it.
    kw = dict(model=model_id, prompt="Once upon a time", max_tokens=24)
    a = client.completions.create(temperature=1.0, seed=42, **kw).choices[0].text
    b = client.completions.create(temperature=1.0, seed=42, **kw).choices[0].text
    assert a == b  # same seed, same text
    others = {client.completions.create(temperature=1.0, seed=s, **kw).choices[0].text for s in (1, 2, 3)}
    assert len(others | {a}) > 1  # the seed matters
    # top_p so small that only the most likely token survives: greedy, whatever the temperature.
    greedy = client.completions.create(temperature=0, **kw).choices[0].text
    assert client.completions.create(temperature=1.5, top_p=1e-6, seed=7, **kw).choices[0].text == greedy


def cli_tokenize(cli, model, text):
    r = subprocess.run([cli, "tokenize", "-m", model, "-p", text, "--ids"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_max_tokens_echo_and_logit_bias(client, model_id, cli, smollm2):
    prompt = "The capital of France is"
    kw = dict(model=model_id, prompt=prompt, temperature=0)
    r = client.completions.create(max_tokens=3, logprobs=1, **kw)
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
    e = client.completions.create(max_tokens=3, echo=True, **kw)
    assert e.choices[0].text == prompt + r.choices[0].text
    z = client.completions.create(max_tokens=0, **kw)
    assert z.choices[0].text == "" and z.usage.completion_tokens == 0 and z.choices[0].finish_reason == "length"
    # Banning the greedy first token makes the second most likely one come first.
    first = r.choices[0].logprobs.tokens[0]
    (first_id,) = cli_tokenize(cli, smollm2, first)
    top2 = client.completions.create(max_tokens=1, logprobs=2, **kw)
    top = top2.choices[0].logprobs.top_logprobs[0]
    runner_up = max((t for t in top if t != first), key=top.get)
    banned = client.completions.create(max_tokens=1, logit_bias={str(first_id): -100}, **kw)
    assert banned.choices[0].text == runner_up


def test_token_prompt(server, client, model_id, cli, smollm2):
    # A prompt of token ids gives the same result as the text they encode.
    ids = cli_tokenize(cli, smollm2, "Hello world")
    text = client.completions.create(model=model_id, prompt="Hello world", max_tokens=8, temperature=0)
    status, _, body = server.json("POST", "/v1/completions",
                                  {"prompt": ids, "max_tokens": 8, "temperature": 0})
    assert status == 200
    assert body["choices"][0]["text"] == text.choices[0].text
    assert body["usage"]["prompt_tokens"] == len(ids)


# ---- concurrency and cancellation ----

QUESTIONS = [
    "What is the capital of Japan?",
    "Write one sentence about the ocean.",
    "Name a famous painter.",
    "What do bees make?",
    "Give me a synonym for happy.",
    "How many legs does a spider have?",
]


def ask(client, model_id, question, stream):
    """(token, logprob) of each generated token."""
    kw = dict(model=model_id, messages=[{"role": "user", "content": question}], temperature=0, max_tokens=32,
              logprobs=True)
    if not stream:
        return chat_tokens(client.chat.completions.create(**kw).choices[0])
    toks = []
    for ch in client.chat.completions.create(stream=True, **kw):
        if ch.choices and ch.choices[0].logprobs:
            toks += [(c.token, c.logprob) for c in ch.choices[0].logprobs.content]
    return toks


def settled_metrics(server):
    """The metrics once the server is idle and its counters have caught up (a step's counters are
    recorded just after its tokens reach the clients)."""
    server.wait_idle()
    m = server.metrics()
    for _ in range(40):
        time.sleep(0.05)
        again = server.metrics()
        if again["nt_steps_total"] == m["nt_steps_total"]:
            return again
        m = again
    return m


def test_concurrent_greedy_equals_single_client_runs(server, client, model_id):
    single = [ask(client, model_id, q, False) for q in QUESTIONS]
    before = settled_metrics(server)
    results = [None] * len(QUESTIONS)
    barrier = threading.Barrier(len(QUESTIONS))

    def worker(i):
        barrier.wait()
        results[i] = ask(client, model_id, QUESTIONS[i], stream=i % 2 == 0)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(QUESTIONS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = settled_metrics(server)
    # Exactly the single-client tokens, and their log-probabilities to the last bit (see server_helpers).
    for q, alone, together in zip(QUESTIONS, single, results):
        assert together == alone, q
    # They really ran together: far fewer forward steps than tokens.
    steps = after["nt_steps_total"] - before["nt_steps_total"]
    generated = after["nt_generated_tokens_total"] - before["nt_generated_tokens_total"]
    assert generated == sum(len(t) for t in results)
    assert steps < generated / 2, (steps, generated)


def eog_bias(cli, smollm2):
    return {str(t): -100 for t in cli_tokenize(cli, smollm2, "<|im_end|><|endoftext|>")}


def test_stream_disconnect_cancels_and_frees_the_slot(server, client, model_id, cli, smollm2):
    server.wait_idle()
    before = server.metrics()
    stream = client.completions.create(model=model_id, prompt="Once upon a time", max_tokens=400, temperature=0.8,
                                       stream=True, logit_bias=eog_bias(cli, smollm2))
    n = 0
    for _ in stream:
        n += 1
        if n == 3:
            break
    stream.close()
    assert server.wait_idle(timeout=3) < 2.0
    after = server.metrics()
    assert after['nt_generations_total{reason="cancelled"}'] == before['nt_generations_total{reason="cancelled"}'] + 1
    assert after["nt_generated_tokens_total"] - before["nt_generated_tokens_total"] < 100


def test_non_stream_disconnect_cancels(server, cli, smollm2):
    server.wait_idle()
    before = server.metrics()
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 400, "logit_bias": eog_bias(cli, smollm2)})
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
    deadline = time.time() + 10
    while server.health()["slots_busy"] == 0 and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)
    s.close()
    assert server.wait_idle(timeout=3) < 2.0
    after = server.metrics()
    assert after['nt_generations_total{reason="cancelled"}'] == before['nt_generations_total{reason="cancelled"}'] + 1
    assert after["nt_generated_tokens_total"] - before["nt_generated_tokens_total"] < 100


# ---- errors: OpenAI-shaped, with the right status ----

def assert_error(status, body, want_status, param=None, code=None):
    assert status == want_status, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"].endswith(".")
    assert err["type"] == ("invalid_request_error" if want_status < 500 else "server_error")
    if param is not None:
        assert err["param"] == param
    if code is not None:
        assert err["code"] == code


def test_malformed_json(server):
    for body in ["{not json", '{"prompt": "x",}', "", "\x00"]:
        status, _, data = server.request("POST", "/v1/completions", body)
        assert_error(status, json.loads(data), 400, code="invalid_json")
    status, _, data = server.request("POST", "/v1/chat/completions", "[1, 2]")
    assert_error(status, json.loads(data), 400)
    # Invalid UTF-8 inside a string, and nesting deep enough to break a recursive parser.
    status, _, data = server.request("POST", "/v1/completions", b'{"prompt": "\xff\xfe"}')
    assert_error(status, json.loads(data), 400, code="invalid_json")
    status, _, data = server.request("POST", "/v1/completions", "[" * 30000 + "]" * 30000)
    assert_error(status, json.loads(data), 400)
    status, _, data = server.request("POST", "/v1/completions", '{"prompt": "x", "max_tokens": 1e400}')
    assert_error(status, json.loads(data), 400, code="invalid_json")
    assert server.alive()


@pytest.mark.parametrize("field,value,chat", [
    ("max_tokens", "ten", False), ("max_tokens", -1, False), ("max_tokens", 1.5, False),
    ("temperature", "hot", False), ("temperature", 3, False), ("top_p", 0, False), ("seed", "x", False),
    ("stream", "yes", False), ("stop", 5, False), ("stop", ["ok", 3], False), ("prompt", 5, False),
    ("prompt", [], False), ("prompt", [[1, 2], [3]], False), ("n", 2, False), ("logprobs", "x", False),
    ("logit_bias", {"abc": 1}, False), ("logit_bias", {"5": 1000}, False), ("echo", 1, False),
    ("messages", "hi", True), ("messages", [], True), ("messages", [{"content": "hi"}], True),
    ("messages", [{"role": "user", "content": 5}], True),
    ("messages", [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], True),
    ("top_logprobs", 30, True), ("logprobs", 1, True), ("stream_options", 1, True), ("tools", [{"x": 1}], True),
])
def test_wrong_field_types(server, field, value, chat):
    body = {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"}
    body[field] = value
    status, _, data = server.request("POST", "/v1/chat/completions" if chat else "/v1/completions", body)
    err = json.loads(data)
    assert_error(status, err, 400)
    assert err["error"]["param"] is None or err["error"]["param"].split("[")[0].split(".")[0] == field


def test_wrong_types_through_the_openai_client(client, model_id):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_id, prompt="hi", max_tokens="ten")
    assert e.value.status_code == 400 and e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "hi"}], temperature=-1)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model_id, prompt=None)  # no prompt


def test_prompt_longer_than_the_context(server, client, model_id):
    long_prompt = "hello " * (CTX + 10)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_id, prompt=long_prompt, max_tokens=4)
    assert e.value.body["code"] == "context_length_exceeded"
    # Prompt + max_tokens past the context is refused up front too.
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_id, prompt="hello " * (CTX - 20), max_tokens=100)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": long_prompt}])
    assert e.value.body["param"] == "messages"


def test_body_too_large(server):
    body = json.dumps({"prompt": "x" * (70 * 1024)})
    status, _, data = server.request("POST", "/v1/completions", body)
    assert_error(status, json.loads(data), 413, code="request_too_large")
    assert server.alive()


def test_unknown_route_and_method(server):
    status, _, data = server.request("GET", "/v1/nothing")
    assert_error(status, json.loads(data), 404, code="unknown_url")
    status, _, data = server.request("GET", "/v1/completions")
    assert_error(status, json.loads(data), 404, code="unknown_url")


# ---- auth ----

def test_auth_on_every_route_but_health(server, model_id):
    routes = [("GET", "/"), ("GET", "/metrics"), ("GET", "/v1/models"), ("GET", f"/v1/models/{model_id}"),
              ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/no/such/route")]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": "Basic " + KEY}):
        for method, path in routes:
            status, hdrs, data = server.request(method, path, '{"prompt": "hi"}' if method == "POST" else None,
                                                headers=headers)
            assert_error(status, json.loads(data), 401, code="invalid_api_key")
            assert hdrs.get("www-authenticate") == "Bearer"
    status, _, data = server.request("GET", "/health", headers={})
    assert status == 200 and json.loads(data)["status"] == "ok"
    status, hdrs, data = server.request("GET", "/")
    assert status == 200 and hdrs["content-type"].startswith("text/html") and b"/v1/chat/completions" in data


def test_wrong_key_through_the_openai_client(server, model_id):
    bad = openai.OpenAI(base_url=server.base_url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=model_id, prompt="hi", max_tokens=1)


# ---- metrics ----

def test_metrics(server, client, model_id, smollm2):
    from gguf import GGUFReader

    server.wait_idle()
    before = server.metrics()
    r = client.completions.create(model=model_id, prompt="The sky is", max_tokens=7, temperature=0)
    status, hdrs, _ = server.request("GET", "/metrics")
    assert status == 200 and hdrs["content-type"].startswith("text/plain; version=0.0.4")
    after = server.metrics()
    assert after["nt_generated_tokens_total"] - before["nt_generated_tokens_total"] == r.usage.completion_tokens
    assert after["nt_prompt_tokens_total"] - before["nt_prompt_tokens_total"] == r.usage.prompt_tokens
    key = 'nt_requests_total{route="/v1/completions",code="200"}'
    assert after[key] == before.get(key, 0) + 1  # absent before the route's first request
    assert after["nt_queue_depth"] == 0 and after["nt_slots_busy"] == 0 and after["nt_slots_total"] == PARALLEL
    assert after["nt_generated_tokens_per_second"] > 0
    assert after["nt_steps_total"] >= before["nt_steps_total"] + r.usage.completion_tokens
    # Bytes per tier against the file itself (gguf-py): every tensor, resident in RAM on the CPU.
    reader = GGUFReader(smollm2)
    weights = sum(int(t.n_bytes) for t in reader.tensors)
    assert after['nt_weight_bytes{tier="ram"}'] == weights
    assert after['nt_weight_bytes{tier="vram"}'] == 0 and after['nt_weight_bytes{tier="disk"}'] == 0
    assert after['nt_weight_bytes_read_total{tier="ram"}'] == weights * after["nt_steps_total"]
    f = lambda k: int(reader.fields[k].parts[-1][0])
    kvdim = f("llama.attention.head_count_kv") * f("llama.embedding_length") // f("llama.attention.head_count")
    assert after["nt_kv_cache_bytes"] == f("llama.block_count") * 2 * PARALLEL * CTX * kvdim * 2
    assert 0 < after["nt_process_resident_bytes"] < 4 << 30


# ---- overload: queued, then 503 with Retry-After ----

def test_overload_queues_then_503(cli, smollm2):
    s = Server(cli, smollm2, "--parallel", "1", "--queue", "1", ctx=256)
    try:
        c = s.client()
        mid = c.models.list().data[0].id
        long = dict(model=mid, prompt="Once upon a time", max_tokens=200, logit_bias=eog_bias(cli, smollm2))
        a = c.completions.create(stream=True, **long)
        next(iter(a))  # a holds the only slot
        queued = {}
        t = threading.Thread(target=lambda: queued.setdefault("r", c.completions.create(
            model=mid, prompt="Hello", max_tokens=4, temperature=0)))
        t.start()
        deadline = time.time() + 10
        while s.health()["queue"] < 1 and time.time() < deadline:
            time.sleep(0.02)
        assert s.health()["queue"] == 1
        status, hdrs, data = s.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1})
        assert_error(status, json.loads(data), 503, code="server_overloaded")
        assert int(hdrs["retry-after"]) >= 1
        with pytest.raises(openai.APIStatusError) as e:
            c.completions.create(model=mid, prompt="x", max_tokens=1)
        assert e.value.status_code == 503
        a.close()  # the slot frees at once and the queued request runs
        t.join(timeout=30)
        assert queued["r"].choices[0].finish_reason in ("length", "stop")
        m = s.metrics()
        assert m["nt_generations_rejected_total"] == 2
        assert m['nt_requests_total{route="/v1/completions",code="503"}'] == 2
    finally:
        s.close()
