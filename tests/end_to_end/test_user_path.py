"""A user's second pass (issue 31): counts refused at parse time in one line, the same
misspelt-key message in every experiment script, ``fit`` without a config naming the configs.

Everything runs in-process through ``Experiment.main``; nothing trains."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from experiments.harness.runner import main as run_script

ROOT = Path(__file__).resolve().parents[2]
#: every experiment script: the modules of experiments/ that declare an Experiment
SCRIPTS = sorted(p.stem for p in (ROOT / "experiments").glob("*.py")
                 if "\nEXPERIMENT = Experiment(" in p.read_text())


def experiment(script: str):
    return importlib.import_module(f"experiments.{script}").EXPERIMENT


def smoke_args(script: str) -> list[str]:
    """``--config`` of the script's smoke config (and its first dataset's, if it has some)."""
    exp = experiment(script)
    where = exp.config_dir.relative_to(ROOT)
    args = ["--config", f"{where}/smoke.yaml"]
    datasets = exp.datasets_in(exp.config_dir / "smoke")
    return args + (["--config", f"{where}/smoke/{datasets[0]}.yaml"] if datasets else [])


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path / "runs"))
    monkeypatch.chdir(ROOT)
    return tmp_path / "runs"


def test_the_scripts_are_found():
    assert {"coda_mlu", "coda_nli", "decomp_snli", "dwin_mt", "qadm_mt"} <= set(SCRIPTS)


@pytest.mark.parametrize("args,message", [
    (["grid", "table1", "--smoke", "--jobs", "0"],  # was "0 at a time", waiting forever
     "decomp_snli.py grid: argument --jobs: expected a positive integer, got '0'"),
    (["grid", "table1", "--smoke", "--seeds", "0"],  # was nothing run, status 0
     "decomp_snli.py grid: argument --seeds: expected a positive integer, got '0'"),
    (["grid", "table1", "--smoke", "--threads", "-1"],  # was every cell failing
     "decomp_snli.py grid: argument --threads: expected a positive integer, got '-1'"),
    (["grid", "table1", "--smoke", "--jobs", "two"],
     "decomp_snli.py grid: argument --jobs: expected a positive integer, got 'two'"),
    (["cell", "table1", "--smoke", "--cell", "intra", "--seed", "-1"],
     "decomp_snli.py cell: argument --seed: expected an integer >= 0, got '-1'"),
    (["sweep", "table1", "--smoke", "--seeds", "0"],
     "decomp_snli.py sweep: argument --seeds: expected a positive integer, got '0'"),
])
def test_a_count_is_checked_when_parsed(runs, capsys, args, message):
    with pytest.raises(SystemExit) as done:
        run_script(experiment("decomp_snli"), args)
    assert done.value.code == 2
    command = args[0]
    assert capsys.readouterr().err.splitlines() == [
        f"{message} (see decomp_snli.py {command} --help)"]
    assert not runs.exists()  # nothing started


def test_grid_help_lists_cells_and_defaults(capsys):
    with pytest.raises(SystemExit):
        run_script(experiment("decomp_snli"), ["grid", "--help"])
    out = capsys.readouterr().out
    assert "            cells: vanilla, intra, exact, latent" in out.splitlines()
    assert "seeds 0..N-1 per cell (default: 1)" in out
    assert "cells run in parallel (default: 1)" in out
    assert "$ATTNREPRO_THREADS" in out


@pytest.mark.slow  # builds each script's LightningCLI parser: a few seconds a script
@pytest.mark.parametrize("script", SCRIPTS)
def test_a_misspelt_key_is_named_the_same_way_in_every_script(runs, tmp_path, capsys, script):
    """On the command line and in a config file, subclass mode (decomp_snli's --model) or
    not: the key and the closest option (decomp_snli said 'expected null, got NestedArg')."""
    exp = experiment(script)
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  dropoutt: 0.1\n")
    cases = {
        ("--model.dropoutt", "0.1"): "unrecognized arguments: --model.dropoutt 0.1",
        ("--config", str(bad)): (f"Subcommand 'fit' does not accept option 'model.dropoutt' "
                                 f"(the key 'model.dropoutt' of {bad})"),
    }
    for extra, message in cases.items():
        with pytest.raises(SystemExit) as done:
            run_script(exp, ["fit", *smoke_args(script), *extra])
        assert done.value.code == 2
        assert capsys.readouterr().err.splitlines()[-2:] == [
            f"{script}.py fit: error: {message}; model.dropoutt: did you mean --model.dropout?",
            f"(every option: {script}.py fit --help full)"], extra


@pytest.mark.parametrize("script", SCRIPTS)
def test_fit_without_a_config_names_the_configs(runs, script):
    exp = experiment(script)
    with pytest.raises(SystemExit) as done:
        run_script(exp, ["fit", "--trainer.max_steps", "2"])
    message = done.value.code
    assert isinstance(message, str) and "\n" not in message
    assert message.startswith(f"{script}.py fit needs a")
    for config in exp.configs():
        assert config in message
    assert not runs.exists()  # nothing trained on the constructors' defaults


def paper_cells() -> list[tuple[str, str, str]]:
    """(script, grid, cell): per script, the first cell of each dataset config its grids
    merge (one cell when it has none), so every paper config file is parsed once."""
    out = []
    for script in SCRIPTS:
        exp = experiment(script)
        seen = set()
        for grid in exp.grids.values():
            for cell in grid.cells:
                datasets = tuple(a for a in cell.args if a.startswith("--config="))
                if datasets not in seen:
                    seen.add(datasets)
                    out.append((script, grid.name, cell.name))
    return out


PAPER_CELLS = paper_cells()


@pytest.mark.slow  # one --print_config a dataset config: about 1 s each
@pytest.mark.parametrize("script,grid,cell", PAPER_CELLS, ids=["-".join(c) for c in PAPER_CELLS])
def test_paper_config_data_paths_are_under_the_data_root(tmp_path, monkeypatch, capsys,
                                                         script, grid, cell):
    """Every paper config reads its data under the data root ($ATTNREPRO_DATA): a data_dir it
    sets, a vectors file it names (relative: under the root), and the DataModule's default
    folder when it sets none (dwin_mt, qadm_mt and coda_text2code named data/<name> of the
    working directory)."""
    import sys

    import yaml

    from experiments.harness.cli import run_cli
    from experiments.harness.launch import cell_command

    root = tmp_path / "data"
    monkeypatch.setenv("ATTNREPRO_DATA", str(root))
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path / "runs"))
    exp = experiment(script)
    g = exp.grid(grid)
    argv = cell_command(exp, g, g.cell(cell), 0, "paper")[2:]
    monkeypatch.setattr(sys, "argv", argv[:1])
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        run_cli(exp, argv + ["--print_config"])
    assert done.value.code in (0, None)
    data = yaml.safe_load(capsys.readouterr().out)["data"]
    init = data.get("init_args", data) if isinstance(data, dict) else {}
    data_dir, vectors = init.get("data_dir"), init.get("vectors")
    if data_dir is not None:
        assert Path(data_dir).is_absolute() and root in Path(data_dir).parents, data_dir
    if vectors is not None:
        assert not Path(vectors).is_absolute() or root in Path(vectors).parents, vectors
    if data_dir is None:  # the DataModule's default: a folder of the root
        import importlib as il

        module, _, name = (data.get("class_path") or
                           f"{exp.datamodule_class.__module__}."
                           f"{exp.datamodule_class.__qualname__}").rpartition(".")
        cls = getattr(il.import_module(module), name)
        default = _default_folder(cls, init)
        if default is not None:
            assert root in default.parents, (cls.__name__, default)


def _default_folder(cls, init: dict) -> Path | None:
    """The folder a DataModule of ``cls`` reads without data_dir: built with the config's
    arguments (None when it cannot be built here, e.g. it needs files to exist)."""
    kwargs = {k: v for k, v in init.items() if k in ("source", "target", "granularity")}
    try:
        return getattr(cls(**kwargs), "data_dir", None)  # MLU: generated, no folder
    except (ValueError, FileNotFoundError, TypeError):
        return None


# -- progress -----------------------------------------------------------------------------------
def test_progress_lines_every_n_steps_and_at_each_validation():
    """ProgressLines on a tiny model: a line at steps 2, 4, 6 (step, loss, steps/s, ETA) and
    one per validation with its metrics; none during the sanity check."""
    import io

    import lightning as L
    import torch

    from experiments.harness.progress import ProgressLines, duration, shows_bar

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(2, 1)

        def training_step(self, batch, _):
            loss = self.w(batch[0]).pow(2).mean()
            self.log("train/loss", loss)
            return loss

        def validation_step(self, batch, _):
            self.log("val/loss", self.w(batch[0]).pow(2).mean())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(12, 2)),
                                       batch_size=2)
    out = io.StringIO()
    trainer = L.Trainer(max_steps=6, val_check_interval=3, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[ProgressLines(2, stream=out)])
    trainer.fit(Tiny(), data, data)
    lines = out.getvalue().splitlines()
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["2/6", "4/6", "6/6"]
    for line in steps:
        assert re.fullmatch(r"step \d/6  loss \d+\.\d{4}  \d+\.\d{2} steps/s  ETA \d+s", line)
    validations = [line for line in lines if line.startswith("validation")]
    assert len(validations) == 2  # steps 3 and 6 (no line for the sanity check)
    assert re.fullmatch(r"validation at step 3: val/loss \d+\.\d{4}", validations[0])
    assert duration(3725) == "1h02m" and duration(592) == "9m52s" and duration(41) == "41s"
    assert shows_bar(None, io.StringIO()) is False and shows_bar(True, io.StringIO()) is True
    with pytest.raises(ValueError):
        ProgressLines(0)


# -- report never mixes settings ----------------------------------------------------------------
def test_report_refuses_to_average_runs_with_different_settings(runs, capsys):
    """Two seeds of one cell: averaged when only the seed, the run name and display
    settings (the progress bar) differ; refused
    in one line naming the key and each run's value when a setting differs (a cell rerun
    with -- --trainer.max_steps 4 beside the grid's run)."""
    folder = runs / "decomp_snli" / "table1-smoke"
    for seed, acc in ((0, 0.5), (1, 0.7)):
        run_dir = folder / f"intra-seed{seed}"
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.csv").write_text(f"step,val/acc,test/acc\n3,{acc},{acc}\n")
        (run_dir / "config.yaml").write_text(
            f"seed_everything: {seed}\ntrainer:\n  max_steps: 200\n"
            f"run:\n  name: intra-seed{seed}\n  group: table1-smoke\n")
    run_script(experiment("decomp_snli"), ["report", "table1", "--smoke"])
    assert "| intra | 62.06 | 60.00 ± 14.14 (n=2) |" in capsys.readouterr().out
    # a setting that only changes what a run shows (DW Table 5's SST seeds 0-1 recorded the
    # bar False, seed 2 None): averaged
    (folder / "intra-seed1" / "config.yaml").write_text(
        "seed_everything: 1\ntrainer:\n  max_steps: 200\n  enable_progress_bar: false\n"
        "run:\n  name: intra-seed1\n  group: table1-smoke\n")
    run_script(experiment("decomp_snli"), ["report", "table1", "--smoke"])
    assert "| intra | 62.06 | 60.00 ± 14.14 (n=2) |" in capsys.readouterr().out
    (folder / "intra-seed1" / "config.yaml").write_text(
        "seed_everything: 1\ntrainer:\n  max_steps: 4\nrun:\n  name: intra-seed1\n"
        "  group: table1-smoke\n")
    with pytest.raises(SystemExit) as done:
        run_script(experiment("decomp_snli"), ["report", "table1", "--smoke"])
    assert done.value.code == (
        f"decomp_snli.py report table1: the runs of cell intra in {folder} differ in "
        "trainer.max_steps: intra-seed0 200, intra-seed1 4: not averaged; rerun the odd one "
        "with the others' settings (cell table1 --cell intra --seed K --force) or move its "
        "folder away")


@pytest.mark.slow  # one 20-step smoke run of coda_mlu
def test_a_grid_cell_shows_its_progress_in_output_log(env, tmp_path):
    """A grid cell is no terminal: its output.log has a line every N steps (step, loss,
    steps/s, ETA) and one per validation with its metrics (was silent until the end); no
    progress bar's carriage returns."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "coda_mlu.py"), "grid", "table6", "--smoke",
         "--cells", "transformer", "--", "--run.progress_every", "5", "--run.wandb", "false"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    log = (tmp_path / "runs" / "coda_mlu" / "table6-smoke" / "transformer-seed0"
           / "output.log").read_text()
    assert "\r" not in log
    steps = re.findall(r"^step (\d+)/20  loss \d+\.\d{4}  \d+\.\d{2} steps/s  ETA \w+$", log,
                       re.MULTILINE)
    assert steps == ["5", "10", "15", "20"], log[-2000:]
    validations = re.findall(r"^validation at step (\d+): (.*)$", log, re.MULTILINE)
    assert [s for s, _ in validations] == ["10", "20"]
    assert "val/exact_match " in validations[0][1] and "val/loss " in validations[0][1]


def finished_run(runs: Path, name: str = "intra-seed0") -> Path:
    run_dir = runs / "decomp_snli" / "table1-smoke" / name
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.csv").write_text("step,val/acc,test/acc\n3,0.5,0.5\n")
    return run_dir


def test_a_finished_run_is_replaced_only_with_force(runs, capsys):
    """cell and grid refuse to replace a run that finished (was: cell ... -- --trainer.max_steps
    4 silently replaced the grid's run), naming it and how to keep or replace it."""
    run_dir = finished_run(runs)
    with pytest.raises(SystemExit) as done:
        run_script(experiment("decomp_snli"), ["cell", "table1", "--smoke", "--cell", "intra", "--",
                                        "--trainer.max_steps", "4"])
    assert done.value.code == (f"decomp_snli.py cell: intra seed 0 finished before ({run_dir}); "
                               "it is kept (report reads it): --force replaces it")
    with pytest.raises(SystemExit) as done:
        run_script(experiment("decomp_snli"), ["grid", "table1", "--smoke", "--cells", "intra",
                                        "vanilla"])
    assert done.value.code == (
        f"decomp_snli.py grid: 1 run(s) in {run_dir.parent} finished before: intra seed 0; "
        "--skip-done keeps them (and runs the others), --force replaces them")
    assert (run_dir / "metrics.csv").read_text() == "step,val/acc,test/acc\n3,0.5,0.5\n"
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["intra-seed0"]  # none started


def test_sweep_takes_threads_and_overrides_like_grid(runs, tmp_path, capsys):
    import yaml

    out = tmp_path / "sweep.yaml"
    run_script(experiment("decomp_snli"), ["sweep", "table1", "--smoke", "--threads", "2",
                                           "--output", str(out), "--", "--trainer.max_steps", "4"])
    command = yaml.safe_load(out.read_text())["command"]
    assert command == ["${env}", "${interpreter}", "${program}", "cell", "table1", "--config",
                       "smoke", "${args}", "--threads", "2", "--", "--trainer.max_steps", "4"]


def test_fit_help_is_grouped_with_a_short_usage(runs, capsys):
    """``fit --help full`` (``fit --help`` is short: tests/experiments/test_nothing_lost.py):
    no usage of every option (about 80 lines) and no function reprs: the links read
    'prepared vocab_size(data) --> model.src_vocab_size'; --print_config is named."""
    with pytest.raises(SystemExit) as done:
        run_script(experiment("coda_mlu"), ["fit", "--help", "full"])
    assert done.value.code in (0, None)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == ("usage: coda_mlu.py fit [-c CONFIG ...] [--<group>.<option> VALUE ...] "
                        "[--print_config]")
    assert "--print_config" in lines[1] and lines[2] == ""
    assert "0x" not in out and "functools.partial" not in out
    assert "  prepared vocab_size(data) --> model.src_vocab_size [applied on instantiate]" in lines
