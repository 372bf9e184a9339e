"""Transformer blocks shared by TransformerSeq2Seq, TransformerClassifier and TransformerLM.

Vaswani et al. 2017 with sinusoidal positions and either layer normalisation:

* ``norm="pre"`` (tensor2tensor's transformer_tiny / transformer_base_v2 that the CoDA paper
  ran): normalise, transform, dropout, add; a final layer norm after the last layer;
* ``norm="post"`` (Vaswani et al.; fairseq's ``transformer_wmt_en_de`` that the
  Differentiable Window paper ran): transform, dropout, add, normalise; no final layer norm.

Every attention module takes its own mechanism: the per-module flags of
:func:`layer_mechanisms` put a mechanism into the lowest ``layers`` layers (Differentiable
Window Sec. 4.3 / Table 2) and softmax above them.

Incremental decoding: :meth:`Decoder.forward` with a ``cache`` dict runs only the new target
positions and keeps, per layer, the projected keys and values of the earlier positions
(self-attention) and of the memory (cross-attention) in that dict
(:class:`attention.MultiHeadAttention`), as fairseq's ``incremental_state``; a step then
costs O(t) instead of a full re-forward.  Beam search reorders the self-attention caches
(:func:`attention.base.select_rows`; ``TransformerSeq2Seq.generate``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from attention import Mechanism, MultiHeadAttention
from attention.softmax import softmax


def at_least_one(**sizes: int) -> None:
    """Refuse a size below 1, naming the model's argument (``n_encoder_layers must be at least
    1, got 0``): the command prints it as its one line of invalid configuration."""
    for name, value in sizes.items():
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")


@dataclass(frozen=True)
class TransformerConfig:
    """The sizes and regularisation every block of one model shares (passed to every module,
    as nanoGPT's GPTConfig).  The LightningModules build it from their flat settings
    (lit_models.transformer.Transformer)."""

    d_model: int = 128
    n_heads: int = 4
    d_ff: int = 512
    dropout: float = 0.1
    attention_dropout: float = 0.1
    pad_id: int = 0
    norm: Literal["pre", "post"] = "pre"

    def __post_init__(self):
        if self.norm not in ("pre", "post"):
            raise ValueError(f"norm must be 'pre' or 'post', got {self.norm!r}")
        at_least_one(d_model=self.d_model, n_heads=self.n_heads, d_ff=self.d_ff)
        for name in ("dropout", "attention_dropout"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")


def layer_mechanisms(mechanism: Mechanism, n_layers: int, layers: int | None) -> list[Mechanism]:
    """The mechanism in the lowest ``layers`` layers (all when None), softmax above."""
    at_least_one(n_layers=n_layers)
    if layers is not None and not 0 <= layers <= n_layers:
        raise ValueError(f"attention_layers must be in [0, {n_layers}], got {layers}")
    k = n_layers if layers is None else layers
    return [mechanism if i < k else softmax() for i in range(n_layers)]


def sinusoid_positions(length: int, dim: int, device=None) -> Tensor:
    """(length, dim) timing signal of Vaswani et al. Sec. 3.5."""
    pos = torch.arange(length, device=device, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32)
                     * (-math.log(10000.0) / dim))
    pe = torch.zeros(length, dim, device=device)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq[: dim // 2])
    return pe


class Embedding(nn.Module):
    """Token embedding scaled by sqrt(d) plus sinusoidal positions, then dropout."""

    def __init__(self, vocab_size: int, config: TransformerConfig):
        super().__init__()
        d_model, pad_id = config.d_model, config.pad_id
        self.tokens = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        nn.init.normal_(self.tokens.weight, std=d_model**-0.5)
        with torch.no_grad():
            self.tokens.weight[pad_id].zero_()
        self.scale = math.sqrt(d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, ids: Tensor, start: int = 0) -> Tensor:
        """(B,L) ids at positions start .. start+L-1 -> (B,L,D)."""
        x = self.tokens(ids) * self.scale
        positions = sinusoid_positions(start + ids.shape[1], x.shape[-1], x.device)[start:]
        return self.dropout(x + positions)


class FeedForward(nn.Sequential):
    def __init__(self, config: TransformerConfig):
        super().__init__(nn.Linear(config.d_model, config.d_ff), nn.ReLU(),
                         nn.Dropout(config.dropout), nn.Linear(config.d_ff, config.d_model))


class Residual(nn.Module):
    """One sub-layer's residual connection with its layer norm, pre or post
    (module docstring): ``forward(x, output)`` where ``output = sublayer(self.input(x))``."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.norm = nn.LayerNorm(config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.pre = config.norm == "pre"

    def input(self, x: Tensor) -> Tensor:
        return self.norm(x) if self.pre else x

    def forward(self, x: Tensor, output: Tensor) -> Tensor:
        x = x + self.dropout(output)
        return x if self.pre else self.norm(x)


def final_norm(config: TransformerConfig) -> nn.Module:
    """The layer norm after the last layer: pre-norm stacks need it, post-norm ones end
    normalised."""
    return nn.LayerNorm(config.d_model) if config.norm == "pre" else nn.Identity()


def _attention(config: TransformerConfig, mechanism: Mechanism, self_attention: bool):
    return MultiHeadAttention(config.d_model, config.n_heads, mechanism,
                              dropout=config.attention_dropout, self_attention=self_attention)


class EncoderLayer(nn.Module):
    def __init__(self, config: TransformerConfig, mechanism: Mechanism):
        super().__init__()
        self.self_attn = _attention(config, mechanism, self_attention=True)
        self.ff = FeedForward(config)
        self.res_attn, self.res_ff = Residual(config), Residual(config)

    def forward(self, x: Tensor, mask: Tensor | None, need_weights: bool = False):
        h = self.res_attn.input(x)
        a, w = self.self_attn(h, h, mask, need_weights=need_weights)
        x = self.res_attn(x, a)
        x = self.res_ff(x, self.ff(self.res_ff.input(x)))
        return x, w


class DecoderLayer(nn.Module):
    """Causal self-attention, then cross-attention over the memory (omitted in a language
    model), then the feed-forward block.  With ``cache`` (a dict this layer fills), ``y``
    holds only the new positions (module docstring)."""

    def __init__(self, config: TransformerConfig, self_mechanism: Mechanism,
                 cross_mechanism: Mechanism | None):
        super().__init__()
        self.self_attn = _attention(config, self_mechanism, self_attention=True)
        self.self_attn.core.check_causal()  # options that cannot be causal stop the run here
        self.res_self = Residual(config)
        self.cross_attn = None
        if cross_mechanism is not None:
            self.cross_attn = _attention(config, cross_mechanism, self_attention=False)
            self.res_cross = Residual(config)
        self.ff = FeedForward(config)
        self.res_ff = Residual(config)

    def forward(self, y: Tensor, y_mask: Tensor | None, memory: Tensor | None = None,
                memory_mask: Tensor | None = None, need_weights: bool = False,
                cache: dict | None = None):
        h = self.res_self.input(y)
        a, w_self = self.self_attn(h, h, y_mask, causal=True, need_weights=need_weights,
                                   cache=None if cache is None else cache.setdefault("self", {}))
        y = self.res_self(y, a)
        w_cross = None
        if self.cross_attn is not None:
            a, w_cross = self.cross_attn(
                self.res_cross.input(y), memory, memory_mask, need_weights=need_weights,
                cache=None if cache is None else cache.setdefault("cross", {}))
            y = self.res_cross(y, a)
        y = self.res_ff(y, self.ff(self.res_ff.input(y)))
        return y, (w_self, w_cross)


class Encoder(nn.Module):
    """Embedding, ``n_layers`` encoder layers, final layer norm.  The mechanisms given
    here and to :class:`Decoder` are built (the LightningModule builds each flag once)."""

    def __init__(self, vocab_size: int, n_layers: int, mechanism: Mechanism,
                 attention_layers: int | None, config: TransformerConfig):
        super().__init__()
        self.embed = Embedding(vocab_size, config)
        self.layers = nn.ModuleList(
            EncoderLayer(config, m)
            for m in layer_mechanisms(mechanism, n_layers, attention_layers))
        self.norm = final_norm(config)

    def forward(self, ids: Tensor, mask: Tensor, need_weights: bool = False):
        x = self.embed(ids)
        weights = []
        for layer in self.layers:
            x, w = layer(x, mask, need_weights)
            weights.append(w)
        return self.norm(x), weights


class Decoder(nn.Module):
    """Embedding, ``n_layers`` decoder layers (with cross-attention when
    ``cross_mechanism`` is given), final layer norm and the output projection (tied to
    the embedding when ``tie_output``)."""

    def __init__(self, vocab_size: int, n_layers: int, self_mechanism: Mechanism,
                 cross_mechanism: Mechanism | None, attention_layers: int | None,
                 config: TransformerConfig, tie_output: bool = True):
        super().__init__()
        self.embed = Embedding(vocab_size, config)
        selfs = layer_mechanisms(self_mechanism, n_layers, attention_layers)
        crosses = (layer_mechanisms(cross_mechanism, n_layers, attention_layers)
                   if cross_mechanism is not None else [None] * n_layers)
        self.layers = nn.ModuleList(DecoderLayer(config, s, c) for s, c in zip(selfs, crosses))
        self.norm = final_norm(config)
        self.out = nn.Linear(config.d_model, vocab_size, bias=False)
        if tie_output:
            self.out.weight = self.embed.tokens.weight

    def forward(self, ids: Tensor, mask: Tensor | None, memory: Tensor | None = None,
                memory_mask: Tensor | None = None, need_weights: bool = False,
                cache: dict | None = None):
        """ids (B,T) -> logits (B,T,V) and per-layer (self, cross) weights.

        With ``cache`` (an empty dict before the first call, then what this method left in
        it, reordered as beam search needs), ``ids`` are the next positions only: their
        logits equal those rows of the full forward (``mask`` then covers the new positions
        only, or None)."""
        start = 0
        if cache is not None:
            start = cache.get("length", 0)
            layers = cache.setdefault("layers", [{} for _ in self.layers])
            cache["length"] = start + ids.shape[1]
        y = self.embed(ids, start)
        weights = []
        for i, layer in enumerate(self.layers):
            y, w = layer(y, mask, memory, memory_mask, need_weights,
                         cache=None if cache is None else layers[i])
            weights.append(w)
        return self.out(self.norm(y)), weights
