"""prepare_openwebtext.py end to end on small local corpora (the hub path shares all of this code)."""
import json
import math
import os
import subprocess
import sys

import datasets
import numpy as np
import pytest

import prepare_openwebtext
from conftest import REPO, needs_bpe
from prepare_openwebtext import PrepareError, prepare
from tokenizer import EOT_TOKEN, gpt2_encoding, read_meta


@pytest.fixture(autouse=True)
def private_datasets_cache(monkeypatch, tmp_path):
    # keep datasets' arrow caches in the test's folder, not in ~/.cache
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))


def make_documents(n):
    """n distinct, varied documents; one holds the literal text "<|endoftext|>"."""
    topics = ["attention", "Ünïcode ✓", "tabs\tand\nnewlines\n\nand paragraphs", "code: x = [1]", "<|endoftext|>"]
    return [f"Document {i} about {topics[i % len(topics)]}.\n" + "more words " * (i % 4) for i in range(n)]


EMPTY_DOCUMENTS = ["", "   \n\t "]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def write_text_folder(folder, documents):
    (folder / "nested").mkdir(parents=True)
    for i, doc in enumerate(documents):
        (folder / ("nested" if i % 2 else "") / f"doc{i:03d}.txt").write_text(doc, encoding="utf-8")
    return folder


def read_split(path):
    """The documents of a .bin file, each decoded from the ids before one 50256."""
    ids = np.memmap(path, dtype=np.uint16, mode="r")
    assert ids[-1] == EOT_TOKEN, "every document, the last one too, ends with <|endoftext|>"
    ends = np.flatnonzero(ids == EOT_TOKEN)
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [gpt2_encoding().decode(ids[start:end].tolist()) for start, end in zip(starts, ends)]


def check_prepared(out_dir, meta, documents, num_empty, val_fraction):
    train, val = read_split(out_dir / "train.bin"), read_split(out_dir / "val.bin")
    assert sorted(train + val) == sorted(documents)  # every document exactly once, none lost or merged
    assert len(val) == math.ceil(val_fraction * len(documents))
    assert meta == read_meta(out_dir)
    assert meta["documents"] == {"train": len(train), "val": len(val)}
    assert meta["tokens"] == {split: os.path.getsize(out_dir / f"{split}.bin") // 2 for split in ("train", "val")}
    assert meta["tokens"]["train"] == sum(len(gpt2_encoding().encode_ordinary(doc)) + 1 for doc in train)
    assert meta["empty_documents_skipped"] == num_empty
    assert (meta["tokenizer"], meta["vocab_size"]) == ("gpt2", 50257)
    assert sorted(os.listdir(out_dir)) == ["meta.json", "train.bin", "val.bin"]  # no temporary files


@needs_bpe
def test_jsonl_end_to_end(tmp_path):
    documents = make_documents(40)
    records = [{"text": doc, "id": i} for i, doc in enumerate(documents)]
    records[5:5] = [{"text": empty, "id": -1} for empty in EMPTY_DOCUMENTS] + [{"id": -2}]  # no text at all
    source = write_jsonl(tmp_path / "corpus.jsonl", records)

    meta = prepare(str(source), tmp_path / "out", val_fraction=0.1)

    check_prepared(tmp_path / "out", meta, documents, num_empty=3, val_fraction=0.1)
    assert meta["source"] == str(source) and meta["seed"] == 2357


@needs_bpe
def test_text_folder_end_to_end(tmp_path):
    documents = make_documents(12)  # each .txt file is one document, blank lines and all
    source = write_text_folder(tmp_path / "corpus", documents + EMPTY_DOCUMENTS)
    (source / "notes.md").write_text("not a .txt file: ignored")

    meta = prepare(str(source), tmp_path / "out", val_fraction=0.2)

    check_prepared(tmp_path / "out", meta, documents, num_empty=2, val_fraction=0.2)


@needs_bpe
def test_split_is_deterministic_for_a_seed(tmp_path):
    source = write_jsonl(tmp_path / "corpus.jsonl", [{"text": doc} for doc in make_documents(60)])

    def bins(name, seed):
        prepare(str(source), tmp_path / name, val_fraction=0.1, seed=seed)
        return [(tmp_path / name / f"{split}.bin").read_bytes() for split in ("train", "val")]

    assert bins("a", seed=2357) == bins("b", seed=2357)
    assert bins("a", seed=2357)[1] != bins("c", seed=1)[1]  # 6 of 60 documents: another seed picks others


@needs_bpe
def test_two_processes_write_the_same_files_as_one(tmp_path):
    source = write_jsonl(tmp_path / "corpus.jsonl", [{"text": doc} for doc in make_documents(30)])
    for num_proc in (1, 2):
        prepare(str(source), tmp_path / f"proc{num_proc}", val_fraction=0.1, num_proc=num_proc)
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "proc1" / name).read_bytes() == (tmp_path / "proc2" / name).read_bytes()


@needs_bpe
def test_max_docs_uses_the_first_documents(tmp_path):
    documents = make_documents(30)
    source = write_jsonl(tmp_path / "corpus.jsonl", [{"text": doc} for doc in ["", *documents]])
    meta = prepare(str(source), tmp_path / "out", val_fraction=0.25, max_docs=9)
    check_prepared(tmp_path / "out", meta, documents[:8], num_empty=1, val_fraction=0.25)


@needs_bpe
def test_interrupted_run_leaves_no_meta_and_no_partial_bin(tmp_path, monkeypatch):
    source = write_jsonl(tmp_path / "corpus.jsonl", [{"text": doc} for doc in make_documents(30)])
    out_dir = tmp_path / "out"
    prepare(str(source), out_dir, val_fraction=0.1)
    old_train = (out_dir / "train.bin").read_bytes()

    calls = []

    def flaky_flatten(ids):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C in the middle of writing train.bin
        return real_flatten(ids)

    real_flatten = prepare_openwebtext.pc.list_flatten
    monkeypatch.setattr(prepare_openwebtext, "WRITE_BATCH_DOCS", 5)
    monkeypatch.setattr(prepare_openwebtext.pc, "list_flatten", flaky_flatten)
    with pytest.raises(KeyboardInterrupt):
        prepare(str(source), out_dir, val_fraction=0.1, seed=1)
    assert sorted(os.listdir(out_dir)) == ["train.bin", "val.bin"]  # no meta.json: not a complete dataset
    assert (out_dir / "train.bin").read_bytes() == old_train  # the old complete file, untouched


# -----------------------------------------------------------------------------
# bad input: a clear PrepareError before anything is tokenized

@pytest.fixture
def no_tokenizing(monkeypatch):
    """Input checks alone: no BPE is loaded (so these run without it) and nothing may be tokenized."""
    def fail(*args, **kwargs):
        raise AssertionError("bad input must be reported before tokenizing")
    monkeypatch.setattr(prepare_openwebtext, "gpt2_encoding", lambda: None)
    monkeypatch.setattr(prepare_openwebtext, "tokenize_and_write", fail)


def mixed_folder(tmp):
    folder = write_text_folder(tmp / "corpus", ["a", "b"])
    write_jsonl(folder / "c.jsonl", [{"text": "c"}])
    return folder


def write_file(path, text):
    path.write_text(text)
    return path


BAD_INPUTS = {  # case: (make the --dataset path in tmp, what the message says)
    "missing file": (lambda tmp: tmp / "missing.jsonl", "no such file or folder"),
    "missing folder": (lambda tmp: tmp / "missing" / "folder" / "x", "no such file or folder"),
    "wrong column": (lambda tmp: write_jsonl(tmp / "c.jsonl", [{"body": "a"}, {"body": "b"}]),
                     "no column 'text'; its columns are: body"),
    "numbers, not text": (lambda tmp: write_jsonl(tmp / "c.jsonl", [{"text": 1}, {"text": 2}]), "not text"),
    "only empty records": (lambda tmp: write_jsonl(tmp / "c.jsonl", [{"text": ""}, {"text": " \n"}]), "no text"),
    "only empty files": (lambda tmp: write_text_folder(tmp / "corpus", ["", ""]), "no text"),
    "one document": (lambda tmp: write_text_folder(tmp / "corpus", ["one", " "]), "at least 2 documents"),
    "empty folder": (lambda tmp: write_text_folder(tmp / "corpus", []), "holds no"),
    "mixed file types": (mixed_folder, "mixes file types"),
    "malformed json": (lambda tmp: write_file(tmp / "c.jsonl", '{"text": "a"}\n{oops\n'), "could not load"),
    "csv": (lambda tmp: write_file(tmp / "c.csv", "text\na\n"), "unsupported file type"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_reported_clearly(tmp_path, no_tokenizing, case):
    make_source, message = BAD_INPUTS[case]
    with pytest.raises(PrepareError, match=message):
        prepare(str(make_source(tmp_path)), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("option, message", [
    ({"val_fraction": 1.5}, "val_fraction"), ({"num_proc": 0}, "num_proc"), ({"max_docs": 0}, "max_docs"),
])
def test_bad_options_are_reported_clearly(tmp_path, no_tokenizing, option, message):
    with pytest.raises(PrepareError, match=message):
        prepare(str(tmp_path), tmp_path / "out", **option)


@needs_bpe
def test_cli_reports_bad_input_without_a_traceback(tmp_path):
    source = write_jsonl(tmp_path / "c.jsonl", [{"body": "a"}])
    command = [sys.executable, str(REPO / "prepare_openwebtext.py"),
               "--dataset", str(source), "--out_dir", str(tmp_path / "out"), "--num_proc", "1"]
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "hf_cache")}
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode != 0
    assert "error:" in result.stderr and "its columns are: body" in result.stderr
    assert "Traceback" not in result.stderr
