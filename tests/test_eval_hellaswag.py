"""eval_hellaswag.py: the three accuracies against hand computation, the log-likelihood against a
position-by-position computation, data loading errors, and end to end from train.py checkpoints."""
import http.client
import io
import json
import math
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import REPO, VARIANTS, needs_bpe
import eval_hellaswag as eh
from checkpoint import save_checkpoint
from model import GPT, GPTConfig
from tokenizer import CharTokenizer


pytestmark = pytest.mark.usefixtures("one_thread")

# -----------------------------------------------------------------------------
# a model whose likelihoods we set by hand

# Every word piece (a word with its leading space) is one token. The stub LM gives each token the
# same log-probability at every position, whatever the context, so an ending's log-likelihood is
# the sum of its pieces' values below.
LOGPROB = {
    # ending set 1:       sum    mean per token   per character (harness: len without the space)
    " a": -2.0,           # -2.0   -2.0             -2.0 / 1  = -2.0
    " bbbbbbbbbb": -3.0,  # -3.0   -3.0             -3.0 / 10 = -0.3
    " c": -0.9,           # "c c c c": 4 tokens, -3.6, -0.9, -3.6 / 7 = -0.514
    " d": -5.0,           # -5.0   -5.0             -5.0
    # ending set 2
    " e": -1.2,           # -1.2   -1.2             -1.2 / 1 = -1.2  (with the space counted: -0.6)
    " fff": -3.0,         # -3.0   -3.0             -3.0 / 3 = -1.0  (with the space counted: -0.75)
}
SET1 = ["a", "bbbbbbbbbb", "c c c c", "d"]  # winners: sum a (0), mean c (2), per character bbbbbbbbbb (1)
SET2 = ["e", "fff", "d", "d"]  # winners: sum e (0), mean e (0), per character fff (1), but e if the space counted
CONTEXT_LOGPROB = -20.0  # every other piece (context words): unlikely, and never scored


class WordTokenizer:
    kind = "word"
    eot = None

    def __init__(self, vocab_size=64):
        self.vocab_size = vocab_size
        self.ids = {piece: i + 1 for i, piece in enumerate(LOGPROB)}  # id 0 takes the leftover mass

    def encode(self, text):
        out = []
        for piece in re.findall(r" *[^ ]+", text):
            if piece not in self.ids:
                self.ids[piece] = len(self.ids) + 1
                assert self.ids[piece] < self.vocab_size
            out.append(self.ids[piece])
        return out


class StubLM(torch.nn.Module):
    """Next-token log-probabilities fixed by LOGPROB, independent of position and context."""

    def __init__(self, tokenizer, block_size=256):
        super().__init__()
        self.config = SimpleNamespace(block_size=block_size)
        self.tokenizer = tokenizer
        self.calls = []
        self.training_at_calls = []

    def forward(self, idx, all_logits=False):
        assert all_logits
        self.calls.append(tuple(idx.shape))
        self.training_at_calls.append(self.training)
        V = self.tokenizer.vocab_size
        probs = torch.full((V,), math.exp(CONTEXT_LOGPROB), dtype=torch.float64)
        for piece, lp in LOGPROB.items():
            probs[self.tokenizer.ids[piece]] = math.exp(lp)
        probs[0] = 0.0
        probs[0] = 1.0 - probs.sum()
        assert probs[0] > 0
        logits = probs.log().float()
        return logits.expand(idx.size(0), idx.size(1), V), None


def example(endings, label, ctx_a="A man is sitting on a roof.", ctx_b="he", activity="Roofing"):
    return {"ind": 0, "activity_label": activity, "ctx_a": ctx_a, "ctx_b": ctx_b,
            "ctx": f"{ctx_a} {ctx_b}", "split": "val", "split_type": "indomain", "label": label, "endings": endings}


# kind: (endings, label, [which of acc, acc_norm, acc_char_norm, acc_harness it counts for])
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
    lines = [json.dumps(example(KINDS[k][0], KINDS[k][1], ctx_b=f"he number {i}")) for i, k in enumerate(FILE_KINDS)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_three_accuracies_match_hand_computation(hellaswag_file, batch_size):
    tok = WordTokenizer()
    model = StubLM(tok)
    examples = eh.load_examples(hellaswag_file)
    result = eh.evaluate(model, examples, tok, "cpu", batch_size=batch_size, return_details=True)
    assert result["n"] == len(FILE_KINDS)
    for metric, value in EXPECTED.items():
        assert result[metric] == value, metric
    for detail, kind in zip(result["details"], FILE_KINDS):
        endings, label, counts = KINDS[kind]
        for metric, hit in counts.items():
            assert (detail["pred"][metric] == label) == bool(hit), (kind, metric)
    # one forward per batch of examples; each example is at most 8 sequences
    assert len(model.calls) == math.ceil(len(FILE_KINDS) / batch_size)
    assert all(rows <= 8 * batch_size for rows, _ in model.calls)


def test_scores_are_the_summed_logprobs_set_by_hand(hellaswag_file):
    tok = WordTokenizer()
    [detail] = eh.evaluate(StubLM(tok), eh.load_examples(hellaswag_file, limit=1), tok, "cpu", return_details=True)["details"]
    assert detail["logprob_sum"] == pytest.approx([-2.0, -3.0, -3.6, -5.0], abs=1e-5)
    assert detail["harness_logprob_sum"] == pytest.approx([-2.0, -3.0, -3.6, -5.0], abs=1e-5)
    assert detail["n_tokens"] == [1, 1, 4, 1]
    assert detail["char_lengths"] == [1, 10, 7, 1]  # the preprocessed ending, its leading space not counted


def test_an_empty_context_conditions_on_end_of_text_and_scores_every_ending_token():
    """As the harness does: with nothing to condition on, the endings follow <|endoftext|>, so their first
    token is scored too; a tokenizer without one (characters) refuses the example."""
    ex = {**example(SET1, 0), "ctx": ""}
    tok = WordTokenizer()
    tok.eot = 0
    pairs, nanogpt_index, _, _ = eh.example_requests(ex, tok, harness=False)
    assert [pairs[j][0] for j in nanogpt_index] == [(0,)] * 4
    scored = eh.continuation_logprobs(StubLM(tok), [pairs[j] for j in nanogpt_index])
    assert [n for _, n in scored] == [1, 1, 4, 1]
    assert [s for s, _ in scored] == pytest.approx([-2.0, -3.0, -3.6, -5.0], abs=1e-4)
    with pytest.raises(eh.HellaSwagError, match="empty context"):
        eh.example_requests(ex, WordTokenizer(), harness=False)


def test_evaluate_scores_in_eval_mode_and_leaves_the_mode_it_found(hellaswag_file):
    tok = WordTokenizer()
    model = StubLM(tok)
    for training in (True, False):
        model.train(training)
        eh.evaluate(model, eh.load_examples(hellaswag_file, limit=2), tok, "cpu")
        assert model.training == training
    assert model.training_at_calls == [False] * 4


def test_an_ending_the_harness_cleans_to_nothing_is_never_its_char_norm_choice():
    """The harness divides its log-likelihood by 0 characters: -inf, whatever the model's score."""
    ex = example(["[step]", "Rinse it well and dry it.", "x y z", "q"], 1)
    _, _, lengths = eh.harness_texts(ex)
    assert lengths[0] == 0
    scored = [(-0.1, 1), (-30.0, 6), (-20.0, 3), (-9.0, 1)]  # the empty ending is the likeliest by far
    result = eh.score_example(ex, scored, [0, 1, 2, 3], [0, 1, 2, 3], lengths)
    assert result["pred"]["acc_char_norm"] == 1  # -30/25 beats -20/5 and -9/1; the empty ending takes no part
    assert result["pred"]["acc_harness"] == 0


def test_each_metric_reads_its_own_view_of_the_example():
    """acc and acc_norm score NanoGPT's texts; acc_harness and acc_char_norm the harness's, a separate
    set of pairs in `scored`. Here the two views disagree, so a metric read from the other view shows."""
    ex = example(["a", "b", "c", "d"], 0)
    nanogpt = [(-1.0, 1), (-2.0, 1), (-3.0, 1), (-4.0, 1)]  # ending 0 is the likeliest
    harness = [(-4.0, 1), (-1.0, 1), (-3.0, 1), (-2.0, 1)]  # ending 1 is
    result = eh.score_example(ex, nanogpt + harness, [0, 1, 2, 3], [4, 5, 6, 7], [1, 1, 1, 1])
    assert result["pred"] == {"acc": 0, "acc_norm": 0, "acc_harness": 1, "acc_char_norm": 1}


def test_a_tie_goes_to_the_first_ending_as_numpy_argmax():
    ex = example(["same", "same", "other", "worse"], 1)
    scored = [(-2.0, 2), (-2.0, 2), (-3.0, 2), (-9.0, 2)]
    result = eh.score_example(ex, scored, [0, 1, 2, 3], [0, 1, 2, 3], [4, 4, 4, 4])
    assert set(result["pred"].values()) == {0}


def test_harness_preprocessing():
    ex = example(
        ["[step] Scrub  it well.", "Rinse [title] Dry it.", " dry ", "x"], 0,
        ctx_a="[header] How to clean a pan [title] Soak it.", ctx_b="then", activity="Home and Garden",
    )
    query, continuations, lengths = eh.harness_texts(ex)
    assert query == "Home and Garden: How to clean a pan. Soak it. Then"
    # the harness strips before removing brackets, so "[step] " leaves a leading space behind
    assert continuations == ["  Scrub it well.", " Rinse. Dry it.", " dry", " x"]
    assert lengths == [15, 14, 3, 1]
    ctx, raw = eh.nanogpt_texts(ex)
    assert ctx == ex["ctx"] and raw[0] == " [step] Scrub  it well."


def test_whitespace_ending_the_harness_query_is_scored_with_each_continuation():
    """A query whose last bracket is removed ends in a space; the harness's _encode_pair moves it to the
    continuation, whose log-likelihood then includes it, which changes the char-normalised choice."""
    ex = example(["Mix it well.", "Bake it."], 0, ctx_a="[header] How to bake [title] Add the flour. [step]", ctx_b="",
                 activity="Food")
    query, continuations, lengths = eh.harness_texts(ex)
    assert query == "Food: How to bake. Add the flour." and continuations == ["  Mix it well.", "  Bake it."]
    assert lengths == [12, 8]


# -----------------------------------------------------------------------------
# the log-likelihood against a position-by-position computation, every variant

CHARS = "".join(chr(c) for c in range(32, 127)) + "\n"


def tiny_gpt(attention, block_size=64, vocab_size=len(CHARS), seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=2, n_head=2, n_embd=16,
                         attention=attention)).eval()


def stepwise_logprob(model, context, continuation):
    """Sum over the continuation of log p(token | all tokens before it), one forward per token."""
    total = 0.0
    for k, token in enumerate(continuation):
        prefix = torch.tensor([context + continuation[:k]])
        logits, _ = model(prefix)  # the last position only
        total += torch.log_softmax(logits[0, -1].double(), dim=-1)[token].item()
    return total


@pytest.mark.parametrize("attention", VARIANTS)
def test_loglikelihood_equals_stepwise_sum(attention):
    model = tiny_gpt(attention)
    if attention == "super":  # make W^A matter: away from its identity initialisation
        with torch.no_grad():
            for block in model.transformer.h:
                block.attn.align_weight.add_(0.1 * torch.randn_like(block.attn.align_weight))
    tok = CharTokenizer(CHARS)
    pairs = [
        (tok.encode("A man is on a roof. He"), tok.encode(" is nailing shingles.")),
        (tok.encode("Short"), tok.encode(" x")),
        (tok.encode("A woman rides a horse and"), tok.encode(" falls off")),
    ]
    scored = eh.continuation_logprobs(model, pairs)  # one padded batch of three lengths
    for (context, continuation), (total, n) in zip(pairs, scored):
        assert n == len(continuation)
        assert total == pytest.approx(stepwise_logprob(model, context, continuation), abs=1e-4)


def test_long_context_is_cut_from_the_left():
    model = tiny_gpt("standard", block_size=16)
    tok = CharTokenizer(CHARS)
    context, continuation = tok.encode("a long context that does not fit the window"), tok.encode(" ends")
    [(total, n)] = eh.continuation_logprobs(model, [(context, continuation)])
    window = (context + continuation)[-17:]  # block_size + 1: the first token only conditions
    kept_context = window[: len(window) - len(continuation)]
    assert n == len(continuation)
    assert total == pytest.approx(stepwise_logprob(model, kept_context, continuation), abs=1e-4)
    # an ending longer than the block: only its last block_size tokens are scored
    [(_, n)] = eh.continuation_logprobs(model, [(context, tok.encode(" " + "y" * 20))])
    assert n == 16


def test_endings_longer_than_the_block_are_counted_per_example():
    model = tiny_gpt("standard", block_size=16)
    tok = CharTokenizer(CHARS)
    # " " + ending is 21, 2, 17 and 16 tokens: the first and third exceed block_size, in both texts,
    # and count once each
    long, short = example(["a" * 20, "b", "c" * 16, "d" * 15], 0), example(["a", "b", "c", "d"], 1)
    scored = eh.score_batch(model, [long, short], tok, True, "cpu", "float32")
    assert [truncated for _, truncated in scored] == [2, 0]
    for ex, (result, _) in zip([long, short], scored):  # one padded forward for both, as each alone
        [(alone, _)] = eh.score_batch(model, [ex], tok, True, "cpu", "float32")
        assert result["logprob_sum"] == pytest.approx(alone["logprob_sum"], abs=1e-5)
        assert result["harness_logprob_sum"] == pytest.approx(alone["harness_logprob_sum"], abs=1e-5)
    [(_, truncated)] = eh.score_batch(model, [minimal(long)], tok, False, "cpu", "float32")
    assert truncated == 2  # the raw text only
    assert eh.evaluate(model, [long, short, long], tok, batch_size=2)["n_endings_truncated"] == 4


@pytest.mark.parametrize("n, note", [(1, "1 ending was longer"), (4, "4 endings were longer")])
def test_the_truncation_note_counts_its_endings(n, note, capsys):
    eh.print_accuracies({**{m: 0.25 for m in eh.METRICS}, "correct": {m: 1 for m in eh.METRICS}, "n": 4,
                         "n_endings_truncated": n})
    assert f"note: {note} than block_size and only partly scored\n" in capsys.readouterr().out


# -----------------------------------------------------------------------------
# data loading

def test_load_examples_limit_and_blank_lines(tmp_path):
    path = tmp_path / "hs.jsonl"
    path.write_text("\n".join(json.dumps(example(SET1, str(i % 4) if i % 2 else i % 4)) for i in range(5)) + "\n\n")
    assert len(eh.load_examples(path)) == 5
    examples = eh.load_examples(path, limit=2)
    assert [e["label"] for e in examples] == [0, 1] and examples[1]["_line"] == 2


@pytest.mark.parametrize("bad_line, message", [
    ("{not json", "not valid JSON"),
    (json.dumps({**example(SET1, 0), "endings": ["a", "b"]}), '"endings" must be a list of 4 strings'),
    (json.dumps({**example(SET1, 0), "label": 7}), '"label" must be in 0..3'),
    (json.dumps({**example(SET1, 0), "label": 1.7}), '"label" must be an integer 0..3, got 1.7'),  # not 1
    (json.dumps({**example(SET1, 0), "label": float("inf")}), '"label" must be an integer 0..3, got inf'),
    (json.dumps({**example(SET1, 0), "label": True}), '"label" must be an integer 0..3, got True'),
    (json.dumps({**example(SET1, 0), "label": "+1"}), '"label" must be an integer 0..3, got \'+1\''),
    (json.dumps({k: v for k, v in example(SET1, 0).items() if k != "ctx"}), 'missing "ctx"'),
    (json.dumps({k: v for k, v in example(SET1, 0).items() if k != "label"}),
     'missing "label", the right ending (HellaSwag\'s test file has none: score the validation file)'),
    (json.dumps({**example(SET1, 0), "ctx_a": None}), '"ctx_a" must be a string'),
    ("[1, 2]", "expected a JSON object"),
])
def test_malformed_line_names_its_line_number(tmp_path, bad_line, message):
    path = tmp_path / "hs.jsonl"
    path.write_text(json.dumps(example(SET1, 0)) + "\n\n" + bad_line + "\n")
    with pytest.raises(eh.HellaSwagError, match=rf"line 3(, column \d+)?: .*{re.escape(message)}"):
        eh.load_examples(path)


def test_a_file_that_is_not_utf8_is_named_with_its_line(tmp_path):
    path = tmp_path / "hs.jsonl"
    path.write_bytes(json.dumps(example(SET1, 0)).encode() + b"\n" + '{"ctx": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(eh.HellaSwagError) as raised:
        eh.load_examples(path)
    assert str(raised.value) == f"{path}, line 2: not UTF-8 text: byte 0xe9 at offset 12 of the line is not valid UTF-8"


def test_a_folder_as_data_file_is_named_a_folder(tmp_path):
    with pytest.raises(eh.HellaSwagError, match="is a folder: pass the .jsonl file in it"):
        eh.load_examples(tmp_path)


def test_bad_json_keeps_its_line_and_column(tmp_path):
    path = tmp_path / "hs.jsonl"
    path.write_text(json.dumps(example(SET1, 0)) + "\n\n" + '{"ctx": "a\tb"}\n')  # a raw tab inside a string
    with pytest.raises(eh.HellaSwagError) as raised:
        eh.load_examples(path)
    assert str(raised.value) == f"{path}, line 3, column 11: not valid JSON: Invalid control character"


def minimal(ex):
    return {key: ex[key] for key in ("ctx", "endings", "label")}


def test_minimal_examples_give_the_nanogpt_accuracies_and_no_harness_ones(hellaswag_file, tmp_path, capsys):
    path = tmp_path / "minimal.jsonl"
    path.write_text("".join(json.dumps(minimal(ex)) + "\n" for ex in eh.load_examples(hellaswag_file)))
    tok = WordTokenizer()
    result = eh.evaluate(StubLM(tok), eh.load_examples(path), tok, "cpu", batch_size=3)
    assert (result["acc"], result["acc_norm"]) == (EXPECTED["acc"], EXPECTED["acc_norm"])
    assert (result["acc_char_norm"], result["acc_harness"]) == (None, None)
    assert result["correct"] == {"acc": 4, "acc_norm": 3}
    eh.report(result, tmp_path / "results.json")
    printed = capsys.readouterr().out
    assert "acc_char_norm: n/a (needs activity_label, ctx_a, ctx_b in every example)" in printed
    assert json.loads((tmp_path / "results.json").read_text())["acc_harness"] is None


def test_one_minimal_example_turns_the_harness_accuracies_off(hellaswag_file, tmp_path):
    examples = eh.load_examples(hellaswag_file)
    examples[3] = minimal(examples[3])
    tok = WordTokenizer()
    result = eh.evaluate(StubLM(tok), examples, tok, "cpu")
    assert (result["acc"], result["acc_norm"], result["acc_char_norm"]) == (EXPECTED["acc"], EXPECTED["acc_norm"], None)


def test_download_offline_tells_to_pass_data_file(tmp_path):
    with pytest.raises(eh.HellaSwagError, match="--data_file"):
        eh.download_hellaswag(tmp_path / "cache", url="http://127.0.0.1:9/hellaswag_val.jsonl", timeout=5)
    assert list(tmp_path.rglob("*")) in ([], [tmp_path / "cache"])  # no partial file left behind
    assert eh.HELLASWAG_URL.endswith("rowanz/hellaswag/master/data/hellaswag_val.jsonl")


def test_a_dropped_download_tells_to_pass_data_file(tmp_path, monkeypatch):
    class DroppedResponse(io.BytesIO):
        def read(self):
            raise http.client.IncompleteRead(b"partial", 11_000_000)  # an HTTPException, not an OSError

    monkeypatch.setattr(eh.urllib.request, "urlopen", lambda url, timeout: DroppedResponse())
    with pytest.raises(eh.HellaSwagError, match=r"IncompleteRead.*--data_file"):
        eh.download_hellaswag(tmp_path / "cache")
    assert not (tmp_path / "cache").exists()  # no partial file cached


def test_a_download_that_cannot_be_cached_is_no_network_failure(tmp_path, monkeypatch):
    """The file came: what failed is the cache folder, and the way out is another --cache_dir."""
    official = (json.dumps(example(SET1, 0)) + "\n") * eh.HELLASWAG_VAL_SIZE
    monkeypatch.setattr(eh.urllib.request, "urlopen", lambda url, timeout: io.BytesIO(official.encode()))
    (tmp_path / "a_file").write_text("x")
    cache_dir = tmp_path / "a_file" / "cache"
    with pytest.raises(eh.HellaSwagError) as raised:
        eh.download_hellaswag(cache_dir)
    assert str(raised.value) == (f"downloaded {eh.HELLASWAG_URL} but cannot save it as "
                                 f"{cache_dir / eh.HELLASWAG_FILENAME} ({tmp_path / 'a_file'} is a file, not a "
                                 f"folder): pass --cache_dir with a writable folder")


def test_download_uses_the_cached_copy(tmp_path):
    (tmp_path / eh.HELLASWAG_FILENAME).write_text(json.dumps(example(SET1, 0)) + "\n")
    assert eh.download_hellaswag(tmp_path, url="http://127.0.0.1:9/x") == tmp_path / eh.HELLASWAG_FILENAME


def test_character_outside_vocabulary_is_a_clear_error():
    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz .")
    ex = {**example(["a", "b", "c", "d"], 0, ctx_a="a roof.", ctx_b="he", activity="roofing"), "_line": 7}
    with pytest.raises(eh.HellaSwagError, match=r"line 7.*'A'"):
        eh.evaluate(tiny_gpt("standard", vocab_size=tok.vocab_size), [{**ex, "ctx": "A roof. he"}], tok)


# -----------------------------------------------------------------------------
# end to end: checkpoints written by train.py, the command line, DDP

def write_char_dataset(data_dir):
    import numpy as np
    from tokenizer import write_meta, write_tokens_atomically

    tok = CharTokenizer(CHARS)
    text = ("A man is sitting on a roof. He starts pulling up roofing. " * 40)
    ids = np.array(tok.encode(text))
    split = int(0.9 * len(ids))
    data_dir.mkdir(parents=True)
    write_tokens_atomically(data_dir / "train.bin", ids[:split])
    write_tokens_atomically(data_dir / "val.bin", ids[split:])
    write_meta(data_dir, {"tokenizer": "char", "vocab_size": tok.vocab_size, "chars": CHARS,
                          "tokens": {"train": split, "val": len(ids) - split}})


def quick_config(tmp_path, attention="standard", **extra):
    import train

    data_dir = tmp_path / "data"
    if not data_dir.exists():
        write_char_dataset(data_dir)
    config = train.get_config([str(REPO / "config" / "quickstart.py")])
    config.update(out_dir=str(tmp_path / f"out-{attention}"), data_dir=str(data_dir), attention=attention, max_iters=2,
                  eval_interval=2, eval_iters=1, log_interval=1, warmup_iters=0, lr_decay_iters=2, batch_size=2,
                  block_size=32, n_layer=1, n_head=2, n_embd=16, device="cpu", compile=False, **extra)
    return config


def quick_train(tmp_path, attention="standard", **extra):
    import train

    config = quick_config(tmp_path, attention, **extra)
    train.train(config, verbose=False)
    return Path(config["out_dir"])


def test_end_to_end_on_a_quickstart_checkpoint(tmp_path, hellaswag_file):
    out_dir = quick_train(tmp_path)
    output = tmp_path / "results.json"
    assert eh.main(["--out_dir", str(out_dir), "--data_file", str(hellaswag_file), "--output", str(output),
                    "--batch_size", "2", "--limit", "5", "--no_progress"]) == 0
    results = json.loads(output.read_text())
    # what the library scores one example at a time, on the CPU in float32: batching changes no count
    alone = eh.evaluate_checkpoint(out_dir, hellaswag_file, limit=5, device="cpu", dtype="float32", batch_size=1)
    assert results["n"] == alone["n"] == 5 and results["correct"] == alone["correct"]
    for metric in ("acc", "acc_norm", "acc_char_norm"):
        assert results[metric] == results["correct"][metric] / 5
    assert results["settings"]["attention"] == "standard" and results["settings"]["tokenizer"] == "char"
    assert results["settings"]["limit"] == 5 and results["settings"]["batch_size"] == 2


def test_hellaswag_during_training(tmp_path, hellaswag_file):
    out_dir = quick_train(tmp_path, attention="efficient", hellaswag_interval=1, hellaswag_file=str(hellaswag_file),
                          hellaswag_limit=3, hellaswag_batch_size=2)
    records = [json.loads(line) for line in (out_dir / "log.jsonl").read_text().splitlines()]
    hellaswag = [r for r in records if r.get("type") == "hellaswag"]
    assert hellaswag, records
    assert all(r["n"] == 3 and {"acc", "acc_norm", "acc_char_norm"} <= r.keys() for r in hellaswag)
    # the last score is that of the final weights, as eval_hellaswag.py finds them in the checkpoint
    alone = eh.evaluate_checkpoint(out_dir, hellaswag_file, limit=3, device="cpu", dtype="float32")
    assert hellaswag[-1]["iter"] == alone["iter_num"] == json.loads((out_dir / "summary.json").read_text())["iterations"]
    assert hellaswag[-1]["correct"] == alone["correct"]


def hellaswag_records(out_dir):
    return [r for r in map(json.loads, (out_dir / "log.jsonl").read_text().splitlines()) if r["type"] == "hellaswag"]


@pytest.mark.slow
def test_hellaswag_during_ddp_training_logs_what_one_process_scores(tmp_path, hellaswag_file):
    """Two ranks share the examples (5: unequal shares), and the summed counts are those a single
    process gets from the same weights: every example scored once."""
    config = quick_config(tmp_path, hellaswag_interval=2, hellaswag_file=str(hellaswag_file), hellaswag_limit=5,
                          gradient_accumulation_steps=2)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env.pop("RANK", None)
    result = subprocess.run([sys.executable, str(REPO / "train.py"), "--standalone", "--nproc_per_node=2",
                             *[f"--{k}={v!r}" for k, v in config.items()]], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    [logged] = hellaswag_records(Path(config["out_dir"]))
    alone = eh.evaluate_checkpoint(config["out_dir"], hellaswag_file, limit=5, device="cpu", dtype="float32")
    assert logged["n"] == alone["n"] == 5 and logged["correct"] == alone["correct"]


def test_hellaswag_text_the_tokenizer_cannot_encode_turns_it_off_before_training(tmp_path):
    path = tmp_path / "hs.jsonl"
    path.write_text(json.dumps(example(["a", "b", "c", "d"], 0, ctx_b="he says \u2014 nothing")) + "\n")
    out_dir = quick_train(tmp_path, hellaswag_interval=1, hellaswag_file=str(path))
    assert hellaswag_records(out_dir) == []  # trained to the end, scoring nothing


def save_char_checkpoint(model, folder):
    save_checkpoint({"model_args": {**vars(model.config)}, "model": model.state_dict(), "iter_num": 0,
                     "meta": {"tokenizer": "char", "vocab_size": len(CHARS), "chars": CHARS,
                              "tokens": {"train": 1, "val": 1}}}, folder / "ckpt.pt")


@pytest.mark.parametrize("attention", VARIANTS)
def test_every_variant_from_a_checkpoint(tmp_path, hellaswag_file, attention):
    save_char_checkpoint(tiny_gpt(attention), tmp_path)
    output = tmp_path / "r.json"
    assert eh.main(["--out_dir", str(tmp_path), "--data_file", str(hellaswag_file), "--output", str(output),
                    "--no_progress", "--limit", "2"]) == 0
    assert json.loads(output.read_text())["settings"]["attention"] == attention


def test_evaluate_checkpoint_checks_dtype_and_data_before_loading_the_model(tmp_path, hellaswag_file, monkeypatch):
    save_char_checkpoint(tiny_gpt("efficient"), tmp_path)
    loaded = []
    monkeypatch.setattr(eh, "load_model_and_tokenizer", lambda *a: loaded.append(a))
    with pytest.raises(ValueError, match="dtype='float8'"):
        eh.evaluate_checkpoint(tmp_path, hellaswag_file, dtype="float8")
    with pytest.raises(eh.HellaSwagError, match="missing.jsonl"):
        eh.evaluate_checkpoint(tmp_path, tmp_path / "missing.jsonl")
    assert loaded == []
    monkeypatch.undo()
    results = eh.evaluate_checkpoint(tmp_path, hellaswag_file, limit=2, device="cpu", dtype="float32")
    assert results["n"] == 2


def test_a_missing_checkpoint_is_reported_before_the_download(tmp_path, monkeypatch, capsys):
    downloads = []
    monkeypatch.setattr(eh, "download_hellaswag", downloads.append)
    assert eh.main(["--out_dir", str(tmp_path / "nothing"), "--cache_dir", str(tmp_path / "cache")]) == 1
    assert capsys.readouterr().err.startswith("error: no checkpoint at") and downloads == []


@pytest.mark.slow
def test_cli_errors_are_messages_not_tracebacks(tmp_path, hellaswag_file, capsys):
    assert eh.main(["--out_dir", str(tmp_path / "nothing"), "--data_file", str(hellaswag_file)]) == 1
    assert "no checkpoint" in capsys.readouterr().err
    save_char_checkpoint(tiny_gpt("standard"), tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(example(SET1, 0)) + "\n{oops\n")
    assert eh.main(["--out_dir", str(tmp_path), "--data_file", str(bad)]) == 1
    assert "line 2" in capsys.readouterr().err
    proc = subprocess.run([sys.executable, str(REPO / "eval_hellaswag.py"), "--out_dir", str(tmp_path / "nothing"),
                           "--data_file", str(hellaswag_file)], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.startswith("error:") and "Traceback" not in proc.stderr


def test_a_character_the_model_cannot_encode_fails_before_scoring(tmp_path, hellaswag_file, capsys, monkeypatch):
    """An unknown character in the last example stops the command line and evaluate_checkpoint before
    the first batch is scored, not after the others (hours, on the full set)."""
    save_char_checkpoint(tiny_gpt("standard"), tmp_path)
    with open(hellaswag_file, "a") as f:  # line 9, after the 8 good examples
        f.write(json.dumps(example(["a", "b", "c", "d \u2014 e"], 0)) + "\n")
    scored = []
    monkeypatch.setattr(eh, "score_batch", lambda *args: scored.append(args) or [])
    assert eh.main(["--out_dir", str(tmp_path), "--data_file", str(hellaswag_file), "--no_progress"]) == 1
    assert "line 9: cannot tokenize its ending" in capsys.readouterr().err
    with pytest.raises(eh.HellaSwagError, match="line 9"):
        eh.evaluate_checkpoint(tmp_path, hellaswag_file, device="cpu")
    assert scored == []


@pytest.mark.parametrize("where", ["under_a_file", "a_folder"])
def test_an_unwritable_output_fails_before_evaluating(tmp_path, hellaswag_file, capsys, monkeypatch, where):
    save_char_checkpoint(tiny_gpt("standard"), tmp_path)
    (tmp_path / "a_file").write_text("x")
    output = tmp_path / "a_file" / "r.json" if where == "under_a_file" else tmp_path
    evaluated = []
    monkeypatch.setattr(eh, "evaluate", lambda *args, **kwargs: evaluated.append(1))
    assert eh.main(["--out_dir", str(tmp_path), "--data_file", str(hellaswag_file), "--output", str(output),
                    "--no_progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and str(output) in err
    if where == "under_a_file":
        assert f"({tmp_path / 'a_file'} is a file, not a folder)" in err
    assert not evaluated


def test_an_output_that_is_not_an_earlier_results_file_is_never_overwritten(tmp_path, hellaswag_file, capsys):
    """--output naming the checkpoint or the data file (a slip of the tab key) would lose them."""
    save_char_checkpoint(tiny_gpt("standard"), tmp_path)
    hellaswag_copy = tmp_path / "hs.jsonl"
    hellaswag_copy.write_bytes(hellaswag_file.read_bytes())
    for precious in (tmp_path / "ckpt.pt", hellaswag_copy):
        before = precious.read_bytes()
        assert eh.main(["--out_dir", str(tmp_path), "--data_file", str(hellaswag_copy), "--output", str(precious),
                        "--no_progress", "--limit", "2"]) == 1
        err = capsys.readouterr().err
        assert err == f"error: --output={precious} exists and is not a results file of eval_hellaswag.py, which " \
                      f"would replace it: name another file\n"
        assert precious.read_bytes() == before
    results = tmp_path / "r.json"  # an earlier evaluation's results are replaced, as a rerun expects
    for limit in ("1", "2"):
        assert eh.main(["--out_dir", str(tmp_path), "--data_file", str(hellaswag_copy), "--output", str(results),
                        "--no_progress", "--limit", limit]) == 0
    assert json.loads(results.read_text())["n"] == 2
    assert (f"note: {results} holds an earlier evaluation's results (1 examples of {hellaswag_copy}), which this "
            f"one's will replace") in capsys.readouterr().err


def test_an_earlier_results_file_is_noted_only_once_the_checks_have_passed(tmp_path, hellaswag_file, capsys):
    """A run refused for a bad argument replaces nothing, so it must not say it will."""
    save_char_checkpoint(tiny_gpt("standard"), tmp_path)
    results = tmp_path / "r.json"
    args = ["--out_dir", str(tmp_path), "--data_file", str(hellaswag_file), "--output", str(results), "--no_progress"]
    assert eh.main([*args, "--limit", "1"]) == 0
    capsys.readouterr()
    assert eh.main([*args, "--batch_size", "0"]) == 1
    assert capsys.readouterr().err == "error: batch_size=0 must be at least 1\n"
    assert eh.main([*args, "--data_file", str(tmp_path / "missing.jsonl")]) == 1
    assert capsys.readouterr().err == f"error: HellaSwag data file {tmp_path / 'missing.jsonl'} does not exist\n"
    assert json.loads(results.read_text())["n"] == 1


def test_a_bad_limit_is_refused_before_the_download(tmp_path, monkeypatch, capsys):
    def download(cache_dir):
        raise AssertionError("downloaded before the arguments were checked")

    monkeypatch.setattr(eh, "download_hellaswag", download)
    save_char_checkpoint(tiny_gpt("standard"), tmp_path)
    assert eh.main(["--out_dir", str(tmp_path), "--limit", "0", "--no_progress"]) == 1
    assert capsys.readouterr().err == "error: limit=0 must be at least 1 (leave it out, or None, for every example)\n"


def test_a_ctrl_c_while_scoring_is_one_line_and_leaves_the_results_file_as_it_was(tmp_path, hellaswag_file, capsys,
                                                                                  monkeypatch):
    save_char_checkpoint(tiny_gpt("standard"), tmp_path)
    output = tmp_path / "r.json"
    argv = ["eval_hellaswag.py", "--out_dir", str(tmp_path), "--data_file", str(hellaswag_file), "--output",
            str(output), "--no_progress"]
    assert eh.main([*argv[1:], "--limit", "1"]) == 0
    earlier, files = output.read_bytes(), sorted(tmp_path.iterdir())

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(GPT, "forward", interrupted)
    monkeypatch.setattr(sys, "argv", argv)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit:
        try:
            runpy.run_path(str(REPO / "eval_hellaswag.py"), run_name="__main__")  # as the command line runs it
        except KeyboardInterrupt:  # let through, it would stop pytest itself
            pytest.fail("the Ctrl-C ended eval_hellaswag.py with a KeyboardInterrupt traceback")
    assert exit.value.code == 130
    assert capsys.readouterr().err.splitlines()[-1] == ("stopped by Ctrl-C; no results written (they are written "
                                                        "whole, once every example is scored)")
    assert output.read_bytes() == earlier and sorted(tmp_path.iterdir()) == files


@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_results_into_a_closed_pipe_are_written_and_quiet(tmp_path, hellaswag_file, unbuffered):
    """`python eval_hellaswag.py ... | head -1`: head may exit before the accuracies are printed, which is
    no error, and loses no results. Unbuffered, the first print finds the pipe closed; buffered, the exit."""
    save_char_checkpoint(tiny_gpt("standard"), tmp_path)
    output = tmp_path / "r.json"
    child = subprocess.Popen([sys.executable, str(REPO / "eval_hellaswag.py"), "--out_dir", str(tmp_path),
                              "--data_file", str(hellaswag_file), "--output", str(output), "--no_progress",
                              "--threads=1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONUNBUFFERED": unbuffered})
    child.stdout.close()  # before the child has imported torch, so its first write finds no reader
    err = child.stderr.read()
    child.stderr.close()
    assert child.wait(timeout=120) == 141
    assert [line.split(":")[0] for line in err.splitlines()] == ["HellaSwag", "note"], err  # no traceback
    assert json.loads(output.read_text())["n"] == len(FILE_KINDS)


def test_a_failed_write_keeps_the_printed_results(tmp_path, hellaswag_file, capsys, monkeypatch):
    save_char_checkpoint(tiny_gpt("standard"), tmp_path)
    output = tmp_path / "r.json"

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(eh, "write_text_atomic", disk_full)
    assert eh.main(["--out_dir", str(tmp_path), "--data_file", str(hellaswag_file), "--output", str(output),
                    "--no_progress", "--limit", "2"]) == 1
    captured = capsys.readouterr()
    assert "acc_norm:" in captured.out and "No space left on device" in captured.err
    assert not output.exists()


@pytest.mark.slow
def test_ddp_splits_examples_and_sums_counts(tmp_path, hellaswag_file):
    save_char_checkpoint(tiny_gpt("optimized"), tmp_path)
    single = tmp_path / "single.json"
    assert eh.main(["--out_dir", str(tmp_path), "--data_file", str(hellaswag_file), "--output", str(single),
                    "--no_progress"]) == 0
    ddp = tmp_path / "ddp.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(REPO / "eval_hellaswag.py"), "--out_dir", str(tmp_path), "--data_file", str(hellaswag_file),
         "--output", str(ddp), "--no_progress"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    a, b = json.loads(single.read_text()), json.loads(ddp.read_text())
    assert b["settings"]["world_size"] == 2 and b["n"] == a["n"] == len(FILE_KINDS)
    assert b["correct"] == a["correct"]
    assert {m: b[m] for m in eh.METRICS} == {m: a[m] for m in eh.METRICS}  # over all examples, not a rank's share


@pytest.mark.slow
def test_a_failed_download_under_torchrun_is_said_once_and_not_retried_by_the_other_ranks(tmp_path):
    script = tmp_path / "download.py"
    script.write_text(f"""import os, sys
sys.path.insert(0, {str(REPO)!r})
import eval_hellaswag as eh

def download(cache_dir):
    print(f"rank {{os.environ['RANK']}} downloads", flush=True)
    raise eh.HellaSwagError("could not download HellaSwag: no network")

eh.download_hellaswag = download
rank, world_size, device = eh.join_ranks("cpu")
try:
    eh.find_data_file(None, "cache", rank, launched=True)
except eh.HellaSwagError as e:
    print(f"rank {{rank}}: {{e}}", flush=True)
    sys.exit(1)
""")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script)], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
    assert proc.returncode != 0
    assert re.findall(r"rank \d.*", proc.stdout) == ["rank 0 downloads", "rank 0: could not download HellaSwag: no network"]


@needs_bpe
def test_gpt2_bpe_tokenization_of_endings(hellaswag_file):
    from tokenizer import GPT2Tokenizer, gpt2_encoding

    tok = GPT2Tokenizer()
    ex = eh.load_examples(hellaswag_file, limit=1)[0]
    pairs, nanogpt_index, harness_index, lengths = eh.example_requests(ex, tok)
    enc = gpt2_encoding()
    assert pairs[nanogpt_index[2]] == (tuple(enc.encode(ex["ctx"])), tuple(enc.encode(" c c c c")))
    query = "Roofing: A man is sitting on a roof. He number 0"
    assert pairs[harness_index[0]] == (tuple(enc.encode(query)), tuple(enc.encode(" a")))
    model = tiny_gpt("super", vocab_size=50304)
    result = eh.evaluate(model, eh.load_examples(hellaswag_file, limit=2), tok, "cpu", batch_size=2)
    assert result["n"] == 2
