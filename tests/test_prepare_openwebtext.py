"""prepare_openwebtext.py end to end on small local corpora (the hub path shares all of this code)."""
import argparse
import errno
import gzip
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# a requirement, but images without it (a GPU machine's, for its own tests) still collect the suite
datasets = pytest.importorskip("datasets", reason="prepare_openwebtext.py needs the datasets package")

import atomic
import prepare_openwebtext
from conftest import REPO, needs_bpe
from prepare_openwebtext import PrepareError, apply_preset, hash_router, prepare, split_budgets, token_count
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
@pytest.mark.parametrize("val_fraction", [0.1, 0.0005])
def test_the_split_is_nanogpts_document_for_document(tmp_path, val_fraction):
    documents = make_documents(1999)  # 0.0005 of them is 0.9995: one val document, rounded up as datasets does
    source = write_jsonl(tmp_path / "corpus.jsonl", [{"text": doc} for doc in documents])
    prepare(str(source), tmp_path / "out", val_fraction=val_fraction)
    # NanoGPT's own call, on the same documents
    nanogpt = datasets.Dataset.from_dict({"text": documents}).train_test_split(test_size=val_fraction, seed=2357,
                                                                               shuffle=True)
    assert read_split(tmp_path / "out" / "val.bin") == nanogpt["test"]["text"]  # the same documents, in order
    assert read_split(tmp_path / "out" / "train.bin") == nanogpt["train"]["text"]


@needs_bpe
def test_two_processes_write_the_same_files_as_one(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_openwebtext, "BATCH_DOCS", 4)  # many batches in flight in the tokenizing threads
    source = tmp_path / "corpus"  # two files, so that datasets reads them in two processes
    source.mkdir()
    documents = make_documents(30)
    for part in range(2):
        write_jsonl(source / f"part{part}.jsonl", [{"text": doc} for doc in documents[part::2]])
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
def test_meta_json_records_the_options_the_split_was_made_with(tmp_path):
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": doc} for doc in make_documents(12)])
    prepare(str(source), tmp_path / "out", val_fraction=0.25, seed=7, max_docs=10)
    meta = read_meta(tmp_path / "out")
    assert {key: meta[key] for key in ("val_fraction", "seed", "max_docs", "max_tokens", "streaming")} == \
        {"val_fraction": 0.25, "seed": 7, "max_docs": 10, "max_tokens": None, "streaming": False}
    assert meta["documents"] == {"train": 7, "val": 3}  # ceil(0.25 * 10) of the first 10 documents in val


@needs_bpe
def test_a_single_text_file_is_cut_into_documents_at_blank_lines(tmp_path):
    documents = make_documents(12)
    paragraphs = [doc.replace("\n\n", "\n").strip() for doc in documents]  # no blank line inside one
    source = write_file(tmp_path / "book.txt", "\n\n".join(paragraphs))
    meta = prepare(str(source), tmp_path / "out", val_fraction=0.2)
    check_prepared(tmp_path / "out", meta, paragraphs, num_empty=0, val_fraction=0.2)


def write_split_folder(folder, splits):
    """folder/{split}.jsonl for each split, each holding its own documents: "<split> document i"."""
    folder.mkdir()
    for split in splits:
        write_jsonl(folder / f"{split}.jsonl", [{"text": f"{split} document {i}"} for i in range(6)])
    return folder


@needs_bpe
@pytest.mark.parametrize("options, train, val, left_out", [
    ({"val_split": "validation"}, "train", "validation", "test.jsonl (named for split 'test')"),
    ({}, "train", "train", "test.jsonl (named for split 'test'), validation.jsonl (named for split 'validation')"),
    ({"split": "test"}, "test", "test",
     "train.jsonl (named for split 'train'), validation.jsonl (named for split 'validation')"),
])
def test_a_local_folder_trains_only_on_the_files_named_for_split(tmp_path, capsys, options, train, val, left_out):
    folder = write_split_folder(tmp_path / "corpus", ["train", "validation", "test"])
    prepare(str(folder), tmp_path / "out", val_fraction=0.5, **options)
    train_docs, val_docs = (read_split(tmp_path / "out" / f"{name}.bin") for name in ("train", "val"))
    assert {doc.split()[0] for doc in train_docs} == {train} and {doc.split()[0] for doc in val_docs} == {val}
    assert len(train_docs + val_docs) == 6 * len({train, val})  # every document of the splits used
    assert capsys.readouterr().out == \
        f"{folder}: {left_out.count('(')} file(s) left out of train.bin and val.bin: {left_out}\n"


@needs_bpe
def test_a_folder_without_train_names_never_trains_on_another_split(tmp_path, capsys):
    folder = write_split_folder(tmp_path / "corpus", ["notes", "more-notes", "test"])  # "notes" is no split name
    prepare(str(folder), tmp_path / "out", val_fraction=0.25)
    documents = read_split(tmp_path / "out" / "train.bin") + read_split(tmp_path / "out" / "val.bin")
    assert len(documents) == 12 and not any(doc.startswith("test") for doc in documents)
    assert "test.jsonl (named for split 'test')" in capsys.readouterr().out


@needs_bpe
def test_split_names_are_read_as_datasets_reads_them(tmp_path):
    # "training" is another name of train, and a digit ends a split's name as "-" and "." do
    folder = write_split_folder(tmp_path / "corpus", ["training", "validation0", "test1"])
    prepare(str(folder), tmp_path / "out", val_split="validation", val_fraction=0.5)
    assert {doc.split()[0] for doc in read_split(tmp_path / "out" / "train.bin")} == {"training"}
    assert {doc.split()[0] for doc in read_split(tmp_path / "out" / "val.bin")} == {"validation0"}


@needs_bpe
@pytest.mark.parametrize("suffix", [".jsonl", ".txt"])
def test_a_rerun_into_an_out_dir_inside_the_dataset_folder_reads_the_same_documents(tmp_path, capsys, suffix):
    # the first run's meta.json would be a document of a JSON corpus, and mix file types into a text one
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i, doc in enumerate(make_documents(8)):
        write_file(folder / f"doc{i}{suffix}", json.dumps({"text": doc}) + "\n" if suffix == ".jsonl" else doc)
    first = prepare(str(folder), folder / "tokens", val_fraction=0.25)
    written = {name: (folder / "tokens" / name).read_bytes() for name in ("train.bin", "val.bin")}
    assert "left out" not in capsys.readouterr().out
    assert prepare(str(folder), folder / "tokens", val_fraction=0.25) == first
    assert {name: (folder / "tokens" / name).read_bytes() for name in written} == written
    assert capsys.readouterr().out == f"{folder}: left out tokens: prepared dataset (train.bin and meta.json), not documents\n"


def test_a_prepared_dataset_passed_as_the_documents_says_to_train_on_it(tmp_path, no_tokenizing):
    (tmp_path / "owt").mkdir()
    (tmp_path / "owt" / "train.bin").write_bytes(b"")
    (tmp_path / "owt" / "meta.json").write_text("{}")
    with pytest.raises(PrepareError, match=r"owt is a prepared dataset .* train on it with python train.py --data_dir="):
        prepare(str(tmp_path / "owt"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_folder_of_other_splits_only_has_nothing_to_train_on(tmp_path, no_tokenizing):
    folder = write_split_folder(tmp_path / "corpus", ["validation", "test"])
    with pytest.raises(PrepareError, match="no file to train on: every file has 'test' or 'validation' as a word"):
        prepare(str(folder), tmp_path / "out")
    assert not (tmp_path / "out").exists()


# -----------------------------------------------------------------------------
# bad input: a clear PrepareError before anything is tokenized

@pytest.fixture
def no_tokenizing(monkeypatch):
    """Input checks alone: no BPE is loaded (so these run without it) and nothing may be tokenized."""
    def fail(*args, **kwargs):
        raise AssertionError("bad input must be reported before tokenizing")
    monkeypatch.setattr(prepare_openwebtext, "gpt2_encoding", lambda: None)
    monkeypatch.setattr(prepare_openwebtext, "tokenize_groups", fail)


def mixed_folder(tmp):
    folder = write_text_folder(tmp / "corpus", ["a", "b"])
    write_jsonl(folder / "c.jsonl", [{"text": "c"}])
    return folder


def write_file(path, text):
    path.write_text(text)
    return path


def saved_by_datasets(tmp, splits):
    """A folder written by datasets' save_to_disk: one dataset, or a DatasetDict of splits."""
    dataset = datasets.Dataset.from_dict({"text": ["a", "b"]})
    (datasets.DatasetDict({"train": dataset}) if splits else dataset).save_to_disk(str(tmp / "saved"))
    return tmp / "saved"


def latin1_line_41(tmp):
    """JSON lines whose 41st holds a Latin-1 byte, far enough in that a reader decoding ahead meets it early."""
    path = write_jsonl(tmp / "c.jsonl", [{"text": f"document {i}"} for i in range(40)])
    with open(path, "ab") as f:
        f.write('{"text": "caf\u00e9"}\n'.encode("latin-1"))
    return path


def latin1_text_line_3(tmp):
    """A folder of text documents, the second of which holds a Latin-1 byte on its third line."""
    folder = write_text_folder(tmp / "corpus", ["one document\n", "another\n\n"])
    with open(folder / "nested" / "doc001.txt", "ab") as f:
        f.write("caf\u00e9\n".encode("latin-1"))
    return folder


def cut_off_parquet(tmp):
    """Two parquet files, the second cut off halfway, as an interrupted download leaves it."""
    import pyarrow
    import pyarrow.parquet

    (tmp / "corpus").mkdir()
    for name in ("a", "b"):
        pyarrow.parquet.write_table(pyarrow.table({"text": [f"document {i}" for i in range(50)]}),
                                    tmp / "corpus" / f"{name}.parquet")
    whole = (tmp / "corpus" / "b.parquet").read_bytes()
    (tmp / "corpus" / "b.parquet").write_bytes(whole[:len(whole) // 2])
    return tmp / "corpus"


BAD_INPUTS = {  # case: (make the --dataset path in tmp, what the message says)
    "missing file": (lambda tmp: tmp / "missing.jsonl", "no such file or folder"),
    "missing folder": (lambda tmp: tmp / "missing" / "folder" / "x", "no such file or folder"),
    "wrong column": (lambda tmp: write_jsonl(tmp / "c.jsonl", [{"body": "a"}, {"body": "b"}]),
                     "no column 'text'; its columns are: body"),
    "numbers, not text": (lambda tmp: write_jsonl(tmp / "c.jsonl", [{"text": 1}, {"text": 2}]), "not text"),
    "only empty records": (lambda tmp: write_jsonl(tmp / "c.jsonl", [{"text": ""}, {"text": " \n"}]), "no text"),
    "only empty files": (lambda tmp: write_text_folder(tmp / "corpus", ["", ""]), "no text"),
    "one document": (lambda tmp: write_text_folder(tmp / "corpus", ["one", " "]),
                     "1 non-empty document.* at least 2 documents.*a single .txt file is cut into documents at "
                     "its blank lines; in a folder each .txt file is one document"),
    "one paragraph": (lambda tmp: write_file(tmp / "book.txt", "one paragraph,\nno blank line\n"),
                      "a text file, one document per paragraph.*: 1 non-empty document.* at least 2 documents"),
    "empty folder": (lambda tmp: write_text_folder(tmp / "corpus", []), "holds no"),
    "mixed file types": (mixed_folder, "mixes file types"),
    "malformed json": (lambda tmp: write_file(tmp / "c.jsonl", '{"text": "a"}\n{oops\n'),
                       r"could not load.*; first bad line: .*c\.jsonl, line 2 \(Expecting property name"),
    "csv": (lambda tmp: write_file(tmp / "c.csv", "text\na\n"), "unsupported file type"),
    "saved by datasets": (lambda tmp: saved_by_datasets(tmp, splits=False), "written by datasets' save_to_disk"),
    "saved with splits": (lambda tmp: saved_by_datasets(tmp, splits=True), "written by datasets' save_to_disk"),
    "not UTF-8": (latin1_line_41, r"first bad line: .*c\.jsonl, line 41 \('utf-8' codec can't decode byte 0xe9"),
    "text not UTF-8": (latin1_text_line_3, r"first bad line: .*doc001\.txt, line 3 \('utf-8' codec can't decode"),
    "cut-off parquet": (cut_off_parquet, r"; .*b\.parquet cannot be read \(ArrowInvalid: "),
}


# the same cases for a streamed run, but too few documents: a split by hash learns that only as it writes
# (test_streamed_run_of_one_document_is_an_error)
BAD_INPUT_RUNS = [(case, False) for case in BAD_INPUTS] + \
                 [(case, True) for case in BAD_INPUTS if case not in ("one document", "one paragraph")]
RUN_IDS = [f"{case}, {'streamed' if streaming else 'loaded'}" for case, streaming in BAD_INPUT_RUNS]


@pytest.mark.parametrize("case, streaming", BAD_INPUT_RUNS, ids=RUN_IDS)
def test_bad_input_is_reported_clearly(tmp_path, no_tokenizing, case, streaming):
    make_source, message = BAD_INPUTS[case]
    with pytest.raises(PrepareError, match=message):
        prepare(str(make_source(tmp_path)), tmp_path / "out", streaming=streaming)
    assert not (tmp_path / "out").exists()


def test_an_error_in_a_worker_process_is_one_line(tmp_path, no_tokenizing):
    """With --num_proc 2, datasets reads two files in two processes, and a worker's error comes back holding
    the worker's whole traceback as text."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", [{"text": "a"}, {"text": "b"}])
    write_file(folder / "b.jsonl", '{"text": "c"}\n{oops\n')
    with pytest.raises(PrepareError) as raised:
        prepare(str(folder), tmp_path / "out", num_proc=2)
    message = str(raised.value)
    assert "\n" not in message and "an error in a worker process (rerun with --num_proc 1 to see it)" in message
    assert re.search(r"; first bad line: .*b\.jsonl, line 2 ", message)


@needs_bpe
@pytest.mark.parametrize("damage, message", [
    ("cut off", r"; .*c4-train\.00003-of-00004\.json\.gz cannot be read \(EOFError\)"),
    ("bad line", r"; first bad line: .*c4-train\.00003-of-00004\.json\.gz, line 301 "),
])
def test_a_stream_that_fails_in_a_late_shard_looks_in_that_shard_first(tmp_path, monkeypatch, damage, message):
    """Searching the shards in order for the bad place would read all of C4's earlier ones again, for hours."""
    folder = tmp_path / "c4"
    folder.mkdir()
    for shard in range(4):
        lines = [json.dumps({"text": f"shard {shard} document {i}"}) + "\n" for i in range(600)]
        if shard == 3 and damage == "bad line":
            lines[300] = "{oops\n"
        data = gzip.compress("".join(lines).encode())
        (folder / f"c4-train.{shard:05d}-of-00004.json.gz").write_bytes(data[:len(data) // 2] if
                                                                         shard == 3 and damage == "cut off" else data)
    searched = []
    real_bad_line = prepare_openwebtext.bad_line
    monkeypatch.setattr(prepare_openwebtext, "bad_line", lambda name, builder: searched.append(Path(name).name)
                        or real_bad_line(name, builder))
    with pytest.raises(PrepareError, match=message):
        prepare(str(folder), tmp_path / "out", streaming=True, max_tokens=10**6)
    assert searched == ["c4-train.00003-of-00004.json.gz"]


@pytest.mark.parametrize("option, message", [
    ({"val_fraction": 1.5}, "val_fraction"), ({"val_fraction": 0}, "val_fraction must be between 0 and 1"),
    ({"val_fraction": 1}, "val_fraction must be between 0 and 1"), ({"num_proc": 0}, "num_proc"),
    ({"max_docs": 0}, "max_docs"), ({"seed": -1}, "--seed must be 0 or more, got -1"),
    ({"max_tokens": 10**6}, "--max_tokens needs --streaming"),
    ({"max_tokens": 0, "streaming": True}, "--max_tokens must be at least 1"),
    ({"max_tokens": 1999, "streaming": True}, "leaves val.bin no token"),  # 1999 * 0.0005 < 1
    ({"max_docs": 5, "streaming": True}, "limit a --streaming run with --max_tokens"),
    ({"val_split": "train"}, "val must come from another split"),
    ({"dataset_config": "en"}, "local files have no configs"),
])
def test_bad_options_are_reported_clearly(tmp_path, no_tokenizing, option, message):
    with pytest.raises(PrepareError, match=message):
        prepare(str(tmp_path), tmp_path / "out", **option)


def test_an_out_dir_under_a_file_is_refused_before_loading(tmp_path, no_tokenizing, monkeypatch):
    def load_dataset(*args, **kwargs):
        raise AssertionError("the output folder must be checked before the corpus is loaded")
    monkeypatch.setattr(prepare_openwebtext, "load_dataset", load_dataset)
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": "a"}, {"text": "b"}])
    write_file(tmp_path / "a_file", "x")
    with pytest.raises(SystemExit) as exited:
        prepare_openwebtext.main(["--dataset", str(source), "--out_dir", str(tmp_path / "a_file" / "out")])
    assert exited.value.code == f"error: cannot write the dataset to {tmp_path / 'a_file' / 'out'}: " \
                              f"{tmp_path / 'a_file'} is a file, not a folder (choose another --out_dir)"


@needs_bpe
@pytest.mark.parametrize("failure", ["disk full", "Ctrl-C"])
def test_a_failed_write_is_an_error_line_that_keeps_the_old_files(failure, tmp_path, monkeypatch, capsys):
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": doc} for doc in make_documents(10)])
    out_dir = tmp_path / "out"
    prepare(str(source), out_dir, val_fraction=0.2)
    old = {name: (out_dir / name).read_bytes() for name in ("meta.json", "train.bin", "val.bin")}

    def fail(*args):
        raise OSError(errno.ENOSPC, "No space left on device") if failure == "disk full" else KeyboardInterrupt

    monkeypatch.setattr(prepare_openwebtext.TokenFile, "append", fail)
    with pytest.raises(SystemExit) as exited:
        prepare_openwebtext.main(["--dataset", str(source), "--out_dir", str(out_dir), "--val_fraction", "0.2",
                                  "--num_proc", "1"])
    if failure == "disk full":
        assert exited.value.code == f"error: cannot write the dataset to {out_dir}: No space left on device"
    else:
        assert exited.value.code == 130
        assert capsys.readouterr().err.endswith(f"stopped by Ctrl-C; {out_dir} holds a complete dataset\n")
    assert {name: (out_dir / name).read_bytes() for name in sorted(os.listdir(out_dir))} == old  # usable as it was


@pytest.mark.slow  # a subprocess importing datasets: about 5 s on 2 busy cores
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


@pytest.fixture
def no_bpe(monkeypatch):
    """The GPT-2 BPE cannot be loaded (offline, no tiktoken cache)."""
    def unavailable():
        raise prepare_openwebtext.TokenizerUnavailableError("no BPE")
    monkeypatch.setattr(prepare_openwebtext, "gpt2_encoding", unavailable)


def test_a_missing_path_is_reported_before_the_tokenizer_is_loaded(tmp_path, no_bpe):
    with pytest.raises(PrepareError, match="no such file or folder"):
        prepare(str(tmp_path / "missing.jsonl"), tmp_path / "out")


@pytest.mark.parametrize("name", ["corpus.jsonl", "my_corpus/"])  # a folder written with its trailing slash
def test_a_mistyped_relative_file_name_is_not_looked_up_on_the_hub(name, tmp_path, no_tokenizing, monkeypatch):
    def load_dataset(*args, **kwargs):
        raise AssertionError(f"{name} names a local file or folder, not a hub dataset")
    monkeypatch.setattr(prepare_openwebtext, "load_dataset", load_dataset)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PrepareError, match=f"^{name}: no such file or folder$"):
        prepare(name, tmp_path / "out")


@pytest.mark.parametrize("streaming", [False, True])
def test_a_hub_dataset_out_of_reach_says_what_to_do_offline(streaming, tmp_path, no_tokenizing, monkeypatch):
    def unreachable(*args, **kwargs):  # what datasets raises offline or with HF_HUB_OFFLINE=1
        raise ConnectionError("Couldn't reach 'someone/corpus' on the Hub (LocalEntryNotFoundError)") \
            from FileNotFoundError("Dataset someone/corpus is not cached in None")
    monkeypatch.setattr(prepare_openwebtext, "load_dataset", unreachable)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PrepareError, match=r"Couldn't reach .* not cached in None; without a network, pass local "
                                           r"files instead: --dataset path/to/folder_or_file \(docs/data.md, "
                                           r"'Local input and running offline'\)$"):
        prepare("someone/corpus", tmp_path / "out", streaming=streaming)


def test_a_hub_dataset_that_fails_otherwise_gets_no_offline_advice(tmp_path, no_tokenizing, monkeypatch):
    def not_found(*args, **kwargs):
        raise ValueError("Dataset 'someone/corpus' doesn't exist on the Hub or cannot be accessed.")
    monkeypatch.setattr(prepare_openwebtext, "load_dataset", not_found)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PrepareError) as raised:
        prepare("someone/corpus", tmp_path / "out")
    assert "doesn't exist on the Hub" in str(raised.value) and "without a network" not in str(raised.value)


@needs_bpe
def test_the_closing_line_counts_one_document_in_the_singular(tmp_path, capsys):
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": doc} for doc in make_documents(9)] + [{"text": " "}])
    prepare_openwebtext.main(["--dataset", str(source), "--out_dir", str(tmp_path / "out"), "--val_fraction", "0.1",
                              "--num_proc", "1"])
    line = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(r"wrote .*: [\d,]+ train tokens \(8 documents\), [\d,]+ val tokens \(1 document\), "
                        r"1 empty document skipped", line), line


@needs_bpe
def test_a_dataset_of_another_source_is_replaced_saying_so(tmp_path, capsys):
    out_dir = tmp_path / "out"
    for name, said in (("a.jsonl", ""), ("a.jsonl", ""), ("b.jsonl", f"replaced the dataset in {out_dir}, which was "
                                                                      f"made from {tmp_path / 'a.jsonl'}\n")):
        source = write_jsonl(tmp_path / name, [{"text": doc} for doc in make_documents(10)])
        prepare_openwebtext.main(["--dataset", str(source), "--out_dir", str(out_dir), "--val_fraction", "0.2",
                                  "--num_proc", "1"])
        assert capsys.readouterr().out.startswith(f"{said}wrote {out_dir}: ")


def test_cli_reports_an_unavailable_tokenizer_without_a_traceback(tmp_path, no_bpe):
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": "a"}, {"text": "b"}])
    with pytest.raises(SystemExit) as exited:
        prepare_openwebtext.main(["--dataset", str(source), "--out_dir", str(tmp_path / "out")])
    assert exited.value.code == "error: no BPE"
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # a subprocess importing datasets: about 5 s on 2 busy cores
def test_cli_reports_a_missing_path_without_a_tokenizer_cache(tmp_path):
    env = {key: value for key, value in os.environ.items() if key not in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR")}
    env["TIKTOKEN_CACHE_DIR"] = str(tmp_path / "empty_cache")  # no BPE anywhere: it must not be needed
    command = [sys.executable, str(REPO / "prepare_openwebtext.py"), "--dataset", "/nonexistent",
               "--out_dir", str(tmp_path / "out")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert (result.returncode, result.stderr) == (1, "error: /nonexistent: no such file or folder\n")


def test_help_names_the_tokenizer_cache_for_offline_use(capsys):
    with pytest.raises(SystemExit):
        prepare_openwebtext.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "unless TIKTOKEN_CACHE_DIR names a folder holding tiktoken's cached r50k_base file" in text
    assert "a single .txt file is cut into documents at its blank lines" in text


# -----------------------------------------------------------------------------
# streamed runs (--streaming, --max_tokens, --val_split, the c4 preset) on local files laid out as C4's

def write_jsonl_gz(path, records):
    with gzip.open(path, "wt", encoding="utf-8") as file:
        file.write("".join(json.dumps(record) + "\n" for record in records))
    return path


def c4_record(text, i):
    return {"text": text, "timestamp": "2019-04-25T12:57:54Z", "url": f"https://example.com/{i}"}


def write_c4_folder(folder, train, val, shards=2):
    """C4's own layout and names: train in `shards` gzipped json-lines files, in order, val in one."""
    (folder / "en").mkdir(parents=True)
    per_shard = math.ceil(len(train) / shards)
    for shard in range(shards):
        docs = train[shard * per_shard:(shard + 1) * per_shard]
        write_jsonl_gz(folder / "en" / f"c4-train.{shard:05d}-of-{shards:05d}.json.gz",
                       [c4_record(doc, i) for i, doc in enumerate(docs)])
    write_jsonl_gz(folder / "en" / "c4-validation.00000-of-00001.json.gz",
                   [c4_record(doc, i) for i, doc in enumerate(val)])
    return folder


VAL_DOCUMENTS = [f"Validation page {i}: " + "held-out words " * (i % 5) for i in range(8)]


def token_lengths(documents):
    return [len(gpt2_encoding().encode_ordinary(doc)) + 1 for doc in documents]


def tokens_of(documents):
    return np.array([t for doc in documents for t in gpt2_encoding().encode_ordinary(doc) + [EOT_TOKEN]], np.uint16)


def read_ids(path):
    return np.fromfile(path, dtype=np.uint16)


def fitting_prefix(documents, budget):
    """The documents a budget keeps: the longest prefix whose tokens fit."""
    ends = np.cumsum(token_lengths(documents))
    return documents[:int(np.searchsorted(ends, budget, side="right"))]


@needs_bpe
@pytest.mark.parametrize("streaming", [False, True])
def test_text_column_names_the_column_the_documents_are_read_from(tmp_path, streaming):
    documents = make_documents(20)
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": "not the document", "body": doc} for doc in documents])
    meta = prepare(str(source), tmp_path / "out", text_column="body", val_fraction=0.2, streaming=streaming)
    train, val = read_split(tmp_path / "out" / "train.bin"), read_split(tmp_path / "out" / "val.bin")
    assert sorted(train + val) == sorted(documents) and meta["text_column"] == "body"


@needs_bpe
def test_streams_that_open_with_empty_documents_count_them_all(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_openwebtext, "BATCH_DOCS", 2)  # each split's first batch is empty documents only
    folder = write_c4_folder(tmp_path / "c4", EMPTY_DOCUMENTS + make_documents(10), EMPTY_DOCUMENTS + VAL_DOCUMENTS)
    meta = prepare(str(folder), tmp_path / "out", val_split="validation", streaming=True)
    assert meta["empty_documents_skipped"] == 4
    assert read_split(tmp_path / "out" / "val.bin") == VAL_DOCUMENTS


@needs_bpe
def test_streamed_run_writes_the_same_files_as_the_loaded_run(tmp_path):
    documents = make_documents(40)
    with_empty = documents[:7] + EMPTY_DOCUMENTS + documents[7:]
    folder = write_c4_folder(tmp_path / "c4", with_empty, VAL_DOCUMENTS + [""])

    loaded = prepare(str(folder), tmp_path / "loaded", val_split="validation")
    streamed = prepare(str(folder), tmp_path / "streamed", val_split="validation", streaming=True)

    for name in ("train.bin", "val.bin"):  # the same token files, byte for byte
        assert (tmp_path / "loaded" / name).read_bytes() == (tmp_path / "streamed" / name).read_bytes()
    assert (read_ids(tmp_path / "streamed" / "train.bin") == tokens_of(documents)).all()  # in C4's order
    assert read_split(tmp_path / "streamed" / "val.bin") == VAL_DOCUMENTS  # C4's own validation split, whole
    assert {key: loaded[key] for key in loaded if key != "streaming"} == \
           {key: streamed[key] for key in streamed if key != "streaming"}
    assert streamed["empty_documents_skipped"] == 3 and streamed["streaming"] and not loaded["streaming"]
    assert streamed == read_meta(tmp_path / "streamed")
    assert sorted(os.listdir(tmp_path / "streamed")) == ["meta.json", "train.bin", "val.bin"]


@needs_bpe
def test_streamed_hash_split_holds_the_documents_of_the_loaded_split(tmp_path):
    documents = make_documents(60)
    source = write_jsonl_gz(tmp_path / "corpus.jsonl.gz", [{"text": doc} for doc in documents + EMPTY_DOCUMENTS])

    loaded = prepare(str(source), tmp_path / "loaded", val_fraction=0.2)
    streamed = prepare(str(source), tmp_path / "streamed", val_fraction=0.2, streaming=True)

    # other documents in val (a hash, not a shuffle), the same documents and tokens in all
    train, val = (read_split(tmp_path / "streamed" / f"{split}.bin") for split in ("train", "val"))
    route = hash_router(0.2, seed=2357)
    assert train == [doc for doc in documents if route(doc) == "train"]  # in the source's order
    assert val == [doc for doc in documents if route(doc) == "val"] and len(val) > 0
    assert sum(streamed["tokens"].values()) == sum(loaded["tokens"].values()) == sum(token_lengths(documents))
    assert streamed["documents"]["val"] == len(val) and streamed["empty_documents_skipped"] == 2
    check_prepared(tmp_path / "loaded", loaded, documents, num_empty=2, val_fraction=0.2)  # a .gz file, loaded


@needs_bpe
def test_streaming_in_threads_writes_the_same_files_as_one_thread(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_openwebtext, "BATCH_DOCS", 4)  # many batches in flight
    folder = write_c4_folder(tmp_path / "c4", make_documents(50), VAL_DOCUMENTS)
    for num_proc in (1, 3):
        prepare(str(folder), tmp_path / f"threads{num_proc}", val_split="validation", streaming=True,
                num_proc=num_proc, max_tokens=700, val_fraction=0.25)
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "threads1" / name).read_bytes() == (tmp_path / "threads3" / name).read_bytes()


def test_hash_router_is_seeded_and_depends_on_the_text_only():
    documents = [f"document number {i}" for i in range(5000)]
    route = hash_router(0.1, seed=7)
    val = {doc for doc in documents if route(doc) == "val"}
    assert abs(len(val) - 500) < 100  # 0.1 of 5000; the binomial's standard deviation is 21
    assert val == {doc for doc in documents if hash_router(0.1, seed=7)(doc) == "val"}  # same seed, same split
    assert val != {doc for doc in documents if hash_router(0.1, seed=8)(doc) == "val"}
    assert all(route(doc) == "val" for doc in val)  # a repeated document lands on the same side again


def test_budgets_split_max_tokens_as_typed():
    assert split_budgets(30_000_000_000, 0.0005) == {"train": 29_985_000_000, "val": 15_000_000}
    assert split_budgets(100, 0.29) == {"train": 71, "val": 29}  # not 28: 100 * 0.29 is 28.999999999999996 in floats
    assert split_budgets(None, 0.3) == {"train": None, "val": None}


@pytest.mark.parametrize("text, count", [("100000000", 10**8), ("100_000_000", 10**8), ("1e8", 10**8),
                                         ("100M", 10**8), ("30B", 30 * 10**9), ("0.1b", 10**8), ("50k", 50_000)])
def test_max_tokens_reads_counts_as_people_write_them(text, count):
    assert token_count(text) == count


@pytest.mark.parametrize("text", ["5e", "1.5", "lots", "M"])
def test_max_tokens_rejects_what_is_not_a_count(text):
    with pytest.raises(argparse.ArgumentTypeError, match="token"):
        token_count(text)


def max_tokens_for(train_budget):
    """The --max_tokens that leaves train.bin train_budget tokens with --val_fraction 0.25."""
    return next(n for n in range(train_budget, 2 * train_budget) if n - n // 4 == train_budget)


@needs_bpe
@pytest.mark.parametrize("cut", ["inside a document", "at the end of a document"])
def test_max_tokens_cuts_each_split_at_a_document_boundary(tmp_path, cut):
    documents = make_documents(30)
    folder = write_c4_folder(tmp_path / "c4", documents, VAL_DOCUMENTS)
    # a train budget that ends inside document 12, or exactly after it; val gets a quarter of max_tokens
    train_budget = sum(token_lengths(documents[:12])) + (3 if cut == "inside a document" else 0)
    max_tokens = max_tokens_for(train_budget)
    val_budget = max_tokens // 4

    meta = prepare(str(folder), tmp_path / "out", val_split="validation", streaming=True,
                   max_tokens=max_tokens, val_fraction=0.25)

    train, val = fitting_prefix(documents, train_budget), fitting_prefix(VAL_DOCUMENTS, val_budget)
    assert len(train) == 12 and 0 < len(val) < len(VAL_DOCUMENTS)
    assert (read_ids(tmp_path / "out" / "train.bin") == tokens_of(train)).all()
    assert (read_ids(tmp_path / "out" / "val.bin") == tokens_of(val)).all()
    assert meta["tokens"] == {"train": len(tokens_of(train)), "val": len(tokens_of(val))}
    assert sum(meta["tokens"].values()) <= max_tokens and meta["max_tokens"] == max_tokens
    assert (meta["tokens"]["train"] == train_budget) == (cut == "at the end of a document")  # the budget is inclusive
    assert meta["documents"] == {"train": 12, "val": len(val)}


@needs_bpe
@pytest.mark.parametrize("num_proc", [1, 2])
def test_a_budget_keeps_a_prefix_though_shorter_documents_follow(tmp_path, monkeypatch, num_proc):
    monkeypatch.setattr(prepare_openwebtext, "BATCH_DOCS", 1)  # threads tokenize the documents after the cut ahead
    route = hash_router(0.25, seed=2357)
    pages = [f"Page {i}: " + "many more words " * (20 if i % 2 else 1) for i in range(60)]
    short, long = ([page for page in pages[parity::2] if route(page) == "train"] for parity in (0, 1))
    documents = short[:5] + long[:1] + short[5:] + [page for page in pages[::2] if route(page) == "val"]
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": doc} for doc in documents])
    train_budget = sum(token_lengths(short[:5])) + 10  # the long document does not fit; the short ones after it would

    meta = prepare(str(source), tmp_path / "out", streaming=True, num_proc=num_proc,
                   max_tokens=max_tokens_for(train_budget), val_fraction=0.25)

    assert (read_ids(tmp_path / "out" / "train.bin") == tokens_of(short[:5])).all()
    assert meta["documents"]["train"] == 5 and meta["documents"]["val"] > 0


@needs_bpe
def test_max_tokens_with_a_hash_split(tmp_path):
    documents = make_documents(80)
    source = write_jsonl(tmp_path / "corpus.jsonl", [{"text": doc} for doc in documents])
    max_tokens = sum(token_lengths(documents)) // 2

    meta = prepare(str(source), tmp_path / "out", streaming=True, max_tokens=max_tokens, val_fraction=0.25)

    route = hash_router(0.25, seed=2357)  # each split is the prefix of its own documents that fits its budget
    train = fitting_prefix([doc for doc in documents if route(doc) == "train"], max_tokens - max_tokens // 4)
    val = fitting_prefix([doc for doc in documents if route(doc) == "val"], max_tokens // 4)
    assert (read_ids(tmp_path / "out" / "train.bin") == tokens_of(train)).all()
    assert (read_ids(tmp_path / "out" / "val.bin") == tokens_of(val)).all()
    assert 0 < sum(meta["tokens"].values()) <= max_tokens


@needs_bpe
def test_max_tokens_beyond_the_corpus_takes_all_of_it(tmp_path):
    folder = write_c4_folder(tmp_path / "c4", make_documents(20), VAL_DOCUMENTS)
    whole = prepare(str(folder), tmp_path / "whole", val_split="validation", streaming=True)
    capped = prepare(str(folder), tmp_path / "capped", val_split="validation", streaming=True, max_tokens=10**9)
    assert capped["tokens"] == whole["tokens"] and capped["documents"] == whole["documents"]


@needs_bpe
def test_budget_below_the_first_document_is_an_error_that_leaves_no_dataset(tmp_path):
    folder = write_c4_folder(tmp_path / "c4", make_documents(20), VAL_DOCUMENTS)
    with pytest.raises(PrepareError, match=r"budget of 5 tokens, less than its first document .* --val_fraction"):
        prepare(str(folder), tmp_path / "out", val_split="validation", streaming=True, max_tokens=10_000,
                val_fraction=0.0005)
    assert os.listdir(tmp_path / "out") == []  # no meta.json, no temporary file


@needs_bpe
def test_streamed_run_of_one_document_is_an_error(tmp_path):
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": "one"}, {"text": " "}])
    with pytest.raises(PrepareError, match="no document went to val: 1 non-empty document.*at least 2 documents"):
        prepare(str(source), tmp_path / "out", streaming=True)
    assert os.listdir(tmp_path / "out") == []


@needs_bpe
@pytest.mark.parametrize("streaming, num_proc", [(False, 1), (True, 1), (True, 2)])
def test_interrupted_run_leaves_the_earlier_dataset_whole(tmp_path, monkeypatch, streaming, num_proc):
    folder = write_c4_folder(tmp_path / "c4", make_documents(40), VAL_DOCUMENTS)
    out_dir = tmp_path / "out"
    prepare(str(folder), out_dir, val_split="validation", streaming=streaming)
    old = {name: (out_dir / name).read_bytes() for name in ("meta.json", "train.bin", "val.bin")}

    calls = []

    def flaky_tokenize(work):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt  # Ctrl-C while train.bin's temporary file is being filled
        return real_tokenize(work)

    real_tokenize = prepare_openwebtext.tokenize_groups
    monkeypatch.setattr(prepare_openwebtext, "BATCH_DOCS", 5)
    monkeypatch.setattr(prepare_openwebtext, "tokenize_groups", flaky_tokenize)
    with pytest.raises(KeyboardInterrupt):
        prepare(str(folder), out_dir, val_split="validation", streaming=streaming, num_proc=num_proc)
    assert len(calls) >= 4  # it stopped while writing, not before (threads may have started a few more)
    assert sorted(os.listdir(out_dir)) == ["meta.json", "train.bin", "val.bin"]  # no temporary file
    assert {name: (out_dir / name).read_bytes() for name in old} == old  # the old complete dataset, untouched


@needs_bpe
def test_a_killed_runs_temporary_files_are_removed_and_a_running_writers_kept(tmp_path, capsys):
    """A SIGKILL mid-write leaves train.bin.<pid>.tmp (as large as train.bin) where no handler could
    remove it; the next run removes it, but not the file of a process still writing."""
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": doc} for doc in make_documents(10)])
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    killed = subprocess.Popen([sys.executable, "-c", "pass"])
    killed.wait()
    abandoned = [out_dir / f"{name}.{killed.pid}.tmp" for name in ("train.bin", "val.bin", "meta.json")]
    running = out_dir / f"train.bin.{os.getppid()}.tmp"
    for path in (*abandoned, running):
        path.write_bytes(b"\0" * 64)
    prepare(str(source), out_dir, val_fraction=0.2)
    assert sorted(os.listdir(out_dir)) == sorted(["meta.json", "train.bin", "val.bin", running.name])
    out = capsys.readouterr().out
    assert all(f"removed {path}, left by a run that was killed while writing it" in out for path in abandoned)


@needs_bpe
def test_the_earlier_meta_json_is_gone_before_new_token_files_replace_the_old(tmp_path, monkeypatch):
    """A kill between the two renames must not leave the old meta.json beside a new train.bin."""
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": doc} for doc in make_documents(10)])
    out_dir = tmp_path / "out"
    prepare(str(source), out_dir, val_fraction=0.2)
    meta_at_rename, real_replace = {}, os.replace

    def replace(src, dst):
        meta_at_rename[Path(dst).name] = (out_dir / "meta.json").exists()
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", replace)
    prepare(str(source), out_dir, val_fraction=0.2)
    assert meta_at_rename == {"train.bin": False, "val.bin": False, "meta.json": False}


def append_a_cut_off_record(folder):
    """A malformed record at the end of the last train shard of write_c4_folder's folder; returns the shard."""
    shard = folder / "en" / "c4-train.00001-of-00002.json.gz"
    with gzip.open(shard, "at", encoding="utf-8") as file:
        file.write('{"text": "cut off in the middle of a reco\n')
    return shard


@needs_bpe
def test_a_met_budget_stops_reading_the_stream(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_openwebtext, "BATCH_DOCS", 5)
    folder = write_c4_folder(tmp_path / "c4", make_documents(40), VAL_DOCUMENTS)
    append_a_cut_off_record(folder)  # never read: the budget is met in the first shard
    meta = prepare(str(folder), tmp_path / "out", val_split="validation", streaming=True, max_tokens=100,
                   val_fraction=0.2, num_proc=1)
    assert 0 < meta["documents"]["train"] < 20


@needs_bpe
def test_unreadable_data_later_in_the_stream_stops_the_run_cleanly(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_openwebtext, "BATCH_DOCS", 5)
    folder = write_c4_folder(tmp_path / "c4", make_documents(40), VAL_DOCUMENTS)
    shard = append_a_cut_off_record(folder)
    with gzip.open(shard, "rt", encoding="utf-8") as file:
        lines = len(file.read().splitlines())  # the cut-off record is the last
    with pytest.raises(PrepareError, match=rf"could not read split 'train' of .* after \d+ documents.*; first bad "
                                           rf"line: .*c4-train\.00001-of-00002\.json\.gz, line {lines} "):
        prepare(str(folder), tmp_path / "out", val_split="validation", streaming=True)
    assert os.listdir(tmp_path / "out") == []


@needs_bpe
@pytest.mark.parametrize("streaming", [False, True])
def test_a_cut_off_gzip_file_is_named_in_one_error(tmp_path, streaming):
    """An interrupted download leaves a .json.gz without its end; datasets' error does not say which file."""
    folder = write_c4_folder(tmp_path / "c4", make_documents(40), VAL_DOCUMENTS)
    shard = folder / "en" / "c4-train.00001-of-00002.json.gz"
    shard.write_bytes(shard.read_bytes()[:-20])
    with pytest.raises(PrepareError, match=rf"EOFError: Compressed file ended .*; {re.escape(str(shard))} cannot be read"):
        prepare(str(folder), tmp_path / "out", val_split="validation", streaming=streaming, num_proc=1)
    assert not list((tmp_path / "out").glob("*"))


@needs_bpe
def test_c4_preset_streams_allenai_c4_en_into_data_c4(tmp_path, monkeypatch, capsys):
    # No network here: the hub call is answered from local files in C4's layout, and the test checks
    # that the preset asks load_dataset for exactly what the hub path needs.
    folder = write_c4_folder(tmp_path / "c4_files", make_documents(30), VAL_DOCUMENTS)
    calls = []

    def local_c4(path, name=None, split=None, streaming=False, **options):
        calls.append((path, name, split, streaming, options))
        files = {s: str(folder / "en" / f"c4-{s}.*.json.gz") for s in ("train", "validation")}
        return datasets.load_dataset("json", data_files=files, split=split, streaming=streaming)

    monkeypatch.setattr(prepare_openwebtext, "load_dataset", local_c4)
    monkeypatch.chdir(tmp_path)
    prepare_openwebtext.main(["--dataset", "c4", "--max_tokens", "0.3k", "--val_fraction", "0.2", "--num_proc", "1"])

    assert calls == [("allenai/c4", "en", "validation", True, {}), ("allenai/c4", "en", "train", True, {})]
    meta = read_meta(tmp_path / "data" / "c4")
    assert (meta["source"], meta["preset"], meta["dataset_config"]) == ("allenai/c4", "c4", "en")
    assert (meta["split"], meta["val_split"], meta["streaming"]) == ("train", "validation", True)
    assert meta["max_tokens"] == 300
    assert 0 < meta["tokens"]["train"] <= 240 and 0 < meta["tokens"]["val"] <= 60  # 300 tokens, a fifth for val
    assert meta["documents"]["train"] < 30  # the budget, not the end of the data, stopped it
    assert capsys.readouterr().out.startswith(f"wrote data/c4: {meta['tokens']['train']:,} train tokens")


@needs_bpe
def test_the_c4_preset_beside_a_local_folder_named_c4_says_which_it_reads(tmp_path, monkeypatch, capsys):
    folder = write_c4_folder(tmp_path / "c4", make_documents(30), VAL_DOCUMENTS)
    files = {s: str(folder / "en" / f"c4-{s}.*.json.gz") for s in ("train", "validation")}
    monkeypatch.setattr(prepare_openwebtext, "load_dataset", lambda path, **options: datasets.load_dataset(
        "json", data_files=files, split=options["split"], streaming=True))  # the hub, answered offline
    monkeypatch.chdir(tmp_path)
    prepare_openwebtext.main(["--dataset", "c4", "--max_tokens", "0.3k", "--val_fraction", "0.2", "--num_proc", "1"])
    assert capsys.readouterr().out.startswith("note: --dataset c4 is the preset for allenai/c4 on the hub; the local "
                                              "c4 is not read (for it, write --dataset ./c4)")


def test_a_preset_fills_only_the_options_left_unset():
    assert apply_preset("c4", "data/mine", None, False, None) == {
        "dataset": "allenai/c4", "out_dir": "data/mine", "dataset_config": "en", "streaming": False,
        "val_split": "validation"}
    assert apply_preset("corpus/", None, None, None, None) == {
        "dataset": "corpus/", "out_dir": "data/openwebtext", "dataset_config": None, "streaming": False,
        "val_split": None}


@needs_bpe
def test_loaded_run_with_val_split_keeps_the_splits_apart(tmp_path):
    folder = write_c4_folder(tmp_path / "c4", make_documents(9), VAL_DOCUMENTS)
    meta = prepare(str(folder), tmp_path / "out", val_split="validation", max_docs=4)
    assert read_split(tmp_path / "out" / "train.bin") == make_documents(4)  # the first 4 of each split, in order
    assert read_split(tmp_path / "out" / "val.bin") == VAL_DOCUMENTS[:4]
    assert meta["empty_documents_skipped"] == 0


def single_file(tmp):
    return write_jsonl(tmp / "c.jsonl", [{"text": "a"}, {"text": "b"}])


def folder_without_val_files(tmp):
    folder = write_c4_folder(tmp / "c4", ["a", "b"], ["c"], shards=1)
    (folder / "en" / "c4-validation.00000-of-00001.json.gz").rename(folder / "en" / "c4-valid.json.gz")
    return folder  # "valid" is another word than "validation"


def only_val_files(tmp):
    folder = write_c4_folder(tmp / "c4", ["a", "b"], ["c"], shards=1)
    (folder / "en" / "c4-train.00000-of-00001.json.gz").unlink()
    return folder


def gzipped_parquet(tmp):
    return write_file(tmp / "c.parquet.gz", "not read")


BAD_STREAMED_INPUTS = {  # case: (make the --dataset path in tmp, options, what the message says)
    "val split of one file": (single_file, {"val_split": "validation"}, "needs a folder holding the files of both"),
    "no file named for it": (folder_without_val_files, {"val_split": "validation"}, "no file has 'validation'"),
    "every file named for it": (only_val_files, {"val_split": "validation"}, "every file has 'validation'"),
    "gzipped parquet": (gzipped_parquet, {}, "unsupported file type"),
}


@pytest.mark.parametrize("case", BAD_STREAMED_INPUTS)
def test_bad_streamed_input_is_reported_before_anything_is_written(tmp_path, no_tokenizing, case):
    make_source, options, message = BAD_STREAMED_INPUTS[case]
    with pytest.raises(PrepareError, match=message):
        prepare(str(make_source(tmp_path)), tmp_path / "out", streaming=True, **options)
    assert not (tmp_path / "out").exists()


def test_cli_reports_bad_streaming_options_without_a_traceback(tmp_path):  # options are checked before the BPE loads
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": "a"}, {"text": "b"}])
    command = [sys.executable, str(REPO / "prepare_openwebtext.py"), "--dataset", str(source),
               "--out_dir", str(tmp_path / "out"), "--max_tokens", "100M"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip() == "error: --max_tokens needs --streaming (or a streaming preset such as " \
                                    "--dataset c4); a loaded run is limited with --max_docs"
    assert not (tmp_path / "out").exists()


def test_both_prepare_scripts_raise_the_one_prepare_error():
    import prepare_char
    import tokenizer
    assert PrepareError is prepare_char.PrepareError is tokenizer.PrepareError
