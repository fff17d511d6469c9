"""train.py: configuration, data checks, exact resume, DDP equivalence, atomic checkpoints, signals.

Everything runs on CPU with tiny models; the in-process runs take well under a second each."""
import contextlib
import errno
import gc
import importlib.machinery
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import types
import weakref

import numpy as np
import pytest
import torch

import configurator
import runlog
import train as T
from checkpoint import (CHECKPOINT_NAME, CheckpointError, load_checkpoint, load_resume_checkpoint, model_from_checkpoint,
                        save_checkpoint)
from conftest import REPO, TEXT, VARIANTS
from faults import nan_after_step
from model import GPT, GPT2_SHAPES, PRETRAINED_GPT2
from prepare_char import prepare
from runlog import RunLog
from test_data import write_char_data
from tokenizer import read_meta, write_meta

def tiny(tmp_path, data_dir, **overrides):
    config = dict(
        out_dir=str(tmp_path / "out"), data_dir=str(data_dir), device="cpu", compile=False, num_threads=1,
        n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=4, gradient_accumulation_steps=1,
        max_iters=8, eval_interval=4, eval_iters=2, log_interval=1, warmup_iters=2, lr_decay_iters=8,
        learning_rate=1e-3, min_lr=1e-4, beta2=0.99, dropout=0.0, always_save_checkpoint=True,
    )
    config.update(overrides)
    return config


def params(out_dir):
    return load_checkpoint(out_dir)["model"]


def read_log(out_dir):
    """The records of out_dir's log.jsonl, in order."""
    return [json.loads(line) for line in (out_dir / "log.jsonl").read_text().splitlines()]


def subprocess_env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env.pop("RANK", None)
    return env


# -----------------------------------------------------------------------------
# configuration

def test_overrides_parse_as_python_literals():
    config = T.get_config(["--max_iters=10", "--learning_rate=1e-3", "--compile=False", "--attention=efficient",
                           "--out_dir='out-x'", "--dropout=0", "--wandb_run_name=2024"])
    assert config["max_iters"] == 10 and config["learning_rate"] == 1e-3 and config["compile"] is False
    assert config["attention"] == "efficient" and config["out_dir"] == "out-x"
    assert config["dropout"] == 0.0 and isinstance(config["dropout"], float)  # an int is fine for a float
    assert config["wandb_run_name"] == "2024"


@pytest.mark.parametrize("arg, value", [("--peak_flops=989e12", 989e12), ("--peak_flops=312000000000000", 312e12),
                                        ("--peak_flops=auto", "auto")])
def test_peak_flops_takes_a_number_or_auto_from_the_command_line(arg, value):
    assert T.resolve_config(T.get_config([arg, "--device=cpu"]))["peak_flops"] == value


@pytest.mark.parametrize("arg", ["--peak_flops=fast", "--peak_flops=-1e12", "--peak_flops=inf"])
def test_a_bad_peak_flops_is_one_clear_error(arg):
    with pytest.raises(T.ConfigError, match="peak_flops.*must be 'auto' or a positive number"):
        T.resolve_config(T.get_config([arg, "--device=cpu"]))


def test_config_file_then_overrides(tmp_path):
    path = tmp_path / "cfg.py"
    path.write_text("import math\nn_layer = 3\nlearning_rate = 2e-4\n_private = 'ignored'\n")
    config = T.get_config([str(path), "--n_layer=5"])
    assert config["n_layer"] == 5 and config["learning_rate"] == 2e-4


def test_nanogpts_exec_of_configurator_is_refused_not_ignored():
    """A script written for NanoGPT (its bench.py, say) exec's configurator.py to apply the command line to
    its globals; here that would apply nothing, so it stops and says what to call instead."""
    script = "batch_size = 12\nexec(open('configurator.py').read())\nprint('ran with', batch_size)"
    result = subprocess.run([sys.executable, "-c", script, "--batch_size=32"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("error: configurator.py is a module here") and "get_config(sys.argv[1:])" in result.stderr
    assert T.get_config(["--batch_size=32"], defaults={"batch_size": 12, "note": "x"}) == {"batch_size": 32, "note": "x"}


def test_a_config_file_reads_the_config_so_far(tmp_path):
    """As in NanoGPT: a file sees the defaults, earlier files and earlier overrides, so one key can follow
    another; what it leaves alone stays as set before it."""
    base, derived = tmp_path / "base.py", tmp_path / "derived.py"
    base.write_text("learning_rate = 3e-3\nmax_iters = 100\n")
    derived.write_text("min_lr = learning_rate / 10\nlr_decay_iters = max_iters\nwarmup_iters = warmup_iters // 2\n")
    config = T.get_config([str(base), str(derived)])
    assert config["min_lr"] == pytest.approx(3e-4) and config["lr_decay_iters"] == 100
    assert config["warmup_iters"] == T.DEFAULT_CONFIG["warmup_iters"] // 2
    config = T.get_config([str(base), "--max_iters=7", str(derived)])
    assert config["learning_rate"] == 3e-3 and config["min_lr"] == pytest.approx(3e-4) and config["lr_decay_iters"] == 7
    assert T.get_config(["--n_layer=5", str(derived)])["n_layer"] == 5  # not reset by a file that never names it
    assert T.get_config(["--learning_rate=3e-3", str(base)])["learning_rate"] == 3e-3  # set again, to the same


def test_an_override_a_later_config_file_sets_again_is_an_error(tmp_path, capsys):
    """`train.py --out_dir=mine config.py`: the file's out_dir would win, as in NanoGPT, and the run would
    train into (and replace) another run's folder."""
    config = tmp_path / "theirs.py"
    config.write_text("out_dir = 'out-theirs'\nmax_iters = 1000\n")
    assert T.main(["--max_iters=4", "--out_dir=out-mine", str(config)]) == 1
    assert capsys.readouterr().err == (f"error: --out_dir=out-mine comes before {config}, which sets out_dir again "
                                       f"(out_dir = 'out-theirs'), so it would have no effect: give the config files "
                                       f"first, then the --key=value overrides\n")
    assert not (REPO / "out-theirs").exists() and not os.path.exists("out-theirs")


@pytest.mark.parametrize("argv, words", [
    (["--no_such_key=1"], ["no_such_key", "unknown"]),
    (["--max_iters=1.5"], ["max_iters", "int", "float"]),
    (["--compile=1"], ["compile", "bool", "int", "write True or False"]),
    (["--compile=false"], ["compile", "bool", "str", "write True or False"]),
    (["--learning_rate=fast"], ["learning_rate", "float", "str"]),
    (["--batch_size=True"], ["batch_size", "int", "bool"]),
    (["--learning_rate=True"], ["learning_rate", "float", "bool"]),  # not taken for 1.0
])
def test_config_errors_name_key_and_type(argv, words):
    with pytest.raises(T.ConfigError) as err:
        T.get_config(argv)
    for word in words:
        assert word in str(err.value)


def test_config_file_errors(tmp_path):
    unknown = tmp_path / "unknown.py"
    unknown.write_text("n_layers = 4\n")  # a typo of n_layer
    with pytest.raises(T.ConfigError, match="n_layers"):
        T.get_config([str(unknown)])
    wrong = tmp_path / "wrong.py"
    wrong.write_text("eval_iters = '20'\n")
    with pytest.raises(T.ConfigError, match="eval_iters.*int"):
        T.get_config([str(wrong)])
    with pytest.raises(T.ConfigError, match=r"unknown config key 'n_layers' \(a name of the file's own, not a setting, "
                                           r"starts with _\); did you mean 'n_layer'"):
        T.get_config([str(unknown)])
    with pytest.raises(T.ConfigError, match="not found$"):
        T.get_config([str(tmp_path / "missing.py")])
    with pytest.raises(T.ConfigError, match="config file max_iters=5 not found: overrides start with --, as in "
                                           "--max_iters=5$"):
        T.get_config(["max_iters=5"])
    failing = tmp_path / "failing.py"
    failing.write_text("n_layer = 4\nmin_lr = learnin_rate / 10\n")
    with pytest.raises(T.ConfigError, match=r"failing.py, line 2: NameError: name 'learnin_rate' is not defined"):
        T.get_config([str(failing)])
    failing.write_text("n_layer = (4\n")
    with pytest.raises(T.ConfigError, match=r"failing.py, line 1: SyntaxError"):
        T.get_config([str(failing)])
    with pytest.raises(T.ConfigError, match=f"config file {tmp_path} is a folder: name a config file"):
        T.get_config([str(tmp_path)])


def test_a_config_file_missing_from_another_folder_says_where_to_run(tmp_path, monkeypatch, capsys):
    """`cd elsewhere && python /path/to/train.py config/quickstart.py`: the file is the repository's, so
    the error names the folder to run from, as the data error does."""
    monkeypatch.chdir(tmp_path)
    assert T.main(["config/quickstart.py"]) == 1
    assert capsys.readouterr().err == (f"error: config file config/quickstart.py not found in {tmp_path}: run the "
                                       f"command from the repository's folder ({REPO}), where it is\n")
    assert T.main(["config/quikstart.py"]) == 1  # a typo is just not found
    assert capsys.readouterr().err == "error: config file config/quikstart.py not found\n"


def test_a_yaml_style_line_is_an_error_not_a_silent_default(tmp_path):
    """`max_iters: 3` is a Python annotation that sets nothing: the run would take max_iters=600000."""
    config = tmp_path / "config.py"
    config.write_text("batch_size = 2\nlearning_rate: float = 1e-3\nmax_iters: 3\n")
    with pytest.raises(T.ConfigError) as err:
        T.get_config([str(config)])
    assert str(err.value) == (f"config file {config}, line 3: `max_iters: 3` is a type annotation and sets nothing; "
                              f"config files are Python: write `max_iters = 3`")
    config.write_text("batch_size = 2\nlearning_rate: float = 1e-3\n")  # an annotation with a value sets it
    assert T.get_config([str(config)])["learning_rate"] == 1e-3


def test_train_dict_is_checked_too(tmp_path, data_dir):
    with pytest.raises(T.ConfigError, match="n_layerz"):
        T.train(tiny(tmp_path, data_dir, n_layerz=2))
    with pytest.raises(T.ConfigError, match="attention"):
        T.train(tiny(tmp_path, data_dir, attention="linear"))
    with pytest.raises(T.ConfigError, match="init_from"):
        T.train(tiny(tmp_path, data_dir, init_from="gpt3"))


def test_main_prints_clear_error(tmp_path, capsys):
    assert T.main(["--max_iters=ten"]) == 1
    assert "max_iters" in capsys.readouterr().err


def test_a_bad_value_from_a_config_file_names_the_file(tmp_path, capsys):
    """The resolved config's checks see values, not where they came from: main names the file that set
    each key the error names, and not a key the command line set."""
    config = tmp_path / "mine.py"
    config.write_text("attention = 'efficent'\nn_embd = 100\nn_head = 3\n")
    assert T.main([str(config), "--n_embd=96", "--device=cpu"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: unknown attention='efficent'; choose one of standard, optimized, efficient, super")
    assert err.endswith(f"(attention set in {config})\n")  # n_embd and n_head are not named: n_embd=96 is fine
    assert T.main([str(config), "--attention=efficient", "--device=cpu"]) == 1
    assert capsys.readouterr().err.endswith(f"pick n_head among the divisors of n_embd (n_head, n_embd set in {config})\n")
    assert T.main([str(config), "--attention=efficient", "--n_embd=100", "--n_head=3", "--device=cpu"]) == 1
    assert capsys.readouterr().err.endswith("pick n_head among the divisors of n_embd\n")  # both set on the command line


def test_every_shipped_config_parses():
    for path in sorted((REPO / "config").glob("*.py")):
        config = T.resolve_config(T.get_config([str(path)]))
        assert config["attention"] in ("standard", "efficient")  # the 1.1B Llama-style config is the paper's efficient
        # grouped-query attention is standard's alone, as are OpenAI's weights
        if config["n_kv_head"] in (0, config["n_head"]) and config["init_from"] not in PRETRAINED_GPT2:
            T.resolve_config(T.get_config([str(path), "--attention=super"]))


def test_paper_config_is_the_paper_setting():
    c = T.get_config([str(REPO / "config" / "train_paper_lm.py")])
    assert c["block_size"] == 1024 and c["batch_size"] == 5 and c["batch_size"] * c["gradient_accumulation_steps"] == 500


def test_lr_schedule_warmup_then_cosine():
    c = T.resolve_config(dict(learning_rate=1e-3, min_lr=1e-4, warmup_iters=100, lr_decay_iters=2000))
    assert T.get_lr(0, c) == pytest.approx(1e-3 / 101)
    assert T.get_lr(100, c) == pytest.approx(1e-3)
    assert T.get_lr(1050, c) == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert T.get_lr(2000, c) == pytest.approx(1e-4)
    assert T.get_lr(5000, c) == pytest.approx(1e-4)
    # warmup_iters steps rise to the peak, which iteration warmup_iters takes; the cosine then falls at
    # every step until lr_decay_iters, the first iteration at min_lr
    rates = [T.get_lr(it, c) for it in range(2001)]
    assert all(a < b for a, b in zip(rates[:100], rates[1:101]))
    assert rates[99] == pytest.approx(1e-3 * 100 / 101) and rates[100] == 1e-3
    assert all(a > b for a, b in zip(rates[100:2000], rates[101:2001]))
    assert rates[1999] == pytest.approx(1e-4 + 0.5 * (1 + math.cos(math.pi * 1899 / 1900)) * 9e-4, rel=1e-12)


def test_init_from_gpt2_with_other_attention_is_a_clear_error(tmp_path, data_dir):
    with pytest.raises(T.ConfigError, match="standard attention only"):
        T.train(tiny(tmp_path, data_dir, init_from="gpt2", attention="efficient"))


@pytest.mark.parametrize("override, words", [
    ({"beta2": 1.5}, ["'beta2'=1.5", "[0, 1)"]),
    ({"beta2": 1.0}, ["'beta2'=1.0", "[0, 1)"]),
    ({"eval_interval": 0}, ["'eval_interval'=0", "at least 1"]),
    ({"beta1": -0.1}, ["'beta1'=-0.1", "[0, 1)"]),
    ({"hellaswag_batch_size": 0}, ["'hellaswag_batch_size'=0", "at least 1"]),
    ({"seed": 2**64 - 1}, [f"'seed'={2**64 - 1}", "[0, 2**63)"]),
    ({"out_dir": ""}, ["'out_dir'=''", "name a folder"]),
    ({"backend": "nccl", "device": "cpu"}, ["'backend'='nccl'", "CUDA GPUs only", "'gloo'"]),
    ({"init_from": "gpt2", "block_size": 2048}, ["block_size=2048", "context of 1024 tokens"]),
    ({"min_lr": 1e-2}, ["'min_lr'=0.01", "exceeds learning_rate=0.001", "learning_rate / 10"]),
    ({"lr_decay_iters": 2}, ["'lr_decay_iters'=2", "must exceed warmup_iters=2"]),  # the cosine would divide by 0
    ({"grad_clip": math.inf}, ["'grad_clip'=inf", "finite"]),  # --grad_clip=1e999 reads as inf
])
def test_values_torch_would_refuse_later_are_refused_before_training(override, words, tmp_path, data_dir):
    with pytest.raises(T.ConfigError) as err:
        T.train(tiny(tmp_path, data_dir, **override))
    for word in words:
        assert word in str(err.value)
    assert not (tmp_path / "out").exists()


def test_a_constant_learning_rate_may_be_below_min_lr():
    """min_lr is where the cosine ends: with decay_lr=False there is none, and the default min_lr stays."""
    c = configurator.resolve_config(configurator.get_config(["--decay_lr=False", "--learning_rate=1e-5"]))
    assert c["min_lr"] > c["learning_rate"]


def test_wandb_log_without_wandb_installed_is_a_config_error(tmp_path, data_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what find_spec sees where it is not installed
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *args: None)
    with pytest.raises(T.ConfigError, match="wandb is not installed: pip install wandb"):
        T.train(tiny(tmp_path, data_dir, wandb_log=True))


@pytest.mark.parametrize("make", ["file", "file above", "read-only parent"])
def test_an_out_dir_that_cannot_be_a_folder_is_one_error_line(make, tmp_path, data_dir, capsys):
    in_the_way = tmp_path / "README.md"
    if make == "read-only parent":
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only folders")
        (tmp_path / "locked").mkdir(mode=0o500)
        out_dir, reason = tmp_path / "locked" / "out", "Permission denied: "
    else:
        in_the_way.write_text("not a folder\n")
        out_dir = in_the_way if make == "file" else in_the_way / "out"
        reason = f"{in_the_way} is a file, not a folder"
    assert T.main([f"--{k}={v!r}" for k, v in tiny(tmp_path, data_dir, out_dir=str(out_dir)).items()]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: out_dir {out_dir} cannot be used as a folder for the run: {reason}")
    assert err.count("\n") == 1 and (make == "read-only parent" or err.endswith(f"{reason}\n"))


# -----------------------------------------------------------------------------
# data errors, all before any training starts

@pytest.mark.parametrize("case, match", [
    ("missing_dir", "not found"),
    ("missing_val", "val.bin not found"),
    ("empty_train", "train.bin is empty"),
    ("too_short", "fewer than block_size \\+ 1 = 17"),
    ("no_meta", "meta.json not found"),
    ("vocab_too_small", "vocab_size=10 is too small.*largest token id is 39"),
    ("meta_disagrees", "token id 39.*vocab_size=20"),
])
def test_bad_data_stops_before_training_with_the_reason(tmp_path, case, match):
    d = tmp_path / "data"
    ids = np.arange(200) % 40
    overrides = {}
    if case != "missing_dir":
        write_char_data(d, ids, ids)
    if case == "missing_val":
        (d / "val.bin").unlink()
    elif case == "empty_train":
        (d / "train.bin").write_bytes(b"")
    elif case == "too_short":
        np.arange(16, dtype=np.uint16).tofile(d / "val.bin")
    elif case == "no_meta":
        (d / "meta.json").unlink()
    elif case == "vocab_too_small":
        overrides["vocab_size"] = 10
    elif case == "meta_disagrees":
        meta = json.loads((d / "meta.json").read_text())
        meta.update(vocab_size=20, chars=meta["chars"][:20])
        (d / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(T.DataError, match=match):
        T.train(tiny(tmp_path, d, **overrides))
    assert not (tmp_path / "out").exists()  # nothing ran


@pytest.mark.parametrize("data_dir, command", [
    ("data/openwebtext", "python prepare_openwebtext.py"),
    ("data/c4", "python prepare_openwebtext.py --dataset=c4"),
    ("data/stdlib_char", "python prepare_char.py --corpus=stdlib"),
    ("data/shakespeare", "python prepare_openwebtext.py --dataset=path/to/tinyshakespeare.txt --out_dir=data/shakespeare "
                         "--val_fraction=0.1"),  # GPT-2 BPE, for config/finetune_shakespeare.py
    ("/scratch/shakespeare_char", "python prepare_char.py --out_dir=/scratch/shakespeare_char "
                                  "--input=path/to/tinyshakespeare.txt, or python prepare_char.py "
                                  "--out_dir=/scratch/shakespeare_char (downloads it)"),
    ("/scratch/mine", "with --out_dir=/scratch/mine: python prepare_char.py for characters, "
                      "python prepare_openwebtext.py for GPT-2 BPE"),
])
def test_a_missing_dataset_names_the_command_that_makes_it(data_dir, command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the checkout, where a user may have made data/stdlib_char already
    with pytest.raises(T.DataError) as err:
        T.check_data(data_dir, block_size=8)
    where = "" if data_dir.startswith("/") else f" (in {tmp_path}: data paths are relative to the current folder)"
    assert str(err.value).startswith(f"data folder {data_dir} not found{where}: prepare the dataset first")
    assert command in str(err.value)


def test_a_dataset_given_as_its_path_under_data_says_to_name_it(tmp_path, data_dir, monkeypatch, capsys):
    """`--dataset=data/shakespeare_char` would read data/data/shakespeare_char, and the error said to prepare
    that folder: the dataset is there already, under its name."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "shakespeare_char").symlink_to(data_dir)
    monkeypatch.chdir(tmp_path)
    config = {k: v for k, v in tiny(tmp_path, data_dir).items() if k != "data_dir"}
    assert T.main([*(f"--{k}={v!r}" for k, v in config.items()), "--dataset=data/shakespeare_char"]) == 1
    assert capsys.readouterr().err == (
        "error: config key 'dataset'='data/shakespeare_char': a dataset is the name of a folder under data/, so this "
        "reads data/data/shakespeare_char, which does not exist: write --dataset=shakespeare_char (or give a path "
        "as --data_dir=data/shakespeare_char)\n")
    assert T.train(config | {"dataset": "shakespeare_char", "max_iters": 1}, verbose=False)["iterations"] == 1


def test_a_resume_on_as_many_other_characters_is_refused(tmp_path, data_dir, capsys):
    """The vocabulary sizes agree, so the weights load; but each id would stand for another character."""
    T.train(tiny(tmp_path, data_dir, max_iters=2), verbose=False)
    other = tmp_path / "other"
    prepare(TEXT.replace("e", "\u00e9"), other, "other text")  # one character swapped for one not in TEXT
    assert read_meta(other)["vocab_size"] == read_meta(data_dir)["vocab_size"]
    before = (tmp_path / "out" / CHECKPOINT_NAME).read_bytes()
    cfg = tiny(tmp_path, other, max_iters=4, init_from="resume")
    assert T.main([f"--{k}={v!r}" for k, v in cfg.items()]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot resume from {tmp_path / 'out' / CHECKPOINT_NAME}: its ") and err.count("\n") == 1
    assert "characters and the" in err and f"of {other} differ from id " in err and "Resume on the data" in err
    assert (tmp_path / "out" / CHECKPOINT_NAME).read_bytes() == before


def test_a_resume_on_data_prepared_again_from_other_text_blames_the_data(tmp_path, data_dir, capsys):
    """Other text has another vocabulary, so the model args differ too: the data is the cause to name."""
    T.train(tiny(tmp_path, data_dir, max_iters=2), verbose=False)
    other = tmp_path / "other"
    prepare(TEXT + "0123456789", other, "other text")
    cfg = tiny(tmp_path, other, max_iters=4, init_from="resume")
    assert T.main([f"--{k}={v!r}" for k, v in cfg.items()]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot resume from {tmp_path / 'out' / CHECKPOINT_NAME}: its ")
    assert f"characters and the {read_meta(other)['vocab_size']} of {other} differ from id " in err and "vocab" not in err


def swap_first_two_chars(meta):
    chars = meta["chars"]
    meta["chars"] = chars[1] + chars[0] + chars[2:]


def gpt2_label_on_char_data(meta):
    meta.update(tokenizer="gpt2", vocab_size=50257)
    del meta["chars"]


def miscount_val_tokens(meta):
    meta["tokens"]["val"] += 7


@pytest.mark.parametrize("edit, match", [
    (swap_first_two_chars, 'the "chars" of .*meta.json do not spell the text'),
    (gpt2_label_on_char_data, "says the GPT-2 BPE made this data.*looks like character-level data"),
    (miscount_val_tokens, "val.bin holds 300 tokens, but .*meta.json says 307"),
])
def test_a_meta_json_that_does_not_describe_the_data_stops_before_training(tmp_path, edit, match, capsys):
    d = tmp_path / "data"
    prepare(TEXT[:3000], d, "test text")
    meta = json.loads((d / "meta.json").read_text())
    edit(meta)
    (d / "meta.json").write_text(json.dumps(meta))
    cfg = tiny(tmp_path, d)
    assert T.main([f"--{k}={v!r}" for k, v in cfg.items()]) == 1
    err = capsys.readouterr().err
    assert re.search(match, err) and err.startswith("error: ") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()  # nothing ran


def test_resume_with_other_model_args_is_a_clear_error(tmp_path, data_dir):
    T.train(tiny(tmp_path, data_dir, max_iters=4))
    before = (tmp_path / "out" / CHECKPOINT_NAME).read_bytes()
    with pytest.raises(CheckpointError, match="n_layer: checkpoint 2, requested 3"):
        T.train(tiny(tmp_path, data_dir, init_from="resume", n_layer=3))
    with pytest.raises(CheckpointError, match="attention: checkpoint 'standard', requested 'super'"):
        T.train(tiny(tmp_path, data_dir, init_from="resume", attention="super"))
    assert (tmp_path / "out" / CHECKPOINT_NAME).read_bytes() == before


def test_a_checkpoint_without_optimizer_state_is_not_a_resume_point(tmp_path, data_dir):
    """Weights alone (what a user who stripped the optimizer to share a checkpoint keeps) sample, but a
    resume would restart AdamW's moments from zero: not the run it claims to continue."""
    T.train(tiny(tmp_path, data_dir, max_iters=2), verbose=False)
    path = tmp_path / "out" / CHECKPOINT_NAME
    ckpt = torch.load(path, weights_only=True)
    del ckpt["optimizer"]
    save_checkpoint(ckpt, path)
    with pytest.raises(CheckpointError, match="it has no 'optimizer', so it is not a training checkpoint"):
        T.train(tiny(tmp_path, data_dir, max_iters=4, init_from="resume"), verbose=False)


def test_a_resume_may_change_dropout_and_frees_the_loaded_checkpoint(tmp_path, data_dir, monkeypatch):
    """As in NanoGPT, dropout is the resume's own (no weight depends on it); the checkpoint it loaded
    (a copy of the weights and AdamW's moments) is not held while the run trains."""
    T.train(tiny(tmp_path, data_dir, max_iters=2, dropout=0.0), verbose=False)
    loaded, train_loop = [], T.train_loop

    def load_and_watch(*args, **kwargs):
        checkpoint = load_resume_checkpoint(*args, **kwargs)
        loaded.append(weakref.ref(checkpoint["model"]["lm_head.weight"]))
        return checkpoint

    def loop_and_check(run, *args):
        gc.collect()
        assert loaded[0]() is None, "the loaded checkpoint is still referenced during training"
        assert all(block.attn.dropout == 0.1 for block in run.raw_model.transformer.h)
        return train_loop(run, *args)

    monkeypatch.setattr(T, "load_resume_checkpoint", load_and_watch)
    monkeypatch.setattr(T, "train_loop", loop_and_check)
    summary = T.train(tiny(tmp_path, data_dir, init_from="resume", max_iters=4, dropout=0.1), verbose=False)
    assert summary["iterations"] == 4 and summary["model_args"]["dropout"] == 0.1 and loaded


def test_resume_without_checkpoint(tmp_path, data_dir):
    with pytest.raises(CheckpointError, match="no checkpoint"):
        T.train(tiny(tmp_path, data_dir, init_from="resume"))


def test_resume_with_weights_that_do_not_fit_is_an_error_line(tmp_path, data_dir, capsys):
    cfg = tiny(tmp_path, data_dir, max_iters=2)
    T.train(cfg, verbose=False)
    path = tmp_path / "out" / CHECKPOINT_NAME
    ckpt = torch.load(path, weights_only=True)
    del ckpt["model"]["lm_head.weight"]
    save_checkpoint(ckpt, path)
    assert T.main([f"--{k}={v!r}" for k, v in {**cfg, "init_from": "resume", "max_iters": 4}.items()]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert "missing: lm_head.weight" in err and str(path) in err


def test_resume_without_the_config_names_the_overrides_the_checkpoint_was_trained_with(tmp_path, data_dir, capsys):
    cfg = tiny(tmp_path, data_dir, max_iters=4, n_layer=1)
    T.train(cfg, verbose=False)
    # what a newcomer types: out_dir and init_from only, so the defaults' dataset and model
    assert T.main([f"--out_dir={cfg['out_dir']}", "--init_from=resume", "--device=cpu"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "data/openwebtext not found (in " in err and "prepare the dataset first: python prepare_openwebtext.py." in err
    assert "was trained with another config" in err
    assert f"--data_dir={str(data_dir)!r}" in err and "--n_layer=1" in err and "--n_embd=32" in err


@pytest.mark.parametrize("best_is_last", [True, False])
def test_resuming_a_finished_run_says_there_is_nothing_to_train_and_changes_nothing(tmp_path, data_dir, capsys,
                                                                                    monkeypatch, best_is_last):
    """Also where always_save_checkpoint=False kept an earlier, better checkpoint than the last iteration's."""
    cfg = tiny(tmp_path, data_dir, max_iters=8, eval_interval=4, always_save_checkpoint=False)
    val_losses = iter([3.0, 2.0, 1.0 if best_is_last else 2.5])  # at iterations 0, 4, 8
    monkeypatch.setattr(T, "estimate_loss", lambda run: {"train": 3.0, "val": next(val_losses)})
    T.train(cfg, verbose=False)
    monkeypatch.undo()
    out = tmp_path / "out"
    assert load_checkpoint(out)["iter_num"] == (8 if best_is_last else 4)
    before = {name: (out / name).read_bytes() for name in (CHECKPOINT_NAME, "summary.json", "log.jsonl")}
    summary = T.train({**cfg, "init_from": "resume"})
    assert "nothing to train: the run in" in capsys.readouterr().out
    assert summary["iterations"] == 8 and summary["final_val_loss"] is not None
    assert {name: (out / name).read_bytes() for name in before} == before
    (out / "summary.json").write_text(json.dumps({**summary, "run_id": "another run's"}))
    if not best_is_last:  # a summary that is not the checkpoint's own says nothing of it: train on from 4
        assert T.train({**cfg, "init_from": "resume"}, verbose=False)["iterations_this_run"] == 4


@pytest.mark.parametrize("init_from", ["resume", "scratch"])
def test_eval_only_reports_the_losses_and_leaves_the_out_dir_as_it_was(init_from, tmp_path, data_dir, capsys):
    cfg = tiny(tmp_path, data_dir, max_iters=4)
    trained = T.train(cfg, verbose=False)
    out = tmp_path / "out"
    before = {name: (out / name).read_bytes() for name in (CHECKPOINT_NAME, "summary.json", "log.jsonl")}
    summary = T.train({**cfg, "init_from": init_from, "eval_only": True})
    assert {name: (out / name).read_bytes() for name in before} == before
    assert summary["stop_reason"] == "eval_only" and summary["iterations_this_run"] == 0
    if init_from == "scratch":  # nothing was ever saved, so there is no best to report
        assert summary["best_val_loss"] is None
    if init_from == "resume":  # the checkpoint's weights, evaluated on the same batches as at its end
        assert summary["final_val_loss"] == pytest.approx(trained["final_val_loss"], rel=1e-6)
        assert "step 4: train loss" in capsys.readouterr().out


def test_each_split_is_evaluated_on_its_own_file(tmp_path):
    """The val loss is the loss on val.bin, the train loss that on train.bin: with the two files swapped,
    the same model (the same seed) reports the same two losses the other way round."""
    rng = np.random.default_rng(0)
    train_ids, val_ids = rng.integers(0, 40, 600), np.arange(300) % 7
    losses = {}
    for name, (a, b) in {"as_is": (train_ids, val_ids), "swapped": (val_ids, train_ids)}.items():
        data = write_char_data(tmp_path / name, a, b, vocab_size=40)
        summary = T.train(tiny(tmp_path / name, data, eval_only=True, eval_iters=4), verbose=False)
        losses[name] = summary["final_train_loss"], summary["final_val_loss"]
    assert losses["as_is"][0] != pytest.approx(losses["as_is"][1], rel=1e-3)  # the files do differ
    assert losses["swapped"] == pytest.approx(losses["as_is"][::-1], rel=1e-6)


def gpt2_data(tmp_path):
    """Random token ids labelled as GPT-2 BPE data, which init_from='gpt2' asks for."""
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 4000), ("val", 1000)):
        rng.integers(0, 50257, n).astype(np.uint16).tofile(data / f"{split}.bin")
    write_meta(data, {"tokenizer": "gpt2", "vocab_size": 50257, "tokens": {"train": 4000, "val": 1000}})
    return data


def test_gpt2_weights_out_of_reach_are_one_error_line(tmp_path, monkeypatch, capsys):
    transformers = pytest.importorskip("transformers", reason="init_from='gpt2' needs transformers")

    def offline(cls, name):  # what the hub raises with no network and no cached copy
        raise OSError(f"We couldn't connect to 'https://huggingface.co' to load the files of {name}")
    monkeypatch.setattr(transformers.GPT2LMHeadModel, "from_pretrained", classmethod(offline))
    cfg = tiny(tmp_path, gpt2_data(tmp_path), init_from="gpt2") | {"n_layer": 12, "n_head": 12, "n_embd": 768}
    assert T.main([f"--{k}={v!r}" for k, v in cfg.items()]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: could not load 'gpt2' weights: they download from the Hugging Face hub")
    assert "HF_HUB_OFFLINE=1 skips the hub's retries" in err and "couldn't connect" in err
    assert not list((tmp_path / "out").glob("*.pt"))


@pytest.fixture
def small_gpt2(monkeypatch):
    """A small random GPT-2 (2 layers, 2 heads, 32 wide) stands in for the download of init_from='gpt2'."""
    transformers = pytest.importorskip("transformers", reason="init_from='gpt2' needs transformers")
    torch.manual_seed(0)
    hf_model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_positions=32, n_embd=32, n_layer=2, n_head=2))
    monkeypatch.setattr(transformers.GPT2LMHeadModel, "from_pretrained", classmethod(lambda cls, name: hf_model))
    monkeypatch.setitem(GPT2_SHAPES, "gpt2", (2, 2, 32))  # the shape the config is checked against


def test_a_run_fine_tuned_from_gpt2_resumes_with_its_own_config(tmp_path, small_gpt2):
    """init_from='gpt2' takes the model's shape from OpenAI's weights, not from the config, so the same
    command with init_from='resume' must resume it."""
    cfg = tiny(tmp_path, gpt2_data(tmp_path), init_from="gpt2", bias=False, max_iters=2, eval_interval=2,
               warmup_iters=0, lr_decay_iters=4)  # bias and vocab_size as the defaults leave them: GPT-2's differ
    T.train(cfg, verbose=False)
    summary = T.train({**cfg, "init_from": "resume", "max_iters": 4}, verbose=False)
    assert summary["iterations"] == 4 and summary["iterations_this_run"] == 2
    assert summary["model_args"]["vocab_size"] == 50257 and summary["model_args"]["gelu_approximate"] == "tanh"
    with pytest.raises(CheckpointError, match="attention: checkpoint 'standard', requested 'efficient'"):
        T.train({**cfg, "init_from": "resume", "max_iters": 6, "attention": "efficient"}, verbose=False)


def test_the_fine_tuning_config_trains_gpt2_at_a_constant_rate_and_keeps_the_best_checkpoint(tmp_path, small_gpt2):
    config = [str(REPO / "config" / "finetune_shakespeare.py"), "--init_from='gpt2'", "--max_iters=6",
              "--eval_interval=2", "--eval_iters=2", "--gradient_accumulation_steps=2", "--block_size=32",
              f"--data_dir='{gpt2_data(tmp_path)}'", f"--out_dir='{tmp_path / 'out'}'", "--device='cpu'",
              "--compile=False"]
    summary = T.train(T.get_config(config), verbose=False)
    assert summary["iterations"] == 6 and summary["model_args"]["attention"] == "standard"
    records = read_log(tmp_path / "out")
    assert {r["lr"] for r in records if r["type"] == "train"} == {3e-5}
    # the pretrained weights' evaluation (iteration 0) is not saved; after it, the best evaluation is kept
    val = {r["iter"]: r["val_loss"] for r in records if r["type"] == "eval" and r["iter"] > 0}
    checkpoint = load_checkpoint(tmp_path / "out")
    assert (checkpoint["iter_num"], checkpoint["best_val_loss"]) == min(val.items(), key=lambda item: item[1])


def test_model_keys_gpt2_weights_would_ignore_are_refused(tmp_path, small_gpt2):
    """A config asking for RoPE or another width, fine-tuned from GPT-2, would train GPT-2's own shape:
    each key that differs from both the default and the weights is named, with the weights' value."""
    cfg = tiny(tmp_path, gpt2_data(tmp_path), init_from="gpt2", max_iters=2, warmup_iters=0, lr_decay_iters=4,
               n_embd=64, pos="rope")
    with pytest.raises(T.ConfigError) as err:
        T.train(cfg, verbose=False)
    assert str(err.value).startswith("init_from='gpt2' takes the model's shape from its weights, which have "
                                     "n_embd=32, pos='learned', not n_embd=64, pos='rope': drop those keys")
    assert not list((tmp_path / "out").glob("*.pt"))
    # the same model said otherwise is no conflict: 2 key/value heads of 2, GELU's 4 * n_embd hidden width
    T.train({**cfg, "n_embd": 32, "pos": "learned", "n_kv_head": 2, "intermediate_size": 128}, verbose=False)


def test_gpt2_shape_conflicts_are_found_before_the_weights_download():
    with pytest.raises(T.ConfigError, match=r"which have n_embd=1600, not n_embd=1200: drop those keys"):
        T.resolve_config({"init_from": "gpt2-xl", "n_embd": 1200, "device": "cpu"})  # no transformers, no hub
    T.resolve_config({"init_from": "gpt2-medium", "n_layer": 24, "n_head": 16, "n_embd": 1024, "device": "cpu"})


def test_device_cuda_without_a_gpu_is_one_error_line(tmp_path, data_dir, capsys):
    assert T.main([f"--{k}={v!r}" for k, v in tiny(tmp_path, data_dir, device="cuda").items()]) == 1
    err = capsys.readouterr().err
    assert err == "error: device='cuda': CUDA is not available here; use device='cpu' (or 'auto')\n"
    assert not (tmp_path / "out").exists()


def test_help_shows_each_key_with_its_meaning_and_choices(capsys):
    assert T.main(["--help"]) == 0
    out = capsys.readouterr().out
    for key, choices in (("norm", "layernorm | rmsnorm"), ("pos", "learned | rope"), ("mlp", "gelu | swiglu"),
                         ("parallelism", "ddp | fsdp"), ("attention", "standard | optimized | efficient | super")):
        line, meaning = out.split(f"\n  --{key}=", 1)[1].split("\n")[:2]
        assert meaning.strip() and f"[{choices}" in meaning  # attention: then any variant model.py registered
    assert "python train.py config/train_shakespeare_char_cpu.py" in out  # the CPU example is a CPU-sized config


def test_help_into_a_closed_pipe_is_quiet():
    """`python train.py --help | head -1`: head may exit before the help is written, which is no error."""
    child = subprocess.Popen([sys.executable, str(REPO / "train.py"), "--help"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    child.stdout.close()  # before the child has imported torch, so its first write finds no reader
    assert child.wait(timeout=120) == 141 and child.stderr.read() == b""  # as a Unix tool a closed pipe ends
    child.stderr.close()


def test_training_into_a_closed_pipe_saves_stops_and_resumes(tmp_path, data_dir):
    """`python train.py ... | head`: the reader's exit stops the run as a SIGTERM does, at its next step and
    with a checkpoint, and as quietly as the other scripts (status 141), not with an error that drops the
    iterations since the last save."""
    config = tiny(tmp_path, data_dir, max_iters=100_000, lr_decay_iters=100_000, eval_interval=100_000)
    child = subprocess.Popen([sys.executable, str(REPO / "train.py"), *(f"--{k}={v!r}" for k, v in config.items())],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env(), text=True)
    for line in child.stdout:
        if line.startswith("iter 3:"):
            break
    else:
        pytest.fail(f"train.py ended before its third iteration: {child.stderr.read()}")
    child.stdout.close()  # the next line train.py writes finds no reader
    assert child.wait(timeout=120) == 141 and child.stderr.read() == ""
    child.stderr.close()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["stop_reason"] == "closed stdout" and summary["iterations"] >= 3
    assert load_checkpoint(tmp_path / "out")["iter_num"] == summary["iterations"]
    resumed = T.train(config | {"init_from": "resume", "max_iters": summary["iterations"] + 2}, verbose=False)
    assert resumed["stop_reason"] == "max_iters" and resumed["iterations"] == summary["iterations"] + 2


@contextlib.contextmanager
def held_out_dir(out_dir):
    """out_dir's lock, held by another process (a live run, as far as the lock shows) until the block ends."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); "
                               "from checkpoint import lock_out_dir; held = lock_out_dir(sys.argv[2]); print('held', flush=True); "
                               "time.sleep(60)", str(REPO), str(out_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_a_second_run_on_a_live_out_dir_stops_with_the_holders_pid(tmp_path, data_dir, capsys):
    from checkpoint import lock_out_dir

    with held_out_dir(tmp_path / "out") as pid:
        assert T.main([f"--{k}={v!r}" for k, v in tiny(tmp_path, data_dir).items()]) == 1
        out, err = capsys.readouterr()
        assert err == (f"error: {tmp_path / 'out'} is in use by another training run (PID {pid}): wait for it "
                       f"to finish or stop it, or choose another out_dir\n")
        assert out == ""  # not this run's config and notes first, as if it were starting
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["train.lock"]
    lock_out_dir(tmp_path / "out").close()  # the kernel released the dead holder's lock


def test_a_resume_of_a_live_run_before_its_first_checkpoint_names_the_run_not_a_missing_file(tmp_path, data_dir,
                                                                                             capsys):
    resume = [f"--{k}={v!r}" for k, v in tiny(tmp_path, data_dir, init_from="resume").items()]
    with held_out_dir(tmp_path / "out") as pid:
        assert T.main(resume) == 1
        assert f"is in use by another training run (PID {pid})" in capsys.readouterr().err
    assert T.main(resume) == 1
    assert "no checkpoint" in capsys.readouterr().err.lower()  # no live run: the file really is missing


def test_cpu_threads_follow_the_cores_other_processes_leave_free(monkeypatch):
    from runtime import CpuThreads

    current = [4]  # torch's default on a 4-core machine
    monkeypatch.setattr(torch, "get_num_threads", lambda: current[-1])
    monkeypatch.setattr(torch, "set_num_threads", current.append)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    monkeypatch.setattr(CpuThreads, "_reading", staticmethod(lambda: (0.0, 0.0, 0.0)))
    threads = CpuThreads(num_threads=0, device="cpu", interval=0.0)
    assert threads.adaptive and current == [4]  # no time passed: no reading of the load yet
    for others, expected in ((1.0, 3), (2.6, 1), (3.9, 1), (0.4, 4), (0.0, 4)):
        # a reading is (wall s, busy CPU-s of the whole machine, this process's CPU-s): over one
        # second this process used one CPU-second and the other processes `others`
        threads.mark = (0.0, 0.0, 0.0)
        monkeypatch.setattr(CpuThreads, "_reading", staticmethod(lambda: (1.0, 1.0 + others, 1.0)))
        threads.adjust()
        assert current[-1] == expected
    assert current == [4, 3, 1, 4]  # torch is told only when the count changes
    monkeypatch.setattr(os, "cpu_count", lambda: 8)  # more logical cores than torch's default uses
    threads.mark = (0.0, 0.0, 0.0)
    threads.adjust()  # an idle machine: still torch's default at most
    assert current[-1] == 4
    CpuThreads(num_threads=2, device="cpu")
    assert current[-1] == 2


# -----------------------------------------------------------------------------
# a run and what it writes

def test_run_writes_checkpoint_log_and_summary(tmp_path, data_dir):
    summary = T.train(tiny(tmp_path, data_dir, attention="efficient", max_iters=6, eval_interval=4), verbose=False)
    out = tmp_path / "out"
    ckpt = torch.load(out / CHECKPOINT_NAME, weights_only=True)
    assert set(ckpt) >= {"model_args", "model", "optimizer", "iter_num", "best_val_loss", "config", "rng", "meta"}
    assert ckpt["model_args"]["attention"] == "efficient" and ckpt["iter_num"] == 6
    assert ckpt["config"]["max_iters"] == 6 and ckpt["meta"]["tokenizer"] == "char"
    assert not any(k.startswith("_orig_mod.") for k in ckpt["model"])

    records = read_log(out)
    train_records = [r for r in records if r["type"] == "train"]
    evals = [r for r in records if r["type"] == "eval"]
    assert [r["iter"] for r in train_records] == [1, 2, 3, 4, 5, 6]
    assert set(train_records[0]) == {"type", "iter", "loss", "lr", "ms_per_iter", "tokens_per_s", "mfu", "elapsed_s"}
    assert [r["iter"] for r in evals] == [0, 4, 6]  # every eval_interval, and at the end
    assert set(evals[0]) == {"type", "iter", "train_loss", "val_loss", "elapsed_s"}

    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    assert set(summary) == {
        "run_id", "attention", "model_args", "n_params", "n_params_non_embedding", "attention_params",
        "flops_per_token", "final_train_loss", "final_val_loss", "final_losses_iter", "best_val_loss", "iterations",
        "iterations_this_run", "stop_reason", "mean_ms_per_iter", "tokens_per_s", "tokens_per_iter",
        "peak_memory_bytes", "wall_time_s", "wall_time_this_run_s", "device", "dtype", "world_size", "setups",
        "compile", "num_threads", "out_dir", "dataset"}
    assert summary["out_dir"] == str(out) and summary["dataset"] == str(data_dir)
    model = GPT(T.GPTConfig(**ckpt["model_args"]))
    assert summary["n_params"] == model.get_num_params(non_embedding=False)
    assert summary["attention_params"] == model.get_num_attention_params()
    assert summary["flops_per_token"] == model.flops_per_token()
    assert summary["final_val_loss"] == evals[-1]["val_loss"] and summary["iterations"] == 6
    assert summary["final_train_loss"] == evals[-1]["train_loss"] and summary["final_losses_iter"] == 6
    assert summary["best_val_loss"] == min(r["val_loss"] for r in evals)
    for key in ("mean_ms_per_iter", "tokens_per_s", "peak_memory_bytes", "wall_time_s", "final_train_loss"):
        assert summary[key] > 0
    after_the_first = [r["ms_per_iter"] for r in train_records[1:]]  # the first pays for warm-up or compile
    assert summary["mean_ms_per_iter"] == pytest.approx(sum(after_the_first) / len(after_the_first), rel=1e-9)


def test_a_train_record_times_every_step_since_the_last_but_the_runs_first(tmp_path, data_dir):
    """With log_interval=3 the records at iterations 3 and 6 time steps 2-3 and 4-6 (the first step pays for
    warm-up or compile), so the summary's mean over steps 2-6 is their step-weighted mean."""
    summary = T.train(tiny(tmp_path, data_dir, max_iters=6, log_interval=3, eval_interval=100), verbose=False)
    first, second = [r["ms_per_iter"] for r in read_log(tmp_path / "out") if r["type"] == "train"]
    assert summary["mean_ms_per_iter"] == pytest.approx((2 * first + 3 * second) / 5, rel=1e-9)


def test_a_run_of_one_step_is_timed_by_that_step(tmp_path, data_dir):
    """Its first step, which pays for warm-up or compile, is all there is: the summary's speed is its train
    record's, not none."""
    summary = T.train(tiny(tmp_path, data_dir, max_iters=1), verbose=False)
    [record] = [r for r in read_log(tmp_path / "out") if r["type"] == "train"]
    assert summary["mean_ms_per_iter"] == pytest.approx(record["ms_per_iter"], rel=1e-9)
    assert summary["tokens_per_s"] == pytest.approx(record["tokens_per_s"], rel=1e-9)


def test_a_train_record_logs_the_loss_of_its_own_step(tmp_path, data_dir):
    """The losses of the steps since the last record are read back together: the record at iteration 3 of
    log_interval=3 logs step 3's, as a run that logs every step does there."""
    losses = {}
    for log_interval in (1, 3):
        out = tmp_path / str(log_interval)
        T.train(tiny(out, data_dir, max_iters=6, log_interval=log_interval, eval_interval=100), verbose=False)
        losses[log_interval] = {r["iter"]: r["loss"] for r in read_log(out / "out") if r["type"] == "train"}
    assert list(losses[3]) == [3, 6] and len(set(losses[1].values())) == 6
    assert losses[3] == {it: losses[1][it] for it in (3, 6)}


# what reads a tensor's values back to the host, where a GPU holds them, which waits for every kernel queued before
# it: the aten operators every .item(), float(t), bool(t) and `if t:` ends in, and those that size their output by
# the values (a boolean-mask index); and the Tensor methods that read on the CPU without an operator a profiler sees
HOST_READ_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::equal")
HOST_READ_METHODS = ("tolist", "cpu", "numpy")


def host_reads(monkeypatch, config, first, last):
    """{what: count} of the host reads of iterations first to last - 1 of T.train(config): the HOST_READ_OPS the
    profiler sees from get_lr of `first` to get_lr of `last`, and the HOST_READ_METHODS called meanwhile, as
    "file:function: method"."""
    profiler, reads, real_get_lr = torch.profiler.profile(), {}, T.get_lr
    profiling = False

    def count(what):
        reads[what] = reads.get(what, 0) + 1

    def get_lr(it, c):
        nonlocal profiling
        if it == first:
            profiler.start()
            profiling = True
        elif it == last:
            profiler.stop()
            profiling = False
            for event in profiler.events():
                parents, parent = [], event.cpu_parent
                while parent is not None:
                    parents.append(parent.name)
                    parent = parent.cpu_parent
                # the fused AdamW's CPU kernel reads its step counters, which live on the CPU; on a GPU they
                # are GPU tensors its kernel reads there
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
    return reads


@pytest.mark.parametrize("attention", VARIANTS)
@pytest.mark.parametrize("accumulation, grad_clip", [(1, 1.0), (3, 0.0)])
def test_iterations_that_neither_log_nor_evaluate_read_nothing_back_to_the_host(attention, accumulation, grad_clip,
                                                                                  tmp_path, data_dir, monkeypatch):
    """NanoGPT's loop reads the loss only at its log steps: on a GPU a read (.item(), .tolist(), a tensor's truth
    value) waits for every queued kernel, so the CPU could no longer queue the next step while the GPU runs this
    one. Iterations 3 to 8 of 12 here neither log (log_interval=10) nor evaluate (eval_interval=100)."""
    config = tiny(tmp_path, data_dir, attention=attention, gradient_accumulation_steps=accumulation,
                  grad_clip=grad_clip, max_iters=12, lr_decay_iters=12, log_interval=10, eval_interval=100)
    reads = host_reads(monkeypatch, config, 3, 9)
    # the batch offsets, drawn by a CPU generator, are host memory on every device
    assert reads.pop("data.py:get: tolist") == 6 * accumulation
    assert reads == {}


def test_losses_left_unread_are_read_back_once_there_are_max_unread_losses(tmp_path, data_dir, monkeypatch):
    """With log_interval and eval_interval far apart the unread losses would pile up on the device: at
    MAX_UNREAD_LOSSES = 2, iterations 3 to 8 read theirs three times, two losses at a time."""
    monkeypatch.setattr(T, "MAX_UNREAD_LOSSES", 2)
    config = tiny(tmp_path, data_dir, max_iters=12, lr_decay_iters=12, log_interval=10, eval_interval=100)
    reads = host_reads(monkeypatch, config, 3, 9)
    reads.pop("data.py:get: tolist")
    assert reads == {"train.py:read_losses: tolist": 3}


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_under_torchrun_each_iteration_reads_back_its_stop_flag_alone(parallelism, tmp_path, data_dir, monkeypatch,
                                                                      one_process_group):
    """All ranks must stop after the step a signal came in (docs/training.md): the flag is all-reduced and read
    at every step, the mean loss with it (and checked at once, as it is on the host anyway); nothing else."""
    config = tiny(tmp_path, data_dir, parallelism=parallelism, max_iters=12, lr_decay_iters=12, log_interval=10,
                  eval_interval=100)
    reads = host_reads(monkeypatch, config, 3, 9)
    reads.pop("data.py:get: tolist")
    assert reads == {"train.py:forward_backward: tolist": 6}


@pytest.mark.parametrize("dtype, scaled", [("float32", False), ("bfloat16", False), ("float16", True)])
def test_the_loss_is_scaled_under_float16_only(dtype, scaled, tmp_path, data_dir, monkeypatch):
    """float16's gradients underflow unless the loss is scaled up; bfloat16 has float32's exponent range,
    so scaling would only cost work and skip steps."""
    enabled = []

    class RecordingScaler(torch.amp.GradScaler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            enabled.append(self.is_enabled())

    monkeypatch.setattr(torch.amp, "GradScaler", RecordingScaler)
    T.train(tiny(tmp_path, data_dir, dtype=dtype, max_iters=1), verbose=False)
    assert enabled == [scaled]


def global_norm(tensors):
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t.float()) for t in tensors])))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_step_takes_gradients_clipped_to_grad_clip_after_unscaling(dtype, tmp_path, data_dir, monkeypatch):
    """clip_grad_norm_ sees the true gradients: under float16 the GradScaler's are 2**16 times larger
    until unscale_, and clipping those would shrink every step by as much. AdamW then steps with
    gradients of global norm grad_clip (this model's start at about 1.5)."""
    clipped_from, stepped_with = [], []
    real_clip, real_step = torch.nn.utils.clip_grad_norm_, torch.amp.GradScaler.step

    def clip(parameters, max_norm, *args, **kwargs):
        norm = real_clip(parameters, max_norm, *args, **kwargs)
        clipped_from.append(float(norm))
        return norm

    def step(self, optimizer, *args, **kwargs):
        stepped_with.append(global_norm([p.grad for group in optimizer.param_groups for p in group["params"]]))
        return real_step(self, optimizer, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    monkeypatch.setattr(torch.amp.GradScaler, "step", step)
    T.train(tiny(tmp_path, data_dir, dtype=dtype, max_iters=2, grad_clip=0.5), verbose=False)
    assert len(clipped_from) == 2 and all(1.0 < norm < 3.0 for norm in clipped_from), clipped_from
    assert stepped_with == pytest.approx([0.5, 0.5], rel=1e-3)


def test_loss_falls(tmp_path, data_dir):
    T.train(tiny(tmp_path, data_dir, max_iters=40, eval_interval=40, learning_rate=3e-3,
            lr_decay_iters=40), verbose=False)
    records = read_log(tmp_path / "out")
    evals = [r["val_loss"] for r in records if r["type"] == "eval"]
    assert evals[-1] < evals[0] - 0.5, evals


def first_gradients_and_log(tmp_path, data_dir, monkeypatch, **overrides):
    """One iteration: the gradients forward_backward leaves (before clipping and the step), and log.jsonl."""
    gradients = []
    real_forward_backward = T.forward_backward

    def recording(run, signals):
        result = real_forward_backward(run, signals)
        gradients.append({name: p.grad.clone() for name, p in run.raw_model.named_parameters()})
        return result

    monkeypatch.setattr(T, "forward_backward", recording)
    T.train(tiny(tmp_path, data_dir, max_iters=1, **overrides), verbose=False)
    log = read_log(tmp_path / "out")
    return gradients[0], [r for r in log if r["type"] == "train"]


def test_accumulated_micro_batches_equal_one_large_batch(tmp_path, data_dir, monkeypatch):
    """AdamW's step hardly changes when every gradient is scaled alike, so a loss left undivided by
    the micro-steps would still train; it would shift what grad_clip means, and the logged loss."""
    large, large_log = first_gradients_and_log(tmp_path / "large", data_dir, monkeypatch, batch_size=4)
    split, split_log = first_gradients_and_log(tmp_path / "split", data_dir, monkeypatch, batch_size=2,
                                               gradient_accumulation_steps=2)
    for name in large:
        torch.testing.assert_close(split[name], large[name], atol=1e-6, rtol=1e-5, msg=name)
    assert split_log[0]["loss"] == pytest.approx(large_log[0]["loss"], rel=1e-6)


def test_mfu_counts_every_micro_batch_of_an_iteration(tmp_path, data_dir):
    c = tiny(tmp_path, data_dir, max_iters=3, batch_size=2, gradient_accumulation_steps=3, peak_flops=1e12)
    summary = T.train(c, verbose=False)
    log = read_log(tmp_path / "out")
    tokens_per_iter = c["batch_size"] * c["gradient_accumulation_steps"] * c["block_size"]
    flops_per_iter = summary["flops_per_token"] * tokens_per_iter
    for r in (r for r in log if r["type"] == "train"):
        assert r["mfu"] == pytest.approx(flops_per_iter / (r["ms_per_iter"] / 1000) / 1e12, rel=1e-9)
        assert r["tokens_per_s"] == pytest.approx(tokens_per_iter / (r["ms_per_iter"] / 1000), rel=1e-9)


# -----------------------------------------------------------------------------
# exact resume

@pytest.mark.parametrize("attention", VARIANTS)
def test_resume_equals_uninterrupted_training(tmp_path, data_dir, attention):
    common = dict(attention=attention, dropout=0.1, max_iters=8, eval_interval=4, gradient_accumulation_steps=2)
    T.train(tiny(tmp_path / "straight", data_dir, **common), verbose=False)
    T.train(tiny(tmp_path / "split", data_dir, **{**common, "max_iters": 4}), verbose=False)
    assert load_checkpoint(tmp_path / "split" / "out")["iter_num"] == 4
    T.train(tiny(tmp_path / "split", data_dir, **common, init_from="resume"), verbose=False)
    a, b = params(tmp_path / "straight" / "out"), params(tmp_path / "split" / "out")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    straight = load_checkpoint(tmp_path / "straight" / "out")
    split = load_checkpoint(tmp_path / "split" / "out")
    assert split["iter_num"] == straight["iter_num"] == 8
    assert split["best_val_loss"] == straight["best_val_loss"]
    # the resumed log continues the first one
    log = read_log(tmp_path / "split" / "out")
    assert [r["iter"] for r in log if r["type"] == "train"] == list(range(1, 9))


def test_a_resume_keeps_the_best_checkpoint_when_the_loss_gets_worse(tmp_path, data_dir, monkeypatch):
    """With always_save_checkpoint=False the checkpoint is the best evaluation so far, across resumes:
    a resumed run that forgot the best val loss would take its first, worse, evaluation for a new best."""
    c = tiny(tmp_path, data_dir, max_iters=4, always_save_checkpoint=False)
    first = T.train(c, verbose=False)
    assert load_checkpoint(tmp_path / "out")["iter_num"] == 4
    monkeypatch.setattr(T, "estimate_loss", lambda run: {"train": 9.0, "val": 9.0})
    resumed = T.train({**c, "max_iters": 8, "init_from": "resume"}, verbose=False)
    checkpoint = load_checkpoint(tmp_path / "out")
    assert checkpoint["iter_num"] == 4 and checkpoint["best_val_loss"] == first["best_val_loss"] < 9.0
    assert resumed["best_val_loss"] == first["best_val_loss"] and resumed["final_val_loss"] == 9.0


def test_a_run_whose_loss_only_gets_worse_still_saves_its_best_checkpoint(tmp_path, data_dir, monkeypatch):
    """With always_save_checkpoint=False, the unsaved evaluation of the initial weights must not count as
    the best: nothing after it would be saved, and summary.json would name a loss no checkpoint has."""
    val_losses = {0: 1.0, 4: 5.0, 8: 6.0}
    monkeypatch.setattr(T, "estimate_loss", lambda run: {"train": val_losses[run.iter_num], "val": val_losses[run.iter_num]})
    summary = T.train(tiny(tmp_path, data_dir, max_iters=8, eval_interval=4, always_save_checkpoint=False), verbose=False)
    checkpoint = load_checkpoint(tmp_path / "out")
    assert checkpoint["iter_num"] == 4 and checkpoint["best_val_loss"] == summary["best_val_loss"] == 5.0
    assert [r["val_loss"] for r in read_log(tmp_path / "out") if r["type"] == "eval"] == [1.0, 5.0, 6.0]


def test_save_checkpoints_false_trains_the_same_run_and_writes_no_checkpoint(tmp_path, data_dir, monkeypatch, capsys):
    """A throughput run: the same losses as a run that saves, its log and summary, and no checkpoint
    even when a signal stops it (a save there would cost a 1B model's ~15 GB)."""
    saved = T.train(tiny(tmp_path / "saved", data_dir), verbose=False)
    unsaved = T.train(tiny(tmp_path / "unsaved", data_dir, save_checkpoints=False), verbose=False)
    out = tmp_path / "unsaved" / "out"
    assert sorted(p.name for p in out.iterdir()) == ["log.jsonl", "summary.json", "train.lock"]
    assert [r for r in read_log(out) if r["type"] == "eval"] == [
        {**r, "elapsed_s": e["elapsed_s"]} for r, e in zip(read_log(tmp_path / "saved" / "out"), read_log(out))
        if r["type"] == "eval"]
    assert unsaved["final_val_loss"] == saved["final_val_loss"] and unsaved["stop_reason"] == "max_iters"
    assert unsaved["best_val_loss"] is None  # the best of its checkpoints, of which there are none
    send_signal_during_iteration(monkeypatch, 5)
    stopped = T.train(tiny(tmp_path / "stopped", data_dir, save_checkpoints=False))
    assert stopped["stop_reason"] == "SIGINT" and stopped["iterations"] == 6
    assert not (tmp_path / "stopped" / "out" / CHECKPOINT_NAME).exists()
    assert "received SIGINT: stopping at iteration 6 (save_checkpoints=False: no checkpoint)" in capsys.readouterr().out


def test_save_checkpoints_false_refuses_to_resume_or_to_write_beside_an_earlier_run(tmp_path, data_dir):
    cfg = tiny(tmp_path, data_dir, max_iters=4)
    T.train(cfg, verbose=False)
    out = tmp_path / "out"
    earlier = {path.name: path.read_bytes() for path in out.iterdir()}
    with pytest.raises(T.ConfigError, match="a resume that saves nothing leaves its checkpoint behind its log and "
                                            "summary: resume with save_checkpoints=True"):
        T.train({**cfg, "init_from": "resume", "max_iters": 8, "save_checkpoints": False}, verbose=False)
    with pytest.raises(T.ConfigError, match=f"{out / CHECKPOINT_NAME} is an earlier run's, and with "
                                            f"save_checkpoints=False .* give an --out_dir without one"):
        T.train({**cfg, "save_checkpoints": False}, verbose=False)
    assert {path.name: path.read_bytes() for path in out.iterdir()} == earlier
    # evaluating the checkpoint writes nothing either way
    assert T.train({**cfg, "init_from": "resume", "eval_only": True, "save_checkpoints": False},
                   verbose=False)["stop_reason"] == "eval_only"


def test_a_resume_takes_betas_and_weight_decay_from_its_config(tmp_path, data_dir):
    """The moments come from the checkpoint, the hyperparameters from the config, as the learning rate does."""
    c = tiny(tmp_path, data_dir, max_iters=4, weight_decay=0.1, beta1=0.9, beta2=0.99)
    T.train(c, verbose=False)
    T.train({**c, "init_from": "resume", "max_iters": 8, "weight_decay": 0.0, "beta1": 0.8, "beta2": 0.95},
            verbose=False)
    groups = load_checkpoint(tmp_path / "out")["optimizer"]["param_groups"]
    assert [(g["weight_decay"], g["betas"]) for g in groups] == [(0.0, (0.8, 0.95)), (0.0, (0.8, 0.95))]
    T.train({**c, "init_from": "resume", "max_iters": 12, "weight_decay": 0.2}, verbose=False)
    groups = load_checkpoint(tmp_path / "out")["optimizer"]["param_groups"]
    assert [(g["weight_decay"], g["betas"]) for g in groups] == [(0.2, (0.9, 0.99)), (0.0, (0.9, 0.99))]


def test_a_resume_goes_on_in_the_same_wandb_run(tmp_path, data_dir, monkeypatch):
    """wandb.init gets the run's own id, kept across resumes, so that wandb resumes the run, not starts another."""
    inits = []

    class FakeRun:
        def log(self, *args, **kwargs):
            pass

        def finish(self):
            pass

    wandb = types.ModuleType("wandb")
    wandb.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    wandb.init = lambda **kwargs: (inits.append(kwargs), FakeRun())[1]
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    c = tiny(tmp_path, data_dir, max_iters=4, wandb_log=True)
    first = T.train(c, verbose=False)
    resumed = T.train({**c, "init_from": "resume", "max_iters": 8}, verbose=False)
    assert first["run_id"] == resumed["run_id"]
    T.train({**c, "init_from": "resume", "max_iters": 8, "eval_only": True}, verbose=False)  # a wandb run of its own
    assert [(i["id"], i["resume"]) for i in inits] == [(first["run_id"], "allow")] * 2 + [(None, None)]


def test_wandb_gets_each_record_under_its_type_at_its_iteration(tmp_path, data_dir, monkeypatch):
    """The log.jsonl records, each as {type/key: value} at step=iter, so that wandb plots them over iterations."""
    logged = []

    class FakeRun:
        def log(self, data, step=None):
            logged.append((step, data))

        def finish(self):
            pass

    wandb = types.ModuleType("wandb")
    wandb.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    wandb.init = lambda **kwargs: FakeRun()
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    T.train(tiny(tmp_path, data_dir, max_iters=2, eval_interval=2, wandb_log=True), verbose=False)
    records = read_log(tmp_path / "out")
    assert [step for step, _ in logged] == [r["iter"] for r in records] == [0, 1, 2, 2]
    assert set(logged[0][1]) == {"eval/train_loss", "eval/val_loss", "eval/elapsed_s"}
    assert set(logged[1][1]) == {"train/loss", "train/lr", "train/ms_per_iter", "train/tokens_per_s", "train/mfu",
                                 "train/elapsed_s"}
    for (_, data), record in zip(logged, records):
        assert data == {f"{record['type']}/{k}": v for k, v in record.items() if k not in ("type", "iter")}


@pytest.mark.parametrize("entry", ["model", "optimizer"])
def test_a_damaged_checkpoint_is_refused_at_resume_not_taken_for_divergence(entry, tmp_path, data_dir):
    """Bytes overwritten in ckpt.pt can load as NaN: without a check the resume's first step would
    diverge and blame the learning rate. The file is named damaged and left as it is."""
    T.train(tiny(tmp_path, data_dir, max_iters=4), verbose=False)
    path = tmp_path / "out" / CHECKPOINT_NAME
    checkpoint = torch.load(path, weights_only=True)
    model, optimizer = checkpoint["model"], checkpoint["optimizer"]["state"]
    damaged = model["transformer.ln_f.weight"] if entry == "model" else optimizer[0]["exp_avg"]
    damaged.view(-1)[7] = float("nan")
    torch.save(checkpoint, path)  # not save_checkpoint, which refuses it
    before = path.read_bytes()
    where = "transformer.ln_f.weight" if entry == "model" else "optimizer state 0 exp_avg"
    with pytest.raises(CheckpointError, match=f"cannot resume from {re.escape(str(path))}: its {where} holds NaN or "
                                              f"inf values, which train.py never saves, so the file is damaged"):
        T.train(tiny(tmp_path, data_dir, max_iters=6, init_from="resume"), verbose=False)
    assert path.read_bytes() == before


def test_a_resume_without_a_checkpoint_says_how_to_start_the_run(tmp_path, data_dir):
    with pytest.raises(CheckpointError) as err:
        T.train(tiny(tmp_path, data_dir, init_from="resume"), verbose=False)
    assert str(err.value).startswith(f"no checkpoint at {tmp_path / 'out' / CHECKPOINT_NAME}: init_from='resume' "
                                     f"continues the run whose out_dir this is; start it first (init_from='scratch')")


def test_resume_accepts_compiled_prefix(tmp_path, data_dir):
    """NanoGPT checkpoints of compiled models carry "_orig_mod."; ours do not, but load either."""
    T.train(tiny(tmp_path, data_dir, max_iters=4), verbose=False)
    path = tmp_path / "out" / CHECKPOINT_NAME
    ckpt = torch.load(path, weights_only=True)
    ckpt["model"] = {"_orig_mod." + k: v for k, v in ckpt["model"].items()}
    save_checkpoint(ckpt, path)
    T.train(tiny(tmp_path, data_dir, max_iters=6, init_from="resume"), verbose=False)
    assert not any(k.startswith("_orig_mod.") for k in params(tmp_path / "out"))


def test_checkpoints_from_before_the_gelu_option_keep_their_tanh_gelu(tmp_path, data_dir):
    T.train(tiny(tmp_path, data_dir, max_iters=2), verbose=False)
    path = tmp_path / "out" / CHECKPOINT_NAME
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["model_args"]["gelu_approximate"] == "none"  # the exact GELU by default, as NanoGPT
    del ckpt["model_args"]["gelu_approximate"]  # as written before the option existed
    save_checkpoint(ckpt, path)
    assert model_from_checkpoint(load_checkpoint(path)).transformer.h[0].mlp.gelu.approximate == "tanh"


def test_compiled_model_saves_without_prefix(tmp_path, data_dir, monkeypatch):
    # the eager backend wraps the model exactly as inductor does (OptimizedModule, "_orig_mod."),
    # without the minutes of C++ compilation
    real_compile = torch.compile
    wrapped = []

    def eager_compile(model, **kwargs):
        compiled = real_compile(model, backend="eager")
        wrapped.append(compiled)
        return compiled

    monkeypatch.setattr(torch, "compile", eager_compile)
    T.train(tiny(tmp_path, data_dir, max_iters=2, compile=True), verbose=False)
    assert wrapped and any(k.startswith("_orig_mod.") for k in wrapped[0].state_dict())
    ckpt = torch.load(tmp_path / "out" / CHECKPOINT_NAME, weights_only=True)
    assert not any(k.startswith("_orig_mod.") for k in ckpt["model"])
    GPT(T.GPTConfig(**ckpt["model_args"])).load_state_dict(ckpt["model"])  # strict load


# -----------------------------------------------------------------------------
# DDP: 2 processes == 1 process with the accumulation steps of both; signals; a clean exit

# What the drivers below share: two ranks forked from the driver's process, on a free local port.
FORK_RANKS = textwrap.dedent("""
    import os, socket

    def fork_ranks(rank_process):
        \"\"\"Fork two processes that each run rank_process(rank, port) and exit; their exit codes.\"\"\"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        pids = []
        for rank in range(2):
            pid = os.fork()
            if pid == 0:
                rank_process(rank, port)
            pids.append(pid)
        return [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
""")

# The teardown race (issue 12): torch.distributed.nn.functional, first imported by DDP after the
# process group exists, holds the group in its default arguments, so destroy_process_group cannot
# free it and gloo's threads still run when the interpreter shuts down, where now and then one of
# them aborts the process. This driver forks pairs of ranks from one process that imported train
# (not torch._dynamo, as a fresh `python train.py` has not) and lets each exit the normal way.
TEARDOWN_DRIVER = FORK_RANKS + textwrap.dedent("""
    import gc, json, sys
    import train

    def rank_process(rank, port, args, report):
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        code = train.main(args)
        threads = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
        with open(report, "w") as f:
            json.dump(threads, f)
        sys.exit(code)  # through the interpreter's shutdown, where the race was

    args, out, runs = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    results = []
    for run in range(runs):
        if run == 1:  # the first run is the faithful one; the others start warm, to be cheap
            import torch._dynamo
        gc.freeze()  # what the children inherit is not collected again at each of their exits
        codes = fork_ranks(lambda rank, port: rank_process(rank, port, args + [f"--out_dir={out}/{run}"],
                                                           f"{out}/{run}.{rank}.json"))
        threads = [json.load(open(f"{out}/{run}.{rank}.json")) if os.path.exists(f"{out}/{run}.{rank}.json")
                   else None for rank in range(2)]
        results.append({"codes": codes, "threads": threads})
    print(json.dumps(results))
""")


@pytest.mark.slow
def test_finished_ddp_runs_exit_0_every_time_with_no_gloo_thread_left(tmp_path, data_dir):
    cfg = tiny(tmp_path, data_dir, max_iters=2, eval_interval=2, eval_iters=2, gradient_accumulation_steps=2,
               n_layer=1, n_embd=16)
    del cfg["out_dir"]
    result = subprocess.run([sys.executable, "-c", TEARDOWN_DRIVER, json.dumps([f"--{k}={v!r}" for k, v in cfg.items()]),
                             str(tmp_path), "5"], cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "terminate called" not in result.stderr
    runs = json.loads(result.stdout)
    assert [run["codes"] for run in runs] == [[0, 0]] * 5, result.stderr[-3000:]
    leftover = {name for run in runs for threads in run["threads"] for name in threads if "gloo" in name}
    assert not leftover  # destroy_process_group really ended the group, before the interpreter shut down


def test_an_nccl_process_group_is_bound_to_its_ranks_gpu(monkeypatch):
    """So that its barriers know their device (torch warns at every run where they must take the current one)."""
    import distributed

    joined = []
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda **options: joined.append(options))
    distributed.init_process_group("nccl", "cuda:1")
    distributed.init_process_group("gloo", "cpu")
    distributed.init_process_group("gloo", "cuda:0")  # backend='gloo' on a GPU: no NCCL group to bind
    assert joined == [dict(backend="nccl", device_id=torch.device("cuda:1")), dict(backend="gloo", device_id=None),
                      dict(backend="gloo", device_id=None)]


# Two gloo ranks forked from one process, where the HellaSwag file can be read on rank 0 only (as a
# file on one node of several would be): each prints what hellaswag_examples gave it and said.
HELLASWAG_DRIVER = FORK_RANKS + textwrap.dedent("""
    import json, sys, types
    import torch.distributed as dist
    import eval_hellaswag, train

    def examples_for_training(path, limit, meta, say):
        if os.environ["RANK"] == "0":
            return ["an example"], "a tokenizer"
        say(f"warning: HellaSwag evaluation is off: cannot read {path}")

    def rank_process(rank, port):
        os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo")
        eval_hellaswag.examples_for_training = examples_for_training
        said = []
        run = types.SimpleNamespace(c={"hellaswag_file": "hs.jsonl", "hellaswag_limit": 0}, meta={}, ddp=True,
                                    world_size=2, say=said.append)
        result = train.hellaswag_examples(run)
        os.write(1, (json.dumps({"rank": rank, "result": result, "said": said}) + "\\n").encode())  # one line, whole
        dist.destroy_process_group()
        os._exit(0)

    sys.exit(max(fork_ranks(rank_process)))
""")


def test_hellaswag_during_ddp_training_is_off_on_every_rank_when_one_cannot_read_it(tmp_path):
    result = subprocess.run([sys.executable, "-c", HELLASWAG_DRIVER], cwd=tmp_path, env=subprocess_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    # torch 2.8's gloo prints a line of its own to stdout ("[Gloo] Rank 1 is connected to 1 peer ranks...")
    reports = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    ranks = sorted(reports, key=lambda r: r["rank"])
    assert [r["result"] for r in ranks] == [None, None]  # rank 0 would otherwise wait in an all_reduce alone
    assert ranks[0]["said"] == ["warning: HellaSwag evaluation is off: cannot read hs.jsonl (rank 1)"]


MISSING_CHECKPOINT_DRIVER = FORK_RANKS + textwrap.dedent("""
    import signal, sys
    import distributed, train

    def rank_process(rank, port):
        signal.alarm(60)  # a rank left waiting for the other in init_process_group ends here, not in 30 minutes
        os.chdir(f"node{rank}")  # two nodes: only node0 sees out/ckpt.pt
        os.environ.update(RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
        distributed.REFUSE_WAIT_SECONDS = 0  # no launcher here to stop the rank that does not report
        try:
            code = train.main(sys.argv[1:])
        except SystemExit as e:
            code = e.code
        os._exit(code)

    sys.exit(max(fork_ranks(rank_process)))
""")


@pytest.mark.parametrize("parallelism, error", [
    ("ddp", "no checkpoint at out/ckpt.pt"),
    # node1 sees the FSDP run's train_state.pt, but not the shards beside it
    ("fsdp", "the sharded checkpoint out/ckpt_sharded is damaged (its .metadata cannot be read"),
])
def test_a_resume_that_one_node_cannot_read_stops_every_rank_with_its_error(parallelism, error, tmp_path, data_dir,
                                                                            monkeypatch, request):
    """Each rank reads out_dir where it runs: a node that does not see it all (not on a shared filesystem)
    used to stop alone, leaving rank 0 waiting for it in init_process_group until its timeout."""
    for node in ("node0", "node1"):
        (tmp_path / node).mkdir()
    monkeypatch.chdir(tmp_path / "node0")
    cfg = tiny(tmp_path, data_dir, out_dir="out", max_iters=4, lr_decay_iters=4, gradient_accumulation_steps=2,
               parallelism=parallelism)
    if parallelism == "fsdp":
        request.getfixturevalue("one_process_group")  # shards are written by a world of one here
    T.train(cfg, verbose=False)
    if parallelism == "fsdp":
        (tmp_path / "node1" / "out" / "ckpt_sharded").mkdir(parents=True)
        shutil.copy(tmp_path / "node0" / "out" / "ckpt_sharded" / "train_state.pt",
                    tmp_path / "node1" / "out" / "ckpt_sharded")
        for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(key)  # each rank of the launch below sets its own
    argv = [f"--{k}={v!r}" for k, v in {**cfg, "init_from": "resume", "max_iters": 8}.items()]
    result = subprocess.run([sys.executable, "-c", MISSING_CHECKPOINT_DRIVER, *argv], cwd=tmp_path,
                            env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"error: rank 1 of 2: {error}" in result.stderr
    assert "on a filesystem every node sees" in result.stderr and result.stderr.count("error:") == 1
    assert load_checkpoint(tmp_path / "node0" / "out")["iter_num"] == 4


def log_records_so_far(log):
    return log.read_text().count('"type": "train"') if log.exists() else 0


def launch_and_signal(tmp_path, data_dir, sig, to_group, **overrides):
    """Start `python train.py --standalone --nproc_per_node=2 ...` (train.py's own torchrun), signal
    it once two steps are logged, return (exit status, stdout, stderr)."""
    cfg = tiny(tmp_path, data_dir, max_iters=100000, eval_interval=100000, **overrides)
    tmp_path.mkdir(exist_ok=True)
    cmd = [sys.executable, str(REPO / "train.py"), "--standalone", "--nproc_per_node=2",
           *[f"--{k}={v!r}" for k, v in cfg.items()]]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    log = tmp_path / "out" / "log.jsonl"
    deadline = time.time() + 120
    while proc.poll() is None and time.time() < deadline and log_records_so_far(log) < 2:
        time.sleep(0.05)
    if to_group:  # what Ctrl-C in a terminal does
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr and "SignalException" not in stderr
    assert f"received {sig.name}" in stdout and "2 process(es)" in stdout
    ckpt = load_checkpoint(tmp_path / "out")
    assert ckpt["iter_num"] == log_records(tmp_path / "out", "train")[-1] >= 2
    return ckpt


@pytest.mark.slow
def test_ddp_stopped_by_sigterm_exits_0_and_equals_single_process(tmp_path, data_dir):
    """SIGTERM to the launcher: exit status 0 and a checkpoint at the last step; and 2 processes
    reach the parameters of 1 process with twice the accumulation. Exact with dropout 0 only: each
    rank draws its own dropout masks, so with dropout the two runs see different masks."""
    common = dict(gradient_accumulation_steps=4, batch_size=3, dropout=0.0, lr_decay_iters=1000, peak_flops=1e12)
    ddp = launch_and_signal(tmp_path / "ddp", data_dir, signal.SIGTERM, to_group=False, **common)
    iterations = ddp["iter_num"]
    T.train(tiny(tmp_path / "single", data_dir, max_iters=iterations, eval_interval=1000, **common), verbose=False)
    single = params(tmp_path / "single" / "out")
    for key in single:
        torch.testing.assert_close(ddp["model"][key], single[key], rtol=1e-5, atol=1e-6, msg=key)
    # the logged loss is the mean over both ranks' micro-batches, as one process logs it
    losses = [{r["iter"]: r["loss"] for r in read_log(tmp_path / run / "out") if r["type"] == "train"}
              for run in ("ddp", "single")]
    assert losses[0].keys() == losses[1].keys() == set(range(1, iterations + 1))
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    tokens_per_iter = 4 * 3 * 16  # gradient_accumulation_steps x batch_size x block_size, over both ranks
    summary = json.loads((tmp_path / "ddp" / "out" / "summary.json").read_text())
    for record in (r for r in read_log(tmp_path / "ddp" / "out") if r["type"] == "train"):
        seconds = record["ms_per_iter"] / 1000
        assert record["tokens_per_s"] == pytest.approx(tokens_per_iter / seconds, rel=1e-9)
        # MFU is a GPU's: the FLOPs of its own half of the tokens over one peak_flops
        assert record["mfu"] == pytest.approx(summary["flops_per_token"] * tokens_per_iter / 2 / seconds / 1e12, rel=1e-9)
    assert summary["tokens_per_iter"] == tokens_per_iter
    assert summary["tokens_per_s"] == pytest.approx(tokens_per_iter / (summary["mean_ms_per_iter"] / 1000), rel=1e-9)


@pytest.mark.slow
def test_ddp_interrupted_by_ctrl_c_exits_0(tmp_path, data_dir):
    """SIGINT to the launcher's process group, as Ctrl-C in a terminal sends it."""
    launch_and_signal(tmp_path, data_dir, signal.SIGINT, to_group=True, gradient_accumulation_steps=2)


def test_the_launcher_keeps_sigint_and_sigterm_under_an_agent_of_any_torch(monkeypatch):
    """torch >= 2.10: an option leaves the two signals out of the agent's handling; before, the
    handler the agent installs passes them to the workers and leaves SIGHUP to torch's own."""
    import argparse

    import launcher
    from torch.distributed.elastic.multiprocessing import api

    def agent_options(*options):
        parser = argparse.ArgumentParser()
        for option in options:
            parser.add_argument(option)
        parser.add_argument("training_script")
        return lambda: parser

    monkeypatch.setattr("torch.distributed.run.get_args_parser", agent_options("--signals-to-handle"))
    assert launcher.keep_our_signal_handlers(["--standalone"]) == ["--standalone", "--signals-to-handle=SIGHUP,SIGQUIT"]
    monkeypatch.setattr("torch.distributed.run.get_args_parser", agent_options())  # torch < 2.10
    passed, torchs = [], []
    monkeypatch.setattr(launcher, "_pass_signal_to_workers", lambda signum, frame: passed.append(signum))
    monkeypatch.setattr(api, "_terminate_process_handler", lambda signum, frame: torchs.append(signum))
    assert launcher.keep_our_signal_handlers(["--standalone"]) == ["--standalone"]
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        api._terminate_process_handler(signum, None)
    assert passed == [signal.SIGTERM, signal.SIGINT] and torchs == [signal.SIGHUP]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the training processes")
def test_the_launcher_passes_a_signal_on_as_sent_and_with_no_training_process_ends_as_the_signal_would():
    """Its children are the training processes: a Ctrl-C reaches them as SIGINT, and one that comes before
    any was started (or after they ended) stops the launcher at once, with the status the signal gives."""
    code = textwrap.dedent("""
        import os, signal, subprocess, sys
        import launcher
        worker = subprocess.Popen([sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGINT, "
                                   "lambda s, f: sys.exit(signal.Signals(s).name)); print('ready', flush=True); "
                                   "time.sleep(60)"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert worker.stdout.readline() == "ready\\n"
        assert launcher.child_pids(os.getpid()) == [worker.pid]  # before any signal is sent
        launcher._pass_signal_to_workers(signal.SIGINT, None)
        print(worker.communicate(timeout=30)[1].strip(), flush=True)  # what the worker's handler received
        launcher._pass_signal_to_workers(signal.SIGTERM, None)
    """)
    result = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(REPO)),
                            capture_output=True, text=True, timeout=60)
    assert result.stdout == "SIGINT\n", result.stderr[-3000:]
    assert result.stderr == "launcher: received SIGINT, passing it to the 1 training process(es)\n"
    assert result.returncode == 128 + signal.SIGTERM


def test_launcher_options_need_their_value_after_an_equals_sign(capsys):
    assert T.main(["--nproc_per_node", "2", "config/quickstart.py"]) == 1
    assert "--nproc_per_node=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize("option, message", [
    ("--nproc=2", "unknown config key 'nproc'"),  # not an abbreviation of torchrun's --nproc_per_node
    ("--standalone=True", "launcher option argument --standalone: ignored explicit argument 'True'"),
    ("--nnodes=x", "torchrun could not start the training processes: ValueError"),
    ("--master_port=PORT_IN_USE", "torchrun could not start the training processes: DistNetworkError"),
])
def test_a_launch_torchrun_refuses_is_one_error_line(option, message, tmp_path, data_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        option = option.replace("PORT_IN_USE", str(taken.getsockname()[1]))
        args = [f"--{k}={v!r}" for k, v in tiny(tmp_path, data_dir).items()]
        result = subprocess.run([sys.executable, str(REPO / "train.py"), "--nproc_per_node=1", option, *args],
                                cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {message}")


@pytest.mark.parametrize("environment", [dict(RANK="0"), dict(RANK="x"), dict(
    RANK="1", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500"), dict(
    RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_PORT="29500")])  # no MASTER_ADDR
def test_an_incomplete_launch_environment_is_one_error_line(environment, tmp_path, data_dir, capsys, monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert T.main([f"--{k}={v!r}" for k, v in tiny(tmp_path, data_dir).items()]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: RANK is set") and f"RANK={environment['RANK']!r}" in err and "torchrun" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("overrides, key", [
    (dict(gradient_accumulation_steps=3), "gradient_accumulation_steps"),
    (dict(parallelism="fsdp", eval_iters=3, gradient_accumulation_steps=2), "eval_iters"),
])
def test_steps_that_do_not_split_over_the_processes_are_said_once(tmp_path, data_dir, overrides, key):
    args = [f"--{k}={v!r}" for k, v in tiny(tmp_path, data_dir, **overrides).items()]
    result = subprocess.run([sys.executable, str(REPO / "train.py"), "--standalone", "--nproc_per_node=2", *args],
                            cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.startswith(f"error: config key '{key}'=3 must be divisible by the number of")
    assert result.stderr.count("\n") == 1 and not (tmp_path / "out").exists()  # said before any process started


def test_steps_that_do_not_split_name_the_process_counts_that_would():
    c = configurator.resolve_config(configurator.get_config(["--gradient_accumulation_steps=100"]))
    assert configurator.world_size_problem(c, 3).endswith(
        "; 100 splits over 1, 2, 4, 5, 10, 20, 25, 50, ... processes, or, for 3, set --gradient_accumulation_steps=99 "
        "(the global batch changes with it)")
    c = configurator.resolve_config(configurator.get_config(["--parallelism=fsdp", "--eval_iters=3", "--gradient_accumulation_steps=6"]))
    assert configurator.world_size_problem(c, 2).endswith("; 3 splits over 1, 3 processes, or, for 2, set --eval_iters=4")
    assert configurator.world_size_problem(c, 3) is None
    c = configurator.resolve_config(configurator.get_config(["--eval_iters=3", "--gradient_accumulation_steps=6"]))
    assert configurator.world_size_problem(c, 2) is None  # DDP: each rank evaluates on its own, as many as it likes
    c = configurator.resolve_config(configurator.get_config(["--gradient_accumulation_steps=1"]))
    assert configurator.world_size_problem(c, 4).endswith(
        "for 4, set --gradient_accumulation_steps=4 (the global batch changes with it)")  # not 0, the nearest multiple


def test_the_planned_world_size_is_known_unless_the_nodes_are_elastic():
    from launcher import planned_world_size

    assert planned_world_size(["--standalone", "--nproc_per_node=2"]) == 2
    assert planned_world_size(["--nnodes=2", "--nproc_per_node=3"]) == 6
    assert planned_world_size(["--standalone", "--nnodes=2", "--nproc_per_node=2"]) == 2  # standalone is one node
    assert planned_world_size(["--nnodes=1:4", "--nproc_per_node=2"]) is None


@pytest.mark.parametrize("value, problem", [("0", "no process to start"), ("two", "Unsupported nproc_per_node value")])
def test_a_launch_with_no_process_to_start_is_one_error_line(value, problem, tmp_path, data_dir, capsys):
    args = [f"--{k}={v!r}" for k, v in tiny(tmp_path, data_dir).items()]
    assert T.main(["--standalone", f"--nproc_per_node={value}", *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: --nproc_per_node={value}: {problem}") and "Traceback" not in err
    assert not (tmp_path / "out").exists()


# -----------------------------------------------------------------------------
# crashes, signals and NaN

@pytest.mark.slow
def test_sigkill_during_checkpoint_write_never_leaves_a_torn_checkpoint(tmp_path):
    """A writer saves a ~24 MB checkpoint in a loop; kill it at random moments after its first save
    (so mid-write, often), then the checkpoint must load and be one of its complete versions."""
    path = tmp_path / "out" / CHECKPOINT_NAME
    writer = textwrap.dedent(f"""
        import sys, torch
        from checkpoint import save_checkpoint
        big = torch.zeros(6_000_000)
        version = int(sys.argv[1])
        while True:
            version += 1
            big.fill_(version)
            save_checkpoint({{"model_args": {{}}, "model": {{"w": big}}, "iter_num": version}}, {str(path)!r})
            print(version, flush=True)
    """)
    rng = random.Random(1)
    for attempt in range(1, 7):
        first = attempt * 1_000_000  # each writer's versions: which one wrote the file is known
        proc = subprocess.Popen([sys.executable, "-c", writer, str(first)], cwd=REPO, env=subprocess_env(),
                                stdout=subprocess.PIPE, text=True)
        assert int(proc.stdout.readline()) == first + 1  # this writer has saved once
        time.sleep(rng.uniform(0.0, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        ckpt = load_checkpoint(path)  # raises CheckpointError on a torn file
        assert ckpt["iter_num"] > first  # this writer's, not an earlier one's
        assert torch.all(ckpt["model"]["w"] == ckpt["iter_num"])  # one complete version, never a mix


def test_stale_temporary_checkpoints_are_cleaned(tmp_path, data_dir):
    out = tmp_path / "out"
    out.mkdir()
    stale = out / (CHECKPOINT_NAME + ".abc123.tmp")
    stale.write_bytes(b"half a checkpoint")
    T.train(tiny(tmp_path, data_dir, max_iters=2), verbose=False)
    assert not stale.exists()


def non_finite_loss_from_iteration(monkeypatch, iteration, bad=float("nan"), then=lambda calls: None):
    """Make the training loss `bad` from the run's iteration `iteration` on (one micro-step each); then(calls)
    runs in every training forward pass, calls counting them. Returns the count."""
    real_forward = GPT.forward
    calls = {"train": 0}

    def forward(self, idx, targets=None, **kwargs):
        logits, loss = real_forward(self, idx, targets, **kwargs)
        if self.training and targets is not None:
            calls["train"] += 1
            then(calls)
            if calls["train"] > iteration:
                loss = loss * bad
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward)
    return calls


# read at iteration 6 (before its step), at the log step 7 (before its step), at the evaluation at 8
@pytest.mark.parametrize("log_interval", [1, 8, 100])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_loss_stops_and_keeps_last_good_checkpoint(bad, log_interval, tmp_path, data_dir, monkeypatch):
    """The losses are read back at log steps and before evaluations only: the error and the summary name the
    iteration of the first non-finite one, and nothing is saved after it, whenever it is read."""
    non_finite_loss_from_iteration(monkeypatch, 6, bad)  # iterations 0..5 are fine, iteration 6 diverges
    config = tiny(tmp_path, data_dir, max_iters=20, eval_interval=4, log_interval=log_interval)
    with pytest.raises(T.NonFiniteLossError, match=f"training loss became {bad} at iteration 6"):
        T.train(config, verbose=False)
    ckpt = load_checkpoint(tmp_path / "out")
    assert ckpt["iter_num"] == 4  # the last evaluation before the NaN
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["stop_reason"] == "diverged" and summary["iterations"] == 6
    assert summary["iterations_this_run"] == 6  # the steps taken after it, before its loss was read, are not the run's
    assert summary["final_val_loss"] is None and summary["best_val_loss"] is not None


def test_a_nan_loss_before_a_signal_stops_the_run_at_the_loss(tmp_path, data_dir, monkeypatch):
    """A signal's step reads the unread losses back before its checkpoint: a NaN two steps before is named
    there, as a log step would name it, and the steps after it are not the run's."""
    def sigterm_in_iteration_7(calls):
        if calls["train"] == 8:
            os.kill(os.getpid(), signal.SIGTERM)

    non_finite_loss_from_iteration(monkeypatch, 6, then=sigterm_in_iteration_7)
    config = tiny(tmp_path, data_dir, max_iters=20, eval_interval=100, log_interval=100, lr_decay_iters=20)
    with pytest.raises(T.NonFiniteLossError, match="training loss became nan at iteration 6"):
        T.train(config, verbose=False)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["stop_reason"] == "diverged" and summary["iterations"] == summary["iterations_this_run"] == 6
    assert not (tmp_path / "out" / CHECKPOINT_NAME).exists()


def test_under_torchrun_a_nan_loss_stops_the_run_before_another_step(tmp_path, data_dir, monkeypatch,
                                                                     one_process_group):
    """Under DDP every step reads its loss back with its stop flag: a NaN is found at its own step, not
    after the steps to the next log step or evaluation."""
    calls = non_finite_loss_from_iteration(monkeypatch, 6)
    config = tiny(tmp_path, data_dir, max_iters=12, eval_interval=100, log_interval=100, lr_decay_iters=12)
    with pytest.raises(T.NonFiniteLossError, match="training loss became nan at iteration 6"):
        T.train(config, verbose=False)
    assert calls["train"] == 7  # iterations 0 to 6


def test_divergence_never_overwrites_the_last_good_checkpoint(tmp_path, data_dir):
    """The issue's reproduction: a learning rate of 1e9 makes the weights non-finite within a step,
    and with an evaluation at every iteration the next one would have saved them."""
    T.train(tiny(tmp_path, data_dir, max_iters=4, eval_interval=2), verbose=False)
    path = tmp_path / "out" / CHECKPOINT_NAME
    good = path.read_bytes()
    with pytest.raises(T.NonFiniteLossError, match="is kept as it was"):
        T.train(tiny(tmp_path, data_dir, init_from="resume", max_iters=40, eval_interval=1, learning_rate=1e9,
                     lr_decay_iters=40), verbose=False)
    assert path.read_bytes() == good


def corrupt_weights_after_step(monkeypatch, step):
    """Make the optimizer step number `step` (1-based) leave NaN in one weight."""
    monkeypatch.setattr(torch.optim.AdamW, "step", nan_after_step(torch.optim.AdamW.step, step))


def test_nan_weights_before_an_evaluation_are_not_saved(tmp_path, data_dir, monkeypatch):
    corrupt_weights_after_step(monkeypatch, 8)  # the step to iteration 8, an evaluation (and a save)
    with pytest.raises(T.NonFiniteLossError, match="iteration 8"):
        T.train(tiny(tmp_path, data_dir, max_iters=12, eval_interval=4, lr_decay_iters=12), verbose=False)
    ckpt = load_checkpoint(tmp_path / "out")
    assert ckpt["iter_num"] == 4 and all(torch.isfinite(v).all() for v in ckpt["model"].values())


def test_nan_weights_are_not_saved_on_a_signal_either(tmp_path, data_dir, monkeypatch):
    corrupt_weights_after_step(monkeypatch, 6)
    real_forward = GPT.forward
    calls = {"train": 0}

    def forward(self, idx, targets=None, **kwargs):
        if self.training and targets is not None:
            calls["train"] += 1
            if calls["train"] == 6:  # iteration 5: the one whose step corrupts the weights
                os.kill(os.getpid(), signal.SIGTERM)
        return real_forward(self, idx, targets, **kwargs)

    monkeypatch.setattr(GPT, "forward", forward)
    with pytest.raises(T.NonFiniteLossError, match="holds NaN or inf values .*SIGTERM"):
        T.train(tiny(tmp_path, data_dir, max_iters=50, eval_interval=4, lr_decay_iters=50), verbose=False)
    assert load_checkpoint(tmp_path / "out")["iter_num"] == 4


def test_nan_loss_from_command_line_exits_with_message(tmp_path, data_dir, monkeypatch, capsys):
    monkeypatch.setattr(GPT, "forward", lambda self, idx, targets=None, **kw: (None, torch.tensor(float("inf"), requires_grad=True)))
    cfg = tiny(tmp_path, data_dir, max_iters=3, eval_interval=100)
    assert T.main([f"--{k}={v!r}" for k, v in cfg.items()]) == 1
    out, err = capsys.readouterr()
    assert "iteration 0" in err and "done:" not in out  # a diverged run is not done


def test_a_ctrl_c_before_the_run_handles_signals_is_one_error_line(tmp_path, data_dir, monkeypatch, capsys):
    """While the config and data are read, Python's own KeyboardInterrupt is what a Ctrl-C raises."""
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(T, "check_data", interrupted)
    assert T.main([f"--{k}={v!r}" for k, v in tiny(tmp_path, data_dir).items()]) == 130
    assert capsys.readouterr().err == "error: stopped by Ctrl-C; the last checkpoint saved in out_dir, if any, is whole\n"


def test_the_last_line_of_a_run_stopped_before_any_evaluation_says_so(tmp_path, data_dir, monkeypatch, capsys):
    real_forward = GPT.forward

    def forward(self, idx, targets=None, **kwargs):  # a Ctrl-C in the first step of each run
        if self.training and targets is not None and not calls:
            calls.append(1)
            os.kill(os.getpid(), signal.SIGINT)
        return real_forward(self, idx, targets, **kwargs)

    monkeypatch.setattr(GPT, "forward", forward)
    cfg = tiny(tmp_path, data_dir, max_iters=50, eval_interval=100)
    for init_from, last_line in (
            ("scratch", r"done: 1 iteration in [\d.]+s, val loss \d\.\d{4} when last evaluated, at iteration 0"),
            ("resume", r"done: 1 iteration in [\d.]+s, no evaluation in this run")):
        calls = []
        T.train({**cfg, "init_from": init_from})
        out = capsys.readouterr().out
        assert re.fullmatch(last_line, out.splitlines()[-1])
    assert "resuming from " + str(tmp_path / "out" / "ckpt.pt") + " at iteration 1 (best val loss none saved yet)" in out


def test_the_last_line_gives_the_final_val_loss_as_the_evaluation_printed_it(tmp_path, data_dir, capsys):
    """round(loss, 4) dropped trailing zeros: 'val loss 3.4230' above, 'final val loss 3.423' below."""
    T.train(tiny(tmp_path, data_dir))
    lines = capsys.readouterr().out.splitlines()
    last_eval = [line for line in lines if line.startswith("step 8: ")][-1]
    assert lines[-1].endswith(f", final val loss {last_eval.split('val loss ')[1]}")
    summary = {"final_val_loss": 3.42300001, "final_losses_iter": 35, "iterations": 35}
    assert runlog.last_evaluation(summary) == "final val loss 3.4230"
    assert runlog.last_evaluation({**summary, "iterations": 40}) == "val loss 3.4230 when last evaluated, at iteration 35"


@pytest.mark.parametrize("attention, tie_embeddings", [("standard", True), ("super", False)])
def test_the_model_size_is_printed_before_training(tmp_path, data_dir, capsys, attention, tie_embeddings):
    summary = T.train(tiny(tmp_path, data_dir, attention=attention, tie_embeddings=tie_embeddings, max_iters=1))
    tied = " (the tied head counted once)" if tie_embeddings else ""
    assert (f"\nmodel: {attention} attention, {summary['n_params']:,} parameters{tied}, "
            f"{summary['flops_per_token']:,} training FLOPs per token\nstep 0: ") in capsys.readouterr().out


def test_what_a_config_asks_for_but_seldom_means_is_noted(tmp_path, data_dir, capsys):
    cfg = tiny(tmp_path, data_dir, max_iters=4, lr_decay_iters=8, warmup_iters=2)
    T.train(cfg)
    assert ("note: the run stops at max_iters=4, before its learning-rate schedule ends (warmup_iters=2, "
            "lr_decay_iters=8): its last step's rate is") in capsys.readouterr().out
    T.train({**cfg, "eval_only": True, "dtype": "float16"})
    out = capsys.readouterr().out
    assert (f"note: eval_only with init_from='scratch' evaluates a new, untrained model; --init_from=resume "
            f"evaluates {tmp_path / 'out' / 'ckpt.pt'}") in out
    assert "note: float16 on the CPU is emulated, many times slower than float32 or bfloat16" in out
    T.train({**cfg, "eval_only": True, "init_from": "resume"})  # trains nothing, and changes no setting
    assert "note:" not in capsys.readouterr().out
    T.train({**cfg, "max_iters": 0, "out_dir": str(tmp_path / "no_steps")})  # no last step to give the rate of
    assert "note:" not in capsys.readouterr().out
    # without hellaswag_interval the file would be silently unused
    T.train({**cfg, "hellaswag_file": "hs.jsonl", "out_dir": str(tmp_path / "hellaswag")})
    assert ("note: hellaswag_file='hs.jsonl' is not scored, as hellaswag_interval=0 (off); set "
            "--hellaswag_interval=N to score it every N iterations") in capsys.readouterr().out
    # settings that another one makes unused
    T.train({**cfg, "hellaswag_limit": 5, "mlp": "swiglu", "intermediate_size": 40, "gelu_approximate": "tanh",
             "out_dir": str(tmp_path / "unused")})
    out = capsys.readouterr().out
    assert "note: hellaswag_limit=5 is unused: no hellaswag_file is scored" in out
    assert "note: gelu_approximate='tanh' is unused: mlp='swiglu' has no GELU" in out


def test_a_resume_notes_the_settings_changed_since_its_checkpoint(tmp_path, data_dir, capsys):
    """A forgotten override resumes with another learning rate or batch: said, not refused."""
    T.train(tiny(tmp_path, data_dir, max_iters=4, learning_rate=3e-3, batch_size=3), verbose=False)
    T.train(tiny(tmp_path, data_dir, max_iters=8, init_from="resume"))
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: changed")]
    assert notes == ["note: changed since the checkpoint: batch_size 3 -> 4, learning_rate 0.003 -> 0.001, max_iters 4 -> 8"]


@pytest.mark.parametrize("case, failing_save, kept", [
    ("this run's", 2, "out/ckpt.pt, this run's last checkpoint, is as it was. Make room (or fix the folder), then "
                      "continue from it with --init_from=resume"),
    ("none", 1, "this run has no checkpoint yet. Make room (or fix the folder), then start the run again"),
    ("an earlier run's", 1, "out/ckpt.pt is still the earlier run's, as it was. Make room (or fix the folder), then "
                            "start the run again"),
])
def test_a_full_disk_at_a_save_is_one_error_line_and_keeps_the_last_checkpoint(case, failing_save, kept, tmp_path,
                                                                                 data_dir, monkeypatch, capsys):
    out = tmp_path / "out"
    if case == "an earlier run's":
        T.train(tiny(tmp_path, data_dir, max_iters=2, eval_interval=2), verbose=False)
    kept_files = (CHECKPOINT_NAME, "log.jsonl", "summary.json")
    before = {name: (out / name).read_bytes() for name in kept_files if (out / name).exists()}
    real_save, saves = torch.save, []

    def save(obj, f, *args, **kwargs):
        saves.append(f)
        if len(saves) == failing_save:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    monkeypatch.chdir(tmp_path)
    cfg = tiny(tmp_path, data_dir, out_dir="out", max_iters=8, eval_interval=4)
    assert T.main([f"--{k}={v!r}" for k, v in cfg.items()]) == 1
    err = capsys.readouterr().err
    iteration = 4 * failing_save
    assert err == (f"error: could not save the evaluation checkpoint at iteration {iteration}: [Errno 28] No space "
                   f"left on device; {kept}\n")
    assert not list(out.glob("*.tmp"))
    if case == "this run's":
        assert load_checkpoint(out)["iter_num"] == 4
    else:
        assert {name: (out / name).read_bytes() for name in before} == before
        assert (out / CHECKPOINT_NAME).exists() == (case == "an earlier run's")


def test_a_full_disk_at_a_log_write_is_one_error_line(tmp_path, data_dir, monkeypatch, capsys):
    real_write, records = RunLog.write, []

    def write(self, record):
        records.append(record)
        if len(records) == 7:  # after the save at iteration 4
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        real_write(self, record)

    monkeypatch.setattr(RunLog, "write", write)
    cfg = tiny(tmp_path, data_dir, max_iters=8, eval_interval=4)
    assert T.main([f"--{k}={v!r}" for k, v in cfg.items()]) == 1
    assert capsys.readouterr().err == (f"error: [Errno 28] No space left on device: '{tmp_path / 'out' / 'log.jsonl'}'; "
                                       f"the last checkpoint saved in out_dir, if any, is whole\n")
    assert load_checkpoint(tmp_path / "out")["iter_num"] == 4


def test_sigint_finishes_the_step_and_saves(tmp_path, data_dir, monkeypatch):
    real_forward = GPT.forward
    calls = {"train": 0}

    def forward(self, idx, targets=None, **kwargs):
        if self.training and targets is not None:
            calls["train"] += 1
            if calls["train"] == 5:  # the first micro-step of iteration 2 (2 micro-steps each)
                os.kill(os.getpid(), signal.SIGINT)
        return real_forward(self, idx, targets, **kwargs)

    monkeypatch.setattr(GPT, "forward", forward)
    summary = T.train(tiny(tmp_path, data_dir, max_iters=50, eval_interval=100, gradient_accumulation_steps=2,
                           always_save_checkpoint=False), verbose=False)
    assert summary["stop_reason"] == "SIGINT" and summary["iterations"] == 3
    assert load_checkpoint(tmp_path / "out")["iter_num"] == 3
    assert calls["train"] == 6  # the interrupted step was completed, no more


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path, data_dir):
    cfg = tiny(tmp_path, data_dir, max_iters=100000, eval_interval=100000, lr_decay_iters=100000)
    proc = subprocess.Popen([sys.executable, str(REPO / "train.py"), *[f"--{k}={v!r}" for k, v in cfg.items()]],
                            cwd=tmp_path, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "out" / "log.jsonl"
    deadline = time.time() + 90
    while time.time() < deadline:
        if log_records_so_far(log) >= 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "received SIGTERM" in stdout
    ckpt = load_checkpoint(tmp_path / "out")
    last = read_log(tmp_path / "out")[-1]
    assert ckpt["iter_num"] == last["iter"] >= 3
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["stop_reason"] == "SIGTERM"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_while_waiting_for_the_other_ranks_ends_the_process(sig, tmp_path, data_dir):
    """Rank 0 of two waits in init_process_group for a rank 1 that never comes (it failed to start, or
    its node is late): a SIGTERM (a scheduler's, torchrun's) or Ctrl-C ends it, although no Python
    handler runs during that wait; nothing was trained, so nothing is lost."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(subprocess_env(), RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    args = [f"--{k}={v!r}" for k, v in tiny(tmp_path, data_dir, gradient_accumulation_steps=2).items()]
    proc = subprocess.Popen([sys.executable, str(REPO / "train.py"), *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 90
    while proc.poll() is None and time.time() < deadline:  # until rank 0's store listens: it is waiting
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(sig)
    try:
        stderr = proc.communicate(timeout=30)[1]
    finally:
        proc.kill()
    assert proc.returncode == -sig, stderr[-3000:]
    assert not (tmp_path / "out").exists()


def send_signal_during_iteration(monkeypatch, iteration, sig=signal.SIGINT):
    """Deliver `sig` during the forward pass of the run's iteration `iteration` (0-based, counted from
    where the run starts, one micro-step each); sig=None: die there, as a SIGKILL would stop it."""
    real_forward = GPT.forward
    calls = {"train": 0}

    def forward(self, idx, targets=None, **kwargs):
        if self.training and targets is not None:
            calls["train"] += 1
            if calls["train"] == iteration + 1:
                if sig is None:
                    raise KeyboardInterrupt
                os.kill(os.getpid(), sig)
        return real_forward(self, idx, targets, **kwargs)

    monkeypatch.setattr(GPT, "forward", forward)


def log_records(out_dir, kind):
    return [r["iter"] for r in read_log(out_dir) if r["type"] == kind]


def test_resume_from_a_signal_on_an_evaluation_boundary_still_evaluates(tmp_path, data_dir, monkeypatch):
    send_signal_during_iteration(monkeypatch, 3)  # stops with iter_num 4, before iteration 4's evaluation
    summary = T.train(tiny(tmp_path, data_dir, max_iters=8, eval_interval=4), verbose=False)
    assert summary["stop_reason"] == "SIGINT" and summary["iterations"] == 4
    monkeypatch.undo()
    T.train(tiny(tmp_path, data_dir, max_iters=8, eval_interval=4, init_from="resume"), verbose=False)
    assert log_records(tmp_path / "out", "eval") == [0, 4, 8]


def test_a_signal_in_the_last_iteration_leaves_the_final_evaluation_to_the_resume(tmp_path, data_dir, monkeypatch):
    cfg = tiny(tmp_path, data_dir, max_iters=8, eval_interval=4)
    send_signal_during_iteration(monkeypatch, 7)  # stops at iter_num 8 = max_iters, before the final evaluation
    assert T.train(cfg, verbose=False)["stop_reason"] == "SIGINT"
    monkeypatch.undo()
    summary = T.train({**cfg, "init_from": "resume"}, verbose=False)
    assert summary["stop_reason"] == "max_iters" and summary["final_val_loss"] is not None
    assert log_records(tmp_path / "out", "eval") == [0, 4, 8]
    assert load_checkpoint(tmp_path / "out")["evaluated"]  # so that a third run has nothing to do
    T.train({**cfg, "init_from": "resume"}, verbose=False)
    assert log_records(tmp_path / "out", "eval") == [0, 4, 8]


def test_a_new_run_replaces_an_earlier_runs_files_only_when_it_first_saves(tmp_path, data_dir, monkeypatch):
    """The same command without --init_from=resume, stopped by a Ctrl-C before its first save, leaves the
    earlier run's checkpoint, log and summary as they were; once it saves, they are its own."""
    cfg = tiny(tmp_path, data_dir, max_iters=8, eval_interval=4)
    T.train(cfg, verbose=False)
    out = tmp_path / "out"
    earlier = {name: (out / name).read_bytes() for name in (CHECKPOINT_NAME, "log.jsonl", "summary.json")}
    send_signal_during_iteration(monkeypatch, 1)
    summary = T.train(cfg, verbose=False)
    assert summary["stop_reason"] == "SIGINT" and summary["iterations"] == 2
    assert {name: (out / name).read_bytes() for name in earlier} == earlier
    monkeypatch.undo()
    send_signal_during_iteration(monkeypatch, 5)  # after the save at iteration 4
    T.train(cfg, verbose=False)
    assert load_checkpoint(out)["iter_num"] == 6 and log_records(out, "eval") == [0, 4]
    assert json.loads((out / "summary.json").read_text())["iterations"] == 6


def test_the_evaluation_a_resume_owed_is_saved_before_it_trains_on(tmp_path, data_dir, monkeypatch):
    cfg = tiny(tmp_path, data_dir, max_iters=8, eval_interval=4, always_save_checkpoint=False)
    send_signal_during_iteration(monkeypatch, 3)  # stops at 4, before iteration 4's evaluation
    T.train(cfg, verbose=False)
    monkeypatch.undo()
    send_signal_during_iteration(monkeypatch, 1, sig=None)  # the resumed run dies in iteration 5
    with pytest.raises(KeyboardInterrupt):
        T.train({**cfg, "init_from": "resume"}, verbose=False)
    ckpt = load_checkpoint(tmp_path / "out")
    assert ckpt["iter_num"] == 4 and ckpt["evaluated"]
    monkeypatch.undo()
    T.train({**cfg, "init_from": "resume"}, verbose=False)
    assert log_records(tmp_path / "out", "eval") == [0, 4, 8]  # iteration 4's evaluation once


def test_resume_after_an_evaluation_does_not_repeat_it(tmp_path, data_dir):
    T.train(tiny(tmp_path, data_dir, max_iters=4, eval_interval=4), verbose=False)
    T.train(tiny(tmp_path, data_dir, max_iters=8, eval_interval=4, init_from="resume"), verbose=False)
    assert log_records(tmp_path / "out", "eval") == [0, 4, 8]


def test_resume_drops_log_records_past_the_checkpoint(tmp_path, data_dir, monkeypatch):
    out = tmp_path / "out"
    T.train(tiny(tmp_path, data_dir, max_iters=4, eval_interval=4), verbose=False)

    def killed(*args, **kwargs):  # the process dies while saving at iteration 6: ckpt.pt stays at 4
        raise KeyboardInterrupt

    monkeypatch.setattr(T, "save_checkpoint", killed)
    with pytest.raises(KeyboardInterrupt):
        T.train(tiny(tmp_path, data_dir, max_iters=8, eval_interval=6, init_from="resume"), verbose=False)
    assert log_records(out, "train")[-2:] == [5, 6] and load_checkpoint(out)["iter_num"] == 4
    with open(out / "log.jsonl", "a") as f:
        f.write('{"type": "train", "it')  # a line torn by the kill
    monkeypatch.undo()
    T.train(tiny(tmp_path, data_dir, max_iters=8, eval_interval=4, init_from="resume"), verbose=False)
    assert log_records(out, "train") == list(range(1, 9))  # one record per iteration, as one run writes
    assert log_records(out, "eval") == [0, 4, 8]


def test_a_resumed_runs_wall_time_and_speed_count_its_kept_steps_once(tmp_path, data_dir, monkeypatch):
    """A run killed while saving at 4, after its checkpoint at 2 (its steps 3 and 4 are redone), then
    resumed: its summary's wall time, ms/iter and log times cover both processes up to what the run
    kept, each process's first step (its warm-up) left out of the speed, as one process's would be."""
    out, saves = tmp_path / "out", []

    def dies_at_the_second_save(checkpoint, path):
        saves.append(checkpoint["iter_num"])
        if len(saves) == 2:
            raise KeyboardInterrupt
        save_checkpoint(checkpoint, path)

    monkeypatch.setattr(T, "save_checkpoint", dies_at_the_second_save)
    with pytest.raises(KeyboardInterrupt):
        T.train(tiny(tmp_path, data_dir, max_iters=8, eval_interval=2), verbose=False)
    kept = load_checkpoint(out)["totals"]
    assert saves == [2, 4] and kept["timed_steps"] == 1  # steps 1 and 2: the first is the warm-up
    monkeypatch.undo()
    summary = T.train(tiny(tmp_path, data_dir, max_iters=8, eval_interval=2, init_from="resume"), verbose=False)
    assert summary["iterations_this_run"] == 6
    assert summary["wall_time_s"] == pytest.approx(kept["wall_time_s"] + summary["wall_time_this_run_s"])
    steps = {r["iter"]: r for r in read_log(out) if r["type"] == "train"}
    timed = [steps[i]["ms_per_iter"] for i in (2, 4, 5, 6, 7, 8)]  # not 1 nor 3, each process's first
    assert summary["mean_ms_per_iter"] == pytest.approx(sum(timed) / len(timed))
    times = [r["elapsed_s"] for r in read_log(out)]
    assert times == sorted(times) and times[-1] > kept["wall_time_s"]  # the resume goes on from the first's time
    assert summary["setups"] == ["1 x cpu, float32"]
    moved = T.train(tiny(tmp_path, data_dir, max_iters=10, eval_interval=2, init_from="resume", dtype="bfloat16"),
                    verbose=False)
    assert moved["setups"] == ["1 x cpu, float32", "1 x cpu, bfloat16"]  # its speed mixes the two


def test_a_resumed_runs_peak_memory_is_the_highest_of_its_processes(tmp_path, data_dir, monkeypatch):
    """summary.json's peak memory covers every process that trained the run, the checkpoint carrying the
    earlier ones', whether the resumed process peaks lower or higher."""
    cfg = tiny(tmp_path, data_dir, eval_interval=2)
    for max_iters, peak, summarised in ((4, 5 << 20, 5 << 20), (6, 3 << 20, 5 << 20), (8, 7 << 20, 7 << 20)):
        monkeypatch.setattr(runlog, "peak_memory_bytes", lambda device, peak=peak: peak)
        init_from = "scratch" if max_iters == 4 else "resume"
        summary = T.train({**cfg, "max_iters": max_iters, "init_from": init_from}, verbose=False)
        assert summary["peak_memory_bytes"] == summarised


def test_a_new_run_starts_a_log_left_without_a_checkpoint_anew(tmp_path, data_dir):
    """A run killed before its first save leaves log.jsonl without ckpt.pt: the next run's log holds its own
    records only, not the dead run's before them."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "log.jsonl").write_text(json.dumps({"type": "train", "iter": 1, "loss": 9.0}) + "\n")
    T.train(tiny(tmp_path, data_dir, max_iters=2, eval_interval=2), verbose=False)
    assert [(r["type"], r["iter"]) for r in read_log(out)] == [("eval", 0), ("train", 1), ("train", 2), ("eval", 2)]
    assert read_log(out)[1]["loss"] != 9.0


def test_a_summary_that_is_missing_or_torn_reads_as_none(tmp_path):
    """What a resume reads to tell whether the run has finished: a summary.json cut short (by a disk that
    filled, or an editor) is no summary, not a traceback."""
    assert runlog.read_summary(tmp_path) is None
    (tmp_path / "summary.json").write_text('{"run_id": "0123", "stop_reason": "max_')
    assert runlog.read_summary(tmp_path) is None
    (tmp_path / "summary.json").write_text('{"run_id": "0123"}\n')
    assert runlog.read_summary(tmp_path) == {"run_id": "0123"}


# -----------------------------------------------------------------------------
# hooks and the quick start

def test_hellaswag_hook_is_optional(tmp_path, data_dir, monkeypatch):
    import types

    import eval_hellaswag

    fake = types.ModuleType("eval_hellaswag")
    fake.accuracies_line = eval_hellaswag.accuracies_line
    fake.examples_for_training = lambda path, limit, meta, say: (["example"] * 3, None)
    fake.evaluate = lambda model, examples, tokenizer, device, batch_size, rank, world_size: dict(
        acc=1 / 3, acc_norm=2 / 3, acc_char_norm=2 / 3, acc_harness=None, n=3,
        correct={"acc": 1, "acc_norm": 2, "acc_char_norm": 2}, n_endings_truncated=0, block_size=16)
    monkeypatch.setitem(sys.modules, "eval_hellaswag", fake)
    hellaswag_file = tmp_path / "x.jsonl"
    hellaswag_file.touch()
    T.train(tiny(tmp_path, data_dir, max_iters=4, hellaswag_interval=2, hellaswag_file=str(hellaswag_file)), verbose=False)
    records = read_log(tmp_path / "out")
    hs = [r for r in records if r["type"] == "hellaswag"]
    assert [r["iter"] for r in hs] == [2, 4] and hs[0]["acc_norm"] == 2 / 3 and hs[0]["n"] == 3

    monkeypatch.setitem(sys.modules, "eval_hellaswag", None)  # import fails: train on without it
    summary = T.train(tiny(tmp_path / "b", data_dir, max_iters=2, hellaswag_interval=1, hellaswag_file=str(hellaswag_file)),
                      verbose=False)
    assert summary["iterations"] == 2


def test_hellaswag_line_during_training_reads_as_eval_hellaswags(tmp_path, data_dir, monkeypatch, capsys):
    """The printed line gives each accuracy with its counts and n/a for a metric not computed, not the
    result dict's Python repr ("acc_char_norm None", "correct {'acc': 1, ...}")."""
    import types

    import eval_hellaswag

    fake = types.ModuleType("eval_hellaswag")
    fake.accuracies_line = eval_hellaswag.accuracies_line
    fake.examples_for_training = lambda path, limit, meta, say: (["example"] * 6, None)
    fake.evaluate = lambda model, examples, tokenizer, device, batch_size, rank, world_size: dict(
        acc=1 / 6, acc_norm=2 / 6, acc_char_norm=None, acc_harness=None, n=6, correct={"acc": 1, "acc_norm": 2},
        n_endings_truncated=3, block_size=16)
    monkeypatch.setitem(sys.modules, "eval_hellaswag", fake)
    hellaswag_file = tmp_path / "x.jsonl"
    hellaswag_file.touch()
    T.train(tiny(tmp_path, data_dir, max_iters=2, eval_interval=2, hellaswag_interval=2,
                 hellaswag_file=str(hellaswag_file)))
    [line] = [line for line in capsys.readouterr().out.splitlines() if "hellaswag acc" in line]
    assert line == ("iter 2: hellaswag acc 0.1667 (1/6), acc_norm 0.3333 (2/6), acc_char_norm n/a, acc_harness n/a, "
                    "3 endings were longer than block_size and only partly scored")
    assert [r for r in read_log(tmp_path / "out") if r["type"] == "hellaswag"][0]["correct"] == {"acc": 1, "acc_norm": 2}


def test_a_missing_hellaswag_file_is_refused_before_training(tmp_path, data_dir):
    with pytest.raises(T.ConfigError, match=r"config key 'hellaswag_file'='hs.jsonl': no such file \(docs/hellaswag.md"):
        T.train(tiny(tmp_path, data_dir, hellaswag_interval=2, hellaswag_file="hs.jsonl"), verbose=False)
    assert not (tmp_path / "out").exists()


def test_quickstart_config_runs(tmp_path):
    from prepare_char import stdlib_corpus

    d = tmp_path / "data" / "stdlib_char"
    prepare(stdlib_corpus(max_chars=300_000), d, "stdlib")
    config = T.get_config([str(REPO / "config" / "quickstart.py"), f"--data_dir={str(d)!r}",
                           f"--out_dir={str(tmp_path / 'out-quickstart')!r}", "--max_iters=6", "--eval_interval=3",
                           "--eval_iters=2", "--log_interval=1", "--device='cpu'"])
    summary = T.train(config, verbose=False)
    assert summary["iterations"] == 6
    ckpt = load_checkpoint(tmp_path / "out-quickstart")
    assert ckpt["meta"]["tokenizer"] == "char" and ckpt["iter_num"] == 6
