"""The committed chat-template fixture must be exactly what llama.cpp (llama-cpp-python) and jinja2
render today, so the C++ test (tests/unit/test_chat_template.cpp) compares against them, not against
hand-written strings."""
import os

import pytest

import gen_chat_template_fixtures as gen


def test_fixture_matches_fresh_rendering():
    pytest.importorskip("llama_cpp")
    if not os.path.exists(gen.DEFAULT_GGUF):
        pytest.skip(f"SmolLM2 GGUF not found at {gen.DEFAULT_GGUF}")
    fresh = gen.serialize(*gen.build(gen.DEFAULT_GGUF))
    with open(gen.DEFAULT_OUT, "rb") as f:
        committed = f.read()
    assert committed == fresh, "run tests/python/gen_chat_template_fixtures.py and commit the result"


def test_smollm2_template_inserts_default_system_prompt():
    # Documents the one place where we follow llama.cpp rather than the model's Jinja.
    if not os.path.exists(gen.DEFAULT_GGUF):
        pytest.skip(f"SmolLM2 GGUF not found at {gen.DEFAULT_GGUF}")
    source = gen.read_gguf_template(gen.DEFAULT_GGUF)
    out = gen.render(source, [{"role": "user", "content": "hi"}], True)
    assert out.startswith("<|im_start|>system\n") and "SmolLM" in out
