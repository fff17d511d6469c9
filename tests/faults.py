"""Faults for the tests: a "kill" at an exact step of a sharded checkpoint's commit, in-process.

Killed is a BaseException raised right after the chosen rename or removal has happened: it unwinds
train() without another write (train() only releases its lock and process group on the way out), so
out_dir is left exactly as a SIGKILL at that moment would leave it."""
import os
from contextlib import contextmanager
from pathlib import Path

import distributed


class Killed(BaseException):
    """Not an Exception: nothing in train.py catches it, as nothing catches a SIGKILL."""


@contextmanager
def kill_after(monkeypatch, event, at_iteration=None):
    """Raise Killed after the first directory step equal to `event`: ("rename", source name, target
    name) or ("remove", name) of a folder that existed; with at_iteration, only a step of the commit
    of that iteration's checkpoint."""
    real_replace, real_remove, real_commit = os.replace, distributed._remove, distributed.commit_shards
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

    monkeypatch.setattr(distributed.os, "replace", replace)  # os itself: atomic.py's renames pass through
    monkeypatch.setattr(distributed, "_remove", remove)
    monkeypatch.setattr(distributed, "commit_shards", commit)
    try:
        yield
    finally:
        monkeypatch.setattr(distributed.os, "replace", real_replace)
        monkeypatch.setattr(distributed, "_remove", real_remove)
        monkeypatch.setattr(distributed, "commit_shards", real_commit)
