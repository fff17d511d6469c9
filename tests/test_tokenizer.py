"""tokenizer.py: the character and GPT-2 tokenizers, meta.json and meta.pkl, the token files."""
import json
import os
import pickle

import numpy as np
import pytest

from atomic import atomic_file
from conftest import needs_bpe
from tokenizer import (EOT_TOKEN, CharTokenizer, GPT2Tokenizer, TokenizerUnavailableError,
                       gpt2_encoding, read_meta, read_nanogpt_meta, tokenizer_from_meta, write_meta,
                       write_tokens_atomically)


def test_char_tokenizer_ids_are_places_in_the_vocabulary():
    tok = CharTokenizer("ba\n é")  # any order: an id is the character's place in `chars`
    assert tok.encode("ab é\n") == [1, 0, 3, 4, 2] and tok.decode([2, 4, 0]) == "\néb"
    assert (tok.vocab_size, tok.eot) == (5, None)
    with pytest.raises(ValueError, match=r"characters not in the vocabulary: 'X', 'Y'; the model"):
        tok.encode("aXbY")


@needs_bpe
def test_gpt2_tokenizer_is_gpt2s_bpe():
    tok = GPT2Tokenizer()
    assert (tok.vocab_size, tok.eot, EOT_TOKEN) == (50257, 50256, 50256)
    assert tok.encode("hello world") == [31373, 995]
    assert gpt2_encoding().encode("<|endoftext|>", allowed_special="all") == [EOT_TOKEN]
    assert EOT_TOKEN not in tok.encode("a <|endoftext|> b")  # the literal text is text
    assert tok.decode(tok.encode("Ünïcode, tabs\tand\nnewlines")) == "Ünïcode, tabs\tand\nnewlines"
    assert gpt2_encoding() is tok.encoding  # loaded once


def test_an_unreachable_bpe_says_how_to_run_offline(monkeypatch):
    import tiktoken

    def offline(name):
        raise ConnectionError(f"no network for {name}")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    gpt2_encoding.cache_clear()
    try:
        with pytest.raises(TokenizerUnavailableError, match="set TIKTOKEN_CACHE_DIR to a folder"):
            gpt2_encoding()
    finally:
        gpt2_encoding.cache_clear()  # the next test gets the real encoding again


CHAR_META = {"tokenizer": "char", "vocab_size": 3, "chars": "\nab",
             "tokens": {"train": 10, "val": 2}, "extra": 1}


def test_meta_round_trip_and_its_tokenizer(tmp_path):
    write_meta(tmp_path / "new_dir", CHAR_META)
    assert read_meta(tmp_path / "new_dir") == CHAR_META
    assert os.listdir(tmp_path / "new_dir") == ["meta.json"]  # no temporary file left behind
    tok = tokenizer_from_meta(CHAR_META)
    assert isinstance(tok, CharTokenizer) and tok.decode(tok.encode("ab\n")) == "ab\n"
    with pytest.raises(FileNotFoundError, match="meta.json not found: prepare the dataset first"):
        read_meta(tmp_path)


@pytest.mark.parametrize("content", [
    "{not json", b'{"chars": "caf\xe9"}', "[1, 2]",  # not JSON, Latin-1 not UTF-8, not an object
    json.dumps({**CHAR_META, "tokenizer": "bpe"}), json.dumps({**CHAR_META, "chars": "ab"}),
    json.dumps({**CHAR_META, "tokens": {"train": 1}}),
])
def test_a_malformed_meta_is_refused_naming_the_file(tmp_path, content):
    content = content if isinstance(content, bytes) else content.encode()
    (tmp_path / "meta.json").write_bytes(content)
    with pytest.raises(ValueError, match=str(tmp_path / "meta.json")):
        read_meta(tmp_path)
    with pytest.raises(ValueError):
        write_meta(tmp_path / "out", {"tokenizer": "gpt2", "tokens": {"train": 1, "val": 1}})
    assert not (tmp_path / "out" / "meta.json").exists()


def test_nanogpts_meta_pkl_is_read_as_plain_data_only(tmp_path):
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 3, "itos": {0: "\n", 1: "a", 2: "b"}, "stoi": {}}, f)
    meta = read_nanogpt_meta(tmp_path)
    assert (meta["tokenizer"], meta["vocab_size"], meta["chars"]) == ("char", 3, "\nab")
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 1, "itos": {0: os.getcwd}}, f)  # names a function: never called
    with pytest.raises(ValueError, match="not NanoGPT's character-level meta.pkl: UnpicklingError"):
        read_nanogpt_meta(tmp_path)


def test_token_files_are_uint16_written_whole_or_not_at_all(tmp_path):
    path = tmp_path / "train.bin"
    write_tokens_atomically(path, [0, 5, 50256, 65535])
    assert np.fromfile(path, dtype=np.uint16).tolist() == [0, 5, 50256, 65535]
    for outside in ([65536], [3, -1]):  # astype would write -1 as 65535
        with pytest.raises(ValueError, match="uint16"):
            write_tokens_atomically(path, outside)
    with pytest.raises(KeyboardInterrupt):
        with atomic_file(path, "wb") as f:  # how prepare_openwebtext.py grows its token files
            f.write(np.full(1000, 7, dtype=np.uint16).tobytes())
            raise KeyboardInterrupt
    assert np.fromfile(path, dtype=np.uint16).tolist() == [0, 5, 50256, 65535]
    assert os.listdir(tmp_path) == ["train.bin"]
