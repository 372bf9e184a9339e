"""Answer and response selection (CoDA Table 2): the grouped ranking metrics against values
computed by hand, DecompAtt's ranking evaluation, and the experiment's grids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lit_models.metrics import GroupedRanking

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "coda_ranking.py"

# (group, index, score, target); hand-computed per group (ties ordered by index):
#   g0 order 0(-) 1(+) 2(-) 3(+) 4(+): AP = (1/2 + 2/4 + 3/5) / 3, RR = 1/2, P@1 = 0
#      (the other tie order, 2 before 1, would give AP = (1/3 + 2/4 + 3/5) / 3)
#   g1 order 6(+) 5(-): AP = RR = P@1 = 1
#   g2 no positive: skipped
#   g3 order 10(-) 9(-) 11(+): AP = RR = 1/3, P@1 = 0
#   g4 all positive: AP = RR = P@1 = 1
ROWS = [(0, 0, 0.9, 0), (0, 1, 0.5, 1), (0, 2, 0.5, 0), (0, 3, 0.1, 1), (0, 4, 0.05, 1),
        (1, 5, 0.2, 0), (1, 6, 0.8, 1),
        (2, 7, 0.3, 0), (2, 8, 0.4, 0),
        (3, 9, 0.6, 0), (3, 10, 0.7, 0), (3, 11, 0.1, 1),
        (4, 12, 0.0, 1), (4, 13, 0.0, 1)]
AP = [(1 / 2 + 2 / 4 + 3 / 5) / 3, 1.0, 1 / 3, 1.0]
RR = [1 / 2, 1.0, 1 / 3, 1.0]
P1 = [0.0, 1.0, 0.0, 1.0]


def feed(metric, rows):
    group, index, score, target = (torch.tensor(c) for c in zip(*rows))
    metric.update(score.float(), target, group, index)


def test_grouped_ranking_hand_computed():
    metric = GroupedRanking()
    rows = ROWS[::-1]  # batches in any order, groups split across them
    feed(metric, rows[:5])
    feed(metric, rows[5:])
    feed(metric, [(0, 3, 0.99, 1)])  # index 3 again (a padded sampler): its first score counts
    out = metric.compute()
    assert out["map"].item() == pytest.approx(sum(AP) / 4)
    assert out["mrr"].item() == pytest.approx(sum(RR) / 4)
    assert out["p@1"].item() == pytest.approx(sum(P1) / 4)
    assert (out["groups"].item(), out["skipped"].item()) == (4, 1)
    assert out["map"].item() == pytest.approx(0.716667, abs=1e-6)
    assert out["mrr"].item() == pytest.approx(0.708333, abs=1e-6)


def test_grouped_ranking_r10_at_1_and_edge_cases():
    metric = GroupedRanking()
    # two contexts of ten candidates, the ground truth first in the file (index 0 and 10)
    scores = torch.tensor([0.7, *[0.1] * 9, 0.5, 0.9, *[0.2] * 8])
    feed(metric, [(i // 10, i, float(s), int(i % 10 == 0)) for i, s in enumerate(scores)])
    out = metric.compute()
    assert out["p@1"].item() == 0.5  # R10@1: the first context right, the second wrong
    assert out["mrr"].item() == pytest.approx((1 + 1 / 2) / 2)
    with pytest.warns(UserWarning, match="before the ``update``"):
        empty = GroupedRanking().compute()
    assert empty["map"].isnan() and empty["groups"].item() == 0
    with pytest.raises(ValueError, match="four"):
        GroupedRanking().update(torch.zeros(2), torch.zeros(3), torch.zeros(2), torch.zeros(2))


# -- the experiment end to end -------------------------------------------------------------------
def average_precisions(rows):
    """Per group (skipping those without a positive): AP and RR, candidates ordered by score
    (descending), ties by id -- written independently of lit_models.metrics."""
    groups = {}
    for r in rows:
        groups.setdefault(r["group"], []).append(r)
    ap, rr = [], []
    for cands in groups.values():
        ranked = sorted(cands, key=lambda r: (-r["score"], r["id"]))
        hits = [i + 1 for i, r in enumerate(ranked) if r["gold"] == 1]
        if hits:
            ap.append(sum((n + 1) / rank for n, rank in enumerate(hits)) / len(hits))
            rr.append(1 / hits[0])
    return sum(ap) / len(ap), sum(rr) / len(rr)


@pytest.mark.slow
def test_table2_smoke_grid_every_dataset_and_report(env, tmp_path):
    """One cell per dataset config (CoDA on WikiQA) through ``grid table2 --smoke``: the
    logged MAP/MRR equal those recomputed from the run's predictions file, and the report
    prints the paper's numbers."""
    from tests.conftest import last_values, run, shared_path

    shared_path("wikiqa/filtered/dev/a.toks")
    shared_path("trecqa/DEV.xml")
    shared_path("samples/ubuntu_dialogs_corpus__dev_test_2.0.0/dummy_data/test.csv")
    env = {**env, "ATTNREPRO_COMPILE": "0"}
    cells = ["wikiqa-coda", "trecqa-softmax", "udc-softmax"]
    out = run(SCRIPT, ["grid", "table2", "--smoke", "--jobs", "2", "--cells", *cells], env)
    group = tmp_path / "runs" / "coda_ranking" / "table2-smoke"
    for cell in cells:
        assert f"done {cell} seed 0" in out, out
        values = last_values(group / f"{cell}-seed0" / "metrics.csv")
        assert {"val/map", "val/mrr", "val/p@1", "val/map_best", "test/map", "test/mrr",
                "test/p@1", "test/acc"} <= set(values), cell
        rows = [json.loads(line) for line in
                (group / f"{cell}-seed0" / "predictions-test.jsonl").read_text().splitlines()]
        assert rows and {"id", "line", "gold", "prediction", "group", "score"} <= set(rows[0])
        ap, rr = average_precisions(rows)
        assert values["test/map"] == pytest.approx(ap, abs=1e-6), cell
        assert values["test/mrr"] == pytest.approx(rr, abs=1e-6), cell
    udc = [json.loads(line) for line in
           (group / "udc-softmax-seed0" / "predictions-test.jsonl").read_text().splitlines()]
    assert len(udc) == 10 and [r["gold"] for r in udc] == [1] + [0] * 9  # one context of 10
    report = run(SCRIPT, ["report", "table2", "--smoke"], env)
    assert "70.5" in report and "52.5" in report  # the paper's WikiQA MAP and UDC R10@1 (CoDA)
    assert "wikiqa-coda" in report


def test_r10_at_1_on_a_written_ubuntu_file(tmp_path):
    """R10@1 end to end on written Ubuntu v2 files: three contexts of one ground truth and
    nine distractors, each candidate scored by a rule; by hand, the ground truth is ranked
    first in contexts 0 and 2 only: R10@1 = 2/3."""
    from datamodules.ranking import UbuntuDataModule

    header = "Context,Ground Truth Utterance," + ",".join(f"Distractor_{i}" for i in range(9))
    rows = [",".join([f"context {c} __eou__"] + [f"c{c} r{i} __eou__" for i in range(10)])
            for c in range(3)]
    (tmp_path / "valid.csv").write_text(header + "\n" + "\n".join(rows) + "\n")
    (tmp_path / "train.csv").write_text("Context,Utterance,Label\nx,y,1\nx,z,0\n")
    dm = UbuntuDataModule(data_dir=str(tmp_path), test_file="valid.csv", batch_size=7)
    dm.setup()
    metric = GroupedRanking()
    for batch in dm.val_dataloader():
        for i in range(len(batch["index"])):
            # pairs in file order: context k's candidates are 10k..10k+9, the ground truth first
            context, candidate = divmod(int(batch["index"][i]), 10)
            assert int(batch["group"][i]) == context
            assert int(batch["label"][i]) == (candidate == 0)
            # the ground truth (r0) scores highest except in context 1, where r5 does
            score = 0.9 if candidate == 0 else 0.1 * candidate / 10
            if context == 1 and candidate == 5:
                score = 1.0
            metric.update(torch.tensor([score]), batch["label"][i:i + 1],
                          batch["group"][i:i + 1], batch["index"][i:i + 1])
    out = metric.compute()
    assert out["groups"].item() == 3
    assert out["p@1"].item() == pytest.approx(2 / 3)
    assert out["mrr"].item() == pytest.approx((1 + 1 / 2 + 1) / 3)
