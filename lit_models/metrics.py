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

    @staticmethod
    def matches(pred: torch.Tensor, target: torch.Tensor,
                target_mask: torch.Tensor) -> torch.Tensor:
        """(B,) bool: whether each prediction equals its target up to and including eos;
        pred (B, Lp) ids, target (B, Lt) ids ending with eos, target_mask (B, Lt)."""
        lt = target.shape[1]
        if pred.shape[1] < lt:  # a shorter prediction cannot match beyond its end
            pred = torch.nn.functional.pad(pred, (0, lt - pred.shape[1]), value=-1)
        return ((pred[:, :lt] == target) | ~target_mask).all(dim=1)

    def update(self, pred: torch.Tensor, target: torch.Tensor, target_mask: torch.Tensor) -> None:
        """pred (B, Lp) ids, target (B, Lt) ids ending with eos, target_mask (B, Lt)."""
        self.correct += self.matches(pred, target, target_mask).sum()
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


class RoutingEntropy(Metric):
    """H(q-bar): the entropy of the mean routing distribution q(c|x) over every example seen
    since the last reset (and every process), i.e. how evenly a split is spread over the
    mixture's members; 0 when all go to one member, log K when the split is spread evenly.
    Not a mean of per-batch entropies, which depends on how the split is batched."""

    full_state_update = False

    def __init__(self, n_members: int):
        super().__init__()
        self.add_state("q_sum", default=torch.zeros(n_members, dtype=torch.float64),
                       dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, log_q: torch.Tensor) -> None:
        """log_q (B, K): each example's log q(c|x)."""
        self.q_sum += log_q.detach().double().exp().sum(0)
        self.total += log_q.shape[0]

    def compute(self) -> torch.Tensor:
        q = self.q_sum / self.total.clamp(min=1)
        return -(q * q.clamp_min(1e-30).log()).sum().float()


class GroupedRanking(Metric):
    """MAP, MRR and P@1 of candidates ranked by score within their group (question or
    dialogue context), with torchmetrics' retrieval functions (CoDA Table 2).

    - Ties: candidates of equal score are ordered by ``index`` (their position in the split's
      file), so the result never depends on a sort's whim (torchmetrics sorts with ``topk``,
      whose order among equal scores is unspecified).
    - Groups without a positive candidate have no defined AP or RR: they are skipped (not
      counted as 0) and counted in ``skipped`` -- torchmetrics' ``empty_target_action="skip"``
      and the standard WikiQA evaluation, which removes such questions.  Groups whose every
      candidate is positive score 1.
    - Every example is counted once: an ``index`` seen twice (a distributed sampler repeating
      samples to even out the processes) keeps its first score.
    - P@1 is the share of groups whose top candidate is positive: R10@1 on the Ubuntu
      Dialogue Corpus, where each group holds one positive and nine distractors.
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self):
        super().__init__()
        for name in ("score", "target", "group", "index"):
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, score: torch.Tensor, target: torch.Tensor, group: torch.Tensor,
               index: torch.Tensor) -> None:
        """score (B,) float (higher = more relevant), target (B,) 0/1, group (B,) and index
        (B,) integers."""
        shapes = {tuple(t.shape) for t in (score, target, group, index)}
        if len(shapes) != 1 or score.dim() != 1:
            raise ValueError(f"GroupedRanking.update expects four (B,) tensors, got shapes "
                             f"{[tuple(t.shape) for t in (score, target, group, index)]}")
        self.score.append(score.detach().double())
        self.target.append(target.detach().long())
        self.group.append(group.detach().long())
        self.index.append(index.detach().long())

    def compute(self) -> dict[str, torch.Tensor]:
        from torchmetrics.functional.retrieval import (
            retrieval_average_precision,
            retrieval_precision,
            retrieval_reciprocal_rank,
        )

        cat = [(torch.cat(s) if s else torch.zeros(0)) if isinstance(s, list) else s
               for s in (self.score, self.target, self.group, self.index)]
        if cat[0].numel() == 0:
            nan = torch.tensor(float("nan"))
            return {"map": nan, "mrr": nan, "p@1": nan, "groups": torch.tensor(0),
                    "skipped": torch.tensor(0)}
        score, target, group, index = (t.cpu() for t in cat)
        index, first = _first_occurrences(index)
        score, target, group = score[first], target[first], group[first]
        # one total order: group, then score (descending), then index (ascending)
        order = _lexsort([index, -score, group])
        score, target, group = score[order], target[order], group[order]
        starts = torch.cat([torch.tensor([0]), (group[1:] != group[:-1]).nonzero()[:, 0] + 1,
                            torch.tensor([len(group)])]).tolist()
        ap, rr, p1, skipped = [], [], [], 0
        for a, b in zip(starts[:-1], starts[1:]):
            relevant = target[a:b].bool()
            if not relevant.any():
                skipped += 1
                continue
            # the tie-free order as scores n..1: torchmetrics counts a candidate whose score is
            # not positive as irrelevant (its scores are meant to be probabilities)
            rank_score = torch.arange(b - a, 0, -1, dtype=torch.float64)
            ap.append(retrieval_average_precision(rank_score, relevant))
            rr.append(retrieval_reciprocal_rank(rank_score, relevant))
            p1.append(retrieval_precision(rank_score, relevant, top_k=1))
        return {"map": _mean(ap), "mrr": _mean(rr), "p@1": _mean(p1),
                "groups": torch.tensor(len(ap)), "skipped": torch.tensor(skipped)}


def _mean(values: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(values).mean().float() if values else torch.tensor(float("nan"))


def _lexsort(keys: list[torch.Tensor]) -> torch.Tensor:
    """The permutation sorting by ``keys[-1]``, then ``keys[-2]``, ... (numpy's lexsort)."""
    order = torch.arange(len(keys[0]))
    for key in keys:  # least significant first; stable sorts keep the earlier keys' order
        order = order[torch.sort(key[order], stable=True).indices]
    return order


def _first_occurrences(index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct values of ``index`` and the position of each one's first occurrence."""
    values, inverse = torch.unique(index, return_inverse=True)
    positions = torch.arange(len(index))
    first = torch.full((len(values),), len(index), dtype=torch.long)
    first = first.scatter_reduce(0, inverse, positions, reduce="amin")
    return values, first
