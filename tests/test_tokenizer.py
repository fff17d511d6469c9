"""tokenizer.py: the character and GPT-2 tokenizers, meta.json, and the atomic token-file writers."""
import errno
import hashlib
import json
import os

import numpy as np
import pytest

import tokenizer
from atomic import atomic_file
from conftest import needs_bpe
from tokenizer import (
    EOT_TOKEN,
    CharTokenizer,
    GPT2Tokenizer,
    PrepareError,
    TokenizerUnavailableError,
    char_fingerprint,
    check_out_dir,
    gpt2_encoding,
    read_meta,
    tokenizer_from_meta,
    write_meta,
    write_tokens_atomically,
)


# -----------------------------------------------------------------------------
# CharTokenizer

def test_char_tokenizer_round_trip():
    tok = CharTokenizer("\n !abcé")
    text = "abc é!\n"
    ids = tok.encode(text)
    assert ids == [3, 4, 5, 1, 6, 2, 0]
    assert tok.decode(ids) == text
    assert tok.vocab_size == 7
    assert tok.eot is None


def test_char_tokenizer_ids_follow_the_vocabulary_order_not_sorted_order():
    """prepare_char.py sorts its vocabulary, but a meta.json written elsewhere need not: an id is the
    character's place in `chars`, whatever order that is."""
    tok = CharTokenizer("ba\n")
    assert tok.encode("ab\n") == [1, 0, 2] and tok.decode([2, 0, 1]) == "\nba"


def test_char_tokenizer_names_unknown_characters():
    tok = CharTokenizer("abc")
    with pytest.raises(ValueError, match="character-level") as excinfo:
        tok.encode("abXcY")
    assert "'X'" in str(excinfo.value) and "'Y'" in str(excinfo.value)


def test_char_tokenizer_rejects_bad_vocabulary_and_ids():
    with pytest.raises(ValueError, match="repeated"):
        CharTokenizer("aba")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        CharTokenizer("ab").decode([0, 2])
    with pytest.raises(ValueError, match=r"token id -1 is outside the vocabulary of 2 characters \(ids 0..1\)"):
        CharTokenizer("ab").decode([0, -1])  # not "b", as chars[-1] would give


# -----------------------------------------------------------------------------
# GPT-2 BPE

@needs_bpe
def test_gpt2_encoding_known_ids():
    enc = gpt2_encoding()
    assert enc.encode("<|endoftext|>", allowed_special="all") == [EOT_TOKEN] == [50256]
    assert enc.eot_token == 50256
    assert enc.encode_ordinary("hello world") == [31373, 995]
    assert enc.n_vocab == 50257
    assert gpt2_encoding() is enc  # cached


@needs_bpe
def test_gpt2_tokenizer_interface():
    tok = GPT2Tokenizer()
    assert (tok.vocab_size, tok.eot) == (50257, 50256)
    assert tok.encode("hello world") == [31373, 995]
    # the literal text is ordinary text, never the special token
    assert EOT_TOKEN not in tok.encode("a <|endoftext|> b")
    assert tok.decode(tok.encode("Ünïcode, tabs\tand\nnewlines")) == "Ünïcode, tabs\tand\nnewlines"


class FakeEncoding:
    eot_token = 50256

    def __init__(self, name, n_vocab=50257):
        self.name, self.n_vocab = name, n_vocab


@pytest.fixture
def fake_tiktoken(monkeypatch, tmp_path):
    """tiktoken.get_encoding replaced by a recorder; `available` says which names load, `n_vocab` which of them
    have another vocabulary size. No network."""
    import tiktoken

    state = {"asked": [], "available": set(), "n_vocab": {}}

    def get_encoding(name):
        state["asked"].append(name)
        if name not in state["available"]:
            raise ConnectionError(f"no network for {name}")
        return FakeEncoding(name, state["n_vocab"].get(name, 50257))

    monkeypatch.setattr(tiktoken, "get_encoding", get_encoding)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    gpt2_encoding.cache_clear()
    yield state
    gpt2_encoding.cache_clear()  # the next test gets the real encoding again


@pytest.mark.parametrize("variable", ["TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"])  # tiktoken reads either
def test_gpt2_encoding_loads_cached_r50k_base_without_trying_gpt2(fake_tiktoken, tmp_path, monkeypatch, variable):
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR")
    monkeypatch.setenv(variable, str(tmp_path))
    cache_key = hashlib.sha1(tokenizer.R50K_BASE_URL.encode()).hexdigest()
    (tmp_path / cache_key).write_bytes(b"cached")
    fake_tiktoken["available"] = {"gpt2", "r50k_base"}
    assert gpt2_encoding().name == "r50k_base"
    assert fake_tiktoken["asked"] == ["r50k_base"]


def test_gpt2_encoding_falls_back_to_r50k_base(fake_tiktoken):
    fake_tiktoken["available"] = {"r50k_base"}
    assert gpt2_encoding().name == "r50k_base"
    assert fake_tiktoken["asked"] == ["gpt2", "r50k_base"]


def test_an_encoding_with_another_vocabulary_is_not_taken_for_gpt2s(fake_tiktoken):
    fake_tiktoken["available"] = {"gpt2", "r50k_base"}
    fake_tiktoken["n_vocab"] = {"gpt2": 100277}
    assert gpt2_encoding().name == "r50k_base"
    fake_tiktoken["n_vocab"]["r50k_base"] = 100277
    gpt2_encoding.cache_clear()
    with pytest.raises(TokenizerUnavailableError, match="r50k_base: unexpected eot 50256 / vocab size 100277"):
        gpt2_encoding()


def test_gpt2_encoding_unavailable_says_how_to_fix_it(fake_tiktoken):
    with pytest.raises(TokenizerUnavailableError, match="TIKTOKEN_CACHE_DIR") as excinfo:
        gpt2_encoding()
    assert isinstance(excinfo.value, RuntimeError)
    assert "no network for gpt2" in str(excinfo.value)


# -----------------------------------------------------------------------------
# meta.json

CHAR_META = {"tokenizer": "char", "vocab_size": 3, "chars": "\nab", "tokens": {"train": 10, "val": 2}, "extra": 1}


def test_meta_round_trip_and_tokenizer(tmp_path):
    write_meta(tmp_path / "new_dir", CHAR_META)
    assert read_meta(tmp_path / "new_dir") == CHAR_META
    assert os.listdir(tmp_path / "new_dir") == ["meta.json"]  # no temporary file left behind
    tok = tokenizer_from_meta(CHAR_META)
    assert isinstance(tok, CharTokenizer) and tok.decode(tok.encode("ab\n")) == "ab\n"


@needs_bpe
def test_tokenizer_from_gpt2_meta():
    tok = tokenizer_from_meta({"tokenizer": "gpt2", "vocab_size": 50257, "tokens": {"train": 1, "val": 1}})
    assert isinstance(tok, GPT2Tokenizer)


def test_read_meta_missing_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="meta.json"):
        read_meta(tmp_path)


@pytest.mark.parametrize("content, problem", [
    ("{not json", "not valid JSON"),
    (b'{"chars": "caf\xe9"}', "not valid JSON"),  # Latin-1, not UTF-8
    ("[1, 2]", "JSON object"),
    (json.dumps({**CHAR_META, "tokenizer": "bpe"}), '"tokenizer"'),
    (json.dumps({**CHAR_META, "tokens": {"train": 1}}), '"tokens"'),
    (json.dumps({**CHAR_META, "chars": "ab"}), '"chars"'),
])
def test_read_meta_malformed_names_the_file(tmp_path, content, problem):
    (tmp_path / "meta.json").write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=problem) as excinfo:
        read_meta(tmp_path)
    assert str(tmp_path / "meta.json") in str(excinfo.value)


def test_write_meta_refuses_a_bad_meta(tmp_path):
    with pytest.raises(ValueError, match="vocab_size"):
        write_meta(tmp_path, {"tokenizer": "gpt2", "tokens": {"train": 1, "val": 1}})
    assert not (tmp_path / "meta.json").exists()


def test_an_out_dir_where_no_file_can_be_written_is_refused_naming_the_folder(tmp_path, monkeypatch):
    """No permission or a read-only disk (as root, a read-only folder is writable, so the refusal is simulated)."""
    def refused(dir):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), dir)

    monkeypatch.setattr(tokenizer.tempfile, "TemporaryFile", refused)
    with pytest.raises(PrepareError) as excinfo:
        check_out_dir(tmp_path / "new" / "data")
    assert str(excinfo.value) == (f"cannot write the dataset to {tmp_path / 'new' / 'data'}: "
                                  f"{os.strerror(errno.EACCES)}: {tmp_path}")
    assert not (tmp_path / "new").exists()


# -----------------------------------------------------------------------------
# token files

def test_write_tokens_atomically_round_trip(tmp_path):
    path = tmp_path / "train.bin"
    write_tokens_atomically(path, [0, 5, 50256, 65535])
    assert np.memmap(path, dtype=np.uint16, mode="r").tolist() == [0, 5, 50256, 65535]
    assert os.listdir(tmp_path) == ["train.bin"]
    for outside in ([65536], [3, -1]):  # -1 would be written as 65535
        with pytest.raises(ValueError, match="uint16"):
            write_tokens_atomically(path, outside)
    with pytest.raises(ValueError, match="empty"):
        write_tokens_atomically(tmp_path / "empty.bin", [])


def test_interrupted_write_leaves_the_old_file_and_no_partial_one(tmp_path):
    path = tmp_path / "train.bin"
    write_tokens_atomically(path, [1, 2, 3])
    with pytest.raises(KeyboardInterrupt):
        with atomic_file(path, "wb") as f:  # how prepare_openwebtext.py grows its token files
            f.write(np.full(1000, 7, dtype=np.uint16).tobytes())
            raise KeyboardInterrupt
    assert np.memmap(path, dtype=np.uint16, mode="r").tolist() == [1, 2, 3]
    assert os.listdir(tmp_path) == ["train.bin"]


def test_char_fingerprint_is_the_text_and_changes_with_the_order_of_chars():
    text = "naïve → ok\n" * 5
    chars = "".join(sorted(set(text)))
    ids = np.array(CharTokenizer(chars).encode(text), dtype=np.uint16)
    assert char_fingerprint(ids, chars) == hashlib.sha1(text.encode("utf-32-le")).hexdigest()
    swapped = chars[1] + chars[0] + chars[2:]
    assert char_fingerprint(ids, swapped) != char_fingerprint(ids, chars)
