"""The commands explain themselves (issue 15, item 2): ``<script>.py --help`` lists every
command, the grids (title, cells per seed) and the configs; the runner's subcommands list
their valid grids and configs; ``predict`` is not offered; a missing dataset config, an
unknown attention name or option, an unknown grid or config is one line naming the valid
ones; ``report`` says where runs exist; ``sweep`` writes beside the runs, never among the
configs.

A few checks run the scripts as a user does (subprocesses, started together); the others
call ``Experiment.main`` with an argv in-process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attention import REGISTRY, build
from experiments import coda_mlu, coda_mt, coda_nli, decomp_snli
from experiments.harness.cli import run_cli
from experiments.harness.grid_model import Experiment
from experiments.harness.launch import cell_command
from experiments.harness.preflight import check_attention_args, check_dataset_args
from experiments.harness.runner import main as run_script

ROOT = Path(__file__).resolve().parents[2]
NLI = coda_nli.EXPERIMENT
CONFIGS = "experiments/configs/coda_nli"
SMOKE, SNLI = f"{CONFIGS}/smoke.yaml", f"{CONFIGS}/smoke/snli.yaml"
NAMES = ", ".join(REGISTRY)
CODA_OPTIONS = "alpha, beta, scale, gate, center_e, e_fn, n_fn"
UNKNOWN_CODS = (f"coda_nli.py fit: --model.attention cods: unknown attention 'cods' "
                f"(did you mean 'coda'?); registered: {NAMES}")
NEEDS_DATASET = ("coda_nli.py fit needs a dataset: add --config "
                 f"{CONFIGS}/smoke/{{snli,mnli,scitail,dnli}}.yaml")
COMMANDS = ("fit", "validate", "test", "grid", "cell", "sweep", "report", "keep")


def error(experiment: Experiment, argv: list[str]) -> str:
    """The one-line message ``main(argv)`` exits with."""
    with pytest.raises(SystemExit) as done:
        run_script(experiment, argv)
    message = done.value.code
    assert isinstance(message, str), message
    assert "\n" not in message, message
    return message


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path / "runs"))
    return tmp_path / "runs"


# -- the scripts as a user runs them ------------------------------------------------------------
def test_script_help_and_one_line_errors(env, tmp_path):
    cases = {
        "help": ["--help"],
        "predict": ["predict"],
        "no dataset": ["fit", "--config", SMOKE],
        "attention": ["fit", "--config", SMOKE, "--config", SNLI, "--model.attention", "cods"],
    }
    procs = {k: subprocess.Popen([sys.executable, str(ROOT / "experiments" / "coda_nli.py"), *a],
                                 env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
             for k, a in cases.items()}
    done = {}
    for k, p in procs.items():
        out, err = p.communicate(timeout=120)
        done[k] = (p.returncode, out, err.strip().splitlines())

    code, out, err = done["help"]
    assert code == 0 and not err, err
    lines = out.splitlines()
    for command in COMMANDS:  # each with a one-line description
        assert any(line.split()[:1] == [command] and len(line.split()) > 3
                   for line in lines), command
    assert "predict" not in out
    assert ("  table3  CoDA Table 3: DecompAtt vs. DecompAtt + CoDA, NLI test accuracy (%) "
            "(8 cells)") in lines
    assert "  table8  CoDA Table 8: centering of E and N, development accuracy (%) (6 cells)" \
        in lines
    assert "  paper  snli, mnli, scitail, dnli" in lines
    assert "  smoke  snli, mnli, scitail, dnli" in lines
    assert f"  {NAMES}" in lines  # the attention names

    runs = tmp_path / "runs" / "coda_nli"
    code, out, err = done["predict"]
    assert code == 1 and err == [
        "coda_nli.py: predict is not offered (no model here implements prediction); use test "
        "--ckpt_path CKPT, or fit --run.test_after_fit true: the test metrics go to "
        f"{runs}/<group>/<name>/metrics.csv and the predictions to predictions-test.jsonl "
        "beside it"]
    code, out, err = done["no dataset"]
    assert code == 1 and err == [NEEDS_DATASET]
    code, out, err = done["attention"]
    assert code == 1 and err == [UNKNOWN_CODS]


# -- help --------------------------------------------------------------------------------------
def test_no_arguments_print_the_overview_and_fail(capsys):
    with pytest.raises(SystemExit) as done:
        run_script(NLI, [])
    assert done.value.code == 2
    out = capsys.readouterr().out
    assert out.startswith("usage: coda_nli.py <command> ...")
    assert "(8 cells)" in out and "examples:" in out


def test_overview_of_a_single_dataset_experiment(capsys):
    run_script(coda_mt.EXPERIMENT, ["--help"])
    lines = capsys.readouterr().out.splitlines()
    assert "  table4         CoDA Table 4: IWSLT'15 En-Vi, test BLEU (tst2013) (2 cells)" in lines
    assert "  paper, small, smoke" in lines  # the configs, no dataset folders
    assert any("--model.cross_attention" in line for line in lines)


@pytest.mark.parametrize("command", ["grid", "cell", "sweep", "report"])
def test_runner_subcommand_help_lists_grids_and_configs(command, capsys):
    with pytest.raises(SystemExit) as done:
        run_script(NLI, [command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: coda_nli.py {command} ")
    assert "one of: table3, table8, table9" in out
    assert "config name: paper, smoke (default: paper)" in out
    assert ("  table9  CoDA Table 9 on SNLI: composition functions F_E(E) * F_N(N), development "
            "accuracy (%) (8 cells)") in out.splitlines()
    if command == "cell":
        assert "cells: snli-softmax, snli-coda, mnli-softmax" in out


def test_lightning_help_offers_no_predict(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["coda_nli.py"])
    with pytest.raises(SystemExit):
        run_cli(NLI, ["--help"])
    out = capsys.readouterr().out
    assert "{fit,validate,test}" in out and "predict" not in out


# -- one-line errors ---------------------------------------------------------------------------
def test_unknown_command_grid_and_config(runs, capsys):
    assert error(NLI, ["fitt"]) == ("coda_nli.py: unknown command 'fitt'; commands: "
                                    f"{', '.join(COMMANDS)} (see coda_nli.py --help)")
    grids = "coda_nli has no grid 'table99'; grids: table3, table8, table9"
    configs = ("coda_nli has no config 'papr'; configs: paper, smoke "
               f"({CONFIGS}/<config>.yaml)")
    for command in ("grid", "cell", "sweep", "report", "keep"):
        cell = {"cell": ["--cell", "snli-coda"], "keep": ["--to", str(runs)]}.get(command, [])
        assert error(NLI, [command, "table99", *cell]) == grids
        assert error(NLI, [command, "table3", "--config", "papr", *cell]) == configs
    assert not runs.exists()  # nothing launched, no empty run folder
    with pytest.raises(SystemExit) as done:  # argparse's own errors: one line too
        run_script(NLI, ["grid"])
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "coda_nli.py grid: the following arguments are required: grid "
        "(see coda_nli.py grid --help)"]


def test_predict_of_a_translation_experiment_names_the_hypotheses_file(runs):
    assert error(coda_mt.EXPERIMENT, ["predict"]).endswith(
        f"{runs}/coda_mt/<group>/<name>/metrics.csv and the predictions to "
        "hypotheses-test.jsonl (where BLEU is scored), else predictions-test.jsonl beside it")


def test_missing_dataset_config(monkeypatch):
    assert error(NLI, ["fit", "--config", SMOKE]) == NEEDS_DATASET
    assert error(NLI, ["test", "--config=" + SMOKE, "--ckpt_path", "x.ckpt"]) == \
        NEEDS_DATASET.replace(" fit ", " test ")
    # the real-data example of docs/data.md: a data_dir, no dataset
    assert error(NLI, ["fit", "--config", f"{CONFIGS}/paper.yaml", "--data.data_dir",
                       "/data/snli_1.0"]) == NEEDS_DATASET.replace("/smoke/", "/paper/")
    assert error(NLI, ["fit"]) == (
        f"coda_nli.py fit needs a config and a dataset: add --config {CONFIGS}/<config>.yaml "
        f"--config {CONFIGS}/<config>/<dataset>.yaml (configs: paper, smoke; datasets: snli, "
        "mnli, scitail, dnli)")
    # the abstract DataModule named outright: caught after parsing
    monkeypatch.setattr(sys, "argv", ["coda_nli.py"])
    with pytest.raises(SystemExit) as done:
        run_cli(NLI, ["fit", "--config", SMOKE, "--data", "NLIDataModule", "--run.wandb=false"])
    assert done.value.code == NEEDS_DATASET
    # a dataset given: no complaint
    check_dataset_args(NLI, "fit", ["--config", SMOKE, "--config", SNLI])
    check_dataset_args(NLI, "fit", ["--config", SMOKE, "--data", "SNLIDataModule"])


def test_a_config_given_with_c_counts():
    """``-c FILE`` is ``--config FILE`` to LightningCLI: the dataset check reads it too (it once
    read only ``--config``: ``-c SMOKE -c SNLI`` was told to add a dataset)."""
    check_dataset_args(NLI, "fit", ["-c", SMOKE, "-c", SNLI])
    check_dataset_args(NLI, "fit", ["-c", SMOKE, "--config", SNLI])
    with pytest.raises(SystemExit) as done:
        check_dataset_args(NLI, "fit", ["-c", SMOKE])
    assert done.value.code == NEEDS_DATASET


def test_the_checks_read_each_config_file_once(monkeypatch):
    """The command line is read once for every check before LightningCLI: each config file
    once (the dataset and the attention checks each read them before)."""
    read, real = [], Path.read_text

    def counted(path, *args, **kwargs):
        read.append(path.name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counted)
    assert error(NLI, ["fit", "--config", SMOKE, "-c", SNLI, "--model.attention", "cods"]) == (
        UNKNOWN_CODS)
    assert sorted(read) == ["smoke.yaml", "snli.yaml"]


def test_unknown_attention_name_or_option(tmp_path):
    base = ["fit", "--config", SMOKE, "--config", SNLI]
    assert error(NLI, [*base, "--model.attention", "cods"]) == UNKNOWN_CODS
    assert error(NLI, [*base, "--model.attention=cods"]) == UNKNOWN_CODS.replace(
        "attention cods:", "attention=cods:")
    assert error(NLI, [*base, "--model.attention", "coda", "--model.attention.gatee",
                       "centered"]) == (
        "coda_nli.py fit: --model.attention.gatee: coda has no option 'gatee' (did you mean "
        f"'gate'?); options of coda: {CODA_OPTIONS}")
    # an option of another mechanism than the configured one (softmax)
    assert error(NLI, [*base, "--model.attention.gate", "centered"]) == (
        "coda_nli.py fit: --model.attention.gate: softmax has no option 'gate': softmax takes "
        "no options; gate is an option of coda: choose one first (--model.attention coda)")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  attention:\n    class_path: attention.coda.coda\n"
                   "    init_args: {centre_e: true}\n")
    assert error(NLI, [*base, "--config", str(bad)]) == (
        f"coda_nli.py fit: {bad}: model.attention: coda has no option 'centre_e' (did you mean "
        f"'center_e'?); options of coda: {CODA_OPTIONS}")
    # subclass-mode models and the Transformers' other attention flags
    assert error(decomp_snli.EXPERIMENT, [
        "fit", "--config", "experiments/configs/decomp_snli/smoke.yaml",
        "--model.init_args.attention", "windw"]) == (
        "decomp_snli.py fit: --model.init_args.attention windw: unknown attention 'windw' "
        f"(did you mean 'window'?); registered: {NAMES}")
    assert error(coda_mt.EXPERIMENT, [
        "fit", "--config", "experiments/configs/coda_mt/smoke.yaml", "--model.cross_attention",
        "nope"]) == (f"coda_mt.py fit: --model.cross_attention nope: unknown attention 'nope'; "
                     f"registered: {NAMES}")


def test_registry_errors_name_the_valid_values():
    with pytest.raises(ValueError, match=r"^unknown attention 'cods' \(did you mean 'coda'\?\); "
                                         "registered: softmax, coda, "):
        build("cods")
    with pytest.raises(TypeError) as err:
        build("coda", gatee="centered")
    assert str(err.value) == ("coda has no option 'gatee' (did you mean 'gate'?); options of "
                              f"coda: {CODA_OPTIONS}")


def test_valid_attention_forms_still_parse(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["coda_nli.py"])
    dict_form = tmp_path / "coda.yaml"
    dict_form.write_text("model:\n  attention:\n    class_path: attention.coda.coda\n"
                         "    init_args: {gate: centered, center_e: true}\n")
    base = ["fit", "--config", SMOKE, "--config", SNLI]
    forms = [(("centered", False), ["--model.attention", "coda", "--model.attention.gate",
                                    "centered"]),
             ((None, True), ["--model.attention=coda", "--model.attention.center_e=true"]),
             (("centered", True), ["--config", str(dict_form)]),
             (("centered", False), ["--model.attention", "attention.coda.coda",
                                    "--model.attention.init_args.gate", "centered"]),
             (("centered", False), ['--model.attention={"class_path": "coda", '
                                    '"init_args": {"gate": "centered"}}'])]
    for expected, form in forms:
        capsys.readouterr()
        with pytest.raises(SystemExit) as done:
            run_script(NLI, [*base, *form, "--print_config"])
        assert done.value.code in (0, None), form
        attention = yaml.safe_load(capsys.readouterr().out)["model"]["attention"]
        assert attention["class_path"] == "attention.coda.coda", form
        assert (attention["init_args"]["gate"], attention["init_args"]["center_e"]) == \
            expected, form


@pytest.mark.parametrize("module", ["attention_compare", "coda_mlu", "coda_mt", "coda_nli",
                                    "coda_sentiment", "coda_text2code", "decomp_snli",
                                    "dwin_classification", "dwin_lm", "dwin_mt", "qadm_mt"])
def test_every_cell_command_passes_the_checks(module):
    """No false alarm: the grids' own commands (smoke and paper) pass both checks."""
    import importlib

    experiment = importlib.import_module(f"experiments.{module}").EXPERIMENT
    for config in ("smoke", "paper"):
        for grid in experiment.grids.values():
            for cell in grid.cells:
                args = cell_command(experiment, grid, cell, 0, config)[3:]
                check_dataset_args(experiment, "fit", args)
                check_attention_args(experiment, "fit", args)


# -- report and sweep --------------------------------------------------------------------------
def test_report_names_the_configs_that_have_runs(runs, capsys):
    run_dir = runs / "coda_nli" / "table3-smoke" / "snli-coda-seed0"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.csv").write_text("step,test/acc\n5,0.5\n")
    (runs / "coda_nli" / "table8-smoke").mkdir()  # a folder without runs does not count
    run_script(NLI, ["report", "table3"])
    assert capsys.readouterr().out.splitlines() == [
        "no runs of table3 with config paper; runs exist for: smoke (use --smoke or --config "
        "smoke)"]
    run_script(NLI, ["report", "table3", "--smoke"])  # runs exist: the table as before
    out = capsys.readouterr().out
    assert "| snli-coda | 85.71 | 50.00 (n=1) | - | not run |" in out
    run_script(NLI, ["report"])  # every grid: one line each, none has runs with paper
    out = capsys.readouterr().out.split("\n\n")
    assert out[0].startswith("no runs of table3 with config paper; runs exist for: smoke")
    assert out[1] == (f"no runs of table8 yet, with any config (under {runs}/coda_nli); run "
                      "it: python experiments/coda_nli.py grid table8")
    assert len(out) == 3 and "\n" not in out[1]


def test_sweep_writes_beside_the_runs_and_is_never_a_config(runs, tmp_path, capsys,
                                                            monkeypatch):
    run_script(coda_mlu.EXPERIMENT, ["sweep", "table6", "--smoke"])
    path = runs / "coda_mlu" / "sweeps" / "table6-smoke.yaml"
    assert capsys.readouterr().out.startswith(f"wrote {path}\n")
    assert yaml.safe_load(path.read_text())["parameters"]["cell"]["values"] == [
        "transformer", "coda"]
    # --cells, --seeds and --threads as in grid; grid's ways of running (--jobs, ...) are
    # not offered
    run_script(coda_mlu.EXPERIMENT,
               ["sweep", "table6", "--smoke", "--cells", "coda", "--seeds", "3"])
    params = yaml.safe_load(path.read_text())["parameters"]
    assert params == {"cell": {"values": ["coda"]}, "seed": {"values": [0, 1, 2]}}
    capsys.readouterr()
    for args in (["--jobs", "2"], ["--dry-run"], ["--skip-done"], ["--force"]):
        with pytest.raises(SystemExit):
            run_script(coda_mlu.EXPERIMENT, ["sweep", "table6", "--smoke", *args])
        assert f"unrecognized arguments: {args[0]}" in capsys.readouterr().err
    assert error(coda_mlu.EXPERIMENT, ["sweep", "table6", "--smoke", "--cells", "cod"]) == \
        "grid 'table6' has no cell 'cod'; cells: transformer, coda"
    # a sweep file among the configs (as older versions wrote them) is not listed
    configs = tmp_path / "configs"
    configs.mkdir()
    for name in ("paper", "smoke", "sweep-table6-paper"):
        (configs / f"{name}.yaml").write_text("trainer: {}\n")
    monkeypatch.setattr(Experiment, "config_dir", property(lambda self: configs))
    assert coda_mlu.EXPERIMENT.configs() == ["paper", "smoke"]
    assert error(coda_mlu.EXPERIMENT, ["grid", "table6", "--config", "sweep-table6-paper"]) \
        .startswith("coda_mlu has no config 'sweep-table6-paper'; configs: paper, smoke (")
    run_script(coda_mlu.EXPERIMENT, ["--help"])
    assert "sweep-" not in capsys.readouterr().out


# -- bad configuration (issue 16, item 5): one line, no traceback ------------------------------
MLU = coda_mlu.EXPERIMENT
MLU_SMOKE = ["fit", "--config", "experiments/configs/coda_mlu/smoke.yaml"]
DEBUG_HINT = " (ATTNREPRO_DEBUG=1 shows the traceback)"


@pytest.mark.parametrize("args,message", [
    (["--model.d_model", "0"], "d_model must be at least 1, got 0"),
    (["--model.d_model", "-8"], "d_model must be at least 1, got -8"),
    (["--model.n_heads", "0"], "n_heads must be at least 1, got 0"),
    (["--model.n_heads", "3"], "d_model 32 is not divisible by n_heads 3"),
    (["--model.d_ff", "0"], "d_ff must be at least 1, got 0"),
    (["--model.n_encoder_layers", "-1"], "n_encoder_layers must be at least 1, got -1"),
    (["--model.n_decoder_layers", "0"], "n_decoder_layers must be at least 1, got 0"),
    (["--data.train_size", "0"],
     "MLUDataModule: train_size must be at least 1 (or give train_file), got 0"),
    (["--model.attention", "window", "--model.attention.segment_size", "2"],
     "window: segment_size=2 with causal attention: the decoder cannot point to unfinished "
     "segments (Sec. 4.3); use segment_size=1 for decoder self-attention"),
    (["--model.attention", "density"],
     "attention 'density' (scheme='mqt') cannot be used for causal multihead attention: the "
     "rows j averaged over depend on the query, so the per-source sums P_k do not apply and "
     "the exact sum costs Lq*Lk^2*d per head; use scheme='aqt' or another mechanism for causal "
     "self-attention"),
])
def test_a_refused_configuration_is_one_line_before_training(runs, args, message):
    assert error(MLU, [*MLU_SMOKE, *args]) == (
        f"coda_mlu.py: invalid configuration: {message}{DEBUG_HINT}")
    assert not list(runs.glob("**/metrics.csv"))  # nothing trained


def test_relative_cross_attention_is_refused_in_one_line(runs):
    message = error(coda_mt.EXPERIMENT, [
        "fit", "--config", "experiments/configs/coda_mt/smoke.yaml", "--model.cross_attention",
        "relative"])
    assert message.startswith("coda_mt.py: invalid configuration: attention 'relative' cannot "
                              "be used for multi-head cross attention"), message


def test_debug_shows_the_traceback(runs, monkeypatch):
    monkeypatch.setenv("ATTNREPRO_DEBUG", "1")
    with pytest.raises(ValueError, match="d_model must be at least 1, got 0"):
        run_script(MLU, [*MLU_SMOKE, "--model.d_model", "0"])


@pytest.mark.parametrize("args,lines", [
    (["--model.dropoutt", "0.1"],
     ["coda_mlu.py fit: error: unrecognized arguments: --model.dropoutt 0.1; model.dropoutt: "
      "did you mean --model.dropout?"]),
    (["--trainer.max_stepz", "3"],
     ["coda_mlu.py fit: error: unrecognized arguments: --trainer.max_stepz 3; "
      "trainer.max_stepz: did you mean --trainer.max_steps or --trainer.max_time or "
      "--trainer.min_steps?"]),
    (["--config", "nonexist.yaml"],
     [f"coda_mlu.py fit: error: --config: no such file '{ROOT / 'nonexist.yaml'}'; the "
      "configs of coda_mlu: curve, demo, paper, smoke, study, table6_100k "
      "(experiments/configs/coda_mlu/<config>.yaml, and a dataset of a multi-dataset config: "
      "<config>/<dataset>.yaml)"]),
    (["--model.attention", "coda", "--model.attention.gate", "bogus"],  # a Union's Literal
     ["coda_mlu.py fit: error: --model.attention.gate: 'bogus' is not one of plain, "
      "centered, scaled"]),
    (["--model.attention", "window", "--model.attention.variant", "xx"],
     ["coda_mlu.py fit: error: --model.attention.variant: 'xx' is not one of mw, aw"]),
    (["--model.norm", "mid"],
     ["coda_mlu.py fit: error: --model.norm: 'mid' is not one of pre, post"]),
    (["--config", "{bad}"],
     ["coda_mlu.py fit: error: Subcommand 'fit' does not accept option 'model.dropoutt' (the "
      "key 'model.dropoutt' of {bad}); model.dropoutt: did you mean --model.dropout?"]),
    (["-c", "{bad}"],  # -c is --config: its file is named too
     ["coda_mlu.py fit: error: Subcommand 'fit' does not accept option 'model.dropoutt' (the "
      "key 'model.dropoutt' of {bad}); model.dropoutt: did you mean --model.dropout?"]),
    (["--model.d_model", "abc"],  # a value of the wrong type (was three lines)
     ["coda_mlu.py fit: error: --model.d_model: expected an integer, got 'abc'"]),
    (["--model.attention_layers", "x"],  # int | None (was the tree of Union subtypes)
     ["coda_mlu.py fit: error: --model.attention_layers: expected an integer or null, got 'x'"]),
])
def test_an_unknown_option_or_file_is_two_lines(runs, tmp_path, capsys, monkeypatch, args,
                                                 lines):
    monkeypatch.chdir(ROOT)
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  dropoutt: 0.1\n")
    args = [a.replace("{bad}", str(bad)) for a in args]
    with pytest.raises(SystemExit) as done:
        run_script(MLU, [*MLU_SMOKE, *args])
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        *(line.replace("{bad}", str(bad)) for line in lines),
        "(every option: coda_mlu.py fit --help full)"]


def test_a_bad_data_file_is_one_line_from_the_script(env, tmp_path):
    """Issue 16 item 4 at the command: the reader's error, no traceback."""
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"x=1,y=2,x+y:3\nx=1,y=2,x+y:3 \xe9\n")
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "coda_mlu.py"), *MLU_SMOKE,
                           "--data.train_file", str(bad)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"coda_mlu.py: {bad}:2: expected UTF-8 text, got \"b'x=1,y=2,x+y:3 \\\\xe9\\\\n'\"")


@pytest.mark.parametrize("experiment, argv, path", [
    (MLU, [*MLU_SMOKE, "--data.train_file", "{locked}/train.txt"], "{locked}/train.txt"),
    (NLI, ["fit", "--config", f"{CONFIGS}/smoke.yaml", "--config", f"{CONFIGS}/smoke/snli.yaml",
           "--data.data_dir", "{locked}"], "{locked}/snli_1.0_dev.first1288.jsonl"),
])
def test_a_file_in_a_folder_this_process_may_not_read(runs, tmp_path, monkeypatch, experiment,
                                                      argv, path):
    """A folder above the data that the process may not enter: ``Path.exists`` raises
    PermissionError before a reader can name the file (seen as another user: a 16-frame
    traceback from the MLU reader, "invalid configuration: [Errno 13] ..." from SNLI's).
    Tests run as root, whom permissions do not stop: ``exists`` refuses the folder as the
    system would refuse another user."""
    monkeypatch.chdir(ROOT)
    locked = tmp_path / "locked"
    real = Path.exists

    def exists(self, *args, **kwargs):
        if self.is_relative_to(locked) and self != locked:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "exists", exists)
    argv = [a.replace("{locked}", str(locked)) for a in argv]
    assert error(experiment, argv) == (
        f"{experiment.name}.py: {path.format(locked=locked)}: permission denied: this process "
        "may not read it, or a folder above it")


def test_a_nan_training_loss_is_one_line_naming_the_step(env, tmp_path):
    """Issue 16 item 6 at the command: a learning rate of 1e20 makes the first update blow
    the weights up; the next step's loss is NaN and the run stops there, naming the step and
    the last finite loss (the smoke config's first loss, seed 0)."""
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "coda_mlu.py"), *MLU_SMOKE,
                           "--model.lr", "1e20", "--run.wandb", "false"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "coda_mlu.py: training loss is nan at step 1 (last finite loss 4.1998 at step 0); "
        "training stopped before this step's backward pass and update")
    assert not list((tmp_path / "runs").rglob("*.ckpt"))  # nothing saved after the NaN
