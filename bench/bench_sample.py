"""
Sampling speed: tokens/s of GPT.generate without the KV cache, with it, and (with --compile) with
the compiled fixed-shape decoder, for every attention variant, random weights, batch 1.

    python bench/bench_sample.py                      # the CPU table in docs/sampling.md
    python bench/bench_sample.py --sizes small --max_new_tokens 64      # a quick look
    python bench/bench_sample.py --device cuda --compile --sizes 124M --repeats 3   # on a GPU

tokens/s is the new tokens over the whole generate call, the prompt's forward pass included. Each
figure is the best of --repeats runs, after one untimed run (which compiles, with --compile).
"""
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo's modules, from bench/
from machine import names, names_among
from model import ATTENTION_CLASSES, ATTENTION_VARIANTS, GPT, GPTConfig
from profiling import ms_by_kernel, print_profile
from runtime import DTYPES, autocast_context, machine_name, resolve_device_and_dtype, synchronize

SIZES = {
    "small": dict(n_layer=6, n_head=6, n_embd=384, block_size=512, vocab_size=50304),
    "124M": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304),
}
PROFILED_TOKENS = 32  # enough to average over, few enough for a quick trace


def tokens_per_second(model, prompt, args, **generate_args):
    """Best of args.repeats runs, after one untimed run (which compiles, with compile=True)."""
    best = float("inf")
    with autocast_context(args.device, args.dtype):
        model.generate(prompt, args.max_new_tokens, **generate_args)
        for _ in range(args.repeats):
            synchronize(args.device)
            start = time.perf_counter()
            model.generate(prompt, args.max_new_tokens, **generate_args)
            synchronize(args.device)
            best = min(best, time.perf_counter() - start)
    return args.max_new_tokens / best


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", type=names_among(SIZES), default=[SIZES],
                        help=f"space- or comma-separated among {', '.join(SIZES)}")
    parser.add_argument("--variants", nargs="+", type=names_among(ATTENTION_CLASSES),
                        default=[ATTENTION_VARIANTS], help="space- or comma-separated")
    parser.add_argument("--max_new_tokens", type=int, default=256)
    parser.add_argument("--prompt_tokens", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, or auto")
    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                        help="auto: bf16 on a GPU that has it, else fp16; fp32 on CPU")
    parser.add_argument("--compile", action="store_true", help="also time generate(compile=True)")
    parser.add_argument("--profile", action="store_true",
                        help="then trace 32 tokens of the last path: where a token's time goes")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch's threads; 0: torch's choice (batch-1 decoding is a chain of "
                             "small ops, which more threads slow on a small VM)")
    args = parser.parse_args()
    args.sizes = names(args.sizes)
    args.variants = names(args.variants)
    if min(args.max_new_tokens, args.prompt_tokens, args.repeats) < 1 or args.threads < 0:
        parser.error("--max_new_tokens, --prompt_tokens and --repeats must be at least 1, "
                     "--threads at least 0")
    try:
        args.device, args.dtype = resolve_device_and_dtype(args.device, args.dtype)
    except ValueError as e:
        parser.error(str(e))
    return args


def bench_variant(size, variant, args):
    """(params in millions, {path: tokens/s}, the profile of the last path or None)."""
    config = GPTConfig(**SIZES[size], attention=variant, dropout=0.0)
    model = GPT(config).to(args.device).eval()
    prompt = torch.randint(0, 50257, (1, args.prompt_tokens), device=args.device)
    speeds = {"no cache": tokens_per_second(model, prompt, args, use_kv_cache=False),
              "KV cache": tokens_per_second(model, prompt, args)}
    if args.compile:
        speeds["compiled"] = tokens_per_second(model, prompt, args, compile=True)
    profile = None
    if args.profile:  # after the timing, which a profiler once started would slow
        tokens = min(args.max_new_tokens, PROFILED_TOKENS)
        with autocast_context(args.device, args.dtype):
            profile = ms_by_kernel(lambda: model.generate(prompt, tokens, compile=args.compile),
                                   args.device, units=tokens)
    return model.get_num_params() / 1e6, speeds, profile


def main():
    args = parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    print(f"# torch {torch.__version__}, {machine_name(args.device)}, batch 1, prompt "
          f"{args.prompt_tokens} tokens, {args.max_new_tokens} new tokens, {args.dtype}, "
          f"best of {args.repeats}", flush=True)
    rows, profiles = [], {}
    for size in args.sizes:
        for variant in args.variants:
            params, speeds, profiles[size, variant] = bench_variant(size, variant, args)
            rows.append((size, variant, params, speeds))
            print(f"# {size} {variant}: {params:.1f}M params, "
                  + ", ".join(f"{k} {v:.1f} tok/s" for k, v in speeds.items()), flush=True)

    columns = list(rows[0][3])
    print("\n| size | attention | params | "
          + " | ".join(f"tokens/s, {c}" for c in columns) + " | speed-up |")
    print("|---|---|---:|" + "---:|" * (len(columns) + 1))
    for size, variant, params, speeds in rows:
        cells = " | ".join(f"{speeds[c]:.1f}" for c in columns)
        speed_up = speeds[columns[-1]] / speeds["no cache"]
        print(f"| {size} | {variant} | {params:.1f}M | {cells} | {speed_up:.1f}x |")
    if args.profile:
        for size in args.sizes:
            measured = " / ".join(f"{1e3 / speeds[columns[-1]]:.3f}"
                                  for s, _, _, speeds in rows if s == size)
            title = f"where a token's time goes, {columns[-1]}: {size} (measured: {measured} ms " \
                    "per token)"
            print_profile(title, "token", {v: profiles[size, v] for v in args.variants})


if __name__ == "__main__":
    main()
