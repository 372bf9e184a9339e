"""``report``: a grid's table from the CSV logs of its runs, the paper's numbers beside ours
(mean +- std over seeds), the cost of each cell, the paired tests of the gains the paper
claims (experiments/harness/significance.py) and, with ``--curve``, the validation learning curves
(the grid's ``curve``, else its first metric's validation counterpart); ``--plot`` also
writes them as figures (experiments/harness/plots.py).  It reads only the run folders, so it works
without W&B.  A verdict drawn from one seed says so: its interval covers the test sample,
not the seed.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from experiments.harness import significance as sig
from experiments.harness.command_line import add_config_arguments, chosen_config, command_parser
from experiments.harness.grid_model import (
    PROJECT_ROOT,
    Cell,
    Experiment,
    Grid,
    cell_runs,
    runs_root,
    seed_of,
)


def read_run_metrics(run_dir: Path, grid: Grid) -> dict[str, float | None]:
    """The last logged value of each of the grid's metrics in a run's metrics.csv (the value
    in its hparams.yaml for ``hparams/<name>`` keys), None where there is none."""
    values: dict[str, float | None] = {label: None for label in grid.metrics}
    path = run_dir / "metrics.csv"
    if not path.exists():
        return values
    with open(path) as f:
        for row in csv.DictReader(f):
            for label, key in grid.metrics.items():
                if row.get(key) not in (None, ""):
                    values[label] = float(row[key])
    hparams = run_dir / "hparams.yaml"
    wanted = {label: key.split("/", 1)[1] for label, key in grid.metrics.items()
              if key.startswith("hparams/")}
    if wanted and hparams.exists():
        logged = yaml.safe_load(hparams.read_text()) or {}
        for label, name in wanted.items():
            if isinstance(logged.get(name), (int, float)):
                values[label] = float(logged[name])
    return values


def seed_values(root: Path, cell: Cell, grid: Grid) -> dict[str, list[float]]:
    """metric label -> the values (as logged) of ``cell``'s seeds under the grid folder
    ``root`` that logged it."""
    values: dict[str, list[float]] = {label: [] for label in grid.metrics}
    for run_dir in cell_runs(root, cell):
        for label, v in read_run_metrics(run_dir, grid).items():
            if v is not None:
                values[label].append(v)
    return values


#: keys of a run's resolved config (``config.yaml``) that differ between the seeds of a cell
#: by design: the seed, the run's name, the checkpoint a resumed run started from
PER_SEED_KEYS = ("seed_everything", "run.name", "ckpt_path")


class MixedRunsError(ValueError):
    """The runs of one cell were made with different settings: their numbers are not averaged."""


def _flat(node, prefix: str = "") -> dict[str, object]:
    if not isinstance(node, dict):
        return {prefix: node}
    out: dict[str, object] = {}
    for key, value in node.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def settings_differences(run_dirs: list[Path]) -> dict[str, dict[str, object]]:
    """key -> run folder name -> value, for each key of the runs' resolved configs
    (``config.yaml``, written by LightningCLI) whose value is not the same in all of them,
    :data:`PER_SEED_KEYS` aside; runs without a config.yaml are left out."""
    configs = {}
    for run_dir in run_dirs:
        path = run_dir / "config.yaml"
        if path.exists():
            configs[run_dir.name] = _flat(yaml.safe_load(path.read_text()) or {})
    keys = sorted({k for c in configs.values() for k in c} - set(PER_SEED_KEYS))
    return {key: {name: c.get(key) for name, c in configs.items()} for key in keys
            if len({repr(c.get(key)) for c in configs.values()}) > 1}


def check_same_settings(root: Path, grid: Grid) -> None:
    """Raise :class:`MixedRunsError` naming the cell, the differing keys and each run's value
    when the finished runs of one of ``grid``'s cells under ``root`` differ in a setting."""
    for cell in grid.cells:
        runs = [d for d in cell_runs(root, cell) if (d / "metrics.csv").exists()]
        differences = settings_differences(runs)
        if differences:
            shown = "; ".join(f"{key}: " + ", ".join(f"{name} {value!r}" for name, value
                                                      in values.items())
                              for key, values in list(differences.items())[:3])
            more = f" and {len(differences) - 3} more keys" if len(differences) > 3 else ""
            raise MixedRunsError(
                f"the runs of cell {cell.name} in {root} differ in {shown}{more}: not averaged; "
                f"rerun the odd one with the others' settings (cell {grid.name} --cell "
                f"{cell.name} --seed K --force) or move its folder away")


def collect(experiment: Experiment, grid: Grid, config: str) -> dict[str, dict[str, list[float]]]:
    """cell -> metric label -> values over the seeds found in the CSV logs (refused with
    :class:`MixedRunsError` when a cell's runs differ in a setting)."""
    root = experiment.grid_folder(grid, config)
    check_same_settings(root, grid)
    return {cell.name: {label: [v * grid.scale_of(label) for v in values]
                        for label, values in seed_values(root, cell, grid).items()}
            for cell in grid.cells}


def mean_std(values: list[float]) -> tuple[float, float]:
    m = sum(values) / len(values)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return m, s


def summary_table(experiment: Experiment, grid: Grid, config: str) -> tuple[list, list]:
    """(columns, rows) of the paper's table as ``report`` reads it from the CSV logs
    (:func:`collect`, :func:`mean_std`): one row per cell, its name, then per metric label
    the paper's number, our mean, our (sample) std and the number of seeds; None where
    there is none (std of one seed); then the cost columns ``report`` prints beside them
    (:func:`cost_values`, as numbers: None where not logged)."""
    results = collect(experiment, grid, config)
    costs = cost_values(experiment, grid, config)
    columns = ["cell"]
    for label in grid.metrics:
        columns += [f"paper {label}", f"ours {label}", f"ours {label} std", f"ours {label} n"]
    columns += list(next(iter(costs.values()), {}))
    rows = []
    for cell in grid.cells:
        row = [cell.name]
        for label in grid.metrics:
            values = results[cell.name][label]
            mean, std = mean_std(values) if values else (None, None)
            row += [cell.paper.get(label), mean, std if len(values) > 1 else None, len(values)]
        row += [None if v == "-" else float(v) for v in costs[cell.name].values()]
        rows.append(row)
    return columns, rows


#: what every report row shows beside the quality: column -> (logged key, scale, format);
#: mean over the cell's seeds (a column the grid already has as a metric is not repeated)
COST_COLUMNS = {"params (M)": ("hparams/n_parameters", 1e-6, "{:.2f}"),
                "steps/s": ("train/steps_per_second", 1.0, "{:.2f}"),
                "peak MB": ("train/peak_memory_mb", 1.0, "{:.0f}"),
                "wall min": ("train/wall_seconds", 1 / 60, "{:.1f}")}


def cost_values(experiment: Experiment, grid: Grid, config: str) -> dict[str, dict[str, str]]:
    """cell -> cost column -> the mean over its seeds, formatted ("-" where not logged)."""
    costs = {label: key for label, (key, _, _) in COST_COLUMNS.items()
             if key not in grid.metrics.values()}
    probe = Grid(grid.name, grid.title, costs, grid.cells)
    root = experiment.grid_folder(grid, config)
    out = {}
    for cell in grid.cells:
        values = seed_values(root, cell, probe)
        out[cell.name] = {
            label: (COST_COLUMNS[label][2].format(
                sum(vals) / len(vals) * COST_COLUMNS[label][1]) if vals else "-")
            for label, vals in values.items()}
    return out


def format_report(experiment: Experiment, grid: Grid, config: str) -> str:
    results = collect(experiment, grid, config)
    costs = cost_values(experiment, grid, config)
    lines = [f"### {grid.title}", f"{experiment.name} grid {grid.name}, config {config} "
             f"({experiment.config_path(config).relative_to(PROJECT_ROOT)})", ""]
    header = ["cell"]
    for label in grid.metrics:
        header += [f"paper {label}", f"ours {label}"]
        if label in grid.relative_to:
            header += [f"paper {label} / {grid.relative_to[label]}",
                       f"ours {label} / {grid.relative_to[label]}"]
    header += list(next(iter(costs.values()), {}))
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def ratio(value, base) -> str:
        return "-" if value is None or not base else f"{value / base:.2f}x"

    for cell in grid.cells:
        row = [cell.name]
        for label in grid.metrics:
            paper = cell.paper.get(label)
            row.append("-" if paper is None else f"{paper:.2f}")
            vals = results[cell.name][label]
            if not vals:
                row.append("not run")
            else:
                m, s = mean_std(vals)  # sample std; one seed has no spread to show
                spread = f" ± {s:.2f}" if len(vals) > 1 else ""
                row.append(f"{m:.2f}{spread} (n={len(vals)})")
            if label in grid.relative_to:
                base = grid.cell(grid.relative_to[label])
                base_vals = results[base.name][label]
                row += [ratio(paper, base.paper.get(label)),
                        ratio(mean_std(vals)[0] if vals else None,
                              mean_std(base_vals)[0] if base_vals else None)]
        row += list(costs[cell.name].values())
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Cost: mean over the seeds of the parameters, training steps/s (training "
              "steps only), peak memory (CPU: the process's peak resident set) and the wall "
              "time of training (validation included); a run's machine and load set them."]
    if grid.cost_file:  # the same cost measured with the models taking turns in one process
        from experiments.harness.interleaved_cost import format_cost_file

        lines += ["", format_cost_file(grid)]
    if grid.claims:
        lines += ["", format_claims(experiment, grid, config)]
    if grid.note:
        lines += ["", grid.note]
    return "\n".join(lines)


#: resamples of the paired tests in ``report`` (and their random seed: the report is the
#: same every time it is printed)
CLAIM_SAMPLES, CLAIM_SEED = 10_000, 0


#: what a verdict drawn from one seed says beside it: its interval and p resample that seed's
#: test examples only, not the seed
ONE_SEED = " (one seed)"
ONE_SEED_NOTE = ("'(one seed)': the interval and p resample the test examples of that one seed "
                 "only, not the seed: another seed may land outside them.")
CLAIMS_HEADER = ("| claim | metric | paper diff | ours: baseline -> proposal | ours diff [95% CI] "
                 "| p | verdict | seeds x units |")


@dataclass(frozen=True)
class ClaimResult:
    """One metric of one claim of a grid (baseline -> proposal): the paper's difference, the
    paired comparison of experiments/harness/significance.py over the runs (None when there is none,
    ``why`` says why) and the verdict in the paper's direction."""

    baseline: str
    proposal: str
    label: str
    paper_diff: float | None
    comparison: sig.Comparison | None = None
    why: str = ""
    verdict: str = ""

    @property
    def claim(self) -> str:
        return f"{self.proposal} vs {self.baseline}"

    @property
    def one_seed(self) -> bool:
        return self.comparison is not None and self.comparison.seeds == 1

    @property
    def shown_verdict(self) -> str:
        """The verdict as printed: marked when it rests on one seed."""
        return self.verdict + (ONE_SEED if self.one_seed else "")


def claim_labels(grid: Grid) -> dict[str, str]:
    """metric label -> key of the grid's metrics with per-example test units."""
    return {label: key for label, key in grid.metrics.items() if sig.metric_name(key)}


def claim_results(experiment: Experiment, grid: Grid, config: str,
                  root: Path | None = None) -> list[ClaimResult]:
    """Each claim of ``grid`` (its ``claims``: baseline -> proposal) tested on the runs under
    the grid folder ``root`` (default: the grid's run folder of ``config``): per metric the
    paper gives both numbers of (else the grid's first test metric), the paired comparison
    over the seeds both cells ran and the test examples (paired by id)."""
    root = experiment.grid_folder(grid, config) if root is None else root
    labels = claim_labels(grid)
    out = []
    for baseline, proposal in grid.claims:
        b_cell, p_cell = grid.cell(baseline), grid.cell(proposal)
        paper = {label: p_cell.paper[label] - b_cell.paper[label] for label in labels
                 if b_cell.paper.get(label) is not None
                 and p_cell.paper.get(label) is not None}
        for label in list(paper) or list(labels)[:1]:
            key = labels[label]
            found = _paired_units(root, b_cell, p_cell, key)
            if isinstance(found, str):
                out.append(ClaimResult(baseline, proposal, label, paper.get(label), why=found))
                continue
            kind, b_stats, p_stats, _ = found
            name = sig.metric_name(key)[0]
            c = sig.compare(kind, b_stats, p_stats, samples=CLAIM_SAMPLES, seed=CLAIM_SEED,
                            test="randomization" if name in ("map", "mrr", "p@1")
                            else "bootstrap")
            verdict = c.verdict
            higher = sig.KINDS[kind].higher_is_better
            if paper.get(label, 0) and (paper[label] > 0) != higher:
                # the paper found the proposal worse: does that hold here?
                verdict = {sig.HOLDS: sig.REVERSED, sig.REVERSED: sig.HOLDS}.get(verdict,
                                                                                verdict)
            out.append(ClaimResult(baseline, proposal, label, paper.get(label), c,
                                   verdict=verdict))
    return out


def format_claims(experiment: Experiment, grid: Grid, config: str) -> str:
    """Does each gain the paper claims (its ``claims``: baseline -> proposal) hold here?
    For each test metric of the grid with per-example units: the paired comparison over the
    seeds both cells have (seed k with seed k) and the test examples (paired by id) of
    experiments/harness/significance.py, with the paper's difference beside ours
    (:func:`claim_results`)."""
    if not claim_labels(grid):
        return ("Claims: no paired test (this grid's metrics are not test metrics with "
                "per-example predictions).")
    lines = [f"Does the claimed gain hold? Paired over seeds (seed k of the baseline with seed "
             f"k of the proposal: the same seed draws the same initialisation stream and data "
             f"order; seeds are the outer level of the bootstrap) and test examples (paired "
             f"by id, resampled once per replicate for all seeds); 95% percentile interval of "
             f"{CLAIM_SAMPLES:,} paired bootstrap replicates; p from the bootstrap "
             f"(approximate randomisation for MAP / MRR / P@1: units are questions); "
             f"alpha 0.05, no correction for the number of claims "
             f"(experiments/significance.py).", "",
             CLAIMS_HEADER, "|---|---|---|---|---|---|---|---|"]
    results = claim_results(experiment, grid, config)
    for r in results:
        shown = "-" if r.paper_diff is None else f"{r.paper_diff:+.2f}"
        if r.comparison is None:
            lines.append(f"| {r.claim} | {r.label} | {shown} | {r.why} | | | | |")
            continue
        c = r.comparison
        row = c.row()
        lines.append(f"| {r.claim} | {r.label} | {shown} | {row['baseline']} -> "
                     f"{row['proposal']} | {row['diff']} | {row['p']} ({c.test}) "
                     f"| {r.shown_verdict} | {c.seeds} x {c.units:,} |")
    lines += ["", "verdict: 'holds' = significant (p < 0.05) in the paper's direction (the "
              "proposal better, or worse where the paper's difference is negative), "
              "'reversed' = significant the other way."
              + (f" {ONE_SEED_NOTE}" if any(r.one_seed for r in results) else "")]
    return "\n".join(lines)


def claims_table(experiment: Experiment, grid: Grid, config: str) -> tuple[list, list]:
    """(columns, rows) of :func:`format_claims`' table as numbers, one row per claim and
    metric (:func:`claim_results`): the paper's difference, our baseline and proposal, our
    difference with its 95% interval, p, the test, the verdict (as printed), seeds and units;
    a claim without a comparison has None there and its reason as the verdict."""
    columns = ["claim", "metric", "paper diff", "ours baseline", "ours proposal", "ours diff",
               "ci low", "ci high", "p", "test", "verdict", "seeds", "units"]
    rows = []
    for r in claim_results(experiment, grid, config):
        c = r.comparison
        if c is None:
            rows.append([r.claim, r.label, r.paper_diff, *[None] * 7, r.why, None, None])
            continue
        rows.append([r.claim, r.label, r.paper_diff, c.baseline, c.proposal, c.diff, c.low,
                     c.high, c.p_value, c.test, r.shown_verdict, c.seeds, c.units])
    return columns, rows


def _paired_units(root: Path, baseline: Cell, proposal: Cell, key: str):
    """(kind, baseline stats per seed, proposal stats per seed, units) over the seeds both
    cells ran, or why there is no comparison (a short text for the table)."""
    from experiments.harness.significance import run_units

    seeds = {}
    for cell in (baseline, proposal):
        seeds[cell.name] = {seed_of(d, cell): d for d in cell_runs(root, cell)
                            if (d / "metrics.csv").exists()}
    common = sorted(set(seeds[baseline.name]) & set(seeds[proposal.name]))
    if not common:
        return "not run (no seed of both cells)"
    kind, b_stats, p_stats = None, [], []
    for seed in common:
        try:
            b_kind, b_ids, b = run_units(seeds[baseline.name][seed], key)
            kind, p_ids, p = run_units(seeds[proposal.name][seed], key)
        except (FileNotFoundError, ValueError) as err:
            return f"no paired test: {err}".replace("|", "/")
        if b_ids != p_ids:
            return (f"no paired test: seed {seed}: the two runs' test examples differ "
                    f"({len(b_ids)} vs {len(p_ids)} units)")
        b_stats.append(b)
        p_stats.append(p)
    return kind, b_stats, p_stats, len(b_stats[0])


#: logged keys whose row's ``step`` is the number of optimiser steps done (callbacks that log
#: with the trainer's step themselves: the CoDA gate diagnostics, lit_models/diagnostics.py);
#: Lightning logs every other metric of a validation at that number - 1
AT_STEPS_DONE = ("coda/",)


def validation_metrics(grid: Grid) -> dict[str, str]:
    """metric label -> the validation metric every validation logs for it: the grid's test
    and validation metrics with ``val/`` for their stage and without a ``_best`` part
    (``test/acc`` and ``val/acc_best`` -> ``val/acc``, ``val/mrr_at_best_map`` ->
    ``val/mrr``), each key once, the grid's ``curve`` first; ``{"loss": "val/loss"}`` for a
    grid of other metrics (cost: every model logs its validation loss)."""
    out: dict[str, str] = {}
    for label, key in grid.metrics.items():
        stage, _, name = key.partition("/")
        if stage in ("test", "val"):
            key = "val/" + re.sub(r"(_at)?_best.*$", "", name)
            if key not in out.values():
                out[label] = key
    if grid.curve:
        label = next((lb for lb, key in out.items() if key == grid.curve), grid.curve)
        out = {label: grid.curve, **{lb: k for lb, k in out.items() if k != grid.curve}}
    return out or {"loss": "val/loss"}


def curve_metric(grid: Grid) -> str:
    """The validation metric of ``report --curve``: the grid's ``curve``, else the first of
    :func:`validation_metrics`."""
    return next(iter(validation_metrics(grid).values()))


def metric_scale(grid: Grid, key: str) -> float:
    """The factor from ``key`` as logged to the paper's units: the scale of the grid metric
    it is the validation counterpart of (the grid's ``scale`` for its ``curve``), else 1
    (losses, diagnostics)."""
    for label, val_key in validation_metrics(grid).items():
        if val_key == key:
            if label in grid.metrics:
                return grid.scale_of(label)
            return grid.scale if key == grid.curve else 1.0
    return 1.0


def metric_steps(run_dirs: list[Path], key: str, scale: float = 1.0
                 ) -> dict[int, list[float]]:
    """optimiser steps done -> the values of ``key`` (times ``scale``) the runs' metrics.csv
    logged there, one per run that did.  The one reader of a metric over steps: learning
    curves, plots, gate diagnostics."""
    offset = 0 if key.startswith(AT_STEPS_DONE) else 1
    steps: dict[int, list[float]] = {}
    for run_dir in run_dirs:
        path = run_dir / "metrics.csv"
        if not path.exists():
            continue
        with open(path) as f:
            for row in csv.DictReader(f):
                if row.get(key) not in (None, ""):
                    step = int(float(row["step"])) + offset
                    steps.setdefault(step, []).append(float(row[key]) * scale)
    return steps


def logged_keys(run_dirs: list[Path]) -> list[str]:
    """The columns of the runs' metrics.csv files, in order of first appearance."""
    keys: dict[str, None] = {}
    for run_dir in run_dirs:
        path = run_dir / "metrics.csv"
        if path.exists():
            with open(path) as f:
                keys.update(dict.fromkeys(next(csv.reader(f), [])))
    return list(keys)


def learning_curves(experiment: Experiment, grid: Grid, config: str, metric: str | None = None,
                    root: Path | None = None) -> dict[str, dict[int, list[float]]]:
    """cell -> optimiser step -> ``metric`` (default :func:`curve_metric`; in the paper's
    units, :func:`metric_scale`) at that step over the seeds found in the CSV logs of the
    grid folder ``root`` (default: the grid's run folder of ``config``).  Steps are counted
    as optimiser steps done (Lightning logs validation at step - 1)."""
    metric = metric or curve_metric(grid)
    root = experiment.grid_folder(grid, config) if root is None else root
    scale = metric_scale(grid, metric)
    return {cell.name: metric_steps(cell_runs(root, cell), metric, scale) for cell in grid.cells}


def format_curves(experiment: Experiment, grid: Grid, config: str) -> str:
    """The learning curves as a markdown table: one row per step, one column per cell
    (mean over seeds, with n when seeds differ)."""
    curves = learning_curves(experiment, grid, config)
    steps = sorted({s for c in curves.values() for s in c})
    lines = [f"### {grid.title}: learning curves, {curve_metric(grid)}",
             f"{experiment.name} grid {grid.name}, config {config}", "",
             "| step | " + " | ".join(curves) + " |", "|---" * (len(curves) + 1) + "|"]
    for step in steps:
        row = []
        for values in (curves[c].get(step) for c in curves):
            if not values:
                row.append("-")
            else:
                row.append(f"{sum(values) / len(values):.2f}"
                           + (f" (n={len(values)})" if len(values) > 1 else ""))
        lines.append(f"| {step} | " + " | ".join(row) + " |")
    if not steps:
        lines.append("| (no validation logged yet) |" + " |" * len(curves))
    return "\n".join(lines)


def configs_with_runs(experiment: Experiment, grid: Grid, runs: Path | None = None) -> list[str]:
    """The configs with at least one run of ``grid`` (folders ``<grid>-<config>``) under the
    runs folder ``runs`` (default: $ATTNREPRO_RUNS)."""
    root = (runs_root() if runs is None else runs) / experiment.name
    longer = [g for g in experiment.grids if g != grid.name and g.startswith(grid.name)]
    found = []
    for folder in sorted(root.glob(f"{grid.name}-*")):
        if not folder.is_dir() or any(folder.name.startswith(f"{g}-") for g in longer):
            continue
        if any(cell_runs(folder, cell) for cell in grid.cells):
            found.append(folder.name.removeprefix(f"{grid.name}-"))
    return found


def no_runs_message(experiment: Experiment, grid: Grid, config: str) -> str | None:
    """One line when ``grid`` has no runs with ``config`` but has with others; else None."""
    found = configs_with_runs(experiment, grid)
    if not found or config in found:
        return None
    use = " or ".join("--smoke or --config smoke" if c == "smoke" else f"--config {c}"
                      for c in found)
    return f"no runs of {grid.name} with config {config}; runs exist for: {', '.join(found)} " \
           f"(use {use})"


#: the columns a rerun on another machine or load changes without a change of the numbers
LOAD_COLUMNS = ("steps/s", "peak MB", "wall min")


def table_row(line: str) -> list[str]:
    """The cells of one markdown table line (``| a | b |`` -> ``["a", "b"]``), stripped."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def table_cells(text: str) -> dict[tuple[str, str, str], str]:
    """(table heading, row's first cell, column) -> cell text of every markdown table in a
    printout, the load-dependent :data:`LOAD_COLUMNS` left out; the heading is the last
    ``#`` line above the table (a printout's tables are told apart by it and their header)."""
    cells, heading, header = {}, "", None
    for line in text.splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if not line.startswith("|"):
            header = None
            continue
        row = table_row(line)
        if header is None:
            header = row
        elif not set("".join(row)) <= set("-: "):
            for column, value in zip(header[1:], row[1:], strict=False):
                if column not in LOAD_COLUMNS:
                    cells[(f"{heading} [{header[0]}]", row[0], column)] = value
    return cells


def compare_printouts(ours: str, committed: str, committed_name: str,
                      committed_machine: str) -> str:
    """Whether a printout's numbers (tables' cells but :data:`LOAD_COLUMNS`) equal a committed
    printout's, and if not how many differ, the first few, and the two machines (this one
    from :func:`lit_models.base.cpu_host` and torch's dispatch)."""
    from lit_models.base import machine_settings

    mine, theirs = table_cells(ours), table_cells(committed)
    shared = [k for k in mine if k in theirs]
    if not shared:
        return (f"Not comparable with {committed_name}: no table of this printout is in it "
                "(another grid or config?).")
    differ = [k for k in shared if mine[k] != theirs[k]]
    machine = machine_settings()
    here = (f"{machine['machine/cpu_model']}, "
            f"{'AVX-512' if machine['machine/cpu_has_avx512f'] is True else 'no AVX-512'}"
            f"{', AMX' if machine['machine/cpu_has_amx_tile'] is True else ''}, torch's "
            f"{machine['machine/cpu_capability']} kernels (each run's machine and threads: "
            "machine/* in its hparams.yaml)")
    if not differ:
        return (f"Every number above equals the committed printout {committed_name} "
                f"({len(shared)} table cells; steps/s, peak memory and wall time depend on "
                f"the machine's load and are not compared). Committed on: {committed_machine}. "
                f"Here: {here}.")
    shown = "; ".join(f"{row} {column}: {mine[(t, row, column)]} (committed "
                      f"{theirs[(t, row, column)]})" for t, row, column in differ[:4])
    return (f"{len(differ)} of {len(shared)} numbers differ from the committed printout "
            f"{committed_name}: {shown}{' ...' if len(differ) > 4 else ''}. Committed on: "
            f"{committed_machine}. Here: {here}. Another CPU's kernels round differently and "
            "training carries the difference on (docs/reproducibility.md, 'Across hosts'); "
            "with the same machine and threads the numbers are the same.")


def print_report(experiment: Experiment, argv: list[str]) -> None:
    p = command_parser(experiment, "report")
    p.add_argument("grid", nargs="?", default=None,
                   help=f"one of: {', '.join(experiment.grids)} (default: every grid)")
    add_config_arguments(p, experiment)
    p.add_argument("--curve", action="store_true",
                   help="also print the validation learning curves (the grid's curve metric, "
                        "else its first metric's validation counterpart)")
    p.add_argument("--plot", action="store_true",
                   help="also write PNGs: validation curves, paper vs ours, the claims (and "
                        "the CoDA gate over steps when the runs logged it)")
    p.add_argument("--out", default=None,
                   help="folder of the --plot files (default: the grid's run folder's plots/, "
                        "runs/<experiment>/<grid>-<config>/plots)")
    p.add_argument("--compare", default=None, metavar="FILE",
                   help="a committed printout of the same report: say after it whether every "
                        "number equals it (the load-dependent cost columns aside) and, if "
                        "not, which and on what machines")
    p.add_argument("--compare-machine", default="not stated", metavar="TEXT",
                   help="the machine the --compare printout was made on, as its results "
                        "file records it")
    args = p.parse_args(argv)
    committed = None
    if args.compare:
        try:
            committed = Path(args.compare).read_text(encoding="utf-8")
        except OSError as err:
            raise SystemExit(f"{experiment.name}.py report --compare {args.compare}: cannot "
                             f"read it ({err.strerror})") from None
    grids = [experiment.grid(args.grid)] if args.grid else list(experiment.grids.values())
    config = chosen_config(experiment, args)
    parts = []
    for g in grids:
        missing = no_runs_message(experiment, g, config)
        if missing:
            parts.append(missing)
            continue
        try:
            parts.append(format_report(experiment, g, config))
        except MixedRunsError as err:
            raise SystemExit(f"{experiment.name}.py report {g.name}: {err}") from None
        if args.curve:
            parts.append(format_curves(experiment, g, config))
        if args.plot:
            from experiments.harness.plots import write_plots  # matplotlib: only when asked

            parts.append(write_plots(experiment, g, config, args.out))
    if committed is not None:
        parts.append(compare_printouts("\n\n".join(parts), committed, args.compare,
                                       args.compare_machine))
    print("\n\n".join(parts))
