"""
Compare attention variants in one command: train each with the same config, seed, data order and
budget, then write a paper-style table and loss curves into one folder.

    python compare.py config/train_shakespeare_char_cpu.py --out_dir=out-compare
    python compare.py config/train_gpt2.py --variants=standard,efficient --seeds=3 \
        --launcher="torchrun --standalone --nproc_per_node=8" --max_iters=5000

Everything after the config that compare.py does not know (--max_iters=..., --batch_size=...) is
passed to train.py for every run. Each run is a separate train.py process (so peak memory and
wall time are its own), writing to OUT_DIR/<variant>-seed<k>/. The results land in
    OUT_DIR/results.md    one row per variant, each column's ranking in parentheses
    OUT_DIR/results.json  the same numbers, per seed and as mean and standard deviation
    OUT_DIR/loss.png      train and val loss against iterations and against wall-clock seconds
"""

import argparse
import json
import math
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from checkpoint import LOG_NAME, SUMMARY_NAME
from model import ATTENTION_CLASSES, ATTENTION_VARIANTS

REPO = Path(__file__).resolve().parent


class RunFailed(RuntimeError):
    """A train.py run exited with an error; its own output says why."""

# (column, key in a run's summary, better: "low" / "high" / None for no ranking, format)
COLUMNS = [
    ("attn params/layer", "attention_params", "low", "{:,.0f}"),
    ("model params", "n_params", "low", "{:,.0f}"),
    ("FLOPs/token", "flops_per_token", "low", "{:,.0f}"),
    ("train loss", "final_train_loss", "low", "{:.4f}"),
    ("val loss", "final_val_loss", "low", "{:.4f}"),
    ("val ppl", "val_ppl", "low", "{:.2f}"),
    ("HellaSwag acc", "hellaswag_acc", "high", "{:.4f}"),
    ("HellaSwag acc_norm", "hellaswag_acc_norm", "high", "{:.4f}"),
    ("HellaSwag acc_char_norm", "hellaswag_acc_char_norm", "high", "{:.4f}"),
    ("ms/iter", "mean_ms_per_iter", "low", "{:.1f}"),
    ("tokens/s", "tokens_per_s", "high", "{:,.0f}"),
    ("peak memory (MB)", "peak_memory_mb", "low", "{:,.0f}"),
    ("wall time (s)", "wall_time_s", "low", "{:.1f}"),
]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="a train.py config file, e.g. config/train_shakespeare_char_cpu.py")
    parser.add_argument("--variants", default=",".join(ATTENTION_VARIANTS), help="comma-separated attention variants")
    parser.add_argument("--seeds", type=int, default=1, help="runs per variant, seeds 0..N-1 (the paper averages 5)")
    parser.add_argument("--out_dir", default="out-compare")
    parser.add_argument("--launcher", default="", help='e.g. "torchrun --standalone --nproc_per_node=8"')
    parser.add_argument("--hellaswag_file", default="", help="HellaSwag jsonl to evaluate each final checkpoint on")
    parser.add_argument("--hellaswag_limit", type=int, default=None)
    args, train_overrides = parser.parse_known_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in ATTENTION_CLASSES]
    if unknown or not args.variants:
        parser.error(f"--variants={','.join(args.variants)}: choose among {', '.join(ATTENTION_CLASSES)}")
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    if not Path(args.config).is_file():
        parser.error(f"config file {args.config} does not exist")
    for override in train_overrides:
        if not override.startswith("--") or "=" not in override:
            parser.error(f"{override!r}: train.py settings are passed as --key=value")
        if override.split("=", 1)[0] in ("--attention", "--seed", "--out_dir"):
            parser.error(f"{override!r}: compare.py sets attention, seed and out_dir itself")
    return args, train_overrides


def run_training(args, train_overrides, attention, seed, run_dir):
    command = shlex.split(args.launcher) if args.launcher else [sys.executable]
    command += [str(REPO / "train.py"), args.config, *train_overrides,
                f"--attention={attention!r}", f"--seed={seed}", f"--out_dir={str(run_dir)!r}"]
    print(f"\n=== {attention}, seed {seed}: {shlex.join(command)}", flush=True)
    result = subprocess.run(command, cwd=REPO)
    if result.returncode != 0:
        raise RunFailed(f"training {attention} (seed {seed}) failed with exit code {result.returncode}; "
                        f"its output is above, its files in {run_dir}")
    summary = json.loads((run_dir / SUMMARY_NAME).read_text())
    if summary.get("final_val_loss") is not None:
        summary["val_ppl"] = math.exp(summary["final_val_loss"])
    if summary.get("peak_memory_bytes") is not None:
        summary["peak_memory_mb"] = summary["peak_memory_bytes"] / 2**20
    if args.hellaswag_file:
        summary.update(evaluate_hellaswag(run_dir, args.hellaswag_file, args.hellaswag_limit))
    return summary


def evaluate_hellaswag(run_dir, data_file, limit):
    from eval_hellaswag import evaluate_checkpoint  # torch is imported only when HellaSwag is asked for

    results = evaluate_checkpoint(run_dir, data_file, limit)
    return {f"hellaswag_{k}": results[k] for k in ("acc", "acc_norm", "acc_char_norm")}


def read_log(run_dir):
    path = run_dir / LOG_NAME
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def aggregate(runs):
    """Mean and standard deviation over seeds, per column."""
    table = {}
    for _, key, _, _ in COLUMNS:
        values = [run[key] for run in runs if run.get(key) is not None]
        if values:
            table[key] = {
                "mean": statistics.fmean(values),
                "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                "runs": values,
            }
    return table


def rankings(results, key, better):
    """Rank 1 = best; equal values share a rank, as the paper's tables do."""
    means = {v: r[key]["mean"] for v, r in results.items() if key in r}
    ordered = sorted(set(means.values()), reverse=(better == "high"))
    return {v: ordered.index(m) + 1 for v, m in means.items()}


def markdown_table(results, n_seeds):
    columns = [c for c in COLUMNS if any(c[1] in r for r in results.values())]
    ranks = {key: rankings(results, key, better) for _, key, better, _ in columns}
    lines = [
        "| attention | " + " | ".join(title for title, *_ in columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for variant, row in results.items():
        cells = []
        for _, key, _, fmt in columns:
            if key not in row:
                cells.append("n/a")
                continue
            cell = fmt.format(row[key]["mean"])
            if n_seeds > 1 and row[key]["std"] > 0:
                cell += " ± " + fmt.format(row[key]["std"])
            cells.append(f"{cell} ({ranks[key][variant]})")
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_losses(logs, path):
    """Train and val loss of every variant against iterations and wall-clock time (first seed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: loss.png skipped (pip install matplotlib); the table is written")
        return False
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    for i, (variant, log) in enumerate(logs.items()):
        color = f"C{i}"
        train = [e for e in log if e.get("type") == "train"]
        evals = [e for e in log if e.get("type") == "eval"]
        for ax, x in zip(axes, ("iter", "elapsed_s")):
            ax.plot([e[x] for e in train], [e["loss"] for e in train], color=color, alpha=0.25, lw=0.8)
            ax.plot([e[x] for e in evals], [e["val_loss"] for e in evals], color=color, marker="o", ms=3,
                    label=f"{variant} val")
            ax.plot([e[x] for e in evals], [e["train_loss"] for e in evals], color=color, ls="--", lw=1,
                    label=f"{variant} train (eval)")
    # the first evaluation (at initialisation, ~ln(vocab)) would squash the curves that matter
    later_val = [e["val_loss"] for log in logs.values() for e in log if e.get("type") == "eval" and e["iter"] > 0]
    if later_val:
        axes[0].set_ylim(top=max(later_val) + 0.25 * (max(later_val) - min(later_val)) + 0.05)
    axes[0].set_xlabel("iteration")
    axes[1].set_xlabel("wall-clock seconds")
    axes[0].set_ylabel("loss")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, ncol=2)
    fig.suptitle("train (faint: every logged step; dashed: eval estimate) and val loss")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def run_all(args, train_overrides, out_dir):
    """Every variant for every seed, seeds outermost; returns ({variant: [summaries]}, {variant: log of seed 0})."""
    runs = {variant: [] for variant in args.variants}
    first_seed_logs = {}
    for seed in range(args.seeds):
        for variant in args.variants:
            run_dir = out_dir / f"{variant}-seed{seed}"
            runs[variant].append(run_training(args, train_overrides, variant, seed, run_dir))
            if seed == 0:
                first_seed_logs[variant] = read_log(run_dir)
    return runs, first_seed_logs


def main(argv=None):
    args, train_overrides = parse_args(sys.argv[1:] if argv is None else argv)
    out_dir = Path(args.out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        runs, first_seed_logs = run_all(args, train_overrides, out_dir)
    except RunFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    results = {variant: aggregate(variant_runs) for variant, variant_runs in runs.items()}
    command = shlex.join(["python", "compare.py", *(sys.argv[1:] if argv is None else argv)])
    table = markdown_table(results, args.seeds)
    seeds_note = f"mean ± standard deviation over {args.seeds} seeds" if args.seeds > 1 else "one seed"
    (out_dir / "results.md").write_text(
        f"Command: `{command}` ({seeds_note}; ranking in parentheses, 1 = best)\n\n{table}\n"
    )
    (out_dir / "results.json").write_text(json.dumps(
        {"command": command, "config": args.config, "train_overrides": train_overrides, "seeds": args.seeds,
         "results": results, "runs": runs}, indent=2))
    plotted = plot_losses(first_seed_logs, out_dir / "loss.png")
    print(f"\n{table}\n\nwrote {out_dir / 'results.md'}, {out_dir / 'results.json'}"
          + (f", {out_dir / 'loss.png'}" if plotted else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
