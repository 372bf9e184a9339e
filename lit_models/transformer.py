"""Transformer LightningModules with an attention flag per module.

``attention`` sets every attention module; ``encoder_attention``, ``decoder_attention``
and ``cross_attention`` override it per module, and ``attention_layers`` limits the
flagged mechanism to the lowest layers (softmax above).  E.g. the CoDA Transformer of
CoDA Table 6 is ``--model.attention coda``; Differentiable Window's Enc(AW)-Dec(MW) is
``--model.encoder_attention window --model.decoder_attention window
--model.decoder_attention.variant mw --model.attention_layers 3``.

:class:`TransformerClassifier` (an encoder, pooling and a linear classifier) and
:class:`TransformerLM` (a decoder without cross-attention) have one attention module each,
set by ``attention``; ``attention_layers`` works the same way (Differentiable Window Table 5:
the window in layer 1 of 2).

The settings the three share (sizes, dropout, the attention flag, label smoothing, the
optimiser) are written once, in :class:`Transformer`; each model adds its own and forwards
the rest (``**settings``), so the CLI keys stay flat (``--model.d_model 256``) and the
models cannot drift apart.  Every forward returns one :class:`Output` (logits, weights or
None).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from attention import Mechanism, build
from attention.masking import masked_max, masked_mean
from attention.softmax import softmax
from lit_models.base import AttnReproModule
from lit_models.blocks import Decoder, Encoder, TransformerConfig, at_least_one
from lit_models.decoding import Hypotheses, LengthPenalty, repeat_beams, select_rows
from lit_models.metrics import Perplexity, SequenceExactMatch
from lit_models.seq2seq import Seq2SeqTask, check_decoding


class Output(NamedTuple):
    """What every Transformer's forward returns."""

    logits: Tensor
    #: per module ("encoder", "decoder"), the per-layer attention weights; None unless asked
    weights: dict[str, list] | None


class Transformer(AttnReproModule):
    """The settings every Transformer of the suite shares, written once.

    Sizes (tensor2tensor's transformer_tiny by default): ``d_model``, ``n_heads``, ``d_ff``;
    ``dropout`` (residual, embedding and feed-forward) and ``attention_dropout``; ``pad_id``;
    ``norm``, layer normalisation before each sub-layer (``pre``, tensor2tensor) or after the
    residual addition (``post``, Vaswani et al. and fairseq; lit_models/blocks.py);
    ``attention``, the mechanism of every attention module, in the lowest
    ``attention_layers`` layers (None: all; softmax above); ``label_smoothing`` of the
    training loss; the optimiser (Adam(W) with ``betas`` and ``weight_decay``, peak ``lr``,
    ``schedule`` with ``warmup_steps``: see lit_models.base).  Subclasses take their own
    arguments and forward these as keywords."""

    def __init__(
        self,
        pad_id: int = 0,
        d_model: int = 128,
        n_heads: int = 4,
        d_ff: int = 512,
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        norm: Literal["pre", "post"] = "pre",
        attention: Mechanism = softmax(),  # noqa: B008 - an immutable flag value
        attention_layers: int | None = None,
        label_smoothing: float = 0.0,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        schedule: Literal["constant", "inverse_sqrt", "linear"] = "inverse_sqrt",
        warmup_steps: int = 1000,
        betas: tuple[float, float] = (0.9, 0.98),
    ):
        super().__init__(lr=lr, weight_decay=weight_decay, schedule=schedule,
                         warmup_steps=warmup_steps, betas=betas)
        if not 0 <= label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        # called here, it records the subclass's arguments as well (its frame is below)
        self.save_hyperparameters()
        # LightningCLI hands flags forwarded through **settings over as their config dicts
        self.attention = build(attention)
        self.config = TransformerConfig(d_model=d_model, n_heads=n_heads, d_ff=d_ff,
                                        dropout=dropout, attention_dropout=attention_dropout,
                                        pad_id=pad_id, norm=norm)


class TransformerSeq2Seq(Seq2SeqTask, Transformer):
    """Encoder-decoder Transformer (Vaswani et al. 2017) for transduction tasks: translation
    (CoDA Table 4, Differentiable Window Tables 1-4), MLU and text2code (CoDA Tables 6-7).

    Besides the shared settings (:class:`Transformer`): ``encoder_attention``,
    ``decoder_attention`` and ``cross_attention`` override ``attention`` per module (e.g.
    ``--model.cross_attention window --model.cross_attention.segment_size 5`` is DW's
    Cr(AW,Seg)); ``share_embeddings`` ties the source and target embeddings (one joint
    vocabulary, as fairseq's ``--share-all-embeddings``; the output projection is tied to
    the target embedding in any case).  Batches, decoding (``beam_size``,
    ``length_penalty``, ``alpha``, ``max_len_a``, ``max_decode_len``) and what is logged:
    :mod:`lit_models.seq2seq`.  Decoding is incremental: the decoder's keys and values are
    cached per layer (lit_models/blocks.py), so a step costs O(t).
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        bos_id: int = 2,
        eos_id: int = 3,
        n_encoder_layers: int = 2,
        n_decoder_layers: int = 2,
        encoder_attention: Mechanism | None = None,
        decoder_attention: Mechanism | None = None,
        cross_attention: Mechanism | None = None,
        share_embeddings: bool = False,
        beam_size: int = 1,
        length_penalty: LengthPenalty = "gnmt",
        alpha: float = 0.0,
        max_len_a: float = 0.0,
        max_decode_len: int = 10,
        **settings,
    ):
        check_decoding(beam_size, max_len_a, max_decode_len)
        at_least_one(n_encoder_layers=n_encoder_layers, n_decoder_layers=n_decoder_layers)
        super().__init__(**settings)
        self.mechanisms = {name: self.attention if flag is None else build(flag)
                           for name, flag in (("encoder", encoder_attention),
                                              ("decoder", decoder_attention),
                                              ("cross", cross_attention))}
        layers, config = self.hparams.attention_layers, self.config
        self.encoder = Encoder(src_vocab_size, n_encoder_layers, self.mechanisms["encoder"],
                               layers, config)
        self.decoder = Decoder(tgt_vocab_size, n_decoder_layers, self.mechanisms["decoder"],
                               self.mechanisms["cross"], layers, config)
        if share_embeddings:
            if src_vocab_size != tgt_vocab_size:
                raise ValueError("share_embeddings needs one vocabulary for source and target")
            shared = self.encoder.embed.tokens.weight
            self.decoder.embed.tokens.weight = shared
            self.decoder.out.weight = shared  # the output projection is tied to it as well
        self.val_exact = SequenceExactMatch(eos_id)
        self.test_exact = SequenceExactMatch(eos_id)

    def forward(self, src, src_mask, tgt_in, tgt_mask=None, need_weights=False) -> Output:
        """Teacher-forced logits (B,Lt,V); the weights of every layer when asked."""
        memory, enc_w = self.encoder(src, src_mask, need_weights)
        logits, dec_w = self.decoder(tgt_in, tgt_mask, memory, src_mask, need_weights)
        return Output(logits, {"encoder": enc_w, "decoder": dec_w} if need_weights else None)

    @torch.no_grad()
    def generate(self, src, src_mask, beam_size: int | None = None,
                 max_len: int | Tensor | None = None, cached: bool = True) -> Hypotheses:
        """Beam search with this model's settings unless given (:meth:`search`).
        ``cached=False`` re-runs the decoder over the whole prefix at every step instead of
        the incremental step (the same output; for tests and ``make bench``)."""
        k = beam_size or self.hparams.beam_size
        memory, _ = self.encoder(src, src_mask)
        state = {"memory": repeat_beams(memory, k), "memory_mask": repeat_beams(src_mask, k),
                 "cache": {} if cached else None}

        def step(prefix, state):
            if state["cache"] is None:
                logits, _ = self.decoder(prefix, None, state["memory"], state["memory_mask"])
                return logits[:, -1].log_softmax(-1, dtype=torch.float32), state
            logits, _ = self.decoder(prefix[:, -1:], None, state["memory"],
                                     state["memory_mask"], cache=state["cache"])
            # after the first step the memory lives in the cross-attention caches
            return (logits[:, -1].log_softmax(-1, dtype=torch.float32),
                    {"memory": None, "memory_mask": None, "cache": state["cache"]})

        def reorder(state, index):
            """Only the self-attention caches follow the beams: the memory and its
            cross-attention caches are the same in every row of an example's block, which
            beam search never leaves (lit_models.decoding)."""
            for layer in (state["cache"] or {}).get("layers", []):
                layer["self"] = select_rows(layer["self"], index)
            return state

        return self.search(step, state, src_mask, k, max_len, reorder=reorder)


def input_texts(model, batch) -> list:
    """Each example's input as the predictions file shows it: the words of its token ids
    (``batch["tokens"]`` where ``batch["mask"]``) by the DataModule's tokenizer, or the ids
    when the model runs without a DataModule that has one."""
    tokenizer = getattr(model._datamodule(), "tokenizer", None)
    rows = [ids[:n] for ids, n in zip(batch["tokens"].tolist(), batch["mask"].sum(1).tolist())]
    return [" ".join(tokenizer.decode(ids)) for ids in rows] if tokenizer else rows


class TransformerClassifier(Transformer):
    """Transformer encoder, pooling, linear classifier: sentence and document classification
    (CoDA Table 5, Differentiable Window Table 5; both papers use tensor2tensor's
    transformer_tiny: 2 layers, 4 heads, 128 hidden, 512 feed-forward).

    Batches: tokens (B,L), mask (B,L) True at real tokens, label (B,).  ``attention`` is the
    encoder's self-attention, in the lowest ``attention_layers`` layers (None: all).
    ``pooling`` of the final states: ``mean`` or ``max`` over the real tokens, or ``first``
    (the state of the first token).  Logs ``{train,val,test}/loss`` and ``/acc`` (the
    accuracy, named as DecompAtt names it).
    """

    def __init__(
        self,
        vocab_size: int,
        num_classes: int,
        n_layers: int = 2,
        pooling: Literal["mean", "max", "first"] = "mean",
        **settings,
    ):
        if pooling not in ("mean", "max", "first"):
            raise ValueError(f"pooling must be 'mean', 'max' or 'first', got {pooling!r}")
        if num_classes < 2:
            raise ValueError(f"num_classes must be at least 2, got {num_classes}")
        at_least_one(n_layers=n_layers)
        super().__init__(**settings)
        self.mechanisms = {"encoder": self.attention}
        self.encoder = Encoder(vocab_size, n_layers, self.attention,
                               self.hparams.attention_layers, self.config)
        self.classifier = nn.Linear(self.config.d_model, num_classes)
        self.train_accuracy = MulticlassAccuracy(num_classes, average="micro")
        self.val_accuracy = MulticlassAccuracy(num_classes, average="micro")
        self.test_accuracy = MulticlassAccuracy(num_classes, average="micro")

    def pool(self, h: Tensor, mask: Tensor) -> Tensor:
        """(B,L,D) final states -> (B,D); padded positions never contribute."""
        if self.hparams.pooling == "first":
            return h[:, 0]
        if self.hparams.pooling == "max":
            return masked_max(h, mask[..., None], dim=1)
        return masked_mean(h, mask[..., None], dims=(1,)).squeeze(1)

    def forward(self, tokens: Tensor, mask: Tensor, need_weights: bool = False) -> Output:
        """Class logits (B,C); the encoder's per-layer attention weights when asked."""
        h, weights = self.encoder(tokens, mask, need_weights)  # (B,L,D)
        logits = self.classifier(self.pool(h, mask))  # (B,C)
        return Output(logits, {"encoder": weights} if need_weights else None)

    def _step(self, batch, stage: str, smoothing: float) -> Tensor:
        logits = self(batch["tokens"], batch["mask"]).logits
        loss = F.cross_entropy(logits, batch["label"], label_smoothing=smoothing)
        bsz = batch["tokens"].shape[0]
        metric = getattr(self, f"{stage}_accuracy")
        metric(logits.argmax(-1), batch["label"])  # forward: this batch's value for on_step
        if stage == "train":
            self.log("train/loss", loss, batch_size=bsz, prog_bar=True)
        else:
            self.log_mean(f"{stage}/loss", loss, bsz)
        self.log(f"{stage}/acc", metric, batch_size=bsz, prog_bar=stage != "train")
        if stage == "test" and "index" in batch:  # -> predictions-test.jsonl
            log_p = F.log_softmax(logits.detach().float(), -1).cpu()
            self.keep_predictions(
                {"id": i, "input": text, "tokens": n, "gold": gold,
                 "prediction": int(lp.argmax()), "log_probs": [round(float(v), 6) for v in lp]}
                for i, text, n, gold, lp in zip(batch["index"].tolist(), input_texts(self, batch),
                                                batch["mask"].sum(1).tolist(),
                                                batch["label"].tolist(), log_p))
        return loss

    def training_step(self, batch, batch_idx):
        loss = self._step(batch, "train", self.hparams.label_smoothing)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"])
        return loss

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val", 0.0)

    def test_step(self, batch, batch_idx):
        self._step(batch, "test", 0.0)


class TransformerLM(Transformer):
    """Decoder-only Transformer language model (Differentiable Window Table 6: the decoder of
    the MT model, causal self-attention and no cross-attention).

    Batches: tokens (B,L) = <s> w1 .. wn, targets (B,L) = w1 .. wn </s>, mask (B,L) True at
    real target positions.  ``attention`` is the decoder's self-attention, in the lowest
    ``attention_layers`` layers (None: all); ``tie_output`` ties the output projection to
    the embedding.  Logs the mean NLL per real target token as loss, and on val/test the
    perplexity exp(total NLL / number of real target tokens) over the whole split
    (:class:`lit_models.metrics.Perplexity`).
    """

    def __init__(
        self,
        vocab_size: int,
        n_layers: int = 2,
        tie_output: bool = True,
        **settings,
    ):
        at_least_one(n_layers=n_layers)
        super().__init__(**settings)
        self.mechanisms = {"decoder": self.attention}
        self.decoder = Decoder(vocab_size, n_layers, self.attention, None,
                               self.hparams.attention_layers, self.config,
                               tie_output=tie_output)
        self.val_perplexity, self.test_perplexity = Perplexity(), Perplexity()

    def forward(self, tokens: Tensor, mask: Tensor | None = None,
                need_weights: bool = False) -> Output:
        """Next-token logits (B,L,V); the per-layer self-attention weights when asked."""
        logits, weights = self.decoder(tokens, mask, need_weights=need_weights)
        return Output(logits, {"decoder": [w for w, _ in weights]} if need_weights else None)

    def token_nll(self, batch, smoothing: float = 0.0) -> Tensor:
        """(B,L) cross-entropy of every target (with label smoothing when asked)."""
        logits = self(batch["tokens"], batch["mask"]).logits
        return F.cross_entropy(logits.transpose(1, 2), batch["targets"], reduction="none",
                               label_smoothing=smoothing)

    @staticmethod
    def _mean(token_nll: Tensor, mask: Tensor) -> tuple[Tensor, int]:
        tokens = int(mask.sum())
        return token_nll.masked_fill(~mask, 0.0).sum() / max(tokens, 1), tokens

    def training_step(self, batch, batch_idx):
        loss, tokens = self._mean(self.token_nll(batch, self.hparams.label_smoothing),
                                  batch["mask"])
        self.log("train/loss", loss, prog_bar=True, batch_size=tokens)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"])
        return loss

    def _evaluate(self, batch, stage: str) -> None:
        nll = self.token_nll(batch)
        loss, tokens = self._mean(nll, batch["mask"])
        # weighted by tokens: the epoch's loss is the token mean, log(perplexity)
        self.log_mean(f"{stage}/loss", loss, tokens)
        metric = getattr(self, f"{stage}_perplexity")
        metric.update(nll, batch["mask"])
        self.log(f"{stage}/perplexity", metric, prog_bar=True)
        if stage == "test" and "index" in batch:  # -> predictions-test.jsonl
            sums = nll.detach().double().masked_fill(~batch["mask"], 0.0).sum(1).tolist()
            self.keep_predictions(
                {"id": i, "input": text, "tokens": n, "nll": round(total, 6)}
                for i, text, n, total in zip(batch["index"].tolist(), input_texts(self, batch),
                                             batch["mask"].sum(1).tolist(), sums))

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, "test")
