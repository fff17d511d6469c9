r"""
Compare attention variants in one command: train each with the same config, seeds and data order
under one budget, at one size or several, then write tables, a fit of loss against compute and plots.

    python compare.py config/train_shakespeare_char_cpu.py --out_dir=out-compare
    python compare.py config/train_gpt2.py --variants=standard,efficient --seeds=3 \
        --launcher="torchrun --standalone --nproc_per_node=8" --max_iters=5000
    python compare.py config/train_shakespeare_char_cpu.py --match=flops --sizes=2x2x64,3x3x96,4x4x128 \
        --seeds=2 --eval_iters=200 --out_dir=out-frontier

The budget (--match): 'iters' gives every run the config's max_iters; 'tokens', 'flops' and 'time'
give every run the tokens, training FLOPs or wall-clock seconds the reference variant (--reference)
spends in max_iters at that size, or the explicit --budget_tokens / --budget_flops / --budget_seconds,
so a cheaper variant trains for more iterations. Under every --match, each run's learning-rate
schedule is stretched to its own iterations, so that its cosine ends where the run ends:
lr_decay_iters = its iterations, warmup_iters and eval_interval scaled by iterations / max_iters
(in the second example, train_gpt2.py's lr_decay_iters=600000 becomes 5000). 'time' measures each variant's
step time with a short probe first: its iterations depend on the machine. docs/compare.md has the
accounting (which FLOPs, which parameters) and the fit.

One learning rate for all variants may suit some better than others: --learning_rates=5e-4,1e-3,2e-3
trains every variant at every size with each of them (min_lr at the config's ratio to it) and
compares each variant at its best; results.md opens with the val loss at each learning rate.

Everything after the config that compare.py does not know (--max_iters=..., --batch_size=...) is
passed to train.py for every run. Each run is a separate train.py process writing to
OUT_DIR/[SIZE/]<variant>[-lr<rate>]-seed<k>/. Rerunning the same command skips finished runs and
resumes an interrupted one from its checkpoint; Ctrl-C stops the sweep after the running train.py
has saved.
The results land in
    OUT_DIR/results.md    a table per size (ranking in parentheses, ties marked), then the summary and the fit
    OUT_DIR/results.json  the plan, every run's numbers, means and standard deviations, the fit
    OUT_DIR/loss.png      train and val loss against iterations and wall-clock (largest size, seed 0)
    OUT_DIR/frontier.png  val loss against training FLOPs, parameters and wall-clock; fit residuals
    OUT_DIR/learning_rates.png  with --learning_rates: val loss against the learning rate, per size
"""

import argparse
import difflib
import json
import math
import shlex
import shutil
import sys
from pathlib import Path

import frontier
import sweep
from atomic import write_text_atomic
from checkpoint import CHECKPOINT_NAME, CheckpointError
from configurator import DEFAULT_CONFIG, from_another_folder
from data import config_data_dir
from eval_hellaswag import HellaSwagError, check_encodable, evaluate_checkpoint, load_examples
from model import ATTENTION_CLASSES, ATTENTION_VARIANTS
from runtime import run_script, sigterm_as_ctrl_c
from tokenizer import TokenizerUnavailableError, read_meta, tokenizer_from_meta

HELLASWAG_NAME = "compare_hellaswag.json"  # in each run's folder: its scores, and what they score
BUDGET_FLAGS = {"tokens": "budget_tokens", "flops": "budget_flops", "time": "budget_seconds"}
BUDGET_UNITS = {"iters": "iterations", "tokens": "tokens", "flops": "training FLOPs", "time": "seconds"}


class OneLineErrors(argparse.ArgumentParser):
    def error(self, message):  # one line, as every other error of the sweep; --help shows the usage
        self.exit(2, f"error: {message} (python compare.py --help lists the options)\n")


def parse_args(argv):
    # no abbreviations: what is not ours is a train.py setting (--seed is not --seeds)
    parser = OneLineErrors(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                           allow_abbrev=False)
    parser.add_argument("config", help="a train.py config file, e.g. config/train_shakespeare_char_cpu.py")
    parser.add_argument("--variants", default=",".join(ATTENTION_VARIANTS), help="comma-separated attention variants")
    parser.add_argument("--seeds", type=int, default=1, help="runs per variant and size, seeds 0..N-1")
    parser.add_argument("--out_dir", default="out-compare")
    parser.add_argument("--match", default="iters", choices=sweep.MATCHES, help="what every run gets the same of")
    parser.add_argument("--reference", default="standard", help="the variant whose max_iters sets the budget")
    parser.add_argument("--budget_tokens", type=float, help="with --match=tokens: tokens per run")
    parser.add_argument("--budget_flops", type=float, help="with --match=flops: training FLOPs per run")
    parser.add_argument("--budget_seconds", type=float, help="with --match=time: training seconds per run")
    parser.add_argument("--probe_iters", type=int, default=30, help="with --match=time: steps timed per variant")
    parser.add_argument("--sizes", default="", help="n_layer x n_head x n_embd, comma-separated (e.g. "
                        f"2x2x64,4x4x128) or presets: {', '.join(sweep.SIZE_PRESETS)}")
    parser.add_argument("--learning_rates", default="", help="comma-separated peak learning rates, each tried for "
                        "every variant and size (min_lr at the config's ratio); each variant is compared at its best")
    parser.add_argument("--launcher", default="", help='e.g. "torchrun --standalone --nproc_per_node=8"')
    parser.add_argument("--hellaswag_file", default="", help="HellaSwag jsonl to score each run's checkpoint on")
    parser.add_argument("--hellaswag_limit", type=int, default=None)
    args, train_overrides = parser.parse_known_args(argv)
    check_args(parser, args, train_overrides)
    return args, train_overrides


def check_args(parser, args, train_overrides):
    """Everything about the arguments that can be wrong, as one argparse error line each. Turns
    args.variants, args.sizes and args.learning_rates from text into lists and sets args.budget."""
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variants + [args.reference] if v not in ATTENTION_CLASSES]
    if unknown or not args.variants:
        parser.error(f"--variants/--reference: {','.join(unknown) or '(none)'}: choose among {', '.join(ATTENTION_CLASSES)}")
    if len(set(args.variants)) != len(args.variants):  # both would train into one folder
        parser.error(f"--variants={','.join(args.variants)}: a variant is listed twice")
    if args.seeds < 1 or args.probe_iters < 2:
        parser.error("--seeds must be at least 1 and --probe_iters at least 2")
    if not Path(args.config).is_file():
        parser.error(f"config file {args.config} does not exist{from_another_folder(args.config)}")
    if args.hellaswag_limit is not None and not args.hellaswag_file:  # else silently unused
        parser.error("--hellaswag_limit limits the examples of --hellaswag_file: give the file too")
    if args.launcher:
        check_launcher(parser, args.launcher)
    check_out_dir(parser, Path(args.out_dir))
    args.budget = None
    for match, flag in BUDGET_FLAGS.items():
        value = getattr(args, flag)
        if value is not None and args.match != match:
            parser.error(f"--{flag} is the budget of --match={match}, not --match={args.match}")
        if value is not None and not (math.isfinite(value) and value > 0):
            parser.error(f"--{flag}={value}: the budget must be a positive number")
        args.budget = args.budget or value
    try:
        args.sizes = sweep.parse_sizes(args.sizes) if args.sizes else None
    except sweep.SweepError as e:
        parser.error(str(e))
    args.learning_rates = parse_learning_rates(parser, args.learning_rates)
    for override in train_overrides:
        if override.endswith(".py") and not override.startswith("--"):  # train.py takes several, as NanoGPT
            parser.error(f"{override!r}: compare.py takes one config file; put its settings in {args.config} (or a "
                         f"copy of it), or pass them as --key=value")
        if not override.startswith("--") or "=" not in override:
            parser.error(f"{override!r}: train.py settings are passed as --key=value")
        key, value = override[2:].split("=", 1)
        check_not_a_misspelled_option(parser, key, value)
        if key in ("attention", "seed", "out_dir", "init_from"):
            parser.error(f"{override!r}: compare.py sets attention, seed, out_dir and init_from itself (--variants, "
                         f"--seeds=N for seeds 0..N-1, --out_dir)")
        if args.sizes and key in sweep.SHAPE_KEYS:
            parser.error(f"{override!r}: with --sizes, each size sets n_layer, n_head and n_embd")
        if args.learning_rates and key in ("learning_rate", "min_lr"):
            parser.error(f"{override!r}: with --learning_rates, each run's learning_rate and min_lr are set from "
                         f"the list (min_lr at the config's ratio to learning_rate)")


def check_not_a_misspelled_option(parser, key, value):
    """--key=value that is not compare.py's own goes to train.py. A key train.py does not know either,
    closer to one of compare.py's options than to any config key, is that option mistyped; and a list
    of learning rates is --learning_rates's. Other unknown keys get train.py's own suggestion."""
    ours = [option[2:] for option in parser._option_string_actions if option.startswith("--")]
    if key == "learning_rate" and "," in value:
        parser.error(f"--{key}={value}: did you mean compare.py's --learning_rates?")
    if key not in DEFAULT_CONFIG:
        close = difflib.get_close_matches(key, ours + list(DEFAULT_CONFIG), n=1)
        if close and close[0] in ours:
            parser.error(f"--{key}={value}: did you mean compare.py's --{close[0]}?")


def check_out_dir(parser, out_dir):
    """An --out_dir under a file is refused before the plan, not at the first run's folder."""
    existing = out_dir.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        parser.error(f"--out_dir={out_dir}: {existing} is a file, not a folder; choose another --out_dir")


def check_launcher(parser, launcher):
    """A --launcher that cannot be split as a shell would, or whose program is not found, is refused
    before the plan, not at the first run's start."""
    try:
        words = shlex.split(launcher)
    except ValueError as e:  # an unclosed quote
        parser.error(f"--launcher={launcher}: {str(e).lower()}: quote it as a shell would, "
                     f"e.g. --launcher=\"torchrun --standalone --nproc_per_node=8\"")
    if not words:
        parser.error("--launcher is blank: give a program, e.g. --launcher=\"torchrun --standalone "
                     "--nproc_per_node=8\", or leave it out to run train.py with this python")
    if shutil.which(words[0]) is None:
        parser.error(f"--launcher={launcher}: {words[0]!r} is not a program on PATH: check its spelling, or give "
                     f"its full path")
    if any(Path(word).name == "train.py" for word in words):
        parser.error(f"--launcher={launcher}: the launcher is the program that starts train.py (torchrun "
                     f"--standalone --nproc_per_node=8, say): compare.py adds train.py and its arguments itself")


def parse_learning_rates(parser, text):
    """'1e-3,2e-3' -> [0.001, 0.002], ascending; [] for none."""
    try:
        rates = [float(item) for item in text.split(",") if item.strip()]
    except ValueError:
        parser.error(f"--learning_rates={text}: give comma-separated numbers, e.g. 5e-4,1e-3,2e-3")
    if not all(math.isfinite(lr) and lr > 0 for lr in rates) or len(set(rates)) != len(rates):
        parser.error(f"--learning_rates={text}: each must be a positive number, listed once")
    spellings = [f"{lr:g}" for lr in rates]  # what names the run folders and the table's columns
    if len(set(spellings)) != len(spellings):
        parser.error(f"--learning_rates={text}: two rates are equal to 6 significant digits ({', '.join(spellings)}), "
                     f"which name the run folders: space them further apart")
    return sorted(rates)


def describe_plan(args, plan, budgets):
    """The resolved iterations of every run, printed before anything trains."""
    unit = BUDGET_UNITS[args.match]
    origin = "given" if args.budget else f"{args.reference}'s at max_iters"
    lines = [f"plan: {len(plan)} runs, --match={args.match}: each size's budget in {unit} ({origin}): "
             + ", ".join(f"{label} {budget:.4g}" for label, budget in budgets.items())]
    if args.match == "time":
        lines.append(f"  (seconds per step measured by a {args.probe_iters}-step probe per variant on this machine: "
                     f"the iterations below hold for this machine only; evaluation time is not in the budget)")
    for k, run in enumerate(plan, 1):
        lr = "" if run.learning_rate is None else f" lr {run.learning_rate:<7g}"
        lines.append(f"  run {k:>3}: {run.size:>10} {run.variant:>10}{lr} seed {run.seed}: {run.iterations:>7,} iters, "
                     f"warmup {run.schedule['warmup_iters']:,}, eval every {run.schedule['eval_interval']:,}, "
                     f"{run.training_flops:.4g} training FLOPs")
    all_warmup = sum(run.iterations > 1 and run.schedule["warmup_iters"] >= run.iterations - 1 for run in plan)
    if all_warmup:  # the config's warmup, scaled, outlasted the run and was cut to its last step
        lines.append(f"note: the warmup takes every step but the last in {all_warmup} of the {len(plan)} runs, so "
                     f"their learning rate never decays: pass a smaller --warmup_iters= (it scales with each run)")
    return "\n".join(lines)


def check_hellaswag_file(args, train_overrides):
    """A HellaSwag file that cannot be read, or that the dataset's tokenizer cannot encode, or runs that
    save no checkpoint to score, are refused before the sweep trains, not after."""
    try:
        examples = load_examples(args.hellaswag_file, args.hellaswag_limit)
    except HellaSwagError as e:
        raise sweep.SweepError(f"--hellaswag_file: {e}") from None
    try:
        config = sweep.resolved_config(args.config, train_overrides, schedule_checked_per_run=True)
    except Exception:  # the plan says what is wrong with it
        return
    if not config["save_checkpoints"]:
        raise sweep.SweepError("--hellaswag_file scores each run's checkpoint, and save_checkpoints=False writes "
                               "none: drop one or the other")
    try:
        data_dir = config_data_dir(config)
        tokenizer = tokenizer_from_meta(read_meta(data_dir))
    except Exception:  # no dataset yet (the plan says so), or its tokenizer is not to be had here: scored later
        return
    try:
        check_encodable(examples, tokenizer)
    except HellaSwagError as e:
        raise sweep.SweepError(f"--hellaswag_file: {args.hellaswag_file}, {e} (the data in {data_dir})") from None


def add_hellaswag(summaries, plan, args):
    """Each run's checkpoint's HellaSwag scores into its summary; in a --learning_rates sweep only those
    of the runs at each variant's best learning rate, which are the ones compared."""
    if args.learning_rates:
        best = frontier.best_learning_rates(list(summaries.values()), {run.size for run in plan}, args.variants)
        plan = [run for run in plan if best.get((run.size, run.variant)) == run.learning_rate]
    for run in plan:
        summaries[run.run_dir].update({f"hellaswag_{k}": v for k, v in hellaswag_scores(run.run_dir, args).items()})


def hellaswag_scores(run_dir, args):
    """A run's HellaSwag scores, kept in its folder with what they score (the file, the limit, the
    checkpoint), so that a rerun after a Ctrl-C scores only the runs not scored yet."""
    def stamp(path):
        return [str(Path(path).resolve()), Path(path).stat().st_size, Path(path).stat().st_mtime_ns]

    scored = {"hellaswag_file": stamp(args.hellaswag_file), "limit": args.hellaswag_limit,
              "checkpoint": stamp(run_dir / CHECKPOINT_NAME)}
    kept = sweep.read_json(run_dir / HELLASWAG_NAME)
    if kept and kept["scored"] == scored:
        return kept["scores"]
    results = evaluate_checkpoint(run_dir, args.hellaswag_file, args.hellaswag_limit)
    # "iter": which model was scored: the run's last, or with always_save_checkpoint=False its best val loss's
    scores = {k: results[k] for k in ("acc", "acc_norm", "acc_char_norm")} | {"iter": results["iter_num"]}
    write_text_atomic(run_dir / HELLASWAG_NAME, json.dumps({"scored": scored, "scores": scores}))
    return scores


def check_earlier_results(out_dir, run_dirs):
    """results.md and results.json are replaced by a comparison that holds every run they tabulate (the
    same one rerun, or one extended by seeds, variants or sizes), never by one of other runs."""
    try:
        earlier = json.loads((out_dir / "results.json").read_text())
    except (OSError, ValueError):
        return
    planned = {str(run_dir) for run_dir in run_dirs}
    dropped = [run["run_dir"] for run in earlier.get("plan", []) if run.get("run_dir") not in planned]
    if dropped:
        raise sweep.SweepError(f"{out_dir} holds the results of another comparison ({earlier.get('command', '?')}), "
                               f"{len(dropped)} of whose runs this one does not plan (e.g. {dropped[0]}), so its "
                               f"results.md and results.json would lose them: choose another --out_dir")


def write_results(args, argv, train_overrides, plan, budgets, summaries, out_dir):
    """results.md, results.json and the plots (frontier.write_report); returns the markdown."""
    command = sweep.shell_join(["python", "compare.py", *argv])
    seeds_note = f"mean ± standard deviation over {args.seeds} seeds" if args.seeds > 1 else "one seed"
    header = f"Command: `{command}` ({seeds_note}; ranking in parentheses, 1 = best)"
    mixed = frontier.mixed_setups_note(summaries.values())
    header += f"\n\n{mixed}" if mixed else ""
    extra = {"command": command, "config": args.config, "train_overrides": train_overrides, "match": args.match,
             "budget_unit": BUDGET_UNITS[args.match], "reference": args.reference, "seeds": args.seeds,
             "learning_rates": args.learning_rates}
    return frontier.write_report(out_dir, header, plan, budgets, list(summaries.values()), variants=args.variants,
                                 reference=args.reference, seeds=args.seeds, extra=extra,
                                 budget_unit=BUDGET_UNITS[args.match])


def score_hellaswag(args, plan, summaries, report, out_dir):
    """The report without HellaSwag first, so that a Ctrl-C or an error while scoring loses none of the
    rest; then the scores, and the report again with them. Returns (exit status, markdown)."""
    markdown = report()
    try:
        with sigterm_as_ctrl_c():
            add_hellaswag(summaries, plan, args)
    except KeyboardInterrupt:
        print(f"stopped while scoring HellaSwag: {out_dir / 'results.md'} holds every other column; rerun the same "
              f"command for the scores (runs scored already are not scored again)", file=sys.stderr)
        return 130, markdown
    except (HellaSwagError, CheckpointError, TokenizerUnavailableError) as e:
        print(f"error: scoring HellaSwag: {e} ({out_dir / 'results.md'} holds every other column)", file=sys.stderr)
        return 1, markdown
    return 0, report()


def skipped_plots(budgets, learning_rates):
    """'loss.png is skipped', '... and frontier.png are skipped': the plots frontier.write_report makes for this
    comparison (frontier.png across sizes, learning_rates.png for a --learning_rates sweep), named where
    matplotlib is missing."""
    names = ["loss.png"] + ["frontier.png"] * (len(budgets) > 1) + ["learning_rates.png"] * bool(learning_rates)
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f"{listed} {'is' if len(names) == 1 else 'are'} skipped"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args, train_overrides = parse_args(argv)
    out_dir = Path(args.out_dir).resolve()
    try:
        if args.hellaswag_file:
            check_hellaswag_file(args, train_overrides)
        check_earlier_results(out_dir, sweep.planned_run_dirs(args, out_dir))  # before a probe replaces anything
        plan, budgets = sweep.plan_sweep(args, train_overrides, out_dir)
        print(describe_plan(args, plan, budgets), flush=True)
        summaries = sweep.run_sweep(plan, args.launcher)
    except KeyboardInterrupt:  # while planning: the runs themselves stop through SweepInterrupted
        print("stopped by Ctrl-C before the next run started; rerun the same command to continue (finished runs are "
              "skipped)", file=sys.stderr)
        return 130
    except sweep.SweepInterrupted as e:
        print(f"stopped by {e}; rerun the same command to continue (finished runs are skipped)", file=sys.stderr)
        return 130
    except (sweep.SweepError, sweep.RunFailed) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    def report():
        return write_results(args, argv, train_overrides, plan, budgets, summaries, out_dir)

    try:
        if args.hellaswag_file:
            code, markdown = score_hellaswag(args, plan, summaries, report, out_dir)
        else:
            code, markdown = 0, report()
    except OSError as e:  # a full disk, say: only the tables are missing
        print(f"error: writing the results: {e}; every run is finished and kept, so the same command, rerun, "
              f"writes them without training", file=sys.stderr)
        return 1
    plots = (" and the plots beside them" if frontier.pyplot() else
             f"; matplotlib is not installed, so {skipped_plots(budgets, args.learning_rates)} (pip install matplotlib)")
    if code:  # results.md was written all the same, without the scores: say what else it lacks
        if not frontier.pyplot():
            print(f"wrote {out_dir / 'results.md'}{plots}", file=sys.stderr)
        return code
    print(f"\n{markdown}\nwrote {out_dir / 'results.md'}, {out_dir / 'results.json'}{plots}")
    return 0


if __name__ == "__main__":
    run_script(main, "stopped by Ctrl-C; rerun the same command to continue (finished runs are skipped)")
