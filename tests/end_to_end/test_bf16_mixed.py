"""``--trainer.precision bf16-mixed`` end to end (issue 50, item 2), one run per architecture:
the Transformer classifier, sequence-to-sequence model and language model, DecompAtt, the
LSTM translator and DecaProp, each an experiment script's ``fit`` on its smoke config and
synthetic data with a mechanism that has kernels of its own (CoDA's C++ L1 kernels, the
window's row kernels, the density matrix's), 4 training steps, validation after 2 and 4,
and the test split after fit (greedy or beam decoding under autocast too).

That autocast really ran is seen from inside the training process
(tests/end_to_end/autocast_probe.py): the forward passes ran under CPU autocast to bfloat16
and some submodule returned bfloat16 tensors; every training loss and every logged
validation and test metric is finite.  The mechanisms alone, in every context, under
autocast: tests/attention/test_numerics.py."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from tests.conftest import ROOT, last_values, run

SCRIPTS = ROOT / "experiments"
CONFIGS = SCRIPTS / "configs"

pytestmark = pytest.mark.slow

#: architecture -> (script, configs under experiments/configs, the mechanism flag)
ARCHITECTURES = {
    "transformer-classifier": ("coda_sentiment", ["smoke", "smoke/imdb"], "coda"),
    "transformer-seq2seq": ("coda_mlu", ["smoke"], "coda"),
    "transformer-lm": ("dwin_lm", ["smoke"], "window"),
    "decompatt": ("coda_nli", ["smoke", "smoke/dnli"], "coda"),
    "lstm-seq2seq": ("qadm_mt", ["smoke", "smoke/en_ro"], "density"),
    "decaprop": ("coda_open_qa", ["smoke", "smoke/quasar_t"], "coda"),
}
STEPS = 4


@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
def test_bf16_mixed_trains_validates_and_tests(architecture, env, tmp_path):
    script, configs, mechanism = ARCHITECTURES[architecture]
    probe = tmp_path / "probe.json"
    env = {**env, "ATTNREPRO_TEST_AUTOCAST_PROBE": str(probe),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))}
    config_args = [a for c in configs for a in ("--config", str(CONFIGS / script / f"{c}.yaml"))]
    out = run(SCRIPTS / f"{script}.py", [
        "fit", *config_args, f"--model.attention={mechanism}",
        "--trainer.precision=bf16-mixed", f"--trainer.max_steps={STEPS}",
        "--trainer.val_check_interval=2", "--trainer.log_every_n_steps=1",
        "--trainer.callbacks+=tests.end_to_end.autocast_probe.AutocastProbe",
        "--run.group=bf16", f"--run.name={architecture}", "--run.test_after_fit=true",
        "--run.wandb=false"], env)
    assert "Using bfloat16 Automatic Mixed Precision" in out  # Lightning's precision plugin
    record = json.loads(probe.read_text())
    assert record["autocast"] == ["torch.bfloat16"], record  # every training forward
    assert "torch.bfloat16" in record["output_dtypes"], record
    assert len(record["losses"]) == STEPS
    assert all(isinstance(x, float) and math.isfinite(x) for x in record["losses"]), record
    run_dir = Path(env["ATTNREPRO_RUNS"]) / script / "bf16" / architecture
    values = last_values(run_dir / "metrics.csv")
    evaluated = {k: v for k, v in values.items() if k.startswith(("val/", "test/"))}
    assert any(k.startswith("val/") for k in evaluated), sorted(values)
    assert any(k.startswith("test/") for k in evaluated), sorted(values)
    assert all(math.isfinite(v) for v in evaluated.values()), evaluated
