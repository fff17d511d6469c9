"""
What compare.py reports of a finished sweep (sweep.py): a table per size (mean ± std over seeds,
ranks in parentheses, ties marked), each variant at its best learning rate where several were tried,
the fit of val loss against training compute per variant over sizes (with alpha's range over seeds)
and the compute each needs for a target loss, the plots of the frontier, and results.md /
results.json. docs/compare.md has the method.

Parameters are the total count (embeddings included, the tied head once), as the FLOP count
includes the output head.
"""

import json
import math
import statistics
from collections import Counter

import numpy as np

from atomic import write_text_atomic
from runlog import setup_of
from sweep import read_log

MIN_COMPUTE_SPAN = 1.25  # a fit of loss on compute needs sizes whose training FLOPs differ by more than this factor
# A floor E closer than this fraction of the smallest loss to either end of its search, 0 or that loss, is at its
# bound: the points do not place it, and alpha trades off with it (0.02 at a loss of 2, about two seed spreads)
FLOOR_BOUND_MARGIN = 0.01


# -----------------------------------------------------------------------------
# tables

# (column, key in a run's summary, better: "low" / "high" / None for no ranking, format)
COLUMNS = [
    ("attn params/layer", "attention_params", "low", "{:,.0f}"),
    ("model params", "n_params", "low", "{:,.0f}"),
    ("FLOPs/token", "flops_per_token", "low", "{:,.0f}"),
    ("learning rate", "learning_rate", None, "{:g}"),  # the best of a --learning_rates sweep
    ("iterations", "iterations", None, "{:,.0f}"),
    ("tokens", "tokens", None, "{:,.0f}"),
    ("training FLOPs", "training_flops", None, "{:.3g}"),
    ("train loss", "final_train_loss", "low", "{:.4f}"),
    ("val loss", "final_val_loss", "low", "{:.4f}"),
    ("val ppl", "val_ppl", "low", "{:.2f}"),
    ("HellaSwag acc", "hellaswag_acc", "high", "{:.4f}"),
    ("HellaSwag acc_norm", "hellaswag_acc_norm", "high", "{:.4f}"),
    ("HellaSwag acc_char_norm", "hellaswag_acc_char_norm", "high", "{:.4f}"),
    ("HellaSwag of iteration", "hellaswag_iter", None, "{:,.0f}"),  # the checkpoint scored: last, or best val
    ("ms/iter", "mean_ms_per_iter", "low", "{:.1f}"),
    ("tokens/s", "tokens_per_s", "high", "{:,.0f}"),
    ("peak memory (MB)", "peak_memory_mb", "low", "{:,.0f}"),
    ("step time (s)", "step_seconds", "low", "{:.1f}"),  # what --match=time budgets: iterations x ms/iter
    ("wall time (s)", "wall_time_s", "low", "{:.1f}"),
]


def aggregate(runs):
    """Mean and standard deviation over seeds, per column."""
    table = {}
    for _, key, _, _ in COLUMNS:
        values = [run[key] for run in runs if run.get(key) is not None]
        if values:
            table[key] = {"mean": statistics.fmean(values),
                          "std": statistics.stdev(values) if len(values) > 1 else 0.0, "runs": values}
    return table


def rankings(results, key, better):
    """Rank 1 = best; equal values share a rank, as the paper's tables do."""
    means = {v: r[key]["mean"] for v, r in results.items() if key in r}
    ordered = sorted(set(means.values()), reverse=(better == "high"))
    return {v: ordered.index(m) + 1 for v, m in means.items()}


def is_tie(a, b):
    """Whether two means over seeds differ by less than 2 standard errors of their difference, so
    that the seeds cannot order them. Never where either has one run: its spread is unknown."""
    if min(len(a["runs"]), len(b["runs"])) < 2:
        return False
    standard_error = math.sqrt(a["std"] ** 2 / len(a["runs"]) + b["std"] ** 2 / len(b["runs"]))
    return abs(a["mean"] - b["mean"]) < 2 * standard_error


def rank_marks(results, key, better):
    """Each variant's rank as shown: '2', or '2=' where it ties with a variant ranked just above it. A
    chain 1, 2=, 3= says each is level with its neighbour, which need not make the first and last level."""
    ranks = rankings(results, key, better)
    marks = {}
    for variant, rank in ranks.items():
        tied = any(is_tie(results[variant][key], results[v][key]) for v, r in ranks.items() if r == rank - 1)
        marks[variant] = f"{rank}=" if tied else f"{rank}"
    return marks


def rank_note(n_seeds):
    """The line under each table that says how to read its ranks."""
    if n_seeds < 2:
        return ("One seed: the ranks order single runs; with no spread over seeds to compare a difference "
                "with, ties cannot be told.")
    return ("(2=): tied with the variant ranked just above it: their means differ by less than 2 standard errors "
            "of the difference, √(sd₁²/n₁ + sd₂²/n₂) over seeds.")


def loss_stats(losses):
    return {"mean": statistics.fmean(losses), "std": statistics.stdev(losses) if len(losses) > 1 else 0.0}


def mean_cell(stats, fmt, n_seeds):
    cell = fmt.format(stats["mean"])
    return cell + (" ± " + fmt.format(stats["std"]) if n_seeds > 1 and stats["std"] > 0 else "")


def markdown_table(results, n_seeds):
    """One row per variant (mean ± std over seeds), each ranked column's rank in parentheses (2= a tie)."""
    columns = [c for c in COLUMNS if any(c[1] in r for r in results.values())]
    ranks = {key: rank_marks(results, key, better) for _, key, better, _ in columns if better}
    lines = ["| attention | " + " | ".join(title for title, *_ in columns) + " |", "|---|" + "---:|" * len(columns)]
    for variant, row in results.items():
        cells = [mean_cell(row[key], fmt, n_seeds) + (f" ({ranks[key][variant]})" if better else "")
                 if key in row else "n/a" for _, key, better, fmt in columns]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# the fit: loss against training compute, per variant over sizes

def fit_power_law(C, L, E=0.0):
    """A, alpha of L = E + A * C^-alpha from a least-squares line through log(L - E) against log C."""
    slope, intercept = np.polyfit(np.log(C), np.log(L - E), 1)
    return math.exp(intercept), -slope


def squared_residuals(C, L, E):
    A, alpha = fit_power_law(C, L, E)
    return float(np.sum((L - E - A * C ** -alpha) ** 2))


def fit_floor(C, L, grid_points=200, refinements=80):
    """The E in [0, min L) that minimises the squared residuals in L: a grid, then golden-section
    search between the grid points either side of the best one."""
    top = float(L.min()) * (1 - 1e-9)
    grid = np.linspace(0.0, top, grid_points, endpoint=False)
    best = int(np.argmin([squared_residuals(C, L, E) for E in grid]))
    lo, hi = grid[max(best - 1, 0)], grid[best + 1] if best + 1 < grid_points else top
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(refinements):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if squared_residuals(C, L, a) < squared_residuals(C, L, b):
            hi = b
        else:
            lo = a
    return (lo + hi) / 2


def why_no_fit(C):
    """Why val loss cannot be fitted against these per-size training FLOPs of one variant, or None."""
    if len(C) < 3:
        return f"{len(C)} size{'s' if len(C) != 1 else ''}; a fit needs 3"
    if max(C) < MIN_COMPUTE_SPAN * min(C):
        return (f"every size trained on about the same FLOPs (they span {max(C) / min(C):.2f}x): a profile at one "
                f"budget, not a curve")
    return None


def floor_bound(E, L):
    """Which end of fit_floor's search [0, min L) the fitted E sits at: "0", "smallest loss", or None
    where it lies inside, placed by the data."""
    margin = FLOOR_BOUND_MARGIN * float(L.min())
    if E < margin:
        return "0"
    return "smallest loss" if E > float(L.min()) - margin else None


def fit_loss_curve(C, L):
    """Saturating power law L = E + A C^-alpha from 4 points on, the plain power law (E = 0) from 3;
    None where why_no_fit says why not. C and L are per-size values of one variant."""
    C, L = np.asarray(C, dtype=float), np.asarray(L, dtype=float)
    if why_no_fit(C):
        return None
    E = fit_floor(C, L) if len(C) >= 4 else 0.0
    A, alpha = fit_power_law(C, L, E)
    residuals = L - (E + A * C ** -alpha)
    return {"law": "E + A*C^-alpha" if len(C) >= 4 else "A*C^-alpha", "E": E, "A": A, "alpha": alpha,
            "E_at_bound": floor_bound(E, L) if len(C) >= 4 else None,  # the plain law sets E = 0, not a search
            "residuals": residuals.tolist(), "compute_range": [float(C.min()), float(C.max())]}


def reach(fit, loss):
    """Where the fitted curve reaches `loss`, without extrapolating: ("inside", the compute) within the
    measured range; ("below", the smallest compute) where the curve is under `loss` already there;
    ("beyond", the largest compute) where it gets there only past the largest, or never (loss <= E).
    None where the loss does not fall with compute (no fit, or alpha <= 0)."""
    if fit is None or fit["alpha"] <= 0:
        return None
    low, high = fit["compute_range"]
    if loss <= fit["E"]:
        return "beyond", high
    C = (fit["A"] / (loss - fit["E"])) ** (1 / fit["alpha"])
    if C < low * (1 - 1e-9):
        return "below", low
    if C > high * (1 + 1e-9):
        return "beyond", high
    return "inside", C


def variant_points(summaries, variant, labels, x_key, seed=None):
    """(x, mean val loss, its std over seeds) per size of one variant, in size order; one seed's if given."""
    points = []
    for label in labels:
        rows = [r for r in summaries if r["attention"] == variant and r["size"] == label
                and (seed is None or r["seed"] == seed) and r.get("final_val_loss") is not None]
        if rows:
            losses = [r["final_val_loss"] for r in rows]
            points.append((statistics.fmean(r[x_key] for r in rows), statistics.fmean(losses),
                           statistics.stdev(losses) if len(losses) > 1 else 0.0))
    return tuple(np.array(column) for column in zip(*points)) if points else (np.array([]),) * 3


def fits_per_seed(summaries, labels, variant, seeds):
    """The fit of each seed's own losses against training FLOPs (None where that seed has none)."""
    return [fit_loss_curve(*variant_points(summaries, variant, labels, "training_flops", seed)[:2])
            for seed in range(seeds)]


def alphas_per_seed(summaries, labels, variant, seeds):
    """Alpha of each seed's own fit, None where that seed has none: with 3-5 points the fit of the mean
    is fragile, and their range is its interval."""
    return [None if fit is None else fit["alpha"] for fit in fits_per_seed(summaries, labels, variant, seeds)]


def fitted_loss_at_largest(fit):
    return fit["E"] + fit["A"] * fit["compute_range"][1] ** -fit["alpha"]


def compute_ratio(summaries, labels, variant, reference, target=None, seed=None):
    """C_variant(target) / C_reference(target) from the fitted curves, as (ratio, None, "inside") where both
    reach the target inside their measured range; (None, bound, "below") where the variant reaches it below
    its smallest compute and the ratio is less than bound = that compute / the reference's; (None, None,
    "beyond") where it reaches it only past its largest; (None, None, None) where there is nothing to read
    (no fit of either, a loss that does not fall, or the reference's curve off its range at the target).
    No target: the reference's fitted loss at its largest size (of this seed's curve)."""
    fits = [fit_loss_curve(*variant_points(summaries, v, labels, "training_flops", seed)[:2]) for v in (variant, reference)]
    if target is None and fits[1] is not None:
        target = fitted_loss_at_largest(fits[1])
    mine, theirs = (reach(fit, target) if target is not None else None for fit in fits)
    if mine is None or theirs is None or theirs[0] != "inside":
        return None, None, None
    if mine[0] == "beyond":
        return None, None, "beyond"
    ratio = mine[1] / theirs[1]
    return (ratio, None, "inside") if mine[0] == "inside" else (None, ratio, "below")


def analyse(summaries, labels, variants, reference, seeds, target=None):
    """Per variant: the fit of val loss against training FLOPs over sizes, and the compute it needs for
    the target loss as a ratio to the reference's. The default target is the reference's loss at its
    largest size as its fitted curve gives it (so the reference needs exactly its largest budget; its
    measured loss there, off the curve by a residual, could fall outside the range), or the measured
    loss when there is no fit."""
    points = {v: variant_points(summaries, v, labels, "training_flops")[:2] for v in variants}
    fits = {v: fit_loss_curve(*points[v]) for v in variants}
    per_seed_target = target  # None: each seed's own reference curve sets its target
    if target is None and fits.get(reference):
        target = fitted_loss_at_largest(fits[reference])
    elif target is None:
        reference_losses = variant_points(summaries, reference, labels, "training_flops")[1]
        target = float(reference_losses[-1]) if len(reference_losses) else None
    needs = {}
    for variant in variants:
        side, compute = (None if target is None else reach(fits[variant], target)) or (None, None)
        # "ratio": the exact ratio; "ratio_below": a bound on it, where the variant reaches the target
        # below its smallest compute ("ratio" < "ratio_below"); None where there is neither
        needs[variant] = {"reached": side, "compute": compute if side == "inside" else None, "ratio": None,
                          "ratio_below": None, "ratio_per_seed": [], "ratio_below_per_seed": [], "reached_per_seed": []}
        if target is not None and reference in variants:
            needs[variant]["ratio"], needs[variant]["ratio_below"], _ = compute_ratio(summaries, labels, variant,
                                                                                      reference, target)
            per_seed = [compute_ratio(summaries, labels, variant, reference, per_seed_target, seed)
                        for seed in range(seeds)]
            needs[variant]["ratio_per_seed"] = [ratio for ratio, _, _ in per_seed]
            needs[variant]["ratio_below_per_seed"] = [below for _, below, _ in per_seed]
            # "beyond" is "out of range"; None is no reading at all (that seed's curve does not fall, say)
            needs[variant]["reached_per_seed"] = [side for _, _, side in per_seed]
    alphas = {v: alphas_per_seed(summaries, labels, v, seeds) if fits[v] and seeds > 1 else [] for v in variants}
    return {"reference": reference, "target_loss": target,
            "target_loss_per_seed": seed_targets(summaries, labels, reference, seeds, per_seed_target)
            if target is not None and reference in variants else [], "fits": fits, "compute_for_target": needs,
            "no_fit": {v: why_no_fit(points[v][0]) for v in variants}, "alpha_per_seed": alphas,
            "alpha_range": {v: alpha_range(alphas[v]) for v in variants}}


def seed_targets(summaries, labels, reference, seeds, target=None):
    """The loss each seed's ratio is read at: the given target, or that seed's reference curve's fitted loss
    at its largest size (None where that seed's reference has no fit)."""
    return [target if target is not None else fit and fitted_loss_at_largest(fit)
            for fit in fits_per_seed(summaries, labels, reference, seeds)]


def alpha_range(alphas):
    """[lowest, highest] of the seeds' alphas, where 2 or more seeds have a fit; else None."""
    known = [alpha for alpha in alphas if alpha is not None]
    return [min(known), max(known)] if len(known) > 1 else None


def fit_cell(analysis, variant):
    fit = analysis["fits"][variant]
    if fit is None:
        return f"no fit ({analysis['no_fit'][variant]})"
    floor = f"E={fit['E']:.3f}, " if fit["law"].startswith("E") else ""
    spread, bound = analysis["alpha_range"][variant], fit["E_at_bound"]
    per_seed = f"; α per seed {spread[0]:.3f}–{spread[1]:.3f}" if spread else ""
    at_bound = f"; E at its bound ({bound})" if bound else ""
    rising = "; loss rises with compute" if fit["alpha"] <= 0 else ""
    return (f"{floor}A={fit['A']:.3g}, α={fit['alpha']:.3f} ({fit['law']}){per_seed}{at_bound}; "
            f"largest residual {max(fit['residuals'], key=abs):+.4f}{rising}")


def fit_notes(analysis, variants):
    """The lines under the summary that say how to read its fit cells, where they need it."""
    fits = [analysis["fits"][v] for v in variants if analysis["fits"][v]]
    notes = []
    if any(analysis["alpha_range"][v] for v in variants):
        notes.append("α per seed: the lowest and highest α of the fits of each seed's losses alone.")
    targets, target = analysis["target_loss_per_seed"], analysis["target_loss"]
    if len(targets) > 1 and any(t is not None and t != target for t in targets):
        losses = ", ".join("n/a" if t is None else f"{t:.4f}" for t in targets)
        notes.append(f"Ratio per seed: each seed's own curves, read at that seed's own target (its "
                     f"{analysis['reference']} curve's loss at the largest size: {losses}), not at {target:.4f}.")
    if any(fit["E_at_bound"] for fit in fits):
        notes.append("E at its bound: the fitted floor lies at an end of its search (0, or just under the smallest "
                     "loss), so these points do not place E, and α moves with it: read the curve, not E and α.")
    return notes


def no_compute_reason(analysis, variant):
    """Why a variant's compute for the target loss is not known for a reason other than lying outside
    its measured range, or None."""
    fit = analysis["fits"].get(variant)
    if analysis["target_loss"] is None:
        return f"n/a: no {analysis['reference']} run sets the target"
    if fit is None:
        return f"n/a: no fit of {variant}"
    if fit["alpha"] <= 0:
        return f"n/a: {variant}'s loss rises with compute"
    return None


BELOW_SMALLEST = "below smallest budget"  # the target reached before the smallest measured compute
BEYOND_LARGEST = "out of range"  # the target reached only past the largest measured compute, or never


def compute_cell(analysis, variant):
    need = analysis["compute_for_target"][variant]
    if need["compute"] is not None:
        return f"{need['compute']:.3g}"
    if need["reached"] == "below":  # its smallest size's compute bounds what it needs
        smallest = analysis["fits"][variant]["compute_range"][0]
        return f"{BELOW_SMALLEST} (< {smallest:.3g})"
    return no_compute_reason(analysis, variant) or BEYOND_LARGEST


def times(ratio):
    return f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:.2g}x"  # 0.0031x, not 0.00x


def ratio_text(ratio, below, reached="beyond"):
    if ratio is not None:
        return times(ratio)
    if below is not None:
        return f"< {times(below)}"
    return BEYOND_LARGEST if reached == "beyond" else "n/a"


def ratio_cell(analysis, variant):
    need, reference = analysis["compute_for_target"][variant], analysis["reference"]
    if need["ratio"] is None and need["ratio_below"] is None:
        reason = no_compute_reason(analysis, variant) or no_compute_reason(analysis, reference)
        if not reason and analysis["compute_for_target"][reference]["reached"] != "inside":  # a target given
            reason = f"n/a: {reference}'s curve reaches the target outside its measured range"
        if reason:
            return reason
    # out of range too keeps its seeds' readings: where the fit of the mean is least sure, they may differ
    cell = ratio_text(need["ratio"], need["ratio_below"])
    cell += f" ({BELOW_SMALLEST})" if need["ratio_below"] is not None else ""
    seeds = [ratio_text(*reading) for reading in zip(need["ratio_per_seed"], need["ratio_below_per_seed"],
                                                     need["reached_per_seed"])]
    return cell + (f" (per seed: {', '.join(seeds)})" if len(seeds) > 1 else "")


def summary_table(summaries, labels, budgets, analysis, variants, n_seeds, budget_unit=""):
    """Per variant: the val loss at every size's budget (in budget_unit: iterations, tokens, training FLOPs
    or seconds, as --match set it), the fit, and the compute for the target loss; under it, how to read
    the fit cells where they need it."""
    target, reference = analysis["target_loss"], analysis["reference"]
    target_title = "compute for loss " + (f"{target:.4f}" if target is not None else "(none)")
    unit = f" {budget_unit}" if budget_unit else ""
    lines = ["| attention | " + " | ".join(f"val loss at {label} (budget {budgets[label]:.3g}{unit})"
                                          for label in labels)
             + f" | fit of val loss on training FLOPs | {target_title} | ratio to {reference} |",
             "|---|" + "---:|" * len(labels) + "---|---:|---:|"]
    for variant in variants:
        cells = []
        for label in labels:
            rows = [r["final_val_loss"] for r in summaries if r["attention"] == variant and r["size"] == label]
            cells.append(mean_cell(loss_stats(rows), "{:.4f}", n_seeds) if rows else "n/a")
        cells += [fit_cell(analysis, variant), compute_cell(analysis, variant), ratio_cell(analysis, variant)]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n\n".join(["\n".join(lines)] + fit_notes(analysis, variants))


# -----------------------------------------------------------------------------
# learning rates: with --learning_rates, each variant is compared at its best

def val_losses_by_learning_rate(summaries, label, variant):
    """{learning rate: [final val loss of each seed, None where it diverged]} of one variant at one size."""
    losses = {}
    for r in summaries:
        if r["size"] == label and r["attention"] == variant:
            losses.setdefault(r["learning_rate"], []).append(r.get("final_val_loss"))
    return losses


def converged_losses_by_learning_rate(summaries, label, variant):
    """The same, in ascending order of learning rate, without the rates at which any seed diverged."""
    losses = val_losses_by_learning_rate(summaries, label, variant)
    return {lr: losses[lr] for lr in sorted(losses) if None not in losses[lr]}


def best_learning_rates(summaries, labels, variants):
    """{(size, variant): the learning rate with the lowest val loss, mean over seeds}, among those at
    which no seed diverged; a variant that diverged at every one has none."""
    best = {}
    for label, variant in ((label, variant) for label in labels for variant in variants):
        losses = converged_losses_by_learning_rate(summaries, label, variant)
        if losses:
            best[label, variant] = min(losses, key=lambda lr: statistics.fmean(losses[lr]))
    return best


def learning_rate_table(summaries, label, variants, grid, best, n_seeds):
    """Val loss per variant (rows) and learning rate (columns) at one size, each variant's best in bold;
    a best at either end of the grid is flagged, as the optimum may lie beyond it."""
    lines = ["| attention | " + " | ".join(f"lr {lr:g}" for lr in grid) + " | best |",
             "|---|" + "---:|" * (len(grid) + 1)]
    for variant in variants:
        losses, chosen = val_losses_by_learning_rate(summaries, label, variant), best.get((label, variant))
        cells = [learning_rate_cell(losses.get(lr), n_seeds) for lr in grid]
        cells = [f"**{cell}**" if lr == chosen else cell for lr, cell in zip(grid, cells)]
        edge = " (edge of the grid)" if len(grid) > 1 and chosen in (grid[0], grid[-1]) else ""
        cells.append(f"{chosen:g}{edge}" if chosen else "n/a")
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def learning_rate_cell(losses, n_seeds):
    if not losses:
        return "n/a"
    if None in losses:
        return f"diverged ({losses.count(None)} of {len(losses)} seeds)" if len(losses) > 1 else "diverged"
    return mean_cell(loss_stats(losses), "{:.4f}", n_seeds)


def keep_best_learning_rates(summaries, plan, labels, variants, n_seeds):
    """With a --learning_rates sweep: the report's section of val loss per learning rate, and the summaries
    and plan cut to each variant's best learning rate at each size, which the tables, the fit and the
    plots then compare. Without a sweep: no section, and everything as it was."""
    grid = sorted({r["learning_rate"] for r in summaries if "learning_rate" in r})
    if not grid:
        return None, summaries, plan, {}
    best = best_learning_rates(summaries, labels, variants)
    tables = "\n\n".join(f"### {label}\n\n{learning_rate_table(summaries, label, variants, grid, best, n_seeds)}"
                          for label in labels)
    section = ("## Learning rates\n\nFinal val loss at each peak learning rate (min_lr at the config's ratio to "
               "it). Every table after this one compares each variant at its best learning rate for that size "
               "(bold), the lowest mean val loss over seeds.\n\n" + tables)
    summaries = [r for r in summaries if r["learning_rate"] == best.get((r["size"], r["attention"]))]
    plan = [run for run in plan if run.learning_rate == best.get((run.size, run.variant))]
    return section, summaries, plan, best


# -----------------------------------------------------------------------------
# plots (matplotlib is optional)

def pyplot():
    """matplotlib.pyplot on a file backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot_losses(plt, logs, path):
    """Train and val loss of every variant against iterations and wall-clock time (first seed)."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    for i, (variant, log) in enumerate(logs.items()):
        color = f"C{i}"
        train_steps = [e for e in log if e.get("type") == "train"]
        # not the evaluation at initialisation (~ln(vocab)): a run evaluated only there and at its end
        # would draw a straight line between the two, which no run followed
        evals = [e for e in log if e.get("type") == "eval" and e["iter"] > 0]
        for ax, x in zip(axes, ("iter", "elapsed_s")):
            ax.plot([e[x] for e in train_steps], [e["loss"] for e in train_steps], color=color, alpha=0.25, lw=0.8)
            ax.plot([e[x] for e in evals], [e["val_loss"] for e in evals], color=color, marker="o", ms=3,
                    label=f"{variant} val")
            ax.plot([e[x] for e in evals], [e["train_loss"] for e in evals], color=color, ls="--", lw=1,
                    marker="x", ms=3, label=f"{variant} train (eval)")
    top = loss_axis_top(logs)
    if top is not None:
        axes[0].set_ylim(top=top)
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


def loss_axis_top(logs):
    """The top of the loss axis: above every loss after the first tenth of each run, where the losses
    near initialisation would squash the curves that matter."""
    later = []
    for log in logs.values():
        last_iter = max((e["iter"] for e in log if "iter" in e), default=0)
        for e in log:
            if e.get("type") == "train" and e["iter"] >= last_iter / 10:
                later.append(e["loss"])
            elif e.get("type") == "eval" and e["iter"] > 0:
                later.append(e["val_loss"])
    if not later:
        return None
    return max(later) + 0.05 * (max(later) - min(later)) + 0.02


def label_log_axis(ax):
    """A log x axis labelled 200k, 500k, 1M: SI prefixes at 1, 2, 3 and 5 of each decade, decades alone
    on a long axis, evenly spaced values on a short one (under a factor of 4, where a log axis is nearly
    linear). matplotlib's own labels of an axis spanning about one decade, 3x10^12 beside 4x10^12, run
    into each other."""
    from matplotlib.ticker import EngFormatter, LogLocator, MaxNLocator, NullFormatter

    ax.set_xscale("log")
    low, high = ax.get_xlim()
    decades = math.log10(high / low)
    if decades < 0.6:
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5, steps=(1, 2, 5, 10)))
    else:
        ax.xaxis.set_major_locator(LogLocator(subs=(1, 2, 3, 5) if decades < 2 else (1,)))
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.xaxis.set_minor_formatter(NullFormatter())


def plot_frontier(plt, summaries, labels, variants, fits, path):
    """Val loss against training FLOPs (with the fits), parameters and wall-clock, one line per variant
    through its sizes (error bars: std over seeds); and the fits' residuals."""
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    views = [(axes[0, 0], "training_flops", "training FLOPs"), (axes[0, 1], "n_params", "parameters (total)"),
             (axes[1, 0], "wall_time_s", "wall-clock seconds (this machine)")]
    for i, variant in enumerate(variants):
        for ax, key, _ in views:
            x, loss, std = variant_points(summaries, variant, labels, key)
            ax.errorbar(x, loss, yerr=std, color=f"C{i}", marker="o", ms=4, capsize=3, label=variant)
        fit = fits[variant]
        if fit is not None:
            C = np.geomspace(*fit["compute_range"], 100)
            axes[0, 0].plot(C, fit["E"] + fit["A"] * C ** -fit["alpha"], color=f"C{i}", ls="--", lw=1)
            x = variant_points(summaries, variant, labels, "training_flops")[0]
            axes[1, 1].plot(x, fit["residuals"], color=f"C{i}", marker="o", label=variant)
    for ax, _, xlabel in views:
        label_log_axis(ax)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("val loss")
    label_log_axis(axes[1, 1])
    axes[1, 1].axhline(0, color="grey", lw=0.8)
    axes[1, 1].set_xlabel("training FLOPs")
    axes[1, 1].set_ylabel("val loss - fit")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle("val loss per variant through its sizes (dashed: fit of loss on training FLOPs)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_learning_rates(plt, summaries, labels, variants, best, path):
    """Val loss against the peak learning rate, a panel per size and a line per variant (mean over seeds,
    error bars their std; diverged rates left out); each variant's chosen rate ringed."""
    grid = sorted({r["learning_rate"] for r in summaries})
    fig, axes = plt.subplots(1, len(labels), figsize=(max(6.5, 4.5 * len(labels)), 4.2), squeeze=False)
    for ax, label in zip(axes[0], labels):
        for i, variant in enumerate(variants):
            losses = converged_losses_by_learning_rate(summaries, label, variant)
            stats = [loss_stats(seeds) for seeds in losses.values()]
            ax.errorbar(list(losses), [s["mean"] for s in stats], yerr=[s["std"] for s in stats], color=f"C{i}",
                        marker="o", ms=4, capsize=3, label=variant)
            if (label, variant) in best:
                chosen = best[label, variant]
                ax.plot(chosen, loss_stats(losses[chosen])["mean"], "o", ms=11, mfc="none", color=f"C{i}")
        ax.set_xscale("log")
        ax.set_xticks(grid, [f"{lr:g}" for lr in grid])  # the rates tried, as typed
        ax.minorticks_off()
        ax.set_title(label)
        ax.set_xlabel("peak learning rate")
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("val loss")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle("val loss against the peak learning rate (ringed: each variant's best)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -----------------------------------------------------------------------------
# the report

def mixed_setups_note(summaries):
    """A note for runs that trained on different set-ups (a sweep, or one run, resumed on another machine
    or under another --launcher): their losses compare, their speed, time and memory do not. '' if all
    alike. A run's set-ups are its summary's (those of its last process before they were recorded)."""
    counts = Counter(setup for s in summaries for setup in s.get("setups") or [setup_of(s)])
    if len(counts) < 2:
        return ""
    setups = "; ".join(f"{n} on {setup}" for setup, n in counts.items())
    return (f"**Note:** these runs trained on different set-ups ({setups}): their ms/iter, tokens/s, wall time and "
            f"memory do not compare across set-ups, nor do their losses where the dtype differs.")


def write_report(out_dir, header, plan, budgets, summaries, *, variants, reference, seeds, extra, budget_unit=""):
    """results.md (a table per size, then the summary and the fit), results.json, and where matplotlib is
    installed loss.png of the largest size's first seed, frontier.png across sizes and, for a
    --learning_rates sweep, learning_rates.png; returns the markdown.
    budget_unit names what the budgets count, in the summary's titles."""
    labels, every_run, every_planned = list(budgets), summaries, [run.as_dict() for run in plan]
    lr_section, summaries, plan, best_lr = keep_best_learning_rates(summaries, plan, labels, variants, seeds)
    by_size = {label: {v: aggregate([r for r in summaries if r["size"] == label and r["attention"] == v])
                       for v in variants} for label in labels}
    analysis = analyse(summaries, labels, variants, reference, seeds)
    sections = [header] + ([lr_section] if lr_section else [])
    for label in labels:
        sections.append(f"## {label}\n\n{markdown_table(by_size[label], seeds)}\n\n{rank_note(seeds)}")
    if len(labels) > 1:
        summary = summary_table(summaries, labels, budgets, analysis, variants, seeds, budget_unit)
        sections.append(f"## Summary\n\n{summary}")
    markdown = "\n\n".join(sections) + "\n"
    write_text_atomic(out_dir / "results.md", markdown)
    write_text_atomic(out_dir / "results.json", json.dumps(
        {**extra, "budgets": budgets, "plan": every_planned, "results": by_size,
         "analysis": analysis, "runs": every_run,
         "best_learning_rates": {label: {v: lr for (size, v), lr in best_lr.items() if size == label}
                                 for label in labels} if best_lr else None}, indent=2, default=str))
    plt = pyplot()
    if plt is None:  # the tables alone (compare.py says so once, at its end)
        return markdown
    largest = [run for run in plan if run.size == labels[-1] and run.seed == 0]
    if largest:
        plot_losses(plt, {run.variant: read_log(run.run_dir) for run in largest}, out_dir / "loss.png")
    if len(labels) > 1:
        plot_frontier(plt, summaries, labels, variants, analysis["fits"], out_dir / "frontier.png")
    if best_lr:
        plot_learning_rates(plt, every_run, labels, variants, best_lr, out_dir / "learning_rates.png")
    return markdown
