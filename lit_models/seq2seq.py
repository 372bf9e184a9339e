"""What every sequence-to-sequence LightningModule of the suite shares (TransformerSeq2Seq,
RNNSeq2Seq): the training loss, decoding on validation and test through the one beam search,
exact match per sequence, and BLEU with its signatures and the hypotheses of every example.

A model mixes :class:`Seq2SeqTask` in before its LightningModule base and provides

* ``forward(src, src_mask, tgt_in, tgt_mask)`` returning an object with ``logits``
  (B, Lt, V) (teacher forcing);
* ``generate(src, src_mask) -> Hypotheses``, usually through :meth:`Seq2SeqTask.search`;
* the hyper-parameters ``pad_id``, ``bos_id``, ``eos_id``, ``label_smoothing``,
  ``beam_size``, ``length_penalty``, ``alpha``, ``max_len_a`` and ``max_decode_len``.

Batches: src (B,Ls), src_mask, tgt_in (B,Lt) starting with bos, tgt_out (B,Lt) ending with
eos, tgt_mask; translation batches add ``index`` (B,), each example's position in its split.

Decoding: beam search of width ``beam_size`` (1 = greedy) with the ``length_penalty``
``gnmt`` (t2t's alpha; 0.6 in t2t's and the CoDA paper's setting) or ``fairseq`` (fairseq's
``--lenpen``) with exponent ``alpha``, at most ``max_len_a * source length +
max_decode_len`` tokens (t2t decodes up to source length + 50: a=1, b=50; fairseq a=0,
b=200).  Logged on validation and test: ``loss`` and ``exact_match`` (per sequence); when the
DataModule gives references (``references(stage)``, ``decode(ids)``, ``bleu``;
datamodules/translation.py), also ``bleu`` as the paper reports it (the DataModule's
``bleu``: tokenized, with compound splitting for WMT'14 En-De) and ``sacrebleu``,
detokenized with sacreBLEU's 13a tokenizer (lit_models/bleu.py).  Both signatures go to the
loggers' hyper-parameters (W&B config, the CSV logger's hparams.yaml) and, with the
hypotheses of every test example, to the run directory (``hypotheses-test.jsonl``,
``bleu-test.json``).  Without references (exact match: MLU, AlgoLisp), a test writes
``predictions-test.jsonl`` instead: each example's prediction, gold, whether it is an exact
match and its beam score.
"""

from __future__ import annotations

from pathlib import Path

import torch.nn.functional as F
from torch import Tensor

from lit_models.base import gather_objects
from lit_models.bleu import translation_bleu, write_translation_report
from lit_models.decoding import Hypotheses, beam_search, select_rows
from lit_models.metrics import SequenceExactMatch


def check_decoding(beam_size: int, max_len_a: float, max_decode_len: int) -> None:
    """The decoding settings' errors, raised by each model's constructor."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    if max_len_a < 0 or max_decode_len < 0 or (max_len_a == 0 and max_decode_len == 0):
        raise ValueError("the decoding length max_len_a * source length + max_decode_len "
                         f"must be positive, got a={max_len_a}, b={max_decode_len}")


def scores_bleu(datamodule) -> bool:
    """Whether the DataModule gives what BLEU needs (datamodules/translation.py)."""
    return getattr(datamodule, "bleu", None) is not None and hasattr(datamodule, "references")


class Seq2SeqTask:
    """Training, validation and test steps of a seq2seq model (module docstring)."""

    #: what a test run writes beside its metrics, where the data has references
    predictions_file = ("hypotheses-test.jsonl (where BLEU is scored), else "
                        "predictions-test.jsonl")

    def loss(self, logits: Tensor, batch, smoothing: float) -> Tensor:
        return F.cross_entropy(logits.transpose(1, 2), batch["tgt_out"],
                               ignore_index=self.hparams.pad_id, label_smoothing=smoothing)

    def max_lengths(self, src_mask: Tensor) -> Tensor:
        """(B,) the most tokens to generate per example (eos included)."""
        a, b = self.hparams.max_len_a, self.hparams.max_decode_len
        return (a * src_mask.sum(1)).long() + b

    def search(self, step, state, src_mask: Tensor, beam_size: int | None = None,
               max_len: int | Tensor | None = None, reorder=select_rows) -> Hypotheses:
        """:func:`lit_models.decoding.beam_search` with this model's width, length penalty
        and maximum length unless given; ``state`` already repeated for the beams."""
        hp = self.hparams
        return beam_search(step, src_mask.shape[0], hp.bos_id, hp.eos_id,
                           self.max_lengths(src_mask) if max_len is None else max_len,
                           beam_size or hp.beam_size, state=state, reorder=reorder,
                           length_penalty=hp.length_penalty, alpha=hp.alpha,
                           device=src_mask.device)

    def training_step(self, batch, batch_idx):
        logits = self(batch["src"], batch["src_mask"], batch["tgt_in"], batch["tgt_mask"]).logits
        loss = self.loss(logits, batch, self.hparams.label_smoothing)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["src"].shape[0])
        self.log("train/lr", self.optimizers().param_groups[0]["lr"])
        return loss

    def _evaluate(self, batch, stage: str) -> None:
        bsz = batch["src"].shape[0]
        logits = self(batch["src"], batch["src_mask"], batch["tgt_in"], batch["tgt_mask"]).logits
        # the mean over every target token of the split (the loss is a per-token mean)
        tokens = (batch["tgt_out"] != self.hparams.pad_id).sum()
        self.log_mean(f"{stage}/loss", self.loss(logits, batch, 0.0), tokens)
        hypotheses = self.generate(batch["src"], batch["src_mask"])
        metric = getattr(self, f"{stage}_exact")
        metric.update(hypotheses.tokens, batch["tgt_out"], batch["tgt_mask"])
        self.log(f"{stage}/exact_match", metric, batch_size=bsz, prog_bar=True)
        if "index" not in batch:
            return
        lengths = hypotheses.nbest_lengths[:, 0].tolist()
        if scores_bleu(self._datamodule()):  # -> BLEU and hypotheses-test.jsonl
            self._decoded.setdefault(stage, []).extend(
                (int(i), (row[:n], float(score))) for i, row, n, score in zip(
                    batch["index"].tolist(), hypotheses.tokens.tolist(), lengths,
                    hypotheses.scores.tolist()))
        elif stage == "test":  # exact match: -> predictions-test.jsonl
            self.keep_predictions(self._exact_match_rows(batch, hypotheses, lengths))

    def _exact_match_rows(self, batch, hypotheses, lengths: list[int]) -> list[dict]:
        """predictions-test.jsonl rows: ``id`` (position in the split), ``source`` (the
        input), ``prediction`` and ``gold`` (each decoded by the DataModule's ``decode`` when
        it has one, else ids; eos not shown), ``correct`` (the exact-match criterion) and
        ``score`` (the hypothesis' beam-search score)."""
        datamodule = self._datamodule()
        decode = getattr(datamodule, "decode", None)  # of target ids
        correct = SequenceExactMatch.matches(hypotheses.tokens, batch["tgt_out"],
                                             batch["tgt_mask"]).tolist()
        golds = [row[:n] for row, n in zip(batch["tgt_out"].tolist(),
                                           batch["tgt_mask"].sum(1).tolist())]
        if hasattr(datamodule, "sources"):  # a text DataModule keeps each source's text
            texts = datamodule.sources("test")
            sources = [texts[i] for i in batch["index"].tolist()]
        else:  # a shared vocabulary (MLU's characters): the source's ids decoded, or the ids
            sources = [row[:n] for row, n in zip(batch["src"].tolist(),
                                                 batch["src_mask"].sum(1).tolist())]
            sources = [decode(ids) if decode else ids for ids in sources]
        rows = []
        for k, index in enumerate(batch["index"].tolist()):
            pred = hypotheses.tokens[k, :lengths[k]].tolist()
            rows.append({"id": index, "source": sources[k],
                         "prediction": decode(pred) if decode else pred,
                         "gold": decode(golds[k]) if decode else golds[k],
                         "correct": bool(correct[k]),
                         "score": round(float(hypotheses.scores[k]), 6)})
        return rows

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, "test")

    def on_validation_epoch_start(self):
        self._decoded = {"val": []}

    def on_test_epoch_start(self):
        self._decoded = {"test": []}
        super().on_test_epoch_start()  # AttnReproModule: the predictions of this test

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:
            self._log_bleu("val")

    def on_test_epoch_end(self):
        self._log_bleu("test")
        super().on_test_epoch_end()  # AttnReproModule: predictions-test.jsonl

    def _log_bleu(self, stage: str) -> None:
        """BLEU of this epoch's hypotheses (every process's, gathered) against the
        DataModule's references of the same examples (module docstring)."""
        datamodule = self._datamodule()
        if not scores_bleu(datamodule):
            return
        decoded = getattr(self, "_decoded", {}).get(stage, [])
        decoded = [item for part in gather_objects(decoded) for item in part]
        decoded = sorted(dict(decoded).items())  # one per example (a padded batch repeats)
        if not decoded:
            return
        report = translation_bleu(datamodule, stage, [i for i, _ in decoded],
                                  [ids for _, (ids, _) in decoded],
                                  [score for _, (_, score) in decoded])
        self.log(f"{stage}/bleu", report["bleu"]["score"], rank_zero_only=True)
        self.log(f"{stage}/sacrebleu", report["sacrebleu"]["score"], rank_zero_only=True)
        log_dir = self.trainer.log_dir  # a broadcast under DDP: every process asks
        if self.trainer.is_global_zero:
            for logger in self.loggers:
                logger.log_hyperparams({f"{stage}/bleu_signature": report["bleu"]["signature"],
                                        f"{stage}/sacrebleu_signature":
                                            report["sacrebleu"]["signature"]})
            if stage == "test" and log_dir:
                write_translation_report(Path(log_dir), stage, report)
