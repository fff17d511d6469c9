"""sample.py: sampling from checkpoints of every variant, both tokenizers, and its error messages."""
import collections
import os
import pickle
import re
import runpy
import subprocess
import sys

import pytest
import torch

from conftest import REPO, VARIANTS, needs_bpe, needs_compiler
import sample
from checkpoint import (CheckpointError, load_checkpoint, load_model_and_tokenizer, load_resume_checkpoint,
                        save_checkpoint)
from model import GPT, GPTConfig

CHARS = "\n !',.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
CHAR_META = {"tokenizer": "char", "vocab_size": len(CHARS), "chars": CHARS, "tokens": {"train": 10, "val": 1}}


pytestmark = pytest.mark.usefixtures("one_thread")


def write_checkpoint(folder, attention="standard", meta=CHAR_META, vocab_size=None, config=None, block_size=32):
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=block_size, vocab_size=vocab_size or (meta or CHAR_META)["vocab_size"], n_layer=2, n_head=2,
                          n_embd=16, attention=attention))
    ckpt = {"model_args": dict(vars(model.config)), "model": model.state_dict(), "iter_num": 5,
            "best_val_loss": 1.0, "config": config or {}}
    if meta is not None:
        ckpt["meta"] = meta
    save_checkpoint(ckpt, folder / "ckpt.pt")
    return folder


def run(capsys, *args):
    code = sample.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("attention", VARIANTS)
def test_samples_from_a_char_checkpoint_of_every_variant(tmp_path, capsys, attention):
    write_checkpoint(tmp_path, attention)
    code, out, err = run(capsys, "--out_dir", tmp_path, "--start", "ROMEO:", "--num_samples", 2,
                         "--max_new_tokens", 40, "--seed", 1)
    assert code == 0, err
    samples = out.split("---------------\n")
    assert len(samples) == 3 and samples[2] == "" and all(s.startswith("ROMEO:") for s in samples[:2])
    assert all(len(s) == len("ROMEO:") + 40 + 1 for s in samples[:2])  # 40 characters and print's newline
    assert set("".join(samples[:2])) <= set(CHARS)
    # the speed on stderr: stdout, redirected to a file, holds the samples alone
    assert re.fullmatch(rf"80 tokens in [\d.]+ s: [\d.]+ tokens/s \({attention} attention, char tokenizer, .*\)\n", err)


def test_temperature_and_top_k_reach_the_model(tmp_path, capsys, monkeypatch):
    write_checkpoint(tmp_path)
    seen = []
    real_generate = GPT.generate

    def recording(model, idx, max_new_tokens, **kwargs):
        seen.append((kwargs["temperature"], kwargs["top_k"]))
        return real_generate(model, idx, max_new_tokens, **kwargs)

    monkeypatch.setattr(GPT, "generate", recording)
    code, _, err = run(capsys, "--out_dir", tmp_path, "--num_samples", 2, "--max_new_tokens", 3,
                       "--temperature", 0.3, "--top_k", 7)
    assert code == 0, err
    assert seen == [(0.3, 7), (0.3, 7)]


def test_seed_kv_cache_and_file_prompt(tmp_path, capsys):
    write_checkpoint(tmp_path / "ck", "super", block_size=16)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("First Citizen:\n")
    args = ["--out_dir", tmp_path / "ck" / "ckpt.pt", "--start", f"FILE:{prompt}", "--num_samples", 1,
            "--max_new_tokens", 30, "--seed", 7, "--top_k", 5]
    _, cached, cached_err = run(capsys, *args)
    _, again, _ = run(capsys, *args)
    _, uncached, uncached_err = run(capsys, *args, "--no_kv_cache")
    text = lambda out: out.split("---------------")[0]  # noqa: E731
    assert text(cached).startswith("First Citizen:\n")
    assert text(cached) == text(again) == text(uncached)  # past block_size too: the window slides
    assert "KV cache on" in cached_err and "KV cache off" in uncached_err
    _, other_seed, _ = run(capsys, *args[:-4], "--seed", 8, "--top_k", 5)
    assert text(other_seed) != text(cached)


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


def test_the_speed_line_of_compiled_decoding_says_it_includes_compiling(tmp_path, capsys, monkeypatch):
    """The first sample pays for torch.compile (tens of seconds): a rate read as the compiled path's speed
    would look many times slower than eager decoding."""
    write_checkpoint(tmp_path)
    monkeypatch.setattr(sample, "sample", lambda *args, **kwargs: (["ab", "cd"], 4.0))
    code, out, err = run(capsys, "--out_dir", tmp_path, "--num_samples", 2, "--max_new_tokens", 2, "--compile",
                         "--device", "cpu")
    assert code == 0, err
    assert err.endswith("4 tokens in 4.00 s: 1.0 tokens/s (standard attention, char tokenizer, cpu, float32, "
                        "KV cache on, compiled: the time includes compiling)\n")


def test_meta_from_the_training_data_dir(tmp_path, capsys):
    from tokenizer import write_meta

    write_meta(tmp_path / "data", CHAR_META)
    write_checkpoint(tmp_path, meta=None, config={"data_dir": str(tmp_path / "data")})
    code, out, err = run(capsys, "--out_dir", tmp_path, "--start", "Hi", "--max_new_tokens", 5, "--num_samples", 1)
    assert code == 0, err
    assert out.startswith("Hi")


def write_nanogpt_checkpoint(folder):
    """A checkpoint as NanoGPT's train.py writes one: its seven model_args (no attention variant), the exact
    GELU, compiled keys, a tensor best_val_loss, and config['dataset'] instead of a data_dir or meta."""
    torch.manual_seed(0)
    model_args = dict(n_layer=2, n_head=2, n_embd=16, block_size=32, bias=False, vocab_size=len(CHARS), dropout=0.0)
    model = GPT(GPTConfig(**model_args))  # NanoGPT's GPT: the same modules and names as standard attention here
    state = {f"_orig_mod.{key}": value for key, value in model.state_dict().items()}
    folder.mkdir(parents=True)
    torch.save({"model": state, "optimizer": {}, "model_args": model_args, "iter_num": 5,
                "best_val_loss": torch.tensor(1.5), "config": {"dataset": "shakespeare_char", "batch_size": 12}},
               folder / "ckpt.pt")
    return model


def write_nanogpt_meta(data_dir, meta=None):
    """data_dir/meta.pkl as NanoGPT's data/shakespeare_char/prepare.py writes it."""
    data_dir.mkdir(parents=True)
    meta = meta or {"vocab_size": len(CHARS), "itos": dict(enumerate(CHARS)), "stoi": {c: i for i, c in enumerate(CHARS)}}
    with open(data_dir / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)


def test_a_checkpoint_nanogpt_trained_samples_with_its_meta_pkl(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # NanoGPT's data/<dataset> is relative to where it ran
    reference = write_nanogpt_checkpoint(tmp_path / "out-nanogpt")
    write_nanogpt_meta(tmp_path / "data" / "shakespeare_char")
    model, tokenizer, _ = load_model_and_tokenizer("resume", "out-nanogpt")
    assert model.config.gelu_approximate == "none" and model.config.attention == "standard"  # NanoGPT's GELU
    idx = torch.tensor([tokenizer.encode("ROMEO:")])
    assert torch.equal(model(idx)[0], reference.eval()(idx)[0])
    code, out, err = run(capsys, "--out_dir", "out-nanogpt", "--start", "ROMEO:", "--num_samples", 1,
                         "--max_new_tokens", 20)
    assert code == 0, err
    assert out.startswith("ROMEO:") and set(out.split("---------------")[0]) <= set(CHARS)


def test_a_checkpoint_nanogpt_trained_is_refused_for_resuming_saying_why(tmp_path):
    write_nanogpt_checkpoint(tmp_path / "out-nanogpt")
    checkpoint = load_checkpoint(tmp_path / "out-nanogpt")
    with pytest.raises(CheckpointError, match="it has no 'rng', so it is not a training checkpoint of this repo "
                                              r"\(one NanoGPT wrote samples and scores here, but does not resume\)"):
        load_resume_checkpoint(tmp_path / "out-nanogpt", checkpoint["model_args"])


def test_a_meta_pkl_that_holds_more_than_plain_data_is_refused_unread(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_nanogpt_checkpoint(tmp_path / "out-nanogpt")
    write_nanogpt_meta(tmp_path / "data" / "shakespeare_char",
                       {"vocab_size": len(CHARS), "itos": collections.OrderedDict(enumerate(CHARS))})
    code, out, err = run(capsys, "--out_dir", "out-nanogpt")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "meta.pkl is not NanoGPT's character-level meta.pkl: UnpicklingError: it names collections.OrderedDict" in err


@pytest.mark.parametrize("args, message", [
    (["--start", "caf\u00e9 \u2603"], r"characters not in the vocabulary: '\u00e9', '\u2603'"),
    (["--temperature", "0"], "temperature=0.0 must be a positive number"),
    (["--top_k", "-1"], "top_k=-1 must be at least 1"),
    (["--max_new_tokens", "-1"], "max_new_tokens=-1"),
    (["--num_samples", "0"], "--num_samples=0 must be at least 1"),
    (["--temperature", "-1"], "must be a positive number"),
    (["--start", "FILE:/no/such/prompt.txt"], "cannot read the prompt file"),
    (["--start", ""], "the prompt is empty"),
    (["--compile", "--no_kv_cache"], "compile=True decodes from the KV cache"),
    (["--device", "gpu0"], "not a device torch knows"),
])
def test_bad_arguments_print_one_error_line_and_no_output(tmp_path, capsys, args, message):
    write_checkpoint(tmp_path)
    code, out, err = run(capsys, "--out_dir", tmp_path, "--max_new_tokens", 3, *args)
    assert code == 1 and out == ""
    assert err.startswith("error:") and re.search(message, err), err


@pytest.mark.parametrize("args, compile", [([], False), (["--compile"], True), (["--compile=True"], True),
                                           (["--compile=False"], False)])
def test_compile_is_a_flag_or_nanogpts_true_false(args, compile):
    assert sample.parse_args(args).compile is compile


@pytest.mark.parametrize("value", ["-1", "two"])
def test_threads_takes_zero_or_a_count(value, capsys):
    with pytest.raises(SystemExit):
        sample.parse_args([f"--threads={value}"])
    assert f"'{value}': give 0 (the cores other processes leave free) or a number of threads" in capsys.readouterr().err
    assert sample.parse_args(["--threads=0"]).threads == 0 and sample.parse_args(["--threads=3"]).threads == 3


@pytest.mark.parametrize("value", ["-1", str(2**63), "1.5"])
def test_seed_takes_what_torch_manual_seed_does(value, capsys):
    with pytest.raises(SystemExit):
        sample.parse_args([f"--seed={value}"])
    assert f"'{value}': give a whole number in [0, 2**63)" in capsys.readouterr().err
    assert sample.parse_args([f"--seed={2**63 - 1}"]).seed == 2**63 - 1


def test_compile_refuses_other_words(capsys):
    with pytest.raises(SystemExit):
        sample.parse_args(["--compile=yes"])
    assert "'yes': write True or False" in capsys.readouterr().err


def test_missing_or_unreadable_checkpoint(tmp_path, capsys):
    code, _, err = run(capsys, "--out_dir", tmp_path / "nowhere")
    assert code == 1 and "no checkpoint at" in err
    (tmp_path / "ckpt.pt").write_bytes(b"not a checkpoint")
    code, _, err = run(capsys, "--out_dir", tmp_path)
    assert code == 1 and "cannot read checkpoint" in err
    torch.save({"hello": 1}, tmp_path / "ckpt.pt")
    code, _, err = run(capsys, "--out_dir", tmp_path)
    assert code == 1 and "is not a checkpoint" in err


def test_a_checkpoint_with_non_finite_weights_is_named_damaged(tmp_path, capsys):
    """Bytes overwritten in ckpt.pt can load as NaN, which train.py never saves: say so, sample nothing."""
    checkpoint = torch.load(write_checkpoint(tmp_path) / "ckpt.pt", weights_only=True)
    checkpoint["model"]["transformer.ln_f.weight"][5] = float("nan")
    torch.save(checkpoint, tmp_path / "ckpt.pt")  # not save_checkpoint, which refuses it
    code, out, err = run(capsys, "--out_dir", tmp_path, "--max_new_tokens", 3)
    assert code == 1 and out == ""
    assert err == (f"error: checkpoint {tmp_path}: its weight transformer.ln_f.weight holds NaN or inf values, which train.py "
                   f"never saves, so the file is damaged: use a copy of it, or another checkpoint\n")


def test_a_cpu_device_with_an_index_is_the_cpu(tmp_path, capsys):
    code, out, err = run(capsys, "--out_dir", write_checkpoint(tmp_path), "--max_new_tokens", 3, "--device", "cpu:1")
    assert code == 0 and "char tokenizer, cpu, float32" in err, err


def test_no_tokenizer_metadata_for_a_small_vocabulary(tmp_path, capsys):
    write_checkpoint(tmp_path, meta=None)
    code, _, err = run(capsys, "--out_dir", tmp_path)
    assert code == 1 and "no tokenizer metadata" in err


@pytest.mark.slow
def test_command_line_prints_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "sample.py"), "--out_dir", str(tmp_path / "nowhere")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.startswith("error: no checkpoint") and "Traceback" not in proc.stderr


def test_a_ctrl_c_while_generating_is_one_line_and_status_130(tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(GPT, "generate", interrupted)
    monkeypatch.setattr(sys, "argv", ["sample.py", f"--out_dir={write_checkpoint(tmp_path)}", "--max_new_tokens=3"])
    with pytest.raises(SystemExit) as exit:
        try:
            runpy.run_path(str(REPO / "sample.py"), run_name="__main__")  # the script as the command line runs it
        except KeyboardInterrupt:  # let through, it would stop pytest itself
            pytest.fail("the Ctrl-C ended sample.py with a KeyboardInterrupt traceback")
    assert exit.value.code == 130
    assert capsys.readouterr() == ("", "stopped by Ctrl-C; no sample was printed (they are printed once all are "
                                       "generated)\n")


@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_samples_into_a_closed_pipe_are_quiet(tmp_path, unbuffered):
    """`python sample.py | head -3`: head may exit before the samples are written, which is no error. Its
    stdout buffered, sample.py finds the closed pipe at the end; unbuffered, at its first sample."""
    env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
    child = subprocess.Popen([sys.executable, str(REPO / "sample.py"), f"--out_dir={write_checkpoint(tmp_path)}",
                              "--max_new_tokens=3", "--threads=1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    child.stdout.close()  # before the child has imported torch, so its first write finds no reader
    err = child.stderr.read()
    child.stderr.close()
    assert child.wait(timeout=120) == 141 and err == ""  # no traceback, and no speed line after unwritten samples


def test_the_speed_line_follows_the_samples_in_one_file(tmp_path):
    """`python sample.py > out.txt 2>&1`, stdout buffered: the samples first, then the speed line."""
    with open(tmp_path / "out.txt", "w") as out:
        subprocess.run([sys.executable, str(REPO / "sample.py"), f"--out_dir={write_checkpoint(tmp_path)}",
                        "--max_new_tokens=3", "--threads=1"], stdout=out, stderr=subprocess.STDOUT, check=True,
                       env={**os.environ, "PYTHONUNBUFFERED": ""}, timeout=120)
    lines = (tmp_path / "out.txt").read_text().splitlines()
    assert lines[-2] == "---------------" and re.fullmatch(r"9 tokens in [\d.]+ s: .*", lines[-1]), lines


@pytest.mark.slow
def test_pretrained_unreachable_is_a_clear_error(tmp_path):
    # forced offline: without transformers, or with it but no network (HF_HUB_OFFLINE skips its retries)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(REPO / "sample.py"), "--init_from", "gpt2", "--max_new_tokens", "2"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    if proc.returncode == 0:
        pytest.skip("GPT-2 weights are reachable here")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "error: could not load 'gpt2' weights" in proc.stderr or "error: loading GPT-2 weights needs" in proc.stderr


@needs_bpe
def test_samples_from_a_gpt2_bpe_checkpoint(tmp_path, capsys):
    meta = {"tokenizer": "gpt2", "vocab_size": 50257, "tokens": {"train": 10, "val": 1}}
    write_checkpoint(tmp_path, "efficient", meta=meta, vocab_size=50304)
    code, out, err = run(capsys, "--out_dir", tmp_path, "--start", "Hello, world", "--max_new_tokens", 8,
                         "--num_samples", 1, "--dtype", "bfloat16")
    assert code == 0, err
    assert out.startswith("Hello, world") and "8 tokens in" in err and "bfloat16" in err


def test_ids_of_the_models_padded_vocab_are_skipped_in_the_text():
    """GPT-2's model vocab is padded from 50257 to 50304, and an undertrained model samples the padding:
    the text leaves those ids out rather than failing to decode them."""
    from tokenizer import CharTokenizer

    torch.manual_seed(0)
    tokenizer = CharTokenizer("abc")
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=5)).eval()  # 2 padding ids
    [text], _ = sample.sample(model, tokenizer, [0], num_samples=1, max_new_tokens=60, temperature=5.0, top_k=None)
    assert set(text) <= set("abc") and 0 < len(text) < 61  # the padding ids were sampled and skipped
