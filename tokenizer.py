"""
The tokenizers and the on-disk dataset format, in one place.

A prepared dataset is a folder holding
    train.bin, val.bin  token ids as flat uint16 arrays (read them with np.memmap(path, dtype=np.uint16, mode="r"))
    meta.json           which tokenizer made them:
                        {"tokenizer": "gpt2" | "char", "vocab_size": int,
                         "chars": "<every character in id order>"   (char only),
                         "tokens": {"train": int, "val": int},   (the token count of each file)
                         "train_text_sha1": char_fingerprint of train.bin   (char only, optional),
                         ...any extra keys}

The prepare_*.py scripts write this format (write_tokens_atomically, or atomic.py's atomic_file for a
file that grows, then write_meta last) and raise PrepareError for input they cannot make into it;
training and sampling read it back with read_meta and tokenizer_from_meta.
"""
import functools
import hashlib
import json
import os
import pickle
import tempfile
from pathlib import Path

import numpy as np

from atomic import atomic_file, write_text_atomic

EOT_TOKEN = 50256  # GPT-2's <|endoftext|>, written after every document
GPT2_VOCAB_SIZE = 50257
TOKEN_DTYPE = np.uint16  # every id of both tokenizers fits in 16 bits, halving the files
META_FILENAME = "meta.json"
NANOGPT_META_FILENAME = "meta.pkl"  # what NanoGPT's data/shakespeare_char/prepare.py writes instead

# tiktoken downloads r50k_base from this address and caches it under the SHA-1 of the address.
# r50k_base is the GPT-2 encoding under another name: same ranks, split pattern and <|endoftext|>.
R50K_BASE_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"

OFFLINE_HELP = (
    "The GPT-2 BPE could not be loaded: tiktoken downloads it on first use and there seems to be no network. "
    "To run offline, set TIKTOKEN_CACHE_DIR to a folder holding tiktoken's cached r50k_base (or gpt2) files, "
    "e.g. on a machine with network run\n"
    "    TIKTOKEN_CACHE_DIR=/some/folder python -c \"import tiktoken; tiktoken.get_encoding('r50k_base')\"\n"
    "then copy /some/folder here and export TIKTOKEN_CACHE_DIR=/path/to/that/folder."
)


class PrepareError(ValueError):
    """Input that cannot be made into a dataset (no such file, no text, options that cannot work
    together); the prepare scripts print the message alone, as one `error:` line."""


class TokenizerUnavailableError(RuntimeError):
    """The GPT-2 BPE is neither in tiktoken's cache nor downloadable."""


# -----------------------------------------------------------------------------
# GPT-2 BPE

def _tiktoken_cache_dir():
    # Same lookup order as tiktoken.load.read_file_cached.
    for variable in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if variable in os.environ:
            return os.environ[variable]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def _r50k_base_is_cached():
    cache_dir = _tiktoken_cache_dir()
    cache_key = hashlib.sha1(R50K_BASE_URL.encode()).hexdigest()
    return bool(cache_dir) and os.path.isfile(os.path.join(cache_dir, cache_key))


@functools.lru_cache(maxsize=None)
def gpt2_encoding():
    """The GPT-2 BPE as a tiktoken Encoding (its .name may be "gpt2" or "r50k_base": the same encoding).

    If r50k_base is already in tiktoken's cache it is loaded first, so no network is touched at all;
    otherwise "gpt2" is tried (downloaded or read from the cache), then "r50k_base". tiktoken's
    downloads have no timeout: where DNS fails (the usual offline case) they fail in well under a
    second, but a network that silently drops packets can stall them, hence the cached path first.
    """
    import tiktoken  # here, so character-level work does not need tiktoken installed

    names = ["r50k_base"] if _r50k_base_is_cached() else ["gpt2", "r50k_base"]
    failures = []
    for name in names:
        try:
            encoding = tiktoken.get_encoding(name)
        except Exception as err:  # requests' ConnectionError, a hash mismatch, ...: try the next name
            failures.append(f"{name}: {type(err).__name__}: {err}")
            continue
        if encoding.eot_token != EOT_TOKEN or encoding.n_vocab != GPT2_VOCAB_SIZE:
            failures.append(f"{name}: unexpected eot {encoding.eot_token} / vocab size {encoding.n_vocab}")
            continue
        return encoding
    raise TokenizerUnavailableError(OFFLINE_HELP + "\nWhat failed:\n  " + "\n  ".join(failures))


class GPT2Tokenizer:
    """GPT-2 BPE with the same small interface as CharTokenizer."""

    kind = "gpt2"

    def __init__(self):
        self.encoding = gpt2_encoding()
        self.vocab_size = self.encoding.n_vocab  # 50257
        self.eot = EOT_TOKEN

    def encode(self, text):
        # encode_ordinary: a literal "<|endoftext|>" in the text is plain text, never the special token
        return self.encoding.encode_ordinary(text)

    def decode(self, ids):
        return self.encoding.decode(list(ids))


# -----------------------------------------------------------------------------
# character level

class CharTokenizer:
    """One id per character; `chars` lists the vocabulary in id order."""

    kind = "char"
    eot = None  # character-level data has no end-of-text token

    def __init__(self, chars):
        if len(set(chars)) != len(chars):
            raise ValueError("CharTokenizer: the vocabulary string has repeated characters")
        self.chars = chars
        self.vocab_size = len(chars)
        self.stoi = {ch: i for i, ch in enumerate(chars)}

    def encode(self, text):
        try:
            return [self.stoi[ch] for ch in text]
        except KeyError:
            unknown = sorted(set(text) - self.stoi.keys())
            raise ValueError(
                f"characters not in the vocabulary: {', '.join(map(repr, unknown))}. "
                f"This model is character-level and only knows the {self.vocab_size} characters "
                f"of its training text."
            ) from None

    def decode(self, ids):
        ids = list(ids)
        # checked, not caught as an IndexError: a negative id would index chars from the end
        outside = next((i for i in ids if not 0 <= i < self.vocab_size), None)
        if outside is not None:
            raise ValueError(f"token id {outside} is outside the vocabulary of {self.vocab_size} characters "
                             f"(ids 0..{self.vocab_size - 1})")
        return "".join(self.chars[i] for i in ids)


# -----------------------------------------------------------------------------
# meta.json

def _check_meta(meta, where):
    """Raise ValueError, naming `where`, unless meta follows the contract in the module docstring."""
    def bad(problem):
        return ValueError(f"{where}: {problem}")

    if not isinstance(meta, dict):
        raise bad(f"expected a JSON object, got {type(meta).__name__}")
    kind = meta.get("tokenizer")
    if kind not in ("gpt2", "char"):
        raise bad(f'"tokenizer" must be "gpt2" or "char", got {kind!r}')
    if not isinstance(meta.get("vocab_size"), int):
        raise bad('"vocab_size" must be an integer')
    tokens = meta.get("tokens")
    if not (isinstance(tokens, dict) and all(isinstance(tokens.get(split), int) for split in ("train", "val"))):
        raise bad('"tokens" must be {"train": int, "val": int}')
    if kind == "char":
        chars = meta.get("chars")
        if not isinstance(chars, str) or len(chars) != meta["vocab_size"]:
            raise bad('a "char" dataset needs "chars", a string of vocab_size characters')


def char_fingerprint(ids, chars):
    """SHA-1 of the text that character ids spell with `chars` (as UTF-32-LE code points, so that
    no string is built): it changes if the vocabulary is reordered or the ids belong to other text."""
    code_points = np.array([ord(ch) for ch in chars], dtype="<u4")
    return hashlib.sha1(code_points[np.asarray(ids)].tobytes()).hexdigest()


def write_meta(data_dir, meta):
    """Write data_dir/meta.json atomically, after checking it."""
    path = Path(data_dir) / META_FILENAME
    _check_meta(meta, f"refusing to write {path}")
    write_text_atomic(path, json.dumps(meta, indent=2) + "\n")


def read_meta(data_dir):
    """Read and check data_dir/meta.json; errors name the file."""
    path = Path(data_dir) / META_FILENAME
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: prepare the dataset first (prepare_openwebtext.py or prepare_char.py write it)"
        )
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    _check_meta(meta, str(path))
    return meta


def dataset_source(data_dir):
    """The source ("source" in meta.json) a complete dataset in data_dir was made from, or None where there
    is none: what a prepare script names when it replaces the dataset with one of another source."""
    try:
        return read_meta(data_dir).get("source")
    except (FileNotFoundError, ValueError):
        return None


def check_out_dir(out_dir):
    """Raise PrepareError unless out_dir is, or can be made, a folder to write a dataset in: checked before
    the text is read, downloaded or tokenized (hours for OpenWebText), not after. Nothing is created, so
    bad input found later leaves no folder."""
    existing = Path(out_dir).absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():  # mkdir's own "File exists" would read as if the dataset were there already
        raise PrepareError(f"cannot write the dataset to {out_dir}: {existing} is a file, not a folder "
                           f"(choose another --out_dir)")
    try:
        tempfile.TemporaryFile(dir=existing).close()  # no permission, a read-only disk
    except OSError as err:
        raise PrepareError(f"cannot write the dataset to {out_dir}: {err.strerror or err}: {existing}") from err


def stopped_note(out_dir):
    """What a Ctrl-C left in out_dir: the prepare scripts remove meta.json before they touch the other
    files and write it last, so a folder with one holds a complete dataset (the earlier one, or all of
    the new one)."""
    if (Path(out_dir) / META_FILENAME).is_file():
        return f"stopped by Ctrl-C; {out_dir} holds a complete dataset"
    return f"stopped by Ctrl-C; {out_dir} holds no complete dataset (no {META_FILENAME}): prepare it again"


class _PlainDataUnpickler(pickle.Unpickler):
    """Reads dicts, strings and numbers only: a pickle that names a class or function (which loading
    would call) is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"it names {module}.{name}, and only plain data is read")


def read_nanogpt_meta(data_dir):
    """NanoGPT's character-level data_dir/meta.pkl ({"vocab_size", "itos", "stoi"}) as a meta dict of
    this repo's, so that checkpoints NanoGPT trained can be sampled and scored here."""
    path = Path(data_dir) / NANOGPT_META_FILENAME
    try:
        with open(path, "rb") as f:
            nanogpt_meta = _PlainDataUnpickler(f).load()
        chars = "".join(nanogpt_meta["itos"][i] for i in range(nanogpt_meta["vocab_size"]))
    except Exception as e:  # unpickling fails in many ways (EOFError, KeyError, TypeError, ...); each means the same
        raise ValueError(f"{path} is not NanoGPT's character-level meta.pkl: {type(e).__name__}: {e}") from None
    meta = {"tokenizer": "char", "vocab_size": nanogpt_meta["vocab_size"], "chars": chars,
            "tokens": {"train": 0, "val": 0}}  # counts NanoGPT does not record
    _check_meta(meta, str(path))
    return meta


def tokenizer_from_meta(meta):
    """The tokenizer a dataset was made with: a CharTokenizer or a GPT2Tokenizer."""
    _check_meta(meta, "meta")
    return CharTokenizer(meta["chars"]) if meta["tokenizer"] == "char" else GPT2Tokenizer()


# -----------------------------------------------------------------------------
# token files

def write_tokens_atomically(path, ids):
    """Write token ids (each < 65536) to `path` as flat uint16, whole or not at all (atomic.py)."""
    ids = np.asarray(ids)
    if ids.size == 0:
        raise ValueError(f"refusing to write an empty token file {path}")
    if ids.min() < 0 or ids.max() > np.iinfo(TOKEN_DTYPE).max:
        raise ValueError(f"token ids must be in [0, 65535] to be stored as uint16 in {path}")
    with atomic_file(path, "wb") as f:
        f.write(ids.astype(TOKEN_DTYPE).tobytes())
