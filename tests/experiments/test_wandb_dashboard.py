"""The W&B dashboard answers the paper's question (issue 15, item 4), read offline from the run
files (tests/wandb_records.py): each run's config names its experiment, grid, cell and seed,
its job type says what it did, its summary keeps the best validation value and the last
test value, a test's per-example predictions are a table, and after a grid one more run in
the group holds the paper's table, ours beside it.  A plain run prints none of the warnings
it used to (Lightning's tips, W&B's "anonymous" setting, the CSV logger's "exists and is not
empty" about the grid's own output.log).

Two script runs, once for the module (about 30 s in all): a smoke grid of two DecompAtt cells
of decomp_snli's Table 1 (which write predictions), then a ``test`` of one of its checkpoints;
the parts are also tested without a run."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from experiments import decomp_snli
from experiments.harness.grid_model import Cell, Experiment, Grid
from experiments.harness.loggers import metric_summary, read_predictions
from experiments.harness.runs import cost_values, read_run
from experiments.harness.verdicts import claim_results
from experiments.harness.wandb_summary import claims_table, log_grid_summary, summary_table
from tests.conftest import last_values, run, shared_path
from tests.wandb_records import config, history, run_info, summary, table

#: the cost columns of report and of the W&B summary's paper_table
COSTS = ["params (M)", "steps/s", "peak MB", "wall min"]

ROOT = Path(__file__).resolve().parents[2]
DECOMP = ROOT / "experiments" / "decomp_snli.py"
SMOKE = ROOT / "experiments" / "configs" / "decomp_snli" / "smoke.yaml"
CELLS = ("vanilla", "intra")
WARNINGS = ("exists and is not empty", "\N{ELECTRIC LIGHT BULB} Tip", "anonymous setting",
            "wandb: WARNING")


def wandb_file(folder: Path) -> Path:
    """The one offline W&B run file under a run folder."""
    found = list(folder.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The grid and the test run, once for the module (the ``env`` fixture of conftest, made
    once: no W&B settings, runs and home in a temporary folder, one thread, eager CoDA)."""
    shared_path("snli/snli_1.0_dev.first1288.jsonl")
    tmp = tmp_path_factory.mktemp("dashboard")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(ATTNREPRO_RUNS=str(tmp / "runs"), ATTNREPRO_CACHE=str(tmp / "cache"),
               HOME=str(tmp), ATTNREPRO_THREADS="1", ATTNREPRO_COMPILE="0")
    grid_out = run(DECOMP, ["grid", "table1", "--smoke", "--cells", *CELLS, "--jobs", "2"], env)
    group = tmp / "runs" / "decomp_snli" / "table1-smoke"
    ckpt = next((group / "vanilla-seed0" / "checkpoints").glob("*.ckpt"))
    test_out = run(DECOMP, ["test", "--config", str(SMOKE), "--ckpt_path", str(ckpt),
                            "--seed_everything", "3", "--run.name", "evaluated"], env)
    run(DECOMP, ["test", "--config", str(SMOKE), "--ckpt_path", str(ckpt),  # own data seed
                 "--seed_everything", "3", "--data.seed", "7", "--run.name", "data_seed"], env)
    adhoc = tmp / "runs" / "decomp_snli" / "adhoc"
    return SimpleNamespace(group=group, evaluated=adhoc / "evaluated",
                           data_seed=adhoc / "data_seed", grid_out=grid_out, test_out=test_out)


@pytest.mark.slow
def test_every_run_says_what_it_is(runs):
    for cell in CELLS:
        path = wandb_file(runs.group / f"{cell}-seed0")
        assert run_info(path)["group"] == "decomp_snli/table1-smoke"
        assert run_info(path)["job_type"] == "train"
        cfg = config(path)
        assert {k: cfg[k] for k in ("experiment", "grid", "cell", "seed")} == {
            "experiment": "decomp_snli", "grid": "table1", "cell": cell, "seed": 0}
        assert cfg["data_seed"] == 0  # the DataModule's recorded seed, beside the run's
    path = wandb_file(runs.evaluated)  # a test outside any grid
    assert run_info(path)["job_type"] == "eval"
    assert run_info(path)["group"] == "decomp_snli/adhoc"
    cfg = config(path)
    assert {k: cfg[k] for k in ("experiment", "grid", "cell", "seed", "data_seed")} == {
        "experiment": "decomp_snli", "grid": None, "cell": None, "seed": 3, "data_seed": 3}
    cfg = config(wandb_file(runs.data_seed))  # a data seed given apart from the run's seed
    assert (cfg["seed"], cfg["data_seed"]) == (3, 7)


@pytest.mark.slow
def test_summaries_keep_the_best_validation_and_the_last_test_value(runs):
    for cell in CELLS:
        run_dir = runs.group / f"{cell}-seed0"
        path = wandb_file(run_dir)
        logged, final = history(path), summary(path)
        assert len(logged["val/acc"]) >= 2  # two validations: a best to choose
        assert final["val/acc"] == {"max": max(logged["val/acc"])}
        assert final["val/acc_best"] == {"max": max(logged["val/acc_best"])}
        assert final["val/loss"] == {"min": min(logged["val/loss"])}
        assert final["test/acc"] == {"last": logged["test/acc"][-1]}
        assert final["test/acc"]["last"] == pytest.approx(last_values(run_dir / "metrics.csv")
                                                          ["test/acc"])


@pytest.mark.slow
def test_test_predictions_are_a_table(runs):
    for run_dir in (runs.group / "vanilla-seed0", runs.evaluated):
        lines = [json.loads(line) for line in
                 (run_dir / "predictions-test.jsonl").read_text().splitlines()]
        path = wandb_file(run_dir)
        logged = table(path, "test/predictions")
        assert logged["columns"] == ["id", "line", "premise", "hypothesis", "gold",
                                     "prediction", "log_probs"]  # the input text too
        assert all(isinstance(r[2], str) and r[2] for r in logged["data"])
        assert logged["data"] == [[row[c] for c in logged["columns"]] for row in lines]
        final = summary(path)
        assert final["test/predictions_rows"] == final["test/predictions_logged_rows"] \
            == len(lines)


@pytest.mark.slow
def test_the_grid_logs_the_papers_table_in_its_group(runs, monkeypatch):
    assert "W&B summary run logged" in runs.grid_out
    path = wandb_file(runs.group / "summary")
    assert run_info(path)["job_type"] == "summary"
    assert run_info(path)["group"] == "decomp_snli/table1-smoke"
    cfg = config(path)
    assert (cfg["experiment"], cfg["grid"], cfg["cell"]) == ("decomp_snli", "table1", None)
    paper = table(path, "paper_table")
    assert paper["columns"] == [
        "cell", "paper Val acc", "ours Val acc", "ours Val acc std", "ours Val acc n",
        "paper Test acc", "ours Test acc", "ours Test acc std", "ours Test acc n",
        *COSTS]  # the cost columns report prints beside them
    rows = {row[0]: dict(zip(paper["columns"], row)) for row in paper["data"]}
    assert list(rows) == ["vanilla", "intra", "exact", "latent"]  # every row of the table
    for cell in CELLS:
        ours = last_values(runs.group / f"{cell}-seed0" / "metrics.csv")
        assert rows[cell]["ours Test acc"] == pytest.approx(100 * ours["test/acc"])
        assert rows[cell]["ours Val acc"] == pytest.approx(100 * ours["val/acc"])
        assert rows[cell]["ours Test acc n"] == 1 and rows[cell]["ours Test acc std"] is None
    assert rows["vanilla"]["paper Test acc"] == 86.3
    assert rows["exact"]["ours Test acc"] is None and rows["exact"]["ours Test acc n"] == 0
    monkeypatch.setenv("ATTNREPRO_RUNS", str(runs.group.parents[1]))
    experiment = decomp_snli.EXPERIMENT
    grid = experiment.grid("table1")
    costs = cost_values(experiment, grid, "smoke")
    for cell in CELLS:
        assert [rows[cell][c] for c in COSTS] == [
            None if v is None else pytest.approx(v) for v in costs[cell].values()]
    assert rows["vanilla"]["steps/s"] > 0
    claims = table(path, "claims_table")  # report's claims, as numbers
    assert claims["columns"] == ["claim", "metric", "paper diff", "ours baseline",
                                 "ours proposal", "ours diff", "ci low", "ci high", "p", "test",
                                 "verdict", "seeds", "units", "scale"]
    results = claim_results(experiment, grid, "smoke")
    assert [row[:3] + row[10:11] for row in claims["data"]] == [
        [r.claim, r.label, pytest.approx(r.paper_diff), r.shown_verdict or r.why]
        for r in results]
    assert claims["data"][0][11:] == [1, results[0].comparison.units,  # intra vs vanilla
                                      "smoke: not a measurement"]
    # the summary run says what its runs are: a smoke config's get no verdict
    assert cfg["scale"] == ("Scale: the smoke config: checks that the grid runs, not a "
                            "measurement (no verdict is drawn from it).")
    assert results[0].shown_verdict == "smoke: checks that the grid runs, not a measurement"


@pytest.mark.slow
def test_a_plain_run_prints_no_warning(runs):
    """Neither the four the issue named (WARNINGS) nor any other: no line of a grid, its
    cells or a test run says warn, tip or deprecated."""
    outputs = {"grid": runs.grid_out, "test": runs.test_out}
    outputs |= {cell: (runs.group / f"{cell}-seed0" / "output.log").read_text()
                for cell in CELLS}
    for name, out in outputs.items():
        for warning in WARNINGS:
            assert warning not in out, f"{name}: {warning!r} in\n{out[-3000:]}"
        flagged = [line for line in out.splitlines()
                   if re.search(r"warn|\btips?\b|deprecat", line, re.IGNORECASE)]
        assert not flagged, f"{name}: {flagged}"


# -- the parts, without a run ------------------------------------------------------------------
def test_metric_summaries():
    assert {k: metric_summary(k) for k in (
        "val/acc", "val/acc_mismatched", "val/acc_best", "val/acc_member0", "val/map",
        "val/mrr", "val/p@1", "val/bleu", "val/sacrebleu", "val/exact_match", "val/loss",
        "val/loss_mismatched", "val/perplexity", "val/mrr_at_best_map", "val/elbo",
        "test/acc", "test/loss", "train/loss", "train/acc")} == {
        "val/acc": "max", "val/acc_mismatched": "max", "val/acc_best": "max",
        "val/acc_member0": "max", "val/map": "max", "val/mrr": "max", "val/p@1": "max",
        "val/bleu": "max", "val/sacrebleu": "max", "val/exact_match": "max",
        "val/loss": "min", "val/loss_mismatched": "min", "val/perplexity": "min",
        "val/mrr_at_best_map": None, "val/elbo": None, "test/acc": "last", "test/loss": "last",
        "train/loss": None, "train/acc": None}


def test_prediction_files_keys_and_row_cap(tmp_path):
    rows = [{"id": i, "gold": i % 3} for i in range(5)] + [{"id": 5, "extra": {"a": 1}}]
    (tmp_path / "predictions-test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "predictions-test_mismatched.jsonl").write_text('{"id": 0}\n')
    (tmp_path / "hypotheses-dev.jsonl").write_text('{"id": 0}\n')  # not a test's
    found = read_run(tmp_path).predictions()
    assert {k: p.name for k, p in found.items()} == {
        "test/predictions": "predictions-test.jsonl",
        "test/predictions_mismatched": "predictions-test_mismatched.jsonl"}
    later = found["test/predictions"].stat().st_mtime + 60
    assert read_run(tmp_path).predictions(since=later) == {}
    seq2seq = tmp_path / "seq2seq"
    seq2seq.mkdir()
    (seq2seq / "hypotheses-test.jsonl").write_text('{"id": 0, "hypothesis": "a"}\n')
    assert list(read_run(seq2seq).predictions()) == ["test/predictions"]
    columns, data, total = read_predictions(found["test/predictions"], limit=10)
    assert columns == ["id", "gold", "extra"] and total == 6
    assert data[0] == [0, 0, None] and data[5] == [5, None, '{"a": 1}']
    columns, data, total = read_predictions(found["test/predictions"], limit=2)
    assert (len(data), total) == (2, 6)


def paper_grid(tmp_path, monkeypatch) -> tuple[Experiment, Grid]:
    """A two-cell grid with CSV logs of two seeds of ``a`` and none of ``b``."""
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    grid = Grid("t", "a table", {"Acc": "test/acc"},
                [Cell("a", [], {"Acc": 50.0}), Cell("b", [], {})])
    experiment = Experiment("x", object, object, {"t": grid})
    for seed, acc in ((0, 0.5), (1, 0.7)):
        folder = tmp_path / "x" / "t-smoke" / f"a-seed{seed}"
        folder.mkdir(parents=True)
        (folder / "metrics.csv").write_text(f"step,test/acc\n3,{acc}\n")
    return experiment, grid


def test_summary_table_is_the_reports_numbers(tmp_path, monkeypatch):
    experiment, grid = paper_grid(tmp_path, monkeypatch)
    folder = tmp_path / "x" / "t-smoke"
    for seed, speed in ((0, 2.0), (1, 3.0)):  # report's cost: the mean over the seeds
        (folder / f"a-seed{seed}" / "metrics.csv").write_text(
            f"step,test/acc,train/steps_per_second\n3,{(0.5, 0.7)[seed]},\n4,,{speed}\n")
    columns, rows = summary_table(experiment, grid, "smoke")
    assert columns == ["cell", "paper Acc", "ours Acc", "ours Acc std", "ours Acc n", *COSTS]
    assert rows[0][:3] == ["a", 50.0, pytest.approx(60.0)]
    assert rows[0][3] == pytest.approx(14.142, abs=1e-3) and rows[0][4] == 2
    assert rows[0][5:] == [None, 2.5, None, None]  # steps/s as report prints it
    assert rows[1] == ["b", None, None, None, 0, None, None, None, None]


def test_claims_table_is_the_reports_claims(tmp_path, monkeypatch):
    experiment, grid = paper_grid(tmp_path, monkeypatch)
    grid.claims = [("a", "b")]
    columns, rows = claims_table(experiment, grid, "smoke")
    results = claim_results(experiment, grid, "smoke")
    assert len(rows) == len(results) == 1 and columns[:3] == ["claim", "metric", "paper diff"]
    assert rows[0][:3] == ["b vs a", "Acc", None]
    assert rows[0][3:10] == [None] * 7 and rows[0][10] == results[0].why != ""


def test_grid_summary_never_fails_the_grid(tmp_path, monkeypatch, capsys):
    import wandb

    experiment, grid = paper_grid(tmp_path, monkeypatch)
    log_grid_summary(experiment, grid, "smoke")  # the cells logged no W&B run: nothing
    assert capsys.readouterr().out == ""
    (tmp_path / "x" / "t-smoke" / "a-seed0" / "wandb").mkdir()

    def cannot_start(**kwargs):
        raise wandb.errors.CommError("no network")

    monkeypatch.setattr(wandb, "init", cannot_start)
    log_grid_summary(experiment, grid, "smoke")
    assert "W&B summary run not logged: CommError: no network" in capsys.readouterr().out
