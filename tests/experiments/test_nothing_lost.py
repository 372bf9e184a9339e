"""Issue 49 items 3 and 4: ``--force`` checks every cell before it changes a run folder and
sets the old run aside instead of deleting it; a folder a command cannot write is one line;
``report``, ``--smoke``, the W&B summary run, ``fetch --status`` and ``fit --help`` answer
the same way every time."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from datamodules import fetch
from datamodules.registry import DATASETS
from experiments import coda_mlu, coda_nli, decomp_snli
from experiments.harness.grid_model import Cell, Grid
from experiments.harness.replaced import set_aside, settle
from experiments.harness.runner import main as run_script

ROOT = Path(__file__).resolve().parents[2]
#: a stand-in for a cell's ``fit``: it writes the grid's metric, or fails before training
FAKE_FIT = """
import sys
from pathlib import Path
args = dict(a.removeprefix("--").split("=", 1) for a in sys.argv if a.startswith("--run."))
run = Path({runs!r}) / "coda_mlu" / args["run.group"] / args["run.name"]
if {fail!r}:
    print("fit: the data is not there")
    sys.exit(1)
run.mkdir(parents=True, exist_ok=True)
(run / "metrics.csv").write_text("step,test/exact_match\\n8,0.{value}\\n")
"""


def fake_fit(tmp_path: Path, monkeypatch, fail: bool = False, value: int = 5) -> None:
    script = tmp_path / f"fit-{fail}-{value}.py"
    script.write_text(FAKE_FIT.format(runs=str(tmp_path / "runs"), fail=fail, value=value))
    monkeypatch.setattr(coda_mlu.EXPERIMENT, "script", script)
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path / "runs"))


def finished_run(tmp_path: Path, cell: str = "transformer") -> Path:
    run = tmp_path / "runs" / "coda_mlu" / "table6-smoke" / f"{cell}-seed0"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text("step,test/exact_match\n8,0.25\n")
    return run


def test_force_sets_the_old_run_aside_until_the_new_one_finished(tmp_path, monkeypatch,
                                                                  capsys):
    run = finished_run(tmp_path)
    fake_fit(tmp_path, monkeypatch, fail=True)
    with pytest.raises(SystemExit):  # the new run fails before training: the old one is back
        run_script(coda_mlu.EXPERIMENT, ["grid", "table6", "--smoke", "--cells", "transformer",
                                         "--force"])
    out = capsys.readouterr().out
    failed = [d for d in run.parent.iterdir() if d.name.startswith("transformer-seed0.failed-")]
    assert len(failed) == 1
    assert "fit: the data is not there" in (failed[0] / "output.log").read_text()
    assert f"the previous run is back in {run}; this attempt's log: {failed[0] / 'output.log'}" \
        in out
    assert (run / "metrics.csv").read_text() == "step,test/exact_match\n8,0.25\n"
    assert "W&B summary" not in out  # no cell finished: no summary run
    fake_fit(tmp_path, monkeypatch, value=75)
    run_script(coda_mlu.EXPERIMENT, ["grid", "table6", "--smoke", "--cells", "transformer",
                                     "--force"])
    assert (run / "metrics.csv").read_text() == "step,test/exact_match\n8,0.75\n"
    assert not [d for d in run.parent.iterdir() if ".replaced-" in d.name]  # removed once done


def test_a_run_that_failed_after_training_keeps_the_one_it_replaced(tmp_path):
    run = finished_run(tmp_path)
    aside = set_aside(run, "transformer seed 0", resume=False)
    assert not run.exists() and aside.name.startswith("transformer-seed0.replaced-")
    run.mkdir()
    (run / "metrics.csv").write_text("step,train/loss\n2,1.5\n")  # it trained, then failed
    assert settle(run, aside, failed=True) == f"the run it replaced is kept in {aside}"
    assert (aside / "metrics.csv").exists() and (run / "metrics.csv").exists()
    assert set_aside(tmp_path / "none", "x", resume=False) is None


def test_force_checks_the_data_before_it_changes_a_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("ATTNREPRO_DATA", str(tmp_path / "nowhere"))
    run = tmp_path / "runs" / "decomp_snli" / "table1-smoke" / "vanilla-seed0"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text("step,test/acc\n8,0.5\n")
    with pytest.raises(SystemExit) as refused:
        run_script(decomp_snli.EXPERIMENT, ["grid", "table1", "--smoke", "--force"])
    assert str(refused.value) == (
        f"decomp_snli.py grid: cell vanilla: {tmp_path}/nowhere/snli/snli_1.0_dev.first1288.jsonl"
        " is not there and no download gives it (SNLI 1.0: python -m datamodules.fetch "
        "--status snli; the data root, $ATTNREPRO_DATA); no run was changed")
    with pytest.raises(SystemExit) as refused:
        run_script(decomp_snli.EXPERIMENT, ["cell", "table1", "--smoke", "--cell", "vanilla",
                                            "--force"])
    assert str(refused.value).startswith("decomp_snli.py cell: cell vanilla: ")
    assert sorted(p.name for p in run.parent.iterdir() if not p.name.endswith(".lock")) \
        == ["vanilla-seed0"] and (run / "metrics.csv").exists()
    assert "W&B" not in capsys.readouterr().out


def test_a_cell_named_twice_runs_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    run_script(coda_mlu.EXPERIMENT, ["grid", "table6", "--smoke", "--cells", "coda", "coda",
                                     "transformer", "--dry-run"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "coda_mlu.py grid: --cells names coda more than once; each cell runs once"
    assert len(out) == 3 and "--run.cell=coda " in out[1] and "--run.cell=transformer " in out[2]


@pytest.mark.parametrize("variable, argv, expected", [
    ("ATTNREPRO_RUNS", ["grid", "table6", "--smoke"],
     "coda_mlu.py grid: /proc/x: cannot create it (No such file or directory) (the runs root, "
     "$ATTNREPRO_RUNS)"),
    ("ATTNREPRO_CACHE", ["grid", "table6", "--smoke"],
     "coda_mlu.py grid: /proc/x: cannot create it (No such file or directory) (the cache root, "
     "$ATTNREPRO_CACHE)"),
    ("ATTNREPRO_RUNS", ["cell", "table6", "--smoke", "--cell", "coda"],
     "coda_mlu.py cell: /proc/x: cannot create it (No such file or directory) (the runs root, "
     "$ATTNREPRO_RUNS)"),
    ("ATTNREPRO_CACHE", ["fit", "--config", "experiments/configs/coda_mlu/smoke.yaml"],
     "coda_mlu.py fit: /proc/x: cannot create it (No such file or directory) (the cache root, "
     "$ATTNREPRO_CACHE)"),
])
def test_a_root_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, variable, argv,
                                                   expected):
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    monkeypatch.setenv(variable, "/proc/x")
    with pytest.raises(SystemExit) as refused:
        run_script(coda_mlu.EXPERIMENT, argv)
    assert str(refused.value) == expected


def test_a_path_argument_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    finished_run(tmp_path.parent / tmp_path.name / "x")  # a run: report goes as far as --plot
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path / "x" / "runs"))
    with pytest.raises(SystemExit) as refused:
        run_script(coda_mlu.EXPERIMENT, ["report", "table6", "--smoke", "--plot", "--out",
                                         "README.md/plots"])
    assert str(refused.value) == ("coda_mlu.py report: README.md/plots: cannot be a folder "
                                  "(README.md is a file) (the folder of --out)")
    with pytest.raises(SystemExit) as refused:
        run_script(coda_mlu.EXPERIMENT, ["sweep", "table6", "--output", "README.md/s.yaml"])
    assert str(refused.value) == ("coda_mlu.py sweep: README.md: cannot be a folder "
                                  "(README.md is a file) (the folder of --output)")
    monkeypatch.setenv("ATTNREPRO_DATA", "/proc/x")  # the data a cell downloads
    with pytest.raises(SystemExit) as refused:
        run_script(coda_nli.EXPERIMENT, ["grid", "table3", "--cells", "snli-softmax"])
    assert str(refused.value) == (
        "coda_nli.py grid: cell snli-softmax: SNLI 1.0 must be downloaded first, but "
        "/proc/x/snli: cannot create it (No such file or directory) (the data root, "
        "$ATTNREPRO_DATA); no run was changed")
    assert fetch.main(["snli", "--data_dir", "/proc/x"]) == 1
    assert capsys.readouterr().err == (
        "error: /proc/x: cannot create it (No such file or directory) (the data root: "
        "--data_dir, else $ATTNREPRO_DATA, else ../shared/data)\n")


def test_report_answers_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    run_script(coda_mlu.EXPERIMENT, ["report", "table6"])
    assert capsys.readouterr().out == (
        f"no runs of table6 yet, with any config (under {tmp_path}/coda_mlu); run it: python "
        "experiments/coda_mlu.py grid table6\n")
    with pytest.raises(SystemExit) as refused:
        run_script(coda_mlu.EXPERIMENT, ["report", "table6", "--smoke", "--config", "demo"])
    assert str(refused.value) == ("coda_mlu.py: --smoke means --config smoke; it cannot go "
                                  "with --config demo (give one of them)")


def test_one_summary_run_per_grid_and_config(tmp_path, monkeypatch, capsys):
    import wandb

    from experiments.harness.wandb_summary import log_grid_summary, summary_run_id

    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", "offline")
    grid = Grid("t", "T", {"Acc": "test/acc"}, [Cell("a")])
    experiment = coda_mlu.EXPERIMENT
    (tmp_path / "coda_mlu" / "t-smoke" / "a-seed0" / "wandb").mkdir(parents=True)
    previous = tmp_path / "coda_mlu" / "t-smoke" / "summary" / "wandb" / "offline-run-1-x"
    previous.mkdir(parents=True)
    seen = []

    def init(**kwargs):
        seen.append((kwargs["id"], kwargs["resume"], previous.exists()))
        raise wandb.errors.CommError("stop here")

    monkeypatch.setattr(wandb, "init", init)
    log_grid_summary(experiment, grid, "smoke")
    assert seen == [("summary-coda_mlu-t-smoke", "allow", False)]  # the old one removed first
    assert summary_run_id(experiment, grid, "a/b.yaml").startswith("summary-coda_mlu-t-a-b-yaml-")
    assert len(summary_run_id(experiment, Grid("t" * 80, "T", {}, []), "paper")) == 64


def test_fetch_status_counts_a_dataset_a_config_can_read(tmp_path, capsys):
    (tmp_path / "snli").mkdir()
    (tmp_path / "snli" / "snli_1.0_dev.first1288.jsonl").write_text("{}\n")
    assert fetch.main(["--status", "--data_dir", str(tmp_path)]) == 0  # a report: exit 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{len(DATASETS)} datasets under {tmp_path}: 1 complete, 1 usable")
    assert lines[1] == ("  snli             usable by the smoke configs of decomp_snli and "
                        "coda_nli: the dev set's first 1,288 lines")
    assert fetch.main(["--check", "snli", "--data_dir", str(tmp_path)]) == 0
    assert fetch.main(["--check", "snli", "multinli", "--data_dir", str(tmp_path)]) == 1
    # the count the docs give
    docs = (ROOT / "docs" / "data.md").read_text()
    counted = re.search(r"for (\d+) of\s+the (\d+) datasets", docs)
    published = sum(any(d.sha256 for d in e.downloads) for e in DATASETS.values())
    assert counted and counted.groups() == (str(published), str(len(DATASETS)))


def test_every_part_a_config_reads_is_in_the_registry():
    """The files a shipped config names under the data root (no data_dir of its own) are the
    release's, or a ``parts`` entry of the registry lists them all."""
    from experiments.harness.preflight import FILE_KEYS
    from experiments.harness.scale import data_class_name, merged_settings

    for experiment in (decomp_snli.EXPERIMENT, coda_nli.EXPERIMENT):
        for config in experiment.configs():
            for grid in experiment.grids.values():
                for cell in grid.cells:
                    data = merged_settings(experiment, config, cell).get("data") or {}
                    data = {**data, **(data.get("init_args") or {})}
                    named = {data[k] for k in FILE_KEYS if data.get(k)}
                    if not named or data.get("data_dir"):
                        continue
                    name = data_class_name(experiment, config, cell)
                    entries = [e for e in DATASETS.values() if name in e.datamodules]
                    assert any(named <= {p.rsplit("/", 1)[-1] for p in e.files}
                               or any(named <= set(files) for _, files in e.parts)
                               for e in entries), (experiment.name, config, cell.name, named)


def test_fit_help_is_short_and_imports_no_torch():
    code = ("import sys; from experiments import coda_mlu; "
            "from experiments.harness.runner import main; "
            "main(coda_mlu.EXPERIMENT, ['fit', '--help']); "
            "print('torch' in sys.modules or 'lightning' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    lines = done.stdout.splitlines()
    assert lines[-1] == "False" and len(lines) < 40
    assert "  coda_mlu.py fit --help full: every option, by group" in lines
    assert any(line.startswith("  --model.*   lit_models.transformer.TransformerSeq2Seq: "
                               "n_encoder_layers,") for line in lines)
