"""compare.py: trains the chosen variants through train.py and writes results.md, results.json, loss.png."""

import json

import numpy as np
import pytest

import compare
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
        "eval_interval = 3\neval_iters = 2\nlog_interval = 1\nlearning_rate = 1e-2\n"
        "device = 'cpu'\ncompile = False\nbias = True\n"
    )
    return config, tmp_path / "compare"


def test_compare_two_variants_writes_table_json_and_plot(tiny_run, capsys):
    config, out_dir = tiny_run
    compare.main([str(config), "--variants=standard,efficient", f"--out_dir={out_dir}", "--max_iters=6"])

    results = json.loads((out_dir / "results.json").read_text())
    assert list(results["results"]) == ["standard", "efficient"]
    for variant, row in results["results"].items():
        for key in ("attention_params", "n_params", "flops_per_token", "final_train_loss", "final_val_loss",
                    "val_ppl", "mean_ms_per_iter", "tokens_per_s", "peak_memory_mb", "wall_time_s"):
            assert len(row[key]["runs"]) == 1 and row[key]["std"] == 0.0, (variant, key)
        run = results["runs"][variant][0]
        assert run["attention"] == variant and run["iterations"] == 6
        assert row["val_ppl"]["mean"] == pytest.approx(np.exp(row["final_val_loss"]["mean"]))
    # d=16: standard has 4 learned 16x16 projections with biases, efficient 2
    assert results["results"]["standard"]["attention_params"]["mean"] == 4 * (16 * 16 + 16)
    assert results["results"]["efficient"]["attention_params"]["mean"] == 2 * (16 * 16 + 16)

    table = (out_dir / "results.md").read_text().splitlines()
    header = next(line for line in table if line.startswith("| attention |"))
    for column in ("attn params/layer", "model params", "FLOPs/token", "train loss", "val loss", "val ppl",
                   "ms/iter", "tokens/s", "peak memory (MB)", "wall time (s)"):
        assert f"| {column} |" in header
    assert "HellaSwag" not in header  # no data given, so no empty columns
    efficient_row = next(line for line in table if line.startswith("| efficient |"))
    assert "| 544 (1) |" in efficient_row  # fewer attention parameters ranks first

    for variant in ("standard", "efficient"):
        log = (out_dir / f"{variant}-seed0" / "log.jsonl").read_text().splitlines()
        assert any(json.loads(line)["type"] == "eval" for line in log)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "loss.png skipped" in capsys.readouterr().out
    else:
        assert (out_dir / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_several_seeds_report_mean_and_spread(tiny_run):
    config, out_dir = tiny_run
    compare.main([str(config), "--variants=optimized", "--seeds=2", f"--out_dir={out_dir}", "--max_iters=3"])
    results = json.loads((out_dir / "results.json").read_text())
    val = results["results"]["optimized"]["final_val_loss"]
    assert len(val["runs"]) == 2 and val["runs"][0] != val["runs"][1]  # different seeds, different runs
    assert val["mean"] == pytest.approx(sum(val["runs"]) / 2) and val["std"] > 0
    assert "±" in (out_dir / "results.md").read_text()


@pytest.mark.parametrize("argv, message", [
    (["--variants=standard,fast"], "choose among standard, optimized, efficient, super"),
    (["--attention=super"], "sets attention, seed and out_dir itself"),
    (["--max_iters", "5"], "passed as --key=value"),
])
def test_bad_arguments_are_refused(tiny_run, argv, message, capsys):
    config, out_dir = tiny_run
    with pytest.raises(SystemExit):
        compare.main([str(config), f"--out_dir={out_dir}", *argv])
    assert message in capsys.readouterr().err


def test_a_failed_training_run_is_one_error_line(tiny_run, capsys):
    config, out_dir = tiny_run
    code = compare.main([str(config), "--variants=efficient", f"--out_dir={out_dir}", "--batch_size=0"])
    assert code == 1
    assert "error: training efficient (seed 0) failed with exit code" in capsys.readouterr().err
