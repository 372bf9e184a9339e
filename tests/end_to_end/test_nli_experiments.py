"""The NLI experiment scripts end to end (experiments/decomp_snli.py, experiments/coda_nli.py):
every model class through LightningCLI's subclass mode, a cell of every dataset config run
by the grid commands with ``--smoke`` alone (the shared SNLI dev prefix, the MultiNLI and
SciTail samples, the synthetic Dialogue NLI fixture), each cell merging its dataset's
config, W&B offline logs with the heat maps, and the report with the paper's numbers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import finish, last_values, run, shared_path, start
from tests.wandb_records import history

ROOT = Path(__file__).resolve().parents[2]
DECOMP = ROOT / "experiments" / "decomp_snli.py"
CODA = ROOT / "experiments" / "coda_nli.py"
SNLI_DEV = "snli/snli_1.0_dev.first1288.jsonl"
MNLI = "samples/multi_nli__0.0.0/dummy_data/multinli_1.0.zip/multinli_1.0"
SCITAIL = "samples/scitail__tsv_format_1.1.0/dummy_data/SciTailV1.1"
CODA_CONFIGS = ROOT / "experiments" / "configs" / "coda_nli"

pytestmark = pytest.mark.slow


@pytest.fixture
def env(env):
    """The shared environment with the SNLI dev prefix present and CoDA's kernels eager
    (compiling them takes longer than these few steps; their numbers are tested in
    test_coda.py)."""
    shared_path(SNLI_DEV)
    return {**env, "ATTNREPRO_COMPILE": "0"}


def test_table1_grid_runs_every_model_class_and_reports(env, tmp_path):
    out = run(DECOMP, ["grid", "table1", "--smoke", "--jobs", "2"], env)
    for cell in ("vanilla", "intra", "exact", "latent"):
        assert f"done {cell} seed 0" in out, out
    group = tmp_path / "runs" / "decomp_snli" / "table1-smoke"

    config = {c: yaml.safe_load((group / f"{c}-seed0" / "config.yaml").read_text())["model"]
              for c in ("vanilla", "intra", "exact", "latent")}
    assert config["vanilla"]["class_path"] == "lit_models.decomp_att.DecompAtt"
    assert config["vanilla"]["init_args"]["lr"] == 0.0001
    assert config["intra"]["init_args"]["intra"] is True
    assert config["exact"]["class_path"] == "lit_models.mixture.Mixture"
    exact = config["exact"]["init_args"]
    assert exact["mode"] == "exact" and exact["k"] == 3
    latent = config["latent"]["init_args"]
    assert latent["mode"] == "latent" and latent["k"] == 4
    assert latent["hidden"] == 16  # the smoke config's settings carry over to the Mixture

    metrics = {c: last_values(group / f"{c}-seed0" / "metrics.csv") for c in config}
    for values in metrics.values():
        assert {"train/loss", "val/acc", "val/loss", "test/acc", "test/loss"} <= set(values)
        assert 0 <= values["test/acc"] <= 1
    assert {"val/acc_member0", "val/acc_member2", "test/acc_member2"} <= set(metrics["exact"])
    assert {"train/elbo", "train/kl", "train/reinforce", "train/reward", "train/q_entropy",
            "train/routing_entropy", "train/routed_member3", "val/elbo", "val/kl",
            "val/q_entropy", "val/routing_entropy", "test/elbo"} <= set(metrics["latent"])
    lat = metrics["latent"]
    assert 0 <= lat["train/kl"] <= torch.log(torch.tensor(4.0)) + 1e-6
    assert lat["val/elbo"] <= -lat["val/loss"] + 1e-6  # ELBO <= log p(y|a,b)

    # W&B (offline): the same numbers, the KL/REINFORCE terms and the attention heat maps
    runs = list((group / "latent-seed0" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    logged = history(runs[0])
    assert logged["test/acc"][-1] == pytest.approx(lat["test/acc"])
    assert {"train/kl", "train/reinforce", "train/q_entropy"} <= set(logged)
    images = [k for k in logged if k.startswith("val/attention_pair")]
    assert any(k.startswith("val/attention_pair0") for k in images)
    assert any(k.startswith("val/attention_pair1") for k in images)

    report = run(DECOMP, ["report", "table1", "--smoke"], env)
    for cell, paper in (("vanilla", "74.44 | "), ("intra", "62.06 | "), ("exact", "71.65 | "),
                        ("latent", "66.01 | ")):
        ours = f"{100 * metrics[cell]['val/acc']:.2f} (n=1)"
        assert f"| {cell} | {paper}{ours} |" in report, report
    assert "| 86.30 | " in report and "Parikh" in report


def test_fit_with_pretrained_vectors_through_the_cli(env, tmp_path):
    # a GloVe-format file for a few words of the SNLI prefix: the model gets the frozen
    # vectors through the data.embeddings -> model.embeddings link
    glove = tmp_path / "glove.tiny.8d.txt"
    glove.write_text("".join(f"{w} " + " ".join(f"{(i + j) / 10:.1f}" for j in range(8)) + "\n"
                             for i, w in enumerate(["A", "man", "the", "is", "."])))
    run(DECOMP, ["fit", "--config", "experiments/configs/decomp_snli/smoke.yaml",
                 "--model=Mixture", "--model.mode=latent", "--model.k=2",
                 f"--data.vectors={glove}", "--data.vectors_dim=8", "--trainer.max_steps=4",
                 "--run.group=vectors", "--run.name=one", "--run.wandb=false"], env)
    run_dir = tmp_path / "runs" / "decomp_snli" / "vectors" / "one"
    path = next((run_dir / "checkpoints").glob("*.ckpt"))
    ckpt = torch.load(path, weights_only=False)
    assert ckpt["hyper_parameters"]["pretrained_dim"] == 8
    assert "embeddings" not in ckpt["hyper_parameters"]  # not the (V, 8) matrix
    vectors = ckpt["state_dict"]["net.vectors"]
    assert vectors.shape[1] == 8
    # one frozen matrix shared by the members and the inference network (stored once)
    assert ckpt["state_dict"]["inference.vectors"].data_ptr() == vectors.data_ptr()
    # rows of words in the file hold their vectors; the padding row is zero
    assert (vectors == torch.arange(8) / 10).all(-1).any()
    assert (vectors[0] == 0).all()
    assert ckpt["state_dict"]["net.project.weight"].shape == (2, 8, 16)
    # the checkpoint alone rebuilds the model, vectors included
    from lit_models.mixture import Mixture

    loaded = Mixture.load_from_checkpoint(path, weights_only=False)
    assert loaded.mode == "latent" and torch.equal(loaded.net.vectors, vectors)


def test_coda_nli_grids_on_every_dataset(env, tmp_path):
    shared_path(MNLI), shared_path(SCITAIL)
    quiet = ["--run.wandb=false"]
    # every dataset config with nothing but --smoke (the data folders are in the configs)
    first = [  # two processes at a time on two cores
        start(CODA, ["grid", "table3", "--smoke", "--cells", "snli-softmax", "snli-coda",
                     "--", *quiet], env),
        start(CODA, ["cell", "table3", "--cell", "mnli-coda", "--smoke", "--", *quiet], env),
    ]
    outputs = [finish(p) for p in first]
    second = [
        start(CODA, ["cell", "table8", "--cell", "scitail-e_n", "--smoke", "--", *quiet], env),
        start(CODA, ["cell", "table8", "--cell", "dnli-none", "--smoke", "--", *quiet], env),
    ]
    outputs += [finish(p) for p in second]
    # W&B on (offline) for this one: CoDA's Figure 2 histograms
    outputs.append(run(CODA, ["grid", "table9", "--smoke", "--cells", "sigmoid-arctan"], env))
    assert "done snli-softmax seed 0" in outputs[0] and "done snli-coda seed 0" in outputs[0]
    runs = tmp_path / "runs" / "coda_nli"

    def config(group, cell):
        return yaml.safe_load((runs / group / f"{cell}-seed0" / "config.yaml").read_text())

    def metrics(group, cell):
        return last_values(runs / group / f"{cell}-seed0" / "metrics.csv")

    snli = config("table3-smoke", "snli-coda")
    assert snli["data"]["class_path"] == "datamodules.nli.SNLIDataModule"
    assert snli["data"]["init_args"]["max_train_examples"] == 128
    assert snli["model"]["attention"]["class_path"] == "attention.coda.coda"
    assert snli["model"]["hidden"] == 16  # the grid config's model settings

    # MultiNLI: its dataset config names the class and the sample folder, and nothing of
    # SNLI's remains; tested on dev matched (test/acc) and mismatched (test/acc_mismatched)
    m = config("table3-smoke", "mnli-coda")["data"]
    assert m["class_path"] == "datamodules.nli.MultiNLIDataModule"
    assert m["init_args"]["data_dir"].endswith(MNLI)
    assert m["init_args"]["train_file"] is None and m["init_args"]["max_train_examples"] is None
    values = metrics("table3-smoke", "mnli-coda")
    assert {"test/acc", "test/acc_mismatched", "test/loss_mismatched", "val/acc"} <= set(values)

    s = config("table8-smoke", "scitail-e_n")
    assert s["data"]["class_path"] == "datamodules.nli.SciTailDataModule"
    assert s["data"]["init_args"]["batch_size"] == 32 and s["data"]["init_args"]["format"] == "tsv"
    assert s["model"]["attention"]["init_args"]["center_e"] is True
    assert s["model"]["attention"]["init_args"]["gate"] == "centered"
    assert {"val/acc", "val/acc_best"} <= set(metrics("table8-smoke", "scitail-e_n"))

    d = config("table8-smoke", "dnli-none")
    assert d["data"]["class_path"] == "datamodules.nli.DialogueNLIDataModule"
    assert d["data"]["init_args"]["data_dir"] == "tests/fixtures/dialogue_nli"
    assert d["model"]["attention"]["init_args"]["center_e"] is False
    assert "val/acc_best" in metrics("table8-smoke", "dnli-none")

    t9 = config("table9-smoke", "sigmoid-arctan")
    assert t9["data"]["class_path"] == "datamodules.nli.SNLIDataModule"
    t9 = t9["model"]["attention"]["init_args"]
    assert (t9["e_fn"], t9["n_fn"]) == ("sigmoid", "arctan")
    wandb_run = list((runs / "table9-smoke" / "sigmoid-arctan-seed0" / "wandb").glob(
        "offline-run-*/run-*.wandb"))
    logged = history(wandb_run[0])
    for key in ("val/coda_hist_sigmoid(E)", "val/coda_hist_arctan(N)", "val/coda_hist_M"):
        assert logged[f"{key}/_type"][-1] == "histogram", key  # W&B flattens its fields
        assert sum(logged[f"{key}/values"][-1]) > 0, key
    assert len(logged["val/coda_hist_M/_type"]) == 2  # each validation after sanity checking

    report = run(CODA, ["report", "--smoke"], env)
    ours = 100 * values["test/acc"], 100 * values["test/acc_mismatched"]
    assert (f"| mnli-coda | 72.19 | {ours[0]:.2f} (n=1) | 72.45 | "
            f"{ours[1]:.2f} (n=1) |") in report, report
    assert "| scitail-e_n | 85.00 | " in report and "| dnli-none | 86.50 | " in report
    assert "| tanh-sigmoid | - | not run |" in report and "IWSLT" in report
    assert "| dnli-coda | 88.80 | not run | - | not run |" in report


def test_grids_match_the_papers():
    from experiments.coda_nli import EXPERIMENT as coda_nli
    from experiments.decomp_snli import EXPERIMENT as decomp_snli

    t1 = decomp_snli.grid("table1")
    assert [c.paper["Val acc"] for c in t1.cells] == [74.44, 62.06, 71.65, 66.01]
    t3 = coda_nli.grid("table3")
    assert {c.name: c.paper["Acc"] for c in t3.cells} == {
        "snli-softmax": 84.61, "snli-coda": 85.71, "mnli-softmax": 71.34, "mnli-coda": 72.19,
        "scitail-softmax": 82.0, "scitail-coda": 83.6, "dnli-softmax": 88.2, "dnli-coda": 88.8}
    assert t3.cell("mnli-softmax").paper["MNLI mm"] == 71.97
    assert "--model.attention=coda" not in t3.cell("dnli-softmax").args
    t8 = coda_nli.grid("table8")
    assert {c.name: c.paper["Dev acc"] for c in t8.cells} == {
        "scitail-none": 85.3, "scitail-e": 84.5, "scitail-e_n": 85.0,
        "dnli-none": 86.5, "dnli-e": 86.8, "dnli-e_n": 86.7}
    t9 = coda_nli.grid("table9")
    assert len(t9.cells) == 8 and all(c.paper["Dev acc"] is None for c in t9.cells)
    # every cell merges its dataset's config of the grid config (tests/experiments/test_all_grids.py
    # checks that those files exist)
    for grid in (t3, t8, t9):
        for c in grid.cells:
            name = "snli" if grid is t9 else c.name.split("-")[0]
            assert c.args[0] == f"--config={{config}}/{name}.yaml", c.args


def test_missing_dataset_files_name_what_to_get(env, tmp_path):
    args = ["fit", "--config", str(CODA_CONFIGS / "smoke.yaml"), "--config",
            str(CODA_CONFIGS / "smoke" / "dnli.yaml"),
            f"--data.data_dir={tmp_path / 'nothing'}", "--run.wandb=false"]
    p = subprocess.run([sys.executable, str(CODA), *args], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert "dialogue_nli_train.jsonl" in p.stderr and "wellecks.github.io" in p.stderr
