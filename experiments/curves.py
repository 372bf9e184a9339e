"""Learning curves of a grid as committed data and a plot: the grid's validation metric
(``Grid.curve``) per step and cell, read from the CSV logs like ``report``.

    python -m experiments.curves coda_mlu curve --config curve --out results/coda_mlu_curve

writes ``<out>.csv`` (step, one column per cell: mean over seeds), ``<out>.png`` and
``<out>.md`` (what ``report --curve`` prints: the grid's table, then the curves), and
prints the markdown.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import io
from pathlib import Path

from experiments.report import format_curves, format_report, learning_curves
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
    curves = learning_curves(experiment, grid, args.config)
    steps = sorted({s for c in curves.values() for s in c})
    if not steps:
        raise SystemExit(f"no {grid.curve} logged for {experiment.name} {grid.name} "
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
    command = (f"python -m experiments.curves {args.experiment} {args.grid} "
               f"--config {args.config} --out {args.out}")
    write_atomic(out.with_suffix(".md"), f"{table}\n\n(made by `{command}`)\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for cell, per in mean.items():
        xs = sorted(per)
        ax.plot(xs, [per[s] for s in xs], marker="o", markersize=3, label=cell)
    ax.set_xlabel("training step")
    ax.set_ylabel(f"{grid.curve} ({'%' if grid.scale == 100 else f'x{grid.scale:g}'})")
    ax.set_title(f"{experiment.name} {grid.name} ({args.config})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    write_atomic(out.with_suffix(".png"), lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    print(table)


if __name__ == "__main__":
    main()
