"""
The sweep behind compare.py: plan every run (variants x sizes x learning rates x seeds) under one
budget, each resolved to its iterations and schedule before anything trains; then train each as
its own train.py process. A rerun skips finished runs and resumes an interrupted one. Training
compute is flops_per_token x tokens, the model's own count (GPT.flops_per_token), not 6N.
"""

import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from atomic import write_text_atomic
from checkpoint import CHECKPOINT_NAME, LOG_NAME, SUMMARY_NAME
from configurator import MODEL_ARG_KEYS, ConfigError, format_override, get_config, resolve_config
from data import check_data_dir, choose_vocab_size, config_data_dir
from model import GPT, GPTConfig
from runtime import sigterm_as_ctrl_c
from tokenizer import read_meta

REPO = Path(__file__).resolve().parent
MATCHES = ("iters", "tokens", "flops", "time")
RECORD_NAME = "compare_run.json"  # in each run's folder: the train.py arguments planned
TRAIN_LOG_NAME = "train.log"  # in each run's folder: its train.py's output
SHAPE_KEYS = ("n_layer", "n_head", "n_embd")
# (n_layer, n_head, n_embd): three CPU sizes, and GPT-2-like ones for a GPU (10-100M parameters)
SIZE_PRESETS = {
    "cpu-s": (2, 2, 64), "cpu-m": (4, 4, 128), "cpu-l": (6, 6, 192), "gpu-10m": (6, 6, 384),
    "gpu-30m": (8, 8, 512), "gpu-50m": (10, 10, 640), "gpu-85m": (12, 12, 768),
}


class SweepError(ValueError):
    """A sweep that cannot be planned or continued as asked; the message says how to fix it."""


def parse_sizes(text):
    """'2x2x64,cpu-m' -> [(2, 2, 64), (4, 4, 128)]: n_layer x n_head x n_embd, or a preset name."""
    sizes = []
    for item in (s.strip() for s in text.split(",")):
        if item in SIZE_PRESETS:
            sizes.append(SIZE_PRESETS[item])
        elif re.fullmatch(r"[1-9]\d*x[1-9]\d*x[1-9]\d*", item):
            sizes.append(tuple(int(n) for n in item.split("x")))
        else:
            raise SweepError(f"--sizes: {item!r} is not n_layer x n_head x n_embd (e.g. 4x4x128) "
                             f"nor a preset ({', '.join(SIZE_PRESETS)})")
    return sizes


def size_label(shape):
    return "x".join(map(str, shape))


@dataclass
class PlannedRun:
    """One training of the sweep, with everything that is resolved before anything trains."""
    size: str
    variant: str
    seed: int
    iterations: int
    schedule: dict  # max_iters, lr_decay_iters, warmup_iters, eval_interval
    flops_per_token: int
    tokens_per_iter: int
    run_dir: Path
    train_args: list
    learning_rate: float = None  # the peak of a --learning_rates sweep; None: the config's

    def describe(self):
        lr = "" if self.learning_rate is None else f" lr {self.learning_rate:g}"
        return f"{self.size} {self.variant}{lr} seed {self.seed}"

    @property
    def training_flops(self):
        return self.flops_per_token * self.tokens_per_iter * self.iterations

    def as_dict(self):
        return dict(size=self.size, variant=self.variant, seed=self.seed,
                    learning_rate=self.learning_rate, iterations=self.iterations, **self.schedule,
                    flops_per_token=self.flops_per_token, tokens_per_iter=self.tokens_per_iter,
                    training_flops=self.training_flops, run_dir=str(self.run_dir))


# -----------------------------------------------------------------------------
# the plan

def resolved_config(config_file, overrides):
    """train.py's own config for these arguments; its ConfigError becomes a SweepError."""
    try:
        return resolve_config(get_config([config_file, *overrides]))
    except ConfigError as e:
        raise SweepError(str(e)) from None


def model_flops_per_token(c):
    """Training FLOPs per token of the model this config builds, on the meta device (no memory),
    with the vocabulary train.py takes from the data's meta.json."""
    data_dir = config_data_dir(c)
    try:
        check_data_dir(data_dir)
        vocab_size = choose_vocab_size(c, read_meta(data_dir), -1, data_dir)
        with torch.device("meta"):
            model_args = {key: c[key] for key in MODEL_ARG_KEYS} | {"vocab_size": vocab_size}
            model = GPT(GPTConfig(**model_args))
    except (FileNotFoundError, ValueError) as e:  # no data yet; a shape this variant refuses
        raise SweepError(str(e)) from None
    return model.flops_per_token()


def cost_per_iter(match, c, flops_per_token, seconds):
    """What one iteration spends of the budget: 1 iteration, its tokens, its FLOPs or seconds."""
    tokens = c["gradient_accumulation_steps"] * c["batch_size"] * c["block_size"]
    costs = {"iters": 1, "tokens": tokens, "flops": flops_per_token * tokens, "time": seconds}
    return costs[match]


def scaled_schedule(c, iterations):
    """The config's schedule stretched by iterations / max_iters, so that the cosine of
    train.get_lr ends where the run ends (also under --match=iters: a config's lr_decay_iters may
    outlast the run). A warmup that outlasts it, train.get_lr cuts."""
    factor = iterations / c["max_iters"]
    return {"max_iters": iterations, "lr_decay_iters": iterations,
            "warmup_iters": round(c["warmup_iters"] * factor),
            "eval_interval": max(1, min(round(c["eval_interval"] * factor), iterations))}


def learning_rate_settings(c, lr):
    """The peak of a --learning_rates sweep, and min_lr at the config's ratio to it."""
    if lr is None:
        return {}
    return {"learning_rate": lr,  # and min_lr 0.0003, not 0.00030000000000000003
            "min_lr": float(f"{lr * c['min_lr'] / c['learning_rate']:.12g}")}


def train_arguments(config_file, overrides, own):
    """train.py's arguments: the config file, the sweep's overrides, then those the sweep sets for
    this run (an override of the same key left out, so that each key is given once)."""
    keys = {arg[2:].split("=", 1)[0] for arg in own}
    return [config_file, *(arg for arg in overrides if arg[2:].split("=", 1)[0] not in keys), *own]


def size_overrides(base, shape):
    """n_layer, n_head and n_embd of one size, and what the config ties to them at its own ratio:
    the MLP's width to n_embd (SwiGLU's intermediate_size), key/value heads to n_head."""
    sized = dict(zip(SHAPE_KEYS, shape))
    if base["intermediate_size"]:
        width = base["intermediate_size"] * shape[2] / base["n_embd"]
        sized["intermediate_size"] = max(1, round(width))
    if base["n_kv_head"]:
        sized["n_kv_head"] = max(1, shape[1] * base["n_kv_head"] // base["n_head"])
    return [format_override(key, value) for key, value in sized.items()]


def run_name(variant, lr, seed):
    return f"{variant}-seed{seed}" if lr is None else f"{variant}-lr{lr:g}-seed{seed}"


def probe_seconds_per_iter(args, overrides, variant, probe_dir):
    """Seconds per training step of this variant on this machine, from a short train.py run under
    the sweep's launcher, kept in probe_dir so that a rerun plans the same; probed again where the
    settings differ."""
    n = args.probe_iters
    settings = dict(attention=variant, out_dir=str(probe_dir), max_iters=n, lr_decay_iters=n,
                    warmup_iters=0, eval_interval=n, log_interval=n, always_save_checkpoint=False,
                    eval_iters=1)
    train_args = train_arguments(args.config, overrides,
                                 [format_override(k, v) for k, v in settings.items()])
    record = {"launcher": args.launcher, "train_args": train_args}
    summary = read_json(probe_dir / SUMMARY_NAME)
    if read_json(probe_dir / RECORD_NAME) != record or not completed(summary, n):
        shutil.rmtree(probe_dir, ignore_errors=True)
        probe_dir.mkdir(parents=True)
        run_train(train_command(args.launcher, train_args), probe_dir)
        summary = read_json(probe_dir / SUMMARY_NAME)
        if not completed(summary, n):
            raise SweepError(f"the timing probe of {variant} did not finish: see "
                             f"{probe_dir / TRAIN_LOG_NAME}")
        write_text_atomic(probe_dir / RECORD_NAME, json.dumps(record))
    return summary["mean_ms_per_iter"] / 1000


def plan_size(args, overrides, shape, out_dir):
    """The runs of one size (every variant, learning rate and seed) and its budget: (label,
    budget, runs, the reference's FLOPs per token)."""
    shape_args = size_overrides(resolved_config(args.config, overrides), shape) if shape else []
    c = resolved_config(args.config, overrides + shape_args)
    label = size_label(tuple(c[key] for key in SHAPE_KEYS))
    costs = {}
    for variant in dict.fromkeys([*args.variants, args.reference]):
        seconds = None
        if args.match == "time":
            probe_dir = out_dir / "probes" / label / variant
            seconds = probe_seconds_per_iter(args, overrides + shape_args, variant, probe_dir)
        flops_per_token = model_flops_per_token(c | {"attention": variant})
        costs[variant] = (flops_per_token, cost_per_iter(args.match, c, flops_per_token, seconds))
    budget = args.budget or costs[args.reference][1] * c["max_iters"]
    runs = []
    for variant in args.variants:
        iterations = (c["max_iters"] if args.match == "iters"
                      else max(1, round(budget / costs[variant][1])))
        schedule = scaled_schedule(c, iterations)
        for lr in args.learning_rates or [None]:
            for seed in range(args.seeds):
                run_dir = (out_dir / label if shape else out_dir) / run_name(variant, lr, seed)
                own = dict(attention=variant, seed=seed, out_dir=str(run_dir), **schedule,
                           **learning_rate_settings(c, lr))
                own = [*shape_args, *(format_override(k, v) for k, v in own.items())]
                train_args = train_arguments(args.config, overrides, own)
                resolved_config(args.config, train_args[1:])  # every run's, before any trains
                runs.append(PlannedRun(
                    size=label, variant=variant, seed=seed, iterations=iterations,
                    schedule=schedule, flops_per_token=costs[variant][0],
                    tokens_per_iter=cost_per_iter("tokens", c, 0, 0), run_dir=run_dir,
                    train_args=train_args, learning_rate=lr))
    return label, budget, runs, costs[args.reference][0]


def plan_sweep(args, overrides, out_dir):
    """Every run, seeds outermost, then sizes in order of the reference's FLOPs per token (the last
    is the largest), then variants, then learning rates; and each size's budget."""
    sized = sorted((plan_size(args, overrides, shape, out_dir) for shape in args.sizes or [None]),
                   key=lambda planned: planned[3])
    plan = sorted((run for _, _, runs, _ in sized for run in runs), key=lambda run: run.seed)
    return plan, {label: budget for label, budget, _, _ in sized}


# -----------------------------------------------------------------------------
# running train.py: one process per run, resumable

def read_json(path):
    return json.loads(Path(path).read_text()) if Path(path).is_file() else None


def read_log(run_dir):
    path = Path(run_dir) / LOG_NAME
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


def train_command(launcher, train_args):
    """One train.py run under the sweep's --launcher (torchrun, say), or this python."""
    start = shlex.split(launcher) if launcher else [sys.executable]
    return [*start, str(REPO / "train.py"), *train_args]


def run_train(command, folder):
    """Run one train.py, its output appended to folder/train.log; returns its exit status. It runs
    in its own session, so that a Ctrl-C in the terminal reaches only the sweep, which passes one
    SIGINT on (for a SIGTERM too): train.py saves and exits, then KeyboardInterrupt stops us."""
    with open(folder / TRAIN_LOG_NAME, "a") as log, sigterm_as_ctrl_c():
        print(shlex.join(command), file=log, flush=True)
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            return process.wait()
        except KeyboardInterrupt:
            process.send_signal(signal.SIGINT)
            process.wait()
            raise


def completed(summary, iterations):
    """Whether a train.py summary is that of a run that trained all its planned iterations."""
    return (summary is not None and summary["stop_reason"] == "max_iters"
            and summary["iterations"] == iterations)


def finished(run, summary):
    """Trained to its end, or diverged in a learning-rate sweep: a result there (a rerun would
    diverge again)."""
    diverged = summary is not None and summary["stop_reason"] == "diverged"
    return completed(summary, run.iterations) or (diverged and run.learning_rate is not None)


def check_folder(run):
    """A run folder that holds a run of other arguments, or one the sweep did not plan (a
    checkpoint but no record), is never trained into."""
    record = read_json(run.run_dir / RECORD_NAME)
    planned = record["train_args"] if record else run.train_args
    if planned != run.train_args or record is None and (run.run_dir / CHECKPOINT_NAME).exists():
        raise SweepError(f"{run.run_dir} holds another run (other settings, or none of this "
                         f"sweep's): rerun the command that made it, or choose another --out_dir")


def train_run(run, launcher):
    """Train a planned run, or resume it from its checkpoint, unless it has finished; returns its
    summary and whether it trained now."""
    summary = read_json(run.run_dir / SUMMARY_NAME)
    if finished(run, summary):
        return summary, False
    run.run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(run.run_dir / RECORD_NAME, json.dumps({"train_args": run.train_args}))
    resume = ["--init_from=resume"] if (run.run_dir / CHECKPOINT_NAME).exists() else []
    code = run_train(train_command(launcher, run.train_args + resume), run.run_dir)
    summary = read_json(run.run_dir / SUMMARY_NAME)
    if finished(run, summary):
        return summary, True
    log = run.run_dir / TRAIN_LOG_NAME
    if code != 0:
        last = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        raise SweepError(f"training {run.describe()} failed (exit code {code}): {last[-1]} "
                         f"(all of it: {log})")
    where = (f"at iteration {summary['iterations']:,} ({summary['stop_reason']})" if summary
             else "without a summary")
    raise SweepError(f"{run.describe()} stopped {where} of {run.iterations:,}: see {log}, and "
                     f"rerun the same command to resume it")


def table_row(run, summary):
    """A run's summary as the tables use it, with the columns derived from it."""
    tokens = summary["tokens_per_iter"] * summary["iterations"]
    row = summary | {"size": run.size, "seed": run.seed, "tokens": tokens,
                     "training_flops": run.flops_per_token * tokens}
    if run.learning_rate is not None:
        row["learning_rate"] = run.learning_rate
    if summary.get("peak_memory_bytes") is not None:
        row["peak_memory_mb"] = summary["peak_memory_bytes"] / 2**20
    if summary.get("mean_ms_per_iter") is not None:
        row["step_seconds"] = summary["mean_ms_per_iter"] / 1000 * summary["iterations"]
    return row


def outcome(summary):
    if summary["stop_reason"] == "diverged":
        return f"diverged at iteration {summary['iterations']:,} (a result of the rate sweep)"
    losses = [f"{split} loss {summary[f'final_{split}_loss']:.4f}" for split in ("train", "val")
              if summary.get(f"final_{split}_loss") is not None]
    seconds = f"{summary['wall_time_s']:.0f} s"
    return ", ".join([f"{summary['iterations']:,} iters", *losses, seconds])


def run_sweep(plan, launcher=""):
    """Train every planned run not finished yet, in order, a line as each finishes; returns
    {run_dir: table row}. Every folder is checked before anything trains."""
    for run in plan:
        check_folder(run)
    rows = {}
    for k, run in enumerate(plan, 1):
        summary, trained = train_run(run, launcher)
        rows[run.run_dir] = table_row(run, summary)
        state = "done" if trained else "finished already"
        print(f"run {k}/{len(plan)} {state}: {run.describe()}: {outcome(summary)}", flush=True)
    return rows
