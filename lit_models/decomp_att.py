"""Decomposable attention for natural language inference (Parikh et al. 2016; docs/papers.md,
the SNLI write-up Sec. 3.1; the base model of CoDA Tables 2-3).

For a premise a = (a_1..a_la) and a hypothesis b = (b_1..b_lb) of embedded words:

    embed      a_i = P w(a_i)        frozen pretrained vectors w, projection P (no bias) to 200-d;
                                     or a trained 200-d embedding when no vectors are given
    intra      f_ij = F_intra(a_i) . F_intra(a_j)                                        (Eq. 9)
               a'_i = sum_j softmax_j(f_ij + d_{i-j}) a_j,  a_bar_i = [a_i; a'_i]        (Eq. 10)
               (optional; d is a learned scalar per distance bucket |i-j| = 0..10, all
               distances > 10 share one bucket)
    attend     e_ij = F(a_bar_i) . F(b_bar_j)                                            (Eq. 3)
               beta_i = sum_j softmax_j(e_ij) b_bar_j,  alpha_j = sum_i softmax_i(e_ij) a_bar_i
                                                                                         (Eq. 4)
    compare    v1_i = G([a_bar_i; beta_i]),  v2_j = G([b_bar_j; alpha_j])                (Eq. 5)
    aggregate  v1 = sum_i v1_i,  v2 = sum_j v2_j  over real tokens only                  (Eq. 6)
    classify   y_hat = H([v1; v2])                                                       (Eq. 7)

F, G, F_intra are 2-layer ReLU MLPs with dropout before each layer (hidden 200, dropout
0.2); H is such an MLP followed by a linear layer to the classes (Parikh et al.; the
write-up's Listing 1 puts a ReLU on the logits, which we do not copy).

The attend step is the attention flag: ``attention.alignment(dim=...)`` of any mechanism
that supports pairwise alignment (softmax is Eq. 4; ``coda`` is CoDA Eq. 7 with M in place
of both softmaxes, as in CoDA Table 3).  A mechanism that cannot align raises
UnsupportedContext when the model is built.

Every layer holds the parameters of K independent members stacked on a leading dimension
(``members``): the plain model is K = 1, the ensembles of lit_models/mixture.py run all K
members in one batched call (a batched matmul per layer, the K members folded into the
batch of the alignment).  Inputs are ids (B,L), shared by every member, or (K,B,L), one
batch per member (the latent mixture's routing).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from attention import Mechanism, build
from attention.masking import check_mask, masked_softmax
from attention.softmax import softmax
from lit_models.base import AttnReproModule
from lit_models.blocks import at_least_one
from lit_models.metrics import GroupedRanking


# -- layers with K stacked members -------------------------------------------------------------
class StackedLinear(nn.Module):
    """K independent linear maps at once: x (K, ..., d_in) -> (K, ..., d_out).

    weight (K, d_in, d_out), bias (K, 1, d_out); each member initialised as ``nn.Linear``."""

    def __init__(self, members: int, d_in: int, d_out: int, bias: bool = True):
        super().__init__()
        bound = 1 / math.sqrt(d_in)
        self.weight = nn.Parameter(torch.empty(members, d_in, d_out).uniform_(-bound, bound))
        self.bias = (nn.Parameter(torch.empty(members, 1, d_out).uniform_(-bound, bound))
                     if bias else None)

    def forward(self, x: Tensor) -> Tensor:
        k, d_in, _ = self.weight.shape
        if x.shape[0] != k or x.shape[-1] != d_in:
            raise ValueError(f"StackedLinear: expected input (K={k}, ..., {d_in}), got "
                             f"{tuple(x.shape)}")
        flat = x.reshape(k, -1, d_in)  # (K,N,in)
        out = (torch.bmm(flat, self.weight) if self.bias is None
               else torch.baddbmm(self.bias, flat, self.weight))  # (K,N,out)
        return out.view(*x.shape[:-1], out.shape[-1])


class StackedEmbedding(nn.Module):
    """K independent embedding tables: ids (K, ...) -> (K, ..., dim); N(0, 1) like
    ``nn.Embedding``, the padding row (if any) zero."""

    def __init__(self, members: int, num: int, dim: int, padding_idx: int | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(members, num, dim))
        if padding_idx is not None:
            with torch.no_grad():
                self.weight[:, padding_idx].zero_()

    def forward(self, ids: Tensor) -> Tensor:
        k, num, dim = self.weight.shape
        if ids.shape[0] != k:
            raise ValueError(f"StackedEmbedding: expected ids (K={k}, ...), got {tuple(ids.shape)}")
        offsets = torch.arange(k, device=ids.device).view(k, *[1] * (ids.dim() - 1)) * num
        return F.embedding(ids + offsets, self.weight.view(k * num, dim))  # one lookup


class StackedMLP(nn.Sequential):
    """Parikh et al.'s F, G, H, F_intra: two ReLU layers, dropout before each."""

    def __init__(self, members: int, d_in: int, d_out: int, hidden: int, dropout: float):
        super().__init__(nn.Dropout(dropout), StackedLinear(members, d_in, hidden), nn.ReLU(),
                         nn.Dropout(dropout), StackedLinear(members, hidden, d_out), nn.ReLU())


def distance_buckets(length: int, max_distance: int = 10, device=None) -> Tensor:
    """(L, L) bucket of d_{i-j} (Eq. 10): |i - j| for distances up to ``max_distance``, and
    max_distance + 1 for every longer distance (one shared bucket)."""
    pos = torch.arange(length, device=device)
    return (pos[:, None] - pos[None, :]).abs().clamp(max=max_distance + 1)


class IntraAttention(nn.Module):
    """Intra-sentence attention (Eq. 9-10): a'_i = sum_j softmax_j(f_ij + d_{i-j}) a_j."""

    def __init__(self, members: int, dim: int, hidden: int, dropout: float, max_distance: int):
        super().__init__()
        self.max_distance = max_distance
        self.f_intra = StackedMLP(members, dim, hidden, hidden, dropout)
        self.distance_bias = nn.Parameter(torch.zeros(members, max_distance + 2))  # d per bucket

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:  # (K,B,L,D), (K,B,L) -> (K,B,L,D)
        f = self.f_intra(x)  # (K,B,L,H)
        scores = f @ f.transpose(-1, -2)  # f_ij (K,B,L,L)                           Eq. 9
        buckets = distance_buckets(x.shape[-2], self.max_distance, x.device)  # (L,L)
        scores = scores + self.distance_bias[:, buckets].unsqueeze(1)  # + d_{i-j} (K,1,L,L)
        weights = masked_softmax(scores, mask.unsqueeze(-2), dim=-1)  # over real a_j
        return weights @ x  # a' (K,B,L,D)                                           Eq. 10


class Output(NamedTuple):
    logits: Tensor  # (K,B,C)
    weights_a: Tensor | None  # (K,B,La,Lb): weight of b_j for a_i
    weights_b: Tensor | None  # (K,B,La,Lb): weight of a_i for b_j


class DecompAttNet(nn.Module):
    """K decomposable-attention networks with stacked parameters (see the module docstring).

    ``vectors`` (V, E): frozen pretrained word vectors, shared by the members (a buffer), each
    member with its own projection E -> hidden; None: a trained embedding per member.
    ``condition_classes`` > 0 adds a learned embedding of a class label concatenated to
    [v1; v2] before H (the inference network q(c|y,a,b) of the latent mixture sees y so).
    ``attend`` is the F of Eq. 3 whose outputs the alignment compares: ``"mlp"``, Parikh
    et al.'s two ReLU layers (outputs >= 0), or ``"linear"``, one linear map without bias
    after dropout (signed outputs; CoDA's "linear projection" F_E = F_N).
    """

    def __init__(self, vocab_size: int, num_outputs: int, *, members: int = 1, pad_id: int = 0,
                 vectors: Tensor | None = None, hidden: int = 200, dropout: float = 0.2,
                 intra: bool = False, max_distance: int = 10,
                 attention: Mechanism | None = None, condition_classes: int = 0,
                 attend: Literal["mlp", "linear"] = "mlp"):
        super().__init__()
        at_least_one(members=members)
        attention = softmax() if attention is None else attention
        self.members, self.pad_id = members, pad_id
        if vectors is not None:
            if vectors.dim() != 2 or vectors.shape[0] != vocab_size:
                raise ValueError(f"embeddings must be a (vocab_size={vocab_size}, dim) matrix, "
                                 f"got {tuple(vectors.shape)}")
            self.register_buffer("vectors", vectors.detach().float())  # frozen (shared, not copied)
            self.project = StackedLinear(members, vectors.shape[1], hidden, bias=False)
            self.embed = None
        else:
            self.vectors, self.project = None, None
            self.embed = StackedEmbedding(members, vocab_size, hidden, padding_idx=pad_id)
        self.intra = (IntraAttention(members, hidden, hidden, dropout, max_distance) if intra
                      else None)
        d_in = 2 * hidden if intra else hidden  # a_bar = [a; a'] with intra-attention
        self.attend = (StackedMLP(members, d_in, hidden, hidden, dropout) if attend == "mlp"
                       else nn.Sequential(nn.Dropout(dropout),
                                          StackedLinear(members, d_in, hidden, bias=False)))  # F
        # one alignment core when it has no parameters (the members fold into its batch),
        # else one per member
        core = attention.alignment(dim=hidden)
        stateless = next(iter(core.parameters()), None) is None and \
            next(iter(core.buffers()), None) is None
        self.align = nn.ModuleList(
            [core] if members == 1 or stateless
            else [core] + [attention.alignment(dim=hidden) for _ in range(members - 1)])
        self.compare = StackedMLP(members, 2 * d_in, hidden, hidden, dropout)  # G
        self.condition = (StackedEmbedding(members, condition_classes, hidden)
                          if condition_classes else None)
        d_h = 2 * hidden + (hidden if condition_classes else 0)
        self.aggregate = StackedMLP(members, d_h, hidden, hidden, dropout)  # H ...
        self.classify = StackedLinear(members, hidden, num_outputs)  # ... and its output layer

    # -- the steps of the module docstring
    def per_member(self, ids: Tensor, mask: Tensor, name: str) -> tuple[Tensor, Tensor]:
        """ids and mask as (K,B,L): (B,L) inputs are shared by every member."""
        check_mask(mask, f"{name}_mask")
        if ids.shape != mask.shape:
            raise ValueError(f"{name} {tuple(ids.shape)} and {name}_mask {tuple(mask.shape)} "
                             "must have the same shape")
        if ids.dim() == 2:
            return (ids.unsqueeze(0).expand(self.members, *ids.shape),
                    mask.unsqueeze(0).expand(self.members, *mask.shape))
        if ids.dim() == 3 and ids.shape[0] == self.members:
            return ids, mask
        raise ValueError(f"{name} must be (B, L) or (K={self.members}, B, L) ids, got "
                         f"{tuple(ids.shape)}")

    def encode(self, ids: Tensor, mask: Tensor) -> Tensor:
        """a_bar (K,B,L,D): the embedded words, with [a; a'] under intra-attention."""
        if self.embed is not None:
            x = self.embed(ids)  # (K,B,L,H)
        else:
            x = self.project(F.embedding(ids, self.vectors))  # (K,B,L,E) -> (K,B,L,H)
        if self.intra is not None:
            x = torch.cat([x, self.intra(x, mask)], dim=-1)  # a_bar = [a; a'] (K,B,L,2H)
        return x

    def alignment(self, fa, fb, ma, mb, a, b, need_weights: bool):
        """beta (K,B,La,D), alpha (K,B,Lb,D) and the weights (K,B,La,Lb) of Eq. 4."""
        if len(self.align) == 1:  # fold the members into the batch: one call
            k, bsz = fa.shape[:2]
            out = self.align[0](fa.flatten(0, 1), fb.flatten(0, 1), ma.flatten(0, 1),
                                mb.flatten(0, 1), value_a=a.flatten(0, 1),
                                value_b=b.flatten(0, 1))
            out = [t.unflatten(0, (k, bsz)) for t in out]
        else:  # members with alignment parameters of their own
            outs = [core(fa[c], fb[c], ma[c], mb[c], value_a=a[c], value_b=b[c])
                    for c, core in enumerate(self.align)]
            out = [torch.stack(ts) for ts in zip(*outs)]
        beta, alpha, weights_a, weights_b = out
        return beta, alpha, (weights_a if need_weights else None), \
            (weights_b if need_weights else None)

    def attend_inputs(self, premise: Tensor, premise_mask: Tensor, hypothesis: Tensor,
                      hypothesis_mask: Tensor) -> tuple[Tensor, ...]:
        """a_bar, b_bar (K,B,L,D), F(a_bar), F(b_bar) (K,B,L,H) (Eq. 3) and the masks (K,B,L):
        what the alignment sees."""
        ids_a, ma = self.per_member(premise, premise_mask, "premise")  # (K,B,La)
        ids_b, mb = self.per_member(hypothesis, hypothesis_mask, "hypothesis")  # (K,B,Lb)
        if ids_a.shape[1] != ids_b.shape[1]:
            raise ValueError(f"premise and hypothesis batches differ: {tuple(ids_a.shape)} and "
                             f"{tuple(ids_b.shape)}")
        a, b = self.encode(ids_a, ma), self.encode(ids_b, mb)  # a_bar, b_bar (K,B,L,D)
        return a, b, self.attend(a), self.attend(b), ma, mb  # F(a_bar), F(b_bar)     Eq. 3

    def forward(self, premise: Tensor, premise_mask: Tensor, hypothesis: Tensor,
                hypothesis_mask: Tensor, condition: Tensor | None = None,
                need_weights: bool = False) -> Output:
        """premise (B,La) or (K,B,La) ids with its boolean mask, the same for the hypothesis;
        ``condition`` (B,) or (K,B) class ids when the net was built with
        ``condition_classes``.  Returns logits (K,B,C) (and the alignment weights)."""
        a, b, fa, fb, ma, mb = self.attend_inputs(premise, premise_mask, hypothesis,
                                                  hypothesis_mask)
        beta, alpha, wa, wb = self.alignment(fa, fb, ma, mb, a, b, need_weights)  # Eq. 4
        v1 = self.compare(torch.cat([a, beta], -1))  # (K,B,La,H)                     Eq. 5
        v2 = self.compare(torch.cat([b, alpha], -1))  # (K,B,Lb,H)
        v1 = (v1 * ma.unsqueeze(-1)).sum(-2)  # masked sum over time (K,B,H)           Eq. 6
        v2 = (v2 * mb.unsqueeze(-1)).sum(-2)
        h = [v1, v2]
        if self.condition is not None:
            if condition is None:
                raise ValueError("this network conditions on a label: pass condition (B,)")
            if condition.dim() == 1:
                condition = condition.unsqueeze(0).expand(self.members, -1)
            h.append(self.condition(condition))  # (K,B,H)
        elif condition is not None:
            raise ValueError("condition given to a network built without condition_classes")
        logits = self.classify(self.aggregate(torch.cat(h, -1)))  # (K,B,C)            Eq. 7
        return Output(logits, wa, wb)

    @torch.no_grad()
    def load_members(self, nets: Sequence[DecompAttNet]) -> DecompAttNet:
        """Copy K single-member nets of the same settings into this K-member net (an
        ensemble of separately built or trained models); returns self."""
        if len(nets) != self.members or any(n.members != 1 for n in nets):
            raise ValueError(f"load_members needs {self.members} single-member nets, got "
                             f"{[n.members for n in nets]}")
        states = [n.state_dict() for n in nets]
        for name, target in self.state_dict().items():
            if name == "vectors":
                target.copy_(states[0][name])
            elif name.startswith("align."):  # per-member cores: align.<c>.<rest>
                _, c, rest = name.split(".", 2)
                target.copy_(states[int(c)][f"align.0.{rest}"])
            else:  # stacked on dim 0
                target.copy_(torch.cat([s[name] for s in states]))
        return self


def ensemble_log_probs(member_log_probs: Tensor) -> Tensor:
    """log p(y|a,b) = log (1/K) sum_c p(y|a,b; theta_c) from (K,B,C) member log-probabilities
    (logsumexp; K = 1 is the plain model)."""
    return torch.logsumexp(member_log_probs, dim=0) - math.log(member_log_probs.shape[0])


def entropy(log_p: Tensor, dim: int = -1) -> Tensor:
    """H(p) = -sum p log p of a distribution given by its logs."""
    return -(log_p.exp() * log_p).sum(dim)


# -- the LightningModule -----------------------------------------------------------------------
class DecompAtt(AttnReproModule):
    """Decomposable attention (Parikh et al. 2016) for NLI, attention selected by flag.

    Batches (datamodules/nli.py): premise (B,La), premise_mask, hypothesis (B,Lb),
    hypothesis_mask, label (B,).  Logs ``{train,val,test}/loss`` and ``/acc``; with several
    evaluation dataloaders (MultiNLI tests on dev matched and mismatched) the first logs
    ``test/acc`` and the others ``test/acc_<split>`` (split names from the DataModule's
    ``test_splits``); ``val/acc_best`` is the best validation accuracy so far (a run's
    development score).  With a W&B logger, heat maps of the alignment weights (of member 0
    in an ensemble) for ``plot_pairs`` fixed validation pairs are logged at each validation
    end as ``val/attention_pair<i>`` (the write-up's Figures 1-3), and with the CoDA
    alignment histograms of tanh(E), sigmoid(N) and M over the first validation batch as
    ``val/coda_hist_<name>`` (CoDA's Figure 2; :meth:`alignment_factors`).

    Args:
        vocab_size, num_classes, pad_id: from the DataModule (CLI links).
        embeddings: (vocab_size, E) pretrained vectors, frozen and projected to ``hidden``
            without bias (the DataModule's ``embeddings``); None: trained embeddings.
        pretrained_dim: E when ``embeddings`` is None but the checkpoint being loaded holds
            pretrained vectors (set automatically; leave None).
        hidden: size of every layer (200 in the papers).
        dropout: dropout before each MLP layer (0.2).
        intra: intra-sentence attention (Eq. 9-10); ``max_distance``: its last own bucket.
        attention: the alignment mechanism (any that supports pairwise alignment).
        coda_features: with the CoDA alignment, what F_E = F_N of Eq. 1-2 is (shared, as
            the paper allows: "F_E(.) is a parameterized function such as a linear/nonlinear
            projection ... we may share parameters of F_E(.) and F_N(.)"): ``"linear"``
            (default), a linear map without bias of a_bar, so that E = F_E(a_i) . F_E(b_j)
            takes both signs and tanh(E) can subtract ("de-attend", the point of CoDA);
            ``"mlp"``, Parikh et al.'s attend network F, whose final ReLU makes every feature
            >= 0 and so E >= 0: tanh(E) is never negative (the behaviour before this flag).
            Removing only F's final ReLU does not help: the hidden ReLU's positive mean gives
            all words one shared direction, and E stayed positive for every SNLI word pair
            measured at initialisation.
        coda_distance: with the CoDA alignment, N = -beta * D where D is ``"mean"``
            (default) the mean absolute difference per feature, ||F_N(a_i) - F_N(b_j)||_1 /
            hidden, or ``"sum"`` the L1 norm itself (Eq. 2 with beta as set).  The paper
            leaves beta to the user ("a scaling constant").  At its d = 200 the L1 norm is
            large: measured on SNLI at initialisation (hidden 200, trained embeddings),
            sigmoid(N) is below 0.05 for every word pair but identical words (whose N is 0),
            its mean 0.024, so every gate is closed and M ~ 0 until learning shrinks the
            features.  Divided by the feature size, N stays of the order of one feature's
            difference for any ``hidden`` (mean sigmoid(N) 0.35 at initialisation,
            no pair saturated; tests/lit_models/test_decomp_att.py).  The plain L1 norm with N
            centred
            (``coda_distance="sum"``, ``--model.attention.gate centered``) is the setting
            whose trained histograms look like the paper's Figure 2 (sigmoid(N) saturated
            at 0 and 1; notebooks/coda_fig2.ipynb); it is not the default because Table 8
            treats centering as an ablation of the base CoDA.  Both flags are ignored for
            other mechanisms.
        lr, weight_decay, betas: Adam(W).
        plot_pairs: validation pairs drawn as heat maps to W&B (0: none).
    """

    def __init__(
        self,
        vocab_size: int,
        num_classes: int = 3,
        pad_id: int = 0,
        embeddings: Tensor | None = None,
        pretrained_dim: int | None = None,
        hidden: int = 200,
        dropout: float = 0.2,
        intra: bool = False,
        max_distance: int = 10,
        attention: Mechanism = softmax(),  # noqa: B008 - an immutable flag value
        coda_features: Literal["linear", "mlp"] = "linear",
        coda_distance: Literal["mean", "sum"] = "mean",
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        plot_pairs: int = 3,
    ):
        super().__init__(lr=lr, weight_decay=weight_decay, betas=betas)
        self.save_hyperparameters(ignore=["embeddings"])
        for name, value, least in (("vocab_size", vocab_size, 1), ("num_classes", num_classes, 2),
                                   ("hidden", hidden, 1), ("max_distance", max_distance, 0),
                                   ("plot_pairs", plot_pairs, 0)):
            if value < least:
                raise ValueError(f"{name} must be at least {least}, got {value}")
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        for name, value, allowed in (("coda_features", coda_features, ("linear", "mlp")),
                                     ("coda_distance", coda_distance, ("mean", "sum"))):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if embeddings is not None:
            if pretrained_dim is not None and pretrained_dim != embeddings.shape[-1]:
                raise ValueError(f"pretrained_dim={pretrained_dim} but the embeddings are "
                                 f"{tuple(embeddings.shape)}")
            self.hparams["pretrained_dim"] = int(embeddings.shape[-1])  # for load_from_checkpoint
        elif pretrained_dim is not None:  # a checkpoint's vectors: its state dict fills them
            embeddings = torch.zeros(vocab_size, pretrained_dim)
        attention = build(attention)  # a config dict when forwarded through **kwargs
        self.mechanisms = {"alignment": attention}
        self.num_classes, self.plot_pairs = num_classes, plot_pairs
        coda = attention.name == "coda"
        if coda and coda_distance == "mean":  # N = -beta * ||.||_1 / hidden
            attention = build(attention.name, **{**attention.options(),
                                                 "beta": attention.beta / hidden})
        self.net_settings = dict(vocab_size=vocab_size, pad_id=pad_id, hidden=hidden,
                                 dropout=dropout, intra=intra, max_distance=max_distance,
                                 attention=attention,
                                 attend="linear" if coda and coda_features == "linear" else "mlp")
        self.net = self.build_net(num_classes, embeddings, members=self.n_members)
        self.accuracy = nn.ModuleDict()  # "<stage>_<dataloader>" -> MulticlassAccuracy
        self.ranking = nn.ModuleDict()  # the same keys -> GroupedRanking (ranking batches)
        self._plot_batch: dict[str, Tensor] | None = None
        self.register_buffer("best_val_acc", torch.zeros(()))
        self.register_buffer("best_val_map", torch.zeros(()))  # and the MRR of that validation
        self.register_buffer("best_val_map_mrr", torch.zeros(()))

    @property
    def n_members(self) -> int:
        """K: the number of stacked members (1; the Mixture's ``k``)."""
        return 1

    def build_net(self, num_outputs: int, vectors: Tensor | None, members: int,
                  condition_classes: int = 0) -> DecompAttNet:
        """A network with this model's settings (the members, or the inference network)."""
        return DecompAttNet(num_outputs=num_outputs, members=members,
                            vectors=vectors, condition_classes=condition_classes,
                            **self.net_settings)

    # -- model outputs
    def forward(self, batch: dict[str, Tensor], need_weights: bool = False) -> Output:
        return self.net(batch["premise"], batch["premise_mask"], batch["hypothesis"],
                        batch["hypothesis_mask"], need_weights=need_weights)

    @torch.no_grad()
    def alignment_factors(self, batch: dict[str, Tensor], member: int = 0
                          ) -> dict[str, Tensor] | None:
        """CoDA's Figure 2: the values of F_E(E) (tanh), F_N(N) (sigmoid) and M over every
        real (premise word, hypothesis word) pair of ``batch``, as 1-D tensors keyed
        "tanh(E)", "sigmoid(N)", "M" (named by the flag's functions), for ``member``; None
        when the alignment is not CoDA.  Uses the current mode (call in eval mode)."""
        core = self.net.align[member if len(self.net.align) > 1 else 0]
        if not hasattr(core, "factors"):
            return None
        _, _, fa, fb, ma, mb = self.net.attend_inputs(
            batch["premise"], batch["premise_mask"], batch["hypothesis"],
            batch["hypothesis_mask"])
        ma, mb = ma[member], mb[member]
        e_term, n_term, m = core.factors(fa[member], fb[member], ma, mb)
        valid = ma[:, :, None] & mb[:, None, :]
        return {f"{core.options['e_fn']}(E)": e_term[valid],
                f"{core.options['n_fn']}(N)": n_term[valid], "M": m[valid]}

    def member_log_probs(self, batch: dict[str, Tensor]) -> Tensor:
        """log p(y | a, b; theta_c) of every member, (K,B,C)."""
        return F.log_softmax(self(batch).logits, dim=-1)

    def log_probs(self, batch: dict[str, Tensor]) -> Tensor:
        """log p(y | a, b) (B,C): the model's, or the exact ensemble's over its members."""
        return ensemble_log_probs(self.member_log_probs(batch))

    # -- steps
    def training_step(self, batch, batch_idx):
        log_p = self.log_probs(batch)  # (B,C)
        loss = F.nll_loss(log_p, batch["label"])  # the (marginal) likelihood
        bsz = batch["label"].shape[0]
        acc = self._accuracy("train", 0)
        acc(log_p.argmax(-1), batch["label"])
        self.log("train/loss", loss, prog_bar=True, batch_size=bsz)
        self.log("train/acc", acc, on_step=True, on_epoch=False, batch_size=bsz,
                 metric_attribute="accuracy.train_0")
        return loss

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        if batch_idx == 0 and dataloader_idx == 0 and self._wandb_loggers():
            self._plot_batch = {k: v.detach().cpu() for k, v in batch.items()}
        self._evaluate(batch, "val", dataloader_idx)

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        self._evaluate(batch, "test", dataloader_idx)

    def _evaluate(self, batch, stage: str, dataloader_idx: int) -> Tensor:
        member = self.member_log_probs(batch)  # (K,B,C)
        log_p = ensemble_log_probs(member)  # (B,C)
        y, bsz = batch["label"], batch["label"].shape[0]
        suffix = self._suffix(stage, dataloader_idx)
        acc = self._accuracy(stage, dataloader_idx)
        acc(log_p.argmax(-1), y)
        log = dict(batch_size=bsz, add_dataloader_idx=False)
        self.log_mean(f"{stage}/loss{suffix}", F.nll_loss(log_p, y), bsz, **log)
        self.log(f"{stage}/acc{suffix}", acc, prog_bar=True,
                 metric_attribute=f"accuracy.{stage}_{dataloader_idx}", **log)
        if member.shape[0] > 1:
            for c, correct in enumerate((member.argmax(-1) == y).float().mean(-1)):
                self.log_mean(f"{stage}/acc_member{c}{suffix}", correct, bsz, **log)
        if "group" in batch:  # answer / response selection: rank by log p(relevant)
            if self.num_classes != 2:
                raise ValueError(f"ranking batches (with 'group') need num_classes=2 (label 1 = "
                                 f"relevant), got num_classes={self.num_classes}")
            key = f"{stage}_{dataloader_idx}"
            if key not in self.ranking:
                self.ranking[key] = GroupedRanking().to(self.device)
            self.ranking[key].update(log_p[:, 1], y, batch["group"], batch["index"])
        if stage == "test":
            self.keep_predictions(self._prediction_rows_of(batch, log_p, dataloader_idx),
                                  dataloader_idx)
        self._evaluate_more(batch, member, stage, suffix)
        return member

    def _log_ranking(self, stage: str) -> dict[str, Tensor]:
        """MAP, MRR and P@1 (= R10@1 on Ubuntu) over the whole split of each of the stage's
        dataloaders, gathered from every process; the first dataloader's are returned."""
        first = {}
        for key in [k for k in self.ranking if k.startswith(f"{stage}_")]:
            index = int(key.rsplit("_", 1)[1])
            metric = self.ranking[key]
            if not metric.update_count:
                continue
            values = metric.compute()
            metric.reset()
            suffix = self._suffix(stage, index)
            for name in ("map", "mrr", "p@1"):
                self.log(f"{stage}/{name}{suffix}", values[name].float(), sync_dist=False)
            self.log(f"{stage}/groups_without_positive{suffix}", values["skipped"].float())
            if index == 0:
                first = values
        return first

    def _evaluate_more(self, batch, member_log_probs: Tensor, stage: str, suffix: str) -> None:
        """Extra evaluation logs of subclasses (the latent mixture's ELBO)."""

    def _accuracy(self, stage: str, dataloader_idx: int) -> MulticlassAccuracy:
        """The accuracy metric of a stage and dataloader, ``accuracy.<stage>_<index>``."""
        key = f"{stage}_{dataloader_idx}"
        if key not in self.accuracy:
            self.accuracy[key] = MulticlassAccuracy(self.num_classes,
                                                    average="micro").to(self.device)
        return self.accuracy[key]

    def _suffix(self, stage: str, dataloader_idx: int) -> str:
        """"" for the first dataloader of a stage, else "_<split name>"."""
        if dataloader_idx == 0:
            return ""
        splits = getattr(self.trainer.datamodule, f"{stage}_splits", None) \
            if self._trainer is not None else None
        if splits and dataloader_idx < len(splits):
            return f"_{splits[dataloader_idx]}"
        return f"_{dataloader_idx}"

    # -- attention heat maps to W&B (the write-up's Figures 1-3)
    def _wandb_loggers(self) -> list:
        if self._trainer is None or not self.plot_pairs:
            return []
        from lightning.pytorch.loggers import WandbLogger

        return [lg for lg in self.loggers if isinstance(lg, WandbLogger)]

    def on_validation_epoch_end(self) -> None:
        acc = self.accuracy["val_0"] if "val_0" in self.accuracy else None
        if acc is not None and acc.update_count and not self.trainer.sanity_checking:
            self.best_val_acc = torch.maximum(self.best_val_acc, acc.compute())
            self.log("val/acc_best", self.best_val_acc)  # the development score of a run
        ranking = self._log_ranking("val")
        if ranking and not self.trainer.sanity_checking and not ranking["map"].isnan():
            if ranking["map"] > self.best_val_map:  # the development scores of a run
                self.best_val_map.fill_(ranking["map"].item())
                self.best_val_map_mrr.fill_(ranking["mrr"].item())
            self.log("val/map_best", self.best_val_map)
            self.log("val/mrr_at_best_map", self.best_val_map_mrr)
        self._plot_attention()

    def on_test_epoch_end(self) -> None:
        self._log_ranking("test")
        self.write_predictions(lambda idx: self._suffix("test", idx))

    def _prediction_rows_of(self, batch, log_p: Tensor, dataloader_idx: int) -> list[dict]:
        """``predictions-test[_<split>].jsonl`` rows of a test batch: ``id`` (position in the
        split), ``line`` (in the split's file), the input text (``premise`` and ``hypothesis``;
        for ranking ``question`` and ``answer``: the words of the token ids by the
        DataModule's vocabulary, the ids without one), ``gold``, ``prediction``,
        ``log_probs`` of every class and, for ranking, ``group`` and ``score`` = log
        p(relevant), the ranking key."""
        datamodule = self._datamodule()
        splits = getattr(datamodule, "test_splits", None) or ()
        dataset = getattr(datamodule, "datasets", {}).get(splits[dataloader_idx]) \
            if dataloader_idx < len(splits) else None
        lines = getattr(dataset, "lines", None)
        names = ("question", "answer") if "group" in batch else ("premise", "hypothesis")
        texts = list(zip(*(self.vocab_words(batch[key], batch[f"{key}_mask"])
                           for key in ("premise", "hypothesis"))))
        log_p = log_p.detach().cpu()
        rows = []
        for i, (index, gold) in enumerate(zip(batch["index"].tolist(), batch["label"].tolist())):
            row = {"id": index, "line": int(lines[index]) if lines is not None else None,
                   **dict(zip(names, texts[i])),
                   "gold": gold, "prediction": int(log_p[i].argmax()),
                   "log_probs": [round(float(v), 6) for v in log_p[i]]}
            if "group" in batch:
                row |= {"group": int(batch["group"][i]), "score": float(log_p[i, 1])}
            rows.append(row)
        return rows

    def _plot_attention(self) -> None:
        batch, self._plot_batch = self._plot_batch, None
        loggers = self._wandb_loggers()
        if batch is None or not loggers or self.trainer.sanity_checking:
            return
        from lit_models.plots import attention_heatmaps, figure_image

        batch = {k: v.to(self.device) for k, v in batch.items()}
        factors = self.alignment_factors(batch)  # CoDA's Figure 2 over the whole first batch
        if factors is not None:
            import wandb

            for lg in loggers:
                lg.log_metrics({f"val/coda_hist_{name}": wandb.Histogram(values.cpu().numpy())
                                for name, values in factors.items()}, step=self.global_step)
        n = self.plot_pairs  # the longest pairs of the first (deterministic) batch
        batch = {k: v[-n:] for k, v in batch.items()}
        with torch.no_grad():
            out = self(batch, need_weights=True)
        itos = getattr(getattr(self.trainer.datamodule, "vocab", None), "itos", None)
        names = getattr(self.trainer.datamodule, "label_names", None)
        images = []
        for i in range(batch["label"].shape[0]):
            la, lb = int(batch["premise_mask"][i].sum()), int(batch["hypothesis_mask"][i].sum())
            words = [[itos[t] if itos else str(t) for t in batch[key][i, :n].tolist()]
                     for key, n in (("premise", la), ("hypothesis", lb))]
            label = int(batch["label"][i])
            fig = attention_heatmaps(
                words[0], words[1], out.weights_a[0, i, :la, :lb].float().cpu(),
                out.weights_b[0, i, :la, :lb].float().cpu(),
                title=f"{self.mechanisms['alignment'].tag()}, gold: "
                      f"{names[label] if names else label}, step {self.global_step}")
            images.append(figure_image(fig))
        for lg in loggers:  # one key per pair: its heat map over the steps
            for i, image in enumerate(images):
                lg.log_image(key=f"val/attention_pair{i}", images=[image], step=self.global_step)
