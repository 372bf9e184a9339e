"""DecaProp, the extractive reader of CoDA Table 1 (Tay et al., "Densely Connected Attention
Propagation for Reading Comprehension", NeurIPS 2018; CoDA Sec. 3.1), with the
context-query attention selected by the attention flag.  The layers are in
lit_models/decaprop_layers.py.

For a context c (Lc words) and a question q (Lq words), hidden size d, L layers:

    embed      frozen GloVe vectors (zero for unknown words), or a trained embedding
    DecaEnc    c_l = BiGRU_l(c_{l-1}), q_l = BiGRU_l(q_{l-1}), l = 1..L, one GRU per layer
               shared by context and question                               (B, L*, 2d)
               (``encoder_bac``: the authors' first commit also appends BAC(c_l, q_l) to
               each layer's output before the next layer)
    DecaCore   F_ij = BAC(c_i, q_j) for every pair of layers (L^2 connectors, 6 features
               each): C = [c_1; ..; c_L; F^c_11; ..; F^c_LL], Q likewise    (B, L*, D')
               D' = 2 d L + 6 L^2
    attention  C~ = align(F(C), F(Q)) pooling Q, F(x) = relu(x W) D'^(-1/4), W D' x D'
               softmax: C~ = softmax_j(F(C) F(Q)^T) Q = softmax_j(relu(CW) relu(QW)^T /
               sqrt(D')) Q, DecaProp's dot co-attention; coda: C~ = M Q with
               M = tanh(E) * sigmoid(N) (CoDA Eq. 1-7) -- the one place CoDA replaces
               ("we replace the context-query attention with our CoDA variation")
    SubMult    G = relu(W_s [(C~ - C)^2; C~ * C] + b)                          (B, Lc, D')
    model      H = BiGRU(G); R = GatedSelfAttention(H); M = BiGRU(R)          (B, Lc, 2d)
    pointer    P = BiGRU(M), P' = BiGRU(P); start = w_s P, end = w_e P'       (B, Lc)
    loss       CE(start) + CE(end); decoding argmax p_s(i) p_e(j), i <= j < i + max_span

The attention flag is used in the alignment context (``attention.alignment(dim=D')``, as in
lit_models/decomp_att.py); any mechanism that supports it works, one that does not raises
UnsupportedContext when the model is built.  The features F are scaled by D'^(-1/4) on
each side, so that a dot product of them is DecaProp's E = relu(CW) relu(QW)^T / sqrt(D');
for ``coda`` the L1 term gets beta D'^(-1/4) on those features, i.e.
N = -beta ||relu(cW) - relu(qW)||_1 / sqrt(D') (alpha = beta = 1/sqrt(D'): neither is
stated for QA), and the gate left unset is ``centered`` (N - mean(N), CoDA Eq. 4).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention import Mechanism, build
from attention.masking import check_mask
from attention.softmax import softmax
from lit_models import qa_metrics
from lit_models.base import AttnReproModule
from lit_models.blocks import at_least_one
from lit_models.decaprop_layers import (
    BidirectionalAttentionConnector,
    BiGRU,
    GatedSelfAttention,
    SubMult,
    best_spans,
)


class Output(NamedTuple):
    start_logits: Tensor  # (B,Lc), -inf at padded positions
    end_logits: Tensor  # (B,Lc)
    weights: Tensor  # context-query attention (B,Lc,Lq): weight of q_j for c_i


class DecaPropNet(nn.Module):
    """The network of the module docstring; ``forward`` returns :class:`Output`."""

    def __init__(self, vocab_size: int, *, pad_id: int = 0, vectors: Tensor | None = None,
                 embedding_dim: int = 300, hidden: int = 64, layers: int = 3,
                 factor: int = 32, dropout: float = 0.2, attention: Mechanism | None = None,
                 encoder_bac: bool = False):
        super().__init__()
        at_least_one(vocab_size=vocab_size, embedding_dim=embedding_dim, hidden=hidden,
                     layers=layers, factor=factor)
        attention = softmax() if attention is None else attention
        if vectors is not None:
            if vectors.dim() != 2 or vectors.shape[0] != vocab_size:
                raise ValueError(f"embeddings must be a (vocab_size={vocab_size}, dim) matrix, "
                                 f"got {tuple(vectors.shape)}")
            self.register_buffer("vectors", vectors.detach().float())  # frozen
            self.embed, embedding_dim = None, vectors.shape[1]
        else:
            self.vectors = None
            self.embed = nn.Embedding(vocab_size, embedding_dim, padding_idx=pad_id)
        d2 = 2 * hidden
        self.encoder_bac = (nn.ModuleList(BidirectionalAttentionConnector(d2, factor)
                                          for _ in range(layers)) if encoder_bac else None)
        extra = self.encoder_bac[0].n_features if encoder_bac else 0
        self.encoder = nn.ModuleList(  # DecaEnc
            BiGRU(embedding_dim if i == 0 else d2 + extra, hidden, dropout)
            for i in range(layers))
        self.core = nn.ModuleList(BidirectionalAttentionConnector(d2, factor)  # DecaCore
                                  for _ in range(layers * layers))
        self.dim = d2 * layers + self.core[0].n_features * layers * layers  # D'
        self.cq_project = nn.Linear(self.dim, self.dim, bias=False)  # W of F(x) = relu(xW)
        nn.init.xavier_uniform_(self.cq_project.weight)
        self.cq_attention = context_query_attention(attention, self.dim).alignment(dim=self.dim)
        self.submult = SubMult(self.dim)
        self.middle = BiGRU(self.dim, hidden, dropout)
        self.self_attention = GatedSelfAttention(d2, hidden, dropout)
        self.matching = BiGRU(2 * d2, hidden, dropout)
        self.pointer_start = BiGRU(d2, hidden, dropout)
        self.pointer_end = BiGRU(d2, hidden, dropout)
        self.start_logit = nn.Linear(d2, 1)
        self.end_logit = nn.Linear(d2, 1)
        for layer in (self.start_logit, self.end_logit):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)

    def embedding(self, ids: Tensor) -> Tensor:
        return self.embed(ids) if self.embed is not None else F.embedding(ids, self.vectors)

    def decaenc(self, c: Tensor, q: Tensor, cmask: Tensor, qmask: Tensor
                ) -> tuple[list[Tensor], list[Tensor]]:
        """Every layer's outputs c_l (B,Lc,2d), q_l (B,Lq,2d), l = 1..L."""
        couts, qouts = [], []
        for i, rnn in enumerate(self.encoder):
            c, q = rnn(c, cmask), rnn(q, qmask)  # one GRU for both
            couts.append(c)
            qouts.append(q)
            if self.encoder_bac is not None:  # the first commit: [c_l; F^c_l] feeds layer l+1
                fc, fq = self.encoder_bac[i](c, q, cmask, qmask)
                c, q = torch.cat([c, fc], -1), torch.cat([q, fq], -1)
        return couts, qouts

    def decacore(self, couts: list[Tensor], qouts: list[Tensor], cmask: Tensor,
                 qmask: Tensor) -> tuple[Tensor, Tensor]:
        """C (B,Lc,D') and Q (B,Lq,D'): every layer's outputs and the features of the L^2
        connectors BAC(c_i, q_j), in the order i, j."""
        layers = len(couts)
        cff, qff = [], []
        for n, bac in enumerate(self.core):
            fc, fq = bac(couts[n // layers], qouts[n % layers], cmask, qmask)
            cff.append(fc)
            qff.append(fq)
        return torch.cat(couts + cff, -1), torch.cat(qouts + qff, -1)

    def encode(self, context: Tensor, context_mask: Tensor, question: Tensor,
               question_mask: Tensor) -> tuple[Tensor, Tensor]:
        """C (B,Lc,D') and Q (B,Lq,D'): everything before the context-query attention."""
        check_mask(context_mask, "context_mask")
        check_mask(question_mask, "question_mask")
        c, q = self.embedding(context), self.embedding(question)  # (B,L*,E)
        couts, qouts = self.decaenc(c, q, context_mask, question_mask)
        return self.decacore(couts, qouts, context_mask, question_mask)

    def attend(self, c: Tensor, q: Tensor, cmask: Tensor, qmask: Tensor
               ) -> tuple[Tensor, Tensor]:
        """C~ (B,Lc,D'): the question pooled for each context word by the attention flag, and
        its weights (B,Lc,Lq)."""
        scale = self.dim ** -0.25  # on both sides: F(c).F(q) = relu(cW).relu(qW) / sqrt(D')
        fc, fq = F.relu(self.cq_project(c)) * scale, F.relu(self.cq_project(q)) * scale
        aligned = self.cq_attention(fc, fq, cmask, qmask, value_a=c, value_b=q)
        return aligned.a_aligned, aligned.weights_a

    def forward(self, context: Tensor, context_mask: Tensor, question: Tensor,
                question_mask: Tensor) -> Output:
        c, q = self.encode(context, context_mask, question, question_mask)
        c_tilde, weights = self.attend(c, q, context_mask, question_mask)  # (B,Lc,D')
        g = self.submult(c, c_tilde)  # (B,Lc,D')
        h = self.middle(g, context_mask)  # (B,Lc,2d)
        m = self.matching(self.self_attention(h, context_mask), context_mask)  # (B,Lc,2d)
        p = self.pointer_start(m, context_mask)
        p_end = self.pointer_end(p, context_mask)
        pad = ~context_mask
        start = self.start_logit(p).squeeze(-1).masked_fill(pad, float("-inf"))  # (B,Lc)
        end = self.end_logit(p_end).squeeze(-1).masked_fill(pad, float("-inf"))
        return Output(start, end, weights)


def context_query_attention(attention: Mechanism, dim: int) -> Mechanism:
    """The flag value as the network uses it: for ``coda``, beta times D'^(-1/4) (the L1 of
    the scaled features, see the module docstring), no further 1/sqrt(d) and, unless set,
    the centred gate; any other mechanism as it is."""
    if attention.name != "coda":
        return attention
    options = attention.options()
    return build("coda", **{**options, "beta": options["beta"] * dim ** -0.25,
                            "scale": False if options["scale"] is None else options["scale"],
                            "gate": options["gate"] or "centered"})


class DecaProp(AttnReproModule):
    """DecaProp as a LightningModule (CoDA Table 1).  Batches (datamodules/open_qa.py):
    ``context`` (B,Lc), ``context_mask``, ``question`` (B,Lq), ``question_mask``, ``start``
    and ``end`` (B,) token positions of the labelled span (-1: the answer is not in the
    context), ``index`` (B,) position in the split, and per example ``context_text`` (its
    tokens joined by single spaces), ``answers`` (the gold answer strings) and ``qid``.

    Evaluation logs, per stage, the mean over the split of (fractions; the reports print
    percent): ``exact_match`` and ``f1`` (SQuAD normalisation, max over gold answers: CoDA
    Table 1's numbers), ``exact_match_quasar`` / ``f1_quasar`` (Quasar's official metric),
    ``exact_match_unigram`` / ``f1_ngram`` (DecaProp's SearchQA protocol, each over its half
    of the questions; lit_models/qa_metrics.py) and ``loss`` over the questions whose
    answer is in the context.  The test writes one row per question to
    ``predictions-test.jsonl``: ``id``, ``qid``, ``question`` (its words by the DataModule's
    vocabulary), ``prediction``, ``start``, ``end``,
    ``answers``, ``correct`` (SQuAD EM), ``exact_match``, ``f1``, both Quasar scores, and
    the protocol half with its own prediction and its score under the half's metric name
    (``exact_match_unigram`` or ``f1_ngram``, only in that half's rows): each metric's
    field is its paired test's unit (experiments/harness/significance.py run_units).

    Optimisation: Adam (``weight_decay`` 0, PyTorch's Adam betas), every gradient tensor
    clipped to norm ``clip_norm`` on its own (DecaProp clips per tensor), no schedule.
    """

    def __init__(self, vocab_size: int, pad_id: int = 0, embeddings: Tensor | None = None,
                 pretrained_dim: int | None = None, embedding_dim: int = 300,
                 hidden: int = 64, layers: int = 3, factor: int = 32, dropout: float = 0.2,
                 attention: Mechanism = softmax(),  # noqa: B008 - an immutable flag value
                 encoder_bac: bool = False, max_span: int = 15,
                 clip_norm: float | None = 5.0, lr: float = 1e-3, weight_decay: float = 0.0,
                 betas: tuple[float, float] = (0.9, 0.999)):
        super().__init__(lr=lr, weight_decay=weight_decay, betas=betas)
        self.save_hyperparameters(ignore=["embeddings"])
        at_least_one(max_span=max_span)
        if clip_norm is not None and not clip_norm > 0:
            raise ValueError(f"clip_norm must be positive or null, got {clip_norm}")
        if embeddings is not None:
            self.hparams["pretrained_dim"] = int(embeddings.shape[-1])  # load_from_checkpoint
        elif pretrained_dim is not None:  # a checkpoint's vectors: its state dict fills them
            embeddings = torch.zeros(vocab_size, pretrained_dim)
        attention = build(attention)  # a config dict when forwarded through **kwargs
        self.mechanisms = {"context_query": attention}
        self.max_span, self.clip_norm = max_span, clip_norm
        self.net = DecaPropNet(vocab_size, pad_id=pad_id, vectors=embeddings,
                               embedding_dim=embedding_dim, hidden=hidden, layers=layers,
                               factor=factor, dropout=dropout, encoder_bac=encoder_bac,
                               attention=attention)

    def forward(self, batch: dict) -> Output:
        return self.net(batch["context"], batch["context_mask"], batch["question"],
                        batch["question_mask"])

    @staticmethod
    def span_loss(out: Output, start: Tensor, end: Tensor) -> Tensor:
        """CE(start) + CE(end) per example (B,)."""
        return (F.cross_entropy(out.start_logits, start, reduction="none")
                + F.cross_entropy(out.end_logits, end, reduction="none"))

    def training_step(self, batch, batch_idx):
        if bool((batch["start"] < 0).any()):
            raise ValueError("training batches need a labelled span for every question "
                             "(start >= 0); the DataModule drops the others")
        loss = self.span_loss(self(batch), batch["start"], batch["end"]).mean()
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["start"].shape[0])
        return loss

    def on_before_optimizer_step(self, optimizer) -> None:
        if self.clip_norm is not None:
            for p in self.parameters():
                if p.grad is not None:
                    torch.nn.utils.clip_grad_norm_([p], self.clip_norm)

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val")

    def test_step(self, batch, batch_idx):
        rows = self._evaluate(batch, "test")
        questions = self.vocab_words(batch["question"], batch["question_mask"])
        self.keep_predictions({"id": r["id"], "qid": r["qid"], "question": q, **r}
                              for r, q in zip(rows, questions))

    def _evaluate(self, batch, stage: str) -> list[dict]:
        out = self(batch)
        log_s = F.log_softmax(out.start_logits, -1)  # (B,Lc)
        log_e = F.log_softmax(out.end_logits, -1)
        answerable = batch["start"] >= 0
        log = dict(add_dataloader_idx=False)
        if answerable.any():
            loss = self.span_loss(out, batch["start"].clamp(min=0), batch["end"].clamp(min=0))
            self.log_mean(f"{stage}/loss", loss[answerable].mean(), int(answerable.sum()), **log)
        spans = {n: [t.tolist() for t in best_spans(log_s, log_e, n)[:2]]
                 for n in {self.max_span, *qa_metrics.PROTOCOL_SPAN.values()}}
        rows = [self._score(batch, i, spans) for i in range(len(batch["answers"]))]
        n = len(rows)
        for key in ("exact_match", "f1", "exact_match_quasar", "f1_quasar"):
            self.log_mean(f"{stage}/{key}", torch.tensor([r[key] for r in rows]).mean(), n,
                          prog_bar=key == "exact_match", **log)
        for key in qa_metrics.PROTOCOL_METRIC.values():
            values = [r[key] for r in rows if key in r]
            if values:
                self.log_mean(f"{stage}/{key}", torch.tensor(values).mean(), len(values), **log)
        return rows

    def _score(self, batch, i: int, spans: dict[int, list[list[int]]]) -> dict:
        """The prediction row of example ``i`` of ``batch`` (see the class docstring)."""
        tokens = batch["context_text"][i].split(" ")
        golds = list(batch["answers"][i])

        def text(max_span: int) -> str:
            start, end = spans[max_span][0][i], spans[max_span][1][i]
            return " ".join(tokens[start:end + 1])

        prediction = text(self.max_span)
        protocol = qa_metrics.searchqa_protocol(golds)
        short = text(qa_metrics.PROTOCOL_SPAN[protocol])
        score = (qa_metrics.exact_match if protocol == "unigram" else qa_metrics.f1)(short, golds)
        em = qa_metrics.exact_match(prediction, golds)
        return {"id": int(batch["index"][i]), "qid": batch["qid"][i], "prediction": prediction,
                "start": spans[self.max_span][0][i], "end": spans[self.max_span][1][i],
                "answers": golds, "correct": bool(em), "exact_match": em,
                "f1": qa_metrics.f1(prediction, golds),
                "exact_match_quasar": qa_metrics.quasar_exact_match(prediction, golds),
                "f1_quasar": qa_metrics.quasar_f1(prediction, golds),
                "protocol": protocol, "protocol_prediction": short,
                qa_metrics.PROTOCOL_METRIC[protocol]: score}
