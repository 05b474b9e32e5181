"""The committed sampler fixture must be exactly what llama.cpp's samplers (llama-cpp-python)
produce today, so tests/unit/test_sampler.cpp compares our Sampler with llama.cpp itself."""
import pytest

import gen_sampler_fixtures as gen


def test_fixture_matches_fresh_llama_cpp_run():
    pytest.importorskip("llama_cpp")
    with open(gen.DEFAULT_OUT) as f:
        committed = f.read()
    assert committed == gen.build(), "run tests/python/gen_sampler_fixtures.py and commit the result"
