"""Multi-process evaluation is exact (issue 16): Lightning DDP on 2 CPU processes (gloo)
validates on the full set and gives the single-process metrics (no example counted twice or
dropped).  DDP runs in a subprocess of the experiment script, never in pytest's process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import last_values, read_jsonl, run, shared_path

ROOT = Path(__file__).resolve().parents[2]
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


def iwslt_with_a_short_test_set(folder: Path, n: int = 101) -> Path:
    """The shared IWSLT'15 folder with a test set of the first ``n`` lines of tst2012 (an
    odd count, so the two processes' shares differ in size)."""
    shared = shared_path("iwslt15_en_vi")
    folder.mkdir()
    for f in shared.iterdir():
        (folder / f.name).symlink_to(f)
    for lang in ("en", "vi"):
        lines = (shared / f"tst2012.{lang}").read_text(encoding="utf-8").splitlines(True)
        (folder / f"short.{lang}").write_text("".join(lines[:n]), encoding="utf-8")
    return folder


def test_test_predictions_on_two_processes_equal_one(env, tmp_path):
    """``test`` on 2 processes writes the same per-example predictions file as on one (each
    example once, in split order) and logs the same metric: seq2seq exact match (MLU),
    classification accuracy (the aclImdb fixture), perplexity (the LM1B fixture: a sum of
    token NLLs over the split) and corpus BLEU of beam-search translations (101 sentences
    of IWSLT'15 tst2012: hypotheses gathered from both processes, scored once)."""
    iwslt = iwslt_with_a_short_test_set(tmp_path / "iwslt")
    env = {**env, "ATTNREPRO_COMPILE": "0"}
    # 20 training steps first, so BLEU is above 0 and a lost or doubled sentence would move it
    mt_smoke = [CONFIGS / "coda_mt" / "smoke.yaml"]
    run(ROOT / "experiments" / "coda_mt.py",
        ["fit", "--config", str(mt_smoke[0]), "--run.wandb", "false", "--run.name", "trained",
         "--run.average_last", "0", "--trainer.callbacks=[]"], env, timeout=600)
    trained = next((tmp_path / "runs").rglob("trained/checkpoints/*.ckpt"))
    for script, configs, extra, keys, predictions, n in [
            ("coda_mlu.py", [CONFIGS / "coda_mlu" / "smoke.yaml"], [],
             ("test/exact_match",), "predictions-test.jsonl", 64),
            ("coda_sentiment.py", [CONFIGS / "coda_sentiment" / "smoke.yaml",
                                   CONFIGS / "coda_sentiment" / "smoke" / "imdb.yaml"], [],
             ("test/acc",), "predictions-test.jsonl", 12),
            ("dwin_lm.py", [CONFIGS / "dwin_lm" / "smoke.yaml"],
             ["--trainer.limit_test_batches", "1.0"],
             ("test/perplexity", "test/loss"), "predictions-test.jsonl", None),
            ("coda_mt.py", mt_smoke,
             ["--ckpt_path", str(trained), "--trainer.limit_test_batches", "1.0",
              "--data.data_dir", str(iwslt),
              "--data.test_prefix", "short", "--data.eval_batch_size", "16"],
             ("test/bleu", "test/sacrebleu", "test/loss"), "hypotheses-test.jsonl", 101)]:
        values, rows = {}, {}
        for devices in (1, 2):
            out = run(ROOT / "experiments" / script,
                      ["test", *[a for c in configs for a in ("--config", str(c))], *extra,
                       "--trainer.accelerator", "cpu", "--trainer.devices", str(devices),
                       *(["--trainer.strategy", "ddp"] if devices > 1 else []),
                       "--run.wandb", "false", "--run.name", f"test{devices}"], env,
                      timeout=600)
            if devices > 1:
                assert "GLOBAL_RANK: 1, MEMBER: 2/2" in out, out
            path = next((tmp_path / "runs").rglob(f"test{devices}/metrics.csv"))
            values[devices] = last_values(path)
            rows[devices] = read_jsonl(path.parent / predictions)
            path.parent.rename(path.parent.with_name(f"{script}-test{devices}"))
        assert rows[2] == rows[1] and len(rows[1]) > 1, script  # the whole test split
        assert n is None or len(rows[1]) == n, script
        for key in keys:
            assert values[2][key] == pytest.approx(values[1][key], rel=1e-6), (script, key)
    assert values[1]["test/bleu"] > 0  # the last script: coda_mt, trained
