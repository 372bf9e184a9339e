"""Attention heat maps for W&B and notebooks (matplotlib's Agg canvas: no display needed).

:func:`attention_heatmaps` draws one sentence pair as the SNLI write-up's Figures 1-3: the
log weights, then the weights in both directions (each premise word over the hypothesis,
each hypothesis word over the premise).  Quasi-attention (CoDA's M, in [-1, 1]) has no log:
its first panel shows M itself on a diverging scale.  :func:`matrix_heatmap` draws any one
matrix with word labels (an RNN decoder's weights, an attention density matrix).
"""

from __future__ import annotations

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def attention_heatmaps(premise: list[str], hypothesis: list[str], weights_a: torch.Tensor,
                       weights_b: torch.Tensor, title: str = "") -> Figure:
    """A figure of three panels for one pair, rows = premise words, columns = hypothesis
    words.  ``weights_a[i, j]``: the weight of b_j for a_i; ``weights_b[i, j]``: the weight
    of a_i for b_j (both (La, Lb), as AlignmentCore returns them)."""
    la, lb = len(premise), len(hypothesis)
    for name, w in (("weights_a", weights_a), ("weights_b", weights_b)):
        if tuple(w.shape) != (la, lb):
            raise ValueError(f"{name} must be ({la}, {lb}) for {la} premise and {lb} "
                             f"hypothesis words, got {tuple(w.shape)}")
    wa, wb = weights_a.detach().double().numpy(), weights_b.detach().double().numpy()
    signed = bool((wa < 0).any() or (wb < 0).any())
    if signed:
        first, first_title, first_kw = wa, "quasi-attention M", dict(cmap="RdBu_r", vmin=-1,
                                                                     vmax=1)
    else:
        first = np.log(np.clip(wa, 1e-12, None))
        first_title, first_kw = "log weights (premise -> hypothesis)", dict(cmap="viridis")
    fig = Figure(figsize=(3 * max(3.0, 0.35 * lb + 1.5), max(2.5, 0.35 * la + 1.5)),
                 layout="constrained")
    FigureCanvasAgg(fig)
    panels = [(first, first_title, first_kw),
              (wa, "each premise word over the hypothesis", _scale("Blues", wa)),
              (wb, "each hypothesis word over the premise", _scale("Oranges", wb))]
    for ax, (values, name, kw) in zip(fig.subplots(1, 3), panels):
        image = ax.imshow(values, aspect="auto", **kw)
        ax.set_title(name, fontsize=9)
        ax.set_xticks(range(lb), hypothesis, rotation=90, fontsize=7)
        ax.set_yticks(range(la), premise, fontsize=7)
        fig.colorbar(image, ax=ax, shrink=0.8)
    if title:
        fig.suptitle(title, fontsize=9)
    return fig


def matrix_heatmap(values: torch.Tensor, rows: list[str], columns: list[str],
                   title: str = "", row_label: str = "", column_label: str = "") -> Figure:
    """One (R, C) matrix as a heat map, rows top to bottom, with word labels: e.g. a
    seq2seq model's attention weights (target words x source words) or an attention density
    matrix (source x source).  Values with a negative entry get a diverging scale centred
    on 0, non-negative ones a sequential scale from 0."""
    r, c = len(rows), len(columns)
    if tuple(values.shape) != (r, c):
        raise ValueError(f"values must be ({r}, {c}) for {r} row and {c} column labels, got "
                         f"{tuple(values.shape)}")
    v = values.detach().double().cpu().numpy()
    if (v < 0).any():
        bound = max(float(np.abs(v).max()), 1e-12)
        kw = dict(cmap="RdBu_r", vmin=-bound, vmax=bound)
    else:
        kw = _scale("viridis", v)
    fig = Figure(figsize=(max(3.0, 0.35 * c + 2.0), max(2.5, 0.35 * r + 1.5)),
                 layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    image = ax.imshow(v, aspect="auto", **kw)
    ax.set_xticks(range(c), columns, rotation=90, fontsize=7)
    ax.set_yticks(range(r), rows, fontsize=7)
    ax.set_xlabel(column_label, fontsize=8)
    ax.set_ylabel(row_label, fontsize=8)
    fig.colorbar(image, ax=ax, shrink=0.8)
    if title:
        ax.set_title(title, fontsize=9)
    return fig


def _scale(cmap: str, values: np.ndarray) -> dict:
    return dict(cmap=cmap, vmin=min(0.0, values.min()), vmax=max(1e-12, values.max()))


def figure_image(fig: Figure) -> np.ndarray:
    """The figure rendered to an (H, W, 3) uint8 array (what wandb.Image takes)."""
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()
