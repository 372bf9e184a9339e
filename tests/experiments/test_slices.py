"""``report --slices`` (issue 48): slices computed on written predictions files against
hand counts (MLU operator / operand pattern / answer length, input-length quartiles,
ranking questions, translation buckets), a slice empty in one cell reported, not dropped,
and each slice's paired bootstrap equal to the claim's bootstrap on that slice's units."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from experiments import coda_mlu, coda_open_qa, coda_ranking, coda_sentiment, dwin_mt
from experiments.harness import significance as sig
from experiments.harness.grid_model import Cell, Grid
from experiments.harness.report import print_report
from experiments.harness.slice_model import by_label
from experiments.harness.slice_report import format_sliced, plot_slices, slices_table
from experiments.harness.slices import slice_results
from experiments.harness.verdicts import CLAIM_SAMPLES, CLAIM_SEED, claim_results
from tests.experiments.test_report import write_run

# id: (source, gold); operator, pattern (x/y first assigned), answer length by hand below
PROBLEMS = [("x=1,y=2,x+y", "3"),      # +, both as assigned, 1
            ("y=5,x=2,x-y", "-3"),     # -, both reversed, 2
            ("x=3,y=4,y*y", "16"),     # *, same variable, 2
            ("y=10,x=2,y+x", "12"),    # +, both as assigned, 2
            ("x=-7,y=1,x-x", "0"),     # -, same variable, 1
            ("x=12,y=11,x*y", "132")]  # *, both as assigned, 3


def mlu_rows(correct: list[bool], problems=PROBLEMS) -> list[dict]:
    return [{"id": i, "source": src, "prediction": gold if ok else "9", "gold": gold,
             "correct": ok, "score": -0.1} for i, ((src, gold), ok) in
            enumerate(zip(problems, correct))]


def mlu_runs(tmp_path, monkeypatch, transformer, coda, seeds=(0,), problems=PROBLEMS):
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    group = tmp_path / "coda_mlu" / "table6-smoke"
    for seed in seeds:
        for cell, correct in (("transformer", transformer), ("coda", coda)):
            write_run(group / f"{cell}-seed{seed}", mlu_rows(correct, problems),
                      {"test/exact_match": sum(correct) / len(correct)})
    return coda_mlu.EXPERIMENT, coda_mlu.EXPERIMENT.grid("table6")


def rows_of(results, slicing: str) -> list[tuple]:
    (r,) = [r for r in results if r.slicing.name == slicing]
    return [(s.name, s.n_baseline, s.n_proposal, s.baseline, s.proposal,
             None if s.comparison is None else round(s.comparison.diff, 6)) for s in r.rows]


def test_mlu_slices_are_the_hand_counts(tmp_path, monkeypatch):
    experiment, grid = mlu_runs(tmp_path, monkeypatch, [True, False, True, False, True, False],
                                [True] * 5 + [False])
    results = slice_results(experiment, grid, "smoke", experiment.slicings([]))
    assert rows_of(results, "operator") == [("+", 2, 2, 50.0, 100.0, 50.0),
                                            ("-", 2, 2, 50.0, 100.0, 50.0),
                                            ("*", 2, 2, 50.0, 50.0, 0.0)]
    assert rows_of(results, "pattern") == [("same variable twice", 2, 2, 100.0, 100.0, 0.0),
                                           ("both, as assigned", 3, 3, 100 / 3, 200 / 3,
                                            round(100 / 3, 6)),
                                           ("both, reversed", 1, 1, 0.0, 100.0, 100.0)]
    assert rows_of(results, "answer_length") == [("1", 2, 2, 100.0, 100.0, 0.0),
                                                 ("2", 3, 3, 100 / 3, 100.0,
                                                  round(200 / 3, 6)),
                                                 ("3", 1, 1, 0.0, 0.0, 0.0)]
    lines = format_sliced([r for r in results if r.slicing.name == "operator"])
    # + and -: one problem right in both cells, one in CoDA's only
    p = sig.format_p(sig.compare("mean", [sig.mean_stats([1, 0])], [sig.mean_stats([1, 1])],
                                 samples=CLAIM_SAMPLES, seed=CLAIM_SEED).p_value)
    assert lines == ["", "#### coda vs transformer, Acc: 1 seed (the interval resamples that "
                         "seed's units only, not the seed)", "",
                     "| slices | slice | n | transformer | coda | diff [95% CI] | p |",
                     "|---|---|---|---|---|---|---|",
                     f"| operator | + | 2 | 50.00 | 100.00 | +50.00 [+0.00, +100.00] | {p} |",
                     f"|  | - | 2 | 50.00 | 100.00 | +50.00 [+0.00, +100.00] | {p} |",
                     "|  | * | 2 | 50.00 | 50.00 | +0.00 [+0.00, +0.00] | p=1.000 |"]


def test_a_slice_empty_in_one_cell_or_in_both_is_reported(tmp_path, monkeypatch):
    """The Transformer's test has two '*' problems where CoDA's has '+' ones (its runs saw
    other problems under the same ids): '*' is reported with its counts and why it has no
    test; a test set without '-' problems still lists the declared '-' slice."""
    experiment, grid = mlu_runs(tmp_path, monkeypatch, [True] * 6, [True] * 6)
    group = tmp_path / "coda_mlu" / "table6-smoke"
    other = [(src.replace("-", "+").replace("*", "+"), gold) for src, gold in PROBLEMS]
    (group / "coda-seed0" / "predictions-test.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in mlu_rows([True] * 6, other)))
    results = slice_results(experiment, grid, "smoke", experiment.slicings(["operator"]))
    (r,) = results
    assert [(s.name, s.n_baseline, s.n_proposal, s.baseline, s.proposal, s.why)
            for s in r.rows] == [
        ("+", 2, 6, 100.0, 100.0, "the slice's units differ between the runs (not paired)"),
        ("-", 2, 0, 100.0, None, "no unit in coda"),
        ("*", 2, 0, 100.0, None, "no unit in coda")]
    assert format_sliced(results)[-1] == "|  | * | 2 / 0 | 100.00 | - | no unit in coda |  |"
    only_plus = [(src.replace("-", "+"), gold) for src, gold in PROBLEMS]
    experiment, grid = mlu_runs(tmp_path / "b", monkeypatch, [True] * 6, [True] * 6,
                                problems=only_plus)
    (r,) = slice_results(experiment, grid, "smoke", experiment.slicings(["operator"]))
    assert [(s.name, s.n_baseline, s.why) for s in r.rows if s.comparison is None] == [
        ("-", 0, "no unit in transformer and coda")]


def random_problems(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        x, y = rng.randrange(-50, 50), rng.randrange(-50, 50)
        first = rng.choice("xy")
        a, op, b = rng.choice("xy"), rng.choice("+-*"), rng.choice("xy")
        values = {"x": x, "y": y}
        assign = f"x={x},y={y}" if first == "x" else f"y={y},x={x}"
        out.append((f"{assign},{a}{op}{b}", str(eval(f"{values[a]}{op}{values[b]}"))))
    return out


def test_each_slice_is_the_claims_bootstrap_on_its_units(tmp_path, monkeypatch):
    """Two seeds of 120 problems: every slice's comparison is significance.compare of the
    claim's samples and seed on the rows of that slice's problems; one slice of every problem
    is the claim itself."""
    problems = random_problems(120, 0)
    rng = np.random.default_rng(1)
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    group = tmp_path / "coda_mlu" / "table6-smoke"
    for seed in (0, 1):
        for cell, p in (("transformer", 0.6), ("coda", 0.8)):
            correct = [bool(v) for v in rng.random(len(problems)) < p]
            write_run(group / f"{cell}-seed{seed}", mlu_rows(correct, problems),
                      {"test/exact_match": 0.5})
    experiment, grid = coda_mlu.EXPERIMENT, coda_mlu.EXPERIMENT.grid("table6")
    results = slice_results(experiment, grid, "smoke", experiment.slicings(["operator"]))
    stats = {cell: [sig.run_units(group / f"{cell}-seed{s}", "test/exact_match")[2]
                    for s in (0, 1)] for cell in ("transformer", "coda")}
    ops = np.array([src.rsplit(",", 1)[1][1] for src, _ in problems])
    for row in results[0].rows:
        keep = ops == row.name
        expected = sig.compare("mean", [s[keep] for s in stats["transformer"]],
                               [s[keep] for s in stats["coda"]], samples=CLAIM_SAMPLES,
                               seed=CLAIM_SEED)
        assert row.comparison == expected and row.n_baseline == keep.sum()
        assert row.comparison.low < row.comparison.diff < row.comparison.high
    whole = by_label("all", "every problem", lambda rows: "all")
    (r,) = slice_results(experiment, grid, "smoke", [whole])
    (claim,) = claim_results(experiment, grid, "smoke")
    assert r.rows[0].comparison == claim.comparison and r.rows[0].n_baseline == 120


def test_input_length_quartiles_and_gold_label(tmp_path, monkeypatch):
    """Eight SST sentences of 1..8 tokens: quartiles cut at 2, 4, 6 tokens (numbers of the
    data), two sentences each; gold labels by name."""
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    group = tmp_path / "coda_sentiment" / "table5-smoke"
    for cell, right in (("sst-transformer", [1, 1, 0, 0, 1, 1, 0, 0]), ("sst-coda", [1] * 8)):
        rows = [{"id": i, "input": "its words", "tokens": i + 1, "gold": i % 2,
                 "prediction": i % 2 if ok else 1 - i % 2, "log_probs": [-1.0, -0.5]}
                for i, ok in enumerate(right)]
        write_run(group / f"{cell}-seed0", rows, {"test/acc": 0.5})
    experiment = coda_sentiment.EXPERIMENT
    results = slice_results(experiment, experiment.grid("table5"), "smoke",
                            experiment.slicings([]))
    sst = [r for r in results if r.baseline == "sst-transformer"]
    assert rows_of(sst, "length") == [("Q1: <= 2 tokens", 2, 2, 100.0, 100.0, 0.0),
                                      ("Q2: (2, 4] tokens", 2, 2, 0.0, 100.0, 100.0),
                                      ("Q3: (4, 6] tokens", 2, 2, 100.0, 100.0, 0.0),
                                      ("Q4: > 6 tokens", 2, 2, 0.0, 100.0, 100.0)]
    assert rows_of(sst, "label") == [("negative", 4, 4, 50.0, 100.0, 50.0),
                                     ("positive", 4, 4, 50.0, 100.0, 50.0)]
    (imdb,) = [r for r in results if r.baseline == "imdb-transformer" and
               r.slicing.name == "label"]
    assert imdb.why == "not run (no seed of both cells)" and not imdb.rows


def test_a_file_without_the_slices_field_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    group = tmp_path / "coda_sentiment" / "table5-smoke"
    for cell in ("sst-transformer", "sst-coda"):
        write_run(group / f"{cell}-seed0", [{"id": i, "gold": 1, "prediction": 1}
                                            for i in range(4)], {"test/acc": 1.0})
    experiment = coda_sentiment.EXPERIMENT
    (r,) = [r for r in slice_results(experiment, experiment.grid("table5"), "smoke",
                                     experiment.slicings(["length"]))
            if r.baseline == "sst-transformer"]
    assert r.why == ("sst-transformer-seed0/predictions-test.jsonl has no 'tokens' field "
                     "(written, or committed, without it; `keep --tokens-from-data` gives a "
                     "run its counts from its test set)")
    assert format_sliced([r])[-1].startswith("| length | not computed: ")


def test_ranking_slices_are_questions(tmp_path, monkeypatch):
    """Questions (units of MAP) by their number of candidates and of correct answers; a
    question without a correct answer is no unit, as the logged MAP skips it."""
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    group = tmp_path / "coda_ranking" / "table2-smoke"
    # (group, gold) per candidate: q0 2 candidates 1 correct, q1 3 candidates 2 correct,
    # q2 4 candidates 1 correct, q3 5 candidates 2 correct, q4 2 candidates none correct
    candidates = [(0, 1), (0, 0), (1, 1), (1, 1), (1, 0), (2, 0), (2, 1), (2, 0), (2, 0),
                  (3, 1), (3, 0), (3, 1), (3, 0), (3, 0), (4, 0), (4, 0)]
    for cell in ("wikiqa-softmax", "wikiqa-coda"):
        rows = [{"id": i, "group": g, "gold": gold, "score": -float(i)}
                for i, (g, gold) in enumerate(candidates)]
        write_run(group / f"{cell}-seed0", rows, {"test/map": 0.5, "test/mrr": 0.5})
    experiment = coda_ranking.EXPERIMENT
    results = [r for r in slice_results(experiment, experiment.grid("table2"), "smoke",
                                         experiment.slicings([]))
               if r.baseline == "wikiqa-softmax" and r.label == "MAP"]
    correct = rows_of(results, "correct")
    assert [(name, n) for name, n, *_ in correct] == [("one correct", 2), ("several correct", 2)]
    assert correct[0][3] == pytest.approx(100 * (1 + 1 / 2) / 2)  # q0 AP 1, q2 AP 1/2
    assert [(name, n) for name, n, *_ in rows_of(results, "candidates")] == [
        ("Q1: <= 2 candidates", 1), ("Q2: (2, 3] candidates", 1),
        ("Q3: (3, 4] candidates", 1), ("Q4: > 4 candidates", 1)]


def test_translation_buckets_score_corpus_bleu_of_their_sentences(tmp_path, monkeypatch):
    from sacrebleu.metrics import BLEU

    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    rng = random.Random(0)
    words = "the a cat dog sat on mat it was red blue and".split()
    refs = [" ".join(rng.choice(words) for _ in range(n)) for n in (5, 8, 12, 15, 25, 9, 33)]
    hyps = {"softmax": [r if k % 2 else " ".join(r.split()[:-1]) for k, r in enumerate(refs)],
            "window": refs}
    grid = Grid("t", "t", {"BLEU": "test/bleu"}, [Cell("softmax"), Cell("window")],
                claims=[("softmax", "window")])
    experiment = dwin_mt.EXPERIMENT
    for cell, hs in hyps.items():
        rows = [{"id": i, "source": " ".join(["s"] * len(r.split())), "hypothesis": h,
                 "reference": r} for i, (h, r) in enumerate(zip(hs, refs))]
        write_run(tmp_path / "dwin_mt" / "t-smoke" / f"{cell}-seed0", rows, {"test/bleu": 0.3},
                  name="hypotheses-test.jsonl")
    (r,) = slice_results(experiment, grid, "smoke", experiment.slicings([]))
    buckets = {"<= 10 tokens": [0, 1, 5], "(10, 20] tokens": [2, 3],
               "(20, 30] tokens": [4], "(30, 40] tokens": [6], "> 40 tokens": []}
    assert [s.name for s in r.rows] == list(buckets)
    for s in r.rows:
        ids = buckets[s.name]
        assert s.n_baseline == len(ids)
        if ids:
            bleu = BLEU(tokenize="none").corpus_score([hyps["softmax"][i] for i in ids],
                                                      [[refs[i] for i in ids]]).score
            assert s.baseline == pytest.approx(bleu, abs=1e-9)
        else:
            assert s.why == "no unit in softmax and window"


def test_unknown_slice_names_and_experiments_without_slices_are_one_line(capsys):
    with pytest.raises(SystemExit) as err:
        print_report(coda_mlu.EXPERIMENT, ["table6", "--smoke", "--slices", "operator", "op"])
    assert str(err.value) == ("coda_mlu has no slice 'op'; slices: operator, pattern, "
                              "answer_length")
    with pytest.raises(SystemExit) as err:
        print_report(coda_open_qa.EXPERIMENT, ["--smoke", "--slices"])
    assert str(err.value) == ("coda_open_qa declares no slices (its script's "
                              "Experiment(slices=...))")


def test_a_row_the_slice_cannot_read_is_one_line(tmp_path, monkeypatch):
    experiment, grid = mlu_runs(tmp_path, monkeypatch, [True] * 6, [True] * 6)
    path = tmp_path / "coda_mlu" / "table6-smoke" / "transformer-seed0" / "predictions-test.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[3]["source"] = "x=1,y=2,x/y"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SystemExit) as err:
        print_report(experiment, ["table6", "--smoke", "--slices", "operator"])
    assert str(err.value) == (f"coda_mlu.py report table6 --slices: {path}: id 3: slice "
                              "'operator' cannot be read from it (source 'x=1,y=2,x/y' is not "
                              "an MLU problem (x=..,y=..,<x|y><+-*><x|y>))")


def test_report_prints_and_plots_the_slices(tmp_path, monkeypatch, capsys):
    experiment, grid = mlu_runs(tmp_path, monkeypatch, [True, False, True, False, True, False],
                                [True] * 5 + [False], seeds=(0, 1))
    print_report(experiment, ["table6", "--smoke", "--slices", "pattern", "--plot", "--out",
                              str(tmp_path / "plots")])
    out = capsys.readouterr().out
    assert "#### coda vs transformer, Acc: 2 seeds" in out
    assert "| pattern | same variable twice | 2 | 100.00 | 100.00 | +0.00 [+0.00, +0.00] " in out
    figure = tmp_path / "plots" / "coda_mlu-table6-smoke-slices.png"
    assert f"![slices]({figure})" in out and figure.stat().st_size > 0
    results = slice_results(experiment, grid, "smoke", experiment.slicings(["pattern"]))
    fig = plot_slices(results, "t")
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["coda vs transformer (Acc), pattern same variable twice, n=2",  # top down
                      "coda vs transformer (Acc), pattern both, as assigned, n=3",
                      "coda vs transformer (Acc), pattern both, reversed, n=1"]
    columns, rows = slices_table(experiment, grid, "smoke")
    assert columns[:8] == ["claim", "metric", "slices", "slice", "n baseline", "n proposal",
                           "baseline", "proposal"]
    assert rows[0][:8] == ["coda vs transformer", "Acc", "operator", "+", 2, 2, 50.0, 100.0]
    assert len(rows) == 3 + 3 + 3  # operator, pattern, answer length: 3 slices each
