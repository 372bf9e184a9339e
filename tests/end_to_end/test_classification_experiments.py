"""The classification and language-modelling experiment scripts end to end, each grid cell
with ``--smoke`` alone: CoDA Table 5 on the synthetic aclImdb fixture and the shared GLUE
SST-2 copy, Differentiable Window Table 5 on the real SST trees and Linzen files and the
aclImdb fixture (a local grid, each cell merging its dataset's config, and the report),
Table 6 on the synthetic One Billion Word fixture; the paper configs parse."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import yaml

from datamodules.common import shared_data_dir
from experiments import coda_sentiment, dwin_classification, dwin_lm
from experiments.harness.cli import run_cli
from experiments.harness.runner import main as run_script
from lit_models.transformer import TransformerClassifier
from tests.conftest import last_values, read_jsonl, run, shared_path
from tests.wandb_records import records

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "experiments"
CONFIGS = SCRIPTS / "configs"

pytestmark = pytest.mark.slow


def wandb_config(run_dir: Path) -> dict:
    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    return {item.key: yaml.safe_load(item.value_json) for r in records(path)
            if r.WhichOneof("record_type") == "config" for item in r.config.update}


def test_coda_sentiment_grid_on_both_datasets(env, tmp_path):
    # SST: the shared GLUE SST-2 copy (run when it is there); IMDb: the synthetic fixture
    sst = (shared_data_dir() / "sst2_glue" / "glue_sst2_train.part90.tsv").exists()
    cells = ["imdb-coda"] + (["sst-transformer"] if sst else [])
    out = run(SCRIPTS / "coda_sentiment.py",
              ["grid", "table5", "--smoke", "--cells", *cells, "--jobs", "2"], env)
    group = tmp_path / "runs" / "coda_sentiment" / "table5-smoke"
    if sst:
        assert "done sst-transformer seed 0" in out
        config = yaml.safe_load((group / "sst-transformer-seed0" / "config.yaml").read_text())
        assert config["data"]["class_path"] == "datamodules.sst.SSTDataModule"
        assert config["data"]["init_args"]["format"] == "glue"
        assert config["model"]["attention"]["class_path"].endswith("softmax")
        values = last_values(group / "sst-transformer-seed0" / "metrics.csv")
        assert 0 <= values["test/acc"] <= 1
    run_dir = group / "imdb-coda-seed0"
    values = last_values(run_dir / "metrics.csv")
    assert {"train/loss", "train/acc", "val/acc", "test/acc"} <= set(values)
    assert 0 <= values["test/acc"] <= 1
    assert list((run_dir / "checkpoints").glob("epoch=*-step=10.ckpt"))  # mid-training
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["data"]["class_path"] == "datamodules.imdb.IMDbDataModule"
    assert config["data"]["init_args"]["data_dir"] == "tests/fixtures/aclImdb"
    assert config["data"]["init_args"]["tokenization"] == "bpe"
    assert config["model"]["attention"]["class_path"].endswith("coda")
    # the parameter count reaches the CSV logger's hparams and the W&B config, and is right
    hparams = yaml.safe_load((run_dir / "hparams.yaml").read_text())
    model = TransformerClassifier(hparams["vocab_size"], hparams["num_classes"],
                                  d_model=32, n_heads=2, d_ff=64, n_layers=2)
    assert hparams["n_parameters"] == model.n_parameters()
    logged = wandb_config(run_dir)
    assert logged["n_parameters"] == model.n_parameters()
    assert logged["attention/encoder"] == "coda"
    # every test example's prediction: the logged accuracy recomputed from the file
    rows = read_jsonl(run_dir / "predictions-test.jsonl")
    assert [r["id"] for r in rows] == list(range(12))  # the fixture's 6 + 6 reviews
    assert set(rows[0]) == {"id", "input", "tokens", "gold", "prediction", "log_probs"}
    assert all(r["prediction"] == max(range(2), key=r["log_probs"].__getitem__) for r in rows)
    assert all(0 < r["tokens"] <= 64 for r in rows)  # the smoke config's max_len
    # the input: the review's words (BPE decoded), the first ones as in one of the 12 files
    reviews = [" ".join(f.read_text(encoding="utf-8").lower().split())
               for f in (ROOT / "tests" / "fixtures" / "aclImdb" / "test").rglob("*.txt")]
    assert len({r["input"] for r in rows}) == 12
    assert all(sum(" ".join(r["input"].split()[:5]) in text for text in reviews) == 1
               for r in rows), [r["input"][:60] for r in rows]
    assert sum(r["prediction"] == r["gold"] for r in rows) / len(rows) == \
        pytest.approx(values["test/acc"])
    # keep: the run to commit without the text; a run committed without text or counts gets
    # the same counts from its own test set (its DataModule, from its config.yaml)
    kept = tmp_path / "kept"
    run(SCRIPTS / "coda_sentiment.py", ["keep", "table5", "--smoke", "--cells", "imdb-coda",
                                        "--to", str(kept)], env)
    kept_file = kept / "coda_sentiment" / "table5-smoke" / "imdb-coda-seed0" / \
        "predictions-test.jsonl"
    without_text = [{k: v for k, v in r.items() if k != "input"} for r in rows]
    assert read_jsonl(kept_file) == without_text
    out = run(SCRIPTS / "coda_sentiment.py", ["keep", "table5", "--smoke", "--cells", "imdb-coda",
                                              "--to", str(tmp_path / "checked"),
                                              "--tokens-from-data"], env)
    assert "12 test examples counted" in out  # and each agrees with the model's count
    kept_file.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "tokens"})
                                 + "\n" for r in without_text))
    out = run(SCRIPTS / "coda_sentiment.py", ["keep", "table5", "--smoke", "--cells", "imdb-coda",
                                              "--to", str(kept), "--tokens-from-data"],
              {**env, "ATTNREPRO_RUNS": str(kept)})
    assert "12 test examples counted" in out
    assert read_jsonl(kept_file) == without_text


def test_dwin_classification_fit_on_the_linzen_files(env, tmp_path):
    shared_path("linzen_agreement/numpred.val")
    run(SCRIPTS / "dwin_classification.py", [
        "fit", "--config", str(CONFIGS / "dwin_classification" / "smoke.yaml"),
        "--config", str(CONFIGS / "dwin_classification" / "smoke" / "sva.yaml"),
        "--model.attention=window", "--model.attention.variant=aw", "--run.group=e2e",
        "--run.name=sva", "--run.test_after_fit=true", "--run.wandb=false"], env)
    run_dir = tmp_path / "runs" / "dwin_classification" / "e2e" / "sva"
    values = last_values(run_dir / "metrics.csv")
    assert {"val/acc", "test/acc"} <= set(values)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["data"]["class_path"] == "datamodules.sva.SVADataModule"
    assert config["data"]["init_args"]["train_file"] == "numpred.val"
    assert config["model"]["attention_layers"] == 1
    assert config["model"]["attention"]["init_args"]["variant"] == "aw"


def test_dwin_lm_cell_and_its_perplexity_report(env, tmp_path):
    run(SCRIPTS / "dwin_lm.py", ["grid", "table6", "--smoke", "--cells", "window-mw"], env)
    run_dir = tmp_path / "runs" / "dwin_lm" / "table6-smoke" / "window-mw-seed0"
    values = last_values(run_dir / "metrics.csv")
    # both token-weighted over the split: perplexity = exp(loss)
    assert values["val/perplexity"] == pytest.approx(math.exp(values["val/loss"]), rel=1e-4)
    assert values["test/perplexity"] == pytest.approx(math.exp(values["test/loss"]), rel=1e-4)
    vocab_size = yaml.safe_load((run_dir / "hparams.yaml").read_text())["vocab_size"]
    assert vocab_size == 4 + 15  # specials and the 15 words of the synthetic fixture
    assert values["test/perplexity"] < vocab_size  # learnt something: below uniform
    # every test sentence's NLL: the logged perplexity recomputed from the file
    rows = read_jsonl(run_dir / "predictions-test.jsonl")
    assert [r["id"] for r in rows] == list(range(len(rows)))
    heldout = [line.split() for line in (ROOT / "tests" / "fixtures" / "lm1b" /
               "heldout-monolingual.tokenized.shuffled" / "news.en.heldout-00000-of-00050")
               .read_text(encoding="utf-8").splitlines()]
    assert [r["input"].split() for r in rows] == heldout[:len(rows)]  # the test sentences
    assert math.exp(sum(r["nll"] for r in rows) / sum(r["tokens"] for r in rows)) == \
        pytest.approx(values["test/perplexity"], rel=1e-5)
    assert wandb_config(run_dir)["attention/decoder"] == "window(variant=mw)"
    report = run(SCRIPTS / "dwin_lm.py", ["report", "table6", "--smoke"], env)
    # perplexity in its own units (scale 1), not as a percentage
    assert f"| window-mw | 44.00 | {values['test/perplexity']:.2f} (n=1) |" in report
    assert "| softmax | 46.37 | not run |" in report


def test_grid_of_an_sst_and_an_imdb_cell_and_report(env, tmp_path):
    shared_path("sst_ptb/train.txt")
    out = run(SCRIPTS / "dwin_classification.py",
              ["grid", "table5", "--smoke", "--cells", "sst-relative", "imdb-window-aw",
               "--jobs", "2"], env)
    assert "done sst-relative seed 0" in out and "done imdb-window-aw seed 0" in out
    group = tmp_path / "runs" / "dwin_classification" / "table5-smoke"
    configs = {c: yaml.safe_load((group / f"{c}-seed0" / "config.yaml").read_text())
               for c in ("sst-relative", "imdb-window-aw")}
    # each cell merged its dataset's config
    sst, imdb = configs["sst-relative"]["data"], configs["imdb-window-aw"]["data"]
    assert sst["class_path"] == "datamodules.sst.SSTDataModule"
    assert sst["init_args"]["format"] == "ptb" and sst["init_args"]["max_train_examples"] == 512
    assert imdb["class_path"] == "datamodules.imdb.IMDbDataModule"
    assert imdb["init_args"]["data_dir"] == "tests/fixtures/aclImdb"
    assert configs["sst-relative"]["model"]["attention_layers"] is None  # Shaw: every layer
    assert configs["imdb-window-aw"]["model"]["attention_layers"] == 1  # window: layer 1
    report = run(SCRIPTS / "dwin_classification.py", ["report", "table5", "--smoke"], env)
    for cell, paper in (("sst-relative", "79.73"), ("imdb-window-aw", "87.98")):
        ours = 100 * last_values(group / f"{cell}-seed0" / "metrics.csv")["test/acc"]
        assert f"| {cell} | {paper} | {ours:.2f} (n=1) |" in report
    assert "| sva-window-aw | 96.19 | not run |" in report
    assert "| sst-window-aw | 82.13 | not run |" in report


def test_cell_commands_merge_the_dataset_config_of_the_grid_config(capsys):
    run_script(coda_sentiment.EXPERIMENT, ["grid", "table5", "--smoke", "--dry-run", "--cells",
                                    "imdb-coda"])
    smoke = CONFIGS / "coda_sentiment" / "smoke"
    out = capsys.readouterr().out
    assert f"--config {smoke}.yaml --config={smoke}/imdb.yaml --model.attention=coda" in out
    run_script(coda_sentiment.EXPERIMENT, ["grid", "table5", "--dry-run", "--cells",
                                    "sst-transformer"])
    paper = CONFIGS / "coda_sentiment" / "paper"
    out = capsys.readouterr().out
    assert f"--config {paper}.yaml --config={paper}/sst.yaml --model.attention=softmax" in out


def test_lm_sweep_minimises_perplexity(env, tmp_path):
    out_path = tmp_path / "sweep.yaml"
    run(SCRIPTS / "dwin_lm.py", ["sweep", "table6", "--smoke", "--output", str(out_path)], env)
    sweep = yaml.safe_load(out_path.read_text())
    assert sweep["metric"] == {"name": "test/perplexity", "goal": "minimize"}
    assert sweep["parameters"]["cell"]["values"] == ["softmax", "relative", "window-mw",
                                                     "window-aw"]


PAPER_CONFIGS = [(coda_sentiment, "imdb"), (coda_sentiment, "sst"),
                 (dwin_classification, "sst"), (dwin_classification, "imdb"),
                 (dwin_classification, "sva"), (dwin_lm, None)]


@pytest.mark.parametrize("module,dataset", PAPER_CONFIGS,
                         ids=[f"{m.EXPERIMENT.name}-{d}" for m, d in PAPER_CONFIGS])
def test_paper_configs_parse(module, dataset, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", [module.__file__])  # the CLI reads only argv below
    experiment = module.EXPERIMENT
    argv = ["fit", "--config", str(experiment.config_path("paper"))]
    if dataset:
        argv += ["--config", str(experiment.config_dir / "paper" / f"{dataset}.yaml")]
    with pytest.raises(SystemExit) as done:
        run_cli(experiment, argv + ["--print_config"])
    assert done.value.code in (0, None)
    config = yaml.safe_load(capsys.readouterr().out)
    steps = {"coda_sentiment": 2000, "dwin_lm": 100000}.get(
        experiment.name, {"sst": 3000, "imdb": 10000, "sva": 10000}.get(dataset))
    assert config["trainer"]["max_steps"] == steps
    assert config["model"]["d_model"] == (512 if experiment.name == "dwin_lm" else 128)
