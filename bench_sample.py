"""
Sampling speed benchmark: tokens/s of GPT.generate with and without the KV cache, for every
attention variant, at two model sizes, random weights, batch 1, a prompt of a few tokens.

    python bench_sample.py                      # the README table (a few minutes on 2 CPU cores)
    python bench_sample.py --sizes small --max_new_tokens 64   # a quick look

It is a benchmark, not a test: numbers depend on the machine and on whatever else is running.
Each measurement is the best of --repeats runs after one short warm-up, which damps noise from
other processes sharing the CPU.
"""
import argparse
import platform
import time

import torch

from model import ATTENTION_VARIANTS, GPT, GPTConfig

SIZES = {
    # a small model, in the range the character-level quick start trains
    "small": dict(n_layer=6, n_head=6, n_embd=384, block_size=512, vocab_size=50304),
    # GPT-2 124M's shape (the paper's size)
    "124M": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304),
}


def tokens_per_second(model, prompt, max_new_tokens, use_kv_cache, repeats):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        model.generate(prompt, max_new_tokens, use_kv_cache=use_kv_cache)
        best = min(best, time.perf_counter() - start)
    return max_new_tokens / best


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--variants", nargs="+", default=list(ATTENTION_VARIANTS), choices=list(ATTENTION_VARIANTS))
    parser.add_argument("--max_new_tokens", type=int, default=256)
    parser.add_argument("--prompt_tokens", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch.set_num_threads; 1 by default: batch-1 decoding is a chain of small ops, and on "
                             "the 2-core VM this was written on 2 threads were 1.5-3.5x slower than 1 (0 = torch's choice)")
    args = parser.parse_args()

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    print(
        f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, batch 1, prompt {args.prompt_tokens} tokens, "
        f"{args.max_new_tokens} new tokens, float32, best of {args.repeats}",
        flush=True,
    )
    rows = []
    for size in args.sizes:
        for variant in args.variants:
            model = GPT(GPTConfig(**SIZES[size], attention=variant, dropout=0.0)).eval()
            prompt = torch.randint(0, 50257, (1, args.prompt_tokens))
            model.generate(prompt, 4, use_kv_cache=True)  # warm-up
            model.generate(prompt, 4, use_kv_cache=False)
            cached = tokens_per_second(model, prompt, args.max_new_tokens, True, args.repeats)
            uncached = tokens_per_second(model, prompt, args.max_new_tokens, False, args.repeats)
            params = model.get_num_params() / 1e6
            rows.append((size, variant, params, uncached, cached))
            print(f"# {size} {variant}: {params:.1f}M params, no cache {uncached:.1f} tok/s, "
                  f"KV cache {cached:.1f} tok/s", flush=True)
            del model

    print()
    print("| size | attention | params | tokens/s, no cache | tokens/s, KV cache | speed-up |")
    print("|---|---|---:|---:|---:|---:|")
    for size, variant, params, uncached, cached in rows:
        print(f"| {size} | {variant} | {params:.1f}M | {uncached:.1f} | {cached:.1f} | {cached / uncached:.1f}x |")


if __name__ == "__main__":
    main()
