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
paired across models.
Prints a markdown table (``--json``: one JSON object per line).  Not a test: no assertion is
made on the times.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks import choose, paired_ratio, take_turns
from datamodules.sst import SSTDataModule
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


def sst_trainees(names: list[str], vocab_size: int, d_model: int) -> dict[str, Trainee]:
    """The SST classifier with each mechanism (seed 0)."""
    def loss(model, batch):
        logits = model(batch["tokens"], batch["mask"]).logits
        return F.cross_entropy(logits, batch["label"],
                               label_smoothing=CONFIG["label_smoothing"])

    trainees = {}
    for name in names:
        attention, layers = MECHANISMS[name]
        torch.manual_seed(0)
        model = TransformerClassifier(vocab_size=vocab_size, num_classes=2, d_model=d_model,
                                      attention=attention, attention_layers=layers, **CONFIG)
        trainees[name] = Trainee(model, loss, LR, BETAS)
    return trainees


# -- the translation model (experiments/dwin_mt.py, grid cost, config speed) ----------------
#: dwin_mt's configs (read as files: benchmarks import no experiment code)
DWIN_MT_CONFIGS = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "dwin_mt"


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


def translation_batches(n: int, data_dir: str | None) -> tuple[list[dict], dict, dict]:
    """The first ``n`` training batches of the speed config's En-De data, the model's
    settings of that config (yaml) and the data's linked attributes."""
    import yaml

    from lit_models.mt_rows import LINKS

    config = yaml.safe_load((DWIN_MT_CONFIGS / "speed.yaml").read_text())
    data_config = yaml.safe_load((DWIN_MT_CONFIGS / "speed" / "en_de.yaml").read_text())["data"]
    module, _, cls = data_config["class_path"].rpartition(".")
    data = getattr(importlib.import_module(module), cls)(
        **{**data_config["init_args"], "data_dir": data_dir, "seed": 0})
    batches = first_batches(data, n, "translation")
    links = {target: getattr(data, source) for source, target in LINKS}
    return batches, config["model"], links


def translation_trainees(names: list[str], settings: dict, links: dict) -> dict[str, Trainee]:
    """The speed config's translation model for each cell of the cost grid (seed 0)."""
    from lit_models.mt_rows import COST_ROWS
    from lit_models.transformer import TransformerSeq2Seq

    lr, betas = settings["lr"], tuple(settings["betas"])
    smoothing = settings["label_smoothing"]

    def loss(model, batch):
        logits = model(batch["src"], batch["src_mask"], batch["tgt_in"],
                       batch["tgt_mask"]).logits
        return model.loss(logits, batch, smoothing)

    trainees = {}
    for name in names:
        torch.manual_seed(0)
        model = TransformerSeq2Seq(**{**settings, **links, **cell_arguments(COST_ROWS[name])})
        trainees[name] = Trainee(model, loss, lr, betas)
    return trainees


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


def main(argv: list[str] | None = None) -> None:
    from lit_models.mt_rows import COST_ROWS

    p = argparse.ArgumentParser(prog="python -m benchmarks.model_cost")
    p.add_argument("--model", choices=("sst", "translation"), default="sst",
                   help="the SST classifier (DW Table 5) or the translation model (Table 4)")
    p.add_argument("--rounds", type=int, default=3, help="passes over the batches")
    p.add_argument("--steps", type=int, default=40, help="timed batches per round")
    p.add_argument("--warmup", type=int, default=5, help="untimed batches before the first")
    p.add_argument("--batch-size", type=int, default=256, help="SST only")
    p.add_argument("--d-model", type=int, default=128, help="SST only")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--mechanisms", default=None,
                   help="comma-separated: SST " + ", ".join(MECHANISMS) + "; translation "
                        + ", ".join(COST_ROWS) + " (default: all)")
    p.add_argument("--data-dir", default=None,
                   help="the dataset's folder (default: its folder of ../shared/data)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    translation = args.model == "translation"
    choices, baseline = (COST_ROWS, "transformer") if translation else (MECHANISMS, "softmax")
    names = choose(p, "--mechanisms", args.mechanisms or ",".join(choices), choices, baseline)
    if min(args.rounds, args.steps) < 1 or args.warmup < 0:
        p.error("--rounds and --steps must be at least 1, --warmup at least 0")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    n = args.warmup + args.steps
    if translation:
        batches, settings, links = translation_batches(n, args.data_dir)
        trainees = translation_trainees(names, settings, links)
    else:
        batches, vocab_size = sst_batches(n, args.data_dir, args.batch_size)
        trainees = sst_trainees(names, vocab_size, args.d_model)
    rows = summarise(measure(trainees, batches, args.rounds, args.warmup), baseline)
    for r in rows:
        r["parameters"] = sum(p.numel() for p in trainees[r["mechanism"]].model.parameters())
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    timed = batches[args.warmup:]
    if translation:
        src = [int(b["src_mask"].sum()) for b in timed]
        print(f"Translation model (dwin_mt speed config, cost grid cells) training steps "
              f"(forward + backward + Adam), {args.threads} thread(s); {args.rounds} rounds x "
              f"{args.steps} batches of {timed[0]['src'].shape[0]} pairs ({min(src)}-"
              f"{max(src)} source tokens), the models taking turns step by step\n")
    else:
        lengths = [b["tokens"].shape[1] for b in timed]
        print(f"SST classifier training steps (forward + backward + Adam), batch "
              f"{args.batch_size}, d_model {args.d_model}, {args.threads} thread(s); "
              f"{args.rounds} rounds x {args.steps} batches (lengths {min(lengths)}-"
              f"{max(lengths)} tokens, mean {sum(lengths) / len(lengths):.1f}), the models "
              f"taking turns step by step\n")
    print(f"| mechanism | parameters (M) | steps/s | vs {baseline} | 95% interval |\n"
          "|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mechanism']} | {r['parameters'] / 1e6:.2f} | {r['steps_per_s']:.2f} | "
              f"{r['ratio_vs_softmax']:.2f}x | [{r['ratio_low']:.2f}, {r['ratio_high']:.2f}] |")


if __name__ == "__main__":
    main()
