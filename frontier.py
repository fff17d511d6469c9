"""
What compare.py reports of a finished sweep (sweep.py): a table per size (mean ± std over seeds,
ranks in parentheses, ties marked), each variant at its best learning rate where several were
tried, the fit of val loss against training compute per variant over sizes, the compute each needs
for the reference's loss, the plots, and results.md / results.json. docs/compare.md has the method.
"""

import json
import math
import statistics

import numpy as np

from atomic import write_text_atomic
from sweep import read_log

MIN_COMPUTE_SPAN = 1.25  # a fit of loss on compute needs training FLOPs spanning more than this
FLOOR_MARGIN = 0.01  # a floor E this close (a fraction of the smallest loss) to 0 or to that loss

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
    ("HellaSwag acc", "hellaswag_acc", "high", "{:.4f}"),
    ("HellaSwag acc_norm", "hellaswag_acc_norm", "high", "{:.4f}"),
    ("ms/iter", "mean_ms_per_iter", "low", "{:.1f}"),
    ("tokens/s", "tokens_per_s", "high", "{:,.0f}"),
    ("peak memory (MB)", "peak_memory_mb", "low", "{:,.0f}"),
    ("step time (s)", "step_seconds", "low", "{:.1f}"),
    ("wall time (s)", "wall_time_s", "low", "{:.1f}"),
]
LEGEND = """\
Legend:
- train, val loss: the last evaluation's, over eval_iters batches each
- ms/iter, tokens/s: the mean training step (each process's first step left out)
- step time: iterations x ms/iter (what --match=time budgets); wall time: the whole run
- peak memory: the training process's peak (memory allocated on a GPU, resident memory on CPU)
- HellaSwag: the run's checkpoint, scored
- (1): the best; (2=): level with the variant ranked just above, their means less than 2 standard
  errors of the difference apart over seeds (one seed: ties cannot be told)"""


# -----------------------------------------------------------------------------
# tables

def aggregate(runs):
    """Mean and standard deviation over seeds, per column."""
    table = {}
    for _, key, _, _ in COLUMNS:
        values = [run[key] for run in runs if run.get(key) is not None]
        if values:
            table[key] = loss_stats(values) | {"runs": values}
    return table


def runs_of(summaries, size, variant):
    return [r for r in summaries if r["size"] == size and r["attention"] == variant]


def loss_stats(values):
    return {"mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def rankings(results, key, better):
    """Rank 1 = best; equal values share a rank, as the paper's tables do."""
    means = {v: r[key]["mean"] for v, r in results.items() if key in r}
    ordered = sorted(set(means.values()), reverse=(better == "high"))
    return {v: ordered.index(m) + 1 for v, m in means.items()}


def is_tie(a, b):
    """Whether two means over seeds differ by less than 2 standard errors of their difference;
    never where either has one run, whose spread is unknown."""
    if min(len(a["runs"]), len(b["runs"])) < 2:
        return False
    error = math.sqrt(a["std"] ** 2 / len(a["runs"]) + b["std"] ** 2 / len(b["runs"]))
    return abs(a["mean"] - b["mean"]) < 2 * error


def rank_marks(results, key, better):
    """'2', or '2=' where the variant ties with one ranked just above it."""
    ranks = rankings(results, key, better)
    return {v: f"{rank}" + "=" * any(is_tie(results[v][key], results[u][key])
                                     for u, r in ranks.items() if r == rank - 1)
            for v, rank in ranks.items()}


def mean_cell(stats, fmt):
    return fmt.format(stats["mean"]) + (f" ± {fmt.format(stats['std'])}" if stats["std"] else "")


def markdown_table(results):
    """One row per variant (mean ± std over seeds), each ranked column's rank in parentheses."""
    columns = [c for c in COLUMNS if any(c[1] in r for r in results.values())]
    ranks = {key: rank_marks(results, key, better) for _, key, better, _ in columns if better}
    lines = ["| attention | " + " | ".join(title for title, *_ in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for variant, row in results.items():
        cells = [mean_cell(row[key], fmt) + (f" ({ranks[key][variant]})" if better else "")
                 if key in row else "n/a" for _, key, better, fmt in columns]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# the fit: val loss against training compute, per variant over sizes

def fit_power_law(C, L, E=0.0):
    """A, alpha of L = E + A C^-alpha: a least-squares line through log(L - E) against log C."""
    slope, intercept = np.polyfit(np.log(C), np.log(L - E), 1)
    return math.exp(intercept), float(-slope)


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
    if len(C) < 3:
        return f"{len(C)} size{'s' if len(C) != 1 else ''}; a fit needs 3"
    if max(C) < MIN_COMPUTE_SPAN * min(C):
        return f"every size trained on about the same FLOPs (they span {max(C) / min(C):.2f}x)"
    return None


def fit_loss_curve(C, L):
    """L = E + A C^-alpha from 4 sizes on, the plain power law (E = 0) from 3; else None."""
    C, L = np.asarray(C, dtype=float), np.asarray(L, dtype=float)
    if why_no_fit(C):
        return None
    saturating = len(C) >= 4
    E = fit_floor(C, L) if saturating else 0.0
    A, alpha = fit_power_law(C, L, E)
    margin = FLOOR_MARGIN * float(L.min())  # at an end of its search: the points do not place E
    at_bound = saturating and (E < margin or E > float(L.min()) - margin)
    return {"law": "E + A*C^-alpha" if saturating else "A*C^-alpha", "E": E, "A": A,
            "alpha": alpha, "E_at_bound": bool(at_bound),
            "residuals": (L - E - A * C ** -alpha).tolist(),
            "compute_range": [float(C.min()), float(C.max())]}


def reach(fit, loss):
    """Where the fitted curve reaches `loss`, without extrapolating: ("inside", the compute);
    ("below", the smallest compute) where it is under `loss` there already; ("beyond", the largest)
    where it gets there only past it, or never. None: no fit, or a loss that does not fall."""
    if fit is None or fit["alpha"] <= 0:
        return None
    low, high = fit["compute_range"]
    if loss <= fit["E"]:
        return "beyond", high
    C = (fit["A"] / (loss - fit["E"])) ** (1 / fit["alpha"])
    if C < low * (1 - 1e-9):
        return "below", low
    return ("beyond", high) if C > high * (1 + 1e-9) else ("inside", C)


def variant_points(summaries, variant, labels, x_key="training_flops", seed=None):
    """(x, mean val loss, its std over seeds) per size of one variant; one seed's if given."""
    points = []
    for label in labels:
        rows = [r for r in runs_of(summaries, label, variant)
                if (seed is None or r["seed"] == seed) and r.get("final_val_loss") is not None]
        if rows:
            stats = loss_stats([r["final_val_loss"] for r in rows])
            points.append((statistics.fmean(r[x_key] for r in rows), stats["mean"], stats["std"]))
    return tuple(np.array(column) for column in zip(*points)) if points else (np.array([]),) * 3


def fitted_loss_at_largest(fit):
    return fit["E"] + fit["A"] * fit["compute_range"][1] ** -fit["alpha"]


def analyse(summaries, labels, variants, reference, seeds, target=None):
    """Per variant: the fit over sizes, alpha of each seed's own fit (the interval of a fragile
    fit), and the compute it needs for the target loss, with its ratio to the reference's. The
    target is the reference's fitted loss at its largest size (measured, where it has no fit)."""
    points = {v: variant_points(summaries, v, labels)[:2] for v in variants}
    fits = {v: fit_loss_curve(*points[v]) for v in variants}
    if target is None and fits.get(reference):
        target = fitted_loss_at_largest(fits[reference])
    elif target is None and reference in variants and len(points[reference][1]):
        target = float(points[reference][1][-1])
    reached = {v: None if target is None else reach(fits[v], target) for v in variants}
    ours = reached.get(reference) or (None, None)
    needs = {}
    for v in variants:
        side, compute = reached[v] or (None, None)
        readable = ours[0] == "inside" and side in ("inside", "below")
        ratio = compute / ours[1] if readable else None
        needs[v] = {"reached": side, "compute": compute, "ratio": ratio}
    alphas = {}
    for v in variants:
        per_seed = [fit_loss_curve(*variant_points(summaries, v, labels, seed=s)[:2])
                    for s in range(seeds)] if seeds > 1 else []
        alphas[v] = [fit and fit["alpha"] for fit in per_seed]
    return {"reference": reference, "target_loss": target, "fits": fits,
            "compute_for_target": needs, "alpha_per_seed": alphas,
            "no_fit": {v: why_no_fit(points[v][0]) for v in variants}}


def fit_cell(analysis, variant):
    fit = analysis["fits"][variant]
    if fit is None:
        return f"no fit ({analysis['no_fit'][variant]})"
    floor = f"E={fit['E']:.3f}, " if fit["law"].startswith("E") else ""
    alphas = [a for a in analysis["alpha_per_seed"][variant] if a is not None]
    per_seed = f"; α per seed {min(alphas):.3f}–{max(alphas):.3f}" if len(alphas) > 1 else ""
    rising = fit["alpha"] <= 0
    flags = "; E at its bound" * fit["E_at_bound"] + "; loss rises with compute" * rising
    return (f"{floor}A={fit['A']:.3g}, α={fit['alpha']:.3f} ({fit['law']}){per_seed}{flags}; "
            f"largest residual {max(fit['residuals'], key=abs):+.4f}")


def compute_cells(analysis, variant):
    """The compute for the target loss, and its ratio to the reference's, inside the range."""
    need = analysis["compute_for_target"][variant]
    if need["reached"] == "beyond":
        return "out of range", "out of range"
    if need["compute"] is None:
        return "n/a", "n/a"
    ratio = need["ratio"]
    ratio = "n/a" if ratio is None else f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:.2g}x"
    if need["reached"] == "below":  # its smallest compute bounds what it needs
        bound = "n/a" if ratio == "n/a" else f"< {ratio}"
        return f"below smallest budget (< {need['compute']:.3g})", bound
    return f"{need['compute']:.3g}", ratio


def summary_table(by_size, labels, budgets, analysis, variants, budget_unit):
    """Per variant: the val loss at each size's budget, the fit, the compute for the target."""
    target = analysis["target_loss"]
    target_title = "compute for loss " + (f"{target:.4f}" if target is not None else "(none)")
    sizes = [f"val loss at {size} (budget {budgets[size]:.3g} {budget_unit})" for size in labels]
    lines = ["| attention | " + " | ".join(sizes) + f" | fit of val loss on training FLOPs | "
             f"{target_title} | ratio to {analysis['reference']} |",
             "|---|" + "---:|" * len(labels) + "---|---:|---:|"]
    for variant in variants:
        losses = [by_size[label][variant].get("final_val_loss") for label in labels]
        cells = [mean_cell(stats, "{:.4f}") if stats else "n/a" for stats in losses]
        cells += [fit_cell(analysis, variant), *compute_cells(analysis, variant)]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# learning rates: with --learning_rates, each variant is compared at its best

def losses_by_learning_rate(summaries, label, variant, converged=False):
    """{learning rate: [final val loss of each seed, None where it diverged]}, in ascending order;
    converged: only the rates at which no seed diverged."""
    losses = {}
    for r in sorted(runs_of(summaries, label, variant), key=lambda r: r["learning_rate"]):
        losses.setdefault(r["learning_rate"], []).append(r.get("final_val_loss"))
    return {lr: seeds for lr, seeds in losses.items() if not converged or None not in seeds}


def best_learning_rates(summaries, labels, variants):
    """{(size, variant): the rate with the lowest mean val loss over seeds, among those at which
    no seed diverged}; a variant that diverged at every one has none."""
    best = {}
    for label in labels:
        for variant in variants:
            losses = losses_by_learning_rate(summaries, label, variant, converged=True)
            if losses:
                best[label, variant] = min(losses, key=lambda lr: statistics.fmean(losses[lr]))
    return best


def learning_rate_table(summaries, label, variants, grid, best):
    """Val loss per variant and learning rate at one size, each variant's best in bold; a best at
    an end of the grid is flagged, as the optimum may lie beyond it."""
    lines = ["| attention | " + " | ".join(f"lr {lr:g}" for lr in grid) + " | best |",
             "|---|" + "---:|" * (len(grid) + 1)]
    for variant in variants:
        losses = losses_by_learning_rate(summaries, label, variant)
        chosen = best.get((label, variant))
        cells = []
        for lr in grid:
            seeds = losses.get(lr) or []
            cell = (f"diverged ({seeds.count(None)} of {len(seeds)} seeds)" if None in seeds
                    else mean_cell(loss_stats(seeds), "{:.4f}") if seeds else "n/a")
            cells.append(f"**{cell}**" if lr == chosen else cell)
        edge = " (edge of the grid)" if len(grid) > 1 and chosen in (grid[0], grid[-1]) else ""
        cells.append(f"{chosen:g}{edge}" if chosen else "n/a")
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


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


def loss_axis_top(logs):
    """Above every loss after the first tenth of each run: the losses near initialisation would
    squash the curves that matter."""
    later = []
    for log in logs.values():
        last = max((e["iter"] for e in log if "iter" in e), default=0)
        later += [e["loss"] for e in log if e.get("type") == "train" and e["iter"] >= last / 10]
        later += [e["val_loss"] for e in log if e.get("type") == "eval" and e["iter"] > 0]
    return max(later) + 0.05 * (max(later) - min(later)) + 0.02 if later else None


def save(plt, fig, axes, path):
    for ax in np.ravel(axes):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_losses(plt, logs, path):
    """Train and val loss of every variant against iterations and wall-clock time."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    for i, (variant, log) in enumerate(logs.items()):
        steps = [e for e in log if e.get("type") == "train"]
        evals = [e for e in log if e.get("type") == "eval" and e["iter"] > 0]  # not the first
        for ax, x in zip(axes, ("iter", "elapsed_s")):
            ax.plot([e[x] for e in steps], [e["loss"] for e in steps], f"C{i}", alpha=0.25, lw=0.8)
            ax.plot([e[x] for e in evals], [e["val_loss"] for e in evals], f"C{i}o-", ms=3,
                    label=f"{variant} val")
    axes[0].set_ylim(top=loss_axis_top(logs))
    axes[0].set(xlabel="iteration", ylabel="loss")
    axes[1].set_xlabel("wall-clock seconds")
    axes[1].legend(fontsize=8)
    fig.suptitle("train loss (faint: every logged step) and val loss")
    save(plt, fig, axes, path)


def plot_frontier(plt, summaries, labels, variants, fits, path):
    """Val loss against training FLOPs (with the fits), parameters and wall-clock, a line per
    variant through its sizes (error bars: std over seeds); and the fits' residuals."""
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    views = [(axes[0, 0], "training_flops", "training FLOPs"),
             (axes[0, 1], "n_params", "parameters (total)"),
             (axes[1, 0], "wall_time_s", "wall-clock seconds (this machine)")]
    for i, variant in enumerate(variants):
        for ax, key, _ in views:
            x, loss, std = variant_points(summaries, variant, labels, key)
            ax.errorbar(x, loss, yerr=std, fmt=f"C{i}o-", ms=4, capsize=3, label=variant)
        fit = fits[variant]
        if fit is not None:
            C = np.geomspace(*fit["compute_range"], 100)
            axes[0, 0].plot(C, fit["E"] + fit["A"] * C ** -fit["alpha"], color=f"C{i}", ls="--")
            axes[1, 1].plot(variant_points(summaries, variant, labels)[0], fit["residuals"],
                            color=f"C{i}", marker="o", label=variant)
    for ax, _, xlabel in [*views, (axes[1, 1], None, "training FLOPs")]:
        ax.set(xscale="log", xlabel=xlabel, ylabel="val loss")
        ax.legend(fontsize=8)
    axes[1, 1].set_ylabel("val loss - fit")
    fig.suptitle("val loss per variant through its sizes (dashed: fit of loss on training FLOPs)")
    save(plt, fig, axes, path)


def plot_learning_rates(plt, summaries, labels, variants, best, path):
    """Val loss against the peak learning rate, a panel per size and a line per variant (diverged
    rates left out), each variant's chosen rate ringed."""
    grid = sorted({r["learning_rate"] for r in summaries})
    fig, axes = plt.subplots(1, len(labels), figsize=(max(6.5, 4.5 * len(labels)), 4.2),
                             squeeze=False)
    for ax, label in zip(axes[0], labels):
        for i, variant in enumerate(variants):
            losses = losses_by_learning_rate(summaries, label, variant, converged=True)
            stats = {lr: loss_stats(seeds) for lr, seeds in losses.items()}
            ax.errorbar(list(stats), [s["mean"] for s in stats.values()], color=f"C{i}",
                        yerr=[s["std"] for s in stats.values()], marker="o", ms=4, capsize=3,
                        label=variant)
            if (label, variant) in best:
                chosen = best[label, variant]
                ax.plot(chosen, stats[chosen]["mean"], "o", ms=11, mfc="none", color=f"C{i}")
        ax.set(xscale="log", title=label, xlabel="peak learning rate")
        ax.set_xticks(grid, [f"{lr:g}" for lr in grid])
        ax.minorticks_off()
    axes[0, 0].set_ylabel("val loss")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle("val loss against the peak learning rate (ringed: each variant's best)")
    save(plt, fig, axes, path)


# -----------------------------------------------------------------------------
# the report

def write_report(out_dir, header, plan, budgets, summaries, *, variants, reference, seeds, extra,
                 budget_unit="training FLOPs"):
    """results.md (the learning rates where several were tried, a table per size, the summary with
    the fit, the legend), results.json, and with matplotlib loss.png (the largest size's first
    seed), frontier.png (several sizes) and learning_rates.png; returns the markdown."""
    labels, every_run, every_planned = list(budgets), summaries, [run.as_dict() for run in plan]
    sections, best = [header], {}
    grid = sorted({r["learning_rate"] for r in summaries if "learning_rate" in r})
    if grid:  # from here on, each variant at its best rate per size
        best = best_learning_rates(summaries, labels, variants)
        tables = [f"### {label}\n\n{learning_rate_table(summaries, label, variants, grid, best)}"
                  for label in labels]
        sections.append("## Learning rates\n\nFinal val loss at each peak learning rate (min_lr "
                        "at the config's ratio to it); every later table takes each variant at "
                        "its best rate (bold).\n\n" + "\n\n".join(tables))
        summaries = [r for r in summaries
                     if r["learning_rate"] == best.get((r["size"], r["attention"]))]
        plan = [run for run in plan if run.learning_rate == best.get((run.size, run.variant))]
    by_size = {size: {v: aggregate(runs_of(summaries, size, v)) for v in variants}
               for size in labels}
    analysis = analyse(summaries, labels, variants, reference, seeds)
    sections += [f"## {label}\n\n{markdown_table(by_size[label])}" for label in labels]
    if len(labels) > 1:
        summary = summary_table(by_size, labels, budgets, analysis, variants, budget_unit)
        sections.append(f"## Summary\n\n{summary}")
    markdown = "\n\n".join([*sections, LEGEND]) + "\n"
    write_text_atomic(out_dir / "results.md", markdown)
    best_json = {label: {v: lr for (size, v), lr in best.items() if size == label}
                 for label in labels}
    write_text_atomic(out_dir / "results.json", json.dumps(
        {**extra, "budgets": budgets, "budget_unit": budget_unit, "plan": every_planned,
         "results": by_size, "analysis": analysis, "runs": every_run,
         "best_learning_rates": best_json if best else None}, indent=2, default=str))
    plt = pyplot()
    if plt is None:
        return markdown
    largest = [run for run in plan if run.size == labels[-1] and run.seed == 0]
    if largest:
        logs = {run.variant: read_log(run.run_dir) for run in largest}
        plot_losses(plt, logs, out_dir / "loss.png")
    if len(labels) > 1:
        plot_frontier(plt, summaries, labels, variants, analysis["fits"], out_dir / "frontier.png")
    if best:
        plot_learning_rates(plt, every_run, labels, variants, best, out_dir / "learning_rates.png")
    return markdown
