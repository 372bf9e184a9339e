"""The benchmark harness on tiny sizes: every row has the documented keys, the baselines'
ratios are exactly 1, and the markdown report is written (no timing assertions)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"mechanism", "context", "B", "H", "L", "d", "fwd_bwd_ms", "peak_mb",
        "ratio_time_vs_softmax", "ratio_mem_vs_softmax"}


def run_harness(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ATTNREPRO_COMPILE": "0"}  # CoDA's kernels eagerly: no compile time
    return subprocess.run([sys.executable, "-m", "benchmarks.attention", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    report = tmp_path_factory.mktemp("bench") / "README.md"
    proc = run_harness("--quick", "--json", "--mechanisms", "softmax,coda",
                       "--markdown", str(report))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in proc.stdout.splitlines()], report


def test_rows_have_the_keys_and_every_context(quick):
    rows, _ = quick
    for row in rows:
        assert KEYS <= row.keys(), row
        assert row["fwd_bwd_ms"] > 0 and row["peak_mb"] is not None and "others_cpu" in row
    seen = {(r["mechanism"], r["context"]) for r in rows}
    for context in ("multihead", "alignment", "decoder", "decoder_step"):
        assert {("softmax", context), ("coda", context)} <= seen
    assert sorted({r["L"] for r in rows if r["context"] == "multihead"}) == [8, 16]


def test_baselines_have_ratio_one(quick):
    rows, _ = quick
    softmax = [r for r in rows if r["mechanism"] == "softmax" and r["context"] in
               ("multihead", "alignment")]
    assert len(softmax) == 3
    for row in softmax + [r for r in rows if r["mechanism"] == r["baseline"]]:
        assert row["ratio_time_vs_softmax"] == 1.0 and row["ratio_mem_vs_softmax"] == 1.0
    coda = next(r for r in rows if r["mechanism"] == "coda" and r["context"] == "multihead")
    base = next(r for r in softmax if r["L"] == coda["L"])
    assert coda["ratio_time_vs_softmax"] == pytest.approx(coda["fwd_bwd_ms"] / base["fwd_bwd_ms"])


def test_markdown_report(quick):
    _, report = quick
    text = report.read_text()
    assert "## Method" in text and "VmHWM" in text and "torch" in text
    assert "| coda | 8 |" in text and "## decoder_step" in text


def test_one_isolated_case():
    proc = run_harness("--quick", "--json", "--isolate", "--mechanisms", "softmax",
                       "--lengths", "4", "--contexts", "multihead")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert row["context"] == "multihead" and row["L"] == 4 and row["peak_mb"] is not None


@pytest.mark.parametrize("args,message", [
    (["--mechanisms", "nonesuch"], "unknown mechanism"),
    (["--lengths", "8,x"], "--lengths"),
    (["--contexts", "multihead,nowhere"], "--contexts"),
])
def test_bad_arguments_are_named(capsys, args, message):
    from benchmarks.attention import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--quick", *args])
    assert exit_info.value.code != 0 and message in capsys.readouterr().err


def test_nli_step_benchmark_times_every_model_against_vanilla(shared):
    shared("snli/snli_1.0_dev.first1288.jsonl")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.nli_step", "--json", "--steps", "3",
                           "--warmup", "1", "--hidden", "8"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["model"] for r in rows] == ["vanilla", "exact K=3", "latent K=4", "exact K=4"]
    assert rows[0]["ratio_vs_vanilla"] == 1.0
    assert all(r["steps"] == 3 and r["step_ms"] > 0 for r in rows)


def test_model_cost_benchmark_interleaves_every_mechanism_against_softmax(shared):
    """benchmarks.model_cost on tiny sizes: every mechanism of the cost grid timed on the
    same SST batches, softmax's ratio 1 with a zero-width interval, each interval around its
    ratio; a bad mechanism list is one line naming the valid ones."""
    shared("sst_ptb")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.model_cost", "--json", "--rounds",
                           "2", "--steps", "2", "--warmup", "1", "--d-model", "16",
                           "--threads", "1"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["mechanism"] for r in rows] == ["softmax", "relative", "localness", "window-mw",
                                              "window-aw", "coda"]
    assert rows[0]["ratio_vs_softmax"] == rows[0]["ratio_low"] == rows[0]["ratio_high"] == 1.0
    for r in rows:
        assert r["steps"] == 4 and r["steps_per_s"] > 0  # 2 rounds x 2 batches
        assert r["ratio_low"] <= r["ratio_vs_softmax"] <= r["ratio_high"]
    bad = subprocess.run([sys.executable, "-m", "benchmarks.model_cost", "--mechanisms",
                          "window-aw,nope"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode != 0 and "--mechanisms must include 'softmax'" in bad.stderr


def test_model_cost_cells_become_the_models_arguments():
    """Each cell of dwin_mt's cost grid, as model_cost builds it: the mechanism and its
    options per module, the layers, numbers as numbers; a malformed flag in one line."""
    from benchmarks.model_cost import cell_arguments
    from lit_models.mt_rows import COST_ROWS

    assert cell_arguments(COST_ROWS["transformer"]) == {}
    assert cell_arguments(COST_ROWS["coda"]) == {"attention": {"name": "coda"}}
    assert cell_arguments(COST_ROWS["enc_mw"]) == {
        "encoder_attention": {"name": "window", "variant": "mw"}, "attention_layers": 3}
    assert cell_arguments(COST_ROWS["enc_aw-cr_aw_seg-dec_mw"]) == {
        "encoder_attention": {"name": "window", "variant": "aw"},
        "cross_attention": {"name": "window", "variant": "aw", "segment_size": 5},
        "decoder_attention": {"name": "window", "variant": "mw"}, "attention_layers": 3}
    with pytest.raises(ValueError, match="--model.NAME=VALUE"):
        cell_arguments(["--trainer.max_steps=3"])


def test_model_cost_times_the_translation_cells(shared):
    """--model translation: the speed config's Transformer base on newstest2014 En-De
    batches, the Transformer the baseline, the paper's window model with more parameters
    (its boundary and local projections)."""
    shared("wmt14_en_de")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.model_cost", "--model",
                           "translation", "--json", "--rounds", "1", "--steps", "1", "--warmup",
                           "0", "--threads", "1", "--mechanisms",
                           "transformer,enc_aw-cr_aw_seg-dec_mw"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["mechanism"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert list(rows) == ["transformer", "enc_aw-cr_aw_seg-dec_mw"]
    base, window = rows["transformer"], rows["enc_aw-cr_aw_seg-dec_mw"]
    assert base["ratio_vs_softmax"] == 1.0 and window["steps"] == 1
    assert window["parameters"] > base["parameters"] > 40_000_000
    bad = subprocess.run([sys.executable, "-m", "benchmarks.model_cost", "--model",
                          "translation", "--mechanisms", "enc_aw"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "--mechanisms must include 'transformer'" in bad.stderr


def test_decoding_benchmark_times_cached_against_full_decoding(tmp_path):
    """benchmarks.decoding on tiny sizes: greedy and beam 4, each cached and re-forwarded,
    ratios against cached greedy of the same run, the markdown section appended."""
    report = tmp_path / "README.md"
    report.write_text("# before\n")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.decoding", "--quick", "--json",
                           "--markdown", str(report)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["beam"], r["cached"]) for r in rows] == [(1, True), (1, False), (4, True),
                                                         (4, False)]
    assert rows[0]["ratio_vs_cached_greedy"] == 1.0
    assert all(r["sentences_per_s"] > 0 for r in rows)
    assert {"speedup_of_cache"} <= rows[0].keys() and {"speedup_of_cache"} <= rows[2].keys()
    text = report.read_text()
    assert text.startswith("# before\n") and "## Incremental decoding" in text
    assert "| beam 4 | full re-forward |" in text


def test_profile_names_the_operators_of_each_case():
    proc = run_harness("--quick", "--profile", "--mechanisms", "softmax,coda", "--lengths", "8",
                       "--contexts", "multihead")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "== softmax multihead L=8" in proc.stdout and "== coda multihead L=8" in proc.stdout
    assert "Self CPU" in proc.stdout and "aten::" in proc.stdout


def test_interleaved_cases_take_turns_and_give_paired_intervals(tmp_path):
    """--interleave: each length's cases in one process, a time ratio with its 95% interval
    around it, the baseline exactly 1, tensor memory ratios; the markdown shows the
    interval."""
    report = tmp_path / "README.md"
    proc = run_harness("--quick", "--json", "--mechanisms", "softmax,coda,window",
                       "--contexts", "multihead", "--interleave", "3", "--markdown",
                       str(report))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    names = {"softmax", "coda", "window", "window:variant=mw"}
    assert {(r["mechanism"], r["L"]) for r in rows} == {(n, L) for n in names for L in (8, 16)}
    for row in rows:
        assert row["rounds"] == 3 and row["fwd_bwd_ms"] > 0 and row["peak_mb"] is None
        assert row["ratio_low"] <= row["ratio_time_vs_softmax"] <= row["ratio_high"]
        assert row["alloc_peak_mb"] > 0 and row["ratio_alloc_vs_softmax"] > 0
        if row["mechanism"] == "softmax":
            assert row["ratio_time_vs_softmax"] == row["ratio_low"] == row["ratio_high"] == 1.0
            assert row["ratio_alloc_vs_softmax"] == 1.0
    coda = next(r for r in rows if r["mechanism"] == "coda")
    assert f"[{coda['ratio_low']:.2f}, {coda['ratio_high']:.2f}]" in report.read_text()
    bad = run_harness("--quick", "--interleave", "0")
    assert bad.returncode == 2 and "--interleave expects a number of rounds >= 1" in bad.stderr


def test_paired_ratio_on_closed_form_cases():
    """Twice the baseline on every pair: 2 exactly, interval [2, 2]; the same times: 1;
    unpaired lengths refused in one line."""
    from benchmarks import paired_ratio

    base = [0.1, 0.3, 0.2, 0.5, 0.4]
    assert paired_ratio(base, [2 * b for b in base]) == pytest.approx((2.0, 2.0, 2.0))
    assert paired_ratio(base, base) == pytest.approx((1.0, 1.0, 1.0))
    ratio, low, high = paired_ratio(base, [b + 0.1 for b in base])
    assert ratio == pytest.approx(2.0 / 1.5) and low < ratio < high
    with pytest.raises(ValueError, match="5 baseline and 4 times"):
        paired_ratio(base, base[:4])


def test_model_cost_precision_twins_start_equal_and_step_in_their_precision():
    """``--precision 32-true,bf16-mixed``: each model's bf16-mixed twin starts from its
    weights, trains apart from it (its own optimiser), and runs its forward pass under CPU
    autocast to bfloat16 while the float32 twin's runs in float32; each twin's steps/s
    ratio to its float32 twin is the paired ratio of their step times (the baseline in
    each precision against its own kind)."""
    import torch

    from benchmarks.model_cost import Trainee, classifier_loss, summarise, twins
    from lit_models.transformer import TransformerClassifier

    torch.manual_seed(0)
    model = TransformerClassifier(vocab_size=20, num_classes=2, d_model=16, n_heads=2, d_ff=32,
                                  n_layers=1, attention="coda")
    models = twins({"coda": Trainee(model, classifier_loss(0.0), 1e-3, (0.9, 0.98))},
                   ["32-true", "bf16-mixed"])
    assert list(models) == ["coda", "coda@bf16-mixed"]
    fp32, bf16 = models["coda"], models["coda@bf16-mixed"]
    assert bf16.precision == "bf16-mixed" and bf16.model is not fp32.model
    for (name, a), b in zip(fp32.model.state_dict().items(),
                            bf16.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    seen = {}
    for key, trainee in models.items():
        trainee.model.register_forward_hook(
            lambda module, args, out, key=key: seen.update({key: out.logits.dtype}))
    batch = {"tokens": torch.randint(1, 20, (4, 7)), "mask": torch.ones(4, 7, dtype=torch.bool),
             "label": torch.tensor([0, 1, 0, 1])}
    for trainee in models.values():
        trainee.step(batch)
    assert seen == {"coda": torch.float32, "coda@bf16-mixed": torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())
    assert not torch.equal(next(fp32.model.parameters()), next(bf16.model.parameters()))

    times = {"softmax": [1.0, 1.0], "coda": [2.0, 2.0],
             "softmax@bf16-mixed": [0.5, 1.0], "coda@bf16-mixed": [1.0, 3.0]}
    rows = {(r["mechanism"], r["precision"]): r
            for r in summarise(times, precisions=("32-true", "bf16-mixed"))}
    assert "precision_ratio" not in rows["coda", "32-true"]
    assert rows["coda", "32-true"]["ratio_vs_softmax"] == pytest.approx(0.5)
    assert rows["coda", "bf16-mixed"]["ratio_vs_softmax"] == pytest.approx(1.5 / 4)
    assert rows["coda", "bf16-mixed"]["precision_ratio"] == pytest.approx(4 / 4)
    assert rows["softmax", "bf16-mixed"]["precision_ratio"] == pytest.approx(2 / 1.5)
    assert rows["softmax", "bf16-mixed"]["vs_precision"] == "32-true"


def test_floor_benchmark_states_coda_against_its_floor_and_sdpa(tmp_path):
    """benchmarks.floor on tiny sizes: CoDA, SDPA, CoDA's parts and the peak probes take
    turns; the floor is positive and split into its three terms, every ratio has its
    interval, and the written line records the machine (no timing asserted)."""
    out = tmp_path / "floor.jsonl"
    env = {**os.environ, "ATTNREPRO_COMPILE": "0"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.floor", "--quick", "--rounds", "2",
                           "--warmup", "0", "--out", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (result,) = [json.loads(line) for line in out.read_text().splitlines()]
    parts = {"l1_fwd", "gate_fwd", "mv_fwd", "l1_bwd", "gate_bwd", "mv_bwd", "l1_grads"}
    assert {"softmax", "coda", "matmul", "exp_cache"} | parts <= result["rows"].keys()
    assert not {"l1_eq_fwd", "l1_eq_bwd"} & result["rows"].keys()  # no C++: nothing fused
    assert result["floor_ms"] > 0 and set(result["floor_parts_ms"]) == {
        "products", "l1", "element-wise"}
    for key in ("coda_vs_floor", "coda_vs_softmax", "softmax_vs_its_floor"):
        r = result[key]
        assert r["low"] <= r["ratio"] <= r["high"], key
    assert result["rows"]["softmax"]["vs_softmax"]["ratio"] == 1.0
    assert result["units"]["products"] == 7 and sum(result["units"]["l1"].values()) == 11
    setting = result["setting"]
    assert setting["threads"] == 1 and "cores" in setting["machine"] and setting["commit"]


def test_floor_times_the_fused_kernels_where_coda_runs_them(monkeypatch):
    """With the C++ kernels and Eq. 1-6 fused into their tiles (float32, the paper's
    functions), the floor's parts are the fused passes, as CoDA runs them; with the fusion
    off, the separate ones."""
    from attention import _coda_l1_ext, _native
    from attention import coda as impl
    from benchmarks import floor

    if _native.compiler() is None or _coda_l1_ext.library() is None:
        pytest.skip("no C++ kernels")
    fused = floor.coda_parts(1, 2, 24, 8)
    assert list(fused) == ["l1_eq_fwd", "mv_fwd", "l1_eq_bwd", "mv_bwd", "l1_grads"]
    for probe in fused.values():
        probe.fn()
    monkeypatch.setattr(impl, "FUSED_EQ", False)
    assert list(floor.coda_parts(1, 2, 24, 8)) == ["l1_fwd", "gate_fwd", "mv_fwd", "l1_bwd",
                                                  "gate_bwd", "mv_bwd", "l1_grads"]


def test_model_cost_mfu_counts_flops_and_measures_peaks(tmp_path):
    """--mfu on the MLU Transformer (generated problems, no data files): each row has its
    FLOPs per step counted by FlopCounterMode and analytically (equal for softmax: both count
    the linear layers and SDPA), peaks of float32 and bfloat16 products from the same
    rounds, and an MFU against its precision's peak."""
    out = tmp_path / "mfu.jsonl"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.model_cost", "--model", "mlu",
                           "--mechanisms", "softmax", "--precision", "32-true,bf16-mixed",
                           "--mfu", "--rounds", "1", "--steps", "1", "--warmup", "0",
                           "--threads", "1", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["precision"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"32-true", "bf16-mixed"}
    fp32, bf16 = rows["32-true"], rows["bf16-mixed"]
    assert fp32["flops_per_step"] == bf16["flops_per_step"] > 0
    assert fp32["analytic_flops_per_step"] == pytest.approx(fp32["flops_per_step"], rel=0.02)
    assert set(fp32["peak_tflops"]) == {"float32", "bfloat16"}
    assert fp32["mfu"] == pytest.approx(fp32["model_tflops"] / fp32["peak_tflops"]["float32"])
    assert bf16["mfu"] == pytest.approx(bf16["model_tflops"] / bf16["peak_tflops"]["bfloat16"])
