"""checkpoint.py and atomic.py: only finite tensors are written, with the umask's permissions; a
file that is not one of our checkpoints is one error line; the out_dir lock; files written whole (on
disk before they replace the old one), and a killed writer's leftovers removed."""
import os
import stat
import subprocess
import sys

import pytest
import torch

import atomic
from atomic import write_text_atomic
from checkpoint import (LOCK_NAME, CheckpointError, first_non_finite, load_checkpoint, load_weights,
                        lock_out_dir, save_checkpoint)
from conftest import REPO
from model import GPT, GPTConfig


def small_checkpoint(value=1.0):
    return {"model_args": {}, "model": {"w": torch.full((3,), value)}, "iter_num": 1}


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_checkpoint_permissions_follow_the_umask(tmp_path, mask, mode):
    previous = os.umask(mask)
    try:
        save_checkpoint(small_checkpoint(), tmp_path / "ckpt.pt")
        write_text_atomic(tmp_path / "summary.json", "{}")  # the run's other files alike
    finally:
        os.umask(previous)
    for name in ("ckpt.pt", "summary.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_checkpoint_with_non_finite_weights_is_never_written(tmp_path, bad):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(small_checkpoint(), path)
    before = path.read_bytes()
    with pytest.raises(CheckpointError, match="w holds NaN or inf"):
        save_checkpoint(small_checkpoint(bad), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]  # no temporary file left


def test_non_finite_optimizer_state_is_found():
    ckpt = small_checkpoint()
    state = {"step": torch.tensor(3.0), "exp_avg_sq": torch.tensor([1.0, float("inf")])}
    ckpt["optimizer"] = {"state": {0: state}, "param_groups": []}
    assert first_non_finite(ckpt) == "optimizer state 0 exp_avg_sq"
    assert first_non_finite(small_checkpoint()) is None


class Payload:
    """An arbitrary Python object: what a malicious or foreign pickle holds."""


@pytest.mark.parametrize("damage", ["random bytes", "truncated", "pickled object", "not ours"])
def test_a_file_that_is_not_our_checkpoint_is_one_error_line(damage, tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(small_checkpoint(), path)
    if damage == "random bytes":
        path.write_bytes(os.urandom(4096))
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    elif damage == "pickled object":
        torch.save({"model_args": {}, "model": {}, "extra": Payload()}, path)
    else:
        torch.save({"weights": torch.zeros(2)}, path)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    assert "weights_only" not in str(err.value)  # never the advice to run a pickle's code


def test_weights_that_do_not_fit_are_one_error_line():
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    state = model.state_dict()
    state["transformer.wte.weight"] = torch.zeros(5, 16)
    with pytest.raises(CheckpointError) as err:
        load_weights(model, state, "out/ckpt.pt")
    assert "transformer.wte.weight" in str(err.value) and "\n" not in str(err.value)


def test_a_stale_lock_names_only_the_run_that_holds_it_now(tmp_path):
    """A run that died leaves its pid in train.lock (the kernel frees the lock, not the file)."""
    (tmp_path / LOCK_NAME).write_text("999999\n")
    lock = lock_out_dir(tmp_path)
    try:
        child = subprocess.run([sys.executable, "-c",
                                "import sys; from checkpoint import lock_out_dir; "
                                "lock_out_dir(sys.argv[1])", str(tmp_path)], cwd=REPO,
                               capture_output=True, text=True)
        assert child.returncode == 1 and f"(PID {os.getpid()})" in child.stderr
        # (read last: closing any descriptor of the file drops this process's POSIX lock)
        assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    finally:
        lock.close()


def test_an_atomic_file_reaches_the_disk_before_it_replaces_the_old_one(tmp_path, monkeypatch):
    """Renamed before fsync, a power loss could leave an empty file in place of the old one; and the
    rename itself is on disk only once the folder is fsynced."""
    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        info = os.fstat(fd)
        calls.append("fsync folder" if stat.S_ISDIR(info.st_mode)
                     else f"fsync {info.st_size} bytes")
        real_fsync(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(atomic.os, "replace",
                        lambda a, b: (calls.append("replace"), real_replace(a, b)))
    write_text_atomic(tmp_path / "summary.json", "{}")
    assert calls == ["fsync 2 bytes", "replace", "fsync folder"]
    assert (tmp_path / "summary.json").read_text() == "{}"


def test_a_writer_killed_mid_write_leaves_the_old_file_whole(tmp_path):
    """No handler runs on a SIGKILL: the old file stays as it was, beside the temporary one."""
    target = tmp_path / "ckpt.pt"
    target.write_text("old")
    writer = ("import sys, time\nfrom atomic import atomic_file\n"
              "with atomic_file(sys.argv[1]) as f:\n"
              "    f.write('half'); f.flush(); print('writing', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", writer, str(target)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "writing\n"
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert (target.read_text() == "old"
            and (tmp_path / f"ckpt.pt.{proc.pid}.tmp").read_text() == "half")
