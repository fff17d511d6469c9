"""
Training configuration, as in NanoGPT: the defaults below, then config files (plain Python, run
where the config so far is defined), then `--key=value` overrides parsed as Python literals. An
unknown key or a wrong type is one error line; resolve_config checks the values before training.
The model's keys default to model.GPTConfig's, except bias (False) and vocab_size (0: meta.json).
"""

import ast
import difflib
import importlib.util
import math
from dataclasses import fields
from pathlib import Path
from typing import NamedTuple

from model import (ATTENTION_CLASSES, GPT2_CONTEXT, MLPS, NORMS, POSITIONS, PRETRAINED_GPT2,
                   GPTConfig, check_pretrained_attention)
from runtime import DTYPES, resolve_device_and_dtype


class ConfigError(ValueError):
    """An unknown config key, a value of the wrong type, or a value out of range."""


class Setting(NamedTuple):
    default: object
    meaning: str
    choices: tuple = ()


MODEL_ARG_KEYS = tuple(f.name for f in fields(GPTConfig))  # what a checkpoint's model_args hold
_MODEL = {f.name: f.default for f in fields(GPTConfig)}

SETTINGS = {  # what `python train.py --help` prints; the defaults train GPT-2 124M on OpenWebText
    # I/O
    "out_dir": Setting("out", "folder for ckpt.pt, log.jsonl and summary.json"),
    "eval_interval": Setting(2000, "evaluate (and save) every this many steps, and at the end"),
    "log_interval": Setting(1, "print and log the training loss every this many iterations"),
    "eval_iters": Setting(200, "batches per split for each loss estimate"),
    "eval_only": Setting(False, "evaluate init_from's model once and exit, writing nothing"),
    "always_save_checkpoint": Setting(True, "checkpoint at every evaluation; False: only when val "
                                            "loss improves (and on SIGINT/SIGTERM)"),
    "save_checkpoints": Setting(True, "False: write no checkpoint at all (throughput runs)"),
    "init_from": Setting("scratch", "'resume' continues out_dir's checkpoint (give the same config "
                                    "again); 'gpt2*' starts from OpenAI's weights",
                         ("scratch", "resume", *PRETRAINED_GPT2)),
    # logging
    "wandb_log": Setting(False, "also log to Weights & Biases (pip install wandb)"),
    "wandb_project": Setting("owt", "wandb project name"),
    "wandb_run_name": Setting("gpt2", "wandb run name"),
    # data
    "dataset": Setting("openwebtext", "data/<dataset> (prepare_char.py, prepare_openwebtext.py)"),
    "data_dir": Setting("", "the data folder (train.bin, val.bin, meta.json); '' = data/<dataset>"),
    "gradient_accumulation_steps": Setting(5 * 8, "micro-batches per step, over all processes"),
    "batch_size": Setting(12, "sequences per micro-batch (per process)"),
    # model: the GPTConfig fields, GPT-2 124M's shape
    "block_size": Setting(_MODEL["block_size"], "context in tokens (super's W^A is block_size^2)"),
    "vocab_size": Setting(0, "0: from meta.json (GPT-2's 50257 padded up to 50304)"),
    "n_layer": Setting(_MODEL["n_layer"], "transformer blocks"),
    "n_head": Setting(_MODEL["n_head"], "attention heads; must divide n_embd"),
    "n_embd": Setting(_MODEL["n_embd"], "model width d"),
    "dropout": Setting(_MODEL["dropout"], "dropout probability, in [0, 1)"),
    "bias": Setting(False, "Linear and norm biases (GPT-2 has them; NanoGPT trains without)"),
    "attention": Setting(_MODEL["attention"], "the attention variant (README: the four variants)",
                         tuple(ATTENTION_CLASSES)),  # the paper's four, and any added in model.py
    "gelu_approximate": Setting(_MODEL["gelu_approximate"], "exact, or GPT-2's tanh approximation",
                                ("none", "tanh")),
    "norm": Setting(_MODEL["norm"], "LayerNorm (GPT-2) or RMSNorm (Llama)", NORMS),
    "pos": Setting(_MODEL["pos"], "learned position table (GPT-2) or RoPE (Llama)", POSITIONS),
    "rope_theta": Setting(_MODEL["rope_theta"], "RoPE's base, with pos='rope'"),
    "mlp": Setting(_MODEL["mlp"], "4x GELU (GPT-2) or SwiGLU (Llama; set intermediate_size)", MLPS),
    "intermediate_size": Setting(_MODEL["intermediate_size"], "MLP hidden width; 0 = 4 * n_embd"),
    "tie_embeddings": Setting(_MODEL["tie_embeddings"], "the head shares the token embedding"),
    "n_kv_head": Setting(_MODEL["n_kv_head"], "key/value heads of standard attention; 0 = n_head"),
    # AdamW
    "learning_rate": Setting(6e-4, "peak learning rate"),
    "max_iters": Setting(600000, "optimizer steps in total"),
    "weight_decay": Setting(1e-1, "AdamW weight decay of matrices and embeddings"),
    "beta1": Setting(0.9, "AdamW beta1"),
    "beta2": Setting(0.95, "AdamW beta2"),
    "grad_clip": Setting(1.0, "clip gradients at this global norm; 0 disables"),
    # learning rate schedule: train.get_lr
    "decay_lr": Setting(True, "warmup and cosine decay; False: a constant learning_rate"),
    "warmup_iters": Setting(2000, "linear warmup steps (at most lr_decay_iters - 1 are taken)"),
    "lr_decay_iters": Setting(600000, "the step where the cosine hits min_lr; usually max_iters"),
    "min_lr": Setting(6e-5, "the final learning rate; usually learning_rate / 10"),
    # system
    "backend": Setting("auto", "DDP backend; 'auto' is nccl on GPU, gloo on CPU",
                       ("auto", "nccl", "gloo")),
    "parallelism": Setting("ddp", "under torchrun: a full replica per process, or FSDP2 shards",
                           ("ddp", "fsdp")),
    "activation_checkpointing": Setting(False, "recompute each block's activations in backward"),
    "device": Setting("auto", "'auto' (cuda if available, else cpu), 'cpu', 'cuda:1', 'mps'"),
    "dtype": Setting("auto", "'auto': bfloat16 (else float16) on GPU, float32 on CPU",
                     ("auto", *DTYPES)),
    "compile": Setting(True, "torch.compile the model (needs a C/C++ compiler on CPU)"),
    "num_threads": Setting(0, "torch threads per process on CPU; 0: follow the free cores"),
    "seed": Setting(1337, "seed of the initialisation, the batches and dropout"),
    "peak_flops": Setting("auto", "FLOP/s for MFU; 'auto': the GPU's bf16 peak, none on CPU"),
    # HellaSwag during training (needs a GPT-2-tokenized model)
    "hellaswag_interval": Setting(0, "score HellaSwag every this many iterations; 0 = off"),
    "hellaswag_file": Setting("", "the HellaSwag jsonl file (docs/hellaswag.md)"),
    "hellaswag_limit": Setting(0, "examples to score; 0 = all in the file"),
    "hellaswag_batch_size": Setting(8, "examples per forward pass"),
}
DEFAULT_CONFIG = {key: setting.default for key, setting in SETTINGS.items()}
NUMBER_OR_WORD = {"peak_flops"}  # keys that take a number, though their default is a word ('auto')


def help_text():
    lines = []
    for key, (default, meaning, choices) in SETTINGS.items():
        options = f" [{' | '.join(choices)}]" if choices else ""
        lines.append(f"  --{key}={default!r}\n      {meaning}{options}")
    return "\n".join(lines)


def unknown_key(key, where=""):
    close = difflib.get_close_matches(key, DEFAULT_CONFIG, n=1)
    return ConfigError(f"unknown config key {key!r}{where}"
                       + (f"; did you mean {close[0]!r}?" if close else ""))


def check_value(key, value):
    """Return value, coerced where lossless (an int where a float is expected), or ConfigError."""
    if key not in DEFAULT_CONFIG:
        raise unknown_key(key)
    expected = type(DEFAULT_CONFIG[key])
    if (expected is float or key in NUMBER_OR_WORD) and type(value) in (int, float):
        return float(value)
    if type(value) is not expected:
        raise ConfigError(f"config key {key!r} expects a {expected.__name__}, got {value!r}")
    return value


def parse_override(arg):
    """Parse one `--key=value` argument; the value is a Python literal (strings may go unquoted)."""
    if "=" not in arg:
        raise ConfigError(f"cannot parse {arg!r}: write overrides as --key=value")
    key, raw = arg[2:].split("=", 1)
    if key not in DEFAULT_CONFIG:
        raise unknown_key(key)
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw  # a bare word such as --attention=efficient
    if (isinstance(DEFAULT_CONFIG[key], str) and not isinstance(value, str)
            and key not in NUMBER_OR_WORD):
        value = raw  # --wandb_run_name=2024 stays the string '2024'
    return key, check_value(key, value)


def format_override(key, value):
    """The `--key=value` argument that parse_override reads back as value: a string bare where it
    would stay a string (standard, /path/out), quoted where it would not ('1', 'True')."""
    if isinstance(value, str):
        try:
            ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return f"--{key}={value}"
    return f"--{key}={value!r}"


def read_config_file(path, config_so_far):
    """Run a config file where the config so far is defined, and return the settings it sets. Names
    with a leading underscore, modules, functions and classes are the file's own helpers."""
    if not Path(path).is_file():
        raise ConfigError(f"config file {path} not found")
    namespace = dict(config_so_far)
    try:
        exec(compile(Path(path).read_text(encoding="utf-8"), str(path), "exec"), namespace)
    except Exception as e:  # a typo, a name the file does not define: one line, not a traceback
        raise ConfigError(f"config file {path}: {type(e).__name__}: {e}") from None
    settings = {}
    for key, value in namespace.items():
        if key.startswith("_") or callable(value) or type(value).__name__ == "module":
            continue
        if key in config_so_far and value is config_so_far[key]:
            continue  # not set by this file
        if key not in DEFAULT_CONFIG:
            raise unknown_key(key, f" in {path} (a name of the file's own starts with _)")
        settings[key] = check_value(key, value)
    return settings


def get_config(argv):
    """The config: defaults, then config files and --key=value overrides in the order given."""
    config = dict(DEFAULT_CONFIG)
    for arg in argv:
        config.update([parse_override(arg)] if arg.startswith("--")
                      else read_config_file(arg, config))
    return config


def resolve_config(config):
    """The config, defaults filled in, with every key, type and value checked before training."""
    c = dict(DEFAULT_CONFIG)
    for key, value in config.items():
        c[key] = check_value(key, value)

    def bad(key, problem):
        return ConfigError(f"config key {key!r}={c[key]!r}: {problem}")

    for key in ("batch_size", "gradient_accumulation_steps", "log_interval", "eval_interval",
                "eval_iters", "hellaswag_batch_size"):
        if c[key] < 1:
            raise bad(key, "must be at least 1")
    for key in ("max_iters", "warmup_iters", "lr_decay_iters", "num_threads", "hellaswag_interval",
                "hellaswag_limit", "vocab_size"):
        if c[key] < 0:
            raise bad(key, "must not be negative")
    for key in ("learning_rate", "min_lr", "weight_decay", "grad_clip"):
        if not (c[key] >= 0 and math.isfinite(c[key])):
            raise bad(key, "must be a finite non-negative number")
    for key in ("beta1", "beta2"):
        if not 0 <= c[key] < 1:
            raise bad(key, "must be in [0, 1)")
    for key, setting in SETTINGS.items():
        if setting.choices and c[key] not in setting.choices:
            raise bad(key, f"choose one of {', '.join(map(repr, setting.choices))}")
    if c["peak_flops"] != "auto" and not (isinstance(c["peak_flops"], float)
                                          and c["peak_flops"] > 0):
        raise bad("peak_flops", "must be 'auto' or a positive number of FLOP/s, e.g. 989e12")
    try:  # where this process would run, and in what precision
        device, dtype = resolve_device_and_dtype(c["device"], c["dtype"])
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if c["backend"] == "nccl" and not device.startswith("cuda"):
        raise bad("backend", f"NCCL needs CUDA GPUs, and device is {device!r} here: "
                  f"use 'gloo' or 'auto'")
    if c["wandb_log"] and importlib.util.find_spec("wandb") is None:
        raise bad("wandb_log", "wandb is not installed: pip install wandb, or set wandb_log=False")
    if c["parallelism"] == "fsdp" and dtype == "float16":
        raise bad("dtype", "is float16 here, which FSDP does not train in: "
                  "set 'bfloat16' or 'float32'")
    if c["parallelism"] == "fsdp" and c["hellaswag_interval"]:
        raise bad("hellaswag_interval", "HellaSwag during FSDP training is not supported: "
                  "set it to 0 and run eval_hellaswag.py on ckpt.pt")
    if c["hellaswag_interval"] and not Path(c["hellaswag_file"]).is_file():
        raise bad("hellaswag_file", "no such file (docs/hellaswag.md says where to get it)")
    try:
        GPTConfig(**{k: c[k] for k in MODEL_ARG_KEYS if k != "vocab_size"})
        if c["init_from"] in PRETRAINED_GPT2:
            check_pretrained_attention(c["attention"])
            if c["block_size"] > GPT2_CONTEXT:
                raise ValueError(f"block_size={c['block_size']}: GPT-2's weights have a context "
                                 f"of {GPT2_CONTEXT} tokens: fine-tune them at block_size <= "
                                 f"{GPT2_CONTEXT}")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return c


def world_size_problem(c, world_size):
    """Why the resolved config cannot train on world_size processes (under torchrun), or None."""
    if c["gradient_accumulation_steps"] % world_size:
        return (f"gradient_accumulation_steps={c['gradient_accumulation_steps']} must be divisible "
                f"by the number of processes ({world_size}): the micro-steps are split over them")
    if c["parallelism"] == "fsdp" and c["eval_iters"] % world_size:  # as many forwards per rank
        return (f"eval_iters={c['eval_iters']} must be divisible by the number of FSDP processes "
                f"({world_size}): every rank evaluates an equal share")
    return None
