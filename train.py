"""
Train a GPT whose attention is one of the four variants of arXiv 2403.01643.

Single process (laptop CPU, one GPU):
    python train.py config/train_shakespeare_char.py --attention=efficient --max_iters=3000
DDP, one node with 8 GPUs:
    torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py
DDP, two nodes (run on each, node_rank 0 on the master):
    torchrun --nnodes=2 --nproc_per_node=8 --node_rank=0 --master_addr=10.0.0.1 --master_port=29500 train.py config/train_gpt2.py
DDP with train.py as its own torchrun (the same options as --name=value), so that SIGINT/SIGTERM to
the launcher stops every process after a checkpoint and the launcher exits 0 (torchrun exits 1):
    python train.py --standalone --nproc_per_node=2 config/quickstart.py --gradient_accumulation_steps=2
FSDP2 (sharded parameters, gradients and AdamW state; distributed.py): the same lines with --parallelism=fsdp

Configuration works as in NanoGPT: the defaults below, then any config files named on the command
line (plain Python, executed in order), then `--key=value` overrides parsed as Python literals.
Unlike NanoGPT, an unknown key or a value of the wrong type stops with an error naming the key and
the expected type, and the whole pipeline is also a function, `train(config) -> summary`, so tests
and scripts can run it in-process.

What the run writes to out_dir (rank 0 only):
    ckpt.pt       model_args, model, optimizer, iter_num, best_val_loss, config, rng, meta; written
                  atomically, loadable with torch.load(weights_only=True), never with "_orig_mod."
    log.jsonl     one JSON object per logged iteration and per evaluation
    summary.json  parameters, FLOPs, final losses, speed, peak memory and wall time of the run
Under FSDP, ckpt.pt holds the gathered model without optimizer or rng, and the resume point is the
folder ckpt_sharded/ (every rank writes its shards; distributed.py).
"""

import ast
import gc
import json
import math
import os
import resource
import signal
import sys
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch

import torch.distributed as dist

from atomic import write_text_atomic
from checkpoint import (CHECKPOINT_NAME, LOG_NAME, SUMMARY_NAME, CheckpointError, first_non_finite, load_checkpoint,
                        load_weights, lock_out_dir, save_checkpoint)
import distributed
from model import GPT, PRETRAINED_GPT2, GPTConfig
from runtime import autocast_context, peak_flops, resolve_device, resolve_dtype
from tokenizer import TOKEN_DTYPE, char_fingerprint

# -----------------------------------------------------------------------------
# default config values: train a GPT-2 (124M) on OpenWebText, as NanoGPT does

MODEL_ARG_KEYS = tuple(f.name for f in fields(GPTConfig))  # what a checkpoint's model_args hold
MODEL_DEFAULTS = {f.name: f.default for f in fields(GPTConfig)} | dict(
    bias=False,  # no biases in Linear and LayerNorm layers: NanoGPT trains without them
    vocab_size=0,  # 0: from meta.json (GPT-2's 50257 padded up to 50304)
)
DEFAULT_CONFIG = dict(
    # I/O
    out_dir="out",
    eval_interval=2000,  # evaluate (and checkpoint) every this many iterations, and at the end
    log_interval=1,
    eval_iters=200,  # batches per split for each loss estimate
    eval_only=False,  # evaluate once and exit
    always_save_checkpoint=True,  # if False, checkpoint only when val loss improves (and on SIGINT/SIGTERM)
    init_from="scratch",  # 'scratch', 'resume' (from out_dir/ckpt.pt) or 'gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl'
    # logging
    wandb_log=False,
    wandb_project="owt",
    wandb_run_name="gpt2",
    # data
    dataset="openwebtext",
    data_dir="",  # '' means data/<dataset>; it holds train.bin, val.bin and meta.json
    gradient_accumulation_steps=5 * 8,  # global: split over DDP ranks
    batch_size=12,  # micro-batch size, sequences per forward pass per rank
    # model: every GPTConfig field (model.py says what each does), GPT-2 124M's shape by default
    **MODEL_DEFAULTS,
    # AdamW
    learning_rate=6e-4,
    max_iters=600000,  # total optimizer steps
    weight_decay=1e-1,
    beta1=0.9,
    beta2=0.95,
    grad_clip=1.0,  # clip gradients at this norm, 0 to disable
    # learning rate schedule: linear warmup, then cosine decay to min_lr
    decay_lr=True,
    warmup_iters=2000,
    lr_decay_iters=600000,  # usually max_iters
    min_lr=6e-5,  # usually learning_rate / 10
    # system
    backend="auto",  # DDP backend: 'auto' is nccl on GPU, gloo on CPU
    parallelism="ddp",  # under torchrun: 'ddp' (a full replica per rank) or 'fsdp' (FSDP2 shards, distributed.py)
    activation_checkpointing=False,  # recompute each block's activations in backward: less memory, ~1/3 more compute
    device="auto",  # 'auto' (cuda if available, else cpu), 'cpu', 'cuda', 'cuda:1', 'mps'
    dtype="auto",  # 'auto' (bfloat16 if supported, else float16 on GPU; float32 on CPU), 'float32', 'bfloat16', 'float16'
    compile=True,  # torch.compile the model (needs a C/C++ compiler on CPU)
    num_threads=0,  # torch intra-op threads per process, 0 keeps torch's default
    seed=1337,
    peak_flops="auto",  # MFU's denominator, FLOP/s: 'auto' is the GPU's dense bf16 peak (runtime.py); none on CPU
    # HellaSwag during training (needs eval_hellaswag.py and a GPT-2-tokenized model)
    hellaswag_interval=0,  # 0 = off
    hellaswag_file="",
    hellaswag_limit=0,  # 0 = all examples in the file
    hellaswag_batch_size=8,
)


class ConfigError(ValueError):
    """An unknown config key, a value of the wrong type, or a value out of range."""


class DataError(ValueError):
    """Training data that is missing, empty, too short, or does not fit the model."""


class LaunchError(RuntimeError):
    """A training process started by `python train.py --nproc_per_node=N ...` failed."""


class NonFiniteLossError(RuntimeError):
    """The loss or the weights became NaN or inf; the last good checkpoint is left as it was."""


# -----------------------------------------------------------------------------
# configuration

def _type_name(value):
    return type(value).__name__


def _unknown_key(key, defaults, where=""):
    import difflib

    close = difflib.get_close_matches(key, defaults, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ConfigError(f"unknown config key {key!r}{where}; {hint}known keys: {', '.join(sorted(defaults))}")


def check_value(key, value, defaults=DEFAULT_CONFIG):
    """Return value, coerced where lossless (an int where a float is expected), or raise ConfigError."""
    if key not in defaults:
        raise _unknown_key(key, defaults)
    expected = type(defaults[key])
    if expected is float and type(value) is int:
        return float(value)
    if key == "peak_flops" and type(value) in (int, float):
        return float(value)  # a number, or the default 'auto'
    if type(value) is not expected:
        raise ConfigError(
            f"config key {key!r} expects a value of type {expected.__name__}, "
            f"got {value!r} of type {_type_name(value)}"
        )
    return value


def parse_override(arg, defaults=DEFAULT_CONFIG):
    """Parse one `--key=value` argument; the value is a Python literal (strings may go unquoted)."""
    if "=" not in arg:
        raise ConfigError(f"cannot parse {arg!r}: write overrides as --key=value")
    key, raw = arg[2:].split("=", 1)
    if key not in defaults:
        raise _unknown_key(key, defaults, f" in {arg!r}")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw  # a bare word such as --attention=efficient
    if isinstance(defaults[key], str) and not isinstance(value, str):
        value = raw  # e.g. --wandb_run_name=2024 stays the string '2024'
    return key, check_value(key, value, defaults)


def read_config_file(path, defaults=DEFAULT_CONFIG):
    """Execute a plain-Python config file and return the settings it defines (names without a
    leading underscore that are not modules, functions or classes)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} not found")
    namespace = {}
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), namespace)
    settings = {}
    for key, value in namespace.items():
        if key.startswith("_") or callable(value) or type(value).__name__ == "module":
            continue
        try:
            settings[key] = check_value(key, value, defaults)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
    return settings


def get_config(argv, defaults=DEFAULT_CONFIG):
    """The effective config: defaults, then config files, then --key=value overrides, in order."""
    config = dict(defaults)
    for arg in argv:
        if arg.startswith("--"):
            key, value = parse_override(arg, defaults)
            config[key] = value
        else:
            config.update(read_config_file(arg, defaults))
    return config


def resolve_config(config):
    """Fill in defaults for keys not given, check every key and type, and check the values."""
    full = dict(DEFAULT_CONFIG)
    for key, value in config.items():
        full[key] = check_value(key, value)
    c = full

    def bad(key, problem):
        return ConfigError(f"config key {key!r}={c[key]!r}: {problem}")

    for key in ("batch_size", "block_size", "gradient_accumulation_steps", "log_interval", "eval_interval",
                "eval_iters", "n_layer", "n_head", "n_embd"):
        if c[key] < 1:
            raise bad(key, "must be at least 1")
    for key in ("max_iters", "warmup_iters", "lr_decay_iters", "num_threads", "hellaswag_interval",
                "hellaswag_limit", "vocab_size"):
        if c[key] < 0:
            raise bad(key, "must not be negative")
    for key in ("learning_rate", "min_lr", "weight_decay", "grad_clip"):
        if c[key] < 0 or not math.isfinite(c[key]):
            raise bad(key, "must be a finite non-negative number")
    if not (c["init_from"] in ("scratch", "resume") or c["init_from"] in PRETRAINED_GPT2):
        raise bad("init_from", f"choose 'scratch', 'resume' or one of {', '.join(PRETRAINED_GPT2)}")
    if c["init_from"] in PRETRAINED_GPT2 and c["attention"] != "standard":
        raise ConfigError(
            f"init_from={c['init_from']!r} loads OpenAI's GPT-2 weights, which exist for standard attention "
            f"only, not attention={c['attention']!r}: use init_from='scratch' for the {c['attention']} variant"
        )
    if c["peak_flops"] != "auto" and not (math.isfinite(c["peak_flops"]) and c["peak_flops"] > 0):
        raise bad("peak_flops", "must be 'auto' or a positive number of FLOP/s, e.g. 989e12")
    if c["dtype"] not in ("auto", "float32", "bfloat16", "float16"):
        raise bad("dtype", "choose 'auto', 'float32', 'bfloat16' or 'float16'")
    if c["backend"] not in ("auto", "nccl", "gloo"):
        raise bad("backend", "choose 'auto', 'nccl' or 'gloo'")
    if c["parallelism"] not in distributed.PARALLELISMS:
        raise bad("parallelism", f"choose {' or '.join(map(repr, distributed.PARALLELISMS))}")
    if c["parallelism"] == "fsdp" and c["dtype"] == "float16":
        raise bad("dtype", "FSDP trains in float32 or bfloat16 (no fp16 loss scaling of sharded gradients)")
    if c["parallelism"] == "fsdp" and c["hellaswag_interval"]:  # it runs on rank 0 alone, FSDP needs every rank
        raise bad("hellaswag_interval", "HellaSwag during FSDP training is not supported: set it to 0 and run "
                  "eval_hellaswag.py on the consolidated ckpt.pt")
    if c["decay_lr"] and c["lr_decay_iters"] <= c["warmup_iters"]:
        raise bad("lr_decay_iters", f"must exceed warmup_iters={c['warmup_iters']} when decay_lr is on")
    if c["hellaswag_interval"] and not c["hellaswag_file"]:
        raise bad("hellaswag_file", "hellaswag_interval is on, so name a HellaSwag jsonl file")
    # the model config validates attention, n_embd % n_head, dropout
    try:
        GPTConfig(**{k: c[k] for k in MODEL_ARG_KEYS if k != "vocab_size"})
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return c


def get_lr(it, c):
    """Linear warmup for warmup_iters steps, then cosine decay to min_lr at lr_decay_iters."""
    if not c["decay_lr"]:
        return c["learning_rate"]
    if it < c["warmup_iters"]:
        return c["learning_rate"] * (it + 1) / (c["warmup_iters"] + 1)
    if it > c["lr_decay_iters"]:
        return c["min_lr"]
    progress = (it - c["warmup_iters"]) / (c["lr_decay_iters"] - c["warmup_iters"])
    return c["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * progress)) * (c["learning_rate"] - c["min_lr"])


# -----------------------------------------------------------------------------
# data

def _token_file(data_dir, split):
    path = Path(data_dir) / f"{split}.bin"
    if not path.is_file():
        raise DataError(f"{path} not found: prepare the dataset first (e.g. python prepare_char.py)")
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


def check_data(data_dir, block_size):
    """Check train.bin, val.bin and meta.json before anything trains; return (meta, n_tokens, max_token)."""
    from tokenizer import read_meta

    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(f"data folder {data_dir} not found: prepare the dataset first (e.g. python prepare_char.py)")
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
        x, y = xy[:, :-1], xy[:, 1:]
        if self.device.startswith("cuda"):
            x = x.pin_memory().to(self.device, non_blocking=True)
            y = y.pin_memory().to(self.device, non_blocking=True)
        elif self.device != "cpu":
            x, y = x.to(self.device), y.to(self.device)
        return x, y


# -----------------------------------------------------------------------------
# helpers

def peak_memory_bytes(device):
    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, KiB on Linux


class _StopSignals:
    """Turn SIGINT/SIGTERM into a flag checked after each step (main thread only)."""

    def __init__(self):
        self.received = None
        self.previous = {}

    def __enter__(self):
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C stops at once
        self.received = signal.Signals(signum).name

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        return False


class _Log:
    """log.jsonl (and optionally wandb) on rank 0; a no-op elsewhere."""

    def __init__(self, out_dir, append, enabled, wandb_run=None):
        self.file = None
        self.wandb = wandb_run
        if enabled:
            self.file = open(Path(out_dir) / LOG_NAME, "a" if append else "w", encoding="utf-8", buffering=1)

    def write(self, record):
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
        if self.wandb is not None:
            kind = record["type"]
            self.wandb.log({f"{kind}/{k}": v for k, v in record.items() if k not in ("type", "iter")},
                           step=record["iter"])

    def close(self):
        if self.file is not None:
            self.file.close()


def trim_log(path, last_iter):
    """Drop from log.jsonl the records past `last_iter` (what a stopped or killed run logged after
    the checkpoint that is resumed from) and lines torn by a kill; return how many were dropped."""
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            keep = json.loads(line)["iter"] <= last_iter
        except (ValueError, KeyError, TypeError):
            keep = False
        if keep:
            kept.append(line + "\n")
        else:
            dropped += 1
    if dropped:
        write_text_atomic(path, "".join(kept))
    return dropped


# -----------------------------------------------------------------------------
# the training run: set-up (checked before anything trains), then one Run object that the pieces
# below (estimate_loss, save, evaluate, train_step, the loop, the summary) read and advance

def setup_distributed():
    """(ddp, rank, local_rank, world_size). Under torchrun (RANK set) the DDP path is taken even with
    one process, as NanoGPT does."""
    if int(os.environ.get("RANK", -1)) == -1:
        return False, 0, 0, 1
    return True, int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])


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


def check_fsdp(run):
    """What FSDP needs beyond resolve_config's checks, once the world size and the dtype are known."""
    if run.dtype == "float16":
        raise ConfigError(f"dtype={run.c['dtype']!r} resolves to float16 on {run.device}, which FSDP does not "
                          f"train in: set dtype='bfloat16' or 'float32'")
    if run.c["eval_iters"] % run.world_size:  # every rank must run as many sharded forward passes
        raise ConfigError(f"config key 'eval_iters'={run.c['eval_iters']} must be divisible by the number of "
                          f"FSDP processes ({run.world_size})")


def load_resume_checkpoint(out_dir, model_args, sharded=False):
    """The checkpoint to resume from, after checking that it trains the model requested. sharded (an
    FSDP run): the training state of out_dir/ckpt_sharded, whose shards build_optimizer loads."""
    checkpoint = distributed.load_train_state(out_dir) if sharded else load_checkpoint(out_dir, map_location="cpu")
    if not sharded and "sharded" in checkpoint:
        raise CheckpointError(f"{out_dir / CHECKPOINT_NAME} is the export of an FSDP run, whose optimizer state is in "
                              f"{out_dir / checkpoint['sharded']}: resume it with parallelism='fsdp' under torchrun")
    saved = checkpoint["model_args"]
    mismatched = {k: (saved.get(k), v) for k, v in model_args.items() if saved.get(k) != v}
    if mismatched:
        details = ", ".join(f"{k}: checkpoint {a!r}, requested {b!r}" for k, (a, b) in mismatched.items())
        raise CheckpointError(
            f"cannot resume from {out_dir / CHECKPOINT_NAME}: its model args differ from the requested ones "
            f"({details}). Use the config the checkpoint was trained with, or another out_dir"
        )
    for key in ("iter_num", "rng") if sharded else ("optimizer", "iter_num", "rng"):
        if key not in checkpoint:
            raise CheckpointError(f"cannot resume from {out_dir / CHECKPOINT_NAME}: it has no {key!r} (not a training checkpoint)")
    return checkpoint


def train(config, verbose=True):
    """Run one training as configured (a dict of DEFAULT_CONFIG keys; missing keys take their
    defaults) and return the summary dict that is also written to out_dir/summary.json."""
    wall_start = time.time()
    c = resolve_config(config)
    ddp, rank, local_rank, world_size = setup_distributed()
    if ddp:
        distributed.stop_with_launcher()
    device = resolve_device(c["device"])
    if ddp and device.startswith("cuda"):
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    if c["gradient_accumulation_steps"] % world_size:
        raise ConfigError(
            f"config key 'gradient_accumulation_steps'={c['gradient_accumulation_steps']} must be divisible by "
            f"the number of DDP processes ({world_size}): the steps are split over them"
        )
    out_dir = Path(c["out_dir"])
    data_dir = Path(c["data_dir"] or os.path.join("data", c["dataset"]))

    # everything that can be wrong is checked before any training starts
    meta, n_tokens, max_token = check_data(data_dir, c["block_size"])
    model_args = {key: c[key] for key in MODEL_ARG_KEYS} | {"vocab_size": choose_vocab_size(c, meta, max_token, data_dir)}
    sharded = ddp and c["parallelism"] == "fsdp"
    checkpoint = load_resume_checkpoint(out_dir, model_args, sharded) if c["init_from"] == "resume" else None

    run = Run(c=c, ddp=ddp, rank=rank, world_size=world_size, device=device, dtype=resolve_dtype(c["dtype"], device),
              out_dir=out_dir, data_dir=data_dir, meta=meta, model_args=model_args, verbose=verbose,
              wall_start=wall_start)
    # from here on a SIGINT/SIGTERM stops the run after a step and a checkpoint, even one that
    # arrives while the process group or the model is being set up, or while they are torn down
    with _StopSignals() as signals:
        if ddp:
            init_distributed(c["backend"] if c["backend"] != "auto" else ("nccl" if run.device_type == "cuda" else "gloo"))
        try:
            run.announce(n_tokens)
            run.build(checkpoint)
            summary = training_loop(run, signals)
            if ddp:
                dist.barrier()  # no rank tears down its connections while another still uses them
            return summary
        finally:
            if getattr(run, "out_dir_lock", None):
                run.out_dir_lock.close()
            if ddp:
                teardown_distributed(run)


def init_distributed(backend):
    """Create the default process group, importing torch._dynamo first. DDP imports it anyway, and
    with it torch.distributed.nn.functional, whose functions take `group=group.WORLD` as a default
    argument: imported after the group exists, those defaults hold the group for the life of the
    process, destroy_process_group cannot free it, and gloo's threads still run while the
    interpreter shuts down ("terminate called without an active exception", now and then, at exit)."""
    import torch._dynamo  # noqa: F401

    dist.init_process_group(backend=backend)


def teardown_distributed(run):
    """Free the process group now, while the interpreter is whole: drop what the run holds (DDP's
    reducer and FSDP's sharded parameters hold the group), collect whatever cycle may still hold
    it, then destroy it, which joins gloo's threads."""
    vars(run).clear()
    gc.collect()
    dist.destroy_process_group()


class Run:
    """What one training run holds and advances: the config, where it runs, the model and optimizer,
    the batches and their generator, the iteration, the best loss and the log."""

    def __init__(self, c, ddp, rank, world_size, device, dtype, out_dir, data_dir, meta, model_args, verbose,
                 wall_start):
        self.c, self.ddp, self.rank, self.world_size = c, ddp, rank, world_size
        self.master = rank == 0
        self.device, self.dtype = device, dtype
        self.device_type = torch.device(device).type
        self.out_dir, self.data_dir, self.meta, self.model_args = out_dir, data_dir, meta, model_args
        self.verbose, self.wall_start = verbose, wall_start
        self.accum = c["gradient_accumulation_steps"] // world_size  # micro-steps per rank per iteration
        self.tokens_per_iter = c["gradient_accumulation_steps"] * c["batch_size"] * c["block_size"]
        self.iter_num, self.start_iter, self.best_val_loss = 0, 0, 1e9
        self.evaluated_at_start = False  # whether the checkpoint resumed from was written after its evaluation
        self.last_losses = {"train": None, "val": None}
        self.step_times, self.n_steps, self.stop_reason = [], 0, "max_iters"

    def say(self, *args):
        if self.verbose and self.master:
            print(*args, flush=True)

    def announce(self, n_tokens):
        c = self.c
        if c["num_threads"]:
            torch.set_num_threads(c["num_threads"])
        self.say("config:")
        for key in sorted(c):
            self.say(f"  {key} = {c[key]!r}")
        self.say(f"device {self.device}, dtype {self.dtype}, {self.world_size} process(es), {self.accum} micro-step(s) "
                 f"per process, {self.tokens_per_iter:,} tokens per iteration; data {self.data_dir}: "
                 f"{n_tokens['train']:,} train / {n_tokens['val']:,} val tokens "
                 f"({self.meta['tokenizer']}, vocab {self.meta['vocab_size']})")
        if self.master:
            self.out_dir_lock = lock_out_dir(self.out_dir)  # released when the run ends, or its process dies
            for stale in self.out_dir.glob(CHECKPOINT_NAME + ".*.tmp"):  # left by a crash while saving
                stale.unlink(missing_ok=True)

    def build(self, checkpoint):
        """Model, optimizer, batches, RNG state (from the checkpoint when resuming), loggers."""
        self.build_model(checkpoint)
        self.build_optimizer(checkpoint)
        c = self.c
        self.train_batches = Batches(self.data_dir / "train.bin", c["block_size"], c["batch_size"], self.device)
        self.val_batches = Batches(self.data_dir / "val.bin", c["block_size"], c["batch_size"], self.device)
        self.generator = torch.Generator().manual_seed(c["seed"])
        if checkpoint is not None:
            self.restore(checkpoint)
        self.start_iter = self.iter_num
        # On CPU, small evaluation batches waste time in small matmuls: evaluate up to ~16K tokens per
        # forward pass instead (the same sequences, so the same mean loss up to float rounding). On GPU,
        # and with compile (fixed shapes), one batch per forward pass as in training.
        self.eval_group = 1
        if self.device_type == "cpu" and not c["compile"]:
            self.eval_group = max(1, 16384 // (c["batch_size"] * c["block_size"]))
        self.open_logs()

    def build_model(self, checkpoint):
        """The same initialisation on every rank, then per-rank dropout streams."""
        c = self.c
        self.fsdp = self.ddp and c["parallelism"] == "fsdp"
        if self.fsdp:
            check_fsdp(self)
        torch.manual_seed(c["seed"])
        if c["init_from"] in PRETRAINED_GPT2:
            model = GPT.from_pretrained(c["init_from"], dict(dropout=c["dropout"], attention=c["attention"]))
            if c["block_size"] < model.config.block_size:
                model.crop_block_size(c["block_size"])
            self.model_args = {k: getattr(model.config, k) for k in MODEL_ARG_KEYS}
        else:
            model = GPT(GPTConfig(**self.model_args))
        if checkpoint is not None and not self.fsdp:  # FSDP loads its shards in build_optimizer
            load_weights(model, checkpoint["model"], self.out_dir / CHECKPOINT_NAME)
        self.raw_model = model.to(self.device)  # under FSDP, sharded in place
        torch.manual_seed(c["seed"] + self.rank)
        # compile, then DDP or FSDP; evaluation runs without DDP's hooks
        self.model, self.eval_model = distributed.wrap_model(model, c, self.ddp, self.device, self.dtype, self.say)

    def build_optimizer(self, checkpoint):
        c = self.c
        self.autocast = autocast_context(self.device, self.dtype)
        self.peak = peak_flops(c["peak_flops"], self.device)  # None: no MFU (CPU, or a GPU without a known peak)
        if self.peak is None and self.device_type == "cuda":
            self.say(f"note: no MFU: {torch.cuda.get_device_name(self.device)} is not in runtime.PEAK_BF16_FLOPS; "
                     f"set peak_flops")
        self.scaler = torch.amp.GradScaler(self.device_type, enabled=(self.dtype == "float16"))
        self.optimizer = self.raw_model.configure_optimizers(
            c["weight_decay"], c["learning_rate"], (c["beta1"], c["beta2"]), self.device_type)
        if checkpoint is not None and self.fsdp:  # the model and optimizer shards, into the sharded model
            distributed.load_sharded(self.raw_model, self.optimizer, checkpoint["sharded_dir"])
        elif checkpoint is not None:
            try:
                self.optimizer.load_state_dict(checkpoint["optimizer"])
            except (ValueError, KeyError, TypeError, IndexError) as e:
                raise CheckpointError(f"the optimizer state in {self.out_dir / CHECKPOINT_NAME} does not fit the "
                                      f"model ({type(e).__name__}: {e}): it was not written by this train.py") from None
            if "scaler" in checkpoint and self.scaler.is_enabled():
                self.scaler.load_state_dict(checkpoint["scaler"])

    def restore(self, checkpoint):
        self.iter_num, self.best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
        # checkpoints from before the flag were taken as evaluated, as they were then
        self.evaluated_at_start = checkpoint.get("evaluated", True)
        rng, rank = checkpoint["rng"], self.rank
        self.generator.set_state(rng["batches"])
        torch.set_rng_state(rng["torch"][rank] if rank < len(rng["torch"]) else rng["torch"][0])
        if self.device_type == "cuda" and rng.get("cuda"):
            states = rng["cuda"]
            torch.cuda.set_rng_state(states[rank] if rank < len(states) else states[0], self.device)
        self.say(f"resuming from {self.out_dir / CHECKPOINT_NAME} at iteration {self.iter_num} "
                 f"(best val loss {self.best_val_loss:.4f})")

    def open_logs(self):
        """log.jsonl and wandb on rank 0, and the HellaSwag examples if asked for."""
        c = self.c
        self.wandb_run = None
        if c["wandb_log"] and self.master:
            import wandb

            self.wandb_run = wandb.init(project=c["wandb_project"], name=c["wandb_run_name"], config=dict(c),
                                        resume="allow" if c["init_from"] == "resume" else None)
        resuming = c["init_from"] == "resume"
        if resuming and self.master:
            dropped = trim_log(self.out_dir / LOG_NAME, self.start_iter)
            if dropped:
                self.say(f"dropped {dropped} record(s) past iteration {self.start_iter} from {LOG_NAME}: "
                         f"steps after the checkpoint, which this run does again")
        self.log = _Log(self.out_dir, append=resuming, enabled=self.master, wandb_run=self.wandb_run)
        self.hellaswag = None
        if c["hellaswag_interval"] and self.master:
            self.hellaswag = load_hellaswag(c, self.meta, self.say)

    def elapsed(self):
        return time.time() - self.wall_start


def load_hellaswag(c, meta, say):
    """(eval_hellaswag module, examples, tokenizer), or None, saying why, when HellaSwag cannot run."""
    try:
        import eval_hellaswag
        from tokenizer import tokenizer_from_meta

        examples = eval_hellaswag.load_examples(c["hellaswag_file"], c["hellaswag_limit"] or None)
        return eval_hellaswag, examples, tokenizer_from_meta(meta)
    except Exception as e:  # a missing module, file or tokenizer: training goes on without HellaSwag
        say(f"warning: HellaSwag evaluation is off, and training goes on without it: {type(e).__name__}: {e}")
        return None


@torch.no_grad()  # not inference_mode: FSDP2 reuses the buffers it gathers parameters into, and
def estimate_loss(run):  # inference tensors cannot be written outside inference mode
    """Mean loss over eval_iters batches per split. The batches are the same at every evaluation
    (their own generator, seeded fresh), so successive estimates are comparable and evaluation
    never disturbs the training RNG. Under DDP the batches are shared out between the ranks."""
    out = {}
    run.model.eval()
    for split, batches in (("train", run.train_batches), ("val", run.val_batches)):
        g = torch.Generator().manual_seed(run.c["seed"] + 1)
        ix = batches.offsets(run.c["eval_iters"], g)[run.rank::run.world_size]  # this rank's share
        total = torch.zeros(2, dtype=torch.float64, device=run.device)
        for k in range(0, len(ix), run.eval_group):
            group = ix[k:k + run.eval_group]
            x, y = batches.get(group.reshape(-1))
            with run.autocast:
                _, loss = run.eval_model(x, y)
            total[0] += loss.double() * len(group)  # a mean over len(group) equal batches
            total[1] += len(group)
        if run.ddp:
            dist.all_reduce(total)
        out[split] = (total[0] / total[1]).item()
    run.model.train()
    return out


def rng_state(run):
    state = {"batches": run.generator.get_state(), "torch": [torch.get_rng_state()]}
    if run.device_type == "cuda":
        state["cuda"] = [torch.cuda.get_rng_state(run.device)]
    if run.ddp:  # every rank's dropout stream, so that a DDP resume is exact too
        gathered = [None] * run.world_size
        dist.all_gather_object(gathered, {k: v for k, v in state.items() if k != "batches"})
        state["torch"] = [g["torch"][0] for g in gathered]
        if run.device_type == "cuda":
            state["cuda"] = [g["cuda"][0] for g in gathered]
    return state


def diverged(run, what):
    """The error for a run whose loss or weights are no longer finite: nothing more is saved."""
    path = run.out_dir / CHECKPOINT_NAME
    kept = (f"the last good checkpoint {path} is kept as it was" if path.exists()
            else f"no checkpoint was written to {run.out_dir}")
    return NonFiniteLossError(f"{what} at iteration {run.iter_num}; stopping, and {kept}. Lower learning_rate, "
                              f"raise warmup_iters or lower grad_clip, then resume or restart")


def save(run, reason, evaluated):
    """Write the checkpoint (rank 0). `evaluated`: whether the evaluation of this iteration is done,
    so that a resume from it neither skips nor repeats that evaluation."""
    state = {"model": run.raw_model.state_dict(),  # the uncompiled module: no "_orig_mod." prefix
             "optimizer": run.optimizer.state_dict()}
    bad = first_non_finite(state)  # on every rank, before the collective below, so that all stop together
    if bad is not None:
        raise diverged(run, f"{bad} holds NaN or inf values (not saving the {reason} checkpoint)")
    rng = rng_state(run)  # a collective under DDP: every rank calls save()
    if run.fsdp:  # collectives: every rank writes its shards, then the whole model is gathered on rank 0
        distributed.write_shards(run.raw_model, run.optimizer, run.out_dir)
        state = {"model": distributed.full_model_state(run.raw_model), "sharded": distributed.SHARDED_NAME}
    if not run.master:
        return
    ckpt = {
        "model_args": run.model_args,
        **state,
        "iter_num": run.iter_num,
        "evaluated": evaluated,
        "best_val_loss": run.best_val_loss,
        "config": dict(run.c),
        "rng": rng,
        "meta": run.meta,
    }
    if run.scaler.is_enabled():
        ckpt["scaler"] = run.scaler.state_dict()
    t = time.time()
    if run.fsdp:  # the shards become the resume point, with the training state beside them; ckpt.pt follows
        distributed.commit_shards(run.out_dir, {k: v for k, v in ckpt.items() if k != "model"})
    save_checkpoint(ckpt, run.out_dir / CHECKPOINT_NAME)
    run.say(f"saved checkpoint to {run.out_dir / CHECKPOINT_NAME} at iteration {run.iter_num} "
            f"({reason}, {time.time() - t:.2f}s)")


def run_hellaswag(run):
    module, examples, tok = run.hellaswag
    run.raw_model.eval()
    try:
        with run.autocast:
            result = module.evaluate(run.raw_model, examples, tok, run.device, run.c["hellaswag_batch_size"])
    finally:
        run.raw_model.train()
    run.log.write({"type": "hellaswag", "iter": run.iter_num, **result, "elapsed_s": run.elapsed()})
    run.say(f"iter {run.iter_num}: hellaswag " + ", ".join(
        f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items()))


def evaluate(run):
    """Estimate the losses, log them, and save a checkpoint (always, or when val loss improved)."""
    losses = estimate_loss(run)
    if not all(map(math.isfinite, losses.values())):
        raise diverged(run, f"the evaluated losses became train {losses['train']}, val {losses['val']}")
    run.last_losses.update(losses)
    run.say(f"step {run.iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    run.log.write({"type": "eval", "iter": run.iter_num, "train_loss": losses["train"], "val_loss": losses["val"],
                   "elapsed_s": run.elapsed()})
    improved = losses["val"] < run.best_val_loss
    if improved:
        run.best_val_loss = losses["val"]
    if run.iter_num > run.start_iter and (improved or run.c["always_save_checkpoint"]):
        save(run, "evaluation", evaluated=True)


def train_step(run, signals):
    """One optimizer step over this rank's micro-batches; returns (mean loss over all ranks, lr,
    whether any rank was signalled to stop)."""
    c, accum = run.c, run.accum
    lr = get_lr(run.iter_num, c)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    ix = run.train_batches.offsets(c["gradient_accumulation_steps"], run.generator)[run.rank * accum:(run.rank + 1) * accum]
    loss_sum = torch.zeros((), dtype=torch.float32, device=run.device)
    for micro in range(accum):
        x, y = run.train_batches.get(ix[micro])
        # under DDP or FSDP, synchronise gradients only on the last micro-step
        with distributed.gradient_sync(run.model, micro == accum - 1):
            with run.autocast:
                _, loss = run.model(x, y)
            loss_sum += loss.detach().float()
            run.scaler.scale(loss / accum).backward()
    # one small collective per step: the mean loss over all ranks, and whether any rank was signalled
    flags = torch.stack([loss_sum / accum, torch.tensor(float(signals.received is not None), device=run.device)])
    if run.ddp:
        dist.all_reduce(flags)
        flags[0] /= run.world_size
    loss_value, stop_flag = flags.tolist()
    if not math.isfinite(loss_value):
        raise diverged(run, f"the training loss became {loss_value}")
    if c["grad_clip"]:
        run.scaler.unscale_(run.optimizer)
        torch.nn.utils.clip_grad_norm_(run.raw_model.parameters(), c["grad_clip"])
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
    run.iter_num += 1
    run.n_steps += 1
    return loss_value, lr, bool(stop_flag)


def log_step(run, loss_value, lr, dt):
    mfu = None if run.peak is None else run.raw_model.estimate_mfu(run.c["batch_size"] * run.accum, dt, run.peak)
    tokens_per_s = run.tokens_per_iter / dt
    run.say(f"iter {run.iter_num}: loss {loss_value:.4f}, lr {lr:.2e}, {dt * 1000:.2f} ms/iter, "
            f"{tokens_per_s:,.0f} tokens/s" + ("" if mfu is None else f", mfu {mfu * 100:.2f}%"))
    run.log.write({"type": "train", "iter": run.iter_num, "loss": loss_value, "lr": lr, "ms_per_iter": dt * 1000,
                   "tokens_per_s": tokens_per_s, "mfu": mfu, "elapsed_s": run.elapsed()})


def training_loop(run, signals):
    """Evaluate every eval_interval iterations and at the end, step, log; stop at max_iters or on a
    signal (after saving). Returns the summary."""
    c = run.c
    run.model.train()
    try:
        if c["eval_only"]:
            evaluate(run)
            run.stop_reason = "eval_only"
        while not c["eval_only"]:
            # a resume does not repeat the evaluation its checkpoint was written after; a signal's
            # checkpoint comes before its iteration's evaluation, so that one still runs
            resumed_here = run.iter_num == run.start_iter and run.evaluated_at_start
            if (run.iter_num % c["eval_interval"] == 0 or run.iter_num >= c["max_iters"]) and not resumed_here:
                evaluate(run)
            if (run.hellaswag and run.iter_num % c["hellaswag_interval"] == 0 and run.iter_num > 0
                    and not resumed_here):
                run_hellaswag(run)
            if run.iter_num >= c["max_iters"]:
                break
            t0 = time.time()
            loss_value, lr, stop = train_step(run, signals)
            dt = time.time() - t0
            run.step_times.append(dt)
            if run.iter_num % c["log_interval"] == 0 or run.iter_num == c["max_iters"]:
                log_step(run, loss_value, lr, dt)
            if stop:
                run.stop_reason = signals.received or "signal on another rank"
                run.say(f"received {run.stop_reason}: saving a checkpoint at iteration {run.iter_num} and stopping")
                save(run, run.stop_reason, evaluated=False)  # the next iteration's evaluation is to come
                break
    finally:
        run.log.close()
    return write_summary(run)


def write_summary(run):
    timed = run.step_times[1:] if len(run.step_times) > 1 else run.step_times  # the first pays for warm-up / compile
    mean_dt = sum(timed) / len(timed) if timed else None
    model = run.raw_model.eval()
    summary = {
        "attention": run.model_args["attention"],
        "model_args": run.model_args,
        "n_params": model.get_num_params(non_embedding=False),
        "n_params_non_embedding": model.get_num_params(non_embedding=True),
        "attention_params": model.get_num_attention_params(),
        "flops_per_token": model.flops_per_token(),
        "final_train_loss": run.last_losses["train"],
        "final_val_loss": run.last_losses["val"],
        "best_val_loss": run.best_val_loss if run.best_val_loss < 1e9 else None,
        "iterations": run.iter_num,
        "iterations_this_run": run.n_steps,
        "stop_reason": run.stop_reason,
        "mean_ms_per_iter": mean_dt * 1000 if mean_dt else None,
        "tokens_per_s": run.tokens_per_iter / mean_dt if mean_dt else None,
        "tokens_per_iter": run.tokens_per_iter,
        "peak_memory_bytes": peak_memory_bytes(run.device),
        "wall_time_s": run.elapsed(),
        "device": run.device,
        "dtype": run.dtype,
        "world_size": run.world_size,
        "compile": run.c["compile"],
        "num_threads": torch.get_num_threads(),
        "out_dir": str(run.out_dir),
        "dataset": str(run.data_dir),
    }
    if run.master:
        write_text_atomic(run.out_dir / SUMMARY_NAME, json.dumps(summary, indent=2) + "\n")
        final = summary["final_val_loss"]
        run.say(f"done: {run.n_steps} iterations in {summary['wall_time_s']:.1f}s, final val loss "
                f"{final if final is None else round(final, 4)}")
    if run.wandb_run is not None:
        run.wandb_run.finish()
    return summary


# -----------------------------------------------------------------------------
# python train.py --standalone --nproc_per_node=N ...: torchrun in this process, clean on signals

def split_launcher_args(argv):
    """(torchrun's options, train.py's arguments) of one command line, or None when it holds no
    option torchrun knows. Launcher options are written --name=value (or a bare flag), as config
    overrides are, so that no value is taken for a config file."""
    from torch.distributed.run import get_args_parser

    options = get_args_parser()._option_string_actions  # argparse has no public list of its options
    launcher = [a for a in argv if a.startswith("--") and a.split("=", 1)[0] in options and a != "--help"]
    for arg in launcher:
        if "=" not in arg and options[arg].nargs != 0:
            raise ConfigError(f"write the launcher option {arg} with its value, as {arg}=VALUE")
    return (launcher, [a for a in argv if a not in launcher]) if launcher else None


def child_pids(parent):
    """The pids of the processes whose parent is `parent` (Linux /proc): for the launcher, the
    training processes torch's elastic agent started."""
    pids = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = stat_file.read_text().rsplit(")", 1)[1].split()[1]  # after "pid (name) state"
        except (OSError, IndexError):
            continue  # the process ended meanwhile
        if ppid == str(parent):
            pids.append(int(stat_file.parent.name))
    return pids


def _pass_signal_to_workers(signum, frame):
    pids = child_pids(os.getpid())
    if not pids:  # no training process yet: nothing to save, stop at once
        raise SystemExit(128 + signum)
    print(f"launcher: received {signal.Signals(signum).name}, passing it to the {len(pids)} training process(es)",
          file=sys.stderr, flush=True)
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def launch(launcher_args, train_args):
    """Run train.py under torch's elastic agent, the launcher torchrun runs, in this process, with
    one difference: SIGINT and SIGTERM are passed to the training processes, which finish their
    step, save and exit 0, and then the launcher exits 0 too. torchrun itself turns a signal it
    receives into a SignalException, a traceback and exit status 1, whatever the workers did."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser
    from torch.distributed.run import main as torchrun_main

    # torch's agent would install its own handlers for these; /proc is how the workers are found
    if "--signals-to-handle" in get_args_parser()._option_string_actions and Path("/proc/self/stat").exists():
        launcher_args = [*launcher_args, "--signals-to-handle=SIGHUP,SIGQUIT"]
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _pass_signal_to_workers)
    try:
        torchrun_main([*launcher_args, str(Path(__file__).resolve()), *train_args])
    except ChildFailedError as e:
        codes = ", ".join(f"rank {rank} exit code {f.exitcode}" for rank, f in sorted(e.failures.items()))
        raise LaunchError(f"a training process failed ({codes}); its messages are above") from None
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        print("config keys and defaults:")
        for key, value in DEFAULT_CONFIG.items():
            print(f"  --{key}={value!r}")
        return 0
    try:
        launcher = split_launcher_args(argv)
        if launcher:
            return launch(*launcher)
        config = get_config(argv)
        train(config)
    except (ConfigError, DataError, CheckpointError, NonFiniteLossError, LaunchError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
