"""
Checkpoints: written atomically, read with torch.load(weights_only=True), turned back into a GPT.

A checkpoint is a dict of plain data and tensors:
    model_args      GPTConfig fields, the attention variant among them
    model           the model's state_dict (never with torch.compile's "_orig_mod." prefix)
    optimizer       the optimizer's state_dict (training checkpoints only)
    iter_num, best_val_loss, config, rng, meta (the dataset's meta.json, so the tokenizer travels along)
"""

import os
import tempfile
from dataclasses import fields
from pathlib import Path

import torch

from model import GPT, GPTConfig

CHECKPOINT_NAME = "ckpt.pt"
LOG_NAME = "log.jsonl"  # beside the checkpoint: one JSON record per logged step, evaluation, HellaSwag run
SUMMARY_NAME = "summary.json"  # written at the end of a run: its losses, speed, memory and sizes
COMPILED_PREFIX = "_orig_mod."


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, unreadable, or does not fit what was asked of it."""


def checkpoint_path(path):
    """Accept a checkpoint file or the folder (out_dir) that holds ckpt.pt."""
    path = Path(path)
    return path / CHECKPOINT_NAME if path.is_dir() else path


def strip_compiled_prefix(state_dict):
    return {k.removeprefix(COMPILED_PREFIX): v for k, v in state_dict.items()}


def save_checkpoint(checkpoint, path):
    """Write to a temporary file in the same folder, flush it to disk, then rename over `path`:
    a crash at any moment leaves either the old checkpoint or the new one, never a torn file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def load_checkpoint(path, map_location="cpu"):
    path = checkpoint_path(path)
    if not path.is_file():
        raise CheckpointError(
            f"no checkpoint at {path}: pass the out_dir of a training run (it holds {CHECKPOINT_NAME}) or the file itself"
        )
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}") from e
    missing = {"model_args", "model"} - set(checkpoint) if isinstance(checkpoint, dict) else {"model_args", "model"}
    if missing:
        raise CheckpointError(f"{path} is not a checkpoint of this repo: it lacks {sorted(missing)}")
    if not isinstance(checkpoint["model_args"], dict):
        raise CheckpointError(f"{path} is not a checkpoint of this repo: its model_args is not a dict")
    checkpoint["model_args"].setdefault("gelu_approximate", "tanh")  # the only GELU before the option existed
    for field in fields(GPTConfig):  # options added later default to what the model was before them
        checkpoint["model_args"].setdefault(field.name, field.default)
    return checkpoint


def model_from_checkpoint(checkpoint, device="cpu"):
    """The GPT a checkpoint describes, weights loaded, on `device`, in eval mode."""
    model = GPT(GPTConfig(**checkpoint["model_args"]))
    model.load_state_dict(strip_compiled_prefix(checkpoint["model"]))
    return model.to(device).eval()
