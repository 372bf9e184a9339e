"""Attention heat maps for W&B and notebooks (matplotlib's Agg canvas: no display needed).

:func:`attention_heatmaps` draws one sentence pair as the SNLI write-up's Figures 1-3: the
log weights, then the weights in both directions (each premise word over the hypothesis,
each hypothesis word over the premise).  Quasi-attention (CoDA's M, in [-1, 1]) has no log:
its first panel shows M itself on a diverging scale.  :func:`matrix_heatmap` draws any one
matrix with word labels (an RNN decoder's weights, an attention density matrix),
:func:`matrix_grid` several side by side.  The notebooks' other plots: overlaid histograms
(:func:`histogram_grid`), grouped bars (:func:`grouped_bars`), distributions over words
as lines (:func:`weight_lines`) and values over training steps (:func:`line_grid`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

if TYPE_CHECKING:  # annotations only: report --plot draws without importing torch
    import torch


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
    fig = _figure((3 * max(3.0, 0.35 * lb + 1.5), max(2.5, 0.35 * la + 1.5)))
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
                   title: str = "", row_label: str = "", column_label: str = "",
                   ax=None, limits: tuple[float, float] | None = None,
                   diverging: bool | None = None) -> Figure:
    """One (R, C) matrix as a heat map, rows top to bottom, with word labels: e.g. a
    seq2seq model's attention weights (target words x source words) or an attention density
    matrix (source x source).  Values with a negative entry get a diverging scale centred
    on 0, non-negative ones a sequential scale from 0; ``diverging`` True or False forces
    the one or the other (quasi-attention whose entries may happen to share a sign);
    ``limits`` fixes the scale (panels compared side by side).  Drawn into ``ax`` when given
    (a panel of
    :func:`matrix_grid`), else into a figure of its own; returns the figure."""
    r, c = len(rows), len(columns)
    if tuple(values.shape) != (r, c):
        raise ValueError(f"values must be ({r}, {c}) for {r} row and {c} column labels, got "
                         f"{tuple(values.shape)}")
    v = values.detach().double().cpu().numpy()
    bound = max(float(np.abs(v).max()), 1e-12)
    if diverging is None:
        diverging = bool(v.min() < -1e-6 * bound)  # not a rounding error of a non-negative one
    if diverging:
        kw = dict(cmap="RdBu_r", vmin=-bound, vmax=bound)
    else:
        kw = _scale("viridis", v)
    if limits is not None:
        kw |= dict(vmin=limits[0], vmax=limits[1])
    if ax is None:
        fig = _figure((max(3.0, 0.35 * c + 2.0), max(2.5, 0.35 * r + 1.5)))
        ax = fig.subplots()
    image = ax.imshow(v, aspect="auto", **kw)
    ax.set_xticks(range(c), columns, rotation=90, fontsize=7)
    ax.set_yticks(range(r), rows, fontsize=7)
    ax.set_xlabel(column_label, fontsize=8)
    ax.set_ylabel(row_label, fontsize=8)
    ax.figure.colorbar(image, ax=ax, shrink=0.8)
    if title:
        ax.set_title(title, fontsize=9)
    return ax.figure


def matrix_grid(panels: dict, rows: list[str], columns: list[str], title: str = "",
                column_options: dict[str, dict] | None = None, **heatmap) -> Figure:
    """Heat maps of several matrices over the same words, one :func:`matrix_heatmap` each:
    keys ``(row, column)`` place a panel in a grid (row and column names as titles), plain
    string keys make one row of panels.  ``heatmap``: matrix_heatmap's other options, for
    every panel; ``column_options``: more of them per grid column (e.g. its ``limits``)."""
    keys = [k if isinstance(k, tuple) else ("", k) for k in panels]
    grid_rows, grid_cols = list(dict.fromkeys(k[0] for k in keys)), \
        list(dict.fromkeys(k[1] for k in keys))
    size = (max(3.0, 0.3 * len(columns) + 2.2), max(2.5, 0.3 * len(rows) + 1.8))
    fig = _figure((size[0] * len(grid_cols), size[1] * len(grid_rows)))
    axes = fig.subplots(len(grid_rows), len(grid_cols), squeeze=False)
    for (row, col), values in zip(keys, panels.values()):
        name = f"{row}: {col}" if row else col
        matrix_heatmap(values, rows, columns, title=name,
                       ax=axes[grid_rows.index(row), grid_cols.index(col)],
                       **heatmap | (column_options or {}).get(col, {}))
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def histogram_grid(values: dict[str, dict[str, dict[str, np.ndarray]]],
                   ranges: dict[str, tuple[float, float]], bins: int = 50) -> Figure:
    """Overlaid histograms: ``values[row][series][quantity]`` 1-D arrays, one row of panels
    per row, one panel per quantity of ``ranges`` (its x range), the series overlaid (e.g.
    CoDA's Figure 2: settings x {tanh(E), sigmoid(N), M}, at initialisation and trained)."""
    fig = _figure((4.3 * len(ranges), 3.2 * len(values)))
    axes = fig.subplots(len(values), len(ranges), squeeze=False)
    for r, (row, series) in enumerate(values.items()):
        for c, (quantity, span) in enumerate(ranges.items()):
            ax = axes[r, c]
            for i, (name, arrays) in enumerate(series.items()):
                ax.hist(arrays[quantity], bins=bins, range=span, alpha=0.6, label=name,
                        color="C7" if i == 0 else f"C{i - 1}")
            ax.set_title(f"{quantity}: {row}", fontsize=9)
    axes[0, 0].legend(fontsize=8)
    return fig


def grouped_bars(groups: dict[str, dict[str, list[float]]], n: int, value_label: str,
                 series_label: str = "") -> Figure:
    """One panel per group: for each of its named bars, ``n`` values side by side (e.g. per
    sentence pair, per label y, q(c | y, a, b) of each member c)."""
    fig = _figure((4.0 * len(groups), 3.0))
    axes = fig.subplots(1, len(groups), squeeze=False)[0]
    width = 0.8 / n
    for ax, (group, bars) in zip(axes, groups.items()):
        x = np.arange(len(bars))
        for c in range(n):
            ax.bar(x + (c - (n - 1) / 2) * width, [v[c] for v in bars.values()], width,
                   label=f"{series_label} {c}".strip())
        ax.set_xticks(x, list(bars), fontsize=8)
        ax.set_ylabel(value_label, fontsize=8)
        ax.set_title(group, fontsize=9)
    axes[0].legend(fontsize=7)
    return fig


def weight_lines(panels: dict[str, dict[str, torch.Tensor]], columns: list[str],
                 title: str = "") -> Figure:
    """Distributions over the same words as lines, one panel per key (e.g. a decoder step:
    the attention weights of several mechanisms over the source words)."""
    fig = _figure((max(4.0, 0.3 * len(columns) + 2.0) * len(panels), 3.2))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (name, lines) in zip(axes, panels.items()):
        for label, values in lines.items():
            ax.plot(values.detach().double().cpu().numpy(), marker="o", markersize=3,
                    label=label)
        ax.set_xticks(range(len(columns)), columns, rotation=90, fontsize=7)
        ax.set_title(name, fontsize=9)
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def line_grid(panels: dict, x_label: str = "", title: str = "") -> Figure:
    """Lines over a shared x axis, one panel per key: ``panels[key][label] = (xs, ys)``;
    keys ``(row, column)`` place a panel in a grid, plain string keys make one row (e.g.
    the CoDA gate figures over training steps: modules x figures, a line per setting)."""
    keys = [k if isinstance(k, tuple) else ("", k) for k in panels]
    grid_rows, grid_cols = list(dict.fromkeys(k[0] for k in keys)), \
        list(dict.fromkeys(k[1] for k in keys))
    fig = _figure((3.2 * len(grid_cols), 2.4 * len(grid_rows)))
    axes = fig.subplots(len(grid_rows), len(grid_cols), squeeze=False)
    for (row, col), lines in zip(keys, panels.values()):
        ax = axes[grid_rows.index(row), grid_cols.index(col)]
        for label, (xs, ys) in lines.items():
            ax.plot(xs, ys, marker="o", markersize=2.5, label=label)
        ax.set_title(f"{row}: {col}" if row else col, fontsize=8)
        ax.set_xlabel(x_label, fontsize=7)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def _figure(size: tuple[float, float]) -> Figure:
    """A figure on matplotlib's Agg canvas (no display needed)."""
    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _scale(cmap: str, values: np.ndarray) -> dict:
    return dict(cmap=cmap, vmin=min(0.0, values.min()), vmax=max(1e-12, values.max()))


def figure_image(fig: Figure) -> np.ndarray:
    """The figure rendered to an (H, W, 3) uint8 array (what wandb.Image takes)."""
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()
