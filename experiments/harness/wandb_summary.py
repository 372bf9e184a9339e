"""A grid's W&B summary run: after its cells, one short run in their group with the paper's
table (our numbers as the reader gives them, :func:`summary_table`), the paired tests of
the claims (:func:`claims_table`) and within each slice of the test set the experiment
declares (experiments/harness/slice_report.py), and the figures of ``report --plot``.
"""

from __future__ import annotations

import hashlib
import re
import shutil

from experiments.harness.grid_model import Experiment, Grid, cell_runs, group_name
from experiments.harness.loggers import wandb_mode, wandb_project, wandb_settings
from experiments.harness.runs import collect, cost_values
from experiments.harness.scale import scale_line
from experiments.harness.significance import mean_std
from experiments.harness.slice_report import slices_table
from experiments.harness.verdicts import claim_results


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
        row += list(costs[cell.name].values())
        rows.append(row)
    return columns, rows


def claims_table(experiment: Experiment, grid: Grid, config: str) -> tuple[list, list]:
    """(columns, rows) of the claims table ``report`` prints, as numbers, one row per claim and
    metric (:func:`claim_results`): the paper's difference, our baseline and proposal, our
    difference with its 95% interval, p, the test, the verdict (as printed: none for a smoke
    run or synthetic data), seeds, units and the runs' scale; a claim without a comparison
    has None there and its reason as the verdict."""
    columns = ["claim", "metric", "paper diff", "ours baseline", "ours proposal", "ours diff",
               "ci low", "ci high", "p", "test", "verdict", "seeds", "units", "scale"]
    rows = []
    for r in claim_results(experiment, grid, config):
        c = r.comparison
        if c is None:
            rows.append([r.claim, r.label, r.paper_diff, *[None] * 7, r.why, None, None,
                         r.scale.short() if r.scale else None])
            continue
        rows.append([r.claim, r.label, r.paper_diff, c.baseline, c.proposal, c.diff, c.low,
                     c.high, c.p_value, c.test, r.shown_verdict, c.seeds, c.units,
                     r.scale.short() if r.scale else None])
    return columns, rows


def summary_run_id(experiment: Experiment, grid: Grid, config: str) -> str:
    """The W&B run id of a grid's summary run, one per experiment, grid and config (a rerun
    goes on in the same run): ``summary-<experiment>-<grid>-<config>``, characters W&B does
    not take in an id as ``-``, cut with a hash of the whole past 64 characters."""
    name = f"summary-{experiment.name}-{group_name(grid, config)}"
    safe = re.sub(r"[^A-Za-z0-9_-]", "-", name)
    if len(safe) > 64 or safe != name:
        safe = f"{safe[:51]}-{hashlib.sha1(name.encode()).hexdigest()[:12]}"
    return safe


def log_grid_summary(experiment: Experiment, grid: Grid, config: str) -> None:
    """After a grid's cells: when they logged to W&B, one short run in their group, job
    type ``summary``, its config carrying the runs' scale (``report``'s Scale line), with
    the paper's table and its cost columns (:func:`summary_table`) as
    ``paper_table``, the paired tests of the paper's claims (:func:`claims_table`) as
    ``claims_table``, the same claims within each declared slice of the test set
    (:func:`slices_table`) as ``slices_table`` and the figures of ``report --plot`` as images
    (:func:`log_grid_plots`).
    One summary run per grid and config: its id is fixed (:func:`summary_run_id`; a rerun
    resumes it, and its latest tables are the run's summary) and the previous offline
    summary run's folder is removed first, so ``wandb sync`` uploads it once.
    W&B failing to start or to log is one printed line: the grid's runs are done."""
    group = group_name(grid, config)
    root = experiment.grid_folder(grid, config)
    if not any((d / "wandb").is_dir() for c in grid.cells for d in cell_runs(root, c)):
        return  # --run.wandb false (or no run finished)
    try:
        import wandb

        columns, rows = summary_table(experiment, grid, config)
        folder = root / "summary"
        shutil.rmtree(folder / "wandb", ignore_errors=True)  # the previous summary run
        folder.mkdir(parents=True, exist_ok=True)
        run = wandb.init(
            project=wandb_project(), id=summary_run_id(experiment, grid, config),
            resume="allow",
            group=f"{experiment.name}/{group}", name="summary", job_type="summary",
            dir=str(folder), mode=wandb_mode(), tags=[experiment.name, group, "summary"],
            config={"experiment": experiment.name, "grid": grid.name, "cell": None,
                    "seed": None, "grid_config": config, "title": grid.title,
                    "scale": scale_line(experiment, grid, config)},
            reinit="create_new",  # its own run even if one is active in this process
            settings=wandb_settings(init_timeout=60))
        tables = {"paper_table": wandb.Table(columns=columns, data=rows,
                                             allow_mixed_types=True)}
        if grid.claims:
            columns, rows = claims_table(experiment, grid, config)
            tables["claims_table"] = wandb.Table(columns=columns, data=rows,
                                                 allow_mixed_types=True)
            if experiment.slices:
                columns, rows = slices_table(experiment, grid, config)
                tables["slices_table"] = wandb.Table(columns=columns, data=rows,
                                                     allow_mixed_types=True)
        try:
            run.log(tables)
            log_grid_plots(run, experiment, grid, config)
        finally:
            run.finish()
        print(f"W&B summary run logged: {folder}", flush=True)
    except Exception as err:  # noqa: BLE001 - never fail a finished grid for W&B
        print(f"W&B summary run not logged: {type(err).__name__}: {err}", flush=True)


def log_grid_plots(run, experiment: Experiment, grid: Grid, config: str) -> None:
    """The figures ``report --plot`` writes (experiments/harness/plots.py) as the images
    ``plots/<figure>`` of a W&B run; failing to draw them is one printed line, the table is
    logged."""
    try:
        import wandb

        from experiments.harness.plots import FIGURES, grid_plots
        from lit_models.plots import figure_image

        plots = grid_plots(experiment, grid, config)
        run.log({f"plots/{name}": wandb.Image(figure_image(fig), caption=FIGURES[name])
                 for name, fig in plots.figures.items()})
    except Exception as err:  # noqa: BLE001 - the table is logged; the figures are extra
        print(f"W&B summary plots not logged: {type(err).__name__}: {err}", flush=True)
