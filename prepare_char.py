"""
Character-level datasets: one token per character, NanoGPT's 90% / 10% train / val split.

    python prepare_char.py                                  # Tiny Shakespeare, downloaded (needs a network)
    python prepare_char.py --input=path/to/tinyshakespeare.txt   # Tiny Shakespeare (or any text) from a local file
    python prepare_char.py --corpus=stdlib                  # offline: the Python standard library's own .py sources

Writes train.bin, val.bin (uint16 token ids) and meta.json into --out_dir (default
data/shakespeare_char or data/stdlib_char), each file atomically, through tokenizer.py's helpers.

The stdlib corpus exists wherever Python does, so the quick start needs no download: every `.py`
file under the running interpreter's standard library folder (site-packages excluded) whose text
is pure ASCII, in a fixed pseudo-random order (by a hash of the file's relative path, so that
both splits mix all kinds of modules), files separated by a blank line. Its exact content depends
on the Python version and on what the distribution ships, so figures on it are not comparable
across machines; Tiny Shakespeare is the benchmark corpus.
"""

import argparse
import hashlib
import sys
import sysconfig
import urllib.request
from pathlib import Path

import numpy as np

from atomic import write_text_atomic
from tokenizer import (META_FILENAME, CharTokenizer, PrepareError, char_fingerprint, check_out_dir, dataset_source,
                       stopped_note, write_meta, write_tokens_atomically)

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
DEFAULT_OUT = {"shakespeare": "data/shakespeare_char", "stdlib": "data/stdlib_char"}
TRAIN_FRACTION = 0.9


def download_shakespeare(timeout=30):
    try:
        with urllib.request.urlopen(SHAKESPEARE_URL, timeout=timeout) as response:
            return response.read().decode("utf-8")
    except Exception as e:
        raise PrepareError(
            f"could not download Tiny Shakespeare from {SHAKESPEARE_URL} ({type(e).__name__}: {e}). "
            f"Without a network, pass a local copy with --input=path/to/tinyshakespeare.txt, or use the offline "
            f"corpus: python prepare_char.py --corpus=stdlib"
        ) from None


def stdlib_files(root=None):
    """The standard library's pure-ASCII .py files, as (relative path, text), in a fixed order."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    found = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if {"site-packages", "dist-packages", "__pycache__"} & set(rel.parts):
            continue
        try:
            text = path.read_bytes().decode("ascii")
        except (OSError, UnicodeDecodeError):
            continue
        text = text.replace("\r\n", "\n")
        if text.strip():
            found.append((rel.as_posix(), text))
    found.sort(key=lambda item: hashlib.sha1(item[0].encode()).hexdigest())
    return found


def stdlib_corpus(root=None, max_chars=0):
    if max_chars < 0:  # text[:-n] would silently drop the end instead
        raise PrepareError(f"--max_chars must be 0 (every character) or more, got {max_chars}")
    files = stdlib_files(root)
    if not files:
        raise PrepareError(f"found no .py files under {root or sysconfig.get_paths()['stdlib']}")
    pieces, total = [], 0
    for _, text in files:
        pieces.append(text)
        total += len(text) + 2
        if max_chars and total >= max_chars:
            break
    text = "\n\n".join(pieces)
    return text[:max_chars] if max_chars else text


def encode(text, tokenizer):
    """Character ids as uint16; a lookup table when every character is below U+0100 (fast on tens of MB)."""
    if all(ord(ch) < 256 for ch in tokenizer.chars):
        table = np.zeros(256, dtype=np.uint16)
        for i, ch in enumerate(tokenizer.chars):
            table[ord(ch)] = i
        return table[np.frombuffer(text.encode("latin-1"), dtype=np.uint8)]
    return np.array(tokenizer.encode(text), dtype=np.uint16)


def prepare(text, out_dir, source):
    """Write a character-level dataset of `text` into out_dir; return its meta dict."""
    n = len(text)
    split = int(n * TRAIN_FRACTION)
    if min(split, n - split) < 2:  # each split needs block_size + 1 tokens, at least 2
        raise PrepareError(f"{source}: {'the text is empty' if n == 0 else f'{n} characters'}, too short to split "
                           f"into train and val: 90% / 10% gives {split} / {n - split} tokens, and training takes "
                           f"block_size + 1 (2 at the least) from each; give a longer text")
    chars = "".join(sorted(set(text)))
    if len(chars) > 65536:
        raise PrepareError(f"{len(chars)} distinct characters do not fit in uint16 token ids")
    tokenizer = CharTokenizer(chars)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / META_FILENAME).unlink(missing_ok=True)  # a meta.json marks a complete dataset: it goes until the end
    train_ids, val_ids = encode(text[:split], tokenizer), encode(text[split:], tokenizer)
    write_tokens_atomically(out_dir / "train.bin", train_ids)
    write_tokens_atomically(out_dir / "val.bin", val_ids)
    meta = {
        "tokenizer": "char",
        "vocab_size": len(chars),
        "chars": chars,
        "tokens": {"train": int(train_ids.size), "val": int(val_ids.size)},
        "train_text_sha1": char_fingerprint(train_ids, chars),  # train.py checks "chars" against it
        "source": source,
        "characters": n,
    }
    write_meta(out_dir, meta)  # last, so a complete meta.json means a complete dataset
    return meta


def read_text_file(path):
    """The text of a local UTF-8 file, line ends made "\\n" as text-mode reading does."""
    path = Path(path)
    if path.is_dir():
        raise PrepareError(f"--input={path} is a folder: pass a text file")
    if not path.is_file():
        raise PrepareError(f"--input={path}: no such file")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise PrepareError(f"--input={path}: cannot read it ({e.strerror})") from None
    try:
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as e:
        raise PrepareError(
            f"--input={path} is not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start} is not valid UTF-8. "
            f"Convert the file first, e.g. iconv -f latin1 -t utf-8 {path} > {path.stem}.utf8{path.suffix}"
        ) from None


def main(argv=None):
    """The command line; returns the exit status (errors are one `error:` line on stderr)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", choices=("shakespeare", "stdlib"), default="shakespeare")
    parser.add_argument("--input", default="", help="a local UTF-8 text file instead of the download")
    parser.add_argument("--out_dir", default="", help="default: data/shakespeare_char (also for --input), or data/stdlib_char for --corpus=stdlib")
    parser.add_argument("--max_chars", type=int, default=0, help="stdlib corpus: keep at most this many characters (0 = all)")
    args = parser.parse_args(argv)
    out_dir = args.out_dir or DEFAULT_OUT[args.corpus]
    try:
        meta = prepare_from_args(args, out_dir)
    except PrepareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the output folder cannot be written
        print(f"error: cannot write the dataset: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(stopped_note(out_dir), file=sys.stderr)
        return 130
    print(f"{meta['source']}: {meta['characters']:,} characters, vocab {meta['vocab_size']}, "
          f"{meta['tokens']['train']:,} train / {meta['tokens']['val']:,} val tokens -> {out_dir}")
    return 0


def prepare_from_args(args, out_dir):
    """Read or download the text the arguments name and prepare it in out_dir; return its meta."""
    if args.input and args.corpus == "stdlib":  # which corpus, and which default out_dir, would be a guess
        raise PrepareError(f"--input={args.input} and --corpus=stdlib name two texts: give one of them")
    if args.max_chars and args.corpus != "stdlib":  # not silently ignored: the whole text would be prepared
        raise PrepareError("--max_chars cuts the stdlib corpus only (--corpus=stdlib); to prepare part of a text, "
                           "give --input a file holding that part")
    check_out_dir(out_dir)
    if args.input:
        text = read_text_file(args.input)
        source = f"file:{Path(args.input).name}"
    elif args.corpus == "shakespeare":
        print(f"downloading {SHAKESPEARE_URL}")
        text = download_shakespeare()
        source = SHAKESPEARE_URL
    else:
        text = stdlib_corpus(max_chars=args.max_chars)
        source = f"python{sys.version_info.major}.{sys.version_info.minor} stdlib .py sources"
    replaced = dataset_source(out_dir)
    if args.corpus == "shakespeare" and not args.input:
        write_text_atomic(Path(out_dir) / "input.txt", text)
    meta = prepare(text, out_dir, source)
    if replaced not in (None, source):  # --input's default out_dir is Tiny Shakespeare's
        print(f"replaced the dataset in {out_dir}, which was made from {replaced}")
    return meta


if __name__ == "__main__":
    sys.exit(main())
