"""
Prepare OpenWebText, C4 (or any text corpus) for training: GPT-2 BPE token ids in train.bin / val.bin
(flat uint16 arrays, <|endoftext|> = 50256 after every document) plus meta.json, as tokenizer.py describes.

    python prepare_openwebtext.py                                  # OpenWebText from the hub, ~9B tokens
    python prepare_openwebtext.py --max_docs 2000 --out_dir data/owt_small  # a quick partial run
    python prepare_openwebtext.py --dataset my_corpus/ --out_dir data/mine  # local files
    python prepare_openwebtext.py --dataset c4 --max_tokens 100M   # C4 (allenai/c4, en), streamed -> data/c4

--dataset is a hub dataset name, a preset (c4) or a local file / folder:
    .jsonl / .json   one document per record, its text in --text_column
    .parquet         one document per row, its text in --text_column
    .txt             in a folder, each FILE is one document (its newlines kept, \\r\\n read as \\n);
                     a single .txt file is cut into documents at its blank lines
    (.jsonl, .json and .txt may be gzipped: .jsonl.gz, as C4's own files are)
A folder is searched recursively and must hold files of one kind. Files with a split's name as a word of
their path (train.jsonl, c4-validation.00000-of-00008.json.gz, test/...) go by it: if any is named for
--split, those are the train files; files named for another split are never trained on (--val_split's are val).

Offline: local files need no network, but the GPT-2 BPE does, unless TIKTOKEN_CACHE_DIR names a folder
holding tiktoken's cached r50k_base file (docs/data.md says how to make one on a machine with network).

The documents come from one of two sources and then go through the same writer:
  loaded (default)  load_dataset materialises the corpus -> empty documents dropped -> NanoGPT's split,
                    train_test_split(test_size=val_fraction, seed=seed, shuffle=True) with "test" as val
  --streaming       load_dataset(..., streaming=True), nothing materialised; each document goes to val
                    by a seeded hash of its text (or val is --val_split); --max_tokens stops reading once
                    the budget is met (C4 en is ~305 GB of json.gz)
  then              tokenized in --num_proc threads, appended to train.bin / val.bin in order
The .bin files grow under temporary names and are renamed once complete, and meta.json is removed
before they are touched and written last, so a folder with a meta.json holds a complete dataset.
"""
import argparse
import gzip
import hashlib
import itertools
import json
import math
import os
import re
import sys
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

import numpy as np
from datasets import Dataset, Value, load_dataset
from tqdm import tqdm

from atomic import atomic_file, remove_abandoned
from tokenizer import (
    EOT_TOKEN,
    GPT2_VOCAB_SIZE,
    META_FILENAME,
    TOKEN_DTYPE,
    PrepareError,
    TokenizerUnavailableError,
    check_out_dir,
    dataset_source,
    gpt2_encoding,
    stopped_note,
    write_meta,
)

# Skylion007/openwebtext is what NanoGPT's load_dataset("openwebtext") resolved to. Its old loading
# script (openwebtext.py) stopped working when datasets 4 dropped dataset scripts; the hub repo has
# since been converted to plain parquet shards (data/train-000NN-of-00093.parquet, no script), which
# current datasets releases load directly. So the canonical name works again and no mirror is needed.
DEFAULT_DATASET = "Skylion007/openwebtext"
DEFAULT_OUT_DIR = "data/openwebtext"
# A preset fills the options the user left unset. C4 en is 305 GB of json.gz (828 GB of text, roughly
# 190B GPT-2 tokens), so it streams; val.bin comes from C4's own validation split, the held-out split
# C4 losses are usually reported on. "c4" was also the hub's old (now deprecated) name of allenai/c4.
PRESETS = {
    "c4": {"dataset": "allenai/c4", "dataset_config": "en", "streaming": True, "val_split": "validation",
           "out_dir": "data/c4"},
}
LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
COMPRESSED = ".gz"  # datasets decompresses it on the fly, streaming or not
SAVED_BY_DATASETS = ("state.json", "dataset_dict.json")  # what save_to_disk writes beside its .arrow files
BATCH_DOCS = 1024  # documents read, routed and tokenized as one unit: ~0.5M tokens of C4, ~1.2M of OpenWebText
# the words that name a split in a file name, as the hub's datasets name them (what `datasets` reads too)
SPLIT_KEYWORDS = (("train", "training"), ("validation", "valid", "dev", "val"), ("test", "testing", "eval", "evaluation"))
SPLIT_NAMES = [word for words in SPLIT_KEYWORDS for word in words]


# -----------------------------------------------------------------------------
# options

def apply_preset(dataset, out_dir, dataset_config, streaming, val_split):
    """The five preset-able options with a preset's values filled in where the caller left None."""
    chosen = {"dataset": dataset, "out_dir": out_dir, "dataset_config": dataset_config,
              "streaming": streaming, "val_split": val_split}
    for key, value in PRESETS.get(dataset, {}).items():
        if key == "dataset" or chosen[key] is None:
            chosen[key] = value
    chosen["out_dir"] = chosen["out_dir"] or default_out_dir(dataset)
    chosen["streaming"] = bool(chosen["streaming"])
    return chosen


def default_out_dir(dataset):
    return PRESETS.get(dataset, {}).get("out_dir", DEFAULT_OUT_DIR)


def split_budgets(max_tokens, val_fraction):
    """{"train": at most this many tokens, "val": ...}; None means no limit."""
    if max_tokens is None:
        return {"train": None, "val": None}
    # in decimal, as the fraction was typed: in binary floats 100 * 0.29 is just under 29, and floor gives 28
    val = math.floor(max_tokens * Decimal(repr(val_fraction)))
    return {"train": max_tokens - val, "val": val}


def check_options(num_proc, val_fraction, max_docs, streaming, max_tokens, split, val_split, seed):
    """Raise PrepareError for options that cannot work together, before anything is loaded."""
    if num_proc < 1:
        raise PrepareError(f"--num_proc must be at least 1, got {num_proc}")
    if seed < 0:  # train_test_split's numpy generator takes no negative seed (a hash split would, but alike)
        raise PrepareError(f"--seed must be 0 or more, got {seed}")
    if not 0 < val_fraction < 1:
        raise PrepareError(f"--val_fraction must be between 0 and 1, got {val_fraction}")
    if max_docs is not None and max_docs < 1:
        raise PrepareError(f"--max_docs must be at least 1, got {max_docs}")
    if max_docs is not None and streaming:
        raise PrepareError("--max_docs is for loaded runs; limit a --streaming run with --max_tokens")
    if val_split is not None and val_split == split:
        raise PrepareError(f"--val_split and --split are both {split!r}: val must come from another split")
    if max_tokens is None:
        return
    if not streaming:
        # without streaming the whole dataset is downloaded and tokenized before any budget could apply
        raise PrepareError("--max_tokens needs --streaming (or a streaming preset such as --dataset c4); "
                           "a loaded run is limited with --max_docs")
    if max_tokens < 1:
        raise PrepareError(f"--max_tokens must be at least 1, got {max_tokens}")
    if split_budgets(max_tokens, val_fraction)["val"] < 1:
        raise PrepareError(f"--max_tokens {max_tokens} with --val_fraction {val_fraction} leaves val.bin no "
                           f"token (it gets floor(max_tokens * val_fraction)): raise one of them")


@contextmanager
def writing_to(out_dir):
    """OSErrors in the block (a full disk, no permission, a file in the way) become one PrepareError."""
    try:
        yield
    except OSError as err:
        reason = f"{err.strerror}: {err.filename}" if err.strerror and err.filename else err.strerror or err
        raise PrepareError(f"cannot write the dataset to {out_dir}: {reason}") from err


def token_count(text):
    """argparse type of --max_tokens: 100000000, 100_000_000, 1e8, 100M and 0.1B are the same."""
    scale = {"k": 10**3, "m": 10**6, "b": 10**9}.get(text[-1:].lower(), 1)
    number = text[:-1] if scale > 1 else text
    try:
        value = Decimal(number.replace("_", "")) * scale
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"not a token count: {text!r} (write e.g. 100000000, 1e8, 100M or 30B)")
    if not value.is_finite() or value != value.to_integral_value():
        raise argparse.ArgumentTypeError(f"not a whole number of tokens: {text!r}")
    return int(value)


# -----------------------------------------------------------------------------
# loading: a hub name or local files, read through one load_dataset call

@dataclass
class Source:
    builder: str  # a hub name, or json / parquet / text for local files
    options: dict  # more keyword arguments of load_dataset (the config name, or the local data files)
    description: str
    local: bool


def local_kind(path):
    """The builder for a local file name (".jsonl", "x.json.gz", ...), or None if unsupported."""
    name = path.name.lower().removesuffix(COMPRESSED)
    suffix = Path(name).suffix
    if path.name.lower().endswith(COMPRESSED) and LOCAL_BUILDERS.get(suffix) == "parquet":
        return None  # parquet compresses inside the file; datasets does not read a gzipped one
    return LOCAL_BUILDERS.get(suffix)


def looks_like_a_path(name):
    # hub names are "name" or "owner/name"; anything else that does not exist (a folder written with its
    # trailing slash among them) is a mistyped path
    return (name.startswith(("/", ".", "~")) or name.endswith("/") or name.count("/") > 1
            or local_kind(Path(name)) is not None)


def named_for_split(relative_path, split):
    # the split's name as a word of the path, between separators: C4's en/c4-validation.00000-of-00008.json.gz,
    # and the names datasets itself recognises (validation.jsonl, data/validation-00000.parquet, ...)
    return re.search(rf"(^|[-._ /]){re.escape(split.lower())}($|[-._ /0-9])", relative_path.lower()) is not None


def local_files(path):
    """The data files of a local file or folder, checked to be of one supported kind."""
    if any((path / name).is_file() for name in SAVED_BY_DATASETS):  # its .json files are no documents
        raise PrepareError(
            f"{path} is a dataset written by datasets' save_to_disk, which is read with load_from_disk, not as files: "
            f"write it out as parquet first, e.g. python -c \"import datasets; datasets.load_from_disk('{path}')"
            f"['train'].to_parquet('corpus/train.parquet')\" (without ['train'] if it has no splits), then pass "
            f"--dataset corpus/")
    if path.is_dir():
        prepared = prepared_datasets(path)
        if path in prepared:
            raise PrepareError(f"{path} is a prepared dataset (train.bin and {META_FILENAME}), not documents: train "
                               f"on it with python train.py --data_dir={path}")
        if prepared:
            print(f"{path}: left out {', '.join(str(p.relative_to(path)) for p in prepared)}: prepared "
                  f"dataset{'s' if len(prepared) > 1 else ''} (train.bin and {META_FILENAME}), not documents")
        files = sorted(p for p in path.rglob("*")
                       if p.is_file() and local_kind(p) and not any(p.is_relative_to(d) for d in prepared))
        if not files:
            raise PrepareError(f"{path}: the folder holds no {' / '.join(LOCAL_BUILDERS)} files (optionally .gz)")
    else:
        files = [path]
    builders = {local_kind(p) for p in files}
    if None in builders:
        raise PrepareError(f"{path}: unsupported file type; use {' / '.join(LOCAL_BUILDERS)} (optionally .gz)")
    if len(builders) > 1:
        raise PrepareError(f"{path}: mixes file types ({', '.join(sorted(builders))}); use one kind per run")
    if all(p.stat().st_size == 0 for p in files):
        raise PrepareError(f"{path}: no text (every file is empty)")
    return builders.pop(), files


def split_words(split):
    """The words that name split in a file name: its own, or all of datasets' names for it (train, training)."""
    return next((list(words) for words in SPLIT_KEYWORDS if split.lower() in words), [split])


def prepared_datasets(folder):
    """The folders under `folder` that hold a dataset this script wrote: an --out_dir inside --dataset is
    read again on a rerun, where its meta.json would be taken for a document (or mix file types)."""
    return sorted(meta.parent for meta in folder.rglob(META_FILENAME) if (meta.parent / "train.bin").is_file())


def files_by_split(path, files, split, val_split):
    """({split: files} for load_dataset's data_files, {file left out: the split it is named for, or None}).

    A single file is all --split. In a folder, the files named for val_split are val; the train files are
    those named for split if there are any, else those named for no split. Files named for another split
    (test, validation, ...: datasets' names, or val_split's other names) are never trained on.
    """
    if not path.is_dir():
        if val_split is not None:
            raise PrepareError(f"--val_split {val_split} needs a folder holding the files of both splits, the val "
                               f"ones named after it (as C4's c4-{val_split}.00000-of-00008.json.gz), not one file")
        return {split: [str(path)]}, {}
    train_words = split_words(split)
    words = ([val_split] if val_split is not None else []) + train_words + SPLIT_NAMES  # the first match wins
    named = {p: next((word for word in words if named_for_split(str(p.relative_to(path)), word)), None) for p in files}
    val = [p for p in files if val_split is not None and named[p] == val_split]
    train = [p for p in files if named[p] in train_words] or [p for p in files if named[p] is None]
    if val_split is not None and not val:
        raise PrepareError(f"{path}: no file has {val_split!r} as a word of its name, so --val_split {val_split} "
                           f"cannot split the folder (e.g. c4-{val_split}.00000-of-00008.json.gz for val)")
    if not train:
        other = " or ".join(sorted({repr(named[p]) for p in files}))
        raise PrepareError(f"{path}: no file to train on: every file has {other} as a word of its name, the name of "
                           f"another split than --split {split}; name the train files for it (e.g. "
                           f"c4-{split}.00000-of-01024.json.gz), or choose another --split")
    data_files = {split: [str(p) for p in train]}
    if val_split is not None:
        data_files[val_split] = [str(p) for p in val]
    return data_files, {p: named[p] for p in files if p not in train and p not in val}


def left_out_note(path, left_out, split, shown=5):
    """One line naming the files of a folder that no split of the run takes, and why."""
    def why(word):
        return f"named for split {word!r}" if word else f"named for no split, while others are named for {split!r}"
    names = [f"{p.relative_to(path)} ({why(word)})" for p, word in itertools.islice(left_out.items(), shown)]
    more = f", and {len(left_out) - shown} more" if len(left_out) > shown else ""
    return f"{path}: {len(left_out)} file(s) left out of train.bin and val.bin: {', '.join(names)}{more}"


def resolve_source(dataset, dataset_config=None, split="train", val_split=None):
    """Where the documents come from: a hub name (with its config) or a local file / folder."""
    path = Path(dataset).expanduser()
    if not path.exists():
        if looks_like_a_path(dataset):
            raise PrepareError(f"{dataset}: no such file or folder")
        options = {"name": dataset_config} if dataset_config else {}
        config = f", config {dataset_config!r}" if dataset_config else ""
        return Source(dataset, options, f"hub dataset {dataset!r}{config}", local=False)

    if dataset_config:
        raise PrepareError(f"--dataset_config {dataset_config} is for hub datasets; local files have no configs")
    builder, files = local_files(path)
    data_files, left_out = files_by_split(path, files, split, val_split)
    if left_out:
        print(left_out_note(path, left_out, split))
    options = {"data_files": data_files}
    used = len(files) - len(left_out)
    description = f"{path} ({used} {builder} file{'s' if used > 1 else ''})"
    if builder == "text":
        # a folder of .txt files is a corpus of one document per file; a single file is one corpus
        # of paragraphs (datasets' text builder cuts it at every "\n\n")
        options["sample_by"] = "document" if path.is_dir() else "paragraph"
        description = description if path.is_dir() else f"{path} (a text file, one document per paragraph)"
    return Source(builder, options, description, local=True)


def describe(err):
    # datasets wraps the useful message (bad JSON on line N, ...) in a generic DatasetGenerationError
    parts = []
    while err is not None and len(parts) < 3:
        if type(err).__name__ == "RemoteTraceback":  # a worker process's whole traceback, as text (--num_proc > 1)
            parts.append("an error in a worker process (rerun with --num_proc 1 to see it)")
            break
        parts.append(f"{type(err).__name__}: {err}" if str(err) else type(err).__name__)
        err = err.__cause__ or err.__context__
    return " <- ".join(parts)


def load_failed(source, split, err):
    hint = "" if source.local else " (no local file or folder has that name either)"
    offline = ("; without a network, pass local files instead: --dataset path/to/folder_or_file "
               "(docs/data.md, 'Local input and running offline')") if not source.local and unreachable(err) else ""
    return PrepareError(f"could not load split {split!r} of {source.description}{hint}: {describe(err)}"
                        f"{first_bad_place(source)}{offline}")


def unreachable(err):
    """Whether the hub could not be reached (no network, or HF_HUB_OFFLINE=1): datasets raises a ConnectionError."""
    while err is not None:
        if isinstance(err, ConnectionError) or type(err).__name__ in ("OfflineModeIsEnabled", "ConnectError"):
            return True
        err = err.__cause__ or err.__context__
    return False


def first_bad_place(source, reading=None):
    """Where a local source whose reading failed first goes wrong, to add to the error: datasets counts
    the rows of its own blocks, not a file's lines, and names no file for a damaged gzip or parquet file
    or a text file that is not UTF-8. "; first bad line: FILE, line N (...)", "; FILE cannot be read
    (...)", or "" where nothing is found. `reading`, the file a stream was reading when it failed, is
    searched first: C4's last shards are hours of reading after its first."""
    if not source.local or source.builder not in ("json", "text", "parquet"):
        return ""
    files = itertools.chain.from_iterable(source.options["data_files"].values())
    for name in dict.fromkeys(itertools.chain([reading] if reading else [], files)):
        found = unreadable_parquet(name) if source.builder == "parquet" else bad_line(name, source.builder)
        if found:
            return found
    return ""


def bad_line(name, builder):
    """The first line of a JSON-lines or text file that does not decode (or, for JSON, parse), as above."""
    lines = builder == "text" or name.endswith((".jsonl", ".jsonl" + COMPRESSED))  # a .json may be one document
    try:
        # bytes, each line decoded on its own: text mode decodes blocks ahead, so a byte that is not
        # UTF-8 would fail lines before its own (or before the first, with no line number yet)
        with (gzip.open if name.endswith(COMPRESSED) else open)(name, "rb") as f:
            for number, line in enumerate(f, 1):
                text = line.decode("utf-8")
                if builder == "json" and text.strip():
                    json.loads(text)
                    lines = True  # a line that is a whole record: JSON lines, as C4's .json.gz
    except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
        if lines:
            return f"; first bad line: {name}, line {number} ({e})"
    except (OSError, EOFError, zlib.error) as e:  # a damaged or cut-off gzip (an interrupted download)
        return f"; {name} cannot be read ({type(e).__name__})"
    return ""


def unreadable_parquet(name):
    import pyarrow.parquet  # datasets' own dependency, here only once a load has failed

    try:
        pyarrow.parquet.read_metadata(name)  # the footer: what a cut-off download lacks
    except Exception as e:  # pyarrow's ArrowInvalid, an OSError
        return f"; {name} cannot be read ({type(e).__name__}: {e})"
    return ""


def check_text_column(column_names, features, text_column, description):
    """Raise PrepareError unless text_column exists and (where its type is known) holds text."""
    if text_column not in column_names:
        raise PrepareError(
            f"{description} has no column {text_column!r}; its columns are: {', '.join(column_names)} "
            f"(choose one with --text_column)"
        )
    feature = features[text_column] if features else None  # streamed sources may not know their types
    if feature is not None and not (isinstance(feature, Value) and feature.dtype in ("string", "large_string")):
        raise PrepareError(f"{description}: column {text_column!r} holds {feature}, not text")


# -----------------------------------------------------------------------------
# documents: a list of (batches of texts, the output files they feed, route(text) -> file name)

def has_text(texts):
    # None (a record without the column), "" and whitespace-only documents carry nothing to learn
    return [bool(text) and not text.isspace() for text in texts]


def no_text(description, num_empty, text_column):
    if num_empty == 0:
        return PrepareError(f"{description}: no text (no documents)")
    return PrepareError(f"{description}: no text (all {num_empty} document(s) in column {text_column!r} are empty)")


def too_few_documents(description, num_documents, val_fraction):
    return PrepareError(
        f"{description}: {num_documents} non-empty document(s) cannot make both a train and a val split with "
        f"--val_fraction {val_fraction}: it needs at least 2 documents, and more the smaller val_fraction is. "
        f"Give more documents (a single .txt file is cut into documents at its blank lines; in a folder each "
        f".txt file is one document), or raise --val_fraction"
    )


def to(name):
    """The (files, route) of a source whose documents all go to one file."""
    return (name,), lambda text: name


def text_batches(docs, text_column):
    for batch in docs.select_columns([text_column]).iter(batch_size=BATCH_DOCS):
        yield batch[text_column]


def pool_size(num_proc):
    # None rather than 1: datasets then runs in this process and never starts a worker pool
    return num_proc if num_proc > 1 else None


def load_split(source, split, text_column, max_docs, num_proc):
    """One split of the source, materialised, without its empty documents: (docs, number of empty ones)."""
    description = f"split {split!r} of {source.description}"
    try:
        if max_docs is None:
            docs = load_dataset(source.builder, split=split, num_proc=pool_size(num_proc), **source.options)
        else:  # stream only the first max_docs documents instead of downloading the whole dataset
            stream = load_dataset(source.builder, split=split, streaming=True, **source.options)
            docs = Dataset.from_list(list(stream.take(max_docs)))
    except Exception as err:
        raise load_failed(source, split, err) from err
    if len(docs) == 0:
        raise no_text(description, 0, text_column)
    check_text_column(docs.column_names, docs.features, text_column, description)
    try:  # the first read of every text: pyarrow's JSON reader lets bytes that are not UTF-8 through to here
        nonempty = docs.filter(has_text, input_columns=text_column, batched=True,
                               num_proc=pool_size(num_proc), desc="dropping empty documents")
    except Exception as err:
        raise load_failed(source, split, err) from err
    num_empty = len(docs) - len(nonempty)
    if len(nonempty) == 0:
        raise no_text(description, num_empty, text_column)
    return nonempty, num_empty


def loaded_sources(source, split, val_split, text_column, num_proc, val_fraction, seed, max_docs):
    """The loaded run's documents, val first, and the number of empty ones dropped.

    Without val_split, NanoGPT's split of the non-empty documents: train_test_split(test_size=val_fraction,
    seed=seed, shuffle=True), "test" renamed val, each side written in the order that split gives it.
    """
    docs, num_empty = load_split(source, split, text_column, max_docs, num_proc)
    if val_split is not None:
        val, val_empty = load_split(source, val_split, text_column, max_docs, num_proc)
        return [(text_batches(val, text_column), *to("val")), (text_batches(docs, text_column), *to("train"))], \
            num_empty + val_empty
    num_val = math.ceil(val_fraction * len(docs))  # what train_test_split(test_size=val_fraction) takes
    if num_val >= len(docs):
        raise too_few_documents(source.description, len(docs), val_fraction)
    splits = docs.train_test_split(test_size=num_val, seed=seed, shuffle=True)
    return [(text_batches(splits["test"], text_column), *to("val")),
            (text_batches(splits["train"], text_column), *to("train"))], num_empty


def open_stream(source, split, text_column):
    """(batches of texts, number of empty documents before the first one with text) of one split.

    Reading starts here and goes on to the first document with text, so a source that cannot be read,
    has no such column or holds no text at all fails before anything is written; the rest is read lazily.
    """
    try:
        stream = load_dataset(source.builder, split=split, streaming=True, **source.options)
        batches = iter(stream.iter(batch_size=BATCH_DOCS))
        first = next(batches, None)
    except Exception as err:
        raise load_failed(source, split, err) from err
    description = f"split {split!r} of {source.description}"
    if first is None:
        raise no_text(description, 0, text_column)
    check_text_column(list(first), stream.features, text_column, description)
    texts = checked_texts(itertools.chain([first], batches), text_column, description,
                          lambda: first_bad_place(source, file_being_read(stream, source, split)))
    num_empty = 0
    for batch in texts:
        if any(has_text(batch)):
            return itertools.chain([batch], texts), num_empty
        num_empty += len(batch)
    raise no_text(description, num_empty, text_column)


def file_being_read(stream, source, split):
    """The data file a streamed split was reading, from datasets' resumable state (a shard per file), or None."""
    try:
        state = stream.state_dict()
    except Exception:  # a datasets without it, or a stream that cannot say
        return None
    while isinstance(state, dict) and "shard_idx" not in state:  # the innermost iterable reads the files
        state = state.get("examples_iterable")
    index = state.get("shard_idx") if isinstance(state, dict) else None
    files = source.options.get("data_files", {}).get(split, [])
    return files[index] if isinstance(index, int) and 0 <= index < len(files) else None


def checked_texts(batches, text_column, description, bad_place):
    """The text column of each batch; errors while reading become PrepareErrors that say where (bad_place())."""
    documents = 0
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as err:  # malformed JSON in a later file, a dropped connection, ...
            raise PrepareError(f"could not read {description} after {documents:,} documents: {describe(err)}"
                               f"{bad_place()}") from err
        texts = batch.get(text_column)
        if texts is None:
            raise PrepareError(f"{description}: no column {text_column!r} after {documents:,} documents")
        wrong = next((text for text in texts if text is not None and not isinstance(text, str)), None)
        if wrong is not None:
            raise PrepareError(f"{description}: column {text_column!r} holds {type(wrong).__name__} values, not text")
        documents += len(texts)
        yield texts


def hash_router(val_fraction, seed):
    """route(text) -> "train" | "val": val for a val_fraction share of documents, chosen by a seeded hash.

    A hash of the text rather than a random draw: the choice does not depend on the order or sharding
    of the stream, and repeated documents (web text has many) all land on the same side, so val
    never holds a copy of a train document.
    """
    key = hashlib.sha256(str(seed).encode()).digest()
    threshold = val_fraction * 2**64

    def route(text):
        digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8, key=key).digest()
        return "val" if int.from_bytes(digest, "little") < threshold else "train"
    return route


def streamed_sources(source, split, val_split, text_column, val_fraction, seed):
    """The streamed run's documents (val first when it is its own split) and the empty ones skipped so far."""
    if val_split is None:  # one stream, divided by a seeded hash of each document
        batches, num_empty = open_stream(source, split, text_column)
        return [(batches, ("train", "val"), hash_router(val_fraction, seed))], num_empty
    # val first: it is small, and a problem with it shows before the long train stream
    (val, val_empty), (train, train_empty) = (open_stream(source, name, text_column) for name in (val_split, split))
    return [(val, *to("val")), (train, *to("train"))], val_empty + train_empty


# -----------------------------------------------------------------------------
# writing: documents are tokenized in threads and appended to the .bin files in order

class TokenFile:
    """A growing uint16 token file (an open atomic_file) that stops at its budget.

    The budget cuts at document boundaries: the first document that would take the file past it, and
    everything after, is left out. So a file holds at most `budget` tokens, short of it by less than
    one document, and every document in it ends with <|endoftext|>.
    """

    def __init__(self, file, budget, name):
        self.file, self.budget, self.name = file, budget, name
        self.tokens = self.documents = 0
        self.full = False

    def append(self, ids, lengths):
        """Append the documents of a batch (their ids concatenated, and their lengths) that fit."""
        if self.full or len(lengths) == 0:
            return 0
        ends = np.cumsum(lengths)
        fit = len(ends) if self.budget is None else int(np.searchsorted(ends, self.budget - self.tokens, side="right"))
        if fit == 0 and self.documents == 0:
            raise PrepareError(f"--max_tokens gives {self.name}.bin a budget of {self.budget:,} tokens, less than its "
                               f"first document ({int(lengths[0]):,} tokens): raise --max_tokens"
                               + (" or --val_fraction" if self.name == "val" else ""))
        if fit:
            self.file.write(ids[:ends[fit - 1]].tobytes())
            self.tokens += int(ends[fit - 1])
            self.documents += fit
        self.full = fit < len(ends) or (self.budget is not None and self.tokens >= self.budget)
        return int(ends[fit - 1]) if fit else 0


def tokenize_groups(work):
    """Tokenize {split: texts} into {split: (concatenated uint16 ids, lengths)}; the empty count passes through."""
    groups, num_empty = work
    encoding = gpt2_encoding()  # thread-safe, and its Rust core releases the GIL: threads run in parallel
    tokenized = {}
    for split, texts in groups.items():
        ids = [encoding.encode_ordinary(text) for text in texts]
        lengths = np.array([len(doc) + 1 for doc in ids], dtype=np.int64)
        flat = np.fromiter(itertools.chain.from_iterable(doc + [EOT_TOKEN] for doc in ids),
                           dtype=TOKEN_DTYPE, count=int(lengths.sum()))
        tokenized[split] = (flat, lengths)
    return tokenized, num_empty


def ordered_map(fn, items, num_threads):
    """fn over an endless iterable in num_threads threads, results in order; a few items run ahead, no more."""
    if num_threads <= 1:
        yield from map(fn, items)
        return
    pool = ThreadPoolExecutor(num_threads)
    pending = deque()
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 2 * num_threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:  # also when the consumer stops early (budget met) or fails: drop the work queued ahead
        pool.shutdown(wait=True, cancel_futures=True)


def feed(batches, files, route, num_threads, progress):
    """Tokenize one source's documents into the files they route to, until all are full or it ends.

    Returns the number of empty documents skipped.
    """
    def work():
        for texts in batches:
            keep = has_text(texts)
            groups = {}
            for text in itertools.compress(texts, keep):
                split = route(text)
                if not files[split].full:  # routed before tokenizing: no work for a full file
                    groups.setdefault(split, []).append(text)
            yield groups, keep.count(False)
            if all(file.full for file in files.values()):
                return

    num_empty = 0
    for tokenized, batch_empty in ordered_map(tokenize_groups, work(), num_threads):
        num_empty += batch_empty
        for split, (ids, lengths) in tokenized.items():
            progress.update(files[split].append(ids, lengths))
        if all(file.full for file in files.values()):
            break
    return num_empty


def write_token_files(sources, out_dir, budgets, num_threads, description, val_fraction):
    """Tokenize every source into out_dir/{train,val}.bin; return the meta.json counts (empty ones not included).

    Both files are renamed into place only if every source was written; anything failing (or Ctrl-C)
    removes them and leaves what out_dir held before. meta.json marks a complete dataset: an earlier one
    is removed just before the renames, and the caller writes the new one after them.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in (*budgets, META_FILENAME):
        for tmp in remove_abandoned(out_dir / (f"{name}.bin" if name in budgets else name)):
            print(f"removed {tmp}, left by a run that was killed while writing it")
    num_empty = 0
    with ExitStack() as stack:
        files = {name: TokenFile(stack.enter_context(atomic_file(out_dir / f"{name}.bin", "wb")), budget, name)
                 for name, budget in budgets.items()}
        total = None if None in budgets.values() else sum(budgets.values())
        progress = stack.enter_context(tqdm(total=total, unit="tok", unit_scale=True,
                                            desc="tokenizing into train.bin / val.bin"))
        for batches, names, route in sources:
            num_empty += feed(batches, {name: files[name] for name in names}, route, num_threads, progress)
        for name, file in files.items():  # a hash split of few documents can leave a side empty
            if file.documents == 0:
                raise too_few_documents(f"{description}: no document went to {name}",
                                        sum(f.documents for f in files.values()), val_fraction)
        # not before: a stream that fails hours in leaves the earlier dataset whole, meta.json included
        (out_dir / META_FILENAME).unlink(missing_ok=True)
    return {"tokens": {name: file.tokens for name, file in files.items()},
            "documents": {name: file.documents for name, file in files.items()},
            "empty_documents_skipped": num_empty}


# -----------------------------------------------------------------------------

def prepare(dataset=DEFAULT_DATASET, out_dir=None, text_column="text", num_proc=1, val_fraction=0.0005, seed=2357,
            max_docs=None, dataset_config=None, split="train", val_split=None, streaming=None, max_tokens=None):
    """Load or stream, split, tokenize and write a dataset into out_dir; return the meta.json contents.

    dataset may be a preset name (PRESETS): it fills out_dir, dataset_config, streaming and val_split
    where they are None. Raises PrepareError for bad input (before anything is written, except errors
    found later in a stream) or an out_dir that cannot be written (checked before loading, and any OSError
    while writing), and TokenizerUnavailableError when the GPT-2 BPE cannot be loaded.
    """
    chosen = apply_preset(dataset, out_dir, dataset_config, streaming, val_split)
    if dataset in PRESETS and Path(dataset).exists():  # a folder of C4's files named c4 is the natural name
        print(f"note: --dataset {dataset} is the preset for {chosen['dataset']} on the hub; the local {dataset} "
              f"is not read (for it, write --dataset ./{dataset})")
    streaming, out_dir, val_split = chosen["streaming"], Path(chosen["out_dir"]), chosen["val_split"]
    check_options(num_proc, val_fraction, max_docs, streaming, max_tokens, split, val_split, seed)
    check_out_dir(out_dir)
    source = resolve_source(chosen["dataset"], chosen["dataset_config"], split, val_split)
    gpt2_encoding()  # after the paths are checked, before anything is downloaded
    if streaming:
        sources, num_empty = streamed_sources(source, split, val_split, text_column, val_fraction, seed)
    else:
        sources, num_empty = loaded_sources(source, split, val_split, text_column, num_proc, val_fraction, seed,
                                            max_docs)
    with writing_to(out_dir):
        counts = write_token_files(sources, out_dir, split_budgets(max_tokens, val_fraction), num_proc,
                                   source.description, val_fraction)
    counts["empty_documents_skipped"] += num_empty
    meta = {
        "tokenizer": "gpt2",
        "vocab_size": GPT2_VOCAB_SIZE,
        **counts,
        "source": chosen["dataset"],
        "preset": dataset if dataset in PRESETS else None,
        "dataset_config": chosen["dataset_config"],
        "split": split,
        "val_split": val_split,
        "streaming": streaming,
        "text_column": text_column,
        "val_fraction": val_fraction,
        "seed": seed,
        "max_docs": max_docs,
        "max_tokens": max_tokens,
    }
    with writing_to(out_dir):
        write_meta(out_dir, meta)
    return meta


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default=DEFAULT_DATASET,
                        help=f"hub dataset name, a preset ({', '.join(PRESETS)}), or a local file / folder")
    parser.add_argument("--dataset_config", default=None, help="the hub dataset's config, e.g. en for allenai/c4")
    parser.add_argument("--split", default="train", help="the source split the documents come from")
    parser.add_argument("--val_split", default=None,
                        help="take val.bin from this split of the source (e.g. validation) instead of dividing --split")
    parser.add_argument("--streaming", action=argparse.BooleanOptionalAction, default=None,
                        help="iterate the documents instead of downloading and materialising the dataset")
    parser.add_argument("--max_tokens", type=token_count, default=None,
                        help="streaming: stop at N tokens in all (e.g. 100M, 30B); val gets floor(N * val_fraction)")
    parser.add_argument("--text_column", default="text", help="the column holding each document's text")
    parser.add_argument("--out_dir", default=None,
                        help=f"where train.bin, val.bin and meta.json go (default: {DEFAULT_OUT_DIR}, or the preset's)")
    parser.add_argument("--num_proc", type=int, default=min(8, os.cpu_count() or 1),
                        help="tokenizing threads, and datasets' loading processes (default: the cores, at most 8)")
    parser.add_argument("--val_fraction", type=float, default=0.0005,
                        help="share of documents in val.bin (without --val_split), and of --max_tokens")
    parser.add_argument("--seed", type=int, default=2357, help="seed of the train/val split")
    parser.add_argument("--max_docs", type=int, default=None, help="use only the first N documents (a quick run)")
    args = parser.parse_args(argv)
    out_dir = args.out_dir or default_out_dir(args.dataset)
    replaced = dataset_source(out_dir)
    try:
        meta = prepare(**vars(args))
    except (PrepareError, TokenizerUnavailableError) as err:
        sys.exit(f"error: {err}")
    except KeyboardInterrupt:
        print(stopped_note(out_dir), file=sys.stderr)
        sys.exit(130)
    if replaced not in (None, meta["source"]):
        print(f"replaced the dataset in {out_dir}, which was made from {replaced}")
    docs = {split: f"{n:,} document{'' if n == 1 else 's'}" for split, n in meta["documents"].items()}
    empty = meta["empty_documents_skipped"]
    print(f"wrote {out_dir}: {meta['tokens']['train']:,} train tokens ({docs['train']}), "
          f"{meta['tokens']['val']:,} val tokens ({docs['val']}), "
          f"{empty:,} empty document{'' if empty == 1 else 's'} skipped")


if __name__ == "__main__":
    main()
