"""
Benchmark the four attention variants side by side: parameters, FLOPs per token, time per step,
tokens/s and MFU, at one or several batch sizes; optionally against NanoGPT's own model.

    python bench/bench_model.py                       # CPU: a small shape and the GPT-2 124M shape, fp32, batch 1
    python bench/bench_model.py --device=cuda --compile --shapes=gpt2 --batch_sizes=12,16,32 --optimizer \\
        --vocab_size=50304 --nanogpt_dir=../nanoGPT --repeats=30

A step is a forward and backward pass on random tokens, plus with --optimizer gradient clipping and
a fused AdamW step: a whole training step, as train.py runs it in bf16 or fp32 (in fp16 train.py also
runs a GradScaler, which this step leaves out). Timings are taken round-robin (one
step of each model in turn), so a change in machine load hits all of them alike and the ratios stay
fair; the median step is reported. MFU is against the GPU's dense bf16 peak (runtime.py) on a known
GPU, else against a matmul peak measured here, in the dtype of the run.
A batch size that runs out of GPU memory is reported as such and skipped; the others are measured.

--nanogpt_dir adds NanoGPT's model.py (standard attention, its own code) as the first row, built
with the same shape, vocabulary, dropout (0) and biases, and run with the same dtype and compile
setting and its own configure_optimizers (fused AdamW on CUDA, as ours; on a CPU NanoGPT's is not
fused, ours is), so "ours vs NanoGPT" is one column. Its parameters, FLOPs and so its MFU are
standard's count (NanoGPT's own 6N + 12 L d T, which counts its biases and norm gains too, is
0.1 % above it at both shapes here).

--profile then traces 3 steps of each model and prints, per batch size, where the step's time goes:
the kernels that take the most time (on a CPU the operators and compiled graphs, by their own
time), in ms per step, one column per model, so a gap between two rows of the table above shows up
as kernels; where inductor's Triton kernels ran (compiled, on a GPU), a second table breaks them down
by the operators each fuses.
"""

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo's modules, from bench/
from model import ATTENTION_CLASSES, ATTENTION_VARIANTS, GPT, GPTConfig
from machine import names, names_among
from profiling import ms_by_kernel, print_profile
from runtime import (DTYPES, autocast_context, gpu_peak_flops, machine_name, resolve_device_and_dtype,
                     synchronize)

SHAPES = {
    "small": dict(n_layer=6, n_head=6, n_embd=384, block_size=256),
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024),  # GPT-2 124M
}


def measure_matmul_peak(device, dtype, n=None, repeats=10):
    """FLOP/s of a large square matmul, its fastest of `repeats` after one untimed: the practical
    ceiling where no datasheet peak applies (a mean would count the moments other processes took)."""
    if n is None:  # on a GPU a 2048-wide product is over too soon to reach the peak
        n = 8192 if device.startswith("cuda") else 2048
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
    path = Path(nanogpt_dir) / "model.py"
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_models(shape, args, nanogpt):
    """name -> model (NanoGPT's first, then standard and the other variants), each from seed 0, on the
    device, in training mode."""
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
    """One training step on fixed random tokens: forward and backward, and with --optimizer clipping
    and AdamW; torch.compile'd like train.py with --compile."""
    T = model.config.block_size
    idx = torch.randint(0, args.vocab_size, (batch, T + 1), device=args.device)
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()  # as train.py's batches (NanoGPT's loss views them)
    device_type = torch.device(args.device).type
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device_type) if args.optimizer else None
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
    """The table's rows for one batch size, and with --profile each model's time by kernel (else None)."""
    models = build_models(shape, args, nanogpt)
    steps = {name: make_step(model, batch, args) for name, model in models.items()}
    medians = time_round_robin(steps, args)
    T = shape["block_size"]
    rows = []
    for name, model in models.items():
        ours = models["standard"] if name == "nanogpt" else model  # NanoGPT's FLOPs are standard's
        flops = ours.flops_per_token(T)
        tokens_per_s = batch * T / medians[name]
        rows.append(dict(name=name, batch=batch, params=ours.get_num_params(non_embedding=False),
                         attention_params=ours.get_num_attention_params(), flops=flops, ms=medians[name] * 1e3,
                         tokens_per_s=tokens_per_s, mfu=flops * tokens_per_s / peak))
    profiles = None
    if args.profile:  # after the timing, which a profiler once started would slow
        profiles = {name: ms_by_kernel(step, args.device, calls=3) for name, step in steps.items()}
    del models, steps
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return rows, profiles


def print_progress(shape_name, rows):
    """One batch size's rows as soon as they are measured, so that a run stopped midway keeps them."""
    for r in rows:
        print(f"# {shape_name} batch {r['batch']} {r['name']}: {r['ms']:.2f} ms/step, "
              f"{r['tokens_per_s']:,.0f} tokens/s, MFU {100 * r['mfu']:.1f}%", flush=True)


def print_table(title, rows):
    print(f"\n### {title}\n")
    print("| model | batch | params | attn params/layer | FLOPs/token (fwd+bwd) | FLOP ratio | ms/step "
          "| time ratio | tokens/s | MFU |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        base = next(b for b in rows if b["name"] == "standard" and b["batch"] == r["batch"])
        print(
            f"| {r['name']} | {r['batch']} | {r['params'] / 1e6:.2f}M | {r['attention_params']:,} "
            f"| {r['flops'] / 1e6:.1f}M | {r['flops'] / base['flops']:.3f} | {r['ms']:.2f} "
            f"| {r['ms'] / base['ms']:.3f} | {r['tokens_per_s']:,.0f} | {100 * r['mfu']:.1f}% |"
        )


def describe_machine(args, peak, peak_source):
    where = machine_name(args.device)
    step = "forward+backward+clip+AdamW" if args.optimizer else "forward+backward"
    print(f"# {where}; torch {torch.__version__}; {args.dtype}; compile {args.compile}; step = {step}; "
          f"median of {args.repeats} after {args.warmup} warm-up; MFU against {peak / 1e12:.1f} TFLOP/s ({peak_source})")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, or auto")
    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                        help="auto: bf16 on a GPU that has it, else fp16; fp32 on CPU")
    parser.add_argument("--compile", action="store_true", help="torch.compile each model, as train.py does")
    parser.add_argument("--optimizer", action="store_true", help="time whole training steps: add clipping and AdamW")
    parser.add_argument("--batch_sizes", default="1", help="comma-separated, e.g. 12,16,32")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per model (the median is reported)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 1, 3 with --compile)")
    parser.add_argument("--shapes", default="small,gpt2", help=f"comma-separated among {', '.join(SHAPES)}")
    parser.add_argument("--vocab_size", type=int, default=50257, help="50304 (padded) as NanoGPT trains GPT-2")
    parser.add_argument("--nanogpt_dir", default="", help="a NanoGPT checkout: time its model.py as well")
    parser.add_argument("--variants", nargs="+", type=names_among(ATTENTION_CLASSES), default=[ATTENTION_VARIANTS],
                        help="the attention variants to time, space- or comma-separated (standard, the ratios' "
                             "base, always)")
    parser.add_argument("--profile", action="store_true",
                        help="after the timing, trace 3 steps of each model: the time of each kernel (GPU) "
                             "or operator (CPU), side by side, and of inductor's Triton kernels by what they fuse")
    args = parser.parse_args()
    args.variants = names(args.variants)
    try:
        args.device, args.dtype = resolve_device_and_dtype(args.device, args.dtype)
    except ValueError as e:
        parser.error(str(e))
    try:
        args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        parser.error(f"--batch_sizes={args.batch_sizes}: give comma-separated whole numbers, e.g. 12,16,32")
    if min(args.batch_sizes) < 1 or args.repeats < 1 or args.vocab_size < 1 or (args.warmup or 0) < 0:
        parser.error("--batch_sizes, --repeats and --vocab_size must be at least 1, and --warmup at least 0")
    args.shapes = args.shapes.split(",")
    if unknown := set(args.shapes) - set(SHAPES):
        parser.error(f"unknown shapes {sorted(unknown)}; choose among {', '.join(SHAPES)}")
    if args.nanogpt_dir and not (Path(args.nanogpt_dir) / "model.py").is_file():
        parser.error(f"--nanogpt_dir={args.nanogpt_dir}: no model.py there (clone NanoGPT's repository)")
    args.warmup = args.warmup if args.warmup is not None else (3 if args.compile else 1)
    return args


def main():
    args = parse_args()
    # one compiled graph per model and batch size, all under GPT.forward's one code object
    torch._dynamo.config.recompile_limit = 64
    nanogpt = load_nanogpt(args.nanogpt_dir) if args.nanogpt_dir else None
    peak = gpu_peak_flops(torch.cuda.get_device_name(args.device)) if args.device.startswith("cuda") else None
    peak_source = "the GPU's dense bf16 peak, runtime.py"
    if peak is None:
        peak, peak_source = measure_matmul_peak(args.device, args.dtype), "a matmul measured here"
    describe_machine(args, peak, peak_source)
    for name in args.shapes:
        shape = SHAPES[name]
        rows = []
        for batch in args.batch_sizes:
            try:
                batch_rows, profiles = bench(shape, batch, args, nanogpt, peak)
            except torch.OutOfMemoryError as e:  # the batch sizes that fit keep their rows
                print(f"# {name} batch {batch}: out of memory, not measured ({str(e).splitlines()[0]})", flush=True)
                continue
            print_progress(name, batch_rows)
            if profiles:
                print_profile(f"where the step's time goes: {name}, batch {batch}", "step", profiles)
            rows += batch_rows
        print_table(f"{name} ({shape['n_layer']}L, {shape['n_head']}H, d={shape['n_embd']}, T={shape['block_size']})", rows)


if __name__ == "__main__":
    main()
