"""Multi-process evaluation is exact (issue 16): Lightning DDP on 2 CPU processes (gloo)
validates on the full set and gives the single-process metrics (no example counted twice or
dropped).  DDP runs in a subprocess of the experiment script, never in pytest's process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import last_values, read_jsonl, run, shared_path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "experiments" / "configs"

pytestmark = pytest.mark.slow


def validate(script: str, configs: list[Path], name: str, devices: int, env) -> str:
    return run(ROOT / "experiments" / script,
        ["validate", *[a for c in configs for a in ("--config", str(c))],
         "--trainer.limit_val_batches", "1.0", "--trainer.accelerator", "cpu",
         "--trainer.devices", str(devices),
         *(["--trainer.strategy", "ddp"] if devices > 1 else []),
         "--run.wandb", "false", "--run.name", name], env, timeout=600)


def test_validation_on_two_processes_equals_one(env, tmp_path):
    """NLI (acc, loss), ranking (MAP, MRR, P@1) and seq2seq (token loss, exact match)."""
    shared_path("snli/snli_1.0_dev.first1288.jsonl")
    shared_path("wikiqa/filtered/dev/a.toks")
    env = {**env, "ATTNREPRO_COMPILE": "0"}
    for script, configs, keys in [
            ("coda_nli.py", [CONFIGS / "coda_nli" / "smoke.yaml",
                             CONFIGS / "coda_nli" / "smoke" / "snli.yaml"],
             ("val/acc", "val/loss")),
            ("coda_ranking.py", [CONFIGS / "coda_ranking" / "smoke.yaml",
                                 CONFIGS / "coda_ranking" / "smoke" / "wikiqa.yaml"],
             ("val/acc", "val/loss", "val/map", "val/mrr", "val/p@1")),
            ("coda_mlu.py", [CONFIGS / "coda_mlu" / "smoke.yaml"],  # 1 batch of 64: cut in 2
             ("val/loss", "val/exact_match"))]:
        values = {}
        for devices in (1, 2):
            out = validate(script, configs, f"devices{devices}", devices, env)
            if devices > 1:
                assert "GLOBAL_RANK: 1, MEMBER: 2/2" in out, out  # two processes ran
            path = next((tmp_path / "runs").rglob(f"devices{devices}/metrics.csv"))
            values[devices] = last_values(path)
            path.parent.rename(path.parent.with_name(f"{script}-devices{devices}"))
        for key in keys:
            assert values[2][key] == pytest.approx(values[1][key], rel=1e-5), (script, key)


def test_test_predictions_on_two_processes_equal_one(env, tmp_path):
    """``test`` on 2 processes writes the same per-example predictions file as on one (each
    example once, in split order) and logs the same metric: seq2seq exact match (MLU) and
    classification accuracy (the aclImdb fixture)."""
    env = {**env, "ATTNREPRO_COMPILE": "0"}
    for script, configs, key in [
            ("coda_mlu.py", [CONFIGS / "coda_mlu" / "smoke.yaml"], "test/exact_match"),
            ("coda_sentiment.py", [CONFIGS / "coda_sentiment" / "smoke.yaml",
                                   CONFIGS / "coda_sentiment" / "smoke" / "imdb.yaml"],
             "test/acc")]:
        values, rows = {}, {}
        for devices in (1, 2):
            out = run(ROOT / "experiments" / script,
                      ["test", *[a for c in configs for a in ("--config", str(c))],
                       "--trainer.accelerator", "cpu", "--trainer.devices", str(devices),
                       *(["--trainer.strategy", "ddp"] if devices > 1 else []),
                       "--run.wandb", "false", "--run.name", f"test{devices}"], env,
                      timeout=600)
            if devices > 1:
                assert "GLOBAL_RANK: 1, MEMBER: 2/2" in out, out
            path = next((tmp_path / "runs").rglob(f"test{devices}/metrics.csv"))
            values[devices] = last_values(path)[key]
            rows[devices] = read_jsonl(path.parent / "predictions-test.jsonl")
            path.parent.rename(path.parent.with_name(f"{script}-test{devices}"))
        assert rows[2] == rows[1] and len(rows[1]) in (64, 12), script  # the whole test split
        assert values[2] == pytest.approx(values[1], rel=1e-6), script
