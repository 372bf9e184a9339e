"""Seeds mean seeds (issue 15): one seed (``seed_everything``) drives initialisation, dropout
and the batch order unless a data seed is set on its own, and the run records the data seed
it used."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml

from datamodules.common import data_seed
from datamodules.mlu import MLUDataModule
from lit_models.base import CPU_FEATURES, cpu_host
from tests.conftest import run

ROOT = Path(__file__).resolve().parents[2]


def test_data_seed_follows_the_run_seed_unless_given(monkeypatch):
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    assert data_seed(None) == 0 and data_seed(4) == 4
    L.seed_everything(5, verbose=False)
    assert data_seed(None) == 5 and data_seed(4) == 4


def first_batches(run_seed: int, **kwargs) -> tuple[list[list[int]], MLUDataModule]:
    L.seed_everything(run_seed, verbose=False)
    dm = MLUDataModule(train_size=64, val_size=8, test_size=8, batch_size=8, **kwargs)
    dm.setup()
    return [b["index"].tolist() for b in dm.train_dataloader()], dm


def test_the_batch_order_changes_with_the_run_seed_and_the_data_stays(monkeypatch):
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    one, dm1 = first_batches(1)
    two, dm2 = first_batches(2)
    assert one != two  # another run seed, another batch order
    assert (dm1.hparams.seed, dm2.hparams.seed) == (1, 2)  # recorded with the run
    assert dm1.datasets["train"].problems == dm2.datasets["train"].problems  # generator fixed
    fixed1, dm = first_batches(1, seed=7)
    fixed2, _ = first_batches(2, seed=7)
    assert fixed1 == fixed2 and dm.hparams.seed == 7  # an explicit data seed holds
    assert first_batches(1)[0] == one  # and the same seed gives the same order


@pytest.mark.slow
def test_a_run_logs_the_data_seed_of_its_run_seed(env, tmp_path):
    script = ROOT / "experiments" / "coda_mlu.py"
    config = ROOT / "experiments" / "configs" / "coda_mlu" / "smoke.yaml"
    run(script, ["fit", "--config", str(config), "--seed_everything", "3",
                 "--run.name", "seed3", "--trainer.max_steps", "2"], env)
    hparams = yaml.safe_load(next((tmp_path / "runs").rglob("seed3/hparams.yaml")).read_text())
    assert hparams["seed"] == 3 and hparams["generator_seed"] == 0


#: columns of metrics.csv that measure the machine, not the model
TIMING = {"train/steps_per_second", "train/wall_seconds", "train/peak_memory_mb",
          "train/step_memory_mb"}


def metric_rows(path: Path) -> list[dict]:
    with open(path) as f:
        return [{k: v for k, v in row.items() if k not in TIMING} for row in csv.DictReader(f)]


@pytest.mark.slow
def test_the_same_command_twice_gives_the_same_numbers(env, tmp_path):
    """Same config, seed and thread count (2): every logged number identical, with CoDA's
    compiled kernels and dropout; the run says it ran in deterministic mode and on how many
    threads."""
    script = ROOT / "experiments" / "coda_mlu.py"
    config = ROOT / "experiments" / "configs" / "coda_mlu" / "smoke.yaml"
    env = {**env, "ATTNREPRO_THREADS": "2"}
    for name in ("one", "two"):
        run(script, ["fit", "--config", str(config), "--model.attention", "coda",
                     "--model.dropout", "0.1", "--run.name", name, "--run.wandb", "false",
                     "--run.test_after_fit", "true"], env)
    group = tmp_path / "runs" / "coda_mlu" / "adhoc"
    one, two = (metric_rows(group / n / "metrics.csv") for n in ("one", "two"))
    assert one == two and any(r.get("test/exact_match") for r in one)
    hparams = yaml.safe_load((group / "one" / "hparams.yaml").read_text())
    assert hparams["machine/deterministic"] is True and hparams["machine/threads"] == 2
    # the host, so that a difference between machines can be traced (docs/reproducibility.md)
    assert hparams["machine/cpu_model"] == cpu_host()["machine/cpu_model"] != ""
    assert hparams["machine/cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert {f"machine/cpu_has_{f}" for f in CPU_FEATURES} <= set(hparams)


def test_cpu_host_reads_the_first_processors_model_and_features():
    text = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
            "flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile\n\n"
            "processor\t: 1\nmodel name\t: something else\nflags\t\t: fpu\n")
    host = cpu_host(text)
    assert host["machine/cpu_model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert [host[f"machine/cpu_has_{f}"] for f in CPU_FEATURES] == [True, True, True, True,
                                                                    False]
    no_flags = cpu_host("model name : AMD EPYC\n")
    assert no_flags["machine/cpu_model"] == "AMD EPYC"
    assert {no_flags[f"machine/cpu_has_{f}"] for f in CPU_FEATURES} == {"unknown"}


@pytest.mark.slow
def test_how_often_a_run_validates_does_not_change_its_training(env, tmp_path):
    """Validation between training steps draws nothing from the training's random streams:
    with dropout 0.1, validating every 5 steps or only at the end trains the same weights.
    Before the loaders drew their worker seeds from a generator of their own, each
    validation advanced torch's global generator and so the dropout masks after it (at
    172447e~1 the training loss at step 9 was 2.76587 against 2.76263): why `make demo`
    (validation every 500 steps) left the 20,000-step study (every 1,000) after step 2,000."""
    script = ROOT / "experiments" / "coda_mlu.py"
    config = ROOT / "experiments" / "configs" / "coda_mlu" / "smoke.yaml"
    for every in (5, 20):
        run(script, ["fit", "--config", str(config), "--model.dropout", "0.1",
                     "--trainer.val_check_interval", str(every), "--trainer.callbacks=[]",
                     "--run.name", f"every{every}", "--run.wandb", "false"], env)
    group = tmp_path / "runs" / "coda_mlu" / "adhoc"
    often, once = (torch.load(next((group / f"every{n}" / "checkpoints").glob("*.ckpt")),
                              weights_only=False)["state_dict"] for n in (5, 20))
    assert often.keys() == once.keys() and all(torch.equal(often[k], once[k]) for k in often)
    losses = [[r["train/loss"] for r in metric_rows(group / f"every{n}" / "metrics.csv")
               if r.get("train/loss")] for n in (5, 20)]
    assert losses[0] == losses[1] and len(losses[0]) == 4
