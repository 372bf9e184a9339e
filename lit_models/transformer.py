"""Transformer LightningModules with an attention flag per module.

``attention`` sets every attention module; ``encoder_attention``, ``decoder_attention``
and ``cross_attention`` override it per module, and ``attention_layers`` limits the
flagged mechanism to the lowest layers (softmax above).  E.g. the CoDA Transformer of
CoDA Table 6 is ``--model.attention coda``; Differentiable Window's Enc(AW)-Dec(MW) is
``--model.encoder_attention window --model.decoder_attention window
--model.decoder_attention.variant mw --model.attention_layers 3``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attention import Mechanism
from attention.softmax import softmax
from lit_models.base import AttnReproModule
from lit_models.blocks import Decoder, Encoder
from lit_models.decoding import greedy_decode
from lit_models.metrics import SequenceExactMatch


class TransformerSeq2Seq(AttnReproModule):
    """Encoder-decoder Transformer (Vaswani et al. 2017) for transduction tasks.

    Batches: src (B,Ls), src_mask, tgt_in (B,Lt) starting with bos, tgt_out (B,Lt) ending
    with eos, tgt_mask.  Logs loss and per-sequence exact match of greedy decoding on
    validation and test.
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        pad_id: int = 0,
        bos_id: int = 2,
        eos_id: int = 3,
        d_model: int = 128,
        n_heads: int = 4,
        d_ff: int = 512,
        n_encoder_layers: int = 2,
        n_decoder_layers: int = 2,
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        attention: Mechanism = softmax(),
        encoder_attention: Mechanism | None = None,
        decoder_attention: Mechanism | None = None,
        cross_attention: Mechanism | None = None,
        attention_layers: int | None = None,
        share_embeddings: bool = False,
        label_smoothing: float = 0.1,
        max_decode_len: int = 10,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        schedule: str = "inverse_sqrt",
        warmup_steps: int = 1000,
    ):
        super().__init__(lr=lr, weight_decay=weight_decay, schedule=schedule,
                         warmup_steps=warmup_steps)
        self.save_hyperparameters()
        self.mechanisms = {"encoder": encoder_attention or attention,
                           "decoder": decoder_attention or attention,
                           "cross": cross_attention or attention}
        self.encoder = Encoder(src_vocab_size, d_model, n_heads, d_ff, n_encoder_layers,
                               self.mechanisms["encoder"], attention_layers, pad_id, dropout,
                               attention_dropout)
        self.decoder = Decoder(tgt_vocab_size, d_model, n_heads, d_ff, n_decoder_layers,
                               self.mechanisms["decoder"], self.mechanisms["cross"],
                               attention_layers, pad_id, dropout, attention_dropout)
        if share_embeddings:
            if src_vocab_size != tgt_vocab_size:
                raise ValueError("share_embeddings needs one vocabulary for source and target")
            self.decoder.embed.tokens.weight = self.encoder.embed.tokens.weight
        self.val_exact = SequenceExactMatch(eos_id)
        self.test_exact = SequenceExactMatch(eos_id)

    def forward(self, src, src_mask, tgt_in, tgt_mask=None, need_weights=False):
        """Teacher-forced logits (B,Lt,V) (and attention weights when asked)."""
        memory, enc_w = self.encoder(src, src_mask, need_weights)
        logits, dec_w = self.decoder(tgt_in, tgt_mask, memory, src_mask, need_weights)
        return (logits, {"encoder": enc_w, "decoder": dec_w}) if need_weights else logits

    def loss(self, logits, batch, smoothing: float):
        return F.cross_entropy(logits.transpose(1, 2), batch["tgt_out"],
                               ignore_index=self.hparams.pad_id, label_smoothing=smoothing)

    def generate(self, src, src_mask, max_len: int | None = None):
        """Greedy decoding: (B, <=max_len) ids ending in eos (padded with eos)."""
        memory, _ = self.encoder(src, src_mask)

        def next_logits(prefix):
            logits, _ = self.decoder(prefix, None, memory, src_mask)
            return logits[:, -1]

        return greedy_decode(next_logits, src.shape[0], self.hparams.bos_id,
                             self.hparams.eos_id, max_len or self.hparams.max_decode_len,
                             src.device)

    def training_step(self, batch, batch_idx):
        logits = self(batch["src"], batch["src_mask"], batch["tgt_in"], batch["tgt_mask"])
        loss = self.loss(logits, batch, self.hparams.label_smoothing)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["src"].shape[0])
        self.log("train/lr", self.optimizers().param_groups[0]["lr"])
        return loss

    def _evaluate(self, batch, stage: str, metric: SequenceExactMatch):
        bsz = batch["src"].shape[0]
        logits = self(batch["src"], batch["src_mask"], batch["tgt_in"], batch["tgt_mask"])
        self.log(f"{stage}/loss", self.loss(logits, batch, 0.0), batch_size=bsz, sync_dist=True)
        pred = self.generate(batch["src"], batch["src_mask"],
                             max_len=batch["tgt_out"].shape[1])
        metric.update(pred, batch["tgt_out"], batch["tgt_mask"])
        self.log(f"{stage}/exact_match", metric, batch_size=bsz, prog_bar=True)

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val", self.val_exact)

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, "test", self.test_exact)
