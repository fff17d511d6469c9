"""Sharded training with FSDP2 (distributed.py): two CPU processes (gloo) train what one process
trains, resume exactly from the sharded checkpoint, and export a ckpt.pt that sample.py reads.

Each torchrun launch costs a few seconds of start-up, so the runs are few and shared: one 2-process
FSDP run (module fixture) serves the equality, export and sampling tests."""
import json
import subprocess
import sys

import pytest
import torch

import train as T
from checkpoint import CHECKPOINT_NAME, load_checkpoint, load_model_and_tokenizer
from conftest import REPO
from distributed import SHARDED_NAME, TRAIN_STATE_NAME
from test_train import data_dir, params, subprocess_env, tiny  # noqa: F401  data_dir is a fixture

# 3 iterations of 4 micro-batches: 2 per process under FSDP, all 4 in the single process
COMMON = dict(max_iters=3, eval_interval=3, gradient_accumulation_steps=4, batch_size=3)
LLAMA = dict(norm="rmsnorm", pos="rope", mlp="swiglu", intermediate_size=48, tie_embeddings=False)


def torchrun(tmp_path, config, nproc=2):
    """Run train.py under torchrun with `config` as --key=value overrides; return its stdout."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    args = [f"--{k}={v!r}" for k, v in config.items()]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(REPO / "train.py"), *args]
    result = subprocess.run(cmd, cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def train_losses(out_dir):
    records = [json.loads(line) for line in (out_dir / "log.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["type"] == "train"]


def assert_same_params(a, b, **tolerance):
    assert a.keys() == b.keys()
    for key in a:
        if tolerance:
            torch.testing.assert_close(a[key], b[key], msg=key, **tolerance)
        else:
            assert torch.equal(a[key], b[key]), key


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory, data_dir):  # noqa: F811
    """One 2-process FSDP run of the tiny GPT-2-style model: its out_dir."""
    tmp = tmp_path_factory.mktemp("fsdp")
    torchrun(tmp, tiny(tmp, data_dir, **COMMON, parallelism="fsdp"))
    return tmp / "out"


def test_fsdp_equals_single_process(fsdp_run, tmp_path, data_dir):  # noqa: F811
    T.train(tiny(tmp_path, data_dir, **COMMON), verbose=False)
    single = tmp_path / "out"
    # float tolerance: the shards reduce-scatter the gradients in another order than one process sums them
    assert_same_params(params(fsdp_run), params(single), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(train_losses(fsdp_run), train_losses(single), rtol=1e-5, atol=0)
    summary = json.loads((fsdp_run / "summary.json").read_text())
    single_summary = json.loads((single / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["iterations"] == 3
    # sharded parameters count as whole ones (DTensor numel is the global size)
    assert summary["n_params"] == single_summary["n_params"]
    assert summary["flops_per_token"] == single_summary["flops_per_token"]
    assert summary["final_val_loss"] == pytest.approx(single_summary["final_val_loss"], rel=1e-4)


def test_fsdp_writes_sharded_folder_and_consolidated_export(fsdp_run):
    folder = fsdp_run / SHARDED_NAME
    assert (folder / ".metadata").is_file() and len(list(folder.glob("*.distcp"))) == 2  # one shard file per rank
    assert not (fsdp_run / (SHARDED_NAME + ".tmp")).exists() and not (fsdp_run / (SHARDED_NAME + ".old")).exists()
    state = torch.load(folder / TRAIN_STATE_NAME, weights_only=True)
    assert state["iter_num"] == 3 and len(state["rng"]["torch"]) == 2  # both ranks' dropout streams
    ckpt = load_checkpoint(fsdp_run)
    assert ckpt["iter_num"] == 3 and ckpt["sharded"] == SHARDED_NAME
    assert "optimizer" not in ckpt  # the optimizer state stays sharded
    # the full model, whole tensors, the tied head included: a plain GPT loads it strictly
    model = T.GPT(T.GPTConfig(**ckpt["model_args"]))
    model.load_state_dict(ckpt["model"])
    assert ckpt["model"]["lm_head.weight"].shape == (ckpt["model_args"]["vocab_size"], 32)


def test_sample_py_reads_the_fsdp_export(fsdp_run):
    model, tokenizer, info = load_model_and_tokenizer("resume", fsdp_run)
    assert info["iter_num"] == 3
    start = tokenizer.decode([1, 2])  # two characters of the tiny vocabulary
    out = subprocess.run([sys.executable, str(REPO / "sample.py"), f"--out_dir={fsdp_run}", "--device=cpu",
                          "--num_samples=1", "--max_new_tokens=20", f"--start={start}", "--seed=1"],
                         env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert start in out.stdout


def test_fsdp_resume_is_exact(tmp_path, data_dir):  # noqa: F811
    """8 iterations straight == 4, then a resume from the sharded checkpoint for 4 more, with dropout
    (per-rank RNG streams) and gradient accumulation (2 micro-steps per process)."""
    common = dict(max_iters=8, eval_interval=4, gradient_accumulation_steps=4, dropout=0.1, parallelism="fsdp")
    torchrun(tmp_path / "straight", tiny(tmp_path / "straight", data_dir, **common))
    torchrun(tmp_path / "split", tiny(tmp_path / "split", data_dir, **{**common, "max_iters": 4}))
    assert load_checkpoint(tmp_path / "split" / "out")["iter_num"] == 4
    stdout = torchrun(tmp_path / "split", tiny(tmp_path / "split", data_dir, **common, init_from="resume"))
    assert "resuming" in stdout and "at iteration 4" in stdout
    straight, split = tmp_path / "straight" / "out", tmp_path / "split" / "out"
    assert_same_params(params(straight), params(split))
    assert train_losses(straight) == train_losses(split)


def test_fsdp_export_is_not_a_ddp_resume_point(fsdp_run, tmp_path, data_dir):  # noqa: F811
    with pytest.raises(T.CheckpointError, match="parallelism='fsdp'"):
        T.load_resume_checkpoint(fsdp_run, load_checkpoint(fsdp_run)["model_args"])


def test_fsdp_config_errors():
    with pytest.raises(T.ConfigError, match="parallelism"):
        T.resolve_config(dict(parallelism="zero3"))
    with pytest.raises(T.ConfigError, match="float16"):
        T.resolve_config(dict(parallelism="fsdp", dtype="float16"))
    with pytest.raises(T.ConfigError, match="hellaswag_interval"):
        T.resolve_config(dict(parallelism="fsdp", hellaswag_interval=10, hellaswag_file="h.jsonl"))
