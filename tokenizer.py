"""
The tokenizers and the on-disk dataset format, in one place.

A prepared dataset is a folder holding
    train.bin, val.bin  token ids as flat uint16 arrays (np.memmap(path, dtype=np.uint16, mode="r"))
    meta.json           which tokenizer made them:
                        {"tokenizer": "gpt2" | "char", "vocab_size": int,
                         "chars": "<every character in id order>"   (char only),
                         "tokens": {"train": int, "val": int},   (the token count of each file)
                         ...any extra keys}

The prepare_*.py scripts write this format (the .bin files atomically, then write_meta last) and
raise PrepareError for input they cannot use; training and sampling read it back with read_meta and
tokenizer_from_meta.
"""
import functools
import json
import os
import pickle
from pathlib import Path

import numpy as np

from atomic import atomic_file, write_text_atomic

EOT_TOKEN = 50256  # GPT-2's <|endoftext|>, written after every document
GPT2_VOCAB_SIZE = 50257
TOKEN_DTYPE = np.uint16  # every id of both tokenizers fits in 16 bits, halving the files
META_FILENAME = "meta.json"
NANOGPT_META_FILENAME = "meta.pkl"  # what NanoGPT's data/shakespeare_char/prepare.py writes instead

OFFLINE_HELP = (
    "the GPT-2 BPE could not be loaded: tiktoken downloads it on first use. Offline, set "
    "TIKTOKEN_CACHE_DIR to a folder holding tiktoken's cached r50k_base file (docs/data.md)"
)


class PrepareError(ValueError):
    """Input that cannot be made into a dataset; the prepare scripts print one `error:` line."""


class TokenizerUnavailableError(RuntimeError):
    """The GPT-2 BPE is neither in tiktoken's cache nor downloadable."""


# -----------------------------------------------------------------------------
# tokenizers

@functools.lru_cache(maxsize=None)
def gpt2_encoding():
    """The GPT-2 BPE as a tiktoken Encoding. r50k_base is GPT-2's encoding under another name (same
    ranks, split pattern and <|endoftext|>) in one file, which TIKTOKEN_CACHE_DIR serves offline."""
    import tiktoken  # here, so character-level work does not need tiktoken installed

    try:
        return tiktoken.get_encoding("r50k_base")
    except Exception as err:  # requests' ConnectionError, a hash mismatch, ...
        raise TokenizerUnavailableError(f"{OFFLINE_HELP} ({type(err).__name__})") from err


class GPT2Tokenizer:
    """GPT-2 BPE with the same small interface as CharTokenizer."""

    kind = "gpt2"

    def __init__(self):
        self.encoding = gpt2_encoding()
        self.vocab_size = self.encoding.n_vocab  # 50257
        self.eot = EOT_TOKEN

    def encode(self, text):
        # encode_ordinary: a literal "<|endoftext|>" in the text is text, not the special token
        return self.encoding.encode_ordinary(text)

    def decode(self, ids):
        return self.encoding.decode(list(ids))


class CharTokenizer:
    """One id per character; `chars` lists the vocabulary in id order."""

    kind = "char"
    eot = None  # character-level data has no end-of-text token

    def __init__(self, chars):
        self.chars = chars
        self.vocab_size = len(chars)
        self.stoi = {ch: i for i, ch in enumerate(chars)}

    def encode(self, text):
        unknown = ", ".join(map(repr, sorted(set(text) - self.stoi.keys())))
        if unknown:
            raise ValueError(f"characters not in the vocabulary: {unknown}; the model knows only "
                             f"the {self.vocab_size} characters of its training text")
        return [self.stoi[ch] for ch in text]

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)


# -----------------------------------------------------------------------------
# meta.json

def check_meta(meta, where):
    """Raise ValueError, naming `where`, unless meta follows the format in the module docstring."""
    meta = meta if isinstance(meta, dict) else {}
    tokens = meta.get("tokens") if isinstance(meta.get("tokens"), dict) else {}
    if not (meta.get("tokenizer") in ("gpt2", "char") and isinstance(meta.get("vocab_size"), int)
            and all(isinstance(tokens.get(split), int) for split in ("train", "val"))):
        raise ValueError(f'{where}: expected {{"tokenizer": "gpt2" | "char", "vocab_size": int, '
                         f'"tokens": {{"train": int, "val": int}}, ...}}')
    if meta["tokenizer"] == "char" and not (isinstance(meta.get("chars"), str)
                                            and len(meta["chars"]) == meta["vocab_size"]):
        raise ValueError(f'{where}: a "char" dataset needs "chars", vocab_size characters')


def write_meta(data_dir, meta):
    """Write data_dir/meta.json atomically, after checking it."""
    path = Path(data_dir) / META_FILENAME
    check_meta(meta, f"refusing to write {path}")
    write_text_atomic(path, json.dumps(meta, indent=2) + "\n")


def read_meta(data_dir):
    """Read and check data_dir/meta.json; errors name the file."""
    path = Path(data_dir) / META_FILENAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: prepare the dataset first "
                                f"(prepare_openwebtext.py or prepare_char.py write it)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    check_meta(meta, str(path))
    return meta


class _PlainDataUnpickler(pickle.Unpickler):
    """Reads dicts, strings and numbers only: a pickle that names a class or function (which
    loading would call) is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"it names {module}.{name}, and only plain data is read")


def read_nanogpt_meta(data_dir):
    """NanoGPT's character-level data_dir/meta.pkl ({"vocab_size", "itos", "stoi"}) as a meta dict
    of this repo's, so that checkpoints NanoGPT trained can be sampled and scored here."""
    path = Path(data_dir) / NANOGPT_META_FILENAME
    try:
        with open(path, "rb") as f:
            nanogpt_meta = _PlainDataUnpickler(f).load()
        chars = "".join(nanogpt_meta["itos"][i] for i in range(nanogpt_meta["vocab_size"]))
    except Exception as e:  # unpickling fails in many ways (EOFError, KeyError, ...), all alike
        raise ValueError(f"{path} is not NanoGPT's character-level meta.pkl: "
                         f"{type(e).__name__}: {e}") from None
    return {"tokenizer": "char", "vocab_size": len(chars), "chars": chars,
            "tokens": {"train": 0, "val": 0}}  # counts NanoGPT does not record


def tokenizer_from_meta(meta):
    """The tokenizer a dataset was made with: a CharTokenizer or a GPT2Tokenizer."""
    check_meta(meta, "meta")
    return CharTokenizer(meta["chars"]) if meta["tokenizer"] == "char" else GPT2Tokenizer()


# -----------------------------------------------------------------------------
# writing a dataset

def check_out_dir(out_dir):
    """Raise PrepareError unless a dataset can be written in out_dir: checked before the text is
    read or downloaded (hours for OpenWebText), not after. Nothing is created."""
    existing = Path(out_dir).absolute()
    while not existing.exists():
        existing = existing.parent
    if not (existing.is_dir() and os.access(existing, os.W_OK)):
        raise PrepareError(f"cannot write the dataset to {out_dir}: {existing} is not a writable "
                           f"folder (choose another --out_dir)")


def stopped_note(out_dir):
    """What a Ctrl-C left in out_dir: the prepare scripts remove meta.json before they replace the
    token files and write it last, so a folder with one holds a complete dataset."""
    if (Path(out_dir) / META_FILENAME).is_file():
        return f"stopped by Ctrl-C; {out_dir} holds a complete dataset"
    return (f"stopped by Ctrl-C; {out_dir} holds no complete dataset (no {META_FILENAME}): "
            f"prepare it again")


def write_tokens_atomically(path, ids):
    """Write token ids to `path` as flat uint16, whole or not at all (atomic.py)."""
    ids = np.asarray(ids)
    if ids.size and (ids.min() < 0 or ids.max() > 65535):  # astype would wrap them silently
        raise ValueError(f"token ids must be in [0, 65535] to be stored as uint16 in {path}")
    with atomic_file(path, "wb") as f:
        f.write(ids.astype(TOKEN_DTYPE).tobytes())
