"""
HellaSwag (validation, 10,042 examples, zero-shot) for any checkpoint of any attention variant.

    python eval_hellaswag.py --out_dir out                       # downloads the data once to --cache_dir
    python eval_hellaswag.py --out_dir out --data_file hellaswag_val.jsonl --limit 500 --batch_size 4
    python eval_hellaswag.py --init_from gpt2 --device cuda      # OpenAI's GPT-2 124M, for reference
    torchrun --standalone --nproc_per_node 8 eval_hellaswag.py --out_dir out --device cuda

Each example is a context and 4 endings, one of them right. The model scores each ending by the
log-likelihood of the ending's tokens given the context (the context's own tokens are not scored),
and the example counts as right when the highest-scoring ending is the labelled one. Three scores:

  acc            highest summed log-likelihood. Text: example["ctx"] + " " + ending, raw, the way
                 NanoGPT-family evaluators (karpathy's build-nanogpt hellaswag.py) build it.
  acc_norm       same text, highest mean log-likelihood per ending token. This is how NanoGPT-family
                 evaluators report HellaSwag (GPT-2 124M: 0.2955).
  acc_char_norm  EleutherAI lm-evaluation-harness's "acc_norm": its own text,
                     query  = preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize())
                     ending = " " + preprocess(ending)
                 with preprocess = strip, " [title]" -> ". ", remove "[...]", "  " -> " " (one pass,
                 as the harness does), and the highest summed log-likelihood divided by the length in
                 characters of the preprocessed ending WITHOUT its leading space: the harness scores
                 " " + choice but divides by len(choice) (task.py: completion_len = len(i) for i in
                 choices, the choices before the target delimiter is added). GPT-2 124M: 0.3114.

The harness's plain "acc" (summed log-likelihood on its preprocessed text) comes for free from the
same forward passes and is reported as acc_harness. The paper's 0.31 / 0.31 / 0.30 is most likely
acc_char_norm: see docs/hellaswag.md.

The data is one JSON object per line. Each needs "ctx" (text), "endings" (4 texts) and "label"
(0..3, or its string); the official file's "activity_label", "ctx_a" and "ctx_b" (text) are needed for
acc_char_norm and acc_harness only: where an example lacks them, those two are reported as null.

Contexts longer than the model's block size are cut from the left: of context + ending, the last
block_size + 1 tokens are kept and the first of them only conditions (as the harness does). An
ending longer than block_size tokens (possible with a character-level model) is scored on its last
block_size tokens only; such endings are counted in n_endings_truncated.
"""
import argparse
import contextlib
import http.client
import json
import math
import os
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import torch

from atomic import atomic_file, why_not_writable, write_text_atomic
from checkpoint import add_model_arguments, existing_checkpoint_path, load_model_and_tokenizer
from runtime import (CpuThreads, autocast_context, is_rank_zero, resolve_device, resolve_device_and_dtype,
                     run_script)

HELLASWAG_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
HELLASWAG_FILENAME = "hellaswag_val.jsonl"
HELLASWAG_VAL_SIZE = 10042
DEFAULT_CACHE_DIR = Path(__file__).resolve().parent / "data" / "hellaswag"
NUM_ENDINGS = 4
METRICS = ("acc", "acc_norm", "acc_char_norm", "acc_harness")
HARNESS_METRICS = ("acc_char_norm", "acc_harness")  # computed from HARNESS_FIELDS
HARNESS_FIELDS = ("activity_label", "ctx_a", "ctx_b")
METRIC_DESCRIPTIONS = {  # written into the results JSON, under "settings"
    "acc": "argmax summed log-likelihood of ' ' + ending given ex['ctx'] (NanoGPT-family text)",
    "acc_norm": "argmax mean log-likelihood per ending token, same text (build-nanogpt's acc_norm)",
    "acc_char_norm": "argmax summed log-likelihood / len(preprocessed ending), lm-evaluation-harness text and normalisation (its acc_norm)",
    "acc_harness": "argmax summed log-likelihood, lm-evaluation-harness text (its acc)",
}


class HellaSwagError(ValueError):
    """Data that cannot be had or read: download failure, malformed line, untokenizable text."""


# -----------------------------------------------------------------------------
# loading

def download_hellaswag(cache_dir=DEFAULT_CACHE_DIR, url=HELLASWAG_URL, timeout=60):
    """Path of the official validation jsonl in cache_dir, downloading it first if absent.

    The file (11 MB) is written through atomic.py only once it is complete and of the expected size
    (10,042 lines), so an interrupted download is never mistaken for the data."""
    path = Path(cache_dir) / HELLASWAG_FILENAME
    if path.is_file():
        return path
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data = response.read()
    # HTTPException: a connection dropped mid-download (IncompleteRead), which is no OSError
    except (urllib.error.URLError, OSError, TimeoutError, http.client.HTTPException) as e:
        raise HellaSwagError(
            f"could not download HellaSwag from {url} ({type(e).__name__}: {e}). Without network, fetch "
            f"that file on another machine and pass it with --data_file path/to/{HELLASWAG_FILENAME} "
            f"(or put it at {path})"
        ) from e
    n_lines = sum(1 for line in data.splitlines() if line.strip())
    if n_lines != HELLASWAG_VAL_SIZE:
        raise HellaSwagError(
            f"downloaded {url} but it has {n_lines} examples, not {HELLASWAG_VAL_SIZE}: refusing to cache it"
        )
    try:  # the download worked: a failure here is the cache folder's, not the network's
        with atomic_file(path, "wb") as f:
            f.write(data)
    except OSError as e:
        raise HellaSwagError(f"downloaded {url} but cannot save it as {path} "
                             f"({why_not_writable(path.parent, e)}): pass --cache_dir with a writable folder") from e
    return path


def _check_example(example):
    """None if example has the fields scoring needs, else what is wrong."""
    if not isinstance(example, dict):
        return f"expected a JSON object, got {type(example).__name__}"
    if not isinstance(example.get("ctx"), str):
        return '"ctx" must be a string' if "ctx" in example else 'missing "ctx"'
    wrong = next((key for key in HARNESS_FIELDS if key in example and not isinstance(example[key], str)), None)
    if wrong:
        return f'"{wrong}" must be a string'
    endings = example.get("endings")
    if not (isinstance(endings, list) and len(endings) == NUM_ENDINGS and all(isinstance(e, str) for e in endings)):
        return f'"endings" must be a list of {NUM_ENDINGS} strings'
    if "label" not in example:  # as in the official hellaswag_test.jsonl, whose answers are not public
        return 'missing "label", the right ending (HellaSwag\'s test file has none: score the validation file)'
    label = example.get("label")
    # the official file has ints; other copies sometimes strings. int() would also take 1.7 (as 1) and True
    if not (type(label) is int or isinstance(label, str) and re.fullmatch(r"[0-9]+", label)):
        return f'"label" must be an integer 0..{NUM_ENDINGS - 1}, got {label!r}'
    label = int(label)
    if not 0 <= label < NUM_ENDINGS:
        return f'"label" must be in 0..{NUM_ENDINGS - 1}, got {label}'
    return None


def check_limit(limit):
    if limit is not None and limit < 1:
        raise HellaSwagError(f"limit={limit} must be at least 1 (leave it out, or None, for every example)")


def load_examples(path, limit=None):
    """The examples of a HellaSwag-format jsonl file (one JSON object per line; blank lines skipped),
    the first `limit` of them if given. A malformed line raises HellaSwagError naming its line number.
    Each example gets "label" as an int and "_line", its line number."""
    path = Path(path)
    check_limit(limit)
    if path.is_dir():
        raise HellaSwagError(f"HellaSwag data file {path} is a folder: pass the .jsonl file in it")
    if not path.is_file():
        raise HellaSwagError(f"HellaSwag data file {path} does not exist")
    examples = []
    with open(path, "rb") as f:  # bytes: each line is decoded on its own, so a bad byte is found on its line
        for line_number, line in enumerate(f, start=1):
            if limit is not None and len(examples) >= limit:
                break
            if line.strip():
                examples.append(_parse_example(line, path, line_number))
    if not examples:
        raise HellaSwagError(f"{path} holds no examples")
    return examples


def _parse_example(line, path, line_number):
    """The checked example on one line (bytes) of a HellaSwag file; HellaSwagError naming the line if not one."""
    try:
        example = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise HellaSwagError(f"{path}, line {line_number}: not UTF-8 text: byte 0x{line[e.start]:02x} at offset "
                             f"{e.start} of the line is not valid UTF-8") from None
    except json.JSONDecodeError as e:
        problem = e.msg.removesuffix(" at")  # json's "Invalid control character at", its column said before
        raise HellaSwagError(f"{path}, line {line_number}, column {e.colno}: not valid JSON: {problem}") from None
    problem = _check_example(example)
    if problem:
        raise HellaSwagError(f"{path}, line {line_number}: not a HellaSwag example: {problem}")
    example["label"] = int(example["label"])
    example["_line"] = line_number
    return example


def examples_for_training(path, limit, meta, say):
    """(examples, tokenizer) for HellaSwag scores during training, or None, saying why, when they
    cannot be had: training goes on without them."""
    try:
        from tokenizer import tokenizer_from_meta

        examples, tokenizer = load_examples(path, limit or None), tokenizer_from_meta(meta)
        check_encodable(examples, tokenizer)  # here, not mid-training
        return examples, tokenizer
    except Exception as e:  # a missing or bad file, or a tokenizer that is not to be had
        say(f"warning: HellaSwag evaluation is off, and training goes on without it: {type(e).__name__}: {e}")
        return None


def check_encodable(examples, tokenizer):
    """HellaSwagError naming the first example with text the tokenizer cannot encode (a character-level
    model meets characters outside its vocabulary)."""
    for example in examples:
        example_requests(example, tokenizer, has_harness_text(example))


# -----------------------------------------------------------------------------
# scoring: the two texts of an example, their tokens, the log-likelihood of each ending

def harness_preprocess(text):
    """lm-evaluation-harness's HellaSwag text cleaning (the brackets are WikiHow artifacts)."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def nanogpt_texts(example):
    """(context, [continuation x4]) as NanoGPT-family evaluators score them: raw ctx, " " + ending."""
    return example["ctx"], [" " + ending for ending in example["endings"]]


def has_harness_text(example):
    return all(key in example for key in HARNESS_FIELDS)


def harness_texts(example):
    """(query, [continuation x4], [character length x4]) as lm-evaluation-harness scores them."""
    query = harness_preprocess(example["activity_label"] + ": " + example["ctx_a"] + " " + example["ctx_b"].capitalize())
    choices = [harness_preprocess(ending) for ending in example["endings"]]
    # the continuation carries the target delimiter " ", the normalising length does not; and whitespace
    # that ends the query (a "[step]" removed) moves to the continuations, as the harness's _encode_pair does
    context = query.rstrip()
    moved = query[len(context):]
    return context, [moved + " " + choice for choice in choices], [len(choice) for choice in choices]


def _encode(tokenizer, text, example, what):
    try:
        return list(tokenizer.encode(text))
    except ValueError as e:  # CharTokenizer: characters outside the vocabulary
        raise HellaSwagError(f"example on line {example.get('_line', '?')}: cannot tokenize its {what}: {e}") from None


def example_requests(example, tokenizer, harness=True):
    """The (context ids, continuation ids) pairs of one example: 4 in the NanoGPT view, 4 in the
    harness view if `harness` (duplicates are scored once). Returns (pairs, nanogpt_index, harness_index,
    char_lengths) where the indexes map each of the 4 endings of a view to its pair; without the
    harness view, harness_index and char_lengths are None."""
    pairs, index_of = [], {}

    def add(context_ids, continuation_ids):
        key = (tuple(context_ids), tuple(continuation_ids))
        if key not in index_of:
            index_of[key] = len(pairs)
            pairs.append(key)
        return index_of[key]

    views, char_lengths = [], None
    texts = [(*nanogpt_texts(example), "ctx")]
    if harness:
        query, hconts, char_lengths = harness_texts(example)
        texts.append((query, hconts, "harness query"))
    for context, continuations, what in texts:
        context_ids = _encode(tokenizer, context, example, what)
        if not context_ids:  # nothing to condition on: start from <|endoftext|> like the harness
            if tokenizer.eot is None:
                raise HellaSwagError(f"example on line {example.get('_line', '?')}: empty context")
            context_ids = [tokenizer.eot]
        views.append([add(context_ids, _encode(tokenizer, c, example, "ending")) for c in continuations])
    return pairs, views[0], views[1] if harness else None, char_lengths


def continuation_logprobs(model, pairs, device="cpu", dtype="float32"):
    """For each (context ids, continuation ids) pair: (sum of the model's log-probabilities of the
    continuation tokens given everything before them, number of tokens scored). All pairs go through
    the model as one right-padded batch; causal attention keeps padding out of the real positions.

    Of context + continuation the last block_size + 1 tokens are used (the first conditions only),
    so at most block_size continuation tokens are scored."""
    block_size = model.config.block_size
    rows, n_scored = [], []
    for context_ids, continuation_ids in pairs:
        if not continuation_ids:
            raise HellaSwagError("an ending tokenizes to nothing")
        full = (list(context_ids) + list(continuation_ids))[-(block_size + 1):]
        rows.append(full)
        n_scored.append(min(len(continuation_ids), len(full) - 1))
    T = max(len(r) for r in rows) - 1
    inputs = torch.zeros(len(rows), T, dtype=torch.long)
    targets = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.bool)
    for i, (row, n) in enumerate(zip(rows, n_scored)):
        L = len(row) - 1
        inputs[i, :L] = torch.tensor(row[:-1])
        targets[i, :L] = torch.tensor(row[1:])
        mask[i, L - n:L] = True  # the continuation's targets are the last n of the row
    inputs, targets, mask = inputs.to(device), targets.to(device), mask.to(device)
    with torch.no_grad(), autocast_context(device, dtype):
        logits, _ = model(inputs, all_logits=True)
    logits = logits.float()
    # log p(target) = logit[target] - logsumexp(logits): no full log-softmax copy of a (B, T, V) tensor
    token_logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    sums = (token_logprobs * mask).sum(dim=1).double().tolist()
    return list(zip(sums, n_scored))


# -----------------------------------------------------------------------------
# metrics

def _argmax(values):
    """Index of the largest value, the first on ties (like numpy.argmax)."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


def score_example(example, scored, nanogpt_index, harness_index, char_lengths):
    """Per-example predictions of the metrics from the scored pairs [(sum, n_tokens), ...]; the harness
    ones only with a harness view (harness_index not None)."""
    sums = [scored[j][0] for j in nanogpt_index]
    counts = [scored[j][1] for j in nanogpt_index]
    preds = {"acc": _argmax(sums), "acc_norm": _argmax([s / n for s, n in zip(sums, counts)])}
    hsums = None
    if harness_index is not None:
        hsums = [scored[j][0] for j in harness_index]
        # an ending that preprocesses to nothing ("[step]") divides by zero in the harness: -inf, never chosen
        preds["acc_char_norm"] = _argmax([s / c if c else -math.inf for s, c in zip(hsums, char_lengths)])
        preds["acc_harness"] = _argmax(hsums)
    return {
        "line": example.get("_line"), "label": example["label"], "pred": preds,
        "logprob_sum": sums, "n_tokens": counts, "harness_logprob_sum": hsums, "char_lengths": char_lengths,
    }


def check_batch_size(batch_size):
    if batch_size < 1:
        raise HellaSwagError(f"batch_size={batch_size} must be at least 1")


def score_batch(model, batch, tokenizer, harness, device, dtype):
    """[(score_example's result, how many of its endings were only partly scored)] for each example
    of batch, all of them through the model in one forward pass."""
    requests = [example_requests(ex, tokenizer, harness) for ex in batch]
    scored = continuation_logprobs(model, [pair for req in requests for pair in req[0]], device, dtype)
    out, offset = [], 0
    for ex, (pairs, nanogpt_index, harness_index, char_lengths) in zip(batch, requests):
        own = scored[offset:offset + len(pairs)]
        offset += len(pairs)
        out.append((score_example(ex, own, nanogpt_index, harness_index, char_lengths),
                    _endings_cut(pairs, own, nanogpt_index, harness_index)))
    return out


def _endings_cut(pairs, scored, nanogpt_index, harness_index):
    """How many of an example's 4 endings were only partly scored in either view (once each)."""
    cut = {j for j, ((_, continuation), (_, n)) in enumerate(zip(pairs, scored)) if n < len(continuation)}
    views = [nanogpt_index] + ([harness_index] if harness_index is not None else [])
    return sum(1 for pair_of_view in zip(*views) if cut.intersection(pair_of_view))


@contextlib.contextmanager
def _eval_mode(model):
    """The model in eval mode (no dropout) while scoring, then back in training mode if it was."""
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        yield
    finally:
        if was_training:
            model.train()


def _progress_bar(progress, total, rank, world_size):
    """A tqdm bar over this rank's examples (closed on leaving its `with`), or nothing to show."""
    if not progress:
        return contextlib.nullcontext()
    from tqdm import tqdm

    return tqdm(total=total, desc=f"hellaswag rank {rank}" if world_size > 1 else "hellaswag", unit="ex")


def _sum_over_ranks(counts, device, world_size):
    """The counts (ints) summed over the ranks when torch.distributed is initialised, else as given."""
    if not (world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()):
        return counts
    on = device if torch.distributed.get_backend() == "nccl" else "cpu"  # NCCL reduces CUDA tensors only
    total = torch.tensor(counts, dtype=torch.long, device=on)
    torch.distributed.all_reduce(total)
    return total.tolist()


def evaluate(model, examples, tokenizer, device="cpu", batch_size=1, dtype="float32",
             rank=0, world_size=1, progress=False, return_details=False):
    """HellaSwag accuracies of `model` on `examples` (from load_examples).

    model: anything with forward(idx, all_logits=True) -> (logits (B, T, V), _) and .config.block_size
    (pass the bare model, not a DDP wrapper). tokenizer: .encode(text) -> ids, .eot (None if absent).
    batch_size examples (each up to 8 sequences: 4 endings x 2 texts) go through the model at once.
    With world_size > 1 this rank scores examples[rank::world_size] and, when torch.distributed is
    initialised, the counts are summed over the ranks, so every rank returns the global result.

    Returns {"acc", "acc_norm", "acc_char_norm", "acc_harness", "n", "correct": {metric: count},
    "n_endings_truncated", "block_size"} (+ "details", this rank's per-example scores, if
    return_details). The two harness metrics are None, and not in "correct", unless every example
    has HARNESS_FIELDS."""
    check_batch_size(batch_size)
    harness = all(has_harness_text(ex) for ex in examples)  # over all examples: every rank decides alike
    metrics = METRICS if harness else tuple(m for m in METRICS if m not in HARNESS_METRICS)
    mine = examples[rank::world_size]
    correct, truncated, details = dict.fromkeys(metrics, 0), 0, []
    with _eval_mode(model), _progress_bar(progress, len(mine), rank, world_size) as bar:
        for start in range(0, len(mine), batch_size):
            batch = mine[start:start + batch_size]
            for result, n_truncated in score_batch(model, batch, tokenizer, harness, device, dtype):
                truncated += n_truncated
                for m in metrics:
                    correct[m] += int(result["pred"][m] == result["label"])
                if return_details:
                    details.append(result)
            if bar is not None:
                bar.update(len(batch))
                bar.set_postfix({m: f"{correct[m] / bar.n:.4f}" for m in metrics[:3]})
    n, truncated, *values = _sum_over_ranks([len(mine), truncated, *correct.values()], device, world_size)
    correct = dict(zip(metrics, values))
    results = {m: (correct[m] / n if n else float("nan")) if m in correct else None for m in METRICS}
    results.update(n=n, correct=correct, n_endings_truncated=truncated, block_size=model.config.block_size)
    if return_details:
        results["details"] = details
    return results


def evaluate_checkpoint(out_dir, data_file, limit=None, device="auto", dtype="auto", batch_size=1):
    """Load a training run's checkpoint (its out_dir, or the file) with its tokenizer and score it on
    a HellaSwag jsonl: the results of `evaluate`, and the checkpoint's iteration (iter_num)."""
    device, dtype = resolve_device_and_dtype(device, dtype)  # a bad one is refused before anything loads
    examples = load_examples(data_file, limit)
    model, tokenizer, info = load_model_and_tokenizer("resume", out_dir, device)
    check_encodable(examples, tokenizer)
    return evaluate(model, examples, tokenizer, device, batch_size=batch_size, dtype=dtype) | {"iter_num": info["iter_num"]}


# -----------------------------------------------------------------------------
# reporting

def _default_output(args):
    if args.init_from != "resume":
        return Path(f"hellaswag_{args.init_from}.json")
    out = Path(args.out_dir)
    return (out if out.is_dir() else out.parent) / "hellaswag.json"


def check_writable(output):
    """Raise HellaSwagError unless the results file can be written, so that an evaluation (hours on
    the full set) never runs only to lose its results. Leaves no file behind. Returns a note to print
    where the file holds an earlier evaluation's results, else ""."""
    output = Path(output)
    if output.is_dir():
        raise HellaSwagError(f"the results file --output={output} is a folder: name a file in it")
    existed = output.exists()
    if existed and not is_results_file(output):  # a checkpoint, the data file: never overwritten
        raise HellaSwagError(f"--output={output} exists and is not a results file of eval_hellaswag.py, which "
                             f"would replace it: name another file")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        with open(output, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise HellaSwagError(f"cannot write the results file {output} ({why_not_writable(output.parent, e)}): "
                             f"pass --output with a writable path") from None
    if not existed:
        output.unlink()
        return ""
    # an earlier evaluation's: replaced when this one ends, as a rerun expects, but said
    earlier = json.loads(output.read_text(encoding="utf-8"))
    return (f"note: {output} holds an earlier evaluation's results ({earlier['n']} examples of "
            f"{earlier['settings'].get('data_file', '?')}), which this one's will replace")


def is_results_file(path, max_bytes=1 << 20):
    """Whether path holds the results JSON an earlier evaluation wrote (small, with its accuracies and settings)."""
    try:
        if path.stat().st_size > max_bytes:
            return False
        results = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(results, dict) and {"acc", "n", "settings"} <= results.keys()


def report(results, output):
    """Write the results JSON, then print the accuracies: a reader that stops reading early
    (`| head -1`, which ends the printing) loses no results, and a failed write still shows them."""
    try:
        write_text_atomic(output, json.dumps(results, indent=2) + "\n")
    except OSError as e:
        print_accuracies(results)
        raise HellaSwagError(f"cannot write the results file {output} ({e.strerror}); "
                             f"the accuracies are printed above") from None
    print_accuracies(results)
    print(f"results written to {output}")


def print_accuracies(results):
    for m in METRICS:
        if results[m] is None:
            print(f"{m:>14}: n/a (needs {', '.join(HARNESS_FIELDS)} in every example)")
        else:
            print(f"{m:>14}: {results[m]:.4f}  ({results['correct'][m]}/{results['n']})")
    if results["n_endings_truncated"]:
        print(f"note: {truncation_note(results['n_endings_truncated'])}")


def accuracies_line(results):
    """The accuracies on one line, as training logs them: 'acc 0.2500 (3/12), ..., acc_harness n/a'."""
    parts = [f"{m} n/a" if results[m] is None else f"{m} {results[m]:.4f} ({results['correct'][m]}/{results['n']})"
             for m in METRICS]
    if results["n_endings_truncated"]:
        parts.append(truncation_note(results["n_endings_truncated"]))
    return ", ".join(parts)


def truncation_note(n):
    return f"{n} ending{' was' if n == 1 else 's were'} longer than block_size and only partly scored"


# -----------------------------------------------------------------------------
# command line

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(p)
    p.add_argument("--data_file", default=None, help="a local HellaSwag-format jsonl (default: download the official validation set)")
    p.add_argument("--cache_dir", default=str(DEFAULT_CACHE_DIR), help="where the official file is downloaded to once")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N examples")
    p.add_argument("--batch_size", type=int, default=1, help="examples per forward pass (each is up to 8 sequences: its 4 endings in NanoGPT's view and in the harness's, a duplicate scored once)")
    p.add_argument("--output", default=None, help="results JSON (default: hellaswag.json beside the checkpoint, or hellaswag_<model>.json)")
    p.add_argument("--no_progress", action="store_true", help="no tqdm progress bar")
    return p.parse_args(argv)


def join_ranks(device):
    """Under torchrun: join the process group, each rank on its own GPU when the device is CUDA.
    Returns (rank, world_size, device)."""
    from distributed import init_process_group

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = resolve_device(device).startswith("cuda")
    if use_cuda:
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    init_process_group("nccl" if use_cuda else "gloo", device)
    return rank, world_size, device


def find_data_file(data_file, cache_dir, rank=0, launched=False):
    """data_file if given, else the official file in cache_dir: rank 0 downloads it while the other
    ranks wait, then they read its copy."""
    if data_file:
        return Path(data_file)
    failure = None
    if rank == 0:
        try:
            path = download_hellaswag(cache_dir)
        except HellaSwagError as e:  # reach the barrier anyway, so no rank hangs
            failure = e
    if launched:  # the others wait for it, and learn whether it failed (each would otherwise retry and fail)
        from distributed import first_on_any_rank, refuse

        failure = first_on_any_rank(failure)
        if failure is not None:
            refuse(str, str(failure), error=HellaSwagError)  # said on rank 0 alone
    if failure is not None:
        raise failure
    return path if rank == 0 else download_hellaswag(cache_dir)


def run_evaluation(args, output, launched):
    """Everything main does on every rank before reporting: the results with their "settings" on
    rank 0, None on the others. What can be checked quickly is checked before anything slow starts."""
    # on the rank that writes the results; an earlier evaluation's there is said once every check has passed
    replacing = check_writable(output) if is_rank_zero() else ""
    rank, world_size, device = join_ranks(args.device) if launched else (0, 1, args.device)
    device, dtype = resolve_device_and_dtype(device, args.dtype)
    CpuThreads(args.threads, device)  # on CPU: as many threads as other processes leave cores free
    check_batch_size(args.batch_size)  # before the data is downloaded and the model loaded
    check_limit(args.limit)
    if args.init_from == "resume":
        existing_checkpoint_path(args.out_dir)  # a mistyped out_dir, before the download
    data_file = find_data_file(args.data_file, args.cache_dir, rank, launched)
    examples = load_examples(data_file, args.limit)
    model, tokenizer, info = load_model_and_tokenizer(args.init_from, args.out_dir, device)
    check_encodable(examples, tokenizer)  # here, not at the first unknown character hours into scoring
    if rank == 0:
        print(f"HellaSwag: {len(examples)} examples from {data_file}; {info['attention']} attention, "
              f"{info['tokenizer']} tokenizer, block_size {model.config.block_size}, {device}, {dtype}"
              + (f", {world_size} ranks" if launched else ""), file=sys.stderr)
        if tokenizer.kind == "char":
            print("note: a character-level model: HellaSwag is scored, but the numbers mean little", file=sys.stderr)
        if replacing:
            print(replacing, file=sys.stderr)
    t0 = time.time()
    results = evaluate(model, examples, tokenizer, device, batch_size=args.batch_size, dtype=dtype,
                       rank=rank, world_size=world_size, progress=not args.no_progress and rank == 0)
    if rank != 0:
        return None
    results["settings"] = {
        **info, "data_file": str(data_file), "limit": args.limit, "batch_size": args.batch_size,
        "device": device, "dtype": dtype, "world_size": world_size, "seconds": round(time.time() - t0, 2),
        "metrics": dict(METRIC_DESCRIPTIONS),
    }
    return results


def _failed(error):
    """Print the error as one line, without a traceback; 1, the exit status of a failed run."""
    print(f"error: {error}", file=sys.stderr)
    return 1


def main(argv=None):
    args = parse_args(argv)
    output = Path(args.output) if args.output else _default_output(args)
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1  # by torchrun, with more than one process
    # every error meant for the user is a RuntimeError or a ValueError: HellaSwagError, CheckpointError,
    # TokenizerUnavailableError, pretrained weights unreachable, bad arguments
    try:
        results = run_evaluation(args, output, launched)
    except (RuntimeError, ValueError) as e:
        return _failed(e)
    finally:
        if launched and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    if results is None:  # a rank other than 0: rank 0 reports for all
        return 0
    try:
        report(results, output)
    except HellaSwagError as e:
        return _failed(e)
    return 0


if __name__ == "__main__":
    run_script(main, "stopped by Ctrl-C; no results written (they are written whole, once every example is scored)")
