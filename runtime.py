"""
Where and in what precision a model runs: device and dtype choice ('auto' included), autocast, and
the peak FLOP/s that MFU is measured against. Shared by train.py, sample.py, eval_hellaswag.py and
the benchmarks, so that 'auto' means the same thing everywhere.
"""
import contextlib

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Dense (no sparsity) bf16 tensor-core peak, FLOP/s, from NVIDIA's datasheets; matched against
# torch.cuda.get_device_name in this order, so the more specific names come first.
PEAK_BF16_FLOPS = (
    ("H100 PCIe", 756e12),  # H100 datasheet, PCIe form factor
    ("H100 NVL", 835e12),  # H100 datasheet, NVL
    ("H100", 989e12),  # H100 datasheet, SXM5 ("NVIDIA H100 80GB HBM3")
    ("H200 NVL", 835e12),  # H200 datasheet, NVL
    ("H200", 989e12),  # H200 datasheet, SXM
    ("GH200", 989e12),  # GH200 Grace Hopper datasheet (the same Hopper GPU as H100 SXM)
    ("B200", 2250e12),  # HGX B200 datasheet: 4.5 PFLOPS with sparsity, half of it dense
    ("A100", 312e12),  # A100 datasheet, SXM and PCIe alike
    ("A10G", 70e12),  # AWS G5 documentation: an A10 variant
    ("A10", 125e12),  # A10 datasheet
    ("L40S", 362e12),  # L40S datasheet
    ("L4", 121e12),  # L4 datasheet
    ("RTX 4090", 165e12),  # Ada GeForce whitepaper, bf16 with fp32 accumulate (what torch uses)
    ("RTX 3090", 71e12),  # Ampere GeForce whitepaper, bf16 with fp32 accumulate
)


def resolve_device(device="auto"):
    """'auto' is cuda when a GPU is usable, else cpu; anything else must be a device torch knows
    and that is present here. Raises ValueError with a message for the user."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except RuntimeError as e:
        raise ValueError(f"device={device!r} is not a device torch knows: {e}") from e
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}: CUDA is not available here; use device='cpu' (or 'auto')")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={device!r}: MPS is not available here; use device='cpu' (or 'auto')")
    return device


def resolve_dtype(dtype, device):
    """'auto' is bfloat16 on a GPU that supports it, else float16 there (with a GradScaler when
    training), and float32 on CPU, where autocast is slower than float32 for these models."""
    if dtype == "auto":
        if torch.device(device).type != "cuda":
            return "float32"
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: choose 'auto' or one of {', '.join(DTYPES)}")
    return dtype


def autocast_context(device, dtype):
    """float32: nothing; bfloat16 / float16: torch.autocast on the device's type."""
    if DTYPES[dtype] == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=DTYPES[dtype])


def synchronize(device):
    """Wait for the device's queued work, so that a wall-clock time covers it (a no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def gpu_peak_flops(device_name):
    """The dense bf16 peak of a GPU named like torch.cuda.get_device_name, or None if not listed."""
    for model, flops in PEAK_BF16_FLOPS:
        if model in device_name:
            return flops
    return None


def peak_flops(setting, device):
    """The MFU denominator: a number as given, or for 'auto' the bf16 peak of the CUDA GPU in use;
    None (no MFU reported) on a CPU or on a GPU not in PEAK_BF16_FLOPS, where a guessed peak
    would make a meaningless percentage."""
    if setting != "auto":
        return float(setting)
    if torch.device(device).type != "cuda":
        return None
    return gpu_peak_flops(torch.cuda.get_device_name(device))
