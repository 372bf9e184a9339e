"""experiments/coda_open_qa.py end to end: the smoke grid of CoDA Table 1 (both datasets, on
the synthetic fixtures in their published formats, softmax and CoDA), its per-question
predictions, and the report with the paper's numbers and the paired claims."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import last_values, read_jsonl, run

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "coda_open_qa.py"
CELLS = ("quasar_t-softmax", "quasar_t-coda", "searchqa-softmax", "searchqa-coda")

pytestmark = pytest.mark.slow


def test_table1_smoke_grid_runs_writes_predictions_and_reports(env, tmp_path):
    env = {**env, "ATTNREPRO_COMPILE": "0"}
    out = run(SCRIPT, ["grid", "table1", "--smoke"], env, timeout=600)
    for cell in CELLS:
        assert f"done {cell} seed 0" in out, out
    group = tmp_path / "runs" / "coda_open_qa" / "table1-smoke"
    for cell in CELLS:
        run_dir = group / f"{cell}-seed0"
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert config["model"]["attention"]["class_path"].endswith(cell.split("-")[1])
        values = last_values(run_dir / "metrics.csv")
        assert {"train/loss", "val/exact_match", "val/f1", "test/exact_match", "test/f1",
                "test/exact_match_quasar", "test/f1_quasar"} <= set(values)
        rows = read_jsonl(run_dir / "predictions-test.jsonl")
        assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)
        for row in rows:
            assert {"qid", "question", "prediction", "answers", "correct", "exact_match",
                    "f1"} <= set(row)
            assert isinstance(row["question"], str) and row["question"]  # the input text
            assert row["correct"] == (row["exact_match"] == 1.0)
        em = sum(r["exact_match"] for r in rows) / len(rows)
        assert values["test/exact_match"] == pytest.approx(em)  # the file is the metric's
    report = run(SCRIPT, ["report", "table1", "--smoke"], env)
    assert "| quasar_t-softmax | 38.60 |" in report and "| searchqa-coda | 57.20 |" in report
    assert "quasar_t-coda vs quasar_t-softmax | EM | +2.70" in report
    assert "searchqa-coda vs searchqa-softmax | EM | +0.40" in report
    # both metrics the paper prints are paired per question (its F1 too)
    claims = [line for line in report.splitlines() if " vs " in line and line.startswith("| ")]
    assert sorted(line.split(" | ")[1] for line in claims) == ["EM", "EM", "F1", "F1"]
    assert all("p=" in line or "p<" in line for line in claims), claims
