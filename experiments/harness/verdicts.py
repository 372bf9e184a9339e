"""Does a gain a grid claims hold on its runs?  Each claim of a grid (``Grid.claims``:
baseline -> proposal) tested on the per-example test predictions of the seeds both cells
ran (experiments/harness/significance.py: paired over seeds and test examples), with the
paper's difference beside ours and the verdict in the paper's direction
(:func:`claim_results`).  ``report`` prints them, the plots draw them, the claims board and
the W&B summary gather them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from experiments.harness import significance as sig
from experiments.harness.grid_model import Cell, Experiment, Grid, cell_runs, seed_of
from experiments.harness.runs import run_finished
from experiments.harness.scale import Scale, grid_scales

#: resamples of the paired tests in ``report`` (and their random seed: the report is the
#: same every time it is printed)
CLAIM_SAMPLES, CLAIM_SEED = 10_000, 0


#: what a verdict drawn from one seed says beside it: its interval and p resample that seed's
#: test examples only, not the seed
ONE_SEED = " (one seed)"


ONE_SEED_NOTE = ("'(one seed)': the interval and p resample the test examples of that one seed "
                 "only, not the seed: another seed may land outside them.")


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
    scale: Scale | None = None  # the baseline cell's at the config (the pair's dataset)

    @property
    def claim(self) -> str:
        return f"{self.proposal} vs {self.baseline}"

    @property
    def measurement(self) -> bool:
        """Whether its runs measure the claim (not a smoke run, not synthetic or sample
        data): only then does it get a verdict."""
        return self.scale is None or self.scale.measurement

    @property
    def one_seed(self) -> bool:
        return self.comparison is not None and self.comparison.seeds == 1 and self.measurement

    @property
    def shown_verdict(self) -> str:
        """The verdict as printed: marked when it rests on one seed."""
        return self.verdict + (ONE_SEED if self.one_seed else "")


def claim_labels(grid: Grid) -> dict[str, str]:
    """metric label -> key of the grid's metrics with per-example test units."""
    return {label: key for label, key in grid.metrics.items() if sig.metric_name(key)}


def claim_metrics(grid: Grid) -> list[tuple[str, str, str, float | None]]:
    """(baseline, proposal, metric label, the paper's difference or None) for each claim of
    ``grid`` and each metric the paper gives both numbers of (else the grid's first test
    metric with per-example units): the comparisons :func:`claim_results` tests."""
    labels = claim_labels(grid)
    out = []
    for baseline, proposal in grid.claims:
        b_cell, p_cell = grid.cell(baseline), grid.cell(proposal)
        paper = {label: p_cell.paper[label] - b_cell.paper[label] for label in labels
                 if b_cell.paper.get(label) is not None
                 and p_cell.paper.get(label) is not None}
        out += [(baseline, proposal, label, paper.get(label))
                for label in list(paper) or list(labels)[:1]]
    return out


def claim_test(key: str) -> str:
    """The test whose p a claim on metric ``key`` reports: approximate randomisation for
    MAP / MRR / P@1 (units are questions), else the bootstrap."""
    return "randomization" if sig.metric_name(key)[0] in ("map", "mrr", "p@1") else "bootstrap"


def claim_results(experiment: Experiment, grid: Grid, config: str,
                  root: Path | None = None) -> list[ClaimResult]:
    """Each claim of ``grid`` (its ``claims``: baseline -> proposal) tested on the runs under
    the grid folder ``root`` (default: the grid's run folder of ``config``): per metric the
    paper gives both numbers of (else the grid's first test metric), the paired comparison
    over the seeds both cells ran and the test examples (paired by id).  A smoke config's runs,
    or runs on synthetic or sample data, get no verdict: the scale's ``no_verdict`` text
    instead (experiments/harness/scale.py), the paired test still shown."""
    root = experiment.grid_folder(grid, config) if root is None else root
    labels = claim_labels(grid)
    scales = grid_scales(experiment, grid, config)
    out = []
    for baseline, proposal, label, paper_diff in claim_metrics(grid):
        key = labels[label]
        scale = scales[baseline]
        found = _paired_units(root, grid, grid.cell(baseline), grid.cell(proposal), key)
        if isinstance(found, str):
            out.append(ClaimResult(baseline, proposal, label, paper_diff, why=found,
                                   scale=scale))
            continue
        kind, b_stats, p_stats, _ = found
        c = sig.compare(kind, b_stats, p_stats, samples=CLAIM_SAMPLES, seed=CLAIM_SEED,
                        test=claim_test(key))
        out.append(ClaimResult(baseline, proposal, label, paper_diff, c,
                               verdict=scale.no_verdict() or paper_verdict(c, paper_diff),
                               scale=scale))
    return out


def paper_verdict(c: sig.Comparison, paper_diff: float | None) -> str:
    """The verdict of ``c`` in the paper's direction: where the paper found the proposal
    worse, 'holds' means it is worse here too."""
    higher = sig.KINDS[c.kind].higher_is_better
    if paper_diff and (paper_diff > 0) != higher:
        return {sig.HOLDS: sig.REVERSED, sig.REVERSED: sig.HOLDS}.get(c.verdict, c.verdict)
    return c.verdict


def seed_pairs(root: Path, grid: Grid, baseline: Cell, proposal: Cell
               ) -> list[tuple[int, Path, Path]]:
    """(seed, baseline run folder, proposal run folder) for each seed both cells of ``grid``
    finished (:func:`run_finished`: a run still training is left out) under the grid folder
    ``root``, in seed order: the pairs a claim is tested on."""
    seeds = {}
    for cell in (baseline, proposal):
        seeds[cell.name] = {seed_of(d, cell): d for d in cell_runs(root, cell)
                            if run_finished(d, grid, cell)}
    common = sorted(set(seeds[baseline.name]) & set(seeds[proposal.name]))
    return [(seed, seeds[baseline.name][seed], seeds[proposal.name][seed]) for seed in common]


def _paired_units(root: Path, grid: Grid, baseline: Cell, proposal: Cell, key: str):
    """(kind, baseline stats per seed, proposal stats per seed, units) over the seeds both
    cells finished, or why there is no comparison (a short text for the table)."""
    pairs = seed_pairs(root, grid, baseline, proposal)
    if not pairs:
        return "not run (no seed of both cells)"
    return _units_of_pairs(pairs, key)


@dataclass(frozen=True)
class FolderResult:
    """One cell's runs in two runs folders (the same grid and config, e.g. float32 and
    bf16-mixed), seed k with seed k, compared on one metric: ``comparison`` is the other
    folder's runs minus these (None when there is none, ``why`` says why)."""

    cell: str
    label: str
    comparison: sig.Comparison | None = None
    why: str = ""


def folder_results(experiment: Experiment, grid: Grid, config: str,
                   other: Path) -> list[FolderResult]:
    """Each cell of ``grid`` compared with itself in another runs folder: the runs under
    ``$ATTNREPRO_RUNS`` (this folder) against those under ``other`` (a runs root, as
    ``$ATTNREPRO_RUNS``), on the grid's first test metric with per-example units, over the
    seeds both folders ran (seed k with seed k: the same initialisation and data order) and
    the test examples, paired by id: what changes with what differs between the folders
    (a precision, a machine), with the claims' own test."""
    here = experiment.grid_folder(grid, config)
    there = Path(other) / experiment.name / here.name
    labels = claim_labels(grid)
    if not labels:
        return []
    label, key = next(iter(labels.items()))
    out = []
    for cell in grid.cells:
        runs = [{seed_of(d, cell): d for d in cell_runs(root, cell) if run_finished(d, grid, cell)}
                for root in (here, there)]
        if not runs[0] and not runs[1]:
            continue
        common = sorted(set(runs[0]) & set(runs[1]))
        if not common:
            out.append(FolderResult(cell.name, label, why="no seed in both folders (this "
                                    f"one: {sorted(runs[0]) or 'none'}, the other: "
                                    f"{sorted(runs[1]) or 'none'})"))
            continue
        found = _units_of_pairs([(s, runs[0][s], runs[1][s]) for s in common], key)
        if isinstance(found, str):
            out.append(FolderResult(cell.name, label, why=found))
            continue
        kind, b_stats, p_stats, _ = found
        out.append(FolderResult(cell.name, label, sig.compare(
            kind, b_stats, p_stats, samples=CLAIM_SAMPLES, seed=CLAIM_SEED,
            test=claim_test(key))))
    return out


def _units_of_pairs(pairs: list[tuple[int, Path, Path]], key: str):
    """(kind, first runs' stats per seed, second runs' stats per seed, units) of the runs
    ``pairs`` (seed, first run folder, second run folder), or why there is no paired test."""
    kind, b_stats, p_stats = None, [], []
    for seed, b_dir, p_dir in pairs:
        try:
            b_kind, b_ids, b = sig.run_units(b_dir, key)
            kind, p_ids, p = sig.run_units(p_dir, key)
        except (FileNotFoundError, ValueError) as err:
            return f"no paired test: {err}".replace("|", "/")
        if b_ids != p_ids:
            return (f"no paired test: seed {seed}: the two runs' test examples differ "
                    f"({len(b_ids)} vs {len(p_ids)} units)")
        b_stats.append(b)
        p_stats.append(p)
    return kind, b_stats, p_stats, len(b_stats[0])
