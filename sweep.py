"""
The sweep behind compare.py: plan the runs of attention variants x model sizes x learning rates x
seeds under one budget (iterations, tokens, training FLOPs or wall-clock), each resolved to its
iterations and schedule before anything trains, then run each as its own train.py process,
resumable: a rerun skips finished runs and resumes an interrupted one. frontier.py turns the
runs' summaries into tables, fits and plots; docs/compare.md says what each budget means.

The accounting: training compute C = flops_per_token x tokens seen, where flops_per_token is the
model's own count (model.GPT.flops_per_token: forward + backward, attention's T-dependent terms and
super's W^A V included), not 6N.
"""

import json
import math
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from atomic import write_text_atomic
from checkpoint import CHECKPOINT_NAME, LOG_NAME, SUMMARY_NAME
from configurator import (MODEL_ARG_KEYS, ConfigError, format_override, get_config, naming_config_files,
                          parse_override, resolve_config, world_size_problem)
from data import check_data_dir, choose_vocab_size, config_data_dir
from distributed import SHARDED_NAME
from launcher import LaunchError, planned_world_size
from model import GPT, GPTConfig
from tokenizer import read_meta

REPO = Path(__file__).resolve().parent
MATCHES = ("iters", "tokens", "flops", "time")
RECORD_NAME = "compare_run.json"  # beside each run's files: the train.py arguments it was planned with
SHAPE_KEYS = ("n_layer", "n_head", "n_embd")
# named shapes (n_layer, n_head, n_embd): three CPU sizes, and GPT-2-like ones for a GPU (10-100M parameters)
SIZE_PRESETS = {
    "cpu-s": (2, 2, 64), "cpu-m": (4, 4, 128), "cpu-l": (6, 6, 192),
    "gpu-10m": (6, 6, 384), "gpu-30m": (8, 8, 512), "gpu-50m": (10, 10, 640), "gpu-85m": (12, 12, 768),
}


class SweepError(ValueError):
    """A sweep that cannot be planned or continued as asked; the message says how to fix it."""


class RunFailed(RuntimeError):
    """A train.py run exited with an error (its own output says why), or without training its whole plan
    (the message says how to go on)."""


class SweepInterrupted(RuntimeError):
    """A SIGINT/SIGTERM stopped the sweep once the running train.py had stopped; the message names the
    signal and what that run kept (its checkpoint, or none: a signal while train.py starts up ends it)."""


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
    settings: dict = None  # what its results depend on beyond train_args (planned_settings)

    def describe(self):
        lr = "" if self.learning_rate is None else f", learning rate {self.learning_rate:g}"
        return f"{self.variant} at {self.size}{lr}, seed {self.seed}"

    @property
    def training_flops(self):
        return self.flops_for(self.iterations)

    def flops_for(self, iterations):
        return self.flops_per_token * self.tokens_per_iter * iterations

    def as_dict(self):
        return dict(size=self.size, variant=self.variant, seed=self.seed, learning_rate=self.learning_rate,
                    iterations=self.iterations, **self.schedule,
                    flops_per_token=self.flops_per_token, tokens_per_iter=self.tokens_per_iter,
                    training_flops=self.training_flops, run_dir=str(self.run_dir))


def resolved_config(config_file, overrides, schedule_checked_per_run=False):
    """train.py's own config for these arguments; its ConfigError becomes a SweepError.
    schedule_checked_per_run: the config the budgets come from, whose lr_decay_iters no run keeps
    (scaled_schedule gives each its own, checked with the run), so not checked against warmup_iters."""
    set_by = {}
    try:
        c = get_config([config_file, *overrides], set_by=set_by)
        if schedule_checked_per_run:
            c["lr_decay_iters"] = max(c["lr_decay_iters"], c["warmup_iters"] + 1)
        return resolve_config(c)
    except ConfigError as e:
        raise SweepError(naming_config_files(e, set_by)) from None


def planned_settings(c):
    """What a run's results depend on beyond its arguments, kept in its record: the config they resolve
    to (a config file edited since gives other values for the same arguments) and the data's meta.json
    (a dataset prepared again from another text)."""
    return {"config": json.loads(json.dumps(c)), "data": data_meta(c)}


def data_meta(c):
    """The meta.json of the data a config trains on; a missing or bad one is a SweepError."""
    data_dir = config_data_dir(c)
    try:
        check_data_dir(data_dir)
        return read_meta(data_dir)
    except (FileNotFoundError, ValueError) as e:  # DataError is a ValueError
        raise SweepError(str(e)) from None


def settings_changed(recorded, settings):
    """What differs between a record's settings and the plan's, in words: "" when nothing does, or when
    the record is from before settings were kept. A key one of them lacks (a config key added to
    train.py since) is no difference."""
    if not recorded or settings is None:
        return ""
    then, now = recorded["config"], settings["config"]
    changed = changes(then, now, [key for key in now if key in then])
    if recorded["data"] != settings["data"]:
        changed.append("the data's meta.json")
    return ", ".join(changed)


def changes(then, now, keys):
    """'key=1 then, 2 now' for each of keys whose value differs between two dicts ('key not given then,
    2 now', 'key=1 then, not given now' where one lacks it)."""
    def was(key):
        return f"{key}={then[key]!r}" if key in then else f"{key} not given"

    return [f"{was(key)} then, {repr(now[key]) if key in now else 'not given'} now" for key in keys
            if (key in then, then.get(key)) != (key in now, now.get(key))]


def model_flops_per_token(c):
    """Training FLOPs per token of the model this config builds, without training it (meta device:
    no memory is allocated). The vocabulary comes from the data's meta.json, as train.py takes it."""
    vocab_size = choose_vocab_size(c, data_meta(c), -1, config_data_dir(c))  # the data's largest id is train.py's check
    args = {key: c[key] for key in MODEL_ARG_KEYS} | {"vocab_size": vocab_size}
    try:
        with torch.device("meta"):
            return GPT(GPTConfig(**args)).flops_per_token()
    except ValueError as e:  # a combination this variant refuses, e.g. grouped-query keys without W^K
        raise SweepError(f"attention={c['attention']!r}: {e}") from None


def iterations_for_budget(budget, cost_per_iter, what):
    """The nearest whole number of iterations whose cost reaches the budget; a budget that rounds to
    none is an error, not one iteration far over it."""
    iterations = round(budget / cost_per_iter)
    if iterations < 1:
        raise SweepError(f"the budget {budget:.4g} is less than half an iteration of {what} ({cost_per_iter:.4g}): "
                         f"raise it")
    return iterations


def scaled_schedule(c, iterations):
    """max_iters, lr_decay_iters, warmup_iters and eval_interval for a run of `iterations` steps: the
    config's schedule stretched by iterations / max_iters, so that the cosine ends where the run ends.
    --match=iters too (a factor of 1): a config's own lr_decay_iters may be far longer than the run
    (train_gpt2.py's 600,000 under --max_iters=5000, which would never decay)."""
    factor = iterations / c["max_iters"]
    warmup = min(round(c["warmup_iters"] * factor), iterations - 1)
    return {"max_iters": iterations, "lr_decay_iters": iterations, "warmup_iters": warmup,
            "eval_interval": max(1, min(round(c["eval_interval"] * factor), iterations))}


def train_command(launcher, train_args):
    """The command line of one train.py run: under the sweep's --launcher (e.g. torchrun), or plain."""
    return (shlex.split(launcher) if launcher else [sys.executable]) + [str(REPO / "train.py"), *train_args]


def train_arguments(config_file, overrides, own):
    """train.py's arguments: the config file, the sweep's overrides, then the --key=value arguments the
    sweep sets itself for this run (an override of the same key left out: each key is printed once)."""
    keys = {arg[2:].split("=", 1)[0] for arg in own}
    return [config_file, *(arg for arg in overrides if arg[2:].split("=", 1)[0] not in keys), *own]


def launcher_world_size(launcher):
    """How many train.py processes the sweep's --launcher starts: 1 without one; torchrun's count where
    it is fixed; None where it is not known here (an elastic --nnodes, a launcher of another kind,
    --nproc_per_node=gpu on a machine without one: torchrun itself says what is wrong, if anything)."""
    if not launcher:
        return 1
    words = shlex.split(launcher)
    torchrun_args = (words[1:] if Path(words[0]).name == "torchrun" else
                     words[3:] if words[1:3] == ["-m", "torch.distributed.run"] else None)
    try:
        return None if torchrun_args is None else planned_world_size(torchrun_args)
    except LaunchError:
        return None


def check_world_size(c, launcher):
    """A SweepError where the --launcher's processes do not split the config's steps: every run, and
    every timing probe, would fail as it started."""
    world_size = launcher_world_size(launcher)
    problem = world_size and world_size_problem(c, world_size)
    if problem:
        raise SweepError(f"under --launcher={launcher}: {problem}")


def probe_eval_iters(config_file, overrides, launcher):
    """A timing probe's evaluation, one batch (the least), or under FSDP one per process, which split them."""
    fsdp = resolved_config(config_file, overrides)["parallelism"] == "fsdp"
    return (launcher_world_size(launcher) or 1) if fsdp else 1


def probe_seconds_per_iter(config_file, overrides, variant, probe_dir, probe_iters, launcher):
    """Seconds per training step of this variant on this machine, launched as the runs will be, from a
    short train.py run kept in probe_dir, so that a rerun plans the same iterations. A probe of other
    settings (another batch size, launcher or probe length) is run again."""
    settings = dict(attention=variant, out_dir=str(probe_dir), max_iters=probe_iters, lr_decay_iters=probe_iters,
                    warmup_iters=0, eval_interval=probe_iters, log_interval=probe_iters, always_save_checkpoint=False,
                    eval_iters=probe_eval_iters(config_file, overrides, launcher))
    train_args = train_arguments(config_file, overrides, [format_override(k, v) for k, v in settings.items()])
    probed = planned_settings(resolved_config(config_file, train_args[1:]))
    record, summary = read_json(probe_dir / RECORD_NAME), read_json(probe_dir / SUMMARY_NAME)
    if not (record and record["launcher"] == launcher and not arguments_changed(record["train_args"], train_args)
            and record.get("settings") and not settings_changed(record["settings"], probed)
            and completed(summary, probe_iters)):
        shutil.rmtree(probe_dir, ignore_errors=True)
        probe_dir.mkdir(parents=True)
        with SignalForwarder() as forwarder, open(probe_dir / "probe.log", "w") as log:
            code = forwarder.run(train_command(launcher, train_args), stdout=log, stderr=subprocess.STDOUT)
        if forwarder.received:
            raise SweepInterrupted(f"{forwarder.received}: the timing probe of {variant} was stopped, and runs again")
        if code != 0:
            raise RunFailed(f"the timing probe of {variant} failed with exit code {code}; see {probe_dir / 'probe.log'}")
        summary = read_json(probe_dir / SUMMARY_NAME)
        if not completed(summary, probe_iters):  # its train.py stopped by a signal of its own
            raise RunFailed(f"the timing probe of {variant} stopped before its {probe_iters} steps; see "
                            f"{probe_dir / 'probe.log'}, and rerun the same command to probe again")
        write_text_atomic(probe_dir / RECORD_NAME, json.dumps({"launcher": launcher, "train_args": train_args,
                                                               "settings": probed}))
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


def run_folder(out_dir, shape, variant, learning_rate, seed):
    return (out_dir / size_label(shape) if shape else out_dir) / run_name(variant, learning_rate, seed)


def planned_run_dirs(args, out_dir):
    """The folders of every run the sweep plans, known before anything is probed or resolved."""
    return [run_folder(out_dir, shape, variant, lr, seed) for shape in args.sizes or [None] for variant in args.variants
            for lr in args.learning_rates or [None] for seed in range(args.seeds)]


def variant_costs(args, overrides, c, label, out_dir):
    """{variant: (training FLOPs per token, what one iteration spends of the budget)} at one size, for
    the sweep's variants and its reference; with --match=time each one's step is timed first."""
    costs = {}
    for variant in dict.fromkeys([*args.variants, args.reference]):
        cv = c | {"attention": variant}
        seconds = None
        if args.match == "time":
            check_world_size(cv, args.launcher)
            seconds = probe_seconds_per_iter(args.config, overrides, variant, out_dir / "probes" / label / variant,
                                             args.probe_iters, args.launcher)
        flops_per_token = model_flops_per_token(cv)
        costs[variant] = (flops_per_token, cost_per_iter(args.match, cv, flops_per_token, seconds))
    return costs


def size_overrides(config_file, overrides, shape):
    """The overrides of one --sizes size: n_layer, n_head and n_embd, and what the config ties to them at
    its own ratio, so that the sizes are one family: the MLP's hidden width to n_embd (SwiGLU's
    intermediate_size), the key/value heads of grouped-query attention to n_head."""
    base = resolved_config(config_file, overrides, schedule_checked_per_run=True)
    sized = dict(zip(SHAPE_KEYS, shape))
    if base["intermediate_size"]:
        sized["intermediate_size"] = max(1, round(base["intermediate_size"] * sized["n_embd"] / base["n_embd"]))
    if base["n_kv_head"]:
        if sized["n_head"] * base["n_kv_head"] % base["n_head"]:
            raise SweepError(f"size {size_label(shape)}: the config shares each key/value head among "
                             f"{base['n_head'] // base['n_kv_head']} query heads (n_kv_head={base['n_kv_head']}, "
                             f"n_head={base['n_head']}), which do not divide its n_head={sized['n_head']}: pick sizes "
                             f"whose n_head they divide")
        sized["n_kv_head"] = sized["n_head"] * base["n_kv_head"] // base["n_head"]
    return [format_override(key, value) for key, value in sized.items()]


def plan_size(args, overrides, shape, out_dir):
    """The runs of one size: each variant's iterations under the budget, for every learning rate of the
    sweep (the config's alone without --learning_rates) and every seed. Returns (label, budget, runs,
    the reference's FLOPs per token)."""
    shape_args = size_overrides(args.config, overrides, shape) if shape else []
    c = resolved_config(args.config, overrides + shape_args, schedule_checked_per_run=True)
    label = size_label(tuple(c[k] for k in SHAPE_KEYS))
    if c["max_iters"] < 1:
        raise SweepError(f"each run's schedule is the config's stretched by its iterations / max_iters: max_iters "
                         f"must be at least 1 (it is {c['max_iters']}): set --max_iters")
    if c["eval_only"]:
        raise SweepError("eval_only=True: a sweep trains every run (each would stop with nothing to evaluate); drop "
                         "it, and evaluate one finished run with its own command (printed as it ran), plus "
                         "--init_from=resume --eval_only=True")
    costs = variant_costs(args, overrides + shape_args, c, label, out_dir)
    budget = args.budget or costs[args.reference][1] * c["max_iters"]
    runs = {}
    for variant in args.variants:
        iterations = (c["max_iters"] if args.match == "iters"
                      else iterations_for_budget(budget, costs[variant][1], f"{variant} at {label}"))
        schedule = scaled_schedule(c, iterations)
        for lr, seed in ((lr, seed) for lr in args.learning_rates or [None] for seed in range(args.seeds)):
            run_dir = run_folder(out_dir, shape, variant, lr, seed)
            settings = dict(attention=variant, seed=seed, out_dir=str(run_dir), **schedule,
                            **learning_rate_settings(c, lr))
            train_args = train_arguments(args.config, overrides,
                                         [*shape_args, *(format_override(k, v) for k, v in settings.items())])
            run_config = resolved_config(args.config, train_args[1:])  # every run's is checked before any trains
            runs[variant, lr, seed] = PlannedRun(
                size=label, variant=variant, seed=seed, iterations=iterations, schedule=schedule,
                flops_per_token=costs[variant][0], tokens_per_iter=cost_per_iter("tokens", c, 0, None),
                run_dir=run_dir, train_args=train_args, learning_rate=lr, settings=planned_settings(run_config))
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
            raise SweepInterrupted(f"{self.received}, before the next run started")
        # in the sweep's own working directory: a relative config, data_dir or hellaswag_file names the
        # same file for train.py as for the plan
        self.process = subprocess.Popen(command, start_new_session=True, **popen_args)
        try:
            if self.process.stdout is not None:  # stdout=subprocess.PIPE: its output passed on by us
                relay_output(self.process)
            return self.process.wait()
        finally:
            self.process = None


def relay_output(process):
    """Pass a train.py's output on to our stdout, line by line: a train.py given our stdout itself would
    fail with a traceback, losing its steps since the last checkpoint, where the reader closes it early
    (`python compare.py | head -2`). Here the run is then stopped as a SIGTERM stops it (a checkpoint
    once it trains, silence before; a SIGINT while it imports torch would end it with a traceback), its
    remaining output dropped, and BrokenPipeError raised once it has exited: the sweep ends there, as
    runtime.run_script ends it, and a rerun resumes the run. Any other write error (a full disk under
    `> sweep.log`) stops the run the same way, and is a RunFailed."""
    with process.stdout as output:
        for line in output:
            try:
                sys.stdout.buffer.write(line)
                sys.stdout.buffer.flush()
            except OSError as e:
                process.terminate()
                output.read()  # until it exits: what it still writes must not fill the pipe and block it
                process.wait()
                if isinstance(e, BrokenPipeError):
                    raise
                raise RunFailed(f"writing compare.py's output failed ({e}), so the running train.py was stopped as a "
                                f"SIGTERM stops it: fix that, then rerun the same command to resume") from None


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


def arguments_changed(recorded_args, train_args):
    """What differs between two train.py argument lists, in words ('max_iters=20 then, 30 now'): "" when
    they name the same config file and override values, however the values are spelled (a folder
    recorded with --attention='standard' holds the plan --attention=standard)."""
    then, now = argument_values(recorded_args), argument_values(train_args)
    return ", ".join(changes(then, now, list(dict.fromkeys([*then, *now]))))


def argument_values(args):
    """{'config': the config file, key: value of each --key=value}, the values as train.py reads them."""
    values = {"config": args[0]}
    for arg in args[1:]:
        try:
            key, value = parse_override(arg)
        except ConfigError:  # recorded, but a key or value train.py no longer takes: its text, unlike any plan's
            key, _, value = arg.lstrip("-").partition("=")
        values[key] = value
    return values


def run_status(run):
    """'done', 'resume' or 'new'; a run folder planned with other settings is an error."""
    record = read_json(run.run_dir / RECORD_NAME)
    if record is None:
        found = [name for name in (CHECKPOINT_NAME, SUMMARY_NAME, LOG_NAME, SHARDED_NAME) if (run.run_dir / name).exists()]
        if found:  # a plain train.py run, or a sweep's whose record is gone: not ours to overwrite
            raise SweepError(f"{run.run_dir} holds a training run ({', '.join(found)}) that this sweep did not plan "
                             f"(it has no {RECORD_NAME}): move it away, or choose another --out_dir")
        return "new"
    changed = arguments_changed(record["train_args"], run.train_args)
    if changed:
        raise SweepError(f"{run.run_dir} holds a run planned with other settings (by its {RECORD_NAME}: {changed}): "
                         f"rerun the command that made it, or choose another --out_dir")
    changed = settings_changed(record.get("settings"), run.settings)
    if changed:
        raise SweepError(f"{run.run_dir} holds a run of the same arguments, but what they resolve to changed since it "
                         f"was planned (the config file, train.py's defaults or the data: {changed}): restore it, or "
                         f"choose another --out_dir")
    if finished(run, read_json(run.run_dir / SUMMARY_NAME)):
        return "done"
    return "resume" if (run.run_dir / CHECKPOINT_NAME).exists() else "new"


def completed(summary, iterations):
    """Whether a train.py summary is that of a run that trained all its planned iterations."""
    return summary is not None and summary["stop_reason"] == "max_iters" and summary["iterations"] == iterations


def finished(run, summary):
    """Whether a planned run is over: trained to its end, or diverged in a learning-rate sweep (training
    it again would diverge again)."""
    return completed(summary, run.iterations) or (summary is not None
                                                  and diverged_in_a_learning_rate_sweep(run, summary))


def diverged_in_a_learning_rate_sweep(run, summary):
    """Whether a run of a --learning_rates sweep diverged: one of the sweep's results, where in any other
    sweep it is a failure."""
    return run.learning_rate is not None and summary["stop_reason"] == "diverged"


def record_run(run):
    """compare_run.json: the arguments the run was planned with, and what they resolved to. (A resumed
    run's wall time, speed and memory over all its train.py processes are in its own summary.json; a
    record from before train.py kept them has its processes' own figures, its "segments", kept here.)"""
    kept = {k: v for k, v in (read_json(run.run_dir / RECORD_NAME) or {}).items() if k == "segments"}
    write_text_atomic(run.run_dir / RECORD_NAME,
                      json.dumps({"train_args": run.train_args, "settings": run.settings} | kept))


def file_version(path):
    """What tells one writing of a file from another (write_text_atomic replaces it: a new inode)."""
    stat = path.stat() if path.is_file() else None
    return stat and (stat.st_ino, stat.st_mtime_ns)


def train_once(run, status, launcher, forwarder):
    """Train (or resume) one planned run; returns its summary, which check_finished has found to be that
    of the whole run."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    record_run(run)
    args = run.train_args + (["--init_from=resume"] if status == "resume" else [])
    command = train_command(launcher, args)
    print(shell_join(command), flush=True)
    written_before = file_version(run.run_dir / SUMMARY_NAME)
    checkpoint_before = file_version(run.run_dir / CHECKPOINT_NAME)
    code = forwarder.run(command, stdout=subprocess.PIPE)
    # an earlier segment's summary is none of this process's: it wrote none ("nothing to train")
    fresh = file_version(run.run_dir / SUMMARY_NAME) not in (None, written_before)
    summary = read_json(run.run_dir / SUMMARY_NAME) if fresh else None
    diverged = summary is not None and diverged_in_a_learning_rate_sweep(run, summary)
    if forwarder.received:
        raise SweepInterrupted(f"{forwarder.received}: {what_was_kept(run, checkpoint_before)}")
    if diverged:
        print(f"{run.describe()} diverged: a result of the learning-rate sweep, which goes on", flush=True)
    elif code != 0:
        raise RunFailed(f"training {run.describe()}, failed with exit code {code}; "
                        f"its output is above, its files in {run.run_dir}")
    else:
        check_finished(run, summary)
    return summary


def what_was_kept(run, checkpoint_before):
    """Where the rerun takes up a run whose train.py a forwarded signal stopped: it saved a checkpoint,
    or the signal came before its first save (while train.py started up, say)."""
    if file_version(run.run_dir / CHECKPOINT_NAME) not in (None, checkpoint_before):
        return f"{run.describe()} saved its checkpoint, and resumes from it"
    if checkpoint_before is not None:
        return f"{run.describe()} stopped before it saved, and resumes from its earlier checkpoint"
    return f"{run.describe()} stopped before its first checkpoint, and starts again"


def check_finished(run, summary):
    """A train.py that exited cleanly without finishing its run (a SIGINT/SIGTERM sent to it alone, which
    compare.py does not see; or a resume of a checkpoint at the end whose summary.json was lost: "nothing
    to train") is an error, not a run to tabulate. `summary`: the one this train.py wrote, or None."""
    if summary is None:
        raise RunFailed(f"{run.describe()}: train.py exited without writing {run.run_dir / SUMMARY_NAME} (as when "
                        f"its checkpoint is at the run's end but the summary was lost, e.g. to a kill between the "
                        f"two; its output is above): delete {run.run_dir} and rerun the same command to train it again")
    if not finished(run, summary):
        raise RunFailed(f"{run.describe()} stopped at iteration {summary['iterations']:,} of {run.iterations:,} (its "
                        f"{SUMMARY_NAME} says stop_reason {summary['stop_reason']!r}, e.g. a signal sent to its "
                        f"train.py alone): rerun the same command to resume it, or delete {run.run_dir} to train it "
                        f"again")


def with_earlier_segments(summary, record):
    """A run a sweep resumed before train.py carried its totals: the segments its record kept (each
    train.py process's own figures) make up its wall time, speed and memory. Where its last process
    was one of them, the totals over them all; where a train.py that keeps totals resumed it later
    (from a checkpoint without them, so its summary counts from there), their wall time added."""
    segments = (record or {}).get("segments")
    if not segments:
        return summary
    if "wall_time_this_run_s" in summary:
        return summary | {"wall_time_s": summary["wall_time_s"] + sum(s["wall_time_s"] for s in segments)}
    timed = [(max(s["iterations_this_run"] - 1, 1), s["mean_ms_per_iter"]) for s in segments
             if s["mean_ms_per_iter"] is not None]  # each segment's first step is its warm-up
    ms_per_iter = sum(n * ms for n, ms in timed) / sum(n for n, _ in timed) if timed else None
    memory = [s["peak_memory_bytes"] for s in segments if s["peak_memory_bytes"] is not None]
    return summary | {"wall_time_s": sum(s["wall_time_s"] for s in segments), "mean_ms_per_iter": ms_per_iter,
                      "tokens_per_s": summary["tokens_per_iter"] / (ms_per_iter / 1000) if ms_per_iter else None,
                      "peak_memory_bytes": max(memory, default=None)}


def finished_summary(run):
    """A run's summary as the tables use it: its totals over every segment, and derived columns."""
    summary = with_earlier_segments(read_json(run.run_dir / SUMMARY_NAME), read_json(run.run_dir / RECORD_NAME))
    summary |= {"size": run.size, "seed": run.seed, "training_flops": run.flops_per_token * summary["tokens_per_iter"]
                * summary["iterations"], "tokens": summary["tokens_per_iter"] * summary["iterations"]}
    if run.learning_rate is not None:
        summary["learning_rate"] = run.learning_rate
    if summary.get("final_val_loss") is not None:
        summary["val_ppl"] = math.exp(summary["final_val_loss"])
    if summary.get("peak_memory_bytes") is not None:
        summary["peak_memory_mb"] = summary["peak_memory_bytes"] / 2**20
    if summary.get("mean_ms_per_iter") is not None:
        summary["step_seconds"] = summary["mean_ms_per_iter"] / 1000 * summary["iterations"]
    return summary


def time_left(done_seconds, done_flops, planned_flops):
    if not done_flops:
        return "estimated time left: known after the first run"
    seconds = done_seconds / done_flops * planned_flops
    return f"estimated time left {seconds / 60:.1f} min"


def flops_left(run, status):
    """The training FLOPs a planned run has still to spend: all, none when done, and for a resume those
    after the iteration its last train.py stopped at (as its summary says, where it wrote one)."""
    if status == "done":
        return 0
    stopped = read_json(run.run_dir / SUMMARY_NAME) if status == "resume" else None
    return run.flops_for(run.iterations - min(stopped["iterations"], run.iterations) if stopped else run.iterations)


def run_sweep(plan, launcher=""):
    """Train every planned run not already finished, in order; returns {run_dir: summary}. A signal stops
    the sweep (SweepInterrupted) once the running train.py has saved its checkpoint."""
    statuses = [run_status(run) for run in plan]  # every folder checked before anything trains
    for run, status in zip(plan, statuses):
        if status != "done":  # a finished sweep's tables may be written again on another machine
            check_world_size(run.settings["config"], launcher)
    spent_seconds = spent_flops = 0.0
    with SignalForwarder() as forwarder:
        for k, (run, status) in enumerate(zip(plan, statuses), 1):
            left = sum(flops_left(r, s) for r, s in zip(plan[k - 1:], statuses[k - 1:]))
            head = f"\n=== run {k} of {len(plan)}: {run.describe()}, {run.iterations:,} iters"
            if status == "done":
                print(f"{head}: finished already, skipped", flush=True)
                continue
            print(f"{head}{' (resuming)' if status == 'resume' else ''}; "
                  f"{time_left(spent_seconds, spent_flops, left)}", flush=True)
            started = time.time()
            summary = train_once(run, status, launcher, forwarder)
            spent_seconds += time.time() - started
            # a resume trains the part after its checkpoint; a diverged run stopped early
            spent_flops += run.flops_for(summary["iterations_this_run"])
    return {run.run_dir: finished_summary(run) for run in plan}
