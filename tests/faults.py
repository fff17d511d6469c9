"""Faults for the tests (and bench/bench_faults.py): a "kill" at an exact step of a sharded
checkpoint's commit, in-process, and NaN weights or losses from a chosen step on.

Killed is a BaseException raised right after the chosen rename or removal has happened: it unwinds
train() without another write (train() only releases its lock and process group on the way out), so
out_dir is left exactly as a SIGKILL at that moment would leave it."""
import os
from contextlib import contextmanager
from pathlib import Path

import torch

import checkpoint
import train


class Killed(BaseException):
    """Not an Exception: nothing in train.py catches it, as nothing catches a SIGKILL."""


@contextmanager
def kill_after(monkeypatch, event, at_iteration=None):
    """Raise Killed after the first directory step equal to `event`: ("rename", source name, target
    name) or ("remove", name) of a folder that existed; with at_iteration, only a step of the commit
    of that iteration's checkpoint."""
    real_replace, real_remove, real_commit = os.replace, checkpoint._remove, train.commit_shards
    committing = {"iter": None}

    def happened(step):
        if step == event and at_iteration in (None, committing["iter"]):
            raise Killed(step)

    def replace(source, target):
        real_replace(source, target)
        happened(("rename", Path(source).name, Path(target).name))

    def remove(folder):
        existed = folder.exists()
        real_remove(folder)
        if existed:
            happened(("remove", folder.name))

    def commit(out_dir, train_state):
        committing["iter"] = train_state["iter_num"]
        try:
            real_commit(out_dir, train_state)
        finally:
            committing["iter"] = None

    # os itself: atomic.py's renames pass through
    monkeypatch.setattr(checkpoint.os, "replace", replace)
    monkeypatch.setattr(checkpoint, "_remove", remove)
    monkeypatch.setattr(train, "commit_shards", commit)
    try:
        yield
    finally:
        monkeypatch.setattr(checkpoint.os, "replace", real_replace)
        monkeypatch.setattr(checkpoint, "_remove", real_remove)
        monkeypatch.setattr(train, "commit_shards", real_commit)


def nan_after_step(real_step, n):
    """An optimizer step method that runs real_step and, at its n-th call, writes NaN into one
    weight: a divergence that no loss shows yet (bench/bench_faults.py uses it too)."""
    calls = {"n": 0}

    def step(self, *args, **kwargs):
        result = real_step(self, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == n:
            with torch.no_grad():
                self.param_groups[0]["params"][0].view(-1)[0] = float("nan")
        return result

    return step


def nan_loss_after(real_forward, n):
    """A GPT.forward that returns a NaN loss from the (n+1)-th training forward pass on."""
    calls = {"n": 0}

    def forward(self, idx, targets=None, **kwargs):
        logits, loss = real_forward(self, idx, targets, **kwargs)
        if self.training and targets is not None:
            calls["n"] += 1
            if calls["n"] > n:
                loss = loss * float("nan")
        return logits, loss

    return forward


def alive(pid):
    """Whether a process runs (Linux's /proc): not ended, nor a zombie waiting for its parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def child_pids(parent):
    """The pids of the processes whose parent is `parent` (Linux's /proc): torchrun's workers."""
    pids = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            if stat_file.read_text().rsplit(")", 1)[1].split()[1] == str(parent):
                pids.append(int(stat_file.parent.name))
        except (OSError, IndexError):
            continue  # the process ended meanwhile
    return pids
