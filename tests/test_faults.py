"""Faults around checkpoints: a sharded (FSDP) checkpoint survives a kill at every step of its
commit, and a second kill during the next save (double faults); a damaged shard folder is one error
line that changes no file; a second run on a live out_dir stops at once; training processes stop
when their launcher is SIGKILLed. The sharded runs are in-process worlds of one (torchrun's
environment, no launch), whose checkpoints take the same path as those of many processes."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import train as T
from checkpoint import (SHARDED_NAME, TRAIN_STATE_NAME, load_checkpoint, load_train_state,
                        newest_shards, save_checkpoint)
from conftest import REPO
from faults import Killed, kill_after
from test_fsdp import assert_same_params, train_losses
from test_train import params, subprocess_env, tiny

# saves at iterations 2, 4, 6 and 8; dropout and accumulation, so that a resume is exact only if it
# restores every RNG stream and the AdamW moments
SHARDED = dict(max_iters=8, eval_interval=2, dropout=0.1, gradient_accumulation_steps=2,
               parallelism="fsdp")
FINAL, TMP, OLD = SHARDED_NAME, SHARDED_NAME + ".tmp", SHARDED_NAME + ".old"


def sharded_run(root, data_dir, **overrides):
    return T.train(tiny(root, data_dir, **{**SHARDED, **overrides}), verbose=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir):
    """8 iterations without a fault: its out_dir."""
    root = tmp_path_factory.mktemp("reference")
    env = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()))
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        sharded_run(root, data_dir)
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    return root / "out"


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def folders(out_dir):
    return sorted(p.name for p in out_dir.iterdir() if p.name.startswith(SHARDED_NAME))


def assert_same_run(out_dir, reference):
    assert_same_params(params(out_dir), params(reference))
    assert train_losses(out_dir) == train_losses(reference)


def test_complete_shard_folders_of_one_iteration_resume_from_the_one_written_last(tmp_path):
    """A kill between the renames of a commit can leave .old, the canonical folder and .tmp complete
    at the same iteration (a resume that saved at once): .tmp was written last, then the canonical
    one."""
    written_first_to_last = [tmp_path / (SHARDED_NAME + suffix) for suffix in (".old", "", ".tmp")]
    for folder in written_first_to_last:
        save_checkpoint({"iter_num": 5}, folder / TRAIN_STATE_NAME)
    for expected in reversed(written_first_to_last):
        assert newest_shards(tmp_path) == expected
        (expected / TRAIN_STATE_NAME).unlink()  # no longer complete
    assert newest_shards(tmp_path) is None


@pytest.mark.slow
def test_a_complete_tmp_folder_alone_resumes_exactly(reference, tmp_path, data_dir,
                                                     one_process_group):
    """What a kill between deleting .old and renaming .tmp left before: the only complete checkpoint
    under the temporary name."""
    sharded_run(tmp_path, data_dir, max_iters=4)
    out = tmp_path / "out"
    (out / FINAL).rename(out / TMP)
    assert load_train_state(out)["iter_num"] == 4 and load_train_state(out)["source"] == out / TMP
    sharded_run(tmp_path, data_dir, init_from="resume")
    assert folders(out) == [FINAL]
    assert_same_run(out, reference)


# every directory step of a commit: at iteration 4's save (the first kill), then at the resumed
# run's next save (the second), which first renames the .tmp its predecessor left, then commits its
# own
FIRST_KILLS = [("rename", FINAL, OLD), ("rename", TMP, FINAL), ("remove", OLD)]
SECOND_KILLS = [("rename", TMP, FINAL), ("remove", OLD), ("rename", FINAL, OLD)]


@pytest.mark.slow
@pytest.mark.parametrize("first", FIRST_KILLS, ids="-".join)
def test_a_kill_at_every_step_of_the_commit_resumes_exactly(first, reference, tmp_path, data_dir,
                                                            one_process_group, monkeypatch):
    with kill_after(monkeypatch, first, at_iteration=4), pytest.raises(Killed):
        sharded_run(tmp_path, data_dir)
    out = tmp_path / "out"
    assert load_train_state(out)["iter_num"] == 4  # the commit under way is never lost
    sharded_run(tmp_path, data_dir, init_from="resume")
    assert folders(out) == [FINAL]
    assert_same_run(out, reference)


@pytest.mark.slow
@pytest.mark.parametrize("second", SECOND_KILLS, ids="-".join)
def test_double_fault_resumes_exactly(second, reference, tmp_path, data_dir, one_process_group,
                                      monkeypatch):
    """Killed after the first rename of iteration 4's commit (.old and a complete .tmp left),
    resumed, killed again during the next save, resumed to the end: the run of no fault, bit for
    bit."""
    out = tmp_path / "out"
    with kill_after(monkeypatch, ("rename", FINAL, OLD), at_iteration=4), pytest.raises(Killed):
        sharded_run(tmp_path, data_dir)
    assert folders(out) == [OLD, TMP] and load_train_state(out)["source"] == out / TMP
    with kill_after(monkeypatch, second), pytest.raises(Killed):
        sharded_run(tmp_path, data_dir, init_from="resume")
    assert load_train_state(out)["iter_num"] >= 4
    sharded_run(tmp_path, data_dir, init_from="resume")
    assert_same_run(out, reference)


def snapshot(folder):
    """Every file's hash but train.lock's (it holds the pid of the last run that held it)."""
    return {p.relative_to(folder): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in folder.rglob("*") if p.is_file() and p.name != "train.lock"}


def damage(out, how):
    if how == "truncated shard":
        shard = sorted((out / FINAL).glob("*.distcp"))[0]
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    elif how == "truncated train_state.pt":
        state = out / FINAL / TRAIN_STATE_NAME
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    else:
        (out / FINAL / ".metadata").unlink()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["truncated shard", "missing .metadata",
                                 "truncated train_state.pt"])
def test_a_damaged_shard_folder_is_one_error_line(how, reference, tmp_path, data_dir,
                                                  one_process_group, capsys):
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    damage(out, how)
    before = snapshot(out)
    config = tiny(tmp_path, data_dir, **{**SHARDED, "max_iters": 10}, init_from="resume")
    args = [f"--{k}={v!r}" for k, v in config.items()]
    assert T.main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and str(out / FINAL) in err[0], err
    assert snapshot(out) == before


@pytest.mark.slow
@pytest.mark.parametrize("how", ["truncated shard", "truncated train_state.pt"])
def test_a_damaged_shard_folder_under_two_processes_is_said_once(how, reference, tmp_path,
                                                                 data_dir):
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    damage(out, how)
    before = snapshot(out)
    result = launch(tmp_path, tiny(tmp_path, data_dir, **{**SHARDED, "max_iters": 10},
                                   init_from="resume"))
    assert result.returncode != 0
    assert (result.stderr.count("error: ") == 1
            and str(out / FINAL) in result.stderr), result.stderr[-3000:]
    assert snapshot(out) == before


def launch(tmp_path, config, nproc=2):
    """train.py under stock torchrun, run to its end."""
    args = [f"--{k}={v!r}" for k, v in config.items()]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", str(REPO / "train.py"), *args]
    return subprocess.run(cmd, cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
                          timeout=240)


@pytest.mark.slow
def test_the_resume_line_names_the_shard_folder_it_read(tmp_path, data_dir, one_process_group,
                                                        capsys):
    sharded_run(tmp_path, data_dir, max_iters=4)
    out = tmp_path / "out"
    (out / FINAL).rename(out / TMP)
    T.train(tiny(tmp_path, data_dir, **SHARDED, init_from="resume"), verbose=True)
    assert f"resuming from {out / TMP} at iteration 4" in capsys.readouterr().out


def test_the_model_args_error_names_the_shard_folder(reference):
    model_args = {**load_checkpoint(reference)["model_args"], "n_layer": 3}
    with pytest.raises(T.CheckpointError, match=f"cannot resume from {reference / FINAL}:"):
        T.load_resume_checkpoint(reference, model_args, sharded=True)


# -----------------------------------------------------------------------------
# the out_dir lock

LONG = dict(max_iters=100000, lr_decay_iters=100000, eval_interval=5)


def start(tmp_path, config, command, log_name):
    """Start a long training in its own session, its output to a file (a pipe nobody reads would
    block it); return the process once it has written a checkpoint."""
    args = [f"--{k}={v!r}" for k, v in config.items()]
    with open(tmp_path / log_name, "w") as log:
        proc = subprocess.Popen([*command, *args], cwd=tmp_path, env=subprocess_env(), stdout=log,
                                stderr=log, start_new_session=True)
    deadline = time.time() + 120
    while not (Path(config["out_dir"]) / "ckpt.pt").exists():
        assert proc.poll() is None and time.time() < deadline, \
            (tmp_path / log_name).read_text()[-3000:]
        time.sleep(0.1)
    return proc


@pytest.mark.slow
def test_a_second_run_on_a_live_out_dir_stops_with_the_pid(tmp_path, data_dir, capsys):
    config = tiny(tmp_path, data_dir, **LONG)
    first = start(tmp_path, config, [sys.executable, str(REPO / "train.py")], "first.txt")
    try:
        # paused, holding its lock: the folder changes only if the second run writes
        first.send_signal(signal.SIGSTOP)
        before = {path: path.read_bytes() for path in (tmp_path / "out").iterdir()}
        assert T.main([f"--{k}={v!r}" for k, v in {**config, "init_from": "resume"}.items()]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: {tmp_path / 'out'} is in use by another training run "
                       f"(PID {first.pid}): wait for it, or choose another out_dir"]
        assert {path: path.read_bytes() for path in (tmp_path / "out").iterdir()} == before
    finally:
        first.send_signal(signal.SIGCONT)
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=60) == 0
    # the first run's checkpoint is its own: written at its SIGTERM, the last step it logged
    assert load_checkpoint(tmp_path / "out")["iter_num"] == json.loads(
        (tmp_path / "out" / "log.jsonl").read_text().splitlines()[-1])["iter"]
