"""Start-up (issue 31 item 9): an experiment script names its model and DataModule by path, so
``<name>.py --help``, ``grid``, ``cell``, ``sweep``, ``report`` and the argument errors the
runner finds before LightningCLI import neither torch nor Lightning.  The help then reads
the model's attention arguments and the mechanism names from the source
(experiments/harness/sources.py); here they are checked against the imported classes and
``attention.registry.REGISTRY`` for every experiment script, so the two cannot drift.

Which modules a fresh interpreter imported is checked, never how long it took."""

from __future__ import annotations

import dataclasses
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from attention.registry import REGISTRY
from experiments.harness import sources
from experiments.harness.preflight import mechanism_params
from experiments.harness.runner import overview

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.stem for p in (ROOT / "experiments").glob("*.py")
                 if "\nEXPERIMENT = Experiment(" in p.read_text())

#: ``python <script> *argv`` in this interpreter (sys.argv and sys.path[0] as Python sets them
#: for a script), then one JSON line on stderr: the exit code and whether torch or Lightning
#: was imported
RUN_SCRIPT = """
import json, runpy, sys
script, *argv = json.loads(sys.argv[1])
sys.argv, sys.path[0] = [script, *argv], script.rpartition("/")[0]
code = 0
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as done:
    code = done.code
heavy = [m for m in ("torch", "lightning") if m in sys.modules]
print(json.dumps({"code": code if code is None or isinstance(code, int) else str(code),
                  "imported": heavy}), file=sys.stderr)
"""


def experiment(script: str):
    return importlib.import_module(f"experiments.{script}").EXPERIMENT


def start(env: dict, script: str, *argv: str) -> subprocess.Popen:
    """A fresh interpreter running ``experiments/<script>.py *argv`` (see RUN_SCRIPT)."""
    return subprocess.Popen(
        [sys.executable, "-c", RUN_SCRIPT, json.dumps([f"experiments/{script}.py", *argv])],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> tuple[str, list[str], dict]:
    """(stdout, the stderr lines before the summary, the summary)"""
    out, err = proc.communicate(timeout=300)
    *lines, last = err.strip().splitlines()
    return out, lines, json.loads(last)


def test_every_experiment_script_is_found():
    assert len(SCRIPTS) >= 12 and "coda_mlu" in SCRIPTS


def test_help_imports_no_torch_and_equals_the_overview_of_the_imported_classes(env):
    """``--help`` of every script in a fresh interpreter: no torch, no Lightning, and the
    overview as it is computed from the imported model class and the registry."""
    procs = {script: start(env, script, "--help") for script in SCRIPTS}
    for script, proc in procs.items():
        out, err, done = finish(proc)
        assert done == {"code": 0, "imported": []}, (script, done, err)
        exp = experiment(script)
        # the classes themselves, imported: the overview from them and REGISTRY
        imported = dataclasses.replace(exp, model_class=exp.model_class,
                                       datamodule_class=exp.datamodule_class)
        assert imported.unimported("model_class") is None
        assert out == overview(imported) + "\n", script


def test_the_registry_names_read_from_the_source_are_the_registry():
    assert sources.mechanism_names() == list(REGISTRY)


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_model_read_from_the_source_is_the_imported_one(script):
    """The script's model and its subclasses: the attention arguments and the predictions
    file read from the source are those of the imported classes."""
    exp = experiment(script)
    model, data = exp.imported_classes()
    for path in [f"{model.__module__}.{model.__qualname__}", *exp.subclasses]:
        module, _, name = path.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        assert sources.mechanism_params(path) == mechanism_params(cls), path
        assert sources.class_attribute(path, "predictions_file") == \
            getattr(cls, "predictions_file", None), path
        # a subclass is one the command line may name by its class name
        assert issubclass(cls, model) or issubclass(cls, data), path


def test_classes_given_as_classes_or_paths():
    from experiments.harness.grid_model import Experiment
    from lit_models.transformer import TransformerSeq2Seq

    by_path = Experiment("x", "lit_models.transformer.TransformerSeq2Seq", object, {})
    assert by_path.unimported("model_class") == "lit_models.transformer.TransformerSeq2Seq"
    assert by_path.unimported("datamodule_class") is None
    assert by_path.model_class is TransformerSeq2Seq  # imported when read, then kept
    assert by_path.unimported("model_class") is None
    assert Experiment("y", TransformerSeq2Seq, object, {}).model_class is TransformerSeq2Seq


#: runs experiment scripts' ``main`` on each case of the JSON file argv[1] in turn, writing
#: after each the exit (0, 2, or 1 for a message) and the heavy modules imported by then
RUN_CASES = """
import importlib, json, os, sys
from experiments.harness.runner import main as run_script
cases = json.loads(open(sys.argv[1]).read())
done = []
for script, argv, runs in cases:
    os.environ["ATTNREPRO_RUNS"] = runs
    try:
        run_script(importlib.import_module("experiments." + script).EXPERIMENT, argv)
        code = 0
    except SystemExit as stop:
        code = stop.code if stop.code is None or isinstance(stop.code, int) else 1
    done.append({"argv": argv, "code": code or 0,
                 "imported": [m for m in ("torch", "lightning") if m in sys.modules]})
open(sys.argv[2], "w").write(json.dumps(done))
"""


def test_runner_commands_and_their_errors_import_no_torch(env, tmp_path):
    """The commands that need no model, one after the other in a fresh interpreter, the
    imports checked after each: the argument errors before LightningCLI, ``predict``'s
    refusal, a grid's ``--dry-run`` (also with ``--skip-done``: no checkpoint to read),
    ``sweep``, and ``report`` (with ``--plot``, on the committed decoder-study runs)."""
    runs, study = env["ATTNREPRO_RUNS"], str(ROOT / "results" / "coda_mlu_study_runs")
    sweep, plots = tmp_path / "sweep.yaml", tmp_path / "plots"
    cases = [  # (script, argv, runs folder, exit: 0, 2 argparse's, 1 a message)
        ("coda_mlu", ["frobnicate"], runs, 1),
        ("coda_mlu", ["predict"], runs, 1),
        ("coda_mlu", ["fit"], runs, 1),  # no config
        ("coda_sentiment", ["fit", "--config", "experiments/configs/coda_sentiment/smoke.yaml"],
         runs, 1),  # no dataset config
        ("coda_mlu", ["grid", "table6", "--jobs", "0"], runs, 2),
        ("coda_mlu", ["grid", "table6", "--threads", "-1"], runs, 2),
        ("coda_mlu", ["grid", "table6", "--seeds", "0"], runs, 2),
        ("coda_mlu", ["grid", "nope"], runs, 1),
        ("coda_mlu", ["grid", "table6", "--config", "nope"], runs, 1),
        ("coda_mlu", ["grid", "table6", "--smoke", "--cells", "nope"], runs, 1),
        ("coda_mlu", ["grid", "table6", "--smoke", "--dry-run"], runs, 0),
        ("coda_mlu", ["grid", "table6", "--smoke", "--skip-done", "--dry-run"], runs, 0),
        ("coda_mlu", ["grid", "--help"], runs, 0),
        ("coda_mlu", ["cell", "table6", "--cell", "nope", "--smoke"], runs, 1),
        ("coda_mlu", ["cell", "table6", "--cell", "coda", "--seed", "-1"], runs, 2),
        ("coda_mlu", ["sweep", "table6", "--smoke", "--output", str(sweep)], runs, 0),
        ("coda_mlu", ["report", "nope"], runs, 1),
        ("coda_mlu", ["report", "table6", "--config", "nope"], runs, 1),
        ("coda_mlu", ["report", "--frobnicate"], runs, 2),
        ("coda_mlu", ["report", "table6", "--smoke", "--curve"], runs, 0),
        ("coda_mlu", ["report", "study", "--config", "study", "--curve", "--plot", "--out",
                      str(plots)], study, 0),
    ]
    given, written = tmp_path / "cases.json", tmp_path / "done.json"
    given.write_text(json.dumps([case[:3] for case in cases]))
    proc = subprocess.run([sys.executable, "-c", RUN_CASES, str(given), str(written)], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = json.loads(written.read_text())
    assert [(d["argv"], d["code"]) for d in done] == [(argv, code) for _, argv, _, code in cases]
    for d in done:
        assert d["imported"] == [], d  # the first command that imported one of them
    assert sweep.is_file() and len(list(plots.glob("*.png"))) == 4
