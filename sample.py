"""
Sample text from a trained checkpoint (any attention variant) or from OpenAI's GPT-2 weights.

    python sample.py --out_dir out-shakespeare-char --start "ROMEO:" --num_samples 3   # -cpu for the CPU config's
    python sample.py --out_dir out/ckpt.pt --start FILE:prompt.txt --max_new_tokens 200 --top_k 50
    python sample.py --init_from gpt2 --start "The meaning of life is"    # needs transformers + network once

The attention variant and the model's shape come from the checkpoint; the tokenizer (character-level
or GPT-2 BPE) from the dataset's meta.json, which the checkpoint carries under "meta" (older
checkpoints: read from config["data_dir"]; NanoGPT's own: its data/<dataset>/meta.pkl). Generation
uses the model's KV cache unless --no_kv_cache is given; --compile decodes through torch.compile (on
a GPU, a CUDA graph per token: worth its warm-up for long generations). Only the samples go to stdout
(`python sample.py ... > samples.txt`); the tokens/s of the whole run, and any note, go to stderr.
"""
import argparse
import sys
import time
from pathlib import Path

import torch

from checkpoint import add_model_arguments, load_model_and_tokenizer
from generate import check_sampling
from runtime import CpuThreads, autocast_context, resolve_device, resolve_dtype, run_script, synchronize


class SampleError(RuntimeError):
    """A problem with what the user asked for (device, sampling arguments, prompt, ...); a checkpoint's
    own problems, its tokenizer metadata among them, are checkpoint.py's CheckpointError."""


def check_device(device):
    """The device to run on ('auto': cuda if available), or a SampleError saying why it cannot be used."""
    try:
        return resolve_device(device)
    except ValueError as e:
        raise SampleError(str(e)) from e


# -----------------------------------------------------------------------------
# sampling

def read_start(start):
    """The prompt: the text itself, or the contents of a file given as FILE:path."""
    if start.startswith("FILE:"):
        path = Path(start[len("FILE:"):])
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise SampleError(f"--start=FILE:{path}: cannot read the prompt file: {e}") from e
    return start


def encode_prompt(tokenizer, text):
    """Prompt token ids. Character-level vocabularies reject unknown characters with a ValueError
    naming them; an empty prompt starts GPT-2 models from <|endoftext|>."""
    ids = tokenizer.encode(text)
    if not ids:
        if tokenizer.eot is None:
            raise SampleError("the prompt is empty; a character-level model needs at least one character to start from")
        ids = [tokenizer.eot]
    return ids


def safe_decode(tokenizer, ids):
    """Decode, skipping ids the tokenizer does not have (GPT-2's vocab is padded from 50257 to
    50304 in the model, and an undertrained model can sample the padding)."""
    return tokenizer.decode([i for i in ids if i < tokenizer.vocab_size])


def sample(model, tokenizer, start_ids, num_samples, max_new_tokens, temperature=0.8, top_k=200,
           device="cpu", dtype="float32", use_kv_cache=True, compile=False):
    """Generate num_samples continuations one after the other (model.generate checks the sampling
    arguments). Returns (texts, seconds spent generating); with compile=True the first sample's time
    includes compiling."""
    x = torch.tensor(start_ids, dtype=torch.long, device=device)[None, :]
    texts, seconds = [], 0.0
    with torch.no_grad(), autocast_context(device, dtype):
        for _ in range(num_samples):
            t0 = time.perf_counter()
            y = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k,
                               use_kv_cache=use_kv_cache, compile=compile)
            synchronize(device)
            seconds += time.perf_counter() - t0
            texts.append(safe_decode(tokenizer, y[0].tolist()))
    return texts, seconds


def true_or_false(text):
    if text not in ("True", "False"):
        raise argparse.ArgumentTypeError(f"{text!r}: write True or False (or the flag alone for True)")
    return text == "True"


def seed_number(text):
    """argparse type of --seed: what torch.manual_seed takes, as train.py's seed."""
    if not text.strip().isdigit() or int(text) >= 2**63:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number in [0, 2**63)")
    return int(text)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(p)
    p.add_argument("--start", default="\n", help="prompt text, or FILE:path to read it from a file")
    p.add_argument("--num_samples", type=int, default=3)
    p.add_argument("--max_new_tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.8, help="> 0; lower is more deterministic")
    p.add_argument("--top_k", type=int, default=200, help="keep the top_k most likely tokens; 0 = no cut")
    p.add_argument("--seed", type=seed_number, default=1337)
    p.add_argument("--no_kv_cache", action="store_true", help="recompute the whole context at every step (slower)")
    # --compile=True / False too, as NanoGPT's sample.py takes it
    p.add_argument("--compile", nargs="?", const=True, default=False, type=true_or_false,
                   help="decode through torch.compile with a fixed-shape cache (CUDA graphs on a GPU); compiling "
                        "takes a while, so it pays for long generations that stay within block_size (past it, "
                        "each step refills the cache eagerly)")
    return p.parse_args(argv)


def check_arguments(args):
    """Before loading any weights: the sampling arguments as generate.py checks them, and ours."""
    if args.num_samples < 1:
        raise SampleError(f"--num_samples={args.num_samples} must be at least 1")
    try:
        check_sampling(args.temperature, args.top_k or None, args.max_new_tokens, not args.no_kv_cache, args.compile)
    except ValueError as e:
        raise SampleError(str(e)) from e


def main(argv=None):
    args = parse_args(argv)
    try:
        check_arguments(args)
        device = check_device(args.device)
        dtype = resolve_dtype(args.dtype, device)
        CpuThreads(args.threads, device)  # on CPU: as many threads as other processes leave cores free
        torch.manual_seed(args.seed)
        if device.startswith("cuda"):
            torch.cuda.manual_seed(args.seed)
        prompt = read_start(args.start)
        model, tokenizer, info = load_model_and_tokenizer(args.init_from, args.out_dir, device)
        try:
            start_ids = encode_prompt(tokenizer, prompt)
        except ValueError as e:  # CharTokenizer: characters outside the vocabulary
            raise SampleError(f"the prompt cannot be encoded: {e}") from e
        if len(start_ids) > model.config.block_size:
            print(f"note: the prompt has {len(start_ids)} tokens, more than block_size={model.config.block_size}; "
                  f"the model sees only the last {model.config.block_size}", file=sys.stderr)
        texts, seconds = sample(
            model, tokenizer, start_ids, args.num_samples, args.max_new_tokens,
            temperature=args.temperature, top_k=args.top_k or None, device=device, dtype=dtype,
            use_kv_cache=not args.no_kv_cache, compile=args.compile,
        )
    # our errors (CheckpointError, TokenizerUnavailableError, SampleError) are RuntimeErrors, as is pretrained
    # weights out of reach; a ValueError is an argument generate() refuses, an OSError a file that cannot be read
    except (RuntimeError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    for text in texts:
        print(text)
        print("---------------")
    sys.stdout.flush()  # the samples before the speed line, where both go to one file (2>&1)
    n_tokens = args.num_samples * args.max_new_tokens
    rate = n_tokens / seconds if seconds > 0 else float("inf")
    compiled = ", compiled: the time includes compiling" if args.compile else ""  # the first sample compiles
    print(
        f"{n_tokens} tokens in {seconds:.2f} s: {rate:.1f} tokens/s "
        f"({info['attention']} attention, {info['tokenizer']} tokenizer, {device}, {dtype}, "
        f"KV cache {'off' if args.no_kv_cache else 'on'}{compiled})",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    run_script(main, "stopped by Ctrl-C; no sample was printed (they are printed once all are generated)")
