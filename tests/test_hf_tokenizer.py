"""hf_tokenizer.py: the exported tokenizer folders, loaded by AutoTokenizer, against this repo's
tokenizers: the GPT-2 BPE encodes 1,000 random strings to tiktoken's ids and decodes them back."""
import random

import pytest

from conftest import needs_bpe

pytest.importorskip("transformers", reason="exporting a tokenizer needs transformers")
from transformers import AutoTokenizer  # noqa: E402

from hf_tokenizer import write_tokenizer  # noqa: E402
from tokenizer import EOT_TOKEN, CharTokenizer, gpt2_encoding  # noqa: E402

GPT2_META = {"tokenizer": "gpt2", "vocab_size": 50257, "tokens": {"train": 1, "val": 1}}

# what the random strings are made of: pieces the BPE's split pattern and byte fallback treat apart
WORDS = ["the", " The", "cat", " don't", " I'LL", "they've", "re", " naïve", " café", "straße",
         " Ελλάδα", " Москва", " 東京都", "こんにちは", " مرحبا", " שלום", " हिन्दी", "한국어"]
SPACES = [" ", "  ", "    ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2009",
          "\v", "\f", "   \n\t  "]
SPECIAL = ["!", "?!", "...", "'", "'s", '"', "«»", "—", "–", "…", "@#$%^&*", "~`|\\", "<|", "|>",
           "<|endoftext|>", "<|endoftext", "[title]", "\u200b", "\ufeff", "e\u0301", "\x00",
           "\x7f"]
EMOJI = ["🤖", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "😀😀", "🏳️‍🌈"]
CODE = ["def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) {", "x+=1;",
        "if a != b and c >= d:", "SELECT * FROM t WHERE id='7';", "<div class=\"a\">", "{}",
        "λ x → x", "0x1F", "#include <stdio.h>"]
DIGITS = ["0", "7", "42", "123", "1234", "3.14159", " 2024", "1,000,000", "٣", "１２３"]
PIECES = [WORDS, SPACES, SPECIAL, EMOJI, CODE, DIGITS]


def random_char(rng):
    """Any Unicode scalar value but a surrogate (UTF-8 cannot hold one), mostly the first planes."""
    while True:
        code = rng.randrange(0x110000) if rng.random() < 0.3 else rng.randrange(0x3000)
        if not 0xD800 <= code <= 0xDFFF:
            return chr(code)


def random_string(rng):
    parts = []
    for _ in range(rng.randint(0, 12)):
        if rng.random() < 0.15:
            parts.append("".join(random_char(rng) for _ in range(rng.randint(1, 4))))
        else:
            parts.append(rng.choice(rng.choice(PIECES)))
    return "".join(parts)


STRINGS = [random_string(random.Random(seed)) for seed in range(1000)]


@pytest.fixture(scope="module")
def gpt2_hf(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf_gpt2")
    write_tokenizer(GPT2_META, folder)
    return AutoTokenizer.from_pretrained(folder)


@needs_bpe
def test_gpt2_tokenizer_encodes_and_decodes_1000_strings_as_tiktoken(gpt2_hf):
    encoding = gpt2_encoding()
    assert sum("<|endoftext|>" in s for s in STRINGS) > 10 and sum(not s for s in STRINGS) >= 1
    mismatched = []
    for s in STRINGS:
        ids = gpt2_hf.encode(s)
        # transformers' GPT-2 tokenizers read the literal "<|endoftext|>" as the token, as tiktoken
        # does with allowed_special="all"; without it, the same ids as the repo's encode_ordinary
        expected = encoding.encode(s, allowed_special="all")
        if "<|endoftext|>" not in s:
            assert expected == encoding.encode_ordinary(s)
        if ids != expected or gpt2_hf.decode(ids) != s or encoding.decode(ids) != s:
            mismatched.append(s)
    assert not mismatched, f"{len(mismatched)} strings differ, the first: {mismatched[0]!r}"


@needs_bpe
def test_gpt2_tokenizer_special_tokens_and_batches(gpt2_hf):
    assert (gpt2_hf.eos_token_id, gpt2_hf.bos_token_id, gpt2_hf.pad_token_id) == (EOT_TOKEN,) * 3
    assert len(gpt2_hf) == 50257
    # no token added in front or behind (lm-eval and generate see the text's own tokens)
    batch = gpt2_hf(STRINGS[:50])["input_ids"]
    assert batch == [gpt2_encoding().encode(s, allowed_special="all") for s in STRINGS[:50]]
    assert gpt2_hf.decode([EOT_TOKEN], skip_special_tokens=True) == ""


def test_char_tokenizer_round_trips_its_table_and_marks_an_unknown_character(tmp_path):
    chars = "\n !',-.:;?ABCabcé🤖"
    write_tokenizer({"tokenizer": "char", "vocab_size": len(chars), "chars": chars,
                     "tokens": {"train": 1, "val": 1}}, tmp_path)
    hf, ours = AutoTokenizer.from_pretrained(tmp_path), CharTokenizer(chars)
    rng = random.Random(0)
    for _ in range(200):
        text = "".join(rng.choice(chars) for _ in range(rng.randint(0, 40)))
        assert hf.encode(text) == ours.encode(text) and hf.decode(hf.encode(text)) == text
    # a character the table lacks: an id past the model's vocabulary, never silently dropped
    assert hf.encode("aZb") == [ours.stoi["a"], len(chars), ours.stoi["b"]]
