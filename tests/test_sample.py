"""sample.py: sampling from checkpoints of every variant, both tokenizers and GPT-2's weights, with
and without the KV cache, compiled or not; a bad argument is one error line."""
import os
import pickle
import re
import subprocess
import sys

import pytest
import torch

from conftest import REPO, VARIANTS, needs_bpe, needs_compiler
import sample
from checkpoint import save_checkpoint
from model import GPT, GPTConfig
from tokenizer import CharTokenizer

CHARS = "\n !',.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
CHAR_META = {"tokenizer": "char", "vocab_size": len(CHARS), "chars": CHARS,
             "tokens": {"train": 10, "val": 1}}

pytestmark = pytest.mark.usefixtures("one_thread")


def write_checkpoint(folder, attention="standard", meta=CHAR_META, vocab_size=len(CHARS), block_size=32):
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=2, n_head=2, n_embd=16,
                          attention=attention))
    save_checkpoint({"model_args": dict(vars(model.config)), "model": model.state_dict(), "iter_num": 5,
                     "best_val_loss": 1.0, "config": {}, "meta": meta}, folder / "ckpt.pt")
    return folder


def run(capsys, *args):
    code = sample.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def texts(out):
    return out.split("---------------\n")[:-1]


@pytest.mark.parametrize("attention", VARIANTS)
def test_samples_from_a_char_checkpoint_of_every_variant(tmp_path, capsys, attention):
    write_checkpoint(tmp_path, attention)
    code, out, err = run(capsys, "--out_dir", tmp_path, "--start", "ROMEO:", "--num_samples", 2,
                         "--max_new_tokens", 40, "--seed", 1)
    assert code == 0, err
    samples = texts(out)
    assert len(samples) == 2 and all(s.startswith("ROMEO:") for s in samples)
    assert all(len(s) == len("ROMEO:") + 40 + 1 for s in samples)  # 40 characters and a newline
    assert set("".join(samples)) <= set(CHARS)
    # the speed on stderr: stdout, redirected to a file, holds the samples alone
    assert re.fullmatch(rf"80 tokens in [\d.]+ s: [\d.]+ tokens/s \({attention} attention, char "
                        rf"tokenizer, cpu, float32, KV cache on\)\n", err)


def test_temperature_and_top_k_reach_the_model(tmp_path, capsys, monkeypatch):
    write_checkpoint(tmp_path)
    seen = []
    real_generate = GPT.generate

    def recording(model, idx, max_new_tokens, **kwargs):
        seen.append((kwargs["temperature"], kwargs["top_k"]))
        return real_generate(model, idx, max_new_tokens, **kwargs)

    monkeypatch.setattr(GPT, "generate", recording)
    for top_k, expected in ((7, 7), (0, None)):  # 0: no cut
        code, _, err = run(capsys, "--out_dir", tmp_path, "--num_samples", 2, "--max_new_tokens", 3,
                           "--temperature", 0.3, "--top_k", top_k)
        assert code == 0, err
        assert seen == [(0.3, expected)] * 2
        seen.clear()


def test_seed_kv_cache_and_file_prompt(tmp_path, capsys):
    write_checkpoint(tmp_path / "ck", "super", block_size=16)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("First Citizen:\n")
    args = ["--out_dir", tmp_path / "ck" / "ckpt.pt", "--start", f"FILE:{prompt}", "--num_samples", 1,
            "--max_new_tokens", 30, "--top_k", 5, "--seed"]
    _, cached, cached_err = run(capsys, *args, 7)
    _, again, _ = run(capsys, *args, 7)
    _, uncached, uncached_err = run(capsys, *args, 7, "--no_kv_cache")
    assert texts(cached)[0].startswith("First Citizen:\n")
    assert cached == again == uncached  # past block_size too: the window slides
    assert "KV cache on" in cached_err and "KV cache off" in uncached_err
    _, other_seed, _ = run(capsys, *args, 8)
    assert other_seed != cached


@pytest.mark.slow
@needs_compiler
def test_compiled_decoding_samples_the_same_text(tmp_path, capsys):
    write_checkpoint(tmp_path, "super", block_size=16)
    args = ["--out_dir", tmp_path, "--start", "ROMEO:", "--num_samples", 2, "--max_new_tokens", 30, "--seed", 3]
    code, eager, err = run(capsys, *args)
    assert code == 0, err
    code, compiled, err = run(capsys, *args, "--compile")
    assert code == 0, err
    assert compiled == eager  # past block_size too: refills between compiled steps
    assert err.endswith("KV cache on, compiled: the time includes compiling)\n")


@pytest.mark.parametrize("args, compile", [([], False), (["--compile"], True), (["--compile=True"], True),
                                           (["--compile=False"], False), (["--compile=yes"], None)])
def test_compile_is_a_flag_or_nanogpts_true_false(args, compile, capsys):
    if compile is None:
        with pytest.raises(SystemExit):
            sample.parse_args(args)
        assert "'yes': write True or False" in capsys.readouterr().err
    else:
        assert sample.parse_args(args).compile is compile


def test_a_checkpoint_nanogpt_trained_samples_with_its_meta_pkl(tmp_path, capsys, monkeypatch):
    """NanoGPT's train.py writes seven model_args, compiled keys, a tensor best_val_loss and
    config['dataset']; its data/<dataset>/meta.pkl, relative to where it ran, holds the characters."""
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model_args = dict(n_layer=2, n_head=2, n_embd=16, block_size=32, bias=False, vocab_size=len(CHARS),
                      dropout=0.0)
    model = GPT(GPTConfig(**model_args))  # NanoGPT's modules and names, as standard attention here
    (tmp_path / "out").mkdir()
    torch.save({"model": {f"_orig_mod.{k}": v for k, v in model.state_dict().items()}, "optimizer": {},
                "model_args": model_args, "iter_num": 5, "best_val_loss": torch.tensor(1.5),
                "config": {"dataset": "shakespeare_char"}}, tmp_path / "out" / "ckpt.pt")
    (tmp_path / "data" / "shakespeare_char").mkdir(parents=True)
    meta = {"vocab_size": len(CHARS), "itos": dict(enumerate(CHARS)), "stoi": {c: i for i, c in enumerate(CHARS)}}
    (tmp_path / "data" / "shakespeare_char" / "meta.pkl").write_bytes(pickle.dumps(meta))
    args = ["--out_dir", "out", "--start", "ROMEO:", "--num_samples", 1, "--max_new_tokens", 20, "--top_k", 1]
    code, out, err = run(capsys, *args)
    assert code == 0, err
    # greedy: the same text as the model that wrote the checkpoint
    ids = model.eval().generate(torch.tensor([CharTokenizer(CHARS).encode("ROMEO:")]), 20, top_k=1)
    assert texts(out) == [CharTokenizer(CHARS).decode(ids[0].tolist()) + "\n"]


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
def test_bad_arguments_print_one_error_line_and_no_output(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    write_checkpoint(tmp_path)
    if args == ["--damaged"]:  # bytes overwritten in ckpt.pt can load as NaN, which train.py never saves
        checkpoint = torch.load(tmp_path / "ckpt.pt", weights_only=True)
        checkpoint["model"]["transformer.ln_f.weight"][5] = float("nan")
        torch.save(checkpoint, tmp_path / "ckpt.pt")  # not save_checkpoint, which refuses it
        args = []
    code, out, err = run(capsys, "--out_dir", tmp_path, "--max_new_tokens", 3, *args)
    assert code == 1 and out == ""
    assert err.startswith("error:") and err.count("\n") == 1 and re.search(message, err), err


def test_the_speed_line_follows_the_samples_in_one_file(tmp_path):
    """`python sample.py > out.txt 2>&1`, stdout buffered: the samples first, then the speed line."""
    with open(tmp_path / "out.txt", "w") as out:
        subprocess.run([sys.executable, str(REPO / "sample.py"), f"--out_dir={write_checkpoint(tmp_path)}",
                        "--max_new_tokens=3", "--threads=1"], stdout=out, stderr=subprocess.STDOUT, check=True,
                       env={**os.environ, "PYTHONUNBUFFERED": ""}, timeout=120)
    lines = (tmp_path / "out.txt").read_text().splitlines()
    assert lines[-2] == "---------------" and re.fullmatch(r"9 tokens in [\d.]+ s: .*", lines[-1]), lines


@pytest.mark.slow
def test_gpt2_weights_out_of_reach_are_one_error_line(tmp_path):
    # forced offline: without transformers, or with it but no network (HF_HUB_OFFLINE: no retries)
    proc = subprocess.run([sys.executable, str(REPO / "sample.py"), "--init_from", "gpt2", "--max_new_tokens", "2"],
                          capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          timeout=120)
    if proc.returncode == 0:
        pytest.skip("GPT-2 weights are cached here")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: could not load 'gpt2' weights")


@needs_bpe
def test_samples_from_a_gpt2_bpe_checkpoint(tmp_path, capsys):
    meta = {"tokenizer": "gpt2", "vocab_size": 50257, "tokens": {"train": 10, "val": 1}}
    write_checkpoint(tmp_path, "efficient", meta=meta, vocab_size=50304)
    code, out, err = run(capsys, "--out_dir", tmp_path, "--start", "Hello, world", "--max_new_tokens", 8,
                         "--num_samples", 1, "--dtype", "bfloat16")
    assert code == 0, err
    assert out.startswith("Hello, world") and "8 tokens in" in err and "bfloat16" in err


def test_ids_of_the_models_padded_vocab_are_skipped_in_the_text():
    """GPT-2's model vocab is padded from 50257 to 50304, and an undertrained model samples the
    padding: the text leaves those ids out rather than failing to decode them."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=5)).eval()  # 2 padding ids
    [text], _ = sample.sample(model, CharTokenizer("abc"), [0], num_samples=1, max_new_tokens=60,
                              temperature=5.0, top_k=None)
    assert set(text) <= set("abc") and 0 < len(text) < 61  # the padding ids were sampled and skipped
