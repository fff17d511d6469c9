"""
Benchmark the attention variants side by side: parameters, FLOPs per token, time per step,
tokens/s and MFU, at one or several batch sizes; optionally against NanoGPT's own model.

    python bench/bench_model.py              # CPU: a small shape and GPT-2 124M's, fp32, batch 1
    python bench/bench_model.py --device=cuda --compile --optimizer --shapes=gpt2 \\
        --vocab_size=50304 --batch_sizes=12,64 --repeats=30 --nanogpt_dir=../nanoGPT

A step is a forward and backward pass on random tokens; with --optimizer also gradient clipping
and a fused AdamW step, as train.py runs it. The models take one step each in turn (round-robin),
so a change in machine load hits all of them alike; the median step is reported. MFU is against
the GPU's dense bf16 peak (runtime.py), else against a matmul measured here. A batch size that
runs out of GPU memory is reported in one line and skipped.

--nanogpt_dir adds NanoGPT's model.py as the first row, the same shape, dtype and compile setting,
with its own configure_optimizers; its parameters, FLOPs and MFU are standard's count.
--profile then traces 3 steps of each model and prints, side by side, where each step's time goes
(GPU kernels, or CPU operators), and on a GPU inductor's Triton kernels by what they fuse.
"""

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo's modules, from bench/
from machine import names, names_among
from model import ATTENTION_CLASSES, ATTENTION_VARIANTS, GPT, GPTConfig
from profiling import ms_by_kernel, print_profile
from runtime import (DTYPES, autocast_context, gpu_peak_flops, machine_name,
                     resolve_device_and_dtype, synchronize)

SHAPES = {
    "small": dict(n_layer=6, n_head=6, n_embd=384, block_size=256),
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024),  # GPT-2 124M
}


def measure_matmul_peak(device, dtype, n=None, repeats=10):
    """FLOP/s of the fastest of `repeats` square matmuls (a mean would count other processes)."""
    n = n or (8192 if device.startswith("cuda") else 2048)  # a GPU needs a large one to peak
    a = torch.randn(n, n, device=device, dtype=DTYPES[dtype])
    b = torch.randn(n, n, device=device, dtype=DTYPES[dtype])
    a @ b
    fastest = float("inf")
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        a @ b
        synchronize(device)
        fastest = min(fastest, time.perf_counter() - t0)
    return 2 * n**3 / fastest


def load_nanogpt(nanogpt_dir):
    """NanoGPT's model module, imported from its checkout under another name than our model.py."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", Path(nanogpt_dir) / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_models(shape, args, nanogpt):
    """name -> model (NanoGPT's first, then standard and the other variants), each from seed 0."""
    config = dict(**shape, vocab_size=args.vocab_size, dropout=0.0, bias=True)
    models = {}
    if nanogpt is not None:
        torch.manual_seed(0)
        models["nanogpt"] = nanogpt.GPT(nanogpt.GPTConfig(**config))
    for attention in dict.fromkeys(["standard", *args.variants]):
        torch.manual_seed(0)
        models[attention] = GPT(GPTConfig(**config, attention=attention))
    return {name: model.to(args.device).train() for name, model in models.items()}


def make_step(model, batch, args):
    """One training step on fixed random tokens: forward and backward, and with --optimizer
    clipping and AdamW; torch.compile'd as train.py does with --compile."""
    T = model.config.block_size
    idx = torch.randint(0, args.vocab_size, (batch, T + 1), device=args.device)
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()  # NanoGPT's loss views them
    device_type = torch.device(args.device).type
    optimizer = None
    if args.optimizer:
        optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device_type)
    forward = torch.compile(model, dynamic=False) if args.compile else model
    autocast = autocast_context(args.device, args.dtype)

    def step():
        with autocast:
            _, loss = forward(x, targets=y)
        loss.backward()
        if optimizer is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        model.zero_grad(set_to_none=True)

    return step


def time_round_robin(steps, args):
    """Each step's median seconds, after args.warmup untimed calls, the steps taken in turn."""
    for step in steps.values():
        for _ in range(args.warmup):
            step()
    times = {name: [] for name in steps}
    for _ in range(args.repeats):
        for name, step in steps.items():
            synchronize(args.device)
            t0 = time.perf_counter()
            step()
            synchronize(args.device)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def bench(shape, batch, args, nanogpt, peak):
    """One batch size's rows, and with --profile each model's time by kernel (else None)."""
    models = build_models(shape, args, nanogpt)
    steps = {name: make_step(model, batch, args) for name, model in models.items()}
    seconds = time_round_robin(steps, args)
    T = shape["block_size"]
    rows = []
    for name, model in models.items():
        ours = models["standard"] if name == "nanogpt" else model  # NanoGPT's FLOPs are standard's
        flops = ours.flops_per_token(T)
        tokens_per_s = batch * T / seconds[name]
        rows.append(dict(name=name, batch=batch, params=ours.get_num_params(non_embedding=False),
                         attention_params=ours.get_num_attention_params(), flops=flops,
                         ms=seconds[name] * 1e3, tokens_per_s=tokens_per_s,
                         mfu=flops * tokens_per_s / peak))
    profiles = None
    if args.profile:  # after the timing, which a profiler once started would slow
        profiles = {name: ms_by_kernel(step, args.device, calls=3) for name, step in steps.items()}
    del models, steps
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return rows, profiles


def print_progress(shape_name, rows):
    """One batch size's rows once measured, so that a run stopped midway keeps them."""
    for r in rows:
        print(f"# {shape_name} batch {r['batch']} {r['name']}: {r['ms']:.2f} ms/step, "
              f"{r['tokens_per_s']:,.0f} tokens/s, MFU {100 * r['mfu']:.1f}%", flush=True)


def print_table(title, rows):
    """The rows, each compared with standard at its own batch size."""
    print(f"\n### {title}\n")
    print("| model | batch | params | attn params/layer | FLOPs/token (fwd+bwd) | FLOP ratio "
          "| ms/step | time ratio | tokens/s | MFU |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        base = next(b for b in rows if b["name"] == "standard" and b["batch"] == r["batch"])
        print(f"| {r['name']} | {r['batch']} | {r['params'] / 1e6:.2f}M "
              f"| {r['attention_params']:,} "
              f"| {r['flops'] / 1e6:.1f}M | {r['flops'] / base['flops']:.3f} | {r['ms']:.2f} "
              f"| {r['ms'] / base['ms']:.3f} | {r['tokens_per_s']:,.0f} | {100 * r['mfu']:.1f}% |")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, or auto")
    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                        help="auto: bf16 on a GPU that has it, else fp16; fp32 on CPU")
    parser.add_argument("--compile", action="store_true", help="torch.compile each model")
    parser.add_argument("--optimizer", action="store_true",
                        help="time whole training steps: add clipping and AdamW")
    parser.add_argument("--batch_sizes", default="1", help="comma-separated, e.g. 12,16,32")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per model")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed steps first (default 1, 3 with --compile)")
    parser.add_argument("--shapes", default="small,gpt2",
                        help=f"comma-separated among {', '.join(SHAPES)}")
    parser.add_argument("--vocab_size", type=int, default=50257,
                        help="50304 (padded) as NanoGPT trains GPT-2")
    parser.add_argument("--nanogpt_dir", default="", help="a NanoGPT checkout: time its model too")
    parser.add_argument("--variants", nargs="+", type=names_among(ATTENTION_CLASSES),
                        default=[ATTENTION_VARIANTS],
                        help="space- or comma-separated (standard, the ratios' base, always)")
    parser.add_argument("--profile", action="store_true",
                        help="then trace 3 steps of each model: where the time goes")
    args = parser.parse_args()
    args.variants = names(args.variants)
    args.shapes = args.shapes.split(",")
    try:
        args.device, args.dtype = resolve_device_and_dtype(args.device, args.dtype)
    except ValueError as e:
        parser.error(str(e))
    if not all(b.isdigit() for b in args.batch_sizes.split(",")):
        parser.error(f"--batch_sizes={args.batch_sizes}: give whole numbers, e.g. 12,16,32")
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.warmup is None:
        args.warmup = 3 if args.compile else 1
    if min(*args.batch_sizes, args.repeats, args.vocab_size) < 1 or args.warmup < 0:
        parser.error("--batch_sizes, --repeats and --vocab_size must be at least 1, "
                     "--warmup at least 0")
    if set(args.shapes) - set(SHAPES):
        parser.error(f"--shapes: choose among {', '.join(SHAPES)}")
    if args.nanogpt_dir and not (Path(args.nanogpt_dir) / "model.py").is_file():
        parser.error(f"--nanogpt_dir={args.nanogpt_dir}: no model.py there (clone NanoGPT)")
    return args


def main():
    args = parse_args()
    # one compiled graph per model and batch size, all under GPT.forward's one code object
    torch._dynamo.config.recompile_limit = 64
    nanogpt = load_nanogpt(args.nanogpt_dir) if args.nanogpt_dir else None
    peak, peak_source = None, "the GPU's dense bf16 peak, runtime.py"
    if args.device.startswith("cuda"):
        peak = gpu_peak_flops(torch.cuda.get_device_name(args.device))
    if peak is None:
        peak, peak_source = measure_matmul_peak(args.device, args.dtype), "a matmul measured here"
    step = "forward+backward+clip+AdamW" if args.optimizer else "forward+backward"
    print(f"# {machine_name(args.device)}; torch {torch.__version__}; {args.dtype}; "
          f"compile {args.compile}; step = {step}; median of {args.repeats} after {args.warmup} "
          f"warm-up; MFU against {peak / 1e12:.1f} TFLOP/s ({peak_source})")
    for name in args.shapes:
        shape = SHAPES[name]
        rows = []
        for batch in args.batch_sizes:
            try:
                batch_rows, profiles = bench(shape, batch, args, nanogpt, peak)
            except torch.OutOfMemoryError as e:  # the batch sizes that fit keep their rows
                print(f"# {name} batch {batch}: out of memory, not measured "
                      f"({str(e).splitlines()[0]})", flush=True)
                continue
            print_progress(name, batch_rows)
            if profiles:
                title = f"where the step's time goes: {name}, batch {batch}"
                print_profile(title, "step", profiles)
            rows += batch_rows
        L, H, d, T = (shape[k] for k in ("n_layer", "n_head", "n_embd", "block_size"))
        print_table(f"{name} ({L}L, {H}H, d={d}, T={T})", rows)


if __name__ == "__main__":
    main()
