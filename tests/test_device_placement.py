"""Every tensor of the GPU path on the model's device, checked without a GPU.

A CPU tensor in a CUDA computation (a torch.arange without device=) fails only on a GPU. On
tensors with a device and no data such a mix raises as on a GPU: "meta" tensors, and with a CUDA
build of torch fake CUDA ones, which take the CUDA-only branches too but no backward."""
import contextlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import generate as generation
from conftest import SHAPES, TINY
from model import GPT, GPTConfig


def why_no_fake_cuda():
    """None where fake CUDA tensors work without a GPU, else why not."""
    if not torch.backends.cuda.is_built():
        return "faking CUDA tensors needs a CUDA build of torch (this one is CPU-only)"
    try:
        with FakeTensorMode(), torch.device("cuda"):
            # init's and sampling's random ops
            torch.multinomial(torch.empty(2, 3).uniform_().normal_().softmax(-1), 1)
    except RuntimeError as error:  # e.g. torch 2.7 asks the driver for fake random numbers
        return f"this torch's fake CUDA tensors need a GPU: {error}".splitlines()[0]
    return None


NO_FAKE_CUDA = why_no_fake_cuda()
DEVICES = ["meta", pytest.param("cuda", marks=pytest.mark.skipif(NO_FAKE_CUDA is not None,
                                                                 reason=str(NO_FAKE_CUDA)))]


@pytest.fixture(params=DEVICES)
def device(request):
    """The device name, with FakeTensorMode active for "cuda" (no GPU needed, no kernel runs)."""
    with FakeTensorMode() if request.param == "cuda" else contextlib.nullcontext():
        yield request.param


def model_on(device, attention, overrides):
    with torch.device(device):  # built there: a fake CUDA tensor is no copy of a real CPU one
        return GPT(GPTConfig(**{**TINY, **overrides, "attention": attention}))


def tokens(device, batch=2, length=5):
    return torch.zeros(batch, length, dtype=torch.long, device=device)


@pytest.mark.parametrize("attention, overrides", SHAPES)
def test_training_step_stays_on_device(device, attention, overrides):
    """train.py's step: forward, backward, clip, the optimizer's step."""
    model = model_on(device, attention, overrides).train()
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), device)
    x = tokens(device, length=TINY["block_size"])
    logits, loss = model(x, targets=x)
    assert logits.device.type == loss.device.type == device
    if device == "cuda":  # autograd's engine needs a real GPU for a backward on CUDA tensors
        for p in model.parameters():
            p.grad = torch.ones_like(p)
    else:
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    assert {p.grad.device.type for p in model.parameters()} == {device}
    states = [s for state in optimizer.state.values() for s in state.values() if s.dim()]
    assert {s.device.type for s in states} == {device}


@pytest.mark.parametrize("attention, overrides", SHAPES)
@pytest.mark.parametrize("decoding", ["cached", "uncached", "compiled"])
def test_decoding_stays_on_device(device, attention, overrides, decoding, monkeypatch):
    """Past block_size, so that the window slides and the cache is refilled. compile=True runs its
    loop with the step eager: fixed-shape cache writes at input_pos, the kept cache, CUDA graphs'
    step markers (torch.compile traces decode_step itself)."""
    monkeypatch.setattr(generation, "compiled_decode_step", lambda on_cuda: generation.decode_step)
    model = model_on(device, attention, overrides).eval()
    out = model.generate(tokens(device), TINY["block_size"] + 3, top_k=3,
                         use_kv_cache=decoding != "uncached", compile=decoding == "compiled")
    assert out.device.type == device and out.shape == (2, 5 + TINY["block_size"] + 3)


def test_the_kept_decoding_cache_follows_the_model_to_another_device(monkeypatch):
    """Compiled decoding keeps its cache between calls: a model moved since gets a new one."""
    monkeypatch.setattr(generation, "compiled_decode_step", lambda on_cuda: generation.decode_step)
    model = model_on("cpu", "super", {}).eval()
    model.generate(tokens("cpu"), 3, top_k=3, compile=True)
    out = model.to("meta").generate(tokens("meta"), 3, top_k=3, compile=True)
    assert out.device.type == "meta" and out.shape == (2, 8)

