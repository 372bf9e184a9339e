"""Exact resume (issue 16): a run stopped at a mid-training checkpoint and resumed with
``--ckpt_path`` ends with the uninterrupted run's weights and metrics (batch order within the
epoch, dropout and the other random streams restored); a stopped grid cell rerun with
``--skip-done`` resumes from its latest checkpoint in the same folder, CSV log and W&B run."""

from __future__ import annotations

import csv
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from datamodules.common import BucketBatchSampler, bucketed_loader
from experiments.harness.launch import latest_checkpoint
from experiments.harness.loggers import AtomicMetricsWriter, metrics_before
from lit_models.base import random_states, set_random_states
from tests.conftest import last_values, run

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "coda_mlu.py"
SMOKE = ROOT / "experiments" / "configs" / "coda_mlu" / "smoke.yaml"


def test_the_sampler_skips_the_batches_taken_in_the_resumed_epoch_only():
    sampler = BucketBatchSampler([3, 1, 2, 5, 4, 6, 7, 8, 9, 1], batch_size=2, seed=5)
    sampler.set_epoch(1)
    full = list(sampler)
    sampler.resume(1, 3)
    assert list(sampler) == full[3:]
    assert list(sampler) == full  # once: the next pass is whole again
    sampler.resume(2, 1)
    assert list(sampler) == full  # another epoch's position does not apply to this one
    sampler.set_epoch(2)
    fresh = BucketBatchSampler([3, 1, 2, 5, 4, 6, 7, 8, 9, 1], batch_size=2, seed=5)
    fresh.set_epoch(2)
    assert list(sampler) == list(fresh)[1:] and list(fresh) != full


def test_the_loader_state_without_a_trainer_counts_the_batches_handed_out():
    loader = bucketed_loader(list(range(10)), [1] * 10, 3, lambda b: b, shuffle=True, seed=1)
    taken = iter(loader)
    first = [next(taken), next(taken)]
    assert loader.state_dict() == {"epoch": 0, "batches": 2}
    again = bucketed_loader(list(range(10)), [1] * 10, 3, lambda b: b, shuffle=True, seed=1)
    again.load_state_dict(loader.state_dict())
    assert list(again) == list(loader)[2:]
    assert first == list(loader)[:2]


def test_loading_a_loader_does_not_draw_from_the_global_random_stream():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    loader = bucketed_loader(list(range(10)), [1] * 10, 3, lambda b: b, shuffle=True, seed=1)
    list(loader)
    assert torch.equal(torch.rand(3), expected)


def test_random_states_round_trip_and_stay_weights_only_loadable(tmp_path):
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    states = random_states()
    torch.save({"rng_states": states}, tmp_path / "c.ckpt")
    loaded = torch.load(tmp_path / "c.ckpt", weights_only=True)["rng_states"]
    expected = (torch.rand(2), random.random(), np.random.rand())
    set_random_states(loaded)
    got = (torch.rand(2), random.random(), np.random.rand())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]


def test_a_resumed_runs_training_time_adds_the_time_before_its_checkpoint(monkeypatch):
    """train/wall_seconds of a run resumed after a stop covers the whole training (was: the
    last segment only, so a 100K-step cell resumed every session reported hours as minutes)."""
    from lit_models import base
    now = [100.0]
    monkeypatch.setattr(base.time, "perf_counter", lambda: now[0])
    first = base.AttnReproModule()
    first.on_train_start()
    now[0] = 160.0
    checkpoint = {}
    first.on_save_checkpoint(checkpoint)
    assert checkpoint["train_wall_seconds"] == 60.0
    now[0] = 170.0  # the run goes on after its checkpoint and is stopped: these 10 s are lost
    resumed = base.AttnReproModule()
    resumed.on_load_checkpoint(checkpoint)
    now[0] = 500.0
    resumed.on_train_start()
    now[0] = 530.0
    assert resumed.train_wall_seconds() == 90.0
    later = {}
    resumed.on_save_checkpoint(later)
    assert later["train_wall_seconds"] == 90.0
    fresh = base.AttnReproModule()
    fresh.on_load_checkpoint({"state_dict": {}})  # a checkpoint written before the key
    fresh.on_train_start()
    now[0] = 540.0
    assert fresh.train_wall_seconds() == 10.0


def test_metrics_before_keeps_the_rows_logged_before_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("epoch,step,train/loss,val/loss\n0,4,2.5,\n0,9,,2.4\n0,14,2.1,\n")
    assert metrics_before(path, 10) == [{"epoch": 0, "step": 4, "train/loss": 2.5},
                                        {"epoch": 0, "step": 9, "val/loss": 2.4}]
    assert metrics_before(tmp_path / "none.csv", 10) == []


def _log(writer, rows):
    for step, metrics in rows:
        writer.log_metrics(metrics, step)
        writer.save()


ROWS = [(4, {"train/loss": 2.5, "epoch": 0}), (9, {"val/loss": 2.4, "epoch": 0}),
        (14, {"train/loss": 2.125, "epoch": 1, "coda/gate": 0.5})]  # a new column at 14


def test_the_atomic_metrics_writer_writes_lightnings_bytes(tmp_path):
    from lightning.pytorch.loggers.csv_logs import ExperimentWriter

    _log(ExperimentWriter(str(tmp_path / "lightning")), ROWS)
    _log(AtomicMetricsWriter(str(tmp_path / "ours")), ROWS)
    ours = (tmp_path / "ours" / "metrics.csv").read_bytes()
    assert ours == (tmp_path / "lightning" / "metrics.csv").read_bytes()
    assert ours.count(b"\r\n") == 4 and b"coda/gate" in ours.split(b"\r\n")[0]


def test_a_save_stopped_midway_leaves_the_previous_file(tmp_path, monkeypatch):
    import os

    writer = AtomicMetricsWriter(str(tmp_path))
    _log(writer, ROWS[:2])
    before = (tmp_path / "metrics.csv").read_bytes()

    def stopped(*args):
        raise KeyboardInterrupt  # what a signal raised during the save does

    monkeypatch.setattr(os, "replace", stopped)
    with pytest.raises(KeyboardInterrupt):
        _log(writer, ROWS[2:])
    assert (tmp_path / "metrics.csv").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.csv"]  # no temporary left


def test_a_resumed_writer_keeps_the_earlier_file_until_it_saves_them_with_the_new_rows(
        tmp_path):
    _log(AtomicMetricsWriter(str(tmp_path / "full")), ROWS)
    path = tmp_path / "run" / "metrics.csv"
    path.parent.mkdir()
    path.write_bytes((tmp_path / "full" / "metrics.csv").read_bytes())
    writer = AtomicMetricsWriter(str(path.parent), metrics_before(path, 10))
    assert path.read_bytes() == (tmp_path / "full" / "metrics.csv").read_bytes()  # kept
    _log(writer, ROWS[2:])
    assert path.read_bytes() == (tmp_path / "full" / "metrics.csv").read_bytes()
    with pytest.warns(UserWarning, match="will be deleted"):  # a new run: Lightning's way
        fresh = AtomicMetricsWriter(str(path.parent))
    assert not path.exists() and fresh.rows == []


def test_latest_checkpoint_prefers_last_then_the_highest_step(tmp_path):
    folder = tmp_path / "run" / "checkpoints"
    assert latest_checkpoint(tmp_path / "run") is None
    folder.mkdir(parents=True)
    (tmp_path / "run" / "metrics.csv").write_text("epoch,step,train/loss\n1,124,2.5\n")
    for name in ("epoch=0-step=10.ckpt", "epoch=1-step=120.ckpt", "epoch=0-step=90.ckpt"):
        torch.save({"global_step": int(name[:-5].rsplit("=", 1)[1])}, folder / name)
    assert latest_checkpoint(tmp_path / "run").name == "epoch=1-step=120.ckpt"
    torch.save({"global_step": 120}, folder / "last.ckpt")
    assert latest_checkpoint(tmp_path / "run").name == "last.ckpt"


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]


def val_losses(path: Path) -> dict[int, str]:
    with open(path) as f:
        return {int(r["step"]): r["val/loss"] for r in csv.DictReader(f) if r.get("val/loss")}


@pytest.mark.slow
@pytest.mark.parametrize("train_size", [640, 256], ids=["mid-first-epoch", "in-second-epoch"])
def test_a_resumed_fit_ends_where_the_uninterrupted_one_does(env, tmp_path, train_size):
    """Dropout 0.1; the checkpoint at step 10 is in the middle of the first epoch (20 batches)
    or two batches into the second (8 batches per epoch)."""
    common = ["fit", "--config", str(SMOKE), "--model.dropout", "0.1", "--run.wandb", "false",
              f"--data.train_size={train_size}", "--run.test_after_fit", "true"]
    run(SCRIPT, [*common, "--run.name", "full"], env)
    group = tmp_path / "runs" / "coda_mlu" / "adhoc"
    run(SCRIPT, [*common, "--run.name", "resumed",
                 f"--ckpt_path={group / 'full' / 'checkpoints' / 'epoch=0-step=10.ckpt'}"
                 if train_size == 640 else
                 f"--ckpt_path={group / 'full' / 'checkpoints' / 'epoch=1-step=10.ckpt'}"], env)
    full, resumed = (weights(group / n / "checkpoints" / "last.ckpt") for n in ("full", "resumed"))
    assert all(torch.equal(full[k], resumed[k]) for k in full)
    assert val_losses(group / "resumed" / "metrics.csv")[19] == \
        val_losses(group / "full" / "metrics.csv")[19]
    assert last_values(group / "resumed" / "metrics.csv")["test/exact_match"] == \
        last_values(group / "full" / "metrics.csv")["test/exact_match"]


@pytest.mark.slow
def test_grid_skip_done_resumes_a_stopped_cell_in_its_folder_and_wandb_run(env, tmp_path):
    args = ["grid", "table6", "--smoke", "--cells", "transformer", "--", "--model.dropout=0.1"]
    run(SCRIPT, args, env)
    group = tmp_path / "runs" / "coda_mlu" / "table6-smoke"
    cell = group / "transformer-seed0"
    reference = tmp_path / "reference"
    shutil.copytree(cell, reference)
    # the run as a stop after step 10 leaves it: its first checkpoint, the first rows
    for path in (cell / "checkpoints").iterdir():
        if path.name != "epoch=0-step=10.ckpt":
            path.unlink()
    rows = metrics_before(reference / "metrics.csv", 10)
    keys = sorted({k for r in rows for k in r})
    with open(cell / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    (first_wandb,) = [d.name for d in (cell / "wandb").glob("offline-run-*")]
    out = run(SCRIPT, ["grid", "table6", "--smoke", "--skip-done", "--cells", "transformer",
                       "--", "--model.dropout=0.1"], env)
    assert "resuming transformer seed 0 from epoch=0-step=10.ckpt (stopped before)" in out
    assert "done transformer seed 0" in out
    assert "[grid] resumed from" in (cell / "output.log").read_text()
    ours, theirs = weights(cell / "checkpoints" / "last.ckpt"), \
        weights(reference / "checkpoints" / "last.ckpt")
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert val_losses(cell / "metrics.csv") == val_losses(reference / "metrics.csv")  # both
    assert last_values(cell / "metrics.csv")["test/exact_match"] == \
        last_values(reference / "metrics.csv")["test/exact_match"]
    # the same W&B run id, resumed (offline: a second folder of that id)
    run_id = first_wandb.rsplit("-", 1)[1]
    assert sorted(d.name.rsplit("-", 1)[1] for d in (cell / "wandb").glob("offline-run-*")) \
        == [run_id, run_id]
