"""Sharded training with FSDP2 (distributed.py): two CPU processes (gloo) train what one process
trains, resume exactly from the sharded checkpoint, and export a ckpt.pt that sample.py reads.

Each torchrun launch costs a few seconds of start-up, so the runs are few and shared: one 2-process
FSDP run (module fixture) serves the equality, export and sampling tests."""
import json
import shutil
import subprocess
import sys

import pytest
import torch

import train as T
from checkpoint import load_checkpoint, load_model_and_tokenizer
from conftest import REPO, WIDE_HEAD
from checkpoint import SHARDED_NAME, TRAIN_STATE_NAME
from test_train import params, subprocess_env, tiny

# 3 iterations of 4 micro-batches: 2 per process under FSDP, all 4 in the single process
COMMON = dict(max_iters=3, eval_interval=3, gradient_accumulation_steps=4, batch_size=3)
LLAMA = dict(norm="rmsnorm", pos="rope", mlp="swiglu", intermediate_size=48, tie_embeddings=False)


def torchrun(tmp_path, config, nproc=2):
    """Run train.py under torchrun with `config` as --key=value overrides; return its stdout."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    args = [f"--{k}={v!r}" for k, v in config.items()]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", str(REPO / "train.py"), *args]
    result = subprocess.run(cmd, cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
                            timeout=240)
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
def fsdp_run(tmp_path_factory, data_dir):
    """One 2-process FSDP run of the tiny GPT-2-style model: its out_dir."""
    tmp = tmp_path_factory.mktemp("fsdp")
    torchrun(tmp, tiny(tmp, data_dir, **COMMON, parallelism="fsdp"))
    return tmp / "out"


@pytest.mark.slow
def test_fsdp_equals_single_process(fsdp_run, tmp_path, data_dir):
    T.train(tiny(tmp_path, data_dir, **COMMON), verbose=False)
    single = tmp_path / "out"
    # float tolerance: the shards reduce-scatter the gradients in another order than one process
    # sums them
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
    # one shard file per rank
    assert (folder / ".metadata").is_file() and len(list(folder.glob("*.distcp"))) == 2
    assert (not (fsdp_run / (SHARDED_NAME + ".tmp")).exists()
            and not (fsdp_run / (SHARDED_NAME + ".old")).exists())
    state = torch.load(folder / TRAIN_STATE_NAME, weights_only=True)
    assert state["iter_num"] == 3 and len(state["rng"]["torch"]) == 2  # both ranks' dropout streams
    ckpt = load_checkpoint(fsdp_run)
    assert ckpt["iter_num"] == 3 and ckpt["sharded"] == SHARDED_NAME
    assert "optimizer" not in ckpt  # the optimizer state stays sharded
    # the full model, whole tensors, the tied head included: a plain GPT loads it strictly
    model = T.GPT(T.GPTConfig(**ckpt["model_args"]))
    model.load_state_dict(ckpt["model"])
    assert ckpt["model"]["lm_head.weight"].shape == (ckpt["model_args"]["vocab_size"], 32)


def test_sample_py_reads_the_fsdp_export(fsdp_run, capsys):
    import sample

    model, tokenizer, info = load_model_and_tokenizer("resume", fsdp_run)
    assert info["iter_num"] == 3
    start = tokenizer.decode([1, 2])  # two characters of the tiny vocabulary
    assert sample.main([f"--out_dir={fsdp_run}", "--device=cpu", "--num_samples=1",
                        "--max_new_tokens=20", f"--start={start}", "--seed=1"]) == 0
    assert start in capsys.readouterr().out


@pytest.mark.slow
def test_fsdp_resume_is_exact(tmp_path, data_dir):
    """8 iterations straight == 4, then a resume from the sharded checkpoint for 4 more, with
    dropout (per-rank RNG streams) and gradient accumulation (2 micro-steps per process)."""
    common = dict(max_iters=8, eval_interval=4, gradient_accumulation_steps=4, dropout=0.1,
                  parallelism="fsdp")
    torchrun(tmp_path / "straight", tiny(tmp_path / "straight", data_dir, **common))
    torchrun(tmp_path / "split", tiny(tmp_path / "split", data_dir, **{**common, "max_iters": 4}))
    assert load_checkpoint(tmp_path / "split" / "out")["iter_num"] == 4
    stdout = torchrun(tmp_path / "split",
                      tiny(tmp_path / "split", data_dir, **common, init_from="resume"))
    assert "resuming" in stdout and "at iteration 4" in stdout
    straight, split = tmp_path / "straight" / "out", tmp_path / "split" / "out"
    assert_same_params(params(straight), params(split))
    assert train_losses(straight) == train_losses(split)


def test_fsdp_export_is_not_a_ddp_resume_point(fsdp_run):
    with pytest.raises(T.CheckpointError,
                       match="is an FSDP run's export: resume it with parallelism='fsdp'"):
        T.load_resume_checkpoint(fsdp_run, load_checkpoint(fsdp_run)["model_args"])


def test_a_ddp_checkpoint_is_not_an_fsdp_resume_point(tmp_path, data_dir):
    # one process: ckpt.pt with the optimizer
    T.train(tiny(tmp_path, data_dir, max_iters=2), verbose=False)
    with pytest.raises(T.CheckpointError, match="no sharded checkpoint at .*parallelism='ddp'"):
        T.load_resume_checkpoint(tmp_path / "out", load_checkpoint(tmp_path / "out")["model_args"],
                                 sharded=True)


# train.py under FSDP where, after its 2nd optimizer step, one AdamW moment of rank 1's shard only
# is inf
INF_ON_RANK_1 = """
import os, runpy, sys, torch
real_step = torch.optim.AdamW.step
steps = []
def step(self, *args, **kwargs):
    out = real_step(self, *args, **kwargs)
    steps.append(1)
    if len(steps) == 2 and os.environ["RANK"] == "1":
        moment = self.state[self.param_groups[0]["params"][0]]["exp_avg_sq"]
        with torch.no_grad():
            moment.to_local().view(-1)[0] = float("inf")
    return out
torch.optim.AdamW.step = step
sys.path.insert(0, os.path.dirname(sys.argv[1]))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_an_inf_in_one_ranks_shard_stops_every_rank_before_the_save(tmp_path, data_dir):
    (tmp_path / "inf_on_rank_1.py").write_text(INF_ON_RANK_1)
    config = tiny(tmp_path, data_dir, max_iters=4, eval_interval=2, gradient_accumulation_steps=2,
                  parallelism="fsdp")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(tmp_path / "inf_on_rank_1.py"), str(REPO / "train.py"),
           *[f"--{k}={v!r}" for k, v in config.items()]]
    result = subprocess.run(cmd, cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
                            timeout=240)
    assert result.returncode != 0
    assert result.stderr.count("holds NaN or inf values (not saving the") == 1, \
        result.stderr[-3000:]  # rank 0
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["stop_reason"] == "diverged"
    assert not (tmp_path / "out" / SHARDED_NAME).exists()  # no checkpoint of the diverged state


def test_fsdp_config_errors():
    with pytest.raises(T.ConfigError, match="parallelism"):
        T.resolve_config(dict(parallelism="zero3"))
    with pytest.raises(T.ConfigError, match="float16"):
        T.resolve_config(dict(parallelism="fsdp", dtype="float16"))
    with pytest.raises(T.ConfigError, match="hellaswag_interval"):
        T.resolve_config(dict(parallelism="fsdp", hellaswag_interval=10, hellaswag_file="h.jsonl"))


def test_activation_checkpointing_changes_no_number(tmp_path, data_dir):
    """Recomputing each block in backward (with dropout: the same masks) gives the same losses and
    weights."""
    common = dict(max_iters=3, eval_interval=3, dropout=0.1, gradient_accumulation_steps=2)
    T.train(tiny(tmp_path / "plain", data_dir, **common), verbose=False)
    T.train(tiny(tmp_path / "ac", data_dir, **common, activation_checkpointing=True), verbose=False)
    plain, ac = tmp_path / "plain" / "out", tmp_path / "ac" / "out"
    torch.testing.assert_close(train_losses(ac), train_losses(plain), rtol=1e-6, atol=0)
    assert_same_params(params(ac), params(plain), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("shape", [pytest.param(LLAMA, id="standard"),
                                   pytest.param(dict(WIDE_HEAD, attention="efficient"),
                                                id="efficient-wide-head")])
@pytest.mark.slow
def test_llama_shape_with_activation_checkpointing_under_fsdp_equals_single_process(
        shape, tmp_path, data_dir):
    """RMSNorm, RoPE, SwiGLU and an untied head (two embedding-sized parameters in the root unit),
    sharded over 2 processes with activation checkpointing, against one plain process; also the
    paper's 1B model in small, whose one wide head goes through attention_by_matmuls."""
    torchrun(tmp_path / "fsdp", tiny(tmp_path / "fsdp", data_dir, **COMMON, **shape,
                                     parallelism="fsdp", activation_checkpointing=True))
    T.train(tiny(tmp_path / "single", data_dir, **COMMON, **shape), verbose=False)
    fsdp, single = tmp_path / "fsdp" / "out", tmp_path / "single" / "out"
    assert "lm_head.weight" in params(fsdp) and "transformer.wpe.weight" not in params(fsdp)
    assert_same_params(params(fsdp), params(single), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(train_losses(fsdp), train_losses(single), rtol=1e-5, atol=0)


def test_fsdp_bf16_mixed_precision_keeps_fp32_weights(tmp_path, data_dir, one_process_group,
                                                      monkeypatch):
    import torch.distributed.fsdp as fsdp

    real_fully_shard, policies = fsdp.fully_shard, []

    def fully_shard(module, **options):
        policies.append(options["mp_policy"])
        return real_fully_shard(module, **options)

    monkeypatch.setattr(fsdp, "fully_shard", fully_shard)
    summary = T.train(tiny(tmp_path / "bf16", data_dir, **COMMON, parallelism="fsdp",
                           dtype="bfloat16"), verbose=False)
    reference = T.train(tiny(tmp_path / "fp32", data_dir, **COMMON, parallelism="fsdp"),
                        verbose=False)
    assert summary["dtype"] == "bfloat16"
    exported = params(tmp_path / "bf16" / "out")
    # the sharded master weights stay fp32
    assert all(v.dtype == torch.float32 for v in exported.values())
    # bf16 forward and backward, fp32 reduction and update: close to fp32, not equal to it
    assert summary["final_val_loss"] == pytest.approx(reference["final_val_loss"], rel=2e-2)
    assert summary["final_val_loss"] != reference["final_val_loss"]
    bf16 = [policy for policy in policies if policy.param_dtype == torch.bfloat16]
    # 2 blocks and the root
    assert len(bf16) == 3 and all(policy.reduce_dtype == torch.float32 for policy in bf16)


def test_fsdp_compiles_each_block(tmp_path, data_dir, one_process_group, monkeypatch):
    """compile=True under FSDP compiles every Block in place (the eager backend: no C++ compiler),
    and the export keeps plain state_dict keys."""
    real_compile, compiled = torch.compile, []

    def eager_compile(fn, **kwargs):
        compiled.append(fn)
        return real_compile(fn, backend="eager")

    monkeypatch.setattr(torch, "compile", eager_compile)
    T.train(tiny(tmp_path, data_dir, max_iters=2, eval_interval=2, parallelism="fsdp",
                 compile=True), verbose=False)
    assert len(compiled) == 2  # n_layer blocks, not the whole model
    keys = params(tmp_path / "out").keys()
    assert not any("_orig_mod" in k for k in keys)


def test_activation_checkpointing_recomputes_each_block_in_backward():
    from distributed import checkpoint_activations

    def attention_calls(checkpointed):
        torch.manual_seed(0)
        model = T.GPT(T.GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11))
        if checkpointed:
            checkpoint_activations(model)
        calls = []
        for block in model.transformer.h:
            # a pre-hook: the recomputation stops early, once it has what backward needs, so
            # post-hooks may not run
            block.attn.register_forward_pre_hook(lambda *args: calls.append(1))
        x = torch.randint(11, (2, 8))
        _, loss = model(x, x)
        loss.backward()
        with torch.no_grad():
            model(x, x)  # evaluation: the plain forward, nothing kept for a backward
        return len(calls), loss.item()

    plain_calls, plain_loss = attention_calls(False)
    assert plain_calls == 2 + 2  # training forward and evaluation forward, two blocks each
    calls, loss = attention_calls(True)
    # once more per block, in backward; the same loss
    assert calls == 2 + 2 + 2 and loss == plain_loss


def test_fsdp_resumes_on_another_number_of_processes(fsdp_run, tmp_path, data_dir,
                                                     one_process_group):
    """The shards of 2 processes load into 1 (torch.distributed.checkpoint reshards): its 4th step
    is the one a single process takes after the same 3, AdamW moments included."""
    shutil.copytree(fsdp_run, tmp_path / "out")
    summary = T.train(tiny(tmp_path, data_dir, **{**COMMON, "max_iters": 4}, parallelism="fsdp",
                           init_from="resume"), verbose=False)
    assert (summary["iterations"] == 4 and summary["iterations_this_run"] == 1
            and summary["world_size"] == 1)
    assert load_checkpoint(tmp_path / "out")["iter_num"] == 4
    straight = tmp_path / "straight"
    T.train(tiny(straight, data_dir, **{**COMMON, "max_iters": 4}, parallelism="fsdp"),
            verbose=False)
    # float tolerance, as for 2 processes against 1: their reduce-scatter sums in another order
    assert_same_params(params(tmp_path / "out"), params(straight / "out"), rtol=1e-5, atol=1e-6)
    assert train_losses(tmp_path / "out")[-1] == pytest.approx(train_losses(straight / "out")[-1],
                                                               rel=1e-5)
