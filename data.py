"""
The training data and its batches. A dataset folder holds train.bin, val.bin (uint16 token ids, as
NanoGPT writes them) and meta.json (tokenizer.py). check_data reads all three before anything trains
and stops with a DataError where they do not belong together; Batches draws random windows.
"""

from pathlib import Path

import numpy as np
import torch

from model import PRETRAINED_GPT2
from tokenizer import TOKEN_DTYPE, read_meta


class DataError(ValueError):
    """Training data that is missing, empty, too short, or does not fit the model."""


# the commands that make the datasets the shipped configs read, by the name of their folder
PREPARE_COMMANDS = {
    "shakespeare_char": ("python prepare_char.py --input=path/to/tinyshakespeare.txt, "
                         "or python prepare_char.py (downloads it)"),
    "stdlib_char": "python prepare_char.py --corpus=stdlib",
    "shakespeare": "python prepare_openwebtext.py --dataset=path/to/tinyshakespeare.txt "
                   "--out_dir=data/shakespeare --val_fraction=0.1",
    "openwebtext": "python prepare_openwebtext.py",
    "c4": "python prepare_openwebtext.py --dataset=c4",
}


def prepare_hint(data_dir):
    """How to make the missing dataset data_dir: its command, for a folder the configs name."""
    data_dir = Path(data_dir)
    if data_dir == Path("data", data_dir.name) and data_dir.name in PREPARE_COMMANDS:
        return f"prepare the dataset first: {PREPARE_COMMANDS[data_dir.name]}"
    return (f"prepare the dataset first, with --out_dir={data_dir}: python prepare_char.py for "
            f"characters, python prepare_openwebtext.py for GPT-2 BPE (docs/data.md)")


def config_data_dir(c):
    """The dataset folder a training config reads: data_dir, or NanoGPT's data/<dataset>."""
    return Path(c["data_dir"] or Path("data") / c["dataset"])


def check_data_dir(data_dir):
    """A DataError, with the command that makes it, if the data folder does not exist."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        where = ("" if data_dir.is_absolute() else
                 f" (in {Path.cwd()}: data paths are relative to the current folder)")
        raise DataError(f"data folder {data_dir} not found{where}: {prepare_hint(data_dir)}")


def check_data(data_dir, block_size):
    """Check train.bin, val.bin and meta.json before training: (meta, n_tokens, largest id)."""
    data_dir = Path(data_dir)
    check_data_dir(data_dir)
    again = "the data and meta.json do not belong together; prepare the dataset again"
    paths = {split: data_dir / f"{split}.bin" for split in ("train", "val")}
    for path in paths.values():
        if not path.is_file() or path.stat().st_size == 0:
            problem = "is empty" if path.is_file() else "not found"
            raise DataError(f"{path} {problem}: {prepare_hint(data_dir)}")
    try:
        meta = read_meta(data_dir)
    except (FileNotFoundError, ValueError) as e:
        raise DataError(str(e)) from None
    n_tokens = {split: path.stat().st_size // 2 for split, path in paths.items()}
    largest = 0
    for split, path in paths.items():
        if n_tokens[split] < block_size + 1:
            raise DataError(f"{path} holds {n_tokens[split]} tokens, fewer than block_size + 1 = "
                            f"{block_size + 1}: use a smaller block_size or more data")
        if path.stat().st_size != 2 * meta["tokens"][split]:
            odd = " and a byte" if path.stat().st_size % 2 else ""
            raise DataError(f"{path} holds {n_tokens[split]:,} tokens{odd}, but meta.json says "
                            f"{meta['tokens'][split]:,}: {again}")
        ids = np.memmap(path, dtype=TOKEN_DTYPE, mode="r")  # over 2^28 ids: too long to scan
        largest = max(largest, meta["vocab_size"] - 1 if len(ids) > 1 << 28 else int(ids.max()))
    if largest >= meta["vocab_size"]:
        raise DataError(f"{data_dir} holds token id {largest}, but its meta.json says "
                        f"vocab_size={meta['vocab_size']}: {again}")
    return meta, n_tokens, largest


class Batches:
    """Random (x, y) windows from a uint16 token file. One torch.Generator, seeded alike on every
    rank, draws the offsets of all of an iteration's micro-batches at once, and rank r takes its
    share. So the micro-batches are the same whatever the number of ranks, and the generator's
    state is all an exact resume needs."""

    def __init__(self, path, block_size, batch_size, device):
        self.path, self.block_size, self.batch_size = path, block_size, batch_size
        self.device = device
        self.n = Path(path).stat().st_size // 2

    def offsets(self, n_micro, generator):
        shape = (n_micro, self.batch_size)
        return torch.randint(self.n - self.block_size, shape, generator=generator)

    def get(self, ix):
        # a fresh memmap per batch, as NanoGPT does, avoids a slow memory growth on huge files
        data = np.memmap(self.path, dtype=TOKEN_DTYPE, mode="r")
        T = self.block_size
        rows = np.stack([data[i:i + T + 1] for i in ix.tolist()]).astype(np.int64)
        xy = torch.from_numpy(rows)
        if self.device.startswith("cuda"):  # pin and copy whole rows, then split them on the GPU
            xy = xy.pin_memory().to(self.device, non_blocking=True)
            return xy[:, :-1].contiguous(), xy[:, 1:].contiguous()
        xy = xy.to(self.device)  # on the CPU, the tensor itself
        return xy[:, :-1], xy[:, 1:]


def choose_vocab_size(c, meta, max_token, data_dir):
    """The model's vocabulary size: GPT-2's for its weights, the config's, or the data's."""
    if c["init_from"] in PRETRAINED_GPT2:
        if meta["tokenizer"] != "gpt2":
            raise DataError(f"init_from={c['init_from']!r} needs GPT-2 BPE data, "
                            f"but {data_dir} is {meta['tokenizer']}-level")
        vocab_size = 50257
    elif c["vocab_size"]:
        vocab_size = c["vocab_size"]
    else:
        vocab_size = meta["vocab_size"]
        if meta["tokenizer"] == "gpt2":
            vocab_size = (vocab_size + 63) // 64 * 64  # 50257 -> 50304 as NanoGPT: faster matmuls
    if vocab_size <= max_token:
        raise DataError(f"vocab_size={vocab_size} is too small for the data in {data_dir}: its "
                        f"largest token id is {max_token}, so it must be at least {max_token + 1}")
    return vocab_size


def check_same_tokens(saved_meta, meta, data_dir, source):
    """A resume must read the token ids its checkpoint learned: the same tokenizer and, for
    characters, the same characters in the same order (else it trains on other text, silently)."""
    if not saved_meta:
        return  # a checkpoint from before meta was saved: nothing to compare
    ours, theirs = saved_meta.get("tokenizer"), meta["tokenizer"]
    a, b = saved_meta.get("chars") or "", meta.get("chars") or ""
    if ours != theirs:
        difference = f"it was trained on {ours} tokens, {data_dir} holds {theirs} ones"
    elif a != b:
        i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        difference = (f"its {len(a)} characters and the {len(b)} of {data_dir} differ from id {i} "
                      f"on, so its ids would spell other text")
    else:
        return
    raise DataError(f"cannot resume from {source}: {difference}. Resume on the data it was trained "
                    f"on, or train on this data in another out_dir")
