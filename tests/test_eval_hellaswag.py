"""eval_hellaswag.py: the three accuracies against hand computation, the log-likelihood against a
position-by-position computation, the data file, and end to end from train.py's checkpoints."""
import http.client
import io
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import REPO, VARIANTS, needs_bpe, tiny_model
import eval_hellaswag as eh
from checkpoint import save_checkpoint
from configurator import format_override, get_config
from prepare_char import prepare
from tokenizer import CharTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

# -----------------------------------------------------------------------------
# a model whose likelihoods we set by hand

# Every word (with its leading space) is one token. The stub LM gives each token the same
# log-probability at every position, whatever the context, so an ending's log-likelihood is the
# sum of its words' values below.
LOGPROB = {
    # ending set 1:       sum    mean per token   per character (harness: without the space)
    " a": -2.0,           # -2.0   -2.0             -2.0 / 1  = -2.0
    " bbbbbbbbbb": -3.0,  # -3.0   -3.0             -3.0 / 10 = -0.3
    " c": -0.9,           # "c c c c": 4 tokens, -3.6, -0.9, -3.6 / 7 = -0.514
    " d": -5.0,           # -5.0   -5.0             -5.0
    # ending set 2
    " e": -1.2,           # -1.2   -1.2             -1.2 / 1 = -1.2  (with the space: -0.6)
    " fff": -3.0,         # -3.0   -3.0             -3.0 / 3 = -1.0  (with the space: -0.75)
}
SET1 = ["a", "bbbbbbbbbb", "c c c c", "d"]  # winners: sum a (0), mean c (2), per character b (1)
SET2 = ["e", "fff", "d", "d"]  # winners: sum e, mean e, per character fff (e if the space counted)
CONTEXT_LOGPROB = -20.0  # every other word (the context's): unlikely, and never scored


class WordTokenizer:
    eot = None

    def __init__(self):
        self.ids = {piece: i + 1 for i, piece in enumerate(LOGPROB)}  # id 0: the leftover mass

    def encode(self, text):
        pieces = re.findall(r" *[^ ]+", text)
        return [self.ids.setdefault(piece, len(self.ids) + 1) for piece in pieces]


class StubLM(torch.nn.Module):
    """Next-token log-probabilities fixed by LOGPROB, independent of position and context."""

    def __init__(self, tokenizer, block_size=256):
        super().__init__()
        self.config = SimpleNamespace(block_size=block_size)
        self.tokenizer, self.calls = tokenizer, []

    def forward(self, idx, all_logits=False):
        self.calls.append((tuple(idx.shape), self.training))
        probs = torch.full((64,), math.exp(CONTEXT_LOGPROB), dtype=torch.float64)
        for piece, lp in LOGPROB.items():
            probs[self.tokenizer.ids[piece]] = math.exp(lp)
        probs[0] = 1.0 - probs[1:].sum()
        return probs.log().float().expand(*idx.shape, -1), None


def example(endings, label, ctx_a="A man is sitting on a roof.", ctx_b="he", activity="Roofing"):
    return {"activity_label": activity, "ctx_a": ctx_a, "ctx_b": ctx_b, "ctx": f"{ctx_a} {ctx_b}",
            "label": label, "endings": endings}


def minimal(ex):
    return {key: ex[key] for key in ("ctx", "endings", "label")}


# kind: (endings, label, {metric: whether the example counts as right for it})
KINDS = {
    "K1": (SET1, 0, dict(acc=1, acc_norm=0, acc_char_norm=0, acc_harness=1)),
    "K2": (SET1, 2, dict(acc=0, acc_norm=1, acc_char_norm=0, acc_harness=0)),
    "K3": (SET1, 1, dict(acc=0, acc_norm=0, acc_char_norm=1, acc_harness=0)),
    "K4": (SET2, 1, dict(acc=0, acc_norm=0, acc_char_norm=1, acc_harness=0)),
    "K5": (SET2, 0, dict(acc=1, acc_norm=1, acc_char_norm=0, acc_harness=1)),
}
FILE_KINDS = ["K1", "K2", "K1", "K4", "K2", "K5", "K3", "K1"]
# by hand: acc K1 x3 + K5 = 4, acc_norm K2 x2 + K5 = 3, acc_char_norm K4 + K3 = 2, out of 8
EXPECTED = dict(acc=4 / 8, acc_norm=3 / 8, acc_char_norm=2 / 8, acc_harness=4 / 8)


@pytest.fixture
def hellaswag_file(tmp_path):
    path = tmp_path / "hs.jsonl"
    path.write_text("".join(json.dumps(example(*KINDS[k][:2], ctx_b=f"he number {i}")) + "\n"
                            for i, k in enumerate(FILE_KINDS)))
    return path


@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_three_accuracies_match_hand_computation(hellaswag_file, batch_size):
    tok = WordTokenizer()
    model = StubLM(tok).train()
    examples = eh.load_examples(hellaswag_file)
    result = eh.evaluate(model, examples, tok, "cpu", batch_size=batch_size)
    assert result["n"] == len(FILE_KINDS) and {m: result[m] for m in EXPECTED} == EXPECTED
    # one forward per batch of examples, 8 sequences each, in eval mode; then back to train mode
    assert [(shape[0], training) for shape, training in model.calls] == [
        (8 * len(examples[i:i + batch_size]), False) for i in range(0, 8, batch_size)]
    assert model.training
    scores = eh.score_batch(model, examples, tok, True, "cpu", "float32")
    for (preds, _), kind in zip(scores, FILE_KINDS):
        endings, label, hits = KINDS[kind]
        assert {m: int(preds[m] == label) for m in hits} == hits, kind


def test_scores_are_the_summed_logprobs_set_by_hand(hellaswag_file):
    tok = WordTokenizer()
    pairs, char_lengths = eh.example_requests(eh.load_examples(hellaswag_file)[0], tok)
    scored = eh.continuation_logprobs(StubLM(tok), pairs)
    assert [s for s, _ in scored] == pytest.approx([-2.0, -3.0, -3.6, -5.0] * 2, abs=1e-5)
    assert [n for _, n in scored] == [1, 1, 4, 1] * 2
    assert char_lengths == [1, 10, 7, 1]  # the preprocessed ending, its leading space not counted
    # an empty context: the endings follow <|endoftext|>, as in the harness, and all are scored
    tok.eot = 0
    pairs, _ = eh.example_requests({**example(SET1, 0), "ctx": ""}, tok, harness=False)
    assert [context for context, _ in pairs] == [[0]] * 4
    assert [n for _, n in eh.continuation_logprobs(StubLM(tok), pairs)] == [1, 1, 4, 1]


def test_predictions_of_each_metric():
    # each metric reads its own text: NanoGPT's pairs first, the harness's after them
    nanogpt = [(-1.0, 1), (-2.0, 1), (-3.0, 1), (-4.0, 1)]  # ending 0 is the likeliest
    harness = [(-4.0, 1), (-1.0, 1), (-3.0, 1), (-2.0, 1)]  # ending 1 is
    preds = eh.predictions(nanogpt + harness, [1, 1, 1, 1])
    assert preds == dict(acc=0, acc_norm=0, acc_harness=1, acc_char_norm=1)
    # an ending the harness cleans to nothing divides by 0 characters: never acc_char_norm's choice
    ex = example(["[step]", "Rinse it well and dry it.", "x y z", "q"], 1)
    lengths = eh.harness_texts(ex)[2]
    preds = eh.predictions([(-0.1, 1), (-30.0, 6), (-20.0, 3), (-9.0, 1)] * 2, lengths)
    assert lengths[0] == 0 and preds["acc_char_norm"] == 1 and preds["acc_harness"] == 0
    tie = [(-2.0, 2), (-2.0, 2), (-3.0, 2), (-9.0, 2)] * 2  # to the first ending, as numpy.argmax
    assert set(eh.predictions(tie, [4] * 4).values()) == {0}


def test_harness_text():
    ex = example(["[step] Scrub  it well.", "Rinse [title] Dry it.", " dry ", "x"], 0,
                 ctx_a="[header] How to clean a pan [title] Soak it.", ctx_b="then",
                 activity="Home and Garden")
    query, continuations, lengths = eh.harness_texts(ex)
    assert query == "Home and Garden: How to clean a pan. Soak it. Then"
    # the harness strips before removing brackets, so "[step] " leaves a leading space behind
    assert continuations == ["  Scrub it well.", " Rinse. Dry it.", " dry", " x"]
    assert lengths == [15, 14, 3, 1]
    # a query whose last bracket is removed ends in a space, which moves to each continuation
    ex = example(["Mix it well.", "Bake it.", "a", "b"], 0, ctx_b="", activity="Food",
                 ctx_a="[header] How to bake [title] Add the flour. [step]")
    query, continuations, lengths = eh.harness_texts(ex)
    assert query == "Food: How to bake. Add the flour."
    assert continuations[:2] == ["  Mix it well.", "  Bake it."] and lengths[:2] == [12, 8]


# -----------------------------------------------------------------------------
# the log-likelihood against a position-by-position computation, every variant

CHARS = "".join(chr(c) for c in range(32, 127)) + "\n"
CHAR_META = {"tokenizer": "char", "vocab_size": len(CHARS), "chars": CHARS,
             "tokens": {"train": 1, "val": 1}}


def tiny_gpt(attention, block_size=64, vocab_size=len(CHARS)):
    return tiny_model(attention, block_size=block_size, vocab_size=vocab_size)  # super: random W^A


def stepwise_logprob(model, context, continuation):
    """Sum over the continuation of log p(token | all tokens before it), one forward per token."""
    total = 0.0
    for k, token in enumerate(continuation):
        logits, _ = model(torch.tensor([context + continuation[:k]]))  # the last position only
        total += torch.log_softmax(logits[0, -1].double(), dim=-1)[token].item()
    return total


@pytest.mark.parametrize("attention", VARIANTS)
def test_loglikelihood_equals_stepwise_sum(attention):
    model = tiny_gpt(attention)
    tok = CharTokenizer(CHARS)
    pairs = [(tok.encode("A man is on a roof. He"), tok.encode(" is nailing shingles.")),
             (tok.encode("Short"), tok.encode(" x")),
             (tok.encode("A woman rides a horse and"), tok.encode(" falls off"))]
    scored = eh.continuation_logprobs(model, pairs)  # one padded batch of three lengths
    for (context, continuation), (total, n) in zip(pairs, scored):
        assert n == len(continuation)
        assert total == pytest.approx(stepwise_logprob(model, context, continuation), abs=1e-4)


def test_a_long_context_is_cut_from_the_left_and_long_endings_are_counted():
    model = tiny_gpt("standard", block_size=16)
    tok = CharTokenizer(CHARS)
    context = tok.encode("a long context that does not fit the window")
    continuation = tok.encode(" ends")
    [(total, n)] = eh.continuation_logprobs(model, [(context, continuation)])
    window = (context + continuation)[-17:]  # block_size + 1: the first token only conditions
    assert n == len(continuation)
    expected = stepwise_logprob(model, window[:-len(continuation)], continuation)
    assert total == pytest.approx(expected, abs=1e-4)
    [(_, n)] = eh.continuation_logprobs(model, [(context, tok.encode(" " + "y" * 20))])
    assert n == 16  # an ending longer than the block: its last block_size tokens
    # " " + ending: 21, 2, 17, 16 tokens; the 1st and 3rd exceed the block in both texts: 2 endings
    long, short = example(["a" * 20, "b", "c" * 16, "d" * 15], 0), example(["a", "b", "c", "d"], 1)
    scored = eh.score_batch(model, [long, short], tok, True, "cpu", "float32")
    assert [n_cut for _, n_cut in scored] == [2, 0]
    assert eh.score_batch(model, [minimal(long)], tok, False, "cpu", "float32")[0][1] == 2
    result = eh.evaluate(model, [long, short, long], tok, batch_size=2)
    assert result["n_endings_truncated"] == 4
    assert eh.accuracies_line(result).endswith(
        ", 4 endings were longer than block_size and only partly scored")


# -----------------------------------------------------------------------------
# the data file

@pytest.mark.parametrize("bad_line", [
    b"{not json",
    '{"ctx": "caf\u00e9"}'.encode("latin-1"),  # not UTF-8
    b"[1, 2]",
    *(json.dumps(bad).encode() for bad in [
        {**example(SET1, 0), "endings": ["a", "b"]},
        {**example(SET1, 0), "label": 7},
        {**example(SET1, 0), "label": 1.7},  # not 1
        {**example(SET1, 0), "label": True},
        {**example(SET1, 0), "label": "+1"},
        {**example(SET1, 0), "ctx_a": None},
        {**example(SET1, 0), "ctx": 3},
        {k: v for k, v in example(SET1, 0).items() if k != "ctx"},
        {k: v for k, v in example(SET1, 0).items() if k != "label"},  # HellaSwag's test file
    ]),
])
def test_a_malformed_line_is_refused_with_its_number(tmp_path, bad_line):
    path = tmp_path / "hs.jsonl"
    path.write_bytes(json.dumps(example(SET1, "2")).encode() + b"\n\n" + bad_line + b"\n")
    [first] = eh.load_examples(path, limit=1)  # a label as a string, a blank line, a limit
    assert first["label"] == 2 and first["_line"] == 1
    said = []  # during training: no HellaSwag scores, said once, and training goes on
    assert eh.examples_for_training(path, 0, CHAR_META, said.append) is None and len(said) == 1
    with pytest.raises(eh.HellaSwagError, match=rf"^{re.escape(str(path))}, line 3: "):
        eh.load_examples(path)


def test_minimal_examples_give_the_nanogpt_accuracies_only(hellaswag_file):
    examples = eh.load_examples(hellaswag_file)
    tok = WordTokenizer()
    for some_minimal in ([minimal(ex) for ex in examples], [*examples[:7], minimal(examples[7])]):
        result = eh.evaluate(StubLM(tok), some_minimal, tok, "cpu", batch_size=3)
        assert (result["acc"], result["acc_norm"]) == (EXPECTED["acc"], EXPECTED["acc_norm"])
        assert (result["acc_char_norm"], result["acc_harness"]) == (None, None)
        assert result["correct"] == {"acc": 4, "acc_norm": 3}
    assert eh.accuracies_line(result) == ("acc 0.5000 (4/8), acc_norm 0.3750 (3/8), "
                                          "acc_char_norm n/a, acc_harness n/a")


def test_download(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    with pytest.raises(eh.HellaSwagError, match=r"^could not download .* pass --data_file "):
        eh.download_hellaswag(cache, url="http://127.0.0.1:9/hellaswag_val.jsonl", timeout=5)

    def dropped(url, timeout):
        raise http.client.IncompleteRead(b"partial", 11_000_000)  # no OSError

    monkeypatch.setattr(eh.urllib.request, "urlopen", dropped)
    with pytest.raises(eh.HellaSwagError, match="IncompleteRead"):
        eh.download_hellaswag(cache)
    assert list(tmp_path.rglob("*")) in ([], [cache])  # no partial file left behind
    data = json.dumps(example(SET1, 0)).encode() + b"\n"
    monkeypatch.setattr(eh.urllib.request, "urlopen", lambda url, timeout: io.BytesIO(data))
    path = eh.download_hellaswag(cache)
    assert path == cache / eh.HELLASWAG_FILENAME and path.read_bytes() == data
    monkeypatch.setattr(eh.urllib.request, "urlopen", None)  # the cached copy, without a download
    assert eh.download_hellaswag(cache) == path
    # under torchrun rank 0 downloads; the others wait, then take its copy or its error
    monkeypatch.setattr(eh, "download_hellaswag", lambda cache_dir: pytest.fail("not rank 0"))
    monkeypatch.setattr(eh, "first_on_any_rank", lambda error: "could not download")  # rank 0's
    with pytest.raises(eh.HellaSwagError, match="could not download"):
        eh.find_data_file(None, cache, rank=1, launched=True)


# -----------------------------------------------------------------------------
# end to end: checkpoints written by train.py, the command line, DDP

def quick_overrides(tmp_path, **extra):
    """train.py's arguments for 2 iterations of a tiny model on characters that cover CHARS."""
    data_dir = tmp_path / "data"
    if not data_dir.exists():
        prepare("A man is sitting on a roof. He pulls up roofing. " * 40 + CHARS, data_dir, "test")
    overrides = dict(out_dir=str(tmp_path / "out"), data_dir=str(data_dir), max_iters=2,
                     eval_interval=2, eval_iters=1, log_interval=1, warmup_iters=0,
                     lr_decay_iters=2, batch_size=2, block_size=32, n_layer=1, n_head=2, n_embd=16,
                     device="cpu", **extra)
    quickstart = str(REPO / "config" / "quickstart.py")
    return [quickstart, *map(format_override, overrides, overrides.values())]


def hellaswag_records(out_dir):
    records = map(json.loads, (out_dir / "log.jsonl").read_text().splitlines())
    return [r for r in records if r["type"] == "hellaswag"]


def test_during_training_and_from_the_checkpoint(tmp_path, hellaswag_file, capsys, monkeypatch):
    import train

    config = get_config(quick_overrides(tmp_path, attention="efficient", hellaswag_interval=1,
                                        hellaswag_file=str(hellaswag_file), hellaswag_limit=5,
                                        hellaswag_batch_size=2))
    train.train(config, verbose=False)
    out_dir = Path(config["out_dir"])
    records = hellaswag_records(out_dir)
    # the last score is that of the final weights, as eval_hellaswag.py finds them in ckpt.pt,
    # one example at a time, in float32: batching changes no count
    alone = eh.evaluate_checkpoint(out_dir, hellaswag_file, limit=5, device="cpu", dtype="float32")
    assert records and all(r["n"] == 5 for r in records) and alone["n"] == 5
    assert records[-1]["iter"] == alone["iter_num"] and records[-1]["correct"] == alone["correct"]
    capsys.readouterr()
    output = tmp_path / "results.json"
    args = ["--out_dir", str(out_dir), "--data_file", str(hellaswag_file), "--output", str(output),
            "--batch_size", "3", "--limit", "5", "--no_progress"]
    assert eh.main(args) == 0
    results = json.loads(output.read_text())
    assert results["correct"] == alone["correct"] and results["settings"]["world_size"] == 1
    assert all(results[m] == results["correct"][m] / 5 for m in eh.METRICS)
    line = eh.accuracies_line(results)
    assert capsys.readouterr().out.splitlines() == [line, f"results written to {output}"]
    # a results file that cannot be written: the accuracies are printed all the same
    monkeypatch.setattr(eh, "write_text_atomic", lambda *a: os.open("/no/such/r", 0))
    assert eh.main(args) == 1
    out, err = capsys.readouterr()
    assert out == line + "\n" and err.endswith("No such file or directory: '/no/such/r'\n")


def save_char_checkpoint(model, folder):
    save_checkpoint({"model_args": {**vars(model.config)}, "model": model.state_dict(),
                     "iter_num": 0, "meta": CHAR_META}, folder / "ckpt.pt")


@pytest.mark.parametrize("args, error", [
    (["--out_dir=nothing"], "no checkpoint at nothing"),
    (["--limit=0"], "limit=0 must be at least 1"),
    (["--batch_size=0"], "batch_size=0 must be at least 1"),
    (["--output=ckpt.pt"], "--output=ckpt.pt: name a .json file"),
    (["--data_file=missing.jsonl"], "no HellaSwag data file at missing.jsonl"),
    (["--data_file=bad.jsonl"], "bad.jsonl, line 2: not valid JSON"),
    (["--data_file=dash.jsonl"], "example on line 9: characters not in the vocabulary"),
])
def test_a_bad_argument_is_one_error_line_before_the_download_and_scoring(
        tmp_path, hellaswag_file, capsys, monkeypatch, args, error):
    monkeypatch.chdir(tmp_path)
    save_char_checkpoint(tiny_gpt("standard"), tmp_path)
    (tmp_path / "bad.jsonl").write_text(json.dumps(example(SET1, 0)) + "\n{oops\n")
    unknown = json.dumps(example(["a", "b", "c", "d \u2014 e"], 0))  # on line 9, after 8 good ones
    (tmp_path / "dash.jsonl").write_text(hellaswag_file.read_text() + unknown + "\n")
    monkeypatch.setattr(eh, "download_hellaswag", lambda *a: pytest.fail("downloaded"))
    monkeypatch.setattr(eh, "score_batch", lambda *a: pytest.fail("scored"))
    assert eh.main(["--out_dir=.", "--no_progress", *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and error in err and err.count("\n") == 1, err


def torchrun(*args, cwd):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node=2", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=240,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})


@pytest.mark.slow
def test_ddp_splits_examples_and_sums_counts(tmp_path, hellaswag_file):
    save_char_checkpoint(tiny_gpt("optimized"), tmp_path)
    args = ["--out_dir", tmp_path, "--data_file", hellaswag_file, "--no_progress", "--output"]
    assert eh.main(list(map(str, args + [tmp_path / "single.json"]))) == 0
    proc = torchrun(REPO / "eval_hellaswag.py", *args, tmp_path / "ddp.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    a, b = (json.loads((tmp_path / name).read_text()) for name in ("single.json", "ddp.json"))
    assert b["settings"]["world_size"] == 2 and b["n"] == a["n"] == len(FILE_KINDS)
    assert [b[m] for m in (*eh.METRICS, "correct")] == [a[m] for m in (*eh.METRICS, "correct")]


@pytest.mark.slow
def test_hellaswag_during_ddp_training_logs_what_one_process_scores(tmp_path, hellaswag_file):
    """Two ranks share 5 examples (unequal shares); the summed counts are one process's."""
    argv = quick_overrides(tmp_path, hellaswag_interval=2, hellaswag_file=str(hellaswag_file),
                           hellaswag_limit=5, gradient_accumulation_steps=2)
    proc = torchrun(REPO / "train.py", *argv, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [logged] = hellaswag_records(tmp_path / "out")
    alone = eh.evaluate_checkpoint(tmp_path / "out", hellaswag_file, limit=5, device="cpu",
                                   dtype="float32")
    assert logged["n"] == alone["n"] == 5 and logged["correct"] == alone["correct"]


@needs_bpe
def test_gpt2_bpe_tokenization_of_endings(hellaswag_file):
    from tokenizer import GPT2Tokenizer, gpt2_encoding

    tok, enc = GPT2Tokenizer(), gpt2_encoding()
    examples = eh.load_examples(hellaswag_file, limit=2)
    pairs, _ = eh.example_requests(examples[0], tok)
    assert pairs[2] == (enc.encode(examples[0]["ctx"]), enc.encode(" c c c c"))
    query = "Roofing: A man is sitting on a roof. He number 0"
    assert pairs[4] == (enc.encode(query), enc.encode(" a"))
    assert eh.evaluate(tiny_gpt("super", vocab_size=50304), examples, tok, "cpu", 2)["n"] == 2
