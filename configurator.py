"""
Training configuration, as in NanoGPT: the defaults below, then any config files named on the command
line (plain Python, executed in order where the config so far is defined, so a file can derive one key
from another), then `--key=value` overrides parsed as Python literals.
Unlike NanoGPT, an unknown key or a value of the wrong type stops with an error naming the key and
the expected type, and resolve_config checks the values before anything trains.

Each key has its default, a one-line meaning and, where the values are a fixed set, its choices, all
in SETTINGS: `python train.py --help` prints that table. The model's keys take their defaults from
model.GPTConfig, which also checks their values, except bias (False, as in NanoGPT's train.py) and
vocab_size (0: from the data's meta.json).
"""

import ast
import difflib
import importlib.util
import math
import re
import traceback
from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import NamedTuple

from model import (ATTENTION_CLASSES, GPT2_CONTEXT, MLPS, NORMS, POSITIONS, PRETRAINED_GPT2, GPTConfig,
                   check_pretrained_attention, published_gpt2_config)
from runtime import DTYPES, resolve_device_and_dtype


class ConfigError(ValueError):
    """An unknown config key, a value of the wrong type, or a value out of range."""


class Setting(NamedTuple):
    default: object
    meaning: str
    choices: tuple = ()


MODEL_ARG_KEYS = tuple(f.name for f in fields(GPTConfig))  # what a checkpoint's model_args hold
_MODEL = {f.name: f.default for f in fields(GPTConfig)}

# The defaults train a GPT-2 (124M) on OpenWebText, as NanoGPT's do.
SETTINGS = {
    # I/O
    "out_dir": Setting("out", "folder for ckpt.pt, log.jsonl and summary.json"),
    "eval_interval": Setting(2000, "evaluate (and checkpoint) every this many iterations, and at the end"),
    "log_interval": Setting(1, "print and log the training loss every this many iterations"),
    "eval_iters": Setting(200, "batches per split for each loss estimate"),
    "eval_only": Setting(False, "evaluate init_from's model once and exit, leaving out_dir's files as they are"),
    "always_save_checkpoint": Setting(True, "checkpoint at every evaluation; False: only when val loss improves "
                                            "(and on SIGINT/SIGTERM)"),
    "save_checkpoints": Setting(True, "False: write no checkpoint at all, not even on SIGINT/SIGTERM (throughput "
                                      "runs: nothing to resume, sample or score)"),
    "init_from": Setting("scratch", "'resume' continues out_dir's checkpoint (give the same config again); "
                                    "'gpt2*' starts from OpenAI's weights", ("scratch", "resume", *PRETRAINED_GPT2)),
    # logging
    "wandb_log": Setting(False, "also log to Weights & Biases (pip install wandb)"),
    "wandb_project": Setting("owt", "wandb project name"),
    "wandb_run_name": Setting("gpt2", "wandb run name"),
    # data
    "dataset": Setting("openwebtext", "the folder data/<dataset> (from prepare_char.py or prepare_openwebtext.py)"),
    "data_dir": Setting("", "the data folder itself (train.bin, val.bin, meta.json); '' means data/<dataset>"),
    "gradient_accumulation_steps": Setting(5 * 8, "micro-batches per optimizer step, over all DDP processes"),
    "batch_size": Setting(12, "sequences per micro-batch (per process)"),
    # model: the GPTConfig fields, GPT-2 124M's shape
    "block_size": Setting(_MODEL["block_size"], "context length in tokens (super's W^A is block_size^2)"),
    "vocab_size": Setting(0, "0: from meta.json (GPT-2's 50257 padded up to 50304)"),
    "n_layer": Setting(_MODEL["n_layer"], "transformer blocks"),
    "n_head": Setting(_MODEL["n_head"], "attention heads; must divide n_embd"),
    "n_embd": Setting(_MODEL["n_embd"], "model width d"),
    "dropout": Setting(_MODEL["dropout"], "dropout probability, in [0, 1)"),
    "bias": Setting(False, "biases in Linear layers and norms (GPT-2 has them; NanoGPT trains without)"),
    "attention": Setting(_MODEL["attention"], "the attention variant (README: the four variants)",
                         tuple(ATTENTION_CLASSES)),  # the paper's four, and any added in model.py
    "gelu_approximate": Setting(_MODEL["gelu_approximate"], "exact GELU, or GPT-2's tanh approximation",
                                ("none", "tanh")),
    "norm": Setting(_MODEL["norm"], "LayerNorm (GPT-2) or RMSNorm (Llama)", NORMS),
    "pos": Setting(_MODEL["pos"], "learned position table (GPT-2) or rotary embeddings (Llama)", POSITIONS),
    "rope_theta": Setting(_MODEL["rope_theta"], "RoPE's base, with pos='rope'"),
    "mlp": Setting(_MODEL["mlp"], "4x GELU MLP (GPT-2) or SwiGLU (Llama; set intermediate_size)", MLPS),
    "intermediate_size": Setting(_MODEL["intermediate_size"], "the MLP's hidden width; 0 = 4 * n_embd"),
    "tie_embeddings": Setting(_MODEL["tie_embeddings"], "the output head shares the token embedding"),
    "n_kv_head": Setting(_MODEL["n_kv_head"], "key/value heads of standard attention (grouped-query); 0 = n_head"),
    # AdamW
    "learning_rate": Setting(6e-4, "peak learning rate"),
    "max_iters": Setting(600000, "optimizer steps in total"),
    "weight_decay": Setting(1e-1, "AdamW weight decay of matrices and embeddings"),
    "beta1": Setting(0.9, "AdamW beta1"),
    "beta2": Setting(0.95, "AdamW beta2"),
    "grad_clip": Setting(1.0, "clip gradients at this global norm; 0 disables"),
    # learning rate schedule: linear warmup, then cosine decay to min_lr
    "decay_lr": Setting(True, "warmup and cosine decay; False: a constant learning_rate"),
    "warmup_iters": Setting(2000, "linear warmup steps"),
    "lr_decay_iters": Setting(600000, "the step where the cosine reaches min_lr; usually max_iters"),
    "min_lr": Setting(6e-5, "the final learning rate; usually learning_rate / 10"),
    # system
    "backend": Setting("auto", "DDP backend; 'auto' is nccl on GPU, gloo on CPU", ("auto", "nccl", "gloo")),
    "parallelism": Setting("ddp", "under torchrun: a full replica per process, or FSDP2 shards (distributed.py)",
                           ("ddp", "fsdp")),
    "activation_checkpointing": Setting(False, "recompute each block's activations in backward: less memory, "
                                               "about 1/3 more compute"),
    "device": Setting("auto", "'auto' (cuda if available, else cpu), 'cpu', 'cuda', 'cuda:1', 'mps'"),
    "dtype": Setting("auto", "'auto': bfloat16 (else float16) on GPU, float32 on CPU", ("auto", *DTYPES)),
    "compile": Setting(True, "torch.compile the model (needs a C/C++ compiler on CPU)"),
    "num_threads": Setting(0, "torch threads per process on CPU; 0: runtime.py's choice (see docs/training.md)"),
    "seed": Setting(1337, "seed of the initialisation, the batches and dropout"),
    "peak_flops": Setting("auto", "MFU's denominator in FLOP/s; 'auto': the GPU's dense bf16 peak, none on CPU"),
    # HellaSwag during training (needs a GPT-2-tokenized model)
    "hellaswag_interval": Setting(0, "score HellaSwag every this many iterations; 0 = off"),
    "hellaswag_file": Setting("", "the HellaSwag jsonl file (docs/hellaswag.md)"),
    "hellaswag_limit": Setting(0, "examples to score; 0 = all in the file"),
    "hellaswag_batch_size": Setting(8, "examples per forward pass"),
}
DEFAULT_CONFIG = {key: setting.default for key, setting in SETTINGS.items()}
NUMBER_OR_WORD = {"peak_flops"}  # keys that take a number, though their default is a word ('auto')
assert set(MODEL_ARG_KEYS) <= set(DEFAULT_CONFIG), "every GPTConfig field is a config key"


def help_text():
    lines = []
    for key, (default, meaning, choices) in SETTINGS.items():
        options = f" [{' | '.join(choices)}]" if choices else ""
        lines.append(f"  --{key}={default!r}\n      {meaning}{options}")
    return "\n".join(lines)


def _unknown_key(key, defaults, where=""):
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
    if key in NUMBER_OR_WORD and type(value) in (int, float):
        return float(value)
    if type(value) is not expected:
        spelling = ": write True or False, as Python does" if expected is bool else ""  # --compile=false
        raise ConfigError(f"config key {key!r} expects a value of type {expected.__name__}, "
                          f"got {value!r} of type {type(value).__name__}{spelling}")
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
    if isinstance(defaults[key], str) and not isinstance(value, str) and key not in NUMBER_OR_WORD:
        value = raw  # e.g. --wandb_run_name=2024 stays the string '2024'
    return key, check_value(key, value, defaults)


def format_override(key, value):
    """The `--key=value` argument that parse_override reads back as value: a string bare where it
    would stay the string (standard, /path/out), quoted where it would read as a number or a bool
    ('1', 'True'); numbers and bools as Python writes them (0.001, True)."""
    if isinstance(value, str):
        try:
            ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return f"--{key}={value}"  # parse_override's fallback: what it cannot parse is the plain string
    return f"--{key}={value!r}"


def from_another_folder(path):
    """The hint for a config file missing here that the repository holds at that relative path: the command
    ran from another folder (config/ and data/ paths are read from the current folder, as in NanoGPT)."""
    repo, path = Path(__file__).resolve().parent, Path(path)
    if path.is_absolute() or Path.cwd() == repo or not (repo / path).is_file():
        return ""
    return f" in {Path.cwd()}: run the command from the repository's folder ({repo}), where it is"


def read_config_file(path, defaults=DEFAULT_CONFIG, config_so_far=None):
    """Execute a plain-Python config file and return the settings it sets. As in NanoGPT, it runs where
    the config so far (the defaults, then earlier files and overrides) is defined, so that one key can
    follow another (`min_lr = learning_rate / 10`). Names with a leading underscore, modules, functions
    and classes are the file's own helpers, not settings."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder: name a config file, e.g. config/quickstart.py")
    if not path.is_file():
        key = str(path).split("=", 1)[0]
        hint = f": overrides start with --, as in --{path}" if "=" in str(path) and key in defaults else ""
        raise ConfigError(f"config file {path} not found{hint or from_another_folder(path)}")
    before = dict(defaults if config_so_far is None else config_so_far)
    namespace = dict(before)
    try:
        tree = compile(path.read_text(encoding="utf-8"), str(path), "exec", ast.PyCF_ONLY_AST)
        _refuse_bare_annotations(tree, path)
        exec(compile(tree, str(path), "exec"), namespace)
    except ConfigError:
        raise
    except Exception as e:  # a typo, a name it does not define, a failing import: one line, not a traceback
        raise ConfigError(f"config file {path}{_line_of(e, path)}: {type(e).__name__}: {e}") from None
    settings = {}
    for key, value in namespace.items():
        if key.startswith("_") or callable(value) or type(value).__name__ == "module":
            continue
        if key in before and value is before[key]:
            continue  # not set by this file
        if key not in defaults:
            own = " (a name of the file's own, not a setting, starts with _)"
            raise ConfigError(f"{path}: {_unknown_key(key, defaults, own)}")
        try:
            settings[key] = check_value(key, value, defaults)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
    return settings


def _refuse_bare_annotations(tree, path):
    """`max_iters: 3` (YAML's way) is a Python annotation that sets nothing: the run would silently take
    the default."""
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and node.value is None:
            raise ConfigError(f"config file {path}, line {node.lineno}: `{ast.unparse(node)}` is a type annotation "
                              f"and sets nothing; config files are Python: write "
                              f"`{ast.unparse(node.target)} = {ast.unparse(node.annotation)}`")


def _line_of(error, path):
    """", line N" where a config file's own code raised error (a SyntaxError says where it is too)."""
    if isinstance(error, SyntaxError):
        return f", line {error.lineno}"
    lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__) if frame.filename == str(path)]
    return f", line {lines[-1]}" if lines else ""


def get_config(argv, defaults=DEFAULT_CONFIG, set_by=None):
    """The effective config: defaults, then config files, then --key=value overrides, in order.
    set_by, a dict if given, receives each key's last setter: the config file's path or the override."""
    config, set_by = dict(defaults), {} if set_by is None else set_by
    for arg in argv:
        if arg.startswith("--"):
            key, value = parse_override(arg, defaults)
            settings = {key: value}
        else:
            settings = read_config_file(arg, defaults, config)
            refuse_overridden_overrides(arg, settings, config, set_by)
        config.update(settings)
        set_by.update(dict.fromkeys(settings, arg))
    return config


def refuse_overridden_overrides(path, settings, config, set_by):
    """An override given before a config file that sets its key again would do nothing (as in NanoGPT,
    the last one given wins): a silent max_iters or out_dir other than the one asked for."""
    for key, value in settings.items():
        if set_by.get(key, "").startswith("--") and value != config[key]:
            raise ConfigError(f"{set_by[key]} comes before {path}, which sets {key} again ({key} = {value!r}), so it "
                              f"would have no effect: give the config files first, then the --key=value overrides")


def naming_config_files(error, set_by):
    """error's message, plus the config file that set each key it names: a check of the resolved
    config (attention='efficent') cannot tell by itself that the value came from a file."""
    files = {}
    for key, arg in set_by.items():
        if not arg.startswith("--") and arg not in str(error) and re.search(rf"(?<!\w)'?{key}'?=", str(error)):
            files.setdefault(arg, []).append(key)
    where = "; ".join(f"{', '.join(keys)} set in {path}" for path, keys in files.items())
    return f"{error} ({where})" if where else str(error)


def resolve_config(config):
    """Fill in defaults for keys not given, check every key and type, and check the values that
    training owns (GPTConfig checks the model's)."""
    c = dict(DEFAULT_CONFIG)
    for key, value in config.items():
        c[key] = check_value(key, value)
    _check_ranges(c)
    _check_combinations(c)
    _check_model(c)
    return c


def _bad(c, key, problem):
    return ConfigError(f"config key {key!r}={c[key]!r}: {problem}")


def _check_ranges(c):
    """Each training value on its own: counts, rates, choices."""
    bad = partial(_bad, c)
    if not c["out_dir"]:
        raise bad("out_dir", "name a folder (it is created if missing)")
    for key in ("batch_size", "gradient_accumulation_steps", "log_interval", "eval_interval", "eval_iters",
                "hellaswag_batch_size"):
        if c[key] < 1:
            raise bad(key, "must be at least 1")
    for key in ("max_iters", "warmup_iters", "lr_decay_iters", "num_threads", "hellaswag_interval",
                "hellaswag_limit", "vocab_size"):
        if c[key] < 0:
            raise bad(key, "must not be negative")
    for key in ("learning_rate", "min_lr", "weight_decay", "grad_clip"):
        if c[key] < 0 or not math.isfinite(c[key]):
            raise bad(key, "must be a finite non-negative number")
    for key in ("beta1", "beta2"):
        if not 0 <= c[key] < 1:
            raise bad(key, "must be in [0, 1)")
    if not 0 <= c["seed"] < 2**63:  # each rank seeds with seed + rank, which must fit torch's 64 bits
        raise bad("seed", "must be in [0, 2**63)")
    for key, setting in SETTINGS.items():
        if setting.choices and key not in MODEL_ARG_KEYS and c[key] not in setting.choices:
            raise bad(key, f"choose one of {', '.join(map(repr, setting.choices))}")
    peak = c["peak_flops"]
    if peak != "auto" and not (isinstance(peak, float) and math.isfinite(peak) and peak > 0):
        raise bad("peak_flops", "must be 'auto' or a positive number of FLOP/s, e.g. 989e12")


def _check_combinations(c):
    """Values that are fine alone but not together, or not on this machine."""
    bad = partial(_bad, c)
    try:  # where this process would run, and in what precision
        device, dtype = resolve_device_and_dtype(c["device"], c["dtype"])
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if c["backend"] == "nccl" and not device.startswith("cuda"):
        raise bad("backend", f"NCCL runs on CUDA GPUs only, and device resolves to {device!r} here: use "
                  f"backend='gloo' (or 'auto')")
    if c["wandb_log"] and importlib.util.find_spec("wandb") is None:
        raise bad("wandb_log", "wandb is not installed: pip install wandb, or set wandb_log=False")
    if c["parallelism"] == "fsdp" and dtype == "float16":
        raise bad("dtype", "resolves to float16 here, which FSDP does not train in (no fp16 loss scaling of "
                  "sharded gradients): set dtype='bfloat16' or 'float32'")
    # each rank scores its share of the examples; FSDP's ranks would then run unequal numbers of
    # forward passes, each of them collectives every rank must join
    if c["parallelism"] == "fsdp" and c["hellaswag_interval"]:
        raise bad("hellaswag_interval", "HellaSwag during FSDP training is not supported: set it to 0 and run "
                  "eval_hellaswag.py on the consolidated ckpt.pt")
    if not c["save_checkpoints"] and c["init_from"] == "resume" and not c["eval_only"]:
        # its log and summary would go past the checkpoint, which a later resume would take as finished
        raise bad("save_checkpoints", "a resume that saves nothing leaves its checkpoint behind its log and "
                  "summary: resume with save_checkpoints=True")
    if c["decay_lr"] and c["lr_decay_iters"] <= c["warmup_iters"]:
        raise bad("lr_decay_iters", f"must exceed warmup_iters={c['warmup_iters']} when decay_lr is on")
    if c["decay_lr"] and c["min_lr"] > c["learning_rate"]:
        raise bad("min_lr", f"exceeds learning_rate={c['learning_rate']!r}, so the cosine 'decay' would raise the "
                  f"rate: set min_lr below it (usually learning_rate / 10)")
    dataset = Path(c["dataset"])
    if not c["data_dir"] and len(dataset.parts) > 1 and dataset.is_dir() and not (Path("data") / dataset).is_dir():
        # --dataset=data/shakespeare_char would read data/data/shakespeare_char
        raise bad("dataset", f"a dataset is the name of a folder under data/, so this reads data/{c['dataset']}, "
                  f"which does not exist: write --dataset={dataset.name} (or give a path as "
                  f"--data_dir={c['dataset']})")
    if c["hellaswag_interval"] and not c["hellaswag_file"]:
        raise bad("hellaswag_file", "hellaswag_interval is on, so name a HellaSwag jsonl file")
    if c["hellaswag_interval"] and not Path(c["hellaswag_file"]).is_file():
        raise bad("hellaswag_file", "no such file (docs/hellaswag.md says where to get it), or set hellaswag_interval=0")


def world_size_problem(c, world_size):
    """Why the resolved config cannot train on world_size processes (under torchrun), or None."""
    if c["gradient_accumulation_steps"] % world_size:
        return (f"config key 'gradient_accumulation_steps'={c['gradient_accumulation_steps']} must be divisible by "
                f"the number of processes ({world_size}): the steps are split over them"
                + _splits(c["gradient_accumulation_steps"], world_size, "gradient_accumulation_steps"))
    if c["parallelism"] == "fsdp" and c["eval_iters"] % world_size:  # each rank, as many sharded forwards
        return (f"config key 'eval_iters'={c['eval_iters']} must be divisible by the number of FSDP processes "
                f"({world_size}): every rank evaluates an equal share" + _splits(c["eval_iters"], world_size, "eval_iters"))
    return None


def _splits(count, world_size, key):
    """The ways out: the process counts that divide `count`, or the nearest multiple of world_size."""
    fits = [n for n in range(1, count + 1) if count % n == 0]
    shown = ", ".join(map(str, fits[:8])) + (", ..." if len(fits) > 8 else "")
    multiple = max(world_size, round(count / world_size) * world_size)
    batch = " (the global batch changes with it)" if key == "gradient_accumulation_steps" else ""
    return (f"; {count} splits over {shown} process{'es' if len(fits) > 1 else ''}, or, for {world_size}, set "
            f"--{key}={multiple}{batch}")


def _check_model(c):
    """The model owns these checks: GPTConfig's of the model keys (vocab_size comes from the data
    later, so a stand-in here), and which attention and shape OpenAI's weights have."""
    try:
        GPTConfig(**{k: c[k] for k in MODEL_ARG_KEYS if k != "vocab_size"})
        if c["init_from"] in PRETRAINED_GPT2:
            check_pretrained_attention(c["attention"])
            if c["block_size"] > GPT2_CONTEXT:
                raise ValueError(f"block_size={c['block_size']}: OpenAI's GPT-2 weights have a context of "
                                 f"{GPT2_CONTEXT} tokens, so fine-tune them at block_size <= {GPT2_CONTEXT}")
            check_pretrained_shape(c, published_gpt2_config(c["init_from"]))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_pretrained_shape(c, pretrained):
    """init_from='gpt2*' takes the model's shape from the weights (GPTConfig `pretrained`): a model key the
    config sets to something else would be silently ignored, so it is an error."""
    implied = {"n_kv_head": pretrained.n_head, "intermediate_size": 4 * pretrained.n_embd}  # what their 0 means

    def same(key):
        ours, theirs = c[key], getattr(pretrained, key)
        return (ours or implied[key]) == (theirs or implied[key]) if key in implied else ours == theirs

    ignored = [k for k in MODEL_ARG_KEYS if k not in ("attention", "block_size", "dropout", "vocab_size")
               and c[k] != DEFAULT_CONFIG[k] and not same(k)]
    if ignored:
        raise ConfigError(f"init_from={c['init_from']!r} takes the model's shape from its weights, which have "
                          f"{', '.join(f'{k}={getattr(pretrained, k)!r}' for k in ignored)}, not "
                          f"{', '.join(f'{k}={c[k]!r}' for k in ignored)}: drop those keys from the config and "
                          f"overrides (of the model keys, only attention, block_size and dropout apply)")


if __name__ == "__main__":  # run as a script, or exec'd into one: NanoGPT's exec(open('configurator.py').read())
    raise SystemExit("error: configurator.py is a module here, and exec'ing it (NanoGPT's idiom) would apply no "
                     "override: in a script of your own, `from configurator import get_config` and "
                     "`config = get_config(sys.argv[1:])` give the training config (defaults, config files, then "
                     "--key=value), or get_config(sys.argv[1:], defaults=your_settings) with your own defaults")
