"""The committed chat-template fixture must be exactly what llama.cpp (llama-cpp-python) and jinja2
render today, so the C++ test (tests/unit/test_chat_template.cpp) compares against them, not against
hand-written strings."""
import gen_chat_template_fixtures as gen
import pytest


def test_fixture_matches_fresh_rendering(smollm2):
    pytest.importorskip("llama_cpp")
    fresh = gen.serialize(*gen.build(smollm2))
    with open(gen.DEFAULT_OUT, "rb") as f:
        committed = f.read()
    assert committed == fresh, "run tests/python/gen_chat_template_fixtures.py and commit the result"


def test_smollm2_template_inserts_default_system_prompt(smollm2):
    # Documents the one place where we follow llama.cpp rather than the model's Jinja.
    source = gen.read_gguf_template(smollm2)
    out = gen.render(source, [{"role": "user", "content": "hi"}], True)
    assert out.startswith("<|im_start|>system\n") and "SmolLM" in out
