"""``report --against DIR`` (issue 50 item 2: accuracy parity of bf16-mixed against float32):
each cell against itself in another runs root, seed k with seed k, paired over the test
examples with the claims' own bootstrap; the settings the two folders differ in named; a
cell in one folder only, or a missing folder, said in its row or line."""

from __future__ import annotations

import pytest
import yaml

from experiments import coda_sentiment
from experiments.harness import significance as sig
from experiments.harness.report import format_against
from experiments.harness.runner import main as run_script
from experiments.harness.verdicts import CLAIM_SAMPLES, CLAIM_SEED, folder_results
from tests.experiments.test_report import classified, write_run

EXPERIMENT = coda_sentiment.EXPERIMENT
GRID = EXPERIMENT.grid("table5")
# per seed: which of 10 test sentences each folder's run gets right
HERE = {0: [True] * 8 + [False] * 2, 1: [True] * 6 + [False] * 4}
THERE = {0: [True] * 9 + [False], 1: [True] * 7 + [False] * 3}


def runs(root, right: dict[int, list[bool]], precision: str, cells=("sst-transformer",)):
    for cell in cells:
        for seed, correct in right.items():
            folder = write_run(root / "coda_sentiment" / "table5-smoke" / f"{cell}-seed{seed}",
                               classified(correct), {"test/acc": sum(correct) / 10})
            (folder / "config.yaml").write_text(yaml.safe_dump(
                {"seed_everything": seed, "trainer": {"precision": precision},
                 "run": {"name": folder.name}}))


def test_each_cell_against_itself_in_the_other_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path / "fp32"))
    runs(tmp_path / "fp32", HERE, "32-true")
    runs(tmp_path / "bf16", THERE, "bf16-mixed")
    (r,) = folder_results(EXPERIMENT, GRID, "smoke", tmp_path / "bf16")
    expected = sig.compare("mean", [sig.mean_stats(HERE[s]) for s in (0, 1)],
                           [sig.mean_stats(THERE[s]) for s in (0, 1)],
                           samples=CLAIM_SAMPLES, seed=CLAIM_SEED, test="bootstrap")
    assert (r.cell, r.label, r.comparison) == ("sst-transformer", "Acc", expected)
    assert r.comparison.baseline == pytest.approx(70.0) and r.comparison.diff == \
        pytest.approx(10.0)
    text = format_against(EXPERIMENT, GRID, "smoke", tmp_path / "bf16")
    assert ("the settings the runs differ in (sst-transformer-seed0's config.yaml): "
            "trainer.precision: '32-true' here, 'bf16-mixed' there.") in text
    row = expected.row()
    assert (f"| sst-transformer | Acc | 70.00 | 80.00 | {row['diff']} | {row['p']} | "
            "2 x 10 |") in text.splitlines()


def test_a_cell_in_one_folder_and_seeds_that_do_not_meet(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path / "fp32"))
    runs(tmp_path / "fp32", HERE, "32-true", cells=("sst-transformer", "sst-coda"))
    runs(tmp_path / "bf16", {2: THERE[0]}, "bf16-mixed")
    results = {r.cell: r for r in folder_results(EXPERIMENT, GRID, "smoke", tmp_path / "bf16")}
    assert set(results) == {"sst-transformer", "sst-coda"}  # imdb cells: in neither folder
    assert results["sst-transformer"].why == ("no seed in both folders (this one: [0, 1], "
                                              "the other: [2])")
    assert results["sst-coda"].why == "no seed in both folders (this one: [0, 1], the other: none)"


def test_report_against_a_folder_without_the_grid_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path / "fp32"))
    runs(tmp_path / "fp32", HERE, "32-true")
    run_script(EXPERIMENT, ["report", "table5", "--smoke", "--against", str(tmp_path / "x")])
    out = capsys.readouterr().out
    assert (f"Against {tmp_path}/x/coda_sentiment/table5-smoke: no such folder (--against "
            "names a runs root, as $ATTNREPRO_RUNS: the grid's runs are in "
            "<root>/coda_sentiment/table5-smoke)") in out
