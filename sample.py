"""
Sample text from a trained checkpoint (any attention variant) or from OpenAI's GPT-2 weights.

    python sample.py --out_dir out-shakespeare-char --start "ROMEO:" --num_samples 3
    python sample.py --out_dir out/ckpt.pt --start FILE:prompt.txt --max_new_tokens 200 --top_k 50
    python sample.py --init_from gpt2 --start "The meaning of life is"  # needs transformers

The variant and the model's shape come from the checkpoint, the tokenizer (characters or GPT-2
BPE) from the dataset's meta.json, which the checkpoint carries. Only the samples go to stdout;
the speed goes to stderr.
"""
import argparse
import sys
import time
from pathlib import Path

import torch

from checkpoint import add_model_arguments, load_model_and_tokenizer
from runtime import (CpuThreads, autocast_context, resolve_device_and_dtype, run_script,
                     synchronize)


def read_start(start):
    """The prompt: the text itself, or the contents of a file given as FILE:path."""
    if start.startswith("FILE:"):
        return Path(start.removeprefix("FILE:")).read_text(encoding="utf-8")
    return start


def encode_prompt(tokenizer, text):
    """Prompt token ids; an empty prompt starts a GPT-2 BPE model from <|endoftext|>. A character
    vocabulary refuses unknown characters with a ValueError that names them."""
    ids = tokenizer.encode(text) or ([tokenizer.eot] if tokenizer.eot is not None else [])
    if not ids:
        raise ValueError("the prompt is empty: a character-level model needs a character to start")
    return ids


def sample(model, tokenizer, start_ids, num_samples, max_new_tokens, temperature=0.8, top_k=200,
           device="cpu", dtype="float32", use_kv_cache=True, compile=False):
    """num_samples continuations, one after the other (model.generate checks the arguments).
    Returns (texts, seconds spent generating); with compile the first sample's time includes
    compiling."""
    x = torch.tensor(start_ids, dtype=torch.long, device=device)[None, :]
    texts, seconds = [], 0.0
    with torch.no_grad(), autocast_context(device, dtype):
        for _ in range(num_samples):
            t0 = time.perf_counter()
            y = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k,
                               use_kv_cache=use_kv_cache, compile=compile)
            synchronize(device)
            seconds += time.perf_counter() - t0
            # GPT-2's vocabulary is padded to 50304 in the model: an undertrained model samples
            # the padding, which the tokenizer cannot decode
            texts.append(tokenizer.decode([i for i in y[0].tolist() if i < tokenizer.vocab_size]))
    return texts, seconds


def true_or_false(text):
    if text not in ("True", "False"):
        raise argparse.ArgumentTypeError(f"{text!r}: write True or False (or the flag alone)")
    return text == "True"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(p)
    p.add_argument("--start", default="\n", help="prompt text, or FILE:path to read it from")
    p.add_argument("--num_samples", type=int, default=3)
    p.add_argument("--max_new_tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.8, help="> 0; lower is more certain")
    p.add_argument("--top_k", type=int, default=200, help="keep the top_k likeliest; 0: no cut")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--no_kv_cache", action="store_true", help="recompute the context every step")
    # --compile=True / False too, as NanoGPT's sample.py takes it
    p.add_argument("--compile", nargs="?", const=True, default=False, type=true_or_false,
                   help="decode through torch.compile (CUDA graphs on a GPU), for long samples")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        if args.num_samples < 1:
            raise ValueError(f"--num_samples={args.num_samples} must be at least 1")
        device, dtype = resolve_device_and_dtype(args.device, args.dtype)
        CpuThreads(args.threads, device)  # on CPU: as many threads as other processes leave free
        torch.manual_seed(args.seed)
        prompt = read_start(args.start)
        model, tokenizer, info = load_model_and_tokenizer(args.init_from, args.out_dir, device)
        start_ids = encode_prompt(tokenizer, prompt)
        texts, seconds = sample(model, tokenizer, start_ids, args.num_samples, args.max_new_tokens,
                                args.temperature, args.top_k or None, device, dtype,
                                use_kv_cache=not args.no_kv_cache, compile=args.compile)
    # a bad argument or prompt (ValueError), an unreadable file (OSError), a CheckpointError, a
    # tokenizer or GPT-2 weights out of reach (RuntimeError)
    except (RuntimeError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for text in texts:
        print(text)
        print("---------------")
    sys.stdout.flush()  # the samples before the speed line, where both go to one file (2>&1)
    n_tokens = args.num_samples * args.max_new_tokens
    compiled = ", compiled: the time includes compiling" if args.compile else ""
    print(f"{n_tokens} tokens in {seconds:.2f} s: {n_tokens / max(seconds, 1e-9):.1f} tokens/s "
          f"({info['attention']} attention, {info['tokenizer']} tokenizer, {device}, {dtype}, "
          f"KV cache {'off' if args.no_kv_cache else 'on'}{compiled})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_script(main, "stopped by Ctrl-C; no sample was printed (they are printed all at once)")
