"""runtime.py: device and dtype choice, and the GPU peaks MFU is measured against; the machine as
every test but test_gpu.py sees it (conftest)."""
import io
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import runtime
from runtime import (CpuThreads, StopSignals, autocast_context, gpu_peak_flops, peak_flops,
                     peak_memory_bytes, resolve_device, resolve_dtype, run_script,
                     sigterm_as_ctrl_c)


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


def test_mps_where_it_is_not_available_is_refused(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device='mps': MPS is not available here"):
        resolve_device("mps")


def test_auto_dtype_on_a_gpu_is_bfloat16_where_the_gpu_has_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: True)  # Ampere on
    assert resolve_dtype("auto", "cuda:0") == "bfloat16"
    # V100 / T4: torch emulates bf16 there (slowly) and says so only when emulation is left out
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: including_emulation)
    assert resolve_dtype("auto", "cuda") == "float16"


def test_tests_see_a_machine_without_a_gpu_in_process_and_in_the_processes_they_start():
    """conftest's view for every test outside test_gpu.py, so that their float32 CPU expectations
    hold on a GPU machine too."""
    assert resolve_device("auto") == "cpu"
    started = subprocess.run([sys.executable, "-c",
                              "import torch; print(torch.cuda.is_available())"],
                             capture_output=True, text=True, check=True)
    assert started.stdout.strip() == "False"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


def test_a_repeated_sigterm_still_saves_first_and_a_second_ctrl_c_stops_at_once():
    """A scheduler may send SIGTERM again before the run has saved: that must not cut the save
    short. A person pressing Ctrl-C twice wants out now."""
    # SIG_IGN, not Python's handler, in a job a shell started in the background
    before = signal.getsignal(signal.SIGINT)
    with StopSignals() as signals:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
        except KeyboardInterrupt:
            pytest.fail("the second SIGTERM raised KeyboardInterrupt: "
                        "the run would stop before it saves")
        assert signals.received == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before  # restored on the way out


def test_sigterm_is_a_ctrl_c_inside_sigterm_as_ctrl_c_and_only_there():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), sigterm_as_ctrl_c():
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("rank, said", [("0", True), ("1", False)])
def test_a_script_exits_with_mains_status_and_a_ctrl_c_is_one_line_and_130(rank, said,
                                                                             monkeypatch, capsys):
    """A Ctrl-C reaches every process torchrun started: one line for the run, from rank 0."""
    with pytest.raises(SystemExit) as exit:
        run_script(lambda: 3, "stopped by Ctrl-C")
    assert exit.value.code == 3

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setenv("RANK", rank)
    with pytest.raises(SystemExit) as exit:
        run_script(interrupted, "stopped by Ctrl-C; nothing was written")
    said = "stopped by Ctrl-C; nothing was written\n" if said else ""
    assert exit.value.code == 130 and capsys.readouterr().err == said


def test_autocast_only_for_half_precision():
    x = torch.randn(4, 4)
    with autocast_context("cpu", "float32"):
        assert (x @ x).dtype == torch.float32
    with autocast_context("cpu", "bfloat16"):
        assert (x @ x).dtype == torch.bfloat16


@pytest.fixture
def two_gpus(monkeypatch):
    """What torch reports on a machine with two GPUs (none is touched: the checks come first)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device",
                        lambda device: pytest.fail(f"set_device({device}) reached"))


def test_a_gpu_index_beyond_the_gpus_is_refused_before_it_is_used(two_gpus):
    assert resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(ValueError,
                       match=r"device='cuda:2': torch sees 2 GPUs here, cuda:0 to cuda:1"):
        resolve_device("cuda:2")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"),
                    reason="reads the resident size from Linux's /proc")
def test_the_peak_memory_on_a_cpu_is_in_bytes():
    """About what the process holds now, or more (ru_maxrss is in KiB on Linux, bytes on macOS); the
    kernel's counters of the two lag each other by a few pages."""
    with open("/proc/self/statm") as f:
        resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    assert peak_memory_bytes("cpu") > resident / 2


def test_the_load_counts_neither_idle_nor_iowait_time_as_busy(monkeypatch):
    """/proc/stat's cpu line: user nice system idle iowait irq softirq steal ..."""
    lines = iter(["cpu  100 5 50 1000 200 3 2 0 0 0\n",
                  "cpu  100 5 50 1700 900 3 2 0 0 0\n",  # idle and waiting for the disk
                  "cpu  180 5 50 1700 900 3 2 0 0 0\n"])  # busy
    monkeypatch.setattr(runtime, "open", lambda path: io.StringIO(next(lines)), raising=False)
    first, idle, busy = (CpuThreads._reading()[1] for _ in range(3))
    assert idle == first < busy


@pytest.mark.skipif(not os.path.exists("/proc/stat"),
                    reason="the adaptive thread count reads Linux's /proc/stat")
def test_cpu_threads_read_the_load_at_most_once_per_interval(monkeypatch):
    readings = []

    def reading():
        readings.append(None)
        return time.monotonic(), 0.0, 0.0

    monkeypatch.setattr(CpuThreads, "_reading", staticmethod(reading))
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    threads = CpuThreads(num_threads=0, device="cpu", interval=3600.0)
    assert threads.adaptive
    taken = len(readings)
    threads.adjust()
    assert len(readings) == taken  # within the interval: the last reading stands
    threads.mark = (time.monotonic() - 3600.0, 0.0, 0.0)
    threads.adjust()
    assert len(readings) == taken + 1
