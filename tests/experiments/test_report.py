"""``report``'s paired tests of the paper's claims and its cost columns, on written run
folders (issue 19): the per-example units each metric is read from (accuracy, exact match,
MAP / MRR / P@1 per question, perplexity per sentence, BLEU from the hypotheses), and the
report's exact lines."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from experiments import attention_compare, coda_nli, coda_sentiment, dwin_lm
from experiments.harness.grid_model import Cell, Grid
from experiments.harness.launch import GridRun, Job
from experiments.harness.report import format_report
from experiments.harness.runs import finishing_metrics, run_finished
from experiments.harness.significance import aggregate, metric_name, run_units


def write_run(folder: Path, rows: list[dict], metrics: dict[str, float],
              n_parameters: int | None = None, name: str = "predictions-test.jsonl") -> Path:
    folder.mkdir(parents=True)
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    header = ["epoch", "step", *metrics]
    (folder / "metrics.csv").write_text(",".join(header) + "\n" + ",".join(
        ["0", "10", *map(str, metrics.values())]) + "\n")
    if n_parameters is not None:
        (folder / "hparams.yaml").write_text(f"n_parameters: {n_parameters}\n")
    return folder


def classified(correct: list[bool]) -> list[dict]:
    return [{"id": i, "gold": 1, "prediction": int(ok), "log_probs": [-1.0, -0.5]}
            for i, ok in enumerate(correct)]


# -- units ------------------------------------------------------------------------------------
def test_metric_names_and_their_split_suffix():
    assert metric_name("test/acc") == ("acc", "")
    assert metric_name("test/acc_mismatched") == ("acc", "_mismatched")
    assert metric_name("test/exact_match") == ("exact_match", "")
    assert metric_name("test/p@1") == ("p@1", "")
    assert metric_name("val/acc") is None and metric_name("test/loss") is None


def test_ranking_units_are_questions_with_ties_in_file_order(tmp_path):
    rows = [  # question 0: scores tie, the positive second in file order -> AP 1/2, RR 1/2
        {"id": 0, "group": 0, "gold": 0, "score": -1.0},
        {"id": 1, "group": 0, "gold": 1, "score": -1.0},
        # question 1: positives ranked 1 and 3 -> AP (1 + 2/3) / 2, RR 1, P@1 1
        {"id": 2, "group": 1, "gold": 1, "score": -0.1},
        {"id": 3, "group": 1, "gold": 0, "score": -0.2},
        {"id": 4, "group": 1, "gold": 1, "score": -0.3},
        # question 2: no positive -> skipped, as the logged MAP skips it
        {"id": 5, "group": 2, "gold": 0, "score": -0.3}]
    write_run(tmp_path / "r", rows, {"test/map": 0.0})
    kind, ids, stats = run_units(tmp_path / "r", "test/map")
    assert (kind, ids) == ("mean", [0, 1])
    assert aggregate(kind, stats) == pytest.approx(100 * (0.5 + (1 + 2 / 3) / 2) / 2)
    assert aggregate(*run_units(tmp_path / "r", "test/mrr")[::2]) == pytest.approx(75.0)
    assert aggregate(*run_units(tmp_path / "r", "test/p@1")[::2]) == pytest.approx(50.0)


def test_f1_and_per_example_variants_of_a_metric_are_units(tmp_path):
    """QA rows (lit_models/decaprop.py): F1 from ``f1``; ``test/f1_quasar`` from the field of
    that name; a protocol half's metric from the rows of that half only; a split suffix
    without its file or field is still the missing file."""
    rows = [{"id": 0, "correct": True, "f1": 1.0, "f1_quasar": 1.0, "exact_match_unigram": 1.0},
            {"id": 1, "correct": False, "f1": 0.5, "f1_quasar": 0.25, "f1_ngram": 0.8},
            {"id": 2, "correct": False, "f1": 0.0, "f1_quasar": 0.0, "f1_ngram": 0.2}]
    write_run(tmp_path / "qa", rows, {"test/f1": 0.5})
    assert metric_name("test/f1_ngram") == ("f1", "_ngram")
    assert aggregate(*run_units(tmp_path / "qa", "test/f1")[::2]) == pytest.approx(50.0)
    kind, ids, stats = run_units(tmp_path / "qa", "test/f1_quasar")
    assert ids == [0, 1, 2] and aggregate(kind, stats) == pytest.approx(125 / 3)
    kind, ids, stats = run_units(tmp_path / "qa", "test/f1_ngram")
    assert ids == [1, 2] and aggregate(kind, stats) == pytest.approx(50.0)
    assert run_units(tmp_path / "qa", "test/exact_match_unigram")[1] == [0]
    with pytest.raises(FileNotFoundError, match="predictions-test_hard.jsonl"):
        run_units(tmp_path / "qa", "test/exact_match_hard")
    write_run(tmp_path / "nof1", [{"id": 0, "correct": True}], {"test/f1": 1.0})
    with pytest.raises(ValueError, match="no row has a 'f1' field"):
        run_units(tmp_path / "nof1", "test/f1")


def test_perplexity_exact_match_and_bleu_units(tmp_path):
    write_run(tmp_path / "lm", [{"id": 0, "tokens": 2, "nll": 3.0},
                                {"id": 1, "tokens": 4, "nll": 1.0}], {"test/perplexity": 1.0})
    kind, ids, stats = run_units(tmp_path / "lm", "test/perplexity")
    assert kind == "perplexity" and aggregate(kind, stats) == pytest.approx(math.exp(4 / 6))
    write_run(tmp_path / "em", [{"id": 0, "prediction": "12", "gold": "12", "correct": True},
                                {"id": 1, "prediction": "1", "gold": "13", "correct": False}],
              {"test/exact_match": 0.5})
    assert aggregate(*run_units(tmp_path / "em", "test/exact_match")[::2]) == 50.0
    # BLEU as the run scored it: compound splitting into German before tokenized BLEU
    rows = [{"id": 0, "source": "s", "hypothesis": "ein rich-text Haus", "reference":
             "ein rich-text Haus"}]
    folder = write_run(tmp_path / "mt", rows, {"test/bleu": 1.0},
                       name="hypotheses-test.jsonl")
    (folder / "bleu-test.json").write_text(json.dumps(
        {"bleu": {"kind": "tokenized+compound_split"}}))
    kind, ids, stats = run_units(folder, "test/bleu")
    assert kind == "bleu" and stats[0, 0] == 5  # ein rich ##AT##-##AT## text Haus
    assert aggregate(kind, stats) == pytest.approx(100.0)


def test_units_of_a_run_without_predictions_or_of_another_metric(tmp_path):
    (tmp_path / "r").mkdir()
    with pytest.raises(FileNotFoundError, match="predictions-test.jsonl does not exist"):
        run_units(tmp_path / "r", "test/acc")
    with pytest.raises(ValueError, match="no per-example units for 'val/acc'"):
        run_units(tmp_path / "r", "val/acc")


# -- the report -------------------------------------------------------------------------------
def test_report_tests_each_claim_and_shows_cost(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    group = tmp_path / "coda_sentiment" / "table5-paper"
    half = [i % 2 == 0 for i in range(40)]
    for seed in (0, 1):
        # IMDb: CoDA right on every review, the Transformer on half of them
        write_run(group / f"imdb-transformer-seed{seed}", classified(half),
                  {"test/acc": 0.5, "train/steps_per_second": 2.0 + seed,
                   "train/peak_memory_mb": 500.0, "train/wall_seconds": 60.0 * (1 + seed)},
                  n_parameters=1_500_000)
        write_run(group / f"imdb-coda-seed{seed}", classified([True] * 40),
                  {"test/acc": 1.0}, n_parameters=1_500_000)
        # SST: the same predictions
        write_run(group / f"sst-transformer-seed{seed}", classified(half), {"test/acc": 0.5})
        write_run(group / f"sst-coda-seed{seed}", classified(half), {"test/acc": 0.5})
    report = format_report(coda_sentiment.EXPERIMENT, coda_sentiment.EXPERIMENT.grid("table5"),
                           "paper")
    # the whole report, exactly: the paper's table with cost columns, then every claim tested
    # (IMDb: CoDA right on all 40 reviews, the Transformer on half, in both seeds: +50 points,
    # the examples resampled once per replicate for both seeds, so the interval is that of
    # 40 units; SST: the same predictions, difference 0 and p = 1)
    assert report.splitlines() == [
        '### CoDA Table 5: sentiment analysis, test accuracy (%)',
        'coda_sentiment grid table5, config paper (experiments/configs/coda_sentiment/paper.yaml)',
        "Scale: the paper config's budget (2,000 steps), model and batch.",
        '',
        '| cell | paper Acc | ours Acc | params (M) | steps/s | peak MB | wall min |',
        '|---|---|---|---|---|---|---|',
        '| imdb-transformer | 82.60 | 50.00 ± 0.00 (n=2) | 1.50 | 2.50 | 500 | 1.5 |',
        '| imdb-coda | 83.30 | 100.00 ± 0.00 (n=2) | 1.50 | - | - | - |',
        '| sst-transformer | 78.90 | 50.00 ± 0.00 (n=2) | - | - | - | - |',
        '| sst-coda | 80.60 | 50.00 ± 0.00 (n=2) | - | - | - | - |',
        '',
        'Cost: mean over the seeds of the parameters, training steps/s (training steps only), '
         "peak memory (CPU: the process's peak resident set) and the wall time of training "
         "(validation included); a run's machine and load set them.",
        '',
        'Does the claimed gain hold? Paired over seeds (seed k of the baseline with seed k of '
         'the proposal: the same seed draws the same initialisation stream and data order; '
         'seeds are the outer level of the bootstrap) and test examples (paired by id, '
         'resampled once per replicate for all seeds); 95% percentile interval of 10,000 '
         'paired bootstrap replicates; p from the bootstrap (approximate randomisation for MAP '
         '/ MRR / P@1: units are questions); alpha 0.05, no correction for the number of '
         'claims (experiments/harness/significance.py).',
        '',
        '| claim | metric | paper diff | ours: baseline -> proposal | ours diff [95% CI] | p '
         '| verdict | seeds x units | scale |',
        '|---|---|---|---|---|---|---|---|---|',
        '| imdb-coda vs imdb-transformer | Acc | +0.70 | 50.00 -> 100.00 | +50.00 [+35.00, '
         "+65.00] | p<0.001 (bootstrap) | holds | 2 x 40 | the paper config's 2,000 steps |",
        '| sst-coda vs sst-transformer | Acc | +1.70 | 50.00 -> 50.00 | +0.00 [+0.00, +0.00] '
         "| p=1.000 (bootstrap) | not significant | 2 x 40 | the paper config's 2,000 steps |",
        '',
        "verdict: 'holds' = significant (p < 0.05) in the paper's direction (the proposal "
         "better, or worse where the paper's difference is negative), 'reversed' = significant "
         "the other way; a smoke run, or one on synthetic or sample data, gets none (its paired "
         "test is shown, not a measurement). scale: the runs' budget and settings against the "
         "paper config's (the header's Scale line names them).",
        '',
        'Paper: tensor2tensor, transformer_tiny, problems sentiment_imdb (8K subwords, scored '
         'on the 25K test reviews) and sentiment_sst_binary (GLUE SST-2: 16K subwords, trained '
         'on the 67K phrases, scored on the 872 dev sentences); 2000 steps. Ours: HF '
         'tokenizers BPE of the same sizes; see the configs for the remaining differences.',
    ]


def test_a_run_still_training_is_counted_never_averaged(tmp_path, monkeypatch):
    """A grid read while it runs: a run that has logged its cost but not its test result is
    shown as unfinished, and neither its cost nor any partial metric enters the means."""
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    group = tmp_path / "coda_sentiment" / "table5-paper"
    cost = {"train/steps_per_second": 2.0, "train/peak_memory_mb": 500.0,
            "train/wall_seconds": 60.0}
    write_run(group / "imdb-transformer-seed0", classified([True] * 4),
              {"test/acc": 0.75, **cost}, n_parameters=1_500_000)
    write_run(group / "imdb-transformer-seed1", [],
              {"train/steps_per_second": 9.0, "train/wall_seconds": 6000.0},
              n_parameters=1_500_000)  # training: no test/acc yet
    write_run(group / "imdb-coda-seed0", [], cost, n_parameters=1_500_000)
    (group / "sst-coda-seed0").mkdir(parents=True)  # made, nothing logged yet: not counted
    lines = format_report(coda_sentiment.EXPERIMENT, coda_sentiment.EXPERIMENT.grid("table5"),
                          "paper").splitlines()
    assert lines[6:10] == [
        "| imdb-transformer | 82.60 | 75.00 (n=1; 1 unfinished) | 1.50 | 2.00 | 500 | 1.0 |",
        "| imdb-coda | 83.30 | not run (1 unfinished) | - | - | - | - |",
        "| sst-transformer | 78.90 | not run | - | - | - | - |",
        "| sst-coda | 80.60 | not run | - | - | - | - |"]
    assert ("| imdb-coda vs imdb-transformer | Acc | +0.70 | not run (no seed of both cells) "
            "| | | | | the paper config's 2,000 steps |") in lines


def test_a_run_has_ended_when_it_holds_its_cells_test_metrics(tmp_path, monkeypatch):
    """What tells a run that ended from one still training, for report and --skip-done alike:
    the test metrics its cell's paper gives (an SNLI cell of CoDA Table 3 never logs MNLI's
    mismatched accuracy, so requiring every grid metric re-ran it for ever), else the first
    test metric; a grid of validation metrics only needs all of them."""
    table3 = coda_nli.EXPERIMENT.grid("table3")
    snli, mnli = table3.cell("snli-coda"), table3.cell("mnli-coda")
    assert finishing_metrics(table3, snli) == {"Acc": "test/acc"}
    assert finishing_metrics(table3, mnli) == {"Acc": "test/acc",
                                               "MNLI mm": "test/acc_mismatched"}
    compare = attention_compare.EXPERIMENT.grid("imdb")  # no paper numbers
    assert finishing_metrics(compare, compare.cells[0]) == {"Acc": "test/acc"}
    table8 = coda_nli.EXPERIMENT.grid("table8")  # development accuracy
    assert finishing_metrics(table8, table8.cells[0]) == table8.metrics
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    group = tmp_path / "coda_nli" / "table3-paper"
    write_run(group / "snli-coda-seed0", [], {"test/acc": 0.8})
    write_run(group / "mnli-coda-seed0", [], {"test/acc": 0.7})  # mismatched not yet
    write_run(group / "snli-softmax-seed0", [], {"train/steps_per_second": 3.0})
    run = GridRun(coda_nli.EXPERIMENT, table3, "paper", [])
    assert [run.finished(Job(cell, 0)) for cell in (snli, mnli, table3.cell("snli-softmax"))] \
        == [True, False, False]
    assert run_finished(group / "snli-coda-seed0", table3, snli)


def test_report_says_why_a_claim_is_not_tested(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    group = tmp_path / "coda_sentiment" / "table5-smoke"
    write_run(group / "imdb-transformer-seed0", classified([True] * 4), {"test/acc": 1.0})
    (group / "imdb-coda-seed0").mkdir(parents=True)  # an old run: metrics, no predictions
    (group / "imdb-coda-seed0" / "metrics.csv").write_text("step,test/acc\n1,0.5\n")
    write_run(group / "sst-transformer-seed0", classified([True] * 4), {"test/acc": 1.0})
    write_run(group / "sst-coda-seed1", classified([True] * 4), {"test/acc": 1.0})
    lines = format_report(coda_sentiment.EXPERIMENT, coda_sentiment.EXPERIMENT.grid("table5"),
                          "smoke").splitlines()
    missing = group / "imdb-coda-seed0" / "predictions-test.jsonl"
    assert (f"| imdb-coda vs imdb-transformer | Acc | +0.70 | no paired test: {missing} does "
            "not exist (the run's test wrote no per-example predictions; test its checkpoint "
            "again to write them) | | | | | synthetic data: not a measurement |") in lines
    assert ("| sst-coda vs sst-transformer | Acc | +1.70 | not run (no seed of both cells) "
            "| | | | | smoke: not a measurement |") in lines


def test_a_smoke_report_draws_no_verdict(tmp_path, monkeypatch):
    """A smoke config's runs, or runs on synthetic data, get no holds / not significant /
    reversed, whatever their paired test says: it is shown, marked as a check; the header
    says what the runs are."""
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    group = tmp_path / "coda_sentiment" / "table5-smoke"
    half = [i % 2 == 0 for i in range(40)]
    for cell, correct in (("transformer", half), ("coda", [True] * 40)):
        for data in ("imdb", "sst"):
            write_run(group / f"{data}-{cell}-seed0", classified(correct),
                      {"test/acc": sum(correct) / 40})
    lines = format_report(coda_sentiment.EXPERIMENT, coda_sentiment.EXPERIMENT.grid("table5"),
                          "smoke").splitlines()
    assert lines[2] == (
        "Scale: imdb: synthetic data (tests/fixtures/aclImdb): checks that the grid runs, not a "
        "measurement (no verdict is drawn from it); sst: the smoke config: checks that the "
        "grid runs, not a measurement (no verdict is drawn from it).")
    claims = [x for x in lines if x.startswith(("| imdb-coda vs", "| sst-coda vs"))]
    assert claims == [
        "| imdb-coda vs imdb-transformer | Acc | +0.70 | 50.00 -> 100.00 | +50.00 [+35.00, "
        "+65.00] | p<0.001 (bootstrap) | synthetic data: checks that the grid runs, not a "
        "measurement | 1 x 40 | synthetic data: not a measurement |",
        "| sst-coda vs sst-transformer | Acc | +1.70 | 50.00 -> 100.00 | +50.00 [+35.00, "
        "+65.00] | p<0.001 (bootstrap) | smoke: checks that the grid runs, not a measurement "
        "| 1 x 40 | smoke: not a measurement |"]
    assert not any(v in " ".join(lines) for v in ("| holds", "| reversed", "| not significant",
                                                   "(one seed)"))


def test_a_lower_is_better_claim_holds_when_the_proposal_is_lower(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    group = tmp_path / "dwin_lm" / "table6-paper"
    worse = [{"id": i, "tokens": 10, "nll": 30.0} for i in range(30)]
    better = [{"id": i, "tokens": 10, "nll": 20.0} for i in range(30)]
    write_run(group / "softmax-seed0", worse, {"test/perplexity": math.exp(3)})
    write_run(group / "window-mw-seed0", better, {"test/perplexity": math.exp(2)})
    lines = format_report(dwin_lm.EXPERIMENT, dwin_lm.EXPERIMENT.grid("table6"),
                          "paper").splitlines()
    row = next(x for x in lines if x.startswith("| window-mw vs softmax | PPL | -2.37 |"))
    # one seed: the verdict says so (its interval resamples that seed's sentences only)
    assert "| 20.09 -> 7.39 | -12.70 [-12.70, -12.70] | p<0.001 (bootstrap) | holds (one seed) " \
        "| 1 x 30 | the paper config's 100,000 steps |" in row
    assert next(x for x in lines if x.startswith("verdict:")).endswith(
        "'(one seed)': the interval and p resample the test examples of that one seed only, "
        "not the seed: another seed may land outside them.")


def test_a_claim_must_name_two_cells_of_its_grid():
    with pytest.raises(ValueError, match=r"grid 't': claim \('a', 'c'\) must name two of its "
                                         r"cells \(a, b\)"):
        Grid("t", "T", {"Acc": "test/acc"}, [Cell("a"), Cell("b")], claims=[("a", "c")])


PRINTOUT = """### Table 6: exact match (%)
coda_mlu grid table6, config demo

| cell | paper Acc | ours Acc | params (M) | steps/s | peak MB | wall min |
|---|---|---|---|---|---|---|
| transformer | 76.10 | 31.72 (n=1) | 0.93 | 9.03 | 1304 | 7.7 |
| coda | 84.30 | 17.74 (n=1) | 0.93 | 8.29 | 1405 | 8.5 |

### Table 6: learning curves, val/exact_match

| step | transformer | coda |
|---|---|---|
| 500 | 0.00 | 0.00 |
| 1000 | 15.10 | 15.20 |
"""


def test_compare_printouts_ignores_load_and_names_each_difference():
    from experiments.harness.markdown import table_cells
    from experiments.harness.report import compare_printouts

    cells = table_cells(PRINTOUT)
    assert len(cells) == 2 * 3 + 2 * 2  # steps/s, peak MB and wall min left out
    assert cells[("Table 6: learning curves, val/exact_match [step]", "1000", "coda")] == "15.20"
    slower = PRINTOUT.replace("| 9.03 | 1304 | 7.7 |", "| 4.50 | 1500 | 15.2 |")
    same = compare_printouts(slower, PRINTOUT, "committed.md", "EPYC")
    assert same.startswith("Every number above equals the committed printout committed.md "
                           "(10 table cells;") and "Committed on: EPYC." in same
    other = slower.replace("| 1000 | 15.10 | 15.20 |", "| 1000 | 15.10 | 15.30 |")
    differs = compare_printouts(other, PRINTOUT, "committed.md", "EPYC")
    assert differs.startswith("1 of 10 numbers differ from the committed printout "
                              "committed.md: 1000 coda: 15.30 (committed 15.20).")
    assert "Here: " in differs and "Across hosts" in differs
    assert compare_printouts("no table", PRINTOUT, "c.md", "EPYC").startswith("Not comparable")
