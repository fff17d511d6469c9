"""compare.py, sweep.py and frontier.py: budgets resolved to iterations, scaled schedules, the resumable sweep,
the fit of loss against compute, the tables and the optional plots."""

import errno
import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import shlex
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import compare
import configurator
import frontier
import sweep
import train
from checkpoint import CHECKPOINT_NAME
from conftest import REPO
from eval_hellaswag import evaluate_checkpoint
from model import GPT, GPTConfig
from tokenizer import write_meta

TEXT = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer. " * 40


@pytest.fixture
def tiny_run(tmp_path):
    """A character-level dataset and a config small enough to train in a second or two."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    chars = "".join(sorted(set(TEXT)))
    ids = np.array([chars.index(ch) for ch in TEXT], dtype=np.uint16)
    split = int(0.9 * len(ids))
    ids[:split].tofile(data_dir / "train.bin")
    ids[split:].tofile(data_dir / "val.bin")
    write_meta(data_dir, {"tokenizer": "char", "vocab_size": len(chars), "chars": chars,
                          "tokens": {"train": split, "val": len(ids) - split}})
    config = tmp_path / "tiny.py"
    config.write_text(
        f"data_dir = {str(data_dir)!r}\n"
        "n_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 16\nbatch_size = 4\n"
        "gradient_accumulation_steps = 1\nmax_iters = 6\nlr_decay_iters = 6\nwarmup_iters = 1\n"
        "eval_interval = 3\neval_iters = 2\nlog_interval = 1\nlearning_rate = 1e-2\nmin_lr = 1e-3\n"
        "device = 'cpu'\ncompile = False\nbias = True\nnum_threads = 1\n"
    )
    return config, tmp_path / "compare"


def test_relative_paths_mean_the_same_to_the_plan_and_to_the_runs(tiny_run, monkeypatch):
    config, out_dir = tiny_run
    monkeypatch.chdir(config.parent)  # a working directory that is not the repository
    assert compare.main([config.name, "--variants=efficient", "--data_dir=data", "--out_dir=compare",
                         "--max_iters=2"]) == 0
    assert json.loads((out_dir / "efficient-seed0" / "summary.json").read_text())["iterations"] == 2


def plan(config, out_dir, *argv):
    args, overrides = compare.parse_args([str(config), f"--out_dir={out_dir}", *argv])
    return sweep.plan_sweep(args, overrides, out_dir)


@pytest.mark.slow
def test_compare_two_variants_writes_table_json_and_plot(tiny_run, capsys):
    config, out_dir = tiny_run
    assert compare.main([str(config), "--variants=standard,efficient", f"--out_dir={out_dir}", "--max_iters=6"]) == 0

    results = json.loads((out_dir / "results.json").read_text())
    assert list(results["results"]) == ["1x2x16"] and list(results["results"]["1x2x16"]) == ["standard", "efficient"]
    for variant, row in results["results"]["1x2x16"].items():
        for key in ("attention_params", "n_params", "flops_per_token", "final_train_loss", "final_val_loss",
                    "val_ppl", "mean_ms_per_iter", "tokens_per_s", "peak_memory_mb", "wall_time_s", "training_flops"):
            assert len(row[key]["runs"]) == 1 and row[key]["std"] == 0.0, (variant, key)
        run = next(r for r in results["runs"] if r["attention"] == variant)
        assert run["iterations"] == 6 and run["tokens"] == 6 * 4 * 16
        assert run["training_flops"] == run["flops_per_token"] * 6 * 4 * 16
        assert run["step_seconds"] == pytest.approx(run["mean_ms_per_iter"] / 1000 * 6)
        assert row["val_ppl"]["mean"] == pytest.approx(np.exp(row["final_val_loss"]["mean"]))
    # d=16: standard has 4 learned 16x16 projections with biases, efficient 2
    assert results["results"]["1x2x16"]["standard"]["attention_params"]["mean"] == 4 * (16 * 16 + 16)
    assert results["results"]["1x2x16"]["efficient"]["attention_params"]["mean"] == 2 * (16 * 16 + 16)

    table = (out_dir / "results.md").read_text().splitlines()
    header = next(line for line in table if line.startswith("| attention |"))
    for column in ("attn params/layer", "model params", "FLOPs/token", "iterations", "training FLOPs", "train loss",
                   "val loss", "val ppl", "ms/iter", "tokens/s", "peak memory (MB)", "step time (s)", "wall time (s)"):
        assert f"| {column} |" in header
    assert "HellaSwag" not in header  # no data given, so no empty columns
    efficient_row = next(line for line in table if line.startswith("| efficient |"))
    assert "| 544 (1) |" in efficient_row  # fewer attention parameters ranks first

    out = capsys.readouterr().out
    command = next(line for line in out.splitlines() if "train.py" in line and "--attention=standard" in line)
    settings = dict(configurator.parse_override(word) for word in shlex.split(command) if word.startswith("--"))
    assert settings["attention"] == "standard" and settings["seed"] == 0 and settings["max_iters"] == 6
    assert settings["out_dir"] == str(out_dir.resolve() / "standard-seed0")
    last_line = f"wrote {out_dir.resolve() / 'results.md'}, {out_dir.resolve() / 'results.json'}"
    if importlib.util.find_spec("matplotlib") is None:
        assert out.endswith(f"\n{last_line}; matplotlib is not installed, so loss.png is skipped "
                            f"(pip install matplotlib)\n")  # no plots claimed, nor a frontier.png of one size
    else:
        assert (out_dir / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert out.endswith(f"\n{last_line} and the plots beside them\n")


def test_a_full_disk_at_the_tables_is_one_error_line_and_a_rerun_writes_them(tiny_run, capsys, monkeypatch):
    config, out_dir = tiny_run
    argv = [str(config), "--variants=efficient", f"--out_dir={out_dir}", "--max_iters=2"]

    def full_disk(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(frontier, "write_text_atomic", full_disk)
    assert compare.main(argv) == 1
    assert capsys.readouterr().err == (f"error: writing the results: [Errno 28] No space left on device: "
                                       f"'{out_dir.resolve() / 'results.md'}'; every run is finished and kept, so the "
                                       f"same command, rerun, writes them without training\n")
    monkeypatch.undo()
    assert compare.main(argv) == 0
    assert "finished already, skipped" in capsys.readouterr().out and (out_dir / "results.md").is_file()


@pytest.mark.slow
def test_several_seeds_report_mean_and_spread(tiny_run):
    config, out_dir = tiny_run
    compare.main([str(config), "--variants=optimized", "--seeds=2", f"--out_dir={out_dir}", "--max_iters=3"])
    results = json.loads((out_dir / "results.json").read_text())
    val = results["results"]["1x2x16"]["optimized"]["final_val_loss"]
    assert len(val["runs"]) == 2 and val["runs"][0] != val["runs"][1]  # different seeds, different runs
    assert val["mean"] == pytest.approx(sum(val["runs"]) / 2) and val["std"] > 0
    assert "±" in (out_dir / "results.md").read_text()


# values of every type a run's train.py command may carry, strings that read as a number or a bool among them
TRAIN_VALUES = {"attention": "efficient", "device": "cpu", "out_dir": "/tmp/a run/out", "data_dir": "it's here",
                "hellaswag_file": 'say "hi" to $HOME', "wandb_run_name": "1", "wandb_project": "True",
                "dataset": "6e-4", "max_iters": 40, "seed": 0, "learning_rate": 1e-3, "min_lr": 6e-4,
                "weight_decay": 0.1, "dropout": 0.0, "compile": False, "decay_lr": True}


def test_a_printed_train_command_reads_back_as_the_planned_values():
    line = sweep.shell_join(["python", "train.py", *(configurator.format_override(k, v) for k, v in TRAIN_VALUES.items())])
    words = shlex.split(line)
    settings = dict(configurator.parse_override(word) for word in words[2:])
    assert settings == TRAIN_VALUES
    assert {key: type(value) for key, value in settings.items()} == {k: type(v) for k, v in TRAIN_VALUES.items()}
    for plain in ("--attention=efficient", "--max_iters=40", "--learning_rate=0.001", "--min_lr=0.0006",
                  "--compile=False", "--dataset='6e-4'"):
        assert plain in words
    # as typed: bare where the shell allows, a word with single quotes in double quotes
    for typed in (" --attention=efficient ", " --learning_rate=0.001 ", " \"--wandb_run_name='1'\" ",
                  " \"--data_dir=it's here\" ", " '--out_dir=/tmp/a run/out' "):
        assert typed in line


def test_a_run_recorded_with_quoted_values_is_the_same_plan():
    planned = ["config.py", "--attention=standard", "--out_dir=/tmp/out", "--learning_rate=0.001"]
    assert sweep.arguments_changed(["config.py", "--attention='standard'", "--out_dir='/tmp/out'",
                                    "--learning_rate=1e-3"], planned) == ""
    assert sweep.arguments_changed(["config.py", "--attention=efficient", "--out_dir=/tmp/out",
                                    "--learning_rate=0.001"], planned) == "attention='efficient' then, 'standard' now"
    assert sweep.arguments_changed(["other.py", "--attention=standard", "--out_dir=/tmp/out"], planned) == (
        "config='other.py' then, 'config.py' now, learning_rate not given then, 0.001 now")
    # a key train.py no longer takes is another plan, named as it was recorded
    assert sweep.arguments_changed([*planned, "--gone_key=3"], planned) == "gone_key='3' then, not given now"


# -----------------------------------------------------------------------------
# budgets and schedules, resolved before anything trains

def direct_flops_per_token(config, variant, shape):
    c = train.resolve_config(train.get_config([str(config)]))
    n_layer, n_head, n_embd = shape
    args = {k: c[k] for k in train.MODEL_ARG_KEYS} | dict(attention=variant, n_layer=n_layer, n_head=n_head,
                                                           n_embd=n_embd, vocab_size=len(set(TEXT)))
    return GPT(GPTConfig(**args)).flops_per_token()


@pytest.mark.parametrize("budget", [[], ["--budget_flops=3e8"]])
def test_flop_matched_iterations_are_budget_over_cost_per_iteration(tiny_run, budget):
    config, out_dir = tiny_run
    runs, budgets = plan(config, out_dir, "--match=flops", "--sizes=1x1x16,2x2x32", "--max_iters=40",
                         "--warmup_iters=4", "--eval_interval=10", *budget)
    assert len(runs) == 2 * 4 and not out_dir.exists()  # planning trains nothing and writes nothing
    tokens_per_iter = 4 * 16
    for shape in ((1, 1, 16), (2, 2, 32)):
        label = sweep.size_label(shape)
        expected_budget = 3e8 if budget else direct_flops_per_token(config, "standard", shape) * tokens_per_iter * 40
        assert budgets[label] == expected_budget
        for run in (r for r in runs if r.size == label):
            flops_per_token = direct_flops_per_token(config, run.variant, shape)
            assert run.flops_per_token == flops_per_token
            iterations = max(1, round(expected_budget / (flops_per_token * tokens_per_iter)))
            assert run.iterations == iterations
            assert run.schedule == {"max_iters": iterations, "lr_decay_iters": iterations,
                                    "warmup_iters": round(4 * iterations / 40), "eval_interval": round(10 * iterations / 40)}
    cheaper = {r.variant: r.iterations for r in runs if r.size == "2x2x32"}
    assert cheaper["standard"] < cheaper["optimized"] < cheaper["efficient"]
    assert cheaper["standard"] == (29 if budget else 40)  # 3e8 / (161,280 FLOPs x 64 tokens) = 29.07


def test_token_budget_and_the_iterations_default(tiny_run):
    config, out_dir = tiny_run
    runs, budgets = plan(config, out_dir, "--match=tokens", "--budget_tokens=640", "--variants=standard,super")
    assert budgets == {"1x2x16": 640} and [r.iterations for r in runs] == [10, 10]  # 640 tokens / 64 per iteration
    runs, _ = plan(config, out_dir, "--match=tokens", "--budget_tokens=640", "--variants=standard",
                   "--gradient_accumulation_steps=2")
    assert [r.iterations for r in runs] == [5]  # an iteration is every micro-batch: 2 x 4 sequences of 16
    runs, budgets = plan(config, out_dir, "--variants=efficient", "--max_iters=7")
    assert [r.iterations for r in runs] == [7] and runs[0].run_dir == out_dir / "efficient-seed0"


def test_iteration_matched_runs_decay_over_their_own_iterations(tiny_run):
    """config/train_gpt2.py --max_iters=5000 keeps the config's lr_decay_iters=600000: the cosine must end
    where the run ends, as in every other budget, and warmup and evaluation must fall inside the run."""
    config, out_dir = tiny_run
    runs, _ = plan(config, out_dir, "--variants=standard,efficient", "--max_iters=5", "--lr_decay_iters=600",
                   "--warmup_iters=20", "--eval_interval=100")
    for run in runs:
        assert run.iterations == 5
        assert run.schedule == {"max_iters": 5, "lr_decay_iters": 5, "warmup_iters": 4, "eval_interval": 5}
        c = configurator.resolve_config(configurator.get_config(run.train_args))
        assert (c["max_iters"], c["lr_decay_iters"], c["warmup_iters"]) == (5, 5, 4)  # what train.py is given
    args = compare.parse_args([str(config), f"--out_dir={out_dir}", "--variants=standard,efficient"])[0]
    assert compare.describe_plan(args, runs, {"1x2x16": 5}).endswith(
        "note: the warmup takes every step but the last in 2 of the 2 runs, so their learning rate never decays: "
        "pass a smaller --warmup_iters= (it scales with each run)")
    # an --lr_decay_iters that the config's warmup_iters would refuse is replaced all the same, not refused
    runs, _ = plan(config, out_dir, "--variants=standard", "--max_iters=5", "--lr_decay_iters=5", "--warmup_iters=20")
    assert runs[0].schedule["lr_decay_iters"] == 5 and runs[0].schedule["warmup_iters"] == 4
    runs, _ = plan(config, out_dir, "--variants=standard", "--max_iters=5", "--warmup_iters=3")
    assert "note: the warmup" not in compare.describe_plan(args, runs, {"1x2x16": 5})


def test_a_budget_stopped_run_ends_on_its_schedules_final_learning_rate(tiny_run):
    config, out_dir = tiny_run
    assert compare.main([str(config), "--variants=efficient", "--match=flops", "--max_iters=20",
                         "--warmup_iters=2", f"--out_dir={out_dir}"]) == 0
    run = json.loads((out_dir / "results.json").read_text())["plan"][0]
    assert run["iterations"] > 20  # efficient gets the FLOPs standard spends in 20 iterations
    c = train.resolve_config(train.get_config([str(config)]) | {
        k: run[k] for k in ("max_iters", "lr_decay_iters", "warmup_iters")})
    steps = [json.loads(line) for line in (out_dir / "efficient-seed0" / "log.jsonl").read_text().splitlines()]
    steps = [s for s in steps if s["type"] == "train"]
    assert [s["iter"] for s in steps] == list(range(1, run["iterations"] + 1))
    assert [s["lr"] for s in steps] == [train.get_lr(s["iter"] - 1, c) for s in steps]
    # the last step is the cosine's last: within its final step of min_lr, far below the peak
    last_step = 0.5 * (1 - math.cos(math.pi / (run["iterations"] - run["warmup_iters"]))) * (1e-2 - 1e-3)
    assert 1e-3 <= steps[-1]["lr"] <= 1e-3 + last_step + 1e-12


@pytest.mark.slow
def test_runs_of_one_seed_train_on_the_same_batches_and_are_evaluated_on_the_same_ones(tiny_run, monkeypatch):
    """The variants of one seed are paired: FLOP-matched runs of different lengths draw the same training
    batches in the same order (the cheaper one's extra steps come after them), whatever their models' own
    draws from the RNG, and every evaluation of any of them reads the same validation windows. Another
    seed draws others."""
    config, out_dir = tiny_run
    runs, _ = plan(config, out_dir, "--variants=standard,efficient,super", "--seeds=2", "--match=flops",
                   "--max_iters=5", "--eval_interval=2")
    read, evaluating = [], []
    real_get, real_estimate = train.Batches.get, train.estimate_loss

    def get(self, ix):
        read.append(("eval" if evaluating else "step", Path(self.path).stem, ix.tolist()))
        return real_get(self, ix)

    def estimate_loss(run):
        evaluating.append(True)
        try:
            return real_estimate(run)
        finally:
            evaluating.clear()

    monkeypatch.setattr(train.Batches, "get", get)
    monkeypatch.setattr(train, "estimate_loss", estimate_loss)
    drawn = {}
    for run in runs:
        read.clear()
        train.train(configurator.resolve_config(configurator.get_config(run.train_args)), verbose=False)
        drawn[run.variant, run.seed] = {"steps": [ix for phase, _, ix in read if phase == "step"],
                                        "val": [ix for phase, split, ix in read if phase == "eval" and split == "val"]}
    iterations = {run.variant: run.iterations for run in runs}
    assert iterations["standard"] < iterations["efficient"]  # the same FLOPs, more steps
    for seed in (0, 1):
        longest = drawn["efficient", seed]["steps"]
        for variant in iterations:
            mine = drawn[variant, seed]
            assert mine["steps"] == longest[:iterations[variant]]  # one micro-batch a step, in one order
            assert len(mine["val"]) > 1 and all(ix == drawn["standard", seed]["val"][0] for ix in mine["val"])
    assert drawn["standard", 0]["steps"] != drawn["standard", 1]["steps"]
    assert drawn["standard", 0]["val"][0] != drawn["standard", 1]["val"][0]


@pytest.mark.slow
def test_a_time_matched_sweep_plans_from_its_probes_and_a_rerun_reuses_them(tiny_run, capsys):
    config, out_dir = tiny_run
    argv = [str(config), "--variants=standard,efficient", "--match=time", "--budget_seconds=0.1", "--probe_iters=3",
            f"--out_dir={out_dir}"]
    assert compare.main(argv) == 0
    planned = json.loads((out_dir / "results.json").read_text())["plan"]
    probe_files = {}
    for run in planned:
        probe_dir = out_dir / "probes" / "1x2x16" / run["variant"]
        probe = json.loads((probe_dir / "summary.json").read_text())
        assert probe["stop_reason"] == "max_iters" and probe["iterations"] == 3
        assert run["iterations"] == max(1, round(0.1 / (probe["mean_ms_per_iter"] / 1000)))
        trained = json.loads((out_dir / f"{run['variant']}-seed0" / "summary.json").read_text())
        assert trained["stop_reason"] == "max_iters" and trained["iterations"] == run["iterations"]
        steps = sweep.read_log(out_dir / f"{run['variant']}-seed0")
        assert [s["iter"] for s in steps if s["type"] == "train"] == list(range(1, run["iterations"] + 1))
        probe_files.update({path: (path.stat().st_mtime_ns, path.read_bytes()) for path in probe_dir.iterdir()})

    capsys.readouterr()
    assert compare.main(argv) == 0
    assert capsys.readouterr().out.count("finished already, skipped") == 2
    assert json.loads((out_dir / "results.json").read_text())["plan"] == planned
    assert {path: (path.stat().st_mtime_ns, path.read_bytes()) for path in probe_files} == probe_files  # not probed again


@pytest.mark.slow
def test_a_timing_probe_of_other_settings_is_run_again(tiny_run):
    config, out_dir = tiny_run
    probe = out_dir / "probes" / "1x2x16" / "efficient"
    argv = ["--variants=efficient", "--reference=efficient", "--match=time", "--probe_iters=2"]
    plan(config, out_dir, *argv)
    first = (probe / "summary.json").read_bytes()
    plan(config, out_dir, *argv)
    assert (probe / "summary.json").read_bytes() == first  # the same settings: the same probe
    plan(config, out_dir, *argv, "--batch_size=8")  # twice the tokens per step: another step time
    assert json.loads((probe / "summary.json").read_text())["tokens_per_iter"] == 8 * 16


def test_sizes_are_ordered_by_their_compute(tiny_run):
    """At block_size 1024 one layer of 256 costs less per token than twelve of 64 (attention's T terms):
    the last size, whose losses loss.png plots, is the largest."""
    config, out_dir = tiny_run
    _, budgets = plan(config, out_dir, "--variants=standard", "--match=flops", "--sizes=12x4x64,1x1x256",
                      "--block_size=1024")
    assert list(budgets) == ["1x1x256", "12x4x64"] and budgets["1x1x256"] < budgets["12x4x64"]


def test_sizes_scale_the_mlp_width_and_key_value_heads_at_the_configs_ratio(tiny_run, capsys):
    """A SwiGLU or grouped-query config (the Llama ones) swept over sizes: its intermediate_size follows
    n_embd and its n_kv_head n_head, as the config has them, instead of staying the config's at every size."""
    config, out_dir = tiny_run
    config.write_text(config.read_text() + "mlp = 'swiglu'\nintermediate_size = 40\nn_kv_head = 1\n")  # 2.5 d, 2 per head
    runs, _ = plan(config, out_dir, "--variants=standard", "--sizes=1x2x16,2x4x32,1x6x24")
    shapes = {r.size: configurator.resolve_config(configurator.get_config(r.train_args)) for r in runs}
    assert {size: (c["intermediate_size"], c["n_kv_head"]) for size, c in shapes.items()} == {
        "1x2x16": (40, 1), "2x4x32": (80, 2), "1x6x24": (60, 3)}
    assert compare.main([str(config), f"--out_dir={out_dir}", "--variants=standard", "--sizes=1x2x16,1x3x24"]) == 1
    assert capsys.readouterr().err.startswith("error: size 1x3x24: the config shares each key/value head among 2 "
                                              "query heads (n_kv_head=1, n_head=2), which do not divide its n_head=3")


@pytest.mark.slow
def test_the_summary_names_the_unit_of_each_sizes_budget(tiny_run):
    """--match=iters budgets 2 iterations at every size, not 2 FLOPs beside a fit on FLOPs."""
    config, out_dir = tiny_run
    assert compare.main([str(config), "--variants=standard", "--sizes=1x1x16,1x2x16", "--max_iters=2",
                         f"--out_dir={out_dir}"]) == 0
    summary = (out_dir / "results.md").read_text().split("## Summary")[1]
    assert "| val loss at 1x1x16 (budget 2 iterations) | val loss at 1x2x16 (budget 2 iterations) |" in summary
    results = json.loads((out_dir / "results.json").read_text())
    assert results["budgets"] == {"1x1x16": 2, "1x2x16": 2} and results["budget_unit"] == "iterations"


def test_a_run_of_one_iteration_still_evaluates_every_iteration(tiny_run):
    config, out_dir = tiny_run
    runs, _ = plan(config, out_dir, "--variants=standard", "--match=tokens", "--budget_tokens=64", "--max_iters=6",
                   "--eval_interval=3")
    assert [(r.iterations, r.schedule["eval_interval"]) for r in runs] == [(1, 1)]  # 3 x 1/6 rounds to none


def test_seeds_are_the_outermost_loop_and_sizes_follow_their_compute_under_every_budget(tiny_run):
    config, out_dir = tiny_run
    runs, budgets = plan(config, out_dir, "--variants=standard,efficient", "--seeds=2", "--sizes=2x2x32,1x1x16")
    assert list(budgets) == ["1x1x16", "2x2x32"]  # --match=iters: every size's budget is max_iters, not its order
    expected = [(seed, size, variant) for seed in (0, 1) for size in ("1x1x16", "2x2x32")
                for variant in ("standard", "efficient")]
    assert [(r.seed, r.size, r.variant) for r in runs] == expected


@pytest.mark.slow
def test_the_timing_probe_runs_under_the_sweeps_launcher(tiny_run):
    """Under torchrun an iteration's micro-batches are split over the processes: a probe without the
    launcher would time another thing than the runs do."""
    config, out_dir = tiny_run
    calls, wrapper = config.parent / "calls.txt", config.parent / "launcher.py"
    wrapper.write_text("import os, runpy, sys\n"
                       f"open({str(calls)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
                       "sys.argv = sys.argv[1:]\nsys.path.insert(0, os.path.dirname(sys.argv[0]))\n"
                       "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    assert compare.main([str(config), "--variants=efficient", "--match=time", "--budget_seconds=0.05",
                         "--probe_iters=2", f"--launcher={sys.executable} {wrapper}", f"--out_dir={out_dir}"]) == 0
    launched = calls.read_text().splitlines()
    # the probes of efficient and of the reference, standard, then the run
    assert len(launched) == 3 and all("/probes/" in call for call in launched[:2]) and "efficient-seed0" in launched[2]


@pytest.mark.parametrize("argv, message", [
    (["--variants=standard,fast"], "choose among standard, optimized, efficient, super"),
    (["--variants=standard,efficient,standard"], "a variant is listed twice"),  # one folder, trained twice
    (["--attention=super"], "sets attention, seed, out_dir and init_from itself"),
    (["--seed=3"], "sets attention, seed, out_dir and init_from itself"),  # train.py's seed, not --seeds
    (["--max_iters", "5"], "passed as --key=value"),
    (["--match=energy"], "invalid choice: 'energy'"),
    (["--sizes=2x2"], "'2x2' is not n_layer x n_head x n_embd"),
    (["--sizes=2x3x64"], "n_embd must be a multiple of n_head"),
    (["--sizes=2x2x64,2x2x64"], "listed twice"),
    (["--sizes=2x2x64", "--n_layer=3"], "each size sets n_layer, n_head and n_embd"),
    (["--match=flops", "--budget_flops=-1"], "must be a positive number"),
    (["--match=tokens", "--budget_flops=1e9"], "--budget_flops is the budget of --match=flops"),
    (["--learning_rates=1e-3,fast"], "give comma-separated numbers"),
    (["--learning_rates=1e-3,0"], "each must be a positive number, listed once"),
    (["--learning_rates=1e-3,1e-3"], "each must be a positive number, listed once"),
    (["--learning_rates=1e-3,1.0000001e-3"], "equal to 6 significant digits"),  # would share a run folder
    (["--learning_rates=1e-3", "--min_lr=1e-5"], "each run's learning_rate and min_lr are set from the list"),
    (["--launcher=torchrunn --standalone"], "'torchrunn' is not a program on PATH"),  # found before the plan
    ([f"--launcher={sys.executable} 'x"], "no closing quotation: quote it as a shell would"),
    (["--launcher= "], "--launcher is blank"),
    ([f"--launcher={sys.executable} train.py --standalone --nproc_per_node=2"], "compare.py adds train.py and its"),
    (["--seeds=0"], "--seeds must be at least 1"),
    (["config/quickstart.py"], "'config/quickstart.py': compare.py takes one config file; put its settings in"),
    (["--match=flops", "--budget_flops=0"], "must be a positive number"),
    (["--init_from=resume"], "sets attention, seed, out_dir and init_from itself"),
    (["--learning_rates=1e-3", "--learning_rate=1e-2"], "each run's learning_rate and min_lr are set from the list"),
    (["--seed=3"], "(--variants, --seeds=N for seeds 0..N-1, --out_dir)"),
    (["--hellaswag_limit=5"], "--hellaswag_limit limits the examples of --hellaswag_file: give the file too"),
    (["--matchs=flops"], "--matchs=flops: did you mean compare.py's --match?"),  # not train.py's batch_size
    (["--size=2x2x64"], "--size=2x2x64: did you mean compare.py's --sizes?"),
    (["--learning_rate=1e-3,2e-3"], "--learning_rate=1e-3,2e-3: did you mean compare.py's --learning_rates?"),
])
def test_bad_arguments_are_refused_before_anything_trains(tiny_run, argv, message, capsys):
    config, out_dir = tiny_run
    with pytest.raises(SystemExit):
        compare.main([str(config), f"--out_dir={out_dir}", *argv])
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0] and not out_dir.exists()


def test_a_config_file_missing_from_another_folder_says_where_to_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        compare.main(["config/quickstart.py"])
    assert f"does not exist in {tmp_path}: run the command from the repository's folder ({REPO})" in \
        capsys.readouterr().err


def test_data_not_prepared_yet_names_the_command_that_prepares_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no data/ here
    shutil.copytree(REPO / "config", tmp_path / "config")
    assert compare.main(["config/train_shakespeare_char_cpu.py", "--out_dir=compare"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: data folder data/shakespeare_char not found") and err.count("\n") == 1
    assert "prepare the dataset first: python prepare_char.py --input=path/to/tinyshakespeare.txt" in err
    assert not (tmp_path / "compare").exists()


def test_a_mistyped_train_py_key_gets_train_pys_suggestion(tiny_run, capsys):
    config, out_dir = tiny_run
    assert compare.main([str(config), f"--out_dir={out_dir}", "--eval_iter=2"]) == 1  # not --probe_iters
    assert "unknown config key 'eval_iter' in '--eval_iter=2'; did you mean 'eval_iters'?" in capsys.readouterr().err


def test_a_variant_the_config_does_not_fit_is_one_error_line(tiny_run, capsys):
    """Grouped-query keys (n_kv_head < n_head) need standard's W^K and W^V: the plan says so for the others."""
    config, out_dir = tiny_run
    assert compare.main([str(config), f"--out_dir={out_dir}", "--variants=standard,efficient", "--n_kv_head=1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: attention='efficient': n_kv_head=1 != n_head=2 needs learned W^K and W^V")
    assert err.count("\n") == 1 and not out_dir.exists()


@pytest.mark.slow
def test_a_comparison_of_other_runs_never_replaces_the_results_of_another(tiny_run, capsys, monkeypatch):
    """Into an out_dir whose results.md tabulates runs the new plan lacks, nothing trains and nothing is
    replaced, not even a timing probe (refused before the plan); one extended by a variant replaces them."""
    config, out_dir = tiny_run
    first = [str(config), f"--out_dir={out_dir}", "--variants=standard,efficient", "--max_iters=2"]
    assert compare.main(first) == 0
    before = (out_dir / "results.md").read_text()
    with monkeypatch.context() as patched:
        patched.setattr(sweep, "plan_sweep", lambda *args: pytest.fail("planned (and probed) before the refusal"))
        assert compare.main([str(config), f"--out_dir={out_dir}", "--variants=standard,super", "--max_iters=2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {out_dir} holds the results of another comparison (python compare.py ")
    assert f"1 of whose runs this one does not plan (e.g. {out_dir / 'efficient-seed0'})" in err
    assert (out_dir / "results.md").read_text() == before and not (out_dir / "super-seed0").exists()
    assert compare.main(first[:2] + ["--variants=standard,efficient,super", "--max_iters=2"]) == 0
    assert "| super |" in (out_dir / "results.md").read_text()


def test_a_ctrl_c_while_planning_is_one_line(tiny_run, monkeypatch, capsys):
    config, out_dir = tiny_run

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "plan_sweep", interrupted)
    assert compare.main([str(config), f"--out_dir={out_dir}"]) == 130
    assert capsys.readouterr().err == ("stopped by Ctrl-C before the next run started; rerun the same command to "
                                       "continue (finished runs are skipped)\n")


def test_an_out_dir_under_a_file_is_refused_before_the_plan(tiny_run, capsys):
    config, out_dir = tiny_run
    a_file = out_dir.parent / "a_file"
    a_file.write_text("x")
    for given in (a_file, a_file / "sweep"):
        with pytest.raises(SystemExit):
            compare.main([str(config), f"--out_dir={given}"])
        assert capsys.readouterr().err == (f"error: --out_dir={given}: {a_file} is a file, not a folder; choose "
                                           f"another --out_dir (python compare.py --help lists the options)\n")
    assert a_file.read_text() == "x"


def test_a_hellaswag_file_that_cannot_be_scored_is_refused_before_anything_trains(tiny_run, capsys):
    config, out_dir = tiny_run
    bad, foreign = out_dir.parent / "hellaswag.jsonl", out_dir.parent / "foreign.jsonl"
    bad.write_text("{oops\n")
    # the character-level data has no "Z": the run could not score this one after training
    foreign.write_text(json.dumps({"ctx": "Z", "endings": ["a", "b", "c", "d"], "label": 0}) + "\n")
    for path in (bad, out_dir.parent / "missing.jsonl", foreign):
        assert compare.main([str(config), f"--out_dir={out_dir}", f"--hellaswag_file={path}"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: --hellaswag_file: ") and path.name in err[0]
        assert not out_dir.exists()
    good = out_dir.parent / "good.jsonl"
    good.write_text(json.dumps({"ctx": "To be, or", "endings": [" not", " to", " be", " that"], "label": 0}) + "\n")
    assert compare.main([str(config), f"--out_dir={out_dir}", f"--hellaswag_file={good}",
                         "--save_checkpoints=False"]) == 1
    assert capsys.readouterr().err == ("error: --hellaswag_file scores each run's checkpoint, and "
                                       "save_checkpoints=False writes none: drop one or the other\n")
    assert not out_dir.exists()


@pytest.mark.parametrize("argv, message", [
    (["--match=flops", "--max_iters=0"], "max_iters must be at least 1"),
    (["--max_iters=0"], "max_iters must be at least 1"),  # --match=iters stretches the schedule too, by 1
    (["--eval_only=True"], "eval_only=True: a sweep trains every run"),  # not one failed run after another
    (["--match=tokens", "--budget_tokens=10"], "is less than half an iteration of"),  # an iteration is 64 tokens
    ([f"--launcher={sys.executable} -m torch.distributed.run --standalone --nproc_per_node=2"],
     "'gradient_accumulation_steps'=1 must be divisible by the number of processes (2)"),  # not as run 1 starts
])
def test_a_budget_that_cannot_be_planned_is_one_error_line(tiny_run, argv, message, capsys):
    config, out_dir = tiny_run
    assert compare.main([str(config), f"--out_dir={out_dir}", *argv]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0] and not out_dir.exists()


@pytest.mark.slow
def test_a_stop_while_scoring_hellaswag_keeps_the_tables_and_the_scores_so_far(tiny_run, monkeypatch, capsys):
    config, out_dir = tiny_run
    hellaswag = config.parent / "hellaswag.jsonl"
    hellaswag.write_text(json.dumps({"ctx": "To be, or", "endings": [" not", " to", " be", " that"], "label": 0}) + "\n")
    scored = []

    def score(run_dir, data_file, limit):  # what is tested is the sweep around the scoring
        scored.append(run_dir.name)
        if len(scored) == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler stopping the job would
        return {"acc": 0.25, "acc_norm": 0.5, "acc_char_norm": 0.75, "iter_num": 2}

    monkeypatch.setattr(compare, "evaluate_checkpoint", score)
    argv = [str(config), "--variants=standard,efficient", f"--out_dir={out_dir}", f"--hellaswag_file={hellaswag}",
            "--max_iters=2"]
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert compare.main(argv) == 130
    err = capsys.readouterr().err
    assert "stopped while scoring HellaSwag" in err
    assert err.endswith(f"wrote {out_dir / 'results.md'}; matplotlib is not installed, so loss.png is skipped "
                        f"(pip install matplotlib)\n")
    table = (out_dir / "results.md").read_text()
    assert "| val loss |" in table and "HellaSwag" not in table
    assert compare.main(argv) == 0
    assert capsys.readouterr().out.count("matplotlib is not installed") == 1  # not once per writing of the tables
    assert scored == ["standard-seed0", "efficient-seed0", "efficient-seed0"]  # standard's score was kept
    table = (out_dir / "results.md").read_text()
    assert "| HellaSwag acc |" in table and table.count("| 0.2500 (1) |") == 2
    assert "| HellaSwag of iteration |" in table


def test_hellaswag_scores_are_kept_only_for_the_same_file_limit_and_checkpoint(tmp_path, monkeypatch):
    (tmp_path / CHECKPOINT_NAME).write_bytes(b"trained")
    data = tmp_path / "hellaswag.jsonl"
    data.write_text("{}\n")
    scored = []

    def score(run_dir, data_file, limit):
        scored.append(limit)
        return {"acc": 0.25, "acc_norm": 0.5, "acc_char_norm": 0.75, "iter_num": 4}

    monkeypatch.setattr(compare, "evaluate_checkpoint", score)
    for limit in (None, None, 1):
        scores = compare.hellaswag_scores(tmp_path, SimpleNamespace(hellaswag_file=str(data), hellaswag_limit=limit))
        assert scores == {"acc": 0.25, "acc_norm": 0.5, "acc_char_norm": 0.75, "iter": 4}
    os.replace(tmp_path / CHECKPOINT_NAME, tmp_path / "old.pt")  # a new checkpoint, as a retrained run leaves
    (tmp_path / CHECKPOINT_NAME).write_bytes(b"trained again")
    compare.hellaswag_scores(tmp_path, SimpleNamespace(hellaswag_file=str(data), hellaswag_limit=1))
    assert scored == [None, 1, 1]


def test_an_error_while_scoring_hellaswag_is_an_error_exit_that_keeps_the_tables(tmp_path, monkeypatch, capsys):
    def unreadable(summaries, plan, args):
        raise compare.HellaSwagError("line 3 is not JSON")

    monkeypatch.setattr(compare, "add_hellaswag", unreadable)
    assert compare.score_hellaswag(None, [], {}, lambda: "tables", tmp_path) == (1, "tables")
    assert capsys.readouterr().err == (f"error: scoring HellaSwag: line 3 is not JSON ({tmp_path / 'results.md'} "
                                       f"holds every other column)\n")


def test_a_learning_rate_sweep_needs_the_configs_learning_rate_for_min_lrs_ratio(tiny_run, capsys):
    config, out_dir = tiny_run
    config.write_text(config.read_text() + "learning_rate = 0.0\nmin_lr = 0.0\n")
    assert compare.main([str(config), f"--out_dir={out_dir}", "--learning_rates=1e-3"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the config's learning_rate is 0" in err[0] and not out_dir.exists()


def test_a_bad_config_for_one_size_is_one_error_line(tiny_run, capsys):
    config, out_dir = tiny_run
    assert compare.main([str(config), f"--out_dir={out_dir}", "--sizes=1x1x16", "--dropout=2.0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "dropout" in err[0] and not out_dir.exists()
    config.write_text(config.read_text() + "dropout = 2.0\n")
    assert compare.main([str(config), f"--out_dir={out_dir}"]) == 1
    assert capsys.readouterr().err.endswith(f"(dropout set in {config})\n") and not out_dir.exists()


def test_a_failed_training_run_is_one_error_line(tiny_run, capsys):
    config, out_dir = tiny_run
    code = compare.main([str(config), "--variants=efficient", f"--out_dir={out_dir}", "--block_size=4000"])
    assert code == 1
    assert "error: training efficient at 1x2x16, seed 0, failed with exit code" in capsys.readouterr().err


def test_help_prints_the_example_with_its_line_continuation():
    out = subprocess.run([sys.executable, "compare.py", "--help"], cwd=REPO, capture_output=True, text=True).stdout
    assert "--seeds=3 \\\n        --launcher=" in out


# -----------------------------------------------------------------------------
# ranks and ties

def seeds_of(**val_losses):
    """One size's results of variants with these val losses over seeds, as frontier.aggregate makes them."""
    return {variant: frontier.aggregate([{"final_val_loss": loss} for loss in losses])
            for variant, losses in val_losses.items()}


@pytest.mark.slow
def test_runs_of_different_set_ups_are_noted_in_the_header(tiny_run, capsys):
    """A sweep resumed on another machine or under another --launcher mixes set-ups: results.md says so."""
    config, out_dir = tiny_run
    argv = [str(config), f"--out_dir={out_dir}", "--variants=standard,efficient", "--max_iters=2"]
    assert compare.main(argv) == 0
    assert "set-ups" not in (out_dir / "results.md").read_text()
    summary_path = out_dir / "efficient-seed0" / "summary.json"
    summary_path.write_text(json.dumps(json.loads(summary_path.read_text()) | {"setups": ["2 x cpu, float32"]}))
    assert compare.main(argv) == 0
    assert ("**Note:** these runs trained on different set-ups (1 on 1 x cpu, float32; 1 on 2 x cpu, float32): "
            "their ms/iter") in (out_dir / "results.md").read_text()
    alike = [{"setups": ["1 x cpu, float32"]}] * 2
    assert frontier.mixed_setups_note(alike) == ""
    one_run_moved = [alike[0], {"setups": ["1 x cpu, float32", "1 x cuda, bfloat16"]}]  # resumed on a GPU
    assert "(2 on 1 x cpu, float32; 1 on 1 x cuda, bfloat16)" in frontier.mixed_setups_note(one_run_moved)


def test_a_difference_within_two_standard_errors_is_a_tie():
    """1.910, 1.928 and 1.935, each ± 0.01 over 3 seeds: 2 standard errors of a difference are
    2 √(0.01²/3 + 0.01²/3) = 0.0163. Optimized is 0.018 behind super: ranked, though within 2 standard
    deviations (0.02). Standard is 0.007 behind optimized: a tie."""
    table = frontier.markdown_table(seeds_of(super=[1.90, 1.91, 1.92], optimized=[1.918, 1.928, 1.938],
                                             standard=[1.925, 1.935, 1.945]), n_seeds=3)
    assert "| super | 1.9100 ± 0.0100 (1) |" in table
    assert "| optimized | 1.9280 ± 0.0100 (2) |" in table
    assert "| standard | 1.9350 ± 0.0100 (3=) |" in table


def test_the_tie_threshold_is_two_standard_errors_of_the_difference():
    """± 0.01 over 3 seeds: one standard error of a difference is √(2 · 0.01² / 3) = 0.00816."""
    se = math.sqrt(2 * 0.01 ** 2 / 3)
    reference = [1.90, 1.91, 1.92]
    for gap, tied in ((1.9 * se, True), (2.1 * se, False)):
        results = seeds_of(a=reference, b=[loss + gap for loss in reference])
        assert frontier.is_tie(results["a"]["final_val_loss"], results["b"]["final_val_loss"]) is tied, gap / se


def test_equal_means_share_a_rank_and_the_next_takes_the_next_rank():
    results = seeds_of(standard=[2.0, 2.1], optimized=[2.1, 2.0], efficient=[2.2, 2.3])
    assert frontier.rankings(results, "final_val_loss", "low") == {"standard": 1, "optimized": 1, "efficient": 2}


def test_one_seed_says_ties_cannot_be_told(tmp_path):
    rows, budgets = synthetic_summaries(["standard", "efficient"], seeds=1)
    for row in rows:  # 0.001 apart: with one seed, ranked as measured
        row["final_val_loss"] = 2.0 + 0.001 * (row["attention"] == "efficient")
    tables = one_seed_report(tmp_path, budgets, rows, ["standard", "efficient"]).split("## Summary")[0]
    assert tables.count("| 2.0000 (1) |") == tables.count("| 2.0010 (2) |") == 4 and "=)" not in tables
    assert tables.count("One seed: the ranks order single runs; with no spread over seeds to compare a difference "
                        "with, ties cannot be told.") == 4


# -----------------------------------------------------------------------------
# the fit

def test_the_fit_recovers_a_saturating_power_law():
    C = np.geomspace(1e10, 1e14, 5)
    fit = frontier.fit_loss_curve(C, 1.3 + 40.0 * C ** -0.12)
    assert fit["law"] == "E + A*C^-alpha"
    assert fit["E"] == pytest.approx(1.3, rel=1e-4) and fit["alpha"] == pytest.approx(0.12, rel=1e-3)
    assert fit["A"] == pytest.approx(40.0, rel=1e-2) and max(map(abs, fit["residuals"])) < 1e-6
    side, compute = frontier.reach(fit, 1.3 + 40.0 * 3e12 ** -0.12)
    assert side == "inside" and compute == pytest.approx(3e12, rel=1e-3)
    # no extrapolation either way: bounded by the largest size's compute, or by the smallest's
    assert frontier.reach(fit, 1.3 + 40.0 * 1e15 ** -0.12) == ("beyond", pytest.approx(1e14))
    assert frontier.reach(fit, 1.2) == ("beyond", pytest.approx(1e14))  # under E: never reached
    assert frontier.reach(fit, 1.3 + 40.0 * 1e9 ** -0.12) == ("below", pytest.approx(1e10))


def test_three_sizes_fit_the_plain_power_law_and_fewer_none():
    C = np.array([1e9, 1e10, 1e11])
    fit = frontier.fit_loss_curve(C, 25.0 * C ** -0.1)
    assert fit["law"] == "A*C^-alpha" and fit["E"] == 0.0
    assert fit["A"] == pytest.approx(25.0) and fit["alpha"] == pytest.approx(0.1)
    assert frontier.fit_loss_curve(C[:2], 25.0 * C[:2] ** -0.1) is None


COMPUTE_NEEDED = {"efficient": 1.5, "super": 1e-4}  # of standard's, for the same loss; the others 1


def synthetic_summaries(variants, seeds=2):
    """Runs of four sizes whose losses follow known curves: efficient needs exactly 1.5x standard's compute,
    super 1e-4x (so much less that its smallest size is below standard's largest-size loss already)."""
    rows = []
    for size, C in zip(("s", "m", "l", "xl"), (1e10, 1e11, 1e12, 1e13)):
        for seed in range(seeds):
            for variant in variants:
                compute = C / COMPUTE_NEEDED.get(variant, 1.0)
                rows.append(dict(attention=variant, size=size, seed=seed, training_flops=C, n_params=C / 1e6,
                                 wall_time_s=C / 1e9, final_val_loss=1.0 + 30.0 * compute ** -0.1))
    return rows, {size: C for size, C in zip(("s", "m", "l", "xl"), (1e10, 1e11, 1e12, 1e13))}


def test_compute_ratio_for_the_reference_loss_at_the_largest_size():
    rows, budgets = synthetic_summaries(["standard", "efficient"])
    analysis = frontier.analyse(rows, list(budgets), ["standard", "efficient"], "standard", seeds=2)
    assert analysis["target_loss"] == pytest.approx(1.0 + 30.0 * 1e13 ** -0.1)
    assert analysis["compute_for_target"]["standard"]["ratio"] == pytest.approx(1.0)
    # efficient's curve reaches standard's largest-size loss only beyond the largest measured compute
    assert analysis["compute_for_target"]["efficient"]["compute"] is None
    analysis = frontier.analyse(rows, list(budgets), ["standard", "efficient"], "standard", 2, target=1.0 + 30 * 5e11 ** -0.1)
    assert analysis["compute_for_target"]["efficient"]["ratio"] == pytest.approx(1.5, rel=1e-3)
    assert analysis["compute_for_target"]["efficient"]["ratio_per_seed"] == pytest.approx([1.5, 1.5], rel=1e-3)


def test_a_variant_better_than_the_measured_range_is_not_out_of_range(tmp_path):
    """'out of range' means the target needs more than the largest budget: a variant already below it at its
    smallest size is the opposite, and says so, with the bound the smallest size gives."""
    variants = ["standard", "efficient", "super"]
    rows, budgets = synthetic_summaries(variants)
    markdown = frontier.write_report(tmp_path, "header", [], budgets, rows, variants=variants, reference="standard",
                                     seeds=2, extra={})
    row = {line.split(" | ")[0][2:]: line for line in markdown.split("## Summary")[1].splitlines()
           if line.startswith("| ")}
    assert row["super"].endswith("| below smallest budget (< 1e+10) | < 0.001x (below smallest budget) "
                                 "(per seed: < 0.001x, < 0.001x) |")
    assert row["efficient"].endswith("| out of range | out of range (per seed: out of range, out of range) |")
    assert row["standard"].endswith("| 1e+13 | 1.00x (per seed: 1.00x, 1.00x) |")
    need = json.loads((tmp_path / "results.json").read_text())["analysis"]["compute_for_target"]
    assert need["super"]["reached"] == "below" and need["super"]["compute"] is None
    assert need["super"]["ratio"] is None and need["super"]["ratio_below"] == pytest.approx(1e10 / 1e13)
    assert need["efficient"]["reached"] == "beyond" and need["efficient"]["ratio_below"] is None


def one_seed_report(out_dir, budgets, rows, variants):
    return frontier.write_report(out_dir, "header", [], budgets, rows, variants=variants, reference="standard",
                                 seeds=1, extra={})


def test_missing_matplotlib_or_scipy_skips_only_the_plots(tmp_path, monkeypatch):
    rows, budgets = synthetic_summaries(["standard", "efficient"], seeds=1)
    monkeypatch.setitem(sys.modules, "scipy", None)  # the fit is numpy alone
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    markdown = one_seed_report(tmp_path, budgets, rows, ["standard", "efficient"])
    assert not list(tmp_path.glob("*.png"))
    summary = markdown.split("## Summary")[1]
    assert "E=1.000, A=30, α=0.100 (E + A*C^-alpha)" in summary and "| 1.00x |" in summary
    assert json.loads((tmp_path / "results.json").read_text())["analysis"]["fits"]["efficient"] is not None


@pytest.mark.parametrize("sizes, learning_rates, said", [
    (1, [], "loss.png is skipped"),
    (4, [], "loss.png and frontier.png are skipped"),
    (1, [1e-3, 2e-3], "loss.png and learning_rates.png are skipped"),
    (4, [1e-3, 2e-3], "loss.png, frontier.png and learning_rates.png are skipped"),
])
def test_without_matplotlib_the_closing_line_names_the_plots_this_comparison_makes(sizes, learning_rates, said):
    budgets = {f"{n}x{n}x{16 * n}": 1e12 * n for n in range(1, sizes + 1)}
    assert compare.skipped_plots(budgets, learning_rates) == said


def test_sizes_trained_on_one_budget_are_a_profile_not_a_fit(tmp_path):
    """An explicit --budget_flops gives every size the same compute: loss against compute has one x."""
    rows, budgets = synthetic_summaries(["standard", "efficient"], seeds=1)
    for row in rows:
        row["training_flops"] = 1e12 * (1 + 0.01 * "s m l xl".split().index(row["size"]))  # rounding's spread
    markdown = one_seed_report(tmp_path, budgets, rows, ["standard", "efficient"])
    summary = markdown.split("## Summary")[1]
    assert summary.count("no fit (every size trained on about the same FLOPs (they span 1.03x)") == 2
    assert "| n/a: no fit of standard | n/a: no fit of standard |" in summary and "x |" not in summary


def test_a_loss_that_rises_with_compute_has_no_compute_for_the_target(tmp_path):
    rows, budgets = synthetic_summaries(["standard", "efficient"], seeds=1)
    for row in rows:
        if row["attention"] == "efficient":
            row["final_val_loss"] = 2.0 + 0.01 * math.log10(row["training_flops"])
    markdown = one_seed_report(tmp_path, budgets, rows, ["standard", "efficient"])
    efficient = next(line for line in markdown.split("## Summary")[1].splitlines() if line.startswith("| efficient"))
    assert "loss rises with compute | n/a: efficient's loss rises with compute | n/a: efficient's loss" in efficient


def test_a_reference_outside_the_variants_sets_no_target(tmp_path):
    rows, budgets = synthetic_summaries(["optimized", "efficient"], seeds=1)
    markdown = one_seed_report(tmp_path, budgets, rows, ["optimized", "efficient"])
    summary = markdown.split("## Summary")[1]
    assert "compute for loss (none)" in summary and "out of range" not in summary
    assert summary.count("| n/a: no standard run sets the target | n/a: no standard run sets the target |") == 2


def test_fewer_than_three_sizes_say_so_instead_of_fitting(tmp_path):
    rows, budgets = synthetic_summaries(["standard"], seeds=1)
    rows = [r for r in rows if r["size"] in ("s", "m")]
    markdown = one_seed_report(tmp_path, {"s": 1e10, "m": 1e11}, rows, ["standard"])
    assert "no fit (2 sizes; a fit needs 3)" in markdown


def test_alpha_comes_with_its_range_over_the_fits_of_each_seed(tmp_path):
    """Seed 0's losses follow alpha 0.10, seed 1's 0.12, each with its floor E = 1 well inside the search."""
    rows, budgets = synthetic_summaries(["standard", "efficient"], seeds=2)
    for row in rows:
        row["final_val_loss"] = 1.0 + 30.0 * row["training_flops"] ** -(0.10 if row["seed"] == 0 else 0.12)
    markdown = frontier.write_report(tmp_path, "header", [], budgets, rows, variants=["standard", "efficient"],
                                     reference="standard", seeds=2, extra={})
    tables, summary = markdown.split("## Summary")
    standard = next(line for line in summary.splitlines() if line.startswith("| standard"))
    assert "(E + A*C^-alpha); α per seed 0.100–0.120; largest residual" in standard
    assert "E at its bound" not in summary and "α per seed: the lowest and highest α" in summary
    assert tables.count("(2=): tied with the variant ranked just above it") == 4
    analysis = json.loads((tmp_path / "results.json").read_text())["analysis"]
    assert analysis["alpha_per_seed"]["standard"] == pytest.approx([0.10, 0.12], rel=1e-3)
    assert analysis["alpha_range"]["standard"] == pytest.approx([0.10, 0.12], rel=1e-3)
    # each seed's target is its own reference curve's loss at the largest size, which that seed's standard
    # reaches there exactly (the mean curve's target lies beyond seed 0's curve)
    assert analysis["compute_for_target"]["standard"]["ratio_per_seed"] == pytest.approx([1.0, 1.0])
    assert analysis["fits"]["standard"]["E_at_bound"] is None


def test_a_floor_at_either_end_of_its_search_is_flagged(tmp_path):
    """E is searched in [0, smallest loss): a plain power law puts it at 0, losses that stop falling just
    under the smallest; either way the points do not place it."""
    C = np.array([1e10, 1e11, 1e12, 1e13])
    assert frontier.fit_loss_curve(C, [2.3, 2.1, 2.0, 2.0])["E_at_bound"] == "smallest loss"
    assert frontier.fit_loss_curve(C, 1.0 + 30.0 * C ** -0.1)["E_at_bound"] is None
    assert frontier.fit_loss_curve(C[:3], 30.0 * C[:3] ** -0.1)["E_at_bound"] is None  # E = 0 by the law, not fitted
    rows, budgets = synthetic_summaries(["standard"], seeds=1)
    for row in rows:
        row["final_val_loss"] = 30.0 * row["training_flops"] ** -0.1
    summary = one_seed_report(tmp_path, budgets, rows, ["standard"]).split("## Summary")[1]
    assert "| E=0.000, A=30, α=0.100 (E + A*C^-alpha); E at its bound (0); largest residual" in summary
    assert "E at its bound: the fitted floor lies at an end of its search" in summary and "α per seed" not in summary
    assert json.loads((tmp_path / "results.json").read_text())["analysis"]["fits"]["standard"]["E_at_bound"] == "0"


@pytest.mark.parametrize("C", [[1e9, 1e10, 1e11], [1e10, 1e11, 1e12, 1e13], [3e9, 2e10, 1.1e11, 7e11]])
def test_a_curve_reaches_its_own_loss_at_the_largest_size_there(C):
    fit = frontier.fit_loss_curve(C, [1.0 + 30.0 * c ** -0.1 for c in C])
    assert frontier.reach(fit, frontier.fitted_loss_at_largest(fit)) == ("inside", pytest.approx(C[-1]))


def test_no_ratio_where_the_reference_reaches_the_target_outside_its_range():
    """A given target standard reaches only past its largest size: super, below its smallest there, has no
    bound either, as standard's compute for the target is not measured."""
    rows, budgets = synthetic_summaries(["standard", "super"])
    analysis = frontier.analyse(rows, list(budgets), ["standard", "super"], "standard", 2,
                                target=1.0 + 30.0 * 5e13 ** -0.1)
    need = analysis["compute_for_target"]["super"]
    assert need["reached"] == "below" and need["ratio"] is None and need["ratio_below"] is None
    assert need["ratio_per_seed"] == need["ratio_below_per_seed"] == [None, None]
    assert frontier.ratio_cell(analysis, "super") == ("n/a: standard's curve reaches the target outside its measured "
                                                      "range")


def test_each_seeds_ratio_is_read_at_its_own_target_and_says_so(tmp_path):
    """Seed 0's standard follows 1 + 30 C^-0.1, seed 1's 1 + 33 C^-0.1; efficient needs 0.8x of its seed's
    standard's compute. The fit of the means (A = 31.5) sets the column's target; each seed's ratio is read
    at that seed's own standard loss at 1e13, which results.md and results.json name."""
    rows, budgets = synthetic_summaries(["standard", "efficient"])
    for row in rows:
        compute = row["training_flops"] / (0.8 if row["attention"] == "efficient" else 1.0)
        row["final_val_loss"] = 1.0 + (30.0, 33.0)[row["seed"]] * compute ** -0.1
    markdown = frontier.write_report(tmp_path, "header", [], budgets, rows, variants=["standard", "efficient"],
                                     reference="standard", seeds=2, extra={})
    analysis = json.loads((tmp_path / "results.json").read_text())["analysis"]
    own = [1.0 + A * 1e13 ** -0.1 for A in (30.0, 33.0)]
    assert analysis["target_loss"] == pytest.approx(1.0 + 31.5 * 1e13 ** -0.1, rel=1e-6)
    assert analysis["target_loss_per_seed"] == pytest.approx(own, rel=1e-6)
    assert analysis["compute_for_target"]["efficient"]["ratio_per_seed"] == pytest.approx([0.8, 0.8], rel=1e-3)
    assert (f"Ratio per seed: each seed's own curves, read at that seed's own target (its standard curve's loss at "
            f"the largest size: {own[0]:.4f}, {own[1]:.4f}), not at {analysis['target_loss']:.4f}.") in markdown
    given = frontier.analyse(rows, list(budgets), ["standard", "efficient"], "standard", 2, target=1.2)
    assert given["target_loss_per_seed"] == [1.2, 1.2] and "Ratio per seed" not in "".join(frontier.fit_notes(
        given, ["standard", "efficient"]))
    one_seed = [r for r in rows if r["seed"] == 0]
    assert "Ratio per seed" not in one_seed_report(tmp_path, budgets, one_seed, ["standard", "efficient"])


def test_a_ratio_out_of_range_still_gives_each_seeds_own():
    """Efficient needs 1.5x standard's compute in seed 0 and 0.9x in seed 1: the fit of the mean reaches
    standard's loss only past its range, while seed 1's own curve reaches it inside."""
    rows, budgets = synthetic_summaries(["standard", "efficient"])
    for row in rows:
        if row["attention"] == "efficient":
            row["final_val_loss"] = 1.0 + 30.0 * (row["training_flops"] / (1.5, 0.9)[row["seed"]]) ** -0.1
    analysis = frontier.analyse(rows, list(budgets), ["standard", "efficient"], "standard", 2)
    assert analysis["compute_for_target"]["efficient"]["reached"] == "beyond"
    assert frontier.ratio_cell(analysis, "efficient") == "out of range (per seed: out of range, 0.90x)"


def test_a_seed_whose_curves_give_no_reading_is_no_ratio_rather_than_out_of_range():
    """'out of range' says the variant needs more than its largest budget. Seed 1's standard loss rises with
    compute, so its curve reaches no target: standard itself is no reading there, not out of its own range."""
    rows, budgets = synthetic_summaries(["standard", "efficient"])
    for row in rows:
        if row["seed"] == 1 and row["attention"] == "standard":
            row["final_val_loss"] = 2.0 + 0.01 * math.log10(row["training_flops"])
    analysis = frontier.analyse(rows, list(budgets), ["standard", "efficient"], "standard", 2)
    assert frontier.ratio_cell(analysis, "standard") == "1.00x (per seed: 1.00x, n/a)"
    assert analysis["compute_for_target"]["standard"]["reached_per_seed"] == ["inside", None]
    assert analysis["compute_for_target"]["efficient"]["reached_per_seed"] == ["beyond", None]  # 1.5x: past its range


def test_without_a_fit_of_the_reference_the_target_is_its_loss_at_the_largest_size():
    rows, _ = synthetic_summaries(["standard", "efficient"])
    rows = [r for r in rows if r["size"] in ("s", "m")]
    analysis = frontier.analyse(rows, ["s", "m"], ["standard", "efficient"], "standard", 2)
    assert analysis["fits"]["standard"] is None and analysis["target_loss"] == pytest.approx(1.0 + 30.0 * 1e11 ** -0.1)


def test_one_seeds_fit_alone_is_no_range_of_alpha():
    rows, budgets = synthetic_summaries(["standard"])
    rows = [r for r in rows if r["seed"] == 0 or r["size"] in ("s", "m")]  # seed 1: two sizes, no fit
    analysis = frontier.analyse(rows, list(budgets), ["standard"], "standard", 2)
    assert analysis["alpha_per_seed"]["standard"] == [pytest.approx(0.1, rel=1e-3), None]
    assert analysis["alpha_range"]["standard"] is None and "α per seed" not in frontier.fit_cell(analysis, "standard")


# -----------------------------------------------------------------------------
# a sweep of learning rates: each variant at its best

def test_a_learning_rate_sweep_plans_each_rate_with_min_lr_at_the_configs_ratio(tiny_run):
    config, out_dir = tiny_run
    runs, _ = plan(config, out_dir, "--learning_rates=4e-3,1e-3", "--variants=standard,efficient", "--match=flops",
                   "--max_iters=20")
    assert [(r.variant, r.learning_rate) for r in runs] == [("standard", 1e-3), ("standard", 4e-3),
                                                            ("efficient", 1e-3), ("efficient", 4e-3)]
    for run in runs:
        assert run.run_dir == out_dir / f"{run.variant}-lr{run.learning_rate:g}-seed0"
        c = configurator.resolve_config(configurator.get_config(run.train_args))
        # the tiny config decays 1e-2 to 1e-3: min_lr a tenth of each peak
        assert (c["learning_rate"], c["min_lr"]) == (run.learning_rate, run.learning_rate / 10)
        assert c["max_iters"] == run.iterations == next(r.iterations for r in runs if r.variant == run.variant)
    assert runs[0].iterations == 20 < runs[2].iterations  # the budget does not depend on the learning rate


def test_learning_rates_close_together_train_in_folders_named_as_typed(tiny_run):
    config, out_dir = tiny_run
    runs, _ = plan(config, out_dir, "--learning_rates=1.21e-3,1.24e-3", "--variants=standard")
    assert [r.run_dir.name for r in runs] == ["standard-lr0.00121-seed0", "standard-lr0.00124-seed0"]


@pytest.mark.slow
def test_each_variant_is_compared_at_its_best_learning_rate_and_a_wider_grid_reuses_runs(tiny_run, capsys):
    config, out_dir = tiny_run
    argv = [str(config), "--variants=standard,efficient", "--max_iters=6", f"--out_dir={out_dir}"]
    assert compare.main([*argv, "--learning_rates=1e-3,3e-2"]) == 0
    results = json.loads((out_dir / "results.json").read_text())
    assert len(results["runs"]) == len(results["plan"]) == 4 and results["learning_rates"] == [1e-3, 3e-2]
    markdown = (out_dir / "results.md").read_text()
    for variant in ("standard", "efficient"):
        losses = {r["learning_rate"]: r["final_val_loss"] for r in results["runs"] if r["attention"] == variant}
        best = min(losses, key=losses.get)
        assert results["best_learning_rates"]["1x2x16"][variant] == best
        row = results["results"]["1x2x16"][variant]
        assert row["final_val_loss"]["runs"] == [losses[best]] and row["learning_rate"]["mean"] == best
        lr_row = next(line for line in markdown.splitlines() if line.startswith(f"| {variant} | ") and "**" in line)
        assert f"**{losses[best]:.4f}**" in lr_row and lr_row.endswith(f"| {best:g} (edge of the grid) |")
    assert markdown.index("## Learning rates") < markdown.index("## 1x2x16")
    if frontier.pyplot() is not None:
        assert (out_dir / "learning_rates.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    capsys.readouterr()
    assert compare.main([*argv, "--learning_rates=1e-3,1e-2,3e-2"]) == 0
    out = capsys.readouterr().out
    assert out.count("finished already, skipped") == 4 and out.count("--learning_rate=0.01 ") == 2
    assert len(json.loads((out_dir / "results.json").read_text())["runs"]) == 6


@pytest.mark.slow
def test_a_diverged_learning_rate_is_a_result_of_the_sweep_not_a_failure(tiny_run, capsys):
    config, out_dir = tiny_run
    hellaswag = out_dir.parent / "hellaswag.jsonl"  # scored only at the best rate: the diverged run has no checkpoint
    hellaswag.write_text(json.dumps({"ctx": "To be, or not", "endings": [" to be", " the mind", " is", " tis"],
                                     "label": 0}) + "\n")
    argv = [str(config), "--variants=efficient", "--max_iters=4", f"--out_dir={out_dir}", "--learning_rates=1e-3,1e9",
            f"--hellaswag_file={hellaswag}"]
    assert compare.main(argv) == 0
    assert "efficient at 1x2x16, learning rate 1e+09, seed 0 diverged: a result of the learning-rate sweep" \
        in capsys.readouterr().out
    results = json.loads((out_dir / "results.json").read_text())
    assert results["best_learning_rates"] == {"1x2x16": {"efficient": 1e-3}}
    assert [r["learning_rate"] for r in results["runs"] if "hellaswag_acc" in r] == [1e-3]
    scored = evaluate_checkpoint(out_dir / "efficient-lr0.001-seed0", hellaswag, device="cpu", dtype="float32")
    assert results["results"]["1x2x16"]["efficient"]["hellaswag_acc"]["mean"] == scored["acc"]
    assert "| efficient | **" in (out_dir / "results.md").read_text()
    assert "| diverged | 0.001 (edge of the grid) |" in (out_dir / "results.md").read_text()
    assert compare.main(argv) == 0 and capsys.readouterr().out.count("finished already, skipped") == 2
    # outside a learning-rate sweep a divergence is a failed run, as before
    assert compare.main([*argv[:3], f"--out_dir={out_dir / 'one'}", "--learning_rate=1e9"]) == 1
    assert "failed with exit code 1" in capsys.readouterr().err


def test_the_best_learning_rate_is_the_lowest_mean_over_seeds():
    runs = [{"size": "s", "attention": "super", "learning_rate": lr, "seed": seed, "final_val_loss": loss}
            for lr, seed, loss in [(1e-3, 0, 2.00), (1e-3, 1, 2.30), (2e-3, 0, 2.10), (2e-3, 1, 2.12),
                                   (4e-3, 0, 2.50), (4e-3, 1, 2.50), (8e-3, 0, 1.90), (8e-3, 1, None)]]
    best = frontier.best_learning_rates(runs, ["s"], ["super"])
    assert best == {("s", "super"): 2e-3}  # seed 0 alone would pick 1e-3, or 8e-3 where seed 1 diverged
    table = frontier.learning_rate_table(runs, "s", ["super"], [1e-3, 2e-3, 4e-3, 8e-3], best, n_seeds=2)
    assert table.splitlines()[-1] == ("| super | 2.1500 ± 0.2121 | **2.1100 ± 0.0141** | 2.5000 | "
                                      "diverged (1 of 2 seeds) | 0.002 |")


def test_the_loss_plot_shows_the_largest_size_first_seed_at_each_variants_best_learning_rate(tmp_path, monkeypatch):
    variants = ["standard", "efficient"]
    rows, budgets = synthetic_summaries(variants)
    rows = [r | {"learning_rate": lr, "final_val_loss": r["final_val_loss"] + (lr == 2e-3) * 0.1}
            for r in rows for lr in (1e-3, 2e-3)]  # 1e-3 the better for both, planned before 2e-3
    planned = [sweep.PlannedRun(size=r["size"], variant=r["attention"], seed=r["seed"], iterations=1, schedule={},
                                flops_per_token=1, tokens_per_iter=1, learning_rate=r["learning_rate"],
                                run_dir=tmp_path / r["size"] / sweep.run_name(r["attention"], r["learning_rate"],
                                                                              r["seed"]))
               for r in rows]
    plotted = {}
    monkeypatch.setattr(frontier, "pyplot", lambda: "plt")
    monkeypatch.setattr(frontier, "read_log", lambda run_dir: run_dir)
    monkeypatch.setattr(frontier, "plot_losses", lambda plt, logs, path: plotted.update(logs))
    for name in ("plot_frontier", "plot_learning_rates"):
        monkeypatch.setattr(frontier, name, lambda *args: None)
    frontier.write_report(tmp_path, "header", planned, budgets, rows, variants=variants, reference="standard",
                          seeds=2, extra={})
    assert plotted == {v: tmp_path / "xl" / f"{v}-lr0.001-seed0" for v in variants}


# -----------------------------------------------------------------------------
# the resumable sweep

def test_a_rerun_with_other_settings_is_refused(tiny_run, capsys):
    config, out_dir = tiny_run
    assert compare.main([str(config), "--variants=efficient", f"--out_dir={out_dir}", "--max_iters=2"]) == 0
    assert compare.main([str(config), "--variants=efficient", f"--out_dir={out_dir}", "--max_iters=3"]) == 1
    assert capsys.readouterr().err == (
        f"error: {out_dir.resolve() / 'efficient-seed0'} holds a run planned with other settings (by its "
        f"compare_run.json: max_iters=2 then, 3 now, lr_decay_iters=2 then, 3 now, eval_interval=2 then, 3 now): "
        f"rerun the command that made it, or choose another --out_dir\n")
    assert json.loads((out_dir / "efficient-seed0" / "summary.json").read_text())["iterations"] == 2


def test_a_rerun_after_the_config_file_or_the_data_changed_is_refused(tiny_run, capsys):
    """The same arguments, but a config file edited since (or the data prepared again): the finished run
    trained with other settings, and a table beside new runs would compare unlike with unlike."""
    config, out_dir = tiny_run
    argv = [str(config), "--variants=efficient", f"--out_dir={out_dir}", "--max_iters=2"]
    assert compare.main(argv) == 0
    original = config.read_text()
    config.write_text(original + "learning_rate = 3e-2\n")
    assert compare.main(argv) == 1
    assert (f"{out_dir / 'efficient-seed0'} holds a run of the same arguments, but what they resolve to changed "
            f"since it was planned (the config file, train.py's defaults or the data: learning_rate=0.01 then, 0.03 "
            f"now): restore it") in capsys.readouterr().err
    config.write_text(original)
    meta_path = config.parent / "data" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "source": "another text"}))
    assert compare.main(argv) == 1
    assert "changed since it was planned (the config file, train.py's defaults or the data: the data's meta.json)" \
        in capsys.readouterr().err
    meta_path.write_text(json.dumps(meta))
    assert compare.main(argv) == 0 and "finished already, skipped" in capsys.readouterr().out
    record_path = out_dir / "efficient-seed0" / sweep.RECORD_NAME  # as a record kept before train.py had a key
    record = json.loads(record_path.read_text())
    del record["settings"]["config"]["hellaswag_limit"]
    record_path.write_text(json.dumps(record))
    assert compare.main(argv) == 0 and "finished already, skipped" in capsys.readouterr().out


def test_a_run_folder_the_sweep_did_not_plan_is_never_overwritten(tiny_run, capsys):
    config, out_dir = tiny_run
    theirs = out_dir / "standard-seed0"  # where the sweep would put standard: a plain train.py run of another variant
    assert train.main([str(config), f"--out_dir={theirs}", "--attention=efficient", "--max_iters=2"]) == 0
    files = {path: path.read_bytes() for path in theirs.iterdir()}
    assert compare.main([str(config), "--variants=standard", f"--out_dir={out_dir}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "that this sweep did not plan" in err[0] and str(theirs) in err[0]
    assert {path: path.read_bytes() for path in theirs.iterdir()} == files


def stopping_launcher(folder, at_iter=3):
    """A --launcher that runs train.py in its own process and sends that process a SIGTERM at iteration
    `at_iter`, as a `kill -TERM <pid of train.py>` would: compare.py does not see it, and train.py saves a
    checkpoint and exits with status 0."""
    wrapper = folder / "stopping_launcher.py"
    wrapper.write_text("import os, signal, sys\n"
                       "sys.path.insert(0, os.path.dirname(sys.argv[1]))\n"
                       "import train\n"
                       "get_lr = train.get_lr\n"
                       "def get_lr_and_stop(it, c):  # called before every step\n"
                       f"    if it == {at_iter}:\n"
                       "        os.kill(os.getpid(), signal.SIGTERM)\n"
                       "    return get_lr(it, c)\n"
                       "train.get_lr = get_lr_and_stop\n"
                       "sys.exit(train.main(sys.argv[2:]))\n")
    return f"--launcher={shlex.quote(sys.executable)} {shlex.quote(str(wrapper))}"


@pytest.mark.slow  # several train.py processes
def test_a_run_whose_train_py_alone_was_stopped_is_an_error_and_resumes_on_rerun(tiny_run, capsys):
    config, out_dir = tiny_run
    argv = [str(config), "--variants=efficient", "--max_iters=20", f"--out_dir={out_dir}"]
    assert compare.main([*argv, stopping_launcher(config.parent)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.fullmatch(r"error: efficient at 1x2x16, seed 0 stopped at iteration \d of 20 \(its "
                                          r"summary.json says stop_reason 'SIGTERM', .*\): rerun the same command to "
                                          r"resume it, or delete \S+efficient-seed0 to train it again", err[0]), err
    assert not (out_dir / "results.md").exists()  # a partial run is no result
    assert compare.main(argv) == 0
    assert "(resuming)" in capsys.readouterr().out
    summary = json.loads((out_dir / "efficient-seed0" / "summary.json").read_text())
    assert summary["stop_reason"] == "max_iters" and summary["iterations"] == 20
    assert 0 < summary["iterations_this_run"] < 20  # the stopped process's steps are the run's: its time too
    assert summary["wall_time_s"] > summary["wall_time_this_run_s"]
    assert sweep.finished_summary(next(iter(plan(config, out_dir, *argv[1:])[0])))["wall_time_s"] == summary["wall_time_s"]


@pytest.mark.slow  # several train.py processes
@pytest.mark.parametrize("summary", [None, {"stop_reason": "SIGTERM", "iterations": 1}])
def test_a_finished_checkpoint_whose_summary_was_lost_is_an_error_until_its_folder_is_deleted(tiny_run, capsys,
                                                                                             summary):
    """Killed between the final checkpoint and summary.json (None), or between those of a resumed run (the
    stopped segment's summary is left): train.py resumes with 'nothing to train' and writes none."""
    config, out_dir = tiny_run
    argv = [str(config), "--variants=efficient", "--max_iters=2", f"--out_dir={out_dir}"]
    assert compare.main(argv) == 0
    path = out_dir / "efficient-seed0" / "summary.json"
    if summary is None:
        path.unlink()
    else:
        path.write_text(json.dumps(json.loads(path.read_text()) | summary))
    for _ in range(2):  # a rerun cannot mend it
        assert compare.main(argv) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: efficient at 1x2x16, seed 0: train.py exited without "
                                                   f"writing {path}") and f"delete {path.parent} and rerun" in err[0]
    shutil.rmtree(path.parent)
    assert compare.main(argv) == 0 and json.loads(path.read_text())["stop_reason"] == "max_iters"


def test_a_ctrl_c_before_the_first_checkpoint_says_the_run_starts_again(tiny_run, capsys):
    """The Ctrl-C reaches compare.py while its train.py is still starting up (importing torch, say), so
    that run saves nothing: the message must not claim a checkpoint."""
    config, out_dir = tiny_run
    # stands for a train.py that has not begun: it sends the Ctrl-C until compare.py passes one on to it
    starting = config.parent / "starting_up.py"
    starting.write_text("import os, signal, sys, time\n"
                        "signal.signal(signal.SIGINT, lambda *_: sys.exit(130))\n"
                        "while True:\n"
                        "    os.kill(os.getppid(), signal.SIGINT)\n"
                        "    time.sleep(0.5)\n")
    launcher = f"--launcher={shlex.quote(sys.executable)} {shlex.quote(str(starting))}"
    assert compare.main([str(config), "--variants=efficient", f"--out_dir={out_dir}", launcher]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["stopped by SIGINT: efficient at 1x2x16, seed 0 stopped before its first checkpoint, and starts "
                   "again; rerun the same command to continue (finished runs are skipped)"]


def test_where_a_stopped_run_takes_up_follows_its_checkpoint(tmp_path):
    run = SimpleNamespace(run_dir=tmp_path, describe=lambda: "efficient at 1x2x16, seed 0")
    assert sweep.what_was_kept(run, None).endswith("stopped before its first checkpoint, and starts again")
    (tmp_path / CHECKPOINT_NAME).write_bytes(b"first")
    earlier = sweep.file_version(tmp_path / CHECKPOINT_NAME)
    assert sweep.what_was_kept(run, earlier).endswith("stopped before it saved, and resumes from its earlier checkpoint")
    os.replace(tmp_path / CHECKPOINT_NAME, tmp_path / "earlier.pt")  # keeps the inode alive: a new one follows
    (tmp_path / CHECKPOINT_NAME).write_bytes(b"second")  # as save_checkpoint replaces it
    assert sweep.what_was_kept(run, earlier).endswith("saved its checkpoint, and resumes from it")
    assert sweep.what_was_kept(run, None).endswith("saved its checkpoint, and resumes from it")


def test_a_timing_probe_whose_train_py_alone_was_stopped_is_an_error(tiny_run, capsys):
    config, out_dir = tiny_run
    assert compare.main([str(config), "--variants=efficient", "--reference=efficient", "--match=time",
                         "--probe_iters=10", f"--out_dir={out_dir}", stopping_launcher(config.parent)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error: the timing probe of efficient stopped before its 10 steps" in err[0]
    assert not (out_dir / "probes" / "1x2x16" / "efficient" / sweep.RECORD_NAME).exists()  # probed again on rerun


def test_a_run_resumed_before_train_py_kept_totals_counts_the_segments_its_record_kept():
    """Records from then hold each train.py process's own figures, which only they still know."""
    summary = {"tokens_per_iter": 1000, "wall_time_s": 2.0, "mean_ms_per_iter": 30.0, "tokens_per_s": 1000 / 0.03,
               "peak_memory_bytes": 5}
    segments = [{"wall_time_s": 100.0, "iterations_this_run": 101, "mean_ms_per_iter": 10.0, "peak_memory_bytes": 7},
                {"wall_time_s": 2.0, "iterations_this_run": 3, "mean_ms_per_iter": 30.0, "peak_memory_bytes": 5}]
    total = sweep.with_earlier_segments(summary, {"segments": segments})
    ms = (100 * 10.0 + 2 * 30.0) / 102  # each segment's steps after its first
    assert total["mean_ms_per_iter"] == pytest.approx(ms) and total["tokens_per_s"] == pytest.approx(1000 / ms * 1000)
    assert total["wall_time_s"] == 102.0 and total["peak_memory_bytes"] == 7
    assert sweep.with_earlier_segments(summary, {"train_args": []}) == summary  # a record of today's
    # resumed since by a train.py that keeps totals, from a checkpoint without them: its summary counts from there
    later = summary | {"wall_time_this_run_s": 2.0}
    assert sweep.with_earlier_segments(later, {"segments": segments[:1]}) == later | {"wall_time_s": 102.0}


def test_a_record_keeps_the_segments_it_had(tmp_path):
    run = sweep.PlannedRun(size="1x2x16", variant="efficient", seed=0, iterations=10, schedule={}, flops_per_token=100,
                           tokens_per_iter=64, run_dir=tmp_path, train_args=["tiny.py"])
    (tmp_path / sweep.RECORD_NAME).write_text(json.dumps({"train_args": ["tiny.py"], "segments": [{"wall_time_s": 3.0}]}))
    sweep.record_run(run)
    assert json.loads((tmp_path / sweep.RECORD_NAME).read_text())["segments"] == [{"wall_time_s": 3.0}]


def fake_train_launcher(folder):
    """A --launcher that trains nothing: it notes its arguments and writes the summary.json of a run that
    reached its --max_iters, one 20 ms step after another."""
    script, calls = folder / "fake_train.py", folder / "calls.txt"
    script.write_text("import json, os, sys\n"
                      f"open({str(calls)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
                      "args = dict(a[2:].split('=', 1) for a in sys.argv[2:] if a.startswith('--') and '=' in a)\n"
                      "iters = int(args['max_iters'])\n"
                      "summary = dict(stop_reason='max_iters', iterations=iters, iterations_this_run=iters,\n"
                      "               wall_time_s=iters * 0.02, mean_ms_per_iter=20.0, peak_memory_bytes=None,\n"
                      "               tokens_per_iter=64)\n"
                      "path = os.path.join(args['out_dir'], 'summary.json')\n"
                      "open(path + '.tmp', 'w').write(json.dumps(summary))\n"
                      "os.replace(path + '.tmp', path)\n")
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}", calls


def test_a_stopped_run_resumes_from_its_checkpoint(tmp_path):
    launcher, calls = fake_train_launcher(tmp_path)
    run_dir = tmp_path / "efficient-seed0"
    run = sweep.PlannedRun(size="1x2x16", variant="efficient", seed=0, iterations=10, schedule={}, flops_per_token=100,
                           tokens_per_iter=64, run_dir=run_dir,
                           train_args=["tiny.py", "--attention=efficient", f"--out_dir={run_dir}", "--max_iters=10"])
    run_dir.mkdir()
    sweep.record_run(run)
    assert sweep.run_status(run) == "new"  # no checkpoint: nothing to resume from
    (run_dir / "summary.json").write_text(json.dumps({"stop_reason": "SIGTERM", "iterations": 4, "tokens_per_iter": 64}))
    (run_dir / CHECKPOINT_NAME).write_bytes(b"at iteration 4")
    assert sweep.run_status(run) == "resume"
    with sweep.SignalForwarder() as forwarder:
        sweep.train_once(run, "resume", launcher, forwarder)
    assert calls.read_text().split()[-1] == "--init_from=resume"
    assert sweep.run_status(run) == "done"
    summary = sweep.finished_summary(run)
    assert summary["wall_time_s"] == pytest.approx(0.2) and summary["training_flops"] == 100 * 64 * 10  # train.py's


def test_a_finished_sweeps_tables_are_written_again_under_any_launcher(tiny_run, capsys):
    """The launcher is no setting: one whose processes would not split the steps refuses runs still to
    train, not the tables of finished ones (rewritten on another machine, say)."""
    config, out_dir = tiny_run
    argv = [str(config), f"--out_dir={out_dir}", "--variants=standard", "--max_iters=2"]
    assert compare.main(argv) == 0
    launcher = f"--launcher={sys.executable} -m torch.distributed.run --standalone --nproc_per_node=2"
    assert compare.main([*argv, launcher]) == 0 and "finished already, skipped" in capsys.readouterr().out
    assert compare.main([*argv, "--variants=standard,efficient", launcher]) == 1  # efficient still to train
    assert "must be divisible by the number of processes (2)" in capsys.readouterr().err


def test_the_launchers_processes_are_known_where_torchrun_fixes_them():
    assert sweep.launcher_world_size("") == 1
    assert sweep.launcher_world_size("torchrun --standalone --nproc_per_node=4") == 4
    assert sweep.launcher_world_size(f"{sys.executable} -m torch.distributed.run --nnodes=2 --nproc_per_node=2") == 4
    assert sweep.launcher_world_size("torchrun --nnodes=1:4 --nproc_per_node=2") is None  # elastic
    assert sweep.launcher_world_size("srun --ntasks=8") is None
    assert sweep.launcher_world_size("torchrun --nproc_per_node=0") is None  # torchrun's own error, when it runs


def test_each_key_is_given_once_and_an_fsdp_probe_evaluates_a_batch_per_process(tiny_run, tmp_path, monkeypatch):
    """A --max_iters=6 the sweep sets again per run is left out of its printed command; FSDP's ranks split
    the probe's evaluation batches, so it takes one per process."""
    config, out_dir = tiny_run
    runs, _ = plan(config, out_dir, "--variants=standard", "--max_iters=6", "--batch_size=2")
    assert [arg.split("=")[0] for arg in runs[0].train_args].count("--max_iters") == 1
    assert "--batch_size=2" in runs[0].train_args
    launcher, calls = fake_train_launcher(tmp_path)
    monkeypatch.setattr(sweep, "launcher_world_size", lambda launcher: 2)
    for parallelism, eval_iters in (("fsdp", 2), ("ddp", 1)):  # DDP's as before: its kept probes stay valid
        sweep.probe_seconds_per_iter(str(config), [f"--parallelism={parallelism}", "--eval_iters=7"], "efficient",
                                     tmp_path / parallelism, 3, launcher)
        assert calls.read_text().splitlines()[-1].split()[-1] == f"--eval_iters={eval_iters}"


def test_the_time_left_counts_what_a_resumed_run_has_still_to_train(tmp_path):
    run = sweep.PlannedRun(size="1x2x16", variant="efficient", seed=0, iterations=10, schedule={}, flops_per_token=100,
                           tokens_per_iter=64, run_dir=tmp_path, train_args=["tiny.py"])
    assert [sweep.flops_left(run, status) for status in ("new", "done", "resume")] == [64_000, 0, 64_000]
    (tmp_path / "summary.json").write_text(json.dumps({"stop_reason": "SIGTERM", "iterations": 9}))
    assert sweep.flops_left(run, "resume") == 6_400  # one iteration of ten left


def test_a_timing_probe_under_another_launcher_or_config_is_run_again(tiny_run, tmp_path):
    config, _ = tiny_run
    launcher, calls = fake_train_launcher(tmp_path)
    probe_dir = tmp_path / "probes" / "efficient"
    for used in (launcher, launcher, f"{launcher} --nproc_per_node=2"):
        assert sweep.probe_seconds_per_iter(str(config), [], "efficient", probe_dir, 3, used) == 0.02
    assert len(calls.read_text().splitlines()) == 2  # the same launcher reuses its probe
    config.write_text(config.read_text() + "batch_size = 2\n")  # the same arguments, another step
    sweep.probe_seconds_per_iter(str(config), [], "efficient", probe_dir, 3, f"{launcher} --nproc_per_node=2")
    assert len(calls.read_text().splitlines()) == 3


@pytest.mark.slow
def test_an_interrupted_sweep_finishes_on_rerun_without_repeating_a_run(tiny_run, capsys):
    config, out_dir = tiny_run
    argv = [str(config), "--variants=standard,efficient", "--match=flops", "--sizes=1x1x16,1x2x16",
            "--max_iters=150", f"--out_dir={out_dir}"]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    sweep = subprocess.Popen([sys.executable, "compare.py", *argv], cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    seen_run_2 = False
    for line in sweep.stdout:  # SIGINT during run 2's training, as a Ctrl-C would
        seen_run_2 |= line.startswith("=== run 2 of 4")
        if seen_run_2 and line.startswith("iter 5:"):
            sweep.send_signal(signal.SIGINT)
            break
    output = sweep.communicate(timeout=120)[0]
    assert sweep.returncode == 130
    assert ("stopped by SIGINT: efficient at 1x1x16, seed 0 saved its checkpoint, and resumes from it; rerun the "
            "same command to continue" in output)
    runs = [run.as_dict() for run in plan(config, out_dir, *argv[1:])[0]]
    first, second = (out_dir / runs[k]["size"] / f"{runs[k]['variant']}-seed0" for k in (0, 1))
    first_summary = (first / "summary.json").read_text()
    interrupted = json.loads((second / "summary.json").read_text())
    assert json.loads(first_summary)["stop_reason"] == "max_iters"
    assert interrupted["stop_reason"] == "SIGINT" and 5 <= interrupted["iterations"] < runs[1]["iterations"]
    assert not (out_dir / "1x2x16").exists()  # the sweep stopped: no later run started

    assert compare.main(argv) == 0
    out = capsys.readouterr().out
    assert "=== run 1 of 4: standard at 1x1x16, seed 0, 150 iters: finished already, skipped" in out
    assert out.count("finished already") == 1 and "(resuming)" in out and "--init_from=resume" in out
    assert (first / "summary.json").read_text() == first_summary  # not trained again
    for run in runs:
        summary = json.loads((out_dir / run["size"] / f"{run['variant']}-seed0" / "summary.json").read_text())
        assert summary["stop_reason"] == "max_iters" and summary["iterations"] == run["iterations"]
    steps = [json.loads(line) for line in (second / "log.jsonl").read_text().splitlines()]
    assert [s["iter"] for s in steps if s["type"] == "train"] == list(range(1, runs[1]["iterations"] + 1))
    results = json.loads((out_dir / "results.json").read_text())
    resumed = next(r for r in results["runs"] if r["size"] == runs[1]["size"] and r["attention"] == runs[1]["variant"])
    assert resumed["wall_time_s"] > interrupted["wall_time_s"]  # both segments counted


@pytest.mark.slow
def test_a_sweep_into_a_closed_pipe_stops_quietly_and_resumes_on_rerun(tiny_run, capsys):
    """`python compare.py ... | head -2`: the reader may close the pipe at the plan, or while a train.py
    runs, whose output compare.py passes on; either ends the sweep without a traceback, and a rerun goes on."""
    config, out_dir = tiny_run
    argv = [str(config), "--variants=efficient", "--max_iters=300", f"--out_dir={out_dir}"]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    at_plan = subprocess.Popen([sys.executable, "compare.py", *argv], cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    at_plan.stdout.close()  # before the child has imported torch, so its first write finds no reader
    assert at_plan.wait(timeout=120) == 141 and at_plan.stderr.read() == ""
    at_plan.stderr.close()
    assert not (out_dir / "efficient-seed0").exists()

    while_training = subprocess.Popen([sys.executable, "compare.py", *argv], cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in while_training.stdout:
        if line.startswith("iter 5:"):  # train.py's, passed on
            break
    while_training.stdout.close()
    assert while_training.wait(timeout=120) == 141 and "Traceback" not in while_training.stderr.read()
    while_training.stderr.close()
    stopped = json.loads((out_dir / "efficient-seed0" / "summary.json").read_text())
    assert stopped["stop_reason"] == "SIGTERM" and 5 <= stopped["iterations"] < 300

    assert compare.main(argv) == 0 and "(resuming)" in capsys.readouterr().out
    assert json.loads((out_dir / "efficient-seed0" / "summary.json").read_text())["iterations"] == 300


@pytest.mark.parametrize("error, raised", [(BrokenPipeError(errno.EPIPE, "Broken pipe"), BrokenPipeError),
                                           (OSError(errno.ENOSPC, "No space left on device"), sweep.RunFailed)])
def test_a_closed_stdout_stops_the_running_train_py_as_a_sigterm_does(tmp_path, monkeypatch, error, raised):
    """The reader of compare.py's output gone (or its disk full), the train.py whose output it passes on is
    stopped (and saves), rather than left to fail at its next line, losing its steps since the last checkpoint."""
    saved = tmp_path / "saved"
    child = tmp_path / "train_stand_in.py"
    child.write_text("import signal, sys, time\n"
                     "def save_and_stop(*_):\n"
                     f"    open({str(saved)!r}, 'w').write('SIGTERM')\n"
                     "    print('saved a checkpoint', flush=True)\n"
                     "    sys.exit(0)\n"
                     "signal.signal(signal.SIGTERM, save_and_stop)\n"
                     "for _ in range(300):  # some 3 s of training, its output within a pipe's buffer\n"
                     "    print('iter', flush=True)\n"
                     "    time.sleep(0.01)\n")

    def failing(*args):
        raise error

    monkeypatch.setattr(sys, "stdout", SimpleNamespace(buffer=SimpleNamespace(write=failing, flush=failing)))
    with sweep.SignalForwarder() as forwarder, pytest.raises(raised) as caught:
        forwarder.run([sys.executable, str(child)], stdout=subprocess.PIPE)
    assert saved.read_text() == "SIGTERM"
    if raised is sweep.RunFailed:
        assert str(caught.value).startswith("writing compare.py's output failed ([Errno 28] No space left on device)")


def test_loss_axis_leaves_out_only_the_start_of_each_run():
    # a run logged every 100 iterations and evaluated at 0 and at its end, as the compute-matched study is
    train = [{"type": "train", "iter": i, "loss": 4.5 - i / 400} for i in range(0, 801, 100)]
    evals = [{"type": "eval", "iter": 0, "val_loss": 4.6}, {"type": "eval", "iter": 800, "val_loss": 2.6}]
    top = frontier.loss_axis_top({"standard": train + evals})
    assert 4.25 <= top < 4.5  # the loss at iteration 100 shows; the first tenth's 4.5 and 4.6 do not
    assert frontier.loss_axis_top({"standard": []}) is None
