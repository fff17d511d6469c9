"""
Where a benchmark's step spends its time, read from a torch.profiler trace: on a GPU each kernel's
time, on a CPU the own time of each operator and compiled graph. Shared by bench_model.py,
bench_sample.py and bench_attention_kernels.py. Profile after timing: the profiler leaves CUPTI's
callbacks on after it stops, which slows every step timed after it.
"""
import re

from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from runtime import synchronize


def traced_events(fn, device, calls=1):
    """The profiler's events of `calls` calls of fn, run to completion (GPU kernels included)."""
    activities = [ProfilerActivity.CPU]
    if str(device).startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as trace:
        for _ in range(calls):
            fn()
        synchronize(device)
    return trace.events()


def time_by_name(events, on_cuda):
    """Microseconds by name: each GPU kernel's total on CUDA; on a CPU each event's self time, so
    that the values add up to the traced time. A record_function range (AdamW's step, say) also
    shows on the GPU's timeline, over kernels counted already: it is left out."""
    totals = {}
    for e in events:
        if on_cuda and e.device_type == DeviceType.CUDA:
            if getattr(e, "is_user_annotation", False):
                continue
            us = e.time_range.elapsed_us()
        elif not on_cuda and e.device_type == DeviceType.CPU:
            us = e.self_cpu_time_total
        else:
            continue
        totals[e.name] = totals.get(e.name, 0) + us
    return totals


def short_kernel_name(name, width=90):
    """A CUDA kernel's name without its return type, template arguments, anonymous namespaces and
    parameters: 'void at::native::(anonymous namespace)::f<float>(float*)' is 'at::native::f'."""
    name = name.replace("(anonymous namespace)::", "")
    while re.search(r"<[^<>]*>", name):  # innermost template arguments first
        name = re.sub(r"<[^<>]*>", "", name)
    name = re.sub(r"^(void|\S+::type)\s+", "", name)  # the return type (std::enable_if<..>::type)
    name = re.sub(r"\(.*", "", name).strip() or name
    return name if len(name) <= width else name[:width - 3] + "..."


def ms_by_kernel(fn, device, calls=1, units=1):
    """Milliseconds per unit of work (fn does `units` of them: steps, tokens) by GPU kernel on
    CUDA, by operator on a CPU, over `calls` calls of fn."""
    on_cuda = str(device).startswith("cuda")
    totals = time_by_name(traced_events(fn, device, calls), on_cuda)
    return {name: us / calls / units / 1e3 for name, us in totals.items()}


def grouped(ms, row_of):
    """{row: ms} summed over the names that row_of maps to each row (None: left out)."""
    rows = {}
    for name, t in ms.items():
        row = row_of(name)
        if row is not None:
            rows[row] = rows.get(row, 0) + t
    return rows


def kernel_row(name):
    """Inductor numbers its Triton kernels and graphs differently in every model, so each kind is
    one row; any other kernel is a row of its own."""
    if name.startswith("triton_"):
        return "Triton kernels (inductor)"
    if name.startswith("## Call CompiledFxGraph"):
        return "compiled graphs' own code (inductor)"
    return short_kernel_name(name, 60)


def triton_fusion(name):
    """An inductor Triton kernel by the operators it fuses, without its number in its graph
    ('triton_poi_fused_add_mul_3' -> 'triton_poi_fused_add_mul'); None for any other kernel."""
    return re.sub(r"_\d+$", "", name)[:90] if name.startswith("triton_") else None


def print_profile(title, unit, profiles, top=12):
    """The time table of {column: ms_by_kernel's dict}, by kernel_row; then, where inductor's
    Triton kernels ran (a GPU), a table of those alone, by the operators each fuses."""
    print_time_table(title, unit, {c: grouped(ms, kernel_row) for c, ms in profiles.items()}, top)
    triton = {column: grouped(ms, triton_fusion) for column, ms in profiles.items()}
    if any(triton.values()):
        title = f"{title}: inductor's Triton kernels by what they fuse"
        print_time_table(title, unit, triton, top)


def print_time_table(title, unit, columns, top=12):
    """The `top` rows that take the most time in any column ({column: {row: ms}}), side by side,
    in ms per unit; then the rest, and each column's total."""
    rows = sorted(set().union(*columns.values()),
                  key=lambda r: -max(c.get(r, 0) for c in columns.values()))

    def line(label, values):
        return f"| {label} | " + " | ".join(f"{v:.3f}" for v in values) + " |"

    print(f"\n### {title}\n")
    print(f"| kernel (CUDA) or operator (CPU), ms per {unit} | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for row in rows[:top]:
        print(line(row, [c.get(row, 0) for c in columns.values()]))
    rest = [sum(c.get(r, 0) for r in rows[top:]) for c in columns.values()]
    print(line("everything else", rest))
    print(line("total", [sum(c.values()) for c in columns.values()]), flush=True)
