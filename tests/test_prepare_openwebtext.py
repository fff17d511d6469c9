"""prepare_openwebtext.py end to end on small local corpora (the hub path shares this code)."""
import argparse
import errno
import gzip
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

# a requirement, but images without it (a GPU machine's, for its own tests) still collect the suite
datasets = pytest.importorskip("datasets", reason="prepare_openwebtext.py needs `datasets`")

import prepare_openwebtext as POW  # noqa: E402
from conftest import REPO, needs_bpe  # noqa: E402
from prepare_openwebtext import PrepareError, hash_router, prepare, split_budgets  # noqa: E402
from tokenizer import EOT_TOKEN, gpt2_encoding, read_meta  # noqa: E402


@pytest.fixture(autouse=True)
def private_datasets_cache(monkeypatch, tmp_path):
    # keep datasets' arrow caches in the test's folder, not in ~/.cache
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))


def make_documents(n):
    """n distinct, varied documents; one holds the literal text "<|endoftext|>"."""
    topics = ["attention", "Ünïcode ✓", "tabs\tand\nnewlines\n\nand paragraphs", "x = [1]",
              "<|endoftext|>"]
    return [f"Document {i} about {topics[i % 5]}.\n" + "more words " * (i % 4) for i in range(n)]


EMPTY_DOCUMENTS = ["", "   \n\t "]
VAL_DOCUMENTS = [f"Validation page {i}: " + "held-out words " * (i % 5) for i in range(8)]


def write_jsonl(path, records, open_file=open):
    with open_file(path, "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(record) + "\n" for record in records))
    return path


def write_c4_folder(folder, train, val, shards=2):
    """C4's layout and names: train in `shards` gzipped json-lines files, in order, val in one."""
    (folder / "en").mkdir(parents=True)
    n = math.ceil(len(train) / shards)
    for shard in range(shards):
        write_jsonl(folder / "en" / f"c4-train.{shard:05d}-of-{shards:05d}.json.gz",
                    [{"text": doc, "url": "x"} for doc in train[shard * n:][:n]], gzip.open)
    write_jsonl(folder / "en" / "c4-validation.00000-of-00001.json.gz",
                [{"text": doc, "url": "x"} for doc in val], gzip.open)
    return folder


def read_ids(path):
    return np.fromfile(path, dtype=np.uint16)


def read_split(path):
    """The documents of a .bin file, each decoded from the ids before one 50256."""
    ids = read_ids(path)
    assert ids[-1] == EOT_TOKEN, "every document, the last one too, ends with <|endoftext|>"
    ends = np.flatnonzero(ids == EOT_TOKEN)
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [gpt2_encoding().decode(ids[start:end].tolist()) for start, end in zip(starts, ends)]


def tokens_of(documents):
    ids = [t for doc in documents for t in gpt2_encoding().encode_ordinary(doc) + [EOT_TOKEN]]
    return np.array(ids, np.uint16)


def token_lengths(documents):
    return [len(tokens_of([doc])) for doc in documents]


def check_prepared(out_dir, meta, documents, num_empty, val_fraction):
    train, val = read_split(out_dir / "train.bin"), read_split(out_dir / "val.bin")
    assert sorted(train + val) == sorted(documents)  # every document once, none lost or merged
    assert len(val) == math.ceil(val_fraction * len(documents))
    assert meta == read_meta(out_dir)
    assert meta["documents"] == {"train": len(train), "val": len(val)}
    assert meta["tokens"] == {"train": len(tokens_of(train)), "val": len(tokens_of(val))}
    assert meta["empty_documents_skipped"] == num_empty
    assert (meta["tokenizer"], meta["vocab_size"]) == ("gpt2", 50257)
    assert sorted(os.listdir(out_dir)) == ["meta.json", "train.bin", "val.bin"]  # no temporary file


@needs_bpe
def test_jsonl_end_to_end(tmp_path):
    documents = make_documents(40)
    records = [{"text": doc, "id": i} for i, doc in enumerate(documents)]
    records[5:5] = [{"text": empty} for empty in EMPTY_DOCUMENTS] + [{"id": -2}]  # no text at all
    source = write_jsonl(tmp_path / "corpus.jsonl", records)
    meta = prepare(str(source), tmp_path / "out", val_fraction=0.1, seed=7)
    check_prepared(tmp_path / "out", meta, documents, num_empty=3, val_fraction=0.1)
    assert {key: meta[key] for key in ("source", "seed", "val_fraction", "streaming")} == \
        {"source": str(source), "seed": 7, "val_fraction": 0.1, "streaming": False}
    meta = prepare(str(source), tmp_path / "first", val_fraction=0.1, max_docs=9)  # 3 are empty
    check_prepared(tmp_path / "first", meta, documents[:6], num_empty=3, val_fraction=0.1)


@needs_bpe
def test_a_text_folder_is_a_document_per_file_and_a_text_file_one_per_paragraph(tmp_path):
    documents = make_documents(12)  # each .txt file is one document, blank lines and all
    (tmp_path / "corpus" / "nested").mkdir(parents=True)
    for i, doc in enumerate(documents + EMPTY_DOCUMENTS):
        (tmp_path / "corpus" / ("nested" if i % 2 else "") / f"doc{i:03d}.txt").write_text(doc)
    (tmp_path / "corpus" / "notes.md").write_text("not a .txt file: not read")
    meta = prepare(str(tmp_path / "corpus"), tmp_path / "folder", val_fraction=0.2)
    check_prepared(tmp_path / "folder", meta, documents, num_empty=2, val_fraction=0.2)

    paragraphs = [doc.replace("\n\n", "\n").strip() for doc in documents]  # no blank line inside
    (tmp_path / "book.txt").write_text("\n\n".join(paragraphs))
    meta = prepare(str(tmp_path / "book.txt"), tmp_path / "book", val_fraction=0.2)
    check_prepared(tmp_path / "book", meta, paragraphs, num_empty=0, val_fraction=0.2)


@needs_bpe
@pytest.mark.parametrize("val_fraction", [0.1, 0.0005])
def test_the_split_is_nanogpts_document_for_document(tmp_path, val_fraction):
    documents = make_documents(1999)  # 0.0005 of them is 0.9995: one val document, rounded up
    source = write_jsonl(tmp_path / "corpus.jsonl", [{"text": doc} for doc in documents])
    prepare(str(source), tmp_path / "out", val_fraction=val_fraction)
    nanogpt = datasets.Dataset.from_dict({"text": documents}).train_test_split(
        test_size=val_fraction, seed=2357, shuffle=True)  # NanoGPT's call, on the same documents
    assert read_split(tmp_path / "out" / "val.bin") == nanogpt["test"]["text"]  # in order
    assert read_split(tmp_path / "out" / "train.bin") == nanogpt["train"]["text"]
    prepare(str(source), tmp_path / "seed1", val_fraction=val_fraction, seed=1)
    assert read_split(tmp_path / "seed1" / "val.bin") != nanogpt["test"]["text"]


@needs_bpe
def test_two_processes_write_the_same_files_as_one(tmp_path, monkeypatch):
    monkeypatch.setattr(POW, "BATCH_DOCS", 4)  # many batches in flight in the tokenizing threads
    (tmp_path / "corpus").mkdir()  # two files, so that datasets reads them in two processes
    for part in range(2):
        write_jsonl(tmp_path / "corpus" / f"{part}.jsonl", [{"text": f"{part} {doc}"}
                                                            for doc in make_documents(15)])
    for n in (1, 2):
        prepare(str(tmp_path / "corpus"), tmp_path / f"{n}", val_fraction=0.1, num_proc=n)
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "1" / name).read_bytes() == (tmp_path / "2" / name).read_bytes()


@needs_bpe
@pytest.mark.parametrize("options, train, val", [
    ({"val_split": "validation"}, "train", "validation"),  # test.jsonl is in neither
    ({}, "train", "train"), ({"split": "test"}, "test", "test"),
])
def test_a_folder_trains_only_on_the_files_named_for_split(tmp_path, options, train, val):
    (tmp_path / "corpus").mkdir()
    for split in ("train", "validation", "test"):
        write_jsonl(tmp_path / "corpus" / f"{split}.jsonl",
                    [{"text": f"{split} {i}"} for i in range(6)])
    prepare(str(tmp_path / "corpus"), tmp_path / "out", val_fraction=0.5, **options)
    train_docs, val_docs = (read_split(tmp_path / "out" / f"{s}.bin") for s in ("train", "val"))
    assert {doc.split()[0] for doc in train_docs} == {train}
    assert {doc.split()[0] for doc in val_docs} == {val}
    assert len(train_docs + val_docs) == 6 * len({train, val})  # every document of those splits


# -----------------------------------------------------------------------------
# bad input: one clear PrepareError, before anything is tokenized

@pytest.fixture
def no_tokenizing(monkeypatch):
    """Input checks alone: no BPE is loaded (so these run without it) and nothing is tokenized."""
    def fail(work):
        assert not work[0], "bad input must be reported before tokenizing"
        return {}, work[1]
    monkeypatch.setattr(POW, "gpt2_encoding", lambda: None)
    monkeypatch.setattr(POW, "tokenize_groups", fail)


def write_file(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


BAD_INPUTS = {  # case: (make the --dataset path in tmp, what the message says)
    "missing file": (lambda tmp: tmp / "missing.jsonl", "missing.jsonl: no such file or folder"),
    "wrong column": (lambda tmp: write_jsonl(tmp / "c.jsonl", [{"body": "a"}]),
                     r"has no text column 'text'; its columns are: body \(choose one with"),
    "only empty records": (lambda tmp: write_jsonl(tmp / "c.jsonl", [{"text": ""}, {"text": " "}]),
                           "no text|no document went to train.bin"),
    "one document": (lambda tmp: write_file(tmp / "c" / "a.txt", "one"), "too few documents for"),
    "csv": (lambda tmp: write_file(tmp / "c" / "a.csv", "text\n").parent, "files of one kind"),
    "mixed": (lambda tmp: write_file(write_file(tmp / "c" / "a.txt", "a").with_suffix(".jsonl"),
                                     "{}").parent, "give files of one kind: .jsonl, .json"),
    "malformed json": (lambda tmp: write_file(tmp / "c.jsonl", '{"text": "a"}\n{oops\n'),
                       r"could not load split 'train' of .*c.jsonl \(1 json file\): "),
}


@pytest.mark.parametrize("case, streaming", [(case, streaming) for case in BAD_INPUTS
                                             for streaming in (False, True)
                                             if not (streaming and case == "one document")])
def test_bad_input_is_reported_clearly(tmp_path, no_tokenizing, case, streaming):
    make_source, message = BAD_INPUTS[case]
    with pytest.raises(PrepareError, match=message):
        prepare(str(make_source(tmp_path)), tmp_path / "out", streaming=streaming)
    assert not list((tmp_path / "out").glob("*"))


@pytest.mark.parametrize("option", [{"val_fraction": 1}, {"val_fraction": 0}, {"num_proc": 0}])
def test_bad_options_are_reported_clearly(tmp_path, no_tokenizing, option):
    with pytest.raises(PrepareError, match="--num_proc must be at least 1, and --val_fraction"):
        prepare(str(tmp_path), tmp_path / "out", **option)


@pytest.mark.parametrize("split, val_split, missing", [("train", "valid", "valid"),
                                                       ("training", "validation", "training")])
def test_a_split_without_files_is_refused_before_anything_is_written(tmp_path, no_tokenizing,
                                                                     split, val_split, missing):
    folder = write_c4_folder(tmp_path / "c4", ["a", "b"], ["c"])  # train and validation files
    with pytest.raises(PrepareError, match=f"no file for split '{missing}'"):
        prepare(str(folder), tmp_path / "out", split=split, val_split=val_split, streaming=True)
    assert not (tmp_path / "out").exists()


@needs_bpe
def test_a_full_disk_is_an_error_line_that_keeps_the_old_files(tmp_path, monkeypatch):
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": doc} for doc in make_documents(10)])
    out_dir = tmp_path / "out"
    prepare(str(source), out_dir, val_fraction=0.2)
    old = {name: (out_dir / name).read_bytes() for name in ("meta.json", "train.bin", "val.bin")}

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(POW.TokenFile, "append", full)
    with pytest.raises(SystemExit) as exited:
        POW.main(["--dataset", str(source), "--out_dir", str(out_dir), "--val_fraction", "0.2"])
    assert exited.value.code == f"error: cannot write the dataset to {out_dir}: " \
                                f"[Errno {errno.ENOSPC}] No space left on device"
    assert {name: (out_dir / name).read_bytes() for name in os.listdir(out_dir)} == old


@pytest.mark.slow  # a subprocess importing datasets: about 5 s on 2 busy cores
def test_a_missing_path_is_one_line_without_the_tokenizer(tmp_path):
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "empty_cache")}  # no BPE: not needed
    result = subprocess.run([sys.executable, str(REPO / "prepare_openwebtext.py"), "--dataset",
                             "/nonexistent", "--out_dir", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 1
    assert result.stderr == "error: /nonexistent: no such file or folder\n"


@pytest.mark.parametrize("streaming", [False, True])
def test_a_hub_dataset_out_of_reach_says_what_to_do_offline(streaming, tmp_path, no_tokenizing,
                                                            monkeypatch):
    def unreachable(*args, **kwargs):  # what datasets raises offline or with HF_HUB_OFFLINE=1
        raise ConnectionError("Couldn't reach 'someone/corpus' on the Hub")
    monkeypatch.setattr(POW, "load_dataset", unreachable)
    with pytest.raises(PrepareError, match=r"Couldn't reach .*; without a network, pass local "
                                           r"files: --dataset=path/to/folder_or_file$"):
        prepare("someone/corpus", tmp_path / "out", streaming=streaming)


def test_an_unavailable_tokenizer_is_one_error_line(tmp_path, monkeypatch):
    def unavailable():
        raise POW.TokenizerUnavailableError("no BPE")
    monkeypatch.setattr(POW, "gpt2_encoding", unavailable)
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": "a"}, {"text": "b"}])
    with pytest.raises(SystemExit) as exited:
        POW.main(["--dataset", str(source), "--out_dir", str(tmp_path / "out")])
    assert exited.value.code == "error: no BPE" and not (tmp_path / "out").exists()


# -----------------------------------------------------------------------------
# streamed runs (--streaming, --max_tokens, --val_split, the c4 preset) on files laid out as C4's

@needs_bpe
def test_streamed_run_writes_the_same_files_as_the_loaded_run(tmp_path):
    documents = make_documents(40)
    with_empty = documents[:7] + EMPTY_DOCUMENTS + documents[7:]
    folder = write_c4_folder(tmp_path / "c4", with_empty, VAL_DOCUMENTS + [""])
    loaded = prepare(str(folder), tmp_path / "loaded", val_split="validation")
    streamed = prepare(str(folder), tmp_path / "streamed", val_split="validation", streaming=True)
    for name in ("train.bin", "val.bin"):  # the same token files, byte for byte
        assert (tmp_path / "loaded" / name).read_bytes() == \
            (tmp_path / "streamed" / name).read_bytes()
    assert (read_ids(tmp_path / "streamed" / "train.bin") == tokens_of(documents)).all()  # in order
    assert read_split(tmp_path / "streamed" / "val.bin") == VAL_DOCUMENTS  # C4's validation, whole
    assert {**loaded, "streaming": True} == streamed == read_meta(tmp_path / "streamed")
    assert streamed["empty_documents_skipped"] == 3


@needs_bpe
def test_streamed_hash_split_holds_the_documents_of_the_loaded_split(tmp_path):
    documents = make_documents(60)
    source = write_jsonl(tmp_path / "corpus.jsonl.gz",
                         [{"text": doc} for doc in documents + EMPTY_DOCUMENTS], gzip.open)
    loaded = prepare(str(source), tmp_path / "loaded", val_fraction=0.2)
    streamed = prepare(str(source), tmp_path / "streamed", val_fraction=0.2, streaming=True)
    train, val = (read_split(tmp_path / "streamed" / f"{s}.bin") for s in ("train", "val"))
    route = hash_router(0.2, seed=2357)  # other documents in val (a hash, not a shuffle)
    assert train == [doc for doc in documents if route(doc) == "train"]  # in the source's order
    assert val == [doc for doc in documents if route(doc) == "val"] and len(val) > 0
    assert streamed["tokens"]["train"] + streamed["tokens"]["val"] == len(tokens_of(documents))
    assert streamed["empty_documents_skipped"] == 2
    check_prepared(tmp_path / "loaded", loaded, documents, num_empty=2, val_fraction=0.2)


def test_max_tokens_is_read_as_people_write_it_and_split_as_typed():
    for text in ("100000000", "100_000_000", "1e8", "100M", "0.1b"):
        assert POW.token_count(text) == 10**8
    for text in ("5e", "1.5", "lots", "M", "0"):
        with pytest.raises(argparse.ArgumentTypeError, match="not a token count"):
            POW.token_count(text)
    assert split_budgets(30_000_000_000, 0.0005) == {"train": 29_985_000_000, "val": 15_000_000}
    assert split_budgets(100, 0.29) == {"train": 71, "val": 29}  # not 28: 100 * 0.29 in floats


def fitting_prefix(documents, budget):
    """The documents a budget keeps: the longest prefix whose tokens fit."""
    ends = np.cumsum(token_lengths(documents))
    return documents[:int(np.searchsorted(ends, budget, side="right"))]


def max_tokens_for(train_budget):
    """The --max_tokens that leaves train.bin train_budget tokens with --val_fraction 0.25."""
    return next(n for n in range(train_budget, 2 * train_budget) if n - n // 4 == train_budget)


@needs_bpe
@pytest.mark.parametrize("cut", ["inside a document", "at the end of a document"])
def test_max_tokens_cuts_each_split_at_a_document_boundary(tmp_path, cut):
    documents = make_documents(30)
    folder = write_c4_folder(tmp_path / "c4", documents, VAL_DOCUMENTS)
    # a train budget that ends inside document 12, or exactly after it; val gets a quarter
    train_budget = sum(token_lengths(documents[:12])) + (3 if cut == "inside a document" else 0)
    max_tokens = max_tokens_for(train_budget)
    meta = prepare(str(folder), tmp_path / "out", val_split="validation", streaming=True,
                   max_tokens=max_tokens, val_fraction=0.25)
    train = fitting_prefix(documents, train_budget)
    val = fitting_prefix(VAL_DOCUMENTS, max_tokens // 4)
    assert len(train) == 12 and 0 < len(val) < len(VAL_DOCUMENTS)
    assert (read_ids(tmp_path / "out" / "train.bin") == tokens_of(train)).all()
    assert (read_ids(tmp_path / "out" / "val.bin") == tokens_of(val)).all()
    assert meta["tokens"] == {"train": len(tokens_of(train)), "val": len(tokens_of(val))}
    assert (meta["tokens"]["train"] == train_budget) == (cut == "at the end of a document")
    assert meta["documents"] == {"train": 12, "val": len(val)} and meta["max_tokens"] == max_tokens


@needs_bpe
@pytest.mark.parametrize("num_proc", [1, 2])
def test_a_budget_keeps_a_prefix_though_shorter_documents_follow(tmp_path, monkeypatch, num_proc):
    monkeypatch.setattr(POW, "BATCH_DOCS", 1)  # threads tokenize the documents after the cut ahead
    route = hash_router(0.25, seed=2357)
    pages = [f"Page {i}: " + "many more words " * (20 if i % 2 else 1) for i in range(60)]
    short, long = ([p for p in pages[parity::2] if route(p) == "train"] for parity in (0, 1))
    val = [page for page in pages[::2] if route(page) == "val"]
    source = write_jsonl(tmp_path / "c.jsonl",
                         [{"text": doc} for doc in short[:5] + long[:1] + short[5:] + val])
    train_budget = sum(token_lengths(short[:5])) + 10  # the long one does not fit; short ones would
    meta = prepare(str(source), tmp_path / "out", streaming=True, num_proc=num_proc,
                   max_tokens=max_tokens_for(train_budget), val_fraction=0.25)
    assert (read_ids(tmp_path / "out" / "train.bin") == tokens_of(short[:5])).all()
    assert meta["documents"]["train"] == 5 and meta["documents"]["val"] > 0


@needs_bpe
def test_a_budget_below_the_first_document_leaves_no_dataset(tmp_path):
    folder = write_c4_folder(tmp_path / "c4", make_documents(20), VAL_DOCUMENTS)
    with pytest.raises(PrepareError, match=r"no document went to val.bin: give more documents, or "
                                           r"raise --val_fraction or --max_tokens"):
        prepare(str(folder), tmp_path / "out", val_split="validation", streaming=True,
                max_tokens=10_000, val_fraction=0.0005)  # 5 tokens for val
    assert os.listdir(tmp_path / "out") == []  # no meta.json, no temporary file


@needs_bpe
@pytest.mark.parametrize("streaming, num_proc", [(False, 1), (True, 1), (True, 2)])
def test_an_interrupted_run_leaves_the_earlier_dataset_whole(tmp_path, monkeypatch, streaming,
                                                             num_proc):
    folder = write_c4_folder(tmp_path / "c4", make_documents(40), VAL_DOCUMENTS)
    out_dir = tmp_path / "out"
    prepare(str(folder), out_dir, val_split="validation", streaming=streaming)
    old = {name: (out_dir / name).read_bytes() for name in ("meta.json", "train.bin", "val.bin")}
    calls, real_tokenize = [], POW.tokenize_groups

    def flaky_tokenize(work):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt  # Ctrl-C while train.bin's temporary file is being filled
        return real_tokenize(work)

    monkeypatch.setattr(POW, "BATCH_DOCS", 5)
    monkeypatch.setattr(POW, "tokenize_groups", flaky_tokenize)
    with pytest.raises(KeyboardInterrupt):
        prepare(str(folder), out_dir, val_split="validation", streaming=streaming,
                num_proc=num_proc)
    assert sorted(os.listdir(out_dir)) == ["meta.json", "train.bin", "val.bin"]  # no temporary file
    assert {name: (out_dir / name).read_bytes() for name in old} == old  # the old one, untouched


@needs_bpe
@pytest.mark.parametrize("max_tokens", [100, None])
def test_a_damaged_shard_stops_the_run_cleanly_unless_the_budget_is_met(tmp_path, monkeypatch,
                                                                       max_tokens):
    monkeypatch.setattr(POW, "BATCH_DOCS", 5)
    folder = write_c4_folder(tmp_path / "c4", make_documents(40), VAL_DOCUMENTS)
    with gzip.open(folder / "en" / "c4-train.00001-of-00002.json.gz", "at") as f:
        f.write('{"text": "cut off in the middle of a reco\n')  # the last shard's last record
    run = dict(val_split="validation", streaming=True, max_tokens=max_tokens, val_fraction=0.2)
    if max_tokens:  # met in the first shard: the damaged record is never read
        assert 0 < prepare(str(folder), tmp_path / "out", **run)["documents"]["train"] < 20
        return
    with pytest.raises(PrepareError, match=r"^could not load split 'train' of .*c4 \(3 json files"):
        prepare(str(folder), tmp_path / "out", **run)
    assert os.listdir(tmp_path / "out") == []


@needs_bpe
def test_the_c4_preset_streams_allenai_c4_en_into_data_c4(tmp_path, monkeypatch, capsys):
    # the hub's answer made offline from files in C4's layout: the preset asks for what it needs
    folder = write_c4_folder(tmp_path / "c4_files", make_documents(30), VAL_DOCUMENTS)
    calls = []

    def local_c4(path, name=None, split=None, streaming=False, **options):
        calls.append((path, name, split, streaming, options))
        files = {s: str(folder / "en" / f"c4-{s}.*.json.gz") for s in ("train", "validation")}
        return datasets.load_dataset("json", data_files=files, split=split, streaming=streaming)

    monkeypatch.setattr(POW, "load_dataset", local_c4)
    monkeypatch.chdir(tmp_path)
    POW.main(["--dataset", "c4", "--max_tokens", "0.3k", "--val_fraction", "0.2"])
    assert calls == [("allenai/c4", "en", s, True, {}) for s in ("validation", "train")]
    meta = read_meta(tmp_path / "data" / "c4")
    assert [meta[key] for key in ("source", "dataset_config", "val_split", "max_tokens")] == \
        ["allenai/c4", "en", "validation", 300]
    (train, val), (train_docs, val_docs) = meta["tokens"].values(), meta["documents"].values()
    assert 0 < train <= 240 and 0 < val <= 60 and train_docs < 30  # the budget stopped it
    assert capsys.readouterr().out == (f"wrote data/c4: {train} train / {val} val tokens, "
                                       f"{train_docs} / {val_docs} documents, 0 empty skipped\n")
