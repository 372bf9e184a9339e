"""``report --plot`` (experiments/harness/plots.py) on run folders written here: the files it writes
and where, the panels, cells and labels of each figure read back from the Figure objects
(not pixels), a grid with missing cells drawn as far as it goes with the missing ones named,
the CoDA gate figure from diagnostics columns, learning curves for every grid, and the
figures logged to the grid's W&B summary run as images."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import coda_mlu, coda_ranking, coda_sentiment, decomp_snli, dwin_classification
from experiments.harness.plots import grid_plots, plot_curves, plot_gates, plot_paper, write_plots
from experiments.harness.report import format_curves, print_report
from experiments.harness.runs import curve_metric, learning_curves, validation_metrics

ROOT = Path(__file__).resolve().parents[2]


def write_run(folder: Path, val: list[tuple[int, float]], test: dict[str, float] | None = None,
              correct: list[bool] | None = None, extra: dict[int, dict[str, float]] = None,
              key: str = "val/acc") -> None:
    """A run folder: ``key`` at Lightning's logged steps (steps done - 1), one test row,
    per-example predictions, and ``extra`` columns logged at the step given."""
    folder.mkdir(parents=True)
    extra = extra or {}
    columns = ["epoch", "step", key, *(test or {}),
               *dict.fromkeys(k for row in extra.values() for k in row)]
    rows = [{"step": s, key: v} for s, v in val] + [{"step": s, **r} for s, r in extra.items()]
    if test:
        rows.append({"step": max(s for s, _ in val), **test})
    lines = [",".join(columns)] + [",".join(str(r.get(c, "0" if c == "epoch" else ""))
                                            for c in columns) for r in rows]
    (folder / "metrics.csv").write_text("\n".join(lines) + "\n")
    if correct is not None:
        (folder / "predictions-test.jsonl").write_text("".join(
            json.dumps({"id": i, "gold": 1, "prediction": int(ok)}) + "\n"
            for i, ok in enumerate(correct)))


def texts(items) -> list[str]:
    return [t.get_text() for t in items]


@pytest.fixture
def sentiment_runs(tmp_path, monkeypatch):
    """coda_sentiment table5, config smoke: IMDb both cells with 2 seeds (CoDA right on every
    review, the Transformer on half), SST the Transformer's seed 0 only, SST-CoDA not run."""
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path / "runs"))
    group = tmp_path / "runs" / "coda_sentiment" / "table5-smoke"
    half = [i % 2 == 0 for i in range(40)]
    for seed in (0, 1):
        write_run(group / f"imdb-transformer-seed{seed}", [(9, 0.4 + seed / 10), (19, 0.5)],
                  {"test/acc": 0.5}, half)
        write_run(group / f"imdb-coda-seed{seed}", [(9, 0.6), (19, 0.9 + seed / 20)],
                  {"test/acc": 1.0}, [True] * 40)
    write_run(group / "sst-transformer-seed0", [(9, 0.55)], {"test/acc": 0.5}, half)
    return coda_sentiment.EXPERIMENT, coda_sentiment.EXPERIMENT.grid("table5"), group


def test_plot_writes_every_figure_named_by_grid_and_config(sentiment_runs, tmp_path):
    experiment, grid, group = sentiment_runs
    printed = write_plots(experiment, grid, "smoke")
    names = ["curves", "paper", "claims"]
    files = [group / "plots" / f"coda_sentiment-table5-smoke-{n}.png" for n in names]
    assert all(f.stat().st_size > 10_000 for f in files)
    assert sorted(p.name for p in (group / "plots").iterdir()) == sorted(f.name for f in files)
    for name, f in zip(names, files):
        assert f"![{name}]({f})" in printed
    # what is missing, said once per figure
    assert printed.endswith("Missing: curves: no validation logged by sst-coda; paper: not "
                            "run: sst-coda; claims: not tested: sst-coda vs sst-transformer "
                            "(Acc).")
    out = tmp_path / "elsewhere"
    write_plots(experiment, grid, "smoke", out)
    assert sorted(p.name for p in out.iterdir()) == sorted(f.name for f in files)


def test_curves_figure_one_panel_per_metric_mean_and_band(sentiment_runs):
    experiment, grid, group = sentiment_runs
    fig, missing = plot_curves(experiment, grid, "smoke")
    (ax,) = fig.axes
    assert ax.get_title() == "Acc: val/acc" and ax.get_ylabel() == "val/acc (%)"
    assert texts(ax.get_legend().get_texts()) == ["imdb-transformer", "imdb-coda",
                                                  "sst-transformer"]
    assert missing == ["sst-coda"]
    assert fig._suptitle.get_text().endswith("no validation logged: sst-coda")
    # the mean over seeds at optimiser steps done (logged step + 1), a band where 2 seeds
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["imdb-transformer"].get_xdata()) == [10, 20]
    assert list(lines["imdb-transformer"].get_ydata()) == pytest.approx([45.0, 50.0])
    assert list(lines["imdb-coda"].get_ydata()) == pytest.approx([60.0, 92.5])
    assert len(ax.collections) == 2  # the two IMDb cells; one seed of SST has no band


def test_curves_and_tradeoff_colours_tell_eleven_cells_apart():
    """Matplotlib's default cycle has 10 colours: the 11th cell of attention_compare's grids
    drew in the 1st's (softmax and coda-beta0.25 both blue). distinct_colour gives 20, the
    first 10 the default cycle's, so a grid of 10 cells or fewer draws as before."""
    from matplotlib import colors, rcParams

    from experiments.harness.plots import distinct_colour
    cycle = rcParams["axes.prop_cycle"].by_key()["color"]
    assert [colors.to_hex(distinct_colour(n)) for n in range(10)] == [colors.to_hex(c)
                                                                      for c in cycle]
    assert len({distinct_colour(n) for n in range(20)}) == 20
    assert distinct_colour(20) == distinct_colour(0)


def test_paper_and_claims_figures_name_every_cell_and_claim(sentiment_runs):
    experiment, grid, _ = sentiment_runs
    fig, missing = plot_paper(experiment, grid, "smoke")
    (ax,) = fig.axes
    assert texts(ax.get_yticklabels()) == ["imdb-transformer", "imdb-coda", "sst-transformer",
                                           "sst-coda (not run)"]
    assert set(texts(ax.get_legend().get_texts())) == {"paper", "ours (mean +- 1 s.d.)",
                                                       "ours, one seed"}
    assert ax.get_title() == "Acc" and missing == ["sst-coda"]
    paper = next(line for line in ax.get_lines() if line.get_label() == "paper")
    assert paper.get_xdata()[0] == 82.6  # imdb-transformer, the top row
    claims = grid_plots(experiment, grid, "smoke").figures["claims"]
    (ax,) = claims.axes
    # smoke runs on the synthetic reviews: their paired test drawn, no verdict
    assert texts(ax.get_yticklabels()) == [
        "imdb-coda vs imdb-transformer (Acc): synthetic data: checks that the grid runs, not "
        "a measurement, 2 x 40",
        "sst-coda vs sst-transformer (Acc): not run"]
    assert set(texts(ax.get_legend().get_texts())) == {"paper", "ours [95% CI]"}
    assert ax.get_xlabel() == "proposal - baseline"


def test_a_one_seed_verdict_is_marked_on_the_claims_figure(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    group = tmp_path / "coda_sentiment" / "table5-paper"
    write_run(group / "imdb-transformer-seed0", [(9, 0.5)], {"test/acc": 0.5},
              [i % 2 == 0 for i in range(40)])
    write_run(group / "imdb-coda-seed0", [(9, 0.9)], {"test/acc": 1.0}, [True] * 40)
    experiment, grid = coda_sentiment.EXPERIMENT, coda_sentiment.EXPERIMENT.grid("table5")
    (ax,) = grid_plots(experiment, grid, "paper").figures["claims"].axes
    assert texts(ax.get_yticklabels())[0] == ("imdb-coda vs imdb-transformer (Acc): holds "
                                              "(one seed), 1 x 40")


def test_one_panel_per_validation_metric_of_the_grid(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    grid = coda_ranking.EXPERIMENT.grid("table2")
    assert validation_metrics(grid) == {"MAP": "val/map", "MRR": "val/mrr", "R10@1": "val/p@1"}
    write_run(tmp_path / "coda_ranking" / "table2-smoke" / "wikiqa-coda-seed0", [(4, 0.6)],
              key="val/map")
    fig, missing = plot_curves(coda_ranking.EXPERIMENT, grid, "smoke")
    assert [ax.get_title() for ax in fig.axes] == ["MAP: val/map", "MRR: val/mrr",
                                                  "R10@1: val/p@1"]
    assert texts(fig.axes[0].get_legend().get_texts()) == ["wikiqa-coda"]
    assert [t.get_text() for t in fig.axes[1].texts] == ["not logged by any run"]
    assert "wikiqa-softmax" in missing and "wikiqa-coda" not in missing


def test_every_grid_has_a_learning_curve_metric():
    """--curve and --plot for every grid of every experiment script: the grid's curve, else
    its first metric's validation counterpart (val/loss for a grid of costs)."""
    scripts = sorted(p.stem for p in (ROOT / "experiments").glob("*.py")
                     if "\nEXPERIMENT = Experiment(" in p.read_text())
    assert len(scripts) >= 12
    for name in scripts:
        for grid in importlib.import_module(f"experiments.{name}").EXPERIMENT.grids.values():
            assert curve_metric(grid).startswith("val/"), (name, grid.name)
    assert curve_metric(decomp_snli.EXPERIMENT.grid("table1")) == "val/acc"
    assert curve_metric(coda_ranking.EXPERIMENT.grid("table8")) == "val/map"
    assert curve_metric(dwin_classification.EXPERIMENT.grid("cost")) == "val/loss"
    assert curve_metric(coda_mlu.EXPERIMENT.grid("table6")) == "val/exact_match"


def test_report_curve_for_a_grid_that_names_no_curve(tmp_path, monkeypatch, capsys):
    """decomp_snli's Table 1 names no Grid.curve: --curve tabulates val/acc."""
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    group = tmp_path / "decomp_snli" / "table1-smoke"
    write_run(group / "vanilla-seed0", [(49, 0.40), (99, 0.50)])
    write_run(group / "intra-seed0", [(49, 0.30)])
    grid = decomp_snli.EXPERIMENT.grid("table1")
    assert format_curves(decomp_snli.EXPERIMENT, grid, "smoke").splitlines()[0].endswith(
        "learning curves, val/acc")
    print_report(decomp_snli.EXPERIMENT, ["table1", "--smoke", "--curve", "--plot",
                                          "--out", str(tmp_path / "plots")])
    out = capsys.readouterr().out
    assert "| 50 | 40.00 | 30.00 | - | - |" in out and "| 100 | 50.00 | - | - | - |" in out
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        f"decomp_snli-table1-smoke-{n}.png" for n in ("claims", "curves", "paper")]
    (ax,) = grid_plots(decomp_snli.EXPERIMENT, grid, "smoke").figures["claims"].axes
    # validations only, no test yet: runs still training, so the claim is not run
    assert texts(ax.get_yticklabels())[0] == "intra vs vanilla (Test acc): not run"
    # the grid's two metrics, Val acc and Test acc, have one validation counterpart
    fig, _ = plot_curves(decomp_snli.EXPERIMENT, grid, "smoke")
    assert [ax.get_title() for ax in fig.axes] == ["Val acc: val/acc"]


def gate_columns(gates: dict[int, float]) -> dict[str, float]:
    return {f"coda/decoder.{layer}.cross/gate_mean": g for layer, g in gates.items()}


def test_coda_gate_figure_beside_the_validation_curve(tmp_path, monkeypatch):
    """Runs with the diagnostics' columns (logged at the step done, validation at step - 1):
    per cell its curve and one gate line per decoder layer, on the same steps."""
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path / "runs"))
    group = tmp_path / "runs" / "coda_mlu" / "study-curve"
    for seed, shift in ((0, 0.0), (1, 0.1)):
        write_run(group / f"coda-seed{seed}", [(999, 0.2), (1999, 0.3)], key="val/exact_match",
                  extra={0: gate_columns({0: 0.5 + shift, 1: 0.6}),
                         1000: gate_columns({0: 0.3 + shift, 1: 0.4}),
                         2000: gate_columns({0: 0.1 + shift, 1: 0.2})})
    write_run(group / "transformer-seed0", [(999, 0.4)], key="val/exact_match")
    experiment, grid = coda_mlu.EXPERIMENT, coda_mlu.EXPERIMENT.grid("study")
    fig = plot_gates(experiment, grid, "curve")
    left, right = fig.axes  # one cell logged the gate: one row
    assert left.get_title() == "coda: val/exact_match"
    assert right.get_title() == "coda: cross-attention gate (gate_mean)"
    assert texts(right.get_legend().get_texts()) == ["decoder layer 0", "decoder layer 1"]
    layer0 = right.get_lines()[0]
    assert list(layer0.get_xdata()) == [0, 1000, 2000]
    assert list(layer0.get_ydata()) == pytest.approx([0.55, 0.35, 0.15])
    assert list(left.get_lines()[0].get_xdata()) == [1000, 2000]
    assert "gates" in grid_plots(experiment, grid, "curve").figures
    # no diagnostics, no gate figure
    assert plot_gates(experiment, coda_mlu.EXPERIMENT.grid("table6"), "curve") is None
    # experiments/harness/curves.py draws with the same functions and adds the gate figure
    from experiments.harness import curves

    (group / "coda-seed1" / "hparams.yaml").write_text(
        "machine/cpu_capability: AVX512\nmachine/threads: 1\n")
    (group / "transformer-seed0" / "hparams.yaml").write_text("machine/threads: 2\n")
    curves.main(["coda_mlu", "study", "--config", "curve", "--out", str(tmp_path / "c")])
    assert (tmp_path / "c.png").stat().st_size > 0 and (tmp_path / "c-gates.png").exists()
    # the runs' commit not given; their machine/* as logged, each key's values over the runs
    assert ("\nRuns made at: not given (--runs-commit names the commit).\nMachine (machine/* of "
            "the 3 runs' hparams.yaml): CPU model not recorded, torch's CPU capability AVX512, "
            "threads per run 1 / 2, torch not recorded; cores not recorded by the runs.\n"
            ) in (tmp_path / "c.md").read_text()
    assert learning_curves(experiment, grid, "curve")["coda"] == {
        1000: pytest.approx([20.0, 20.0]), 2000: pytest.approx([30.0, 30.0])}


def test_grid_summary_run_logs_the_figures_as_images(sentiment_runs, tmp_path, monkeypatch):
    """The grid's W&B summary run (offline) holds the paper's table and one image per
    figure of report --plot."""
    from tests.wandb_records import history

    experiment, grid, group = sentiment_runs
    (group / "imdb-coda-seed0" / "wandb").mkdir()  # a cell logged to W&B
    # in its own process, as after a grid: W&B's state in this one depends on the tests run
    # before it in the same pytest worker
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_MODE="offline", HOME=str(tmp_path), OMP_NUM_THREADS="1",
               WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"))
    code = ("from experiments.coda_sentiment import EXPERIMENT as e; "
            "from experiments.harness.wandb_summary import log_grid_summary; "
            "log_grid_summary(e, e.grid('table5'), 'smoke')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "W&B summary run logged" in proc.stdout, proc.stderr[-3000:]
    (run_file,) = (group / "summary" / "wandb").glob("offline-run-*/run-*.wandb")
    logged = history(run_file)
    for name, caption in (("curves", "validation curves"), ("paper", "paper vs ours"),
                          ("claims", "paired difference per claim")):
        assert logged[f"plots/{name}/_type"] == ["image-file"]
        assert logged[f"plots/{name}/format"] == ["png"]
        assert logged[f"plots/{name}/caption"][0].startswith(caption)
    assert logged["paper_table/_type"] == ["table-file"]
    assert logged["slices_table/_type"] == ["table-file"]  # report --slices, as numbers
    assert not any(k.startswith("plots/gates") for k in logged)


def test_gate_table_first_and_last_step_mean_over_seeds(tmp_path, monkeypatch):
    """experiments.harness.curves' gate table (format_gates): per cell and decoder layer the four
    cross-attention figures at the first and the last logged step, the mean over the seeds
    that logged that step, '-' for a figure no seed logged; no table without diagnostics."""
    from experiments.harness.curves import format_gates

    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path / "runs"))
    group = tmp_path / "runs" / "coda_mlu" / "study-curve"

    def figures(layer: int, mean: float, shut: float, rows: float | None) -> dict[str, float]:
        out = {f"coda/decoder.{layer}.cross/gate_mean": mean,
               f"coda/decoder.{layer}.cross/gate_shut": shut,
               f"coda/decoder.{layer}.cross/gate_open": 0.0}
        if rows is not None:
            out[f"coda/decoder.{layer}.cross/row_sum_abs"] = rows
        return out

    write_run(group / "coda-seed0", [(999, 0.2), (1999, 0.3)], key="val/exact_match",
              extra={0: figures(0, 0.5, 0.0, 0.8), 1000: figures(0, 0.3, 0.2, 0.6),
                     2000: figures(0, 0.1, 0.9, 0.4)})
    write_run(group / "coda-seed1", [(999, 0.2)], key="val/exact_match",  # stopped at 1000
              extra={0: figures(0, 0.7, 0.0, None), 1000: figures(0, 0.2, 0.4, None)})
    write_run(group / "transformer-seed0", [(999, 0.4)], key="val/exact_match")
    experiment = coda_mlu.EXPERIMENT
    table = format_gates(experiment, experiment.grid("study"), "curve").splitlines()
    assert table[3] == ("| cell | decoder layer | step | mean gate | share < 0.05 | "
                        "share > 0.95 | mean abs(row sum of M) |")
    # step 0: both seeds (0.5 and 0.7: 0.600), row sums of seed 0 only; step 2000: seed 0
    assert table[5:] == ["| coda | 0 | 0 | 0.600 | 0.000 | 0.000 | 0.800 |",
                         "| coda | 0 | 2000 | 0.100 | 0.900 | 0.000 | 0.400 |"]
    assert format_gates(experiment, experiment.grid("table6"), "curve") is None
