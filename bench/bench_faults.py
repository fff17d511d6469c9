"""
Fault injection, to run before a release (not a test: it takes minutes). It trains on the offline
stdlib corpus in a temporary folder and injects four kinds of fault:

    python bench/bench_faults.py         # 100 + 30 sharded kills, 6 signals, 10 divergences
    python bench/bench_faults.py --kills=20 --signals=3 --nans=4  # a quicker pass

kills    A chain of training processes, each resuming from the checkpoint of the one before and
         SIGKILLed at a random moment while it writes ckpt.pt (once its temporary file exists).
         After each kill the checkpoint must load, hold finite weights and every save the killed
         process reported; the next process must resume at its iteration. The last one runs to
         the end: its weights must equal, bit for bit, those of one uninterrupted run, and
         log.jsonl must hold each iteration once.
sharded  The same chain for FSDP (forked runs in torchrun's environment for one process), SIGKILLed
         in turn mid-write of the shards and right after a random rename or removal of the commit;
         the newest complete sharded folder must load and the next run resume at its iteration.
signals  2-process gloo DDP runs under torchrun stopped at a random moment: SIGTERM to torchrun,
         SIGINT to its process group, SIGTERM to its workers. Each must leave a checkpoint at the
         last logged iteration, then resume and finish (torchrun's own exit status after a signal
         is not 0: it reports the signal it got).
nans     A run whose loss or weights become NaN at a random iteration must stop with an error
         line, leave only finite checkpoints (the last one saved before the divergence) and resume.

The processes of the kill chain and of the divergences are forked from this one, so that a kill
costs no torch import (Linux only); the signal runs are real torchrun commands. The table gives,
per kind: runs, kills, corrupted checkpoints, failed resumes and lost iterations (iterations a
checkpoint should hold, because a save or a log line reported them, but does not).
"""

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
# AdamW imports it: imported here once, every forked run starts warm
import torch._dynamo  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the repo's modules, from bench/
sys.path.insert(0, str(REPO / "tests"))  # the fault helpers the tests use too
import checkpoint
import train
from checkpoint import CHECKPOINT_NAME, LOG_NAME, CheckpointError, first_non_finite, load_checkpoint
from faults import child_pids, nan_after_step, nan_loss_after
from machine import header
from model import GPT
from prepare_char import prepare, stdlib_corpus

# big enough that writing ckpt.pt (weights and AdamW moments, ~40 MB) takes a while to hit
KILL_MODEL = dict(n_layer=4, n_head=4, n_embd=256, block_size=64, batch_size=8, dropout=0.0)
SMALL_MODEL = dict(n_layer=2, n_head=2, n_embd=64, block_size=32, batch_size=4, dropout=0.0)
SAVED = re.compile(r"saved checkpoint to .* at iteration (\d+)")
RESUMED = re.compile(r"resuming from .* at iteration (\d+)")


def config_args(data_dir, out_dir, model, **overrides):
    config = dict(data_dir=str(data_dir), out_dir=str(out_dir), device="cpu", compile=False,
                  num_threads=1, eval_iters=2, log_interval=1, warmup_iters=0, learning_rate=1e-3,
                  min_lr=1e-4, gradient_accumulation_steps=1, always_save_checkpoint=True, **model)
    config.update(overrides)
    return [f"--{k}={v!r}" for k, v in config.items()]


# -----------------------------------------------------------------------------
# processes

def fork_train(args, stdout_path, before=None):
    """Run train.main(args) in a forked child (stdout and stderr to a file); return its pid."""
    pid = os.fork()
    if pid == 0:
        fd = os.open(stdout_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        if before is not None:
            before()
        status = train.main(args)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)  # the parent's interpreter state is not this child's to tear down
    return pid


def wait_status(pid):
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def reported(stdout_path, pattern):
    """The iterations a child printed for `pattern` (saves it finished, the iteration it resumed
    at)."""
    text = Path(stdout_path).read_text(errors="replace") if Path(stdout_path).exists() else ""
    return [int(m) for m in pattern.findall(text)]


def check_checkpoint(out_dir):
    """(iteration, None) for a checkpoint that loads and is finite, else (None, what is wrong)."""
    try:
        ckpt = load_checkpoint(out_dir)
    except CheckpointError as e:
        return None, str(e)
    bad = first_non_finite(ckpt)
    return (None, f"{bad} is not finite") if bad else (ckpt["iter_num"], None)


def logged_iterations(out_dir):
    lines = (Path(out_dir) / LOG_NAME).read_text().splitlines()
    return [r["iter"] for r in map(json.loads, lines) if r["type"] == "train"]


# -----------------------------------------------------------------------------
# SIGKILL while ckpt.pt is written

def temporary_files(out_dir):
    return set(Path(out_dir).glob(CHECKPOINT_NAME + ".*.tmp"))


def wait_for_save(out_dir, pid, stale, timeout=120):
    """"saving" once a new temporary checkpoint file exists; else the child's exit status, or
    "timeout" (the child is then still running)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if temporary_files(out_dir) - stale:
            return "saving"
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.0005)
    return "timeout"


def reference_run(args, out_dir, log, temporaries=temporary_files, before=None):
    """Run the uninterrupted reference while watching its temporary checkpoint files (or folders);
    return how long, on average, one existed (the window a kill must hit to land mid-write)."""
    pid, seen, lifetimes = fork_train(args, log, before), {}, []
    while not (done := os.waitpid(pid, os.WNOHANG))[0]:
        now, present = time.time(), temporaries(out_dir)
        for name in present - seen.keys():
            seen[name] = now
        for name in [n for n in seen if n not in present]:
            lifetimes.append(now - seen.pop(name))
        time.sleep(0.0005)
    assert os.waitstatus_to_exitcode(done[1]) == 0 and lifetimes, f"the reference run failed: {log}"
    return sum(lifetimes) / len(lifetimes)


def kill_once(args, out_dir, log, expected_start, delay):
    """Start a resumed (or first) run, SIGKILL it `delay` s into a save; return this kill's
    figures."""
    stale = temporary_files(out_dir)  # left by the previous kill; train.py removes them at start
    pid = fork_train(args, log)
    state = wait_for_save(out_dir, pid, stale)
    if state != "saving":
        if state == "timeout":
            os.kill(pid, signal.SIGKILL)
            wait_status(pid)
        return dict(failed_resume=1, note=f"no save reached ({state}): {log}")
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    wait_status(pid)
    during = bool(temporary_files(out_dir) - stale)
    resumed_at = reported(log, RESUMED)
    last_save = max(reported(log, SAVED), default=expected_start)
    if last_save == 0 and not (Path(out_dir) / CHECKPOINT_NAME).exists():
        iteration, problem = 0, None  # killed in the chain's first save: nothing to keep yet
    else:
        iteration, problem = check_checkpoint(out_dir)
    return dict(kill=1, during_save=int(during), corrupted=int(problem is not None),
                failed_resume=int(expected_start > 0 and resumed_at != [expected_start]),
                lost=max(0, last_save - (iteration or 0)), iteration=iteration, note=problem)


def kill_chain(data_dir, work, n_kills, rng):
    eval_interval = 2
    max_iters = eval_interval * (n_kills + 1)
    common = dict(model=KILL_MODEL, max_iters=max_iters, lr_decay_iters=max_iters,
                  eval_interval=eval_interval)
    reference = work / "kill-reference"
    ref_log = work / "kill-reference.txt"
    write_time = reference_run(config_args(data_dir, reference, **common), reference, ref_log)
    out = work / "kill-chain"
    totals, iteration = dict(runs=0, kill=0, during_save=0, corrupted=0, failed_resume=0, lost=0), 0
    for k in range(n_kills):
        args = config_args(data_dir, out, **common, init_from="resume" if iteration else "scratch")
        # about two kills in three mid-write, the others just after the rename (so the chain
        # advances)
        figures = kill_once(args, out, work / f"kill-{k}.txt", iteration,
                            rng.uniform(0, 1.5 * write_time))
        iteration = count_kill(totals, figures, f"kill {k}") or iteration
    finish_chain(data_dir, out, reference, common, iteration, totals, work)
    return totals, f"ckpt.pt takes {write_time * 1000:.0f} ms to write, {max_iters} iterations"


def count_kill(totals, figures, name):
    """Add one run of a kill chain to its totals; return the iteration its checkpoint holds."""
    for key in totals:
        totals[key] += figures.get(key, 0)
    totals["runs"] += 1
    if figures.get("note"):
        print(f"  {name}: {figures['note']}")
    return figures.get("iteration")


def finish_chain(data_dir, out, reference, common, iteration, totals, work, before=None):
    """The last run of the chain goes to the end; it must match the uninterrupted reference."""
    log = work / "kill-final.txt"
    args = config_args(data_dir, out, **common, init_from="resume" if iteration else "scratch")
    totals["runs"] += 1
    if wait_status(fork_train(args, log, before)) != 0:
        totals["failed_resume"] += 1
        print(f"  the final resume failed: {log}")
        return
    a, b = load_checkpoint(out)["model"], load_checkpoint(reference)["model"]
    totals["identical"] = all(torch.equal(a[k], b[k]) for k in b)
    totals["log_once"] = logged_iterations(out) == list(range(1, common["max_iters"] + 1))


# -----------------------------------------------------------------------------
# SIGKILL while a sharded (FSDP) checkpoint is written and committed

# the directory steps of checkpoint.settle_shards, at a commit or at the start of the next save
COMMIT_STEPS = [("rename", checkpoint.SHARDED_NAME, checkpoint.SHARDED_NAME + ".old"),
                ("rename", checkpoint.SHARDED_NAME + ".tmp", checkpoint.SHARDED_NAME),
                ("remove", checkpoint.SHARDED_NAME + ".old")]


def world_of_one():
    """In the forked child: torchrun's environment for one process, so that train.py shards (FSDP
    with one rank writes and commits its checkpoint as many ranks do)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))


def sigkill_after(step):
    """In the forked child: SIGKILL itself right after the first directory step equal to `step`."""
    real_replace, real_remove = os.replace, checkpoint._remove

    def replace(source, target):
        real_replace(source, target)
        if ("rename", Path(source).name, Path(target).name) == step:
            os.kill(os.getpid(), signal.SIGKILL)

    def remove(folder):
        existed = folder.exists()
        real_remove(folder)
        if existed and ("remove", folder.name) == step:
            os.kill(os.getpid(), signal.SIGKILL)

    os.replace, checkpoint._remove = replace, remove


def sharded_iteration(out_dir):
    """(iteration of the newest complete sharded folder, None) if it loads, else (None, what is
    wrong)."""
    try:
        return checkpoint.load_train_state(out_dir)["iter_num"], None
    except CheckpointError as e:
        return None, str(e)


def sharded_tmp(out_dir):
    return Path(out_dir) / (checkpoint.SHARDED_NAME + ".tmp")


def sharded_temporary(out_dir):
    """The sharded folder being written, as a set (what reference_run watches)."""
    return {sharded_tmp(out_dir)} if sharded_tmp(out_dir).exists() else set()


def made_since(folder, moment):
    try:
        return folder.stat().st_mtime >= moment  # a folder's mtime moves when an entry is added
    except OSError:  # not there (yet, or any more)
        return False


def sharded_kill_once(args, out_dir, log, expected_start, target, delay):
    """Start a resumed (or first) FSDP run and SIGKILL it: `delay` s into the write of its shards
    (target None), or right after a step of the commit; return this kill's figures."""
    tmp = sharded_tmp(out_dir)
    pid = fork_train(args, log, before=lambda: (world_of_one(), target and sigkill_after(target)))
    if target is None:
        # a .tmp folder left by the previous kill stays until this run's first save settles it: wait
        # for the one this run writes, or the kill lands before the run has even resumed
        started = time.time()
        while not made_since(tmp, started) and not os.waitpid(pid, os.WNOHANG)[0]:
            time.sleep(0.0005)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
    status = wait_status(pid)
    resumed_at = reported(log, RESUMED)
    kept = expected_start or checkpoint.newest_shards(out_dir) is not None
    iteration, problem = sharded_iteration(out_dir) if kept else (0, None)  # nothing kept yet
    last_save = max(reported(log, SAVED), default=expected_start)
    mid_write = target is None and tmp.exists() and not (tmp / checkpoint.TRAIN_STATE_NAME).exists()
    return dict(kill=int(status == -signal.SIGKILL), corrupted=int(problem is not None),
                mid_write=int(mid_write),
                failed_resume=int(expected_start > 0 and resumed_at != [expected_start]),
                lost=max(0, last_save - (iteration or 0)), iteration=iteration, note=problem)


def sharded_kill_chain(data_dir, work, n_kills, rng):
    """Kills in turn: mid-write of the shards at a random moment, then right after a random step of
    a commit (both rename windows and the removal of .old, so that one kill often follows
    another)."""
    eval_interval = 2
    max_iters = eval_interval * (n_kills + 1)
    common = dict(model=KILL_MODEL, max_iters=max_iters, lr_decay_iters=max_iters,
                  eval_interval=eval_interval, parallelism="fsdp")
    reference = work / "fsdp-reference"
    write_time = reference_run(config_args(data_dir, reference, **common), reference,
                               work / "fsdp-reference.txt", temporaries=sharded_temporary,
                               before=world_of_one)
    out = work / "fsdp-chain"
    totals, iteration = dict(runs=0, kill=0, corrupted=0, failed_resume=0, lost=0, in_commit=0,
                             mid_write=0), 0
    for k in range(n_kills):
        args = config_args(data_dir, out, **common, init_from="resume" if iteration else "scratch")
        target = rng.choice(COMMIT_STEPS) if k % 2 else None
        figures = sharded_kill_once(args, out, work / f"fsdp-kill-{k}.txt", iteration, target,
                                    rng.uniform(0, write_time))
        figures["in_commit"] = int(target is not None)
        iteration = count_kill(totals, figures, f"FSDP kill {k}") or iteration
    finish_chain(data_dir, out, reference, common, iteration, totals, work, before=world_of_one)
    return totals, (f"the shards take {write_time * 1000:.0f} ms to write and commit, "
                    f"{max_iters} iterations")


# -----------------------------------------------------------------------------
# SIGTERM / SIGINT to 2-process DDP runs

def launch_command(args):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            str(REPO / "train.py"), *args], env


def deliver(mode, proc):
    if mode == "SIGTERM to torchrun":
        proc.send_signal(signal.SIGTERM)
    elif mode == "SIGINT to the process group":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        for pid in child_pids(proc.pid):
            os.kill(pid, signal.SIGTERM)


def signal_once(data_dir, out, mode, delay):
    """One DDP run signalled `delay` s after its first logged step, then resumed to 2 more steps."""
    args = config_args(data_dir, out, SMALL_MODEL, max_iters=100000, lr_decay_iters=100000,
                       eval_interval=25, gradient_accumulation_steps=2)
    command, env = launch_command(args)
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    log = Path(out) / LOG_NAME
    deadline = time.time() + 180
    while time.time() < deadline and not (log.exists() and '"type": "train"' in log.read_text()):
        time.sleep(0.05)
    time.sleep(delay)
    deliver(mode, proc)
    _, stderr = proc.communicate(timeout=300)
    iteration, problem = check_checkpoint(out)
    figures = dict(runs=1, corrupted=int(problem is not None),
                   lost=(max(0, logged_iterations(out)[-1] - (iteration or 0)) if log.exists()
                         else 0))
    if problem is not None:
        print(f"  {mode}: exit status {proc.returncode}\n{stderr[-2000:]}")
    figures["failed_resume"] = int(iteration is None or not resume_ddp(data_dir, out, iteration))
    return figures


def resume_ddp(data_dir, out, iteration):
    args = config_args(data_dir, out, SMALL_MODEL, max_iters=iteration + 2, lr_decay_iters=100000,
                       eval_interval=25, gradient_accumulation_steps=2, init_from="resume")
    command, env = launch_command(args)
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    if result.returncode:
        print(f"  resume after a signal failed:\n{result.stderr[-2000:]}")
    return result.returncode == 0 and check_checkpoint(out)[0] == iteration + 2


def signal_runs(data_dir, work, n, rng):
    modes = ["SIGTERM to torchrun", "SIGINT to the process group", "SIGTERM to the workers"]
    totals = dict(runs=0, kill=0, corrupted=0, failed_resume=0, lost=0)
    for k in range(n):
        figures = signal_once(data_dir, work / f"signal-{k}", modes[k % len(modes)],
                              rng.uniform(0, 3))
        for key in figures:
            totals[key] += figures[key]
    return totals, ", ".join(modes[:n])


# -----------------------------------------------------------------------------
# NaN at a random iteration

def diverge_at(iteration, weights):
    """In the child: make the weights (after that optimizer step) or the loss (of that iteration)
    NaN."""
    if weights:
        torch.optim.AdamW.step = nan_after_step(torch.optim.AdamW.step, iteration)
    else:
        GPT.forward = nan_loss_after(GPT.forward, iteration)


def nan_once(data_dir, out, log, iteration, weights):
    args = config_args(data_dir, out, SMALL_MODEL, max_iters=40, lr_decay_iters=40, eval_interval=3)
    status = wait_status(fork_train(args, log, before=lambda: diverge_at(iteration, weights)))
    text = Path(log).read_text()
    stopped = status == 1 and "error: " in text and "Traceback" not in text
    checkpoint, problem = (check_checkpoint(out) if (Path(out) / CHECKPOINT_NAME).exists()
                           else (0, None))
    last_save = max(reported(log, SAVED), default=0)
    resumed = (wait_status(fork_train(args + ["--init_from='resume'"], str(log) + ".resume")) == 0
               if checkpoint else True)
    if not stopped:
        print(f"  divergence at iteration {iteration} did not stop with an error line: {log}")
    return dict(runs=1, corrupted=int(problem is not None or not stopped),
                failed_resume=int(not resumed), lost=max(0, last_save - (checkpoint or 0)))


def nan_runs(data_dir, work, n, rng):
    totals = dict(runs=0, kill=0, corrupted=0, failed_resume=0, lost=0)
    for k in range(n):
        figures = nan_once(data_dir, work / f"nan-{k}", work / f"nan-{k}.txt", rng.randint(2, 30),
                           weights=k % 2 == 1)
        for key in figures:
            totals[key] += figures[key]
    return totals, "NaN loss or NaN weights, alternately, at iterations 2-30"


# -----------------------------------------------------------------------------

def print_table(rows):
    print(f"\n{'fault':<34}{'runs':>6}{'kills':>7}{'corrupted':>11}{'failed resumes':>16}"
          f"{'lost iterations':>17}")
    for name, totals, note in rows:
        print(f"{name:<34}{totals['runs']:>6}{totals['kill']:>7}{totals['corrupted']:>11}"
              f"{totals['failed_resume']:>16}{totals['lost']:>17}   {note}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=100, help="SIGKILLs during checkpoint writes")
    parser.add_argument("--sharded_kills", type=int, default=30,
                        help="SIGKILLs during FSDP checkpoint writes and commits")
    parser.add_argument("--signals", type=int, default=6, help="signalled 2-process DDP runs")
    parser.add_argument("--nans", type=int, default=10,
                        help="runs that diverge at a random iteration")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work_dir", default="",
                        help="keep the runs here (default: a temporary folder)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if min(args.kills, args.sharded_kills, args.signals, args.nans) < 0:
        parser.error("--kills, --sharded_kills, --signals and --nans must be at least 0")
    torch.set_num_threads(1)
    print(header("bench_faults.py", argv, "cpu"), flush=True)  # one thread, as every run
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="bench_faults.") as tmp:
        work = Path(args.work_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        data_dir = work / "data"
        prepare(stdlib_corpus(max_chars=2_000_000), data_dir, "stdlib (bench_faults)")
        rows, t0 = [], time.time()
        if args.kills:
            totals, note = kill_chain(data_dir, work, args.kills, rng)
            rows.append(("SIGKILL while ckpt.pt is written", totals,
                         f"{totals['during_save']} mid-write (temporary file left), the rest "
                         f"just after the rename; {note}; final weights identical to an "
                         f"uninterrupted run: {totals.get('identical')}; "
                         f"log.jsonl one record per iteration: {totals.get('log_once')}"))
        if args.sharded_kills:
            totals, note = sharded_kill_chain(data_dir, work, args.sharded_kills, rng)
            rows.append(("SIGKILL in a sharded save (FSDP)", totals,
                         f"{totals['mid_write']} mid-write of the shards (an incomplete .tmp "
                         f"left), {totals['kill'] - totals['in_commit'] - totals['mid_write']} "
                         f"after the shards' write, {totals['in_commit']} right after a rename "
                         f"or removal of a commit; {note}; final weights identical to an "
                         f"uninterrupted run: {totals.get('identical')}; "
                         f"log.jsonl one record per iteration: "
                         f"{totals.get('log_once')}"))
        if args.signals:
            rows.append(("SIGTERM/SIGINT, 2-process DDP",
                         *signal_runs(data_dir, work, args.signals, rng)))
        if args.nans:
            rows.append(("NaN at a random iteration", *nan_runs(data_dir, work, args.nans, rng)))
        print_table(rows)
        print(f"\n{time.time() - t0:.0f}s in all")
    failed = any(t["corrupted"] or t["failed_resume"] or t["lost"] for _, t, _ in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
