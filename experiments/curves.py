"""Learning curves of a grid as committed data and a plot: the grid's validation metric
(``Grid.curve``, else its first metric's validation counterpart: experiments.report's
curve_metric) per step and cell, read from the CSV logs like ``report``.

    python -m experiments.curves coda_mlu curve --config curve --out results/coda_mlu_curve

writes ``<out>.csv`` (step, one column per cell: mean over seeds), ``<out>.png`` and
``<out>.md`` (what ``report --curve`` prints: the grid's table, then the curves), and
prints the markdown; when the runs logged the CoDA gate diagnostics, also
``<out>-gates.png`` (experiments/plots.py draws both, as ``report --plot`` does).
"""

from __future__ import annotations

import argparse
import csv
import importlib
import io
import os
from pathlib import Path

from experiments.grid_model import shown_path
from experiments.plots import plot_curves, plot_gates, save_figure
from experiments.report import curve_metric, format_curves, format_report, learning_curves
from fileio import write_atomic


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
    table = (format_report(experiment, grid, args.config) + "\n\n"
             + format_curves(experiment, grid, args.config))
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


if __name__ == "__main__":
    main()
