"""runtime.py: device and dtype choice, and the GPU peaks MFU is measured against."""
import pytest
import torch

from runtime import autocast_context, gpu_peak_flops, peak_flops, resolve_device, resolve_dtype


@pytest.mark.parametrize("name, flops", [
    ("NVIDIA H100 80GB HBM3", 989e12),  # SXM
    ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H200", 989e12),
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A100 80GB PCIe", 312e12),
    ("NVIDIA A10G", 70e12),
    ("NVIDIA L40S", 362e12),  # not the L4's peak, though "L4" is in its name
    ("NVIDIA L40", 181e12),  # nor this one
    ("NVIDIA L4", 121e12),
    ("NVIDIA GeForce RTX 4090", 165e12),
])
def test_gpu_peaks_match_the_most_specific_name(name, flops):
    assert gpu_peak_flops(name) == flops


def test_peak_flops_is_none_where_a_peak_would_be_a_guess():
    assert peak_flops("auto", "cpu") is None
    assert gpu_peak_flops("Some Future GPU") is None
    assert peak_flops(123e12, "cpu") == 123e12  # a number given is used as it is


def test_auto_device_and_dtype_on_a_machine_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    assert resolve_dtype("auto", "cpu") == "float32"
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="not a device torch knows"):
        resolve_device("gpu0")
    with pytest.raises(ValueError, match="choose 'auto' or one of"):
        resolve_dtype("fp8", "cpu")


def test_auto_dtype_on_a_gpu_is_bfloat16_where_the_gpu_has_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)  # Ampere on
    assert resolve_dtype("auto", "cuda:0") == "bfloat16"
    # V100 / T4: torch emulates bf16 there (slowly) and says so only when emulation is left out
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert resolve_dtype("auto", "cuda") == "float16"


def test_autocast_only_for_half_precision():
    x = torch.randn(4, 4)
    with autocast_context("cpu", "float32"):
        assert (x @ x).dtype == torch.float32
    with autocast_context("cpu", "bfloat16"):
        assert (x @ x).dtype == torch.bfloat16
