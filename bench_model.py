"""
Benchmark the four attention variants side by side: parameters, FLOPs per token, forward+backward
time per step, tokens/s, and MFU against this machine's measured matmul peak.

    python bench_model.py                       # a small shape and the GPT-2 124M shape, on CPU
    python bench_model.py --device=cuda --batch_size=8 --repeats=20

Timings are taken round-robin (one step of each variant in turn), so that a change in machine
load hits all variants alike and the ratios stay fair.
"""

import argparse
import time

import torch

from model import ATTENTION_VARIANTS, GPT, GPTConfig

SHAPES = {
    "small (6L, 6H, d=384, T=256)": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=50257),
    "gpt2-124M (12L, 12H, d=768, T=1024)": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257),
}


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure_matmul_peak(device, dtype, n=2048, repeats=10):
    """FLOP/s of a large square matmul: the practical ceiling MFU is measured against."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync(device)
    return 2 * n**3 * repeats / (time.perf_counter() - t0)


def make_step(model, batch, device, dtype):
    """One forward+backward pass on random tokens, as a training step minus the optimizer."""
    T = model.config.block_size
    idx = torch.randint(0, model.config.vocab_size, (batch, T + 1), device=device)
    autocast = torch.autocast(device_type=device.split(":")[0], dtype=dtype, enabled=dtype != torch.float32)

    def step():
        with autocast:
            _, loss = model(idx[:, :-1], targets=idx[:, 1:])
        loss.backward()
        model.zero_grad(set_to_none=True)

    return step


def bench_shape(shape, args, peak):
    models, steps, times = {}, {}, {a: [] for a in ATTENTION_VARIANTS}
    for attention in ATTENTION_VARIANTS:
        torch.manual_seed(0)
        models[attention] = GPT(GPTConfig(**shape, attention=attention)).to(args.device).train()
        steps[attention] = make_step(models[attention], args.batch_size, args.device, args.dtype)
        steps[attention]()  # warm-up
    for _ in range(args.repeats):
        for attention in ATTENTION_VARIANTS:
            sync(args.device)
            t0 = time.perf_counter()
            steps[attention]()
            sync(args.device)
            times[attention].append(time.perf_counter() - t0)

    T = shape["block_size"]
    rows = []
    for attention in ATTENTION_VARIANTS:
        model = models[attention]
        dt = sorted(times[attention])[len(times[attention]) // 2]  # median
        flops = model.flops_per_token(T)
        tokens_per_s = args.batch_size * T / dt
        rows.append(dict(
            attention=attention,
            params=model.get_num_params(non_embedding=False),
            attention_params=model.get_num_attention_params(),
            flops=flops,
            ms=dt * 1e3,
            tokens_per_s=tokens_per_s,
            mfu=flops * tokens_per_s / peak,
        ))
    del models, steps
    return rows


def print_table(title, rows):
    base = rows[0]
    print(f"\n### {title}\n")
    print("| attention | params | attn params/layer | FLOPs/token (fwd+bwd) | FLOP ratio | ms/step | time ratio | tokens/s | MFU |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['attention']} | {r['params'] / 1e6:.2f}M | {r['attention_params']:,} | {r['flops'] / 1e6:.1f}M "
            f"| {r['flops'] / base['flops']:.3f} | {r['ms']:.1f} | {r['ms'] / base['ms']:.3f} "
            f"| {r['tokens_per_s']:,.0f} | {100 * r['mfu']:.1f}% |"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--batch_size", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per variant (the median is reported)")
    parser.add_argument("--shapes", default="all", help="'all', or 'small' / 'gpt2' for one of them")
    args = parser.parse_args()
    args.dtype = getattr(torch, args.dtype)

    peak = measure_matmul_peak(args.device, args.dtype)
    print(f"device {args.device}, {torch.get_num_threads()} threads, dtype {args.dtype}, batch {args.batch_size}, "
          f"median of {args.repeats} steps; measured matmul peak {peak / 1e9:.1f} GFLOP/s")
    for title, shape in SHAPES.items():
        if args.shapes == "all" or title.startswith(args.shapes):
            print_table(title, bench_shape(shape, args, peak))


if __name__ == "__main__":
    main()
