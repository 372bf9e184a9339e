"""experiments/attention_compare.py (issue 45): its cells are the registry's multi-head
mechanisms with their paper defaults and CoDA with the decoder study's beta 0.25, each in
every encoder layer for 3,000 updates; the smoke grid runs end to end and is reported; the
interleaved cost (benchmarks/model_cost.py --model compare --out) reaches the report and the
accuracy-against-cost figure."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from attention import CONTEXTS, Mechanism, UnsupportedContext
from attention.registry import supporting
from experiments import attention_compare, coda_mlu
from experiments.harness.grid_model import Experiment
from experiments.harness.interleaved_cost import read_cost_file
from experiments.harness.report import format_cost_file
from experiments.harness.sources import mechanisms_supporting
from lit_models.compare_rows import mechanism_rows
from lit_models.transformer import TransformerClassifier
from tests.conftest import last_values, run
from tests.experiments.test_all_grids import parsed_config
from tests.experiments.test_claims import write_run

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "attention_compare.py"
EXPERIMENT = attention_compare.EXPERIMENT


def mechanism_of(args: list[str]) -> str:
    (name,) = [a.split("=", 1)[1] for a in args if a.startswith("--model.attention=")]
    return name


def test_cells_are_the_registrys_multihead_mechanisms():
    """One cell per mechanism the registry serves in multi-head attention (the window's two
    variants as two), then CoDA with the MLU decoder study's flags; each against softmax.
    The grid reads the mechanisms from the source (no torch at start-up): the same lists as
    the registry's, for every context, so a new mechanism becomes a cell or this fails."""
    for context in CONTEXTS:
        assert mechanisms_supporting(context) == supporting(context), context
    multihead = supporting("multihead")
    assert {"softmax", "coda", "window", "relative", "localness", "additive", "luong",
            "density", "structured"} <= set(multihead)
    rows = list(mechanism_rows(multihead))
    assert rows == [r for name in multihead
                    for r in (["window-mw", "window-aw"] if name == "window" else [name])] \
        + ["coda-beta0.25"]
    assert list(EXPERIMENT.grids) == ["sst", "imdb"]
    for data, grid in EXPERIMENT.grids.items():
        assert [c.name for c in grid.cells] == [f"{data}-{row}" for row in rows]
        assert {mechanism_of(c.args) for c in grid.cells} == set(multihead)
        assert grid.cell(f"{data}-coda-beta0.25").args[1:] == coda_mlu.CHOSEN_CODA.args
        assert grid.cell(f"{data}-window-mw").args[1:] == [
            "--model.attention=window", "--model.attention.variant=mw"]
        assert grid.claims == [(f"{data}-softmax", c.name) for c in grid.cells[1:]]
        assert all(not c.paper for c in grid.cells)  # the suite's own comparisons
        assert grid.cost_file == f"results/attention_compare_cost/{data}.jsonl"


def test_a_mechanism_without_multihead_attention_is_refused_in_one_line():
    class only_alignment(Mechanism):  # noqa: N801 - named as flag classes are
        name = "only_alignment"

    assert not only_alignment().supports("multihead")
    with pytest.raises(UnsupportedContext) as refused:
        TransformerClassifier(vocab_size=20, num_classes=2, d_model=8, n_heads=2, d_ff=16,
                              attention=only_alignment())
    message = str(refused.value)
    assert "\n" not in message and "cannot be used for multihead attention" in message
    assert message.endswith("Mechanisms that can: " + ", ".join(supporting("multihead")))


@pytest.mark.slow  # about 0.5 s a cell
@pytest.mark.parametrize("data", ["sst", "imdb"])
def test_every_paper_cell_has_its_mechanism_in_every_layer_for_3000_steps(data, capsys,
                                                                         monkeypatch):
    for cell in EXPERIMENT.grid(data).cells:
        config = parsed_config("attention_compare", data, cell.name, "paper", capsys,
                               monkeypatch)
        assert config["trainer"]["max_steps"] == 3000, cell.name
        model = config["model"]
        assert model["attention_layers"] is None and model["n_layers"] == 2, cell.name
        assert (model["d_model"], model["n_heads"], model["d_ff"]) == (128, 4, 512)
        built = TransformerClassifier(vocab_size=30, num_classes=2,
                                      **{k: v for k, v in model.items()
                                         if k not in ("vocab_size", "num_classes", "pad_id")})
        mechanisms = [layer.self_attn.mechanism for layer in built.encoder.layers]
        assert [m.name for m in mechanisms] == [mechanism_of(cell.args)] * 2, cell.name
        options = dict(re.findall(r"--model\.attention\.(\w+)=(\S+)", " ".join(cell.args)))
        for option, value in options.items():
            assert all(str(getattr(m, option)) == value for m in mechanisms), cell.name
        assert config["data"]["class_path"].endswith(
            {"sst": "SSTDataModule", "imdb": "IMDbDataModule"}[data])
    imdb = parsed_config("attention_compare", "imdb", "imdb-softmax", "paper", capsys,
                         monkeypatch)["data"]["init_args"]
    assert imdb["data_dir"] is None and imdb["val_fraction"] == 0.1  # the shared aclImdb


@pytest.mark.slow
def test_smoke_grid_and_its_report(env, tmp_path, shared):
    shared("sst_ptb/train.txt")
    cells = ["sst-softmax", "sst-window-aw", "sst-coda-beta0.25"]
    out = run(SCRIPT, ["grid", "sst", "--smoke", "--cells", *cells, "--jobs", "2"], env,
              timeout=600)
    group = tmp_path / "runs" / "attention_compare" / "sst-smoke"
    for cell in cells:
        assert f"done {cell} seed 0" in out
    report = run(SCRIPT, ["report", "sst", "--smoke"], env)
    for cell in cells:
        ours = 100 * last_values(group / f"{cell}-seed0" / "metrics.csv")["test/acc"]
        assert f"| {cell} | - | {ours:.2f} (n=1) |" in report
    assert "| sst-density | - | not run |" in report
    assert "| sst-window-aw vs sst-softmax | Acc | - | " in report
    assert "| sst-coda vs sst-softmax | Acc | - | not run (no seed of both cells) |" in report
    assert "Training cost, interleaved" in report


def cost_grid(tmp_path: Path) -> tuple[Experiment, Path]:
    """The experiment with its sst grid's cost file in tmp_path."""
    path = tmp_path / "sst.jsonl"
    grids = {name: replace(g, cost_file=str(path) if name == "sst" else str(tmp_path / "none"))
             for name, g in EXPERIMENT.grids.items()}
    return replace(EXPERIMENT, grids=grids), path


@pytest.mark.slow
def test_benchmark_writes_the_cost_file_report_prints(tmp_path):
    """benchmarks.model_cost --model compare: the smoke config's classifier per row on the
    aclImdb fixture, each row naming its cell and setting; report prints them; bad options
    are one line."""
    out = tmp_path / "imdb.jsonl"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.model_cost", "--model", "compare",
                           "--data", "imdb", "--config", "smoke", "--rounds", "1", "--steps",
                           "2", "--warmup", "1", "--threads", "1", "--mechanisms",
                           "softmax,window-aw,coda-beta0.25", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["cell"] for r in rows] == ["imdb-softmax", "imdb-window-aw", "imdb-coda-beta0.25"]
    assert {r["baseline"] for r in rows} == {"imdb-softmax"}
    assert rows[0]["ratio_vs_softmax"] == 1.0 and all(r["steps"] == 2 for r in rows)
    assert rows[1]["parameters"] > rows[0]["parameters"] == rows[2]["parameters"]
    assert all(r["step_tensor_mb"] > 0 for r in rows)
    setting = rows[0]["setting"]
    assert (setting["config"], setting["data"], setting["threads"]) == ("smoke", "imdb", 1)
    assert setting["command"].startswith("python -m benchmarks.model_cost --model compare")
    grid = replace(EXPERIMENT.grid("imdb"), cost_file=str(out))
    assert list(read_cost_file(grid)) == [r["cell"] for r in rows]
    text = format_cost_file(grid)
    assert f"| imdb-window-aw | {rows[1]['parameters'] / 1e6:.3f} |" in text
    assert "| imdb-density | not measured |" in text and setting["machine"] in text
    for bad, said in ((["--model", "sst", "--data", "imdb"], "--model compare only"),
                      (["--model", "compare", "--mechanisms", "coda"], "must include 'softmax'"),
                      (["--model", "compare", "--config", "nope"], "no config")):
        proc = subprocess.run([sys.executable, "-m", "benchmarks.model_cost", *bad], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode != 0 and said in proc.stderr.strip().splitlines()[-1], bad


def test_cost_file_and_tradeoff_figure_on_written_runs(tmp_path, monkeypatch):
    """On written run files: the report's interleaved cost table, and the figure's points:
    each claim's paired difference against its step-time ratio (1 / the steps/s ratio), one
    panel per dataset, what is missing named."""
    monkeypatch.setenv("ATTNREPRO_RUNS", str(tmp_path / "runs"))
    experiment, path = cost_grid(tmp_path)
    grid = experiment.grid("sst")
    group = tmp_path / "runs" / "attention_compare" / "sst-paper"
    half = [i % 2 == 0 for i in range(40)]
    for seed in (0, 1):
        write_run(group / f"sst-softmax-seed{seed}", half)
        write_run(group / f"sst-coda-seed{seed}", [True] * 40)
        write_run(group / f"sst-density-seed{seed}", half)
    setting = {"command": "python -m benchmarks.model_cost --model compare", "config": "paper",
               "steps": 120, "machine": "a CPU", "threads": 1, "date": "today",
               "commit": "abc1234"}

    def row(cell, steps_per_s, ratio, low, high, mb):
        return json.dumps({"cell": f"sst-{cell}", "baseline": "sst-softmax",
                           "parameters": 1_234_567, "steps_per_s": steps_per_s,
                           "ratio_vs_softmax": ratio, "ratio_low": low, "ratio_high": high,
                           "step_tensor_mb": mb, "setting": setting}) + "\n"

    path.write_text(row("softmax", 10.0, 1.0, 1.0, 1.0, 40.0)
                    + row("coda", 8.0, 0.8, 0.75, 0.85, 50.0))
    text = format_cost_file(grid)
    assert "| sst-coda | 1.235 | 8.00 | 0.80x [0.75, 0.85] | 50.0 | 1.25x |" in text
    assert "| sst-density | not measured | | | | |" in text
    assert "python -m benchmarks.model_cost --model compare" in text and "a CPU" in text
    from experiments.harness.plots import grid_plots, plot_tradeoff

    fig, missing = plot_tradeoff(experiment, "paper")
    sst, imdb = fig.axes
    points = [line for line in sst.get_lines() if line.get_marker() == "o"]
    assert len(points) == 1  # coda: run and measured
    assert points[0].get_xdata()[0] == pytest.approx(1 / 0.8)
    assert points[0].get_ydata()[0] == pytest.approx(50.0)
    assert "sst-density (no cost)" in missing and "sst-luong (not run)" in missing
    assert "imdb-coda (not run)" in missing
    assert not [line for line in imdb.get_lines() if line.get_marker() == "o"]
    plots = grid_plots(experiment, grid, "paper")
    assert "tradeoff" in plots.figures and any(m.startswith("tradeoff:") for m in plots.missing)
    # a grid without a cost file draws no such figure
    assert "tradeoff" not in grid_plots(
        replace(experiment, grids={"sst": replace(grid, cost_file=None)}),
        replace(grid, cost_file=None), "paper").figures


def test_a_bad_cost_file_is_one_line(tmp_path):
    experiment, path = cost_grid(tmp_path)
    grid = experiment.grid("sst")
    assert "not measured yet" in format_cost_file(replace(grid, cost_file=str(tmp_path / "no")))
    for text, said in (("{not json\n", "line 1: not JSON"),
                       ('{"cell": "sst-coda"}\n', "line 1: no baseline, parameters"),
                       (json.dumps({k: 1 for k in ("parameters", "steps_per_s",
                                                   "ratio_vs_softmax", "ratio_low",
                                                   "ratio_high", "step_tensor_mb", "setting")}
                                   | {"cell": "sst-nope", "baseline": "sst-softmax"}),
                        "cell 'sst-nope' (baseline 'sst-softmax') is not a cell of grid sst")):
        path.write_text(text)
        with pytest.raises(SystemExit) as stop:
            read_cost_file(grid)
        assert said in str(stop.value) and "\n" not in str(stop.value), text
