"""
Training on a busy CPU: the wall time of a short CPU training run with nothing else running, and
with one other process spinning on one core, side by side for this repo, optionally an older
checkout of it, and NanoGPT.

    python prepare_char.py --input=../shared/data/tinyshakespeare.txt
    python bench/bench_cpu_load.py --iters=300 --nanogpt_dir=../nanoGPT --baseline_dir=../older

Each program trains NanoGPT's CPU quick start (4 layers, 4 heads, 128 dims, block 64, batch 12,
no compile; config/train_shakespeare_char_cpu.py here) for --iters iterations on Tiny Shakespeare.
The runs alternate (idle, loaded, program by program) for --repeats rounds; the table gives the
median wall time of each, and loaded / idle. The busy process is `while True: pass`.
"""

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the repo's modules, from bench/
from machine import header  # noqa: E402

NANOGPT_ARGS = ("config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20 "
                "--log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 "
                "--n_embd=128 --dropout=0.0")


def command(program, folder, iters, out_dir):
    """(argv, cwd) of one training run."""
    if program == "nanogpt":
        # NanoGPT's loop trains iterations 0 to max_iters, one more than max_iters, and evaluates
        # before each step at a multiple of eval_interval: iters steps and two evaluations, as ours
        args = (f"{NANOGPT_ARGS} --max_iters={iters - 1} --lr_decay_iters={iters} "
                f"--eval_interval={iters - 1}")
    else:
        args = (f"config/train_shakespeare_char_cpu.py --max_iters={iters} "
                f"--lr_decay_iters={iters} --eval_interval={iters} "
                f"--data_dir={REPO / 'data' / 'shakespeare_char'}")
    return [sys.executable, "train.py", *args.split(), f"--out_dir={out_dir}"], folder


def timed_run(program, folder, iters, loaded, scratch):
    """Wall seconds of one training run, with a busy process beside it when `loaded`."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if loaded else None
    try:
        time.sleep(0.5 if loaded else 0)  # the busy process is running before training starts
        argv, cwd = command(program, folder, iters, scratch / f"{program}-{int(loaded)}")
        start = time.perf_counter()
        subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - start
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def prepare_nanogpt_data(nanogpt_dir, text_file):
    """NanoGPT's data, prepared with its own prepare.py from the same text file."""
    folder = Path(nanogpt_dir) / "data" / "shakespeare_char"
    if not (folder / "train.bin").exists():
        shutil.copy(text_file, folder / "input.txt")
        subprocess.run([sys.executable, "prepare.py"], cwd=folder, check=True,
                       stdout=subprocess.DEVNULL)


def check_inputs(parser, args):
    """Before any run, what the runs need, each missing one as one error line."""
    nanogpt_data = Path(args.nanogpt_dir) / "data" / "shakespeare_char"
    needs = [(args.iters >= 2 and args.repeats >= 1, "--iters at least 2, --repeats at least 1"),
             ((REPO / "data" / "shakespeare_char" / "train.bin").exists(),
              "prepare the data first: python prepare_char.py --input=<tinyshakespeare.txt>"),
             (not args.baseline_dir
              or (Path(args.baseline_dir) / "config" / "train_shakespeare_char_cpu.py").is_file(),
              f"--baseline_dir={args.baseline_dir}: not a checkout of this repository"),
             (not args.nanogpt_dir or (nanogpt_data / "prepare.py").is_file(),
              f"--nanogpt_dir={args.nanogpt_dir}: not a checkout of NanoGPT"),
             (not args.nanogpt_dir or (nanogpt_data / "train.bin").exists()
              or Path(args.text).is_file(), f"--text={args.text}: no such file (Tiny Shakespeare)")]
    for ok, message in needs:
        if not ok:
            parser.error(message)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--nanogpt_dir", default="", help="a NanoGPT checkout: its train.py too")
    parser.add_argument("--baseline_dir", default="", help="another checkout of this repo")
    parser.add_argument("--text", default=str(REPO.parent / "shared/data/tinyshakespeare.txt"))
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    check_inputs(parser, args)
    print(header("bench_cpu_load.py", argv, "cpu"), flush=True)
    programs = {"this repo": ("ours", REPO)}
    if args.baseline_dir:
        programs["baseline checkout"] = ("ours", Path(args.baseline_dir))
    if args.nanogpt_dir:
        prepare_nanogpt_data(args.nanogpt_dir, args.text)
        programs["NanoGPT"] = ("nanogpt", Path(args.nanogpt_dir))
    times = {(name, loaded): [] for name in programs for loaded in (False, True)}
    with tempfile.TemporaryDirectory(prefix="bench_cpu_load.") as scratch:
        for _ in range(args.repeats):
            for name, (program, folder) in programs.items():
                for loaded in (False, True):
                    seconds = timed_run(program, folder, args.iters, loaded, Path(scratch))
                    times[name, loaded].append(seconds)
                    print(f"{name}, {'loaded' if loaded else 'idle'}: {seconds:.1f} s", flush=True)
    print(f"\n{args.iters} iterations, median of {args.repeats}\n")
    print("| program | idle (s) | one core busy (s) | busy / idle |\n|---|---:|---:|---:|")
    for name in programs:
        idle, loaded = statistics.median(times[name, False]), statistics.median(times[name, True])
        print(f"| {name} | {idle:.1f} | {loaded:.1f} | {loaded / idle:.2f} |")


if __name__ == "__main__":
    main()
