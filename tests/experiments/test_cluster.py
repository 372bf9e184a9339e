"""The cluster launchers (experiments/cluster/): a grid cell started by srun (Lightning's SLURM
environment) or torchrun (its TorchElastic environment) on two CPU processes forms one run
whose validation metrics equal a single process's.  srun is stood in for by a script that
starts the tasks with the variables srun sets; torchrun is the real one.  As in
tests/end_to_end/test_ddp_eval.py, the processes run outside pytest's."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT, last_values

pytestmark = pytest.mark.slow

LAUNCH = ROOT / "experiments" / "cluster"
CELL = ["coda_mlu", "table6", "coda", "0", "smoke", "--", "--trainer.limit_val_batches=1.0"]
KEYS = ("val/loss", "val/exact_match")

#: what srun gives each task of `--nodes=1 --ntasks-per-node=2` (the task's own three below)
FAKE_SRUN = """#!/usr/bin/env bash
while [[ $1 == --* ]]; do shift; done  # srun's own options
pids=()
for ((i = 0; i < SLURM_NTASKS; i++)); do
    SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_NODEID=0 "$@" & pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(command: list[str], env: dict, runs) -> tuple[str, dict[str, float]]:
    env = {**env, "ATTNREPRO_RUNS": str(runs), "ATTNREPRO_COMPILE": "0",
           "WANDB_MODE": "disabled", "ACCELERATOR": "cpu", "SUBCOMMAND": "validate"}
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    folders = sorted(p.parent for p in runs.rglob("metrics.csv"))
    assert [f.relative_to(runs).as_posix() for f in folders] == \
        ["coda_mlu/table6-smoke/coda-seed0"], out[-3000:]  # one run, the grid's cell folder
    return out, last_values(folders[0] / "metrics.csv")


def test_srun_and_torchrun_form_one_run_with_the_metrics_of_one_process(env, tmp_path):
    env = {**env, "ATTNREPRO_PYTHON": sys.executable}
    words = subprocess.run([str(LAUNCH / "cell_command"), *CELL], cwd=ROOT, capture_output=True,
                           text=True, env={**env, "SUBCOMMAND": "validate"},
                           check=True).stdout.splitlines()
    assert words[2] == "validate" and "--run.name=coda-seed0" in words
    _, one = launch([*words, "--trainer.accelerator=cpu", "--trainer.devices=1"], env,
                    tmp_path / "one")

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    slurm = {**env, "PATH": f"{bin_dir}:{env['PATH']}", "SLURM_NTASKS": "2",
             "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1",
             "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "attnrepro",
             "SLURM_NODELIST": "127.0.0.1", "MASTER_PORT": str(free_port())}
    out, two = launch(["bash", str(LAUNCH / "slurm.sbatch"), *CELL], slurm, tmp_path / "slurm")
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in out, out[-3000:]

    torchrun = {**env, "NPROC_PER_NODE": "2", "MASTER_PORT": str(free_port())}
    out, elastic = launch([str(LAUNCH / "torchrun.sh"), *CELL], torchrun, tmp_path / "torchrun")
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in out, out[-3000:]
    for key in KEYS:
        assert two[key] == pytest.approx(one[key], rel=1e-5), key
        assert elastic[key] == pytest.approx(one[key], rel=1e-5), key


def test_cell_command_errors_name_the_expectation(env):
    env = {**env, "ATTNREPRO_PYTHON": sys.executable}
    for args, message in [(["coda_mlu"], "usage:"),
                          (["coda_mlu", "table6", "coda", "x"], "SEED must be a whole number"),
                          (["nope", "table6", "coda"], "no experiment script"),
                          (["coda_mlu", "table6", "nope", "0", "smoke"], "has no cell 'nope'")]:
        proc = subprocess.run([str(LAUNCH / "cell_command"), *args], cwd=ROOT, env=env,
                              capture_output=True, text=True)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
