"""RNNSeq2Seq: the LSTM translator of the attention-density-matrix paper (docs/papers.md),
with the decoder's attention selected by flag.

The paper: "2-layer BiLSTM encoders, and 2-layer LSTM decoders; all comprise 256-dimensional
hidden states on each layer", 256-d embeddings, dropout 0.2, beam width 10, maximum
inference length 50, Adam with its defaults for En-Vi; "for the remainder of
hyper-parameters ... the code [16]" (tensorflow/nmt).  The defaults here are those settings;
``--model.attention`` picks the mechanism (``additive``, the Bahdanau baseline;
``structured``; ``density`` with ``--model.attention.scheme mqt|aqt``; any registered
mechanism whose ``supports("decoder")``: softmax, luong, coda, window, localness).

Encoder.  Source embeddings (E), a ``n_encoder_layers`` bidirectional LSTM of ``hidden``
units per direction over packed sequences (so padding never enters it: sources must be
right-padded, ``src_mask`` a prefix of True), and the concatenated states [fw; bw] (2H)
mapped by a bias-free linear map to the memory h_j (H) the decoder attends: the paper's "h
and s must share a dimension" (the density matrix adds h_j + h_k and compares them with s_i).

Decoder initial state (a "bridge", as OpenNMT-py's ``-bridge``).  tensorflow/nmt passes the
encoder's final states to the decoder (``pass_hidden_state``); ours are 2H wide per layer, so
they are mapped: with f = the final states of every encoder layer and direction
concatenated (n_encoder_layers * 2H),
    h_0 = tanh(W_h f)   c_0 = W_c f      reshaped to (n_decoder_layers, H)
(tanh keeps h in an LSTM output's range, the cell is unbounded), which also works when the
layer counts differ.

Decoder: a ``n_decoder_layers`` LSTM whose top state s_i queries the memory through the
mechanism's :class:`attention.DecoderCore`, and Luong et al.'s (2015, Eq. 5-6) output layer:

    c_i, a_i = core(s_i, memory)                 (the weights a_i are returned, B x T x N)
    att_i = tanh(W_a [c_i; s_i])                 (attentional hidden, bias-free, H)
    p(y_i | y_<i, x) = softmax(W_o att_i)        (bias-free, as tensorflow/nmt's projection)

(tensorflow/nmt's AttentionWrapper uses a linear attention layer with no tanh; we keep
Luong's tanh.)  ``input_feeding`` (Luong Sec. 3.3) feeds att_{i-1} with the embedding of
y_{i-1} into the first LSTM layer (att_0 = 0); tensorflow/nmt's AttentionWrapper always
does, so ``--model.input_feeding true`` is the closest to the paper's code, ``false``
(default) the plain form of the paper's Eq. 1-2.  Teacher forcing without input feeding runs
the LSTM over every target position at once and attends for all steps in one ``core(s,
memory)`` call; with input feeding it goes step by step (``core.step``), as decoding does.

``tie_output`` ties W_o to the target embedding (needs ``embedding_dim == hidden``); off by
default, as tensorflow/nmt.  Dropout (``dropout``) on the input of every LSTM layer, as
tensorflow/nmt's DropoutWrapper(input_keep_prob): the embeddings (with input feeding, the
fed vector too) and between layers.  The model's own weights start uniform in (-0.1, 0.1)
and the LSTMs' forget-gate biases at 1 (tensorflow/nmt's ``init_weight`` and
``forget_bias``); the attention cores keep their own initialisation.  Gradient clipping
(tensorflow/nmt: norm 5) is the Trainer's ``gradient_clip_val``.

Decoding goes through the one beam search (:meth:`Seq2SeqTask.search`): the memory is
precomputed once per source (``core.precompute``) and repeated for the beams; a step runs
one LSTM step and one ``core.step`` (O(N)).  The beam state holds the LSTM's (h, c) batch
first (N, layers, H) and the fed vector, so beam search's default reordering
(:func:`attention.base.select_rows`) applies; the per-source memory is identical in an
example's K rows and beam search keeps every row inside its example's block, so it is held
by the step function and never reordered (lit_models/decoding.py).

On the first validation batch of every validation epoch (not the sanity check), when a
WandbLogger is among the loggers: heat maps of the attention weights of the first example
over its greedy translation (``val/attention``) and, for the density mechanism, the
density matrix Psi_i of the middle output word (``val/density_matrix``).  A failure there
is a warning, never a failed run.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attention import Mechanism, build
from attention.additive import additive
from lit_models.base import AttnReproModule
from lit_models.blocks import at_least_one
from lit_models.decoding import Hypotheses, LengthPenalty, repeat_beams
from lit_models.metrics import SequenceExactMatch
from lit_models.seq2seq import Seq2SeqTask, check_decoding

#: tensorflow/nmt's uniform initialisation range and LSTM forget-gate bias
INIT_SCALE, FORGET_BIAS = 0.1, 1.0


class RNNOutput(NamedTuple):
    """What :meth:`RNNSeq2Seq.forward` returns."""

    logits: Tensor  # (B,T,V)
    weights: Tensor | None  # (B,T,N) the decoder's attention weights; None unless asked


class Decoded(NamedTuple):
    """Teacher-forced decoding (:meth:`RNNSeq2Seq.teacher_forced`)."""

    logits: Tensor  # (B,T,V)
    weights: Tensor  # (B,T,N)
    states: Tensor  # (B,T,H) s_i, the top LSTM layer's states (the attention's queries)
    memory: dict  # the core's precomputed memory (``memory["h"]`` (B,N,H))


class AttentionMaps(NamedTuple):
    """What the validation heat maps show for one source sentence
    (:meth:`RNNSeq2Seq.attention_maps`)."""

    tokens: Tensor  # (T,) the greedy translation, eos included when generated
    weights: Tensor  # (T,N) the attention weights while emitting each token
    step: int | None  # the output position of ``density`` (density mechanism only)
    density: Tensor | None  # (N,N) Psi of that step (density mechanism only)


class RNNSeq2Seq(Seq2SeqTask, AttnReproModule):
    """BiLSTM encoder, LSTM decoder with flagged attention (module docstring).

    Sizes: ``embedding_dim`` (E), ``hidden`` (H: each encoder direction, the memory, the
    decoder), ``n_encoder_layers``, ``n_decoder_layers``; ``dropout``; ``attention`` (a
    mechanism supporting the decoder context; others raise
    :class:`attention.UnsupportedContext`); ``input_feeding``; ``tie_output``;
    ``label_smoothing``.  Optimiser (lit_models.base): Adam defaults (lr 1e-3, betas (0.9,
    0.999), no weight decay, constant), the paper's En-Vi setting.  Batches, decoding
    (``beam_size`` 10, ``length_penalty``, ``alpha``, ``max_len_a``, ``max_decode_len`` 50:
    the paper's width and length) and what is logged: :mod:`lit_models.seq2seq`.
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        pad_id: int = 0,
        bos_id: int = 2,
        eos_id: int = 3,
        embedding_dim: int = 256,
        hidden: int = 256,
        n_encoder_layers: int = 2,
        n_decoder_layers: int = 2,
        dropout: float = 0.2,
        attention: Mechanism = additive(),  # noqa: B008 - an immutable flag value
        input_feeding: bool = False,
        tie_output: bool = False,
        label_smoothing: float = 0.0,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        schedule: Literal["constant", "inverse_sqrt", "linear"] = "constant",
        warmup_steps: int = 0,
        betas: tuple[float, float] = (0.9, 0.999),
        beam_size: int = 10,
        length_penalty: LengthPenalty = "gnmt",
        alpha: float = 0.0,
        max_len_a: float = 0.0,
        max_decode_len: int = 50,
    ):
        check_decoding(beam_size, max_len_a, max_decode_len)
        at_least_one(src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size,
                     embedding_dim=embedding_dim, hidden=hidden,
                     n_encoder_layers=n_encoder_layers, n_decoder_layers=n_decoder_layers)
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if not 0 <= label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        if tie_output and embedding_dim != hidden:
            raise ValueError(f"tie_output needs embedding_dim == hidden (the attentional "
                             f"vector's size), got {embedding_dim} and {hidden}")
        super().__init__(lr=lr, weight_decay=weight_decay, schedule=schedule,
                         warmup_steps=warmup_steps, betas=betas)
        self.save_hyperparameters()
        mechanism = build(attention)  # LightningCLI may hand the flag over as a config dict
        self.mechanisms = {"decoder": mechanism}
        E, H = embedding_dim, hidden

        self.src_embed = nn.Embedding(src_vocab_size, E, padding_idx=pad_id)
        self.encoder = nn.LSTM(E, H, n_encoder_layers, batch_first=True, bidirectional=True,
                               dropout=dropout if n_encoder_layers > 1 else 0.0)
        self.memory_proj = nn.Linear(2 * H, H, bias=False)  # [fw; bw] -> h_j
        self.bridge_h = nn.Linear(n_encoder_layers * 2 * H, n_decoder_layers * H)
        self.bridge_c = nn.Linear(n_encoder_layers * 2 * H, n_decoder_layers * H)

        self.tgt_embed = nn.Embedding(tgt_vocab_size, E, padding_idx=pad_id)
        self.decoder = nn.LSTM(E + H if input_feeding else E, H, n_decoder_layers,
                               batch_first=True,
                               dropout=dropout if n_decoder_layers > 1 else 0.0)
        self.attentional = nn.Linear(2 * H, H, bias=False)  # W_a [c_i; s_i]
        self.out = nn.Linear(H, tgt_vocab_size, bias=False)  # W_o
        self.dropout = nn.Dropout(dropout)
        self._init_weights()
        if tie_output:
            self.out.weight = self.tgt_embed.weight
        # built after the initialisation: the core keeps its own
        self.attention = mechanism.decoder(query_dim=H, memory_dim=H)

        self.val_exact = SequenceExactMatch(eos_id)
        self.test_exact = SequenceExactMatch(eos_id)

    def _init_weights(self) -> None:
        with torch.no_grad():
            for p in self.parameters():
                p.uniform_(-INIT_SCALE, INIT_SCALE)
            for embed in (self.src_embed, self.tgt_embed):
                embed.weight[self.hparams.pad_id].zero_()
            H = self.hparams.hidden
            for lstm in (self.encoder, self.decoder):
                for name, p in lstm.named_parameters():
                    if name.startswith("bias_ih"):  # gates i, f, g, o: f in [H, 2H)
                        p[H:2 * H] += FORGET_BIAS

    # -- encoder -------------------------------------------------------------------------------
    def encode(self, src: Tensor, src_mask: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """src (B,N) ids, src_mask (B,N) True at the real tokens (a prefix) ->
        (memory h (B,N,H), 0 at padded positions; the decoder's initial (h_0, c_0), each
        (B, n_decoder_layers, H), batch first)."""
        if src_mask.dtype != torch.bool or src_mask.shape != src.shape:
            raise ValueError(f"src_mask must be a boolean tensor shaped like src "
                             f"{tuple(src.shape)}, got {src_mask.dtype} {tuple(src_mask.shape)}")
        b, n = src.shape
        lengths = src_mask.sum(1)
        if not torch.equal(src_mask, torch.arange(n, device=src.device) < lengths[:, None]):
            raise ValueError("RNNSeq2Seq needs right-padded sources: src_mask must be True on "
                             "a prefix of each row")
        x = self.dropout(self.src_embed(src))  # (B,N,E)
        # an empty source reads one (padding) token so that packing works; its memory is
        # all masked
        packed = pack_padded_sequence(x, lengths.clamp(min=1).cpu(), batch_first=True,
                                      enforce_sorted=False)
        out, (h_n, c_n) = self.encoder(packed)  # h_n, c_n (layers*2, B, H), original order
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=n)  # (B,N,2H)
        memory = self.memory_proj(out)  # (B,N,H)
        layers, H = self.hparams.n_decoder_layers, self.hparams.hidden
        finals = [s.transpose(0, 1).reshape(b, -1) for s in (h_n, c_n)]  # (B, layers*2H)
        h0 = torch.tanh(self.bridge_h(finals[0])).view(b, layers, H)
        c0 = self.bridge_c(finals[1]).view(b, layers, H)
        return memory, (h0, c0)

    # -- decoder -------------------------------------------------------------------------------
    def _output(self, s: Tensor, memory: dict, step: bool) -> tuple[Tensor, Tensor, Tensor]:
        """(logits, weights, att): attention of s (B,T,H) or, with ``step``, (B,H)."""
        context, weights = self.attention.step(s, memory) if step else self.attention(s, memory)
        att = torch.tanh(self.attentional(torch.cat([context, s], dim=-1)))
        return self.out(att), weights, att

    def decoder_step(self, tokens: Tensor, state: dict, memory: dict
                     ) -> tuple[Tensor, Tensor, dict]:
        """One decoder step: the previous tokens (N,), the state (``h``, ``c``: (N,layers,H);
        ``feed``: (N,H) with input feeding) and the precomputed memory ->
        (logits (N,V), weights (N,Nsrc), the next state)."""
        x = self.tgt_embed(tokens)  # (N,E)
        if self.hparams.input_feeding:
            x = torch.cat([x, state["feed"]], dim=-1)
        hc = (state["h"].transpose(0, 1).contiguous(), state["c"].transpose(0, 1).contiguous())
        out, (h, c) = self.decoder(self.dropout(x).unsqueeze(1), hc)
        logits, weights, att = self._output(out[:, 0], memory, step=True)
        new = {"h": h.transpose(0, 1), "c": c.transpose(0, 1)}
        if self.hparams.input_feeding:
            new["feed"] = att
        return logits, weights, new

    def initial_state(self, init: tuple[Tensor, Tensor]) -> dict:
        """The decoder state of :meth:`decoder_step` from :meth:`encode`'s (h_0, c_0)."""
        h0, c0 = init
        state = {"h": h0, "c": c0}
        if self.hparams.input_feeding:
            state["feed"] = h0.new_zeros(h0.shape[0], self.hparams.hidden)  # att_0 = 0
        return state

    def start(self, src: Tensor, src_mask: Tensor, beam_size: int = 1) -> tuple[dict, dict]:
        """(state, memory) for decoding ``beam_size`` hypotheses per source: encoded and
        precomputed once per source, then repeated in beam search's row order."""
        h, init = self.encode(src, src_mask)
        memory = self.attention.precompute(h, src_mask)
        return (repeat_beams(self.initial_state(init), beam_size),
                repeat_beams(memory, beam_size))

    def teacher_forced(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Decoded:
        """Every target position at once (no input feeding) or step by step (input
        feeding), given the previous reference tokens ``tgt_in`` (B,T)."""
        h, init = self.encode(src, src_mask)
        memory = self.attention.precompute(h, src_mask)
        if not self.hparams.input_feeding:
            x = self.dropout(self.tgt_embed(tgt_in))  # (B,T,E)
            hc = tuple(t.transpose(0, 1).contiguous() for t in init)  # (layers,B,H)
            s, _ = self.decoder(x, hc)  # (B,T,H)
            logits, weights, _ = self._output(s, memory, step=False)
            return Decoded(logits, weights, s, memory)
        state, steps = self.initial_state(init), []
        for t in range(tgt_in.shape[1]):
            logits, weights, state = self.decoder_step(tgt_in[:, t], state, memory)
            steps.append((logits, weights, state["h"][:, -1]))
        logits, weights, s = (torch.stack(x, dim=1) for x in zip(*steps))
        return Decoded(logits, weights, s, memory)

    def forward(self, src, src_mask, tgt_in, tgt_mask=None, need_weights=False) -> RNNOutput:
        """Teacher-forced logits (B,T,V); the attention weights (B,T,N) when asked.
        ``tgt_mask`` is not needed: the decoder is causal and padded target positions come
        after the real ones (the loss ignores them)."""
        decoded = self.teacher_forced(src, src_mask, tgt_in)
        return RNNOutput(decoded.logits, decoded.weights if need_weights else None)

    @torch.no_grad()
    def generate(self, src, src_mask, beam_size: int | None = None,
                 max_len: int | Tensor | None = None) -> Hypotheses:
        """Beam search with this model's settings unless given (:meth:`search`)."""
        k = beam_size or self.hparams.beam_size
        state, memory = self.start(src, src_mask, k)

        def step(prefix, state):
            logits, _, state = self.decoder_step(prefix[:, -1], state, memory)
            dtype = torch.promote_types(logits.dtype, torch.float32)
            return logits.log_softmax(-1, dtype=dtype), state

        return self.search(step, state, src_mask, k, max_len)

    # -- validation heat maps ------------------------------------------------------------------
    @torch.no_grad()
    def attention_maps(self, src: Tensor, src_mask: Tensor,
                       max_len: int | None = None) -> AttentionMaps:
        """For one source sentence (1,N) (its real tokens): the greedy translation, the
        attention weights over it, and for the density mechanism Psi of the middle output
        position."""
        if src.shape[0] != 1:
            raise ValueError(f"attention_maps takes one sentence (1,N), got {tuple(src.shape)}")
        n = int(src_mask.sum())
        src, src_mask = src[:, :n], src_mask[:, :n]
        hyp = self.generate(src, src_mask, beam_size=1, max_len=max_len)
        tokens = hyp.tokens[0, :int(hyp.nbest_lengths[0, 0])]  # (T,)
        tgt_in = torch.cat([tokens.new_full((1,), self.hparams.bos_id), tokens[:-1]])[None]
        decoded = self.teacher_forced(src, src_mask, tgt_in)
        step = density = None
        if hasattr(self.attention, "density_matrix"):
            step = (len(tokens) - 1) // 2
            density = self.attention.density_matrix(decoded.states[:, step],
                                                    decoded.memory)[0]
        return AttentionMaps(tokens, decoded.weights[0], step, density)

    def attention_figures(self, src: Tensor, src_mask: Tensor, src_words: list[str] | None = None,
                          tgt_words=None, max_len: int | None = None) -> dict:
        """The validation heat maps of one source sentence (1,N) as matplotlib Figures:
        ``attention`` and, for the density mechanism, ``density_matrix``.  ``src_words``
        labels the real source tokens, ``tgt_words(ids) -> words`` the output tokens (ids
        by default)."""
        from lit_models.plots import matrix_heatmap

        maps = self.attention_maps(src, src_mask, max_len)
        n = maps.weights.shape[1]
        src_words = src_words or [str(i) for i in src[0, :n].tolist()]
        ids = maps.tokens.tolist()
        out_words = tgt_words(ids) if tgt_words else [str(i) for i in ids]
        tag = self.mechanisms["decoder"].tag()
        figures = {"attention": matrix_heatmap(
            maps.weights.float(), out_words, src_words,
            title=f"{tag}, step {self.global_step}", row_label="output",
            column_label="source")}
        if maps.density is not None:
            figures["density_matrix"] = matrix_heatmap(
                maps.density.float(), src_words, src_words,
                title=f"{tag}: Psi at output {maps.step} ({out_words[maps.step]!r}), "
                      f"step {self.global_step}", row_label="source j",
                column_label="source k")
        return figures

    def _wandb_loggers(self) -> list:
        if self._trainer is None:
            return []
        from lightning.pytorch.loggers import WandbLogger

        return [lg for lg in self.loggers if isinstance(lg, WandbLogger)]

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        if batch_idx == 0 and not self.trainer.sanity_checking and self.trainer.is_global_zero:
            loggers = self._wandb_loggers()
            if loggers:
                self._log_heatmaps(batch, loggers)

    def _log_heatmaps(self, batch, loggers) -> None:
        """The first example of the batch's heat maps to every WandbLogger; any error is a
        warning."""
        from lightning.pytorch.utilities import rank_zero_warn

        from lit_models.plots import figure_image

        try:
            src, src_mask = batch["src"][:1], batch["src_mask"][:1]
            n = int(src_mask.sum())
            figures = self.attention_figures(
                src, src_mask, self._words("src", src[0, :n].tolist()),
                lambda ids: self._words("tgt", ids))
            images = {name: figure_image(fig) for name, fig in figures.items()}
            for lg in loggers:
                for name, image in images.items():
                    lg.log_image(key=f"val/{name}", images=[image], step=self.global_step)
        except Exception as err:  # noqa: BLE001 - a plot must never fail a run
            rank_zero_warn(f"RNNSeq2Seq: attention heat maps not logged: "
                           f"{type(err).__name__}: {err}")

    def _words(self, side: str, ids: list[int]) -> list[str]:
        """One label per id from the DataModule's ``src_tokenizer``/``tgt_tokenizer``
        (datamodules.text.TextTokenizer.id_to_token: a word or a BPE piece), else the ids."""
        tokenizer = getattr(self._datamodule(), f"{side}_tokenizer", None)
        if tokenizer is None:
            return [str(i) for i in ids]
        return [tokenizer.id_to_token(i) or str(i) for i in ids]

