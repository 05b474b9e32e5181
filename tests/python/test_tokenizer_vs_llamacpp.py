"""Our tokenizer against llama.cpp (llama-cpp-python) on the same GGUF vocabularies.

Vocabularies: SmolLM2 (byte-level BPE, pre=smollm); a SentencePiece model trained here with the
`sentencepiece` package and written as a vocab-only GGUF (tokenizer.ggml.model=llama, byte
fallback, control and user-defined pieces), in two flag variants; a byte-level BPE trained here
with the `tokenizers` package, written with pre=llama-bpe and, to cover the other
pre-tokenizers, also as qwen2, gpt-2, smollm and default. For each: token ids for a varied
corpus plus seeded random texts (with and without BOS, with and without special-token parsing)
must be identical, every token's piece must equal llama.cpp's, the special-token facts (BOS, EOS,
EOT, end-of-generation set) must agree, decode(encode(text)) must give the text back, the stream
decoder must emit only valid UTF-8 that adds up to the same text, and 100 KB must encode fast.

Our side runs through tests/tools/nt_tokenize (built with the project; NT_BUILD_DIR).
"""
import ctypes
import json
import os
import random
import subprocess

import pytest

from conftest import tool

if os.environ.get("NT_ALLOW_MISSING_REFERENCE") == "1":
    llama_cpp = pytest.importorskip("llama_cpp")
else:
    import llama_cpp  # the reference; a missing one is a failure, not a skip

# --------------------------------------------------------------------------------------------
# Texts

CORPUS = [
    b"",
    b" ",
    b"a",
    b"Hello world",
    b" Hello world",
    b"Hello  world   with    runs of     spaces",
    b"The quick brown fox jumps over the lazy dog. It's 5 o'clock; we'll see, they've gone!",
    b"I'M SURE YOU'RE RIGHT, HE'D SAY IT'S THEY'VE WE'LL DON'T 'S 'T 'RE 'VE 'M 'LL 'D",
    b"def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    b"#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    b"for (int i = 0; i < n; ++i) { a[i] += b[i] * c; }  // comment\r\n",
    b"x=1;y=22;z=333;w=4444;v=55555;u=666666;t=1234567890123",
    b"3.14159265358979 2,718,281 1e-9 0x1F -42 +7 100% $19.99",
    b"\t\ttabs\tand\nnewlines\n\n\nand\r\ncarriage\r\rreturns \n \n  \n",
    b"   leading and trailing spaces   ",
    b"\n\n\n",
    b"\t",
    "Ünïcödé naïve café résumé façade Ångström Øresund straße".encode(),
    "e\u0301 a\u0308 c\u0327 n\u0303 combining \u0301\u0302\u0303 marks".encode(),
    "東京は日本の首都です。中文字符测试，标点符号！".encode(),
    "ひらがな カタカナ 한국어 텍스트".encode(),
    "مرحبا بالعالم، هذا اختبار ١٢٣٤٥".encode(),
    "שלום עולם नमस्ते दुनिया สวัสดีชาวโลก".encode(),
    "Emoji 😀😃😄 👍🏽 ❤️ 🏳️‍🌈 👨‍👩‍👧‍👦 👩🏾‍💻 🇫🇷🇯🇵".encode(),
    "😀".encode(),
    "numbers ① ② Ⅻ ٣٤٥ ½ ¾ ²³ ٠١٢".encode(),
    "unicode spaces:\u00a0nbsp\u2003em\u3000ideo\u2028ls\u0085nel\u200bzwsp".encode(),
    "private \ue000\ue001 unassigned \u0378 \U0001CC00 new-in-16".encode(),
    "mixed: hello世界123abc😀def\u00e9\u0301!!!???...".encode(),
    b"<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    b"<|im_start|><|im_end|><|endoftext|>",
    b"text<|im_start|>text<|im_st <|im_end|",
    b"<s>Hello</s> <s> </s><unk>",
    b"<tool>call</tool> [INST] do it [/INST]",
    b"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    b"a<|eot_id|>b<|end_of_text|>c<tool_call>d",
    b"invalid \xff bytes \xc3 here \xe2\x82 and \x80 there",
    b"\xed\xa0\x80 surrogate \xc0\xaf overlong \xf0\x9f\x98 truncated emoji",
    b"\xff\xfe\xfd",
    b"nul\x00byte",
    b"\x01\x02\x1b[0m control chars \x7f",
    b"a" * 300,
    b" " * 100 + b"x",
    b"9" * 50,
    ("x" * 40 + " ").encode() * 20,
    b"''''' ''s 's' 'S 'Ll",
    b"   \n\t  \r\n   end",
]

POOLS = [
    "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", "0123456789",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", " ", "  ", "\n", "\t", "\r\n",
    "éüßÀÑøçÆœ", "\u0301\u0308\u0327", "東京日本語中文字符测试", "ひらがなカタカナ", "한국어텍스트",
    "مرحبابالعالم", "שלוםעולם", "नमस्तेदुनिया", "สวัสดี", "😀👍🏽❤️🏳️‍🌈👨‍👩‍👧‍👦", "\u200d\ufe0f",
    "①②Ⅻ٣٤٥½", "\u00a0\u2003\u3000", "'s'S'll'RE've'd'M",
]
WORDS = ["the", "The", "token", "izer", "hello", "world", "don't", "it's", "WE'LL", "2024",
         "3.14", "print(x)", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>",
         "<tool>", "[INST]", "<|eot_id|>", "<|begin_of_text|>"]


def random_texts(seed, n):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 12)):
            if rng.random() < 0.35:
                parts.append(rng.choice(WORDS))
            else:
                pool = rng.choice(POOLS)
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 8))))
            parts.append(rng.choice(["", " ", " ", "  ", "\n", "\t", " \n "]))
        text = "".join(parts).encode()
        if rng.random() < 0.1:  # a stray byte somewhere
            i = rng.randrange(len(text) + 1)
            text = text[:i] + bytes([rng.choice([0x80, 0xbf, 0xc3, 0xe2, 0xf0, 0xff])]) + text[i:]
        out.append(text)
    return out


def random_codepoint_texts(seed, n):
    """Code points from every plane (unassigned, private use and characters newer than the
    tables included), mixed with ASCII, white space, contractions and numbers."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(0, 40)):
            r = rng.random()
            if r < 0.3:
                parts.append(chr(rng.randint(0x20, 0x7E)))
            elif r < 0.4:
                parts.append(rng.choice(" \t\n\r\x0b\x0c\x85\u00a0\u2028\u3000"))
            elif r < 0.7:
                cp = rng.randint(0x80, 0x2FFFF)
                parts.append(chr(cp if not 0xD800 <= cp < 0xE000 else 0x41))
            elif r < 0.8:
                parts.append(chr(rng.randint(0x300, 0x36F)))  # combining marks
            elif r < 0.9:
                parts.append(rng.choice(["'s", "'LL", "'Re", "'d", "'M", "'t", "'ve"]))
            else:
                parts.append(str(rng.randint(0, 10 ** 9)))
        out.append("".join(parts).encode())
    return out


def valid_utf8(b):
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def texts_for(seed):
    return CORPUS + random_texts(seed, 250) + random_codepoint_texts(seed, 150)


# --------------------------------------------------------------------------------------------
# Both tokenizers


def ours(model, texts, bos, special, decode=False):
    """Runs nt_tokenize --batch; returns ids per text (and decode/stream outputs with decode)."""
    args = [tool("nt_tokenize"), model, "--batch"] + (["--bos"] if bos else []) + \
        (["--special"] if special else []) + (["--decode"] if decode else [])
    data = b"".join(b"%d\n" % len(t) + t for t in texts)
    r = subprocess.run(args, input=data, capture_output=True, check=False)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    lines = r.stdout.decode().split("\n")
    per = 3 if decode else 1
    assert len(lines) == per * len(texts) + 1
    ids = [[int(x) for x in lines[per * i].split()] for i in range(len(texts))]
    if not decode:
        return ids
    decoded = [bytes.fromhex(lines[3 * i + 1]) for i in range(len(texts))]
    chunks = [[bytes.fromhex(c) for c in lines[3 * i + 2].split(",")] for i in range(len(texts))]
    return ids, decoded, chunks


def info(model):
    r = subprocess.run([tool("nt_tokenize"), model, "--info"], capture_output=True, check=True)
    kv = dict(line.split("=", 1) for line in r.stdout.decode().splitlines())
    return kv


class Reference:
    def __init__(self, path):
        self.m = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        self.vocab = llama_cpp.llama_model_get_vocab(self.m.model)

    def tokenize(self, text, bos, special):
        return self.m.tokenize(text, add_bos=bos, special=special)

    def piece(self, token, special):
        buf = ctypes.create_string_buffer(4096)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        assert 0 <= n <= len(buf)
        return buf.raw[:n]

    def n_vocab(self):
        return llama_cpp.llama_vocab_n_tokens(self.vocab)


def check_ids(path, texts):
    ref = Reference(path)
    for bos in (False, True):
        for special in (False, True):
            got = ours(path, texts, bos, special)
            for text, g in zip(texts, got):
                want = ref.tokenize(text, bos, special)
                assert g == want, f"bos={bos} special={special} text={text!r}"


def check_info_and_pieces(path):
    ref = Reference(path)
    kv = info(path)
    v = ref.vocab
    n = ref.n_vocab()
    assert int(kv["n_vocab"]) == n
    assert int(kv["bos"]) == llama_cpp.llama_vocab_bos(v)
    assert int(kv["eos"]) == llama_cpp.llama_vocab_eos(v)
    assert int(kv["eot"]) == llama_cpp.llama_vocab_eot(v)
    assert bool(int(kv["add_bos"])) == llama_cpp.llama_vocab_get_add_bos(v)
    want_eog = [i for i in range(n) if llama_cpp.llama_vocab_is_eog(v, i)]
    assert [int(x) for x in kv["eog"].split()] == want_eog
    # Every token's piece, with and without special rendering.
    for special in (False, True):
        want = [ref.piece(i, special) for i in range(n)]
        got = our_pieces(path, n, special)
        bad = [(i, g, w) for i, (g, w) in enumerate(zip(got, want)) if g != w]
        assert not bad, f"special={special}: {len(bad)} pieces differ, first {bad[:5]}"


def our_pieces(path, n, special):
    args = [tool("nt_tokenize"), path, "--pieces"] + (["--special"] if special else [])
    r = subprocess.run(args, capture_output=True, check=False)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    lines = r.stdout.decode().split("\n")
    assert len(lines) == n + 1
    return [bytes.fromhex(x) for x in lines[:n]]


def check_roundtrip(path, texts):
    # Texts without special or user-defined tokens, which would not come back as written.
    plain = [t for t in texts if valid_utf8(t) and b"<" not in t and b"[INST]" not in t]
    assert len(plain) > 100
    # The stream decoder keeps the space SentencePiece put in front; decode() drops it.
    prefix = b" " if info(path)["add_space_prefix"] == "1" else b""
    _, decoded, chunks = ours(path, plain, bos=False, special=False, decode=True)
    for text, d, c in zip(plain, decoded, chunks):
        assert d == text, f"decode(encode(x)) != x for {text!r}: {d!r}"
        for chunk in c:
            assert valid_utf8(chunk), f"stream chunk {chunk!r} of {text!r} is not UTF-8"
        if text:
            assert b"".join(c) == prefix + text, f"stream of {text!r} gave {b''.join(c)!r}"


def check_speed(path):
    rng = random.Random(7)
    words = [w.encode() for w in WORDS] + [t for t in CORPUS if t]
    text = b""
    while len(text) < 100_000:
        text += rng.choice(words) + rng.choice([b" ", b"\n", b" ", b""])
    r = subprocess.run([tool("nt_tokenize"), path, "--time", "--special"], input=text,
                       capture_output=True, check=True)
    ms = float(r.stderr.decode().split("encode_ms=")[1].split()[0])
    print(f"{path}: 100 KB encoded in {ms:.1f} ms")
    assert ms < 500, f"encoding 100 KB took {ms:.0f} ms"
    assert r.stdout.split() == [str(x).encode() for x in Reference(path).tokenize(text, False, True)]


# --------------------------------------------------------------------------------------------
# Vocabularies


def training_corpus(seed, n_lines):
    rng = random.Random(seed)
    english = ("the of and to in is you that it he was for on are as with his they at be this "
               "have from or one had by word but not what all were we when your can said there "
               "use an each which she do how their if will up other about out many then them "
               "these so some her would make like him into time has look two more write go see "
               "number no way could people my than first water been call who oil its now find "
               "tokenizer merge vocabulary sentence piece byte fallback function return value").split()
    lines = []
    for _ in range(n_lines):
        parts = []
        for _ in range(rng.randint(4, 16)):
            r = rng.random()
            if r < 0.6:
                w = rng.choice(english)
                parts.append(w.capitalize() if rng.random() < 0.1 else w)
            elif r < 0.7:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 6))))
            else:
                pool = rng.choice(POOLS[:-1])
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 5))))
        lines.append(" ".join(parts) + rng.choice([".", "!", "?", ",", "", " 's", "'t"]))
    return lines


def write_gguf(path, tokens, types, scores=None, merges=None, model="llama", pre=None,
               bos=1, eos=2, unk=None, extra_bool=()):
    import gguf
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if scores is not None:
        w.add_token_scores(scores)
    if merges is not None:
        w.add_token_merges(merges)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    if unk is not None:
        w.add_unk_token_id(unk)
    for key, value in extra_bool:
        w.add_bool(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


SPM_USER = ["<tool>", "[INST]", "[/INST]"]
SPM_CONTROL = ["<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def spm_vocab(tmp_path_factory):
    spm = pytest.importorskip("sentencepiece") if os.environ.get("NT_ALLOW_MISSING_REFERENCE") == "1" \
        else __import__("sentencepiece")
    d = tmp_path_factory.mktemp("spm")
    corpus = d / "corpus.txt"
    corpus.write_text("\n".join(training_corpus(1, 4000)), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(d / "m"), vocab_size=1200, model_type="bpe",
        byte_fallback=True, character_coverage=0.995, user_defined_symbols=SPM_USER,
        control_symbols=SPM_CONTROL, minloglevel=2, num_threads=1)
    sp = spm.SentencePieceProcessor(model_file=str(d / "m.model"))
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        tokens.append(piece)
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(2)
        elif sp.is_control(i):
            types.append(3)
        elif sp.is_byte(i):
            types.append(6)
        elif sp.is_unused(i):
            types.append(5)
        elif piece in SPM_USER:
            types.append(4)
        else:
            types.append(1)
    assert types.count(6) == 256 and types.count(4) == len(SPM_USER)
    return d, tokens, scores, types


@pytest.fixture(scope="module", params=["default", "no-prefix-eos"])
def spm_gguf(request, spm_vocab):
    d, tokens, scores, types = spm_vocab
    flags = () if request.param == "default" else (
        ("tokenizer.ggml.add_space_prefix", False), ("tokenizer.ggml.add_bos_token", False),
        ("tokenizer.ggml.add_eos_token", True))
    return write_gguf(d / f"spm-{request.param}.gguf", tokens, types, scores=scores, bos=1, eos=2,
                      unk=0, extra_bool=flags)


BPE_SPECIAL = [("<|begin_of_text|>", 3), ("<|end_of_text|>", 3), ("<|start_header_id|>", 3),
               ("<|end_header_id|>", 3), ("<|eot_id|>", 3), ("<|reserved_special_token_0|>", 3),
               ("<tool_call>", 4)]


@pytest.fixture(scope="module")
def bpe_vocab(tmp_path_factory):
    tk = pytest.importorskip("tokenizers") if os.environ.get("NT_ALLOW_MISSING_REFERENCE") == "1" \
        else __import__("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers
    tok = tk.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=3000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(training_corpus(2, 6000), trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab)))
    tokens = [t for t, _ in vocab]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    assert len(merges) > 1000
    types = [1] * len(tokens)
    for text, ty in BPE_SPECIAL:
        tokens.append(text)
        types.append(ty)
    return tmp_path_factory.mktemp("bpe"), tokens, types, merges


@pytest.fixture(scope="module", params=["llama-bpe", "qwen2", "gpt-2", "smollm", "default"])
def bpe_gguf(request, bpe_vocab):
    d, tokens, types, merges = bpe_vocab
    bos, eos = tokens.index("<|begin_of_text|>"), tokens.index("<|end_of_text|>")
    return write_gguf(d / f"bpe-{request.param}.gguf", tokens, types, merges=merges, model="gpt2",
                      pre=request.param, bos=bos, eos=eos)


# --------------------------------------------------------------------------------------------
# Tests


def test_smollm2_ids(smollm2):
    check_ids(smollm2, texts_for(11))


def test_smollm2_info_and_pieces(smollm2):
    check_info_and_pieces(smollm2)


def test_smollm2_roundtrip(smollm2):
    check_roundtrip(smollm2, texts_for(12))


def test_smollm2_speed(smollm2):
    check_speed(smollm2)


def test_spm_ids(spm_gguf):
    check_ids(spm_gguf, texts_for(21))


def test_spm_info_and_pieces(spm_gguf):
    check_info_and_pieces(spm_gguf)


def test_spm_roundtrip(spm_gguf):
    check_roundtrip(spm_gguf, texts_for(22))


def test_spm_speed(spm_gguf):
    check_speed(spm_gguf)


def test_bpe_ids(bpe_gguf):
    check_ids(bpe_gguf, texts_for(31))


def test_bpe_info_and_pieces(bpe_gguf):
    check_info_and_pieces(bpe_gguf)


def test_bpe_roundtrip(bpe_gguf):
    check_roundtrip(bpe_gguf, texts_for(32))


def test_bpe_speed(bpe_gguf):
    check_speed(bpe_gguf)
