"""compare.py, sweep.py and frontier.py: budgets resolved to iterations, stretched schedules, the
resumable sweep, the fit of loss against compute, the tables and the optional plots."""

import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import compare
import configurator
import frontier
import sweep
import train
from conftest import REPO
from eval_hellaswag import evaluate_checkpoint
from model import GPT, GPTConfig
from tokenizer import write_meta

TEXT = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer. "
TEXT *= 40
PNG = b"\x89PNG\r\n\x1a\n"


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
        "eval_interval = 3\neval_iters = 2\nlog_interval = 1\nlearning_rate = 1e-2\n"
        "min_lr = 1e-3\n"
        "device = 'cpu'\ncompile = False\nbias = True\nnum_threads = 1\n"
    )
    return config, tmp_path / "compare"


def plan(config, out_dir, *argv):
    args, overrides = compare.parse_args([str(config), f"--out_dir={out_dir}", *argv])
    return sweep.plan_sweep(args, overrides, out_dir)


def summary_of(run_dir):
    return json.loads((Path(run_dir) / "summary.json").read_text())


def config_of(train_args):
    return configurator.resolve_config(configurator.get_config(train_args))


@pytest.mark.slow
def test_compare_prints_its_plan_a_line_per_run_and_the_table_with_a_legend(tiny_run, capsys):
    config, out_dir = tiny_run
    assert compare.main([str(config), "--variants=standard,efficient", "--seeds=2",
                         f"--out_dir={out_dir}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("plan: 4 runs, --match=iters")
    assert [line.split(":")[0] for line in out[1:5]] == [f"  run {k}/4" for k in range(1, 5)]
    assert [line.split(":")[0] for line in out[6:10]] == [f"run {k}/4 done" for k in range(1, 5)]
    assert "1x2x16 efficient seed 1: 6 iters, train loss" in out[9]
    assert not any(line.startswith(("iter ", "step ", "device ")) for line in out)  # train.py's
    assert "Legend:" in out and out[-1].startswith(f"wrote {out_dir.resolve() / 'results.md'}")
    log = (out_dir / "standard-seed1" / "train.log").read_text().splitlines()
    assert "train.py" in log[0] and "--seed=1" in log[0] and any("iter 6" in line for line in log)

    results = json.loads((out_dir / "results.json").read_text())
    assert list(results["results"]) == ["1x2x16"]
    assert list(results["results"]["1x2x16"]) == ["standard", "efficient"]
    for variant, row in results["results"]["1x2x16"].items():
        for key in ("attention_params", "n_params", "flops_per_token", "final_train_loss",
                    "mean_ms_per_iter", "tokens_per_s", "peak_memory_mb", "wall_time_s"):
            assert len(row[key]["runs"]) == 2, (variant, key)
        val = row["final_val_loss"]
        assert val["runs"][0] != val["runs"][1] and val["std"] > 0  # other seeds, other runs
        assert val["mean"] == pytest.approx(sum(val["runs"]) / 2)
        run = next(r for r in results["runs"] if r["attention"] == variant)
        assert run["iterations"] == 6 and run["tokens"] == 6 * 4 * 16
        assert run["training_flops"] == run["flops_per_token"] * 6 * 4 * 16
        assert run["step_seconds"] == pytest.approx(run["mean_ms_per_iter"] / 1000 * 6)
    table = (out_dir / "results.md").read_text()
    header = next(line for line in table.splitlines() if line.startswith("| attention |"))
    for column in ("attn params/layer", "FLOPs/token", "training FLOPs", "train loss", "val loss",
                   "ms/iter", "peak memory (MB)", "step time (s)", "wall time (s)"):
        assert f"| {column} |" in header
    assert "HellaSwag" not in header and "±" in table  # no data given, so no empty columns
    # d=16: standard has 4 learned 16x16 projections with biases, efficient 2 (ranked first)
    assert "| efficient | 544 (1) |" in table and "| standard | 1,088 (2) |" in table
    if importlib.util.find_spec("matplotlib"):
        assert (out_dir / "loss.png").read_bytes()[:8] == PNG


def test_relative_paths_mean_the_same_to_the_plan_and_to_the_runs(tiny_run, monkeypatch):
    config, out_dir = tiny_run
    monkeypatch.chdir(config.parent)  # a working directory that is not the repository
    assert compare.main([config.name, "--variants=efficient", "--data_dir=data",
                         "--out_dir=compare", "--max_iters=2"]) == 0
    assert summary_of(out_dir / "efficient-seed0")["iterations"] == 2


# -----------------------------------------------------------------------------
# budgets and schedules, resolved before anything trains

def direct_flops_per_token(config, variant, shape):
    c = config_of([str(config)])
    args = {k: c[k] for k in configurator.MODEL_ARG_KEYS} | dict(
        zip(("n_layer", "n_head", "n_embd"), shape), attention=variant, vocab_size=len(set(TEXT)))
    return GPT(GPTConfig(**args)).flops_per_token()


@pytest.mark.parametrize("budget", [[], ["--budget_flops=3e8"]])
def test_flop_matched_iterations_are_budget_over_cost_per_iteration(tiny_run, budget):
    config, out_dir = tiny_run
    runs, budgets = plan(config, out_dir, "--match=flops", "--sizes=1x1x16,2x2x32",
                         "--max_iters=40", "--warmup_iters=4", "--eval_interval=10", *budget)
    assert len(runs) == 2 * 4 and not out_dir.exists()  # planning trains and writes nothing
    for shape in ((1, 1, 16), (2, 2, 32)):
        label = sweep.size_label(shape)
        standard = direct_flops_per_token(config, "standard", shape) * 64 * 40  # 64 tokens a step
        assert budgets[label] == (3e8 if budget else standard)
        for run in (r for r in runs if r.size == label):
            assert run.flops_per_token == direct_flops_per_token(config, run.variant, shape)
            iterations = round(budgets[label] / (run.flops_per_token * 64))
            assert run.iterations == iterations
            assert run.schedule == {"max_iters": iterations, "lr_decay_iters": iterations,
                                    "warmup_iters": round(4 * iterations / 40),
                                    "eval_interval": round(10 * iterations / 40)}
    cheaper = {r.variant: r.iterations for r in runs if r.size == "2x2x32"}
    assert cheaper["standard"] < cheaper["optimized"] < cheaper["efficient"]
    assert cheaper["standard"] == (29 if budget else 40)  # 3e8 / (161,280 FLOPs x 64) = 29.07


def test_token_budget_and_the_iterations_default(tiny_run):
    config, out_dir = tiny_run
    runs, budgets = plan(config, out_dir, "--match=tokens", "--budget_tokens=640",
                         "--variants=standard,super")
    assert budgets == {"1x2x16": 640} and [r.iterations for r in runs] == [10, 10]  # 64 a step
    runs, _ = plan(config, out_dir, "--match=tokens", "--budget_tokens=640", "--variants=standard",
                   "--gradient_accumulation_steps=2")
    assert [r.iterations for r in runs] == [5]  # an iteration is every micro-batch: 2 x 4 x 16
    runs, _ = plan(config, out_dir, "--variants=efficient", "--max_iters=7", "--batch_size=2")
    assert [r.iterations for r in runs] == [7] and runs[0].run_dir == out_dir / "efficient-seed0"
    keys = [arg.split("=")[0] for arg in runs[0].train_args]
    assert keys.count("--max_iters") == 1 and "--batch_size=2" in runs[0].train_args
    runs, _ = plan(config, out_dir, "--variants=standard", "--match=tokens", "--budget_tokens=64",
                   "--max_iters=6", "--eval_interval=3")
    assert [(r.iterations, r.schedule["eval_interval"]) for r in runs] == [(1, 1)]  # evaluated


def test_iteration_matched_runs_decay_over_their_own_iterations(tiny_run):
    """config/train_gpt2.py --max_iters=5000 keeps the config's lr_decay_iters=600000: the cosine
    must end where the run ends, as under every other budget, with evaluation inside the run."""
    config, out_dir = tiny_run
    runs, _ = plan(config, out_dir, "--variants=standard,efficient", "--max_iters=5",
                   "--lr_decay_iters=600", "--warmup_iters=3", "--eval_interval=100")
    for run in runs:
        assert run.schedule == {"max_iters": 5, "lr_decay_iters": 5, "warmup_iters": 3,
                                "eval_interval": 5}
        c = config_of(run.train_args)  # what train.py is given
        assert (c["max_iters"], c["lr_decay_iters"], c["warmup_iters"]) == (5, 5, 3)
    runs, _ = plan(config, out_dir, "--variants=standard", "--max_iters=5", "--warmup_iters=20")
    assert runs[0].schedule["warmup_iters"] == 20  # train.get_lr cuts it to the run's last step


def test_a_budget_stopped_run_ends_on_its_schedules_final_learning_rate(tiny_run):
    config, out_dir = tiny_run
    assert compare.main([str(config), "--variants=efficient", "--match=flops", "--max_iters=20",
                         "--warmup_iters=2", f"--out_dir={out_dir}"]) == 0
    run = json.loads((out_dir / "results.json").read_text())["plan"][0]
    assert run["iterations"] > 20  # efficient gets the FLOPs standard spends in 20 iterations
    c = config_of([str(config)]) | {k: run[k] for k in ("max_iters", "lr_decay_iters",
                                                         "warmup_iters")}
    steps = [s for s in sweep.read_log(out_dir / "efficient-seed0") if s["type"] == "train"]
    assert [s["iter"] for s in steps] == list(range(1, run["iterations"] + 1))
    assert [s["lr"] for s in steps] == [train.get_lr(s["iter"] - 1, c) for s in steps]
    # the last step is the cosine's last: within its final step of min_lr, far below the peak
    last = 0.5 * (1 - math.cos(math.pi / (run["iterations"] - run["warmup_iters"]))) * 9e-3
    assert 1e-3 <= steps[-1]["lr"] <= 1e-3 + last + 1e-12


@pytest.mark.slow
def test_the_runs_of_one_seed_read_the_same_batches(tiny_run, monkeypatch):
    """The variants of one seed are paired: FLOP-matched runs of different lengths draw the same
    training batches in one order (a cheaper one's extra steps come after them), and every
    evaluation reads the same validation windows. Another seed draws others."""
    config, out_dir = tiny_run
    runs, _ = plan(config, out_dir, "--variants=standard,efficient,super", "--seeds=2",
                   "--match=flops", "--max_iters=5", "--eval_interval=2")
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
        train.train(config_of(run.train_args), verbose=False)
        drawn[run.variant, run.seed] = {
            "steps": [ix for phase, _, ix in read if phase == "step"],
            "val": [ix for phase, split, ix in read if phase == "eval" and split == "val"]}
    iterations = {run.variant: run.iterations for run in runs}
    assert iterations["standard"] < iterations["efficient"]  # the same FLOPs, more steps
    for seed in (0, 1):
        for variant in iterations:
            mine, first_val = drawn[variant, seed], drawn["standard", seed]["val"][0]
            assert mine["steps"] == drawn["efficient", seed]["steps"][:iterations[variant]]
            assert len(mine["val"]) > 1 and all(ix == first_val for ix in mine["val"])
    assert drawn["standard", 0]["steps"] != drawn["standard", 1]["steps"]
    assert drawn["standard", 0]["val"][0] != drawn["standard", 1]["val"][0]


@pytest.mark.slow
def test_a_time_matched_sweep_plans_from_its_probes_which_a_rerun_reuses(tiny_run, capsys):
    config, out_dir = tiny_run
    argv = [str(config), "--variants=efficient", "--reference=efficient", "--match=time",
            "--budget_seconds=0.1", "--probe_iters=3", f"--out_dir={out_dir}"]
    assert compare.main(argv) == 0
    planned = json.loads((out_dir / "results.json").read_text())["plan"]
    probe_files = {}
    for run in planned:
        probe_dir = out_dir / "probes" / "1x2x16" / run["variant"]
        probe = summary_of(probe_dir)
        assert probe["stop_reason"] == "max_iters" and probe["iterations"] == 3
        assert run["iterations"] == max(1, round(0.1 / (probe["mean_ms_per_iter"] / 1000)))
        assert summary_of(out_dir / f"{run['variant']}-seed0")["iterations"] == run["iterations"]
        probe_files |= {path: path.read_bytes() for path in probe_dir.iterdir()}
    capsys.readouterr()
    assert compare.main(argv) == 0 and capsys.readouterr().out.count("finished already") == 1
    assert json.loads((out_dir / "results.json").read_text())["plan"] == planned
    assert {path: path.read_bytes() for path in probe_files} == probe_files  # not probed again
    plan(config, out_dir, *argv[1:], "--batch_size=8")  # twice the tokens a step: another time
    assert summary_of(out_dir / "probes" / "1x2x16" / "efficient")["tokens_per_iter"] == 8 * 16


@pytest.mark.slow
def test_the_launcher_starts_every_train_py_probes_included(tiny_run):
    """Under torchrun an iteration's micro-batches are split over the processes: a probe without
    the launcher would time another thing than the runs do."""
    config, out_dir = tiny_run
    calls, wrapper = config.parent / "calls.txt", config.parent / "launcher.py"
    wrapper.write_text("import os, runpy, sys\n"
                       f"open({str(calls)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
                       "sys.argv = sys.argv[1:]\n"
                       "sys.path.insert(0, os.path.dirname(sys.argv[0]))\n"
                       "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    assert compare.main([str(config), "--variants=efficient", "--match=time", "--probe_iters=2",
                         "--budget_seconds=0.05", f"--launcher={sys.executable} {wrapper}",
                         f"--out_dir={out_dir}"]) == 0
    launched = calls.read_text().splitlines()  # the probes of efficient and standard, then the run
    assert len(launched) == 3 and all("/probes/" in call for call in launched[:2])
    assert "efficient-seed0" in launched[2]


def test_sizes_are_ordered_by_their_compute_and_seeds_are_the_outermost_loop(tiny_run):
    """At block_size 1024 one layer of 256 costs less per token than twelve of 64 (attention's T
    terms): the last size, whose losses loss.png plots, is the largest."""
    config, out_dir = tiny_run
    _, budgets = plan(config, out_dir, "--variants=standard", "--match=flops",
                      "--sizes=12x4x64,1x1x256", "--block_size=1024")
    assert list(budgets) == ["1x1x256", "12x4x64"] and budgets["1x1x256"] < budgets["12x4x64"]
    runs, budgets = plan(config, out_dir, "--variants=standard,efficient", "--seeds=2",
                         "--sizes=2x2x32,cpu-s")
    assert list(budgets) == ["2x2x32", "2x2x64"]
    assert [(r.seed, r.size, r.variant) for r in runs] == [
        (seed, size, v) for seed in (0, 1) for size in budgets for v in ("standard", "efficient")]


def test_sizes_scale_the_mlp_width_and_key_value_heads_at_the_configs_ratio(tiny_run):
    """A SwiGLU or grouped-query config (the Llama ones) swept over sizes: its intermediate_size
    follows n_embd and its n_kv_head n_head, at the config's ratio."""
    config, out_dir = tiny_run
    with open(config, "a") as f:  # a hidden width of 2.5 d, two query heads per key/value head
        f.write("mlp = 'swiglu'\nintermediate_size = 40\nn_kv_head = 1\n")
    runs, _ = plan(config, out_dir, "--variants=standard", "--sizes=1x2x16,2x4x32,1x6x24")
    shapes = {r.size: config_of(r.train_args) for r in runs}
    assert {size: (c["intermediate_size"], c["n_kv_head"]) for size, c in shapes.items()} == {
        "1x2x16": (40, 1), "2x4x32": (80, 2), "1x6x24": (60, 3)}


# -----------------------------------------------------------------------------
# errors: one line each, before anything trains

@pytest.mark.parametrize("argv, message", [
    (["--variants=standard,fast"], "choose among standard, optimized, efficient, super"),
    (["--seed=3"], "compare.py sets attention, seed, out_dir, init_from itself"),  # not --seeds
    (["--max_iters", "5"], "passed as --key=value"),
    (["--match=energy"], "invalid choice: 'energy'"),
    (["--sizes=2x2"], "'2x2' is not n_layer x n_head x n_embd"),
    (["--match=tokens", "--budget_flops=1e9"], "a budget is a positive number, given with"),
    (["--learning_rates=1e-3,fast"], "--learning_rates: could not convert"),
    (["--seeds=0"], "--seeds must be at least 1"),
    (["--eval_iter=2"], "'eval_iter'"),  # train.py's own error, with its suggestion
    (["--sizes=1x1x16", "--dropout=2.0"], "dropout"),
    (["--variants=standard,efficient", "--n_kv_head=1"], "n_kv_head=1"),  # needs W^K and W^V
    (["--hellaswag_file=missing.jsonl"], "missing.jsonl"),
])
def test_bad_arguments_or_settings_are_one_error_line(tiny_run, argv, message, capsys):
    config, out_dir = tiny_run
    try:
        assert compare.main([str(config), f"--out_dir={out_dir}", *argv]) == 1
    except SystemExit as e:  # argparse's
        assert e.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert not out_dir.exists()


def test_data_not_prepared_yet_names_the_command_that_prepares_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no data/ here
    shutil.copytree(REPO / "config", tmp_path / "config")
    assert compare.main(["config/train_shakespeare_char_cpu.py", "--out_dir=compare"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: data folder data/shakespeare_char not found")
    assert "python prepare_char.py --input=path/to/tinyshakespeare.txt" in err
    assert err.count("\n") == 1 and not (tmp_path / "compare").exists()


def test_a_failed_training_run_is_one_error_line_with_its_own_error(tiny_run, capsys):
    config, out_dir = tiny_run
    assert compare.main([str(config), "--variants=efficient", f"--out_dir={out_dir}",
                         "--block_size=4000"]) == 1
    err = capsys.readouterr().err.splitlines()
    log = out_dir / "efficient-seed0" / "train.log"
    assert len(err) == 1 and "block_size" in err[0] and err[0].endswith(f"(all of it: {log})")
    assert err[0].startswith("error: training 1x2x16 efficient seed 0 failed (exit code 1): ")


# -----------------------------------------------------------------------------
# ranks and ties

def seeds_of(**val_losses):
    """One size's results of variants with these val losses over seeds, as aggregate makes them."""
    return {variant: frontier.aggregate([{"final_val_loss": loss} for loss in losses])
            for variant, losses in val_losses.items()}


def test_a_difference_within_two_standard_errors_is_a_tie():
    """1.910, 1.928 and 1.935, each ± 0.01 over 3 seeds: 2 standard errors of a difference are
    2 √(0.01²/3 + 0.01²/3) = 0.0163. Optimized is 0.018 behind super: ranked, though within 2
    standard deviations (0.02). Standard is 0.007 behind optimized: a tie."""
    table = frontier.markdown_table(seeds_of(super=[1.90, 1.91, 1.92],
                                             optimized=[1.918, 1.928, 1.938],
                                             standard=[1.925, 1.935, 1.945]))
    assert "| super | 1.9100 ± 0.0100 (1) |" in table
    assert "| optimized | 1.9280 ± 0.0100 (2) |" in table
    assert "| standard | 1.9350 ± 0.0100 (3=) |" in table
    se = math.sqrt(2 * 0.01 ** 2 / 3)
    for gap, tied in ((1.9 * se, True), (2.1 * se, False)):
        results = seeds_of(a=[1.90, 1.91, 1.92], b=[1.90 + gap, 1.91 + gap, 1.92 + gap])
        assert frontier.is_tie(*(r["final_val_loss"] for r in results.values())) is tied
    results = seeds_of(a=[2.0], b=[2.0001])  # one seed: ranked as measured
    assert not frontier.is_tie(*(r["final_val_loss"] for r in results.values()))
    results = seeds_of(standard=[2.0, 2.1], optimized=[2.1, 2.0], efficient=[2.2, 2.3])
    assert list(frontier.rankings(results, "final_val_loss", "low").values()) == [1, 1, 2]


# -----------------------------------------------------------------------------
# the fit

def test_the_fit_recovers_a_saturating_power_law_and_reads_it_inside_its_range_only():
    C = np.geomspace(1e10, 1e14, 5)
    fit = frontier.fit_loss_curve(C, 1.3 + 40.0 * C ** -0.12)
    assert fit["law"] == "E + A*C^-alpha" and not fit["E_at_bound"]
    assert fit["E"] == pytest.approx(1.3, rel=1e-4) and fit["A"] == pytest.approx(40.0, rel=1e-2)
    assert fit["alpha"] == pytest.approx(0.12, rel=1e-3) and max(map(abs, fit["residuals"])) < 1e-6
    side, compute = frontier.reach(fit, 1.3 + 40.0 * 3e12 ** -0.12)
    assert side == "inside" and compute == pytest.approx(3e12, rel=1e-3)
    assert frontier.reach(fit, 1.3 + 40.0 * 1e15 ** -0.12) == ("beyond", pytest.approx(1e14))
    assert frontier.reach(fit, 1.2) == ("beyond", pytest.approx(1e14))  # under E: never reached
    assert frontier.reach(fit, 1.3 + 40.0 * 1e9 ** -0.12) == ("below", pytest.approx(1e10))
    at_largest = frontier.fitted_loss_at_largest(fit)
    assert frontier.reach(fit, at_largest) == ("inside", pytest.approx(1e14))
    # losses that stop falling put the floor just under the smallest: the points do not place it
    assert frontier.fit_loss_curve(C[:4], [2.3, 2.1, 2.0, 2.0])["E_at_bound"]
    fit = frontier.fit_loss_curve(C[:3], 25.0 * C[:3] ** -0.1)  # three sizes: E = 0, no search
    assert fit["law"] == "A*C^-alpha" and fit["E"] == 0.0 and not fit["E_at_bound"]
    assert fit["A"] == pytest.approx(25.0) and fit["alpha"] == pytest.approx(0.1)
    assert frontier.fit_loss_curve(C[:2], 25.0 * C[:2] ** -0.1) is None


COMPUTE_NEEDED = {"efficient": 1.5, "super": 1e-4}  # of standard's, for the same loss; others 1
SIZES = {"s": 1e10, "m": 1e11, "l": 1e12, "xl": 1e13}


def synthetic_summaries(variants, seeds=2):
    """Runs of four sizes whose losses follow known curves: efficient needs 1.5x standard's
    compute, super 1e-4x (so little that its smallest size beats standard's largest already)."""
    need = COMPUTE_NEEDED
    return [dict(attention=v, size=size, seed=seed, training_flops=C, n_params=C / 1e6,
                 wall_time_s=C / 1e9, final_val_loss=1.0 + 30.0 * (C / need.get(v, 1)) ** -0.1)
            for size, C in SIZES.items() for seed in range(seeds) for v in variants]


def report(out_dir, rows, variants, seeds=1, budgets=SIZES):
    return frontier.write_report(out_dir, "header", [], budgets, rows, variants=variants,
                                 reference="standard", seeds=seeds, extra={})


def summary_rows(markdown):
    return {line.split(" | ")[0][2:]: line for line in markdown.split("## Summary")[1].splitlines()
            if line.startswith("| ") and not line.startswith("| attention")}


def test_the_summary_reads_each_variant_inside_its_measured_range(tmp_path):
    """'out of range' means the target needs more than the largest budget; a variant below it at
    its smallest size already says so, with the bound its smallest compute gives."""
    variants = ["standard", "efficient", "super"]
    markdown = report(tmp_path, synthetic_summaries(variants), variants, seeds=2)
    row = summary_rows(markdown)
    assert row["super"].endswith("| below smallest budget (< 1e+10) | < 0.001x |")
    assert row["efficient"].endswith("| out of range | out of range |")
    assert row["standard"].endswith("| 1e+13 | 1.00x |")
    assert "| val loss at s (budget 1e+10 training FLOPs) |" in markdown
    need = json.loads((tmp_path / "results.json").read_text())["analysis"]["compute_for_target"]
    assert need["super"]["reached"] == "below" and need["super"]["ratio"] == pytest.approx(1e-3)
    analysis = frontier.analyse(synthetic_summaries(variants), list(SIZES), variants,
                                "standard", 2, target=1.0 + 30 * 5e11 ** -0.1)  # a target given
    assert analysis["compute_for_target"]["efficient"]["ratio"] == pytest.approx(1.5, rel=1e-3)


def test_missing_matplotlib_or_scipy_skips_only_the_plots(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy", None)  # the fit is numpy alone
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    variants = ["standard", "efficient"]
    markdown = report(tmp_path, synthetic_summaries(variants, 1), variants)
    assert not list(tmp_path.glob("*.png"))
    assert "E=1.000, A=30, α=0.100 (E + A*C^-alpha); largest" in markdown


def test_the_plots_are_written_where_matplotlib_is_installed(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [r | {"learning_rate": lr} for r in synthetic_summaries(["standard", "efficient"])
            for lr in (1e-3, 2e-3)]
    report(tmp_path, rows, ["standard", "efficient"], seeds=2)
    for name in ("frontier.png", "learning_rates.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG


@pytest.mark.parametrize("change, said", [
    ("same_budget", "no fit (every size trained on about the same FLOPs (they span 1.03x))"),
    ("rising", "loss rises with compute"),
    ("two_sizes", "no fit (2 sizes; a fit needs 3)"),
])
def test_where_there_is_no_curve_to_read_the_summary_says_why(tmp_path, change, said):
    rows, budgets = synthetic_summaries(["standard", "efficient"], seeds=1), SIZES
    for row in rows:
        if change == "same_budget":  # an explicit --budget_flops gives every size the same compute
            row["training_flops"] = 1e12 * (1 + 0.01 * list(SIZES).index(row["size"]))
        if change == "rising" and row["attention"] == "efficient":
            row["final_val_loss"] = 2.0 + 0.01 * math.log10(row["training_flops"])
    if change == "two_sizes":
        rows, budgets = [r for r in rows if r["size"] in ("s", "m")], {"s": 1e10, "m": 1e11}
    markdown = report(tmp_path, rows, ["standard", "efficient"], budgets=budgets)
    efficient = summary_rows(markdown)["efficient"]
    assert said in efficient and efficient.endswith("| n/a | n/a |")
    if change == "two_sizes":  # no fit of the reference: its measured loss at the largest size
        assert f"compute for loss {1 + 30 * 1e11 ** -0.1:.4f} |" in markdown


def test_a_reference_outside_the_variants_sets_no_target(tmp_path):
    markdown = report(tmp_path, synthetic_summaries(["optimized", "efficient"], 1),
                      ["optimized", "efficient"])
    summary = markdown.split("## Summary")[1]
    assert "compute for loss (none)" in summary and summary.count("| n/a | n/a |") == 2


def test_alpha_comes_with_its_range_over_the_fits_of_each_seed(tmp_path):
    """Seed 0's losses follow alpha 0.10, seed 1's 0.12, each with its floor E = 1 well inside."""
    rows = synthetic_summaries(["standard", "efficient"], seeds=2)
    for row in rows:
        alpha = 0.10 if row["seed"] == 0 else 0.12
        row["final_val_loss"] = 1.0 + 30.0 * row["training_flops"] ** -alpha
    standard = summary_rows(report(tmp_path, rows, ["standard", "efficient"], seeds=2))["standard"]
    assert "(E + A*C^-alpha); α per seed 0.100–0.120; largest residual" in standard
    analysis = json.loads((tmp_path / "results.json").read_text())["analysis"]
    assert analysis["alpha_per_seed"]["standard"] == pytest.approx([0.10, 0.12], rel=1e-3)
    rows = [r for r in rows if r["seed"] == 0 or r["size"] in ("s", "m")]  # seed 1: no fit
    analysis = frontier.analyse(rows, list(SIZES), ["standard"], "standard", 2)
    assert analysis["alpha_per_seed"]["standard"] == [pytest.approx(0.1, rel=1e-3), None]
    assert "α per seed" not in frontier.fit_cell(analysis, "standard")


# -----------------------------------------------------------------------------
# a sweep of learning rates: each variant at its best

def test_a_learning_rate_sweep_plans_each_rate_with_min_lr_at_the_configs_ratio(tiny_run):
    config, out_dir = tiny_run
    runs, _ = plan(config, out_dir, "--learning_rates=4e-3,1e-3", "--variants=standard,efficient",
                   "--match=flops", "--max_iters=20")
    assert [(r.variant, r.learning_rate) for r in runs] == [
        ("standard", 1e-3), ("standard", 4e-3), ("efficient", 1e-3), ("efficient", 4e-3)]
    for run in runs:
        assert run.run_dir == out_dir / f"{run.variant}-lr{run.learning_rate:g}-seed0"
        c = config_of(run.train_args)  # the tiny config decays 1e-2 to 1e-3: min_lr a tenth
        assert (c["learning_rate"], c["min_lr"]) == (run.learning_rate, run.learning_rate / 10)
        assert c["max_iters"] == run.iterations
    assert [r.iterations == 20 for r in runs] == [True, True, False, False]  # efficient: more


@pytest.mark.slow
def test_each_variant_is_compared_at_its_best_rate_and_a_wider_grid_reuses_runs(tiny_run, capsys):
    config, out_dir = tiny_run
    argv = [str(config), "--variants=standard,efficient", f"--out_dir={out_dir}"]
    assert compare.main([*argv, "--learning_rates=1e-3,3e-2"]) == 0
    results = json.loads((out_dir / "results.json").read_text())
    assert len(results["runs"]) == len(results["plan"]) == 4
    markdown = (out_dir / "results.md").read_text()
    for variant in ("standard", "efficient"):
        losses = {r["learning_rate"]: r["final_val_loss"] for r in results["runs"]
                  if r["attention"] == variant}
        best = min(losses, key=losses.get)
        assert results["best_learning_rates"]["1x2x16"][variant] == best
        row = results["results"]["1x2x16"][variant]
        assert row["final_val_loss"]["runs"] == [losses[best]]
        assert row["learning_rate"]["mean"] == best
        lr_row = next(line for line in markdown.splitlines()
                      if line.startswith(f"| {variant} | ") and "**" in line)
        assert f"**{losses[best]:.4f}**" in lr_row
        assert lr_row.endswith(f"| {best:g} (edge of the grid) |")
    assert markdown.index("## Learning rates") < markdown.index("## 1x2x16")
    capsys.readouterr()
    assert compare.main([*argv, "--learning_rates=1e-3,1e-2,3e-2"]) == 0
    out = capsys.readouterr().out
    assert out.count("finished already") == 4 and out.count("done: 1x2x16") == 2
    assert len(json.loads((out_dir / "results.json").read_text())["runs"]) == 6


@pytest.mark.slow
def test_a_diverged_rate_is_a_result_and_hellaswag_scores_the_best(tiny_run, capsys, monkeypatch):
    config, out_dir = tiny_run
    hellaswag = out_dir.parent / "hellaswag.jsonl"  # the diverged run is not scored
    hellaswag.write_text(json.dumps({"ctx": "To be, or not", "label": 0,
                                     "endings": [" to be", " the mind", " is", " tis"]}) + "\n")
    argv = [str(config), "--variants=efficient", "--max_iters=4", f"--out_dir={out_dir}",
            "--learning_rates=1e-3,1e9", f"--hellaswag_file={hellaswag}"]
    assert compare.main(argv) == 0
    assert "1x2x16 efficient lr 1e+09 seed 0: diverged at iteration" in capsys.readouterr().out
    results = json.loads((out_dir / "results.json").read_text())
    assert results["best_learning_rates"] == {"1x2x16": {"efficient": 1e-3}}
    assert [r["learning_rate"] for r in results["runs"] if "hellaswag_acc" in r] == [1e-3]
    scored = evaluate_checkpoint(out_dir / "efficient-lr0.001-seed0", hellaswag, device="cpu",
                                 dtype="float32")
    row = results["results"]["1x2x16"]["efficient"]
    assert row["hellaswag_acc_norm"]["mean"] == scored["acc_norm"]
    table = (out_dir / "results.md").read_text()
    assert "| diverged (1 of 1 seeds) | 0.001 (edge of the grid) |" in table
    monkeypatch.setattr(compare, "evaluate_checkpoint", lambda *args: pytest.fail("scored again"))
    assert compare.main(argv) == 0 and capsys.readouterr().out.count("finished already") == 2
    # outside a learning-rate sweep a divergence is a failed run
    assert compare.main([*argv[:3], f"--out_dir={out_dir / 'one'}", "--learning_rate=1e9"]) == 1
    assert "failed (exit code 1)" in capsys.readouterr().err


def test_hellaswag_scores_are_kept_for_the_same_file_and_limit(tmp_path, monkeypatch):
    scored, run = [], SimpleNamespace(run_dir=tmp_path)

    def score(run_dir, data_file, limit):
        scored.append(limit)
        return {"acc": 0.25, "acc_norm": 0.5, "acc_char_norm": 0.75, "iter_num": 4}

    monkeypatch.setattr(compare, "evaluate_checkpoint", score)
    for limit in (None, None, 1):
        rows = {tmp_path: {}}
        args = SimpleNamespace(hellaswag_file="h.jsonl", hellaswag_limit=limit, learning_rates=[])
        compare.add_hellaswag(rows, [run], args)
        assert rows[tmp_path] == {"hellaswag_acc": 0.25, "hellaswag_acc_norm": 0.5}
    assert scored == [None, 1]


def test_the_best_learning_rate_is_the_lowest_mean_over_seeds():
    losses = {1e-3: [2.00, 2.30], 2e-3: [2.10, 2.12], 4e-3: [2.50, 2.50], 8e-3: [1.90, None]}
    runs = [{"size": "s", "attention": "super", "learning_rate": lr, "seed": seed,
             "final_val_loss": loss} for lr, seeds in losses.items()
            for seed, loss in enumerate(seeds)]
    best = frontier.best_learning_rates(runs, ["s"], ["super"])
    assert best == {("s", "super"): 2e-3}  # seed 0 alone: 1e-3, or 8e-3 where seed 1 diverged
    table = frontier.learning_rate_table(runs, "s", ["super"], [1e-3, 2e-3, 4e-3, 8e-3], best)
    assert table.splitlines()[-1] == ("| super | 2.1500 ± 0.2121 | **2.1100 ± 0.0141** | 2.5000 "
                                      "| diverged (1 of 2 seeds) | 0.002 |")


# -----------------------------------------------------------------------------
# the resumable sweep

def test_a_folder_holding_another_run_is_never_trained_into(tiny_run, capsys):
    config, out_dir = tiny_run
    argv = [str(config), f"--out_dir={out_dir}", "--max_iters=2"]
    assert compare.main([*argv, "--variants=efficient"]) == 0
    assert compare.main([*argv, "--variants=efficient", "--max_iters=3"]) == 1
    assert capsys.readouterr().err == (
        f"error: {out_dir.resolve() / 'efficient-seed0'} holds another run (other settings, or "
        f"none of this sweep's): rerun the command that made it, or choose another --out_dir\n")
    assert summary_of(out_dir / "efficient-seed0")["iterations"] == 2
    theirs = out_dir / "standard-seed0"  # where the sweep would put standard: a plain train.py run
    assert train.main([str(config), f"--out_dir={theirs}", "--max_iters=2"]) == 0
    files = {path: path.read_bytes() for path in theirs.iterdir()}
    assert compare.main([*argv, "--variants=efficient,standard"]) == 1
    assert f"error: {theirs.resolve()} holds another run" in capsys.readouterr().err
    assert {path: path.read_bytes() for path in theirs.iterdir()} == files


@pytest.mark.slow
def test_a_run_whose_train_py_alone_was_stopped_is_an_error_and_resumes_on_rerun(tiny_run, capsys):
    """A SIGTERM sent to a train.py alone (kill -TERM <its pid>): it saves and exits with status
    0, and the sweep says so rather than tabulating a partial run."""
    config, out_dir = tiny_run
    wrapper = config.parent / "stopping_launcher.py"
    wrapper.write_text("import os, signal, sys\n"
                       "sys.path.insert(0, os.path.dirname(sys.argv[1]))\n"
                       "import train\n"
                       "get_lr = train.get_lr\n"
                       "def get_lr_and_stop(it, c):  # called before every step\n"
                       "    if it == 3:\n"
                       "        os.kill(os.getpid(), signal.SIGTERM)\n"
                       "    return get_lr(it, c)\n"
                       "train.get_lr = get_lr_and_stop\n"
                       "sys.exit(train.main(sys.argv[2:]))\n")
    argv = [str(config), "--variants=efficient", "--max_iters=20", f"--out_dir={out_dir}"]
    assert compare.main([*argv, f"--launcher={sys.executable} {wrapper}"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: 1x2x16 efficient seed 0 stopped at iter")
    assert "(SIGTERM) of 20" in err[0] and err[0].endswith("rerun the same command to resume it")
    assert not (out_dir / "results.md").exists()  # a partial run is no result
    assert compare.main(argv) == 0
    summary = summary_of(out_dir / "efficient-seed0")
    assert summary["stop_reason"] == "max_iters" and summary["iterations"] == 20
    assert 0 < summary["iterations_this_run"] < 20
    assert summary["wall_time_s"] > summary["wall_time_this_run_s"]
    assert "--init_from=resume" in (out_dir / "efficient-seed0" / "train.log").read_text()


@pytest.mark.slow
def test_an_interrupted_sweep_finishes_on_rerun_without_repeating_a_run(tiny_run, capsys):
    config, out_dir = tiny_run
    argv = [str(config), "--variants=standard,efficient", "--match=flops", "--sizes=1x1x16,1x2x16",
            "--max_iters=150", f"--out_dir={out_dir}"]
    runs = plan(config, out_dir, *argv[1:])[0]
    first, second = runs[0].run_dir, runs[1].run_dir
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    process = subprocess.Popen([sys.executable, "compare.py", *argv], cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in process.stdout:
        if line.startswith("run 1/4 done"):
            break
    deadline = time.time() + 120
    while len([s for s in sweep.read_log(second) if s.get("type") == "train"]) < 5:
        assert time.time() < deadline and process.poll() is None
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)  # during run 2's training, as a Ctrl-C would
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130 and err.startswith("stopped by Ctrl-C; rerun the same")
    first_summary = (first / "summary.json").read_text()
    interrupted = summary_of(second)
    assert interrupted["stop_reason"] == "SIGINT"
    assert 5 <= interrupted["iterations"] < runs[1].iterations
    assert not (out_dir / "1x2x16").exists()  # the sweep stopped: no later run started

    assert compare.main(argv) == 0
    out = capsys.readouterr().out
    assert "run 1/4 finished already: 1x1x16 standard seed 0: 150 iters" in out
    assert out.count("finished already") == 1
    assert (first / "summary.json").read_text() == first_summary  # not trained again
    for run in runs:
        assert summary_of(run.run_dir)["stop_reason"] == "max_iters"
        assert summary_of(run.run_dir)["iterations"] == run.iterations
    steps = [s["iter"] for s in sweep.read_log(second) if s["type"] == "train"]
    assert steps == list(range(1, runs[1].iterations + 1))
    assert summary_of(second)["wall_time_s"] > interrupted["wall_time_s"]  # both processes counted
