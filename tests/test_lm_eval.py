"""lm-evaluation-harness on an exported model against eval_hellaswag.py on the repo's, example for
example: lm_eval's hellaswag_local task (lm_eval_tasks/) over a local HellaSwag-format file.

What holds, by the code of both: lm-eval's `acc` is our `acc_harness` (the summed log-likelihood on
the harness's text) and its `acc_norm` our `acc_char_norm`. Our `acc` scores another text
(ctx + " " + ending, NanoGPT's), so it is not lm-eval's acc, and the test does not claim it is."""
import json
import math
import random

import pytest

from conftest import REPO, needs_bpe, tiny_model

for package in ("transformers", "lm_eval", "accelerate"):  # lm-eval[hf] installs all three
    pytest.importorskip(package, reason=f"needs {package}: pip install 'lm-eval[hf]'")
export_hf = pytest.importorskip("export_hf", reason="needs export_hf.py, the export")

import eval_hellaswag as eh  # noqa: E402
from checkpoint import save_checkpoint  # noqa: E402
from tokenizer import GPT2Tokenizer  # noqa: E402

pytestmark = [needs_bpe, pytest.mark.usefixtures("one_thread")]

N_EXAMPLES = 60
WORDS = ("man woman dog ball kitchen knife guitar rope water snow car bike paint wall tree the a "
         "then slowly quickly picks puts rides jumps into onto over with and his her it").split()


def sentence(rng, n_min=3, n_max=9):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(n_min, n_max)))


def synthetic_example(rng):
    """A well-formed HellaSwag example, with the WikiHow artifacts the harness cleans away: a
    " [title]", a "[step]" (one ending the context, whose space then moves to the endings) and
    double spaces."""
    ctx_a = sentence(rng).capitalize() + "."
    ctx_b = sentence(rng, 1, 4)
    if rng.random() < 0.2:
        ctx_b += " [step]"
    if rng.random() < 0.2:
        ctx_a = "How to " + sentence(rng, 2, 4) + " [title] " + ctx_a
    endings = [sentence(rng, 1, 12) + rng.choice([".", ".", "!", "  [substeps] ok."])
               for _ in range(4)]
    label = rng.randrange(4)
    return {"ind": rng.randrange(10**5), "activity_label": rng.choice(["Cooking", "Sledding"]),
            "ctx_a": ctx_a, "ctx_b": ctx_b, "ctx": f"{ctx_a} {ctx_b}", "endings": endings,
            "label": label if rng.random() < 0.5 else str(label), "split": "val"}


# a plain GPT2LMHeadModel folder, and one of this repo's code (trust_remote_code=True)
@pytest.fixture(scope="module", params=["standard", "efficient"])
def exported(tmp_path_factory, request):
    """(the repo model, its export folder, the HellaSwag file, lm-eval's task folder)."""
    root = tmp_path_factory.mktemp("lm_eval")
    model = tiny_model(request.param, seed=3, block_size=128, vocab_size=50304)
    save_checkpoint({"model_args": {**vars(model.config)}, "model": model.state_dict(),
                     "iter_num": 0, "meta": {"tokenizer": "gpt2", "vocab_size": 50257,
                                             "tokens": {"train": 1, "val": 1}}},
                    root / "ckpt.pt")
    export_hf.export(root / "ckpt.pt", root / "hf")
    remote_code = "auto_map" in json.loads((root / "hf" / "config.json").read_text())
    assert remote_code == (request.param != "standard")
    data = root / "hellaswag.jsonl"
    rng = random.Random(0)
    data.write_text("".join(json.dumps(synthetic_example(rng)) + "\n" for _ in range(N_EXAMPLES)))
    # the repo's task, reading this file: lm-eval merges an included YAML under the local keys
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "hellaswag_test.yaml").write_text(
        f"include: {REPO / 'lm_eval_tasks' / 'hellaswag_local.yaml'}\ntask: hellaswag_test\n"
        f"dataset_kwargs:\n  data_files:\n    validation: {data}\n")
    return model, root / "hf", data, tasks


def lm_eval_samples(hf_dir, tasks):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    remote_code = "auto_map" in json.loads((hf_dir / "config.json").read_text())
    model_args = {"pretrained": str(hf_dir), "dtype": "float32", "trust_remote_code": remote_code}
    task_manager = TaskManager(include_path=str(tasks), include_defaults=False)
    out = simple_evaluate(model="hf", model_args=model_args, tasks=["hellaswag_test"],
                          device="cpu", batch_size=8, log_samples=True, task_manager=task_manager)
    return out["results"]["hellaswag_test"], sorted(out["samples"]["hellaswag_test"],
                                                     key=lambda s: s["doc_id"])


@pytest.mark.slow
def test_lm_eval_on_the_export_scores_as_eval_hellaswag_example_for_example(exported):
    model, hf_dir, data, tasks = exported
    results, samples = lm_eval_samples(hf_dir, tasks)
    examples, tokenizer = eh.load_examples(data), GPT2Tokenizer()
    assert len(samples) == len(examples) == N_EXAMPLES

    ours = eh.evaluate(model, examples, tokenizer, batch_size=8)
    assert ours["n_endings_truncated"] == 0
    differ = []
    for example, sample in zip(examples, samples):
        pairs, char_lengths = eh.example_requests(example, tokenizer)
        scored = eh.continuation_logprobs(model, pairs)
        predicted = eh.predictions(scored, char_lengths)
        ours_harness = [total for total, _ in scored[4:]]
        theirs = [float(loglikelihood) for loglikelihood, _ in sample["filtered_resps"]]
        same = (all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(ours_harness, theirs))
                and sample["acc"] == float(predicted["acc_harness"] == example["label"])
                and sample["acc_norm"] == float(predicted["acc_char_norm"] == example["label"]))
        if not same:
            differ.append(f"line {example['_line']}: ours {ours_harness} {predicted}, lm-eval "
                          f"{theirs} acc {sample['acc']} acc_norm {sample['acc_norm']}")
    assert not differ, "examples scored differently:\n" + "\n".join(differ)
    assert results["acc,none"] == ours["acc_harness"]
    assert results["acc_norm,none"] == ours["acc_char_norm"]
    # a model that always picked the same ending would agree too: these pick all sorts
    assert 0 < ours["acc_harness"] < 1 and 0 < ours["acc_char_norm"] < 1
