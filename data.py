"""
The training data contract and the batches. A dataset folder holds train.bin and val.bin (uint16
token ids, as NanoGPT writes them) and meta.json (tokenizer.py: the tokenizer, the vocabulary size
and each split's token count). check_data reads all three before anything trains and stops with a
DataError where they do not belong together; Batches draws random windows from a token file.
"""

from pathlib import Path

import numpy as np
import torch

from model import PRETRAINED_GPT2
from tokenizer import TOKEN_DTYPE, char_fingerprint, read_meta


class DataError(ValueError):
    """Training data that is missing, empty, too short, or does not fit the model."""


# the commands that make each dataset the shipped configs read, by the name of its folder; {data_dir}
# where the script's own default folder is another one
PREPARE_COMMANDS = {
    "shakespeare_char": ("python prepare_char.py --input=path/to/tinyshakespeare.txt",
                         "python prepare_char.py (downloads it)"),
    "stdlib_char": ("python prepare_char.py --corpus=stdlib",),
    "shakespeare": ("python prepare_openwebtext.py --dataset=path/to/tinyshakespeare.txt --out_dir={data_dir} "
                    "--val_fraction=0.1",),
    "openwebtext": ("python prepare_openwebtext.py",),
    "c4": ("python prepare_openwebtext.py --dataset=c4",),
}


def prepare_hint(data_dir):
    """How to make the missing dataset data_dir: its commands where the folder is one the configs name
    (with --out_dir where it is not in its default place), else both scripts."""
    data_dir = Path(data_dir)
    if data_dir.name not in PREPARE_COMMANDS:
        return (f"prepare the dataset first, with --out_dir={data_dir}: python prepare_char.py for characters, "
                f"python prepare_openwebtext.py for GPT-2 BPE (docs/data.md)")
    out_dir = "" if data_dir == Path("data") / data_dir.name else f" --out_dir={data_dir}"
    commands = [command.format(data_dir=data_dir) if "{data_dir}" in command
                else command.replace(".py", f".py{out_dir}", 1) for command in PREPARE_COMMANDS[data_dir.name]]
    return f"prepare the dataset first: {', or '.join(commands)}"


def config_data_dir(c):
    """The dataset folder a training config reads: data_dir, or NanoGPT's data/<dataset>."""
    return Path(c["data_dir"] or Path("data") / c["dataset"])


def _token_file(data_dir, split):
    path = Path(data_dir) / f"{split}.bin"
    if not path.is_file():
        raise DataError(f"{path} not found: {prepare_hint(data_dir)}")
    size = path.stat().st_size
    if size == 0:
        raise DataError(f"{path} is empty: prepare the dataset again")
    if size % 2:
        raise DataError(f"{path} has an odd number of bytes, so it is not a uint16 token file")
    return path


def _max_token(path, limit=1 << 28, chunk=1 << 24):
    """The largest token id in a uint16 file, or None when the file is too large to scan quickly."""
    data = np.memmap(path, dtype=TOKEN_DTYPE, mode="r")
    if len(data) > limit:
        return None
    return max(int(data[i:i + chunk].max()) for i in range(0, len(data), chunk))


def check_data_dir(data_dir):
    """A DataError, with the commands that make it, if the data folder does not exist."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        where = "" if data_dir.is_absolute() else f" (in {Path.cwd()}: data paths are relative to the current folder)"
        raise DataError(f"data folder {data_dir} not found{where}: {prepare_hint(data_dir)}")


def check_data(data_dir, block_size):
    """Check train.bin, val.bin and meta.json before anything trains; return (meta, n_tokens, max_token)."""
    data_dir = Path(data_dir)
    check_data_dir(data_dir)
    paths = {split: _token_file(data_dir, split) for split in ("train", "val")}
    try:
        meta = read_meta(data_dir)
    except (FileNotFoundError, ValueError) as e:
        raise DataError(str(e)) from None
    n_tokens, scanned = {}, {}
    for split, path in paths.items():
        n = path.stat().st_size // 2
        if n < block_size + 1:
            raise DataError(
                f"{path} holds {n} tokens, fewer than block_size + 1 = {block_size + 1}: a training example "
                f"needs block_size inputs plus one target. Use a smaller block_size or more data"
            )
        n_tokens[split] = n
        scanned[split] = _max_token(path)
    check_meta_fits_data(meta, paths, n_tokens, scanned)
    max_token = max(meta["vocab_size"] - 1 if m is None else m for m in scanned.values())
    return meta, n_tokens, max_token


def check_meta_fits_data(meta, paths, n_tokens, scanned):
    """Stop before training when meta.json describes other data than the token files hold: other
    token counts, ids beyond its vocabulary, GPT-2 BPE that uses byte ids only (character data), or
    (character data prepared with a fingerprint) "chars" that no longer spell the prepared text.
    `scanned` is each split's largest id, None where the file was too large to scan."""
    meta_path = paths["train"].parent / "meta.json"
    again = "the data and meta.json do not belong together; prepare the dataset again"
    for split, path in paths.items():
        if n_tokens[split] != meta["tokens"][split]:
            raise DataError(f"{path} holds {n_tokens[split]:,} tokens, but {meta_path} says "
                            f"{meta['tokens'][split]:,}: {again}")
    known = [m for m in scanned.values() if m is not None]
    if known and max(known) >= meta["vocab_size"]:
        raise DataError(f"{meta_path.parent} holds token id {max(known)}, but its meta.json says "
                        f"vocab_size={meta['vocab_size']}: {again}")
    if meta["tokenizer"] == "gpt2" and len(known) == len(scanned) and max(known) < 256:
        raise DataError(f"{meta_path} says the GPT-2 BPE made this data, but no token id is above {max(known)}, "
                        f"while BPE text uses ids far above 255 (' the' is 262): this looks like character-level "
                        f"data, so {again}")
    fingerprint = meta.get("train_text_sha1")
    if meta["tokenizer"] == "char" and fingerprint and scanned["train"] is not None:
        ids = np.memmap(paths["train"], dtype=TOKEN_DTYPE, mode="r")
        if char_fingerprint(ids, meta["chars"]) != fingerprint:
            raise DataError(f"the \"chars\" of {meta_path} do not spell the text {paths['train']} was prepared "
                            f"from (its train_text_sha1 differs): the characters were reordered or belong to "
                            f"other data; {again}")


class Batches:
    """Random (x, y) windows from a uint16 token file.

    Training batches come from one torch.Generator seeded identically on every rank: each iteration
    draws the start offsets of all its gradient_accumulation_steps * batch_size sequences at once,
    and rank r takes its contiguous share of the micro-batches. So the global sequence of
    micro-batches is the same whatever the number of ranks, and the generator's state, saved in
    the checkpoint, is all an exact resume needs."""

    def __init__(self, path, block_size, batch_size, device):
        self.path, self.block_size, self.batch_size, self.device = path, block_size, batch_size, device
        self.n = Path(path).stat().st_size // 2

    def offsets(self, n_micro, generator):
        return torch.randint(self.n - self.block_size, (n_micro, self.batch_size), generator=generator)

    def get(self, ix):
        # a fresh memmap per batch, as NanoGPT does, avoids a slow memory growth on huge files
        data = np.memmap(self.path, dtype=TOKEN_DTYPE, mode="r")
        T = self.block_size
        rows = np.stack([data[i:i + T + 1] for i in ix.tolist()]).astype(np.int64)
        xy = torch.from_numpy(rows)
        if self.device.startswith("cuda"):
            # the shifted views are strided: pin and copy the whole rows once, then split them on the GPU
            xy = xy.pin_memory().to(self.device, non_blocking=True)
            return xy[:, :-1].contiguous(), xy[:, 1:].contiguous()
        if self.device != "cpu":
            xy = xy.to(self.device)
        return xy[:, :-1], xy[:, 1:]


def choose_vocab_size(c, meta, max_token, data_dir):
    if c["init_from"] in PRETRAINED_GPT2:
        if meta["tokenizer"] != "gpt2":
            raise DataError(f"init_from={c['init_from']!r} needs GPT-2 BPE data, but {data_dir} is {meta['tokenizer']}-level")
        vocab_size = 50257
    elif c["vocab_size"]:
        vocab_size = c["vocab_size"]
    else:
        vocab_size = meta["vocab_size"]
        if meta["tokenizer"] == "gpt2":
            vocab_size = (vocab_size + 63) // 64 * 64  # 50257 -> 50304, as NanoGPT, for faster matmuls
    if vocab_size <= max_token:
        raise DataError(
            f"vocab_size={vocab_size} is too small for the data in {data_dir}: its largest token id is "
            f"{max_token}, so vocab_size must be at least {max_token + 1}"
        )
    return vocab_size


def check_same_tokens(saved_meta, meta, data_dir, source):
    """A resume must read the token ids its checkpoint learned: the same tokenizer and, for characters,
    the same characters in the same order (a dataset of as many other characters would train on, and
    sample, other text with no error)."""
    if not saved_meta:
        return  # a checkpoint from before meta was saved: nothing to compare
    ours, theirs = saved_meta.get("tokenizer"), meta["tokenizer"]
    if ours != theirs:
        names = {"gpt2": "GPT-2 BPE", "char": "character"}
        difference = f"it was trained on {names.get(ours, ours)} tokens, {data_dir} holds {names.get(theirs, theirs)} ones"
    elif saved_meta.get("chars") != meta.get("chars"):
        a, b = saved_meta.get("chars") or "", meta.get("chars") or ""
        i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        difference = (f"its {len(a)} characters and the {len(b)} of {data_dir} differ from id {i} on "
                      f"({a[i:i + 8]!r} against {b[i:i + 8]!r}), so its ids would spell other text")
    else:
        return
    raise DataError(f"cannot resume from {source}: {difference}. Resume on the data it was trained on, or train "
                    f"on this data in another out_dir")
