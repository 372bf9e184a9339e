"""The translation and text2code experiment scripts end to end with ``--smoke``: CoDA Table 4
on the real shared IWSLT'15 files (training with checkpoints, averaging, beam search, BLEU of
both kinds with their signatures in the CSV, hparams.yaml and W&B, the hypotheses of every
test example in the run directory), Differentiable Window Table 1 on both language pairs
(the real newstest2014 En-De and the synthetic En-Fr fixture) and Table 4's parameters and
steps/s, CoDA Table 7 on the synthetic AlgoLisp fixture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lit_models.bleu import tokenized_bleu
from tests.conftest import finish, last_values, read_jsonl, run, shared_path, start
from tests.wandb_records import history

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "experiments"

pytestmark = pytest.mark.slow


def test_coda_mt_writes_bleu_with_signatures_and_every_hypothesis(env, tmp_path):
    shared_path("iwslt15_en_vi/train.first1000.en")
    run(SCRIPTS / "coda_mt.py", ["fit", "--config", "experiments/configs/coda_mt/smoke.yaml",
                                 "--model.attention", "coda", "--run.group", "e2e",
                                 "--run.name", "one", "--run.test_after_fit", "true"], env)
    run_dir = tmp_path / "runs" / "coda_mt" / "e2e" / "one"
    values = last_values(run_dir / "metrics.csv")
    assert {"val/bleu", "val/sacrebleu", "test/bleu", "test/sacrebleu",
            "train/steps_per_second"} <= set(values)
    hparams = yaml.safe_load((run_dir / "hparams.yaml").read_text())
    assert "tok:none" in hparams["test/bleu_signature"]
    assert "tok:13a" in hparams["test/sacrebleu_signature"]
    assert hparams["averaged_checkpoints"] == ["epoch=1-step=10.ckpt", "epoch=2-step=20.ckpt"]
    # the hypotheses of every test example decoded (2 batches of 16), each once, and the
    # logged BLEU is the BLEU of that file
    rows = [json.loads(line) for line in (run_dir / "hypotheses-test.jsonl").open()]
    assert len(rows) == 32 and len({r["id"] for r in rows}) == 32
    assert set(rows[0]) == {"id", "source", "hypothesis", "reference", "score"}
    tst2012 = shared_path("iwslt15_en_vi/tst2012.vi").read_text(encoding="utf-8").splitlines()
    assert all(r["reference"] == tst2012[r["id"]] for r in rows)
    # the beam's score: a length-penalised sum of log-probabilities, below 0
    assert all(isinstance(r["score"], float) and r["score"] < 0 for r in rows)
    bleu = tokenized_bleu([r["hypothesis"] for r in rows], [r["reference"] for r in rows])
    assert values["test/bleu"] == pytest.approx(bleu.score, rel=1e-5)
    scores = json.loads((run_dir / "bleu-test.json").read_text())
    assert scores["bleu"]["signature"] == bleu.signature and scores["examples"] == 32
    (wandb_run,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    assert history(wandb_run)["test/bleu"][-1] == pytest.approx(values["test/bleu"])


def test_dwin_mt_table1_on_both_pairs_and_table4_report(env, tmp_path):
    shared_path("wmt14_en_de/newstest2014-deen-src.en.sgm")
    procs = [start(SCRIPTS / "dwin_mt.py", ["grid", "table1", "--smoke", "--cells", cell],
                   env) for cell in ("en_de-enc_aw-cr_aw_seg-dec_mw", "en_fr-relative")]
    outs = [finish(p, timeout=600) for p in procs]
    assert all("1 runs" in out and "FAILED" not in out for out in outs)
    root = tmp_path / "runs" / "dwin_mt" / "table1-smoke"
    de = json.loads((root / "en_de-enc_aw-cr_aw_seg-dec_mw-seed0" / "bleu-test.json").read_text())
    assert "tok:none+compound-split" in de["bleu"]["signature"]  # into German
    fr = json.loads((root / "en_fr-relative-seed0" / "bleu-test.json").read_text())
    assert "compound" not in fr["bleu"]["signature"]
    config = yaml.safe_load((root / "en_de-enc_aw-cr_aw_seg-dec_mw-seed0" / "config.yaml")
                            .read_text())
    assert config["model"]["norm"] == "post" and config["model"]["attention_layers"] == 3
    assert config["model"]["cross_attention"]["init_args"]["segment_size"] == 5

    out = run(SCRIPTS / "dwin_mt.py", ["grid", "table4", "--smoke", "--cells", "transformer",
                                       "transformer_7_layers"], env, timeout=600)
    assert "FAILED" not in out
    report = run(SCRIPTS / "dwin_mt.py", ["report", "table4", "--smoke"], env)
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in report.splitlines()
            if line.startswith("| transformer")}
    params = {name: float(row[2].split()[0]) for name, row in rows.items()
              if "not run" not in row[2]}
    # the smoke model: 4+4 layers of width 32; 3 more of each add 7 layers' parameters
    assert params["transformer_7_layers"] > params["transformer"] > 0
    assert "not run" in rows["transformer_8_layers"][2]


def test_coda_text2code_smoke_grid_and_report(env, tmp_path):
    out = run(SCRIPTS / "coda_text2code.py", ["grid", "table7", "--smoke"], env, timeout=600)
    assert "2 runs" in out and "FAILED" not in out
    report = run(SCRIPTS / "coda_text2code.py", ["report", "table7", "--smoke"], env)
    assert "| transformer | 96.80 |" in report and "| coda | 97.70 |" in report
    values = last_values(tmp_path / "runs" / "coda_text2code" / "table7-smoke"
                         / "coda-seed0" / "metrics.csv")
    assert "test/exact_match" in values and "test/bleu" not in values  # no BLEU for code
    rows = read_jsonl(tmp_path / "runs" / "coda_text2code" / "table7-smoke" / "coda-seed0"
                      / "predictions-test.jsonl")  # programs as text, exact match per row
    assert [r["id"] for r in rows] == list(range(len(rows)))
    assert all(isinstance(r["prediction"], str) and isinstance(r["gold"], str) for r in rows)
    assert all(isinstance(r["source"], str) and r["source"] for r in rows)  # the description
    assert sum(r["correct"] for r in rows) / len(rows) == pytest.approx(values["test/exact_match"])


def test_qadm_mt_table1_smoke_cells_both_datasets(env, tmp_path):
    """The attention density matrix's Table 1 with the LSTM translator: MQT on the real
    shared IWSLT'15 files (En->Vi), AQT on the synthetic WMT'16 fixture (Ro->En), beam 3;
    the report puts the paper's dev/test numbers beside ours."""
    shared_path("iwslt15_en_vi/train.first1000.en")
    out = run(SCRIPTS / "qadm_mt.py", ["grid", "table1", "--smoke", "--cells", "en_vi-mqt",
                                       "ro_en-aqt"], env, timeout=600)
    assert "2 runs" in out and "FAILED" not in out
    root = tmp_path / "runs" / "qadm_mt" / "table1-smoke"
    for cell in ("en_vi-mqt", "ro_en-aqt"):
        values = last_values(root / f"{cell}-seed0" / "metrics.csv")
        assert {"val/bleu", "test/bleu", "test/sacrebleu"} <= set(values), cell
        assert (root / f"{cell}-seed0" / "hypotheses-test.jsonl").stat().st_size > 0
    config = yaml.safe_load((root / "en_vi-mqt-seed0" / "config.yaml").read_text())
    assert config["model"]["attention"]["init_args"]["scheme"] == "mqt"
    report = run(SCRIPTS / "qadm_mt.py", ["report", "table1", "--smoke"], env)
    assert "| en_vi-mqt | 23.41 |" in report and "| ro_en-additive | 17.15 | not run |" in report
