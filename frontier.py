"""
The compute-matched comparison behind compare.py: plan a sweep of attention variants x model sizes x
seeds under one budget (iterations, tokens, training FLOPs or wall-clock), run each training as its
own train.py process (resumable), then tabulate, fit loss against compute per variant and plot the
frontier. docs/compare.md says what each budget means and how the FLOPs and parameters are counted.

The accounting: training compute C = flops_per_token x tokens seen, where flops_per_token is the
model's own count (model.GPT.flops_per_token: forward + backward, attention's T-dependent terms and
super's W^A V included), not 6N. Parameters are the total count (embeddings included, the tied head
once), as the FLOP count includes the output head.
"""

import json
import math
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from atomic import write_text_atomic
from checkpoint import CHECKPOINT_NAME, LOG_NAME, SUMMARY_NAME
from configurator import MODEL_ARG_KEYS, ConfigError, format_override, get_config, parse_override, resolve_config
from data import choose_vocab_size, config_data_dir
from distributed import SHARDED_NAME
from model import GPT, GPTConfig
from tokenizer import read_meta

REPO = Path(__file__).resolve().parent
MATCHES = ("iters", "tokens", "flops", "time")
RECORD_NAME = "compare_run.json"  # beside each run's files: the train.py arguments it was planned with
SHAPE_KEYS = ("n_layer", "n_head", "n_embd")
MIN_COMPUTE_SPAN = 1.25  # a fit of loss on compute needs sizes whose training FLOPs differ by more than this factor
# named shapes (n_layer, n_head, n_embd): three CPU sizes, and GPT-2-like ones for a GPU (10-100M parameters)
SIZE_PRESETS = {
    "cpu-s": (2, 2, 64), "cpu-m": (4, 4, 128), "cpu-l": (6, 6, 192),
    "gpu-10m": (6, 6, 384), "gpu-30m": (8, 8, 512), "gpu-50m": (10, 10, 640), "gpu-85m": (12, 12, 768),
}


class SweepError(ValueError):
    """A sweep that cannot be planned or continued as asked; the message says how to fix it."""


class RunFailed(RuntimeError):
    """A train.py run exited with an error; its own output says why."""


class SweepInterrupted(RuntimeError):
    """A SIGINT/SIGTERM stopped the sweep after the running train.py saved its checkpoint."""


# -----------------------------------------------------------------------------
# sizes and the resolved settings of every run

def parse_sizes(text):
    """'2x2x64,cpu-m' -> [(2, 2, 64), (4, 4, 128)]: n_layer x n_head x n_embd, or a preset name."""
    sizes = []
    for item in (s.strip() for s in text.split(",")):
        if item in SIZE_PRESETS:
            sizes.append(SIZE_PRESETS[item])
        elif re.fullmatch(r"\d+x\d+x\d+", item) and all(int(n) > 0 for n in item.split("x")):
            sizes.append(tuple(int(n) for n in item.split("x")))
        else:
            raise SweepError(f"--sizes: {item!r} is not n_layer x n_head x n_embd (e.g. 4x4x128) nor a preset "
                             f"({', '.join(SIZE_PRESETS)})")
    for n_layer, n_head, n_embd in sizes:
        if n_embd % n_head:
            raise SweepError(f"--sizes: {n_layer}x{n_head}x{n_embd}: n_embd must be a multiple of n_head")
    if len(set(sizes)) != len(sizes):
        raise SweepError("--sizes: a size is listed twice")
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
    train_args: list = field(default_factory=list)
    learning_rate: float = None  # the peak learning rate of a --learning_rates sweep; None: the config's

    def describe(self):
        lr = "" if self.learning_rate is None else f", learning rate {self.learning_rate:g}"
        return f"{self.variant} at {self.size}{lr}, seed {self.seed}"

    @property
    def training_flops(self):
        return self.flops_per_token * self.tokens_per_iter * self.iterations

    def as_dict(self):
        return dict(size=self.size, variant=self.variant, seed=self.seed, learning_rate=self.learning_rate,
                    iterations=self.iterations, **self.schedule,
                    flops_per_token=self.flops_per_token, tokens_per_iter=self.tokens_per_iter,
                    training_flops=self.training_flops, run_dir=str(self.run_dir))


def resolved_config(config_file, overrides):
    """train.py's own config for these arguments; its ConfigError becomes a SweepError."""
    try:
        return resolve_config(get_config([config_file, *overrides]))
    except ConfigError as e:
        raise SweepError(str(e)) from None


def model_flops_per_token(c):
    """Training FLOPs per token of the model this config builds, without training it (meta device:
    no memory is allocated). The vocabulary comes from the data's meta.json, as train.py takes it."""
    data_dir = config_data_dir(c)
    try:
        meta = read_meta(data_dir)
    except (FileNotFoundError, ValueError) as e:
        raise SweepError(str(e)) from None
    vocab_size = choose_vocab_size(c, meta, -1, data_dir)  # the data's largest id is train.py's check
    args = {key: c[key] for key in MODEL_ARG_KEYS} | {"vocab_size": vocab_size}
    with torch.device("meta"):
        return GPT(GPTConfig(**args)).flops_per_token()


def iterations_for_budget(budget, cost_per_iter, what):
    """The nearest whole number of iterations whose cost reaches the budget; a budget that rounds to
    none is an error, not one iteration far over it."""
    iterations = round(budget / cost_per_iter)
    if iterations < 1:
        raise SweepError(f"the budget {budget:.4g} is less than half an iteration of {what} ({cost_per_iter:.4g}): "
                         f"raise it")
    return iterations


def scaled_schedule(c, iterations, match):
    """max_iters, lr_decay_iters, warmup_iters and eval_interval for a run of `iterations` steps: the
    config's schedule stretched by iterations / max_iters, so the cosine ends where the run ends
    (with --match=iters, the config's own schedule, as it is)."""
    if match == "iters":
        return {key: c[key] for key in ("max_iters", "lr_decay_iters", "warmup_iters", "eval_interval")}
    factor = iterations / c["max_iters"]
    warmup = min(round(c["warmup_iters"] * factor), iterations - 1)
    return {"max_iters": iterations, "lr_decay_iters": iterations, "warmup_iters": warmup,
            "eval_interval": max(1, min(round(c["eval_interval"] * factor), iterations))}


def train_command(launcher, train_args):
    """The command line of one train.py run: under the sweep's --launcher (e.g. torchrun), or plain."""
    return (shlex.split(launcher) if launcher else [sys.executable]) + [str(REPO / "train.py"), *train_args]


def probe_seconds_per_iter(config_file, overrides, variant, probe_dir, probe_iters, launcher):
    """Seconds per training step of this variant on this machine, launched as the runs will be, from a
    short train.py run kept in probe_dir, so that a rerun plans the same iterations. A probe of other
    settings (another batch size, launcher or probe length) is run again."""
    settings = dict(attention=variant, out_dir=str(probe_dir), max_iters=probe_iters, lr_decay_iters=probe_iters,
                    warmup_iters=0, eval_interval=probe_iters, eval_iters=1, log_interval=probe_iters,
                    always_save_checkpoint=False)
    train_args = [config_file, *overrides, *(format_override(key, value) for key, value in settings.items())]
    record, summary = read_json(probe_dir / RECORD_NAME), read_json(probe_dir / SUMMARY_NAME)
    if not (record and record["launcher"] == launcher and same_plan(record["train_args"], train_args)
            and summary and summary["stop_reason"] == "max_iters"):
        shutil.rmtree(probe_dir, ignore_errors=True)
        probe_dir.mkdir(parents=True)
        with SignalForwarder() as forwarder, open(probe_dir / "probe.log", "w") as log:
            code = forwarder.run(train_command(launcher, train_args), stdout=log, stderr=subprocess.STDOUT)
        if forwarder.received:
            raise SweepInterrupted(forwarder.received)
        if code != 0:
            raise RunFailed(f"the timing probe of {variant} failed with exit code {code}; see {probe_dir / 'probe.log'}")
        write_text_atomic(probe_dir / RECORD_NAME, json.dumps({"launcher": launcher, "train_args": train_args}))
        summary = read_json(probe_dir / SUMMARY_NAME)
    return summary["mean_ms_per_iter"] / 1000


def cost_per_iter(match, c, flops_per_token, seconds):
    """What one iteration spends of the budget: 1 iteration, its tokens, its FLOPs or its seconds."""
    tokens = c["gradient_accumulation_steps"] * c["batch_size"] * c["block_size"]
    return {"iters": 1, "tokens": tokens, "flops": flops_per_token * tokens, "time": seconds}[match]


def learning_rate_settings(c, learning_rate):
    """The overrides of one learning rate of a sweep: the peak, and min_lr at the config's ratio to it
    (NanoGPT's configs end at a tenth of the peak). None: the config's own, no overrides."""
    if learning_rate is None:
        return {}
    if c["learning_rate"] == 0:
        raise SweepError("--learning_rates sets min_lr at the config's min_lr / learning_rate, but the config's "
                         "learning_rate is 0: set it (and min_lr) to the schedule's shape, e.g. 1e-3 and 1e-4")
    min_lr = float(f"{learning_rate * c['min_lr'] / c['learning_rate']:.12g}")  # 0.0003, not 0.00030000000000000003
    return {"learning_rate": learning_rate, "min_lr": min_lr}


def run_name(variant, learning_rate, seed):
    return f"{variant}-seed{seed}" if learning_rate is None else f"{variant}-lr{learning_rate:g}-seed{seed}"


def variant_costs(args, overrides, c, label, out_dir):
    """{variant: (training FLOPs per token, what one iteration spends of the budget)} at one size, for
    the sweep's variants and its reference; with --match=time each one's step is timed first."""
    costs = {}
    for variant in dict.fromkeys([*args.variants, args.reference]):
        cv = c | {"attention": variant}
        seconds = None
        if args.match == "time":
            seconds = probe_seconds_per_iter(args.config, overrides, variant, out_dir / "probes" / label / variant,
                                             args.probe_iters, args.launcher)
        flops_per_token = model_flops_per_token(cv)
        costs[variant] = (flops_per_token, cost_per_iter(args.match, cv, flops_per_token, seconds))
    return costs


def plan_size(args, overrides, shape, out_dir):
    """The runs of one size: each variant's iterations under the budget, for every learning rate of the
    sweep (the config's alone without --learning_rates) and every seed. Returns (label, budget, runs,
    the reference's FLOPs per token)."""
    shape_args = [format_override(key, value) for key, value in zip(SHAPE_KEYS, shape)] if shape else []
    c = resolved_config(args.config, overrides + shape_args)
    label = size_label(tuple(c[k] for k in SHAPE_KEYS))
    if args.match != "iters" and c["max_iters"] < 1:
        raise SweepError(f"--match={args.match} stretches the config's schedule by each run's iterations / max_iters: "
                         f"max_iters must be at least 1 (it is {c['max_iters']})")
    costs = variant_costs(args, overrides + shape_args, c, label, out_dir)
    budget = args.budget or costs[args.reference][1] * c["max_iters"]
    runs = {}
    for variant in args.variants:
        iterations = (c["max_iters"] if args.match == "iters"
                      else iterations_for_budget(budget, costs[variant][1], f"{variant} at {label}"))
        schedule = scaled_schedule(c, iterations, args.match)
        for lr, seed in ((lr, seed) for lr in args.learning_rates or [None] for seed in range(args.seeds)):
            run_dir = (out_dir / label if shape else out_dir) / run_name(variant, lr, seed)
            settings = dict(attention=variant, seed=seed, out_dir=str(run_dir), **schedule,
                            **learning_rate_settings(c, lr))
            train_args = [args.config, *overrides, *shape_args, *(format_override(k, v) for k, v in settings.items())]
            resolved_config(args.config, train_args[1:])  # every run's settings are checked before any trains
            runs[variant, lr, seed] = PlannedRun(
                size=label, variant=variant, seed=seed, iterations=iterations, schedule=schedule,
                flops_per_token=costs[variant][0], tokens_per_iter=cost_per_iter("tokens", c, 0, None),
                run_dir=run_dir, train_args=train_args, learning_rate=lr)
    return label, budget, runs, costs[args.reference][0]


def plan_sweep(args, overrides, out_dir):
    """Every run of the sweep, seeds outermost, then sizes (in order of the reference's FLOPs per token:
    a sweep shows its trend early, and the last size is the largest), then variants, then learning
    rates; and the budget of each size."""
    sized = sorted((plan_size(args, overrides, shape, out_dir) for shape in args.sizes or [None]),
                   key=lambda planned: planned[3])
    plan = [runs[variant, lr, seed] for seed in range(args.seeds) for _, _, runs, _ in sized
            for variant in args.variants for lr in args.learning_rates or [None]]
    return plan, {label: budget for label, budget, _, _ in sized}


# -----------------------------------------------------------------------------
# running train.py: one process per run, a signal passed on once, resumable

class SignalForwarder:
    """While the sweep runs, a SIGINT/SIGTERM to compare.py is passed to the running train.py (started
    in its own session, so a Ctrl-C in the terminal reaches it once, from here) and stops the sweep
    after that run has saved its checkpoint."""

    def __init__(self):
        self.process, self.received, self.previous = None, None, {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.received = signal.Signals(signum).name
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        return False

    def run(self, command, **popen_args):
        if self.received:
            raise SweepInterrupted(self.received)
        # in the sweep's own working directory: a relative config, data_dir or hellaswag_file names the
        # same file for train.py as for the plan
        self.process = subprocess.Popen(command, start_new_session=True, **popen_args)
        try:
            return self.process.wait()
        finally:
            self.process = None


def read_json(path):
    return json.loads(Path(path).read_text()) if Path(path).is_file() else None


def read_log(run_dir):
    path = Path(run_dir) / LOG_NAME
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def shell_join(words):
    """A command line as a user would type it: shlex's quoting, but a word holding single quotes
    (--wandb_run_name='1') in double quotes, where the shell takes them literally, rather than in
    shlex's '"'"' splices."""
    return " ".join(f'"{word}"' if "'" in word and not re.search(r'["$`\\!]', word) else shlex.quote(word)
                    for word in words)


def same_plan(recorded_args, train_args):
    """Whether two train.py argument lists name the same config file and override values, however the
    values are spelled (a folder recorded with --attention='standard' holds the plan --attention=standard)."""
    def settings(args):
        return args[0], dict(parse_override(arg) for arg in args[1:])

    try:
        return settings(recorded_args) == settings(train_args)
    except ConfigError:  # a recorded key train.py no longer knows: another plan
        return False


def run_status(run):
    """'done', 'resume' or 'new'; a run folder planned with other settings is an error."""
    record = read_json(run.run_dir / RECORD_NAME)
    if record is None:
        found = [name for name in (CHECKPOINT_NAME, SUMMARY_NAME, LOG_NAME, SHARDED_NAME) if (run.run_dir / name).exists()]
        if found:  # a plain train.py run, or a sweep's whose record is gone: not ours to overwrite
            raise SweepError(f"{run.run_dir} holds a training run ({', '.join(found)}) that this sweep did not plan "
                             f"(it has no {RECORD_NAME}): move it away, or choose another --out_dir")
        return "new"
    if not same_plan(record["train_args"], run.train_args):
        raise SweepError(f"{run.run_dir} holds a run planned with other settings (its {RECORD_NAME} differs): "
                         f"rerun the command that made it, or choose another --out_dir")
    summary = read_json(run.run_dir / SUMMARY_NAME)
    if summary and summary["stop_reason"] == "max_iters" and summary["iterations"] == run.iterations:
        return "done"
    if summary and diverged_in_a_learning_rate_sweep(run, summary):
        return "done"  # training it again would diverge again
    return "resume" if (run.run_dir / CHECKPOINT_NAME).exists() else "new"


def diverged_in_a_learning_rate_sweep(run, summary):
    """Whether a run of a --learning_rates sweep diverged: one of the sweep's results, where in any other
    sweep it is a failure."""
    return run.learning_rate is not None and summary["stop_reason"] == "diverged"


SEGMENT_KEYS = ("wall_time_s", "iterations_this_run", "mean_ms_per_iter", "peak_memory_bytes")


def record_run(run, segments):
    """compare_run.json: the arguments the run was planned with, and what each of its train.py
    processes so far (one, or one per resume) reported of its own segment."""
    write_text_atomic(run.run_dir / RECORD_NAME, json.dumps({"train_args": run.train_args, "segments": segments}))


def train_once(run, status, launcher, forwarder):
    """Train (or resume) one planned run; returns its summary."""
    record = read_json(run.run_dir / RECORD_NAME) if status == "resume" else None
    segments = record.get("segments", []) if record else []
    run.run_dir.mkdir(parents=True, exist_ok=True)
    record_run(run, segments)
    args = run.train_args + (["--init_from=resume"] if status == "resume" else [])
    command = train_command(launcher, args)
    print(shell_join(command), flush=True)
    code = forwarder.run(command)
    summary = read_json(run.run_dir / SUMMARY_NAME)
    diverged = summary is not None and diverged_in_a_learning_rate_sweep(run, summary)
    if summary is not None and (code == 0 or diverged):
        record_run(run, segments + [{key: summary[key] for key in SEGMENT_KEYS}])
    if forwarder.received:
        raise SweepInterrupted(forwarder.received)
    if diverged:
        print(f"{run.describe()} diverged: a result of the learning-rate sweep, which goes on", flush=True)
    elif code != 0:
        raise RunFailed(f"training {run.describe()}, failed with exit code {code}; "
                        f"its output is above, its files in {run.run_dir}")
    return summary


def over_segments(summary, segments):
    """A resumed run's wall time summed over its train.py processes, and its speed and peak memory over
    all of them, not only the last (whose few steps may be its warm-up)."""
    if not segments:
        return summary
    timed = [(max(s["iterations_this_run"] - 1, 1), s["mean_ms_per_iter"]) for s in segments
             if s["mean_ms_per_iter"] is not None]  # each segment's first step is its warm-up
    ms_per_iter = sum(n * ms for n, ms in timed) / sum(n for n, _ in timed) if timed else None
    memory = [s["peak_memory_bytes"] for s in segments if s["peak_memory_bytes"] is not None]
    return summary | {"wall_time_s": sum(s["wall_time_s"] for s in segments),
                      "mean_ms_per_iter": ms_per_iter,
                      "tokens_per_s": summary["tokens_per_iter"] / (ms_per_iter / 1000) if ms_per_iter else None,
                      "peak_memory_bytes": max(memory, default=None)}


def finished_summary(run):
    """A run's summary as the tables use it: its totals over every segment, and derived columns."""
    summary = over_segments(read_json(run.run_dir / SUMMARY_NAME), read_json(run.run_dir / RECORD_NAME).get("segments"))
    summary |= {"size": run.size, "seed": run.seed, "training_flops": run.flops_per_token * summary["tokens_per_iter"]
                * summary["iterations"], "tokens": summary["tokens_per_iter"] * summary["iterations"]}
    if run.learning_rate is not None:
        summary["learning_rate"] = run.learning_rate
    if summary.get("final_val_loss") is not None:
        summary["val_ppl"] = math.exp(summary["final_val_loss"])
    if summary.get("peak_memory_bytes") is not None:
        summary["peak_memory_mb"] = summary["peak_memory_bytes"] / 2**20
    return summary


def time_left(done_seconds, done_flops, planned_flops):
    if not done_flops:
        return "estimated time left: known after the first run"
    seconds = done_seconds / done_flops * planned_flops
    return f"estimated time left {seconds / 60:.1f} min"


def run_sweep(plan, launcher=""):
    """Train every planned run not already finished, in order; returns {run_dir: summary}. A signal stops
    the sweep (SweepInterrupted) once the running train.py has saved its checkpoint."""
    statuses = [run_status(run) for run in plan]  # every folder checked before anything trains
    spent_seconds = spent_flops = 0.0
    with SignalForwarder() as forwarder:
        for k, (run, status) in enumerate(zip(plan, statuses), 1):
            left = sum(r.training_flops for r, s in zip(plan[k - 1:], statuses[k - 1:]) if s != "done")
            head = f"\n=== run {k} of {len(plan)}: {run.describe()}, {run.iterations:,} iters"
            if status == "done":
                print(f"{head}: finished already, skipped", flush=True)
                continue
            print(f"{head}{' (resuming)' if status == 'resume' else ''}; "
                  f"{time_left(spent_seconds, spent_flops, left)}", flush=True)
            started = time.time()
            train_once(run, status, launcher, forwarder)
            spent_seconds += time.time() - started
            spent_flops += run.training_flops
    return {run.run_dir: finished_summary(run) for run in plan}


# -----------------------------------------------------------------------------
# tables

# (column, key in a run's summary, better: "low" / "high" / None for no ranking, format)
COLUMNS = [
    ("attn params/layer", "attention_params", "low", "{:,.0f}"),
    ("model params", "n_params", "low", "{:,.0f}"),
    ("FLOPs/token", "flops_per_token", "low", "{:,.0f}"),
    ("learning rate", "learning_rate", None, "{:g}"),  # the best of a --learning_rates sweep
    ("iterations", "iterations", None, "{:,.0f}"),
    ("tokens", "tokens", None, "{:,.0f}"),
    ("training FLOPs", "training_flops", None, "{:.3g}"),
    ("train loss", "final_train_loss", "low", "{:.4f}"),
    ("val loss", "final_val_loss", "low", "{:.4f}"),
    ("val ppl", "val_ppl", "low", "{:.2f}"),
    ("HellaSwag acc", "hellaswag_acc", "high", "{:.4f}"),
    ("HellaSwag acc_norm", "hellaswag_acc_norm", "high", "{:.4f}"),
    ("HellaSwag acc_char_norm", "hellaswag_acc_char_norm", "high", "{:.4f}"),
    ("ms/iter", "mean_ms_per_iter", "low", "{:.1f}"),
    ("tokens/s", "tokens_per_s", "high", "{:,.0f}"),
    ("peak memory (MB)", "peak_memory_mb", "low", "{:,.0f}"),
    ("wall time (s)", "wall_time_s", "low", "{:.1f}"),
]


def aggregate(runs):
    """Mean and standard deviation over seeds, per column."""
    table = {}
    for _, key, _, _ in COLUMNS:
        values = [run[key] for run in runs if run.get(key) is not None]
        if values:
            table[key] = {"mean": statistics.fmean(values),
                          "std": statistics.stdev(values) if len(values) > 1 else 0.0, "runs": values}
    return table


def rankings(results, key, better):
    """Rank 1 = best; equal values share a rank, as the paper's tables do."""
    means = {v: r[key]["mean"] for v, r in results.items() if key in r}
    ordered = sorted(set(means.values()), reverse=(better == "high"))
    return {v: ordered.index(m) + 1 for v, m in means.items()}


def loss_stats(losses):
    return {"mean": statistics.fmean(losses), "std": statistics.stdev(losses) if len(losses) > 1 else 0.0}


def mean_cell(stats, fmt, n_seeds):
    cell = fmt.format(stats["mean"])
    return cell + (" ± " + fmt.format(stats["std"]) if n_seeds > 1 and stats["std"] > 0 else "")


def markdown_table(results, n_seeds):
    """One row per variant (mean ± std over seeds), each ranked column's rank in parentheses."""
    columns = [c for c in COLUMNS if any(c[1] in r for r in results.values())]
    ranks = {key: rankings(results, key, better) for _, key, better, _ in columns if better}
    lines = ["| attention | " + " | ".join(title for title, *_ in columns) + " |", "|---|" + "---:|" * len(columns)]
    for variant, row in results.items():
        cells = [mean_cell(row[key], fmt, n_seeds) + (f" ({ranks[key][variant]})" if better else "")
                 if key in row else "n/a" for _, key, better, fmt in columns]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# the fit: loss against training compute, per variant over sizes

def fit_power_law(C, L, E=0.0):
    """A, alpha of L = E + A * C^-alpha from a least-squares line through log(L - E) against log C."""
    slope, intercept = np.polyfit(np.log(C), np.log(L - E), 1)
    return math.exp(intercept), -slope


def squared_residuals(C, L, E):
    A, alpha = fit_power_law(C, L, E)
    return float(np.sum((L - E - A * C ** -alpha) ** 2))


def fit_floor(C, L, grid_points=200, refinements=80):
    """The E in [0, min L) that minimises the squared residuals in L: a grid, then golden-section
    search between the grid points either side of the best one."""
    top = float(L.min()) * (1 - 1e-9)
    grid = np.linspace(0.0, top, grid_points, endpoint=False)
    best = int(np.argmin([squared_residuals(C, L, E) for E in grid]))
    lo, hi = grid[max(best - 1, 0)], grid[best + 1] if best + 1 < grid_points else top
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(refinements):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if squared_residuals(C, L, a) < squared_residuals(C, L, b):
            hi = b
        else:
            lo = a
    return (lo + hi) / 2


def why_no_fit(C):
    """Why val loss cannot be fitted against these per-size training FLOPs of one variant, or None."""
    if len(C) < 3:
        return f"{len(C)} size{'s' if len(C) != 1 else ''}; a fit needs 3"
    if max(C) < MIN_COMPUTE_SPAN * min(C):
        return (f"every size trained on about the same FLOPs (they span {max(C) / min(C):.2f}x): a profile at one "
                f"budget, not a curve")
    return None


def fit_loss_curve(C, L):
    """Saturating power law L = E + A C^-alpha from 4 points on, the plain power law (E = 0) from 3;
    None where why_no_fit says why not. C and L are per-size values of one variant."""
    C, L = np.asarray(C, dtype=float), np.asarray(L, dtype=float)
    if why_no_fit(C):
        return None
    E = fit_floor(C, L) if len(C) >= 4 else 0.0
    A, alpha = fit_power_law(C, L, E)
    residuals = L - (E + A * C ** -alpha)
    return {"law": "E + A*C^-alpha" if len(C) >= 4 else "A*C^-alpha", "E": E, "A": A, "alpha": alpha,
            "residuals": residuals.tolist(), "compute_range": [float(C.min()), float(C.max())]}


def compute_for_loss(fit, loss):
    """The compute at which the fitted curve reaches `loss`, or None outside the measured range (no
    extrapolation), or where the loss does not fall with compute."""
    if fit is None or loss <= fit["E"] or fit["alpha"] <= 0:
        return None
    C = (fit["A"] / (loss - fit["E"])) ** (1 / fit["alpha"])
    low, high = fit["compute_range"]
    return C if low * (1 - 1e-9) <= C <= high * (1 + 1e-9) else None


def variant_points(summaries, variant, labels, x_key, seed=None):
    """(x, mean val loss, its std over seeds) per size of one variant, in size order; one seed's if given."""
    points = []
    for label in labels:
        rows = [r for r in summaries if r["attention"] == variant and r["size"] == label
                and (seed is None or r["seed"] == seed) and r.get("final_val_loss") is not None]
        if rows:
            losses = [r["final_val_loss"] for r in rows]
            points.append((statistics.fmean(r[x_key] for r in rows), statistics.fmean(losses),
                           statistics.stdev(losses) if len(losses) > 1 else 0.0))
    return tuple(np.array(column) for column in zip(*points)) if points else (np.array([]),) * 3


def fitted_loss_at_largest(fit):
    return fit["E"] + fit["A"] * fit["compute_range"][1] ** -fit["alpha"]


def compute_ratio(summaries, labels, variant, reference, target=None, seed=None):
    """C_variant(target) / C_reference(target) from the fitted curves, or None when either is out of
    range. No target: the reference's fitted loss at its largest size (of this seed's curve)."""
    fits = [fit_loss_curve(*variant_points(summaries, v, labels, "training_flops", seed)[:2]) for v in (variant, reference)]
    if target is None and fits[1] is not None:
        target = fitted_loss_at_largest(fits[1])
    needed = [compute_for_loss(fit, target) for fit in fits] if target is not None else [None]
    return needed[0] / needed[1] if None not in needed else None


def analyse(summaries, labels, variants, reference, seeds, target=None):
    """Per variant: the fit of val loss against training FLOPs over sizes, and the compute it needs for
    the target loss as a ratio to the reference's. The default target is the reference's loss at its
    largest size as its fitted curve gives it (so the reference needs exactly its largest budget; its
    measured loss there, off the curve by a residual, could fall outside the range), or the measured
    loss when there is no fit."""
    points = {v: variant_points(summaries, v, labels, "training_flops")[:2] for v in variants}
    fits = {v: fit_loss_curve(*points[v]) for v in variants}
    per_seed_target = target  # None: each seed's own reference curve sets its target
    if target is None and fits.get(reference):
        target = fitted_loss_at_largest(fits[reference])
    elif target is None:
        reference_losses = variant_points(summaries, reference, labels, "training_flops")[1]
        target = float(reference_losses[-1]) if len(reference_losses) else None
    needs = {}
    for variant in variants:
        compute = None if target is None else compute_for_loss(fits[variant], target)
        needs[variant] = {"compute": compute, "ratio": None, "ratio_per_seed": []}
        if target is not None and reference in variants:
            needs[variant]["ratio"] = compute_ratio(summaries, labels, variant, reference, target)
            needs[variant]["ratio_per_seed"] = [compute_ratio(summaries, labels, variant, reference, per_seed_target,
                                                              seed) for seed in range(seeds)]
    return {"reference": reference, "target_loss": target, "fits": fits, "compute_for_target": needs,
            "no_fit": {v: why_no_fit(points[v][0]) for v in variants}}


def fit_cell(analysis, variant):
    fit = analysis["fits"][variant]
    if fit is None:
        return f"no fit ({analysis['no_fit'][variant]})"
    floor = f"E={fit['E']:.3f}, " if fit["law"].startswith("E") else ""
    rising = "; loss rises with compute" if fit["alpha"] <= 0 else ""
    return (f"{floor}A={fit['A']:.3g}, α={fit['alpha']:.3f} ({fit['law']}); "
            f"largest residual {max(fit['residuals'], key=abs):+.4f}{rising}")


def no_compute_reason(analysis, variant):
    """Why a variant's compute for the target loss is not known for a reason other than lying outside
    its measured range, or None."""
    fit = analysis["fits"].get(variant)
    if analysis["target_loss"] is None:
        return f"n/a: no {analysis['reference']} run sets the target"
    if fit is None:
        return f"n/a: no fit of {variant}"
    if fit["alpha"] <= 0:
        return f"n/a: {variant}'s loss rises with compute"
    return None


def compute_cell(analysis, variant):
    need = analysis["compute_for_target"][variant]
    if need["compute"] is not None:
        return f"{need['compute']:.3g}"
    return no_compute_reason(analysis, variant) or "out of range"


def ratio_cell(analysis, variant):
    need = analysis["compute_for_target"][variant]
    if need["ratio"] is None:
        return no_compute_reason(analysis, variant) or no_compute_reason(analysis, analysis["reference"]) or "out of range"
    seeds = [f"{r:.2f}x" if r is not None else "out of range" for r in need["ratio_per_seed"]]
    return f"{need['ratio']:.2f}x" + (f" (per seed: {', '.join(seeds)})" if len(seeds) > 1 else "")


def summary_table(summaries, labels, budgets, analysis, variants, n_seeds):
    """Per variant: the val loss at every size's budget, the fit, and the compute for the target loss."""
    target, reference = analysis["target_loss"], analysis["reference"]
    target_title = "compute for loss " + (f"{target:.4f}" if target is not None else "(none)")
    lines = ["| attention | " + " | ".join(f"val loss at {label} (budget {budgets[label]:.3g})" for label in labels)
             + f" | fit of val loss on training FLOPs | {target_title} | ratio to {reference} |",
             "|---|" + "---:|" * len(labels) + "---|---:|---:|"]
    for variant in variants:
        cells = []
        for label in labels:
            rows = [r["final_val_loss"] for r in summaries if r["attention"] == variant and r["size"] == label]
            cells.append(mean_cell(loss_stats(rows), "{:.4f}", n_seeds) if rows else "n/a")
        cells += [fit_cell(analysis, variant), compute_cell(analysis, variant), ratio_cell(analysis, variant)]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# learning rates: with --learning_rates, each variant is compared at its best

def val_losses_by_learning_rate(summaries, label, variant):
    """{learning rate: [final val loss of each seed, None where it diverged]} of one variant at one size."""
    losses = {}
    for r in summaries:
        if r["size"] == label and r["attention"] == variant:
            losses.setdefault(r["learning_rate"], []).append(r.get("final_val_loss"))
    return losses


def converged_losses_by_learning_rate(summaries, label, variant):
    """The same, in ascending order of learning rate, without the rates at which any seed diverged."""
    losses = val_losses_by_learning_rate(summaries, label, variant)
    return {lr: losses[lr] for lr in sorted(losses) if None not in losses[lr]}


def best_learning_rates(summaries, labels, variants):
    """{(size, variant): the learning rate with the lowest val loss, mean over seeds}, among those at
    which no seed diverged; a variant that diverged at every one has none."""
    best = {}
    for label, variant in ((label, variant) for label in labels for variant in variants):
        losses = converged_losses_by_learning_rate(summaries, label, variant)
        if losses:
            best[label, variant] = min(losses, key=lambda lr: statistics.fmean(losses[lr]))
    return best


def learning_rate_table(summaries, label, variants, grid, best, n_seeds):
    """Val loss per variant (rows) and learning rate (columns) at one size, each variant's best in bold;
    a best at either end of the grid is flagged, as the optimum may lie beyond it."""
    lines = ["| attention | " + " | ".join(f"lr {lr:g}" for lr in grid) + " | best |",
             "|---|" + "---:|" * (len(grid) + 1)]
    for variant in variants:
        losses, chosen = val_losses_by_learning_rate(summaries, label, variant), best.get((label, variant))
        cells = [learning_rate_cell(losses.get(lr), n_seeds) for lr in grid]
        cells = [f"**{cell}**" if lr == chosen else cell for lr, cell in zip(grid, cells)]
        edge = " (edge of the grid)" if len(grid) > 1 and chosen in (grid[0], grid[-1]) else ""
        cells.append(f"{chosen:g}{edge}" if chosen else "n/a")
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def learning_rate_cell(losses, n_seeds):
    if not losses:
        return "n/a"
    if None in losses:
        return f"diverged ({losses.count(None)} of {len(losses)} seeds)" if len(losses) > 1 else "diverged"
    return mean_cell(loss_stats(losses), "{:.4f}", n_seeds)


def keep_best_learning_rates(summaries, plan, labels, variants, n_seeds):
    """With a --learning_rates sweep: the report's section of val loss per learning rate, and the summaries
    and plan cut to each variant's best learning rate at each size, which the tables, the fit and the
    plots then compare. Without a sweep: no section, and everything as it was."""
    grid = sorted({r["learning_rate"] for r in summaries if "learning_rate" in r})
    if not grid:
        return None, summaries, plan, {}
    best = best_learning_rates(summaries, labels, variants)
    tables = "\n\n".join(f"### {label}\n\n{learning_rate_table(summaries, label, variants, grid, best, n_seeds)}"
                          for label in labels)
    section = ("## Learning rates\n\nFinal val loss at each peak learning rate (min_lr at the config's ratio to "
               "it). Every table after this one compares each variant at its best learning rate for that size "
               "(bold), the lowest mean val loss over seeds.\n\n" + tables)
    summaries = [r for r in summaries if r["learning_rate"] == best.get((r["size"], r["attention"]))]
    plan = [run for run in plan if run.learning_rate == best.get((run.size, run.variant))]
    return section, summaries, plan, best


# -----------------------------------------------------------------------------
# plots (matplotlib is optional)

def pyplot():
    """matplotlib.pyplot on a file backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot_losses(plt, logs, path):
    """Train and val loss of every variant against iterations and wall-clock time (first seed)."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    for i, (variant, log) in enumerate(logs.items()):
        color = f"C{i}"
        train_steps = [e for e in log if e.get("type") == "train"]
        # not the evaluation at initialisation (~ln(vocab)): a run evaluated only there and at its end
        # would draw a straight line between the two, which no run followed
        evals = [e for e in log if e.get("type") == "eval" and e["iter"] > 0]
        for ax, x in zip(axes, ("iter", "elapsed_s")):
            ax.plot([e[x] for e in train_steps], [e["loss"] for e in train_steps], color=color, alpha=0.25, lw=0.8)
            ax.plot([e[x] for e in evals], [e["val_loss"] for e in evals], color=color, marker="o", ms=3,
                    label=f"{variant} val")
            ax.plot([e[x] for e in evals], [e["train_loss"] for e in evals], color=color, ls="--", lw=1,
                    marker="x", ms=3, label=f"{variant} train (eval)")
    top = loss_axis_top(logs)
    if top is not None:
        axes[0].set_ylim(top=top)
    axes[0].set_xlabel("iteration")
    axes[1].set_xlabel("wall-clock seconds")
    axes[0].set_ylabel("loss")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, ncol=2)
    fig.suptitle("train (faint: every logged step; dashed: eval estimate) and val loss")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def loss_axis_top(logs):
    """The top of the loss axis: above every loss after the first tenth of each run, where the losses
    near initialisation would squash the curves that matter."""
    later = []
    for log in logs.values():
        last_iter = max((e["iter"] for e in log if "iter" in e), default=0)
        for e in log:
            if e.get("type") == "train" and e["iter"] >= last_iter / 10:
                later.append(e["loss"])
            elif e.get("type") == "eval" and e["iter"] > 0:
                later.append(e["val_loss"])
    if not later:
        return None
    return max(later) + 0.05 * (max(later) - min(later)) + 0.02


def label_log_axis(ax):
    """A log x axis labelled 200k, 500k, 1M: SI prefixes at 1, 2, 3 and 5 of each decade, decades alone
    on a long axis, evenly spaced values on a short one (under a factor of 4, where a log axis is nearly
    linear). matplotlib's own labels of an axis spanning about one decade, 3x10^12 beside 4x10^12, run
    into each other."""
    from matplotlib.ticker import EngFormatter, LogLocator, MaxNLocator, NullFormatter

    ax.set_xscale("log")
    low, high = ax.get_xlim()
    decades = math.log10(high / low)
    if decades < 0.6:
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5, steps=(1, 2, 5, 10)))
    else:
        ax.xaxis.set_major_locator(LogLocator(subs=(1, 2, 3, 5) if decades < 2 else (1,)))
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.xaxis.set_minor_formatter(NullFormatter())


def plot_frontier(plt, summaries, labels, variants, fits, path):
    """Val loss against training FLOPs (with the fits), parameters and wall-clock, one line per variant
    through its sizes (error bars: std over seeds); and the fits' residuals."""
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    views = [(axes[0, 0], "training_flops", "training FLOPs"), (axes[0, 1], "n_params", "parameters (total)"),
             (axes[1, 0], "wall_time_s", "wall-clock seconds (this machine)")]
    for i, variant in enumerate(variants):
        for ax, key, _ in views:
            x, loss, std = variant_points(summaries, variant, labels, key)
            ax.errorbar(x, loss, yerr=std, color=f"C{i}", marker="o", ms=4, capsize=3, label=variant)
        fit = fits[variant]
        if fit is not None:
            C = np.geomspace(*fit["compute_range"], 100)
            axes[0, 0].plot(C, fit["E"] + fit["A"] * C ** -fit["alpha"], color=f"C{i}", ls="--", lw=1)
            x = variant_points(summaries, variant, labels, "training_flops")[0]
            axes[1, 1].plot(x, fit["residuals"], color=f"C{i}", marker="o", label=variant)
    for ax, _, xlabel in views:
        label_log_axis(ax)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("val loss")
    label_log_axis(axes[1, 1])
    axes[1, 1].axhline(0, color="grey", lw=0.8)
    axes[1, 1].set_xlabel("training FLOPs")
    axes[1, 1].set_ylabel("val loss - fit")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle("val loss per variant through its sizes (dashed: fit of loss on training FLOPs)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_learning_rates(plt, summaries, labels, variants, best, path):
    """Val loss against the peak learning rate, a panel per size and a line per variant (mean over seeds,
    error bars their std; diverged rates left out); each variant's chosen rate ringed."""
    grid = sorted({r["learning_rate"] for r in summaries})
    fig, axes = plt.subplots(1, len(labels), figsize=(max(6.5, 4.5 * len(labels)), 4.2), squeeze=False)
    for ax, label in zip(axes[0], labels):
        for i, variant in enumerate(variants):
            losses = converged_losses_by_learning_rate(summaries, label, variant)
            stats = [loss_stats(seeds) for seeds in losses.values()]
            ax.errorbar(list(losses), [s["mean"] for s in stats], yerr=[s["std"] for s in stats], color=f"C{i}",
                        marker="o", ms=4, capsize=3, label=variant)
            if (label, variant) in best:
                chosen = best[label, variant]
                ax.plot(chosen, loss_stats(losses[chosen])["mean"], "o", ms=11, mfc="none", color=f"C{i}")
        ax.set_xscale("log")
        ax.set_xticks(grid, [f"{lr:g}" for lr in grid])  # the rates tried, as typed
        ax.minorticks_off()
        ax.set_title(label)
        ax.set_xlabel("peak learning rate")
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("val loss")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle("val loss against the peak learning rate (ringed: each variant's best)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -----------------------------------------------------------------------------
# the report

def write_report(out_dir, header, plan, budgets, summaries, variants, reference, seeds, extra):
    """results.md (a table per size, then the summary and the fit), results.json, loss.png of the
    largest size's first seed and frontier.png; returns the markdown."""
    labels, every_run, every_planned = list(budgets), summaries, [run.as_dict() for run in plan]
    lr_section, summaries, plan, best_lr = keep_best_learning_rates(summaries, plan, labels, variants, seeds)
    by_size = {label: {v: aggregate([r for r in summaries if r["size"] == label and r["attention"] == v])
                       for v in variants} for label in labels}
    analysis = analyse(summaries, labels, variants, reference, seeds)
    sections = [header] + ([lr_section] if lr_section else [])
    for label in labels:
        sections.append(f"## {label}\n\n{markdown_table(by_size[label], seeds)}")
    if len(labels) > 1:
        sections.append(f"## Summary\n\n{summary_table(summaries, labels, budgets, analysis, variants, seeds)}")
    markdown = "\n\n".join(sections) + "\n"
    write_text_atomic(out_dir / "results.md", markdown)
    write_text_atomic(out_dir / "results.json", json.dumps(
        {**extra, "budgets": budgets, "plan": every_planned, "results": by_size,
         "analysis": analysis, "runs": every_run,
         "best_learning_rates": {label: {v: lr for (size, v), lr in best_lr.items() if size == label}
                                 for label in labels} if best_lr else None}, indent=2, default=str))
    plt = pyplot()
    if plt is None:
        print("matplotlib is not installed: loss.png and frontier.png skipped (pip install matplotlib); "
              "the tables are written")
        return markdown
    largest = [run for run in plan if run.size == labels[-1] and run.seed == 0]
    if largest:
        plot_losses(plt, {run.variant: read_log(run.run_dir) for run in largest}, out_dir / "loss.png")
    if len(labels) > 1:
        plot_frontier(plt, summaries, labels, variants, analysis["fits"], out_dir / "frontier.png")
    if best_lr:
        plot_learning_rates(plt, every_run, labels, variants, best_lr, out_dir / "learning_rates.png")
    return markdown
