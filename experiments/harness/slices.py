"""Where does a claimed gain come from?  Each claim of a grid (baseline -> proposal, per
metric: :func:`~experiments.harness.verdicts.claim_metrics`) tested again within each slice
of the test set that an experiment declares (experiments/harness/slice_model.py): per slice
both cells' metric over the slice's units (mean over the seeds both ran), the paired
difference with its 95% interval and p, and the number of units.

The test is the claim's own (experiments/harness/significance.py's ``compare`` with the
claim's samples, random seed and test; seeds the outer level of the bootstrap), given the
units of the slice only: per seed pair, the rows of the stats arrays whose units fall into
the slice.  Corpus-level metrics stay corpus-level: a bucket's BLEU is the corpus BLEU of
its sentences' summed statistics, resampled sentence by sentence.

A unit's slice is computed from each run's own per-example file, so a slice that holds no
unit of one cell (or whose units differ between the two cells) is reported with its counts
and why it has no test, never dropped; and so is every slice a slicing declares.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from experiments.harness import significance as sig
from experiments.harness.grid_model import Experiment, Grid, shown_path
from experiments.harness.slice_model import Slicing, bin_label, value_bins
from experiments.harness.verdicts import (
    CLAIM_SAMPLES,
    CLAIM_SEED,
    claim_labels,
    claim_metrics,
    claim_test,
    seed_pairs,
)


@dataclass(frozen=True)
class SliceRow:
    """One slice of a claim: the units in it per cell (in the first seed pair), each cell's
    metric over them (mean over seeds; None where the slice is empty), the paired comparison
    (None when there is none: ``why``)."""

    name: str
    n_baseline: int
    n_proposal: int
    baseline: float | None
    proposal: float | None
    comparison: sig.Comparison | None = None
    why: str = ""


@dataclass(frozen=True)
class SlicedClaim:
    """A claim's metric cut by one slicing: its rows, or why there are none."""

    baseline: str
    proposal: str
    label: str
    slicing: Slicing
    seeds: int = 0
    rows: list[SliceRow] = field(default_factory=list)
    why: str = ""

    @property
    def claim(self) -> str:
        return f"{self.proposal} vs {self.baseline}"


@dataclass(frozen=True)
class _Run:
    """One run's units of a metric: their ids and stats, the per-example file and its rows
    grouped by unit."""

    kind: str
    ids: list[int]
    stats: np.ndarray
    path: Path
    rows: list[dict]


def _read(run_dir: Path, key: str) -> _Run:
    kind, ids, stats = sig.run_units(run_dir, key)
    path, _ = sig.units_file(run_dir, key)
    return _Run(kind, ids, stats, path, sig.read_rows(path))


def unit_values(slicing: Slicing, run: _Run) -> dict[int, object] | str:
    """Unit id -> what ``slicing`` reads from the unit's rows (a label, or the number its
    bins cut), for the run's units; or why it cannot be read (a row without a field the
    slicing needs).  A value the slicing cannot make of a row raises ValueError naming the
    file and the unit."""
    missing = [f for f in (*slicing.fields, slicing.unit) if any(f not in r for r in run.rows)]
    if missing:
        hint = ("; `keep --tokens-from-data` gives a run its counts from its test set"
                if "tokens" in missing else "")
        return (f"{run.path.parent.name}/{run.path.name} has no "
                f"{', '.join(map(repr, missing))} field (written, or committed, without "
                f"it{hint})")
    grouped: dict[int, list[dict]] = {}
    for r in run.rows:
        grouped.setdefault(int(r[slicing.unit]), []).append(r)
    out = {}
    for uid in run.ids:
        try:
            out[uid] = slicing.of(grouped[uid])
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise ValueError(f"{shown_path(run.path)}: {slicing.unit} {uid}: slice "
                             f"{slicing.name!r} cannot be read from it ({err})") from None
    return out


def slice_edges(slicing: Slicing, values: list[float]) -> list[float]:
    """The inner edges of ``slicing``'s bins: its fixed edges, or the quantiles of
    ``values`` (numbers of the data: the lower of two neighbours where a quantile falls
    between them, so integer counts are cut at integers)."""
    if isinstance(slicing.bins, tuple):
        return list(slicing.bins)
    q = slicing.bins
    return [float(e) for e in np.quantile(np.asarray(values, dtype=np.float64),
                                          [k / q for k in range(1, q)],
                                          method="inverted_cdf")]


def _labeller(slicing: Slicing, edges: list[float] | None):
    """A unit's value -> its slice's name, and the names in print order (declared first)."""
    if edges is None:
        return str, list(slicing.labels)
    quantiles = slicing.bins if isinstance(slicing.bins, int) else None
    names = [bin_label(k, low, high, quantiles, slicing.unit_name)
             for k, (low, high) in enumerate(value_bins(edges))]
    return (lambda v: names[int(np.searchsorted(edges, float(v), side="left"))]), names


def _order(found: set[str], declared: list[str]) -> list[str]:
    """The declared slices, then the others found, numbers in numeric order."""
    def key(name: str):
        try:
            return (0, float(name), name)
        except ValueError:
            return (1, 0.0, name)

    return declared + sorted(found - set(declared), key=key)


def slice_claim(kind_key: str, slicing: Slicing, pairs: list[tuple[int, _Run, _Run]],
                names: tuple[str, str]) -> list[SliceRow] | str:
    """The rows of one claim's metric cut by ``slicing``: per slice both cells' metric and
    the paired comparison on its units, over the seed pairs ``pairs`` (seed, baseline run,
    proposal run); or why the slicing cannot be read."""
    values = []
    for _, b, p in pairs:
        found = [unit_values(slicing, run) for run in (b, p)]
        for v in found:
            if isinstance(v, str):
                return v
        values.append(found)
    edges = None
    if slicing.bins is not None:
        edges = slice_edges(slicing, [float(v) for v in values[0][0].values()])
    name_of, declared = _labeller(slicing, edges)
    labelled = [[{uid: name_of(v) for uid, v in run_values.items()} for run_values in pair]
                for pair in values]
    found = {name for pair in labelled for run_labels in pair for name in run_labels.values()}
    kind = pairs[0][1].kind
    rows = []
    for name in _order(found, declared):
        parts = []  # per seed pair: (baseline ids, stats), (proposal ids, stats) in the slice
        for (_, b, p), (b_labels, p_labels) in zip(pairs, labelled):
            part = []
            for run, run_labels in ((b, b_labels), (p, p_labels)):
                keep = np.array([run_labels[uid] == name for uid in run.ids], dtype=bool)
                part.append(([uid for uid, k in zip(run.ids, keep) if k], run.stats[keep]))
            parts.append(part)
        (b_ids, _), (p_ids, _) = parts[0]
        means = [None, None]
        for side in (0, 1):
            if all(len(part[side][0]) for part in parts):
                means[side] = float(np.mean([sig.aggregate(kind, part[side][1])
                                             for part in parts]))
        same = all(part[0][0] == part[1][0] == parts[0][0][0] for part in parts)
        if not b_ids or not p_ids:
            empty = [cell for cell, ids in zip(names, (b_ids, p_ids)) if not ids]
            why = f"no unit in {' and '.join(empty)}"
        elif not same:
            why = "the slice's units differ between the runs (not paired)"
        else:
            c = sig.compare(kind, [part[0][1] for part in parts], [part[1][1] for part in parts],
                            samples=CLAIM_SAMPLES, seed=CLAIM_SEED, test=claim_test(kind_key))
            rows.append(SliceRow(name, len(b_ids), len(p_ids), c.baseline, c.proposal, c))
            continue
        rows.append(SliceRow(name, len(b_ids), len(p_ids), means[0], means[1], why=why))
    return rows


def slice_results(experiment: Experiment, grid: Grid, config: str, slicings: list[Slicing],
                  root: Path | None = None) -> list[SlicedClaim]:
    """Each claim of ``grid`` and metric (as the claims table tests them) cut by each of
    ``slicings``, on the runs under the grid folder ``root`` (default: the grid's run folder
    of ``config``)."""
    root = experiment.grid_folder(grid, config) if root is None else root
    labels = claim_labels(grid)
    out = []
    for baseline, proposal, label, _ in claim_metrics(grid):
        key = labels[label]
        found = seed_pairs(root, grid, grid.cell(baseline), grid.cell(proposal))
        why, pairs = "", []
        if not found:
            why = "not run (no seed of both cells)"
        for seed, b_dir, p_dir in found:
            try:
                pairs.append((seed, _read(b_dir, key), _read(p_dir, key)))
            except (FileNotFoundError, ValueError) as err:
                why = f"no paired test: {err}"
                break
        for slicing in slicings:
            if why:
                out.append(SlicedClaim(baseline, proposal, label, slicing, why=why))
                continue
            rows = slice_claim(key, slicing, pairs, (baseline, proposal))
            out.append(SlicedClaim(baseline, proposal, label, slicing, len(pairs),
                                   rows if isinstance(rows, list) else [],
                                   rows if isinstance(rows, str) else ""))
    return out
