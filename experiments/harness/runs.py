"""The one reader of run folders: a run's folder (``runs/<experiment>/<grid>-<config>/
<cell>-seed<k>/``) becomes a :class:`RunRecord` (its resolved config, its metrics by step,
its last metrics, its cost, its predictions files), and a grid's folder the values of its
cells over their seeds.  ``report``, the plots, the curves, the claims board, the W&B summary
and the grid runner read runs through it and nothing else; it prints nothing.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import yaml

from experiments.harness.grid_model import Cell, Experiment, Grid, cell_runs, runs_root

#: the per-example files a test writes into the run folder: DecompAtt's
#: ``predictions-test[_<split>].jsonl``, the seq2seq models' ``hypotheses-test.jsonl``
PREDICTION_FILES = ("predictions-test", "hypotheses-test")

#: logged keys whose row's ``step`` is the number of optimiser steps done (callbacks that log
#: with the trainer's step themselves: the CoDA gate diagnostics, lit_models/diagnostics.py);
#: Lightning logs every other metric of a validation at that number - 1
AT_STEPS_DONE = ("coda/",)


@dataclass(frozen=True)
class RunRecord:
    """A run folder as read, each file when first asked: ``metrics.csv`` (Lightning's CSV
    log: one row per logging step), ``hparams.yaml`` (the model's hyper-parameters, its size,
    the machine), ``config.yaml`` (the resolved command line LightningCLI wrote) and the
    per-example predictions files of its tests."""

    folder: Path

    @property
    def has_metrics(self) -> bool:
        """Whether the run has a metrics.csv (it started logging)."""
        return (self.folder / "metrics.csv").exists()

    @cached_property
    def columns(self) -> list[str]:
        """The logged keys: metrics.csv's columns, in order (its header alone is read)."""
        if not self.has_metrics:
            return []
        with open(self.folder / "metrics.csv") as f:
            return next(csv.reader(f), [])

    @cached_property
    def rows(self) -> list[dict[str, str]]:
        """metrics.csv's rows, column -> value ("" where a row logged nothing there)."""
        if not self.has_metrics:
            return []
        with open(self.folder / "metrics.csv") as f:
            return list(csv.DictReader(f))

    @cached_property
    def hparams(self) -> dict:
        """hparams.yaml as logged; empty without it."""
        path = self.folder / "hparams.yaml"
        return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}

    @cached_property
    def config(self) -> dict[str, object] | None:
        """The resolved config, flattened to dotted keys; None without a config.yaml."""
        path = self.folder / "config.yaml"
        return _flat(yaml.safe_load(path.read_text()) or {}) if path.exists() else None

    def last(self, key: str) -> float | None:
        """The last logged value of ``key`` (for ``hparams/<name>``, the number in
        hparams.yaml when there is one); None where there is none."""
        value = None
        for row in self.rows:
            if row.get(key) not in (None, ""):
                value = float(row[key])
        if key.startswith("hparams/") and self.has_metrics:
            logged = self.hparams.get(key.split("/", 1)[1])
            if isinstance(logged, (int, float)):
                value = float(logged)
        return value

    def by_step(self, key: str, scale: float = 1.0) -> list[tuple[int, float]]:
        """(optimiser steps done, the value of ``key`` times ``scale``) of each row that
        logged it, in the log's order (:data:`AT_STEPS_DONE`: Lightning logs a validation at
        the steps done - 1)."""
        offset = 0 if key.startswith(AT_STEPS_DONE) else 1
        return [(int(float(row["step"])) + offset, float(row[key]) * scale)
                for row in self.rows if row.get(key) not in (None, "")]

    def predictions(self, since: float | None = None) -> dict[str, Path]:
        """W&B table key -> predictions file of the run (written at or after ``since``):
        ``test/predictions`` for the first split's, ``test/predictions_<split>`` for
        others."""
        found = {}
        for prefix in PREDICTION_FILES:
            for path in sorted(self.folder.glob(f"{prefix}*.jsonl")):
                if since is not None and path.stat().st_mtime < since - 1:
                    continue  # an earlier test's file
                found[f"test/predictions{path.name[len(prefix):-len('.jsonl')]}"] = path
        return found


def read_run(folder: Path | str) -> RunRecord:
    """The record of one run folder (:class:`RunRecord`)."""
    return RunRecord(Path(folder))


def read_run_metrics(run_dir: Path, grid: Grid) -> dict[str, float | None]:
    """The last logged value of each of the grid's metrics in a run's metrics.csv (the value
    in its hparams.yaml for ``hparams/<name>`` keys), None where there is none."""
    record = read_run(run_dir)
    return {label: record.last(key) for label, key in grid.metrics.items()}


def finishing_metrics(grid: Grid, cell: Cell) -> dict[str, str]:
    """The metrics a run of ``cell`` has logged once it has ended: the grid's test metrics
    the cell's paper gives a number for (an SNLI cell logs no MNLI mismatched accuracy), else
    the grid's first test metric; a grid without test metrics: all of its metrics.  (Cost
    and ``hparams/`` metrics are logged while a run trains, so they never tell.)"""
    tests = {label: key for label, key in grid.metrics.items() if key.startswith("test/")}
    named = {label: key for label, key in tests.items() if cell.paper.get(label) is not None}
    return named or dict(list(tests.items())[:1]) or dict(grid.metrics)


def run_finished(run_dir: Path, grid: Grid, cell: Cell) -> bool:
    """Whether a run folder of ``cell`` holds :func:`finishing_metrics` (a run that ended):
    one still training, or stopped before its test, has logged its cost but has no result."""
    logged = read_run_metrics(run_dir, grid)
    return all(logged[label] is not None for label in finishing_metrics(grid, cell))


def unfinished_runs(root: Path, cell: Cell, grid: Grid) -> list[Path]:
    """The runs of ``cell`` under ``root`` that started logging but have not finished."""
    return [d for d in cell_runs(root, cell)
            if read_run(d).has_metrics and not run_finished(d, grid, cell)]


def seed_values(root: Path, cell: Cell, grid: Grid) -> dict[str, list[float]]:
    """metric label -> the values (as logged) of ``cell``'s finished seeds under the grid
    folder ``root`` (:func:`run_finished`: a run still training has logged some of them)."""
    values: dict[str, list[float]] = {label: [] for label in grid.metrics}
    for run_dir in cell_runs(root, cell):
        if run_finished(run_dir, grid, cell):
            for label, v in read_run_metrics(run_dir, grid).items():
                if v is not None:
                    values[label].append(v)
    return values


#: keys of a run's resolved config (``config.yaml``) that differ between the seeds of a cell
#: by design: the seed, the run's name, the checkpoint a resumed run started from
PER_SEED_KEYS = ("seed_everything", "run.name", "ckpt_path")
#: keys that only change what a run shows while it trains, never a number it writes: runs
#: that differ in them are averaged (the config.yaml of DW Table 5's SST runs at 729655d
#: records the bar False, that of later code None)
DISPLAY_KEYS = ("trainer.enable_progress_bar", "trainer.enable_model_summary")


class MixedRunsError(ValueError):
    """The runs of one cell were made with different settings: their numbers are not averaged."""


def _flat(node, prefix: str = "") -> dict[str, object]:
    if not isinstance(node, dict):
        return {prefix: node}
    out: dict[str, object] = {}
    for key, value in node.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def settings_differences(run_dirs: list[Path],
                         names: list[str] | None = None) -> dict[str, dict[str, object]]:
    """key -> run name -> value, for each key of the runs' resolved configs
    (``config.yaml``, written by LightningCLI) whose value is not the same in all of them,
    :data:`PER_SEED_KEYS` and :data:`DISPLAY_KEYS` aside; runs without a config.yaml are
    left out.  A run's name is its folder's, or ``names``' (runs of one name in two runs
    roots)."""
    configs = {name: config for run_dir, name in zip(run_dirs, names or [d.name for d in run_dirs])
               if (config := read_run(run_dir).config) is not None}
    keys = sorted({k for c in configs.values() for k in c}
                  - set(PER_SEED_KEYS) - set(DISPLAY_KEYS))
    return {key: {name: c.get(key) for name, c in configs.items()} for key in keys
            if len({repr(c.get(key)) for c in configs.values()}) > 1}


def check_same_settings(root: Path, grid: Grid) -> None:
    """Raise :class:`MixedRunsError` naming the cell, the differing keys and each run's value
    when the finished runs of one of ``grid``'s cells under ``root`` (those averaged:
    :func:`run_finished`) differ in a setting."""
    for cell in grid.cells:
        runs = [d for d in cell_runs(root, cell) if run_finished(d, grid, cell)]
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


#: what every report row shows beside the quality: column -> (logged key, scale, decimals
#: shown); mean over the cell's seeds (a column the grid already has as a metric is not
#: repeated)
COST_COLUMNS = {"params (M)": ("hparams/n_parameters", 1e-6, 2),
                "steps/s": ("train/steps_per_second", 1.0, 2),
                "peak MB": ("train/peak_memory_mb", 1.0, 0),
                "wall min": ("train/wall_seconds", 1 / 60, 1)}


def cost_values(experiment: Experiment, grid: Grid, config: str
                ) -> dict[str, dict[str, float | None]]:
    """cell -> cost column -> the mean over its finished seeds (those the quality columns
    average: :func:`run_finished`) in the column's unit, rounded to the decimals it is shown
    with (None where not logged)."""
    costs = {label: key for label, (key, _, _) in COST_COLUMNS.items()
             if key not in grid.metrics.values()}
    root = experiment.grid_folder(grid, config)
    out = {}
    for cell in grid.cells:
        runs = [read_run(d) for d in cell_runs(root, cell) if run_finished(d, grid, cell)]
        values = {label: [v for r in runs if (v := r.last(key)) is not None]
                  for label, key in costs.items()}
        out[cell.name] = {
            label: (round(sum(vals) / len(vals) * COST_COLUMNS[label][1],
                          COST_COLUMNS[label][2]) if vals else None)
            for label, vals in values.items()}
    return out


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
    steps: dict[int, list[float]] = {}
    for run_dir in run_dirs:
        for step, value in read_run(run_dir).by_step(key, scale):
            steps.setdefault(step, []).append(value)
    return steps


def logged_keys(run_dirs: list[Path]) -> list[str]:
    """The columns of the runs' metrics.csv files, in order of first appearance."""
    keys: dict[str, None] = {}
    for run_dir in run_dirs:
        keys.update(dict.fromkeys(read_run(run_dir).columns))
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
