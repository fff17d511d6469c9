"""
OpenWebText, C4 or any text corpus as GPT-2 BPE token ids: train.bin / val.bin (flat uint16,
<|endoftext|> = 50256 after every document) and meta.json, the format tokenizer.py describes.

    python prepare_openwebtext.py                          # OpenWebText from the hub, ~9B tokens
    python prepare_openwebtext.py --max_docs=2000 --out_dir=data/owt_small   # a quick partial run
    python prepare_openwebtext.py --dataset=my_corpus/ --out_dir=data/mine   # local files
    python prepare_openwebtext.py --dataset=c4 --max_tokens=100M  # C4 (allenai/c4 en), streamed

--dataset is a hub dataset, the preset c4, or a local file or folder of .jsonl / .json / .parquet
(a document per record) or .txt files (a document per file; a single file is cut at its blank
lines), maybe gzipped. In a folder, a file with a split's name as a word of its path belongs to it.
Offline, TIKTOKEN_CACHE_DIR must name a folder holding tiktoken's cached r50k_base (docs/data.md).

The documents are loaded and split as NanoGPT does, or with --streaming read in batches (val by a
seeded hash of each text, or --val_split). Threads tokenize them into train.bin / val.bin, renamed
into place when complete; meta.json is removed before and written last: it marks a whole dataset.
"""
import argparse
import hashlib
import itertools
import math
import os
import re
import sys
from collections import deque, namedtuple
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from decimal import Decimal, InvalidOperation
from pathlib import Path

import numpy as np
from datasets import Dataset, Value, load_dataset
from tqdm import tqdm

from atomic import atomic_file
from tokenizer import (EOT_TOKEN, GPT2_VOCAB_SIZE, META_FILENAME, TOKEN_DTYPE, PrepareError,
                       TokenizerUnavailableError, check_out_dir, gpt2_encoding, stopped_note,
                       write_meta)

# NanoGPT's load_dataset("openwebtext") resolved to this repository, now plain parquet shards
DEFAULT_DATASET = "Skylion007/openwebtext"
DEFAULT_OUT_DIR = "data/openwebtext"
# C4 en is 305 GB of json.gz, so it streams; val.bin is C4's own validation split
PRESETS = {"c4": {"dataset": "allenai/c4", "dataset_config": "en", "streaming": True,
                  "val_split": "validation", "out_dir": "data/c4"}}
LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
SPLIT_NAMES = ("train", "training", "validation", "valid", "dev", "val", "test", "testing", "eval",
               "evaluation")  # the split names `datasets` itself reads in file names
BATCH_DOCS = 1024  # documents read, routed and tokenized as one unit


def token_count(text):
    """argparse type of --max_tokens: 100000000, 100_000_000, 1e8, 100M and 0.1B are the same."""
    scale = {"k": 10**3, "m": 10**6, "b": 10**9}.get(text[-1:].lower(), 1)
    try:
        value = Decimal((text[:-1] if scale > 1 else text).replace("_", "")) * scale
    except InvalidOperation:
        value = Decimal("NaN")
    if not (value.is_finite() and value == value.to_integral_value() and value >= 1):
        raise argparse.ArgumentTypeError(f"not a token count: {text!r} (e.g. 1e8, 100M or 30B)")
    return int(value)


def split_budgets(max_tokens, val_fraction):
    """{"train": at most this many tokens, "val": ...}; None means no limit."""
    if max_tokens is None:
        return {"train": None, "val": None}
    # in decimal, as the fraction was typed: in binary floats 100 * 0.29 is just under 29
    val = math.floor(max_tokens * Decimal(repr(val_fraction)))
    return {"train": max_tokens - val, "val": val}


# -----------------------------------------------------------------------------
# where the documents come from: a hub name or local files, read through load_dataset

# builder: a hub name, or json / parquet / text; options: load_dataset's config or data files
Source = namedtuple("Source", "builder options description")


def local_kind(path):
    """The load_dataset builder for a local file name ("x.jsonl", "x.json.gz", ...), or None."""
    return LOCAL_BUILDERS.get(Path(path.name.lower().removesuffix(".gz")).suffix)


def resolve_source(dataset, dataset_config=None, split="train", val_split=None):
    """Where the documents come from: a hub name (with its config) or a local file or folder."""
    path = Path(dataset).expanduser()
    if not path.exists():
        # hub names are "name" or "owner/name": anything else is a mistyped path
        if dataset.startswith(("/", ".", "~")) or dataset.endswith("/") or dataset.count("/") > 1 \
                or local_kind(path):
            raise PrepareError(f"{dataset}: no such file or folder")
        config = f", config {dataset_config!r}" if dataset_config else ""
        options = {"name": dataset_config} if dataset_config else {}
        return Source(dataset, options, f"hub dataset {dataset!r}{config}")
    files = sorted(p for p in path.rglob("*") if p.is_file() and local_kind(p)) if path.is_dir() \
        else [path]
    builders = {local_kind(p) for p in files}
    if len(builders) != 1 or None in builders:
        raise PrepareError(f"{path}: give files of one kind: {', '.join(LOCAL_BUILDERS)} "
                           f"(optionally .gz)")
    data_files = files_by_split(path, files, split, val_split) if path.is_dir() else {split: files}
    options = {"data_files": {s: [str(p) for p in f] for s, f in data_files.items()}}
    builder = builders.pop()
    if builder == "text":  # in a folder a document per .txt file, in one file per paragraph
        options["sample_by"] = "document" if path.is_dir() else "paragraph"
    return Source(builder, options, f"{path} ({len(files)} {builder} file{'s' * (len(files) > 1)})")


def files_by_split(folder, files, split, val_split):
    """{split: its files}: the files named for it (the split's name is a word of their path, as in
    c4-validation.00000-of-00008.json.gz); for --split, where none is, those named for no split."""
    names = [val_split, split] if val_split else [split]

    def named(path):
        words = re.split(r"[-._ /0-9]", str(path.relative_to(folder)).lower())
        return next((word for word in [*names, *SPLIT_NAMES] if word.lower() in words), None)
    data_files = {name: [p for p in files if named(p) == name] for name in names}
    data_files[split] = data_files[split] or [p for p in files if named(p) is None]
    missing = [name for name, split_files in data_files.items() if not split_files]
    if missing:
        raise PrepareError(f"{folder}: no file for split {missing[0]!r} (a split's files have its "
                           f"name as a word of their path)")
    return data_files


def load_failed(source, split, err):
    """One line: the error and its causes (datasets wraps the useful message), the way offline."""
    parts, offline = [], ""
    while err is not None and len(parts) < 3:
        if isinstance(err, ConnectionError) or type(err).__name__ == "OfflineModeIsEnabled":
            offline = "; without a network, pass local files: --dataset=path/to/folder_or_file"
        first_line = next((line for line in str(err).splitlines() if line.strip()), "")
        parts.append(f"{type(err).__name__}: {first_line}")
        err = err.__cause__ or err.__context__
    return PrepareError(f"could not load split {split!r} of {source.description}: "
                        f"{' <- '.join(parts)}{offline}")


def has_text(texts):
    # None (a record without the column), "" and whitespace carry nothing to learn
    return [bool(text) and not text.isspace() for text in texts]


def check_text_column(columns, features, text_column, description):
    feature = (features or {}).get(text_column)  # a stream may not know its types
    if text_column not in columns or (feature is not None and not (
            isinstance(feature, Value) and feature.dtype in ("string", "large_string"))):
        raise PrepareError(f"{description} has no text column {text_column!r}; its columns are: "
                           f"{', '.join(columns)} (choose one with --text_column)")


def load_split(source, split, text_column, max_docs, num_proc):
    """One split of the source, materialised, without its empty documents: (docs, empty ones)."""
    description = f"split {split!r} of {source.description}"
    num_proc = num_proc if num_proc > 1 else None  # None: no worker pool at all
    try:
        if max_docs is None:
            docs = load_dataset(source.builder, split=split, num_proc=num_proc, **source.options)
        else:  # stream only the first max_docs documents instead of downloading the whole dataset
            stream = load_dataset(source.builder, split=split, streaming=True, **source.options)
            docs = Dataset.from_list(list(stream.take(max_docs)))
        check_text_column(docs.column_names, docs.features, text_column, description)
        nonempty = docs.filter(has_text, input_columns=text_column, batched=True,
                               num_proc=num_proc, desc="dropping empty documents")
    except PrepareError:
        raise
    except Exception as err:
        raise load_failed(source, split, err) from err
    if len(nonempty) == 0:
        raise PrepareError(f"{description}: no text (no document, or only empty ones)")
    return nonempty, len(docs) - len(nonempty)


def to(name, batches):
    """(batches of texts, the files they feed, route(text) -> file) for a source of one file."""
    return batches, (name,), lambda text: name


def loaded_sources(source, split, val_split, text_column, num_proc, val_fraction, seed, max_docs):
    """The (batches, files, route) of a loaded run, val first, and the empty documents dropped.
    Without val_split, NanoGPT's split of the documents: train_test_split(test_size=val_fraction,
    seed=seed, shuffle=True), its "test" as val."""
    train, num_empty = load_split(source, split, text_column, max_docs, num_proc)
    if val_split is not None:
        val, val_empty = load_split(source, val_split, text_column, max_docs, num_proc)
        num_empty += val_empty
    else:
        num_val = math.ceil(val_fraction * len(train))  # what train_test_split(test_size=...) takes
        if num_val >= len(train):
            raise PrepareError(f"{source.description}: too few documents for a train and a val "
                               f"split with --val_fraction={val_fraction}: give more, or raise it")
        splits = train.train_test_split(test_size=num_val, seed=seed, shuffle=True)
        train, val = splits["train"], splits["test"]
    return [to("val", texts_of(val, text_column)), to("train", texts_of(train, text_column))], \
        num_empty


def texts_of(docs, text_column):
    for batch in docs.select_columns([text_column]).iter(batch_size=BATCH_DOCS):
        yield batch[text_column]


def open_stream(source, split, text_column, max_docs):
    """Batches of texts of one split, read lazily; the first is read here, so that a source that
    cannot be read or has no such column fails before anything is written."""
    try:
        stream = load_dataset(source.builder, split=split, streaming=True, **source.options)
        stream = stream if max_docs is None else stream.take(max_docs)
        batches = iter(stream.iter(batch_size=BATCH_DOCS))
        first = next(batches, {text_column: []})  # none: the writer says no document came
    except Exception as err:
        raise load_failed(source, split, err) from err
    check_text_column(list(first), stream.features, text_column, source.description)

    def texts():
        yield first[text_column]
        try:
            for batch in batches:
                yield batch[text_column]
        except Exception as err:  # bad JSON in a later file, a dropped connection, ...
            raise load_failed(source, split, err) from err
    return texts()


def hash_router(val_fraction, seed):
    """route(text) -> "train" | "val": val for a val_fraction share of documents, by a seeded hash
    of the text, so that the choice does not depend on the order of the stream and a repeated
    document always lands on the same side."""
    key = hashlib.sha256(str(seed).encode()).digest()
    threshold = val_fraction * 2**64

    def route(text):
        digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8, key=key)
        return "val" if int.from_bytes(digest.digest(), "little") < threshold else "train"
    return route


def streamed_sources(source, split, val_split, text_column, val_fraction, seed, max_docs):
    if val_split is None:  # one stream, divided by a seeded hash of each document
        batches = open_stream(source, split, text_column, max_docs)
        return [(batches, ("train", "val"), hash_router(val_fraction, seed))], 0
    # val first: it is small, and a problem with it shows before the long train stream
    val, train = (open_stream(source, s, text_column, max_docs) for s in (val_split, split))
    return [to("val", val), to("train", train)], 0


# -----------------------------------------------------------------------------
# writing: documents are tokenized in threads and appended to the .bin files in order

class TokenFile:
    """A growing uint16 token file (an open atomic_file) that stops at its budget, at a document
    boundary: it holds at most `budget` tokens, and every document in it ends with 50256."""

    def __init__(self, file, budget):
        self.file, self.budget = file, math.inf if budget is None else budget
        self.tokens = self.documents = 0
        self.full = False

    def append(self, ids, lengths):
        """Append the documents of a batch (their ids concatenated, and their lengths) that fit."""
        if self.full or len(lengths) == 0:
            return 0
        ends = np.cumsum(lengths)
        fit = int(np.searchsorted(ends, self.budget - self.tokens, side="right"))
        written = int(ends[fit - 1]) if fit else 0
        self.file.write(ids[:written].tobytes())
        self.tokens += written
        self.documents += fit
        self.full = fit < len(ends) or self.tokens >= self.budget
        return written


def tokenize_groups(work):
    """({split: texts}, n) -> ({split: (concatenated uint16 ids, lengths)}, n)."""
    groups, num_empty = work
    encoding = gpt2_encoding()  # thread-safe, and it releases the GIL: threads run in parallel
    tokenized = {}
    for split, texts in groups.items():
        ids = [encoding.encode_ordinary(text) + [EOT_TOKEN] for text in texts]
        lengths = np.array([len(doc) for doc in ids], dtype=np.int64)
        flat = np.fromiter(itertools.chain.from_iterable(ids), TOKEN_DTYPE, int(lengths.sum()))
        tokenized[split] = (flat, lengths)
    return tokenized, num_empty


def ordered_map(fn, items, num_threads):
    """fn over an iterable in num_threads threads, results in order, a few items ahead at most."""
    pool, pending = ThreadPoolExecutor(num_threads), deque()
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 2 * num_threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:  # also when the consumer stops early (budget met) or fails: drop the work ahead
        pool.shutdown(wait=True, cancel_futures=True)


def feed(batches, files, route, num_threads, progress):
    """Tokenize one source's documents into the files they route to, until all are full or it
    ends; return the number of empty documents skipped."""
    def work():
        for texts in batches:
            keep = has_text(texts)
            groups = {}
            for text in itertools.compress(texts, keep):
                split = route(text)
                if not files[split].full:  # routed before tokenizing: no work for a full file
                    groups.setdefault(split, []).append(text)
            yield groups, keep.count(False)

    num_empty = 0
    for tokenized, batch_empty in ordered_map(tokenize_groups, work(), num_threads):
        num_empty += batch_empty
        for split, (ids, lengths) in tokenized.items():
            progress.update(files[split].append(ids, lengths))
        if all(file.full for file in files.values()):
            break
    return num_empty


def write_token_files(sources, out_dir, budgets, num_threads, description):
    """Tokenize every source into out_dir/{train,val}.bin; return the counts for meta.json.

    Both files are renamed into place only if every source was written; a failure (or Ctrl-C)
    removes them and leaves what out_dir held before."""
    out_dir.mkdir(parents=True, exist_ok=True)
    num_empty = 0
    with ExitStack() as stack:
        files = {name: TokenFile(stack.enter_context(atomic_file(out_dir / f"{name}.bin", "wb")),
                                 budget) for name, budget in budgets.items()}
        total = None if None in budgets.values() else sum(budgets.values())
        progress = stack.enter_context(tqdm(total=total, unit="tok", unit_scale=True,
                                            desc="tokenizing into train.bin / val.bin"))
        for batches, names, route in sources:
            num_empty += feed(batches, {name: files[name] for name in names}, route, num_threads,
                              progress)
        empty = [name for name, file in files.items() if file.documents == 0]
        if empty:
            raise PrepareError(f"{description}: no document went to {empty[0]}.bin: give more "
                               f"documents, or raise --val_fraction or --max_tokens")
        # not before: a run that fails hours in leaves the earlier dataset whole
        (out_dir / META_FILENAME).unlink(missing_ok=True)
    return {"tokens": {name: file.tokens for name, file in files.items()},
            "documents": {name: file.documents for name, file in files.items()},
            "empty_documents_skipped": num_empty}


# -----------------------------------------------------------------------------

def prepare(dataset=DEFAULT_DATASET, out_dir=None, text_column="text", num_proc=1,
            val_fraction=0.0005, seed=2357, max_docs=None, dataset_config=None, split="train",
            val_split=None, streaming=None, max_tokens=None):
    """Load or stream, split, tokenize and write a dataset into out_dir; return its meta.json.

    A preset name (PRESETS) as dataset fills the options left None. Raises PrepareError for bad
    input, TokenizerUnavailableError when the GPT-2 BPE cannot be loaded."""
    preset = PRESETS.get(dataset, {})
    dataset = preset.get("dataset", dataset)
    dataset_config = dataset_config or preset.get("dataset_config")
    val_split = val_split or preset.get("val_split")
    streaming = preset.get("streaming", False) if streaming is None else streaming
    out_dir = Path(out_dir or preset.get("out_dir", DEFAULT_OUT_DIR))
    if num_proc < 1 or not 0 < val_fraction < 1:
        raise PrepareError("--num_proc must be at least 1, and --val_fraction between 0 and 1")
    check_out_dir(out_dir)
    source = resolve_source(dataset, dataset_config, split, val_split)
    gpt2_encoding()  # after the paths are checked, before anything is downloaded
    args = (source, split, val_split, text_column)
    sources, num_empty = (streamed_sources(*args, val_fraction, seed, max_docs) if streaming else
                          loaded_sources(*args, num_proc, val_fraction, seed, max_docs))
    counts = write_token_files(sources, out_dir, split_budgets(max_tokens, val_fraction), num_proc,
                               source.description)
    counts["empty_documents_skipped"] += num_empty
    meta = {"tokenizer": "gpt2", "vocab_size": GPT2_VOCAB_SIZE, **counts, "source": dataset,
            "dataset_config": dataset_config, "split": split, "val_split": val_split,
            "streaming": streaming, "text_column": text_column, "val_fraction": val_fraction,
            "seed": seed, "max_docs": max_docs, "max_tokens": max_tokens}
    write_meta(out_dir, meta)
    return meta


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default=DEFAULT_DATASET, help="hub name, c4, file or folder")
    parser.add_argument("--dataset_config", default=None, help="the hub dataset's config (en)")
    parser.add_argument("--split", default="train", help="the split the documents come from")
    parser.add_argument("--val_split", default=None, help="val.bin from this split (validation)")
    parser.add_argument("--streaming", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--max_tokens", type=token_count, default=None,
                        help="stop at N tokens in all (100M, 30B); val gets N * val_fraction")
    parser.add_argument("--text_column", default="text", help="the column of the documents' text")
    parser.add_argument("--out_dir", default=None, help=f"default: {DEFAULT_OUT_DIR}, or c4's")
    parser.add_argument("--num_proc", type=int, default=min(8, os.cpu_count() or 1),
                        help="tokenizing threads and loading processes (default: cores, at most 8)")
    parser.add_argument("--val_fraction", type=float, default=0.0005, help="val's share")
    parser.add_argument("--seed", type=int, default=2357, help="seed of the train/val split")
    parser.add_argument("--max_docs", type=int, default=None, help="only the first N documents")
    args = parser.parse_args(argv)
    out_dir = args.out_dir or PRESETS.get(args.dataset, {}).get("out_dir", DEFAULT_OUT_DIR)
    try:
        meta = prepare(**vars(args))
    except (PrepareError, TokenizerUnavailableError) as err:
        sys.exit(f"error: {err}")
    except OSError as err:  # a full disk, no permission
        sys.exit(f"error: cannot write the dataset to {out_dir}: {err}")
    except KeyboardInterrupt:
        print(stopped_note(out_dir), file=sys.stderr)
        sys.exit(130)
    (train, val), (train_docs, val_docs) = meta["tokens"].values(), meta["documents"].values()
    print(f"wrote {out_dir}: {train:,} train / {val:,} val tokens, {train_docs:,} / {val_docs:,} "
          f"documents, {meta['empty_documents_skipped']:,} empty skipped")


if __name__ == "__main__":
    main()
