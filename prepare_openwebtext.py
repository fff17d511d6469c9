"""
Prepare OpenWebText (or any text corpus) for training: GPT-2 BPE token ids in train.bin / val.bin
(flat uint16 arrays, <|endoftext|> = 50256 after every document) plus meta.json, as tokenizer.py describes.

    python prepare_openwebtext.py                                  # OpenWebText from the hub, ~9B tokens
    python prepare_openwebtext.py --max_docs 2000 --out_dir data/owt_small  # a quick partial run
    python prepare_openwebtext.py --dataset my_corpus/ --out_dir data/mine  # local files, works offline

--dataset is a hub dataset name or a local file / folder:
    .jsonl / .json   one document per record, its text in --text_column
    .parquet         one document per row, its text in --text_column
    .txt             each FILE is one document (its newlines are kept, \\r\\n becomes \\n)
A folder is searched recursively and must hold files of one kind. Hub and local input go through the
same load_dataset call (only the builder name and its data files differ); everything after it is shared.

Steps: load -> drop empty documents -> train/val split as NanoGPT does -> tokenize in parallel
(datasets.map) -> write each split into a uint16 memmap batch by batch -> meta.json.
The .bin files are filled under temporary names and renamed once complete, and meta.json is written
last, so a folder with a meta.json holds a complete, consistent dataset.
"""
import argparse
import math
import os
import sys
from pathlib import Path

import pyarrow.compute as pc
from datasets import Dataset, Features, List, Value, load_dataset
from tqdm import tqdm

from tokenizer import (
    EOT_TOKEN,
    GPT2_VOCAB_SIZE,
    META_FILENAME,
    TokenizerUnavailableError,
    gpt2_encoding,
    token_memmap_writer,
    write_meta,
)

# Skylion007/openwebtext is what NanoGPT's load_dataset("openwebtext") resolved to. Its old loading
# script (openwebtext.py) stopped working when datasets 4 dropped dataset scripts; the hub repo has
# since been converted to plain parquet shards (data/train-000NN-of-00093.parquet, no script), which
# current datasets releases load directly. So the canonical name works again and no mirror is needed.
DEFAULT_DATASET = "Skylion007/openwebtext"
LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
WRITE_BATCH_DOCS = 8192  # documents copied into the memmap at a time: ~9M tokens (18 MB) of OpenWebText
# uint16 ids keep datasets' cache of the tokenized corpus 4x smaller than the int64 it would infer
TOKENIZED_FEATURES = Features({"ids": List(Value("uint16")), "len": Value("int64")})


class PrepareError(Exception):
    """Bad input or options; the CLI prints the message alone, without a traceback."""


# -----------------------------------------------------------------------------
# loading: a hub name or local files, into one datasets.Dataset of documents

def looks_like_a_path(name):
    # hub names are "name" or "owner/name"; anything else that does not exist is a mistyped path
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or Path(name).suffix.lower() in LOCAL_BUILDERS


def resolve_source(dataset):
    """(builder, load_dataset keyword arguments, description) for a hub name or a local file / folder."""
    path = Path(dataset).expanduser()
    if not path.exists():
        if looks_like_a_path(dataset):
            raise PrepareError(f"{dataset}: no such file or folder")
        return dataset, {}, f"hub dataset {dataset!r}"

    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in LOCAL_BUILDERS)
        if not files:
            raise PrepareError(f"{path}: the folder holds no {' / '.join(LOCAL_BUILDERS)} files")
    else:
        files = [path]
    builders = {LOCAL_BUILDERS.get(p.suffix.lower()) for p in files}
    if None in builders:
        raise PrepareError(f"{path}: unsupported file type; use {' / '.join(LOCAL_BUILDERS)}")
    if len(builders) > 1:
        raise PrepareError(f"{path}: mixes file types ({', '.join(sorted(builders))}); use one kind per run")
    if all(p.stat().st_size == 0 for p in files):
        raise PrepareError(f"{path}: no text (every file is empty)")

    builder = builders.pop()
    options = {"data_files": [str(p) for p in files]}
    if builder == "text":
        options["sample_by"] = "document"  # one row per file, not per line
    return builder, options, f"{path} ({len(files)} {builder} file{'s' if len(files) > 1 else ''})"


def describe(err):
    # datasets wraps the useful message (bad JSON on line N, ...) in a generic DatasetGenerationError
    parts = []
    while err is not None and len(parts) < 3:
        parts.append(f"{type(err).__name__}: {err}" if str(err) else type(err).__name__)
        err = err.__cause__ or err.__context__
    return " <- ".join(parts)


def pool_size(num_proc):
    # None rather than 1: datasets then runs in this process and never starts a worker pool
    return num_proc if num_proc > 1 else None


def load_documents(dataset, text_column="text", max_docs=None, num_proc=1):
    """Load the documents as a datasets.Dataset and check that text_column holds text."""
    builder, options, description = resolve_source(dataset)
    try:
        if max_docs is None:
            docs = load_dataset(builder, split="train", num_proc=pool_size(num_proc), **options)
        else:
            # stream only the first max_docs documents instead of downloading the whole dataset
            stream = load_dataset(builder, split="train", streaming=True, **options)
            docs = Dataset.from_list(list(stream.take(max_docs)))
    except Exception as err:
        hint = "" if options else " (no local file or folder has that name either)"
        raise PrepareError(f"could not load {description}{hint}: {describe(err)}") from err

    if len(docs) == 0:
        raise PrepareError(f"{description}: no text (no documents)")
    if text_column not in docs.column_names:
        raise PrepareError(
            f"{description} has no column {text_column!r}; its columns are: {', '.join(docs.column_names)} "
            f"(choose one with --text_column)"
        )
    feature = docs.features[text_column]
    if not (isinstance(feature, Value) and feature.dtype in ("string", "large_string")):
        raise PrepareError(f"{description}: column {text_column!r} holds {feature}, not text")
    return docs, description


# -----------------------------------------------------------------------------
# empty documents, train/val split, tokenizing, writing

def has_text(texts):
    # None (a record without the column), "" and whitespace-only documents carry nothing to learn
    return [bool(text) and not text.isspace() for text in texts]


def split_train_val(docs, val_fraction, seed):
    """NanoGPT's split: a shuffled train_test_split, its "test" split renamed "val"."""
    num_val = math.ceil(val_fraction * len(docs))  # what train_test_split(test_size=val_fraction) takes
    if num_val >= len(docs):
        raise PrepareError(
            f"{len(docs)} non-empty document(s) cannot make both a train and a val split with "
            f"--val_fraction {val_fraction}: it needs at least 2 documents and a val split smaller than the rest"
        )
    splits = docs.train_test_split(test_size=num_val, seed=seed, shuffle=True)
    splits["val"] = splits.pop("test")
    return splits


def load_and_split(dataset, text_column="text", num_proc=1, val_fraction=0.0005, seed=2357, max_docs=None):
    """Load the documents, drop the empty ones, split train/val; return (splits, number of empty documents)."""
    docs, description = load_documents(dataset, text_column, max_docs, num_proc)
    nonempty = docs.filter(has_text, input_columns=text_column, batched=True,
                           num_proc=pool_size(num_proc), desc="dropping empty documents")
    num_empty = len(docs) - len(nonempty)
    if len(nonempty) == 0:
        raise PrepareError(f"{description}: no text (all {num_empty} document(s) in column {text_column!r} are empty)")
    return split_train_val(nonempty, val_fraction, seed), num_empty


def tokenize_batch(texts):
    encoding = gpt2_encoding()  # cached per process
    ids = [encoding.encode_ordinary(text) + [EOT_TOKEN] for text in texts]
    return {"ids": ids, "len": [len(doc_ids) for doc_ids in ids]}


def write_split(tokenized, path):
    """Copy a tokenized split into a uint16 memmap at `path`, batch by batch; return its token count."""
    num_tokens = pc.sum(tokenized.with_format("arrow")[:]["len"]).as_py()
    written = 0
    with token_memmap_writer(path, num_tokens) as arr, \
            tqdm(total=num_tokens, unit="tok", unit_scale=True, desc=f"writing {path.name}") as progress:
        for batch in tokenized.with_format("arrow").iter(batch_size=WRITE_BATCH_DOCS):
            ids = pc.list_flatten(batch["ids"]).to_numpy()
            arr[written:written + len(ids)] = ids
            written += len(ids)
            progress.update(len(ids))
        assert written == num_tokens, f"wrote {written} tokens into {path}, expected {num_tokens}"
    return num_tokens


def tokenize_and_write(splits, out_dir, text_column="text", num_proc=1, load_from_cache_file=None):
    """Tokenize every split with GPT-2 BPE in num_proc processes and write out_dir/<split>.bin.

    Returns {split: number of tokens}. load_from_cache_file=False forces a fresh tokenization
    (the benchmark needs that; a rerun of the real thing benefits from datasets' cache).
    """
    tokenized = splits.map(
        tokenize_batch,
        input_columns=text_column,
        batched=True,
        remove_columns=splits["train"].column_names,
        features=TOKENIZED_FEATURES,
        num_proc=pool_size(num_proc),
        load_from_cache_file=load_from_cache_file,
        desc="tokenizing",
    )
    return {split: write_split(dset, Path(out_dir) / f"{split}.bin") for split, dset in tokenized.items()}


# -----------------------------------------------------------------------------

def prepare(dataset=DEFAULT_DATASET, out_dir="data/openwebtext", text_column="text", num_proc=1,
            val_fraction=0.0005, seed=2357, max_docs=None):
    """Load, split, tokenize and write a dataset into out_dir; return the meta.json contents.

    Raises PrepareError for bad input (before anything is tokenized) and TokenizerUnavailableError
    when the GPT-2 BPE cannot be loaded (before anything is downloaded).
    """
    if num_proc < 1:
        raise PrepareError(f"--num_proc must be at least 1, got {num_proc}")
    if not 0 < val_fraction < 1:
        raise PrepareError(f"--val_fraction must be between 0 and 1, got {val_fraction}")
    if max_docs is not None and max_docs < 1:
        raise PrepareError(f"--max_docs must be at least 1, got {max_docs}")
    gpt2_encoding()  # fail now rather than after the download; forked workers inherit the loaded encoding
    splits, num_empty = load_and_split(dataset, text_column, num_proc, val_fraction, seed, max_docs)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / META_FILENAME).unlink(missing_ok=True)  # it marks a complete dataset, so it comes back last
    tokens = tokenize_and_write(splits, out_dir, text_column, num_proc)
    meta = {
        "tokenizer": "gpt2",
        "vocab_size": GPT2_VOCAB_SIZE,
        "tokens": tokens,
        "documents": {split: len(dset) for split, dset in splits.items()},
        "empty_documents_skipped": num_empty,
        "source": dataset,
        "text_column": text_column,
        "val_fraction": val_fraction,
        "seed": seed,
        "max_docs": max_docs,
    }
    write_meta(out_dir, meta)
    return meta


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default=DEFAULT_DATASET, help="hub dataset name, or a local file / folder")
    parser.add_argument("--text_column", default="text", help="the column holding each document's text")
    parser.add_argument("--out_dir", default="data/openwebtext", help="where train.bin, val.bin and meta.json go")
    parser.add_argument("--num_proc", type=int, default=min(8, os.cpu_count() or 1),
                        help="tokenizing processes (default: the cores, at most 8)")
    parser.add_argument("--val_fraction", type=float, default=0.0005, help="share of documents in val.bin")
    parser.add_argument("--seed", type=int, default=2357, help="seed of the shuffled train/val split")
    parser.add_argument("--max_docs", type=int, default=None, help="use only the first N documents (a quick run)")
    args = parser.parse_args(argv)
    try:
        meta = prepare(**vars(args))
    except (PrepareError, TokenizerUnavailableError) as err:
        sys.exit(f"error: {err}")
    print(f"wrote {args.out_dir}: {meta['tokens']['train']:,} train tokens ({meta['documents']['train']:,} documents), "
          f"{meta['tokens']['val']:,} val tokens ({meta['documents']['val']:,} documents), "
          f"{meta['empty_documents_skipped']:,} empty documents skipped")


if __name__ == "__main__":  # guarded, so worker processes that import this file do not rerun it
    main()
