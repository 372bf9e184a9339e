"""Ensembles of K decomposable-attention models (docs/papers.md; the SNLI write-up
Sec. 3.2).  A uniform latent variable c in {1..K} picks the member.

Exact ensemble (``mode="exact"``), trained on the marginal likelihood through all K members:

    p(y|a,b) = (1/K) sum_c p(y|a,b; theta_c),   log p = logsumexp_c log p(y|a,b; theta_c) - log K

Latent-variable mixture (``mode="latent"``, the write-up's "VAE ensemble"): an inference
network q(c|y,a,b) (a decomposable-attention network that also sees the label y, embedded
and concatenated before H, with K outputs) routes each example to ONE sampled member; the
ELBO

    log p(y|a,b) >= E_{c~q}[ log p(y|a,b; theta_c) ] - KL( q(c|y,a,b) || Uniform(K) )

is maximised, the KL analytically (sum_c q_c (log q_c + log K)).  c is discrete, so the
gradient of the expectation with respect to q is REINFORCE (score function):

    grad E_q[log p(y|theta_c)] = E_q[ grad log p(y|theta_c)
                                      + (log p(y|theta_c) - b) grad log q(c|y,a,b) ]

with a baseline b that does not depend on c (``baseline``): "none" (b = 0), "mean" (the
mean reward of the OTHER examples of the batch, leave-one-out, so b does not depend on
this example's sample) or "ema" (an exponential moving average of past batches' mean
rewards, decay ``ema_decay``, bias-corrected; none on the first step).  The loss minimised
is  -[log p(y|theta_c) + (log p - b).detach() * log q(c) - KL]: its gradient is minus the
estimator above, so gradient descent ascends the ELBO.  (The write-up's Listing 3 minimises
-log q(c) * CE = log q(c) * log p, the opposite sign, and its q does not see y.)

Members run in one batched call (lit_models/decomp_att.py stacks their parameters).  The
latent mixture evaluates each member only on the examples routed to it: examples are
grouped by sampled member into a (K, M) batch, M the largest group, so a training step
costs ~M/B of the exact ensemble's member work (1/K when routing is balanced, 1 when it
collapses onto one member) plus the inference network.  At evaluation both modes enumerate
all K members: log p(y|a,b) of the exact ensemble.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from lit_models.decomp_att import DecompAtt, entropy
from lit_models.metrics import RoutingEntropy

MODES = ("exact", "latent")
BASELINES = ("none", "mean", "ema")


class LatentTerms(NamedTuple):
    loss: Tensor  # () what is minimised: -(log p + surrogate - KL), batch mean
    elbo: Tensor  # (B,) single-sample ELBO estimate log p(y|theta_c) - KL
    kl: Tensor  # (B,) KL(q || Uniform(K))
    surrogate: Tensor  # (B,) (log p - b) * log q(c): the REINFORCE term (its gradient)
    reward: Tensor  # (B,) log p(y|theta_c), detached


def kl_to_uniform(log_q: Tensor) -> Tensor:
    """KL(q || Uniform(K)) = sum_c q_c (log q_c + log K), analytic, from log q (..., K)."""
    return (log_q.exp() * (log_q + math.log(log_q.shape[-1]))).sum(-1)


def latent_objective(log_q: Tensor, sample: Tensor, log_p: Tensor,
                     baseline: Tensor | float = 0.0) -> LatentTerms:
    """The latent mixture's training objective from q's log-probabilities (B,K), the sampled
    members (B,), their log-likelihoods log p(y|a,b; theta_c) (B,) and a baseline (B,) or
    scalar (see the module docstring)."""
    log_q_c = log_q.gather(-1, sample.unsqueeze(-1)).squeeze(-1)  # log q(c|y,a,b) (B,)
    reward = log_p.detach()
    surrogate = (reward - baseline) * log_q_c  # gradient: (r - b) grad log q(c)
    kl = kl_to_uniform(log_q)
    loss = -(log_p + surrogate - kl).mean()
    return LatentTerms(loss, reward - kl.detach(), kl, surrogate, reward)


def group_by_member(sample: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Examples grouped by sampled member: ``slots`` (K,M) example indices, member c's
    examples first in row c, and ``valid`` (K,M) (False: padding, index 0); M is the
    largest group.  No Python loop over members or examples."""
    counts = torch.bincount(sample, minlength=k)  # (K,)
    width = max(1, int(counts.max()))
    order = torch.argsort(sample, stable=True)  # examples sorted by member
    member = sample[order]
    starts = counts.cumsum(0) - counts
    position = torch.arange(sample.shape[0], device=sample.device) - starts[member]
    slots = torch.zeros(k, width, dtype=torch.long, device=sample.device)
    valid = torch.zeros(k, width, dtype=torch.bool, device=sample.device)
    slots[member, position] = order
    valid[member, position] = True
    return slots, valid


class Mixture(DecompAtt):
    """K decomposable-attention members: exact ensemble or latent-variable mixture.

    Args (besides DecompAtt's, which every member and the inference network share):
        mode: "exact" (marginal likelihood through all members) or "latent" (q routes each
            example to one sampled member; ELBO with REINFORCE).
        k: number of members (the write-up: 3 exact, 4 latent).
        baseline: REINFORCE baseline for the latent mode: "none", "mean" (leave-one-out
            batch mean) or "ema" (moving average over batches).
        ema_decay: decay of the "ema" baseline.

    Logs besides DecompAtt's: per-member accuracy at evaluation; in the latent mode
    ``train/elbo`` (single-sample), ``train/kl``, ``train/reinforce`` (the surrogate
    (log p - b) log q(c)), ``train/reward`` (mean log p(y|theta_c)), ``train/baseline``,
    ``train/q_entropy`` (mean entropy of q), ``train/routing_entropy`` (entropy of the
    batch-mean routing distribution), ``train/routed_member<c>`` (share of examples), and at
    evaluation the exact ELBO sum_c q_c log p(y|theta_c) - KL with the KL and entropies.
    ``train/acc`` is the sampled members' accuracy in the latent mode.
    """

    def __init__(self, mode: Literal["exact", "latent"] = "exact", k: int = 3,
                 baseline: Literal["none", "mean", "ema"] = "mean", ema_decay: float = 0.9,
                 **kwargs):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive number of members, got {k!r}")
        if not 0 <= ema_decay < 1:
            raise ValueError(f"ema_decay must be in [0, 1), got {ema_decay}")
        super().__init__(**kwargs)
        self.mode, self.baseline, self.ema_decay = mode, baseline, ema_decay
        self.inference = None
        if mode == "latent":  # q(c|y,a,b): K outputs, sees the label
            self.inference = self.build_net(k, self.net.vectors, members=1,
                                            condition_classes=self.num_classes)
        self.routing_entropy = torch.nn.ModuleDict()  # evaluation H(q-bar), by stage+split
        self.register_buffer("reward_ema", torch.zeros(()))
        self.register_buffer("reward_ema_steps", torch.zeros((), dtype=torch.long))

    @property
    def n_members(self) -> int:
        return int(self.hparams["k"])

    # -- q
    def routing_log_probs(self, batch: dict[str, Tensor]) -> Tensor:
        """log q(c | y, a, b) (B,K)."""
        if self.inference is None:
            raise RuntimeError("the exact ensemble has no inference network (mode='latent')")
        logits = self.inference(batch["premise"], batch["premise_mask"], batch["hypothesis"],
                                batch["hypothesis_mask"], condition=batch["label"]).logits
        return F.log_softmax(logits[0], dim=-1)

    def reward_baseline(self, reward: Tensor) -> Tensor | float:
        """b for each example, not depending on its own sample (module docstring)."""
        if self.baseline == "mean":
            n = reward.shape[0]
            return (reward.sum() - reward) / (n - 1) if n > 1 else 0.0
        if self.baseline == "ema":
            steps = int(self.reward_ema_steps)
            b = self.reward_ema / (1 - self.ema_decay ** steps) if steps else 0.0
            if self.training:
                self.reward_ema.mul_(self.ema_decay).add_((1 - self.ema_decay) * reward.mean())
                self.reward_ema_steps += 1
            return b
        return 0.0

    # -- training
    def sampled_log_likelihood(self, batch: dict[str, Tensor],
                               sample: Tensor) -> tuple[Tensor, Tensor]:
        """log p(y | a, b; theta_c) (B,) of each example's member c = ``sample`` (B,), and
        whether that member predicts y; each member runs only on its examples, all members
        in one batched call on the (K, M) grouping of :func:`group_by_member`."""
        y, bsz = batch["label"], batch["label"].shape[0]
        slots, valid = group_by_member(sample, self.n_members)  # (K,M)
        logits = self.net(batch["premise"][slots], batch["premise_mask"][slots],
                          batch["hypothesis"][slots], batch["hypothesis_mask"][slots]).logits
        log_p_slots = F.log_softmax(logits, -1).gather(-1, y[slots].unsqueeze(-1)).squeeze(-1)
        log_p = log_p_slots.new_zeros(bsz).index_put((slots[valid],), log_p_slots[valid])
        correct = torch.zeros(bsz, dtype=torch.bool, device=y.device).index_put(
            (slots[valid],), (logits.argmax(-1) == y[slots])[valid])
        return log_p, correct

    def training_step(self, batch, batch_idx):
        if self.mode == "exact":
            return super().training_step(batch, batch_idx)
        bsz = batch["label"].shape[0]
        log_q = self.routing_log_probs(batch)  # (B,K)
        self.stop_if_not_finite(log_q, "routing distribution log q(c | y, a, b)")
        sample = torch.multinomial(log_q.detach().exp(), 1).squeeze(-1)  # c ~ q (B,)
        log_p, correct = self.sampled_log_likelihood(batch, sample)
        if self.baseline == "ema":  # before the moving average takes it in
            self.stop_if_not_finite(log_p, "reward log p(y | a, b; theta_c)")
        baseline = self.reward_baseline(log_p.detach())
        terms = latent_objective(log_q, sample, log_p, baseline)
        log = dict(batch_size=bsz)
        self.log("train/loss", terms.loss, prog_bar=True, **log)
        self.log("train/acc", correct.float().mean(), **log)
        self.log("train/elbo", terms.elbo.mean(), prog_bar=True, **log)
        self.log("train/kl", terms.kl.mean(), **log)
        self.log("train/reinforce", terms.surrogate.mean(), **log)
        self.log("train/reward", terms.reward.mean(), **log)
        log_q = log_q.detach()  # this batch's routing: mean entropy, entropy of the mean
        self.log("train/q_entropy", entropy(log_q).mean(), **log)
        self.log("train/routing_entropy", entropy(log_q.exp().mean(0).clamp_min(1e-30).log()),
                 **log)
        self.log("train/baseline", torch.as_tensor(baseline, dtype=log_p.dtype).mean(), **log)
        for c, share in enumerate(torch.bincount(sample, minlength=self.n_members) / bsz):
            self.log(f"train/routed_member{c}", share, **log)
        return terms.loss

    # -- evaluation: enumerate the members (DecompAtt._evaluate), plus the exact ELBO
    def exact_elbo(self, batch: dict[str, Tensor],
                   member_log_probs: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """(ELBO (B,), KL (B,), log q (B,K)) with the expectation over q computed exactly,
        sum_c q_c log p(y|theta_c) - KL, from every member's log-probabilities (K,B,C)."""
        if member_log_probs is None:
            member_log_probs = self.member_log_probs(batch)
        y = batch["label"]
        log_q = self.routing_log_probs(batch)  # (B,K)
        log_p = member_log_probs.gather(-1, y.expand(self.n_members, -1).unsqueeze(-1))
        log_p = log_p.squeeze(-1).transpose(0, 1)  # log p(y|theta_c) (B,K)
        kl = kl_to_uniform(log_q)
        return (log_q.exp() * log_p).sum(-1) - kl, kl, log_q

    def _evaluate_more(self, batch, member_log_probs: Tensor, stage: str, suffix: str) -> None:
        if self.inference is None:
            return
        elbo, kl, log_q = self.exact_elbo(batch, member_log_probs)
        log = dict(batch_size=elbo.shape[0], add_dataloader_idx=False)
        # means over the whole split and every process (self.log of a batch value would be
        # rank 0's shard under DDP, and a mean of batch means)
        self.log_mean(f"{stage}/elbo{suffix}", elbo.mean(), elbo.shape[0], **log)
        self.log_mean(f"{stage}/kl{suffix}", kl.mean(), kl.shape[0], **log)
        self.log_mean(f"{stage}/q_entropy{suffix}", entropy(log_q).mean(), log_q.shape[0],
                      **log)
        key = f"{stage}{suffix}"
        if key not in self.routing_entropy:
            self.routing_entropy[key] = RoutingEntropy(self.n_members).to(self.device)
        self.routing_entropy[key].update(log_q)
        self.log(f"{stage}/routing_entropy{suffix}", self.routing_entropy[key],
                 metric_attribute=f"routing_entropy.{key}", **log)
