"""train.py: the config, what a run writes, exact resume, DDP == 1 process, signals, NaN, errors.

Everything runs on CPU with tiny models; an in-process run takes about a second."""
import importlib.machinery
import json
import math
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import types

import numpy as np
import pytest
import torch

import eval_hellaswag
import runlog
import train as T
from checkpoint import CHECKPOINT_NAME, load_checkpoint, lock_out_dir, save_checkpoint
from configurator import DEFAULT_CONFIG, get_config, resolve_config
from conftest import REPO, TEXT, VARIANTS
from faults import nan_after_step
from model import GPT, PRETRAINED_GPT2, GPTConfig
from prepare_char import prepare
from tokenizer import write_meta


def tiny(tmp_path, data_dir, **overrides):
    config = dict(
        out_dir=str(tmp_path / "out"), data_dir=str(data_dir), device="cpu", compile=False,
        num_threads=1, n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=4,
        gradient_accumulation_steps=1, max_iters=8, eval_interval=4, eval_iters=2, log_interval=1,
        warmup_iters=2, lr_decay_iters=8, learning_rate=1e-3, min_lr=1e-4, beta2=0.99, dropout=0.0,
        always_save_checkpoint=True,
    )
    config.update(overrides)
    return config


def params(out_dir):
    return load_checkpoint(out_dir)["model"]


def subprocess_env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env.pop("RANK", None)
    return env


def argv(config):
    return [f"--{k}={v!r}" for k, v in config.items()]


def read_log(out_dir):
    return [json.loads(line) for line in (out_dir / "log.jsonl").read_text().splitlines()]


def log_iters(out_dir, kind):
    return [r["iter"] for r in read_log(out_dir) if r["type"] == kind]


def log_losses(out_dir):
    return {r["iter"]: r["loss"] for r in read_log(out_dir) if r["type"] == "train"}


def files(out_dir):
    return {path.name: path.read_bytes() for path in out_dir.iterdir()}


def assert_one_error_line(err, *words):
    """What a user's mistake prints: one line on stderr, "error: ...", holding each of words."""
    assert err.startswith("error: ") and err.count("\n") == 1 and err.endswith("\n"), err[-3000:]
    for word in words:
        assert word in err, (word, err)


def main_fails(capsys, config, *words):
    """train.py with config (a dict, or the arguments) exits 1 with one error line; its stdout."""
    assert T.main(argv(config) if isinstance(config, dict) else config) == 1
    out, err = capsys.readouterr()
    assert_one_error_line(err, *words)
    return out


def on_training_forward(monkeypatch, loss_of):
    """The n-th training forward pass (from 1) returns loss_of(n, loss); returns the count."""
    real_forward, calls = GPT.forward, {"n": 0}

    def forward(self, idx, targets=None, **kwargs):
        logits, loss = real_forward(self, idx, targets, **kwargs)
        if self.training and targets is not None:
            calls["n"] += 1
            loss = loss_of(calls["n"], loss)
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward)
    return calls


def signal_at(monkeypatch, n, sig=signal.SIGINT):
    """sig in the n-th training forward pass (iteration n - 1 with one micro-step); sig=None: die
    there, as a SIGKILL would (nothing in train.py catches a KeyboardInterrupt)."""
    def loss_of(call, loss):
        if call == n and sig is None:
            raise KeyboardInterrupt
        if call == n:
            os.kill(os.getpid(), sig)
        return loss
    return on_training_forward(monkeypatch, loss_of)


# -----------------------------------------------------------------------------
# configuration

def test_overrides_parse_as_python_literals():
    config = get_config(["--max_iters=10", "--learning_rate=1e-3", "--compile=False",
                         "--attention=efficient", "--out_dir='out-x'", "--dropout=0",
                         "--wandb_run_name=2024", "--peak_flops=312000000000000"])
    assert config["max_iters"] == 10 and config["learning_rate"] == 1e-3
    assert config["compile"] is False and config["attention"] == "efficient"
    assert config["out_dir"] == "out-x" and config["wandb_run_name"] == "2024"
    assert config["dropout"] == 0.0 and isinstance(config["dropout"], float)
    assert config["peak_flops"] == 312e12
    assert get_config(["--peak_flops=989e12"])["peak_flops"] == 989e12
    assert get_config(["--peak_flops=auto"])["peak_flops"] == "auto"


def test_config_file_then_overrides_and_a_file_reads_the_config_so_far(tmp_path):
    """As in NanoGPT: a file sees the defaults, earlier files and earlier overrides, so one key can
    follow another; what it leaves alone stays as set before it."""
    base, derived = tmp_path / "base.py", tmp_path / "derived.py"
    base.write_text("import math\nlearning_rate = 3e-3\nmax_iters = 100\nn_layer = 3\n_own = 1\n")
    derived.write_text("min_lr = learning_rate / 10\nlr_decay_iters = max_iters\n"
                       "warmup_iters = warmup_iters // 2\n")
    config = get_config([str(base), "--n_layer=5"])
    assert (config["n_layer"], config["learning_rate"], config["max_iters"]) == (5, 3e-3, 100)
    config = get_config([str(base), str(derived)])
    assert config["min_lr"] == pytest.approx(3e-4) and config["lr_decay_iters"] == 100
    assert config["warmup_iters"] == DEFAULT_CONFIG["warmup_iters"] // 2
    config = get_config([str(base), "--max_iters=7", str(derived)])
    assert config["min_lr"] == pytest.approx(3e-4) and config["lr_decay_iters"] == 7
    assert get_config(["--n_layer=5", str(derived)])["n_layer"] == 5


def test_every_shipped_config_parses():
    for path in sorted((REPO / "config").glob("*.py")):
        config = resolve_config(get_config([str(path)]))
        assert config["attention"] in ("standard", "efficient")
        # grouped-query attention is standard's alone, as are OpenAI's weights
        grouped = config["n_kv_head"] not in (0, config["n_head"])
        if not grouped and config["init_from"] not in PRETRAINED_GPT2:
            resolve_config(get_config([str(path), "--attention=super"]))


def test_paper_config_is_the_paper_setting():
    c = get_config([str(REPO / "config" / "train_paper_lm.py")])
    assert c["block_size"] == 1024 and c["batch_size"] == 5
    assert c["batch_size"] * c["gradient_accumulation_steps"] == 500


def test_lr_schedule_warmup_then_cosine_and_a_warmup_longer_than_the_decay_is_cut():
    c = resolve_config(dict(learning_rate=1e-3, min_lr=1e-4, warmup_iters=100,
                            lr_decay_iters=2000))
    assert T.get_lr(0, c) == pytest.approx(1e-3 / 101)
    assert T.get_lr(1050, c) == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert T.get_lr(2000, c) == pytest.approx(1e-4) and T.get_lr(5000, c) == pytest.approx(1e-4)
    # warmup_iters steps rise to the peak, which iteration warmup_iters takes; the cosine then
    # falls at every step until lr_decay_iters, the first iteration at min_lr
    rates = [T.get_lr(it, c) for it in range(2001)]
    assert all(a < b for a, b in zip(rates[:100], rates[1:101]))
    assert rates[99] == pytest.approx(1e-3 * 100 / 101) and rates[100] == 1e-3
    assert all(a > b for a, b in zip(rates[100:2000], rates[101:2001]))
    cosine = 0.5 * (1 + math.cos(math.pi * 1899 / 1900))
    assert rates[1999] == pytest.approx(1e-4 + cosine * 9e-4, rel=1e-12)
    # a warmup of 100 before a decay that ends at 50 is cut to 49 steps: the peak at 49
    cut = [T.get_lr(it, {**c, "lr_decay_iters": 50}) for it in range(52)]
    assert cut[0] == pytest.approx(1e-3 / 50) and cut[49] == 1e-3
    assert cut[50] == cut[51] == pytest.approx(1e-4)
    assert all(a < b for a, b in zip(cut[:49], cut[1:50]))
    assert T.get_lr(7, {**c, "decay_lr": False}) == 1e-3


@pytest.mark.parametrize("args", [
    "--max_iters=1.5", "--compile=1", "--compile=false", "--learning_rate=fast", "--n_layerz=2",
    "--batch_size=True", "--learning_rate=True", "--beta2=1.0", "--eval_interval=0",
    "--grad_clip=1e999", "--peak_flops=fast", "--attention=linear", "--init_from=gpt3",
    "--backend=nccl", "--device=cuda", "--init_from=gpt2 --attention=efficient",
    "--init_from=gpt2 --block_size=2048", "--hellaswag_interval=2 --hellaswag_file=hs.jsonl"])
def test_a_bad_setting_is_one_error_line_before_anything_is_written(args, tmp_path, data_dir,
                                                                   capsys):
    main_fails(capsys, [*argv(tiny(tmp_path, data_dir)), *args.split()])
    assert not (tmp_path / "out").exists()


def test_a_config_error_is_one_line_that_names_the_fix(tmp_path, data_dir, capsys, monkeypatch):
    main_fails(capsys, ["--n_layerz=2"], "unknown config key 'n_layerz'; did you mean 'n_layer'?")
    main_fails(capsys, ["--max_iters=ten"], "config key 'max_iters' expects a int, got 'ten'")
    main_fails(capsys, tiny(tmp_path, data_dir, beta2=1.5), "'beta2'=1.5: must be in [0, 1)")
    main_fails(capsys, [str(tmp_path / "no.py")], f"config file {tmp_path / 'no.py'} not found")
    failing = tmp_path / "failing.py"
    failing.write_text("n_layer = 4\nmin_lr = learnin_rate / 10\n")
    main_fails(capsys, [str(failing)], "failing.py: NameError: name 'learnin_rate' is not defined")
    failing.write_text("n_layers = 4\n")
    main_fails(capsys, [str(failing)], "unknown config key 'n_layers' in", "mean 'n_layer'?")
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *args: None)  # no wandb
    main_fails(capsys, tiny(tmp_path, data_dir, wandb_log=True), "pip install wandb")


# -----------------------------------------------------------------------------
# a run and what it writes

def test_a_run_writes_checkpoint_log_and_summary(tmp_path, data_dir, capsys):
    # a warmup of 100 steps before a decay that ends at 4 is cut to 3 steps: no refusal
    c = tiny(tmp_path, data_dir, attention="efficient", max_iters=6, lr_decay_iters=4,
             warmup_iters=100, batch_size=2, gradient_accumulation_steps=2, peak_flops=1e12)
    summary = T.train(c)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("device cpu, dtype float32, 1 process(es), 2 micro-step(s) per "
                                 "process, 64 tokens per iteration")
    assert printed[1] == (f"model: efficient attention, {summary['n_params']:,} parameters, "
                          f"{summary['flops_per_token']:,} training FLOPs per token")
    assert not any(line.startswith("note") for line in printed)  # a valid config prints no notes
    out = tmp_path / "out"
    ckpt = torch.load(out / CHECKPOINT_NAME, weights_only=True)
    assert set(ckpt) >= {"model_args", "model", "optimizer", "iter_num", "best_val_loss", "config",
                         "rng", "meta"}
    assert ckpt["model_args"]["attention"] == "efficient" and ckpt["iter_num"] == 6
    assert ckpt["config"]["max_iters"] == 6 and ckpt["meta"]["tokenizer"] == "char"

    records = read_log(out)
    trains = [r for r in records if r["type"] == "train"]
    evals = [r for r in records if r["type"] == "eval"]
    assert [r["iter"] for r in trains] == [1, 2, 3, 4, 5, 6]
    assert set(trains[0]) == {"type", "iter", "loss", "lr", "ms_per_iter", "tokens_per_s", "mfu",
                              "elapsed_s"}
    rates = [r["lr"] for r in trains]
    assert rates == [T.get_lr(it, resolve_config(c)) for it in range(6)]
    assert rates[0] < rates[1] < rates[2] < rates[3] == 1e-3
    assert rates[4:] == pytest.approx([1e-4, 1e-4])
    for r in trains:  # MFU counts every micro-batch of an iteration
        seconds = r["ms_per_iter"] / 1000
        assert r["tokens_per_s"] == pytest.approx(64 / seconds, rel=1e-9)
        mfu = summary["flops_per_token"] * 64 / seconds / 1e12
        assert r["mfu"] == pytest.approx(mfu, rel=1e-9)
    assert [r["iter"] for r in evals] == [0, 4, 6]  # every eval_interval, and at the end
    assert set(evals[0]) == {"type", "iter", "train_loss", "val_loss", "elapsed_s"}

    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(summary))
    assert set(summary) == {
        "run_id", "attention", "model_args", "n_params", "n_params_non_embedding",
        "attention_params", "flops_per_token", "final_train_loss", "final_val_loss",
        "final_losses_iter", "best_val_loss", "iterations", "iterations_this_run", "stop_reason",
        "mean_ms_per_iter", "tokens_per_s", "tokens_per_iter", "peak_memory_bytes", "wall_time_s",
        "wall_time_this_run_s", "device", "dtype", "world_size", "setups", "compile",
        "num_threads", "out_dir", "dataset"}
    assert summary["out_dir"] == str(out) and summary["dataset"] == str(data_dir)
    model = GPT(GPTConfig(**ckpt["model_args"]))
    assert summary["n_params"] == model.get_num_params(non_embedding=False)
    assert summary["attention_params"] == model.get_num_attention_params()
    assert summary["flops_per_token"] == model.flops_per_token()
    assert summary["final_val_loss"] == evals[-1]["val_loss"] and summary["iterations"] == 6
    assert summary["final_train_loss"] == evals[-1]["train_loss"]
    assert summary["final_losses_iter"] == 6 and summary["stop_reason"] == "max_iters"
    assert summary["best_val_loss"] == min(r["val_loss"] for r in evals[1:])  # of those saved
    assert summary["setups"] == ["1 x cpu, float32"]
    for key in ("mean_ms_per_iter", "tokens_per_s", "peak_memory_bytes", "wall_time_s"):
        assert summary[key] > 0
    timed = [r["ms_per_iter"] for r in trains[1:]]  # the first pays for warm-up or compile
    assert summary["mean_ms_per_iter"] == pytest.approx(sum(timed) / len(timed), rel=1e-9)


def test_a_train_record_logs_its_steps_loss_and_times_the_steps_since_the_last(tmp_path,
                                                                               data_dir):
    """The losses since the last record are read back together: at log_interval=3 the record at 3
    logs step 3's loss and times steps 2-3 (the first pays for warm-up), the one at 6 steps 4-6;
    the summary's mean is their step-weighted mean. A run of one step is timed by that step."""
    summaries = {}
    for log_interval in (1, 3):
        summaries[log_interval] = T.train(tiny(tmp_path / str(log_interval), data_dir, max_iters=6,
                                               log_interval=log_interval, eval_interval=100),
                                          verbose=False)
    every, third = (log_losses(tmp_path / str(i) / "out") for i in (1, 3))
    assert list(third) == [3, 6] and len(set(every.values())) == 6
    assert third == {it: every[it] for it in (3, 6)}
    logged = [r for r in read_log(tmp_path / "3" / "out") if r["type"] == "train"]
    first, second = [r["ms_per_iter"] for r in logged]
    mean = (2 * first + 3 * second) / 5
    assert summaries[3]["mean_ms_per_iter"] == pytest.approx(mean, rel=1e-9)
    summary = T.train(tiny(tmp_path / "one", data_dir, max_iters=1), verbose=False)
    [record] = [r for r in read_log(tmp_path / "one" / "out") if r["type"] == "train"]
    assert summary["mean_ms_per_iter"] == pytest.approx(record["ms_per_iter"], rel=1e-9)
    assert summary["tokens_per_s"] == pytest.approx(record["tokens_per_s"], rel=1e-9)


# What reads a tensor back to the host, where a GPU holds it, waiting for every kernel queued
# before it: the aten operators .item(), float(t), bool(t) and `if t:` end in, and those that size
# their output by the values; and the Tensor methods that read on the CPU without such an operator.
HOST_READ_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::equal")
HOST_READ_METHODS = ("tolist", "cpu", "numpy")


def host_reads(monkeypatch, config, first, last):
    """{what: count} of the host reads of iterations first to last - 1 of T.train(config): the
    HOST_READ_OPS the profiler sees between those get_lr calls, and the HOST_READ_METHODS called
    meanwhile as "file:function: method" (but the batch offsets', drawn on the CPU)."""
    profiler, reads, real_get_lr = torch.profiler.profile(), {}, T.get_lr
    profiling = False

    def count(what):
        reads[what] = reads.get(what, 0) + 1

    def get_lr(it, c):
        nonlocal profiling
        if it in (first, last):
            (profiler.start if it == first else profiler.stop)()
            profiling = it == first
        if it == last:
            for event in profiler.events():
                parents, parent = [], event.cpu_parent
                while parent is not None:
                    parents.append(parent.name)
                    parent = parent.cpu_parent
                # fused AdamW's CPU kernel reads its step counters, on the CPU (on a GPU, there)
                if event.name in HOST_READ_OPS and "aten::_fused_adamw_" not in parents:
                    count(event.name)
        return real_get_lr(it, c)

    def watched(name):
        real = getattr(torch.Tensor, name)

        def method(self, *args, **kwargs):
            if profiling:
                caller = sys._getframe(1).f_code
                count(f"{os.path.basename(caller.co_filename)}:{caller.co_name}: {name}")
            return real(self, *args, **kwargs)
        return method

    monkeypatch.setattr(T, "get_lr", get_lr)
    for name in HOST_READ_METHODS:
        monkeypatch.setattr(torch.Tensor, name, watched(name))
    T.train(config, verbose=False)
    assert not profiling and profiler.profiler is not None  # both get_lr calls came
    reads.pop("data.py:get: tolist")
    return reads


def unlogged(tmp_path, data_dir, **overrides):
    """Iterations 3 to 8 of 12 neither log (log_interval=10) nor evaluate (eval_interval=100)."""
    return tiny(tmp_path, data_dir, **{**dict(max_iters=12, lr_decay_iters=12, log_interval=10,
                                              eval_interval=100), **overrides})


@pytest.mark.parametrize("attention", VARIANTS)
@pytest.mark.parametrize("accumulation, grad_clip", [(1, 1.0), (3, 0.0)])
def test_iterations_that_neither_log_nor_evaluate_read_nothing_back_to_the_host(
        attention, accumulation, grad_clip, tmp_path, data_dir, monkeypatch):
    """As in NanoGPT, so that the CPU queues the next step while a GPU runs this one."""
    config = unlogged(tmp_path, data_dir, attention=attention, grad_clip=grad_clip,
                      gradient_accumulation_steps=accumulation)
    assert host_reads(monkeypatch, config, 3, 9) == {}


def test_losses_left_unread_are_read_back_once_there_are_max_unread_losses(tmp_path, data_dir,
                                                                           monkeypatch):
    monkeypatch.setattr(T, "MAX_UNREAD_LOSSES", 2)
    reads = host_reads(monkeypatch, unlogged(tmp_path, data_dir), 3, 9)
    assert reads == {"train.py:read_losses: tolist": 3}


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_under_torchrun_each_iteration_reads_back_its_stop_flag_alone(parallelism, tmp_path,
                                                                      data_dir, monkeypatch,
                                                                      one_process_group):
    """All ranks stop after the step a signal came in: the flag is all-reduced and read at every
    step, the mean loss with it; nothing else."""
    config = unlogged(tmp_path, data_dir, parallelism=parallelism)
    assert host_reads(monkeypatch, config, 3, 9) == {"train.py:forward_backward: tolist": 6}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_the_loss_is_scaled_under_float16_only_and_clipped_after_unscaling(dtype, tmp_path,
                                                                          data_dir, monkeypatch):
    """float16's gradients underflow unless the loss is scaled up (bfloat16 has float32's range).
    clip_grad_norm_ sees the true gradients, not the scaled ones, 2**16 times larger until
    unscale_; AdamW steps with gradients of norm grad_clip (about 1.5 unclipped)."""
    clipped_from, stepped_with, scaled = [], [], []
    real_clip, real_step = torch.nn.utils.clip_grad_norm_, torch.amp.GradScaler.step

    def clip(parameters, max_norm, *args, **kwargs):
        norm = real_clip(parameters, max_norm, *args, **kwargs)
        clipped_from.append(float(norm))
        return norm

    def step(self, optimizer, *args, **kwargs):
        grads = [p.grad for group in optimizer.param_groups for p in group["params"]]
        norms = torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])
        stepped_with.append(float(torch.linalg.vector_norm(norms)))
        scaled.append(self.is_enabled())
        return real_step(self, optimizer, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    monkeypatch.setattr(torch.amp.GradScaler, "step", step)
    T.train(tiny(tmp_path, data_dir, dtype=dtype, max_iters=2, grad_clip=0.5), verbose=False)
    assert scaled == [dtype == "float16"] * 2
    assert len(clipped_from) == 2 and all(1.0 < norm < 3.0 for norm in clipped_from), clipped_from
    assert stepped_with == pytest.approx([0.5, 0.5], rel=1e-3)


def test_loss_falls(tmp_path, data_dir):
    T.train(tiny(tmp_path, data_dir, max_iters=40, eval_interval=40, learning_rate=3e-3,
                 lr_decay_iters=40), verbose=False)
    evals = [r["val_loss"] for r in read_log(tmp_path / "out") if r["type"] == "eval"]
    assert evals[-1] < evals[0] - 0.5, evals


def first_gradients_and_loss(tmp_path, data_dir, monkeypatch, **overrides):
    """One iteration: the gradients forward_backward leaves (before the step), and its loss."""
    gradients, real_forward_backward = [], T.forward_backward

    def recording(run, signals):
        result = real_forward_backward(run, signals)
        gradients.append({name: p.grad.clone() for name, p in run.raw_model.named_parameters()})
        return result

    monkeypatch.setattr(T, "forward_backward", recording)
    T.train(tiny(tmp_path, data_dir, max_iters=1, **overrides), verbose=False)
    return gradients[0], log_losses(tmp_path / "out")[1]


def test_accumulated_micro_batches_equal_one_large_batch(tmp_path, data_dir, monkeypatch):
    """A loss left undivided by the micro-steps would still train (AdamW hardly minds a scale), but
    would shift what grad_clip means, and the logged loss."""
    large, large_loss = first_gradients_and_loss(tmp_path / "large", data_dir, monkeypatch,
                                                 batch_size=4)
    split, split_loss = first_gradients_and_loss(tmp_path / "split", data_dir, monkeypatch,
                                                 batch_size=2, gradient_accumulation_steps=2)
    torch.testing.assert_close(split, large, atol=1e-6, rtol=1e-5)
    assert split_loss == pytest.approx(large_loss, rel=1e-6)


@pytest.mark.parametrize("init_from", ["resume", "scratch"])
def test_eval_only_reports_the_losses_and_writes_nothing(init_from, tmp_path, data_dir):
    cfg = tiny(tmp_path, data_dir, max_iters=4)
    trained = T.train(cfg, verbose=False)
    before = files(tmp_path / "out")
    summary = T.train({**cfg, "init_from": init_from, "eval_only": True}, verbose=False)
    assert files(tmp_path / "out") == before
    assert summary["stop_reason"] == "eval_only" and summary["iterations_this_run"] == 0
    if init_from == "resume":  # the checkpoint's weights, on the same batches as at its end
        assert summary["final_val_loss"] == pytest.approx(trained["final_val_loss"], rel=1e-6)
    else:  # nothing was ever saved, so there is no best to report
        assert summary["best_val_loss"] is None


def test_the_best_checkpoint_is_kept_with_always_save_checkpoint_false(tmp_path, data_dir,
                                                                         monkeypatch):
    """The checkpoint is the best evaluation so far, across resumes. The initial weights' unsaved
    evaluation is no best (nothing after it would be saved); nor is a resume's first, worse one."""
    val = {0: 1.0, 4: 5.0, 8: 6.0, 12: 7.0}
    monkeypatch.setattr(T, "estimate_loss", lambda run: dict(train=val[run.iter_num],
                                                             val=val[run.iter_num]))
    c = tiny(tmp_path, data_dir, max_iters=8, always_save_checkpoint=False)
    summary = T.train(c, verbose=False)
    checkpoint = load_checkpoint(tmp_path / "out")
    assert checkpoint["iter_num"] == 4
    assert checkpoint["best_val_loss"] == summary["best_val_loss"] == 5
    assert [r["val_loss"] for r in read_log(tmp_path / "out") if r["type"] == "eval"] == [1, 5, 6]
    resumed = T.train({**c, "max_iters": 12, "init_from": "resume"}, verbose=False)
    checkpoint = load_checkpoint(tmp_path / "out")
    assert checkpoint["iter_num"] == 4 and checkpoint["best_val_loss"] == 5.0
    assert resumed["best_val_loss"] == 5.0 and resumed["final_val_loss"] == 7.0


def test_save_checkpoints_false_trains_the_same_run_and_writes_no_checkpoint(tmp_path, data_dir,
                                                                             monkeypatch):
    """A throughput run: the losses of a run that saves, its log and summary, and no checkpoint,
    even when a signal stops it."""
    saved = T.train(tiny(tmp_path / "saved", data_dir), verbose=False)
    unsaved = T.train(tiny(tmp_path / "unsaved", data_dir, save_checkpoints=False), verbose=False)
    out = tmp_path / "unsaved" / "out"
    assert sorted(files(out)) == ["log.jsonl", "summary.json", "train.lock"]
    assert log_losses(out) == log_losses(tmp_path / "saved" / "out")
    assert unsaved["final_val_loss"] == saved["final_val_loss"]
    assert unsaved["best_val_loss"] is None  # the best of its checkpoints, of which there are none
    signal_at(monkeypatch, 6)
    stopped = T.train(tiny(tmp_path / "stopped", data_dir, save_checkpoints=False), verbose=False)
    assert stopped["stop_reason"] == "SIGINT" and stopped["iterations"] == 6
    assert not (tmp_path / "stopped" / "out" / CHECKPOINT_NAME).exists()


def test_wandb_gets_each_record_and_a_resume_goes_on_in_the_same_wandb_run(tmp_path, data_dir,
                                                                           monkeypatch):
    """The log.jsonl records, each as {type/key: value} at step=iter; wandb.init gets the run's own
    id, kept across resumes, so that wandb resumes the run rather than starting another."""
    inits, logged = [], []
    run = types.SimpleNamespace(log=lambda data, step: logged.append((step, data)),
                                finish=lambda: None)
    wandb = types.ModuleType("wandb")
    wandb.__spec__ = importlib.machinery.ModuleSpec("wandb", None)  # what find_spec finds
    wandb.init = lambda **kwargs: (inits.append(kwargs), run)[1]
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    c = tiny(tmp_path, data_dir, max_iters=2, eval_interval=2, wandb_log=True)
    first = T.train(c, verbose=False)
    records = read_log(tmp_path / "out")
    assert [step for step, _ in logged] == [r["iter"] for r in records] == [0, 1, 2, 2]
    for (_, data), record in zip(logged, records):
        assert data == {f"{record['type']}/{k}": v for k, v in record.items()
                        if k not in ("type", "iter")}
    assert set(logged[1][1]) == {"train/loss", "train/lr", "train/ms_per_iter",
                                 "train/tokens_per_s", "train/mfu", "train/elapsed_s"}
    resumed = T.train({**c, "init_from": "resume", "max_iters": 4}, verbose=False)
    assert first["run_id"] == resumed["run_id"]
    assert [(i["id"], i["resume"]) for i in inits] == [(first["run_id"], "allow")] * 2


def test_hellaswag_during_training_is_optional(tmp_path, data_dir, monkeypatch, capsys):
    """A file that gives no examples turns the scores off, said once, and training goes on; with
    examples, every hellaswag_interval iterations log their scores."""
    hellaswag_file = tmp_path / "x.jsonl"
    hellaswag_file.touch()
    c = tiny(tmp_path, data_dir, max_iters=4, hellaswag_interval=2,
             hellaswag_file=str(hellaswag_file))
    assert T.train({**c, "out_dir": str(tmp_path / "off")})["iterations"] == 4
    assert "warning: HellaSwag evaluation is off" in capsys.readouterr().out
    assert log_iters(tmp_path / "off", "hellaswag") == []
    result = dict(acc=1 / 3, acc_norm=2 / 3, acc_char_norm=2 / 3, acc_harness=None, n=3,
                  correct={"acc": 1, "acc_norm": 2, "acc_char_norm": 2}, n_endings_truncated=0)
    monkeypatch.setattr(eval_hellaswag, "examples_for_training",
                        lambda path, limit, meta: (["example"] * 3, "a tokenizer"))
    monkeypatch.setattr(eval_hellaswag, "evaluate", lambda *args, **kwargs: result)
    T.train(c)
    hs = [r for r in read_log(tmp_path / "out") if r["type"] == "hellaswag"]
    assert [r["iter"] for r in hs] == [2, 4] and hs[0]["acc_norm"] == 2 / 3 and hs[0]["n"] == 3
    assert "iter 2: hellaswag acc 0.3333 (1/3), acc_norm 0.6667 (2/3)" in capsys.readouterr().out


# -----------------------------------------------------------------------------
# exact resume, and what a resume refuses

@pytest.mark.parametrize("attention", VARIANTS)
def test_resume_equals_uninterrupted_training(tmp_path, data_dir, attention):
    common = dict(attention=attention, dropout=0.1, max_iters=8, eval_interval=4,
                  gradient_accumulation_steps=2)
    T.train(tiny(tmp_path / "straight", data_dir, **common), verbose=False)
    T.train(tiny(tmp_path / "split", data_dir, **{**common, "max_iters": 4}), verbose=False)
    assert load_checkpoint(tmp_path / "split" / "out")["iter_num"] == 4
    T.train(tiny(tmp_path / "split", data_dir, **common, init_from="resume"), verbose=False)
    straight, split = tmp_path / "straight" / "out", tmp_path / "split" / "out"
    torch.testing.assert_close(params(split), params(straight), rtol=0, atol=0)  # bit for bit
    assert load_checkpoint(split)["best_val_loss"] == load_checkpoint(straight)["best_val_loss"]
    assert log_losses(split) == log_losses(straight) and list(log_losses(split)) == [*range(1, 9)]
    assert log_iters(split, "eval") == [0, 4, 8]  # the resume does not repeat the evaluation at 4


def test_a_resume_takes_dropout_betas_and_weight_decay_from_its_config(tmp_path, data_dir):
    """The moments come from the checkpoint, the hyperparameters from the config, as the learning
    rate does; dropout too, as no weight depends on it."""
    c = tiny(tmp_path, data_dir, max_iters=4, weight_decay=0.1, beta1=0.9, beta2=0.99)
    T.train(c, verbose=False)
    summary = T.train({**c, "init_from": "resume", "max_iters": 8, "weight_decay": 0.0,
                       "beta1": 0.8, "beta2": 0.95, "dropout": 0.1}, verbose=False)
    assert summary["model_args"]["dropout"] == 0.1
    groups = load_checkpoint(tmp_path / "out")["optimizer"]["param_groups"]
    assert [(g["weight_decay"], g["betas"]) for g in groups] == [(0.0, (0.8, 0.95))] * 2
    T.train({**c, "init_from": "resume", "max_iters": 12, "weight_decay": 0.2}, verbose=False)
    groups = load_checkpoint(tmp_path / "out")["optimizer"]["param_groups"]
    assert [(g["weight_decay"], g["betas"]) for g in groups] == [(0.2, (0.9, 0.99)),
                                                                 (0.0, (0.9, 0.99))]


def test_a_resume_after_a_kill_logs_each_iteration_once_and_counts_the_totals_once(
        tmp_path, data_dir, monkeypatch):
    """A run killed while saving at 4, after its checkpoint at 2 (steps 3 and 4 come again), then
    resumed: the log past 2 is dropped (a torn line too); wall time, ms/iter and log times cover
    both processes up to what the run kept, each process's first step (its warm-up) left out of
    the speed; peak memory is the highest of them."""
    out, saves = tmp_path / "out", []

    def dies_at_the_second_save(checkpoint, path):
        saves.append(checkpoint["iter_num"])
        if len(saves) == 2:
            raise KeyboardInterrupt
        save_checkpoint(checkpoint, path)

    cfg = tiny(tmp_path, data_dir, eval_interval=2)
    with monkeypatch.context() as m:
        m.setattr(T, "save_checkpoint", dies_at_the_second_save)
        m.setattr(runlog, "peak_memory_bytes", lambda device: 5 << 20)
        with pytest.raises(KeyboardInterrupt):
            T.train(cfg, verbose=False)
    kept = load_checkpoint(out)["totals"]
    assert saves == [2, 4] and kept["timed_steps"] == 1  # steps 1 and 2: the first is the warm-up
    assert log_iters(out, "train") == [1, 2, 3, 4] and log_iters(out, "eval") == [0, 2, 4]
    with open(out / "log.jsonl", "a") as f:
        f.write('{"type": "train", "it')  # a line torn by the kill
    monkeypatch.setattr(runlog, "peak_memory_bytes", lambda device: 3 << 20)
    summary = T.train({**cfg, "init_from": "resume"}, verbose=False)
    assert log_iters(out, "train") == [*range(1, 9)]
    assert log_iters(out, "eval") == [0, 2, 4, 6, 8]
    assert summary["iterations_this_run"] == 6 and summary["peak_memory_bytes"] == 5 << 20
    wall_time = kept["wall_time_s"] + summary["wall_time_this_run_s"]
    assert summary["wall_time_s"] == pytest.approx(wall_time, rel=1e-12)
    steps = {r["iter"]: r for r in read_log(out) if r["type"] == "train"}
    timed = [steps[i]["ms_per_iter"] for i in (2, 4, 5, 6, 7, 8)]  # not 1 nor 3, each one's first
    assert summary["mean_ms_per_iter"] == pytest.approx(sum(timed) / len(timed))
    times = [r["elapsed_s"] for r in read_log(out)]
    assert times == sorted(times) and times[-1] > kept["wall_time_s"]
    monkeypatch.setattr(runlog, "peak_memory_bytes", lambda device: 7 << 20)
    moved = T.train({**cfg, "max_iters": 10, "init_from": "resume", "dtype": "bfloat16"},
                    verbose=False)
    assert moved["setups"] == ["1 x cpu, float32", "1 x cpu, bfloat16"]
    assert moved["peak_memory_bytes"] == 7 << 20


def gpt2_data(tmp_path):
    """Random token ids labelled as GPT-2 BPE data, which init_from='gpt2' asks for."""
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 4000), ("val", 1000)):
        rng.integers(0, 50257, n).astype(np.uint16).tofile(data / f"{split}.bin")
    write_meta(data, {"tokenizer": "gpt2", "vocab_size": 50257,
                      "tokens": {"train": 4000, "val": 1000}})
    return data


@pytest.fixture
def small_gpt2(monkeypatch):
    """A small random GPT-2 (2 layers, 2 heads, 32 wide) stands in for init_from='gpt2'."""
    transformers = pytest.importorskip("transformers", reason="GPT-2 weights need transformers")
    torch.manual_seed(0)
    hf_model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_positions=32, n_embd=32,
                                                                    n_layer=2, n_head=2))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        classmethod(lambda cls, name, **options: hf_model))


def test_gpt2_fine_tuning_at_a_constant_rate_keeps_the_best_and_resumes(tmp_path, small_gpt2):
    """config/finetune_shakespeare.py. init_from='gpt2' takes the model's shape from OpenAI's
    weights, not from the config (bias, vocab_size, GELU), so the same command with
    init_from='resume' resumes it."""
    args = [str(REPO / "config" / "finetune_shakespeare.py"), "--init_from='gpt2'",
            "--max_iters=6", "--eval_interval=2", "--eval_iters=2", "--block_size=16",
            "--gradient_accumulation_steps=2", f"--data_dir='{gpt2_data(tmp_path)}'",
            f"--out_dir='{tmp_path / 'out'}'", "--device='cpu'", "--compile=False"]
    summary = T.train(get_config(args), verbose=False)
    assert summary["iterations"] == 6 and summary["model_args"]["attention"] == "standard"
    records = read_log(tmp_path / "out")
    assert {r["lr"] for r in records if r["type"] == "train"} == {3e-5}
    # the pretrained weights' evaluation (iteration 0) is not saved; after it, the best one is
    val = {r["iter"]: r["val_loss"] for r in records if r["type"] == "eval" and r["iter"] > 0}
    checkpoint = load_checkpoint(tmp_path / "out")
    best = min(val.items(), key=lambda item: item[1])
    assert (checkpoint["iter_num"], checkpoint["best_val_loss"]) == best
    resumed = T.train(get_config([*args, "--init_from=resume", "--max_iters=8"]), verbose=False)
    assert resumed["iterations"] == 8 and resumed["iterations_this_run"] == 8 - best[0]
    assert resumed["model_args"] == summary["model_args"]
    assert (resumed["model_args"]["vocab_size"], resumed["model_args"]["bias"]) == (50257, True)
    assert resumed["model_args"]["gelu_approximate"] == "tanh"
    with pytest.raises(T.CheckpointError, match="attention"):
        T.train(get_config([*args, "--init_from=resume", "--attention=efficient"]), verbose=False)


def test_gpt2_weights_out_of_reach_are_one_error_line(tmp_path, monkeypatch, capsys):
    transformers = pytest.importorskip("transformers", reason="GPT-2 weights need transformers")

    def offline(cls, name, **options):  # what the hub raises with no network and no cached copy
        raise OSError(f"We couldn't connect to 'https://huggingface.co' to load {name}.\n"
                      f"Check your connection.")
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(offline))
    main_fails(capsys, tiny(tmp_path, gpt2_data(tmp_path), init_from="gpt2"),
               "could not load 'gpt2' weights: they download from the Hugging Face hub",
               "couldn't connect")
    assert not list((tmp_path / "out").glob("*.pt"))


@pytest.mark.parametrize("change, words", [
    ("scratch", ["already holds a checkpoint: --init_from=resume to continue, or another"]),
    ("no_checkpoint", ["no checkpoint at", "to resume: start the run with init_from='scratch'"]),
    ("n_layer", ["cannot resume from", "model differs (n_layer 2 in the checkpoint, 3 asked)"]),
    ("more_characters", ["cannot resume from", "characters and the", "differ from id"]),
    ("other_characters", []),  # as many: the weights would load
    ("truncated", ["cannot read checkpoint", "it is not a torch.save archive"]),
    ("no_optimizer", ["it is not a training checkpoint of this repo"]),
    ("no_weight", ["do not fit the model", "lm_head.weight"]),
])
def test_a_run_that_cannot_go_on_from_out_dir_is_one_error_line_and_changes_nothing(
        change, words, tmp_path, data_dir, capsys):
    """A new run beside a checkpoint; a resume without one, with other model args, on the data
    prepared again from other text, or from a damaged checkpoint."""
    cfg = tiny(tmp_path, data_dir, max_iters=2)
    T.train(cfg, verbose=False)
    cfg, path = {**cfg, "max_iters": 4, "init_from": "resume"}, tmp_path / "out" / CHECKPOINT_NAME
    checkpoint = torch.load(path, weights_only=True)
    if change == "scratch":
        cfg["init_from"] = "scratch"
    elif change == "n_layer":
        cfg["n_layer"] = 3
    elif change.endswith("characters"):
        text = TEXT + "0123456789" if change == "more_characters" else TEXT.replace("e", "\u00e9")
        prepare(text, tmp_path / change, "other text")
        cfg["data_dir"] = str(tmp_path / change)
    elif change == "no_checkpoint":
        path.unlink()
    elif change == "truncated":
        path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    elif change == "no_optimizer":
        del checkpoint["optimizer"]
        save_checkpoint(checkpoint, path)
    else:
        del checkpoint["model"]["lm_head.weight"]
        save_checkpoint(checkpoint, path)
    before = files(tmp_path / "out")
    main_fails(capsys, cfg, *([str(tmp_path / "out")] if words else []), *words)
    assert files(tmp_path / "out") == before


def test_a_second_run_on_a_live_out_dir_stops_with_the_holders_pid(tmp_path, data_dir, capsys):
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; import checkpoint; "
                               "held = checkpoint.lock_out_dir(sys.argv[1]); print('held', "
                               "flush=True); time.sleep(60)", str(out)], stdout=subprocess.PIPE,
                              text=True, env=subprocess_env())
    try:
        assert holder.stdout.readline() == "held\n"
        printed = main_fails(capsys, tiny(tmp_path, data_dir),
                             f"{out} is in use by another training run (PID {holder.pid})")
        assert printed == "" and sorted(files(out)) == ["train.lock"]
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    lock_out_dir(out).close()  # the kernel released the dead holder's lock


def test_compiled_model_saves_without_prefix_and_resumes(tmp_path, data_dir, monkeypatch):
    # the eager backend wraps the model as inductor does (OptimizedModule, "_orig_mod."), without
    # the minutes of C++ compilation
    real_compile, wrapped = torch.compile, []
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: (
        wrapped.append(real_compile(model, backend="eager")), wrapped[-1])[1])
    c = tiny(tmp_path, data_dir, max_iters=2, eval_interval=2, compile=True)
    T.train(c, verbose=False)
    assert wrapped and any(k.startswith("_orig_mod.") for k in wrapped[0].state_dict())
    ckpt = torch.load(tmp_path / "out" / CHECKPOINT_NAME, weights_only=True)
    assert not any(k.startswith("_orig_mod.") for k in ckpt["model"])
    GPT(GPTConfig(**ckpt["model_args"])).load_state_dict(ckpt["model"])  # strict load
    # a compiled run resumes, also from a checkpoint NanoGPT wrote, which has the prefix
    ckpt["model"] = {"_orig_mod." + k: v for k, v in ckpt["model"].items()}
    save_checkpoint(ckpt, tmp_path / "out" / CHECKPOINT_NAME)
    assert T.train({**c, "init_from": "resume", "max_iters": 4}, verbose=False)["iterations"] == 4
    assert len(wrapped) == 2
    assert not any(k.startswith("_orig_mod.") for k in params(tmp_path / "out"))


# -----------------------------------------------------------------------------
# signals: a save after the step, and an exact resume

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_finishes_the_step_saves_and_the_resume_is_exact(sig, tmp_path, data_dir,
                                                                  monkeypatch):
    common = dict(dropout=0.1, gradient_accumulation_steps=2, max_iters=8, eval_interval=4)
    T.train(tiny(tmp_path / "straight", data_dir, **common), verbose=False)
    split = tmp_path / "split" / "out"
    with monkeypatch.context() as m:
        calls = signal_at(m, 5, sig)  # the first micro-step of iteration 2 (2 micro-steps each)
        stopped = T.train(tiny(tmp_path / "split", data_dir, **common), verbose=False)
    assert stopped["stop_reason"] == sig.name and stopped["iterations"] == 3
    assert calls["n"] == 6 and load_checkpoint(split)["iter_num"] == 3  # the step completed
    T.train(tiny(tmp_path / "split", data_dir, **common, init_from="resume"), verbose=False)
    straight = tmp_path / "straight" / "out"
    torch.testing.assert_close(params(split), params(straight), rtol=0, atol=0)
    assert log_losses(split) == log_losses(straight)


def test_sigterm_to_train_py_saves_and_exits_0(tmp_path, data_dir):
    cfg = tiny(tmp_path, data_dir, max_iters=100000, eval_interval=100000, lr_decay_iters=100000)
    proc = subprocess.Popen([sys.executable, str(REPO / "train.py"), *argv(cfg)], cwd=tmp_path,
                            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    wait_for_train_records(proc, tmp_path / "out", 3)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "received SIGTERM" in stdout, stderr
    assert load_checkpoint(tmp_path / "out")["iter_num"] == read_log(tmp_path / "out")[-1]["iter"]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["stop_reason"] == "SIGTERM"


def test_a_signal_leaves_the_evaluation_it_came_before_to_the_resume(tmp_path, data_dir,
                                                                    monkeypatch, capsys):
    """A signal's checkpoint is saved before its iteration's evaluation: the resume evaluates and
    saves it before it trains on, once. A stop at max_iters leaves the final evaluation to the
    resume; after it, a resume has nothing to train and changes nothing."""
    cfg, out = tiny(tmp_path, data_dir, always_save_checkpoint=False), tmp_path / "out"
    with monkeypatch.context() as m:
        signal_at(m, 4)  # stops at 4, before iteration 4's evaluation
        assert T.train(cfg, verbose=False)["iterations"] == 4
    assert not load_checkpoint(out)["evaluated"]
    with monkeypatch.context() as m:
        signal_at(m, 2, sig=None)  # the resumed run dies in iteration 5
        with pytest.raises(KeyboardInterrupt):
            T.train({**cfg, "init_from": "resume"}, verbose=False)
    ckpt = load_checkpoint(out)
    assert ckpt["iter_num"] == 4 and ckpt["evaluated"]
    with monkeypatch.context() as m:
        signal_at(m, 4)  # in iteration 7: stops at max_iters, before the final evaluation
        assert T.train({**cfg, "init_from": "resume"}, verbose=False)["stop_reason"] == "SIGINT"
    assert load_checkpoint(out)["iter_num"] == 8 and log_iters(out, "eval") == [0, 4]
    summary = T.train({**cfg, "init_from": "resume"}, verbose=False)
    assert summary["stop_reason"] == "max_iters" and summary["final_val_loss"] is not None
    assert log_iters(out, "eval") == [0, 4, 8] and load_checkpoint(out)["evaluated"]
    before = files(out)
    assert T.train({**cfg, "init_from": "resume"})["iterations"] == 8
    assert "nothing to train" in capsys.readouterr().out and files(out) == before


# -----------------------------------------------------------------------------
# NaN and inf never overwrite the last good checkpoint; a kill never tears one

def non_finite_loss_from(monkeypatch, iteration, bad=float("nan"), sigterm_at=None):
    """The loss is `bad` from iteration `iteration` on (one micro-step each); with sigterm_at, a
    SIGTERM comes in that forward pass (from 1). Returns the count of training forward passes."""
    def loss_of(call, loss):
        if call == sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)
        return loss * bad if call > iteration else loss
    return on_training_forward(monkeypatch, loss_of)


# The loss of iteration 6 is read before its step with log_interval=1, at the log step 7 with 8, at
# the evaluation at 8 with 100; under torchrun (a world of one here) at every step; and at the step
# a signal came in (iteration 7), before its checkpoint.
@pytest.mark.parametrize("log_interval, read_by, steps", [
    (1, None, 7), (8, None, 8), (100, None, 8), (100, "torchrun", 7), (100, "signal", 8)])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(bad, log_interval, read_by,
                                                                    steps, tmp_path, data_dir,
                                                                    monkeypatch, request):
    """The error and the summary name the iteration of the first non-finite loss, whenever it is
    read, and nothing after it is saved or counted."""
    if read_by == "torchrun":
        request.getfixturevalue("one_process_group")
    sigterm_at = 8 if read_by == "signal" else None
    calls = non_finite_loss_from(monkeypatch, 6, bad, sigterm_at)
    with pytest.raises(T.NonFiniteLossError, match=f"training loss became {bad} at iteration 6"):
        T.train(tiny(tmp_path, data_dir, max_iters=20, log_interval=log_interval), verbose=False)
    assert calls["n"] == steps
    ckpt = load_checkpoint(tmp_path / "out")
    assert ckpt["iter_num"] == 4  # the last evaluation before it
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["stop_reason"] == "diverged" and summary["iterations"] == 6
    assert summary["iterations_this_run"] == 6  # not the steps before its loss was read
    assert summary["final_val_loss"] is None and summary["best_val_loss"] is not None


def test_a_diverged_run_is_one_error_line_and_keeps_the_last_good_checkpoint(tmp_path, data_dir,
                                                                             capsys):
    """A learning rate of 1e9 makes the weights non-finite within a step; with an evaluation at
    every iteration the next one would have saved them."""
    T.train(tiny(tmp_path, data_dir, max_iters=4, eval_interval=2), verbose=False)
    path = tmp_path / "out" / CHECKPOINT_NAME
    good = path.read_bytes()
    printed = main_fails(capsys, tiny(tmp_path, data_dir, init_from="resume", max_iters=40,
                                      eval_interval=1, learning_rate=1e9, lr_decay_iters=40),
                         "the last good checkpoint is kept as it was", "Lower learning_rate")
    assert path.read_bytes() == good and "done:" not in printed


@pytest.mark.parametrize("on_a_signal, step, error", [
    (False, 8, "evaluated losses became .* at iteration 8"),
    (True, 6, "holds NaN or inf values .*SIGTERM"),
])
def test_nan_weights_are_never_saved(on_a_signal, step, error, tmp_path, data_dir, monkeypatch):
    """NaN in a weight that no loss shows yet, from the step to iteration `step`: neither the
    evaluation at 8 nor a signal in iteration 5 saves it; the checkpoint of 4 stays."""
    monkeypatch.setattr(torch.optim.AdamW, "step", nan_after_step(torch.optim.AdamW.step, step))
    if on_a_signal:
        signal_at(monkeypatch, 6, signal.SIGTERM)  # in iteration 5, whose step corrupts them
    with pytest.raises(T.NonFiniteLossError, match=error):
        T.train(tiny(tmp_path, data_dir, max_iters=12, lr_decay_iters=12), verbose=False)
    ckpt = load_checkpoint(tmp_path / "out")
    assert ckpt["iter_num"] == 4 and all(torch.isfinite(v).all() for v in ckpt["model"].values())


@pytest.mark.slow
def test_sigkill_during_checkpoint_write_never_leaves_a_torn_checkpoint(tmp_path):
    """A writer saves a ~24 MB checkpoint in a loop; kill it at random moments after its first
    save (so mid-write, often): the checkpoint must load and be one of its complete versions."""
    path = tmp_path / "out" / CHECKPOINT_NAME
    writer = textwrap.dedent(f"""
        import sys, torch
        from checkpoint import save_checkpoint
        big = torch.zeros(6_000_000)
        version = int(sys.argv[1])
        while True:
            version += 1
            big.fill_(version)
            save_checkpoint({{"model_args": {{}}, "model": {{"w": big}}, "iter_num": version}},
                            {str(path)!r})
            print(version, flush=True)
    """)
    rng = random.Random(1)
    for attempt in range(1, 7):
        first = attempt * 1_000_000  # each writer's versions: which one wrote the file is known
        proc = subprocess.Popen([sys.executable, "-c", writer, str(first)], cwd=REPO,
                                env=subprocess_env(), stdout=subprocess.PIPE, text=True)
        assert int(proc.stdout.readline()) == first + 1  # this writer has saved once
        time.sleep(rng.uniform(0.0, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        ckpt = load_checkpoint(path)  # raises CheckpointError on a torn file
        assert ckpt["iter_num"] > first  # this writer's, not an earlier one's
        assert torch.all(ckpt["model"]["w"] == ckpt["iter_num"])  # one complete version, no mix


# -----------------------------------------------------------------------------
# DDP: 2 processes through stock torchrun == 1 process with the accumulation steps of both

def wait_for_train_records(proc, out_dir, n):
    log, deadline = out_dir / "log.jsonl", time.time() + 120
    while proc.poll() is None and time.time() < deadline:
        if log.exists() and log.read_text().count('"type": "train"') >= n:
            return
        time.sleep(0.05)
    pytest.fail(f"no {n} train records in {log}; exit status {proc.poll()}")


def torchrun(tmp_path, config, sig=None, to_group=False):
    """`torchrun --standalone --nproc_per_node=2 train.py ...` in tmp_path; with sig, signal
    torchrun (to_group: its process group, as Ctrl-C in a terminal does) once two steps are logged.
    Returns the workers' stdout. Stock torchrun's own status after a signal is not 0."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(REPO / "train.py"), *argv(config)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    if sig is not None:
        wait_for_train_records(proc, tmp_path / "out", 2)
        (os.killpg if to_group else os.kill)(proc.pid, sig)
    stdout, stderr = proc.communicate(timeout=240)
    assert (sig is not None or proc.returncode == 0) and "2 process(es)" in stdout, stderr[-3000:]
    return stdout


@pytest.mark.slow
@pytest.mark.parametrize("sig, to_group", [(signal.SIGTERM, False), (signal.SIGINT, True)],
                         ids=["sigterm_to_torchrun", "ctrl_c_to_its_group"])
def test_ddp_stopped_by_a_signal_saves_equals_one_process_and_resumes_exactly(sig, to_group,
                                                                              tmp_path, data_dir):
    """Two processes reach the parameters and losses of one with twice the accumulation (with
    dropout 0 only: each rank draws its own masks). A signal saves at the last step; the resume
    under torchrun goes on as the one process does."""
    common = dict(gradient_accumulation_steps=4, batch_size=3, dropout=0.0, lr_decay_iters=1000,
                  eval_interval=100000, peak_flops=1e12)
    ddp = tmp_path / "ddp" / "out"
    stdout = torchrun(tmp_path / "ddp", tiny(tmp_path / "ddp", data_dir, max_iters=100000,
                                             **common), sig, to_group)
    assert f"received {sig.name}" in stdout
    stopped = load_checkpoint(ddp)["iter_num"]
    assert stopped == log_iters(ddp, "train")[-1] >= 2
    T.train(tiny(tmp_path / "one", data_dir, max_iters=stopped + 2, **common), verbose=False)
    one = tmp_path / "one" / "out"
    reference = log_losses(one)
    assert log_losses(ddp) == pytest.approx({it: reference[it] for it in range(1, stopped + 1)},
                                            rel=1e-5)
    tokens_per_iter = 4 * 3 * 16  # gradient_accumulation_steps x batch_size x block_size
    flops_per_token = json.loads((ddp / "summary.json").read_text())["flops_per_token"]
    for record in (r for r in read_log(ddp) if r["type"] == "train"):
        seconds = record["ms_per_iter"] / 1000
        assert record["tokens_per_s"] == pytest.approx(tokens_per_iter / seconds, rel=1e-9)
        # MFU is a GPU's: the FLOPs of its own half of the tokens over one peak_flops
        mfu = flops_per_token * tokens_per_iter / 2 / seconds / 1e12
        assert record["mfu"] == pytest.approx(mfu, rel=1e-9)
    torchrun(tmp_path / "ddp", tiny(tmp_path / "ddp", data_dir, max_iters=stopped + 2,
                                    init_from="resume", **common))
    assert log_losses(ddp) == pytest.approx(reference, rel=1e-5)
    torch.testing.assert_close(params(ddp), params(one), rtol=1e-5, atol=1e-6)
