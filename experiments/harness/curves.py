"""Learning curves of a grid as committed data and a plot: the grid's validation metric
(``Grid.curve``, else its first metric's validation counterpart: experiments.harness.runs'
curve_metric) per step and cell, read from the CSV logs like ``report``.

    python -m experiments.curves coda_mlu curve --config curve --out results/coda_mlu_curve

writes ``<out>.csv`` (step, one column per cell: mean over seeds), ``<out>.png`` and
``<out>.md`` (what ``report --curve`` prints: the grid's table, then the curves), and
prints the markdown; when the runs logged the CoDA gate diagnostics, also
``<out>-gates.png`` (experiments/harness/plots.py draws both, as ``report --plot`` does) and, in the
markdown, the cross-attention gate's figures at the first and the last logged step
(:func:`format_gates`).
"""

from __future__ import annotations

import argparse
import csv
import importlib
import io
import os
from pathlib import Path

from experiments.harness.grid_model import Experiment, Grid, cell_runs, shown_path
from experiments.harness.plots import gate_runs, plot_curves, plot_gates, save_figure
from experiments.harness.report import format_curves, format_report
from experiments.harness.runs import curve_metric, learning_curves, metric_steps
from fileio import write_atomic
from lit_models.diagnostics import LABELS

#: the diagnostics' figures of a cross-attention module printed in the gate table -> header
GATE_FIGURES = {f: LABELS[f] for f in ("gate_mean", "gate_shut", "gate_open", "row_sum_abs")}


def format_gates(experiment: Experiment, grid: Grid, config: str) -> str | None:
    """The CoDA cross-attention gate's figures per cell and decoder layer (numbered from 0,
    as in the columns and the gate figure) at the first and the last step its runs logged
    them, mean over the seeds that logged that step; None when no run logged them."""
    root = experiment.grid_folder(grid, config)
    gates = gate_runs(experiment, grid, config, root)
    if not gates:
        return None
    lines = [f"### {grid.title}: the CoDA cross-attention gate, first and last logged step",
             f"{experiment.name} grid {grid.name}, config {config}: coda/decoder.<layer>.cross/"
             "<figure> in metrics.csv, mean over seeds", "",
             "| cell | decoder layer | step | " + " | ".join(GATE_FIGURES.values()) + " |",
             "|---" * (3 + len(GATE_FIGURES)) + "|"]
    for name, layers in gates.items():
        runs = cell_runs(root, grid.cell(name))
        for layer, column in layers.items():
            figures = {f: metric_steps(runs, column.replace("gate_mean", f)) for f in GATE_FIGURES}
            steps = sorted(figures["gate_mean"])
            for step in dict.fromkeys((steps[0], steps[-1])):
                values = [figures[f].get(step) for f in GATE_FIGURES]
                lines.append(f"| {name} | {layer} | {step} | " + " | ".join(
                    f"{sum(v) / len(v):.3f}" if v else "-" for v in values) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m experiments.curves")
    p.add_argument("experiment", help="script name in experiments/, e.g. coda_mlu")
    p.add_argument("grid")
    p.add_argument("--config", default="paper")
    p.add_argument("--out", required=True, help="path without suffix for .csv, .png, .md")
    args = p.parse_args(argv)
    experiment = importlib.import_module(f"experiments.{args.experiment}").EXPERIMENT
    grid = experiment.grid(args.grid)
    metric = curve_metric(grid)
    curves = learning_curves(experiment, grid, args.config, metric)
    steps = sorted({s for c in curves.values() for s in c})
    if not steps:
        raise SystemExit(f"no {metric} logged for {experiment.name} {grid.name} "
                         f"({args.config}) yet")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    mean = {c: {s: sum(v) / len(v) for s, v in per.items()} for c, per in curves.items()}
    rows = io.StringIO(newline="")
    writer = csv.writer(rows)
    writer.writerow(["step", *curves])
    for step in steps:
        writer.writerow([step, *("" if step not in mean[c] else f"{mean[c][step]:.2f}"
                                 for c in curves)])
    write_atomic(out.with_suffix(".csv"), rows.getvalue())
    gates = format_gates(experiment, grid, args.config)
    table = "\n\n".join([format_report(experiment, grid, args.config),
                          format_curves(experiment, grid, args.config),
                          *([gates] if gates else [])])
    runs = os.environ.get("ATTNREPRO_RUNS")  # where the runs are, part of the command
    command = ((f"ATTNREPRO_RUNS={shown_path(runs)} " if runs else "")
               + f"python -m experiments.curves {args.experiment} {args.grid} "
               f"--config {args.config} --out {args.out}")
    write_atomic(out.with_suffix(".md"), f"{table}\n\n(made by `{command}`)\n")

    fig, _ = plot_curves(experiment, grid, args.config, metrics={metric: metric})
    save_figure(fig, out.with_suffix(".png"))
    gates = plot_gates(experiment, grid, args.config)
    if gates is not None:  # the runs logged the CoDA gate diagnostics
        save_figure(gates, out.with_name(f"{out.name}-gates.png"))
    print(table)

