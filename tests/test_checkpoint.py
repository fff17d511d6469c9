"""checkpoint.py and atomic.py: what may be written (finite tensors only, with the umask's permissions),
what a file that is not one of our checkpoints is called when it is read, the out_dir lock, and files
written whole: on disk before they replace the old one, and a killed writer's leftovers removed."""
import errno
import os
import stat
import subprocess
import sys

import pytest
import torch

import atomic
from atomic import write_text_atomic
from checkpoint import (LOCK_NAME, CheckpointError, NonFiniteCheckpointError, first_non_finite, load_checkpoint,
                        load_weights, lock_out_dir, save_checkpoint)
from conftest import REPO
from model import GPT, GPTConfig


def small_checkpoint(value=1.0):
    return {"model_args": {}, "model": {"w": torch.full((3,), value)}, "iter_num": 1}


@pytest.fixture
def umask():
    """Set the process umask for one test, then restore it."""
    previous = os.umask(0o022)
    yield os.umask
    os.umask(previous)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_checkpoint_permissions_follow_the_umask(tmp_path, umask, mask, mode):
    umask(mask)
    path = tmp_path / "ckpt.pt"
    save_checkpoint(small_checkpoint(), path)
    assert stat.S_IMODE(path.stat().st_mode) == mode
    summary = tmp_path / "summary.json"  # the run's other files go through atomic.py too
    write_text_atomic(summary, "{}")
    assert stat.S_IMODE(summary.stat().st_mode) == mode


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_checkpoint_with_non_finite_weights_is_never_written(tmp_path, bad):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(small_checkpoint(), path)
    before = path.read_bytes()
    with pytest.raises(NonFiniteCheckpointError, match="w holds NaN or inf"):
        save_checkpoint(small_checkpoint(bad), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]  # no temporary file left either


def test_non_finite_optimizer_state_is_found():
    ckpt = small_checkpoint()
    ckpt["optimizer"] = {"state": {0: {"step": torch.tensor(3.0), "exp_avg_sq": torch.tensor([1.0, float("inf")])}},
                         "param_groups": []}
    assert first_non_finite(ckpt) == "optimizer state 0 exp_avg_sq"
    assert first_non_finite(small_checkpoint()) is None


def test_random_bytes_are_not_a_checkpoint_of_this_repo(tmp_path):
    path = tmp_path / "ckpt.pt"
    path.write_bytes(os.urandom(4096))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    assert "is not a checkpoint of this repo" in str(err.value)
    assert "weights_only" not in str(err.value)


def test_a_truncated_checkpoint_is_named_as_such(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(small_checkpoint(), path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="not a checkpoint of this repo.*truncated"):
        load_checkpoint(path)


class Payload:
    """An arbitrary Python object: what a malicious or foreign pickle holds."""


def test_a_pickled_object_is_refused_without_advising_weights_only_false(tmp_path):
    path = tmp_path / "ckpt.pt"
    torch.save({"model_args": {}, "model": {}, "extra": Payload()}, path)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    assert "is not a checkpoint of this repo" in str(err.value) and "Python objects" in str(err.value)
    assert "weights_only" not in str(err.value)


def test_weights_that_do_not_fit_say_which_keys():
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    state = model.state_dict()
    del state["lm_head.weight"]
    state["stray.weight"] = torch.zeros(2)
    state["transformer.wte.weight"] = torch.zeros(5, 16)
    with pytest.raises(CheckpointError) as err:
        load_weights(model, state, "out/ckpt.pt")
    message = str(err.value)
    assert "missing: lm_head.weight" in message and "unexpected: stray.weight" in message
    assert "transformer.wte.weight (5, 16) instead of (32, 16)" in message and "\n" not in message


def test_a_weight_that_is_not_a_tensor_is_a_checkpoint_error():
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    state = model.state_dict()
    state["lm_head.weight"] = [1.0, 2.0]
    with pytest.raises(CheckpointError, match="do not load"):
        load_weights(model, state, "out/ckpt.pt")


def test_a_stale_lock_names_only_the_run_that_holds_it_now(tmp_path):
    """A run that died leaves its pid in train.lock (the kernel frees the lock, not the file): the next
    run replaces it, so that a third run is told the live pid alone."""
    (tmp_path / LOCK_NAME).write_text("999999\n")
    lock = lock_out_dir(tmp_path)
    try:
        assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    finally:
        lock.close()


def test_an_atomic_file_reaches_the_disk_before_it_replaces_the_old_one(tmp_path, monkeypatch):
    """Renamed before fsync, a power loss could leave an empty file in place of the old checkpoint; and
    the rename itself is on disk only once the folder is fsynced."""
    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        info = os.fstat(fd)  # a file's size: what Python buffered is written to it before its fsync
        calls.append("fsync folder" if stat.S_ISDIR(info.st_mode) else f"fsync file of {info.st_size} bytes")
        real_fsync(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: (calls.append("replace"), real_replace(a, b))[1])
    write_text_atomic(tmp_path / "summary.json", "{}")
    expected = ["fsync file of 2 bytes", "replace"] + ["fsync folder"] * (os.name == "posix")
    assert calls == expected and (tmp_path / "summary.json").read_text() == "{}"


@pytest.mark.parametrize("refused", ["fsync", "open"])
def test_a_folder_that_cannot_be_fsynced_still_takes_the_file(refused, tmp_path, monkeypatch):
    """Some mounts refuse fsync on a folder (EINVAL), and a folder without read permission cannot be opened
    (EACCES): the rename is done, and the write is not an error."""
    real_fsync, real_open = os.fsync, os.open

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "Invalid argument")
        real_fsync(fd)

    def open_(path, flags, *args, **kwargs):
        if os.path.isdir(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(atomic.os, refused, fsync if refused == "fsync" else open_)
    write_text_atomic(tmp_path / "summary.json", "{}")
    assert (tmp_path / "summary.json").read_text() == "{}"


def test_each_write_closes_the_folder_it_fsynced(tmp_path, monkeypatch):
    """A run saves every eval_interval: a folder descriptor left open at each would in the end exhaust the
    process's limit on open files, and every later save would fail."""
    opened, closed = [], []
    real_open, real_close = os.open, os.close

    def open_(*args, **kwargs):
        opened.append(real_open(*args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(atomic.os, "open", open_)
    monkeypatch.setattr(atomic.os, "close", lambda fd: (closed.append(fd), real_close(fd))[1])
    for text in ("{}", "[]", "{}"):
        write_text_atomic(tmp_path / "summary.json", text)
    assert len(opened) == (3 if os.name == "posix" else 0) and closed == opened


def test_a_writer_killed_mid_write_leaves_a_file_the_next_writer_removes(tmp_path):
    """No handler runs on a SIGKILL: the temporary file stays, named with its writer's pid, so that a
    later run can tell it from one a live process is still writing, and remove it."""
    target = tmp_path / "ckpt.pt"
    writer = ("import sys, time\nfrom atomic import atomic_file\nwith atomic_file(sys.argv[1]) as f:\n"
              "    f.write('half'); f.flush(); print('writing', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", writer, str(target)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "writing\n"
        assert atomic.remove_abandoned(target) == []  # its writer is alive
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    left = [tmp_path / f"ckpt.pt.{proc.pid}.tmp"]
    assert sorted(tmp_path.iterdir()) == left
    assert atomic.remove_abandoned(target) == left and not any(tmp_path.iterdir())


def test_a_temporary_file_of_another_users_writer_is_left_be(tmp_path, monkeypatch):
    """os.kill(pid, 0) on another user's live process is refused (EPERM), not ProcessLookupError: its
    writer may still be filling the file, as a gone writer's (ESRCH) cannot."""
    target = tmp_path / "ckpt.pt"
    (tmp_path / "ckpt.pt.4242.tmp").write_text("half")

    def kill(pid, sig):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(atomic.os, "kill", kill)
    assert atomic.remove_abandoned(target) == [] and (tmp_path / "ckpt.pt.4242.tmp").exists()


def test_why_a_folder_is_not_writable_names_the_path_the_system_refused(tmp_path):
    folder = tmp_path / "out"
    error = PermissionError(errno.EACCES, "Permission denied", str(folder / "ckpt.pt.7.tmp"))
    assert atomic.why_not_writable(folder, error) == f"Permission denied: {folder / 'ckpt.pt.7.tmp'}"
    (tmp_path / "a_file").write_text("")
    error = NotADirectoryError(errno.ENOTDIR, "Not a directory", str(tmp_path / "a_file" / "out"))
    in_the_way = f"{tmp_path / 'a_file'} is a file, not a folder"
    assert atomic.why_not_writable(tmp_path / "a_file" / "out", error) == in_the_way
