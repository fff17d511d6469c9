"""export_hf.py against transformers' own models: every variant, GPT-2-style and Llama-style, in
float64 and float32, must compute the repo's logits and greedy tokens; GPT-2 and Llama folders
load back into GPT; a missing or damaged checkpoint is one error line."""
import os
import subprocess
import sys
from dataclasses import asdict, replace

import pytest
import torch

from conftest import GQA, LLAMA, TINY, tiny_model

transformers = pytest.importorskip("transformers", reason="export loads into transformers")
pytest.importorskip("safetensors", reason="export writes its weights as safetensors")

import export_hf  # noqa: E402
from model import GPT  # noqa: E402

PAPER_VARIANTS = ("standard", "optimized", "efficient", "super")
# what each model exports as: plain GPT-2 or Llama for standard attention, else remote code
CASES = {
    **{f"{attention}-gpt2": (attention, {}) for attention in PAPER_VARIANTS},
    "standard-gpt2-exact-gelu-no-bias": ("standard", dict(bias=False)),
    "standard-gpt2-tanh-gelu": ("standard", dict(gelu_approximate="tanh")),
    **{f"{attention}-llama": (attention, LLAMA) for attention in PAPER_VARIANTS},
    "standard-llama-gqa-tied": ("standard", dict(GQA, tie_embeddings=True)),
    "standard-rope-gpt2-blocks": ("standard", dict(pos="rope")),  # no HF class: remote code
}
KINDS = {"standard-gpt2": "gpt2", "standard-gpt2-exact-gelu-no-bias": "gpt2",
         "standard-gpt2-tanh-gelu": "gpt2", "standard-llama": "llama",
         "standard-llama-gqa-tied": "llama"}
ARCHITECTURES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM",
                 "remote_code": "GPTVariantForCausalLM"}
BATCH = 3


def save_checkpoint(model, path, meta=None):
    torch.save({"model_args": asdict(model.config), "model": model.state_dict(), "meta": meta},
               path)
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(repo model, its exported folder loaded by transformers) per case and dtype, made once."""
    made = {}

    def get(case, dtype, block_size=TINY["block_size"]):
        key = case, dtype, block_size
        if key not in made:
            attention, options = CASES[case]
            model = tiny_model(attention, **options, vocab_size=71, block_size=block_size)
            folder = tmp_path_factory.mktemp(case)
            # transformers caches remote code by the folder's name: one name per test worker
            hf_dir = folder / f"hf-{os.getpid()}"
            export_hf.export(save_checkpoint(model.to(dtype), folder / "ckpt.pt"), hf_dir)
            hf_model = transformers.AutoModelForCausalLM.from_pretrained(
                hf_dir, trust_remote_code=True, dtype=dtype)
            made[key] = model, hf_model.eval(), hf_dir
        return made[key]
    return get


def relative_error(ours, theirs):
    """max |diff| / max |logit|: the error on the logits' own scale."""
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    return ((ours - theirs).abs().max() / ours.abs().max()).item()


def repo_logits(model, idx):
    with torch.no_grad():
        return model(idx, all_logits=True)[0]


def logits_pair(model, hf_model, idx):
    with torch.no_grad():
        return repo_logits(model, idx), hf_model(idx).logits


class HFStyleRMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm as it computes: in float32 whatever the model's dtype."""

    def __init__(self, norm):
        super().__init__()
        self.weight, self.eps = norm.weight, norm.eps

    def forward(self, x):
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def float32_norms(model):
    """A copy of a Llama-style model whose RMSNorms compute as transformers' do."""
    copy = GPT(model.config).to(model.lm_head.weight.dtype)
    copy.load_state_dict(model.state_dict())
    for block in copy.transformer.h:
        block.ln_1, block.ln_2 = HFStyleRMSNorm(block.ln_1), HFStyleRMSNorm(block.ln_2)
    copy.transformer.ln_f = HFStyleRMSNorm(copy.transformer.ln_f)
    return copy.eval()


@pytest.mark.parametrize("case", CASES)
def test_exported_logits_equal_the_repo_models(case, exported):
    """Full blocks and shorter sequences (a causal model needs no padding mask), in float64 to
    1e-10 of the logits' scale and in float32 to 1e-5, from the class the model exports as."""
    torch.manual_seed(1)
    full = torch.randint(0, 71, (BATCH, TINY["block_size"]))
    for dtype, tolerance in ((torch.float64, 1e-10), (torch.float32, 1e-5)):
        model, hf_model, _ = exported(case, dtype)
        assert type(hf_model).__name__ == ARCHITECTURES[KINDS.get(case, "remote_code")]
        for idx in (full, full[:, :TINY["block_size"] - 5]):
            ours, theirs = logits_pair(model, hf_model, idx)
            if KINDS.get(case) == "llama" and dtype == torch.float64:
                # HF's RMSNorm computes in float32 even in a float64 model: ~1e-7 apart ...
                assert relative_error(ours, theirs) < 1e-6
                # ... and exactly that: with the repo's norms computing as HF's, 1e-10 holds
                ours = repo_logits(float32_norms(model), idx)
            assert relative_error(ours, theirs) < tolerance, (dtype, idx.shape)


@pytest.mark.parametrize("case", CASES)
def test_greedy_generate_through_transformers_equals_the_repos(case, exported):
    """30 tokens, token for token. A remote-code model slides its window past block_size as
    GPT.generate does; HF's GPT-2 has no positions past it and HF's Llama attends to the whole
    context, not a window, so the plain folders generate within a block of 40."""
    plain = case in KINDS
    model, hf_model, _ = exported(case, torch.float64, block_size=40 if plain else 16)
    torch.manual_seed(2)
    prompt = torch.randint(0, 71, (2, 5))
    theirs = hf_model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=30,
                               do_sample=False)
    ours = model.generate(prompt, 30, top_k=1)  # GPT.generate's greedy decoding
    assert theirs.shape == (2, 35) and torch.equal(theirs, ours)
    assert plain or theirs.size(1) > model.config.block_size


def test_remote_code_slides_its_window_past_block_size_and_refuses_left_padding(exported):
    """Past block_size position t sees the block_size tokens up to t, as GPT.generate's window;
    right padding needs no mask, left padding would shift every position: refused."""
    model, hf_model, _ = exported("optimized-llama", torch.float64)
    block_size = TINY["block_size"]
    torch.manual_seed(4)
    idx = torch.randint(0, 71, (2, block_size + 4))
    with torch.no_grad():
        theirs = hf_model(idx).logits
        assert torch.equal(theirs[:, :block_size], repo_logits(model, idx[:, :block_size]))
        for t in range(block_size, idx.size(1)):
            assert torch.equal(theirs[:, t], model(idx[:, t + 1 - block_size: t + 1])[0][:, -1])
        right_padded = torch.ones_like(idx)
        right_padded[0, -3:] = 0
        assert torch.equal(hf_model(idx, attention_mask=right_padded).logits, theirs)
        with pytest.raises(ValueError, match="pad on the right"):
            hf_model(idx, attention_mask=right_padded.flip(1))


@pytest.mark.parametrize("case", KINDS)
def test_gpt2_and_llama_folders_load_back_into_gpt(case, exported):
    model, _, folder = exported(case, torch.float32)
    imported = GPT.from_pretrained(str(folder)).eval()
    # GPT-2 always has biases: a model without them comes back with zero ones
    bias = True if KINDS[case] == "gpt2" else model.config.bias
    assert imported.config == replace(model.config, bias=bias)
    torch.manual_seed(3)
    idx = torch.randint(0, 71, (BATCH, TINY["block_size"]))
    assert relative_error(repo_logits(model, idx), repo_logits(imported, idx)) < 1e-6


def test_a_remote_code_folder_does_not_load_into_gpt_unasked(exported):
    """GPT.from_pretrained never runs a folder's own code (nor asks whether to, on a terminal)."""
    _, _, folder = exported("efficient-gpt2", torch.float32)
    with pytest.raises(ValueError, match="custom code"):
        GPT.from_pretrained(str(folder))


def test_remote_code_folder_runs_without_this_repo(exported, tmp_path):
    """The folder carries its own model.py and generate.py: transformers loads it from a process
    whose path holds no copy of the repo."""
    model, _, folder = exported("super-llama", torch.float64)
    idx = torch.arange(2 * TINY["block_size"]).view(2, -1) % 71
    script = ("import sys, torch, transformers\n"
              f"m = transformers.AutoModelForCausalLM.from_pretrained({str(folder)!r}, "
              "trust_remote_code=True, dtype=torch.float64)\n"
              f"torch.save(m(torch.load({str(tmp_path / 'idx.pt')!r})).logits, "
              f"{str(tmp_path / 'logits.pt')!r})\n"
              "assert not {'model', 'generate', 'checkpoint'} & set(sys.modules), sys.modules\n")
    torch.save(idx, tmp_path / "idx.pt")
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "PYTHONPATH": ""}
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    ours = repo_logits(model, idx)
    assert relative_error(ours, torch.load(tmp_path / "logits.pt")) < 1e-10


def test_cli_writes_the_folder_and_the_tokenizer_hook_gets_the_meta(tmp_path, capsys,
                                                                     monkeypatch):
    meta = {"tokenizer": "char", "chars": "abc"}
    written = []
    monkeypatch.setitem(sys.modules, "hf_tokenizer",
                        type(sys)("hf_tokenizer"))  # the tokenizer's writer, here a stand-in
    sys.modules["hf_tokenizer"].write_tokenizer = lambda *args: written.append(args)
    ckpt = save_checkpoint(tiny_model("efficient"), tmp_path / "ckpt.pt", meta)
    assert export_hf.main([f"--out_dir={tmp_path}", f"--hf_dir={tmp_path / 'hf'}"]) == 0
    assert "trust_remote_code=True" in capsys.readouterr().out
    assert written == [(meta, tmp_path / "hf")]
    assert {"config.json", "model.safetensors", *export_hf.REMOTE_CODE} <= \
        {p.name for p in (tmp_path / "hf").iterdir()}
    assert ckpt.is_file()


def error_line(argv, capsys):
    assert export_hf.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_a_missing_or_damaged_checkpoint_is_one_error_line(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    hf_dir = f"--hf_dir={tmp_path / 'hf'}"
    assert "no checkpoint at" in error_line([f"--out_dir={empty}", hf_dir], capsys)
    ckpt = save_checkpoint(tiny_model("standard"), tmp_path / "ckpt.pt")
    ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])  # a truncated copy
    assert "cannot read checkpoint" in error_line([f"--out_dir={ckpt}", hf_dir], capsys)
    # a variant registered outside model.py: the folder's copy of model.py would lack it
    save_checkpoint(tiny_model("temperature"), ckpt)
    assert "move the class into model.py" in error_line([f"--out_dir={ckpt}", hf_dir], capsys)
