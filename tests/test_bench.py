"""The benchmarks run end to end on tiny shapes and print their tables: the rows and columns, the
numbers that follow from the (faked) timings, the files and the exit codes. Nothing is timed."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType
from torch.nn.attention import SDPBackend

from checkpoint import LOG_NAME, SUMMARY_NAME
from conftest import REPO
from model import GPT, GPTConfig
from runtime import machine_name

sys.path.insert(0, str(REPO / "bench"))
import bench_attention_kernels  # noqa: E402
import bench_cpu_load  # noqa: E402
import bench_model  # noqa: E402
import bench_sample  # noqa: E402
import bench_train  # noqa: E402
import profiling  # noqa: E402

CONFIG = "config/train_llama1b_efficient_c4.py"
# the 1B config shrunk (--smoke: 1 layer, d 64, block 32, batch 2, no compile), 3 iterations
TINY_RUN = ["--smoke", "--iters=3", "--warmup_steps=1", "--num_threads=1", CONFIG]
TINY_SHAPE = dict(n_layer=1, n_head=2, n_embd=16, block_size=8)


def markdown_table(out, first_cell):
    """(header cells, rows as {column: cell}) of the last table in out whose header starts so."""
    table = []
    for line in out[out.rindex(f"| {first_cell} |"):].splitlines():
        if not line.startswith("|"):
            break
        table.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return table[0], [dict(zip(table[0], row)) for row in table[2:]]


def number(cell):
    return float(cell.replace(",", "").rstrip("%xM"))


def run_main(monkeypatch, module, *argv):
    monkeypatch.setattr(sys, "argv", [f"{module.__name__}.py", *argv])
    return module.main()


def bench_train_run(tmp_path, capsys, *args):
    code = bench_train.main([*TINY_RUN, f"--work_dir={tmp_path}", *args])
    out = capsys.readouterr().out
    return code, markdown_table(out, "config")[1], out


@pytest.mark.slow
def test_bench_train_rows_are_the_runs_own_figures(tmp_path, capsys):
    code, rows, out = bench_train_run(tmp_path, capsys, "--parallelisms=plain,fsdp",
                                      "--budget_tokens=1e9")
    assert code == 0, out[-3000:]
    assert [(r["config"], r["parallelism"]) for r in rows] == [(CONFIG, "plain"), (CONFIG, "fsdp")]
    for row in rows:
        run = tmp_path / f"train_llama1b_efficient_c4-{row['parallelism']}"
        summary = json.loads((run / SUMMARY_NAME).read_text())
        # with --warmup_steps=1 the bench times the iterations summary.json times: all but the first
        assert number(row["tokens/s"]) == pytest.approx(summary["tokens_per_s"], abs=0.5)
        assert number(row["params"]) == summary["n_params"]
        days = number(row["device-days for 1e+09 tokens"])
        assert days == pytest.approx(1e9 / summary["tokens_per_s"] / 86400, rel=1e-3, abs=0.05)
        assert (row["micro-batch x context"], row["MFU"], row["note"]) == ("2 x 32", "-", "")
        assert summary["iterations"] == 3 and not list(run.glob("ckpt*"))  # save_checkpoints=False


def test_bench_train_reports_a_failed_run_in_its_row_and_exits_1(tmp_path, capsys):
    # a vocabulary below the data's token ids: train.py stops with one error line
    code, rows, out = bench_train_run(tmp_path, capsys, "--parallelisms=plain", "--vocab_size=1000")
    assert code == 1 and [(r["parallelism"], r["tokens/s"]) for r in rows] == [("plain", "-")]
    assert rows[0]["note"].startswith("failed: exit code 1: ") and "vocab_size" in rows[0]["note"]
    assert "  | " in out  # the end of the run's own output


def alive(pid):
    """Whether a process runs: not ended, nor a zombie (Linux's /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(condition, seconds):
    deadline = time.time() + seconds
    while not condition() and time.time() < deadline:
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the processes")
@pytest.mark.parametrize("parallelism, sig", [("fsdp", signal.SIGTERM), ("plain", signal.SIGKILL)])
def test_a_run_never_outlives_the_benchmark(parallelism, sig, tmp_path):
    """A benchmark stopped at a job's time limit must leave no 1B training on the GPU."""
    bench = subprocess.Popen([sys.executable, str(REPO / "bench" / "bench_train.py"), "--smoke",
                              "--iters=100000", "--num_threads=1", f"--parallelisms={parallelism}",
                              f"--work_dir={tmp_path}", str(REPO / CONFIG)], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = tmp_path / f"{Path(CONFIG).stem}-{parallelism}" / LOG_NAME
    trained = '"type": "train"'  # three iterations trained, or the benchmark ended
    wait_for(lambda: bench.poll() is not None
             or log.exists() and log.read_text().count(trained) > 2, 120)
    run = bench_train.children(bench.pid)  # train.py, or torchrun and its worker
    run += [pid for parent in run for pid in bench_train.children(parent)]
    assert len(run) == (2 if parallelism == "fsdp" else 1) and all(map(alive, run)), \
        bench.communicate()[0][-3000:]
    bench.send_signal(sig)
    output = bench.communicate(timeout=60)[0]
    wait_for(lambda: not any(map(alive, run)), 30)
    assert not any(map(alive, run))
    if sig == signal.SIGTERM:
        assert bench.returncode == 130 and "stopped: the run in progress was killed" in output


def test_bench_train_figures_from_a_runs_log(tmp_path):
    records = [dict(type="train", iter=i, ms_per_iter=ms, mfu=mfu) for i, ms, mfu in
               [(1, 5000.0, 0.004), (2, 5000.0, 0.004), (3, 100.0, 0.2), (4, 300.0, 0.2 / 3)]]
    (tmp_path / SUMMARY_NAME).write_text(json.dumps({"tokens_per_iter": 1000}))
    (tmp_path / LOG_NAME).write_text("".join(json.dumps(r) + "\n" for r in records))
    tokens_per_s, mfu, _ = bench_train.measure(tmp_path, warmup_steps=2)  # at the mean step time
    assert tokens_per_s == pytest.approx(1000 / 0.2) and mfu == pytest.approx(0.1)
    # two GPUs at 1,000 tokens/s together: 8.64e7 tokens take 86,400 s on each, two GPU-days
    args = SimpleNamespace(budget_tokens=8.64e7, device="cuda")
    row = dict(config="c.py", parallelism="ddp", shape="4 x 2048", error=None, tokens_per_s=1000.0,
               mfu=0.4567, params=1_234_567, peak_memory=3 * 2**30, wall_s=12.4, world_size=2)
    text = bench_train.table_header(args) + "\n" + bench_train.table_row(row, args.budget_tokens)
    assert [list(r.values()) for r in markdown_table(text, "config")[1]] == [[
        "c.py", "ddp", "1,234,567", "4 x 2048", "1,000", "45.7%", "3.00", "2.0", "12", ""]]


def printed_time_table(out, title):
    """The columns of the time table under `title`, whose total must add up its other rows."""
    table = out[out.index(f"### {title}"):].split("\n\n")[1].splitlines()
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    rows = {row[0]: [float(ms) for ms in row[1:]] for row in cells[2:]}
    shown = [sum(column) for column in zip(*(ms for row, ms in rows.items() if row != "total"))]
    assert rows["total"] == pytest.approx(shown, abs=0.001 * len(rows))
    return cells[0][1:]


# NanoGPT's model.py as bench_model.py meets it (its loss views the targets: contiguous ones)
NANOGPT_LIKE = """
import torch
from types import SimpleNamespace as GPTConfig

class GPT(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config, self.head = config, torch.nn.Embedding(config.vocab_size, config.vocab_size)
    def forward(self, idx, targets):
        logits = self.head(idx)
        return logits, torch.nn.functional.cross_entropy(logits.view(-1, 64), targets.view(-1))
    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        return torch.optim.AdamW(self.parameters(), lr=learning_rate, betas=betas)
"""
STEP_SECONDS = {"nanogpt": 0.012, "standard": 0.010, "efficient": 0.008}  # per sequence


def test_bench_model_beside_nanogpt_skipping_a_batch_out_of_memory(tmp_path, monkeypatch, capsys):
    (tmp_path / "model.py").write_text(NANOGPT_LIKE)
    monkeypatch.setitem(bench_model.SHAPES, "tiny", TINY_SHAPE)
    monkeypatch.setattr(bench_model, "measure_matmul_peak", lambda device, dtype: 1e8)
    clock, make_step = SimpleNamespace(now=0.0), bench_model.make_step
    monkeypatch.setattr(bench_model, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    models, calls, before_batch_2 = [], [], []
    def make_timed_step(model, batch, args):
        if batch == 4:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB\nmore")
        if batch == 2 and not before_batch_2:
            before_batch_2.append(capsys.readouterr().out)  # what a job stopped here keeps
        name = "nanogpt" if type(model).__module__ == "nanogpt_model" else model.config.attention
        models.append((name, model, [p.detach().clone() for p in model.parameters()]))
        step = make_step(model, batch, args)
        def timed_step():
            calls.append(name)
            step()  # forward, backward, clipping and AdamW, for real
            clock.now += STEP_SECONDS[name] * batch
        return timed_step

    monkeypatch.setattr(bench_model, "make_step", make_timed_step)
    run_main(monkeypatch, bench_model, "--shapes=tiny", "--batch_sizes=1,4,2", "--repeats=3",
             "--vocab_size=64", "--optimizer", f"--nanogpt_dir={tmp_path}", "--variants=efficient",
             "--profile")
    out = before_batch_2[0] + capsys.readouterr().out
    assert "# tiny batch 1 efficient: 8.00 ms/step" in before_batch_2[0]
    assert ("# tiny batch 4: out of memory, not measured (CUDA out of memory. Tried to allocate "
            "12.00 GiB)\n") in before_batch_2[0]
    names = ["nanogpt", "standard", "efficient"]  # warm-up, round-robin, then 3 steps profiled
    assert calls == (names * 4 + [name for name in names for _ in range(3)]) * 2
    assert all(any(not torch.equal(a, p) for a, p in zip(old, model.parameters()))
               for _, model, old in models)
    header, rows = markdown_table(out, "model")
    assert header == ["model", "batch", "params", "attn params/layer", "FLOPs/token (fwd+bwd)",
                      "FLOP ratio", "ms/step", "time ratio", "tokens/s", "MFU"]
    assert [(r["model"], r["batch"]) for r in rows] == [
        (name, batch) for batch in "12" for name in ("nanogpt", "standard", "efficient")]
    configs = dict(**TINY_SHAPE, vocab_size=64, dropout=0.0, bias=True)
    standard_flops = GPT(GPTConfig(**configs)).flops_per_token(8)
    for r in rows:  # NanoGPT's model runs standard attention: its row counts standard's figures
        ours = GPT(GPTConfig(**configs, attention=r["model"].replace("nanogpt", "standard")))
        batch, flops, seconds = int(r["batch"]), ours.flops_per_token(8), STEP_SECONDS[r["model"]]
        assert r["params"] == f"{ours.get_num_params(non_embedding=False) / 1e6:.2f}M"
        assert r["attn params/layer"] == f"{ours.get_num_attention_params():,}"
        assert number(r["FLOP ratio"]) == pytest.approx(flops / standard_flops, abs=1e-3)
        assert number(r["ms/step"]) == pytest.approx(1e3 * seconds * batch)
        assert number(r["time ratio"]) == pytest.approx(seconds / STEP_SECONDS["standard"])
        assert number(r["tokens/s"]) == pytest.approx(8 / seconds, abs=0.5)
        assert number(r["MFU"]) == pytest.approx(100 * flops * 8 / seconds / 1e8, abs=0.05)
    assert printed_time_table(out, "where the step's time goes: tiny, batch 2") == names


def test_bench_sample_table_on_a_tiny_model(monkeypatch, capsys):
    tiny = dict(TINY_SHAPE, block_size=32, vocab_size=50304)
    monkeypatch.setitem(bench_sample.SIZES, "tiny", tiny)
    real, paths = bench_sample.tokens_per_second, []
    def tokens_per_second(model, prompt, args, **kwargs):  # compiling would take a minute
        paths.append(kwargs)
        return 1000.0 if kwargs.get("compile") else real(model, prompt, args, **kwargs)
    monkeypatch.setattr(bench_sample, "tokens_per_second", tokens_per_second)
    run_main(monkeypatch, bench_sample, "--sizes=tiny", "--variants", "standard,efficient",
             "standard", "--max_new_tokens=4", "--compile")  # names space- or comma-separated
    assert paths == [{"use_kv_cache": False}, {}, {"compile": True}] * 2
    header, rows = markdown_table(capsys.readouterr().out, "size")
    assert header == ["size", "attention", "params", "tokens/s, no cache", "tokens/s, KV cache",
                      "tokens/s, compiled", "speed-up"]
    for row, attention in zip(rows, ["standard", "efficient"], strict=True):
        params = GPT(GPTConfig(**tiny, attention=attention)).get_num_params() / 1e6
        assert list(row.values())[:3] == ["tiny", attention, f"{params:.1f}M"]
        assert row["tokens/s, compiled"] == "1000.0"
        speed_up = pytest.approx(1000.0 / number(row["tokens/s, no cache"]), rel=0.05)
        assert number(row["speed-up"]) == speed_up


def test_attention_kernels_on_cpu_name_each_rows_kernel(capsys):
    argv = ["--device=cpu", "--seq_len=16", "--batch=2", "--shapes=1x64,4x16", "--repeats=1",
            "--warmup=0"]
    bench_attention_kernels.main(argv)
    out = capsys.readouterr().out
    assert out.startswith(f"# {machine_name('cpu')}; torch {torch.__version__}\n"
                          f"# command: python bench/bench_attention_kernels.py {' '.join(argv)}\n")
    header, rows = markdown_table(out, "heads x d_k")
    by_key = {(r["heads x d_k"], r["backend"]): r for r in rows}
    assert len(by_key) == 2 * 6  # the default, the four backends and model.py's matmuls
    q = torch.randn(2, 1, 16, 64)
    chosen = SDPBackend(torch._fused_sdp_choice(q, q, q, is_causal=True)).name
    assert by_key["1x64", "default"]["ran"] == chosen  # what the profiler saw, the dispatcher's
    base = number(by_key["1x64", "default"]["fwd+bwd ms"])
    for shape in ("1x64", "4x16"):
        for backend in ("FLASH_ATTENTION", "MATH"):  # forced alone, each is what runs
            assert by_key[shape, backend]["ran"] == backend
        assert by_key[shape, "matmuls (model.py)"]["ran"] == "no SDPA"
        for backend in ("default", "FLASH_ATTENTION", "matmuls (model.py)"):  # MATH's attention
            assert float(by_key[shape, backend]["max abs diff vs MATH"]) < 1e-5
            row = by_key[shape, backend]
            assert number(row["vs 1x64 default"]) == pytest.approx(number(row["fwd+bwd ms"]) / base,
                                                                   rel=0.05)
        for backend in ("EFFICIENT_ATTENTION", "CUDNN_ATTENTION"):  # CUDA kernels only
            assert by_key[shape, backend]["note"].startswith("not supported: ")


def test_gpu_profile_rows(monkeypatch, capsys):
    """Inductor's Triton kernels are one row (numbered differently in each model), then a table by
    what each fuses; other kernels keep their names without templates; a record_function range
    over kernels (AdamW's step) is not counted twice."""
    events = [SimpleNamespace(name=name, device_type=DeviceType.CUDA, is_user_annotation=range_,
                              time_range=SimpleNamespace(elapsed_us=lambda: 40.0))
              for name, range_ in [("multi_tensor_apply_kernel", False), ("AdamW.step", True)]]
    assert profiling.time_by_name(events, on_cuda=True) == {"multi_tensor_apply_kernel": 40.0}
    kernel_us = {"triton_poi_fused_add_0": 900.0, "triton_red_fused_sum_1": 600.0,
                 "triton_poi_fused_add_7": 300.0, "void gemm_kernel<float, 128>(Params)": 3000.0}
    monkeypatch.setattr(profiling, "traced_events", lambda fn, device, calls: None)
    monkeypatch.setattr(profiling, "time_by_name", lambda events, on_cuda: kernel_us)
    ms = profiling.ms_by_kernel(None, "cuda", calls=3, units=2)  # ms per unit
    assert profiling.grouped(ms, profiling.kernel_row) == {"Triton kernels (inductor)": 0.3,
                                                           "gemm_kernel": 0.5}
    profiling.print_profile("a step", "step", {"a": ms, "b": {"triton_poi_fused_add_3": 0.1}})
    title = "a step: inductor's Triton kernels by what they fuse"
    assert printed_time_table(capsys.readouterr().out, title) == ["a", "b"]
    name = "std::enable_if<!(false), void>::type at::(anonymous namespace)::k<int, float>(int)"
    assert profiling.short_kernel_name(name) == "at::k"


@pytest.mark.parametrize("module, args, message", [
    (bench_sample, ["--repeats=0"], "--repeats must be at least 1"),
    (bench_sample, ["--variants=standard,stadnard"], "stadnard unknown; choose among "),
    (bench_model, ["--batch_sizes=12,abc"], "--batch_sizes=12,abc: give whole numbers"),
    (bench_attention_kernels, ["--shapes=3x"], "write heads x d_k"),
    (bench_cpu_load, ["--iters=1"], "--iters at least 2"),
    (bench_train, ["--out_dir=x"], "pass train.py settings as --key=value"),
    (bench_train, [], "the default configs are 1B models"),  # on a CPU: add --smoke, or a config
])
def test_bench_arguments_out_of_range_are_one_error_line(module, args, message, monkeypatch,
                                                        capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stopped:
        run_main(monkeypatch, module, *args)
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_bench_cpu_load_table_and_nanogpts_runs(tmp_path, monkeypatch, capsys):
    def given(program, key):  # the last value given wins, in both
        argv = bench_cpu_load.command(program, REPO, 300, tmp_path)[0]
        return [int(arg.split("=")[1]) for arg in argv if arg.startswith(f"--{key}=")][-1]
    # NanoGPT evaluates at each multiple of eval_interval, steps, and stops past max_iters;
    # train.py evaluates at each multiple and at max_iters, and steps to max_iters: the same work
    top, every = given("nanogpt", "max_iters"), given("nanogpt", "eval_interval")
    nanogpt = top + 1, sum(i % every == 0 for i in range(top + 1))
    top, every = given("ours", "max_iters"), given("ours", "eval_interval")
    assert (top, sum(i % every == 0 or i == top for i in range(top + 1))) == nanogpt == (300, 2)
    (tmp_path / "data" / "shakespeare_char").mkdir(parents=True)
    (tmp_path / "data" / "shakespeare_char" / "train.bin").write_bytes(b"")
    monkeypatch.setattr(bench_cpu_load, "REPO", tmp_path)
    seconds = {False: iter([10.0, 30.0, 12.0]), True: iter([30.0, 18.0, 90.0])}
    monkeypatch.setattr(bench_cpu_load, "timed_run",
                        lambda program, folder, iters, loaded, scratch: next(seconds[loaded]))
    bench_cpu_load.main(["--repeats=3"])
    header, rows = markdown_table(capsys.readouterr().out, "program")
    assert header == ["program", "idle (s)", "one core busy (s)", "busy / idle"]
    assert [list(r.values()) for r in rows] == [["this repo", "12.0", "30.0", "2.50"]]  # medians


@pytest.mark.skipif(sys.platform == "win32", reason="a bash script")
def test_gpu_suite_stops_a_stage_past_its_time_and_goes_on(tmp_path):
    fake = tmp_path / "bin" / "python"  # the suite's commands in a blink: one hangs, one fails
    fake.parent.mkdir()
    fake.write_text('#!/bin/bash\ncase "$*" in\n  *is_available*) echo yes ;;\n'
                    '  *bench_sample.py*) exec sleep 120 ;;\n'
                    '  *bench_model.py*) echo "bench_model.py failed"; exit 3 ;;\nesac\n')
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake.parent}:{os.environ['PATH']}", STAGE_TIMEOUT="3")
    suite = [str(REPO / "bench" / "gpu_suite.sh"), f"--log_dir={tmp_path / 'logs'}"]
    result = subprocess.run(["bash", *suite, "sample", "step_eager"], env=env, capture_output=True,
                            text=True, timeout=100)
    assert result.returncode == 1 and "failed: sample step_eager" in result.stderr, result.stderr
    sample, step_eager = ((tmp_path / "logs" / f"{stage}.log").read_text()
                          for stage in ("sample", "step_eager"))
    assert "bench_sample.py --device=cuda --compile" in sample
    assert "stopped after STAGE_TIMEOUT=3 s" in sample and "bench_model.py failed" in step_eager
