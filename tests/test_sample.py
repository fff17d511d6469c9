"""sample.py: sampling from checkpoints of every variant, both tokenizers and GPT-2's weights, with
and without the KV cache, compiled or not; a bad argument is one error line."""
import os
import pickle
import re
import subprocess
import sys

import pytest
import torch

from conftest import REPO, VARIANTS, needs_bpe, needs_compiler, tiny_model
import sample
from checkpoint import save_checkpoint
from model import GPT, GPTConfig
from tokenizer import CharTokenizer

CHARS = "\n !',.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
CHAR_META = {"tokenizer": "char", "vocab_size": len(CHARS), "chars": CHARS,
             "tokens": {"train": 10, "val": 1}}

pytestmark = pytest.mark.usefixtures("one_thread")


def write_checkpoint(folder, attention="standard", meta=CHAR_META, vocab_size=len(CHARS),
                     block_size=32):
    model = tiny_model(attention, vocab_size=vocab_size, block_size=block_size)
    save_checkpoint({"model_args": dict(vars(model.config)), "model": model.state_dict(),
                     "iter_num": 5, "meta": meta}, folder / "ckpt.pt")
    return folder


def run(capsys, *args):
    code = sample.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def texts(out):
    return out.split("---------------\n")[:-1]


@pytest.mark.parametrize("attention", VARIANTS)
def test_samples_from_a_char_checkpoint_of_every_variant(tmp_path, capsys, attention):
    (tmp_path / "prompt.txt").write_text("ROMEO:")
    args = ["--out_dir", write_checkpoint(tmp_path, attention, block_size=16), "--num_samples", 2,
            "--max_new_tokens", 30, "--start"]
    code, out, err = run(capsys, *args, "ROMEO:", "--seed", 1)
    assert code == 0, err
    samples = texts(out)
    assert len(samples) == 2 and all(s.startswith("ROMEO:") for s in samples)
    assert all(len(s) == len("ROMEO:") + 30 + 1 for s in samples)  # 30 characters and a newline
    assert set("".join(samples)) <= set(CHARS)
    # the speed on stderr: stdout, redirected to a file, holds the samples alone
    assert re.fullmatch(rf"60 tokens in [\d.]+ s: [\d.]+ tokens/s \({attention} attention, char "
                        rf"tokenizer, cpu, float32, KV cache on\)\n", err)
    # the same text from a prompt file, and without the KV cache, past block_size too
    assert run(capsys, *args, f"FILE:{tmp_path / 'prompt.txt'}", "--seed", 1)[1] == out
    code, uncached, err = run(capsys, *args, "ROMEO:", "--seed", 1, "--no_kv_cache")
    assert uncached == out and err.endswith("KV cache off)\n")
    assert run(capsys, *args, "ROMEO:", "--seed", 2)[1] != out


def test_temperature_and_top_k_reach_the_model(tmp_path, capsys, monkeypatch):
    write_checkpoint(tmp_path)
    seen = []
    real_generate = GPT.generate

    def recording(model, idx, max_new_tokens, **kwargs):
        seen.append((kwargs["temperature"], kwargs["top_k"]))
        return real_generate(model, idx, max_new_tokens, **kwargs)

    monkeypatch.setattr(GPT, "generate", recording)
    for top_k in (7, 0):  # 0: no cut
        assert run(capsys, "--out_dir", tmp_path, "--max_new_tokens", 3, "--temperature", 0.3,
                   "--top_k", top_k)[0] == 0
    assert seen == [(0.3, 7)] * 3 + [(0.3, None)] * 3


@pytest.mark.slow
@needs_compiler
def test_compiled_decoding_samples_the_same_text(tmp_path, capsys):
    write_checkpoint(tmp_path, "super", block_size=16)
    args = ["--out_dir", tmp_path, "--start", "ROMEO:", "--num_samples", 2, "--max_new_tokens", 30]
    code, eager, err = run(capsys, *args)
    assert code == 0, err
    code, compiled, err = run(capsys, *args, "--compile")
    assert code == 0, err
    assert compiled == eager  # past block_size too: refills between compiled steps
    assert err.endswith("KV cache on, compiled: the time includes compiling)\n")


def test_compile_is_a_flag_or_nanogpts_true_false():
    forms = [], ["--compile"], ["--compile=True"], ["--compile=False"]
    assert [sample.parse_args(form).compile for form in forms] == [False, True, True, False]


def test_a_checkpoint_nanogpt_trained_samples_with_its_meta_pkl(tmp_path, capsys, monkeypatch):
    """NanoGPT's checkpoint: seven model_args, compiled keys, config['dataset']; its characters in
    data/<dataset>/meta.pkl, relative to where it ran."""
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model_args = dict(n_layer=2, n_head=2, n_embd=16, block_size=32, bias=False,
                      vocab_size=len(CHARS), dropout=0.0)
    model = GPT(GPTConfig(**model_args))  # NanoGPT's modules and names, as standard attention here
    (tmp_path / "out").mkdir()
    torch.save({"model": {f"_orig_mod.{k}": v for k, v in model.state_dict().items()},
                "model_args": model_args, "iter_num": 5, "best_val_loss": torch.tensor(1.5),
                "config": {"dataset": "shakespeare_char"}}, tmp_path / "out" / "ckpt.pt")
    (tmp_path / "data" / "shakespeare_char").mkdir(parents=True)
    meta = {"vocab_size": len(CHARS), "itos": dict(enumerate(CHARS)),
            "stoi": {c: i for i, c in enumerate(CHARS)}}
    (tmp_path / "data" / "shakespeare_char" / "meta.pkl").write_bytes(pickle.dumps(meta))
    code, out, err = run(capsys, "--out_dir", "out", "--start", "ROMEO:", "--num_samples", 1,
                         "--max_new_tokens", 20, "--top_k", 1)
    assert code == 0, err
    tok = CharTokenizer(CHARS)  # greedy: the text of the model that wrote the checkpoint
    ids = model.eval().generate(torch.tensor([tok.encode("ROMEO:")]), 20, top_k=1)
    assert texts(out) == [tok.decode(ids[0].tolist()) + "\n"]


@pytest.mark.parametrize("args, message", [
    (["--start", "caf\u00e9 \u2603"], r"characters not in the vocabulary: '\u00e9', '\u2603'"),
    (["--temperature", "0"], "temperature=0.0 must be a positive number"),
    (["--top_k", "-1"], "top_k=-1 must be at least 1"),
    (["--max_new_tokens", "-1"], "max_new_tokens=-1"),
    (["--num_samples", "0"], "--num_samples=0 must be at least 1"),
    (["--start", "FILE:/no/such/prompt.txt"], "No such file or directory: '/no/such/prompt.txt'"),
    (["--start", ""], "the prompt is empty"),
    (["--compile", "--no_kv_cache"], "compile=True decodes from the KV cache"),
    (["--device", "gpu0"], "not a device torch knows"),
    (["--out_dir", "nowhere"], "no checkpoint at nowhere"),
    (["--damaged"], "its weight transformer.ln_f.weight holds NaN or inf values"),
])
def test_a_bad_argument_is_one_error_line_and_no_output(tmp_path, capsys, monkeypatch, args,
                                                        message):
    monkeypatch.chdir(tmp_path)
    write_checkpoint(tmp_path)
    if args == ["--damaged"]:  # bytes overwritten in ckpt.pt can load as NaN
        checkpoint = torch.load(tmp_path / "ckpt.pt", weights_only=True)
        checkpoint["model"]["transformer.ln_f.weight"][5] = float("nan")
        torch.save(checkpoint, tmp_path / "ckpt.pt")  # not save_checkpoint, which refuses it
        args = []
    code, out, err = run(capsys, "--out_dir", tmp_path, "--max_new_tokens", 3, *args)
    assert code == 1 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and re.search(message, err), err


def sample_py(*args, cwd):
    # stdout buffered; offline: no GPT-2 weights without a network (HF_HUB_OFFLINE: no retries)
    env = {**os.environ, "PYTHONUNBUFFERED": "", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, str(REPO / "sample.py"), "--threads=1", *args],
                          cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=120)


@pytest.mark.slow
def test_the_command_line_samples_then_prints_the_speed_and_says_gpt2_is_out_of_reach(tmp_path):
    """`python sample.py > out.txt 2>&1`: the samples first, then the speed line."""
    lines = sample_py(f"--out_dir={write_checkpoint(tmp_path)}", "--max_new_tokens=3",
                      cwd=tmp_path).stdout.splitlines()
    assert lines[-2] == "---------------" and re.fullmatch(r"9 tokens in [\d.]+ s: .*", lines[-1])
    proc = sample_py("--init_from=gpt2", "--max_new_tokens=2", cwd=tmp_path)
    if proc.returncode != 0:  # else the weights are cached here
        assert proc.returncode == 1 and "Traceback" not in proc.stdout
        assert proc.stdout.startswith("error: could not load 'gpt2' weights")


@needs_bpe
def test_samples_from_a_gpt2_bpe_checkpoint(tmp_path, capsys):
    meta = {"tokenizer": "gpt2", "vocab_size": 50257, "tokens": {"train": 10, "val": 1}}
    write_checkpoint(tmp_path, "efficient", meta=meta, vocab_size=50304)
    code, out, err = run(capsys, "--out_dir", tmp_path, "--start", "Hello, world",
                         "--max_new_tokens", 8, "--num_samples", 1, "--dtype", "bfloat16")
    assert code == 0, err
    assert out.startswith("Hello, world") and "8 tokens in" in err and "bfloat16" in err


def test_ids_of_the_models_padded_vocab_are_skipped_in_the_text():
    """GPT-2's model vocab is padded from 50257 to 50304, and an undertrained model samples the
    padding: the text leaves those ids out rather than failing to decode them."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=5)).eval()
    [text], _ = sample.sample(model, CharTokenizer("abc"), [0], num_samples=1,  # 2 padding ids
                              max_new_tokens=60, temperature=5.0, top_k=None)
    assert set(text) <= set("abc") and 0 < len(text) < 61  # padding ids sampled, and skipped
