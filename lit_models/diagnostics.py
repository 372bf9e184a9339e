"""Where CoDA's gate stands during training: per CoDA module, figures of its quasi-attention
M = tanh(E) * gate(N) on one fixed held-out batch, every ``every_n_steps`` optimiser steps.

Tay et al. (2019, Sec. 2) name the knobs that open or close the gate: centering N (Eq. 4) or
2 * sigmoid (Eq. 5), and the temperatures alpha, beta (Sec. 2.3).  With unit-variance q and
k, sigmoid(-||q - k||_1 / sqrt(d)) starts near 0: these figures show whether it stays shut.

    --trainer.callbacks+=lit_models.diagnostics.CodaDiagnostics
    --trainer.callbacks.every_n_steps=1000

Figures (:func:`quasi_attention_statistics`), each a mean over the entries the module's mask
allows (real keys, causally visible, and real queries: the batch's source mask for encoder
modules, its target mask for decoder ones):

* ``gate_mean``: the gate as applied, sigmoid(N) (``plain``, ``centered``) or 2 sigmoid(N)
  (``scaled``);
* ``gate_shut`` / ``gate_open``: the share of entries with sigmoid(N) < 0.05 / > 0.95 (the
  sigmoid itself, before any 2x, so that the shares mean the same for every gate);
* ``m_abs``: mean |M_ij|;
* ``row_sum_abs``: mean over real query rows of |sum_j M_ij| (a softmax row sums to 1);
* ``e_negative``: the share of tanh(E) < 0 (entries that subtract their value).

They are logged as ``coda/<module>/<figure>`` at the step they were taken (step 0 = before
the first update), to every logger of the run (CSV: metrics.csv; W&B), and kept in
:attr:`CodaDiagnostics.history`.  ``<module>`` names the place: ``encoder.<layer>.self``,
``decoder.<layer>.self``, ``decoder.<layer>.cross`` in Transformers, the module path
elsewhere (DecompAtt's alignment, the RNN decoder's attention).
"""

from __future__ import annotations

import inspect
import re

import lightning as L
import torch
from torch import Tensor, nn

from attention.coda import CodaAlignment, CodaDecoder, CodaMultiHead
from attention.masking import pair_mask

FIGURES = ("gate_mean", "gate_shut", "gate_open", "m_abs", "row_sum_abs", "e_negative")
#: sigmoid(N) below SHUT counts as a shut gate, above OPEN as an open one
SHUT, OPEN = 0.05, 0.95
#: each figure's name in a printed table
LABELS = {"gate_mean": "mean gate", "gate_shut": f"share < {SHUT}", "gate_open": f"share > {OPEN}",
          "m_abs": "mean abs(M)", "row_sum_abs": "mean abs(row sum of M)",
          "e_negative": "share of tanh(E) < 0"}


def quasi_attention_statistics(tanh_e: Tensor, sigmoid_n: Tensor, m: Tensor,
                               valid: Tensor | None, gate: str) -> dict[str, float]:
    """The figures of the module docstring from (tanh(E), sigmoid(N), M) (..., Lq, Lk) and
    a boolean ``valid`` broadcastable to them (None: every entry)."""
    valid = torch.ones_like(m, dtype=torch.bool) if valid is None else valid.expand(m.shape)
    n = valid.sum().clamp(min=1)
    applied = 2 * sigmoid_n if gate == "scaled" else sigmoid_n

    def mean(x: Tensor) -> float:
        return float(x.double().masked_fill(~valid, 0).sum() / n)

    rows = valid.any(-1)  # (..., Lq): query rows with at least one visible key
    row_sums = m.double().masked_fill(~valid, 0).sum(-1).abs()
    return {"gate_mean": mean(applied), "gate_shut": mean((sigmoid_n < SHUT).double()),
            "gate_open": mean((sigmoid_n > OPEN).double()), "m_abs": mean(m.abs()),
            "row_sum_abs": float(row_sums.masked_select(rows).mean()) if rows.any() else 0.0,
            "e_negative": mean((tanh_e < 0).double())}


def module_label(path: str) -> str:
    """A readable name for a CoDA core's module path: ``encoder.layers.0.self_attn.core`` ->
    ``encoder.0.self``, ``decoder.layers.1.cross_attn.core`` -> ``decoder.1.cross``."""
    match = re.fullmatch(r"(?:.*\.)?(encoder|decoder)\.layers\.(\d+)\.(self|cross)_attn\.core",
                         path)
    if match:
        return ".".join(match.groups())
    return path.removesuffix(".core") or "attention"


def teacher_forced(model: L.LightningModule, batch: dict) -> None:
    """One forward of ``model`` on ``batch`` as its training step does it (teacher forcing),
    for the suite's batch families: seq2seq (src, tgt_in), pairs (premise, hypothesis),
    token sequences (tokens, mask)."""
    if "src" in batch and "tgt_in" in batch:
        model(batch["src"], batch["src_mask"], batch["tgt_in"], batch.get("tgt_mask"))
    elif "premise" in batch:
        model(batch)
    elif "tokens" in batch:
        model(batch["tokens"], batch["mask"])
    else:
        raise ValueError("CodaDiagnostics: a batch needs src/tgt_in (seq2seq), premise/"
                         f"hypothesis (pairs) or tokens/mask; this one has {sorted(batch)}")


def _query_mask(label: str, batch: dict) -> Tensor | None:
    """(B, Lq) real query positions of a module, where the batch tells them."""
    if label.startswith("encoder"):
        return batch.get("src_mask", batch.get("mask"))
    if "decoder" in label:  # decoder.<l>.self / .cross, an RNN decoder's attention
        return batch.get("tgt_mask", batch.get("mask"))
    return None


def _rows(batch, n: int):
    """The first ``n`` examples of a batch (a dict of tensors with the batch first)."""
    return {k: v[:n] if isinstance(v, Tensor) and v.dim() > 0 else v for k, v in batch.items()}


class CodaDiagnostics(L.Callback):
    """Logs the gate figures of every CoDA module (module docstring) every ``every_n_steps``
    optimiser steps and before the first, on the first ``max_examples`` examples of the
    first validation batch (the same batch at every step and after a resume; the first
    training batch when there is no validation loader), with dropout off."""

    def __init__(self, every_n_steps: int = 1000, max_examples: int = 64):
        if every_n_steps < 1 or max_examples < 1:
            raise ValueError("CodaDiagnostics: every_n_steps and max_examples must be at least "
                             f"1, got {every_n_steps} and {max_examples}")
        self.every_n_steps, self.max_examples = every_n_steps, max_examples
        self.history: list[dict[str, float]] = []
        self._batch: dict | None = None

    @staticmethod
    def modules(model: nn.Module) -> dict[str, nn.Module]:
        """Label -> CoDA core of every CoDA module of ``model``."""
        return {module_label(path): m for path, m in model.named_modules()
                if isinstance(m, CodaMultiHead | CodaAlignment | CodaDecoder)}

    def _fixed_batch(self, trainer: L.Trainer, fallback: dict | None) -> dict | None:
        if self._batch is None:
            datamodule = getattr(trainer, "datamodule", None)
            batch = None
            if datamodule is not None and hasattr(datamodule, "val_dataloader"):
                try:
                    batch = next(iter(datamodule.val_dataloader()))
                except (StopIteration, TypeError, NotImplementedError):
                    batch = None
            batch = fallback if batch is None else batch
            if isinstance(batch, dict):
                self._batch = _rows(batch, self.max_examples)
        return self._batch

    @torch.no_grad()
    def figures(self, model: L.LightningModule, batch: dict) -> dict[str, float]:
        """``coda/<module>/<figure>`` of ``model`` on ``batch`` (model left in its mode)."""
        cores = self.modules(model)
        calls: dict[str, list] = {label: [] for label in cores}
        hooks = [core.register_forward_hook(
            lambda mod, args, kwargs, out, label=label: calls[label].append((args, kwargs)),
            with_kwargs=True) for label, core in cores.items()]
        was_training = model.training
        model.eval()
        try:
            teacher_forced(model, batch)
        finally:
            model.train(was_training)
            for hook in hooks:
                hook.remove()
        out = {}
        for label, core in cores.items():
            if not calls[label]:
                continue
            # a decoder going step by step (input feeding) calls its core once per step:
            # the steps' rows are put together along the query dimension
            parts = [self._factors(core, args, kwargs) for args, kwargs in calls[label]]
            te, gn, m, valid = (torch.cat(p, dim=-2) for p in zip(*parts))
            queries = _query_mask(label, batch)  # (B,Lq) real query rows
            if queries is not None and queries.shape[-1] == m.shape[-2]:
                rows = queries.to(m.device)
                valid = valid & (rows[:, None, :, None] if m.dim() == 4 else rows[:, :, None])
            stats = quasi_attention_statistics(te, gn, m, valid, core.options["gate"])
            out.update({f"coda/{label}/{name}": value for name, value in stats.items()})
        return out

    @staticmethod
    def _factors(core: nn.Module, args: tuple, kwargs: dict) -> tuple[Tensor, ...]:
        """(tanh(E), sigmoid(N), M, valid) of one call of a CoDA core, each (..., Lq, Lk);
        ``valid``: the entries its mask allows."""
        call = inspect.signature(core.forward).bind(*args, **kwargs).arguments
        if isinstance(core, CodaMultiHead):
            q, k = call["q"], call["k"]
            key_mask, causal = call.get("key_mask"), call.get("causal", False)
            factors = core.factors(q, k, key_mask=key_mask, causal=causal)
            valid = core.mask(q, k, key_mask, causal)[0]
        elif isinstance(core, CodaAlignment):
            mask_a, mask_b = call.get("mask_a"), call.get("mask_b")
            factors = core.factors(call["a"], call["b"], mask_a, mask_b)
            valid = pair_mask(mask_a, mask_b)
        else:  # CodaDecoder: decoder states over the memory
            factors = core.factors(call["s"], call["memory"])
            mask = call["memory"]["mask"]
            valid = None if mask is None else mask[:, None, :]  # (B,1,N)
        m = factors[-1]
        valid = (torch.ones_like(m, dtype=torch.bool) if valid is None
                 else valid.expand(m.shape).clone())
        return (*factors, valid)

    def _log(self, trainer: L.Trainer, model: L.LightningModule, fallback=None) -> None:
        if not trainer.is_global_zero or not self.modules(model):
            return
        batch = self._fixed_batch(trainer, fallback)
        if batch is None:
            return
        batch = model.transfer_batch_to_device(batch, model.device, 0)
        figures = self.figures(model, batch)
        step = trainer.global_step
        self.history.append({"step": step, **figures})
        for logger in trainer.loggers:
            logger.log_metrics(figures, step=step)

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.global_step == 0:
            self._log(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % self.every_n_steps == 0 and (
                not self.history or self.history[-1]["step"] != trainer.global_step):
            self._log(trainer, pl_module, batch)
