"""data.py: batches whose targets follow their inputs, over every window of the file; the data's
edges (ids, counts, the model's vocabulary, a resume's characters); more in tests/test_train.py."""
import numpy as np
import pytest
import torch

from data import Batches, DataError, check_data, check_same_tokens, choose_vocab_size
from tokenizer import TOKEN_DTYPE, write_meta


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


def test_ids_above_int16s_range_come_back_as_written(tmp_path):
    """GPT-2 BPE ids reach 50256: the token file is read as unsigned 16-bit, not as int16 (whose ids
    from 32768 on would come back negative) nor as any other width."""
    path = tmp_path / "train.bin"
    ids = np.arange(2**16 - 40, 2**16, dtype=TOKEN_DTYPE)  # 65496 .. 65535
    ids[:10] = [0, 1, 255, 256, 32767, 32768, 50255, 50256, 50257, 60000]
    ids.tofile(path)
    batches = Batches(path, block_size=12, batch_size=3, device="cpu")
    ix = torch.tensor([0, 5, 27])
    x, y = batches.get(ix)
    expected = torch.from_numpy(ids.astype(np.int64))
    assert torch.equal(x, torch.stack([expected[i:i + 12] for i in ix]))
    assert torch.equal(y, torch.stack([expected[i + 1:i + 13] for i in ix]))


@pytest.mark.parametrize("n_windows", [1, 2])
def test_offsets_reach_every_window_and_none_past_the_end(tmp_path, n_windows):
    """A file of T + n tokens holds n windows of T inputs and T targets, starting at 0 .. n - 1."""
    T = 8
    batches = Batches(counting_tokens(tmp_path, T + n_windows), block_size=T, batch_size=16,
                      device="cpu")
    offsets = batches.offsets(4, torch.Generator().manual_seed(0))
    assert set(offsets.flatten().tolist()) == set(range(n_windows))
    for ix in offsets:
        x, y = batches.get(ix)
        assert x.shape == y.shape == (16, T)


def write_data(d, train_ids, val_ids, tokenizer="char", vocab_size=40):
    """A dataset in folder d: its two token files and the meta.json that counts them; returns d."""
    d.mkdir(parents=True, exist_ok=True)
    np.asarray(train_ids, dtype=TOKEN_DTYPE).tofile(d / "train.bin")
    np.asarray(val_ids, dtype=TOKEN_DTYPE).tofile(d / "val.bin")
    chars = "".join(chr(33 + i) for i in range(vocab_size))
    chars = {"chars": chars} if tokenizer == "char" else {}
    write_meta(d, {"tokenizer": tokenizer, "vocab_size": vocab_size, **chars,
                   "tokens": {"train": len(train_ids), "val": len(val_ids)}})
    return d


def test_the_largest_id_of_either_split_is_the_one_the_model_must_fit(tmp_path):
    d = write_data(tmp_path / "data", np.arange(50) % 20, np.arange(50) % 30, vocab_size=40)
    meta, n_tokens, max_token = check_data(d, block_size=8)
    assert (meta["vocab_size"], n_tokens, max_token) == (40, {"train": 50, "val": 50}, 29)
    ids = np.arange(50) + 262  # BPE ids from 32768 up are large, not negative
    ids[7] = 50256
    assert check_data(write_data(tmp_path / "bpe", ids, ids[::-1], "gpt2", 50257), 8)[2] == 50256


def test_data_that_meta_json_does_not_describe_is_refused(tmp_path):
    d = write_data(tmp_path / "data", np.arange(50) % 20, np.arange(50) % 41, vocab_size=40)
    with pytest.raises(DataError, match="holds token id 40, but its meta.json says vocab_size=40"):
        check_data(d, block_size=8)  # an id equal to the vocabulary size is outside it
    with open(d / "val.bin", "ab") as f:  # a byte more than meta.json counts: not its tokens
        f.write(b"\0")
    with pytest.raises(DataError, match="val.bin holds 50 tokens and a byte, but meta.json says"):
        check_data(d, block_size=8)


def test_the_model_vocab_size_must_exceed_the_largest_id():
    meta = {"tokenizer": "char", "vocab_size": 40}
    assert choose_vocab_size({"init_from": "scratch", "vocab_size": 0}, meta, 39, "data") == 40
    assert choose_vocab_size({"init_from": "scratch", "vocab_size": 41}, meta, 40, "data") == 41
    bpe = {"tokenizer": "gpt2", "vocab_size": 50257}
    assert choose_vocab_size({"init_from": "scratch", "vocab_size": 0}, bpe, 50256, "d") == 50304
    with pytest.raises(DataError, match="vocab_size=40 is too small .* must be at least 41"):
        choose_vocab_size({"init_from": "scratch", "vocab_size": 40}, meta, 40, "data")
    with pytest.raises(DataError, match="init_from='gpt2' needs GPT-2 BPE data, but data is char"):
        choose_vocab_size({"init_from": "gpt2", "vocab_size": 0}, meta, 39, "data")


def test_a_resume_needs_the_same_characters_in_the_same_order():
    meta = {"tokenizer": "char", "chars": "abc"}
    check_same_tokens(meta, dict(meta), "data", "out/ckpt.pt")  # the same: no error
    check_same_tokens(None, meta, "data", "out/ckpt.pt")  # a checkpoint without meta
    for other in ({"tokenizer": "char", "chars": "acb"}, {"tokenizer": "gpt2"}):
        with pytest.raises(DataError, match="cannot resume from out/ckpt.pt: "):
            check_same_tokens(meta, other, "data", "out/ckpt.pt")
