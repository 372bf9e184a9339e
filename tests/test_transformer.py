"""TransformerSeq2Seq: attention flags reach the right modules, causal masking holds for
every mechanism (softmax-free ones included), greedy decoding and exact match."""

from __future__ import annotations

import inspect

import pytest
import torch
from jsonargparse import ArgumentParser

import attention
from attention import REGISTRY, build
from lit_models.metrics import SequenceExactMatch
from lit_models.transformer import (
    Output,
    Transformer,
    TransformerClassifier,
    TransformerLM,
    TransformerSeq2Seq,
)

DECODER_SELF = [n for n, cls in REGISTRY.items() if cls().supports("multihead")]


def small_model(**kwargs):
    torch.manual_seed(0)
    return TransformerSeq2Seq(13, 11, pad_id=0, bos_id=2, eos_id=3, d_model=16, n_heads=2,
                              d_ff=32, dropout=0.0, attention_dropout=0.0, **kwargs).eval()


def test_attention_flags_reach_each_module():
    m = small_model(attention=build("coda"), cross_attention=build("softmax"),
                    attention_layers=1)
    enc, dec = m.encoder.layers, m.decoder.layers
    assert enc[0].self_attn.mechanism.name == "coda"
    assert enc[1].self_attn.mechanism.name == "softmax"
    assert dec[0].self_attn.mechanism.name == "coda"
    assert dec[0].cross_attn.mechanism.name == "softmax"
    assert m.mechanisms["encoder"].tag() == "coda"


@pytest.mark.parametrize("name", DECODER_SELF)
def test_decoder_is_causal_for_every_mechanism(name):
    m = small_model(decoder_attention=build(name))
    src = torch.randint(4, 13, (2, 6))
    src_mask = torch.ones_like(src, dtype=torch.bool)
    src_mask[0, 4:] = False
    tgt = torch.randint(4, 11, (2, 7))
    changed = tgt.clone()
    changed[:, 4:] = torch.randint(4, 11, (2, 3))
    with torch.no_grad():
        try:
            a = m(src, src_mask, tgt).logits
        except attention.UnsupportedContext as err:  # declared: no causal form of this option
            assert "causal" in str(err) and name in str(err)
            pytest.skip(str(err))
        b = m(src, src_mask, changed).logits
    assert torch.allclose(a[:, :4], b[:, :4], atol=1e-5)
    assert not torch.allclose(a[:, 4:], b[:, 4:], atol=1e-5)


@pytest.mark.parametrize("name", ["softmax", "coda"])
def test_source_padding_is_invisible(name):
    m = small_model(attention=build(name))
    src = torch.randint(4, 13, (1, 6))
    mask = torch.tensor([[True] * 4 + [False] * 2])
    other = src.clone()
    other[0, 4:] = torch.tensor([5, 6])
    tgt = torch.randint(4, 11, (1, 5))
    with torch.no_grad():
        logits = m(src, mask, tgt).logits
        assert torch.allclose(logits, m(other, mask, tgt).logits, atol=1e-6)
        assert torch.allclose(logits, m(src[:, :4], mask[:, :4], tgt).logits, atol=1e-5)


def test_greedy_decoding_matches_a_step_by_step_argmax():
    m = small_model(attention=build("coda"))
    src = torch.randint(4, 13, (3, 5))
    mask = torch.ones_like(src, dtype=torch.bool)
    out = m.generate(src, mask, max_len=6)
    with torch.no_grad():
        for b in range(3):
            prefix = torch.tensor([[2]])
            for t in range(out.shape[1]):
                nxt = m(src[b:b + 1], mask[b:b + 1], prefix).logits[0, -1].argmax()
                assert nxt == out[b, t]
                if nxt == 3:
                    assert (out[b, t:] == 3).all()
                    break
                prefix = torch.cat([prefix, nxt.view(1, 1)], 1)


def test_exact_match_counts_whole_sequences():
    metric = SequenceExactMatch(eos_id=3)
    target = torch.tensor([[5, 6, 3, 0], [5, 3, 0, 0], [7, 7, 7, 3]])
    mask = target != 0
    pred = torch.tensor([[5, 6, 3, 9], [5, 4, 3, 3], [7, 7, 7, 3]])
    metric.update(pred, target, mask)
    metric.update(torch.tensor([[5, 6]]), torch.tensor([[5, 6, 3]]),
                  torch.tensor([[1, 1, 1]]).bool())
    assert metric.compute().item() == pytest.approx(2 / 4)


def test_unsupported_mechanism_error_names_it():
    class only_alignment(attention.Mechanism):  # noqa: N801
        name = "only_alignment"
        unsupported = {"multihead": "a test mechanism"}

    with pytest.raises(attention.UnsupportedContext, match="only_alignment.*multihead"):
        small_model(attention=only_alignment())


# what each Transformer may take besides the shared settings: its data sizes and its shape
OWN_SETTINGS = {
    TransformerSeq2Seq: {"src_vocab_size", "tgt_vocab_size", "bos_id", "eos_id",
                         "n_encoder_layers", "n_decoder_layers", "encoder_attention",
                         "decoder_attention", "cross_attention", "share_embeddings",
                         "max_decode_len"},
    TransformerClassifier: {"vocab_size", "num_classes", "n_layers", "pooling"},
    TransformerLM: {"vocab_size", "n_layers", "tie_output"},
}


@pytest.mark.parametrize("cls", list(OWN_SETTINGS), ids=lambda c: c.__name__)
def test_the_transformers_share_one_settings_set(cls):
    """A setting added to one Transformer only (not to ``Transformer``, which all three
    forward their keywords to) fails here; the CLI still sees every setting flat."""
    shared = set(inspect.signature(Transformer.__init__).parameters) - {"self"}
    params = inspect.signature(cls.__init__).parameters
    assert params["settings"].kind is inspect.Parameter.VAR_KEYWORD
    own = set(params) - {"self", "settings"}
    assert own == OWN_SETTINGS[cls], (
        f"{cls.__name__} has settings of its own the others lack: "
        f"{sorted(own - OWN_SETTINGS[cls])}; put shared ones in Transformer")
    parser = ArgumentParser()
    parser.add_class_arguments(cls, "model")
    keys = {action.dest for action in parser._actions}
    assert {f"model.{k}" for k in shared | own} <= keys
    assert not any(k.startswith("model.settings") for k in keys)


def test_every_forward_returns_one_output_type():
    tokens = torch.randint(4, 11, (2, 5))
    mask = torch.ones_like(tokens, dtype=torch.bool)
    models = [(small_model(), (tokens, mask, tokens)),
              (TransformerClassifier(11, 3, d_model=16, n_heads=2, d_ff=32).eval(), (tokens, mask)),
              (TransformerLM(11, d_model=16, n_heads=2, d_ff=32).eval(), (tokens, mask))]
    for model, args in models:
        plain, weighted = model(*args), model(*args, need_weights=True)
        assert isinstance(plain, Output) and plain.weights is None
        assert isinstance(weighted, Output) and weighted.weights
        torch.testing.assert_close(plain.logits, weighted.logits)
