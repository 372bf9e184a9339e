"""RNNSeq2Seq (the attention-density-matrix paper's LSTM translator): step-by-step decoding
equals teacher forcing for every decoder mechanism, the density attention equals the paper's
formula (Psi built with loops) through the model's own states, source padding changes
nothing, beam search (greedy = argmax, reordering of the LSTM state), the attention flag,
and a tiny Lightning run with BLEU and the W&B heat maps.  float64 where exactness matters."""

from __future__ import annotations

import csv
import importlib
import json

import lightning as L
import pytest
import torch
from jsonargparse import ArgumentParser
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from torch.utils.data import DataLoader

from attention import UnsupportedContext, build
from attention.additive import AdditiveDecoder
from attention.density import DensityDecoder
from datamodules.common import Vocab
from datamodules.text import WordTokenizer
from lit_models.rnn_seq2seq import RNNOutput, RNNSeq2Seq
from tests.conftest import supporting

PAD, BOS, EOS = 0, 2, 3
SRC_V, TGT_V, E, H = 13, 11, 6, 8
DECODER = supporting("decoder")
TIGHT = dict(rtol=1e-9, atol=1e-11)


@pytest.fixture(autouse=True)
def eager(monkeypatch):
    """CoDA's block kernels eagerly (as test_contracts.py): no compile time for float64."""
    monkeypatch.setattr(importlib.import_module("attention._compiled"), "COMPILE", False)


def model(attention="additive", input_feeding=False, dtype=torch.float64, randomise=True,
          **kwargs):
    """A tiny model in eval mode.  ``randomise``: every parameter uniform in (-1, 1), so
    that the outputs depend strongly on every input and state (at the initial scale of 0.1
    a tiny LSTM barely does, and a wrongly carried state could pass unnoticed)."""
    torch.manual_seed(0)
    flag = build(attention) if isinstance(attention, str) else attention
    m = RNNSeq2Seq(SRC_V, TGT_V, pad_id=PAD, bos_id=BOS, eos_id=EOS, embedding_dim=E,
                   hidden=H, dropout=0.0, attention=flag, input_feeding=input_feeding,
                   **kwargs).to(dtype)
    if randomise:
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.rand(p.shape, generator=g, dtype=p.dtype) * 2 - 1)
    return m.eval()


def batch(lengths=(6, 4, 2), tgt_len=5, seed=1):
    """Right-padded sources with garbage (real ids) at the padded positions, and targets."""
    g = torch.Generator().manual_seed(seed)
    n = max(lengths)
    src = torch.randint(4, SRC_V, (len(lengths), n), generator=g)
    mask = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    tgt_in = torch.randint(4, TGT_V, (len(lengths), tgt_len), generator=g)
    tgt_in[:, 0] = BOS
    return src, mask, tgt_in


# -- 1. the generate path's step equals teacher forcing, every decoder mechanism ---------------
@pytest.mark.parametrize("input_feeding", [False, True], ids=["plain", "input_feeding"])
@pytest.mark.parametrize("name", DECODER)
def test_step_by_step_decoding_equals_teacher_forcing(name, input_feeding):
    m = model(name, input_feeding)
    src, mask, tgt_in = batch()
    with torch.no_grad():
        full = m(src, mask, tgt_in, need_weights=True)
        state, memory = m.start(src, mask)  # what generate() starts from (one beam)
        steps, weights = [], []
        for t in range(tgt_in.shape[1]):
            logits, w, state = m.decoder_step(tgt_in[:, t], state, memory)
            steps.append(logits)
            weights.append(w)
    assert isinstance(full, RNNOutput) and full.logits.shape == (3, 5, TGT_V)
    torch.testing.assert_close(torch.stack(steps, 1), full.logits, **TIGHT)
    torch.testing.assert_close(torch.stack(weights, 1), full.weights, **TIGHT)
    assert set(state) == ({"h", "c", "feed"} if input_feeding else {"h", "c"})
    assert state["h"].shape == (3, 2, H)  # batch first: beam search's select_rows applies
    assert m(src, mask, tgt_in).weights is None


@pytest.mark.parametrize("input_feeding", [False, True], ids=["plain", "input_feeding"])
def test_teacher_forcing_attends_for_all_steps_at_once_unless_input_feeding(input_feeding,
                                                                          monkeypatch):
    m = model("density", input_feeding)
    src, mask, tgt_in = batch()
    queries = []
    forward = m.attention.forward
    monkeypatch.setattr(m.attention, "forward",
                        lambda s, memory: queries.append(s.shape) or forward(s, memory))
    precompute = m.attention.precompute
    sources = []
    monkeypatch.setattr(m.attention, "precompute",
                        lambda h, mask: sources.append(h.shape) or precompute(h, mask))
    with torch.no_grad():
        m(src, mask, tgt_in)
    steps = tgt_in.shape[1]
    assert queries == ([(3, 1, H)] * steps if input_feeding else [(3, steps, H)])
    assert sources == [(3, 6, H)]  # the per-source part once, not once per step


# -- 2. the density attention is the paper's formula through the model's own states -----------
def naive_psi(s_i, h, core, scheme):
    """Psi_i (n,n) entry by entry (docs/papers.md, Eq. 5, 6, 9-11) for one sentence's real
    encodings h (n,H) and decoder state s_i (H,)."""
    score, n = core.score, h.shape[0]
    sq = core.query_proj(s_i)  # identity here: s and h share H
    psi = torch.zeros(n, n, dtype=h.dtype)
    for j in range(n):
        for k in range(n):
            if j == k:  # alpha_ik = u^T tanh(W s_i + V h_k + b)   (Eq. 5)
                psi[j, k] = score.u @ torch.tanh(score.query(s_i) + score.key(h[k]))
                continue
            pair = torch.tanh(h[j] + h[k])  # L_(j,k)   (Eq. 9)
            psi[j, k] = (core.w_s * (pair @ sq) if scheme == "mqt"  # Eq. 10
                         else torch.tanh(pair + sq) @ core.w_s)  # Eq. 11
    return psi


@pytest.mark.parametrize("input_feeding", [False, True], ids=["plain", "input_feeding"])
@pytest.mark.parametrize("scheme", ["mqt", "aqt"])
def test_density_attention_is_the_papers_formula(scheme, input_feeding):
    m = model(build("density", scheme=scheme), input_feeding)
    core = m.attention
    src, mask, tgt_in = batch(lengths=(5, 3), tgt_len=3)
    with torch.no_grad():
        decoded = m.teacher_forced(src, mask, tgt_in)
        h, _ = m.encode(src, mask)  # the model's encoder states (memory), (B,N,H)
        for b in range(2):
            n = int(mask[b].sum())
            for i in range(3):
                s_i = decoded.states[b, i]
                psi = naive_psi(s_i, h[b, :n], core, scheme)
                omega = torch.softmax(psi.mean(0), -1)  # Eq. 8: mean over rows j
                torch.testing.assert_close(decoded.weights[b, i, :n], omega, **TIGHT)
                assert (decoded.weights[b, i, n:] == 0).all()
                # the method the heat map uses: Psi itself, 0 in padded rows and columns
                matrix = core.density_matrix(decoded.states[:, i], decoded.memory)[b]
                torch.testing.assert_close(matrix[:n, :n], psi, **TIGHT)
                assert (matrix[n:] == 0).all() and (matrix[:, n:] == 0).all()
                # Luong's output layer on c_i = H omega_i
                att = torch.tanh(m.attentional(torch.cat([omega @ h[b, :n], s_i])))
                torch.testing.assert_close(decoded.logits[b, i], m.out(att), **TIGHT)


def test_density_matrix_is_blocked_and_matches_the_step_weights():
    m = model(build("density", scheme="aqt", block_elements=20))
    src, mask, tgt_in = batch(lengths=(6, 3), tgt_len=2)
    with torch.no_grad():
        decoded = m.teacher_forced(src, mask, tgt_in)
        psi = m.attention.density_matrix(decoded.states[:, 1], decoded.memory)  # (B,N,N)
    assert psi.shape == (2, 6, 6)
    real = mask.sum(1, keepdim=True)
    logits = (psi.sum(1) / real).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(torch.softmax(logits, -1), decoded.weights[:, 1], **TIGHT)


# -- 3. source padding changes nothing ---------------------------------------------------------
@pytest.mark.parametrize("input_feeding", [False, True], ids=["plain", "input_feeding"])
@pytest.mark.parametrize("name", ["additive", "density"])
def test_source_padding_changes_nothing(name, input_feeding):
    m = model(name, input_feeding)
    src, mask, tgt_in = batch(lengths=(6, 4, 2))
    with torch.no_grad():
        padded = m(src, mask, tgt_in, need_weights=True)
        memory, (h0, c0) = m.encode(src, mask)
        for b in range(3):
            n = int(mask[b].sum())
            alone = m(src[b:b + 1, :n], mask[b:b + 1, :n], tgt_in[b:b + 1], need_weights=True)
            torch.testing.assert_close(padded.logits[b], alone.logits[0], **TIGHT)
            torch.testing.assert_close(padded.weights[b, :, :n], alone.weights[0], **TIGHT)
            assert (padded.weights[b, :, n:] == 0).all()
            # the memory is the projected BiLSTM concatenation [fw; bw] of the real tokens
            out, _ = m.encoder(m.src_embed(src[b:b + 1, :n]))
            torch.testing.assert_close(memory[b, :n], m.memory_proj(out[0]), **TIGHT)
            assert (memory[b, n:] == 0).all()
        # the hypotheses as well
        beams = m.generate(src, mask, beam_size=2, max_len=4)
        for b in range(3):
            n = int(mask[b].sum())
            alone = m.generate(src[b:b + 1, :n], mask[b:b + 1, :n], beam_size=2, max_len=4)
            assert torch.equal(beams.nbest[b, :, :alone.nbest.shape[2]], alone.nbest[0])


def test_sources_must_be_right_padded():
    m = model()
    src, mask, tgt_in = batch(lengths=(4, 2))
    with pytest.raises(ValueError, match="right-padded"):
        m(src, mask.flip(1), tgt_in)
    with pytest.raises(ValueError, match="boolean"):
        m(src, mask.long(), tgt_in)


# -- 4. beam search ----------------------------------------------------------------------------
@pytest.mark.parametrize("input_feeding", [False, True], ids=["plain", "input_feeding"])
def test_greedy_decoding_is_a_step_by_step_argmax(input_feeding):
    m = model("density", input_feeding)
    src, mask, _ = batch(lengths=(5, 3))
    out = m.generate(src, mask, beam_size=1, max_len=6).tokens
    with torch.no_grad():
        for b in range(2):
            prefix = torch.tensor([[BOS]])
            for t in range(out.shape[1]):
                nxt = m(src[b:b + 1], mask[b:b + 1], prefix).logits[0, -1].argmax()
                assert nxt == out[b, t]
                if nxt == EOS:
                    assert (out[b, t:] == EOS).all()
                    break
                prefix = torch.cat([prefix, nxt.view(1, 1)], 1)


def log_prob(m, src, mask, tokens):
    """log P(tokens | src) by teacher forcing (tokens without bos)."""
    tgt_in = torch.cat([torch.tensor([BOS]), tokens[:-1]])[None]
    logits = m(src, mask, tgt_in).logits[0].log_softmax(-1)
    return logits.gather(1, tokens[:, None]).sum()


@pytest.mark.parametrize("input_feeding", [False, True], ids=["plain", "input_feeding"])
def test_beam_reordering_is_consistent(input_feeding, monkeypatch):
    """Width 3 on a batch = each example alone, and every hypothesis's score is its
    teacher-forced log-probability (alpha 0): the LSTM state (and the fed vector) followed
    its beam through reorderings that did move rows."""
    m = model("additive", input_feeding, beam_size=3, max_decode_len=5)
    src, mask, _ = batch(lengths=(6, 4, 3), seed=3)
    carried, decoder_step = [], m.decoder_step

    def recording(tokens, state, memory):
        out = decoder_step(tokens, state, memory)
        carried.append((state["h"], out[2]["h"]))  # the state given, the state returned
        return out

    monkeypatch.setattr(m, "decoder_step", recording)
    hyps = m.generate(src, mask)
    monkeypatch.undo()
    assert any(not torch.equal(given, carried[t - 1][1])
               for t, (given, _) in enumerate(carried) if t), "no row was ever reordered"
    assert hyps.nbest.shape[:2] == (3, 3)
    with torch.no_grad():
        for b in range(3):
            n = int(mask[b].sum())
            alone = m.generate(src[b:b + 1, :n], mask[b:b + 1, :n])
            assert torch.equal(hyps.tokens[b, :alone.tokens.shape[1]], alone.tokens[0])
            torch.testing.assert_close(hyps.nbest_scores[b], alone.nbest_scores[0])
            for k in range(3):
                length = int(hyps.nbest_lengths[b, k])
                expected = log_prob(m, src[b:b + 1, :n], mask[b:b + 1, :n],
                                    hyps.nbest[b, k, :length])
                torch.testing.assert_close(hyps.nbest_scores[b, k], expected, **TIGHT)


# -- 5. the attention flag -----------------------------------------------------------------------
def test_the_flag_reaches_the_core_and_the_defaults_are_the_papers():
    m = RNNSeq2Seq(SRC_V, TGT_V, embedding_dim=E, hidden=H,
                   attention=build("density", scheme="aqt"))
    assert isinstance(m.attention, DensityDecoder) and m.attention.scheme == "aqt"
    assert m.mechanisms["decoder"].tag() == "density(scheme=aqt)"
    # LightningCLI: --model.attention density --model.attention.scheme aqt
    parser = ArgumentParser()
    parser.add_class_arguments(RNNSeq2Seq, "model")
    cfg = parser.parse_args([f"--model.src_vocab_size={SRC_V}", f"--model.tgt_vocab_size={TGT_V}",
                             "--model.attention=density", "--model.attention.scheme=aqt",
                             "--model.input_feeding=true"])
    cli = parser.instantiate(cfg).model
    assert isinstance(cli.attention, DensityDecoder) and cli.attention.scheme == "aqt"
    assert cli.hparams.input_feeding and cli.decoder.input_size == 256 + 256
    # a config dict (as a YAML block)
    from_dict = RNNSeq2Seq(SRC_V, TGT_V, embedding_dim=E, hidden=H, attention={
        "class_path": "attention.density.density", "init_args": {"scheme": "mqt"}})
    assert from_dict.attention.scheme == "mqt"
    # the paper's settings by default: additive baseline, 256-d, 2+2 layers, dropout 0.2,
    # beam 10, length 50, Adam defaults
    hp = cli.hparams
    default = RNNSeq2Seq(SRC_V, TGT_V)
    assert isinstance(default.attention, AdditiveDecoder)
    assert (default.hparams.embedding_dim, default.hparams.hidden) == (256, 256)
    assert (hp.n_encoder_layers, hp.n_decoder_layers, hp.dropout) == (2, 2, 0.2)
    assert (hp.beam_size, hp.max_decode_len, hp.max_len_a) == (10, 50, 0.0)
    assert default.optim["lr"] == 1e-3 and tuple(default.optim["betas"]) == (0.9, 0.999)
    assert default.optim["schedule"] == "constant" and default.optim["weight_decay"] == 0
    assert default.encoder.bidirectional and default.encoder.num_layers == 2
    assert not default.hparams.tie_output and default.out.weight is not default.tgt_embed.weight


def test_unsupported_mechanisms_and_bad_settings_are_clear_errors():
    with pytest.raises(UnsupportedContext,
                       match=r"'relative' cannot be used for decoder attention.*"
                             r"Mechanisms that can: .*density"):
        RNNSeq2Seq(SRC_V, TGT_V, embedding_dim=E, hidden=H, attention=build("relative"))
    with pytest.raises(ValueError, match="tie_output needs embedding_dim == hidden"):
        RNNSeq2Seq(SRC_V, TGT_V, embedding_dim=E, hidden=H, tie_output=True)
    with pytest.raises(ValueError, match="dropout"):
        RNNSeq2Seq(SRC_V, TGT_V, dropout=1.0)
    with pytest.raises(ValueError, match="beam_size"):
        RNNSeq2Seq(SRC_V, TGT_V, beam_size=0)
    tied = RNNSeq2Seq(SRC_V, TGT_V, embedding_dim=H, hidden=H, tie_output=True)
    assert tied.out.weight is tied.tgt_embed.weight


def lstm_parameters(inp: int, hidden: int, layers: int, directions: int) -> int:
    """PyTorch's LSTM: 4 gates, input and recurrent weights, two biases, per direction."""
    first = 4 * hidden * (inp + hidden + 2)
    rest = 4 * hidden * (directions * hidden + hidden + 2)
    return directions * (first + (layers - 1) * rest)


@pytest.mark.parametrize("input_feeding", [False, True], ids=["plain", "input_feeding"])
def test_parameter_count_is_the_documented_architecture(input_feeding):
    """Embeddings, 2-layer BiLSTM, [fw; bw] -> H, the bridge (h and c), 2-layer LSTM (input
    E, or E + H with input feeding), W_a (2H -> H), W_o (H -> V), plus the core's own."""
    v_src, v_tgt, e, h = 17200, 7700, 256, 256  # IWSLT'15 En-Vi word vocabularies
    with torch.device("meta"):
        m = RNNSeq2Seq(v_src, v_tgt, input_feeding=input_feeding)
    core = sum(p.numel() for p in m.attention.parameters())
    own = (v_src * e + v_tgt * e + lstm_parameters(e, h, 2, 2) + 2 * h * h
           + 2 * (2 * 2 * h * 2 * h + 2 * h)
           + lstm_parameters(e + h if input_feeding else e, h, 2, 1) + 2 * h * h + h * v_tgt)
    assert m.n_parameters() == own + core


# -- 6. a tiny Lightning run ---------------------------------------------------------------------
class CopyData(L.LightningDataModule):
    """Eight tiny pairs (the target a function of the source) with what BLEU reads
    (datamodules/translation.py): ``bleu``, ``references``, ``raw_references``,
    ``sources``, ``decode``, ``detokenize``, and word vocabularies for the heat maps."""

    bleu = "tokenized"

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.pairs = []
        for n in (3, 5, 4, 6, 2, 5, 3, 4):
            src = torch.randint(4, SRC_V, (n,), generator=g).tolist()
            self.pairs.append((src, [4 + s % (TGT_V - 4) for s in src]))
        self.src_tokenizer = WordTokenizer(Vocab([f"s{i}" for i in range(4, SRC_V)]))
        self.tgt_tokenizer = WordTokenizer(Vocab([f"t{i}" for i in range(4, TGT_V)]))

    def collate(self, indices):
        src = [torch.tensor(self.pairs[i][0]) for i in indices]
        tgt = [torch.tensor(self.pairs[i][1]) for i in indices]
        pad = torch.nn.utils.rnn.pad_sequence
        tgt_in = pad([torch.cat([torch.tensor([BOS]), t]) for t in tgt], True, PAD)
        tgt_out = pad([torch.cat([t, torch.tensor([EOS])]) for t in tgt], True, PAD)
        src = pad(src, True, PAD)
        return {"src": src, "src_mask": src != PAD, "tgt_in": tgt_in, "tgt_out": tgt_out,
                "tgt_mask": tgt_out != PAD, "index": torch.tensor(indices)}

    def _loader(self):
        return DataLoader(list(range(len(self.pairs))), batch_size=4, collate_fn=self.collate)

    train_dataloader = val_dataloader = test_dataloader = _loader

    def decode(self, ids):
        words = []
        for i in ids:
            if i == EOS:
                break
            if i not in (PAD, BOS):
                words.append(self.tgt_tokenizer.vocab.itos[i])
        return " ".join(words)

    def references(self, stage):
        return [self.decode(t) for _, t in self.pairs]

    raw_references = references

    def sources(self, stage):
        return [" ".join(self.src_tokenizer.vocab.itos[i] for i in s) for s, _ in self.pairs]

    def detokenize(self, text):
        return text


def trainer(tmp_path, loggers, **kwargs):
    options = dict(max_steps=3, accelerator="cpu", devices=1, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
                   num_sanity_val_steps=0)
    return L.Trainer(logger=loggers, default_root_dir=tmp_path, **(options | kwargs))


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize(("name", "input_feeding"), [("additive", False), ("density", True)])
def test_tiny_fit_validate_test_logs_metrics_and_bleu(tmp_path, name, input_feeding):
    m = model(name, input_feeding, dtype=torch.float32, randomise=False, beam_size=2,
              max_decode_len=6).train()
    data = CopyData()
    csv_logger = CSVLogger(tmp_path, name="rnn")
    t = trainer(tmp_path, csv_logger)
    t.fit(m, data)
    assert t.global_step == 3
    t.validate(m, data)
    t.test(m, data)
    logged = rows(tmp_path / "rnn" / "version_0" / "metrics.csv")
    keys = {k for row in logged for k, v in row.items() if v not in ("", None)}
    for stage in ("val", "test"):
        assert {f"{stage}/loss", f"{stage}/exact_match", f"{stage}/bleu",
                f"{stage}/sacrebleu"} <= keys
    assert {"train/loss", "train/lr"} <= keys
    hyps = [json.loads(line) for line in
            (tmp_path / "rnn" / "version_0" / "hypotheses-test.jsonl").read_text().splitlines()]
    assert sorted(h["id"] for h in hyps) == list(range(8))
    assert hyps[0]["reference"] == data.references("test")[hyps[0]["id"]]


# -- the W&B heat maps ---------------------------------------------------------------------------
def test_validation_heat_maps_go_to_wandb_and_never_fail_a_run(tmp_path, monkeypatch):
    m = model(build("density", scheme="aqt"), dtype=torch.float32, randomise=False,
              beam_size=2, max_decode_len=5).train()
    data = CopyData()
    wandb_logger = WandbLogger(save_dir=str(tmp_path), mode="disabled")
    logged, figures = [], []
    monkeypatch.setattr(wandb_logger, "log_image",
                        lambda key, images, step=None: logged.append((key, images, step)))
    draw = m.attention_figures

    def recorded(*args, **kwargs):
        figures.append(draw(*args, **kwargs))
        return figures[-1]

    monkeypatch.setattr(m, "attention_figures", recorded)
    t = trainer(tmp_path, [CSVLogger(tmp_path), wandb_logger], max_steps=1,
                limit_train_batches=1, limit_val_batches=1, num_sanity_val_steps=1)
    t.fit(m, data)  # one validation epoch after the sanity check (which logs nothing)
    assert [key for key, _, _ in logged] == ["val/attention", "val/density_matrix"]
    assert all(images[0].ndim == 3 and images[0].dtype.name == "uint8"
               for _, images, _ in logged)
    # the first example of the first batch, labelled with the DataModule's words
    source = [f"s{i}" for i in data.pairs[0][0]]
    attention = figures[0]["attention"].axes[0]
    assert [x.get_text() for x in attention.get_xticklabels()] == source
    assert all(y.get_text().startswith("t") or y.get_text() == "</s>"
               for y in attention.get_yticklabels())
    psi = figures[0]["density_matrix"].axes[0]
    assert [y.get_text() for y in psi.get_yticklabels()] == source

    def broken(*args, **kwargs):
        raise RuntimeError("W&B is down")

    monkeypatch.setattr(wandb_logger, "log_image", broken)
    with pytest.warns(UserWarning, match="heat maps not logged: RuntimeError: W&B is down"):
        m._log_heatmaps(next(iter(data.val_dataloader())), [wandb_logger])


def test_attention_figures_without_density_have_no_density_matrix():
    m = model("additive", dtype=torch.float32)
    src, mask, _ = batch(lengths=(4,))
    maps = m.attention_maps(src, mask, max_len=3)
    assert maps.density is None and maps.weights.shape == (len(maps.tokens), 4)
    assert set(m.attention_figures(src, mask, max_len=3)) == {"attention"}
