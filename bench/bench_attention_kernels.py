"""
Which scaled_dot_product_attention kernel runs the paper's large-LM attention, one head of
d_k = 3072 (config/train_llama1b_efficient_c4.py), and its cost against the same width split.

    python bench/bench_attention_kernels.py --device=cuda    # bf16, batch 4, T 2048
    python bench/bench_attention_kernels.py --seq_len=256 --batch=1   # on a CPU: fp32, smaller

For each (heads x d_k), causal, it times a forward and backward pass of SDPA with the default
dispatch, then with each backend forced alone (FLASH_ATTENTION, EFFICIENT_ATTENTION,
CUDNN_ATTENTION, MATH; one that refuses the shape is "not supported", with torch's reasons), then
of model.attention_by_matmuls, which the model runs for heads wider than 256. Each row names the
kernel it ran, from a profiler trace taken after all the timing, and its largest difference from
MATH's output. Times are medians of --repeats steps; peak memory (CUDA) is what one step
allocates beyond its inputs. Split heads compute another attention at the same FLOPs: the
comparison is of cost, not of outputs.
"""

import argparse
import contextlib
import functools
import re
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo's modules, from bench/
from machine import header
from model import attention_by_matmuls
from profiling import short_kernel_name, time_by_name, traced_events
from runtime import DTYPES, resolve_device_and_dtype, synchronize

MATMULS = "matmuls (model.py)"  # model.attention_by_matmuls: two products around a softmax
BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH", MATMULS)
# the aten operator each backend runs under (the CPU's flash kernel is ..._flash_attention_for_cpu)
OPERATOR_PREFIXES = {
    "aten::_scaled_dot_product_flash_attention": "FLASH_ATTENTION",
    "aten::_scaled_dot_product_efficient_attention": "EFFICIENT_ATTENTION",
    "aten::_scaled_dot_product_cudnn_attention": "CUDNN_ATTENTION",
    "aten::_scaled_dot_product_attention_math": "MATH",
    "aten::_scaled_dot_product_fused_attention_overrideable": "OVERRIDEABLE",
}


def parse_shapes(text):
    """'1x3072,12x256' -> [(1, 3072), (12, 256)]"""
    try:
        shapes = [tuple(int(n) for n in part.split("x")) for part in text.split(",")]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise argparse.ArgumentTypeError(f"{text!r}: write heads x d_k, e.g. 1x3072,24x128")
    return shapes


def make_inputs(heads, d_k, args):
    """Random q, k, v (batch, heads, T, d_k) that want gradients, and the output's gradient."""
    g = torch.Generator(device=args.device).manual_seed(0)
    shape = (args.batch, heads, args.seq_len, d_k)
    q, k, v, grad = (torch.randn(shape, device=args.device, dtype=DTYPES[args.dtype], generator=g)
                     for _ in range(4))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), grad


def step(q, k, v, grad, backend=None):
    """Forward and backward; the gradients are returned, not accumulated, so each step is alike."""
    attention = attention_by_matmuls if backend == MATMULS else F.scaled_dot_product_attention
    out = attention(q, k, v, is_causal=True)
    torch.autograd.grad(out, (q, k, v), grad)
    return out.detach()


def time_steps(run, args):
    """Median seconds of a forward+backward step (run()), after warm-up."""
    for _ in range(args.warmup):
        run()
    times = []
    for _ in range(args.repeats):
        synchronize(args.device)
        t0 = time.perf_counter()
        run()
        synchronize(args.device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def peak_extra_bytes(run, args):
    """CUDA memory one step (run()) allocates beyond what is allocated before it; None on a CPU."""
    if not args.device.startswith("cuda"):
        return None
    synchronize(args.device)
    before = torch.cuda.memory_allocated(args.device)
    torch.cuda.reset_peak_memory_stats(args.device)
    run()
    synchronize(args.device)
    return torch.cuda.max_memory_allocated(args.device) - before


def refusal(warned, error):
    """One line of why a backend refused: torch's warnings (the reasons), else its error."""
    reasons = [re.sub(r"\s*\(Triggered internally at .*", "", str(w.message), flags=re.S).strip()
               for w in warned]
    reasons = [r for r in dict.fromkeys(reasons) if r]  # unique, in order
    return " ".join(reasons) if reasons else str(error).strip().splitlines()[0]


def backend_context(backend):
    """The default dispatch (backend None), or one backend forced alone (matmuls call no SDPA)."""
    if backend in (None, MATMULS):
        return contextlib.nullcontext()
    return sdpa_kernel([getattr(SDPBackend, backend)])


def measure(inputs, reference, args, backend=None):
    """A row for the default dispatch (backend None) or one backend forced alone: its time, memory
    and difference from MATH (which kernel it ran is traced later, by trace_rows)."""
    name, run = backend or "default", functools.partial(step, *inputs, backend=backend)
    with backend_context(backend), warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            out = run()
            seconds, peak = time_steps(run, args), peak_extra_bytes(run, args)
        except torch.cuda.OutOfMemoryError as e:
            return {"backend": name, "error": f"out of memory: {str(e).splitlines()[0]}"}
        except RuntimeError as e:  # no kernel for this shape among those allowed
            return {"backend": name, "error": f"not supported: {refusal(warned, e)}"}
    diff = (out.float() - reference.float()).abs().max().item()
    return {"backend": name, "seconds": seconds, "peak": peak, "diff": diff, "error": None}


def trace_rows(heads, d_k, rows, args):
    """Which kernel each row that ran used, from a profiler trace, once every row is timed (the
    profiler leaves CUPTI's callbacks on after it stops, which slows every step timed after it)."""
    inputs = make_inputs(heads, d_k, args)
    for row in rows:
        if not row["error"]:
            backend = None if row["backend"] == "default" else row["backend"]
            with backend_context(backend):
                run = functools.partial(step, *inputs, backend=backend)
                row["ran"], row["kernels"] = traced_kernels(run, args)


def traced_kernels(run, args):
    """(the backend that ran, by its aten operator; on CUDA the GPU kernels that took the most
    time) from a profiler trace of one step (run())."""
    events = traced_events(run, args.device)
    ran = [backend for e in events for prefix, backend in OPERATOR_PREFIXES.items()
           if e.name.startswith(prefix)]
    kernel_us = time_by_name(events, on_cuda=True)  # none on a CPU
    top = sorted(kernel_us, key=kernel_us.get, reverse=True)[:3]
    return (ran[0] if ran else "no SDPA"), [short_kernel_name(name) for name in top]


def bench_shape(heads, d_k, args):
    """The rows of one shape: the default dispatch first, then each backend forced alone."""
    inputs = make_inputs(heads, d_k, args)
    with sdpa_kernel([SDPBackend.MATH]):
        reference = step(*inputs)  # what every other row's output is compared with
    rows = [measure(inputs, reference, args, b) for b in (None, *BACKENDS)]
    del inputs, reference
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return rows


def print_table(results):
    first = results[0]
    default = first["rows"][0]
    base = None if default["error"] else default["seconds"]
    print(f"\n| heads x d_k | backend | ran | fwd+bwd ms | vs {first['heads']}x{first['d_k']} "
          "default | peak extra MiB | max abs diff vs MATH | note |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    for result in results:
        for r in result["rows"]:
            shape = f"{result['heads']}x{result['d_k']}"
            if r["error"]:
                print(f"| {shape} | {r['backend']} | - | - | - | - | - | {r['error']} |")
                continue
            ratio = f"{r['seconds'] / base:.2f}" if base else "-"
            peak = "-" if r["peak"] is None else f"{r['peak'] / 2**20:,.0f}"
            print(f"| {shape} | {r['backend']} | {r['ran']} | {r['seconds'] * 1e3:.3f} | {ratio} "
                  f"| {peak} | {r['diff']:.2e} | |")
    traced = [(result, r) for result in results for r in result["rows"]
              if not r["error"] and r["kernels"]]
    if traced:
        print("\nGPU kernels of each row, most time first:")
    for result, r in traced:
        print(f"- {result['heads']}x{result['d_k']} {r['backend']}: " + "; ".join(r["kernels"]))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="cuda, cpu, or auto")
    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                        help="auto: bf16 on a GPU that has it, else fp16; fp32 on CPU")
    parser.add_argument("--shapes", type=parse_shapes,
                        default=parse_shapes("1x3072,12x256,24x128"),
                        help="heads x d_k, comma-separated (the first is the ratios' base)")
    parser.add_argument("--batch", type=int, default=4, help="the 1B configs' micro-batch")
    parser.add_argument("--seq_len", type=int, default=2048, help="T (the 1B configs' context)")
    parser.add_argument("--repeats", type=int, default=20, help="timed steps (their median)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    args = parser.parse_args(argv)
    try:
        args.device, args.dtype = resolve_device_and_dtype(args.device, args.dtype)
    except ValueError as e:
        parser.error(str(e))
    if min(args.batch, args.seq_len, args.repeats) < 1 or args.warmup < 0:
        parser.error("--batch, --seq_len and --repeats must be at least 1, --warmup at least 0")
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    print(header("bench_attention_kernels.py", argv, args.device))
    print(f"# {args.device}, {args.dtype}, causal, batch {args.batch}, T {args.seq_len}; "
          f"forward+backward, median of {args.repeats} after {args.warmup} warm-up", flush=True)
    results = [{"heads": heads, "d_k": d_k, "rows": bench_shape(heads, d_k, args)}
               for heads, d_k in args.shapes]
    for result in results:
        trace_rows(result["heads"], result["d_k"], result["rows"], args)
    print_table(results)


if __name__ == "__main__":
    main()
