"""Checkpoint averaging (lit_models/averaging.py): the mean of hand-made state dicts, the last
N checkpoints chosen by training step, an averaged Lightning checkpoint that loads into the
suite's TransformerSeq2Seq, the command line, and the runner's ``--run.average_last`` end to
end on CoDA Table 6's smoke config."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import yaml
from torch import nn

from experiments.harness.cli import check_average_last
from fileio import checkpoint_step
from lit_models.averaging import (
    average_checkpoints,
    average_state_dicts,
    last_checkpoints,
    load_checkpoint,
    main,
)
from lit_models.transformer import TransformerSeq2Seq
from tests.conftest import last_values, run
from tests.wandb_records import config as wandb_config

ROOT = Path(__file__).resolve().parents[2]


# -- average_state_dicts -----------------------------------------------------------------------
def module_with(weight: list[float], bias: float, batches: int) -> nn.Module:
    """A linear layer and a batch norm whose values are set by hand; the batch norm's
    ``num_batches_tracked`` is an integer counter."""
    m = nn.Sequential(nn.Linear(3, 1), nn.BatchNorm1d(1))
    with torch.no_grad():
        m[0].weight.copy_(torch.tensor([weight]))
        m[0].bias.fill_(bias)
        m[1].running_mean.fill_(bias * 2)
    m[1].num_batches_tracked.fill_(batches)
    return m


def test_average_is_the_elementwise_mean_and_integers_come_from_the_last():
    states = [module_with([1.0, -2.0, 0.25], 0.5, 10).state_dict(),
              module_with([3.0, 2.0, 0.75], 1.5, 20).state_dict(),
              module_with([5.0, 6.0, 0.5], 4.0, 30).state_dict()]
    avg = average_state_dicts(states)
    assert list(avg) == list(states[0])
    assert avg["0.weight"].tolist() == [[3.0, 2.0, 0.5]]
    assert avg["0.bias"].tolist() == [2.0]
    assert avg["1.running_mean"].tolist() == [4.0]
    assert avg["1.running_var"].tolist() == [1.0]
    # a mean of step counters is not a counter: the last checkpoint's, unchanged
    assert avg["1.num_batches_tracked"].item() == 30
    assert avg["1.num_batches_tracked"].dtype == torch.long
    assert all(avg[k].dtype == states[0][k].dtype for k in avg)
    # the inputs are not modified
    assert states[0]["0.weight"].tolist() == [[1.0, -2.0, 0.25]]


def test_average_keeps_half_precision_and_sums_without_overflow():
    # 60032 + 62016 overflows float16 (max 65504): the sum is kept in float64
    a = torch.tensor([1.0, 60032.0], dtype=torch.float16)
    b = torch.tensor([2.0, 62016.0], dtype=torch.float16)
    assert torch.isinf(a + b).any()
    avg = average_state_dicts([{"w": a}, {"w": b}])["w"]
    assert avg.dtype == torch.float16 and avg.tolist() == [1.5, 61024.0]


def test_average_of_one_is_itself_and_of_none_is_an_error():
    state = module_with([1.0, 2.0, 3.0], 0.5, 1).state_dict()
    assert all(torch.equal(v, state[k]) for k, v in average_state_dicts([state]).items())
    with pytest.raises(ValueError, match="no state dicts"):
        average_state_dicts([])


def test_different_keys_or_shapes_are_errors_naming_the_files():
    a = {"w": torch.zeros(2), "b": torch.zeros(1)}
    with pytest.raises(ValueError, match=r"a\.ckpt and b\.ckpt: their keys differ "
                                         r"\(only in a\.ckpt: b; only in b\.ckpt: v\)"):
        average_state_dicts([a, {"w": torch.zeros(2), "v": torch.zeros(1)}],
                            names=["a.ckpt", "b.ckpt"])
    with pytest.raises(ValueError, match=r"a\.ckpt and c\.ckpt: 'w' is \(2,\) torch.float32 "
                                         r"in the first and \(3,\) torch.float32"):
        average_state_dicts([a, {"w": torch.zeros(2), "b": torch.zeros(1)},
                             {"w": torch.zeros(3), "b": torch.zeros(1)}],
                            names=["a.ckpt", "b.ckpt", "c.ckpt"])


# -- last_checkpoints --------------------------------------------------------------------------
def touch(folder: Path, names: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        (folder / name).write_bytes(b"")
        os.utime(folder / name, (1_000_000 + i, 1_000_000 + i))  # later in the list = newer


def test_last_checkpoints_are_chosen_by_step_not_by_name_or_time(tmp_path):
    folder = tmp_path / "run" / "checkpoints"
    # newest file step=10 (a copy made last), name order puts step=100 before step=20
    touch(folder, ["epoch=1-step=100.ckpt", "epoch=0-step=20.ckpt", "last.ckpt",
                   "averaged-last2.ckpt", "epoch=0-step=10.ckpt"])
    assert [p.name for p in last_checkpoints(folder, 2)] == ["epoch=0-step=20.ckpt",
                                                             "epoch=1-step=100.ckpt"]
    # the run folder holding checkpoints/ works too
    assert last_checkpoints(tmp_path / "run", 3) == [folder / "epoch=0-step=10.ckpt",
                                                     folder / "epoch=0-step=20.ckpt",
                                                     folder / "epoch=1-step=100.ckpt"]
    assert [checkpoint_step(Path(n)) for n in ("epoch=2-step=7-v1.ckpt", "step=5.ckpt",
                                               "last.ckpt", "last-v1.ckpt")] == [7, 5, None, None]


def test_too_few_checkpoints_is_an_error_naming_the_folder_and_what_it_holds(tmp_path):
    folder = tmp_path / "checkpoints"
    touch(folder, ["epoch=0-step=10.ckpt", "last.ckpt"])
    with pytest.raises(FileNotFoundError) as e:
        last_checkpoints(folder, 2)
    message = str(e.value)
    assert f"last 2 checkpoints of {folder}: it holds 1 checkpoint(s)" in message
    assert "found: epoch=0-step=10.ckpt, last.ckpt" in message
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"holds 0 checkpoint\(s\).*found: no \.ckpt"):
        last_checkpoints(tmp_path / "empty", 1)
    with pytest.raises(FileNotFoundError, match="no checkpoint folder"):
        last_checkpoints(tmp_path / "nowhere", 1)
    with pytest.raises(ValueError, match="at least 1"):
        last_checkpoints(folder, 0)


def test_two_checkpoints_of_one_chosen_step_are_an_error(tmp_path):
    """Two runs in one folder (Lightning's -v1 names): ambiguous only among the chosen."""
    touch(tmp_path, ["epoch=0-step=10.ckpt", "epoch=0-step=10-v1.ckpt", "epoch=0-step=20.ckpt"])
    assert [p.name for p in last_checkpoints(tmp_path, 1)] == ["epoch=0-step=20.ckpt"]
    with pytest.raises(ValueError, match=r"2 checkpoints of step 10 \(epoch=0-step=10-v1.ckpt, "
                                         r"epoch=0-step=10.ckpt\)"):
        last_checkpoints(tmp_path, 2)


# -- a Lightning checkpoint of the suite's TransformerSeq2Seq ----------------------------------
def tiny_model(seed: int) -> TransformerSeq2Seq:
    torch.manual_seed(seed)
    return TransformerSeq2Seq(src_vocab_size=11, tgt_vocab_size=13, d_model=8, n_heads=2,
                              d_ff=16, n_encoder_layers=1, n_decoder_layers=1, dropout=0.0,
                              max_decode_len=7)


def save_checkpoints(folder: Path, steps: list[int]) -> list[Path]:
    """Lightning checkpoints (Trainer.save_checkpoint) of differently initialised tiny
    models, named and stamped as ModelCheckpoint would at these steps."""
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1)
    paths = []
    for i, step in enumerate(steps):
        trainer.strategy.connect(tiny_model(seed=i))
        path = folder / f"epoch=0-step={step}.ckpt"
        trainer.save_checkpoint(path)
        checkpoint = load_checkpoint(path)
        checkpoint["global_step"] = step
        checkpoint["optimizer_states"] = [{"state": {}, "param_groups": []}]
        torch.save(checkpoint, path)
        paths.append(path)
    return paths


def test_averaged_checkpoint_loads_and_holds_the_mean(tmp_path):
    paths = save_checkpoints(tmp_path / "checkpoints", [10, 20, 30])
    states = [load_checkpoint(p)["state_dict"] for p in paths]
    out = tmp_path / "averaged.ckpt"
    checkpoint = average_checkpoints(paths, out)
    assert checkpoint["global_step"] == 30 and checkpoint["averaged_checkpoints"] == list(
        map(str, paths))
    assert "optimizer_states" not in checkpoint and "lr_schedulers" not in checkpoint

    model = TransformerSeq2Seq.load_from_checkpoint(out, weights_only=False)
    assert model.hparams.max_decode_len == 7 and model.hparams.d_model == 8
    loaded = model.state_dict()
    assert set(loaded) == set(states[0])
    for key, value in loaded.items():
        expected = (states[0][key] + states[1][key] + states[2][key]) / 3
        torch.testing.assert_close(value, expected, msg=key)
    # the checkpoints differ, so the mean is not the last of them
    assert any(not torch.equal(v, states[2][k]) for k, v in loaded.items())


def test_command_line_averages_the_last_n_of_a_folder_or_the_files_given(tmp_path, capsys):
    folder = tmp_path / "run" / "checkpoints"
    paths = save_checkpoints(folder, [100, 20, 10])
    main([str(tmp_path / "run"), "--last", "2"])
    out = capsys.readouterr().out
    assert f"averaged 2 checkpoints: {paths[1]}, {paths[0]}" in out
    assert f"wrote {folder / 'averaged-last2.ckpt'}" in out
    written = load_checkpoint(folder / "averaged-last2.ckpt")
    assert written["averaged_checkpoints"] == [str(paths[1]), str(paths[0])]

    main([str(paths[2]), str(paths[1]), "--out", str(tmp_path / "two.ckpt")])
    two = load_checkpoint(tmp_path / "two.ckpt")["state_dict"]
    first, second = (load_checkpoint(p)["state_dict"] for p in (paths[2], paths[1]))
    for k, v in two.items():
        torch.testing.assert_close(v, (first[k] + second[k]) / 2)

    with pytest.raises(SystemExit, match="cannot average the last 4 checkpoints"):
        main([str(folder), "--last", "4"])
    with pytest.raises(SystemExit, match="no such checkpoint"):
        main([str(tmp_path / "missing.ckpt"), "--out", str(tmp_path / "x.ckpt")])


# -- the runner option -------------------------------------------------------------------------
def test_average_last_needs_every_checkpoint_kept_and_no_test_ckpt():
    kept = SimpleNamespace(checkpoint_callback=SimpleNamespace(save_top_k=-1))
    check_average_last(kept, SimpleNamespace(average_last=None, test_ckpt="best"))
    check_average_last(kept, SimpleNamespace(average_last=5, test_ckpt=None))
    with pytest.raises(SystemExit, match="cannot go with --run.test_ckpt best"):
        check_average_last(kept, SimpleNamespace(average_last=5, test_ckpt="best"))
    best = SimpleNamespace(checkpoint_callback=SimpleNamespace(save_top_k=1))
    with pytest.raises(SystemExit, match="save_top_k: -1.*found: save_top_k 1"):
        check_average_last(best, SimpleNamespace(average_last=5, test_ckpt=None))
    with pytest.raises(SystemExit, match="found: none"):
        check_average_last(SimpleNamespace(checkpoint_callback=None),
                           SimpleNamespace(average_last=2, test_ckpt=None))


@pytest.mark.slow
def test_fit_averages_the_last_two_checkpoints_and_tests_on_the_average(env, tmp_path):
    script = ROOT / "experiments" / "coda_mlu.py"
    smoke = ROOT / "experiments" / "configs" / "coda_mlu" / "smoke.yaml"
    out = run(script, ["fit", "--config", str(smoke), "--run.group", "avg", "--run.name", "two",
                       "--run.test_after_fit", "true", "--run.average_last", "2"], env)
    run_dir = tmp_path / "runs" / "coda_mlu" / "avg" / "two"
    folder = run_dir / "checkpoints"
    averaged = folder / "averaged-last2.ckpt"
    # smoke.yaml: 20 steps, a checkpoint every 10 (and last.ckpt, ignored)
    assert (f"averaged the last 2 checkpoints of {folder}: epoch=0-step=10.ckpt, "
            "epoch=0-step=20.ckpt -> averaged-last2.ckpt") in out
    assert f"Restoring states from the checkpoint path at {averaged}" in out

    checkpoint = load_checkpoint(averaged)
    assert checkpoint["averaged_checkpoints"] == [str(folder / "epoch=0-step=10.ckpt"),
                                                  str(folder / "epoch=0-step=20.ckpt")]
    a, b = (load_checkpoint(folder / f"epoch=0-step={s}.ckpt")["state_dict"] for s in (10, 20))
    assert any(not torch.equal(a[k], b[k]) for k in a)
    for k, v in checkpoint["state_dict"].items():
        torch.testing.assert_close(v, (a[k] + b[k]) / 2 if v.is_floating_point() else b[k])

    values = last_values(run_dir / "metrics.csv")
    assert 0.0 <= values["test/exact_match"] <= 1.0 and values["test/loss"] > 0
    names = ["epoch=0-step=10.ckpt", "epoch=0-step=20.ckpt"]
    assert yaml.safe_load((run_dir / "hparams.yaml").read_text())["averaged_checkpoints"] == names
    runs = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and wandb_config(runs[0])["averaged_checkpoints"] == names
