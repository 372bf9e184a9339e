"""Learning curves of a grid as committed data and a plot: the grid's validation metric
(``Grid.curve``, else its first metric's validation counterpart: experiments.harness.runs'
curve_metric) per step and cell, read from the CSV logs like ``report``.

    python -m experiments.curves coda_mlu curve --config curve --out results/coda_mlu_curve

writes ``<out>.csv`` (step, one column per cell: mean over seeds), ``<out>.png`` and
``<out>.md`` (what ``report --curve`` prints: the grid's table, then the curves, and the
commit the runs were made at, which the run folders do not record: ``--runs-commit``, and
their machine as their hparams.yaml record it: :func:`format_machine`), and prints the
markdown; when the runs logged the CoDA gate diagnostics, also
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
import shlex
from pathlib import Path

from experiments.harness.grid_model import Experiment, Grid, cell_runs, shown_path
from experiments.harness.plots import gate_runs, plot_curves, plot_gates, save_figure
from experiments.harness.report import format_curves, format_report
from experiments.harness.runs import curve_metric, learning_curves, metric_steps, read_run
from fileio import write_atomic
from lit_models.diagnostics import LABELS

#: the diagnostics' figures of a cross-attention module printed in the gate table -> header
GATE_FIGURES = {f: LABELS[f] for f in ("gate_mean", "gate_shut", "gate_open", "row_sum_abs")}


#: the machine/* keys of a run's hparams.yaml (lit_models.base.machine_settings) a curves
#: file names -> how it names them
MACHINE_KEYS = {"machine/cpu_model": "CPU model",
                "machine/cpu_capability": "torch's CPU capability",
                "machine/threads": "threads per run", "machine/torch": "torch"}


def format_machine(experiment: Experiment, grid: Grid, config: str) -> str:
    """The machine of the grid's runs as their hparams.yaml record it: each key's distinct
    values over the runs, 'not recorded' for a key no run logged (the runs log no core count:
    machine_settings has none)."""
    root = experiment.grid_folder(grid, config)
    runs = [read_run(d).hparams for cell in grid.cells for d in cell_runs(root, cell)]
    facts = []
    for key, label in MACHINE_KEYS.items():
        values = sorted({str(h[key]) for h in runs if key in h})
        facts.append(f"{label} {' / '.join(values) if values else 'not recorded'}")
    return (f"Machine (machine/* of the {len(runs)} runs' hparams.yaml): " + ", ".join(facts)
            + "; cores not recorded by the runs.")


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
    p.add_argument("--runs-commit", help="the commit the runs were made at (the run folders do "
                   "not record it), written into the markdown as given")
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
    commit = (f"--runs-commit {shlex.quote(args.runs_commit)} " if args.runs_commit else "")
    command = ((f"ATTNREPRO_RUNS={shown_path(runs)} " if runs else "")
               + f"python -m experiments.curves {args.experiment} {args.grid} {commit}"
               f"--config {args.config} --out {args.out}")
    made_at = (f"Runs made at: {args.runs_commit}." if args.runs_commit else
               "Runs made at: not given (--runs-commit names the commit).")
    machine = format_machine(experiment, grid, args.config)
    write_atomic(out.with_suffix(".md"),
                 f"{table}\n\n{made_at}\n{machine}\n\n(made by `{command}`)\n")

    fig, _ = plot_curves(experiment, grid, args.config, metrics={metric: metric})
    save_figure(fig, out.with_suffix(".png"))
    gates = plot_gates(experiment, grid, args.config)
    if gates is not None:  # the runs logged the CoDA gate diagnostics
        save_figure(gates, out.with_name(f"{out.name}-gates.png"))
    print(table)

