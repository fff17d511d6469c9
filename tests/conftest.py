"""Shared test fixtures: where the repo and the optional ../shared folder beside it live, the tiny
models the model tests build in four shapes (GPT-2-style, Llama-style, grouped-query, one wide
head), the `slow` marker, and a CPU-only view of the machine for every test but the GPU's own."""
import os
import random
import shutil
import socket
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
TIKTOKEN_CACHE = SHARED / "tiktoken_cache"
SHAKESPEARE = SHARED / "data" / "tinyshakespeare.txt"

sys.path.insert(0, str(REPO))

import example_variant  # noqa: E402  registers the worked fifth variant, "temperature"
from model import ATTENTION_CLASSES, GPT, GPTConfig  # noqa: E402
from prepare_char import prepare  # noqa: E402

# the paper's four and the worked example: what parametrised tests run
VARIANTS = list(ATTENTION_CLASSES)

TINY = dict(block_size=16, vocab_size=37, n_layer=2, n_head=4, n_embd=32, bias=True)
LLAMA = dict(norm="rmsnorm", pos="rope", mlp="swiglu", intermediate_size=48, bias=False,
             tie_embeddings=False)
# 4 query heads share 2 key/value heads, at Llama 3's RoPE base (the other shapes use the default,
# 10000)
GQA = dict(LLAMA, n_kv_head=2, rope_theta=500000.0)
# the paper's 1B model in small: one head wider than SDPA's fused kernels take
# (model.attention_by_matmuls)
WIDE_HEAD = dict(LLAMA, n_head=1, n_embd=264)
# every variant GPT-2-style and Llama-style, grouped-query standard attention (the only one with
# W^K, W^V), and efficient with one wide head
SHAPES = ([pytest.param(attention, {}, id=f"{attention}-gpt2") for attention in VARIANTS]
          + [pytest.param(attention, LLAMA, id=f"{attention}-llama") for attention in VARIANTS]
          + [pytest.param("standard", GQA, id="standard-gqa"),
             pytest.param("efficient", WIDE_HEAD, id="efficient-wide-head")])

# The GPT-2 BPE is served offline from ../shared when it is there (tiktoken reads this variable).
if TIKTOKEN_CACHE.is_dir():
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(TIKTOKEN_CACHE))

needs_bpe = pytest.mark.skipif(
    not TIKTOKEN_CACHE.is_dir() and "TIKTOKEN_CACHE_DIR" not in os.environ,
    reason="needs the GPT-2 BPE offline: ../shared/tiktoken_cache is absent and there is no "
           "network",
)
needs_compiler = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                    reason="torch.compile on CPU needs a C++ compiler")
needs_shakespeare = pytest.mark.skipif(
    not SHAKESPEARE.is_file(),
    reason="needs ../shared/data/tinyshakespeare.txt (the real corpus; it is not committed)",
)


def tiny_model(attention, seed=0, random_alignment=True, **overrides):
    """A small model. The variants whose own parameters start where they equal efficient get random
    ones, so that the tests see the variant: super a lower-triangular W^A and bias, temperature its
    t_i."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**TINY, **overrides, "attention": attention}))
    with torch.no_grad():
        for block in model.transformer.h:
            if attention == "super" and random_alignment:
                block.attn.align_weight.copy_(
                    torch.randn_like(block.attn.align_weight).tril() * 0.3)
                block.attn.align_bias.normal_()
            if isinstance(block.attn, example_variant.TemperatureAttention):
                block.attn.log_temperature.normal_(std=0.5)
    return model.eval()


# the training tests' corpus: a few phrases in random order, so that a tiny model learns something
# in 8 steps
TEXT = "".join(
    random.Random(0).choice(["the cat sat. ", "a dog ran! ", "\n", "to be or not to be? ", "ok, "])
    for _ in range(3000)
)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """TEXT as a character-level dataset (train.bin, val.bin, meta.json), once per test module."""
    d = tmp_path_factory.mktemp("data") / "tiny_char"
    prepare(TEXT, d, "test text")
    return d


@pytest.fixture
def one_process_group(monkeypatch):
    """torchrun's environment for a world of one, so that train() shards in this process (no
    launch)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port)).items():
        monkeypatch.setenv(key, value)


def random_tokens(batch, length, seed=1, vocab=TINY["vocab_size"]):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(autouse=True)
def cpu_unless_a_gpu_test(request, monkeypatch):
    """Every test outside test_gpu.py sees the machine CI sees, one without a GPU: their
    expectations are what a CPU computes in float32 (cached == uncached sampling, exact resumes),
    which a GPU's bf16 and atomics do not keep. So on a GPU machine, device='auto' still means the
    CPU for them, in this process and in the train.py and sample.py processes they start;
    test_gpu.py tests the GPU."""
    if request.node.path.name != "test_gpu.py":
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture
def one_thread():
    """Tiny models run faster on one thread (no synchronisation), and much more so on a busy
    machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_configure(config):
    # `pytest -m "not slow"` is the fast subset; CI runs everything.
    config.addinivalue_line("markers", "slow: takes over ~5 s on 2 CPU cores "
                            "(torch.compile, torchrun, real corpora, sweeps)")
    # torch.compile imports torch.utils.mkldnn, whose own TorchScript classes warn at import: not
    # ours to fix
    config.addinivalue_line("filterwarnings",
                            "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
