"""Decoding speed of the Transformer translator: incremental decoding (cached keys and values,
lit_models/blocks.py) against re-running the decoder over the whole prefix at every step, for
greedy search and beam 4, measured in one run.

    python -m benchmarks.decoding                       # t2t base size, 32 sources of 30 tokens
    python -m benchmarks.decoding --quick --json        # smoke

A randomly initialised ``TransformerSeq2Seq`` (eval mode) decodes a batch of random sources
for exactly ``--length`` tokens (eos is never chosen: its logit is masked by a hook on the
output layer, so every setting generates the same number of tokens and the comparison is of
equal work).  After ``--warmup`` runs the median of ``--repeats`` runs is reported as
sentences per second; ratios are against the cached greedy row of the same run.  A step of the
cached decoder attends over the t earlier positions (O(t)); the uncached one recomputes every
layer for all t positions (O(t^2) attention and O(t) projections per step), so the gap grows
with the output length.  Not a test: no assertion is made on the times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from attention import build
from fileio import write_atomic
from lit_models.transformer import TransformerSeq2Seq

SIZES = {"base": dict(d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6,
                      n_decoder_layers=6),
         "tiny": dict(d_model=128, n_heads=4, d_ff=512, n_encoder_layers=2,
                      n_decoder_layers=2)}
QUICK = dict(size="tiny", batch=2, length=6, vocab=50, warmup=0, repeats=1)
EOS = 3


def model(size: str, vocab: int, attention: str) -> TransformerSeq2Seq:
    torch.manual_seed(0)
    m = TransformerSeq2Seq(vocab, vocab, dropout=0.0, attention_dropout=0.0,
                           attention=build(attention), **SIZES[size]).eval()

    def never_eos(module, inputs, logits):
        logits[..., EOS] = float("-inf")
        return logits

    m.decoder.out.register_forward_hook(never_eos)
    return m


def measure(m, src, mask, beam: int, cached: bool, length: int, warmup: int,
            repeats: int) -> float:
    """Median seconds of one decoding of the batch."""
    times = []
    for i in range(warmup + repeats):
        start = time.perf_counter()
        out = m.generate(src, mask, beam_size=beam, max_len=length, cached=cached)
        if i >= warmup:
            times.append(time.perf_counter() - start)
        assert out.tokens.shape[1] == length
    return statistics.median(times)


def run(size: str, batch: int, length: int, vocab: int, warmup: int, repeats: int,
        attention: str = "softmax", threads: int | None = None) -> list[dict]:
    if threads:
        torch.set_num_threads(threads)
    m = model(size, vocab, attention)
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, vocab, (batch, length), generator=g)
    mask = torch.ones_like(src, dtype=torch.bool)
    rows = []
    for beam in (1, 4):
        for cached in (True, False):
            seconds = measure(m, src, mask, beam, cached, length, warmup, repeats)
            rows.append({"size": size, "attention": attention, "batch": batch,
                         "length": length, "beam": beam, "cached": cached,
                         "seconds": seconds, "sentences_per_s": batch / seconds})
    base = rows[0]["sentences_per_s"]
    for row in rows:
        row["ratio_vs_cached_greedy"] = row["sentences_per_s"] / base
    for beam in (1, 4):
        cached, uncached = (r for r in rows if r["beam"] == beam)
        cached["speedup_of_cache"] = uncached["seconds"] / cached["seconds"]
    return rows


def markdown(rows: list[dict], command: str) -> str:
    r0 = rows[0]
    lines = [f"Decoding {r0['batch']} random sources of {r0['length']} tokens into "
             f"{r0['length']} tokens, {r0['size']} size, {r0['attention']} attention, "
             f"{torch.get_num_threads()} threads (`{command}`):", "",
             "| search | decoder | sentences/s | vs cached greedy | cache speed-up |",
             "|---|---|---|---|---|"]
    for r in rows:
        search = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
        speedup = f"{r['speedup_of_cache']:.2f}x" if "speedup_of_cache" in r else ""
        lines.append(f"| {search} | {'cached' if r['cached'] else 'full re-forward'} | "
                     f"{r['sentences_per_s']:.2f} | {r['ratio_vs_cached_greedy']:.2f}x | "
                     f"{speedup} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="base")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=30)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--attention", default="softmax")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one run (smoke)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--markdown", metavar="PATH", help="append the table to PATH")
    args = parser.parse_args(argv)
    settings = dict(size=args.size, batch=args.batch, length=args.length, vocab=args.vocab,
                    warmup=args.warmup, repeats=args.repeats)
    if args.quick:
        settings.update(QUICK)
    rows = run(**settings, attention=args.attention, threads=args.threads)
    if args.json:
        for row in rows:
            print(json.dumps(row))
    table = markdown(rows, "python -m benchmarks.decoding" + (" --quick" if args.quick else ""))
    if not args.json:
        print(table)
    if args.markdown:
        path = Path(args.markdown)  # appended to: the attention benchmark's table comes first
        before = path.read_text(encoding="utf-8") if path.exists() else ""
        write_atomic(path, before + "\n## Incremental decoding\n\n" + table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
