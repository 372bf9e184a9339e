"""Every grid of every experiment script runs with ``--smoke`` on its own, and switches datasets
one way: for every script in experiments/ and every grid, ``grid <grid> --smoke --dry-run``
(and ``--config paper``) names config files that exist, a cell's dataset is a config of its
own per grid config (``--config={config}/<dataset>.yaml``, DataModule in subclass mode, no
data in the grid configs), every cell's command parses through LightningCLI, and the data
folders the smoke configs name exist.  The synthetic fixtures of tests/fixtures are what
tests/fixtures/make_fixtures.py writes.  (The end-to-end runs of at least one cell per
dataset config are in test_experiment_runner.py, test_classification_experiments.py and
test_nli_experiments.py.)"""

from __future__ import annotations

import importlib
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml

from experiments.harness.cli import run_cli
from experiments.harness.grid_model import Experiment
from experiments.harness.runner import main as run_script
from tests.fixtures.make_fixtures import DATASETS, FIXTURES, fixture_files

ROOT = Path(__file__).resolve().parents[2]
# the experiment scripts: the modules that declare an experiment (the others are the
# machinery every script shares and the tools)
SCRIPTS = sorted(p.stem for p in (ROOT / "experiments").glob("*.py")
                 if "\nEXPERIMENT = Experiment(" in p.read_text())
DATASET_CONFIG = re.compile(r"^--config=\{config\}/(\w+)\.yaml$")


def experiment(script: str) -> Experiment:
    return importlib.import_module(f"experiments.{script}").EXPERIMENT


GRIDS = [(script, grid) for script in SCRIPTS for grid in experiment(script).grids]
CELLS = [(script, grid, cell.name) for script, grid in GRIDS
         for cell in experiment(script).grids[grid].cells]


def test_every_script_is_covered():
    # the experiment scripts of the project, each with at least one grid
    assert {"coda_mlu", "coda_nli", "coda_sentiment", "decomp_snli", "dwin_classification",
            "dwin_lm"} <= set(SCRIPTS)
    for script in SCRIPTS:
        assert experiment(script).grids, script


def dry_run(script: str, grid: str, config: str, capsys) -> list[list[str]]:
    """The commands ``grid <grid> --smoke --dry-run`` (``--config <config>``) prints."""
    capsys.readouterr()
    choice = ["--smoke"] if config == "smoke" else ["--config", config]
    run_script(experiment(script), ["grid", grid, *choice, "--dry-run"])
    return [shlex.split(line) for line in capsys.readouterr().out.splitlines()]


def config_files(command: list[str]) -> list[Path]:
    """The files of every ``--config X`` / ``--config=X`` of a command, in order."""
    files = [Path(b) for a, b in zip(command, command[1:]) if a == "--config"]
    return files + [Path(a.split("=", 1)[1]) for a in command if a.startswith("--config=")]


@pytest.mark.parametrize("config", ["smoke", "paper"])
@pytest.mark.parametrize("script,grid", GRIDS, ids=[f"{s}-{g}" for s, g in GRIDS])
def test_dry_run_names_config_files_that_exist(script, grid, config, capsys):
    exp = experiment(script)
    commands = dry_run(script, grid, config, capsys)
    cells = exp.grid(grid).cells
    assert len(commands) == len(cells)  # one command per cell (one seed)
    for cell, command in zip(cells, commands):
        assert command[2:5] == ["fit", "--config", str(exp.config_path(config))]
        assert f"--run.name={cell.name}-seed0" in command
        for path in config_files(command):
            assert path.is_file(), f"{script} {grid} {cell.name}: no config {path}"
            assert yaml.safe_load(path.read_text()), f"{path} is empty"


@pytest.mark.parametrize("script", SCRIPTS)
def test_datasets_switch_one_way(script):
    """A cell names its dataset only by ``--config={config}/<dataset>.yaml``; then the
    DataModule is in subclass mode, the grid configs hold no data, and the dataset configs of
    paper and smoke are the same set, each naming its DataModule class."""
    exp = experiment(script)
    used = set()
    for grid in exp.grids.values():
        for cell in grid.cells:
            configs = [a for a in cell.args if a.startswith("--config")]
            assert all(DATASET_CONFIG.match(a) for a in configs), (cell.name, configs)
            assert not [a for a in cell.args if a.startswith("--data")], cell.name
            used |= {DATASET_CONFIG.match(a).group(1) for a in configs}
    folders = [exp.config_dir / name for name in ("paper", "smoke")]
    if not used:  # one dataset: it lives in the grid configs
        assert not any(f.exists() for f in folders)
        return
    assert exp.subclass_mode_data and exp.datamodule_class is not None
    for folder in folders:
        assert "data" not in yaml.safe_load(folder.with_suffix(".yaml").read_text())
        assert {p.stem for p in folder.glob("*.yaml")} == used, folder  # none left over
        for name in used:
            data = yaml.safe_load((folder / f"{name}.yaml").read_text())["data"]
            assert set(data) <= {"class_path", "init_args"} and "class_path" in data
            module, _, cls = data["class_path"].rpartition(".")
            assert issubclass(getattr(importlib.import_module(module), cls),
                              exp.datamodule_class)


def parsed_config(script: str, grid: str, cell: str, config: str, capsys,
                  monkeypatch) -> dict:
    """The config LightningCLI resolves from a cell's command (``--print_config``)."""
    from experiments.harness.launch import cell_command

    exp = experiment(script)
    g = exp.grid(grid)
    argv = cell_command(exp, g, g.cell(cell), 0, config)[2:]
    monkeypatch.setattr(sys, "argv", argv[:1])  # the CLI reads only the argv below
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        run_cli(exp, argv + ["--print_config"])
    assert done.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.slow  # about 0.3 s a cell
@pytest.mark.parametrize("script,grid,cell", CELLS, ids=["-".join(c) for c in CELLS])
def test_every_smoke_cell_parses_and_its_data_folder_exists(script, grid, cell, capsys,
                                                           monkeypatch):
    config = parsed_config(script, grid, cell, "smoke", capsys, monkeypatch)
    assert config["run"]["group"] == f"{grid}-smoke"
    data = config["data"]
    data = data.get("init_args", data) if isinstance(data, dict) else {}
    data_dir = data.get("data_dir")
    if data_dir is None:
        return  # the DataModule's default: ../shared/data (tested by the end-to-end runs)
    path = Path(data_dir)
    assert not path.is_absolute(), f"{data_dir}: smoke configs name paths relative to the root"
    if not (ROOT / path).exists() and (ROOT / path).resolve().is_relative_to(ROOT.parent /
                                                                             "shared"):
        pytest.skip(f"real data not available: {ROOT / path}")
    assert (ROOT / path).is_dir(), f"{script} {cell}: no data folder {data_dir}"
    if (ROOT / path).resolve().is_relative_to(ROOT):
        assert (ROOT / path).resolve().is_relative_to(FIXTURES), data_dir  # only fixtures


@pytest.mark.slow
@pytest.mark.parametrize("script,grid,cell", CELLS, ids=["-".join(c) for c in CELLS])
def test_every_paper_cell_parses(script, grid, cell, capsys, monkeypatch):
    config = parsed_config(script, grid, cell, "paper", capsys, monkeypatch)
    assert config["run"]["group"] == f"{grid}-paper"
    assert config["trainer"]["max_steps"] > 1000 or config["trainer"]["max_epochs"] >= 10


def test_committed_fixtures_are_what_the_generator_writes():
    expected = fixture_files()
    committed = {str(p.relative_to(FIXTURES)): p.read_text(encoding="utf-8")
                 for name in DATASETS for p in sorted((FIXTURES / name).rglob("*"))
                 if p.is_file()}
    assert sorted(committed) == sorted(expected)
    for name, text in expected.items():
        assert committed[name] == text, f"tests/fixtures/{name} differs: run make_fixtures.py"
    assert 10 <= len(expected) <= 100
    assert sum(len(t.encode()) for t in expected.values()) < 50_000  # tiny


def test_generator_is_deterministic_and_labels_follow_the_layouts(tmp_path):
    from tests.fixtures.make_fixtures import write_fixtures

    written = write_fixtures(tmp_path)
    assert {str(p.relative_to(tmp_path)): p.read_text() for p in written} == fixture_files()
    names = [p.relative_to(tmp_path).parts for p in written]
    imdb = [n for n in names if n[0] == "aclImdb"]
    assert {n[1:3] for n in imdb} == {(s, f) for s in ("train", "test") for f in ("pos", "neg")}
    for n in imdb:  # <id>_<rating>.txt, ratings 7-10 in pos/, 1-4 in neg/
        rating = int(re.fullmatch(r"\d+_(\d+)\.txt", n[3]).group(1))
        assert rating in (range(7, 11) if n[2] == "pos" else range(1, 5)), n
    assert {n[1] for n in names if n[0] == "dialogue_nli"} == {
        f"dialogue_nli_{s}.jsonl" for s in ("train", "dev", "test")}


#: one name per quantity, across every experiment (issue 15): what a grid reports and what
#: the models log under val/ and test/
QUANTITIES = {"acc", "acc_mismatched", "acc_best", "bleu", "sacrebleu", "exact_match", "map",
              "mrr", "p@1", "perplexity", "map_best", "mrr_at_best_map", "n_parameters",
              "steps_per_second", "step_memory_mb", "f1", "exact_match_unigram", "f1_ngram",
              "exact_match_quasar", "f1_quasar"}
#: names another codebase might use for the same quantities
SYNONYMS = re.compile(r"/(accuracy|ppl|em|exact|exactmatch|bleu4|precision_at_1|r10@1)\b")


def test_one_metric_name_per_quantity_across_experiments():
    """Every grid's metrics are one of QUANTITIES, and no model logs a synonym (``test/acc``
    in one experiment and ``test/accuracy`` in another was the bug)."""
    for script, grid in GRIDS:
        for label, key in experiment(script).grids[grid].metrics.items():
            assert key.split("/", 1)[1] in QUANTITIES, (script, grid, label, key)
    logged = []
    for path in (ROOT / "lit_models").glob("*.py"):
        logged += re.findall(r"""self\.log(?:_mean)?\(\s*f?["']([^"']+)["']""",
                             path.read_text(encoding="utf-8"))
    assert len(logged) > 20  # the pattern finds the models' log calls
    assert not [name for name in logged if SYNONYMS.search(name)], logged
