"""
Benchmark of prepare_openwebtext.py's tokenize-and-write step (GPT-2 BPE in datasets.map, then the
uint16 memmap writes) at several --num_proc, on a local corpus of some MB. Prints a markdown table.

    python bench_prepare.py                   # ../shared/data/tinyshakespeare.txt in ~5 kB documents, repeated
    python bench_prepare.py --corpus stdlib   # the Python standard library's .py files, one per document
                                              # (the default where Tiny Shakespeare is absent)

Loading, the empty-document filter and the split run once, untimed; each timed run re-tokenizes from
scratch (datasets' cache is bypassed) into a temporary folder. Wall time is what a run costs, but
other processes on the machine inflate it; CPU time (this process and its workers) shows the work itself.
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

from prepare_openwebtext import load_and_split, tokenize_and_write
from tokenizer import TokenizerUnavailableError, gpt2_encoding

SHAKESPEARE = Path(__file__).resolve().parent.parent / "shared" / "data" / "tinyshakespeare.txt"
OWT_DOCUMENT_CHARS = 5000


def stdlib_documents(megabytes):
    """Source files of the running Python's standard library, in sorted order, until `megabytes` of text."""
    documents, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if size >= megabytes * 1e6:
            break
        text = path.read_text(encoding="utf-8", errors="replace")
        documents.append(text)
        size += len(text.encode())
    return documents


def shakespeare_documents(megabytes):
    """Tiny Shakespeare cut at speech boundaries into ~5 kB documents, repeated until `megabytes` of text.

    5 kB is OpenWebText's average document (about 40 GB of text in 8M documents).
    """
    documents, current = [], ""
    for speech in SHAKESPEARE.read_text(encoding="utf-8").split("\n\n"):
        current += speech + "\n\n"
        if len(current) >= OWT_DOCUMENT_CHARS:
            documents.append(current)
            current = ""
    documents += [current] if current else []
    repeats = max(1, round(megabytes * 1e6 / SHAKESPEARE.stat().st_size))
    return documents * repeats


def cpu_seconds():
    # this process and its finished worker processes: unlike wall time, not inflated by other load
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", choices=["shakespeare", "stdlib"],
                        default="shakespeare" if SHAKESPEARE.is_file() else "stdlib")
    parser.add_argument("--megabytes", type=float, default=20.0, help="corpus size to build")
    parser.add_argument("--num_proc", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per num_proc; the fastest is reported")
    args = parser.parse_args()
    try:
        gpt2_encoding()  # before building the corpus: offline, this needs TIKTOKEN_CACHE_DIR
    except TokenizerUnavailableError as e:
        sys.exit(f"error: {e}")

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        datasets.config.HF_DATASETS_CACHE = str(tmp / "hf_cache")  # keep ~/.cache clean
        datasets.disable_progress_bars()
        (tmp / "out").mkdir()

        make_documents = stdlib_documents if args.corpus == "stdlib" else shakespeare_documents
        documents = make_documents(args.megabytes)
        corpus = tmp / "corpus.jsonl"
        corpus.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in documents), encoding="utf-8")
        splits, _ = load_and_split(str(corpus))
        megabytes = corpus.stat().st_size / 1e6  # JSON-escaped size; close to the raw text's

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
                start_wall, start_cpu = time.perf_counter(), cpu_seconds()
                tokens = tokenize_and_write(splits, tmp / "out", num_proc=num_proc, load_from_cache_file=False)
                best_wall = min(best_wall, time.perf_counter() - start_wall)
                best_cpu = min(best_cpu, cpu_seconds() - start_cpu)
            total = sum(tokens.values())
            rate = total / best_wall
            baseline = baseline or rate
            print(f"| {num_proc} | {total:,} | {best_wall:.2f} | {rate:,.0f} | {rate / baseline:.2f}x "
                  f"| {best_cpu:.2f} | {total / best_cpu:,.0f} |")


if __name__ == "__main__":
    main()
