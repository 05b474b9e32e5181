"""The public C API (include/ntransformer.h) through ctypes: errors and their messages, tokenizer
against llama.cpp's, greedy generation against the CLI, callback and iterator, cancellation from
another thread, sessions on several threads at once, limits; then `cmake --install` and the C
example built against the installed package.
"""
import ctypes as C
import os
import pathlib
import subprocess
import tempfile
import threading
import time

import pytest

from conftest import BUILD, ROOT

NT_OK, NT_DONE = 0, 1
NT_ERR_INVALID_ARGUMENT, NT_ERR_LOAD, NT_ERR_OUT_OF_MEMORY, NT_ERR_CONTEXT_FULL = -1, -2, -3, -4
NT_ERR_BUSY, NT_ERR_CANCELLED, NT_ERR_BUFFER_TOO_SMALL = -5, -6, -7
NT_FINISH_STOP, NT_FINISH_LENGTH, NT_FINISH_CALLBACK, NT_FINISH_CANCELLED = 1, 2, 3, 4


class ModelOptions(C.Structure):
    _fields_ = [("size", C.c_uint32), ("device", C.c_char_p), ("n_ctx", C.c_int32), ("n_seq", C.c_int32),
                ("n_threads", C.c_int32), ("max_batch", C.c_int32), ("vram_budget", C.c_uint64),
                ("ram_budget", C.c_uint64), ("exact", C.c_int32)]


class SamplingParams(C.Structure):
    _fields_ = [("size", C.c_uint32), ("temperature", C.c_float), ("top_k", C.c_int32), ("top_p", C.c_float),
                ("min_p", C.c_float), ("repeat_penalty", C.c_float), ("repeat_last_n", C.c_int32),
                ("frequency_penalty", C.c_float), ("presence_penalty", C.c_float), ("seed", C.c_uint64),
                ("max_tokens", C.c_int32)]


class Token(C.Structure):
    _fields_ = [("id", C.c_int32), ("text", C.c_char_p), ("text_len", C.c_size_t), ("logprob", C.c_float)]


class Result(C.Structure):
    _fields_ = [("finish", C.c_int), ("n_prompt", C.c_int32), ("n_generated", C.c_int32),
                ("prompt_seconds", C.c_double), ("decode_seconds", C.c_double)]


class ChatMessage(C.Structure):
    _fields_ = [("role", C.c_char_p), ("content", C.c_char_p)]


CALLBACK = C.CFUNCTYPE(C.c_int, C.POINTER(Token), C.c_void_p)
P = C.c_void_p


def load_library():
    path = BUILD / "src" / "capi" / "libntransformer.so"
    if not path.exists():
        pytest.fail(f"{path} is not built; build the target ntransformer_c")
    lib = C.CDLL(str(path))
    sig = {
        "nt_version": (C.c_char_p, []), "nt_status_name": (C.c_char_p, [C.c_int]), "nt_last_error": (C.c_char_p, []),
        "nt_model_options_default": (None, [C.POINTER(ModelOptions)]),
        "nt_model_load": (C.c_int, [C.c_char_p, C.POINTER(ModelOptions), C.POINTER(P)]),
        "nt_model_free": (None, [P]), "nt_model_n_vocab": (C.c_int32, [P]), "nt_model_n_ctx": (C.c_int32, [P]),
        "nt_model_n_seq": (C.c_int32, [P]), "nt_model_backend": (C.c_char_p, [P]),
        "nt_token_bos": (C.c_int32, [P]), "nt_token_eos": (C.c_int32, [P]), "nt_token_is_eog": (C.c_int, [P, C.c_int32]),
        "nt_tokenize": (C.c_int, [P, C.c_char_p, C.c_size_t, C.c_int, C.c_int, C.POINTER(C.c_int32), C.c_size_t,
                                  C.POINTER(C.c_size_t)]),
        "nt_detokenize": (C.c_int, [P, C.POINTER(C.c_int32), C.c_size_t, C.c_int, C.c_char_p, C.c_size_t,
                                    C.POINTER(C.c_size_t)]),
        "nt_chat_apply_template": (C.c_int, [P, C.POINTER(ChatMessage), C.c_size_t, C.c_int, C.c_char_p,
                                             C.c_size_t, C.POINTER(C.c_size_t)]),
        "nt_sampling_params_default": (None, [C.POINTER(SamplingParams)]),
        "nt_session_create": (C.c_int, [P, C.POINTER(SamplingParams), C.POINTER(P)]),
        "nt_session_free": (None, [P]),
        "nt_session_set_sampling": (C.c_int, [P, C.POINTER(SamplingParams)]),
        "nt_session_submit_text": (C.c_int, [P, C.c_char_p, C.c_size_t, C.c_int]),
        "nt_session_submit_tokens": (C.c_int, [P, C.POINTER(C.c_int32), C.c_size_t]),
        "nt_session_reset": (C.c_int, [P]), "nt_session_n_tokens": (C.c_int32, [P]),
        "nt_session_generate": (C.c_int, [P, CALLBACK, C.c_void_p, C.POINTER(Result)]),
        "nt_session_next": (C.c_int, [P, C.POINTER(Token)]),
        "nt_session_cancel": (C.c_int, [P]), "nt_session_result": (C.c_int, [P, C.POINTER(Result)]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib


@pytest.fixture(scope="module")
def lib():
    return load_library()


def options(lib, **kw):
    o = ModelOptions()
    lib.nt_model_options_default(C.byref(o))
    o.device = b"cpu"
    o.n_ctx = 512
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def sampling(lib, **kw):
    p = SamplingParams()
    lib.nt_sampling_params_default(C.byref(p))
    p.temperature = 0.0
    for k, v in kw.items():
        setattr(p, k, v)
    return p


@pytest.fixture(scope="module")
def model(lib, smollm2):
    m = P()
    st = lib.nt_model_load(smollm2.encode(), C.byref(options(lib, n_seq=3)), C.byref(m))
    assert st == NT_OK, lib.nt_last_error()
    yield m
    lib.nt_model_free(m)


class Session:
    def __init__(self, lib, model, **kw):
        self.lib, self.s = lib, P()
        st = lib.nt_session_create(model, C.byref(sampling(lib, **kw)), C.byref(self.s))
        assert st == NT_OK, lib.nt_last_error()

    def submit(self, text, special=True):
        b = text.encode()
        return self.lib.nt_session_submit_text(self.s, b, len(b), int(special))

    def generate(self, stop_after=None):
        """(status, [(id, text, logprob)], Result)."""
        toks = []

        def cb(tp, _):
            t = tp.contents
            toks.append((t.id, C.string_at(t.text, t.text_len).decode("utf-8", "replace"), t.logprob))
            return 1 if stop_after is not None and len(toks) >= stop_after else 0

        r = Result()
        st = self.lib.nt_session_generate(self.s, CALLBACK(cb), None, C.byref(r))
        return st, toks, r

    def iterate(self):
        toks, t = [], Token()
        while (st := self.lib.nt_session_next(self.s, C.byref(t))) == NT_OK:
            toks.append((t.id, C.string_at(t.text, t.text_len).decode("utf-8", "replace"), t.logprob))
        return st, toks

    def free(self):
        self.lib.nt_session_free(self.s)


def text_of(toks):
    return "".join(t for _, t, _ in toks)


def cli_generate(cli, model, prompt, n):
    r = subprocess.run([cli, "generate", "-m", model, "-p", prompt, "-n", str(n), "--temp", "0", "-c", "512",
                        "--device", "cpu"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout[:-1]


def test_errors_and_messages(lib):
    assert lib.nt_version().decode().count(".") == 2
    assert lib.nt_status_name(NT_ERR_BUSY) == b"NT_ERR_BUSY"
    m = P()
    assert lib.nt_model_load(b"/no/such/model.gguf", None, C.byref(m)) == NT_ERR_LOAD
    msg = lib.nt_last_error().decode()
    assert "/no/such/model.gguf" in msg and msg.endswith(".")
    assert not m.value
    o = options(lib)
    o.size = 8  # built against another header
    assert lib.nt_model_load(b"x", C.byref(o), C.byref(m)) == NT_ERR_INVALID_ARGUMENT
    assert "nt_model_options_default" in lib.nt_last_error().decode()
    assert lib.nt_model_load(b"x", C.byref(options(lib, n_seq=0)), C.byref(m)) == NT_ERR_INVALID_ARGUMENT
    assert lib.nt_model_load(None, None, C.byref(m)) == NT_ERR_INVALID_ARGUMENT
    # The last error belongs to the thread that failed.
    seen = {}
    t = threading.Thread(target=lambda: seen.setdefault("other", lib.nt_last_error()))
    t.start()
    t.join()
    assert seen["other"] == b"" and lib.nt_last_error() != b""


def test_weight_budget(lib, smollm2):
    m = P()
    st = lib.nt_model_load(smollm2.encode(), C.byref(options(lib, ram_budget=50 << 20)), C.byref(m))
    assert st == NT_ERR_OUT_OF_MEMORY and "budget" in lib.nt_last_error().decode()
    st = lib.nt_model_load(smollm2.encode(), C.byref(options(lib, ram_budget=1 << 30)), C.byref(m))
    assert st == NT_OK
    lib.nt_model_free(m)


def test_tokenizer_against_llama_cpp(lib, model, smollm2):
    llama_cpp = pytest.importorskip("llama_cpp")
    ref = llama_cpp.Llama(model_path=smollm2, vocab_only=True, verbose=False)
    for text in ["Hello, world!", "<|im_start|>user\nHi there<|im_end|>\n", "naïve café 日本語 🦙", "  spaces  "]:
        b = text.encode()
        n = C.c_size_t()
        assert lib.nt_tokenize(model, b, len(b), 1, 1, None, 0, C.byref(n)) == NT_ERR_BUFFER_TOO_SMALL
        buf = (C.c_int32 * n.value)()
        assert lib.nt_tokenize(model, b, len(b), 1, 1, buf, n.value, C.byref(n)) == NT_OK
        ids = list(buf[: n.value])
        assert ids == ref.tokenize(b, add_bos=True, special=True), text
        # And back: the length needed, then the text.
        length = C.c_size_t()
        arr = (C.c_int32 * len(ids))(*ids)
        assert lib.nt_detokenize(model, arr, len(ids), 1, None, 0, C.byref(length)) == NT_ERR_BUFFER_TOO_SMALL
        out = C.create_string_buffer(length.value + 1)
        assert lib.nt_detokenize(model, arr, len(ids), 1, out, length.value + 1, C.byref(length)) == NT_OK
        assert out.value.decode() == text
    assert lib.nt_model_n_vocab(model) == ref.n_vocab()
    assert lib.nt_model_n_ctx(model) == 512 and lib.nt_model_n_seq(model) == 3
    assert lib.nt_model_backend(model) == b"cpu"
    assert lib.nt_token_is_eog(model, lib.nt_token_eos(model)) == 1
    bad = (C.c_int32 * 1)(10**9)
    assert lib.nt_detokenize(model, bad, 1, 0, None, 0, C.byref(length)) == NT_ERR_INVALID_ARGUMENT


def test_generate_matches_cli_and_iterator(lib, model, cli, smollm2):
    prompt = "The capital of France is"
    ref = cli_generate(cli, smollm2, prompt, 16)
    a = Session(lib, model, max_tokens=16)
    b = Session(lib, model, max_tokens=16)
    try:
        assert a.submit(prompt) == NT_OK and b.submit(prompt) == NT_OK
        st, toks, r = a.generate()
        assert st == NT_OK
        assert text_of(toks) == ref  # the same computation as the CLI's: exactly the same text
        assert r.finish == NT_FINISH_LENGTH and r.n_generated == 16 and r.n_prompt == 5
        assert all(lp <= 0 for _, _, lp in toks)
        # The iterator on another (fresh) sequence yields the same tokens, then NT_DONE.
        st, it = b.iterate()
        assert st == NT_DONE and [(i, t) for i, t, _ in it] == [(i, t) for i, t, _ in toks]
        r2 = Result()
        assert lib.nt_session_result(b.s, C.byref(r2)) == NT_OK and r2.n_generated == 16
        assert lib.nt_session_n_tokens(a.s) == 5 + 16
    finally:
        a.free()
        b.free()


def test_callback_stop_cancel_and_continue(lib, model):
    s = Session(lib, model, max_tokens=200)
    try:
        assert s.submit("Once upon a time") == NT_OK
        st, toks, r = s.generate(stop_after=5)
        assert st == NT_OK and r.finish == NT_FINISH_CALLBACK and len(toks) == 5 and r.n_generated == 5
        # The session continues after what the caller saw.
        n_before = lib.nt_session_n_tokens(s.s)
        assert n_before == 4 + 5
        # Cancel from another thread while generating.
        timer = threading.Timer(0.3, lambda: lib.nt_session_cancel(s.s))
        t0 = time.time()
        timer.start()
        st, toks, r = s.generate()
        assert st == NT_ERR_CANCELLED and r.finish == NT_FINISH_CANCELLED
        assert time.time() - t0 < 3 and len(toks) < 200
        assert lib.nt_session_n_tokens(s.s) == n_before + len(toks)
        # A running generation blocks input until it ends.
        t = Token()
        assert lib.nt_session_next(s.s, C.byref(t)) == NT_OK
        assert s.submit(" more") == NT_ERR_BUSY
        assert lib.nt_session_cancel(s.s) == NT_OK
        assert lib.nt_session_next(s.s, C.byref(t)) == NT_ERR_CANCELLED
        assert s.submit(" more") == NT_OK
    finally:
        s.free()


def test_sessions_limit_and_context(lib, model):
    sessions = [Session(lib, model) for _ in range(3)]
    try:
        extra = P()
        assert lib.nt_session_create(model, None, C.byref(extra)) == NT_ERR_BUSY
        assert "sequences" in lib.nt_last_error().decode()
        sessions.pop().free()
        assert lib.nt_session_create(model, None, C.byref(extra)) == NT_OK
        lib.nt_session_free(extra)
        s = sessions[0]
        ids = (C.c_int32 * 600)(*([1000] * 600))
        assert lib.nt_session_submit_tokens(s.s, ids, 600) == NT_ERR_CONTEXT_FULL
        assert lib.nt_session_submit_tokens(s.s, ids, 100) == NT_OK
        bad = (C.c_int32 * 1)(-3)
        assert lib.nt_session_submit_tokens(s.s, bad, 1) == NT_ERR_INVALID_ARGUMENT
        r = Token()
        assert lib.nt_session_reset(s.s) == NT_OK
        assert lib.nt_session_next(s.s, C.byref(r)) == NT_ERR_INVALID_ARGUMENT  # nothing submitted
        p = sampling(lib)
        p.top_p = 2.0
        assert lib.nt_session_set_sampling(s.s, C.byref(p)) == NT_ERR_INVALID_ARGUMENT
        assert "top_p" in lib.nt_last_error().decode()
    finally:
        for s in sessions:
            s.free()


def test_sessions_on_threads_share_steps(lib, model):
    """Two sessions generating on two threads at once get exactly their single-run tokens and
    log-probabilities (the CPU backend is batch-invariant; see server_helpers)."""
    prompts = ["The capital of France is", "def fibonacci(n):"]
    single = []
    for p in prompts:
        s = Session(lib, model, max_tokens=24)
        s.submit(p)
        single.append(s.generate()[1])
        s.free()
    sessions = [Session(lib, model, max_tokens=24) for _ in prompts]
    out = [None, None]

    def run(i):
        out[i] = sessions[i].generate()

    try:
        for s, p in zip(sessions, prompts):
            s.submit(p)
        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for ref, (st, got, _) in zip(single, out):
            assert st == NT_OK
            assert got == ref
    finally:
        for s in sessions:
            s.free()


def test_chat_template_and_cache_reuse(lib, model):
    s = Session(lib, model, max_tokens=32)
    try:
        def render(msgs):
            arr = (ChatMessage * len(msgs))(*[ChatMessage(r.encode(), c.encode()) for r, c in msgs])
            n = C.c_size_t()
            assert lib.nt_chat_apply_template(model, arr, len(msgs), 1, None, 0, C.byref(n)) == NT_ERR_BUFFER_TOO_SMALL
            buf = C.create_string_buffer(n.value + 1)
            assert lib.nt_chat_apply_template(model, arr, len(msgs), 1, buf, n.value + 1, C.byref(n)) == NT_OK
            return buf.value.decode()

        conv = [("user", "What is the capital of France?")]
        text = render(conv)
        assert text == "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
        s.submit(text)
        st, toks, r1 = s.generate()
        assert st == NT_OK and r1.finish == NT_FINISH_STOP and "Paris" in text_of(toks)
        conv += [("assistant", text_of(toks)), ("user", "And of Italy?")]
        assert lib.nt_session_reset(s.s) == NT_OK
        s.submit(render(conv))
        total = lib.nt_session_n_tokens(s.s)
        st, toks2, r2 = s.generate()
        assert st == NT_OK and "Rome" in text_of(toks2)
        # Only the new turn went through the model: the first was still in the cache.
        assert r2.n_prompt < total - r1.n_prompt
    finally:
        s.free()


def test_install_and_build_the_example_against_it(smollm2):
    with tempfile.TemporaryDirectory() as tmp:
        prefix, build = pathlib.Path(tmp) / "prefix", pathlib.Path(tmp) / "example"
        r = subprocess.run(["cmake", "--install", str(BUILD), "--prefix", str(prefix), "--component", "Unspecified"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        libdir = next(p for p in (prefix / "lib", prefix / "lib64", prefix / "lib/x86_64-linux-gnu") if p.exists())
        assert (prefix / "include" / "ntransformer.h").exists()
        assert (libdir / "cmake" / "ntransformer" / "ntransformerConfig.cmake").exists()
        # Only the C API is exported.
        nm = subprocess.run(["nm", "-D", "--defined-only", str(libdir / "libntransformer.so")], capture_output=True,
                            text=True, check=True).stdout.split("\n")
        exported = {line.split()[-1] for line in nm if line.strip()}
        assert exported and all(name.startswith("nt_") for name in exported), sorted(exported)[:10]
        r = subprocess.run(["cmake", "-S", str(ROOT / "examples"), "-B", str(build), f"-DCMAKE_PREFIX_PATH={prefix}"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        r = subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        env = dict(os.environ, LD_LIBRARY_PATH=str(libdir))
        r = subprocess.run([str(build / "nt_example_chat"), smollm2], capture_output=True, text=True, env=env,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        assert "> What is the capital of France?\n" in r.stdout and "Paris" in r.stdout and "Rome" in r.stdout
        in_tree = BUILD / "examples" / "nt_example_chat"
        if in_tree.exists():
            assert subprocess.run([str(in_tree), smollm2], capture_output=True, text=True).stdout == r.stdout
