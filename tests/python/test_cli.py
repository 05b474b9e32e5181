"""The ntransformer command as a user meets it: help, errors, and each subcommand end to end."""
import json
import os
import subprocess

import pytest

import llama_cpp

M_ARGS = lambda m: ["-m", m, "--device", "cpu"]


def run(cli, *args, input=None, timeout=300):
    return subprocess.run([cli, *args], capture_output=True, text=True, input=input, timeout=timeout)


@pytest.mark.parametrize("cmd", ["generate", "chat", "perplexity", "tokenize", "info", "bench"])
def test_every_subcommand_has_help(cli, cmd):
    r = run(cli, cmd, "--help")
    assert r.returncode == 0
    assert r.stdout.startswith(f"usage: ntransformer {cmd}")


def test_top_level_help_lists_commands(cli):
    r = run(cli, "--help")
    assert r.returncode == 0
    for cmd in ["generate", "chat", "perplexity", "tokenize", "info", "bench"]:
        assert cmd in r.stdout


@pytest.mark.parametrize("args,fragment", [
    (["frobnicate"], "unknown command 'frobnicate'"),
    (["generate", "--bogus"], "unknown option '--bogus'"),
    (["generate", "-m", "/nonexistent.gguf", "-p", "hi"], "cannot open"),
    (["generate", "-p", "hi"], "no model given"),
    (["generate", "-m", "x", "-n", "abc"], "expected an integer"),
    (["info", "-m", os.path.abspath(__file__)], "not a GGUF file"),
    (["tokenize", "-m", "x"], "no text given"),
])
def test_user_errors_are_one_sentence_and_exit_1(cli, args, fragment):
    r = run(cli, *args)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], r.stderr


def test_prompt_longer_than_context_is_refused(cli, smollm2):
    r = run(cli, "generate", *M_ARGS(smollm2), "-p", "word " * 200, "-c", "64", "-n", "4")
    assert r.returncode == 1 and "context holds 64" in r.stderr


def test_truncated_model_is_refused(cli, smollm2, tmp_path):
    bad = tmp_path / "trunc.gguf"
    with open(smollm2, "rb") as f:
        bad.write_bytes(f.read(5_000_000))
    r = run(cli, "generate", "-m", str(bad), "-p", "hi")
    assert r.returncode == 1 and "trunc.gguf" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_tokenize_ids_equal_llamacpp(cli, smollm2):
    text = "Hello, world! 1234 <|im_start|>user\nHow are you? 你好 🎉"
    r = run(cli, "tokenize", "-m", smollm2, "-p", text, "--ids")
    assert r.returncode == 0
    ours = json.loads(r.stdout)
    ref = llama_cpp.Llama(model_path=smollm2, vocab_only=True, verbose=False).tokenize(text.encode(), add_bos=True,
                                                                                       special=True)
    assert ours == ref


def test_generate_streams_continuation_and_reports_speed(cli, smollm2):
    r = run(cli, "generate", *M_ARGS(smollm2), "-p", "The capital of France is", "-n", "8", "--temp", "0")
    assert r.returncode == 0
    assert "Paris" in r.stdout
    assert "prompt:" in r.stderr and "tok/s" in r.stderr


def test_exact_is_accepted_and_changes_nothing_on_the_cpu(cli, smollm2):
    # --exact asks a GPU for the CPU's arithmetic on prompts; the CPU backend is that already.
    args = ["generate", *M_ARGS(smollm2), "-p", "The capital of France is", "-n", "8", "--temp", "0"]
    a, b = run(cli, *args), run(cli, *args, "--exact")
    assert a.returncode == 0 and b.returncode == 0, b.stderr
    assert a.stdout == b.stdout


def test_prompt_longer_than_a_step_gives_the_same_text(cli, smollm2):
    # -b 3: the prompt goes in chunks of 3 tokens, the first ones wanting no logits.
    args = ["generate", *M_ARGS(smollm2), "-p", "The capital of France is", "-n", "8", "--temp", "0"]
    a, b = run(cli, *args), run(cli, *args, "-b", "3")
    assert a.returncode == 0 and b.returncode == 0, b.stderr
    assert a.stdout == b.stdout


def test_generate_seed_is_reproducible(cli, smollm2):
    args = ["generate", *M_ARGS(smollm2), "-p", "Once upon a time", "-n", "16", "--temp", "1.0", "--seed", "42"]
    a, b = run(cli, *args), run(cli, *args)
    assert a.returncode == 0 and a.stdout == b.stdout
    c = run(cli, *args[:-1], "43")
    assert c.stdout != a.stdout


def test_chat_answers_over_two_turns(cli, smollm2):
    r = run(cli, "chat", *M_ARGS(smollm2), "--temp", "0", "-n", "24",
            input="What is the capital of France?\nAnd of Italy?\n/exit\n")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "Paris" in out and "Rome" in out


def test_chat_unknown_template_override_is_refused(cli, smollm2):
    r = run(cli, "chat", *M_ARGS(smollm2), "--chat-template", "nonsense", input="")
    assert r.returncode == 1 and "chatml" in r.stderr


def test_perplexity_prints_estimate_with_error(cli, smollm2):
    sample = os.path.join(os.path.dirname(__file__), "..", "data", "sample.txt")
    r = run(cli, "perplexity", *M_ARGS(smollm2), "-f", sample, "-c", "128", "--chunks", "3")
    assert r.returncode == 0, r.stderr
    assert "[1]" in r.stdout and "[3]" in r.stdout
    line = [l for l in r.stdout.splitlines() if l.startswith("Final estimate")][0]
    ppl, err = float(line.split("=")[1].split("+/-")[0]), float(line.split("+/-")[1])
    assert 1.5 < ppl < 60 and 0 < err < ppl


def test_info_shows_layers_and_types(cli, smollm2):
    r = run(cli, "info", "-m", smollm2)
    assert r.returncode == 0
    assert "q4_1" in r.stdout and "blk.29" in r.stdout and "tied" in r.stdout


def test_bench_json(cli, smollm2):
    r = run(cli, "bench", *M_ARGS(smollm2), "-p", "16", "-n", "4", "-r", "1", "--ceiling", "10", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["pp"]["tok_s"] > 0 and j["tg"]["tok_s"] > 0
    assert j["decode_bytes_per_token"] > 90 * 2**20
    assert j["backend"] == "cpu" and j["exact"] is True  # the CPU's arithmetic is the CPU backend's


def test_bench_readback_modes(cli, smollm2):
    # What a tg step copies back; a backend that cannot feed tokens on the device (the CPU) runs
    # `fed` as `top` and `drawn` as `sampled`.
    for mode, want in [("fed", ("fed", "top")), ("drawn", ("drawn", "sampled")), ("top", ("top",)),
                       ("sampled", ("sampled",)), ("row", ("row",)), ("none", ("none",))]:
        r = run(cli, "bench", *M_ARGS(smollm2), "-p", "0", "-n", "4", "-r", "1", "--ceiling", "10", "--json",
                "--readback", mode)
        assert r.returncode == 0, r.stderr
        j = json.loads(r.stdout)
        assert j["tg"]["readback"] in want and j["tg"]["tok_s"] > 0
    r = run(cli, "bench", *M_ARGS(smollm2), "-p", "0", "-n", "4", "--readback", "bogus")
    assert r.returncode == 1 and "--readback" in r.stderr and len(r.stderr.strip().splitlines()) == 1
