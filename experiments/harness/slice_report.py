"""``report <grid> --slices [NAME ...]``: each claim of the grid tested again within each
slice of the test set (experiments/harness/slices.py), as markdown tables (per claim and
metric: the slice, its units, both cells' metric, the paired difference with its 95%
interval and p), as a figure with ``--plot`` (the difference per slice with its interval)
and as the W&B summary run's ``slices_table`` (experiments/harness/wandb_summary.py).
"""

from __future__ import annotations

from pathlib import Path

from experiments.harness.grid_model import Experiment, Grid, shown_path
from experiments.harness.significance import format_interval, format_p
from experiments.harness.slice_model import Slicing
from experiments.harness.slices import SlicedClaim, slice_results
from experiments.harness.verdicts import CLAIM_SAMPLES, claim_labels

HEADER = ("Where the gain is: each claim tested again within each slice of the test set, "
          "with the claim's own paired test (experiments/harness/significance.py: "
          f"{CLAIM_SAMPLES:,} replicates, seeds the outer level, the slice's units only, "
          "paired by id; corpus metrics such as BLEU per slice from the slice's summed "
          "statistics); n: test units in the slice per seed (examples; questions for MAP / "
          "MRR), one number when both cells have the same units; p not corrected for the "
          "number of slices.")


def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_sliced(results: list[SlicedClaim]) -> list[str]:
    """The markdown tables of :func:`slice_results`: one per claim and metric."""
    lines: list[str] = []
    claims: dict[tuple[str, str, str], list[SlicedClaim]] = {}
    for r in results:
        claims.setdefault((r.baseline, r.proposal, r.label), []).append(r)
    for (baseline, proposal, label), parts in claims.items():
        first = parts[0]
        if all(p.why == first.why for p in parts) and first.why and first.seeds == 0:
            lines += ["", f"#### {first.claim}, {label}: {first.why}"]
            continue
        seeds = max(p.seeds for p in parts)
        lines += ["", f"#### {first.claim}, {label}: {seeds} seed{'s' * (seeds != 1)}"
                  + (" (the interval resamples that seed's units only, not the seed)"
                     if seeds == 1 else ""), "",
                  f"| slices | slice | n | {baseline} | {proposal} | diff [95% CI] | p |",
                  "|---|---|---|---|---|---|---|"]
        for part in parts:
            name = part.slicing.name
            if part.why:
                lines.append(f"| {name} | not computed: {part.why} | | | | | |")
                continue
            for row in part.rows:
                n = (f"{row.n_baseline:,}" if row.n_baseline == row.n_proposal
                     else f"{row.n_baseline:,} / {row.n_proposal:,}")
                c = row.comparison
                diff = row.why if c is None else format_interval(c.diff, c.low, c.high)
                p = "" if c is None else format_p(c.p_value)
                lines.append(f"| {name} | {row.name} | {n} | {_score(row.baseline)} | "
                             f"{_score(row.proposal)} | {diff} | {p} |")
                name = ""
    return lines


def format_slices(experiment: Experiment, grid: Grid, slicings: list[Slicing],
                  results: list[SlicedClaim]) -> str:
    legend = "; ".join(f"{s.name}: {s.title}" for s in slicings)
    return "\n".join([f"### {grid.title}: slices", f"{HEADER} Slices of {experiment.name}: "
                      f"{legend}.", *format_sliced(results)])


def plot_slices(results: list[SlicedClaim], title: str):
    """Per claim and slice a row: the paired difference with its 95% interval (a slice
    without a test says why in its label)."""
    from experiments.harness.plots import ClaimBar, plot_claim_bars

    bars = []
    for r in results:
        if r.why:
            bars.append(ClaimBar(f"{r.claim} ({r.label}), {r.slicing.name}: {r.why[:60]}",
                                 None, None))
        for row in r.rows:
            c = row.comparison
            name = f"{r.claim} ({r.label}), {r.slicing.name} {row.name}, n={row.n_baseline:,}"
            bars.append(ClaimBar(name if c else f"{name}: {row.why}", None,
                                 (c.diff, c.low, c.high) if c else None))
    return plot_claim_bars(bars, title)


def slices_table(experiment: Experiment, grid: Grid, config: str) -> tuple[list, list]:
    """(columns, rows) of the slice tables as numbers, for the W&B summary run: every
    declared slicing of the experiment, one row per claim, metric and slice (a slicing or
    claim without rows: one row with its reason)."""
    columns = ["claim", "metric", "slices", "slice", "n baseline", "n proposal", "baseline",
               "proposal", "diff", "ci low", "ci high", "p", "test", "seeds", "why"]
    rows = []
    for r in slice_results(experiment, grid, config, list(experiment.slices.values())):
        if r.why:
            rows.append([r.claim, r.label, r.slicing.name, *[None] * 11, r.why])
        for s in r.rows:
            c = s.comparison
            numbers = [c.diff, c.low, c.high, c.p_value, c.test] if c else [None] * 5
            rows.append([r.claim, r.label, r.slicing.name, s.name, s.n_baseline, s.n_proposal,
                         s.baseline, s.proposal, *numbers, r.seeds, s.why or None])
    return columns, rows


def report_slices(experiment: Experiment, grid: Grid, config: str, names: list[str],
                  plot: bool = False, out: str | Path | None = None) -> str:
    """``report --slices [NAME ...]``: the slice tables of ``grid`` (the experiment's
    declared slices ``names``, all of them for none) and, with ``plot``, their figure in
    ``out`` (default: the grid's run folder's ``plots/``).  An unknown name, or a file the
    slices cannot be read from, is one line (SystemExit)."""
    slicings = experiment.slicings(names)
    if not grid.claims or not claim_labels(grid):
        return (f"Slices: grid {grid.name} has no claim with a paired test to cut into "
                "slices.")
    try:
        results = slice_results(experiment, grid, config, slicings)
    except ValueError as err:
        raise SystemExit(f"{experiment.name}.py report {grid.name} --slices: {err}") from None
    text = format_slices(experiment, grid, slicings, results)
    if plot:
        from experiments.harness.plots import plot_path, save_figure

        folder = Path(out) if out else experiment.grid_folder(grid, config) / "plots"
        fig = plot_slices(results, f"{experiment.name} {grid.name} ({config}): paired "
                                   "difference per slice, 95% intervals")
        path = save_figure(fig, plot_path(folder, experiment, grid, config, "slices"))
        text += f"\n\n- paired difference per slice with its 95% interval: " \
                f"![slices]({shown_path(path)})"
    return text
