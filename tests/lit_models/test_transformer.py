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


# every mechanism with its defaults, and the options whose statistics span a row or matrix
# (CoDA's centering: per query row in a causal decoder, so no future token moves it)
CAUSAL_CASES = DECODER_SELF + ["coda:gate=centered", "coda:center_e=true",
                               "coda:gate=centered,center_e=true", "density:scheme=aqt",
                               "window:segment_size=1"]


def build_spec(spec: str):
    name, _, options = spec.partition(":")
    values = {"true": True, "false": False}
    kwargs = dict(o.split("=") for o in options.split(",")) if options else {}
    return build(name, **{k: values.get(v, int(v) if v.isdigit() else v)
                          for k, v in kwargs.items()})


@pytest.mark.parametrize("name", CAUSAL_CASES)
def test_decoder_is_causal_for_every_mechanism(name):
    try:  # an option with no causal form is refused when the decoder is built
        m = small_model(decoder_attention=build_spec(name))
    except attention.UnsupportedContext as err:
        assert "causal" in str(err) and name.partition(":")[0] in str(err)
        pytest.skip(str(err))
    src = torch.randint(4, 13, (2, 6))
    src_mask = torch.ones_like(src, dtype=torch.bool)
    src_mask[0, 4:] = False
    tgt = torch.randint(4, 11, (2, 7))
    changed = tgt.clone()
    changed[:, 4:] = torch.randint(4, 11, (2, 3))
    with torch.no_grad():
        a = m(src, src_mask, tgt).logits
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
    out = m.generate(src, mask, max_len=6).tokens
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


@pytest.mark.parametrize("settings, message", [
    ({"d_model": 0}, "d_model must be at least 1, got 0"),
    ({"d_model": -8}, "d_model must be at least 1, got -8"),
    ({"n_heads": 0}, "n_heads must be at least 1, got 0"),
    ({"d_ff": 0}, "d_ff must be at least 1, got 0"),
    ({"n_encoder_layers": -1}, "n_encoder_layers must be at least 1, got -1"),
    ({"n_decoder_layers": 0}, "n_decoder_layers must be at least 1, got 0"),
    ({"n_heads": 3}, "d_model 16 is not divisible by n_heads 3"),
])
def test_bad_sizes_are_named_errors(settings, message):
    """Each impossible size is one clear error (they were a ZeroDivisionError, raw torch
    errors, or silently accepted)."""
    base = dict(d_model=16, n_heads=2, d_ff=32)
    with pytest.raises(ValueError, match=message):
        TransformerSeq2Seq(13, 11, pad_id=0, bos_id=2, eos_id=3, **{**base, **settings})


# what each Transformer may take besides the shared settings: its data sizes and its shape
OWN_SETTINGS = {
    TransformerSeq2Seq: {"src_vocab_size", "tgt_vocab_size", "bos_id", "eos_id",
                         "n_encoder_layers", "n_decoder_layers", "encoder_attention",
                         "decoder_attention", "cross_attention", "share_embeddings",
                         "beam_size", "length_penalty", "alpha", "max_len_a", "max_decode_len"},
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


# -- machine translation: incremental decoding, beam search, post-norm -------------------------
DECODING_FLAGS = {
    "softmax": {},
    "coda": {"attention": build("coda")},
    "dw_enc_aw_cr_seg_dec_mw": {"encoder_attention": build("window"),
                                "cross_attention": build("window", segment_size=2),
                                "decoder_attention": build("window", variant="mw"),
                                "attention_layers": 1},
    "relative_localness": {"decoder_attention": build("relative"),
                           "cross_attention": build("localness")},
    "density_aqt": {"attention": build("density", scheme="aqt")},
}


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("flags", list(DECODING_FLAGS))
def test_incremental_decoding_equals_the_full_forward(flags, norm):
    """The decoder fed one target token at a time with its cache gives the logits of the
    teacher-forced forward at every position (positions, caches of every layer)."""
    m = small_model(norm=norm, **DECODING_FLAGS[flags])
    src = torch.randint(4, 13, (2, 7))
    src_mask = torch.ones_like(src, dtype=torch.bool)
    src_mask[1, 5:] = False
    tgt = torch.randint(4, 11, (2, 6))
    with torch.no_grad():
        full = m(src, src_mask, tgt).logits
        memory, _ = m.encoder(src, src_mask)
        cache, steps = {}, []
        for t in range(tgt.shape[1]):
            logits, _ = m.decoder(tgt[:, t:t + 1], None, memory, src_mask, cache=cache)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    assert cache["length"] == tgt.shape[1]


@pytest.mark.parametrize("flags", ["softmax", "coda", "dw_enc_aw_cr_seg_dec_mw"])
def test_cached_beam_search_equals_the_uncached_one(flags):
    m = small_model(beam_size=3, alpha=0.6, max_len_a=1.0, max_decode_len=2,
                    **DECODING_FLAGS[flags])
    src = torch.randint(4, 13, (3, 5))
    src_mask = torch.ones_like(src, dtype=torch.bool)
    src_mask[2, 3:] = False
    cached, uncached = m.generate(src, src_mask), m.generate(src, src_mask, cached=False)
    assert torch.equal(cached.nbest, uncached.nbest)
    torch.testing.assert_close(cached.nbest_scores, uncached.nbest_scores)
    # the source-relative length rule: a * |source| + b tokens at most
    assert (cached.nbest_lengths <= torch.tensor([7, 7, 5])[:, None]).all()
    assert torch.equal(m.max_lengths(src_mask), torch.tensor([7, 7, 5]))


def test_post_norm_layer_is_the_original_transformer_layer():
    """norm='post': LayerNorm(x + sublayer(x)) per sub-layer (Vaswani et al.; fairseq's
    WMT baseline), no final layer norm; norm='pre': x + sublayer(LayerNorm(x)), final norm."""
    post, pre = small_model(norm="post"), small_model(norm="pre")
    layer = post.encoder.layers[0]
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        a, _ = layer.self_attn(x, x, None)
        h = layer.res_attn.norm(x + a)
        expected = layer.res_ff.norm(h + layer.ff(h))
        torch.testing.assert_close(layer(x, None)[0], expected)
        layer = pre.encoder.layers[0]
        n = layer.res_attn.norm(x)
        h = x + layer.self_attn(n, n, None)[0]
        torch.testing.assert_close(layer(x, None)[0], h + layer.ff(layer.res_ff.norm(h)))
    assert isinstance(post.encoder.norm, torch.nn.Identity)
    assert isinstance(pre.decoder.norm, torch.nn.LayerNorm)
    with pytest.raises(ValueError, match="norm must be 'pre' or 'post'"):
        small_model(norm="sandwich")


def transformer_parameters(V: int, d: int, f: int, n_enc: int, n_dec: int, pre: bool) -> int:
    """Vaswani et al.'s count with one embedding shared by source, target and output: per
    attention 4 (d x d + d); per feed-forward d f + f + f d + d; a layer norm 2 d."""
    attn, ff, norm = 4 * (d * d + d), 2 * d * f + f + d, 2 * d
    return (V * d + n_enc * (attn + ff + 2 * norm) + n_dec * (2 * attn + ff + 3 * norm)
            + (2 * norm if pre else 0))


@pytest.mark.parametrize("preset", ["tiny", "base", "big"])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_presets_have_the_published_sizes(preset, norm):
    """experiments/configs/presets/*.yaml: t2t's / fairseq's sizes; with fairseq's shared
    32,768 BPE vocabulary base has 60.9M parameters (DW Table 1 reports 63M for its
    vocabulary) and big 209.9M (Vaswani et al. 213M with 37,000)."""
    import yaml

    from experiments.harness.grid_model import PROJECT_ROOT

    sizes = yaml.safe_load((PROJECT_ROOT / "experiments" / "configs" / "presets"
                            / f"{preset}.yaml").read_text())["model"]
    expected = {"tiny": (128, 4, 512, 2), "base": (512, 8, 2048, 6), "big": (1024, 16, 4096, 6)}
    d, h, f, n = expected[preset]
    assert (sizes["d_model"], sizes["n_heads"], sizes["d_ff"], sizes["n_encoder_layers"],
            sizes["n_decoder_layers"]) == (d, h, f, n, n)
    V = 32768
    with torch.device("meta"):
        m = TransformerSeq2Seq(V, V, share_embeddings=True, norm=norm, **sizes)
    assert m.n_parameters() == transformer_parameters(V, d, f, n, n, norm == "pre")
    if preset == "base" and norm == "post":
        assert round(m.n_parameters() / 1e6, 1) == 60.9
