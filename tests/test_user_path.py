"""A user's second pass (issue 31): counts refused at parse time in one line, the same
misspelt-key message in every experiment script, ``fit`` without a config naming the configs.

Everything runs in-process through ``Experiment.main``; nothing trains."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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
        experiment("decomp_snli").main(args)
    assert done.value.code == 2
    command = args[0]
    assert capsys.readouterr().err.splitlines() == [
        f"{message} (see decomp_snli.py {command} --help)"]
    assert not runs.exists()  # nothing started


def test_grid_help_lists_cells_and_defaults(capsys):
    with pytest.raises(SystemExit):
        experiment("decomp_snli").main(["grid", "--help"])
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
            exp.main(["fit", *smoke_args(script), *extra])
        assert done.value.code == 2
        assert capsys.readouterr().err.splitlines()[-2:] == [
            f"{script}.py fit: error: {message}; model.dropoutt: did you mean --model.dropout?",
            f"(every option: {script}.py fit --help)"], extra


@pytest.mark.parametrize("script", SCRIPTS)
def test_fit_without_a_config_names_the_configs(runs, script):
    exp = experiment(script)
    with pytest.raises(SystemExit) as done:
        exp.main(["fit", "--trainer.max_steps", "2"])
    message = done.value.code
    assert isinstance(message, str) and "\n" not in message
    assert message.startswith(f"{script}.py fit needs a")
    for config in exp.configs():
        assert config in message
    assert not runs.exists()  # nothing trained on the constructors' defaults
