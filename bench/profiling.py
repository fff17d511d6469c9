"""
Where a benchmark's step spends its time, read from a torch.profiler trace: on a GPU each kernel's
time, on a CPU each aten operator's own time. Shared by bench_model.py and bench_attention_kernels.py.
Profile after timing: the profiler leaves CUPTI's callbacks on after it stops, which slows every
step timed after it.
"""
import re

from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from runtime import synchronize


def traced_events(fn, device, calls=1):
    """The profiler's events of `calls` calls of fn, run to completion (with the GPU's kernels on CUDA)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if str(device).startswith("cuda") else [])
    with profile(activities=activities) as trace:
        for _ in range(calls):
            fn()
        synchronize(device)
    return trace.events()


def time_by_name(events, on_cuda):
    """Microseconds by name: each GPU kernel's total on CUDA; on a CPU each aten operator's self time
    (its own work, not the operators it calls), so that the values add up to the step."""
    totals = {}
    for e in events:
        if on_cuda and e.device_type == DeviceType.CUDA:
            us = e.time_range.elapsed_us()
        elif not on_cuda and e.device_type == DeviceType.CPU and e.name.startswith("aten::"):
            us = e.self_cpu_time_total
        else:
            continue
        totals[e.name] = totals.get(e.name, 0) + us
    return totals


def short_kernel_name(name, width=90):
    """A CUDA kernel name without its return type and template arguments, at most `width` characters."""
    name = re.sub(r"^void\s+", "", name)
    name = re.sub(r"[<(].*", "", name)
    return name if len(name) <= width else name[:width - 3] + "..."
