"""bench/bench_train.py and bench/bench_attention_kernels.py on CPU, at tiny sizes: the table rows
say what the runs' own summary.json files say, a failed run is reported in its row, and the attention
bench names the kernel torch's dispatcher chooses and compares every backend with MATH; bench_model.py
trains a NanoGPT-like model.py beside the four variants and prints each batch size's rows once they
are measured; a benchmark stopped or killed takes its run with it; gpu_suite.sh's control flow (a
stage past its time, a failing one, an unknown one); and the figures each benchmark prints (medians, ratios,
units, MFU, each cell under its column) from fixed timings fed through its own arithmetic."""
import importlib
import json
import os
import shutil
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
from faults import alive
from launcher import child_pids
from model import ATTENTION_VARIANTS, GPT, GPTConfig
from runtime import machine_name

sys.path.insert(0, str(REPO / "bench"))
import bench_attention_kernels  # noqa: E402
import bench_cpu_load  # noqa: E402
import bench_faults  # noqa: E402
import bench_model  # noqa: E402
import bench_sample  # noqa: E402
import bench_train  # noqa: E402
import profiling  # noqa: E402

CONFIG = "config/train_llama1b_efficient_c4.py"
# the paper's 1B config shrunk (--smoke: 1 layer, d 64, block 32, batch 2, no compile), 3 iterations
TINY_RUN = ["--smoke", "--iters=3", "--warmup_steps=1", "--num_threads=1", CONFIG]


def markdown_table(out, first_header_cell):
    """(the header cells, each row as {column: cell}) of the markdown table whose header starts with
    first_header_cell."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header_cell} |"))
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    header, rows = table[0], table[2:]
    return header, [dict(zip(header, row)) for row in rows]


def bench_train_run(tmp_path, capsys, *args):
    """(exit code, the final table's rows as lists of cells, the output) of bench_train.py, run in-process
    (train.py runs in its own processes, as always)."""
    code = bench_train.main([*TINY_RUN, f"--work_dir={tmp_path}", *args])
    output = capsys.readouterr().out
    _, rows = markdown_table(output[output.rindex("| config |"):], "config")
    return code, [list(row.values()) for row in rows], output


def number(cell):
    return float(cell.replace(",", ""))


@pytest.mark.slow
def test_bench_train_rows_match_each_runs_summary(tmp_path, capsys):
    code, rows, output = bench_train_run(tmp_path, capsys, "--parallelisms=plain,fsdp", "--budget_tokens=1e9")
    assert code == 0, output[-3000:]
    assert [row[:2] for row in rows] == [[CONFIG, "plain"], [CONFIG, "fsdp"]]
    for (_, parallelism, params, shape, tokens_per_s, mfu, _, days, _, note) in rows:
        summary = json.loads((tmp_path / f"train_llama1b_efficient_c4-{parallelism}" / "summary.json").read_text())
        # with --warmup_steps=1 the bench times the iterations summary.json times: all but the first
        assert number(tokens_per_s) == pytest.approx(summary["tokens_per_s"], abs=0.5)
        assert number(params) == summary["n_params"] and shape == "2 x 32" and note == ""
        assert number(days) == pytest.approx(1e9 / summary["tokens_per_s"] / 86400, rel=1e-3, abs=0.05)
        assert mfu == "-"  # no peak FLOP/s on a CPU, so train.py logs no MFU
        assert summary["world_size"] == 1 and summary["iterations"] == 3
        # save_checkpoints=False: no ckpt.pt, nor FSDP's shards (a 1B model's are ~15 GB)
        assert not list((tmp_path / f"train_llama1b_efficient_c4-{parallelism}").glob("ckpt*"))


def test_bench_train_reports_a_failed_run_and_exits_1(tmp_path, capsys):
    # a vocabulary smaller than the data's token ids: train.py stops with one error line, which lands in the row
    code, rows, output = bench_train_run(tmp_path, capsys, "--parallelisms=plain", "--vocab_size=1000")
    assert code == 1, output[-3000:]
    (row,) = rows
    assert row[1] == "plain" and row[4] == "-"
    assert row[-1].startswith("failed: exit code 1: error: vocab_size=1000 is too small for the data")
    assert "  | error: vocab_size=1000 is too small" in output  # the end of the run's own output too


def start_long_run(tmp_path, parallelism):
    """bench_train.py in its own process with one long run, once that run trains: (the benchmark, the
    pids of the run's processes: train.py, or the launcher and its training process)."""
    bench = subprocess.Popen([sys.executable, str(REPO / "bench" / "bench_train.py"), "--smoke", "--iters=100000",
                              "--num_threads=1", f"--parallelisms={parallelism}", f"--work_dir={tmp_path}",
                              str(REPO / CONFIG)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    log = tmp_path / f"{Path(CONFIG).stem}-{parallelism}.log"
    deadline = time.time() + 120
    while bench.poll() is None and time.time() < deadline and not (log.exists() and "iter 3:" in log.read_text()):
        time.sleep(0.2)
    run = child_pids(bench.pid)
    return bench, run + [pid for parent in run for pid in child_pids(parent)]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the run's processes")
@pytest.mark.parametrize("parallelism, sig", [("fsdp", signal.SIGTERM), ("plain", signal.SIGKILL)])
def test_a_run_never_outlives_the_benchmark(parallelism, sig, tmp_path):
    """A benchmark stopped by a job's time limit must not leave a 1B training on the GPU for the next one."""
    bench, run = start_long_run(tmp_path, parallelism)
    assert len(run) == (2 if parallelism == "fsdp" else 1) and all(map(alive, run)), bench.communicate()[0][-3000:]
    bench.send_signal(sig)
    output = bench.communicate(timeout=60)[0]
    deadline = time.time() + 30
    while any(map(alive, run)) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(map(alive, run))
    if sig == signal.SIGTERM:
        assert bench.returncode == 130 and "stopped: the run in progress was killed" in output
        assert not list(tmp_path.rglob("ckpt*"))  # killed, not stopped: no checkpoint to save


def test_bench_train_refuses_the_1b_defaults_on_a_cpu_unless_shrunk(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stopped:
        bench_train.parse_args([])  # two 1B models trained on the CPU, each until --timeout
    assert stopped.value.code == 2 and "add --smoke" in capsys.readouterr().err
    assert bench_train.parse_args(["--smoke"]).configs == bench_train.DEFAULT_CONFIGS
    assert bench_train.parse_args([CONFIG]).configs == [CONFIG]  # named: the user's choice


def test_last_error_line_skips_the_launchers_summary(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("iter 1: loss 10.8\n[rank0]: RuntimeError: NCCL error\n"
                   "[rank0]: During handling of the above exception, another exception occurred:\n"
                   "[rank0]: Traceback (most recent call last):\n"
                   "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
                   "error: a training process failed (rank 0 exit code 1); its messages are above\n")
    assert bench_train.last_error_line(log) == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    log.write_text("something went wrong\n\n")
    assert bench_train.last_error_line(log) == "something went wrong"


def test_attention_kernels_on_cpu(capsys):
    bench_attention_kernels.main(["--device=cpu", "--seq_len=16", "--batch=2", "--shapes=1x64,4x16",
                                  "--repeats=1", "--warmup=0"])
    rows = [line.strip("|").split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| 1x64")
            or line.startswith("| 4x16")]
    by_key = {(r[0].strip(), r[1].strip()): [c.strip() for c in r] for r in rows}
    assert len(by_key) == 2 * 6  # default, the four backends and model.py's matmuls, per shape
    q = torch.randn(2, 1, 16, 64)
    chosen = SDPBackend(torch._fused_sdp_choice(q, q, q, is_causal=True)).name
    assert by_key["1x64", "default"][2] == chosen  # what the profiler saw is what the dispatcher picks
    assert by_key["1x64", "default"][4] == "1.00"  # the first shape's default is the ratios' base
    for shape in ("1x64", "4x16"):
        for backend in ("FLASH_ATTENTION", "MATH"):  # forced alone, each is what the profiler sees run
            assert by_key[shape, backend][2] == backend
        for backend in ("default", "FLASH_ATTENTION", "matmuls (model.py)"):  # the same attention as MATH
            assert float(by_key[shape, backend][6]) < 1e-5
        assert by_key[shape, "matmuls (model.py)"][2] == "no SDPA"
        for backend in ("EFFICIENT_ATTENTION", "CUDNN_ATTENTION"):  # CUDA kernels only
            assert by_key[shape, backend][-1].startswith("not supported: ")


def test_attention_kernels_names_the_machine_it_measured_on_not_a_gpu_beside_it(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine, timing --device=cpu
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a GPU the run never used")
    argv = ["--device=cpu", "--seq_len=8", "--batch=1", "--shapes=1x16", "--repeats=1", "--warmup=0"]
    bench_attention_kernels.main(argv)
    first, command = capsys.readouterr().out.splitlines()[:2]
    assert first == f"# {machine_name('cpu')}; torch {torch.__version__}"
    assert command == "# command: python bench/bench_attention_kernels.py " + " ".join(argv)


# NanoGPT's model.py as bench_model.py meets it: its GPTConfig fields, GPT(config), configure_optimizers,
# and a loss that views the targets (so they must be contiguous, as train.py's batches are)
NANOGPT_LIKE = """
from dataclasses import dataclass
import torch
from torch import nn
from torch.nn import functional as F

@dataclass
class GPTConfig:
    block_size: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float
    bias: bool

class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size)

    def forward(self, idx, targets=None):
        logits = self.lm_head(self.wte(idx))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        return torch.optim.AdamW(self.parameters(), lr=learning_rate, betas=betas, weight_decay=weight_decay)
"""


def test_bench_model_steps_nanogpt_and_every_variant(tmp_path):
    (tmp_path / "model.py").write_text(NANOGPT_LIKE)
    args = SimpleNamespace(device="cpu", dtype="float32", compile=False, optimizer=True, vocab_size=64,
                           variants=["standard", "optimized", "efficient", "super", "temperature"])
    shape = dict(n_layer=1, n_head=2, n_embd=16, block_size=8)
    models = bench_model.build_models(shape, args, bench_model.load_nanogpt(tmp_path))
    assert list(models) == ["nanogpt", "standard", "optimized", "efficient", "super", "temperature"]
    args.variants = ["efficient"]  # standard, the ratios' base, comes along
    assert list(bench_model.build_models(shape, args, None)) == ["standard", "efficient"]
    for name, model in models.items():
        before = [p.detach().clone() for p in model.parameters()]
        bench_model.make_step(model, 2, args)()  # forward, backward, clip, AdamW
        assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters())), name


@pytest.mark.parametrize("script, args, message", [
    ("bench_sample.py", ["--repeats=0"], "--repeats must be at least 1"),
    ("bench_sample.py", ["--max_new_tokens=-1"], "--max_new_tokens, --prompt_tokens and --repeats must be at least 1"),
    ("bench_sample.py", ["--threads=-1"], "--threads at least 0"),
    ("bench_model.py", ["--batch_sizes=12,abc"], "--batch_sizes=12,abc: give comma-separated whole numbers"),
    ("bench_model.py", ["--batch_sizes=0"], "--batch_sizes, --repeats and --vocab_size must be at least 1"),
    ("bench_model.py", ["--warmup=-1"], "--warmup at least 0"),
    ("bench_prepare.py", ["--repeats=0"], "--megabytes must be positive, and --num_proc and --repeats at least 1"),
    ("bench_prepare.py", ["--num_proc", "0"], "--megabytes must be positive, and --num_proc and --repeats at least 1"),
    ("bench_prepare.py", ["--corpus=shakespeare", "--text=no/such.txt"], "--text no/such.txt: no such file"),
    ("bench_prepare.py", ["--text=no/such.txt"], "--text no/such.txt: no such file"),  # not the stdlib instead
    ("bench_cpu_load.py", ["--iters=5"], "--iters must be at least 101"),
    ("bench_train.py", ["--timeout=0"], "--timeout must be at least 1 second"),
    ("bench_train.py", ["--budget_tokens=0"], "--budget_tokens positive"),
    ("bench_faults.py", ["--kills=-1"], "--kills, --sharded_kills, --signals and --nans must be at least 0"),
])
def test_bench_arguments_out_of_range_are_one_error_line(script, args, message, monkeypatch, capsys):
    """argparse's usage and one error line, exit code 2, before any work (in this process: each script
    as its own process would spend its seconds importing torch)."""
    monkeypatch.setattr(sys, "argv", [script, *args])
    with pytest.raises(SystemExit) as stopped:
        importlib.import_module(Path(script).stem).main()
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_bench_model_prints_each_batch_size_before_the_next_starts(monkeypatch, capsys):
    """A job stopped at its time limit keeps the batch sizes already measured."""
    monkeypatch.setitem(bench_model.SHAPES, "tiny", dict(n_layer=1, n_head=2, n_embd=16, block_size=8))
    monkeypatch.setattr(bench_model, "measure_matmul_peak", lambda device, dtype: 1e11)
    measure, batches = bench_model.bench, []

    def bench_noting_the_output_so_far(shape, batch, *rest):
        batches.append((batch, capsys.readouterr().out))
        return measure(shape, batch, *rest)

    monkeypatch.setattr(bench_model, "bench", bench_noting_the_output_so_far)
    monkeypatch.setattr(sys, "argv", ["bench_model.py", "--shapes=tiny", "--batch_sizes=1,2", "--repeats=1",
                                      "--vocab_size=64"])
    bench_model.main()
    assert [batch for batch, _ in batches] == [1, 2]
    printed_before_batch_2 = batches[1][1]
    for attention in ATTENTION_VARIANTS:
        assert f"# tiny batch 1 {attention}: " in printed_before_batch_2
    assert "# tiny batch 2 standard: " in capsys.readouterr().out


def test_bench_model_reports_a_batch_size_that_runs_out_of_memory_and_measures_the_others(monkeypatch, capsys):
    monkeypatch.setitem(bench_model.SHAPES, "tiny", dict(n_layer=1, n_head=2, n_embd=16, block_size=8))
    monkeypatch.setattr(bench_model, "measure_matmul_peak", lambda device, dtype: 1e11)
    make_step = bench_model.make_step

    def make_step_that_fits_2(model, batch, args):
        if batch <= 2:
            return make_step(model, batch, args)

        def step():
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB\nmore detail")
        return step

    monkeypatch.setattr(bench_model, "make_step", make_step_that_fits_2)
    monkeypatch.setattr(sys, "argv", ["bench_model.py", "--shapes=tiny", "--batch_sizes=1,4,2", "--repeats=1",
                                      "--vocab_size=64", "--variants", "standard", "efficient"])
    bench_model.main()
    out = capsys.readouterr().out
    assert "# tiny batch 4: out of memory, not measured (CUDA out of memory. Tried to allocate 12.00 GiB)\n" in out
    table = out[out.index("### tiny"):]
    measured = [line.split("|")[1:3] for line in table.splitlines() if line.startswith("| standard")
                or line.startswith("| efficient")]
    assert [(name.strip(), int(batch)) for name, batch in measured] == [
        ("standard", 1), ("efficient", 1), ("standard", 2), ("efficient", 2)]


def record_time_tables(monkeypatch):
    """The {column: {row: ms}} of every time table the benchmarks print, as they print them."""
    tables, print_table = [], profiling.print_time_table

    def recording(title, unit, columns, top=12):
        tables.append(columns)
        print_table(title, unit, columns, top)

    monkeypatch.setattr(profiling, "print_time_table", recording)
    return tables


def printed_time_table(out, title):
    """The column names of the table under `title` in out; its total row must add up its other rows."""
    table = out[out.index(f"### {title}"):].split("\n\n")[1].splitlines()
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    rows = {row[0]: [float(ms) for ms in row[1:]] for row in cells[2:]}
    shown = [sum(column) for column in zip(*(ms for row, ms in rows.items() if row != "total"))]
    assert rows["total"] == pytest.approx(shown, abs=0.001 * len(rows))
    return cells[0][1:]


def test_bench_model_profile_puts_each_models_operators_side_by_side(monkeypatch, capsys):
    monkeypatch.setitem(bench_model.SHAPES, "tiny", dict(n_layer=1, n_head=2, n_embd=16, block_size=8))
    monkeypatch.setattr(bench_model, "measure_matmul_peak", lambda device, dtype: 1e11)
    monkeypatch.setattr(sys, "argv", ["bench_model.py", "--shapes=tiny", "--batch_sizes=2", "--repeats=1",
                                      "--vocab_size=64", "--optimizer", "--profile"])
    tables = record_time_tables(monkeypatch)
    bench_model.main()
    columns = printed_time_table(capsys.readouterr().out, "where the step's time goes: tiny, batch 2")
    assert columns == list(ATTENTION_VARIANTS) == list(tables[0])
    assert all(ms["aten::_fused_adamw_"] > 0 for ms in tables[0].values())  # each model's optimizer step


def test_bench_sample_profile_puts_each_variants_operators_side_by_side(monkeypatch, capsys):
    monkeypatch.setitem(bench_sample.SIZES, "tiny", dict(n_layer=1, n_head=2, n_embd=16, block_size=32,
                                                         vocab_size=50304))
    monkeypatch.setattr(sys, "argv", ["bench_sample.py", "--sizes", "tiny", "--max_new_tokens=4", "--profile"])
    tables = record_time_tables(monkeypatch)
    bench_sample.main()
    columns = printed_time_table(capsys.readouterr().out, "where a token's time goes, KV cache: tiny")
    assert columns == list(ATTENTION_VARIANTS) == list(tables[0])
    assert all(ms["aten::exponential_"] > 0 for ms in tables[0].values())  # each variant's draw of a token


def test_profile_rows_group_inductors_kernels(monkeypatch, capsys):
    """Inductor's Triton kernels are one row (their numbers differ from model to model), then a table of
    their own by what each fuses; other GPU kernels keep their own names, without template arguments;
    times are ms per unit of work."""
    kernel_us = {"triton_poi_fused_add_0": 900.0, "triton_red_fused_sum_1": 600.0, "triton_poi_fused_add_7": 300.0,
                 "void gemm_kernel<float, 128>(Params)": 3000.0}
    monkeypatch.setattr(profiling, "traced_events", lambda fn, device, calls: None)
    monkeypatch.setattr(profiling, "time_by_name", lambda events, on_cuda: kernel_us)
    ms = profiling.ms_by_kernel(None, "cuda", calls=3, units=2)
    assert profiling.grouped(ms, profiling.kernel_row) == {"Triton kernels (inductor)": 0.3, "gemm_kernel": 0.5}
    tables = record_time_tables(monkeypatch)
    profiling.print_profile("a step", "step", {"a": ms, "b": {"triton_poi_fused_add_3": 0.1}})
    assert tables[1] == {"a": {"triton_poi_fused_add": 0.2, "triton_red_fused_sum": 0.1},
                         "b": {"triton_poi_fused_add": 0.1}}
    out = capsys.readouterr().out
    assert printed_time_table(out, "a step: inductor's Triton kernels by what they fuse") == ["a", "b"]


def test_gpu_times_count_kernels_not_the_ranges_around_them():
    """A record_function range such as "Optimizer.step#AdamW.step" shows on the GPU's timeline as an
    event over the kernels it launched; counting it too would count those kernels twice."""
    def event(name, us, device, annotation=False):
        return SimpleNamespace(name=name, device_type=device, is_user_annotation=annotation, self_cpu_time_total=us,
                               time_range=SimpleNamespace(elapsed_us=lambda: us))
    events = [event("multi_tensor_apply_kernel", 40.0, DeviceType.CUDA),
              event("Optimizer.step#AdamW.step", 45.0, DeviceType.CUDA, annotation=True),
              event("aten::_fused_adamw_", 7.0, DeviceType.CPU)]
    assert profiling.time_by_name(events, on_cuda=True) == {"multi_tensor_apply_kernel": 40.0}
    assert profiling.time_by_name(events, on_cuda=False) == {"aten::_fused_adamw_": 7.0}


@pytest.mark.parametrize("name, short", [
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*, float const*)",
     "at::native::cunn_SoftMaxForward"),
    ("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, __nv_bfloat16, false>(internal::gemvx::Params)",
     "internal::gemvx::kernel"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int)",
     "at::native::vectorized_elementwise_kernel"),
    ("Memcpy DtoD (Device -> Device)", "Memcpy DtoD"),
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_bias_TNT", "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_bias_TNT"),
])
def test_kernel_names_lose_return_types_templates_and_parameters(name, short):
    """Kernels that differ only in their template arguments are one row, named by the kernel itself."""
    assert profiling.short_kernel_name(name) == short


FAKE_PYTHON = """#!/bin/bash
# what the suite's commands would do on a GPU, in a blink: one stage hangs, one fails
case "$*" in
  *is_available*) echo yes ;;
  *bench_sample.py*) exec sleep 120 ;;
  *bench_model.py*) echo "bench_model.py failed"; exit 3 ;;
  *) echo "python $*" ;;
esac
"""


def fake_python_env(tmp_path, **variables):
    """The environment of a suite whose `python` is FAKE_PYTHON."""
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    return dict(os.environ, PATH=f"{fake.parent}:{os.environ['PATH']}", **variables)


@pytest.mark.skipif(sys.platform == "win32", reason="a bash script")
def test_gpu_suite_stops_a_stage_past_its_time_and_goes_on(tmp_path):
    """A hung stage must not take a job's whole time: it is stopped, the next stage runs, and the suite
    names both that failed."""
    env = fake_python_env(tmp_path, STAGE_TIMEOUT="3")
    # the fake sample stage never ends: only STAGE_TIMEOUT lets the suite finish inside this timeout
    result = subprocess.run(["bash", str(REPO / "bench" / "gpu_suite.sh"), f"--log_dir={tmp_path / 'logs'}",
                             "sample", "step_eager"], env=env, capture_output=True, text=True, timeout=100)
    assert result.returncode == 1 and "failed: sample step_eager" in result.stderr, result.stdout + result.stderr
    sample, step_eager = ((tmp_path / "logs" / f"{stage}.log").read_text() for stage in ("sample", "step_eager"))
    assert "bench_sample.py --device=cuda --compile" in sample and "stopped after STAGE_TIMEOUT=3 s" in sample
    assert "bench_model.py failed" in step_eager


@pytest.mark.skipif(sys.platform == "win32", reason="a bash script")
@pytest.mark.parametrize("own_checkout", [False, True])
def test_gpu_suite_names_nanogpts_commit_only_from_its_own_checkout(tmp_path, own_checkout):
    """NanoGPT unpacked from an archive inside another repository has no commit of its own to name:
    git, asked there, would answer with the outer repository's."""
    def git(folder, *args):
        return subprocess.run(["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t",
                               "-c", "commit.gpgsign=false", *args],
                              check=True, capture_output=True, text=True).stdout.strip()

    outer, nanogpt = tmp_path / "outer", tmp_path / "outer" / "nanoGPT"
    (nanogpt / "data" / "shakespeare_char").mkdir(parents=True)
    for name in ("train.py", "data/shakespeare_char/prepare.py"):
        (nanogpt / name).write_text("")
    for folder in ([outer, nanogpt] if own_checkout else [outer]):
        git(folder, "init", "-q")
        git(folder, "commit", "-q", "--allow-empty", "-m", "x")
    shakespeare = tmp_path / "input.txt"
    shakespeare.write_text("To be")
    env = fake_python_env(tmp_path, NANOGPT_DIR=str(nanogpt), SHAKESPEARE_TXT=str(shakespeare))
    result = subprocess.run(["bash", str(REPO / "bench" / "gpu_suite.sh"), f"--log_dir={tmp_path / 'logs'}",
                             "nanogpt_shakespeare"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = git(nanogpt, "rev-parse", "--short", "HEAD") if own_checkout else "(not a git checkout)"
    assert f"NanoGPT at {expected}\n" in result.stdout


@pytest.mark.skipif(sys.platform == "win32", reason="a bash script")
def test_gpu_suite_removes_the_python_it_made_where_only_python3_is(tmp_path):
    only_python3 = tmp_path / "bin"
    only_python3.mkdir()
    (only_python3 / "python3").symlink_to(sys.executable)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, PATH=f"{only_python3}:/usr/bin:/bin", TMPDIR=str(tmp))
    if shutil.which("python", path=env["PATH"]):
        pytest.skip("a `python` on /usr/bin or /bin: the suite makes none")
    result = subprocess.run(["bash", str(REPO / "bench" / "gpu_suite.sh"), f"--log_dir={tmp_path / 'logs'}", "bogus"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "unknown stage 'bogus'" in result.stderr
    assert not list(tmp.iterdir())  # the folder of its `python` wrapper


def test_gpu_suite_refuses_an_unknown_stage_before_running_any(tmp_path):
    result = subprocess.run(["bash", str(REPO / "bench" / "gpu_suite.sh"), f"--log_dir={tmp_path}", "tests", "steps"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "unknown stage 'steps'" in result.stderr and not list(tmp_path.iterdir())


# -----------------------------------------------------------------------------
# the published figures from fixed timings: a clock that moves only when a step, a generation or a
# run says so, and rows made up by hand


class FakeClock:
    """time.perf_counter for a benchmark module: it reads `now`, which the faked work moves on."""
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def test_bench_model_reports_the_median_of_the_timed_steps_after_the_warmup(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(bench_model, "time", clock)
    seconds = {"a": iter([50.0, 3.0, 1.0, 2.0]), "b": iter([60.0, 8.0, 4.0, 6.0])}  # the first: the warm-up
    calls = []

    def step_of(name):
        def step():
            calls.append(name)
            clock.now += next(seconds[name])
        return step

    args = SimpleNamespace(device="cpu", warmup=1, repeats=3)
    assert bench_model.time_round_robin({name: step_of(name) for name in seconds}, args) == {"a": 2.0, "b": 6.0}
    assert calls == ["a", "b"] + ["a", "b"] * 3  # the warm-up, then one step of each in turn


def test_bench_model_median_of_an_even_number_of_steps_is_the_mean_of_the_middle_two(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(bench_model, "time", clock)
    seconds = iter([4.0, 1.0, 2.0])  # --repeats=4 --warmup=0 (as --repeats=30 on a GPU): the middle two are 2 and 4

    def step():
        clock.now += next(seconds, 9.0)
    assert bench_model.time_round_robin({"a": step}, SimpleNamespace(device="cpu", warmup=0, repeats=4)) == {"a": 3.0}


def test_bench_model_rows_turn_a_step_time_into_ms_tokens_per_s_and_mfu(tmp_path, monkeypatch):
    (tmp_path / "model.py").write_text(NANOGPT_LIKE)
    monkeypatch.setattr(bench_model, "time_round_robin", lambda steps, args: {name: 0.25 for name in steps})
    args = SimpleNamespace(device="cpu", dtype="float32", compile=False, optimizer=False, vocab_size=64, profile=False,
                           variants=list(ATTENTION_VARIANTS))
    shape = dict(n_layer=1, n_head=2, n_embd=16, block_size=8)
    rows, profiles = bench_model.bench(shape, 3, args, bench_model.load_nanogpt(tmp_path), peak=1e9)
    assert profiles is None and [r["name"] for r in rows] == ["nanogpt", *ATTENTION_VARIANTS]
    by_name = {r["name"]: r for r in rows}
    for attention in ATTENTION_VARIANTS:
        ours = GPT(GPTConfig(**shape, vocab_size=64, dropout=0.0, bias=True, attention=attention))
        flops = ours.flops_per_token(8)  # forward and backward
        expected = dict(name=attention, batch=3, params=ours.get_num_params(non_embedding=False),
                        attention_params=ours.get_num_attention_params(), flops=flops, ms=250.0,
                        tokens_per_s=3 * 8 / 0.25, mfu=flops * 3 * 8 / 0.25 / 1e9)
        assert by_name[attention] == pytest.approx(expected), attention
    assert by_name["efficient"]["flops"] < by_name["standard"]["flops"]
    # NanoGPT's model runs standard attention: its row counts standard's parameters and FLOPs
    assert by_name["nanogpt"] == pytest.approx(dict(by_name["standard"], name="nanogpt"))


def test_bench_model_table_compares_each_model_with_standard_at_its_own_batch(capsys):
    def row(name, batch, flops, ms):
        return dict(name=name, batch=batch, params=2.5e6, attention_params=1000, flops=flops, ms=ms,
                    tokens_per_s=1000.0 * batch / ms, mfu=0.123)
    bench_model.print_table("t", [row("nanogpt", 1, 4e6, 12.0), row("standard", 1, 4e6, 10.0),
                                  row("efficient", 1, 3e6, 8.0), row("nanogpt", 2, 4e6, 30.0),
                                  row("standard", 2, 4e6, 20.0), row("efficient", 2, 3e6, 15.0)])
    header, rows = markdown_table(capsys.readouterr().out, "model")
    assert header == ["model", "batch", "params", "attn params/layer", "FLOPs/token (fwd+bwd)", "FLOP ratio",
                      "ms/step", "time ratio", "tokens/s", "MFU"]
    table = {(r["model"], r["batch"]): r for r in rows}
    assert {key: (r["ms/step"], r["time ratio"], r["FLOP ratio"]) for key, r in table.items()} == {
        ("nanogpt", "1"): ("12.00", "1.200", "1.000"), ("standard", "1"): ("10.00", "1.000", "1.000"),
        ("efficient", "1"): ("8.00", "0.800", "0.750"), ("nanogpt", "2"): ("30.00", "1.500", "1.000"),
        ("standard", "2"): ("20.00", "1.000", "1.000"), ("efficient", "2"): ("15.00", "0.750", "0.750")}
    assert table["efficient", "2"]["tokens/s"] == "133" and table["efficient", "2"]["MFU"] == "12.3%"
    assert table["efficient", "2"]["params"] == "2.50M" and table["efficient", "2"]["FLOPs/token (fwd+bwd)"] == "3.0M"


@pytest.mark.parametrize("argv, warmup", [([], 1), (["--compile"], 3), (["--compile", "--warmup=0"], 0)])
def test_bench_model_warmup_default_covers_compilation(monkeypatch, argv, warmup):
    monkeypatch.setattr(sys, "argv", ["bench_model.py", *argv])
    assert bench_model.parse_args().warmup == warmup


def test_bench_model_first_line_names_the_peak_in_tflops_and_the_timing(capsys):
    args = SimpleNamespace(device="cpu", dtype="float32", compile=False, optimizer=True, repeats=7, warmup=2)
    bench_model.describe_machine(args, 2.5e12, "a matmul measured here")
    out = capsys.readouterr().out
    assert "step = forward+backward+clip+AdamW; median of 7 after 2 warm-up" in out
    assert out.rstrip().endswith("MFU against 2.5 TFLOP/s (a matmul measured here)")


def test_bench_model_matmul_peak_is_the_fastest_matmul_counting_a_multiply_add_as_two_flops(monkeypatch):
    # five timed matmuls of 3, 2, 0.5, 2 and 2.5 s (a machine that others share): the ceiling is the 0.5 s one
    clock = iter([0.0, 3.0, 10.0, 12.0, 20.0, 20.5, 30.0, 32.0, 40.0, 42.5])
    monkeypatch.setattr(bench_model, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    assert bench_model.measure_matmul_peak("cpu", "float32", n=8, repeats=5) == 2 * 8**3 / 0.5


class FakeGenerator:
    """A model whose generate takes the next of `seconds` on the clock, noting its arguments."""
    def __init__(self, clock, seconds):
        self.clock, self.seconds, self.calls = clock, iter(seconds), []

    def generate(self, prompt, max_new_tokens, **kwargs):
        self.calls.append((max_new_tokens, kwargs))
        self.clock.now += next(self.seconds)


def test_bench_sample_counts_new_tokens_over_the_best_timed_run_after_one_untimed(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(bench_sample, "time", clock)
    model = FakeGenerator(clock, [1.0, 4.0, 5.0, 6.0])  # the first run (which compiles) is left out
    args = SimpleNamespace(device="cpu", dtype="float32", max_new_tokens=8, prompt_tokens=4, repeats=3)
    assert bench_sample.tokens_per_second(model, None, args, compile=True) == 8 / 4.0
    assert model.calls == [(8, {"compile": True})] * 4


def test_bench_sample_times_each_column_with_its_own_decoding(monkeypatch):
    monkeypatch.setitem(bench_sample.SIZES, "tiny", dict(n_layer=1, n_head=2, n_embd=16, block_size=32,
                                                         vocab_size=50304))
    monkeypatch.setattr(bench_sample, "tokens_per_second", lambda model, prompt, args, **generate_args: generate_args)
    args = SimpleNamespace(device="cpu", dtype="float32", prompt_tokens=4, compile=True, profile=False)
    _, speeds, _ = bench_sample.bench_variant("tiny", "standard", args)
    assert speeds == {"no cache": {"use_kv_cache": False}, "KV cache": {}, "compiled": {"compile": True}}


def test_bench_sample_profile_is_per_token_of_the_traced_generation(monkeypatch):
    monkeypatch.setitem(bench_sample.SIZES, "tiny", dict(n_layer=1, n_head=2, n_embd=16, block_size=64,
                                                         vocab_size=50304))
    monkeypatch.setattr(bench_sample, "tokens_per_second", lambda model, prompt, args, **generate_args: 1.0)
    monkeypatch.setattr(bench_sample, "ms_by_kernel", lambda fn, device, calls=1, units=1: (fn().size(1), units))
    args = SimpleNamespace(device="cpu", dtype="float32", prompt_tokens=4, compile=False, profile=True,
                           max_new_tokens=40)
    _, _, (length, units) = bench_sample.bench_variant("tiny", "standard", args)
    assert length == 4 + units == 4 + bench_sample.PROFILED_TOKENS


@pytest.mark.parametrize("argv, variants", [
    ([], list(ATTENTION_VARIANTS)),
    (["--variants", "super", "standard"], ["super", "standard"]),
    (["--variants=efficient,super"], ["efficient", "super"]),  # as compare.py takes them
    (["--variants", "efficient,super", "efficient", "standard"], ["efficient", "super", "standard"]),
])
def test_bench_variants_are_taken_space_or_comma_separated(monkeypatch, argv, variants):
    monkeypatch.setattr(sys, "argv", ["bench_sample.py", *argv])
    assert bench_sample.parse_args().variants == variants


@pytest.mark.parametrize("argv, wrong", [(["--variants=standard,stadnard"], "stadnard unknown"),
                                         (["--sizes", ","], "no name")])
def test_bench_names_it_does_not_know_are_refused_by_name(monkeypatch, capsys, argv, wrong):
    monkeypatch.setattr(sys, "argv", ["bench_sample.py", *argv])
    with pytest.raises(SystemExit):
        bench_sample.parse_args()
    assert f": {wrong}; choose among " in capsys.readouterr().err


def test_bench_sample_table_speed_up_and_profiled_ms_per_token(monkeypatch, capsys):
    speeds = {"standard": {"no cache": 10.0, "KV cache": 40.0}, "efficient": {"no cache": 20.0, "KV cache": 50.0}}
    monkeypatch.setattr(bench_sample, "bench_variant",
                        lambda size, variant, args: (1.5, speeds[variant], {"aten::mm": 1.0}))
    monkeypatch.setattr(sys, "argv", ["bench_sample.py", "--sizes", "small", "--variants", "standard", "efficient",
                                      "--threads=0", "--profile"])
    bench_sample.main()
    out = capsys.readouterr().out
    header, rows = markdown_table(out, "size")
    assert header == ["size", "attention", "params", "tokens/s, no cache", "tokens/s, KV cache", "speed-up"]
    assert [list(r.values()) for r in rows] == [["small", "standard", "1.5M", "10.0", "40.0", "4.0x"],
                                                ["small", "efficient", "1.5M", "20.0", "50.0", "2.5x"]]
    assert "### where a token's time goes, KV cache: small (measured: 25.000 / 20.000 ms per token)" in out


def write_run_output(out_dir, records, **summary):
    out_dir.mkdir()
    (out_dir / SUMMARY_NAME).write_text(json.dumps(summary))
    (out_dir / LOG_NAME).write_text("".join(json.dumps(r) + "\n" for r in records))


def test_bench_train_measures_the_iterations_after_the_warmup(tmp_path):
    def train(iteration, ms, mfu):
        return {"type": "train", "iter": iteration, "ms_per_iter": ms, "mfu": mfu}
    records = [train(1, 5000.0, 0.004), train(2, 5000.0, 0.004), train(3, 100.0, 0.2), train(4, 300.0, 0.2 / 3),
               {"type": "eval", "iter": 4, "val_loss": 3.0}]
    write_run_output(tmp_path / "run", records, tokens_per_iter=1000, n_params=7)
    tokens_per_s, mfu, summary = bench_train.measure(tmp_path / "run", warmup_steps=2)
    assert tokens_per_s == pytest.approx(1000 / 0.2) and summary["n_params"] == 7
    assert mfu == pytest.approx(0.1)  # the logged MFU at the mean step time
    write_run_output(tmp_path / "cpu", [dict(r, mfu=None) for r in records[:4]], tokens_per_iter=1000)
    assert bench_train.measure(tmp_path / "cpu", warmup_steps=0)[:2] == (pytest.approx(1000 / 2.6), None)


def test_bench_train_names_the_timed_iterations_and_repeats_the_rows_at_the_end(tmp_path, monkeypatch, capsys):
    def fake_run(config, parallelism, scratch, args):
        return dict(config=config, parallelism=parallelism, shape="2 x 32", error=None, tokens_per_s=500.0, mfu=None,
                    params=10, peak_memory=2**30, wall_s=1.0, world_size=1)
    monkeypatch.setattr(bench_train, "bench_one", fake_run)
    code, rows, output = bench_train_run(tmp_path, capsys, "--parallelisms=plain,ddp", "--budget_tokens=4.32e7")
    assert code == 0
    assert "# 3 iterations per run of 1 micro-batch(es); tokens/s and MFU over iterations 2-3 (the first 1 " in output
    assert [row[:2] + row[4:8] for row in rows] == [[CONFIG, p, "500", "-", "1.00", "1.0"] for p in ("plain", "ddp")]


def test_bench_train_on_the_cpu_of_a_gpu_machine_counts_device_days(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    args = bench_train.parse_args([*TINY_RUN, "--device=cpu"])
    assert args.device == "cpu" and "| device-days for 3e+10 tokens |" in bench_train.table_header(args)


def test_bench_train_row_cells_under_their_columns():
    args = SimpleNamespace(budget_tokens=8.64e7, device="cuda")
    # two GPUs at 1,000 tokens/s together: 8.64e7 tokens take 86,400 s, on each GPU, so two GPU-days
    row = dict(config="c.py", parallelism="ddp", shape="4 x 2048", error=None, tokens_per_s=1000.0, mfu=0.4567,
               params=1_234_567, peak_memory=3 * 2**30, wall_s=12.4, world_size=2)
    text = bench_train.table_header(args) + "\n" + bench_train.table_row(row, args.budget_tokens)
    header, (cells,) = markdown_table(text, "config")
    assert cells == {"config": "c.py", "parallelism": "ddp", "params": "1,234,567", "micro-batch x context": "4 x 2048",
                     "tokens/s": "1,000", "MFU": "45.7%", "peak memory GiB": "3.00",
                     "GPU-days for 8.64e+07 tokens": "2.0", "wall s": "12", "note": ""}


def test_attention_kernels_time_is_the_median_after_the_warmup(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(bench_attention_kernels, "time", clock)
    seconds = iter([9.0, 5.0, 1.0, 2.0])  # the first: the warm-up

    def run():
        clock.now += next(seconds)
    assert bench_attention_kernels.time_steps(run, SimpleNamespace(device="cpu", warmup=1, repeats=3)) == 2.0


def test_attention_kernels_median_of_an_even_number_of_steps_is_the_mean_of_the_middle_two(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(bench_attention_kernels, "time", clock)
    seconds = iter([8.0, 1.0, 2.0, 4.0])

    def run():
        clock.now += next(seconds)
    assert bench_attention_kernels.time_steps(run, SimpleNamespace(device="cpu", warmup=0, repeats=4)) == 3.0


def test_attention_kernels_table_times_in_ms_against_the_first_shapes_default(capsys):
    def row(backend, seconds, peak=None):
        return {"backend": backend, "seconds": seconds, "peak": peak, "diff": 0.0, "error": None, "ran": "MATH",
                "kernels": []}
    bench_attention_kernels.print_table([
        {"heads": 1, "d_k": 64, "rows": [row("default", 0.002, 3 * 2**20), row("MATH", 0.005)]},
        {"heads": 4, "d_k": 16, "rows": [row("default", 0.004), {"backend": "FLASH_ATTENTION", "error": "no"}]}])
    header, rows = markdown_table(capsys.readouterr().out, "heads x d_k")
    assert header[3:6] == ["fwd+bwd ms", "vs 1x64 default", "peak extra MiB"]
    assert [[r["heads x d_k"], r["backend"], r["fwd+bwd ms"], r["vs 1x64 default"], r["peak extra MiB"]]
            for r in rows] == [["1x64", "default", "2.000", "1.00", "3"], ["1x64", "MATH", "5.000", "2.50", "-"],
                               ["4x16", "default", "4.000", "2.00", "-"], ["4x16", "FLASH_ATTENTION", "-", "-", "-"]]


def test_time_table_everything_else_adds_up_the_rows_past_the_top(capsys):
    profiling.print_time_table("t", "step", {"a": {"x": 4.0, "y": 3.0, "z": 2.0, "w": 1.0}, "b": {"w": 5.0}}, top=2)
    out = capsys.readouterr().out
    assert printed_time_table(out, "t") == ["a", "b"]
    _, rows = markdown_table(out, "kernel (CUDA) or operator (CPU), ms per step")
    assert [(r["kernel (CUDA) or operator (CPU), ms per step"], r["a"], r["b"]) for r in rows] == [
        ("w", "1.000", "5.000"), ("x", "4.000", "0.000"), ("everything else", "5.000", "0.000"),
        ("total", "10.000", "5.000")]


def test_bench_prepare_speed_up_is_against_the_first_num_proc(monkeypatch, capsys):
    datasets = pytest.importorskip("datasets", reason="bench_prepare.py needs the datasets package")
    import bench_prepare
    seconds = {1: (4.0, 4.0), 2: (2.0, 5.0)}  # (wall, CPU) of a run at each num_proc
    monkeypatch.setattr(bench_prepare, "gpt2_encoding", lambda: None)
    monkeypatch.setattr(bench_prepare, "tokenize_and_write", lambda corpus, out, num_proc: (1000, *seconds[num_proc]))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", datasets.config.HF_DATASETS_CACHE)
    monkeypatch.setattr(datasets, "disable_progress_bars", lambda: None)
    monkeypatch.setattr(sys, "argv", ["bench_prepare.py", "--corpus=stdlib", "--megabytes=0.01", "--repeats=1"])
    bench_prepare.main()
    out = capsys.readouterr().out
    assert out.startswith(f"# {machine_name('cpu')}; torch {torch.__version__}\n"
                          "# command: python bench/bench_prepare.py --corpus=stdlib --megabytes=0.01 --repeats=1\n")
    _, rows = markdown_table(out, "num_proc")
    assert [list(r.values()) for r in rows] == [["1", "1,000", "4.00", "250", "1.00x", "4.00", "250"],
                                                ["2", "1,000", "2.00", "500", "2.00x", "5.00", "200"]]


def test_bench_cpu_load_reports_medians_and_busy_over_idle(tmp_path, monkeypatch, capsys):
    (tmp_path / "data" / "shakespeare_char").mkdir(parents=True)
    (tmp_path / "data" / "shakespeare_char" / "train.bin").write_bytes(b"")
    monkeypatch.setattr(bench_cpu_load, "REPO", tmp_path)
    seconds = {False: iter([10.0, 30.0, 12.0]), True: iter([30.0, 18.0, 90.0])}
    monkeypatch.setattr(bench_cpu_load, "timed_run",
                        lambda program, folder, iters, loaded, scratch: next(seconds[loaded]))
    bench_cpu_load.main(["--repeats=3"])
    out = capsys.readouterr().out
    assert out.startswith(f"# {machine_name('cpu')}; torch {torch.__version__}\n"
                          "# command: python bench/bench_cpu_load.py --repeats=3\n")  # the machine of the figures
    header, rows = markdown_table(out, "program")
    assert header == ["program", "idle (s)", "one core busy (s)", "busy / idle"]
    assert [list(r.values()) for r in rows] == [["this repo", "12.0", "30.0", "2.50"]]


def test_bench_cpu_load_trains_nanogpt_for_as_many_steps_and_evaluations_as_ours(tmp_path):
    def settings(argv):
        given = dict(arg[2:].split("=", 1) for arg in argv if arg.startswith("--") and "=" in arg)
        return int(given["max_iters"]), int(given["eval_interval"])  # the last value given wins, as in both

    def nanogpt_loop(max_iters, eval_interval):
        # NanoGPT's train.py: evaluate if iter_num % eval_interval == 0, step, iter_num += 1, stop once past max_iters
        iterations = range(max_iters + 1)
        return len(iterations), sum(i % eval_interval == 0 for i in iterations)

    def our_loop(max_iters, eval_interval):
        # train.py's train_loop: evaluate at each multiple of eval_interval and at max_iters, step up to max_iters
        return max_iters, sum(i % eval_interval == 0 or i == max_iters for i in range(max_iters + 1))

    ours, _ = bench_cpu_load.command("ours", REPO, 300, tmp_path)
    nanogpt, _ = bench_cpu_load.command("nanogpt", tmp_path, 300, tmp_path)
    assert our_loop(*settings(ours)) == nanogpt_loop(*settings(nanogpt)) == (300, 2)


@pytest.mark.parametrize("flag, message", [
    ("--nanogpt_dir", "no train.py and data/shakespeare_char/prepare.py there"),
    ("--baseline_dir", "no config/train_shakespeare_char_cpu.py there"),
])
def test_bench_cpu_load_checks_each_checkout_before_any_run(tmp_path, monkeypatch, capsys, flag, message):
    (tmp_path / "data" / "shakespeare_char").mkdir(parents=True)
    (tmp_path / "data" / "shakespeare_char" / "train.bin").write_bytes(b"")
    monkeypatch.setattr(bench_cpu_load, "REPO", tmp_path)
    monkeypatch.setattr(bench_cpu_load, "timed_run", lambda *args: pytest.fail("a run started"))
    with pytest.raises(SystemExit) as stopped:
        bench_cpu_load.main([f"{flag}={tmp_path / 'not-a-checkout'}"])
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_bench_cpu_load_needs_the_text_where_nanogpts_data_is_not_prepared(tmp_path, monkeypatch, capsys):
    for folder in (tmp_path / "data" / "shakespeare_char", tmp_path / "nanogpt" / "data" / "shakespeare_char"):
        folder.mkdir(parents=True)
    (tmp_path / "data" / "shakespeare_char" / "train.bin").write_bytes(b"")
    (tmp_path / "nanogpt" / "train.py").write_text("")
    (tmp_path / "nanogpt" / "data" / "shakespeare_char" / "prepare.py").write_text("")
    monkeypatch.setattr(bench_cpu_load, "REPO", tmp_path)
    with pytest.raises(SystemExit) as stopped:
        bench_cpu_load.main([f"--nanogpt_dir={tmp_path / 'nanogpt'}", f"--text={tmp_path / 'none.txt'}"])
    assert stopped.value.code == 2 and "none.txt: no such file" in capsys.readouterr().err


def test_bench_faults_first_lines_name_the_machine_and_the_command(monkeypatch, capsys):
    monkeypatch.setattr(bench_faults, "stdlib_corpus", lambda max_chars: "a small corpus of text " * 500)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # main's one thread, not this process's
    argv = ["--kills=0", "--sharded_kills=0", "--signals=0", "--nans=0"]
    assert bench_faults.main(argv) == 0
    assert capsys.readouterr().out.startswith(f"# {machine_name('cpu')}; torch {torch.__version__}\n"
                                              f"# command: python bench/bench_faults.py {' '.join(argv)}\n")


def test_bench_faults_table_puts_each_count_under_its_column(capsys):
    bench_faults.print_table([("NaN at a random iteration", dict(runs=5, kill=4, corrupted=3, failed_resume=2, lost=1),
                               "a note")])
    header, row = capsys.readouterr().out.strip("\n").splitlines()
    assert row.startswith("NaN at a random iteration ") and row.endswith("   a note")
    for label, value in [("runs", "5"), ("kills", "4"), ("corrupted", "3"), ("failed resumes", "2"),
                         ("lost iterations", "1")]:
        end = header.index(label) + len(label)  # right-aligned under its label
        assert row[end - len(value) - 1:end] == " " + value, label
