#!/usr/bin/env python3
"""Writes the fixture that tests/unit/test_chat_template.cpp compares our C++ rendering against, from
two independent references:
  - llama.cpp itself: llama_chat_apply_template through llama-cpp-python, given the Jinja source
    (so llama.cpp also does the detection) or, for formats without a template here, its name;
  - the real Jinja rendering (jinja2) of the templates below.

Templates:
  - ChatML: the tokenizer.chat_template of SmolLM2-135M-Instruct, read from its GGUF file with gguf-py.
  - Llama 3: the chat template of Meta-Llama-3-8B-Instruct (tokenizer_config.json), copied below.
  - Llama 2 and Mistral variants: llama.cpp's names only (llama.cpp's built-in renderer differs from
    those models' Jinja in spacing, and we follow llama.cpp).

Jinja is set up as Hugging Face transformers' apply_chat_template does (trim_blocks, lstrip_blocks).
Llama 3's template starts with bos_token; it is rendered with bos_token="" because llama.cpp (and we)
leave BOS to the tokenizer.

Usage: gen_chat_template_fixtures.py [--gguf PATH] [--out PATH]   (defaults below)
The fixture format is length-prefixed so that any bytes survive. First each template's source:
  template NAME KIND / source LEN + bytes
then the cases:
  case NAME / kind KIND / add_generation_prompt 0|1 / messages N / role LEN + bytes /
  content LEN + bytes / llamacpp LEN + bytes / [jinja LEN + bytes] / end
"""
import argparse
import os
import sys

import ctypes

import jinja2

HERE = os.path.dirname(os.path.abspath(__file__))
# The default model, as fetched by scripts/fetch-model.sh (tests/python/conftest.py uses the same).
DEFAULT_GGUF = os.path.join(HERE, "..", "..", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_OUT = os.path.join(HERE, "chat_template_fixtures.txt")

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

SYS = {"role": "system", "content": "You are a helpful assistant"}

# Conversations exercised on every template. Content stays within ASCII whitespace for the
# trimming cases: Python's str.strip() also strips Unicode spaces, llama.cpp's trim does not.
CONVERSATIONS = {
    "single_turn": [SYS, {"role": "user", "content": "Hello"}],
    "multi_turn": [
        SYS,
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there"},
        {"role": "user", "content": "Who are you"},
        {"role": "assistant", "content": "   I am an assistant   "},
        {"role": "user", "content": "Another question"},
    ],
    "whitespace_and_unicode": [
        {"role": "system", "content": "\n  Be terse.\t\n"},
        {"role": "user", "content": "  Déjà vu? 日本語 ✓\n\nline two  "},
        {"role": "assistant", "content": "\tsure\n"},
        {"role": "user", "content": "<b>tags</b> & {{ braces }} {% not jinja %}"},
    ],
    "empty_contents": [
        {"role": "system", "content": ""},
        {"role": "user", "content": ""},
    ],
    # No system message: SmolLM2's template inserts its own default system prompt here, llama.cpp's
    # ChatML path does not (the C++ test checks that this is the only difference).
    "no_system": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ],
}


def read_gguf_template(path):
    from gguf import GGUFReader

    field = GGUFReader(path).fields.get("tokenizer.chat_template")
    if field is None:
        sys.exit(f"{path} has no tokenizer.chat_template")
    return field.contents()


def render(source, messages, add_generation_prompt, bos_token="", eos_token=""):
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    return env.from_string(source).render(
        messages=messages, add_generation_prompt=add_generation_prompt,
        bos_token=bos_token, eos_token=eos_token)


LLAMACPP_ONLY_KINDS = ["llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "mistral-v1",
                       "mistral-v3", "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken"]


def llama_cpp_render(tmpl, messages, add_generation_prompt):
    import llama_cpp

    keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
    chat = (llama_cpp.llama_chat_message * len(keep))(
        *[llama_cpp.llama_chat_message(role=r, content=c) for r, c in keep])
    size = 1 << 16
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_chat_apply_template(tmpl.encode(), chat, len(keep), add_generation_prompt,
                                            buf, size)
    if n < 0 or n > size:
        sys.exit(f"llama.cpp could not render template {tmpl[:40]!r} (returned {n})")
    return buf.raw[:n].decode("utf-8")


def build(gguf_path):
    templates = [("smollm2", "chatml", read_gguf_template(gguf_path)),
                 ("llama3_instruct", "llama3", LLAMA3_TEMPLATE)]
    cases = []
    for tname, kind, source in templates:
        for cname, messages in CONVERSATIONS.items():
            for gen in (True, False):
                cases.append({
                    "name": f"{tname}/{cname}/{'gen' if gen else 'nogen'}",
                    "kind": kind,
                    "add_generation_prompt": gen,
                    "messages": messages,
                    "llamacpp": llama_cpp_render(source, messages, gen),
                    "jinja": render(source, messages, gen),
                })
    for kind in LLAMACPP_ONLY_KINDS:
        for cname, messages in CONVERSATIONS.items():
            cases.append({
                "name": f"{kind}/{cname}",
                "kind": kind,
                "add_generation_prompt": True,
                "messages": messages,
                "llamacpp": llama_cpp_render(kind, messages, True),
            })
    return templates, cases


def serialize(templates, cases):
    out = bytearray(b"# Generated by tests/python/gen_chat_template_fixtures.py from real Jinja "
                    b"renderings; do not edit.\n")

    def blob(tag, text):
        data = text.encode("utf-8")
        out.extend(f"{tag} {len(data)}\n".encode())
        out.extend(data)
        out.extend(b"\n")

    for tname, kind, source in templates:
        out.extend(f"template {tname} {kind}\n".encode())
        blob("source", source)
    for c in cases:
        out.extend(f"case {c['name']}\nkind {c['kind']}\n".encode())
        out.extend(f"add_generation_prompt {int(c['add_generation_prompt'])}\n".encode())
        out.extend(f"messages {len(c['messages'])}\n".encode())
        for m in c["messages"]:
            blob("role", m["role"])
            blob("content", m["content"])
        blob("llamacpp", c["llamacpp"])
        if "jinja" in c:
            blob("jinja", c["jinja"])
        out.extend(b"end\n")
    return bytes(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", default=DEFAULT_GGUF)
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()
    data = serialize(*build(args.gguf))
    with open(args.out, "wb") as f:
        f.write(data)
    print(f"wrote {args.out} ({len(data)} bytes)")


if __name__ == "__main__":
    main()
