"""Whole-model training cost per mechanism, interleaved: the SST classifier of Differentiable
Window Table 5 (the cost grid's model, experiments/configs/dwin_classification/speed.yaml)
with each mechanism, every model trained on the same batches, one step of each in turn.

    python -m benchmarks.model_cost                         # 6 mechanisms, 3 rounds x 40 batches
    python -m benchmarks.model_cost --rounds 1 --steps 2 --warmup 1 --d-model 16   # smoke
    python -m benchmarks.model_cost --model translation --rounds 1 --steps 20 --warmup 3

``--model translation``: the translation model of DW Table 4 instead (the ``cost`` grid of
experiments/dwin_mt.py: its speed config's Transformer base, post-norm, shared embeddings,
on batches of 16 newstest2014 En-De pairs with a joint BPE), each of that grid's cells
(mechanism and placement) as a model; ``--d-model`` does not apply.

``--model compare --data sst|imdb``: the classifier of experiments/attention_compare.py (the
model of its ``--config``, default paper, with the mechanism in every layer, on that config's
training batches of the dataset), one model per row of its grids: every mechanism the
registry serves in multi-head attention with its paper defaults, and CoDA with beta 0.25
(lit_models/compare_rows.py); ``--out FILE`` writes the rows that ``report`` of that script
prints (results/attention_compare_cost/<data>.jsonl, the grid's ``cost_file``):

    python -m benchmarks.model_cost --model compare --data sst --threads 1 \
        --out results/attention_compare_cost/sst.jsonl

``--model mlu``: the MLU Transformer of experiments/coda_mlu.py (``--config``, default demo:
its model, batch and optimiser, on as many generated problems as the batches take), one
model per row of ``--model compare``'s list.  ``--model decompatt``: DecompAtt of
experiments/decomp_snli.py's paper config (hidden 200, batch 32) with trained embeddings
instead of GloVe, on the shared SNLI dev prefix (benchmarks/nli_step.py's), one model per
mechanism the registry serves in pairwise alignment.

``--precision 32-true,bf16-mixed``: each model once per precision, twins from the same
initial weights with optimisers of their own, all taking turns; a ``bf16-mixed`` step runs
its forward pass and loss under ``torch.autocast("cpu", torch.bfloat16)`` as Lightning's
``--trainer.precision bf16-mixed`` does (float32 weights, optimiser and backward call), and
each twin's row has its steps/s ratio to its float32 twin with a paired 95% interval
(``precision_ratio``, ``precision_low``, ``precision_high``); ``--out`` rows record the CPU's
bfloat16 instruction sets (``cpu_features``: AVX-512 BF16, AMX) and torch's capability
(results/bf16_cost.md):

    python -m benchmarks.model_cost --model mlu --mechanisms softmax,coda \
        --precision 32-true,bf16-mixed --threads 1 --out results/bf16_cost/mlu_demo.jsonl

``--mfu``: model FLOPs utilisation.  Each model's FLOPs of a training step on each timed
batch are counted once before the timing, two ways: ``flop_counter``, torch's
``FlopCounterMode`` over the forward pass, loss and backward pass (every matrix product:
linear layers, batched products, SDPA's flash kernel; element-wise work, the optimiser and
kernels it cannot see, such as CoDA's C++ L1 term, are not counted), and ``analytic``, 6 x
the parameters x the tokens of every linear layer (forward hooks: each layer's own rows, so
the encoder's source and the decoder's target tokens; the embeddings' lookups cost nothing)
plus 12 x Lq x Lk x d_model per attention layer call (q k^T and the weighted sum, forward and
backward).  Probes of this CPU's matrix-product peak (:mod:`benchmarks.peak`: a 1024^3 float32
product and a 2048^3 bfloat16 product, which oneDNN runs on AMX tiles where the CPU has
them) take turns with the models' steps, and each row gets ``model_tflops`` (the counted
FLOPs of its timed steps over their summed time) and ``mfu`` against the peak of its
precision (``mfu_vs_float32`` beside it):

    python -m benchmarks.model_cost --model compare --data sst --mechanisms softmax \
        --precision 32-true,bf16-mixed --mfu --threads 1 --out results/mfu/tiny_sst.jsonl

Why interleaved: the cost grid (``dwin_classification.py grid cost``) runs one Lightning run
per cell after another, and on a shared machine a slow minute lands on one cell: its three
seeds of 55 timed steps spread by up to 30% (results/dwin_classification_cost.md).  Here the
models take turns step by step (in a new random order each round), so a slow phase of the
machine falls on all of them, and every model sees the same batches (the SST training loader
of the speed config, seed 0: the same lengths, which set the step time).  A step is what
``train/steps_per_second`` counts: forward, loss (cross-entropy with the config's label
smoothing), backward and the Adam update (the config's learning rate and betas, no schedule).

Reported per mechanism: its parameters, training steps/s over the timed steps (the number of
steps divided by their summed time, as DW Table 4 reports it), the ratio to the baseline's
(softmax; the Transformer for translation: ``ratio_vs_softmax`` in the JSON either way), and
a 95% interval of that ratio from 2,000 bootstrap resamples of the (round, batch) pairs,
paired across models, and ``step_tensor_mb``: the peak of the bytes held by torch tensors in
one more training step on the longest timed batch, beyond those held before it
(``benchmarks.peak_alloc_mb``).
Prints a markdown table (``--json``: one JSON object per line; ``--out FILE``: those lines,
each with the cell it measures and the setting, machine, date and commit, written whole to
FILE).  Not a test: no assertion is made on the times.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import itertools
import json
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from attention.registry import supporting
from benchmarks import choose, paired_ratio, peak_alloc_mb, provenance, take_turns
from datamodules.sst import SSTDataModule
from fileio import write_atomic
from lit_models.compare_rows import LINKS as CLASSIFIER_LINKS
from lit_models.compare_rows import mechanism_rows
from lit_models.transformer import TransformerClassifier

#: mechanism -> (attention flag value, attention_layers): as the cost grid's cells (the
#: attention under test in layer 1; relative positions in every layer, as Shaw et al.)
MECHANISMS = {
    "softmax": ("softmax", 1),
    "relative": ("relative", None),
    "localness": ("localness", 1),
    "window-mw": ({"name": "window", "variant": "mw"}, 1),
    "window-aw": ({"name": "window", "variant": "aw"}, 1),
    "coda": ("coda", 1),
}
#: the speed config's model and optimiser (experiments/configs/dwin_classification/speed.yaml)
CONFIG = dict(n_heads=4, d_ff=512, n_layers=2, dropout=0.1, attention_dropout=0.1,
              pooling="mean", label_smoothing=0.1)
LR, BETAS = 0.0019764, (0.9, 0.997)


def sst_batches(n: int, data_dir: str | None, batch_size: int) -> tuple[list[dict], int]:
    """The first ``n`` batches of the speed config's SST training loader (seed 0)."""
    data = SSTDataModule(data_dir=data_dir, format="ptb", granularity="binary",
                         train_phrases=True, lowercase=True, val_file="dev.txt",
                         test_file="dev.txt", tokenization="bpe", bpe_vocab_size=16384,
                         batch_size=batch_size, seed=0)
    return first_batches(data, n, "SST"), data.vocab_size


def first_batches(data, n: int, what: str) -> list[dict]:
    """The first ``n`` batches of a DataModule's training loader (prepared and set up)."""
    data.prepare_data()
    data.setup("fit")
    batches = list(itertools.islice(data.train_dataloader(), n))
    if len(batches) < n:
        raise SystemExit(f"model_cost: the {what} training set has only {len(batches)} "
                         f"batches, asked for {n}")
    return batches


#: ``--precision`` values, Lightning's names for what a training step runs in
PRECISIONS = ("32-true", "bf16-mixed")


def autocast(precision: str):
    """What Lightning's precision plugin runs a training step's forward pass and loss in
    (``--trainer.precision``): under ``bf16-mixed`` CPU autocast to bfloat16 (the weights,
    the optimiser and the backward pass stay float32; no loss scaling), else nothing."""
    if precision == "bf16-mixed":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    if precision == "32-true":
        return contextlib.nullcontext()
    raise ValueError(f"model_cost: precision must be one of {PRECISIONS}, got {precision!r}")


class Trainee:
    """One cell's model and optimiser; :meth:`step` times one training step (its forward
    pass and loss under :func:`autocast` of ``precision``)."""

    def __init__(self, model: torch.nn.Module, loss: Callable, lr: float,
                 betas: tuple[float, float], precision: str = "32-true"):
        autocast(precision)  # a known precision
        self.model, self.loss, self.lr, self.betas = model, loss, lr, betas
        self.precision = precision
        self.model.train()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=lr, betas=betas)

    def twin(self, precision: str) -> Trainee:
        """A copy of this model (its weights now: build twins before training) with an
        optimiser of its own, stepping in ``precision``."""
        return Trainee(copy.deepcopy(self.model), self.loss, self.lr, self.betas, precision)

    def step(self, batch: dict) -> float:
        start = time.perf_counter()
        with autocast(self.precision):
            loss = self.loss(self.model, batch)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return time.perf_counter() - start


def twins(trainees: dict[str, Trainee], precisions: list[str]) -> dict[str, Trainee]:
    """Each model in each of ``precisions``, from the same initial weights: the first
    precision's under the model's name, the others' under ``name@precision``."""
    out = {}
    for name, trainee in trainees.items():
        for precision in precisions:
            key = name if precision == precisions[0] else f"{name}@{precision}"
            out[key] = trainee.twin(precision)
    return out


def classifier_loss(smoothing: float) -> Callable:
    """A text classifier's training loss on a batch: cross-entropy with label smoothing."""
    def loss(model, batch):
        logits = model(batch["tokens"], batch["mask"]).logits
        return F.cross_entropy(logits, batch["label"], label_smoothing=smoothing)

    return loss


def sst_trainees(names: list[str], vocab_size: int, d_model: int) -> dict[str, Trainee]:
    """The SST classifier with each mechanism (seed 0)."""
    loss = classifier_loss(CONFIG["label_smoothing"])
    trainees = {}
    for name in names:
        attention, layers = MECHANISMS[name]
        torch.manual_seed(0)
        model = TransformerClassifier(vocab_size=vocab_size, num_classes=2, d_model=d_model,
                                      attention=attention, attention_layers=layers, **CONFIG)
        trainees[name] = Trainee(model, loss, LR, BETAS)
    return trainees


# -- models of an experiment's configs ------------------------------------------------------
#: the experiments' configs (read as files: benchmarks import no experiment code)
CONFIGS = Path(__file__).resolve().parents[1] / "experiments" / "configs"
#: dwin_mt's (grid cost, config speed), attention_compare's, coda_mlu's and decomp_snli's
DWIN_MT_CONFIGS, COMPARE_CONFIGS = CONFIGS / "dwin_mt", CONFIGS / "attention_compare"
MLU_CONFIGS, SNLI_CONFIGS = CONFIGS / "coda_mlu", CONFIGS / "decomp_snli"
#: the SNLI file of DecompAtt's batches: the shared dev prefix (benchmarks/nli_step.py's)
SNLI_FILE = "snli_1.0_dev.first1288.jsonl"


def config_batches(folder: Path, config: str, dataset: str | None, n: int,
                   data_dir: str | None, data_class: str | None = None,
                   data_args: dict | None = None) -> tuple[list[dict], dict, object]:
    """The first ``n`` training batches (seed 0) of the DataModule of a grid config's dataset
    config (``<folder>/<config>/<dataset>.yaml``; ``dataset`` None: the grid config's own
    ``data`` block, of class ``data_class``, the experiment's DataModule, which such configs
    do not name; ``data_args`` replace its arguments, ``data_dir`` its folder when given),
    the model settings of the grid config (``<folder>/<config>.yaml``; a ``class_path``
    model's ``init_args``), and the DataModule (for the model's linked arguments)."""
    import yaml

    files = (folder / f"{config}.yaml",) + ((folder / config / f"{dataset}.yaml",)
                                           if dataset else ())
    for path in files:
        if not path.is_file():
            raise SystemExit(f"model_cost: no config {path}")
    settings = yaml.safe_load(files[0].read_text())["model"]
    settings = settings.get("init_args", {}) if "class_path" in settings else settings
    data_config = yaml.safe_load(files[-1].read_text())["data"]
    if "class_path" in data_config:
        data_class, data_config = data_config["class_path"], data_config.get("init_args", {})
    module, _, cls = data_class.rpartition(".")
    init = {**data_config, **(data_args or {}), "seed": 0,
            **({"data_dir": data_dir} if data_dir else {})}
    data = getattr(importlib.import_module(module), cls)(**init)
    return first_batches(data, n, dataset or config), settings, data


def config_trainees(model_class: type, rows: dict[str, list[str]], settings: dict,
                    links: dict, loss: Callable) -> dict[str, Trainee]:
    """A config's model for each row (its grid cell's ``--model.*`` flags; seed 0), with the
    model's learning rate and betas (the config's, else the model's defaults)."""
    trainees = {}
    for name, flags in rows.items():
        torch.manual_seed(0)
        model = model_class(**{**settings, **links, **cell_arguments(flags)})
        trainees[name] = Trainee(model, loss, model.optim["lr"], tuple(model.optim["betas"]))
    return trainees


def compare_rows() -> dict[str, list[str]]:
    """The rows of experiments/attention_compare.py's grids: every mechanism the registry
    serves in multi-head attention, with its paper defaults, and CoDA with beta 0.25."""
    return mechanism_rows(supporting("multihead"))


def cell_arguments(flags: list[str]) -> dict:
    """A grid cell's ``--model.*`` flags as the model's keyword arguments: ``--model.x=v``
    -> x=v; ``--model.x.option=v`` -> x={"name": ..., "option": v} (numbers as numbers)."""
    def value(text: str):
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text

    kwargs: dict = {}
    for flag in flags:
        key, equals, text = flag.removeprefix("--model.").partition("=")
        if not flag.startswith("--model.") or not equals:
            raise ValueError(f"model_cost: a cell flag must be --model.NAME=VALUE, got {flag!r}")
        name, _dot, option = key.partition(".")
        if option:
            spec = kwargs.setdefault(name, {})
            if not isinstance(spec, dict):
                raise ValueError(f"model_cost: {flag!r} sets an option of {name}={spec!r}")
            spec[option] = value(text)
        elif isinstance(kwargs.get(name), dict):
            kwargs[name]["name"] = text
        else:
            kwargs[name] = {"name": text} if name.endswith("attention") else value(text)
    return kwargs


def translation_trainees(names: list[str], settings: dict, links: dict) -> dict[str, Trainee]:
    """The speed config's translation model for each cell of the cost grid (seed 0)."""
    from lit_models.mt_rows import COST_ROWS
    from lit_models.transformer import TransformerSeq2Seq

    return config_trainees(TransformerSeq2Seq, {name: COST_ROWS[name] for name in names},
                           settings, links, seq2seq_loss(settings["label_smoothing"]))


def seq2seq_loss(smoothing: float) -> Callable:
    """A sequence-to-sequence model's training loss on a batch (teacher forcing, label
    smoothing)."""
    def loss(model, batch):
        logits = model(batch["src"], batch["src_mask"], batch["tgt_in"],
                       batch["tgt_mask"]).logits
        return model.loss(logits, batch, smoothing)

    return loss


def nli_loss(model, batch) -> torch.Tensor:
    """DecompAtt's training loss on a batch (its ``training_step``'s)."""
    return F.nll_loss(model.log_probs(batch), batch["label"])


def alignment_rows() -> dict[str, list[str]]:
    """DecompAtt's rows: every mechanism the registry serves in pairwise alignment, with its
    defaults."""
    return {name: [f"--model.attention={name}"] for name in supporting("alignment")}


def measure(trainees: dict[str, Trainee], batches: list[dict], rounds: int,
            warmup: int) -> dict[str, list[float]]:
    """Step times per model, ``rounds`` x (len(batches) - warmup) each, in the same
    (round, batch) order for every model (:func:`benchmarks.take_turns`); the first
    ``warmup`` batches of each round run untimed."""
    items = [(index, batch) for _ in range(rounds) for index, batch in enumerate(batches)]
    times = take_turns(list(trainees), items, lambda name, item: trainees[name].step(item[1]))
    timed = [index >= warmup for index, _ in items]
    return {name: [t for t, keep in zip(values, timed, strict=True) if keep]
            for name, values in times.items()}


def summarise(times: dict[str, list[float]], baseline: str = "softmax",
              resamples: int = 2000, precisions: tuple[str, ...] = ("32-true",)) -> list[dict]:
    """Steps/s, its ratio to the baseline's in the same precision and a paired bootstrap 95%
    interval; for a twin in another precision than the first (``name@precision``,
    :func:`twins`), also its steps/s ratio to its twin in the first (``precision_ratio``,
    ``precision_low``, ``precision_high``, against ``vs_precision``)."""
    rows = []
    for key, values in times.items():
        name, at, precision = key.partition("@")
        suffix = at + precision
        # steps/s ratio = baseline time / this time: the inverse of paired_ratio's
        ratio, low, high = paired_ratio(values, times[baseline + suffix], resamples)
        row = {"mechanism": name, "precision": precision or precisions[0],
               "steps": len(values), "steps_per_s": len(values) / sum(values),
               "ratio_vs_softmax": ratio, "ratio_low": low, "ratio_high": high}
        if suffix:
            twin, twin_low, twin_high = paired_ratio(values, times[name], resamples)
            row.update(vs_precision=precisions[0], precision_ratio=twin,
                       precision_low=twin_low, precision_high=twin_high)
        rows.append(row)
    return rows


def step_tensor_mb(trainees: dict[str, Trainee], batches: list[dict]) -> dict[str, float | None]:
    """Per model, the tensor peak (MiB) of one more training step on the largest of
    ``batches`` (the most elements) beyond what it held before (``peak_alloc_mb``)."""
    def size(batch: dict) -> int:
        return sum(v.numel() for v in batch.values() if isinstance(v, torch.Tensor))

    largest = max(batches, key=size)
    return {name: peak_alloc_mb(lambda t=trainee: t.step(largest))
            for name, trainee in trainees.items()}


def flop_counts(trainees: dict[str, Trainee], batches: list[dict]) -> dict[str, dict]:
    """Per model (a twin shares its model's counts), the FLOPs of one training step's
    forward pass, loss and backward pass on each of ``batches``: ``flop_counter``
    (FlopCounterMode) and ``analytic`` (6 x parameters x tokens of each linear layer and
    12 x Lq x Lk x d_model per attention call; see ``--mfu``).  The gradients are dropped
    afterwards: the weights do not change."""
    from torch.utils.flop_counter import FlopCounterMode

    from attention.base import MultiHeadCore

    counts: dict[str, dict] = {}
    analytic = [0.0]  # the hooks' sum for the batch being counted
    for key, trainee in trainees.items():
        name = key.partition("@")[0]
        if name in counts:
            counts[key] = counts[name]
            continue

        def linear(module, args, _out):
            rows = args[0].numel() // module.in_features
            analytic[0] += 6.0 * rows * module.in_features * module.out_features

        def attention(_module, args, _out):
            q, k = args[0], args[1]  # (B,H,Lq,d), (B,H,Lk,d)
            b, h, lq, d = q.shape
            analytic[0] += 12.0 * b * lq * k.shape[-2] * h * d

        hooks = [m.register_forward_hook(linear) for m in trainee.model.modules()
                 if isinstance(m, torch.nn.Linear)]
        hooks += [m.register_forward_hook(attention) for m in trainee.model.modules()
                  if isinstance(m, MultiHeadCore)]
        counted, estimated = [], []
        try:
            for batch in batches:
                analytic[0] = 0.0
                with FlopCounterMode(display=False) as counter:
                    trainee.loss(trainee.model, batch).backward()
                trainee.opt.zero_grad(set_to_none=True)
                counted.append(float(counter.get_total_flops()))
                estimated.append(analytic[0])
        finally:
            for hook in hooks:
                hook.remove()
        counts[key] = counts[name] = {"flop_counter": counted, "analytic": estimated}
    return {key: counts[key] for key in trainees}


#: the matrix-product peak probes of ``--mfu``, by the dtype a precision's products run in
PEAK_PROBES = {"float32": dict(dtype=torch.float32, n=1024, repeats=1),
               "bfloat16": dict(dtype=torch.bfloat16, n=2048, repeats=1)}


def mfu_rows(rows: list[dict], keys: list[str], times: dict[str, list[float]],
             counts: dict[str, dict], probe_times: dict[str, list[float]],
             probes: dict, per_round: int) -> None:
    """Add each row's counted FLOPs per step, achieved TFLOP/s and MFU against the measured
    peak of its precision (bfloat16's for bf16-mixed) and against float32's."""
    from benchmarks.peak import rate

    peaks = {dtype: rate(probes[dtype].ops, probe_times[dtype]) for dtype in probes}
    for row, key in zip(rows, keys, strict=True):
        per_batch = counts[key]
        steps = times[key]
        flops = [per_batch["flop_counter"][i % per_round] for i in range(len(steps))]
        analytic = [per_batch["analytic"][i % per_round] for i in range(len(steps))]
        achieved = sum(flops) / sum(steps)
        peak = peaks["bfloat16" if row["precision"] == "bf16-mixed" else "float32"]
        row.update(flops_per_step=sum(flops) / len(flops),
                   analytic_flops_per_step=sum(analytic) / len(analytic),
                   model_tflops=achieved / 1e12, mfu=achieved / peak,
                   mfu_vs_float32=achieved / peaks["float32"],
                   peak_tflops={dtype: value / 1e12 for dtype, value in peaks.items()})


def setting(args: argparse.Namespace, argv: list[str], steps: int) -> dict:
    """What a measurement was made with: the command, config, data, timed steps, machine,
    threads, load, date and commit (the ``setting`` of each ``--out`` row)."""
    return {**provenance("benchmarks.model_cost", argv), "model": args.model,
            "config": args.config if args.model in CONFIGURED else None,
            "data": args.data if args.model == "compare" else None, "steps": steps,
            "precisions": args.precision.split(",")}


#: the models whose --config names a config of their experiment, and its default
CONFIGURED = {"compare": "paper", "mlu": "demo"}
#: the MLU DataModule's attributes -> TransformerSeq2Seq's arguments (experiments/coda_mlu.py's
#: links: one vocabulary for both sides)
MLU_LINKS = [("vocab_size", "src_vocab_size"), ("vocab_size", "tgt_vocab_size"),
             ("pad_id", "pad_id"), ("bos_id", "bos_id"), ("eos_id", "eos_id")]


def parser() -> argparse.ArgumentParser:
    from lit_models.mt_rows import COST_ROWS

    p = argparse.ArgumentParser(prog="python -m benchmarks.model_cost")
    p.add_argument("--model", choices=("sst", "translation", "compare", "mlu", "decompatt"),
                   default="sst",
                   help="the SST classifier (DW Table 5), the translation model (Table 4), "
                        "the classifier of experiments/attention_compare.py (--data, "
                        "--config), the MLU Transformer of experiments/coda_mlu.py (--config) "
                        "or DecompAtt of experiments/decomp_snli.py's paper config")
    p.add_argument("--data", choices=("sst", "imdb"), default="sst", help="compare only")
    p.add_argument("--config", default=None,
                   help="compare: the attention_compare config of the model and data "
                        "(default paper); mlu: the coda_mlu config (default demo)")
    p.add_argument("--precision", default="32-true",
                   help="comma-separated, of " + ", ".join(PRECISIONS) + ": each model once "
                        "per precision (twins from the same weights, taking turns), each "
                        "twin's steps/s against its twin in the first")
    p.add_argument("--rounds", type=int, default=3, help="passes over the batches")
    p.add_argument("--steps", type=int, default=40, help="timed batches per round")
    p.add_argument("--warmup", type=int, default=5, help="untimed batches before the first")
    p.add_argument("--batch-size", type=int, default=256, help="SST only")
    p.add_argument("--d-model", type=int, default=128, help="SST only")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--mechanisms", default=None,
                   help="comma-separated: SST " + ", ".join(MECHANISMS) + "; translation "
                        + ", ".join(COST_ROWS) + "; compare and mlu " + ", ".join(compare_rows())
                        + "; decompatt " + ", ".join(alignment_rows()) + " (default: all)")
    p.add_argument("--data-dir", default=None,
                   help="the dataset's folder (default: its config's, else its folder of "
                        "../shared/data)")
    p.add_argument("--mfu", action="store_true",
                   help="count each step's FLOPs and time matrix-product peak probes (float32, "
                        "bfloat16) in the same rounds: model FLOPs utilisation")
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", type=Path, default=None,
                   help="write the --json rows, each with its cell and setting, to this file")
    return p


def main(argv: list[str] | None = None) -> None:
    from lit_models.mt_rows import COST_ROWS, LINKS

    argv = sys.argv[1:] if argv is None else argv
    p = parser()
    args = p.parse_args(argv)
    choices, baseline = {"sst": (MECHANISMS, "softmax"), "translation": (COST_ROWS, "transformer"),
                         "compare": (compare_rows(), "softmax"), "mlu": (compare_rows(), "softmax"),
                         "decompatt": (alignment_rows(), "softmax")}[args.model]
    names = choose(p, "--mechanisms", args.mechanisms or ",".join(choices), choices, baseline)
    if args.model != "compare" and args.data != "sst":
        p.error("--data chooses the data of --model compare only")
    if args.model not in CONFIGURED and args.config is not None:
        p.error("--config chooses the model of --model " + " and ".join(CONFIGURED) + " only")
    args.config = args.config or CONFIGURED.get(args.model)
    precisions = [x.strip() for x in args.precision.split(",")]
    if any(x not in PRECISIONS for x in precisions) or len(set(precisions)) < len(precisions):
        p.error(f"--precision takes distinct values of {list(PRECISIONS)}, got {precisions}")
    if min(args.rounds, args.steps, args.threads) < 1 or args.warmup < 0:
        p.error("--rounds, --steps and --threads must be at least 1, --warmup at least 0")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    n = args.warmup + args.steps
    if args.model == "translation":
        batches, settings, data = config_batches(DWIN_MT_CONFIGS, "speed", "en_de", n,
                                                 args.data_dir)
        trainees = translation_trainees(names, settings,
                                        {t: getattr(data, s) for s, t in LINKS})
    elif args.model == "compare":
        batches, settings, data = config_batches(COMPARE_CONFIGS, args.config, args.data, n,
                                                 args.data_dir)
        trainees = config_trainees(TransformerClassifier, {r: choices[r] for r in names},
                                   settings, {t: getattr(data, s) for s, t in CLASSIFIER_LINKS},
                                   classifier_loss(settings.get("label_smoothing", 0.0)))
    elif args.model == "mlu":
        from lit_models.transformer import TransformerSeq2Seq

        # as many generated problems as the batches take (the paper configs' millions would
        # take minutes to generate; the problems come from the same distribution)
        batches, settings, data = config_batches(
            MLU_CONFIGS, args.config, None, n, args.data_dir, "datamodules.mlu.MLUDataModule",
            {"train_size": n * 512, "val_size": 1, "test_size": 1})
        trainees = config_trainees(TransformerSeq2Seq, {r: choices[r] for r in names}, settings,
                                   {t: getattr(data, s) for s, t in MLU_LINKS},
                                   seq2seq_loss(settings["label_smoothing"]))
    elif args.model == "decompatt":
        from lit_models.decomp_att import DecompAtt

        # trained embeddings (no GloVe vectors), as benchmarks/nli_step.py
        batches, settings, data = config_batches(
            SNLI_CONFIGS, "paper", None, n, args.data_dir, "datamodules.nli.SNLIDataModule",
            {"vectors": None, "train_file": SNLI_FILE, "val_file": SNLI_FILE,
             "test_file": SNLI_FILE})
        trainees = config_trainees(DecompAtt, {r: choices[r] for r in names}, settings,
                                   {t: getattr(data, s) for s, t in CLASSIFIER_LINKS}, nli_loss)
    else:
        batches, vocab_size = sst_batches(n, args.data_dir, args.batch_size)
        trainees = sst_trainees(names, vocab_size, args.d_model)
    if precisions != ["32-true"]:
        trainees = twins(trainees, precisions)
    timed_batches = batches[args.warmup:]
    counts = flop_counts(trainees, timed_batches) if args.mfu else {}
    from benchmarks.peak import matmul_probe

    probes = {f"peak@{dtype}": matmul_probe(**spec) for dtype, spec in PEAK_PROBES.items()
              } if args.mfu else {}
    times = measure({**trainees, **probes}, batches, args.rounds, args.warmup)
    probe_times = {key.partition("@")[2]: times.pop(key) for key in probes}
    rows = summarise(times, baseline, precisions=tuple(precisions))
    if args.mfu:
        mfu_rows(rows, list(trainees), times, counts, probe_times,
                 {key.partition("@")[2]: probe for key, probe in probes.items()},
                 len(timed_batches))
    memory = step_tensor_mb(trainees, batches[args.warmup:])
    for r, key in zip(rows, trainees, strict=True):
        r["parameters"] = sum(p.numel() for p in trainees[key].model.parameters())
        r["step_tensor_mb"] = memory[key]
    if args.out:
        where = setting(args, argv, args.rounds * args.steps)
        prefix = {"compare": f"{args.data}-", "mlu": "mlu-", "decompatt": "snli-"}.get(
            args.model, "")
        text = "".join(json.dumps({"cell": prefix + key, "baseline": prefix + baseline, **r,
                                   "setting": where}) + "\n"
                       for key, r in zip(trainees, rows, strict=True))
        write_atomic(args.out, text)
    if args.json or args.out:
        for r in rows:
            print(json.dumps(r))
        return
    print_table(args, rows, batches[args.warmup:], baseline)


#: what each model's batches are: the tensor whose (batch, length) the table's line states
INPUT = {"sst": "tokens", "compare": "tokens", "translation": "src", "mlu": "src",
         "decompatt": "premise"}


def print_table(args: argparse.Namespace, rows: list[dict], timed: list[dict],
                baseline: str) -> None:
    """The markdown table of the rows, after a line saying what was measured."""
    what = {"translation": "Translation model (dwin_mt speed config, cost grid cells)",
            "compare": f"attention_compare classifier (config {args.config}, {args.data})",
            "mlu": f"MLU Transformer (coda_mlu config {args.config})",
            "decompatt": "DecompAtt (decomp_snli paper config, trained embeddings, SNLI)",
            "sst": f"SST classifier (d_model {args.d_model})"}[args.model]
    inputs = [b[INPUT[args.model]] for b in timed]
    lengths = [x.shape[1] for x in inputs]
    print(f"{what} training steps (forward + backward + Adam), precision {args.precision}, "
          f"{args.threads} thread(s); {args.rounds} rounds x {args.steps} batches of "
          f"{inputs[0].shape[0]} ({INPUT[args.model]} lengths {min(lengths)}-{max(lengths)}, "
          f"mean {sum(lengths) / len(lengths):.1f}), the models taking turns step by step\n")
    twins = any("precision_ratio" in r for r in rows)
    first = rows[0]["precision"]
    print(f"| mechanism | precision | parameters (M) | steps/s | vs {baseline} | 95% interval |"
          + (f" vs {first} | 95% interval |" if twins else "") + " step tensor MB |\n|---"
          + "|---" * (8 if twins else 6) + "|")
    for r in rows:
        memory = "-" if r["step_tensor_mb"] is None else f"{r['step_tensor_mb']:.1f}"
        twin = ""
        if twins:
            twin = (f" {r['precision_ratio']:.2f}x | [{r['precision_low']:.2f}, "
                    f"{r['precision_high']:.2f}] |" if "precision_ratio" in r else " - | - |")
        print(f"| {r['mechanism']} | {r['precision']} | {r['parameters'] / 1e6:.2f} | "
              f"{r['steps_per_s']:.2f} | {r['ratio_vs_softmax']:.2f}x | [{r['ratio_low']:.2f}, "
              f"{r['ratio_high']:.2f}] |{twin} {memory} |")
    if "mfu" in rows[0]:
        peaks = rows[0]["peak_tflops"]
        print("\nModel FLOPs utilisation (peaks measured in the same rounds: "
              + ", ".join(f"{k} {v:.3f} TFLOP/s" for k, v in peaks.items()) + ")\n")
        print("| mechanism | precision | GFLOP/step (counted) | GFLOP/step (analytic) | "
              "TFLOP/s | MFU | MFU vs float32 peak |\n|---|---|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['mechanism']} | {r['precision']} | {r['flops_per_step'] / 1e9:.2f} | "
                  f"{r['analytic_flops_per_step'] / 1e9:.2f} | {r['model_tflops']:.3f} | "
                  f"{r['mfu']:.1%} | {r['mfu_vs_float32']:.1%} |")


if __name__ == "__main__":
    main()
