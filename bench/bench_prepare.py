"""
Benchmark of prepare_openwebtext.py's tokenize-and-write step (GPT-2 BPE in --num_proc threads,
appended to train.bin / val.bin) at several --num_proc, on a local corpus. Prints a markdown table.

    python bench/bench_prepare.py --text path/to/tinyshakespeare.txt  # cut into ~5 kB documents
    python bench/bench_prepare.py --corpus stdlib  # the stdlib's .py files, one a document

Without --text, Tiny Shakespeare is read from ../shared/data where it is, else the stdlib is used.
Loading and the split are untimed; each timed run tokenizes and writes into a temporary folder.
Other processes inflate the wall time; the CPU time (all threads) shows the work itself.
"""
import argparse
import json
import os
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import datasets

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo's modules, from bench/
from machine import header  # noqa: E402  (bench/ is on the path when run as a script)
from prepare_openwebtext import loaded_sources, resolve_source, write_token_files
from tokenizer import TokenizerUnavailableError, gpt2_encoding

SHAKESPEARE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"
OWT_DOCUMENT_CHARS = 5000


def stdlib_documents(megabytes):
    """The standard library's source files, in sorted order, until `megabytes` of text."""
    documents, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if size >= megabytes * 1e6:
            break
        text = path.read_text(encoding="utf-8", errors="replace")
        documents.append(text)
        size += len(text.encode())
    return documents


def shakespeare_documents(megabytes, text):
    """Tiny Shakespeare (the file `text`) cut at speech boundaries into ~5 kB documents (the
    average of OpenWebText's: 40 GB of text in 8M documents), repeated to `megabytes` of text."""
    documents, current = [], ""
    for speech in text.read_text(encoding="utf-8").split("\n\n"):
        current += speech + "\n\n"
        if len(current) >= OWT_DOCUMENT_CHARS:
            documents.append(current)
            current = ""
    documents += [current] if current else []
    repeats = max(1, round(megabytes * 1e6 / text.stat().st_size))
    return documents * repeats


def cpu_seconds():
    # every thread of this process: unlike wall time, not inflated by other load
    t = os.times()
    return t.user + t.system


def tokenize_and_write(corpus, out_dir, num_proc):
    """(tokens written, wall seconds, CPU seconds) of tokenizing and writing a loaded corpus."""
    source = resolve_source(str(corpus))
    sources, _ = loaded_sources(source, "train", None, "text", 1, 0.0005, 2357, None)
    start_wall, start_cpu = time.perf_counter(), cpu_seconds()
    counts = write_token_files(sources, out_dir, {"train": None, "val": None}, num_proc,
                               source.description)
    wall, cpu = time.perf_counter() - start_wall, cpu_seconds() - start_cpu
    return sum(counts["tokens"].values()), wall, cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text", type=Path, help=f"Tiny Shakespeare (default: {SHAKESPEARE})")
    parser.add_argument("--corpus", choices=["shakespeare", "stdlib"],
                        help="default: shakespeare where --text is a file, else stdlib")
    parser.add_argument("--megabytes", type=float, default=20.0, help="corpus size to build")
    parser.add_argument("--num_proc", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs each; the best counts")
    args = parser.parse_args()
    if not args.megabytes > 0 or min(args.num_proc) < 1 or args.repeats < 1:
        parser.error("--megabytes must be positive, and --num_proc and --repeats at least 1")
    args.corpus = args.corpus or ("shakespeare" if args.text or SHAKESPEARE.is_file() else "stdlib")
    args.text = args.text or SHAKESPEARE
    if args.corpus == "shakespeare" and not args.text.is_file():
        parser.error(f"--text {args.text}: no such file: give Tiny Shakespeare's path, or "
                     f"--corpus stdlib")
    try:
        gpt2_encoding()  # before building the corpus: offline, this needs TIKTOKEN_CACHE_DIR
    except TokenizerUnavailableError as e:
        sys.exit(f"error: {e}")

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        datasets.config.HF_DATASETS_CACHE = str(tmp / "hf_cache")  # keep ~/.cache clean
        datasets.disable_progress_bars()

        documents = (stdlib_documents(args.megabytes) if args.corpus == "stdlib" else
                     shakespeare_documents(args.megabytes, args.text))
        corpus = tmp / "corpus.jsonl"
        corpus.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in documents))
        megabytes = corpus.stat().st_size / 1e6  # JSON-escaped size; close to the raw text's

        print(header("bench_prepare.py", sys.argv[1:], "cpu"))
        print(f"corpus: {args.corpus}, {len(documents):,} documents, {megabytes:.1f} MB as jsonl; "
              f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} before the runs")
        print()
        print(f"| num_proc | tokens | wall s (best of {args.repeats}) | tokens/s | speed-up "
              f"| CPU s | tokens per CPU s |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        baseline = None
        for num_proc in args.num_proc:
            best_wall, best_cpu = float("inf"), float("inf")
            for _ in range(args.repeats):
                total, wall, cpu = tokenize_and_write(corpus, tmp / "out", num_proc)
                best_wall, best_cpu = min(best_wall, wall), min(best_cpu, cpu)
            rate = total / best_wall
            baseline = baseline or rate
            print(f"| {num_proc} | {total:,} | {best_wall:.2f} | {rate:,.0f} | "
                  f"{rate / baseline:.2f}x | {best_cpu:.2f} | {total / best_cpu:,.0f} |")


if __name__ == "__main__":
    main()
