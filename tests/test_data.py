"""data.py's batches: each target is the token that follows its input, and the offsets reach every
window of the file and none past its end. (The data contract's checks are tested through train.py,
in tests/test_train.py.)"""
import numpy as np
import pytest
import torch

from data import Batches
from tokenizer import TOKEN_DTYPE


def counting_tokens(tmp_path, n):
    """A token file whose i-th token is the id i, so that a window's ids say where it starts."""
    path = tmp_path / "train.bin"
    np.arange(n, dtype=TOKEN_DTYPE).tofile(path)
    return path


def test_targets_are_the_inputs_shifted_by_one(tmp_path):
    T = 8
    batches = Batches(counting_tokens(tmp_path, 100), block_size=T, batch_size=4, device="cpu")
    offsets = batches.offsets(3, torch.Generator().manual_seed(0))
    assert offsets.shape == (3, 4)  # (micro-batches, sequences in each)
    for ix in offsets:
        x, y = batches.get(ix)
        assert x.dtype == y.dtype == torch.int64
        assert torch.equal(x, ix[:, None] + torch.arange(T))  # T tokens from each offset
        assert torch.equal(y, x + 1)


@pytest.mark.parametrize("n_windows", [1, 2])
def test_offsets_reach_every_window_and_none_past_the_end(tmp_path, n_windows):
    """A file of T + n tokens holds n windows of T inputs and T targets, starting at 0 .. n - 1."""
    T = 8
    batches = Batches(counting_tokens(tmp_path, T + n_windows), block_size=T, batch_size=16, device="cpu")
    offsets = batches.offsets(4, torch.Generator().manual_seed(0))
    assert set(offsets.flatten().tolist()) == set(range(n_windows))
    for ix in offsets:
        x, y = batches.get(ix)
        assert x.shape == y.shape == (16, T)
