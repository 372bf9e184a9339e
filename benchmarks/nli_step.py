"""Training-step time of the SNLI write-up's models (Table 1), measured in one run.

    python -m benchmarks.nli_step                      # vanilla, exact K=3, latent K=4, exact K=4
    python -m benchmarks.nli_step --steps 5 --warmup 1 --hidden 16   # smoke

Each model trains with a Lightning Trainer on the same SNLI batches (the shared dev prefix,
../shared/data/snli, batch 32, trained embeddings so no GloVe is needed) for --warmup +
--steps optimiser steps; a callback times every step (forward, backward, optimiser) and the
median of the timed steps is reported with its ratio to vanilla DecompAtt measured in the
same run.  The write-up's complaint was a latent mixture slower per step than the exact
ensemble (a Python loop over sub-batches); here members run batched and the latent mixture
runs each member on the examples routed to it only, so the row to compare it with is exact
K=4.  Prints a markdown table (``--json``: one JSON object per line).  Not a test: no
assertion is made on the times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import lightning as L
import torch

from benchmarks import choose
from datamodules.nli import SNLIDataModule
from lit_models.decomp_att import DecompAtt
from lit_models.mixture import Mixture

MODELS = {  # name -> (class, extra arguments)
    "vanilla": (DecompAtt, {}),
    "exact K=3": (Mixture, {"mode": "exact", "k": 3}),
    "latent K=4": (Mixture, {"mode": "latent", "k": 4}),
    "exact K=4": (Mixture, {"mode": "exact", "k": 4}),
}


class StepTimer(L.Callback):
    def __init__(self):
        self.times: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.times.append(time.perf_counter() - self._start)


def step_times(name: str, data: SNLIDataModule, steps: int, warmup: int, hidden: int,
               seed: int) -> list[float]:
    cls, extra = MODELS[name]
    L.seed_everything(seed, verbose=False)
    model = cls(vocab_size=data.vocab_size, num_classes=data.num_classes, pad_id=data.pad_id,
                hidden=hidden, plot_pairs=0, **extra)
    timer = StepTimer()
    trainer = L.Trainer(max_steps=warmup + steps, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, callbacks=[timer])
    trainer.fit(model, datamodule=data)
    return timer.times[warmup:]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.nli_step")
    p.add_argument("--steps", type=int, default=100, help="timed steps per model")
    p.add_argument("--warmup", type=int, default=10, help="untimed first steps")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--hidden", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: "
                   + ", ".join(MODELS))
    p.add_argument("--data-dir", default=None, help="SNLI folder (default ../shared/data/snli)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    names = choose(p, "--models", args.models, MODELS, "vanilla")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*(LeafSpec|does not have many workers).*")
    data = SNLIDataModule(data_dir=args.data_dir, train_file="snli_1.0_dev.first1288.jsonl",
                          val_file="snli_1.0_dev.first1288.jsonl",
                          test_file="snli_1.0_dev.first1288.jsonl", batch_size=args.batch_size)
    data.prepare_data()
    data.setup("fit")
    rows = []
    for name in names:
        times = step_times(name, data, args.steps, args.warmup, args.hidden, seed=0)
        rows.append({"model": name, "batch": args.batch_size, "hidden": args.hidden,
                     "threads": args.threads, "steps": len(times),
                     "step_ms": 1000 * statistics.median(times)})
    base = next(r["step_ms"] for r in rows if r["model"] == "vanilla")
    for r in rows:
        r["ratio_vs_vanilla"] = r["step_ms"] / base
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    print(f"training step (forward + backward + Adam), batch {args.batch_size}, hidden "
          f"{args.hidden}, {args.threads} thread(s), median of {args.steps} steps\n")
    print("| model | step (ms) | vs vanilla |\n|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['step_ms']:.1f} | {r['ratio_vs_vanilla']:.2f}x |")


if __name__ == "__main__":
    main()
