"""The command contract end to end on CoDA Table 6's smoke config: fit with W&B offline and
CSV logs, a checkpoint in the middle of training, a local grid, the W&B sweep YAML (and
the command a sweep agent would run), and the report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import last_values, read_jsonl, run
from tests.wandb_records import history

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "coda_mlu.py"
SMOKE = ROOT / "experiments" / "configs" / "coda_mlu" / "smoke.yaml"

pytestmark = pytest.mark.slow


def test_fit_logs_to_csv_and_offline_wandb_with_a_mid_training_checkpoint(env, tmp_path):
    run(SCRIPT, ["fit", "--config", str(SMOKE), "--model.attention", "coda",
                 "--model.attention.gate", "centered", "--run.group", "e2e", "--run.name", "one",
                 "--run.test_after_fit", "true"], env)
    run_dir = tmp_path / "runs" / "coda_mlu" / "e2e" / "one"
    csv_values = last_values(run_dir / "metrics.csv")
    assert {"train/loss", "val/exact_match", "test/exact_match"} <= set(csv_values)
    assert csv_values["train/steps_per_second"] > 0  # DW Table 4's speed, every run
    assert csv_values["train/wall_seconds"] > 0 and csv_values["train/peak_memory_mb"] > 50
    # the training loop's own peak (Linux): above zero, below the process's
    assert 0 < csv_values["train/step_memory_mb"] < csv_values["train/peak_memory_mb"]
    # max_steps 20 in the smoke config: a checkpoint from the middle, not only the end
    assert (run_dir / "checkpoints" / "epoch=0-step=10.ckpt").exists()
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["model"]["attention"]["class_path"].endswith("coda")
    assert config["model"]["attention"]["init_args"]["gate"] == "centered"
    runs = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, "the W&B run must be offline without an API key"
    logged = history(runs[0])
    assert logged["test/exact_match"][-1] == pytest.approx(csv_values["test/exact_match"])
    assert len(logged["train/loss"]) >= 2
    # every test example's prediction: the logged exact match recomputed from the file
    rows = read_jsonl(run_dir / "predictions-test.jsonl")
    assert [r["id"] for r in rows] == list(range(len(rows))) and len(rows) == 64
    assert set(rows[0]) == {"id", "source", "prediction", "gold", "correct", "score"}
    assert all(isinstance(r["gold"], str) and r["gold"] for r in rows)  # decoded answers
    assert all(isinstance(r["source"], str) and r["source"] for r in rows)  # the problems
    assert all(r["correct"] == (r["prediction"] == r["gold"]) for r in rows)
    assert sum(r["correct"] for r in rows) / len(rows) == \
        pytest.approx(csv_values["test/exact_match"])


def test_grid_sweep_and_report(env, tmp_path):
    out = run(SCRIPT, ["grid", "table6", "--smoke", "--jobs", "2"], env)
    assert "done transformer seed 0" in out and "done coda seed 0" in out
    group = tmp_path / "runs" / "coda_mlu" / "table6-smoke"
    ours = {c: last_values(group / f"{c}-seed0" / "metrics.csv")["test/exact_match"]
            for c in ("transformer", "coda")}

    sweep_path = tmp_path / "sweep.yaml"
    run(SCRIPT, ["sweep", "table6", "--smoke", "--seeds", "2", "--output", str(sweep_path)], env)
    sweep = yaml.safe_load(sweep_path.read_text())
    assert sweep["method"] == "grid"
    assert sweep["parameters"] == {"cell": {"values": ["transformer", "coda"]},
                                   "seed": {"values": [0, 1]}}
    # what a sweep agent runs: the command with ${args} expanded to --key=value pairs
    expand = {"${env}": "/usr/bin/env", "${interpreter}": sys.executable,
              "${program}": str(ROOT / sweep["program"])}
    cmd = []
    for part in sweep["command"]:
        cmd += ["--cell=coda", "--seed=1"] if part == "${args}" else [expand.get(part, part)]
    p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert (group / "coda-seed1" / "metrics.csv").exists()

    # --skip-done keeps the three finished runs and launches only the missing one
    out = run(SCRIPT, ["grid", "table6", "--smoke", "--seeds", "2", "--skip-done", "--dry-run"],
              env)
    assert out.count("kept ") == 3 and "kept coda seed 1" in out
    launched = [line for line in out.splitlines() if " fit " in line]
    assert len(launched) == 1 and "--run.name=transformer-seed1" in launched[0]

    report = run(SCRIPT, ["report", "table6", "--smoke"], env)
    assert "| transformer | 76.10 | " + f"{100 * ours['transformer']:.2f} (n=1) |" in report
    coda_seeds = [100 * ours["coda"],
                  100 * last_values(group / "coda-seed1" / "metrics.csv")["test/exact_match"]]
    mean = sum(coda_seeds) / 2
    assert f"| coda | 84.30 | {mean:.2f} ± " in report and "(n=2)" in report


def test_unknown_grid_and_cell_are_clear_errors(env):
    p = subprocess.run([sys.executable, str(SCRIPT), "grid", "table99"], env=env, cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode != 0 and "no grid 'table99'; grids: table6" in p.stderr
    p = subprocess.run([sys.executable, str(SCRIPT), "cell", "table6", "--cell", "nope"],
                       env=env, cwd=ROOT, capture_output=True, text=True)
    assert p.returncode != 0 and "no cell 'nope'" in p.stderr


def test_ddp_on_cpu_in_a_subprocess(env, tmp_path):
    """Lightning DDP (gloo) with two processes runs to the end through fit and test (the
    sharding of the batches itself is tested in tests/datamodules/test_common.py)."""
    out = run(SCRIPT, ["fit", "--config", str(SMOKE), "--trainer.strategy=ddp",
                       "--trainer.devices=2", "--trainer.accelerator=cpu", "--run.group=ddp",
                       "--run.name=two", "--run.wandb=false", "--run.test_after_fit=true"], env)
    assert "Starting with 2 processes" in out
    values = last_values(tmp_path / "runs" / "coda_mlu" / "ddp" / "two" / "metrics.csv")
    assert 0.0 <= values["test/exact_match"] <= 1.0 and values["test/loss"] > 0


def test_learning_curves_from_written_logs(tmp_path, monkeypatch):
    """``report --curve`` and experiments/harness/curves.py on CSV logs written here: the mean over
    seeds per step, optimiser steps counted from Lightning's logged step + 1."""
    from experiments import coda_mlu
    from experiments.harness import curves
    from experiments.harness.report import format_curves

    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path / "runs"))
    root = tmp_path / "runs" / "coda_mlu" / "table6-demo"
    logs = {"transformer-seed0": [(999, 0.10), (1999, 0.30)],
            "transformer-seed1": [(999, 0.20), (1999, 0.40)],
            "coda-seed0": [(999, 0.15)]}
    for run_name, values in logs.items():
        (root / run_name).mkdir(parents=True)
        lines = ["step,train/loss,val/exact_match"] + [f"{s},1.0," for s, _ in values] + [
            f"{s},,{v}" for s, v in values]
        (root / run_name / "metrics.csv").write_text("\n".join(lines) + "\n")
    grid = coda_mlu.EXPERIMENT.grid("table6")
    table = format_curves(coda_mlu.EXPERIMENT, grid, "demo")
    assert table.splitlines()[3:] == ["| step | transformer | coda |", "|---|---|---|",
                                      "| 1000 | 15.00 (n=2) | 15.00 |",
                                      "| 2000 | 35.00 (n=2) | - |"]
    curves.main(["coda_mlu", "table6", "--config", "demo", "--out", str(tmp_path / "c")])
    assert (tmp_path / "c.csv").read_text().splitlines() == [
        "step,transformer,coda", "1000,15.00,15.00", "2000,35.00,"]
    md = (tmp_path / "c.md").read_text()
    assert (tmp_path / "c.png").stat().st_size > 0 and "| 2000 |" in md and "not run" in md


def test_report_reads_hyperparameters_and_scales_each_column(tmp_path, monkeypatch):
    """A grid column may read the run's hparams.yaml (``hparams/n_parameters``, as DW Table 4)
    and have a scale of its own (parameters in millions beside steps/s as logged)."""
    from experiments.harness.grid_model import Cell, Experiment, Grid
    from experiments.harness.report import format_report

    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path / "runs"))
    grid = Grid("t4", "speed", {"Params (M)": "hparams/n_parameters",
                                "Steps/s": "train/steps_per_second"},
                [Cell("base", [], {"Params (M)": 63, "Steps/s": 1.2}), Cell("ours")],
                scale=1.0, scales={"Params (M)": 1e-6}, relative_to={"Steps/s": "base"})
    experiment = Experiment("x", object, object, {"t4": grid})
    monkeypatch.setattr(Experiment, "config_path", lambda self, c: SMOKE)
    run_dir = tmp_path / "runs" / "x" / "t4-smoke" / "base-seed0"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.csv").write_text("step,train/steps_per_second\n4,2.0\n9,2.5\n")
    (run_dir / "hparams.yaml").write_text("n_parameters: 60915712\nmodel: {d_model: 512}\n")
    rows = format_report(experiment, grid, "smoke").splitlines()
    assert "| base | 63.00 | 60.92 (n=1) | 1.20 | 2.50 (n=1) | 1.00x | 1.00x | - | - |" in rows
    assert "| ours | - | not run | - | not run | - | - | - | - |" in rows
    ours = tmp_path / "runs" / "x" / "t4-smoke" / "ours-seed0"
    ours.mkdir()
    (ours / "metrics.csv").write_text("step,train/steps_per_second\n9,2.0\n")
    rows = format_report(experiment, grid, "smoke").splitlines()
    # a grid without test metrics: a run has ended when it holds every one of them
    assert "| ours | - | not run (1 unfinished) | - | not run (1 unfinished) | - | - | - | - |" \
        in rows
    (ours / "hparams.yaml").write_text("n_parameters: 1000000\n")
    rows = format_report(experiment, grid, "smoke").splitlines()
    assert "| ours | - | 1.00 (n=1) | - | 2.00 (n=1) | - | 0.80x | - | - |" in rows


def test_wandb_disabled_writes_nothing(env, tmp_path):
    """WANDB_MODE=disabled: the run trains and logs its CSV, and no W&B file is written."""
    env = dict(env, WANDB_MODE="disabled")
    run(SCRIPT, ["fit", "--config", str(SMOKE), "--trainer.max_steps", "4",
                 "--trainer.log_every_n_steps", "2", "--run.group", "off", "--run.name", "one"],
        env)
    run_dir = tmp_path / "runs" / "coda_mlu" / "off" / "one"
    assert last_values(run_dir / "metrics.csv")["train/loss"] > 0
    written = [p for p in tmp_path.rglob("*") if "wandb" in p.name.lower()]
    assert not written, written


def test_wandb_never_waits_for_the_network(monkeypatch, tmp_path, capsys):
    """Online only with an API key for the W&B server and a server that answers; else
    offline, said once; an explicit WANDB_MODE is kept; no key: no connection is tried."""
    from experiments.harness import loggers

    reachable = loggers._reachable
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no ~/.config/wandb/settings
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_CONFIG_DIR", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(loggers, "_WARNED_OFFLINE", [])
    asked: list[str] = []

    def never(url, timeout=3.0):
        raise AssertionError("no key: no connection should be tried")

    monkeypatch.setattr(loggers, "_reachable", never)
    assert loggers.wandb_mode() == "offline"
    # the server W&B would use: its default, the host `wandb login --host` saved, the variable
    default = loggers.wandb_host()
    assert default.startswith("https://api.")
    settings = tmp_path / ".config" / "wandb" / "settings"
    settings.parent.mkdir(parents=True)
    settings.write_text("[default]\nbase_url = http://wandb.example:8080\n")
    assert loggers.wandb_host() == "http://wandb.example:8080"
    monkeypatch.setenv("WANDB_BASE_URL", "http://wandb.test:8081")
    assert loggers.wandb_host() == "http://wandb.test:8081"

    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setattr(loggers, "_reachable", lambda url, timeout=3.0: asked.append(url))
    assert loggers.wandb_mode() == "offline" and loggers.wandb_mode() == "offline"
    assert asked == ["http://wandb.test:8081"] * 2
    assert capsys.readouterr().err.splitlines() == [
        "W&B: http://wandb.test:8081 is not reachable: logging offline under the run folder "
        "(upload later with `wandb sync`)"]
    monkeypatch.setattr(loggers, "_reachable", lambda url, timeout=3.0: True)
    assert loggers.wandb_mode() == "online"
    # a key saved by `wandb login` in ~/.netrc counts for its own host only
    monkeypatch.delenv("WANDB_API_KEY")
    (tmp_path / ".netrc").write_text("machine wandb.test\n  login user\n  password " + "k" * 40
                                     + "\n")
    assert loggers.wandb_mode() == "online"
    monkeypatch.setenv("WANDB_BASE_URL", "http://other.test:8081")
    monkeypatch.setattr(loggers, "_reachable", never)
    assert loggers.wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert loggers.wandb_mode() == "disabled"
    # the check itself: a closed local port answers at once, unreachable
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    assert reachable(f"http://127.0.0.1:{port}", timeout=2.0) is False
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        assert reachable(f"http://127.0.0.1:{server.getsockname()[1]}") is True
