"""The papers' figures as short CPU studies: each trains its own small models on the shared
data (../shared/data) for a few hundred steps and draws what the paper drew.  The notebooks in
notebooks/ call these functions (one cell each); the committed figure is made by the command

    python -m experiments.figures coda_fig2 --out results     # CoDA Figure 2, ~10 min, 1 thread

A study writes only into the folder it is given: the command's ``--out``, else
:func:`study_dir` (``<runs>/figures/<study>``, runs/ of the project or $ATTNREPRO_RUNS, never
a tracked file).  Steps come from the environment (``CODA_FIG2_STEPS``, ``WINDOW_MASKS_STEPS``,
``DECOMP_MAPS_STEPS``, ``DENSITY_MATRIX_STEPS``, ``CODA_ANATOMY_STEPS``) so that the tests run
a short setting; ``ATTNREPRO_THREADS`` sets torch's threads.

Studies:
- CoDA Figure 2 (:func:`coda_fig2`): histograms of tanh(E), sigmoid(N) and M of DecompAtt +
  CoDA on SNLI, four settings, at initialisation, after ``FIG2_EXACT`` and ``FIG2_CHECK``
  steps (what the tests recompute: docs/reproducibility.md says how closely on another CPU)
  and after the run;
- the Differentiable Window's soft masks (:func:`window_masks`): boundary distributions,
  token and segment windows and weights of the first layer of a small SST classifier;
- the SNLI write-up's Figures 1-3 (:func:`decomposable_maps`): alignment heat maps of
  vanilla and intra-attention DecompAtt, and the latent mixture's routing q(c | y, a, b);
- the attention density matrix (:func:`density_matrices`): Psi of one source sentence at a
  few decoder steps of MQT and AQT LSTM translators, its diagonal beside additive attention;
- CoDA's anatomy (:func:`coda_anatomy`): tanh(E), sigmoid(N) and M of DecompAtt on SNLI pairs
  and the cross-attention M of a small MLU CoDA Transformer, and the gate diagnostics over
  training for the paper's gate and more open ones.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch import Tensor

from attention import build
from attention.masking import attention_mask
from attention.window import WindowMultiHead, boundary_distributions, window_mask
from datamodules.iwslt import IWSLT15DataModule
from datamodules.mlu import MLUDataModule
from datamodules.nli import SNLIDataModule, collate_pairs, spacy_pair
from datamodules.sst import SSTDataModule
from datamodules.translation import collate_translation
from experiments.harness.claims import (
    BOARD,
    RESULTS,
    experiment_scripts,
    printed_tables,
    run_folders,
)
from experiments.harness.report import format_report
from experiments.harness.runs import configs_with_runs
from experiments.harness.studies import (  # noqa: F401 - the notebooks call them as figures.<name>
    RecordAt,
    compact_png,
    env_steps,
    evaluated,
    first_losses,
    prepared,
    print_check,
    save,
    study_dir,
    train_briefly,
    use_threads,
)
from lit_models import plots
from lit_models.decomp_att import DecompAtt
from lit_models.diagnostics import FIGURES, CodaDiagnostics
from lit_models.mixture import Mixture
from lit_models.rnn_seq2seq import RNNSeq2Seq
from lit_models.transformer import TransformerClassifier, TransformerSeq2Seq

# -- SNLI: the dev prefix of the shared data -------------------------------------------------
SNLI_PREFIX, SNLI_TRAIN = "snli_1.0_dev.first1288.jsonl", 1000


def snli_prefix(lowercase: bool = False) -> tuple[SNLIDataModule, dict[str, Tensor]]:
    """The shared SNLI dev prefix: its first 1,000 labelled pairs train, and the batch of
    the other 288 (held out, file order)."""
    data = prepared(SNLIDataModule(train_file=SNLI_PREFIX, val_file=SNLI_PREFIX,
                                   test_file=SNLI_PREFIX, batch_size=32,
                                   max_train_examples=SNLI_TRAIN, lowercase=lowercase))
    pairs = data.datasets["val"]  # the whole prefix, in file order
    return data, collate_pairs(pairs, list(range(SNLI_TRAIN, len(pairs))), pad_id=data.pad_id)


# -- CoDA Figure 2 ------------------------------------------------------------------------------
#: the run's steps; the steps the tests recompute: FIG2_EXACT (every figure the same on any
#: CPU measured) and FIG2_CHECK (20: float32 training has diverged by then by up to 0.019
#: between CPUs; docs/reproducibility.md)
FIG2_STEPS, FIG2_CHECK, FIG2_EXACT = 500, 20, 5
FIG2_SETTINGS = {  # DecompAtt's arguments (the notebook describes each)
    "before": dict(attention=build("coda"), coda_features="mlp", coda_distance="sum"),
    "default": dict(attention=build("coda")),
    "default, centred gate": dict(attention=build("coda", gate="centered")),
    "L1 sum, centred gate": dict(attention=build("coda", gate="centered"), coda_distance="sum"),
}
FIG2_RANGES = {"sigmoid(N)": (0, 1), "tanh(E)": (-1, 1), "M": (-1, 1)}
FIG2_FILES = ("coda_fig2_summary.csv", "coda_fig2.png")


def fig2_model(setting: str, data: SNLIDataModule) -> DecompAtt:
    return DecompAtt(vocab_size=data.vocab_size, num_classes=data.num_classes,
                     pad_id=data.pad_id, hidden=200, dropout=0.2, lr=1e-3, plot_pairs=0,
                     **FIG2_SETTINGS[setting])


def coda_fig2(steps: int = FIG2_STEPS) -> dict[str, dict[int, dict[str, np.ndarray]]]:
    """setting -> optimizer steps (0, ``FIG2_EXACT``, ``FIG2_CHECK``, ``steps``; those up to
    ``steps``) -> the values of tanh(E), sigmoid(N) and M over every real word pair of the
    held-out batch (seed 0 per setting)."""
    data, batch = snli_prefix()

    def factors(model):
        return {k: v.float().numpy() for k, v in model.alignment_factors(batch).items()}

    out = {}
    for setting in FIG2_SETTINGS:
        L.seed_everything(0, verbose=False)
        model = fig2_model(setting, data)
        record = RecordAt({s for s in (FIG2_EXACT, FIG2_CHECK, steps) if 0 < s <= steps},
                          factors)
        out[setting] = {0: evaluated(factors, model)}
        train_briefly(model, data, steps, [record])
        out[setting] |= dict(sorted(record.records.items()))
    return out


def fig2_summary(v: dict[str, np.ndarray]) -> dict[str, float]:
    """The paper's three observations as fractions of word pairs.  Saturated: within 0.05 of
    0 or 1 (sigmoid) or of -1 or 1 (tanh); near 0: |x| < 0.05."""
    g, e, m = v["sigmoid(N)"], v["tanh(E)"], v["M"]
    return {
        "tanh(E) negative": float(np.mean(e < 0)),
        "tanh(E) mean": float(np.mean(e)),
        "tanh(E) saturated at {-1,1}": float(np.mean(np.abs(e) > 0.95)),
        "tanh(E) near 0": float(np.mean(np.abs(e) < 0.05)),
        "sigmoid(N) mean": float(np.mean(g)),
        "sigmoid(N) saturated at {0,1}": float(np.mean((g < 0.05) | (g > 0.95))),
        "sigmoid(N) above 0.95": float(np.mean(g > 0.95)),
        "M near 0": float(np.mean(np.abs(m) < 0.05)),
        "M negative": float(np.mean(m < -0.05)),
        "corr(M, tanh(E))": float(np.corrcoef(m, e)[0, 1]),
    }


Table = dict[tuple[str, int], dict[str, float]]


def fig2_table(results: dict) -> Table:
    """(setting, steps) -> :func:`fig2_summary`."""
    return {(setting, step): fig2_summary(v) for setting, stages in results.items()
            for step, v in stages.items()}


def write_fig2_summary(table: Table, path: Path) -> Path:
    keys = list(next(iter(table.values())))
    with open(path, "w", newline="") as f:
        f.write("# python -m experiments.figures coda_fig2 (notebooks/coda_fig2.ipynb): "
                "DecompAtt + CoDA, hidden 200, SNLI dev prefix (1,000 pairs train, 288 held "
                f"out), seed 0, {torch.get_num_threads()} thread(s)\n")
        writer = csv.writer(f)
        writer.writerow(["setting", "steps", *keys])
        for (setting, step), row in table.items():
            writer.writerow([setting, step, *(f"{row[k]:.4f}" for k in keys)])
    return path


def read_fig2_summary(path: Path) -> Table:
    with open(path, newline="") as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return {(r.pop("setting"), int(r.pop("steps"))): {k: float(x) for k, x in r.items()}
                for r in rows}


def fig2_readings(table: Table) -> dict[str, dict[str, bool]]:
    """Per setting, the paper's observations after the last recorded step: (1) sigmoid(N)
    acts as a gate (saturated at 0 or 1 for most pairs) and reaches 1; (2) tanh(E) takes both
    signs, more negative than positive, less saturated than at initialisation; (3) M has
    more values near 0 than tanh(E) and follows it (correlation > 0.5)."""
    readings = {}
    for setting in dict.fromkeys(s for s, _ in table):
        steps = sorted(step for s, step in table if s == setting)
        start, end = table[(setting, steps[0])], table[(setting, steps[-1])]
        readings[setting] = {
            "1. sigmoid(N) mostly at 0 or 1": end["sigmoid(N) saturated at {0,1}"] > 0.5,
            "1. sigmoid(N) reaches 1 (>1% above 0.95)": end["sigmoid(N) above 0.95"] > 0.01,
            "2. tanh(E) takes both signs": 0.05 < end["tanh(E) negative"] < 0.95,
            "2. tanh(E) more negative than positive": end["tanh(E) negative"] > 0.5,
            "2. tanh(E) less saturated than at initialisation":
                end["tanh(E) saturated at {-1,1}"] < start["tanh(E) saturated at {-1,1}"],
            "3. M more often near 0 than tanh(E)": end["M near 0"] > end["tanh(E) near 0"],
            "3. M follows tanh(E) (corr > 0.5)": end["corr(M, tanh(E))"] > 0.5,
        }
    return readings


def fig2_figure(results: dict):
    """Histograms (rows: settings; columns: sigmoid(N), tanh(E), M) at initialisation and
    after the last step."""
    last = max(next(iter(results.values())))
    return plots.histogram_grid(
        {setting: {"initialisation": stages[0], f"{last} steps": stages[last]}
         for setting, stages in results.items()}, FIG2_RANGES)


def write_coda_fig2(results: dict, out: Path) -> tuple[Path, Path]:
    """The summary CSV and the figure under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = (out / name for name in FIG2_FILES)
    write_fig2_summary(fig2_table(results), csv_path)
    save(fig2_figure(results), png_path)
    return csv_path, png_path


# -- Differentiable Window: soft masks ----------------------------------------------------------
WINDOW_STEPS, WINDOW_SEGMENT = 300, 3
WINDOW_MODELS = {"softmax": build("softmax"), "MW": build("window", variant="mw"),
                 "AW": build("window", variant="aw")}
#: the sentence drawn: the SST dev sentence of this index (PTB trees, dev.txt, file order)
WINDOW_SENTENCE = 23  # "It 's a remarkably solid and subtly satirical tour de force ."
WINDOW_PANELS = {"left": "phi_l (Eq. 7)", "right": "phi_r (Eq. 8)", "window": "window (Eq. 9)",
                 "segments": f"segments of {WINDOW_SEGMENT} (Eq. 10-11)",
                 "weights": "weights"}


def sst_small() -> SSTDataModule:
    """SST-2 from the shared PTB trees: the first 2,000 training sentences, dev.txt."""
    return prepared(SSTDataModule(format="ptb", granularity="binary", test_file="dev.txt",
                                  max_train_examples=2000, batch_size=32))


def window_classifier(mechanism: str, data: SSTDataModule) -> TransformerClassifier:
    """DW Table 5's classifier, smaller: 2 layers of 64, 2 heads, the mechanism in layer 1."""
    return TransformerClassifier(vocab_size=data.vocab_size, num_classes=data.num_classes,
                                 pad_id=data.pad_id, d_model=64, n_heads=2, d_ff=128,
                                 n_layers=2, attention_layers=1,
                                 attention=WINDOW_MODELS[mechanism], lr=3e-3,
                                 schedule="constant", warmup_steps=0)


def first_layer_window(model: TransformerClassifier, tokens: Tensor, mask: Tensor,
                       segment_size: int = WINDOW_SEGMENT) -> dict[str, Tensor]:
    """The first encoder layer's attention over ``tokens`` (B,L): ``weights`` (B,H,L,L) and,
    for the window, the boundary distributions ``left``, ``right`` (Eq. 7-8), the token
    ``window`` (Eq. 9) and the ``segments`` window (Eq. 10-11) of the same boundaries."""
    attn = model.encoder.layers[0].self_attn
    inputs = {}
    hook = attn.register_forward_hook(lambda module, args, out: inputs.update(x=args[0]))
    try:
        weights = model(tokens, mask, need_weights=True).weights["encoder"][0]
    finally:
        hook.remove()
    out = {"weights": weights}
    if isinstance(attn.core, WindowMultiHead):
        x = inputs["x"]  # the layer's normalised input (B,L,D)
        q, k = attn._heads(attn.q_proj(x)), attn._heads(attn.k_proj(x))
        bounds = attn.core.boundary_scores(q, k, x, x)  # (B,2,H,L,L)
        m = attention_mask(mask, x.shape[1], x.shape[1], False, device=x.device)
        left, right = boundary_distributions(bounds[:, 0], bounds[:, 1], m,
                                             attn.core.boundary_scale)
        out |= {"left": left, "right": right, "window": window_mask(left, right),
                "segments": window_mask(left, right, segment_size)}
    return out


def window_statistics(view: dict[str, Tensor], mask: Tensor) -> dict[str, float]:
    """Over every real query of a batch and every head: the mean attention distance
    sum_j A_ij |i - j| / sum_j A_ij, the weight mass sum_j A_ij (1 for softmax and AW, less
    for MW: Eq. 12 does not renormalise) and,
    for the window, the expected window size sum_j m_ij, the share of queries inside their
    own window (m_ii > 0.5) and the expected boundaries E[l] - i, E[r] - i."""
    w = view["weights"]  # (B,H,L,L)
    n = w.shape[-1]
    pos = torch.arange(n, dtype=w.dtype)
    offset = pos[None, :] - pos[:, None]  # j - i
    real = mask[:, None, :, None].expand(-1, w.shape[1], -1, 1).squeeze(-1)  # (B,H,L)

    def mean(x: Tensor) -> float:
        return float(x[real].mean())

    mass = w.sum(-1)
    stats = {"attention distance": mean((w * offset.abs()).sum(-1) / mass.clamp_min(1e-12)),
             "weight mass": mean(mass)}
    if "window" in view:
        stats |= {"window size": mean(view["window"].sum(-1)),
                  "segment window size": mean(view["segments"].sum(-1)),
                  "queries inside own window": mean(
                      (view["window"].diagonal(dim1=-2, dim2=-1) > 0.5).to(w.dtype)),
                  "E[l] - i": mean((view["left"] * offset).sum(-1)),
                  "E[r] - i": mean((view["right"] * offset).sum(-1))}
    return stats


def window_masks(steps: int = WINDOW_STEPS, out: Path | None = None) -> dict:
    """Train softmax, MW and AW classifiers for ``steps`` (seed 0 each) and take the first
    layer's attention of one dev sentence and statistics over the first 256 dev sentences,
    before and after.  Writes ``window_<model>.png``, ``window_weights.png`` and
    ``window_statistics.json`` under ``out``; returns words, views and statistics."""
    out = out or study_dir("window_masks")
    data = sst_small()
    dev = data.datasets["val"]
    batch = data.collate_fn()([dev[i] for i in range(min(256, len(dev)))])
    one = data.collate_fn()([dev[WINDOW_SENTENCE]])
    words = [data.tokenizer.id_to_token(i) for i in one["tokens"][0].tolist()]

    def measure(model):
        return (first_layer_window(model, one["tokens"], one["mask"]),
                window_statistics(first_layer_window(model, batch["tokens"], batch["mask"]),
                                  batch["mask"]))

    views, stats = {}, {}
    for name in WINDOW_MODELS:
        L.seed_everything(0, verbose=False)
        model = window_classifier(name, data)
        before = evaluated(measure, model)
        after = evaluated(measure, train_briefly(model, data, steps))
        for stage, (view, stat) in (("initialisation", before), (f"{steps} steps", after)):
            views[(name, stage)] = {k: v[0] for k, v in view.items()}  # the one sentence
            stats[(name, stage)] = stat
    stages = ["initialisation", f"{steps} steps"]
    labels = dict(row_label="query", column_label="key")
    for name in ("MW", "AW"):
        panels = {(stage, WINDOW_PANELS[key]): views[(name, stage)][key][0] for stage in stages
                  for key in WINDOW_PANELS}
        top = max(float(v.max()) for v in panels.values())  # Eq. 9 reaches 2 where l = r
        save(plots.matrix_grid(panels, words, words, title=f"{name}: first layer, head 0",
                               limits=(0, top), **labels), out / f"window_{name}.png")
    weights = {(stage, name): views[(name, stage)]["weights"][0] for stage in stages
               for name in WINDOW_MODELS}
    top = max(float(w.max()) for w in weights.values())
    save(plots.matrix_grid(weights, words, words, title="attention weights, first layer, "
                           "head 0", limits=(0, top), **labels), out / "window_weights.png")
    (out / "window_statistics.json").write_text(json.dumps(
        {f"{name} | {stage}": s for (name, stage), s in stats.items()}, indent=1))
    return {"words": words, "views": views, "statistics": stats, "out": out}


# -- the SNLI write-up's Figures 1-3 and the latent mixture's routing ---------------------------
DECOMP_STEPS, MIXTURE_K = 300, 4
#: Figure 1 of the write-up: its own example, "a snowboarder jumps off the snow" and "A skier
#: jumps off the snow" (no label given); its Figures 2-3 ("crabs", "skyline") give no text,
#: so two held-out pairs of the SNLI prefix stand in for them (lines of the file, from 1):
#: "A woman get some food from under a blue tent." / "the lady is getting food under the
#: tent" (entailment), "A man sits beside parked cars on a city street." / "A man is
#: standing in line." (contradiction)
WRITEUP_PAIR = ("a snowboarder jumps off the snow", "A skier jumps off the snow")
HELD_OUT_LINES = (1061, 1108)
DECOMP_MODELS = {"vanilla": dict(), "intra-attention": dict(intra=True)}


def pair_batch(data: SNLIDataModule, premise: list[str], hypothesis: list[str],
               label: int) -> dict[str, Tensor]:
    """A batch of one pair of words (unknown words become <unk>)."""
    ids = [torch.tensor([data.vocab.encode(w.lower() if data.lowercase else w
                                           for w in words)]) for words in (premise, hypothesis)]
    return {"premise": ids[0], "premise_mask": torch.ones_like(ids[0], dtype=torch.bool),
            "hypothesis": ids[1], "hypothesis_mask": torch.ones_like(ids[1], dtype=torch.bool),
            "label": torch.tensor([label])}


def decomp_pairs(data: SNLIDataModule) -> list[dict]:
    """The drawn pairs: name, words, gold label (None for the write-up's pair) and batch."""
    premise, hypothesis = spacy_pair(*WRITEUP_PAIR)
    pairs = [{"name": "write-up Figure 1", "premise": premise, "hypothesis": hypothesis,
              "gold": None, "batch": pair_batch(data, premise, hypothesis, 0)}]
    dataset, itos = data.datasets["val"], data.vocab.itos
    for line in HELD_OUT_LINES:
        index = int((dataset.lines == line).nonzero()[0])
        batch = collate_pairs(dataset, [index], pad_id=data.pad_id)
        pairs.append({"name": f"SNLI prefix line {line}",
                      "premise": [itos[i] for i in batch["premise"][0].tolist()],
                      "hypothesis": [itos[i] for i in batch["hypothesis"][0].tolist()],
                      "gold": data.label_names[int(batch["label"][0])], "batch": batch})
    return pairs


def decomp_model(data: SNLIDataModule, **options) -> DecompAtt:
    settings = dict(vocab_size=data.vocab_size, num_classes=data.num_classes, pad_id=data.pad_id,
                    hidden=200, dropout=0.2, lr=1e-3, plot_pairs=0)
    if "mode" in options:
        return Mixture(**settings, **options)
    return DecompAtt(**settings, **options)


def aligned_words(premise: list[str], hypothesis: list[str], weights_b: Tensor) -> dict:
    """Each hypothesis word -> the premise word it attends most (weights_b (La,Lb), each
    column a distribution over the premise)."""
    return {f"{j}:{w}": premise[int(weights_b[:, j].argmax())] for j, w in enumerate(hypothesis)}


def decomposable_maps(steps: int = DECOMP_STEPS, out: Path | None = None) -> dict:
    """Vanilla and intra-attention DecompAtt and a latent mixture of ``MIXTURE_K`` trained
    ``steps`` each (seed 0, Adam 1e-3, hidden 200, trained embeddings, lowercased words) on
    the SNLI prefix; heat maps of the drawn pairs (``decomp_<model>_pair<i>.png``), the
    mixture's q(c | y, a, b) for every label y (``routing.png``), accuracies on the 288
    held-out pairs and the strongest alignments (``decomp_summary.json``)."""
    out = out or study_dir("decomposable_attention_maps")
    data, held_out = snli_prefix(lowercase=True)
    pairs = decomp_pairs(data)
    summary = {"held-out accuracy": {}, "aligned words": {}, "routing": {}}
    trained = {}
    for name, options in [*DECOMP_MODELS.items(),
                          ("latent mixture", dict(mode="latent", k=MIXTURE_K))]:
        L.seed_everything(0, verbose=False)
        model = train_briefly(decomp_model(data, **options), data, steps)
        model.eval()
        with torch.no_grad():
            accuracy = (model.log_probs(held_out).argmax(-1) == held_out["label"]).float()
        summary["held-out accuracy"][name] = float(accuracy.mean())
        trained[name] = model
    for i, pair in enumerate(pairs):
        for name in DECOMP_MODELS:
            with torch.no_grad():
                o = trained[name](pair["batch"], need_weights=True)
            wa, wb = o.weights_a[0, 0], o.weights_b[0, 0]
            gold = f", gold: {pair['gold']}" if pair["gold"] else ""
            save(plots.attention_heatmaps(pair["premise"], pair["hypothesis"], wa, wb,
                                          title=f"{name}, {steps} steps: {pair['name']}{gold}"),
                 out / f"decomp_{name.split('-')[0]}_pair{i}.png")
            summary["aligned words"][f"{name} | {pair['name']}"] = aligned_words(
                pair["premise"], pair["hypothesis"], wb)
        mixture = trained["latent mixture"]
        with torch.no_grad():
            summary["routing"][pair["name"]] = {
                label: mixture.routing_log_probs(pair["batch"] | {"label": torch.tensor([y])})
                .exp()[0].tolist() for y, label in enumerate(data.label_names)}
    save(plots.grouped_bars(summary["routing"], MIXTURE_K, "q(c | y, a, b)",
                            series_label="member c"), out / "routing.png")
    (out / "decomp_summary.json").write_text(json.dumps(summary, indent=1))
    return {"pairs": pairs, "summary": summary, "out": out}


# -- the attention density matrix ------------------------------------------------------------
DENSITY_STEPS = 200
DENSITY_MODELS = {"additive": build("additive"), "MQT": build("density", scheme="mqt"),
                  "AQT": build("density", scheme="aqt")}
#: the source sentence drawn: this pair of tst2012 (En -> Vi, from 0), teacher-forced on its
#: reference: "Let me tell you about some of the pieces ."
DENSITY_SENTENCE = 3
DENSITY_EVAL = 32  # the first tst2012 pairs of at most 30 words: the statistics


def iwslt_small() -> IWSLT15DataModule:
    """IWSLT'15 En -> Vi from the shared files: those of the first 1,000 training pairs of
    at most 30 words (762), tst2012 to look at."""
    return prepared(IWSLT15DataModule(source="en", target="vi", train_prefix="train.first1000",
                                      val_prefix="tst2012", test_prefix="tst2012",
                                      batch_size=32, max_len=30))


def density_translator(mechanism: str, data: IWSLT15DataModule) -> RNNSeq2Seq:
    """The paper's LSTM translator at a CPU size: 2 + 2 layers of 64, embeddings of 64."""
    return RNNSeq2Seq(src_vocab_size=data.src_vocab_size, tgt_vocab_size=data.tgt_vocab_size,
                      pad_id=data.pad_id, bos_id=data.bos_id, eos_id=data.eos_id,
                      embedding_dim=64, hidden=64, attention=DENSITY_MODELS[mechanism], lr=3e-3)


def density_view(model: RNNSeq2Seq, batch: dict[str, Tensor],
                 steps: Iterable[int] | None = None) -> dict:
    """Teacher-forced on the batch's references: ``weights`` (B,T,N) of the decoder's
    attention and, for the density mechanism, Psi (B,N,N) at each of ``steps`` (all target
    positions when None) with its diagonal ``alpha`` (B,N) and off-diagonal column sums
    ``sigma`` (B,N) = sum_{j != k} Psi[j, k] (Eq. 8's logit is (alpha + sigma) / N)."""
    decoded = model.teacher_forced(batch["src"], batch["src_mask"], batch["tgt_in"])
    view = {"weights": decoded.weights}
    if hasattr(model.attention, "density_matrix"):
        steps = range(decoded.states.shape[1]) if steps is None else steps
        psi = {t: model.attention.density_matrix(decoded.states[:, t], decoded.memory)
               for t in steps}
        alpha = {t: p.diagonal(dim1=-2, dim2=-1) for t, p in psi.items()}
        view |= {"psi": psi, "alpha": alpha,
                 "sigma": {t: p.sum(-2) - alpha[t] for t, p in psi.items()}}
    return view


def density_statistics(view: dict, batch: dict[str, Tensor]) -> dict[str, float]:
    """Over every real (sentence, target position) of the batch: the mean |alpha_k| and
    |sigma_k| over real k (diagonal and off-diagonal parts of the logit), their ratio, and
    the total variation between omega and softmax(alpha / n), Psi with its off-diagonal set
    to 0 (how far the off-diagonal moves attention from what the diagonal alone gives)."""
    src_mask, tgt_mask = batch["src_mask"], batch["tgt_mask"]
    diag, off, tv = [], [], []
    for t, alpha in view["alpha"].items():
        rows = tgt_mask[:, t]  # sentences whose target reaches t
        if not rows.any():
            continue
        real = src_mask[rows]
        a, s = alpha[rows], view["sigma"][t][rows]
        diag.append(a.abs()[real])
        off.append(s.abs()[real])
        plain = (a / real.sum(-1, keepdim=True)).masked_fill(~real, -math.inf).softmax(-1)
        tv.append(0.5 * (view["weights"][rows, t] - plain).abs().sum(-1))
    diag, off, tv = torch.cat(diag), torch.cat(off), torch.cat(tv)
    return {"mean |alpha_k| (diagonal)": float(diag.mean()),
            "mean |sigma_k| (off-diagonal column sum)": float(off.mean()),
            "off-diagonal / diagonal": float(off.mean() / diag.mean()),
            "TV(omega, diagonal only)": float(tv.mean())}


def density_matrices(steps: int = DENSITY_STEPS, out: Path | None = None) -> dict:
    """Additive, MQT and AQT translators trained ``steps`` each (seed 0); for one tst2012
    sentence, Psi at three decoder steps (``psi_<scheme>.png``), its diagonal beside the
    weights (``diagonal_<scheme>.png``); statistics over ``DENSITY_EVAL`` tst2012 pairs
    (``density_statistics.json``)."""
    out = out or study_dir("density_matrix")
    data = iwslt_small()
    dev = data.datasets["val"]
    collate = dict(pad_id=data.pad_id, bos_id=data.bos_id, eos_id=data.eos_id)
    one = collate_translation(dev, [DENSITY_SENTENCE], **collate)
    short = [i for i in range(len(dev)) if max(len(dev.src(i)), len(dev.tgt(i))) <= 30]
    many = collate_translation(dev, short[:DENSITY_EVAL], **collate)
    src_words = [data.src_tokenizer.id_to_token(i) for i in one["src"][0].tolist()]
    tgt_words = [data.tgt_tokenizer.id_to_token(i) for i in one["tgt_out"][0].tolist()]
    t_len = len(tgt_words)
    shown = sorted({t_len // 4, t_len // 2, (3 * t_len) // 4})
    views, stats = {}, {}
    for name in DENSITY_MODELS:
        L.seed_everything(0, verbose=False)
        model = train_briefly(density_translator(name, data), data, steps)
        views[name] = evaluated(lambda m: density_view(m, one, shown), model)
        if name != "additive":
            stats[name] = evaluated(lambda m: density_statistics(density_view(m, many), many),
                                    model)
    for name in ("MQT", "AQT"):
        view = views[name]
        panels = {}
        for t in shown:  # the off-diagonal on a scale of its own: the diagonal dwarfs it
            psi = view["psi"][t][0]
            panels[(f"output {t} ({tgt_words[t]!r})", "Psi")] = psi
            panels[(f"output {t} ({tgt_words[t]!r})", "off-diagonal sigma")] = \
                psi - psi.diag().diag()
        save(plots.matrix_grid(panels, src_words, src_words, title=f"{name}, {steps} steps",
                               row_label="source j", column_label="source k"),
             out / f"psi_{name}.png")
        lines = {}
        for t in shown:
            alpha = view["alpha"][t][0]
            lines[f"output {t} ({tgt_words[t]!r})"] = {
                "softmax(alpha): additive attention on the diagonal": alpha.softmax(-1),
                "diagonal only: softmax(alpha / N)": (alpha / len(alpha)).softmax(-1),
                f"{name} omega": view["weights"][0, t],
                "additive model": views["additive"]["weights"][0, t]}
        save(plots.weight_lines(lines, src_words, title=f"{name}: Psi's diagonal and the "
                                f"attention weights, {steps} steps"),
             out / f"diagonal_{name}.png")
    (out / "density_statistics.json").write_text(json.dumps(stats, indent=1))
    return {"src": src_words, "tgt": tgt_words, "steps": shown, "views": views,
            "statistics": stats, "out": out}


# -- CoDA's anatomy: quasi-attention maps and the gate over training ------------------------------
ANATOMY_STEPS, ANATOMY_RECORDS = 200, 8
#: DecompAtt's alignment: the paper's gate there is sigmoid(N) (Eq. 3), no 1/sqrt(d)
ANATOMY_DECOMP = {"plain gate (default)": build("coda"),
                  "centred gate": build("coda", gate="centered")}
#: the MLU Transformer: the paper's 2 sigmoid(N) with 1/sqrt(d) (Eq. 5, 10), and two ways to
#: open the gate (Sec. 2: centering N; Sec. 2.3: a lower temperature beta)
ANATOMY_MLU = {"scaled gate (default)": build("coda"), "beta 0.25": build("coda", beta=0.25),
               "centred gate": build("coda", gate="centered")}
ANATOMY_PAIRS = (0, 2)  # of decomp_pairs: the write-up's Figure 1, the contradiction pair
ANATOMY_PROBLEM = 0  # the MLU problem drawn: the first generated validation problem
ANATOMY_FILES = ("anatomy_decomp_pair0.png", "anatomy_decomp_pair2.png", "anatomy_mlu_cross.png",
                 "anatomy_gates_mlu.png", "anatomy_gates_decomp.png", "anatomy_summary.json")


def mlu_small() -> MLUDataModule:
    """Generated MLU problems: 20,000 to train, 64 held out (the gate figures' batch)."""
    return prepared(MLUDataModule(train_size=20_000, val_size=64, test_size=64, batch_size=64,
                                  eval_batch_size=64))


def mlu_transformer(setting: str, data: MLUDataModule) -> TransformerSeq2Seq:
    """A small CoDA Transformer for MLU: 2 + 2 layers of 64, 4 heads, CoDA in every module."""
    return TransformerSeq2Seq(src_vocab_size=data.vocab_size, tgt_vocab_size=data.vocab_size,
                              pad_id=data.pad_id, bos_id=data.bos_id, eos_id=data.eos_id,
                              d_model=64, n_heads=4, d_ff=128, dropout=0.0,
                              attention_dropout=0.0, attention=ANATOMY_MLU[setting], lr=3e-3,
                              schedule="constant", warmup_steps=0)


def gate_history(history: list[dict[str, float]]) -> dict[str, dict[str, dict[int, float]]]:
    """CodaDiagnostics.history as module -> figure -> step -> value."""
    out: dict = {}
    for record in history:
        for key, value in record.items():
            if key.startswith("coda/"):
                _, module, figure = key.split("/")
                out.setdefault(module, {}).setdefault(figure, {})[record["step"]] = value
    return out


def gate_figure(histories: dict[str, dict], title: str):
    """Modules x figures, one line per setting (``histories``: setting -> gate_history)."""
    panels: dict = {}
    for setting, modules in histories.items():
        for module, figures in modules.items():
            for figure in FIGURES:
                steps = figures[figure]
                panels.setdefault((module, figure), {})[setting] = (list(steps),
                                                                    list(steps.values()))
    return plots.line_grid(panels, x_label="training step", title=title)


def token_accuracy(model: TransformerSeq2Seq, batch: dict[str, Tensor]) -> float:
    """Teacher-forced: the share of answer tokens (and </s>) that are the argmax of their
    logits."""
    logits = model(batch["src"], batch["src_mask"], batch["tgt_in"], batch["tgt_mask"]).logits
    right = (logits.argmax(-1) == batch["tgt_out"]) & batch["tgt_mask"]
    return float(right.sum() / batch["tgt_mask"].sum())


def negative_share(m: Tensor) -> float:
    """The share of entries of M below -0.01 (those that subtract their value)."""
    return float((m < -0.01).float().mean())


def coda_anatomy(steps: int = ANATOMY_STEPS, out: Path | None = None) -> dict:
    """DecompAtt + CoDA on the SNLI prefix (``ANATOMY_DECOMP``) and a small CoDA Transformer on
    generated MLU problems (``ANATOMY_MLU``), each trained ``steps`` (seed 0) with the gate
    diagnostics (lit_models/diagnostics.py) ``ANATOMY_RECORDS`` times and before the first
    step.  Writes under ``out``: per drawn SNLI pair tanh(E), sigmoid(N) and M at
    initialisation and trained (``anatomy_decomp_pair<i>.png``), the MLU problem's
    cross-attention M per layer and head (``anatomy_mlu_cross.png``), the gate figures over
    training (``anatomy_gates_mlu.png``, ``anatomy_gates_decomp.png``) and the numbers
    (``anatomy_summary.json``)."""
    out = out or study_dir("coda_anatomy")
    out.mkdir(parents=True, exist_ok=True)
    every = max(1, steps // ANATOMY_RECORDS)
    pairs, decomp = decomp_anatomy(steps, every, out)
    problem, mlu = mlu_anatomy(steps, every, out)
    summary = {"steps": steps, "diagnostics every": every, "decomp": decomp, "mlu": mlu}
    (out / "anatomy_summary.json").write_text(json.dumps(summary, indent=1))
    return {"pairs": pairs, "problem": problem, "summary": summary, "out": out}


def decomp_anatomy(steps: int, every: int, out: Path) -> tuple[list[dict], dict]:
    """The DecompAtt half of :func:`coda_anatomy`: each ``ANATOMY_DECOMP`` setting trained
    ``steps`` with the gate diagnostics every ``every``; draws the gates over training and
    the drawn pairs (:func:`draw_decomp_pairs`) under ``out``.  (The drawn pairs, setting ->
    its summary.)"""
    snli, held_out = snli_prefix(lowercase=True)
    pairs = [decomp_pairs(snli)[i] for i in ANATOMY_PAIRS]

    def factors(m):
        return [{k: v.reshape(len(p["premise"]), len(p["hypothesis"]))
                 for k, v in m.alignment_factors(p["batch"]).items()} for p in pairs]

    views: dict = {}
    histories: dict = {}
    summary: dict = {}
    for setting, attention in ANATOMY_DECOMP.items():
        L.seed_everything(0, verbose=False)
        model = decomp_model(snli, attention=attention)
        views[(setting, "initialisation")] = evaluated(factors, model)
        diagnostics = CodaDiagnostics(every_n_steps=every)
        train_briefly(model, snli, steps, [diagnostics])
        views[(setting, f"{steps} steps")] = evaluated(factors, model)
        accuracy = evaluated(lambda m: float(
            (m.log_probs(held_out).argmax(-1) == held_out["label"]).float().mean()), model)
        histories[setting] = gate_history(diagnostics.history)
        summary[setting] = {
            "held-out accuracy": accuracy, "gates": histories[setting],
            "M < -0.01 in the drawn pairs": {
                stage: negative_share(torch.cat([v["M"].flatten() for v in views[(s, stage)]]))
                for s, stage in views if s == setting}}
    save(gate_figure(histories, f"DecompAtt + CoDA on SNLI: the gate over {steps} steps"),
         out / "anatomy_gates_decomp.png")
    draw_decomp_pairs(views, pairs, out)
    return pairs, summary


def draw_decomp_pairs(views: dict, pairs: list[dict], out: Path) -> None:
    """``anatomy_decomp_pair<i>.png``: tanh(E), sigmoid(N) and M of each drawn pair, a row
    per (setting, stage) of ``views`` (the initialisation of the first setting only)."""
    limits = {"tanh(E)": dict(limits=(-1, 1), diverging=True),
              "sigmoid(N)": dict(limits=(0, 1), diverging=False),
              "M": dict(limits=(-1, 1), diverging=True)}
    first = next(iter(ANATOMY_DECOMP))  # initialisation drawn for the default only
    shown = {key: v for key, v in views.items() if key[0] == first or key[1] != "initialisation"}
    for j, (i, pair) in enumerate(zip(ANATOMY_PAIRS, pairs)):
        panels = {(f"{setting}, {stage}", name): matrices[j][name]
                  for (setting, stage), matrices in shown.items() for name in limits}
        gold = f", gold: {pair['gold']}" if pair["gold"] else ""
        save(plots.matrix_grid(panels, pair["premise"], pair["hypothesis"],
                               title=f"DecompAtt + CoDA: {pair['name']}{gold}",
                               column_options=limits, row_label="premise",
                               column_label="hypothesis"),
             out / f"anatomy_decomp_pair{i}.png")


def mlu_anatomy(steps: int, every: int, out: Path) -> tuple[tuple[list[str], list[str]], dict]:
    """The MLU half of :func:`coda_anatomy`: each ``ANATOMY_MLU`` setting trained ``steps``
    with the gate diagnostics every ``every``; draws the drawn problem's cross-attention M
    and the gates over training under ``out``.  ((the problem's source and decoder input
    tokens), setting -> its summary.)"""
    mlu = mlu_small()
    val = mlu.datasets["val"]
    held = mlu.collate(val, list(range(len(val))))
    one = mlu.collate(val, [ANATOMY_PROBLEM])
    src = [mlu.vocab.itos[i] for i in one["src"][0].tolist()]
    tgt = [mlu.vocab.itos[i] for i in one["tgt_in"][0].tolist()]
    maps, histories, summary = {}, {}, {}
    for setting in ANATOMY_MLU:
        L.seed_everything(0, verbose=False)
        model = mlu_transformer(setting, mlu)
        diagnostics = CodaDiagnostics(every_n_steps=every)
        train_briefly(model, mlu, steps, [diagnostics])
        weights = evaluated(lambda m: m(one["src"], one["src_mask"], one["tgt_in"],
                                        one["tgt_mask"], need_weights=True).weights, model)
        cross = [w_cross[0] for _, w_cross in weights["decoder"]]  # per layer (H,Lt,Ls)
        for layer, m in enumerate(cross):
            maps[(setting, f"layer {layer}, head 0")] = m[0]
        histories[setting] = gate_history(diagnostics.history)
        summary[setting] = {
            "teacher-forced token accuracy (64 held out)": evaluated(
                lambda m: token_accuracy(m, held), model),
            "cross-attention M < -0.01 (drawn problem)": negative_share(torch.stack(cross)),
            "gates": histories[setting]}
    save(plots.matrix_grid(maps, tgt, src, diverging=True,
                           title=f"MLU CoDA Transformer, {steps} steps: cross-attention M of "
                                 f"{''.join(src)} (each panel on its own scale)",
                           row_label="decoder input", column_label="problem"),
         out / "anatomy_mlu_cross.png")
    save(gate_figure(histories, f"MLU CoDA Transformer: the gate over {steps} steps"),
         out / "anatomy_gates_mlu.png")
    return (src, tgt), summary


# -- the committed results: report's tables and report --plot's figures --------------------------
@contextmanager
def runs_folder(path: Path):
    """$ATTNREPRO_RUNS set to ``path`` for the block (what ``ATTNREPRO_RUNS=<path> python
    experiments/<script>.py report ...`` does), restored after it."""
    before = os.environ.get("ATTNREPRO_RUNS")
    os.environ["ATTNREPRO_RUNS"] = str(path)
    try:
        yield path
    finally:
        if before is None:
            del os.environ["ATTNREPRO_RUNS"]
        else:
            os.environ["ATTNREPRO_RUNS"] = before


def committed_results(out: Path | None = None) -> dict:
    """Every grid with committed runs under results/ (a folder laid out as a runs folder,
    experiments.harness.claims.run_folders): what ``report --plot`` prints for it, its figures
    written into ``out``; the reports printed into results/*.md of the grids whose runs are
    not committed; and the claims board (results/CLAIMS.md, CLAIMS.png)."""
    from experiments.harness.plots import write_plots  # matplotlib's figures of report --plot

    out = out or study_dir("results")
    runs = []
    for folder in run_folders():
        with runs_folder(folder):
            for experiment in experiment_scripts():
                for grid in experiment.grids.values():
                    for config in configs_with_runs(experiment, grid):
                        runs.append({
                            "experiment": experiment.name, "grid": grid.name, "config": config,
                            "folder": folder, "report": format_report(experiment, grid, config),
                            "plots": write_plots(experiment, grid, config, out),
                            "files": sorted(out.glob(f"{experiment.name}-{grid.name}-{config}"
                                                     "-*.png"))})
    recomputed = {(r["experiment"], r["grid"], r["config"]) for r in runs}
    printed = {}
    for path in sorted(RESULTS.glob("*.md")):
        tables = {k: v for k, v in printed_tables(path).items() if k not in recomputed}
        if path != BOARD and tables:
            printed[path] = tables
    return {"runs": runs, "printed": printed, "board": BOARD,
            "board figure": BOARD.with_suffix(".png"), "out": out}


# -- the command --------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.figures",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("figure", choices=["coda_fig2"])
    parser.add_argument("--out", type=Path, required=True,
                        help="the folder of the summary CSV and the PNG (results: the "
                             "committed ones)")
    parser.add_argument("--steps", type=int, default=FIG2_STEPS)
    args = parser.parse_args(argv)
    use_threads()
    for path in write_coda_fig2(coda_fig2(args.steps), args.out):
        print("wrote", path)

