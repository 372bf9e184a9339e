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
import datetime
import importlib
import itertools
import json
import os
import shlex
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from attention.registry import supporting
from benchmarks import choose, paired_ratio, peak_alloc_mb, take_turns
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


class Trainee:
    """One cell's model and optimiser; :meth:`step` times one training step."""

    def __init__(self, model: torch.nn.Module, loss: Callable, lr: float,
                 betas: tuple[float, float]):
        self.model, self.loss = model, loss
        self.model.train()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=lr, betas=betas)

    def step(self, batch: dict) -> float:
        start = time.perf_counter()
        loss = self.loss(self.model, batch)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return time.perf_counter() - start


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
#: dwin_mt's (grid cost, config speed) and attention_compare's
DWIN_MT_CONFIGS, COMPARE_CONFIGS = CONFIGS / "dwin_mt", CONFIGS / "attention_compare"


def config_batches(folder: Path, config: str, dataset: str, n: int, data_dir: str | None
                   ) -> tuple[list[dict], dict, object]:
    """The first ``n`` training batches (seed 0) of the DataModule of a grid config's dataset
    config (``<folder>/<config>/<dataset>.yaml``; ``data_dir`` replaces its folder when
    given), the model settings of the grid config (``<folder>/<config>.yaml``), and the
    DataModule (for the model's linked arguments)."""
    import yaml

    files = (folder / f"{config}.yaml", folder / config / f"{dataset}.yaml")
    for path in files:
        if not path.is_file():
            raise SystemExit(f"model_cost: no config {path}")
    settings = yaml.safe_load(files[0].read_text())["model"]
    data_config = yaml.safe_load(files[1].read_text())["data"]
    module, _, cls = data_config["class_path"].rpartition(".")
    init = {**data_config.get("init_args", {}), "seed": 0,
            **({"data_dir": data_dir} if data_dir else {})}
    data = getattr(importlib.import_module(module), cls)(**init)
    return first_batches(data, n, dataset), settings, data


def config_trainees(model_class: type, rows: dict[str, list[str]], settings: dict,
                    links: dict, loss: Callable) -> dict[str, Trainee]:
    """A config's model for each row (its grid cell's ``--model.*`` flags; seed 0), with the
    config's learning rate and betas."""
    lr, betas = settings["lr"], tuple(settings["betas"])
    trainees = {}
    for name, flags in rows.items():
        torch.manual_seed(0)
        model = model_class(**{**settings, **links, **cell_arguments(flags)})
        trainees[name] = Trainee(model, loss, lr, betas)
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

    smoothing = settings["label_smoothing"]

    def loss(model, batch):
        logits = model(batch["src"], batch["src_mask"], batch["tgt_in"],
                       batch["tgt_mask"]).logits
        return model.loss(logits, batch, smoothing)

    return config_trainees(TransformerSeq2Seq, {name: COST_ROWS[name] for name in names},
                           settings, links, loss)


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
              resamples: int = 2000) -> list[dict]:
    """Steps/s, its ratio to the baseline's and a paired bootstrap 95% interval."""
    rows = []
    for name, values in times.items():
        # steps/s ratio = baseline time / this time: the inverse of paired_ratio's
        ratio, low, high = paired_ratio(values, times[baseline], resamples)
        rows.append({"mechanism": name, "steps": len(values),
                     "steps_per_s": len(values) / sum(values),
                     "ratio_vs_softmax": ratio, "ratio_low": low, "ratio_high": high})
    return rows


def step_tensor_mb(trainees: dict[str, Trainee], batches: list[dict]) -> dict[str, float | None]:
    """Per model, the tensor peak (MiB) of one more training step on the largest of
    ``batches`` (the most elements) beyond what it held before (``peak_alloc_mb``)."""
    def size(batch: dict) -> int:
        return sum(v.numel() for v in batch.values() if isinstance(v, torch.Tensor))

    largest = max(batches, key=size)
    return {name: peak_alloc_mb(lambda t=trainee: t.step(largest))
            for name, trainee in trainees.items()}


def setting(args: argparse.Namespace, argv: list[str], steps: int) -> dict:
    """What a measurement was made with: the command, config, data, timed steps, machine,
    threads, load, date and commit (the ``setting`` of each ``--out`` row)."""
    from benchmarks.attention import machine

    info = machine()
    root = Path(__file__).resolve().parents[1]

    def git(*command: str) -> str:
        done = subprocess.run(["git", *command], cwd=root, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short=7", "HEAD") or "not recorded"
    # the code's changes, not the results files a rerun writes (the SST file, written
    # first, made the IMDb row of the same command say "uncommitted")
    if git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"):
        commit += " with uncommitted changes"
    return {"command": shlex.join(["python", "-m", "benchmarks.model_cost", *argv]),
            "model": args.model, "config": args.config if args.model == "compare" else None,
            "data": args.data if args.model == "compare" else None, "steps": steps,
            "machine": f"{info['cpu']} ({info['cores']} cores), torch {info['torch']} with "
                       f"{torch.backends.cpu.get_cpu_capability()} kernels",
            "threads": torch.get_num_threads(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit}


def parser() -> argparse.ArgumentParser:
    from lit_models.mt_rows import COST_ROWS

    p = argparse.ArgumentParser(prog="python -m benchmarks.model_cost")
    p.add_argument("--model", choices=("sst", "translation", "compare"), default="sst",
                   help="the SST classifier (DW Table 5), the translation model (Table 4) or "
                        "the classifier of experiments/attention_compare.py (--data, --config)")
    p.add_argument("--data", choices=("sst", "imdb"), default="sst", help="compare only")
    p.add_argument("--config", default="paper",
                   help="compare only: the attention_compare config of the model and data")
    p.add_argument("--rounds", type=int, default=3, help="passes over the batches")
    p.add_argument("--steps", type=int, default=40, help="timed batches per round")
    p.add_argument("--warmup", type=int, default=5, help="untimed batches before the first")
    p.add_argument("--batch-size", type=int, default=256, help="SST only")
    p.add_argument("--d-model", type=int, default=128, help="SST only")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--mechanisms", default=None,
                   help="comma-separated: SST " + ", ".join(MECHANISMS) + "; translation "
                        + ", ".join(COST_ROWS) + "; compare " + ", ".join(compare_rows())
                        + " (default: all)")
    p.add_argument("--data-dir", default=None,
                   help="the dataset's folder (default: its config's, else its folder of "
                        "../shared/data)")
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
                         "compare": (compare_rows(), "softmax")}[args.model]
    names = choose(p, "--mechanisms", args.mechanisms or ",".join(choices), choices, baseline)
    if args.model != "compare" and (args.data, args.config) != ("sst", "paper"):
        p.error("--data and --config choose the model of --model compare only")
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
    else:
        batches, vocab_size = sst_batches(n, args.data_dir, args.batch_size)
        trainees = sst_trainees(names, vocab_size, args.d_model)
    rows = summarise(measure(trainees, batches, args.rounds, args.warmup), baseline)
    memory = step_tensor_mb(trainees, batches[args.warmup:])
    for r in rows:
        r["parameters"] = sum(p.numel() for p in trainees[r["mechanism"]].model.parameters())
        r["step_tensor_mb"] = memory[r["mechanism"]]
    if args.out:
        where = setting(args, argv, args.rounds * args.steps)
        prefix = f"{args.data}-" if args.model == "compare" else ""
        text = "".join(json.dumps({"cell": prefix + r["mechanism"],
                                   "baseline": prefix + baseline, **r, "setting": where}) + "\n"
                       for r in rows)
        write_atomic(args.out, text)
    if args.json or args.out:
        for r in rows:
            print(json.dumps(r))
        return
    print_table(args, rows, batches[args.warmup:], baseline)


def print_table(args: argparse.Namespace, rows: list[dict], timed: list[dict],
                baseline: str) -> None:
    """The markdown table of the rows, after a line saying what was measured."""
    if args.model == "translation":
        src = [int(b["src_mask"].sum()) for b in timed]
        print(f"Translation model (dwin_mt speed config, cost grid cells) training steps "
              f"(forward + backward + Adam), {args.threads} thread(s); {args.rounds} rounds x "
              f"{args.steps} batches of {timed[0]['src'].shape[0]} pairs ({min(src)}-"
              f"{max(src)} source tokens), the models taking turns step by step\n")
    else:
        lengths = [b["tokens"].shape[1] for b in timed]
        what = (f"attention_compare classifier (config {args.config}, {args.data}), batch "
                f"{timed[0]['tokens'].shape[0]}" if args.model == "compare" else
                f"SST classifier training steps (forward + backward + Adam), batch "
                f"{args.batch_size}, d_model {args.d_model}")
        print(f"{what}, {args.threads} thread(s); {args.rounds} rounds x {args.steps} batches "
              f"(lengths {min(lengths)}-{max(lengths)} tokens, mean "
              f"{sum(lengths) / len(lengths):.1f}), the models taking turns step by step\n")
    print(f"| mechanism | parameters (M) | steps/s | vs {baseline} | 95% interval | step tensor "
          "MB |\n|---|---|---|---|---|---|")
    for r in rows:
        memory = "-" if r["step_tensor_mb"] is None else f"{r['step_tensor_mb']:.1f}"
        print(f"| {r['mechanism']} | {r['parameters'] / 1e6:.2f} | {r['steps_per_s']:.2f} | "
              f"{r['ratio_vs_softmax']:.2f}x | [{r['ratio_low']:.2f}, {r['ratio_high']:.2f}] "
              f"| {memory} |")


if __name__ == "__main__":
    main()
