r"""
Compare attention variants in one command: train each with the same config, seeds and data order
under one budget, at one size or several; then write tables, a fit of loss against compute, plots.

    python compare.py config/train_shakespeare_char_cpu.py --out_dir=out-compare
    python compare.py config/train_shakespeare_char_cpu.py --match=flops \
        --sizes=2x2x64,3x3x96,4x4x128 --seeds=2 --eval_iters=200 --out_dir=out-frontier
    python compare.py config/train_gpt2.py --variants=standard,efficient --max_iters=5000 \
        --launcher="torchrun --standalone --nproc_per_node=8"

--match: 'iters' gives every run the config's max_iters; 'tokens', 'flops' and 'time' give every
run the tokens, training FLOPs or seconds the --reference variant spends in max_iters at that size
(or --budget_tokens, --budget_flops, --budget_seconds), so a cheaper variant trains longer. Each
run's schedule is stretched to its own iterations. --learning_rates=5e-4,1e-3 trains each variant
at each rate and compares it at its best. Other --key=value arguments go to every train.py run.

Each run is a train.py process writing to OUT_DIR/[SIZE/]<variant>[-lr<rate>]-seed<k>/, its
output in train.log there. The same command, rerun, skips finished runs and resumes an
interrupted one. Results: OUT_DIR/results.md and results.json; with matplotlib, loss.png,
frontier.png and learning_rates.png. docs/compare.md has the method.
"""

import argparse
import json
import shlex
import sys
from pathlib import Path

import frontier
import sweep
from atomic import write_text_atomic
from checkpoint import CheckpointError
from eval_hellaswag import HellaSwagError, evaluate_checkpoint, load_examples
from model import ATTENTION_CLASSES, ATTENTION_VARIANTS
from runtime import run_script
from tokenizer import TokenizerUnavailableError

HELLASWAG_NAME = "compare_hellaswag.json"  # in each run's folder: its scores, and what they score
BUDGET_FLAGS = {"tokens": "budget_tokens", "flops": "budget_flops", "time": "budget_seconds"}
BUDGET_UNITS = {"iters": "iterations", "tokens": "tokens", "flops": "training FLOPs",
                "time": "seconds"}
SWEEP_SETS = ("attention", "seed", "out_dir", "init_from")  # each run's own


class OneLineErrors(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"error: {message} (python compare.py --help lists the options)\n")


def parse_args(argv):
    # no abbreviations: what is not ours is a train.py setting (--seed is not --seeds)
    parser = OneLineErrors(description=__doc__, allow_abbrev=False,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("config", help="a train.py config file, e.g. config/train_shakespeare_char_cpu.py")
    add("--variants", default=",".join(ATTENTION_VARIANTS), help="comma-separated variants")
    add("--seeds", type=int, default=1, help="runs per variant and size, seeds 0..N-1")
    add("--out_dir", default="out-compare")
    add("--match", default="iters", choices=sweep.MATCHES, help="what every run gets the same of")
    add("--reference", default="standard", help="the variant whose max_iters sets the budget")
    add("--budget_tokens", type=float, help="with --match=tokens: tokens per run")
    add("--budget_flops", type=float, help="with --match=flops: training FLOPs per run")
    add("--budget_seconds", type=float, help="with --match=time: training seconds per run")
    add("--probe_iters", type=int, default=30, help="with --match=time: steps timed per variant")
    add("--sizes", default="", help="n_layer x n_head x n_embd, comma-separated (2x2x64,4x4x128), "
        f"or presets: {', '.join(sweep.SIZE_PRESETS)}")
    add("--learning_rates", default="", help="comma-separated peak learning rates, each tried for "
        "every variant and size (min_lr at the config's ratio)")
    add("--launcher", default="", help='e.g. "torchrun --standalone --nproc_per_node=8"')
    add("--hellaswag_file", default="", help="HellaSwag jsonl to score each run's checkpoint on")
    add("--hellaswag_limit", type=int, default=None)
    args, train_overrides = parser.parse_known_args(argv)
    check_args(parser, args, train_overrides)
    return args, train_overrides


def check_args(parser, args, train_overrides):
    """One error line for an argument that is wrong; turns the variants, sizes and learning rates
    into lists, and sets args.budget (None: the reference's at max_iters)."""
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in [*args.variants, args.reference] if v not in ATTENTION_CLASSES]
    if unknown or not args.variants:
        parser.error(f"--variants/--reference: {','.join(unknown) or '(none)'}: choose among "
                     f"{', '.join(ATTENTION_CLASSES)}")
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    if not Path(args.config).is_file():
        parser.error(f"config file {args.config} does not exist")
    for match, flag in BUDGET_FLAGS.items():
        value = getattr(args, flag)
        if value is not None and (match != args.match or not value > 0):
            parser.error(f"--{flag}={value:g}: a budget is a positive number, given with "
                         f"--match={match}")
    args.budget = getattr(args, BUDGET_FLAGS[args.match]) if args.match in BUDGET_FLAGS else None
    try:
        args.sizes = sweep.parse_sizes(args.sizes) if args.sizes else None
        rates = [lr for lr in args.learning_rates.split(",") if lr.strip()]
        args.learning_rates = sorted(float(lr) for lr in rates)
    except sweep.SweepError as e:
        parser.error(str(e))
    except ValueError as e:
        parser.error(f"--learning_rates: {e}")
    for override in train_overrides:
        if not override.startswith("--") or "=" not in override:
            parser.error(f"{override!r}: train.py settings are passed as --key=value")
        if override[2:].split("=", 1)[0] in SWEEP_SETS:
            parser.error(f"{override!r}: compare.py sets {', '.join(SWEEP_SETS)} itself "
                         f"(--variants, --seeds=N for seeds 0..N-1, --out_dir)")


def describe_plan(args, plan, budgets, out_dir):
    """The plan, a line per run, printed before anything trains."""
    origin = "as given" if args.budget else f"{args.reference}'s at max_iters"
    lines = [f"plan: {len(plan)} runs, --match={args.match}, each size's budget in "
             f"{BUDGET_UNITS[args.match]} ({origin}): "
             + ", ".join(f"{label} {budget:.4g}" for label, budget in budgets.items())]
    for k, run in enumerate(plan, 1):
        lines.append(f"  run {k}/{len(plan)}: {run.describe()}: {run.iterations:,} iters, warmup "
                     f"{run.schedule['warmup_iters']:,}, eval every "
                     f"{run.schedule['eval_interval']:,}, {run.training_flops:.4g} training FLOPs")
    lines.append(f"each run's train.py output goes to train.log in its folder under {out_dir}")
    return "\n".join(lines)


def add_hellaswag(rows, plan, args):
    """Each compared run's checkpoint scored (in a --learning_rates sweep, those at each variant's
    best rate); the scores are kept in its folder, so that a rerun scores only runs not scored."""
    if args.learning_rates:
        best = frontier.best_learning_rates(list(rows.values()), {run.size for run in plan},
                                            args.variants)
        plan = [run for run in plan if best.get((run.size, run.variant)) == run.learning_rate]
    scored = {"file": str(Path(args.hellaswag_file).resolve()), "limit": args.hellaswag_limit}
    for run in plan:
        kept = sweep.read_json(run.run_dir / HELLASWAG_NAME)
        if not kept or kept["scored"] != scored:
            results = evaluate_checkpoint(run.run_dir, args.hellaswag_file, args.hellaswag_limit)
            kept = {"scored": scored, "scores": {k: results[k] for k in ("acc", "acc_norm")}}
            write_text_atomic(run.run_dir / HELLASWAG_NAME, json.dumps(kept))
        rows[run.run_dir].update({f"hellaswag_{k}": v for k, v in kept["scores"].items()})


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args, train_overrides = parse_args(argv)
    out_dir = Path(args.out_dir).resolve()
    try:
        if args.hellaswag_file:
            load_examples(args.hellaswag_file, args.hellaswag_limit)  # before anything trains
        plan, budgets = sweep.plan_sweep(args, train_overrides, out_dir)
        print(describe_plan(args, plan, budgets, out_dir), flush=True)
        rows = sweep.run_sweep(plan, args.launcher)
        if args.hellaswag_file:
            add_hellaswag(rows, plan, args)
    except (sweep.SweepError, HellaSwagError, CheckpointError, TokenizerUnavailableError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    command = shlex.join(["python", "compare.py", *argv])
    seeds = f"mean ± standard deviation over {args.seeds} seeds" if args.seeds > 1 else "one seed"
    extra = {"command": command, "config": args.config, "train_overrides": train_overrides,
             "match": args.match, "reference": args.reference, "seeds": args.seeds,
             "learning_rates": args.learning_rates}
    markdown = frontier.write_report(
        out_dir, f"Command: `{command}` ({seeds})", plan, budgets, list(rows.values()),
        variants=args.variants, reference=args.reference, seeds=args.seeds, extra=extra,
        budget_unit=BUDGET_UNITS[args.match])
    plots = " and the plots" if frontier.pyplot() else " (no plots: pip install matplotlib)"
    print(f"\n{markdown}\nwrote {out_dir / 'results.md'}, {out_dir / 'results.json'}{plots}")
    return 0


if __name__ == "__main__":
    run_script(main, "stopped by Ctrl-C; rerun the same command to continue: finished runs are "
                     "not trained again, and an interrupted one resumes from its checkpoint")
