"""prepare_char.py: character-level datasets from Tiny Shakespeare, a local text or the stdlib."""
import hashlib
import io
import subprocess
import sys

import numpy as np
import pytest

import prepare_char as P
from conftest import REPO, SHAKESPEARE, needs_shakespeare
from tokenizer import CharTokenizer, read_meta, tokenizer_from_meta


def decoded(out_dir):
    """The text a dataset's train.bin and val.bin spell, one after the other."""
    meta = read_meta(out_dir)
    ids = [np.fromfile(out_dir / f"{split}.bin", dtype=np.uint16) for split in ("train", "val")]
    return tokenizer_from_meta(meta).decode(np.concatenate(ids).tolist())


def test_prepare_writes_the_text_split_90_10(tmp_path):
    text = "hello world\nthe quick brown fox é\n" * 50
    meta = P.prepare(text, tmp_path, "test")
    assert read_meta(tmp_path) == meta and meta["source"] == "test"
    assert meta["chars"] == "".join(sorted(set(text))) and meta["vocab_size"] == len(meta["chars"])
    split = int(len(text) * 0.9)
    assert meta["tokens"] == {"train": split, "val": len(text) - split}
    assert decoded(tmp_path) == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.json", "train.bin", "val.bin"]


@pytest.mark.parametrize("text", ["abc\tXYZ 123\n~!", "naïve → ok ✓", "caf\u00e9 \u00ff \u0100",
                                  "".join(chr(0x4E00 + i) for i in range(300))])
def test_the_fast_encoding_is_the_tokenizers(text):
    tok = CharTokenizer("".join(sorted(set(text))))
    assert P.encode(text, tok).tolist() == tok.encode(text)


def test_as_many_characters_as_uint16_ids_can_number_are_prepared(tmp_path):
    text = "".join(chr(0x10000 + i) for i in range(65536))  # ids 0..65535, the last one 0xFFFF
    assert P.prepare(text, tmp_path, "test")["vocab_size"] == 65536
    assert decoded(tmp_path) == text


def test_the_stdlib_corpus_is_every_nonempty_ascii_file_in_a_hashed_order(tmp_path):
    files = {"a.py": "import os\n", "pkg/b.py": "x = 1\r\ny = 2\n", "pkg/__init__.py": "",
             "pkg/blank.py": " \n\n", "site-packages/c.py": "import numpy\n",
             "d.py": "s = 'café'\n", "e.txt": "not python\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(text.encode("utf-8"))
    kept = sorted(["a.py", "pkg/b.py"], key=lambda n: hashlib.sha1(n.encode()).hexdigest())
    texts = {"a.py": "import os\n", "pkg/b.py": "x = 1\ny = 2\n"}
    assert P.stdlib_files(tmp_path) == [(name, texts[name]) for name in kept]
    assert P.stdlib_corpus(tmp_path) == "\n\n".join(texts[n] for n in kept)
    assert P.stdlib_corpus(tmp_path, max_chars=5) == texts[kept[0]][:5]


def test_the_stdlib_command_line_works_offline(tmp_path):
    out = tmp_path / "stdlib_char"
    result = subprocess.run([sys.executable, str(REPO / "prepare_char.py"), "--corpus=stdlib",
                             "--max_chars=100000", f"--out_dir={out}"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    meta = read_meta(out)
    assert meta["tokens"]["train"] + meta["tokens"]["val"] == 100_000
    assert meta["vocab_size"] <= 100 and decoded(out).isascii()  # printable ASCII, newline, tab
    assert decoded(out) == P.stdlib_corpus(max_chars=100_000)  # the same, run after run


def test_a_local_file_is_read_with_its_line_ends_made_newlines(tmp_path, capsys):
    src = tmp_path / "input.txt"
    src.write_bytes(b"First Citizen:\r\nBefore we proceed\rany further.\n" * 20)
    out = tmp_path / "char"
    assert P.main([f"--input={src}", f"--out_dir={out}"]) == 0
    assert decoded(out) == "First Citizen:\nBefore we proceed\nany further.\n" * 20
    assert read_meta(out)["source"] == "file:input.txt"
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin"]
    assert capsys.readouterr().out == f"wrote {out}: 920 characters, vocab 24, 828 train / 92 " \
                                      f"val tokens\n"


def test_the_download_is_kept_beside_the_dataset(tmp_path, monkeypatch):
    text = "First Citizen:\nSpeak, speak.\n" * 20
    monkeypatch.setattr(P.urllib.request, "urlopen", lambda url, timeout: io.BytesIO(text.encode()))
    out = tmp_path / "shakespeare_char"
    assert P.main([f"--out_dir={out}"]) == 0
    assert read_meta(out)["source"] == P.SHAKESPEARE_URL
    assert (out / "input.txt").read_text(encoding="utf-8") == text and decoded(out) == text


def offline(*args, **kwargs):
    raise OSError("network is unreachable")


@pytest.mark.parametrize("make_input, message", [
    (lambda tmp: tmp / "nope.txt", "no such file"),
    (lambda tmp: tmp, "no such file"),  # a folder
    (lambda tmp: tmp / "latin1.txt", "is not UTF-8 text (byte 3): convert it first"),
    (lambda tmp: tmp / "short.txt", "file:short.txt: 10 characters, too few for a train and a val"),
    (None, "could not download Tiny Shakespeare (network is unreachable): offline, give a copy"),
])
def test_bad_input_is_one_error_line_and_writes_nothing(tmp_path, monkeypatch, capsys, make_input,
                                                        message):
    (tmp_path / "latin1.txt").write_bytes("Café crème\n".encode("latin-1"))
    (tmp_path / "short.txt").write_text("x" * 10)  # 9 / 1 characters: each split needs 2
    monkeypatch.setattr(P.urllib.request, "urlopen", offline)
    given = [f"--input={make_input(tmp_path)}"] if make_input else []
    assert P.main([*given, f"--out_dir={tmp_path / 'out'}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err
    assert not (tmp_path / "out" / "meta.json").exists()


def test_an_out_dir_under_a_file_is_an_error_line(tmp_path, capsys):
    (tmp_path / "taken").write_text("a file, not a folder")
    assert P.main(["--corpus=stdlib", f"--out_dir={tmp_path / 'taken' / 'sub'}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write the dataset to ") and err.count("\n") == 1


@needs_shakespeare
def test_tiny_shakespeare_matches_nanogpt(tmp_path):
    P.main([f"--input={SHAKESPEARE}", f"--out_dir={tmp_path}"])
    meta = read_meta(tmp_path)  # NanoGPT's shakespeare_char/prepare.py reports exactly these
    assert meta["vocab_size"] == 65
    assert meta["tokens"] == {"train": 1_003_854, "val": 111_540}
    assert meta["chars"] == "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


@pytest.mark.parametrize("stopped_in, kept", [
    ("read_text", "holds a complete dataset"),  # before anything is written: the earlier dataset
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
    assert P.main([f"--input={src}", f"--out_dir={out}"]) == 130
    assert capsys.readouterr().err == f"stopped by Ctrl-C; {out} {kept}\n"
    assert (out / "meta.json").exists() == (stopped_in == "read_text")  # none beside new data
