"""A grid's runs drawn: what ``report --plot`` writes beside the markdown it prints (and
experiments/harness/curves.py and the grid's W&B summary run use), read through the one
reader of run folders (experiments/harness/runs.py) and the claims' paired tests
(experiments/harness/verdicts.py):

* ``curves``: the validation curves of every cell, one panel per validation metric
  (:func:`~experiments.harness.runs.validation_metrics`), the mean over seeds and a band of
  +- one standard deviation where there are two or more;
* ``gates`` (only when the runs logged the CoDA gate diagnostics, lit_models/diagnostics.py):
  per cell its validation curve beside the cross-attention gate
  ``coda/decoder.<layer>.cross/gate_mean`` over steps, one line per decoder layer;
* ``paper``: per metric and cell the paper's number and ours, the mean with its spread
  over seeds (+- one standard deviation) and each seed;
* ``claims``: per claim the paired difference proposal - baseline with its 95% interval
  (:func:`~experiments.harness.verdicts.claim_results`) against the paper's difference;
* ``tradeoff`` (only for a grid with a ``cost_file``): per claim the paired difference
  against the proposal's step time relative to the baseline's, measured with the models
  taking turns (experiments/harness/interleaved_cost.py), both with their 95% intervals, one panel
  per grid of the experiment that has a cost file (per dataset).

Files: ``<experiment>-<grid>-<config>-<figure>.png`` in the grid's run folder's ``plots/``
(``runs/<experiment>/<grid>-<config>/plots/``) or the folder given.  Cells with nothing to
draw are named on the figure and in the printed text, never silently dropped.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.figure import Figure

from experiments.harness.grid_model import Experiment, Grid, cell_runs, shown_path
from experiments.harness.interleaved_cost import read_cost_file
from experiments.harness.runs import (
    collect,
    curve_metric,
    logged_keys,
    metric_scale,
    metric_steps,
    validation_metrics,
)
from experiments.harness.significance import mean_std
from experiments.harness.verdicts import ClaimResult, claim_labels, claim_results
from fileio import write_atomic
from lit_models.plots import _figure as new_figure

#: the CoDA gate diagnostic of a decoder layer's cross-attention (lit_models/diagnostics.py)
CROSS_GATE = re.compile(r"coda/decoder\.(\d+)\.cross/gate_mean")
#: figure name -> what it shows (the printed list of files)
FIGURES = {"curves": "validation curves (mean, band +- 1 s.d. over seeds)",
           "gates": "CoDA cross-attention gate over steps beside the validation curve",
           "paper": "paper vs ours per cell (mean +- 1 s.d. over seeds, dots: seeds)",
           "claims": "paired difference per claim with its 95% interval vs the paper's",
           "tradeoff": "paired difference to the baseline against the step-time ratio, per "
                       "cell, one panel per dataset (95% intervals)"}


@dataclass
class GridPlots:
    """A grid's figures (name -> Figure, in :data:`FIGURES` order) and what could not be
    drawn (one line each)."""

    figures: dict[str, Figure] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)


def units(grid: Grid, key: str) -> str:
    scale = metric_scale(grid, key)
    return " (%)" if scale == 100 else "" if scale == 1 else f" (x{scale:g})"


def distinct_colour(n: int) -> tuple:
    """The ``n``-th of 20 colours told apart: tab20's strong ones first (matplotlib's default
    cycle, tab10, in its order), then its light ones; a grid of 11 cells (attention_compare)
    would repeat the default cycle's first colour."""
    from matplotlib import colormaps

    n %= 20
    return colormaps["tab20"](2 * n % 20 + 2 * n // 20)


def draw_curve(ax, steps: dict[int, list[float]], label: str, colour=None) -> None:
    """The mean over seeds per step, and +- one standard deviation where seeds > 1."""
    xs = sorted(steps)
    stats = [mean_std(steps[s]) for s in xs]
    means = [m for m, _ in stats]
    (line,) = ax.plot(xs, means, marker="o", markersize=2.5, label=label, color=colour)
    if any(len(steps[s]) > 1 for s in xs):
        ax.fill_between(xs, [m - s for m, s in stats], [m + s for m, s in stats],
                        color=line.get_color(), alpha=0.2, linewidth=0)


def plot_curves(experiment: Experiment, grid: Grid, config: str, root: Path | None = None,
                metrics: dict[str, str] | None = None) -> tuple[Figure, list[str]]:
    """The validation curves of every cell, one panel per metric (default:
    :func:`~experiments.harness.runs.validation_metrics`); and the cells with no value logged."""
    root = experiment.grid_folder(grid, config) if root is None else root
    metrics = validation_metrics(grid) if metrics is None else metrics
    fig = new_figure((6.0 * len(metrics), 4.0))
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    drawn: set[str] = set()
    for ax, (label, key) in zip(axes, metrics.items()):
        for n, cell in enumerate(grid.cells):
            steps = metric_steps(cell_runs(root, cell), key, metric_scale(grid, key))
            if steps:
                draw_curve(ax, steps, cell.name, distinct_colour(n))
                drawn.add(cell.name)
        ax.set_title(key if label == key else f"{label}: {key}")
        ax.set_xlabel("training step")
        ax.set_ylabel(f"{key}{units(grid, key)}")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged by any run", transform=ax.transAxes, ha="center")
    missing = [c.name for c in grid.cells if c.name not in drawn]
    fig.suptitle(_title(experiment, grid.name, config, "validation curves, mean +- 1 s.d. over "
                        "seeds", missing, "no validation logged"), fontsize=10)
    return fig, missing


def gate_runs(experiment: Experiment, grid: Grid, config: str, root: Path | None = None
              ) -> dict[str, dict[int, str]]:
    """cell -> decoder layer -> its cross-attention gate column, for the cells whose runs
    logged the CoDA diagnostics."""
    root = experiment.grid_folder(grid, config) if root is None else root
    found = {}
    for cell in grid.cells:
        keys = {int(m.group(1)): k for k in logged_keys(cell_runs(root, cell))
                if (m := CROSS_GATE.fullmatch(k))}
        if keys:
            found[cell.name] = dict(sorted(keys.items()))
    return found


def plot_gates(experiment: Experiment, grid: Grid, config: str, root: Path | None = None
               ) -> Figure | None:
    """Per cell with gate diagnostics a row: its validation curve (:func:`curve_metric`),
    then the cross-attention gate per decoder layer over steps (mean over seeds); None when
    no run logged them."""
    root = experiment.grid_folder(grid, config) if root is None else root
    gates = gate_runs(experiment, grid, config, root)
    if not gates:
        return None
    key = curve_metric(grid)
    fig = new_figure((11.0, 3.0 * len(gates)))
    rows = fig.subplots(len(gates), 2, squeeze=False, sharex=True)
    for (left, right), (name, layers) in zip(rows, gates.items()):
        runs = cell_runs(root, grid.cell(name))
        steps = metric_steps(runs, key, metric_scale(grid, key))
        if steps:
            draw_curve(left, steps, name)
        left.set_title(f"{name}: {key}")
        left.set_ylabel(f"{key}{units(grid, key)}")
        for layer, column in layers.items():
            draw_curve(right, metric_steps(runs, column), f"decoder layer {layer}")
        right.set_title(f"{name}: cross-attention gate (gate_mean)")
        right.set_ylabel("mean applied gate")
        right.legend(fontsize=8)
        for ax in (left, right):
            ax.set_xlabel("training step")
            ax.grid(alpha=0.3)
    fig.suptitle(f"{experiment.name} {grid.name} ({config}): the CoDA gate over training "
                 f"(coda/decoder.<layer>.cross/gate_mean)", fontsize=10)
    return fig


def plot_paper(experiment: Experiment, grid: Grid, config: str) -> tuple[Figure, list[str]]:
    """Per metric a panel, per cell a row: the paper's number and ours (mean +- 1 s.d. over
    seeds, and each seed); and the cells with no value of any metric."""
    results = collect(experiment, grid, config)
    labels = list(grid.metrics)
    fig = new_figure((5.0 * len(labels), 1.6 + 0.35 * len(grid.cells)))
    axes = fig.subplots(1, len(labels), squeeze=False, sharey=True)[0]
    ys = list(range(len(grid.cells)))[::-1]
    for ax, label in zip(axes, labels):
        for y, cell in zip(ys, grid.cells):
            values = results[cell.name][label]
            paper = cell.paper.get(label)
            if paper is not None:
                ax.plot([paper], [y], "D", color="tab:red", markersize=6,
                        label="paper" if not _has_label(ax, "paper") else None)
            if values:
                m, s = mean_std(values)
                ax.errorbar([m], [y], xerr=[s], fmt="o", color="tab:blue", capsize=3,
                            label="ours (mean +- 1 s.d.)"
                            if not _has_label(ax, "ours (mean +- 1 s.d.)") else None)
                ax.plot(values, [y] * len(values), ".", color="tab:blue", alpha=0.5,
                        label="ours, one seed" if not _has_label(ax, "ours, one seed")
                        else None)
        ax.set_title(label)
        ax.set_xlabel(f"{label}{' (%)' if grid.scale_of(label) == 100 else ''}")
        ax.grid(alpha=0.3, axis="x")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    axes[0].set_yticks(ys, [c.name + ("" if any(results[c.name].values()) else " (not run)")
                            for c in grid.cells])
    missing = [c.name for c in grid.cells if not any(results[c.name].values())]
    fig.suptitle(_title(experiment, grid.name, config, "paper vs ours", missing, "not run"),
                 fontsize=10)
    return fig, missing


@dataclass(frozen=True)
class ClaimBar:
    """One row of a claims figure: its label, the paper's difference and ours with its 95%
    interval (diff, low, high), None where there is none."""

    name: str
    paper: float | None
    ours: tuple[float, float, float] | None


def plot_claims(results: list[ClaimResult], title: str) -> Figure:
    """Per claim (and metric) a row: our paired difference with its 95% interval, the
    paper's difference, the verdict in the label; a claim without a test says why."""
    bars = []
    for r in results:
        c = r.comparison
        if c is not None:
            bars.append(ClaimBar(f"{r.claim} ({r.label}): {r.shown_verdict}, "
                                 f"{c.seeds} x {c.units:,}", r.paper_diff,
                                 (c.diff, c.low, c.high)))
        else:  # the reason's first words ("not run", "no paired test"); the report has the rest
            bars.append(ClaimBar(f"{r.claim} ({r.label}): {re.split(r' [(]|: ', r.why)[0]}",
                                 r.paper_diff, None))
    return plot_claim_bars(bars, title)


def plot_claim_bars(bars: list[ClaimBar], title: str) -> Figure:
    """The claims figure of :func:`plot_claims` (and the claims board's) from its rows."""
    # the labels' width (8 pt: about 0.06 in a character) beside a plot of 4.5 in
    width = 4.5 + 0.06 * max((len(bar.name) for bar in bars), default=0)
    fig = new_figure((width, 1.4 + 0.4 * max(len(bars), 1)))
    ax = fig.subplots()
    ys = list(range(len(bars)))[::-1]
    for y, bar in zip(ys, bars):
        if bar.paper is not None:
            ax.plot([bar.paper], [y], "D", color="tab:red", markersize=6,
                    label="paper" if not _has_label(ax, "paper") else None)
        if bar.ours is not None:
            diff, low, high = bar.ours
            ax.errorbar([diff], [y], xerr=[[diff - low], [high - diff]], fmt="o",
                        color="tab:blue", capsize=3,
                        label="ours [95% CI]" if not _has_label(ax, "ours [95% CI]") else None)
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.set_yticks(ys, [bar.name for bar in bars], fontsize=8)
    ax.set_xlabel("proposal - baseline")
    ax.grid(alpha=0.3, axis="x")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    return fig


def plot_tradeoff(experiment: Experiment, config: str) -> tuple[Figure, list[str]]:
    """Per grid with a ``cost_file`` (a dataset) a panel, per claim a point: the paired
    difference proposal - baseline with its 95% interval (:func:`claim_results`) against the
    proposal's step time over the baseline's, measured with the models taking turns, with its
    95% interval (:func:`read_cost_file`); a proposal has one colour in every panel, its point
    filled where the difference is significant; and the claims with nothing to draw, and
    why."""
    grids = [g for g in experiment.grids.values() if g.cost_file]
    fig = new_figure((5.5 * len(grids) + 1.5, 4.5))
    axes = fig.subplots(1, len(grids), squeeze=False)[0]
    colours: dict[str, tuple] = {}
    missing = []
    for ax, grid in zip(axes, grids):
        costs = read_cost_file(grid) or {}
        short = {c.name: c.name.removeprefix(f"{grid.name}-") for c in grid.cells}
        label = next(iter(claim_labels(grid)), None)  # the first test metric's claims
        for r in (r for r in claim_results(experiment, grid, config) if r.label == label):
            cost = costs.get(r.proposal)
            if r.comparison is None or cost is None or cost.baseline != r.baseline:
                missing.append(f"{r.proposal} ({'not run' if r.comparison is None else 'no cost'})")
                continue
            name = short[r.proposal]
            colour = colours.setdefault(name, distinct_colour(len(colours)))
            c, (x, x_low, x_high) = r.comparison, cost.time_ratio
            ax.errorbar([x], [c.diff], xerr=[[x - x_low], [x_high - x]],
                        yerr=[[c.diff - c.low], [c.high - c.diff]], fmt="o", capsize=3,
                        color=colour, markersize=7,
                        markerfacecolor=colour if c.p_value < 0.05 else "white",
                        label=name if not _has_label(fig.axes[0], name) else None)
            ax.annotate(name, (x, c.diff), fontsize=7, xytext=(4, 4), textcoords="offset points")
        baselines = sorted({short[b] for b, _ in grid.claims})
        ax.plot([1], [0], "s", color="black", label=", ".join(baselines)
                if not _has_label(fig.axes[0], ", ".join(baselines)) else None)
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.axvline(1, color="grey", linewidth=0.8)
        ax.set_title(grid.name, fontsize=10)
        ax.set_xlabel(f"step time / {', '.join(baselines)}'s (interleaved)")
        ax.set_ylabel(f"{label} - {', '.join(baselines)}'s"
                      + (" (points)" if label and grid.scale_of(label) == 100 else ""))
        ax.grid(alpha=0.3)
    if any(ax.get_legend_handles_labels()[0] for ax in axes):
        handles = [h for ax in axes for h in ax.get_legend_handles_labels()[0]]
        fig.legend(handles, [h.get_label() for h in handles], loc="outside right center",
                   fontsize=8, title="filled: p < 0.05", title_fontsize=8)
    what = "paired difference against step-time ratio, 95% intervals"
    fig.suptitle(_title(experiment, " and ".join(g.name for g in grids), config, what, missing,
                        "nothing to draw"), fontsize=10)
    return fig, missing


def grid_plots(experiment: Experiment, grid: Grid, config: str) -> GridPlots:
    """Every figure of the grid that has something to draw, and what is missing."""
    out = GridPlots()
    fig, missing = plot_curves(experiment, grid, config)
    out.figures["curves"] = fig
    if missing:
        out.missing.append(f"curves: no validation logged by {', '.join(missing)}")
    gates = plot_gates(experiment, grid, config)
    if gates is not None:
        out.figures["gates"] = gates
    fig, missing = plot_paper(experiment, grid, config)
    out.figures["paper"] = fig
    if missing:
        out.missing.append(f"paper: not run: {', '.join(missing)}")
    if not grid.claims:
        out.missing.append("claims: the grid names no claim")
    elif not claim_labels(grid):
        out.missing.append("claims: no paired test (no test metric with per-example units)")
    else:
        results = claim_results(experiment, grid, config)
        out.figures["claims"] = plot_claims(
            results, f"{experiment.name} {grid.name} ({config}): does the claimed gain hold?")
        untested = [f"{r.claim} ({r.label})" for r in results if r.comparison is None]
        if untested:
            out.missing.append(f"claims: not tested: {', '.join(untested)}")
    if grid.cost_file:
        fig, missing = plot_tradeoff(experiment, config)
        out.figures["tradeoff"] = fig
        if missing:
            out.missing.append(f"tradeoff: nothing to draw for {', '.join(missing)}")
    return out


def plot_path(folder: Path, experiment: Experiment, grid: Grid, config: str, name: str) -> Path:
    return Path(folder) / f"{experiment.name}-{grid.name}-{config}-{name}.png"


def save_figure(fig: Figure, path: Path) -> Path:
    return write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))


def write_plots(experiment: Experiment, grid: Grid, config: str,
                out: str | Path | None = None) -> str:
    """``report --plot``: the grid's figures as PNGs in ``out`` (default: the grid's run
    folder's ``plots/``); the markdown that names them and what is missing."""
    folder = Path(out) if out else experiment.grid_folder(grid, config) / "plots"
    plots = grid_plots(experiment, grid, config)
    lines = [f"Plots of {experiment.name} grid {grid.name}, config {config} "
             f"({shown_path(folder)}):", ""]
    for name, fig in plots.figures.items():
        path = save_figure(fig, plot_path(folder, experiment, grid, config, name))
        lines.append(f"- {FIGURES[name]}: ![{name}]({shown_path(path)})")
    if plots.missing:
        lines += ["", "Missing: " + "; ".join(plots.missing) + "."]
    return "\n".join(lines)


def _title(experiment: Experiment, grid: str, config: str, what: str, missing: list[str],
           why: str) -> str:
    """A figure's title: the experiment, grid (or grids) and config, what it shows, and the
    cells it could not draw with why."""
    title = f"{experiment.name} {grid} ({config}): {what}"
    return title + ("\n" + textwrap.fill(f"{why}: {', '.join(missing)}", 90) if missing else "")


def _has_label(ax, label: str) -> bool:
    return label in ax.get_legend_handles_labels()[1]
