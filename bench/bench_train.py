"""
Training throughput of any config through the real train.py, on random tokens: tokens/s, MFU,
peak memory, and the GPU-days a token budget (default: the paper's 30B C4 tokens) would take.

    python bench/bench_train.py                     # the two 1B configs, plain and FSDP, on a GPU
    python bench/bench_train.py config/train_gpt2.py --parallelisms=plain --batch_size=8
    python bench/bench_train.py --smoke --iters=4 --warmup_steps=1   # a tiny model, on a CPU

Each (config, parallelism) is one train.py run: 'plain' is `python train.py CONFIG`; 'ddp' and
'fsdp' run it under `torchrun --standalone --nproc_per_node=1` (one process: FSDP2's overhead and
memory, no communication). tokens/s is an iteration's tokens over the mean time of the
iterations after the first --warmup_steps (which pay for torch.compile); MFU is what train.py
logs, at that mean time. A failed run gets its last error line in its row; the next one goes on.
Any other --key=value goes to every train.py run, after the config.

Details: the learning rate is 0 (a step costs the same, the weights do not move); no run writes
a checkpoint (a 1B model's is ~15 GB); with --gradient_accumulation_steps=1 every micro-batch
pays a whole AdamW step, so tokens/s slightly underestimates the configs' own runs.
"""

import argparse
import contextlib
import ctypes
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the repo's modules, from bench/
from checkpoint import LOG_NAME, SUMMARY_NAME
from configurator import ConfigError, get_config, resolve_config
from machine import header
from runtime import resolve_device, sigterm_as_ctrl_c
from tokenizer import GPT2_VOCAB_SIZE, write_meta, write_tokens_atomically

DEFAULT_CONFIGS = ["config/train_llama1b_efficient_c4.py", "config/train_tinyllama_standard_c4.py"]
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]
# each way of running: (what runs train.py, the setting after the config)
PARALLELISMS = {"plain": ([], []), "ddp": (TORCHRUN, ["--parallelism=ddp"]),
                "fsdp": (TORCHRUN, ["--parallelism=fsdp"])}
# the model shrunk to run in seconds on a CPU (n_embd 64: TinyLlama's 32 heads keep an even d_k)
SMOKE = ["--n_layer=1", "--n_embd=64", "--intermediate_size=128", "--block_size=32",
         "--batch_size=2", "--compile=False"]
OWN_KEYS = ("out_dir", "data_dir", "max_iters", "init_from", "parallelism", "learning_rate",
            "min_lr")  # set here
FAILED_RUN_LINES = 25  # of a failed run's output, printed before its row
# an exception's line or train.py's "error: ..." (torchrun's workers prefix theirs "[rank0]: ")
ERROR_LINE = re.compile(r"^(?:\[[^\]]*\]:\s*)?((?:[\w.]+(?:Error|Exception)|error): .*)$")


# -----------------------------------------------------------------------------
# the runs

def write_random_data(folder, block_size, seed=0):
    """train.bin and val.bin of random GPT-2 token ids, and meta.json."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = np.random.default_rng(seed).integers(0, GPT2_VOCAB_SIZE, 65 * (block_size + 1))
    split = 64 * (block_size + 1)  # evaluation reads one batch of val
    write_tokens_atomically(folder / "train.bin", ids[:split])
    write_tokens_atomically(folder / "val.bin", ids[split:])
    write_meta(folder, {"tokenizer": "gpt2", "vocab_size": GPT2_VOCAB_SIZE,
                        "tokens": {"train": split, "val": len(ids) - split}})


def train_command(config, parallelism, out_dir, data_dir, args):
    """One run's command line: the config, then the bench's settings, then the user's."""
    bench = [f"--out_dir={out_dir}", f"--data_dir={data_dir}", f"--max_iters={args.iters}",
             f"--eval_interval={args.iters}", "--eval_iters=1", "--save_checkpoints=False",
             "--log_interval=1", "--hellaswag_interval=0", "--wandb_log=False",
             "--learning_rate=0.0", "--min_lr=0.0",
             f"--gradient_accumulation_steps={args.gradient_accumulation_steps}"]
    torchrun, settings = PARALLELISMS[parallelism]
    train = str(REPO / "train.py")
    return [sys.executable, *torchrun, train, config, *settings, *bench, *args.overrides]


def run_train(command, log_path, timeout):
    """Run one train.py to its end, or kill it after `timeout` seconds; its output to log_path.
    Returns None on success, else the reason as one line. The run never outlives the benchmark (a
    1B training left behind would hold the GPU): Ctrl-C or SIGTERM kills it first, and were the
    benchmark killed outright, the kernel kills the run."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log_path, "w") as log, sigterm_as_ctrl_c():
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True, preexec_fn=die_with_parent)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(process)
            return f"timed out after {timeout} s"
        except KeyboardInterrupt:
            kill_group(process)
            raise
    return None if code == 0 else f"exit code {code}: {last_error_line(log_path)}"


def children(pid):
    """The pids of a process's children (Linux's /proc; elsewhere none)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


def kill_group(process):
    """SIGKILL a run, hung or not: first the groups of torchrun's workers (each starts a session
    of its own, which a signal to torchrun's group misses), then the run's group."""
    for pid in children(process.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def die_with_parent():
    """In a run's process before it starts: the kernel SIGKILLs it when the benchmark dies, even
    by SIGKILL (Linux's PR_SET_PDEATHSIG; elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def last_error_line(log_path):
    """A failed run's last exception or 'error:' line, else its last line."""
    text = Path(log_path).read_text(errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [m.group(1) for m in map(ERROR_LINE.match, lines) if m]
    return (errors or lines or ["(no output)"])[-1]


def measure(out_dir, warmup_steps):
    """(tokens/s, MFU or None) over the iterations past the first warmup_steps, and the summary."""
    summary = json.loads((out_dir / SUMMARY_NAME).read_text())
    records = [json.loads(line) for line in (out_dir / LOG_NAME).read_text().splitlines()]
    timed = [r for r in records if r["type"] == "train" and r["iter"] > warmup_steps]
    mean_s = sum(r["ms_per_iter"] for r in timed) / len(timed) / 1000
    # train.py logs each step's MFU at that step's time; MFU x time is the same for every step
    last = timed[-1]
    mfu = None if last["mfu"] is None else last["mfu"] * last["ms_per_iter"] / 1000 / mean_s
    return summary["tokens_per_iter"] / mean_s, mfu, summary


def bench_one(config, parallelism, scratch, args):
    """One table row (a dict) for one config run one way."""
    name = f"{Path(config).stem}-{parallelism}"
    command = train_command(config, parallelism, scratch / name, scratch / "data", args)
    print(f"\n$ {shlex.join(command)}", flush=True)
    c = args.resolved[config]
    row = {"config": config, "parallelism": parallelism,
           "shape": f"{c['batch_size']} x {c['block_size']}"}
    log_path = scratch / f"{name}.log"
    row["error"] = run_train(command, log_path, args.timeout)
    if row["error"] is not None:  # the end of its output, which the scratch folder takes away
        tail = log_path.read_text(errors="replace").splitlines()[-FAILED_RUN_LINES:]
        print("\n".join(f"  | {line}" for line in tail), flush=True)
    else:
        row["tokens_per_s"], row["mfu"], summary = measure(scratch / name, args.warmup_steps)
        row.update(params=summary["n_params"], peak_memory=summary["peak_memory_bytes"],
                   wall_s=summary["wall_time_s"], world_size=summary["world_size"])
    print(table_row(row, args.budget_tokens), flush=True)  # in case a later run outlives the job
    return row


# -----------------------------------------------------------------------------
# the table

def table_header(args):
    days = "GPU-days" if args.device == "cuda" else "device-days"
    return ("| config | parallelism | params | micro-batch x context | tokens/s | MFU "
            f"| peak memory GiB | {days} for {args.budget_tokens:.3g} tokens | wall s | note |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---|")


def table_row(row, budget_tokens):
    start = f"| {row['config']} | {row['parallelism']}"
    if row["error"]:
        note = row["error"].replace("|", "\\|")[:300]
        return f"{start} | - | {row['shape']} | - | - | - | - | - | failed: {note} |"
    days = budget_tokens / (row["tokens_per_s"] / row["world_size"]) / 86400
    mfu = "-" if row["mfu"] is None else f"{100 * row['mfu']:.1f}%"
    return (f"{start} | {row['params']:,} | {row['shape']} | {row['tokens_per_s']:,.0f} | {mfu} "
            f"| {row['peak_memory'] / 2**30:.2f} | {days:,.1f} | {row['wall_s']:.0f} | |")


# -----------------------------------------------------------------------------

def parse_args(argv=None):
    # no abbreviations: what is not ours is a train.py setting (--seed is not --seeds)
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="*", help="train.py configs (default: the two 1B ones)")
    parser.add_argument("--parallelisms", default="plain,fsdp",
                        help=f"comma-separated among {', '.join(PARALLELISMS)}")
    parser.add_argument("--iters", type=int, default=30, help="training iterations per run")
    parser.add_argument("--warmup_steps", type=int, default=5,
                        help="first iterations left out of tokens/s (compilation)")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--budget_tokens", type=float, default=30e9,
                        help="tokens of the GPU-days column")
    parser.add_argument("--timeout", type=int, default=600,
                        help="seconds before a run is stopped and reported")
    parser.add_argument("--smoke", action="store_true",
                        help="shrink the model to run in seconds on a CPU: " + " ".join(SMOKE))
    parser.add_argument("--work_dir", default="",
                        help="keep the data and the runs' output here (default: a temp folder)")
    args, overrides = parser.parse_known_args(argv)
    args.parallelisms = args.parallelisms.split(",")
    if set(args.parallelisms) - set(PARALLELISMS):
        parser.error(f"--parallelisms: choose among {', '.join(PARALLELISMS)}")
    if not (0 <= args.warmup_steps < args.iters and args.gradient_accumulation_steps >= 1
            and args.timeout >= 1 and args.budget_tokens > 0):
        parser.error("need 0 <= --warmup_steps < --iters, --gradient_accumulation_steps >= 1, "
                     "--timeout >= 1 and --budget_tokens > 0")
    for override in overrides:
        if not override.startswith("--") or "=" not in override or \
                override[2:].split("=")[0] in OWN_KEYS:
            parser.error(f"{override!r}: pass train.py settings as --key=value, "
                         f"other than {', '.join(OWN_KEYS)}")
    if not args.configs and not args.smoke and not torch.cuda.is_available():
        parser.error("the default configs are 1B models and CUDA is not available here: "
                     "add --smoke to run them shrunk, or name a config")
    args.configs = args.configs or DEFAULT_CONFIGS
    args.overrides = (SMOKE if args.smoke else []) + overrides
    args.resolved = {config: resolved(parser, config, args.overrides) for config in args.configs}
    # where the runs train (maybe --device=cpu on a GPU machine): the header's machine, days' unit
    devices = {resolve_device(c["device"]).split(":")[0] for c in args.resolved.values()}
    args.device = devices.pop() if len(devices) == 1 else "cpu"
    return args


def resolved(parser, config, overrides):
    """The config as train.py will see it, checked before anything runs."""
    try:
        return resolve_config(get_config([config, *overrides]))
    except ConfigError as e:
        parser.error(str(e))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    print(header("bench_train.py", argv, args.device))
    timed = f"{args.warmup_steps + 1}-{args.iters}"
    print(f"# {args.iters} iterations per run, {args.gradient_accumulation_steps} micro-batch(es) "
          f"each; tokens/s and MFU over iterations {timed}", flush=True)
    scratch = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_train-")).resolve()
    try:
        write_random_data(scratch / "data", max(c["block_size"] for c in args.resolved.values()))
        rows = [bench_one(config, p, scratch, args)
                for config in args.configs for p in args.parallelisms]
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the run in progress was killed
        print("stopped: the run in progress was killed; the rows above are the runs that finished")
        return 130
    finally:
        if not args.work_dir:
            shutil.rmtree(scratch, ignore_errors=True)
    print("\n" + table_header(args))  # the rows again, together
    for row in rows:
        print(table_row(row, args.budget_tokens))
    return 1 if any(row["error"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
