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


def write_run(folder: Path, correct: list[bool], metric: str = "test/acc",
              predictions: bool = True) -> None:
    folder.mkdir(parents=True)
    (folder / "metrics.csv").write_text(
        f"epoch,step,{metric}\n0,9,{sum(correct) / len(correct)}\n")
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
    with what report printed for coda_mlu's Table 6 (one seed, reversed) and one older
    report without claims (coda_mt); a --runs folder with smoke runs of DW Table 6 and a
    decomp_snli run without per-example predictions."""
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
    (results / "mlu.md").write_text("\n".join([
        "### CoDA Table 6", "coda_mlu grid table6, config demo (experiments/...)", "",
        CLAIMS_HEADER, "|---|---|---|---|---|---|---|---|",
        "| coda vs transformer | Acc | +8.20 | 30.48 -> 17.54 | -12.94 [-13.90, -12.00] "
        "| p<0.001 (bootstrap) | reversed | 1 x 5,000 |", "",
        "### CoDA Table 4", "coda_mt grid table4, config small (experiments/...)", "",
        "| cell | paper BLEU | ours BLEU |", ""]))
    runs = tmp_path / "runs"
    lm = runs / "dwin_lm" / "table6-smoke"
    for cell, nll in (("softmax", 30.0), ("window-mw", 20.0)):
        lm_run = lm / f"{cell}-seed0"
        lm_run.mkdir(parents=True)
        (lm_run / "metrics.csv").write_text("step,test/perplexity\n9,10.0\n")
        (lm_run / "predictions-test.jsonl").write_text("".join(
            json.dumps({"id": i, "tokens": 10, "nll": nll}) + "\n" for i in range(30)))
    snli = runs / "decomp_snli" / "table1-paper"
    write_run(snli / "vanilla-seed0", half, predictions=False)
    write_run(snli / "intra-seed0", half, predictions=False)
    out = tmp_path / "CLAIMS.md"
    claims.main(["--runs", str(runs), "--out", str(out)])
    return out.read_text(), runs


def test_every_named_claim_appears_exactly_once(board):
    text, _ = board
    found = sections(text)
    named = named_claims()
    assert sum(map(len, named.values())) >= 70
    assert set(found) == set(named)
    for key, names in named.items():
        assert sorted(r[0] for r in found[key]) == sorted(names), key
    total = sum(map(len, named.values()))
    own = sum(row[2] == "- (no number for both)" for rows in found.values() for row in rows)
    assert 0 < own < total
    counts = re.search(r"^\| all \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|$", text, re.M)
    assert [int(x) for x in counts.groups()] == [total - own, 1, 1, 1, total - own - 3]
    # the suite's own comparisons (no paper number): counted apart, here none run
    counts = re.search(r"^\| all, the suite's own \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| "
                       r"(\d+) \|$", text, re.M)
    assert [int(x) for x in counts.groups()] == [own, 0, 0, 0, own]


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
    assert study["coda vs transformer"][2] == "Acc +8.20"


def test_verdicts_and_where_they_come_from(board):
    text, runs = board
    found = sections(text)
    imdb, sst = found[("coda_sentiment", "table5")]
    assert imdb[:7] == ["imdb-coda vs imdb-transformer", "`imdb-transformer` -> `imdb-coda`",
                        "Acc +0.70", "Acc: 50.00 -> 100.00, +50.00 [+35.00, +65.00], "
                        "p<0.001 (bootstrap)", "2 x 40", "holds", "config repro"]
    # the results file whose report reads the runs folder, not another that names it
    assert imdb[7] == "[table5.md](table5.md)"
    assert sst[5] == "not significant (one seed)" and sst[4] == "1 x 40"
    (mlu,) = found[("coda_mlu", "table6")]
    assert mlu[3:] == ["Acc: 30.48 -> 17.54, -12.94 [-13.90, -12.00], p<0.001 (bootstrap)",
                       "1 x 5,000", "reversed (one seed)", "config demo", "[mlu.md](mlu.md)"]
    lm = {r[0]: r for r in found[("dwin_lm", "table6")]}
    assert lm["window-mw vs softmax"][5:7] == ["not run here: smoke only", "config smoke"]
    assert lm["window-aw vs softmax"][5] == "not run here: no data (the cells were not run)"
    snli = {r[0]: r for r in found[("decomp_snli", "table1")]}
    assert snli["intra vs vanilla"][5].startswith(
        "not run here: no paired test: ")
    assert "predictions-test.jsonl does not exist" in snli["intra vs vanilla"][5]
    assert snli["intra vs vanilla"][7] == f"`{runs}`"
    (mt,) = found[("coda_mt", "table4")]
    assert mt[5].startswith("not run here: no paired test: mlu.md prints config small's table")
    # the scale: the grid's note and the comments of the configs it was measured at
    t5 = text.split("### CoDA Table 5: coda_sentiment grid table5")[1].split("\n### ")[0]
    assert "Paper's setting and ours (the grid's note): Paper: tensor2tensor" in t5
    assert "- `experiments/configs/coda_sentiment/repro.yaml` (= `paper.yaml`): CoDA Table 5 " \
           "at the paper's settings" in t5
    assert "- `experiments/configs/coda_sentiment/repro/sst.yaml`: The SST column" in t5
    # the one-seed note, and the provenance that results/ files carry
    assert "'(one seed)': the interval and p resample the test examples of that one seed" in text
    assert text.rstrip().splitlines()[-5].startswith("- Commit: written at ")


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
    """results/CLAIMS.md's tables come out of the committed results/ again, row for row."""
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
        "CoDA Table 6: coda vs transformer (Acc, config demo): reversed (one seed), 1 x 5,000",
        "CoDA Table 5: imdb-coda vs imdb-transformer (Acc, config repro): holds, 2 x 40",
        "CoDA Table 5: sst-coda vs sst-transformer (Acc, config repro): not significant "
        "(one seed), 1 x 40"]
    ours = [line for line in ax.get_lines() if line.get_marker() == "o"]
    assert [line.get_xdata()[0] for line in ours] == pytest.approx([-12.94, 50.0, 0.0])
    paper = next(line for line in ax.get_lines() if line.get_label() == "paper")
    assert paper.get_xdata()[0] == pytest.approx(8.2)
    named = sum(len(g.claims) for e in claims.experiment_scripts() for g in e.grids.values())
    assert fig._suptitle.get_text() == (f"The claims measured here: 3 of {named} named claims "
                                        "(the others: not run here)")
