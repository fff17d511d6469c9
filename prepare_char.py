"""
Character-level datasets: one token per character, NanoGPT's 90% / 10% train / val split.

    python prepare_char.py                           # Tiny Shakespeare, downloaded
    python prepare_char.py --input=path/to/file.txt  # Tiny Shakespeare (or any text), a local file
    python prepare_char.py --corpus=stdlib           # offline: the standard library's .py sources

Writes train.bin, val.bin (uint16 token ids) and meta.json into --out_dir (default
data/shakespeare_char, or data/stdlib_char). The stdlib corpus needs no download: the pure-ASCII
.py files of the running Python's standard library, in an order fixed by a hash of their paths.
"""

import argparse
import hashlib
import sys
import sysconfig
import urllib.request
from pathlib import Path

import numpy as np

from atomic import write_text_atomic
from tokenizer import (META_FILENAME, CharTokenizer, PrepareError, check_out_dir, stopped_note,
                       write_meta, write_tokens_atomically)

SHAKESPEARE_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/"
                   "tinyshakespeare/input.txt")


def stdlib_files(root=None):
    """The standard library's pure-ASCII .py files, as (relative path, text), in a fixed order."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    found = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if {"site-packages", "dist-packages", "__pycache__"} & set(rel.parts):
            continue
        text = path.read_bytes()
        if text.isascii() and text.strip():
            found.append((rel.as_posix(), text.decode().replace("\r\n", "\n")))
    return sorted(found, key=lambda item: hashlib.sha1(item[0].encode()).hexdigest())


def stdlib_corpus(root=None, max_chars=0):
    """The stdlib corpus, files separated by a blank line; max_chars, if not 0, cuts it."""
    text = "\n\n".join(text for _, text in stdlib_files(root))
    return text[:max_chars] if max_chars else text


def encode(text, tokenizer):
    """Character ids as uint16; a lookup table where every character is below U+0100 (fast)."""
    if all(ord(ch) < 256 for ch in tokenizer.chars):
        table = np.zeros(256, dtype=np.uint16)
        table[[ord(ch) for ch in tokenizer.chars]] = np.arange(tokenizer.vocab_size)
        return table[np.frombuffer(text.encode("latin-1"), dtype=np.uint8)]
    return np.array(tokenizer.encode(text), dtype=np.uint16)


def prepare(text, out_dir, source):
    """Write a character-level dataset of `text` into out_dir; return its meta dict."""
    split = int(len(text) * 0.9)
    if min(split, len(text) - split) < 2:  # each split needs block_size + 1 tokens, at least 2
        raise PrepareError(f"{source}: {len(text)} characters, too few for a train and a val split")
    tokenizer = CharTokenizer("".join(sorted(set(text))))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / META_FILENAME).unlink(missing_ok=True)  # marks a complete dataset: written last
    train_ids, val_ids = encode(text[:split], tokenizer), encode(text[split:], tokenizer)
    write_tokens_atomically(out_dir / "train.bin", train_ids)
    write_tokens_atomically(out_dir / "val.bin", val_ids)
    meta = {"tokenizer": "char", "vocab_size": tokenizer.vocab_size, "chars": tokenizer.chars,
            "tokens": {"train": len(train_ids), "val": len(val_ids)}, "source": source}
    write_meta(out_dir, meta)
    return meta


def read_text(args):
    """(text, source) of the corpus the arguments name: a local file, the download or the stdlib."""
    if args.input:
        path = Path(args.input)
        if not path.is_file():
            raise PrepareError(f"--input={path}: no such file")
        try:  # line ends made "\n", as text-mode reading does
            text = path.read_bytes().decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
        except UnicodeDecodeError as e:
            raise PrepareError(f"--input={path} is not UTF-8 text (byte {e.start}): convert it "
                               f"first, e.g. with iconv -f latin1 -t utf-8") from None
        return text, f"file:{path.name}"
    if args.corpus == "stdlib":
        version = "python%d.%d" % sys.version_info[:2]
        return stdlib_corpus(max_chars=args.max_chars), f"{version} stdlib .py sources"
    print(f"downloading {SHAKESPEARE_URL}")
    try:
        with urllib.request.urlopen(SHAKESPEARE_URL, timeout=30) as response:
            text = response.read().decode("utf-8")
    except Exception as e:  # URLError, a timeout, a connection cut off, ...
        raise PrepareError(f"could not download Tiny Shakespeare ({e}): offline, give a copy with "
                           f"--input=path/to/tinyshakespeare.txt, or use --corpus=stdlib") from e
    write_text_atomic(Path(args.out_dir) / "input.txt", text)  # kept beside the dataset, as NanoGPT
    return text, SHAKESPEARE_URL


def main(argv=None):
    """The command line; returns the exit status (errors are one `error:` line on stderr)."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", choices=("shakespeare", "stdlib"), default="shakespeare")
    parser.add_argument("--input", default="", help="a UTF-8 text file instead of the download")
    parser.add_argument("--out_dir", default="", help="default: data/<corpus>_char")
    parser.add_argument("--max_chars", type=int, default=0, help="stdlib: the first N characters")
    args = parser.parse_args(argv)
    args.out_dir = args.out_dir or f"data/{args.corpus}_char"
    try:
        check_out_dir(args.out_dir)
        text, source = read_text(args)
        meta = prepare(text, args.out_dir, source)
    except (PrepareError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(stopped_note(args.out_dir), file=sys.stderr)
        return 130
    train, val = meta["tokens"].values()
    print(f"wrote {args.out_dir}: {len(text):,} characters, vocab {meta['vocab_size']}, "
          f"{train:,} train / {val:,} val tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
