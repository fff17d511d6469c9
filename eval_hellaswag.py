"""
HellaSwag (validation, 10,042 examples, zero-shot) for any checkpoint of any attention variant.

    python eval_hellaswag.py --out_dir out            # downloads the data once to --cache_dir
    python eval_hellaswag.py --out_dir out --data_file hellaswag_val.jsonl --limit 500
    python eval_hellaswag.py --init_from gpt2         # OpenAI's GPT-2 124M, for reference
    torchrun --standalone --nproc_per_node 8 eval_hellaswag.py --out_dir out --device cuda

Each example is a context and 4 endings, one of them right. An ending's score is the
log-likelihood of its tokens given the context. Three accuracies (the harness is EleutherAI's
lm-evaluation-harness):

  acc            highest summed log-likelihood, text ex["ctx"] + " " + ending (NanoGPT family)
  acc_norm       same text, highest mean log-likelihood per ending token (build-nanogpt's)
  acc_char_norm  the harness's acc_norm: on the text
                     preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize())
                     + " " + preprocess(ending)
                 (preprocess: strip, " [title]" -> ". ", drop "[...]", "  " -> " "), the highest
                 summed log-likelihood over len(preprocess(ending)), the space not counted.

acc_harness, the harness's acc (summed, its text), comes free from the same forward passes.
"""
import argparse
import http.client
import json
import math
import os
import re
import sys
import time
import urllib.request
from pathlib import Path

import torch
from tqdm import tqdm

from atomic import atomic_file, write_text_atomic
from checkpoint import add_model_arguments, existing_checkpoint_path, load_model_and_tokenizer
from distributed import first_on_any_rank, init_process_group
from runtime import (CpuThreads, autocast_context, is_rank_zero, resolve_device_and_dtype,
                     run_script)
from tokenizer import tokenizer_from_meta

HELLASWAG_FILENAME = "hellaswag_val.jsonl"
HELLASWAG_URL = ("https://raw.githubusercontent.com/rowanz/hellaswag/master/data/"
                 + HELLASWAG_FILENAME)
DEFAULT_CACHE_DIR = Path(__file__).resolve().parent / "data" / "hellaswag"
METRICS = ("acc", "acc_norm", "acc_char_norm", "acc_harness")
HARNESS_FIELDS = ("activity_label", "ctx_a", "ctx_b")  # what acc_char_norm and acc_harness need


class HellaSwagError(ValueError):
    """Data that cannot be had or read: a failed download, a malformed line, untokenizable text."""


def check_at_least_1(**values):
    for name, value in values.items():
        if value is not None and value < 1:
            raise HellaSwagError(f"{name}={value} must be at least 1")


def download_hellaswag(cache_dir=DEFAULT_CACHE_DIR, url=HELLASWAG_URL, timeout=60):
    """Path of the official validation jsonl in cache_dir, downloaded first if absent (written
    whole or not at all, so an interrupted download is never taken for the data)."""
    path = Path(cache_dir) / HELLASWAG_FILENAME
    if not path.is_file():
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                data = response.read()
        except (OSError, http.client.HTTPException) as e:  # no network, or a dropped connection
            raise HellaSwagError(f"could not download {url} ({type(e).__name__}: {e}): fetch "
                                 f"it elsewhere and pass --data_file path/to/{HELLASWAG_FILENAME}")
        with atomic_file(path, "wb") as f:
            f.write(data)
    return path


def load_examples(path, limit=None):
    """The examples of a HellaSwag jsonl file (blank lines skipped), the first `limit` if given,
    each with "label" as an int and "_line", its line number. HellaSwagError names a bad line."""
    check_at_least_1(limit=limit)
    if not Path(path).is_file():
        raise HellaSwagError(f"no HellaSwag data file at {path}")
    examples = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if len(examples) == limit:
                break
            if not line.strip():
                continue
            try:
                example = json.loads(line)  # from bytes: UTF-8 is checked too
            except ValueError as e:
                raise HellaSwagError(f"{path}, line {number}: not valid JSON: {e}") from None
            problem = example_problem(example)
            if problem:
                raise HellaSwagError(f"{path}, line {number}: not a HellaSwag example: {problem}")
            examples.append({**example, "label": int(example["label"]), "_line": number})
    if not examples:
        raise HellaSwagError(f"{path} holds no examples")
    return examples


def example_problem(example):
    """What is wrong with an example, or None."""
    if not isinstance(example, dict):
        return f"expected a JSON object, got {type(example).__name__}"
    for key in ("ctx", *HARNESS_FIELDS):
        if not isinstance(example.get(key, ""), str):
            return f'"{key}" must be a string'
    if "ctx" not in example:
        return 'missing "ctx"'
    endings = example.get("endings")
    if not (isinstance(endings, list) and len(endings) == 4
            and all(isinstance(e, str) for e in endings)):
        return '"endings" must be a list of 4 strings'
    if "label" not in example:
        return 'missing "label" (HellaSwag\'s test file has none: use the validation file)'
    label = example["label"]  # the official file has ints, other copies strings; never 1.7 or True
    if type(label) not in (int, str) or str(label) not in ("0", "1", "2", "3"):
        return f'"label" must be 0..3, an integer or its string, got {label!r}'
    return None


def check_encodable(examples, tokenizer):
    """HellaSwagError naming the first example with characters the tokenizer does not know."""
    for example in examples:
        example_requests(example, tokenizer, set(HARNESS_FIELDS) <= example.keys())


def examples_for_training(path, limit, meta, say=None):
    """(examples, tokenizer) for HellaSwag scores during training, or None, saying why (by default
    on rank 0's stdout) when they cannot be had: training goes on without them."""
    try:
        examples, tokenizer = load_examples(path, limit or None), tokenizer_from_meta(meta)
        check_encodable(examples, tokenizer)  # now, not mid-training
        return examples, tokenizer
    except Exception as e:  # a missing or bad file, or a tokenizer that is not to be had
        if say or is_rank_zero():
            (say or print)(f"warning: HellaSwag evaluation is off, and training goes on "
                           f"without it: {type(e).__name__}: {e}")
        return None


# -----------------------------------------------------------------------------
# scoring: the two texts of an example, their tokens, the log-likelihood of each ending

def harness_preprocess(text):
    """lm-evaluation-harness's HellaSwag text cleaning (the brackets are WikiHow artifacts)."""
    text = text.strip().replace(" [title]", ". ")
    return re.sub(r"\[.*?\]", "", text).replace("  ", " ")


def harness_texts(example):
    """(query, [continuation x4], [character length x4]) as lm-evaluation-harness scores them."""
    query = harness_preprocess(f"{example['activity_label']}: {example['ctx_a']} "
                               f"{example['ctx_b'].capitalize()}")
    choices = [harness_preprocess(ending) for ending in example["endings"]]
    # whitespace ending the query (a "[step]" removed) moves to the continuations, as the harness's
    # _encode_pair does; the normalising length counts neither it nor the " " delimiter
    context = query.rstrip()
    moved = query[len(context):]
    return context, [moved + " " + choice for choice in choices], [len(c) for c in choices]


def example_requests(example, tokenizer, harness=True):
    """([(context ids, continuation ids)] of the 4 endings in NanoGPT's text, " " + ending after
    the raw ctx, then with `harness` the 4 in the harness's; the harness's character lengths)."""
    views = [(example["ctx"], [" " + ending for ending in example["endings"]], None)]
    if harness:
        views.append(harness_texts(example))
    pairs = []
    for context, continuations, _ in views:
        try:
            context_ids = list(tokenizer.encode(context))
            if not context_ids:  # nothing to condition on: from <|endoftext|>, as the harness
                if tokenizer.eot is None:
                    raise ValueError("its context is empty")
                context_ids = [tokenizer.eot]
            pairs += [(context_ids, list(tokenizer.encode(c))) for c in continuations]
        except ValueError as e:  # a character-level vocabulary lacks a character
            raise HellaSwagError(f"example on line {example.get('_line', '?')}: {e}") from None
    return pairs, views[-1][2]


def continuation_logprobs(model, pairs, device="cpu", dtype="float32"):
    """For each (context ids, continuation ids): (summed log-probability of the continuation tokens
    given all before them, number of tokens scored). The pairs go through the model as one
    right-padded batch: causal attention keeps the padding out of the real positions. Of context +
    continuation the last block_size + 1 tokens are used, the first only conditioning."""
    rows = [(list(ctx) + list(cont))[-(model.config.block_size + 1):] for ctx, cont in pairs]
    n_scored = [min(len(cont), len(row) - 1) for (_, cont), row in zip(pairs, rows)]
    T = max(len(row) for row in rows) - 1
    inputs, targets = torch.zeros(2, len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.bool)
    for i, (row, n) in enumerate(zip(rows, n_scored)):
        L = len(row) - 1
        inputs[i, :L], targets[i, :L] = torch.tensor(row[:-1]), torch.tensor(row[1:])
        mask[i, L - n:L] = True  # the continuation's targets are the last n of the row
    inputs, targets, mask = inputs.to(device), targets.to(device), mask.to(device)
    with torch.no_grad(), autocast_context(device, dtype):
        logits = model(inputs, all_logits=True)[0].float()
    # log p(target) = logit[target] - logsumexp(logits), without a log-softmax copy of (B, T, V)
    token_logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)
    return list(zip((token_logprobs * mask).sum(dim=1).double().tolist(), n_scored))


def _argmax(values):
    """Index of the largest value, the first on ties (like numpy.argmax)."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


def predictions(scored, char_lengths):
    """{metric: the ending it picks} from the scored pairs [(sum, n_tokens)] of example_requests:
    the 4 in NanoGPT's text, then the 4 in the harness's where char_lengths is not None."""
    sums = [s for s, _ in scored[:4]]
    preds = {"acc": _argmax(sums), "acc_norm": _argmax([s / n for s, n in scored[:4]])}
    if char_lengths is not None:
        hsums = [s for s, _ in scored[4:]]
        # an ending that cleans to nothing ("[step]") divides by zero in the harness: never chosen
        per_char = [s / c if c else -math.inf for s, c in zip(hsums, char_lengths)]
        preds.update(acc_char_norm=_argmax(per_char), acc_harness=_argmax(hsums))
    return preds


def score_batch(model, batch, tokenizer, harness, device, dtype):
    """[(predictions, how many of the 4 endings were only partly scored in either text)] for each
    example of batch, all through the model in one forward pass."""
    requests = [example_requests(ex, tokenizer, harness) for ex in batch]
    flat = [pair for pairs, _ in requests for pair in pairs]
    scored = continuation_logprobs(model, flat, device, dtype)
    out = []
    for pairs, char_lengths in requests:
        own, scored = scored[:len(pairs)], scored[len(pairs):]
        cut = [n < len(continuation) for (_, continuation), (_, n) in zip(pairs, own)]
        out.append((predictions(own, char_lengths), sum(any(cut[i::4]) for i in range(4))))
    return out


def evaluate(model, examples, tokenizer, device="cpu", batch_size=1, dtype="float32",
             rank=0, world_size=1, progress=False):
    """HellaSwag accuracies of `model` (bare: forward(idx, all_logits=True), config.block_size) on
    `examples` (from load_examples), batch_size examples per forward pass. This rank scores
    examples[rank::world_size], and under torch.distributed the counts are summed over the ranks:
    {metric: accuracy, or None for the harness ones unless every example has HARNESS_FIELDS, "n",
    "correct": {metric: count}, "n_endings_truncated", "block_size"}."""
    check_at_least_1(batch_size=batch_size)
    harness = all(set(HARNESS_FIELDS) <= ex.keys() for ex in examples)  # every rank alike
    metrics = METRICS if harness else METRICS[:2]
    mine = examples[rank::world_size]
    correct, truncated = dict.fromkeys(metrics, 0), 0
    was_training = model.training
    model.eval()  # no dropout while scoring
    with tqdm(total=len(mine), desc="hellaswag", disable=not progress) as bar:
        for start in range(0, len(mine), batch_size):
            batch = mine[start:start + batch_size]
            scores = score_batch(model, batch, tokenizer, harness, device, dtype)
            for ex, (preds, n_cut) in zip(batch, scores):
                truncated += n_cut
                for m in metrics:
                    correct[m] += int(preds[m] == ex["label"])
            bar.update(len(batch))
            bar.set_postfix({m: f"{correct[m] / (start + len(batch)):.4f}" for m in metrics[:3]})
    model.train(was_training)
    counts = [len(mine), truncated, *correct.values()]
    if world_size > 1 and torch.distributed.is_initialized():
        nccl = torch.distributed.get_backend() == "nccl"  # which reduces CUDA tensors only
        counts = torch.tensor(counts, device=device if nccl else "cpu")
        torch.distributed.all_reduce(counts)
        counts = counts.tolist()
    n, truncated, *values = counts
    correct = dict(zip(metrics, values))
    results = {m: correct[m] / n if m in correct else None for m in METRICS}
    results.update(n=n, correct=correct, n_endings_truncated=truncated,
                   block_size=model.config.block_size)
    return results


def evaluate_checkpoint(out_dir, data_file, limit=None, device="auto", dtype="auto", batch_size=1):
    """Score a training run's checkpoint (its out_dir, or the file) on a HellaSwag jsonl: the
    results of `evaluate`, and the checkpoint's iteration (iter_num)."""
    device, dtype = resolve_device_and_dtype(device, dtype)  # a bad one, before anything loads
    examples = load_examples(data_file, limit)
    model, tokenizer, info = load_model_and_tokenizer("resume", out_dir, device)
    check_encodable(examples, tokenizer)
    results = evaluate(model, examples, tokenizer, device, batch_size=batch_size, dtype=dtype)
    return results | {"iter_num": info["iter_num"]}


def accuracies_line(results):
    """The accuracies on one line: 'acc 0.2500 (3/12), ..., acc_harness n/a'."""
    parts = [f"{m} n/a" if results[m] is None else
             f"{m} {results[m]:.4f} ({results['correct'][m]}/{results['n']})" for m in METRICS]
    n = results["n_endings_truncated"]
    if n:
        parts.append(f"{n} ending{' was' if n == 1 else 's were'} longer than block_size and only "
                     f"partly scored")
    return ", ".join(parts)


# -----------------------------------------------------------------------------
# command line

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(p)
    p.add_argument("--data_file", help="a local HellaSwag jsonl (default: the official one)")
    p.add_argument("--cache_dir", default=str(DEFAULT_CACHE_DIR), help="where that one is kept")
    p.add_argument("--limit", type=int, help="evaluate only the first N examples")
    p.add_argument("--batch_size", type=int, default=1, help="examples per forward pass")
    p.add_argument("--output", help="results JSON (default: hellaswag.json beside the checkpoint, "
                                    "or hellaswag_<model>.json)")
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def results_path(args):
    if args.output:
        if not args.output.endswith(".json"):  # never a checkpoint or the data, by a slip
            raise HellaSwagError(f"--output={args.output}: name a .json file")
        return Path(args.output)
    if args.init_from != "resume":
        return Path(f"hellaswag_{args.init_from}.json")
    out = Path(args.out_dir)
    return (out if out.is_dir() else out.parent) / "hellaswag.json"


def find_data_file(data_file, cache_dir, rank=0, launched=False):
    """data_file if given, else the official file in cache_dir: rank 0 downloads it while the other
    ranks wait, then they read its copy (or all raise its error, none retrying)."""
    if data_file:
        return Path(data_file)
    error = None
    if rank == 0:
        try:
            download_hellaswag(cache_dir)
        except HellaSwagError as e:
            error = str(e)
    if launched:
        error = first_on_any_rank(error)
    if error:
        raise HellaSwagError(error)
    return download_hellaswag(cache_dir)  # cached by now


def run_evaluation(args, launched):
    """The results with their "settings" on rank 0, None on the others; the quick checks first."""
    device, dtype = resolve_device_and_dtype(args.device, args.dtype)
    rank, world_size = 0, 1
    if launched:  # by torchrun: each rank on its own GPU
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if device.startswith("cuda"):
            device = f"cuda:{os.environ['LOCAL_RANK']}"
            torch.cuda.set_device(device)
        init_process_group("nccl" if device.startswith("cuda") else "gloo", device)
    CpuThreads(args.threads, device)  # on CPU: as many threads as other processes leave cores free
    check_at_least_1(batch_size=args.batch_size, limit=args.limit)
    if args.init_from == "resume":
        existing_checkpoint_path(args.out_dir)  # a mistyped out_dir, before the download
    data_file = find_data_file(args.data_file, args.cache_dir, rank, launched)
    examples = load_examples(data_file, args.limit)
    model, tokenizer, info = load_model_and_tokenizer(args.init_from, args.out_dir, device)
    check_encodable(examples, tokenizer)  # now, not at an unknown character hours into scoring
    if rank == 0:
        print(f"HellaSwag: {len(examples)} examples from {data_file}; {info['attention']} "
              f"attention, {info['tokenizer']} tokenizer, {device}, {dtype}, world size "
              f"{world_size}", file=sys.stderr)
    t0 = time.time()
    results = evaluate(model, examples, tokenizer, device, args.batch_size, dtype, rank,
                       world_size, progress=not args.no_progress and rank == 0)
    results["settings"] = {**info, "data_file": str(data_file), "limit": args.limit,
                           "batch_size": args.batch_size, "device": device, "dtype": dtype,
                           "world_size": world_size, "seconds": round(time.time() - t0, 2)}
    return results if rank == 0 else None


def main(argv=None):
    args = parse_args(argv)
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1  # by torchrun, more than one process
    try:
        output = results_path(args)
        results = run_evaluation(args, launched)
        if results is not None:
            print(accuracies_line(results))  # first: a file that cannot be written loses none
            write_text_atomic(output, json.dumps(results, indent=2) + "\n")
            print(f"results written to {output}")
    # a bad argument or file, a CheckpointError, a tokenizer or GPT-2 weights out of reach
    except (RuntimeError, ValueError, OSError) as e:
        if is_rank_zero():  # one line for all ranks
            print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if launched and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    run_script(main, "stopped by Ctrl-C; no results written (they are written once all is scored)")
