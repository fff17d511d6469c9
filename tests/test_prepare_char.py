"""prepare_char.py: character-level datasets from Tiny Shakespeare or the Python standard library."""
import hashlib
import io
import json
import subprocess
import sys

import numpy as np
import pytest

import prepare_char as P
from conftest import REPO, SHAKESPEARE, needs_shakespeare
from tokenizer import CharTokenizer, read_meta, tokenizer_from_meta


def decode_file(path, meta):
    return tokenizer_from_meta(meta).decode(np.fromfile(path, dtype=np.uint16).tolist())


def test_prepare_writes_the_data_contract(tmp_path):
    text = "hello world\nthe quick brown fox é\n" * 50
    meta = P.prepare(text, tmp_path, "test")
    assert read_meta(tmp_path) == meta
    assert meta["tokenizer"] == "char" and meta["chars"] == "".join(sorted(set(text)))
    assert meta["vocab_size"] == len(meta["chars"])
    split = int(len(text) * 0.9)
    assert meta["tokens"] == {"train": split, "val": len(text) - split}
    assert decode_file(tmp_path / "train.bin", meta) + decode_file(tmp_path / "val.bin", meta) == text
    assert not list(tmp_path.glob("*.tmp"))


def test_fast_encoding_matches_the_tokenizer():
    text = "abc\tXYZ 123\n~!" * 7
    tok = CharTokenizer("".join(sorted(set(text))))
    assert P.encode(text, tok).tolist() == tok.encode(text)
    wide = "naïve → ok ✓"
    tok = CharTokenizer("".join(sorted(set(wide))))
    assert P.encode(wide, tok).tolist() == tok.encode(wide)
    many = "".join(chr(0x4E00 + i) for i in range(300))  # more characters than one byte can number
    tok = CharTokenizer(many)
    assert P.encode(many, tok).tolist() == tok.encode(many) == list(range(300))
    latin = "caf\u00e9 \u00ff \u0100"  # U+0100 is the first character that no byte value holds
    tok = CharTokenizer("".join(sorted(set(latin))))
    assert P.encode(latin, tok).tolist() == tok.encode(latin)


def test_more_characters_than_uint16_ids_can_number_are_refused(tmp_path):
    text = "".join(chr(0x10000 + i) for i in range(65537))
    with pytest.raises(P.PrepareError, match="65537 distinct characters do not fit in uint16"):
        P.prepare(text, tmp_path / "out", "test")
    assert not (tmp_path / "out").exists()


def test_as_many_characters_as_uint16_ids_can_number_are_prepared(tmp_path):
    text = "".join(chr(0x10000 + i) for i in range(65536))  # ids 0..65535, the last one 0xFFFF
    meta = P.prepare(text, tmp_path, "test")
    assert meta["vocab_size"] == 65536
    ids = np.concatenate([np.fromfile(tmp_path / f"{split}.bin", dtype=np.uint16) for split in ("train", "val")])
    assert ids.tolist() == list(range(65536))


def test_stdlib_corpus_is_offline_ascii_python():
    files = P.stdlib_files()
    assert len(files) > 100
    names = [name for name, _ in files]
    assert "os.py" in names and not any("site-packages" in n for n in names)
    assert names == sorted(names, key=lambda n: __import__("hashlib").sha1(n.encode()).hexdigest())
    text = P.stdlib_corpus(max_chars=200_000)
    assert len(text) == 200_000 and text.isascii()
    assert P.stdlib_corpus(max_chars=200_000) == text  # deterministic


def test_stdlib_corpus_is_every_nonempty_ascii_file_separated_by_a_blank_line(tmp_path):
    files = {"a.py": "import os\n", "pkg/b.py": "x = 1\r\ny = 2\n", "pkg/__init__.py": "", "pkg/blank.py": " \n\n",
             "site-packages/c.py": "import numpy\n", "d.py": "s = 'café'\n", "e.txt": "not python\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(text.encode("utf-8"))
    kept = sorted(["a.py", "pkg/b.py"], key=lambda n: hashlib.sha1(n.encode()).hexdigest())
    texts = {"a.py": "import os\n", "pkg/b.py": "x = 1\ny = 2\n"}
    assert P.stdlib_files(tmp_path) == [(name, texts[name]) for name in kept]
    assert P.stdlib_corpus(tmp_path) == P.stdlib_corpus(tmp_path, max_chars=0) == "\n\n".join(texts[n] for n in kept)
    with pytest.raises(P.PrepareError, match="found no .py files under"):
        P.stdlib_corpus(tmp_path / "pkg" / "empty")


def test_command_line_stdlib(tmp_path):
    out = tmp_path / "stdlib_char"
    result = subprocess.run([sys.executable, str(REPO / "prepare_char.py"), "--corpus=stdlib", "--max_chars=100000",
                             f"--out_dir={out}"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    meta = read_meta(out)
    assert meta["tokens"]["train"] + meta["tokens"]["val"] == 100_000
    assert meta["vocab_size"] <= 100  # printable ASCII, newline, tab


def test_command_line_local_file(tmp_path):
    src = tmp_path / "input.txt"
    src.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20, encoding="utf-8")
    out = tmp_path / "char"
    P.main([f"--input={src}", f"--out_dir={out}"])
    meta = read_meta(out)
    assert meta["source"] == "file:input.txt"
    assert decode_file(out / "train.bin", meta) + decode_file(out / "val.bin", meta) == src.read_text()
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin"]  # no copy of the input


def test_command_line_download_keeps_the_text_beside_the_dataset(tmp_path, monkeypatch):
    text = "First Citizen:\nSpeak, speak.\n" * 20

    class Response(io.BytesIO):
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(P.urllib.request, "urlopen", lambda url, timeout: Response(text.encode("utf-8")))
    out = tmp_path / "shakespeare_char"
    assert P.main([f"--out_dir={out}"]) == 0
    meta = read_meta(out)
    assert meta["source"] == P.SHAKESPEARE_URL
    assert (out / "input.txt").read_text(encoding="utf-8") == text
    assert decode_file(out / "train.bin", meta) + decode_file(out / "val.bin", meta) == text


def one_error_line(capsys):
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_missing_input_and_failed_download_are_clear(tmp_path, monkeypatch, capsys):
    assert P.main([f"--input={tmp_path / 'nope.txt'}", f"--out_dir={tmp_path / 'x'}"]) == 1
    assert "no such file" in one_error_line(capsys)

    def offline(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(P.urllib.request, "urlopen", offline)
    assert P.main([f"--out_dir={tmp_path / 'y'}"]) == 1
    err = one_error_line(capsys)
    assert "--input=" in err and "--corpus=stdlib" in err
    assert not (tmp_path / "y" / "meta.json").exists()


def test_non_utf8_input_is_an_error_line_not_a_traceback(tmp_path):
    src = tmp_path / "latin1.txt"
    src.write_bytes("Caf\u00e9 cr\u00e8me, na\u00efve\n".encode("latin-1") * 20)
    result = subprocess.run([sys.executable, str(REPO / "prepare_char.py"), f"--input={src}",
                             f"--out_dir={tmp_path / 'out'}"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "is not UTF-8 text: byte 0xe9 at offset 3" in result.stderr and "iconv" in result.stderr
    assert not (tmp_path / "out").exists()


def test_windows_and_old_mac_line_ends_read_as_before(tmp_path):
    src = tmp_path / "crlf.txt"
    src.write_bytes(b"one\r\ntwo\rthree\n" * 20)
    out = tmp_path / "out"
    assert P.main([f"--input={src}", f"--out_dir={out}"]) == 0
    meta = read_meta(out)
    assert "\r" not in meta["chars"]
    assert decode_file(out / "train.bin", meta) + decode_file(out / "val.bin", meta) == "one\ntwo\nthree\n" * 20


@pytest.mark.parametrize("text, what", [("", "the text is empty"), ("a", "1 characters"),
                                        ("abcde", "5 characters"), ("x" * 10, "10 characters")])
def test_a_text_too_short_to_split_is_an_error_line(tmp_path, capsys, text, what):
    """Each split must hold 2 tokens, what the smallest block_size trains on: 10 characters give 9 / 1."""
    src = tmp_path / "short.txt"
    src.write_text(text)
    assert P.main([f"--input={src}", f"--out_dir={tmp_path / 'out'}"]) == 1
    assert one_error_line(capsys).startswith(f"error: file:short.txt: {what}, too short to split into train and val")
    assert not (tmp_path / "out" / "meta.json").exists()
    src.write_text("x" * 11)
    assert P.main([f"--input={src}", f"--out_dir={tmp_path / 'out'}"]) == 0
    assert read_meta(tmp_path / "out")["tokens"] == {"train": 9, "val": 2}


def test_a_dataset_made_from_another_source_is_replaced_saying_so(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text("the first text\n" * 20)
    second.write_text("the second text\n" * 20)
    for src, said in ((first, ""), (first, ""), (second, "replaced the dataset in out, which was made from file:first.txt\n")):
        assert P.main([f"--input={src}", "--out_dir=out"]) == 0
        assert capsys.readouterr().out.startswith(f"{said}file:{src.name}: {len(src.read_text())} characters")


def test_a_damaged_meta_json_in_out_dir_is_replaced_by_the_new_dataset(tmp_path, capsys):
    src, out = tmp_path / "text.txt", tmp_path / "out"
    src.write_text("the text\n" * 20)
    out.mkdir()
    (out / "meta.json").write_text('{"tokenizer": "ch')  # cut off
    assert P.main([f"--input={src}", f"--out_dir={out}"]) == 0
    assert read_meta(out)["source"] == "file:text.txt" and "replaced" not in capsys.readouterr().out


def test_an_out_dir_that_cannot_be_written_is_an_error_line(tmp_path, capsys):
    (tmp_path / "taken").write_text("a file, not a folder")
    for out_dir in (tmp_path / "taken", tmp_path / "taken" / "sub"):
        assert P.main(["--corpus=stdlib", f"--out_dir={out_dir}"]) == 1  # said before the corpus is built
        assert one_error_line(capsys) == (f"error: cannot write the dataset to {out_dir}: {tmp_path / 'taken'} is a "
                                          f"file, not a folder (choose another --out_dir)\n")


def test_meta_carries_the_fingerprint_of_the_train_text(tmp_path):
    text = "the quick brown fox\n" * 30
    meta = P.prepare(text, tmp_path, "test")
    split = int(len(text) * 0.9)
    assert meta["train_text_sha1"] == hashlib.sha1(text[:split].encode("utf-32-le")).hexdigest()


@needs_shakespeare
def test_tiny_shakespeare_matches_nanogpt(tmp_path):
    P.main([f"--input={SHAKESPEARE}", f"--out_dir={tmp_path}"])
    meta = json.loads((tmp_path / "meta.json").read_text())
    # NanoGPT's shakespeare_char/prepare.py reports exactly these
    assert meta["vocab_size"] == 65
    assert meta["tokens"] == {"train": 1_003_854, "val": 111_540}
    assert meta["chars"] == "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def test_a_negative_max_chars_is_refused(tmp_path, capsys):
    assert P.main(["--corpus=stdlib", "--max_chars=-5", f"--out_dir={tmp_path / 'out'}"]) == 1
    assert "--max_chars must be 0 (every character) or more, got -5" in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("option, message", [
    ("--corpus=stdlib", "name two texts: give one of them"),  # which text, and which default out_dir?
    ("--max_chars=50", "--max_chars cuts the stdlib corpus only"),  # not silently ignored
])
def test_options_that_do_not_go_with_input_are_refused(tmp_path, capsys, option, message):
    src = tmp_path / "text.txt"
    src.write_text("some text\n" * 20)
    assert P.main([f"--input={src}", option, f"--out_dir={tmp_path / 'out'}"]) == 1
    assert message in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_a_folder_as_input_is_named_a_folder(tmp_path, capsys):
    assert P.main([f"--input={tmp_path}", f"--out_dir={tmp_path / 'out'}"]) == 1
    assert "is a folder" in one_error_line(capsys)


def test_an_interrupted_rewrite_leaves_no_old_meta_beside_new_data(tmp_path, monkeypatch):
    P.prepare("the old text\n" * 30, tmp_path, "old")
    write_tokens = P.write_tokens_atomically

    def interrupted_at_val(path, ids):
        if path.name == "val.bin":
            raise KeyboardInterrupt
        write_tokens(path, ids)

    monkeypatch.setattr(P, "write_tokens_atomically", interrupted_at_val)
    with pytest.raises(KeyboardInterrupt):
        P.prepare("a new text, other characters\n" * 30, tmp_path, "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.bin", "val.bin"]  # the new train.bin: no meta.json


@pytest.mark.parametrize("stopped_in, kept", [
    ("read_text_file", "holds a complete dataset"),  # before anything is written: the earlier dataset
    ("write_tokens_atomically", "holds no complete dataset (no meta.json): prepare it again"),
])
def test_ctrl_c_is_one_line_saying_what_is_left(tmp_path, capsys, monkeypatch, stopped_in, kept):
    src = tmp_path / "text.txt"
    src.write_text("some text\n" * 20)
    out = tmp_path / "out"
    assert P.main([f"--input={src}", f"--out_dir={out}"]) == 0
    capsys.readouterr()

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(P, stopped_in, interrupted)
    try:
        assert P.main([f"--input={src}", f"--out_dir={out}"]) == 130
    except KeyboardInterrupt:  # let through, it would stop pytest itself
        pytest.fail("the Ctrl-C ended prepare_char.py with a KeyboardInterrupt traceback")
    assert capsys.readouterr().err == f"stopped by Ctrl-C; {out} {kept}\n"
