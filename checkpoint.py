"""
Everything a training run keeps in its out_dir, and how it comes back:

    ckpt.pt        model_args, model (state_dict without torch.compile's "_orig_mod."), optimizer,
                   iter_num, evaluated, best_val_loss, config, rng, meta (the dataset's meta.json:
                   the tokenizer travels along), run_id, totals (runlog.run_totals), scaler (fp16)
    ckpt_sharded/  an FSDP run's resume point: model and optimizer shards (torch.distributed.
                   checkpoint) and train_state.pt; its ckpt.pt then holds the gathered model only
    train.lock     held by the live run, so that a second run on the same out_dir stops at once

Every file is written atomically (atomic.py), never holding NaN or inf, and read with
torch.load(weights_only=True). load_model_and_tokenizer reads NanoGPT's checkpoints too.
"""

import argparse
import fcntl
import os
import pickle
import shutil
import zipfile
from dataclasses import fields
from pathlib import Path

import torch
import torch.distributed as dist

from atomic import atomic_file, sync_folder
from data import check_same_tokens, config_data_dir
from model import GPT, PRETRAINED_GPT2, GPTConfig
from runtime import DTYPES
from tokenizer import (META_FILENAME, NANOGPT_META_FILENAME, GPT2Tokenizer, read_meta,
                       read_nanogpt_meta, tokenizer_from_meta)

CHECKPOINT_NAME = "ckpt.pt"
LOG_NAME = "log.jsonl"
SUMMARY_NAME = "summary.json"
LOCK_NAME = "train.lock"
SHARDED_NAME = "ckpt_sharded"
TRAIN_STATE_NAME = "train_state.pt"  # inside ckpt_sharded/, written last: the folder is complete
COMPILED_PREFIX = "_orig_mod."


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, unreadable, or does not fit what was asked of it."""


def lock_out_dir(out_dir):
    """Claim out_dir for one run: a lock on train.lock, held until the returned file is closed or
    the process ends (even by SIGKILL), so that a second run stops before it writes."""
    path = Path(out_dir) / LOCK_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = open(path, "a+", encoding="utf-8")
    try:
        fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.seek(0)
        holder = lock.read().strip() or "unknown"
        lock.close()
        raise CheckpointError(f"{out_dir} is in use by another training run (PID {holder}): "
                              f"wait for it, or choose another out_dir") from None
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock


def holds_checkpoint(out_dir):
    return (Path(out_dir) / CHECKPOINT_NAME).exists() or newest_shards(out_dir) is not None


def first_non_finite(checkpoint):
    """The name of the first model or optimizer state tensor holding NaN or inf, else None."""
    named = list(checkpoint.get("model", {}).items())
    for index, state in (checkpoint.get("optimizer") or {}).get("state", {}).items():
        named += [(f"optimizer state {index} {key}", value) for key, value in state.items()]
    for name, value in named:
        local = value.to_local() if hasattr(value, "to_local") else value  # FSDP: this rank's
        if torch.is_tensor(local) and local.is_floating_point() and not torch.isfinite(local).all():
            return name
    return None


def save_checkpoint(checkpoint, path):
    """Write atomically (never a torn file); NaN or inf is refused, so the last good one stays."""
    bad = first_non_finite(checkpoint)
    if bad is not None:
        raise CheckpointError(f"refusing to write {path}: {bad} holds NaN or inf values")
    with atomic_file(path, "wb") as f:
        torch.save(checkpoint, f)


def existing_checkpoint_path(path):
    """The checkpoint file, given it or the out_dir holding ckpt.pt; a CheckpointError if none."""
    path = Path(path)
    path = path / CHECKPOINT_NAME if path.is_dir() else path
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}: "
                              f"pass a training run's out_dir or its ckpt.pt")
    return path


def read_checkpoint_file(path, map_location="cpu"):
    """torch.load(weights_only=True), with one line saying what is wrong with a file not ours."""
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"cannot read checkpoint {path}: it is not a torch.save archive "
                              f"(a truncated copy, or another kind of file)")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(f"cannot read checkpoint {path}: it holds Python objects besides "
                              f"tensors and plain data, which could run arbitrary code") from None
    except Exception as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}") from None


def load_checkpoint(path, map_location="cpu"):
    """A checkpoint of this repo (the file, or the out_dir holding ckpt.pt), checked to be one."""
    path = existing_checkpoint_path(path)
    checkpoint = read_checkpoint_file(path, map_location)
    if not (isinstance(checkpoint, dict) and isinstance(checkpoint.get("model_args"), dict)
            and isinstance(checkpoint.get("model"), dict)):
        raise CheckpointError(f"{path} is not a checkpoint of this repo: "
                              f"it lacks model_args or model")
    # NanoGPT's own checkpoints (no attention variant in their model_args) have the exact GELU
    if "attention" not in checkpoint["model_args"]:
        checkpoint["model_args"].setdefault("gelu_approximate", "none")
    for field in fields(GPTConfig):  # options added later default to what the model was before them
        checkpoint["model_args"].setdefault(field.name, field.default)
    return checkpoint


def load_weights(model, state_dict, where):
    """Load a state dict into model, or raise one CheckpointError line saying what does not fit."""
    state_dict = {k.removeprefix(COMPILED_PREFIX): v for k, v in state_dict.items()}
    try:
        model.load_state_dict(state_dict)
    except (RuntimeError, TypeError, AttributeError) as e:
        problem = " ".join(str(e).split())[:300]
        raise CheckpointError(f"the weights in {where} do not fit the model: {problem}") from None


def model_from_checkpoint(checkpoint, device="cpu"):
    """The GPT a checkpoint describes, weights loaded, on device, in eval mode."""
    model = GPT(GPTConfig(**checkpoint["model_args"]))
    load_weights(model, checkpoint["model"], "the checkpoint")
    return model.to(device).eval()


def load_resume_checkpoint(out_dir, model_args, sharded=False, data=None):
    """The checkpoint to resume from ("source": its file or folder), checked to train the model
    requested (its model_args are the ones to build) on the same tokens (data: (meta, data_dir)).
    sharded (FSDP): the newest complete shard folder's train state; load_sharded reads shards."""
    out_dir = Path(out_dir)
    if sharded:
        checkpoint = load_train_state(out_dir)
    else:
        if not (out_dir / CHECKPOINT_NAME).is_file():
            raise CheckpointError(f"no checkpoint at {out_dir / CHECKPOINT_NAME} to resume: start "
                                  f"the run with init_from='scratch', or set out_dir to the run's "
                                  f"folder")
        checkpoint = load_checkpoint(out_dir)
        checkpoint["source"] = out_dir / CHECKPOINT_NAME
        if "sharded" in checkpoint:
            raise CheckpointError(f"{checkpoint['source']} is an FSDP run's export: resume it with "
                                  f"parallelism='fsdp' under torchrun")
    source = checkpoint["source"]
    if data is not None:
        check_same_tokens(checkpoint.get("meta"), *data, source)
    saved = checkpoint["model_args"]
    if (checkpoint.get("config") or {}).get("init_from") in PRETRAINED_GPT2:
        # fine-tuned from OpenAI's weights: their shape, with the config's attention and context
        model_args = {**saved, **{k: model_args[k] for k in ("attention", "block_size")}}
    differ = ", ".join(f"{k} {saved.get(k)!r} in the checkpoint, {v!r} asked"
                       for k, v in model_args.items() if saved.get(k) != v and k != "dropout")
    if differ:
        raise CheckpointError(f"cannot resume from {source}: the model differs ({differ})")
    if "rng" not in checkpoint or not (sharded or "optimizer" in checkpoint):
        raise CheckpointError(f"cannot resume from {source}: it is not a training checkpoint "
                              f"of this repo (one NanoGPT wrote samples and scores, but does "
                              f"not resume)")
    return checkpoint


# -----------------------------------------------------------------------------
# an FSDP run's sharded checkpoint: written as ckpt_sharded.tmp, renamed into place once
# train_state.pt, written last, marks it complete. A kill at any moment, even during the next save,
# leaves the newest complete folder under one of three names: settle_shards puts it back in place.

def _folders(out_dir):
    out_dir = Path(out_dir)
    return out_dir / SHARDED_NAME, out_dir / f"{SHARDED_NAME}.tmp", out_dir / f"{SHARDED_NAME}.old"


def write_shards(model, optimizer, out_dir):
    """Every rank writes its model and optimizer shards into ckpt_sharded.tmp (a collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    if dist.get_rank() == 0:  # a complete folder a kill left elsewhere goes in place first
        settle_shards(out_dir)
    dist.barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state},
             checkpoint_id=str(_folders(out_dir)[1]))


def commit_shards(out_dir, train_state):
    """Rank 0, after write_shards: train_state.pt completes the folder, now the checkpoint."""
    tmp = _folders(out_dir)[1]
    save_checkpoint(train_state, tmp / TRAIN_STATE_NAME)
    settle_shards(out_dir, newest=tmp)


def settle_shards(out_dir, newest=None):
    """Rename the newest complete folder to ckpt_sharded and remove the others (the previous one
    moves aside to ckpt_sharded.old first: a folder cannot be renamed over another)."""
    final, tmp, old = _folders(out_dir)
    newest = newest or newest_shards(out_dir)
    if newest == tmp:
        if final.exists():
            _remove(old)
            os.replace(final, old)
        os.replace(tmp, final)
    elif newest == old:
        _remove(final)  # older, or incomplete
        os.replace(old, final)
    sync_folder(out_dir)
    _remove(tmp)
    _remove(old)


def _remove(folder):
    """The marker first: a folder half deleted is never taken for complete."""
    (folder / TRAIN_STATE_NAME).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)


def newest_shards(out_dir):
    """The complete shard folder with the highest iteration, or None; on a tie the last written."""
    final, tmp, old = _folders(out_dir)
    complete = []
    for order, folder in enumerate((old, final, tmp)):
        if (folder / TRAIN_STATE_NAME).is_file():
            iter_num = read_checkpoint_file(folder / TRAIN_STATE_NAME)["iter_num"]
            complete.append((iter_num, order, folder))
    return max(complete)[2] if complete else None


def load_train_state(out_dir):
    """train_state.pt of the newest complete shard folder, with "source" naming the folder."""
    folder = newest_shards(out_dir)
    if folder is None:
        raise CheckpointError(f"no sharded checkpoint at {_folders(out_dir)[0]} to resume an FSDP "
                              f"run from (a run without FSDP resumes with parallelism='ddp')")
    state = read_checkpoint_file(folder / TRAIN_STATE_NAME)
    state["source"] = folder
    return state


def full_model_state(model):
    """The unsharded model state dict, gathered to rank 0 on CPU ({} elsewhere): a collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def load_sharded(model, optimizer, folder):
    """Load a shard folder into the sharded model and optimizer (a collective); any world size."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    try:
        dcp.load(state, checkpoint_id=str(folder))
    except (Exception, CheckpointException) as e:  # on every rank when one cannot read its part
        raise CheckpointError(f"the sharded checkpoint {folder} is damaged ({type(e).__name__}): "
                              f"restore it from a copy, or start again with "
                              f"init_from='scratch'") from None
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])


# -----------------------------------------------------------------------------
# a trained model and its tokenizer, for sample.py, eval_hellaswag.py and compare.py

def checkpoint_meta(checkpoint):
    """A checkpoint's "meta", else meta.json (or NanoGPT's meta.pkl) in its config's data folder."""
    if checkpoint.get("meta"):
        return checkpoint["meta"]
    config = checkpoint.get("config") or {}
    if not (config.get("data_dir") or config.get("dataset")):
        return None
    data_dir = Path(config_data_dir({key: config.get(key) for key in ("data_dir", "dataset")}))
    if (data_dir / META_FILENAME).is_file():
        return read_meta(data_dir)
    if (data_dir / NANOGPT_META_FILENAME).is_file():
        return read_nanogpt_meta(data_dir)
    return None


def add_model_arguments(parser):
    """The options of sample.py and eval_hellaswag.py: which weights, and where and how they run."""
    parser.add_argument("--init_from", default="resume",
                        help=f"'resume' (the checkpoint in --out_dir) or "
                             f"{', '.join(PRETRAINED_GPT2)}")
    parser.add_argument("--out_dir", default="out", help="a training out_dir, or a checkpoint file")
    parser.add_argument("--device", default="auto",
                        help="auto (cuda if available, else cpu), cpu, cuda:1...")
    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                        help="auto: bfloat16 (float16 on older GPUs) on a GPU, float32 on CPU")
    parser.add_argument("--threads", type=thread_count, default=0,
                        help="torch threads on CPU (0 = the cores other processes leave free)")


def thread_count(text):
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 (follow the free cores) "
                                         f"or a number of threads")
    return int(text)


def load_model_and_tokenizer(init_from="resume", out_dir="out", device="cpu"):
    """(model in eval mode on device, tokenizer, description) of a checkpoint or GPT-2's weights."""
    if init_from in PRETRAINED_GPT2:
        model = GPT.from_pretrained(init_from, dict(dropout=0.0)).to(device).eval()
        return model, GPT2Tokenizer(), {"init_from": init_from, "attention": "standard",
                                        "tokenizer": "gpt2"}
    if init_from != "resume":
        raise ValueError(f"init_from={init_from!r}: use 'resume' or one of "
                         f"{', '.join(PRETRAINED_GPT2)}")
    checkpoint = load_checkpoint(out_dir, map_location=device)
    try:
        model = model_from_checkpoint(checkpoint, device)
    except (TypeError, ValueError) as e:  # model_args GPTConfig refuses
        raise CheckpointError(f"checkpoint {out_dir} does not describe a model: {e}") from None
    bad = first_non_finite({"model": checkpoint["model"]})
    if bad is not None:
        raise CheckpointError(f"checkpoint {out_dir}: its weight {bad} holds NaN or inf values, "
                              f"which train.py never saves, so the file is damaged")
    meta = checkpoint_meta(checkpoint)
    if meta is None:  # a NanoGPT checkpoint of OpenWebText: GPT-2's BPE, if the vocabulary fits
        if model.config.vocab_size < 50257:
            raise CheckpointError(f"checkpoint {out_dir} names no tokenizer and is too small for "
                                  f"GPT-2's: put its dataset's meta.json where its config's "
                                  f"data_dir points")
        meta = {"tokenizer": "gpt2", "vocab_size": 50257, "tokens": {"train": 0, "val": 0}}
    tokenizer = tokenizer_from_meta(meta)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise CheckpointError(f"checkpoint {out_dir}: the tokenizer has {tokenizer.vocab_size} "
                              f"tokens, the model {model.config.vocab_size}: its meta.json is "
                              f"another dataset's")
    return model, tokenizer, {"init_from": "resume", "checkpoint": str(out_dir),
                              "attention": model.config.attention, "tokenizer": tokenizer.kind,
                              "iter_num": checkpoint.get("iter_num")}
