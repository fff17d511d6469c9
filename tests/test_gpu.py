"""The CUDA path: generation (cached, uncached, compiled) in fp32 and bf16, a training step against
the CPU, compiled against eager training, and a torchrun + NCCL run that resumes. Every test here
needs a CUDA GPU and is skipped without one; on a GPU machine run
`python -m pytest -q tests/test_gpu.py`."""
import subprocess
import sys

import pytest
import torch
from torch._dynamo.utils import counters

from conftest import REPO, VARIANTS
from model import GPT, GPTConfig
from prepare_char import prepare
from runtime import autocast_context

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SHAPE = dict(block_size=32, vocab_size=97, n_layer=2, n_head=4, n_embd=64, bias=True)
# bf16 blocks compute a cached step and a full recompute with different kernels, so their hidden
# states differ in the last bits: a greedy token counts as right when its logit is within this much
# of the best one, recomputed
BF16_LOGIT_TOLERANCE = 0.05


def cuda_model(attention, seed=0, **overrides):
    """A small model on the GPU; super gets a random lower-triangular W^A, so it is not just
    efficient."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**SHAPE, **overrides}, attention=attention))
    if attention == "super":
        with torch.no_grad():
            for block in model.transformer.h:
                block.attn.align_weight.copy_(
                    torch.randn_like(block.attn.align_weight).tril() * 0.3)
                block.attn.align_bias.normal_()
    return model.cuda().eval()


def prompt(batch=2, length=5):
    return torch.randint(0, SHAPE["vocab_size"], (batch, length),
                         generator=torch.Generator().manual_seed(1)).cuda()


def assert_greedy_under_bf16(model, tokens, prompt_length):
    """Every generated token is, up to bf16 rounding, an argmax of the logits recomputed without a
    cache."""
    with torch.no_grad(), autocast_context("cuda", "bfloat16"):
        logits, _ = model(tokens[:, :-1], all_logits=True)
    logits = logits.float()[:, prompt_length - 1:]
    chosen = logits.gather(-1, tokens[:, prompt_length:, None]).squeeze(-1)
    shortfall = logits.max(dim=-1).values - chosen
    assert shortfall.max().item() <= BF16_LOGIT_TOLERANCE, shortfall


# ----------------------------------------------------------------------------- generation

@pytest.mark.parametrize("attention", VARIANTS)
def test_cached_generation_equals_uncached_fp32(attention):
    model, x = cuda_model(attention), prompt()
    steps = 2 * SHAPE["block_size"]  # past block_size: the window slides
    cached = model.generate(x, steps, top_k=1)
    uncached = model.generate(x, steps, top_k=1, use_kv_cache=False)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("attention", VARIANTS)
def test_cached_generation_is_greedy_in_bf16(attention):
    model, x = cuda_model(attention), prompt()
    # one window, so one uncached pass can recompute every step
    steps = SHAPE["block_size"] - x.size(1)
    with autocast_context("cuda", "bfloat16"):
        cached = model.generate(x, steps, top_k=1)
    assert_greedy_under_bf16(model, cached, x.size(1))


@pytest.mark.slow
@pytest.mark.parametrize("attention", VARIANTS)
def test_compiled_decode_equals_eager_decode(attention):
    """CUDA graphs (torch.compile mode='reduce-overhead') replay the same steps as the eager
    cache."""
    model, x = cuda_model(attention), prompt()
    steps = 2 * SHAPE["block_size"]
    eager = model.generate(x, steps, top_k=1)
    skips, graphs = counters["inductor"]["cudagraph_skips"], counters["stats"]["unique_graphs"]
    compiled = model.generate(x, steps, top_k=1, compile=True)
    assert torch.equal(compiled, eager)
    # the step really runs as a CUDA graph (inductor says "skipping cudagraphs" and counts it when,
    # for example, an input it mutates has no static address), and one graph serves every step
    assert counters["inductor"]["cudagraph_skips"] == skips
    assert counters["stats"]["unique_graphs"] - graphs <= 1
    torch.manual_seed(3)
    # graphs replayed, not re-made
    sampled = model.generate(x, steps, temperature=0.9, top_k=10, compile=True)
    torch.manual_seed(3)
    assert torch.equal(sampled, model.generate(x, steps, temperature=0.9, top_k=10))
    steps = SHAPE["block_size"] - x.size(1)
    with autocast_context("cuda", "bfloat16"):
        compiled_bf16 = model.generate(x, steps, top_k=1, compile=True)
    assert_greedy_under_bf16(model, compiled_bf16, x.size(1))


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["standard", "super"])
def test_compiled_decode_at_a_block_size_not_a_multiple_of_8(attention):
    """The fixed-shape step attends through a (1, block_size) boolean mask; 50 columns is not a
    multiple of 8, a case some SDPA kernels pad or refuse."""
    model, x = cuda_model(attention, block_size=50), prompt()
    eager = model.generate(x, 60, top_k=1)  # past block_size too
    assert torch.equal(model.generate(x, 60, top_k=1, compile=True), eager)


@pytest.mark.slow
def test_compiled_decoding_follows_the_model_to_another_device():
    """The cache compiled decoding keeps per model is remade on the model's new device, not written
    across."""
    model, x = cuda_model("super"), prompt()
    model.generate(x, 8, top_k=1, compile=True)
    model.cpu()
    on_cpu = model.generate(x.cpu(), 8, top_k=1, compile=True)
    assert torch.equal(on_cpu, model.generate(x.cpu(), 8, top_k=1))


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["standard", "super"])
def test_compiled_decoding_never_waits_for_the_gpu(attention):
    """The host queues a token's step while the GPU runs the last one: CUDA's sync debug mode raises
    at any call that waits for the GPU (torch.multinomial's checks did, twice a token)."""
    model, x = cuda_model(attention), prompt()
    # compiles, and records the CUDA graph
    model.generate(x, 8, temperature=0.9, top_k=5, compile=True)
    torch.cuda.set_sync_debug_mode("error")
    try:
        model.generate(x, 8, temperature=0.9, top_k=5, compile=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ----------------------------------------------------------------------------- training

def train_losses(model, device, steps=3, compile=False):
    """Losses of a few AdamW steps on fixed random batches, fp32 (TF32 off: the CPU has no TF32)."""
    model = model.to(device).train()
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), device)
    step_model = torch.compile(model) if compile else model
    batches = torch.randint(0, SHAPE["vocab_size"], (steps, 4, SHAPE["block_size"] + 1),
                            generator=torch.Generator().manual_seed(2)).to(device)
    losses = []
    for batch in batches:
        _, loss = step_model(batch[:, :-1], targets=batch[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.fixture
def no_tf32():
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


@pytest.mark.parametrize("attention", VARIANTS)
def test_training_steps_on_cuda_match_cpu(attention, no_tf32):
    cpu = train_losses(cuda_model(attention).cpu(), "cpu")
    gpu = train_losses(cuda_model(attention), "cuda")
    assert gpu == pytest.approx(cpu, rel=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("attention", VARIANTS)
def test_compiled_training_matches_eager(attention, no_tf32):
    eager = train_losses(cuda_model(attention), "cuda")
    compiled = train_losses(cuda_model(attention), "cuda", compile=True)
    assert compiled == pytest.approx(eager, rel=1e-4)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_training_iterations_that_neither_log_nor_evaluate_never_wait_for_the_gpu(dtype, tmp_path,
                                                                                  monkeypatch):
    """The host queues the next step while the GPU runs this one, as NanoGPT's loop does between its
    log steps: CUDA's sync debug mode raises at any call that waits for the GPU, over iterations 3
    to 8 of 12 (log_interval 10, no evaluation among them), with gradient clipping and, in float16,
    the GradScaler."""
    import train

    data_dir = tmp_path / "data"
    prepare("".join(f"line {i % 17}: to be or not to be.\n" for i in range(3000)), data_dir,
            "test text")
    real_get_lr = train.get_lr

    def get_lr(it, c):  # called at the start of each iteration's step
        torch.cuda.set_sync_debug_mode("error" if 3 <= it < 9 else "default")
        return real_get_lr(it, c)

    monkeypatch.setattr(train, "get_lr", get_lr)
    try:
        summary = train.train(dict(data_dir=str(data_dir), out_dir=str(tmp_path / "out"),
                                   device="cuda", dtype=dtype, compile=False, n_layer=2, n_head=2,
                                   n_embd=32, block_size=16, batch_size=4, max_iters=12,
                                   lr_decay_iters=12, warmup_iters=2, eval_interval=100,
                                   eval_iters=2, log_interval=10, grad_clip=1.0), verbose=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert summary["iterations"] == 12


@pytest.mark.slow
def test_a_head_wider_than_flash_attention_takes_trains_by_matmuls(no_tf32):
    """One head of 320 (the 1B config's is 3072) goes through model.attention_by_matmuls, not SDPA,
    whose only kernel for it is the slow memory-efficient one: fp32 steps equal the CPU's, and the
    compiled bf16 step runs no SDPA operator."""
    wide = dict(n_head=1, n_embd=320)
    cpu = train_losses(cuda_model("efficient", **wide).cpu(), "cpu")
    assert train_losses(cuda_model("efficient", **wide), "cuda") == pytest.approx(cpu, rel=1e-4)
    model = torch.compile(cuda_model("efficient", **wide).train())
    batch = prompt(4, SHAPE["block_size"] + 1)
    with autocast_context("cuda", "bfloat16"):
        model(batch[:, :-1], targets=batch[:, 1:])[1].backward()  # compiles
        with torch.profiler.profile() as profile:
            model(batch[:, :-1], targets=batch[:, 1:])[1].backward()
    assert not [e.name for e in profile.events() if e.name.startswith("aten::_scaled_dot_product")]


@pytest.mark.slow
def test_torchrun_nccl_run_resumes(tmp_path):
    """torchrun with one process takes the DDP path with NCCL; 8 steps straight equal
    4 + resume + 4. Up to float rounding only: CUDA's embedding backward adds with atomics, in no
    fixed order."""
    data_dir = tmp_path / "data"
    prepare("".join(f"line {i % 17}: to be or not to be.\n" for i in range(3000)), data_dir,
            "test text")
    settings = dict(data_dir=str(data_dir), device="cuda", dtype="float32", compile=False,
                    n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=4, max_iters=8,
                    eval_interval=4, eval_iters=2, warmup_iters=2, lr_decay_iters=8, dropout=0.1,
                    always_save_checkpoint=True)

    def run(out_dir, **overrides):
        args = [f"--{k}={v!r}"
                for k, v in {**settings, "out_dir": str(out_dir), **overrides}.items()]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
               str(REPO / "train.py"), *args]
        result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "1 process(es)" in result.stdout
        # the group knows its GPU
        assert "using the device under current context" not in result.stderr
        return torch.load(out_dir / "ckpt.pt", weights_only=True)

    straight = run(tmp_path / "straight")
    run(tmp_path / "split", max_iters=4)
    resumed = run(tmp_path / "split", init_from="resume")
    assert resumed["iter_num"] == straight["iter_num"] == 8
    for key, value in straight["model"].items():
        torch.testing.assert_close(resumed["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)
