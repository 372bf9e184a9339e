"""Metrics shared by the models (torchmetrics, so they reduce correctly across processes)."""

from __future__ import annotations

import torch
from torchmetrics import Metric


class SequenceExactMatch(Metric):
    """Accuracy per sequence: a prediction counts only if every target token up to and
    including end-of-sequence matches (CoDA Tables 6-7)."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, eos_id: int):
        super().__init__()
        self.eos_id = eos_id
        self.add_state("correct", default=torch.tensor(0), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, pred: torch.Tensor, target: torch.Tensor, target_mask: torch.Tensor) -> None:
        """pred (B, Lp) ids, target (B, Lt) ids ending with eos, target_mask (B, Lt)."""
        lt = target.shape[1]
        if pred.shape[1] < lt:  # a shorter prediction cannot match beyond its end
            pred = torch.nn.functional.pad(pred, (0, lt - pred.shape[1]), value=-1)
        same = (pred[:, :lt] == target) | ~target_mask
        self.correct += same.all(dim=1).sum()
        self.total += target.shape[0]

    def compute(self) -> torch.Tensor:
        return self.correct.float() / self.total.clamp(min=1)


class Perplexity(Metric):
    """exp of the mean negative log-likelihood per real target token, over every token seen
    since the last reset: token-weighted across batches, not a mean of batch perplexities
    (Differentiable Window Table 6)."""

    full_state_update = False
    higher_is_better = False

    def __init__(self):
        super().__init__()
        self.add_state("nll", default=torch.tensor(0.0, dtype=torch.float64),
                       dist_reduce_fx="sum")
        self.add_state("tokens", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, token_nll: torch.Tensor, mask: torch.Tensor) -> None:
        """token_nll (B, L) -log p(target) per position, mask (B, L) True at real targets."""
        if token_nll.shape != mask.shape or mask.dtype != torch.bool:
            raise ValueError(f"expected token_nll and a boolean mask of one shape, got "
                             f"{tuple(token_nll.shape)} and {tuple(mask.shape)} {mask.dtype}")
        self.nll += token_nll.detach().double().masked_fill(~mask, 0.0).sum()
        self.tokens += mask.sum()

    def compute(self) -> torch.Tensor:
        return torch.exp(self.nll / self.tokens.clamp(min=1)).float()
