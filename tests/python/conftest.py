"""Shared fixtures: where the build and the default model are.

NT_BUILD_DIR (default: build) points at the CMake build; the default model is fetched by
scripts/fetch-model.sh into models/. Tests that need the model fail when it is missing, unless
NT_ALLOW_MISSING_MODEL=1 (then they skip) — CI always fetches it.
"""
import os
import pathlib

import pytest


def _reference_without_weight_repacking():
    """llama.cpp (the reference) on its plain CPU kernels: a llama-cpp-python built on a CPU with
    AMX repacks weights for its AMX matmul, which crashed (SIGSEGV in ggml_backend_amx_mul_mat)
    on such a CI machine. Its extra buffer types are off for every model the tests load."""
    try:
        import llama_cpp.llama_cpp as lc
    except ImportError:
        return
    default = lc.llama_model_default_params
    if getattr(default, "_nt_no_extra_bufts", False):
        return

    def params():
        p = default()
        if hasattr(p, "use_extra_bufts"):
            p.use_extra_bufts = False
        return p

    params._nt_no_extra_bufts = True
    lc.llama_model_default_params = params


_reference_without_weight_repacking()

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("NT_BUILD_DIR", ROOT / "build"))
SMOLLM2 = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def tool(name):
    for p in (BUILD / "tests" / "tools" / name, BUILD / name):
        if p.exists():
            return str(p)
    pytest.fail(f"{name} is not built in {BUILD}; build the project first (NT_BUILD_DIR)")


@pytest.fixture(scope="session")
def smollm2():
    if not SMOLLM2.exists():
        if os.environ.get("NT_ALLOW_MISSING_MODEL") == "1":
            pytest.skip("default model not fetched")
        pytest.fail(f"{SMOLLM2} is missing; run scripts/fetch-model.sh")
    return str(SMOLLM2)


@pytest.fixture(scope="session")
def cli():
    p = BUILD / "ntransformer"
    if not p.exists():
        pytest.fail(f"ntransformer is not built in {BUILD}")
    return str(p)
