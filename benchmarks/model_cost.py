"""Whole-model training cost per mechanism, interleaved: the SST classifier of Differentiable
Window Table 5 (the cost grid's model, experiments/configs/dwin_classification/speed.yaml)
with each mechanism, every model trained on the same batches, one step of each in turn.

    python -m benchmarks.model_cost                         # 6 mechanisms, 3 rounds x 40 batches
    python -m benchmarks.model_cost --rounds 1 --steps 2 --warmup 1 --d-model 16   # smoke

Why interleaved: the cost grid (``dwin_classification.py grid cost``) runs one Lightning run
per cell after another, and on a shared machine a slow minute lands on one cell: its three
seeds of 55 timed steps spread by up to 30% (results/dwin_classification_cost.md).  Here the
models take turns step by step (in a new random order each round), so a slow phase of the
machine falls on all of them, and every model sees the same batches (the SST training loader
of the speed config, seed 0: the same lengths, which set the step time).  A step is what
``train/steps_per_second`` counts: forward, loss (cross-entropy with the config's label
smoothing), backward and the Adam update (the config's learning rate and betas, no schedule).

Reported per mechanism: training steps/s over the timed steps (the number of steps divided by
their summed time, as DW Table 4 reports it), the ratio to softmax's, and a 95% interval of
that ratio from 2,000 bootstrap resamples of the (round, batch) pairs, paired across models.
Prints a markdown table (``--json``: one JSON object per line).  Not a test: no assertion is
made on the times.
"""

from __future__ import annotations

import argparse
import json
import random
import time
import warnings

import torch
import torch.nn.functional as F

from benchmarks import choose, paired_ratio
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
    data.prepare_data()
    data.setup("fit")
    batches = []
    for batch in data.train_dataloader():
        batches.append(batch)
        if len(batches) == n:
            break
    if len(batches) < n:
        raise SystemExit(f"model_cost: the SST training set has only {len(batches)} batches "
                         f"of {batch_size}, asked for {n}")
    return batches, data.vocab_size


class Trainee:
    """One mechanism's model and optimiser; :meth:`step` times one training step."""

    def __init__(self, name: str, vocab_size: int, d_model: int, seed: int):
        attention, layers = MECHANISMS[name]
        torch.manual_seed(seed)
        self.model = TransformerClassifier(vocab_size=vocab_size, num_classes=2,
                                           d_model=d_model, attention=attention,
                                           attention_layers=layers, **CONFIG)
        self.model.train()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=LR, betas=BETAS)

    def step(self, batch: dict) -> float:
        start = time.perf_counter()
        logits = self.model(batch["tokens"], batch["mask"]).logits
        loss = F.cross_entropy(logits, batch["label"], label_smoothing=CONFIG["label_smoothing"])
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return time.perf_counter() - start


def measure(names: list[str], batches: list[dict], vocab_size: int, rounds: int, warmup: int,
            d_model: int) -> dict[str, list[float]]:
    """Step times per mechanism, ``rounds`` x (len(batches) - warmup) each, in the same
    (round, batch) order for every mechanism; the first ``warmup`` batches of each round run
    untimed."""
    trainees = {name: Trainee(name, vocab_size, d_model, seed=0) for name in names}
    order = random.Random(0)
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for index, batch in enumerate(batches):
            turn = list(names)
            order.shuffle(turn)
            for name in turn:
                seconds = trainees[name].step(batch)
                if index >= warmup:
                    times[name].append(seconds)
    return times


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
    p = argparse.ArgumentParser(prog="python -m benchmarks.model_cost")
    p.add_argument("--rounds", type=int, default=3, help="passes over the batches")
    p.add_argument("--steps", type=int, default=40, help="timed batches per round")
    p.add_argument("--warmup", type=int, default=5, help="untimed batches before the first")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--mechanisms", default=",".join(MECHANISMS),
                   help="comma-separated: " + ", ".join(MECHANISMS))
    p.add_argument("--data-dir", default=None, help="SST folder (default ../shared/data)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    names = choose(p, "--mechanisms", args.mechanisms, MECHANISMS, "softmax")
    if min(args.rounds, args.steps) < 1 or args.warmup < 0:
        p.error("--rounds and --steps must be at least 1, --warmup at least 0")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    batches, vocab_size = sst_batches(args.warmup + args.steps, args.data_dir, args.batch_size)
    rows = summarise(measure(names, batches, vocab_size, args.rounds, args.warmup,
                             args.d_model))
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    lengths = [b["tokens"].shape[1] for b in batches[args.warmup:]]
    print(f"SST classifier training steps (forward + backward + Adam), batch {args.batch_size}, "
          f"d_model {args.d_model}, {args.threads} thread(s); {args.rounds} rounds x "
          f"{args.steps} batches (lengths {min(lengths)}-{max(lengths)} tokens, mean "
          f"{sum(lengths) / len(lengths):.1f}), the models taking turns step by step\n")
    print("| mechanism | steps/s | vs softmax | 95% interval |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['mechanism']} | {r['steps_per_s']:.2f} | {r['ratio_vs_softmax']:.2f}x | "
              f"[{r['ratio_low']:.2f}, {r['ratio_high']:.2f}] |")


if __name__ == "__main__":
    main()
