"""The claims board (experiments/harness/claims.py) built from run and results files written here:
every named claim of every grid of every experiment script appears exactly once, with the
verdict of report's own paired test (holds, reversed and marked one seed, smoke only, no
paired test, no data) and the evidence with the most seeds; and the committed
results/CLAIMS.md is what the command writes from the committed files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from experiments.harness import claims
from experiments.harness.markdown import CLAIMS_HEADER

ROOT = Path(__file__).resolve().parents[2]


def write_run(folder: Path, correct: list[bool], metrics: tuple[str, ...] = ("test/acc",),
              predictions: bool = True) -> None:
    """A finished run: every metric of ``metrics`` (its grid's) logged at the accuracy."""
    folder.mkdir(parents=True)
    acc = sum(correct) / len(correct)
    (folder / "metrics.csv").write_text(
        f"epoch,step,{','.join(metrics)}\n0,9,{','.join([str(acc)] * len(metrics))}\n")
    if predictions:
        (folder / "predictions-test.jsonl").write_text("".join(
            json.dumps({"id": i, "gold": 1, "prediction": int(ok)}) + "\n"
            for i, ok in enumerate(correct)))


def sections(board: str) -> dict[tuple[str, str], list[list[str]]]:
    """(experiment, grid) -> the cells of its table's rows."""
    out = {}
    for block in board.split("\n### ")[1:]:
        name, grid = re.match(r"[^\n]*: (\w+) grid (\S+)\n", block).groups()
        rows = [line for line in block.splitlines() if line.startswith("| ")][1:]
        out[(name, grid)] = [[c.strip() for c in r.strip().strip("|").split("|")]
                             for r in rows]
    return out


def named_claims() -> dict[tuple[str, str], list[str]]:
    """(experiment, grid) -> "proposal vs baseline" of each named claim, read from every
    script of experiments/ that defines an EXPERIMENT."""
    import importlib

    out = {}
    for path in sorted((ROOT / "experiments").glob("*.py")):
        if "\nEXPERIMENT = Experiment(" not in path.read_text():
            continue
        experiment = importlib.import_module(f"experiments.{path.stem}").EXPERIMENT
        for grid in experiment.grids.values():
            if grid.claims:
                out[(experiment.name, grid.name)] = [f"{p} vs {b}" for b, p in grid.claims]
    return out


@pytest.fixture
def board(tmp_path, monkeypatch):
    """A results/ of its own: a committed runs folder (CoDA Table 5, IMDb, 2 seeds: CoDA
    right on all 40 reviews, the Transformer on half; SST one seed each) with the results
    file whose report command reads it and another that only names it, a results file
    with what report printed for coda_mlu's Table 6 claim at three scales (the demo's 4,000
    steps and the study's 20,000: one seed, reversed; a smoke run that printed 'holds') and
    one older report without claims (coda_mt); a --runs folder with smoke runs of DW Table
    6 and a decomp_snli run without per-example predictions."""
    results = tmp_path / "results"
    monkeypatch.setattr(claims, "RESULTS", results)
    monkeypatch.setattr(claims, "BOARD", results / "CLAIMS.md")
    group = results / "t5_runs" / "coda_sentiment" / "table5-repro"
    half = [i % 2 == 0 for i in range(40)]
    for seed in (0, 1):
        write_run(group / f"imdb-transformer-seed{seed}", half)
        write_run(group / f"imdb-coda-seed{seed}", [True] * 40)
    write_run(group / "sst-transformer-seed0", half)
    write_run(group / "sst-coda-seed0", half)
    (results / "table5.md").write_text(
        "# CoDA Table 5\n\n    ATTNREPRO_RUNS=results/t5_runs python experiments/"
        "coda_sentiment.py report table5 --config repro\n")
    # another file that names the folder (a queue's notes) without reading it
    (results / "a_queue.md").write_text("seeds 0-1 copied from results/t5_runs\n")
    old_header = CLAIMS_HEADER.removesuffix(" scale |")  # printed before the scale column
    (results / "mlu.md").write_text("\n".join([
        "### CoDA Table 6", "coda_mlu grid table6, config demo (experiments/...)", "",
        old_header, "|---|---|---|---|---|---|---|---|",
        "| coda vs transformer | Acc | +8.20 | 30.48 -> 17.54 | -12.94 [-13.90, -12.00] "
        "| p<0.001 (bootstrap) | reversed | 1 x 5,000 |", "",
        "### CoDA Table 6 decoder study", "coda_mlu grid study, config study (experiments/...)",
        "", CLAIMS_HEADER, "|---|---|---|---|---|---|---|---|---|",
        "| coda vs transformer | Acc | +8.20 | 64.76 -> 36.20 | -28.56 [-29.88, -27.20] "
        "| p<0.001 (bootstrap) | reversed | 1 x 5,000 | 20,000 steps |", "",
        # a smoke printout that (printed before smoke runs lost their verdicts) says holds
        "### CoDA Table 6", "coda_mlu grid table6, config smoke (experiments/...)", "",
        old_header, "|---|---|---|---|---|---|---|---|",
        "| coda vs transformer | Acc | +8.20 | 1.00 -> 90.00 | +89.00 [+80.00, +95.00] "
        "| p<0.001 (bootstrap) | holds | 3 x 64 |", "",
        "### CoDA Table 4", "coda_mt grid table4, config small (experiments/...)", "",
        "| cell | paper BLEU | ours BLEU |", "|---|---|---|", "| transformer | 27.30 | 2.50 |",
        "| coda | 28.71 | 1.38 |", ""]))
    runs = tmp_path / "runs"
    lm = runs / "dwin_lm" / "table6-smoke"
    for cell, nll in (("softmax", 30.0), ("window-mw", 20.0)):
        lm_run = lm / f"{cell}-seed0"
        lm_run.mkdir(parents=True)
        (lm_run / "metrics.csv").write_text("step,test/perplexity\n9,10.0\n")
        (lm_run / "predictions-test.jsonl").write_text("".join(
            json.dumps({"id": i, "tokens": 10, "nll": nll}) + "\n" for i in range(30)))
    snli = runs / "decomp_snli" / "table1-paper"
    write_run(snli / "vanilla-seed0", half, ("val/acc", "test/acc"), predictions=False)
    write_run(snli / "intra-seed0", half, ("val/acc", "test/acc"), predictions=False)
    out = tmp_path / "CLAIMS.md"
    claims.main(["--runs", str(runs), "--out", str(out)])
    return out.read_text(), runs


def test_each_claim_of_a_paper_appears_once(board):
    """A claim of a paper is one row however many grids name it (the MLU +8.2 of Table 6 is
    named by the table, its learning curve, the decoder study and the chosen setting's
    table), under the first grid that names it; a grid's own comparisons are rows of their
    grid; the summary counts each once."""
    text, _ = board
    found = sections(text)
    named = named_claims()
    rows = [(key, r[0], r[2]) for key, grid_rows in found.items() for r in grid_rows]
    mlu = [r for r in rows if r[0][0] == "coda_mlu" and r[1] == "coda vs transformer"]
    assert sum("coda vs transformer" in n for k, n in named.items() if k[0] == "coda_mlu") == 4
    assert [r[0] for r in mlu] == [("coda_mlu", "table6")]
    # every named claim is on the board: its own row, or its paper claim's (same numbers)
    shown = {(key[0], r[0]) for key, grid_rows in found.items() for r in grid_rows}
    for (experiment, _grid), names in named.items():
        assert all((experiment, n) in shown for n in names), (experiment, _grid)
    own = [r for r in rows if r[2] == "- (no number for both)"]
    papers = [r for r in rows if r[2] != "- (no number for both)"]
    assert len(rows) == len(set(rows)) and 60 <= len(papers) < sum(map(len, named.values()))
    counts = re.search(r"^\| all \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|$",
                       text, re.M)
    # holds: IMDb; not significant: SST; reversed: MLU; no paired test: SNLI, CoDA Table 4
    assert [int(x) for x in counts.groups()] == [len(papers), 1, 1, 1, 2, len(papers) - 5]
    # the suite's own comparisons (no paper number): counted apart, here none run
    counts = re.search(r"^\| all, the suite's own \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| "
                       r"(\d+) \| (\d+) \|$", text, re.M)
    assert [int(x) for x in counts.groups()] == [len(own), 0, 0, 0, 0, len(own)]


def test_a_claim_the_paper_states_off_the_tested_metric_is_the_papers(board):
    """The SNLI write-up gives the ensembles' validation accuracy only: a claim of the
    paper (its difference shown, marked), not a comparison of the suite's own; the MLU
    decoder study's settings have no paper number at all."""
    found = sections(board[0])
    snli = {r[0]: r for r in found[("decomp_snli", "table1")]}
    assert snli["exact vs vanilla"][2] == ("Val acc -2.79 (not a test metric: ours is tested "
                                           "on Test acc)")
    assert snli["intra vs vanilla"][2] == "Test acc +0.50"
    study = {r[0]: r for r in found[("coda_mlu", "study")]}
    assert study["coda_centered vs coda"][2] == "- (no number for both)"
    assert "coda vs transformer" not in study  # Table 6's claim: its row is under table6
    assert {r[0]: r for r in found[("coda_mlu", "table6")]}["coda vs transformer"][2] == \
        "Acc +8.20"


def test_verdicts_and_where_they_come_from(board):
    text, runs = board
    found = sections(text)
    imdb, sst = found[("coda_sentiment", "table5")]
    assert imdb == ["imdb-coda vs imdb-transformer", "`imdb-transformer` -> `imdb-coda`",
                    "Acc +0.70", "Acc: 50.00 -> 100.00, +50.00 [+35.00, +65.00], "
                    "p<0.001 (bootstrap)", "2 x 40", "holds", "the paper config's 2,000 steps",
                    "coda_sentiment table5, config repro",
                    # the results file whose report reads the runs folder, not another
                    "[table5.md](table5.md)", "-"]
    assert sst[5] == "not significant (one seed)" and sst[4] == "1 x 40"
    # the most faithful measurement: the study's 20,000 steps before the demo's 4,000, the
    # smoke printout's 'holds' neither chosen nor listed
    (mlu,) = found[("coda_mlu", "table6")]
    assert mlu[3:] == [
        "Acc: 64.76 -> 36.20, -28.56 [-29.88, -27.20], p<0.001 (bootstrap)", "1 x 5,000",
        "reversed (one seed)",
        "20,000 of the paper config's 100,000 steps (20%), data.batch_size 64 (paper config: "
        "128)", "coda_mlu study, config study", "[mlu.md](mlu.md)",
        "coda_mlu table6, config demo (4,000 of the paper config's 100,000 steps (4%), "
        "data.batch_size 64 (paper config: 128); 1 x 5,000): reversed (one seed)"]
    assert ("coda_mlu", "curve") not in found  # its one claim is Table 6's, above
    lm = {r[0]: r for r in found[("dwin_lm", "table6")]}
    assert lm["window-mw vs softmax"][5].startswith(
        "not run here: only a smoke check ran (it runs, no measurement); ")
    for row in lm.values():  # why not: the data is not here, else the command and its cost
        why = row[5].split("; ", 1)[-1] if "smoke" in row[5] else row[5]
        assert why.startswith(("not run here: the data is not here: One Billion Word",
                               "the data is not here: One Billion Word",
                               "not run here: not run yet: `python experiments/dwin_lm.py grid "
                               "table6 --config paper --cells "))
    snli = {r[0]: r for r in found[("decomp_snli", "table1")]}
    assert snli["intra vs vanilla"][5].startswith("measured, no paired test: ")
    assert "predictions-test.jsonl does not exist" in snli["intra vs vanilla"][5]
    assert snli["intra vs vanilla"][8] == f"`{runs}`"
    (mt,) = found[("coda_mt", "table4")]
    assert mt[5].startswith("measured, no paired test: mlu.md prints config small's table")
    assert mt[8] == "[mlu.md](mlu.md)"
    # the scale: the grid's note and the comments of the configs it was measured at
    t5 = text.split("### CoDA Table 5: coda_sentiment grid table5")[1].split("\n### ")[0]
    assert "Paper's setting and ours (the grid's note): Paper: tensor2tensor" in t5
    assert "- `experiments/configs/coda_sentiment/repro.yaml` (= `paper.yaml`): CoDA Table 5 " \
           "at the paper's settings" in t5
    assert "- `experiments/configs/coda_sentiment/repro/sst.yaml`: The SST column" in t5
    # the one-seed note, and the provenance that results/ files carry
    assert "'(one seed)': the interval and p resample the test examples of that one seed" in text
    assert text.rstrip().splitlines()[-5].startswith("- Commit: written at ")


def test_why_not_run_names_the_missing_data_else_the_command_and_its_cost(tmp_path):
    from datamodules.registry import DATASETS
    from experiments import dwin_classification
    from experiments.harness import not_run

    experiment = dwin_classification.EXPERIMENT
    cell = experiment.grid("table5").cell("imdb-softmax")
    entry = DATASETS["imdb"]
    needed = [p for d in entry.downloads for p in d.provides if p not in d.optional]
    state, what = not_run.data_state(experiment, cell, root=tmp_path)
    assert state == "missing" and what == (
        f"{entry.title}: {len(needed)} of its {len(needed)} files are not under the data root "
        f"(the first: {entry.folder}/{needed[0]}; python -m datamodules.fetch --status imdb)")
    for p in needed[:-1]:  # all but one: here in part
        (tmp_path / entry.folder / p).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / entry.folder / p).touch()
    state, what = not_run.data_state(experiment, cell, root=tmp_path)
    assert state == "in part" and what.startswith(f"{entry.title}: 1 of its {len(needed)} files")
    (tmp_path / entry.folder / needed[-1]).touch()  # the optional files are not needed
    assert not_run.data_state(experiment, cell, root=tmp_path) == (
        "complete", f"{entry.title} is here")
    # the cost docs/cost.md gives the grid at the paper config
    cost = not_run.cost_estimates()[("dwin_classification", "table5")]
    assert cost.startswith("10K steps per run; measured here: ")
    assert ("coda_nli", "table8") in not_run.cost_estimates()  # a row naming three grids


def test_a_config_without_comments_is_not_stated(tmp_path):
    from dataclasses import dataclass

    from experiments.harness.grid_model import Cell, Experiment, Grid, dataset_config

    @dataclass
    class Here(Experiment):
        @property
        def config_dir(self) -> Path:
            return tmp_path

    grid = Grid("t", "T", {"Acc": "test/acc"}, [Cell("a", dataset_config("d")), Cell("b")],
                claims=[("a", "b")])
    (tmp_path / "c").mkdir()
    (tmp_path / "c.yaml").write_text("# one\n#   two\n\nseed_everything: 0\n# not this\n")
    (tmp_path / "c" / "d.yaml").write_text("data:\n  batch_size: 8\n")
    assert claims.setting(Here("x", object, object, {"t": grid}), grid, "c") == [
        f"`{tmp_path / 'c.yaml'}`: one two", f"`{tmp_path / 'c' / 'd.yaml'}`: not stated"]
    assert claims.header_comment(tmp_path / "none.yaml") == ""


@pytest.mark.slow
def test_committed_board_is_what_the_command_writes(tmp_path):
    """results/CLAIMS.md's tables come out of the committed results/ again, row for row (its
    'not run here' rows name the data files missing under the shared data root)."""
    if not (ROOT.parent / "shared" / "data").is_dir():
        pytest.skip("../shared/data is absent: the board's reasons name what is missing there")
    out = tmp_path / "CLAIMS.md"
    claims.main(["--out", str(out)])
    committed = (ROOT / "results" / "CLAIMS.md").read_text()

    def rows(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith("|")]

    assert rows(out.read_text()) == rows(committed)


def test_board_figure_draws_the_claims_measured_here(board, tmp_path):
    _, runs = board
    assert (tmp_path / "CLAIMS.png").stat().st_size > 10_000  # written beside the board
    fig = claims.board_figure(claims.board_rows(runs))
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "CoDA Table 6: coda vs transformer (Acc, config study): reversed (one seed), 1 x 5,000",
        "CoDA Table 5: imdb-coda vs imdb-transformer (Acc, config repro): holds, 2 x 40",
        "CoDA Table 5: sst-coda vs sst-transformer (Acc, config repro): not significant "
        "(one seed), 1 x 40"]
    ours = [line for line in ax.get_lines() if line.get_marker() == "o"]
    assert [line.get_xdata()[0] for line in ours] == pytest.approx([-28.56, 50.0, 0.0])
    paper = next(line for line in ax.get_lines() if line.get_label() == "paper")
    assert paper.get_xdata()[0] == pytest.approx(8.2)
    named = sum(len(g.claims) for e in claims.experiment_scripts() for g in e.grids.values())
    rows = len(claims.board_rows(runs))
    assert rows < named
    assert fig._suptitle.get_text() == (f"The claims measured here: 3 of {rows} claims on the "
                                        "board (the others: not measured here)")


def test_a_runs_folder_links_the_file_whose_own_report_reads_it():
    """A results file that reads a runs folder only beside ``--against`` (the bf16 parity)
    is not the folder's file: the one whose report reads it is."""
    from experiments.harness.claims import reports_from
    own = "    ATTNREPRO_RUNS=results/x_runs python experiments/a.py report t --config c\n"
    other = ("    ATTNREPRO_RUNS=results/x_runs python experiments/a.py report t --config c "
             "--against results/y\n")
    assert reports_from(own, "x_runs") and not reports_from(other, "x_runs")
    assert reports_from(other + own, "x_runs") and not reports_from(own, "y_runs")
