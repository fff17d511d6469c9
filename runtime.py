"""
Where and in what precision a model runs: device and dtype ('auto' included), autocast, the peak
FLOP/s behind MFU, torch's CPU threads, stop signals and how a script exits. Shared by train.py,
sample.py, eval_hellaswag.py and the benchmarks, so that 'auto' means the same thing everywhere.
"""
import contextlib
import os
import platform
import resource
import signal
import sys
import threading
import time

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Dense (no sparsity) bf16 tensor-core peaks in FLOP/s, from NVIDIA's datasheets unless noted;
# matched against torch.cuda.get_device_name in this order, so the more specific names come first.
PEAK_BF16_FLOPS = (
    ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12),  # SXM5: "H100 80GB HBM3"
    ("H200 NVL", 835e12), ("H200", 989e12), ("GH200", 989e12),  # GH200: H100 SXM's GPU
    ("B200", 2250e12),  # HGX B200: 4.5 PFLOPS with sparsity, half of it dense
    ("A100", 312e12), ("A10G", 70e12), ("A10", 125e12),  # A10G: AWS G5's A10 variant
    ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12),  # "L40" before "L4", which it contains
    ("RTX 4090", 165e12), ("RTX 3090", 71e12),  # GeForce whitepapers, bf16 with fp32 accumulate
)


def resolve_device(device="auto"):
    """'auto' is cuda when a GPU is usable, else cpu; anything else must be a device present here.
    Raises ValueError with a message for the user."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except RuntimeError as e:
        raise ValueError(f"device={device!r} is not a device torch knows: {e}") from e
    if kind == "cpu":  # one device, whatever index is written: torch.load cannot map to "cpu:1"
        return "cpu"
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}: CUDA is not available here; "
                         f"use device='cpu' (or 'auto')")
    if kind == "cuda" and (torch.device(device).index or 0) >= torch.cuda.device_count():
        n = torch.cuda.device_count()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "(not set)")
        raise ValueError(f"device={device!r}: torch sees {n} GPU{'s' if n != 1 else ''} here, "
                         f"cuda:0 to cuda:{n - 1} (CUDA_VISIBLE_DEVICES={visible})")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={device!r}: MPS is not available here; "
                         f"use device='cpu' (or 'auto')")
    return device


def resolve_dtype(dtype, device):
    """'auto' is bfloat16 on a GPU that supports it, else float16 there (with a GradScaler when
    training), and float32 on CPU, where autocast is slower than float32 for these models."""
    if dtype == "auto":
        if torch.device(device).type != "cuda":
            return "float32"
        # not bf16 that the GPU only emulates (V100, T4: slow), which torch counts by default
        return "bfloat16" if torch.cuda.is_bf16_supported(including_emulation=False) else "float16"
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: choose 'auto' or one of {', '.join(DTYPES)}")
    return dtype


def resolve_device_and_dtype(device, dtype):
    """(device, dtype) with 'auto' resolved in both; ValueError with a message for the user."""
    device = resolve_device(device)
    return device, resolve_dtype(dtype, device)


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
    None (no MFU) on a CPU or an unlisted GPU, where a guessed peak would mean nothing."""
    if setting != "auto":
        return float(setting)
    if torch.device(device).type != "cuda":
        return None
    return gpu_peak_flops(torch.cuda.get_device_name(device))


def machine_name(device):
    """The GPU and CUDA version, or the CPU model, its cores and torch's threads."""
    if torch.device(device).type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}"
    return f"{cpu_model()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # not Linux
        pass
    return platform.processor() or platform.machine()


def peak_memory_bytes(device):
    """Peak allocated GPU memory, or on CPU the process's peak resident memory."""
    if torch.device(device).type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, KiB on Linux


class StopSignals:
    """SIGINT/SIGTERM set a flag (`received`) that the training loop checks after each step, so
    that it stops after a checkpoint. A second Ctrl-C (not under torchrun, which passes the first
    one on to its workers again) raises KeyboardInterrupt. Main thread only."""

    def __init__(self):
        self.received = None
        self.previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        # a person pressing Ctrl-C twice wants out now; under torchrun the second may be torchrun's
        # passing on the first to its workers
        if self.received is not None and signum == signal.SIGINT and "RANK" not in os.environ:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        return False


@contextlib.contextmanager
def sigterm_as_ctrl_c():
    """Inside the block SIGTERM raises KeyboardInterrupt, as Ctrl-C does, so that a scheduler's stop
    runs the same `except` and `finally` (a default SIGTERM runs neither). Main thread only."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_script(main, ctrl_c):
    """sys.exit(main()), ending as a Unix tool does rather than with a traceback: a Ctrl-C prints
    `ctrl_c` (one line: what was kept) on stderr and exits 130 (128 + SIGINT); a stdout closed early
    (`python sample.py | head -3`) exits quietly with 141 (128 + SIGPIPE)."""
    try:
        code = main()
        sys.stdout.flush()  # a closed pipe is found here, not in the interpreter's last flush
    except KeyboardInterrupt:
        if is_rank_zero():  # a Ctrl-C reaches every process torchrun started: one line for all
            print(ctrl_c, file=sys.stderr)
        code = 130
    except BrokenPipeError:  # the reader has what it wanted
        silence_stdout()  # so that the exit's flush is quiet too
        code = 141
    sys.exit(code)


def is_rank_zero():
    """Whether this process speaks for the run: not started by torchrun, or its rank 0."""
    return int(os.environ.get("RANK", "0")) == 0


def silence_stdout():
    """Once stdout's reader has closed it, send later output (and the last flush) to /dev/null."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class CpuThreads:
    """torch's threads on CPU, kept to the cores other processes leave free (their load is read
    from /proc/stat): OpenMP threads spin while they wait for each other, so one thread per core
    beside a busy process makes a step 3-20x slower (docs/training.md, "Training on a busy CPU").
    num_threads > 0 fixes the count, as a run that must repeat bit for bit on CPU does (another
    count can change a sum's last bits). Off Linux, or on a GPU, nothing changes."""

    def __init__(self, num_threads=0, device="cpu", interval=1.0):
        self.adaptive = (num_threads == 0 and torch.device(device).type == "cpu"
                         and os.path.exists("/proc/stat"))
        self.most = torch.get_num_threads()
        self.interval = interval
        if num_threads:
            torch.set_num_threads(num_threads)
        if self.adaptive:
            self.mark = self._reading()
            time.sleep(0.1)  # a first reading of the load before the first step
            self.adjust(force=True)

    @staticmethod
    def _reading():
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
        busy = sum(ticks) - ticks[3] - ticks[4]  # all time but idle and iowait
        own = sum(os.times()[:2])
        return time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), own

    def adjust(self, force=False):
        """Set the thread count from the load since the last reading (at most once per interval)."""
        if not self.adaptive or (not force and time.monotonic() - self.mark[0] < self.interval):
            return
        now = self._reading()
        wall = now[0] - self.mark[0]
        if wall <= 0:
            return
        # the cores other processes used
        others = max(0.0, (now[1] - self.mark[1]) - (now[2] - self.mark[2])) / wall
        self.mark = now
        free = (os.cpu_count() or 1) - others  # /proc/stat counts every core of the machine
        threads = max(1, min(self.most, round(free)))
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
