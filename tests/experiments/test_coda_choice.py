"""The CoDA setting carried to Table 6 at 100K steps (experiments/coda_mlu.py CHOSEN_CODA) is
the one the decoder study's rule picks from the committed study runs
(results/coda_mlu_study_runs): of STUDY_CANDIDATES, the highest validation exact match at
step 20,000, ties broken by the mean of steps 18,000-20,000 (configs/coda_mlu/study.yaml).
The grids that carry it keep the paper's cells and one recipe for all."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments import coda_mlu, coda_mt
from experiments.harness.runs import learning_curves

ROOT = Path(__file__).resolve().parents[2]
STUDY_RUNS = ROOT / "results" / "coda_mlu_study_runs" / "coda_mlu" / "study-study"
RULE_STEP, TIE_STEPS = 20_000, (18_000, 19_000, 20_000)


def choose(curves: dict[str, dict[int, list[float]]], candidates) -> str:
    """study.yaml's rule on learning curves (cell -> step -> values over seeds)."""
    missing = [c for c in candidates if RULE_STEP not in curves.get(c, {})]
    if missing:
        raise ValueError(f"no validation at step {RULE_STEP} for {missing}: the rule waits")

    def mean(values):
        return sum(values) / len(values)

    def key(cell):
        curve = curves[cell]
        return mean(curve[RULE_STEP]), mean([mean(curve[s]) for s in TIE_STEPS])
    return max(candidates, key=key)


def test_rule_reads_step_20000_and_breaks_ties_on_the_last_three_validations():
    curves = {"a": {18_000: [0.5], 19_000: [0.5], 20_000: [0.6]},
              "b": {18_000: [0.6], 19_000: [0.6], 20_000: [0.6]},
              "c": {18_000: [0.9], 19_000: [0.9], 20_000: [0.55]}}
    assert choose(curves, ["a", "b", "c"]) == "b"  # c's earlier peak does not count
    assert choose(curves, ["a", "c"]) == "a"
    with pytest.raises(ValueError, match="rule waits"):
        choose({"a": {19_000: [0.5]}}, ["a"])


@pytest.mark.skipif(not STUDY_RUNS.is_dir(), reason="the committed study runs are absent")
def test_chosen_setting_is_the_rule_applied_to_the_committed_study_runs():
    experiment = coda_mlu.EXPERIMENT
    study = experiment.grid("study")
    assert set(coda_mlu.STUDY_CANDIDATES) <= {c.name for c in study.cells}
    assert not any("lr" in c for c in coda_mlu.STUDY_CANDIDATES)  # one recipe: lr never chosen
    curves = learning_curves(experiment, study, "study", root=STUDY_RUNS)
    assert choose(curves, coda_mlu.STUDY_CANDIDATES) == coda_mlu.CHOSEN_CODA.name
    assert study.cell(coda_mlu.CHOSEN_CODA.name).args == coda_mlu.CHOSEN_CODA.args


@pytest.mark.parametrize("experiment, grid, paper", [
    (coda_mlu.EXPERIMENT, "table6_chosen", "table6"),
    (coda_mt.EXPERIMENT, "table4_chosen", "table4"),
])
def test_grids_with_the_chosen_setting_keep_the_papers_cells(experiment, grid, paper):
    chosen, table = experiment.grid(grid), experiment.grid(paper)
    assert [c.name for c in chosen.cells] == [c.name for c in table.cells] \
        + [coda_mlu.CHOSEN_CODA.name]
    for cell in table.cells:  # the same overrides and paper numbers: the recipe is not changed
        assert chosen.cell(cell.name) == cell
    assert chosen.cell(coda_mlu.CHOSEN_CODA.name).args == coda_mlu.CHOSEN_CODA.args
    assert chosen.cell(coda_mlu.CHOSEN_CODA.name).paper == {}
    assert chosen.claims == [("transformer", "coda"), ("transformer", coda_mlu.CHOSEN_CODA.name),
                             ("coda", coda_mlu.CHOSEN_CODA.name)]
