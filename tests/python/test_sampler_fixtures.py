"""The committed sampler fixture must be what llama.cpp's samplers (llama-cpp-python) produce
today, so tests/unit/test_sampler.cpp compares our Sampler with llama.cpp itself."""
import pytest

import gen_sampler_fixtures as gen


def _tokens(text):
    return [line.split() for line in text.splitlines()]


def test_fixture_matches_fresh_llama_cpp_run():
    pytest.importorskip("llama_cpp")
    with open(gen.DEFAULT_OUT) as f:
        committed = _tokens(f.read())
    fresh = _tokens(gen.build())
    hint = "run tests/python/gen_sampler_fixtures.py and commit the result"
    assert len(committed) == len(fresh), hint
    for n, (old, new) in enumerate(zip(committed, fresh)):
        assert len(old) == len(new), f"line {n + 1}: {hint}"
        # Everything llama.cpp decides (cases, logits, penalties, which candidates survive) must
        # match exactly. The kept probabilities are the generator's own float64 softmax of what
        # llama.cpp leaves: numpy's exp and sum may round the last bit differently from one
        # machine to another, so those agree to 1e-12.
        for a, b in zip(old, new):
            if old[0] == "kept" and ":" in a:
                ta, pa = a.split(":")
                tb, pb = b.split(":")
                assert ta == tb, f"line {n + 1}: {hint}"
                assert float(pa) == pytest.approx(float(pb), rel=1e-12, abs=1e-300), f"line {n + 1}"
            else:
                assert a == b, f"line {n + 1}: {hint}"
