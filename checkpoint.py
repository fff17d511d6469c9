"""
Checkpoints: written atomically, read with torch.load(weights_only=True), turned back into a GPT
with its tokenizer (load_model_and_tokenizer: what sample.py, eval_hellaswag.py and compare.py load).

A checkpoint is a dict of plain data and tensors:
    model_args      GPTConfig fields, the attention variant among them
    model           the model's state_dict (never with torch.compile's "_orig_mod." prefix)
    optimizer       the optimizer's state_dict (training checkpoints only; an FSDP run's export holds
                    "sharded" instead, the folder of its shards)
    iter_num, best_val_loss, config, rng, meta (the dataset's meta.json, so the tokenizer travels along)
    evaluated       whether iter_num's evaluation is done, so that a resume neither skips nor repeats it
    run_id          kept across resumes: ties the run's summary.json to its checkpoint
    totals          the run's wall time, timed steps and peak memory up to this save (runlog.run_totals)
    scaler          the GradScaler's state (float16 training only)
A checkpoint NanoGPT's train.py wrote loads for sampling and scoring too (its model_args are a subset).
"""

import argparse
import fcntl
import os
import pickle
import sys
import zipfile
from dataclasses import fields
from pathlib import Path

import torch

from atomic import atomic_file, why_not_writable
from configurator import MODEL_ARG_KEYS
from data import check_same_tokens, config_data_dir
from model import GPT, PRETRAINED_GPT2, GPTConfig
from runtime import DTYPES
from tokenizer import (META_FILENAME, NANOGPT_META_FILENAME, GPT2Tokenizer, read_meta, read_nanogpt_meta,
                       tokenizer_from_meta)

CHECKPOINT_NAME = "ckpt.pt"
LOG_NAME = "log.jsonl"  # beside the checkpoint: one JSON record per logged step, evaluation, HellaSwag run
SUMMARY_NAME = "summary.json"  # written at the end of a run: its losses, speed, memory and sizes
COMPILED_PREFIX = "_orig_mod."
LOCK_NAME = "train.lock"  # held by the training run that writes the out_dir


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, unreadable, or does not fit what was asked of it."""


class OutDirInUse(CheckpointError):
    def __init__(self, out_dir, holder):
        super().__init__(f"{out_dir} is in use by another training run (PID {holder}): wait for it to finish "
                         f"or stop it, or choose another out_dir")


class NonFiniteCheckpointError(CheckpointError):
    """A checkpoint about to be written holds NaN or inf: it is refused, so the last good one stays."""


def checkpoint_path(path):
    """Accept a checkpoint file or the folder (out_dir) that holds ckpt.pt."""
    path = Path(path)
    return path / CHECKPOINT_NAME if path.is_dir() else path


def lock_out_dir(out_dir):
    """Claim out_dir for one training run: an advisory lock on out_dir/train.lock, held until the
    returned file is closed or the process ends (the kernel releases it even after a SIGKILL), so
    that a second run on a live out_dir stops before it writes anything. A POSIX lock (lockf) is
    per process: a child process that a fork makes does not inherit it."""
    path = Path(out_dir) / LOCK_NAME
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path, "a+", encoding="utf-8")
    except OSError as e:  # a file of that name, a read-only place, no such parent
        raise CheckpointError(f"out_dir {out_dir} cannot be used as a folder for the run: "
                              f"{why_not_writable(path.parent, e)}") from None
    holder = _holder_if_locked(lock)
    if holder is not None:
        lock.close()
        raise OutDirInUse(out_dir, holder)
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock


def check_out_dir_free(out_dir):
    """OutDirInUse if a live training run holds out_dir's lock; nothing is created or claimed. Where a
    resume cannot read the checkpoint, this names the real cause if a live run is saving it."""
    try:
        lock = open(Path(out_dir) / LOCK_NAME, "r+", encoding="utf-8")
    except OSError:  # no lock file: no run has held this folder
        return
    with lock:  # closing it drops the probe's lock, if it got one
        holder = _holder_if_locked(lock)
    if holder is not None:
        raise OutDirInUse(out_dir, holder)


def _holder_if_locked(lock):
    """The PID another process wrote into the lock file it holds, or None after taking the lock here."""
    try:
        fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return None
    except OSError:
        lock.seek(0)
        return lock.read().strip() or "unknown"


# without torchrun, parallelism='fsdp' is one plain process, which has no shards to load
RESUME_SHARDS = ("resume it with parallelism='fsdp' under torchrun: `python train.py --standalone --nproc_per_node=N` "
                 "and the same config and overrides (any N, 1 included)")


def load_resume_checkpoint(out_dir, model_args, sharded=False, data=None):
    """The checkpoint to resume from, after checking that it trains the model requested (its
    model_args are the ones to build); its "source" is the file or folder it was read from.
    sharded (an FSDP run): the training state of the sharded checkpoint, whose shards build_run loads.
    data, (meta, data_dir): what the resume reads, checked first to be the tokens the checkpoint
    learned (data prepared again from other text changes the vocabulary: the data's doing, not the model's)."""
    import distributed  # which imports this module

    if sharded:
        checkpoint = distributed.load_train_state(out_dir)
        checkpoint["source"] = checkpoint["sharded_dir"]
    else:
        if not (out_dir / CHECKPOINT_NAME).is_file():
            if distributed.newest_shards(out_dir) is not None:  # an FSDP run killed before its ckpt.pt
                raise CheckpointError(f"no {CHECKPOINT_NAME} in {out_dir}, but an FSDP run's sharded checkpoint: "
                                      f"{RESUME_SHARDS}")
            raise CheckpointError(f"no checkpoint at {out_dir / CHECKPOINT_NAME}: init_from='resume' continues the "
                                  f"run whose out_dir this is; start it first (init_from='scratch'), or set out_dir "
                                  f"to that run's folder")
        checkpoint = load_checkpoint(out_dir, map_location="cpu")
        checkpoint["source"] = out_dir / CHECKPOINT_NAME
        if "sharded" in checkpoint:
            raise CheckpointError(f"{checkpoint['source']} is the export of an FSDP run, whose optimizer state is "
                                  f"in {out_dir / checkpoint['sharded']}: {RESUME_SHARDS}")
    if data is not None:
        check_same_tokens(checkpoint.get("meta"), *data, checkpoint["source"])
    saved = checkpoint["model_args"]
    if (checkpoint.get("config") or {}).get("init_from") in PRETRAINED_GPT2:
        # fine-tuned from OpenAI's weights: the model has their shape, not the config's, except for
        # what the config chose for it
        model_args = {**saved, **{k: model_args[k] for k in ("attention", "block_size")}}
    # dropout may change, as in NanoGPT: no weight depends on it
    mismatched = {k: (saved.get(k), v) for k, v in model_args.items() if saved.get(k) != v and k != "dropout"}
    if mismatched:
        details = ", ".join(f"{k}: checkpoint {a!r}, requested {b!r}" for k, (a, b) in mismatched.items())
        raise CheckpointError(f"cannot resume from {checkpoint['source']}: its model args differ from the requested "
                              f"ones ({details})")
    for key in ("iter_num", "rng") if sharded else ("optimizer", "iter_num", "rng"):
        if key not in checkpoint:
            raise CheckpointError(f"cannot resume from {checkpoint['source']}: it has no {key!r}, so it is not a "
                                  f"training checkpoint of this repo (one NanoGPT wrote samples and scores here, "
                                  f"but does not resume)")
    return checkpoint


def resume_hint(out_dir, c):
    """For a resume that failed on its data or model: the overrides that give the data and model
    keys of the config the checkpoint was trained with ("" when there is none to read)."""
    if c["init_from"] != "resume":
        return ""
    try:
        saved = load_checkpoint(out_dir)["config"]
    except (CheckpointError, KeyError):
        return ""
    keys = ("dataset", "data_dir", *MODEL_ARG_KEYS)
    differ = [f"--{k}={saved[k]!r}" for k in keys if k in saved and saved[k] != c[k]]
    if not differ:
        return ""
    return (f". The checkpoint in {out_dir} was trained with another config; give its config file and overrides "
            f"again, e.g. these keys differ: {' '.join(differ)}")


def strip_compiled_prefix(state_dict):
    return {k.removeprefix(COMPILED_PREFIX): v for k, v in state_dict.items()}


def first_non_finite(checkpoint):
    """The name of the first tensor of the model or optimizer state holding NaN or inf, else None."""
    named = list(checkpoint.get("model", {}).items())
    for index, state in (checkpoint.get("optimizer") or {}).get("state", {}).items():
        named += [(f"optimizer state {index} {key}", value) for key, value in state.items()]
    for name, value in named:
        local = value.to_local() if hasattr(value, "to_local") else value  # an FSDP shard: this rank's part
        if torch.is_tensor(local) and local.is_floating_point() and not torch.isfinite(local).all():
            return name
    return None


def save_checkpoint(checkpoint, path):
    """Write to a temporary file in the same folder, flush it to disk, then rename over `path`:
    a crash at any moment leaves either the old checkpoint or the new one, never a torn file.
    A checkpoint whose weights or optimizer state hold NaN or inf is never written
    (NonFiniteCheckpointError): resuming from it could only fail again."""
    path = Path(path)
    bad = first_non_finite(checkpoint)
    if bad is not None:
        raise NonFiniteCheckpointError(f"refusing to write {path}: {bad} holds NaN or inf values")
    with atomic_file(path, "wb") as f:  # the umask's permissions, like every other output of a run
        torch.save(checkpoint, f)


def existing_checkpoint_path(path):
    """checkpoint_path(path), or a CheckpointError if no file is there: a check before slow work."""
    path = checkpoint_path(path)
    if not path.is_file():
        raise CheckpointError(
            f"no checkpoint at {path}: pass the out_dir of a training run (it holds {CHECKPOINT_NAME}) or the file itself"
        )
    return path


def load_checkpoint(path, map_location="cpu", mmap=False):
    """A checkpoint of this repo (the file, or the out_dir holding ckpt.pt), checked to be one. mmap:
    its tensors are mapped from the file, not read, for a caller that wants a few plain entries only."""
    path = existing_checkpoint_path(path)
    checkpoint = read_checkpoint_file(path, map_location, mmap)
    missing = {"model_args", "model"} - set(checkpoint) if isinstance(checkpoint, dict) else {"model_args", "model"}
    if missing:
        raise CheckpointError(f"{path} is not a checkpoint of this repo: it lacks {sorted(missing)}")
    if not isinstance(checkpoint["model_args"], dict):
        raise CheckpointError(f"{path} is not a checkpoint of this repo: its model_args is not a dict")
    # this repo's checkpoints from before the option had GPT-2's tanh GELU; NanoGPT's own (no attention
    # variant in their model_args) the exact one
    checkpoint["model_args"].setdefault("gelu_approximate", "tanh" if "attention" in checkpoint["model_args"] else "none")
    for field in fields(GPTConfig):  # options added later default to what the model was before them
        checkpoint["model_args"].setdefault(field.name, field.default)
    return checkpoint


def read_checkpoint_file(path, map_location="cpu", mmap=False):
    """torch.load(weights_only=True), with messages that say what the file is instead of torch's
    (whose advice to pass weights_only=False would run any code a pickle holds). The one reader of
    every file a run writes with save_checkpoint: ckpt.pt and the sharded checkpoint's train_state.pt."""
    not_ours = f"cannot read checkpoint {path}: it is not a checkpoint of this repo"
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"{not_ours}: it is not a torch.save archive (a truncated copy, or another kind of file)")
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:
        raise CheckpointError(f"{not_ours}: it holds Python objects besides tensors and plain data, and loading "
                              f"those could run arbitrary code") from None
    except Exception as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}") from e


def load_weights(model, state_dict, where):
    """Load a checkpoint's state dict into `model`, or raise CheckpointError saying which keys
    or shapes do not fit (torch's message lists every key over many lines)."""
    if not (isinstance(state_dict, dict) and all(isinstance(k, str) for k in state_dict)):
        raise CheckpointError(f"{where} is not a checkpoint of this repo: its 'model' entry is not a state dict")
    state_dict = strip_compiled_prefix(state_dict)
    expected = model.state_dict()
    problems = []
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    shapes = [f"{k} {tuple(state_dict[k].shape)} instead of {tuple(v.shape)}" for k, v in expected.items()
              if torch.is_tensor(state_dict.get(k)) and state_dict[k].shape != v.shape]
    for label, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", shapes)):
        if items:
            more = f" and {len(items) - 3} more" if len(items) > 3 else ""
            problems.append(f"{label}: {', '.join(items[:3])}{more}")
    if problems:
        raise CheckpointError(f"the weights in {where} do not fit the model its model_args describe "
                              f"({'; '.join(problems)}): it was not written by this version of train.py")
    try:
        model.load_state_dict(state_dict)
    except (RuntimeError, TypeError, AttributeError) as e:  # e.g. an entry that is not a tensor
        raise CheckpointError(f"the weights in {where} do not load: {str(e).splitlines()[0]}") from None


def model_from_checkpoint(checkpoint, device="cpu"):
    """The GPT a checkpoint describes, weights loaded, on `device`, in eval mode."""
    model = GPT(GPTConfig(**checkpoint["model_args"]))
    model.load_state_dict(strip_compiled_prefix(checkpoint["model"]))
    return model.to(device).eval()


def checkpoint_meta(checkpoint):
    """The dataset meta dict of a checkpoint: its "meta" entry, else the meta.json of the dataset folder
    its training config names (data_dir, or NanoGPT's data/<dataset>), or NanoGPT's meta.pkl there
    (a checkpoint NanoGPT trained), else None (the caller decides what that means)."""
    meta = checkpoint.get("meta")
    if meta:
        return meta
    config = checkpoint.get("config") or {}
    if config.get("data_dir") or config.get("dataset"):
        data_dir = config_data_dir({"data_dir": config.get("data_dir"), "dataset": config.get("dataset")})
        for candidate in (Path(data_dir), Path(__file__).resolve().parent / data_dir):
            if (candidate / META_FILENAME).is_file():
                return read_meta(candidate)
            if (candidate / NANOGPT_META_FILENAME).is_file():
                return read_nanogpt_meta(candidate)
    return None


def add_model_arguments(parser):
    """The options of the scripts that run a trained model (sample.py, eval_hellaswag.py): which weights
    load_model_and_tokenizer loads, and the device, dtype and CPU threads they run with."""
    parser.add_argument("--init_from", default="resume",
                        help=f"'resume' (the checkpoint in --out_dir) or {', '.join(PRETRAINED_GPT2)}")
    parser.add_argument("--out_dir", default="out", help="training out_dir holding ckpt.pt, or a checkpoint file")
    parser.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:1, mps")
    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                        help="auto: bfloat16 on a GPU that computes it natively, float16 on an older GPU, "
                        "float32 on CPU")
    parser.add_argument("--threads", type=thread_count, default=0,
                        help="torch threads on CPU (0 = the cores other processes leave free)")


def thread_count(text):
    """argparse type of --threads: 0 (follow the free cores) or a positive count."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 (the cores other processes leave free) or a number "
                                         f"of threads")
    return int(text)


def load_model_and_tokenizer(init_from="resume", out_dir="out", device="cpu"):
    """(model in eval mode on device, tokenizer, description dict) for a checkpoint folder/file
    (init_from="resume") or pretrained GPT-2 weights (init_from="gpt2", "gpt2-medium", ...).

    Raises CheckpointError, TokenizerUnavailableError, ValueError (an unknown init_from) or
    model.PretrainedUnavailableError (no GPT-2 weights here), each with a message meant for the user."""
    if init_from in PRETRAINED_GPT2:
        model = GPT.from_pretrained(init_from, dict(dropout=0.0)).to(device).eval()
        tokenizer = GPT2Tokenizer()
        return model, tokenizer, {"init_from": init_from, "attention": "standard", "tokenizer": "gpt2"}
    if init_from != "resume":
        raise ValueError(f"init_from={init_from!r}: use 'resume' (a checkpoint in --out_dir) or one of {', '.join(PRETRAINED_GPT2)}")

    checkpoint = load_checkpoint(out_dir, map_location=device)
    try:
        model = model_from_checkpoint(checkpoint, device)
    except (TypeError, ValueError, RuntimeError) as e:  # bad model_args or a state_dict that does not fit
        raise CheckpointError(f"checkpoint {out_dir} cannot be turned into a model: {type(e).__name__}: {e}") from e
    bad = first_non_finite({"model": checkpoint["model"]})
    if bad is not None:
        raise CheckpointError(f"checkpoint {out_dir}: its weight {bad} holds NaN or inf values, which train.py never "
                              f"saves, so the file is damaged: use a copy of it, or another checkpoint")
    try:
        meta = checkpoint_meta(checkpoint)
    except (ValueError, FileNotFoundError) as e:
        raise CheckpointError(f"checkpoint {out_dir}: its dataset's tokenizer metadata is unusable: {e}") from e
    if meta is None:
        if model.config.vocab_size < 50257:
            raise CheckpointError(
                f"checkpoint {out_dir} carries no tokenizer metadata (no 'meta' entry, and no meta.json or "
                f"NanoGPT's meta.pkl in config['data_dir'] or data/<config['dataset']>), and its "
                f"vocab_size={model.config.vocab_size} is too small for GPT-2 BPE: put the dataset's meta.json "
                f"where config['data_dir'] points"
            )
        print(f"note: {out_dir} has no tokenizer metadata; assuming GPT-2 BPE (vocab_size={model.config.vocab_size})",
              file=sys.stderr)
        meta = {"tokenizer": "gpt2", "vocab_size": 50257, "tokens": {"train": 0, "val": 0}}
    try:
        tokenizer = tokenizer_from_meta(meta)
    except ValueError as e:
        raise CheckpointError(f"checkpoint {out_dir}: bad tokenizer metadata: {e}") from e
    if tokenizer.vocab_size > model.config.vocab_size:
        raise CheckpointError(
            f"checkpoint {out_dir}: the tokenizer has {tokenizer.vocab_size} tokens but the model only "
            f"{model.config.vocab_size}: the meta.json is not the one this model was trained with"
        )
    return model, tokenizer, {
        "init_from": "resume", "checkpoint": str(out_dir), "attention": model.config.attention,
        "tokenizer": tokenizer.kind, "iter_num": checkpoint.get("iter_num"),
    }
