"""Shared test fixtures: where the repo and the optional ../shared folder beside it live."""
import os
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
from model import ATTENTION_CLASSES  # noqa: E402

VARIANTS = list(ATTENTION_CLASSES)  # the paper's four and the worked example: what parametrised tests run

# The GPT-2 BPE is served offline from ../shared when it is there (tiktoken reads this variable).
if TIKTOKEN_CACHE.is_dir():
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(TIKTOKEN_CACHE))

needs_bpe = pytest.mark.skipif(
    not TIKTOKEN_CACHE.is_dir() and "TIKTOKEN_CACHE_DIR" not in os.environ,
    reason="needs the GPT-2 BPE offline: ../shared/tiktoken_cache is absent and there is no network",
)
needs_shakespeare = pytest.mark.skipif(
    not SHAKESPEARE.is_file(),
    reason="needs ../shared/data/tinyshakespeare.txt (the real corpus; it is not committed)",
)


@pytest.fixture
def one_thread():
    """Tiny models run faster on one thread (no synchronisation), and much more so on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_configure(config):
    # `pytest -m "not slow"` is the fast subset; CI runs everything.
    config.addinivalue_line("markers", "slow: takes over ~5 s on 2 CPU cores (torch.compile, torchrun, real corpora)")
